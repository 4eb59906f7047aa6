/* optim.c - ddp-train's optimizer (optim.h): SGD or AdamW state over this rank's range of the flat
 * layout, stepped through the ops table in runs of slices that share a weight-decay flag.
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

#include "ddp_checkpoint.h" /* ddp_snapshot_fence */

typedef struct optim_run {
    size_t a, b; /* [a, b) of the flat layout, inside the state's range */
    bool decay;
} optim_run;

struct optim {
    ddp_ctx *ctx;
    const ops_handle *ops;
    ddp_reducer *reducer;     /* NULL: unsharded */
    optim_opts o;
    size_t offset, n;         /* the range */
    int n_bufs;
    float *buf[OPTIM_MAX_BUFS]; // (n) each: momentum, or the AdamW moments m and v
    optim_run *runs;          /* the range cut into runs of one decay flag */
    int n_runs;
    double last_norm;
    /* Unsharded with a norm: the norm and the clip factor where the gradients are (backend
     * memory, ddp_grad_clip_scale), last_norm fetched from there when asked. */
    struct optim_clip_dev {
        double norm;
        float scale;
    } *clip_dev;
    bool norm_on_device;      /* clip_dev->norm is newer than last_norm */
    optim_copy copy;          /* wc NULL: none (optim_set_copy) */
    bool params_partial;      /* the last gather was the copy's: params whole only in the range */
};

/* The runs of contiguous slices with the same decay flag, cut to [lo, hi). */
static ddp_status optim_plan_runs(optim *p, const size_t *numel, int n_params, const bool *decays)
{
    p->runs = malloc((size_t)n_params * sizeof *p->runs);
    if (!p->runs)
        return DDP_ERR_NOMEM;
    size_t lo = p->offset, hi = p->offset + p->n, start = 0;
    for (int i = 0, j; i < n_params; i = j) {
        bool decay = decays ? decays[i] : true;
        size_t end = start + numel[i];
        for (j = i + 1; j < n_params && (decays ? decays[j] : true) == decay; j++)
            end += numel[j];
        size_t a = start > lo ? start : lo, b = end < hi ? end : hi;
        if (a < b)
            p->runs[p->n_runs++] = (optim_run){.a = a, .b = b, .decay = decay};
        start = end;
    }
    return DDP_OK;
}

static ddp_status optim_alloc(optim *p)
{
    if (!p->reducer && (p->o.clip > 0.0 || p->o.norm)) {
        p->clip_dev = ddp_alloc(p->ctx, sizeof *p->clip_dev);
        if (!p->clip_dev) {
            DDP_ERROR("optimizer: cannot allocate the gradient norm's %zu bytes",
                      sizeof *p->clip_dev);
            return DDP_ERR_NOMEM;
        }
    }
    p->n_bufs = p->o.kind == OPTIM_ADAMW ? 2 : 1;
    size_t bytes = (p->n > 0 ? p->n : 1) * sizeof(float);
    for (int i = 0; i < p->n_bufs; i++) {
        p->buf[i] = ddp_alloc(p->ctx, bytes);
        if (!p->buf[i] || ddp_zero(p->ctx, p->buf[i], bytes) != DDP_OK) {
            DDP_ERROR("optimizer: cannot allocate %d state buffer(s) of %zu elements", p->n_bufs, p->n);
            return DDP_ERR_NOMEM;
        }
    }
    return DDP_OK;
}

