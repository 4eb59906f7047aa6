/* ddp_train.c - ddp-train: data-parallel training of the reference models on MNIST with libddp.
 *
 * Every rank loads the data and builds the same seeded model; the sampler gives each rank its
 * shard; gradients are averaged by the bucketed reducer during the backward pass.
 * Steps per epoch = floor(per-rank samples / (batch * accum)): the tail of an epoch that does not
 * fill a whole optimizer step is skipped (the permutation changes every epoch when shuffling).
 * Failures: errors every rank sees alike (bad data, bad configuration, replica mismatch) are agreed
 * on with a collective and every rank exits 1; any other failure after ddp_init aborts the job.
 * SIGUSR1 (Slurm's --signal=USR1@SECONDS before the time limit) stops training: the ranks agree
 * after every step, so all stop after the same step, evaluate, write --save and exit 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "mnist.h"
#include "model.h"
#include "train_opts.h"
#include "train_report.h"

typedef struct ddp_trainer {
    ddp_ctx *ctx;
    const ddp_train_opts *o;
    int rank, world;
    ddp_mnist train, test;
    ddp_model *model;
    ddp_reducer *reducer;
    ddp_sampler *sampler;
    size_t *indices;   /* this rank's sample indices for the current epoch */
    size_t *eval_idx;  /* (batch) test indices of one evaluation batch */
    int *pred;         /* (batch) predicted classes, host */
    float *x_host;     /* (batch, 784) */
    int *y_host;       /* (batch) */
    float *x_dev;      /* (batch, 784), backend memory */
    int *y_dev;        /* (batch), backend memory */
    FILE *metrics;     /* rank 0 with --metrics, else NULL */
    long steps_per_epoch, total_steps, step;
    int epoch;         /* current epoch, for augmentation */
    float *stop_dev;   /* (1) backend memory: SIGUSR1 seen by any rank, summed after each step */
    int stopped;       /* training stopped early on SIGUSR1 (the same on every rank) */
    float confusion[DDP_N_CLASSES * DDP_N_CLASSES]; /* last evaluation, summed over ranks */
    ddp_progress progress;
} ddp_trainer;

/* A failure only this rank may have seen: stop the whole job so no peer waits forever. */
static void ddp_train_must(ddp_trainer *t, ddp_status st, const char *what)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("%s failed: %s; stopping every rank", what, ddp_strerror(st));
    ddp_abort(t->ctx, 1);
}

static volatile sig_atomic_t ddp_train_signal; /* set by SIGUSR1 */

static void ddp_train_on_signal(int sig)
{
    ddp_train_signal = sig;
}

/* Sums n host floats over ranks, through backend memory. */
static ddp_status ddp_train_allreduce_host(ddp_ctx *ctx, float *host, size_t n)
{
    float *dev = ddp_alloc(ctx, n * sizeof *dev);
    if (!dev)
        return DDP_ERR_NOMEM;
    ddp_status st = ddp_upload(ctx, dev, host, n * sizeof *dev);
    if (st == DDP_OK)
        st = ddp_allreduce(ctx, dev, n, DDP_SUM);
    if (st == DDP_OK)
        st = ddp_download(ctx, host, dev, n * sizeof *dev);
    ddp_free(ctx, dev);
    return st;
}

/* Every rank learns whether any rank failed. Returns DDP_OK when none did; otherwise every rank
 * returns a failure (its own status, or DDP_ERR_MISMATCH where a peer failed). Collective. */
static ddp_status ddp_train_agree(ddp_trainer *t, ddp_status local)
{
    float failed = local != DDP_OK ? 1.0f : 0.0f;
    ddp_train_must(t, ddp_train_allreduce_host(t->ctx, &failed, 1), "agreeing on start-up status");
    if (failed == 0.0f)
        return DDP_OK;
    if (local == DDP_OK)
        DDP_ERROR("%.0f rank(s) failed (see their messages); exiting", (double)failed);
    return local != DDP_OK ? local : DDP_ERR_MISMATCH;
}

/* Opens FILE for writing like fopen(path, "w"), but a FIFO without a reader fails (ENXIO) instead
 * of blocking rank 0 while its peers wait. NULL with errno set on failure. */
static FILE *ddp_train_create(const char *path)
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
static ddp_status ddp_train_open_inputs(ddp_trainer *t)
{
    ddp_status st = ddp_mnist_load_dir(t->o->data_dir, "train", &t->train);
    if (st == DDP_OK)
        st = ddp_mnist_load_dir(t->o->data_dir, "t10k", &t->test);
    if (st == DDP_OK && t->rank == 0 && t->o->metrics_path) {
        t->metrics = ddp_train_create(t->o->metrics_path);
        if (!t->metrics) {
            DDP_ERROR("--metrics %s: cannot create the file: %s", t->o->metrics_path, strerror(errno));
            st = DDP_ERR_IO;
        }
    }
    return st;
}

