/* cuda_gpt.cu - the transformer ops of the CUDA backend (ops.h's GPT-2 section): token and
 * position embeddings, LayerNorm, causal multi-head attention (in bf16 the fused kernel of
 * cuda_flash.cu; otherwise, and as its reference, cuBLAS strided-batched GEMMs, bf16 on tensor
 * cores in bf16 runs, around a causal softmax kernel), GELU, the residual add, the cross-entropy over the (padded)
 * vocabulary, and AdamW. The activations a linear reads or writes are fp32 or bf16 (ops.h's "in
 * act"): the kernels are templates on their storage (float or uint16_t bf16 bits), compute in
 * fp32 and round to bf16 only what they store (the fused attention reads bf16 qkv and dout in
 * place, no head split; its fp32 output and gradients are merged into bf16); the scalar math
 * shared with the CPU is math_shared.h's.
 *
 * Every op is deterministic: sums run in a fixed order (no atomics). The embedding's backward
 * sorts the tokens (CUB's stable radix sort) so that each vocabulary row is summed by one block,
 * positions in increasing order, as the CPU does.
 *
 * Two sections: kernels, then launchers; every launcher runs on the backend stream (cuBLAS is
 * bound to it at ops_cuda_open) and ends with a cudaGetLastError check.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda_flash.h"
#include "cuda_private.h"
#include "half.h"
#include "math_shared.h"

/* Rows per block of the kernels that give each row one warp. */
enum { WARP = 32, ROWS_PER_BLOCK = 8 };

/* ================================================================================ kernels == */

/* ---- reductions ------------------------------------------------------------------------ */

static __device__ float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The row of the calling warp in the kernels that give each row one warp. */
static __device__ size_t warp_row(void)
{
    return (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
}

/* ---- storage: float, or bf16 bits rounded to nearest even -------------------------------- */

static __device__ float get(const float *x, size_t i) { return x[i]; }
static __device__ float get(const uint16_t *x, size_t i) { return half_bf16_to_f32(x[i]); }
static __device__ void put(float *x, size_t i, float v) { x[i] = v; }
static __device__ void put(uint16_t *x, size_t i, float v) { x[i] = half_f32_to_bf16(v); }

/* Four elements from x + i (16-byte aligned for float, 8-byte for bf16). */
static __device__ float4 get4(const float *x, size_t i)
{
    return *reinterpret_cast<const float4 *>(x + i);
}
static __device__ float4 get4(const uint16_t *x, size_t i)
{
    uint2 u = *reinterpret_cast<const uint2 *>(x + i);
    return make_float4(half_bf16_to_f32((uint16_t)(u.x & 0xffffu)),
                       half_bf16_to_f32((uint16_t)(u.x >> 16)),
                       half_bf16_to_f32((uint16_t)(u.y & 0xffffu)),
                       half_bf16_to_f32((uint16_t)(u.y >> 16)));
}

/* ---- embeddings ------------------------------------------------------------------------ */

/* out (B, T, C) = wte[tokens[b,t]] (float or bf16 storage) + wpe[t]; one thread per output
 * element. */
template <typename W>
static __global__ void encoder_fwd_kernel(float *out, const int *tokens, const W *wte,
                                          const float *wpe, int T, int C, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    out[i] = get(wte, (size_t)tokens[bt] * C + c) + wpe[(size_t)t * C + c];
}

/* x[i] = i: the positions that the radix sort carries along with the tokens. */
static __global__ void iota_kernel(int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = i;
}

/* dwte's backward over the sorted tokens in segments of ENC_SEG entries, so that no block sums
 * more than ENC_SEG rows however often a token repeats (one block per run left a few blocks
 * summing hundreds of rows of a frequent token while the GPU idled). A run of equal tokens
 * splits into pieces, one per segment it touches; in each piece the rows are added in sorted
 * order (positions increasing: the sort is stable). */
enum { ENC_SEG = 32 };

/* The pieces of segment blockIdx.x (entries [lo, hi) of the sorted tok, pos; threads own
 * channels): a run inside the segment is added into its dwte row (dwte first, then the rows in
 * order, as the CPU); a piece of a run that began in an earlier segment goes to part[seg][0]
 * (its head piece), one that began here and goes on to part[seg][1] (its tail piece), for
 * encoder_dwte_join_kernel. part: (n_seg, 2, C). */
static __global__ void encoder_dwte_seg_kernel(float *dwte, float *part, const float *dout,
                                               const int *tok, const int *pos, int n, int C)
{
    int seg = blockIdx.x, lo = seg * ENC_SEG, hi = min(n, lo + ENC_SEG);
    for (int a = lo; a < hi;) {
        int v = tok[a], b = a + 1;
        while (b < hi && tok[b] == v)
            b++;
        bool before = a == lo && lo > 0 && tok[lo - 1] == v;
        bool after = b == hi && hi < n && tok[hi] == v;
        float *dst = before ? part + ((size_t)seg * 2) * C
                     : after ? part + ((size_t)seg * 2 + 1) * C
                             : dwte + (size_t)v * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = before || after ? 0.0f : dst[c];
            for (int j = a; j < b; j++)
                acc += dout[(size_t)pos[j] * C + c];
            dst[c] = acc;
        }
        a = b;
    }
}

/* Block seg joins the run whose tail piece segment seg holds (if any): dwte's row + that piece +
 * the head pieces of the following segments, in segment order. */
static __global__ void encoder_dwte_join_kernel(float *dwte, const float *part, const int *tok,
                                                int n, int C)
{
    int seg = blockIdx.x, lo = seg * ENC_SEG, hi = min(n, lo + ENC_SEG);
    int v = tok[hi - 1], a = hi - 1;
    while (a > lo && tok[a - 1] == v)
        a--;
    bool before = a == lo && lo > 0 && tok[lo - 1] == v;
    if (before || hi >= n || tok[hi] != v)
        return; /* no tail piece here */
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dwte[(size_t)v * C + c] + part[((size_t)seg * 2 + 1) * C + c];
        for (int s = seg + 1, end = hi; end < n && tok[end] == v; s++) {
            acc += part[((size_t)s * 2) * C + c];
            end = min(n, end + ENC_SEG);
        }
        dwte[(size_t)v * C + c] = acc;
    }
}

/* Run 4's dwte backward (DDP_ENC_SEG=0): the block of the first entry of each run of equal
 * sorted tokens adds that run's dout rows to the token's dwte row, positions in increasing order
 * (the CPU's order); the other blocks return. Threads own channels, so no two write one float. */
static __global__ void encoder_dwte_kernel(float *dwte, const float *dout, const int *tok,
                                           const int *pos, int n, int C)
{
    int i = blockIdx.x;
    int v = tok[i];
    if (i > 0 && tok[i - 1] == v)
        return;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dwte[(size_t)v * C + c];
        for (int j = i; j < n && tok[j] == v; j++)
            acc += dout[(size_t)pos[j] * C + c];
        dwte[(size_t)v * C + c] = acc;
    }
}

/* dwpe (T, C) += sum over b of dout (B, T, C), b in order; one thread per (t, c). */
static __global__ void encoder_dwpe_kernel(float *dwpe, const float *dout, int B, size_t tc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tc)
        return;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++)
        acc += dout[(size_t)b * tc + i];
    dwpe[i] = acc;
}

/* ---- LayerNorm ------------------------------------------------------------------------- */

/* Row xr of C by one warp (lane = its lane), s the lanes' partial sums of xr already taken: mean,
 * biased variance about it (a second pass), out's row (O) = xhat * w + b. */
template <typename O>
static __device__ void layernorm_row(O *out, float *mean, float *rstd, const float *xr, float s,
                                     const float *w, const float *b, size_t row, int lane, int C)
{
    float m = warp_sum(s) / (float)C;
    float q = 0.0f;
    for (int c = lane; c < C; c += WARP)
        q += (xr[c] - m) * (xr[c] - m);
    float r = layernorm_rstd(warp_sum(q) / (float)C);
    for (int c = lane; c < C; c += WARP)
        put(out, row * C + c, (xr[c] - m) * r * w[c] + b[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* One warp per row of C: LayerNorm of x (layernorm_row). */
template <typename O>
static __global__ void layernorm_fwd_kernel(O *out, float *mean, float *rstd, const float *x,
                                            const float *w, const float *b, int rows, int C)
{
    size_t row = warp_row();
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows)
        return;
    const float *xr = x + row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += WARP)
        s += xr[c];
    layernorm_row(out, mean, rstd, xr, s, w, b, row, lane, C);
}

/* layernorm_fwd_kernel on y = a + pb (the residual add, pb in A's storage; y may be a), y written
 * in the first pass: each y as add_kernel computes it, summed in layernorm_fwd_kernel's order, so
 * bit for bit the two kernels. */
template <typename O, typename A>
static __global__ void add_layernorm_fwd_kernel(O *out, float *mean, float *rstd, float *y,
                                                const float *a, const A *pb, const float *w,
                                                const float *b, int rows, int C)
{
    size_t row = warp_row();
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows)
        return;
    float *yr = y + row * C;
    const float *ar = a + row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float v = ar[c] + get(pb, row * C + c);
        yr[c] = v;
        s += v;
    }
    layernorm_row(out, mean, rstd, yr, s, w, b, row, lane, C);
}

