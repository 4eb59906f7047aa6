/* test_backend_ops.c - each CPU backend op against a straightforward double-precision reference
 * on random inputs of odd sizes, plus ops_require's report of a missing op.
 *
 * Tolerances: elementwise ops are exact up to one float rounding (1e-6 absolute + 1e-6 relative);
 * gemm and reductions accumulate in float, so 1e-5 + 1e-5 * |ref| for sums of at most ~40 terms
 * of O(1) values; softmax cross-entropy 1e-6 + 1e-5 * |ref|.
 */
#include <string.h>

#include "ops.h"
#include "testutil.h"

static ops_handle *cpu;

static void ref_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
                     const float *b, float beta, float *c)
{
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[p * m + i] : a[i * k + p];
                double bv = tb ? b[j * k + p] : b[p * n + j];
                s += av * bv;
            }
            c[i * n + j] = (float)(alpha * s + beta * c[i * n + j]);
        }
    }
}

static void check_gemm(test_rng *r, int m, int n, int k)
{
    float *a = test_floats((size_t)m * k), *b = test_floats((size_t)k * n);
    float *c = test_floats((size_t)m * n), *want = test_floats((size_t)m * n);
    test_fill(r, a, (size_t)m * k, -1, 1), test_fill(r, b, (size_t)k * n, -1, 1);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        test_fill(r, c, (size_t)m * n, -1, 1);
        memcpy(want, c, (size_t)m * n * sizeof *c);
        CHECK(cpu->gemm(cpu, ta, tb, m, n, k, 0.5f, a, b, 0.25f, c) == DDP_OK, "gemm");
        ref_gemm(ta, tb, m, n, k, 0.5f, a, b, 0.25f, want);
        CHECK(test_compare("gemm", c, want, (size_t)m * n, 1e-5, 1e-5) == 0,
              "gemm %dx%dx%d trans_a=%d trans_b=%d", m, n, k, ta, tb);
    }
    free(a), free(b), free(c), free(want);
}

static void check_bias(test_rng *r)
{
    enum { ROWS = 7, COLS = 13 };
    float y[ROWS * COLS], want[ROWS * COLS], bias[COLS], db[COLS], db_want[COLS];
    test_fill(r, y, ROWS * COLS, -1, 1), test_fill(r, bias, COLS, -1, 1), test_fill(r, db, COLS, -1, 1);
    memcpy(db_want, db, sizeof db);
    for (int i = 0; i < ROWS * COLS; i++)
        want[i] = y[i] + bias[i % COLS];
    CHECK(cpu->bias_add(cpu, y, bias, ROWS, COLS) == DDP_OK, "bias_add");
    CHECK(test_compare("bias_add", y, want, ROWS * COLS, 1e-6, 1e-6) == 0, "bias_add");
    for (int c = 0; c < COLS; c++) {
        double s = db_want[c];
        for (int i = 0; i < ROWS; i++)
            s += y[i * COLS + c];
        db_want[c] = (float)s;
    }
    CHECK(cpu->bias_grad(cpu, db, y, ROWS, COLS) == DDP_OK, "bias_grad");
    CHECK(test_compare("bias_grad", db, db_want, COLS, 1e-5, 1e-5) == 0, "bias_grad accumulates");
}

static void check_elementwise(test_rng *r)
{
    enum { N = 1001 };
    static float x[N], y[N], dy[N], dx[N], want[N], w[N], m[N], g[N], w_want[N], m_want[N];
    test_fill(r, x, N, -1, 1), test_fill(r, dy, N, -1, 1);
    for (int i = 0; i < N; i++)
        want[i] = x[i] > 0 ? x[i] : 0;
    CHECK(cpu->relu_fwd(cpu, y, x, N) == DDP_OK && test_compare("relu", y, want, N, 0, 0) == 0, "relu_fwd");
    for (int i = 0; i < N; i++)
        want[i] = x[i] > 0 ? dy[i] : 0;
    CHECK(cpu->relu_bwd(cpu, dx, dy, y, N) == DDP_OK && test_compare("relu_bwd", dx, want, N, 0, 0) == 0, "relu_bwd");
    memcpy(y, x, sizeof x);
    for (int i = 0; i < N; i++)
        want[i] = x[i] * -1.5f;
    CHECK(cpu->scale(cpu, DDP_FP32, y, N, -1.5f) == DDP_OK && test_compare("scale", y, want, N, 1e-6, 1e-6) == 0, "scale");
    for (int i = 0; i < N; i++)
        want[i] = (float)((double)y[i] + 0.75 * dy[i]);
    CHECK(cpu->axpy(cpu, y, dy, N, 0.75f) == DDP_OK && test_compare("axpy", y, want, N, 1e-6, 1e-6) == 0, "axpy");
    /* two SGD steps: PyTorch's momentum buffer with weight decay */
    test_fill(r, w, N, -1, 1), memcpy(w_want, w, sizeof w);
    for (int step = 0; step < 2; step++) {
        test_fill(r, g, N, -1, 1);
        for (int i = 0; i < N; i++) {
            double gd = (double)g[i] + 0.01 * w_want[i];
            m_want[i] = (float)(0.9 * m_want[i] + gd);
            w_want[i] = (float)((double)w_want[i] - 0.1 * m_want[i]);
        }
        CHECK(cpu->sgd_step(cpu, w, m, g, N, 0.1f, 0.9f, 0.01f) == DDP_OK, "sgd_step");
    }
    CHECK(test_compare("sgd w", w, w_want, N, 1e-6, 1e-5) == 0, "sgd_step weights");
    CHECK(test_compare("sgd m", m, m_want, N, 1e-6, 1e-5) == 0, "sgd_step momentum");
}

