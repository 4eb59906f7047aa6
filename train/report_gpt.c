/* report_gpt.c - ddp-train --model gpt2's reports (task_gpt.h): the configuration at the start,
 * the memory the model and the ZeRO stage take (measured and by the formula), FLOPs per token and
 * MFU, throughput, the summary line of --metrics, and sampling from the trained model.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_isa.h"
#include "gpt2_sample.h"
#include "malloc_policy.h"
#include "gpt2_mfu.h"
#include "model.h"
#include "task_gpt.h"
#include "switches.h"

/* The memory report of the end of training, MiB per rank (gpt_memory). */
typedef struct gpt_mem_report {
    double params, grads, optimizer, activations, logits, comm, states, peak_rss;
    double device_used, device_total; /* MiB, cudaMemGetInfo on CUDA; NAN on the CPU */
    double bytes_rep, bytes_shard; /* per parameter: replicated, divided over the ranks */
    double predicted;              /* model states by the ZeRO formula */
} gpt_mem_report;

/* Bytes per parameter of the model states (ZeRO paper's accounting for this run's types):
 * replicated on every rank, and divided over the ranks by --zero. The weights in their storage
 * (16 bits: 2 bytes, or 4 where emulated in floats; the model's small slices read in fp32 come on
 * top, measured), fp32 gradients, AdamW's m and v and in 16 bits the optimizer's fp32 master. */
static void gpt_state_bytes(const trainer *t, double *rep, double *shard)
{
    double p = (double)ops_dtype_size(t->ops, t->precision), g = 4.0;
    double o = t->precision == DDP_FP32 ? 8.0 : 12.0;
    int z = t->o->zero;
    *rep = p + (z < 2 ? g : 0.0) + (z < 1 ? o : 0.0);
    *shard = (z >= 2 ? g : 0.0) + (z >= 1 ? o : 0.0);
}

/* Memory per rank by kind, the peak resident set, and the ZeRO prediction beside them; the
 * fields go into the summary line of --metrics (mem_*_mib). */
static void gpt_memory(const trainer *t, gpt_mem_report *r)
{
    gpt2_memory m;
    gpt2_memory_get(G(t)->model, &m);
    const double mib = 1024.0 * 1024.0;
    size_t off = 0, n = 0, reducer = ddp_reducer_buffer_bytes(t->reducer);
    ddp_reducer_shard(t->reducer, &off, &n);
    size_t shard_grads = t->o->zero == 2 ? n * sizeof(float) : 0;
    r->params = m.params / mib;
    r->grads = (m.grads + shard_grads) / mib; /* stage 2: the shard only (the model has none) */
    r->optimizer = (double)optim_state_bytes(t->opt) / mib;
    r->activations = m.activations / mib;
    r->logits = m.logits / mib;
    r->comm = (reducer - shard_grads) / mib; /* stage 2: the bucket buffers backward writes into */
    r->states = r->params + r->grads + r->optimizer;
    long rss = ddp_host_peak_rss_kib();
    r->peak_rss = rss >= 0 ? rss / 1024.0 : NAN;
    size_t used = 0, total = 0;
    int dev = ddp_memory_info(t->ctx, &used, &total) == DDP_OK;
    r->device_used = dev ? used / mib : NAN;
    r->device_total = dev ? total / mib : NAN;
    gpt_state_bytes(t, &r->bytes_rep, &r->bytes_shard);
    double psi = (double)gpt2_numel_total(G(t)->model);
    r->predicted = psi * (r->bytes_rep + r->bytes_shard / t->world) / mib;
}

static void gpt_report_memory(const trainer *t, const gpt_mem_report *r)
{
    printf("memory per rank (%s): parameters %.1f MiB, gradients %.1f MiB, optimizer state %.1f "
           "MiB, activations %.1f MiB, communication buffers %.1f MiB; host peak RSS (VmHWM) %.1f "
           "MiB (the largest over the ranks %.1f MiB)\n",
           ddp_backend(t->ctx) == DDP_BACKEND_CPU ? "host" : "device", r->params, r->grads,
           r->optimizer, r->activations, r->comm, r->peak_rss, G(t)->peak_rss_max);
    printf("memory predicted (ZeRO stage %d, %d rank(s), Psi = %zu): model states %.0f Psi + %.0f "
           "Psi / %d = %.1f MiB; measured %.1f MiB (parameters + gradients + optimizer state, "
           "%+.1f %%)%s\n",
           t->o->zero, t->world, gpt2_numel_total(G(t)->model), r->bytes_rep, r->bytes_shard, t->world,
           r->predicted, r->states, 100.0 * (r->states / r->predicted - 1.0),
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
               r->device_used, r->device_total, G(t)->device_used_max);
}

