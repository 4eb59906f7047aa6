/* cuda_layers.cu - the precision-aware layer ops of the CUDA backend (ops.h's second group) but
 * the convolutions (cuda_cudnn.cu): linear layers on cuBLAS, casts, ReLU and 2x2 max-pool.
 *
 * Storage follows ops.h on every backend, so the layers code stays one: fp32 is float; bf16 is
 * uint16_t bfloat16 (cuBLAS's CUDA_R_16BF, fp32 accumulation); fp16 is EMULATED, float storage
 * holding values rounded to IEEE half, computed by fp32 cuBLAS calls and rounded to half after
 * each op, as on the CPU. On a GPU with TF32 tensor cores (8.0+) the fp16 GEMMs use them: TF32 has
 * fp16's 10 mantissa bits and a wider exponent, so every half value converts exactly and the
 * result is that of fp16 tensor-core math with fp32 accumulation. Roundings are half.h's
 * (the runtime's casts), round to nearest even, the same as the CPU's.
 *
 * Two sections: kernels, then launchers; every launcher runs on the backend stream and ends with
 * a cudaGetLastError check.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "cuda_private.h"
#include "half.h"
#include "math_shared.h"

/* ================================================================================ kernels == */

/* Element i of x stored in precision p, as a float. */
static __device__ float load(ddp_dtype p, const void *x, size_t i)
{
    if (p == DDP_BF16)
        return half_bf16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* Stores v as element i of x in precision p's storage (fp16: rounded to half, kept as float). */
static __device__ void store(ddp_dtype p, void *x, size_t i, float v)
{
    if (p == DDP_BF16)
        ((uint16_t *)x)[i] = half_f32_to_bf16(v);
    else if (p == DDP_FP16)
        ((float *)x)[i] = half_f16_to_f32(half_f32_to_f16(v));
    else
        ((float *)x)[i] = v;
}

__global__ void cast_p_kernel(ddp_dtype to, void *dst, ddp_dtype from, const void *src,
                                  size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        store(to, dst, i, load(from, src, i));
}

/* The common casts, 8 elements a thread with 16-byte accesses (dst and src 16-byte aligned; the
 * last thread takes the n % 8 rest one by one): fp32 -> bf16 and bf16 -> fp32, rounding as
 * cast_p_kernel does (half.h's, to nearest even). */
__global__ void cast_f32_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n)
        return;
    if (i + 8 > n) {
        for (; i < n; i++)
            dst[i] = half_f32_to_bf16(src[i]);
        return;
    }
    float4 a = *reinterpret_cast<const float4 *>(src + i);
    float4 b = *reinterpret_cast<const float4 *>(src + i + 4);
    uint4 o;
    o.x = half_f32_to_bf16(a.x) | (uint32_t)half_f32_to_bf16(a.y) << 16;
    o.y = half_f32_to_bf16(a.z) | (uint32_t)half_f32_to_bf16(a.w) << 16;
    o.z = half_f32_to_bf16(b.x) | (uint32_t)half_f32_to_bf16(b.y) << 16;
    o.w = half_f32_to_bf16(b.z) | (uint32_t)half_f32_to_bf16(b.w) << 16;
    *reinterpret_cast<uint4 *>(dst + i) = o;
}

__global__ void cast_bf16_f32_kernel(float *dst, const uint16_t *src, size_t n)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n)
        return;
    if (i + 8 > n) {
        for (; i < n; i++)
            dst[i] = half_bf16_to_f32(src[i]);
        return;
    }
    uint4 x = *reinterpret_cast<const uint4 *>(src + i);
    float4 a = make_float4(half_bf16_to_f32((uint16_t)x.x), half_bf16_to_f32((uint16_t)(x.x >> 16)),
                           half_bf16_to_f32((uint16_t)x.y), half_bf16_to_f32((uint16_t)(x.y >> 16)));
    float4 b = make_float4(half_bf16_to_f32((uint16_t)x.z), half_bf16_to_f32((uint16_t)(x.z >> 16)),
                           half_bf16_to_f32((uint16_t)x.w), half_bf16_to_f32((uint16_t)(x.w >> 16)));
    *reinterpret_cast<float4 *>(dst + i) = a;
    *reinterpret_cast<float4 *>(dst + i + 4) = b;
}

/* y (rows, cols) in precision p = acc (fp32) + bias[col]; y may be acc. */
__global__ void bias_store_kernel(ddp_dtype p, void *y, const float *acc, const float *bias,
                                      int rows, int cols)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * cols)
        store(p, y, i, bias ? acc[i] + bias[i % cols] : acc[i]);
}

/* y (n, c, hw) in precision p += b[channel]. */
__global__ void channel_bias_kernel(ddp_dtype p, void *y, const float *b, int c, int hw,
                                        size_t n_total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_total)
        store(p, y, i, load(p, y, i) + b[(i / hw) % c]);
}

