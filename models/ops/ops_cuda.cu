/* ops_cuda.cu - the CUDA ops handle: cuBLAS sgemm (row-major through the transpose identity),
 * kernels for the fp32 primitives over the scalar math of math_shared.h, and the handle's
 * lifecycle. Memory, transfers and host waits are libddp's (ddp_alloc, ddp_download). The precision-aware layer ops are in cuda_layers.cu (cuBLAS GEMMs in
 * fp32, bf16 and emulated fp16, casts, ReLU, max-pool) and cuda_cudnn.cu (cuDNN convolutions).
 *
 * ops_cuda_open() creates the cuBLAS (and cuDNN) handles of a handle on the stream every op runs
 * on: libddp's (ddp_backend_stream()), so collectives follow the compute. The file has two sections: kernels, then launchers; every launcher runs on the
 * backend stream and ends with a cudaGetLastError check.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_private.h"
#include "half.h"
#include "math_shared.h"

/* ---- checks and scratch ---------------------------------------------------------------- */

ddp_status cuda_scratch(const ops_handle *ops, int slot, size_t n_bytes, void **out)
{
    cuda_state *cu = cuda_of(ops);
    if (n_bytes > cu->scratch_bytes[slot]) {
        void *old = cu->scratch[slot]; /* forgotten first: never freed twice */
        cu->scratch[slot] = NULL;
        cu->scratch_bytes[slot] = 0;
        ddp_free(ops->ctx, old); /* after the queued work that may read it */
        cu->scratch[slot] = ddp_alloc(ops->ctx, n_bytes);
        if (!cu->scratch[slot])
            return DDP_ERR_CUDA;
        cu->scratch_bytes[slot] = n_bytes;
    }
    *out = cu->scratch[slot];
    return DDP_OK;
}

static void scratch_release(const ops_handle *ops)
{
    cuda_state *cu = cuda_of(ops);
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++) {
        ddp_free(ops->ctx, cu->scratch[i]);
        cu->scratch[i] = NULL;
        cu->scratch_bytes[i] = 0;
    }
}

/* ================================================================================ kernels == */

__global__ void bias_add_kernel(float *y, const float *bias, int rows, int cols)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * cols)
        y[i] += bias[i % cols];
}

__global__ void relu_fwd_kernel(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = relu(x[i]);
}

__global__ void relu_bwd_kernel(float *dx, const float *dy, const float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dx[i] = relu_grad(dy[i], y[i]);
}

__global__ void scale_kernel(float *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= alpha;
}

/* scale_kernel on bf16 bits, rounded to nearest even. */
__global__ void scale_bf16_kernel(uint16_t *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = half_f32_to_bf16(half_bf16_to_f32(x[i]) * alpha);
}

__global__ void axpy_kernel(float *y, const float *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += alpha * x[i];
}

__global__ void sgd_kernel(float *w, float *m, const float *g, size_t n, float lr,
                               float momentum, float weight_decay)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        w[i] = sgd_update(w[i], &m[i], g[i], lr, momentum, weight_decay);
}

/* sgd_kernel that also writes the updated weight to wc in bf16, rounded to nearest even (the CPU's
 * sgd_step_cast). */
__global__ void sgd_bf16_kernel(float *w, float *m, const float *g, size_t n, float lr,
                                float momentum, float weight_decay, uint16_t *wc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float wi = sgd_update(w[i], &m[i], g[i], lr, momentum, weight_decay);
    w[i] = wi;
    wc[i] = half_f32_to_bf16(wi);
}

/* One thread per col element; col is (c*k*k, h_out*w_out). */
__global__ void im2col_kernel(const float *im, int c, int h, int w, int k, int pad, float *col)
{
    int h_out = conv_out(h, k, pad), w_out = conv_out(w, k, pad);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t hw = (size_t)h_out * w_out;
    if (i >= (size_t)c * k * k * hw)
        return;
    int row = (int)(i / hw), pos = (int)(i % hw);
    int ci, ky, kx;
    im2col_row_split(row, k, &ci, &ky, &kx);
    ptrdiff_t src = im2col_src(h, w, pad, ci, ky, kx, pos / w_out, pos % w_out);
    col[i] = src < 0 ? 0.0f : im[src];
}

