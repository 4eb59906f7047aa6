/* ops_cpu.c - the CPU ops handle: OpenBLAS sgemm, plain loops over the scalar math of
 * math_shared.h (the same math the CUDA kernels run), and the precision-aware layer ops: oneDNN
 * convolutions and pooling in every precision, OpenBLAS for fp32 GEMM, oneDNN matmul for bf16.
 * bf16 is computed natively where the CPU has AVX512_BF16 or AMX (and DDP_CPU_ISA does not cap them
 * away), elsewhere emulated as fp16 always is: float storage, fp32 primitives, every op's output
 * rounded. Always built.
 */
#include <cblas.h>
#include <immintrin.h>
#include <limits.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dnnl.h"
#include "cpu_gpt.h"
#include "cpu_isa.h"
#include "half.h"
#include "math_shared.h"
#include "ops.h"
#include "simd_clones.h"
#include "switches.h"

/* The state of a CPU handle. */
typedef struct cpu_state {
    int threads;
    bool gemm_on_dnnl; /* fp32 GEMMs on oneDNN's matmul (gemm_on_dnnl()), chosen at open */
    dnnl_state *dnnl;  /* oneDNN's engine, stream and primitives */
    float *scratch;    // (scratch_n) conv_bwd_params' weight gradient when accumulating
    size_t scratch_n;
} cpu_state;

static cpu_state *cpu_of(const ops_handle *ops) { return ops->state; }

/* ---- gemm -------------------------------------------------------------------------------- */

static ddp_status cpu_gemm(const ops_handle *ops, bool trans_a, bool trans_b, int m, int n, int k,
                           float alpha, const float *a, const float *b, float beta, float *c)
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

static ddp_status cpu_bias_add(const ops_handle *ops, float *y, const float *bias, int rows,
                               int cols)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            y[(size_t)r * cols + c] += bias[c];
    return DDP_OK;
}

static ddp_status cpu_bias_grad(const ops_handle *ops, float *dbias, const float *dy, int rows,
                                int cols)
{
    for (int c = 0; c < cols; c++) {
        float s = 0.0f;
        for (int r = 0; r < rows; r++)
            s += dy[(size_t)r * cols + c];
        dbias[c] += s;
    }
    return DDP_OK;
}

static ddp_status cpu_relu_fwd(const ops_handle *ops, float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = relu(x[i]);
    return DDP_OK;
}

static ddp_status cpu_relu_bwd(const ops_handle *ops, float *dx, const float *dy, const float *y,
                               size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = relu_grad(dy[i], y[i]);
    return DDP_OK;
}

static ddp_status cpu_axpy(const ops_handle *ops, float *y, const float *x, size_t n, float alpha)
{
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return DDP_OK;
}

/* The three buffers are distinct allocations (restrict lets the loop vectorise). */
static ddp_status cpu_sgd_step(const ops_handle *ops, float *restrict w, float *restrict m,
                               const float *restrict g, size_t n, float lr, float momentum,
                               float weight_decay)
{
    for (size_t i = 0; i < n; i++)
        w[i] = sgd_update(w[i], &m[i], g[i], lr, momentum, weight_decay);
    return DDP_OK;
}

/* ---- convolution helpers ----------------------------------------------------------------- */

static ddp_status cpu_im2col(const ops_handle *ops, const float *im, int c, int h, int w, int k,
                             int pad, float *col)
{
    int h_out = conv_out(h, k, pad), w_out = conv_out(w, k, pad);
    if (k < 1 || pad < 0 || h_out < 1 || w_out < 1)
        return DDP_ERR_INVALID_ARG;
    for (int row = 0; row < c * k * k; row++) {
        int ci, ky, kx;
        im2col_row_split(row, k, &ci, &ky, &kx);
        float *dst = col + (size_t)row * h_out * w_out; // (h_out, w_out)
        for (int oy = 0; oy < h_out; oy++) {
            for (int ox = 0; ox < w_out; ox++) {
                ptrdiff_t src = im2col_src(h, w, pad, ci, ky, kx, oy, ox);
                dst[oy * w_out + ox] = src < 0 ? 0.0f : im[src];
            }
        }
    }
    return DDP_OK;
}

