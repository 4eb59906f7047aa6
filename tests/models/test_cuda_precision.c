/* test_cuda_precision.c - every precision-aware op of the CUDA backend (cast, linear, cuDNN
 * convolutions, ReLU, max-pool) against the CPU ops table (the oracle) in fp32, bf16 and fp16,
 * on the same input bits; then one forward/backward of the MLP and the CNN in each precision on
 * both backends, and the --tf32 switch. Exits 77 (skipped) without a usable GPU or CUDA build.
 *
 * Both backends get identical 16-bit inputs (cast once on the CPU, uploaded as bits); results are
 * widened to float on the host and compared elementwise: |gpu - cpu| <= atol + rtol * |cpu|. With
 * inputs in [-1, 1], an output summed over K terms is of size up to about sqrt(K), hence
 * atol = a * sqrt(K). Per precision (the CPU rounds the same way, to nearest even):
 *   fp32: rtol 1e-4, a 1e-4 - different summation orders, and cuDNN's Winograd/FFT algorithms
 *         transform their inputs in fp32 (errors near 1e-6 of the output's scale).
 *   bf16: rtol 2^-6, a 2^-7 - 8 significant bits: a rounding errs by up to 2^-8 relative on each
 *         side, two fp32 sums that differ in the last bits may round one ulp (2^-7) apart, and the
 *         GPU's bf16 convolution rounds twice (cuDNN's output, then the bias add).
 *   fp16: rtol 2^-8, a 2^-9 - 11 significant bits: one rounding each side (2^-11), a neighbour
 *         ulp apart (2^-10), and TF32's 10-bit rounding of Winograd-transformed values.
 * Parameter gradients are fp32 on both sides but are sums of 16-bit products: the same bounds.
 * Casts, ReLU and max-pool move values without arithmetic: they must be equal bit for bit.
 * The models compare whole gradients by relative L2 distance (a rare ReLU or pool decision that
 * flips on a rounding moves single elements): fp32 1e-4, fp16 2^-7, bf16 2^-4.
 */
#include <string.h>

#include "model.h"
#include "ops.h"
#include "testutil.h"

static ops_handle *cpu, *gpu;
static ddp_ctx *ctx;

typedef struct prec {
    ddp_dtype p;
    const char *name;
    double rtol, a; /* see the top */
} prec;

static const prec precs[] = {
    {DDP_FP32, "fp32", 1e-4, 1e-4},
    {DDP_BF16, "bf16", 1.0 / 64, 1.0 / 128},
    {DDP_FP16, "fp16", 1.0 / 256, 1.0 / 512},
};

/* A tensor in precision p on the host (the CPU backend's memory) and on the device. */
typedef struct tens {
    void *h, *d;
    size_t n;
    ddp_dtype p;
} tens;

/* n values uniform in [lo, hi), rounded to p, the same bits on both sides. */
static tens make_t(test_rng *r, ddp_dtype p, size_t n, double lo, double hi)
{
    tens t = {malloc(n * 4 + 4), ddp_alloc(gpu->ctx, n * 4 + 4), n, p};
    float *f = test_floats(n);
    test_fill(r, f, n, lo, hi);
    CHECK(cpu->cast(cpu, p, t.h, DDP_FP32, f, n) == DDP_OK, "host cast");
    CHECK(t.d && ddp_upload(gpu->ctx, t.d, t.h, n * ops_dtype_size(gpu, p)) == DDP_OK, "upload");
    free(f);
    return t;
}

static void drop_t(tens *t)
{
    free(t->h);
    ddp_free(gpu->ctx, t->d);
}

/* The device tensor widened to floats on the host. */
static float *gpu_floats(const tens *t)
{
    void *raw = malloc(t->n * 4 + 4);
    float *f = test_floats(t->n);
    CHECK(ddp_download(gpu->ctx, raw, t->d, t->n * ops_dtype_size(gpu, t->p)) == DDP_OK, "download");
    cpu->cast(cpu, DDP_FP32, f, t->p, raw, t->n);
    free(raw);
    return f;
}

