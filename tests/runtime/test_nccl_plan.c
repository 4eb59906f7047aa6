/* test_nccl_plan.c - the NCCL calls libddp plans (runtime/nccl_plan.c, issued by comm_nccl.c)
 * executed on a simulated NCCL. For world 1-8, every rank's plan of a reduce-scatter, an
 * all-gather(v) and a grouped all-reduce of runs is run on host buffers with NCCL's semantics,
 * and every rank's memory must then be the collective's definition (guards and untouched
 * elements included). Before running, NCCL's argument rules are checked in every call: the
 * in-place pointer relations of NCCL's user guide ("In-place Operations") equal the plan's flag,
 * out-of-place calls do not overlap their buffers, every rank makes the same calls (kind, count,
 * root) in the same grouping, roots lie in [0, world), no call of a group writes what another
 * reads or writes. Counts equal, unequal, zero, not multiples of 64; in place and out of place.
 * Then the refusals of bad arguments. No GPU and no NCCL are needed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "check.h"
#include "nccl_plan.h"

#define MAX_WORLD 8
#define GUARD 5          /* elements around each caller buffer, which no call may touch */
#define POISON (-100000) /* guards and the elements of recv a collective must overwrite */

typedef long long elem; /* rank r fills x[i] = r + i: sums are exact */

/* One rank's memory: the caller's buffers in one arena, a pointer an index in it. */
typedef struct rank_mem {
    elem *m;                /* (n) */
    elem *want;             /* (n): the collective's definition of the arena after the call */
    size_t n;
    size_t send_at, send_n; /* the caller's send: m[send_at .. send_at + send_n) */
    size_t recv_at, recv_n; /* the caller's recv */
    nccl_plan plan;
} rank_mem;

/* A call on one rank: its pointers and the elements NCCL reads and writes there. */
typedef struct span {
    size_t send, recv, n_read, n_write;
} span;

/* Buffers of send_n and recv_n elements; same: send lies in recv at send_in_recv (in-place
 * forms), else apart. Everything starts poisoned, each element with a value of its own. */
static void mem_layout(rank_mem *r, size_t send_n, size_t recv_n, int same, size_t send_in_recv)
{
    *r = (rank_mem){.n = GUARD + recv_n + GUARD + (same ? 0 : send_n + GUARD),
                    .recv_at = GUARD, .recv_n = recv_n, .send_n = send_n};
    r->send_at = same ? GUARD + send_in_recv : GUARD + recv_n + GUARD;
    r->m = malloc(r->n * sizeof *r->m);
    r->want = malloc(r->n * sizeof *r->want);
    for (size_t i = 0; i < r->n; i++)
        r->m[i] = POISON - (elem)i;
}

static void mem_free(rank_mem *mem, int world)
{
    for (int r = 0; r < world; r++) {
        free(mem[r].m);
        free(mem[r].want);
        nccl_plan_free(&mem[r].plan);
    }
}

static span call_span(const rank_mem *r, const nccl_call *c, int rank, int world)
{
    span s = {.send = (c->send_buf == NCCL_BUF_RECV ? r->recv_at : r->send_at) + c->send_off,
              .recv = r->recv_at + c->recv_off};
    size_t all = c->count * (size_t)world;
    int root = c->root == rank;
    switch (c->kind) {
    case NCCL_CALL_ALLREDUCE: s.n_read = s.n_write = c->count; break;
    case NCCL_CALL_REDUCE_SCATTER: s.n_read = all, s.n_write = c->count; break;
    case NCCL_CALL_REDUCE: s.n_read = c->count, s.n_write = root ? c->count : 0; break;
    case NCCL_CALL_ALLGATHER: s.n_read = c->count, s.n_write = all; break;
    case NCCL_CALL_BROADCAST: s.n_read = root ? c->count : 0, s.n_write = c->count; break;
    }
    return s;
}

/* NCCL's user guide, "In-place Operations", on the pointers of call c on rank `rank`. */
static int nccl_in_place(const nccl_call *c, span s, int rank)
{
    switch (c->kind) {
    case NCCL_CALL_REDUCE_SCATTER: return s.recv == s.send + (size_t)rank * c->count;
    case NCCL_CALL_ALLGATHER: return s.send == s.recv + (size_t)rank * c->count;
    default: return s.send == s.recv;
    }
}

static int overlap(size_t a, size_t na, size_t b, size_t nb)
{
    return na && nb && a < b + nb && b < a + na;
}

