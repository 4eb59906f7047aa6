/* reducer.c - bucketed asynchronous gradient averaging that overlaps the backward pass.
 *
 * On a sync micro-step every mark_ready() decrements its bucket's pending count; a bucket whose
 * count reaches zero is ready. Buckets are launched (ddp_allreduce_start, SUM) strictly in bucket
 * order: a ready bucket waits until every earlier bucket has been launched, then all consecutive
 * ready buckets go at once. Every rank thus issues the same all-reduces in the same order.
 * finish() waits for them in order and scales each bucket by 1 / (world_size * micro_steps).
 * 16 bits on the wire for wider gradients: a bucket is cast into the same slice of the reducer's
 * wire buffer just before its launch and cast back in finish(), before the scaling. On CUDA the
 * casts, the scaling and the all-reduces are ordered on opts.stream (or the backend's stream),
 * and finish() makes the backend's stream wait for a caller's stream, so that libddp's later work
 * (the loss scaler) sees the averaged gradients. Exposed communication: on the CPU the
 * "reducer.wait" span of finish(); on CUDA, while tracing, CUDA events on the reducer's stream
 * (reducer_cuda.h), read once complete and traced as "reducer.exposed".
 * 16-bit wire: the range of fp16 is small (65504), so each rank's contribution is divided before
 * the sum, as PyTorch's fp16 compression hook does: by 2^k, the smallest power of two at least
 * world_size * micro_steps (exact in binary floating point, so contributions lose no bits except
 * near the subnormals), in place in the gradients' type before the cast to the wire; the sum is
 * then no larger than the largest contribution, and finish() multiplies by 2^k / (world_size *
 * micro_steps), in (1/2, 1].
 *
 * Ready order: during the first sync step the reducer records the order in which parameters are
 * marked; finish() then gathers every rank's order (one host all-gather of n_params + 1 ints,
 * once). When all ranks agree and the order is not the one the plan already follows, the buckets
 * are rebuilt as groups of parameters in that order (same caps), each made of the runs of the
 * flat buffer its parameters cover (as PyTorch rebuilds its buckets after the first iteration):
 * a tensor-major layout (llm.c's, every layer's slice a parameter) then launches its first
 * buckets while the backward pass is still in its last layers. A bucket of several runs is one
 * request: the runs one after the other on MPI, inside one NCCL group on CUDA; on a 16-bit wire
 * the cast gathers the runs into the bucket's packed slice of the wire buffer. The gradients are
 * never copied. Ranks that disagree keep the parameter-order buckets (correct for any marking
 * order, since launches go in bucket order): a warning, or DDP_ERR_MISMATCH with strict_order.
 *
 * ZeRO (zero_stage 1, 2): a bucket is reduce-scattered instead: its runs, in ascending offset and
 * packed end to end, are the shards' pieces in rank order (shards are contiguous and ascending),
 * so one reduce-scatter with per-rank counts (each run cut at the shard boundaries) gives each
 * rank the sums of its own pieces, received into `recv` (this rank's pieces of the buckets, in
 * launch order); finish() scatters them, scaled, into the gradient buffer at the shard's
 * offsets (stage 1). A one-run bucket in the gradients' type
 * is sent in place; others are packed into the wire buffer (allocated at the first use for an
 * unchanged type).
 *
 * Bucket-owned gradients (zero_stage 2, which requires grads NULL; reducer_owned.c): there is no
 * flat gradient buffer, so stage 2 saves the full gradients that stage 1 keeps. The
 * buckets are planned once in the caller's ready order; a bucket's gradients live in a buffer of
 * the pool (grad_pool.c), its parameters packed in ascending offset (the same packing as above,
 * so the bucket is the shards' pieces in rank order), taken and zeroed at the bucket's first
 * ddp_reducer_grad_ptr of a micro-step. Every micro-step, synchronised or not, reduce-scatters
 * every bucket in place; once one is waited for ("reaped": at the latest when more than
 * OWNED_IN_FLIGHT are under way, else in finish() or the next begin()), this rank's piece is
 * cast into the shard buffer (the first micro-step of an optimizer step) or added to it (the
 * later ones), and the buffer goes back to the pool. finish() then scales the shard to the mean.
 * On CUDA the wait is the reducer's stream waiting for the reduce-scatter's event, so the unpack
 * and the zeroing of a recycled buffer are queued after it on that stream: no host wait.
 *
 * Files (reducer_private.h): this one holds the public calls and stages 0 and 1;
 * reducer_owned.c stage 2; reducer_core.c, below both, what every stage shares (launching in
 * bucket order, waiting, shards), reaching a stage only through its reducer_stage_ops.
 *
 * Failure policy: a parameter left unmarked is reported by finish(), which still launches every
 * remaining bucket so that peers complete their all-reduces; after a failed launch nothing more is
 * launched. Either way the gradients are undefined and the caller should ddp_abort() the job.
 */
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "ddp_trace.h"
#include "internal.h"
#include "reducer_cuda.h"
#include "reducer_private.h"

#define DDP_MIB (1024.0 * 1024.0)

void ddp_reducer_opts_default(ddp_reducer_opts *opts)
{
    if (!opts)
        return;
    opts->bucket_mb = DDP_BUCKET_MB_DEFAULT;
    opts->first_bucket_mb = DDP_FIRST_BUCKET_MB_DEFAULT;
    opts->grad_dtype = DDP_FP32;
    opts->comm_dtype = DDP_FP32;
    opts->stream = NULL;
    opts->defer_launch = 0;
    opts->static_buckets = 0;
    opts->strict_order = 0;
    opts->zero_stage = 0;
    opts->ready_order = NULL;
    opts->local_accum = 0;
    opts->micro_total = 0;
}