/* Counts the elements of t whose device bits differ from the host's (inf and NaN included),
 * printing the first five. */
static int compare_bits(const char *what, const tens *t)
{
    size_t size = ops_dtype_size(gpu, t->p);
    unsigned char *raw = malloc(t->n * size + 1);
    CHECK(ddp_download(gpu->ctx, raw, t->d, t->n * size) == DDP_OK, "download");
    int bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (memcmp(raw + i * size, (const unsigned char *)t->h + i * size, size) == 0)
            continue;
        float got, want;
        cpu->cast(cpu, DDP_FP32, &got, t->p, raw + i * size, 1);
        cpu->cast(cpu, DDP_FP32, &want, t->p, (const unsigned char *)t->h + i * size, 1);
        if (bad++ < 5)
            fprintf(stderr, "%s[%zu]: got %.9g, want %.9g (bits differ)\n", what, i, (double)got,
                    (double)want);
    }
    free(raw);
    return bad;
}

/* Compares the device result with the host result; K terms per output (0: bit for bit). */
static void compare_t(const char *what, const prec *q, const tens *t, int k)
{
    if (k == 0) {
        int bad = compare_bits(what, t);
        CHECK(bad == 0, "%s %s: %d of %zu differ", what, q->name, bad, t->n);
        return;
    }
    float *got = gpu_floats(t), *want = test_floats(t->n);
    cpu->cast(cpu, DDP_FP32, want, t->p, t->h, t->n);
    int bad = test_compare(what, got, want, t->n, q->a * sqrt((double)k), q->rtol);
    CHECK(bad == 0, "%s %s: %d of %zu differ", what, q->name, bad, t->n);
    free(got), free(want);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

static void check_cast(test_rng *r, bool bf16)
{
    const size_t n = 10007;
    tens src = make_t(r, DDP_FP32, n, -70000, 70000); /* beyond fp16's range too */
    float *tiny = src.h;
    tiny[1] = 3e-6f, tiny[2] = -65520.0f, tiny[3] = 1.00390625f; /* fp16 subnormal; ties to even */
    ddp_upload(gpu->ctx, src.d, src.h, n * sizeof(float));
    for (int to = 0; to < 3; to++) {
        for (int from = 0; from < 3; from++) {
            if (!bf16 && (to == DDP_BF16 || from == DDP_BF16))
                continue;
            tens mid = make_t(r, (ddp_dtype)from, n, 0, 1), out = make_t(r, (ddp_dtype)to, n, 0, 1);
            cpu->cast(cpu, mid.p, mid.h, DDP_FP32, src.h, n);
            gpu->cast(gpu, mid.p, mid.d, DDP_FP32, src.d, n);
            cpu->cast(cpu, out.p, out.h, mid.p, mid.h, n);
            CHECK(gpu->cast(gpu, out.p, out.d, mid.p, mid.d, n) == DDP_OK, "cast");
            compare_t("cast", &precs[to], &out, 0);
            drop_t(&mid), drop_t(&out);
        }
    }
    drop_t(&src);
}

static void check_relu(test_rng *r, const prec *q)
{
    const size_t n = 4099;
    tens x = make_t(r, q->p, n, -1, 1), y = make_t(r, q->p, n, -1, 1);
    tens dy = make_t(r, q->p, n, -1, 1), dx = make_t(r, q->p, n, -1, 1);
    cpu->act_relu_fwd(cpu, q->p, y.h, x.h, n);
    CHECK(gpu->act_relu_fwd(gpu, q->p, y.d, x.d, n) == DDP_OK, "relu fwd");
    compare_t("act_relu_fwd", q, &y, 0);
    cpu->act_relu_bwd(cpu, q->p, dx.h, dy.h, y.h, n);
    CHECK(gpu->act_relu_bwd(gpu, q->p, dx.d, dy.d, y.d, n) == DDP_OK, "relu bwd");
    compare_t("act_relu_bwd", q, &dx, 0);
    drop_t(&x), drop_t(&y), drop_t(&dy), drop_t(&dx);
}

/* ---- linear --------------------------------------------------------------------------------- */

static void check_linear(test_rng *r, const prec *q, int batch, int in, int out)
{
    tens x = make_t(r, q->p, (size_t)batch * in, -1, 1), w = make_t(r, q->p, (size_t)out * in, -1, 1);
    tens b = make_t(r, DDP_FP32, (size_t)out, -1, 1), dy = make_t(r, q->p, (size_t)batch * out, -1, 1);
    for (int y_fp32 = 0; y_fp32 < 2; y_fp32++) {
        tens y = make_t(r, y_fp32 ? DDP_FP32 : q->p, (size_t)batch * out, 0, 1);
        cpu->linear_fwd(cpu, q->p, x.h, w.h, b.h, batch, in, out, y.h, y_fp32);
        CHECK(gpu->linear_fwd(gpu, q->p, x.d, w.d, b.d, batch, in, out, y.d, y_fp32) == DDP_OK, "linear_fwd");
        compare_t(y_fp32 ? "linear_fwd (fp32 logits)" : "linear_fwd", q, &y, in);
        drop_t(&y);
    }
    /* Adding to dw and db, then overwriting them (NaN there must not reach the result). */
    for (int acc = 1; acc >= 0; acc--) {
        tens dw = make_t(r, DDP_FP32, (size_t)out * in, acc ? -1 : NAN, 1);
        tens db = make_t(r, DDP_FP32, (size_t)out, acc ? -1 : NAN, 1);
        cpu->linear_bwd_params(cpu, q->p, x.h, dy.h, batch, in, out, dw.h, db.h, acc);
        CHECK(gpu->linear_bwd_params(gpu, q->p, x.d, dy.d, batch, in, out, dw.d, db.d, acc) == DDP_OK, "linear_bwd_params");
        compare_t(acc ? "linear dw (accumulated)" : "linear dw (overwritten)", q, &dw, batch);
        compare_t(acc ? "linear db (accumulated)" : "linear db (overwritten)", q, &db, batch);
        drop_t(&dw), drop_t(&db);
    }
    tens dx = make_t(r, q->p, (size_t)batch * in, 0, 1);
    cpu->linear_bwd_input(cpu, q->p, w.h, dy.h, batch, in, out, dx.h);
    CHECK(gpu->linear_bwd_input(gpu, q->p, w.d, dy.d, batch, in, out, dx.d) == DDP_OK, "linear_bwd_input");
    compare_t("linear dx", q, &dx, out);
    drop_t(&x), drop_t(&w), drop_t(&b), drop_t(&dy), drop_t(&dx);
}

/* ---- images: the CPU works in NHWC, the GPU in NCHW ----------------------------------------- */

/* t's host side (NCHW) reordered for the CPU (to_nhwc) or back. */
static void host_layout(tens *t, int n, int c, int h, int w, bool to_nhwc)
{
    void *tmp = malloc(t->n * 4 + 4);
    CHECK(cpu->image_reorder(cpu, t->p, t->h, tmp, n, c, h, w, !to_nhwc) == DDP_OK, "reorder");
    free(t->h);
    t->h = tmp;
}

static void check_conv(test_rng *r, const prec *q, int batch, const ops_conv_shape *s)
{
    size_t nx = (size_t)batch * s->c_in * s->h * s->w, ny = (size_t)batch * s->c_out * s->h_out * s->w_out;
    size_t nw = (size_t)s->c_out * s->c_in * s->k * s->k;
    int k_fwd = s->c_in * s->k * s->k, k_w = batch * s->h_out * s->w_out, k_dx = s->c_out * s->k * s->k;
    tens x = make_t(r, q->p, nx, -1, 1), w = make_t(r, q->p, nw, -1, 1), b = make_t(r, DDP_FP32, s->c_out, -1, 1);
    tens dy = make_t(r, q->p, ny, -1, 1), y = make_t(r, q->p, ny, 0, 1), dx = make_t(r, q->p, nx, 0, 1);
    host_layout(&x, batch, s->c_in, s->h, s->w, true);
    host_layout(&dy, batch, s->c_out, s->h_out, s->w_out, true);
    CHECK(cpu->conv_fwd(cpu, q->p, s, batch, x.h, w.h, b.h, y.h) == DDP_OK, "cpu conv_fwd");
    CHECK(gpu->conv_fwd(gpu, q->p, s, batch, x.d, w.d, b.d, y.d) == DDP_OK, "conv_fwd");
    host_layout(&y, batch, s->c_out, s->h_out, s->w_out, false);
    compare_t("conv_fwd", q, &y, k_fwd);
    for (int acc = 1; acc >= 0; acc--) { /* as in check_linear */
        tens dw = make_t(r, DDP_FP32, nw, acc ? -1 : NAN, 1);
        tens db = make_t(r, DDP_FP32, s->c_out, acc ? -1 : NAN, 1);
        CHECK(cpu->conv_bwd_params(cpu, q->p, s, batch, x.h, dy.h, dw.h, db.h, acc) == DDP_OK, "cpu conv_bwd_params");
        CHECK(gpu->conv_bwd_params(gpu, q->p, s, batch, x.d, dy.d, dw.d, db.d, acc) == DDP_OK, "conv_bwd_params");
        compare_t(acc ? "conv dw (accumulated)" : "conv dw (overwritten)", q, &dw, k_w);
        compare_t(acc ? "conv db (accumulated)" : "conv db (overwritten)", q, &db, k_w);
        drop_t(&dw), drop_t(&db);
    }
    CHECK(cpu->conv_bwd_input(cpu, q->p, s, batch, w.h, dy.h, dx.h) == DDP_OK, "cpu conv_bwd_input");
    CHECK(gpu->conv_bwd_input(gpu, q->p, s, batch, w.d, dy.d, dx.d) == DDP_OK, "conv_bwd_input");
    host_layout(&dx, batch, s->c_in, s->h, s->w, false);
    compare_t("conv dx", q, &dx, k_dx);
    drop_t(&x), drop_t(&w), drop_t(&b), drop_t(&dy), drop_t(&y), drop_t(&dx);
}

/* Distinct values (1 + m/128) 2^e, shuffled, so no window has a tie whose winner the backends
 * may pick differently; exact in bf16 and fp16 (7 fraction bits, exponents -3..3). */
static tens make_distinct(test_rng *r, ddp_dtype p, size_t n)
{
    float *f = test_floats(n);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)ldexp(1.0 + (double)(i % 128) / 128.0, (int)(i / 128) - 3);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(test_uniform(r) * (double)(i + 1));
        float v = f[i];
        f[i] = f[j], f[j] = v;
    }
    tens out = make_t(r, p, n, 0, 1);
    cpu->cast(cpu, p, out.h, DDP_FP32, f, n);
    ddp_upload(gpu->ctx, out.d, out.h, n * ops_dtype_size(gpu, p));
    free(f);
    return out;
}

