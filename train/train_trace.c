/* train_trace.c - ddp-train's link check and timeline glue (see train_trace.h). */
#include "train_trace.h"

#include "ddp_trace.h"

ddp_status train_observe_start(ddp_ctx *ctx, const train_opts *o)
{
    if (o->link_check) {
        ddp_link_check_opts lo;
        ddp_link_check_opts_default(&lo);
        int slow = 0;
        ddp_status st = ddp_link_check(ctx, &lo, &slow);
        if (st != DDP_OK)
            return st;
        if (slow > 0)
            DDP_WARN0("--link-check: %d node(s) have links under half the median (named above); "
                      "training goes on, but every all-reduce runs at their speed", slow);
    }
    return o->trace_path ? ddp_trace_start(ctx, 0) : DDP_OK;
}

void train_comm_stats(ddp_ctx *ctx, run_stats *r)
{
    r->exposed_comm_ms = r->comm_ms = r->hidden_fraction = r->gather_wait_ms = -1.0;
    ddp_comm_stats c;
    int counted = ddp_comm_stats_get(ctx, &c) == DDP_OK;
    r->allgather_calls = counted ? (long long)c.allgather_calls : -1;
    r->allgather_bytes = counted ? (long long)c.allgather_bytes : -1;
    ddp_trace_stats s;
    if (!ddp_trace_enabled() || ddp_trace_get_stats(&s) != DDP_OK)
        return;
    double syncs = s.n_syncs > 0 ? (double)s.n_syncs : 1.0;
    /* CUDA: the exposed time is read from events one sync late, so it may cover none yet */
    int unmeasured = s.n_exposed == 0 && s.n_syncs > 0;
    double measured = s.n_exposed > 0 ? (double)s.n_exposed : 1.0;
    /* ZeRO's gather waits per step (the forward pass's; stage 2's waits mid-backward are in
     * exposed_s already) */
    double v[6] = {1e3 * s.exposed_s / measured, 1e3 * s.comm_s / syncs, (double)s.n_dropped,
                   unmeasured, 1e3 * s.gather_wait_s / syncs, (double)s.n_gather_waits};
    if (ddp_allreduce_host(ctx, v, 6, DDP_FP64, DDP_SUM) != DDP_OK)
        return;
    int world = ddp_world_size(ctx);
    r->comm_ms = v[1] / world;
    if (v[5] > 0)
        r->gather_wait_ms = v[4] / world;
    if (v[3] == 0) { /* else exposed and hidden stay -1: unknown */
        r->exposed_comm_ms = v[0] / world;
        double hidden = r->comm_ms > 0 ? 1.0 - r->exposed_comm_ms / r->comm_ms : 0.0;
        r->hidden_fraction = hidden < 0 ? 0 : hidden;
    }
    if (v[2] > 0)
        DDP_WARN0("--trace: %.0f events were dropped (buffer full); the figures cover the start", v[2]);
}

ddp_status train_observe_end(ddp_ctx *ctx, const train_opts *o)
{
    if (!o->trace_path)
        return DDP_OK;
    ddp_status st = ddp_trace_write(ctx, o->trace_path);
    if (st == DDP_OK && ddp_rank(ctx) == 0)
        printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o->trace_path);
    return st;
}
