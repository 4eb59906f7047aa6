/* test_reducer16.c - the reducer with 16-bit gradients or a 16-bit wire, and the host all-reduce,
 * under real mpirun (2 and 3 ranks).
 *
 * Closed form: rank r fills grad[i] = r + i, so the mean over W ranks is i + (W - 1) / 2.
 * Exact cases: with i < 80 every contribution, every partial sum (<= 3 * 81 < 256) and every mean
 * is an integer or a half-integer below 256 with at most 8 significant bits: exactly
 * representable in bf16 (8 bits) and fp16 (11 bits), so any summation order gives the exact
 * answer. Rounded case: i up to 4000 (not representable in bf16): each of the 1 + (W - 1)
 * roundings to the 16-bit type (cast, then one per pairwise sum) is within half a unit in the last
 * place, 2^-9 relative for bf16 and 2^-12 for fp16, so the tolerance is W * 2^-8 (bf16) or
 * W * 2^-11 (fp16) relative, twice that bound.
 * Bytes: the communicator's payload counter grows by elements x 2 per step on a 16-bit wire and
 * elements x 4 on fp32: 16 bits halve it.
 * Data is staged through host memory, so `--backend cuda` runs the same checks on device memory
 * (the cast kernels, NCCL's bf16/fp16); it exits 77 where there is no GPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "half.h"

#define N_PARAMS 5
static const size_t numel[N_PARAMS] = {3, 17, 1, 40, 19}; /* 80 elements: the exact case */
static const size_t numel_big[N_PARAMS] = {1000, 7, 2000, 993, 1};

static size_t total(const size_t *sizes)
{
    size_t n = 0;
    for (int p = 0; p < N_PARAMS; p++)
        n += sizes[p];
    return n;
}

/* Writes v[0..n) into buf as type t (host memory: the CPU backend). */
static void store(void *buf, ddp_dtype t, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t == DDP_FP32)
            ((float *)buf)[i] = v[i];
        else
            ((uint16_t *)buf)[i] = half_encode(v[i], t == DDP_FP16);
    }
}

static float load(const void *buf, ddp_dtype t, size_t i)
{
    return t == DDP_FP32 ? ((const float *)buf)[i] : half_decode(((const uint16_t *)buf)[i], t == DDP_FP16);
}

/* One sync step: fill, mark in reverse order, finish; returns the payload bytes it sent. */
static uint64_t reduce_once(ddp_ctx *ctx, ddp_reducer *r, void *grads, void *host, ddp_dtype gt,
                            const size_t *sizes, float *vals)
{
    size_t n = total(sizes);
    for (size_t i = 0; i < n; i++)
        vals[i] = (float)(ddp_rank(ctx) + (int)i);
    store(host, gt, vals, n);
    CHECK(ddp_upload(ctx, grads, host, n * ddp_dtype_size(gt)) == DDP_OK, "upload");
    ddp_comm_stats before, after;
    ddp_comm_stats_get(ctx, &before);
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin");
    for (int p = N_PARAMS - 1; p >= 0; p--)
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d", p);
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish");
    ddp_comm_stats_get(ctx, &after);
    CHECK(ddp_download(ctx, host, grads, n * ddp_dtype_size(gt)) == DDP_OK, "download");
    return after.allreduce_bytes - before.allreduce_bytes;
}

static void check_case(ddp_ctx *ctx, ddp_dtype gt, ddp_dtype wire, const size_t *sizes, double rtol)
{
    size_t n = total(sizes);
    ddp_reducer_opts o;
    ddp_reducer_opts_default(&o);
    o.first_bucket_mb = 64.0 / (1024 * 1024); /* several buckets */
    o.bucket_mb = 1024.0 / (1024 * 1024);
    o.grad_dtype = gt;
    o.comm_dtype = wire;
    void *grads = ddp_alloc(ctx, n * ddp_dtype_size(gt)), *host = malloc(n * ddp_dtype_size(gt));
    float *vals = calloc(n, sizeof *vals);
    ddp_reducer *r = NULL;
    CHECK(ddp_reducer_create(ctx, grads, sizes, N_PARAMS, &o, &r) == DDP_OK, "create %s/%s",
          ddp_dtype_name(gt), ddp_dtype_name(wire));
    if (!r || !grads || !vals || !host)
        return;
    uint64_t bytes = reduce_once(ctx, r, grads, host, gt, sizes, vals);
    ddp_dtype on_wire = wire == DDP_FP32 ? gt : wire;
    CHECK(bytes == n * ddp_dtype_size(on_wire), "grad %s wire %s: %llu payload bytes, want %zu",
          ddp_dtype_name(gt), ddp_dtype_name(wire), (unsigned long long)bytes,
          n * ddp_dtype_size(on_wire));
    double shift = (ddp_world_size(ctx) - 1) / 2.0;
    int shown = 0;
    for (size_t i = 0; i < n && shown < 5; i++) {
        double want = (double)i + shift, got = load(host, gt, i);
        if (!(fabs(got - want) <= rtol * want)) {
            CHECK(0, "grad %s wire %s: mean[%zu] = %.9g, want %.9g (rtol %g)", ddp_dtype_name(gt),
                  ddp_dtype_name(wire), i, got, want, rtol);
            shown++;
        }
    }
    ddp_reducer_destroy(r);
    ddp_free(ctx, grads);
    free(host);
    free(vals);
}

