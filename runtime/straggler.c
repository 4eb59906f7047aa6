/* straggler.c - the straggler table (ddp_straggler.h): each rank times its steps' compute and
 * waits; every window the figures meet on rank 0, which judges each rank over the last two
 * windows against the median of the others and names those judged slow several times in a row.
 *
 * The waits: the reducer and ddp_allreduce_host bracket their blocking waits with
 * straggler_wait_begin/end (internal.h), which add to one process-wide counter while a table is
 * on; a step's wait is that counter's growth over the step. On the CUDA backend the reducer adds
 * its stream's waits, timed with CUDA events, through straggler_device_wait, and the steps are
 * timed on libddp's stream by an exposed_timer (reducer_cuda.h) between step_begin and step_end.
 */
#include <math.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "ddp_straggler.h"
#include "internal.h"
#include "reducer_cuda.h"
#include "try.h"

#define STRAG_HOST 64      /* bytes of a node name in the gathered table */
#define STRAG_SLOTS 16     /* CUDA: steps the host may run ahead of the device, timed */
#define STRAG_REMIND 10    /* evaluations between two reminders of the ranks still named */
#define STRAG_SHOWN 8      /* named ranks a table line shows; --metrics has them all */
#define STRAG_LOST_CORES 0.1 /* a CPU share under cpu_share is slow only this far (in cores)
                                under the others': a ratio of small CPU times is noise */

/* One rank's sums over a window, as gathered (milliseconds). */
typedef struct strag_row {
    double compute_ms, wait_ms, steps; /* the steps' compute and waits, and their count */
    double wall_ms, cpu_ms;            /* the window's wall time and the process's CPU time */
} strag_row;

struct ddp_straggler {
    ddp_ctx *ctx;
    ddp_straggler_opts o;
    int rank, world;
    /* the open step and window, every rank */
    int64_t step_t0, wait_t0;  /* the open step's start: clock and wait counter (ns) */
    int64_t win_t0, cpu_t0;    /* the open window's start: clock and process CPU time (ns) */
    strag_row open;
    int n;                     /* steps ended in the open window */
    long last_step;
    exposed_timer *timer;      /* CUDA: the steps on libddp's stream; NULL: host clocks */
    int cpu_backend;           /* the CPU time is judged (on CUDA the host waits for the GPU) */
    int64_t dev_wait_t0;       /* CUDA: the device wait counter at the window's start */
    double dev_ms, dev_steps;  /* CUDA: the steps whose events were read in the open window */
    /* rank 0 */
    char (*hosts)[STRAG_HOST]; /* (world) every rank's node */
    strag_row *rows[2];        /* (world) the last two windows, rows[cur] the newest */
    int cur, n_windows;
    strag_row *run;            /* (world) sums over the run */
    double *sorted, *ratio, *share, *lost; /* (world) scratch: sorted values, the span's
                                              ratios, the cores under the others' median */
    int *slow_run;             /* (world) evaluations in a row judged slow */
    char *was_named;           /* (world) scratch: named before this judgement */
    long *named_evals;         /* (world) evaluations named, over the run */
    int n_named, since_print;
    ddp_straggler_stats stats;
    char *json;
    size_t json_cap;
    int json_failed;
};

static atomic_int strag_on;
static atomic_llong strag_wait_ns, strag_dev_wait_ns;

static int64_t strag_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int straggler_on(void)
{
    return atomic_load_explicit(&strag_on, memory_order_relaxed);
}

int64_t straggler_wait_begin(void)
{
    return straggler_on() ? strag_clock(CLOCK_MONOTONIC) : 0;
}

void straggler_wait_end(int64_t begin)
{
    if (begin)
        atomic_fetch_add_explicit(&strag_wait_ns, strag_clock(CLOCK_MONOTONIC) - begin,
                                  memory_order_relaxed);
}

void straggler_device_wait(int64_t ns)
{
    if (straggler_on())
        atomic_fetch_add_explicit(&strag_dev_wait_ns, ns, memory_order_relaxed);
}

void ddp_straggler_opts_default(ddp_straggler_opts *opts)
{
    if (opts)
        *opts = (ddp_straggler_opts){.every = DDP_STRAGGLER_EVERY,
                                     .threshold = DDP_STRAGGLER_THRESHOLD,
                                     .cpu_share = DDP_STRAGGLER_CPU_SHARE,
                                     .times = DDP_STRAGGLER_TIMES, .out = stdout,
                                     .json_fd = -1};
}

