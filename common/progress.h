/* progress.h - a training run's progress on stdout (ddp-train's rank 0): a live bar when a person
 * watches a terminal, else a line every log_every steps; the rate, ms/step, MFU and the ETA. */
#ifndef COMMON_PROGRESS_H
#define COMMON_PROGRESS_H

/* On stdout (where the evaluations and reports go too): a live bar (\r updates) when stdout and
 * stderr are a terminal, else a plain line every log_every steps. */
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
    double eval_seconds;   /* ... and the last one's time (0: none yet): the ETA counts those to
                              come */
    char extra[96];        /* the task's own fields for the line (" | lr 6.0e-04 | norm 1.02") */
    double rate, mfu;      /* the last line's: samples (or tokens) per second, and the MFU as a
                              fraction (NAN when flops_per_step or peak_flops is not known) */
} progress_bar;

void progress_init(progress_bar *p, int log_every, long total_steps, long samples_per_step);
/* 1 when step `step` gets a progress line (this run's first step, at once, then every log_every
 * steps, and the last one): the trainer downloads its loss from the GPU only then. */
int progress_due(const progress_bar *p, long step);
/* After optimizer step `step` (1-based) of epoch `epoch`; loss: this rank's running mean loss. */
void progress_update(progress_bar *p, long step, int epoch, double loss);
/* Ends the live bar's line (no-op without a terminal). */
void progress_end(const progress_bar *p);

#endif /* COMMON_PROGRESS_H */
