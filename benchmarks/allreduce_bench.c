/* allreduce_bench.c - ddp-allreduce-bench: time and bandwidth of libddp's all-reduce over a range
 * of sizes, with every result checked, in the manner of nccl-tests' all_reduce_perf.
 *
 * For each size (min-bytes, then times step-factor, up to max-bytes) every rank fills its buffer
 * with x[i] = rank + (i % 97), runs `warmup` untimed all-reduces and then `iters` timed ones
 * (in place, on the same buffer). The clock starts after a barrier and stops after the next one
 * (on CUDA that barrier waits for the queued all-reduces); time(us) is the slowest rank's time
 * divided by iters. With --check 1 the buffer is filled again and one more all-reduce is compared
 * with the closed form, n = world size:
 *   sum[i] = n(n-1)/2 + n * (i % 97)        avg[i] = sum[i] / n
 * Small integers keep float sums exact, so sums must match bit for bit.
 * algbw = size / time; busbw = algbw * 2(n-1)/n, the per-rank traffic of a ring all-reduce, which
 * is comparable across world sizes.
 * Exit status: 0 all good; 1 wrong values, or the average bus bandwidth is below
 * DDP_BENCH_MIN_BUSBW (GB/s, a floor for CI); 2 bad usage; 3 runtime failure (the job is aborted).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddp.h"
#include "malloc_policy.h"

#define BENCH_OK 0
#define BENCH_FAILED 1
#define BENCH_USAGE 2
#define BENCH_RUNTIME 3
#define BENCH_HELP (-1) /* parse result: --help was printed */
#define BENCH_PATTERN 97 /* x[i] = rank + (i % BENCH_PATTERN) */
#define BENCH_HOST_MAX 64

typedef struct bench_opts {
    size_t min_bytes, max_bytes;
    size_t step_factor;
    int iters, warmup;
    ddp_reduce_op op;
    ddp_backend_kind device;
    int nonblocking; /* ddp_allreduce_start + ddp_wait instead of ddp_allreduce */
    int idle_ms;     /* > 0: the link idles this long before each timed all-reduce (training's duty cycle) */
    int link_check;
    int max_bytes_given;  /* only the start-up link check (ddp_link_check), with -e as its message size */
    int check;
    double min_busbw; /* GB/s from DDP_BENCH_MIN_BUSBW, -1 when unset */
} bench_opts;

typedef struct bench_state {
    ddp_ctx *ctx;
    const bench_opts *o;
    int rank, world;
    float *buf;          /* (max_bytes / 4) backend memory, all-reduced in place */
    float *host;         /* (max_bytes / 4) host: fill pattern, then the checked result */
    float *share;        /* (world) backend memory: one value per rank, summed */
    float *share_host;   /* (world) */
    ddp_request **reqs;  /* (max(iters, warmup)) outstanding requests with --nonblocking */
    double busbw_sum;    /* GB/s, over the sizes run so far */
    int n_sizes;
    double n_wrong;      /* over all sizes and ranks */
} bench_state;

enum { OPT_OP = 1000, OPT_DEVICE, OPT_NONBLOCKING, OPT_IDLE_MS, OPT_LINK_CHECK, OPT_HELP };

