/* loop.c - ddp-train's one training loop (loop.h) for every model task.
 *
 * An optimizer step is accum micro-batches: each one's forward pass, then the reducer's
 * micro-step (begun after the forward, which under --zero waits for the parameters' all-gather
 * itself), then the backward pass, whose gradients the reducer averages; then the optimizer
 * (optim.c: it owns the master weights and moments of its range and writes the model's weights)
 * and, under --zero, the start of the weights' all-gather, which overlaps the next forward.
 * Steps per epoch are the task's plan: the tail of an epoch that does not fill a step is skipped.
 * Failures: errors every rank sees alike (bad data, bad configuration, replica mismatch) are agreed
 * on with a collective and every rank exits 1; any other failure after ddp_init aborts the job.
 * SIGUSR1 (Slurm's --signal=USR1@SECONDS) and SIGTERM (the time limit, scancel) stop training. The
 * ranks agree before the optimizer update of every TRAIN_STOP_EVERY-th step, of an epoch's last
 * step, of the last step and of every checkpoint step (every step with --nan-policy skip): one host
 * all-reduce of three counters (SIGUSR1, SIGTERM, "this rank's loss is NaN or inf"), so all stop
 * after the same step; rank 0 writes a checkpoint (--checkpoint-dir) and --save, optionally
 * requeues the Slurm job, and all exit 0. The handlers only set flags. A step does not wait for
 * the GPU otherwise: the loss stays on the device. A NaN/inf loss found at an agreement stops the
 * run with exit 1 before any checkpoint holds it (--nan-policy stop), or leaves the step out on
 * every rank and rolls the loss sum back to its last finite value (skip). Checkpoints hold the
 * whole training state (train_state.c); --resume continues bit-identically.
 */
#include "loop.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_checkpoint.h"
#include "ddp_trace.h"

#define TRAIN_STOP_EVERY 8 /* steps between stop-flag agreements */

void trainer_must(trainer *t, ddp_status st, const char *what) { train_must(t->ctx, st, what); }

/* libddp's ddp_agree; the ranks that did not fail say `then` (what the job does now) unless NULL. */
static ddp_status agree_then(trainer *t, ddp_status local, const char *then)
{
    ddp_status coll, st = ddp_agree(t->ctx, local, then, &coll);
    trainer_must(t, coll, "agreeing on a status");
    return st;
}

ddp_status trainer_agree(trainer *t, ddp_status local) { return agree_then(t, local, "exiting"); }

/* ---- batches, loss, clock -------------------------------------------------------------------- */

void trainer_upload(trainer *t, const void *x, size_t x_bytes, const void *y, size_t y_bytes)
{
    int s = t->slot ^= 1;
    trainer_must(t, ddp_stage_upload(t->ctx, s, 0, t->x_dev[s], x, x_bytes), "uploading inputs");
    trainer_must(t, ddp_stage_upload(t->ctx, s, 1, t->y_dev[s], y, y_bytes), "uploading targets");
    trainer_must(t, ddp_stage_acquire(t->ctx, s), "waiting for the batch upload");
}

void trainer_batch_done(trainer *t)
{
    trainer_must(t, ddp_stage_release(t->ctx, t->slot), "releasing the batch buffers");
}

float trainer_loss_sum(trainer *t)
{
    float sum = 0.0f;
    trainer_must(t, ddp_download(t->ctx, &sum, t->loss_dev, sizeof sum), "downloading the loss");
    return sum;
}

void trainer_loss_reset(trainer *t)
{
    float zero = 0.0f;
    trainer_must(t, ddp_upload(t->ctx, t->loss_dev, &zero, sizeof zero), "zeroing the loss");
    t->loss_ok = 0.0f;
    t->loss_micro = t->micro_ok = 0;
    t->loss_nan = 0;
}

void trainer_clock(trainer *t)
{
    double now = train_now();
    t->train_seconds += now - t->clock;
    t->clock = now;
    t->progress.train_seconds = t->train_seconds;
}

void trainer_clock_restart(trainer *t) { t->clock = train_now(); }