static ddp_status mib_to_bytes(double mib, const char *what, size_t *out)
{
    double bytes = mib * DDP_MIB;
    if (!(bytes >= 1.0) || bytes > (double)(SIZE_MAX / 2)) {
        DDP_ERROR("ddp_reducer_create: %s = %g MiB is not a usable bucket cap: give a size "
                  "between one byte and %g MiB (ddp-train: --bucket-mb, --first-bucket-mb)", what,
                  mib, (double)(SIZE_MAX / 2) / DDP_MIB);
        return DDP_ERR_INVALID_ARG;
    }
    *out = (size_t)bytes;
    return DDP_OK;
}

static ddp_status reducer_alloc(ddp_reducer *r, int n_params)
{
    size_t n = (size_t)n_params, world = (size_t)ddp_world_size(r->ctx);
    r->numel = calloc(n, sizeof *r->numel);
    r->order = calloc(n + 1, sizeof *r->order);
    r->orders = calloc(world * (n + 1), sizeof *r->orders);
    r->pending = calloc(n, sizeof *r->pending);
    r->marked = calloc(n, sizeof *r->marked);
    r->requests = calloc(n, sizeof *r->requests);
    if (!r->numel || !r->order || !r->orders || !r->pending || !r->marked || !r->requests) {
        DDP_ERROR("ddp_reducer_create: out of memory for %d parameters", n_params);
        return DDP_ERR_NOMEM;
    }
    return DDP_OK;
}

static ddp_status reducer_plan(ddp_reducer *r, const size_t *numel,
                               const ddp_reducer_opts *opts)
{
    ddp_status st = mib_to_bytes(opts->bucket_mb, "bucket_mb", &r->cap_bytes);
    if (st == DDP_OK)
        st = mib_to_bytes(opts->first_bucket_mb, "first_bucket_mb", &r->first_cap_bytes);
    if (st == DDP_OK)
        st = reducer_alloc(r, r->n_params);
    if (st == DDP_OK) /* bucket-owned: the caller's ready order, never rebuilt */
        st = bucket_plan_build(numel, r->n_params, r->owned ? opts->ready_order : NULL,
                               r->cap_bytes, r->first_cap_bytes, &r->plan);
    if (st == DDP_OK)
        memcpy(r->numel, numel, (size_t)r->n_params * sizeof *numel);
    return st;
}

/* Checks the types and allocates the wire buffer when the wire type differs from the gradients'
 * (bucket-owned gradients: the pool's buffers have their own). */
static ddp_status reducer_types(ddp_reducer *r, const size_t *numel, const ddp_reducer_opts *o)
{
    if (!convert_dtype_is_grad(o->grad_dtype) || !convert_dtype_is_grad(o->comm_dtype)) {
        DDP_ERROR("ddp_reducer_create: gradient type %d / wire type %d: use DDP_FP32, DDP_BF16 or "
                  "DDP_FP16 (ddp-train: --grad-dtype fp32|bf16|fp16)", (int)o->grad_dtype,
                  (int)o->comm_dtype);
        return DDP_ERR_INVALID_ARG;
    }
    r->grad_dtype = o->grad_dtype;
    r->wire_dtype = o->comm_dtype == DDP_FP32 ? o->grad_dtype : o->comm_dtype;
    r->stream = o->stream;
    if (r->wire_dtype == r->grad_dtype || r->owned)
        return DDP_OK;
    size_t total = 0;
    for (int p = 0; p < r->n_params; p++)
        total += numel[p];
    r->wire = ddp_alloc(r->ctx, total * ddp_dtype_size(r->wire_dtype));
    if (!r->wire) {
        DDP_ERROR("ddp_reducer_create: out of memory for the %s wire buffer (%zu elements)",
                  ddp_dtype_name(r->wire_dtype), total);
        return DDP_ERR_NOMEM;
    }
    return DDP_OK;
}

/* zero_stage 1, 2: the shard, the counts and the receive (and stage 2 shard) buffers. */
static ddp_status reducer_zero_setup(ddp_reducer *r, int stage)
{
    if (stage < 0 || stage > 2) {
        DDP_ERROR("ddp_reducer_create: zero_stage %d: use 0 (all-reduce), 1 (reduce-scatter into "
                  "the shard) or 2 (the shard in a reducer-owned buffer)", stage);
        return DDP_ERR_INVALID_ARG;
    }
    r->zero_stage = stage;
    for (int p = 0; p < r->n_params; p++)
        r->total += r->numel[p];
    r->shard_n = r->total;
    if (stage == 0)
        return DDP_OK;
    int world = ddp_world_size(r->ctx);
    ddp_shard_range(r->total, world, ddp_rank(r->ctx), &r->shard_off, &r->shard_n);
    size_t keep = r->shard_n > 0 ? r->shard_n : 1;
    r->counts = calloc((size_t)r->n_params * (size_t)world, sizeof *r->counts);
    r->recv_off = calloc((size_t)r->n_params, sizeof *r->recv_off);
    r->gather_req = calloc((size_t)r->n_params, sizeof *r->gather_req);
    r->gather_end = calloc((size_t)r->n_params, sizeof *r->gather_end);
    /* Stage 1 on the CPU receives one-run buckets in place (reducer_zero_in_place): the
     * receive buffer is allocated at the first bucket that needs it. Bucket-owned gradients are
     * reduce-scattered in place in their buffers: no receive buffer. */
    int need_recv = !r->owned && ddp_backend(r->ctx) != DDP_BACKEND_CPU;
    if (need_recv)
        r->recv = ddp_alloc(r->ctx, keep * ddp_dtype_size(r->wire_dtype));
    if (stage == 2)
        r->shard_grads = ddp_alloc(r->ctx, keep * ddp_dtype_size(r->grad_dtype));
    if (!r->counts || !r->recv_off || !r->gather_req || !r->gather_end ||
        (need_recv && !r->recv) || (stage == 2 && !r->shard_grads)) {
        DDP_ERROR("ddp_reducer_create: out of memory for the shard buffers (%zu elements)", keep);
        return DDP_ERR_NOMEM;
    }
    return DDP_OK;
}

