/* ddp.h - the one public header of libddp, a data-parallel training runtime for C programs.
 *
 * A training program calls ddp_init() once, creates parameters with seeded initialisation
 * (identical on every rank), verifies the replicas, shards its data with a ddp_sampler, and
 * averages gradients with a ddp_reducer whose buckets are slices of ONE flat gradient buffer.
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
 *    collective. DDP_WATCHDOG=0 turns it off (the README says more).
 *  - Counts are element counts (n_*), sizes are byte counts (*_bytes). Buffers passed to the
 *    collectives and the reducer live in the backend's memory: host memory for the CPU backend,
 *    device memory for the CUDA backend.
 *  - destroy/free functions accept NULL.
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

/* Version of the library actually linked, e.g. "0.1.0". */
DDP_API const char *ddp_version(void);
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

DDP_API ddp_log_level ddp_log_get_level(void);
DDP_API void ddp_log_set_level(ddp_log_level level);
/* Writes one line. only_rank0 != 0: only the process whose rank is 0 writes it. */
DDP_API void ddp_log_write(ddp_log_level level, int only_rank0, const char *file, int line,
                           const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

#define DDP_LOG_(lvl, r0, ...)                                                 \
    do {                                                                       \
        if ((lvl) <= ddp_log_get_level())                                      \
            ddp_log_write((lvl), (r0), __FILE__, __LINE__, __VA_ARGS__);       \
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

/* Fills *opts with the defaults (auto backend, 1 thread, table printed). */
DDP_API void ddp_init_opts_default(ddp_init_opts *opts);

/* Parses "cpu", "cuda" or "auto". Returns DDP_ERR_INVALID_ARG for anything else. */
DDP_API ddp_status ddp_backend_parse(const char *name, ddp_backend_kind *out);
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

/* Leaves the job and releases everything. Collective. NULL is ignored. */
DDP_API void ddp_finalize(ddp_ctx *ctx);

/* Stops every rank of the job with exit code `code` (MPI_Abort), after flushing logs. Use it
 * when this rank failed and the others may be waiting for it. Never returns. */
DDP_API void ddp_abort(ddp_ctx *ctx, int code);

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

/* Backend memory helpers: on the CPU backend these are malloc/memcpy, on CUDA device memory.
 * ddp_alloc returns zeroed memory, NULL on failure. */
DDP_API void *ddp_alloc(ddp_ctx *ctx, size_t n_bytes);
DDP_API void ddp_free(ddp_ctx *ctx, void *p);
DDP_API ddp_status ddp_upload(ddp_ctx *ctx, void *dst, const void *src_host, size_t n_bytes);
DDP_API ddp_status ddp_download(ddp_ctx *ctx, void *dst_host, const void *src, size_t n_bytes);

/* ---------------------------------------------------------------------------------------------
 * Collectives on backend memory (MPI on the CPU backend, NCCL on the CUDA backend).
 * Every rank must call them in the same order with the same counts.
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

DDP_API ddp_status ddp_allreduce(ddp_ctx *ctx, float *buf, size_t n, ddp_reduce_op op);

/* All-reduce of a small HOST buffer (flags, counters, losses) whatever the backend: no round trip
 * through device memory. dtype: DDP_FP64, DDP_INT64 or DDP_FP32; DDP_AVG of integers is
 * DDP_ERR_INVALID_ARG (use DDP_SUM and divide). Collective; same count and type on every rank.
 * On failure buf is undefined. */
DDP_API ddp_status ddp_allreduce_host(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                                      ddp_reduce_op op);

/* Counters of the communicator, for tests and reports. Payload bytes = elements x element size
 * of each all-reduce this rank joined (what one rank contributes; a ring moves about twice that
 * per rank). "Backend" counts ddp_allreduce, ddp_allreduce_start and the reducer's buckets;
 * "host" counts ddp_allreduce_host. */
typedef struct ddp_comm_stats {
    uint64_t allreduce_calls;
    uint64_t allreduce_bytes;
    uint64_t host_allreduce_calls;
    uint64_t host_allreduce_bytes;
} ddp_comm_stats;

/* Fills *out. DDP_ERR_INVALID_ARG when ctx or out is NULL. */
DDP_API ddp_status ddp_comm_stats_get(const ddp_ctx *ctx, ddp_comm_stats *out);
DDP_API ddp_status ddp_broadcast(ddp_ctx *ctx, void *buf, size_t n_bytes, int root);
/* recv holds world_size blocks of n_bytes, rank r's block at r * n_bytes. */
DDP_API ddp_status ddp_allgather(ddp_ctx *ctx, const void *send, void *recv, size_t n_bytes);
DDP_API ddp_status ddp_barrier(ddp_ctx *ctx);

/* Non-blocking all-reduce. Operations start in call order, which must be the same on every
 * rank. *req is NULL on failure. ddp_wait completes the operation and frees the request. */
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
/* Blocks until everything libddp has queued is complete, under the DDP_TIMEOUT deadline.
 * DDP_ERR_TIMEOUT (the communicator is then aborted), DDP_ERR_NCCL or DDP_ERR_CUDA on failure;
 * DDP_OK at once on the CPU backend. */
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

/* Product of the shape (number of elements). */
DDP_API size_t ddp_param_numel(const ddp_param_desc *d);

/* Seeded initialisation from a counter-based generator (Philox-4x32-10): element e of parameter p
 * depends only on (seed, p, e), never on rank, backend or thread count.
 * Fills host memory x[0..n) with values uniform in [lo, hi). */
DDP_API void ddp_init_uniform(float *x, size_t n, uint64_t seed, uint32_t param_index, float lo,
                              float hi);
/* Same, normal with mean 0 and standard deviation std. */
DDP_API void ddp_init_normal(float *x, size_t n, uint64_t seed, uint32_t param_index, float std);

/* Checks that every rank holds the same model: the signature (parameter count, names, shapes)
 * and a checksum of every parameter's values (params_host: the flat buffer, in host memory).
 * On a mismatch every rank returns DDP_ERR_MISMATCH and the log names the ranks and the first
 * parameter that differ. Collective. */
DDP_API ddp_status ddp_verify_replicas(ddp_ctx *ctx, const ddp_param_desc *descs, int n_params,
                                       const float *params_host);

/* Copies rank 0's parameters to every rank (params in backend memory, n elements). Collective. */
DDP_API ddp_status ddp_broadcast_params(ddp_ctx *ctx, float *params, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Distributed sampler, with the semantics of PyTorch's DistributedSampler: a permutation of
 * [0, n_samples) drawn from (seed, epoch) that does not depend on the world size (identity when
 * shuffle is 0); then either padded by repeating its start to a multiple of world_size
 * (drop_last = 0), or cut to a multiple of world_size (drop_last = 1); rank r takes positions
 * r, r + world_size, r + 2 * world_size, ...
 */
typedef struct ddp_sampler ddp_sampler;

typedef struct ddp_sampler_opts {
    size_t n_samples;
    int world_size;
    int rank;
    uint64_t seed;
    int shuffle;
    int drop_last;
} ddp_sampler_opts;

/* DDP_ERR_INVALID_ARG when rank is outside [0, world_size), n_samples is 0, or drop_last leaves
 * no sample per rank. On failure *out is NULL. */
DDP_API ddp_status ddp_sampler_create(const ddp_sampler_opts *opts, ddp_sampler **out);
DDP_API void ddp_sampler_destroy(ddp_sampler *s);
/* Number of indices this rank gets per epoch (the same on every rank). */
DDP_API size_t ddp_sampler_len(const ddp_sampler *s);
/* Writes this rank's ddp_sampler_len() indices for `epoch` into out. */
DDP_API ddp_status ddp_sampler_indices(ddp_sampler *s, uint64_t epoch, size_t *out);

/* ---------------------------------------------------------------------------------------------
 * Gradient buckets. Parameter i's gradient is grads[offset_i .. offset_i + n_i) of ONE flat
 * gradient buffer (same layout as the parameters). Buckets follow reverse parameter order: bucket
 * 0 holds the last parameters. Each bucket is the contiguous slice of the gradient buffer covering
 * parameters [first_param, last_param] (first_param <= last_param), so no copies are made.
 * A bucket is closed when adding the next parameter would exceed its cap; the first bucket's cap
 * is first_cap_bytes, the others' cap_bytes. A parameter larger than the cap gets a bucket alone.
 */
typedef struct ddp_bucket {
    int first_param; /* lowest parameter index in the bucket */
    int last_param;  /* highest parameter index in the bucket */
    size_t offset;   /* element offset of first_param's gradient in the flat buffer */
    size_t n;        /* elements in the bucket */
} ddp_bucket;

/* Plans buckets for n_params parameters of sizes numel[i] (elements of float). buckets must have
 * room for n_params entries; *n_buckets receives the count. DDP_ERR_INVALID_ARG on a zero cap,
 * n_params < 1, or a zero-sized parameter. */
DDP_API ddp_status ddp_plan_buckets(const size_t *numel, int n_params, size_t cap_bytes,
                                    size_t first_cap_bytes, ddp_bucket *buckets, int *n_buckets);

/* ---------------------------------------------------------------------------------------------
 * Reducer: averages gradients across ranks with bucketed asynchronous all-reduces that overlap
 * the backward pass.
 *
 *   ddp_reducer_begin(r, sync);          before each backward (sync = 0 on accumulation steps)
 *   ... backward computes parameter i's gradient (adding to it), then
 *   ddp_reducer_mark_ready(r, i);        a bucket's all-reduce starts when its last param is ready
 *   ddp_reducer_finish(r);               waits for every bucket; gradients are then the mean
 *                                        over ranks and over the micro-steps since the last sync
 *
 * With sync = 0 nothing is communicated: gradients accumulate locally; finish() is not called.
 * On the sync step every parameter must be marked exactly once (an unmarked parameter is
 * DDP_ERR_STATE from finish, naming it). Every rank must mark in an order that closes the
 * buckets in the same order; marking in reverse parameter order always does.
 * Averaging: after finish, grads = sum over ranks and micro-steps / (world_size * micro-steps).
 */
typedef struct ddp_reducer ddp_reducer;

typedef struct ddp_reducer_opts {
    double bucket_mb;       /* cap of every bucket but the first, MiB (default 25) */
    double first_bucket_mb; /* cap of the first bucket, MiB (default 1) */
    /* Element type of the gradient buffer: DDP_FP32 (default), DDP_BF16 or DDP_FP16. Bucket caps
     * count 4 bytes per element whatever the type, so the buckets are the same for every type. */
    ddp_dtype grad_dtype;
    /* Type on the wire (PyTorch's bf16/fp16 compression hooks): DDP_FP32, DDP_BF16 or DDP_FP16;
     * default DDP_FP32, which for 16-bit gradients means "the gradients' own type". When it
     * differs from grad_dtype each bucket is cast into a reducer-owned buffer before its
     * all-reduce and cast back after: 16 bits halve the bytes of fp32 gradients. The sum is
     * rounded to the wire type (MPI: summed in fp32 per pair of contributions, rounded back;
     * NCCL: its own reduction), then cast back and divided by world_size x micro-steps in the
     * gradients' type. fp16 has a small range: scale the loss with a ddp_scaler so the sum does
     * not overflow, or rather overflows visibly (inf, which the scaler detects and skips). */
    ddp_dtype comm_dtype;
    /* CUDA only: the caller's cudaStream_t (NULL: ddp_backend_stream()). Each bucket's cast and
     * all-reduce are ordered after the work queued on this stream when the bucket's last
     * parameter is marked ready; after ddp_reducer_finish the averaged gradients are ordered on
     * this same stream (later kernels on it see them; the host must synchronise the stream before
     * reading them). The stream must stay valid until the reducer is destroyed. Ignored on CPU. */
    void *stream;
    int defer_launch;       /* non-zero: no overlap; every bucket is launched by finish(), after
                               the backward pass (default 0: launched as soon as it is ready) */
} ddp_reducer_opts;

DDP_API void ddp_reducer_opts_default(ddp_reducer_opts *opts);

/* grads: the flat gradient buffer in backend memory, elements of opts->grad_dtype (kept, not
 * owned); numel: element count of each of the n_params parameters. DDP_ERR_INVALID_ARG for an
 * unknown or non-gradient dtype, DDP_ERR_NOMEM when the wire buffer cannot be allocated. On
 * failure *out is NULL. */
DDP_API ddp_status ddp_reducer_create(ddp_ctx *ctx, void *grads, const size_t *numel, int n_params,
                                      const ddp_reducer_opts *opts, ddp_reducer **out);
DDP_API void ddp_reducer_destroy(ddp_reducer *r);
DDP_API ddp_status ddp_reducer_begin(ddp_reducer *r, int sync);
DDP_API ddp_status ddp_reducer_mark_ready(ddp_reducer *r, int param);
/* On failure (DDP_ERR_STATE for an unmarked parameter, or a failed all-reduce) the gradients are
 * undefined and the program should stop the job with ddp_abort(). An unmarked parameter does not
 * hang the peers: finish still starts every remaining bucket. */
DDP_API ddp_status ddp_reducer_finish(ddp_reducer *r);
DDP_API int ddp_reducer_n_buckets(const ddp_reducer *r);
DDP_API const ddp_bucket *ddp_reducer_buckets(const ddp_reducer *r);

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
 */
typedef struct ddp_scaler ddp_scaler;

typedef struct ddp_scaler_opts {
    double init_scale;       /* default 65536 (2^16) */
    double growth_factor;    /* default 2 */
    double backoff_factor;   /* default 0.5 */
    int64_t growth_interval; /* default 2000 */
} ddp_scaler_opts;

DDP_API void ddp_scaler_opts_default(ddp_scaler_opts *opts);
/* DDP_ERR_INVALID_ARG (naming the field) unless init_scale > 0 and finite, growth_factor > 1,
 * 0 < backoff_factor < 1, growth_interval >= 1. On failure *out is NULL. Not collective. */
DDP_API ddp_status ddp_scaler_create(ddp_ctx *ctx, const ddp_scaler_opts *opts, ddp_scaler **out);
DDP_API void ddp_scaler_destroy(ddp_scaler *s);
/* The current scale; 0 for a NULL scaler. */
DDP_API double ddp_scaler_scale(const ddp_scaler *s);
/* Checks, unscales and updates as described above. grads: n elements of dtype (DDP_FP32,
 * DDP_BF16 or DDP_FP16) in backend memory (on CUDA ordered on the backend's stream; the call
 * waits for the check). Collective. On failure *step_ok is 0 and the state is unchanged. */
DDP_API ddp_status ddp_scaler_unscale_update(ddp_scaler *s, void *grads, ddp_dtype dtype, size_t n,
                                             int *step_ok);
/* Training state for checkpoints: the scale and the count of finite steps since the last change
 * (PyTorch's "_growth_tracker"). set_state: DDP_ERR_INVALID_ARG unless scale > 0 and finite and
 * 0 <= growth_tracker < growth_interval. */
DDP_API ddp_status ddp_scaler_get_state(const ddp_scaler *s, double *scale, int64_t *growth_tracker);
DDP_API ddp_status ddp_scaler_set_state(ddp_scaler *s, double scale, int64_t growth_tracker);
/* Steps skipped for inf/NaN since creation. */
DDP_API int64_t ddp_scaler_skipped_steps(const ddp_scaler *s);

/* Checkpoints and timeline tracing have their own headers, installed beside this one. */
#include "ddp_checkpoint.h"
#include "ddp_trace.h"

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

DDP_API void ddp_link_check_opts_default(ddp_link_check_opts *opts);
/* Collective. On success *n_slow_nodes (every rank) is the number of nodes named slow. DDP_ERR_MPI,
 * DDP_ERR_NOMEM, DDP_ERR_INVALID_ARG (bw_bytes over INT_MAX or zero reps). */
DDP_API ddp_status ddp_link_check(ddp_ctx *ctx, const ddp_link_check_opts *opts, int *n_slow_nodes);

#ifdef __cplusplus
}
#endif

#endif /* DDP_H */
