/* gpu_step_bench.c - ddp-gpu-step-bench: where a training step's time goes on the GPU. For each
 * precision (fp32, bf16, fp16) it times the CNN's ops one by one (both convolutions in each
 * direction, ReLU, pool, the fc layer, the casts) and then whole steps of the CNN and the MLP
 * (forward, loss, backward, SGD; no reducer), outside ddp-train, so the data pipeline, the
 * agreements and the first step's cuDNN search stay out of the numbers.
 *
 * Each row reports microseconds per call twice (bench_row): "host", the time to queue one call on
 * an idle GPU (launch and library overhead), and "pipelined", REPS calls back to back until the
 * GPU has finished, per call. pipelined >> host: the GPU is the limit; about equal: the host is.
 * Inputs are random (never zeros). Usage: ddp-gpu-step-bench [BATCH (256)] [REPS (200)]
 * Exits 77 without a usable GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "config.h"
#include "ddp.h"
#include "model.h"
#include "optim.h"
#include "ops.h"

#define WARM 5

static ops_handle *gpu, *cpu; /* cpu: host memory, for the casts of the inputs */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One timed op: fn(arg) queues one call. */
typedef ddp_status (*bench_fn)(void *arg);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median host time of one call queued on an idle GPU (the stream synchronised before it),
 * in seconds; -1 on failure. */
