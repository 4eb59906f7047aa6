/* model.h - the reference models (MLP and LeNet-style CNN), computing with an ops handle (ops.h)
 * in memory libddp allocates (ddp_alloc).
 *
 * A model owns two allocations in backend memory, each ONE buffer with a size table: the weights
 * (in the compute precision) and the fp32 gradients (same layout, so reducer buckets are slices of
 * it). The optimizer, its state and in 16 bits the fp32 master weights are the trainer's
 * (train/optim.h).
 * Parameter order is forward order (layer by layer, weight then bias); backward produces
 * gradients in reverse order and marks each one ready on the reducer as soon as it is final.
 */
#ifndef MODEL_H
#define MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops.h"
#include "ddp.h"

#define MODEL_MLP_MAX_LAYERS 8
#define MODEL_MLP_MAX_WIDTH (1 << 20) /* neurons per layer, each of --widths */

typedef enum model_kind { MODEL_MLP = 0, MODEL_CNN } model_kind;

typedef struct model_config {
    model_kind kind;
    /* MLP widths including input (784) and output (10): default 784-512-256-10. Ignored for CNN
     * (fixed: conv 1->20 5x5 pad 2, ReLU, pool 2; conv 20->20 5x5 pad 2, ReLU, pool 2; fc 980->10). */
    int n_widths;
    int widths[MODEL_MLP_MAX_LAYERS + 1];
    int max_batch; /* activations are sized for this many samples */
    uint64_t seed; /* seeded initialisation (PyTorch's default ranges: U(+-1/sqrt(fan_in))) */
    /* the weights, activations and GEMM/convolution inputs (fp32 accumulation); biases are read
     * widened, gradients, logits and the loss stay fp32 (default fp32) */
    ddp_dtype precision;
    /* ZeRO stage 2 without a gradient buffer: the model allocates none; model_backward writes
     * each parameter's gradient where the reducer says (ddp_reducer_grad_ptr: a reducer created
     * with grads NULL and zero_stage 2; backward marks in reverse parameter order, the reducer's
     * default ready order), so its r must not be NULL; model_grads is NULL. Default false. */
    bool reducer_grads;
} model_config;

typedef struct model model;

/* Defaults for a kind: widths 784-512-256-10, max_batch 64, seed 42. */
void model_config_default(model_config *cfg, model_kind kind);
/* Parses "mlp" / "cnn". DDP_ERR_INVALID_ARG otherwise. */
ddp_status model_kind_parse(const char *name, model_kind *out);
/* Parses "784-512-256-10" into cfg->widths (first must be 784, last 10). */
ddp_status model_widths_parse(const char *text, model_config *cfg);

/* Parses "fp32" / "bf16" / "fp16". DDP_ERR_INVALID_ARG otherwise. */
ddp_status model_precision_parse(const char *name, ddp_dtype *out);
const char *model_precision_name(ddp_dtype p);

/* Creates the model in ctx's memory (libddp's ddp_alloc: parameters, gradients and
 * activations), computing with `ops`, a handle the caller opened on the same context
 * (ops_open(ctx, ...)) and closes after the model; the model keeps both, owns neither. ctx NULL:
 * host memory, with a CPU handle opened on NULL. Initialised from cfg->seed. On failure *out is
 * NULL: DDP_ERR_INVALID_ARG for a bad configuration or a handle of another context,
 * DDP_ERR_UNSUPPORTED when the backend lacks an op the model needs or cfg->precision (logged with
 * what to use instead), DDP_ERR_NOMEM. */
ddp_status model_create(ddp_ctx *ctx, const ops_handle *ops, const model_config *cfg,
                        model **out);
void model_destroy(model *m);

int model_n_params(const model *m);
const ddp_param_desc *model_descs(const model *m);
const size_t *model_numel(const model *m); /* per-parameter element counts */
size_t model_numel_total(const model *m);
/* The weights the passes read: flat, backend memory, in the model's precision (*p;
 * ops_dtype_size(p) bytes an element). In fp32 they are the master weights; in 16 bits the fp32
 * master is the optimizer's (train/optim.h). The caller may change them between passes. */
void *model_weights(model *m, ddp_dtype *p);
/* The weights as floats in fp32; NULL in 16 bits. */
float *model_params(model *m);
float *model_grads(model *m);  /* flat, backend memory, same layout; NULL under reducer_grads */
const ops_handle *model_ops(const model *m);
/* ZeRO: r's all-gather of the weights (ddp_reducer_gather_start on model_weights) may still be
 * under way when a forward pass starts; each layer first waits for its weight and bias
 * (ddp_reducer_gather_wait), so the gather overlaps the forward pass. NULL (the default): the
 * weights are complete before every forward. r must outlive the model's forward passes or be unset. */
void model_set_gather(model *m, ddp_reducer *r);

/* Forward pass on a batch: x (batch, 784) and labels (batch) in backend memory, batch <=
 * max_batch. Writes the mean loss and the number of correct predictions (either may be NULL), and
 * pred_host[batch] the predicted classes when not NULL. Keeps what backward needs. */
ddp_status model_forward(model *m, const float *x, const int *labels, int batch,
                         float *loss, int *correct, int *pred_host);
/* The same for training steps, with no host round trip: ADDS the mean loss to *loss_acc (backend
 * memory, one float; NaN on the GPU for a label out of range). */
ddp_status model_forward_train(model *m, const float *x, const int *labels, int batch,
                               float *loss_acc);
/* Backward pass of the last forward: ADDS the gradient of the mean loss to the gradients, and
 * marks each parameter ready on r (when r is not NULL) as soon as its gradient is final.
 * DDP_ERR_INVALID_ARG without r under cfg.reducer_grads; ddp_reducer_grad_ptr's failures. */
ddp_status model_backward(model *m, ddp_reducer *r);
/* Multiplies the fp32 loss gradient of the last forward pass by `scale` (loss scaling for 16-bit
 * gradients: every parameter gradient of the next backward is then scaled alike; backward casts
 * the scaled gradient to the model's precision). DDP_ERR_STATE without a forward pass. */
ddp_status model_scale_loss_grad(model *m, float scale);
/* The next backward overwrites the gradients instead of adding to them (no pass over memory:
 * until that backward, model_grads still holds the old values). */
ddp_status model_zero_grad(model *m);

/* The classifiers' report from confusion counts, confusion[true * MODEL_N_CLASSES + predicted]:
 * the accuracy, and an sklearn-style table (per-class precision, recall, F1 and support; accuracy;
 * macro and weighted averages; a class with no prediction (or no sample) gets precision (recall)
 * 0). */
#define MODEL_N_CLASSES 10
double model_confusion_accuracy(const float *confusion);
void model_class_report(FILE *f, const float *confusion);

#endif /* MODEL_H */
