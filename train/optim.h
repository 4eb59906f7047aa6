/* optim.h - the optimizer of ddp-train: the one owner of the optimizer state and of its ZeRO
 * shard, which it takes from the reducer. The model owns the weights its passes read, in its
 * compute precision, and their gradients; the optimizer owns the rest (llm.c's split):
 *   - in fp32 the model's weights are the master weights, updated in place;
 *   - in 16 bits the fp32 master weights of its range are the optimizer's, initialised once from
 *     the model's weights, and every step writes master and 16-bit weights in one pass
 *     (ops.h adamw_step_cast, sgd_step_cast);
 *   - SGD's momentum or AdamW's two moments, of its range.
 * One step: the averaged gradients of this rank's range, the loss scaler's unscale, the global
 * norm (sharded or not), the update of the range, then under ZeRO the all-gather of the weights
 * the passes read (16-bit weights: half the bytes of fp32).
 *
 * The state holds elements [offset, offset + n) of the model's flat layout: the reducer's shard
 * under ZeRO (ddp_reducer_shard), else every element. Element i of each buffer is the flat
 * layout's offset + i, so checkpoints save and resume it as the layout's range (optim_buffers).
 *
 * The 16-bit weights are a function of the master and the step: bf16 with AdamW rounds
 * stochastically by (seed, step, flat index), every other case to nearest even. So every rank's
 * weights under --zero 1/2 are --zero 0's byte for byte, and a resume rewrites them from the
 * master it loads (optim_round) exactly as the uninterrupted run holds them.
 */
#ifndef TRAIN_OPTIM_H
#define TRAIN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "ops.h"

typedef enum optim_kind { OPTIM_SGD = 0, OPTIM_ADAMW } optim_kind;

#define OPTIM_MAX_BUFS 3 /* checkpointed buffers: "params" (the master), then SGD "momentum",
                           or AdamW "adam_m", "adam_v" */

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

/* The model's weights, which the optimizer updates: the flat layout in precision p, backend
 * memory, whole on every rank (ZeRO gathers them after each step). */
typedef struct optim_weights {
    void *w;
    ddp_dtype p;   /* DDP_FP32: w is the master; DDP_BF16 / DDP_FP16: the optimizer keeps it */
    uint32_t seed; /* bf16 with AdamW: the stochastic rounding's seed */
} optim_weights;

/* Creates the state (zeroed moments; in 16 bits the master of the range, from w's values) for a
 * flat layout of n_params slices of numel[i] elements, in ctx's memory (NULL: host memory),
 * stepping with `ops`. r: the reducer whose shard the state covers, whose averaged gradients a
 * step reads (optim_update) and which gathers the weights; NULL or zero_stage 0: every element.
 * r, ops and w->w must outlive the optimizer. On failure *out is NULL: DDP_ERR_INVALID_ARG (no
 * slices, an empty layout, a precision other than fp32, bf16, fp16), DDP_ERR_NOMEM (logged with
 * the size). */
ddp_status optim_create(ddp_ctx *ctx, const ops_handle *ops, const optim_opts *o,
                        const size_t *numel, int n_params, ddp_reducer *r, const optim_weights *w,
                        optim **out);
void optim_destroy(optim *o); /* NULL-safe */

/* One step on the state's range: grads holds the range's gradients, element i the flat layout's
 * offset + i. lr the learning rate, t >= 1 the step count (AdamW's bias correction and the
 * rounding's key), grad_scale multiplies the gradients first (AdamW only; SGD takes 1). Writes
 * the master and the weights of the range; no gather. DDP_ERR_INVALID_ARG for t < 1, else the
 * ops' failures. */
ddp_status optim_step(optim *o, const float *grads, float lr, int t, float grad_scale);

/* The whole update after ddp_reducer_finish: the averaged gradients of the range (in `grads`, the
 * model's gradient buffer, at the range's offsets; under ZeRO stage 2 the reducer's shard buffer,
 * and grads may be NULL), the scaler's unscale and inf/NaN agreement (scaler NULL: none), the
 * global norm (clip or opts.norm), optim_step, then under ZeRO the start of the weights'
 * all-gather (ddp_reducer_gather_start: wait with ddp_reducer_gather_wait before reading them
 * whole). Without ZeRO the norm and the clip factor are computed where the gradients are and
 * AdamW reads the factor there (ddp_grad_clip_scale): the host does not wait for the norm
 * (optim_last_norm fetches it when asked); a sharded norm needs every rank's sum on the host.
 * *applied: 0 when the scaler skipped the step (every rank alike; the weights are rewritten as
 * step t writes them, optim_round). Collective under ZeRO or with a scaler. Returns the first
 * failure of those calls. */
ddp_status optim_update(optim *o, float *grads, ddp_scaler *scaler, float lr, long t,
                        int *applied);

/* The weights of the range written from the master as step t writes them (t 0: to nearest even),
 * then under ZeRO their all-gather, waited for: after a resume loaded the master, and after a
 * step left out (a NaN loss) so that the weights stay the function of (master, step) a resume
 * makes. Nothing in fp32. Collective under ZeRO. */
ddp_status optim_round(optim *o, long t);

/* The global gradient norm of the last optim_update that computed one (NAN before); a download
 * that waits for that step when its norm is still on the device. */
double optim_last_norm(optim *o);
/* The state's range of the flat layout. */
void optim_range(const optim *o, size_t *offset, size_t *n);
/* Bytes of state held (every buffer, the master in 16 bits included). */
size_t optim_state_bytes(const optim *o);
/* The buffers a checkpoint saves, each of the range (n elements, backend memory, see
 * optim_range): their count, names[i] and bufs[i]. The first is "params", the fp32 master of the
 * range (in fp32 the model's weights there), then SGD's "momentum" or AdamW's "adam_m",
 * "adam_v". A resume writes them, then calls optim_round. */
int optim_buffers(optim *o, const char **names, float **bufs);

#endif /* TRAIN_OPTIM_H */