static void check_pool(test_rng *r, const prec *q)
{
    enum { N = 3, C = 5, H = 8, W = 6, NO = N * C * (H / 2) * (W / 2) };
    tens x = make_distinct(r, q->p, N * C * H * W), y = make_t(r, q->p, NO, 0, 1);
    tens dy = make_t(r, q->p, NO, -1, 1), dx = make_t(r, q->p, N * C * H * W, 0, 1);
    size_t ws_bytes = 64 * NO; /* ample for either backend */
    void *ws_h = calloc(1, ws_bytes), *ws_d = ddp_alloc(gpu->ctx, ws_bytes);
    CHECK(gpu->pool_fwd(gpu, q->p, x.d, N, C, H, W, y.d, ws_d, 4) == DDP_ERR_INVALID_ARG,
          "pool_fwd refuses a workspace too small");
    host_layout(&x, N, C, H, W, true);
    host_layout(&dy, N, C, H / 2, W / 2, true);
    CHECK(cpu->pool_fwd(cpu, q->p, x.h, N, C, H, W, y.h, ws_h, ws_bytes) == DDP_OK, "cpu pool_fwd");
    CHECK(gpu->pool_fwd(gpu, q->p, x.d, N, C, H, W, y.d, ws_d, ws_bytes) == DDP_OK, "pool_fwd");
    host_layout(&y, N, C, H / 2, W / 2, false);
    compare_t("pool_fwd", q, &y, 0);
    CHECK(cpu->pool_bwd(cpu, q->p, dy.h, ws_h, N, C, H, W, dx.h) == DDP_OK, "cpu pool_bwd");
    CHECK(gpu->pool_bwd(gpu, q->p, dy.d, ws_d, N, C, H, W, dx.d) == DDP_OK, "pool_bwd");
    host_layout(&dx, N, C, H, W, false);
    compare_t("pool_bwd", q, &dx, 0);
    free(ws_h), ddp_free(gpu->ctx, ws_d);
    drop_t(&x), drop_t(&y), drop_t(&dy), drop_t(&dx);
}

