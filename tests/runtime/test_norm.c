/* test_norm.c - ddp_grad_sumsq and ddp_grad_norm under real mpirun (1-3 ranks).
 *
 * Closed forms: x[i] = (i mod 7) - 3 (exact in fp32, bf16 and fp16) gives a sum of squares of
 * 28 per full period of 7 (9 + 4 + 1 + 0 + 1 + 4 + 9) plus the tail's, exact in fp64, for
 * lengths around the 8 lanes (0, 1, 7, 8, 9, 17) and a large odd one. Values with full 24-bit
 * mantissas are checked against a long double reference: each square is exact in fp64 and each
 * of the ~n/8 additions of a lane rounds by at most 2^-53 relative, a random walk of about
 * sqrt(n / 8) * 2^-53 = 4e-14 for n = 1e6, so 1e-12 relative. Replicated norms are bit-equal on
 * every rank (the min and max over ranks agree); sharded norms (uneven shards, one empty at 3
 * ranks) give the same bits on every rank and the full vector's norm within the same 1e-12
 * (another order of additions). Misuse is refused; a NULL context means host memory (not for the
 * sharded scope). ddp_grad_clip_scale gives the replicated norm bit for bit and the host's clip
 * factor.
 * `--backend cuda`: the same on device memory, and the GPU's sums (another fixed tree) against
 * the CPU's within 1e-12; exits 77 where this host has fewer GPUs than ranks.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "half.h"

#define BIG_N 1000003

static uint16_t to_16(float v, ddp_dtype t)
{
    return t == DDP_BF16 ? half_f32_to_bf16(v) : half_f32_to_f16(v);
}

/* Uploads n values v[i] as type t into a fresh backend buffer. */
static void *upload_as(ddp_ctx *ctx, const float *v, size_t n, ddp_dtype t)
{
    size_t size = ddp_dtype_size(t);
    void *dev = ddp_alloc(ctx, n * size + 1), *host = malloc(n * size + 1);
    CHECK(dev && host, "out of memory for %zu elements", n);
    if (!dev || !host) {
        free(host);
        return dev;
    }
    for (size_t i = 0; i < n; i++) {
        if (t == DDP_FP32)
            ((float *)host)[i] = v[i];
        else
            ((uint16_t *)host)[i] = to_16(v[i], t);
    }
    ddp_upload(ctx, dev, host, n * size);
    free(host);
    return dev;
}

static double periodic_sumsq(size_t n)
{
    double s = 28.0 * (double)(n / 7);
    for (size_t i = 0; i < n % 7; i++)
        s += (double)(((int)i - 3) * ((int)i - 3));
    return s;
}

static void test_closed_form(ddp_ctx *ctx, float *v)
{
    static const size_t lens[] = {0, 1, 7, 8, 9, 17, BIG_N};
    static const ddp_dtype types[] = {DDP_FP32, DDP_BF16, DDP_FP16};
    for (size_t i = 0; i < BIG_N; i++)
        v[i] = (float)((int)(i % 7) - 3);
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        for (int t = 0; t < 3; t++) {
            void *x = upload_as(ctx, v, lens[k], types[t]);
            double s = -1.0, norm = -1.0;
            CHECK(ddp_grad_sumsq(ctx, x, types[t], lens[k], NULL, &s) == DDP_OK, "sumsq");
            CHECK(s == periodic_sumsq(lens[k]), "%s, n %zu: sum of squares %.17g, want %.17g",
                  ddp_dtype_name(types[t]), lens[k], s, periodic_sumsq(lens[k]));
            CHECK(ddp_grad_norm(ctx, x, types[t], lens[k], DDP_NORM_REPLICATED, NULL, &norm) ==
                      DDP_OK && norm == sqrt(periodic_sumsq(lens[k])),
                  "%s, n %zu: norm %.17g", ddp_dtype_name(types[t]), lens[k], norm);
            ddp_free(ctx, x);
        }
    }
}