/* One thread per image element (C,H,W): gathers its col entries, so no atomics are needed. */
__global__ void col2im_kernel(const float *col, int c, int h, int w, int k, int pad, float *im)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)c * h * w)
        return;
    int x = (int)(i % w), y = (int)((i / w) % h), ci = (int)(i / ((size_t)w * h));
    im[i] += col2im_gather(col, h, w, k, pad, ci, y, x);
}

__global__ void maxpool_fwd_kernel(const float *x, int planes, int h, int w, float *y,
                                       int *argmax)
{
    int ho = h / 2, wo = w / 2;
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)planes * ho * wo)
        return;
    int ox = (int)(o % wo), oy = (int)((o / wo) % ho), p = (int)(o / ((size_t)wo * ho));
    y[o] = pool_max(x, p, oy, ox, h, w, &argmax[o]);
}

/* Windows do not overlap, so each input element receives from at most one output. */
__global__ void maxpool_bwd_kernel(const float *dy, const int *argmax, size_t n_out, float *dx)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o < n_out)
        dx[argmax[o]] += dy[o];
}

/* One thread per row. result[2r] = loss bits, result[2r+1] = 1 if correct, 0 if not, -1 for a
 * label out of range. */
__global__ void softmax_xent_kernel(const float *logits, const int *labels, int rows,
                                        int classes, float *dlogits, int *result)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    int label = labels[r];
    if (label < 0 || label >= classes) {
        result[2 * r] = 0;
        result[2 * r + 1] = -1;
        return;
    }
    int pred;
    float *dz = dlogits ? dlogits + (size_t)r * classes : NULL;
    float loss = xent_row(logits + (size_t)r * classes, label, classes, 1.0f / (float)rows, dz,
                              &pred);
    result[2 * r] = __float_as_int(loss);
    result[2 * r + 1] = pred == label;
}

/* ============================================================================== launchers == */

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands. */
static ddp_status cuda_gemm(const ops_handle *ops, bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const float *a, const float *b, float beta, float *c)
{
    cuda_state *cu = cuda_of(ops);
    if (m < 0 || n < 0 || k < 0)
        return DDP_ERR_INVALID_ARG;
    if (m == 0 || n == 0)
        return DDP_OK;
    int lda = trans_a ? m : k;
    int ldb = trans_b ? k : n;
    TRY_CUBLAS(cublasSgemm(cu->cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                           ldb > 0 ? ldb : 1, a, lda > 0 ? lda : 1, &beta, c, n));
    return DDP_OK;
}

