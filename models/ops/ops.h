/* ops.h - the compute of the reference models: one ops handle per backend, behind which the
 * field's libraries do the work. The models own the compute; libddp owns memory, streams, staging
 * and host waits (ddp_alloc, ddp_upload, ddp_stage_*, ddp_synchronize: the ops have none).
 *
 * An ops handle (zstd's ZSTD_CCtx style) carries the backend's state and its function pointers;
 * every op takes the handle first: ops->gemm(ops, ...). Backends: ops_cpu.c (OpenBLAS for fp32
 * GEMM, oneDNN for convolution, pooling and 16-bit GEMM, always built; the handle holds the thread
 * count, oneDNN's engine, stream and primitive cache, and scratch) and ops_cuda.cu with
 * cuda_layers.cu and cuda_cudnn.cu (cuBLAS, cuDNN and CUDA kernels, built when CUDA is found;
 * NCHW images, channels_last false; the handle holds libddp's stream, the cuBLAS and cuDNN handles
 * and device scratch from ddp_alloc). Scalar math both share is in math_shared.h.
 *
 * Tensors are row-major, batch first. Images are NCHW, except between the precision-aware image
 * ops of a backend with channels_last set (the CPU: oneDNN's fast convolutions and pooling want
 * NHWC), where they are NHWC; image_reorder converts (a 1-channel image is the same in both).
 * Every pointer is backend memory of the handle's context (ops->ctx; NULL: host memory).
 * Ops run in order on the backend's stream (libddp's, ddp_backend_stream()); ddp_synchronize()
 * waits for them. An op a backend does not implement yet is NULL; ops_require() reports it.
 *
 * Precision: the ops of the second group take a ddp_dtype that says how activations (and
 * the 16-bit copies of weights they read) are stored: fp32 (float), bf16 (uint16_t, bfloat16) or
 * fp16 (emulated: float storage holding values rounded to IEEE half, so overflow and rounding
 * behave as in fp16 while the arithmetic runs in fp32). bf16 is emulated the same way where the
 * backend has no bf16 arithmetic (a CPU without AVX512_BF16 or AMX, or capped by DDP_CPU_ISA):
 * ops->emulates says which; ops_dtype_size gives the storage. GEMMs and convolutions accumulate in
 * fp32; parameter gradients (dw, db) are always fp32. Buffers are typed void * there.
 */
#ifndef OPS_H
#define OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "try.h" /* TRY_OK and, after a library's header, its TRY_ macros */

/* A stride-1 convolution with a square kernel k and zero padding pad, NCHW. */
typedef struct ops_conv_shape {
    int c_in, h, w;    /* input image */
    int c_out, k, pad; /* weight (c_out, c_in, k, k), bias (c_out) */
    int h_out, w_out;  /* output image */
} ops_conv_shape;

typedef struct ops_handle ops_handle;

struct ops_handle {
    const char *name; /* "cpu", "cpu-im2col", "cuda" or "cuda-im2col" */
    ddp_ctx *ctx;     /* whose memory the ops read and write (NULL: host memory) */
    void *state;      /* the backend's: threads, library handles, scratch */
    void (*release)(ops_handle *ops); /* ops_close's backend part: frees state and the handle */

    /* C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C, row-major, dense (lda etc. implied by
     * the shapes: A is (m,k) or, transposed, (k,m)). */
    ddp_status (*gemm)(const ops_handle *ops, bool trans_a, bool trans_b, int m, int n, int k,
                       float alpha, const float *a, const float *b, float beta, float *c);

    /* elementwise and reductions */
    /* y[r,c] += bias[c] */
    ddp_status (*bias_add)(const ops_handle *ops, float *y, const float *bias, int rows, int cols);
    ddp_status (*bias_grad)(const ops_handle *ops, float *dbias, const float *dy, int rows,
                            int cols); /* dbias[c] += sum_r dy[r,c] */
    ddp_status (*relu_fwd)(const ops_handle *ops, float *y, const float *x, size_t n);
    ddp_status (*relu_bwd)(const ops_handle *ops, float *dx, const float *dy, const float *y,
                           size_t n); /* dx = dy * (y > 0) */
    /* x (n, in dt: fp32, or a 16-bit type as ops_dtype_size stores it) *= alpha, rounded to dt */
    ddp_status (*scale)(const ops_handle *ops, ddp_dtype dt, void *x, size_t n, float alpha);
    /* y += alpha x */
    ddp_status (*axpy)(const ops_handle *ops, float *y, const float *x, size_t n, float alpha);
    /* SGD with momentum and weight decay (PyTorch's formulation):
     * g' = g + wd * w; m = momentum * m + g'; w -= lr * m  (m = g' on the first step is implied
     * by m starting at zero). */
    ddp_status (*sgd_step)(const ops_handle *ops, float *w, float *m, const float *g, size_t n,
                           float lr, float momentum, float weight_decay);

    /* convolution helpers, one image (C,H,W), square kernel k, stride 1, zero padding pad:
     * col is (C*k*k, H_out*W_out). col2im adds into im (im must be zeroed by the caller first). */
    ddp_status (*im2col)(const ops_handle *ops, const float *im, int c, int h, int w, int k,
                         int pad, float *col);
    ddp_status (*col2im)(const ops_handle *ops, const float *col, int c, int h, int w, int k,
                         int pad, float *im);
    /* 2x2 max-pool, stride 2, over (n*c) planes of h x w (h, w even); argmax keeps the winning
     * input index per output for the backward pass. maxpool_bwd adds into dx (zeroed first). */
    ddp_status (*maxpool_fwd)(const ops_handle *ops, const float *x, int planes, int h, int w,
                              float *y, int *argmax);
    ddp_status (*maxpool_bwd)(const ops_handle *ops, const float *dy, const int *argmax,
                              int planes, int h, int w, float *dx);
    /* Softmax cross-entropy over (rows, classes) logits with integer labels: writes the mean loss
     * to *loss_host, the count of argmax == label to *correct_host, and dlogits = (softmax - onehot)
     * / rows. dlogits may be NULL (evaluation). labels is backend memory. */
    ddp_status (*softmax_xent)(const ops_handle *ops, const float *logits, const int *labels,
                               int rows, int classes, float *dlogits, float *loss_host,
                               int *correct_host);
    /* The same for training, without a host round trip: ADDS the mean loss to *loss_acc (backend
     * memory, one float) and writes dlogits. A label outside [0, classes) is DDP_ERR_INVALID_ARG
     * on the CPU; on the GPU, where nothing waits for the device, it makes *loss_acc NaN. */
    ddp_status (*softmax_xent_acc)(const ops_handle *ops, const float *logits, const int *labels,
                                   int rows, int classes, float *dlogits, float *loss_acc);

    /* ---- precision-aware layer ops (optional: NULL on a backend that has only fp32, where the
     * layers fall back to the primitives above). x, y, dx, dy, and weights w are in precision p
     * (see the top of this file); b, dw, db are fp32. */
    /* true: the image ops below (conv_*, pool_*) take and give NHWC images; false: NCHW (see the
     * top). */
    bool channels_last;
    /* dst = src (n, c, h, w images) converted NHWC -> NCHW (to_nchw) or NCHW -> NHWC. */
    ddp_status (*image_reorder)(const ops_handle *ops, ddp_dtype p, const void *src, void *dst,
                                int n, int c, int h, int w, bool to_nchw);
    /* sgd_step that also writes wc (n, precision p): the updated weights in the compute
     * precision, in the same pass over memory (optional: NULL makes the model cast after). */
    ddp_status (*sgd_step_cast)(const ops_handle *ops, float *w, float *m, const float *g,
                                size_t n, float lr, float momentum, float weight_decay,
                                ddp_dtype p, void *wc);