static ddp_status cpu_col2im(const ops_handle *ops, const float *col, int c, int h, int w, int k,
                             int pad, float *im)
{
    if (k < 1 || pad < 0 || conv_out(h, k, pad) < 1 || conv_out(w, k, pad) < 1)
        return DDP_ERR_INVALID_ARG;
    for (int ci = 0; ci < c; ci++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                im[((size_t)ci * h + y) * w + x] += col2im_gather(col, h, w, k, pad, ci, y, x);
    return DDP_OK;
}

static ddp_status cpu_maxpool_fwd(const ops_handle *ops, const float *x, int planes, int h, int w,
                                  float *y, int *argmax)
{
    if (h % 2 || w % 2 || (size_t)planes * h * w > INT_MAX)
        return DDP_ERR_INVALID_ARG;
    int ho = h / 2, wo = w / 2;
    for (int p = 0; p < planes; p++) {
        for (int oy = 0; oy < ho; oy++) {
            for (int ox = 0; ox < wo; ox++) {
                size_t o = ((size_t)p * ho + oy) * wo + ox;
                y[o] = pool_max(x, p, oy, ox, h, w, &argmax[o]);
            }
        }
    }
    return DDP_OK;
}

static ddp_status cpu_maxpool_bwd(const ops_handle *ops, const float *dy, const int *argmax,
                                  int planes, int h, int w, float *dx)
{
    size_t n_out = (size_t)planes * (h / 2) * (w / 2);
    for (size_t o = 0; o < n_out; o++)
        dx[argmax[o]] += dy[o];
    return DDP_OK;
}

static ddp_status cpu_softmax_xent(const ops_handle *ops, const float *logits, const int *labels,
                                   int rows, int classes, float *dlogits, float *loss_host,
                                   int *correct_host)
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
        loss += xent_row(logits + (size_t)r * classes, labels[r], classes, 1.0f / (float)rows,
                             dz, &pred);
        correct += pred == labels[r];
    }
    if (loss_host)
        *loss_host = (float)(loss / rows);
    if (correct_host)
        *correct_host = correct;
    return DDP_OK;
}

static ddp_status cpu_softmax_xent_acc(const ops_handle *ops, const float *logits,
                                       const int *labels, int rows, int classes, float *dlogits,
                                       float *loss_acc)
{
    float loss = 0.0f;
    ddp_status st = cpu_softmax_xent(ops, logits, labels, rows, classes, dlogits, &loss, NULL);
    if (st == DDP_OK)
        *loss_acc += loss;
    return st;
}

/* ---- precision-aware layer ops ---------------------------------------------------------------- */

/* Every precision runs on every x86-64 CPU: bf16 without bf16 arithmetic is emulated. */
static bool cpu_supports(const ops_handle *ops, ddp_dtype p, const char **why)
{
    (void)ops, (void)p, (void)why;
    return true;
}

/* oneDNN 2.6 has bf16 kernels only from AVX512_CORE up and emulates bf16 below them slower than
 * fp32: without AVX512_BF16 or AMX, bf16 is emulated on fp32 primitives instead (float storage). */
static bool emulated(ddp_dtype p)
{
    return p == DDP_FP16 || (p == DDP_BF16 && !cpu_bf16_native());
}

static bool cpu_emulates(const ops_handle *ops, ddp_dtype p)
{
    (void)ops;
    return emulated(p);
}

/* Whether p is stored as 16-bit bfloat16 (computed natively). */
static bool cpu_bf16_stored(ddp_dtype p) { return p == DDP_BF16 && !emulated(p); }


/* The same rounding with F16C's conversions (8 floats per instruction), where the CPU has them. */
__attribute__((target("f16c,avx"))) static void cpu_round_fp16_f16c(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++)
        x[i] = half_f16_to_f32(half_f32_to_f16(x[i]));
}

/* Rounds x[0..n) to IEEE half in place (values beyond 65504 become inf, as fp16 storage would);
 * F16C's conversions where the CPU has them (and DDP_CPU_ISA leaves them). */
