/* comm.c - the public collectives: argument checks, then dispatch to the context's communicator
 * (ctx->comm on backend memory, ctx->host_comm on host memory).
 *
 * Requests: every implementation's request struct starts with a `const comm_ops *` naming the
 * implementation that made it, so ddp_wait() can hand the request back to it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"

static ddp_status comm_check(const ddp_ctx *ctx, const void *buf, size_t n, const char *who)
{
    if (!ctx || !ctx->comm || !ctx->host_comm) {
        DDP_ERROR("%s: no context (call ddp_init first)", who);
        return DDP_ERR_STATE;
    }
    if (!buf && n > 0) {
        DDP_ERROR("%s: NULL buffer for %zu elements", who, n);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

static ddp_status comm_check_root(const ddp_ctx *ctx, int root, const char *who)
{
    if (root < 0 || root >= ctx->world_size) {
        DDP_ERROR("%s: root %d is not a rank of this job (world size %d)", who, root,
                  ctx->world_size);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

static ddp_status comm_check_op(ddp_reduce_op op, ddp_dtype dtype, const char *who)
{
    if (op != DDP_SUM && op != DDP_AVG && op != DDP_MAX && op != DDP_MIN) {
        DDP_ERROR("%s: unknown reduce op %d (use DDP_SUM, DDP_AVG, DDP_MAX or DDP_MIN)", who,
                  (int)op);
        return DDP_ERR_INVALID_ARG;
    }
    if (ddp_dtype_size(dtype) == 0) {
        DDP_ERROR("%s: unknown element type %d", who, (int)dtype);
        return DDP_ERR_INVALID_ARG;
    }
    if ((op == DDP_MAX || op == DDP_MIN) && (dtype == DDP_BF16 || dtype == DDP_FP16)) {
        DDP_ERROR("%s: 16-bit all-reduces sum (or average) only; use fp32 for DDP_MAX/DDP_MIN", who);
        return DDP_ERR_INVALID_ARG;
    }
    if (op == DDP_AVG && dtype == DDP_INT64) {
        DDP_ERROR("%s: DDP_AVG of integers would round: use DDP_SUM and divide by the world size",
                  who);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

static void comm_count(uint64_t *calls, uint64_t *bytes, size_t n, ddp_dtype dtype)
{
    __atomic_fetch_add(calls, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(bytes, (uint64_t)n * ddp_dtype_size(dtype), __ATOMIC_RELAXED);
}

ddp_status ddp_allreduce(ddp_ctx *ctx, float *buf, size_t n, ddp_reduce_op op)
{
    ddp_status st = comm_check(ctx, buf, n, "ddp_allreduce");
    if (st == DDP_OK)
        st = comm_check_op(op, DDP_FP32, "ddp_allreduce");
    if (st != DDP_OK)
        return st;
    comm_count(&ctx->allreduce_calls, &ctx->allreduce_bytes, n, DDP_FP32);
    return ctx->comm->ops->allreduce(ctx->comm, buf, n, DDP_FP32, op);
}

ddp_status allreduce_start_typed(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                                 ddp_reduce_op op, void *stream, ddp_request **req)
{
    if (!req)
        return DDP_ERR_INVALID_ARG;
    *req = NULL;
    ddp_status st = comm_check(ctx, buf, n, "ddp_allreduce_start");
    if (st == DDP_OK)
        st = comm_check_op(op, dtype, "ddp_allreduce_start");
    if (st != DDP_OK)
        return st;
    comm_count(&ctx->allreduce_calls, &ctx->allreduce_bytes, n, dtype);
    return ctx->comm->ops->allreduce_start(ctx->comm, buf, n, dtype, op, stream, req);
}

ddp_status allreduce_runs_start(ddp_ctx *ctx, void *base, const size_t *off, const size_t *len,
                                int n_runs, ddp_dtype dtype, ddp_reduce_op op, void *stream,
                                ddp_request **req)
{
    *req = NULL;
    ddp_status st = comm_check(ctx, base, n_runs > 0, "reducer all-reduce");
    if (st == DDP_OK)
        st = comm_check_op(op, dtype, "reducer all-reduce");
    if (st != DDP_OK)
        return st;
    size_t n = 0;
    for (int i = 0; i < n_runs; i++)
        n += len[i];
    comm_count(&ctx->allreduce_calls, &ctx->allreduce_bytes, n, dtype);
    return ctx->comm->ops->allreduce_runs_start(ctx->comm, base, off, len, n_runs, dtype, op,
                                                stream, req);
}

ddp_status ddp_allreduce_typed(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                               ddp_reduce_op op, void *stream)
{
    ddp_status st = comm_check(ctx, buf, n, "ddp_allreduce_typed");
    if (st == DDP_OK)
        st = comm_check_op(op, dtype, "ddp_allreduce_typed");
    if (st != DDP_OK)
        return st;
    if (!stream || ctx->backend != DDP_BACKEND_CUDA) {
        comm_count(&ctx->allreduce_calls, &ctx->allreduce_bytes, n, dtype);
        return ctx->comm->ops->allreduce(ctx->comm, buf, n, dtype, op);
    }
    ddp_request *req = NULL;
    st = allreduce_start_typed(ctx, buf, n, dtype, op, stream, &req);
    return st == DDP_OK ? ddp_wait(req) : st; /* the caller's stream waits; the host does not */
}

