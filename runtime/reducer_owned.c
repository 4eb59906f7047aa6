/* reducer_owned.c - the reducer's bucket-owned gradients (ZeRO stage 2: created with grads NULL,
 * reducer.c's top comment): the buffer layout and the pool (grad_pool.c), the pointers the backward
 * pass writes through (ddp_reducer_grad_ptr), each bucket's in-place reduce-scatter (the stage's
 * reducer_owned_ops) and its reaping into the shard buffer. Calls only reducer_core.c among the
 * reducer's files (reducer_private.h).
 */
#include <stdint.h>
#include <stdlib.h>

#include "convert.h"
#include "reducer_private.h"

/* Bucket-owned gradients: the size of a new buffer for each bucket. The buckets after the first
 * that fit the cap share buffers of the largest of them; the first (its own, smaller cap) and a
 * parameter over the cap (alone in its bucket) get their own size. With local_accum every bucket
 * holds its buffer through the micro-steps, so none is shared: each gets its own size (the pool
 * then holds exactly the full gradients). fill: n_buckets entries. */
static void reducer_owned_sizes(const ddp_reducer *r, size_t *fill)
{
    const bucket_plan *pl = &r->plan;
    if (r->local_accum) {
        for (int b = 0; b < pl->n_buckets; b++)
            fill[b] = pl->buckets[b].n;
        return;
    }
    size_t cap_n = r->cap_bytes / sizeof(float), shared = 0; /* the caps count 4-byte elements */
    for (int b = 1; b < pl->n_buckets; b++)
        if (pl->buckets[b].n <= cap_n && pl->buckets[b].n > shared)
            shared = pl->buckets[b].n;
    for (int b = 0; b < pl->n_buckets; b++)
        fill[b] = b > 0 && pl->buckets[b].n <= cap_n ? shared : pl->buckets[b].n;
}

/* Bucket-owned gradients: each parameter's place in its bucket's buffer (the bucket's parameters
 * in ascending index, i.e. its runs in ascending offset, packed end to end) and the pool. */
ddp_status reducer_owned_setup(ddp_reducer *r)
{
    const bucket_plan *pl = &r->plan;
    size_t *fill = calloc((size_t)pl->n_buckets, sizeof *fill);
    r->pack_off = malloc((size_t)r->n_params * sizeof *r->pack_off);
    if (!fill || !r->pack_off) {
        free(fill);
        DDP_ERROR("ddp_reducer_create: out of memory for the bucket layout of %d parameters",
                  r->n_params);
        return DDP_ERR_NOMEM;
    }
    for (int p = 0; p < r->n_params; p++) {
        int b = pl->param_bucket[p];
        r->pack_off[p] = fill[b];
        fill[b] += r->numel[p];
    }
    reducer_owned_sizes(r, fill);
    ddp_status st = grad_pool_create(r->ctx, pl->n_buckets, fill, r->grad_dtype, r->wire_dtype,
                                     &r->pool);
    free(fill);
    return st;
}

/* Bucket-owned gradients, collective (one host all-reduce that every rank joins, whatever `st`,
 * its own outcome so far): the ranks' plans must be the same, since every bucket's
 * reduce-scatter has the counts of its runs, and a rank whose create failed makes every rank
 * fail instead of leaving them waiting in the first step. */
ddp_status reducer_owned_agree(ddp_reducer *r, ddp_status st)
{
    const uint64_t prime = 1099511628211ull; /* FNV-1a over the plan */
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; st == DDP_OK && i < r->n_params; i++) {
        h = (h ^ (uint64_t)r->plan.params[i]) * prime;
        h = (h ^ (uint64_t)r->numel[r->plan.params[i]]) * prime;
    }
    h = ((h ^ (uint64_t)r->cap_bytes) * prime ^ (uint64_t)r->first_cap_bytes) * prime;
    int64_t v[3] = {st != DDP_OK, (int64_t)(h >> 1), (int64_t)(~h >> 1)};
    ddp_status agreed = ddp_allreduce_host(r->ctx, v, 3, DDP_INT64, DDP_MAX);
    if (st != DDP_OK || agreed != DDP_OK)
        return st != DDP_OK ? st : agreed;
    if (v[0]) {
        DDP_ERROR("ddp_reducer_create: another rank could not create its reducer (see its "
                  "messages)");
        return DDP_ERR_MISMATCH;
    }
    if (v[1] != (int64_t)(h >> 1) || v[2] != (int64_t)(~h >> 1)) {
        DDP_ERROR("ddp_reducer_create: the ranks planned different buckets: give every rank the "
                  "same ready_order, bucket caps and parameter sizes");
        return DDP_ERR_MISMATCH;
    }
    return DDP_OK;
}