/* --tensorboard, --prometheus: the progress line's figures at step t->step (rank 0). */
static void progress_scalars(trainer *t, double loss)
{
    if (!t->scalars)
        return;
    const progress_bar *p = &t->progress;
    double norm = optim_last_norm(t->opt);
    char rate[64];
    snprintf(rate, sizeof rate, "train/%s_per_second", p->unit);
    ddp_metrics_set(t->scalars, "train/loss", loss, NULL);
    ddp_metrics_set(t->scalars, "train/learning_rate", t->task->lr(t, t->step - 1), NULL);
    ddp_metrics_set(t->scalars, rate, p->rate, NULL);
    if (isfinite(norm)) /* the GPT's (it clips); not computed for MNIST */
        ddp_metrics_set(t->scalars, "train/grad_norm", norm, NULL);
    if (isfinite(p->mfu))
        ddp_metrics_set(t->scalars, "train/mfu_ratio", p->mfu, NULL);
    ddp_metrics_commit(t->scalars, t->step);
}

void trainer_progress(trainer *t, double loss, const char *extra)
{
    trainer_clock(t);
    if (t->rank != 0)
        return;
    snprintf(t->progress.extra, sizeof t->progress.extra, "%s", extra ? extra : "");
    progress_update(&t->progress, t->step, t->epoch, loss);
    progress_scalars(t, loss);
}

void trainer_progress_steady(trainer *t, double flops_per_step, double peak_flops)
{
    progress_bar *p = &t->progress;
    p->first_step = t->start.step;
    p->base_step = t->step;
    p->base_seconds = p->train_seconds = t->train_seconds;
    p->flops_per_step = flops_per_step;
    p->peak_flops = peak_flops;
}

void trainer_progress_end(trainer *t) { progress_end(&t->progress); }

void trainer_progress_eval(trainer *t, double seconds, long every)
{
    progress_end(&t->progress);
    t->progress.eval_seconds = seconds;
    t->progress.eval_every = every;
}

void trainer_params_ready(trainer *t)
{
    if (ddp_reducer_zero_stage(t->reducer) > 0) /* --zero 0 gathers nothing */
        trainer_must(t, ddp_reducer_gather_wait(t->reducer, -1), "gathering the parameters");
}

/* --metrics: a new file; with --resume the lines go after the earlier runs' (a requeued or
 * resumed job keeps its whole curve; mark_restart says where each run began). --tensorboard and
 * --prometheus: created or checked now, so a bad one stops the job before training. */
static ddp_status open_metrics(trainer *t)
{
    const train_opts *o = t->o;
    ddp_metrics_opts mo = {.tensorboard_dir = o->tensorboard_dir, .prometheus_path =
                           o->prometheus_path, .prometheus_interval_s = 1.0,
                           .tensorboard_what = "--tensorboard", .prometheus_what = "--prometheus"};
    if (t->rank != 0)
        return DDP_OK;
    if (o->metrics_path &&
        !(t->metrics = jsonl_open(o->metrics_path, o->resume != NULL, "--metrics")))
        return DDP_ERR_IO;
    return o->tensorboard_dir || o->prometheus_path ? ddp_metrics_open(&mo, &t->scalars) : DDP_OK;
}

/* ---- build ----------------------------------------------------------------------------------- */

ddp_status trainer_verify(trainer *t, const char *when)
{
    const train_buffers *b = &t->setup.buf;
    float *host = malloc(b->numel * sizeof *host);
    trainer_must(t, host ? DDP_OK : DDP_ERR_NOMEM, "allocating the parameter copy");
    trainer_must(t, ops_weights_get(t->ops, t->precision, host, t->weights, b->numel),
                 "downloading the weights");
    ddp_status st = ddp_verify_replicas(t->ctx, b->descs, b->n_params, host);
    free(host);
    if (st != DDP_OK && st != DDP_ERR_MISMATCH)
        trainer_must(t, st, "verifying replicas");
    if (st == DDP_OK && t->rank == 0 && when)
        printf("replicas identical %s (checksums of every parameter agree)\n", when);
    return st;
}

