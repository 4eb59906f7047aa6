/* test_cuda_deadline.cu - on a GPU: every host wait of libddp's memory ends at the deadline, and
 * ddp_alloc's zeroing is complete when it returns. One rank, one path per run, since the first
 * timeout aborts the NCCL communicator (every later wait then fails at once with DDP_ERR_NCCL):
 *   synchronize | download | staging | alloc
 *       with DDP_TIMEOUT set short by the caller (meson: 2 s), a kernel spinning on libddp's stream
 *       until the host sets a flag or 3 x DDP_TIMEOUT have passed, then the wait path: ddp_synchronize,
 *       ddp_download, ddp_stage_upload whose staging buffer is still being read behind the
 *       spinner, ddp_alloc (whose zeroing is queued behind it). Each must fail (DDP_ERR_TIMEOUT;
 *       ddp_alloc: NULL) after the deadline and well before the spinner would end by itself.
 *   free
 *       under the test-only NCCL with FAKE_NCCL_HANG_AFTER=0 (tests/nccl_fake): an all-reduce
 *       that never completes on the communicator's stream while libddp's stream is idle, then
 *       ddp_free: cudaFree waits for the whole device, so libddp must drain the communicator's
 *       stream under the deadline first and leave the memory allocated when it does not drain
 *       (returning at the deadline, not never).
 *   zeroed
 *       ddp_alloc of a buffer whose memory was dirtied just before (cudaMemset 0xff, freed), behind
 *       a slow kernel on libddp's stream; a kernel on a stream of the test's own, queued at once,
 *       must count no non-zero byte.
 * Exits 77 without a GPU.
 */
#include <cuda_runtime.h>
#include <stdio.h>
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

/* ================================================================================ kernels == */

static __device__ unsigned long long global_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Spins until *flag (host memory mapped into the device) is set or limit_ns have passed. */
__global__ void spin_kernel(const volatile int *flag, unsigned long long limit_ns)
{
    unsigned long long start = global_ns();
    while (!*flag && global_ns() - start < limit_ns) {
    }
}

__global__ void count_nonzero_kernel(const unsigned char *p, size_t n, unsigned int *count)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && p[i] != 0)
        atomicAdd(count, 1u);
}

/* ============================================================================== the checks == */

static int *flag_host, *flag_dev; /* the spinner's stop flag, pinned and mapped */

static bool spin(void *stream, double seconds)
{
    *(volatile int *)flag_host = 0;
    spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(flag_dev, (unsigned long long)(seconds * 1e9));
    return cudaGetLastError() == cudaSuccess;
}

