/* task_gpt.h - what task_gpt.c (the GPT-2 task: data, model, steps) shares with report_gpt.c (its
 * reports: the configuration at the start, memory, FLOPs and MFU, the summary, sampling). Private
 * to train/.
 */
#ifndef TRAIN_TASK_GPT_H
#define TRAIN_TASK_GPT_H

#include "bpe.h"
#include "gpt2.h"
#include "gpt2_ckpt.h"
#include "loop.h"
#include "tokens.h"

#define GPT_EOT 50256    /* GPT-2's <|endoftext|>: the first token of a sample */
#define GPT_SCAN_TOKENS (1ul << 28) /* token sets up to 512 MiB are checked before training */


typedef struct gpt_task {
    gpt2_config cfg;
    int B, T;
    gpt2 *model;
    tokens_set *train_data, *val_data;
    tokens_loader *loader;
    tokens_val *val;
    bpe_vocab *vocab;      /* rank 0 with --sample: GPT-2's vocabulary ... */
    bpe_encoder *encoder;  /* ... or with --prompt its encoder, whose vocabulary decodes */
    int32_t *x_host, *y_host; /* (B, T) */
    float *vloss_dev;      /* (1) one validation batch's mean loss */
    double last_loss, val_loss;
    double peak_rss_max;   /* MiB: the largest VmHWM over the ranks at the end of training */
    double flops_token;    /* model FLOPs per token, llm.c's 6N + 6LCT (gpt2_mfu.h) */
    double peak_tflops;    /* one device's peak for this precision (--peak-tflops or the table);
                              -1: unknown */
    const char *device;    /* the GPU's name ("" on the CPU) */
    double steady_seconds; /* train_seconds at the end of this run's first step */
    double device_used_max; /* MiB: the most device memory in use over the ranks (CUDA), NAN */
    run_stats comm;         /* --trace: the communication figures (train_comm_stats) */
    gpt2_ckpt init;         /* --init-from a ddp checkpoint: its weights, held from gpt_config to
                              gpt_build (then freed; step and folder stay for the report) */
    int init_ckpt;         /* 1: --init-from named a ddp checkpoint, not an llm.c model file */
} gpt_task;

static inline gpt_task *G(const trainer *t) { return t->state; }

/* task_gpt.c */
/* The learning rate of step `step` (0-based): warm-up, then cosine decay. */
double gpt_lr(const trainer *t, long step);

/* report_gpt.c */
/* Rank 0: the configuration, the model's sizes and memory, FLOPs per token, the plan's warnings. */
void gpt_report_start(trainer *t);
/* Rank 0: throughput, MFU, memory, and the summary line of --metrics. */
void gpt_report_summary(trainer *t);
/* Rank 0: --sample tokens after --prompt (or <|endoftext|>), decoded. */
ddp_status gpt_sample(trainer *t);

#endif /* TRAIN_TASK_GPT_H */