/* One thread per column: db[col] += the column's sum over the rows of dy (rows, cols); with
 * accumulate false, db[col] = that sum (db not read). The second pass of cuda_colsum (rows: its
 * chunks, a few dozen) and of cuda_channel_sums. */
__global__ void colsum_kernel(ddp_dtype p, float *db, const void *dy, int rows, int cols,
                                  bool accumulate)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++)
        s += load(p, dy, (size_t)r * cols + c);
    db[c] = accumulate ? db[c] + s : s;
}

/* The first pass of cuda_colsum: block (x, chunk) of COLSUM_COLS x COLSUM_LANES threads sums
 * COLSUM_COLS columns over the chunk's rows [chunk * chunk_rows, ...), lane y taking every
 * COLSUM_LANES-th row, then the lanes in order: part[chunk * cols + col]. Reads are coalesced
 * along the columns; the order of the additions depends on the shape only (reproducible). */
enum { COLSUM_COLS = 32, COLSUM_LANES = 8 };
__global__ void colsum_part_kernel(ddp_dtype p, float *part, const void *dy, int rows, int cols,
                                   int chunk_rows)
{
    __shared__ float lane_sum[COLSUM_LANES][COLSUM_COLS];
    int c = blockIdx.x * COLSUM_COLS + threadIdx.x;
    int r0 = blockIdx.y * chunk_rows, r1 = min(rows, r0 + chunk_rows);
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (int r = r0 + (int)threadIdx.y; r < r1; r += COLSUM_LANES)
            s += load(p, dy, (size_t)r * cols + c);
    }
    lane_sum[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= cols)
        return;
    for (int y = 1; y < COLSUM_LANES; y++)
        s += lane_sum[y][threadIdx.x];
    part[(size_t)blockIdx.y * cols + c] = s;
}

/* Images per block of the channel sums: blocks (channel, chunk) of OPS_SUM_IMAGES images each
 * spread the reduction over the whole GPU (one block per channel left 20 blocks to read 16 MB). */
#define OPS_SUM_IMAGES 8

/* Block (ch, g): part[g * c + ch] = the sum of dy (n, c, hw) over images
 * g * OPS_SUM_IMAGES .. and all pixels of channel ch, in a fixed order (reproducible). */
__global__ void channel_part_kernel(ddp_dtype p, const void *dy, int n, int c, int hw,
                                        float *part)
{
    __shared__ float red[256];
    int ch = blockIdx.x, lo = blockIdx.y * OPS_SUM_IMAGES, hi = min(n, lo + OPS_SUM_IMAGES);
    float s = 0.0f;
    for (int img = lo; img < hi; img++) {
        size_t base = ((size_t)img * c + ch) * hw;
        for (int px = threadIdx.x; px < hw; px += blockDim.x)
            s += load(p, dy, base + px);
    }
    red[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half)
            red[threadIdx.x] += red[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[(size_t)blockIdx.y * c + ch] = red[0];
}

/* ReLU on bf16 bits: as a signed integer a bf16 is > 0 exactly when its value is (NaN aside). */
__global__ void relu_bf16_kernel(uint16_t *y, const uint16_t *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = (int16_t)x[i] > 0 ? x[i] : (uint16_t)0;
}

__global__ void relu_grad_bf16_kernel(uint16_t *dx, const uint16_t *dy, const uint16_t *y,
                                          size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dx[i] = (int16_t)y[i] > 0 ? dy[i] : (uint16_t)0;
}

static __device__ float elem_value(float x) { return x; }
static __device__ float elem_value(uint16_t h) { return half_bf16_to_f32(h); }

/* 2x2 max-pool over (planes, h, w): the first largest of each window wins (as math_shared.h's
 * pool_max); arg keeps its input index. */
template <typename T>
__global__ void pool_fwd_kernel(const T *x, int planes, int h, int w, T *y, int *arg)
{
    int ho = h / 2, wo = w / 2;
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (size_t)planes * ho * wo)
        return;
    int ox = (int)(o % wo), oy = (int)((o / wo) % ho), pl = (int)(o / ((size_t)wo * ho));
    size_t base = ((size_t)pl * h + 2 * oy) * w + 2 * ox, best = base;
    size_t offs[4] = {0, 1, (size_t)w, (size_t)w + 1};
    for (int i = 1; i < 4; i++) {
        if (elem_value(x[base + offs[i]]) > elem_value(x[best]))
            best = base + offs[i];
    }
    y[o] = x[best];
    arg[o] = (int)best;
}

/* Windows do not overlap: each input element receives from at most one output (dx zeroed). */
template <typename T>
__global__ void pool_bwd_kernel(const T *dy, const int *arg, size_t n_out, T *dx)
{
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o < n_out)
        dx[arg[o]] = dy[o];
}