static void cpu_round_fp16(float *x, size_t n)
{
    if (cpu_effective()->f16c) {
        cpu_round_fp16_f16c(x, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        x[i] = half_f16_to_f32(half_f32_to_f16(x[i]));
}

/* float -> bfloat16 with AVX512_BF16's conversion, 16 per instruction (round to nearest even, as
 * half_f32_to_bf16; only CPUs that have it compute in bf16, see cpu_supports). */
__attribute__((target("avx512f,avx512bf16"))) static void cpu_to_bf16_avx512(uint16_t *d,
                                                                             const float *s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + i));
        _mm256_storeu_si256((__m256i *)(void *)(d + i), (__m256i)h);
    }
    for (; i < n; i++)
        d[i] = half_f32_to_bf16(s[i]);
}

static void cpu_cast_to_bf16(uint16_t *d, const float *s, size_t n)
{
    if (cpu_bf16_native()) {
        cpu_to_bf16_avx512(d, s, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        d[i] = half_f32_to_bf16(s[i]);
}

/* SGD (cpu_sgd_step's math, operation for operation) and the bf16 copy of each block of 16
 * updated weights while they are in registers: a pass over the fp32 weights fewer than sgd_step
 * then cast. perf on the bf16 MLP at 2 ranks (a step bound by memory traffic): SGD and cast 14 %
 * of a rank's time, this 11 %. */
__attribute__((target("avx512f,avx512bf16"))) static void
cpu_sgd_bf16_avx512(float *restrict w, float *restrict m, const float *restrict g, size_t n, float lr,
                    float momentum, float weight_decay, uint16_t *restrict wc)
{
    const __m512 vlr = _mm512_set1_ps(lr), vmom = _mm512_set1_ps(momentum);
    const __m512 vwd = _mm512_set1_ps(weight_decay);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) { /* sgd_update's operations in its order, unfused */
        __m512 wi = _mm512_loadu_ps(w + i);
        __m512 gd = _mm512_add_ps(_mm512_loadu_ps(g + i), _mm512_mul_ps(vwd, wi));
        __m512 mn = _mm512_add_ps(_mm512_mul_ps(vmom, _mm512_loadu_ps(m + i)), gd);
        wi = _mm512_sub_ps(wi, _mm512_mul_ps(vlr, mn));
        _mm512_storeu_ps(m + i, mn);
        _mm512_storeu_ps(w + i, wi);
        _mm256_storeu_si256((__m256i *)(void *)(wc + i), (__m256i)_mm512_cvtneps_pbh(wi));
    }
    for (; i < n; i++) {
        w[i] = sgd_update(w[i], &m[i], g[i], lr, momentum, weight_decay);
        wc[i] = half_f32_to_bf16(w[i]);
    }
}

/* Rounds x[0..n) to bfloat16 in place (nearest even, as half_f32_to_bf16; NaN stays NaN): the bf16
 * emulation's rounding, written without branches so every clone vectorises it. */
SIMD_BODY void round_bf16_body(float *x, size_t n)
{
    uint32_t *u = (uint32_t *)(void *)x;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = u[i], nan = (v & 0x7fffffffu) > 0x7f800000u;
        uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) & 0xffff0000u;
        u[i] = nan ? (v | 0x00400000u) & 0xffff0000u : rounded;
    }
}
SIMD_DISPATCH(cpu_round_bf16, round_bf16_body, (float *x, size_t n), (x, n))

/* An emulated op's fp32 output rounded to what storage in p would hold (fp32: nothing). */
static void cpu_round_to(ddp_dtype p, float *x, size_t n)
{
    if (p == DDP_FP16)
        cpu_round_fp16(x, n);
    else if (p == DDP_BF16 && emulated(p))
        cpu_round_bf16(x, n);
}

static ddp_status cpu_cast(const ops_handle *ops, ddp_dtype to, void *dst, ddp_dtype from,
                           const void *src, size_t n)
{
    if (cpu_bf16_stored(to) && !cpu_bf16_stored(from)) {
        cpu_cast_to_bf16(dst, src, n);
        return DDP_OK;
    }
    if (cpu_bf16_stored(from) && !cpu_bf16_stored(to)) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = half_bf16_to_f32(s[i]);
        cpu_round_to(to, d, n);
        return DDP_OK;
    }
    if (dst != src)
        memmove(dst, src, n * (cpu_bf16_stored(to) ? 2 : 4));
    if (to != from) /* float storage both: round to the narrower (a value of p is exact in fp32) */
        cpu_round_to(to, dst, n);
    return DDP_OK;
}

