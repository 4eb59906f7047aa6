/* ddp_train.c - ddp-train: data-parallel training of the reference models with libddp: the MNIST
 * models here, GPT-2 on token shards in train_gpt.c.
 *
 * Every rank loads the data and builds the same seeded model; the sampler gives each rank its
 * shard; gradients are averaged by the bucketed reducer during the backward pass.
 * Steps per epoch = floor(per-rank samples / (batch * accum)): the tail of an epoch that does not
 * fill a whole optimizer step is skipped (the permutation changes every epoch when shuffling).
 * Failures: errors every rank sees alike (bad data, bad configuration, replica mismatch) are agreed
 * on with a collective and every rank exits 1; any other failure after ddp_init aborts the job.
 * SIGUSR1 (Slurm's --signal=USR1@SECONDS before the time limit) and SIGTERM (the time limit itself,
 * scancel; SIGUSR2 means the same, as ddp-launch -n N sends it through mpirun) stop training. The ranks agree before the optimizer step of every DDP_TRAIN_STOP_EVERY-th
 * step, of an epoch's last step, of the last step and of every checkpoint step (every step with
 * --nan-policy skip): one host all-reduce of three counters (SIGUSR1, SIGTERM, "this rank's loss is
 * NaN or inf"), so all stop after the same step; rank 0 writes a checkpoint (--checkpoint-dir) and
 * --save, optionally requeues the Slurm job, and all exit 0. The handlers only set flags, so a second
 * signal during a save changes nothing. A step does not wait for the GPU otherwise: the loss stays
 * on the device (its sum is downloaded at agreements, for progress lines and at the end of an epoch).
 * A NaN/inf loss found at an agreement stops the run with exit 1 before any checkpoint holds it.
 * Checkpoints hold the whole training state (train_state.c); --resume continues bit-identically.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_isa.h"
#include "ddp.h"
#include "layers.h"
#include "malloc_policy.h"
#include "mnist.h"
#include "model.h"
#include "prefetch.h"
#include "train_gpt.h"
#include "train_opts.h"
#include "train_report.h"
#include "train_trace.h"
#include "train_state.h"

#define DDP_TRAIN_STOP_EVERY 8 /* steps between stop-flag agreements */

typedef struct trainer {
    ddp_ctx *ctx;
    const train_opts *o;
    int rank, world;
    model_mnist train, test;
    ops_handle *ops; /* the models' compute on this context's backend */
    model *model;
    ddp_reducer *reducer;
    ddp_scaler *scaler;    /* --grad-dtype fp16: dynamic loss scaling; else NULL */
    ddp_sampler *sampler;
    model_prefetch *prefetch; /* training batches, made ahead by --workers threads */
    size_t *eval_idx;  /* (batch) test indices of one evaluation batch */
    int *pred;         /* (batch) predicted classes, host */
    float *x_host;     /* (batch, 784) */
    int *y_host;       /* (batch) */
    float *x_dev[2];   /* (batch, 784), backend memory: two batch slots, filled in turn */
    int *y_dev[2];     /* (batch), backend memory */
    int slot;          /* the slot of the last upload */
    FILE *metrics;     /* rank 0 with --metrics, else NULL */
    long steps_per_epoch, total_steps, step;
    float *loss_dev;   /* (1) backend memory: this epoch's sum of micro-batch mean losses */
    float loss_ok;     /* the sum at the last agreement that found it finite */
    int loss_nan;      /* --nan-policy skip left out a NaN/inf loss this epoch: its loss shows NaN */
    int stopped;       /* training stopped early on a signal (the same on every rank) */
    long skipped[16];  /* first optimizer steps the loss scaler skipped (inf/NaN on some rank) */
    int epoch;         /* current epoch */
    long in_epoch;     /* optimizer steps done in it */
    int nan_stopped;   /* a non-finite loss stopped training (--nan-policy stop) */
    int save_failed;   /* a checkpoint failed with --checkpoint-errors stop */
    train_pos start; /* where training starts: zero, or the resumed position */
    long saved_step;   /* step of the last checkpoint written, -1 for none */
    train_setup setup;
    float confusion[DDP_N_CLASSES * DDP_N_CLASSES]; /* last evaluation, summed over ranks */
    progress_bar progress;
} trainer;

/* A failure only this rank may have seen: stop the whole job so no peer waits forever. */
static void train_must(trainer *t, ddp_status st, const char *what)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("%s failed: %s; stopping every rank", what, ddp_strerror(st));
    ddp_abort(t->ctx, 1);
}

static volatile sig_atomic_t got_usr1, got_term; /* set by the handlers */

static void train_on_signal(int sig)
{
    if (sig == SIGTERM || sig == SIGUSR2)
        got_term = 1;
    else
        got_usr1 = 1;
}

/* Every rank learns whether any rank failed. Returns DDP_OK when none did; otherwise every rank
 * returns a failure (its own status, or DDP_ERR_MISMATCH where a peer failed), and the ranks that
 * did not fail say `then` (what the job does now), unless it is NULL. Collective. */
