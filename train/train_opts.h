/* train_opts.h - command-line options of ddp-train (parsing and validation). */
#ifndef TRAIN_OPTS_H
#define TRAIN_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "ddp.h"
#include "ddp_straggler.h"
#include "gpt2.h"
#include "model.h"

/* Limits of the flags, each refused beyond with the allowed range in the message. They keep
 * every count and product of counts far from overflow and catch typos that would train for
 * centuries or not at all. */
#define TRAIN_MAX_EPOCHS 1000000
#define TRAIN_MAX_STEPS 1000000000000L  /* --max-steps: 30 years at 1 ms a step */
#define TRAIN_MAX_THREADS 1024
#define TRAIN_MAX_WORKERS 256 /* --workers: data prefetch threads */
#define TRAIN_MIN_LR 1e-12  /* below it, float32 updates round away for any usable gradient */
#define TRAIN_MAX_LR 1e3    /* above it, SGD diverges at once on these models */
#define TRAIN_GPT_LR_WARN 1e-2 /* --lr above it with GPT-2 (AdamW) warns: MNIST's SGD rates diverge */
#define TRAIN_MAX_WEIGHT_DECAY 1e3
#define TRAIN_MAX_BUCKET_MB 1048576.0  /* 1 TiB: more than any model's gradients */
#define TRAIN_MAX_SAMPLE 100000 /* --sample: tokens generated after training */
#define TRAIN_MAX_PEAK_TFLOPS 1e6 /* --peak-tflops: an exaFLOP/s per device */

/* The GPT-2 part of the options (--model gpt2). */
typedef struct train_gpt_opts {
    int on;                     /* --model gpt2 */
    gpt2_config cfg;            /* --gpt-config preset, or --layers/--heads/--channels */
    int seq;                    /* --seq: tokens per sequence, T (default 64; <= cfg.max_seq) */
    const char *val_data;       /* --val-data PATTERN (default: the train pattern, train -> val) */
    int val_every;              /* --val-every N: validation loss every N steps (0: at the end only) */
    long val_batches;           /* --val-max-batches N: 0 = the whole validation set */
    long total_batch_tokens;    /* --total-batch-tokens: tokens per optimizer step, all ranks (0:
                                   batch x seq x ranks x accum) */
    long warmup_steps;          /* --warmup-steps: linear learning-rate warm-up */
    double lr_floor;            /* --lr-floor: the cosine decays to lr x this fraction */
    double grad_clip;           /* --grad-clip: max global gradient norm (0: no clipping) */
    double beta1, beta2, eps;   /* AdamW (0.9, 0.95, 1e-8) */
    const char *init_from;      /* --init-from FILE: an llm.c model file */
    const char *save_llmc;      /* --save-llmc FILE: the trained weights as an llm.c file */
    int sample;                 /* --sample N: tokens generated and printed after training */
    const char *vocab;          /* --vocab FILE: GPT-2's encoder.json for --sample (default: beside
                                   the data, DIR/encoder.json) */
    int recompute;              /* --recompute: blocks recompute their forward during backward */
    int zero_accum;             /* --zero-accum: 0 not given (local), 1 local, 2 reduce
                                   (ddp_reducer_opts.local_accum under --zero 2) */
    double peak_tflops;         /* --peak-tflops X: the peak per device the MFU is measured against
                                   (0: the table's for the GPU, unknown on the CPU) */
    const char *prompt;         /* --prompt TEXT: the sample continues it (NULL: <|endoftext|>) */
    double temperature;         /* --temperature X: the logits divided by it (0: greedy; default 1) */
    int top_k;                  /* --top-k K: draws among the K most likely tokens (0: all) */
    int sample_only;            /* --sample-only: no training, the model's weights sampled */
} train_gpt_opts;

