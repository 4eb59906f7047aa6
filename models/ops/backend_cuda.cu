/* backend_cuda.cu - the CUDA ops table: device memory, cuBLAS sgemm (row-major through the
 * transpose identity), kernels for the fp32 primitives over the scalar math of math_shared.h, and
 * the backend's lifecycle. The precision-aware layer ops are in cuda_layers.cu (cuBLAS GEMMs in
 * fp32, bf16 and emulated fp16, casts, ReLU, max-pool) and cuda_cudnn.cu (cuDNN convolutions).
 *
 * One backend per process: ddp_cuda_backend_open() makes a device current and creates the cuBLAS
 * (and cuDNN) handles on the stream every op runs on (libddp's, so collectives follow the
 * compute). The file has two sections: kernels, then launchers; every launcher runs on the
 * backend stream and ends with a cudaGetLastError check.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_private.h"
#include "math_shared.h"

/* ---- state and checks -------------------------------------------------------------------- */

ddp_cuda_state ddp_cu = {NULL, NULL, -1, 0, 0, false};
static bool ddp_owns_stream;                    // the stream was created here (no caller stream)
static void *ddp_scratch_buf[DDP_SCRATCH_SLOTS]; // device scratch, one buffer per slot
static size_t ddp_scratch_bytes[DDP_SCRATCH_SLOTS];

ddp_status ddp_cuda_fail(cudaError_t err, const char *what, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s: %s (%s)", what, cudaGetErrorString(err),
                  cudaGetErrorName(err));
    return DDP_ERR_CUDA;
}

ddp_status ddp_cublas_fail(cublasStatus_t st, const char *what, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s: %s (%d)", what, cublasGetStatusString(st),
                  (int)st);
    return DDP_ERR_BLAS;
}

ddp_status ddp_cuda_scratch(int slot, size_t n_bytes, void **out)
{
    if (n_bytes > ddp_scratch_bytes[slot]) {
        void *old = ddp_scratch_buf[slot]; /* forgotten first: never freed twice */
        ddp_scratch_buf[slot] = NULL;
        ddp_scratch_bytes[slot] = 0;
        if (old) {
            DDP_CUDA_TRY(cudaStreamSynchronize(ddp_cu.stream));
            DDP_CUDA_TRY(cudaFree(old));
        }
        DDP_CUDA_TRY(cudaMalloc(&ddp_scratch_buf[slot], n_bytes));
        ddp_scratch_bytes[slot] = n_bytes;
    }
    *out = ddp_scratch_buf[slot];
    return DDP_OK;
}

static void ddp_scratch_release(void)
{
    for (int i = 0; i < DDP_SCRATCH_SLOTS; i++) {
        if (ddp_scratch_buf[i])
            DDP_CUDA_LOG(cudaFree(ddp_scratch_buf[i]));
        ddp_scratch_buf[i] = NULL;
        ddp_scratch_bytes[i] = 0;
    }
}

/* ================================================================================ kernels == */

__global__ void ddp_bias_add_kernel(float *y, const float *bias, int rows, int cols)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * cols)
        y[i] += bias[i % cols];
}

/* One thread per column: sums the column over the rows. */
__global__ void ddp_bias_grad_kernel(float *dbias, const float *dy, int rows, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++)
        s += dy[(size_t)r * cols + c];
    dbias[c] += s;
}

__global__ void ddp_relu_fwd_kernel(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = ddp_relu(x[i]);
}

__global__ void ddp_relu_bwd_kernel(float *dx, const float *dy, const float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dx[i] = ddp_relu_grad(dy[i], y[i]);
}

__global__ void ddp_scale_kernel(float *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= alpha;
}

__global__ void ddp_axpy_kernel(float *y, const float *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += alpha * x[i];
}

__global__ void ddp_sgd_kernel(float *w, float *m, const float *g, size_t n, float lr,
                               float momentum, float weight_decay)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        w[i] = ddp_sgd_update(w[i], &m[i], g[i], lr, momentum, weight_decay);
}