/* NCCL's rules for call i on every rank (the calls were checked to exist on all). */
static void check_call(const rank_mem *mem, int world, int i, const char *what)
{
    const nccl_call *c0 = &mem[0].plan.calls[i];
    for (int r = 0; r < world; r++) {
        const rank_mem *m = &mem[r];
        const nccl_call *c = &m->plan.calls[i];
        CHECK(c->kind == c0->kind && c->count == c0->count && c->root == c0->root,
              "%s: call %d on rank %d (kind %d, count %zu, root %d) differs from rank 0's", what,
              i, r, (int)c->kind, c->count, c->root);
        int rooted = c->kind == NCCL_CALL_REDUCE || c->kind == NCCL_CALL_BROADCAST;
        CHECK(rooted ? c->root >= 0 && c->root < world : c->root == -1,
              "%s: call %d: root %d", what, i, c->root);
        span s = call_span(m, c, r, world);
        size_t base = c->send_buf == NCCL_BUF_RECV ? m->recv_at : m->send_at;
        size_t end = c->send_buf == NCCL_BUF_RECV ? m->recv_at + m->recv_n : m->send_at + m->send_n;
        CHECK(s.send >= base && s.send + s.n_read <= end, "%s: call %d on rank %d reads outside "
              "its send buffer", what, i, r);
        CHECK(s.recv + s.n_write <= m->recv_at + m->recv_n, "%s: call %d on rank %d writes past "
              "recv", what, i, r);
        int in_place = nccl_in_place(c, s, r);
        CHECK(c->in_place == in_place, "%s: call %d on rank %d: plan says in_place %d, NCCL "
              "sees %d", what, i, r, c->in_place, in_place);
        CHECK(in_place || !overlap(s.send, s.n_read, s.recv, s.n_write), "%s: call %d on rank "
              "%d is out of place but its buffers overlap", what, i, r);
    }
}

/* In a group NCCL may run the calls in any order: none may write what another touches. */
static void check_hazards(const rank_mem *mem, int world, const char *what)
{
    for (int r = 0; r < world; r++)
        for (int i = 0; i < mem[r].plan.n_calls; i++)
            for (int j = i + 1; j < mem[r].plan.n_calls; j++) {
                span a = call_span(&mem[r], &mem[r].plan.calls[i], r, world);
                span b = call_span(&mem[r], &mem[r].plan.calls[j], r, world);
                CHECK(!overlap(a.recv, a.n_write, b.recv, b.n_write) &&
                          !overlap(a.recv, a.n_write, b.send, b.n_read) &&
                          !overlap(a.send, a.n_read, b.recv, b.n_write),
                      "%s: calls %d and %d of a group touch the same elements on rank %d", what,
                      i, j, r);
            }
}

/* Call i of every rank, as NCCL defines it: every read done before any write. */
static void run_call(rank_mem *mem, int world, int i)
{
    const nccl_call *c = &mem[0].plan.calls[i];
    size_t n = c->count, all = n * (size_t)world;
    span s[MAX_WORLD];
    for (int r = 0; r < world; r++)
        s[r] = call_span(&mem[r], &mem[r].plan.calls[i], r, world);
    elem *tmp = calloc(all + 1, sizeof *tmp); /* (world * count) */
    /* Reads. All-gather: rank q's send at block q. Else sums of element k over the ranks that
     * read: all-reduce, reduce and reduce-scatter (element k of the send: rank k / n's block);
     * broadcast: the root's alone. */
    for (int q = 0; q < world; q++)
        for (size_t k = 0; k < s[q].n_read; k++) {
            elem v = mem[q].m[s[q].send + k];
            if (c->kind == NCCL_CALL_ALLGATHER)
                tmp[(size_t)q * n + k] = v;
            else
                tmp[k] += v;
        }
    for (int r = 0; r < world; r++) /* writes */
        for (size_t k = 0; k < s[r].n_write; k++) {
            size_t from = c->kind == NCCL_CALL_REDUCE_SCATTER ? (size_t)r * n + k : k;
            mem[r].m[s[r].recv + k] = tmp[from];
        }
    free(tmp);
}

/* Checks the plans' agreement and NCCL's rules, then runs them; 0 (nothing run) on a broken
 * rule, whose results would be undefined. */