/* ---- models --------------------------------------------------------------------------------- */

/* ||a - b|| / ||b|| over n floats. */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0.0 ? den : 1.0));
}

/* One forward/backward of the same model on both backends: losses and gradients agree. */
static void check_model(test_rng *r, model_kind kind, const prec *q, double tol)
{
    model_config cfg;
    model_config_default(&cfg, kind);
    cfg.max_batch = 8;
    cfg.precision = q->p;
    model *mc = NULL, *mg = NULL;
    CHECK(model_create(NULL, cpu, &cfg, &mc) == DDP_OK && model_create(ctx, gpu, &cfg, &mg) == DDP_OK,
          "create %s", q->name);
    tens x = make_t(r, DDP_FP32, 8 * 784, 0, 1);
    int labels[8] = {0, 1, 2, 3, 4, 5, 6, 7}, *labels_d = ddp_alloc(gpu->ctx, sizeof labels);
    ddp_upload(gpu->ctx, labels_d, labels, sizeof labels);
    float lc = 0, lg = 0;
    if (mc && mg) {
        CHECK(model_forward(mc, x.h, labels, 8, &lc, NULL, NULL) == DDP_OK, "cpu forward");
        CHECK(model_backward(mc, NULL) == DDP_OK, "cpu backward");
        CHECK(model_forward(mg, x.d, labels_d, 8, &lg, NULL, NULL) == DDP_OK, "gpu forward");
        CHECK(model_backward(mg, NULL) == DDP_OK, "gpu backward");
        CHECK_CLOSE(lg, lc, tol, tol, "model loss");
        size_t n = model_numel_total(mc);
        float *g = test_floats(n);
        CHECK(ddp_download(gpu->ctx, g, model_grads(mg), n * sizeof *g) == DDP_OK, "download grads");
        double d = rel_l2(g, model_grads(mc), n);
        CHECK(d <= tol, "%s %s gradients: relative L2 distance %g > %g",
              kind == MODEL_CNN ? "cnn" : "mlp", q->name, d, tol);
        free(g);
    }
    model_destroy(mc), model_destroy(mg), ddp_free(gpu->ctx, labels_d), drop_t(&x);
}

