/* test_comm.c - the collectives under real mpirun (any world size): all-reduce SUM and AVG on
 * inputs with a closed-form result (rank r fills x[i] = r + i, so the sum is W*i + W*(W-1)/2),
 * odd sizes, 50 outstanding non-blocking all-reduces waited in order, broadcast from the last
 * rank, all-gather, a barrier that really waits, and argument errors.
 * With DDP_COMM_MAX_CHUNK set small, the same checks cover the chunked MPI paths.
 * Data is staged through host memory (ddp_upload / ddp_download), so `--backend cuda` runs the
 * same checks on NCCL and device memory; it exits 77 where there is no GPU, or fewer GPUs than
 * ranks on this host (NCCL needs one GPU per rank).
 * Exactness: SUM must match the closed form bit for bit everywhere (small integers). AVG is exact
 * on MPI (sum, then one division); NCCL's ncclAvg pre-multiplies each input by 1/world before
 * summing (NCCL's documentation of ncclAvg), which rounds each of the `world` products and the
 * world - 1 partial sums: on CUDA, AVG is allowed (world + 1) * 2^-23 * |want|, twice the
 * first-order bound of those 2 * world roundings of 2^-24 relative each. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ddp.h"

#define N_BUCKETS 50

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Rank r's input: x[i] = r + i + shift; all values are exact in float for the sizes used. */
static void fill(float *x, size_t n, int rank, size_t shift)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((size_t)rank + i + shift);
}

/* Backend copy of host[0..n_bytes); aborts the job on failure (peers would wait for us). */
static void *stage_in(ddp_ctx *ctx, const void *host, size_t n_bytes)
{
    void *dev = ddp_alloc(ctx, n_bytes);
    if (!dev || ddp_upload(ctx, dev, host, n_bytes) != DDP_OK) {
        fprintf(stderr, "cannot stage %zu bytes to the backend\n", n_bytes);
        ddp_abort(ctx, 1);
    }
    return dev;
}

/* Copies dev back into host and frees dev. */
static void stage_out(ddp_ctx *ctx, void *host, void *dev, size_t n_bytes)
{
    CHECK(ddp_download(ctx, host, dev, n_bytes) == DDP_OK, "download %zu bytes", n_bytes);
    ddp_free(ctx, dev);
}

static void *host_alloc(ddp_ctx *ctx, size_t n_bytes)
{
    void *p = malloc(n_bytes);
    if (!p)
        ddp_abort(ctx, 1);
    return p;
}

static int avg_premultiplied; /* NCCL's ncclAvg: see the tolerance at the top */

/* Counts elements that differ from the closed form; prints the first few. */
static int count_wrong(const float *x, size_t n, int world, size_t shift, ddp_reduce_op op,
                       const char *what)
{
    int wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double sum = (double)world * (double)(i + shift) + world * (world - 1) / 2.0;
        double want = op == DDP_AVG ? sum / world : sum;
        if (op == DDP_MAX || op == DDP_MIN) /* rank r holds r + i + shift */
            want = (double)(i + shift) + (op == DDP_MAX ? world - 1 : 0);
        double tol = op == DDP_AVG && avg_premultiplied ? (world + 1) * 0x1p-23 * fabs(want) : 0;
        if (fabs((double)x[i] - want) > tol && wrong++ < 3)
            fprintf(stderr, "%s: x[%zu] = %.9g, want %.9g\n", what, i, (double)x[i], want);
    }
    return wrong;
}

static void test_allreduce(ddp_ctx *ctx, size_t n, ddp_reduce_op op)
{
    int rank = ddp_rank(ctx), world = ddp_world_size(ctx);
    float *x = host_alloc(ctx, n * sizeof *x);
    fill(x, n, rank, 0);
    float *dev = stage_in(ctx, x, n * sizeof *x);
    CHECK(ddp_allreduce(ctx, dev, n, op) == DDP_OK, "allreduce n=%zu", n);
    stage_out(ctx, x, dev, n * sizeof *x);
    char what[64];
    static const char *const names[] = {"sum", "avg", "max", "min"};
    snprintf(what, sizeof what, "allreduce %s n=%zu", names[op], n);
    CHECK(count_wrong(x, n, world, 0, op, what) == 0, "%s has wrong elements", what);
    free(x);
}

