/* cpu_gpt.c - the CPU's transformer ops (GPT-2): token and position embeddings, LayerNorm, causal
 * multi-head self-attention as per-(sequence, head) OpenBLAS GEMMs on strided views of qkv around
 * a causal softmax, GELU, the residual add, the cross-entropy over a padded vocabulary, and AdamW.
 * The element-wise loops run the scalar math of math_shared.h (the CUDA kernels' too), compiled
 * for AVX-512, AVX2 and the baseline (simd_clones.h) at -O3 (models/meson.build says why). One
 * thread; the GEMMs use OpenBLAS's threads.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gpt.h"
#include "half.h"
#include "math_shared.h"
#include "simd_clones.h"

/* Causal products are computed in row blocks of this many queries, each block only against the
 * keys up to its last row, once T is at least two blocks (below that one GEMM is faster). */
#define ATT_ROW_BLOCK 64

static bool shape_ok(const char *op, int a, int b, int c)
{
    if (a > 0 && b > 0 && c > 0)
        return true;
    DDP_ERROR("cpu %s: shape %d x %d x %d is not positive", op, a, b, c);
    return false;
}

/* ---- activations in act (ops.h): fp32, or 16-bit as the handle stores it ------------------- */
/* Float storage (fp32, or a 16-bit precision the CPU emulates) is read and written in place, the
 * emulated values rounded after; real bf16 storage goes through fp32 copies (ops->cast). */

static bool act_floats(const ops_handle *ops, ddp_dtype act)
{
    return ops_dtype_size(ops, act) == sizeof(float);
}

/* src (n, in act) as floats: src itself in float storage, else converted into *tmp (malloc'd,
 * the caller frees it); NULL (logged) when out of memory. */
static const float *act_in(const ops_handle *ops, ddp_dtype act, const void *src, size_t n,
                           float **tmp)
{
    *tmp = NULL;
    if (act_floats(ops, act))
        return src;
    *tmp = malloc(n * sizeof **tmp);
    if (!*tmp) {
        DDP_ERROR("cpu: out of memory converting %zu activations to fp32", n);
        return NULL;
    }
    ops->cast(ops, DDP_FP32, *tmp, act, src, n);
    return *tmp;
}

/* Where an op writes its fp32 result for dst (n, in act): dst in float storage, else *tmp
 * (malloc'd; NULL, logged, when out of memory). act_store then puts it into dst. */
static float *act_out(const ops_handle *ops, ddp_dtype act, void *dst, size_t n, float **tmp)
{
    *tmp = NULL;
    if (act_floats(ops, act))
        return dst;
    *tmp = malloc(n * sizeof **tmp);
    if (!*tmp)
        DDP_ERROR("cpu: out of memory for %zu activations in fp32", n);
    return *tmp;
}

/* dst (n, in act) = the fp32 result f of act_out (in place for float storage: the emulation's
 * rounding; nothing for fp32). */
static void act_store(const ops_handle *ops, ddp_dtype act, void *dst, const float *f, size_t n)
{
    if (act != DDP_FP32)
        ops->cast(ops, act, dst, DDP_FP32, f, n);
}

/* ---- embeddings -------------------------------------------------------------------------- */

ddp_status ops_cpu_encoder_fwd(const ops_handle *ops, float *out, const int *tokens,
                               ddp_dtype wp, const void *wte, const float *wpe, int B, int T,
                               int C)
{
    if (!shape_ok("encoder_fwd", B, T, C))
        return DDP_ERR_INVALID_ARG;
    bool bits = ops_dtype_size(ops, wp) == 2; /* bf16 bits, else float storage */
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)b * T + t, at = (size_t)tokens[row] * C;
            const float *p = wpe + (size_t)t * C;
            float *o = out + row * C; // (C)
            if (bits) {
                const uint16_t *e = (const uint16_t *)wte + at;
                for (int i = 0; i < C; i++)
                    o[i] = half_bf16_to_f32(e[i]) + p[i];
            } else {
                const float *e = (const float *)wte + at;
                for (int i = 0; i < C; i++)
                    o[i] = e[i] + p[i];
            }
        }
    }
    return DDP_OK;
}

