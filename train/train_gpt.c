/* train_gpt.c - ddp-train --model gpt2 (see train_gpt.h): the GPT-2 training loop on libddp.
 *
 * Every rank builds the same seeded model (or reads the same llm.c file) and the replicas are
 * verified; the loader gives each rank disjoint windows of B x T + 1 tokens, shuffled per epoch;
 * an optimizer step is accum micro-batches whose gradients the reducer averages during the last
 * backward pass (--zero 2: reduce-scatters from its bucket buffers, the model having no gradient
 * buffer, during the last backward pass, or during every one with --zero-accum reduce); then the
 * global gradient norm (the same on every rank, computed from the averaged gradients) sets the
 * clipping factor, and AdamW applies the step with the learning rate of the schedule (linear
 * warm-up, cosine decay to lr x lr_floor). The ranks agree on stop requests and non-finite losses
 * as the MNIST trainer does (ddp_train.c), so checkpoints, resume, requeue and the NaN policy
 * behave the same; the loader's position is the checkpoint's (epoch, step_in_epoch), so resuming
 * is exact. Validation counts every target token of the validation shards once over all ranks.
 */
#include "train_gpt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "cpu_isa.h"
#include "gpt2.h"
#include "malloc_policy.h"
#include "mfu.h"
#include "tokens.h"
#include "train_report.h"
#include "train_state.h"
#include "train_trace.h"

#define GPT_STOP_EVERY 8 /* steps between stop-flag agreements */
#define GPT_EOT 50256    /* GPT-2's <|endoftext|>: the first token of a sample */
#define GPT_SCAN_TOKENS (1ul << 28) /* token sets up to 512 MiB are checked before training */

/* The memory report of the end of training, MiB per rank (gpt_memory). */
typedef struct gpt_mem_report {
    double params, grads, optimizer, activations, comm, states, peak_rss;
    double device_used, device_total; /* MiB, cudaMemGetInfo on CUDA; NAN on the CPU */
    double bytes_rep, bytes_shard; /* per parameter: replicated, divided over the ranks */
    double predicted;              /* model states by the ZeRO formula */
} gpt_mem_report;

typedef struct gpt_trainer {
    ddp_ctx *ctx;
    const train_opts *o;
    train_signals sig;
    int rank, world;
    gpt2_config cfg;
    int B, T, accum;
    ops_handle *ops;
    gpt2 *g;
    ddp_reducer *reducer;
    ddp_scaler *scaler;    /* --precision fp16 or --grad-dtype fp16: dynamic loss scaling */
    tokens_set *train_data, *val_data;
    tokens_loader *loader;
    tokens_val *val;
    bpe_vocab *vocab;      /* rank 0 with --sample: GPT-2's vocabulary */
    int32_t *x_host, *y_host; /* (B, T) */
    int *x_dev[2], *y_dev[2]; /* backend memory: two batch slots, filled in turn */
    int slot;
    float *loss_dev;       /* (1) sum of micro-batch mean losses since the last download */
    float *vloss_dev;      /* (1) one validation batch's mean loss */
    FILE *metrics;
    long steps_per_epoch, total_steps, step, in_epoch;
    int epoch;
    train_pos start;
    long saved_step;
    train_setup setup;
    int stopped, nan_stopped, save_failed;
    double train_seconds, last_norm, last_loss, val_loss;
    long loss_micro;       /* micro-batches summed in loss_dev */
    double peak_rss_max;   /* MiB: the largest VmHWM over the ranks at the end of training */
    double flops_token;    /* model FLOPs per token, llm.c's 6N + 6LCT (mfu.h) */
    double peak_tflops;    /* one device's peak for this precision (--peak-tflops or the table);
                              -1: unknown */
    const char *device;    /* the GPU's name ("" on the CPU) */
    double steady_seconds; /* train_seconds at the end of this run's first step */
    double device_used_max; /* MiB: the most device memory in use over the ranks (CUDA), NAN */
    progress_bar progress;
} gpt_trainer;

/* A failure only this rank may have seen: stop the whole job so no peer waits forever. */
static void gpt_must(gpt_trainer *t, ddp_status st, const char *what)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("%s failed: %s; stopping every rank", what, ddp_strerror(st));
    ddp_abort(t->ctx, 1);
}

/* Every rank learns whether any rank failed (see train_agree in ddp_train.c). */
static ddp_status gpt_agree(gpt_trainer *t, ddp_status local)
{
    int64_t failed = local != DDP_OK;
    gpt_must(t, ddp_allreduce_host(t->ctx, &failed, 1, DDP_INT64, DDP_SUM), "agreeing on a status");
    if (failed == 0)
        return DDP_OK;
    if (local == DDP_OK)
        DDP_ERROR("%lld rank(s) failed (see their messages); exiting", (long long)failed);
    return local != DDP_OK ? local : DDP_ERR_MISMATCH;
}