static ddp_status train_agree_then(trainer *t, ddp_status local, const char *then)
{
    int64_t failed = local != DDP_OK;
    train_must(t, ddp_allreduce_host(t->ctx, &failed, 1, DDP_INT64, DDP_SUM),
               "agreeing on start-up status");
    if (failed == 0)
        return DDP_OK;
    if (local == DDP_OK && then)
        DDP_ERROR("%lld rank(s) failed (see their messages); %s", (long long)failed, then);
    return local != DDP_OK ? local : DDP_ERR_MISMATCH;
}

static ddp_status train_agree(trainer *t, ddp_status local)
{
    return train_agree_then(t, local, "exiting");
}

/* Opens FILE for writing like fopen(path, "w"), but a FIFO without a reader fails (ENXIO) instead
 * of blocking rank 0 while its peers wait. NULL with errno set on failure. */
static FILE *train_create(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 && fcntl(fd, F_SETFL, 0) == 0 ? fdopen(fd, "w") : NULL;
    if (!f && fd >= 0) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
    return f;
}

/* Loads both splits and opens the metrics file (rank 0). */
static ddp_status train_open_inputs(trainer *t)
{
    ddp_status st = model_mnist_load_dir(t->o->data_dir, "train", &t->train);
    if (st == DDP_OK)
        st = model_mnist_load_dir(t->o->data_dir, "t10k", &t->test);
    if (st == DDP_OK && t->rank == 0 && t->o->metrics_path) {
        t->metrics = train_create(t->o->metrics_path);
        if (!t->metrics) {
            DDP_ERROR("--metrics %s: cannot create the file: %s", t->o->metrics_path, strerror(errno));
            st = DDP_ERR_IO;
        }
    }
    return st;
}

/* Every rank must have loaded data of the same size as rank 0 (node-local copies can differ), or
 * their step plans, and so their collectives, would not match. Collective. */
static ddp_status train_same_data(trainer *t)
{
    uint64_t mine[2] = {t->train.n, t->test.n}, root[2] = {t->train.n, t->test.n};
    uint64_t *dev = ddp_alloc(t->ctx, sizeof root);
    train_must(t, dev ? DDP_OK : DDP_ERR_NOMEM, "allocating the data-size buffer");
    train_must(t, ddp_upload(t->ctx, dev, root, sizeof root), "uploading data sizes");
    train_must(t, ddp_broadcast(t->ctx, dev, sizeof root, 0), "broadcasting data sizes");
    train_must(t, ddp_download(t->ctx, root, dev, sizeof root), "downloading data sizes");
    ddp_free(t->ctx, dev);
    if (mine[0] == root[0] && mine[1] == root[1])
        return DDP_OK;
    DDP_ERROR("%s holds %llu train / %llu test samples here but %llu / %llu on rank 0: give every "
              "rank the same data (copy the same files to every node, or use a shared --data folder)",
              t->o->data_dir, (unsigned long long)mine[0], (unsigned long long)mine[1],
              (unsigned long long)root[0], (unsigned long long)root[1]);
    return DDP_ERR_MISMATCH;
}

/* Creates the sampler and derives the step plan; the same outcome on every rank. */
static ddp_status train_plan(trainer *t)
{
    ddp_sampler_opts so = {.n_samples = t->train.n, .world_size = t->world, .rank = t->rank,
                           .seed = t->o->seed, .shuffle = t->o->shuffle, .drop_last = 0};
    ddp_status st = ddp_sampler_create(&so, &t->sampler);
    if (st != DDP_OK)
        return st;
    size_t per_step = (size_t)t->o->batch * (size_t)t->o->accum;
    t->steps_per_epoch = (long)(ddp_sampler_len(t->sampler) / per_step);
    if (t->test.n == 0) {
        DDP_ERROR("%s: the test set (t10k files) has 0 samples: evaluation needs at least one; put "
                  "test images in the folder", t->o->data_dir);
        return DDP_ERR_INVALID_ARG;
    }
    if (t->steps_per_epoch == 0) {
        DDP_ERROR("--batch %d x --accum %d is more than the %zu training samples each of the %d rank(s) "
                  "gets per epoch: allowed is --batch x --accum from 1 to %zu (or use fewer ranks)",
                  t->o->batch, t->o->accum, ddp_sampler_len(t->sampler), t->world, ddp_sampler_len(t->sampler));
        return DDP_ERR_INVALID_ARG;
    }
    t->total_steps = t->steps_per_epoch * t->o->epochs;
    if (t->o->max_steps > 0 && t->o->max_steps < t->total_steps)
        t->total_steps = t->o->max_steps;
    return DDP_OK;
}

/* Starts the data workers at the first step to train (0, or the resumed step). */
static ddp_status train_start_prefetch(trainer *t)
{
    ddp_sampler_opts so = {.n_samples = t->train.n, .world_size = t->world, .rank = t->rank,
                           .seed = t->o->seed, .shuffle = t->o->shuffle, .drop_last = 0};
    model_prefetch_plan pp = {.data = &t->train, .sampler = so, .batch = t->o->batch,
                            .accum = t->o->accum, .steps_per_epoch = t->steps_per_epoch,
                            .total_steps = t->total_steps, .first_step = t->start.step,
                            .seed = t->o->seed, .augment = t->o->augment, .workers = t->o->workers};
    return model_prefetch_create(&pp, &t->prefetch);
}