/* The type the logits are stored in (the activations'), from their size: 4 bytes an element fp32,
 * else the run's 16-bit precision. */
static const char *gpt_logits_type(const trainer *t, double logits_mib)
{
    double elems = (double)G(t)->B * G(t)->T * G(t)->cfg.padded_vocab;
    double bytes = logits_mib * 1024.0 * 1024.0 / elems;
    return bytes > 3.0 ? "fp32" : model_precision_name(t->o->model.precision);
}

/* Rank 0, before the first step (a run that then runs out of memory has said what it holds): the
 * memory allocated per rank, the 16-bit weight copy and the logits broken out. */
static void gpt_report_memory_start(trainer *t)
{
    gpt_mem_report r;
    gpt_memory(t, &r);
    bool p16 = t->precision != DDP_FP32;
    printf("memory per rank at start-up (%s, allocated before the first step): parameters %.1f MiB "
           "(the weights in %s), gradients %.1f MiB, optimizer state %.1f MiB (%s of %s), "
           "activations %.1f MiB (the logits %.1f MiB of them: B x T x padded vocabulary in %s, "
           "which --recompute does not shrink), communication buffers %.1f MiB\n",
           ddp_backend(t->ctx) == DDP_BACKEND_CPU ? "host" : "device", r.params,
           model_precision_name(t->precision), r.grads, r.optimizer,
           p16 ? "the fp32 master weights and AdamW's moments" : "AdamW's moments",
           t->o->zero > 0 && t->world > 1 ? "this rank's shard" : "every parameter", r.activations,
           r.logits, gpt_logits_type(t, r.logits), r.comm);
}

/* --sample N tokens from the model after --prompt's tokens (or <|endoftext|>), drawn at
 * --temperature among the --top-k most likely (gpt2_sample.h) with a generator seeded by --seed,
 * the context cut to the last --seq tokens; rank 0 prints them as text. Every rank draws them (the
 * replicas are identical), so that none waits past DDP_TIMEOUT for a long sample of rank 0's. */
ddp_status gpt_sample(trainer *t)
{
    const train_gpt_opts *g = &t->o->gpt;
    bpe_ids prompt = {0};
    ddp_status st = DDP_OK;
    if (g->prompt)
        st = bpe_encode(G(t)->encoder, (const uint8_t *)g->prompt, strlen(g->prompt), &prompt);
    int n_prompt = prompt.n > 0 ? (int)prompt.n : 1, n = g->sample;
    int *seq = malloc((size_t)(n_prompt + n) * sizeof *seq);
    if (st == DDP_OK && !seq)
        st = DDP_ERR_NOMEM;
    for (int i = 0; st == DDP_OK && i < n_prompt; i++)
        seq[i] = prompt.n > 0 ? prompt.id[i] : GPT_EOT;
    gpt2_sample_opts so = {.n_tokens = n, .temperature = (float)g->temperature, .top_k = g->top_k,
                           .seed = t->o->seed};
    ddp_watch_where(t->step, -1, "sampling");
    if (st == DDP_OK)
        st = gpt2_sample(G(t)->model, t->ctx, seq, n_prompt, G(t)->T, &so, t->x_dev[0]);
    const bpe_vocab *v = G(t)->encoder ? bpe_encoder_vocab(G(t)->encoder) : G(t)->vocab;
    char *text = NULL;
    size_t len = 0;
    if (st == DDP_OK && t->rank == 0)
        st = bpe_decode(v, seq + (prompt.n > 0 ? 0 : 1), (size_t)(n + (int)prompt.n), &text, &len);
    if (st == DDP_OK && t->rank == 0) {
        printf("sample (%d tokens after %s, temperature %g, top-k %d, seed %llu):\n%.*s\n", n,
               g->prompt ? "the prompt" : "<|endoftext|>", g->temperature, g->top_k,
               (unsigned long long)t->o->seed, (int)len, text);
        fflush(stdout);
    }
    free(text);
    free(seq);
    bpe_ids_free(&prompt);
    return st;
}