static const struct option bench_long_opts[] = {
    {"min-bytes", required_argument, NULL, 'b'},
    {"max-bytes", required_argument, NULL, 'e'},
    {"step-factor", required_argument, NULL, 'f'},
    {"iters", required_argument, NULL, 'n'},
    {"warmup", required_argument, NULL, 'w'},
    {"check", required_argument, NULL, 'c'},
    {"op", required_argument, NULL, OPT_OP},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"nonblocking", no_argument, NULL, OPT_NONBLOCKING},
    {"idle-ms", required_argument, NULL, OPT_IDLE_MS},
    {"link-check", no_argument, NULL, OPT_LINK_CHECK},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static const char bench_usage_text[] =
    "usage: ddp-allreduce-bench [options]   (one process, or many with mpirun / srun)\n"
    "  -b, --min-bytes N       smallest size in bytes, K/M/G = 2^10/2^20/2^30 (default 8)\n"
    "  -e, --max-bytes N       largest size in bytes, same suffixes (default 64M)\n"
    "  -f, --step-factor N     each size is the previous one times N, N >= 2 (default 2)\n"
    "  -n, --iters N           timed all-reduces per size (default 20)\n"
    "  -w, --warmup N          untimed all-reduces per size before timing (default 5)\n"
    "  -c, --check 0|1         compare one more all-reduce with the exact result (default 1)\n"
    "      --op sum|avg        reduction (default sum)\n"
    "      --device cpu|cuda|auto  backend (default auto)\n"
    "      --nonblocking       start every all-reduce, then wait for each (ddp_allreduce_start,\n"
    "                          ddp_wait) instead of calling ddp_allreduce\n"
    "      --idle-ms N         time each all-reduce alone, after a barrier and N ms of idle link,\n"
    "                          as in training, where compute separates the steps' all-reduces\n"
    "                          (default 0: back to back)\n"
    "      --link-check        instead of all-reduces: each rank's bandwidth and latency to its\n"
    "                          ring neighbours and rank 0 (messages of -e bytes, default 4M here);\n"
    "                          names nodes whose links are under half the median; exit 1 if any\n"
    "      --help              this text\n"
    "Env DDP_BENCH_MIN_BUSBW=X: exit 1 when the average bus bandwidth is below X GB/s.\n"
    "Exit status: 0 ok, 1 wrong values or below the floor, 2 bad usage, 3 runtime failure.\n";

static int bench_usage(const char *flag, const char *want, const char *got)
{
    fprintf(stderr, "ddp-allreduce-bench: %s: expected %s, got '%s'\n%s", flag, want, got,
            bench_usage_text);
    return BENCH_USAGE;
}

/* Parses a whole-string byte count with an optional K/M/G suffix; -1 on anything else. */
static int bench_parse_bytes(const char *text, size_t *out)
{
    char *end = NULL;
    if (!isdigit((unsigned char)text[0]))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    const char *suffixes = "KMG";
    const char *s = *end ? strchr(suffixes, toupper((unsigned char)*end)) : NULL;
    unsigned shift = s ? 10u * (unsigned)(s - suffixes + 1) : 0;
    if (s)
        end++;
    if (errno != 0 || *end != '\0' || v > (SIZE_MAX >> shift))
        return -1;
    *out = (size_t)v << shift;
    return 0;
}

