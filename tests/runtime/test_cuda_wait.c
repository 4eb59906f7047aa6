/* test_cuda_wait.c - on a GPU: the caller's CUDA work ordered with libddp's (ddp_stream_after,
 * ddp_after_stream, ddp_synchronize), and waits under the deadline.
 *   (no args)   ordering: a long chain of kernels on libddp's stream, then a plain cudaMemcpy
 *               after ddp_stream_after must see the chain's result (the same read without it is
 *               reported, not asserted: it may or may not be stale); data written by a memset on
 *               the caller's stream, then ddp_after_stream, must be what ddp_allreduce reduces.
 *   --timeout   with DDP_TIMEOUT set short by the caller (3 s in meson: the deadline also covers
 *               NCCL's start-up, which took over 0.5 s on a fresh H100): about 6 s of GEMMs on libddp's
 *               stream, an all-reduce queued behind them; ddp_synchronize must return
 *               DDP_ERR_TIMEOUT, not before the deadline and without hanging (ncclCommAbort
 *               frees device memory, which waits for the GEMMs already queued: on an H100 the
 *               call returned when they ended, 3.2 s for 150 of them, so the bound is loose),
 *               the next collective DDP_ERR_NCCL at once (the communicator was aborted), and
 *               ddp_finalize must return.
 * Exits 77 without a GPU. One rank.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "ddp.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static cublasHandle_t blas; /* on libddp's stream (ddp_backend_stream) */

/* x = 1 everywhere, then `rounds` passes of x *= 1 and one x *= 2 queued on libddp's stream. */
static void queue_chain(ddp_ctx *ctx, float *x, size_t n, int rounds)
{
    const float one = 1.0f, two = 2.0f;
    float *ones = malloc(n * sizeof *ones);
    for (size_t i = 0; ones && i < n; i++)
        ones[i] = 1.0f;
    CHECK(ones && ddp_upload(ctx, x, ones, n * sizeof *x) == DDP_OK, "upload");
    free(ones);
    for (int r = 0; r < rounds; r++)
        cublasSscal(blas, (int)n, &one, x, 1);
    cublasSscal(blas, (int)n, &two, x, 1);
}

static void test_stream_after(ddp_ctx *ctx, float *x, size_t n)
{
    float last = 0;
    queue_chain(ctx, x, n, 40);
    cudaMemcpy(&last, x + n - 1, sizeof last, cudaMemcpyDeviceToHost);
    printf("without ordering, a plain cudaMemcpy read %g (2 when complete%s)\n", (double)last,
           last == 2.0f ? "" : ": stale, the hazard ddp.h documents");
    CHECK(ddp_synchronize(ctx) == DDP_OK, "synchronize");
    queue_chain(ctx, x, n, 40);
    CHECK(ddp_stream_after(ctx, NULL) == DDP_OK, "ddp_stream_after(NULL)");
    CHECK(cudaMemcpy(&last, x + n - 1, sizeof last, cudaMemcpyDeviceToHost) == cudaSuccess,
          "cudaMemcpy");
    CHECK(last == 2.0f, "after ddp_stream_after a plain cudaMemcpy read %g, want 2", (double)last);
}

static void test_after_stream(ddp_ctx *ctx, float *x, size_t n)
{
    cudaStream_t mine;
    CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess, "stream");
    float *scratch = ddp_alloc(ctx, n * sizeof *x);
    CHECK(ddp_synchronize(ctx) == DDP_OK, "synchronize");
    for (int r = 0; r < 20; r++) /* keep the caller's stream busy before its write */
        cudaMemcpyAsync(scratch, x, n * sizeof *x, cudaMemcpyDeviceToDevice, mine);
    cudaMemsetAsync(x, 0, n * sizeof *x, mine); /* the caller's data: zeros */
    CHECK(ddp_after_stream(ctx, mine) == DDP_OK, "ddp_after_stream");
    CHECK(ddp_allreduce(ctx, x, n, DDP_SUM) == DDP_OK, "allreduce");
    float last = -1;
    CHECK(ddp_download(ctx, &last, x + n - 1, sizeof last) == DDP_OK, "download");
    CHECK(last == 0.0f, "all-reduce saw %g, want the caller's 0", (double)last);
    cudaStreamSynchronize(mine);
    cudaStreamDestroy(mine);
    ddp_free(ctx, scratch);
}

static void test_timeout(ddp_ctx *ctx)
{
    const int m = 8192;
    const float one = 1.0f, zero = 0.0f;
    float *a = ddp_alloc(ctx, (size_t)m * m * sizeof(float));
    float *c = ddp_alloc(ctx, (size_t)m * m * sizeof(float));
    CHECK(a && c, "alloc");
    for (int r = 0; a && c && r < 300; r++) /* ~21 ms each on an H100: 6 s, twice the deadline */
        cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a, m, a, m, &zero, c, m);
    float host_one = 1;
    CHECK(ddp_allreduce(ctx, c, 1, DDP_SUM) == DDP_OK, "all-reduce queued");
    double t0 = now_s();
    ddp_status st = ddp_synchronize(ctx);
    double waited = now_s() - t0, limit = atof(getenv("DDP_TIMEOUT"));
    printf("ddp_synchronize returned %s after %.3f s (DDP_TIMEOUT %.3g s)\n", ddp_strerror(st),
           waited, limit);
    CHECK(st == DDP_ERR_TIMEOUT, "synchronize returned %s, want DDP_ERR_TIMEOUT", ddp_strerror(st));
    CHECK(waited >= limit && waited < limit + 10.0, "waited %.3f s for a %.3g s deadline", waited,
          limit);
    CHECK(ddp_allreduce(ctx, &host_one, 1, DDP_SUM) == DDP_ERR_NCCL,
          "a collective after the abort must fail at once");
    ddp_free(ctx, a);
    ddp_free(ctx, c);
}

int main(int argc, char **argv)
{
    int timeout_case = argc == 2 && !strcmp(argv[1], "--timeout");
    if (ddp_cuda_device_count() == 0) {
        fprintf(stderr, "test_cuda_wait: skipped: no GPU\n");
        return TEST_SKIP;
    }
    if (timeout_case && !getenv("DDP_TIMEOUT")) {
        fprintf(stderr, "test_cuda_wait --timeout: set DDP_TIMEOUT (seconds)\n");
        return 2;
    }
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CUDA;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&opts, &ctx) != DDP_OK)
        return 1;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(blas, (cudaStream_t)ddp_backend_stream(ctx)) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "test_cuda_wait: cannot create a cuBLAS handle\n");
        return 1;
    }
    if (timeout_case) {
        test_timeout(ctx);
    } else {
        const size_t n = (size_t)64 << 20; /* 256 MiB: each pass takes ~0.2 ms */
        float *x = ddp_alloc(ctx, n * sizeof *x);
        CHECK(x != NULL, "alloc");
        if (x) {
            test_stream_after(ctx, x, n);
            test_after_stream(ctx, x, n);
        }
        ddp_free(ctx, x);
    }
    cublasDestroy(blas);
    double t0 = now_s();
    ddp_finalize(ctx);
    printf("ddp_finalize took %.3f s\n", now_s() - t0);
    return CHECK_DONE();
}
