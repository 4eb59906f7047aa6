/* test_cuda_parity.c - every op the CUDA backend implements against the CPU backend on the same
 * random inputs (the CPU is the oracle), then one MLP and one CNN training step on both, and the
 * double-buffered batch uploads.
 * Exits 77 (skipped) when there is no usable GPU or no CUDA build.
 *
 * Tolerance |cuda - cpu| <= atol + rtol * |cpu|: elementwise ops 1e-6 + 1e-6 (one rounding; expf
 * on the device differs by up to 2 ulp, hence 1e-5 relative for softmax); gemm 1e-4 + 1e-4 (cuBLAS
 * may reorder sums and use FMA over k <= 784 terms of O(1) values); model gradients 1e-4 + 1e-3.
 */
#include <string.h>

#include "ops.h"
#include "model.h"
#include "testutil.h"

static ops_handle *cpu, *gpu;
static ddp_ctx *ctx;

/* A host array and its device copy. */
typedef struct pair {
    float *h, *d;
    size_t n;
} pair;

static pair make_pair(test_rng *r, size_t n, double lo, double hi)
{
    pair p = {test_floats(n), ddp_alloc(gpu->ctx, n * sizeof(float)), n};
    test_fill(r, p.h, n, lo, hi);
    if (p.d)
        ddp_upload(gpu->ctx, p.d, p.h, n * sizeof(float));
    return p;
}

static void drop_pair(pair *p)
{
    free(p->h);
    ddp_free(gpu->ctx, p->d);
}

/* Compares the device result with the host result. */
static void compare_pair(const char *what, const pair *p, double atol, double rtol)
{
    float *back = test_floats(p->n);
    CHECK(ddp_download(gpu->ctx, back, p->d, p->n * sizeof(float)) == DDP_OK, "%s: download", what);
    int bad = test_compare(what, back, p->h, p->n, atol, rtol);
    CHECK(bad == 0, "%s: %d of %zu differ", what, bad, p->n);
    free(back);
}

static void check_gemm(test_rng *r, int m, int n, int k)
{
    pair a = make_pair(r, (size_t)m * k, -1, 1), b = make_pair(r, (size_t)k * n, -1, 1);
    for (int t = 0; t < 4; t++) {
        pair c = make_pair(r, (size_t)m * n, -1, 1);
        cpu->gemm(cpu, t & 1, t & 2, m, n, k, 0.5f, a.h, b.h, 0.25f, c.h);
        CHECK(gpu->gemm(gpu, t & 1, t & 2, m, n, k, 0.5f, a.d, b.d, 0.25f, c.d) == DDP_OK, "gemm");
        compare_pair("gemm", &c, 1e-4, 1e-4);
        drop_pair(&c);
    }
    drop_pair(&a), drop_pair(&b);
}

static void check_elementwise(test_rng *r)
{
    const size_t n = 100003;
    pair x = make_pair(r, n, -1, 1), y = make_pair(r, n, -1, 1), g = make_pair(r, n, -1, 1);
    pair m = make_pair(r, n, -1, 1), dx = make_pair(r, n, -1, 1);
    cpu->relu_fwd(cpu, y.h, x.h, n), gpu->relu_fwd(gpu, y.d, x.d, n), compare_pair("relu_fwd", &y, 0, 0);
    cpu->relu_bwd(cpu, dx.h, g.h, y.h, n), gpu->relu_bwd(gpu, dx.d, g.d, y.d, n), compare_pair("relu_bwd", &dx, 0, 0);
    cpu->scale(cpu, DDP_FP32, x.h, n, 0.3f), gpu->scale(gpu, DDP_FP32, x.d, n, 0.3f), compare_pair("scale", &x, 1e-6, 1e-6);
    cpu->axpy(cpu, x.h, g.h, n, -2.0f), gpu->axpy(gpu, x.d, g.d, n, -2.0f), compare_pair("axpy", &x, 1e-6, 1e-6);
    cpu->sgd_step(cpu, x.h, m.h, g.h, n, 0.1f, 0.9f, 1e-3f);
    gpu->sgd_step(gpu, x.d, m.d, g.d, n, 0.1f, 0.9f, 1e-3f);
    compare_pair("sgd w", &x, 1e-6, 1e-6), compare_pair("sgd m", &m, 1e-6, 1e-6);
    cpu->bias_add(cpu, y.h, g.h, 1001, 99), gpu->bias_add(gpu, y.d, g.d, 1001, 99), compare_pair("bias_add", &y, 1e-6, 1e-6);
    cpu->bias_grad(cpu, m.h, y.h, 1001, 99), gpu->bias_grad(gpu, m.d, y.d, 1001, 99);
    compare_pair("bias_grad", &m, 1e-4, 1e-4);
    drop_pair(&x), drop_pair(&y), drop_pair(&g), drop_pair(&m), drop_pair(&dx);
}

