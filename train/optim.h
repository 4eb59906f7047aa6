/* optim.h - the optimizer of ddp-train: the one owner of the optimizer state (SGD momentum, the
 * AdamW moments) and of its ZeRO shard, which it takes from the reducer. One step: the averaged
 * gradients of this rank's range, the loss scaler's unscale, the global norm (sharded or not),
 * SGD or AdamW through the ops table (ops.h) on the range, then the parameters' all-gather.
 *
 * The state holds elements [offset, offset + n) of the model's flat layout: the reducer's shard
 * under ZeRO (ddp_reducer_shard), else every element. Element i of each buffer is the flat
 * layout's offset + i, so checkpoints save and resume it as the layout's range (optim_buffers).
 */
#ifndef TRAIN_OPTIM_H
#define TRAIN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "ops.h"

typedef enum optim_kind { OPTIM_SGD = 0, OPTIM_ADAMW } optim_kind;

#define OPTIM_MAX_BUFS 2 /* state buffers: SGD "momentum"; AdamW "adam_m", "adam_v" */

typedef struct optim_opts {
    optim_kind kind;
    float momentum;          /* SGD (PyTorch's formulation, ops.h sgd_step) */
    float beta1, beta2, eps; /* AdamW (torch.optim.AdamW, ops.h adamw_step) */
    float weight_decay;
    const bool *decays;      /* (n_params) whether parameter i's weight decays (read during
                                create, not kept); NULL: every parameter's */
    double clip;             /* > 0: global-norm clipping, gradients x min(1, clip / (norm + 1e-6)) */
    bool norm;               /* compute the global norm every step (optim_last_norm) even without
                                clipping; with clip > 0 it is computed anyway */
} optim_opts;

typedef struct optim optim;

/* Creates the zeroed state for a flat layout of n_params slices of numel[i] elements, in ctx's
 * memory (NULL: host memory), stepping with `ops`. r: the reducer whose shard the state covers and
 * whose averaged gradients a step reads (optim_update); NULL or zero_stage 0: every element. r
 * and ops must outlive the optimizer. On failure *out is NULL: DDP_ERR_INVALID_ARG (no slices,
 * an empty layout), DDP_ERR_NOMEM (logged with the size). */
ddp_status optim_create(ddp_ctx *ctx, const ops_handle *ops, const optim_opts *o,
                        const size_t *numel, int n_params, ddp_reducer *r, optim **out);
void optim_destroy(optim *o); /* NULL-safe */

/* One step on the state's range of params (the flat fp32 master weights, backend memory): grads
 * holds the range's gradients, element i the flat layout's offset + i. lr the learning rate,
 * t >= 1 the step count (AdamW's bias correction), grad_scale multiplies the gradients first
 * (AdamW only; SGD takes 1). With optim_set_copy AdamW also writes the copy's elements of the
 * range and then calls its `written` (t). DDP_ERR_INVALID_ARG for t < 1, else the ops' failures. */
ddp_status optim_step(optim *o, float *params, const float *grads, float lr, int t,
                      float grad_scale);

/* The whole update after ddp_reducer_finish: the averaged gradients of the range (in `grads`, the
 * model's gradient buffer, at the range's offsets; under ZeRO stage 2 the reducer's shard buffer,
 * and grads may be NULL), the scaler's unscale and inf/NaN agreement (scaler NULL: none), the global norm
 * (clip or opts.norm), optim_step, then under ZeRO the start of the parameters' all-gather
 * (ddp_reducer_gather_start: wait with ddp_reducer_gather_wait before reading params whole).
 * Without ZeRO the norm and the clip factor are computed where the gradients are and AdamW reads
 * the factor there (ddp_grad_clip_scale): the host does not wait for the norm (optim_last_norm
 * fetches it when asked); a sharded norm needs every rank's sum on the host.
 * *applied: 0 when the scaler skipped the step (every rank alike; nothing changed). Collective
 * under ZeRO or with a scaler. Returns the first failure of those calls. */
ddp_status optim_update(optim *o, float *params, float *grads, ddp_scaler *scaler, float lr,
                        long t, int *applied);

/* A model's 16-bit copy of the parameters (the flat layout in precision p, backend memory), which
 * AdamW writes for the state's range in the pass that updates it (ops.h adamw_step_cast: bf16
 * rounded stochastically by (seed, step, flat index)) instead of the model casting it after. */
typedef struct optim_copy {
    void *wc;       /* the whole layout's copy; the state writes elements [offset, offset + n) */
    ddp_dtype p;    /* DDP_BF16 or DDP_FP16 */
    uint32_t seed;  /* bf16's stochastic rounding */
    /* after a step t wrote the range (the model skips its own cast of it: gpt2_copy_written) */
    void (*written)(void *arg, long t);
    void *arg;
    /* bf16 under ZeRO: the all-gather after each step gathers this copy (half the bytes) instead
     * of params, whose elements outside the range then stay stale until optim_params_full
     * (gpt2_set_copy_gather); ignored otherwise */
    bool gather;
} optim_copy;

/* AdamW writes c's copy from now on; c NULL, SGD, or ops without adamw_step_cast: nothing (the
 * model casts). Returns whether the copy is written. */
bool optim_set_copy(optim *o, const optim_copy *c);
/* Whether the steps gather the copy (optim_copy.gather taken: bf16, ZeRO, the copy written). */
bool optim_gathers_copy(const optim *o);
/* After steps that gathered the copy: waits for that gather and all-gathers params (the fp32
 * master weights, every rank's range) so that every rank holds them whole again, for a
 * checkpoint, the replica check or a step that rounds the copy from them; nothing when they are
 * whole. Collective: every rank calls it at the same point. */
ddp_status optim_params_full(optim *o, float *params);

/* The global gradient norm of the last optim_update that computed one (NAN before); a download
 * that waits for that step when its norm is still on the device. */
double optim_last_norm(optim *o);
/* The state's range of the flat layout. */
void optim_range(const optim *o, size_t *offset, size_t *n);
/* Bytes of state held (every buffer). */
size_t optim_state_bytes(const optim *o);
/* The buffers a checkpoint saves: their count, names[i] and bufs[i] (n elements each, backend
 * memory, see optim_range). */
int optim_buffers(optim *o, const char **names, float **bufs);

#endif /* TRAIN_OPTIM_H */
