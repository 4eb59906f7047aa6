/* test_allreduce_typed.c - ddp_allreduce_typed under real mpirun (2 and 3 ranks).
 *
 * Rank r fills x[i] = r + i (i < 64): every type's SUM is W i + W (W - 1) / 2 exactly (integers
 * below 256 are exact in bf16, below 2048 in fp16), MAX is i + W - 1, MIN is i, AVG is the sum /
 * W (in fp32/fp64 to 1e-6; in 16 bits rounded once more: 2^-8 relative for bf16). Rounding of
 * 16-bit sums, as documented (pairwise fp32 additions rounded to nearest even), at 2 ranks:
 * bf16 1 + 2^-8 (rank 0: 1, rank 1: 2^-8) is a tie and rounds to the even 1; 1 + 3 * 2^-8 rounds
 * to the even 1 + 2^-6; fp16 1 + 2^-11 rounds to 1. Refused pairs (MAX of bf16, AVG of int64)
 * and a NULL buffer give DDP_ERR_INVALID_ARG on every rank, so nothing is joined. The stream
 * argument is ignored on the CPU (any pointer). `--backend cuda` (1 rank, skipped without a GPU):
 * the same on device memory, ordered on libddp's stream given as the caller's.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "half.h"

#define N 64 /* W i + W (W - 1) / 2 < 256 at 3 ranks: exact in bf16 */

static double load(const void *x, ddp_dtype t, int i)
{
    switch (t) {
    case DDP_FP32: return ((const float *)x)[i];
    case DDP_FP64: return ((const double *)x)[i];
    case DDP_INT64: return (double)((const int64_t *)x)[i];
    default: return half_decode(((const uint16_t *)x)[i], t == DDP_FP16);
    }
}

static void store(void *x, ddp_dtype t, int i, double v)
{
    switch (t) {
    case DDP_FP32: ((float *)x)[i] = (float)v; break;
    case DDP_FP64: ((double *)x)[i] = v; break;
    case DDP_INT64: ((int64_t *)x)[i] = (int64_t)v; break;
    default: ((uint16_t *)x)[i] = half_encode((float)v, t == DDP_FP16); break;
    }
}

/* Runs one all-reduce of N elements r + i on the backend; returns its status, result in out. */
static ddp_status reduce(ddp_ctx *ctx, ddp_dtype t, ddp_reduce_op op, void *stream, void *out)
{
    char host[N * 8];
    size_t bytes = N * ddp_dtype_size(t);
    for (int i = 0; i < N; i++)
        store(host, t, i, ddp_rank(ctx) + i);
    void *dev = ddp_alloc(ctx, bytes);
    ddp_upload(ctx, dev, host, bytes);
    ddp_status st = ddp_allreduce_typed(ctx, dev, N, t, op, stream);
    ddp_download(ctx, out, dev, bytes);
    ddp_free(ctx, dev);
    return st;
}

static double expected(int w, int i, ddp_reduce_op op)
{
    double sum = (double)w * i + w * (w - 1) / 2.0;
    return op == DDP_SUM ? sum : op == DDP_AVG ? sum / w : op == DDP_MAX ? i + w - 1 : i;
}

static void test_closed_form(ddp_ctx *ctx, void *stream)
{
    static const ddp_dtype types[] = {DDP_FP32, DDP_BF16, DDP_FP16, DDP_FP64, DDP_INT64};
    static const ddp_reduce_op ops[] = {DDP_SUM, DDP_AVG, DDP_MAX, DDP_MIN};
    int w = ddp_world_size(ctx);
    for (int k = 0; k < 5; k++) {
        for (int o = 0; o < 4; o++) {
            ddp_dtype t = types[k];
            int sixteen = t == DDP_BF16 || t == DDP_FP16;
            if ((sixteen && (ops[o] == DDP_MAX || ops[o] == DDP_MIN)) ||
                (t == DDP_INT64 && ops[o] == DDP_AVG))
                continue; /* refused: test_refused */
            char out[N * 8];
            ddp_status st = reduce(ctx, t, ops[o], stream, out);
            CHECK(st == DDP_OK, "%s op %d: %s", ddp_dtype_name(t), (int)ops[o], ddp_strerror(st));
            double rtol = ops[o] == DDP_AVG && t == DDP_BF16 ? 1.0 / 256
                          : ops[o] == DDP_AVG && t == DDP_FP16 ? 1.0 / 2048 : 1e-6;
            for (int i = 0, shown = 0; i < N && shown < 3; i++) {
                double got = load(out, t, i), want = expected(w, i, ops[o]);
                if (!(fabs(got - want) <= rtol * want)) {
                    CHECK(0, "%s op %d: x[%d] = %.9g, want %.9g", ddp_dtype_name(t), (int)ops[o],
                          i, got, want);
                    shown++;
                }
            }
        }
    }
}

/* 16-bit sums round to nearest even (2 ranks). */
static void test_rounding(ddp_ctx *ctx)
{
    if (ddp_world_size(ctx) != 2)
        return;
    struct { ddp_dtype t; double mine[2]; double want; } cases[] = {
        {DDP_BF16, {1.0, 0x1p-8}, 1.0},
        {DDP_BF16, {1.0, 0x3p-8}, 1.0 + 0x1p-6},
        {DDP_FP16, {1.0, 0x1p-11}, 1.0},
        {DDP_FP16, {1.0, 0x3p-11}, 1.0 + 0x1p-9},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        uint16_t host[4] = {0}; /* room for any type: store() switches on it */
        store(host, cases[c].t, 0, cases[c].mine[ddp_rank(ctx)]);
        void *dev = ddp_alloc(ctx, 2);
        ddp_upload(ctx, dev, host, 2);
        CHECK(ddp_allreduce_typed(ctx, dev, 1, cases[c].t, DDP_SUM, NULL) == DDP_OK, "case %zu", c);
        ddp_download(ctx, host, dev, 2);
        ddp_free(ctx, dev);
        CHECK(load(host, cases[c].t, 0) == cases[c].want, "%s case %zu: %.9g, want %.9g",
              ddp_dtype_name(cases[c].t), c, load(host, cases[c].t, 0), cases[c].want);
    }
}

static void test_refused(ddp_ctx *ctx)
{
    char out[N * 8];
    CHECK(reduce(ctx, DDP_BF16, DDP_MAX, NULL, out) == DDP_ERR_INVALID_ARG, "MAX of bf16");
    CHECK(reduce(ctx, DDP_INT64, DDP_AVG, NULL, out) == DDP_ERR_INVALID_ARG, "AVG of int64");
    CHECK(ddp_allreduce_typed(ctx, NULL, 3, DDP_FP32, DDP_SUM, NULL) == DDP_ERR_INVALID_ARG,
          "NULL buffer");
    CHECK(ddp_allreduce_typed(ctx, out, 3, (ddp_dtype)9, DDP_SUM, NULL) == DDP_ERR_INVALID_ARG,
          "unknown type");
    CHECK(ddp_allreduce_typed(NULL, out, 3, DDP_FP32, DDP_SUM, NULL) == DDP_ERR_STATE,
          "no context");
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_allreduce_typed", CHECK_GPU_ONE, &ctx);
    if (rc != 0)
        return rc;
    int ignored = 0; /* the CPU ignores the stream: any pointer */
    void *stream = ddp_backend(ctx) == DDP_BACKEND_CUDA ? ddp_backend_stream(ctx) : &ignored;
    test_closed_form(ctx, NULL);
    test_closed_form(ctx, stream);
    test_rounding(ctx);
    test_refused(ctx);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
