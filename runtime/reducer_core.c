/* reducer_core.c - the machinery every stage of the bucketed reducer shares (reducer.c's top
 * comment): element addressing and shards, launching ready buckets strictly in bucket order,
 * waiting for them, the check that every parameter was marked, and the stage contracts of the
 * public calls. The lowest of the reducer's files (reducer_private.h): it calls neither
 * reducer.c nor reducer_owned.c, and reaches a stage's behaviour only through r->ops.
 */
#include <math.h>

#include "ddp_trace.h"
#include "reducer_cuda.h"
#include "reducer_private.h"

void *reducer_elem(void *x, ddp_dtype t, size_t offset)
{
    return (char *)x + offset * ddp_dtype_size(t);
}

void *reducer_stream(const ddp_reducer *r)
{
    return r->stream ? r->stream : ddp_backend_stream(r->ctx);
}

size_t reducer_overlap(const ddp_reducer *r, int q, size_t off, size_t len)
{
    size_t lo = 0, n = 0;
    ddp_shard_range(r->total, ddp_world_size(r->ctx), q, &lo, &n);
    size_t a = off > lo ? off : lo, e = off + len < lo + n ? off + len : lo + n;
    return e > a ? e - a : 0;
}

void reducer_run_in_shard(const ddp_reducer *r, int k, size_t *a, size_t *e)
{
    const bucket_plan *pl = &r->plan;
    size_t lo = r->shard_off, hi = r->shard_off + r->shard_n;
    size_t end = pl->run_off[k] + pl->run_len[k];
    *a = pl->run_off[k] > lo ? pl->run_off[k] : lo;
    *e = end < hi ? end : hi;
}

/* Bucket b's elements in each shard (r->counts row b): its runs, in ascending offset, cut at the
 * shard boundaries. Packed in that order the bucket is the shards' pieces in rank order. */
size_t *reducer_zero_counts(ddp_reducer *r, int b)
{
    int world = ddp_world_size(r->ctx);
    size_t *counts = r->counts + (size_t)b * (size_t)world;
    const bucket_plan *pl = &r->plan;
    for (int q = 0; q < world; q++) {
        counts[q] = 0;
        for (int k = pl->run_start[b]; k < pl->run_start[b + 1]; k++)
            counts[q] += reducer_overlap(r, q, pl->run_off[k], pl->run_len[k]);
    }
    return counts;
}

double reducer_micro_total(const ddp_reducer *r)
{
    return r->micro_total ? (double)r->micro_total
                          : (double)ddp_world_size(r->ctx) * (double)r->micro_steps;
}

/* What a bucket is multiplied by before its all-reduce: 1 for fp32 on the wire; for 16 bits
 * 2^-k, 2^k the smallest power of two >= world_size * micro_steps (see reducer.c's top comment);
 * bucket-owned gradients that send every micro-step alone: world_size. */
float reducer_prescale(const ddp_reducer *r)
{
    if (r->wire_dtype == DDP_FP32)
        return 1.0f;
    int k;
    double steps = r->owned && !r->local_accum ? 1.0 : (double)r->micro_steps;
    double m = frexp(r->micro_total ? (double)r->micro_total : ddp_world_size(r->ctx) * steps, &k);
    return (float)ldexp(1.0, m == 0.5 ? 1 - k : -k);
}

/* Launches bucket b through its stage; on failure records the error and launches nothing more
 * this step. */
static void reducer_launch(ddp_reducer *r, int b)
{
    const ddp_bucket *bk = &r->plan.buckets[b];
    ddp_status st = DDP_OK;
    ddp_trace_instant("allreduce.queued", b);
    float pre = reducer_prescale(r);
    if (pre != 1.0f) /* in the gradients' type, before a narrowing cast could overflow */
        st = r->ops->prescale(r, b, pre);
    trace_set_tag(b);
    if (st == DDP_OK)
        st = r->ops->start(r, b);
    trace_set_tag(-1);
    if (st != DDP_OK) {
        DDP_ERROR("reducer: cannot start the all-reduce of bucket %d (parameters %d..%d): %s", b,
                  bk->first_param, bk->last_param, ddp_strerror(st));
        r->requests[b] = NULL;
        r->launch_error = st;
    }
}