/* Row `row` of LayerNorm's backward by one warp: dx += layernorm_dx(...) with the row's means of
 * g = dout * w and g * xhat; dx_act (when not NULL) gets the sum in D too; with aw set, the
 * lane's columns of the row's parameter gradients are added into aw (dout * xhat) and ab
 * (dout). */
template <typename D>
static __device__ void layernorm_dx_row(float *dx, D *dx_act, const D *dout, const float *x,
                                        const float *w, float m, float r, size_t row, int lane,
                                        int C, float *aw, float *ab)
{
    const D *dr = dout + row * C;
    const float *xr = x + row * C;
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float g = get(dr, c) * w[c];
        sg += g;
        sgx += g * ((xr[c] - m) * r);
    }
    float mg = warp_sum(sg) / (float)C, mgx = warp_sum(sgx) / (float)C;
    for (int c = lane; c < C; c += WARP) {
        float d = get(dr, c), xhat = (xr[c] - m) * r;
        float v = dx[row * C + c] + layernorm_dx(d, w[c], xhat, r, mg, mgx);
        dx[row * C + c] = v;
        if (dx_act)
            put(dx_act, row * C + c, v);
        if (aw) {
            aw[c] += d * xhat;
            ab[c] += d;
        }
    }
}

/* One warp per row: layernorm_dx_row. */
template <typename D>
static __global__ void layernorm_dx_kernel(float *dx, D *dx_act, const D *dout, const float *x,
                                           const float *w, const float *mean, const float *rstd,
                                           int rows, int C)
{
    size_t row = warp_row();
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows)
        return;
    layernorm_dx_row(dx, dx_act, dout, x, w, mean[row], rstd[row], row, lane, C,
                     (float *)nullptr, (float *)nullptr);
}

/* LayerNorm's backward with the parameter gradients' partial sums in the same pass: block b
 * takes rows [b LN_BWD_ROWS, (b + 1) LN_BWD_ROWS), warp q the rows q, q + LN_BWD_WARPS, ... of
 * them (layernorm_dx_row, dx bit for bit layernorm_dx_kernel's), each warp adding its rows in
 * order into its own shared rows of dout * xhat and dout; then part_w[b, c] and part_b[b, c]
 * = the warps' sums added in warp order (a fixed order: deterministic). Dynamic shared memory:
 * 2 LN_BWD_WARPS C floats. */
enum { LN_BWD_WARPS = 8, LN_BWD_ROWS = 32 };
template <typename D>
static __global__ void layernorm_bwd_fused_kernel(float *dx, D *dx_act, float *part_w,
                                                  float *part_b, const D *dout, const float *x,
                                                  const float *w, const float *mean,
                                                  const float *rstd, int rows, int C)
{
    extern __shared__ float ln_acc[]; /* [warp][dw, db][C] */
    int warp = (int)(threadIdx.x / WARP), lane = (int)(threadIdx.x % WARP);
    float *aw = ln_acc + (size_t)warp * 2 * C, *ab = aw + C;
    for (int c = lane; c < C; c += WARP)
        aw[c] = ab[c] = 0.0f;
    size_t r0 = (size_t)blockIdx.x * LN_BWD_ROWS;
    for (int k = warp; k < LN_BWD_ROWS && r0 + k < (size_t)rows; k += LN_BWD_WARPS)
        layernorm_dx_row(dx, dx_act, dout, x, w, mean[r0 + k], rstd[r0 + k], r0 + k, lane, C, aw,
                         ab);
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int q = 0; q < LN_BWD_WARPS; q++) {
            sw += ln_acc[(size_t)q * 2 * C + c];
            sb += ln_acc[(size_t)q * 2 * C + C + c];
        }
        part_w[(size_t)blockIdx.x * C + c] = sw;
        part_b[(size_t)blockIdx.x * C + c] = sb;
    }
}

/* Partial parameter gradients over a chunk of chunk_rows rows (blockIdx.y): part_w[chunk, c] =
 * sum of dout * xhat, part_b[chunk, c] = sum of dout (part_w, part_b: (n_chunks, C)). */
template <typename D>
static __global__ void layernorm_param_part_kernel(float *part_w, float *part_b,
                                                   const D *dout, const float *x,
                                                   const float *mean, const float *rstd, int rows,
                                                   int C, int chunk_rows)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int r0 = blockIdx.y * chunk_rows, r1 = min(rows, r0 + chunk_rows);
    float sw = 0.0f, sb = 0.0f;
    for (int r = r0; r < r1; r++) {
        float d = get(dout, (size_t)r * C + c);
        sw += d * ((x[(size_t)r * C + c] - mean[r]) * rstd[r]);
        sb += d;
    }
    part_w[(size_t)blockIdx.y * C + c] = sw;
    part_b[(size_t)blockIdx.y * C + c] = sb;
}

/* dw[c] += the chunks' partial sums in chunk order, db likewise; one thread per channel. */
static __global__ void layernorm_param_sum_kernel(float *dw, float *db, const float *part_w,
                                                  const float *part_b, int n_chunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float sw = 0.0f, sb = 0.0f;
    for (int k = 0; k < n_chunks; k++) {
        sw += part_w[(size_t)k * C + c];
        sb += part_b[(size_t)k * C + c];
    }
    dw[c] += sw;
    db[c] += sb;
}

/* ---- attention ------------------------------------------------------------------------- */

/* dst (B, NH, T, hs; float, or bf16 rounded to nearest even) = the heads of src (float or
 * bf16), whose row (b, t) starts at (b*T + t) * stride and holds head h at [h*hs, (h+1)*hs); one
 * thread per dst element (n of them). */
template <typename D, typename S>
static __global__ void heads_split_kernel(D *dst, const S *src, int stride, int T, int NH,
                                          int hs, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int d = (int)(i % hs), t = (int)(i / hs % T), h = (int)(i / ((size_t)hs * T) % NH);
    size_t b = i / ((size_t)hs * T * NH);
    put(dst, i, get(src, (b * T + t) * stride + (size_t)h * hs + d));
}

static __device__ void put4(float *x, size_t i, float4 v) { *reinterpret_cast<float4 *>(x + i) = v; }
static __device__ void put4(uint16_t *x, size_t i, float4 v)
{
    uint2 o;
    o.x = half_f32_to_bf16(v.x) | (uint32_t)half_f32_to_bf16(v.y) << 16;
    o.y = half_f32_to_bf16(v.z) | (uint32_t)half_f32_to_bf16(v.w) << 16;
    *reinterpret_cast<uint2 *>(x + i) = o;
}

/* heads_split_kernel four channels a thread, with 16-byte (fp32) or 8-byte (bf16) loads and
 * 32-bit index arithmetic: n4 = n / 4 groups; hs, stride and src's offsets multiples of 4, src
 * 16-byte aligned. */
template <typename D, typename S>
static __global__ void heads_split4_kernel(D *dst, const S *src, int stride, int T, int NH,
                                           int hs, unsigned n4)
{
    unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n4)
        return;
    unsigned hs4 = (unsigned)hs / 4, d = g % hs4 * 4, row = g / hs4; /* row: (b NH + h) T + t */
    unsigned t = row % (unsigned)T, bh = row / (unsigned)T, h = bh % (unsigned)NH;
    size_t b = bh / (unsigned)NH;
    put4(dst, (size_t)g * 4, get4(src, (b * T + t) * stride + (size_t)h * hs + d));
}

/* heads_merge_kernel four channels a thread (the conditions of heads_split4_kernel on dst). */
template <typename D>
static __global__ void heads_merge4_kernel(D *dst, const float *src, int stride, int T, int NH,
                                           int hs, unsigned n4)
{
    unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n4)
        return;
    unsigned hs4 = (unsigned)hs / 4, d = g % hs4 * 4, row = g / hs4;
    unsigned t = row % (unsigned)T, bh = row / (unsigned)T, h = bh % (unsigned)NH;
    size_t b = bh / (unsigned)NH;
    put4(dst, (b * T + t) * stride + (size_t)h * hs + d, get4(src, (size_t)g * 4));
}

/* The inverse of heads_split_kernel: dst's rows (stride apart; float or bf16) get the heads of
 * src (B, NH, T, hs; float) side by side. */
template <typename D>
static __global__ void heads_merge_kernel(D *dst, const float *src, int stride, int T, int NH,
                                          int hs, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int d = (int)(i % hs), t = (int)(i / hs % T), h = (int)(i / ((size_t)hs * T) % NH);
    size_t b = i / ((size_t)hs * T * NH);
    put(dst, (b * T + t) * stride + (size_t)h * hs + d, src[i]);
}

/* One warp per row (b, h, t) of att (rows, T), which holds the scaled scores: softmax over keys
 * 0..t, zeros above the diagonal; p16 (when not NULL) gets the same in bf16, the input of the
 * bf16 product with v. */