/* The arguments ddp_reducer_create cannot work with (logged): DDP_ERR_INVALID_ARG. */
static ddp_status reducer_check_create(const ddp_ctx *ctx, const void *grads, const size_t *numel,
                                       int n_params, const ddp_reducer_opts *o)
{
    if (!ctx || !numel || n_params < 1) {
        DDP_ERROR("ddp_reducer_create: need a context, numel and n_params >= 1 (got n_params %d)",
                  n_params);
        return DDP_ERR_INVALID_ARG;
    }
    if (!grads && o->zero_stage != 2) {
        DDP_ERROR("ddp_reducer_create: no gradient buffer (grads NULL) with zero_stage %d: only "
                  "zero_stage 2 keeps the gradients in the reducer's bucket buffers "
                  "(ddp_reducer_grad_ptr); give the flat gradient buffer otherwise",
                  o->zero_stage);
        return DDP_ERR_INVALID_ARG;
    }
    if (grads && o->zero_stage == 2) {
        DDP_ERROR("ddp_reducer_create: zero_stage 2 with a gradient buffer: stage 2 keeps the "
                  "gradients in the reducer's bucket buffers (grads NULL, ddp_reducer_grad_ptr); "
                  "with a flat gradient buffer use zero_stage 1, which shards the same state "
                  "and saves as much");
        return DDP_ERR_INVALID_ARG;
    }
    if (grads && (o->ready_order || o->local_accum)) {
        const char *what = o->ready_order ? "ready_order" : "local_accum";
        DDP_ERROR("ddp_reducer_create: %s is for bucket-owned gradients (grads NULL, zero_stage "
                  "2); with a gradient buffer (zero_stage %d) %s", what, o->zero_stage,
                  o->ready_order ? "the reducer records the order in the first sync step"
                                 : "micro-steps begun with sync 0 accumulate in that buffer: "
                                   "leave local_accum 0");
        return DDP_ERR_INVALID_ARG;
    }
    if (o->micro_total < 0 || (o->micro_total && !grads && !o->local_accum)) {
        DDP_ERROR("ddp_reducer_create: micro_total %d: %s", o->micro_total, o->micro_total < 0
                  ? "must be >= 0 (0: every rank does as many micro-steps)"
                  : "ranks with different micro-step counts need one collective a step: with "
                    "bucket-owned gradients set local_accum");
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

ddp_status ddp_reducer_create(ddp_ctx *ctx, void *grads, const size_t *numel, int n_params,
                              const ddp_reducer_opts *opts, ddp_reducer **out)
{
    if (!out) {
        DDP_ERROR("ddp_reducer_create: out is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    *out = NULL;
    ddp_reducer_opts defaults;
    ddp_reducer_opts_default(&defaults);
    const ddp_reducer_opts *o = opts ? opts : &defaults;
    ddp_status st = reducer_check_create(ctx, grads, numel, n_params, o);
    if (st != DDP_OK)
        return st;
    ddp_reducer *r = calloc(1, sizeof *r);
    if (!r) {
        DDP_ERROR("ddp_reducer_create: out of memory");
        return DDP_ERR_NOMEM; /* bucket-owned: the peers' create waits for the deadline */
    }
    r->ctx = ctx;
    r->grads = grads;
    r->owned = !grads;
    r->n_params = n_params;
    r->defer_launch = o->defer_launch;
    r->static_buckets = o->static_buckets || r->owned;
    r->strict_order = o->strict_order;
    r->local_accum = r->owned && o->local_accum;
    r->micro_total = o->micro_total;
    st = reducer_plan(r, numel, o);
    if (st == DDP_OK && r->owned && o->ready_order)
        r->bucket_order = DDP_BUCKETS_READY_ORDER;
    if (st == DDP_OK)
        st = reducer_types(r, numel, o);
    if (st == DDP_OK)
        st = reducer_zero_setup(r, o->zero_stage);
    r->ops = r->owned ? &reducer_owned_ops
             : r->zero_stage ? &reducer_sharded_ops : &reducer_allreduce_ops;
    if (st == DDP_OK && r->owned)
        st = reducer_owned_setup(r);
    if (st == DDP_OK && ddp_backend(ctx) == DDP_BACKEND_CUDA) {
        /* a step has at most one wait of each kind per bucket; room for a few steps ahead */
        int waits = 4 * n_params + 4;
        st = exposed_timer_create(4, &r->timer);
        if (st == DDP_OK && r->owned)
            st = exposed_timer_create(waits, &r->recycle_timer);
        if (st == DDP_OK && r->zero_stage)
            st = exposed_timer_create(waits, &r->gather_timer);
    }
    if (r->owned) /* collective: every rank, whatever st */
        st = reducer_owned_agree(r, st);
    if (st != DDP_OK) {
        ddp_reducer_destroy(r);
        return st;
    }
    *out = r;
    return DDP_OK;
}

/* CUDA, while tracing or a straggler table is on: one instant (args.arg: nanoseconds) per
 * measured interval whose events have completed, oldest first: "reducer.exposed" per sync step,
 * "reducer.recycle_exposed" per wait mid-backward for a bucket's buffer, "reducer.gather_exposed"
 * per wait for the parameters' gather, each also a wait of the straggler table's; wait != 0 waits
 * for them (see reducer_cuda.h). */
static void reducer_report_exposed(ddp_reducer *r, int wait)
{
    int64_t ns;
    while (r->timer && exposed_timer_next(r->timer, wait, &ns)) {
        ddp_trace_instant("reducer.exposed", ns);
        straggler_device_wait(ns);
    }
    while (r->recycle_timer && exposed_timer_next(r->recycle_timer, wait, &ns)) {
        ddp_trace_instant("reducer.recycle_exposed", ns);
        straggler_device_wait(ns);
    }
    while (r->gather_timer && exposed_timer_next(r->gather_timer, wait, &ns)) {
        ddp_trace_instant("reducer.gather_exposed", ns);
        straggler_device_wait(ns);
    }
}

void ddp_reducer_destroy(ddp_reducer *r)
{
    if (!r)
        return;
    if (r->requests)
        reducer_wait_all(r); /* the communicator must not write into freed state */
    if (r->gather_req)
        ddp_reducer_gather_wait(r, -1);
    if (r->timer && ddp_trace_enabled()) {
        reducer_report_exposed(r, 1);
        long dropped = exposed_timer_dropped(r->timer) + exposed_timer_dropped(r->recycle_timer) +
                       exposed_timer_dropped(r->gather_timer);
        if (dropped > 0)
            DDP_WARN("reducer: %ld wait(s) for communication were not measured: the host ran more "
                     "steps ahead of the GPU than the timers hold", dropped);
    }
    exposed_timer_destroy(r->timer);
    exposed_timer_destroy(r->recycle_timer);
    exposed_timer_destroy(r->gather_timer);
    grad_pool_destroy(r->pool);
    free(r->pack_off);
    ddp_free(r->ctx, r->wire);
    ddp_free(r->ctx, r->recv);
    ddp_free(r->ctx, r->shard_grads);
    free(r->counts);
    free(r->recv_off);
    free(r->gather_req);
    free(r->gather_end);
    bucket_plan_free(&r->plan);
    free(r->numel);
    free(r->order);
    free(r->orders);
    free(r->pending);
    free(r->marked);
    free(r->requests);
    free(r);
}

static void reducer_reset_step(ddp_reducer *r)
{
    for (int p = 0; p < r->n_params; p++)
        r->marked[p] = 0;
    for (int b = 0; b < r->plan.n_buckets; b++)
        r->pending[b] = r->plan.param_start[b + 1] - r->plan.param_start[b];
    r->n_marked = 0;
    r->recv_next = 0;
    r->next_launch = 0;
    r->next_reap = 0;
    r->launch_error = DDP_OK;
}

ddp_status ddp_reducer_begin(ddp_reducer *r, int sync)
{
    if (!r) {
        DDP_ERROR("ddp_reducer_begin: reducer is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    if (r->in_step && r->sync) {
        DDP_ERROR("ddp_reducer_begin: the previous sync step was not finished: call "
                  "ddp_reducer_finish() after its backward pass");
        return DDP_ERR_STATE;
    }
    if (r->owned && r->in_step) { /* the micro-step before, not a sync one */
        r->in_step = 0;
        ddp_status st = reducer_owned_settle(r);
        if (st != DDP_OK)
            return st;
    }
    if (r->gather_waited < r->gather_launched) { /* the forward pass is over: all of them */
        ddp_status st = ddp_reducer_gather_wait(r, -1);
        if (st != DDP_OK)
            return st;
    }
    reducer_reset_step(r);
    r->in_step = 1;
    r->sync = sync != 0;
    r->micro_steps++;
    return DDP_OK;
}

/* Stages 0 and 1: multiplies bucket b's runs of the gradients by pre (a 16-bit wire's division
 * before the sum). */
static ddp_status reducer_prescale_runs(ddp_reducer *r, int b, float pre)
{
    const bucket_plan *pl = &r->plan;
    ddp_status st = DDP_OK;
    for (int k = pl->run_start[b]; k < pl->run_start[b + 1] && st == DDP_OK; k++)
        st = convert_dev_scale(r->ctx, reducer_elem(r->grads, r->grad_dtype, pl->run_off[k]),
                               r->grad_dtype, pl->run_len[k], pre, r->stream);
    return st;
}

/* Casts bucket b's runs into its packed slice of the wire buffer (the gather of a 16-bit wire). */
static ddp_status reducer_pack(ddp_reducer *r, int b)
{
    const bucket_plan *pl = &r->plan;
    size_t at = pl->wire_off[b];
    ddp_status st = DDP_OK;
    for (int k = pl->run_start[b]; k < pl->run_start[b + 1] && st == DDP_OK; k++) {
        st = convert_dev_cast(r->ctx, reducer_elem(r->wire, r->wire_dtype, at), r->wire_dtype,
                              reducer_elem(r->grads, r->grad_dtype, pl->run_off[k]), r->grad_dtype,
                              pl->run_len[k], r->stream);
        at += pl->run_len[k];
    }
    return st;
}

/* zero_stage 0: starts bucket b's all-reduce: its wire slice (cast into it first), its one run,
 * or its runs in place. */
static ddp_status reducer_start(ddp_reducer *r, int b)
{
    const bucket_plan *pl = &r->plan;
    int k = pl->run_start[b], n_runs = pl->run_start[b + 1] - k;
    if (r->wire) {
        ddp_status st = reducer_pack(r, b);
        return st != DDP_OK ? st
                            : allreduce_start_typed(r->ctx, reducer_elem(r->wire, r->wire_dtype,
                                                                         pl->wire_off[b]),
                                                    pl->buckets[b].n, r->wire_dtype, DDP_SUM,
                                                    r->stream, &r->requests[b]);
    }
    if (n_runs == 1)
        return allreduce_start_typed(r->ctx, reducer_elem(r->grads, r->grad_dtype, pl->run_off[k]),
                                     pl->run_len[k], r->grad_dtype, DDP_SUM, r->stream,
                                     &r->requests[b]);
    return allreduce_runs_start(r->ctx, r->grads, pl->run_off + k, pl->run_len + k, n_runs,
                                r->grad_dtype, DDP_SUM, r->stream, &r->requests[b]);
}

/* zero_stage 1: the packed send buffer of bucket b: its one run in place (no cast), else the
 * bucket's slice of the wire buffer (allocated at the first use for an fp32 wire), filled by
 * reducer_pack. */
static ddp_status reducer_zero_send(ddp_reducer *r, int b, const void **send)
{
    const bucket_plan *pl = &r->plan;
    int k = pl->run_start[b];
    if (r->wire_dtype == r->grad_dtype && pl->run_start[b + 1] - k == 1) {
        *send = reducer_elem(r->grads, r->grad_dtype, pl->run_off[k]);
        return DDP_OK;
    }
    if (!r->wire && !(r->wire = ddp_alloc(r->ctx, r->total * ddp_dtype_size(r->wire_dtype)))) {
        DDP_ERROR("reducer: out of memory for the packing buffer of buckets of several runs "
                  "(%zu elements)", r->total);
        return DDP_ERR_NOMEM;
    }
    *send = reducer_elem(r->wire, r->wire_dtype, pl->wire_off[b]);
    return reducer_pack(r, b);
}

/* Whether bucket b of zero_stage 1 is reduce-scattered in place: on the CPU (MPI_IN_PLACE), one
 * run in the gradients' type. This rank's piece then stays where it is, at the shard's offsets
 * of the gradient buffer (comm_mpi.c), and needs no receive buffer, whose shard-sized 4 bytes per
 * parameter would take a quarter of what stage 1 saves at 4 ranks. (Stage 2 reduce-scatters
 * every bucket in place in its own buffer: reducer_owned.c.) */
static int reducer_zero_in_place(const ddp_reducer *r, int b)
{
    const bucket_plan *pl = &r->plan;
    return ddp_backend(r->ctx) == DDP_BACKEND_CPU && r->wire_dtype == r->grad_dtype &&
           pl->run_start[b + 1] - pl->run_start[b] == 1;
}

/* zero_stage 1: starts bucket b's reduce-scatter into its piece of the receive buffer (or in
 * place). */
static ddp_status reducer_zero_start(ddp_reducer *r, int b)
{
    const size_t *counts = reducer_zero_counts(r, b);
    const void *send = NULL;
    ddp_status st = reducer_zero_send(r, b, &send);
    if (st != DDP_OK)
        return st;
    if (reducer_zero_in_place(r, b))
        return reduce_scatter_start(r->ctx, send, (void *)send, counts, r->wire_dtype, DDP_SUM,
                                    r->stream, &r->requests[b]);
    size_t keep = r->shard_n > 0 ? r->shard_n : 1;
    if (!r->recv && !(r->recv = ddp_alloc(r->ctx, keep * ddp_dtype_size(r->wire_dtype)))) {
        DDP_ERROR("reducer: out of memory for the receive buffer of the shard (%zu elements)",
                  keep);
        return DDP_ERR_NOMEM;
    }
    r->recv_off[b] = r->recv_next;
    r->recv_next += counts[ddp_rank(r->ctx)];
    return reduce_scatter_start(r->ctx, send, reducer_elem(r->recv, r->wire_dtype, r->recv_off[b]),
                                counts, r->wire_dtype, DDP_SUM, r->stream, &r->requests[b]);
}

const reducer_stage_ops reducer_allreduce_ops = {
    .prescale = reducer_prescale_runs, .start = reducer_start, .reap = NULL};
const reducer_stage_ops reducer_sharded_ops = {
    .prescale = reducer_prescale_runs, .start = reducer_zero_start, .reap = NULL};

ddp_status ddp_reducer_mark_ready(ddp_reducer *r, int param)
{
    if (!r || param < 0 || param >= r->n_params) {
        DDP_ERROR("ddp_reducer_mark_ready: parameter %d is outside [0, %d)", param,
                  r ? r->n_params : 0);
        return DDP_ERR_INVALID_ARG;
    }
    if (!r->in_step) {
        DDP_ERROR("ddp_reducer_mark_ready: parameter %d marked outside a step: call "
                  "ddp_reducer_begin() before the backward pass", param);
        return DDP_ERR_STATE;
    }
    if (r->marked[param]) {
        DDP_ERROR("ddp_reducer_mark_ready: parameter %d marked twice in one micro-step", param);
        return DDP_ERR_STATE;
    }
    r->marked[param] = 1;
    r->order[1 + r->n_marked++] = param;
    if (r->owned)
        reducer_owned_check_order(r, param);
    if (!r->sync && (!r->owned || r->local_accum))
        return DDP_OK; /* accumulation step: gradients stay local (bucket-owned: only with
                          local_accum, in the buffers the buckets keep) */
    r->pending[r->plan.param_bucket[param]]--;
    if (!r->defer_launch)
        reducer_launch_ready(r, 0);
    return r->launch_error;
}

/* Casts bucket b back from the wire (when it has one) into its runs and multiplies it by alpha,
 * which completes the division by world x micro-steps. */
static ddp_status reducer_unpack(ddp_reducer *r, int b, float alpha)
{
    const bucket_plan *pl = &r->plan;
    size_t at = pl->wire_off[b];
    ddp_status st = DDP_OK;
    for (int k = pl->run_start[b]; k < pl->run_start[b + 1] && st == DDP_OK; k++) {
        void *grads = reducer_elem(r->grads, r->grad_dtype, pl->run_off[k]);
        if (r->wire)
            st = convert_dev_cast_scale(r->ctx, grads, r->grad_dtype,
                                        reducer_elem(r->wire, r->wire_dtype, at), r->wire_dtype,
                                        pl->run_len[k], alpha, r->stream);
        else if (alpha != 1.0f) /* 1: a 16-bit bucket already divided by the mean's power of 2 */
            st = convert_dev_scale(r->ctx, grads, r->grad_dtype, pl->run_len[k], alpha, r->stream);
        at += pl->run_len[k];
    }
    return st;
}

/* zero_stage 1: casts bucket b's received piece (the runs' parts inside this rank's shard, in
 * ascending offset) into the gradient buffer, multiplied by alpha. */
static ddp_status reducer_zero_unpack(ddp_reducer *r, int b, float alpha)
{
    const bucket_plan *pl = &r->plan;
    size_t at = r->recv_off[b], a = 0, e = 0;
    ddp_status st = DDP_OK;
    if (reducer_zero_in_place(r, b)) { /* the piece is in place, at the shard's offsets */
        reducer_run_in_shard(r, pl->run_start[b], &a, &e);
        return e <= a ? DDP_OK
                      : convert_dev_scale(r->ctx, reducer_elem(r->grads, r->grad_dtype, a),
                                          r->grad_dtype, e - a, alpha, r->stream);
    }
    for (int k = pl->run_start[b]; k < pl->run_start[b + 1] && st == DDP_OK; k++) {
        reducer_run_in_shard(r, k, &a, &e);
        if (e <= a)
            continue;
        st = convert_dev_cast_scale(r->ctx, reducer_elem(r->grads, r->grad_dtype, a), r->grad_dtype,
                                    reducer_elem(r->recv, r->wire_dtype, at), r->wire_dtype,
                                    e - a, alpha, r->stream);
        at += e - a;
    }
    return st;
}

static ddp_status reducer_scale(ddp_reducer *r)
{
    double mean = 1.0 / reducer_micro_total(r);
    float alpha = (float)(mean / (double)reducer_prescale(r));
    if (r->owned) /* the shard holds the sums of every micro-step's pieces */
        return alpha == 1.0f ? DDP_OK
                             : convert_dev_scale(r->ctx, r->shard_grads, r->grad_dtype,
                                                 r->shard_n, alpha, r->stream);
    for (int b = 0; b < r->plan.n_buckets; b++) {
        ddp_status st = r->zero_stage ? reducer_zero_unpack(r, b, alpha)
                                      : reducer_unpack(r, b, alpha);
        if (st != DDP_OK) {
            DDP_ERROR("reducer: scaling bucket %d failed: %s", b, ddp_strerror(st));
            return st;
        }
    }
    return DDP_OK;
}

/* Rank `rank`'s gathered marking order: its valid flag, then n_params parameters. */
static const int *reducer_order_of(const ddp_reducer *r, int rank)
{
    return r->orders + (size_t)rank * ((size_t)r->n_params + 1);
}

/* The first rank whose order differs from rank 0's (*pos: where), or -1 when all agree. */
static int reducer_order_mismatch(const ddp_reducer *r, int *pos)
{
    const int *first = reducer_order_of(r, 0);
    for (int q = 1; q < ddp_world_size(r->ctx); q++) {
        const int *o = reducer_order_of(r, q);
        for (int i = 1; i <= r->n_params; i++) {
            if (o[i] != first[i]) {
                *pos = i - 1;
                return q;
            }
        }
    }
    return -1;
}

/* 1 when the gathered order is reverse parameter order, the plan's from the start. */
static int reducer_order_is_reverse(const ddp_reducer *r)
{
    const int *o = reducer_order_of(r, 0) + 1;
    for (int i = 0; i < r->n_params; i++)
        if (o[i] != r->n_params - 1 - i)
            return 0;
    return 1;
}

/* Plans the buckets in the agreed ready order and adopts the plan when it differs from the
 * current one. A plan that cannot be built on some rank (memory) is given up on every rank
 * (one host all-reduce), so that all ranks keep issuing the same all-reduces. */
static ddp_status reducer_rebuild(ddp_reducer *r)
{
    bucket_plan plan;
    ddp_status st = bucket_plan_build(r->numel, r->n_params, reducer_order_of(r, 0) + 1,
                                      r->cap_bytes, r->first_cap_bytes, &plan);
    int64_t failed = st != DDP_OK;
    st = ddp_allreduce_host(r->ctx, &failed, 1, DDP_INT64, DDP_MAX);
    if (st != DDP_OK || failed || bucket_plan_same(&plan, &r->plan)) {
        if (st == DDP_OK && failed)
            DDP_WARN0("reducer: the buckets could not be rebuilt in ready order on every rank "
                      "(out of memory): they stay in parameter order");
        bucket_plan_free(&plan);
        return st;
    }
    bucket_plan_free(&r->plan);
    r->plan = plan;
    r->bucket_order = DDP_BUCKETS_READY_ORDER;
    DDP_INFO0("reducer: buckets rebuilt in ready order: %d buckets (%d runs of the gradient "
              "buffer)", plan.n_buckets, plan.run_start[plan.n_buckets]);
    ddp_trace_instant("reducer.rebuilt", plan.n_buckets);
    return DDP_OK;
}

/* After the first sync step in which every rank marked every parameter: the ranks compare their
 * marking orders (a host all-gather: collective, so every rank calls it, valid or not) and the
 * buckets follow the agreed order from the next step on. While some rank's step failed, nothing
 * is settled (tried again at the next sync step). */
static ddp_status reducer_ready_order(ddp_reducer *r, int valid)
{
    r->order[0] = valid && r->n_marked == r->n_params;
    size_t n = (size_t)r->n_params + 1;
    ddp_status st = host_allgather(r->ctx, r->order, r->orders, n * sizeof *r->order);
    for (int q = 0; st == DDP_OK && q < ddp_world_size(r->ctx); q++)
        if (!reducer_order_of(r, q)[0])
            return DDP_OK;
    r->order_agreed = 1;
    if (st != DDP_OK)
        return st;
    int pos = 0, bad = reducer_order_mismatch(r, &pos);
    if (bad >= 0) {
        r->bucket_order = DDP_BUCKETS_MISMATCH;
        ddp_log_write(r->strict_order ? DDP_LOG_ERROR : DDP_LOG_WARN, !r->strict_order, __FILE__,
                      __LINE__, "reducer: rank %d marked its parameters in another order than "
                      "rank 0 (position %d: parameter %d, rank 0's parameter %d): the buckets stay "
                      "in parameter order (correct for any order, less overlap); mark in the same "
                      "order on every rank", bad, pos, reducer_order_of(r, bad)[1 + pos],
                      reducer_order_of(r, 0)[1 + pos]);
        return r->strict_order ? DDP_ERR_MISMATCH : DDP_OK;
    }
    return reducer_order_is_reverse(r) ? DDP_OK : reducer_rebuild(r);
}

ddp_status ddp_reducer_finish(ddp_reducer *r)
{
    if (!r) {
        DDP_ERROR("ddp_reducer_finish: reducer is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    if (!r->in_step || !r->sync) {
        DDP_ERROR("ddp_reducer_finish: no sync step in progress: call ddp_reducer_begin(r, 1) "
                  "and mark every parameter first");
        return DDP_ERR_STATE;
    }
    ddp_status marked = reducer_check_marked(r);
    /* a timer error only loses the measurement */
    int timed = r->timer && (ddp_trace_enabled() || straggler_on());
    if (timed) {
        reducer_report_exposed(r, 0);
        exposed_timer_start(r->timer, reducer_stream(r));
    }
    /* Launch what is left even after an error, so peers that did everything right are not left
     * waiting in an all-reduce this rank never joins. */
    reducer_launch_ready(r, 1);
    ddp_trace_begin("reducer.wait", r->plan.n_buckets);
    int64_t waited = straggler_wait_begin();
    ddp_status st = r->owned ? reducer_owned_drain(r) : reducer_wait_all(r);
    straggler_wait_end(waited);
    ddp_trace_end("reducer.wait", r->plan.n_buckets);
    if (timed)
        exposed_timer_stop(r->timer, reducer_stream(r));
    if (st == DDP_OK)
        st = r->launch_error;
    if (st == DDP_OK)
        st = marked;
    if (st == DDP_OK)
        st = reducer_scale(r);
    if (st == DDP_OK && r->stream) /* libddp's later work (the loss scaler) sees the result */
        st = ddp_after_stream(r->ctx, r->stream);
    if (!r->order_agreed && !r->static_buckets) { /* collective: every rank, whatever st */
        ddp_status ro = reducer_ready_order(r, st == DDP_OK);
        if (st == DDP_OK)
            st = ro;
    }
    r->in_step = 0;
    r->micro_steps = 0;
    return st;
}

int ddp_reducer_n_buckets(const ddp_reducer *r)
{
    return r ? r->plan.n_buckets : 0;
}

const ddp_bucket *ddp_reducer_buckets(const ddp_reducer *r)
{
    return r ? r->plan.buckets : NULL;
}

int ddp_reducer_bucket_params(const ddp_reducer *r, int bucket, const int **params)
{
    if (params)
        *params = NULL;
    if (!r || bucket < 0 || bucket >= r->plan.n_buckets)
        return 0;
    int first = r->plan.param_start[bucket];
    if (params)
        *params = r->plan.params + first;
    return r->plan.param_start[bucket + 1] - first;
}

ddp_bucket_order ddp_reducer_bucket_order(const ddp_reducer *r)
{
    return r ? r->bucket_order : DDP_BUCKETS_PARAM_ORDER;
}

int ddp_reducer_zero_stage(const ddp_reducer *r)
{
    return r ? r->zero_stage : 0;
}

void ddp_reducer_shard(const ddp_reducer *r, size_t *offset, size_t *n)
{
    if (offset)
        *offset = r ? r->shard_off : 0;
    if (n)
        *n = r ? r->shard_n : 0;
}

void *ddp_reducer_shard_grads(const ddp_reducer *r)
{
    if (!r || reducer_require_stage(r, REDUCER_STAGE(2), "ddp_reducer_shard_grads",
                                    "the averaged gradients are in the buffer given to "
                                    "ddp_reducer_create (zero_stage 1: at ddp_reducer_shard's "
                                    "offset)") != DDP_OK)
        return NULL;
    return r->shard_grads;
}

size_t ddp_reducer_buffer_bytes(const ddp_reducer *r)
{
    if (!r)
        return 0;
    size_t keep = r->shard_n > 0 ? r->shard_n : 1;
    return (r->wire ? r->total * ddp_dtype_size(r->wire_dtype) : 0) +
           (r->recv ? keep * ddp_dtype_size(r->wire_dtype) : 0) +
           (r->shard_grads ? keep * ddp_dtype_size(r->grad_dtype) : 0) + grad_pool_bytes(r->pool);
}

/* What a reducer that does not shard does instead of a gather. */
#define REDUCER_NO_GATHER "every rank holds every parameter: after the optimizer step there is " \
                          "nothing to gather (call no ddp_reducer_gather_*)"

/* Gathers: one operation per bucket, the in-place all-gather with per-rank counts of each of its
 * runs of the flat buffer (cut at the shard boundaries; on NCCL all in one group), started
 * bucket by bucket from the last (the first layers of a forward pass in ready order) to the
 * first. */

static ddp_status reducer_gather_check(const ddp_reducer *r, const void *params, ddp_dtype dtype,
                                       const char *who)
{
    if (!r || !params || ddp_dtype_size(dtype) == 0) {
        DDP_ERROR("%s: need a reducer, a parameter buffer and a known element type (got type %d)",
                  who, (int)dtype);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = reducer_require_stage(r, REDUCER_SHARDED, who, REDUCER_NO_GATHER);
    if (st != DDP_OK)
        return st;
    if ((r->in_step && r->sync) || r->gather_launched > r->gather_waited) {
        DDP_ERROR("%s: %s", who, r->in_step && r->sync
                      ? "called inside a sync step: call it after ddp_reducer_finish and the "
                        "optimizer step"
                      : "the previous gather is still under way: ddp_reducer_gather_wait(r, -1)");
        return DDP_ERR_STATE;
    }
    return DDP_OK;
}

/* Starts the in-place all-gather of bucket b's runs, each cut at the shard boundaries, as ONE
 * operation (one NCCL group) into the next request slot; counts has room for the bucket's runs
 * x world entries. */
static ddp_status reducer_gather_bucket(ddp_reducer *r, void *params, ddp_dtype dtype, int b,
                                        size_t *counts)
{
    const bucket_plan *pl = &r->plan;
    int world = ddp_world_size(r->ctx), k0 = pl->run_start[b];
    int n_runs = pl->run_start[b + 1] - k0;
    for (int k = k0; k < k0 + n_runs; k++)
        for (int q = 0; q < world; q++)
            counts[(size_t)(k - k0) * (size_t)world + (size_t)q] =
                reducer_overlap(r, q, pl->run_off[k], pl->run_len[k]);
    return allgatherv_runs_start(r->ctx, params, pl->run_off + k0, n_runs, counts, dtype,
                                 r->stream, &r->gather_req[r->gather_launched++]);
}

ddp_status ddp_reducer_gather_start(ddp_reducer *r, void *params, ddp_dtype dtype)
{
    ddp_status st = reducer_gather_check(r, params, dtype, "ddp_reducer_gather_start");
    if (st != DDP_OK)
        return st;
    const bucket_plan *pl = &r->plan;
    int most = 1;
    for (int b = 0; b < pl->n_buckets; b++) {
        int n_runs = pl->run_start[b + 1] - pl->run_start[b];
        most = n_runs > most ? n_runs : most;
    }
    size_t *counts = malloc((size_t)most * (size_t)ddp_world_size(r->ctx) * sizeof *counts);
    if (!counts) {
        DDP_ERROR("ddp_reducer_gather_start: out of memory");
        return DDP_ERR_NOMEM; /* joins no collective: the peers wait for the deadline */
    }
    r->gather_launched = r->gather_waited = 0;
    for (int b = pl->n_buckets - 1; b >= 0; b--) {
        trace_set_tag(b);
        st = reducer_gather_bucket(r, params, dtype, b, counts);
        r->gather_end[b] = r->gather_launched;
        if (st != DDP_OK) {
            r->gather_launched--; /* the failed slot holds no request */
            DDP_ERROR("reducer: cannot start the parameters' all-gather of bucket %d: %s", b,
                      ddp_strerror(st));
            break;
        }
    }
    trace_set_tag(-1);
    free(counts);
    for (int b = 0; st != DDP_OK && b < pl->n_buckets; b++) /* wait: all that was started */
        r->gather_end[b] = r->gather_launched;
    return st;
}

ddp_status ddp_reducer_gather_wait(ddp_reducer *r, int param)
{
    if (!r || param < -1 || param >= r->n_params) {
        DDP_ERROR("ddp_reducer_gather_wait: parameter %d is outside [-1, %d)", param,
                  r ? r->n_params : 0);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status first = reducer_require_stage(r, REDUCER_SHARDED, "ddp_reducer_gather_wait",
                                             REDUCER_NO_GATHER);
    if (first != DDP_OK || r->gather_waited >= r->gather_launched) /* refused, or nothing to wait */
        return first;
    int end = param < 0 ? r->gather_launched : r->gather_end[r->plan.param_bucket[param]];
    /* exposed communication of the forward pass: the span (the CPU's measure) and, on CUDA, the
     * reducer's stream's wait timed on the device */
    int timed = r->gather_waited < end && (ddp_trace_enabled() || straggler_on());
    if (timed) {
        ddp_trace_begin("reducer.gather_wait", param);
        if (r->gather_timer)
            exposed_timer_start(r->gather_timer, reducer_stream(r));
    }
    int64_t waited = straggler_wait_begin();
    for (; r->gather_waited < end; r->gather_waited++) {
        ddp_status st = ddp_wait(r->gather_req[r->gather_waited]);
        r->gather_req[r->gather_waited] = NULL;
        if (st != DDP_OK && first == DDP_OK) {
            DDP_ERROR("reducer: the parameters' all-gather failed: %s", ddp_strerror(st));
            first = st;
        }
    }
    straggler_wait_end(waited);
    if (timed) {
        if (r->gather_timer)
            exposed_timer_stop(r->gather_timer, reducer_stream(r));
        ddp_trace_end("reducer.gather_wait", param);
    }
    return first;
}

/* All at once: one in-place all-gather of the whole buffer (fewer MPI calls than one per run). */
ddp_status ddp_reducer_gather_params(ddp_reducer *r, void *params, ddp_dtype dtype)
{
    ddp_status st = reducer_gather_check(r, params, dtype, "ddp_reducer_gather_params");
    if (st != DDP_OK)
        return st;
    int world = ddp_world_size(r->ctx);
    size_t *counts = malloc((size_t)world * sizeof *counts);
    if (!counts) {
        DDP_ERROR("ddp_reducer_gather_params: out of memory");
        return DDP_ERR_NOMEM;
    }
    for (int q = 0; q < world; q++)
        counts[q] = reducer_overlap(r, q, 0, r->total);
    ddp_request *req = NULL;
    trace_set_tag(-1);
    st = allgatherv_start(r->ctx, reducer_elem(params, dtype, r->shard_off), params, counts, dtype,
                          r->stream, &req);
    free(counts);
    return st == DDP_OK ? ddp_wait(req) : st;
}