    /* Whether the backend computes in p; otherwise *why says what is missing and what to use. */
    bool (*supports)(const ops_handle *ops, ddp_dtype p, const char **why);
    /* Whether p is emulated: float storage holding values rounded to p, arithmetic in fp32
     * (NULL: fp16 only). */
    bool (*emulates)(const ops_handle *ops, ddp_dtype p);
    /* dst (n, precision to) = src (n, precision from), rounding to nearest even. */
    ddp_status (*cast)(const ops_handle *ops, ddp_dtype to, void *dst, ddp_dtype from,
                       const void *src, size_t n);
    /* y (batch, out) = x (batch, in) w^T + b, w (out, in), b NULL: no bias (GPT-2's LM head);
     * y is fp32 when y_fp32 (the logits). */
    ddp_status (*linear_fwd)(const ops_handle *ops, ddp_dtype p, const void *x, const void *w,
                             const float *b, int batch, int in, int out, void *y, bool y_fp32);
    /* dw (out, in) += dy^T x; db (out) += column sums of dy (batch, out). dw or db NULL: that part
     * is skipped (the MLP computes and marks a layer's bias first, so the bucket holding it need
     * not wait for the weight GEMM). accumulate false: dw and db are overwritten and their old
     * contents never read (the first micro-batch of a step needs no zeroed gradients). */
    ddp_status (*linear_bwd_params)(const ops_handle *ops, ddp_dtype p, const void *x,
                                    const void *dy, int batch, int in, int out, float *dw,
                                    float *db, bool accumulate);
    /* dx (batch, in) = dy (batch, out) w. */
    ddp_status (*linear_bwd_input)(const ops_handle *ops, ddp_dtype p, const void *w,
                                   const void *dy, int batch, int in, int out, void *dx);
    /* y (batch, c_out, h_out, w_out) = conv(x (batch, c_in, h, w), w) + b. */
    ddp_status (*conv_fwd)(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s, int batch,
                           const void *x, const void *w, const float *b, void *y);
    /* dw += the weight gradient, db += the bias gradient, from x and dy (accumulate false: dw and
     * db are overwritten, as in linear_bwd_params). */
    ddp_status (*conv_bwd_params)(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                  int batch, const void *x, const void *dy, float *dw, float *db,
                                  bool accumulate);
    /* dx (batch, c_in, h, w) from dy and w. */
    ddp_status (*conv_bwd_input)(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                 int batch, const void *w, const void *dy, void *dx);
    /* y = max(x, 0). */
    ddp_status (*act_relu_fwd)(const ops_handle *ops, ddp_dtype p, void *y, const void *x,
                               size_t n);
    /* dx = dy where y > 0, else 0 (dx may alias dy). */
    ddp_status (*act_relu_bwd)(const ops_handle *ops, ddp_dtype p, void *dx, const void *dy,
                               const void *y, size_t n);
    /* 2x2 max-pool, stride 2, over (n, c, h, w) images; ws (ws_bytes) keeps what the backward
     * pass needs; DDP_ERR_INVALID_ARG when ws_bytes is too small. */
    ddp_status (*pool_fwd)(const ops_handle *ops, ddp_dtype p, const void *x, int n, int c, int h,
                           int w, void *y, void *ws, size_t ws_bytes);
    /* dx (n, c, h, w) = dy routed to each window's winner (overwrites dx). */
    ddp_status (*pool_bwd)(const ops_handle *ops, ddp_dtype p, const void *dy, const void *ws,
                           int n, int c, int h, int w, void *dx);