/* Host and backend buffers for one micro-batch. */
static void train_alloc_buffers(trainer *t)
{
    size_t batch = (size_t)t->o->batch, pixels = (size_t)t->train.rows * (size_t)t->train.cols;
    t->eval_idx = malloc(batch * sizeof *t->eval_idx);
    t->pred = malloc(batch * sizeof *t->pred);
    t->x_host = malloc(batch * pixels * sizeof *t->x_host);
    t->y_host = malloc(batch * sizeof *t->y_host);
    for (int i = 0; i < 2; i++) {
        t->x_dev[i] = ddp_alloc(t->ctx, batch * pixels * sizeof *t->x_dev[i]);
        t->y_dev[i] = ddp_alloc(t->ctx, batch * sizeof *t->y_dev[i]);
    }
    t->loss_dev = ddp_alloc(t->ctx, sizeof *t->loss_dev);
    int ok = t->eval_idx && t->pred && t->x_host && t->y_host && t->x_dev[0] && t->y_dev[0] &&
             t->x_dev[1] && t->y_dev[1] && t->loss_dev;
    train_must(t, ok ? DDP_OK : DDP_ERR_NOMEM, "allocating batch buffers");
}

/* Checks that every rank holds the same initial parameters (after the optional broadcast). */
static ddp_status train_verify(trainer *t)
{
    model *m = t->model;
    size_t n = model_numel_total(m);
    if (t->o->broadcast_init)
        train_must(t, ddp_broadcast_params(t->ctx, model_params(m), n), "broadcasting parameters");
    float *host = malloc(n * sizeof *host);
    train_must(t, host ? DDP_OK : DDP_ERR_NOMEM, "allocating the parameter copy");
    train_must(t, ddp_download(t->ctx, host, model_params(m), n * sizeof *host),
               "downloading parameters");
    ddp_status st = ddp_verify_replicas(t->ctx, model_descs(m), model_n_params(m), host);
    free(host);
    if (st != DDP_OK && st != DDP_ERR_MISMATCH)
        train_must(t, st, "verifying replicas");
    return st;
}

/* Model, replica check, reducer and buffers. What is returned is agreed on: a model too large
 * for memory or bucket caps the reducer refuses (configuration errors), or a replica mismatch. */
static ddp_status train_build(trainer *t)
{
    ddp_status st = train_agree(t, ops_open(t->ctx, t->o->threads, &t->ops));
    if (st == DDP_OK)
        st = train_agree(t, ops_cuda_set_tf32(t->ops, t->o->tf32));
    if (st == DDP_OK)
        st = train_agree(t, model_create(t->ctx, t->ops, &t->o->model, &t->model));
    if (st == DDP_OK)
        st = train_verify(t);
    if (st != DDP_OK)
        return st;
    ddp_reducer_opts ro;
    ddp_reducer_opts_default(&ro);
    ro.bucket_mb = t->o->bucket_mb;
    ro.first_bucket_mb = t->o->first_bucket_mb;
    ro.comm_dtype = t->o->grad_dtype;
    ro.defer_launch = t->o->no_overlap;
    ro.zero_stage = t->o->zero;
    model *m = t->model;
    if (t->o->grad_dtype == DDP_FP16 || t->o->model.precision == DDP_FP16) {
        ddp_scaler_opts so;
        ddp_scaler_opts_default(&so);
        so.init_scale = t->o->loss_scale_init;
        so.growth_interval = t->o->loss_scale_interval;
        st = train_agree(t, ddp_scaler_create(t->ctx, &so, &t->scaler));
        if (st != DDP_OK)
            return st;
    }
    st = train_agree(t, ddp_reducer_create(t->ctx, model_grads(m), model_numel(m),
                                           model_n_params(m), &ro, &t->reducer));
    if (st == DDP_OK && t->o->zero > 0) { /* --zero: the momentum of this rank's shard only */
        size_t off = 0, n = 0;
        ddp_reducer_shard(t->reducer, &off, &n);
        st = train_agree(t, model_shard_momentum(m, off, n));
    }
    if (st == DDP_OK)
        train_alloc_buffers(t);
    return st;
}

/* Uploads n samples (x: (n, pixels), y: (n)) into the next batch slot, t->slot, through libddp's
 * double-buffered staging: on the GPU (pinned staging, a copy stream) the upload overlaps the
 * compute of the batch before, which reads the other slot; on the CPU it is a copy. */
static void train_upload(trainer *t, const float *x, const int *y, int n)
{
    size_t pixels = (size_t)t->train.rows * (size_t)t->train.cols;
    size_t x_bytes = (size_t)n * pixels * sizeof *x, y_bytes = (size_t)n * sizeof *y;
    int s = t->slot ^= 1;
    train_must(t, ddp_stage_upload(t->ctx, s, 0, t->x_dev[s], x, x_bytes), "uploading images");
    train_must(t, ddp_stage_upload(t->ctx, s, 1, t->y_dev[s], y, y_bytes), "uploading labels");
    train_must(t, ddp_stage_acquire(t->ctx, s), "waiting for the batch upload");
}