ddp_status ops_cpu_encoder_bwd(const ops_handle *ops, float *dwte, float *dwpe, const float *dout,
                               const int *tokens, int B, int T, int C)
{
    if (!shape_ok("encoder_bwd", B, T, C))
        return DDP_ERR_INVALID_ARG;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)b * T + t;
            const float *d = dout + row * C; // (C)
            float *e = dwte + (size_t)tokens[row] * C, *p = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                e[i] += d[i];
                p[i] += d[i];
            }
        }
    }
    return DDP_OK;
}

/* ---- LayerNorm --------------------------------------------------------------------------- */

SIMD_BODY void layernorm_fwd_body(float *out, float *mean, float *rstd, const float *x,
                                      const float *w, const float *b, int rows, int C)
{
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * C;
        layernorm_row_fwd(out + o, mean + r, rstd + r, x + o, w, b, C);
    }
}
SIMD_DISPATCH(layernorm_fwd_rows, layernorm_fwd_body,
                  (float *out, float *mean, float *rstd, const float *x, const float *w,
                   const float *b, int rows, int C),
                  (out, mean, rstd, x, w, b, rows, C))

SIMD_BODY void layernorm_bwd_body(float *dx, float *dw, float *db, const float *dout,
                                      const float *x, const float *w, const float *mean,
                                      const float *rstd, int rows, int C)
{
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * C;
        layernorm_row_bwd(dx + o, dw, db, dout + o, x + o, w, mean[r], rstd[r], C);
    }
}
SIMD_DISPATCH(layernorm_bwd_rows, layernorm_bwd_body,
                  (float *dx, float *dw, float *db, const float *dout, const float *x,
                   const float *w, const float *mean, const float *rstd, int rows, int C),
                  (dx, dw, db, dout, x, w, mean, rstd, rows, C))

ddp_status ops_cpu_layernorm_fwd(const ops_handle *ops, ddp_dtype act, void *out, float *mean,
                                 float *rstd, const float *x, const float *w, const float *b,
                                 int rows, int C)
{
    if (!shape_ok("layernorm_fwd", rows, C, 1))
        return DDP_ERR_INVALID_ARG;
    size_t n = (size_t)rows * C;
    float *tmp, *o = act_out(ops, act, out, n, &tmp);
    if (!o)
        return DDP_ERR_NOMEM;
    layernorm_fwd_rows(o, mean, rstd, x, w, b, rows, C);
    act_store(ops, act, out, o, n);
    free(tmp);
    return DDP_OK;
}

ddp_status ops_cpu_layernorm_bwd(const ops_handle *ops, ddp_dtype act, float *dx, void *dx_act,
                                 float *dw, float *db, const void *dout, const float *x,
                                 const float *w, const float *mean, const float *rstd, int rows,
                                 int C)
{
    if (!shape_ok("layernorm_bwd", rows, C, 1))
        return DDP_ERR_INVALID_ARG;
    size_t n = (size_t)rows * C;
    float *tmp;
    const float *d = act_in(ops, act, dout, n, &tmp);
    if (!d)
        return DDP_ERR_NOMEM;
    layernorm_bwd_rows(dx, dw, db, d, x, w, mean, rstd, rows, C);
    free(tmp);
    if (dx_act)
        ops->cast(ops, act, dx_act, DDP_FP32, dx, n);
    return DDP_OK;
}

/* ---- attention --------------------------------------------------------------------------- */

/* One (sequence, head) of the attention: views into the row-major batch tensors. */
typedef struct att_head {
    const float *q, *k, *v; // (T, hs) each, row stride ld = 3C (views of qkv)
    int T, hs, C, ld, ldo;  // ldo = C: the row stride of out and dout
    int blk;                // query rows per causal block
    float scale;            // 1 / sqrt(hs)
} att_head;

static att_head att_head_of(const float *qkv, int b, int h, int T, int C, int NH)
{
    int hs = C / NH;
    att_head a = {.T = T, .hs = hs, .C = C, .ld = 3 * C, .ldo = C};
    a.scale = 1.0f / sqrtf((float)hs);
    a.q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    a.k = a.q + C;
    a.v = a.q + 2 * C;
    a.blk = T >= 2 * ATT_ROW_BLOCK ? ATT_ROW_BLOCK : T;
    return a;
}

/* Query rows in the block starting at r0. */
static int block_rows(const att_head *a, int r0)
{
    return a->T - r0 < a->blk ? a->T - r0 : a->blk;
}

/* c (m, n, row stride ldc) = alpha op(a) op(b), row-major: c zeroed here, then the GEMM run with
 * beta 1, which OpenBLAS skips (its beta-0 pass over c cost 16 % of the attention's time). */
