/* mpi_count.c - libddp-mpi-count.so, an MPI profiling interposer (LD_PRELOAD) that counts the
 * collectives a process calls, so that benchmarks/overhead.py can count a ddp-train step's
 * collectives (what the per-collective bookkeeping is paid on) instead of assuming them. Each
 * wrapper counts and passes the call on to its PMPI_ name; MPI_Finalize writes one line to
 * stderr: "mpi_count rank R: N collectives (A all-reduce, B broadcast, ...)". Non-blocking
 * collectives are not wrapped: libddp's CPU backend calls blocking ones (on its own thread).
 * Usage: mpirun -np 2 -x LD_PRELOAD=build/benchmarks/libddp-mpi-count.so ddp-train ...
 */
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>

enum { C_ALLREDUCE, C_BCAST, C_ALLGATHER, C_GATHER, C_REDUCE_SCATTER, C_REDUCE, C_BARRIER, C_N };
static const char *const names[C_N] = {"all-reduce", "broadcast",     "all-gather", "gather",
                                       "reduce-scatter", "reduce", "barrier"};
static _Atomic unsigned long counts[C_N];

#define COUNT(k) atomic_fetch_add_explicit(&counts[k], 1, memory_order_relaxed)

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
    COUNT(C_ALLREDUCE);
    return PMPI_Allreduce(s, r, n, t, op, c);
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{
    COUNT(C_BCAST);
    return PMPI_Bcast(b, n, t, root, c);
}

int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                  MPI_Comm c)
{
    COUNT(C_ALLGATHER);
    return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}

int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn,
                   const int *displs, MPI_Datatype rt, MPI_Comm c)
{
    COUNT(C_ALLGATHER);
    return PMPI_Allgatherv(s, sn, st, r, rn, displs, rt, c);
}

int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
               int root, MPI_Comm c)
{
    COUNT(C_GATHER);
    return PMPI_Gather(s, sn, st, r, rn, rt, root, c);
}

int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs,
                MPI_Datatype rt, int root, MPI_Comm c)
{
    COUNT(C_GATHER);
    return PMPI_Gatherv(s, sn, st, r, rn, displs, rt, root, c);
}

int MPI_Reduce_scatter(const void *s, void *r, const int *rn, MPI_Datatype t, MPI_Op op,
                       MPI_Comm c)
{
    COUNT(C_REDUCE_SCATTER);
    return PMPI_Reduce_scatter(s, r, rn, t, op, c);
}

int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c)
{
    COUNT(C_REDUCE);
    return PMPI_Reduce(s, r, n, t, op, root, c);
}

int MPI_Barrier(MPI_Comm c)
{
    COUNT(C_BARRIER);
    return PMPI_Barrier(c);
}

int MPI_Finalize(void)
{
    int rank = -1;
    unsigned long total = 0;
    char parts[256];
    int len = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int k = 0; k < C_N; k++) {
        unsigned long n = atomic_load(&counts[k]);
        total += n;
        if (n && len < (int)sizeof parts)
            len += snprintf(parts + len, sizeof parts - (size_t)len, "%s%lu %s", len ? ", " : "", n,
                            names[k]);
    }
    fprintf(stderr, "mpi_count rank %d: %lu collectives (%s)\n", rank, total, len ? parts : "none");
    return PMPI_Finalize();
}
