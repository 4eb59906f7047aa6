/* cpu_dnnl.h - the oneDNN primitives behind the CPU ops table (cpu_dnnl.c): convolution forward,
 * backward-data and backward-weights, 2x2 max-pooling and matmul, each created once per shape and
 * precision and reused. Private to models/ops/.
 *
 * Tensors are plain (images NHWC, weights OIHW, matrices row-major), fp32 or bf16 as the precision
 * says (fp16 is emulated by the caller on fp32 primitives). Not thread-safe: one thread per
 * ops handle.
 * Every function returns DDP_ERR_UNSUPPORTED (logged with oneDNN's status) when oneDNN has no
 * implementation for the shape and precision, DDP_ERR_BLAS when executing fails.
 */
#ifndef OPS_CPU_DNNL_H
#define OPS_CPU_DNNL_H

#include <stdbool.h>

#include "ops.h"

/* One ops handle's oneDNN engine, stream and cache of primitives. */
typedef struct dnnl_state dnnl_state;

/* An empty state (the engine is made on first use). DDP_ERR_NOMEM on failure. */
ddp_status ops_dnnl_create(dnnl_state **out);
/* Releases the primitives, the stream and the engine. NULL is ignored. */
void ops_dnnl_destroy(dnnl_state *d);

/* y = conv(x, w) + b: x, w, y in p; b fp32. */
ddp_status ops_dnnl_conv_fwd(dnnl_state *d, ddp_dtype p, const ops_conv_shape *s, int batch,
                             const void *x, const void *w, const float *b, void *y);
/* dx = the input gradient from dy and w (overwrites dx). */
ddp_status ops_dnnl_conv_bwd_data(dnnl_state *d, ddp_dtype p, const ops_conv_shape *s, int batch,
                                  const void *w, const void *dy, void *dx);
/* dw, db (fp32) = the weight and bias gradients (overwritten). */
ddp_status ops_dnnl_conv_bwd_weights(dnnl_state *d, ddp_dtype p, const ops_conv_shape *s, int batch,
                                     const void *x, const void *dy, float *dw, float *db);
/* 2x2 max-pool, stride 2, over (n, c, h, w) NHWC images; ws receives oneDNN's workspace
 * (DDP_ERR_INVALID_ARG when it needs more than ws_bytes). */
ddp_status ops_dnnl_pool_fwd(dnnl_state *d, ddp_dtype p, const void *x, int n, int c, int h, int w,
                             void *y, void *ws, size_t ws_bytes);
ddp_status ops_dnnl_pool_bwd(dnnl_state *d, ddp_dtype p, const void *dy, const void *ws, int n,
                             int c, int h, int w, void *dx);
/* dst = src, (n, c, h, w) images NHWC -> NCHW (to_nchw) or back. */
ddp_status ops_dnnl_image_reorder(dnnl_state *d, ddp_dtype p, const void *src, void *dst, int n,
                                  int c, int h, int w, bool to_nchw);
/* One line naming the implementations made so far for precision p (ops_dnnl_describe). */
const char *ops_dnnl_impls(dnnl_state *d, ddp_dtype p);
/* Whether oneDNN runs AVX-512 kernels on this CPU (its effective ISA). */
int ops_dnnl_has_avx512(void);

/* c (m, n) = op(a) (m, k) op(b) (k, n) [+ bias (n), fp32] [+ c when accumulate]; a and b in p,
 * c fp32 when c_fp32, else in p. op transposes when trans_*. */
ddp_status ops_dnnl_matmul(dnnl_state *d, ddp_dtype p, int m, int n, int k, const void *a,
                           bool trans_a, const void *b, bool trans_b, const float *bias, void *c,
                           bool c_fp32, bool accumulate);

#endif /* OPS_CPU_DNNL_H */
