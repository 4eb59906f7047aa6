/* ddp.h - the main public header of libddp, a data-parallel training runtime for C programs.
 *
 * A training program calls ddp_init() once, creates parameters with seeded initialisation
 * (identical on every rank), verifies the replicas, shards its data with a ddp_sampler, and
 * averages gradients with a ddp_reducer, which groups the parameters into buckets and starts a
 * bucket's all-reduce (with ZeRO, its reduce-scatter) as soon as the backward pass has marked
 * all of its gradients ready. With a flat gradient buffer (the parameters' layout) a bucket is
 * the runs of that buffer its parameters cover: one contiguous slice in reverse parameter order,
 * several runs once the buckets are rebuilt in ready order. With zero_stage 2 the reducer owns
 * the gradients instead: no flat buffer, each bucket's gradients in a pooled buffer of its own
 * while it is being written and reduced (ddp_reducer_grad_ptr), and only this rank's shard kept.
 *
 * Headers, installed side by side; each sub-header includes this one, so include those you use:
 *  - ddp.h: status codes, logging, the context and backend memory, collectives, parameters and
 *    seeded initialisation, replica checks, gradient norms, the sampler, shards, the reducer,
 *    the loss scaler and the start-up link check;
 *  - ddp_checkpoint.h: checkpoints (ddp_state: the training state, its file format, save and
 *    load) and checkpoint folders (ddp_ckpt_dir_*: a file per rank and a MANIFEST);
 *  - ddp_straggler.h: the straggler table (ddp_straggler_*: per-step compute and wait times,
 *    the ranks that stay slow named per window, with their node);
 *  - ddp_trace.h: timeline tracing (ddp_trace_*: spans and events per rank, one Chrome trace
 *    file, the communication figures);
 *  - ddp_metrics.h: named scalars for dashboards (ddp_metrics_*: a TensorBoard event file and a
 *    Prometheus text file).
 *
 * Conventions:
 *  - Every fallible function returns a ddp_status; DDP_OK (0) is success. ddp_strerror() names it.
 *    On failure the function logs the reason (with rank and host) and leaves its outputs untouched
 *    unless documented otherwise.
 *  - Library code never exits the process. When one rank fails, the program decides: ddp_abort()
 *    stops every rank of the job, so no peer is left waiting in a collective. The one exception is
 *    the watchdog started by ddp_init: a collective still blocked after DDP_TIMEOUT seconds
 *    (default 300), or a peer process that died, ends the whole job (MPI_Abort) with a message
 *    naming the collective and the ranks that never arrived, since MPI cannot cancel a blocked
 *    collective. DDP_WATCHDOG=0 turns it off (docs/reliability.md says more).
 *  - Counts are element counts (n_*), sizes are byte counts (*_bytes). Buffers passed to the
 *    collectives and the reducer live in the backend's memory: host memory for the CPU backend,
 *    device memory for the CUDA backend.
 *  - destroy/free functions accept NULL. Getters never fail, and the getters of a handle (ctx,
 *    sampler, reducer, scaler, state) accept NULL: 0, NULL or the value their comment gives.
 *
 * ABI: libddp is at version 0.x and makes no ABI or API promise from one 0.x version to another
 * (any signature, struct, enum value or macro may change), and the shared library's soname is
 * libddp.so.0 for every 0.x, so the loader does not catch a mismatch: build against the ddp.h of
 * the libddp you run with, and compare DDP_VERSION_NUMBER (the header compiled against) with
 * ddp_version_number() (the library loaded) at start-up if both may differ.
 */
#ifndef DDP_H
#define DDP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DDP_API __attribute__((visibility("default")))
#else
#define DDP_API
#endif

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0
#define DDP_VERSION_NUMBER (DDP_VERSION_MAJOR * 10000 + DDP_VERSION_MINOR * 100 + DDP_VERSION_PATCH)

/* Version of the library actually linked, e.g. "0.1.0": a static string. Never fails. */
DDP_API const char *ddp_version(void);
/* The same as a number, major * 10000 + minor * 100 + patch (100 for 0.1.0), to compare with
 * DDP_VERSION_NUMBER. Never fails. */
