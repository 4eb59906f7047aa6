/* test_zero.c - ZeRO sharding in libddp under real mpirun (1 to 4 ranks): ddp_shard_range,
 * ddp_reduce_scatter and ddp_allgather_typed, and the reducer's zero_stage 1 and 2 against
 * zero_stage 0, then the all-gather of the parameters, the sharded norm and the loss scaler on
 * shards.
 *
 * Layout: llm.c's tensor-major one (as test_reducer_ready.c) of 302 elements (a count that no
 * world size here divides), marked layer by layer, so the buckets are rebuilt in ready order
 * after the first sync step and are made of several runs; small caps (16, then 64 floats) put
 * bucket edges everywhere and many buckets across shard boundaries. Shards (DDP_SHARD_ALIGN 64):
 * 2 ranks 192 + 110, 3 ranks 128 + 128 + 46, 4 ranks 128 + 128 + 46 + 0 (an empty shard).
 * Values: pseudo-random floats with full 23-bit mantissas, so sums round. zero_stage 1 and 2
 * must give each rank's shard the zero_stage 0 average: bit-identical at 1 and 2 ranks (a sum of
 * two contributions is the same in any order); at 3 and 4 ranks the reduce-scatter's reduction
 * order (Open MPI's algorithm for MPI_Reduce_scatter) may differ from the all-reduce's, so within
 * 2^-20 of the sum of the magnitudes / (W K) for fp32 (a few roundings of fp32), 2^-6 of it
 * through 16 bits (a few bf16 roundings of the pairwise sums).
 * Stage 2 keeps no gradient buffer (one is refused): its bucket-owned gradients run beside them, writing each
 * micro-step's contribution through ddp_reducer_grad_ptr: the same shard as stage 0 with one
 * micro-step at 1 and 2 ranks, and within the tolerances above (at 2 ranks too) with several,
 * since its shard adds every micro-step's reduce-scattered sums ((a1 + b1) + (a2 + b2) instead of
 * stage 0's (a1 + a2) + (b1 + b2)); through 16 bits it also rounds each micro-step's sum and the
 * shard's accumulation in the gradients' type, so its tolerance is 2^-5 there. Its buffers stop
 * growing after the first step, and its bad calls are refused.
 * `--backend cuda` (skipped without a GPU): the same on device memory through NCCL
 * (ncclReduceScatter / ncclAllGather, or groups of ncclReduce / ncclBroadcast for unequal
 * blocks); never run on a GPU yet when this was written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp_trace.h"
#include "half.h"

#define L 3
#define N_TENSORS 4
#define N_PARAMS (2 + N_TENSORS * L + 1)
#define TOTAL 302 /* divides by none of 2, 3, 4 */
#define MIB (1024.0 * 1024.0)

static const size_t layer_numel[N_TENSORS] = {8, 24, 16, 32};
static size_t numel[N_PARAMS];
static size_t offset[N_PARAMS + 1];
static int backward[N_PARAMS];

typedef enum case_kind { CASE_FP32, CASE_BF16_WIRE, CASE_BF16_GRADS } case_kind;
static const char *const case_name[] = {"fp32", "fp32 on a bf16 wire", "bf16 gradients"};

static int param_of(int tensor, int layer)
{
    return 2 + tensor * L + layer;
}

static void make_layout(void)
{
    numel[0] = 40;
    numel[1] = 12;
    for (int t = 0; t < N_TENSORS; t++)
        for (int l = 0; l < L; l++)
            numel[param_of(t, l)] = layer_numel[t];
    numel[N_PARAMS - 1] = 10;
    for (int p = 0; p < N_PARAMS; p++)
        offset[p + 1] = offset[p] + numel[p];
    int k = 0;
    backward[k++] = N_PARAMS - 1;
    for (int l = L - 1; l >= 0; l--)
        for (int t = N_TENSORS - 1; t >= 0; t--)
            backward[k++] = param_of(t, l);
    backward[k++] = 1;
    backward[k++] = 0;
}

/* A float in [-2, 2) with a full mantissa, fixed by (rank, element, micro-step). */
static float value(int rank, size_t i, int micro)
{
    uint64_t h = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)(micro + 1) * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return ((float)(h >> 40) / 16777216.0f - 0.5f) * 4.0f;
}

/* ---- ddp_shard_range --------------------------------------------------------------------- */

static void test_shard_range(void)
{
    size_t off = 1, n = 1;
    static const size_t want3[3][2] = {{0, 64}, {64, 36}, {100, 0}};
    for (int q = 0; q < 3; q++) {
        CHECK(ddp_shard_range(100, 3, q, &off, &n) == DDP_OK, "shard_range(100, 3, %d)", q);
        CHECK(off == want3[q][0] && n == want3[q][1], "100 on 3, rank %d: [%zu, +%zu)", q, off, n);
    }
    size_t at = 0;
    for (int q = 0; q < 4; q++) { /* 302 on 4: contiguous, aligned, covering */
        ddp_shard_range(TOTAL, 4, q, &off, &n);
        CHECK(off == at && (n == 0 || off % DDP_SHARD_ALIGN == 0), "302 on 4, rank %d", q);
        at += n;
    }
    CHECK(at == TOTAL, "the shards cover %zu of %d elements", at, TOTAL);
    CHECK(ddp_shard_range(0, 2, 1, &off, &n) == DDP_OK && off == 0 && n == 0, "empty buffer");
    CHECK(ddp_shard_range(10, 1, 0, &off, &n) == DDP_OK && off == 0 && n == 10, "one rank");
    CHECK(ddp_shard_range(10, 2, 2, &off, &n) == DDP_ERR_INVALID_ARG, "rank past the world");
    CHECK(ddp_shard_range(10, 0, 0, &off, &n) == DDP_ERR_INVALID_ARG, "world size 0");
}