/* ============================================================================== launchers == */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static ddp_status cast_launch(const ops_handle *ops, ddp_dtype to, void *dst, ddp_dtype from,
                              const void *src, size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (n == 0)
        return DDP_OK;
    bool vec = aligned16(dst) && aligned16(src);
    unsigned vec_blocks = grid_blocks((n + 7) / 8);
    if (vec && from == DDP_FP32 && to == DDP_BF16) {
        cast_f32_bf16_kernel<<<vec_blocks, block_threads, 0, cu->stream>>>(
            (uint16_t *)dst, (const float *)src, n);
        TRY_CUDA_LAUNCH();
        return DDP_OK;
    }
    if (vec && from == DDP_BF16 && to == DDP_FP32) {
        cast_bf16_f32_kernel<<<vec_blocks, block_threads, 0, cu->stream>>>(
            (float *)dst, (const uint16_t *)src, n);
        TRY_CUDA_LAUNCH();
        return DDP_OK;
    }
    cast_p_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(to, dst, from, src, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* The same precision is a copy (bit for bit, as the CPU's memmove); otherwise each element is
 * converted, rounding to nearest even. */
static ddp_status cuda_cast(const ops_handle *ops, ddp_dtype to, void *dst, ddp_dtype from,
                            const void *src, size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (to != from)
        return cast_launch(ops, to, dst, from, src, n);
    if (dst != src && n)
        TRY_CUDA(cudaMemcpyAsync(dst, src, n * ops_dtype_size(ops, to), cudaMemcpyDeviceToDevice,
                                 cu->stream));
    return DDP_OK;
}

ddp_status cuda_round_fp16(const ops_handle *ops, float *x, size_t n)
{
    return cast_launch(ops, DDP_FP16, x, DDP_FP32, x, n);
}

ddp_status cuda_to_fp32(const ops_handle *ops, ddp_dtype p, float *dst, const void *src, size_t n)
{
    return cuda_cast(ops, DDP_FP32, dst, p == DDP_BF16 ? p : DDP_FP32, src, n);
}

ddp_status cuda_add_channel_bias(const ops_handle *ops, ddp_dtype p, void *y, const float *b,
                                 int n, int c, int hw)
{
    cuda_state *cu = cuda_of(ops);
    size_t n_total = (size_t)n * c * hw;
    if (n_total == 0)
        return DDP_OK;
    channel_bias_kernel<<<grid_blocks(n_total), block_threads, 0, cu->stream>>>(p, y, b, c, hw,
                                                                                 n_total);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* Two passes, no atomics: partial sums per (chunk of images, channel), then each channel's
 * column of them summed in order by colsum_kernel. */
ddp_status cuda_channel_sums(const ops_handle *ops, ddp_dtype p, const void *dy, int n, int c,
                             int hw, float *db, bool accumulate)
{
    cuda_state *cu = cuda_of(ops);
    if (c <= 0)
        return DDP_OK;
    int n_parts = n > 0 && hw > 0 ? (n + OPS_SUM_IMAGES - 1) / OPS_SUM_IMAGES : 0;
    void *part = NULL;
    if (n_parts > 0) {
        TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_CHANNEL_SUMS, (size_t)c * n_parts * sizeof(float), &part));
        channel_part_kernel<<<dim3((unsigned)c, (unsigned)n_parts), 256, 0, cu->stream>>>(
            p, dy, n, c, hw, (float *)part);
        TRY_CUDA_LAUNCH();
    }
    /* with no images, the totals are 0 (overwriting) or db unchanged */
    colsum_kernel<<<grid_blocks((size_t)c), block_threads, 0, cu->stream>>>(DDP_FP32, db, part,
                                                                            n_parts, c, accumulate);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ---- column sums --------------------------------------------------------------------------- */

/* Chunks of rows for cuda_colsum: enough blocks to fill the GPU (about 1024 with the column
 * blocks), at least 64 rows each, and few enough that the second pass (one thread per column
 * summing the chunks in order) stays short. */
static int colsum_chunks(int rows, int cols)
{
    int col_blocks = (cols + COLSUM_COLS - 1) / COLSUM_COLS;
    int by_rows = (rows + 63) / 64, by_fill = 1024 / col_blocks;
    int n = by_rows < by_fill ? by_rows : by_fill;
    return n < 1 ? 1 : n;
}

ddp_status cuda_colsum(const ops_handle *ops, ddp_dtype p, float *db, const void *dy, int rows,
                       int cols, bool accumulate)
{
    cuda_state *cu = cuda_of(ops);
    if (cols <= 0 || rows < 0)
        return DDP_OK;
    if (rows == 0) { /* the sums are 0: overwritten, or db unchanged */
        if (!accumulate)
            TRY_CUDA(cudaMemsetAsync(db, 0, (size_t)cols * sizeof(float), cu->stream));
        return DDP_OK;
    }
    int n_chunks = colsum_chunks(rows, cols), chunk_rows = (rows + n_chunks - 1) / n_chunks;
    n_chunks = (rows + chunk_rows - 1) / chunk_rows;
    void *part = NULL;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_COLSUM, (size_t)n_chunks * cols * sizeof(float), &part));
    dim3 grid((unsigned)((cols + COLSUM_COLS - 1) / COLSUM_COLS), (unsigned)n_chunks);
    colsum_part_kernel<<<grid, dim3(COLSUM_COLS, COLSUM_LANES), 0, cu->stream>>>(
        p, (float *)part, dy, rows, cols, chunk_rows);
    TRY_CUDA_LAUNCH();
    colsum_kernel<<<grid_blocks((size_t)cols), block_threads, 0, cu->stream>>>(
        DDP_FP32, db, part, n_chunks, cols, accumulate);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ---- GEMMs ------------------------------------------------------------------------------- */

/* cuBLAS's compute type for GEMMs whose inputs are in precision p (see the top of the file):
 * fp32 exact unless --tf32; fp16 values are exact in TF32. */
static cublasComputeType_t compute_type(const ops_handle *ops, ddp_dtype p)
{
    cuda_state *cu = cuda_of(ops);
    if (p == DDP_BF16)
        return CUBLAS_COMPUTE_32F;
    bool tf32 = p == DDP_FP16 ? cuda_ampere(cu) : cu->tf32;
    return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* Row-major C (m, n) = op(A) (m, k) op(B) (k, n) + beta C with A and B in precision p and C in
 * p's storage, or float when c_fp32: column-major C^T = op(B)^T op(A)^T, so the operands swap.
 * fp32 stays on cublasSgemm (its math mode follows --tf32); bf16 and fp16 go through
 * cublasGemmEx with fp32 accumulation. */
static ddp_status gemm_p(const ops_handle *ops, ddp_dtype p, bool ta, bool tb, int m, int n, int k,
                         const void *a, const void *b, float beta, void *c, bool c_fp32)
{
    cuda_state *cu = cuda_of(ops);
    if (m < 0 || n < 0 || k < 0)
        return DDP_ERR_INVALID_ARG;
    if (m == 0 || n == 0)
        return DDP_OK;
    int lda = ta ? m : k, ldb = tb ? k : n;
    lda = lda > 0 ? lda : 1, ldb = ldb > 0 ? ldb : 1;
    cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    float alpha = 1.0f;
    if (p == DDP_FP32) {
        TRY_CUBLAS(cublasSgemm(cu->cublas, op_b, op_a, n, m, k, &alpha, (const float *)b, ldb,
                               (const float *)a, lda, &beta, (float *)c, n));
        return DDP_OK;
    }
    cudaDataType ab = p == DDP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType ct = p == DDP_BF16 && !c_fp32 ? CUDA_R_16BF : CUDA_R_32F;
    TRY_CUBLAS(cublasGemmEx(cu->cublas, op_b, op_a, n, m, k, &alpha, b, ab, ldb, a, ab, lda,
                            &beta, c, ct, n, compute_type(ops, p), CUBLAS_GEMM_DEFAULT));
    return DDP_OK;
}

static ddp_status bias_store(const ops_handle *ops, ddp_dtype p, void *y, const float *acc,
                             const float *b, int rows, int cols)
{
    cuda_state *cu = cuda_of(ops);
    size_t n = (size_t)rows * cols;
    if (n == 0 || (!b && p == DDP_FP32 && (const void *)acc == y))
        return DDP_OK; /* nothing to add, nothing to round */
    bias_store_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(p, y, acc, b, rows, cols);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ---- cuBLASLt: the linear layer with its bias fused (the epilogue) ---------------------------- */

enum { LT_PLANS = 32 };
static const size_t lt_workspace_bytes = (size_t)32 << 20;

/* What a plan's epilogue does, on bf16 x and w with fp32 accumulation:
 *   LT_BIAS:      y (batch, out) = x (batch, in) w^T + b, y fp32 (the bias fp32) or bf16 (the bias
 *                 bf16: cuBLASLt's bias has the output's type);
 *   LT_GELU_AUX:  the same with y_bf16, then y = GELU(y) and aux (batch, out) = the sum before GELU
 *                 (cuBLASLt's GELU_AUX_BIAS: GELU of the fp32 sum, each output rounded once);
 *   LT_DGELU:     y (batch, in) = (x (batch, out) w) * GELU'(aux (batch, in)), bf16 (DGELU).
 * Column-major, as cuBLASLt sees it, w stored (in, out): forward y^T (out, batch) = w^T x^T, the
 * bias added along the out rows in the fp32 accumulator; DGELU y^T (in, batch) = w x^T. */
typedef enum { LT_BIAS, LT_GELU_AUX, LT_DGELU } lt_epi;

/* cuBLASLt's descriptors and the algorithm its heuristic chose, for one epilogue, shape, output
 * type and pointer alignment. */
typedef struct lt_plan {
    int batch, in, out, align;
    bool y_bf16;
    lt_epi epi;
    bool ok; /* false: no algorithm for it (the caller falls back to cuBLAS + kernels) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

typedef struct lt_state {
    cublasLtHandle_t handle;
    void *workspace; /* lt_workspace_bytes of device memory */
    lt_plan plans[LT_PLANS];
    int n_plans;
} lt_state;

/* The largest power of two, up to 256, that divides every address (cuBLASLt's alignment hint). */
static int lt_alignment(const void *x, const void *w, const void *y, const void *b, const void *aux)
{
    uintptr_t bits = (uintptr_t)x | (uintptr_t)w | (uintptr_t)y | (uintptr_t)b | (uintptr_t)aux | 256;
    return (int)(bits & ~(bits - 1));
}

static void lt_plan_release(lt_plan *pl)
{
    if (pl->a)
        LOG_CUBLAS(cublasLtMatrixLayoutDestroy(pl->a));
    if (pl->b)
        LOG_CUBLAS(cublasLtMatrixLayoutDestroy(pl->b));
    if (pl->c)
        LOG_CUBLAS(cublasLtMatrixLayoutDestroy(pl->c));
    if (pl->op)
        LOG_CUBLAS(cublasLtMatmulDescDestroy(pl->op));
}

/* The descriptors of *pl (shape and align filled in); DDP_ERR_BLAS when one cannot be made. */
static ddp_status lt_plan_descs(lt_plan *pl)
{
    bool dgelu = pl->epi == LT_DGELU;
    cublasOperation_t ta = dgelu ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = pl->epi == LT_BIAS      ? CUBLASLT_EPILOGUE_BIAS
                                  : pl->epi == LT_GELU_AUX ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                           : CUBLASLT_EPILOGUE_DGELU;
    cudaDataType y_type = pl->y_bf16 ? CUDA_R_16BF : CUDA_R_32F, bias_type = y_type;
    int y_rows = dgelu ? pl->in : pl->out, x_rows = dgelu ? pl->out : pl->in;
    int64_t aux_ld = y_rows; /* aux has y's shape; cuBLASLt wants a multiple of 8 */
    TRY_CUBLAS(cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof epilogue));
    if (!dgelu)
        TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                  &bias_type, sizeof bias_type));
    if (pl->epi != LT_BIAS)
        TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &aux_ld, sizeof aux_ld));
    TRY_CUBLAS(cublasLtMatrixLayoutCreate(&pl->a, CUDA_R_16BF, (uint64_t)pl->in, (uint64_t)pl->out,
                                          pl->in));
    TRY_CUBLAS(cublasLtMatrixLayoutCreate(&pl->b, CUDA_R_16BF, (uint64_t)x_rows,
                                          (uint64_t)pl->batch, x_rows));
    TRY_CUBLAS(cublasLtMatrixLayoutCreate(&pl->c, y_type, (uint64_t)y_rows, (uint64_t)pl->batch,
                                          y_rows));
    return DDP_OK;
}