/* sgd_step_cast: the weights and momentum of sgd_step bit for bit, and the compute copy equal to
 * the cast of the updated weights, in every precision (bf16 takes the one-pass path on CPUs with
 * AVX512_BF16; an odd length runs its tail too). */
static void check_sgd_cast(test_rng *r)
{
    enum { NS = 1037 };
    static float w[NS], m[NS], g[NS], w2[NS], m2[NS];
    static uint32_t copy[NS], want[NS];
    for (int p = 0; p < 3; p++) {
        test_fill(r, w, NS, -1, 1), test_fill(r, m, NS, -1, 1), test_fill(r, g, NS, -1, 1);
        memcpy(w2, w, sizeof w), memcpy(m2, m, sizeof m);
        memset(copy, 0xA5, sizeof copy), memset(want, 0xA5, sizeof want);
        CHECK(cpu->sgd_step_cast(cpu, w, m, g, NS, 0.1f, 0.9f, 0.01f, (ddp_dtype)p, copy) == DDP_OK, "sgd_step_cast");
        CHECK(cpu->sgd_step(cpu, w2, m2, g, NS, 0.1f, 0.9f, 0.01f) == DDP_OK, "sgd_step");
        if (p != DDP_FP32)
            CHECK(cpu->cast(cpu, (ddp_dtype)p, want, DDP_FP32, w2, NS) == DDP_OK, "cast");
        CHECK(memcmp(w, w2, sizeof w) == 0 && memcmp(m, m2, sizeof m) == 0,
              "sgd_step_cast (precision %d): weights or momentum differ from sgd_step", p);
        CHECK(memcmp(copy, want, sizeof copy) == 0, "sgd_step_cast (precision %d): the compute copy differs", p);
    }
}

/* im2col against direct indexing; col2im against a scatter-add reference. */
static void check_im2col(test_rng *r, int c, int h, int w, int k, int pad)
{
    int ho = h + 2 * pad - k + 1, wo = w + 2 * pad - k + 1;
    size_t n_im = (size_t)c * h * w, n_col = (size_t)c * k * k * ho * wo;
    float *im = test_floats(n_im), *col = test_floats(n_col), *want = test_floats(n_col);
    float *im2 = test_floats(n_im), *im_want = test_floats(n_im);
    test_fill(r, im, n_im, -1, 1), test_fill(r, im2, n_im, -1, 1);
    memcpy(im_want, im2, n_im * sizeof(float));
    for (int ci = 0; ci < c; ci++)
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++)
                for (int oy = 0; oy < ho; oy++)
                    for (int ox = 0; ox < wo; ox++) {
                        int y = oy + ky - pad, x = ox + kx - pad;
                        size_t at = (((size_t)(ci * k + ky) * k + kx) * ho + oy) * wo + ox;
                        int in = y >= 0 && y < h && x >= 0 && x < w;
                        want[at] = in ? im[(ci * h + y) * w + x] : 0.0f;
                        if (in)
                            im_want[(ci * h + y) * w + x] += want[at];
                    }
    CHECK(cpu->im2col(cpu, im, c, h, w, k, pad, col) == DDP_OK, "im2col");
    CHECK(test_compare("im2col", col, want, n_col, 0, 0) == 0, "im2col c=%d h=%d w=%d k=%d pad=%d", c, h, w, k, pad);
    CHECK(cpu->col2im(cpu, want, c, h, w, k, pad, im2) == DDP_OK, "col2im");
    CHECK(test_compare("col2im", im2, im_want, n_im, 1e-5, 1e-5) == 0, "col2im adds, k=%d pad=%d", k, pad);
    free(im), free(col), free(want), free(im2), free(im_want);
}