/* The compute queued so far is the last to read the current slot: its next upload waits for it. */
static void train_batch_done(trainer *t)
{
    train_must(t, ddp_stage_release(t->ctx, t->slot), "releasing the batch buffers");
}

/* The next training micro-batch from the prefetcher, uploaded. */
static void train_next_batch(trainer *t)
{
    const float *x = NULL;
    const int *y = NULL;
    train_must(t, model_prefetch_next(t->prefetch, &x, &y), "getting the next batch");
    train_upload(t, x, y, t->o->batch);
    model_prefetch_release(t->prefetch);
}

/* Multiplies the loss of this micro-batch's backward pass by the loss scale (fp16), or by inf on
 * the rank and step --inject-inf names (a test of the scaler's agreement). */
static void train_scale_loss(trainer *t)
{
    float scale = t->scaler ? (float)ddp_scaler_scale(t->scaler) : 1.0f;
    for (int i = 0; i < t->o->n_inject; i++)
        if (t->o->inject_rank[i] == t->rank && t->o->inject_step[i] == t->step)
            scale = INFINITY;
    if (scale != 1.0f)
        train_must(t, model_scale_loss_grad(t->model, scale), "scaling the loss gradient");
}

/* After the reducer: the loss scaler unscales and decides, the same on every rank. Returns
 * whether the optimizer step is taken. */
static int train_step_ok(trainer *t)
{
    if (!t->scaler)
        return 1;
    int ok = 0;
    size_t n = 0;
    float *grads = train_step_grads(t->reducer, model_grads(t->model), &n);
    train_must(t, ddp_scaler_unscale_update(t->scaler, grads, DDP_FP32, n, &ok),
                   "checking gradients for inf/NaN");
    int64_t skipped = ddp_scaler_skipped_steps(t->scaler);
    if (!ok && skipped <= (int64_t)(sizeof t->skipped / sizeof t->skipped[0]))
        t->skipped[skipped - 1] = t->step;
    return ok;
}

/* Learning rate of the next step: constant, or cosine-decayed over the planned steps. */
static float train_lr(const trainer *t)
{
    if (!t->o->cosine)
        return (float)t->o->lr;
    return (float)(t->o->lr * 0.5 * (1.0 + cos(M_PI * (double)t->step / (double)t->total_steps)));
}

/* After the gradients are reduced and before they are applied: did any rank get SIGUSR1 or SIGTERM,
 * or a NaN/inf loss? One host all-reduce of three counters, so every rank answers alike. Returns the
 * number of ranks whose loss was not finite. */
static int64_t train_agree_step(trainer *t, int nonfinite)
{
    int64_t flags[3] = {got_usr1 != 0, got_term != 0, nonfinite != 0};
    train_must(t, ddp_allreduce_host(t->ctx, flags, 3, DDP_INT64, DDP_SUM), "agreeing on a stop");
    if ((flags[0] > 0 || flags[1] > 0) && !t->stopped) {
        if (t->rank == 0) {
            progress_end(&t->progress);
            printf("%s received: every rank stops after step %ld\n", flags[1] > 0 ? "SIGTERM" : "SIGUSR1",
                   t->step + 1);
            fflush(stdout);
        }
        DDP_INFO("stop agreed: this rank stops after step %ld", t->step + 1);
        t->stopped = 1;
    }
    return flags[2];
}

/* Whether the ranks agree before the update of the step being done (see the top of the file). */
static int train_agree_due(const trainer *t, long step_in_epoch)
{
    const train_opts *o = t->o;
    long next = t->step + 1;
    return o->nan_skip || next % DDP_TRAIN_STOP_EVERY == 0 || step_in_epoch + 1 == t->steps_per_epoch ||
           next == t->total_steps || (o->checkpoint_dir && o->checkpoint_every && next % o->checkpoint_every == 0);
}

/* Whether the loss summed on the device since the last agreement is NaN or inf. With --nan-policy
 * skip the sum goes back to its last finite value, so the next steps are judged alone. */
static int train_loss_nonfinite(trainer *t)
{
    float sum = 0.0f;
    train_must(t, ddp_download(t->ctx, &sum, t->loss_dev, sizeof sum), "downloading the loss");
    if (isfinite(sum)) {
        t->loss_ok = sum;
        return 0;
    }
    if (t->o->nan_skip) {
        train_must(t, ddp_upload(t->ctx, t->loss_dev, &t->loss_ok, sizeof t->loss_ok),
                   "resetting the loss sum");
        t->loss_nan = 1;
    }
    return 1;
}

/* A step whose loss was NaN or inf on `ranks` ranks: it is not applied; --nan-policy stop ends training. */
static void train_on_nonfinite(trainer *t, int64_t ranks)
{
    if (t->rank == 0)
        progress_end(&t->progress);
    if (t->o->nan_skip) {
        if (t->rank == 0)
            DDP_WARN("step %ld: the loss is NaN or inf on %lld rank(s): the step is not applied "
                     "(--nan-policy skip)", t->step + 1, (long long)ranks);
        return;
    }
    if (t->rank == 0)
        DDP_ERROR("step %ld: the loss became NaN or inf on %lld rank(s): training stops (exit 1); lower "
                  "--lr, or pass --nan-policy skip to leave such steps out", t->step + 1, (long long)ranks);
    t->nan_stopped = 1;
}