/* ---- the public reduce-scatter and all-gather --------------------------------------------- */

static void test_collectives(ddp_ctx *ctx)
{
    enum { N = 5 };
    int w = ddp_world_size(ctx), me = ddp_rank(ctx);
    float *send = ddp_alloc(ctx, (size_t)w * N * sizeof(float)), host[64 * N];
    float *recv = ddp_alloc(ctx, (size_t)w * N * sizeof(float));
    uint16_t h[64 * N];
    for (int i = 0; i < w * N; i++)
        host[i] = (float)(me + i * 10); /* block q, element j: i = q N + j */
    ddp_upload(ctx, send, host, (size_t)w * N * sizeof(float));
    CHECK(ddp_reduce_scatter(ctx, send, recv, N, DDP_FP32, DDP_SUM, NULL) == DDP_OK, "fp32 sum");
    ddp_download(ctx, host, recv, N * sizeof(float));
    for (int j = 0; j < N; j++)
        CHECK(host[j] == (float)(w * (w - 1) / 2 + w * (me * N + j) * 10), "sum[%d] = %g", j,
              host[j]);
    for (int i = 0; i < w * N; i++)
        h[i] = half_f32_to_bf16((float)(me + i));
    ddp_upload(ctx, send, h, (size_t)w * N * sizeof *h);
    CHECK(ddp_reduce_scatter(ctx, send, recv, N, DDP_BF16, DDP_AVG, NULL) == DDP_OK, "bf16 avg");
    ddp_download(ctx, h, recv, N * sizeof *h);
    for (int j = 0; j < N; j++)
        CHECK(half_bf16_to_f32(h[j]) == (float)(me * N + j) + (float)(w - 1) / 2.0f,
              "bf16 avg[%d] = %g", j, half_bf16_to_f32(h[j]));
    CHECK(ddp_reduce_scatter(ctx, send, recv, N, DDP_INT64, DDP_SUM, NULL) == DDP_ERR_INVALID_ARG,
          "int64 reduce-scatter accepted");
    /* all-gather: in place (this rank's block already in recv) and from another buffer */
    for (int j = 0; j < N; j++)
        host[j] = (float)(100 * me + j);
    ddp_upload(ctx, recv + (size_t)me * N, host, N * sizeof(float));
    CHECK(ddp_allgather_typed(ctx, recv + (size_t)me * N, recv, N, DDP_FP32, NULL) == DDP_OK,
          "all-gather in place");
    ddp_upload(ctx, send, host, N * sizeof(float));
    ddp_download(ctx, host, recv, (size_t)w * N * sizeof(float));
    for (int i = 0; i < w * N; i++)
        CHECK(host[i] == (float)(100 * (i / N) + i % N), "gathered[%d] = %g", i, host[i]);
    ddp_zero(ctx, recv, (size_t)w * N * sizeof(float));
    CHECK(ddp_allgather_typed(ctx, send, recv, N, DDP_FP32, NULL) == DDP_OK, "all-gather");
    ddp_download(ctx, host, recv, (size_t)w * N * sizeof(float));
    for (int i = 0; i < w * N; i++)
        CHECK(host[i] == (float)(100 * (i / N) + i % N), "gathered (copy)[%d] = %g", i, host[i]);
    ddp_free(ctx, send);
    ddp_free(ctx, recv);
}

/* ---- the reducer: stages 0, 1, 2 side by side ------------------------------------------- */

/* Elements of a reducer's shard. */
static size_t n_of_shard(const ddp_reducer *r)
{
    size_t n = 0;
    ddp_reducer_shard(r, NULL, &n);
    return n;
}

#define N_BUF 2 /* reducers with a gradient buffer: zero_stage 0 and 1 (stage 2 owns them) */

typedef struct trio {
    ddp_reducer *r[N_BUF]; /* zero_stage 0, 1 */
    void *grads[N_BUF];
    ddp_reducer *owned; /* zero_stage 2, bucket-owned gradients (NULL: not run) */
    ddp_reducer *local; /* the same with local_accum (NULL: not run) */
    float acc[TOTAL], mag[TOTAL]; /* this rank's local sums; sums of |contribution| (all ranks) */
} trio;

static void small_buckets(ddp_reducer_opts *o, case_kind kind, int stage)
{
    ddp_reducer_opts_default(o);
    o->first_bucket_mb = 64.0 / MIB;
    o->bucket_mb = 256.0 / MIB;
    o->grad_dtype = kind == CASE_BF16_GRADS ? DDP_BF16 : DDP_FP32;
    o->comm_dtype = kind == CASE_BF16_WIRE ? DDP_BF16 : DDP_FP32;
    o->zero_stage = stage;
}

