/* cuda_private.h - what the CUDA ops files share (ops_cuda.cu: the table, the handle and fp32
 * kernels; cuda_layers.cu: the precision-aware layer ops on cuBLAS and kernels; cuda_cudnn.cu: the
 * cuDNN convolutions; cuda_gpt.cu: the transformer ops): the handle's state, the call checks and
 * device scratch. Private to models/ops/, CUDA code only.
 */
#ifndef OPS_CUDA_PRIVATE_H
#define OPS_CUDA_PRIVATE_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "ops.h"
}
#include "device_limits.h"
#include "switches.h"

/* Device scratch slots of a handle (cuda_scratch). */
enum { CUDA_SCRATCH_XENT, CUDA_SCRATCH_GEMM, CUDA_SCRATCH_CONV_X, CUDA_SCRATCH_CONV_DY,
       CUDA_SCRATCH_CUDNN_WS, CUDA_SCRATCH_CHANNEL_SUMS,
       CUDA_SCRATCH_ATTENTION, CUDA_SCRATCH_LAYERNORM, CUDA_SCRATCH_ENCODER, /* cuda_gpt.cu */
       CUDA_SCRATCH_COLSUM, CUDA_SCRATCH_BIAS16,
       CUDA_SCRATCH_SLOTS };

/* The state of a CUDA handle (ops_cuda_open). */
typedef struct cuda_state {
    cudaStream_t stream;    /* libddp's (ddp_backend_stream): every op runs on it */
    cublasHandle_t cublas;
    void *cudnn;            /* cuda_cudnn.cu's state: the cuDNN handle and its plans */
    void *lt;               /* cuda_layers.cu's cuBLASLt state: the handle, workspace, plans */
    int cc_major, cc_minor; /* compute capability of the device */
    bool tf32;              /* --tf32: TF32 tensor cores for fp32 GEMMs and convolutions */
    bool flash;             /* bf16 attention on the fused kernel (ops_cuda_set_attention) */
    bool cudnn_attention;   /* ... on cuDNN's instead, with bf16 activations (DDP_CUDA_ATTENTION) */
    bool cudnn_det;         /* cuDNN's attention backward deterministic (DDP_CUDNN_DETERMINISTIC) */
    dev_limits lim;         /* the device's shared-memory limits (device_limits.h) */
    /* The changes since run 4 that live in this backend's kernels, on unless their switch is 0
     * (switches.h), read at ops_cuda_open: bf16 outputs on cuBLASLt's bias epilogue, LayerNorm's
     * fused backward, the embedding's segmented backward, the attention's bf16 outputs. */
    bool lt_bias16, ln_bwd_fused, enc_seg, flash_bf16_out;
    void *scratch[CUDA_SCRATCH_SLOTS]; /* device scratch (ddp_alloc), grown on demand */
    size_t scratch_bytes[CUDA_SCRATCH_SLOTS];
    char text[256];         /* what ops_cuda_describe returns */
} cuda_state;

static inline cuda_state *cuda_of(const ops_handle *ops) { return (cuda_state *)ops->state; }

/* Device dev's shared-memory limits (compute capability major.minor), the compute capability's
 * defaults where the driver does not give one (device_limits.h). */
static inline dev_limits cuda_read_limits(int dev, int major, int minor)
{
    int optin = 0, per_sm = 0, reserved = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        optin = 0;
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
        cudaSuccess)
        per_sm = 0;
    bool got_reserved = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock,
                                               dev) == cudaSuccess;
    (void)cudaGetLastError(); /* an attribute the driver lacks leaves no error behind */
    return dev_limits_make(major, minor, optin > 0 ? (size_t)optin : 0,
                           per_sm > 0 ? (size_t)per_sm : 0, got_reserved ? (size_t)reserved : 0,
                           got_reserved);
}

/* Threads per block of the elementwise launchers, and the blocks covering n elements. */
static const int block_threads = 256;
static inline unsigned grid_blocks(size_t n) { return (unsigned)((n + block_threads - 1) / block_threads); }

/* Device scratch of the handle, one buffer per slot, grown on demand (the old buffer is freed with
 * ddp_free, after the queued work that may read it). *out holds at least n_bytes; DDP_ERR_CUDA
 * when ddp_alloc fails (logged). */
