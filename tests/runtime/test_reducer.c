/* test_reducer.c - bucketed gradient averaging under real mpirun (any world size, 1 included).
 *
 * Rank r adds grad[i] = r + i + m on micro-step m (i: index in the flat buffer), so after K
 * micro-steps the mean over ranks and micro-steps is exactly i + (W - 1) / 2 + (K - 1) / 2.
 * Tiny caps give many buckets; parameters are marked in reverse, forward, and a rank-dependent
 * scrambled order (launches must still go in bucket order on every rank).
 * `--backend cuda`: the same on device memory with NCCL (gradients staged with ddp_upload); exits
 * 77 where this host has fewer GPUs than ranks.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ddp.h"
#include "internal.h" /* ddp_plan_buckets */

#define N_PARAMS 10
#define FIRST_CAP_BYTES 16.0 /* 4 floats */
#define CAP_BYTES 64.0       /* 16 floats */

static const size_t numel[N_PARAMS] = {1, 7, 33, 2, 129, 5, 64, 3, 1, 17};
static size_t offset[N_PARAMS + 1];

typedef enum order_kind { ORDER_REVERSE, ORDER_FORWARD, ORDER_SCRAMBLED } order_kind;

static void make_order(order_kind kind, int rank, int micro, int *order)
{
    for (int i = 0; i < N_PARAMS; i++)
        order[i] = kind == ORDER_FORWARD ? i : N_PARAMS - 1 - i;
    if (kind != ORDER_SCRAMBLED)
        return;
    unsigned state = 2654435761u * (unsigned)(rank + 1) + 40503u * (unsigned)(micro + 1);
    for (int i = N_PARAMS - 1; i > 0; i--) {
        state = state * 1103515245u + 12345u;
        int j = (int)((state >> 8) % (unsigned)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

static ddp_reducer *make_reducer(ddp_ctx *ctx, float *grads)
{
    ddp_reducer_opts o;
    ddp_reducer_opts_default(&o);
    o.bucket_mb = CAP_BYTES / (1024.0 * 1024.0);
    o.first_bucket_mb = FIRST_CAP_BYTES / (1024.0 * 1024.0);
    ddp_reducer *r = NULL;
    ddp_status st = ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r);
    CHECK(st == DDP_OK && r, "reducer_create: %s", ddp_strerror(st));
    return r;
}

/* Adds this rank's micro-step values to parameter p (host mirror and backend buffer). */
static void add_grad(ddp_ctx *ctx, float *grads, float *acc, int p, int micro)
{
    int rank = ddp_rank(ctx);
    for (size_t i = offset[p]; i < offset[p + 1]; i++)
        acc[i] += (float)(rank + (int)i + micro);
    ddp_upload(ctx, grads + offset[p], acc + offset[p], numel[p] * sizeof(float));
}

/* On an accumulation step nothing may be communicated: the buffer holds this rank's own sums. */
static void check_local(ddp_ctx *ctx, const float *grads, const float *acc, float *host)
{
    usleep(20000); /* give a wrongly started all-reduce time to land */
    ddp_download(ctx, host, grads, offset[N_PARAMS] * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < offset[N_PARAMS]; i++)
        bad += host[i] != acc[i];
    CHECK(bad == 0, "rank %d: %zu gradients changed on an accumulation step", ddp_rank(ctx), bad);
}

static void check_mean(ddp_ctx *ctx, const float *grads, float *host, int k, const char *what)
{
    double shift = (ddp_world_size(ctx) - 1) / 2.0 + (k - 1) / 2.0;
    ddp_download(ctx, host, grads, offset[N_PARAMS] * sizeof(float));
    int shown = 0;
    for (size_t i = 0; i < offset[N_PARAMS]; i++) {
        double want = (double)i + shift; /* float sums of integers are exact; one rounding on scale */
        if (shown < 5 && !(fabs(host[i] - want) <= 1e-6 + 1e-6 * want)) {
            CHECK(0, "%s: grad[%zu] = %.9g, want %.9g (K=%d)", what, i, host[i], want, k);
            shown++;
        }
    }
}

/* One accumulation cycle: zeroed gradients, k micro-steps (the last one syncs), finish. */
static void run_cycle(ddp_ctx *ctx, ddp_reducer *r, float *grads, float *acc, float *host,
                      order_kind kind, int k, const char *what)
{
    memset(acc, 0, offset[N_PARAMS] * sizeof *acc);
    ddp_upload(ctx, grads, acc, offset[N_PARAMS] * sizeof(float));
    for (int m = 0; m < k; m++) {
        int sync = m == k - 1, order[N_PARAMS];
        CHECK(ddp_reducer_begin(r, sync) == DDP_OK, "%s: begin(%d)", what, sync);
        make_order(kind, ddp_rank(ctx), m, order);
        for (int j = 0; j < N_PARAMS; j++) {
            add_grad(ctx, grads, acc, order[j], m);
            CHECK(ddp_reducer_mark_ready(r, order[j]) == DDP_OK, "%s: mark %d", what, order[j]);
        }
        if (!sync)
            check_local(ctx, grads, acc, host);
    }
    CHECK(ddp_reducer_finish(r) == DDP_OK, "%s: finish", what);
    check_mean(ctx, grads, host, k, what);
}

/* Two cycles on one reducer: the second must not see the first one's micro-steps. */
static void run_case(ddp_ctx *ctx, float *grads, order_kind kind, int k, const char *what)
{
    size_t n = offset[N_PARAMS];
    float *acc = calloc(n, sizeof *acc), *host = calloc(n, sizeof *host);
    ddp_reducer *r = make_reducer(ctx, grads);
    for (int cycle = 0; r && acc && host && cycle < 2; cycle++)
        run_cycle(ctx, r, grads, acc, host, kind, k, what);
    ddp_reducer_destroy(r);
    free(acc);
    free(host);
}

static void test_plan(ddp_ctx *ctx, float *grads)
{
    ddp_reducer *r = make_reducer(ctx, grads);
    ddp_bucket want[N_PARAMS];
    int nb = 0;
    ddp_plan_buckets(numel, N_PARAMS, (size_t)CAP_BYTES, (size_t)FIRST_CAP_BYTES, want, &nb);
    CHECK(ddp_reducer_n_buckets(r) == nb && nb >= 6, "reducer has %d buckets, plan %d",
          ddp_reducer_n_buckets(r), nb);
    CHECK(r && memcmp(ddp_reducer_buckets(r), want, (size_t)nb * sizeof *want) == 0,
          "reducer buckets differ from ddp_plan_buckets with the caps in bytes");
    ddp_reducer_destroy(r);
}

/* Misuse is reported; every rank misuses alike, so nothing hangs. */
static void test_misuse(ddp_ctx *ctx, float *grads)
{
    ddp_reducer *r = make_reducer(ctx, grads);
    if (!r)
        return;
    CHECK(ddp_reducer_mark_ready(r, 0) == DDP_ERR_STATE, "mark before begin");
    CHECK(ddp_reducer_finish(r) == DDP_ERR_STATE, "finish before begin");
    ddp_reducer_begin(r, 0);
    CHECK(ddp_reducer_mark_ready(r, -1) == DDP_ERR_INVALID_ARG, "mark -1 (sync 0)");
    CHECK(ddp_reducer_mark_ready(r, N_PARAMS) == DDP_ERR_INVALID_ARG, "mark n (sync 0)");
    CHECK(ddp_reducer_mark_ready(r, 3) == DDP_OK, "mark 3");
    CHECK(ddp_reducer_mark_ready(r, 3) == DDP_ERR_STATE, "mark 3 twice (sync 0)");
    CHECK(ddp_reducer_finish(r) == DDP_ERR_STATE, "finish on an accumulation step");
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin(1) after begin(0)");
    CHECK(ddp_reducer_mark_ready(r, N_PARAMS) == DDP_ERR_INVALID_ARG, "mark n (sync 1)");
    CHECK(ddp_reducer_begin(r, 1) == DDP_ERR_STATE, "begin while a sync step is open");
    for (int p = N_PARAMS - 1; p >= 0; p--)
        if (p != 4)
            ddp_reducer_mark_ready(r, p);
    CHECK(ddp_reducer_mark_ready(r, 9) == DDP_ERR_STATE, "mark 9 twice (sync 1)");
    CHECK(ddp_reducer_finish(r) == DDP_ERR_STATE, "finish with parameter 4 unmarked");
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin after a failed finish");
    for (int p = N_PARAMS - 1; p >= 0; p--)
        ddp_reducer_mark_ready(r, p);
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish after recovering");
    ddp_reducer_destroy(r);
    ddp_reducer_destroy(NULL);
    ddp_reducer *none = (ddp_reducer *)grads;
    CHECK(ddp_reducer_create(ctx, grads, numel, 0, NULL, &none) == DDP_ERR_INVALID_ARG && !none,
          "0 parameters accepted");
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_reducer", CHECK_GPU_PER_RANK, &ctx);
    if (rc != 0)
        return rc;
    for (int i = 0; i < N_PARAMS; i++)
        offset[i + 1] = offset[i] + numel[i];
    float *grads = ddp_alloc(ctx, offset[N_PARAMS] * sizeof(float));
    test_plan(ctx, grads);
    run_case(ctx, grads, ORDER_REVERSE, 1, "reverse, K=1");
    run_case(ctx, grads, ORDER_REVERSE, 3, "reverse, K=3");
    run_case(ctx, grads, ORDER_FORWARD, 2, "forward, K=2");
    run_case(ctx, grads, ORDER_SCRAMBLED, 1, "scrambled per rank, K=1");
    run_case(ctx, grads, ORDER_SCRAMBLED, 4, "scrambled per rank, K=4");
    test_misuse(ctx, grads);
    run_case(ctx, grads, ORDER_REVERSE, 2, "reverse after misuse, K=2");
    ddp_free(ctx, grads);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