/* Bucket-owned gradients: bucket b's buffers (*wire, when not NULL, gets the wire twin or NULL),
 * taken from the pool and zeroed when b holds none yet in this micro-step. The zeroing is queued
 * on the reducer's stream, after that stream's wait for the buffer's last reduce-scatter (CUDA). */
static ddp_status reducer_owned_take(ddp_reducer *r, int b, void **grads, void **wire)
{
    size_t n = r->plan.buckets[b].n;
    int fresh = 0;
    void *w = NULL;
    ddp_status st = grad_pool_take(r->pool, b, n, grads, &w, &fresh);
    if (wire)
        *wire = w;
    if (st == DDP_OK && fresh)
        st = convert_dev_zero(r->ctx, *grads, r->grad_dtype, n, r->stream);
    return st;
}

/* Bucket-owned: warns once when the parameters are marked in another order than the plan's (the
 * ready_order): still correct, but a bucket waits longer for its last parameter and holds its
 * buffer meanwhile. */
void reducer_owned_check_order(ddp_reducer *r, int param)
{
    int pos = r->n_marked - 1;
    if (r->order_warned || r->plan.params[pos] == param)
        return;
    r->order_warned = 1;
    DDP_WARN("reducer: parameter %d marked ready at position %d, where ready_order has parameter "
             "%d: the gradients are right, but buckets stay alive longer (more memory, less "
             "overlap); give ready_order the order the backward pass marks in", param, pos,
             r->plan.params[pos]);
}

