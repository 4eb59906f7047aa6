/* ddp_straggler.h - the straggler table: which ranks are slow but alive, window by window.
 *
 * Part of libddp's public interface, installed beside ddp.h: programs that use it include it (it
 * includes ddp.h, whose types it uses).
 */
#ifndef DDP_STRAGGLER_H
#define DDP_STRAGGLER_H

#include "ddp.h"
#include "ddp_metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Per step and rank, the time the rank computed and the time it waited for its peers in
 * collectives. Every `every` steps (a window) the ranks' sums meet on rank 0 (one MPI_Gather of
 * five numbers per rank), which judges every rank over the last two windows (the span) and names
 * those judged slow `times` times in a row, with their node.
 *
 * A step runs from ddp_straggler_step_begin to ddp_straggler_step_end. Its wait is the time the
 * calling thread spent in the reducer's waits for communication (ddp_reducer_finish,
 * ddp_reducer_gather_wait and the bucket-owned reducer's waits for a buffer) and in
 * ddp_allreduce_host; its compute time is the rest. A slow rank makes the others wait for it:
 * its compute time grows and theirs does not. On the CUDA backend the host runs ahead of the
 * device, so there the step is timed with CUDA events recorded on libddp's stream by step_begin
 * and step_end, and the wait is the reducer's waits as that stream saw them (the events of
 * ddp_trace's "reducer.exposed"), read once complete (a step or two later, never waiting);
 * DDP_STRAGGLER_CLOCK=host times the CPU's clocks there too (device: the default).
 *
 * Judgement over the span: ratio = the rank's compute per step / the median of the other ranks';
 * on the CPU backend also share = the CPU time its process ran / the median of the others'
 * (every rank of a healthy job runs all the time: a waiting rank's communication thread polls
 * MPI). Slow: ratio > threshold, or share < cpu_share and at least 0.1 core under theirs (its
 * process was not let run: a noisy neighbour on its cores, a CPU quota, a stopped process;
 * whether its compute or its part of a collective lost the time). Named: slow at `times`
 * judgements in a row, so a rank the scheduler slows for a moment is not named; no longer named
 * at the first judgement that finds it not slow.
 * docs/reliability.md gives the measurements behind the defaults.
 * Cost: two clock reads per step and per wait; per window a gather and, on rank 0, a sort of the
 * ranks' figures.
 */
typedef struct ddp_straggler ddp_straggler;

typedef struct ddp_straggler_opts {
    int every;        /* steps per window (default DDP_STRAGGLER_EVERY); 0: off (create gives
                         NULL and DDP_OK, and every call below accepts NULL) */
    double threshold; /* compute over the others' median above which a rank is slow (default
                         DDP_STRAGGLER_THRESHOLD); > 1 */
    double cpu_share; /* CPU time under this fraction of the others' median is slow (default
                         DDP_STRAGGLER_CPU_SHARE); [0, 1), 0: not judged. CPU backend only. */
    int times;        /* judgements in a row before a rank is named (DDP_STRAGGLER_TIMES) */
    FILE *out;        /* rank 0's table lines and summary (default stdout); NULL: none */
    int json_fd;      /* rank 0 writes each window as one line {"straggler":ddp_straggler_json}
                         with one write(2) (a JSON-lines file; default -1: none) */
    ddp_metrics *metrics; /* rank 0 sets and commits at each window's end (default NULL: none)
                             straggler/median_compute_seconds, straggler/max_compute_ratio (the
                             slowest rank's over the span) and straggler/named_ranks */
} ddp_straggler_opts;

#define DDP_STRAGGLER_EVERY 5
#define DDP_STRAGGLER_THRESHOLD 1.5
#define DDP_STRAGGLER_CPU_SHARE 0.8
#define DDP_STRAGGLER_TIMES 3

/* Fills *opts with the defaults above. Never fails; NULL is ignored. */
DDP_API void ddp_straggler_opts_default(ddp_straggler_opts *opts);

/* Collective (a host all-reduce of the outcome and a gather of the ranks' node names). Begins
 * the first step. opts->every 0: *out is NULL and DDP_OK. DDP_ERR_INVALID_ARG (logged, naming
 * the field) for a NULL ctx, opts or out, every < 0, threshold <= 1 or not finite, cpu_share
 * outside [0, 1), times < 1 (before communicating); DDP_ERR_STATE when a table is already on in
 * this process; DDP_ERR_ENV for a DDP_STRAGGLER_CLOCK other than host or device; DDP_ERR_NOMEM,
 * DDP_ERR_CUDA, DDP_ERR_MPI; DDP_ERR_MISMATCH where another rank failed. *out is NULL on
 * failure, on every rank. */
DDP_API ddp_status ddp_straggler_create(ddp_ctx *ctx, const ddp_straggler_opts *opts,
                                        ddp_straggler **out);

/* A step begins now: its clock, its count of waits, its start event on CUDA (an error there is
 * logged and loses the step). Not collective; NULL is ignored. */
DDP_API void ddp_straggler_step_begin(ddp_straggler *s);
/* Ends step `step` (the program's count, 1-based, shown in the table) and begins the next one
 * (call step_begin again to leave out what comes between, e.g. an evaluation). Collective at the
 * end of each window (every opts.every calls): there rank 0 judges the ranks, prints the table
 * when the ranks named change (and every 10 windows while some are), and *window_closed (may be
 * NULL) is 1 on rank 0; else 0. DDP_ERR_MPI when the gather fails (the window is lost); a NULL s
 * is DDP_OK with 0. */
DDP_API ddp_status ddp_straggler_step_end(ddp_straggler *s, long step, int *window_closed);

/* The last window's figures as one JSON object on rank 0 ("" elsewhere, before the first window
 * or for a NULL s): {"step":S,"steps":N,"median_ms":M,"threshold":T,"compute_ms":[per rank],
 * "wait_ms":[per rank],"cpu_cores":[per rank],"named":[ranks]}: milliseconds per step of the
 * window, the cores its process kept busy, the ranks named now. Valid until the next call. */
DDP_API const char *ddp_straggler_json(const ddp_straggler *s);

/* The last judgement, for dashboards. */
typedef struct ddp_straggler_stats {
    long step;         /* the last window's last step; -1 before the first (or not rank 0) */
    double median_ms;  /* the ranks' median compute per step over that window */
    double max_ratio;  /* the highest compute over the others' median over the span (0: none) */
    int slowest_rank;  /* whose it is; -1 before the first judgement */
    int n_named;       /* ranks named now */
} ddp_straggler_stats;
/* Fills *out on rank 0 (elsewhere, and for a NULL s, step -1 and zeros). DDP_ERR_INVALID_ARG
 * for a NULL out. Not collective. */
DDP_API ddp_status ddp_straggler_get(const ddp_straggler *s, ddp_straggler_stats *out);

/* Collective: closes a window still open (the steps since the last one; *window_closed as for
 * ddp_straggler_step_end) and rank 0 prints the run's summary: the slowest rank and the ranks
 * ever named, with their node, how often, and their compute over the others' median for the
 * whole run. DDP_ERR_MPI as above; a NULL s is DDP_OK. */
DDP_API ddp_status ddp_straggler_finish(ddp_straggler *s, int *window_closed);

/* Frees it; not collective; NULL is ignored. The table is off in this process after it. */
DDP_API void ddp_straggler_destroy(ddp_straggler *s);

#ifdef __cplusplus
}
#endif

#endif /* DDP_STRAGGLER_H */