static void gemm_over(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                      const float *a, int lda, const float *b, int ldb, float *c, int ldc)
{
    for (int i = 0; i < m; i++)
        memset(c + (size_t)i * ldc, 0, (size_t)n * sizeof(float));
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, 1.0f, c, ldc);
}

/* s (T, T) = alpha * x y^T for the causal part (row block [r0, r1) against columns [0, r1)):
 * x, y (T, hs) with row strides ldx, ldy. Entries above the diagonal inside a block are computed
 * too; those right of a block are not written. */
static void causal_abt(const att_head *a, float alpha, const float *x, int ldx, const float *y,
                       int ldy, float *s)
{
    for (int r0 = 0; r0 < a->T; r0 += a->blk) {
        int rows = block_rows(a, r0);
        gemm_over(CblasNoTrans, CblasTrans, rows, r0 + rows, a->hs, alpha, x + (size_t)r0 * ldx,
                  ldx, y, ldy, s + (size_t)r0 * a->T, a->T);
    }
}

/* o (T, hs, row stride ldo) = p y for a lower-triangular p (T, T), y (T, hs, row stride ldy). */
static void causal_ab(const att_head *a, const float *p, const float *y, int ldy, float *o,
                      int ldo)
{
    for (int r0 = 0; r0 < a->T; r0 += a->blk) {
        int rows = block_rows(a, r0);
        gemm_over(CblasNoTrans, CblasNoTrans, rows, a->hs, r0 + rows, 1.0f, p + (size_t)r0 * a->T,
                  a->T, y, ldy, o + (size_t)r0 * ldo, ldo);
    }
}

/* o (T, hs, row stride ldo) = p^T y for a lower-triangular p (T, T): output row j only sums
 * over rows t >= j of p. */
static void causal_atb(const att_head *a, const float *p, const float *y, int ldy, float *o,
                       int ldo)
{
    for (int j0 = 0; j0 < a->T; j0 += a->blk) {
        int rows = block_rows(a, j0);
        gemm_over(CblasTrans, CblasNoTrans, rows, a->hs, a->T - j0, 1.0f,
                  p + (size_t)j0 * a->T + j0, a->T, y + (size_t)j0 * ldy, ldy,
                  o + (size_t)j0 * ldo, ldo);
    }
}

/* Largest of x[0..n), n >= 1, in lanes (a NaN is passed over, as by row_max; the sum of the
 * exponentials then carries it). */
SIMD_BODY float lane_max(const float *x, int n)
{
    float m[SUM_LANES];
    for (int j = 0; j < SUM_LANES; j++)
        m[j] = x[0];
    int i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (int j = 0; i < n; i++, j++)
        m[j] = x[i] > m[j] ? x[i] : m[j];
    float mx = m[0];
    for (int j = 1; j < SUM_LANES; j++)
        mx = m[j] > mx ? m[j] : mx;
    return mx;
}

/* x[i] = e^(x[i] - mx) for i < n; returns their sum. */
SIMD_BODY float exp_shift_sum(float *x, int n, float mx)
{
    for (int i = 0; i < n; i++)
        x[i] = exp_branchless(x[i] - mx);
    return lane_sum(x, n, 0.0f);
}

/* Row t of s (T, T): softmax over s[0..t], 0 above the diagonal. */
SIMD_BODY void causal_softmax_body(float *s, int T)
{
    for (int t = 0; t < T; t++) {
        float *row = s + (size_t)t * T;
        float inv = 1.0f / exp_shift_sum(row, t + 1, lane_max(row, t + 1));
        for (int j = 0; j <= t; j++)
            row[j] *= inv;
        memset(row + t + 1, 0, (size_t)(T - 1 - t) * sizeof(float));
    }
}
SIMD_DISPATCH(causal_softmax, causal_softmax_body, (float *s, int T), (s, T))

/* d (T, T) holds dL/datt; becomes dL/dscores * scale (0 above the diagonal): per row,
 * att * (d - sum_j att d) * scale. */