static int run_plans(rank_mem *mem, int world, const char *what)
{
    int before = check_failures_;
    for (int r = 1; r < world; r++)
        CHECK(mem[r].plan.n_calls == mem[0].plan.n_calls &&
                  mem[r].plan.grouped == mem[0].plan.grouped,
              "%s: rank %d plans %d calls (grouped %d), rank 0 %d (grouped %d)", what, r,
              mem[r].plan.n_calls, mem[r].plan.grouped, mem[0].plan.n_calls, mem[0].plan.grouped);
    if (check_failures_ != before)
        return 0;
    for (int i = 0; i < mem[0].plan.n_calls; i++)
        check_call(mem, world, i, what);
    if (mem[0].plan.grouped)
        check_hazards(mem, world, what);
    CHECK(mem[0].plan.grouped || mem[0].plan.n_calls <= 1, "%s: %d calls not grouped", what,
          mem[0].plan.n_calls);
    if (check_failures_ != before)
        return 0;
    for (int i = 0; i < mem[0].plan.n_calls; i++)
        run_call(mem, world, i);
    return 1;
}

/* Every rank's arena against its definition; prints the first few wrong elements. */
static void check_outcome(const rank_mem *mem, int world, const char *what)
{
    for (int r = 0; r < world; r++) {
        int bad = 0;
        for (size_t i = 0; i < mem[r].n; i++)
            if (mem[r].m[i] != mem[r].want[i] && bad++ < 3)
                fprintf(stderr, "%s: rank %d, element %td of recv: got %lld, want %lld\n", what,
                        r, (ptrdiff_t)i - (ptrdiff_t)mem[r].recv_at, mem[r].m[i],
                        mem[r].want[i]);
        CHECK(bad == 0, "%s: rank %d: %d element(s) wrong", what, r, bad);
    }
}

static void describe(char *what, size_t size, const char *name, const size_t *counts,
                     int world, int in_place)
{
    int at = snprintf(what, size, "%s, world %d, counts {", name, world);
    for (int q = 0; q < world && at > 0 && (size_t)at < size; q++)
        at += snprintf(what + at, size - (size_t)at, q ? ",%zu" : "%zu", counts[q]);
    if (at > 0 && (size_t)at < size)
        snprintf(what + at, size - (size_t)at, "}, %s", in_place ? "in place" : "out of place");
}

/* The plan's shape as nccl_plan.h states it: one call when the counts are equal, else one
 * grouped call of `rooted` per rank. */
static void check_shape(const nccl_plan *p, const size_t *counts, int world, nccl_call_kind one,
                        nccl_call_kind rooted, const char *what)
{
    int equal = 1;
    for (int q = 1; q < world; q++)
        equal = equal && counts[q] == counts[0];
    if (equal)
        CHECK(p->n_calls == 1 && !p->grouped && p->calls[0].kind == one,
              "%s: want one ungrouped call of kind %d", what, (int)one);
    else
        CHECK(p->n_calls == world && p->grouped && p->calls[0].kind == rooted,
              "%s: want %d grouped calls of kind %d", what, world, (int)rooted);
}

static int counts_all_equal(const size_t *counts, int world)
{
    for (int q = 1; q < world; q++)
        if (counts[q] != counts[0])
            return 0;
    return 1;
}

static size_t sum_of(const size_t *counts, int n)
{
    size_t t = 0;
    for (int q = 0; q < n; q++)
        t += counts[q];
    return t;
}

/* Reduce-scatter: rank q's result is the sum over ranks of block q, sum_r (r + i) for element
 * i of the packed buffer; in place it lies at block q of the packed buffer, the rest unchanged. */
static void case_reduce_scatter(const size_t *counts, int world, int in_place)
{
    char what[200];
    describe(what, sizeof what, "reduce-scatter", counts, world, in_place);
    rank_mem mem[MAX_WORLD];
    size_t total = sum_of(counts, world);
    for (int r = 0; r < world; r++) {
        rank_mem *m = &mem[r];
        size_t mine = sum_of(counts, r);
        mem_layout(m, total, in_place ? total : counts[r], in_place, 0);
        for (size_t i = 0; i < total; i++)
            m->m[m->send_at + i] = r + (elem)i;
        memcpy(m->want, m->m, m->n * sizeof *m->m);
        size_t out = m->recv_at + (in_place ? mine : 0);
        for (size_t k = 0; k < counts[r]; k++)
            m->want[out + k] = (elem)world * (elem)(mine + k) + world * (world - 1) / 2;
        CHECK(nccl_plan_reduce_scatter(counts, world, r, in_place, &m->plan) == DDP_OK, "%s: "
              "refused", what);
        check_shape(&m->plan, counts, world, NCCL_CALL_REDUCE_SCATTER, NCCL_CALL_REDUCE, what);
    }
    if (run_plans(mem, world, what))
        check_outcome(mem, world, what);
    mem_free(mem, world);
}

