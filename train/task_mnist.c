/* task_mnist.c - ddp-train's MNIST task (loop.h): the MLP and CNN of model.h on IDX files, SGD with
 * momentum, a constant or cosine learning rate, sharded evaluation after every epoch.
 *
 * Every rank loads the data and builds the same seeded model; the sampler gives each rank its
 * shard and the prefetcher makes its batches ahead (--workers threads). Steps per epoch =
 * floor(per-rank samples / (batch * accum)). An epoch's loss is the mean over the ranks of every
 * micro-batch's mean loss (NaN when --nan-policy skip left a step out in it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_isa.h"
#include "layers.h"
#include "loop.h"
#include "malloc_policy.h"
#include "mnist.h"
#include "model.h"
#include "prefetch.h"

typedef struct mnist_task {
    mnist train, test;
    model *model;
    ddp_sampler *sampler;
    prefetch *prefetch; /* training batches, made ahead by --workers threads */
    size_t *eval_idx;  /* (batch) test indices of one evaluation batch */
    int *pred;         /* (batch) predicted classes, host */
    float *x_host;     /* (batch, 784) */
    int *y_host;       /* (batch) */
    size_t pixels;
    long first;        /* the epoch's first step (resumed mid-epoch: not 0) */
    double seconds;    /* t->train_seconds at the start of the epoch */
    int epochs;        /* epochs run */
    epoch_stats last;  /* of the last epoch */
    float confusion[MODEL_N_CLASSES * MODEL_N_CLASSES]; /* last evaluation, summed over ranks */
} mnist_task;

static mnist_task *M(const trainer *t) { return t->state; }

/* ---- data ------------------------------------------------------------------------------------ */

/* Every rank must have loaded data of the same size as rank 0 (node-local copies can differ), or
 * their step plans, and so their collectives, would not match. Collective. */
static ddp_status mnist_same_data(trainer *t)
{
    mnist_task *s = M(t);
    uint64_t mine[2] = {s->train.n, s->test.n}, root[2] = {s->train.n, s->test.n};
    uint64_t *dev = ddp_alloc(t->ctx, sizeof root);
    trainer_must(t, dev ? DDP_OK : DDP_ERR_NOMEM, "allocating the data-size buffer");
    trainer_must(t, ddp_upload(t->ctx, dev, root, sizeof root), "uploading data sizes");
    trainer_must(t, ddp_broadcast(t->ctx, dev, sizeof root, 0), "broadcasting data sizes");
    trainer_must(t, ddp_download(t->ctx, root, dev, sizeof root), "downloading data sizes");
    ddp_free(t->ctx, dev);
    if (mine[0] == root[0] && mine[1] == root[1])
        return DDP_OK;
    DDP_ERROR("%s holds %llu train / %llu test samples here but %llu / %llu on rank 0: give every "
              "rank the same data (copy the same files to every node, or use a shared --data folder)",
              t->o->data_dir, (unsigned long long)mine[0], (unsigned long long)mine[1],
              (unsigned long long)root[0], (unsigned long long)root[1]);
    return DDP_ERR_MISMATCH;
}

/* The training sampler: strided, or, where the ranks share a --global-batch's micro-batches
 * unevenly, blocks of --batch samples (ddp.h). */
static ddp_sampler_opts mnist_sampler_opts(const trainer *t)
{
    long v = t->o->global_batch / t->o->batch;
    int uneven = t->o->global_batch && v % t->world != 0;
    return (ddp_sampler_opts){.n_samples = M(t)->train.n, .world_size = t->world, .rank = t->rank,
                              .seed = t->o->seed, .shuffle = t->o->shuffle, .drop_last = 0,
                              .block = uneven ? (size_t)t->o->batch : 0,
                              .blocks_per_step = uneven ? (int)v : 0};
}