static double host_time(bench_fn fn, void *arg, int reps)
{
    double t[64];
    int n = reps < 64 ? reps : 64;
    for (int i = 0; i < n; i++) {
        if (ddp_synchronize(gpu->ctx) != DDP_OK)
            return -1;
        double t0 = now_s();
        fn(arg);
        t[i] = now_s() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

/* Prints "name host pipelined" in microseconds per call: host = the median time to queue one
 * call on an idle GPU; pipelined = REPS calls back to back until the GPU finished, per call.
 * pipelined well above host: the GPU is the limit; about equal: the host is. Returns
 * pipelined, or -1 on failure. */
static double bench_row(const char *name, bench_fn fn, void *arg, int reps)
{
    for (int i = 0; i < WARM; i++)
        if (fn(arg) != DDP_OK) {
            printf("%-28s failed\n", name);
            return -1;
        }
    double host = host_time(fn, arg, reps);
    if (host < 0 || ddp_synchronize(gpu->ctx) != DDP_OK)
        return -1;
    double t0 = now_s();
    for (int i = 0; i < reps; i++)
        fn(arg);
    if (ddp_synchronize(gpu->ctx) != DDP_OK)
        return -1;
    double done = 1e6 * (now_s() - t0) / reps;
    printf("%-28s %10.1f %10.1f\n", name, 1e6 * host, done);
    return done;
}

/* A device buffer of n values uniform in [lo, hi) in precision p (float storage for fp16). */
static void *rand_buf(ddp_dtype p, size_t n, float lo, float hi, uint64_t seed)
{
    float *h = malloc(n * sizeof *h);
    void *d = ddp_alloc(gpu->ctx, n * sizeof(float)), *hp = malloc(n * sizeof(float));
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; h && i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = lo + (hi - lo) * (float)((s >> 11) * (1.0 / 9007199254740992.0));
    }
    bool ok = h && d && hp && cpu->cast(cpu, p, hp, DDP_FP32, h, n) == DDP_OK &&
              ddp_upload(gpu->ctx, d, hp, n * ops_dtype_size(gpu, p)) == DDP_OK;
    free(h);
    free(hp);
    return ok ? d : NULL;
}

/* The CNN's tensors at one batch and precision (shapes as in model.c). */
typedef struct cnn_t {
    ddp_dtype p;
    int b;
    ops_conv_shape c1, c2;
    void *x, *w1, *w2, *wf, *z1, *p1, *z2, *p2, *dz1, *dz2, *dp1, *xf, *y;
    float *b1, *b2, *bf, *dw, *db, *logits, *tmp;
    int *arg1;
} cnn_t;

static ddp_status op_conv1_fwd(void *a)
{
    cnn_t *t = a;
    return gpu->conv_fwd(gpu, t->p, &t->c1, t->b, t->x, t->w1, t->b1, t->z1);
}
static ddp_status op_conv2_fwd(void *a)
{
    cnn_t *t = a;
    return gpu->conv_fwd(gpu, t->p, &t->c2, t->b, t->p1, t->w2, t->b2, t->z2);
}
static ddp_status op_conv1_bwd_params(void *a)
{
    cnn_t *t = a;
    return gpu->conv_bwd_params(gpu, t->p, &t->c1, t->b, t->x, t->dz1, t->dw, t->db, false);
}
static ddp_status op_conv2_bwd_params(void *a)
{
    cnn_t *t = a;
    return gpu->conv_bwd_params(gpu, t->p, &t->c2, t->b, t->p1, t->dz2, t->dw, t->db, false);
}
static ddp_status op_conv2_bwd_input(void *a)
{
    cnn_t *t = a;
    return gpu->conv_bwd_input(gpu, t->p, &t->c2, t->b, t->w2, t->dz2, t->dp1);
}
static ddp_status op_relu1_fwd(void *a)
{
    cnn_t *t = a;
    return gpu->act_relu_fwd(gpu, t->p, t->z1, t->z1, (size_t)t->b * 20 * 28 * 28);
}
static ddp_status op_relu1_bwd(void *a)
{
    cnn_t *t = a;
    return gpu->act_relu_bwd(gpu, t->p, t->dz1, t->dz1, t->z1, (size_t)t->b * 20 * 28 * 28);
}
static ddp_status op_pool1_fwd(void *a)
{
    cnn_t *t = a;
    size_t ws = (size_t)t->b * 20 * 14 * 14 * sizeof(int);
    return gpu->pool_fwd(gpu, t->p, t->z1, t->b, 20, 28, 28, t->p1, t->arg1, ws);
}
static ddp_status op_pool1_bwd(void *a)
{
    cnn_t *t = a;
    return gpu->pool_bwd(gpu, t->p, t->dp1, t->arg1, t->b, 20, 28, 28, t->dz1);
}
static ddp_status op_fc_fwd(void *a)
{
    cnn_t *t = a;
    return gpu->linear_fwd(gpu, t->p, t->p2, t->wf, t->bf, t->b, 980, 10, t->logits, true);
}
static ddp_status op_fc_bwd_params(void *a)
{
    cnn_t *t = a;
    return gpu->linear_bwd_params(gpu, t->p, t->p2, t->y, t->b, 980, 10, t->dw, t->db, false);
}
static ddp_status op_x_cast(void *a)
{
    cnn_t *t = a;
    return gpu->cast(gpu, t->p, t->xf, DDP_FP32, t->tmp, (size_t)t->b * 28 * 28);
}
/* What conv_bwd_params of conv1 spends widening dy to fp32 in bf16 (cuda_cudnn.cu). */
static ddp_status op_dz1_widen(void *a)
{
    cnn_t *t = a;
    return gpu->cast(gpu, DDP_FP32, t->tmp, t->p, t->dz1, (size_t)t->b * 20 * 28 * 28);
}

static void cnn_ops(ddp_dtype p, int b, int reps)
{
    cnn_t t = {.p = p, .b = b, .c1 = {1, 28, 28, 20, 5, 2, 28, 28}, .c2 = {20, 14, 14, 20, 5, 2, 14, 14}};
    size_t big = (size_t)b * 20 * 28 * 28, mid = (size_t)b * 20 * 14 * 14;
    t.x = rand_buf(p, (size_t)b * 784, 0, 1, 1), t.xf = rand_buf(p, (size_t)b * 784, 0, 1, 2);
    t.w1 = rand_buf(p, 500, -0.2f, 0.2f, 3), t.w2 = rand_buf(p, 10000, -0.05f, 0.05f, 4);
    t.wf = rand_buf(p, 9800, -0.03f, 0.03f, 5);
    t.b1 = rand_buf(DDP_FP32, 20, -0.1f, 0.1f, 6), t.b2 = rand_buf(DDP_FP32, 20, -0.1f, 0.1f, 7);
    t.bf = rand_buf(DDP_FP32, 10, -0.1f, 0.1f, 8);
    t.z1 = rand_buf(p, big, -1, 1, 9), t.dz1 = rand_buf(p, big, -1, 1, 10);
    t.p1 = rand_buf(p, mid, -1, 1, 11), t.dp1 = rand_buf(p, mid, -1, 1, 12);
    t.z2 = rand_buf(p, mid, -1, 1, 13), t.dz2 = rand_buf(p, mid, -1, 1, 14);
    t.p2 = rand_buf(p, (size_t)b * 980, -1, 1, 15), t.y = rand_buf(p, (size_t)b * 10, -1, 1, 16);
    t.dw = rand_buf(DDP_FP32, 10000, -1, 1, 17), t.db = rand_buf(DDP_FP32, 20, -1, 1, 18);
    t.logits = rand_buf(DDP_FP32, (size_t)b * 10, -1, 1, 19);
    t.tmp = rand_buf(DDP_FP32, big, -1, 1, 20);
    t.arg1 = ddp_alloc(gpu->ctx, mid * sizeof(int));
    if (!t.x || !t.tmp || !t.arg1 || !t.dw) {
        printf("allocation failed\n");
        return;
    }
    op_pool1_fwd(&t); /* valid winners for pool1_bwd */
    static const struct { const char *name; bench_fn fn; } rows[] = {
        {"x cast", op_x_cast}, {"conv1 fwd", op_conv1_fwd}, {"relu1 fwd", op_relu1_fwd},
        {"pool1 fwd", op_pool1_fwd}, {"conv2 fwd", op_conv2_fwd}, {"fc fwd", op_fc_fwd},
        {"fc bwd params", op_fc_bwd_params}, {"conv2 bwd params", op_conv2_bwd_params},
        {"conv2 bwd input", op_conv2_bwd_input}, {"pool1 bwd", op_pool1_bwd},
        {"relu1 bwd", op_relu1_bwd}, {"conv1 bwd params", op_conv1_bwd_params},
        {"dz1 widen (fp32 copy)", op_dz1_widen},
    };
    double sum = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s %s", model_precision_name(p), rows[i].name);
        double d = bench_row(name, rows[i].fn, &t, reps);
        sum += d > 0 && i + 1 < sizeof rows / sizeof rows[0] ? d : 0;
    }
    printf("%-28s %10s %10.1f\n", "  sum of the ops above", "", sum);
}