/* A number for a JSON line: null for NaN or inf (JSON has neither). */
static const char *gpt_json(char *buf, size_t n, double v)
{
    snprintf(buf, n, isfinite(v) ? "%.6f" : "null", v);
    return buf;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* The validation pattern: --val-data, or the training pattern with "train" replaced by "val"
 * (llm.c's shard names). NULL (logged) when the training pattern has no "train" in it. */
static char *gpt_val_pattern(const train_opts *o)
{
    char *p = NULL;
    if (o->gpt.val_data)
        return strdup(o->gpt.val_data);
    if (tokens_val_pattern(o->data_dir, &p) != DDP_OK)
        DDP_ERROR("--data %s: no \"train\" in the pattern to derive the validation shards from: "
                  "give --val-data PATTERN", o->data_dir);
    return p;
}

/* DDP_ERR_INVALID_ARG (logged, naming the shard or the pattern) when the validation shards hold no
 * target: every shard has 0 or 1 tokens, and the validation loss would be 0 / 0. */
static ddp_status gpt_check_val(const gpt_trainer *t, const char *pattern)
{
    const tokens_set *v = t->val_data;
    if (tokens_set_n_targets(v) > 0)
        return DDP_OK;
    const tokens_shard *sh = tokens_set_shard(v, 0);
    char what[512];
    if (tokens_set_n_shards(v) == 1)
        snprintf(what, sizeof what, "%s: %zu token%s", sh->path, sh->n_tokens,
                 sh->n_tokens == 1 ? "" : "s");
    else
        snprintf(what, sizeof what, "%s: %zu shards of %zu tokens in all, none with 2", pattern,
                 tokens_set_n_shards(v), tokens_set_n_tokens(v));
    DDP_ERROR("%s: the validation set has no target token to score (the validation loss would be "
              "NaN): a validation window needs T + 1 = %d tokens (--seq %d, and at least 2 for one "
              "target); give --val-data a shard of at least %d tokens", what, t->T + 1, t->T,
              t->T + 1);
    return DDP_ERR_INVALID_ARG;
}

static ddp_status gpt_open_data(gpt_trainer *t)
{
    const train_opts *o = t->o;
    ddp_status st = tokens_set_open(o->data_dir, t->cfg.vocab, &t->train_data);
    char *vpat = st == DDP_OK ? gpt_val_pattern(o) : NULL;
    if (st == DDP_OK && !vpat)
        st = DDP_ERR_INVALID_ARG;
    if (st == DDP_OK)
        st = tokens_set_open(vpat, t->cfg.vocab, &t->val_data);
    if (st == DDP_OK)
        st = gpt_check_val(t, vpat);
    free(vpat);
    /* A token outside the vocabulary is found before training where reading every token is cheap;
     * in larger sets the loaders find it when they hand the window out (and stop the job). */
    if (st == DDP_OK && tokens_set_n_tokens(t->train_data) <= GPT_SCAN_TOKENS)
        st = tokens_set_scan(t->train_data);
    if (st == DDP_OK && tokens_set_n_tokens(t->val_data) <= GPT_SCAN_TOKENS)
        st = tokens_set_scan(t->val_data);
    if (st == DDP_OK && t->rank == 0 && o->metrics_path) {
        t->metrics = fopen(o->metrics_path, "w");
        if (!t->metrics) {
            DDP_ERROR("--metrics %s: cannot create the file: %s", o->metrics_path, strerror(errno));
            st = DDP_ERR_IO;
        }
    }
    return st;
}

#define GPT_DATA_COUNTS 3   /* per rank: training tokens, training windows, validation tokens */
#define GPT_DATA_LISTED 32  /* ranks listed by name in a data-size mismatch */

/* Appends rank r's counts (c: GPT_DATA_COUNTS) to buf at *len, at most n bytes in all. */
static void gpt_data_entry(char *buf, size_t n, size_t *len, int r, const int64_t *c, int T1)
{
    if (*len < n)
        *len += (size_t)snprintf(buf + *len, n - *len, "%srank %d: %lld tokens, %lld windows of %d, "
                                 "%lld validation tokens", r ? "; " : "", r, (long long)c[0],
                                 (long long)c[1], T1, (long long)c[2]);
}

/* Every rank must train on the same number of windows and validate on the same tokens: a rank with
 * fewer windows would end its epoch first and leave the others waiting in a collective. Each rank
 * fills its slot of a (world, GPT_DATA_COUNTS) table that a sum all-reduce completes; rank 0 lists
 * every rank's counts and each rank that differs from rank 0 names its own patterns.
 * DDP_ERR_MISMATCH on every rank when the counts differ. */
static ddp_status gpt_same_data(gpt_trainer *t)
{
    size_t n = (size_t)t->world * GPT_DATA_COUNTS;
    int64_t *all = calloc(n, sizeof *all);
    gpt_must(t, all ? DDP_OK : DDP_ERR_NOMEM, "allocating the data-size table");
    int64_t *mine = all + (size_t)t->rank * GPT_DATA_COUNTS;
    mine[0] = (int64_t)tokens_set_n_tokens(t->train_data);
    mine[1] = (int64_t)tokens_set_n_windows(t->train_data, (size_t)t->B * (size_t)t->T + 1);
    mine[2] = (int64_t)tokens_set_n_tokens(t->val_data);
    gpt_must(t, ddp_allreduce_host(t->ctx, all, n, DDP_INT64, DDP_SUM), "agreeing on data sizes");
    int differ = 0;
    for (int r = 1; r < t->world; r++)
        differ |= memcmp(all + (size_t)r * GPT_DATA_COUNTS, all, sizeof *all * GPT_DATA_COUNTS) != 0;
    if (differ && t->rank == 0) {
        char list[4096];
        size_t len = 0;
        for (int r = 0; r < t->world && r < GPT_DATA_LISTED; r++)
            gpt_data_entry(list, sizeof list, &len, r, all + (size_t)r * GPT_DATA_COUNTS,
                           t->B * t->T + 1);
        DDP_ERROR("the ranks were given different token shards: %s%s: give every rank the same "
                  "--data and --val-data files (the same copy on every node, or a shared folder)",
                  list, t->world > GPT_DATA_LISTED ? "; ..." : "");
    }
    if (differ && t->rank != 0 && memcmp(mine, all, sizeof *all * GPT_DATA_COUNTS) != 0)
        DDP_ERROR("--data %s (%lld tokens, %lld windows) and the validation shards (%lld tokens) "
                  "differ from rank 0's", t->o->data_dir, (long long)mine[0], (long long)mine[1],
                  (long long)mine[2]);
    free(all);
    return differ ? DDP_ERR_MISMATCH : DDP_OK;
}

/* The loader, the accumulation and the step plan; the same outcome on every rank. */
static ddp_status gpt_plan(gpt_trainer *t)
{
    const train_opts *o = t->o;
    tokens_loader_opts lo = {.batch = t->B, .seq = t->T, .rank = t->rank, .world_size = t->world,
                             .seed = o->seed, .shuffle = o->shuffle};
    TRY_OK(tokens_loader_create(t->train_data, &lo, &t->loader));
    TRY_OK(tokens_val_create(t->val_data, t->B, t->T, t->world, t->rank, &t->val));
    long per_micro = (long)t->B * t->T * t->world;
    t->accum = o->accum;
    if (o->gpt.total_batch_tokens) {
        if (o->gpt.total_batch_tokens % per_micro != 0) {
            DDP_ERROR("--total-batch-tokens %ld is not a multiple of --batch %d x --seq %d x %d "
                      "rank(s) = %ld tokens: use a multiple of %ld", o->gpt.total_batch_tokens,
                      t->B, t->T, t->world, per_micro, per_micro);
            return DDP_ERR_INVALID_ARG;
        }
        t->accum = (int)(o->gpt.total_batch_tokens / per_micro);
    }
    long windows = (long)tokens_loader_steps_per_epoch(t->loader);
    t->steps_per_epoch = windows / t->accum;
    if (t->steps_per_epoch == 0) {
        DDP_ERROR("%s: %ld windows of %d x %d tokens per rank per epoch, fewer than the %d "
                  "micro-batches of one step: use more data, a smaller --batch, --seq or "
                  "--total-batch-tokens, or fewer ranks", o->data_dir, windows, t->B, t->T + 1,
                  t->accum);
        return DDP_ERR_INVALID_ARG;
    }
    t->total_steps = t->steps_per_epoch * o->epochs;
    if (o->max_steps > 0 && o->max_steps < t->total_steps)
        t->total_steps = o->max_steps;
    return DDP_OK;
}

/* Uploads (n, T) tokens and targets into the next batch slot through libddp's staging. */
static void gpt_upload(gpt_trainer *t, const int *x, const int *y, size_t n)
{
    int s = t->slot ^= 1;
    gpt_must(t, ddp_stage_upload(t->ctx, s, 0, t->x_dev[s], x, n * sizeof *x), "uploading tokens");
    gpt_must(t, ddp_stage_upload(t->ctx, s, 1, t->y_dev[s], y, n * sizeof *y), "uploading targets");
    gpt_must(t, ddp_stage_acquire(t->ctx, s), "waiting for the batch upload");
}

static void gpt_batch_done(gpt_trainer *t)
{
    gpt_must(t, ddp_stage_release(t->ctx, t->slot), "releasing the batch buffers");
}

/* ---- model ------------------------------------------------------------------------------------ */

/* The model's configuration: --init-from's file header, else the flags. */
static ddp_status gpt_config(gpt_trainer *t)
{
    const train_gpt_opts *g = &t->o->gpt;
    t->cfg = g->cfg;
    if (g->init_from) {
        TRY_OK(gpt2_llmc_read_config(g->init_from, &t->cfg));
        if (t->T > t->cfg.max_seq) {
            DDP_ERROR("--seq %d is longer than the %d positions of %s: allowed is 1 to %d", t->T,
                      t->cfg.max_seq, g->init_from, t->cfg.max_seq);
            return DDP_ERR_INVALID_ARG;
        }
    }
    return DDP_OK;
}

/* Every rank must hold the same initial parameters. */
static ddp_status gpt_verify(gpt_trainer *t, const char *when)
{
    size_t n = gpt2_numel_total(t->g);
    float *host = malloc(n * sizeof *host);
    gpt_must(t, host ? DDP_OK : DDP_ERR_NOMEM, "allocating the parameter copy");
    gpt_must(t, ddp_download(t->ctx, host, gpt2_params(t->g), n * sizeof *host),
             "downloading parameters");
    ddp_status st = ddp_verify_replicas(t->ctx, gpt2_descs(t->g), gpt2_n_params(t->g), host);
    free(host);
    if (st != DDP_OK && st != DDP_ERR_MISMATCH)
        gpt_must(t, st, "verifying replicas");
    if (st == DDP_OK && t->rank == 0 && when)
        printf("replicas identical %s (checksums of every parameter agree)\n", when);
    return st;
}

static void gpt_alloc_buffers(gpt_trainer *t)
{
    size_t n = (size_t)t->B * (size_t)t->T;
    t->x_host = malloc(n * sizeof *t->x_host);
    t->y_host = malloc(n * sizeof *t->y_host);
    int ok = t->x_host && t->y_host;
    for (int i = 0; i < 2; i++) {
        t->x_dev[i] = ddp_alloc(t->ctx, n * sizeof *t->x_dev[i]);
        t->y_dev[i] = ddp_alloc(t->ctx, n * sizeof *t->y_dev[i]);
        ok = ok && t->x_dev[i] && t->y_dev[i];
    }
    t->loss_dev = ddp_alloc(t->ctx, sizeof *t->loss_dev);
    t->vloss_dev = ddp_alloc(t->ctx, sizeof *t->vloss_dev);
    gpt_must(t, ok && t->loss_dev && t->vloss_dev ? DDP_OK : DDP_ERR_NOMEM,
             "allocating batch buffers");
}

/* ops, model (seeded or from --init-from), replica check, reducer, buffers. */
static ddp_status gpt_build(gpt_trainer *t)
{
    const train_opts *o = t->o;
    ddp_status st = gpt_agree(t, ops_open(t->ctx, o->threads, &t->ops));
    if (st == DDP_OK)
        st = gpt_agree(t, ops_cuda_set_tf32(t->ops, o->tf32));
    gpt2_opts go = {.max_batch = t->B, .seq = t->T, .precision = o->model.precision,
                    .seed = o->seed, .shard_world = o->zero ? t->world : 0,
                    .shard_rank = t->rank, .reducer_grads = o->zero == 2,
                    .recompute = o->gpt.recompute};
    if (st == DDP_OK)
        st = gpt_agree(t, gpt2_create(t->ctx, t->ops, &t->cfg, &go, &t->g));
    if (st == DDP_OK && o->gpt.init_from)
        st = gpt_agree(t, gpt2_llmc_load(t->g, o->gpt.init_from));
    if (st == DDP_OK && o->broadcast_init)
        gpt_must(t, ddp_broadcast_params(t->ctx, gpt2_params(t->g), gpt2_numel_total(t->g)),
                 "broadcasting parameters");
    if (st == DDP_OK)
        st = gpt_verify(t, NULL);
    if (st != DDP_OK)
        return st;
    ddp_reducer_opts ro;
    ddp_reducer_opts_default(&ro);
    ro.bucket_mb = o->bucket_mb;
    ro.first_bucket_mb = o->first_bucket_mb;
    ro.comm_dtype = o->grad_dtype;
    ro.defer_launch = o->no_overlap;
    ro.strict_order = 1; /* every rank runs the same backward: a different order is a bug */
    ro.zero_stage = o->zero;
    /* --zero 1: parameter-order buckets. A bucket rebuilt in ready order is several runs of the
     * tensor-major layout, which a reduce-scatter needs packed: the reducer's packing buffer is
     * as large as the gradients (4 bytes per parameter), more than sharding saves at 2 ranks.
     * --zero 2: the reducer owns the gradients (the model has no gradient buffer), in buckets
     * planned in the order backward marks, whose buffers pack their runs themselves. */
    ro.static_buckets = o->zero == 1;
    int *order = NULL;
    if (o->zero == 2) { /* creating the reducer is collective then: no rank may skip it */
        order = malloc((size_t)gpt2_n_params(t->g) * sizeof *order);
        gpt_must(t, order ? DDP_OK : DDP_ERR_NOMEM, "allocating the ready order");
        gpt2_ready_order(t->g, order);
        ro.ready_order = order;
        /* --zero-accum local (default): micro-steps add in the bucket buffers, one
         * reduce-scatter per optimizer step, stage 0's sums; reduce: one per micro-step (also
         * at --accum 1, where the two are the same run and buffers are shared) */
        ro.local_accum = o->gpt.zero_accum != 2 && t->accum > 1;
    }
    st = gpt_agree(t, ddp_reducer_create(t->ctx, gpt2_grads(t->g), gpt2_numel(t->g),
                                         gpt2_n_params(t->g), &ro, &t->reducer));
    free(order);
    if (st == DDP_OK && o->zero > 0) { /* the model's moments are the reducer's shard's */
        size_t off = 0, n = 0, moff = 0, mn = 0;
        ddp_reducer_shard(t->reducer, &off, &n);
        gpt2_optimizer_range(t->g, &moff, &mn);
        st = off == moff && n == mn ? DDP_OK : DDP_ERR_STATE;
        if (st != DDP_OK)
            DDP_ERROR("the reducer's shard [%zu, +%zu) is not the model's [%zu, +%zu)", off, n,
                      moff, mn);
        st = gpt_agree(t, st);
        gpt2_set_gather(t->g, t->reducer); /* forward passes wait for the gather layer by layer */
    }
    if (st == DDP_OK && (o->grad_dtype == DDP_FP16 || o->model.precision == DDP_FP16)) {
        ddp_scaler_opts so;
        ddp_scaler_opts_default(&so);
        so.init_scale = o->loss_scale_init;
        so.growth_interval = o->loss_scale_interval;
        st = gpt_agree(t, ddp_scaler_create(t->ctx, &so, &t->scaler));
    }
    if (st == DDP_OK)
        gpt_alloc_buffers(t);
    return st;
}

/* The checkpoint's view of the run: parameters, the two AdamW moments, the step plan. */
static void gpt_setup(gpt_trainer *t)
{
    gpt2 *g = t->g;
    t->setup = (train_setup){.ctx = t->ctx, .o = t->o,
                             .n_train = tokens_loader_n_windows(t->loader),
                             .steps_per_epoch = t->steps_per_epoch,
                             .total_steps = t->total_steps, .scaler = t->scaler};
    t->setup.buf = (train_buffers){.descs = gpt2_descs(g), .n_params = gpt2_n_params(g),
                                   .numel = gpt2_numel_total(g), .params = gpt2_params(g),
                                   .n_opt = 2, .opt_names = {"adam_m", "adam_v"},
                                   .opt = {gpt2_adam_m(g), gpt2_adam_v(g)}};
    gpt2_optimizer_range(g, &t->setup.buf.opt_offset, &t->setup.buf.opt_n);
    const gpt2_config *c = &t->cfg;
    snprintf(t->setup.buf.model_fp, sizeof t->setup.buf.model_fp,
             "gpt2 L%d NH%d C%d maxT%d V%d T%d accum%d", c->layers, c->heads, c->channels,
             c->max_seq, c->vocab, t->T, t->accum);
}

/* The FLOPs per token and the peak the MFU is measured against: --peak-tflops, else the table's
 * for this GPU and precision (16-bit tensor cores for bf16 and fp16, TF32 with --tf32, else
 * fp32), else unknown (the CPU, or a GPU the table lacks). */
static void gpt_mfu_setup(gpt_trainer *t)
{
    const train_opts *o = t->o;
    t->flops_token = (double)mfu_gpt2_flops_per_token(&t->cfg, t->T);
    t->device = ddp_backend(t->ctx) == DDP_BACKEND_CUDA ? ops_cuda_device_name(t->ops) : "";
    mfu_precision p = o->model.precision != DDP_FP32 ? MFU_16BIT : o->tf32 ? MFU_TF32 : MFU_FP32;
    t->peak_tflops = o->gpt.peak_tflops > 0.0 ? o->gpt.peak_tflops : mfu_peak_tflops(t->device, p);
}

/* ---- one optimizer step ------------------------------------------------------------------------ */

/* Learning rate of step `step` (0-based): linear warm-up, then cosine decay to lr x lr_floor. */
static double gpt_lr(const gpt_trainer *t, long step)
{
    const train_gpt_opts *g = &t->o->gpt;
    double lr = t->o->lr, floor = lr * g->lr_floor;
    if (step < g->warmup_steps)
        return lr * (double)(step + 1) / (double)g->warmup_steps;
    long span = t->total_steps - g->warmup_steps;
    double ratio = span > 1 ? (double)(step - g->warmup_steps) / (double)(span - 1) : 1.0;
    if (ratio > 1.0)
        ratio = 1.0;
    return floor + 0.5 * (1.0 + cos(M_PI * ratio)) * (lr - floor);
}

/* Whether the ranks agree before the update of this step (stop flags, NaN). */
static int gpt_agree_due(const gpt_trainer *t, long step_in_epoch)
{
    const train_opts *o = t->o;
    long next = t->step + 1;
    return o->nan_skip || next % GPT_STOP_EVERY == 0 || step_in_epoch + 1 == t->steps_per_epoch ||
           next == t->total_steps ||
           (o->checkpoint_dir && o->checkpoint_every && next % o->checkpoint_every == 0);
}

/* One host all-reduce of (SIGUSR1, SIGTERM, "my loss is not finite"). Returns the number of ranks
 * whose loss was not finite. */
static int64_t gpt_agree_step(gpt_trainer *t)
{
    float sum = 0.0f;
    gpt_must(t, ddp_download(t->ctx, &sum, t->loss_dev, sizeof sum), "downloading the loss");
    int64_t flags[3] = {*t->sig.usr1 != 0, *t->sig.term != 0, !isfinite(sum)};
    gpt_must(t, ddp_allreduce_host(t->ctx, flags, 3, DDP_INT64, DDP_SUM), "agreeing on a stop");
    if ((flags[0] > 0 || flags[1] > 0) && !t->stopped) {
        if (t->rank == 0) {
            progress_end(&t->progress);
            printf("%s received: every rank stops after step %ld\n",
                   flags[1] > 0 ? "SIGTERM" : "SIGUSR1", t->step + 1);
            fflush(stdout);
        }
        t->stopped = 1;
    }
    if (flags[2] > 0 && t->o->nan_skip) {
        float zero = 0.0f; /* the skipped step's loss leaves the running mean */
        gpt_must(t, ddp_upload(t->ctx, t->loss_dev, &zero, sizeof zero), "resetting the loss");
        t->loss_micro = 0;
    }
    return flags[2];
}

/* The factor on the loss of this micro-batch's backward pass: the loss scaler's scale (fp16), or
 * inf on the rank and step --inject-inf names (a test of the scaler's agreement), else 1. */
static float gpt_loss_scale(const gpt_trainer *t)
{
    float scale = t->scaler ? (float)ddp_scaler_scale(t->scaler) : 1.0f;
    for (int i = 0; i < t->o->n_inject; i++)
        if (t->o->inject_rank[i] == t->rank && t->o->inject_step[i] == t->step)
            scale = INFINITY;
    return scale;
}

/* One micro-batch. The reducer's micro-step begins after the forward pass: under --zero the
 * forward waits layer by layer for the parameters' all-gather (gpt2_set_gather), which
 * ddp_reducer_begin would wait for whole. */
static void gpt_micro_batch(gpt_trainer *t, int sync)
{
    ddp_trace_begin("data", t->step);
    gpt_must(t, tokens_loader_next(t->loader, t->x_host, t->y_host), "reading the next batch");
    gpt_upload(t, t->x_host, t->y_host, (size_t)t->B * (size_t)t->T);
    ddp_trace_end("data", t->step);
    ddp_trace_begin("forward", t->step);
    gpt_must(t, gpt2_forward(t->g, t->x_dev[t->slot], t->y_dev[t->slot], t->B, t->T,
                             t->loss_dev, true), "forward pass");
    ddp_trace_end("forward", t->step);
    gpt_must(t, ddp_reducer_begin(t->reducer, sync), "starting the reducer");
    ddp_trace_begin("backward", t->step);
    gpt_must(t, gpt2_backward(t->g, t->reducer, gpt_loss_scale(t)), "backward pass");
    gpt_batch_done(t);
    ddp_trace_end("backward", t->step);
    t->loss_micro++;
}

/* accum micro-batches, the averaged gradients, clipping and the AdamW step. */
static void gpt_step(gpt_trainer *t, long step_in_epoch)
{
    gpt_must(t, gpt2_zero_grad(t->g), "zeroing gradients");
    for (int micro = 0; micro < t->accum; micro++)
        gpt_micro_batch(t, micro == t->accum - 1);
    gpt_must(t, ddp_reducer_finish(t->reducer), "reducing gradients");
    if (gpt_agree_due(t, step_in_epoch)) {
        int64_t bad = gpt_agree_step(t);
        if (bad > 0) {
            if (t->rank == 0)
                progress_end(&t->progress);
            if (t->o->nan_skip) {
                DDP_WARN0("step %ld: the loss is NaN or inf on %lld rank(s): the step is not "
                          "applied (--nan-policy skip)", t->step + 1, (long long)bad);
                return;
            }
            DDP_ERROR("step %ld: the loss became NaN or inf on %lld rank(s): training stops (exit "
                      "1); lower --lr, or pass --nan-policy skip", t->step + 1, (long long)bad);
            t->nan_stopped = 1;
            return;
        }
    }
    size_t n = 0;
    float *grads = train_step_grads(t->reducer, gpt2_grads(t->g), &n);
    int step_ok = 1;
    if (t->scaler)
        gpt_must(t, ddp_scaler_unscale_update(t->scaler, grads, DDP_FP32, n, &step_ok),
                 "checking gradients for inf/NaN");
    if (!step_ok) /* every rank skips it alike; the scale has been lowered */
        return;
    ddp_trace_begin("optimizer", t->step);
    double norm = 0.0, clip = t->o->gpt.grad_clip;
    gpt_must(t, ddp_grad_norm(t->ctx, grads, DDP_FP32, n,
                              t->o->zero ? DDP_NORM_SHARDED : DDP_NORM_REPLICATED, NULL, &norm),
             "computing the gradient norm");
    t->last_norm = norm;
    double scale = clip > 0.0 && clip / (norm + 1e-6) < 1.0 ? clip / (norm + 1e-6) : 1.0;
    const train_gpt_opts *g = &t->o->gpt;
    gpt_must(t, gpt2_adamw_step_range(t->g, t->o->zero == 2 ? grads : NULL,
                                      (float)gpt_lr(t, t->step), (float)g->beta1, (float)g->beta2,
                                      (float)g->eps, (float)t->o->weight_decay, (int)(t->step + 1),
                                      (float)scale), "AdamW step");
    ddp_trace_end("optimizer", t->step);
    if (t->o->zero) /* every rank's updated shard to every rank, while the next batch loads and
                       the next forward pass runs, bucket by bucket (gpt2_set_gather) */
        gpt_must(t, ddp_reducer_gather_start(t->reducer, gpt2_params(t->g), DDP_FP32),
                 "starting the parameters' all-gather");
}

/* --zero: the parameters' all-gather has arrived (before anything reads them but the next
 * step, whose ddp_reducer_begin waits by itself). */
static void gpt_params_ready(gpt_trainer *t)
{
    if (t->o->zero)
        gpt_must(t, ddp_reducer_gather_wait(t->reducer, -1), "gathering the parameters");
}

/* ---- validation, checkpoints, reports ---------------------------------------------------------- */

/* The mean loss over every target token of the validation shards (--val-max-batches caps the
 * batches per rank), the same on every rank. Collective. */
static double gpt_validate(gpt_trainer *t)
{
    double sums[2] = {0.0, 0.0}; /* loss x tokens, tokens */
    int b = 0, tt = 0;
    long batches = 0, cap = t->o->gpt.val_batches;
    tokens_val_rewind(t->val);
    while (cap == 0 || batches < cap) {
        gpt_must(t, tokens_val_next(t->val, t->x_host, t->y_host, &b, &tt), "reading validation data");
        if (b == 0)
            break;
        float zero = 0.0f, mean = 0.0f;
        gpt_must(t, ddp_upload(t->ctx, t->vloss_dev, &zero, sizeof zero), "zeroing the loss");
        gpt_upload(t, t->x_host, t->y_host, (size_t)b * (size_t)tt);
        gpt_must(t, gpt2_forward(t->g, t->x_dev[t->slot], t->y_dev[t->slot], b, tt, t->vloss_dev,
                                 false), "validation forward pass");
        gpt_batch_done(t);
        gpt_must(t, ddp_download(t->ctx, &mean, t->vloss_dev, sizeof mean), "downloading the loss");
        sums[0] += (double)mean * b * tt;
        sums[1] += (double)b * tt;
        batches++;
    }
    gpt_must(t, ddp_allreduce_host(t->ctx, sums, 2, DDP_FP64, DDP_SUM), "summing validation losses");
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

static void gpt_report_val(gpt_trainer *t)
{
    double t0 = train_now();
    t->val_loss = gpt_validate(t);
    if (t->rank != 0)
        return;
    progress_end(&t->progress);
    printf("step %ld: val loss %.4f (%.1f s)\n", t->step, t->val_loss, train_now() - t0);
    fflush(stdout);
    if (t->metrics) {
        char v[32], l[32], g[32];
        fprintf(t->metrics, "{\"step\":%ld,\"val_loss\":%s,\"train_loss\":%s,\"grad_norm\":%s,"
                "\"lr\":%.8g}\n", t->step, gpt_json(v, sizeof v, t->val_loss),
                gpt_json(l, sizeof l, t->last_loss), gpt_json(g, sizeof g, t->last_norm),
                gpt_lr(t, t->step > 0 ? t->step - 1 : 0));
        fflush(t->metrics);
    }
}

/* Rank 0 writes a checkpoint of the position; every rank learns the outcome. */
static void gpt_write_checkpoint(gpt_trainer *t)
{
    train_pos pos = {.step = t->step, .epoch = t->epoch, .step_in_epoch = t->in_epoch};
    ddp_status st = DDP_OK;
    if (t->rank == 0)
        progress_end(&t->progress);
    st = train_checkpoint(&t->setup, &pos); /* collective: shards are gathered under --zero */
    t->saved_step = t->step;
    if (gpt_agree(t, st) == DDP_OK)
        return;
    if (t->o->checkpoint_errors_warn)
        DDP_WARN0("training goes on without this checkpoint (--checkpoint-errors warn)");
    else
        t->save_failed = 1;
}

/* Rank 0's running mean of the training loss since the last call (this rank's micro-batches). */
static double gpt_take_loss(gpt_trainer *t)
{
    float sum = 0.0f, zero = 0.0f;
    gpt_must(t, ddp_download(t->ctx, &sum, t->loss_dev, sizeof sum), "downloading the loss");
    gpt_must(t, ddp_upload(t->ctx, t->loss_dev, &zero, sizeof zero), "zeroing the loss");
    double mean = t->loss_micro > 0 ? sum / (double)t->loss_micro : NAN;
    t->loss_micro = 0;
    return mean;
}

/* After this run's first step (lazy loading, cuBLAS's heuristics, first-touch allocations): the
 * device finishes it, and the steady clock that tokens/s, ms/step and the MFU count from starts. */
static void gpt_mark_steady(gpt_trainer *t, double *start)
{
    gpt_must(t, ddp_synchronize(t->ctx), "waiting for the first step");
    t->train_seconds += train_now() - *start;
    *start = train_now();
    t->steady_seconds = t->train_seconds;
    progress_bar *p = &t->progress;
    p->first_step = t->start.step;
    p->base_step = t->step;
    p->base_seconds = p->train_seconds = t->train_seconds;
    p->flops_per_step = t->flops_token * t->B * t->T * t->accum;
    p->peak_flops = t->peak_tflops * 1e12;
}

/* After optimizer step t->step (1-based now): progress, validation, checkpoints. */
static void gpt_after_step(gpt_trainer *t, double *start)
{
    const train_opts *o = t->o;
    if (t->step == t->start.step + 1)
        gpt_mark_steady(t, start);
    if ((o->gpt.val_every && t->step % o->gpt.val_every == 0) || t->stopped ||
        (o->checkpoint_dir && o->checkpoint_every && t->step % o->checkpoint_every == 0))
        gpt_params_ready(t);
    if (progress_due(&t->progress, t->step) || t->step == t->total_steps) {
        t->last_loss = gpt_take_loss(t);
        t->train_seconds += train_now() - *start;
        t->progress.train_seconds = t->train_seconds;
        if (t->rank == 0) {
            progress_update(&t->progress, t->step, t->epoch, t->last_loss);
            char l[32], g[32];
            if (t->metrics)
                fprintf(t->metrics, "{\"step\":%ld,\"train_loss\":%s,\"grad_norm\":%s}\n", t->step,
                        gpt_json(l, sizeof l, t->last_loss), gpt_json(g, sizeof g, t->last_norm));
        }
        *start = train_now();
    }
    if (o->gpt.val_every && t->step % o->gpt.val_every == 0 && t->step < t->total_steps) {
        t->train_seconds += train_now() - *start;
        gpt_report_val(t);
        *start = train_now();
    }
    if (o->checkpoint_dir && (t->stopped || (o->checkpoint_every && t->step % o->checkpoint_every == 0))) {
        t->train_seconds += train_now() - *start;
        gpt_write_checkpoint(t);
        *start = train_now();
    }
}

/* The epochs from the start position to the planned (or stopped) end. */
static void gpt_loop(gpt_trainer *t)
{
    long tokens_per_step = (long)t->B * t->T * t->accum * t->world;
    progress_init(&t->progress, t->o->log_every, t->total_steps, tokens_per_step);
    t->progress.unit = "tokens";
    /* DDP_PROFILE_STEP=N: a profiler started with its capture off (ncu --profile-from-start off)
     * records the kernels of step N (1-based) alone (ddp_profiler_range). */
    const char *prof_env = getenv("DDP_PROFILE_STEP");
    char *prof_end = NULL;
    long prof = prof_env ? strtol(prof_env, &prof_end, 10) : 0;
    if (prof_env && (prof_end == prof_env || *prof_end || prof < 1)) {
        DDP_ERROR("DDP_PROFILE_STEP=%s: expected a step number >= 1 (the step a profiler records)",
                  prof_env);
        ddp_abort(t->ctx, 1);
    }
    double start = train_now();
    for (t->epoch = (int)t->start.epoch; t->step < t->total_steps; t->epoch++) {
        long first = t->epoch == t->start.epoch ? t->start.step_in_epoch : 0;
        tokens_pos pos = {.epoch = (uint64_t)t->epoch, .step = (uint64_t)first * (uint64_t)t->accum};
        gpt_must(t, tokens_loader_set_pos(t->loader, pos), "positioning the loader");
        for (t->in_epoch = first; t->in_epoch < t->steps_per_epoch && t->step < t->total_steps;) {
            if (t->step + 1 == prof)
                gpt_must(t, ddp_profiler_range(t->ctx, 1), "starting the profiler's range");
            ddp_trace_begin("step", t->step);
            gpt_step(t, t->in_epoch);
            ddp_trace_end("step", t->step);
            if (t->step + 1 == prof)
                gpt_must(t, ddp_profiler_range(t->ctx, 0), "stopping the profiler's range");
            if (t->nan_stopped)
                return;
            t->step++;
            t->in_epoch++;
            gpt_after_step(t, &start);
            if (t->stopped || t->save_failed)
                return;
        }
    }
}

/* ---- after training --------------------------------------------------------------------------- */

/* Host peak resident memory (VmHWM) in KiB, -1 when /proc cannot tell. */
static long gpt_peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* Bytes per parameter of the model states (ZeRO paper's accounting for this run's types):
 * replicated on every rank, and divided over the ranks by --zero. */
static void gpt_state_bytes(const gpt_trainer *t, const gpt2_memory *m, double *rep, double *shard)
{
    double psi = (double)gpt2_numel_total(t->g);
    double p = (double)m->params / psi, g = 4.0, o = 8.0; /* fp32 gradients, AdamW m and v */
    int z = t->o->zero;
    *rep = p + (z < 2 ? g : 0.0) + (z < 1 ? o : 0.0);
    *shard = (z >= 2 ? g : 0.0) + (z >= 1 ? o : 0.0);
}

/* Memory per rank by kind, the peak resident set, and the ZeRO prediction beside them; the
 * fields go into the summary line of --metrics (mem_*_mib). */
static void gpt_memory(const gpt_trainer *t, gpt_mem_report *r)
{
    gpt2_memory m;
    gpt2_memory_get(t->g, &m);
    const double mib = 1024.0 * 1024.0;
    size_t off = 0, n = 0, reducer = ddp_reducer_buffer_bytes(t->reducer);
    ddp_reducer_shard(t->reducer, &off, &n);
    size_t shard_grads = t->o->zero == 2 ? n * sizeof(float) : 0;
    r->params = m.params / mib;
    r->grads = (m.grads + shard_grads) / mib; /* stage 2: the shard only (the model has none) */
    r->optimizer = m.optimizer / mib;
    r->activations = m.activations / mib;
    r->comm = (reducer - shard_grads) / mib; /* stage 2: the bucket buffers backward writes into */
    r->states = r->params + r->grads + r->optimizer;
    long rss = gpt_peak_rss_kib();
    r->peak_rss = rss >= 0 ? rss / 1024.0 : NAN;
    size_t used = 0, total = 0;
    int dev = ddp_memory_info(t->ctx, &used, &total) == DDP_OK;
    r->device_used = dev ? used / mib : NAN;
    r->device_total = dev ? total / mib : NAN;
    gpt_state_bytes(t, &m, &r->bytes_rep, &r->bytes_shard);
    double psi = (double)gpt2_numel_total(t->g);
    r->predicted = psi * (r->bytes_rep + r->bytes_shard / t->world) / mib;
}

static void gpt_report_memory(const gpt_trainer *t, const gpt_mem_report *r)
{
    printf("memory per rank (%s): parameters %.1f MiB, gradients %.1f MiB, optimizer state %.1f "
           "MiB, activations %.1f MiB, communication buffers %.1f MiB; host peak RSS (VmHWM) %.1f "
           "MiB (the largest over the ranks %.1f MiB)\n",
           ddp_backend(t->ctx) == DDP_BACKEND_CPU ? "host" : "device", r->params, r->grads,
           r->optimizer, r->activations, r->comm, r->peak_rss, t->peak_rss_max);
    printf("memory predicted (ZeRO stage %d, %d rank(s), Psi = %zu): model states %.0f Psi + %.0f "
           "Psi / %d = %.1f MiB; measured %.1f MiB (parameters + gradients + optimizer state)%s\n",
           t->o->zero, t->world, gpt2_numel_total(t->g), r->bytes_rep, r->bytes_shard, t->world,
           r->predicted, r->states,
           t->o->zero == 2 ? "; the backward pass writes into the reducer's bucket buffers, "
                             "counted as communication buffers above" : "");
    if (t->o->zero == 2 && t->accum > 1 && t->o->gpt.zero_accum != 2)
        printf("--zero 2 with --accum %d and --zero-accum local: the bucket buffers hold the full "
               "gradients while the micro-steps accumulate (stage 0's sums, bit for bit); "
               "--zero-accum reduce reduce-scatters every micro-step and keeps only a few of them "
               "alive\n", t->accum);
    if (!isnan(r->device_used))
        printf("device memory in use at the end %.1f MiB of %.1f MiB (cudaMemGetInfo: the CUDA "
               "context, library workspaces and NCCL included; the largest over the ranks %.1f "
               "MiB)\n",
               r->device_used, r->device_total, t->device_used_max);
}

/* A token drawn from softmax(logits[0..V)) with a splitmix64 generator. */
static int gpt_draw(const float *logits, int V, uint64_t *rng)
{
    uint64_t z = (*rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 11) * 0x1.0p-53, max = logits[0], sum = 0.0;
    for (int i = 1; i < V; i++)
        max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < V; i++)
        sum += exp(logits[i] - max);
    double acc = 0.0, target = u * sum;
    for (int i = 0; i < V; i++) {
        acc += exp(logits[i] - max);
        if (acc > target)
            return i;
    }
    return V - 1;
}

/* Rank 0, before training with --sample: GPT-2's vocabulary for decoding (--vocab, or
 * encoder.json beside the training shards). */
static ddp_status gpt_open_vocab(gpt_trainer *t)
{
    const train_opts *o = t->o;
    if (t->rank != 0 || o->gpt.sample == 0)
        return DDP_OK;
    ddp_status st = o->gpt.vocab ? bpe_vocab_load(o->gpt.vocab, &t->vocab)
                                 : bpe_vocab_load_beside(o->data_dir, &t->vocab);
    if (st != DDP_OK)
        DDP_ERROR("--sample needs GPT-2's encoder.json to print text (see above): give --vocab FILE "
                  "(scripts/fetch-text.sh puts one beside the shards)");
    return st;
}

/* Rank 0: --sample N tokens from the trained model, starting at <|endoftext|>, each drawn from the
 * softmax of the last position's logits (temperature 1) with a generator seeded by --seed, the
 * context cut to the last --seq tokens; printed as text. Only rank 0 computes. */
static ddp_status gpt_sample(gpt_trainer *t)
{
    int n = t->o->gpt.sample, V = t->cfg.vocab, Vp = t->cfg.padded_vocab;
    int *seq = malloc((size_t)(n + 1) * sizeof *seq);
    float *row = malloc((size_t)Vp * sizeof *row);
    ddp_status st = seq && row ? DDP_OK : DDP_ERR_NOMEM;
    uint64_t rng = t->o->seed;
    if (seq)
        seq[0] = GPT_EOT;
    for (int i = 1; st == DDP_OK && i <= n; i++) {
        int len = i < t->T ? i : t->T, *win = seq + i - len;
        gpt_upload(t, win, win, (size_t)len);
        st = gpt2_forward(t->g, t->x_dev[t->slot], NULL, 1, len, NULL, false);
        gpt_batch_done(t);
        if (st == DDP_OK)
            st = ddp_download(t->ctx, row, gpt2_logits(t->g) + (size_t)(len - 1) * Vp,
                              (size_t)Vp * sizeof *row);
        if (st == DDP_OK)
            seq[i] = gpt_draw(row, V, &rng);
    }
    if (st == DDP_OK) {
        printf("sample (%d tokens after <|endoftext|>, seed %llu):\n", n,
               (unsigned long long)t->o->seed);
        char *text = NULL;
        size_t len = 0;
        st = bpe_decode(t->vocab, seq + 1, (size_t)n, &text, &len);
        if (st == DDP_OK)
            printf("%.*s\n", (int)len, text);
        free(text);
        fflush(stdout);
    }
    free(seq);
    free(row);
    return st;
}

/* Rank 0, at start: what the MFU counts, and against which peak. */
static void gpt_report_flops(const gpt_trainer *t)
{
    const train_opts *o = t->o;
    printf("model FLOPs: 6N + 6LCT = %.0f per token (llm.c's count: N = %llu with wte's padding "
           "rows, T %d); ", t->flops_token,
           (unsigned long long)mfu_gpt2_n_params_padded(&t->cfg), t->T);
    const char *kind = o->model.precision != DDP_FP32 ? "16-bit tensor cores, dense"
                       : o->tf32                      ? "TF32 tensor cores, dense"
                                                      : "fp32";
    if (o->gpt.peak_tflops > 0.0)
        printf("MFU against %g TFLOP/s per device (--peak-tflops)\n", t->peak_tflops);
    else if (t->peak_tflops > 0.0)
        printf("MFU against %g TFLOP/s per device (%s, %s; NVIDIA's datasheet)\n", t->peak_tflops,
               t->device, kind);
    else if (t->device[0])
        printf("MFU not computed: %s (%s) is not in the peak table; give --peak-tflops X\n",
               t->device, kind);
    else
        printf("MFU not computed on the CPU (no peak table); give --peak-tflops X\n");
}

/* Rank 0: the start-up report. */
static void gpt_report_start(const gpt_trainer *t)
{
    if (t->rank != 0)
        return;
    const train_opts *o = t->o;
    ddp_dtype p = o->model.precision;
    printf("ddp-train: %d rank(s), backend %s\n", t->world, ddp_backend_name(ddp_backend(t->ctx)));
    if (ddp_backend(t->ctx) == DDP_BACKEND_CPU)
        printf("cpu: %s; ISA %s\ncompute: %s, %s; GEMM %s; BLAS %s\n", cpu_model_name(),
               cpu_isa_describe(), t->ops->name, model_precision_name(p), ops_cpu_gemm_name(p),
               ops_blas_describe());
    else
        printf("compute: %s, %s; GEMM %s\n", t->ops->name, model_precision_name(p),
               ops_cuda_describe(t->ops, p));
    train_print_opts(stdout, o);
    const gpt2_config *c = &t->cfg;
    printf("gpt2: %zu parameters (L %d, heads %d, channels %d, positions %d, vocabulary %d padded "
           "to %d)%s%s\n", gpt2_config_n_params(c), c->layers, c->heads, c->channels, c->max_seq,
           c->vocab, c->padded_vocab, o->gpt.init_from ? ", from " : "",
           o->gpt.init_from ? o->gpt.init_from : "");
    printf("data: %zu windows of %d tokens in the training shards; %zu per rank per epoch; %d "
           "micro-batch(es) of %d x %d tokens per rank per step = %ld tokens per step; %ld steps "
           "per epoch, %ld planned\n", tokens_loader_n_windows(t->loader), t->B * t->T + 1,
           tokens_loader_steps_per_epoch(t->loader), t->accum, t->B, t->T,
           (long)t->B * t->T * t->accum * t->world, t->steps_per_epoch, t->total_steps);
    gpt_report_flops(t);
    fflush(stdout);
}

/* The run's rates. The steady ones count from the end of this run's first step (NAN with fewer
 * than 2 steps); the MFU is NAN without a peak. */
typedef struct gpt_rates {
    long steps;          /* optimizer steps of this run */
    double tps;          /* tokens/s over all ranks, every step */
    double tps_steady;   /* tokens/s over all ranks from step 2 on */
    double ms_per_step;  /* from step 2 on */
    double tflops_rank;  /* model TFLOP/s per rank from step 2 on, llm.c's 6N + 6LCT */
    double mfu;          /* tflops_rank over one device's peak, a fraction */
    double gflops_12ltc; /* GFLOP/s per rank over every step by 6N + 12LTC, N without wte's
                            padding rows (benchmarks/gpt_torch.py's count) */
} gpt_rates;

static void gpt_rates_get(const gpt_trainer *t, gpt_rates *r)
{
    const gpt2_config *c = &t->cfg;
    double step_tokens = (double)t->B * t->T * t->accum * t->world;
    double steady = t->train_seconds - t->steady_seconds;
    r->steps = t->step - t->start.step;
    r->tps = t->train_seconds > 0 ? (double)r->steps * step_tokens / t->train_seconds : 0.0;
    int known = r->steps > 1 && steady > 0.0;
    r->tps_steady = known ? (double)(r->steps - 1) * step_tokens / steady : NAN;
    r->ms_per_step = known ? 1e3 * steady / (double)(r->steps - 1) : NAN;
    r->tflops_rank = r->tps_steady / t->world * t->flops_token / 1e12;
    double mfu = mfu_value(r->tps_steady / t->world, t->flops_token, t->peak_tflops);
    r->mfu = mfu >= 0.0 ? mfu : NAN;
    double flops_12ltc = 6.0 * (double)gpt2_config_n_params(c) +
                         12.0 * c->layers * (double)t->T * c->channels;
    r->gflops_12ltc = r->tps * flops_12ltc / t->world / 1e9;
}

static void gpt_print_rates(const gpt_trainer *t, const gpt_rates *r)
{
    printf("\nthroughput: %.1f tokens/s across %d rank(s) (%ld steps in %.2f s of training)",
           r->tps, t->world, r->steps, t->train_seconds);
    if (isnan(r->tps_steady)) {
        printf("; from step 2 on: not measured (one step)\n");
        return;
    }
    printf("; from step 2 on %.1f tokens/s, %.1f ms/step, model FLOPs %.4g TFLOP/s per rank (6N + "
           "6LCT = %.0f per token, llm.c's count)", r->tps_steady, r->ms_per_step, r->tflops_rank,
           t->flops_token);
    if (isnan(r->mfu))
        printf(", MFU unknown (no peak for this device: --peak-tflops X)\n");
    else
        printf(", MFU %.1f %% of %g TFLOP/s\n", 100.0 * r->mfu, t->peak_tflops);
}

/* A number for a JSON line with 8 significant digits: null for NaN or inf. */
static const char *gpt_json_g(char *buf, size_t n, double v)
{
    snprintf(buf, n, isfinite(v) ? "%.8g" : "null", v);
    return buf;
}

/* The summary line's rate fields after model_gflops_per_rank (docs/formats.md). */
static void gpt_json_rates(char *buf, size_t n, const gpt_trainer *t, const gpt_rates *r)
{
    char ts[32], ms[32], tf[32], pk[32], mf[32], dev[128];
    size_t k = 0;
    for (const char *c = t->device; *c && k + 1 < sizeof dev; c++) /* no quote or control byte */
        dev[k++] = *c == '"' || *c == '\\' || (unsigned char)*c < 0x20 ? '?' : *c;
    dev[k] = '\0';
    snprintf(buf, n, ",\"tokens_per_s_steady\":%s,\"ms_per_step\":%s,\"flops_per_token\":%.0f,"
             "\"model_tflops_per_rank\":%s,\"peak_tflops\":%s,\"mfu\":%s,\"device_name\":\"%s\"",
             gpt_json_g(ts, sizeof ts, r->tps_steady), gpt_json_g(ms, sizeof ms, r->ms_per_step),
             t->flops_token, gpt_json_g(tf, sizeof tf, r->tflops_rank),
             gpt_json_g(pk, sizeof pk, t->peak_tflops > 0.0 ? t->peak_tflops : NAN),
             gpt_json_g(mf, sizeof mf, r->mfu), dev);
}

/* Rank 0: throughput, MFU, memory, and the summary line of --metrics. */
static void gpt_report_end(gpt_trainer *t, double wall_start)
{
    if (t->rank != 0)
        return;
    gpt_rates r;
    gpt_rates_get(t, &r);
    gpt_print_rates(t, &r);
    gpt_mem_report mr;
    gpt_memory(t, &mr);
    gpt_report_memory(t, &mr);
    fflush(stdout);
    char tl[32], vl[32], rs[32], du[32], dm[32], rates[512];
    if (t->metrics) {
        gpt_json_rates(rates, sizeof rates, t, &r);
        fprintf(t->metrics, "{\"summary\":true,\"model\":\"gpt2\",\"backend\":\"%s\",\"world_size\":%d,"
                "\"batch\":%d,\"seq\":%d,\"accum\":%d,\"steps\":%ld,\"train_loss\":%s,"
                "\"val_loss\":%s,\"tokens_per_s\":%.1f,\"model_gflops_per_rank\":%.3f%s,"
                "\"train_seconds\":%.3f,\"wall_seconds\":%.3f,\"stopped_by_signal\":%s,"
                "\"zero\":%d,\"recompute\":%s,\"n_params\":%zu,\"mem_params_mib\":%.2f,"
                "\"mem_grads_mib\":%.2f,\"mem_optimizer_mib\":%.2f,\"mem_activations_mib\":%.2f,"
                "\"mem_comm_mib\":%.2f,\"mem_states_mib\":%.2f,\"mem_predicted_states_mib\":%.2f,"
                "\"mem_peak_rss_mib\":%s,\"mem_peak_rss_max_mib\":%.2f,\"mem_device_used_mib\":%s,"
                "\"mem_device_used_max_mib\":%s}\n",
                ddp_backend_name(ddp_backend(t->ctx)), t->world, t->B, t->T, t->accum, t->step,
                gpt_json(tl, sizeof tl, t->last_loss), gpt_json(vl, sizeof vl, t->val_loss),
                r.tps, r.gflops_12ltc, rates, t->train_seconds, train_now() - wall_start,
                t->stopped ? "true" : "false", t->o->zero, t->o->gpt.recompute ? "true" : "false",
                gpt2_numel_total(t->g), mr.params, mr.grads, mr.optimizer, mr.activations, mr.comm,
                mr.states, mr.predicted, gpt_json(rs, sizeof rs, mr.peak_rss), t->peak_rss_max,
                gpt_json(du, sizeof du, mr.device_used), gpt_json(dm, sizeof dm, t->device_used_max));
        fflush(t->metrics);
    }
}

/* Rank 0 writes --save (the training state) and --save-llmc; every rank learns the outcome. */
static ddp_status gpt_save(gpt_trainer *t)
{
    ddp_status st = DDP_OK;
    const train_opts *o = t->o;
    if (o->checkpoint_dir && t->saved_step != t->step)
        gpt_write_checkpoint(t);
    if (t->save_failed)
        return DDP_ERR_IO;
    if (o->save_path) {
        train_pos pos = {.step = t->step, .epoch = t->epoch, .step_in_epoch = t->in_epoch};
        st = train_save_state(&t->setup, &pos, o->save_path); /* collective */
    }
    if (t->rank == 0 && o->save_path) {
        if (st == DDP_OK)
            printf("saved %s\n", o->save_path);
        else
            DDP_ERROR("--save %s: %s", o->save_path,
                      st == DDP_ERR_IO && errno ? strerror(errno) : ddp_strerror(st));
    }
    if (st == DDP_OK && t->rank == 0 && o->gpt.save_llmc) {
        st = gpt2_llmc_save(t->g, o->gpt.save_llmc, DDP_FP32);
        if (st == DDP_OK)
            printf("saved %s (llm.c model file, fp32)\n", o->gpt.save_llmc);
    }
    return gpt_agree(t, st);
}

/* ---- the run ---------------------------------------------------------------------------------- */

static ddp_status gpt_prepare(gpt_trainer *t)
{
    ddp_status st = gpt_agree(t, gpt_config(t));
    if (st == DDP_OK)
        st = gpt_agree(t, gpt_open_data(t));
    if (st == DDP_OK)
        st = gpt_same_data(t);
    if (st == DDP_OK)
        st = gpt_agree(t, gpt_plan(t));
    if (st == DDP_OK)
        st = gpt_agree(t, gpt_open_vocab(t));
    if (st == DDP_OK)
        st = gpt_agree(t, t->rank == 0 ? train_check_outputs(t->o) : DDP_OK);
    if (st == DDP_OK)
        st = gpt_build(t);
    if (st != DDP_OK)
        return st;
    gpt_setup(t);
    gpt_mfu_setup(t);
    int resumed = 0;
    st = train_resume(&t->setup, &t->start, &resumed);
    t->step = t->start.step;
    t->saved_step = resumed ? t->step : -1;
    return st;
}

static void gpt_release(gpt_trainer *t)
{
    if (t->metrics)
        fclose(t->metrics);
    for (int i = 0; i < 2; i++) {
        ddp_free(t->ctx, t->x_dev[i]);
        ddp_free(t->ctx, t->y_dev[i]);
    }
    ddp_free(t->ctx, t->loss_dev);
    ddp_free(t->ctx, t->vloss_dev);
    free(t->x_host);
    free(t->y_host);
    ddp_reducer_destroy(t->reducer);
    ddp_scaler_destroy(t->scaler);
    gpt2_destroy(t->g);
    ops_close(t->ops);
    tokens_val_destroy(t->val);
    tokens_loader_destroy(t->loader);
    tokens_set_close(t->train_data);
    tokens_set_close(t->val_data);
    bpe_vocab_free(t->vocab);
}

/* Training, the last validation, the replica check, saves and the sample. */
static ddp_status gpt_train_and_finish(gpt_trainer *t, double wall_start)
{
    gpt_loop(t);
    gpt_params_ready(t);
    if (t->nan_stopped || t->save_failed)
        return t->nan_stopped ? DDP_ERR_STATE : DDP_ERR_IO;
    if (t->loss_micro > 0)
        t->last_loss = gpt_take_loss(t);
    if (!t->stopped) /* after a stop signal the time left is for the checkpoint, not a validation */
        gpt_report_val(t);
    /* the largest peak RSS and device memory in use over the ranks, for the report */
    size_t used = 0;
    double mem[2] = {(double)gpt_peak_rss_kib(),
                     ddp_memory_info(t->ctx, &used, NULL) == DDP_OK ? (double)used : -1.0};
    gpt_must(t, ddp_allreduce_host(t->ctx, mem, 2, DDP_FP64, DDP_MAX), "agreeing on memory");
    t->peak_rss_max = mem[0] / 1024.0;
    t->device_used_max = mem[1] >= 0.0 ? mem[1] / (1024.0 * 1024.0) : NAN;
    gpt_report_end(t, wall_start);
    ddp_status st = gpt_verify(t, "after training");
    if (st == DDP_OK)
        st = gpt_save(t);
    if (st == DDP_OK && t->o->gpt.sample > 0)
        st = gpt_agree(t, t->rank == 0 ? gpt_sample(t) : DDP_OK);
    return st;
}

ddp_status train_gpt_run(ddp_ctx *ctx, const train_opts *o, train_signals sig, int *requeue)
{
    double wall_start = train_now();
    gpt_trainer t = {.ctx = ctx, .o = o, .sig = sig, .rank = ddp_rank(ctx),
                     .world = ddp_world_size(ctx), .B = o->batch, .T = o->gpt.seq,
                     .val_loss = NAN, .last_loss = NAN};
    ddp_status st = gpt_prepare(&t);
    if (st == DDP_OK)
        st = train_observe_start(ctx, o);
    if (st == DDP_OK) {
        gpt_report_start(&t);
        st = gpt_train_and_finish(&t, wall_start);
        ddp_status trace_st = train_observe_end(ctx, o);
        st = st == DDP_OK ? trace_st : st;
    }
    *requeue = st == DDP_OK && t.stopped && o->requeue && t.rank == 0 && getenv("SLURM_JOB_ID");
    gpt_release(&t);
    return st;
}