/* Creates the sampler and derives the step plan; the same outcome on every rank. */
static ddp_status mnist_plan(trainer *t, train_plan *plan)
{
    mnist_task *s = M(t);
    long g = t->o->global_batch;
    char what[32];
    snprintf(what, sizeof what, "--batch %d", t->o->batch);
    plan->accum = t->o->accum;
    TRY_OK(trainer_plan_global(t, plan, g ? (train_fixed_batch){"global-batch", g, "samples"}
                                          : (train_fixed_batch){0}, t->o->batch, what));
    ddp_sampler_opts so = mnist_sampler_opts(t);
    TRY_OK(ddp_sampler_create(&so, &s->sampler));
    size_t per_step = (size_t)t->o->batch * (size_t)plan->accum, n = ddp_sampler_len(s->sampler);
    plan->steps_per_epoch = (long)(n / per_step);
    if (s->test.n == 0) {
        DDP_ERROR("%s: the test set (t10k files) has 0 samples: evaluation needs at least one; put "
                  "test images in the folder", t->o->data_dir);
        return DDP_ERR_INVALID_ARG;
    }
    if (plan->steps_per_epoch == 0) {
        DDP_ERROR("--batch %d x --accum %d is more than the %zu training samples each of the %d rank(s) "
                  "gets per epoch: allowed is --batch x --accum from 1 to %zu (or use fewer ranks)",
                  t->o->batch, plan->accum, n, t->world, n);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

/* Both splits, the same sizes on every rank, the step plan. */
static ddp_status mnist_open(trainer *t, train_plan *plan)
{
    mnist_task *s = M(t);
    ddp_status st = mnist_load_dir(t->o->data_dir, "train", &s->train);
    if (st == DDP_OK)
        st = mnist_load_dir(t->o->data_dir, "t10k", &s->test);
    st = trainer_agree(t, st);
    if (st == DDP_OK)
        st = trainer_agree(t, mnist_same_data(t));
    if (st == DDP_OK)
        st = trainer_agree(t, mnist_plan(t, plan));
    s->pixels = (size_t)s->train.rows * (size_t)s->train.cols;
    plan->n_train = s->train.n;
    return st;
}

/* The configuration a checkpoint must match: "cnn", or "mlp" and the widths. */
static void mnist_fingerprint(const model_config *m, char *buf, size_t n)
{
    if (m->kind == MODEL_CNN) {
        snprintf(buf, n, "cnn");
        return;
    }
    size_t used = (size_t)snprintf(buf, n, "mlp ");
    for (int i = 0; i < m->n_widths && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%d", i ? "-" : "", m->widths[i]);
}

/* The model and the host buffers of one batch. */
static ddp_status mnist_build(trainer *t, train_view *v)
{
    mnist_task *s = M(t);
    const train_opts *o = t->o;
    model_config cfg = o->model;
    cfg.reducer_grads = o->zero == 2; /* --zero 2: the reducer's buckets hold the gradients */
    TRY_OK(trainer_agree(t, model_create(t->ctx, t->ops, &cfg, &s->model)));
    size_t batch = (size_t)o->batch;
    s->eval_idx = malloc(batch * sizeof *s->eval_idx);
    s->pred = malloc(batch * sizeof *s->pred);
    s->x_host = malloc(batch * s->pixels * sizeof *s->x_host);
    s->y_host = malloc(batch * sizeof *s->y_host);
    int ok = s->eval_idx && s->pred && s->x_host && s->y_host;
    trainer_must(t, ok ? DDP_OK : DDP_ERR_NOMEM, "allocating batch buffers");
    model *m = s->model;
    ddp_dtype p;
    *v = (train_view){.descs = model_descs(m), .n_params = model_n_params(m),
                      .numel = model_numel(m), .numel_total = model_numel_total(m),
                      .weights = model_weights(m, &p), .grads = model_grads(m),
                      .reducer_grads = cfg.reducer_grads, .precision = cfg.precision,
                      .optim = {.kind = OPTIM_SGD, .momentum = (float)o->momentum,
                                .weight_decay = (float)o->weight_decay},
                      .x_bytes = batch * s->pixels * sizeof(float), .y_bytes = batch * sizeof(int),
                      .samples_per_step = o->batch * trainer_micro_total(t), .unit = "samples"};
    mnist_fingerprint(&cfg, v->model_fp, sizeof v->model_fp);
    return DDP_OK;
}

/* ZeRO: forward passes wait for the all-gather layer by layer */
static void mnist_attach(trainer *t)
{
    model_set_gather(M(t)->model, t->o->zero ? t->reducer : NULL);
}
static ddp_status mnist_zero_grad(trainer *t) { return model_zero_grad(M(t)->model); }

/* Constant, or cosine-decayed over the planned steps. */
static double mnist_lr(const trainer *t, long step)
{
    if (!t->o->cosine)
        return t->o->lr;
    return t->o->lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)t->total_steps));
}