/* Parses a whole-string integer in [min, INT_MAX]; -1 on anything else. */
static int bench_parse_int(const char *text, int min, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

static int bench_parse_op(const char *text, ddp_reduce_op *out)
{
    if (strcmp(text, "sum") == 0)
        *out = DDP_SUM;
    else if (strcmp(text, "avg") == 0)
        *out = DDP_AVG;
    else
        return -1;
    return 0;
}

/* Applies one option; returns 0, or the exit status for a bad value. */
static int bench_apply(int c, const char *arg, bench_opts *o)
{
    int v = 0;
    if (c == 'b' && bench_parse_bytes(arg, &o->min_bytes) != 0)
        return bench_usage("--min-bytes", "a size like 8, 4K or 1M", arg);
    if (c == 'e' && bench_parse_bytes(arg, &o->max_bytes) != 0)
        return bench_usage("--max-bytes", "a size like 16M or 1G", arg);
    if (c == 'f' && bench_parse_int(arg, 2, &v) != 0)
        return bench_usage("--step-factor", "an integer >= 2", arg);
    if (c == 'n' && bench_parse_int(arg, 1, &o->iters) != 0)
        return bench_usage("--iters", "a positive integer", arg);
    if (c == OPT_IDLE_MS && bench_parse_int(arg, 0, &o->idle_ms) != 0)
        return bench_usage("--idle-ms", "a non-negative integer", arg);
    if (c == 'w' && bench_parse_int(arg, 0, &o->warmup) != 0)
        return bench_usage("--warmup", "a non-negative integer", arg);
    if (c == 'c' && strcmp(arg, "0") != 0 && strcmp(arg, "1") != 0)
        return bench_usage("--check", "0 or 1", arg);
    if (c == OPT_OP && bench_parse_op(arg, &o->op) != 0)
        return bench_usage("--op", "sum or avg", arg);
    if (c == OPT_DEVICE && ddp_backend_parse(arg, &o->device) != DDP_OK)
        return bench_usage("--device", "cpu, cuda or auto", arg);
    if (c == 'f')
        o->step_factor = (size_t)v;
    if (c == 'c')
        o->check = arg[0] == '1';
    if (c == OPT_NONBLOCKING)
        o->nonblocking = 1;
    if (c == OPT_LINK_CHECK)
        o->link_check = 1;
    if (c == 'e')
        o->max_bytes_given = 1;
    return 0;
}

/* Reads DDP_BENCH_MIN_BUSBW (GB/s) into o->min_busbw; returns 0, or the exit status. */
static int bench_read_floor(bench_opts *o)
{
    const char *text = getenv("DDP_BENCH_MIN_BUSBW");
    char *end = NULL;
    o->min_busbw = text ? strtod(text, &end) : -1.0;
    if (text && (end == text || *end != '\0' || !(o->min_busbw >= 0.0) || isinf(o->min_busbw)))
        return bench_usage("DDP_BENCH_MIN_BUSBW", "a bandwidth in GB/s >= 0", text);
    return 0;
}

/* Checks the options against each other; returns 0 or the exit status. */
static int bench_validate(const bench_opts *o)
{
    char got[64];
    snprintf(got, sizeof got, "%zu", o->min_bytes);
    if (o->min_bytes < sizeof(float))
        return bench_usage("--min-bytes", "at least 4 (one float)", got);
    if (o->max_bytes < o->min_bytes) {
        snprintf(got, sizeof got, "%zu < min-bytes %zu", o->max_bytes, o->min_bytes);
        return bench_usage("--max-bytes", "a size >= --min-bytes", got);
    }
    return 0;
}

/* Fills *o from argv. Returns 0 to run, BENCH_HELP after --help, or BENCH_USAGE. */
static int bench_parse_args(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.min_bytes = 8, .max_bytes = (size_t)64 << 20, .step_factor = 2,
                          .iters = 20, .warmup = 5, .op = DDP_SUM, .device = DDP_BACKEND_AUTO,
                          .check = 1};
    int c;
    while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:", bench_long_opts, NULL)) != -1) {
        if (c == OPT_HELP) {
            fputs(bench_usage_text, stdout);
            return BENCH_HELP;
        }
        if (c == '?')
            return bench_usage("options", "the flags below", argv[optind - 1]);
        int bad = bench_apply(c, optarg, o);
        if (bad != 0)
            return bad;
    }
    if (optind < argc)
        return bench_usage("arguments", "no positional arguments", argv[optind]);
    int rc = bench_read_floor(o);
    return rc != 0 ? rc : bench_validate(o);
}

/* A failure only this rank may have seen: stop the whole job so no peer waits forever. */
static void bench_must(const bench_state *b, ddp_status st, const char *what)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("%s failed: %s; stopping every rank", what, ddp_strerror(st));
    ddp_abort(b->ctx, BENCH_RUNTIME);
}

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every rank's `mine`, indexed by rank: each rank puts its value at its own index of a zeroed
 * vector and the vectors are summed (the all-reduce offers only SUM and AVG).
 * Returns share_host. */
