/* trace_cost.c - ddp-trace-cost: the cost of one trace record call with tracing off and on, in
 * nanoseconds (one process; tracing on records into the real buffer). The per-step cost of a
 * timeline is this times the events per step (ddp-train: about 6 per layer plus 3 per bucket plus
 * 12), to be compared with the step time; benchmarks/trace_overhead.sh measures the whole run.
 * Times are this thread's CPU time, so other processes on a shared machine do not count.
 * Usage: ddp-trace-cost [CALLS]   (default 2,000,000 begin/end pairs)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ddp_trace.h"

/* This thread's CPU time: on a shared machine wall time would count other processes' turns. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ns per call of n begin/end pairs. */
static double time_pairs(long n)
{
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        ddp_trace_begin("bench", i);
        ddp_trace_end("bench", i);
    }
    return (now_s() - t0) * 1e9 / (2.0 * (double)n);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    if (n < 1) {
        fprintf(stderr, "ddp-trace-cost: CALLS must be a positive number (got '%s')\n", argv[1]);
        return 2;
    }
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    double off = time_pairs(n);
    ddp_status st = ddp_trace_start(ctx, (size_t)(2 * n));
    double on = st == DDP_OK ? time_pairs(n) : -1.0;
    if (st == DDP_OK)
        st = ddp_trace_write(ctx, "/dev/null");
    printf("trace record call: off %.2f ns, on %.2f ns (%ld begin/end pairs each)\n", off, on, n);
    ddp_finalize(ctx);
    return st == DDP_OK ? 0 : 1;
}