/* Sum of the world's per-rank counts. */
static size_t comm_total(const ddp_ctx *ctx, const size_t *counts)
{
    size_t n = 0;
    for (int q = 0; q < ctx->world_size; q++)
        n += counts[q];
    return n;
}

ddp_status reduce_scatter_start(ddp_ctx *ctx, const void *send, void *recv, const size_t *counts,
                                ddp_dtype dtype, ddp_reduce_op op, void *stream, ddp_request **req)
{
    *req = NULL;
    ddp_status st = comm_check(ctx, counts, 1, "reduce-scatter");
    if (st == DDP_OK)
        st = comm_check(ctx, send, comm_total(ctx, counts), "reduce-scatter");
    if (st == DDP_OK)
        st = comm_check(ctx, recv, counts[ctx->rank], "reduce-scatter");
    if (st == DDP_OK)
        st = comm_check_op(op, dtype, "reduce-scatter");
    if (st == DDP_OK && (op == DDP_MAX || op == DDP_MIN || dtype == DDP_INT64)) {
        DDP_ERROR("reduce-scatter: sums and averages of fp64, fp32, bf16 or fp16 only");
        st = DDP_ERR_INVALID_ARG;
    }
    if (st != DDP_OK)
        return st;
    comm_count(&ctx->reduce_scatter_calls, &ctx->reduce_scatter_bytes, comm_total(ctx, counts),
               dtype);
    return ctx->comm->ops->reduce_scatter_start(ctx->comm, send, recv, counts, dtype, op, stream,
                                                req);
}

ddp_status allgatherv_start(ddp_ctx *ctx, const void *send, void *recv, const size_t *counts,
                            ddp_dtype dtype, void *stream, ddp_request **req)
{
    *req = NULL;
    ddp_status st = comm_check(ctx, counts, 1, "all-gather");
    if (st == DDP_OK)
        st = comm_check(ctx, send, counts[ctx->rank], "all-gather");
    if (st == DDP_OK)
        st = comm_check(ctx, recv, comm_total(ctx, counts), "all-gather");
    if (st == DDP_OK && ddp_dtype_size(dtype) == 0) {
        DDP_ERROR("all-gather: unknown element type %d", (int)dtype);
        st = DDP_ERR_INVALID_ARG;
    }
    if (st != DDP_OK)
        return st;
    comm_count(&ctx->allgather_calls, &ctx->allgather_bytes, comm_total(ctx, counts), dtype);
    return ctx->comm->ops->allgatherv_start(ctx->comm, send, recv, counts, dtype, stream, req);
}