/* One optimizer step over the next accum micro-batches; adds each micro-batch's mean loss to
 * t->loss_dev. Nothing here waits for the GPU but an agreement (train_agree_due): uploads are
 * staged, the loss stays on the device. A NaN/inf loss on any rank, or (with a loss scaler) inf/NaN
 * gradients, leave the step out on every rank alike. */
static void train_step(trainer *t, long step_in_epoch)
{
    int batch = t->o->batch, accum = t->o->accum;
    train_must(t, model_zero_grad(t->model), "zeroing gradients");
    for (int micro = 0; micro < accum; micro++) {
        train_must(t, ddp_reducer_begin(t->reducer, micro == accum - 1), "starting the reducer");
        ddp_trace_begin("data", micro);
        train_next_batch(t);
        ddp_trace_end("data", micro);
        ddp_trace_begin("forward", micro);
        train_must(t, model_forward_train(t->model, t->x_dev[t->slot], t->y_dev[t->slot], batch,
                                                  t->loss_dev),
                       "forward pass");
        train_scale_loss(t);
        ddp_trace_end("forward", micro);
        ddp_trace_begin("backward", micro);
        train_must(t, model_backward(t->model, t->reducer), "backward pass");
        train_batch_done(t);
        ddp_trace_end("backward", micro);
    }
    train_must(t, ddp_reducer_finish(t->reducer), "reducing gradients");
    if (train_agree_due(t, step_in_epoch)) {
        int64_t bad = train_agree_step(t, train_loss_nonfinite(t));
        if (bad > 0) {
            train_on_nonfinite(t, bad);
            return;
        }
    }
    if (!train_step_ok(t))
        return;
    ddp_trace_begin("optimizer", t->step);
    if (t->o->zero > 0) { /* this rank's shard, then every rank's shard to every rank */
        size_t n = 0;
        float *grads = train_step_grads(t->reducer, model_grads(t->model), &n);
        train_must(t, model_sgd_step_range(t->model, t->o->zero == 2 ? grads : NULL, train_lr(t),
                                           (float)t->o->momentum, (float)t->o->weight_decay),
                   "SGD step");
        train_must(t, ddp_reducer_gather_params(t->reducer, model_params(t->model), DDP_FP32),
                   "gathering the parameters");
    } else {
        train_must(t, model_sgd_step(t->model, train_lr(t), (float)t->o->momentum,
                                     (float)t->o->weight_decay), "SGD step");
    }
    ddp_trace_end("optimizer", t->step);
}

/* Rank 0 writes a checkpoint of the position (t->step, epoch, in_epoch), every rank joining (the
 * shards' gather); every rank learns the outcome. A failure ends training unless --checkpoint-errors warn. */
static void train_write_checkpoint(trainer *t, long in_epoch)
{
    train_pos pos = {.step = t->step, .epoch = t->epoch, .step_in_epoch = in_epoch};
    ddp_status st = DDP_OK;
    ddp_trace_begin("checkpoint", t->step);
    if (t->rank == 0)
        progress_end(&t->progress);
    st = train_checkpoint(&t->setup, &pos); /* collective: shards are gathered under --zero */
    ddp_trace_end("checkpoint", t->step);
    t->saved_step = t->step;
    /* with warn, rank 0's warning below is the one message: the others go on silently */
    if (train_agree_then(t, st, t->o->checkpoint_errors_warn ? NULL : "exiting") == DDP_OK)
        return;
    if (t->o->checkpoint_errors_warn)
        DDP_WARN0("training goes on without this checkpoint (--checkpoint-errors warn)");
    else
        t->save_failed = 1;
}

/* Sharded evaluation: rank r takes test samples r, r + world, ...; the confusion counts are summed
 * over ranks. Returns the accuracy (0..1), the same on every rank. */
static double train_evaluate(trainer *t)
{
    memset(t->confusion, 0, sizeof t->confusion);
    size_t next = (size_t)t->rank;
    while (next < t->test.n) {
        int n = 0;
        for (; n < t->o->batch && next < t->test.n; n++, next += (size_t)t->world)
            t->eval_idx[n] = next;
        model_mnist_gather(&t->test, t->eval_idx, n, t->x_host, t->y_host);
        train_upload(t, t->x_host, t->y_host, n);
        train_must(t, model_forward(t->model, t->x_dev[t->slot], t->y_dev[t->slot], n, NULL,
                                            NULL, t->pred), "evaluation forward pass");
        train_batch_done(t);
        for (int i = 0; i < n; i++)
            t->confusion[t->y_host[i] * DDP_N_CLASSES + t->pred[i]] += 1.0f;
    }
    train_must(t, ddp_allreduce_host(t->ctx, t->confusion, DDP_N_CLASSES * DDP_N_CLASSES,
                                     DDP_FP32, DDP_SUM), "summing evaluation counts");
    return confusion_accuracy(t->confusion);
}

/* Rank 0, after the first step (oneDNN picks its implementations when the primitives are made,
 * cuDNN its algorithms when the plans are measured): what runs, e.g. "conv_fwd
 * brg:avx512_core_bf16" on the CPU, "conv_fwd algo 1 (tensor-op math)" on the GPU. */