/* ---- a step ---------------------------------------------------------------------------------- */

/* The next training micro-batch from the prefetcher, uploaded. */
static void mnist_batch(trainer *t)
{
    mnist_task *s = M(t);
    const float *x = NULL;
    const int *y = NULL;
    trainer_must(t, prefetch_next(s->prefetch, &x, &y), "getting the next batch");
    trainer_data(t, prefetch_last_fp(s->prefetch), t->o->batch);
    trainer_upload(t, x, (size_t)t->o->batch * s->pixels * sizeof *x, y,
                   (size_t)t->o->batch * sizeof *y);
    prefetch_release(s->prefetch);
}

static void mnist_forward(trainer *t)
{
    trainer_must(t, model_forward_train(M(t)->model, t->x_dev[t->slot], t->y_dev[t->slot],
                                        t->o->batch, t->loss_dev), "forward pass");
}

static void mnist_backward(trainer *t, float loss_scale)
{
    model *m = M(t)->model;
    if (loss_scale != 1.0f)
        trainer_must(t, model_scale_loss_grad(m, loss_scale), "scaling the loss gradient");
    trainer_must(t, model_backward(m, t->reducer), "backward pass");
}

/* Sharded evaluation: rank r takes test samples r, r + world, ...; the confusion counts are summed
 * over ranks. Returns the accuracy (0..1), the same on every rank. */
static double mnist_evaluate(trainer *t)
{
    mnist_task *s = M(t);
    ddp_watch_where(t->step, -1, "validation");
    memset(s->confusion, 0, sizeof s->confusion);
    size_t next = (size_t)t->rank;
    while (next < s->test.n) {
        int n = 0;
        for (; n < t->o->batch && next < s->test.n; n++, next += (size_t)t->world)
            s->eval_idx[n] = next;
        mnist_gather(&s->test, s->eval_idx, n, s->x_host, s->y_host);
        trainer_upload(t, s->x_host, (size_t)n * s->pixels * sizeof *s->x_host, s->y_host,
                       (size_t)n * sizeof *s->y_host);
        trainer_must(t, model_forward(s->model, t->x_dev[t->slot], t->y_dev[t->slot], n, NULL,
                                      NULL, s->pred), "evaluation forward pass");
        trainer_batch_done(t);
        for (int i = 0; i < n; i++)
            s->confusion[s->y_host[i] * MODEL_N_CLASSES + s->pred[i]] += 1.0f;
    }
    trainer_must(t, ddp_allreduce_host(t->ctx, s->confusion, MODEL_N_CLASSES * MODEL_N_CLASSES,
                                       DDP_FP32, DDP_SUM), "summing evaluation counts");
    return model_confusion_accuracy(s->confusion);
}

/* Rank 0, after the first step (oneDNN picks its implementations when the primitives are made,
 * cuDNN its algorithms when the plans are measured): what runs. */
