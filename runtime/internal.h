/* internal.h - declarations shared by libddp's own source files (never installed, never used by
 * programs: they use ddp.h; the models' compute is in models/ops/).
 */
#ifndef DDP_INTERNAL_H
#define DDP_INTERNAL_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "ddp.h"
#include "ddp_checkpoint.h" /* ddp_state, for the checkpoint helpers below */

/* ---- communication: one interface, two implementations (comm_mpi.c, comm_nccl.c) ---------- */

typedef struct comm_group comm_group;

typedef struct comm_ops {
    const char *name; /* "mpi" or "nccl" */
    /* dtype: any ddp_dtype the implementation supports (MPI: all; NCCL: all). */
    ddp_status (*allreduce)(comm_group *c, void *buf, size_t n, ddp_dtype dtype, ddp_reduce_op op);
    /* stream: CUDA only, the cudaStream_t the operation follows and its completion is ordered on
     * (NULL: the backend's stream); the MPI communicator ignores it. */
    ddp_status (*allreduce_start)(comm_group *c, void *buf, size_t n, ddp_dtype dtype,
                                  ddp_reduce_op op, void *stream, ddp_request **req);
    /* The same over n_runs runs of elements of one buffer: run i is base[off[i] .. off[i] +
     * len[i]) (element offsets), reduced as if each run were all-reduced alone. off and len must
     * stay valid until the request is waited for. MPI: one all-reduce per run, in order, on the
     * communication thread (Open MPI refuses MPI_SUM on a derived datatype, and per-run calls
     * cost about 1 us each over shared memory); NCCL: the runs inside one group. */
    ddp_status (*allreduce_runs_start)(comm_group *c, void *base, const size_t *off,
                                       const size_t *len, int n_runs, ddp_dtype dtype,
                                       ddp_reduce_op op, void *stream, ddp_request **req);
    /* Reduce-scatter with per-rank counts: send holds counts[0] + ... + counts[world - 1]
     * elements packed in rank order; rank q receives the reduction of its block (counts[q]
     * elements, possibly 0) in recv, which must not overlap send, except recv == send: in
     * place, the block then stays at its own offset of the packed buffer (MPI: MPI_IN_PLACE;
     * NCCL: its in-place form, recv at the block's offset). counts (world entries) is read
     * before the call returns. MPI: MPI_Reduce_scatter over chunks of 4 Mi
     * elements of the packed input (bounding Open MPI's temporaries), on the communication
     * thread; NCCL: ncclReduceScatter when equal, else one ncclReduce per rank inside a group.
     * DDP_AVG divides by the world size. */
    ddp_status (*reduce_scatter_start)(comm_group *c, const void *send, void *recv,
                                       const size_t *counts, ddp_dtype dtype, ddp_reduce_op op,
                                       void *stream, ddp_request **req);
    /* All-gather with per-rank counts: recv receives every rank's block packed in rank order
     * (rank q's counts[q] elements at the sum of the earlier counts); send == that place in recv
     * is the in-place form. MPI: MPI_Allgatherv on the communication thread; NCCL: ncclAllGather
     * when the counts are equal, else one ncclBroadcast per rank inside a group. */
    ddp_status (*allgatherv_start)(comm_group *c, const void *send, void *recv,
                                   const size_t *counts, ddp_dtype dtype, void *stream,
                                   ddp_request **req);
    /* The in-place all-gather(v) of n_runs runs of one buffer as ONE operation (the ZeRO gather
     * of a bucket): run i starts at element off[i] of base and holds the ranks' blocks
     * counts[i * world + q] packed in rank order, this rank's already at its place. off and
     * counts are read before the call returns. MPI: one MPI_Allgatherv per run, in order, on the
     * communication thread; NCCL: nccl_plan_allgatherv_runs's calls, inside one group. */
    ddp_status (*allgatherv_runs_start)(comm_group *c, void *base, const size_t *off, int n_runs,
                                        const size_t *counts, ddp_dtype dtype, void *stream,
                                        ddp_request **req);
    ddp_status (*wait)(ddp_request *req);
    ddp_status (*broadcast)(comm_group *c, void *buf, size_t n_bytes, int root);
    ddp_status (*allgather)(comm_group *c, const void *send, void *recv, size_t n_bytes);
    ddp_status (*barrier)(comm_group *c);
    void (*destroy)(comm_group *c);
} comm_ops;