static __global__ void causal_softmax_kernel(float *att, uint16_t *p16, size_t rows, int T)
{
    size_t row = warp_row();
    int lane = threadIdx.x % WARP;
    if (row >= rows)
        return;
    int t = (int)(row % T);
    float *a = att + row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += WARP)
        mx = fmaxf(mx, a[j]);
    mx = warp_max(mx);
    float s = 0.0f;
    for (int j = lane; j <= t; j += WARP)
        s += expf(a[j] - mx);
    s = warp_sum(s);
    for (int j = lane; j < T; j += WARP) {
        float pj = j <= t ? expf(a[j] - mx) / s : 0.0f;
        a[j] = pj;
        if (p16)
            p16[row * T + j] = half_f32_to_bf16(pj);
    }
}

/* One warp per row: datt (rows, T) becomes the gradient of the scaled scores' inputs,
 * scale * att * (datt - sum_j att datt), zero above the diagonal (in place); d16 (when not NULL)
 * gets the same in bf16. */
static __global__ void causal_softmax_bwd_kernel(float *datt, uint16_t *d16, const float *att,
                                                 size_t rows, int T, float scale)
{
    size_t row = warp_row();
    int lane = threadIdx.x % WARP;
    if (row >= rows)
        return;
    int t = (int)(row % T);
    float *d = datt + row * T;
    const float *a = att + row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += WARP)
        dot += a[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += WARP) {
        float dj = j <= t ? scale * a[j] * (d[j] - dot) : 0.0f;
        d[j] = dj;
        if (d16)
            d16[row * T + j] = half_f32_to_bf16(dj);
    }
}

/* ---- elementwise ----------------------------------------------------------------------- */

template <typename A>
static __global__ void gelu_fwd_kernel(A *y, const A *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        put(y, i, gelu_tanh(get(x, i)));
}

template <typename A>
static __global__ void gelu_bwd_kernel(A *dx, const A *x, const A *dy, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        put(dx, i, get(dy, i) * gelu_tanh_grad(get(x, i)));
}

/* y = a + b, b (the projection) in A. */
template <typename A>
static __global__ void add_kernel(float *y, const float *a, const A *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a[i] + get(b, i);
}

/* Eight bf16 values from x + i into v (one 16-byte load: x + i 16-byte aligned). */
static __device__ void get8(const uint16_t *x, size_t i, float v[8])
{
    uint4 u = *reinterpret_cast<const uint4 *>(x + i);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    for (int k = 0; k < 4; k++) {
        v[2 * k] = half_bf16_to_f32((uint16_t)(w[k] & 0xffffu));
        v[2 * k + 1] = half_bf16_to_f32((uint16_t)(w[k] >> 16));
    }
}

/* x[i..i+8) = v rounded to bf16 (one 16-byte store). */
static __device__ void put8(uint16_t *x, size_t i, const float v[8])
{
    uint32_t w[4];
    for (int k = 0; k < 4; k++)
        w[k] = half_f32_to_bf16(v[2 * k]) | (uint32_t)half_f32_to_bf16(v[2 * k + 1]) << 16;
    *reinterpret_cast<uint4 *>(x + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* The bf16 element-wise kernels eight elements a thread, with 16-byte loads and stores (n8 = n / 8
 * groups, every pointer 16-byte aligned); the same math per element as the kernels above. */
static __global__ void gelu_fwd8_kernel(uint16_t *y, const uint16_t *x, size_t n8)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n8 * 8)
        return;
    float v[8];
    get8(x, i, v);
    for (int k = 0; k < 8; k++)
        v[k] = gelu_tanh(v[k]);
    put8(y, i, v);
}

static __global__ void gelu_bwd8_kernel(uint16_t *dx, const uint16_t *x, const uint16_t *dy,
                                        size_t n8)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n8 * 8)
        return;
    float xv[8], d[8];
    get8(x, i, xv);
    get8(dy, i, d);
    for (int k = 0; k < 8; k++)
        d[k] = d[k] * gelu_tanh_grad(xv[k]);
    put8(dx, i, d);
}

static __global__ void add8_kernel(float *y, const float *a, const uint16_t *b, size_t n8)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n8 * 8)
        return;
    float v[8];
    get8(b, i, v);
    float4 a0 = *reinterpret_cast<const float4 *>(a + i);
    float4 a1 = *reinterpret_cast<const float4 *>(a + i + 4);
    *reinterpret_cast<float4 *>(y + i) =
        make_float4(a0.x + v[0], a0.y + v[1], a0.z + v[2], a0.w + v[3]);
    *reinterpret_cast<float4 *>(y + i + 4) =
        make_float4(a1.x + v[4], a1.y + v[5], a1.z + v[6], a1.w + v[7]);
}

/* The gradients' factor: *scale_dev (ddp_grad_clip_scale's, on the device) when set, else
 * scale. */
static __device__ float grad_factor(const float *scale_dev, float scale)
{
    return scale_dev ? *scale_dev : scale;
}

static __global__ void adamw_kernel(float *w, float *m, float *v, const float *g, size_t n,
                                    float lr, float beta1, float beta2, float eps, float wd,
                                    float bc1, float bc2, float grad_scale,
                                    const float *grad_scale_dev)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        w[i] = adamw_update(w[i], &m[i], &v[i], g[i], grad_factor(grad_scale_dev, grad_scale),
                            lr, beta1, beta2, eps, wd, bc1, bc2);
}

/* adamw_kernel's step that also writes the new weight's bf16 copy, rounded stochastically by
 * (key, index0 + i) (math_shared.h, the CPU's function): one launch, one read and one write of w
 * where a cast after would read w again. */
static __global__ void adamw_bf16_kernel(float *w, float *m, float *v, const float *g, size_t n,
                                         float lr, float beta1, float beta2, float eps, float wd,
                                         float bc1, float bc2, float grad_scale,
                                         const float *grad_scale_dev, uint16_t *wc, uint64_t key,
                                         size_t index0)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float wi = adamw_update(w[i], &m[i], &v[i], g[i], grad_factor(grad_scale_dev, grad_scale), lr,
                            beta1, beta2, eps, wd, bc1, bc2);
    w[i] = wi;
    wc[i] = bf16_round_stochastic(wi, key, index0 + i);
}

/* dst = src rounded stochastically to bf16 by (key, index0 + i). */
static __global__ void cast_bf16_sr_kernel(uint16_t *dst, const float *src, size_t n,
                                           uint64_t key, size_t index0)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = bf16_round_stochastic(src[i], key, index0 + i);
}

/* ---- cross-entropy --------------------------------------------------------------------- */

/* Folds x into a running (max m, sum s of exp(. - m)): one exp per element. */
static __device__ __forceinline__ void lse_add(float &m, float &s, float x)
{
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

/* Merges (m2, s2) into (m, s); symmetric (a + b == b + a), so every lane of a butterfly agrees. */
static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    float mx = fmaxf(m, m2);
    if (mx == -INFINITY)
        return; /* both empty */
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

/* The (max, sum) of the block, returned to every thread; every thread of the block calls it. */
static __device__ void block_lse(float &m, float &s)
{
    __shared__ float pm[WARP], ps[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    for (int o = WARP / 2; o > 0; o /= 2)
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) {
        pm[warp] = m;
        ps[warp] = s;
    }
    __syncthreads();
    m = lane < n_warps ? pm[lane] : -INFINITY;
    s = lane < n_warps ? ps[lane] : 0.0f;
    for (int o = WARP / 2; o > 0; o /= 2)
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

/* One block per row of logits (rows, Vp; float or bf16 storage): losses[r] = log(sum exp(z -
 * max)) - (z[target] - max) over the first V columns, the max and the sum in one pass (online);
 * dlogits (may be logits: each thread reads its columns before it writes them, and z[target] is
 * read before the first barrier) = (softmax - onehot) * dscale, 0 in the padding, rounded to A.
 * In bf16 this is llm.c's fused classifier: the row's second read mostly hits L2. vec: Vp a
 * multiple of 4 and the rows 16-byte (float) or 8-byte (bf16) aligned, four columns a thread at a
 * time. */
template <typename A>
static __global__ void xent_kernel(A *dlogits, float *losses, const A *logits,
                                   const int *targets, int V, int Vp, float dscale, bool vec)
{
    size_t r = blockIdx.x;
    const A *z = logits + r * Vp;
    int target = targets[r];
    float zt = get(z, (size_t)target);
    float m = -INFINITY, s = 0.0f;
    if (vec) {
        for (int c = threadIdx.x * 4; c < V; c += blockDim.x * 4) {
            float4 x = get4(z, (size_t)c);
            lse_add(m, s, x.x);
            if (c + 1 < V)
                lse_add(m, s, x.y);
            if (c + 2 < V)
                lse_add(m, s, x.z);
            if (c + 3 < V)
                lse_add(m, s, x.w);
        }
    } else {
        for (int c = threadIdx.x; c < V; c += blockDim.x)
            lse_add(m, s, get(z, (size_t)c));
    }
    block_lse(m, s);
    if (threadIdx.x == 0)
        losses[r] = logf(s) - (zt - m);
    if (!dlogits)
        return;
    A *dz = dlogits + r * Vp;
    if (vec) {
        for (int c = threadIdx.x * 4; c < Vp; c += blockDim.x * 4) {
            float4 x = get4(z, (size_t)c);
            float v[4] = {x.x, x.y, x.z, x.w};
            for (int k = 0; k < 4; k++) {
                int j = c + k;
                v[k] = j < V ? (expf(v[k] - m) / s - (j == target ? 1.0f : 0.0f)) * dscale : 0.0f;
            }
            put4(dz, (size_t)c, make_float4(v[0], v[1], v[2], v[3]));
        }
        return;
    }
    for (int c = threadIdx.x; c < Vp; c += blockDim.x) {
        float p = c < V ? expf(get(z, (size_t)c) - m) / s : 0.0f;
        put(dz, (size_t)c, c < V ? (p - (c == target ? 1.0f : 0.0f)) * dscale : 0.0f);
    }
}

/* ============================================================================== launchers == */

/* Whether the sizes are all >= 0 (otherwise logged, naming op), and (via *empty) whether one of
 * them is 0: nothing to do. */
static bool sizes_ok(const char *op, int a, int b, int c, bool *empty)
{
    *empty = a == 0 || b == 0 || c == 0;
    if (a >= 0 && b >= 0 && c >= 0)
        return true;
    DDP_ERROR("cuda %s: shape %d x %d x %d has a negative size", op, a, b, c);
    return false;
}

/* Whether activations in act are stored as the kernels take them (fp32 or bf16; otherwise logged,
 * naming op). */
static bool act_ok(const char *op, ddp_dtype act)
{
    if (act == DDP_FP32 || act == DDP_BF16)
        return true;
    DDP_ERROR("cuda %s: activations in %s: fp32 or bf16 only", op, ddp_dtype_name(act));
    return false;
}

/* Blocks of ROWS_PER_BLOCK warps covering rows rows, one warp each. */
static unsigned row_blocks(size_t rows)
{
    return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

/* ---- embeddings ------------------------------------------------------------------------ */

static ddp_status cuda_encoder_fwd(const ops_handle *ops, float *out, const int *tokens,
                                   ddp_dtype wp, const void *wte, const float *wpe, int B, int T,
                                   int C)
{
    cuda_state *cu = cuda_of(ops);
    bool empty;
    if (!sizes_ok("encoder_fwd", B, T, C, &empty))
        return DDP_ERR_INVALID_ARG;
    if (empty)
        return DDP_OK;
    size_t n = (size_t)B * T * C;
    if (ops_dtype_size(ops, wp) == 2)
        encoder_fwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
            out, tokens, (const uint16_t *)wte, wpe, T, C, n);
    else
        encoder_fwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
            out, tokens, (const float *)wte, wpe, T, C, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* Sorts the n tokens (stable), carrying their positions: *tok and *pos (n each) in the handle's
 * encoder scratch, which also holds CUB's temporary storage and *extra (extra_bytes, 256-byte
 * aligned). */
static ddp_status sort_tokens(const ops_handle *ops, const int *tokens, int n, size_t extra_bytes,
                              int **tok, int **pos, void **extra)
{
    cuda_state *cu = cuda_of(ops);
    size_t temp_bytes = 0;
    TRY_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, (int *)nullptr,
                                             (const int *)nullptr, (int *)nullptr, n, 0,
                                             (int)(8 * sizeof(int)), cu->stream));
    size_t ints_bytes = ((3 * (size_t)n * sizeof(int) + 255) / 256) * 256; /* temp 256-aligned */
    void *scratch = NULL;
    size_t temp_round = (temp_bytes + 255) / 256 * 256;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_ENCODER, ints_bytes + temp_round + extra_bytes,
                        &scratch));
    *extra = (char *)scratch + ints_bytes + temp_round;
    int *iota = (int *)scratch;
    *tok = iota + n;
    *pos = iota + 2 * (size_t)n;
    iota_kernel<<<grid_blocks((size_t)n), block_threads, 0, cu->stream>>>(iota, n);
    TRY_CUDA_LAUNCH();
    TRY_CUDA(cub::DeviceRadixSort::SortPairs((char *)scratch + ints_bytes, temp_bytes, tokens,
                                             *tok, (const int *)iota, *pos, n, 0,
                                             (int)(8 * sizeof(int)), cu->stream));
    return DDP_OK;
}

static ddp_status cuda_encoder_bwd(const ops_handle *ops, float *dwte, float *dwpe,
                                   const float *dout, const int *tokens, int B, int T, int C)
{
    cuda_state *cu = cuda_of(ops);
    bool empty;
    if (!sizes_ok("encoder_bwd", B, T, C, &empty))
        return DDP_ERR_INVALID_ARG;
    if ((size_t)B * T > INT_MAX) {
        DDP_ERROR("cuda encoder_bwd: %d x %d tokens are more than the sort takes", B, T);
        return DDP_ERR_INVALID_ARG;
    }
    if (empty)
        return DDP_OK;
    int n = B * T, *tok = NULL, *pos = NULL;
    int n_seg = cu->enc_seg ? (n + ENC_SEG - 1) / ENC_SEG : 0; /* DDP_ENC_SEG=0: run 4's kernel */
    void *part = NULL;
    TRY_OK(sort_tokens(ops, tokens, n, (size_t)n_seg * 2 * C * sizeof(float), &tok, &pos, &part));
    if (cu->enc_seg) {
        encoder_dwte_seg_kernel<<<(unsigned)n_seg, block_threads, 0, cu->stream>>>(
            dwte, (float *)part, dout, tok, pos, n, C);
        TRY_CUDA_LAUNCH();
        encoder_dwte_join_kernel<<<(unsigned)n_seg, block_threads, 0, cu->stream>>>(
            dwte, (const float *)part, tok, n, C);
    } else {
        encoder_dwte_kernel<<<(unsigned)n, block_threads, 0, cu->stream>>>(dwte, dout, tok, pos, n,
                                                                           C);
    }
    TRY_CUDA_LAUNCH();
    size_t tc = (size_t)T * C;
    encoder_dwpe_kernel<<<grid_blocks(tc), block_threads, 0, cu->stream>>>(dwpe, dout, B, tc);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------------- */

static ddp_status cuda_layernorm_fwd(const ops_handle *ops, ddp_dtype act, void *out,
                                     float *mean, float *rstd, const float *x, const float *w,
                                     const float *b, int rows, int C)
{
    cuda_state *cu = cuda_of(ops);
    bool empty;
    if (!sizes_ok("layernorm_fwd", rows, C, 1, &empty) || !act_ok("layernorm_fwd", act))
        return DDP_ERR_INVALID_ARG;
    if (empty)
        return DDP_OK;
    unsigned grid = row_blocks((size_t)rows), threads = ROWS_PER_BLOCK * WARP;
    if (act == DDP_FP32)
        layernorm_fwd_kernel<<<grid, threads, 0, cu->stream>>>((float *)out, mean, rstd, x, w, b,
                                                               rows, C);
    else
        layernorm_fwd_kernel<<<grid, threads, 0, cu->stream>>>((uint16_t *)out, mean, rstd, x, w,
                                                               b, rows, C);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_add_layernorm_fwd(const ops_handle *ops, ddp_dtype act, float *y,
                                         const float *a, const void *pb, void *out, float *mean,
                                         float *rstd, const float *w, const float *b, int rows,
                                         int C)
{
    cuda_state *cu = cuda_of(ops);
    bool empty;
    if (!sizes_ok("add_layernorm_fwd", rows, C, 1, &empty) || !act_ok("add_layernorm_fwd", act))
        return DDP_ERR_INVALID_ARG;
    if (empty)
        return DDP_OK;
    unsigned grid = row_blocks((size_t)rows), threads = ROWS_PER_BLOCK * WARP;
    if (act == DDP_FP32)
        add_layernorm_fwd_kernel<<<grid, threads, 0, cu->stream>>>(
            (float *)out, mean, rstd, y, a, (const float *)pb, w, b, rows, C);
    else
        add_layernorm_fwd_kernel<<<grid, threads, 0, cu->stream>>>(
            (uint16_t *)out, mean, rstd, y, a, (const uint16_t *)pb, w, b, rows, C);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* dw, db += their sums over the rows, in two deterministic steps: per chunk of rows (at most
 * 1024 chunks, in the handle's LayerNorm scratch), then over the chunks. */
template <typename D>
static ddp_status layernorm_params(const ops_handle *ops, float *dw, float *db, const D *dout,
                                   const float *x, const float *mean, const float *rstd, int rows,
                                   int C)
{
    cuda_state *cu = cuda_of(ops);
    int chunk_rows = rows / 1024 + 1 > 32 ? rows / 1024 + 1 : 32;
    int n_chunks = (rows + chunk_rows - 1) / chunk_rows;
    void *scratch = NULL;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_LAYERNORM, 2 * (size_t)n_chunks * C * sizeof(float),
                        &scratch));
    float *part_w = (float *)scratch, *part_b = part_w + (size_t)n_chunks * C;
    dim3 grid(grid_blocks((size_t)C), (unsigned)n_chunks);
    layernorm_param_part_kernel<<<grid, block_threads, 0, cu->stream>>>(
        part_w, part_b, dout, x, mean, rstd, rows, C, chunk_rows);
    TRY_CUDA_LAUNCH();
    layernorm_param_sum_kernel<<<grid_blocks((size_t)C), block_threads, 0, cu->stream>>>(
        dw, db, part_w, part_b, n_chunks, C);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* layernorm_bwd with dout and dx_act in D: the fused kernel, then the partial sums over the
 * blocks in block order (layernorm_param_sum_kernel); or, for rows too wide for the device's
 * shared memory per block (2 LN_BWD_WARPS C floats: d12's 768 take 48 KiB, d48's 1600 100 KiB,
 * more than sm_86's 99) or with DDP_LN_BWD_FUSED=0 (run 4's path), layernorm_dx_kernel and
 * layernorm_params. */
template <typename D>
static ddp_status layernorm_bwd_as(const ops_handle *ops, float *dx, D *dx_act, float *dw,
                                   float *db, const D *dout, const float *x, const float *w,
                                   const float *mean, const float *rstd, int rows, int C)
{
    cuda_state *cu = cuda_of(ops);
    size_t smem = 2 * LN_BWD_WARPS * (size_t)C * sizeof(float);
    if (cu->ln_bwd_fused && dev_ln_bwd_fused_fits(&cu->lim, LN_BWD_WARPS, C)) {
        int n_blocks = (rows + LN_BWD_ROWS - 1) / LN_BWD_ROWS;
        void *scratch = NULL;
        TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_LAYERNORM, 2 * (size_t)n_blocks * C * sizeof(float),
                            &scratch));
        float *part_w = (float *)scratch, *part_b = part_w + (size_t)n_blocks * C;
        TRY_CUDA(cudaFuncSetAttribute(layernorm_bwd_fused_kernel<D>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        layernorm_bwd_fused_kernel<D><<<(unsigned)n_blocks, LN_BWD_WARPS * WARP, smem,
                                        cu->stream>>>(dx, dx_act, part_w, part_b, dout, x, w,
                                                      mean, rstd, rows, C);
        TRY_CUDA_LAUNCH();
        layernorm_param_sum_kernel<<<grid_blocks((size_t)C), block_threads, 0, cu->stream>>>(
            dw, db, part_w, part_b, n_blocks, C);
        TRY_CUDA_LAUNCH();
        return DDP_OK;
    }
    layernorm_dx_kernel<<<row_blocks((size_t)rows), ROWS_PER_BLOCK * WARP, 0, cu->stream>>>(
        dx, dx_act, dout, x, w, mean, rstd, rows, C);
    TRY_CUDA_LAUNCH();
    return layernorm_params(ops, dw, db, dout, x, mean, rstd, rows, C);
}

static ddp_status cuda_layernorm_bwd(const ops_handle *ops, ddp_dtype act, float *dx,
                                     void *dx_act, float *dw, float *db, const void *dout,
                                     const float *x, const float *w, const float *mean,
                                     const float *rstd, int rows, int C)
{
    bool empty;
    if (!sizes_ok("layernorm_bwd", rows, C, 1, &empty) || !act_ok("layernorm_bwd", act))
        return DDP_ERR_INVALID_ARG;
    if (empty)
        return DDP_OK;
    if (act == DDP_FP32)
        return layernorm_bwd_as(ops, dx, (float *)dx_act, dw, db, (const float *)dout, x, w, mean,
                                rstd, rows, C);
    return layernorm_bwd_as(ops, dx, (uint16_t *)dx_act, dw, db, (const uint16_t *)dout, x, w,
                            mean, rstd, rows, C);
}

/* ---- attention ------------------------------------------------------------------------- */

/* The shapes of one attention call: B * NH (T, hs) heads. */
typedef struct attn_shape {
    int B, T, C, NH, hs;
    size_t n;      /* B * T * C: the elements of q, k, v or out */
    size_t n_rows; /* B * NH * T: the rows of the scores */
    size_t n_att;  /* B * NH * T * T: the scores */
} attn_shape;

/* Checks the sizes (C a multiple of NH, B * NH and T * T within int; otherwise logged, naming
 * op) and fills *s. */
static bool attn_shape_of(const char *op, int B, int T, int C, int NH, attn_shape *s)
{
    if (B < 0 || T < 0 || C < 0 || NH < 1 || C % NH != 0 || (size_t)B * NH > INT_MAX ||
        (size_t)T * T > INT_MAX) {
        DDP_ERROR("cuda %s: B %d, T %d, C %d, NH %d: not C = NH x head size with B NH and T^2 "
                  "within int", op, B, T, C, NH);
        return false;
    }
    size_t rows = (size_t)B * NH * T;
    *s = attn_shape{B, T, C, NH, C / NH, (size_t)B * T * C, rows, rows * T};
    return true;
}

/* Whether attention in precision p with head size hs runs on the fused kernel (cuda_flash.cu):
 * bf16, the handle's choice (ops_cuda_set_attention), a head size the kernel takes. */
static bool use_flash(const cuda_state *cu, ddp_dtype p, int hs, int T)
{
    return p == DDP_BF16 && cu->flash && flash_attn_supported(hs, T);
}

/* One column-major strided-batched GEMM over the B * NH heads, beta 0, fp32 output, A and B of
 * type ab: bf16 on tensor cores with fp32 accumulation, or fp32 (exact, or TF32 under --tf32).
 * See the callers for the row-major products they compute. */
static ddp_status heads_gemm(cuda_state *cu, const attn_shape *s, cudaDataType ab, bool trans_a,
                             bool trans_b, int m, int n, int k, float alpha, const void *a,
                             int lda, long long stride_a, const void *b, int ldb,
                             long long stride_b, float *c, int ldc, long long stride_c)
{
    const float beta = 0.0f;
    cublasComputeType_t compute = ab == CUDA_R_16BF || !cu->tf32 ? CUBLAS_COMPUTE_32F
                                                                  : CUBLAS_COMPUTE_32F_FAST_TF32;
    TRY_CUBLAS(cublasGemmStridedBatchedEx(
        cu->cublas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m,
        n, k, &alpha, a, ab, lda, stride_a, b, ab, ldb, stride_b, &beta, c, CUDA_R_32F, ldc,
        stride_c, s->B * s->NH, compute, CUBLAS_GEMM_DEFAULT));
    return DDP_OK;
}

/* Row-major per head: c (T, T) = alpha * x (T, hs) y^T (T, hs), i.e. column-major c^T = y x^T. */
static ddp_status heads_xyt(cuda_state *cu, const attn_shape *s, cudaDataType ab, float alpha,
                            const void *x, const void *y, float *c)
{
    long long th = (long long)s->T * s->hs, tt = (long long)s->T * s->T;
    return heads_gemm(cu, s, ab, true, false, s->T, s->T, s->hs, alpha, y, s->hs, th, x, s->hs,
                      th, c, s->T, tt);
}

/* Row-major per head: c (T, hs) = p (T, T) x (T, hs), i.e. column-major c^T = x^T p^T. */
static ddp_status heads_px(cuda_state *cu, const attn_shape *s, cudaDataType ab, const void *p,
                           const void *x, float *c)
{
    long long th = (long long)s->T * s->hs, tt = (long long)s->T * s->T;
    return heads_gemm(cu, s, ab, false, false, s->hs, s->T, s->T, 1.0f, x, s->hs, th, p, s->T,
                      tt, c, s->hs, th);
}

/* Row-major per head: c (T, hs) = p^T (T, T) x (T, hs), i.e. column-major c^T = x^T p. */
static ddp_status heads_ptx(cuda_state *cu, const attn_shape *s, cudaDataType ab, const void *p,
                            const void *x, float *c)
{
    long long th = (long long)s->T * s->hs, tt = (long long)s->T * s->T;
    return heads_gemm(cu, s, ab, false, true, s->hs, s->T, s->T, 1.0f, x, s->hs, th, p, s->T,
                      tt, c, s->hs, th);
}

/* Whether the rows (stride elements apart, starting at p) of heads of hs elements can be moved four
 * elements at a time: 16-byte aligned, and n / 4 within 32 bits. */
static bool heads_vec4(const attn_shape *s, const void *p, int stride)
{
    return s->hs % 4 == 0 && stride % 4 == 0 && ((uintptr_t)p & 15) == 0 &&
           s->n / 4 <= UINT_MAX;
}

/* dst (B, NH, T, hs; float or bf16) = the heads of src's rows (stride elements apart; float or
 * bf16: from bf16 to bf16 a permutation). */
template <typename D, typename S>
static ddp_status heads_split(cuda_state *cu, const attn_shape *s, D *dst, const S *src,
                              int stride)
{
    if (heads_vec4(s, src, stride))
        heads_split4_kernel<D, S><<<grid_blocks(s->n / 4), block_threads, 0, cu->stream>>>(
            dst, src, stride, s->T, s->NH, s->hs, (unsigned)(s->n / 4));
    else
        heads_split_kernel<D, S><<<grid_blocks(s->n), block_threads, 0, cu->stream>>>(
            dst, src, stride, s->T, s->NH, s->hs, s->n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* dst's rows (stride elements apart; float or bf16) = the heads of src (B, NH, T, hs; float)
 * side by side. */
template <typename D>
static ddp_status heads_merge(cuda_state *cu, const attn_shape *s, D *dst, const float *src,
                              int stride)
{
    if (heads_vec4(s, dst, stride) && ((uintptr_t)src & 15) == 0)
        heads_merge4_kernel<D><<<grid_blocks(s->n / 4), block_threads, 0, cu->stream>>>(
            dst, src, stride, s->T, s->NH, s->hs, (unsigned)(s->n / 4));
    else
        heads_merge_kernel<D><<<grid_blocks(s->n), block_threads, 0, cu->stream>>>(
            dst, src, stride, s->T, s->NH, s->hs, s->n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* q, k, v (B, NH, T, hs) each, from qkv (B, T, 3C; S: float or bf16). */
template <typename D, typename S>
static ddp_status split_qkv(cuda_state *cu, const attn_shape *s, D *q, D *k, D *v,
                            const S *qkv)
{
    TRY_OK(heads_split(cu, s, q, qkv, 3 * s->C));
    TRY_OK(heads_split(cu, s, k, qkv + s->C, 3 * s->C));
    return heads_split(cu, s, v, qkv + 2 * s->C, 3 * s->C);
}

/* dqkv (B, T, 3C; float or bf16) from dq, dk, dv (B, NH, T, hs) each. */
template <typename D>
static ddp_status merge_dqkv(cuda_state *cu, const attn_shape *s, D *dqkv, const float *dq,
                             const float *dk, const float *dv)
{
    TRY_OK(heads_merge(cu, s, dqkv, dq, 3 * s->C));
    TRY_OK(heads_merge(cu, s, dqkv + s->C, dk, 3 * s->C));
    return heads_merge(cu, s, dqkv + 2 * s->C, dv, 3 * s->C);
}

/* n_bytes rounded up to 256, so that buffers carved one after another stay aligned. */
static size_t round256(size_t n_bytes) { return (n_bytes + 255) / 256 * 256; }

/* The handle's attention scratch, at least n_bytes. */
static ddp_status attn_scratch(const ops_handle *ops, size_t n_bytes, char **out)
{
    void *p = NULL;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_ATTENTION, n_bytes, &p));
    *out = (char *)p;
    return DDP_OK;
}

/* The materialised path: scores (B, NH, T, T) in att, softmax in place, then att v. In bf16 the
 * GEMMs read bf16 q, k, v and a bf16 copy of the probabilities (fp32 accumulation). qkv and out
 * in A (float or bf16). */
template <typename A>
static ddp_status attention_fwd_materialized(const ops_handle *ops, const attn_shape *s,
                                             ddp_dtype p, A *out, float *att, const A *qkv)
{
    cuda_state *cu = cuda_of(ops);
    bool bf = p == DDP_BF16;
    cudaDataType ab = bf ? CUDA_R_16BF : CUDA_R_32F;
    size_t h = round256(s->n * (bf ? 2 : 4)), y_bytes = round256(s->n * sizeof(float));
    char *w = NULL;
    TRY_OK(attn_scratch(ops, 3 * h + y_bytes + (bf ? round256(s->n_att * 2) : 0), &w));
    void *q = w, *k = w + h, *v = w + 2 * h;
    float *y = (float *)(w + 3 * h); /* (B, NH, T, hs): att v */
    uint16_t *p16 = bf ? (uint16_t *)(w + 3 * h + y_bytes) : NULL;
    if (bf)
        TRY_OK(split_qkv(cu, s, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, qkv));
    else
        TRY_OK(split_qkv(cu, s, (float *)q, (float *)k, (float *)v, qkv));
    TRY_OK(heads_xyt(cu, s, ab, 1.0f / sqrtf((float)s->hs), q, k, att));
    causal_softmax_kernel<<<row_blocks(s->n_rows), ROWS_PER_BLOCK * WARP, 0, cu->stream>>>(
        att, p16, s->n_rows, s->T);
    TRY_CUDA_LAUNCH();
    TRY_OK(heads_px(cu, s, ab, bf ? (const void *)p16 : att, v, y));
    return heads_merge(cu, s, out, y, s->C);
}

/* The fused kernels' bf16 q, k, v and where their rows lie (cuda_flash.h). */
struct flash_qkv {
    const uint16_t *q, *k, *v;
    flash_layout rows;
};

/* From bf16 qkv: read in place, rows of 3C with the heads side by side (w unused). */
static ddp_status flash_inputs(cuda_state *cu, const attn_shape *s, const uint16_t *qkv, char *w,
                               size_t h, flash_qkv *in)
{
    (void)cu, (void)w, (void)h;
    *in = flash_qkv{qkv, qkv + s->C, qkv + 2 * (size_t)s->C, flash_layout{3 * s->C, s->NH}};
    return DDP_OK;
}

/* From fp32 qkv: its heads split into bf16 copies, h bytes each, at w. */
static ddp_status flash_inputs(cuda_state *cu, const attn_shape *s, const float *qkv, char *w,
                               size_t h, flash_qkv *in)
{
    uint16_t *q = (uint16_t *)w, *k = (uint16_t *)(w + h), *v = (uint16_t *)(w + 2 * h);
    TRY_OK(split_qkv(cu, s, q, k, v, qkv));
    *in = flash_qkv{q, k, v, flash_layout{s->hs, 1}};
    return DDP_OK;
}

/* The backward's bf16 dout and its rows: bf16 dout read in place (rows of C); fp32 dout split
 * into bf16 heads at buf. */
static ddp_status flash_dout(cuda_state *cu, const attn_shape *s, const uint16_t *dout,
                             uint16_t *buf, const uint16_t **out, flash_layout *rows)
{
    (void)cu, (void)buf;
    *out = dout;
    *rows = flash_layout{s->C, s->NH};
    return DDP_OK;
}

static ddp_status flash_dout(cuda_state *cu, const attn_shape *s, const float *dout,
                             uint16_t *buf, const uint16_t **out, flash_layout *rows)
{
    TRY_OK(heads_split(cu, s, buf, dout, s->C));
    *out = buf;
    *rows = flash_layout{s->hs, 1};
    return DDP_OK;
}

/* A bf16 activation buffer as the fused kernels' bf16 output; NULL for fp32 ones. */
static uint16_t *bf16_rows(uint16_t *p) { return p; }
static uint16_t *bf16_rows(float *p) { (void)p; return NULL; }

/* cuDNN's fused attention (DDP_CUDA_ATTENTION=cudnn) with bf16 activations: att's o part keeps a
 * bf16 copy of out (the backward's o), its log-sum-exp part cuDNN's statistics (the same
 * quantity in natural-log units, not the kernels': the two paths' states do not mix). */
static bool use_cudnn(const cuda_state *cu, const attn_shape *s, const uint16_t *)
{
    return cu->cudnn_attention && s->T > 1; /* cuDNN has no engine for T 1 (s_q = s_kv = 1) */
}
static bool use_cudnn(const cuda_state *, const attn_shape *, const float *) { return false; }

static ddp_status attention_fwd_cudnn(const ops_handle *ops, const attn_shape *s, uint16_t *out,
                                      float *att, const uint16_t *qkv)
{
#if HAVE_CUDNN
    cuda_state *cu = cuda_of(ops);
    TRY_OK(cudnn_attention_fwd(ops, s->B, s->T, s->NH, s->hs, qkv, out, att + s->n,
                               1.0f / sqrtf((float)s->hs)));
    TRY_CUDA(cudaMemcpyAsync(att, out, s->n * sizeof *out, cudaMemcpyDeviceToDevice, cu->stream));
    return DDP_OK;
#else
    (void)ops, (void)s, (void)out, (void)att, (void)qkv;
    return DDP_ERR_UNSUPPORTED;
#endif
}
static ddp_status attention_fwd_cudnn(const ops_handle *, const attn_shape *, float *, float *,
                                      const float *)
{
    return DDP_ERR_UNSUPPORTED;
}

/* The fused path: att keeps o (B, NH, T, hs) fp32, then the log-sum-exp (B, NH, T). qkv and out
 * in A: bf16 qkv is read in place, and bf16 out written by the kernel in its rows (version 3,
 * unless DDP_FLASH_BF16_OUT=0; else merged from o); fp32 qkv is split into bf16 heads first, and out merged from o. */
template <typename A>
static ddp_status attention_fwd_flash(const ops_handle *ops, const attn_shape *s, A *out,
                                      float *att, const A *qkv)
{
    cuda_state *cu = cuda_of(ops);
    if (use_cudnn(cu, s, qkv))
        return attention_fwd_cudnn(ops, s, out, att, qkv);
    size_t h = sizeof(A) == sizeof(float) ? round256(s->n * 2) : 0; /* the bf16 copies */
    char *w = NULL;
    if (h)
        TRY_OK(attn_scratch(ops, 3 * h, &w));
    float *o = att, *lse = att + s->n;
    uint16_t *rows = flash_attn_bf16_out() && cu->flash_bf16_out ? bf16_rows(out) : NULL;
    flash_qkv in;
    TRY_OK(flash_inputs(cu, s, qkv, w, h, &in));
    TRY_OK(flash_attn_fwd_rows(cu->stream, in.q, in.k, in.v, in.rows, o, rows,
                               flash_layout{s->C, s->NH}, lse, s->B * s->NH, s->T, s->hs,
                               1.0f / sqrtf((float)s->hs)));
    return rows ? DDP_OK : heads_merge(cu, s, out, o, s->C);
}

/* attention_fwd with qkv and out in A. */
template <typename A>
static ddp_status attention_fwd_as(const ops_handle *ops, const attn_shape *s, ddp_dtype p,
                                   A *out, float *att, const A *qkv)
{
    if (use_flash(cuda_of(ops), p, s->hs, s->T))
        return attention_fwd_flash(ops, s, out, att, qkv);
    return attention_fwd_materialized(ops, s, p, out, att, qkv);
}

static ddp_status cuda_attention_fwd(const ops_handle *ops, ddp_dtype p, ddp_dtype act,
                                     void *out, float *att, const void *qkv, int B, int T, int C,
                                     int NH)
{
    attn_shape s;
    if (!attn_shape_of("attention_fwd", B, T, C, NH, &s) || !act_ok("attention_fwd", act))
        return DDP_ERR_INVALID_ARG;
    if (s.n == 0)
        return DDP_OK;
    if (act == DDP_FP32)
        return attention_fwd_as(ops, &s, p, (float *)out, att, (const float *)qkv);
    return attention_fwd_as(ops, &s, p, (uint16_t *)out, att, (const uint16_t *)qkv);
}

/* The materialised backward: datt = dout v^T, dv = att^T dout, the softmax's backward in place,
 * dq = datt k, dk = datt^T q. In bf16 the GEMMs read bf16 copies (p16 holds the probabilities
 * for dv, then the scores' gradient). dqkv, dout and qkv in A. */
template <typename A>
static ddp_status attention_bwd_materialized(const ops_handle *ops, const attn_shape *s,
                                             ddp_dtype p, A *dqkv, float *datt, const A *dout,
                                             const A *qkv, const float *att)
{
    cuda_state *cu = cuda_of(ops);
    bool bf = p == DDP_BF16;
    cudaDataType ab = bf ? CUDA_R_16BF : CUDA_R_32F;
    size_t h = round256(s->n * (bf ? 2 : 4)), f = round256(s->n * sizeof(float));
    char *w = NULL;
    TRY_OK(attn_scratch(ops, 4 * h + 3 * f + (bf ? round256(s->n_att * 2) : 0), &w));
    void *q = w, *k = w + h, *v = w + 2 * h, *dy = w + 3 * h; /* dy: dout's heads */
    float *dq = (float *)(w + 4 * h), *dk = (float *)(w + 4 * h + f);
    float *dv = (float *)(w + 4 * h + 2 * f);
    uint16_t *p16 = bf ? (uint16_t *)(w + 4 * h + 3 * f) : NULL;
    if (bf) {
        TRY_OK(split_qkv(cu, s, (uint16_t *)q, (uint16_t *)k, (uint16_t *)v, qkv));
        TRY_OK(heads_split(cu, s, (uint16_t *)dy, dout, s->C));
        TRY_OK(ops->cast(ops, DDP_BF16, p16, DDP_FP32, att, s->n_att));
    } else {
        TRY_OK(split_qkv(cu, s, (float *)q, (float *)k, (float *)v, qkv));
        TRY_OK(heads_split(cu, s, (float *)dy, dout, s->C));
    }
    TRY_OK(heads_xyt(cu, s, ab, 1.0f, dy, v, datt));
    TRY_OK(heads_ptx(cu, s, ab, bf ? (const void *)p16 : att, dy, dv));
    causal_softmax_bwd_kernel<<<row_blocks(s->n_rows), ROWS_PER_BLOCK * WARP, 0, cu->stream>>>(
        datt, p16, att, s->n_rows, s->T, 1.0f / sqrtf((float)s->hs));
    TRY_CUDA_LAUNCH();
    const void *ds = bf ? (const void *)p16 : datt;
    TRY_OK(heads_px(cu, s, ab, ds, k, dq));
    TRY_OK(heads_ptx(cu, s, ab, ds, q, dk));
    return merge_dqkv(cu, s, dqkv, dq, dk, dv);
}

/* cuDNN's backward from the forward's bf16 o and statistics in att (attention_fwd_cudnn), with
 * rowsum(dout o) in the attention scratch, and dq's fp32 accumulator there too in the form
 * DDP_CUDNN_DETERMINISTIC=0 asks for. */
static ddp_status attention_bwd_cudnn(const ops_handle *ops, const attn_shape *s, uint16_t *dqkv,
                                      const uint16_t *dout, const uint16_t *qkv, const float *att)
{
#if HAVE_CUDNN
    bool acc = !cuda_of(ops)->cudnn_det;
    size_t r = round256(s->n_rows * sizeof(float));
    char *w = NULL;
    TRY_OK(attn_scratch(ops, r + (acc ? round256(s->n * sizeof(float)) : 0), &w));
    return cudnn_attention_bwd(ops, s->B, s->T, s->NH, s->hs, qkv, (const uint16_t *)att, dout,
                               att + s->n, dqkv, (float *)w, acc ? (float *)(w + r) : NULL,
                               1.0f / sqrtf((float)s->hs));
#else
    (void)ops, (void)s, (void)dqkv, (void)dout, (void)qkv, (void)att;
    return DDP_ERR_UNSUPPORTED;
#endif
}
static ddp_status attention_bwd_cudnn(const ops_handle *, const attn_shape *, float *,
                                      const float *, const float *, const float *)
{
    return DDP_ERR_UNSUPPORTED;
}

/* The fused backward from att's o and log-sum-exp: delta = rowsum(dout o), then the kernels
 * recompute the probabilities tile by tile. dqkv, dout and qkv in A. bf16 ones are read in place
 * and, with version 3 (unless DDP_FLASH_BF16_OUT=0), dqkv written by the kernels in its rows
 * (dqkv must not overlap dout or qkv: the kernels read those while others write); otherwise fp32
 * ones are split into bf16 heads, delta read from fp32 heads of dout and dqkv merged from fp32
 * dq, dk, dv. */
template <typename A>
static ddp_status attention_bwd_flash(const ops_handle *ops, const attn_shape *s, A *dqkv,
                                      const A *dout, const A *qkv, const float *att)
{
    cuda_state *cu = cuda_of(ops);
    if (use_cudnn(cu, s, qkv))
        return attention_bwd_cudnn(ops, s, dqkv, dout, qkv, att);
    uint16_t *rows = flash_attn_bf16_out() && cu->flash_bf16_out ? bf16_rows(dqkv) : NULL;
    size_t h = sizeof(A) == sizeof(float) ? round256(s->n * 2) : 0; /* the bf16 copies */
    size_t f = rows ? 0 : round256(s->n * sizeof(float)), r = round256(s->n_rows * sizeof(float));
    char *w = NULL;
    TRY_OK(attn_scratch(ops, 4 * h + 4 * f + r, &w));
    float *dy = (float *)(w + 4 * h), *dq = (float *)(w + 4 * h + f);
    float *dk = (float *)(w + 4 * h + 2 * f), *dv = (float *)(w + 4 * h + 3 * f);
    float *delta = (float *)(w + 4 * h + 4 * f);
    const float *o = att, *lse = att + s->n;
    int bh = s->B * s->NH;
    float scale = 1.0f / sqrtf((float)s->hs);
    flash_qkv in;
    const uint16_t *dy16;
    flash_layout dy_rows;
    TRY_OK(flash_inputs(cu, s, qkv, w, h, &in));
    TRY_OK(flash_dout(cu, s, dout, (uint16_t *)(w + 3 * h), &dy16, &dy_rows));
    if (rows) {
        flash_layout L = {3 * s->C, s->NH};
        TRY_OK(flash_attn_delta_rows(cu->stream, dy16, dy_rows, o, delta, bh, s->T, s->hs));
        return flash_attn_bwd_rows(cu->stream, in.q, in.k, in.v, in.rows, dy16, dy_rows, lse,
                                   delta, flash_out{NULL, rows, L},
                                   flash_out{NULL, rows + s->C, L},
                                   flash_out{NULL, rows + 2 * (size_t)s->C, L}, bh, s->T, s->hs,
                                   scale);
    }
    flash_layout heads = {s->hs, 1};
    TRY_OK(heads_split(cu, s, dy, dout, s->C));
    TRY_OK(flash_attn_delta(cu->stream, dy, o, delta, bh, s->T, s->hs));
    TRY_OK(flash_attn_bwd_rows(cu->stream, in.q, in.k, in.v, in.rows, dy16, dy_rows, lse, delta,
                               flash_out{dq, NULL, heads}, flash_out{dk, NULL, heads},
                               flash_out{dv, NULL, heads}, bh, s->T, s->hs, scale));
    return merge_dqkv(cu, s, dqkv, dq, dk, dv);
}

/* attention_bwd with dqkv, dout and qkv in A. */
template <typename A>
static ddp_status attention_bwd_as(const ops_handle *ops, const attn_shape *s, ddp_dtype p,
                                   A *dqkv, float *datt, const A *dout, const A *qkv,
                                   const float *att)
{
    if (use_flash(cuda_of(ops), p, s->hs, s->T))
        return attention_bwd_flash(ops, s, dqkv, dout, qkv, att);
    return attention_bwd_materialized(ops, s, p, dqkv, datt, dout, qkv, att);
}

static ddp_status cuda_attention_bwd(const ops_handle *ops, ddp_dtype p, ddp_dtype act,
                                     void *dqkv, float *datt, const void *dout, const void *qkv,
                                     const float *att, int B, int T, int C, int NH)
{
    attn_shape s;
    if (!attn_shape_of("attention_bwd", B, T, C, NH, &s) || !act_ok("attention_bwd", act))
        return DDP_ERR_INVALID_ARG;
    if (s.n == 0)
        return DDP_OK;
    if (act == DDP_FP32)
        return attention_bwd_as(ops, &s, p, (float *)dqkv, datt, (const float *)dout,
                                (const float *)qkv, att);
    return attention_bwd_as(ops, &s, p, (uint16_t *)dqkv, datt, (const uint16_t *)dout,
                            (const uint16_t *)qkv, att);
}

/* The materialised path keeps the probabilities (B, NH, T, T); the fused one its output
 * (B, NH, T, hs) and log-sum-exp (B, NH, T). */
static size_t cuda_attention_floats(const ops_handle *ops, ddp_dtype p, int B, int T, int C,
                                    int NH)
{
    if (B < 0 || T < 0 || C < 0 || NH < 1 || C % NH != 0)
        return 0;
    size_t rows = (size_t)B * NH * T;
    return use_flash(cuda_of(ops), p, C / NH, T) ? rows * (C / NH + 1) : rows * T;
}

/* ---- elementwise, cross-entropy, AdamW ------------------------------------------------- */

/* Whether n bf16 elements at a, b, c can go eight at a time: n a multiple of 8, the pointers
 * 16-byte aligned. */
static bool vec8(size_t n, const void *a, const void *b, const void *c)
{
    return n % 8 == 0 && (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

static ddp_status cuda_gelu_fwd(const ops_handle *ops, ddp_dtype act, void *y, const void *x,
                                size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (!act_ok("gelu_fwd", act))
        return DDP_ERR_INVALID_ARG;
    if (n == 0)
        return DDP_OK;
    if (act == DDP_FP32)
        gelu_fwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
            (float *)y, (const float *)x, n);
    else if (vec8(n, y, x, x))
        gelu_fwd8_kernel<<<grid_blocks(n / 8), block_threads, 0, cu->stream>>>(
            (uint16_t *)y, (const uint16_t *)x, n / 8);
    else
        gelu_fwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
            (uint16_t *)y, (const uint16_t *)x, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_gelu_bwd(const ops_handle *ops, ddp_dtype act, void *dx, const void *x,
                                const void *dy, size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (!act_ok("gelu_bwd", act))
        return DDP_ERR_INVALID_ARG;
    if (n == 0)
        return DDP_OK;
    if (act == DDP_FP32)
        gelu_bwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
            (float *)dx, (const float *)x, (const float *)dy, n);
    else if (vec8(n, dx, x, dy))
        gelu_bwd8_kernel<<<grid_blocks(n / 8), block_threads, 0, cu->stream>>>(
            (uint16_t *)dx, (const uint16_t *)x, (const uint16_t *)dy, n / 8);
    else
        gelu_bwd_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
            (uint16_t *)dx, (const uint16_t *)x, (const uint16_t *)dy, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_add(const ops_handle *ops, ddp_dtype act, float *y, const float *a,
                           const void *b, size_t n)
{
    cuda_state *cu = cuda_of(ops);
    if (!act_ok("add", act))
        return DDP_ERR_INVALID_ARG;
    if (n == 0)
        return DDP_OK;
    if (act == DDP_FP32)
        add_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(y, a, (const float *)b, n);
    else if (vec8(n, y, a, b))
        add8_kernel<<<grid_blocks(n / 8), block_threads, 0, cu->stream>>>(y, a,
                                                                          (const uint16_t *)b,
                                                                          n / 8);
    else
        add_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(y, a, (const uint16_t *)b,
                                                                     n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_xent_fwd_bwd(const ops_handle *ops, ddp_dtype act, void *dlogits,
                                    float *losses, const void *logits, const int *targets,
                                    int rows, int V, int Vp, float dscale)
{
    cuda_state *cu = cuda_of(ops);
    if (rows < 0 || V < 1 || Vp < V) {
        DDP_ERROR("cuda xent_fwd_bwd: %d rows of %d padded to %d", rows, V, Vp);
        return DDP_ERR_INVALID_ARG;
    }
    if (!act_ok("xent_fwd_bwd", act))
        return DDP_ERR_INVALID_ARG;
    if (rows == 0)
        return DDP_OK;
    uintptr_t align = act == DDP_FP32 ? 15 : 7;
    bool vec = Vp % 4 == 0 && ((uintptr_t)logits & align) == 0 && ((uintptr_t)dlogits & align) == 0;
    if (act == DDP_FP32)
        xent_kernel<<<(unsigned)rows, block_threads, 0, cu->stream>>>(
            (float *)dlogits, losses, (const float *)logits, targets, V, Vp, dscale, vec);
    else
        xent_kernel<<<(unsigned)rows, block_threads, 0, cu->stream>>>(
            (uint16_t *)dlogits, losses, (const uint16_t *)logits, targets, V, Vp, dscale, vec);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_adamw_step(const ops_handle *ops, float *w, float *m, float *v,
                                  const float *g, size_t n, float lr, float beta1, float beta2,
                                  float eps, float wd, int t, float grad_scale,
                                  const float *grad_scale_dev)
{
    cuda_state *cu = cuda_of(ops);
    if (t < 1) {
        DDP_ERROR("cuda adamw_step: step %d (steps count from 1)", t);
        return DDP_ERR_INVALID_ARG;
    }
    if (n == 0)
        return DDP_OK;
    float bc1, bc2;
    adamw_bias_corrections(beta1, beta2, t, &bc1, &bc2);
    adamw_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
        w, m, v, g, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale, grad_scale_dev);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* bf16 in one launch (adamw_bf16_kernel); fp16 (emulated, float storage) casts after. */
static ddp_status cuda_adamw_step_cast(const ops_handle *ops, float *w, float *m, float *v,
                                       const float *g, size_t n, float lr, float beta1,
                                       float beta2, float eps, float wd, int t, float grad_scale,
                                       const float *grad_scale_dev, ddp_dtype p, void *wc,
                                       uint32_t seed, size_t index0)
{
    cuda_state *cu = cuda_of(ops);
    if (p != DDP_BF16) {
        TRY_OK(cuda_adamw_step(ops, w, m, v, g, n, lr, beta1, beta2, eps, wd, t, grad_scale,
                               grad_scale_dev));
        return p == DDP_FP32 ? DDP_OK : ops->cast(ops, p, wc, DDP_FP32, w, n);
    }
    if (t < 1) {
        DDP_ERROR("cuda adamw_step_cast: step %d (steps count from 1)", t);
        return DDP_ERR_INVALID_ARG;
    }
    if (n == 0)
        return DDP_OK;
    float bc1, bc2;
    adamw_bias_corrections(beta1, beta2, t, &bc1, &bc2);
    adamw_bf16_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
        w, m, v, g, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale, grad_scale_dev,
        (uint16_t *)wc, sr_key(seed, (uint32_t)t), index0);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

static ddp_status cuda_cast_stochastic(const ops_handle *ops, ddp_dtype p, void *dst,
                                       const float *src, size_t n, uint32_t seed, uint32_t step,
                                       size_t index0)
{
    cuda_state *cu = cuda_of(ops);
    if (p != DDP_BF16)
        return ops->cast(ops, p, dst, DDP_FP32, src, n);
    if (n == 0)
        return DDP_OK;
    cast_bf16_sr_kernel<<<grid_blocks(n), block_threads, 0, cu->stream>>>(
        (uint16_t *)dst, src, n, sr_key(seed, step), index0);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

void cuda_gpt_ops(ops_handle *ops)
{
    ops->encoder_fwd = cuda_encoder_fwd;
    ops->encoder_bwd = cuda_encoder_bwd;
    ops->layernorm_fwd = cuda_layernorm_fwd;
    ops->layernorm_bwd = cuda_layernorm_bwd;
    ops->attention_fwd = cuda_attention_fwd;
    ops->attention_bwd = cuda_attention_bwd;
    ops->attention_floats = cuda_attention_floats;
    ops->add_layernorm_fwd = cuda_add_layernorm_fwd;
    ops->gelu_fwd = cuda_gelu_fwd;
    ops->gelu_bwd = cuda_gelu_bwd;
    ops->add = cuda_add;
    ops->xent_fwd_bwd = cuda_xent_fwd_bwd;
    ops->adamw_step = cuda_adamw_step;
    ops->adamw_step_cast = cuda_adamw_step_cast;
    ops->cast_stochastic = cuda_cast_stochastic;
}