/* Bucket b: n_b elements, x[i] = r + i + b, SUM for even b and AVG for odd b. */
static size_t bucket_n(int b)
{
    return 1 + (size_t)(b * 997) % 5003;
}

static void test_outstanding(ddp_ctx *ctx)
{
    int rank = ddp_rank(ctx), world = ddp_world_size(ctx);
    float *host[N_BUCKETS], *dev[N_BUCKETS];
    ddp_request *req[N_BUCKETS];
    for (int b = 0; b < N_BUCKETS; b++) {
        host[b] = host_alloc(ctx, bucket_n(b) * sizeof(float));
        fill(host[b], bucket_n(b), rank, (size_t)b);
        dev[b] = stage_in(ctx, host[b], bucket_n(b) * sizeof(float));
    }
    for (int b = 0; b < N_BUCKETS; b++) {
        ddp_reduce_op op = b % 2 ? DDP_AVG : DDP_SUM;
        CHECK(ddp_allreduce_start(ctx, dev[b], bucket_n(b), op, &req[b]) == DDP_OK, "start %d", b);
        CHECK(req[b] != NULL, "request %d", b);
    }
    /* A blocking collective while the non-blocking ones are in flight must not mix with them. */
    CHECK(ddp_barrier(ctx) == DDP_OK, "barrier with outstanding requests");
    for (int b = 0; b < N_BUCKETS; b++) {
        ddp_reduce_op op = b % 2 ? DDP_AVG : DDP_SUM;
        CHECK(ddp_wait(req[b]) == DDP_OK, "wait %d", b);
        stage_out(ctx, host[b], dev[b], bucket_n(b) * sizeof(float));
        CHECK(count_wrong(host[b], bucket_n(b), world, (size_t)b, op, "bucket") == 0,
              "bucket %d (n=%zu) wrong", b, bucket_n(b));
        free(host[b]);
    }
}

static unsigned char pattern(int rank, size_t i)
{
    return (unsigned char)((size_t)rank * 31u + i * 7u + 3u);
}

static void test_broadcast(ddp_ctx *ctx, size_t n_bytes)
{
    int rank = ddp_rank(ctx), root = ddp_world_size(ctx) - 1;
    unsigned char *x = host_alloc(ctx, n_bytes);
    for (size_t i = 0; i < n_bytes; i++)
        x[i] = rank == root ? pattern(root, i) : 0;
    void *dev = stage_in(ctx, x, n_bytes);
    CHECK(ddp_broadcast(ctx, dev, n_bytes, root) == DDP_OK, "broadcast");
    stage_out(ctx, x, dev, n_bytes);
    size_t wrong = 0;
    for (size_t i = 0; i < n_bytes; i++)
        wrong += x[i] != pattern(root, i);
    CHECK(wrong == 0, "broadcast of %zu bytes from rank %d: %zu wrong", n_bytes, root, wrong);
    free(x);
}

static void test_allgather(ddp_ctx *ctx, size_t n_bytes)
{
    int rank = ddp_rank(ctx), world = ddp_world_size(ctx);
    size_t n_recv = n_bytes * (size_t)world;
    unsigned char *send = host_alloc(ctx, n_bytes), *recv = host_alloc(ctx, n_recv);
    for (size_t i = 0; i < n_bytes; i++)
        send[i] = pattern(rank, i);
    memset(recv, 0, n_recv);
    void *dev_send = stage_in(ctx, send, n_bytes), *dev_recv = stage_in(ctx, recv, n_recv);
    CHECK(ddp_allgather(ctx, dev_send, dev_recv, n_bytes) == DDP_OK, "allgather");
    stage_out(ctx, recv, dev_recv, n_recv);
    ddp_free(ctx, dev_send);
    size_t wrong = 0;
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < n_bytes; i++)
            wrong += recv[(size_t)r * n_bytes + i] != pattern(r, i);
    CHECK(wrong == 0, "allgather of %zu bytes: %zu wrong", n_bytes, wrong);
    free(send);
    free(recv);
}