static const float *bench_share(bench_state *b, float mine)
{
    memset(b->share_host, 0, (size_t)b->world * sizeof(float));
    b->share_host[b->rank] = mine;
    size_t share_bytes = (size_t)b->world * sizeof(float);
    bench_must(b, ddp_upload(b->ctx, b->share, b->share_host, share_bytes), "ddp_upload");
    bench_must(b, ddp_allreduce(b->ctx, b->share, (size_t)b->world, DDP_SUM),
               "ddp_allreduce");
    bench_must(b, ddp_download(b->ctx, b->share_host, b->share, share_bytes), "ddp_download");
    return b->share_host;
}

static double bench_max_over_ranks(bench_state *b, double mine)
{
    const float *all = bench_share(b, (float)mine);
    double max = all[0];
    for (int r = 1; r < b->world; r++)
        max = all[r] > max ? all[r] : max;
    return max;
}

/* Exact below 2^24 per rank. */
static double bench_sum_over_ranks(bench_state *b, double mine)
{
    const float *all = bench_share(b, (float)mine);
    double sum = 0.0;
    for (int r = 0; r < b->world; r++)
        sum += all[r];
    return sum;
}

/* Writes this rank's pattern into buf[0..n). */
static void bench_fill(bench_state *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        b->host[i] = (float)(b->rank + (int)(i % BENCH_PATTERN));
    bench_must(b, ddp_upload(b->ctx, b->buf, b->host, n * sizeof(float)), "ddp_upload");
}

/* k all-reduces of buf[0..n): blocking, or all started and then all waited for. */
static void bench_reduce_many(bench_state *b, size_t n, int k)
{
    for (int j = 0; j < k && !b->o->nonblocking; j++)
        bench_must(b, ddp_allreduce(b->ctx, b->buf, n, b->o->op), "ddp_allreduce");
    for (int j = 0; j < k && b->o->nonblocking; j++)
        bench_must(b, ddp_allreduce_start(b->ctx, b->buf, n, b->o->op, &b->reqs[j]),
                   "ddp_allreduce_start");
    for (int j = 0; j < k && b->o->nonblocking; j++)
        bench_must(b, ddp_wait(b->reqs[j]), "ddp_wait");
}

/* --idle-ms: `iters` all-reduces, each after a barrier and the idle time; returns this rank's
 * time inside the all-reduces alone. */
static double bench_reduce_idle(bench_state *b, size_t n)
{
    double inside = 0.0;
    struct timespec idle = {.tv_sec = b->o->idle_ms / 1000, .tv_nsec = (long)(b->o->idle_ms % 1000) * 1000000L};
    for (int j = 0; j < b->o->iters; j++) {
        bench_must(b, ddp_barrier(b->ctx), "ddp_barrier");
        nanosleep(&idle, NULL);
        double t0 = bench_now();
        bench_reduce_many(b, n, 1);
        inside += bench_now() - t0;
    }
    return inside;
}

/* The closed form of element i after the all-reduce (see the top of the file). */
static float bench_expected(const bench_state *b, size_t i)
{
    float n = (float)b->world;
    float sum = n * (n - 1.0f) / 2.0f + n * (float)(i % BENCH_PATTERN);
    return b->o->op == DDP_AVG ? sum / n : sum;
}

/* Fills, all-reduces once and counts this rank's wrong elements, printing the first few. SUM must
 * be exact; AVG may round the division differently (NCCL may scale by 1/n), so it gets 1e-6
 * relative. */
static double bench_check(bench_state *b, size_t n)
{
    bench_fill(b, n);
    bench_reduce_many(b, n, 1);
    bench_must(b, ddp_download(b->ctx, b->host, b->buf, n * sizeof(float)), "ddp_download");
    float rtol = b->o->op == DDP_AVG ? 1e-6f : 0.0f;
    size_t n_wrong = 0;
    for (size_t i = 0; i < n; i++) {
        float want = bench_expected(b, i);
        if (fabsf(b->host[i] - want) <= rtol * fabsf(want))
            continue;
        if (n_wrong++ < 3)
            DDP_ERROR("count %zu: element %zu is %g, expected %g", n, i, (double)b->host[i],
                      (double)want);
    }
    return (double)n_wrong;
}