static ddp_reducer *make_reducer(ddp_ctx *ctx, void *grads, case_kind kind, int stage)
{
    ddp_reducer_opts o;
    small_buckets(&o, kind, stage);
    ddp_reducer *r = NULL;
    ddp_status st = ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r);
    CHECK(st == DDP_OK && r, "reducer_create(stage %d): %s", stage, ddp_strerror(st));
    return r;
}

/* A bucket-owned reducer (grads NULL, zero_stage 2) planned in ready_order, accumulating
 * micro-steps locally or not. Collective. */
static ddp_reducer *make_owned(ddp_ctx *ctx, case_kind kind, const int *ready_order, int local)
{
    ddp_reducer_opts o;
    small_buckets(&o, kind, 2);
    o.ready_order = ready_order;
    o.local_accum = local;
    ddp_reducer *r = NULL;
    ddp_status st = ddp_reducer_create(ctx, NULL, numel, N_PARAMS, &o, &r);
    CHECK(st == DDP_OK && r, "reducer_create(bucket-owned): %s", ddp_strerror(st));
    return r;
}

/* Parameter p's local sum into reducer s's gradients, in the gradients' type. */
static void put_grad(ddp_ctx *ctx, trio *t, case_kind kind, int s, int p)
{
    uint16_t h[64];
    if (kind != CASE_BF16_GRADS) {
        ddp_upload(ctx, (float *)t->grads[s] + offset[p], t->acc + offset[p],
                   numel[p] * sizeof(float));
        return;
    }
    for (size_t i = 0; i < numel[p]; i++)
        h[i] = half_f32_to_bf16(t->acc[offset[p] + i]);
    ddp_upload(ctx, (uint16_t *)t->grads[s] + offset[p], h, numel[p] * sizeof *h);
}