/* All-gather(v): every rank's recv is every rank's block in rank order; rank q's block holds
 * q + i at element i of the packed buffer. Out of place recv starts poisoned; in place only
 * this rank's block holds its values. */
static void case_allgatherv(const size_t *counts, int world, int in_place)
{
    char what[200];
    describe(what, sizeof what, "all-gather(v)", counts, world, in_place);
    rank_mem mem[MAX_WORLD];
    size_t total = sum_of(counts, world);
    for (int r = 0; r < world; r++) {
        rank_mem *m = &mem[r];
        size_t mine = sum_of(counts, r);
        mem_layout(m, counts[r], total, in_place, mine);
        for (size_t j = 0; j < counts[r]; j++)
            m->m[m->send_at + j] = r + (elem)(mine + j);
        memcpy(m->want, m->m, m->n * sizeof *m->m);
        for (size_t q = 0, at = 0; q < (size_t)world; at += counts[q], q++)
            for (size_t j = 0; j < counts[q]; j++)
                m->want[m->recv_at + at + j] = (elem)(q + at + j);
        CHECK(nccl_plan_allgatherv(counts, world, r, in_place, &m->plan) == DDP_OK, "%s: "
              "refused", what);
        check_shape(&m->plan, counts, world, NCCL_CALL_ALLGATHER, NCCL_CALL_BROADCAST, what);
    }
    if (run_plans(mem, world, what))
        check_outcome(mem, world, what);
    mem_free(mem, world);
}

/* All-reduce of runs of a buffer of n elements: each run summed over ranks, the rest as it was. */
static void case_runs(const size_t *off, const size_t *len, int n_runs, size_t n, int world,
                      const char *name)
{
    char what[200];
    snprintf(what, sizeof what, "all-reduce of runs (%s), world %d", name, world);
    rank_mem mem[MAX_WORLD];
    for (int r = 0; r < world; r++) {
        rank_mem *m = &mem[r];
        mem_layout(m, n, n, 1, 0);
        for (size_t i = 0; i < n; i++)
            m->m[m->recv_at + i] = r + (elem)i;
        memcpy(m->want, m->m, m->n * sizeof *m->m);
        for (int j = 0; j < n_runs; j++)
            for (size_t i = off[j]; i < off[j] + len[j]; i++)
                m->want[m->recv_at + i] = (elem)world * (elem)i + world * (world - 1) / 2;
        CHECK(nccl_plan_allreduce_runs(off, len, n_runs, &m->plan) == DDP_OK, "%s: refused",
              what);
        CHECK(m->plan.n_calls == n_runs && m->plan.grouped == (n_runs != 1), "%s: %d calls, "
              "grouped %d", what, m->plan.n_calls, m->plan.grouped);
        for (int j = 0; j < m->plan.n_calls; j++)
            CHECK(m->plan.calls[j].kind == NCCL_CALL_ALLREDUCE && m->plan.calls[j].in_place,
                  "%s: call %d is not an in-place ncclAllReduce", what, j);
    }
    if (run_plans(mem, world, what))
        check_outcome(mem, world, what);
    mem_free(mem, world);
}

/* The in-place all-gather(v) of runs of a buffer of n elements (the ZeRO gather of a bucket):
 * rank r starts with its block of each run (run i's blocks counts[i * world + q] packed from
 * off[i]; rank q's holds q + element index), everything else poisoned alike on every rank; after
 * it every rank holds every block, the elements outside the runs unchanged. */
