/* optim.c - ddp-train's optimizer (optim.h): SGD or AdamW state over this rank's range of the flat
 * layout, stepped through the ops table in runs of slices that share a weight-decay flag.
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

#include "ddp_checkpoint.h" /* ddp_snapshot_fence */
#include "switches.h"

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
    optim_weights w;          /* the model's weights */
    size_t es;                /* bytes per element of their storage */
    bool sr;                  /* bf16 with AdamW: rounded stochastically (optim.h) */
    float *master;            // (n) the fp32 master in 16 bits; NULL in fp32 (the weights)
    int n_mom;
    float *mom[2];            // (n) each: momentum, or the AdamW moments m and v
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

/* The master weight of flat element a (the range's own buffer, or the fp32 weights). */
static float *master_at(const optim *o, size_t a)
{
    return o->master ? o->master + (a - o->offset) : (float *)o->w.w + a;
}

/* The 16-bit weights of flat element a. */
static void *weights_at(const optim *o, size_t a) { return (char *)o->w.w + a * o->es; }

static ddp_status optim_alloc(optim *p)
{
    /* DDP_CLIP_DEVICE=0: the host's norm and factor (run 4's path, models/ops/switches.h) */
    if (!p->reducer && (p->o.clip > 0.0 || p->o.norm) && ops_switch_on(OPS_SW_CLIP_DEVICE)) {
        p->clip_dev = ddp_alloc(p->ctx, sizeof *p->clip_dev);
        if (!p->clip_dev) {
            DDP_ERROR("optimizer: cannot allocate the gradient norm's %zu bytes",
                      sizeof *p->clip_dev);
            return DDP_ERR_NOMEM;
        }
    }
    p->n_mom = p->o.kind == OPTIM_ADAMW ? 2 : 1;
    size_t bytes = (p->n > 0 ? p->n : 1) * sizeof(float);
    for (int i = 0; i < p->n_mom; i++) {
        p->mom[i] = ddp_alloc(p->ctx, bytes);
        if (!p->mom[i] || ddp_zero(p->ctx, p->mom[i], bytes) != DDP_OK) {
            DDP_ERROR("optimizer: cannot allocate %d state buffer(s) of %zu elements", p->n_mom,
                      p->n);
            return DDP_ERR_NOMEM;
        }
    }
    if (p->w.p == DDP_FP32)
        return DDP_OK;
    p->master = ddp_alloc(p->ctx, bytes); /* once from the model's seeded or loaded weights */
    if (!p->master) {
        DDP_ERROR("optimizer: cannot allocate the fp32 master weights of %zu elements", p->n);
        return DDP_ERR_NOMEM;
    }
    return p->n > 0 ? p->ops->cast(p->ops, DDP_FP32, p->master, p->w.p, weights_at(p, p->offset),
                                   p->n)
                    : DDP_OK;
}

ddp_status optim_create(ddp_ctx *ctx, const ops_handle *ops, const optim_opts *o,
                        const size_t *numel, int n_params, ddp_reducer *r, const optim_weights *w,
                        optim **out)
{
    *out = NULL;
    if (!ops || !o || !numel || n_params < 1 || !w || !w->w ||
        (w->p != DDP_FP32 && w->p != DDP_BF16 && w->p != DDP_FP16))
        return DDP_ERR_INVALID_ARG;
    optim *p = calloc(1, sizeof *p);
    if (!p)
        return DDP_ERR_NOMEM;
    *p = (optim){.ctx = ctx, .ops = ops, .o = *o, .w = *w, .es = ops_dtype_size(ops, w->p),
                 .last_norm = NAN};
    p->sr = w->p == DDP_BF16 && o->kind == OPTIM_ADAMW && ops->cast_stochastic;
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
    for (int i = 0; i < o->n_mom; i++)
        ddp_free(o->ctx, o->mom[i]);
    ddp_free(o->ctx, o->master);
    ddp_free(o->ctx, o->clip_dev);
    free(o->runs);
    free(o);
}

/* The 16-bit weights [a, b) from the master as step t writes them (optim.h). */
static ddp_status round_range(optim *o, size_t a, size_t b, long t)
{
    if (!o->master || a >= b)
        return DDP_OK;
    if (o->sr)
        return o->ops->cast_stochastic(o->ops, o->w.p, weights_at(o, a), master_at(o, a), b - a,
                                       o->w.seed, (uint32_t)t, a);
    return o->ops->cast(o->ops, o->w.p, weights_at(o, a), DDP_FP32, master_at(o, a), b - a);
}

