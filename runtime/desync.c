/* desync.c - desync is an error, not a hang: before each collective of the MPI communicator the
 * ranks compare what they are about to call.
 *
 * Each rank hashes its call (operation, count, element type, reduce op, root, runs and their
 * lengths, per-rank counts: FNV-1a, 64 bits) into a signature, and the ranks all-reduce
 * {sig, ~sig} with MPI_MIN: the minimum of ~sig is the complement of the maximum of sig, so the
 * signatures are the same on every rank exactly when the two results are each other's
 * complement. One all-reduce of 16 bytes on the same communicator, just before the data
 * collective: mismatched calls never meet inside MPI, where they would hang, be cut short or
 * overrun a buffer. Every rank gets the same answer, so on a mismatch every rank goes on to one
 * all-gather of the calls (with host and sequence number) and rank 0 names the first rank whose
 * call differs from its own; then the job ends (watchdog_end_desync). Two calls that hash alike
 * but differ (a 2^-64 chance) are not caught.
 *
 * Lanes: each lane (the caller's blocking collectives, the communication thread's queued ones)
 * has its own MPI communicator and is checked on it, so a rank that issues a collective on one
 * lane while another rank issues it on the other is not caught here: both wait in different
 * checks until the watchdog's deadline names them. The NCCL communicator is not checked (a check
 * there would make the host wait for every rank at each enqueue); its host collectives are.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "desync.h"
#include "internal.h"
#include "try.h"

#define DESYNC_WHAT_LEN 24

/* One rank's call, as gathered after a mismatch. */
typedef struct desync_record {
    uint64_t sig, seq, count;
    int32_t dtype, op, root, n_runs;
    char what[DESYNC_WHAT_LEN];
    char host[64];
} desync_record;

/* FNV-1a over the 8 bytes of v, continuing from h. */
static uint64_t desync_mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        h = (h ^ (v & 0xffu)) * 0x100000001b3ull;
    return h;
}

static uint64_t desync_sig(const desync_call *c)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = c->what; *p; p++)
        h = desync_mix(h, (unsigned char)*p);
    h = desync_mix(h, (uint64_t)(int64_t)c->dtype);
    h = desync_mix(h, (uint64_t)(int64_t)c->op);
    h = desync_mix(h, (uint64_t)(int64_t)c->root);
    h = desync_mix(h, (uint64_t)(int64_t)c->n_runs);
    h = desync_mix(h, c->count);
    for (size_t i = 0; c->counts && i < c->n_counts; i++)
        h = desync_mix(h, (uint64_t)(int64_t)c->counts[i]);
    for (int i = 0; c->run_len && i < c->n_runs; i++)
        h = desync_mix(h, c->run_len[i]);
    return h;
}

/* "all-reduce of 1000 fp32 (sum)", "broadcast of 64 bytes from rank 0", "barrier". */
static void desync_describe(const desync_record *r, char *text, size_t n)
{
    static const char *const ops[] = {"sum", "avg", "max", "min"};
    int len = snprintf(text, n, "%.*s", DESYNC_WHAT_LEN, r->what);
    if (strcmp(r->what, "barrier") != 0 && (size_t)len < n)
        len += snprintf(text + len, n - (size_t)len, " of %llu %s", (unsigned long long)r->count,
                        r->dtype < 0 ? "bytes" : ddp_dtype_name((ddp_dtype)r->dtype));
    if (r->n_runs > 0 && (size_t)len < n)
        len += snprintf(text + len, n - (size_t)len, " in %d runs", (int)r->n_runs);
    if (r->op >= 0 && r->op < 4 && (size_t)len < n)
        len += snprintf(text + len, n - (size_t)len, " (%s)", ops[r->op]);
    if (r->root >= 0 && (size_t)len < n)
        snprintf(text + len, n - (size_t)len, " from rank %d", (int)r->root);
}

/* Rank 0's report: the first rank whose call differs from rank 0's, and how many do. */
static void desync_report(const desync_record *rec, int world, int lane)
{
    int first = -1, n_differ = 0;
    for (int r = 1; r < world; r++)
        if (rec[r].sig != rec[0].sig && n_differ++ == 0)
            first = r;
    if (first < 0)
        return; /* not reached: the all-reduce saw two signatures */
    char a[160], b[160], seq_b[40] = "";
    desync_describe(&rec[0], a, sizeof a);
    desync_describe(&rec[first], b, sizeof b);
    if (strcmp(a, b) == 0) /* the same totals: the per-rank counts or the runs differ */
        snprintf(b + strlen(b), sizeof b - strlen(b), " with other per-rank counts or runs");
    if (rec[first].seq != rec[0].seq)
        snprintf(seq_b, sizeof seq_b, " at its #%llu", (unsigned long long)rec[first].seq);
    DDP_ERROR("desync at collective #%llu on the %s lane: rank 0 (host %.64s) called %s, rank %d "
              "(host %.64s)%s called %s", (unsigned long long)rec[0].seq,
              lane == DDP_WATCH_ASYNC ? "communication thread's" : "caller", rec[0].host, a, first,
              rec[first].host, seq_b, b);
    DDP_ERROR("%d of %d ranks called another collective than rank 0 did; every rank must call the "
              "same collectives (operation, count, element type, reduce op, root) in the same "
              "order: look for one behind a condition or a size that differs between ranks; "
              "ending the job", n_differ, world);
}