/* Runs one size; rank 0 prints its row. */
static void bench_size(bench_state *b, size_t n)
{
    const bench_opts *o = b->o;
    bench_fill(b, n);
    bench_reduce_many(b, n, o->warmup);
    bench_must(b, ddp_barrier(b->ctx), "ddp_barrier");
    double t0 = bench_now(), mine;
    if (o->idle_ms > 0) {
        mine = bench_reduce_idle(b, n);
    } else {
        bench_reduce_many(b, n, o->iters);
        bench_must(b, ddp_barrier(b->ctx), "ddp_barrier");
        mine = bench_now() - t0;
    }
    double sec = bench_max_over_ranks(b, mine) / o->iters;
    double wrong = o->check ? bench_sum_over_ranks(b, bench_check(b, n)) : 0.0;
    size_t bytes = n * sizeof(float);
    double algbw = (double)bytes / sec / 1e9;
    double busbw = algbw * 2.0 * (b->world - 1) / b->world;
    b->busbw_sum += busbw;
    b->n_sizes++;
    b->n_wrong += wrong;
    if (b->rank != 0)
        return;
    char wrong_text[32] = "N/A";
    if (o->check)
        snprintf(wrong_text, sizeof wrong_text, "%.0f", wrong);
    printf("%14zu %12zu %6s %6s %11.2f %12.3f %12.3f %8s\n", bytes, n, "float",
           o->op == DDP_AVG ? "avg" : "sum", sec * 1e6, algbw, busbw, wrong_text);
    fflush(stdout);
}

/* Rank 0 prints one "#  Rank r ..." line per rank, gathered in rank order. */
static void bench_print_ranks(bench_state *b)
{
    char line[BENCH_HOST_MAX + 64];
    size_t line_bytes = sizeof line, all_bytes = (size_t)b->world * line_bytes;
    snprintf(line, line_bytes, "#  Rank %3d Pid %7ld on %s device %d", b->rank, (long)getpid(),
             ddp_hostname(b->ctx), ddp_device(b->ctx));
    char *all = malloc(all_bytes);
    char *send = ddp_alloc(b->ctx, line_bytes), *recv = ddp_alloc(b->ctx, all_bytes);
    ddp_status st = all && send && recv ? DDP_OK : DDP_ERR_NOMEM;
    if (st == DDP_OK)
        st = ddp_upload(b->ctx, send, line, line_bytes);
    if (st == DDP_OK)
        st = ddp_allgather(b->ctx, send, recv, line_bytes);
    if (st == DDP_OK)
        st = ddp_download(b->ctx, all, recv, all_bytes);
    bench_must(b, st, "gathering the rank table");
    for (int r = 0; r < b->world && b->rank == 0; r++)
        printf("%s\n", all + (size_t)r * line_bytes);
    free(all);
    ddp_free(b->ctx, send);
    ddp_free(b->ctx, recv);
}