/* Rank 0, at start: what the MFU counts, and against which peak. */
static void gpt_report_flops(const trainer *t)
{
    const train_opts *o = t->o;
    printf("model FLOPs: 6N + 6LCT = %.0f per token (llm.c's count: N = %llu with wte's padding "
           "rows, T %d); ", G(t)->flops_token,
           (unsigned long long)mfu_gpt2_n_params_padded(&G(t)->cfg), G(t)->T);
    const char *kind = o->model.precision != DDP_FP32 ? "16-bit tensor cores, dense"
                       : o->tf32                      ? "TF32 tensor cores, dense"
                                                      : "fp32";
    if (o->gpt.peak_tflops > 0.0)
        printf("MFU against %g TFLOP/s per device (--peak-tflops)\n", G(t)->peak_tflops);
    else if (G(t)->peak_tflops > 0.0)
        printf("MFU against %g TFLOP/s per device (%s, %s; NVIDIA's datasheet)\n", G(t)->peak_tflops,
               G(t)->device, kind);
    else if (G(t)->device[0])
        printf("MFU not computed: %s (%s) is not in the peak table; give --peak-tflops X\n",
               G(t)->device, kind);
    else
        printf("MFU not computed on the CPU (no peak table); give --peak-tflops X\n");
}

/* Rank 0, --sample-only from --init-from: the model sampled, in one line (no training banner). */
static void gpt_report_sampling(const trainer *t)
{
    const gpt2_config *c = &G(t)->cfg;
    printf("ddp-train: sampling from %s (gpt2, %zu parameters: L %d, heads %d, channels %d), no "
           "training\n", t->o->gpt.init_from, gpt2_config_n_params(c), c->layers, c->heads,
           c->channels);
    fflush(stdout);
}

/* Rank 0: a warning for --warmup-steps or --val-every larger than the steps planned, with the
 * numbers and the fix. */
static void gpt_warn_plan(const trainer *t)
{
    const train_gpt_opts *g = &t->o->gpt;
    long steps = t->total_steps, fit = steps / 10 > 0 ? steps / 10 : 1;
    if (g->warmup_steps > steps)
        DDP_WARN0("--warmup-steps %ld is more than the %ld steps planned: the learning rate never "
                  "reaches --lr %g (it ends at %.3g) and never decays; use --warmup-steps %ld or "
                  "fewer (e.g. %ld), or plan more steps (--max-steps, --epochs)", g->warmup_steps,
                  steps, t->o->lr, gpt_lr(t, steps > 0 ? steps - 1 : 0), steps, fit);
    if (g->val_every > steps)
        DDP_WARN0("--val-every %d is more than the %ld steps planned: the validation loss is "
                  "measured only once, at the end; use --val-every %ld or fewer (e.g. %ld) to "
                  "see it fall", g->val_every, steps, steps, steps / 4 > 0 ? steps / 4 : 1);
}

