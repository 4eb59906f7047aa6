/* test_fake_nccl.c - the test-only NCCL (fake_nccl.c) at 2-4 ranks, under mpirun: its identity,
 * every collective libddp uses with closed-form results (rank r fills x[i] = r + i), in place and
 * not, bf16/fp16 sums done in fp32 (2048 + 1 + 1 is 2050 in fp16 only if the sum is not rounded
 * per step), reduce-scatter and all-gather of unequal blocks as groups of ncclReduce and
 * ncclBroadcast, refused arguments (nothing queued, the group discarded), and the injected faults:
 * an asynchronous error after N operations, a hang that ncclCommAbort ends within a deadline (on
 * the hanging rank and on a rank waiting in MPI for it), a delay measured on the stream.
 * Two builds: test_fake_nccl (the library on a GPU: device buffers, one stream; exits 77 without
 * a GPU) and test_fake_nccl_host (-DFAKE_NCCL_TEST_HOST=1: the same library code with host
 * buffers and the calling thread as the stream, so it runs without CUDA).
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "fake_half.h"
#include "fake_nccl.h"

#if !FAKE_NCCL_TEST_HOST
#include <cuda_runtime.h>
#endif

static int rank, world;
static cudaStream_t stream;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- buffers: device memory on a GPU, host memory in the host build ------------------------- */

#if FAKE_NCCL_TEST_HOST
static void *dev_alloc(size_t n_bytes) { return calloc(n_bytes ? n_bytes : 1, 1); }
static void dev_free(void *p) { free(p); }
static void to_dev(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void from_dev(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void sync_stream(void) {}
static int stream_done(void) { return 1; }
static int gpu_setup(void) { return 0; }
#else
/* Zeroing and uploads on the collectives' stream, waited for: `stream` is non-blocking, so work on
 * the legacy default stream (cudaMemset, or cudaMemcpy from pageable memory, whose DMA may still be
 * running when it returns) would not be ordered before the collectives that read it. */
static void *dev_alloc(size_t n_bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, n_bytes ? n_bytes : 1) != cudaSuccess)
        return NULL;
    CHECK(cudaMemsetAsync(p, 0, n_bytes ? n_bytes : 1, stream) == cudaSuccess &&
          cudaStreamSynchronize(stream) == cudaSuccess, "zeroing");
    return p;
}
static void dev_free(void *p) { cudaFree(p); }
static void to_dev(void *dst, const void *src, size_t n)
{
    CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream) == cudaSuccess &&
          cudaStreamSynchronize(stream) == cudaSuccess, "upload");
}
static void from_dev(void *dst, const void *src, size_t n)
{
    cudaStreamSynchronize(stream);
    cudaMemcpy(dst, src, n, cudaMemcpyDefault);
}
static void sync_stream(void) { CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "stream sync"); }
static int stream_done(void) { return cudaStreamQuery(stream) != cudaErrorNotReady; }
/* Every rank on device 0 (the point of the fake); 77 without a GPU. */
static int gpu_setup(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        if (rank == 0)
            fprintf(stderr, "test_fake_nccl: skipped: no GPU\n");
        return TEST_SKIP;
    }
    cudaSetDevice(0);
    return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess ? 0 : 1;
}
#endif

static ncclComm_t open_comm(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    if (rank == 0)
        CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclResult_t r = ncclCommInitRank(&comm, world, id, rank);
    CHECK(r == ncclSuccess, "ncclCommInitRank: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    return comm;
}

/* x[i] = rank + i as floats, on the device. */
static float *dev_ramp(size_t n)
{
    float *host = malloc(n * sizeof *host), *dev = dev_alloc(n * sizeof *dev);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)(rank + (int)i);
    to_dev(dev, host, n * sizeof *host);
    free(host);
    return dev;
}

/* Checks dev[i] == base + scale * i for i < n (first 3 mismatches printed). */
static void expect_ramp(const float *dev, size_t n, double base, double scale, const char *what)
{
    float *host = malloc(n * sizeof *host);
    from_dev(host, dev, n * sizeof *host);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (host[i] != (float)(base + scale * (double)i) && bad++ < 3)
            CHECK(0, "%s: [%zu] = %g, want %g", what, i, host[i], base + scale * (double)i);
    free(host);
}

/* ---- checks ----------------------------------------------------------------------------------- */

static void test_identity(void)
{
    int v = 0;
    CHECK(ncclGetVersion(&v) == ncclSuccess && v == FAKE_NCCL_VERSION_CODE, "version %d", v);
    CHECK(v % 100 == 99 && fake_nccl_marker == v, "marker %d, version %d", fake_nccl_marker, v);
}

