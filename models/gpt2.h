/* gpt2.h - GPT-2 (as published, and as llm.c builds it) computing with an ops handle (ops.h) in
 * memory libddp allocates (ddp_alloc).
 *
 * Token and position embeddings, L pre-LayerNorm blocks (causal multi-head self-attention, a
 * GELU (tanh) MLP of 4C), a final LayerNorm and an LM head tied to the token embedding. The
 * vocabulary V (50,257) is padded to Vp (a multiple of 128: 50,304) inside wte; the padding rows
 * are never a target and their logits are ignored.
 *
 * The weights are ONE flat buffer, in the compute precision, in llm.c's tensor-major layout (wte,
 * wpe, then each per-layer tensor for all L layers: ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
 * ln2w, ln2b, fcw, fcb, fcprojw, fcprojb; then lnfw, lnfb), so an llm.c model file is one copy. The
 * parameter table describes every per-layer slice as its own parameter (PyTorch's names, e.g.
 * "h.3.attn.c_attn.weight"), in buffer order; backward marks each slice ready on the reducer as
 * soon as its gradient is final, which is NOT reverse buffer order. Gradients have the same
 * layout, fp32; the optimizer (AdamW, its moments, the fp32 master weights in 16 bits) is the
 * trainer's (train/optim.h), which decays the weights gpt2_param_decays names.
 */
#ifndef GPT2_H
#define GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "ops.h"

#define GPT2_VOCAB 50257
#define GPT2_MAX_LAYERS 96

typedef struct gpt2_config {
    int max_seq;      /* maxT: rows of wpe (1024 for the published models) */
    int vocab;        /* V (50257) */
    int padded_vocab; /* Vp: V rounded up to a multiple of 128 (50304) */
    int layers;       /* L */
    int heads;        /* NH; channels % heads == 0 */
    int channels;     /* C */
} gpt2_config;

/* The published sizes: "d12" (124M: L 12, NH 12, C 768), "d24" (350M: 24, 16, 1024), "d36"
 * (774M: 36, 20, 1280), "d48" (1.5B: 48, 25, 1600), all with maxT 1024 and V 50257.
 * DDP_ERR_INVALID_ARG for another name (cfg untouched). */
ddp_status gpt2_config_preset(const char *name, gpt2_config *cfg);
/* Checks a configuration (sizes positive and within limits, channels divisible by heads,
 * padded_vocab >= vocab; padded_vocab 0 is set to vocab rounded up to 128). DDP_ERR_INVALID_ARG
 * with a log line naming the field otherwise. */
ddp_status gpt2_config_check(gpt2_config *cfg);
/* Parameter count (without the padding rows of wte: the figure GPT-2's papers give). */
size_t gpt2_config_n_params(const gpt2_config *cfg);

typedef struct gpt2_opts {
    int max_batch;      /* B: activations are sized for B sequences ... */
    int seq;            /* ... of T tokens (T <= max_seq) */
    ddp_dtype precision; /* DDP_FP32, or DDP_BF16 / DDP_FP16: the matmuls' inputs in 16 bits,
                            fp32 accumulation. In bf16 the activations the linears read and
                            write (LayerNorm outputs, qkv, attention output, MLP hidden, their
                            gradients) and the logits (their gradient in place: the fused
                            classifier) are bf16 end to end, no cast between layers, while the
                            residual stream, LayerNorm statistics, the loss (summed in fp32) and
                            the optimizer's master weights and moments stay fp32 (llm.c's
                            split); the environment variable DDP_GPT_ACTIVATIONS=fp32, read at
                            gpt2_create, keeps every activation fp32 with casts around each
                            linear instead (torch.autocast's split, the path before; fp16 always
                            takes it); DDP_GPT_LOGITS16=0 keeps only the logits fp32, their
                            gradient cast to bf16 (run 4's path, models/ops/switches.h) */
    uint64_t seed;      /* GPT-2's initialisation: N(0, 0.02), residual projections
                           (attprojw, fcprojw) N(0, 0.02 / sqrt(2L)), LayerNorm weights 1, biases 0 */
    bool reducer_grads; /* ZeRO stage 2 without a gradient buffer: the model allocates none;
                           gpt2_backward writes each slice's gradient where the reducer says
                           (ddp_reducer_grad_ptr: a reducer created with grads NULL, zero_stage 2
                           and ready_order gpt2_ready_order), so its r must not be NULL;
                           gpt2_grads is NULL, gpt2_zero_grad does nothing (a bucket is zeroed
                           when the reducer hands it out) */
    bool recompute;     /* activation recomputation: forward keeps each block's output residual
                           stream (L, B, T, C) but the other per-layer activations for ONE layer
                           only; backward runs each block's forward again (all but mlp.c_proj,
                           and not the last block's, still there) from its kept input before
                           differentiating it. The same gradients, bit for bit, for up to 22 %
                           more of the blocks' matmul FLOPs ((L - 1) / L of it). The parameters
                           must not change between a forward pass and its backward. */
} gpt2_opts;

