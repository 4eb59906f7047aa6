/* test_reducer_stream.c - on a GPU, one rank: the reducer on a caller's stream with the loss
 * scaler after it, and the exposed communication the reducer measures with CUDA events.
 *
 * Ordering: a reducer given a caller stream S; on each of 2 micro-steps a slow kernel (a spin of
 * a few ms, then an addition) writes every parameter's gradient on S just before the host marks
 * it ready, so the host runs ahead of the data; after the last mark another spin on S stands for
 * the rest of the backward pass. Then the scaler, on S or on libddp's stream (NULL). Gradients
 * 3 x 1024 then 5 x 1024 at scale 1024: the average over the micro-steps, unscaled, is exactly 4
 * (powers of two throughout, fp32 or an fp16 wire); a read before the kernels finished would give
 * 0, 3 or 8 instead, and a scaler unordered with S would unscale un-averaged values (8) or find no
 * inf where a kernel writes one. The inf case: one element gets +inf from a slow kernel; the step
 * must be skipped (step_ok 0, scale halved, one skipped step).
 * Exposed communication (tracing on, ddp_trace_get_stats' "reducer.exposed" total): hidden, the
 * buckets all-reduce while a 50 ms spin on S stands for backward: under 10 ms; delayed, a 50 ms
 * spin on libddp's stream with an all-reduce queued behind it holds NCCL's stream, so the buckets'
 * all-reduces finish about 50 ms after S is done: at least 30 ms.
 * Exits 77 without a GPU.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ddp_trace.h"

/* test_reducer_kernels.cu */
int test_spin_add(void *stream, float *x, size_t n, float v, double ms);

#define N_PARAMS 4
static const size_t numel[N_PARAMS] = {1000, 50000, 3, 20000};
#define N_TOTAL 71003
#define SCALE 1024.0

static size_t offset_of(int p)
{
    size_t off = 0;
    for (int q = 0; q < p; q++)
        off += numel[q];
    return off;
}

typedef struct fixture {
    ddp_ctx *ctx;
    cudaStream_t s; /* the caller's stream */
    float *grads;   /* N_TOTAL fp32, device */
    float *idle;    /* a spin's target when it writes nothing */
} fixture;

static ddp_reducer *make_reducer(fixture *f, ddp_dtype wire, int defer)
{
    ddp_reducer_opts o;
    ddp_reducer_opts_default(&o);
    o.first_bucket_mb = 8000.0 / (1024 * 1024); /* 2000 floats: several buckets */
    o.bucket_mb = 100000.0 / (1024 * 1024);
    o.comm_dtype = wire;
    o.stream = f->s;
    o.defer_launch = defer;
    ddp_reducer *r = NULL;
    CHECK(ddp_reducer_create(f->ctx, f->grads, numel, N_PARAMS, &o, &r) == DDP_OK, "create");
    CHECK(ddp_reducer_n_buckets(r) >= 3, "%d buckets, want several", ddp_reducer_n_buckets(r));
    return r;
}

/* One micro-step: per parameter, in reverse, a slow kernel adds v to its gradient on S, then the
 * host marks it ready at once; inf_at >= 0 also adds +inf to that element. */
static void micro_step(fixture *f, ddp_reducer *r, int sync, float v, long inf_at)
{
    CHECK(ddp_reducer_begin(r, sync) == DDP_OK, "begin");
    for (int p = N_PARAMS - 1; p >= 0; p--) {
        CHECK(test_spin_add(f->s, f->grads + offset_of(p), numel[p], v, 3.0) == 0, "spin");
        if (inf_at >= 0 && (size_t)inf_at >= offset_of(p) && (size_t)inf_at < offset_of(p + 1))
            CHECK(test_spin_add(f->s, f->grads + inf_at, 1, INFINITY, 1.0) == 0, "spin inf");
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d", p);
    }
}

/* Reads the gradients back after the scaler, on the stream it ran on. */
static void read_grads(fixture *f, void *scaler_stream, float *host)
{
    if (scaler_stream) {
        CHECK(cudaMemcpyAsync(host, f->grads, N_TOTAL * sizeof *host, cudaMemcpyDeviceToHost,
                              f->s) == cudaSuccess && cudaStreamSynchronize(f->s) == cudaSuccess,
              "read on S");
        return;
    }
    CHECK(ddp_download(f->ctx, host, f->grads, N_TOTAL * sizeof *host) == DDP_OK, "download");
}

static void check_values(const float *host, long inf_at, const char *what)
{
    int shown = 0;
    for (long i = 0; i < N_TOTAL && shown < 5; i++) {
        int bad = i == inf_at ? !(isnan(host[i]) || isinf(host[i])) : host[i] != 4.0f;
        if (bad) {
            CHECK(0, "%s: grads[%ld] = %g, want %s", what, i, (double)host[i],
                  i == inf_at ? "inf or NaN" : "4");
            shown++;
        }
    }
}

