/* cuda_flash.h - causal scaled-dot-product attention in the FlashAttention-2 manner (cuda_flash.cu):
 * the T x T score matrix is never stored; bf16 tensor cores (WMMA, compute capability 8.0 or newer)
 * with fp32 accumulation. Deterministic: no atomics, every sum in a fixed order. Private to
 * models/ops/, included from CUDA code only.
 *
 * Shapes, per head (BH = batch x heads), rows t and keys j <= t:
 *   q, k, v  (BH, T, hs) bf16 (uint16_t bits), contiguous
 *   S = scale * q k^T;  P = exp(S - lse), 0 where j > t;  o = P v
 *   lse      (BH, T) fp32, the natural-log logsumexp of row t's scaled scores over keys 0..t
 * Backward: dP = dO v^T; dS = P * (dP - delta); dq = scale * dS k; dk = scale * dS^T q; dv = P^T dO.
 *
 * Every function runs on stream st (nothing waits on the host) and returns DDP_OK, or
 * DDP_ERR_INVALID_ARG (logged with the reason) for BH < 0, T < 1, an hs that
 * flash_attn_supported refuses or a NULL pointer, or DDP_ERR_CUDA when a launch fails (logged).
 * BH == 0 does nothing and returns DDP_OK. scale is 1 / sqrt(hs) for GPT-2 but any value is taken.
 */
#ifndef OPS_CUDA_FLASH_H
#define OPS_CUDA_FLASH_H

#include <stdint.h>

#include "cuda_private.h"

/* Whether these kernels take the shape: hs == 64 (every GPT-2 size) and 1 <= T <= 4194240
 * (65535 tiles of 64 rows). Otherwise the caller falls back to another attention. */
bool flash_attn_supported(int hs, int T);

/* Picks the implementation, for every later call in the process: v = 1, the WMMA kernels with S
 * and O in shared memory (the reference), forward and backward; v = 2, the forward on mma.sync
 * with S, P and O in registers (faster, same contract, results within bf16 rounding of version
 * 1's, not bitwise equal) and version 1's backward; v = 3 (the default), version 2's forward and
 * the backward in the same register style. Any other v restores the default: the environment
 * variable DDP_FLASH_IMPL=1|2|3, read at the first call (another value is reported), else 3. All
 * take every shape flash_attn_supported takes. On an H100 at d12's shape (BH 192, T 1024): forward
 * 0.60 / 0.21 / 0.21 ms, backward 1.48 / 1.48 / 0.69 ms (flash_check, 2026-11-27). Not
 * thread-safe: set it before the first call. */
void flash_attn_set_impl(int v);
/* How versions 2 and 3 move data: mode 1 (the default), the streamed tiles copied by cp.async
 * while the warps compute on the tile before, and the tensor-core fragments loaded from shared
 * memory by ldmatrix; 0, synchronous copies and a 32-bit load per fragment register (two 16-bit
 * ones where a fragment runs down a column); 2, mode 1 with the dK/dV kernel compiled for three
 * blocks per SM (168 registers, against 237: two blocks), where three of its blocks fit the
 * device's shared memory per SM (sm_90; elsewhere mode 1, said once). The operands and the order
 * of every sum are the same, so the results are bit for bit equal; only the speed differs. Any
 * other value restores the default: DDP_FLASH_LOADS=plain|async|async3, read at the first
 * launch, else async. Not thread-safe, as flash_attn_set_impl. */
void flash_attn_set_loads(int mode);

/* Where the rows of a bf16 input (or output: flash_out) lie: head bh = b nh + h (b < BH / nh),
 * row t at element (b T + t) ld + h hs from the pointer given. {hs, 1}: contiguous (BH, T, hs)
 * heads; {3C, NH} with q, k, v at qkv, qkv + C, qkv + 2C: the model's qkv (B, T, 3C) as its
 * linear writes it; {C, NH}: dout (B, T, C). ld >= nh hs and nh dividing BH, else
 * DDP_ERR_INVALID_ARG (logged). */
typedef struct flash_layout {
    int ld, nh;
} flash_layout;

/* Where a (BH, T, hs) output goes: f, fp32 contiguous heads; or, with f NULL, h: bf16 bits
 * (each value rounded once, to nearest even) with the rows as L says, e.g. {3C, NH} at dqkv + C
 * for dk in the model's rows. h must be 4-byte aligned and L.ld even. bf16 outputs need version
 * 3 (flash_attn_bf16_out); the others refuse them. */
typedef struct flash_out {
    float *f;
    uint16_t *h;
    flash_layout L;
} flash_out;

/* Whether the implementation in force writes bf16 outputs (flash_out's h; o_rows): version 3. */
bool flash_attn_bf16_out(void);

/* o (BH, T, hs) fp32 and lse (BH, T) fp32 from q, k, v (bf16, their rows as lq says); o_rows (may
 * be NULL; flash_out's h with layout lr) gets o in bf16 as well, each value rounded once from the
 * fp32 one. */
ddp_status flash_attn_fwd_rows(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, flash_layout lq, float *o, uint16_t *o_rows,
                               flash_layout lr, float *lse, int BH, int T, int hs, float scale);
/* flash_attn_fwd_rows on contiguous heads: q, k, v (BH, T, hs) bf16. */
ddp_status flash_attn_fwd(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, float *o, float *lse, int BH, int T, int hs,
                          float scale);

/* delta (BH, T) = rowsum(dout * o), dout and o (BH, T, hs) fp32; the backward's per-row term. */
ddp_status flash_attn_delta(cudaStream_t st, const float *dout, const float *o, float *delta,
                            int BH, int T, int hs);
/* flash_attn_delta with dout in bf16, its rows as lo says: bit for bit flash_attn_delta on dout
 * widened to fp32 (the same products, summed in the same order). */
ddp_status flash_attn_delta_rows(cudaStream_t st, const uint16_t *dout, flash_layout lo,
                                 const float *o, float *delta, int BH, int T, int hs);
/* dq, dk, dv (BH, T, hs; each where its flash_out says), overwritten (not accumulated), from q,
 * k, v (rows as lq says) and dout_bf (dO rounded to bf16, rows as lo says), the forward's lse and
 * flash_attn_delta's delta (BH, T). P is recomputed from q, k and lse. Two kernels: dk and dv per
 * key tile, dq per query tile. A bf16 output holds the fp32 one's value rounded once. */
ddp_status flash_attn_bwd_rows(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, flash_layout lq, const uint16_t *dout_bf,
                               flash_layout lo, const float *lse, const float *delta, flash_out dq,
                               flash_out dk, flash_out dv, int BH, int T, int hs, float scale);
/* flash_attn_bwd_rows on contiguous heads: q, k, v and dout_bf (BH, T, hs) bf16. */
ddp_status flash_attn_bwd(cudaStream_t st, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, const uint16_t *dout_bf, const float *lse,
                          const float *delta, float *dq, float *dk, float *dv, int BH, int T,
                          int hs, float scale);

#endif /* OPS_CUDA_FLASH_H */