/* x *= alpha in dt's storage as the handle keeps it: bf16 bits, or floats rounded as the
 * emulation's. */
static ddp_status cpu_scale(const ops_handle *ops, ddp_dtype dt, void *x, size_t n, float alpha)
{
    if (ops_dtype_size(ops, dt) != sizeof(float)) { /* bf16 bits (fp16 is always emulated) */
        uint16_t *h = x;
        for (size_t i = 0; i < n; i++)
            h[i] = half_f32_to_bf16(half_bf16_to_f32(h[i]) * alpha);
        return DDP_OK;
    }
    float *f = x;
    for (size_t i = 0; i < n; i++)
        f[i] *= alpha;
    cpu_round_to(dt, f, n);
    return DDP_OK;
}

static ddp_status cpu_sgd_step_cast(const ops_handle *ops, float *w, float *m, const float *g,
                                    size_t n, float lr, float momentum, float weight_decay,
                                    ddp_dtype p, void *wc)
{
    if (cpu_bf16_stored(p)) {
        cpu_sgd_bf16_avx512(w, m, g, n, lr, momentum, weight_decay, wc);
        return DDP_OK;
    }
    TRY_OK(cpu_sgd_step(ops, w, m, g, n, lr, momentum, weight_decay));
    return p == DDP_FP32 ? DDP_OK : cpu_cast(ops, p, wc, DDP_FP32, w, n);
}

/* AdamW's pass that also writes the copy: bf16 in cpu_gpt.c (ops_cpu_adamw_bf16, its flags
 * vectorise it), fp16 cast after (nearest even). */
static ddp_status cpu_adamw_step_cast(const ops_handle *ops, float *w, float *m, float *v,
                                      const float *g, size_t n, float lr, float beta1,
                                      float beta2, float eps, float wd, int t, float grad_scale,
                                      const float *grad_scale_dev, ddp_dtype p, void *wc,
                                      uint32_t seed, size_t index0)
{
    if (p != DDP_BF16) {
        TRY_OK(ops_cpu_adamw_step(ops, w, m, v, g, n, lr, beta1, beta2, eps, wd, t, grad_scale,
                                  grad_scale_dev));
        return p == DDP_FP32 ? DDP_OK : cpu_cast(ops, p, wc, DDP_FP32, w, n);
    }
    bool stored = cpu_bf16_stored(p);
    return ops_cpu_adamw_bf16(w, m, v, g, n, lr, beta1, beta2, eps, wd, t,
                              grad_scale_dev ? *grad_scale_dev : grad_scale, stored ? wc : NULL,
                              stored ? NULL : wc, seed, index0);
}

static ddp_status cpu_cast_stochastic(const ops_handle *ops, ddp_dtype p, void *dst,
                                      const float *src, size_t n, uint32_t seed, uint32_t step,
                                      size_t index0)
{
    if (p != DDP_BF16)
        return cpu_cast(ops, p, dst, DDP_FP32, src, n);
    bool stored = cpu_bf16_stored(p);
    ops_cpu_cast_bf16_sr(src, n, seed, step, index0, stored ? dst : NULL, stored ? NULL : dst);
    return DDP_OK;
}

/* The 16-bit emulation: an op's fp32 output rounded to what storage in p would hold. */
static ddp_status cpu_emulate(ddp_dtype p, void *y, size_t n, ddp_status st)
{
    if (st == DDP_OK)
        cpu_round_to(p, y, n);
    return st;
}

/* db (cols) += column sums of dy (rows, cols) in precision p, summed in fp32. */
static void cpu_colsum(const ops_handle *ops, ddp_dtype p, float *db, const void *dy, int rows,
                       int cols)
{
    if (!cpu_bf16_stored(p)) {
        cpu_bias_grad(ops, db, dy, rows, cols);
        return;
    }
    const uint16_t *d = dy;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            db[c] += half_bf16_to_f32(d[(size_t)r * cols + c]);
}