/* n elements of grads (fp32 or bf16) as floats. */
static void fetch(ddp_ctx *ctx, const void *grads, case_kind kind, size_t n, float *out)
{
    uint16_t h[TOTAL];
    if (kind != CASE_BF16_GRADS) {
        ddp_download(ctx, out, grads, n * sizeof(float));
        return;
    }
    ddp_download(ctx, h, grads, n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        out[i] = half_bf16_to_f32(h[i]);
}

/* Bucket-owned: parameter p's contribution of micro-step m (not the running sum: the buffer is
 * fresh in every micro-step), written where ddp_reducer_grad_ptr says, then marked. */
static void put_owned(ddp_ctx *ctx, ddp_reducer *r, case_kind kind, int p, int m)
{
    float f[64];
    uint16_t h[64];
    void *dst = NULL;
    CHECK(ddp_reducer_grad_ptr(r, p, &dst) == DDP_OK && dst, "grad_ptr(%d)", p);
    for (size_t i = 0; i < numel[p]; i++) {
        f[i] = value(ddp_rank(ctx), offset[p] + i, m);
        h[i] = half_f32_to_bf16(f[i]);
    }
    if (dst)
        ddp_upload(ctx, dst, kind == CASE_BF16_GRADS ? (void *)h : (void *)f,
                   numel[p] * (kind == CASE_BF16_GRADS ? 2 : 4));
    CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d (bucket-owned)", p);
}

/* Bucket-owned with local_accum, parameter p in micro-step m, called before its local sum takes
 * this micro-step's contribution (write 0) and after (write 1): the buffer grad_ptr gives holds
 * what the micro-steps before left in it (zeros in the first); then the running sum (stage 0's
 * gradient, in the gradients' type) is written there and p is marked. */
static void put_local(ddp_ctx *ctx, trio *t, case_kind kind, int p, int m, int write)
{
    float had[64], want[64];
    uint16_t h[64];
    void *dst = NULL;
    CHECK(ddp_reducer_grad_ptr(t->local, p, &dst) == DDP_OK && dst, "grad_ptr(%d) (local)", p);
    if (!dst)
        return;
    for (size_t i = 0; i < numel[p]; i++) {
        want[i] = t->acc[offset[p] + i];
        h[i] = half_f32_to_bf16(want[i]);
        if (kind == CASE_BF16_GRADS)
            want[i] = half_bf16_to_f32(h[i]);
    }
    if (write) {
        ddp_upload(ctx, dst, kind == CASE_BF16_GRADS ? (void *)h : (void *)want,
                   numel[p] * (kind == CASE_BF16_GRADS ? 2 : 4));
        CHECK(ddp_reducer_mark_ready(t->local, p) == DDP_OK, "mark %d (local)", p);
        return;
    }
    fetch(ctx, dst, kind, numel[p], had);
    for (size_t i = 0; i < numel[p]; i++)
        if (memcmp(&had[i], &want[i], sizeof *had)) {
            CHECK(0, "micro-step %d, parameter %d element %zu: the local_accum buffer holds %.9g, "
                  "the micro-steps before left %.9g", m, p, i, had[i], want[i]);
            break;
        }
}

/* k micro-steps (the last syncs) of all the reducers, marking in `order`. */
static void run_cycle(ddp_ctx *ctx, trio *t, case_kind kind, const int *order, int k)
{
    size_t esize = kind == CASE_BF16_GRADS ? 2 : 4;
    memset(t->acc, 0, sizeof t->acc);
    memset(t->mag, 0, sizeof t->mag);
    for (int s = 0; s < N_BUF; s++)
        ddp_zero(ctx, t->grads[s], TOTAL * esize);
    for (int m = 0; m < k; m++) {
        for (int s = 0; s < N_BUF; s++)
            CHECK(ddp_reducer_begin(t->r[s], m == k - 1) == DDP_OK, "begin");
        if (t->owned)
            CHECK(ddp_reducer_begin(t->owned, m == k - 1) == DDP_OK, "begin (bucket-owned)");
        if (t->local)
            CHECK(ddp_reducer_begin(t->local, m == k - 1) == DDP_OK, "begin (local)");
        for (int j = 0; j < N_PARAMS; j++) {
            int p = order[j];
            if (t->local)
                put_local(ctx, t, kind, p, m, 0);
            for (size_t i = offset[p]; i < offset[p + 1]; i++) {
                t->acc[i] += value(ddp_rank(ctx), i, m);
                for (int q = 0; q < ddp_world_size(ctx); q++)
                    t->mag[i] += fabsf(value(q, i, m));
            }
            for (int s = 0; s < N_BUF; s++) {
                put_grad(ctx, t, kind, s, p);
                CHECK(ddp_reducer_mark_ready(t->r[s], p) == DDP_OK, "mark %d", p);
            }
            if (t->owned)
                put_owned(ctx, t->owned, kind, p, m);
            if (t->local)
                put_local(ctx, t, kind, p, m, 1);
        }
    }
    for (int s = 0; s < N_BUF; s++)
        CHECK(ddp_reducer_finish(t->r[s]) == DDP_OK, "finish (stage %d)", s);
    if (t->owned)
        CHECK(ddp_reducer_finish(t->owned) == DDP_OK, "finish (bucket-owned)");
    if (t->local)
        CHECK(ddp_reducer_finish(t->local) == DDP_OK, "finish (local)");
}

/* The bucket-owned shard against stage 0's: bit-identical with one micro-step at 1 and 2 ranks,
 * else within 2^-20 (fp32) or 2^-5 (through 16 bits) of the sum of magnitudes / (W K). */
static void check_owned(ddp_ctx *ctx, trio *t, case_kind kind, int k, const float *ref,
                        const char *what)
{
    float got[TOTAL];
    size_t off = 0, n = 0;
    ddp_reducer_shard(t->owned, &off, &n);
    fetch(ctx, ddp_reducer_shard_grads(t->owned), kind, n, got);
    int w = ddp_world_size(ctx), shown = 0;
    double rel = w <= 2 && k == 1 ? 0.0 : kind == CASE_FP32 ? ldexp(1.0, -20) : ldexp(1.0, -5);
    for (size_t i = 0; i < n && shown < 5; i++) {
        double tol = rel * t->mag[off + i] / (w * k);
        float want = ref[off + i];
        if (!(fabs(got[i] - want) <= tol) || (tol == 0.0 && memcmp(&got[i], &want, 4))) {
            CHECK(0, "%s, K=%d: bucket-owned shard element %zu (flat %zu): %.9g, stage 0 %.9g "
                  "(tolerance %g)", what, k, i, off + i, got[i], want, tol);
            shown++;
        }
    }
}

/* Stage 1's shard (in the gradient buffer) and stage 2's with local_accum (its own buffer)
 * against stage 0's: the same sums in the same order, so bit-identical at 1 and 2 ranks whatever
 * the micro-steps. */
static void check_shards(ddp_ctx *ctx, trio *t, case_kind kind, int k, const char *what)
{
    float ref[TOTAL], s1[TOTAL], s3[TOTAL];
    size_t off = 0, n = 0;
    ddp_reducer_shard(t->r[1], &off, &n);
    fetch(ctx, t->grads[0], kind, TOTAL, ref);
    fetch(ctx, t->grads[1], kind, TOTAL, s1);
    fetch(ctx, ddp_reducer_shard_grads(t->local), kind, n, s3);
    if (t->owned)
        check_owned(ctx, t, kind, k, ref, what);
    int w = ddp_world_size(ctx), shown = 0;
    double rel = w <= 2 ? 0.0 : kind == CASE_FP32 ? ldexp(1.0, -20) : ldexp(1.0, -6);
    for (size_t i = 0; i < n && shown < 5; i++) {
        double tol = rel * t->mag[off + i] / (w * k);
        float a = s1[off + i], c = s3[i], want = ref[off + i];
        if (!(fabs(a - want) <= tol && fabs(c - want) <= tol) ||
            (tol == 0.0 && (memcmp(&a, &want, 4) || memcmp(&c, &want, 4)))) {
            CHECK(0, "%s, K=%d: shard element %zu (flat %zu): stage 1 %.9g, stage 2 with "
                  "local_accum %.9g, stage 0 %.9g (tolerance %g)", what, k, i, off + i, a, c,
                  want, tol);
            shown++;
        }
    }
}

static void test_stages(ddp_ctx *ctx, case_kind kind, int ready)
{
    trio *t = calloc(1, sizeof *t);
    int order[N_PARAMS];
    for (int j = 0; j < N_PARAMS; j++)
        order[j] = ready ? backward[j] : N_PARAMS - 1 - j;
    for (int s = 0; s < N_BUF && t; s++) {
        t->grads[s] = ddp_alloc(ctx, TOTAL * sizeof(float));
        t->r[s] = make_reducer(ctx, t->grads[s], kind, s);
    }
    /* planned in backward order; without `ready` it is marked in another (a warning, the same
     * sums, buffers held longer) */
    if (t) {
        t->owned = make_owned(ctx, kind, backward, 0);
        t->local = make_owned(ctx, kind, backward, 1);
    }
    if (!t || !t->r[0] || !t->r[1] || !t->owned || !t->local)
        return;
    size_t pool = 0, local_pool = 0, shard_bytes = n_of_shard(t->owned) * (kind == CASE_BF16_GRADS ? 2 : 4);
    size_t off = 0, n = 0, want_off = 0, want_n = 0;
    ddp_reducer_shard(t->r[1], &off, &n);
    ddp_shard_range(TOTAL, ddp_world_size(ctx), ddp_rank(ctx), &want_off, &want_n);
    CHECK(off == want_off && n == want_n, "reducer shard [%zu, +%zu)", off, n);
    CHECK(ddp_reducer_zero_stage(t->owned) == 2 && !ddp_reducer_shard_grads(t->r[1]) &&
              ddp_reducer_shard_grads(t->owned), "stage getters");
    ddp_comm_stats before, after;
    for (int k = 1; k <= 3; k++) {
        int nb[N_BUF]; /* the plans this sync step follows (a rebuild changes them after it) */
        for (int s = 0; s < N_BUF; s++)
            nb[s] = ddp_reducer_n_buckets(t->r[s]);
        ddp_comm_stats_get(ctx, &before);
        run_cycle(ctx, t, kind, order, k);
        ddp_comm_stats_get(ctx, &after);
        check_shards(ctx, t, kind, k, case_name[kind]);
        /* every bucket of stage 1 is one reduce-scatter, stage 0's are all-reduces; the
         * bucket-owned reducer's buckets go in every micro-step (with local_accum: once) */
        uint64_t rs = after.reduce_scatter_calls - before.reduce_scatter_calls;
        uint64_t ar = after.allreduce_calls - before.allreduce_calls;
        uint64_t owned_rs = (uint64_t)k * (uint64_t)ddp_reducer_n_buckets(t->owned) +
                            (uint64_t)ddp_reducer_n_buckets(t->local);
        CHECK(rs == (uint64_t)nb[1] + owned_rs && ar == (uint64_t)nb[0],
              "%s: %llu reduce-scatters and %llu all-reduces in a sync step", case_name[kind],
              (unsigned long long)rs, (unsigned long long)ar);
        /* the pool grows in the first step only, and holds less than the full gradients */
        size_t bytes = ddp_reducer_buffer_bytes(t->owned) - shard_bytes;
        pool = k == 1 ? bytes : pool;
        CHECK(bytes == pool, "%s, K=%d: the bucket buffers grew from %zu to %zu bytes after the "
              "first step", case_name[kind], k, pool, bytes);
        /* local_accum: with several micro-steps every bucket holds its buffer through them, so
         * the pool is at least the full gradients, and it stops growing after such a step */
        size_t lbytes = ddp_reducer_buffer_bytes(t->local) - shard_bytes;
        local_pool = k <= 2 ? lbytes : local_pool;
        CHECK(lbytes == local_pool &&
                  (k == 1 || lbytes >= TOTAL * (kind == CASE_BF16_GRADS ? 2u : 4u)),
              "%s, K=%d: local_accum bucket buffers of %zu bytes (%zu after the first step)",
              case_name[kind], k, lbytes, local_pool);
        if (ready && kind != CASE_BF16_WIRE) /* a wire twin doubles each buffer */
            CHECK(bytes < TOTAL * (kind == CASE_BF16_GRADS ? 2 : 4), "%s: bucket buffers of %zu "
                  "bytes, more than the gradients", case_name[kind], bytes);
    }
    if (ready)
        CHECK(ddp_reducer_bucket_order(t->r[1]) == DDP_BUCKETS_READY_ORDER,
              "%s: the sharded reducer's buckets were not rebuilt", case_name[kind]);
    for (int s = 0; s < N_BUF; s++) {
        ddp_reducer_destroy(t->r[s]);
        ddp_free(ctx, t->grads[s]);
    }
    ddp_reducer_destroy(t->owned);
    ddp_reducer_destroy(t->local);
    free(t);
}

/* Bad calls of bucket-owned gradients: refused with a status, never a crash or a hang. */
static void test_owned_errors(ddp_ctx *ctx)
{
    ddp_reducer_opts o;
    ddp_reducer *r = (ddp_reducer *)&o; /* not NULL: create must reset it */
    void *grads = ddp_alloc(ctx, TOTAL * sizeof(float)), *ptr = NULL;
    int bad_order[N_PARAMS];
    for (int stage = 0; stage < 2; stage++) {
        small_buckets(&o, CASE_FP32, stage);
        CHECK(ddp_reducer_create(ctx, NULL, numel, N_PARAMS, &o, &r) == DDP_ERR_INVALID_ARG &&
              !r, "grads NULL with zero_stage %d accepted", stage);
    }
    small_buckets(&o, CASE_FP32, 2);
    CHECK(ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r) == DDP_ERR_INVALID_ARG && !r,
          "zero_stage 2 with a gradient buffer accepted");
    o.ready_order = backward;
    CHECK(ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r) == DDP_ERR_INVALID_ARG,
          "ready_order with a gradient buffer accepted");
    memcpy(bad_order, backward, sizeof bad_order);
    bad_order[1] = bad_order[0]; /* not a permutation: every rank fails, none waits */
    o.ready_order = bad_order;
    CHECK(ddp_reducer_create(ctx, NULL, numel, N_PARAMS, &o, &r) == DDP_ERR_INVALID_ARG,
          "a ready_order that is not a permutation accepted");
    if (ddp_world_size(ctx) > 1) { /* rank 1 plans another order: every rank learns it */
        for (int j = 0; j < N_PARAMS; j++)
            bad_order[j] = ddp_rank(ctx) == 1 ? N_PARAMS - 1 - j : backward[j];
        CHECK(ddp_reducer_create(ctx, NULL, numel, N_PARAMS, &o, &r) == DDP_ERR_MISMATCH && !r,
              "ranks planning different buckets accepted");
    }
    ddp_reducer *flat = make_reducer(ctx, grads, CASE_FP32, 1);
    r = make_owned(ctx, CASE_FP32, backward, 0);
    CHECK(ddp_reducer_grad_ptr(r, 0, &ptr) == DDP_ERR_STATE && !ptr, "grad_ptr outside a step");
    CHECK(ddp_reducer_begin(flat, 1) == DDP_OK && ddp_reducer_grad_ptr(flat, 0, &ptr) ==
              DDP_ERR_STATE, "grad_ptr of a reducer with a gradient buffer");
    CHECK(ddp_reducer_begin(r, 0) == DDP_OK, "begin");
    CHECK(ddp_reducer_grad_ptr(r, -1, &ptr) == DDP_ERR_INVALID_ARG &&
              ddp_reducer_grad_ptr(r, N_PARAMS, &ptr) == DDP_ERR_INVALID_ARG &&
              ddp_reducer_grad_ptr(r, 0, NULL) == DDP_ERR_INVALID_ARG &&
              ddp_reducer_grad_ptr(NULL, 0, &ptr) == DDP_ERR_INVALID_ARG, "bad grad_ptr arguments");
    for (int j = 0; j < N_PARAMS - 1; j++) /* the last parameter left unmarked */
        CHECK(ddp_reducer_grad_ptr(r, backward[j], &ptr) == DDP_OK &&
                  ddp_reducer_mark_ready(r, backward[j]) == DDP_OK, "mark %d", backward[j]);
    CHECK(ddp_reducer_grad_ptr(r, backward[0], &ptr) == DDP_ERR_STATE, "grad_ptr after its mark");
    CHECK(ddp_reducer_begin(r, 1) == DDP_ERR_STATE, "a micro-step left a parameter unmarked");
    for (int j = 0; j < N_PARAMS; j++) /* the flat reducer's sync step, for its peers */
        ddp_reducer_mark_ready(flat, j);
    CHECK(ddp_reducer_finish(flat) == DDP_OK, "finish (flat)");
    ddp_reducer_destroy(r);
    ddp_reducer_destroy(flat);
    ddp_free(ctx, grads);
}