static void check_maxpool(test_rng *r)
{
    enum { P = 3, H = 6, W = 10, NO = P * (H / 2) * (W / 2) };
    float x[P * H * W], y[NO], want[NO], dy[NO], dx[P * H * W], dx_want[P * H * W];
    int arg[NO];
    test_fill(r, x, P * H * W, -1, 1), test_fill(r, dy, NO, -1, 1), test_fill(r, dx, P * H * W, -1, 1);
    memcpy(dx_want, dx, sizeof dx);
    for (int p = 0; p < P; p++)
        for (int oy = 0; oy < H / 2; oy++)
            for (int ox = 0; ox < W / 2; ox++) {
                int o = (p * (H / 2) + oy) * (W / 2) + ox, best = -1;
                for (int d = 0; d < 4; d++) {
                    int i = (p * H + 2 * oy + d / 2) * W + 2 * ox + d % 2;
                    if (best < 0 || x[i] > x[best])
                        best = i;
                }
                want[o] = x[best];
                dx_want[best] += dy[o];
            }
    CHECK(cpu->maxpool_fwd(cpu, x, P, H, W, y, arg) == DDP_OK, "maxpool_fwd");
    CHECK(test_compare("maxpool", y, want, NO, 0, 0) == 0, "maxpool_fwd values");
    CHECK(cpu->maxpool_bwd(cpu, dy, arg, P, H, W, dx) == DDP_OK, "maxpool_bwd");
    CHECK(test_compare("maxpool_bwd", dx, dx_want, P * H * W, 1e-6, 1e-6) == 0, "maxpool_bwd adds");
    CHECK(cpu->maxpool_fwd(cpu, x, P, 5, W, y, arg) == DDP_ERR_INVALID_ARG, "odd height rejected");
}

static void check_xent(test_rng *r)
{
    enum { R = 5, C = 7 };
    float z[R * C], dz[R * C], dz_want[R * C], loss;
    int labels[R] = {0, 6, 3, 3, 1}, correct, want_correct = 0;
    test_fill(r, z, R * C, -4, 4);
    z[1 * C + 6] = 10.0f; /* row 1 is predicted right for sure */
    double want_loss = 0.0;
    for (int i = 0; i < R; i++) {
        double mx = z[i * C], s = 0.0;
        int arg = 0;
        for (int c = 1; c < C; c++)
            if (z[i * C + c] > mx)
                mx = z[i * C + c], arg = c;
        for (int c = 0; c < C; c++)
            s += exp(z[i * C + c] - mx);
        want_loss += log(s) - (z[i * C + labels[i]] - mx);
        want_correct += arg == labels[i];
        for (int c = 0; c < C; c++)
            dz_want[i * C + c] = (float)((exp(z[i * C + c] - mx) / s - (c == labels[i])) / R);
    }
    CHECK(cpu->softmax_xent(cpu, z, labels, R, C, dz, &loss, &correct) == DDP_OK, "softmax_xent");
    CHECK_CLOSE(loss, want_loss / R, 1e-6, 1e-5, "mean loss");
    CHECK(correct == want_correct && correct >= 1, "correct %d, want %d", correct, want_correct);
    CHECK(test_compare("dlogits", dz, dz_want, R * C, 1e-6, 1e-5) == 0, "dlogits");
    float acc = 1.5f; /* the training variant adds the mean loss to what is there */
    CHECK(cpu->softmax_xent_acc(cpu, z, labels, R, C, dz, &acc) == DDP_OK, "softmax_xent_acc");
    CHECK_CLOSE(acc, 1.5 + want_loss / R, 1e-6, 1e-5, "accumulated loss");
    labels[2] = C;
    CHECK(cpu->softmax_xent_acc(cpu, z, labels, R, C, dz, &acc) == DDP_ERR_INVALID_ARG, "bad label (acc)");
    CHECK(cpu->softmax_xent(cpu, z, labels, R, C, NULL, &loss, NULL) == DDP_ERR_INVALID_ARG, "bad label");
}

static void check_memory_and_require(void)
{
    float *p = ddp_alloc(cpu->ctx, 37 * sizeof(float)), host[37], back[37];
    int zeros = 0;
    for (int i = 0; i < 37; i++)
        zeros += p[i] == 0.0f, host[i] = (float)i;
    CHECK(zeros == 37, "alloc returns zeroed memory");
    CHECK(ddp_upload(cpu->ctx, p, host, sizeof host) == DDP_OK && ddp_download(cpu->ctx, back, p, sizeof back) == DDP_OK, "copies");
    CHECK(memcmp(host, back, sizeof host) == 0, "round trip");
    CHECK(ddp_zero(cpu->ctx, p, sizeof host) == DDP_OK && p[36] == 0.0f, "zero");
    ddp_free(cpu->ctx, p);
    ddp_free(cpu->ctx, NULL);
    CHECK(ops_require(cpu, "test") == DDP_OK, "cpu backend is complete");
    ops_handle partial = *cpu;
    partial.im2col = NULL;
    CHECK(ops_require(&partial, "test") == DDP_ERR_UNSUPPORTED, "missing im2col reported");
}

int main(void)
{
    if (ops_cpu_open(NULL, 1, false, &cpu) != DDP_OK)
        return 1;
    test_rng r = {12345};
    check_gemm(&r, 7, 5, 3);
    check_gemm(&r, 33, 17, 29);
    check_gemm(&r, 1, 9, 1);
    check_bias(&r);
    check_elementwise(&r);
    check_sgd_cast(&r);
    check_im2col(&r, 3, 7, 5, 3, 1);
    check_im2col(&r, 2, 6, 9, 5, 2);
    check_im2col(&r, 1, 5, 4, 3, 0);
    check_maxpool(&r);
    check_xent(&r);
    check_memory_and_require();
    ops_close(cpu);
    return CHECK_DONE();
}
