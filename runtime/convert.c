/* convert.c - element types (ddp_dtype) and their host-memory operations: casts between fp32 and
 * bf16/fp16, scaling, inf/NaN checks; dispatch to the CUDA versions for device memory.
 */
#include <string.h>

#include "config.h"
#include "convert.h"
#include "half.h"
#include "internal.h"
#include "simd_clones.h"

size_t ddp_dtype_size(ddp_dtype t)
{
    switch (t) {
    case DDP_FP32: return 4;
    case DDP_BF16:
    case DDP_FP16: return 2;
    case DDP_FP64:
    case DDP_INT64: return 8;
    }
    return 0;
}

const char *ddp_dtype_name(ddp_dtype t)
{
    static const char *const names[] = {"fp32", "bf16", "fp16", "fp64", "int64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

ddp_status ddp_dtype_parse(const char *name, ddp_dtype *out)
{
    for (int t = DDP_FP32; name && t <= DDP_FP16; t++) {
        if (strcmp(name, ddp_dtype_name((ddp_dtype)t)) == 0) {
            *out = (ddp_dtype)t;
            return DDP_OK;
        }
    }
    return DDP_ERR_INVALID_ARG;
}

int convert_dtype_is_grad(ddp_dtype t)
{
    return t == DDP_FP32 || t == DDP_BF16 || t == DDP_FP16;
}

/* The host loops below are one straight loop per pair of types, so the compiler vectorises
 * them: a per-element switch on the type kept them scalar (0.5 ms per step for the MLP's 535k
 * gradients with --grad-dtype bf16, more than the halved all-reduce saved); each is compiled for
 * AVX-512, AVX2 and the baseline and runs the variant of the CPU's level (simd_clones.h). */

SIMD_BODY void f32_to_16_body(uint16_t *dst, const float *src, size_t n, int fp16)
{
    if (fp16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_f32_to_f16(src[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_f32_to_bf16(src[i]);
    }
}
SIMD_DISPATCH(convert_f32_to_16, f32_to_16_body, (uint16_t *dst, const float *src, size_t n, int fp16),
                  (dst, src, n, fp16))

SIMD_BODY void f16_to_f32_body(float *dst, const uint16_t *src, size_t n, int fp16)
{
    if (fp16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_f16_to_f32(src[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_bf16_to_f32(src[i]);
    }
}
SIMD_DISPATCH(convert_16_to_f32, f16_to_f32_body, (float *dst, const uint16_t *src, size_t n, int fp16),
                  (dst, src, n, fp16))

void convert_host_cast(void *dst, ddp_dtype dst_t, const void *src, ddp_dtype src_t, size_t n)
{
    if (dst_t == src_t) {
        memmove(dst, src, n * ddp_dtype_size(dst_t));
    } else if (src_t == DDP_FP32) {
        convert_f32_to_16(dst, src, n, dst_t == DDP_FP16);
    } else if (dst_t == DDP_FP32) {
        convert_16_to_f32(dst, src, n, src_t == DDP_FP16);
    } else { /* bf16 <-> fp16: through fp32 */
        const uint16_t *in = src;
        uint16_t *out = dst;
        for (size_t i = 0; i < n; i++)
            out[i] = half_encode(half_decode(in[i], src_t == DDP_FP16), dst_t == DDP_FP16);
    }
}

SIMD_BODY void scale_body(void *x, ddp_dtype t, size_t n, float alpha)
{
    if (t == DDP_FP32) {
        float *f = x;
        for (size_t i = 0; i < n; i++)
            f[i] *= alpha;
        return;
    }
    uint16_t *h = x;
    if (t == DDP_FP16) {
        for (size_t i = 0; i < n; i++)
            h[i] = half_f32_to_f16(half_f16_to_f32(h[i]) * alpha);
    } else {
        for (size_t i = 0; i < n; i++)
            h[i] = half_f32_to_bf16(half_bf16_to_f32(h[i]) * alpha);
    }
}
SIMD_DISPATCH(host_scale_loop, scale_body, (void *x, ddp_dtype t, size_t n, float alpha), (x, t, n, alpha))

/* *nonfinite = whether x holds an inf or a NaN. */
SIMD_BODY void nonfinite_body(const void *x, ddp_dtype t, size_t n, int *nonfinite)
{
    /* inf/NaN: exponent bits all ones (fp32 0x7f800000, bf16 0x7f80, fp16 0x7c00) */
    uint32_t found = 0;
    if (t == DDP_FP32) {
        const float *f = x;
        for (size_t i = 0; i < n; i++)
            found |= (uint32_t)!half_f32_finite(f[i]);
    } else {
        const uint16_t *h = x;
        uint16_t mask = t == DDP_FP16 ? 0x7c00u : 0x7f80u;
        for (size_t i = 0; i < n; i++)
            found |= (uint32_t)((h[i] & mask) == mask);
    }
    *nonfinite = found != 0;
}
SIMD_DISPATCH(host_nonfinite_loop, nonfinite_body, (const void *x, ddp_dtype t, size_t n, int *nonfinite),
                  (x, t, n, nonfinite))

/* dst (fp32) = widen(src) * alpha in one pass: the values of the cast followed by the scaling. */
SIMD_BODY void f16_to_f32_scaled_body(float *dst, const uint16_t *src, size_t n, int fp16, float alpha)
{
    if (fp16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_f16_to_f32(src[i]) * alpha;
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_bf16_to_f32(src[i]) * alpha;
    }
}
SIMD_DISPATCH(convert_16_to_f32_scaled, f16_to_f32_scaled_body,
                  (float *dst, const uint16_t *src, size_t n, int fp16, float alpha), (dst, src, n, fp16, alpha))

void convert_host_cast_scale(void *dst, ddp_dtype dst_t, const void *src, ddp_dtype src_t, size_t n,
                             float alpha)
{
    if (dst_t == DDP_FP32 && src_t != DDP_FP32) {
        convert_16_to_f32_scaled(dst, src, n, src_t == DDP_FP16, alpha);
        return;
    }
    convert_host_cast(dst, dst_t, src, src_t, n);
    convert_host_scale(dst, dst_t, n, alpha);
}

/* The cloned loops are static: GCC gives the resolver of an extern clone default visibility,
 * which would export it from libddp. */
void convert_host_scale(void *x, ddp_dtype t, size_t n, float alpha)
{
    host_scale_loop(x, t, n, alpha);
}

int convert_host_nonfinite(const void *x, ddp_dtype t, size_t n)
{
    int nonfinite;
    host_nonfinite_loop(x, t, n, &nonfinite);
    return nonfinite;
}

/* The reducer's accumulation of reduce-scattered pieces into its shard (a pass over the shard
 * per micro-step): fp32 into fp32 is one vectorisable loop, the other pairs go through fp32. */
void convert_host_cast_add(void *dst, ddp_dtype dst_t, const void *src, ddp_dtype src_t, size_t n)
{
    if (dst_t == DDP_FP32 && src_t == DDP_FP32) {
        float *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] += s[i];
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float a = dst_t == DDP_FP32 ? ((float *)dst)[i]
                                    : half_decode(((uint16_t *)dst)[i], dst_t == DDP_FP16);
        float b = src_t == DDP_FP32 ? ((const float *)src)[i]
                                    : half_decode(((const uint16_t *)src)[i], src_t == DDP_FP16);
        if (dst_t == DDP_FP32)
            ((float *)dst)[i] = a + b;
        else
            ((uint16_t *)dst)[i] = half_encode(a + b, dst_t == DDP_FP16);
    }
}

#if !HAVE_CUDA
static ddp_status no_cuda(void)
{
    DDP_ERROR("this libddp was built without CUDA: use the cpu backend");
    return DDP_ERR_UNSUPPORTED;
}
ddp_status convert_cuda_cast(void *dst, int dst_t, const void *src, int src_t, size_t n, void *stream)
{
    (void)dst, (void)dst_t, (void)src, (void)src_t, (void)n, (void)stream;
    return no_cuda();
}
ddp_status convert_cuda_scale_typed(void *x, int t, size_t n, float alpha, void *stream)
{
    (void)x, (void)t, (void)n, (void)alpha, (void)stream;
    return no_cuda();
}
ddp_status convert_cuda_nonfinite(const void *x, int t, size_t n, int *found, void *stream)
{
    (void)x, (void)t, (void)n, (void)found, (void)stream;
    return no_cuda();
}
ddp_status convert_cuda_cast_add(void *dst, int dst_t, const void *src, int src_t, size_t n,
                                 void *stream)
{
    (void)dst, (void)dst_t, (void)src, (void)src_t, (void)n, (void)stream;
    return no_cuda();
}
ddp_status convert_cuda_zero(void *x, size_t n_bytes, void *stream)
{
    (void)x, (void)n_bytes, (void)stream;
    return no_cuda();
}
#endif

ddp_status convert_dev_cast(const ddp_ctx *ctx, void *dst, ddp_dtype dst_t, const void *src,
                            ddp_dtype src_t, size_t n, void *stream)
{
    if (ctx->backend == DDP_BACKEND_CUDA)
        return convert_cuda_cast(dst, (int)dst_t, src, (int)src_t, n, stream);
    convert_host_cast(dst, dst_t, src, src_t, n);
    return DDP_OK;
}

ddp_status convert_dev_cast_scale(const ddp_ctx *ctx, void *dst, ddp_dtype dst_t, const void *src,
                                  ddp_dtype src_t, size_t n, float alpha, void *stream)
{
    if (ctx->backend == DDP_BACKEND_CUDA) {
        ddp_status st = convert_cuda_cast(dst, (int)dst_t, src, (int)src_t, n, stream);
        return st == DDP_OK ? convert_cuda_scale_typed(dst, (int)dst_t, n, alpha, stream) : st;
    }
    convert_host_cast_scale(dst, dst_t, src, src_t, n, alpha);
    return DDP_OK;
}

ddp_status convert_dev_scale(const ddp_ctx *ctx, void *x, ddp_dtype t, size_t n, float alpha,
                             void *stream)
{
    if (ctx->backend == DDP_BACKEND_CUDA)
        return convert_cuda_scale_typed(x, (int)t, n, alpha, stream);
    convert_host_scale(x, t, n, alpha);
    return DDP_OK;
}

ddp_status convert_dev_cast_add(const ddp_ctx *ctx, void *dst, ddp_dtype dst_t, const void *src,
                                ddp_dtype src_t, size_t n, void *stream)
{
    if (ctx->backend == DDP_BACKEND_CUDA)
        return convert_cuda_cast_add(dst, (int)dst_t, src, (int)src_t, n, stream);
    convert_host_cast_add(dst, dst_t, src, src_t, n);
    return DDP_OK;
}

ddp_status convert_dev_zero(const ddp_ctx *ctx, void *x, ddp_dtype t, size_t n, void *stream)
{
    if (ctx->backend == DDP_BACKEND_CUDA)
        return convert_cuda_zero(x, n * ddp_dtype_size(t), stream);
    memset(x, 0, n * ddp_dtype_size(t));
    return DDP_OK;
}

ddp_status convert_dev_nonfinite(const ddp_ctx *ctx, const void *x, ddp_dtype t, size_t n,
                                 int *found, void *stream)
{
    if (ctx->backend == DDP_BACKEND_CUDA)
        return convert_cuda_nonfinite(x, (int)t, n, found, stream);
    *found = convert_host_nonfinite(x, t, n);
    return DDP_OK;
}
