/* nccl_plan.h - the NCCL calls libddp issues for a collective, as a plan computed without NCCL
 * (nccl_plan.c): comm_nccl.c issues exactly a plan's calls, and the CPU tests
 * (tests/runtime/test_nccl_plan.c) execute the plans of every rank on a simulated NCCL.
 *
 * A plan is one rank's list of calls, in the order they are issued, and whether they are issued
 * between ncclGroupStart and ncclGroupEnd (grouped: NCCL then matches call i of every rank with
 * call i of the others; a plan of one call is not grouped). The plans:
 *
 *   all-reduce of runs   one ncclAllReduce per run, in place, grouped unless there is one run.
 *   reduce-scatter       counts all equal: one ncclReduceScatter of counts[0], not grouped;
 *                        else one ncclReduce per rank q (root q, count counts[q], send block q),
 *                        grouped.
 *   all-gather(v)        counts all equal: one ncclAllGather of counts[0], not grouped;
 *                        else one ncclBroadcast per rank q (root q sends its block, every rank
 *                        receives it at block q of recv), grouped.
 *   all-gather of runs   the in-place all-gather(v) of each run of one buffer (the ZeRO
 *                        parameter gather of a bucket), every run's calls above in run order,
 *                        all in ONE group unless that makes a single call.
 *
 * Counts of 0 are planned like any other (NCCL accepts a count of 0 and the call still takes
 * part in the group's matching), so every rank's plan has the same calls.
 *
 * Buffers. The caller of a collective passes a send and a recv buffer (the all-reduce of runs
 * one buffer, its recv). A call's pointers are
 *     send pointer = (send_buf == NCCL_BUF_RECV ? recv : send) + send_off elements
 *     recv pointer = recv + recv_off elements.
 * The packed buffer of a reduce-scatter's input and an all-gather's output holds the ranks'
 * blocks in rank order: block q is counts[q] elements at offset counts[0] + ... + counts[q - 1].
 *
 * In place. A plan is built for one of the two forms of the caller's buffers (comm_ops in
 * internal.h): out of place (send and recv do not overlap) or in place (reduce-scatter:
 * recv == send; all-gather(v): send == this rank's block of recv). Each call's `in_place` says
 * whether NCCL sees that call as in place, by the rules of NCCL's user guide ("In-place
 * Operations"), applied to the call's pointers above:
 *     ncclAllReduce, ncclReduce, ncclBroadcast   send pointer == recv pointer
 *     ncclReduceScatter                          recv pointer == send pointer + rank * count
 *     ncclAllGather                              send pointer == recv pointer + rank * count
 * (for the root-less side of ncclReduce / ncclBroadcast NCCL ignores recv / send; the flag
 * still states the pointer relation). Out of place, a call whose pointers point into different
 * caller buffers is never in place.
 *
 * Every function checks its arguments: DDP_ERR_INVALID_ARG, with a DDP_ERROR line naming the
 * argument, for world < 1, rank outside [0, world), in_place other than 0 or 1, NULL counts
 * (or off / len with n_runs > 0), n_runs < 0, a NULL plan, or elements (the counts' or a run's
 * end) that overflow size_t; DDP_ERR_NOMEM (logged) when the calls cannot be allocated. On
 * failure *plan is empty (n_calls 0, calls NULL) and nccl_plan_free accepts it.
 */
#ifndef DDP_NCCL_PLAN_H
#define DDP_NCCL_PLAN_H

#include <stddef.h>

#include "ddp.h"

typedef enum nccl_call_kind {
    NCCL_CALL_ALLREDUCE,      /* ncclAllReduce */
    NCCL_CALL_REDUCE_SCATTER, /* ncclReduceScatter: count is recvcount (send: world * count) */
    NCCL_CALL_REDUCE,         /* ncclReduce to root */
    NCCL_CALL_ALLGATHER,      /* ncclAllGather: count is sendcount (recv: world * count) */
    NCCL_CALL_BROADCAST,      /* ncclBroadcast from root */
} nccl_call_kind;

/* The buffer a call's send pointer is taken in. */
typedef enum nccl_buf { NCCL_BUF_SEND, NCCL_BUF_RECV } nccl_buf;

typedef struct nccl_call {
    nccl_call_kind kind;
    nccl_buf send_buf; /* the caller's buffer send_off counts in */
    size_t send_off;   /* elements from the start of send_buf */
    size_t recv_off;   /* elements from the start of the caller's recv */
    size_t count;      /* NCCL's count argument (elements) */
    int root;          /* ncclReduce / ncclBroadcast: in [0, world); -1 for the others */
    int in_place;      /* 1 when NCCL sees the call as in place (rules above), else 0 */
} nccl_call;

typedef struct nccl_plan {
    int grouped;      /* 1: the calls go between ncclGroupStart and ncclGroupEnd */
    int n_calls;
    nccl_call *calls; /* (n_calls), in issue order; NULL when n_calls is 0 */
} nccl_plan;

/* The all-reduce of n_runs runs of one buffer: run i is elements [off[i], off[i] + len[i]);
 * one in-place ncclAllReduce per run (send_buf NCCL_BUF_RECV, send_off = recv_off = off[i]),
 * grouped unless n_runs == 1 (n_runs 0: an empty group, as comm_nccl.c always issued it).
 * DDP_OK, or the errors above. */
ddp_status nccl_plan_allreduce_runs(const size_t *off, const size_t *len, int n_runs,
                                    nccl_plan *plan);
/* Rank `rank`'s reduce-scatter over `world` ranks, counts (world) elements per block.
 * DDP_OK, or the errors above. */
ddp_status nccl_plan_reduce_scatter(const size_t *counts, int world, int rank, int in_place,
                                    nccl_plan *plan);
/* Rank `rank`'s all-gather(v) over `world` ranks, counts (world) elements per block.
 * DDP_OK, or the errors above. */
ddp_status nccl_plan_allgatherv(const size_t *counts, int world, int rank, int in_place,
                                nccl_plan *plan);
/* Rank `rank`'s in-place all-gather(v) of n_runs runs of one buffer: run i starts at element
 * off[i] and holds the blocks counts[i * world + q] (q = 0..world-1) packed in rank order, rank
 * q's block at its place in the run. The caller passes the buffer as recv (send is unused: every
 * call's send pointer is taken in recv, send_buf NCCL_BUF_RECV). Calls as nccl_plan_allgatherv's
 * for each run, offsets shifted by off[i]; grouped unless the plan has exactly one call.
 * DDP_OK, or the errors above (n_runs < 0; NULL off or counts with n_runs > 0). */
ddp_status nccl_plan_allgatherv_runs(const size_t *off, int n_runs, const size_t *counts,
                                     int world, int rank, nccl_plan *plan);
/* Block `rank`'s offset in the packed buffer: counts[0] + ... + counts[rank - 1]; 0 for
 * rank <= 0 or NULL counts. Reads rank entries of counts (rank < world is the caller's to
 * ensure); the sum wraps where the plan functions would refuse the counts. */
size_t nccl_plan_block_offset(const size_t *counts, int rank);
/* Frees the calls and empties the plan; NULL and an empty plan are ignored. */
void nccl_plan_free(nccl_plan *plan);

#endif /* DDP_NCCL_PLAN_H */
