/* linkcheck.c - the start-up link check: bandwidth and latency from every rank to its ring
 * neighbours and to rank 0, by MPI ping-pong, and the nodes whose links are well below the rest.
 *
 * Pairs: ring edge r = (r, r+1 mod n) (one edge when n = 2) and root edge r = (r, 0) for r >= 1;
 * rank r initiates both of its edges, its partner echoes. Rounds run disjoint pairs at once, with a
 * barrier between rounds: even ring edges, odd ring edges, the wrap-around edge (n - 1, 0), then
 * one round per root edge (they all touch rank 0). Per pair: lat_reps 8-byte round trips, then
 * bw_reps round trips of bw_bytes; the fastest round trip counts:
 *   latency = rtt(8 B) / 2,   bandwidth = 2 * bw_bytes / rtt(bw_bytes)
 * Verdict: per node, its best inter-node link (the highest bandwidth of any measured pair with one
 * end on it and the other elsewhere); a node is slow when its best is under slow_ratio times the
 * median of the nodes' bests. One slow node makes every link it takes part in slow, while each of
 * its neighbours keeps at least one fast link, so only that node is named.
 */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define LINK_HOST 64

typedef struct link_row {
    double right_bw, right_lat; /* edge (r, r+1 mod n); bw in bytes/s, lat in s; -1: none */
    double root_bw, root_lat;   /* edge (r, 0); -1 on rank 0 */
    int node;
    char host[LINK_HOST];
} link_row;

typedef struct link_job {
    MPI_Comm comm;
    const ddp_link_check_opts *o;
    char *buf; /* bw_bytes */
} link_job;

void ddp_link_check_opts_default(ddp_link_check_opts *opts)
{
    *opts = (ddp_link_check_opts){.bw_bytes = (size_t)4 << 20, .bw_reps = 3, .lat_reps = 20,
                                  .slow_ratio = 0.5, .report = stdout};
}

static double link_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* reps round trips of n bytes with peer; the initiator returns the fastest in *rtt. */
static int link_pingpong(link_job *j, int peer, int initiator, int n, int reps, double *rtt)
{
    *rtt = 1e30;
    for (int k = 0; k < reps; k++) {
        double t0 = link_now();
        int rc = initiator
                     ? MPI_Send(j->buf, n, MPI_BYTE, peer, 1, j->comm) |
                           MPI_Recv(j->buf, n, MPI_BYTE, peer, 1, j->comm, MPI_STATUS_IGNORE)
                     : MPI_Recv(j->buf, n, MPI_BYTE, peer, 1, j->comm, MPI_STATUS_IGNORE) |
                           MPI_Send(j->buf, n, MPI_BYTE, peer, 1, j->comm);
        if (rc != MPI_SUCCESS)
            return -1;
        double dt = link_now() - t0;
        *rtt = dt < *rtt ? dt : *rtt;
    }
    return 0;
}

/* One pair: latency then bandwidth; the initiator fills bw and lat. */
static int link_measure(link_job *j, int peer, int initiator, double *bw, double *lat)
{
    double rtt_small, rtt_big;
    if (link_pingpong(j, peer, initiator, 8, 2 + j->o->lat_reps, &rtt_small) != 0 ||
        link_pingpong(j, peer, initiator, (int)j->o->bw_bytes, j->o->bw_reps, &rtt_big) != 0)
        return -1;
    if (initiator) {
        *lat = rtt_small / 2;
        *bw = 2.0 * (double)j->o->bw_bytes / rtt_big;
    }
    return 0;
}

/* My partner in ring round `round` (0 even edges, 1 odd edges, 2 the wrap edge), -1 for none;
 * *initiator: this rank owns the edge. */
static int link_ring_partner(int rank, int n, int round, int *initiator)
{
    int edges = n == 2 ? 1 : n; /* edge r = (r, r+1 mod n) */
    for (int r = 0; r < edges; r++) {
        int rnd = r == n - 1 ? 2 : r % 2;
        int a = r, b = (r + 1) % n;
        if (rnd != round || (rank != a && rank != b))
            continue;
        *initiator = rank == a;
        return rank == a ? b : a;
    }
    return -1;
}