/* Asks the heuristic for one algorithm within the workspace and the alignment: pl->ok. */
static ddp_status lt_plan_algo(lt_state *lt, lt_plan *pl)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    uint32_t align = (uint32_t)pl->align;
    TRY_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_workspace_bytes,
        sizeof lt_workspace_bytes);
    for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < sizeof aligns / sizeof *aligns; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt->handle, pl->op, pl->a, pl->b, pl->c, pl->c, pref, 1,
                                            &res, &found);
    LOG_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    pl->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (pl->ok)
        pl->algo = res.algo;
    return DDP_OK; /* no algorithm is not an error: the caller falls back */
}

/* The cached plan for this shape and alignment, made on first use; NULL when the cache is full
 * or cuBLASLt refused the descriptors (the caller falls back). */
static lt_plan *lt_plan_for(lt_state *lt, lt_epi epi, int batch, int in, int out, bool y_bf16,
                            int align)
{
    for (int i = 0; i < lt->n_plans; i++) {
        lt_plan *pl = &lt->plans[i];
        if (pl->epi == epi && pl->batch == batch && pl->in == in && pl->out == out &&
            pl->y_bf16 == y_bf16 && pl->align == align)
            return pl->ok ? pl : NULL;
    }
    if (lt->n_plans == LT_PLANS)
        return NULL;
    if (epi != LT_BIAS && (epi == LT_DGELU ? in : out) % 8 != 0)
        return NULL; /* the GELU input's leading dimension: a multiple of 8 (cublasLt.h) */
    lt_plan *pl = &lt->plans[lt->n_plans++];
    *pl = lt_plan{batch, in, out, align, y_bf16, epi, false, NULL, NULL, NULL, NULL, {}};
    if (lt_plan_descs(pl) != DDP_OK || lt_plan_algo(lt, pl) != DDP_OK)
        pl->ok = false;
    return pl->ok ? pl : NULL;
}

