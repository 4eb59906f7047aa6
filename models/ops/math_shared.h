/* math_shared.h - scalar math shared by the CPU and CUDA backends (host+device under nvcc), so
 * the CPU tests exercise the arithmetic the CUDA kernels run.
 *
 * Everything here is static inline and free of side effects beyond its output pointers. Index
 * conventions follow ops.h: row-major, images (C,H,W), stride-1 convolutions with square
 * kernel k and zero padding pad, 2x2 max-pool with stride 2.
 */
#ifndef MATH_SHARED_H
#define MATH_SHARED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define OPS_HD __host__ __device__
#else
#define OPS_HD
#endif

/* ---- activations ------------------------------------------------------------------------- */

static inline OPS_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

/* Gradient through a ReLU given its output y. */
static inline OPS_HD float relu_grad(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

/* ---- optimizer --------------------------------------------------------------------------- */

/* One element of SGD with momentum and weight decay (PyTorch's formulation): g' = g + wd * w,
 * m = momentum * m + g', w -= lr * m. Updates *m and returns the new weight. */
static inline OPS_HD float sgd_update(float w, float *m, float g, float lr, float momentum,
                                          float weight_decay)
{
    float gd = g + weight_decay * w;
    float mn = momentum * *m + gd;
    *m = mn;
    return w - lr * mn;
}

/* One element of AdamW (torch.optim.AdamW): g scaled by grad_scale (clipping), moments updated
 * in place, bias-corrected by bc1 = 1 - beta1^t and bc2 = 1 - beta2^t (computed once per step by
 * the caller), decoupled weight decay wd. Returns the new weight. */
static inline OPS_HD float adamw_update(float w, float *m, float *v, float g, float grad_scale,
                                        float lr, float beta1, float beta2, float eps, float wd,
                                        float bc1, float bc2)
{
    g *= grad_scale;
    float mn = beta1 * *m + (1.0f - beta1) * g;
    float vn = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mn;
    *v = vn;
    float mhat = mn / bc1, vhat = vn / bc2;
    return w - lr * (mhat / (sqrtf(vhat) + eps) + wd * w);
}

/* ---- GELU, the tanh approximation (GPT-2's) ---------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

static inline OPS_HD float gelu_tanh(float x)
{
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

/* d gelu_tanh(x) / dx. */
static inline OPS_HD float gelu_tanh_grad(float x)
{
    float cube = 0.044715f * x * x * x;
    float th = tanhf(GELU_SCALE * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* ---- softmax cross-entropy --------------------------------------------------------------- */

/* Largest of z[0..n) and (first) index of it. */
static inline OPS_HD float row_max(const float *z, int n, int *arg)
{
    float mx = z[0];
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (z[i] > mx) {
            mx = z[i];
            best = i;
        }
    }
    *arg = best;
    return mx;
}

/* Sum of exp(z[i] - mx): the max-subtracted softmax denominator (never overflows). */
static inline OPS_HD float softmax_denom(const float *z, int n, float mx)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += expf(z[i] - mx);
    return s;
}

/* Cross-entropy of one row of logits z (classes) against label (in range, checked by the caller).
 * Writes dz[c] = (softmax(z)[c] - [c == label]) * inv_rows when dz is not NULL and the predicted
 * class to *pred. Returns -log softmax(z)[label]. */
static inline OPS_HD float xent_row(const float *z, int label, int classes, float inv_rows,
                                        float *dz, int *pred)
{
    float mx = row_max(z, classes, pred);
    float denom = softmax_denom(z, classes, mx);
    if (dz) {
        for (int c = 0; c < classes; c++) {
            float p = expf(z[c] - mx) / denom;
            dz[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_rows;
        }
    }
    return logf(denom) - (z[label] - mx);
}

/* ---- convolution index arithmetic -------------------------------------------------------- */

/* Output side of a stride-1 convolution with zero padding. */
static inline OPS_HD int conv_out(int in, int k, int pad) { return in + 2 * pad - k + 1; }

/* Splits an im2col row index into channel and kernel offsets: row = (ci * k + ky) * k + kx. */
static inline OPS_HD void im2col_row_split(int row, int k, int *ci, int *ky, int *kx)
{
    *kx = row % k;
    *ky = (row / k) % k;
    *ci = row / (k * k);
}

/* Index into the (C,H,W) image that feeds col[row(ci,ky,kx), oy * w_out + ox], or -1 when that
 * position lies in the zero padding. */
static inline OPS_HD ptrdiff_t im2col_src(int h, int w, int pad, int ci, int ky, int kx, int oy,
                                              int ox)
{
    int y = oy + ky - pad;
    int x = ox + kx - pad;
    if (y < 0 || y >= h || x < 0 || x >= w)
        return -1;
    return ((ptrdiff_t)ci * h + y) * w + x;
}

/* Sum of every col entry that im2col copied from image element (ci, y, x): the col2im value of
 * that element, gathered (no two threads write one element). col is (c*k*k, h_out*w_out). */
static inline OPS_HD float col2im_gather(const float *col, int h, int w, int k, int pad, int ci,
                                             int y, int x)
{
    int h_out = conv_out(h, k, pad);
    int w_out = conv_out(w, k, pad);
    float s = 0.0f;
    for (int ky = 0; ky < k; ky++) {
        int oy = y + pad - ky;
        if (oy < 0 || oy >= h_out)
            continue;
        for (int kx = 0; kx < k; kx++) {
            int ox = x + pad - kx;
            if (ox < 0 || ox >= w_out)
                continue;
            ptrdiff_t row = ((ptrdiff_t)ci * k + ky) * k + kx;
            s += col[row * h_out * w_out + (ptrdiff_t)oy * w_out + ox];
        }
    }
    return s;
}

/* ---- 2x2 max-pool, stride 2 -------------------------------------------------------------- */

/* Input index of the top-left element of output (plane, oy, ox)'s window, planes of h x w. */
static inline OPS_HD ptrdiff_t pool_window(int plane, int oy, int ox, int h, int w)
{
    return ((ptrdiff_t)plane * h + 2 * oy) * w + 2 * ox;
}

/* Maximum of output (plane, oy, ox)'s 2x2 window of x; *arg receives its input index (the first
 * in row-major order on ties). */
static inline OPS_HD float pool_max(const float *x, int plane, int oy, int ox, int h, int w,
                                        int *arg)
{
    ptrdiff_t base = pool_window(plane, oy, ox, h, w);
    ptrdiff_t offs[4] = {0, 1, w, (ptrdiff_t)w + 1};
    ptrdiff_t best = base;
    for (int i = 1; i < 4; i++) {
        if (x[base + offs[i]] > x[best])
            best = base + offs[i];
    }
    *arg = (int)best;
    return x[best];
}

/* ---- transformer rows (GPT-2): LayerNorm ------------------------------------------------- */
/* One row of C channels at a time: the CPU loops over rows, a CUDA kernel may run one per thread.
 * Sums are kept in 8 lanes (fixed order, so every build and SIMD width gives the same bits) that
 * the compiler turns into vector registers. */

#ifdef __CUDACC__
#define OPS_RESTRICT __restrict__
#else
#define OPS_RESTRICT restrict
#endif

#define LAYERNORM_EPS 1e-5f /* GPT-2's (and torch.nn.LayerNorm's default) */
#define SUM_LANES 8

/* Sum of the 8 lanes, pairwise. */
static inline OPS_HD float lanes_total(const float *s)
{
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Sum of x[0..n) - c (c = 0: the plain sum), in lanes. */
static inline OPS_HD float lane_sum(const float *OPS_RESTRICT x, int n, float c)
{
    float s[SUM_LANES] = {0.0f};
    int i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            s[j] += x[i + j] - c;
    for (int j = 0; i < n; i++, j++)
        s[j] += x[i] - c;
    return lanes_total(s);
}

/* Sum of (x[0..n) - c)^2, in lanes. */
static inline OPS_HD float lane_sumsq(const float *OPS_RESTRICT x, int n, float c)
{
    float s[SUM_LANES] = {0.0f};
    int i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            s[j] += (x[i + j] - c) * (x[i + j] - c);
    for (int j = 0; i < n; i++, j++)
        s[j] += (x[i] - c) * (x[i] - c);
    return lanes_total(s);
}

/* out = (x - mean) * rstd * w + b over one row of C; writes the row's mean and rstd =
 * 1 / sqrt(biased variance + eps). The variance is taken about the mean (two passes). */
static inline OPS_HD void layernorm_row_fwd(float *OPS_RESTRICT out, float *mean, float *rstd,
                                            const float *OPS_RESTRICT x,
                                            const float *OPS_RESTRICT w,
                                            const float *OPS_RESTRICT b, int C)
{
    float m = lane_sum(x, C, 0.0f) / (float)C;
    float shift = lane_sum(x, C, m) / (float)C; /* the mean's rounding, taken back out */
    float var = lane_sumsq(x, C, m) / (float)C - shift * shift;
    float r = 1.0f / sqrtf(var + LAYERNORM_EPS);
    for (int i = 0; i < C; i++)
        out[i] = (x[i] - m) * r * w[i] + b[i];
    *mean = m;
    *rstd = r;
}

/* The backward pass of one row: with xhat = (x - mean) * rstd and g = dout * w,
 * dx += rstd * (g - mean(g) - xhat * mean(g * xhat)); dw += dout * xhat; db += dout (all add). */
static inline OPS_HD void layernorm_row_bwd(float *OPS_RESTRICT dx, float *OPS_RESTRICT dw,
                                            float *OPS_RESTRICT db,
                                            const float *OPS_RESTRICT dout,
                                            const float *OPS_RESTRICT x,
                                            const float *OPS_RESTRICT w, float mean, float rstd,
                                            int C)
{
    float sg[SUM_LANES] = {0.0f}, sgx[SUM_LANES] = {0.0f};
    int i = 0;
    for (; i + SUM_LANES <= C; i += SUM_LANES) {
        for (int j = 0; j < SUM_LANES; j++) {
            float g = dout[i + j] * w[i + j];
            sg[j] += g;
            sgx[j] += g * ((x[i + j] - mean) * rstd);
        }
    }
    for (int j = 0; i < C; i++, j++) {
        float g = dout[i] * w[i];
        sg[j] += g;
        sgx[j] += g * ((x[i] - mean) * rstd);
    }
    float mg = lanes_total(sg) / (float)C, mgx = lanes_total(sgx) / (float)C;
    for (i = 0; i < C; i++) {
        float xhat = (x[i] - mean) * rstd;
        dx[i] += rstd * (dout[i] * w[i] - mg - xhat * mgx);
        dw[i] += dout[i] * xhat;
        db[i] += dout[i];
    }
}

/* ---- transformer ops, as the CUDA kernels compute them (cuda_gpt.cu) ----------------------- */

#ifndef LAYERNORM_EPS
#define LAYERNORM_EPS 1e-5f /* GPT-2's (and torch.nn.LayerNorm's default) */
#endif

/* 1 / sqrt(var + eps): a LayerNorm row's rstd from its biased variance. */
static inline OPS_HD float layernorm_rstd(float var) { return 1.0f / sqrtf(var + LAYERNORM_EPS); }

/* One element of a LayerNorm row's input gradient: rstd * (dout w - mean(g) - xhat mean(g xhat))
 * with g = dout * w over the row (mg, mgx: those two means). */
static inline OPS_HD float layernorm_dx(float dout, float w, float xhat, float rstd, float mg,
                                        float mgx)
{
    return rstd * (dout * w - mg - xhat * mgx);
}

/* AdamW's bias corrections of step t >= 1: *bc1 = 1 - beta1^t, *bc2 = 1 - beta2^t (in double,
 * rounded once), for adamw_update. */
static inline OPS_HD void adamw_bias_corrections(float beta1, float beta2, int t, float *bc1,
                                                 float *bc2)
{
    *bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    *bc2 = (float)(1.0 - pow((double)beta2, (double)t));
}

/* ---- transformer rows (GPT-2): exp and GELU without libm calls --------------------------- */
/* libm's expf and tanhf are calls the compiler cannot vectorise (tanhf costs about 30 ns on an
 * AVX2 EPYC); these are plain arithmetic, so loops of them vectorise. */

/* e^y, branch-free: y clamped to [-87, 88] (fp32's normal range; NaN stays NaN), y = n ln2 + r
 * with |r| <= ln2 / 2 (ln2 split in two so n ln2 is exact), e^r by its degree-7 Taylor
 * polynomial (truncation under 6e-9 relative), 2^n written into the exponent bits. Within
 * 1.0e-7 relative of exp (measured over the range; expf: 0.5 ulp, 6e-8). */
static inline OPS_HD float exp_branchless(float y)
{
    y = y < -87.0f ? -87.0f : y;
    y = y > 88.0f ? 88.0f : y;
    /* round to nearest by adding 1.5 * 2^23, whose low mantissa bits then hold n: 2^n is built
     * from those bits in unsigned arithmetic (a float-to-int cast of NaN would be undefined) */
    union {
        float f;
        uint32_t u;
    } t;
    t.f = y * 1.44269504f + 12582912.0f;
    float n = t.f - 12582912.0f;
    float r = (y - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        uint32_t u;
        float f;
    } scale;
    scale.u = (t.u - 0x4B400000u + 127u) << 23; /* 0x4B400000: the bits of 1.5 * 2^23 */
    return p * scale.f;
}

/* gelu_tanh through exp: 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), which also keeps the digits
 * that 1 + tanh(u) cancels for x << 0. */
static inline OPS_HD float gelu_tanh_exp(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return x / (1.0f + exp_branchless(-2.0f * u));
}

/* gelu_tanh_grad through exp: with s = 1 / (1 + e^(-2u)), 0.5 (1 + tanh) = s and
 * 0.5 sech^2 = 2 s (1 - s). */
static inline OPS_HD float gelu_tanh_exp_grad(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float s = 1.0f / (1.0f + exp_branchless(-2.0f * u));
    return s + 2.0f * x * s * (1.0f - s) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* ---- stochastic rounding to bf16 (adamw_step_cast, the GPT's 16-bit copy of its weights) ----
 * As llm.c's: the 16 dropped bits of x against 16 random bits r, rounding away from zero when
 * they exceed r, so x rounds up with probability (dropped bits) / 2^16 and the mean of many
 * roundings is x. r is a counter-based hash of (seed, step, index), index the element's place in
 * the model's flat parameter layout: a pure function, the same on the CPU and CUDA, on every rank
 * and under every ZeRO sharding (a shard rounds element i as the whole layout does). */

/* lowbias32 (C. Wellons' hash prospector): a bijection of 32 bits whose every input bit flips
 * about half the output bits; 32-bit multiplies only, so the CPU's loops of it vectorise. */
static inline OPS_HD uint32_t sr_mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* The key of one rounding pass (seed, step), computed once per call. */
static inline OPS_HD uint64_t sr_key(uint32_t seed, uint32_t step)
{
    uint32_t a = sr_mix32(seed ^ 0x9e3779b9u), b = sr_mix32(step + a);
    return (uint64_t)sr_mix32(a ^ b ^ 0x85ebca6bu) << 32 | b;
}

/* 16 random bits of (key, index): two rounds, the index's low word then its high word. */
static inline OPS_HD uint32_t sr_bits(uint64_t key, uint64_t index)
{
    uint32_t x = sr_mix32((uint32_t)index ^ (uint32_t)key);
    return sr_mix32(x ^ (uint32_t)(index >> 32) ^ (uint32_t)(key >> 32)) >> 16;
}

/* The bfloat16 bits of x rounded stochastically with key (sr_key) at flat index `index`: one of
 * the two bf16 values around x (x itself when it is one; beyond the largest finite bf16, inf, as
 * nearest-even rounding would give). inf stays inf, NaN stays NaN (quiet, as half_f32_to_bf16). */
static inline OPS_HD uint16_t bf16_round_stochastic(float x, uint64_t key, uint64_t index)
{
    union {
        float f;
        uint32_t u;
    } b;
    b.f = x;
    uint32_t r = sr_bits(key, index);
    uint32_t rounded = (b.u >> 16) + ((b.u & 0xffffu) > r); /* sign-magnitude: +1 is away from 0 */
    uint32_t special = (b.u >> 16) | ((b.u & 0x7fffffu) ? 0x0040u : 0u); /* inf; NaN quiet */
    /* selects, no branch: the CPU's loops of it vectorise */
    return (uint16_t)((b.u & 0x7f800000u) == 0x7f800000u ? special : rounded);
}

/* The float whose bits are bfloat16 h (bf16 emulated in float storage). */
static inline OPS_HD float bf16_bits_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } b;
    b.u = (uint32_t)h << 16;
    return b.f;
}

#endif /* MATH_SHARED_H */