struct comm_group {
    const comm_ops *ops;
    void *impl; /* implementation's state */
};

/* MPI over host memory. Non-blocking operations run in order on the communicator's own thread,
 * so they progress while the caller computes. */
ddp_status comm_mpi_create(comm_group **out);
/* NCCL over device memory, bootstrapped over MPI_COMM_WORLD (rank 0's unique id is broadcast).
 * DDP_ERR_UNSUPPORTED in a build without NCCL. */
ddp_status comm_nccl_create(int rank, int world_size, comm_group **out);

/* ---- CUDA: device probe and waits under the deadline (device.c, cuda_wait.c) ---------------- */

/* Number of CUDA devices usable here; when there are none because CUDA failed, `why` (may be NULL
 * when why_size is 0) says what cudaGetDeviceCount reported, else it is "". Never fails. */
int cuda_probe(char *why, size_t why_size);
/* PCI bus id ("0000:06:00.0") of `device`; DDP_ERR_CUDA (logged) on failure, or
 * DDP_ERR_UNSUPPORTED without a CUDA build. */
ddp_status cuda_bus_id(int device, char *out, int size);

/* What a wait polls besides its event: `check` returns DDP_OK while the communicator is healthy
 * (else the error, e.g. NCCL's asynchronous error, already logged); `on_timeout` aborts it. One
 * watch per process (the NCCL communicator's); NULL functions remove it. */
void cuda_set_watch(ddp_status (*check)(void *arg), void (*on_timeout)(void *arg), void *arg);
/* Waits until the cudaEvent_t `event` has completed, polling cudaEventQuery and the watch under
 * the deadline (timeout_seconds()) instead of blocking. DDP_ERR_TIMEOUT after the deadline
 * (the watch's on_timeout has then run), the watch's error, or DDP_ERR_CUDA; each logged with
 * `what`. */
ddp_status cuda_event_wait(void *event, const char *what);
/* The same for all work queued so far on the cudaStream_t `stream`. */
ddp_status cuda_stream_wait(void *stream, const char *what);
/* Makes the work queued later on cudaStream_t `then` wait for the work queued so far on `first`
 * (either may be NULL, the legacy default stream). DDP_ERR_CUDA on failure; DDP_ERR_UNSUPPORTED
 * without a CUDA build. Does not block the host. */
ddp_status cuda_join(void *first, void *then);

/* ---- bucket plans (buckets.c) ---------------------------------------------------------------- */

/* Plans buckets for n_params parameters of sizes numel[i] (elements of float) in reverse
 * parameter order, as ddp.h's ddp_bucket describes: each bucket one contiguous slice, the first
 * capped at first_cap_bytes, the others at cap_bytes. buckets must have room for n_params
 * entries; *n_buckets receives the count. DDP_ERR_INVALID_ARG on a zero cap, n_params < 1, or a
 * zero-sized parameter. (The tests' reference for the reducer's plans.) */
ddp_status ddp_plan_buckets(const size_t *numel, int n_params, size_t cap_bytes,
                            size_t first_cap_bytes, ddp_bucket *buckets, int *n_buckets);

/* The reducer's buckets: groups of parameters filled greedily in a given order (the order their
 * gradients become ready: reverse parameter order by default, or the order recorded in the
 * first sync step), capped as ddp_plan_buckets does. A bucket's elements are the runs of the
 * flat buffer its parameters cover, in ascending offset, adjacent parameters merged into one run;
 * in reverse parameter order every bucket is one run and the plan is ddp_plan_buckets'. */
