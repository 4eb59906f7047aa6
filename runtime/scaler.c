/* scaler.c - dynamic loss scaling (torch.cuda.amp.GradScaler's semantics) with the inf/NaN
 * decision agreed across ranks, so every replica skips the same optimizer steps.
 *
 * State: the scale and the growth tracker (finite steps since the scale last changed). One step:
 * find inf/NaN in this rank's averaged gradients, MAX-all-reduce the flag over ranks (host
 * memory, one int64), then either back off (skip) or unscale and maybe grow. On CUDA the check
 * and the unscaling run on opts.stream (NULL: libddp's), where the gradients were finished.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "convert.h"
#include "internal.h"

struct ddp_scaler {
    ddp_ctx *ctx;
    ddp_scaler_opts opts;
    double scale;
    int64_t growth_tracker;
    int64_t skipped;
};

void ddp_scaler_opts_default(ddp_scaler_opts *opts)
{
    if (!opts)
        return;
    opts->init_scale = 65536.0;
    opts->growth_factor = 2.0;
    opts->backoff_factor = 0.5;
    opts->growth_interval = 2000;
    opts->stream = NULL;
}

static int scale_ok(double scale)
{
    return isfinite(scale) && scale > 0.0;
}

static ddp_status scaler_check_opts(const ddp_scaler_opts *o)
{
    const char *bad = !scale_ok(o->init_scale)                         ? "init_scale > 0"
                      : !(o->growth_factor > 1.0 && isfinite(o->growth_factor)) ? "growth_factor > 1"
                      : !(o->backoff_factor > 0.0 && o->backoff_factor < 1.0) ? "0 < backoff_factor < 1"
                      : o->growth_interval < 1                               ? "growth_interval >= 1"
                                                                             : NULL;
    if (!bad)
        return DDP_OK;
    DDP_ERROR("ddp_scaler_create: options need %s (got init_scale %g, growth_factor %g, "
              "backoff_factor %g, growth_interval %lld); ddp_scaler_opts_default() gives "
              "GradScaler's 65536, 2, 0.5, 2000", bad, o->init_scale, o->growth_factor,
              o->backoff_factor, (long long)o->growth_interval);
    return DDP_ERR_INVALID_ARG;
}

ddp_status ddp_scaler_create(ddp_ctx *ctx, const ddp_scaler_opts *opts, ddp_scaler **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    ddp_scaler_opts defaults;
    ddp_scaler_opts_default(&defaults);
    const ddp_scaler_opts *o = opts ? opts : &defaults;
    if (!ctx) {
        DDP_ERROR("ddp_scaler_create: no context (call ddp_init first)");
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = scaler_check_opts(o);
    if (st != DDP_OK)
        return st;
    ddp_scaler *s = calloc(1, sizeof *s);
    if (!s) {
        DDP_ERROR("ddp_scaler_create: out of memory");
        return DDP_ERR_NOMEM;
    }
    *s = (ddp_scaler){.ctx = ctx, .opts = *o, .scale = o->init_scale};
    *out = s;
    return DDP_OK;
}

void ddp_scaler_destroy(ddp_scaler *s)
{
    free(s);
}

double ddp_scaler_scale(const ddp_scaler *s)
{
    return s ? s->scale : 0.0;
}

/* Every rank learns whether any rank found inf/NaN. Collective. */
static ddp_status scaler_agree(ddp_scaler *s, void *grads, ddp_dtype dtype, size_t n,
                               int *any_inf)
{
    int found = 0;
    ddp_status st = convert_dev_nonfinite(s->ctx, grads, dtype, n, &found, s->opts.stream);
    int64_t flag = st != DDP_OK ? 1 : found; /* a failed check still joins the collective */
    ddp_status agreed = ddp_allreduce_host(s->ctx, &flag, 1, DDP_INT64, DDP_MAX);
    if (st == DDP_OK)
        st = agreed;
    *any_inf = flag != 0;
    return st;
}

static void scaler_update(ddp_scaler *s, int any_inf)
{
    if (any_inf) {
        s->scale *= s->opts.backoff_factor;
        s->growth_tracker = 0;
        s->skipped++;
        return;
    }
    if (++s->growth_tracker == s->opts.growth_interval) {
        double grown = s->scale * s->opts.growth_factor;
        if (isfinite(grown) && grown <= FLT_MAX) /* as PyTorch: never grow to inf */
            s->scale = grown;
        s->growth_tracker = 0;
    }
}

ddp_status ddp_scaler_unscale_update(ddp_scaler *s, void *grads, ddp_dtype dtype, size_t n,
                                     int *step_ok)
{
    if (!step_ok)
        return DDP_ERR_INVALID_ARG;
    *step_ok = 0;
    if (!s || (!grads && n > 0) || !convert_dtype_is_grad(dtype)) {
        DDP_ERROR("ddp_scaler_unscale_update: need a scaler and gradients of type fp32, bf16 or "
                  "fp16 (got type %s)", ddp_dtype_name(dtype));
        return DDP_ERR_INVALID_ARG;
    }
    int any_inf = 0;
    ddp_status st = scaler_agree(s, grads, dtype, n, &any_inf);
    if (st == DDP_OK && !any_inf)
        st = convert_dev_scale(s->ctx, grads, dtype, n, (float)(1.0 / s->scale), s->opts.stream);
    if (st != DDP_OK)
        return st;
    if (any_inf)
        DDP_INFO0("loss scaler: inf/NaN in the gradients of at least one rank: step skipped on "
                  "every rank, scale %g -> %g", s->scale, s->scale * s->opts.backoff_factor);
    scaler_update(s, any_inf);
    *step_ok = !any_inf;
    return DDP_OK;
}

ddp_status ddp_scaler_get_state(const ddp_scaler *s, double *scale, int64_t *growth_tracker)
{
    if (!s || !scale || !growth_tracker)
        return DDP_ERR_INVALID_ARG;
    *scale = s->scale;
    *growth_tracker = s->growth_tracker;
    return DDP_OK;
}

ddp_status ddp_scaler_set_state(ddp_scaler *s, double scale, int64_t growth_tracker)
{
    if (!s)
        return DDP_ERR_INVALID_ARG;
    if (!scale_ok(scale) || growth_tracker < 0 || growth_tracker >= s->opts.growth_interval) {
        DDP_ERROR("ddp_scaler_set_state: need a positive finite scale and a growth tracker in "
                  "[0, %lld), got scale %g and tracker %lld (a checkpoint written with another "
                  "--loss-scale-interval? restore with the same interval)",
                  (long long)s->opts.growth_interval, scale, (long long)growth_tracker);
        return DDP_ERR_INVALID_ARG;
    }
    s->scale = scale;
    s->growth_tracker = growth_tracker;
    return DDP_OK;
}

int64_t ddp_scaler_skipped_steps(const ddp_scaler *s)
{
    return s ? s->skipped : 0;
}