/* The training variant keeps the loss on the device: it adds the mean loss to *acc; a label out
 * of range makes it NaN. labels_d holds labels[0..R); logits are (R, C). */
static void check_xent_acc(pair *z, pair *dz, const int *labels, int *labels_d, int R, int C)
{
    float acc_h = 0.25f, acc_g = 0.0f, *acc_d = ddp_alloc(gpu->ctx, sizeof acc_h);
    ddp_upload(gpu->ctx, acc_d, &acc_h, sizeof acc_h);
    cpu->softmax_xent_acc(cpu, z->h, labels, R, C, dz->h, &acc_h);
    CHECK(gpu->softmax_xent_acc(gpu, z->d, labels_d, R, C, dz->d, acc_d) == DDP_OK, "softmax_xent_acc");
    CHECK(ddp_download(gpu->ctx, &acc_g, acc_d, sizeof acc_g) == DDP_OK, "download acc");
    CHECK_CLOSE(acc_g, acc_h, 1e-6, 1e-5, "accumulated loss");
    compare_pair("dlogits (acc)", dz, 1e-6, 1e-5);
    int bad = C;
    ddp_upload(gpu->ctx, labels_d + 5, &bad, sizeof bad);
    gpu->softmax_xent_acc(gpu, z->d, labels_d, R, C, dz->d, acc_d);
    CHECK(ddp_download(gpu->ctx, &acc_g, acc_d, sizeof acc_g) == DDP_OK && isnan(acc_g),
          "a bad label gives a NaN loss, got %g", (double)acc_g);
    ddp_free(gpu->ctx, acc_d);
}

static void check_conv_helpers(test_rng *r, int c, int h, int w, int k, int pad)
{
    int ho = h + 2 * pad - k + 1, wo = w + 2 * pad - k + 1;
    size_t n_im = (size_t)c * h * w, n_col = (size_t)c * k * k * ho * wo;
    pair im = make_pair(r, n_im, -1, 1), col = make_pair(r, n_col, -1, 1);
    cpu->im2col(cpu, im.h, c, h, w, k, pad, col.h), gpu->im2col(gpu, im.d, c, h, w, k, pad, col.d);
    compare_pair("im2col", &col, 0, 0);
    cpu->col2im(cpu, col.h, c, h, w, k, pad, im.h), gpu->col2im(gpu, col.d, c, h, w, k, pad, im.d);
    compare_pair("col2im", &im, 1e-5, 1e-5);
    drop_pair(&im), drop_pair(&col);
}

static void check_pool_xent(test_rng *r)
{
    enum { P = 37, H = 14, W = 10, NO = P * (H / 2) * (W / 2), R = 61, C = 10 };
    pair x = make_pair(r, P * H * W, -1, 1), y = make_pair(r, NO, -1, 1), dy = make_pair(r, NO, -1, 1);
    pair dx = make_pair(r, P * H * W, -1, 1);
    int *arg_h = calloc(NO, sizeof(int)), *arg_d = ddp_alloc(gpu->ctx, NO * sizeof(int));
    cpu->maxpool_fwd(cpu, x.h, P, H, W, y.h, arg_h), gpu->maxpool_fwd(gpu, x.d, P, H, W, y.d, arg_d);
    compare_pair("maxpool_fwd", &y, 0, 0);
    cpu->maxpool_bwd(cpu, dy.h, arg_h, P, H, W, dx.h), gpu->maxpool_bwd(gpu, dy.d, arg_d, P, H, W, dx.d);
    compare_pair("maxpool_bwd", &dx, 1e-6, 1e-6);
    pair z = make_pair(r, R * C, -5, 5), dz = make_pair(r, R * C, -1, 1);
    int labels[R], *labels_d = ddp_alloc(gpu->ctx, sizeof labels), ch, cg;
    for (int i = 0; i < R; i++)
        labels[i] = (int)(test_uniform(r) * C);
    ddp_upload(gpu->ctx, labels_d, labels, sizeof labels);
    float lh, lg;
    cpu->softmax_xent(cpu, z.h, labels, R, C, dz.h, &lh, &ch);
    CHECK(gpu->softmax_xent(gpu, z.d, labels_d, R, C, dz.d, &lg, &cg) == DDP_OK, "softmax_xent");
    CHECK_CLOSE(lg, lh, 1e-6, 1e-5, "loss");
    CHECK(cg == ch, "correct %d vs %d", cg, ch);
    compare_pair("dlogits", &dz, 1e-6, 1e-5);
    check_xent_acc(&z, &dz, labels, labels_d, R, C);
    free(arg_h), ddp_free(gpu->ctx, arg_d), ddp_free(gpu->ctx, labels_d);
    drop_pair(&x), drop_pair(&y), drop_pair(&dy), drop_pair(&dx), drop_pair(&z), drop_pair(&dz);
}