typedef struct bucket_plan {
    int n_buckets;
    ddp_bucket *buckets;    /* public view: first/last_param the lowest/highest parameter index,
                               offset the first run's, n the elements of all runs */
    int *param_start;       /* n_buckets + 1: bucket b's parameters are
                               params[param_start[b] .. param_start[b + 1]) */
    int *params;            /* n_params, bucket by bucket, in the planning order */
    int *run_start;         /* n_buckets + 1: bucket b's runs are [run_start[b], run_start[b + 1]) */
    size_t *run_off;        /* element offset of each run in the flat buffer */
    size_t *run_len;        /* elements of each run */
    size_t *wire_off;       /* n_buckets: bucket b's runs packed from here in a wire buffer */
    int *param_bucket;      /* n_params: the bucket of each parameter */
} bucket_plan;

/* Plans buckets for n_params parameters of numel[i] elements, filled in `order` (a permutation of
 * [0, n_params); NULL: reverse parameter order). DDP_ERR_INVALID_ARG as ddp_plan_buckets, or for
 * an order that is not a permutation; DDP_ERR_NOMEM. On failure *plan is empty (freeable). */
ddp_status bucket_plan_build(const size_t *numel, int n_params, const int *order,
                             size_t cap_bytes, size_t first_cap_bytes, bucket_plan *plan);
/* Frees the plan's arrays and empties it; an empty plan is ignored. */
void bucket_plan_free(bucket_plan *plan);
/* 1 when both plans have the same buckets made of the same runs, else 0. */
int bucket_plan_same(const bucket_plan *a, const bucket_plan *b);

/* ---- the bucket buffers of a reducer that owns the gradients (grad_pool.c) ------------------ */

/* With zero_stage 2 and no flat gradient buffer the reducer keeps each bucket's gradients in a
 * buffer of the pool while the bucket is alive: taken at the first write of the micro-step,
 * given back once its reduce-scatter has been waited for. */
typedef struct grad_pool grad_pool;

/* A pool for n_buckets buckets; a new buffer for bucket b holds alloc_n[b] elements (copied; at
 * least the bucket's) of grad_t, and as many of wire_t beside them when the types differ.
 * DDP_ERR_NOMEM (logged); *out NULL then. */
ddp_status grad_pool_create(ddp_ctx *ctx, int n_buckets, const size_t *alloc_n, ddp_dtype grad_t,
                            ddp_dtype wire_t, grad_pool **out);
/* Frees every buffer (ddp_free: after libddp's queued work); NULL is ignored. */
void grad_pool_destroy(grad_pool *p);
/* Bucket b's buffers, of at least n elements: the ones it holds, else free ones it now takes (its
 * buffer of last time when free, else the smallest that fits, else a new one); *fresh = 1 when
 * taken now (their contents are then undefined). *wire is NULL when the types are the same.
 * DDP_ERR_NOMEM (logged) when a new buffer cannot be allocated. */
ddp_status grad_pool_take(grad_pool *p, int b, size_t n, void **grads, void **wire, int *fresh);
/* Bucket b's buffers are free again (nothing when it holds none). */
void grad_pool_give_back(grad_pool *p, int b);
/* Bytes of backend memory the pool's buffers take; 0 for NULL. */
size_t grad_pool_bytes(const grad_pool *p);

/* ---- the context --------------------------------------------------------------------------- */

struct ddp_ctx {
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank, n_nodes;
    char hostname[256];
    ddp_backend_kind backend; /* CPU or CUDA */
    int device;               /* CUDA ordinal or -1 */
    int threads;
    const device_ops *dev; /* backend memory: host or CUDA device */
    comm_group *comm;      /* collectives on backend memory */
    comm_group *host_comm; /* collectives on host memory (MPI); equals comm on the CPU backend */
    int owns_mpi;        /* this context initialised MPI and finalises it */
    double init_begin, init_end; /* wall clock (s since the epoch): ddp_init's start and end */
    /* ddp_comm_stats counters, updated with atomic builtins (the reducer may start all-reduces
     * from any thread; plain types because the CUDA sources, C++, include this header too) */
    uint64_t allreduce_calls, allreduce_bytes;
    uint64_t host_allreduce_calls, host_allreduce_bytes;
    uint64_t reduce_scatter_calls, reduce_scatter_bytes;
    uint64_t allgather_calls, allgather_bytes;
};

/* The typed non-blocking all-reduce behind ddp_allreduce_start and the reducer: checks, counts
 * the payload in the stats, dispatches to ctx->comm. *req is NULL on failure. */