/* The reducer on S, then the scaler on scaler_stream; inf_at < 0: finite. */
static void check_order(fixture *f, ddp_dtype wire, void *scaler_stream, long inf_at)
{
    char what[96];
    snprintf(what, sizeof what, "wire %s, scaler on %s%s", ddp_dtype_name(wire),
             scaler_stream ? "S" : "libddp's stream", inf_at >= 0 ? ", inf" : "");
    ddp_scaler_opts so;
    ddp_scaler_opts_default(&so);
    so.init_scale = SCALE;
    so.stream = scaler_stream;
    ddp_scaler *sc = NULL;
    ddp_reducer *r = make_reducer(f, wire, 0);
    CHECK(ddp_scaler_create(f->ctx, &so, &sc) == DDP_OK, "scaler");
    float *host = malloc(N_TOTAL * sizeof *host);
    if (!r || !sc || !host)
        return;
    CHECK(cudaMemsetAsync(f->grads, 0, N_TOTAL * sizeof(float), f->s) == cudaSuccess, "zero");
    micro_step(f, r, 0, (float)(3 * SCALE), -1);
    micro_step(f, r, 1, (float)(5 * SCALE), inf_at);
    CHECK(test_spin_add(f->s, f->idle, 0, 0.0f, 20.0) == 0, "spin"); /* the rest of backward */
    CHECK(ddp_reducer_finish(r) == DDP_OK, "%s: finish", what);
    int ok = -1;
    CHECK(ddp_scaler_unscale_update(sc, f->grads, DDP_FP32, N_TOTAL, &ok) == DDP_OK, "%s: scaler",
          what);
    CHECK(ok == (inf_at < 0), "%s: step_ok %d", what, ok);
    double want_scale = inf_at < 0 ? SCALE : SCALE / 2;
    CHECK(ddp_scaler_scale(sc) == want_scale && ddp_scaler_skipped_steps(sc) == (inf_at >= 0),
          "%s: scale %g, %lld skipped", what, ddp_scaler_scale(sc),
          (long long)ddp_scaler_skipped_steps(sc));
    read_grads(f, scaler_stream, host);
    if (inf_at < 0)
        check_values(host, -1, what);
    else
        CHECK(isnan(host[inf_at]) || isinf(host[inf_at]), "%s: grads[%ld] = %g",
              what, inf_at, (double)host[inf_at]);
    free(host);
    ddp_scaler_destroy(sc);
    ddp_reducer_destroy(r);
}

/* Total "reducer.exposed" seconds and their count so far. */
static double exposed_total(long *n)
{
    ddp_trace_stats st;
    CHECK(ddp_trace_get_stats(&st) == DDP_OK, "trace stats");
    *n = st.n_exposed;
    return st.exposed_s;
}

/* One sync step with overlap; delay: a spin on libddp's stream, an all-reduce queued behind it
 * (NCCL's stream waits), before the buckets. Returns the exposed seconds measured for it. */
static double exposed_step(fixture *f, int delay)
{
    long n0, n1;
    double before = exposed_total(&n0);
    ddp_reducer *r = make_reducer(f, DDP_FP32, 0);
    ddp_request *req = NULL;
    if (!r)
        return -1.0;
    if (delay) {
        CHECK(test_spin_add(ddp_backend_stream(f->ctx), f->idle, 0, 0.0f, 50.0) == 0, "spin");
        CHECK(ddp_allreduce_start(f->ctx, f->idle, 1, DDP_SUM, &req) == DDP_OK, "all-reduce");
    }
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin");
    for (int p = N_PARAMS - 1; p >= 0; p--)
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d", p);
    if (!delay) /* backward still computing on S while every bucket all-reduces */
        CHECK(test_spin_add(f->s, f->idle, 0, 0.0f, 50.0) == 0, "spin");
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish");
    if (req)
        CHECK(ddp_wait(req) == DDP_OK, "wait");
    ddp_reducer_destroy(r); /* reads the step's events */
    double after = exposed_total(&n1);
    CHECK(n1 == n0 + 1, "%ld exposed measurement(s) for one step, want 1", n1 - n0);
    return after - before;
}

static void check_exposed(fixture *f)
{
    CHECK(ddp_trace_start(f->ctx, 0) == DDP_OK, "trace start");
    double hidden = exposed_step(f, 0), delayed = exposed_step(f, 1);
    printf("exposed communication: %.3f ms hidden behind a 50 ms backward, %.3f ms behind a 50 ms "
           "delay of the all-reduces\n", 1e3 * hidden, 1e3 * delayed);
    CHECK(hidden >= 0.0 && hidden < 0.010, "hidden: %.3f ms exposed, want under 10", 1e3 * hidden);
    CHECK(delayed >= 0.030, "delayed: %.3f ms exposed, want 30 or more", 1e3 * delayed);
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_reducer_stream.%ld.json", (long)getpid());
    CHECK(ddp_trace_write(f->ctx, path) == DDP_OK, "trace write");
    unlink(path);
}

int main(void)
{
    if (ddp_cuda_device_count() == 0) {
        fprintf(stderr, "test_reducer_stream: skipped: no GPU\n");
        return TEST_SKIP;
    }
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CUDA;
    io.print_table = 0;
    fixture f = {0};
    if (ddp_init(&io, &f.ctx) != DDP_OK)
        return 1;
    f.grads = ddp_alloc(f.ctx, N_TOTAL * sizeof(float));
    f.idle = ddp_alloc(f.ctx, sizeof(float));
    CHECK(f.grads && f.idle && ddp_synchronize(f.ctx) == DDP_OK, "alloc");
    CHECK(cudaStreamCreateWithFlags(&f.s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    static const ddp_dtype wires[2] = {DDP_FP32, DDP_FP16};
    for (int w = 0; w < 2; w++) {
        check_order(&f, wires[w], f.s, -1);
        check_order(&f, wires[w], NULL, -1);
        check_order(&f, wires[w], f.s, 1234);
        check_order(&f, wires[w], NULL, 60001);
    }
    check_exposed(&f);
    cudaStreamSynchronize(f.s);
    cudaStreamDestroy(f.s);
    ddp_free(f.ctx, f.grads);
    ddp_free(f.ctx, f.idle);
    int failed = CHECK_DONE();
    ddp_finalize(f.ctx);
    return failed;
}
