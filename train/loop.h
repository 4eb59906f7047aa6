/* loop.h - ddp-train's one training loop and the task table a model plugs into it (the shape
 * nccl-tests gives its collectives: a struct of function pointers per model).
 *
 * The loop owns what every model shares: signals and the ranks' agreements, the NaN and stop
 * policies, the two batch slots, the reducer (one ZeRO protocol: the micro-step begins after the
 * forward pass; the parameters' all-gather overlaps the next forward), the optimizer (optim.h),
 * the loss scaler, replica checks, checkpoints, --save, resume and requeue. A task holds what is
 * specific to its model: its data, its model, one micro-batch, evaluation and reports.
 * docs/models.md says how to add one.
 */
#ifndef TRAIN_LOOP_H
#define TRAIN_LOOP_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#include "ddp.h"
#include "ddp_metrics.h"
#include "ops.h"
#include "optim.h"
#include "train_opts.h"
#include "train_report.h"
#include "train_state.h"

typedef struct trainer trainer;

/* What a task's open hands the loop: the step plan, the same on every rank. */
typedef struct train_plan {
    long steps_per_epoch;   /* optimizer steps per epoch */
    int accum;              /* micro-batches per optimizer step (this rank's) */
    int micro_total;        /* over all ranks when they take different numbers (0: accum x ranks) */
    size_t n_train;         /* training samples (GPT-2: windows), for the checkpoint's plan */
    bool no_training;       /* no step at all: the weights are only sampled, evaluated, exported */
    train_fixed_batch fixed; /* a global batch that the world size does not change (or none) */
    const char *outputs[2]; /* files the task writes besides --save (NULL: none), checked before */
    const char *output_flags[2]; /* training as --save is; their flags, for the messages */
} train_plan;

/* What a task's build hands the loop: the model's view (its parameter table, the weights its passes
 * read and the gradients its backward writes) and how to step it. */
typedef struct train_view {
    const ddp_param_desc *descs;
    int n_params;
    const size_t *numel;    /* (n_params) elements per parameter */
    size_t numel_total;
    void *weights;          /* the flat weights in `precision` (backend memory; the optimizer's
                               to update, in fp32 the master weights) */
    float *grads;           /* the flat fp32 gradients; NULL: the reducer's (reducer_grads) */
    uint32_t round_seed;    /* bf16 with AdamW: the weights' stochastic rounding (optim.h) */
    int *ready_order;       /* (n_params) the order backward marks, malloc'd (the loop frees it);
                               NULL: reverse parameter order. Needed for --zero 2. */
    bool *decays;           /* (n_params) weight decay per parameter, malloc'd; NULL: every one */
    optim_opts optim;       /* SGD or AdamW; decays is filled by the loop */
    bool reducer_grads;     /* the model writes its gradients where the reducer says (--zero 2) */
    bool reduce_each_micro; /* with reducer_grads: a reduce-scatter per micro-step (else one per
                               optimizer step, the micro-steps adding in the bucket buffers) */
    ddp_dtype precision;    /* the weights' and compute precision: fp16 takes the loss scaler */
    bool strict_order;      /* every rank runs the same backward: another order is a bug */
    size_t x_bytes, y_bytes; /* one micro-batch's inputs and targets (the batch slots' sizes) */
    long samples_per_step;  /* on every rank together, for the progress rate */
    const char *unit;       /* what a sample is ("samples", "tokens") */
    char model_fp[96];      /* the model's configuration a checkpoint must match */
} train_view;

/* A model's part of the run. The loop calls them in this order: open, build, attach,
 * report_start, then per epoch epoch_begin, per step zero_grad and `accum` x (batch, forward, the
 * reducer's begin, backward), after_step; epoch_end; at the end report_end, after_save, release. Failures a task meets alone (a failed
 * upload) stop the job (trainer_must); `open` and `build` return what every rank agrees on. */