/* One GEMM with the epilogue epi (lt_epi's shapes): y and b fp32, or both bf16 (y_bf16; always for
 * the GELU forms); aux the GELU input (written by LT_GELU_AUX, read by LT_DGELU), b NULL for
 * LT_DGELU. DDP_ERR_UNSUPPORTED when there is no plan for it (nothing was queued: the caller takes
 * the other path). */
static ddp_status lt_matmul(const ops_handle *ops, lt_epi epi, const void *x, const void *w,
                            const void *b, const void *aux, int batch, int in, int out, void *y,
                            bool y_bf16)
{
    cuda_state *cu = cuda_of(ops);
    lt_state *lt = (lt_state *)cu->lt;
    int align = lt_alignment(x, w, y, b, aux);
    lt_plan *pl = lt ? lt_plan_for(lt, epi, batch, in, out, y_bf16, align) : NULL;
    if (!pl)
        return DDP_ERR_UNSUPPORTED;
    const float alpha = 1.0f, beta = 0.0f;
    if (epi != LT_DGELU)
        TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b,
                                                  sizeof b));
    if (epi != LT_BIAS)
        TRY_CUBLAS(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                  &aux, sizeof aux));
    cublasStatus_t st = cublasLtMatmul(lt->handle, pl->op, &alpha, w, pl->a, x, pl->b, &beta, y,
                                       pl->c, y, pl->c, &pl->algo, lt->workspace,
                                       lt_workspace_bytes, cu->stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) { /* e.g. the bias's alignment: not this plan again */
        pl->ok = false;
        return DDP_ERR_UNSUPPORTED;
    }
    TRY_CUBLAS(st);
    return DDP_OK;
}

