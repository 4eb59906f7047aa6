/* train_report.h - what ddp-train prints and writes: progress, metrics
 * lines, the start-up link check (--link-check) and the timeline (--trace). */
#ifndef TRAIN_REPORT_H
#define TRAIN_REPORT_H

#include <stdio.h>

#include "jsonl.h"
#include "progress.h"
#include "train_opts.h"

/* Seconds on a monotonic clock. */
double train_now(void);

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

void metrics_epoch(jsonl_file *m, const epoch_stats *e);
void metrics_summary(jsonl_file *m, const train_opts *o, const run_stats *r);
/* The summary line's communication fields (",\"exposed_comm_ms\":..,\"comm_ms\":..,
 * \"hidden_fraction\":..,\"gather_wait_ms\":..,\"allgather_calls\":..,\"allgather_bytes\":.."; null
 * when not measured) in buf; returns buf. */
const char *metrics_comm(char *buf, size_t n, const run_stats *r);

/* Before training: the link check (o->link_check; a slow node is a warning, training goes on),
 * then tracing (o->trace_path). Collective; a failure is returned on every rank. */
ddp_status train_observe_start(ddp_ctx *ctx, const train_opts *o);
/* Fills r's communication figures (means over ranks, per synchronisation) from the trace; leaves
 * them at -1 when tracing is off. Collective. */
void train_comm_stats(ddp_ctx *ctx, run_stats *r);
/* After training: rank 0 writes the trace file (when tracing). Collective. */
ddp_status train_observe_end(ddp_ctx *ctx, const train_opts *o);

#endif /* TRAIN_REPORT_H */
