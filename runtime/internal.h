/* internal.h - declarations shared by libddp's own source files (never installed, never used by
 * programs: they use ddp.h; the models' compute is in models/ops/).
 */
#ifndef DDP_INTERNAL_H
#define DDP_INTERNAL_H

#include <stddef.h>

#include "device.h"
#include "ddp.h"

/* ---- communication: one interface, two implementations (comm_mpi.c, comm_nccl.c) ---------- */

typedef struct ddp_comm ddp_comm;

typedef struct ddp_comm_ops {
    const char *name; /* "mpi" or "nccl" */
    /* dtype: any ddp_dtype the implementation supports (MPI: all; NCCL: all). */
    ddp_status (*allreduce)(ddp_comm *c, void *buf, size_t n, ddp_dtype dtype, ddp_reduce_op op);
    /* stream: CUDA only, the cudaStream_t the operation follows and its completion is ordered on
     * (NULL: the backend's stream); the MPI communicator ignores it. */
    ddp_status (*allreduce_start)(ddp_comm *c, void *buf, size_t n, ddp_dtype dtype,
                                  ddp_reduce_op op, void *stream, ddp_request **req);
    ddp_status (*wait)(ddp_request *req);
    ddp_status (*broadcast)(ddp_comm *c, void *buf, size_t n_bytes, int root);
    ddp_status (*allgather)(ddp_comm *c, const void *send, void *recv, size_t n_bytes);
    ddp_status (*barrier)(ddp_comm *c);
    void (*destroy)(ddp_comm *c);
} ddp_comm_ops;

struct ddp_comm {
    const ddp_comm_ops *ops;
    void *impl; /* implementation's state */
};

/* MPI over host memory. Non-blocking operations run in order on the communicator's own thread,
 * so they progress while the caller computes. */
ddp_status ddp_comm_mpi_create(ddp_comm **out);
/* NCCL over device memory, bootstrapped over MPI_COMM_WORLD (rank 0's unique id is broadcast).
 * DDP_ERR_UNSUPPORTED in a build without NCCL. */
ddp_status ddp_comm_nccl_create(int rank, int world_size, ddp_comm **out);

/* ---- the context --------------------------------------------------------------------------- */

struct ddp_ctx {
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank, n_nodes;
    char hostname[256];
    ddp_backend_kind backend; /* CPU or CUDA */
    int device;               /* CUDA ordinal or -1 */
    int threads;
    const ddp_device_ops *dev; /* backend memory: host or CUDA device */
    ddp_comm *comm;      /* collectives on backend memory */
    ddp_comm *host_comm; /* collectives on host memory (MPI); equals comm on the CPU backend */
    int owns_mpi;        /* this context initialised MPI and finalises it */
    /* ddp_comm_stats counters, updated with atomic builtins (the reducer may start all-reduces
     * from any thread; plain types because the CUDA sources, C++, include this header too) */
    uint64_t allreduce_calls, allreduce_bytes;
    uint64_t host_allreduce_calls, host_allreduce_bytes;
};

/* The typed non-blocking all-reduce behind ddp_allreduce_start and the reducer: checks, counts
 * the payload in the stats, dispatches to ctx->comm. *req is NULL on failure. */
ddp_status ddp_allreduce_start_typed(ddp_ctx *ctx, void *buf, size_t n, ddp_dtype dtype,
                                     ddp_reduce_op op, void *stream, ddp_request **req);

/* Host-memory collectives used by the runtime itself (verification, checksums, broadcasts of
 * control data), whatever the backend. */
ddp_status ddp_host_allgather(ddp_ctx *ctx, const void *send, void *recv, size_t n_bytes);
ddp_status ddp_host_broadcast(ddp_ctx *ctx, void *buf, size_t n_bytes, int root);

/* Sets the rank shown in log prefixes (-1 before ddp_init knows it) and the host name. */
void ddp_log_set_identity(int rank, const char *hostname);

/* The deadline of every collective and wait, in seconds: DDP_TIMEOUT from the environment, 300
 * when unset. A value that is not a positive number is logged once and the default used. */
double ddp_timeout_seconds(void);

/* CRC-32 (zlib) of a buffer, used by checksums and checkpoints. */
uint32_t ddp_crc32(const void *data, size_t n_bytes);

#endif /* DDP_INTERNAL_H */