static ddp_status strag_check(const ddp_ctx *ctx, const ddp_straggler_opts *o, ddp_straggler **out)
{
    const char *bad = !ctx ? "ctx is NULL" : !o ? "opts is NULL" : !out ? "out is NULL"
                      : o->every < 0 ? "every is negative (0 turns the table off)"
                      : !(o->threshold > 1.0) || !isfinite(o->threshold)
                          ? "threshold must be a finite number > 1 (1.5: 50 % over the median)"
                      : !(o->cpu_share >= 0.0 && o->cpu_share < 1.0)
                          ? "cpu_share must be in [0, 1) (0: not judged)"
                      : o->times < 1 ? "times must be >= 1" : NULL;
    if (bad) {
        DDP_ERROR("ddp_straggler_create: %s", bad);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

void ddp_straggler_destroy(ddp_straggler *s)
{
    if (!s)
        return;
    atomic_store(&strag_on, 0);
    exposed_timer_destroy(s->timer);
    free(s->hosts);
    free(s->rows[0]);
    free(s->rows[1]);
    free(s->run);
    free(s->sorted);
    free(s->ratio);
    free(s->share);
    free(s->lost);
    free(s->slow_run);
    free(s->was_named);
    free(s->named_evals);
    free(s->json);
    free(s);
}

/* Collective: n_bytes from every rank into rank 0's recv (rank r's at r * n_bytes), under the
 * watchdog's deadline. */
static ddp_status strag_gather(const void *send, void *recv, size_t n_bytes, const char *what)
{
    watch_enter(DDP_WATCH_CALLER, what, -1, n_bytes);
    int rc = MPI_Gather(send, (int)n_bytes, MPI_BYTE, recv, (int)n_bytes, MPI_BYTE, 0,
                        MPI_COMM_WORLD);
    watch_leave(DDP_WATCH_CALLER);
    return rc == MPI_SUCCESS ? DDP_OK : check_mpi_fail(rc, "MPI_Gather", __FILE__, __LINE__);
}

/* Rank 0's tables and every rank's node names. Collective: every rank learns whether any
 * failed here or before (local); the failure, or DDP_ERR_MISMATCH where a peer failed. */
static ddp_status strag_alloc(ddp_straggler *s, ddp_status local)
{
    size_t w = (size_t)s->world;
    int ok = 1;
    if (s->rank == 0) {
        s->rows[0] = calloc(w, sizeof *s->rows[0]);
        s->rows[1] = calloc(w, sizeof *s->rows[1]);
        s->run = calloc(w, sizeof *s->run);
        s->sorted = calloc(w, sizeof *s->sorted);
        s->ratio = calloc(w, sizeof *s->ratio);
        s->share = calloc(w, sizeof *s->share);
        s->lost = calloc(w, sizeof *s->lost);
        s->slow_run = calloc(w, sizeof *s->slow_run);
        s->was_named = calloc(w, sizeof *s->was_named);
        s->named_evals = calloc(w, sizeof *s->named_evals);
        s->hosts = calloc(w, sizeof *s->hosts);
        ok = s->rows[0] && s->rows[1] && s->run && s->sorted && s->ratio && s->share && s->lost &&
             s->slow_run && s->was_named && s->named_evals && s->hosts;
    }
    if (!ok && local == DDP_OK) {
        DDP_ERROR("ddp_straggler_create: out of memory for the straggler table of %d ranks",
                  s->world);
        local = DDP_ERR_NOMEM;
    }
    int64_t failed = local != DDP_OK;
    ddp_status st = ddp_allreduce_host(s->ctx, &failed, 1, DDP_INT64, DDP_SUM);
    if (st == DDP_OK && failed)
        st = local != DDP_OK ? local : DDP_ERR_MISMATCH;
    char me[STRAG_HOST] = "";
    snprintf(me, sizeof me, "%.*s", (int)sizeof me - 1, ddp_hostname(s->ctx));
    return st == DDP_OK ? strag_gather(me, s->hosts, sizeof me, "straggler-table nodes") : st;
}

/* CUDA: the steps are timed on libddp's stream, unless DDP_STRAGGLER_CLOCK=host. */
static ddp_status strag_clock_choice(ddp_straggler *s)
{
    const char *env = getenv("DDP_STRAGGLER_CLOCK");
    if (env && strcmp(env, "host") != 0 && strcmp(env, "device") != 0) {
        DDP_ERROR("DDP_STRAGGLER_CLOCK=%s: expected host (the CPU's clocks) or device (CUDA "
                  "events, the default on a GPU)", env);
        return DDP_ERR_ENV;
    }
    if (ddp_backend(s->ctx) != DDP_BACKEND_CUDA || (env && strcmp(env, "host") == 0))
        return DDP_OK;
    return exposed_timer_create(STRAG_SLOTS, &s->timer);
}

/* A window starts now. */
static void strag_window_start(ddp_straggler *s)
{
    s->win_t0 = strag_clock(CLOCK_MONOTONIC);
    s->cpu_t0 = strag_clock(CLOCK_PROCESS_CPUTIME_ID);
    s->dev_wait_t0 = atomic_load_explicit(&strag_dev_wait_ns, memory_order_relaxed);
    s->open = (strag_row){0};
    s->dev_ms = s->dev_steps = 0;
    s->n = 0;
}

void ddp_straggler_step_begin(ddp_straggler *s)
{
    if (!s)
        return;
    s->step_t0 = strag_clock(CLOCK_MONOTONIC);
    s->wait_t0 = atomic_load_explicit(&strag_wait_ns, memory_order_relaxed);
    if (s->timer)
        exposed_timer_start(s->timer, ddp_backend_stream(s->ctx)); /* an error is logged and
                                                                    only loses the step */
}

ddp_status ddp_straggler_create(ddp_ctx *ctx, const ddp_straggler_opts *opts, ddp_straggler **out)
{
    ddp_status st = strag_check(ctx, opts, out);
    if (st != DDP_OK)
        return st;
    *out = NULL;
    if (opts->every == 0)
        return DDP_OK;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&strag_on, &expected, 1)) {
        DDP_ERROR("ddp_straggler_create: a straggler table is already on in this process");
        return DDP_ERR_STATE;
    }
    ddp_straggler *s = calloc(1, sizeof *s);
    if (!s) {
        atomic_store(&strag_on, 0);
        return DDP_ERR_NOMEM;
    }
    *s = (ddp_straggler){.ctx = ctx, .o = *opts, .rank = ddp_rank(ctx),
                         .world = ddp_world_size(ctx), .last_step = -1,
                         .cpu_backend = ddp_backend(ctx) == DDP_BACKEND_CPU,
                         .stats = {.step = -1, .slowest_rank = -1}};
    st = strag_alloc(s, strag_clock_choice(s));
    if (st != DDP_OK) {
        ddp_straggler_destroy(s);
        return st;
    }
    strag_window_start(s);
    ddp_straggler_step_begin(s);
    *out = s;
    return DDP_OK;
}