/* One run of AdamW: master and 16-bit weights in one pass where the ops can. */
static ddp_status adamw_run(optim *o, const optim_run *u, const float *g, float lr, int t,
                            float grad_scale, const float *scale_dev)
{
    const optim_opts *q = &o->o;
    size_t i = u->a - o->offset, n = u->b - u->a;
    float wd = u->decay ? q->weight_decay : 0.0f;
    if (o->master && o->ops->adamw_step_cast)
        return o->ops->adamw_step_cast(o->ops, master_at(o, u->a), o->mom[0] + i, o->mom[1] + i,
                                       g + i, n, lr, q->beta1, q->beta2, q->eps, wd, t,
                                       grad_scale, scale_dev, o->w.p, weights_at(o, u->a),
                                       o->w.seed, u->a);
    TRY_OK(o->ops->adamw_step(o->ops, master_at(o, u->a), o->mom[0] + i, o->mom[1] + i, g + i, n,
                              lr, q->beta1, q->beta2, q->eps, wd, t, grad_scale, scale_dev));
    return round_range(o, u->a, u->b, t);
}

/* One run of SGD, the same way (its 16-bit weights to nearest even). */
static ddp_status sgd_run(optim *o, const optim_run *u, const float *g, float lr, int t)
{
    const optim_opts *q = &o->o;
    size_t i = u->a - o->offset, n = u->b - u->a;
    float wd = u->decay ? q->weight_decay : 0.0f;
    if (o->master && o->ops->sgd_step_cast)
        return o->ops->sgd_step_cast(o->ops, master_at(o, u->a), o->mom[0] + i, g + i, n, lr,
                                     q->momentum, wd, o->w.p, weights_at(o, u->a));
    TRY_OK(o->ops->sgd_step(o->ops, master_at(o, u->a), o->mom[0] + i, g + i, n, lr, q->momentum,
                            wd));
    return round_range(o, u->a, u->b, t);
}

/* optim_step with AdamW's gradient factor read on the device from scale_dev when it is set. */
static ddp_status optim_step_dev(optim *o, const float *grads, float lr, int t, float grad_scale,
                                 const float *scale_dev)
{
    if (t < 1) {
        DDP_ERROR("optimizer: step %d (the first is 1)", t);
        return DDP_ERR_INVALID_ARG;
    }
    /* a checkpoint's copies of the master and moments (ddp_snapshot_copy, on a side stream) end
     * before this step overwrites them: a wait on the GPU, nothing when none is queued */
    TRY_OK(ddp_snapshot_fence(o->ctx));
    for (int k = 0; k < o->n_runs; k++)
        TRY_OK(o->o.kind == OPTIM_ADAMW
                   ? adamw_run(o, &o->runs[k], grads, lr, t, grad_scale, scale_dev)
                   : sgd_run(o, &o->runs[k], grads, lr, t));
    return DDP_OK;
}

ddp_status optim_step(optim *o, const float *grads, float lr, int t, float grad_scale)
{
    return optim_step_dev(o, grads, lr, t, grad_scale, NULL);
}

/* Under ZeRO, every rank's updated range to every rank, overlapping the next forward: the
 * weights the passes read, in their storage (2 bytes, or 4 where a 16-bit type is emulated in
 * floats). */
static ddp_status gather_start(optim *o)
{
    if (!o->reducer)
        return DDP_OK;
    ddp_dtype storage = o->es == 2 ? o->w.p : DDP_FP32;
    return ddp_reducer_gather_start(o->reducer, o->w.w, storage);
}

ddp_status optim_round(optim *o, long t)
{
    if (o->reducer)
        TRY_OK(ddp_reducer_gather_wait(o->reducer, -1));
    TRY_OK(round_range(o, o->offset, o->offset + o->n, t));
    if (!o->reducer)
        return DDP_OK;
    TRY_OK(gather_start(o));
    return ddp_reducer_gather_wait(o->reducer, -1);
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

ddp_status optim_update(optim *o, float *grads, ddp_scaler *scaler, float lr, long t,
                        int *applied)
{
    float *g = ddp_reducer_zero_stage(o->reducer) == 2 ? ddp_reducer_shard_grads(o->reducer)
                                                       : grads + o->offset;
    *applied = 1;
    if (scaler) /* every rank skips alike; the scale has been lowered */
        TRY_OK(ddp_scaler_unscale_update(scaler, g, DDP_FP32, o->n, applied));
    if (!*applied) { /* the master stays; stochastically rounded weights follow the step */
        if (!o->sr)
            return DDP_OK;
        TRY_OK(round_range(o, o->offset, o->offset + o->n, t));
        return gather_start(o);
    }
    double scale = 1.0;
    const float *scale_dev = NULL;
    TRY_OK(optim_clip(o, g, &scale, &scale_dev));
    if (o->n > 0)
        TRY_OK(optim_step_dev(o, g, lr, (int)t, (float)scale, scale_dev));
    return gather_start(o);
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

size_t optim_state_bytes(const optim *o)
{
    return (size_t)(o->n_mom + (o->master != NULL)) * o->n * sizeof(float);
}

int optim_buffers(optim *o, const char **names, float **bufs)
{
    static const char *sgd[] = {"momentum"}, *adamw[] = {"adam_m", "adam_v"};
    names[0] = "params";
    bufs[0] = master_at(o, o->offset);
    for (int i = 0; i < o->n_mom; i++) {
        names[1 + i] = o->o.kind == OPTIM_ADAMW ? adamw[i] : sgd[i];
        bufs[1 + i] = o->mom[i];
    }
    return 1 + o->n_mom;
}