/* One forward/backward of the same model on both backends; gradients must agree. */
static void check_model(test_rng *r, model_kind kind)
{
    model_config cfg;
    model_config_default(&cfg, kind);
    cfg.max_batch = 8;
    model *mc = NULL, *mg = NULL;
    CHECK(model_create(NULL, cpu, &cfg, &mc) == DDP_OK && model_create(ctx, gpu, &cfg, &mg) == DDP_OK, "create");
    pair x = make_pair(r, 8 * 784, 0, 1);
    int labels[8] = {0, 1, 2, 3, 4, 5, 6, 7}, *labels_d = ddp_alloc(gpu->ctx, sizeof labels);
    ddp_upload(gpu->ctx, labels_d, labels, sizeof labels);
    float lc = 0, lg = 0;
    if (mc && mg) {
        model_forward(mc, x.h, labels, 8, &lc, NULL, NULL), model_backward(mc, NULL);
        CHECK(model_forward(mg, x.d, labels_d, 8, &lg, NULL, NULL) == DDP_OK, "gpu forward");
        CHECK(model_backward(mg, NULL) == DDP_OK, "gpu backward");
        CHECK_CLOSE(lg, lc, 1e-5, 1e-4, "model loss");
        pair gr = {model_grads(mc), model_grads(mg), model_numel_total(mc)};
        compare_pair(kind == MODEL_CNN ? "cnn grads" : "mlp grads", &gr, 1e-4, 1e-3);
    }
    model_destroy(mc), model_destroy(mg), ddp_free(gpu->ctx, labels_d), drop_pair(&x);
}

/* libddp's double-buffered batch staging: each round fills one slot while the other holds the
 * batch before; the host buffer is overwritten as soon as ddp_stage_upload returns (the pinned
 * staging must already hold the data), and after ddp_stage_acquire the compute stream sees exactly
 * the round's values. */
static void check_batch_uploads(void)
{
    enum { N = 70001, L = 64 };
    float *x = test_floats(N), *back = test_floats(N);
    int labels[L], labels_back[L];
    float *xd[2] = {ddp_alloc(gpu->ctx, N * sizeof(float)), ddp_alloc(gpu->ctx, N * sizeof(float))};
    int *yd[2] = {ddp_alloc(gpu->ctx, sizeof labels), ddp_alloc(gpu->ctx, sizeof labels)};
    CHECK(ddp_stage_upload(gpu->ctx, 2, 0, xd[0], x, 4) == DDP_ERR_INVALID_ARG, "slot 2 is refused");
    for (int round = 0; round < 6; round++) {
        int s = round & 1;
        for (int i = 0; i < N; i++)
            x[i] = (float)(round * N + i);
        for (int i = 0; i < L; i++)
            labels[i] = round * L + i;
        CHECK(ddp_stage_upload(gpu->ctx, s, 0, xd[s], x, N * sizeof(float)) == DDP_OK, "upload images");
        CHECK(ddp_stage_upload(gpu->ctx, s, 1, yd[s], labels, sizeof labels) == DDP_OK, "upload labels");
        memset(x, 0xff, N * sizeof(float)), memset(labels, 0xff, sizeof labels);
        CHECK(ddp_stage_acquire(gpu->ctx, s) == DDP_OK, "acquire");
        CHECK(ddp_download(gpu->ctx, back, xd[s], N * sizeof(float)) == DDP_OK, "download");
        CHECK(ddp_download(gpu->ctx, labels_back, yd[s], sizeof labels) == DDP_OK, "download labels");
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += back[i] != (float)(round * N + i);
        for (int i = 0; i < L; i++)
            bad += labels_back[i] != round * L + i;
        CHECK(bad == 0, "round %d: %d values differ from the batch uploaded", round, bad);
        CHECK(ddp_stage_release(gpu->ctx, s) == DDP_OK, "release");
    }
    for (int s = 0; s < 2; s++)
        ddp_free(gpu->ctx, xd[s]), ddp_free(gpu->ctx, yd[s]);
    free(x), free(back);
}

int main(void)
{
    int rc = test_cuda_open("test_cuda_parity", &ctx, &gpu, &cpu);
    if (rc != 0)
        return rc;
    test_rng r = {2024};
    CHECK(ops_require(gpu, "parity") == DDP_OK, "cuda backend implements every op");
    check_gemm(&r, 64, 512, 784);
    check_gemm(&r, 33, 17, 29);
    check_elementwise(&r);
    check_conv_helpers(&r, 3, 7, 5, 3, 1);
    check_conv_helpers(&r, 20, 14, 14, 5, 2);
    check_pool_xent(&r);
    check_model(&r, MODEL_MLP);
    check_model(&r, MODEL_CNN);
    check_batch_uploads();
    test_cuda_close(ctx, gpu, cpu);
    return CHECK_DONE();
}