static void train_report_impl(const trainer *t)
{
    bool cpu = ddp_backend(t->ctx) == DDP_BACKEND_CPU;
    ddp_dtype p = t->o->model.precision;
    const char *impl = cpu ? ops_dnnl_describe(t->ops, p) : ops_cudnn_describe(t->ops, p);
    if (t->rank != 0 || !impl[0])
        return;
    progress_end(&t->progress);
    printf("%s (%s): %s\n", cpu ? "oneDNN" : "cuDNN", model_precision_name(p), impl);
    fflush(stdout);
}

/* Trains one epoch (or until the step limit) and evaluates; fills e. */
static void train_epoch(trainer *t, int epoch, epoch_stats *e)
{
    size_t per_step = (size_t)t->o->batch * (size_t)t->o->accum;
    float loss[2] = {0.0f, 0.0f}; /* sum of micro-batch losses, micro-batches */
    long first = epoch == t->start.epoch ? t->start.step_in_epoch : 0, steps = first;
    const train_opts *o = t->o;
    t->epoch = epoch;
    t->loss_ok = 0.0f;
    t->loss_nan = 0;
    train_must(t, ddp_upload(t->ctx, t->loss_dev, &loss[0], sizeof loss[0]), "zeroing the loss");
    double start = train_now(), before = t->progress.train_seconds;
    for (; steps < t->steps_per_epoch && t->step < t->total_steps; steps++) {
        ddp_trace_begin("step", t->step);
        train_step(t, steps);
        ddp_trace_end("step", t->step);
        if (t->nan_stopped)
            break;
        loss[1] += (float)t->o->accum;
        t->step++;
        if (t->step == 1)
            train_report_impl(t);
        if (t->rank == 0 && progress_due(&t->progress, t->step)) {
            train_must(t, ddp_download(t->ctx, &loss[0], t->loss_dev, sizeof loss[0]),
                       "downloading the loss");
            t->progress.train_seconds = before + train_now() - start;
            progress_update(&t->progress, t->step, epoch, loss[0] / loss[1]);
        }
        if (o->checkpoint_dir && (t->stopped || (o->checkpoint_every && t->step % o->checkpoint_every == 0)))
            train_write_checkpoint(t, steps + 1);
        if (t->stopped || t->save_failed) {
            steps++;
            break;
        }
    }
    t->in_epoch = steps;
    steps -= first;
    train_must(t, ddp_download(t->ctx, &loss[0], t->loss_dev, sizeof loss[0]),
               "downloading the loss");
    double seconds = train_now() - start; /* the download waited for the GPU */
    t->progress.train_seconds = before + seconds;
    double sums[2] = {t->loss_nan ? NAN : loss[0], loss[1]};
    train_must(t, ddp_allreduce_host(t->ctx, sums, 2, DDP_FP64, DDP_SUM), "summing losses");
    e->epoch = epoch;
    e->steps = steps;
    e->train_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    e->samples_per_s = seconds > 0 ? (double)steps * (double)per_step * t->world / seconds : 0.0;
    e->test_accuracy = train_evaluate(t);
}

/* Rank 0: the epoch line and its metrics line. */
static void train_report_epoch(trainer *t, const epoch_stats *e)
{
    if (t->rank != 0)
        return;
    progress_end(&t->progress);
    printf("epoch %d: train loss %.4f, test accuracy %.2f%% (%ld steps, %.0f samples/s)\n", e->epoch + 1,
           e->train_loss, 100.0 * e->test_accuracy, e->steps, e->samples_per_s);
    fflush(stdout);
    if (t->metrics)
        metrics_epoch(t->metrics, e);
}

/* Rank 0: configuration at start-up. */
static void train_report_start(const trainer *t)
{
    if (t->rank != 0)
        return;
    printf("ddp-train: %d rank(s), backend %s\n", t->world, ddp_backend_name(ddp_backend(t->ctx)));
    ddp_dtype p = t->o->model.precision;
    if (ddp_backend(t->ctx) == DDP_BACKEND_CPU) {
        printf("cpu: %s; ISA %s\n", cpu_model_name(), cpu_isa_describe());
        printf("compute: %s, %s; GEMM %s; convolutions %s; BLAS %s\n", t->ops->name, model_precision_name(p),
               ops_cpu_gemm_name(p), layer_conv_direct(t->ops) ? "oneDNN" : "im2col + GEMM", ops_blas_describe());
        if (p == DDP_BF16 && t->ops->emulates(t->ops, p))
            printf("bf16: emulated (this CPU has no AVX512_BF16, or DDP_CPU_ISA caps it): fp32 arithmetic, every "
                   "op's output rounded to bf16, activations stored in float\n");
    } else
        printf("compute: %s, %s; GEMM %s\n", t->ops->name, model_precision_name(t->o->model.precision),
               ops_cuda_describe(t->ops, t->o->model.precision));
    printf("memory: %s\n", malloc_describe());
    train_print_opts(stdout, t->o);
    if (t->o->requeue && !getenv("SLURM_JOB_ID"))
        printf("--requeue: not a Slurm job (SLURM_JOB_ID is unset): a stop will not requeue anything\n");
    printf("data: %zu train / %zu test samples; %zu per rank per epoch; %ld steps per epoch "
           "(floor of per-rank samples / (batch x accum)); %ld steps planned; %zu parameters\n",
           t->train.n, t->test.n, ddp_sampler_len(t->sampler), t->steps_per_epoch, t->total_steps,
           model_numel_total(t->model));
    fflush(stdout);
}