/* ---- rank 0: the judgement --------------------------------------------------------------- */

static int strag_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the values in sorted (n >= 2 of them, ascending) without one copy of v. */
static double median_without(const double *sorted, int n, double v)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) { /* the first index holding v */
        int mid = (lo + hi) / 2;
        if (sorted[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    int m = n - 1; /* the values left, at index i < lo: sorted[i], else sorted[i + 1] */
#define STRAG_LEFT(i) ((i) < lo ? sorted[(i)] : sorted[(i) + 1])
    double med = m % 2 ? STRAG_LEFT(m / 2) : 0.5 * (STRAG_LEFT(m / 2 - 1) + STRAG_LEFT(m / 2));
#undef STRAG_LEFT
    return med;
}

/* out[r] = v[r] / the median of the other ranks' v (1 when that median is not positive), and
 * below[r] (may be NULL) = that median - v[r]. v may be out. */
static void strag_ratios(ddp_straggler *s, const double *v, double *out, double *below)
{
    memcpy(s->sorted, v, (size_t)s->world * sizeof *v);
    qsort(s->sorted, (size_t)s->world, sizeof *s->sorted, strag_cmp);
    for (int r = 0; r < s->world; r++) {
        double med = s->world > 1 ? median_without(s->sorted, s->world, v[r]) : 0;
        if (below)
            below[r] = med - v[r];
        out[r] = med > 0 ? v[r] / med : 1.0;
    }
}

/* The span (the last two windows) of rank r: compute per step and the CPU share. */
static void strag_span(const ddp_straggler *s, int r, double *compute, double *share)
{
    const strag_row *a = &s->rows[s->cur][r], *b = &s->rows[!s->cur][r];
    double steps = a->steps + b->steps, wall = a->wall_ms + b->wall_ms;
    *compute = steps > 0 ? (a->compute_ms + b->compute_ms) / steps : 0;
    *share = wall > 0 ? (a->cpu_ms + b->cpu_ms) / wall : 0;
}

/* Each rank's verdict over the span; slow_run and the count of ranks named. */
static void strag_judge(ddp_straggler *s)
{
    for (int r = 0; r < s->world; r++)
        strag_span(s, r, &s->ratio[r], &s->share[r]);
    strag_ratios(s, s->ratio, s->ratio, NULL);
    strag_ratios(s, s->share, s->share, s->lost);
    int judge_cpu = s->o.cpu_share > 0 && s->cpu_backend;
    s->n_named = 0;
    s->stats.max_ratio = 0;
    for (int r = 0; r < s->world; r++) {
        int starved = judge_cpu && s->share[r] < s->o.cpu_share && s->lost[r] >= STRAG_LOST_CORES;
        int slow = s->world > 1 && (s->ratio[r] > s->o.threshold || starved);
        s->slow_run[r] = slow ? s->slow_run[r] + 1 : 0;
        if (s->slow_run[r] >= s->o.times) {
            s->named_evals[r]++;
            s->n_named++;
        }
        if (s->ratio[r] > s->stats.max_ratio) {
            s->stats.max_ratio = s->ratio[r];
            s->stats.slowest_rank = r;
        }
    }
}

/* One rank's figures for a table line: compute per step over the span, its ratio, CPU share. */
static void strag_print_rank(ddp_straggler *s, int r)
{
    double compute, share;
    strag_span(s, r, &compute, &share);
    fprintf(s->o.out, "  rank %d (node %s): compute %.2f ms/step = %.2fx the others' median",
            r, s->hosts[r], compute, s->ratio[r]);
    if (s->cpu_backend)
        fprintf(s->o.out, ", CPU time %.2fx theirs", s->share[r]);
    fprintf(s->o.out, "; slow for %d steps\n",
            (int)((s->slow_run[r] + 1) * s->rows[s->cur][r].steps));
}

/* The table: the named ranks when the set changed (or every STRAG_REMIND evaluations while some
 * are), and the ranks no longer named. */
static void strag_print(ddp_straggler *s)
{
    const char *was_named = s->was_named;
    int changed = 0;
    for (int r = 0; r < s->world; r++)
        changed |= was_named[r] != (s->slow_run[r] >= s->o.times);
    s->since_print++;
    if (!s->o.out || (!changed && (s->n_named == 0 || s->since_print < STRAG_REMIND)))
        return;
    s->since_print = 0;
    char cpu[64] = "";
    if (s->o.cpu_share > 0 && s->cpu_backend)
        snprintf(cpu, sizeof cpu, ", or CPU time under %gx theirs", s->o.cpu_share);
    fprintf(s->o.out, "straggler table at step %ld: %d rank(s) slow (compute over %gx the "
            "others' median%s, %d checks in a row)%s\n", s->stats.step, s->n_named,
            s->o.threshold, cpu, s->o.times, s->n_named ? ":" : "");
    for (int r = 0, shown = 0; r < s->world; r++) {
        if (s->slow_run[r] >= s->o.times && shown++ < STRAG_SHOWN)
            strag_print_rank(s, r);
        else if (was_named[r] && s->slow_run[r] < s->o.times)
            fprintf(s->o.out, "  rank %d (node %s) is no longer slow (%.2fx)\n", r, s->hosts[r],
                    s->ratio[r]);
    }
    if (s->n_named > STRAG_SHOWN)
        fprintf(s->o.out, "  ... and %d more (--metrics lists them all)\n",
                s->n_named - STRAG_SHOWN);
    fflush(s->o.out);
}

/* printf of one number into s->json at *len, growing it; a failed growth cuts the line. */
static void strag_json_add(ddp_straggler *s, size_t *len, const char *fmt, double v)
{
    for (;;) {
        size_t room = s->json_cap - *len;
        int n = s->json ? snprintf(s->json + *len, room, fmt, v) : -1;
        if (n >= 0 && (size_t)n < room) {
            *len += (size_t)n;
            return;
        }
        size_t cap = s->json_cap ? 2 * s->json_cap : 4096;
        char *p = realloc(s->json, cap);
        if (!p)
            return;
        s->json = p;
        s->json_cap = cap;
    }
}

/* A per-rank array of the newest window: field 0 compute, 1 wait (per step), 2 CPU share. */
static void strag_json_array(ddp_straggler *s, size_t *len, const char *name, int field)
{
    strag_json_add(s, len, name, 0);
    for (int r = 0; r < s->world; r++) {
        const strag_row *w = &s->rows[s->cur][r];
        double steps = w->steps > 0 ? w->steps : 1, wall = w->wall_ms > 0 ? w->wall_ms : 1;
        double v = field == 0 ? w->compute_ms / steps : field == 1 ? w->wait_ms / steps
                                                                   : w->cpu_ms / wall;
        strag_json_add(s, len, r ? ",%.3f" : "%.3f", v);
    }
    strag_json_add(s, len, "]", 0);
}

static void strag_json(ddp_straggler *s)
{
    size_t len = 0;
    strag_json_add(s, &len, "{\"step\":%.0f", (double)s->stats.step);
    strag_json_add(s, &len, ",\"steps\":%.0f", s->rows[s->cur][0].steps);
    strag_json_add(s, &len, ",\"median_ms\":%.3f", s->stats.median_ms);
    strag_json_add(s, &len, ",\"threshold\":%g", s->o.threshold);
    strag_json_array(s, &len, ",\"compute_ms\":[", 0);
    strag_json_array(s, &len, ",\"wait_ms\":[", 1);
    strag_json_array(s, &len, ",\"cpu_cores\":[", 2);
    strag_json_add(s, &len, ",\"named\":[", 0);
    for (int r = 0, k = 0; r < s->world; r++)
        if (s->slow_run[r] >= s->o.times)
            strag_json_add(s, &len, k++ ? ",%.0f" : "%.0f", r);
    strag_json_add(s, &len, "]}", 0);
}

/* Rank 0: the window's JSON line (one writev, warned about once when it fails) and its
 * dashboard figures. */
static void strag_outputs(ddp_straggler *s)
{
    if (s->o.json_fd >= 0 && s->json) {
        struct iovec v[3] = {{"{\"straggler\":", 13}, {s->json, strlen(s->json)}, {"}\n", 2}};
        ssize_t n = writev(s->o.json_fd, v, 3);
        if (n != (ssize_t)(v[0].iov_len + v[1].iov_len + v[2].iov_len) && !s->json_failed++)
            DDP_WARN("the straggler table's JSON line was not written whole (%zd bytes of %zu); "
                     "the lines after it may be missing", n,
                     v[0].iov_len + v[1].iov_len + v[2].iov_len);
    }
    if (!s->o.metrics || s->n_windows < 2) /* the figures of a judgement */
        return;
    (void)ddp_metrics_set(s->o.metrics, "straggler/median_compute_seconds",
                          1e-3 * s->stats.median_ms, "the ranks' median compute time per step");
    (void)ddp_metrics_set(s->o.metrics, "straggler/max_compute_ratio", s->stats.max_ratio,
                          "the slowest rank's compute over the other ranks' median");
    (void)ddp_metrics_set(s->o.metrics, "straggler/named_ranks", s->stats.n_named,
                          "ranks the straggler table names now");
    (void)ddp_metrics_commit(s->o.metrics, s->stats.step); /* failures are warned about */
}

/* Rank 0, a window gathered into rows[cur]: the run's sums, the verdicts, the line, the JSON. */
static void strag_window_done(ddp_straggler *s, long step)
{
    for (int r = 0; r < s->world; r++) {
        const strag_row *w = &s->rows[s->cur][r];
        s->run[r].compute_ms += w->compute_ms;
        s->run[r].steps += w->steps;
        s->run[r].wall_ms += w->wall_ms;
        s->run[r].cpu_ms += w->cpu_ms;
        s->sorted[r] = w->steps > 0 ? w->compute_ms / w->steps : 0;
        s->was_named[r] = s->slow_run[r] >= s->o.times;
    }
    qsort(s->sorted, (size_t)s->world, sizeof *s->sorted, strag_cmp);
    int h = s->world / 2;
    s->stats.median_ms = s->world % 2 ? s->sorted[h] : 0.5 * (s->sorted[h - 1] + s->sorted[h]);
    s->stats.step = step;
    s->n_windows++;
    if (s->n_windows >= 2) /* a span is two windows */
        strag_judge(s);
    s->stats.n_named = s->n_named;
    strag_print(s);
    strag_json(s);
    strag_outputs(s);
}

/* ---- every rank: the windows ----------------------------------------------------------------- */

/* CUDA: the steps whose events have completed, into dev_ms and dev_steps (never blocks). */
static void strag_device_steps(ddp_straggler *s)
{
    int64_t ns;
    while (exposed_timer_next(s->timer, 0, &ns)) {
        s->dev_ms += 1e-6 * (double)ns;
        s->dev_steps++;
    }
}

/* Collective: the open window's sums to rank 0, judged there. */
static ddp_status strag_close(ddp_straggler *s, long step)
{
    int64_t now = strag_clock(CLOCK_MONOTONIC);
    strag_row mine = s->open;
    mine.wall_ms = 1e-6 * (double)(now - s->win_t0);
    mine.cpu_ms = 1e-6 * (double)(strag_clock(CLOCK_PROCESS_CPUTIME_ID) - s->cpu_t0);
    if (s->timer) {
        /* the means of the steps read (a step or two behind), over the window's steps */
        strag_device_steps(s);
        double wait = 1e-6 * (double)(atomic_load(&strag_dev_wait_ns) - s->dev_wait_t0);
        double per = s->dev_steps > 0 ? mine.steps / s->dev_steps : 0;
        mine.wait_ms = wait * per;
        mine.compute_ms = fmax(0.0, s->dev_ms - wait) * per;
    }
    ddp_status st = strag_gather(&mine, s->rank == 0 ? s->rows[!s->cur] : NULL, sizeof mine,
                                 "straggler-table window");
    strag_window_start(s);
    if (st != DDP_OK || s->rank != 0)
        return st;
    s->cur = !s->cur;
    strag_window_done(s, step);
    return DDP_OK;
}

ddp_status ddp_straggler_step_end(ddp_straggler *s, long step, int *window_closed)
{
    if (window_closed)
        *window_closed = 0;
    if (!s)
        return DDP_OK;
    if (s->timer) {
        exposed_timer_stop(s->timer, ddp_backend_stream(s->ctx));
        strag_device_steps(s);
    } else {
        int64_t now = strag_clock(CLOCK_MONOTONIC);
        int64_t wait = atomic_load_explicit(&strag_wait_ns, memory_order_relaxed) - s->wait_t0;
        s->open.compute_ms += 1e-6 * (double)(now - s->step_t0 - wait);
        s->open.wait_ms += 1e-6 * (double)wait;
    }
    s->open.steps++;
    s->last_step = step;
    ddp_status st = DDP_OK;
    if (++s->n == s->o.every) {
        st = strag_close(s, step);
        if (window_closed)
            *window_closed = st == DDP_OK && s->rank == 0;
    }
    ddp_straggler_step_begin(s);
    return st;
}

const char *ddp_straggler_json(const ddp_straggler *s)
{
    return s && s->json ? s->json : "";
}

ddp_status ddp_straggler_get(const ddp_straggler *s, ddp_straggler_stats *out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = s && s->rank == 0 ? s->stats : (ddp_straggler_stats){.step = -1, .slowest_rank = -1};
    return DDP_OK;
}

/* Rank 0: the run's summary line. */
static void strag_summary(ddp_straggler *s)
{
    if (!s->o.out || s->n_windows == 0)
        return;
    for (int r = 0; r < s->world; r++)
        s->ratio[r] = s->run[r].steps > 0 ? s->run[r].compute_ms / s->run[r].steps : 0;
    strag_ratios(s, s->ratio, s->ratio, NULL);
    int worst = 0, named = 0;
    for (int r = 0; r < s->world; r++) {
        worst = s->ratio[r] > s->ratio[worst] ? r : worst;
        named += s->named_evals[r] > 0;
    }
    fprintf(s->o.out, "straggler table: %.0f steps in %d windows of %d; %d rank(s) ever named; "
            "slowest rank %d (node %s): compute %.2fx the others' median over the run\n",
            s->run[0].steps, s->n_windows, s->o.every, named, worst, s->hosts[worst],
            s->ratio[worst]);
    for (int r = 0, shown = 0; r < s->world; r++)
        if (s->named_evals[r] > 0 && shown++ < STRAG_SHOWN)
            fprintf(s->o.out, "  rank %d (node %s): named at %ld check(s), compute %.2fx the "
                    "others' median over the run\n", r, s->hosts[r], s->named_evals[r],
                    s->ratio[r]);
    fflush(s->o.out);
}

ddp_status ddp_straggler_finish(ddp_straggler *s, int *window_closed)
{
    if (window_closed)
        *window_closed = 0;
    if (!s)
        return DDP_OK;
    ddp_status st = DDP_OK;
    if (s->n > 0) {
        st = strag_close(s, s->last_step);
        if (window_closed)
            *window_closed = st == DDP_OK && s->rank == 0;
    }
    if (s->rank == 0)
        strag_summary(s);
    return st;
}