/* Queues the spinner on libddp's stream, runs `path`, checks it failed within the deadline. */
static void check_path(ddp_ctx *ctx, const char *path, double limit)
{
    void *stream = ddp_backend_stream(ctx);
    size_t n = 1 << 20;
    char *host = (char *)calloc(n, 1);
    void *dev = ddp_alloc(ctx, n), *dev2 = ddp_alloc(ctx, n);
    CHECK(host && dev && dev2, "%s: buffers", path);
    /* warm-up: the pinned buffers exist before the spinner (allocating pinned memory may wait
     * for the device) */
    CHECK(ddp_download(ctx, host, dev, n) == DDP_OK && ddp_upload(ctx, dev2, host, n) == DDP_OK &&
              ddp_stage_upload(ctx, 0, 0, dev, host, n) == DDP_OK &&
              ddp_stage_acquire(ctx, 0) == DDP_OK && ddp_stage_release(ctx, 0) == DDP_OK &&
              ddp_synchronize(ctx) == DDP_OK,
          "%s: warm-up", path);
    ddp_request *req = NULL;
    if (strcmp(path, "free") == 0) {
        CHECK(ddp_allreduce_start(ctx, (float *)dev, 16, DDP_SUM, &req) == DDP_OK,
              "free: an all-reduce queued (it never completes)");
    } else if (strcmp(path, "staging") == 0) {
        /* the slot's last reader is the spinner: its upload waits on the copy stream, so the
         * second upload of the same part finds the staging buffer still in use */
        CHECK(spin(stream, 3 * limit), "spinner launched");
        CHECK(ddp_stage_release(ctx, 0) == DDP_OK, "release behind the spinner");
        CHECK(ddp_stage_upload(ctx, 0, 0, dev, host, n) == DDP_OK, "first upload is queued");
    } else {
        CHECK(spin(stream, 3 * limit), "spinner launched");
    }
    double t0 = now_s();
    ddp_status st = DDP_OK;
    if (strcmp(path, "synchronize") == 0)
        st = ddp_synchronize(ctx);
    else if (strcmp(path, "download") == 0)
        st = ddp_download(ctx, host, dev, n);
    else if (strcmp(path, "staging") == 0)
        st = ddp_stage_upload(ctx, 0, 0, dev, host, n);
    else if (strcmp(path, "free") == 0)
        ddp_free(ctx, dev2), st = DDP_ERR_TIMEOUT; /* void: returning in time is the check */
    else
        st = ddp_alloc(ctx, n) == NULL ? DDP_ERR_TIMEOUT : DDP_OK;
    double took = now_s() - t0;
    *(volatile int *)flag_host = 1;
    printf("%s: %s after %.2f s (DDP_TIMEOUT %.1f s)\n", path, ddp_strerror(st), took, limit);
    CHECK(st == DDP_ERR_TIMEOUT, "%s: want DDP_ERR_TIMEOUT, got %s", path, ddp_strerror(st));
    CHECK(took >= 0.9 * limit && took < 2.0 * limit, "%s: returned after %.2f s, deadline %.1f s",
          path, took, limit);
    if (req)
        (void)ddp_wait(req); /* the communicator was aborted at the deadline: an error, freed */
    free(host);
}

static void check_zeroed(ddp_ctx *ctx)
{
    const size_t n = (size_t)64 << 20;
    void *dirty = NULL;
    CHECK(cudaMalloc(&dirty, n) == cudaSuccess && cudaMemset(dirty, 0xff, n) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess && cudaFree(dirty) == cudaSuccess,
          "dirtying device memory");
    CHECK(spin(ddp_backend_stream(ctx), 0.2), "slow kernel on libddp's stream");
    unsigned char *p = (unsigned char *)ddp_alloc(ctx, n);
    cudaStream_t mine = NULL;
    unsigned int *count = NULL, host_count = ~0u;
    CHECK(p && cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess &&
              cudaMalloc(&count, sizeof *count) == cudaSuccess,
          "ddp_alloc, the test's stream");
    if (!p || !mine || !count)
        return;
    cudaMemsetAsync(count, 0, sizeof *count, mine);
    count_nonzero_kernel<<<(unsigned)((n + 255) / 256), 256, 0, mine>>>(p, n, count);
    cudaMemcpyAsync(&host_count, count, sizeof host_count, cudaMemcpyDeviceToHost, mine);
    CHECK(cudaStreamSynchronize(mine) == cudaSuccess, "the test's stream");
    CHECK(host_count == 0, "%u non-zero bytes seen by a kernel on another stream", host_count);
    cudaFree(count);
    cudaStreamDestroy(mine);
    ddp_free(ctx, p);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "zeroed";
    if (ddp_cuda_device_count() == 0) {
        fprintf(stderr, "test_cuda_deadline: skipped: no usable GPU\n");
        return TEST_SKIP;
    }
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CUDA;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    CHECK(cudaHostAlloc((void **)&flag_host, sizeof *flag_host, cudaHostAllocMapped) == cudaSuccess &&
              cudaHostGetDevicePointer((void **)&flag_dev, flag_host, 0) == cudaSuccess,
          "mapped flag");
    const char *env = getenv("DDP_TIMEOUT");
    double limit = env ? atof(env) : 300.0;
    if (strcmp(path, "zeroed") == 0)
        check_zeroed(ctx);
    else if (limit > 30)
        CHECK(0, "set DDP_TIMEOUT short (a few seconds) for the %s path", path);
    else
        check_path(ctx, path, limit);
    ddp_finalize(ctx);
    return CHECK_DONE();
}