/* ddp_allreduce_host: SUM, MAX, MIN on fp64 and int64; AVG of integers refused. */
static void check_host_allreduce(ddp_ctx *ctx)
{
    int r = ddp_rank(ctx), w = ddp_world_size(ctx);
    double d[3] = {r + 0.5, (double)r, -(double)r};
    int64_t v[3] = {r + 1, r, -r};
    CHECK(ddp_allreduce_host(ctx, d, 1, DDP_FP64, DDP_SUM) == DDP_OK, "fp64 sum");
    CHECK(ddp_allreduce_host(ctx, d + 1, 1, DDP_FP64, DDP_MAX) == DDP_OK, "fp64 max");
    CHECK(ddp_allreduce_host(ctx, d + 2, 1, DDP_FP64, DDP_MIN) == DDP_OK, "fp64 min");
    CHECK(d[0] == w * (w - 1) / 2.0 + 0.5 * w && d[1] == w - 1 && d[2] == -(w - 1),
          "fp64: %g %g %g", d[0], d[1], d[2]);
    CHECK(ddp_allreduce_host(ctx, v, 1, DDP_INT64, DDP_SUM) == DDP_OK, "int64 sum");
    CHECK(ddp_allreduce_host(ctx, v + 1, 2, DDP_INT64, DDP_MAX) == DDP_OK, "int64 max");
    CHECK(v[0] == (int64_t)w * (w + 1) / 2 && v[1] == w - 1 && v[2] == 0, "int64: %lld %lld %lld",
          (long long)v[0], (long long)v[1], (long long)v[2]);
    CHECK(ddp_allreduce_host(ctx, v, 1, DDP_INT64, DDP_AVG) == DDP_ERR_INVALID_ARG, "int64 avg");
    float f = (float)r, *dev = ddp_alloc(ctx, sizeof f);
    CHECK(dev && ddp_upload(ctx, dev, &f, sizeof f) == DDP_OK, "upload");
    CHECK(ddp_allreduce(ctx, dev, 1, DDP_MIN) == DDP_OK, "ddp_allreduce MIN");
    CHECK(ddp_download(ctx, &f, dev, sizeof f) == DDP_OK && f == 0.0f, "ddp_allreduce MIN: %g", f);
    ddp_free(ctx, dev);
    ddp_comm_stats s;
    CHECK(ddp_comm_stats_get(ctx, &s) == DDP_OK && s.host_allreduce_calls == 5 &&
              s.host_allreduce_bytes == 6 * 8, "host stats: %llu calls, %llu bytes",
          (unsigned long long)s.host_allreduce_calls, (unsigned long long)s.host_allreduce_bytes);
}

int main(int argc, char **argv)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    if (argc == 3 && strcmp(argv[1], "--backend") == 0 && ddp_backend_parse(argv[2], &io.backend) != DDP_OK)
        return 2;
    if (io.backend == DDP_BACKEND_CUDA && ddp_cuda_device_count() == 0)
        return TEST_SKIP;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    check_host_allreduce(ctx);
    static const ddp_dtype types[] = {DDP_FP32, DDP_BF16, DDP_FP16};
    for (int g = 0; g < 3; g++)
        for (int w = 0; w < 3; w++)
            check_case(ctx, types[g], types[w], numel, 0.0); /* exact, see the top */
    double world = ddp_world_size(ctx);
    check_case(ctx, DDP_FP32, DDP_BF16, numel_big, world * 0x1p-8);
    check_case(ctx, DDP_FP32, DDP_FP16, numel_big, world * 0x1p-11);
    check_case(ctx, DDP_BF16, DDP_FP32, numel_big, world * 0x1p-8);
    ddp_reducer_opts o;
    ddp_reducer_opts_default(&o);
    o.grad_dtype = DDP_FP64;
    ddp_reducer *r = NULL;
    float g[80] = {0};
    CHECK(ddp_reducer_create(ctx, g, numel, N_PARAMS, &o, &r) == DDP_ERR_INVALID_ARG && !r,
          "fp64 gradients accepted");
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