    /* ---- transformer ops (GPT-2, models/gpt2.c). Shapes: B sequences of T tokens, C channels, NH
     * heads of C / NH channels; rows = B * T. The matmuls are the linear ops above; these are the
     * rest. NULL on a backend that lacks them (ops_require_gpt names the first). Every "d" output
     * is OVERWRITTEN unless its comment says it adds.
     * Activations: the operands marked "in act" are what a linear reads or writes, stored in the
     * ddp_dtype act the op takes: DDP_FP32 (float), or the run's 16-bit p (ops_dtype_size's
     * storage, emulated or not) so that a 16-bit run needs no cast between layers (the CUDA
     * backend takes fp32 and bf16, DDP_ERR_INVALID_ARG for fp16). The logits are in act too (bf16
     * logits in a bf16 run, as llm.c's). The residual stream, LayerNorm's input, statistics and
     * parameters stay fp32; every op computes in fp32 (LayerNorm's and the softmaxes' sums
     * included) and rounds only what it stores in act. With act DDP_FP32 the ops
     * are exactly the fp32 ones (the fp32 path does not depend on the 16-bit forms). */
    /* out (B, T, C) = wte[tokens[b,t]] + wpe[t]; tokens (B, T) in [0, V) (checked by the caller);
     * wte in precision wp (the model's weights: fp32, or 16 bits stored as ops_dtype_size says),
     * wpe fp32. */
    ddp_status (*encoder_fwd)(const ops_handle *ops, float *out, const int *tokens, ddp_dtype wp,
                              const void *wte, const float *wpe, int B, int T, int C);
    /* dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t] (both ADD). */
    ddp_status (*encoder_bwd)(const ops_handle *ops, float *dwte, float *dwpe, const float *dout,
                              const int *tokens, int B, int T, int C);
    /* out (rows, C; in act) = (x - mean) * rstd * w + b per row, eps 1e-5; keeps mean, rstd
     * (rows). */
    ddp_status (*layernorm_fwd)(const ops_handle *ops, ddp_dtype act, void *out, float *mean,
                                float *rstd, const float *x, const float *w, const float *b,
                                int rows, int C);
    /* Optional (NULL: the model calls add, then layernorm_fwd on y): y (rows, C) = a + b as add
     * does (y may alias a; b in act), then out, mean, rstd = layernorm_fwd of y, bit for bit the
     * two ops', in one pass over each row (the residual add feeding ln_2). */
    ddp_status (*add_layernorm_fwd)(const ops_handle *ops, ddp_dtype act, float *y, const float *a,
                                    const void *b, void *out, float *mean, float *rstd,
                                    const float *w, const float *bias, int rows, int C);
    /* dx (rows, C) ADDS the input gradient (the residual stream's); dw, db (C) ADD; dout (rows,
     * C) in act. dx_act, when not NULL, gets the sum dx in act too (the residual gradient as the
     * next linear backward reads it, so that no cast follows). */
    ddp_status (*layernorm_bwd)(const ops_handle *ops, ddp_dtype act, float *dx, void *dx_act,
                                float *dw, float *db, const void *dout, const float *x,
                                const float *w, const float *mean, const float *rstd, int rows,
                                int C);
    /* Causal multi-head self-attention on qkv (B, T, 3C; in act: q, k, v, head h at channels
     * [h*hs, (h+1)*hs) of each), hs = C / NH: out (B, T, C; in act) = softmax(q k^T / sqrt(hs)) v
     * over keys 0..t, heads side by side. p is the precision of the products' inputs: the CPU
     * computes in fp32 whatever p is; CUDA rounds q, k, v and the probabilities to bf16 for
     * tensor cores (fp32 accumulation) when p is bf16, and then, with the fused kernel on
     * (ops_cuda_set_attention), never forms the T x T matrix. att keeps what backward needs,
     * attention_floats(...) floats: the probabilities (B, NH, T, T), zero above the diagonal, on
     * the materialised path (the CPU's, and what test_gpt_ops reads), or the fused kernel's
     * output and log-sum-exp. */
    ddp_status (*attention_fwd)(const ops_handle *ops, ddp_dtype p, ddp_dtype act, void *out,
                                float *att, const void *qkv, int B, int T, int C, int NH);
    /* dqkv (B, T, 3C; in act) from dout (B, T, C; in act), qkv and att of the forward pass (same
     * p and act); datt (attention_floats floats) is scratch. */
    ddp_status (*attention_bwd)(const ops_handle *ops, ddp_dtype p, ddp_dtype act, void *dqkv,
                                float *datt, const void *dout, const void *qkv, const float *att,
                                int B, int T, int C, int NH);
    /* The floats of attention_fwd's att (and of attention_bwd's datt) for these shapes; never
     * more for a smaller B or T. It follows the handle's settings at the call: fix them before
     * sizing buffers. */
    size_t (*attention_floats)(const ops_handle *ops, ddp_dtype p, int B, int T, int C, int NH);
    /* Optional fusions of a linear with GELU, for act == p (fp32 or bf16); NULL: the model calls
     * linear_fwd and gelu_fwd, linear_bwd_input and gelu_bwd. pre (batch, out; in p) = x w^T + b
     * and y (in p) = GELU(pre): where fused (CUDA bf16: cuBLASLt's GELU_AUX_BIAS epilogue) y is
     * GELU of pre before its rounding, within one rounding of gelu_fwd(pre). */
    ddp_status (*linear_gelu_fwd)(const ops_handle *ops, ddp_dtype p, const void *x, const void *w,
                                  const float *b, int batch, int in, int out, void *pre, void *y);
    /* dx (batch, in; in p) = (dy w) * GELU'(pre), pre (batch, in) in p: linear_bwd_input then
     * gelu_bwd, dx rounded once where fused (CUDA bf16: cuBLASLt's DGELU epilogue). */
    ddp_status (*linear_bwd_input_gelu)(const ops_handle *ops, ddp_dtype p, const void *w,
                                        const void *dy, const void *pre, int batch, int in,
                                        int out, void *dx);
    /* y = GELU(x), the tanh approximation (GPT-2's); x, y in act. */
    ddp_status (*gelu_fwd)(const ops_handle *ops, ddp_dtype act, void *y, const void *x, size_t n);
    /* dx = dy * GELU'(x), all in act (dx may alias dy). */
    ddp_status (*gelu_bwd)(const ops_handle *ops, ddp_dtype act, void *dx, const void *x,
                           const void *dy, size_t n);
    /* y = a + b (the residual: a and y fp32, b, a projection's output, in act; y may alias a,
     * and b when act is fp32). */
    ddp_status (*add)(const ops_handle *ops, ddp_dtype act, float *y, const float *a,
                      const void *b, size_t n);
    /* Cross-entropy of logits (rows, Vp; in act) whose first V columns are the vocabulary (the
     * padding columns are ignored): losses[r] = -log softmax(logits[r, :V])[targets[r]], in fp32.
     * When dlogits (in act) is not NULL it gets (softmax - onehot) * dscale in the first V columns
     * and 0 in the padding (dlogits may alias logits: the gradient overwrites them, the fused
     * classifier). targets in [0, V) (checked by the caller); losses backend memory. */
    ddp_status (*xent_fwd_bwd)(const ops_handle *ops, ddp_dtype act, void *dlogits,
                               float *losses, const void *logits, const int *targets, int rows,
                               int V, int Vp, float dscale);
    /* AdamW on n elements (PyTorch's torch.optim.AdamW): g = s * g with s = *grad_scale_dev
     * (one float in backend memory, read where the step runs: a clip factor computed on the
     * device, ddp_grad_clip_scale) when it is not NULL, else grad_scale;
     * m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; mhat = m / (1 - b1^t), vhat = v / (1 - b2^t);
     * w -= lr * (mhat / (sqrt(vhat) + eps) + wd * w). t >= 1 is the step count. */
    ddp_status (*adamw_step)(const ops_handle *ops, float *w, float *m, float *v, const float *g,
                             size_t n, float lr, float beta1, float beta2, float eps, float wd,
                             int t, float grad_scale, const float *grad_scale_dev);
    /* adamw_step that also writes wc (n, precision p): the updated weights in the compute
     * precision, in the same pass over memory (optional: NULL makes the caller cast after; fp32:
     * adamw_step). bf16 rounds stochastically (math_shared.h bf16_round_stochastic) with key
     * sr_key(seed, t) and element i's flat index index0 + i (the state's offset in the model's
     * flat layout), so a shard rounds as the whole; fp16 rounds to nearest even. w, m, v are
     * adamw_step's, bit for bit. */
    ddp_status (*adamw_step_cast)(const ops_handle *ops, float *w, float *m, float *v,
                                  const float *g, size_t n, float lr, float beta1, float beta2,
                                  float eps, float wd, int t, float grad_scale,
                                  const float *grad_scale_dev, ddp_dtype p, void *wc,
                                  uint32_t seed, size_t index0);
    /* dst (n, precision p) = src (fp32), rounded as adamw_step_cast writes wc at step `step`:
     * bf16 stochastically by (seed, step, index0 + i), fp16 to nearest even (fp32: a copy). The
     * rest of a copy whose shard adamw_step_cast wrote (optional: NULL where adamw_step_cast is). */
    ddp_status (*cast_stochastic)(const ops_handle *ops, ddp_dtype p, void *dst, const float *src,
                                  size_t n, uint32_t seed, uint32_t step, size_t index0);
};