static void mnist_report_impl(trainer *t)
{
    bool cpu = ddp_backend(t->ctx) == DDP_BACKEND_CPU;
    ddp_dtype p = t->o->model.precision;
    const char *impl = cpu ? ops_dnnl_describe(t->ops, p) : ops_cudnn_describe(t->ops, p);
    if (t->rank != 0 || !impl[0])
        return;
    trainer_progress_end(t);
    printf("%s (%s): %s\n", cpu ? "oneDNN" : "cuDNN", model_precision_name(p), impl);
    fflush(stdout);
}

/* ---- epochs ---------------------------------------------------------------------------------- */

/* The data workers start at the first step to train (0, or the resumed step). */
static void mnist_epoch_begin(trainer *t)
{
    mnist_task *s = M(t);
    if (!s->prefetch) {
        prefetch_plan pp = {.data = &s->train, .sampler = mnist_sampler_opts(t),
                                  .batch = t->o->batch, .accum = t->accum,
                                  .steps_per_epoch = t->steps_per_epoch,
                                  .total_steps = t->total_steps, .first_step = t->start.step,
                                  .seed = t->o->seed, .augment = t->o->augment,
                                  .workers = t->o->workers};
        trainer_must(t, prefetch_create(&pp, &s->prefetch), "starting the data workers");
    }
    trainer_loss_reset(t);
    trainer_clock(t);
    s->first = t->in_epoch;
    s->seconds = t->train_seconds;
}

static void mnist_after_step(trainer *t)
{
    if (t->step == 1)
        mnist_report_impl(t);
    if (t->rank == 0 && progress_due(&t->progress, t->step))
        trainer_progress(t, trainer_loss_sum(t) / (double)t->loss_micro, NULL);
}

/* The epoch's loss over the ranks, the evaluation, and rank 0's epoch line and metrics line. */
static void mnist_epoch_end(trainer *t)
{
    mnist_task *s = M(t);
    epoch_stats *e = &s->last;
    float sum = trainer_loss_sum(t);
    trainer_clock(t); /* the download waited for the device */
    double seconds = t->train_seconds - s->seconds;
    double sums[2] = {t->loss_nan ? NAN : sum, (double)t->loss_micro};
    trainer_must(t, ddp_allreduce_host(t->ctx, sums, 2, DDP_FP64, DDP_SUM), "summing losses");
    long per_step = (long)t->o->batch * trainer_micro_total(t);
    *e = (epoch_stats){.epoch = t->epoch, .steps = t->in_epoch - s->first,
                       .train_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0,
                       .samples_per_s = seconds > 0 ? (double)(t->in_epoch - s->first) *
                                                          (double)per_step / seconds : 0.0};
    e->test_accuracy = mnist_evaluate(t);
    trainer_clock_restart(t);
    s->epochs++;
    if (t->rank != 0)
        return;
    trainer_progress_end(t);
    printf("epoch %d: train loss %.4f, test accuracy %.2f%% (%ld steps, %.0f samples/s)\n",
           e->epoch + 1, e->train_loss, 100.0 * e->test_accuracy, e->steps, e->samples_per_s);
    fflush(stdout);
    if (t->metrics)
        metrics_epoch(t->metrics, e);
    ddp_metrics_set(t->scalars, "train/epoch_loss", e->train_loss, NULL);
    ddp_metrics_set(t->scalars, "eval/test_accuracy", e->test_accuracy, NULL);
    ddp_metrics_commit(t->scalars, t->step);
}

/* ---- reports --------------------------------------------------------------------------------- */

/* Rank 0: configuration at start-up. */
static void mnist_report_start(trainer *t)
{
    mnist_task *s = M(t);
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
        printf("compute: %s, %s; GEMM %s\n", t->ops->name, model_precision_name(p),
               ops_cuda_describe(t->ops, p));
    printf("memory: %s\n", malloc_describe());
    train_print_opts(stdout, t->o);
    if (t->o->requeue && !getenv("SLURM_JOB_ID"))
        printf("--requeue: not a Slurm job (SLURM_JOB_ID is unset): a stop will not requeue anything\n");
    printf("data: %zu train / %zu test samples; %zu per rank per epoch; %ld steps per epoch "
           "(floor of per-rank samples / (batch x accum)); %ld steps planned; %zu parameters\n",
           s->train.n, s->test.n, ddp_sampler_len(s->sampler), t->steps_per_epoch, t->total_steps,
           model_numel_total(s->model));
    fflush(stdout);
}

