/* desync.h - the desync check (desync.c), private to libddp's MPI communicator: before each of
 * its collectives the ranks compare what they are about to call, so that a rank calling another
 * collective (another operation, count, element type, reduce op or root) stops the job with an
 * error naming both calls instead of hanging or corrupting memory. C only (it needs MPI).
 */
#ifndef DDP_DESYNC_H
#define DDP_DESYNC_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

/* What a rank is about to call on one lane. */
typedef struct desync_call {
    const char *what;   /* the collective: "all-reduce", "broadcast", ... (the lane's label) */
    int dtype;          /* ddp_dtype, or -1: count is in bytes */
    int op;             /* ddp_reduce_op, or -1: none */
    int root;           /* broadcast's root, or -1 */
    int n_runs;         /* runs of one buffer (0: one buffer) */
    const size_t *run_len; /* an all-reduce of runs: each run's elements (n_runs), or NULL */
    uint64_t count;     /* elements (bytes when dtype is -1), all runs and all ranks' blocks */
    const int *counts;  /* per-rank counts of a reduce-scatter or all-gather(v), or NULL */
    size_t n_counts;
} desync_call;

/* Collective over comm (under the caller lane's deadline), once per MPI communicator: reads
 * DDP_DESYNC_CHECK on every rank (unset or 1: on, 0: off) and sets *on to the job's choice, off
 * in a job of one rank. DDP_ERR_ENV on every rank when the value is invalid on any rank (that
 * rank says why) or differs between ranks (rank 0 names two of them); DDP_ERR_MPI when the
 * exchange failed. *on is 0 on failure. */
ddp_status desync_agree(MPI_Comm comm, int *on);

/* Collective over comm, before the call it describes, inside the lane's watch_enter (seq its
 * sequence number): one all-reduce of 16 bytes. DDP_OK when every rank of comm describes the
 * same call; DDP_ERR_MPI (logged) when the check itself failed. When the calls differ it does
 * not return: rank 0 logs the sequence number and the first two ranks that differ, with their
 * hosts and calls, and the job ends (watchdog_end_desync). */
ddp_status desync_check(MPI_Comm comm, int lane, uint64_t seq, const desync_call *call);

/* watchdog.c: ends the job after a desync that every rank has seen at once, found on `lane`:
 * rank 0 (which has logged it) at once through the watchdog's end of a job (ABORT on the ring,
 * MPI_Abort); the other ranks leave the lane and wait for that for the watchdog's grace (2 s on
 * rank 1, 4 s on the others), then end the job themselves. */
_Noreturn void watchdog_end_desync(int lane);

#endif /* DDP_DESYNC_H */