/* Bytes per element of precision p's storage on a backend (emulated precisions are stored in float). */
static inline size_t ops_dtype_size(const ops_handle *ops, ddp_dtype p)
{
    if (p == DDP_FP32)
        return 4;
    bool emulated = ops->emulates ? ops->emulates(ops, p) : p == DDP_FP16;
    return emulated ? 4 : 2;
}

/* dst (n elements of precision p's storage, backend memory) = host (n floats, overwritten: the
 * conversion's scratch) rounded to nearest even in 16 bits. The upload's error. */
ddp_status ops_weights_put(const ops_handle *ops, ddp_dtype p, void *dst, float *host, size_t n);
/* host (n floats) = src (n elements of precision p's storage, backend memory) widened.
 * DDP_ERR_NOMEM, or the download's error. */
ddp_status ops_weights_get(const ops_handle *ops, ddp_dtype p, float *host, const void *src,
                           size_t n);

/* Opens the ops handle for a context's backend: on CUDA on its device and libddp's stream
 * (ddp_backend_stream(ctx)), on the CPU with `threads` compute threads; ctx NULL: the CPU on host
 * memory. DDP_CUDA_CONV=im2col / DDP_CPU_CONV=im2col choose the tables without cuDNN's / oneDNN's
 * convolutions (for comparisons). On failure *out is NULL and the reason is logged:
 * DDP_ERR_INVALID_ARG for a bad DDP_*_CONV, DDP_ERR_NOMEM, DDP_ERR_CUDA / DDP_ERR_BLAS when a
 * library handle cannot be made. */
