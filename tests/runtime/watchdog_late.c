/* watchdog_late.c - a rank that is late for a collective: rank 1 sleeps SECONDS (argv[1]) before
 * ddp_barrier while the others wait in it. Run by watchdog_late.sh with a short DDP_TIMEOUT: the
 * watchdog must end the job, naming the barrier and rank 1 as behind. Exits 0 only if the barrier
 * completes, which the test treats as a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ddp.h"

int main(int argc, char **argv)
{
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&opts, &ctx) != DDP_OK)
        return 2;
    if (ddp_rank(ctx) == 1)
        sleep(argc > 1 ? (unsigned)atoi(argv[1]) : 60);
    ddp_status st = ddp_barrier(ctx);
    printf("rank %d: barrier returned %s\n", ddp_rank(ctx), ddp_strerror(st));
    ddp_finalize(ctx);
    return 0;
}