ddp_status cuda_lt_open(ops_handle *ops)
{
    cuda_state *cu = cuda_of(ops);
    lt_state *lt = (lt_state *)calloc(1, sizeof *lt);
    if (!lt)
        return DDP_ERR_NOMEM;
    cu->lt = lt;
    TRY_CUBLAS(cublasLtCreate(&lt->handle));
    lt->workspace = ddp_alloc(ops->ctx, lt_workspace_bytes);
    if (!lt->workspace) {
        DDP_ERROR("cuBLASLt: no device memory for its %zu-byte workspace", lt_workspace_bytes);
        return DDP_ERR_CUDA;
    }
    return DDP_OK;
}

void cuda_lt_close(ops_handle *ops)
{
    cuda_state *cu = cuda_of(ops);
    lt_state *lt = (lt_state *)cu->lt;
    if (!lt)
        return;
    for (int i = 0; i < lt->n_plans; i++)
        lt_plan_release(&lt->plans[i]);
    ddp_free(ops->ctx, lt->workspace);
    if (lt->handle)
        LOG_CUBLAS(cublasLtDestroy(lt->handle));
    free(lt);
    cu->lt = NULL;
}

/* *b16 = b (out floats) rounded to bf16 in scratch: the bias of a bf16 epilogue. */
static ddp_status bias_bf16(const ops_handle *ops, const float *b, int out, const void **b16)
{
    void *s = NULL;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_BIAS16, (size_t)out * sizeof(uint16_t), &s));
    TRY_OK(ops->cast(ops, DDP_BF16, s, DDP_FP32, b, (size_t)out));
    *b16 = s;
    return DDP_OK;
}

/* bf16 inputs with a bias (every GPT linear) run on cuBLASLt with the bias in the GEMM's epilogue,
 * added to the fp32 accumulator before the output's one rounding, where it has a plan: for a bf16
 * output the bias is rounded to bf16 first (cuBLASLt's bias has the output's type; a launch over
 * `out` values; DDP_LT_BIAS16=0 keeps bf16 outputs off it, as run 4 measured). Otherwise bf16
 * output goes through fp32 scratch and a bias kernel, so the bias is still added before the one
 * rounding (as oneDNN's fused bias on the CPU); fp32 and fp16 add it in place (fp16 then rounds
 * once). */