SIMD_BODY void causal_softmax_bwd_body(float *d, const float *att, int T, float scale)
{
    for (int t = 0; t < T; t++) {
        float *restrict dr = d + (size_t)t * T;
        const float *restrict ar = att + (size_t)t * T;
        float dot[SUM_LANES] = {0.0f};
        int j = 0;
        for (; j + SUM_LANES <= t + 1; j += SUM_LANES)
            for (int l = 0; l < SUM_LANES; l++)
                dot[l] += ar[j + l] * dr[j + l];
        for (int l = 0; j <= t; j++, l++)
            dot[l] += ar[j] * dr[j];
        float total = lanes_total(dot);
        for (j = 0; j <= t; j++)
            dr[j] = ar[j] * (dr[j] - total) * scale;
        memset(dr + t + 1, 0, (size_t)(T - 1 - t) * sizeof(float));
    }
}
SIMD_DISPATCH(causal_softmax_bwd, causal_softmax_bwd_body,
                  (float *d, const float *att, int T, float scale), (d, att, T, scale))

static bool att_shape_ok(const char *op, int B, int T, int C, int NH)
{
    if (!shape_ok(op, B, T, C) || !shape_ok(op, NH, 1, 1))
        return false;
    if (C % NH == 0)
        return true;
    DDP_ERROR("cpu %s: %d channels do not split into %d heads", op, C, NH);
    return false;
}

/* attention_fwd on fp32 qkv and out. */
static void attention_fwd_f32(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH)
{
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            att_head a = att_head_of(qkv, b, h, T, C, NH);
            float *s = att + ((size_t)b * NH + h) * T * T; // (T, T)
            causal_abt(&a, a.scale, a.q, a.ld, a.k, a.ld, s);
            causal_softmax(s, T);
            causal_ab(&a, s, a.v, a.ld, out + (size_t)b * T * C + (size_t)h * a.hs, a.ldo);
        }
    }
}

ddp_status ops_cpu_attention_fwd(const ops_handle *ops, ddp_dtype p, ddp_dtype act, void *out,
                                 float *att, const void *qkv, int B, int T, int C, int NH)
{
    (void)p; /* fp32 on the CPU whatever the run's precision */
    if (!att_shape_ok("attention_fwd", B, T, C, NH))
        return DDP_ERR_INVALID_ARG;
    size_t n = (size_t)B * T * C;
    float *tmp_in, *tmp_out;
    const float *q = act_in(ops, act, qkv, 3 * n, &tmp_in);
    float *o = q ? act_out(ops, act, out, n, &tmp_out) : NULL;
    if (o) {
        attention_fwd_f32(o, att, q, B, T, C, NH);
        act_store(ops, act, out, o, n);
        free(tmp_out);
    }
    free(tmp_in);
    return o ? DDP_OK : DDP_ERR_NOMEM;
}

/* One head's backward pass: dq, dk, dv (T, hs, row stride 3C) from dout (T, hs, row stride C). */
static void head_bwd(const att_head *a, float *dq, float *d, const float *dout, const float *att)
{
    float *dk = dq + a->C, *dv = dq + 2 * a->C;
    causal_atb(a, att, dout, a->ldo, dv, a->ld);        /* dv = att^T dout */
    causal_abt(a, 1.0f, dout, a->ldo, a->v, a->ld, d);  /* datt = dout v^T */
    causal_softmax_bwd(d, att, a->T, a->scale);          /* d = dscores * scale */
    causal_ab(a, d, a->k, a->ld, dq, a->ld);             /* dq = d k */
    causal_atb(a, d, a->q, a->ld, dk, a->ld);            /* dk = d^T q */
}

/* attention_bwd on fp32 dqkv, dout and qkv. */
static void attention_bwd_f32(float *dqkv, float *datt, const float *dout, const float *qkv,
                              const float *att, int B, int T, int C, int NH)
{
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            att_head a = att_head_of(qkv, b, h, T, C, NH);
            size_t head = ((size_t)b * NH + h) * T * T, col = (size_t)h * a.hs;
            head_bwd(&a, dqkv + (size_t)b * T * 3 * C + col, datt + head,
                     dout + (size_t)b * T * C + col, att + head);
        }
    }
}