static void case_gather_runs(const size_t *off, const size_t *counts, int n_runs, size_t n,
                             int world, const char *name)
{
    char what[200];
    snprintf(what, sizeof what, "all-gather of runs (%s), world %d", name, world);
    rank_mem mem[MAX_WORLD];
    int calls = 0;
    for (int i = 0; i < n_runs; i++)
        calls += counts_all_equal(counts + (size_t)i * (size_t)world, world) ? 1 : world;
    for (int r = 0; r < world; r++) {
        rank_mem *m = &mem[r];
        mem_layout(m, n, n, 1, 0);
        memcpy(m->want, m->m, m->n * sizeof *m->m);
        for (int i = 0; i < n_runs; i++) {
            const size_t *c = counts + (size_t)i * (size_t)world;
            for (size_t q = 0, at = off[i]; q < (size_t)world; at += c[q], q++)
                for (size_t j = at; j < at + c[q]; j++) {
                    m->want[m->recv_at + j] = (elem)(q + j);
                    if (q == (size_t)r)
                        m->m[m->recv_at + j] = (elem)(q + j);
                }
        }
        CHECK(nccl_plan_allgatherv_runs(off, n_runs, counts, world, r, &m->plan) == DDP_OK,
              "%s: refused", what);
        CHECK(m->plan.n_calls == calls && m->plan.grouped == (calls != 1), "%s: %d calls "
              "(want %d), grouped %d", what, m->plan.n_calls, calls, m->plan.grouped);
        for (int j = 0; j < m->plan.n_calls; j++)
            CHECK(m->plan.calls[j].in_place && m->plan.calls[j].send_buf == NCCL_BUF_RECV,
                  "%s: call %d is not in place in the one buffer", what, j);
    }
    if (run_plans(mem, world, what))
        check_outcome(mem, world, what);
    mem_free(mem, world);
}

/* Block counts of rank q of `world` for pattern p: equal, unequal, zeros, not multiples of 64. */
static size_t pattern_count(int p, int q, int world)
{
    static const size_t pool[] = {1, 63, 65, 127, 0, 64, 2, 129};
    switch (p) {
    case 0: return 1;
    case 1: return 63;
    case 2: return 127;
    case 3: return 0;                             /* equal and empty */
    case 4: return pool[q % 8];                   /* a zero at rank 4 */
    case 5: return pool[(q + 3) % 8];             /* a zero at rank 1 */
    case 6: return q % 2 ? 0 : 65;                /* every other rank empty */
    case 7: return q == world - 1 ? 0 : 63;       /* the last rank empty */
    case 8: return q == 0 ? 0 : 1 + 64 * (size_t)q; /* the first rank empty */
    default: return q == world / 2 ? 65 : 0;      /* one rank holds everything */
    }
}

#define N_PATTERNS 10

static void test_collectives(void)
{
    for (int world = 1; world <= MAX_WORLD; world++)
        for (int p = 0; p < N_PATTERNS; p++) {
            size_t counts[MAX_WORLD];
            for (int q = 0; q < world; q++)
                counts[q] = pattern_count(p, q, world);
            for (int in_place = 0; in_place <= 1; in_place++) {
                case_reduce_scatter(counts, world, in_place);
                case_allgatherv(counts, world, in_place);
            }
        }
}

static void test_runs(void)
{
    static const size_t whole_off[] = {0}, whole_len[] = {400};
    static const size_t mid_off[] = {37}, mid_len[] = {65};
    /* touching runs, an empty run, gaps, lengths 1, 63, 65, 127 */
    static const size_t mix_off[] = {0, 1, 70, 70, 200}, mix_len[] = {1, 63, 0, 65, 127};
    static const size_t ones_off[] = {1, 3, 5, 7, 9, 11, 13, 399};
    static const size_t ones_len[] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int world = 1; world <= MAX_WORLD; world++) {
        case_runs(whole_off, whole_len, 1, 400, world, "one run of the whole buffer");
        case_runs(mid_off, mid_len, 1, 400, world, "one run inside");
        case_runs(mix_off, mix_len, 5, 400, world, "runs of 1, 63, 0, 65, 127");
        case_runs(ones_off, ones_len, 8, 400, world, "8 runs of 1");
        case_runs(NULL, NULL, 0, 400, world, "no run");
    }
}

/* ---- refusals -------------------------------------------------------------------------------- */

/* kind 0: reduce-scatter, 1: all-gather(v), 2: all-reduce of runs (counts as off and len). */
static void expect_refused(int kind, const size_t *counts, int world, int rank, int in_place,
                           int null_plan, const char *reason)
{
    nccl_plan plan = {.grouped = 7, .n_calls = 3, .calls = (nccl_call *)&plan};
    nccl_plan *p = null_plan ? NULL : &plan;
    char text[2048];
    capture c;
    capture_begin(&c);
    ddp_status st = kind == 0   ? nccl_plan_reduce_scatter(counts, world, rank, in_place, p)
                    : kind == 1 ? nccl_plan_allgatherv(counts, world, rank, in_place, p)
                                : nccl_plan_allreduce_runs(counts, counts, world, p);
    capture_end(&c, text, sizeof text);
    CHECK(st == DDP_ERR_INVALID_ARG, "kind %d, %s: got \"%s\"", kind, reason, ddp_strerror(st));
    CHECK(strstr(text, reason) != NULL, "kind %d: log lacks \"%s\"; it says: %s", kind, reason,
          text);
    CHECK(null_plan || (plan.n_calls == 0 && plan.calls == NULL && plan.grouped == 0),
          "kind %d, %s: the plan is not empty", kind, reason);
}