ddp_status allgatherv_runs_start(ddp_ctx *ctx, void *base, const size_t *off, int n_runs,
                                 const size_t *counts, ddp_dtype dtype, void *stream,
                                 ddp_request **req)
{
    *req = NULL;
    ddp_status st = comm_check(ctx, base, n_runs > 0, "all-gather of runs");
    if (st == DDP_OK)
        st = comm_check(ctx, off, n_runs > 0, "all-gather of runs");
    if (st == DDP_OK)
        st = comm_check(ctx, counts, n_runs > 0, "all-gather of runs");
    if (st == DDP_OK && (n_runs < 0 || ddp_dtype_size(dtype) == 0)) {
        DDP_ERROR("all-gather of runs: %d runs of element type %d", n_runs, (int)dtype);
        st = DDP_ERR_INVALID_ARG;
    }
    if (st != DDP_OK)
        return st;
    size_t n = 0;
    for (int i = 0; i < n_runs; i++)
        n += comm_total(ctx, counts + (size_t)i * (size_t)ctx->world_size);
    comm_count(&ctx->allgather_calls, &ctx->allgather_bytes, n, dtype);
    return ctx->comm->ops->allgatherv_runs_start(ctx->comm, base, off, n_runs, counts, dtype,
                                                 stream, req);
}

/* world_size copies of n (the counts of the equal-block public forms); NULL when out of memory. */
static size_t *comm_equal_counts(const ddp_ctx *ctx, size_t n, const char *who)
{
    size_t *counts = malloc((size_t)ctx->world_size * sizeof *counts);
    if (!counts) {
        DDP_ERROR("%s: out of memory", who);
        return NULL;
    }
    for (int q = 0; q < ctx->world_size; q++)
        counts[q] = n;
    return counts;
}

/* Starts a public equal-block reduce-scatter (gather = 0) or all-gather and waits for it. */
static ddp_status comm_shard_blocking(ddp_ctx *ctx, int gather, const void *send, void *recv,
                                      size_t n, ddp_dtype dtype, ddp_reduce_op op, void *stream,
                                      const char *who)
{
    ddp_status st = comm_check(ctx, NULL, 0, who);
    if (st != DDP_OK)
        return st;
    size_t *counts = comm_equal_counts(ctx, n, who);
    if (!counts)
        return DDP_ERR_NOMEM; /* joins no collective: the peers wait for the deadline */
    ddp_request *req = NULL;
    st = gather ? allgatherv_start(ctx, send, recv, counts, dtype, stream, &req)
                : reduce_scatter_start(ctx, send, recv, counts, dtype, op, stream, &req);
    free(counts);
    return st == DDP_OK ? ddp_wait(req) : st;
}

ddp_status ddp_reduce_scatter(ddp_ctx *ctx, const void *send, void *recv, size_t n,
                              ddp_dtype dtype, ddp_reduce_op op, void *stream)
{
    return comm_shard_blocking(ctx, 0, send, recv, n, dtype, op, stream, "ddp_reduce_scatter");
}

ddp_status ddp_allgather_typed(ddp_ctx *ctx, const void *send, void *recv, size_t n,
                               ddp_dtype dtype, void *stream)
{
    return comm_shard_blocking(ctx, 1, send, recv, n, dtype, DDP_SUM, stream,
                               "ddp_allgather_typed");
}

ddp_status ddp_allreduce_start(ddp_ctx *ctx, float *buf, size_t n, ddp_reduce_op op,
                               ddp_request **req)
{
    return allreduce_start_typed(ctx, buf, n, DDP_FP32, op, NULL, req);
}

