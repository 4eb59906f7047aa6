/* convert.h - the element-type operations the reducer and the loss scaler need on backend memory:
 * cast between fp32 and bf16/fp16, scale in place, add a cast buffer into another, zero, find
 * inf/NaN. Host versions (convert.c) and CUDA versions (convert_cuda.cu) run the same scalar code
 * (half.h).
 *
 * Private to libddp. Types are ddp_dtype values limited to DDP_FP32, DDP_BF16 and DDP_FP16.
 * `stream` is a cudaStream_t (NULL: the backend's stream); ignored for host memory.
 */
#ifndef DDP_CONVERT_H
#define DDP_CONVERT_H

#include <math.h>
#include <stddef.h>

#include "ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Non-zero for DDP_FP32, DDP_BF16 and DDP_FP16. */
int convert_dtype_is_grad(ddp_dtype t);

/* dst[i] = src[i] converted (rounded to nearest even when narrowing); dst_t == src_t copies. */
void convert_host_cast(void *dst, ddp_dtype dst_t, const void *src, ddp_dtype src_t, size_t n);
/* x[i] *= alpha, computed in fp32 and rounded back to the element type. */
void convert_host_scale(void *x, ddp_dtype t, size_t n, float alpha);
/* convert_host_cast, then convert_host_scale on dst: the same values, in one pass where dst is fp32. */
void convert_host_cast_scale(void *dst, ddp_dtype dst_t, const void *src, ddp_dtype src_t, size_t n,
                             float alpha);
/* 1 when any of x[0..n) is inf or NaN, else 0. */
int convert_host_nonfinite(const void *x, ddp_dtype t, size_t n);
/* dst[i] += src[i] converted, the sum computed in fp32 and rounded to dst_t (nearest even). */
void convert_host_cast_add(void *dst, ddp_dtype dst_t, const void *src, ddp_dtype src_t, size_t n);

/* The same on the context's backend memory (host memory on the CPU backend). DDP_ERR_CUDA when a
 * launch fails (logged), DDP_ERR_UNSUPPORTED for CUDA in a build without it. */
ddp_status convert_dev_cast(const ddp_ctx *ctx, void *dst, ddp_dtype dst_t, const void *src,
                            ddp_dtype src_t, size_t n, void *stream);
ddp_status convert_dev_cast_scale(const ddp_ctx *ctx, void *dst, ddp_dtype dst_t, const void *src,
                                  ddp_dtype src_t, size_t n, float alpha, void *stream);
ddp_status convert_dev_scale(const ddp_ctx *ctx, void *x, ddp_dtype t, size_t n, float alpha,
                             void *stream);
ddp_status convert_dev_cast_add(const ddp_ctx *ctx, void *dst, ddp_dtype dst_t, const void *src,
                                ddp_dtype src_t, size_t n, void *stream);
/* x[0..n) = 0 (n elements of t), queued on `stream` like the others (ddp_zero uses libddp's). */
ddp_status convert_dev_zero(const ddp_ctx *ctx, void *x, ddp_dtype t, size_t n, void *stream);
/* *found = 1 when any element is inf or NaN. On CUDA it waits for the check on `stream`. */
ddp_status convert_dev_nonfinite(const ddp_ctx *ctx, const void *x, ddp_dtype t, size_t n,
                                 int *found, void *stream);

/* CUDA launchers (convert_cuda.cu); `stream` NULL means cuda_stream(). */
ddp_status convert_cuda_cast(void *dst, int dst_t, const void *src, int src_t, size_t n, void *stream);
ddp_status convert_cuda_scale_typed(void *x, int t, size_t n, float alpha, void *stream);
ddp_status convert_cuda_nonfinite(const void *x, int t, size_t n, int *found, void *stream);
ddp_status convert_cuda_cast_add(void *dst, int dst_t, const void *src, int src_t, size_t n,
                                 void *stream);
ddp_status convert_cuda_zero(void *x, size_t n_bytes, void *stream);
/* norm.c's sum of squares on CUDA (norm_cuda.cu): *out = sum of x[i]^2 in fp64, in a fixed tree
 * that depends only on n; the host waits for it under the deadline. DDP_ERR_CUDA, DDP_ERR_NOMEM,
 * or the wait's DDP_ERR_TIMEOUT / DDP_ERR_NCCL on failure (logged), *out untouched. */
ddp_status norm_cuda_sumsq(const void *x, int t, size_t n, double *out, void *stream);

#ifdef __CUDACC__
#define NORM_HD __host__ __device__
#else
#define NORM_HD
#endif

/* ddp_grad_clip_scale's arithmetic from the sum of squares, the CPU's and the CUDA kernel's: the
 * norm, and the factor clipping to max_norm puts on the gradients (1 unless max_norm > 0 and
 * max_norm / (norm + 1e-6) < 1), in double, rounded to float once. */
static inline NORM_HD void norm_clip_scale(double sumsq, double max_norm, double *norm,
                                           float *scale)
{
    double r = sqrt(sumsq), f = max_norm / (r + 1e-6);
    *norm = r;
    *scale = max_norm > 0.0 && f < 1.0 ? (float)f : 1.0f;
}

/* ddp_grad_clip_scale on CUDA: the same sum, then norm_out and scale_out (device memory) written
 * by a kernel on the stream (norm_clip_scale); the host does not wait. */
ddp_status norm_cuda_clip_scale(const void *x, int t, size_t n, double max_norm, double *norm_out,
                                float *scale_out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DDP_CONVERT_H */