ddp_status ddp_reducer_grad_ptr(ddp_reducer *r, int param, void **ptr)
{
    if (ptr)
        *ptr = NULL;
    if (!r || !ptr || param < 0 || param >= r->n_params) {
        DDP_ERROR("ddp_reducer_grad_ptr: parameter %d is outside [0, %d) (or no reducer, or ptr "
                  "is NULL)", param, r ? r->n_params : 0);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = reducer_require_stage(r, REDUCER_STAGE(2), "ddp_reducer_grad_ptr",
                                          "the gradients live in the buffer given to "
                                          "ddp_reducer_create: write them there");
    if (st != DDP_OK)
        return st;
    if (!r->in_step || r->marked[param]) {
        DDP_ERROR("ddp_reducer_grad_ptr: parameter %d: %s", param,
                  !r->in_step ? "no micro-step in progress: call ddp_reducer_begin() before the "
                                "backward pass"
                              : "already marked ready in this micro-step, so its bucket may be "
                                "on the wire: write a gradient before marking it");
        return DDP_ERR_STATE;
    }
    void *grads = NULL;
    st = reducer_owned_take(r, r->plan.param_bucket[param], &grads, NULL);
    if (st == DDP_OK)
        *ptr = reducer_elem(grads, r->grad_dtype, r->pack_off[param]);
    return st;
}

/* The stage's prescale: multiplies bucket b's buffer by pre (a 16-bit wire's division before the
 * sum). */
static ddp_status reducer_owned_prescale(ddp_reducer *r, int b, float pre)
{
    void *grads = NULL;
    ddp_status st = reducer_owned_take(r, b, &grads, NULL);
    return st == DDP_OK ? convert_dev_scale(r->ctx, grads, r->grad_dtype, r->plan.buckets[b].n,
                                            pre, r->stream)
                        : st;
}

/* The stage's start: bucket b's buffer (or its wire twin, filled by a cast) reduce-scattered in
 * place, MPI and NCCL alike: this rank's piece stays there until reducer_owned_reap. */
static ddp_status reducer_owned_start(ddp_reducer *r, int b)
{
    const size_t *counts = reducer_zero_counts(r, b);
    void *grads = NULL, *wire = NULL;
    ddp_status st = reducer_owned_take(r, b, &grads, &wire);
    if (st == DDP_OK && wire)
        st = convert_dev_cast(r->ctx, wire, r->wire_dtype, grads, r->grad_dtype,
                              r->plan.buckets[b].n, r->stream);
    if (st != DDP_OK)
        return st;
    void *send = wire ? wire : grads;
    return reduce_scatter_start(r->ctx, send, send, counts, r->wire_dtype, DDP_SUM, r->stream,
                                &r->requests[b]);
}

/* Bucket-owned, bucket b's reduce-scatter waited for: this rank's piece (in place in the sent
 * buffer, after the lower ranks' pieces) into the shard buffer, cast in the first micro-step of
 * the optimizer step, added to it in the later ones (the mean is taken by finish). */
static ddp_status reducer_owned_unpack(ddp_reducer *r, int b)
{
    const bucket_plan *pl = &r->plan;
    int world = ddp_world_size(r->ctx);
    const size_t *counts = r->counts + (size_t)b * (size_t)world;
    void *grads = NULL, *wire = NULL;
    ddp_status st = reducer_owned_take(r, b, &grads, &wire); /* held since its launch */
    const void *piece = wire ? wire : grads;
    size_t at = 0;
    for (int q = 0; q < ddp_rank(r->ctx); q++)
        at += counts[q];
    for (int k = pl->run_start[b]; k < pl->run_start[b + 1] && st == DDP_OK; k++) {
        size_t a = 0, e = 0;
        reducer_run_in_shard(r, k, &a, &e);
        if (e <= a)
            continue;
        void *dst = reducer_elem(r->shard_grads, r->grad_dtype, a - r->shard_off);
        const void *src = reducer_elem((void *)piece, r->wire_dtype, at);
        st = r->micro_steps == 1 || r->local_accum /* local_accum: one reduce-scatter a step */
                 ? convert_dev_cast(r->ctx, dst, r->grad_dtype, src, r->wire_dtype, e - a,
                                    r->stream)
                 : convert_dev_cast_add(r->ctx, dst, r->grad_dtype, src, r->wire_dtype, e - a,
                                        r->stream);
        at += e - a;
    }
    return st;
}

/* Bucket-owned: waits for the oldest reduce-scatter under way (CUDA: the reducer's stream waits),
 * unpacks its piece and gives its buffer back. A failure becomes the step's launch_error, so
 * nothing more is launched. */
static void reducer_owned_reap(ddp_reducer *r)
{
    int b = r->next_reap++;
    ddp_status st = DDP_OK;
    if (r->requests[b]) {
        st = ddp_wait(r->requests[b]);
        r->requests[b] = NULL;
        if (st != DDP_OK)
            DDP_ERROR("reducer: reduce-scatter of bucket %d (parameters %d..%d) failed: %s", b,
                      r->plan.buckets[b].first_param, r->plan.buckets[b].last_param,
                      ddp_strerror(st));
    }
    if (st == DDP_OK && r->launch_error == DDP_OK)
        st = reducer_owned_unpack(r, b);
    grad_pool_give_back(r->pool, b);
    if (st != DDP_OK && r->launch_error == DDP_OK)
        r->launch_error = st;
}

const reducer_stage_ops reducer_owned_ops = {
    .prescale = reducer_owned_prescale, .start = reducer_owned_start, .reap = reducer_owned_reap};

/* Bucket-owned: every launched reduce-scatter reaped, every buffer back in the pool (those of
 * buckets a failure left unlaunched too). Returns the step's first failure. */
ddp_status reducer_owned_drain(ddp_reducer *r)
{
    while (r->next_reap < r->next_launch)
        reducer_owned_reap(r);
    for (int b = r->next_launch; b < r->plan.n_buckets; b++)
        grad_pool_give_back(r->pool, b);
    return r->launch_error;
}

/* Bucket-owned: ends a micro-step that was not a sync step (begin() of the next one does): every
 * bucket launched (also after an error, so that the peers are not left waiting), reaped and
 * added into the shard. */
ddp_status reducer_owned_settle(ddp_reducer *r)
{
    ddp_status marked = reducer_check_marked(r);
    if (r->local_accum) /* the buckets keep their buffers: the next micro-step adds into them */
        return marked;
    reducer_launch_ready(r, 1);
    ddp_status st = reducer_owned_drain(r);
    return st != DDP_OK ? st : marked;
}