ddp_status ops_cpu_attention_bwd(const ops_handle *ops, ddp_dtype p, ddp_dtype act, void *dqkv,
                                 float *datt, const void *dout, const void *qkv, const float *att,
                                 int B, int T, int C, int NH)
{
    (void)p;
    if (!att_shape_ok("attention_bwd", B, T, C, NH))
        return DDP_ERR_INVALID_ARG;
    size_t n = (size_t)B * T * C;
    float *tmp_dy, *tmp_qkv = NULL, *tmp_dqkv = NULL;
    const float *dy = act_in(ops, act, dout, n, &tmp_dy);
    const float *q = dy ? act_in(ops, act, qkv, 3 * n, &tmp_qkv) : NULL;
    float *dq = q ? act_out(ops, act, dqkv, 3 * n, &tmp_dqkv) : NULL;
    if (dq) {
        attention_bwd_f32(dq, datt, dy, q, att, B, T, C, NH);
        act_store(ops, act, dqkv, dq, 3 * n);
    }
    free(tmp_dqkv);
    free(tmp_qkv);
    free(tmp_dy);
    return dq ? DDP_OK : DDP_ERR_NOMEM;
}

size_t ops_cpu_attention_floats(const ops_handle *ops, ddp_dtype p, int B, int T, int C, int NH)
{
    (void)ops, (void)p, (void)C;
    return (size_t)B * NH * T * T; /* the probabilities (B, NH, T, T) */
}

/* ---- GELU and the residual add ----------------------------------------------------------- */

SIMD_BODY void gelu_fwd_body(float *restrict y, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = gelu_tanh_exp(x[i]);
}
SIMD_DISPATCH(gelu_fwd_loop, gelu_fwd_body, (float *restrict y, const float *restrict x,
                                                 size_t n), (y, x, n))

/* dx may alias dy: element-wise, each read before its write. */
SIMD_BODY void gelu_bwd_body(float *dx, const float *x, const float *dy, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * gelu_tanh_exp_grad(x[i]);
}
SIMD_DISPATCH(gelu_bwd_loop, gelu_bwd_body, (float *dx, const float *x, const float *dy,
                                                 size_t n), (dx, x, dy, n))

SIMD_BODY void add_body(float *y, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}
SIMD_DISPATCH(add_loop, add_body, (float *y, const float *a, const float *b, size_t n),
                  (y, a, b, n))

ddp_status ops_cpu_gelu_fwd(const ops_handle *ops, ddp_dtype act, void *y, const void *x,
                            size_t n)
{
    float *tmp_x, *tmp_y = NULL;
    const float *xf = act_in(ops, act, x, n, &tmp_x);
    float *yf = xf ? act_out(ops, act, y, n, &tmp_y) : NULL;
    if (yf) {
        gelu_fwd_loop(yf, xf, n);
        act_store(ops, act, y, yf, n);
    }
    free(tmp_y);
    free(tmp_x);
    return yf ? DDP_OK : DDP_ERR_NOMEM;
}

ddp_status ops_cpu_gelu_bwd(const ops_handle *ops, ddp_dtype act, void *dx, const void *x,
                            const void *dy, size_t n)
{
    float *tmp_x, *tmp_dy = NULL, *tmp_dx = NULL;
    const float *xf = act_in(ops, act, x, n, &tmp_x);
    const float *dyf = xf ? act_in(ops, act, dy, n, &tmp_dy) : NULL;
    float *dxf = dyf ? act_out(ops, act, dx, n, &tmp_dx) : NULL;
    if (dxf) {
        gelu_bwd_loop(dxf, xf, dyf, n);
        act_store(ops, act, dx, dxf, n);
    }
    free(tmp_dx);
    free(tmp_dy);
    free(tmp_x);
    return dxf ? DDP_OK : DDP_ERR_NOMEM;
}

ddp_status ops_cpu_add(const ops_handle *ops, ddp_dtype act, float *y, const float *a,
                       const void *b, size_t n)
{
    float *tmp;
    const float *bf = act_in(ops, act, b, n, &tmp);
    if (!bf)
        return DDP_ERR_NOMEM;
    add_loop(y, a, bf, n);
    free(tmp);
    return DDP_OK;
}

/* ---- cross-entropy ----------------------------------------------------------------------- */

