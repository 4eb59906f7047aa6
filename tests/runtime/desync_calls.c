/* desync_calls.c - ranks that call different collectives (the desync check, runtime/desync.c).
 * Usage: desync-calls MODE [BEFORE]: BEFORE (default 2) equal all-reduces of 8 floats first, then
 *   size    the last rank all-reduces 999 floats, the others 1000 (caller lane)
 *   op      the last rank's all-reduce is a max, the others' a sum
 *   dtype   the last rank all-reduces 1000 fp64 on the host, the others 1000 fp32
 *   async   the same sizes as `size`, started with ddp_allreduce_start (communication thread)
 *   kind    the last rank broadcasts 4000 bytes, the others all-reduce 1000 floats
 *   equal   every collective alike on every rank (all-reduce, started all-reduce, broadcast,
 *           all-gather, reduce-scatter, barrier); each result checked against its closed form
 *   mixed   DDP_DESYNC_CHECK=0 on rank 0 only (set here before ddp_init): ddp_init must fail
 * Prints "rank R: desynced call returned STATUS" if a mismatched call returns (which desync.sh
 * counts as a failure: the check must end the job first) and "rank R: all collectives passed"
 * after `equal`. Exit 0 when every call it made succeeded (and every result was right), else 1;
 * 2 when ddp_init failed. Run by desync.sh.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

#define N_ELEMS 1000

/* Rank r fills x[i] = r + i; the sum over W ranks is W * i + W (W - 1) / 2. */
static int check_sum(const float *x, size_t n, int world, const char *what, int rank)
{
    for (size_t i = 0; i < n; i++) {
        float want = (float)world * (float)i + (float)(world * (world - 1) / 2);
        if (fabsf(x[i] - want) > 1e-3f * fabsf(want) + 1e-3f) {
            printf("rank %d: %s: element %zu is %g, want %g\n", rank, what, i, x[i], want);
            return 1;
        }
    }
    return 0;
}

static void fill(float *x, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rank + (int)i);
}

/* The mismatched call of `mode` (the last rank differs); its status. */
static ddp_status desynced_call(ddp_ctx *ctx, const char *mode, int odd, float *x, double *d)
{
    size_t n = odd && (strcmp(mode, "size") == 0 || strcmp(mode, "async") == 0) ? N_ELEMS - 1
                                                                                : N_ELEMS;
    if (strcmp(mode, "op") == 0)
        return ddp_allreduce(ctx, x, n, odd ? DDP_MAX : DDP_SUM);
    if (strcmp(mode, "dtype") == 0)
        return odd ? ddp_allreduce_host(ctx, d, n, DDP_FP64, DDP_SUM)
                   : ddp_allreduce_host(ctx, x, n, DDP_FP32, DDP_SUM);
    if (strcmp(mode, "kind") == 0)
        return odd ? ddp_broadcast(ctx, x, n * sizeof *x, 0) : ddp_allreduce(ctx, x, n, DDP_SUM);
    if (strcmp(mode, "async") == 0) {
        ddp_request *req = NULL;
        ddp_status st = ddp_allreduce_start(ctx, x, n, DDP_SUM, &req);
        return st == DDP_OK ? ddp_wait(req) : st;
    }
    return ddp_allreduce(ctx, x, n, DDP_SUM);
}

/* Every kind of collective, alike on every rank; 0 when each result is right. */
static int equal_calls(ddp_ctx *ctx, float *x, int rank, int world)
{
    float mine[N_ELEMS], *blocks = malloc((size_t)world * N_ELEMS * sizeof *blocks);
    ddp_request *req = NULL;
    int bad = !blocks;
    fill(x, N_ELEMS, rank);
    bad |= ddp_allreduce(ctx, x, N_ELEMS, DDP_SUM) != DDP_OK ||
           check_sum(x, N_ELEMS, world, "all-reduce", rank);
    fill(x, N_ELEMS, rank);
    bad |= ddp_allreduce_start(ctx, x, N_ELEMS, DDP_SUM, &req) != DDP_OK ||
           ddp_wait(req) != DDP_OK ||
           check_sum(x, N_ELEMS, world, "started all-reduce", rank);
    fill(x, N_ELEMS, rank);
    bad |= ddp_broadcast(ctx, x, N_ELEMS * sizeof *x, 0) != DDP_OK ||
           check_sum(x, N_ELEMS, 1, "broadcast from rank 0", rank);
    if (!blocks)
        return 1; /* the others wait in the all-gather until the deadline */
    fill(mine, N_ELEMS, rank);
    bad |= ddp_allgather(ctx, mine, blocks, sizeof mine) != DDP_OK;
    for (int q = 0; q < world; q++) /* rank q's block: q + i */
        bad |= blocks[(size_t)q * N_ELEMS + 1] != (float)(q + 1);
    for (int q = 0; q < world; q++)
        fill(blocks + (size_t)q * N_ELEMS, N_ELEMS, rank);
    bad |= ddp_reduce_scatter(ctx, blocks, mine, N_ELEMS, DDP_FP32, DDP_SUM, NULL) != DDP_OK ||
           check_sum(mine, N_ELEMS, world, "reduce-scatter", rank);
    bad |= ddp_barrier(ctx) != DDP_OK;
    free(blocks);
    return bad;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "equal";
    int before = argc > 2 ? atoi(argv[2]) : 2;
    const char *env_rank = getenv("OMPI_COMM_WORLD_RANK");
    if (strcmp(mode, "mixed") == 0 && env_rank && strcmp(env_rank, "0") == 0)
        setenv("DDP_DESYNC_CHECK", "0", 1);
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&opts, &ctx);
    if (st != DDP_OK) {
        printf("rank %s: ddp_init failed: %s\n", env_rank ? env_rank : "?", ddp_strerror(st));
        return 2;
    }
    int rank = ddp_rank(ctx), world = ddp_world_size(ctx), bad = 0;
    float x[N_ELEMS];
    double d[N_ELEMS] = {0};
    for (int i = 0; i < before; i++) {
        fill(x, 8, rank);
        bad |= ddp_allreduce(ctx, x, 8, DDP_SUM) != DDP_OK ||
               check_sum(x, 8, world, "warm-up", rank);
    }
    if (strcmp(mode, "equal") == 0) {
        bad |= equal_calls(ctx, x, rank, world);
        if (!bad)
            printf("rank %d: all collectives passed\n", rank);
    } else {
        fill(x, N_ELEMS, rank);
        st = desynced_call(ctx, mode, rank == world - 1, x, d);
        printf("rank %d: desynced call returned %s\n", rank, ddp_strerror(st));
        bad |= st != DDP_OK;
    }
    fflush(stdout);
    ddp_finalize(ctx);
    return bad;
}