static ddp_status cuda_bias_add(const ops_handle *ops, float *y, const float *bias, int rows,
                                int cols)
{
    cuda_state *cu = cuda_of(ops);
    if (rows <= 0 || cols <= 0) /* nothing to do, as on the CPU (a negative one would wrap n) */
        return DDP_OK;
    size_t n = (size_t)rows * cols;
    bias_add_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(y, bias, rows, cols);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_bias_grad(const ops_handle *ops, float *dbias, const float *dy, int rows,
                                 int cols)
{
    return cuda_colsum(ops, DDP_FP32, dbias, dy, rows, cols, true);
}

static ddp_status cuda_relu_fwd(const ops_handle *ops, float *y, const float *x, size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (n == 0)
        return DDP_OK;
    relu_fwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(y, x, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_relu_bwd(const ops_handle *ops, float *dx, const float *dy, const float *y,
                                size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (n == 0)
        return DDP_OK;
    relu_bwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(dx, dy, y, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_scale(const ops_handle *ops, ddp_dtype dt, void *x, size_t n, float alpha)
{
    cuda_state *cu = cuda_of(ops);
    if (n == 0)
        return DDP_OK;
    if (ops_dtype_size(ops, dt) == sizeof(float)) { /* fp32, and fp16's float storage */
        scale_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>((float *)x, n, alpha);
        TRY_CUDA_LAUNCH();
        return dt == DDP_FP16 ? cuda_round_fp16(ops, (float *)x, n) : DDP_OK;
    }
    scale_bf16_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>((uint16_t *)x, n, alpha);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_axpy(const ops_handle *ops, float *y, const float *x, size_t n, float alpha)
{
    cuda_state *cu = cuda_of(ops);
    if (n == 0)
        return DDP_OK;
    axpy_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(y, x, n, alpha);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_sgd_step(const ops_handle *ops, float *w, float *m, const float *g,
                                size_t n, float lr, float momentum, float weight_decay)
{
    cuda_state *cu = cuda_of(ops);
    if (n == 0)
        return DDP_OK;
    sgd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(w, m, g, n, lr, momentum,
                                                                 weight_decay);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* bf16 in one launch (sgd_bf16_kernel); fp16 (emulated, float storage) casts after. */
static ddp_status cuda_sgd_step_cast(const ops_handle *ops, float *w, float *m, const float *g,
                                     size_t n, float lr, float momentum, float weight_decay,
                                     ddp_dtype p, void *wc)
{
    cuda_state *cu = cuda_of(ops);
    if (p != DDP_BF16) {
        TRY_OK(cuda_sgd_step(ops, w, m, g, n, lr, momentum, weight_decay));
        return p == DDP_FP32 ? DDP_OK : ops->cast(ops, p, wc, DDP_FP32, w, n);
    }
    if (n == 0)
        return DDP_OK;
    sgd_bf16_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(w, m, g, n, lr, momentum,
                                                                      weight_decay, (uint16_t *)wc);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_im2col(const ops_handle *ops, const float *im, int c, int h, int w, int k,
                              int pad, float *col)
{
    cuda_state *cu = cuda_of(ops);
    int h_out = conv_out(h, k, pad), w_out = conv_out(w, k, pad);
    if (k < 1 || pad < 0 || h_out < 1 || w_out < 1)
        return DDP_ERR_INVALID_ARG;
    if (c <= 0)
        return DDP_OK;
    size_t n = (size_t)c * k * k * h_out * w_out;
    im2col_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(im, c, h, w, k, pad, col);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_col2im(const ops_handle *ops, const float *col, int c, int h, int w, int k,
                              int pad, float *im)
{
    cuda_state *cu = cuda_of(ops);
    if (k < 1 || pad < 0 || conv_out(h, k, pad) < 1 || conv_out(w, k, pad) < 1)
        return DDP_ERR_INVALID_ARG;
    if (c <= 0 || h <= 0 || w <= 0)
        return DDP_OK;
    size_t n = (size_t)c * h * w;
    col2im_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(col, c, h, w, k, pad, im);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_maxpool_fwd(const ops_handle *ops, const float *x, int planes, int h, int w,
                                   float *y, int *argmax)
{
    cuda_state *cu = cuda_of(ops);
    /* argmax holds int input indices, as on the CPU */
    if (h % 2 || w % 2 || (size_t)planes * h * w > INT_MAX)
        return DDP_ERR_INVALID_ARG;
    size_t n_out = (size_t)planes * (h / 2) * (w / 2);
    if (n_out == 0)
        return DDP_OK;
    maxpool_fwd_kernel<<<grid_blocks(n_out), block_threads, 0, cu->stream>>>(x, planes, h, w, y,
                                                                             argmax);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_maxpool_bwd(const ops_handle *ops, const float *dy, const int *argmax,
                                   int planes, int h, int w, float *dx)
{
    cuda_state *cu = cuda_of(ops);
    if (planes <= 0 || h < 2 || w < 2)
        return DDP_OK;
    size_t n_out = (size_t)planes * (h / 2) * (w / 2);
    maxpool_bwd_kernel<<<grid_blocks(n_out), block_threads, 0, cu->stream>>>(dy, argmax, n_out, dx);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* The per-row results of the softmax_xent kernel: (rows, 2) ints. */
static ddp_status xent_scratch(const ops_handle *ops, int rows, int **out)
{
    void *p = NULL;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_XENT, 2 * (size_t)rows * sizeof(int), &p));
    *out = (int *)p;
    return DDP_OK;
}

/* Sums the per-row results of the softmax_xent kernel on the host. */
static ddp_status xent_reduce(const int *result, int rows, float *loss_host, int *correct_host)
{
    double loss = 0.0;
    int correct = 0;
    for (int r = 0; r < rows; r++) {
        if (result[2 * r + 1] < 0) {
            DDP_ERROR("softmax_xent: label of row %d outside [0, classes)", r);
            return DDP_ERR_INVALID_ARG;
        }
        float l;
        memcpy(&l, &result[2 * r], sizeof l);
        loss += l;
        correct += result[2 * r + 1];
    }
    if (loss_host)
        *loss_host = (float)(loss / rows);
    if (correct_host)
        *correct_host = correct;
    return DDP_OK;
}

static ddp_status cuda_softmax_xent(const ops_handle *ops, const float *logits, const int *labels,
                                    int rows, int classes, float *dlogits, float *loss_host,
                                    int *correct_host)
{
    cuda_state *cu = cuda_of(ops);
    if (rows < 1 || classes < 1)
        return DDP_ERR_INVALID_ARG;
    int *scratch = NULL;
    ddp_status st = xent_scratch(ops, rows, &scratch);
    if (st != DDP_OK)
        return st;
    softmax_xent_kernel<<<grid_blocks((size_t)rows), block_threads, 0, cu->stream>>>(
        logits, labels, rows, classes, dlogits, scratch);
    TRY_CUDA_LAUNCH();
    int *result = (int *)malloc(2 * (size_t)rows * sizeof(int)); // (rows, 2)
    if (!result)
        return DDP_ERR_NOMEM;
    st = ddp_download(ops->ctx, result, scratch, 2 * (size_t)rows * sizeof(int));
    if (st == DDP_OK)
        st = xent_reduce(result, rows, loss_host, correct_host);
    free(result);
    return st;
}

/* ---- softmax cross-entropy for training: the loss stays on the device ----------------------- */

/* One block: *acc += mean over rows of the per-row losses of softmax_xent_kernel (a fixed
 * summation order, so the result is reproducible); NaN when a label was out of range. */
__global__ void xent_acc_kernel(const int *result, int rows, float *acc)
{
    __shared__ double part[256];
    __shared__ int bad[256];
    double s = 0.0;
    int b = 0;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        s += __int_as_float(result[2 * r]);
        b |= result[2 * r + 1] < 0;
    }
    part[threadIdx.x] = s;
    bad[threadIdx.x] = b;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) {
            part[threadIdx.x] += part[threadIdx.x + half];
            bad[threadIdx.x] |= bad[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *acc += bad[0] ? __int_as_float(0x7fc00000) : (float)(part[0] / rows);
}

static ddp_status cuda_softmax_xent_acc(const ops_handle *ops, const float *logits,
                                        const int *labels, int rows, int classes, float *dlogits,
                                        float *loss_acc)
{
    cuda_state *cu = cuda_of(ops);
    if (rows < 1 || classes < 1)
        return DDP_ERR_INVALID_ARG;
    int *scratch = NULL;
    TRY_OK(xent_scratch(ops, rows, &scratch));
    softmax_xent_kernel<<<grid_blocks((size_t)rows), block_threads, 0, cu->stream>>>(
        logits, labels, rows, classes, dlogits, scratch);
    TRY_CUDA_LAUNCH();
    xent_acc_kernel<<<1, 256, 0, cu->stream>>>(scratch, rows, loss_acc);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ==================================================================== table and lifecycle == */

static ops_handle make_cuda_table(void)
{
    ops_handle ops = {};
    ops.name = "cuda";
    ops.gemm = cuda_gemm;
    ops.bias_add = cuda_bias_add;
    ops.bias_grad = cuda_bias_grad;
    ops.relu_fwd = cuda_relu_fwd;
    ops.relu_bwd = cuda_relu_bwd;
    ops.scale = cuda_scale;
    ops.axpy = cuda_axpy;
    ops.sgd_step = cuda_sgd_step;
    ops.sgd_step_cast = cuda_sgd_step_cast;
    ops.im2col = cuda_im2col;
    ops.col2im = cuda_col2im;
    ops.maxpool_fwd = cuda_maxpool_fwd;
    ops.maxpool_bwd = cuda_maxpool_bwd;
    ops.softmax_xent = cuda_softmax_xent;
    ops.softmax_xent_acc = cuda_softmax_xent_acc;
    cuda_layer_ops(&ops);
    cuda_gpt_ops(&ops);
#if HAVE_CUDNN
    cudnn_conv_ops(&ops);
#endif
    return ops;
}

static const ops_handle cuda_table = make_cuda_table();

/* Whether ops is a CUDA handle. */
static bool is_cuda(const ops_handle *ops) { return ops && ops->gemm == cuda_table.gemm; }

/* cuBLAS's math mode for fp32 GEMMs: TF32 tensor cores with --tf32, else exact fp32 (cuBLAS's
 * default math does not down-convert fp32 inputs). */
static ddp_status cublas_math(cuda_state *cu)
{
    TRY_CUBLAS(cublasSetMathMode(cu->cublas, cu->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                          : CUBLAS_DEFAULT_MATH));
    return DDP_OK;
}

extern "C" const char *ops_cuda_describe(const ops_handle *ops, ddp_dtype p)
{
    int cublas_version = 0;
    if (!is_cuda(ops))
        return "";
    cuda_state *cu = cuda_of(ops);
    if (cublasGetVersion(cu->cublas, &cublas_version) != CUBLAS_STATUS_SUCCESS)
        return "";
    static const char *const gemm[] = {"cublasSgemm",
                                       "cublasGemmEx bf16 (fp32 accumulation; cuBLASLt with the "
                                       "bias epilogue for fp32 outputs)",
                                       "cublasGemmEx on half-rounded floats"};
    const char *math = p == DDP_FP32 ? (cu->tf32 ? ", TF32" : ", exact fp32")
                                     : p == DDP_FP16 && cuda_ampere(cu) ? ", TF32" : "";
#if HAVE_CUDNN
    char conv[32];
    snprintf(conv, sizeof conv, "cuDNN %zu", cudnn_version());
#else
    const char *conv = "im2col + cuBLAS (no cuDNN in this build)";
#endif
    const char *attention = p != DDP_BF16         ? ""
                            : cu->cudnn_attention ? "; attention cuDNN's fused (bf16 activations)"
                            : cu->flash           ? "; attention the fused kernel"
                                                  : "; attention materialised";
    snprintf(cu->text, sizeof cu->text,
             "cuBLAS %d, %s%s; convolutions %s%s; compute capability %d.%d", cublas_version,
             gemm[p], math, conv, attention, cu->cc_major, cu->cc_minor);
    return cu->text;
}

extern "C" ddp_status ops_cuda_set_tf32(ops_handle *ops, bool on)
{
    if (!is_cuda(ops))
        return DDP_OK;
    cuda_of(ops)->tf32 = on;
    return cublas_math(cuda_of(ops));
}

extern "C" ddp_status ops_cuda_set_attention(ops_handle *ops, bool flash)
{
    if (!ops)
        return DDP_ERR_INVALID_ARG;
    if (is_cuda(ops))
        cuda_of(ops)->flash = flash;
    return DDP_OK;
}

extern "C" ddp_status ops_cuda_set_attention_cudnn(ops_handle *ops, bool on)
{
    if (!ops)
        return DDP_ERR_INVALID_ARG;
    if (!is_cuda(ops))
        return DDP_OK;
    if (on && !HAVE_CUDNN) {
        DDP_ERROR("cuDNN attention: this build has no cuDNN (meson -Dcudnn=enabled with cuDNN 9 "
                  "installed)");
        return DDP_ERR_UNSUPPORTED;
    }
#if HAVE_CUDNN
    if (on && !cudnn_attention_usable())
        return DDP_ERR_UNSUPPORTED; /* the handle keeps its attention */
#endif
    cuda_of(ops)->cudnn_attention = on;
    if (on)
        cuda_of(ops)->flash = true; /* the same state as the fused kernel's (o and stats) */
    return DDP_OK;
}

/* The attention path from DDP_CUDA_ATTENTION (unset or empty: flash); DDP_ERR_INVALID_ARG
 * (logged) for another value. */
static ddp_status attention_from_env(cuda_state *cu)
{
    const char *v = getenv("DDP_CUDA_ATTENTION");
    if (!v || !*v || !strcmp(v, "flash")) {
        cu->flash = true;
        return DDP_OK;
    }
    if (!strcmp(v, "materialized")) {
        cu->flash = false;
        return DDP_OK;
    }
    if (!strcmp(v, "cudnn") && HAVE_CUDNN) {
        cu->flash = true;
#if HAVE_CUDNN
        cu->cudnn_attention = cudnn_attention_usable(); /* else the fused kernel, said */
#endif
        return DDP_OK;
    }
    DDP_ERROR(
        "DDP_CUDA_ATTENTION=%s: use flash (the fused kernel, the default), materialized "
        "(the reference path over the T x T scores)%s",
        v, HAVE_CUDNN ? " or cudnn (cuDNN's fused attention)" : "; cudnn needs a build with cuDNN");
    return DDP_ERR_INVALID_ARG;
}

/* The switches of this backend's kernels (switches.h). */
static void read_switches(cuda_state *cu)
{
    cu->lt_bias16 = ops_switch_on(OPS_SW_LT_BIAS16);
    cu->ln_bwd_fused = ops_switch_on(OPS_SW_LN_BWD_FUSED);
    cu->enc_seg = ops_switch_on(OPS_SW_ENC_SEG);
    cu->flash_bf16_out = ops_switch_on(OPS_SW_FLASH_BF16OUT);
    cu->cudnn_det = ops_switch_on(OPS_SW_CUDNN_DET);
}

/* Creates the cuBLAS (and cuDNN) handles on libddp's stream and the current device; reads its
 * compute capability. */
static ddp_status open_handles(ops_handle *ops)
{
    cuda_state *cu = cuda_of(ops);
    int dev = 0;
    TRY_CUDA(cudaGetDevice(&dev));
    TRY_CUDA(cudaDeviceGetAttribute(&cu->cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    TRY_CUDA(cudaDeviceGetAttribute(&cu->cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    cu->lim = cuda_read_limits(dev, cu->cc_major, cu->cc_minor);
    TRY_CUBLAS(cublasCreate(&cu->cublas));
    TRY_CUBLAS(cublasSetStream(cu->cublas, cu->stream));
    TRY_OK(cublas_math(cu));
    TRY_OK(cuda_lt_open(ops));
#if HAVE_CUDNN
    TRY_OK(cudnn_open(ops));
#endif
    return DDP_OK;
}

/* Releases a CUDA handle (ops_close, after ddp_synchronize). */
static void cuda_release(ops_handle *ops)
{
    cuda_state *cu = cuda_of(ops);
#if HAVE_CUDNN
    cudnn_close(ops);
#endif
    cuda_lt_close(ops);
    scratch_release(ops);
    if (cu->cublas)
        LOG_CUBLAS(cublasDestroy(cu->cublas));
    free(cu);
    free(ops);
}

extern "C" ddp_status ops_cuda_open(ddp_ctx *ctx, bool im2col, ops_handle **out)
{
    *out = NULL;
    if (!ctx || ddp_backend(ctx) != DDP_BACKEND_CUDA) {
        DDP_ERROR("ops_cuda_open: the context's backend is not cuda");
        return DDP_ERR_INVALID_ARG;
    }
    ops_handle *ops = (ops_handle *)malloc(sizeof *ops);
    cuda_state *cu = (cuda_state *)calloc(1, sizeof *cu);
    if (!ops || !cu) {
        free(ops), free(cu);
        return DDP_ERR_NOMEM;
    }
    *ops = cuda_table;
    if (im2col) {
        ops->name = "cuda-im2col";
        ops->conv_fwd = NULL;
        ops->conv_bwd_params = NULL;
        ops->conv_bwd_input = NULL;
    }
    ops->ctx = ctx;
    ops->state = cu;
    ops->release = cuda_release;
    cu->stream = (cudaStream_t)ddp_backend_stream(ctx);
    read_switches(cu);
    ops_switches_apply(ops);
    ddp_status st = ops_switches_check();
    if (st == DDP_OK)
        st = attention_from_env(cu);
    if (st == DDP_OK)
        st = open_handles(ops);
    if (st != DDP_OK) {
        cuda_release(ops);
        return st;
    }
    *out = ops;
    return DDP_OK;
}

extern "C" const char *ops_cuda_device_name(const ops_handle *ops)
{
    static char name[256]; /* one device per process: ddp gives each rank its own */
    int dev = 0;
    cudaDeviceProp prop;
    if (!is_cuda(ops) || cudaGetDevice(&dev) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return "";
    snprintf(name, sizeof name, "%s", prop.name);
    return name;
}