ddp_status allreduce_start_typed(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                                 ddp_reduce_op op, void *stream, ddp_request **req);

/* allreduce_start_typed over runs of one buffer (comm_ops.allreduce_runs_start); counts one
 * call of the runs' total payload. */
ddp_status allreduce_runs_start(ddp_ctx *ctx, void *base, const size_t *off, const size_t *len,
                                int n_runs, ddp_dtype dtype, ddp_reduce_op op, void *stream,
                                ddp_request **req);

/* comm_ops.reduce_scatter_start / allgatherv_start with checks and stats (comm.c); the trace
 * span carries trace_current_tag() as the all-reduce's does. *req is NULL on failure. */
ddp_status reduce_scatter_start(ddp_ctx *ctx, const void *send, void *recv, const size_t *counts,
                                ddp_dtype dtype, ddp_reduce_op op, void *stream, ddp_request **req);
ddp_status allgatherv_start(ddp_ctx *ctx, const void *send, void *recv, const size_t *counts,
                            ddp_dtype dtype, void *stream, ddp_request **req);
/* comm_ops.allgatherv_runs_start with checks and stats: counts one all-gather call of the runs'
 * total payload. */
ddp_status allgatherv_runs_start(ddp_ctx *ctx, void *base, const size_t *off, int n_runs,
                                 const size_t *counts, ddp_dtype dtype, void *stream,
                                 ddp_request **req);

/* Host-memory collectives used by the runtime itself (verification, checksums, broadcasts of
 * control data), whatever the backend. */
ddp_status host_allgather(ddp_ctx *ctx, const void *send, void *recv, size_t n_bytes);
ddp_status host_broadcast(ddp_ctx *ctx, void *buf, size_t n_bytes, int root);

/* Sets the rank shown in log prefixes (-1 before ddp_init knows it) and the host name. */
void log_set_identity(int rank, const char *hostname);

/* straggler.c: while a straggler table is on (straggler_on() != 0), the calling thread's
 * blocking waits for communication are counted: begin returns a timestamp (0 when off), end adds
 * the time since it; on CUDA the reducer adds its stream's waits (ns, timed by CUDA events) with
 * straggler_device_wait. */
int straggler_on(void);
int64_t straggler_wait_begin(void);
void straggler_wait_end(int64_t begin);
void straggler_device_wait(int64_t ns);

/* ---- the watchdog (watchdog.c): deadlines on collectives, dead-rank detection ------------- */

/* The deadline of every collective and wait, in seconds: DDP_TIMEOUT from the environment, 300
 * when unset or invalid (an invalid value is timeout_check's to report). */
double timeout_seconds(void);
/* DDP_OK when DDP_TIMEOUT is unset or a number of seconds from 0.1 to 604800; else DDP_ERR_ENV,
 * logged with the variable, its value and the allowed range. ddp_init fails with it on every rank
 * (watchdog_connect), so no program runs with a deadline it did not ask for. */
ddp_status timeout_check(void);

/* Lanes: collectives of the caller's thread, the communication thread's queued all-reduces (both
 * host lanes: watch_enter/leave), and the collectives queued on the GPU stream (watch_stream_*). */
enum { DDP_WATCH_CALLER, DDP_WATCH_ASYNC, DDP_WATCH_GPU, DDP_WATCH_N_LANES };

/* Around every collective: enter marks collective `what` (a string literal) of n_bytes, for
 * bucket (or -1), as active on the lane and returns its sequence number; leave marks it done.
 * A few atomic stores each; no-ops before watchdog_start, and with DDP_WATCHDOG=0 and
 * DDP_DESYNC_CHECK=0 (with the check on the lanes still count, for its messages, but nothing
 * watches them). One thread per lane. */
uint64_t watch_enter(int lane, const char *what, int bucket, size_t n_bytes);
void watch_leave(int lane);