/* Which library runs fp32 (and emulated fp16) GEMMs: oneDNN's matmul where oneDNN has AVX-512
 * kernels (measured at the MLP's shapes on AMD Zen with AVX-512, one thread: 200-220 GFLOP/s
 * against OpenBLAS 0.3.21's 165-200 with SkylakeX kernels and 100-110 with Haswell ones), OpenBLAS
 * elsewhere. DDP_CPU_GEMM=openblas|onednn overrides (comparisons); the choice is made once, so
 * every run of a program on one machine computes alike. */
static bool gemm_on_dnnl(void)
{
    const char *env = getenv("DDP_CPU_GEMM");
    if (env && strcmp(env, "openblas") == 0)
        return false;
    if (env && strcmp(env, "onednn") == 0)
        return true;
    return ops_dnnl_has_avx512();
}

static bool cpu_gemm_on_dnnl(const ops_handle *ops) { return cpu_of(ops)->gemm_on_dnnl; }

const char *ops_cpu_gemm_name(ddp_dtype p)
{
    return cpu_bf16_stored(p) || gemm_on_dnnl() ? "oneDNN matmul" : "OpenBLAS";
}

static ddp_status cpu_linear_fwd(const ops_handle *ops, ddp_dtype p, const void *x, const void *w,
                                 const float *b, int batch, int in, int out, void *y, bool y_fp32)
{
    if (cpu_bf16_stored(p))
        return ops_dnnl_matmul(cpu_of(ops)->dnnl, p, batch, out, in, x, false, w, true, b, y, y_fp32, false);
    ddp_status st = DDP_OK;
    if (cpu_gemm_on_dnnl(ops))
        st = ops_dnnl_matmul(cpu_of(ops)->dnnl, DDP_FP32, batch, out, in, x, false, w, true, b, y, true, false);
    else if ((st = cpu_gemm(ops, false, true, batch, out, in, 1.0f, x, w, 0.0f, y)) == DDP_OK && b)
        st = cpu_bias_add(ops, y, b, batch, out);
    return cpu_emulate(y_fp32 ? DDP_FP32 : p, y, (size_t)batch * out, st);
}

/* Overwriting (accumulate false) spares the zeroing pass and the GEMM's read of dw: +6 % samples/s
 * for the bf16 MLP at 2 ranks, +1 % in fp32 (median of 6 back-to-back pairs each; memory traffic
 * bounds the bf16 step). */
static ddp_status cpu_linear_bwd_params(const ops_handle *ops, ddp_dtype p, const void *x,
                                        const void *dy, int batch, int in, int out, float *dw,
                                        float *db, bool accumulate)
{
    if (dw && (cpu_bf16_stored(p) || cpu_gemm_on_dnnl(ops)))
        TRY_OK(ops_dnnl_matmul(cpu_of(ops)->dnnl, cpu_bf16_stored(p) ? p : DDP_FP32, out, in, batch, dy, true, x,
                               false, NULL, dw, true, accumulate));
    else if (dw)
        TRY_OK(cpu_gemm(ops, true, false, out, in, batch, 1.0f, dy, x, accumulate ? 1.0f : 0.0f, dw));
    if (db && !accumulate)
        memset(db, 0, (size_t)(out > 0 ? out : 0) * sizeof *db);
    if (db)
        cpu_colsum(ops, p, db, dy, batch, out);
    return DDP_OK;
}

static ddp_status cpu_linear_bwd_input(const ops_handle *ops, ddp_dtype p, const void *w,
                                       const void *dy, int batch, int in, int out, void *dx)
{
    if (cpu_bf16_stored(p))
        return ops_dnnl_matmul(cpu_of(ops)->dnnl, p, batch, in, out, dy, false, w, false, NULL, dx, false, false);
    if (cpu_gemm_on_dnnl(ops))
        return cpu_emulate(p, dx, (size_t)batch * in,
                           ops_dnnl_matmul(cpu_of(ops)->dnnl, DDP_FP32, batch, in, out, dy, false, w, false, NULL,
                                           dx, true, false));
    return cpu_emulate(p, dx, (size_t)batch * in,
                       cpu_gemm(ops, false, false, batch, in, out, 1.0f, dy, w, 0.0f, dx));
}

