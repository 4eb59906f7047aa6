/* train_report.h - what ddp-train prints and writes: progress, classification report, metrics lines. */
#ifndef TRAIN_REPORT_H
#define TRAIN_REPORT_H

#include <stdio.h>

#include "train_opts.h"

#define REPORT_N_CLASSES 10

/* Seconds on a monotonic clock. */
double train_now(void);

/* Progress of training on rank 0, on stdout (where the evaluations and reports go too): a live
 * bar (\r updates) when stdout and stderr are a terminal, else a plain line every log_every steps. */
typedef struct progress_bar {
    int tty;
    int log_every;
    long total_steps;      /* planned optimizer steps */
    long samples_per_step; /* across all ranks */
    const char *unit;      /* what a sample is in the rate: "samples" (default) or "tokens" */
    double train_seconds;  /* time spent in training steps so far (evaluation excluded) */
    /* The steady clock (0 by default: the rate over every step). After step base_step, at
     * base_seconds of train_seconds, the rate, ms/step, MFU and ETA count the steps after it
     * only; up to it, the steps after first_step (a resumed run's start) over train_seconds. */
    long first_step, base_step;
    double base_seconds;
    double flops_per_step; /* model FLOPs of one step on one rank: > 0 adds "| N ms/step" */
    double peak_flops;     /* one device's peak, FLOP/s: > 0 adds "| N % MFU" */
    long eval_every;       /* steps between evaluations (0: only at the end) ... */
    double eval_seconds;   /* ... and the last one's time (0: none yet): the ETA counts those to come */
    char extra[96];        /* the task's own fields for the line (" | lr 6.0e-04 | norm 1.02") */
} progress_bar;

void progress_init(progress_bar *p, int log_every, long total_steps, long samples_per_step);
/* 1 when step `step` gets a progress line (this run's first step, at once, then every log_every
 * steps, and the last one): the trainer downloads its loss from the GPU only then. */
int progress_due(const progress_bar *p, long step);
/* After optimizer step `step` (1-based) of epoch `epoch`; loss: this rank's running mean loss. */
void progress_update(progress_bar *p, long step, int epoch, double loss);
/* Ends the live bar's line (no-op without a terminal). */
void progress_end(const progress_bar *p);

/* Confusion counts: confusion[true * REPORT_N_CLASSES + predicted]. */
double confusion_accuracy(const float *confusion);
/* sklearn-style table: per-class precision, recall, F1 and support; accuracy; macro and weighted
 * averages. A class with no prediction (or no sample) gets precision (recall) 0. */
void print_class_report(FILE *f, const float *confusion);

/* One epoch's numbers, as printed and as a metrics line. */
typedef struct epoch_stats {
    int epoch;            /* 0-based */
    long steps;           /* optimizer steps in this epoch */
    double train_loss;    /* mean over ranks and micro-batches */
    double test_accuracy; /* 0..1 */
    double samples_per_s; /* across all ranks, training time only */
} epoch_stats;

/* Summary of the run (the last metrics line). */
typedef struct run_stats {
    int world_size;
    int epochs;           /* epochs run (the last may be cut short by --max-steps) */
    long steps;           /* optimizer steps */
    double test_accuracy; /* after the last epoch, 0..1 */
    double train_loss;    /* last epoch */
    double samples_per_s; /* across all ranks, training time only */
    double train_seconds;
    double wall_seconds;
    const char *backend;
    int stopped_by_signal; /* SIGUSR1 ended training before the planned steps */
    double exposed_comm_ms; /* --trace: mean time a step waited for its all-reduces; -1: no trace */
    double comm_ms;         /* --trace: mean all-reduce time per step (running, hidden or not) */
    double hidden_fraction; /* --trace: 1 - exposed / comm, clamped at 0 */
    double gather_wait_ms;  /* --trace, --zero: mean time a step's forward pass waited for the
                               parameters' all-gather; -1: none measured */
    long long allgather_calls, allgather_bytes; /* rank 0's all-gathers over the run (ddp.h's
                               ddp_comm_stats: ZeRO's parameter gathers, a checkpoint's shards) */
} run_stats;

/* --metrics (rank 0): JSON lines, each formatted whole and written with one write(2), so a run
 * killed at any moment leaves only whole lines behind (a kill inside the write itself aside, which
 * the next run's metrics_open repairs). */
typedef struct metrics_file metrics_file;

/* Opens path for the metrics lines. Its folder is created when missing (mkdir -p, as
 * --checkpoint-dir is); a new file (truncated), or with append the lines go after the file's: a
 * last line without its newline (a run killed while writing it) is cut back to the line before,
 * with a note in the log, so every line stays valid JSON. A FIFO without a reader fails (ENXIO)
 * instead of blocking. NULL on failure, logged naming the path and the reason. */
metrics_file *metrics_open(const char *path, int append);
/* Writes one line: fmt and its arguments, which end with "\n". A failed write is warned about
 * once (the lines after it may be missing); training goes on. */
void metrics_line(metrics_file *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Closes the file; NULL is ignored. */
void metrics_close(metrics_file *m);

void metrics_epoch(metrics_file *m, const epoch_stats *e);
void metrics_summary(metrics_file *m, const train_opts *o, const run_stats *r);
/* The summary line's communication fields (",\"exposed_comm_ms\":..,\"comm_ms\":..,
 * \"hidden_fraction\":..,\"gather_wait_ms\":..,\"allgather_calls\":..,\"allgather_bytes\":.."; null
 * when not measured) in buf; returns buf. */
const char *metrics_comm(char *buf, size_t n, const run_stats *r);

#endif /* TRAIN_REPORT_H */
