/* norm.c - the global gradient norm: sums of squares of gradients in backend memory, in fp64 and
 * in an order fixed by the element count alone (so equal gradients give equal norms everywhere),
 * and their combination across the ranks of a sharded optimizer.
 */
#include <math.h>
#include <stdlib.h>

#include "config.h"
#include "convert.h"
#include "half.h"
#include "internal.h"
#include "simd_clones.h"

/* Lanes of the host sum: element i goes to lane i mod NORM_LANES. Every square of an fp32 (or
 * narrower) value is exact in fp64, so no variant of the loop (fused or not) rounds differently;
 * the lanes are independent sums the compiler keeps in vector registers. */
#define NORM_LANES 8

/* acc[j] += x[i]^2 over the elements i of lane j, x of type fp32 (t 0), bf16 (1) or fp16 (2). */
SIMD_BODY void sumsq_body(const void *x, int t, size_t n, double *acc)
{
    const float *f = x;
    const uint16_t *h = x;
    size_t i = 0;
    for (; i + NORM_LANES <= n; i += NORM_LANES) {
        for (int j = 0; j < NORM_LANES; j++) {
            double v = t == 0 ? (double)f[i + j]
                       : t == 1 ? (double)half_bf16_to_f32(h[i + j])
                                : (double)half_f16_to_f32(h[i + j]);
            acc[j] += v * v;
        }
    }
    for (int j = 0; i + (size_t)j < n; j++) {
        double v = t == 0 ? (double)f[i + j] : (double)half_decode(h[i + j], t == 2);
        acc[j] += v * v;
    }
}
/* One body per type (the type a constant in each), so each variant's loop vectorises. */
SIMD_BODY void sumsq_f32_body(const void *x, size_t n, double *acc) { sumsq_body(x, 0, n, acc); }
SIMD_BODY void sumsq_bf16_body(const void *x, size_t n, double *acc) { sumsq_body(x, 1, n, acc); }
SIMD_BODY void sumsq_f16_body(const void *x, size_t n, double *acc) { sumsq_body(x, 2, n, acc); }
SIMD_DISPATCH(sumsq_f32, sumsq_f32_body, (const void *x, size_t n, double *acc), (x, n, acc))
SIMD_DISPATCH(sumsq_bf16, sumsq_bf16_body, (const void *x, size_t n, double *acc), (x, n, acc))
SIMD_DISPATCH(sumsq_f16, sumsq_f16_body, (const void *x, size_t n, double *acc), (x, n, acc))

/* The host sum of squares: the lanes, then added pairwise in a fixed tree. */
static double norm_host_sumsq(const void *x, ddp_dtype t, size_t n)
{
    double acc[NORM_LANES] = {0};
    if (t == DDP_FP32)
        sumsq_f32(x, n, acc);
    else if (t == DDP_BF16)
        sumsq_bf16(x, n, acc);
    else
        sumsq_f16(x, n, acc);
    for (int w = NORM_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++)
            acc[j] += acc[j + w];
    return acc[0];
}

#if !HAVE_CUDA
ddp_status norm_cuda_sumsq(const void *x, int t, size_t n, double *out, void *stream)
{
    (void)x, (void)t, (void)n, (void)out, (void)stream;
    DDP_ERROR("this libddp was built without CUDA: use the cpu backend");
    return DDP_ERR_UNSUPPORTED;
}

ddp_status norm_cuda_clip_scale(const void *x, int t, size_t n, double max_norm, double *norm_out,
                                float *scale_out, void *stream)
{
    (void)x, (void)t, (void)n, (void)max_norm, (void)norm_out, (void)scale_out, (void)stream;
    DDP_ERROR("this libddp was built without CUDA: use the cpu backend");
    return DDP_ERR_UNSUPPORTED;
}
#endif