ddp_status optim_create(ddp_ctx *ctx, const ops_handle *ops, const optim_opts *o,
                        const size_t *numel, int n_params, ddp_reducer *r, optim **out)
{
    *out = NULL;
    if (!ops || !o || !numel || n_params < 1)
        return DDP_ERR_INVALID_ARG;
    optim *p = calloc(1, sizeof *p);
    if (!p)
        return DDP_ERR_NOMEM;
    *p = (optim){.ctx = ctx, .ops = ops, .o = *o, .last_norm = NAN};
    p->o.decays = NULL;
    for (int i = 0; i < n_params; i++)
        p->n += numel[i];
    if (ddp_reducer_zero_stage(r) > 0) { /* ZeRO: never the full state, not even for a moment */
        p->reducer = r;
        ddp_reducer_shard(r, &p->offset, &p->n);
    }
    ddp_status st = optim_plan_runs(p, numel, n_params, o->decays);
    if (st == DDP_OK)
        st = optim_alloc(p);
    if (st != DDP_OK) {
        optim_destroy(p);
        return st;
    }
    *out = p;
    return DDP_OK;
}

void optim_destroy(optim *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n_bufs; i++)
        ddp_free(o->ctx, o->buf[i]);
    ddp_free(o->ctx, o->clip_dev);
    free(o->runs);
    free(o);
}

/* optim_step with AdamW's gradient factor read on the device from scale_dev when it is set. */
static ddp_status optim_step_dev(optim *o, float *params, const float *grads, float lr, int t,
                                 float grad_scale, const float *scale_dev)
{
    if (t < 1) {
        DDP_ERROR("optimizer: step %d (the first is 1)", t);
        return DDP_ERR_INVALID_ARG;
    }
    /* a checkpoint's copies of the parameters and moments (ddp_snapshot_copy, on a side stream)
     * end before this step overwrites them: a wait on the GPU, nothing when none is queued */
    TRY_OK(ddp_snapshot_fence(o->ctx));
    const optim_opts *q = &o->o;
    for (int k = 0; k < o->n_runs; k++) {
        const optim_run *u = &o->runs[k];
        size_t i = u->a - o->offset, n = u->b - u->a;
        float wd = u->decay ? q->weight_decay : 0.0f;
        const optim_copy *c = &o->copy;
        if (q->kind == OPTIM_ADAMW && c->wc) /* the copy's run at the run's flat offset */
            TRY_OK(o->ops->adamw_step_cast(o->ops, params + u->a, o->buf[0] + i, o->buf[1] + i,
                                           grads + i, n, lr, q->beta1, q->beta2, q->eps, wd, t,
                                           grad_scale, scale_dev, c->p,
                                           (char *)c->wc + u->a * ops_dtype_size(o->ops, c->p),
                                           c->seed, u->a));
        else if (q->kind == OPTIM_ADAMW)
            TRY_OK(o->ops->adamw_step(o->ops, params + u->a, o->buf[0] + i, o->buf[1] + i,
                                      grads + i, n, lr, q->beta1, q->beta2, q->eps, wd, t,
                                      grad_scale, scale_dev));
        else
            TRY_OK(o->ops->sgd_step(o->ops, params + u->a, o->buf[0] + i, grads + i, n, lr,
                                    q->momentum, wd));
    }
    if (o->copy.wc && o->copy.written)
        o->copy.written(o->copy.arg, t);
    return DDP_OK;
}

ddp_status optim_step(optim *o, float *params, const float *grads, float lr, int t,
                      float grad_scale)
{
    return optim_step_dev(o, params, grads, lr, t, grad_scale, NULL);
}

bool optim_set_copy(optim *o, const optim_copy *c)
{
    bool on = c && c->wc && c->p != DDP_FP32 && o->o.kind == OPTIM_ADAMW &&
              o->ops->adamw_step_cast;
    o->copy = on ? *c : (optim_copy){0};
    o->copy.gather = on && c->gather && c->p == DDP_BF16 && ddp_reducer_zero_stage(o->reducer) > 0;
    return on;
}

bool optim_gathers_copy(const optim *o) { return o->copy.gather; }

ddp_status optim_params_full(optim *o, float *params)
{
    if (!o->params_partial)
        return DDP_OK;
    TRY_OK(ddp_reducer_gather_wait(o->reducer, -1));
    TRY_OK(ddp_reducer_gather_params(o->reducer, params, DDP_FP32));
    o->params_partial = false;
    return DDP_OK;
}