/* ---- the all-gather of the parameters, the norm and the scaler on shards ----------------- */

/* Each rank "updates" its shard (element i gets its new value, elsewhere garbage) in fp32 or
 * bf16; mode 0 gathers with gather_params, mode 1 starts the gather and waits parameter by
 * parameter in forward order, checking each parameter as soon as its wait returns. */
static void gather_once(ddp_ctx *ctx, ddp_reducer *r, void *params, int bf16, int mode)
{
    size_t off = 0, n = 0;
    ddp_reducer_shard(r, &off, &n);
    float host[TOTAL];
    uint16_t h[TOTAL];
    for (size_t i = 0; i < TOTAL; i++) {
        host[i] = i >= off && i < off + n ? value(99, i, 7 + mode) : (float)(1000 + ddp_rank(ctx));
        h[i] = half_f32_to_bf16(host[i]);
    }
    ddp_upload(ctx, params, bf16 ? (void *)h : (void *)host, TOTAL * (bf16 ? 2 : 4));
    ddp_dtype dt = bf16 ? DDP_BF16 : DDP_FP32;
    ddp_comm_stats before, after;
    CHECK(ddp_comm_stats_get(ctx, &before) == DDP_OK, "comm stats");
    if (mode == 0)
        CHECK(ddp_reducer_gather_params(r, params, dt) == DDP_OK, "gather_params");
    else
        CHECK(ddp_reducer_gather_start(r, params, dt) == DDP_OK, "gather_start");
    if (mode == 1)
        CHECK(ddp_reducer_gather_start(r, params, dt) == DDP_ERR_STATE, "a second gather_start");
    int bad = 0;
    for (int p = 0; p < N_PARAMS; p++) {
        if (mode == 1)
            CHECK(ddp_reducer_gather_wait(r, p) == DDP_OK, "gather_wait(%d)", p);
        ddp_download(ctx, bf16 ? (void *)h : (void *)host, params, TOTAL * (bf16 ? 2 : 4));
        for (size_t i = offset[p]; i < offset[p + 1]; i++) {
            float want = value(99, i, 7 + mode), got = bf16 ? half_bf16_to_f32(h[i]) : host[i];
            if (bf16)
                want = half_bf16_to_f32(half_f32_to_bf16(want));
            bad += memcmp(&got, &want, sizeof got) != 0;
        }
    }
    CHECK(bad == 0, "gather (%s, mode %d): %d elements differ from their owner's",
          bf16 ? "bf16" : "fp32", mode, bad);
    CHECK(ddp_reducer_gather_wait(r, -1) == DDP_OK, "gather_wait(-1)");
    /* gather_params: one all-gather of the whole buffer; gather_start: one operation (one NCCL
     * group) per bucket, however many runs the bucket has */
    uint64_t want = mode == 0 ? 1 : (uint64_t)ddp_reducer_n_buckets(r);
    CHECK(ddp_comm_stats_get(ctx, &after) == DDP_OK &&
              after.allgather_calls - before.allgather_calls == want,
          "gather (mode %d): %llu all-gather calls, want %llu (%d buckets)", mode,
          (unsigned long long)(after.allgather_calls - before.allgather_calls),
          (unsigned long long)want, ddp_reducer_n_buckets(r));
}