static ddp_status norm_check(const void *grads, ddp_dtype dtype, size_t n, const void *out,
                             const char *who)
{
    if (!out || (!grads && n > 0) || !convert_dtype_is_grad(dtype)) {
        DDP_ERROR("%s: need an output and gradients of type fp32, bf16 or fp16 (got %s, %zu "
                  "elements)", who, ddp_dtype_name(dtype), n);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

ddp_status ddp_grad_sumsq(ddp_ctx *ctx, const void *grads, ddp_dtype dtype, size_t n,
                          void *stream, double *sumsq)
{
    ddp_status st = norm_check(grads, dtype, n, sumsq, "ddp_grad_sumsq");
    if (st != DDP_OK)
        return st;
    if (ctx && ctx->backend == DDP_BACKEND_CUDA)
        return norm_cuda_sumsq(grads, (int)dtype, n, sumsq, stream);
    *sumsq = n > 0 ? norm_host_sumsq(grads, dtype, n) : 0.0;
    return DDP_OK;
}

/* Every rank's sum of squares (one double each, gathered on the host), added in rank order. */
static ddp_status norm_sum_shards(ddp_ctx *ctx, double mine, double *total)
{
    double small[64], *all = small;
    int world = ctx->world_size;
    if (world > 64 && !(all = malloc((size_t)world * sizeof *all))) {
        DDP_ERROR("ddp_grad_norm: out of memory for %d partial sums", world);
        return DDP_ERR_NOMEM; /* joins no collective: the peers wait for the deadline */
    }
    ddp_status st = host_allgather(ctx, &mine, all, sizeof mine);
    double sum = 0.0;
    for (int q = 0; st == DDP_OK && q < world; q++)
        sum += all[q];
    if (st == DDP_OK)
        *total = sum;
    if (all != small)
        free(all);
    return st;
}

ddp_status ddp_grad_norm(ddp_ctx *ctx, const void *grads, ddp_dtype dtype, size_t n,
                         ddp_norm_scope scope, void *stream, double *norm)
{
    ddp_status st = norm_check(grads, dtype, n, norm, "ddp_grad_norm");
    if (st == DDP_OK && scope != DDP_NORM_REPLICATED && scope != DDP_NORM_SHARDED) {
        DDP_ERROR("ddp_grad_norm: unknown scope %d (DDP_NORM_REPLICATED or DDP_NORM_SHARDED)",
                  (int)scope);
        st = DDP_ERR_INVALID_ARG;
    }
    if (st == DDP_OK && scope == DDP_NORM_SHARDED && !ctx) {
        DDP_ERROR("ddp_grad_norm: the sharded scope needs a context (it gathers every rank's sum)");
        st = DDP_ERR_INVALID_ARG;
    }
    double sumsq = 0.0;
    if (st == DDP_OK)
        st = ddp_grad_sumsq(ctx, grads, dtype, n, stream, &sumsq);
    if (st == DDP_OK && scope == DDP_NORM_SHARDED)
        st = norm_sum_shards(ctx, sumsq, &sumsq);
    if (st == DDP_OK)
        *norm = sqrt(sumsq);
    return st;
}

ddp_status ddp_grad_clip_scale(ddp_ctx *ctx, const void *grads, ddp_dtype dtype, size_t n,
                               double max_norm, void *stream, double *norm_out, float *scale_out)
{
    ddp_status st = norm_check(grads, dtype, n, norm_out, "ddp_grad_clip_scale");
    if (st == DDP_OK && !scale_out) {
        DDP_ERROR("ddp_grad_clip_scale: scale_out is NULL");
        st = DDP_ERR_INVALID_ARG;
    }
    if (st != DDP_OK)
        return st;
    if (ctx && ctx->backend == DDP_BACKEND_CUDA)
        return norm_cuda_clip_scale(grads, (int)dtype, n, max_norm, norm_out, scale_out, stream);
    double sumsq = n > 0 ? norm_host_sumsq(grads, dtype, n) : 0.0;
    norm_clip_scale(sumsq, max_norm, norm_out, scale_out);
    return DDP_OK;
}