/* All rounds; fills this rank's row. */
static int link_run_rounds(link_job *j, int rank, int n, link_row *me)
{
    int initiator = 0;
    for (int round = 0; round < 3; round++) {
        int peer = link_ring_partner(rank, n, round, &initiator);
        if (peer >= 0 && link_measure(j, peer, initiator, &me->right_bw, &me->right_lat) != 0)
            return -1;
        if (MPI_Barrier(j->comm) != MPI_SUCCESS)
            return -1;
    }
    for (int r = 1; r < n; r++) {
        int peer = rank == r ? 0 : rank == 0 ? r : -1;
        if (peer >= 0 && link_measure(j, peer, rank == r, &me->root_bw, &me->root_lat) != 0)
            return -1;
        if (MPI_Barrier(j->comm) != MPI_SUCCESS)
            return -1;
    }
    return 0;
}

static int link_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Raises best[node] with an inter-node link's bandwidth. */
static void link_offer(double *best, const link_row *rows, int a, int b, double bw)
{
    if (bw <= 0 || rows[a].node == rows[b].node)
        return;
    best[rows[a].node] = bw > best[rows[a].node] ? bw : best[rows[a].node];
    best[rows[b].node] = bw > best[rows[b].node] ? bw : best[rows[b].node];
}

/* Writes value * scale with width w into buf, or "-" when the pair was not measured (< 0). */
static const char *link_fmt(char *buf, size_t n, double value, double scale)
{
    if (value < 0)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.1f", value * scale);
    return buf;
}

static void link_print_table(FILE *f, const link_row *rows, int n)
{
    char c[6][32];
    fprintf(f, "link check: ping-pong to ring neighbours and rank 0 (bandwidth MB/s, latency us)\n");
    fprintf(f, "%5s %-16s %5s %9s %8s %9s %8s %9s %8s\n", "rank", "host", "node", "left_bw",
            "left_us", "right_bw", "right_us", "rank0_bw", "rank0_us");
    for (int r = 0; r < n; r++) {
        const link_row *l = &rows[(r + n - 1) % n], *m = &rows[r];
        int has_left = n > 2 || r == 1;
        fprintf(f, "%5d %-16.16s %5d %9s %8s %9s %8s %9s %8s\n", r, m->host, m->node,
                link_fmt(c[0], 32, has_left ? l->right_bw : -1, 1e-6),
                link_fmt(c[1], 32, has_left ? l->right_lat : -1, 1e6),
                link_fmt(c[2], 32, m->right_bw, 1e-6), link_fmt(c[3], 32, m->right_lat, 1e6),
                link_fmt(c[4], 32, m->root_bw, 1e-6), link_fmt(c[5], 32, m->root_lat, 1e6));
    }
}

/* Rank 0: the verdict; returns the number of slow nodes, -1 when out of memory. */
static int link_verdict(FILE *f, const link_row *rows, int n, int n_nodes, double ratio)
{
    double *best = calloc((size_t)n_nodes, sizeof *best), *sorted = calloc((size_t)n_nodes, sizeof *sorted);
    int slow = 0;
    if (!best || !sorted) {
        free(best);
        free(sorted);
        return -1;
    }
    for (int r = 0; r < n; r++) {
        link_offer(best, rows, r, (r + 1) % n, rows[r].right_bw);
        link_offer(best, rows, r, 0, r ? rows[r].root_bw : -1);
    }
    memcpy(sorted, best, (size_t)n_nodes * sizeof *sorted);
    qsort(sorted, (size_t)n_nodes, sizeof *sorted, link_cmp_double);
    double median = n_nodes % 2 ? sorted[n_nodes / 2] : (sorted[n_nodes / 2 - 1] + sorted[n_nodes / 2]) / 2;
    for (int node = 0; n_nodes > 2 && node < n_nodes; node++) {
        if (best[node] >= ratio * median)
            continue;
        const char *host = "?";
        for (int r = 0; r < n; r++)
            host = rows[r].node == node ? rows[r].host : host;
        if (f)
            fprintf(f, "link check: SLOW node %d (%s): its best link %.1f MB/s is under %.2f x the "
                       "median %.1f MB/s of the nodes' best links\n", node, host, best[node] / 1e6,
                    ratio, median / 1e6);
        slow++;
    }
    if (f && n_nodes <= 2)
        fprintf(f, "link check: %d node(s): a slow link cannot be pinned on one node; none named\n", n_nodes);
    else if (f && !slow)
        fprintf(f, "link check: no slow node (every node's best link >= %.2f x the median %.1f MB/s)\n",
                ratio, median / 1e6);
    free(best);
    free(sorted);
    return slow;
}