/* Rank 0: what the communicator sent for the gradients (payload of every backend all-reduce). */
static void mnist_report_comm(const trainer *t)
{
    ddp_comm_stats cs;
    if (t->rank != 0 || t->step == 0 || ddp_comm_stats_get(t->ctx, &cs) != DDP_OK)
        return;
    printf("gradient all-reduce (%s on the wire): %llu all-reduces, %llu bytes, %.0f bytes per step\n",
           ddp_dtype_name(t->o->grad_dtype), (unsigned long long)cs.allreduce_calls,
           (unsigned long long)cs.allreduce_bytes, (double)cs.allreduce_bytes / (double)t->step);
}

/* The classification report, throughput and the summary metrics line (rank 0). Collective. */
static ddp_status mnist_report_end(trainer *t)
{
    mnist_task *s = M(t);
    if (s->epochs == 0) /* resumed at the end: nothing left to train */
        s->last.test_accuracy = mnist_evaluate(t);
    mnist_report_comm(t);
    long per_step = (long)t->o->batch * trainer_micro_total(t);
    run_stats r = {
        .world_size = t->world, .epochs = s->epochs, .steps = t->step,
        .test_accuracy = s->last.test_accuracy, .train_loss = s->last.train_loss,
        .train_seconds = t->train_seconds,
        .samples_per_s = t->train_seconds > 0
                             ? (double)((t->step - t->start.step) * per_step) / t->train_seconds : 0.0,
        .wall_seconds = train_now() - t->wall_start, .backend = ddp_backend_name(ddp_backend(t->ctx)),
        .stopped_by_signal = t->stopped};
    train_comm_stats(t->ctx, &r);
    if (t->rank != 0)
        return DDP_OK;
    printf("\nclassification report (test set, after the last epoch):\n");
    model_class_report(stdout, s->confusion);
    printf("\nthroughput: %.1f samples/s across %d rank(s) (%ld steps in %.2f s of training, %.2f s wall)\n",
           r.samples_per_s, r.world_size, r.steps, r.train_seconds, r.wall_seconds);
    if (r.exposed_comm_ms >= 0)
        printf("communication (trace, mean over ranks): %.2f ms of all-reduce per step, %.2f ms exposed "
               "(the step waited for it), %.0f%% hidden behind backward\n", r.comm_ms, r.exposed_comm_ms,
               100.0 * r.hidden_fraction);
    fflush(stdout);
    if (t->metrics)
        metrics_summary(t->metrics, t->o, &r);
    return DDP_OK;
}

static void mnist_release(trainer *t)
{
    mnist_task *s = M(t);
    prefetch_destroy(s->prefetch);
    free(s->eval_idx);
    free(s->pred);
    free(s->x_host);
    free(s->y_host);
    model_destroy(s->model);
    ddp_sampler_destroy(s->sampler);
    mnist_free(&s->train);
    mnist_free(&s->test);
}

const train_task train_task_mnist = {
    .state_bytes = sizeof(mnist_task), .open = mnist_open, .build = mnist_build,
    .lr = mnist_lr, .attach = mnist_attach,
    .zero_grad = mnist_zero_grad, .batch = mnist_batch, .forward = mnist_forward,
    .backward = mnist_backward, .epoch_begin = mnist_epoch_begin, .after_step = mnist_after_step,
    .epoch_end = mnist_epoch_end, .report_start = mnist_report_start,
    .report_end = mnist_report_end, .release = mnist_release,
};