DDP_API int ddp_version_number(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. One X-macro table gives the enum and ddp_strerror().
 */
#define DDP_STATUS_LIST(X)                                                               \
    X(DDP_OK, "success")                                                                 \
    X(DDP_ERR_INVALID_ARG, "invalid argument")                                           \
    X(DDP_ERR_NOMEM, "out of memory")                                                    \
    X(DDP_ERR_IO, "input/output error")                                                  \
    X(DDP_ERR_FORMAT, "malformed or corrupt file")                                       \
    X(DDP_ERR_MISMATCH, "ranks or files disagree")                                       \
    X(DDP_ERR_MPI, "MPI call failed")                                                    \
    X(DDP_ERR_NCCL, "NCCL call failed")                                                  \
    X(DDP_ERR_CUDA, "CUDA call failed")                                                  \
    X(DDP_ERR_BLAS, "BLAS call failed")                                                  \
    X(DDP_ERR_UNSUPPORTED, "not supported by this build or backend")                     \
    X(DDP_ERR_NO_DEVICE, "no usable GPU")                                                \
    X(DDP_ERR_ENV, "invalid or inconsistent environment")                                \
    X(DDP_ERR_STATE, "call out of order")                                                \
    X(DDP_ERR_TIMEOUT, "a collective or wait passed its deadline (DDP_TIMEOUT)")

typedef enum ddp_status {
#define DDP_STATUS_ENUM_(name, text) name,
    DDP_STATUS_LIST(DDP_STATUS_ENUM_)
#undef DDP_STATUS_ENUM_
} ddp_status;

/* Static description of a status code; never NULL (unknown codes give "unknown status"). */
DDP_API const char *ddp_strerror(ddp_status s);

/* ---------------------------------------------------------------------------------------------
 * Logging: stderr, every line prefixed "[rank R host] ". The level is checked before the
 * arguments are evaluated. DDP_LOG_LEVEL=error|warn|info|debug sets the default (info).
 */
typedef enum ddp_log_level { DDP_LOG_ERROR, DDP_LOG_WARN, DDP_LOG_INFO, DDP_LOG_DEBUG } ddp_log_level;

/* The current level: DDP_LOG_LEVEL's at the first call (an unknown value warns once and gives
 * DDP_LOG_INFO), or the last ddp_log_set_level's. Never fails. */
DDP_API ddp_log_level ddp_log_get_level(void);
/* Sets the level for the whole process; a value outside DDP_LOG_ERROR..DDP_LOG_DEBUG is ignored. */
DDP_API void ddp_log_set_level(ddp_log_level level);
/* Writes one line to stderr with one write, prefixed "[rank R host] " (R is "-" before ddp_init),
 * and "file:line: " for errors and at the debug level (file may be NULL). Lines longer than about
 * 2 KiB are cut; a level above the current one writes nothing. only_rank0 != 0: only the process
 * whose rank is 0 (or whose rank is not known yet) writes it. Never fails; write errors are
 * ignored. */
DDP_API void ddp_log_write(ddp_log_level level, int only_rank0, const char *file, int line,
                           const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* The DDP_* macros' messages are for the person running the job (each names the problem and the
 * fix), so they carry the source location only at the debug level; the check macros (try.h), for
 * failures inside the runtime, pass theirs to ddp_log_write always. */
#define DDP_LOG_(lvl, r0, ...)                                                 \
    do {                                                                       \
        ddp_log_level lvl_ = ddp_log_get_level();                              \
        if ((lvl) <= lvl_)                                                     \
            ddp_log_write((lvl), (r0), lvl_ == DDP_LOG_DEBUG ? __FILE__ : NULL, \
                          __LINE__, __VA_ARGS__);                              \
    } while (0)
#define DDP_ERROR(...) DDP_LOG_(DDP_LOG_ERROR, 0, __VA_ARGS__)
#define DDP_WARN(...) DDP_LOG_(DDP_LOG_WARN, 0, __VA_ARGS__)
#define DDP_INFO(...) DDP_LOG_(DDP_LOG_INFO, 0, __VA_ARGS__)
#define DDP_DEBUG(...) DDP_LOG_(DDP_LOG_DEBUG, 0, __VA_ARGS__)
#define DDP_INFO0(...) DDP_LOG_(DDP_LOG_INFO, 1, __VA_ARGS__)
#define DDP_WARN0(...) DDP_LOG_(DDP_LOG_WARN, 1, __VA_ARGS__)

/* ---------------------------------------------------------------------------------------------
 * Context: process group, backend, communicator.
 */
typedef struct ddp_ctx ddp_ctx;

typedef enum ddp_backend_kind {
    DDP_BACKEND_AUTO = 0, /* CUDA when this build has it and a device is present, else CPU */
    DDP_BACKEND_CPU,
    DDP_BACKEND_CUDA
} ddp_backend_kind;

typedef struct ddp_init_opts {
    ddp_backend_kind backend; /* DDP_BACKEND_AUTO by default */
    int threads;              /* compute threads per rank the program uses (shown in the start-up
                                 report; libddp does no compute, the program sets its BLAS's
                                 threads); 0 = 1 */
    int print_table;          /* non-zero: rank 0 prints config and a per-rank table at start-up */
} ddp_init_opts;

/* Fills *opts with the defaults (auto backend, 1 thread, table printed). Never fails. */
DDP_API void ddp_init_opts_default(ddp_init_opts *opts);

/* Parses "cpu", "cuda" or "auto". Returns DDP_ERR_INVALID_ARG for anything else. */
DDP_API ddp_status ddp_backend_parse(const char *name, ddp_backend_kind *out);
/* "auto", "cpu" or "cuda"; "unknown" for any other value. Never NULL. */
DDP_API const char *ddp_backend_name(ddp_backend_kind kind);

/* Joins the job. Rank, world size, local rank, local world size and node rank come from MPI
 * (started by mpirun, srun --mpi=pmix, or ddp-launch) and are checked against what the
 * environment says (OMPI_COMM_WORLD_*, PMIX_RANK, SLURM_*, RANK/WORLD_SIZE); a disagreement is
 * DDP_ERR_ENV with a message naming both values. Without any launcher it runs as one process.
 * MPI is initialised with MPI_THREAD_MULTIPLE (the reducer communicates from its own thread).
 * For the CUDA backend local rank r uses visible device r (or device 0 when the rank sees exactly
 * one, as when Slurm narrowed CUDA_VISIBLE_DEVICES per task; ddp-launch never narrows it, so
 * NCCL can reach the peer GPUs over NVLink or PCIe); fewer GPUs than local ranks is
 * DDP_ERR_NO_DEVICE. The NCCL communicator is created from a unique id made by rank 0 and
 * broadcast over MPI.
 * Asking for DDP_BACKEND_CUDA where there is no GPU (or a build without CUDA) is
 * DDP_ERR_NO_DEVICE / DDP_ERR_UNSUPPORTED. On failure *out is NULL.
 * Collective: every rank must call it. */
DDP_API ddp_status ddp_init(const ddp_init_opts *opts, ddp_ctx **out);

/* Leaves the job and releases everything (the communicators, the device, and MPI when ddp_init
 * started it; MPI_Finalize runs under the watchdog's deadline). Collective. NULL is ignored.
 * Cannot fail: nothing is reported. */
DDP_API void ddp_finalize(ddp_ctx *ctx);

/* Stops every rank of the job with exit code `code` (MPI_Abort), after flushing stdout and stderr
 * and telling the watchdog's ring (which ends the peers even where MPI_Abort cannot reach them).
 * Use it when this rank failed and the others may be waiting for it. ctx may be NULL; without MPI
 * (or after MPI_Finalize) it exits this process with `code`. Never returns. */
DDP_API void ddp_abort(ddp_ctx *ctx, int code);
/* Where this process stands, for the watchdog's report when a collective passes its deadline
 * (the wavefront: each rank's step, phase and micro-step beside its collectives): step (the
 * program's count, e.g. the optimizer step in progress; -1 unknown), micro (-1: none) and phase,
 * a string that lives as long as the process (e.g. "forward", "backward", "optimizer",
 * "checkpoint", "validation"). Three relaxed atomic stores: call it as often as the phase changes,
 * from any thread, before or after ddp_init. */
DDP_API void ddp_watch_where(long step, int micro, const char *phase);

/* Getters of the job as ddp_init found it; they never fail. A NULL ctx answers as one process
 * alone: rank 0, world size 1, local rank 0, local world size 1, node rank 0, 1 node, hostname ""
 * (a context's hostname lives as long as the context), backend DDP_BACKEND_CPU, device -1. */
DDP_API int ddp_rank(const ddp_ctx *ctx);
DDP_API int ddp_world_size(const ddp_ctx *ctx);
DDP_API int ddp_local_rank(const ddp_ctx *ctx);
DDP_API int ddp_local_world_size(const ddp_ctx *ctx);
DDP_API int ddp_node_rank(const ddp_ctx *ctx);
DDP_API int ddp_num_nodes(const ddp_ctx *ctx);
DDP_API const char *ddp_hostname(const ddp_ctx *ctx);
DDP_API ddp_backend_kind ddp_backend(const ddp_ctx *ctx); /* CPU or CUDA, never AUTO */
DDP_API int ddp_device(const ddp_ctx *ctx);               /* CUDA device ordinal, -1 on CPU */
/* The CUDA stream (a cudaStream_t) that ddp_alloc, ddp_upload/ddp_download, the collectives and
 * the reducer order their work on: a program's compute kernels on this stream are ordered before
 * the collectives that read their results. NULL on the CPU backend. */
DDP_API void *ddp_backend_stream(const ddp_ctx *ctx);
/* Number of CUDA devices usable here: 0 without a GPU, a driver or a CUDA build. Never fails. */
DDP_API int ddp_cuda_device_count(void);

/* Backend memory: libddp is its one owner (a program's or a model's compute only reads and writes
 * it). On the CPU backend host memory (malloc/memcpy); on CUDA device memory, every transfer on
 * ddp_backend_stream(), and every host wait polling under the DDP_TIMEOUT deadline (see the
 * collectives below: past it the NCCL communicator is aborted). ctx NULL: host memory, as on the
 * CPU backend (for compute without a job, e.g. tests). The functions returning a status return
 * DDP_ERR_STATE for a context whose device did not open. */

/* n_bytes of zeroed memory, the zeroing COMPLETE when it returns (the host waited for it), so it
 * is ordered with every stream. NULL on failure (logged): out of memory, or the wait for the
 * zeroing failed (then the memory stays allocated, since freeing it would wait for the GPU). */
DDP_API void *ddp_alloc(ddp_ctx *ctx, size_t n_bytes);
/* Frees p after the work libddp has queued (which may read it), waiting under the deadline;
 * after a failed wait p is left allocated (logged). NULL is ignored. */
DDP_API void ddp_free(ddp_ctx *ctx, void *p);
/* Copies host memory into backend memory. On CUDA it goes through pinned staging on libddp's
 * stream and returns when src_host may be reused, usually before the copy is done (later libddp
 * work sees it). DDP_ERR_INVALID_ARG for a NULL buffer, DDP_ERR_CUDA, or DDP_ERR_TIMEOUT /
 * DDP_ERR_NCCL when waiting for a staging buffer failed. */
DDP_API ddp_status ddp_upload(ddp_ctx *ctx, void *dst, const void *src_host, size_t n_bytes);
/* Copies backend memory to the host after the work libddp has queued; dst_host holds the data
 * when it returns. Same failures as ddp_upload (DDP_ERR_TIMEOUT past the deadline). */
DDP_API ddp_status ddp_download(ddp_ctx *ctx, void *dst_host, const void *src, size_t n_bytes);
/* dst = src (backend memory, regions must not overlap on CUDA), queued on libddp's stream: no
 * host wait. DDP_ERR_INVALID_ARG for a NULL buffer, DDP_ERR_CUDA when the copy is refused. */
DDP_API ddp_status ddp_copy(ddp_ctx *ctx, void *dst, const void *src, size_t n_bytes);
/* dst[0..n_bytes) = 0 (backend memory), queued on libddp's stream: no host wait. Same failures
 * as ddp_copy. */
DDP_API ddp_status ddp_zero(ddp_ctx *ctx, void *dst, size_t n_bytes);
/* The backend's memory as its driver counts it: on CUDA, *used = the device's memory in use
 * (cudaMemGetInfo: total - free, so the CUDA context, the libraries' workspaces, NCCL's buffers
 * and other processes on the same GPU count too) and *total its size. DDP_ERR_UNSUPPORTED on the
 * CPU backend (host memory: read VmRSS/VmHWM in /proc/self/status), DDP_ERR_CUDA when the query
 * fails. Either pointer may be NULL. */
DDP_API ddp_status ddp_memory_info(ddp_ctx *ctx, size_t *used, size_t *total);
/* This process's peak resident host memory (VmHWM of /proc/self/status) in KiB; -1 when /proc
 * cannot tell. */
DDP_API long ddp_host_peak_rss_kib(void);
/* Marks the region a profiler records: start != 0 calls cudaProfilerStart, start == 0
 * cudaProfilerStop, so that `ncu --profile-from-start off` (or nsys's cudaProfilerApi capture
 * range) sees only the kernels launched in between, e.g. one steady training step (ddp-train's
 * DDP_PROFILE_STEP). No host wait. DDP_OK and nothing else on the CPU backend; DDP_ERR_STATE for
 * a NULL context, DDP_ERR_CUDA when CUDA refuses the call. */
DDP_API ddp_status ddp_profiler_range(ddp_ctx *ctx, int start);

/* Double-buffered staging of training batches: the upload of batch i+1 overlaps the compute of
 * batch i. Two slots (0, 1), each with backend buffers of the caller's, and up to two parts per
 * slot (0, 1: e.g. images and labels):
 *   ddp_stage_upload(ctx, s, part, dst, src, n)  copies src into the slot's pinned staging and
 *                    queues its upload on a copy stream, to start once the compute that last read
 *                    slot s is done; src may be reused at once. The host waits only while the
 *                    part's previous upload is still running (under the deadline).
 *   ddp_stage_acquire(ctx, s)  orders libddp's stream (the compute) after the slot's uploads.
 *   ddp_stage_release(ctx, s)  marks the work queued so far on libddp's stream as the slot's
 *                    last reader.
 * On the CPU backend the upload is a plain copy and the other two do nothing. Each returns
 * DDP_ERR_INVALID_ARG for a slot or part outside {0, 1} (or a NULL buffer), DDP_ERR_CUDA, or
 * DDP_ERR_TIMEOUT / DDP_ERR_NCCL when the wait for a staging buffer failed. */
DDP_API ddp_status ddp_stage_upload(ddp_ctx *ctx, int slot, int part, void *dst,
                                    const void *src_host, size_t n_bytes);
DDP_API ddp_status ddp_stage_acquire(ddp_ctx *ctx, int slot);
DDP_API ddp_status ddp_stage_release(ddp_ctx *ctx, int slot);

/* ---------------------------------------------------------------------------------------------
 * Collectives on backend memory (MPI on the CPU backend, NCCL on the CUDA backend).
 * Every rank must call them in the same order with the same counts. Arguments are checked on each
 * rank before it communicates: a rank that gets DDP_ERR_STATE or DDP_ERR_INVALID_ARG has not
 * joined the collective, and its peers wait for it until the job is stopped (ddp_abort, or the
 * watchdog after DDP_TIMEOUT). On the CPU backend a collective that passes its deadline ends the
 * job (the watchdog, unless DDP_WATCHDOG=0) instead of returning.
 * Desync check (DDP_DESYNC_CHECK=1, the default; 0 turns it off, on every rank alike): before each
 * collective on MPI (the CPU backend's, and ddp_allreduce_host everywhere) the ranks compare the
 * call (operation, count, element type, reduce op, root) with one extra all-reduce of 16 bytes;
 * when they differ it does not return: rank 0 logs the sequence number and the first two ranks
 * that differ, with their hosts and calls, and the job ends (MPI_Abort). NCCL's collectives are
 * not checked.
 *
 * Ordering on the CUDA backend: libddp queues its work (uploads, ops, collectives) on its own
 * non-blocking CUDA stream; a collective runs on NCCL's stream after everything queued before it
 * on libddp's stream, and libddp's stream waits for the collective once ddp_allreduce,
 * ddp_broadcast, ddp_allgather or ddp_wait returns. These functions return when the operation is
 * queued, NOT when its result is in memory. Later libddp work (ddp_download, the reducer, the
 * ops) sees the result. The caller's own CUDA work does not: a non-blocking stream is not ordered
 * with the legacy default stream, so a plain cudaMemcpy, a kernel on the caller's stream or a
 * host read of managed memory may see stale data. Order it with ddp_stream_after() (the caller's
 * stream waits for libddp), ddp_after_stream() (libddp waits for data the caller's stream
 * produces) or ddp_synchronize() (the host waits). ddp_barrier() also waits for the device.
 * Host waits poll under the deadline DDP_TIMEOUT (seconds, default 300): past it, or when NCCL
 * reports an asynchronous error (a peer died), the NCCL communicator is aborted and the call
 * returns DDP_ERR_TIMEOUT or DDP_ERR_NCCL (once the abort is done: NCCL's abort frees device
 * memory, which waits for local GPU work that is still running); every later collective then
 * fails with DDP_ERR_NCCL, and the program should stop the job with ddp_abort().
 */
/* DDP_MAX / DDP_MIN: elementwise maximum / minimum over ranks (flags: "did any rank overflow"). */
typedef enum ddp_reduce_op { DDP_SUM = 0, DDP_AVG, DDP_MAX, DDP_MIN } ddp_reduce_op;

/* Element types. Gradient buckets may be FP32, BF16 or FP16 (16-bit values are stored as their
 * IEEE / bfloat16 bit patterns); host all-reduces also take FP64 and INT64. */
typedef enum ddp_dtype { DDP_FP32 = 0, DDP_BF16, DDP_FP16, DDP_FP64, DDP_INT64 } ddp_dtype;

/* Bytes per element (4, 2, 2, 8, 8); 0 for an unknown type. */
DDP_API size_t ddp_dtype_size(ddp_dtype t);
/* "fp32", "bf16", "fp16", "fp64", "int64"; "unknown" otherwise. */
DDP_API const char *ddp_dtype_name(ddp_dtype t);
/* Parses "fp32", "bf16" or "fp16" (the gradient types). DDP_ERR_INVALID_ARG otherwise. */
DDP_API ddp_status ddp_dtype_parse(const char *name, ddp_dtype *out);

/* In-place all-reduce of n floats of backend memory (DDP_AVG divides the sum by the world size).
 * Collective. DDP_ERR_STATE without a context, DDP_ERR_INVALID_ARG for a NULL buf with n > 0 or an
 * unknown op; DDP_ERR_MPI on the CPU backend, DDP_ERR_NCCL or DDP_ERR_CUDA on CUDA. On failure buf
 * is undefined. */
DDP_API ddp_status ddp_allreduce(ddp_ctx *ctx, float *buf, size_t n, ddp_reduce_op op);

/* All-reduce of a small HOST buffer (flags, counters, losses) whatever the backend: no round trip
 * through device memory. dtype: DDP_FP64, DDP_INT64 or DDP_FP32; DDP_AVG of integers is
 * DDP_ERR_INVALID_ARG (use DDP_SUM and divide). Collective; same count and type on every rank.
 * On failure buf is undefined. */
DDP_API ddp_status ddp_allreduce_host(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                                      ddp_reduce_op op);

/* Collective on the host: every rank's failure (failed != 0) into flags[ddp_world_size(ctx)] (the
 * caller's array; the same on every rank after), *n_failed how many (may be NULL). Errors of
 * ddp_allreduce_host. ddp_log_failed_ranks(flags, world, what) logs them after what, e.g.
 * "WHAT: rank(s) 2, 5 failed (see their messages)" (the first 16), nothing when none did; it is the
 * caller's choice which rank logs (usually rank 0). */
DDP_API ddp_status ddp_agree_failed(ddp_ctx *ctx, int failed, int64_t *flags, int64_t *n_failed);
/* Collective: whether any rank failed. DDP_OK when none did; else every rank returns a failure,
 * its own `local` or DDP_ERR_MISMATCH where only peers failed, and those ranks log "N rank(s)
 * failed (see their messages); THEN" when then is not NULL. *collective: the status of the
 * agreement itself (a failed one returns it: end the job). */
DDP_API ddp_status ddp_agree(ddp_ctx *ctx, ddp_status local, const char *then,
                             ddp_status *collective);
DDP_API void ddp_log_failed_ranks(const int64_t *flags, int world, const char *what);

/* In-place all-reduce of n elements of dtype (any ddp_dtype; DDP_MAX/DDP_MIN not on bf16/fp16,
 * DDP_AVG not on int64) in backend memory, ordered on the caller's CUDA stream: the collective
 * runs after the work queued so far on `stream` (a cudaStream_t) and the work queued later on
 * `stream` sees its result; the host does not wait. libddp's own stream is NOT ordered after it
 * (ddp_after_stream(ctx, stream) does that). stream NULL: libddp's stream, as ddp_allreduce.
 * On the CPU backend (MPI, stream ignored) it returns with the result in buf; bf16 and fp16 are
 * summed as a chain of pairwise fp32 additions, each rounded back to 16 bits (nearest even), so a
 * sum of more than two ranks may differ from the exactly rounded sum by a few units in the last
 * place; NCCL rounds as it does. DDP_AVG divides the sum by the world size in the element type
 * (rounded once more). Collective; same count, type and op on every rank.
 * DDP_ERR_STATE without a context, DDP_ERR_INVALID_ARG for a NULL buf with n > 0, an unknown
 * type or op, or a refused pair (above); DDP_ERR_MPI on the CPU backend, DDP_ERR_NCCL or
 * DDP_ERR_CUDA on CUDA. On failure buf is undefined. */
DDP_API ddp_status ddp_allreduce_typed(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                                       ddp_reduce_op op, void *stream);

/* Reduce-scatter of backend memory: send holds world_size blocks of n elements (rank q's block at
 * q * n); rank r receives in recv (n elements, not overlapping send) the reduction over ranks of
 * block r. op DDP_SUM or DDP_AVG (divided by the world size in the element type), dtype DDP_FP32,
 * DDP_FP64, DDP_BF16 or DDP_FP16 (16-bit sums as ddp_allreduce_typed's). Ordered on `stream` as
 * ddp_allreduce_typed (CUDA: ncclReduceScatter; the host does not wait); on the CPU backend
 * (MPI_Reduce_scatter_block on the communication thread, after the reducer's queued work) it
 * returns with the result in recv. Same deadline, watchdog and trace ("reduce_scatter" span) as
 * the all-reduces; n must be at most INT_MAX on the CPU backend. Collective; same n, type and op
 * on every rank. DDP_ERR_STATE without a context, DDP_ERR_INVALID_ARG for a NULL buffer with
 * n > 0, another type or op; DDP_ERR_UNSUPPORTED for n over INT_MAX on MPI; DDP_ERR_NOMEM;
 * DDP_ERR_MPI, or DDP_ERR_NCCL / DDP_ERR_CUDA on CUDA. On failure recv is undefined. */
DDP_API ddp_status ddp_reduce_scatter(ddp_ctx *ctx, const void *send, void *recv, size_t n,
                                      ddp_dtype dtype, ddp_reduce_op op, void *stream);
/* All-gather of backend memory: every rank's n elements of send land in recv (world_size * n
 * elements) at rank * n; send == recv + rank * n is the in-place form. Any ddp_dtype (the bytes
 * are copied). Ordered and failing as ddp_reduce_scatter ("allgather" span; MPI_Allgatherv;
 * NCCL: ncclAllGather). Collective. On failure recv is undefined. */
DDP_API ddp_status ddp_allgather_typed(ddp_ctx *ctx, const void *send, void *recv, size_t n,
                                       ddp_dtype dtype, void *stream);

/* Counters of the communicator, for tests and reports. Payload bytes = elements x element size
 * of each all-reduce this rank joined (what one rank contributes; a ring moves about twice that
 * per rank). "Backend" counts ddp_allreduce, ddp_allreduce_start and the reducer's buckets;
 * "host" counts ddp_allreduce_host. Reduce-scatters (ddp_reduce_scatter and the sharded reducer's
 * buckets) and all-gathers (ddp_allgather_typed, ddp_reducer_gather_params) count the elements
 * of all blocks x element size (the size of the full buffer), in their own counters. */
typedef struct ddp_comm_stats {
    uint64_t allreduce_calls;
    uint64_t allreduce_bytes;
    uint64_t host_allreduce_calls;
    uint64_t host_allreduce_bytes;
    uint64_t reduce_scatter_calls;
    uint64_t reduce_scatter_bytes;
    uint64_t allgather_calls;
    uint64_t allgather_bytes;
} ddp_comm_stats;

/* Fills *out. DDP_ERR_INVALID_ARG when ctx or out is NULL. */
DDP_API ddp_status ddp_comm_stats_get(const ddp_ctx *ctx, ddp_comm_stats *out);
/* Copies n_bytes of backend memory at buf from rank `root` to every rank. Collective.
 * DDP_ERR_STATE without a context, DDP_ERR_INVALID_ARG for a NULL buf with n_bytes > 0 or a root
 * outside [0, world size); DDP_ERR_MPI, or DDP_ERR_NCCL / DDP_ERR_CUDA on CUDA. On failure buf is
 * undefined on every rank but root. */
DDP_API ddp_status ddp_broadcast(ddp_ctx *ctx, void *buf, size_t n_bytes, int root);
/* recv holds world_size blocks of n_bytes, rank r's block at r * n_bytes. Collective.
 * DDP_ERR_STATE without a context, DDP_ERR_INVALID_ARG for a NULL send or recv with n_bytes > 0;
 * DDP_ERR_MPI, or DDP_ERR_NCCL / DDP_ERR_CUDA on CUDA. On failure recv is undefined. */
DDP_API ddp_status ddp_allgather(ddp_ctx *ctx, const void *send, void *recv, size_t n_bytes);
/* Returns once every rank has called it; on the CUDA backend also once libddp's queued device work
 * is done (a one-float NCCL all-reduce the host waits for under DDP_TIMEOUT). Collective.
 * DDP_ERR_STATE without a context; DDP_ERR_MPI, or DDP_ERR_NCCL, DDP_ERR_CUDA or DDP_ERR_TIMEOUT
 * (the communicator is then aborted) on CUDA. */
DDP_API ddp_status ddp_barrier(ddp_ctx *ctx);

/* Non-blocking all-reduce. Operations start in call order, which must be the same on every
 * rank. *req is NULL on failure. ddp_wait completes the operation and frees the request.
 * ddp_allreduce_start: DDP_ERR_INVALID_ARG for a NULL req (nothing is written) and the failures of
 * ddp_allreduce, plus DDP_ERR_NOMEM for the request. ddp_wait: DDP_ERR_INVALID_ARG for a NULL
 * request, else the operation's status as ddp_allreduce returns it (buf undefined on failure);
 * the request is freed either way. On the CUDA backend ddp_wait orders libddp's stream after the
 * all-reduce and returns without waiting on the host (see the ordering above). */
typedef struct ddp_request ddp_request;
DDP_API ddp_status ddp_allreduce_start(ddp_ctx *ctx, float *buf, size_t n, ddp_reduce_op op,
                                       ddp_request **req);
DDP_API ddp_status ddp_wait(ddp_request *req);

/* Makes the work queued later on the caller's CUDA stream `stream` (a cudaStream_t; NULL is the
 * legacy default stream that plain cudaMemcpy uses) wait for everything libddp has queued so far.
 * Does not block the host. DDP_OK and nothing to do on the CPU backend; DDP_ERR_CUDA on failure,
 * DDP_ERR_STATE without a context. */
DDP_API ddp_status ddp_stream_after(ddp_ctx *ctx, void *stream);
/* Makes libddp's later work (uploads, ops, collectives) wait for everything queued so far on the
 * caller's CUDA stream `stream` (NULL: the legacy default stream), e.g. gradients a caller's
 * kernel writes before ddp_allreduce. Same returns as ddp_stream_after. */
DDP_API ddp_status ddp_after_stream(ddp_ctx *ctx, void *stream);
/* Blocks until everything libddp has queued on its stream is complete (staged batch uploads once
 * ddp_stage_acquire ordered them there), under the DDP_TIMEOUT deadline. DDP_ERR_TIMEOUT (the
 * communicator is then aborted), DDP_ERR_NCCL or DDP_ERR_CUDA on failure; DDP_OK at once on the
 * CPU backend. */
DDP_API ddp_status ddp_synchronize(ddp_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Parameters: a model describes each parameter tensor; values live in ONE flat buffer, parameter
 * i at offset sum(n of params before i), in this order.
 */
#define DDP_MAX_DIMS 4
#define DDP_NAME_MAX 48

typedef struct ddp_param_desc {
    char name[DDP_NAME_MAX]; /* e.g. "conv1.weight" */
    int n_dims;
    int64_t shape[DDP_MAX_DIMS];
} ddp_param_desc;

/* Product of the shape (number of elements): 1 for n_dims 0 (a scalar), 0 when a dimension is
 * <= 0; dimensions past n_dims or DDP_MAX_DIMS are ignored. d must not be NULL. Never fails. */
DDP_API size_t ddp_param_numel(const ddp_param_desc *d);

/* Seeded initialisation from a counter-based generator (Philox-4x32-10): element e of parameter p
 * depends only on (seed, p, e), never on rank, backend or thread count.
 * Fills host memory x[0..n) with values uniform in [lo, hi). Never fails (n = 0 writes nothing);
 * x must hold n floats. */
DDP_API void ddp_init_uniform(float *x, size_t n, uint64_t seed, uint32_t param_index, float lo,
                              float hi);
/* Same, normal with mean 0 and standard deviation std (Box-Muller). Never fails. */
DDP_API void ddp_init_normal(float *x, size_t n, uint64_t seed, uint32_t param_index, float std);

/* Checks that every rank holds the same model: the signature (parameter count, names, shapes)
 * and a checksum of every parameter's values (params_host: the flat buffer, in host memory).
 * On a mismatch every rank returns DDP_ERR_MISMATCH and the log names the ranks and the first
 * parameter that differ. Collective. Other failures: DDP_ERR_INVALID_ARG for a NULL ctx,
 * n_params < 0, or NULL descs / params_host with n_params > 0 (found locally: see the collectives'
 * note above); DDP_ERR_NOMEM on every rank when any rank lacks memory for the check;
 * DDP_ERR_MPI. */
DDP_API ddp_status ddp_verify_replicas(ddp_ctx *ctx, const ddp_param_desc *descs, int n_params,
                                       const float *params_host);

/* Global L2 norm of gradients, sqrt(sum of x[i]^2), for clipping by the norm.
 *
 * ddp_grad_sumsq: the sum of squares of n elements of dtype (DDP_FP32, DDP_BF16 or DDP_FP16) in
 * backend memory, accumulated in fp64 (every square is exact in fp64) in a fixed order that
 * depends only on n: equal gradients give bit-equal sums on every rank and every run. On the
 * CPU: 8 fp64 lanes (element i in lane i mod 8, vectorised), added pairwise at the end. On CUDA:
 * a kernel on `stream` (a cudaStream_t; NULL: libddp's stream) after the work queued there,
 * fp64 per thread, per block and across blocks in a fixed tree; the host waits once, for the
 * result, under the DDP_TIMEOUT deadline. Not collective. ctx NULL: host memory.
 * ddp_grad_norm: the norm, identical on every rank. scope DDP_NORM_REPLICATED: every rank holds
 * all the (averaged, identical) gradients: the local norm, no communication, not collective.
 * DDP_NORM_SHARDED: each rank holds a disjoint shard (ZeRO): each rank's sum of squares is
 * gathered (one host all-gather of one double per rank) and added in rank order on every rank,
 * then the square root: collective, every rank calls it (n may differ, may be 0).
 * Both: DDP_ERR_INVALID_ARG for a NULL output, a NULL grads with n > 0, another dtype, an
 * unknown scope, or DDP_NORM_SHARDED without a context; on CUDA DDP_ERR_CUDA, DDP_ERR_NOMEM (scratch), or DDP_ERR_TIMEOUT /
 * DDP_ERR_NCCL when the wait failed; DDP_ERR_MPI for the gather. inf/NaN gradients give an inf
 * or NaN result (not an error). On failure *out is untouched. */
typedef enum ddp_norm_scope { DDP_NORM_REPLICATED = 0, DDP_NORM_SHARDED } ddp_norm_scope;
DDP_API ddp_status ddp_grad_sumsq(ddp_ctx *ctx, const void *grads, ddp_dtype dtype, size_t n,
                                  void *stream, double *sumsq);
DDP_API ddp_status ddp_grad_norm(ddp_ctx *ctx, const void *grads, ddp_dtype dtype, size_t n,
                                 ddp_norm_scope scope, void *stream, double *norm);
/* Gradient clipping's factor where the gradients are, with no host wait (the replicated scope:
 * every rank holds all the gradients, as in plain data parallelism): *norm_out (backend memory,
 * one double) = ddp_grad_norm's replicated norm, bit for bit, and *scale_out (backend memory, one
 * float) = max_norm / (norm + 1e-6) where that is below 1, else 1 (max_norm <= 0: 1; a NaN norm:
 * 1 too, as the host comparison gives), computed in double and rounded once: the factor
 * clip_grad_norm_ puts on the gradients, for an optimizer step that reads it on the device. On
 * CUDA queued on `stream` (NULL: libddp's) after the work there; on the CPU computed at once.
 * Not collective. Errors as ddp_grad_sumsq, plus DDP_ERR_INVALID_ARG for a NULL norm_out or
 * scale_out; on CUDA nothing waits, so a failing kernel shows at the next wait. */
DDP_API ddp_status ddp_grad_clip_scale(ddp_ctx *ctx, const void *grads, ddp_dtype dtype,
                                       size_t n, double max_norm, void *stream, double *norm_out,
                                       float *scale_out);

/* Copies rank 0's parameters to every rank (params in backend memory, n elements). Collective.
 * Fails as ddp_broadcast of n * 4 bytes from rank 0; params are then undefined on the others. */
DDP_API ddp_status ddp_broadcast_params(ddp_ctx *ctx, float *params, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Distributed sampler, with the semantics of PyTorch's DistributedSampler: a permutation of
 * [0, n_samples) drawn from (seed, epoch) that does not depend on the world size (identity when
 * shuffle is 0); then either padded by repeating its start to a multiple of world_size
 * (drop_last = 0), or cut to a multiple of world_size (drop_last = 1); rank r takes positions
 * r, r + world_size, r + 2 * world_size, ...
 * Blocks (block > 0), for a step whose micro-batches the ranks share unevenly (an elastic run's
 * fixed global batch at a world size that does not divide it): the permutation is cut to whole
 * steps of blocks_per_step blocks of `block` positions (drop_last is ignored), and in each step
 * block v goes to rank v % world_size, so a rank holds ceil((blocks_per_step - rank) /
 * world_size) blocks of every step, laid out step by step. The samples of step s are the same
 * whatever the world size (positions [s * blocks_per_step * block, (s + 1) * ...)), as they are in
 * the strided layout when world_size divides the step.
 */
typedef struct ddp_sampler ddp_sampler;

typedef struct ddp_sampler_opts {
    size_t n_samples;
    int world_size;
    int rank;
    uint64_t seed;
    int shuffle;
    int drop_last;
    size_t block;        /* 0: the strided layout; else the blocks' positions (see above) */
    int blocks_per_step; /* with block: the step's blocks over all ranks, >= world_size */
} ddp_sampler_opts;

/* DDP_ERR_INVALID_ARG when rank is outside [0, world_size), n_samples is 0, drop_last leaves no
 * sample per rank, or blocks leave a rank without one or the data without a whole step. On
 * failure *out is NULL. */
DDP_API ddp_status ddp_sampler_create(const ddp_sampler_opts *opts, ddp_sampler **out);
/* NULL is ignored. */
DDP_API void ddp_sampler_destroy(ddp_sampler *s);
/* Number of indices this rank gets per epoch (the same on every rank, except with blocks that
 * the world size does not divide); 0 for a NULL sampler. */
DDP_API size_t ddp_sampler_len(const ddp_sampler *s);
/* Writes this rank's ddp_sampler_len() indices for `epoch` into out (room for that many).
 * DDP_ERR_INVALID_ARG when s or out is NULL (out untouched); nothing else fails. Not collective. */
DDP_API ddp_status ddp_sampler_indices(ddp_sampler *s, uint64_t epoch, size_t *out);

/* ---------------------------------------------------------------------------------------------
 * Gradient buckets, as the reducer plans them (ddp_reducer_buckets). Parameter i's gradient is
 * elements [offset_i, offset_i + n_i) of the flat layout (the parameters'). The buckets start in
 * reverse parameter order: bucket 0 holds the last parameters, and each is the contiguous slice
 * of the layout covering parameters [first_param, last_param] (first_param <= last_param), so no
 * copies are made. A bucket is closed when adding the next parameter would exceed its cap; the
 * first bucket's cap is ddp_reducer_opts.first_bucket_mb, the others' bucket_mb. A parameter
 * larger than the cap gets a bucket alone. (The reducer may rebuild its buckets in the order the
 * gradients become ready, or plan them in a given order; see below for what the fields mean then.)
 */
typedef struct ddp_bucket {
    int first_param; /* lowest parameter index in the bucket */
    int last_param;  /* highest parameter index in the bucket */
    size_t offset;   /* element offset of first_param's gradient in the flat layout */
    size_t n;        /* elements in the bucket (after a ready-order rebuild: of all its runs) */
} ddp_bucket;

/* ---------------------------------------------------------------------------------------------
 * Sharding plan (ZeRO): rank r of W owns elements [offset, offset + n) of the flat parameter
 * (and gradient) buffer of `total` elements. Every shard but the last non-empty one has
 * shard_size = ceil(total / W) rounded up to DDP_SHARD_ALIGN elements, and starts at
 * r * shard_size (256-byte aligned in fp32 when the buffer is); the buffer is padded, virtually,
 * to W * shard_size: the padding is never allocated nor communicated (the collectives take
 * per-rank counts), so the last ranks' shards are shorter, and empty (n 0, offset total) when
 * total is small (e.g. 100 elements on 3 ranks: 64, 36, 0).
 */
#define DDP_SHARD_ALIGN 64

/* Rank `rank`'s shard of `total` elements on `world_size` ranks: *offset and *n (either may be
 * NULL). DDP_ERR_INVALID_ARG (logged) unless world_size >= 1 and 0 <= rank < world_size; the
 * outputs are then untouched. */
DDP_API ddp_status ddp_shard_range(size_t total, int world_size, int rank, size_t *offset,
                                   size_t *n);
/* Collective, for saving a sharded state (ZeRO): every rank's shard (ddp_shard_range of `total`;
 * shard: this rank's, backend memory) into root_host (total floats of host memory on rank 0, NULL
 * on the others), in rounds of at most `chunk` floats per rank (0: 1 Mi) through one all-gather
 * each, so no rank holds more than world_size x chunk floats beyond its own. DDP_ERR_NOMEM, or the
 * first failure of a transfer (the peers may then wait: end the job). */
DDP_API ddp_status ddp_shard_gather(ddp_ctx *ctx, size_t total, const float *shard,
                                    float *root_host, size_t chunk);
/* Collective, for loading one (the reverse): the whole buffer root_host (total floats, rank 0's;
 * NULL on the others) broadcast in rounds of `chunk` floats (0: 4 Mi), each rank keeping elements
 * [offset, offset + n) in range (backend memory, element offset at range[0]). Errors as above. */
DDP_API ddp_status ddp_range_broadcast(ddp_ctx *ctx, size_t total, const float *root_host,
                                       size_t offset, size_t n, float *range, size_t chunk);
/* Collective: buf (total floats of backend memory on every rank) made whole from every rank's
 * shard (ddp_shard_range of total), each broadcast by its owner. Fails as ddp_broadcast. */
DDP_API ddp_status ddp_shard_allgather(ddp_ctx *ctx, size_t total, float *buf);

/* ---------------------------------------------------------------------------------------------
 * Reducer: averages gradients across ranks with bucketed asynchronous all-reduces that overlap
 * the backward pass (or reduce-scatters into each rank's shard: zero_stage below).
 *
 *   ddp_reducer_begin(r, sync);          before each backward (sync = 0 on accumulation steps)
 *   ... backward computes parameter i's gradient (adding to it), then
 *   ddp_reducer_mark_ready(r, i);        a bucket's all-reduce starts when its last param is ready
 *   ddp_reducer_finish(r);               waits for every bucket; gradients are then the mean
 *                                        over ranks and over the micro-steps since the last sync
 *
 * With sync = 0 nothing is communicated: gradients accumulate locally; finish() is not called
 * (bucket-owned gradients, ddp_reducer_grad_ptr, communicate in every micro-step).
 * On the sync step every parameter must be marked exactly once (an unmarked parameter is
 * DDP_ERR_STATE from finish, naming it). Buckets are launched in bucket order on every rank (a
 * complete bucket waits for the earlier ones), so any marking order gives the right sums; the
 * order decides only how much communication overlaps the backward pass.
 * Averaging: after finish, grads = sum over ranks and micro-steps / (world_size * micro-steps).
 *
 * Ready order: the buckets start in reverse parameter order (see ddp_bucket). The reducer
 * records the order in which parameters are marked in the first sync step; its finish() compares
 * the ranks' orders (one host all-gather, once) and, when they agree and differ from reverse
 * parameter order, rebuilds the buckets for the next steps as PyTorch does after its first
 * iteration: groups of parameters in that order, with the same caps, each bucket made of the
 * runs of the flat buffer its parameters cover (adjacent parameters merged). A layout that is
 * not in backward order, e.g. llm.c's tensor-major one (each layer's slice of each tensor a
 * parameter, marked layer by layer), then launches its first buckets while the backward pass is
 * in its last layers, without copying gradients (MPI: one all-reduce per run; NCCL: the runs in
 * one group; a 16-bit wire gathers the runs into the bucket's packed wire slice). Rank 0 logs
 * "reducer: buckets rebuilt in ready order: N buckets" (and the trace gets a "reducer.rebuilt"
 * instant). Ranks that marked in different orders keep parameter-order buckets (rank 0 warns,
 * naming the first rank and position that differ; with strict_order it is DDP_ERR_MISMATCH on
 * every rank). After a rebuild a bucket's first_param / last_param are its lowest / highest
 * parameter, offset its lowest element, n its element count: they no longer describe one slice;
 * ddp_reducer_bucket_params lists its parameters. Bucket-owned gradients (zero_stage 2 without a
 * gradient buffer, ddp_reducer_grad_ptr) plan their buckets in opts.ready_order from the start
 * and never rebuild them.
 *
 * The calls each zero_stage takes (opts.zero_stage below; stage 2 is exactly the bucket-owned
 * gradients, stages 0 and 1 exactly a gradient buffer). A call outside its stages is refused
 * with DDP_ERR_STATE (a pointer: NULL) and one logged error naming the call, the reducer's stage
 * and what to do instead; it changes nothing:
 *   every stage   create, destroy, begin, mark_ready, finish, n_buckets, buckets, bucket_params,
 *                 bucket_order, zero_stage, shard, buffer_bytes
 *   1 and 2       gather_start, gather_wait, gather_params (stage 0: every rank has every
 *                 parameter, there is nothing to gather)
 *   2             grad_ptr, shard_grads (stages 0 and 1: the gradients are in the caller's
 *                 buffer); opts.ready_order and opts.local_accum (create with a gradient buffer:
 *                 DDP_ERR_INVALID_ARG)
 */
typedef struct ddp_reducer ddp_reducer;

/* The default bucket caps in MiB (ddp_reducer_opts_default), PyTorch DDP's: for programs whose
 * own options default to the library's. */
#define DDP_BUCKET_MB_DEFAULT 25
#define DDP_FIRST_BUCKET_MB_DEFAULT 1

typedef struct ddp_reducer_opts {
    double bucket_mb;       /* cap of every bucket but the first, MiB (default 25) */
    double first_bucket_mb; /* cap of the first bucket, MiB (default 1) */
    /* Element type of the gradient buffer: DDP_FP32 (default), DDP_BF16 or DDP_FP16. Bucket caps
     * count 4 bytes per element whatever the type, so the buckets are the same for every type. */
    ddp_dtype grad_dtype;
    /* Type on the wire (PyTorch's bf16/fp16 compression hooks): DDP_FP32, DDP_BF16 or DDP_FP16;
     * default DDP_FP32, which for 16-bit gradients means "the gradients' own type". When it
     * differs from grad_dtype each bucket is cast into a reducer-owned buffer before its
     * all-reduce and cast back after: 16 bits halve the bytes of fp32 gradients. On a 16-bit
     * wire each rank's contribution is divided BEFORE the sum (as PyTorch's fp16 compression
     * hook), by the smallest power of two >= world_size x micro-steps (exact), so the sum is no
     * larger than the largest contribution and overflows only where a rank's own gradient does;
     * the sum is rounded to the wire type (MPI: summed in fp32 per pair of contributions,
     * rounded back; NCCL: its own reduction), cast back, and the division by world_size x
     * micro-steps completed in the gradients' type. fp16 has a small range: scale the loss with a
     * ddp_scaler so that an overflow is visible (inf, which the scaler detects and skips). */
    ddp_dtype comm_dtype;
    /* CUDA only: the caller's cudaStream_t (NULL: ddp_backend_stream()). Each bucket's cast and
     * all-reduce are ordered after the work queued on this stream when the bucket's last
     * parameter is marked ready; after ddp_reducer_finish the averaged gradients are ordered on
     * this same stream (later kernels on it see them; the host must synchronise the stream before
     * reading them), and libddp's stream waits for them too, so that libddp's later work (a
     * ddp_scaler, ddp_download) sees them. The stream must stay valid until the reducer is
     * destroyed. Ignored on CPU. */
    void *stream;
    int defer_launch;       /* non-zero: no overlap; every bucket is launched by finish(), after
                               the backward pass (default 0: launched as soon as it is ready);
                               bucket-owned gradients then keep every bucket's buffer alive */
    int static_buckets;     /* non-zero: never rebuild the buckets in ready order (no gather in
                               the first finish); must be the same on every rank (default 0) */
    int strict_order;       /* non-zero: ranks marking the first sync step in different orders
                               is DDP_ERR_MISMATCH from that finish() on every rank (the
                               gradients are averaged all the same); default 0: a warning */
    /* ZeRO (ddp_shard_range's shards of the flat buffer; default 0: all-reduce, every rank gets
     * every averaged gradient). Must be the same on every rank.
     * 1: each bucket is REDUCE-SCATTERED when it is ready (the same launch rule, overlap, casts,
     *    16-bit pre-division and ready-order rebuild as the all-reduce): its runs, packed in
     *    ascending offset, fall into the shards' pieces in rank order (the runs are cut at the
     *    shard boundaries), and rank q receives the sum of its piece. After finish the averaged
     *    gradient of this rank's shard is in the caller's gradient buffer at the shard's offsets,
     *    the same values as zero_stage 0 gives there (bit-identical at 2 ranks; at 3 or more the
     *    MPI reduction order of a reduce-scatter may differ from the all-reduce's by rounding);
     *    every element outside the shard is undefined (it holds this rank's local sum, maybe
     *    pre-divided). Clip with ddp_grad_norm(DDP_NORM_SHARDED) on the shard, unscale with
     *    ddp_scaler_unscale_update on the shard (its inf/NaN flag is agreed by all ranks), step
     *    the optimizer on the shard only (its state is shard-sized), then
     *    ddp_reducer_gather_params. A bucket of one run needs no copy in fp32; a bucket of
     *    several runs (after a ready-order rebuild) is packed into a reducer-owned buffer of the
     *    whole gradient size, allocated at its first use (the 16-bit wire buffer when there is
     *    one), and this rank's pieces are received into a buffer of the shard's size.
     * 2: as 1, but the reducer owns the gradients (grads must be NULL: DDP_ERR_INVALID_ARG
     *    otherwise, since a full gradient buffer beside the shard would save nothing over stage
     *    1): backward writes each parameter's gradient where ddp_reducer_grad_ptr says, and the
     *    averaged shard goes into a reducer-owned buffer of the shard's size
     *    (ddp_reducer_shard_grads, elements of grad_dtype, element i is the flat buffer's
     *    offset + i). */
    int zero_stage;
    /* Bucket-owned gradients only (grads NULL, zero_stage 2): the order in which the program
     * marks its parameters ready, a permutation of [0, n_params) (read during create, not kept);
     * the buckets are planned in it from the first step and never rebuilt. NULL: reverse
     * parameter order. Must be the same on every rank (create checks). Marking in another
     * order stays correct (every rank warns once) but holds bucket buffers longer. */
    const int *ready_order;
    /* Bucket-owned gradients only, with gradient accumulation (micro-steps begun with sync 0):
     * 0 (default): every micro-step is reduce-scattered and added into the shard, so only the
     *    few bucket buffers in flight are alive (the saving of stage 2), and the sums are ordered
     *    (a1 + b1) + (a2 + b2): a rounding away from stage 0's (a1 + a2) + (b1 + b2).
     * non-zero: micro-steps that are not sync steps communicate nothing; every bucket keeps its
     *    buffer and the next micro-steps add into it (PyTorch FSDP's no_sync), so the buffers of
     *    every bucket, the full gradient size, are alive from the first micro-step's backward
     *    pass to the sync step's reduce-scatters, and the sums are stage 0's (bit-identical at
     *    2 ranks). With one micro-step per optimizer step both are the same. */
    int local_accum;
    /* The step's micro-batches over all ranks, when the ranks accumulate different numbers of
     * them (an elastic run's fixed global batch at a world size that does not divide it): the
     * gradients are then scaled by 1 / micro_total (the mean over the global batch) instead of
     * 1 / (world_size x this rank's micro-steps), the same factor on every rank. 0 (default):
     * every rank does as many. Not with bucket-owned gradients that reduce every micro-step
     * (zero_stage 2 without local_accum: the ranks would issue different numbers of
     * reduce-scatters; DDP_ERR_INVALID_ARG). */
    int micro_total;
} ddp_reducer_opts;

/* What the reducer's buckets follow (ddp_reducer_bucket_order). */
typedef enum ddp_bucket_order {
    DDP_BUCKETS_PARAM_ORDER = 0, /* reverse parameter order: not rebuilt (yet, or not needed) */
    DDP_BUCKETS_READY_ORDER,     /* rebuilt in the order recorded in the first sync step */
    DDP_BUCKETS_MISMATCH         /* the ranks marked in different orders: parameter order kept */
} ddp_bucket_order;

/* Fills *opts with the defaults (25 MiB buckets, first 1 MiB, fp32 gradients and wire, overlap
 * on, ready-order rebuild on, order mismatch a warning).
 * Never fails; NULL is ignored. */
DDP_API void ddp_reducer_opts_default(ddp_reducer_opts *opts);

/* Every stage. grads: the flat gradient buffer in backend memory, elements of opts->grad_dtype
 * (kept, not owned), or NULL (and then only) with zero_stage 2 for bucket-owned gradients
 * (ddp_reducer_grad_ptr; create is then collective: one host all-reduce compares the ranks'
 * bucket plans and makes every rank fail when one failed); numel: element count of each of the
 * n_params parameters.
 * DDP_ERR_INVALID_ARG for an unknown or non-gradient dtype, a zero_stage outside 0..2, grads NULL
 * with another zero_stage than 2 or a buffer with zero_stage 2, a ready_order or a local_accum
 * with a gradient buffer, a ready_order that is not a permutation (all logged, naming the
 * option); DDP_ERR_NOMEM when the wire or shard buffers cannot be allocated;
 * DDP_ERR_MISMATCH (bucket-owned) when the ranks' plans differ or another rank failed. On
 * failure *out is NULL. */
DDP_API ddp_status ddp_reducer_create(ddp_ctx *ctx, void *grads, const size_t *numel, int n_params,
                                      const ddp_reducer_opts *opts, ddp_reducer **out);
/* Every stage. Waits for the reducer's outstanding all-reduces and gathers (under the
 * deadline), then frees it. NULL is ignored. */
DDP_API void ddp_reducer_destroy(ddp_reducer *r);
/* Every stage. Starts a micro-step; sync non-zero: the one whose gradients are communicated
 * (zero_stage 2 communicates in every micro-step: ddp_reducer_grad_ptr). With zero_stage
 * 1 or 2 it first waits for a parameter all-gather still under way (its failure is returned).
 * DDP_ERR_INVALID_ARG for a NULL reducer, DDP_ERR_STATE when the previous sync step was not
 * finished. */
DDP_API ddp_status ddp_reducer_begin(ddp_reducer *r, int sync);
/* Every stage. Parameter `param`'s gradient is final for this micro-step: on the sync step its
 * bucket starts its all-reduce once every parameter in it is marked. DDP_ERR_INVALID_ARG for a
 * NULL reducer or a parameter outside [0, n_params), DDP_ERR_STATE outside begin..finish or for a
 * second mark in one micro-step; a failed launch of an earlier bucket is returned here too (then
 * stop the job). */
DDP_API ddp_status ddp_reducer_mark_ready(ddp_reducer *r, int param);
/* zero_stage 2 only (bucket-owned gradients: created with grads NULL): there is no flat
 * gradient buffer. *ptr receives where the backward pass writes (and adds to) parameter `param`'s
 * gradient in this micro-step: numel[param] elements of grad_dtype inside its bucket's buffer,
 * which the bucket takes from the reducer's pool, zeroed, at its first grad_ptr of the
 * micro-step (with opts.local_accum: of the optimizer step) (the models' backward adds with
 * +=). A bucket's buffer holds its parameters in ascending index (its runs of the flat layout in
 * ascending offset, packed: the shards' pieces in rank order), and it is valid until the
 * parameter is marked ready: once every parameter of the bucket is, it is reduce-scattered in
 * place (in EVERY micro-step, sync or not, since no full buffer survives between micro-steps;
 * with opts.local_accum in the sync step only, the buffer kept until then), and once that is
 * waited for, this rank's piece is written (first reduce-scatter of the optimizer step) or added
 * (later ones) into ddp_reducer_shard_grads and the buffer returns to the pool. At most 2
 * reduce-scatters are under way: marking the parameter that launches a third waits for the
 * oldest (CUDA: the reducer's stream waits for it; the host does not), so the buffers alive are
 * a few buckets, plus those a backward pass holds open long (written first, marked last). A
 * program that writes and marks in the same order every step takes the same buffers: nothing is
 * allocated after its first step (ddp_reducer_buffer_bytes stops growing). The micro-step that
 * is not a sync step ends in the next ddp_reducer_begin (which launches and waits for what is
 * left, and returns DDP_ERR_STATE naming a parameter left unmarked); finish ends a sync step and
 * divides the shard by world_size x micro-steps. The summation order therefore differs from
 * stage 0's when micro-steps accumulate ((a1 + b1) + (a2 + b2) against (a1 + a2) + (b1 + b2), as
 * in DeepSpeed's stage 2): bit-identical with one micro-step at 2 ranks, a rounding apart with
 * several, unless opts.local_accum keeps every bucket's buffer until the sync step.
 * DDP_ERR_INVALID_ARG for a parameter outside [0, n_params), a NULL reducer or a NULL ptr;
 * DDP_ERR_STATE for a reducer with a gradient buffer (zero_stage 0 or 1: logged, naming the
 * stage; write into that buffer), outside begin..finish, or for a parameter already marked in
 * this micro-step; DDP_ERR_NOMEM when the pool cannot grow. On failure *ptr is NULL. */
DDP_API ddp_status ddp_reducer_grad_ptr(ddp_reducer *r, int param, void **ptr);
/* Every stage. Ends the sync step (see above); DDP_ERR_INVALID_ARG for a NULL reducer,
 * DDP_ERR_STATE when no sync step is in progress (begin(r, 1) first).
 * On failure (DDP_ERR_STATE for an unmarked parameter, or a failed all-reduce) the gradients are
 * undefined and the program should stop the job with ddp_abort(). An unmarked parameter does not
 * hang the peers: finish still starts every remaining bucket. The first finish() in which every
 * rank marked every parameter also settles the ready order (collective, see above; not with
 * static_buckets): DDP_ERR_MPI when its gather fails, DDP_ERR_MISMATCH (gradients averaged
 * correctly) when the orders differ and strict_order is set. */
DDP_API ddp_status ddp_reducer_finish(ddp_reducer *r);
/* Every stage, as are the getters down to ddp_reducer_buffer_bytes except shard_grads. The bucket
 * plan (read-only, valid until the next ddp_reducer_finish, which may rebuild it); 0 and NULL for
 * a NULL reducer. */
DDP_API int ddp_reducer_n_buckets(const ddp_reducer *r);
DDP_API const ddp_bucket *ddp_reducer_buckets(const ddp_reducer *r);
/* Bucket `bucket`'s parameters in the order they fill it (ready order, or reverse parameter
 * order): their count, and *params (may be NULL) pointing at them (read-only, valid as the
 * plan). 0 and *params NULL for a NULL reducer or a bucket outside [0, n_buckets). */
DDP_API int ddp_reducer_bucket_params(const ddp_reducer *r, int bucket, const int **params);
/* What the buckets follow now; DDP_BUCKETS_PARAM_ORDER for a NULL reducer. */
DDP_API ddp_bucket_order ddp_reducer_bucket_order(const ddp_reducer *r);
/* The reducer's zero_stage (0 for a NULL reducer), and this rank's shard of the flat buffer
 * (ddp_shard_range; zero_stage 0: the whole buffer, offset 0). Either output may be NULL. */
DDP_API int ddp_reducer_zero_stage(const ddp_reducer *r);
DDP_API void ddp_reducer_shard(const ddp_reducer *r, size_t *offset, size_t *n);
/* zero_stage 2 only: the reducer-owned averaged gradients of this rank's shard (n elements of
 * grad_dtype, backend memory, valid after each finish until the next begin). NULL for a NULL
 * reducer; NULL and a logged error (naming the stage) for zero_stage 0 or 1, whose averaged
 * gradients are in the caller's gradient buffer (stage 1: at ddp_reducer_shard's offset). */
DDP_API void *ddp_reducer_shard_grads(const ddp_reducer *r);
/* Bytes of backend memory the reducer owns now (the 16-bit wire or packing buffer, the ZeRO
 * receive buffer, stage 2's shard gradients and the bucket-owned gradients' bucket buffers), for
 * memory reports; 0 for a NULL reducer. The packing buffer is allocated at its first use and the
 * bucket buffers during the first step, so ask after a step. */
DDP_API size_t ddp_reducer_buffer_bytes(const ddp_reducer *r);
/* zero_stage 1 or 2 only, after the optimizer updated this rank's shard of `params` (the flat
 * parameter buffer, the gradients' layout, n_total elements of dtype, any ddp_dtype, backend
 * memory): every rank's shard is gathered in place, so that every rank holds identical full
 * parameters. Bucket by bucket, from the LAST bucket to the first (in ready order the last
 * bucket holds the first layers of the forward pass), ONE operation per bucket: the in-place
 * all-gather with per-rank counts of each run of the bucket (MPI: in turn on the communication
 * thread; NCCL: all in one group), one "allgather" trace span tagged with the bucket and one
 * call in ddp_comm_stats (CUDA: ordered on the reducer's stream). gather_start starts them all and returns (MPI: queued on the
 * communication thread); gather_wait(r, p) returns once parameter p's bucket (and every bucket
 * started before it) has arrived, so a forward pass can wait layer by layer; p = -1 waits for
 * all of them, and so do ddp_reducer_begin and ddp_reducer_destroy (so call begin after the
 * forward pass that waits layer by layer: it is only needed before the backward pass); with
 * nothing under way gather_wait returns DDP_OK at once. gather_params gathers the whole buffer
 * in ONE all-gather and waits for it: fewer calls when nothing is to overlap.
 * Collective. All three: DDP_ERR_STATE with zero_stage 0 (logged, naming the stage: every rank
 * already has every parameter, call none of them); gather_start and gather_params:
 * DDP_ERR_STATE inside a sync step (begin..finish) or while an earlier gather is not waited for;
 * DDP_ERR_INVALID_ARG for a NULL reducer or buffer, an unknown type or a parameter outside
 * [-1, n_params); then the collective failures of ddp_allgather_typed. On failure params is
 * undefined outside this rank's shard. */
DDP_API ddp_status ddp_reducer_gather_start(ddp_reducer *r, void *params, ddp_dtype dtype);
DDP_API ddp_status ddp_reducer_gather_wait(ddp_reducer *r, int param);
DDP_API ddp_status ddp_reducer_gather_params(ddp_reducer *r, void *params, ddp_dtype dtype);

/* ---------------------------------------------------------------------------------------------
 * Dynamic loss scaling with the semantics of torch.cuda.amp.GradScaler, for 16-bit training:
 *
 *   loss (or the loss gradient) *= ddp_scaler_scale(s);  backward;  reducer finish;
 *   ddp_scaler_unscale_update(s, grads, dtype, n, &step_ok);
 *   if (step_ok) optimizer step;            (skipped steps leave the weights untouched)
 *
 * unscale_update checks the averaged gradients for inf/NaN on EVERY rank and the ranks agree (a
 * one-integer MAX all-reduce on host memory), so all ranks skip the same steps and replicas stay
 * identical. On overflow: scale *= backoff_factor, the growth counter restarts, step_ok = 0 and
 * the gradients are left as they are. Otherwise: gradients *= 1 / scale, step_ok = 1, the counter
 * grows and after growth_interval such steps in a row scale *= growth_factor and the counter
 * restarts. Scale and counter are training state: save them in checkpoints (get/set_state).
 * Sharded gradients (ddp_reducer_opts.zero_stage): pass this rank's shard (grads + offset, n);
 * the agreed flag makes every rank skip when any rank's shard overflowed.
 * Streams (CUDA): the check and the unscaling run on opts.stream. Give it the stream the
 * gradients were finished on (the reducer's ddp_reducer_opts.stream) and every step is in order:
 * reducer, check, unscale, then the caller's optimizer kernels on that stream. With NULL they run
 * on libddp's stream, which ddp_reducer_finish also orders after the averaged gradients; a
 * caller's kernel on its own stream must then wait for the unscaling: ddp_stream_after().
 */
typedef struct ddp_scaler ddp_scaler;

typedef struct ddp_scaler_opts {
    double init_scale;       /* default 65536 (2^16) */
    double growth_factor;    /* default 2 */
    double backoff_factor;   /* default 0.5 */
    int64_t growth_interval; /* default 2000 */
    void *stream;            /* CUDA only: the cudaStream_t of the check and the unscaling, see
                                above (default NULL: ddp_backend_stream()); ignored on CPU */
} ddp_scaler_opts;

/* Fills *opts with torch.cuda.amp.GradScaler's defaults (below). Never fails; NULL is ignored. */
DDP_API void ddp_scaler_opts_default(ddp_scaler_opts *opts);
/* DDP_ERR_INVALID_ARG (naming the field) unless init_scale > 0 and finite, growth_factor > 1,
 * 0 < backoff_factor < 1, growth_interval >= 1. On failure *out is NULL. Not collective. */
DDP_API ddp_status ddp_scaler_create(ddp_ctx *ctx, const ddp_scaler_opts *opts, ddp_scaler **out);
/* Frees the scaler; NULL is ignored. */
DDP_API void ddp_scaler_destroy(ddp_scaler *s);
/* The current scale; 0 for a NULL scaler. */
DDP_API double ddp_scaler_scale(const ddp_scaler *s);
/* Checks, unscales and updates as described above. grads: n elements of dtype (DDP_FP32,
 * DDP_BF16 or DDP_FP16) in backend memory (on CUDA ordered on opts.stream; the call waits for
 * the check, the unscaling is queued). Collective. On failure *step_ok is 0 and the state is
 * unchanged. */
DDP_API ddp_status ddp_scaler_unscale_update(ddp_scaler *s, void *grads, ddp_dtype dtype, size_t n,
                                             int *step_ok);
/* Training state for checkpoints: the scale and the count of finite steps since the last change
 * (PyTorch's "_growth_tracker"). set_state: DDP_ERR_INVALID_ARG unless scale > 0 and finite and
 * 0 <= growth_tracker < growth_interval. */
DDP_API ddp_status ddp_scaler_get_state(const ddp_scaler *s, double *scale, int64_t *growth_tracker);
DDP_API ddp_status ddp_scaler_set_state(ddp_scaler *s, double scale, int64_t growth_tracker);
/* Steps skipped for inf/NaN since creation. */
DDP_API int64_t ddp_scaler_skipped_steps(const ddp_scaler *s);

/* ---------------------------------------------------------------------------------------------
 * Start-up link check: each rank's bandwidth and latency to its ring neighbours (rank - 1, rank + 1)
 * and to rank 0, by MPI ping-pong on host memory (runtime/linkcheck.c documents the schedule).
 * A node is named slow when the best of its inter-node links is under slow_ratio times the
 * median of all inter-node links (with one slow node, every link it takes part in is slow; its
 * neighbours still have a fast one). Two nodes cannot be told apart: nothing is named.
 */
typedef struct ddp_link_check_opts {
    size_t bw_bytes;   /* message size for bandwidth (default 4 MiB; larger than a shaper's burst) */
    int bw_reps;       /* round trips of bw_bytes, the fastest counts (default 3) */
    int lat_reps;      /* round trips of 8 bytes, the fastest counts (default 20) */
    double slow_ratio; /* default 0.5 */
    FILE *report;      /* rank 0 prints the table and the verdict here (default stdout); NULL: none */
} ddp_link_check_opts;

/* Fills *opts with the defaults above (4 MiB, 3, 20, 0.5, stdout). Never fails. */
DDP_API void ddp_link_check_opts_default(ddp_link_check_opts *opts);
/* Collective. On success *n_slow_nodes (every rank) is the number of nodes named slow. DDP_ERR_MPI,
 * DDP_ERR_NOMEM, DDP_ERR_INVALID_ARG (bw_bytes over INT_MAX or zero reps). */
DDP_API ddp_status ddp_link_check(ddp_ctx *ctx, const ddp_link_check_opts *opts, int *n_slow_nodes);

#ifdef __cplusplus
}
#endif

#endif /* DDP_H */