/* Bit patterns of the conversions, and every 16-bit value through fp32 and back. */
static void test_half_bits(void)
{
    CHECK(fake_f32_to_f16(1.0f) == 0x3c00 && fake_f32_to_f16(65504.0f) == 0x7bff, "f16 normals");
    CHECK(fake_f32_to_f16(65520.0f) == 0x7c00 && fake_f32_to_f16(-0.0f) == 0x8000, "f16 inf, -0");
    CHECK(fake_f32_to_f16(0x1p-24f) == 0x0001 && fake_f32_to_f16(0x1p-25f) == 0, "f16 subnormals");
    CHECK(fake_f32_to_f16(0x1.8p-24f) == 0x0002 && fake_f32_to_f16(2049.0f) == 0x6800, "f16 ties");
    CHECK(fake_f32_to_bf16(1.0f) == 0x3f80 && fake_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie");
    CHECK(fake_f32_to_bf16(1.0f + 0x1.8p-7f) == 0x3f82, "bf16 round up");
    int bad16 = 0, bad_bf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        int nan16 = (h & 0x7c00) == 0x7c00 && (h & 0x3ff), nan_bf = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        bad16 += !nan16 && fake_f32_to_f16(fake_f16_to_f32((uint16_t)h)) != h;
        bad_bf += !nan_bf && fake_f32_to_bf16(fake_bf16_to_f32((uint16_t)h)) != h;
    }
    CHECK(bad16 == 0 && bad_bf == 0, "round trips: %d fp16, %d bf16 values changed", bad16, bad_bf);
}