/* The GPU stream's lane. A collective queued on a device stream returns at once and completes
 * later, in queue order, so the lane is read when the watchdog is asked: the oldest queued
 * collective whose marker (a CUDA event recorded right after it) has not completed, active, else
 * the last one, finished. Each collective's label sits in one of WATCH_STREAM_SLOTS slots, the
 * marker of sequence number seq in slot seq % WATCH_STREAM_SLOTS; with more collectives queued
 * than slots the lane names the oldest it holds, labelled "ring full: or earlier".
 * watch_stream_open registers done(arg, slot): 1 when slot's marker has completed, else 0; it
 * must not block, and runs on the watchdog's threads and on watchdog_survey's caller. Returns 1,
 * or 0 (nothing registered) when the watchdog is off: then the markers are not worth recording.
 * watch_stream_close unregisters it, after a query in progress has ended. One stream at a time. */
#define WATCH_STREAM_SLOTS 256
int watch_stream_open(int (*done)(void *arg, int slot), void *arg);
void watch_stream_close(void);
/* Queueing a collective: begin takes the next sequence number and labels its slot (what: a string
 * literal; bucket or -1); the caller records the slot's marker after the collective, then calls
 * queued(seq). Without queued (a failed record) the number is taken again by the next begin.
 * A few atomic stores each; one thread at a time (the communicator's lock). */
uint64_t watch_stream_begin(const char *what, int bucket, size_t n_bytes);
void watch_stream_queued(uint64_t seq);

/* Starts the watchdog thread (before MPI_Init, so start-up is under the deadline too); a lane
 * active longer than timeout_seconds() ends the job (MPI_Abort) after naming the collective.
 * DDP_WATCHDOG=0 leaves it off. Only fails softly: a warning, and no deadlines. */
ddp_status watchdog_start(void);
/* Collective, after MPI_Init: tells the watchdog this rank, exchanges side-channel addresses and
 * builds the ring of TCP connections that detects dead ranks. A ring that cannot be built
 * everywhere is left off with a warning (DDP_OK); DDP_ERR_MPI when the exchange itself failed;
 * DDP_ERR_ENV on every rank when DDP_TIMEOUT is invalid on any (timeout_check; also with
 * DDP_WATCHDOG=0 and in a job of one rank). */
ddp_status watchdog_connect(int rank, int world, const char *hostname);
/* Says goodbye on the ring and closes the side channel (deadlines stay). */
void watchdog_disconnect(void);
/* Tells the ring that this rank is ending the job (before MPI_Abort in ddp_abort). */
void watchdog_announce_abort(void);
/* rescue.c: the watchdog ends the job (cause: why, for the next generation's log): a rescue copy
 * of the last step, if armed. */
void rescue_on_end(const char *cause);
/* After a host wait on GPU work passed the deadline: asks the peers where they are. When this rank's
 * GPU stream lane has a collective not complete, logs the wavefront on that lane, as a host lane's
 * deadline does; else the ranks gone, unreachable or frozen (by rank, host and pid). */
void watchdog_survey(void);
/* Disconnects and stops the thread. */
void watchdog_stop(void);

/* ---- NCCL's RAS service in the watchdog's report (nccl_ras.c) -------------------------------- */

/* Asks the NCCL RAS service at host:port (numeric port) for its STATUS text: the handshake
 * ("CLIENT PROTOCOL 2"), "TIMEOUT s" (RAS's own wait for the other processes: half of timeout_s,
 * at least 1 s) and "STATUS", the whole exchange within timeout_s (connecting within 1 s of it).
 * Returns the bytes of the answer in buf (NUL-terminated; n >= 2), with why[0] == '\0' when it
 * came whole, else why says how it was cut short (the deadline, the buffer's end) or that it was
 * empty; -1 when no answer came, why saying what failed (the address does not resolve, the
 * connection was refused or timed out, an answer that is not RAS's). Blocks at most timeout_s
 * plus the name lookup of host. Thread-safe. */
long ras_query(const char *host, const char *port, double timeout_s, char *buf, size_t n,
               char *why, size_t why_n);
/* comm_nccl.c: an NCCL communicator is open (nccl_version: ncclGetVersion's code), or closed (0):
 * only then does the watchdog's report ask RAS. */