/* The reducer over the view's gradients: ZeRO's stage, the ready order for bucket-owned ones. */
static ddp_status build_reducer(trainer *t, const train_view *v)
{
    const train_opts *o = t->o;
    ddp_reducer_opts ro;
    ddp_reducer_opts_default(&ro);
    ro.bucket_mb = o->bucket_mb;
    ro.first_bucket_mb = o->first_bucket_mb;
    ro.comm_dtype = o->grad_dtype;
    ro.defer_launch = o->no_overlap;
    ro.strict_order = v->strict_order;
    ro.zero_stage = o->zero;
    /* --zero 1: parameter-order buckets. A bucket rebuilt in ready order is several runs of a
     * layout that is not in backward order, which a reduce-scatter needs packed: the reducer's
     * packing buffer is as large as the gradients, more than sharding saves at 2 ranks.
     * --zero 2: the reducer owns the gradients, in buckets planned in the order backward marks,
     * whose buffers pack their runs themselves. */
    ro.static_buckets = o->zero == 1 && v->ready_order;
    if (v->reducer_grads) {
        ro.ready_order = v->ready_order;
        /* --zero-accum local (default): micro-steps add in the bucket buffers, one
         * reduce-scatter per optimizer step, stage 0's sums; reduce: one per micro-step */
        ro.local_accum = !v->reduce_each_micro && (t->accum > 1 || t->micro_total);
    }
    ro.micro_total = t->micro_total; /* uneven shares: every rank scales by the global count */
    return trainer_agree(t, ddp_reducer_create(t->ctx, v->reducer_grads ? NULL : v->grads,
                                               v->numel, v->n_params, &ro, &t->reducer));
}

static ddp_status build_scaler(trainer *t)
{
    if (t->o->grad_dtype != DDP_FP16 && t->precision != DDP_FP16)
        return DDP_OK;
    ddp_scaler_opts so;
    ddp_scaler_opts_default(&so);
    so.init_scale = t->o->loss_scale_init;
    so.growth_interval = t->o->loss_scale_interval;
    return trainer_agree(t, ddp_scaler_create(t->ctx, &so, &t->scaler));
}

static void alloc_slots(trainer *t, const train_view *v)
{
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        t->x_dev[i] = ddp_alloc(t->ctx, v->x_bytes);
        t->y_dev[i] = ddp_alloc(t->ctx, v->y_bytes);
        ok = ok && t->x_dev[i] && t->y_dev[i];
    }
    t->loss_dev = ddp_alloc(t->ctx, sizeof *t->loss_dev);
    trainer_must(t, ok && t->loss_dev ? DDP_OK : DDP_ERR_NOMEM, "allocating batch buffers");
}

/* Model, replica check, reducer, optimizer, scaler and batch slots; agreed on by every rank. */
static ddp_status build(trainer *t, train_view *v)
{
    ddp_status st = trainer_agree(t, ops_open(t->ctx, t->o->threads, &t->ops));
    if (st == DDP_OK)
        st = trainer_agree(t, ops_cuda_set_tf32(t->ops, t->o->tf32));
    if (st == DDP_OK)
        st = t->task->build(t, v);
    if (st != DDP_OK)
        return st;
    t->precision = v->precision;
    t->weights = v->weights;
    t->grads = v->grads;
    t->setup.buf = (train_buffers){.descs = v->descs, .n_params = v->n_params,
                                   .numel = v->numel_total, .precision = v->precision};
    memcpy(t->setup.buf.model_fp, v->model_fp, sizeof v->model_fp);
    if (t->o->broadcast_init) /* the weights' bytes, whatever their type */
        trainer_must(t, ddp_broadcast(t->ctx, v->weights,
                                      v->numel_total * ops_dtype_size(t->ops, v->precision), 0),
                     "broadcasting the weights");
    TRY_OK(trainer_verify(t, NULL));
    TRY_OK(build_reducer(t, v));
    v->optim.decays = v->decays;
    if (!t->no_training) { /* no step: no optimizer state */
        optim_weights w = {.w = v->weights, .p = v->precision, .seed = v->round_seed};
        TRY_OK(trainer_agree(t, optim_create(t->ctx, t->ops, &v->optim, v->numel, v->n_params,
                                             t->reducer, &w, &t->opt)));
        train_buffers_of_optim(t->opt, &t->setup.buf);
    }
    if (t->task->attach)
        t->task->attach(t);
    TRY_OK(build_scaler(t));
    alloc_slots(t, v);
    progress_init(&t->progress, t->o->log_every, t->total_steps, v->samples_per_step);
    t->progress.unit = v->unit;
    return DDP_OK;
}