typedef struct train_opts {
    model_config model;  /* kind, widths, seed; max_batch = batch */
    const char *data_dir;    /* folder with the four IDX files */
    int epochs;
    long max_steps;          /* optimizer steps; 0 = no limit */
    int batch;               /* per rank, per micro-step */
    int accum;               /* micro-steps per optimizer step */
    long global_batch;       /* --global-batch (MNIST): samples per step, all ranks; sets the
                                micro-steps per world size (0: --accum's) */
    double lr, momentum, weight_decay;
    int cosine;              /* --lr-schedule cosine: lr * (1 + cos(pi * step / steps)) / 2 */
    uint64_t seed;           /* model initialisation and sampler shuffling */
    double bucket_mb, first_bucket_mb;
    ddp_backend_kind device;
    int threads;
    const char *metrics_path; /* NULL: none */
    const char *tensorboard_dir, *prometheus_path; /* rank 0's dashboards' files; NULL: none */
    const char *save_path;    /* NULL: none */
    int shuffle;
    int augment;              /* random shifts of up to 2 pixels of training images */
    int log_every;            /* progress line every N steps when stderr is not a terminal */
    int broadcast_init;
    const char *trace_path;   /* --trace FILE: timeline written by rank 0; NULL: no tracing */
    int no_overlap;           /* --no-overlap: buckets launched after the backward pass */
    int link_check;           /* --link-check: measure links before training */
    int straggler_every; double straggler_threshold; /* --straggler-every, --straggler-threshold */
    ddp_dtype grad_dtype;      /* --grad-dtype: type of the gradient all-reduce */
    int zero;                  /* --zero 0|1|2: ZeRO stage (ddp_reducer_opts.zero_stage) */
    int tf32;                  /* --tf32: TF32 tensor cores for fp32 GEMMs and convolutions (GPU) */
    double loss_scale_init;    /* fp16 gradients: the loss scaler's first scale */
    long loss_scale_interval;  /* fp16 gradients: finite steps before the scale doubles */
    int workers;               /* data prefetch threads; 0 = on the training thread */
    int n_inject;              /* --inject-inf RANK:STEP entries (a test aid) */
    int inject_rank[8];
    long inject_step[8];
    /* Checkpoints and resuming (train_state.c). */
    const char *checkpoint_dir; /* NULL: none; checkpoints DIR/step-<12 digits>.ckpt */
    long checkpoint_every;      /* optimizer steps between checkpoints; 0 = on a stop and at the end */
    int keep;                   /* checkpoints kept in checkpoint_dir (default 3) */
    const char *resume;         /* NULL, "auto" (newest valid in checkpoint_dir) or a file */
    int resume_reshard;         /* allow resuming with another world size (not bit-identical) */
    const char *snapshot_dir;   /* rescue snapshots (elastic), NULL: none */
    int requeue;                /* after a stop by signal under Slurm: scontrol requeue the job */
    int checkpoint_errors_warn; /* a failed save warns and training goes on (default: stop, exit 1) */
    int checkpoint_format;      /* --checkpoint-format: TRAIN_CKPT_AUTO (default), _FILE, _FOLDER */
    int checkpoint_folder;      /* what the saves write, settled by checkpoint_place: 1 a folder of
                                   per-rank files, 0 one file through rank 0 */
    char checkpoint_why[256];   /* why that format (the start-up line) */
    int checkpoint_async;       /* --checkpoint-async: folders written by a background thread */
    int nan_skip;               /* --nan-policy skip: a step with NaN/inf loss is not applied */
    train_gpt_opts gpt;         /* --model gpt2 */
} train_opts;

/* --checkpoint-format, in the order of its words. */
enum { TRAIN_CKPT_AUTO = 0, TRAIN_CKPT_FILE, TRAIN_CKPT_FOLDER };

/* What the caller does after parsing. */
typedef enum train_parse_result {
    TRAIN_PARSE_RUN = 0,  /* options valid: train */
    TRAIN_PARSE_HELP,     /* --help printed: exit 0 */
    TRAIN_PARSE_USAGE     /* invalid command line, message printed to stderr: exit 2 */
} train_parse_result;

/* Fills o with the defaults, then parses argv. Messages name the flag and the bad value. */
train_parse_result train_parse_args(int argc, char **argv, train_opts *o);

/* 1 for --sample-only without --resume: the weights of --init-from sampled, with no data loader,
 * no optimizer state and no step (--resume restores a whole run, so it opens both). */
int train_sample_only(const train_opts *o);

/* Writes the options, one "name: value" per line, for the start-up report. */
void train_print_opts(FILE *f, const train_opts *o);

#endif /* TRAIN_OPTS_H */