void ras_use_nccl(int nccl_version);
/* The watchdog's report: begins asking RAS (NCCL_RAS_ADDR, default localhost:28028; at most 3 s)
 * on a thread of its own, then waits for it and logs its view: at most 60 lines, each prefixed
 * "NCCL RAS | ", or one line saying why it could not be had (no service: NCCL before 2.24,
 * NCCL_RAS_ENABLE=0, a bad NCCL_RAS_ADDR, no answer). Nothing without an open NCCL communicator
 * or under DDP_NCCL_RAS=0. One query at a time (the watchdog's lock). ras_report = both. */
void ras_ask_start(void);
void ras_ask_log(void);
void ras_report(void);

/* trace.c: the tag (a bucket index; -1: none) of the all-reduces the calling thread starts next.
 * The MPI communicator keeps it in the request, and its thread records the "allreduce" span with
 * it as args.arg. */
void trace_set_tag(int64_t tag);
int64_t trace_current_tag(void);
/* trace.c: an NVTX range on the calling thread, message name (kept, not copied: a literal),
 * payload arg; and the end of the thread's innermost one. No-ops under DDP_NVTX=0 and in a build
 * without NVTX (HAVE_NVTX 0). ddp_trace_begin/end call them around their spans. */
void nvtx_range_push(const char *name, int64_t arg);
void nvtx_range_pop(void);
/* trace.c: ddp_trace_begin/end without the NVTX range: for the NCCL collectives' spans, which
 * CUDA's host-function thread records while tracing is on (their NVTX range is the issuer's). */
void trace_span_begin(const char *name, int64_t arg);
void trace_span_end(const char *name, int64_t arg);

/* checkpoint.c: where an atomic save (temporary file renamed over the target) of `path` goes.
 * DDP_OK with *out (malloc'ed) the file to replace: path itself when it does not exist or is a
 * regular file, the resolved target when path is a symbolic link to a regular file (the link is
 * kept). DDP_ERR_INVALID_ARG, logged with `what` (e.g. "checkpoint") and the path, when it is or
 * points to a folder, a device, a FIFO or a socket, or is a dangling or looping link; DDP_ERR_IO
 * when it cannot be examined; *out is NULL then. Used by checkpoints and the trace file. */
ddp_status output_target(const char *what, const char *path, char **out);

/* CRC-32 (zlib) of a buffer, used by checksums and checkpoints. */
uint32_t ckpt_crc32(const void *data, size_t n_bytes);

/* checkpoint.c: fsync of a folder (so a rename in it survives a crash); DDP_ERR_IO, logged, errno
 * kept, on failure. */
ddp_status ckpt_fsync_dir(const char *dir);
/* checkpoint_manager.c: the step of a name "step-<12 digits><suffix>" (e.g. ".ckpt"), else -1;
 * a qsort order of longs, the largest first. */
long ckpt_name_step(const char *name, const char *suffix);
int ckpt_newest_first(const void *a, const void *b);

/* checkpoint.c, for checkpoint folders (checkpoint_dir.c): a state with the signature and a
 * "params" entry of numel values that are not held (NULL data); NULL when out of memory. Such a
 * state answers every getter (ddp_state_f32 returns NULL with the count) and is refused by
 * ddp_state_save. ckpt_state_add_count adds a float entry of count values without values. */
ddp_state *ckpt_state_meta(const ddp_param_desc *descs, int n_params, uint64_t numel);
ddp_status ckpt_state_add_count(ddp_state *s, const char *name, uint64_t count);

/* checkpoint_dir.c: 1 when name is a file a folder save writes (MANIFEST, rank-RRRRR-of-WWWWW.ckpt,
 * or either's temporary NAME.tmp.PID), else 0. */
int ckpt_dir_own_name(const char *name);
/* Removes from the open folder d (path dir, for messages) the regular files a folder save writes,
 * the MANIFEST first; never follows a link and leaves every other entry where it is. Returns the
 * number of entries left in place (not ddp's, or not removable: each logged as a warning once
 * the first few are named), or -1 when the MANIFEST cannot be removed (errno kept). */
int ckpt_dir_remove_own(DIR *d, const char *dir);

#endif /* DDP_INTERNAL_H */