/* One thread per col element; col is (c*k*k, h_out*w_out). */
__global__ void ddp_im2col_kernel(const float *im, int c, int h, int w, int k, int pad, float *col)
{
    int h_out = ddp_conv_out(h, k, pad), w_out = ddp_conv_out(w, k, pad);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t hw = (size_t)h_out * w_out;
    if (i >= (size_t)c * k * k * hw)
        return;
    int row = (int)(i / hw), pos = (int)(i % hw);
    int ci, ky, kx;
    ddp_im2col_row_split(row, k, &ci, &ky, &kx);
    ptrdiff_t src = ddp_im2col_src(h, w, pad, ci, ky, kx, pos / w_out, pos % w_out);
    col[i] = src < 0 ? 0.0f : im[src];
}

/* One thread per image element (C,H,W): gathers its col entries, so no atomics are needed. */
__global__ void ddp_col2im_kernel(const float *col, int c, int h, int w, int k, int pad, float *im)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)c * h * w)
        return;
    int x = (int)(i % w), y = (int)((i / w) % h), ci = (int)(i / ((size_t)w * h));
    im[i] += ddp_col2im_gather(col, h, w, k, pad, ci, y, x);
}

__global__ void ddp_maxpool_fwd_kernel(const float *x, int planes, int h, int w, float *y,
                                       int *argmax)
{
    int ho = h / 2, wo = w / 2;
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)planes * ho * wo)
        return;
    int ox = (int)(o % wo), oy = (int)((o / wo) % ho), p = (int)(o / ((size_t)wo * ho));
    y[o] = ddp_pool_max(x, p, oy, ox, h, w, &argmax[o]);
}

/* Windows do not overlap, so each input element receives from at most one output. */
__global__ void ddp_maxpool_bwd_kernel(const float *dy, const int *argmax, size_t n_out, float *dx)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o < n_out)
        dx[argmax[o]] += dy[o];
}

/* One thread per row. result[2r] = loss bits, result[2r+1] = 1 if correct, 0 if not, -1 for a
 * label out of range. */
__global__ void ddp_softmax_xent_kernel(const float *logits, const int *labels, int rows,
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
    float loss = ddp_xent_row(logits + (size_t)r * classes, label, classes, 1.0f / (float)rows, dz,
                              &pred);
    result[2 * r] = __float_as_int(loss);
    result[2 * r + 1] = pred == label;
}

/* ============================================================================== launchers == */

static void *cuda_alloc(size_t n_bytes)
{
    void *p = NULL;
    size_t n = n_bytes ? n_bytes : 1;
    cudaError_t err = cudaMalloc(&p, n);
    if (err != cudaSuccess) {
        ddp_cuda_fail(err, "cudaMalloc", __FILE__, __LINE__);
        return NULL;
    }
    err = cudaMemsetAsync(p, 0, n, ddp_cu.stream);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(ddp_cu.stream);
    if (err != cudaSuccess) {
        ddp_cuda_fail(err, "cudaMemsetAsync", __FILE__, __LINE__);
        DDP_CUDA_LOG(cudaFree(p));
        return NULL;
    }
    return p;
}

static void cuda_free(void *p)
{
    if (!p)
        return;
    cudaError_t err = cudaFree(p);
    if (err != cudaSuccess)
        ddp_cuda_fail(err, "cudaFree", __FILE__, __LINE__);
}

static ddp_status cuda_upload(void *dst, const void *src_host, size_t n_bytes)
{
    DDP_CUDA_TRY(cudaMemcpyAsync(dst, src_host, n_bytes, cudaMemcpyHostToDevice, ddp_cu.stream));
    DDP_CUDA_TRY(cudaStreamSynchronize(ddp_cu.stream));
    return DDP_OK;
}