/* The precision oneDNN computes in: emulated precisions run on fp32 primitives. */
static ddp_dtype cpu_dnnl_prec(ddp_dtype p) { return emulated(p) ? DDP_FP32 : p; }

static ddp_status cpu_conv_fwd(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                               int batch, const void *x, const void *w, const float *b, void *y)
{
    size_t n = (size_t)batch * s->c_out * s->h_out * s->w_out;
    return cpu_emulate(p, y, n, ops_dnnl_conv_fwd(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), s, batch, x, w, b, y));
}

static ddp_status cpu_conv_bwd_input(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                     int batch, const void *w, const void *dy, void *dx)
{
    size_t n = (size_t)batch * s->c_in * s->h * s->w;
    return cpu_emulate(p, dx, n, ops_dnnl_conv_bwd_data(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), s, batch, w, dy, dx));
}

/* oneDNN overwrites the weight gradient: written in place when the caller overwrites, else
 * computed into scratch kept by the handle and added (accumulation). */
static ddp_status cpu_conv_bwd_params(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                      int batch, const void *x, const void *dy, float *dw,
                                      float *db, bool accumulate)
{
    if (!accumulate)
        return ops_dnnl_conv_bwd_weights(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), s, batch, x, dy, dw, db);
    cpu_state *cs = cpu_of(ops);
    size_t n_w = (size_t)s->c_out * s->c_in * s->k * s->k, n = n_w + (size_t)s->c_out;
    if (n > cs->scratch_n) {
        float *grown = realloc(cs->scratch, n * sizeof *grown);
        if (!grown)
            return DDP_ERR_NOMEM;
        cs->scratch = grown;
        cs->scratch_n = n;
    }
    float *scratch = cs->scratch; // (c_out * c_in * k * k + c_out)
    TRY_OK(ops_dnnl_conv_bwd_weights(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), s, batch, x, dy, scratch, scratch + n_w));
    cpu_axpy(ops, dw, scratch, n_w, 1.0f);
    cpu_axpy(ops, db, scratch + n_w, (size_t)s->c_out, 1.0f);
    return DDP_OK;
}

static ddp_status cpu_act_relu_fwd(const ops_handle *ops, ddp_dtype p, void *y, const void *x,
                                   size_t n)
{
    if (!cpu_bf16_stored(p))
        return cpu_relu_fwd(ops, y, x, n);
    const uint16_t *xs = x;
    uint16_t *ys = y;
    for (size_t i = 0; i < n; i++) /* as a signed integer a bf16 is > 0 when the float is */
        ys[i] = xs[i] & (uint16_t)-((int16_t)xs[i] > 0); /* a mask, not a branch: vectorises */
    return DDP_OK;
}

static ddp_status cpu_act_relu_bwd(const ops_handle *ops, ddp_dtype p, void *dx, const void *dy,
                                   const void *y, size_t n)
{
    if (!cpu_bf16_stored(p))
        return cpu_relu_bwd(ops, dx, dy, y, n);
    const uint16_t *dys = dy, *ys = y;
    uint16_t *dxs = dx;
    for (size_t i = 0; i < n; i++)
        dxs[i] = dys[i] & (uint16_t)-((int16_t)ys[i] > 0);
    return DDP_OK;
}

static ddp_status cpu_pool_fwd(const ops_handle *ops, ddp_dtype p, const void *x, int n, int c,
                               int h, int w, void *y, void *ws, size_t ws_bytes)
{
    if (h % 2 || w % 2)
        return DDP_ERR_INVALID_ARG;
    return ops_dnnl_pool_fwd(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), x, n, c, h, w, y, ws, ws_bytes);
}

static ddp_status cpu_pool_bwd(const ops_handle *ops, ddp_dtype p, const void *dy, const void *ws,
                               int n, int c, int h, int w, void *dx)
{
    return ops_dnnl_pool_bwd(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), dy, ws, n, c, h, w, dx);
}

static ddp_status cpu_image_reorder(const ops_handle *ops, ddp_dtype p, const void *src, void *dst,
                                    int n, int c, int h, int w, bool to_nchw)
{
    return ops_dnnl_image_reorder(cpu_of(ops)->dnnl, cpu_dnnl_prec(p), src, dst, n, c, h, w, to_nchw);
}

