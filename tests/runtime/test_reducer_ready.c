/* test_reducer_ready.c - the reducer's buckets rebuilt in ready order, under real mpirun (2 and 3
 * ranks; 1 works too).
 *
 * Layout: llm.c's tensor-major one with L = 3 layers: wte, wpe, then each per-layer tensor for
 * all layers (ln1w[0..L), qkvw[0..L), attprojw[0..L), fcw[0..L)), then lnfw; every layer's slice
 * of a tensor is a parameter. Backward marks lnfw, then layer L-1's fcw, attprojw, qkvw, ln1w,
 * then layer L-2's, ..., then wpe and wte: not reverse buffer order, so parameter-order buckets
 * wait for the whole backward pass.
 * Values: rank r adds grad[i] = r + (i mod 31) + m on micro-step m, so the mean over W ranks and
 * K micro-steps is (i mod 31) + (W - 1) / 2 + (K - 1) / 2: in fp32 the sums are exact and the
 * last scaling by 1 / (W K) rounds once (1e-6 relative); through 16 bits (a bf16 wire, or bf16
 * gradients) sums above 256 round to 8 bits a few times (2^-6 relative). The period 31 puts
 * different values wherever a run landed at another offset (runs are multiples of 8 elements).
 * Checked: the first sync step keeps parameter-order buckets and then rebuilds (the plan lists
 * every parameter once, in backward order; each bucket's element count is its parameters'), the
 * averages equal the plain all-reduce average before and after the rebuild (fp32 gradients; fp32
 * gradients on a bf16 wire, whose cast gathers the runs; bf16 gradients, all-reduced per run in
 * place); after the rebuild each bucket starts its all-reduce as soon as its last parameter is
 * marked (the communicator's call counter after every mark), so when the last layer's backward is
 * done more buckets are under way than parameter order manages; reverse
 * parameter order and static_buckets keep ddp_plan_buckets' plan; a rank marking in another order
 * is detected on every rank (DDP_BUCKETS_MISMATCH, or DDP_ERR_MISMATCH from finish with
 * strict_order) with the sums still right and nothing hanging.
 * `--backend cuda` (1 rank; skipped without a GPU): the same on device memory, a bucket's runs in
 * one NCCL group, the bf16 wire's gather and scatter by the cast kernels.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "internal.h" /* ddp_plan_buckets */
#include "half.h"

#define L 3
#define N_TENSORS 4 /* per layer: ln1w, qkvw, attprojw, fcw */
#define N_PARAMS (2 + N_TENSORS * L + 1)
#define MIB (1024.0 * 1024.0)

static const size_t layer_numel[N_TENSORS] = {8, 24, 16, 32}; /* per layer slice */
static size_t numel[N_PARAMS];
static size_t offset[N_PARAMS + 1];
static int backward[N_PARAMS]; /* the marking order */

typedef enum case_kind { CASE_FP32, CASE_BF16_WIRE, CASE_BF16_GRADS } case_kind;

static int param_of(int tensor, int layer)
{
    return 2 + tensor * L + layer;
}

static void make_layout(void)
{
    numel[0] = 40; /* wte */
    numel[1] = 12; /* wpe */
    for (int t = 0; t < N_TENSORS; t++)
        for (int l = 0; l < L; l++)
            numel[param_of(t, l)] = layer_numel[t];
    numel[N_PARAMS - 1] = 8; /* lnfw */
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

static ddp_reducer *make_reducer(ddp_ctx *ctx, void *grads, case_kind kind, int static_buckets,
                                 int strict)
{
    ddp_reducer_opts o;
    ddp_reducer_opts_default(&o);
    o.first_bucket_mb = 64.0 / MIB; /* 16 floats */
    o.bucket_mb = 256.0 / MIB;      /* 64 floats: about one layer per bucket */
    o.grad_dtype = kind == CASE_BF16_GRADS ? DDP_BF16 : DDP_FP32;
    o.comm_dtype = kind == CASE_BF16_WIRE ? DDP_BF16 : DDP_FP32;
    o.static_buckets = static_buckets;
    o.strict_order = strict;
    ddp_reducer *r = NULL;
    ddp_status st = ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r);
    CHECK(st == DDP_OK && r, "reducer_create: %s", ddp_strerror(st));
    return r;
}

/* Adds this rank's micro-step values to parameter p: host accumulator, then the backend buffer
 * in the gradients' type. */
static void add_grad(ddp_ctx *ctx, void *grads, float *acc, case_kind kind, int p, int micro)
{
    uint16_t h[64];
    for (size_t i = offset[p]; i < offset[p + 1]; i++)
        acc[i] += (float)(ddp_rank(ctx) + (int)(i % 31) + micro);
    if (kind != CASE_BF16_GRADS) {
        ddp_upload(ctx, (float *)grads + offset[p], acc + offset[p], numel[p] * sizeof(float));
        return;
    }
    for (size_t i = 0; i < numel[p]; i++)
        h[i] = half_f32_to_bf16(acc[offset[p] + i]);
    ddp_upload(ctx, (uint16_t *)grads + offset[p], h, numel[p] * sizeof *h);
}

