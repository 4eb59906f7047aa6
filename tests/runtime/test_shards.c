/* test_shards.c - ddp_shard_gather and ddp_range_broadcast under real mpirun (3 ranks: the last
 * shard is shorter), with rounds of 7 floats (many rounds, the last partial) and of the defaults:
 *   - gather: rank 0's host buffer holds every rank's shard at its offset, each element once
 *     (element i holds i + 0.5, written by the rank whose shard holds i), the rest of the buffer
 *     untouched on the other ranks (NULL);
 *   - broadcast: every rank's range, its shard and an arbitrary range across shards alike, holds
 *     rank 0's elements there.
 */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "ddp.h"

#define TOTAL 1001

static void check_gather(ddp_ctx *ctx, size_t chunk)
{
    size_t off, n;
    ddp_shard_range(TOTAL, ddp_world_size(ctx), ddp_rank(ctx), &off, &n);
    float *shard = malloc((n ? n : 1) * sizeof *shard), *host = NULL;
    for (size_t i = 0; i < n; i++)
        shard[i] = (float)(off + i) + 0.5f;
    if (ddp_rank(ctx) == 0) {
        host = malloc(TOTAL * sizeof *host);
        for (size_t i = 0; i < TOTAL; i++)
            host[i] = -1.0f;
    }
    CHECK(ddp_shard_gather(ctx, TOTAL, shard, host, chunk) == DDP_OK, "gather (chunk %zu)", chunk);
    int bad = 0;
    for (size_t i = 0; host && i < TOTAL; i++)
        bad += host[i] != (float)i + 0.5f;
    CHECK(bad == 0, "gather (chunk %zu): %d of %d elements wrong on rank 0", chunk, bad, TOTAL);
    free(shard);
    free(host);
}

static void check_broadcast(ddp_ctx *ctx, size_t chunk, size_t off, size_t n)
{
    float *host = NULL, *range = malloc((n ? n : 1) * sizeof *range);
    if (ddp_rank(ctx) == 0) {
        host = malloc(TOTAL * sizeof *host);
        for (size_t i = 0; i < TOTAL; i++)
            host[i] = 2.0f * (float)i;
    }
    CHECK(ddp_range_broadcast(ctx, TOTAL, host, off, n, range, chunk) == DDP_OK,
          "broadcast (chunk %zu)", chunk);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += range[i] != 2.0f * (float)(off + i);
    CHECK(bad == 0, "broadcast (chunk %zu) of [%zu, %zu): %d wrong on rank %d", chunk, off,
          off + n, bad, ddp_rank(ctx));
    free(host);
    free(range);
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_shards", CHECK_GPU_ONE, &ctx);
    if (rc != 0)
        return rc;
    int rank = ddp_rank(ctx);
    size_t off, n;
    ddp_shard_range(TOTAL, ddp_world_size(ctx), rank, &off, &n);
    for (int k = 0; k < 2; k++) {
        size_t chunk = k == 0 ? 7 : 0;
        check_gather(ctx, chunk);
        check_broadcast(ctx, chunk, off, n);
        check_broadcast(ctx, chunk, (size_t)rank * 300, 250 + (size_t)rank); /* across shards */
    }
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