/* The same bits on every rank: the smallest and the largest over ranks are equal. */
static void check_agreed(ddp_ctx *ctx, double x, const char *what)
{
    double lo = x, hi = x;
    CHECK(ddp_allreduce_host(ctx, &lo, 1, DDP_FP64, DDP_MIN) == DDP_OK &&
              ddp_allreduce_host(ctx, &hi, 1, DDP_FP64, DDP_MAX) == DDP_OK,
          "%s: host all-reduce", what);
    CHECK(lo == hi && lo == x, "%s: ranks disagree: %.17g .. %.17g", what, lo, hi);
}

/* Full-mantissa values: against long double, replicated and sharded. */
static void test_full(ddp_ctx *ctx, float *v)
{
    long double ref = 0.0L;
    uint32_t state = 12345u;
    for (size_t i = 0; i < BIG_N; i++) {
        state = state * 1664525u + 1013904223u;
        v[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * 0.01f;
        ref += (long double)v[i] * (long double)v[i];
    }
    void *x = upload_as(ctx, v, BIG_N, DDP_FP32);
    double norm = 0.0;
    CHECK(ddp_grad_norm(ctx, x, DDP_FP32, BIG_N, DDP_NORM_REPLICATED, NULL, &norm) == DDP_OK,
          "replicated norm");
    CHECK_CLOSE(norm, sqrtl(ref), 0.0, 1e-12, "replicated norm against long double");
    check_agreed(ctx, norm, "replicated norm");
    /* rank r's shard: an uneven slice; the last rank of 3 gets none */
    int w = ddp_world_size(ctx), r = ddp_rank(ctx);
    size_t cut[4] = {0, BIG_N / 3, BIG_N, BIG_N};
    if (w == 1)
        cut[1] = BIG_N;
    else if (w == 2)
        cut[1] = BIG_N / 5;
    size_t lo = cut[r], n = r == w - 1 ? BIG_N - lo : cut[r + 1] - lo;
    double sharded = 0.0;
    CHECK(ddp_grad_norm(ctx, (float *)x + lo, DDP_FP32, n, DDP_NORM_SHARDED, NULL, &sharded) ==
              DDP_OK, "sharded norm");
    CHECK_CLOSE(sharded, norm, 0.0, 1e-12, "sharded norm against the whole vector's");
    check_agreed(ctx, sharded, "sharded norm");
    ddp_free(ctx, x);
}

static void test_misuse(ddp_ctx *ctx)
{
    float one = 1.0f;
    double out = 7.0;
    CHECK(ddp_grad_sumsq(ctx, &one, DDP_FP64, 1, NULL, &out) == DDP_ERR_INVALID_ARG, "fp64");
    CHECK(ddp_grad_sumsq(ctx, NULL, DDP_FP32, 1, NULL, &out) == DDP_ERR_INVALID_ARG, "NULL grads");
    CHECK(ddp_grad_norm(NULL, &one, DDP_FP32, 1, DDP_NORM_SHARDED, NULL, &out) ==
              DDP_ERR_INVALID_ARG, "sharded without a context");
    CHECK(ddp_grad_sumsq(ctx, &one, DDP_FP32, 1, NULL, NULL) == DDP_ERR_INVALID_ARG, "NULL out");
    CHECK(ddp_grad_norm(ctx, &one, DDP_FP32, 1, (ddp_norm_scope)7, NULL, &out) ==
              DDP_ERR_INVALID_ARG, "unknown scope");
    CHECK(out == 7.0, "output written on failure");
    CHECK(ddp_grad_norm(NULL, &one, DDP_FP32, 1, DDP_NORM_REPLICATED, NULL, &out) == DDP_OK &&
              out == 1.0, "no context: host memory");
}

/* ddp_grad_clip_scale: the replicated norm bit for bit, and the clip factor as the host computes
 * it (max_norm / (norm + 1e-6) in double, rounded once, where below 1; else 1), for a max_norm
 * below the norm, above it, 0 and negative; a NaN gradient gives a NaN norm and the factor 1;
 * misuse refused. The outputs live in backend memory (on CUDA written by a kernel). */
static void test_clip_scale(ddp_ctx *ctx, const float *v)
{
    struct out {
        double norm;
        float scale;
    } got, *dev = ddp_alloc(ctx, sizeof got);
    void *x = upload_as(ctx, v, BIG_N, DDP_FP32);
    CHECK(dev && x, "out of memory");
    if (!dev || !x)
        return;
    double norm = 0.0;
    CHECK(ddp_grad_norm(ctx, x, DDP_FP32, BIG_N, DDP_NORM_REPLICATED, NULL, &norm) == DDP_OK,
          "replicated norm");
    double maxes[4] = {norm / 2, norm * 2, 0.0, -1.0};
    for (int k = 0; k < 4; k++) {
        CHECK(ddp_grad_clip_scale(ctx, x, DDP_FP32, BIG_N, maxes[k], NULL, &dev->norm,
                                  &dev->scale) == DDP_OK, "clip scale %d", k);
        CHECK(ddp_download(ctx, &got, dev, sizeof got) == DDP_OK, "download");
        double f = maxes[k] / (norm + 1e-6);
        float want = maxes[k] > 0.0 && f < 1.0 ? (float)f : 1.0f;
        CHECK(memcmp(&got.norm, &norm, sizeof norm) == 0, "max_norm %g: norm %.17g, want %.17g",
              maxes[k], got.norm, norm);
        CHECK(memcmp(&got.scale, &want, sizeof want) == 0, "max_norm %g: factor %.9g, want %.9g",
              maxes[k], got.scale, want);
    }
    float nan_v[3] = {1.0f, NAN, 2.0f};
    void *xn = upload_as(ctx, nan_v, 3, DDP_FP32);
    CHECK(xn && ddp_grad_clip_scale(ctx, xn, DDP_FP32, 3, 1.0, NULL, &dev->norm, &dev->scale) ==
                    DDP_OK && ddp_download(ctx, &got, dev, sizeof got) == DDP_OK,
          "clip scale of a NaN gradient");
    CHECK(isnan(got.norm) && got.scale == 1.0f, "NaN gradient: norm %g, factor %g", got.norm,
          got.scale);
    CHECK(ddp_grad_clip_scale(ctx, x, DDP_FP32, BIG_N, 1.0, NULL, &dev->norm, NULL) ==
              DDP_ERR_INVALID_ARG, "NULL scale_out");
    CHECK(ddp_grad_clip_scale(ctx, x, DDP_FP64, BIG_N, 1.0, NULL, &dev->norm, &dev->scale) ==
              DDP_ERR_INVALID_ARG, "fp64");
    ddp_free(ctx, xn);
    ddp_free(ctx, x);
    ddp_free(ctx, dev);
}

/* The GPU's sums against the CPU's for the same values (another tree: 1e-14 relative). */
static void test_cuda_vs_cpu(ddp_ctx *ctx, const float *v)
{
    for (int t = DDP_FP32; t <= DDP_FP16; t++) {
        void *x = upload_as(ctx, v, BIG_N, (ddp_dtype)t);
        float *host = malloc(BIG_N * sizeof *host);
        double gpu = 0.0, cpu = 0.0;
        CHECK(ddp_grad_sumsq(ctx, x, (ddp_dtype)t, BIG_N, ddp_backend_stream(ctx), &gpu) == DDP_OK,
              "GPU sum of squares");
        for (size_t i = 0; host && i < BIG_N; i++)
            host[i] = t == DDP_FP32 ? v[i] : half_decode(to_16(v[i], (ddp_dtype)t), t == DDP_FP16);
        CHECK(host && ddp_grad_sumsq(NULL, host, DDP_FP32, BIG_N, NULL, &cpu) == DDP_OK,
              "CPU sum of squares (host memory, no context)");
        CHECK_CLOSE(gpu, cpu, 0.0, 1e-12, "GPU sum of squares against the CPU's");
        free(host);
        ddp_free(ctx, x);
    }
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_norm", CHECK_GPU_PER_RANK, &ctx);
    if (rc != 0)
        return rc;
    float *v = malloc(BIG_N * sizeof *v);
    CHECK(v, "out of memory");
    if (v) {
        test_closed_form(ctx, v);
        test_full(ctx, v);
        test_misuse(ctx);
        test_clip_scale(ctx, v);
        if (ddp_backend(ctx) == DDP_BACKEND_CUDA)
            test_cuda_vs_cpu(ctx, v);
    }
    free(v);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