/* The calls differ, which every rank knows: gather them, report (rank 0), end the job. */
static _Noreturn void desync_found(MPI_Comm comm, int lane, uint64_t seq, const desync_call *call,
                                   uint64_t sig)
{
    int rank = 0, world = 0;
    desync_record me = {.sig = sig, .seq = seq, .count = call->count, .dtype = call->dtype,
                        .op = call->op, .root = call->root, .n_runs = call->n_runs};
    snprintf(me.what, sizeof me.what, "%s", call->what);
    if (gethostname(me.host, sizeof me.host - 1) != 0)
        snprintf(me.host, sizeof me.host, "?");
    int ok = MPI_Comm_rank(comm, &rank) == MPI_SUCCESS &&
             MPI_Comm_size(comm, &world) == MPI_SUCCESS;
    desync_record *all = ok ? calloc((size_t)world, sizeof *all) : NULL;
    if (all && MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE,
                             comm) == MPI_SUCCESS) {
        if (rank == 0)
            desync_report(all, world, lane);
    } else {
        char text[160];
        desync_describe(&me, text, sizeof text);
        DDP_ERROR("desync at collective #%llu: the ranks called different collectives (this one "
                  "%s), and gathering the others' failed; ending the job",
                  (unsigned long long)seq, text);
    }
    watchdog_end_desync(lane);
}

ddp_status desync_check(MPI_Comm comm, int lane, uint64_t seq, const desync_call *call)
{
    ddp_status st = DDP_OK;
    uint64_t sig = desync_sig(call), in[2] = {sig, ~sig}, out[2];
    TRY_MPI_GOTO(MPI_Allreduce(in, out, 2, MPI_UINT64_T, MPI_MIN, comm));
    if (out[0] != ~out[1]) /* min(sig) != max(sig) */
        desync_found(comm, lane, seq, call, sig);
cleanup:
    return st;
}

/* DDP_DESYNC_CHECK here: 1 (on; also unset or empty), 0 (off), -1 invalid (logged). */
static int desync_env(void)
{
    const char *v = getenv("DDP_DESYNC_CHECK");
    if (!v || !*v || strcmp(v, "1") == 0)
        return 1;
    if (strcmp(v, "0") == 0)
        return 0;
    DDP_ERROR("DDP_DESYNC_CHECK='%s' is not 0 or 1 (1, the default: before each collective the "
              "ranks check that they call the same one): set it to 0 or 1 on every rank, or "
              "unset it", v);
    return -1;
}

ddp_status desync_agree(MPI_Comm comm, int *on)
{
    ddp_status st = DDP_OK;
    int rank = 0, world = 1, mine = desync_env();
    *on = 0;
    TRY_MPI(MPI_Comm_rank(comm, &rank));
    TRY_MPI(MPI_Comm_size(comm, &world));
    /* the highest rank (+1) that has it invalid, on, off */
    int in[3] = {mine < 0 ? rank + 1 : 0, mine == 1 ? rank + 1 : 0, mine == 0 ? rank + 1 : 0};
    int out[3] = {0, 0, 0};
    watch_enter(DDP_WATCH_CALLER, "desync-check agreement", -1, sizeof in);
    TRY_MPI_GOTO(MPI_Allreduce(in, out, 3, MPI_INT, MPI_MAX, comm));
    if (out[0] > 0) {
        if (mine >= 0 && rank == 0)
            DDP_ERROR("rank %d has an invalid DDP_DESYNC_CHECK (see its message); not starting",
                      out[0] - 1);
        st = DDP_ERR_ENV;
    } else if (out[1] > 0 && out[2] > 0) {
        if (rank == 0)
            DDP_ERROR("DDP_DESYNC_CHECK differs between ranks: on for rank %d, 0 for rank %d; "
                      "the check is a collective, so give every rank the same value (mpirun -x "
                      "DDP_DESYNC_CHECK, or export it before srun)", out[1] - 1, out[2] - 1);
        st = DDP_ERR_ENV;
    } else {
        *on = out[1] > 0 && world > 1;
    }
cleanup:
    watch_leave(DDP_WATCH_CALLER);
    return st;
}
