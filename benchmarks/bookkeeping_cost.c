/* bookkeeping_cost.c - ddp-bookkeeping-cost: what libddp's bookkeeping of collectives costs, by
 * its parts, measured in one process so that the machine's drift falls on both sides alike:
 *
 *   per collective: ddp_allreduce_host of 8 bytes (the loss's kind of call: the caller lane's
 *     sequence number and deadline, the desync check's all-reduce of 16 bytes, libddp's wrapper)
 *     against MPI_Allreduce of the same 8 bytes on MPI_COMM_WORLD (none of it);
 *   per step: a step of the straggler table (ddp_straggler_step_begin/step_end, a gather every
 *     5 steps, rank 0's judgement) against the same step without it.
 *
 * The two sides of each part run in alternating blocks (BLOCK calls, then BLOCK of the other, ROUNDS
 * times); each block's time per call is kept and the difference of the two sides' medians is the
 * part's cost. Run it with DDP_DESYNC_CHECK and DDP_WATCHDOG as the job would (the defaults: on).
 * A ddp-train step issues about 2 such collectives and one straggler step (benchmarks/overhead.py
 * multiplies them out against the models' step times, measured in the same run).
 * Output (rank 0): one line per part, then "cost_json {...}" for a script.
 * Usage: mpirun -np 2 ddp-bookkeeping-cost [ROUNDS [BLOCK]]   (default 41 rounds of 2,000)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "ddp.h"
#include "ddp_straggler.h"

enum { SIDE_BARE, SIDE_DDP };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One block of n calls on one side; returns microseconds per call (rank 0's clock, the ranks
 * lined up by a barrier first). part 0: collectives; part 1: steps of the straggler table. */
static double block(ddp_ctx *ctx, ddp_straggler *s, int part, int side, long n, long *step)
{
    double x = 1.0, t0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    if (part == 0 && side == SIDE_DDP) {
        for (long i = 0; i < n; i++)
            if (ddp_allreduce_host(ctx, &x, 1, DDP_FP64, DDP_SUM) != DDP_OK)
                ddp_abort(ctx, 1);
    } else if (part == 0 || side == SIDE_BARE) { /* a bare step: the same all-reduce */
        for (long i = 0; i < n; i++)
            MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    } else {
        ddp_straggler_step_begin(s);
        for (long i = 0; i < n; i++) {
            MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            if (ddp_straggler_step_end(s, ++*step, NULL) != DDP_OK)
                ddp_abort(ctx, 1);
        }
    }
    return (MPI_Wtime() - t0) * 1e6 / (double)n;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 41;
    long n = argc > 2 ? atol(argv[2]) : 2000;
    if (rounds < 1 || n < 10) {
        fprintf(stderr, "usage: ddp-bookkeeping-cost [ROUNDS >= 1 [BLOCK >= 10]]\n");
        return 2;
    }
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    ddp_straggler_opts so;
    ddp_straggler_opts_default(&so);
    so.out = NULL; /* the table's lines are not what is measured: ddp-train prints them rarely */
    ddp_straggler *s = NULL;
    double *t[2][2];
    for (int p = 0; p < 2; p++)
        for (int side = 0; side < 2; side++)
            t[p][side] = malloc((size_t)rounds * sizeof(double));
    if (ddp_straggler_create(ctx, &so, &s) != DDP_OK || !t[0][0] || !t[0][1] || !t[1][0] ||
        !t[1][1])
        ddp_abort(ctx, 1);
    long step = 0;
    for (int p = 0; p < 2; p++) {
        block(ctx, s, p, SIDE_DDP, n, &step); /* warm-up */
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < 2; k++) { /* the order alternates: bare first in even rounds */
                int side = (r + k) % 2 ? SIDE_DDP : SIDE_BARE;
                t[p][side][r] = block(ctx, s, p, side, n, &step);
            }
    }
    if (ddp_rank(ctx) == 0) {
        static const char *const what[2] = {"per collective (ddp_allreduce_host vs MPI_Allreduce)",
                                            "per step (the straggler table vs none)"};
        double cost[2];
        for (int p = 0; p < 2; p++) {
            double bare = median(t[p][SIDE_BARE], rounds), ddp = median(t[p][SIDE_DDP], rounds);
            cost[p] = ddp - bare;
            printf("%-56s %8.3f us (%.3f against %.3f us; %d rounds of %ld)\n", what[p], cost[p],
                   ddp, bare, rounds, n);
        }
        printf("cost_json {\"per_collective_us\":%.4f,\"per_step_us\":%.4f,\"ranks\":%d}\n",
               cost[0], cost[1], ddp_world_size(ctx));
    }
    ddp_straggler_destroy(s);
    for (int p = 0; p < 2; p++)
        for (int side = 0; side < 2; side++)
            free(t[p][side]);
    ddp_finalize(ctx);
    return 0;
}