/* Rank 0 arrives 300 ms late: every other rank must spend most of that time in the barrier. */
static void test_barrier(ddp_ctx *ctx)
{
    CHECK(ddp_barrier(ctx) == DDP_OK, "first barrier");
    if (ddp_rank(ctx) == 0)
        usleep(300 * 1000);
    double t0 = now_s();
    CHECK(ddp_barrier(ctx) == DDP_OK, "barrier");
    double waited = now_s() - t0;
    if (ddp_rank(ctx) != 0)
        CHECK(waited > 0.2, "rank %d left the barrier after %.3f s, before rank 0 arrived",
              ddp_rank(ctx), waited);
}

static void test_bad_args(ddp_ctx *ctx)
{
    float x = 1.0f;
    ddp_request *req = (ddp_request *)&x;
    CHECK(ddp_broadcast(ctx, &x, sizeof x, ddp_world_size(ctx)) == DDP_ERR_INVALID_ARG,
          "root out of range");
    CHECK(ddp_allreduce(ctx, NULL, 4, DDP_SUM) == DDP_ERR_INVALID_ARG, "NULL buffer");
    CHECK(ddp_allreduce_start(ctx, NULL, 4, DDP_SUM, &req) == DDP_ERR_INVALID_ARG,
          "NULL buffer, non-blocking");
    CHECK(req == NULL, "failed start leaves *req NULL");
    CHECK(ddp_wait(NULL) == DDP_ERR_INVALID_ARG, "wait(NULL)");
    CHECK(ddp_allreduce(NULL, &x, 1, DDP_SUM) == DDP_ERR_STATE, "no context");
}

/* 1 (with the reason on stderr) when this host has fewer GPUs than ranks. */
static int skip_without_gpus(void)
{
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int ranks = local ? atoi(local) : 1, gpus = ddp_cuda_device_count();
    if (gpus >= ranks)
        return 0;
    fprintf(stderr, "test_comm: skipped: %d rank(s) on this host but %d GPU(s); NCCL needs one "
            "GPU per rank\n", ranks, gpus);
    return 1;
}

int main(int argc, char **argv)
{
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    if (argc == 3 && !strcmp(argv[1], "--backend")) {
        if (ddp_backend_parse(argv[2], &opts.backend) != DDP_OK)
            return 2;
    } else if (argc != 1) {
        fprintf(stderr, "usage: test_comm [--backend cpu|cuda]\n");
        return 2;
    }
    if (opts.backend == DDP_BACKEND_CUDA && skip_without_gpus())
        return TEST_SKIP;
    avg_premultiplied = opts.backend == DDP_BACKEND_CUDA;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&opts, &ctx);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp_init: %s\n", ddp_strerror(st));
        return 1;
    }
    static const size_t sizes[] = {1, 7, 1023, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        test_allreduce(ctx, sizes[k], DDP_SUM);
        test_allreduce(ctx, sizes[k], DDP_AVG);
        test_allreduce(ctx, sizes[k], DDP_MAX);
        test_allreduce(ctx, sizes[k], DDP_MIN);
    }
    test_outstanding(ctx);
    test_broadcast(ctx, 1000003);
    test_allgather(ctx, 1);
    test_allgather(ctx, 100003);
    test_barrier(ctx);
    test_bad_args(ctx);
    int rc = CHECK_DONE();
    if (rc == 0 && ddp_rank(ctx) == 0)
        printf("test_comm: %d ranks passed\n", ddp_world_size(ctx));
    ddp_finalize(ctx);
    return rc;
}