/* A whole step of a model: forward with the loss, backward, SGD. */
typedef struct step_t {
    model *m;
    optim *o; /* SGD */
    float *x, *loss;
    int *y, b;
} step_t;

static ddp_status op_step(void *a)
{
    step_t *s = a;
    TRY_OK(model_zero_grad(s->m));
    TRY_OK(model_forward_train(s->m, s->x, s->y, s->b, s->loss));
    TRY_OK(model_backward(s->m, NULL));
    return optim_step(s->o, model_grads(s->m), 0.01f, 1, 1.0f);
}

static void model_step(model_kind kind, ddp_dtype p, int b, int reps)
{
    model_config cfg;
    model_config_default(&cfg, kind);
    cfg.max_batch = b, cfg.precision = p;
    step_t s = {.b = b};
    int *labels = malloc((size_t)b * sizeof *labels);
    for (int i = 0; labels && i < b; i++)
        labels[i] = (i * 7) % 10;
    s.x = rand_buf(DDP_FP32, (size_t)b * 784, 0, 1, 30);
    s.loss = rand_buf(DDP_FP32, 1, 0, 1, 31);
    s.y = ddp_alloc(gpu->ctx, (size_t)b * sizeof(int));
    char name[64];
    snprintf(name, sizeof name, "%s %s step", model_precision_name(p), kind == MODEL_CNN ? "cnn" : "mlp");
    optim_opts oo = {.kind = OPTIM_SGD, .momentum = 0.9f};
    optim_weights w = {.w = NULL};
    if (labels && s.x && s.y && ddp_upload(gpu->ctx, s.y, labels, (size_t)b * sizeof(int)) == DDP_OK &&
        model_create(gpu->ctx, gpu, &cfg, &s.m) == DDP_OK && (w.w = model_weights(s.m, &w.p)) &&
        optim_create(gpu->ctx, gpu, &oo, model_numel(s.m), model_n_params(s.m), NULL, &w,
                     &s.o) == DDP_OK)
        bench_row(name, op_step, &s, reps);
    else
        printf("%-28s setup failed\n", name);
    optim_destroy(s.o);
    model_destroy(s.m);
    free(labels);
}

int main(int argc, char **argv)
{
    int b = argc > 1 ? atoi(argv[1]) : 256, reps = argc > 2 ? atoi(argv[2]) : 200;
    ddp_ctx *ctx = NULL;
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CUDA;
    io.print_table = 0;
    if (ddp_cuda_device_count() == 0 || !HAVE_CUDNN) {
        fprintf(stderr, "ddp-gpu-step-bench: skipped: no usable GPU or no cuDNN in this build\n");
        return 77;
    }
    if (b < 1 || reps < 1 || ddp_init(&io, &ctx) != DDP_OK || ops_cuda_open(ctx, false, &gpu) != DDP_OK ||
        ops_cpu_open(NULL, 1, false, &cpu) != DDP_OK)
        return 1;
    printf("%s\nbatch %d, %d calls per row, microseconds per call\n",
           ops_cuda_describe(gpu, DDP_FP32), b, reps);
    printf("%-28s %10s %10s\n", "op", "host", "pipelined");
    const ddp_dtype precs[] = {DDP_FP32, DDP_BF16, DDP_FP16};
    for (int i = 0; i < 3; i++) {
        if (!gpu->supports(gpu, precs[i], NULL))
            continue;
        cnn_ops(precs[i], b, reps);
        model_step(MODEL_CNN, precs[i], b, reps);
        model_step(MODEL_MLP, precs[i], b, reps);
    }
    ops_close(cpu);
    ops_close(gpu);
    ddp_finalize(ctx);
    return 0;
}