/* Rank 0, after --resume: a metrics line where this run begins (resumed or fresh), and the
 * progress rate counted from here; a checkpoint at the end of the plan is said to be one. */
static void mark_restart(trainer *t, int resumed)
{
    t->progress.first_step = t->progress.base_step = t->start.step;
    ddp_metrics_set(t->scalars, "world_size", t->world, NULL);
    ddp_metrics_commit(t->scalars, t->start.step); /* TensorBoard: the run (re)starts here */
    if (t->rank != 0 || !t->o->resume)
        return;
    if (t->metrics)
        jsonl_line(t->metrics, "{\"restart\":true,\"resumed\":%s,\"step\":%ld,"
                     "\"total_steps\":%ld,\"world_size\":%d}\n", resumed ? "true" : "false",
                     t->start.step, t->total_steps, t->world);
    if (resumed && t->start.step >= t->total_steps)
        printf("the checkpoint is at step %ld, the end of this run's plan (%ld steps): nothing left "
               "to train (raise --max-steps or --epochs to go on); evaluating and saving\n",
               t->start.step, t->total_steps);
}

/* The task's learning rate at step (0-based) had the run been planned over total_steps. */
static double lr_over_plan(void *arg, long step, long total_steps)
{
    trainer *t = arg;
    long planned = t->total_steps;
    t->total_steps = total_steps;
    double lr = t->task->lr(t, step);
    t->total_steps = planned;
    return lr;
}

/* Inputs, step plan, output folders, model, and the resumed position; agreed on by every rank. */
static ddp_status prepare(trainer *t)
{
    train_view v = {0};
    train_plan plan = {.accum = 1};
    ddp_status st = trainer_agree(t, open_metrics(t));
    if (st == DDP_OK)
        st = t->task->open(t, &plan);
    t->steps_per_epoch = plan.steps_per_epoch;
    t->accum = plan.accum;
    t->micro_total = plan.micro_total;
    t->n_train = plan.n_train;
    t->no_training = plan.no_training;
    t->fixed = plan.fixed;
    t->total_steps = t->steps_per_epoch * t->o->epochs;
    if (t->o->max_steps > 0 && t->o->max_steps < t->total_steps)
        t->total_steps = t->o->max_steps;
    if (t->no_training)
        t->total_steps = 0;
    if (st == DDP_OK)
        st = trainer_agree(t, t->rank == 0 ? train_check_outputs(t->o, plan.output_flags,
                                                                 plan.outputs, 2)
                                           : DDP_OK);
    if (st == DDP_OK)
        st = build(t, &v);
    free(v.ready_order);
    free(v.decays);
    if (st != DDP_OK)
        return st;
    train_buffers buf = t->setup.buf;
    t->setup = (train_setup){.ctx = t->ctx, .o = t->o, .buf = buf, .n_train = t->n_train,
                             .steps_per_epoch = t->steps_per_epoch,
                             .total_steps = t->total_steps, .accum = t->accum,
                             .fixed = t->fixed, .scaler = t->scaler,
                             .lr = lr_over_plan, .lr_arg = t};
    int resumed = 0;
    st = train_resume(&t->setup, &t->start, &resumed);
    t->step = t->start.step;
    t->epoch = (int)t->start.epoch;
    t->in_epoch = t->start.step_in_epoch;
    t->saved_step = resumed ? t->step : -1;
    if (st == DDP_OK && resumed) /* the weights from the master loaded, as step t wrote them */
        trainer_must(t, optim_round(t->opt, t->step), "rounding the resumed weights");
    if (st == DDP_OK)
        mark_restart(t, resumed);
    if (st == DDP_OK)
        train_rescue_arm(&t->setup, &t->start);
    return st;
}

/* ---- one step -------------------------------------------------------------------------------- */

/* The factor on the loss of this micro-batch's backward pass: the loss scaler's scale (fp16), or
 * inf on the rank and step --inject-inf names (a test of the scaler's agreement), else 1. */