static void test_allreduce(ncclComm_t comm, size_t n)
{
    float *x = dev_ramp(n), *y = dev_alloc(n * sizeof *y);
    double ranks = world * (world - 1) / 2.0;
    CHECK(ncclAllReduce(x, y, n, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "sum");
    expect_ramp(y, n, ranks, world, "allreduce sum");
    CHECK(ncclAllReduce(x, x, n, ncclFloat32, ncclMax, comm, stream) == ncclSuccess, "max");
    expect_ramp(x, n, world - 1, 1, "allreduce max in place");
    dev_free(x);
    x = dev_ramp(n);
    CHECK(ncclAllReduce(x, y, n, ncclFloat32, ncclAvg, comm, stream) == ncclSuccess, "avg");
    expect_ramp(y, n, ranks / world, 1, "allreduce avg");
    dev_free(x);
    dev_free(y);
}

/* 16-bit sums: rank 0 has big, the others 1; the fp32 sum is rounded once. */
static void test_half_sum(ncclComm_t comm, ncclDataType_t type, float big, uint16_t want)
{
    uint16_t h[3], *d = dev_alloc(sizeof h);
    for (int i = 0; i < 3; i++) {
        float v = rank == 0 ? big : 1.0f;
        h[i] = type == ncclBfloat16 ? fake_f32_to_bf16(v) : fake_f32_to_f16(v);
    }
    to_dev(d, h, sizeof h);
    CHECK(ncclAllReduce(d, d, 3, type, ncclSum, comm, stream) == ncclSuccess, "16-bit sum");
    from_dev(h, d, sizeof h);
    CHECK(h[0] == want && h[2] == want, "type %d: sum 0x%04x, want 0x%04x", (int)type, h[0], want);
    dev_free(d);
}

/* Equal blocks: ncclReduceScatter out of place and in place. */
static void test_reduce_scatter(ncclComm_t comm, size_t n)
{
    float *x = dev_ramp(n * (size_t)world), *y = dev_alloc(n * sizeof *y);
    double ranks = world * (world - 1) / 2.0, first = (double)n * rank;
    CHECK(ncclReduceScatter(x, y, n, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "rs");
    expect_ramp(y, n, ranks + world * first, world, "reduce-scatter");
    float *mine = x + n * (size_t)rank;
    CHECK(ncclReduceScatter(x, mine, n, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "rs in place");
    expect_ramp(mine, n, ranks + world * first, world, "reduce-scatter in place");
    dev_free(x);
    dev_free(y);
}

/* Unequal blocks (rank q's has q + 2 elements) as a group of ncclReduce, in place. */
static void test_reduce_group(ncclComm_t comm)
{
    size_t total = 0, at = 0;
    for (int q = 0; q < world; q++)
        total += (size_t)q + 2;
    float *x = dev_ramp(total);
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    for (int q = 0, off = 0; q < world; off += q + 2, q++) {
        if (q == rank)
            at = (size_t)off;
        CHECK(ncclReduce(x + off, x + off, (size_t)q + 2, ncclFloat32, ncclSum, q, comm, stream) ==
              ncclSuccess, "reduce %d", q);
    }
    CHECK(ncclGroupEnd() == ncclSuccess, "group end");
    expect_ramp(x + at, (size_t)rank + 2, world * (world - 1) / 2.0 + world * (double)at, world,
                "reduce group");
    dev_free(x);
}

/* Equal blocks: ncclAllGather out of place and in place; x[i] = rank + i per block. */
static void test_allgather(ncclComm_t comm, size_t n)
{
    float *mine = dev_ramp(n), *all = dev_alloc(n * (size_t)world * sizeof *all);
    CHECK(ncclAllGather(mine, all, n, ncclFloat32, comm, stream) == ncclSuccess, "allgather");
    for (int q = 0; q < world; q++)
        expect_ramp(all + n * (size_t)q, n, q, 1, "allgather");
    float *slot = all + n * (size_t)rank;
    CHECK(ncclAllGather(slot, all, n, ncclFloat32, comm, stream) == ncclSuccess, "allgather in place");
    for (int q = 0; q < world; q++)
        expect_ramp(all + n * (size_t)q, n, q, 1, "allgather in place");
    dev_free(mine);
    dev_free(all);
}

/* Unequal blocks as a group of ncclBroadcast (root q sends block q, in place), and a plain
 * broadcast from the last rank. */
static void test_broadcast_group(ncclComm_t comm)
{
    enum { MAX = 8 };
    float *all = dev_alloc((size_t)MAX * MAX * sizeof *all);
    float *mine = dev_ramp((size_t)rank + 1);
    to_dev(all + MAX * rank, mine, ((size_t)rank + 1) * sizeof *mine);
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    for (int q = 0; q < world; q++)
        CHECK(ncclBroadcast(all + MAX * q, all + MAX * q, (size_t)q + 1, ncclFloat32, q, comm,
                            stream) == ncclSuccess, "broadcast %d", q);
    CHECK(ncclGroupEnd() == ncclSuccess, "group end");
    for (int q = 0; q < world; q++)
        expect_ramp(all + MAX * q, (size_t)q + 1, q, 1, "broadcast group");
    CHECK(ncclBroadcast(mine, all, 1, ncclFloat32, world - 1, comm, stream) == ncclSuccess, "bcast");
    expect_ramp(all, 1, world - 1, 0, "broadcast from the last rank");
    dev_free(all);
    dev_free(mine);
}

/* Refusals queue nothing: x keeps its values. */
static void test_refusals(ncclComm_t comm)
{
    float *x = dev_ramp(4), *y = dev_alloc(8 * sizeof *y);
    CHECK(ncclBroadcast(x, x, 4, ncclFloat32, world, comm, stream) == ncclInvalidArgument, "root");
    CHECK(strstr(ncclGetLastError(NULL), "invalid root") != NULL, "%s", ncclGetLastError(NULL));
    CHECK(ncclAllReduce(x, x, 4, ncclNumTypes, ncclSum, comm, stream) == ncclInvalidArgument, "type");
    CHECK(ncclAllReduce(x, x, 4, ncclFloat32, ncclNumOps, comm, stream) == ncclInvalidArgument, "op");
    CHECK(ncclAllReduce(x, x, 4, ncclFloat8e4m3, ncclSum, comm, stream) == ncclInvalidArgument, "fp8");
    CHECK(ncclAllReduce(NULL, x, 4, ncclFloat32, ncclSum, comm, stream) == ncclInvalidArgument, "NULL");
    CHECK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, NULL, stream) == ncclInvalidArgument, "comm");
    CHECK(ncclAllReduce(y, y + 1, 4, ncclFloat32, ncclSum, comm, stream) == ncclInvalidArgument,
          "overlap accepted");
    if (world > 1) /* send inside recv, but not at this rank's block: refused on every rank */
        CHECK(ncclAllGather(y + (rank + 1) % world, y, 1, ncclFloat32, comm, stream) ==
              ncclInvalidArgument, "all-gather's in-place rule");
#if !FAKE_NCCL_TEST_HOST
    float pageable[4] = {0};
    CHECK(ncclAllReduce(pageable, pageable, 4, ncclFloat32, ncclSum, comm, stream) ==
          ncclInvalidArgument, "pageable host memory accepted");
#endif
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    CHECK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "in group");
    CHECK(ncclReduce(x, x, 4, ncclFloat32, ncclSum, -1, comm, stream) == ncclInvalidArgument, "root");
    CHECK(ncclGroupEnd() == ncclInvalidArgument, "a group with a refused call must fail");
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd outside a group");
    expect_ramp(x, 4, rank, 1, "after refusals");
    dev_free(x);
    dev_free(y);
}

static ncclComm_t open_with(const char *var, const char *value, const char *only_rank)
{
    setenv(var, value, 1);
    if (only_rank)
        setenv("FAKE_NCCL_RANK", only_rank, 1);
    ncclComm_t comm = open_comm();
    unsetenv(var);
    unsetenv("FAKE_NCCL_RANK");
    return comm;
}