ddp_status ddp_allreduce_host(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype, ddp_reduce_op op)
{
    ddp_status st = comm_check(ctx, buf, n, "ddp_allreduce_host");
    if (st == DDP_OK)
        st = comm_check_op(op, dtype, "ddp_allreduce_host");
    if (st == DDP_OK && dtype != DDP_FP64 && dtype != DDP_INT64 && dtype != DDP_FP32) {
        DDP_ERROR("ddp_allreduce_host: element type %s is not one of fp64, int64, fp32",
                  ddp_dtype_name(dtype));
        st = DDP_ERR_INVALID_ARG;
    }
    if (st != DDP_OK)
        return st;
    comm_count(&ctx->host_allreduce_calls, &ctx->host_allreduce_bytes, n, dtype);
    int64_t waited = straggler_wait_begin();
    st = ctx->host_comm->ops->allreduce(ctx->host_comm, buf, n, dtype, op);
    straggler_wait_end(waited);
    return st;
}

ddp_status ddp_agree_failed(ddp_ctx *ctx, int failed, int64_t *flags, int64_t *n_failed)
{
    if (!ctx || !flags)
        return DDP_ERR_INVALID_ARG;
    memset(flags, 0, (size_t)ctx->world_size * sizeof *flags);
    flags[ctx->rank] = failed != 0;
    ddp_status st = ddp_allreduce_host(ctx, flags, (size_t)ctx->world_size, DDP_INT64, DDP_SUM);
    int64_t n = 0;
    for (int q = 0; q < ctx->world_size; q++)
        n += flags[q];
    if (n_failed)
        *n_failed = n;
    return st;
}

ddp_status ddp_agree(ddp_ctx *ctx, ddp_status local, const char *then, ddp_status *collective)
{
    int64_t failed = local != DDP_OK;
    ddp_status st = ddp_allreduce_host(ctx, &failed, 1, DDP_INT64, DDP_SUM);
    if (collective)
        *collective = st;
    if (st != DDP_OK)
        return st;
    if (failed == 0)
        return DDP_OK;
    if (local == DDP_OK && then)
        DDP_ERROR("%lld rank(s) failed (see their messages); %s", (long long)failed, then);
    return local != DDP_OK ? local : DDP_ERR_MISMATCH;
}

void ddp_log_failed_ranks(const int64_t *flags, int world, const char *what)
{
    char list[256] = "";
    int64_t n = 0;
    for (int q = 0; flags && q < world; q++)
        if (flags[q] && ++n <= 16)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", n > 1 ? ", " : "", q);
    if (n)
        DDP_ERROR("%s: rank(s) %s%s failed (see their messages)", what, list,
                  n > 16 ? ", ..." : "");
}

ddp_status ddp_comm_stats_get(const ddp_ctx *ctx, ddp_comm_stats *out)
{
    if (!ctx || !out)
        return DDP_ERR_INVALID_ARG;
    out->allreduce_calls = __atomic_load_n(&ctx->allreduce_calls, __ATOMIC_RELAXED);
    out->allreduce_bytes = __atomic_load_n(&ctx->allreduce_bytes, __ATOMIC_RELAXED);
    out->host_allreduce_calls = __atomic_load_n(&ctx->host_allreduce_calls, __ATOMIC_RELAXED);
    out->host_allreduce_bytes = __atomic_load_n(&ctx->host_allreduce_bytes, __ATOMIC_RELAXED);
    out->reduce_scatter_calls = __atomic_load_n(&ctx->reduce_scatter_calls, __ATOMIC_RELAXED);
    out->reduce_scatter_bytes = __atomic_load_n(&ctx->reduce_scatter_bytes, __ATOMIC_RELAXED);
    out->allgather_calls = __atomic_load_n(&ctx->allgather_calls, __ATOMIC_RELAXED);
    out->allgather_bytes = __atomic_load_n(&ctx->allgather_bytes, __ATOMIC_RELAXED);
    return DDP_OK;
}

ddp_status ddp_wait(ddp_request *req)
{
    if (!req) {
        DDP_ERROR("ddp_wait: NULL request (did ddp_allreduce_start fail?)");
        return DDP_ERR_INVALID_ARG;
    }
    const comm_ops *ops = *(const comm_ops *const *)(const void *)req;
    return ops->wait(req);
}