static float loss_scale(const trainer *t)
{
    float scale = t->scaler ? (float)ddp_scaler_scale(t->scaler) : 1.0f;
    for (int i = 0; i < t->o->n_inject; i++)
        if (t->o->inject_rank[i] == t->rank && t->o->inject_step[i] == t->step)
            scale = INFINITY;
    return scale;
}

/* Whether the ranks agree before the update of the step being done (see the top of the file). */
static int agree_due(const trainer *t)
{
    const train_opts *o = t->o;
    long next = t->step + 1;
    return o->nan_skip || next % TRAIN_STOP_EVERY == 0 || t->in_epoch + 1 == t->steps_per_epoch ||
           next == t->total_steps ||
           (o->checkpoint_dir && o->checkpoint_every && next % o->checkpoint_every == 0);
}

/* Whether the loss summed since the last agreement is NaN or inf. With --nan-policy skip the sum
 * goes back to its last finite value, so the next steps are judged alone. */
static int loss_nonfinite(trainer *t)
{
    float sum = trainer_loss_sum(t);
    if (isfinite(sum)) {
        t->loss_ok = sum;
        t->micro_ok = t->loss_micro;
        return 0;
    }
    if (t->o->nan_skip) {
        trainer_must(t, ddp_upload(t->ctx, t->loss_dev, &t->loss_ok, sizeof t->loss_ok),
                     "resetting the loss sum");
        t->loss_micro = t->micro_ok;
        t->loss_nan = 1;
    }
    return 1;
}

/* After the gradients are reduced and before they are applied: did any rank get SIGUSR1 or
 * SIGTERM, or a NaN/inf loss? Returns the number of ranks whose loss was not finite. */
static int64_t agree_step(trainer *t)
{
    int64_t flags[3] = {*t->sig.usr1 != 0, *t->sig.term != 0, loss_nonfinite(t)};
    trainer_must(t, ddp_allreduce_host(t->ctx, flags, 3, DDP_INT64, DDP_SUM), "agreeing on a stop");
    if ((flags[0] > 0 || flags[1] > 0) && !t->stopped) {
        if (t->rank == 0) {
            progress_end(&t->progress);
            printf("%s received: every rank stops after step %ld\n",
                   flags[1] > 0 ? "SIGTERM" : "SIGUSR1", t->step + 1);
            fflush(stdout);
        }
        DDP_INFO("stop agreed: this rank stops after step %ld", t->step + 1);
        t->stopped = 1;
    }
    return flags[2];
}

/* A step whose loss was NaN or inf on `ranks` ranks: it is not applied; --nan-policy stop ends
 * training. */
static void on_nonfinite(trainer *t, int64_t ranks)
{
    if (t->rank == 0)
        progress_end(&t->progress);
    if (t->o->nan_skip) {
        if (t->rank == 0)
            DDP_WARN("step %ld: the loss is NaN or inf on %lld rank(s): the step is not applied "
                     "(--nan-policy skip)", t->step + 1, (long long)ranks);
        /* the weights rounded from the master as this step would have, as a run resumed after
         * it rounds them (every rank skips alike) */
        trainer_must(t, optim_round(t->opt, t->step + 1), "rounding the weights");
        return;
    }
    if (t->rank == 0)
        DDP_ERROR("step %ld: the loss became NaN or inf on %lld rank(s): training stops (exit 1); "
                  "lower --lr, or pass --nan-policy skip to leave such steps out", t->step + 1,
                  (long long)ranks);
    t->nan_stopped = 1;
}

static void update(trainer *t)
{
    int applied = 0;
    ddp_trace_begin("optimizer", t->step);
    ddp_watch_where(t->step + 1, -1, "optimizer");
    float lr = (float)t->task->lr(t, t->step);
    trainer_must(t, optim_update(t->opt, t->grads, t->scaler, lr, t->step + 1, &applied),
                 "the optimizer step");
    ddp_trace_end("optimizer", t->step);
    int64_t skipped = t->scaler ? ddp_scaler_skipped_steps(t->scaler) : 0;
    if (!applied && skipped <= (int64_t)(sizeof t->skipped / sizeof t->skipped[0]))
        t->skipped[skipped - 1] = t->step;
}

