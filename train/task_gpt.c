/* task_gpt.c - ddp-train --model gpt2's task (loop.h): GPT-2 on llm.c token shards with AdamW,
 * learning-rate warm-up and cosine decay, global-norm clipping, validation loss, the llm.c model
 * file and sampling.
 *
 * Every rank builds the same seeded model (or reads the same llm.c file); the loader gives each
 * rank disjoint windows of B x T + 1 tokens, shuffled per epoch, and its position is the
 * checkpoint's (epoch, step_in_epoch), so resuming is exact. --zero 2: the model has no gradient
 * buffer and writes into the reducer's buckets, planned in the order backward marks. The global
 * gradient norm (the same on every rank, computed from the averaged gradients) sets the clipping
 * factor of the AdamW step (optim.c). Validation counts every target token of the validation
 * shards once over all ranks.
 */
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_mfu.h"
#include "switches.h"
#include "task_gpt.h"


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

/* A validation pattern derived from --data that matches no file: DDP_ERR_INVALID_ARG, saying it was
 * derived and how (an unquoted pattern the shell expanded to one shard derives that shard's
 * number, which the validation shards rarely have). DDP_OK for --val-data or a match. */
static ddp_status gpt_check_derived(const train_opts *o, const char *vpat)
{
    glob_t g;
    int found = glob(vpat, 0, NULL, &g) == 0;
    globfree(&g);
    if (o->gpt.val_data || found)
        return DDP_OK;
    int one_file = !strpbrk(o->data_dir, "*?[");
    DDP_ERROR("no validation shard matches %s, the name derived from --data %s (\"train\" "
              "replaced by \"val\")%s; quote the pattern (--data 'DIR/NAME_train_*.bin') or give "
              "--val-data PATTERN", vpat, o->data_dir,
              one_file ? ": --data names one file; when you typed a pattern such as "
                         "NAME_train_*.bin without quotes, the shell expanded it to a file name"
                       : "");
    return DDP_ERR_INVALID_ARG;
}

/* DDP_ERR_INVALID_ARG (logged, naming the shard or the pattern) when the validation shards hold no
 * target: every shard has 0 or 1 tokens, and the validation loss would be 0 / 0. */
static ddp_status gpt_check_val(const trainer *t, const char *pattern)
{
    const tokens_set *v = G(t)->val_data;
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
              "target); give --val-data a shard of at least %d tokens", what, G(t)->T + 1, G(t)->T,
              G(t)->T + 1);
    return DDP_ERR_INVALID_ARG;
}