/* Sum of e^(z[c] - mx) over c < V, in lanes (nothing stored). */
SIMD_BODY float exp_sum(const float *z, int V, float mx)
{
    float s[SUM_LANES] = {0.0f};
    int c = 0;
    for (; c + SUM_LANES <= V; c += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            s[j] += exp_branchless(z[c + j] - mx);
    for (int j = 0; c < V; c++, j++)
        s[j] += exp_branchless(z[c] - mx);
    return lanes_total(s);
}

/* Loss of one row z (Vp) against target over its first V columns; when d is not NULL (it may be
 * z itself) d = (softmax - onehot) * dscale there and 0 in the padding. One exp per logit: d
 * holds the exponentials until the sum is known. */
SIMD_BODY float xent_row_body(float *d, const float *z, int target, int V, int Vp,
                                  float dscale)
{
    float mx = lane_max(z, V), zt = z[target], sum;
    if (!d)
        return logf(exp_sum(z, V, mx)) - (zt - mx);
    if (d != z)
        memcpy(d, z, (size_t)V * sizeof(float));
    sum = exp_shift_sum(d, V, mx);
    float inv = dscale / sum;
    for (int c = 0; c < V; c++)
        d[c] *= inv;
    d[target] -= dscale;
    memset(d + V, 0, (size_t)(Vp - V) * sizeof(float));
    return logf(sum) - (zt - mx);
}

/* Every row's loss (and gradient); one function per SIMD clone. */
SIMD_BODY void xent_rows_body(float *dlogits, float *losses, const float *logits,
                                  const int *targets, int rows, int V, int Vp, float dscale)
{
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * Vp;
        losses[r] = xent_row_body(dlogits ? dlogits + o : NULL, logits + o, targets[r], V, Vp,
                                  dscale);
    }
}
SIMD_DISPATCH(xent_rows, xent_rows_body,
                  (float *dlogits, float *losses, const float *logits, const int *targets,
                   int rows, int V, int Vp, float dscale),
                  (dlogits, losses, logits, targets, rows, V, Vp, dscale))

/* Rows of real bf16 storage go through fp32 in chunks of this many rows (a bounded copy, not one
 * of the whole logits). */
enum { XENT_CHUNK_ROWS = 32 };

ddp_status ops_cpu_xent_fwd_bwd(const ops_handle *ops, ddp_dtype act, void *dlogits,
                                float *losses, const void *logits, const int *targets, int rows,
                                int V, int Vp, float dscale)
{
    if (!shape_ok("xent_fwd_bwd", rows, V, Vp))
        return DDP_ERR_INVALID_ARG;
    if (Vp < V) {
        DDP_ERROR("cpu xent_fwd_bwd: padded vocabulary %d below the vocabulary %d", Vp, V);
        return DDP_ERR_INVALID_ARG;
    }
    if (act_floats(ops, act)) {
        xent_rows(dlogits, losses, logits, targets, rows, V, Vp, dscale);
        if (dlogits)
            act_store(ops, act, dlogits, dlogits, (size_t)rows * Vp);
        return DDP_OK;
    }
    float *z = malloc((size_t)XENT_CHUNK_ROWS * Vp * sizeof *z);
    if (!z) {
        DDP_ERROR("cpu xent_fwd_bwd: out of memory for %d rows of %d logits", XENT_CHUNK_ROWS, Vp);
        return DDP_ERR_NOMEM;
    }
    size_t es = ops_dtype_size(ops, act);
    for (int r = 0; r < rows; r += XENT_CHUNK_ROWS) {
        int n = rows - r < XENT_CHUNK_ROWS ? rows - r : XENT_CHUNK_ROWS;
        size_t off = (size_t)r * Vp;
        ops->cast(ops, DDP_FP32, z, act, (const char *)logits + off * es, (size_t)n * Vp);
        xent_rows(dlogits ? z : NULL, losses + r, z, targets + r, n, V, Vp, dscale);
        if (dlogits)
            ops->cast(ops, act, (char *)dlogits + off * es, DDP_FP32, z, (size_t)n * Vp);
    }
    free(z);
    return DDP_OK;
}

/* ---- AdamW ------------------------------------------------------------------------------- */

/* One step's hyperparameters, bias corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t included. */
typedef struct adamw_hp {
    float lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
} adamw_hp;

/* The four buffers are distinct allocations. */
SIMD_BODY void adamw_body(float *restrict w, float *restrict m, float *restrict v,
                              const float *restrict g, size_t n, adamw_hp h)
{
    for (size_t i = 0; i < n; i++)
        w[i] = adamw_update(w[i], &m[i], &v[i], g[i], h.grad_scale, h.lr, h.beta1, h.beta2, h.eps,
                            h.wd, h.bc1, h.bc2);
}
SIMD_DISPATCH(adamw_loop, adamw_body,
                  (float *restrict w, float *restrict m, float *restrict v,
                   const float *restrict g, size_t n, adamw_hp h),
                  (w, m, v, g, n, h))