ddp_status trainer_plan_global(const trainer *t, train_plan *p, train_fixed_batch f, long micro,
                               const char *what)
{
    long v = f.value / micro;
    if (f.flag && (f.value % micro != 0 || v < t->world)) {
        int few = v < t->world;
        DDP_LOG_(DDP_LOG_ERROR, 1, "--%s %ld %s %s = %ld %s%s: use a multiple of %ld%s", f.flag,
                 f.value, few ? "has fewer micro-batches of" : "is not a multiple of", what, micro,
                 f.unit, few ? " than ranks" : "", micro, few ? " at least that x ranks"
                 : " (the ranks share them, unevenly where needed)");
        return DDP_ERR_INVALID_ARG;
    }
    if (f.flag) {
        p->accum = (int)((v - t->rank + t->world - 1) / t->world);
        p->micro_total = v % t->world != 0 ? (int)v : 0;
        p->fixed = f;
    }
    return DDP_OK;
}

void trainer_data(trainer *t, uint64_t fp, long n)
{
    t->data_fp += fp;
    t->data_n += n;
}

/* --metrics: the step's data fingerprint and samples summed over the ranks (32-bit halves). */
static void report_data(trainer *t)
{
    if (!t->o->metrics_path)
        return;
    int64_t v[3] = {(int64_t)(t->data_fp & 0xffffffffu), (int64_t)(t->data_fp >> 32), t->data_n};
    trainer_must(t, ddp_allreduce_host(t->ctx, v, 3, DDP_INT64, DDP_SUM),
                 "summing the data's fingerprint");
    uint64_t fp = ((uint64_t)v[1] << 32) + (uint64_t)v[0];
    if (t->metrics)
        jsonl_line(t->metrics, "{\"data_step\":%ld,\"data_fp\":\"%016llx\",\"samples\":%lld}\n",
                   t->step + 1, (unsigned long long)fp, (long long)v[2]);
}

/* One optimizer step over the next accum micro-batches. A NaN/inf loss on any rank, or (with a
 * loss scaler) inf/NaN gradients, leave the step out on every rank alike. */
static void train_step(trainer *t)
{
    const train_task *k = t->task;
    t->data_fp = 0;
    t->data_n = 0;
    trainer_must(t, k->zero_grad(t), "zeroing gradients");
    for (int micro = 0; micro < t->accum; micro++) {
        ddp_trace_begin("data", micro);
        ddp_watch_where(t->step + 1, micro, "data");
        k->batch(t);
        ddp_trace_end("data", micro);
        ddp_trace_begin("forward", micro);
        ddp_watch_where(t->step + 1, micro, "forward");
        k->forward(t);
        ddp_trace_end("forward", micro);
        trainer_must(t, ddp_reducer_begin(t->reducer, micro == t->accum - 1), "starting the reducer");
        ddp_trace_begin("backward", micro);
        ddp_watch_where(t->step + 1, micro, "backward");
        k->backward(t, loss_scale(t));
        trainer_batch_done(t);
        ddp_trace_end("backward", micro);
        t->loss_micro++;
    }
    ddp_watch_where(t->step + 1, -1, "gradient sync");
    trainer_must(t, ddp_reducer_finish(t->reducer), "reducing gradients");
    ddp_watch_where(t->step + 1, -1, "end of step");
    report_data(t);
    int64_t bad = agree_due(t) ? agree_step(t) : 0;
    ddp_rescue_hold(); /* the state changes: no rescue snapshot until train_epoch releases it */
    if (bad > 0)
        on_nonfinite(t, bad);
    else
        update(t);
}

/* ---- checkpoints and the epochs -------------------------------------------------------------- */

/* Rank 0 writes a checkpoint of the position, every rank joining (the shards' gather); every rank
 * learns the outcome. A failure ends training unless --checkpoint-errors warn. */