typedef struct train_task {
    size_t state_bytes;                          /* the task's state (trainer_task, zeroed) */
    ddp_status (*open)(trainer *t, train_plan *plan); /* data, and the step plan (the loop
                                                         derives t->total_steps from it) */
    ddp_status (*build)(trainer *t, train_view *v); /* the model on t->ops (collective agreements
                                                       inside are the task's), view filled */
    double (*lr)(const trainer *t, long step);   /* the learning rate of step `step` (0-based) */
    void (*attach)(trainer *t);                  /* after t->reducer and t->opt exist (ZeRO's gather) */
    ddp_status (*zero_grad)(trainer *t);         /* the next backward overwrites the gradients */
    void (*batch)(trainer *t);                   /* the next micro-batch, uploaded (trainer_upload) */
    void (*forward)(trainer *t);                 /* adds the batch's mean loss to t->loss_dev */
    void (*backward)(trainer *t, float loss_scale); /* marks gradients ready on t->reducer */
    void (*epoch_begin)(trainer *t);
    void (*after_step)(trainer *t);              /* progress, evaluation (t->step is 1-based now) */
    void (*epoch_end)(trainer *t);
    void (*report_start)(trainer *t);            /* rank 0: the configuration */
    ddp_status (*report_end)(trainer *t);        /* evaluation and the end reports; collective */
    ddp_status (*after_save)(trainer *t);        /* rank 0, after --save (may be NULL): other
                                                    formats, samples; every rank learns the outcome */
    void (*release)(trainer *t);                 /* NULL-safe on a partial build */
} train_task;

extern const train_task train_task_mnist, train_task_gpt;

/* The stop requests the signal handlers set (SIGUSR1, SIGTERM), read at the ranks' agreements. */
typedef struct train_signals {
    volatile sig_atomic_t *usr1;
    volatile sig_atomic_t *term;
} train_signals;

struct trainer {
    ddp_ctx *ctx;
    const train_opts *o;
    const train_task *task;
    void *state;            /* the task's, task->state_bytes */
    train_signals sig;
    int rank, world;
    ops_handle *ops;
    ddp_reducer *reducer;
    optim *opt;             /* NULL without training (no_training) */
    void *weights;          /* the model's view (train_view) */
    float *grads;
    ddp_scaler *scaler;     /* fp16 (--precision or --grad-dtype): dynamic loss scaling */
    jsonl_file *metrics;  /* rank 0 with --metrics */
    ddp_metrics *scalars;   /* rank 0 with --tensorboard or --prometheus */
    ddp_straggler *straggler; /* --straggler-every; NULL: off */
    int accum;              /* micro-batches per optimizer step (this rank's) */
    int micro_total;        /* the plan's: 0 unless the ranks take different numbers */
    train_fixed_batch fixed; /* the plan's */
    bool no_training;       /* the task's plan takes no step (train_plan) */
    ddp_dtype precision;    /* the model's compute precision (train_view) */
    size_t n_train;         /* training samples (GPT-2: windows) for the checkpoint's plan */
    long steps_per_epoch, total_steps;
    long step, in_epoch;    /* optimizer steps done, in all and in this epoch */
    int epoch;
    train_pos start;        /* zero, or the resumed position */
    long saved_step;        /* step of the last checkpoint written, -1 for none */
    train_setup setup;
    void *x_dev[2], *y_dev[2]; /* backend memory: two batch slots, filled in turn */
    int slot;               /* the slot of the last upload */
    float *loss_dev;        /* (1) sum of micro-batch mean losses since the last reset */
    float loss_ok;          /* that sum at the last agreement that found it finite */
    long loss_micro, micro_ok; /* micro-batches in the sum, and at that agreement */
    uint64_t data_fp;       /* this step's samples on this rank: fingerprint, count (trainer_data) */
    long data_n;
    int loss_nan;           /* --nan-policy skip rolled a NaN/inf loss back since the reset */
    int stopped;            /* stopped early on a signal (the same on every rank) */
    int nan_stopped;        /* a non-finite loss stopped training (--nan-policy stop) */
    int save_failed;        /* a checkpoint failed with --checkpoint-errors stop */
    long skipped[16];       /* first optimizer steps the loss scaler skipped */
    double train_seconds;   /* in training steps (evaluation and checkpoints excluded) */
    double clock;           /* when the running training interval began */
    double wall_start;
    progress_bar progress;
};