/* Broadcast and all-gather on the backend communicator (host = 0) or the host one (host = 1). */
static ddp_status comm_broadcast_on(ddp_ctx *ctx, int host, void *buf, size_t n_bytes, int root,
                                    const char *who)
{
    ddp_status st = comm_check(ctx, buf, n_bytes, who);
    if (st == DDP_OK)
        st = comm_check_root(ctx, root, who);
    if (st != DDP_OK)
        return st;
    comm_group *c = host ? ctx->host_comm : ctx->comm;
    return c->ops->broadcast(c, buf, n_bytes, root);
}

static ddp_status comm_allgather_on(ddp_ctx *ctx, int host, const void *send, void *recv,
                                    size_t n_bytes, const char *who)
{
    ddp_status st = comm_check(ctx, send, n_bytes, who);
    if (st == DDP_OK)
        st = comm_check(ctx, recv, n_bytes, who);
    if (st != DDP_OK)
        return st;
    comm_group *c = host ? ctx->host_comm : ctx->comm;
    return c->ops->allgather(c, send, recv, n_bytes);
}

ddp_status ddp_broadcast(ddp_ctx *ctx, void *buf, size_t n_bytes, int root)
{
    return comm_broadcast_on(ctx, 0, buf, n_bytes, root, "ddp_broadcast");
}

ddp_status ddp_allgather(ddp_ctx *ctx, const void *send, void *recv, size_t n_bytes)
{
    return comm_allgather_on(ctx, 0, send, recv, n_bytes, "ddp_allgather");
}

ddp_status ddp_barrier(ddp_ctx *ctx)
{
    ddp_status st = comm_check(ctx, NULL, 0, "ddp_barrier");
    if (st != DDP_OK)
        return st;
    return ctx->comm->ops->barrier(ctx->comm);
}

ddp_status host_allgather(ddp_ctx *ctx, const void *send, void *recv, size_t n_bytes)
{
    return comm_allgather_on(ctx, 1, send, recv, n_bytes, "host_allgather");
}

ddp_status host_broadcast(ddp_ctx *ctx, void *buf, size_t n_bytes, int root)
{
    return comm_broadcast_on(ctx, 1, buf, n_bytes, root, "host_broadcast");
}

/* The context's CUDA backend, or NULL (nothing to order) on the CPU; *st says why not. */
static int comm_on_cuda(const ddp_ctx *ctx, const char *who, ddp_status *st)
{
    *st = DDP_OK;
    if (!ctx || !ctx->dev) {
        DDP_ERROR("%s: no context (call ddp_init first)", who);
        *st = DDP_ERR_STATE;
        return 0;
    }
    return ctx->backend == DDP_BACKEND_CUDA;
}

ddp_status ddp_stream_after(ddp_ctx *ctx, void *stream)
{
    ddp_status st;
    if (!comm_on_cuda(ctx, "ddp_stream_after", &st))
        return st;
    return cuda_join(cuda_stream(), stream);
}

ddp_status ddp_after_stream(ddp_ctx *ctx, void *stream)
{
    ddp_status st;
    if (!comm_on_cuda(ctx, "ddp_after_stream", &st))
        return st;
    return cuda_join(stream, cuda_stream());
}

ddp_status ddp_synchronize(ddp_ctx *ctx)
{
    ddp_status st;
    if (!comm_on_cuda(ctx, "ddp_synchronize", &st))
        return st;
    return cuda_stream_wait(cuda_stream(), "ddp_synchronize");
}

#if !HAVE_NCCL
ddp_status comm_nccl_create(int rank, int world_size, comm_group **out)
{
    *out = NULL;
    DDP_ERROR("this libddp was built without NCCL, which the cuda backend needs to communicate: "
              "rebuild with meson -Dnccl=enabled, or use the cpu backend");
    return DDP_ERR_UNSUPPORTED;
}
#endif
