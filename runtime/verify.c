/* verify.c - replica verification (every rank holds the same model) and parameter broadcast.
 *
 * Each rank describes every parameter by two CRC-32s: its signature (name, number of dims, shape)
 * and its values. The table is gathered over the host communicator and each rank compares every
 * rank with rank 0, so all ranks reach the same verdict. Rank 0 reports each differing rank, and
 * each differing rank reports itself, naming the first parameter that differs.
 */
#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "internal.h"

/* Ranks reported one by one on rank 0 before the rest are summed up in one line. */
#define VERIFY_MAX_REPORTED 8

typedef struct param_sum {
    uint32_t signature; /* CRC-32 of name, n_dims and shape */
    uint32_t values;    /* CRC-32 of the parameter's float values */
} param_sum;

size_t ddp_param_numel(const ddp_param_desc *d)
{
    size_t n = 1;
    for (int k = 0; k < d->n_dims && k < DDP_MAX_DIMS; k++)
        n *= d->shape[k] > 0 ? (size_t)d->shape[k] : 0;
    return n;
}

static uint32_t verify_signature(const ddp_param_desc *d)
{
    int64_t dims[1 + DDP_MAX_DIMS] = {d->n_dims};
    for (int k = 0; k < d->n_dims && k < DDP_MAX_DIMS; k++)
        dims[1 + k] = d->shape[k];
    uLong crc = crc32_z(0L, (const Bytef *)d->name, strnlen(d->name, DDP_NAME_MAX));
    return (uint32_t)crc32_z(crc, (const Bytef *)dims, sizeof dims);
}

static void verify_summarise(const ddp_param_desc *descs, int n_params, const float *params,
                             param_sum *out)
{
    size_t offset = 0;
    for (int i = 0; i < n_params; i++) {
        size_t n = ddp_param_numel(&descs[i]);
        out[i].signature = verify_signature(&descs[i]);
        out[i].values = (uint32_t)crc32_z(0L, (const Bytef *)(params + offset), n * sizeof *params);
        offset += n;
    }
}

static void verify_shape_text(const ddp_param_desc *d, char *out, size_t size)
{
    size_t len = (size_t)snprintf(out, size, "[");
    for (int k = 0; k < d->n_dims && k < DDP_MAX_DIMS && len < size; k++)
        len += (size_t)snprintf(out + len, size - len, k ? ", %" PRId64 : "%" PRId64, d->shape[k]);
    if (len < size)
        snprintf(out + len, size - len, "]");
}

/* Logs that rank r differs from rank 0 at parameter i (this rank's description of it). */
static void verify_report(const ddp_ctx *ctx, int r, int i, const param_sum *mine0,
                          const param_sum *theirs, const ddp_param_desc *d)
{
    char shape[96];
    verify_shape_text(d, shape, sizeof shape);
    if (mine0->signature != theirs->signature)
        DDP_ERROR("replicas differ: rank %d and rank 0 disagree on the name or shape of parameter "
                  "%d (rank %d has '%s' %s): build the same model on every rank", r, i, ctx->rank,
                  d->name, shape);
    else
        DDP_ERROR("replicas differ: rank %d and rank 0 disagree on parameter '%s' (index %d): "
                  "checksum 0x%08" PRIx32 " vs 0x%08" PRIx32 "; initialise with the same --seed on "
                  "every rank or use broadcast", r, d->name, i, theirs->values, mine0->values);
}

/* First parameter where rank r's table differs from rank 0's, or -1. */
static int verify_first_diff(const param_sum *table, int n_params, int r)
{
    const param_sum *ref = table, *other = table + (size_t)r * (size_t)n_params;
    for (int i = 0; i < n_params; i++)
        if (ref[i].signature != other[i].signature || ref[i].values != other[i].values)
            return i;
    return -1;
}