/* The whole run on a joined context. Returns a failure only when every rank agrees on it; other
 * failures abort the job. *requeue: rank 0 should requeue the Slurm job. */
ddp_status train_run(ddp_ctx *ctx, const train_opts *o, const train_task *task,
                     train_signals sig, int *requeue);

/* A failure only this rank may have seen: stop the whole job so no peer waits forever. */
void trainer_must(trainer *t, ddp_status st, const char *what);
/* Every rank learns whether any rank failed: DDP_OK when none did, else a failure on every rank
 * (its own, or DDP_ERR_MISMATCH where a peer failed). Collective. */
ddp_status trainer_agree(trainer *t, ddp_status local);
/* A task's open with a fixed global batch f (f.value units; none: f.flag NULL, nothing done) in
 * micro-batches of `micro` units (`what`: e.g. "--batch 8"): the plan's accum is this rank's share
 * of a step's micro-batches (rank, rank + world, ... of them), micro_total their count where the
 * shares differ, fixed f. DDP_ERR_INVALID_ARG (said once) for a batch that is not whole
 * micro-batches or has fewer than ranks. */
ddp_status trainer_plan_global(const trainer *t, train_plan *p, train_fixed_batch f, long micro,
                               const char *what);
/* A micro-batch's samples, in a task's batch(): their count and fingerprint (readers/sample_fp.h).
 * With --metrics the step's sums over the ranks go into a line {"data_step", "data_fp",
 * "samples"}: the same at every world size that reads the same global batch. */
void trainer_data(trainer *t, uint64_t fp, long n);
/* Uploads a micro-batch into the next batch slot (t->slot), staged (overlapping the compute of
 * the batch before on a GPU); trainer_batch_done after the last compute that reads it. */
void trainer_upload(trainer *t, const void *x, size_t x_bytes, const void *y, size_t y_bytes);
void trainer_batch_done(trainer *t);
/* The loss summed since the last reset (a download: waits for the device). */
float trainer_loss_sum(trainer *t);
void trainer_loss_reset(trainer *t);
/* Adds the running interval to t->train_seconds (and the progress line's) and starts a new one. */
void trainer_clock(trainer *t);
/* Starts a new interval now, leaving out the time since the last trainer_clock (an evaluation). */
void trainer_clock_restart(trainer *t);
/* After step t->step: the clock, and on rank 0 the progress line with this loss and the task's
 * own fields (extra, e.g. " | lr 6.0e-04 | norm 1.02"; NULL: none). */
void trainer_progress(trainer *t, double loss, const char *extra);
/* At the end of this run's first step: the rate, ms/step and MFU count the steps after it only;
 * flops_per_step (one rank's model FLOPs, > 0 adds ms/step) and the device's peak FLOP/s (> 0
 * adds MFU). */
void trainer_progress_steady(trainer *t, double flops_per_step, double peak_flops);
/* Rank 0: ends a progress line under way (a terminal's line being redrawn), before other output. */
void trainer_progress_end(trainer *t);
/* Rank 0, after an evaluation of `seconds` that comes every `every` steps: ends the progress
 * line, and the ETA counts the evaluations to come. */
void trainer_progress_eval(trainer *t, double seconds, long every);
/* --zero: the parameters' all-gather has arrived (before a forward pass outside training). */
void trainer_params_ready(trainer *t);
/* Every rank holds the same parameters; `when` (rank 0 prints it) may be NULL. Collective. */
ddp_status trainer_verify(trainer *t, const char *when);
/* The step's micro-batches over all ranks. */
static inline long trainer_micro_total(const trainer *t)
{
    return t->micro_total ? t->micro_total : (long)t->accum * t->world;
}

#endif /* TRAIN_LOOP_H */