/* --tf32: fp32 GEMMs round their inputs to 10 mantissa bits, so a GEMM over values that need
 * all 24 differs from the exact one (on a GPU with TF32), and still agrees within TF32's bound. */
static void check_tf32(test_rng *r, bool ampere)
{
    const int batch = 64, in = 256, out = 64;
    tens x = make_t(r, DDP_FP32, (size_t)batch * in, -1, 1), w = make_t(r, DDP_FP32, (size_t)out * in, -1, 1);
    tens b = make_t(r, DDP_FP32, out, 0, 0), y = make_t(r, DDP_FP32, (size_t)batch * out, 0, 1);
    cpu->linear_fwd(cpu, DDP_FP32, x.h, w.h, b.h, batch, in, out, y.h, true);
    CHECK(ops_cuda_set_tf32(gpu, true) == DDP_OK, "set tf32");
    CHECK(gpu->linear_fwd(gpu, DDP_FP32, x.d, w.d, b.d, batch, in, out, y.d, true) == DDP_OK, "tf32 gemm");
    float *got = gpu_floats(&y);
    double d = rel_l2(got, y.h, y.n);
    /* TF32 keeps 11 significant bits: each product errs by about 2^-11 relative */
    CHECK((d > 1e-6 || !ampere) && d < 2e-3, "TF32 GEMM: relative distance %g, want in (1e-6, 2e-3)", d);
    CHECK(ops_cuda_set_tf32(gpu, false) == DDP_OK, "unset tf32");
    free(got);
    drop_t(&x), drop_t(&w), drop_t(&b), drop_t(&y);
}

