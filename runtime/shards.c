/* shards.c - a sharded flat buffer to rank 0's host memory and back, in bounded rounds
 * (ddp_shard_gather, ddp_range_broadcast; ddp.h): what a checkpoint of a ZeRO state needs. */
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "try.h"

/* One round of ddp_shard_gather: this rank's elements [at, at + chunk) of its shard into send,
 * every rank's into recv, and on rank 0 into their places in host (tmp: world x chunk floats). */
static ddp_status gather_round(ddp_ctx *ctx, size_t total, const float *shard, size_t mine,
                               size_t at, size_t chunk, float *send, float *recv, float *host,
                               float *tmp)
{
    int world = ddp_world_size(ctx);
    size_t k = at < mine ? (mine - at < chunk ? mine - at : chunk) : 0;
    if (k > 0)
        TRY_OK(ddp_copy(ctx, send, shard + at, k * sizeof(float)));
    TRY_OK(ddp_allgather(ctx, send, recv, chunk * sizeof(float)));
    if (!host)
        return DDP_OK;
    TRY_OK(ddp_download(ctx, tmp, recv, (size_t)world * chunk * sizeof(float)));
    for (int q = 0; q < world; q++) {
        size_t off, n;
        ddp_shard_range(total, world, q, &off, &n);
        if (at < n)
            memcpy(host + off + at, tmp + (size_t)q * chunk,
                   (n - at < chunk ? n - at : chunk) * sizeof(float));
    }
    return DDP_OK;
}

ddp_status ddp_shard_gather(ddp_ctx *ctx, size_t total, const float *shard, float *root_host,
                            size_t chunk)
{
    int world = ddp_world_size(ctx);
    size_t off0, n0, mine_off, mine;
    ddp_shard_range(total, world, 0, &off0, &n0); /* rank 0's shard is the longest */
    ddp_shard_range(total, world, ddp_rank(ctx), &mine_off, &mine);
    chunk = chunk ? chunk : (size_t)1 << 20;
    chunk = n0 < chunk ? (n0 > 0 ? n0 : 1) : chunk;
    float *send = ddp_alloc(ctx, chunk * sizeof(float));
    float *recv = ddp_alloc(ctx, (size_t)world * chunk * sizeof(float));
    float *tmp = root_host ? malloc((size_t)world * chunk * sizeof(float)) : NULL;
    ddp_status st = send && recv && (!root_host || tmp) ? DDP_OK : DDP_ERR_NOMEM;
    if (st != DDP_OK)
        DDP_ERROR("ddp_shard_gather: no memory for %d x %zu floats", world, chunk);
    for (size_t at = 0; st == DDP_OK && at < n0; at += chunk)
        st = gather_round(ctx, total, shard, mine, at, chunk, send, recv, root_host, tmp);
    free(tmp);
    ddp_free(ctx, send);
    ddp_free(ctx, recv);
    return st;
}

ddp_status ddp_range_broadcast(ddp_ctx *ctx, size_t total, const float *root_host, size_t offset,
                               size_t n, float *range, size_t chunk)
{
    chunk = chunk ? chunk : (size_t)4 << 20;
    size_t hi = offset + n;
    float *dev = ddp_alloc(ctx, chunk * sizeof(float));
    ddp_status st = dev ? DDP_OK : DDP_ERR_NOMEM;
    if (st != DDP_OK)
        DDP_ERROR("ddp_range_broadcast: no memory for %zu floats", chunk);
    for (size_t at = 0; st == DDP_OK && at < total; at += chunk) {
        size_t k = total - at < chunk ? total - at : chunk;
        if (root_host)
            st = ddp_upload(ctx, dev, root_host + at, k * sizeof(float));
        if (st == DDP_OK)
            st = ddp_broadcast(ctx, dev, k * sizeof(float), 0);
        size_t a = at > offset ? at : offset, e = at + k < hi ? at + k : hi;
        if (st == DDP_OK && a < e)
            st = ddp_copy(ctx, range + (a - offset), dev + (a - at), (e - a) * sizeof(float));
    }
    ddp_free(ctx, dev);
    return st;
}

ddp_status ddp_shard_allgather(ddp_ctx *ctx, size_t total, float *buf)
{
    int world = ddp_world_size(ctx);
    ddp_status st = DDP_OK;
    for (int q = 0; st == DDP_OK && q < world; q++) {
        size_t off = 0, n = 0;
        st = ddp_shard_range(total, world, q, &off, &n);
        if (st == DDP_OK && n > 0)
            st = ddp_broadcast(ctx, buf + off, n * sizeof(float), q);
    }
    return st;
}