ddp_status ops_open(ddp_ctx *ctx, int threads, ops_handle **out);
/* The CPU handle on ctx's memory (ctx NULL or a CPU context), with or without oneDNN's
 * convolution and pooling (im2col: im2col + OpenBLAS, the implementation before oneDNN).
 * Sets the CPU's compute threads (OpenBLAS, OpenMP; 1 if threads < 1). DDP_ERR_NOMEM on failure
 * (*out NULL). */
ddp_status ops_cpu_open(ddp_ctx *ctx, int threads, bool im2col, ops_handle **out);
/* The CUDA handle on a CUDA context's device and stream: the cuBLAS (and cuDNN) handles, bound to
 * ddp_backend_stream(ctx); im2col: without cuDNN's convolutions (im2col + cuBLAS per image, fp32
 * only). DDP_ERR_UNSUPPORTED without a CUDA build, DDP_ERR_INVALID_ARG unless ctx is a CUDA
 * context, DDP_ERR_CUDA / DDP_ERR_BLAS when a handle cannot be made (*out NULL, logged). */
ddp_status ops_cuda_open(ddp_ctx *ctx, bool im2col, ops_handle **out);
/* Releases what the open functions made (after the queued work: it waits with ddp_synchronize).
 * NULL is ignored. */
void ops_close(ops_handle *ops);

/* TF32 tensor cores for a CUDA handle's fp32 GEMMs and convolutions (off by default, like
 * PyTorch's torch.backends.cuda.matmul.allow_tf32): on, fp32 inputs are rounded to 10 mantissa
 * bits inside cuBLAS and cuDNN; affects the ops that follow. DDP_ERR_BLAS when cuBLAS refuses the
 * math mode (logged); DDP_OK and no effect on a CPU handle. */
ddp_status ops_cuda_set_tf32(ops_handle *ops, bool on);

/* The fused causal attention kernel (models/ops/cuda_flash.cu: bf16 tensor cores, no T x T
 * matrix) for a CUDA handle's bf16 attention with head size 64 (flash true), or the materialised
 * reference path (false: batched GEMMs around a softmax over the T x T scores, bf16 GEMM inputs
 * too). The default is DDP_CUDA_ATTENTION's (flash or materialized) at ops_cuda_open, else flash.
 * Set it before sizing attention buffers (attention_floats follows it). No effect on a CPU
 * handle; DDP_ERR_INVALID_ARG for NULL. */
ddp_status ops_cuda_set_attention(ops_handle *ops, bool flash);
/* bf16 attention with bf16 activations on cuDNN's fused flash-attention engines instead of the
 * project's kernel (models/ops/cuda_sdpa.h; on also sets the fused path, whose state it shares),
 * DDP_CUDA_ATTENTION=cudnn at ops_cuda_open; fp32 activations keep the kernel. A plan per shape
 * is made on first use; a GPU or shape cuDNN has no engine for fails there (DDP_ERR_UNSUPPORTED,
 * logged with cuDNN's message). DDP_ERR_UNSUPPORTED (logged) when on and the build has no cuDNN,
 * or the cuDNN loaded is older than the graphs assume (cuda_sdpa.h SDPA_MIN_CUDNN, 9.10.2: a
 * warning names the version found; the handle keeps the fused kernel, as DDP_CUDA_ATTENTION=cudnn
 * then does); no effect on a CPU handle; DDP_ERR_INVALID_ARG for NULL. */
