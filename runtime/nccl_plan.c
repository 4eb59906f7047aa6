/* nccl_plan.c - the NCCL calls of libddp's collectives as plans (nccl_plan.h): kinds, offsets,
 * counts, roots and in-place flags, computed without NCCL so that every build (CPU too) has them
 * and the CPU tests reach them; comm_nccl.c issues them.
 */
#include <stdint.h>
#include <stdlib.h>

#include "nccl_plan.h"

/* The send pointer of call c in elements from the start of the caller's recv, when known: the
 * call takes it in recv, or the caller's buffers are in their in-place form, where send starts
 * at send_at of recv. 0 when it is in a buffer of its own. */
static int send_in_recv(const nccl_call *c, int in_place, size_t send_at, size_t *at)
{
    if (c->send_buf == NCCL_BUF_RECV)
        *at = c->send_off;
    else if (in_place)
        *at = send_at + c->send_off;
    else
        return 0;
    return 1;
}

/* Whether NCCL sees call c of rank `rank` as in place (the rules of nccl_plan.h). */
static int call_in_place(const nccl_call *c, int rank, int in_place, size_t send_at)
{
    size_t s = 0, r = c->recv_off;
    if (!send_in_recv(c, in_place, send_at, &s))
        return 0;
    switch (c->kind) {
    case NCCL_CALL_REDUCE_SCATTER: return r == s + (size_t)rank * c->count;
    case NCCL_CALL_ALLGATHER: return s == r + (size_t)rank * c->count;
    default: return s == r; /* ncclAllReduce, ncclReduce, ncclBroadcast */
    }
}

static void plan_flag_in_place(nccl_plan *plan, int rank, int in_place, size_t send_at)
{
    for (int i = 0; i < plan->n_calls; i++)
        plan->calls[i].in_place = call_in_place(&plan->calls[i], rank, in_place, send_at);
}

/* Room for n_calls calls (zeroed); DDP_ERR_NOMEM (logged) when there is none. */
static ddp_status plan_alloc(nccl_plan *plan, int n_calls, int grouped)
{
    plan->grouped = grouped;
    if (n_calls == 0)
        return DDP_OK;
    plan->calls = calloc((size_t)n_calls, sizeof *plan->calls);
    if (!plan->calls) {
        DDP_ERROR("out of memory for a plan of %d NCCL calls", n_calls);
        return DDP_ERR_NOMEM;
    }
    plan->n_calls = n_calls;
    return DDP_OK;
}

/* The arguments of a per-rank plan (fn names the function in the log); empties *plan. */
static ddp_status plan_check_ranks(const char *fn, const size_t *counts, int world, int rank,
                                   int in_place, nccl_plan *plan)
{
    if (!plan) {
        DDP_ERROR("%s: plan is NULL", fn);
        return DDP_ERR_INVALID_ARG;
    }
    *plan = (nccl_plan){0};
    const char *bad = world < 1                        ? "world < 1"
                      : rank < 0 || rank >= world      ? "rank outside [0, world)"
                      : in_place != 0 && in_place != 1 ? "in_place is neither 0 nor 1"
                      : !counts                        ? "counts is NULL"
                                                       : NULL;
    size_t total = 0;
    for (int q = 0; !bad && q < world; q++) {
        if (counts[q] > SIZE_MAX - total)
            bad = "the counts' sum overflows size_t";
        else
            total += counts[q];
    }
    if (bad)
        DDP_ERROR("%s: %s (world %d, rank %d, in_place %d)", fn, bad, world, rank, in_place);
    return bad ? DDP_ERR_INVALID_ARG : DDP_OK;
}

static int counts_equal(const size_t *counts, int world)
{
    for (int q = 1; q < world; q++)
        if (counts[q] != counts[0])
            return 0;
    return 1;
}

size_t nccl_plan_block_offset(const size_t *counts, int rank)
{
    size_t at = 0;
    for (int q = 0; counts && q < rank; q++)
        at += counts[q];
    return at;
}