static void check_mean(ddp_ctx *ctx, const void *grads, case_kind kind, int k, const char *what)
{
    size_t n = offset[N_PARAMS];
    float host[512];
    uint16_t h[512];
    if (kind == CASE_BF16_GRADS) {
        ddp_download(ctx, h, grads, n * sizeof *h);
        for (size_t i = 0; i < n; i++)
            host[i] = half_bf16_to_f32(h[i]);
    } else {
        ddp_download(ctx, host, grads, n * sizeof *host);
    }
    double rtol = kind == CASE_FP32 ? 1e-6 : 1.0 / 64; /* see the top of the file */
    int shown = 0;
    for (size_t i = 0; i < n && shown < 5; i++) {
        double want = (double)(i % 31) + (ddp_world_size(ctx) - 1) / 2.0 + (k - 1) / 2.0;
        if (!(fabs(host[i] - want) <= 1e-6 + rtol * want)) {
            CHECK(0, "%s: grad[%zu] = %.9g, want %.9g (K=%d)", what, i, host[i], want, k);
            shown++;
        }
    }
}

static uint64_t allreduce_calls(ddp_ctx *ctx)
{
    ddp_comm_stats s;
    ddp_comm_stats_get(ctx, &s);
    return s.allreduce_calls;
}

/* One cycle of k micro-steps (the last syncs) marking `order`; launched[j] = all-reduces started
 * in the sync step once its first j parameters were marked. Returns finish()'s status. */
static ddp_status run_cycle(ddp_ctx *ctx, ddp_reducer *r, void *grads, float *acc, case_kind kind,
                            const int *order, int k, uint64_t *launched)
{
    memset(acc, 0, offset[N_PARAMS] * sizeof *acc);
    ddp_zero(ctx, grads, offset[N_PARAMS] * (kind == CASE_BF16_GRADS ? 2 : 4));
    for (int m = 0; m < k; m++) {
        int sync = m == k - 1;
        CHECK(ddp_reducer_begin(r, sync) == DDP_OK, "begin(%d)", sync);
        uint64_t before = allreduce_calls(ctx);
        for (int j = 0; j < N_PARAMS; j++) {
            add_grad(ctx, grads, acc, kind, order[j], m);
            CHECK(ddp_reducer_mark_ready(r, order[j]) == DDP_OK, "mark %d", order[j]);
            launched[j + 1] = allreduce_calls(ctx) - before;
        }
    }
    return ddp_reducer_finish(r);
}

/* The rebuilt plan: every parameter once, bucket by bucket in backward order, counts right. */
static void check_plan(const ddp_reducer *r)
{
    int nb = ddp_reducer_n_buckets(r), k = 0;
    const ddp_bucket *b = ddp_reducer_buckets(r);
    for (int i = 0; i < nb; i++) {
        const int *params = NULL;
        int n = ddp_reducer_bucket_params(r, i, &params);
        size_t elems = 0;
        CHECK(n > 0 && params, "bucket %d has no parameters", i);
        for (int j = 0; j < n && k < N_PARAMS; j++, k++) {
            CHECK(params[j] == backward[k], "bucket %d, parameter %d: %d, want %d", i, j,
                  params[j], backward[k]);
            elems += numel[params[j]];
        }
        CHECK(b[i].n == elems, "bucket %d: n %zu, its parameters hold %zu", i, b[i].n, elems);
    }
    CHECK(k == N_PARAMS, "the buckets list %d parameters, want %d", k, N_PARAMS);
    CHECK(ddp_reducer_bucket_params(r, nb, NULL) == 0, "bucket past the end has parameters");
}

/* After j marks in ready order, buckets 0..b are complete while their parameters are among the
 * first j: want[j] of them (the CPU starts a complete bucket at once). */
static void check_launches(const ddp_reducer *r, const uint64_t *launched, const char *what)
{
    uint64_t want[N_PARAMS + 1] = {0};
    int end = 0;
    for (int b = 0; b < ddp_reducer_n_buckets(r); b++) {
        end += ddp_reducer_bucket_params(r, b, NULL);
        for (int j = end; j <= N_PARAMS; j++)
            want[j]++;
    }
    for (int j = 0; j <= N_PARAMS; j++)
        CHECK(launched[j] == want[j], "%s: %llu all-reduces started after %d marks, want %llu",
              what, (unsigned long long)launched[j], j, (unsigned long long)want[j]);
}