static ddp_status cuda_linear_fwd(const ops_handle *ops, ddp_dtype p, const void *x, const void *w,
                                  const float *b, int batch, int in, int out, void *y, bool y_fp32)
{
    if (batch < 0 || in < 0 || out < 0)
        return DDP_ERR_INVALID_ARG;
    bool lt_ok = y_fp32 || cuda_of(ops)->lt_bias16; /* DDP_LT_BIAS16=0: run 4's bf16 path */
    if (p == DDP_BF16 && b && batch > 0 && in > 0 && out > 0 && lt_ok) {
        const void *bias = b;
        if (!y_fp32)
            TRY_OK(bias_bf16(ops, b, out, &bias));
        ddp_status st = lt_matmul(ops, LT_BIAS, x, w, bias, NULL, batch, in, out, y, !y_fp32);
        if (st != DDP_ERR_UNSUPPORTED)
            return st;
    }
    void *acc = y;
    if (p == DDP_BF16 && !y_fp32)
        TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_GEMM, (size_t)batch * out * sizeof(float), &acc));
    TRY_OK(gemm_p(ops, p, false, true, batch, out, in, x, w, 0.0f, acc, true));
    return bias_store(ops, y_fp32 ? DDP_FP32 : p, y, (const float *)acc, b, batch, out);
}

/* accumulate false: beta 0, with which cuBLAS does not read C (its documentation). */
static ddp_status cuda_linear_bwd_params(const ops_handle *ops, ddp_dtype p, const void *x,
                                         const void *dy, int batch, int in, int out, float *dw,
                                         float *db, bool accumulate)
{
    cuda_state *cu = cuda_of(ops);
    if (dw)
        TRY_OK(gemm_p(ops, p, true, false, out, in, batch, dy, x, accumulate ? 1.0f : 0.0f, dw, true));
    if (!db || out <= 0 || batch < 0)
        return DDP_OK;
    return cuda_colsum(ops, p, db, dy, batch, out, accumulate);
}

static ddp_status cuda_linear_bwd_input(const ops_handle *ops, ddp_dtype p, const void *w,
                                        const void *dy, int batch, int in, int out, void *dx)
{
    TRY_OK(gemm_p(ops, p, false, false, batch, in, out, dy, w, 0.0f, dx, false));
    if (p != DDP_FP16 || batch <= 0 || in <= 0)
        return DDP_OK;
    return cuda_round_fp16(ops, (float *)dx, (size_t)batch * in);
}

/* bf16 with a bias: one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue (pre is the epilogue's aux
 * output: the sum before GELU, rounded to bf16; y is GELU of the fp32 sum). Otherwise, or when
 * cuBLASLt has no plan: linear_fwd, then gelu_fwd on pre. */
static ddp_status cuda_linear_gelu_fwd(const ops_handle *ops, ddp_dtype p, const void *x,
                                       const void *w, const float *b, int batch, int in, int out,
                                       void *pre, void *y)
{
    if (batch < 0 || in < 0 || out < 0)
        return DDP_ERR_INVALID_ARG;
    if (p == DDP_BF16 && b && batch > 0 && in > 0 && out > 0) {
        const void *bias = NULL;
        TRY_OK(bias_bf16(ops, b, out, &bias));
        ddp_status st = lt_matmul(ops, LT_GELU_AUX, x, w, bias, pre, batch, in, out, y, true);
        if (st != DDP_ERR_UNSUPPORTED)
            return st;
    }
    TRY_OK(ops->linear_fwd(ops, p, x, w, b, batch, in, out, pre, p == DDP_FP32));
    return ops->gelu_fwd(ops, p, y, pre, (size_t)batch * out);
}

/* bf16: one cuBLASLt GEMM with the DGELU epilogue (dx rounded once). Otherwise, or when cuBLASLt
 * has no plan: linear_bwd_input, then gelu_bwd in place. */
static ddp_status cuda_linear_bwd_input_gelu(const ops_handle *ops, ddp_dtype p, const void *w,
                                             const void *dy, const void *pre, int batch, int in,
                                             int out, void *dx)
{
    if (batch < 0 || in < 0 || out < 0)
        return DDP_ERR_INVALID_ARG;
    if (p == DDP_BF16 && batch > 0 && in > 0 && out > 0) {
        ddp_status st = lt_matmul(ops, LT_DGELU, dy, w, NULL, pre, batch, in, out, dx, true);
        if (st != DDP_ERR_UNSUPPORTED)
            return st;
    }
    TRY_OK(ops->linear_bwd_input(ops, p, w, dy, batch, in, out, dx));
    return ops->gelu_bwd(ops, p, dx, pre, dx, (size_t)batch * in);
}

/* ---- ReLU and max-pool --------------------------------------------------------------------- */

/* ReLU keeps half values half: fp16 needs no rounding. fp32 and fp16 (float storage) use the fp32
 * ops of the handle (ops_cuda.cu). */