ddp_status cuda_scratch(const ops_handle *ops, int slot, size_t n_bytes, void **out);

/* Whether the device has TF32 and bf16 tensor cores (compute capability 8.0, Ampere, or newer). */
static inline bool cuda_ampere(const cuda_state *cu) { return cu->cc_major >= 8; }

/* cuBLASLt for the linear layers' fused bias (cuda_layers.cu): the handle and its workspace on
 * the handle's stream, and their release (NULL-safe). DDP_ERR_BLAS / DDP_ERR_CUDA when they
 * cannot be made (logged). */
ddp_status cuda_lt_open(ops_handle *ops);
void cuda_lt_close(ops_handle *ops);
/* The precision-aware layer ops of cuda_layers.cu (all but the convolutions). */
void cuda_layer_ops(ops_handle *ops);
/* The transformer ops of cuda_gpt.cu (GPT-2: encoder, LayerNorm, attention, GELU, residual add,
 * cross-entropy over the vocabulary, AdamW). */
void cuda_gpt_ops(ops_handle *ops);
/* Adds dy's per-channel sums to db (accumulate false: stores them): dy (n, c, hw) in precision
 * p, db (c) fp32. */
ddp_status cuda_channel_sums(const ops_handle *ops, ddp_dtype p, const void *dy, int n, int c,
                             int hw, float *db, bool accumulate);
/* db (cols) += the column sums of dy (rows, cols; precision p), or = them when accumulate is
 * false (db not read): two passes over chunks of rows, no atomics, reproducible. */
ddp_status cuda_colsum(const ops_handle *ops, ddp_dtype p, float *db, const void *dy, int rows,
                       int cols, bool accumulate);
/* y (n, c, hw) = y + b[c], rounded to precision p's storage (y is float for fp32 and fp16). */
ddp_status cuda_add_channel_bias(const ops_handle *ops, ddp_dtype p, void *y, const float *b,
                                 int n, int c, int hw);
/* x[0..n) rounded to IEEE half in place (the fp16 emulation). */
ddp_status cuda_round_fp16(const ops_handle *ops, float *x, size_t n);
/* dst (n floats) = src in precision p (bf16 widened, fp32 and fp16 copied). */
ddp_status cuda_to_fp32(const ops_handle *ops, ddp_dtype p, float *dst, const void *src, size_t n);

/* cuDNN (cuda_cudnn.cu, built when cuDNN is found): the handle's cuDNN state on its stream, the
 * convolution ops, and their release. */
ddp_status cudnn_open(ops_handle *ops);
void cudnn_close(ops_handle *ops);
void cudnn_conv_ops(ops_handle *ops);
/* cuDNN's version number (cudnnGetVersion: 91900 for 9.19.0). */
size_t cudnn_version(void);
/* Whether the cuDNN loaded runs the attention graphs (cuda_sdpa.h sdpa_version_ok); when not, a
 * warning names the version found, the one needed, and the fallback to the project's kernel. */
bool cudnn_attention_usable(void);
/* Causal attention on cuDNN's fused flash-attention engines (cuda_sdpa.h; DDP_CUDA_ATTENTION=
 * cudnn): bf16 qkv (B, T, 3C) and out (B, T, C) rows, stats (B, NH, T) fp32 log-sum-exp; the
 * backward from the forward's out (o) and stats, dout (B, T, C) into dqkv (B, T, 3C), with sum
 * (B NH T floats) as scratch, and dq_acc (B T C floats) in the form DDP_CUDNN_DETERMINISTIC=0
 * asks for (else unread: NULL). A plan per direction and shape, made on
 * first use (DDP_ERR_UNSUPPORTED, logged with cuDNN's message, when cuDNN has no engine for it). */
ddp_status cudnn_attention_fwd(const ops_handle *ops, int B, int T, int NH, int hs,
                               const uint16_t *qkv, uint16_t *out, float *stats, float scale);
ddp_status cudnn_attention_bwd(const ops_handle *ops, int B, int T, int NH, int hs,
                               const uint16_t *qkv, const uint16_t *o, const uint16_t *dout,
                               const float *stats, uint16_t *dqkv, float *sum, float *dq_acc,
                               float scale);

#endif /* OPS_CUDA_PRIVATE_H */
