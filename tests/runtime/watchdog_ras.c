/* watchdog_ras.c - the watchdog's report with NCCL RAS's view, on the CPU: after ddp_init this
 * program tells libddp that an NCCL communicator of NCCL 2.28.9 is open (ras_use_nccl, what
 * comm_nccl.c does on the cuda backend), so the report asks the RAS service that NCCL_RAS_ADDR
 * names (watchdog_ras.py runs a fake one). Modes (argv[1]):
 *   late    rank 1 sleeps 60 s before ddp_barrier: rank 0's deadline (DDP_TIMEOUT) fires, its
 *           report gives the wavefront and RAS's view, and the job ends (exit status not 0)
 *   survey  every rank calls watchdog_survey (what a GPU wait past its deadline calls), then
 *           exits 0: only rank 0, the lowest that answered, asks RAS.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "internal.h"

int main(int argc, char **argv)
{
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (argc != 2 || (strcmp(argv[1], "late") && strcmp(argv[1], "survey"))) {
        fprintf(stderr, "usage: wd-ras late|survey\n");
        return 2;
    }
    if (ddp_init(&opts, &ctx) != DDP_OK)
        return 2;
    ras_use_nccl(22809);
    if (strcmp(argv[1], "survey") == 0) {
        ddp_barrier(ctx);
        watchdog_survey();
        ddp_barrier(ctx);
        ddp_finalize(ctx);
        return 0;
    }
    if (ddp_rank(ctx) == 1)
        sleep(60);
    ddp_status st = ddp_barrier(ctx);
    printf("rank %d: barrier returned %s\n", ddp_rank(ctx), ddp_strerror(st));
    ddp_finalize(ctx);
    return 0;
}