/* Compares every rank with rank 0; logs on rank 0 and on the differing ranks. */
static ddp_status verify_compare(const ddp_ctx *ctx, const ddp_param_desc *descs, int n_params,
                                 const param_sum *table)
{
    int n_bad = 0;
    for (int r = 1; r < ctx->world_size; r++) {
        int i = verify_first_diff(table, n_params, r);
        if (i < 0)
            continue;
        const param_sum *ref = &table[i], *other = &table[(size_t)r * (size_t)n_params + (size_t)i];
        if ((ctx->rank == 0 && n_bad < VERIFY_MAX_REPORTED) || ctx->rank == r)
            verify_report(ctx, r, i, ref, other, &descs[i]);
        n_bad++;
    }
    if (n_bad > VERIFY_MAX_REPORTED && ctx->rank == 0)
        DDP_ERROR("replicas differ: %d ranks in all differ from rank 0", n_bad);
    return n_bad ? DDP_ERR_MISMATCH : DDP_OK;
}

/* Every rank must have the same parameter count before the tables can be compared.
 * counts: room for world_size ints. */
static ddp_status verify_counts(ddp_ctx *ctx, int n_params, int *counts)
{
    ddp_status st = host_allgather(ctx, &n_params, counts, sizeof n_params);
    for (int r = 1; st == DDP_OK && r < ctx->world_size; r++) {
        if (counts[r] == counts[0])
            continue;
        if (ctx->rank == 0 || ctx->rank == r)
            DDP_ERROR("replicas differ: rank %d has %d parameters but rank 0 has %d: build the "
                      "same model on every rank", r, counts[r], counts[0]);
        st = DDP_ERR_MISMATCH;
    }
    return st;
}

/* DDP_OK when every rank got its memory (ok != 0), else DDP_ERR_NOMEM on every rank. */
static ddp_status verify_agree_memory(int ok)
{
    int all_ok = 0;
    watch_enter(DDP_WATCH_CALLER, "replica-check agreement", -1, sizeof ok);
    int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    watch_leave(DDP_WATCH_CALLER);
    if (rc != MPI_SUCCESS) {
        DDP_ERROR("MPI_Allreduce failed in the replica check");
        return DDP_ERR_MPI;
    }
    if (!ok)
        DDP_ERROR("out of memory for the replica check");
    return all_ok ? DDP_OK : DDP_ERR_NOMEM;
}

static ddp_status verify_tables(ddp_ctx *ctx, const ddp_param_desc *descs, int n_params,
                                const float *params_host, param_sum *mine, param_sum *table)
{
    verify_summarise(descs, n_params, params_host, mine);
    ddp_status st = host_allgather(ctx, mine, table, (size_t)n_params * sizeof *mine);
    return st == DDP_OK ? verify_compare(ctx, descs, n_params, table) : st;
}

ddp_status ddp_verify_replicas(ddp_ctx *ctx, const ddp_param_desc *descs, int n_params,
                               const float *params_host)
{
    if (!ctx || n_params < 0 || (n_params > 0 && (!descs || !params_host))) {
        DDP_ERROR("ddp_verify_replicas: needs a context, parameter descriptions and values");
        return DDP_ERR_INVALID_ARG;
    }
    size_t n_alloc = n_params > 0 ? (size_t)n_params : 1;
    int *counts = calloc((size_t)ctx->world_size, sizeof *counts);
    param_sum *mine = calloc(n_alloc, sizeof *mine);
    param_sum *table = calloc((size_t)ctx->world_size * n_alloc, sizeof *table);
    ddp_status st = verify_agree_memory(counts && mine && table);
    if (st == DDP_OK)
        st = verify_counts(ctx, n_params, counts);
    if (st == DDP_OK && n_params > 0)
        st = verify_tables(ctx, descs, n_params, params_host, mine, table);
    free(counts);
    free(mine);
    free(table);
    return st;
}

ddp_status ddp_broadcast_params(ddp_ctx *ctx, float *params, size_t n)
{
    return ddp_broadcast(ctx, params, n * sizeof *params, 0);
}