typedef struct gpt2 gpt2;

/* Creates the model (weights initialised from opts->seed, identical on every rank and backend,
 * in 16 bits rounded to nearest even), gradients (zero; none under opts.reducer_grads) and
 * activations in ctx's memory; the optimizer's state and master weights are not the model's
 * (train/optim.h). ops must be open on the same context. On
 * failure *out is NULL: DDP_ERR_INVALID_ARG (bad configuration or options, or a
 * DDP_GPT_ACTIVATIONS other than fp32 or p, logged), DDP_ERR_UNSUPPORTED (an op or the precision
 * missing on this backend), DDP_ERR_NOMEM. */
ddp_status gpt2_create(ddp_ctx *ctx, const ops_handle *ops, const gpt2_config *cfg,
                       const gpt2_opts *opts, gpt2 **out);
void gpt2_destroy(gpt2 *g);

const gpt2_config *gpt2_cfg(const gpt2 *g);
/* The context whose memory holds the model's buffers (NULL: host memory), and the ops handle the
 * model computes with: what an optimizer of its parameters needs (train/optim.h). */
ddp_ctx *gpt2_ctx(const gpt2 *g);
const ops_handle *gpt2_ops(const gpt2 *g);
int gpt2_n_params(const gpt2 *g); /* entries of the parameter table (slices) */
const ddp_param_desc *gpt2_descs(const gpt2 *g);
const size_t *gpt2_numel(const gpt2 *g);
size_t gpt2_numel_total(const gpt2 *g); /* elements of the flat buffer (padding rows included) */
/* Whether parameter i is a 2-D weight (weight decay applies: wte, wpe, the four matmul weights). */
bool gpt2_param_decays(const gpt2 *g, int i);
/* The weights the passes read: the flat layout in the model's precision (*p), backend memory of
 * ops_dtype_size(p) bytes an element. In fp32 they are the master weights; in 16 bits the fp32
 * master is the optimizer's (train/optim.h), which writes these in the pass that updates it. A
 * caller may change them between passes (not between a forward pass and its backward). */
void *gpt2_weights(gpt2 *g, ddp_dtype *p);
/* The weights as floats in fp32; NULL in 16 bits. */
float *gpt2_params(gpt2 *g);
/* Every weight from host (the flat layout, fp32), rounded to nearest even in 16 bits.
 * DDP_ERR_NOMEM, or the upload's error. */
ddp_status gpt2_weights_set(gpt2 *g, const float *host);
/* host (the flat layout, fp32) = the weights, widened in 16 bits. DDP_ERR_NOMEM, or the
 * download's error. */
ddp_status gpt2_weights_get(const gpt2 *g, float *host);
float *gpt2_grads(gpt2 *g); /* fp32, the flat layout; NULL under opts.reducer_grads */
/* ZeRO: r's all-gather of the weights (ddp_reducer_gather_start on gpt2_weights) may still be
 * under way when a forward pass starts; each part of the pass (the embeddings, each block, ln_f)
 * first waits for its slices' buckets (ddp_reducer_gather_wait; CUDA: the stream waits, not the
 * host), so the gather overlaps the forward pass bucket by bucket. NULL (the default): the
 * weights are complete before every forward. r must outlive the model's forward passes or be
 * unset. */
void gpt2_set_gather(gpt2 *g, ddp_reducer *r);
/* 16 bits: the fp32 master of every weight (the flat layout, backend memory; an unsharded
 * optimizer's, train/optim.h), which the passes then read for wte, wpe, LayerNorm and the biases
 * instead of the 16-bit weights widened: the path of run 4 (docs/perf/gpu-gpt2.md), which
 * ddp-train takes with DDP_GPT_READ_COPY=0 (models/ops/switches.h). The matmuls still read the
 * 16-bit weights. NULL (the default) reads the widened weights again; nothing in fp32. master must
 * outlive the model's forward passes or be unset. */