int main(void)
{
    int rc = test_cuda_open("test_cuda_precision", &ctx, &gpu, &cpu);
    if (rc != 0)
        return rc;
    test_rng r = {77};
    const char *why = NULL;
    CHECK(gpu->supports && gpu->cast && gpu->linear_fwd, "the CUDA table has the precision-aware ops");
    /* The CPU side is the oracle: where it emulates bf16 (float storage), its buffers are not the
     * GPU's 16-bit ones, so bf16 is compared only against a CPU with bf16 arithmetic. */
    bool ampere = gpu->supports(gpu, DDP_BF16, &why), cpu_bf16 = !cpu->emulates(cpu, DDP_BF16);
    bool cudnn = gpu->conv_fwd != NULL; /* a build without cuDNN convolves by im2col, fp32 only */
    if (!cudnn)
        fprintf(stderr, "test_cuda_precision: convolutions not checked: this build has no cuDNN\n");
    if (!ampere)
        fprintf(stderr, "test_cuda_precision: bf16 not checked: %s\n", why ? why : "?");
    const ops_conv_shape conv1 = {1, 28, 28, 20, 5, 2, 28, 28}, conv2 = {20, 14, 14, 20, 5, 2, 14, 14};
    const ops_conv_shape odd = {3, 7, 5, 4, 3, 1, 7, 5};
    const double model_tol[] = {1e-4, 1.0 / 16, 1.0 / 128};
    if (!cpu_bf16)
        fprintf(stderr, "test_cuda_precision: bf16 not compared: this CPU emulates bf16 (no AVX512_BF16, or "
                        "capped by DDP_CPU_ISA)\n");
    check_cast(&r, cpu_bf16);
    for (int i = 0; i < 3; i++) {
        const prec *q = &precs[i];
        if (q->p == DDP_BF16 && !(ampere && cpu_bf16))
            continue;
        check_relu(&r, q);
        check_linear(&r, q, 64, 784, 512);
        check_linear(&r, q, 33, 29, 17);
        if (cudnn) {
            check_conv(&r, q, 8, &conv1);
            check_conv(&r, q, 8, &conv2);
            check_conv(&r, q, 3, &odd);
            check_conv(&r, q, 19, &odd); /* bias sums over three chunks of images, one partial */
        }
        check_pool(&r, q);
        check_model(&r, MODEL_MLP, q, model_tol[i]);
        if (cudnn || q->p == DDP_FP32)
            check_model(&r, MODEL_CNN, q, model_tol[i]);
    }
    check_tf32(&r, ampere);
    test_cuda_close(ctx, gpu, cpu);
    return CHECK_DONE();
}