static ddp_status cuda_download(void *dst_host, const void *src, size_t n_bytes)
{
    DDP_CUDA_TRY(cudaMemcpyAsync(dst_host, src, n_bytes, cudaMemcpyDeviceToHost, ddp_cu.stream));
    DDP_CUDA_TRY(cudaStreamSynchronize(ddp_cu.stream));
    return DDP_OK;
}

static ddp_status cuda_copy(void *dst, const void *src, size_t n_bytes)
{
    DDP_CUDA_TRY(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, ddp_cu.stream));
    return DDP_OK;
}

static ddp_status cuda_zero(void *dst, size_t n_bytes)
{
    DDP_CUDA_TRY(cudaMemsetAsync(dst, 0, n_bytes, ddp_cu.stream));
    return DDP_OK;
}

static ddp_status cuda_sync(void)
{
    DDP_CUDA_TRY(cudaStreamSynchronize(ddp_cu.stream));
    return DDP_OK;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands. */
static ddp_status cuda_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float *a, const float *b, float beta, float *c)
{
    if (m < 0 || n < 0 || k < 0)
        return DDP_ERR_INVALID_ARG;
    if (m == 0 || n == 0)
        return DDP_OK;
    int lda = trans_a ? m : k;
    int ldb = trans_b ? k : n;
    DDP_CUBLAS_TRY(cublasSgemm(ddp_cu.cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                               ldb > 0 ? ldb : 1, a, lda > 0 ? lda : 1, &beta, c, n));
    return DDP_OK;
}