static void bench_print_header(bench_state *b)
{
    const bench_opts *o = b->o;
    if (b->rank == 0) {
        printf("# ddp-allreduce-bench (libddp %s): min-bytes %zu max-bytes %zu step-factor %zu "
               "warmup %d iters %d op %s check %d %s%s\n",
               ddp_version(), o->min_bytes, o->max_bytes, o->step_factor, o->warmup, o->iters,
               o->op == DDP_AVG ? "avg" : "sum", o->check,
               o->nonblocking ? "nonblocking (start + wait)" : "blocking",
               o->idle_ms > 0 ? ", each after a barrier and --idle-ms of idle link" : "");
        printf("# world size %d, backend %s, %d host(s)\n", b->world,
               ddp_backend_name(ddp_backend(b->ctx)), ddp_num_nodes(b->ctx));
    }
    bench_print_ranks(b);
    if (b->rank == 0)
        printf("#\n# %12s %12s %6s %6s %11s %12s %12s %8s\n", "size(B)", "count", "type",
               "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

/* Prints the summary lines (rank 0) and returns the exit status, the same on every rank (every
 * rank holds the same maximum times and wrong counts). */
static int bench_summary(const bench_state *b)
{
    double avg_busbw = b->n_sizes ? b->busbw_sum / b->n_sizes : 0.0;
    int below = avg_busbw < b->o->min_busbw;
    if (b->rank == 0) {
        printf("# Out of bounds values : %.0f %s\n", b->n_wrong, b->n_wrong > 0 ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g GB/s\n#\n", avg_busbw);
        if (below)
            fprintf(stderr, "ddp-allreduce-bench: average bus bandwidth %g GB/s is below the floor "
                            "DDP_BENCH_MIN_BUSBW=%g GB/s%s\n", avg_busbw, b->o->min_busbw,
                    b->world == 1 ? " (one rank moves no data: busbw is 0)" : "");
        fflush(stdout);
    }
    return b->n_wrong > 0 || below ? BENCH_FAILED : BENCH_OK;
}

/* Allocates the buffers, runs every size and returns the exit status. */
static int bench_run(ddp_ctx *ctx, const bench_opts *o)
{
    bench_state b = {.ctx = ctx, .o = o, .rank = ddp_rank(ctx), .world = ddp_world_size(ctx)};
    size_t n_max = o->max_bytes / sizeof(float);
    int n_reqs = o->iters > o->warmup ? o->iters : o->warmup;
    b.buf = ddp_alloc(ctx, n_max * sizeof(float));
    b.host = malloc(n_max * sizeof(float));
    b.share = ddp_alloc(ctx, (size_t)b.world * sizeof(float));
    b.share_host = malloc((size_t)b.world * sizeof(float));
    b.reqs = calloc((size_t)n_reqs, sizeof *b.reqs);
    int ok = b.buf && b.host && b.share && b.share_host && b.reqs;
    bench_must(&b, ok ? DDP_OK : DDP_ERR_NOMEM, "allocating the buffers");
    bench_print_header(&b);
    for (size_t bytes = o->min_bytes;; bytes *= o->step_factor) {
        bench_size(&b, bytes / sizeof(float));
        if (bytes > o->max_bytes / o->step_factor)
            break;
    }
    int rc = bench_summary(&b);
    free(b.reqs);
    free(b.share_host);
    ddp_free(ctx, b.share);
    free(b.host);
    ddp_free(ctx, b.buf);
    return rc;
}

/* --link-check: exit 0 when no node is slow, 1 when one is, 3 on a runtime failure. */
static int bench_link_check(ddp_ctx *ctx, const bench_opts *o)
{
    ddp_link_check_opts lo;
    ddp_link_check_opts_default(&lo);
    if (o->max_bytes_given)
        lo.bw_bytes = o->max_bytes;
    int slow = 0;
    ddp_status st = ddp_link_check(ctx, &lo, &slow);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-allreduce-bench: link check failed: %s\n", ddp_strerror(st));
        return BENCH_RUNTIME;
    }
    return slow ? BENCH_FAILED : BENCH_OK;
}

int main(int argc, char **argv)
{
    malloc_policy(); /* as ddp-train: large scratch buffers stay mapped (malloc_policy.h) */
    bench_opts o;
    int rc = bench_parse_args(argc, argv, &o);
    if (rc != 0)
        return rc == BENCH_HELP ? BENCH_OK : rc;
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = o.device;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&io, &ctx);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-allreduce-bench: cannot start: %s\n", ddp_strerror(st));
        return BENCH_RUNTIME;
    }
    rc = o.link_check ? bench_link_check(ctx, &o) : bench_run(ctx, &o);
    ddp_finalize(ctx);
    return rc;
}