/* Gathers the rows to rank 0, which prints and judges; *n_slow broadcast. */
static ddp_status link_report(ddp_ctx *ctx, link_job *j, const link_row *me, int *n_slow)
{
    int n = ctx->world_size;
    link_row *rows = ctx->rank == 0 ? calloc((size_t)n, sizeof *rows) : NULL;
    int slow = 0;
    if (ctx->rank == 0 && !rows)
        slow = -1;
    if (MPI_Gather(me, (int)sizeof *me, MPI_BYTE, rows, (int)sizeof *me, MPI_BYTE, 0, j->comm) !=
        MPI_SUCCESS)
        slow = -2;
    if (rows && slow == 0) {
        if (j->o->report)
            link_print_table(j->o->report, rows, n);
        slow = link_verdict(j->o->report, rows, n, ctx->n_nodes, j->o->slow_ratio);
        if (j->o->report)
            fflush(j->o->report);
    }
    free(rows);
    if (MPI_Bcast(&slow, 1, MPI_INT, 0, j->comm) != MPI_SUCCESS || slow == -2)
        return DDP_ERR_MPI;
    if (slow < 0)
        return DDP_ERR_NOMEM;
    *n_slow = slow;
    return DDP_OK;
}

ddp_status ddp_link_check(ddp_ctx *ctx, const ddp_link_check_opts *opts, int *n_slow_nodes)
{
    ddp_link_check_opts def;
    ddp_link_check_opts_default(&def);
    const ddp_link_check_opts *o = opts ? opts : &def;
    if (!ctx || !n_slow_nodes || o->bw_bytes < 8 || o->bw_bytes > INT_MAX || o->bw_reps < 1 ||
        o->lat_reps < 1 || !(o->slow_ratio > 0)) {
        DDP_ERROR("ddp_link_check: need a context, n_slow_nodes, 8 <= bw_bytes <= INT_MAX, reps >= 1 "
                  "and slow_ratio > 0");
        return DDP_ERR_INVALID_ARG;
    }
    link_job j = {.comm = MPI_COMM_NULL, .o = o, .buf = calloc(1, o->bw_bytes)};
    link_row me = {.right_bw = -1, .right_lat = -1, .root_bw = -1, .root_lat = -1, .node = ctx->node_rank};
    snprintf(me.host, sizeof me.host, "%.63s", ctx->hostname);
    int ok = j.buf != NULL, all_ok = 0;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &j.comm) != MPI_SUCCESS)
        return DDP_ERR_MPI;
    ddp_status st = DDP_OK;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, j.comm) != MPI_SUCCESS)
        st = DDP_ERR_MPI;
    else if (!all_ok)
        st = DDP_ERR_NOMEM;
    else if (link_run_rounds(&j, ctx->rank, ctx->world_size, &me) != 0)
        st = DDP_ERR_MPI;
    if (st == DDP_OK)
        st = link_report(ctx, &j, &me, n_slow_nodes);
    MPI_Comm_free(&j.comm);
    free(j.buf);
    return st;
}