static ddp_status cuda_bias_add(float *y, const float *bias, int rows, int cols)
{
    if (rows <= 0 || cols <= 0) /* nothing to do, as on the CPU (a negative one would wrap n) */
        return DDP_OK;
    size_t n = (size_t)rows * cols;
    ddp_bias_add_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(y, bias, rows, cols);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_bias_grad(float *dbias, const float *dy, int rows, int cols)
{
    if (cols <= 0)
        return DDP_OK;
    ddp_bias_grad_kernel<<<ddp_grid((size_t)cols), ddp_block, 0, ddp_cu.stream>>>(dbias, dy, rows,
                                                                                cols);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_relu_fwd(float *y, const float *x, size_t n)
{
    if (n == 0)
        return DDP_OK;
    ddp_relu_fwd_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(y, x, n);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    if (n == 0)
        return DDP_OK;
    ddp_relu_bwd_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(dx, dy, y, n);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_scale(float *x, size_t n, float alpha)
{
    if (n == 0)
        return DDP_OK;
    ddp_scale_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(x, n, alpha);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_axpy(float *y, const float *x, size_t n, float alpha)
{
    if (n == 0)
        return DDP_OK;
    ddp_axpy_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(y, x, n, alpha);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_sgd_step(float *w, float *m, const float *g, size_t n, float lr,
                                float momentum, float weight_decay)
{
    if (n == 0)
        return DDP_OK;
    ddp_sgd_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(w, m, g, n, lr, momentum,
                                                              weight_decay);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_im2col(const float *im, int c, int h, int w, int k, int pad, float *col)
{
    int h_out = ddp_conv_out(h, k, pad), w_out = ddp_conv_out(w, k, pad);
    if (k < 1 || pad < 0 || h_out < 1 || w_out < 1)
        return DDP_ERR_INVALID_ARG;
    if (c <= 0)
        return DDP_OK;
    size_t n = (size_t)c * k * k * h_out * w_out;
    ddp_im2col_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(im, c, h, w, k, pad, col);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_col2im(const float *col, int c, int h, int w, int k, int pad, float *im)
{
    if (k < 1 || pad < 0 || ddp_conv_out(h, k, pad) < 1 || ddp_conv_out(w, k, pad) < 1)
        return DDP_ERR_INVALID_ARG;
    if (c <= 0 || h <= 0 || w <= 0)
        return DDP_OK;
    size_t n = (size_t)c * h * w;
    ddp_col2im_kernel<<<ddp_grid(n), ddp_block, 0, ddp_cu.stream>>>(col, c, h, w, k, pad, im);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_maxpool_fwd(const float *x, int planes, int h, int w, float *y, int *argmax)
{
    /* argmax holds int input indices, as on the CPU */
    if (h % 2 || w % 2 || (size_t)planes * h * w > INT_MAX)
        return DDP_ERR_INVALID_ARG;
    size_t n_out = (size_t)planes * (h / 2) * (w / 2);
    if (n_out == 0)
        return DDP_OK;
    ddp_maxpool_fwd_kernel<<<ddp_grid(n_out), ddp_block, 0, ddp_cu.stream>>>(x, planes, h, w, y,
                                                                          argmax);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

static ddp_status cuda_maxpool_bwd(const float *dy, const int *argmax, int planes, int h, int w,
                                   float *dx)
{
    if (planes <= 0 || h < 2 || w < 2)
        return DDP_OK;
    size_t n_out = (size_t)planes * (h / 2) * (w / 2);
    ddp_maxpool_bwd_kernel<<<ddp_grid(n_out), ddp_block, 0, ddp_cu.stream>>>(dy, argmax, n_out, dx);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

/* The per-row results of the softmax_xent kernel: (rows, 2) ints. */
static ddp_status ddp_xent_scratch(int rows, int **out)
{
    void *p = NULL;
    DDP_TRY_(ddp_cuda_scratch(DDP_SCRATCH_XENT, 2 * (size_t)rows * sizeof(int), &p));
    *out = (int *)p;
    return DDP_OK;
}

/* Sums the per-row results of the softmax_xent kernel on the host. */
static ddp_status ddp_xent_reduce(const int *result, int rows, float *loss_host, int *correct_host)
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

static ddp_status cuda_softmax_xent(const float *logits, const int *labels, int rows, int classes,
                                    float *dlogits, float *loss_host, int *correct_host)
{
    if (rows < 1 || classes < 1)
        return DDP_ERR_INVALID_ARG;
    int *scratch = NULL;
    ddp_status st = ddp_xent_scratch(rows, &scratch);
    if (st != DDP_OK)
        return st;
    ddp_softmax_xent_kernel<<<ddp_grid((size_t)rows), ddp_block, 0, ddp_cu.stream>>>(
        logits, labels, rows, classes, dlogits, scratch);
    DDP_CUDA_LAUNCHED();
    int *result = (int *)malloc(2 * (size_t)rows * sizeof(int)); // (rows, 2)
    if (!result)
        return DDP_ERR_NOMEM;
    st = cuda_download(result, scratch, 2 * (size_t)rows * sizeof(int));
    if (st == DDP_OK)
        st = ddp_xent_reduce(result, rows, loss_host, correct_host);
    free(result);
    return st;
}

/* ---- softmax cross-entropy for training: the loss stays on the device ----------------------- */

/* One block: *acc += mean over rows of the per-row losses of ddp_softmax_xent_kernel (a fixed
 * summation order, so the result is reproducible); NaN when a label was out of range. */
__global__ void ddp_xent_acc_kernel(const int *result, int rows, float *acc)
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

static ddp_status cuda_softmax_xent_acc(const float *logits, const int *labels, int rows,
                                        int classes, float *dlogits, float *loss_acc)
{
    if (rows < 1 || classes < 1)
        return DDP_ERR_INVALID_ARG;
    int *scratch = NULL;
    DDP_TRY_(ddp_xent_scratch(rows, &scratch));
    ddp_softmax_xent_kernel<<<ddp_grid((size_t)rows), ddp_block, 0, ddp_cu.stream>>>(
        logits, labels, rows, classes, dlogits, scratch);
    DDP_CUDA_LAUNCHED();
    ddp_xent_acc_kernel<<<1, 256, 0, ddp_cu.stream>>>(scratch, rows, loss_acc);
    DDP_CUDA_LAUNCHED();
    return DDP_OK;
}

/* ---- double-buffered batch uploads: a copy stream beside the compute stream ------------------ */

typedef struct ddp_batch_slot {
    void *pinned[2];         // (pinned_bytes[part]) host staging, cudaHostAlloc'd
    size_t pinned_bytes[2];
    cudaEvent_t copied[2];   // recorded on the copy stream after part's upload
    cudaEvent_t released;    // recorded on the compute stream after the slot's last reader
    bool copied_set[2], released_set; // the events were recorded (waits on them are due)
} ddp_batch_slot;

static cudaStream_t ddp_copy_stream;
static ddp_batch_slot ddp_slots[2];

static ddp_status ddp_batch_open(void)
{
    DDP_CUDA_TRY(cudaStreamCreateWithFlags(&ddp_copy_stream, cudaStreamNonBlocking));
    for (ddp_batch_slot &s : ddp_slots) {
        DDP_CUDA_TRY(cudaEventCreateWithFlags(&s.copied[0], cudaEventDisableTiming));
        DDP_CUDA_TRY(cudaEventCreateWithFlags(&s.copied[1], cudaEventDisableTiming));
        DDP_CUDA_TRY(cudaEventCreateWithFlags(&s.released, cudaEventDisableTiming));
    }
    return DDP_OK;
}

static void ddp_batch_close(void)
{
    if (ddp_copy_stream)
        DDP_CUDA_LOG(cudaStreamSynchronize(ddp_copy_stream));
    for (ddp_batch_slot &s : ddp_slots) {
        for (int part = 0; part < 2; part++) {
            if (s.pinned[part])
                DDP_CUDA_LOG(cudaFreeHost(s.pinned[part]));
            if (s.copied[part])
                DDP_CUDA_LOG(cudaEventDestroy(s.copied[part]));
        }
        if (s.released)
            DDP_CUDA_LOG(cudaEventDestroy(s.released));
        s = ddp_batch_slot{};
    }
    if (ddp_copy_stream)
        DDP_CUDA_LOG(cudaStreamDestroy(ddp_copy_stream));
    ddp_copy_stream = NULL;
}

/* The staging buffer of (slot, part), free of its previous upload and holding n_bytes. */
static ddp_status ddp_batch_staging(ddp_batch_slot *s, int part, size_t n_bytes, void **out)
{
    if (s->copied_set[part])
        DDP_CUDA_TRY(cudaEventSynchronize(s->copied[part]));
    if (n_bytes > s->pinned_bytes[part]) {
        void *old = s->pinned[part]; /* forgotten first: never freed twice */
        s->pinned[part] = NULL;
        s->pinned_bytes[part] = 0;
        if (old)
            DDP_CUDA_TRY(cudaFreeHost(old));
        DDP_CUDA_TRY(cudaHostAlloc(&s->pinned[part], n_bytes, cudaHostAllocDefault));
        s->pinned_bytes[part] = n_bytes;
    }
    *out = s->pinned[part];
    return DDP_OK;
}

static ddp_status cuda_batch_upload(int slot, int part, void *dst, const void *src_host,
                                    size_t n_bytes)
{
    if (slot < 0 || slot > 1 || part < 0 || part > 1 || !ddp_copy_stream)
        return DDP_ERR_INVALID_ARG;
    if (n_bytes == 0)
        return DDP_OK;
    ddp_batch_slot *s = &ddp_slots[slot];
    void *pinned = NULL;
    DDP_TRY_(ddp_batch_staging(s, part, n_bytes, &pinned));
    memcpy(pinned, src_host, n_bytes);
    if (s->released_set)
        DDP_CUDA_TRY(cudaStreamWaitEvent(ddp_copy_stream, s->released, 0));
    DDP_CUDA_TRY(cudaMemcpyAsync(dst, pinned, n_bytes, cudaMemcpyHostToDevice, ddp_copy_stream));
    DDP_CUDA_TRY(cudaEventRecord(s->copied[part], ddp_copy_stream));
    s->copied_set[part] = true;
    return DDP_OK;
}

static ddp_status cuda_batch_acquire(int slot)
{
    if (slot < 0 || slot > 1)
        return DDP_ERR_INVALID_ARG;
    for (int part = 0; part < 2; part++) {
        if (ddp_slots[slot].copied_set[part])
            DDP_CUDA_TRY(cudaStreamWaitEvent(ddp_cu.stream, ddp_slots[slot].copied[part], 0));
    }
    return DDP_OK;
}

static ddp_status cuda_batch_release(int slot)
{
    if (slot < 0 || slot > 1)
        return DDP_ERR_INVALID_ARG;
    DDP_CUDA_TRY(cudaEventRecord(ddp_slots[slot].released, ddp_cu.stream));
    ddp_slots[slot].released_set = true;
    return DDP_OK;
}

/* ==================================================================== table and lifecycle == */

static ddp_ops ddp_make_cuda_ops(void)
{
    ddp_ops ops = {};
    ops.name = "cuda";
    ops.alloc = cuda_alloc;
    ops.free = cuda_free;
    ops.upload = cuda_upload;
    ops.download = cuda_download;
    ops.copy = cuda_copy;
    ops.zero = cuda_zero;
    ops.sync = cuda_sync;
    ops.gemm = cuda_gemm;
    ops.bias_add = cuda_bias_add;
    ops.bias_grad = cuda_bias_grad;
    ops.relu_fwd = cuda_relu_fwd;
    ops.relu_bwd = cuda_relu_bwd;
    ops.scale = cuda_scale;
    ops.axpy = cuda_axpy;
    ops.sgd_step = cuda_sgd_step;
    ops.im2col = cuda_im2col;
    ops.col2im = cuda_col2im;
    ops.maxpool_fwd = cuda_maxpool_fwd;
    ops.maxpool_bwd = cuda_maxpool_bwd;
    ops.softmax_xent = cuda_softmax_xent;
    ops.softmax_xent_acc = cuda_softmax_xent_acc;
    ops.batch_upload = cuda_batch_upload;
    ops.batch_acquire = cuda_batch_acquire;
    ops.batch_release = cuda_batch_release;
    ddp_cuda_layer_ops(&ops);
#if HAVE_CUDNN
    ddp_cudnn_conv_ops(&ops);
#endif
    return ops;
}

static const ddp_ops ddp_cuda_table = ddp_make_cuda_ops();

extern "C" const ddp_ops *ddp_cuda_ops(void) { return &ddp_cuda_table; }

static ddp_ops ddp_make_cuda_im2col_ops(void)
{
    ddp_ops ops = ddp_make_cuda_ops();
    ops.name = "cuda-im2col";
    ops.conv_fwd = NULL;
    ops.conv_bwd_params = NULL;
    ops.conv_bwd_input = NULL;
    return ops;
}

static const ddp_ops ddp_cuda_im2col_table = ddp_make_cuda_im2col_ops();

extern "C" const ddp_ops *ddp_cuda_ops_im2col(void) { return &ddp_cuda_im2col_table; }

/* cuBLAS's math mode for fp32 GEMMs: TF32 tensor cores with --tf32, else exact fp32 (cuBLAS's
 * default math does not down-convert fp32 inputs). */
static ddp_status ddp_cublas_math(void)
{
    DDP_CUBLAS_TRY(cublasSetMathMode(ddp_cu.cublas, ddp_cu.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                : CUBLAS_DEFAULT_MATH));
    return DDP_OK;
}

extern "C" const char *ddp_cuda_describe(ddp_dtype p)
{
    static char text[256];
    int cublas_version = 0;
    if (ddp_cu.device < 0 || cublasGetVersion(ddp_cu.cublas, &cublas_version) != CUBLAS_STATUS_SUCCESS)
        return "";
    static const char *const gemm[] = {"cublasSgemm", "cublasGemmEx bf16 (fp32 accumulation)",
                                       "cublasGemmEx on half-rounded floats"};
    const char *math = p == DDP_FP32 ? (ddp_cu.tf32 ? ", TF32" : ", exact fp32")
                                          : p == DDP_FP16 && ddp_cuda_ampere() ? ", TF32" : "";
#if HAVE_CUDNN
    char conv[32];
    snprintf(conv, sizeof conv, "cuDNN %zu", ddp_cudnn_version());
#else
    const char *conv = "im2col + cuBLAS (no cuDNN in this build)";
#endif
    snprintf(text, sizeof text, "cuBLAS %d, %s%s; convolutions %s; compute capability %d.%d",
             cublas_version, gemm[p], math, conv, ddp_cu.cc_major, ddp_cu.cc_minor);
    return text;
}

extern "C" ddp_status ddp_cuda_set_tf32(bool on)
{
    ddp_cu.tf32 = on;
    return ddp_cu.cublas ? ddp_cublas_math() : DDP_OK;
}

/* Creates the cuBLAS (and cuDNN) handles, and the stream when the caller gave none, on the
 * current device; reads its compute capability. */
static ddp_status ddp_cuda_open_handles(void *stream)
{
    ddp_cu.stream = (cudaStream_t)stream;
    ddp_owns_stream = stream == NULL;
    if (ddp_owns_stream)
        DDP_CUDA_TRY(cudaStreamCreateWithFlags(&ddp_cu.stream, cudaStreamNonBlocking));
    int dev = 0;
    DDP_CUDA_TRY(cudaGetDevice(&dev));
    DDP_CUDA_TRY(cudaDeviceGetAttribute(&ddp_cu.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    DDP_CUDA_TRY(cudaDeviceGetAttribute(&ddp_cu.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    DDP_CUBLAS_TRY(cublasCreate(&ddp_cu.cublas));
    DDP_CUBLAS_TRY(cublasSetStream(ddp_cu.cublas, ddp_cu.stream));
    DDP_TRY_(ddp_cublas_math());
    DDP_TRY_(ddp_batch_open());
#if HAVE_CUDNN
    DDP_TRY_(ddp_cudnn_open());
#endif
    return DDP_OK;
}

extern "C" ddp_status ddp_cuda_backend_open(int device, void *stream)
{
    int n = ddp_cuda_device_count();
    if (device < 0 || device >= n) {
        DDP_ERROR("CUDA device %d requested, %d usable here", device, n);
        return DDP_ERR_NO_DEVICE;
    }
    if (ddp_cu.device >= 0)
        ddp_cuda_backend_close();
    DDP_CUDA_TRY(cudaSetDevice(device));
    ddp_status st = ddp_cuda_open_handles(stream);
    if (st != DDP_OK) {
        ddp_cuda_backend_close();
        return st;
    }
    ddp_cu.device = device;
    return DDP_OK;
}

extern "C" void ddp_cuda_backend_close(void)
{
    if (ddp_cu.stream)
        DDP_CUDA_LOG(cudaStreamSynchronize(ddp_cu.stream));
#if HAVE_CUDNN
    ddp_cudnn_close();
#endif
    ddp_scratch_release();
    ddp_batch_close();
    if (ddp_cu.cublas)
        DDP_CUBLAS_LOG(cublasDestroy(ddp_cu.cublas));
    ddp_cu.cublas = NULL;
    if (ddp_cu.stream && ddp_owns_stream)
        DDP_CUDA_LOG(cudaStreamDestroy(ddp_cu.stream));
    ddp_cu.stream = NULL;
    ddp_owns_stream = false;
    ddp_cu.device = -1;
    ddp_cu.cc_major = ddp_cu.cc_minor = 0;
}