/* Every rank: the steps its loss scaler skipped and the final scale (tests compare the ranks). */
static void train_report_scaler(const trainer *t)
{
    if (!t->scaler)
        return;
    char list[256] = "";
    int64_t n = ddp_scaler_skipped_steps(t->scaler);
    size_t shown = (size_t)n < sizeof t->skipped / sizeof t->skipped[0] ? (size_t)n
                                                                         : sizeof t->skipped / sizeof t->skipped[0];
    for (size_t i = 0, len = 0; i < shown && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%ld", i ? "," : "", t->skipped[i]);
    DDP_INFO("loss scaler: %lld step(s) skipped for inf/NaN [%s], final scale %g", (long long)n,
             list, ddp_scaler_scale(t->scaler));
}

/* Rank 0: what the communicator sent for the gradients (payload of every backend all-reduce). */
static void train_report_comm(const trainer *t)
{
    ddp_comm_stats cs;
    if (t->rank != 0 || t->step == 0 || ddp_comm_stats_get(t->ctx, &cs) != DDP_OK)
        return;
    printf("gradient all-reduce (%s on the wire): %llu all-reduces, %llu bytes, %.0f bytes per step\n",
           ddp_dtype_name(t->o->grad_dtype), (unsigned long long)cs.allreduce_calls,
           (unsigned long long)cs.allreduce_bytes, (double)cs.allreduce_bytes / (double)t->step);
}

/* Rank 0: classification report, throughput and the summary metrics line. */
static void train_report_end(trainer *t, run_stats *r)
{
    if (t->rank != 0)
        return;
    printf("\nclassification report (test set, after the last epoch):\n");
    print_class_report(stdout, t->confusion);
    printf("\nthroughput: %.1f samples/s across %d rank(s) (%ld steps in %.2f s of training, %.2f s wall)\n",
           r->samples_per_s, r->world_size, r->steps, r->train_seconds, r->wall_seconds);
    if (r->exposed_comm_ms >= 0)
        printf("communication (trace, mean over ranks): %.2f ms of all-reduce per step, %.2f ms exposed "
               "(the step waited for it), %.0f%% hidden behind backward\n", r->comm_ms, r->exposed_comm_ms,
               100.0 * r->hidden_fraction);
    fflush(stdout);
    if (t->metrics)
        metrics_summary(t->metrics, t->o, r);
}

/* Rank 0 writes the whole training state to --save; every rank learns the outcome. */
static ddp_status train_save(trainer *t)
{
    ddp_status st = DDP_OK;
    ddp_trace_begin("checkpoint", 0);
    if (t->o->save_path) {
        train_pos pos = {.step = t->step, .epoch = t->epoch, .step_in_epoch = t->in_epoch};
        st = train_save_state(&t->setup, &pos, t->o->save_path); /* collective */
    }
    if (t->rank == 0) {
        if (st != DDP_OK) /* errno: the system's reason of a failed write (train_save_state) */
            DDP_ERROR("--save %s: %s", t->o->save_path,
                      st == DDP_ERR_IO && errno ? strerror(errno) : ddp_strerror(st));
        else
            printf("saved %s\n", t->o->save_path);
    }
    ddp_trace_end("checkpoint", 0);
    return train_agree(t, st);
}

/* The epochs, then the final report. */
static void train_loop(trainer *t, double wall_start)
{
    epoch_stats e = {0};
    int epochs = 0;
    long per_step = (long)t->o->batch * t->o->accum * t->world;
    progress_init(&t->progress, t->o->log_every, t->total_steps, per_step);
    for (int epoch = (int)t->start.epoch; epoch < t->o->epochs && t->step < t->total_steps &&
                                          !t->stopped && !t->nan_stopped && !t->save_failed;
         epoch++, epochs++) {
        train_epoch(t, epoch, &e);
        train_report_epoch(t, &e);
    }
    if (epochs == 0) /* resumed at the end: nothing left to train */
        e.test_accuracy = train_evaluate(t);
    train_report_scaler(t);
    train_report_comm(t);
    run_stats r = {
        .world_size = t->world, .epochs = epochs, .steps = t->step, .test_accuracy = e.test_accuracy,
        .train_loss = e.train_loss, .train_seconds = t->progress.train_seconds,
        .samples_per_s = t->progress.train_seconds > 0
                             ? (double)((t->step - t->start.step) * per_step) / t->progress.train_seconds : 0.0,
        .wall_seconds = train_now() - wall_start, .backend = ddp_backend_name(ddp_backend(t->ctx)),
        .stopped_by_signal = t->stopped};
    train_comm_stats(t->ctx, &r);
    train_report_end(t, &r);
}

static void trainer_release(trainer *t)
{
    if (t->metrics)
        fclose(t->metrics);
    for (int i = 0; i < 2; i++) {
        ddp_free(t->ctx, t->x_dev[i]);
        ddp_free(t->ctx, t->y_dev[i]);
    }
    ddp_free(t->ctx, t->loss_dev);
    model_prefetch_destroy(t->prefetch);
    ddp_scaler_destroy(t->scaler);
    free(t->eval_idx);
    free(t->pred);
    free(t->x_host);
    free(t->y_host);
    ddp_reducer_destroy(t->reducer);
    model_destroy(t->model);
    ops_close(t->ops);
    ddp_sampler_destroy(t->sampler);
    model_mnist_free(&t->train);
    model_mnist_free(&t->test);
}

/* After training every rank must still hold the same parameters (skipped steps included). */
static ddp_status train_verify_end(trainer *t)
{
    size_t n = model_numel_total(t->model);
    float *host = malloc(n * sizeof *host);
    train_must(t, host ? DDP_OK : DDP_ERR_NOMEM, "allocating the parameter copy");
    train_must(t, ddp_download(t->ctx, host, model_params(t->model), n * sizeof *host),
               "downloading parameters");
    ddp_status st = ddp_verify_replicas(t->ctx, model_descs(t->model), model_n_params(t->model), host);
    free(host);
    if (st == DDP_OK && t->rank == 0)
        printf("replicas identical after training (checksums of every parameter agree)\n");
    return st;
}

/* Inputs, step plan, output folders, model, and the resumed position; agreed on by every rank. */
static ddp_status train_prepare(trainer *t)
{
    ddp_status st = train_agree(t, train_open_inputs(t));
    if (st == DDP_OK)
        st = train_agree(t, train_same_data(t));
    if (st == DDP_OK)
        st = train_agree(t, train_plan(t));
    if (st == DDP_OK)
        st = train_agree(t, t->rank == 0 ? train_check_outputs(t->o) : DDP_OK);
    if (st == DDP_OK)
        st = train_build(t);
    if (st != DDP_OK)
        return st;
    t->setup = (train_setup){.ctx = t->ctx, .o = t->o, .n_train = t->train.n,
                                 .steps_per_epoch = t->steps_per_epoch, .total_steps = t->total_steps,
                                 .scaler = t->scaler};
    train_buffers_of_model(t->model, &t->setup.buf);
    int resumed;
    st = train_resume(&t->setup, &t->start, &resumed);
    t->step = t->start.step;
    t->epoch = (int)t->start.epoch;
    t->in_epoch = t->start.step_in_epoch;
    t->saved_step = resumed ? t->step : -1;
    if (st == DDP_OK)
        st = train_agree(t, train_start_prefetch(t));
    return st;
}

/* After training: the final checkpoint and --save; the run's outcome. */
static ddp_status train_finish(trainer *t)
{
    if (t->nan_stopped || t->save_failed)
        return t->nan_stopped ? DDP_ERR_STATE : DDP_ERR_IO;
    if (t->o->checkpoint_dir && t->saved_step != t->step)
        train_write_checkpoint(t, t->in_epoch);
    if (t->save_failed)
        return DDP_ERR_IO;
    return t->o->save_path ? train_save(t) : DDP_OK;
}

/* Whole run. Returns a failure only when every rank agrees on it; other failures abort the job.
 * *requeue: rank 0 should requeue the Slurm job (stopped by a signal, with --requeue). */
static ddp_status train_run(ddp_ctx *ctx, const train_opts *o, int *requeue)
{
    double wall_start = train_now();
    trainer t = {.ctx = ctx, .o = o, .rank = ddp_rank(ctx), .world = ddp_world_size(ctx)};
    ddp_status st = train_prepare(&t);
    if (st == DDP_OK)
        st = train_observe_start(ctx, o);
    if (st == DDP_OK) {
        train_report_start(&t);
        train_loop(&t, wall_start);
        st = train_verify_end(&t);
        if (st == DDP_OK)
            st = train_finish(&t);
        ddp_status trace_st = train_observe_end(ctx, o);
        st = st == DDP_OK ? trace_st : st;
    }
    *requeue = st == DDP_OK && t.stopped && o->requeue && t.rank == 0 && getenv("SLURM_JOB_ID");
    trainer_release(&t);
    return st;
}

int main(int argc, char **argv)
{
    if (ops_blas_prefer_fast_kernels(argv) != 0)
        return 2;
    malloc_policy();
    struct sigaction sa = {.sa_handler = train_on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    train_opts o;
    train_parse_result pr = train_parse_args(argc, argv, &o);
    if (pr != DDP_TRAIN_RUN)
        return pr == DDP_TRAIN_HELP ? 0 : 2;
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = o.device;
    io.threads = o.threads;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&io, &ctx);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-train: cannot start: %s\n", ddp_strerror(st));
        return 1;
    }
    int requeue = 0;
    if (o.gpt.on)
        st = train_gpt_run(ctx, &o, (train_signals){.usr1 = &got_usr1, .term = &got_term}, &requeue);
    else
        st = train_run(ctx, &o, &requeue);
    ddp_finalize(ctx);
    if (requeue) /* last, after MPI is closed: Slurm ends this job's processes when it requeues */
        st = train_requeue();
    return st == DDP_OK ? 0 : 1;
}