/* Rank 0: the start-up report. */
void gpt_report_start(trainer *t)
{
    if (t->rank != 0)
        return;
    const train_opts *o = t->o;
    if (train_sample_only(o)) {
        gpt_report_sampling(t);
        return;
    }
    gpt_warn_plan(t);
    ddp_dtype p = o->model.precision;
    printf("ddp-train: %d rank(s), backend %s\n", t->world, ddp_backend_name(ddp_backend(t->ctx)));
    if (ddp_backend(t->ctx) == DDP_BACKEND_CPU)
        printf("cpu: %s; ISA %s\ncompute: %s, %s; GEMM %s; BLAS %s\n", cpu_model_name(),
               cpu_isa_describe(), t->ops->name, model_precision_name(p), ops_cpu_gemm_name(p),
               ops_blas_describe());
    else
        printf("compute: %s, %s; GEMM %s\n", t->ops->name, model_precision_name(p),
               ops_cuda_describe(t->ops, p));
    if (*ops_switches_describe())
        printf("switches: %s\n", ops_switches_describe());
    train_print_opts(stdout, o);
    const gpt2_config *c = &G(t)->cfg;
    printf("gpt2: %zu parameters (L %d, heads %d, channels %d, positions %d, vocabulary %d padded "
           "to %d)%s%s\n", gpt2_config_n_params(c), c->layers, c->heads, c->channels, c->max_seq,
           c->vocab, c->padded_vocab, o->gpt.init_from ? ", from " : "",
           o->gpt.init_from ? o->gpt.init_from : "");
    /* saved_step is set before the first step by a resume only */
    if (G(t)->init_ckpt && t->saved_step < 0 && o->gpt.sample_only)
        printf("init: the weights come from the ddp checkpoint %s %s at step %llu (sampled, not "
               "trained)\n", G(t)->init.folder ? "folder" : "file", o->gpt.init_from,
               (unsigned long long)G(t)->init.step);
    else if (G(t)->init_ckpt && t->saved_step < 0)
        printf("init: the weights come from the ddp checkpoint %s %s at step %llu; its optimizer "
               "state and step were not restored: AdamW starts from zero moments at step 0, with "
               "a new warm-up and schedule, and the data read from the start (epoch 1, the order "
               "--seed draws); --resume continues a run instead\n",
               G(t)->init.folder ? "folder" : "file", o->gpt.init_from,
               (unsigned long long)G(t)->init.step);
    else if (G(t)->init_ckpt)
        printf("init: --resume restored step %ld: its checkpoint replaced the weights of "
               "--init-from %s\n", t->step, o->gpt.init_from);
    printf("data: %zu windows of %d tokens in the training shards; %zu per rank per epoch; %d "
           "micro-batch(es) of %d x %d tokens per rank per step = %ld tokens per step; %ld steps "
           "per epoch, %ld planned\n", tokens_loader_n_windows(G(t)->loader), G(t)->B * G(t)->T + 1,
           tokens_loader_steps_per_epoch(G(t)->loader), t->accum, G(t)->B, G(t)->T,
           (long)G(t)->B * G(t)->T * trainer_micro_total(t), t->steps_per_epoch, t->total_steps);
    gpt_report_flops(t);
    gpt_report_memory_start(t);
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

static void gpt_rates_get(const trainer *t, gpt_rates *r)
{
    const gpt2_config *c = &G(t)->cfg;
    double step_tokens = (double)G(t)->B * G(t)->T * trainer_micro_total(t);
    double steady = t->train_seconds - G(t)->steady_seconds;
    r->steps = t->step - t->start.step;
    r->tps = t->train_seconds > 0 ? (double)r->steps * step_tokens / t->train_seconds : 0.0;
    int known = r->steps > 1 && steady > 0.0;
    r->tps_steady = known ? (double)(r->steps - 1) * step_tokens / steady : NAN;
    r->ms_per_step = known ? 1e3 * steady / (double)(r->steps - 1) : NAN;
    r->tflops_rank = r->tps_steady / t->world * G(t)->flops_token / 1e12;
    double mfu = mfu_value(r->tps_steady / t->world, G(t)->flops_token, G(t)->peak_tflops);
    r->mfu = mfu >= 0.0 ? mfu : NAN;
    double flops_12ltc = 6.0 * (double)gpt2_config_n_params(c) +
                         12.0 * c->layers * (double)G(t)->T * c->channels;
    r->gflops_12ltc = r->tps * flops_12ltc / t->world / 1e9;
}

static void gpt_print_rates(const trainer *t, const gpt_rates *r)
{
    printf("\nthroughput: %.1f tokens/s across %d rank(s) (%ld steps in %.2f s of training)",
           r->tps, t->world, r->steps, t->train_seconds);
    if (isnan(r->tps_steady)) {
        printf("; from step 2 on: not measured (%s)\n",
               r->steps == 0 ? "no step in this run" : r->steps == 1 ? "one step" : "no time");
        return;
    }
    printf("; from step 2 on %.1f tokens/s, %.1f ms/step, model FLOPs %.4g TFLOP/s per rank (6N + "
           "6LCT = %.0f per token, llm.c's count)", r->tps_steady, r->ms_per_step, r->tflops_rank,
           G(t)->flops_token);
    if (isnan(r->mfu))
        printf(", MFU unknown (no peak for this device: --peak-tflops X)\n");
    else
        printf(", MFU %.1f %% of %g TFLOP/s\n", 100.0 * r->mfu, G(t)->peak_tflops);
}

/* The summary line's rate fields after model_gflops_per_rank (docs/formats.md). */
static void gpt_json_rates(char *buf, size_t n, const trainer *t, const gpt_rates *r)
{
    char ts[32], ms[32], tf[32], pk[32], mf[32], dev[128];
    size_t k = 0;
    for (const char *c = G(t)->device; *c && k + 1 < sizeof dev; c++) /* no quote or control byte */
        dev[k++] = *c == '"' || *c == '\\' || (unsigned char)*c < 0x20 ? '?' : *c;
    dev[k] = '\0';
    snprintf(buf, n, ",\"tokens_per_s_steady\":%s,\"ms_per_step\":%s,\"flops_per_token\":%.0f,"
             "\"model_tflops_per_rank\":%s,\"peak_tflops\":%s,\"mfu\":%s,\"device_name\":\"%s\"",
             jsonl_num(ts, sizeof ts, "%.8g", r->tps_steady),
             jsonl_num(ms, sizeof ms, "%.8g", r->ms_per_step),
             G(t)->flops_token, jsonl_num(tf, sizeof tf, "%.8g", r->tflops_rank),
             jsonl_num(pk, sizeof pk, "%.8g", G(t)->peak_tflops > 0.0 ? G(t)->peak_tflops : NAN),
             jsonl_num(mf, sizeof mf, "%.8g", r->mfu), dev);
}

/* Rank 0: throughput, MFU, memory, and the summary line of --metrics. */
void gpt_report_summary(trainer *t)
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
    char tl[32], vl[32], rs[32], du[32], dm[32], rates[512], comm[256];
    if (t->metrics) {
        gpt_json_rates(rates, sizeof rates, t, &r);
        jsonl_line(t->metrics,
                     "{\"summary\":true,\"model\":\"gpt2\",\"backend\":\"%s\",\"world_size\":%d,"
                     "\"batch\":%d,\"seq\":%d,\"accum\":%d,\"steps\":%ld,\"train_loss\":%s,"
                     "\"val_loss\":%s,\"tokens_per_s\":%.1f,\"model_gflops_per_rank\":%.3f%s,"
                     "\"train_seconds\":%.3f,\"wall_seconds\":%.3f,\"stopped_by_signal\":%s,"
                     "\"zero\":%d,\"recompute\":%s,\"n_params\":%zu,\"mem_params_mib\":%.2f,"
                     "\"mem_grads_mib\":%.2f,\"mem_optimizer_mib\":%.2f,"
                     "\"mem_activations_mib\":%.2f,\"mem_comm_mib\":%.2f,\"mem_states_mib\":%.2f,"
                     "\"mem_predicted_states_mib\":%.2f,\"mem_peak_rss_mib\":%s,"
                     "\"mem_peak_rss_max_mib\":%.2f,\"mem_device_used_mib\":%s,"
                     "\"mem_device_used_max_mib\":%s%s}\n",
                     ddp_backend_name(ddp_backend(t->ctx)), t->world, G(t)->B, G(t)->T, t->accum,
                     t->step, jsonl_num(tl, sizeof tl, "%.6f", G(t)->last_loss),
                     jsonl_num(vl, sizeof vl, "%.6f", G(t)->val_loss), r.tps, r.gflops_12ltc,
                     rates,
                     t->train_seconds, train_now() - t->wall_start, t->stopped ? "true" : "false",
                     t->o->zero, t->o->gpt.recompute ? "true" : "false",
                     gpt2_numel_total(G(t)->model), mr.params, mr.grads, mr.optimizer,
                     mr.activations, mr.comm, mr.states, mr.predicted,
                     jsonl_num(rs, sizeof rs, "%.6f", mr.peak_rss), G(t)->peak_rss_max,
                     jsonl_num(du, sizeof du, "%.6f", mr.device_used),
                     jsonl_num(dm, sizeof dm, "%.6f", G(t)->device_used_max),
                     metrics_comm(comm, sizeof comm, &G(t)->comm));
    }
}
