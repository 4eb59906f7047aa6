/* backend.h - the compute backend interface (ops table) shared by libddp and the reference models.
 *
 * Not part of the stable public API (ddp.h is): an in-tree header for models/ and tests/.
 * One ops table per backend: backend_cpu.c (OpenBLAS, always built) and backend_cuda.cu (cuBLAS
 * and CUDA kernels, built when CUDA is found). Scalar math both share is in math_shared.h.
 *
 * Tensors are float, row-major, batch first (NCHW for images). Every pointer is backend memory.
 * Ops run in order on the backend's stream; sync() waits for them (a no-op on the CPU).
 * An op a backend does not implement yet is NULL; ddp_backend_require() reports it.
 */
#ifndef DDP_BACKEND_H
#define DDP_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "ddp.h"

typedef struct ddp_ops {
    const char *name; /* "cpu" or "cuda" */

    /* memory */
    void *(*alloc)(size_t n_bytes); /* zeroed; NULL on failure */
    void (*free)(void *p);          /* NULL is ignored */
    /* upload: src_host may be reused on return; the copy may still be in flight (ordered before
     * later ops); download: returns when dst_host holds the data. */
    ddp_status (*upload)(void *dst, const void *src_host, size_t n_bytes);
    ddp_status (*download)(void *dst_host, const void *src, size_t n_bytes);
    ddp_status (*copy)(void *dst, const void *src, size_t n_bytes);
    ddp_status (*zero)(void *dst, size_t n_bytes);
    ddp_status (*sync)(void);

    /* C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C, row-major, dense (lda etc. implied by
     * the shapes: A is (m,k) or, transposed, (k,m)). */
    ddp_status (*gemm)(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                       const float *b, float beta, float *c);

    /* elementwise and reductions */
    ddp_status (*bias_add)(float *y, const float *bias, int rows, int cols);   /* y[r,c] += bias[c] */
    ddp_status (*bias_grad)(float *dbias, const float *dy, int rows, int cols); /* dbias[c] += sum_r dy[r,c] */
    ddp_status (*relu_fwd)(float *y, const float *x, size_t n);
    ddp_status (*relu_bwd)(float *dx, const float *dy, const float *y, size_t n); /* dx = dy * (y > 0) */
    ddp_status (*scale)(float *x, size_t n, float alpha);                         /* x *= alpha */
    ddp_status (*axpy)(float *y, const float *x, size_t n, float alpha);          /* y += alpha x */
    /* SGD with momentum and weight decay (PyTorch's formulation):
     * g' = g + wd * w; m = momentum * m + g'; w -= lr * m  (m = g' on the first step is implied
     * by m starting at zero). */
    ddp_status (*sgd_step)(float *w, float *m, const float *g, size_t n, float lr, float momentum,
                           float weight_decay);

    /* convolution helpers, one image (C,H,W), square kernel k, stride 1, zero padding pad:
     * col is (C*k*k, H_out*W_out). col2im adds into im (im must be zeroed by the caller first). */
    ddp_status (*im2col)(const float *im, int c, int h, int w, int k, int pad, float *col);
    ddp_status (*col2im)(const float *col, int c, int h, int w, int k, int pad, float *im);
    /* 2x2 max-pool, stride 2, over (n*c) planes of h x w (h, w even); argmax keeps the winning
     * input index per output for the backward pass. maxpool_bwd adds into dx (zeroed first). */
    ddp_status (*maxpool_fwd)(const float *x, int planes, int h, int w, float *y, int *argmax);
    ddp_status (*maxpool_bwd)(const float *dy, const int *argmax, int planes, int h, int w, float *dx);
    /* Softmax cross-entropy over (rows, classes) logits with integer labels: writes the mean loss
     * to *loss_host, the count of argmax == label to *correct_host, and dlogits = (softmax - onehot)
     * / rows. dlogits may be NULL (evaluation). labels is backend memory. */
    ddp_status (*softmax_xent)(const float *logits, const int *labels, int rows, int classes,
                               float *dlogits, float *loss_host, int *correct_host);
    /* The same for training, without a host round trip: ADDS the mean loss to *loss_acc (backend
     * memory, one float) and writes dlogits. A label outside [0, classes) is DDP_ERR_INVALID_ARG
     * on the CPU; on the GPU, where nothing waits for the device, it makes *loss_acc NaN. */
    ddp_status (*softmax_xent_acc)(const float *logits, const int *labels, int rows, int classes,
                                   float *dlogits, float *loss_acc);
} ddp_ops;

/* The ops table of a context's backend. */
const ddp_ops *ddp_backend_ops(const ddp_ctx *ctx);
/* The CPU ops table (always built). */
const ddp_ops *ddp_cpu_ops(void);
/* The CUDA ops table, or NULL in a build without CUDA. Does not touch the GPU. */
const ddp_ops *ddp_cuda_ops(void);
/* Number of CUDA devices usable here (0 without a GPU, driver or CUDA build). Never fails. */
int ddp_cuda_device_count(void);
/* Makes `device` current for this thread and creates the backend's stream and cuBLAS handle.
 * DDP_ERR_NO_DEVICE / DDP_ERR_CUDA on failure; DDP_ERR_UNSUPPORTED without a CUDA build. */
ddp_status ddp_cuda_backend_open(int device);
void ddp_cuda_backend_close(void);
/* The backend's CUDA stream (cudaStream_t) for NCCL to order against; NULL without CUDA. */
void *ddp_cuda_stream(void);

/* DDP_OK when every op a model needs is implemented by ops; otherwise DDP_ERR_UNSUPPORTED and a
 * log line naming the first missing op and the backend. */
ddp_status ddp_backend_require(const ddp_ops *ops, const char *who);

/* Sets the CPU BLAS thread count (OpenBLAS); 1 if threads < 1. */
void ddp_cpu_set_threads(int threads);

#endif /* DDP_BACKEND_H */