static ddp_status gpt_open_data(trainer *t)
{
    const train_opts *o = t->o;
    ddp_status st = tokens_set_open(o->data_dir, G(t)->cfg.vocab, &G(t)->train_data);
    char *vpat = st == DDP_OK ? gpt_val_pattern(o) : NULL;
    if (st == DDP_OK && !vpat)
        st = DDP_ERR_INVALID_ARG;
    if (st == DDP_OK)
        st = gpt_check_derived(o, vpat);
    if (st == DDP_OK)
        st = tokens_set_open(vpat, G(t)->cfg.vocab, &G(t)->val_data);
    if (st == DDP_OK)
        st = gpt_check_val(t, vpat);
    free(vpat);
    /* A token outside the vocabulary is found before training where reading every token is cheap;
     * in larger sets the loaders find it when they hand the window out (and stop the job). */
    if (st == DDP_OK && tokens_set_n_tokens(G(t)->train_data) <= GPT_SCAN_TOKENS)
        st = tokens_set_scan(G(t)->train_data);
    if (st == DDP_OK && tokens_set_n_tokens(G(t)->val_data) <= GPT_SCAN_TOKENS)
        st = tokens_set_scan(G(t)->val_data);
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
static ddp_status gpt_same_data(trainer *t)
{
    size_t n = (size_t)t->world * GPT_DATA_COUNTS;
    int64_t *all = calloc(n, sizeof *all);
    trainer_must(t, all ? DDP_OK : DDP_ERR_NOMEM, "allocating the data-size table");
    int64_t *mine = all + (size_t)t->rank * GPT_DATA_COUNTS;
    mine[0] = (int64_t)tokens_set_n_tokens(G(t)->train_data);
    mine[1] = (int64_t)tokens_set_n_windows(G(t)->train_data, (size_t)G(t)->B * (size_t)G(t)->T + 1);
    mine[2] = (int64_t)tokens_set_n_tokens(G(t)->val_data);
    trainer_must(t, ddp_allreduce_host(t->ctx, all, n, DDP_INT64, DDP_SUM), "agreeing on data sizes");
    int differ = 0;
    for (int r = 1; r < t->world; r++)
        differ |= memcmp(all + (size_t)r * GPT_DATA_COUNTS, all, sizeof *all * GPT_DATA_COUNTS) != 0;
    if (differ && t->rank == 0) {
        char list[4096];
        size_t len = 0;
        for (int r = 0; r < t->world && r < GPT_DATA_LISTED; r++)
            gpt_data_entry(list, sizeof list, &len, r, all + (size_t)r * GPT_DATA_COUNTS,
                           G(t)->B * G(t)->T + 1);
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
static ddp_status gpt_plan(trainer *t, train_plan *plan)
{
    const train_opts *o = t->o;
    long g = o->gpt.total_batch_tokens;
    char what[48];
    snprintf(what, sizeof what, "--batch %d x --seq %d", G(t)->B, G(t)->T);
    plan->accum = o->accum;
    TRY_OK(trainer_plan_global(t, plan, g ? (train_fixed_batch){"total-batch-tokens", g, "tokens"}
                                          : (train_fixed_batch){0}, (long)G(t)->B * G(t)->T, what));
    if (plan->micro_total && o->gpt.zero_accum == 2) {
        DDP_ERROR("--total-batch-tokens %ld: %d micro-batches shared unevenly by %d ranks, which "
                  "--zero-accum reduce cannot do (a reduce-scatter per micro-step): use "
                  "--zero-accum local", g, plan->micro_total, t->world);
        return DDP_ERR_INVALID_ARG;
    }
    tokens_loader_opts lo = {.batch = G(t)->B, .seq = G(t)->T, .rank = t->rank, .world_size = t->world,
                             .seed = o->seed, .shuffle = o->shuffle,
                             .blocks_per_step = (int)plan->micro_total};
    TRY_OK(tokens_loader_create(G(t)->train_data, &lo, &G(t)->loader));
    TRY_OK(tokens_val_create(G(t)->val_data, G(t)->B, G(t)->T, t->world, t->rank, &G(t)->val));
    long windows = (long)tokens_loader_steps_per_epoch(G(t)->loader);
    plan->steps_per_epoch = windows / plan->accum;
    if (plan->steps_per_epoch == 0) {
        DDP_ERROR("%s: %ld windows of %d x %d tokens per rank per epoch, fewer than the %d "
                  "micro-batches of one step: use more data, a smaller --batch, --seq or "
                  "--total-batch-tokens, or fewer ranks", o->data_dir, windows, G(t)->B, G(t)->T + 1,
                  plan->accum);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

/* The model's configuration: --init-from's file header or ddp checkpoint, else the flags. A ddp
 * checkpoint is read whole here (every rank reads it, as it reads an llm.c file) and its weights
 * wait in G(t)->init for gpt_build. */
static ddp_status gpt_config(trainer *t)
{
    const train_gpt_opts *g = &t->o->gpt;
    G(t)->cfg = g->cfg;
    G(t)->init_ckpt = g->init_from && gpt2_ckpt_is_ddp(g->init_from);
    if (G(t)->init_ckpt) {
        TRY_OK(gpt2_ckpt_read(g->init_from, "--init-from", 1, &G(t)->init));
        G(t)->cfg = G(t)->init.cfg;
    }
    if (g->init_from) {
        if (!G(t)->init_ckpt)
            TRY_OK(gpt2_llmc_read_config(g->init_from, &G(t)->cfg));
        if (G(t)->T > G(t)->cfg.max_seq) {
            DDP_ERROR("--seq %d is longer than the %d positions of %s: allowed is 1 to %d", G(t)->T,
                      G(t)->cfg.max_seq, g->init_from, G(t)->cfg.max_seq);
            return DDP_ERR_INVALID_ARG;
        }
    }
    return DDP_OK;
}

/* With --prompt: GPT-2's encoder from encoder.json and vocab.bpe in the folder of --vocab
 * (or of the training shards). */
static ddp_status gpt_open_encoder(trainer *t)
{
    const train_opts *o = t->o;
    const char *at = o->gpt.vocab ? o->gpt.vocab : o->data_dir, *slash = strrchr(at, '/');
    int dir = slash ? (int)(slash - at) : 1;
    char json[4096], merges[4096];
    snprintf(json, sizeof json, "%.*s/encoder.json", dir, slash ? at : ".");
    snprintf(merges, sizeof merges, "%.*s/vocab.bpe", dir, slash ? at : ".");
    ddp_status st = bpe_encoder_load(o->gpt.vocab ? o->gpt.vocab : json, merges, &G(t)->encoder);
    if (st != DDP_OK)
        DDP_ERROR("--prompt needs GPT-2's encoder.json and vocab.bpe (see above) in one folder: "
                  "give --vocab DIR/encoder.json (scripts/tokenize.sh and fetch-text.sh put both "
                  "beside the shards)");
    return st;
}

/* Before training with --sample: GPT-2's vocabulary for rank 0's decoding (--vocab, or
 * encoder.json beside the training shards). */
static ddp_status gpt_open_vocab(trainer *t)
{
    const train_opts *o = t->o;
    if (o->gpt.sample == 0 || (t->rank != 0 && !o->gpt.prompt)) /* each rank encodes a prompt */
        return DDP_OK;
    if (o->gpt.prompt)
        return gpt_open_encoder(t);
    ddp_status st = o->gpt.vocab ? bpe_vocab_load(o->gpt.vocab, &G(t)->vocab)
                                 : bpe_vocab_load_beside(o->data_dir, &G(t)->vocab);
    if (st != DDP_OK)
        DDP_ERROR("--sample needs GPT-2's encoder.json to print text (see above): give --vocab FILE "
                  "(scripts/fetch-text.sh puts one beside the shards)");
    return st;
}

/* The FLOPs per token and the peak the MFU is measured against: --peak-tflops, else the table's
 * for this GPU and precision (16-bit tensor cores for bf16 and fp16, TF32 with --tf32, else
 * fp32), else unknown (the CPU, or a GPU the table lacks). */
static void gpt_mfu_setup(trainer *t)
{
    const train_opts *o = t->o;
    G(t)->flops_token = (double)mfu_gpt2_flops_per_token(&G(t)->cfg, G(t)->T);
    G(t)->device = ddp_backend(t->ctx) == DDP_BACKEND_CUDA ? ops_cuda_device_name(t->ops) : "";
    mfu_precision p = o->model.precision != DDP_FP32 ? MFU_16BIT : o->tf32 ? MFU_TF32 : MFU_FP32;
    G(t)->peak_tflops = o->gpt.peak_tflops > 0.0 ? o->gpt.peak_tflops : mfu_peak_tflops(G(t)->device, p);
}

/* Learning rate of step `step` (0-based): linear warm-up, then cosine decay to lr x lr_floor. */
double gpt_lr(const trainer *t, long step)
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

/* ---- the task ------------------------------------------------------------------------------- */

/* The configuration, the token shards (the same on every rank), the step plan and rank 0's
 * vocabulary; agreed on. */
static ddp_status gpt_open(trainer *t, train_plan *plan)
{
    gpt_task *s = G(t);
    *s = (gpt_task){.B = t->o->batch, .T = t->o->gpt.seq, .val_loss = NAN, .last_loss = NAN};
    ddp_status st = trainer_agree(t, gpt_config(t));
    int data = !train_sample_only(t->o); /* sampling alone needs the vocabulary only */
    plan->no_training = !data;
    plan->outputs[0] = t->o->gpt.save_llmc;
    plan->output_flags[0] = "--save-llmc";
    if (st == DDP_OK && data)
        st = trainer_agree(t, gpt_open_data(t));
    if (st == DDP_OK && data)
        st = gpt_same_data(t);
    if (st == DDP_OK && data)
        st = trainer_agree(t, gpt_plan(t, plan));
    if (st == DDP_OK)
        st = trainer_agree(t, gpt_open_vocab(t));
    plan->n_train = st == DDP_OK && data ? tokens_loader_n_windows(s->loader) : 0;
    return st;
}

/* --init-from a ddp checkpoint: its parameters into the model built from its sizes (the same
 * layout, llm.c's, as the checkpoint's flat buffer); the optimizer, the step and the data order
 * start afresh. The host copy is freed either way. */
static ddp_status gpt_load_ckpt(trainer *t)
{
    gpt_task *s = G(t);
    const char *path = t->o->gpt.init_from;
    ddp_status st = DDP_OK;
    if (!gpt2_ckpt_same_signature(&s->init, gpt2_descs(s->model), gpt2_n_params(s->model),
                                 "--init-from", path) ||
        s->init.numel != gpt2_numel_total(s->model))
        st = DDP_ERR_MISMATCH;
    if (st == DDP_OK)
        st = gpt2_weights_set(s->model, s->init.params);
    free(s->init.params);
    free(s->init.descs);
    s->init.params = NULL;
    s->init.descs = NULL;
    return st;
}

/* The model (seeded or from --init-from), the view of it the loop steps, the host buffers. */
static ddp_status gpt_build(trainer *t, train_view *v)
{
    gpt_task *s = G(t);
    const train_opts *o = t->o;
    gpt2_opts go = {.max_batch = s->B, .seq = s->T, .precision = o->model.precision,
                    .seed = o->seed, .reducer_grads = o->zero == 2, .recompute = o->gpt.recompute};
    ddp_status st = trainer_agree(t, gpt2_create(t->ctx, t->ops, &s->cfg, &go, &s->model));
    if (st == DDP_OK && o->gpt.init_from)
        st = trainer_agree(t, s->init_ckpt ? gpt_load_ckpt(t)
                                           : gpt2_llmc_load(s->model, o->gpt.init_from));
    if (st != DDP_OK)
        return st;
    gpt2 *g = s->model;
    int n = gpt2_n_params(g);
    size_t tokens = (size_t)s->B * (size_t)s->T;
    ddp_dtype p;
    *v = (train_view){.descs = gpt2_descs(g), .n_params = n, .numel = gpt2_numel(g),
                      .numel_total = gpt2_numel_total(g), .weights = gpt2_weights(g, &p),
                      .grads = gpt2_grads(g), .round_seed = (uint32_t)(o->seed ^ o->seed >> 32),
                      .reducer_grads = o->zero == 2,
                      .reduce_each_micro = o->gpt.zero_accum == 2, .precision = o->model.precision,
                      .strict_order = true, .decays = malloc((size_t)n * sizeof *v->decays),
                      .ready_order = malloc((size_t)n * sizeof *v->ready_order),
                      .optim = {.kind = OPTIM_ADAMW, .beta1 = (float)o->gpt.beta1,
                                .beta2 = (float)o->gpt.beta2, .eps = (float)o->gpt.eps,
                                .weight_decay = (float)o->weight_decay, .clip = o->gpt.grad_clip,
                                .norm = true},
                      .x_bytes = tokens * sizeof(int), .y_bytes = tokens * sizeof(int),
                      .samples_per_step = tokens * trainer_micro_total(t), .unit = "tokens"};
    s->x_host = malloc(tokens * sizeof *s->x_host);
    s->y_host = malloc(tokens * sizeof *s->y_host);
    s->vloss_dev = ddp_alloc(t->ctx, sizeof *s->vloss_dev);
    trainer_must(t, v->decays && v->ready_order && s->x_host && s->y_host && s->vloss_dev
                        ? DDP_OK : DDP_ERR_NOMEM, "allocating batch buffers");
    for (int i = 0; i < n; i++)
        v->decays[i] = gpt2_param_decays(g, i);
    gpt2_ready_order(g, v->ready_order);
    const gpt2_config *c = &s->cfg;
    /* the micro-steps: the flags' (--accum), or --total-batch-tokens' (config.total_batch_tokens:
     * they follow the world size, the tokens per step not) */
    int len = snprintf(v->model_fp, sizeof v->model_fp, "gpt2 L%d NH%d C%d maxT%d V%d T%d",
                       c->layers, c->heads, c->channels, c->max_seq, c->vocab, s->T);
    if (!t->o->gpt.total_batch_tokens)
        snprintf(v->model_fp + len, sizeof v->model_fp - (size_t)len, " accum%d", t->accum);
    gpt_mfu_setup(t);
    return DDP_OK;
}

/* ZeRO: forward passes wait for the all-gather layer by layer; unsharded, DDP_GPT_READ_COPY=0 has
 * them read the optimizer's fp32 master (run 4's path, models/ops/switches.h) */
static void gpt_attach(trainer *t)
{
    float *bufs[OPTIM_MAX_BUFS];
    const char *names[OPTIM_MAX_BUFS];
    if (t->o->zero > 0)
        gpt2_set_gather(G(t)->model, t->reducer);
    else if (t->opt && !ops_switch_on(OPS_SW_READ_COPY) && optim_buffers(t->opt, names, bufs) > 0)
        gpt2_set_master(G(t)->model, bufs[0]);
}
static ddp_status gpt_zero_grad(trainer *t) { return gpt2_zero_grad(G(t)->model); }

static void gpt_batch(trainer *t)
{
    gpt_task *s = G(t);
    trainer_must(t, tokens_loader_next(s->loader, s->x_host, s->y_host), "reading the next batch");
    trainer_data(t, tokens_loader_last_fp(s->loader), 1);
    size_t bytes = (size_t)s->B * (size_t)s->T * sizeof *s->x_host;
    trainer_upload(t, s->x_host, bytes, s->y_host, bytes);
}

static void gpt_forward(trainer *t)
{
    gpt_task *s = G(t);
    trainer_must(t, gpt2_forward(s->model, t->x_dev[t->slot], t->y_dev[t->slot], s->B, s->T,
                                 t->loss_dev, true), "forward pass");
}

static void gpt_backward(trainer *t, float loss_scale)
{
    trainer_must(t, gpt2_backward(G(t)->model, t->reducer, loss_scale), "backward pass");
}

/* The loader at the epoch's first step (0, or the resumed step in it). */
static void gpt_epoch_begin(trainer *t)
{
    tokens_pos pos = {.epoch = (uint64_t)t->epoch,
                      .step = (uint64_t)t->in_epoch * (uint64_t)t->accum};
    trainer_must(t, tokens_loader_set_pos(G(t)->loader, pos), "positioning the loader");
}

static void gpt_epoch_end(trainer *t) { (void)t; }

/* The mean loss over every target token of the validation shards (--val-max-batches caps the
 * batches per rank), the same on every rank. Collective. */
static double gpt_validate(trainer *t)
{
    ddp_watch_where(t->step, -1, "validation");
    double sums[2] = {0.0, 0.0}; /* loss x tokens, tokens */
    int b = 0, tt = 0;
    long batches = 0, cap = t->o->gpt.val_batches;
    tokens_val_rewind(G(t)->val);
    while (cap == 0 || batches < cap) {
        trainer_must(t, tokens_val_next(G(t)->val, G(t)->x_host, G(t)->y_host, &b, &tt), "reading validation data");
        if (b == 0)
            break;
        float zero = 0.0f, mean = 0.0f;
        trainer_must(t, ddp_upload(t->ctx, G(t)->vloss_dev, &zero, sizeof zero), "zeroing the loss");
        size_t bytes = (size_t)b * (size_t)tt * sizeof *G(t)->x_host;
        trainer_upload(t, G(t)->x_host, bytes, G(t)->y_host, bytes);
        trainer_must(t, gpt2_forward(G(t)->model, t->x_dev[t->slot], t->y_dev[t->slot], b, tt, G(t)->vloss_dev,
                                 false), "validation forward pass");
        trainer_batch_done(t);
        trainer_must(t, ddp_download(t->ctx, &mean, G(t)->vloss_dev, sizeof mean), "downloading the loss");
        sums[0] += (double)mean * b * tt;
        sums[1] += (double)b * tt;
        batches++;
    }
    trainer_must(t, ddp_allreduce_host(t->ctx, sums, 2, DDP_FP64, DDP_SUM), "summing validation losses");
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

static void gpt_report_val(trainer *t)
{
    double t0 = train_now();
    trainer_params_ready(t);
    G(t)->val_loss = gpt_validate(t);
    if (t->rank != 0)
        return;
    double seconds = train_now() - t0;
    trainer_progress_eval(t, seconds, t->o->gpt.val_every);
    printf("step %ld: val loss %.4f (%.1f s)\n", t->step, G(t)->val_loss, seconds);
    fflush(stdout);
    ddp_metrics_set(t->scalars, "eval/val_loss", G(t)->val_loss, NULL);
    ddp_metrics_commit(t->scalars, t->step);
    if (t->metrics) {
        char v[32], l[32], g[32];
        jsonl_line(t->metrics,
                     "{\"step\":%ld,\"val_loss\":%s,\"train_loss\":%s,\"grad_norm\":%s,"
                     "\"lr\":%.8g}\n",
                     t->step, jsonl_num(v, sizeof v, "%.6f", G(t)->val_loss),
                     jsonl_num(l, sizeof l, "%.6f", G(t)->last_loss),
                     jsonl_num(g, sizeof g, "%.6f", optim_last_norm(t->opt)),
                     gpt_lr(t, t->step > 0 ? t->step - 1 : 0));
    }
}

/* This rank's mean training loss since the last call (its micro-batches). */
static double gpt_take_loss(trainer *t)
{
    float sum = trainer_loss_sum(t);
    double mean = t->loss_micro > 0 ? sum / (double)t->loss_micro : NAN;
    trainer_loss_reset(t);
    return mean;
}

/* After this run's first step (lazy loading, cuBLAS's heuristics, first-touch allocations): the
 * device finishes it, and the steady clock that tokens/s, ms/step and the MFU count from starts. */
static void gpt_mark_steady(trainer *t)
{
    trainer_must(t, ddp_synchronize(t->ctx), "waiting for the first step");
    trainer_clock(t);
    G(t)->steady_seconds = t->train_seconds;
    trainer_progress_steady(t, G(t)->flops_token * G(t)->B * G(t)->T * t->accum,
                            G(t)->peak_tflops * 1e12);
}

/* After optimizer step t->step (1-based now): the steady clock, progress, validation. */
static void gpt_after_step(trainer *t)
{
    gpt_task *s = G(t);
    const train_opts *o = t->o;
    if (t->step == t->start.step + 1)
        gpt_mark_steady(t);
    if (progress_due(&t->progress, t->step) || t->step == t->total_steps) {
        s->last_loss = gpt_take_loss(t);
        /* the norm of the last step applied: unchanged by a step left out */
        double norm = t->rank == 0 ? optim_last_norm(t->opt) : NAN;
        char extra[64];
        snprintf(extra, sizeof extra, " | lr %.2e | norm %.3g", gpt_lr(t, t->step - 1), norm);
        trainer_progress(t, s->last_loss, extra);
        if (t->rank == 0) {
            char l[32], g[32];
            if (t->metrics)
                jsonl_line(t->metrics, "{\"step\":%ld,\"train_loss\":%s,\"grad_norm\":%s}\n",
                             t->step, jsonl_num(l, sizeof l, "%.6f", s->last_loss),
                             jsonl_num(g, sizeof g, "%.6f", norm));
        }
    }
    if (o->gpt.val_every && t->step % o->gpt.val_every == 0 && t->step < t->total_steps) {
        trainer_clock(t);
        gpt_report_val(t);
        trainer_clock_restart(t);
    }
}

/* The last loss and validation, the largest memory over the ranks, rank 0's reports. */
static ddp_status gpt_report_end(trainer *t)
{
    gpt_task *s = G(t);
    if (t->loss_micro > 0)
        s->last_loss = gpt_take_loss(t);
    if (!t->stopped && !t->o->gpt.sample_only) /* after a stop signal the time left is for the
                                                   checkpoint, not a validation */
        gpt_report_val(t);
    size_t used = 0;
    double mem[2] = {(double)ddp_host_peak_rss_kib(),
                     ddp_memory_info(t->ctx, &used, NULL) == DDP_OK ? (double)used : -1.0};
    trainer_must(t, ddp_allreduce_host(t->ctx, mem, 2, DDP_FP64, DDP_MAX), "agreeing on memory");
    s->peak_rss_max = mem[0] / 1024.0;
    s->device_used_max = mem[1] >= 0.0 ? mem[1] / (1024.0 * 1024.0) : NAN;
    ddp_metrics_set(t->scalars, "memory/peak_rss_bytes", mem[0] * 1024.0, NULL);
    if (mem[1] >= 0.0)
        ddp_metrics_set(t->scalars, "memory/device_used_bytes", mem[1], NULL);
    ddp_metrics_commit(t->scalars, t->step);
    train_comm_stats(t->ctx, &s->comm); /* collective */
    if (!train_sample_only(t->o)) /* no step: no throughput or training memory to report */
        gpt_report_summary(t);
    return DDP_OK;
}

/* After --save: rank 0 writes --save-llmc; every rank draws the --sample (rank 0 prints it). */
static ddp_status gpt_after_save(trainer *t)
{
    ddp_status st = DDP_OK;
    if (t->rank == 0 && t->o->gpt.save_llmc) {
        /* a symbolic link is followed to the file it names (checked at start-up), which the
         * temporary file then replaces: the link stays */
        char *real = realpath(t->o->gpt.save_llmc, NULL);
        st = gpt2_llmc_save(G(t)->model, real ? real : t->o->gpt.save_llmc, DDP_FP32);
        free(real);
        if (st == DDP_OK)
            printf("saved %s (llm.c model file, fp32)\n", t->o->gpt.save_llmc);
    }
    if (st == DDP_OK && t->o->gpt.sample > 0)
        st = gpt_sample(t);
    return st;
}

static void gpt_release(trainer *t)
{
    gpt_task *s = G(t);
    ddp_free(t->ctx, s->vloss_dev);
    free(s->x_host);
    free(s->y_host);
    gpt2_destroy(s->model);
    tokens_val_destroy(s->val);
    tokens_loader_destroy(s->loader);
    tokens_set_close(s->train_data);
    tokens_set_close(s->val_data);
    bpe_vocab_free(s->vocab);
    bpe_encoder_free(s->encoder);
    gpt2_ckpt_free(&s->init);
}

const train_task train_task_gpt = {
    .state_bytes = sizeof(gpt_task), .open = gpt_open, .build = gpt_build, .lr = gpt_lr, .attach = gpt_attach, .zero_grad = gpt_zero_grad,
    .batch = gpt_batch, .forward = gpt_forward, .backward = gpt_backward,
    .epoch_begin = gpt_epoch_begin, .after_step = gpt_after_step, .epoch_end = gpt_epoch_end,
    .report_start = gpt_report_start, .report_end = gpt_report_end,
    .after_save = gpt_after_save, .release = gpt_release,
};