/* Every rank must have loaded data of the same size as rank 0 (node-local copies can differ), or
 * their step plans, and so their collectives, would not match. Collective. */
static ddp_status ddp_train_same_data(ddp_trainer *t)
{
    uint64_t mine[2] = {t->train.n, t->test.n}, root[2] = {t->train.n, t->test.n};
    uint64_t *dev = ddp_alloc(t->ctx, sizeof root);
    ddp_train_must(t, dev ? DDP_OK : DDP_ERR_NOMEM, "allocating the data-size buffer");
    ddp_train_must(t, ddp_upload(t->ctx, dev, root, sizeof root), "uploading data sizes");
    ddp_train_must(t, ddp_broadcast(t->ctx, dev, sizeof root, 0), "broadcasting data sizes");
    ddp_train_must(t, ddp_download(t->ctx, root, dev, sizeof root), "downloading data sizes");
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
static ddp_status ddp_train_plan(ddp_trainer *t)
{
    ddp_sampler_opts so = {.n_samples = t->train.n, .world_size = t->world, .rank = t->rank,
                           .seed = t->o->seed, .shuffle = t->o->shuffle, .drop_last = 0};
    ddp_status st = ddp_sampler_create(&so, &t->sampler);
    if (st != DDP_OK)
        return st;
    size_t per_step = (size_t)t->o->batch * (size_t)t->o->accum;
    t->steps_per_epoch = (long)(ddp_sampler_len(t->sampler) / per_step);
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

/* Host and backend buffers for one micro-batch. */
static void ddp_train_alloc_buffers(ddp_trainer *t)
{
    size_t batch = (size_t)t->o->batch, pixels = (size_t)t->train.rows * (size_t)t->train.cols;
    t->indices = malloc(ddp_sampler_len(t->sampler) * sizeof *t->indices);
    t->eval_idx = malloc(batch * sizeof *t->eval_idx);
    t->pred = malloc(batch * sizeof *t->pred);
    t->x_host = malloc(batch * pixels * sizeof *t->x_host);
    t->y_host = malloc(batch * sizeof *t->y_host);
    t->x_dev = ddp_alloc(t->ctx, batch * pixels * sizeof *t->x_dev);
    t->y_dev = ddp_alloc(t->ctx, batch * sizeof *t->y_dev);
    t->stop_dev = ddp_alloc(t->ctx, sizeof *t->stop_dev);
    int ok = t->indices && t->eval_idx && t->pred && t->x_host && t->y_host && t->x_dev && t->y_dev &&
             t->stop_dev;
    ddp_train_must(t, ok ? DDP_OK : DDP_ERR_NOMEM, "allocating batch buffers");
}

/* Checks that every rank holds the same initial parameters (after the optional broadcast). */
static ddp_status ddp_train_verify(ddp_trainer *t)
{
    ddp_model *m = t->model;
    size_t n = ddp_model_numel_total(m);
    if (t->o->broadcast_init)
        ddp_train_must(t, ddp_broadcast_params(t->ctx, ddp_model_params(m), n), "broadcasting parameters");
    float *host = malloc(n * sizeof *host);
    ddp_train_must(t, host ? DDP_OK : DDP_ERR_NOMEM, "allocating the parameter copy");
    ddp_train_must(t, ddp_download(t->ctx, host, ddp_model_params(m), n * sizeof *host),
                   "downloading parameters");
    ddp_status st = ddp_verify_replicas(t->ctx, ddp_model_descs(m), ddp_model_n_params(m), host);
    free(host);
    if (st != DDP_OK && st != DDP_ERR_MISMATCH)
        ddp_train_must(t, st, "verifying replicas");
    return st;
}

/* Model, replica check, reducer and buffers. What is returned is agreed on: a model too large
 * for memory or bucket caps the reducer refuses (configuration errors), or a replica mismatch. */
static ddp_status ddp_train_build(ddp_trainer *t)
{
    ddp_status st = ddp_train_agree(t, ddp_model_create(ddp_backend_ops(t->ctx), &t->o->model, &t->model));
    if (st == DDP_OK)
        st = ddp_train_verify(t);
    if (st != DDP_OK)
        return st;
    ddp_reducer_opts ro;
    ddp_reducer_opts_default(&ro);
    ro.bucket_mb = t->o->bucket_mb;
    ro.first_bucket_mb = t->o->first_bucket_mb;
    ddp_model *m = t->model;
    st = ddp_train_agree(t, ddp_reducer_create(t->ctx, ddp_model_grads(m), ddp_model_numel(m),
                                               ddp_model_n_params(m), &ro, &t->reducer));
    if (st == DDP_OK)
        ddp_train_alloc_buffers(t);
    return st;
}

/* SplitMix64 finaliser: a well-mixed 64-bit hash. */
static uint64_t ddp_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Shifts one normalised (rows, cols) image by a random offset in [-2, 2]^2 drawn from (seed, epoch,
 * sample), so the result does not depend on the rank; uncovered pixels get the background value. */
static void ddp_train_shift(float *img, int rows, int cols, uint64_t seed, int epoch, size_t sample)
{
    uint64_t h = ddp_mix64(ddp_mix64(seed ^ ((uint64_t)epoch << 40)) + sample);
    int dy = (int)(h % 5) - 2, dx = (int)((h >> 8) % 5) - 2;
    float src[28 * 28], background = (0.0f - 0.1307f) / 0.3081f;
    if (rows * cols > 28 * 28 || (dx == 0 && dy == 0))
        return;
    memcpy(src, img, (size_t)rows * (size_t)cols * sizeof *src);
    for (int y = 0; y < rows; y++) {
        for (int x = 0; x < cols; x++) {
            int sy = y - dy, sx = x - dx;
            int inside = sy >= 0 && sy < rows && sx >= 0 && sx < cols;
            img[y * cols + x] = inside ? src[sy * cols + sx] : background;
        }
    }
}

/* Gathers samples idx[0..n) of d (shifted when augment) and uploads them to the batch buffers. */
static void ddp_train_load_batch(ddp_trainer *t, const ddp_mnist *d, const size_t *idx, int n, int augment)
{
    size_t pixels = (size_t)d->rows * (size_t)d->cols;
    ddp_mnist_gather(d, idx, n, t->x_host, t->y_host);
    for (int i = 0; augment && i < n; i++)
        ddp_train_shift(t->x_host + (size_t)i * pixels, d->rows, d->cols, t->o->seed, t->epoch, idx[i]);
    ddp_train_must(t, ddp_upload(t->ctx, t->x_dev, t->x_host, (size_t)n * pixels * sizeof *t->x_host),
                   "uploading images");
    ddp_train_must(t, ddp_upload(t->ctx, t->y_dev, t->y_host, (size_t)n * sizeof *t->y_host),
                   "uploading labels");
}

/* Learning rate of the next step: constant, or cosine-decayed over the planned steps. */
static float ddp_train_lr(const ddp_trainer *t)
{
    if (!t->o->cosine)
        return (float)t->o->lr;
    return (float)(t->o->lr * 0.5 * (1.0 + cos(M_PI * (double)t->step / (double)t->total_steps)));
}

/* One optimizer step over accum micro-batches taken from idx (batch * accum entries); adds each
 * micro-batch's mean loss to *loss_sum. */
static void ddp_train_step(ddp_trainer *t, const size_t *idx, double *loss_sum)
{
    int batch = t->o->batch, accum = t->o->accum;
    ddp_train_must(t, ddp_model_zero_grad(t->model), "zeroing gradients");
    for (int micro = 0; micro < accum; micro++) {
        float loss = 0.0f;
        ddp_train_must(t, ddp_reducer_begin(t->reducer, micro == accum - 1), "starting the reducer");
        ddp_train_load_batch(t, &t->train, idx + (size_t)micro * (size_t)batch, batch, t->o->augment);
        ddp_train_must(t, ddp_model_forward(t->model, t->x_dev, t->y_dev, batch, &loss, NULL, NULL),
                       "forward pass");
        ddp_train_must(t, ddp_model_backward(t->model, t->reducer), "backward pass");
        *loss_sum += loss;
    }
    ddp_train_must(t, ddp_reducer_finish(t->reducer), "reducing gradients");
    ddp_train_must(t, ddp_model_sgd_step(t->model, ddp_train_lr(t), (float)t->o->momentum,
                                         (float)t->o->weight_decay), "SGD step");
}

/* After a step: did any rank get SIGUSR1? One one-float all-reduce, so every rank answers alike. */
static int ddp_train_stop_requested(ddp_trainer *t)
{
    float seen = ddp_train_signal ? 1.0f : 0.0f;
    ddp_train_must(t, ddp_upload(t->ctx, t->stop_dev, &seen, sizeof seen), "uploading the stop flag");
    ddp_train_must(t, ddp_allreduce(t->ctx, t->stop_dev, 1, DDP_SUM), "agreeing on a stop");
    ddp_train_must(t, ddp_download(t->ctx, &seen, t->stop_dev, sizeof seen), "downloading the stop flag");
    if (seen > 0.0f && !t->stopped && t->rank == 0) {
        ddp_progress_end(&t->progress);
        printf("SIGUSR1 received: every rank stops after step %ld\n", t->step);
    }
    t->stopped |= seen > 0.0f;
    return t->stopped;
}

/* Sharded evaluation: rank r takes test samples r, r + world, ...; the confusion counts are summed
 * over ranks. Returns the accuracy (0..1), the same on every rank. */
static double ddp_train_evaluate(ddp_trainer *t)
{
    memset(t->confusion, 0, sizeof t->confusion);
    size_t next = (size_t)t->rank;
    while (next < t->test.n) {
        int n = 0;
        for (; n < t->o->batch && next < t->test.n; n++, next += (size_t)t->world)
            t->eval_idx[n] = next;
        ddp_train_load_batch(t, &t->test, t->eval_idx, n, 0);
        ddp_train_must(t, ddp_model_forward(t->model, t->x_dev, t->y_dev, n, NULL, NULL, t->pred),
                       "evaluation forward pass");
        for (int i = 0; i < n; i++)
            t->confusion[t->y_host[i] * DDP_N_CLASSES + t->pred[i]] += 1.0f;
    }
    ddp_train_must(t, ddp_train_allreduce_host(t->ctx, t->confusion, DDP_N_CLASSES * DDP_N_CLASSES),
                   "summing evaluation counts");
    return ddp_confusion_accuracy(t->confusion);
}

/* Trains one epoch (or until the step limit) and evaluates; fills e. */
static void ddp_train_epoch(ddp_trainer *t, int epoch, ddp_epoch_stats *e)
{
    size_t per_step = (size_t)t->o->batch * (size_t)t->o->accum;
    double loss[2] = {0.0, 0.0}, seconds = 0.0;
    long steps = 0;
    t->epoch = epoch;
    ddp_train_must(t, ddp_sampler_indices(t->sampler, (uint64_t)epoch, t->indices), "sampling");
    for (; steps < t->steps_per_epoch && t->step < t->total_steps; steps++) {
        double start = ddp_train_now();
        ddp_train_step(t, t->indices + (size_t)steps * per_step, &loss[0]);
        double took = ddp_train_now() - start;
        loss[1] += t->o->accum;
        seconds += took;
        t->progress.train_seconds += took;
        t->step++;
        if (t->rank == 0)
            ddp_progress_update(&t->progress, t->step, epoch, loss[0] / loss[1]);
        if (ddp_train_stop_requested(t)) {
            steps++;
            break;
        }
    }
    float sums[2] = {(float)loss[0], (float)loss[1]};
    ddp_train_must(t, ddp_train_allreduce_host(t->ctx, sums, 2), "summing losses");
    e->epoch = epoch;
    e->steps = steps;
    e->train_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    e->samples_per_s = seconds > 0 ? (double)steps * (double)per_step * t->world / seconds : 0.0;
    e->test_accuracy = ddp_train_evaluate(t);
}

/* Rank 0: the epoch line and its metrics line. */
static void ddp_train_report_epoch(ddp_trainer *t, const ddp_epoch_stats *e)
{
    if (t->rank != 0)
        return;
    ddp_progress_end(&t->progress);
    printf("epoch %d: train loss %.4f, test accuracy %.2f%% (%ld steps, %.0f samples/s)\n", e->epoch + 1,
           e->train_loss, 100.0 * e->test_accuracy, e->steps, e->samples_per_s);
    fflush(stdout);
    if (t->metrics)
        ddp_metrics_epoch(t->metrics, e);
}

/* Rank 0: configuration at start-up. */
static void ddp_train_report_start(const ddp_trainer *t)
{
    if (t->rank != 0)
        return;
    printf("ddp-train: %d rank(s), backend %s\n", t->world, ddp_backend_name(ddp_backend(t->ctx)));
    ddp_train_print_opts(stdout, t->o);
    printf("data: %zu train / %zu test samples; %zu per rank per epoch; %ld steps per epoch "
           "(floor of per-rank samples / (batch x accum)); %ld steps planned; %zu parameters\n",
           t->train.n, t->test.n, ddp_sampler_len(t->sampler), t->steps_per_epoch, t->total_steps,
           ddp_model_numel_total(t->model));
    fflush(stdout);
}

/* Rank 0: classification report, throughput and the summary metrics line. */
static void ddp_train_report_end(ddp_trainer *t, ddp_run_stats *r)
{
    if (t->rank != 0)
        return;
    printf("\nclassification report (test set, after the last epoch):\n");
    ddp_print_class_report(stdout, t->confusion);
    printf("\nthroughput: %.1f samples/s across %d rank(s) (%ld steps in %.2f s of training, %.2f s wall)\n",
           r->samples_per_s, r->world_size, r->steps, r->train_seconds, r->wall_seconds);
    fflush(stdout);
    if (t->metrics)
        ddp_metrics_summary(t->metrics, t->o, r);
}

/* Rank 0 writes the checkpoint; every rank learns the outcome. */
static ddp_status ddp_train_save(ddp_trainer *t)
{
    ddp_status st = DDP_OK;
    if (t->rank == 0) {
        size_t n = ddp_model_numel_total(t->model);
        float *host = malloc(n * sizeof *host);
        st = host ? ddp_download(t->ctx, host, ddp_model_params(t->model), n * sizeof *host) : DDP_ERR_NOMEM;
        if (st == DDP_OK)
            st = ddp_checkpoint_save(t->o->save_path, ddp_model_descs(t->model), ddp_model_n_params(t->model),
                                     host);
        if (st != DDP_OK)
            DDP_ERROR("--save %s: %s", t->o->save_path, ddp_strerror(st));
        else
            printf("saved %s\n", t->o->save_path);
        free(host);
    }
    return ddp_train_agree(t, st);
}

/* The epochs, then the final report. */
static void ddp_train_loop(ddp_trainer *t, double wall_start)
{
    ddp_epoch_stats e = {0};
    int epochs = 0;
    long per_step = (long)t->o->batch * t->o->accum * t->world;
    ddp_progress_init(&t->progress, t->o->log_every, t->total_steps, per_step);
    for (int epoch = 0; epoch < t->o->epochs && t->step < t->total_steps && !t->stopped;
         epoch++, epochs++) {
        ddp_train_epoch(t, epoch, &e);
        ddp_train_report_epoch(t, &e);
    }
    ddp_run_stats r = {
        .world_size = t->world, .epochs = epochs, .steps = t->step, .test_accuracy = e.test_accuracy,
        .train_loss = e.train_loss, .train_seconds = t->progress.train_seconds,
        .samples_per_s = t->progress.train_seconds > 0
                             ? (double)(t->step * per_step) / t->progress.train_seconds : 0.0,
        .wall_seconds = ddp_train_now() - wall_start, .backend = ddp_backend_name(ddp_backend(t->ctx)),
        .stopped_by_signal = t->stopped};
    ddp_train_report_end(t, &r);
}

static void ddp_trainer_release(ddp_trainer *t)
{
    if (t->metrics)
        fclose(t->metrics);
    ddp_free(t->ctx, t->x_dev);
    ddp_free(t->ctx, t->y_dev);
    ddp_free(t->ctx, t->stop_dev);
    free(t->indices);
    free(t->eval_idx);
    free(t->pred);
    free(t->x_host);
    free(t->y_host);
    ddp_reducer_destroy(t->reducer);
    ddp_model_destroy(t->model);
    ddp_sampler_destroy(t->sampler);
    ddp_mnist_free(&t->train);
    ddp_mnist_free(&t->test);
}

/* Whole run. Returns a failure only when every rank agrees on it; other failures abort the job. */
static ddp_status ddp_train_run(ddp_ctx *ctx, const ddp_train_opts *o)
{
    double wall_start = ddp_train_now();
    ddp_trainer t = {.ctx = ctx, .o = o, .rank = ddp_rank(ctx), .world = ddp_world_size(ctx)};
    ddp_status st = ddp_train_agree(&t, ddp_train_open_inputs(&t));
    if (st == DDP_OK)
        st = ddp_train_agree(&t, ddp_train_same_data(&t));
    if (st == DDP_OK)
        st = ddp_train_agree(&t, ddp_train_plan(&t));
    if (st == DDP_OK)
        st = ddp_train_build(&t);
    if (st == DDP_OK) {
        ddp_train_report_start(&t);
        ddp_train_loop(&t, wall_start);
        if (o->save_path)
            st = ddp_train_save(&t);
    }
    ddp_trainer_release(&t);
    return st;
}

int main(int argc, char **argv)
{
    ddp_blas_prefer_fast_kernels(argv);
    struct sigaction sa = {.sa_handler = ddp_train_on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    ddp_train_opts o;
    ddp_train_parse_result pr = ddp_train_parse_args(argc, argv, &o);
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
    st = ddp_train_run(ctx, &o);
    ddp_finalize(ctx);
    return st == DDP_OK ? 0 : 1;
}
