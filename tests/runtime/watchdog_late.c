/* watchdog_late.c - a rank that is late for a collective: rank 1 sleeps SECONDS (argv[1]) before
 * ddp_barrier while the others wait in it. Run by watchdog_late.sh with a short DDP_TIMEOUT: the
 * watchdog must end the job, naming the barrier and rank 1 as behind. Exits 0 only if the barrier
 * completes, which the test treats as a failure.
 * With --block-stderr (argv[2]) rank 0's stderr becomes a full pipe that nobody reads, so the
 * watchdog's message blocks: its backstop must still end the process (watchdog_late.sh blocked).
 * With --wave (argv[2]) every rank says it is at step 7 in "backward" (ddp_watch_where), rank 1 in
 * "forward" before its sleep, and rank 5 stops itself (SIGSTOP) before the barrier: the report's
 * wavefront (watchdog_late.sh wave). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"

/* Replaces stderr with a pipe filled to the last byte, whose read end stays open and unread. */
static int block_stderr(void)
{
    int fds[2];
    char chunk[4096];
    memset(chunk, 'x', sizeof chunk);
    if (pipe(fds) != 0 || fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0)
        return -1;
    while (write(fds[1], chunk, sizeof chunk) > 0)
        ;
    while (write(fds[1], chunk, 1) > 0) /* the last bytes a partial write left */
        ;
    if (errno != EAGAIN || fcntl(fds[1], F_SETFL, 0) != 0 || dup2(fds[1], STDERR_FILENO) < 0)
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&opts, &ctx) != DDP_OK)
        return 2;
    if (argc > 2 && strcmp(argv[2], "--block-stderr") == 0 && ddp_rank(ctx) == 0 && block_stderr() != 0) {
        printf("rank 0: could not block stderr: %s\n", strerror(errno));
        return 2;
    }
    int wave = argc > 2 && strcmp(argv[2], "--wave") == 0;
    if (wave)
        ddp_watch_where(7, -1, ddp_rank(ctx) == 1 ? "forward" : "backward");
    if (wave && ddp_rank(ctx) == 5)
        raise(SIGSTOP);
    if (ddp_rank(ctx) == 1)
        sleep(argc > 1 ? (unsigned)atoi(argv[1]) : 60);
    ddp_status st = ddp_barrier(ctx);
    printf("rank %d: barrier returned %s\n", ddp_rank(ctx), ddp_strerror(st));
    ddp_finalize(ctx);
    return 0;
}