/* FAKE_NCCL_ASYNC_ERROR_AFTER=2: operations 0 and 1 work, 2 leaves its output and reports. */
static void test_async_error(void)
{
    ncclComm_t comm = open_with("FAKE_NCCL_ASYNC_ERROR_AFTER", "2", NULL);
    float *x = dev_ramp(5);
    ncclResult_t async = ncclInternalError;
    for (int i = 0; i < 2; i++)
        CHECK(ncclAllReduce(x, x, 5, ncclFloat32, ncclMax, comm, stream) == ncclSuccess, "op %d", i);
    expect_ramp(x, 5, world - 1, 1, "before the error");
    CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess, "no error yet");
    CHECK(ncclAllReduce(x, x, 5, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "op 2 queued");
    sync_stream();
    CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclRemoteError,
          "async error %d, want ncclRemoteError", (int)async);
    CHECK(strstr(ncclGetLastError(comm), "FAKE_NCCL_ASYNC_ERROR_AFTER") != NULL, "last error: %s",
          ncclGetLastError(comm));
    expect_ramp(x, 5, world - 1, 1, "the failed operation changed its output");
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
    dev_free(x);
}

static void *abort_later(void *comm)
{
    const struct timespec wait = {0, 300000000L};
    nanosleep(&wait, NULL);
    ncclCommAbort(comm);
    return NULL;
}

/* FAKE_NCCL_HANG_AFTER=1 (on every rank, or only rank 1 while the others wait in MPI for it):
 * operation 1 completes only when a thread aborts the communicator 0.3 s later. */
static void test_hang(const char *only_rank)
{
    ncclComm_t comm = open_with("FAKE_NCCL_HANG_AFTER", "1", only_rank);
    float *x = dev_ramp(3);
    CHECK(ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "op 0");
    sync_stream();
    pthread_t aborter;
    double t0 = now_s();
    pthread_create(&aborter, NULL, abort_later, comm);
    CHECK(ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "op 1 queued");
    while (!stream_done() && now_s() - t0 < 10.0) {
        const struct timespec nap = {0, 1000000L};
        nanosleep(&nap, NULL);
    }
    double waited = now_s() - t0;
    pthread_join(aborter, NULL);
    printf("rank %d: hang (%s) ended after %.3f s\n", rank, only_rank ? "rank 1 only" : "every rank",
           waited);
    CHECK(stream_done() && waited >= 0.25 && waited < 5.0, "hang ended after %.3f s, want 0.3",
          waited);
    dev_free(x);
}

/* FAKE_NCCL_DELAY_MS=200: the stream is busy for 0.2 s per operation; on a GPU the call itself
 * returns at once (the host function sleeps, not the caller). */
static void test_delay(void)
{
    ncclComm_t comm = open_with("FAKE_NCCL_DELAY_MS", "200", NULL);
    float *x = dev_ramp(3);
    double t0 = now_s();
    CHECK(ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, stream) == ncclSuccess, "delayed op");
    double issued = now_s() - t0;
    sync_stream();
    double done = now_s() - t0;
    printf("rank %d: delayed all-reduce issued in %.3f s, done after %.3f s\n", rank, issued, done);
    CHECK(done >= 0.19 && done < 2.0, "done after %.3f s, want 0.2", done);
    CHECK(FAKE_NCCL_TEST_HOST || issued < 0.1, "the call waited %.3f s for the delay", issued);
    expect_ramp(x, 3, world * (world - 1) / 2.0, world, "delayed all-reduce");
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    dev_free(x);
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int setup = provided == MPI_THREAD_MULTIPLE ? gpu_setup() : 1;
    if (setup) {
        MPI_Finalize();
        return setup;
    }
    test_identity();
    test_half_bits();
    ncclComm_t comm = open_comm();
    test_allreduce(comm, 1);
    test_allreduce(comm, 1001);
    test_half_sum(comm, ncclFloat16, 2048.0f, world <= 2 ? 0x6800 : world == 3 ? 0x6801 : 0x6802);
    test_half_sum(comm, ncclBfloat16, 256.0f, world <= 2 ? 0x4380 : world == 3 ? 0x4381 : 0x4382);
    test_reduce_scatter(comm, 7);
    test_reduce_group(comm);
    test_allgather(comm, 5);
    test_broadcast_group(comm);
    test_refusals(comm);
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    test_async_error();
    test_delay();
    test_hang(NULL);
    if (world > 1)
        test_hang("1");
    int failed = CHECK_DONE(), any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_fake_nccl: %d rank(s), %s\n", world, any ? "FAILED" : "passed");
    MPI_Finalize();
    return any;
}