/* ---- the table --------------------------------------------------------------------------- */

static const ops_handle cpu_table = {
    .name = "cpu",
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .sgd_step = cpu_sgd_step,
    .sgd_step_cast = cpu_sgd_step_cast,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .maxpool_fwd = cpu_maxpool_fwd,
    .maxpool_bwd = cpu_maxpool_bwd,
    .softmax_xent = cpu_softmax_xent,
    .softmax_xent_acc = cpu_softmax_xent_acc,
    .channels_last = true,
    .image_reorder = cpu_image_reorder,
    .supports = cpu_supports,
    .emulates = cpu_emulates,
    .cast = cpu_cast,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd_params = cpu_linear_bwd_params,
    .linear_bwd_input = cpu_linear_bwd_input,
    .conv_fwd = cpu_conv_fwd,
    .conv_bwd_params = cpu_conv_bwd_params,
    .conv_bwd_input = cpu_conv_bwd_input,
    .act_relu_fwd = cpu_act_relu_fwd,
    .act_relu_bwd = cpu_act_relu_bwd,
    .pool_fwd = cpu_pool_fwd,
    .pool_bwd = cpu_pool_bwd,
    .encoder_fwd = ops_cpu_encoder_fwd,
    .encoder_bwd = ops_cpu_encoder_bwd,
    .layernorm_fwd = ops_cpu_layernorm_fwd,
    .layernorm_bwd = ops_cpu_layernorm_bwd,
    .attention_fwd = ops_cpu_attention_fwd,
    .attention_bwd = ops_cpu_attention_bwd,
    .attention_floats = ops_cpu_attention_floats,
    .gelu_fwd = ops_cpu_gelu_fwd,
    .gelu_bwd = ops_cpu_gelu_bwd,
    .add = ops_cpu_add,
    .xent_fwd_bwd = ops_cpu_xent_fwd_bwd,
    .adamw_step = ops_cpu_adamw_step,
    .adamw_step_cast = cpu_adamw_step_cast,
    .cast_stochastic = cpu_cast_stochastic,
};

void ops_cpu_set_threads(int threads)
{
    openblas_set_num_threads(threads < 1 ? 1 : threads);
    omp_set_num_threads(threads < 1 ? 1 : threads);
}

/* The table without oneDNN's convolution and pooling. */
static void cpu_drop_dnnl_conv(ops_handle *t)
{
    t->conv_fwd = NULL;
    t->conv_bwd_params = NULL;
    t->conv_bwd_input = NULL;
    t->pool_fwd = NULL;
    t->pool_bwd = NULL;
    t->channels_last = false;
    t->image_reorder = NULL;
    t->name = "cpu-im2col";
}

/* Releases a CPU handle's state and the handle (ops_close). */
static void cpu_release(ops_handle *ops)
{
    cpu_state *cs = cpu_of(ops);
    ops_dnnl_destroy(cs->dnnl);
    free(cs->scratch);
    free(cs);
    free(ops);
}

ddp_status ops_cpu_open(ddp_ctx *ctx, int threads, bool im2col, ops_handle **out)
{
    *out = NULL;
    ops_handle *ops = malloc(sizeof *ops);
    cpu_state *cs = calloc(1, sizeof *cs);
    if (!ops || !cs || ops_dnnl_create(&cs->dnnl) != DDP_OK) {
        free(ops), free(cs);
        DDP_ERROR("ops_cpu_open: out of memory");
        return DDP_ERR_NOMEM;
    }
    *ops = cpu_table;
    if (im2col)
        cpu_drop_dnnl_conv(ops);
    ops->ctx = ctx;
    ops->state = cs;
    ops->release = cpu_release;
    cs->threads = threads < 1 ? 1 : threads;
    cs->gemm_on_dnnl = gemm_on_dnnl();
    ops_cpu_set_threads(cs->threads);
    ops_switches_apply(ops);
    *out = ops;
    return DDP_OK;
}

const char *ops_dnnl_describe(const ops_handle *ops, ddp_dtype p)
{
    bool cpu = ops && ops->gemm == cpu_table.gemm;
    return cpu ? ops_dnnl_impls(cpu_of(ops)->dnnl, p) : "";
}
