/* trace_cost.c - ddp-trace-cost: the cost of one trace record call with tracing off and on, in
 * nanoseconds (one process; tracing on records into the real buffer). The per-step cost of a
 * timeline is this times the events per step (ddp-train: about 6 per layer plus 3 per bucket plus
 * 12), to be compared with the step time; benchmarks/trace_overhead.sh measures the whole run.
 * A span is also an NVTX range (HAVE_NVTX, DDP_NVTX unset or 1): the record calls' figures include
 * it, and a push/pop pair made directly is timed too, so that `DDP_NVTX=0 ddp-trace-cost` and
 * `ddp-trace-cost` compare; with no tool attached (NVTX_INJECTION64_PATH unset) that is NVTX's
 * cost when nobody looks.
 * Times are this thread's CPU time, so other processes on a shared machine do not count.
 * Usage: ddp-trace-cost [CALLS]   (default 2,000,000 begin/end pairs)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "config.h"
#include "ddp_trace.h"
#if HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

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

/* ns per NVTX push/pop pair (a range as ddp_trace_begin/end push it), n pairs; -1 without NVTX. */
static double time_nvtx_pairs(long n)
{
#if HAVE_NVTX
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        nvtxEventAttributes_t a = {.version = NVTX_VERSION, .size = NVTX_EVENT_ATTRIB_STRUCT_SIZE,
                                   .messageType = NVTX_MESSAGE_TYPE_ASCII, .message.ascii = "bench",
                                   .payloadType = NVTX_PAYLOAD_TYPE_INT64, .payload.llValue = i};
        nvtxRangePushEx(&a);
        nvtxRangePop();
    }
    return (now_s() - t0) * 1e9 / (double)n;
#else
    (void)n;
    return -1.0;
#endif
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
    const char *nvtx = getenv("DDP_NVTX"), *tool = getenv("NVTX_INJECTION64_PATH");
    double pair = time_nvtx_pairs(n);
    printf("trace record call: off %.2f ns, on %.2f ns (%ld begin/end pairs each; NVTX ranges "
           "%s)\n", off, on, n, !HAVE_NVTX ? "not built"
                                : nvtx && nvtx[0] == '0' ? "off (DDP_NVTX=0)" : "on");
    if (pair >= 0)
        printf("NVTX push/pop pair, made directly: %.2f ns (%s)\n", pair,
               tool && *tool ? "a tool attached: NVTX_INJECTION64_PATH" : "no tool attached");
    ddp_finalize(ctx);
    return st == DDP_OK ? 0 : 1;
}