/* The parameters' all-gather on parameter-order buckets, then on buckets rebuilt in ready order
 * (several runs each, across shard boundaries). */
static void test_gather(ddp_ctx *ctx)
{
    void *params = ddp_alloc(ctx, TOTAL * sizeof(float));
    void *grads = ddp_alloc(ctx, TOTAL * sizeof(float));
    ddp_reducer *r = make_reducer(ctx, grads, CASE_FP32, 1);
    if (!r || !params || !grads)
        return;
    for (int step = 0; step < 2; step++) {
        for (int mode = 0; mode < 2; mode++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                gather_once(ctx, r, params, bf16, mode);
        CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin");
        CHECK(ddp_reducer_gather_params(r, params, DDP_FP32) == DDP_ERR_STATE, "gather in a step");
        for (int j = 0; j < N_PARAMS; j++)
            ddp_reducer_mark_ready(r, backward[j]);
        CHECK(ddp_reducer_finish(r) == DDP_OK, "finish");
    }
    CHECK(ddp_reducer_bucket_order(r) == DDP_BUCKETS_READY_ORDER, "not rebuilt");
    /* a gather left under way: begin waits for it */
    CHECK(ddp_reducer_gather_start(r, params, DDP_FP32) == DDP_OK, "gather_start");
    CHECK(ddp_reducer_begin(r, 0) == DDP_OK, "begin after a gather under way");
    ddp_reducer_destroy(r);
    ddp_free(ctx, params);
    ddp_free(ctx, grads);
}

/* The sharded norm of stage 1's shards equals stage 0's replicated norm; the scaler on shards
 * skips on every rank when one rank's shard has an inf, and ignores an inf outside the shard. */
static void test_norm_scaler(ddp_ctx *ctx)
{
    trio *t = calloc(1, sizeof *t);
    for (int s = 0; s < N_BUF; s++) {
        t->grads[s] = ddp_alloc(ctx, TOTAL * sizeof(float));
        t->r[s] = make_reducer(ctx, t->grads[s], CASE_FP32, s);
    }
    run_cycle(ctx, t, CASE_FP32, backward, 1);
    size_t off = 0, n = 0;
    ddp_reducer_shard(t->r[1], &off, &n);
    float *shard = (float *)t->grads[1] + off;
    double full = 0, sharded = 0;
    CHECK(ddp_grad_norm(ctx, t->grads[0], DDP_FP32, TOTAL, DDP_NORM_REPLICATED, NULL, &full) ==
              DDP_OK && ddp_grad_norm(ctx, shard, DDP_FP32, n, DDP_NORM_SHARDED, NULL,
                                      &sharded) == DDP_OK, "norms");
    CHECK_CLOSE(sharded, full, 0.0, 1e-6, "sharded norm");
    ddp_scaler *sc = NULL;
    ddp_scaler_opts so;
    ddp_scaler_opts_default(&so);
    so.init_scale = 4.0;
    CHECK(ddp_scaler_create(ctx, &so, &sc) == DDP_OK, "scaler");
    float inf = INFINITY, before = 0, after = 0;
    int ok = -1, w = ddp_world_size(ctx), me = ddp_rank(ctx);
    if (me == 0 && off + n < TOTAL) /* outside rank 0's shard: not its business */
        ddp_upload(ctx, (float *)t->grads[1] + TOTAL - 1, &inf, sizeof inf);
    if (n > 0)
        ddp_download(ctx, &before, shard, sizeof before);
    CHECK(ddp_scaler_unscale_update(sc, shard, DDP_FP32, n, &ok) == DDP_OK && ok == 1,
          "finite shards: step_ok %d", ok);
    if (n > 0)
        ddp_download(ctx, &after, shard, sizeof after);
    CHECK(after == before / 4.0f, "unscaled: %g, was %g", after, before);
    if (me == w - 1 - (w == 4)) /* the last non-empty shard's owner */
        ddp_upload(ctx, shard + n - 1, &inf, sizeof inf);
    CHECK(ddp_scaler_unscale_update(sc, shard, DDP_FP32, n, &ok) == DDP_OK && ok == 0,
          "an inf in one rank's shard: step_ok %d on rank %d", ok, me);
    ddp_scaler_destroy(sc);
    for (int s = 0; s < N_BUF; s++) {
        ddp_reducer_destroy(t->r[s]);
        ddp_free(ctx, t->grads[s]);
    }
    free(t);
}

/* A traced sync step of a stage 1 reducer and its gather: "reduce_scatter" and "allgather" spans
 * in the file, and counted in the communication time; the gather's wait as "reducer.gather_wait"
 * (ddp_trace_stats.gather_wait_s); a bucket-owned (stage 2) step's waits mid-backward for an
 * older reduce-scatter's buffer as "reducer.recycle_wait". */
static void test_trace(ddp_ctx *ctx)
{
    const char *dir = getenv("DDP_TEST_BUILDDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/test_zero_trace.json", dir ? dir : ".");
    void *grads = ddp_alloc(ctx, TOTAL * sizeof(float));
    ddp_reducer *r = make_reducer(ctx, grads, CASE_FP32, 1);
    CHECK(ddp_trace_start(ctx, 0) == DDP_OK, "trace_start");
    ddp_reducer_begin(r, 1);
    for (int j = 0; j < N_PARAMS; j++)
        ddp_reducer_mark_ready(r, backward[j]);
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish");
    CHECK(ddp_reducer_gather_params(r, grads, DDP_FP32) == DDP_OK, "gather");
    CHECK(ddp_reducer_gather_start(r, grads, DDP_FP32) == DDP_OK, "gather_start");
    CHECK(ddp_reducer_gather_wait(r, -1) == DDP_OK, "gather_wait");
    CHECK(ddp_reducer_gather_wait(r, -1) == DDP_OK, "gather_wait with nothing under way");
    ddp_reducer *owned = make_owned(ctx, CASE_FP32, backward, 0);
    int owned_buckets = owned ? ddp_reducer_n_buckets(owned) : 0;
    if (owned) {
        CHECK(ddp_reducer_begin(owned, 1) == DDP_OK, "begin (bucket-owned)");
        for (int j = 0; j < N_PARAMS; j++)
            put_owned(ctx, owned, CASE_FP32, backward[j], 0);
        CHECK(ddp_reducer_finish(owned) == DDP_OK, "finish (bucket-owned)");
    }
    CHECK(ddp_synchronize(ctx) == DDP_OK, "synchronize"); /* CUDA: the spans' host functions ran */
    ddp_trace_stats ts;
    CHECK(ddp_trace_get_stats(&ts) == DDP_OK && ts.n_syncs == 2 && ts.comm_s > 0.0,
          "trace stats: %ld syncs, %g s of communication", ts.n_syncs, ts.comm_s);
    /* the CPU measures host waits; CUDA reads its events later (at ddp_reducer_destroy) */
    if (ddp_backend(ctx) == DDP_BACKEND_CPU)
        CHECK(ts.n_gather_waits == 1 && ts.gather_wait_s >= 0.0,
              "trace stats: %ld gather wait(s) of %g s, want one (the second had nothing to wait "
              "for)", ts.n_gather_waits, ts.gather_wait_s);
    CHECK(ddp_trace_write(ctx, path) == DDP_OK, "trace_write");
    if (ddp_rank(ctx) == 0) {
        FILE *f = fopen(path, "r");
        static char text[1 << 20];
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = '\0';
        CHECK(strstr(text, "\"reduce_scatter\"") && strstr(text, "\"allgather\""),
              "the trace %s has no reduce_scatter or allgather span", path);
        CHECK(strstr(text, "\"reducer.gather_wait\""), "the trace %s has no reducer.gather_wait "
              "span", path);
        /* more than OWNED_IN_FLIGHT (2) buckets under way: the third waits for the first */
        CHECK(owned_buckets < 3 || strstr(text, "\"reducer.recycle_wait\""), "the trace %s has "
              "no reducer.recycle_wait span (%d bucket-owned buckets)", path, owned_buckets);
        if (f)
            fclose(f);
        remove(path);
    }
    ddp_reducer_destroy(owned);
    ddp_reducer_destroy(r);
    ddp_free(ctx, grads);
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_zero", CHECK_GPU_ONE, &ctx);
    if (rc != 0)
        return rc;
    make_layout();
    CHECK(offset[N_PARAMS] == TOTAL, "layout of %zu elements", offset[N_PARAMS]);
    CHECK(ddp_world_size(ctx) <= 4, "at most 4 ranks");
    test_shard_range();
    test_collectives(ctx);
    for (int kind = CASE_FP32; kind <= CASE_BF16_GRADS; kind++) {
        test_stages(ctx, (case_kind)kind, 1);
        test_stages(ctx, (case_kind)kind, 0);
    }
    test_owned_errors(ctx);
    test_gather(ctx);
    test_norm_scaler(ctx);
    test_trace(ctx);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