static void test_ready(ddp_ctx *ctx, void *grads, float *acc, case_kind kind, const char *what)
{
    ddp_reducer *r = make_reducer(ctx, grads, kind, 0, 0);
    if (!r)
        return;
    uint64_t first[N_PARAMS + 1] = {0}, launched[N_PARAMS + 1] = {0};
    CHECK(run_cycle(ctx, r, grads, acc, kind, backward, 1, first) == DDP_OK, "%s: finish", what);
    check_mean(ctx, grads, kind, 1, what);
    CHECK(ddp_reducer_bucket_order(r) == DDP_BUCKETS_READY_ORDER, "%s: not rebuilt", what);
    check_plan(r);
    CHECK(ddp_reducer_n_buckets(r) >= 4, "%s: only %d buckets in ready order", what,
          ddp_reducer_n_buckets(r));
    for (int k = 1; k <= 3; k += 2) {
        CHECK(run_cycle(ctx, r, grads, acc, kind, backward, k, launched) == DDP_OK, "%s: finish",
              what);
        check_mean(ctx, grads, kind, k, what);
        check_launches(r, launched, what);
    }
    int last_layer = 1 + N_TENSORS; /* lnfw and layer L-1's tensors marked */
    CHECK(launched[last_layer] >= 2 && first[last_layer] < launched[last_layer],
          "%s: after the last layer's backward %llu buckets under way in ready order, %llu in "
          "parameter order", what, (unsigned long long)launched[last_layer],
          (unsigned long long)first[last_layer]);
    ddp_reducer_destroy(r);
}

/* Reverse parameter order (a sequential model) and static_buckets: ddp_plan_buckets' plan. */
static void test_kept(ddp_ctx *ctx, void *grads, float *acc, int reverse)
{
    int order[N_PARAMS];
    for (int j = 0; j < N_PARAMS; j++)
        order[j] = reverse ? N_PARAMS - 1 - j : backward[j];
    ddp_reducer *r = make_reducer(ctx, grads, CASE_FP32, !reverse, 0);
    if (!r)
        return;
    ddp_bucket want[N_PARAMS];
    int nb = 0;
    ddp_plan_buckets(numel, N_PARAMS, 256, 64, want, &nb);
    uint64_t launched[N_PARAMS + 1];
    for (int cycle = 0; cycle < 2; cycle++) {
        CHECK(run_cycle(ctx, r, grads, acc, CASE_FP32, order, 2, launched) == DDP_OK, "finish");
        check_mean(ctx, grads, CASE_FP32, 2, reverse ? "reverse order" : "static_buckets");
    }
    CHECK(ddp_reducer_bucket_order(r) == DDP_BUCKETS_PARAM_ORDER, "rebuilt (reverse %d)", reverse);
    CHECK(ddp_reducer_n_buckets(r) == nb &&
              !memcmp(ddp_reducer_buckets(r), want, (size_t)nb * sizeof *want),
          "the plan is not ddp_plan_buckets' (reverse %d)", reverse);
    ddp_reducer_destroy(r);
}

/* Rank 1 swaps two parameters in the first sync step: every rank sees it, the sums stay right. */
static void test_mismatch(ddp_ctx *ctx, void *grads, float *acc, int strict)
{
    int order[N_PARAMS];
    memcpy(order, backward, sizeof order);
    if (ddp_rank(ctx) == 1) {
        order[3] = backward[4];
        order[4] = backward[3];
    }
    ddp_reducer *r = make_reducer(ctx, grads, CASE_FP32, 0, strict);
    if (!r)
        return;
    uint64_t launched[N_PARAMS + 1];
    ddp_status want = strict && ddp_world_size(ctx) > 1 ? DDP_ERR_MISMATCH : DDP_OK;
    ddp_status st = run_cycle(ctx, r, grads, acc, CASE_FP32, order, 1, launched);
    CHECK(st == want, "strict %d: finish gave %s, want %s", strict, ddp_strerror(st),
          ddp_strerror(want));
    check_mean(ctx, grads, CASE_FP32, 1, "orders differ");
    ddp_bucket_order bo = ddp_reducer_bucket_order(r);
    CHECK(bo == (ddp_world_size(ctx) > 1 ? DDP_BUCKETS_MISMATCH : DDP_BUCKETS_READY_ORDER),
          "strict %d: bucket order %d", strict, (int)bo);
    CHECK(run_cycle(ctx, r, grads, acc, CASE_FP32, order, 2, launched) == DDP_OK, "next step");
    check_mean(ctx, grads, CASE_FP32, 2, "orders differ, next step");
    ddp_reducer_destroy(r);
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_reducer_ready", CHECK_GPU_ONE, &ctx);
    if (rc != 0)
        return rc;
    make_layout();
    void *grads = ddp_alloc(ctx, offset[N_PARAMS] * sizeof(float));
    float *acc = calloc(offset[N_PARAMS], sizeof *acc);
    CHECK(grads && acc && offset[N_PARAMS] <= 512, "setup");
    if (grads && acc) {
        test_ready(ctx, grads, acc, CASE_FP32, "fp32");
        test_ready(ctx, grads, acc, CASE_BF16_WIRE, "fp32 on a bf16 wire");
        test_ready(ctx, grads, acc, CASE_BF16_GRADS, "bf16 gradients");
        test_kept(ctx, grads, acc, 1);
        test_kept(ctx, grads, acc, 0);
        test_mismatch(ctx, grads, acc, 0);
        test_mismatch(ctx, grads, acc, 1);
    }
    free(acc);
    ddp_free(ctx, grads);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