void gpt2_set_master(gpt2 *g, const float *master);

/* Forward pass on tokens (B, T) (backend memory, values in [0, V)), B <= max_batch, T <= seq.
 * With targets (B, T): ADDS the mean cross-entropy to *loss_acc (backend memory, one float) when
 * loss_acc is not NULL; for_backward also keeps what backward needs (the logits become their
 * gradient in place). Without targets only the logits are computed (gpt2_logits_get). */
ddp_status gpt2_forward(gpt2 *g, const int *tokens, const int *targets, int B, int T,
                        float *loss_acc, bool for_backward);
/* host (n_rows, Vp) = rows [row, row + n_rows) of the last forward's logits (B, T, Vp), as fp32
 * (bf16 logits widened); valid after a forward without targets (with targets the logits may
 * have become their gradient). DDP_ERR_INVALID_ARG past B x T rows, DDP_ERR_NOMEM, or the
 * download's error. */
ddp_status gpt2_logits_get(const gpt2 *g, size_t row, size_t n_rows, float *host);
/* Backward of the last forward (for_backward): ADDS d(loss_scale * mean loss) to the gradients
 * and marks each parameter slice ready on r (when not NULL) as soon as its gradient is final.
 * DDP_ERR_STATE without such a forward; DDP_ERR_INVALID_ARG without r under opts.reducer_grads;
 * a failure of ddp_reducer_grad_ptr or ddp_reducer_mark_ready is returned as it is. */
ddp_status gpt2_backward(gpt2 *g, ddp_reducer *r, float loss_scale);
/* The order in which gpt2_backward marks the slices ready (gpt2_n_params entries): ln_f, then
 * each layer from the last, its MLP then its attention (each linear's bias then weight, each
 * LayerNorm's bias then weight), then wpe and wte (written first by the LM head, marked last).
 * The reducer's ready_order for opts.reducer_grads. */
void gpt2_ready_order(const gpt2 *g, int *order);
/* Zeroes the gradients (queued, no host wait); nothing under opts.reducer_grads. */
ddp_status gpt2_zero_grad(gpt2 *g);

/* Bytes of backend memory the model holds, by kind. */
typedef struct gpt2_memory {
    size_t params;      /* the weights (in 16 bits: + the widened slices read in fp32) */
    size_t grads;       /* 0 under opts.reducer_grads (the reducer holds them) */
    size_t activations; /* everything kept for backward, plus scratch */
    size_t logits;      /* of which the logits (max_batch x seq x Vp, in the activations' type) */
} gpt2_memory;
void gpt2_memory_get(const gpt2 *g, gpt2_memory *out);

/* ---- llm.c's model files: a header of 256 int32 (magic 20240326, version 3 = fp32 or 5 = bf16,
 * maxT, V, L, NH, C, Vp), then the parameters in the layout above. */
/* Reads the configuration from a file's header. DDP_ERR_IO (unreadable), DDP_ERR_FORMAT (bad
 * magic, version or sizes; the log says which). */
ddp_status gpt2_llmc_read_config(const char *path, gpt2_config *cfg);
/* Loads the parameters of a file whose configuration equals the model's (DDP_ERR_MISMATCH
 * otherwise, naming the field), fp32 or bf16 (widened). Errors as above; the model is unchanged
 * on failure. */
ddp_status gpt2_llmc_load(gpt2 *g, const char *path);
/* Writes the weights (widened in 16 bits) as version 3 (dtype DDP_FP32) or 5 (DDP_BF16, rounded
 * to nearest even), atomically (PATH.tmp then rename). DDP_ERR_INVALID_ARG for another dtype,
 * DDP_ERR_IO. */
ddp_status gpt2_llmc_save(gpt2 *g, const char *path, ddp_dtype dtype);
/* gpt2_llmc_save's writer for parameters already on the host: host holds the flat buffer of cfg
 * (wte with its padded_vocab rows, cfg->padded_vocab > 0), and is overwritten with the bf16
 * values for DDP_BF16. Errors as gpt2_llmc_save; DDP_ERR_INVALID_ARG for an invalid cfg. */
ddp_status gpt2_llmc_write(const char *path, const gpt2_config *cfg, float *host, ddp_dtype dtype);

#endif /* GPT2_H */