static void test_refusals(void)
{
    const size_t counts[2] = {3, 4}, huge[2] = {SIZE_MAX, 1};
    for (int kind = 0; kind <= 1; kind++) {
        expect_refused(kind, counts, 0, 0, 0, 0, "world < 1");
        expect_refused(kind, counts, -3, 0, 0, 0, "world < 1");
        expect_refused(kind, counts, 2, -1, 0, 0, "rank outside [0, world)");
        expect_refused(kind, counts, 2, 2, 0, 0, "rank outside [0, world)");
        expect_refused(kind, counts, 2, 0, 2, 0, "in_place is neither 0 nor 1");
        expect_refused(kind, NULL, 2, 0, 0, 0, "counts is NULL");
        expect_refused(kind, huge, 2, 1, 0, 0, "overflows size_t");
        expect_refused(kind, counts, 2, 0, 0, 1, "plan is NULL");
    }
    expect_refused(2, counts, -1, 0, 0, 0, "n_runs < 0");
    expect_refused(2, NULL, 2, 0, 0, 0, "off or len is NULL");
    expect_refused(2, huge, 1, 0, 0, 0, "a run's end overflows size_t");
    expect_refused(2, counts, 1, 0, 0, 1, "plan is NULL");
    nccl_plan_free(NULL);
    nccl_plan empty = {0};
    nccl_plan_free(&empty);
    CHECK(nccl_plan_block_offset(NULL, 3) == 0 && nccl_plan_block_offset(counts, 0) == 0 &&
              nccl_plan_block_offset(counts, 2) == 7,
          "nccl_plan_block_offset");
}

/* Buckets of several runs, each run cut at the shard boundaries: equal and unequal blocks, empty
 * blocks and an empty run, in one group. */
static void test_gather_runs(void)
{
    for (int world = 1; world <= MAX_WORLD; world++) {
        size_t counts[4 * MAX_WORLD], off[4];
        int patterns[4] = {1, 4, 3, 8}; /* 63 each; unequal with a zero; all empty; first empty */
        size_t at = 3;
        for (int i = 0; i < 4; i++) {
            off[i] = at;
            for (int q = 0; q < world; q++)
                at += counts[i * world + q] = pattern_count(patterns[i], q, world);
            at += 7; /* a gap between runs */
        }
        case_gather_runs(off, counts, 1, at, world, "one run of equal blocks");
        case_gather_runs(off + 1, counts + world, 1, at, world, "one run of unequal blocks");
        case_gather_runs(off, counts, 4, at, world, "4 runs: equal, unequal, empty, first empty");
        case_gather_runs(NULL, NULL, 0, at, world, "no run");
    }
    const size_t counts[2] = {3, 4};
    nccl_plan plan = {.grouped = 7};
    char text[2048];
    capture c;
    capture_begin(&c);
    ddp_status neg = nccl_plan_allgatherv_runs(counts, -1, counts, 2, 0, &plan);
    ddp_status null = nccl_plan_allgatherv_runs(NULL, 1, counts, 2, 0, &plan);
    ddp_status rank = nccl_plan_allgatherv_runs(counts, 1, counts, 2, 2, &plan);
    capture_end(&c, text, sizeof text);
    CHECK(neg == DDP_ERR_INVALID_ARG && null == DDP_ERR_INVALID_ARG &&
              rank == DDP_ERR_INVALID_ARG && plan.n_calls == 0 && !plan.calls,
          "all-gather of runs: bad arguments refused, the plan empty");
    CHECK(strstr(text, "n_runs < 0") && strstr(text, "off or counts is NULL") &&
              strstr(text, "rank outside [0, world)"),
          "all-gather of runs: the log names each refusal; it says: %s", text);
}

int main(void)
{
    test_collectives();
    test_runs();
    test_refusals();
    test_gather_runs();
    return CHECK_DONE();
}