static ddp_status cuda_act_relu_fwd(const ops_handle *ops, ddp_dtype p, void *y, const void *x,
                                    size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (p != DDP_BF16)
        return ops->relu_fwd(ops, (float *)y, (const float *)x, n);
    if (n == 0)
        return DDP_OK;
    relu_bf16_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>((uint16_t *)y, (const uint16_t *)x, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_act_relu_bwd(const ops_handle *ops, ddp_dtype p, void *dx, const void *dy,
                                    const void *y, size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (p != DDP_BF16)
        return ops->relu_bwd(ops, (float *)dx, (const float *)dy, (const float *)y, n);
    if (n == 0)
        return DDP_OK;
    relu_grad_bf16_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
        (uint16_t *)dx, (const uint16_t *)dy, (const uint16_t *)y, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ws holds one int per output: the winner's input index. */
static ddp_status cuda_pool_fwd(const ops_handle *ops, ddp_dtype p, const void *x, int n, int c,
                                int h, int w, void *y, void *ws, size_t ws_bytes)
{
    cuda_state *cu = cuda_of(ops);
    if (n < 0 || c < 0 || h % 2 || w % 2 || (size_t)n * c * h * w > INT_MAX)
        return DDP_ERR_INVALID_ARG;
    size_t n_out = (size_t)n * c * (h / 2) * (w / 2);
    if (n_out * sizeof(int) > ws_bytes) {
        DDP_ERROR("pool_fwd: the CUDA backend needs a %zu-byte workspace, the caller gave %zu",
                  n_out * sizeof(int), ws_bytes);
        return DDP_ERR_INVALID_ARG;
    }
    if (n_out == 0)
        return DDP_OK;
    if (p == DDP_BF16)
        pool_fwd_kernel<uint16_t><<<grid_blocks(n_out), block_threads, 0, cu->stream>>>(
            (const uint16_t *)x, n * c, h, w, (uint16_t *)y, (int *)ws);
    else
        pool_fwd_kernel<float><<<grid_blocks(n_out), block_threads, 0, cu->stream>>>(
            (const float *)x, n * c, h, w, (float *)y, (int *)ws);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_pool_bwd(const ops_handle *ops, ddp_dtype p, const void *dy, const void *ws,
                                int n, int c, int h, int w, void *dx)
{
    cuda_state *cu = cuda_of(ops);
    if (n <= 0 || c <= 0 || h < 2 || w < 2)
        return DDP_OK;
    size_t n_out = (size_t)n * c * (h / 2) * (w / 2);
    TRY_CUDA(cudaMemsetAsync(dx, 0, (size_t)n * c * h * w * ops_dtype_size(ops, p), cu->stream));
    if (p == DDP_BF16)
        pool_bwd_kernel<uint16_t><<<grid_blocks(n_out), block_threads, 0, cu->stream>>>(
            (const uint16_t *)dy, (const int *)ws, n_out, (uint16_t *)dx);
    else
        pool_bwd_kernel<float><<<grid_blocks(n_out), block_threads, 0, cu->stream>>>(
            (const float *)dy, (const int *)ws, n_out, (float *)dx);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ---- capabilities and the table ------------------------------------------------------------ */

/* fp32 and the fp16 emulation run on any GPU; bf16 needs bf16 tensor cores in cuBLAS and cuDNN. */
static bool cuda_supports(const ops_handle *ops, ddp_dtype p, const char **why)
{
    cuda_state *cu = cuda_of(ops);
    char *text = cu->text; /* the handle's report buffer: read before the next report */
    if (p != DDP_BF16)
        return true;
    if (cuda_ampere(cu))
        return true;
    snprintf(text, sizeof cu->text, "this GPU (compute capability %d.%d) has no bf16 tensor cores "
                 "(cuBLAS and cuDNN bf16 need 8.0, Ampere, or newer); use --precision fp32 or fp16",
                 cu->cc_major, cu->cc_minor);
    if (why)
        *why = text;
    return false;
}

void cuda_layer_ops(ops_handle *ops)
{
    ops->channels_last = false; /* NCHW throughout: image_reorder is never needed */
    ops->supports = cuda_supports;
    ops->cast = cuda_cast;
    ops->linear_fwd = cuda_linear_fwd;
    ops->linear_bwd_params = cuda_linear_bwd_params;
    ops->linear_bwd_input = cuda_linear_bwd_input;
    ops->linear_gelu_fwd = cuda_linear_gelu_fwd;
    ops->linear_bwd_input_gelu = cuda_linear_bwd_input_gelu;
    ops->act_relu_fwd = cuda_act_relu_fwd;
    ops->act_relu_bwd = cuda_act_relu_bwd;
    ops->pool_fwd = cuda_pool_fwd;
    ops->pool_bwd = cuda_pool_bwd;
}