static void write_checkpoint(trainer *t)
{
    train_pos pos = {.step = t->step, .epoch = t->epoch, .step_in_epoch = t->in_epoch};
    trainer_clock(t);
    ddp_trace_begin("checkpoint", t->step);
    ddp_watch_where(t->step, -1, "checkpoint");
    if (t->rank == 0)
        progress_end(&t->progress);
    ddp_status st = train_checkpoint(&t->setup, &pos); /* collective */
    ddp_trace_end("checkpoint", t->step);
    t->saved_step = t->step;
    t->clock = train_now();
    /* with warn, rank 0's report (train_checkpoint) is the one message: the others go on quietly */
    if (agree_then(t, st, t->o->checkpoint_errors_warn ? NULL : "exiting") != DDP_OK &&
        !t->o->checkpoint_errors_warn)
        t->save_failed = 1;
}

/* DDP_PROFILE_STEP=N: a profiler started with its capture off (ncu --profile-from-start off)
 * records the kernels of step N (1-based) alone (ddp_profiler_range); 0 without it. */
static long profile_step(trainer *t)
{
    const char *env = getenv("DDP_PROFILE_STEP");
    char *end = NULL;
    long step = env ? strtol(env, &end, 10) : 0;
    if (env && (end == env || *end || step < 1)) {
        DDP_ERROR("DDP_PROFILE_STEP=%s: expected a step number >= 1 (the step a profiler records)",
                  env);
        ddp_abort(t->ctx, 1);
    }
    return step;
}

/* The steps of one epoch from t->in_epoch on. */
static void train_epoch(trainer *t, long prof)
{
    const train_opts *o = t->o;
    while (t->in_epoch < t->steps_per_epoch && t->step < t->total_steps) {
        if (t->step + 1 == prof)
            trainer_must(t, ddp_profiler_range(t->ctx, 1), "starting the profiler's range");
        ddp_straggler_step_begin(t->straggler);
        ddp_trace_begin("step", t->step);
        train_step(t);
        ddp_trace_end("step", t->step);
        if (t->step + 1 == prof)
            trainer_must(t, ddp_profiler_range(t->ctx, 0), "stopping the profiler's range");
        if (!t->nan_stopped) {
            t->step++;
            t->in_epoch++;
        }
        train_rescue_release(&(train_pos){.step = t->step, .epoch = t->epoch,
                                          .step_in_epoch = t->in_epoch});
        if (t->nan_stopped)
            return;
        trainer_must(t, ddp_straggler_step_end(t->straggler, t->step, NULL), "timing the step");
        t->task->after_step(t);
        if (o->checkpoint_dir && (t->stopped || (o->checkpoint_every && t->step % o->checkpoint_every == 0)))
            write_checkpoint(t);
        if (t->stopped || t->save_failed)
            return;
    }
}

/* The epochs from the start position to the planned (or stopped) end. */
static void train_epochs(trainer *t)
{
    long prof = profile_step(t);
    ddp_straggler_opts so = {.every = t->o->straggler_every, .threshold = t->o->straggler_threshold,
                             .cpu_share = DDP_STRAGGLER_CPU_SHARE, .times = DDP_STRAGGLER_TIMES,
                             .out = stdout, .json_fd = jsonl_fd(t->metrics), .metrics = t->scalars};
    trainer_must(t, ddp_straggler_create(t->ctx, &so, &t->straggler), "starting the straggler table");
    t->clock = train_now();
    for (t->epoch = (int)t->start.epoch; t->epoch < t->o->epochs && t->step < t->total_steps &&
                                         !t->stopped && !t->nan_stopped && !t->save_failed;
         t->epoch++) {
        t->in_epoch = t->epoch == t->start.epoch ? t->start.step_in_epoch : 0;
        t->task->epoch_begin(t);
        train_epoch(t, prof);
        t->task->epoch_end(t);
        if (t->stopped || t->nan_stopped || t->save_failed || t->in_epoch < t->steps_per_epoch)
            break; /* the position stays inside this epoch (a plan that ends in it) */
    }
    if (t->in_epoch >= t->steps_per_epoch && !t->stopped && !t->nan_stopped && !t->save_failed)
        t->in_epoch = 0; /* a whole epoch done: the end's checkpoint is at the next one's start, so
                            a run extended from it (a larger --max-steps) goes on as a straight one */
    trainer_clock(t);
}

/* ---- the end --------------------------------------------------------------------------------- */