ddp_status nccl_plan_allreduce_runs(const size_t *off, const size_t *len, int n_runs,
                                    nccl_plan *plan)
{
    if (!plan) {
        DDP_ERROR("nccl_plan_allreduce_runs: plan is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    *plan = (nccl_plan){0};
    const char *bad = n_runs < 0                      ? "n_runs < 0"
                      : n_runs > 0 && (!off || !len) ? "off or len is NULL"
                                                     : NULL;
    for (int i = 0; !bad && i < n_runs; i++)
        if (len[i] > SIZE_MAX - off[i])
            bad = "a run's end overflows size_t";
    if (bad) {
        DDP_ERROR("nccl_plan_allreduce_runs: %s (n_runs %d)", bad, n_runs);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = plan_alloc(plan, n_runs, n_runs != 1);
    for (int i = 0; st == DDP_OK && i < n_runs; i++)
        plan->calls[i] = (nccl_call){.kind = NCCL_CALL_ALLREDUCE, .send_buf = NCCL_BUF_RECV,
                                     .send_off = off[i], .recv_off = off[i], .count = len[i],
                                     .root = -1};
    if (st == DDP_OK)
        plan_flag_in_place(plan, 0, 1, 0);
    return st;
}

ddp_status nccl_plan_reduce_scatter(const size_t *counts, int world, int rank, int in_place,
                                    nccl_plan *plan)
{
    ddp_status st = plan_check_ranks("nccl_plan_reduce_scatter", counts, world, rank, in_place,
                                     plan);
    if (st != DDP_OK)
        return st;
    /* in place (recv == send), rank's result stays at its block's offset of the packed buffer */
    size_t recv_off = in_place ? nccl_plan_block_offset(counts, rank) : 0, at = 0;
    int equal = counts_equal(counts, world);
    st = plan_alloc(plan, equal ? 1 : world, !equal);
    if (st != DDP_OK)
        return st;
    if (equal)
        plan->calls[0] = (nccl_call){.kind = NCCL_CALL_REDUCE_SCATTER, .send_buf = NCCL_BUF_SEND,
                                     .recv_off = recv_off, .count = counts[0], .root = -1};
    for (int q = 0; !equal && q < world; q++) {
        plan->calls[q] = (nccl_call){.kind = NCCL_CALL_REDUCE, .send_buf = NCCL_BUF_SEND,
                                     .send_off = at, .recv_off = recv_off, .count = counts[q],
                                     .root = q};
        at += counts[q];
    }
    plan_flag_in_place(plan, rank, in_place, 0); /* in place, send is recv */
    return DDP_OK;
}

ddp_status nccl_plan_allgatherv(const size_t *counts, int world, int rank, int in_place,
                                nccl_plan *plan)
{
    ddp_status st = plan_check_ranks("nccl_plan_allgatherv", counts, world, rank, in_place, plan);
    if (st != DDP_OK)
        return st;
    int equal = counts_equal(counts, world);
    st = plan_alloc(plan, equal ? 1 : world, !equal);
    if (st != DDP_OK)
        return st;
    if (equal)
        plan->calls[0] = (nccl_call){.kind = NCCL_CALL_ALLGATHER, .send_buf = NCCL_BUF_SEND,
                                     .count = counts[0], .root = -1};
    size_t at = 0;
    for (int q = 0; !equal && q < world; q++) {
        /* the root sends its own block; the others pass their block of recv, which NCCL ignores */
        plan->calls[q] = (nccl_call){.kind = NCCL_CALL_BROADCAST,
                                     .send_buf = q == rank ? NCCL_BUF_SEND : NCCL_BUF_RECV,
                                     .send_off = q == rank ? 0 : at, .recv_off = at,
                                     .count = counts[q], .root = q};
        at += counts[q];
    }
    /* in place, send is this rank's block of recv */
    plan_flag_in_place(plan, rank, in_place, nccl_plan_block_offset(counts, rank));
    return DDP_OK;
}

ddp_status nccl_plan_allgatherv_runs(const size_t *off, int n_runs, const size_t *counts,
                                     int world, int rank, nccl_plan *plan)
{
    if (!plan) {
        DDP_ERROR("nccl_plan_allgatherv_runs: plan is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    *plan = (nccl_plan){0};
    if (n_runs < 0 || (n_runs > 0 && (!off || !counts))) {
        DDP_ERROR("nccl_plan_allgatherv_runs: %s (n_runs %d)",
                  n_runs < 0 ? "n_runs < 0" : "off or counts is NULL", n_runs);
        return DDP_ERR_INVALID_ARG;
    }
    nccl_plan *runs = calloc(n_runs > 0 ? (size_t)n_runs : 1, sizeof *runs);
    if (!runs) {
        DDP_ERROR("out of memory for the plans of %d runs", n_runs);
        return DDP_ERR_NOMEM;
    }
    ddp_status st = DDP_OK;
    int n_calls = 0;
    for (int i = 0; st == DDP_OK && i < n_runs; i++) {
        const size_t *c = counts + (size_t)i * (size_t)world;
        st = nccl_plan_allgatherv(c, world, rank, 1, &runs[i]);
        size_t end = st == DDP_OK ? nccl_plan_block_offset(c, world) : 0;
        if (st == DDP_OK && end > SIZE_MAX - off[i]) {
            DDP_ERROR("nccl_plan_allgatherv_runs: run %d's end overflows size_t", i);
            st = DDP_ERR_INVALID_ARG;
        }
        n_calls += st == DDP_OK ? runs[i].n_calls : 0;
    }
    if (st == DDP_OK)
        st = plan_alloc(plan, n_calls, n_calls != 1);
    for (int i = 0, k = 0; st == DDP_OK && i < n_runs; i++) {
        /* in place, this rank's block of run i is the run's send: everything is in recv */
        size_t mine = off[i] + nccl_plan_block_offset(counts + (size_t)i * (size_t)world, rank);
        for (int j = 0; j < runs[i].n_calls; j++, k++) {
            nccl_call c = runs[i].calls[j];
            c.send_off += c.send_buf == NCCL_BUF_SEND ? mine : off[i];
            c.send_buf = NCCL_BUF_RECV;
            c.recv_off += off[i];
            plan->calls[k] = c;
        }
    }
    if (st == DDP_OK)
        plan_flag_in_place(plan, rank, 1, 0);
    for (int i = 0; i < n_runs; i++)
        nccl_plan_free(&runs[i]);
    free(runs);
    if (st != DDP_OK)
        nccl_plan_free(plan);
    return st;
}

void nccl_plan_free(nccl_plan *plan)
{
    if (!plan)
        return;
    free(plan->calls);
    *plan = (nccl_plan){0};
}
