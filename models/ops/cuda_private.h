/* cuda_private.h - what the CUDA ops files share (backend_cuda.cu: the table, memory and fp32
 * kernels; cuda_layers.cu: the precision-aware layer ops on cuBLAS and kernels; cuda_cudnn.cu: the
 * cuDNN convolutions): the backend's state, the call checks and device scratch. Private to
 * models/ops/, CUDA code only.
 */
#ifndef DDP_CUDA_PRIVATE_H
#define DDP_CUDA_PRIVATE_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "ops.h"
}

/* The one backend of the process (ddp_cuda_backend_open). */
typedef struct ddp_cuda_state {
    cudaStream_t stream;  /* every op runs on it */
    cublasHandle_t cublas;
    int device;           /* -1 when closed */
    int cc_major, cc_minor; /* compute capability of the device */
    bool tf32;            /* --tf32: TF32 tensor cores for fp32 GEMMs and convolutions */
} ddp_cuda_state;

extern ddp_cuda_state ddp_cu;

/* Threads per block of the elementwise launchers, and the blocks covering n elements. */
static const int ddp_block = 256;
static inline unsigned ddp_grid(size_t n) { return (unsigned)((n + ddp_block - 1) / ddp_block); }

/* Log a failed call (its text, the library's message, the caller's file and line) and return
 * the status: DDP_ERR_CUDA for the runtime and cuDNN, DDP_ERR_BLAS for cuBLAS. */
ddp_status ddp_cuda_fail(cudaError_t err, const char *what, const char *file, int line);
ddp_status ddp_cublas_fail(cublasStatus_t st, const char *what, const char *file, int line);

#define DDP_CUDA_TRY(call)                                                      \
    do {                                                                        \
        cudaError_t ddp_err_ = (call);                                          \
        if (ddp_err_ != cudaSuccess)                                            \
            return ddp_cuda_fail(ddp_err_, #call, __FILE__, __LINE__);          \
    } while (0)

#define DDP_CUBLAS_TRY(call)                                                    \
    do {                                                                        \
        cublasStatus_t ddp_st_ = (call);                                        \
        if (ddp_st_ != CUBLAS_STATUS_SUCCESS)                                   \
            return ddp_cublas_fail(ddp_st_, #call, __FILE__, __LINE__);         \
    } while (0)

/* For release paths that cannot return a status: logs a failed call and goes on. */
#define DDP_CUDA_LOG(call)                                                      \
    do {                                                                        \
        cudaError_t ddp_err_ = (call);                                          \
        if (ddp_err_ != cudaSuccess)                                            \
            ddp_cuda_fail(ddp_err_, #call, __FILE__, __LINE__);                 \
    } while (0)

#define DDP_CUBLAS_LOG(call)                                                    \
    do {                                                                        \
        cublasStatus_t ddp_st_ = (call);                                        \
        if (ddp_st_ != CUBLAS_STATUS_SUCCESS)                                   \
            ddp_cublas_fail(ddp_st_, #call, __FILE__, __LINE__);                \
    } while (0)

/* Ends every launcher: reports a failed launch. */
#define DDP_CUDA_LAUNCHED() DDP_CUDA_TRY(cudaGetLastError())

/* Device scratch kept for the process, one buffer per slot, grown on demand (the stream is
 * synchronised before a buffer is replaced, so queued work never reads freed memory). *out holds
 * at least n_bytes; DDP_ERR_CUDA when cudaMalloc fails (logged). */
enum { DDP_SCRATCH_XENT, DDP_SCRATCH_GEMM, DDP_SCRATCH_CONV_X, DDP_SCRATCH_CONV_DY,
       DDP_SCRATCH_CUDNN_WS, DDP_SCRATCH_CHANNEL_SUMS, DDP_SCRATCH_SLOTS };
ddp_status ddp_cuda_scratch(int slot, size_t n_bytes, void **out);

/* Whether the device has TF32 and bf16 tensor cores (compute capability 8.0, Ampere, or newer). */
static inline bool ddp_cuda_ampere(void) { return ddp_cu.cc_major >= 8; }

/* The precision-aware layer ops of cuda_layers.cu (all but the convolutions). */
void ddp_cuda_layer_ops(ddp_ops *ops);
/* Adds dy's per-channel sums to db (accumulate false: stores them): dy (n, c, hw) in precision
 * p, db (c) fp32. */
ddp_status ddp_cuda_channel_sums(ddp_dtype p, const void *dy, int n, int c, int hw, float *db,
                                 bool accumulate);
/* y (n, c, hw) = y + b[c], rounded to precision p's storage (y is float for fp32 and fp16). */
ddp_status ddp_cuda_add_channel_bias(ddp_dtype p, void *y, const float *b, int n, int c, int hw);
/* x[0..n) rounded to IEEE half in place (the fp16 emulation). */
ddp_status ddp_cuda_round_fp16(float *x, size_t n);
/* dst (n floats) = src in precision p (bf16 widened, fp32 and fp16 copied). */
ddp_status ddp_cuda_to_fp32(ddp_dtype p, float *dst, const void *src, size_t n);

/* cuDNN (cuda_cudnn.cu, built when cuDNN is found): the handle on the backend's stream, the
 * convolution ops, and their release. */
ddp_status ddp_cudnn_open(void);
void ddp_cudnn_close(void);
void ddp_cudnn_conv_ops(ddp_ops *ops);
/* cuDNN's version number (cudnnGetVersion: 91900 for 9.19.0). */
size_t ddp_cudnn_version(void);

#endif /* DDP_CUDA_PRIVATE_H */