/* Bucket-owned: reaps the oldest reduce-scatter to recycle its buffer. In the middle of the
 * backward pass (not force) that wait is exposed communication too: traced as the span
 * "reducer.recycle_wait" (the CPU's measure) and, on CUDA, timed on the reducer's stream. Under
 * finish() it is part of finish's own wait. */
static void reducer_recycle(ddp_reducer *r, int force)
{
    int timed = !force && (ddp_trace_enabled() || straggler_on());
    if (timed) {
        ddp_trace_begin("reducer.recycle_wait", r->next_reap);
        if (r->recycle_timer)
            exposed_timer_start(r->recycle_timer, reducer_stream(r));
    }
    int64_t waited = force ? 0 : straggler_wait_begin(); /* under finish: finish's wait */
    r->ops->reap(r);
    straggler_wait_end(waited);
    if (timed) {
        if (r->recycle_timer)
            exposed_timer_stop(r->recycle_timer, reducer_stream(r));
        ddp_trace_end("reducer.recycle_wait", r->next_reap - 1);
    }
}

void reducer_launch_ready(ddp_reducer *r, int force)
{
    while (r->launch_error == DDP_OK && r->next_launch < r->plan.n_buckets &&
           (force || r->pending[r->next_launch] == 0)) {
        reducer_launch(r, r->next_launch++);
        while (r->ops->reap && r->next_launch - r->next_reap > OWNED_IN_FLIGHT)
            reducer_recycle(r, force);
    }
}

ddp_status reducer_wait_all(ddp_reducer *r)
{
    ddp_status first = DDP_OK;
    for (int b = 0; b < r->plan.n_buckets; b++) {
        if (!r->requests[b])
            continue;
        ddp_status st = ddp_wait(r->requests[b]);
        r->requests[b] = NULL;
        if (st != DDP_OK && first == DDP_OK) {
            DDP_ERROR("reducer: %s of bucket %d (parameters %d..%d) failed: %s",
                      r->zero_stage ? "reduce-scatter" : "all-reduce", b,
                      r->plan.buckets[b].first_param, r->plan.buckets[b].last_param,
                      ddp_strerror(st));
            first = st;
        }
    }
    return first;
}

ddp_status reducer_check_marked(const ddp_reducer *r)
{
    ddp_status st = DDP_OK;
    for (int p = 0; p < r->n_params; p++) {
        if (!r->marked[p]) {
            DDP_ERROR("%s: parameter %d was never marked ready in the %s: its gradient was not "
                      "averaged (abort the job with ddp_abort)",
                      r->sync ? "ddp_reducer_finish" : "ddp_reducer_begin", p,
                      r->sync ? "sync step" : "micro-step before");
            st = DDP_ERR_STATE;
        }
    }
    return st;
}

/* What each zero stage does, for the refusals. */
static const char *const stage_what[] = {
    "all-reduce: every rank has every averaged gradient and every parameter",
    "reduce-scatter into the shard of the gradient buffer",
    "bucket-owned gradients, no gradient buffer",
};

ddp_status reducer_require_stage(const ddp_reducer *r, unsigned stages, const char *who,
                                 const char *todo)
{
    if (stages & REDUCER_STAGE(r->zero_stage))
        return DDP_OK;
    DDP_ERROR("%s: not valid for this reducer, created with zero_stage %d (%s); it needs "
              "zero_stage %s: %s", who, r->zero_stage, stage_what[r->zero_stage],
              stages == REDUCER_STAGE(2) ? "2" : "1 or 2", todo);
    return DDP_ERR_STATE;
}