ddp_status ops_cpu_adamw_step(const ops_handle *ops, float *w, float *m, float *v, const float *g,
                              size_t n, float lr, float beta1, float beta2, float eps, float wd,
                              int t, float grad_scale, const float *grad_scale_dev)
{
    if (t < 1) {
        DDP_ERROR("cpu adamw_step: step %d (steps count from 1)", t);
        return DDP_ERR_INVALID_ARG;
    }
    adamw_hp h = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .wd = wd,
                  .grad_scale = grad_scale_dev ? *grad_scale_dev : grad_scale};
    h.bc1 = (float)(1.0 - pow(beta1, t)); /* in double, as PyTorch's Python scalars */
    h.bc2 = (float)(1.0 - pow(beta2, t));
    adamw_loop(w, m, v, g, n, h);
    return DDP_OK;
}

/* ---- AdamW that writes the bf16 copy (adamw_step_cast) ---------------------------------- */

/* src rounded stochastically to bf16 (the flat layout's index0 + i): bits into wc, or floats
 * into wf when wc is NULL. */
SIMD_BODY void cast_bf16_sr_body(const float *restrict src, size_t n, uint64_t key,
                                 uint64_t index0, uint16_t *restrict wc, float *restrict wf)
{
    if (wc)
        for (size_t i = 0; i < n; i++)
            wc[i] = bf16_round_stochastic(src[i], key, index0 + i);
    else
        for (size_t i = 0; i < n; i++)
            wf[i] = bf16_bits_to_f32(bf16_round_stochastic(src[i], key, index0 + i));
}

#define ADAMW_CAST_BLOCK 2048 /* elements: a block's new weights are still in L1 when rounded */

/* adamw_body block by block, each block's new weights then rounded while in L1: one pass over
 * memory, two vectorised loops (in one loop GCC vectorises neither). */
SIMD_BODY void adamw_bf16_body(float *restrict w, float *restrict m, float *restrict v,
                               const float *restrict g, size_t n, adamw_hp h, uint64_t key,
                               uint64_t index0, uint16_t *restrict wc, float *restrict wf)
{
    for (size_t a = 0; a < n; a += ADAMW_CAST_BLOCK) {
        size_t k = n - a < ADAMW_CAST_BLOCK ? n - a : ADAMW_CAST_BLOCK;
        adamw_body(w + a, m + a, v + a, g + a, k, h);
        cast_bf16_sr_body(w + a, k, key, index0 + a, wc ? wc + a : NULL, wc ? NULL : wf + a);
    }
}
SIMD_DISPATCH(adamw_bf16_loop, adamw_bf16_body,
              (float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
               size_t n, adamw_hp h, uint64_t key, uint64_t index0, uint16_t *restrict wc,
               float *restrict wf),
              (w, m, v, g, n, h, key, index0, wc, wf))
SIMD_DISPATCH(cast_bf16_sr_loop, cast_bf16_sr_body,
              (const float *restrict src, size_t n, uint64_t key, uint64_t index0,
               uint16_t *restrict wc, float *restrict wf),
              (src, n, key, index0, wc, wf))

ddp_status ops_cpu_adamw_bf16(float *w, float *m, float *v, const float *g, size_t n, float lr,
                              float beta1, float beta2, float eps, float wd, int t,
                              float grad_scale, uint16_t *wc, float *wf, uint32_t seed,
                              size_t index0)
{
    if (t < 1) {
        DDP_ERROR("cpu adamw_step_cast: step %d (steps count from 1)", t);
        return DDP_ERR_INVALID_ARG;
    }
    adamw_hp h = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .wd = wd,
                  .grad_scale = grad_scale};
    h.bc1 = (float)(1.0 - pow(beta1, t)); /* ops_cpu_adamw_step's */
    h.bc2 = (float)(1.0 - pow(beta2, t));
    adamw_bf16_loop(w, m, v, g, n, h, sr_key(seed, (uint32_t)t), index0, wc, wf);
    return DDP_OK;
}

void ops_cpu_cast_bf16_sr(const float *src, size_t n, uint32_t seed, uint32_t step, size_t index0,
                          uint16_t *wc, float *wf)
{
    cast_bf16_sr_loop(src, n, sr_key(seed, step), index0, wc, wf);
}
