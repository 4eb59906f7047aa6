/* test_reducer_trace.c - the exposed communication in ddp_trace_get_stats, under real mpirun
 * (2 ranks, CPU).
 *
 * CPU: one sync step in which rank 1 marks its last parameter 200 ms late; rank 0's finish waits
 * for it, so its "reducer.wait" span, the exposed communication, is at least 150 ms (rank 1's
 * short: its peer was already waiting); n_exposed = n_syncs = 1.
 * CUDA's figures: the reducer records each step's device-measured exposed time as an instant
 * "reducer.exposed" (nanoseconds); two such instants (2 ms and 4 ms) recorded by hand must then
 * replace the spans: exposed_s = 6 ms over n_exposed = 2, while n_syncs stays the count of
 * "reducer.wait" spans (1).
 * ddp_trace_summarize: the means over the ranks (exposed at least 75 ms: rank 0's 150 and rank 1's
 * 0 or more), no gather waits (-1), the same figures on both ranks; all -1 once tracing is off.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "ddp_trace.h"

#define N_PARAMS 3
static const size_t numel[N_PARAMS] = {10, 20, 30};

static void late_step(ddp_ctx *ctx)
{
    float grads[60] = {0};
    ddp_reducer *r = NULL;
    CHECK(ddp_reducer_create(ctx, grads, numel, N_PARAMS, NULL, &r) == DDP_OK, "create");
    if (!r)
        return;
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin");
    for (int p = N_PARAMS - 1; p >= 0; p--) {
        if (p == 0 && ddp_rank(ctx) == 1)
            usleep(200 * 1000);
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d", p);
    }
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish");
    ddp_reducer_destroy(r);
}

static void check_cpu(ddp_ctx *ctx)
{
    ddp_trace_stats s;
    CHECK(ddp_trace_get_stats(&s) == DDP_OK, "stats");
    printf("rank %d: exposed %.1f ms over %ld sync(s)\n", ddp_rank(ctx), 1e3 * s.exposed_s,
           s.n_exposed);
    CHECK(s.n_syncs == 1 && s.n_exposed == 1, "%ld syncs, %ld exposed, want 1 and 1", s.n_syncs,
          s.n_exposed);
    CHECK(s.exposed_s >= (ddp_rank(ctx) == 0 ? 0.150 : 0.0), "rank %d waited %.1f ms",
          ddp_rank(ctx), 1e3 * s.exposed_s);
}

static void check_summary(ddp_ctx *ctx)
{
    ddp_trace_summary t;
    CHECK(ddp_trace_summarize(ctx, &t) == DDP_OK, "summarize");
    CHECK(t.exposed_comm_ms >= 75.0 && t.comm_ms >= 0.0 && t.gather_wait_ms == -1.0,
          "summary: exposed %.1f ms (at least 75), comm %.1f ms, gather wait %.1f (-1)",
          t.exposed_comm_ms, t.comm_ms, t.gather_wait_ms);
    double mine = t.exposed_comm_ms, max = mine, min = mine;
    CHECK(ddp_allreduce_host(ctx, &max, 1, DDP_FP64, DDP_MAX) == DDP_OK &&
              ddp_allreduce_host(ctx, &min, 1, DDP_FP64, DDP_MIN) == DDP_OK && max == min,
          "summary: the same means on every rank");
}

static void check_device_instants(void)
{
    ddp_trace_instant("reducer.exposed", 2000000);
    ddp_trace_instant("reducer.exposed", 4000000);
    ddp_trace_stats s;
    CHECK(ddp_trace_get_stats(&s) == DDP_OK, "stats");
    CHECK(s.n_syncs == 1 && s.n_exposed == 2, "%ld syncs, %ld exposed, want 1 and 2", s.n_syncs,
          s.n_exposed);
    CHECK_CLOSE(s.exposed_s, 0.006, 1e-12, 0.0, "exposed_s from the instants");
}

int main(void)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    CHECK(ddp_world_size(ctx) == 2, "run with 2 ranks");
    CHECK(ddp_trace_start(ctx, 0) == DDP_OK, "trace start");
    late_step(ctx);
    check_cpu(ctx);
    check_summary(ctx);
    check_device_instants();
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_reducer_trace.%ld.json", (long)getpid());
    CHECK(ddp_trace_write(ctx, path) == DDP_OK, "trace write");
    if (ddp_rank(ctx) == 0)
        unlink(path);
    ddp_trace_summary off;
    CHECK(ddp_trace_summarize(ctx, &off) == DDP_OK && off.exposed_comm_ms == -1.0 &&
              off.comm_ms == -1.0 && off.hidden_fraction == -1.0 && off.gather_wait_ms == -1.0,
          "summary with tracing off: every figure -1");
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