/* The factor clipping puts on the gradients (1 without clipping); computes the norm when asked.
 * Unsharded, both stay on the device: *scale_dev points at the factor there. */
static ddp_status optim_clip(optim *o, const float *g, double *scale, const float **scale_dev)
{
    *scale = 1.0;
    *scale_dev = NULL;
    if (o->o.clip <= 0.0 && !o->o.norm)
        return DDP_OK;
    if (o->clip_dev) {
        TRY_OK(ddp_grad_clip_scale(o->ctx, g, DDP_FP32, o->n, o->o.clip, NULL,
                                   &o->clip_dev->norm, &o->clip_dev->scale));
        o->norm_on_device = true;
        *scale_dev = &o->clip_dev->scale;
        return DDP_OK;
    }
    double norm = 0.0;
    TRY_OK(ddp_grad_norm(o->ctx, g, DDP_FP32, o->n,
                         o->reducer ? DDP_NORM_SHARDED : DDP_NORM_REPLICATED, NULL, &norm));
    o->last_norm = norm;
    if (o->o.clip > 0.0 && o->o.clip / (norm + 1e-6) < 1.0)
        *scale = o->o.clip / (norm + 1e-6);
    return DDP_OK;
}

ddp_status optim_update(optim *o, float *params, float *grads, ddp_scaler *scaler, float lr,
                        long t, int *applied)
{
    float *g = ddp_reducer_zero_stage(o->reducer) == 2 ? ddp_reducer_shard_grads(o->reducer)
                                                       : grads + o->offset;
    *applied = 1;
    if (scaler) /* every rank skips alike; the scale has been lowered */
        TRY_OK(ddp_scaler_unscale_update(scaler, g, DDP_FP32, o->n, applied));
    if (!*applied)
        return DDP_OK;
    double scale = 1.0;
    const float *scale_dev = NULL;
    TRY_OK(optim_clip(o, g, &scale, &scale_dev));
    if (o->n > 0)
        TRY_OK(optim_step_dev(o, params, g, lr, (int)t, (float)scale, scale_dev));
    /* every rank's updated shard to every rank, overlapping the next forward: the parameters, or
     * in bf16 their copy (the passes read only the copy; params whole again by
     * optim_params_full) */
    if (o->reducer && o->copy.gather) {
        /* the copy's storage: 2 bytes, or 4 where the CPU emulates bf16 in floats (no saving) */
        ddp_dtype storage = ops_dtype_size(o->ops, o->copy.p) == 2 ? o->copy.p : DDP_FP32;
        TRY_OK(ddp_reducer_gather_start(o->reducer, o->copy.wc, storage));
        o->params_partial = true;
    } else if (o->reducer) {
        TRY_OK(ddp_reducer_gather_start(o->reducer, params, DDP_FP32));
    }
    return DDP_OK;
}

double optim_last_norm(optim *o)
{
    if (o->norm_on_device) {
        double norm = NAN;
        ddp_status st = ddp_download(o->ctx, &norm, &o->clip_dev->norm, sizeof norm);
        if (st != DDP_OK)
            DDP_WARN("optimizer: the gradient norm could not be read back: %s", ddp_strerror(st));
        o->last_norm = norm;
        o->norm_on_device = false;
    }
    return o->last_norm;
}

void optim_range(const optim *o, size_t *offset, size_t *n)
{
    *offset = o->offset;
    *n = o->n;
}

size_t optim_state_bytes(const optim *o) { return (size_t)o->n_bufs * o->n * sizeof(float); }

int optim_buffers(optim *o, const char **names, float **bufs)
{
    static const char *sgd[] = {"momentum"}, *adamw[] = {"adam_m", "adam_v"};
    for (int i = 0; i < o->n_bufs; i++) {
        names[i] = o->o.kind == OPTIM_ADAMW ? adamw[i] : sgd[i];
        bufs[i] = o->buf[i];
    }
    return o->n_bufs;
}