/* Every rank: the steps its loss scaler skipped and the final scale (tests compare the ranks). */
static void report_scaler(const trainer *t)
{
    if (!t->scaler)
        return;
    char list[256] = "";
    int64_t n = ddp_scaler_skipped_steps(t->scaler);
    size_t cap = sizeof t->skipped / sizeof t->skipped[0], shown = (size_t)n < cap ? (size_t)n : cap;
    for (size_t i = 0, len = 0; i < shown && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%ld", i ? "," : "", t->skipped[i]);
    DDP_INFO("loss scaler: %lld step(s) skipped for inf/NaN [%s], final scale %g", (long long)n,
             list, ddp_scaler_scale(t->scaler));
}

/* The final checkpoint, --save and the task's own outputs; every rank learns the outcome. */
static ddp_status save(trainer *t)
{
    const train_opts *o = t->o;
    if (o->checkpoint_dir && t->saved_step != t->step)
        write_checkpoint(t);
    if (t->save_failed)
        return DDP_ERR_IO;
    ddp_status st = DDP_OK;
    ddp_trace_begin("checkpoint", 0);
    if (o->save_path) {
        train_pos pos = {.step = t->step, .epoch = t->epoch, .step_in_epoch = t->in_epoch};
        st = train_save_state(&t->setup, &pos, o->save_path); /* collective */
    }
    if (t->rank == 0 && o->save_path) {
        if (st != DDP_OK) /* errno: the system's reason of a failed write (train_save_state) */
            DDP_ERROR("--save %s: %s", o->save_path,
                      st == DDP_ERR_IO && errno ? strerror(errno) : ddp_strerror(st));
        else
            printf("saved %s\n", o->save_path);
    }
    ddp_trace_end("checkpoint", 0);
    if (st == DDP_OK && t->task->after_save) /* every rank: none waits for rank 0's sampling */
        st = t->task->after_save(t);
    return trainer_agree(t, st);
}

/* Training, the reports, the replica check and the saves. */
static ddp_status train_and_finish(trainer *t)
{
    train_epochs(t);
    trainer_must(t, ddp_straggler_finish(t->straggler, NULL), "the straggler table's summary");
    trainer_params_ready(t);
    if (t->nan_stopped || t->save_failed)
        return t->nan_stopped ? DDP_ERR_STATE : DDP_ERR_IO;
    report_scaler(t);
    ddp_status st = t->task->report_end(t);
    if (st == DDP_OK) /* --sample-only: the check, without a word of training */
        st = trainer_verify(t, t->no_training ? NULL : "after training");
    return st == DDP_OK ? save(t) : st;
}

static void release(trainer *t)
{
    if (t->task->release)
        t->task->release(t);
    jsonl_close(t->metrics);
    ddp_metrics_close(t->scalars);
    ddp_straggler_destroy(t->straggler);
    for (int i = 0; i < 2; i++) {
        ddp_free(t->ctx, t->x_dev[i]);
        ddp_free(t->ctx, t->y_dev[i]);
    }
    ddp_free(t->ctx, t->loss_dev);
    optim_destroy(t->opt);
    ddp_reducer_destroy(t->reducer);
    ddp_scaler_destroy(t->scaler);
    ops_close(t->ops);
    free(t->state);
}

ddp_status train_run(ddp_ctx *ctx, const train_opts *o, const train_task *task,
                     train_signals sig, int *requeue)
{
    trainer t = {.ctx = ctx, .o = o, .task = task, .sig = sig, .rank = ddp_rank(ctx),
                 .world = ddp_world_size(ctx), .accum = o->accum, .wall_start = train_now(),
                 .state = calloc(1, task->state_bytes)};
    trainer_must(&t, t.state ? DDP_OK : DDP_ERR_NOMEM, "allocating the trainer");
    ddp_status st = prepare(&t);
    if (st == DDP_OK)
        st = train_observe_start(ctx, o);
    if (st == DDP_OK) {
        task->report_start(&t);
        st = train_and_finish(&t);
        ddp_status trace_st = train_observe_end(ctx, o);
        st = st == DDP_OK ? trace_st : st;
    }
    *requeue = st == DDP_OK && t.stopped && o->requeue && t.rank == 0 && getenv("SLURM_JOB_ID");
    release(&t);
    return st;
}