ddp_status ops_cuda_set_attention_cudnn(ops_handle *ops, bool on);

/* "cuBLAS 130100, bf16 GEMMs cublasGemmEx (fp32 accumulation); convolutions cuDNN 91900; compute
 * capability 9.0", for start-up reports ("" for a CPU handle or without a CUDA build). */
const char *ops_cuda_describe(const ops_handle *ops, ddp_dtype p);
/* The CUDA handle's device as the driver names it (cudaDeviceProp.name, e.g. "NVIDIA H100 80GB
 * HBM3"), for the MFU's peak table; "" for a CPU handle, without a CUDA build, or when the driver
 * cannot tell. The text lives until the next call. */
const char *ops_cuda_device_name(const ops_handle *ops);
/* The cuDNN algorithms chosen so far for precision p, e.g. "conv_fwd algo 1 (tensor-op math),
 * ...", for the report after the first step ("" before any, for a CPU handle, or without cuDNN). */
const char *ops_cudnn_describe(const ops_handle *ops, ddp_dtype p);

/* DDP_OK when every op a model needs is implemented by ops; otherwise DDP_ERR_UNSUPPORTED and a
 * log line naming the first missing op and the backend (DDP_ERR_INVALID_ARG for NULL ops). */
ddp_status ops_require(const ops_handle *ops, const char *who);

/* DDP_OK when every transformer op (GPT-2) is implemented by ops; otherwise DDP_ERR_UNSUPPORTED
 * and a log line naming the first missing op and the backend. */
ddp_status ops_require_gpt(const ops_handle *ops, const char *who);

/* DDP_OK when ops computes in precision p (fp32 always); otherwise DDP_ERR_UNSUPPORTED and a log
 * line saying what is missing and suggesting fp32. */
ddp_status ops_require_precision(const ops_handle *ops, ddp_dtype p, const char *who);

/* Sets the CPU compute thread count (OpenBLAS; oneDNN is built sequential or follows
 * OMP_NUM_THREADS); 1 if threads < 1. */
void ops_cpu_set_threads(int threads);

/* ---- the CPU's libraries (blas.c, cpu_dnnl.c) ---------------------------------------------------- */

/* The CPU's kernels, chosen first in main(). DDP_CPU_ISA (common/cpu_isa.h) is checked and, when it
 * caps the CPU, handed to oneDNN (ONEDNN_MAX_CPU_ISA). Then ddp's one kernel policy
 * (common/blas_policy.c, shared with ddp-launch): a CPU with AVX-512 F, BW, VL and DQ gets
 * OPENBLAS_CORETYPE=SkylakeX, with BF16 as well Cooperlake; a CPU capped below AVX-512 Haswell or
 * Prescott; other CPUs keep OpenBLAS's choice. If OPENBLAS_CORETYPE is unset (a preset is the user's
 * choice and is kept, unless a cap overrides it) and the policy names a core, sets OPENBLAS_CORETYPE
 * (and DDP_OPENBLAS_CORETYPE_BY=models) and, when OpenBLAS runs another core, re-executes the
 * program (/proc/self/exe, same argv) so OpenBLAS loads that one. DDP_NO_BLAS_REEXEC=1 turns the
 * re-exec off. Returns 0 when no re-exec was needed (or exec failed, which is logged), -1 after
 * logging an invalid DDP_CPU_ISA (the program should exit). */
int ops_blas_prefer_fast_kernels(char **argv);
/* "OpenBLAS 0.3.21 DYNAMIC_ARCH ... core=SkylakeX threads=1; OPENBLAS_CORETYPE=SkylakeX set by
 * ddp-launch (policy)" (or "... preset by the user ..."), for start-up reports. */
const char *ops_blas_describe(void);
/* The library running the CPU's GEMMs in precision p: "OpenBLAS" or "oneDNN matmul". */
const char *ops_cpu_gemm_name(ddp_dtype p);
/* One line naming the CPU implementations a CPU handle uses for precision p, e.g. "conv fwd
 * brg:avx512_core_bf16, ...", for start-up reports ("" before any primitive was created, or for
 * a CUDA handle). */
const char *ops_dnnl_describe(const ops_handle *ops, ddp_dtype p);

#endif /* OPS_H */
