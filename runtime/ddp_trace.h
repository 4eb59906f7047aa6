/* ddp_trace.h - timeline tracing: per-rank spans and events, merged into one Chrome trace.
 *
 * Part of libddp's public interface, installed beside ddp.h: programs that use tracing include it
 * (it includes ddp.h, whose types it uses).
 */
#ifndef DDP_TRACE_H
#define DDP_TRACE_H

#include "ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Timeline tracing: named spans (begin/end) and instant events recorded per rank into a buffer
 * preallocated by ddp_trace_start(), with CLOCK_MONOTONIC timestamps (one clock per node; each
 * node's offset to rank 0's node is measured over MPI at start-up, from the round trip with the
 * smallest delay). ddp_trace_write() gathers every rank's events and rank 0 writes ONE Chrome
 * trace-event JSON file (opens in Perfetto or chrome://tracing): one process row per rank, one
 * thread row per recording thread (0: the thread that called ddp_trace_start, 1...: others, e.g.
 * the MPI communicator's thread). The reducer records, per bucket b (args.arg = b), the instant
 * "allreduce.queued" and the span "allreduce" (started..finished: on the MPI communicator's
 * thread; with NCCL, from when its stream reaches the all-reduce to when the kernel has finished,
 * recorded by host functions queued on that stream, on CUDA's callback thread), and the span
 * "reducer.wait" (the time finish() spent waiting for the all-reduces (with zero_stage 1 or 2
 * the spans are "reduce_scatter", and the parameters' gathers "allgather"): on the CPU the exposed
 * communication; on CUDA finish only queues the device's waits, so there the exposed
 * communication is measured on the device with CUDA events, from the moment the reducer's stream
 * has done the backward pass's work to the moment it has also waited for every all-reduce, and
 * recorded as the instant "reducer.exposed", args.arg = its nanoseconds, once the events have
 * completed: at a later finish() or at ddp_reducer_destroy(), so it appears after its step).
 * The other waits for communication are measured alike: under ZeRO the span
 * "reducer.gather_wait" (args.arg: the parameter waited for, -1 for all) where the forward pass
 * waits for the parameters' all-gather, and a bucket-owned reducer's (stage 2) span
 * "reducer.recycle_wait" (args.arg: the bucket) where the backward pass waits for an older
 * reduce-scatter to reuse its buffer; on CUDA also the instants "reducer.gather_exposed" and
 * "reducer.recycle_exposed" (nanoseconds of the stream's wait, from CUDA events).
 * Cost: while tracing is off every record call is one predictable branch; while on, one
 * clock_gettime and one atomic increment. Names are NOT copied when recorded: pass string
 * literals (or strings that live until ddp_trace_write). A full buffer drops further events and
 * counts them (the file and ddp_trace_get_stats report the count).
 */
/* Starts tracing on this rank with room for max_events events (0: 524,288, 16 MiB; about 40
 * events per ddp-train step), allocated and touched here so that recording takes no page faults.
 * Collective (it measures clock offsets over MPI). DDP_ERR_INVALID_ARG for a NULL ctx (before
 * communicating), DDP_ERR_STATE when tracing is already on, DDP_ERR_NOMEM (on every rank when any
 * rank lacks the memory), DDP_ERR_MPI; on failure tracing stays off on every rank. */
DDP_API ddp_status ddp_trace_start(ddp_ctx *ctx, size_t max_events);
/* Non-zero while tracing is on (between ddp_trace_start and ddp_trace_write). Never fails. */
DDP_API int ddp_trace_enabled(void);
/* Record the begin / end of span `name` (spans nest per thread), or an instant event. `arg` is
 * stored as args.arg (a layer, a bucket, a byte count; any value). No-ops while tracing is off.
 * They never fail and never block: a full buffer drops the event and counts it; a NULL name is
 * recorded as "?". Safe to call from any thread. A span is also an NVTX range on the calling
 * thread, tracing on or off (begin pushes it, end pops it: message name, int64 payload arg), for
 * Nsight Systems; not in a libddp built without NVTX's headers, nor under DDP_NVTX=0. */
DDP_API void ddp_trace_begin(const char *name, int64_t arg);
DDP_API void ddp_trace_end(const char *name, int64_t arg);
DDP_API void ddp_trace_instant(const char *name, int64_t arg);

/* This rank's communication figures from the events so far (tracing must be on). */
typedef struct ddp_trace_stats {
    long n_syncs;       /* "reducer.wait" spans: gradient synchronisations */
    double exposed_s;   /* communication the steps waited for, over n_exposed synchronisations:
                           on CUDA (or wherever there are some) the "reducer.exposed" and
                           "reducer.recycle_exposed" instants, on the CPU the time in
                           "reducer.wait" and "reducer.recycle_wait" (a bucket-owned reducer's
                           waits in the middle of the backward pass for an older reduce-scatter,
                           whose buffer the next bucket needs) */
    long n_exposed;     /* synchronisations exposed_s covers: n_syncs on the CPU; on CUDA those
                           whose events were read (the last one only at ddp_reducer_destroy), so
                           possibly 0 after one synchronisation */
    double comm_s;      /* total time of the "allreduce", "reduce_scatter" and "allgather"
                           spans (the buckets' collectives running) */
    double backward_s;  /* total time of "backward" spans */
    long n_dropped;     /* events lost to a full buffer */
    double gather_wait_s; /* ZeRO: the forward passes' waits for the parameters' all-gather
                             (ddp_reducer_gather_wait and the wait in ddp_reducer_begin): on the
                             CPU the "reducer.gather_wait" spans, on CUDA the
                             "reducer.gather_exposed" instants (the stream's wait, timed on the
                             device) */
    long n_gather_waits;  /* the waits gather_wait_s covers (on CUDA those whose events were
                             read) */
} ddp_trace_stats;
/* Fills *out with the events recorded so far. On CUDA the collectives' spans are recorded by host
 * functions on libddp's streams when the work runs there, so call ddp_synchronize(ctx) first to
 * count the work already queued (ddp_trace_write does so itself). DDP_ERR_STATE when tracing is
 * off or out is NULL (*out untouched). Not collective. */
DDP_API ddp_status ddp_trace_get_stats(ddp_trace_stats *out);

/* The run's communication as a step saw it, means over the ranks (milliseconds per gradient
 * synchronisation; -1 where not measured). */
typedef struct ddp_trace_summary {
    double exposed_comm_ms; /* time a synchronisation waited for its collectives (-1 on CUDA until
                               every rank has read events) */
    double comm_ms;         /* the collectives' running time, hidden or not */
    double hidden_fraction; /* 1 - exposed / comm, at least 0 (-1 with exposed_comm_ms) */
    double gather_wait_ms;  /* ZeRO: the forward passes' waits for the all-gather (-1: none) */
} ddp_trace_summary;
/* Collective: every rank's ddp_trace_get_stats, combined into means over the ranks on every rank
 * (one host all-reduce); rank 0 warns once when events were dropped. All -1 when tracing is off
 * (DDP_OK); DDP_ERR_MPI when the all-reduce fails (all -1). */
DDP_API ddp_status ddp_trace_summarize(ddp_ctx *ctx, ddp_trace_summary *out);

/* Stops tracing, gathers every rank's events to rank 0, which writes `path` (replaced atomically:
 * a temporary file, then rename). Collective; path is used on rank 0 only. Every rank returns the
 * same status: DDP_ERR_STATE when tracing was off, DDP_ERR_INVALID_ARG when path is not new or a
 * regular file (as ddp_state_save), DDP_ERR_IO when rank 0 cannot write the file, DDP_ERR_MPI,
 * DDP_ERR_NOMEM. The buffer is freed either way. */
DDP_API ddp_status ddp_trace_write(ddp_ctx *ctx, const char *path);


#ifdef __cplusplus
}
#endif

#endif /* DDP_TRACE_H */
