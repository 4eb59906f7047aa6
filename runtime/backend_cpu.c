/* backend_cpu.c - the CPU ops table: host memory, OpenBLAS sgemm, plain loops over the scalar
 * math of math_shared.h (the same math the CUDA kernels run). Always built.
 */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "math_shared.h"

/* ---- memory ------------------------------------------------------------------------------ */

static void *cpu_alloc(size_t n_bytes) { return calloc(n_bytes ? n_bytes : 1, 1); }

static void cpu_free(void *p) { free(p); }

static ddp_status cpu_copy(void *dst, const void *src, size_t n_bytes)
{
    if (n_bytes && (!dst || !src))
        return DDP_ERR_INVALID_ARG;
    if (n_bytes)
        memmove(dst, src, n_bytes);
    return DDP_OK;
}

static ddp_status cpu_zero(void *dst, size_t n_bytes)
{
    if (n_bytes && !dst)
        return DDP_ERR_INVALID_ARG;
    if (n_bytes)
        memset(dst, 0, n_bytes);
    return DDP_OK;
}

static ddp_status cpu_sync(void) { return DDP_OK; }

/* ---- gemm -------------------------------------------------------------------------------- */

static ddp_status cpu_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const float *a, const float *b, float beta, float *c)
{
    if (m < 0 || n < 0 || k < 0) {
        DDP_ERROR("cpu gemm: negative shape m=%d n=%d k=%d", m, n, k);
        return DDP_ERR_INVALID_ARG;
    }
    if (m == 0 || n == 0)
        return DDP_OK;
    int lda = trans_a ? m : k;
    int ldb = trans_b ? k : n;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda > 0 ? lda : 1, b,
                ldb > 0 ? ldb : 1, beta, c, n);
    return DDP_OK;
}

/* ---- elementwise and reductions ---------------------------------------------------------- */

static ddp_status cpu_bias_add(float *y, const float *bias, int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            y[(size_t)r * cols + c] += bias[c];
    return DDP_OK;
}

static ddp_status cpu_bias_grad(float *dbias, const float *dy, int rows, int cols)
{
    for (int c = 0; c < cols; c++) {
        float s = 0.0f;
        for (int r = 0; r < rows; r++)
            s += dy[(size_t)r * cols + c];
        dbias[c] += s;
    }
    return DDP_OK;
}

static ddp_status cpu_relu_fwd(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = ddp_relu(x[i]);
    return DDP_OK;
}

static ddp_status cpu_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = ddp_relu_grad(dy[i], y[i]);
    return DDP_OK;
}

static ddp_status cpu_scale(float *x, size_t n, float alpha)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
    return DDP_OK;
}

static ddp_status cpu_axpy(float *y, const float *x, size_t n, float alpha)
{
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return DDP_OK;
}

static ddp_status cpu_sgd_step(float *w, float *m, const float *g, size_t n, float lr,
                               float momentum, float weight_decay)
{
    for (size_t i = 0; i < n; i++)
        w[i] = ddp_sgd_update(w[i], &m[i], g[i], lr, momentum, weight_decay);
    return DDP_OK;
}

/* ---- convolution helpers ----------------------------------------------------------------- */

static ddp_status cpu_im2col(const float *im, int c, int h, int w, int k, int pad, float *col)
{
    int h_out = ddp_conv_out(h, k, pad), w_out = ddp_conv_out(w, k, pad);
    if (k < 1 || pad < 0 || h_out < 1 || w_out < 1)
        return DDP_ERR_INVALID_ARG;
    for (int row = 0; row < c * k * k; row++) {
        int ci, ky, kx;
        ddp_im2col_row_split(row, k, &ci, &ky, &kx);
        float *dst = col + (size_t)row * h_out * w_out; // (h_out, w_out)
        for (int oy = 0; oy < h_out; oy++) {
            for (int ox = 0; ox < w_out; ox++) {
                ptrdiff_t src = ddp_im2col_src(h, w, pad, ci, ky, kx, oy, ox);
                dst[oy * w_out + ox] = src < 0 ? 0.0f : im[src];
            }
        }
    }
    return DDP_OK;
}

static ddp_status cpu_col2im(const float *col, int c, int h, int w, int k, int pad, float *im)
{
    if (k < 1 || pad < 0 || ddp_conv_out(h, k, pad) < 1 || ddp_conv_out(w, k, pad) < 1)
        return DDP_ERR_INVALID_ARG;
    for (int ci = 0; ci < c; ci++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                im[((size_t)ci * h + y) * w + x] += ddp_col2im_gather(col, h, w, k, pad, ci, y, x);
    return DDP_OK;
}

static ddp_status cpu_maxpool_fwd(const float *x, int planes, int h, int w, float *y, int *argmax)
{
    if (h % 2 || w % 2 || (size_t)planes * h * w > INT_MAX)
        return DDP_ERR_INVALID_ARG;
    int ho = h / 2, wo = w / 2;
    for (int p = 0; p < planes; p++) {
        for (int oy = 0; oy < ho; oy++) {
            for (int ox = 0; ox < wo; ox++) {
                size_t o = ((size_t)p * ho + oy) * wo + ox;
                y[o] = ddp_pool_max(x, p, oy, ox, h, w, &argmax[o]);
            }
        }
    }
    return DDP_OK;
}

static ddp_status cpu_maxpool_bwd(const float *dy, const int *argmax, int planes, int h, int w,
                                  float *dx)
{
    size_t n_out = (size_t)planes * (h / 2) * (w / 2);
    for (size_t o = 0; o < n_out; o++)
        dx[argmax[o]] += dy[o];
    return DDP_OK;
}

static ddp_status cpu_softmax_xent(const float *logits, const int *labels, int rows, int classes,
                                   float *dlogits, float *loss_host, int *correct_host)
{
    if (rows < 1 || classes < 1)
        return DDP_ERR_INVALID_ARG;
    double loss = 0.0;
    int correct = 0;
    for (int r = 0; r < rows; r++) {
        if (labels[r] < 0 || labels[r] >= classes) {
            DDP_ERROR("softmax_xent: label %d of row %d outside [0, %d)", labels[r], r, classes);
            return DDP_ERR_INVALID_ARG;
        }
    }
    for (int r = 0; r < rows; r++) {
        int pred;
        float *dz = dlogits ? dlogits + (size_t)r * classes : NULL;
        loss += ddp_xent_row(logits + (size_t)r * classes, labels[r], classes, 1.0f / (float)rows,
                             dz, &pred);
        correct += pred == labels[r];
    }
    if (loss_host)
        *loss_host = (float)(loss / rows);
    if (correct_host)
        *correct_host = correct;
    return DDP_OK;
}

static ddp_status cpu_softmax_xent_acc(const float *logits, const int *labels, int rows,
                                       int classes, float *dlogits, float *loss_acc)
{
    float loss = 0.0f;
    ddp_status st = cpu_softmax_xent(logits, labels, rows, classes, dlogits, &loss, NULL);
    if (st == DDP_OK)
        *loss_acc += loss;
    return st;
}

/* ---- the table --------------------------------------------------------------------------- */

static const ddp_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .sgd_step = cpu_sgd_step,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .maxpool_fwd = cpu_maxpool_fwd,
    .maxpool_bwd = cpu_maxpool_bwd,
    .softmax_xent = cpu_softmax_xent,
    .softmax_xent_acc = cpu_softmax_xent_acc,
};

const ddp_ops *ddp_cpu_ops(void) { return &cpu_ops; }

void ddp_cpu_set_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }
