/* cuda_flash.cu - causal attention in the FlashAttention-2 manner (cuda_flash.h): bf16 WMMA tensor
 * cores (16 x 16 x 16 fragments, fp32 accumulators) on 64 x 64 tiles staged in shared memory; the
 * T x T score matrix is never stored. Head size 64 only.
 *
 * Forward: one block of 4 warps per (head, 64-query tile); each warp owns 16 query rows. Over the
 * key tiles up to the diagonal: S = Q K^T into shared fp32, the online softmax per row (running
 * max m and sum l, log2 units, exp2f), P in bf16, the row's O (shared fp32) rescaled by
 * exp2(m_old - m_new), then O += P V. At the end o = O / l and lse = (m + log2 l) ln 2.
 *
 * Forward, version 2 (flash_fwd2_kernel, the default; flash_attn_set_impl): the same tiles and
 * online softmax, but on mma.sync m16n8k16 (inline PTX): each warp keeps its 16 rows' Q (A
 * fragments), S and P (16 x 64) and O (16 x 64) in registers; only K and V go through shared memory.
 * Versions 2 and 3 double-buffer the tiles they stream (the next one is copied while the warps
 * compute on the current), by cp.async, and load their mma.sync fragments from shared memory
 * with ldmatrix (flash_attn_set_loads, DDP_FLASH_LOADS: the same operands and sums either way, so
 * bit for bit the same results).
 * Backward, version 2 (flash_bwd_kv2_kernel, flash_bwd_q2_kernel; implementation 3, the default
 * since it passed flash_check on an H100, 2026-11-27): the same two kernels in that style, S, dP, P, dS and the dK, dV, dQ accumulators
 * in registers.
 *
 * Backward (no atomics; each output element is written by one block, sums in a fixed order):
 *   flash_bwd_kv_kernel, one block per (head, 64-key tile), looping over the query tiles at or
 *     after it: S^T = K Q^T, dP^T = V dO^T, P = exp2(S scale log2e - lse log2e), dS = P (dP - delta),
 *     dV += P^T dO, dK += dS^T Q (register fragments); dk = scale dK.
 *   flash_bwd_q_kernel, one block per (head, 64-query tile), looping over the key tiles up to the
 *     diagonal: S = Q K^T, dP = dO V^T, P and dS as above, dQ += dS K; dq = scale dQ.
 * Rows and keys past T are zero in shared memory and masked out (P = 0); nothing past T is read or
 * written in global memory. Every key tile a query tile visits holds key k0 <= t for each of its
 * rows t (padding rows included), so the running max is finite after the first tile.
 *
 * The bf16 inputs are read where their rows lie (flash_layout): contiguous heads, or the model's
 * qkv and dout rows with the heads side by side, so that bf16 activations need no head split.
 * Version 3 also writes o, dq, dk and dv in bf16 where the model's rows want them (flash_out),
 * each value the fp32 one rounded once, so that no merge of the heads follows; the forward keeps
 * fp32 o beside it for delta, which flash_attn_delta_rows reads with bf16 dout in its rows.
 *
 * Two sections: kernels, then launchers; every launcher runs on the stream it is given and ends
 * with a cudaGetLastError check.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <mma.h>

#include "cuda_flash.h"
#include "half.h"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

enum {
    HS = 64,              /* the head size these kernels take */
    TILE = 64,            /* query rows, and keys, per tile */
    WARPS = 4,            /* per block; warp w owns rows 16w..16w+15 of the block's tile */
    THREADS = WARPS * 32,
    FRAG = 16,            /* WMMA's m = n = k */
    LDH = TILE + 8,       /* row stride (elements) of the 64-wide bf16 tiles in shared memory */
    LDF = TILE + 4,       /* row stride (elements) of the 64-wide fp32 tiles */
    MAX_TILES = 65535,    /* gridDim.y's limit */
    DELTA_ROWS = 8        /* rows per block of the delta kernel, one warp each */
};
static_assert(HS == TILE && TILE == WARPS * FRAG, "the tiles are square and one strip per warp");
/* WMMA wants ldm a multiple of 8 (16-bit) or 4 (fp32) and 256-bit aligned fragment pointers:
 * 16 rows of either stride are a multiple of 32 bytes, and so are whole tiles (below). */
static_assert(LDH % 8 == 0 && LDF % 4 == 0, "WMMA leading dimensions");
static_assert((FRAG * LDH * 2) % 32 == 0 && (FRAG * LDF * 4) % 32 == 0, "fragment alignment");

static const float LOG2E = 1.4426950408889634f;
static const float LN2 = 0.6931471805599453f;
static const unsigned FULL_MASK = 0xffffffffu;

/* ================================================================================ kernels == */

typedef wmma::fragment<wmma::matrix_a, FRAG, FRAG, FRAG, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::accumulator, FRAG, FRAG, FRAG, float> frag_c;

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* ---- staging ----------------------------------------------------------------------------- */

/* dst (TILE, LDH) bf16 = src's first TILE rows of HS (ld elements apart), rows at or past n_rows
 * zero. vec: src is 16-byte aligned and ld a multiple of 8 (every row then is aligned). Every
 * thread of the block calls it. */
static __device__ __forceinline__ void load_tile(bf16 *dst, const uint16_t *src, int n_rows,
                                                 bool vec, int ld)
{
    const int chunks = HS / 8; /* 16-byte pieces of a row */
    for (int i = threadIdx.x; i < TILE * chunks; i += THREADS) {
        int r = i / chunks, c = (i % chunks) * 8;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < n_rows) {
            const uint16_t *p = src + (size_t)r * ld + c;
            if (vec) {
                x = *reinterpret_cast<const uint4 *>(p);
            } else {
                uint16_t h[8];
                for (int e = 0; e < 8; e++)
                    h[e] = p[e];
                memcpy(&x, h, sizeof x);
            }
        }
        *reinterpret_cast<uint4 *>(dst + r * LDH + c) = x;
    }
}

/* cp.async (PTX ISA, "cp.async"): 16 bytes from global to shared memory without a trip through
 * registers, the bytes past src_bytes (0 or 16) zero-filled; complete after cp_async_commit and
 * cp_async_wait0 (this thread's copies; a __syncthreads then publishes everyone's). */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

static __device__ __forceinline__ void cp_async_wait0(void)
{
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* load_tile, by cp.async when ASYNC and vec (complete after cp_async_commit and cp_async_wait0;
 * rows past n_rows zero-filled, src itself given as their source address, which reads nothing),
 * else synchronously. */
template <bool ASYNC>
static __device__ __forceinline__ void stage_tile(bf16 *dst, const uint16_t *src, int n_rows,
                                                  bool vec, int ld)
{
    if constexpr (ASYNC) {
        if (vec) {
            const int chunks = HS / 8;
            for (int i = threadIdx.x; i < TILE * chunks; i += THREADS) {
                int r = i / chunks, c = (i % chunks) * 8;
                bool in = r < n_rows;
                cp_async16(dst + r * LDH + c, in ? src + (size_t)r * ld + c : src, in ? 16 : 0);
            }
            return;
        }
    }
    load_tile(dst, src, n_rows, vec, ld);
}

/* How versions 2 and 3 move tiles into shared memory and fragments out of them
 * (flash_attn_set_loads): synchronous copies and a load per fragment register, or cp.async and
 * ldmatrix; the same bits. LOADS_ASYNC3 is LOADS_ASYNC with the dK/dV kernel held to 168
 * registers so that three blocks share an SM instead of two (a few bytes spill on sm_90). */
enum { LOADS_PLAIN = 0, LOADS_ASYNC = 1, LOADS_ASYNC3 = 2 };

/* The offset of row r of head bh = b nh + h in an input or output of layout L. */
static __device__ __forceinline__ size_t row_at(flash_layout L, int T, size_t bh, int r)
{
    size_t b = bh / (unsigned)L.nh, h = bh % (unsigned)L.nh;
    return (b * T + r) * L.ld + h * HS;
}

/* row_at for the block's head (blockIdx.x). */
static __device__ __forceinline__ size_t row_of(flash_layout L, int T, int r)
{
    return row_at(L, T, blockIdx.x, r);
}

/* stage_tile of the TILE rows from row r0 of two inputs (K and V, or Q and dO): a from a (layout
 * la) into da, b likewise into db. */
template <bool ASYNC>
static __device__ __forceinline__ void stage_pair(bf16 *da, const uint16_t *a, flash_layout la,
                                                  bf16 *db, const uint16_t *b, flash_layout lb,
                                                  int r0, int T, bool vec)
{
    stage_tile<ASYNC>(da, a + row_of(la, T, r0), T - r0, vec, la.ld);
    stage_tile<ASYNC>(db, b + row_of(lb, T, r0), T - r0, vec, lb.ld);
}

/* Columns col and col + 1 (col even) of row t of the block's head in d (flash_out) = x0, x1:
 * fp32, or the two rounded to bf16 in one 32-bit store. */
static __device__ __forceinline__ void put_pair(flash_out d, int T, int t, int col, float x0,
                                                float x1)
{
    if (d.f) {
        float *p = d.f + ((size_t)blockIdx.x * T + t) * HS + col;
        p[0] = x0;
        p[1] = x1;
        return;
    }
    uint32_t u = (uint32_t)half_f32_to_bf16(x0) | (uint32_t)half_f32_to_bf16(x1) << 16;
    *reinterpret_cast<uint32_t *>(d.h + row_of(d.L, T, t) + col) = u;
}

/* dst[0..TILE) = mul * src[i] for i < n_rows, 0 past them. Every thread of the block calls it. */
static __device__ __forceinline__ void load_row_values(float *dst, const float *src, int n_rows,
                                                       float mul)
{
    for (int i = threadIdx.x; i < TILE; i += THREADS)
        dst[i] = i < n_rows ? src[i] * mul : 0.0f;
}

/* ---- warp GEMMs on a 16-row strip --------------------------------------------------------- */

/* The four A fragments of a 16 x 64 strip a (row stride LDH). */
static __device__ __forceinline__ void load_a(frag_a fa[4], const bf16 *a)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        wmma::load_matrix_sync(fa[kk], a + kk * FRAG, LDH);
}

/* acc[n] += A (16 x 64, fa) B[:, 16n..16n+15] for a 64 x 64 B in shared memory, row stride LDH:
 * Layout row_major: B(k, n) = b[k * LDH + n]; col_major: B(k, n) = b[n * LDH + k] (b holds B^T). */
template <class Layout>
static __device__ __forceinline__ void mma_strip(frag_c acc[4], const frag_a fa[4], const bf16 *b)
{
    const bool row = std::is_same<Layout, wmma::row_major>::value;
    wmma::fragment<wmma::matrix_b, FRAG, FRAG, FRAG, bf16, Layout> fb;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const bf16 *p = row ? b + kk * FRAG * LDH + n * FRAG : b + n * FRAG * LDH + kk * FRAG;
            wmma::load_matrix_sync(fb, p, LDH);
            wmma::mma_sync(acc[n], fa[kk], fb, acc[n]);
        }
    }
}

/* c (16 x 64 fp32, row stride LDF) = A B, a a 16 x 64 strip (stride LDH), B as in mma_strip. */
template <class Layout>
static __device__ __forceinline__ void gemm_strip(float *c, const bf16 *a, const bf16 *b)
{
    frag_a fa[4];
    frag_c acc[4];
#pragma unroll
    for (int n = 0; n < 4; n++)
        wmma::fill_fragment(acc[n], 0.0f);
    load_a(fa, a);
    mma_strip<Layout>(acc, fa, b);
#pragma unroll
    for (int n = 0; n < 4; n++)
        wmma::store_matrix_sync(c + n * FRAG, acc[n], LDF, wmma::mem_row_major);
}

/* c (16 x 64 fp32, stride LDF) = mul * acc. */
static __device__ __forceinline__ void store_strip(float *c, frag_c acc[4], float mul)
{
#pragma unroll
    for (int n = 0; n < 4; n++) {
        for (int i = 0; i < acc[n].num_elements; i++)
            acc[n].x[i] *= mul;
        wmma::store_matrix_sync(c + n * FRAG, acc[n], LDF, wmma::mem_row_major);
    }
}

/* The rows r0 + r < T of out (rows of HS fp32) = the warp's strip c (16 x 64, stride LDF). */
static __device__ __forceinline__ void write_strip(float *out, const float *c, int r0, int T)
{
    int lane = threadIdx.x % 32;
    for (int r = 0; r < FRAG && r0 + r < T; r++) {
        out[(size_t)(r0 + r) * HS + lane] = c[r * LDF + lane];
        out[(size_t)(r0 + r) * HS + lane + 32] = c[r * LDF + lane + 32];
    }
}

/* ---- forward ------------------------------------------------------------------------------ */

struct fwd_smem {
    float s[TILE * LDF];          /* scores q.k of the key tile (unscaled) */
    float o[TILE * LDF];          /* the output accumulator, unnormalised */
    bf16 q[TILE * LDH], k[TILE * LDH], v[TILE * LDH];
    bf16 p[TILE * LDH];           /* P of the key tile */
};

/* The online-softmax step of the warp's 16 rows (t0 + r) for the key tile at k0: s (stride LDF)
 * holds the raw scores, p (stride LDH) gets exp2(s scale_log2 - m_new) in bf16 (0 for keys j > t),
 * o's rows (stride LDF) are multiplied by exp2(m_old - m_new). Lanes r and r + 16 keep row r's
 * running max m (log2 units) and sum l; lane c handles the keys c and c + 32. */
static __device__ __forceinline__ void softmax_step(const float *s, bf16 *p, float *o, int t0,
                                                    int k0, float scale_log2, float &m, float &l)
{
    int lane = threadIdx.x % 32;
    for (int r = 0; r < FRAG; r++) {
        int t = t0 + r;
        bool ok0 = k0 + lane <= t, ok1 = k0 + lane + 32 <= t;
        float x0 = ok0 ? s[r * LDF + lane] * scale_log2 : -INFINITY;
        float x1 = ok1 ? s[r * LDF + lane + 32] * scale_log2 : -INFINITY;
        float m_old = __shfl_sync(FULL_MASK, m, r), l_old = __shfl_sync(FULL_MASK, l, r);
        float m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1))); /* finite: key k0 <= t */
        float p0 = ok0 ? exp2f(x0 - m_new) : 0.0f, p1 = ok1 ? exp2f(x1 - m_new) : 0.0f;
        float alpha = exp2f(m_old - m_new); /* 0 on the first tile (m_old = -inf) */
        float sum = warp_sum(p0 + p1);
        p[r * LDH + lane] = __float2bfloat16(p0);
        p[r * LDH + lane + 32] = __float2bfloat16(p1);
        o[r * LDF + lane] *= alpha;
        o[r * LDF + lane + 32] *= alpha;
        if (lane % FRAG == r) {
            m = m_new;
            l = l_old * alpha + sum;
        }
    }
}

/* o (16 x 64 fp32, stride LDF) += p (16 x 64 keys, stride LDH) v (64 keys x 64, stride LDH). */
static __device__ __forceinline__ void accumulate_pv(float *o, const bf16 *p, const bf16 *v)
{
    frag_a fa[4];
    frag_c acc[4];
#pragma unroll
    for (int n = 0; n < 4; n++)
        wmma::load_matrix_sync(acc[n], o + n * FRAG, LDF, wmma::mem_row_major);
    load_a(fa, p);
    mma_strip<wmma::row_major>(acc, fa, v);
#pragma unroll
    for (int n = 0; n < 4; n++)
        wmma::store_matrix_sync(o + n * FRAG, acc[n], LDF, wmma::mem_row_major);
}

/* The warp's rows t0 + r < T: out row = o row / l, lse = (m + log2 l) ln 2 (m, l as in
 * softmax_step). */
static __device__ __forceinline__ void finish_rows(float *out, float *lse, const float *o, int t0,
                                                   int T, float m, float l)
{
    int lane = threadIdx.x % 32;
    for (int r = 0; r < FRAG; r++) {
        float mr = __shfl_sync(FULL_MASK, m, r), lr = __shfl_sync(FULL_MASK, l, r);
        int t = t0 + r;
        if (t >= T)
            break;
        float inv = 1.0f / lr;
        out[(size_t)t * HS + lane] = o[r * LDF + lane] * inv;
        out[(size_t)t * HS + lane + 32] = o[r * LDF + lane + 32] * inv;
        if (lane == 0)
            lse[t] = (mr + log2f(lr)) * LN2;
    }
}

/* Grid (BH, query tiles), the longest tiles (nearest the end) first; THREADS threads, dynamic
 * shared memory sizeof(fwd_smem). q, k, v (BH, T, HS) bf16; o (BH, T, HS), lse (BH, T) fp32. */
static __global__ void __launch_bounds__(THREADS)
flash_fwd_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v, float *o, float *lse,
                 int T, float scale_log2, bool vec, flash_layout lq)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    fwd_smem &sm = *reinterpret_cast<fwd_smem *>(smem_raw);
    int qt = (int)(gridDim.y - 1 - blockIdx.y), q0 = qt * TILE;
    int row0 = (int)(threadIdx.x / 32) * FRAG; /* the warp's first row in the tile */
    size_t head = (size_t)blockIdx.x * T;     /* rows before this head's */

    load_tile(sm.q, q + row_of(lq, T, q0), T - q0, vec, lq.ld);
    for (int i = threadIdx.x % 32; i < FRAG * LDF; i += 32)
        sm.o[row0 * LDF + i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * TILE;
        __syncthreads(); /* every warp is done with the previous K and V */
        load_tile(sm.k, k + row_of(lq, T, k0), T - k0, vec, lq.ld);
        load_tile(sm.v, v + row_of(lq, T, k0), T - k0, vec, lq.ld);
        __syncthreads();
        gemm_strip<wmma::col_major>(sm.s + row0 * LDF, sm.q + row0 * LDH, sm.k);
        __syncwarp();
        softmax_step(sm.s + row0 * LDF, sm.p + row0 * LDH, sm.o + row0 * LDF, q0 + row0, k0,
                     scale_log2, m, l);
        __syncwarp();
        accumulate_pv(sm.o + row0 * LDF, sm.p + row0 * LDH, sm.v);
    }
    __syncwarp();
    finish_rows(o + head * HS, lse + head, sm.o + row0 * LDF, q0 + row0, T, m, l);
}

/* ---- forward, version 2: scores, probabilities and O in registers (mma.sync) --------------- */

/* Fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments
 * for mma.m16n8k16 with floating point type"), lane = 4 g + c (g = groupID, c = threadID_in_group):
 *   A (16 x 16, row): a[0] = A(g, 2c..2c+1), a[1] = A(g+8, 2c..), a[2] = A(g, 2c+8..),
 *                     a[3] = A(g+8, 2c+8..); two bf16 per register, the lower column in the low half
 *   B (16 x 8, col):  b[0] = B(2c..2c+1, g), b[1] = B(2c+8..2c+9, g)
 *   C (16 x 8, fp32): c[0], c[1] = C(g, 2c..2c+1); c[2], c[3] = C(g+8, 2c..2c+1)
 * So the C fragments of two adjacent 8-column tiles n and n+1 are, rounded to bf16, the A fragment
 * of the 16 columns they cover: a[0] = C_n[0..1], a[1] = C_n[2..3], a[2] = C_n+1[0..1],
 * a[3] = C_n+1[2..3]. */
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two bf16 (lo in the low half) as one register. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* The 32 bits at element e of a bf16 tile in shared memory (e even: 4-byte aligned). */
static __device__ __forceinline__ uint32_t ld_pair(const bf16 *tile, int e)
{
    return *reinterpret_cast<const uint32_t *>(tile + e);
}

/* Two bf16 of a column: tile[e] in the low half, tile[e + LDH] (the next row) in the high half. */
static __device__ __forceinline__ uint32_t ld_col_pair(const bf16 *tile, int e)
{
    const uint16_t *u = reinterpret_cast<const uint16_t *>(tile);
    return (uint32_t)u[e] | ((uint32_t)u[e + LDH] << 16);
}

/* ldmatrix (PTX ISA, "warp-level matrix load instruction: ldmatrix"): four 8 x 8 matrices of
 * 16-bit values from shared memory, lanes 8i..8i+7 giving the 16-byte aligned addresses of matrix
 * i's rows 0..7; register i of lane 4 g + c then holds matrix i's row g, columns 2c and 2c + 1
 * (the lower column in the low half), or with .trans its column g, rows 2c and 2c + 1. So a
 * row-major 8 x 8 block gives an A or row-major B fragment register, and with .trans the
 * register of a B fragment whose k runs down the block's rows (mma_bf16's layouts). One
 * instruction replaces the four 32-bit loads (or, transposed, eight 16-bit loads) of the lane's
 * four registers. The "memory" clobber keeps the loads after the __syncthreads that publishes the
 * tile. */
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* The four A fragments (16 columns each) of the 16 x 64 strip a (row stride LDH). LDM: by
 * ldmatrix, lane l addressing row l % 16 at column 16 kk + 8 (l / 16) (matrices: rows 0-7 and
 * 8-15 of the left 8 columns, then of the right 8: fa[kk][0..3]); else one 32-bit load each. */
template <bool LDM>
static __device__ __forceinline__ void load_a_regs(uint32_t fa[4][4], const bf16 *a, int g, int c)
{
    int lane = (int)(threadIdx.x % 32);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if constexpr (LDM) {
            ldsm_x4(fa[kk], a + (lane % 16) * LDH + kk * FRAG + 8 * (lane / 16));
        } else {
            int e = g * LDH + kk * FRAG + 2 * c;
            fa[kk][0] = ld_pair(a, e);
            fa[kk][1] = ld_pair(a, e + 8 * LDH);
            fa[kk][2] = ld_pair(a, e + 8);
            fa[kk][3] = ld_pair(a, e + 8 * LDH + 8);
        }
    }
}

/* s[n] (16 x 8, keys 8n..8n+7) = A B^T for the strip's A fragments fa and a 64-row tile b (row
 * stride LDH) read as B(k, n) = b[n][k]: the scores of 16 queries against the 64 keys of b. LDM:
 * ldmatrix gives the B registers of two k slices at once (lane l addressing key row 8n + l % 8
 * at column 16 kk + 8 (l / 8)); each s[n] still adds its k slices in order 0..3, so the sums are
 * bit for bit the other form's. */
template <bool LDM>
static __device__ __forceinline__ void mma_abt(float s[8][4], const uint32_t fa[4][4],
                                               const bf16 *b, int g, int c)
{
    int lane = (int)(threadIdx.x % 32);
#pragma unroll
    for (int n = 0; n < 8; n++) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if constexpr (LDM) {
#pragma unroll
            for (int kk = 0; kk < 4; kk += 2) {
                uint32_t r[4];
                ldsm_x4(r, b + (n * 8 + lane % 8) * LDH + kk * FRAG + 8 * (lane / 8));
                mma_bf16(s[n], fa[kk], r[0], r[1]);
                mma_bf16(s[n], fa[kk + 1], r[2], r[3]);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                int e = (n * 8 + g) * LDH + kk * FRAG + 2 * c;
                mma_bf16(s[n], fa[kk], ld_pair(b, e), ld_pair(b, e + 8));
            }
        }
    }
}

/* acc[n] (16 x 8, columns 8n..8n+7) += A B for A fragments fa (16 x 64) and a 64 x 64 tile b
 * (row stride LDH) read as B(k, n) = b[k][n]. LDM: ldmatrix.trans gives the B registers of two
 * column tiles at once (lane l addressing row 16 kk + l % 16 at column 8 n + 8 (l / 16)); each
 * acc[n] still adds its k slices in order 0..3, bit for bit the other form. */
template <bool LDM>
static __device__ __forceinline__ void mma_ab(float acc[8][4], const uint32_t fa[4][4],
                                              const bf16 *b, int g, int c)
{
    int lane = (int)(threadIdx.x % 32);
    if constexpr (LDM) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int n = 0; n < 8; n += 2) {
                uint32_t r[4];
                ldsm_x4_trans(r, b + (kk * FRAG + lane % 16) * LDH + n * 8 + 8 * (lane / 16));
                mma_bf16(acc[n], fa[kk], r[0], r[1]);
                mma_bf16(acc[n + 1], fa[kk], r[2], r[3]);
            }
        }
    } else {
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                int e = (kk * FRAG + 2 * c) * LDH + n * 8 + g;
                mma_bf16(acc[n], fa[kk], ld_col_pair(b, e), ld_col_pair(b, e + 8 * LDH));
            }
        }
    }
}

/* The A fragments (4 slices of 16 columns) of a 16 x 64 strip held as 8 C fragments x, rounded
 * to bf16: slice kk is tiles 2 kk and 2 kk + 1 (see mma_bf16). */
static __device__ __forceinline__ void pack_frags(uint32_t fa[4][4], const float x[8][4])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        fa[kk][0] = pack_bf16(x[2 * kk][0], x[2 * kk][1]);
        fa[kk][1] = pack_bf16(x[2 * kk][2], x[2 * kk][3]);
        fa[kk][2] = pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        fa[kk][3] = pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

/* The online-softmax step on the scores s (raw q.k) of the lane's two rows, h = 0 (row g) and
 * h = 1 (row g + 8): masks keys after the row when diag (key k0 + col > the row's query), scales
 * to log2 units, updates the running max m[h] (shared by the row's quad) and the lane's partial
 * sum l[h], rescales the lane's part of O, and leaves P = exp2(x - m) as bf16 A fragments in pa. */
static __device__ __forceinline__ void softmax_regs(float s[8][4], float o[8][4], uint32_t pa[4][4],
                                                    float m[2], float l[2], int row_q, int k0,
                                                    int c, bool diag, float scale_log2)
{
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int h = i / 2, key = k0 + n * 8 + 2 * c + i % 2;
            float x = s[n][i] * scale_log2;
            s[n][i] = diag && key > row_q + 8 * h ? -INFINITY : x;
            mx[h] = fmaxf(mx[h], s[n][i]);
        }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 2)); /* finite: key k0 <= row */
        alpha[h] = exp2f(m[h] - mx[h]); /* 0 on the first tile (m = -inf) */
        m[h] = mx[h];
        l[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s[n][i] = exp2f(s[n][i] - m[i / 2]); /* 0 where masked */
            l[i / 2] += s[n][i];
            o[n][i] *= alpha[i / 2];
        }
    }
    pack_frags(pa, s);
}

/* The lane's rows row_q (h = 0) and row_q + 8 (h = 1) of o and lse, those < T: o / l with l
 * summed over the quad (into o.f, fp32 heads, when set; into o16, bf16 rows, when o16.h is set),
 * lse = (m + log2 l) ln 2. lse points at the head's row 0. */
static __device__ __forceinline__ void finish_regs(flash_out o, flash_out o16, float *lse,
                                                   float acc[8][4], const float m[2], float l[2],
                                                   int row_q, int T, int c)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
        l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
        int t = row_q + 8 * h;
        if (t >= T)
            continue;
        float inv = 1.0f / l[h];
#pragma unroll
        for (int n = 0; n < 8; n++) {
            float x0 = acc[n][2 * h] * inv, x1 = acc[n][2 * h + 1] * inv;
            if (o.f)
                put_pair(o, T, t, n * 8 + 2 * c, x0, x1);
            if (o16.h)
                put_pair(o16, T, t, n * 8 + 2 * c, x0, x1);
        }
        if (c == 0)
            lse[t] = (m[h] + log2f(l[h])) * LN2;
    }
}

struct fwd2_smem {
    bf16 q[TILE * LDH];
    bf16 k[2][TILE * LDH], v[2][TILE * LDH]; /* key tile kt in buffer kt % 2 */
};

/* Version 2 of flash_fwd_kernel (same grid, threads and arguments; static shared memory): each
 * warp keeps its 16 rows' Q (A fragments), S, P and O (mma.sync fragments) in registers; only the
 * K and V tiles go through shared memory, two buffers of them: the next key tile is copied (by
 * cp.async with LOADS_ASYNC, which also loads the fragments by ldmatrix) while the warps compute
 * on the current one, one __syncthreads a tile. Rows past T compute on zero Q and are not
 * written. */
template <int LOADS>
static __global__ void __launch_bounds__(THREADS)
flash_fwd2_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v, flash_out o,
                  flash_out o16, float *lse, int T, float scale_log2, bool vec, flash_layout lq)
{
    constexpr bool LDM = LOADS == LOADS_ASYNC, ASYNC = LDM;
    __shared__ __align__(16) fwd2_smem sm;
    int qt = (int)(gridDim.y - 1 - blockIdx.y), q0 = qt * TILE;
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int row0 = (int)(threadIdx.x / 32) * FRAG; /* the warp's first row in the tile */
    size_t head = (size_t)blockIdx.x * T;      /* rows before this head's */

    stage_pair<ASYNC>(sm.k[0], k, lq, sm.v[0], v, lq, 0, T, vec);
    cp_async_commit();
    load_tile(sm.q, q + row_of(lq, T, q0), T - q0, vec, lq.ld);
    uint32_t qa[4][4], pa[4][4];
    float acc[8][4], s[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * TILE, buf = kt & 1;
        /* tile kt has landed, and every warp is done with tile kt - 1 (the other buffer) */
        cp_async_wait0();
        __syncthreads();
        if (kt == 0)
            load_a_regs<LDM>(qa, sm.q + row0 * LDH, g, c);
        if (kt < qt)
            stage_pair<ASYNC>(sm.k[buf ^ 1], k, lq, sm.v[buf ^ 1], v, lq, k0 + TILE, T, vec);
        cp_async_commit();
        mma_abt<LDM>(s, qa, sm.k[buf], g, c);
        softmax_regs(s, acc, pa, m, l, q0 + row0 + g, k0, c, kt == qt, scale_log2);
        mma_ab<LDM>(acc, pa, sm.v[buf], g, c);
    }
    finish_regs(o, o16, lse + head, acc, m, l, q0 + row0 + g, T, c);
}

/* a0 b0 + a1 b1, each product rounded, then the sum (no fused multiply-add: the fp32 and bf16
 * forms of the delta kernel give the same bits). */
static __device__ __forceinline__ float dot2(float a0, float b0, float a1, float b1)
{
    return __fadd_rn(__fmul_rn(a0, b0), __fmul_rn(a1, b1));
}

/* delta[row] = sum over HS of dout[row] * o[row], one warp per row, DELTA_ROWS rows per block. */
static __global__ void flash_delta_kernel(const float *dout, const float *o, float *delta,
                                          size_t rows)
{
    size_t row = (size_t)blockIdx.x * DELTA_ROWS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows)
        return; /* the whole warp */
    const float *a = dout + row * HS, *b = o + row * HS;
    float x = warp_sum(dot2(a[lane], b[lane], a[lane + 32], b[lane + 32]));
    if (lane == 0)
        delta[row] = x;
}

/* flash_delta_kernel with dout bf16 in layout lo (row = bh T + t). */
static __global__ void flash_delta_rows_kernel(const uint16_t *dout, flash_layout lo,
                                               const float *o, float *delta, int T, size_t rows)
{
    size_t row = (size_t)blockIdx.x * DELTA_ROWS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows)
        return; /* the whole warp */
    const uint16_t *a = dout + row_at(lo, T, row / (unsigned)T, (int)(row % (unsigned)T));
    const float *b = o + row * HS;
    float x = warp_sum(dot2(half_bf16_to_f32(a[lane]), b[lane], half_bf16_to_f32(a[lane + 32]),
                            b[lane + 32]));
    if (lane == 0)
        delta[row] = x;
}

/* ---- backward ----------------------------------------------------------------------------- */

/* P and dS of the warp's strip (16 rows x 64 columns): s and dp (stride LDF) hold q.k and dO.v;
 * p (may be NULL) and ds (stride LDH) get P and dS in bf16. KEY_ROWS false: rows are queries
 * r0 + r and columns keys c0 + c; true: rows are keys and columns queries. lse (log2 units) and
 * delta are the query tile's, indexed by the query's place in it: row r (lse_row0 + r) or
 * column c. P = 0 where the key is after the query or the query is at or past T. */
template <bool KEY_ROWS>
static __device__ __forceinline__ void grad_step(const float *s, const float *dp, bf16 *p, bf16 *ds,
                                                 const float *lse, const float *delta, int lse_row0,
                                                 int r0, int c0, int T, float scale_log2)
{
    int lane = threadIdx.x % 32;
    for (int r = 0; r < FRAG; r++) {
        for (int h = 0; h < 2; h++) {
            int c = lane + 32 * h;
            int t = KEY_ROWS ? c0 + c : r0 + r, j = KEY_ROWS ? r0 + r : c0 + c;
            int iq = KEY_ROWS ? c : lse_row0 + r;
            float pv = j <= t && t < T ? exp2f(s[r * LDF + c] * scale_log2 - lse[iq]) : 0.0f;
            float dsv = pv * (dp[r * LDF + c] - delta[iq]);
            if (p)
                p[r * LDH + c] = __float2bfloat16(pv);
            ds[r * LDH + c] = __float2bfloat16(dsv);
        }
    }
}

struct bwd_kv_smem {
    float s[TILE * LDF];           /* S^T of the query tile (keys x queries), unscaled */
    float dp[TILE * LDF];          /* dP^T */
    bf16 k[TILE * LDH], v[TILE * LDH];    /* the block's key tile */
    bf16 q[TILE * LDH], dout[TILE * LDH]; /* the query tile */
    bf16 p[TILE * LDH], ds[TILE * LDH];   /* P^T and dS^T */
    float lse[TILE], delta[TILE];  /* the query tile's rows; lse in log2 units */
};

/* Grid (BH, key tiles), the longest (first) tiles first; dynamic shared memory
 * sizeof(bwd_kv_smem). dk, dv (BH, T, HS) fp32; the rest as in flash_attn_bwd. */
static __global__ void __launch_bounds__(THREADS)
flash_bwd_kv_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                    const float *lse, const float *delta, float *dk, float *dv, int T, float scale,
                    float scale_log2, bool vec, flash_layout lq, flash_layout lo)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bwd_kv_smem &sm = *reinterpret_cast<bwd_kv_smem *>(smem_raw);
    int kt = (int)blockIdx.y, k0 = kt * TILE, n_tiles = (int)gridDim.y;
    int row0 = (int)(threadIdx.x / 32) * FRAG;
    size_t head = (size_t)blockIdx.x * T;

    load_tile(sm.k, k + row_of(lq, T, k0), T - k0, vec, lq.ld);
    load_tile(sm.v, v + row_of(lq, T, k0), T - k0, vec, lq.ld);
    frag_c dk_acc[4], dv_acc[4];
    frag_a fa[4];
#pragma unroll
    for (int n = 0; n < 4; n++) {
        wmma::fill_fragment(dk_acc[n], 0.0f);
        wmma::fill_fragment(dv_acc[n], 0.0f);
    }
    for (int qt = kt; qt < n_tiles; qt++) {
        int q0 = qt * TILE;
        __syncthreads(); /* every warp is done with the previous query tile */
        load_tile(sm.q, q + row_of(lq, T, q0), T - q0, vec, lq.ld);
        load_tile(sm.dout, dout + row_of(lo, T, q0), T - q0, vec, lo.ld);
        load_row_values(sm.lse, lse + head + q0, T - q0, LOG2E);
        load_row_values(sm.delta, delta + head + q0, T - q0, 1.0f);
        __syncthreads();
        gemm_strip<wmma::col_major>(sm.s + row0 * LDF, sm.k + row0 * LDH, sm.q);
        gemm_strip<wmma::col_major>(sm.dp + row0 * LDF, sm.v + row0 * LDH, sm.dout);
        __syncwarp();
        grad_step<true>(sm.s + row0 * LDF, sm.dp + row0 * LDF, sm.p + row0 * LDH,
                        sm.ds + row0 * LDH, sm.lse, sm.delta, 0, k0 + row0, q0, T, scale_log2);
        __syncwarp();
        load_a(fa, sm.p + row0 * LDH);
        mma_strip<wmma::row_major>(dv_acc, fa, sm.dout); /* dV += P^T dO */
        load_a(fa, sm.ds + row0 * LDH);
        mma_strip<wmma::row_major>(dk_acc, fa, sm.q);    /* dK += dS^T Q */
    }
    __syncwarp(); /* the warp's reads of its s and dp rows are done */
    store_strip(sm.s + row0 * LDF, dk_acc, scale);
    store_strip(sm.dp + row0 * LDF, dv_acc, 1.0f);
    __syncwarp();
    write_strip(dk + head * HS, sm.s + row0 * LDF, k0 + row0, T);
    write_strip(dv + head * HS, sm.dp + row0 * LDF, k0 + row0, T);
}

struct bwd_q_smem {
    float s[TILE * LDF];           /* S of the key tile (queries x keys), unscaled */
    float dp[TILE * LDF];          /* dP */
    bf16 q[TILE * LDH], dout[TILE * LDH]; /* the block's query tile */
    bf16 k[TILE * LDH], v[TILE * LDH];    /* the key tile */
    bf16 ds[TILE * LDH];           /* dS */
    float lse[TILE], delta[TILE];  /* the block's rows; lse in log2 units */
};

/* Grid (BH, query tiles), the longest tiles first; dynamic shared memory sizeof(bwd_q_smem).
 * dq (BH, T, HS) fp32; the rest as in flash_attn_bwd. */
static __global__ void __launch_bounds__(THREADS)
flash_bwd_q_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                   const float *lse, const float *delta, float *dq, int T, float scale,
                   float scale_log2, bool vec, flash_layout lq, flash_layout lo)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bwd_q_smem &sm = *reinterpret_cast<bwd_q_smem *>(smem_raw);
    int qt = (int)(gridDim.y - 1 - blockIdx.y), q0 = qt * TILE;
    int row0 = (int)(threadIdx.x / 32) * FRAG;
    size_t head = (size_t)blockIdx.x * T;

    load_tile(sm.q, q + row_of(lq, T, q0), T - q0, vec, lq.ld);
    load_tile(sm.dout, dout + row_of(lo, T, q0), T - q0, vec, lo.ld);
    load_row_values(sm.lse, lse + head + q0, T - q0, LOG2E);
    load_row_values(sm.delta, delta + head + q0, T - q0, 1.0f);
    frag_c dq_acc[4];
    frag_a fa[4];
#pragma unroll
    for (int n = 0; n < 4; n++)
        wmma::fill_fragment(dq_acc[n], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * TILE;
        __syncthreads(); /* every warp is done with the previous K and V */
        load_tile(sm.k, k + row_of(lq, T, k0), T - k0, vec, lq.ld);
        load_tile(sm.v, v + row_of(lq, T, k0), T - k0, vec, lq.ld);
        __syncthreads();
        gemm_strip<wmma::col_major>(sm.s + row0 * LDF, sm.q + row0 * LDH, sm.k);
        gemm_strip<wmma::col_major>(sm.dp + row0 * LDF, sm.dout + row0 * LDH, sm.v);
        __syncwarp();
        grad_step<false>(sm.s + row0 * LDF, sm.dp + row0 * LDF, nullptr, sm.ds + row0 * LDH,
                         sm.lse, sm.delta, row0, q0 + row0, k0, T, scale_log2);
        __syncwarp();
        load_a(fa, sm.ds + row0 * LDH);
        mma_strip<wmma::row_major>(dq_acc, fa, sm.k); /* dQ += dS K */
    }
    __syncwarp();
    store_strip(sm.s + row0 * LDF, dq_acc, scale);
    __syncwarp();
    write_strip(dq + head * HS, sm.s + row0 * LDF, q0 + row0, T);
}

/* ---- backward, version 2: S, dP, P and dS in registers (mma.sync) -------------------------- */

/* The rows row (h = 0) and row + 8 (h = 1) of the block's head in out (the lane's columns of
 * acc), those < T, = mul * acc. */
static __device__ __forceinline__ void store_regs(flash_out out, const float acc[8][4], int row,
                                                  int T, int c, float mul)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = row + 8 * h;
        if (t >= T)
            continue;
#pragma unroll
        for (int n = 0; n < 8; n++)
            put_pair(out, T, t, n * 8 + 2 * c, acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
    }
}

struct bwd_q2_smem {
    bf16 q[TILE * LDH], dout[TILE * LDH];     /* the block's query tile */
    bf16 k[2][TILE * LDH], v[2][TILE * LDH];  /* key tile kt in buffer kt % 2 */
};

/* Version 2 of flash_bwd_q_kernel (same grid, threads and arguments; dynamic shared memory of
 * sizeof(bwd_q2_smem)): the warp's 16 query rows' Q and dO as A fragments, S, dP, dS and dQ in
 * registers; the key tiles double-buffered as in flash_fwd2_kernel. */
template <int LOADS>
static __global__ void __launch_bounds__(THREADS)
flash_bwd_q2_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                    const float *lse, const float *delta, flash_out dq, int T, float scale,
                    float scale_log2, bool vec, flash_layout lq, flash_layout lo)
{
    constexpr bool LDM = LOADS == LOADS_ASYNC, ASYNC = LDM;
    extern __shared__ __align__(16) unsigned char smem_q2[];
    bwd_q2_smem &sm = *reinterpret_cast<bwd_q2_smem *>(smem_q2);
    int qt = (int)(gridDim.y - 1 - blockIdx.y), q0 = qt * TILE;
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int row0 = (int)(threadIdx.x / 32) * FRAG;
    int tq = q0 + row0 + g; /* the lane's first query; the second is tq + 8 */
    size_t head = (size_t)blockIdx.x * T;

    stage_pair<ASYNC>(sm.k[0], k, lq, sm.v[0], v, lq, 0, T, vec);
    cp_async_commit();
    load_tile(sm.q, q + row_of(lq, T, q0), T - q0, vec, lq.ld);
    load_tile(sm.dout, dout + row_of(lo, T, q0), T - q0, vec, lo.ld);
    float lse2[2], dl[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        bool in = tq + 8 * h < T;
        lse2[h] = in ? lse[head + tq + 8 * h] * LOG2E : 0.0f;
        dl[h] = in ? delta[head + tq + 8 * h] : 0.0f;
    }
    uint32_t qa[4][4], da[4][4];
    float acc[8][4], s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * TILE, buf = kt & 1;
        cp_async_wait0(); /* as in flash_fwd2_kernel */
        __syncthreads();
        if (kt == 0) {
            load_a_regs<LDM>(qa, sm.q + row0 * LDH, g, c);
            load_a_regs<LDM>(da, sm.dout + row0 * LDH, g, c);
        }
        if (kt < qt)
            stage_pair<ASYNC>(sm.k[buf ^ 1], k, lq, sm.v[buf ^ 1], v, lq, k0 + TILE, T, vec);
        cp_async_commit();
        mma_abt<LDM>(s, qa, sm.k[buf], g, c);
        mma_abt<LDM>(dp, da, sm.v[buf], g, c);
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int h = i / 2, t = tq + 8 * h, j = k0 + n * 8 + 2 * c + i % 2;
                float p = j <= t && t < T ? exp2f(s[n][i] * scale_log2 - lse2[h]) : 0.0f;
                dp[n][i] = p * (dp[n][i] - dl[h]);
            }
        }
        uint32_t dsa[4][4];
        pack_frags(dsa, dp);
        mma_ab<LDM>(acc, dsa, sm.k[buf], g, c); /* dQ += dS K */
    }
    store_regs(dq, acc, tq, T, c, scale);
}

struct bwd_kv2_smem {
    bf16 k[TILE * LDH], v[TILE * LDH];              /* the block's key tile */
    bf16 q[2][TILE * LDH], dout[2][TILE * LDH];     /* query tile qt in buffer (qt - kt) % 2 */
    float lse[2][TILE], delta[2][TILE];             /* its rows; lse in log2 units */
};

/* Version 2 of flash_bwd_kv_kernel (same grid, threads and arguments; dynamic shared memory of
 * sizeof(bwd_kv2_smem)): the warp's 16 keys; S^T = K Q^T, dP^T = V dO^T, P^T, dS^T, dK and dV in
 * registers; the query tiles (with their lse and delta) double-buffered as the key tiles of
 * flash_fwd2_kernel. */
template <int LOADS>
static __global__ void __launch_bounds__(THREADS, LOADS == LOADS_ASYNC3 ? 3 : 1)
flash_bwd_kv2_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                     const uint16_t *dout, const float *lse, const float *delta, flash_out dk,
                     flash_out dv, int T, float scale, float scale_log2, bool vec,
                     flash_layout lq, flash_layout lo)
{
    constexpr bool LDM = LOADS != LOADS_PLAIN, ASYNC = LDM;
    extern __shared__ __align__(16) unsigned char smem_kv2[];
    bwd_kv2_smem &sm = *reinterpret_cast<bwd_kv2_smem *>(smem_kv2);
    int kt = (int)blockIdx.y, k0 = kt * TILE, n_tiles = (int)gridDim.y;
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int row0 = (int)(threadIdx.x / 32) * FRAG;
    int jk = k0 + row0 + g; /* the lane's first key; the second is jk + 8 */
    size_t head = (size_t)blockIdx.x * T;

    stage_pair<ASYNC>(sm.q[0], q, lq, sm.dout[0], dout, lo, k0, T, vec);
    cp_async_commit();
    load_row_values(sm.lse[0], lse + head + k0, T - k0, LOG2E);
    load_row_values(sm.delta[0], delta + head + k0, T - k0, 1.0f);
    load_tile(sm.k, k + row_of(lq, T, k0), T - k0, vec, lq.ld);
    load_tile(sm.v, v + row_of(lq, T, k0), T - k0, vec, lq.ld);
    float dk_acc[8][4], dv_acc[8][4], s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) {
        dk_acc[n][0] = dk_acc[n][1] = dk_acc[n][2] = dk_acc[n][3] = 0.0f;
        dv_acc[n][0] = dv_acc[n][1] = dv_acc[n][2] = dv_acc[n][3] = 0.0f;
    }
    for (int qt = kt; qt < n_tiles; qt++) {
        int q0 = qt * TILE, buf = (qt - kt) & 1;
        cp_async_wait0(); /* as in flash_fwd2_kernel */
        __syncthreads();
        if (qt + 1 < n_tiles) {
            int q1 = q0 + TILE;
            stage_pair<ASYNC>(sm.q[buf ^ 1], q, lq, sm.dout[buf ^ 1], dout, lo, q1, T, vec);
            load_row_values(sm.lse[buf ^ 1], lse + head + q1, T - q1, LOG2E);
            load_row_values(sm.delta[buf ^ 1], delta + head + q1, T - q1, 1.0f);
        }
        cp_async_commit();
        const float *ls = sm.lse[buf], *dl = sm.delta[buf];
        uint32_t fa[4][4];
        load_a_regs<LDM>(fa, sm.k + row0 * LDH, g, c);
        mma_abt<LDM>(s, fa, sm.q[buf], g, c);
        load_a_regs<LDM>(fa, sm.v + row0 * LDH, g, c);
        mma_abt<LDM>(dp, fa, sm.dout[buf], g, c);
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int col = n * 8 + 2 * c + i % 2, t = q0 + col, j = jk + 8 * (i / 2);
                float p = j <= t && t < T ? exp2f(s[n][i] * scale_log2 - ls[col]) : 0.0f;
                s[n][i] = p;
                dp[n][i] = p * (dp[n][i] - dl[col]);
            }
        }
        pack_frags(fa, s);
        mma_ab<LDM>(dv_acc, fa, sm.dout[buf], g, c); /* dV += P^T dO */
        pack_frags(fa, dp);
        mma_ab<LDM>(dk_acc, fa, sm.q[buf], g, c);    /* dK += dS^T Q */
    }
    store_regs(dk, dk_acc, jk, T, c, scale);
    store_regs(dv, dv_acc, jk, T, c, 1.0f);
}

/* ============================================================================== launchers == */

bool flash_attn_supported(int hs, int T)
{
    return hs == HS && T >= 1 && T <= MAX_TILES * TILE;
}

/* The implementation chosen: 0 until the first call reads DDP_FLASH_IMPL, or flash_attn_set_impl. */
static int g_impl = 0;

/* The implementation in force, 1, 2 or 3: flash_attn_set_impl's, else DDP_FLASH_IMPL's (read
 * once), else 3. Another value of DDP_FLASH_IMPL is reported and the default used. */
static int flash_impl(void)
{
    if (g_impl == 0) {
        const char *env = getenv("DDP_FLASH_IMPL");
        bool valid = env && (!strcmp(env, "1") || !strcmp(env, "2") || !strcmp(env, "3"));
        if (env && *env && !valid)
            DDP_WARN("DDP_FLASH_IMPL=%s: use 1, 2 or 3 (cuda_flash.h); taking the default, 3", env);
        g_impl = valid ? atoi(env) : 3;
    }
    return g_impl;
}

void flash_attn_set_impl(int v)
{
    g_impl = v >= 1 && v <= 3 ? v : 0;
}

bool flash_attn_bf16_out(void)
{
    return flash_impl() == 3;
}

/* Versions 2 and 3's loads (LOADS_*): -1 until the first launch reads DDP_FLASH_LOADS (or
 * flash_attn_set_loads sets them). */
static int g_loads = -1;

static int loads_mode(void)
{
    if (g_loads < 0) {
        static const char *names[] = {"plain", "async", "async3"};
        const char *env = getenv("DDP_FLASH_LOADS");
        g_loads = LOADS_ASYNC;
        bool valid = false;
        for (int i = 0; env && i < 3; i++)
            if (!strcmp(env, names[i])) {
                g_loads = i;
                valid = true;
            }
        if (env && *env && !valid)
            DDP_WARN("DDP_FLASH_LOADS=%s: use plain, async or async3 (cuda_flash.h); taking "
                     "the default, async", env);
    }
    return g_loads;
}

void flash_attn_set_loads(int mode)
{
    g_loads = mode >= LOADS_PLAIN && mode <= LOADS_ASYNC3 ? mode : -1;
}

/* The loads the dK/dV kernel runs with: loads_mode()'s, but async for async3 where three of its
 * blocks do not fit an SM's shared memory (device_limits.h; sm_80, sm_86, sm_89), said once. The
 * current device's limits, read once: one device per process. */
static int kv_loads_mode(void)
{
    static dev_limits lim;
    static bool have, told;
    int asked = loads_mode(), dev = 0, major = 8, minor = 0;
    if (asked != LOADS_ASYNC3)
        return asked;
    if (!have) {
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
            (void)cudaGetLastError();
        lim = cuda_read_limits(dev, major, minor);
        have = true;
    }
    int mode = dev_flash_loads(&lim, asked, sizeof(bwd_kv2_smem));
    if (mode != asked && !told) {
        DDP_WARN("DDP_FLASH_LOADS=async3: three dK/dV blocks of %zu bytes do not fit this device's "
                 "%zu bytes of shared memory per SM (compute capability %d.%d): running async",
                 sizeof(bwd_kv2_smem), lim.smem_sm, lim.cc_major, lim.cc_minor);
        told = true;
    }
    return mode;
}

/* The shape checks every entry point shares; false (logged) when the shape is refused. */
static bool shape_ok(const char *op, int BH, int T, int hs)
{
    if (BH < 0 || T < 1) {
        DDP_ERROR("%s: BH %d, T %d (BH >= 0 and T >= 1 wanted)", op, BH, T);
        return false;
    }
    if (!flash_attn_supported(hs, T)) {
        DDP_ERROR("%s: head size %d with T %d is not supported (head size %d, T <= %d only)", op,
                  hs, T, (int)HS, (int)(MAX_TILES * TILE));
        return false;
    }
    return true;
}

/* Whether p is set; false (logged, naming it) when NULL. */
static bool ptr_ok(const char *op, const void *p, const char *name)
{
    if (!p)
        DDP_ERROR("%s: %s is NULL", op, name);
    return p != NULL;
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* Lets kernel take bytes of dynamic shared memory (over the default 48 KiB). Cheap; done at every
 * launch so that it holds on whichever device is current. */
template <class Kernel> static ddp_status allow_smem(Kernel kernel, size_t bytes)
{
    TRY_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return DDP_OK;
}

static dim3 tile_grid(int BH, int T)
{
    return dim3((unsigned)BH, (unsigned)((T + TILE - 1) / TILE));
}

/* Whether layout L fits BH heads of hs (ld >= nh hs, nh dividing BH); false (logged) otherwise. */
static bool layout_ok(const char *op, flash_layout L, int BH, int hs, const char *name)
{
    if (L.nh >= 1 && BH % L.nh == 0 && (long long)L.ld >= (long long)L.nh * hs)
        return true;
    DDP_ERROR("%s: %s's layout (ld %d, %d heads) does not hold %d heads of %d", op, name, L.ld,
              L.nh, BH, hs);
    return false;
}

/* Whether output d is usable (flash_out's rules); false (logged, naming it) otherwise. fp32_only:
 * the implementation in force writes fp32 only. */
static bool out_ok(const char *op, flash_out d, int BH, int hs, const char *name, bool fp32_only)
{
    if (d.f)
        return true;
    if (!d.h) {
        DDP_ERROR("%s: %s is NULL", op, name);
        return false;
    }
    if (fp32_only) {
        DDP_ERROR("%s: %s in bf16 needs implementation 3 (DDP_FLASH_IMPL=3, the default); "
                  "version %d writes fp32 only", op, name, flash_impl());
        return false;
    }
    if (((uintptr_t)d.h & 3) != 0 || d.L.ld % 2 != 0) {
        DDP_ERROR("%s: %s in bf16 needs a 4-byte aligned pointer and an even row stride (ld %d)",
                  op, name, d.L.ld);
        return false;
    }
    return layout_ok(op, d.L, BH, hs, name);
}

/* Whether rows of layout L starting at p can be loaded 16 bytes at a time. */
static bool rows_aligned16(const void *p, flash_layout L)
{
    return aligned16(p) && L.ld % 8 == 0;
}

ddp_status flash_attn_fwd_rows(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, flash_layout lq, float *o, uint16_t *o_rows,
                               flash_layout lr, float *lse, int BH, int T, int hs, float scale)
{
    const char *op = "flash_attn_fwd";
    if (!shape_ok(op, BH, T, hs) || !layout_ok(op, lq, BH, hs, "q, k, v"))
        return DDP_ERR_INVALID_ARG;
    if (BH == 0)
        return DDP_OK;
    flash_out o16 = {NULL, o_rows, lr};
    if (!ptr_ok(op, q, "q") || !ptr_ok(op, k, "k") || !ptr_ok(op, v, "v") || !ptr_ok(op, o, "o") ||
        !ptr_ok(op, lse, "lse") ||
        (o_rows && !out_ok(op, o16, BH, hs, "o_rows", !flash_attn_bf16_out())))
        return DDP_ERR_INVALID_ARG;
    bool vec = rows_aligned16(q, lq) && rows_aligned16(k, lq) && rows_aligned16(v, lq);
    if (flash_impl() >= 2) {
        flash_out of = {o, NULL, flash_layout{hs, 1}};
        int mode = loads_mode();
        auto fwd = mode != LOADS_PLAIN ? flash_fwd2_kernel<LOADS_ASYNC>
                                       : flash_fwd2_kernel<LOADS_PLAIN>;
        fwd<<<tile_grid(BH, T), THREADS, 0, st>>>(q, k, v, of, o16, lse, T, scale * LOG2E, vec, lq);
        TRY_CUDA_LAUNCH();
        return DDP_OK;
    }
    size_t bytes = sizeof(fwd_smem);
    TRY_OK(allow_smem(flash_fwd_kernel, bytes));
    flash_fwd_kernel<<<tile_grid(BH, T), THREADS, bytes, st>>>(q, k, v, o, lse, T,
                                                               scale * LOG2E, vec, lq);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

ddp_status flash_attn_fwd(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, float *o, float *lse, int BH, int T, int hs,
                          float scale)
{
    flash_layout heads = {hs, 1};
    return flash_attn_fwd_rows(st, q, k, v, heads, o, NULL, heads, lse, BH, T, hs, scale);
}

ddp_status flash_attn_delta(cudaStream_t st, const float *dout, const float *o, float *delta,
                            int BH, int T, int hs)
{
    const char *op = "flash_attn_delta";
    if (!shape_ok(op, BH, T, hs))
        return DDP_ERR_INVALID_ARG;
    if (BH == 0)
        return DDP_OK;
    if (!ptr_ok(op, dout, "dout") || !ptr_ok(op, o, "o") || !ptr_ok(op, delta, "delta"))
        return DDP_ERR_INVALID_ARG;
    size_t rows = (size_t)BH * T;
    unsigned blocks = (unsigned)((rows + DELTA_ROWS - 1) / DELTA_ROWS);
    flash_delta_kernel<<<blocks, DELTA_ROWS * 32, 0, st>>>(dout, o, delta, rows);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

ddp_status flash_attn_delta_rows(cudaStream_t st, const uint16_t *dout, flash_layout lo,
                                 const float *o, float *delta, int BH, int T, int hs)
{
    const char *op = "flash_attn_delta";
    if (!shape_ok(op, BH, T, hs) || !layout_ok(op, lo, BH, hs, "dout"))
        return DDP_ERR_INVALID_ARG;
    if (BH == 0)
        return DDP_OK;
    if (!ptr_ok(op, dout, "dout") || !ptr_ok(op, o, "o") || !ptr_ok(op, delta, "delta"))
        return DDP_ERR_INVALID_ARG;
    size_t rows = (size_t)BH * T;
    unsigned blocks = (unsigned)((rows + DELTA_ROWS - 1) / DELTA_ROWS);
    flash_delta_rows_kernel<<<blocks, DELTA_ROWS * 32, 0, st>>>(dout, lo, o, delta, T, rows);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

ddp_status flash_attn_bwd_rows(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, flash_layout lq, const uint16_t *dout_bf,
                               flash_layout lo, const float *lse, const float *delta, flash_out dq,
                               flash_out dk, flash_out dv, int BH, int T, int hs, float scale)
{
    const char *op = "flash_attn_bwd";
    if (!shape_ok(op, BH, T, hs) || !layout_ok(op, lq, BH, hs, "q, k, v") ||
        !layout_ok(op, lo, BH, hs, "dout"))
        return DDP_ERR_INVALID_ARG;
    if (BH == 0)
        return DDP_OK;
    bool v2 = flash_impl() == 3;
    if (!ptr_ok(op, q, "q") || !ptr_ok(op, k, "k") || !ptr_ok(op, v, "v") ||
        !ptr_ok(op, dout_bf, "dout_bf") || !ptr_ok(op, lse, "lse") || !ptr_ok(op, delta, "delta") ||
        !out_ok(op, dq, BH, hs, "dq", !v2) || !out_ok(op, dk, BH, hs, "dk", !v2) ||
        !out_ok(op, dv, BH, hs, "dv", !v2))
        return DDP_ERR_INVALID_ARG;
    bool vec = rows_aligned16(q, lq) && rows_aligned16(k, lq) && rows_aligned16(v, lq) &&
               rows_aligned16(dout_bf, lo);
    dim3 grid = tile_grid(BH, T);
    if (v2) {
        int mode = kv_loads_mode();
        auto kv = mode == LOADS_ASYNC3  ? flash_bwd_kv2_kernel<LOADS_ASYNC3>
                  : mode == LOADS_ASYNC ? flash_bwd_kv2_kernel<LOADS_ASYNC>
                                        : flash_bwd_kv2_kernel<LOADS_PLAIN>;
        auto qk = mode != LOADS_PLAIN ? flash_bwd_q2_kernel<LOADS_ASYNC>
                                      : flash_bwd_q2_kernel<LOADS_PLAIN>;
        size_t kv2_bytes = sizeof(bwd_kv2_smem), q2_bytes = sizeof(bwd_q2_smem);
        TRY_OK(allow_smem(kv, kv2_bytes));
        TRY_OK(allow_smem(qk, q2_bytes));
        kv<<<grid, THREADS, kv2_bytes, st>>>(q, k, v, dout_bf, lse, delta, dk, dv, T, scale,
                                             scale * LOG2E, vec, lq, lo);
        TRY_CUDA_LAUNCH();
        qk<<<grid, THREADS, q2_bytes, st>>>(q, k, v, dout_bf, lse, delta, dq, T, scale,
                                            scale * LOG2E, vec, lq, lo);
        TRY_CUDA_LAUNCH();
        return DDP_OK;
    }
    size_t kv_bytes = sizeof(bwd_kv_smem), q_bytes = sizeof(bwd_q_smem);
    TRY_OK(allow_smem(flash_bwd_kv_kernel, kv_bytes));
    TRY_OK(allow_smem(flash_bwd_q_kernel, q_bytes));
    flash_bwd_kv_kernel<<<grid, THREADS, kv_bytes, st>>>(q, k, v, dout_bf, lse, delta, dk.f, dv.f,
                                                         T, scale, scale * LOG2E, vec, lq, lo);
    TRY_CUDA_LAUNCH();
    flash_bwd_q_kernel<<<grid, THREADS, q_bytes, st>>>(q, k, v, dout_bf, lse, delta, dq.f, T,
                                                       scale, scale * LOG2E, vec, lq, lo);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

ddp_status flash_attn_bwd(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, const uint16_t *dout_bf, const float *lse,
                          const float *delta, float *dq, float *dk, float *dv, int BH, int T,
                          int hs, float scale)
{
    flash_layout heads = {hs, 1};
    return flash_attn_bwd_rows(st, q, k, v, heads, dout_bf, heads, lse, delta,
                               flash_out{dq, NULL, heads}, flash_out{dk, NULL, heads},
                               flash_out{dv, NULL, heads}, BH, T, hs, scale);
}
