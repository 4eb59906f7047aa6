/* test_gpt_ops.c - the CPU's transformer ops (ops.h, "transformer ops") against fp64 reference
 * implementations written here: every backward pass against central finite differences of the
 * fp64 forward pass, every fp32 forward pass against the fp64 one, and the edge cases (T = 1, one
 * head, the causal blocks of a long sequence, the padded vocabulary, dlogits aliasing logits,
 * repeated tokens, AdamW's first two steps computed by hand).
 *
 * Gradients are checked through L = sum(G * y) with a fixed random G (so dL/dy = G is what the
 * backward pass is given). The reference is evaluated in double at the fp32 inputs; its central
 * difference with eps = 1e-6 has a truncation error of O(eps^2) and a rounding error of about
 * 1e-16 / 1e-6 = 1e-10, so it is exact at fp32's scale and the tolerances below measure the fp32
 * op alone. Tolerances (|got - want| <= atol + rtol * |want|):
 *   - element-wise sums (encoder, add) and scatters: one fp32 rounding, rtol 1.2e-7 (2^-23),
 *     atol 1e-6 for the gradients' accumulation into a prefilled buffer;
 *   - reductions over C <= 64 channels or T <= 150 keys in fp32 (LayerNorm, attention, softmax):
 *     rounding grows with the length, atol 1e-5, rtol 1e-4 (a wrong term is off by O(0.1));
 *   - GELU: through exp_branchless (within 1.5e-7 of exp, checked here), atol 1e-6, rtol 1e-5;
 *   - cross-entropy over V <= 1000 logits: atol 1e-5, rtol 1e-5 (loss), 1e-6 (gradient);
 *   - AdamW: the fp32 update of O(1) values, atol 1e-6, rtol 1e-5.
 * The bf16 forms (activations "in act" = bf16, as the handle stores them: float storage where the
 * CPU emulates bf16, uint16_t where it has bf16 arithmetic) against the fp32 forms on the same
 * inputs rounded to bf16: both compute in fp32 in the same order, so what they give in fp32
 * (LayerNorm's statistics and dx, the residual add) is bit for bit the same, and what the bf16
 * form stores in bf16 is the fp32 result rounded once to nearest: within half a unit of bf16's 8th
 * significant bit, 2^-9 relative (checked with 2^-8 for margin).
 * Outputs that must be overwritten are prefilled with NaN; outputs that add are prefilled with
 * random values that the expectation includes.
 */
#include <string.h>

#include "half.h"
#include "math_shared.h"
#include "testutil.h"

#define FD_EPS 1e-6

static const ops_handle *ops;

/* ---- helpers ----------------------------------------------------------------------------- */

static double *to_double(const float *x, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static float *rand_floats(test_rng *r, size_t n, double lo, double hi)
{
    float *x = test_floats(n);
    test_fill(r, x, n, lo, hi);
    return x;
}

static float *nan_floats(size_t n)
{
    float *x = test_floats(n);
    test_fill_nan(x, n);
    return x;
}

static double dot_gd(const float *g, const double *y, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * y[i];
    return s;
}

/* Counts |got - want| > atol + rtol * |want| (NaN counts), printing the first five. */
static int compare_d(const char *what, const float *got, const double *want, size_t n,
                     double atol, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= atol + rtol * fabs(want[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s[%zu]: got %.9g, want %.9g\n", what, i, (double)got[i], want[i]);
            bad++;
        }
    }
    return bad;
}

typedef double (*objective)(void *ctx);

/* num[i] = dL/dv[i] by central differences for every step-th i (others untouched). */
static void fd_grad(double *v, size_t n, size_t step, objective f, void *ctx, double *num)
{
    for (size_t i = 0; i < n; i += step) {
        double save = v[i];
        v[i] = save + FD_EPS;
        double hi = f(ctx);
        v[i] = save - FD_EPS;
        double lo = f(ctx);
        v[i] = save;
        num[i] = (hi - lo) / (2.0 * FD_EPS);
    }
}

/* Checks analytic (fp32, minus base when base is not NULL: what an adding op put there) against
 * the central differences of f in v, every step-th element. Returns the mismatch count. */
static int grad_check(const char *what, double *v, size_t n, size_t step, objective f, void *ctx,
                      const float *analytic, const float *base, double atol, double rtol)
{
    double *num = calloc(n, sizeof *num);
    fd_grad(v, n, step, f, ctx, num);
    int bad = 0;
    for (size_t i = 0; i < n; i += step) {
        double want = num[i] + (base ? base[i] : 0.0);
        bad += compare_d(what, analytic + i, &want, 1, atol, rtol) != 0;
    }
    free(num);
    return bad;
}

/* ---- encoder ----------------------------------------------------------------------------- */

typedef struct enc_case {
    int B, T, C;
    const int *tokens;
    double *wte, *wpe, *out; // (V, C) (T, C) (B, T, C)
    const float *g;          // (B, T, C)
} enc_case;

static void enc_ref(enc_case *c)
{
    for (int r = 0; r < c->B * c->T; r++)
        for (int i = 0; i < c->C; i++)
            c->out[(size_t)r * c->C + i] = c->wte[(size_t)c->tokens[r] * c->C + i] +
                                           c->wpe[(size_t)(r % c->T) * c->C + i];
}

static double enc_objective(void *p)
{
    enc_case *c = p;
    enc_ref(c);
    return dot_gd(c->g, c->out, (size_t)c->B * c->T * c->C);
}

/* Tokens repeat within and across the sequences (3 appears four times). */
static void check_encoder(test_rng *r)
{
    enum { B = 2, T = 3, C = 5, V = 6, N = B * T * C };
    static const int tokens[B * T] = {3, 1, 3, 3, 0, 3};
    float *wte = rand_floats(r, V * C, -1, 1), *wpe = rand_floats(r, T * C, -1, 1);
    float *out = nan_floats(N), *g = rand_floats(r, N, -1, 1);
    float *dwte = rand_floats(r, V * C, -1, 1), *dwpe = rand_floats(r, T * C, -1, 1);
    float *dwte0 = test_floats(V * C), *dwpe0 = test_floats(T * C);
    memcpy(dwte0, dwte, sizeof(float) * V * C), memcpy(dwpe0, dwpe, sizeof(float) * T * C);
    enc_case c = {B, T, C, tokens, to_double(wte, V * C), to_double(wpe, T * C), calloc(N, 8), g};
    CHECK(ops->encoder_fwd(ops, out, tokens, DDP_FP32, wte, wpe, B, T, C) == DDP_OK,
          "encoder_fwd");
    enc_ref(&c);
    CHECK(compare_d("encoder out", out, c.out, N, 0, 0x1p-23) == 0, "encoder forward");
    /* wte in bf16 (the weights of a bf16 model, in its storage): the fp32 pass on wte widened */
    float *wide = test_floats(V * C), *out16 = nan_floats(N), *want = nan_floats(N);
    float *tmp = test_floats(V * C);
    void *w16 = malloc((size_t)V * C * sizeof(float));
    for (int i = 0; i < V * C; i++)
        wide[i] = half_bf16_to_f32(half_f32_to_bf16(wte[i]));
    memcpy(tmp, wte, sizeof(float) * V * C);
    CHECK(ops_weights_put(ops, DDP_BF16, w16, tmp, V * C) == DDP_OK, "bf16 wte");
    CHECK(ops->encoder_fwd(ops, out16, tokens, DDP_BF16, w16, wpe, B, T, C) == DDP_OK &&
              ops->encoder_fwd(ops, want, tokens, DDP_FP32, wide, wpe, B, T, C) == DDP_OK,
          "encoder_fwd bf16");
    CHECK(memcmp(out16, want, sizeof(float) * N) == 0, "encoder forward: bf16 wte read as widened");
    free(wide), free(out16), free(want), free(w16), free(tmp);
    CHECK(ops->encoder_bwd(ops, dwte, dwpe, g, tokens, B, T, C) == DDP_OK, "encoder_bwd");
    CHECK(grad_check("dwte", c.wte, V * C, 1, enc_objective, &c, dwte, dwte0, 1e-6, 0x1p-23) == 0,
          "encoder dwte (adds, repeated tokens)");
    CHECK(grad_check("dwpe", c.wpe, T * C, 1, enc_objective, &c, dwpe, dwpe0, 1e-6, 0x1p-23) == 0,
          "encoder dwpe (adds, summed over the batch)");
    free(wte), free(wpe), free(out), free(g), free(dwte), free(dwpe), free(dwte0), free(dwpe0);
    free(c.wte), free(c.wpe), free(c.out);
}

/* ---- LayerNorm --------------------------------------------------------------------------- */

typedef struct ln_case {
    int rows, C;
    double *x, *w, *b, *out, *mean, *rstd; // (rows, C) (C) (C) (rows, C) (rows) (rows)
    const float *g;                        // (rows, C)
} ln_case;

static void ln_ref(ln_case *c)
{
    for (int r = 0; r < c->rows; r++) {
        const double *x = c->x + (size_t)r * c->C;
        double m = 0.0, var = 0.0;
        for (int i = 0; i < c->C; i++)
            m += x[i] / c->C;
        for (int i = 0; i < c->C; i++)
            var += (x[i] - m) * (x[i] - m) / c->C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int i = 0; i < c->C; i++)
            c->out[(size_t)r * c->C + i] = (x[i] - m) * s * c->w[i] + c->b[i];
        c->mean[r] = m, c->rstd[r] = s;
    }
}

static double ln_objective(void *p)
{
    ln_case *c = p;
    ln_ref(c);
    return dot_gd(c->g, c->out, (size_t)c->rows * c->C);
}

static void check_layernorm(test_rng *r, int rows, int C)
{
    size_t n = (size_t)rows * C;
    float *x = rand_floats(r, n, -2, 3), *w = rand_floats(r, C, 0.5, 1.5);
    float *b = rand_floats(r, C, -1, 1), *g = rand_floats(r, n, -1, 1);
    float *out = nan_floats(n), *mean = nan_floats(rows), *rstd = nan_floats(rows);
    float *dx = rand_floats(r, n, -1, 1), *dw = rand_floats(r, C, -1, 1);
    float *db = rand_floats(r, C, -1, 1), *base = test_floats(n + 2 * C);
    memcpy(base, dx, n * 4), memcpy(base + n, dw, C * 4), memcpy(base + n + C, db, C * 4);
    ln_case c = {rows, C, to_double(x, n), to_double(w, C), to_double(b, C), calloc(n, 8),
                 calloc(rows, 8), calloc(rows, 8), g};
    CHECK(ops->layernorm_fwd(ops, DDP_FP32, out, mean, rstd, x, w, b, rows, C) == DDP_OK,
          "layernorm_fwd");
    ln_ref(&c);
    CHECK(compare_d("ln out", out, c.out, n, 1e-5, 1e-4) == 0, "layernorm forward C=%d", C);
    CHECK(compare_d("ln mean", mean, c.mean, rows, 1e-6, 1e-5) == 0, "layernorm mean");
    CHECK(compare_d("ln rstd", rstd, c.rstd, rows, 1e-6, 1e-5) == 0, "layernorm rstd");
    CHECK(ops->layernorm_bwd(ops, DDP_FP32, dx, NULL, dw, db, g, x, w, mean, rstd, rows, C) ==
          DDP_OK, "ln bwd");
    CHECK(grad_check("ln dx", c.x, n, 1, ln_objective, &c, dx, base, 1e-5, 1e-4) == 0,
          "layernorm dx (adds) C=%d", C);
    CHECK(grad_check("ln dw", c.w, C, 1, ln_objective, &c, dw, base + n, 1e-5, 1e-4) == 0,
          "layernorm dw (adds)");
    CHECK(grad_check("ln db", c.b, C, 1, ln_objective, &c, db, base + n + C, 1e-5, 1e-4) == 0,
          "layernorm db (adds)");
    free(x), free(w), free(b), free(g), free(out), free(mean), free(rstd), free(dx), free(dw);
    free(db), free(base), free(c.x), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd);
}

/* ---- attention --------------------------------------------------------------------------- */

typedef struct att_case {
    int B, T, C, NH;
    double *qkv, *att, *out; // (B, T, 3C) (B, NH, T, T) (B, T, C)
    const float *g;          // (B, T, C)
} att_case;

/* Query t of head h in sequence b: att row over keys 0..t, out = att v. */
static void att_ref_row(att_case *c, int b, int h, int t)
{
    int T = c->T, C = c->C, hs = C / c->NH;
    const double *base = c->qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    double *a = c->att + (((size_t)b * c->NH + h) * T + t) * T, mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < T; j++) {
        a[j] = 0.0;
        for (int i = 0; j <= t && i < hs; i++)
            a[j] += base[(size_t)t * 3 * C + i] * base[(size_t)j * 3 * C + C + i] / sqrt(hs);
        mx = j <= t && a[j] > mx ? a[j] : mx;
    }
    for (int j = 0; j <= t; j++)
        sum += a[j] = exp(a[j] - mx);
    double *o = c->out + ((size_t)b * T + t) * C + (size_t)h * hs;
    for (int i = 0; i < hs; i++)
        o[i] = 0.0;
    for (int j = 0; j <= t; j++) {
        a[j] /= sum;
        for (int i = 0; i < hs; i++)
            o[i] += a[j] * base[(size_t)j * 3 * C + 2 * C + i];
    }
}

static double att_objective(void *p)
{
    att_case *c = p;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int t = 0; t < c->T; t++)
                att_ref_row(c, b, h, t);
    return dot_gd(c->g, c->out, (size_t)c->B * c->T * c->C);
}

/* Every step-th element of qkv's gradient is checked (step 1: all). */
static void check_attention(test_rng *r, int B, int T, int C, int NH, size_t step)
{
    size_t n = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = rand_floats(r, 3 * n, -1, 1), *g = rand_floats(r, n, -1, 1);
    float *out = nan_floats(n), *att = nan_floats(na), *datt = nan_floats(na);
    float *dqkv = nan_floats(3 * n);
    att_case c = {B, T, C, NH, to_double(qkv, 3 * n), calloc(na, 8), calloc(n, 8), g};
    CHECK(ops->attention_floats(ops, DDP_BF16, B, T, C, NH) == na, "attention_floats");
    CHECK(ops->attention_fwd(ops, DDP_FP32, DDP_FP32, out, att, qkv, B, T, C, NH) == DDP_OK,
          "attention_fwd");
    att_objective(&c);
    CHECK(compare_d("att", att, c.att, na, 1e-6, 1e-5) == 0, "attention weights T=%d NH=%d", T, NH);
    CHECK(compare_d("att out", out, c.out, n, 1e-5, 1e-4) == 0, "attention out T=%d NH=%d", T, NH);
    int above = 0;
    for (size_t i = 0; i < na; i++)
        above += (int)(i % T) > (int)(i / T % T) && att[i] != 0.0f;
    CHECK(above == 0, "%d attention weights above the diagonal are not 0", above);
    CHECK(ops->attention_bwd(ops, DDP_FP32, DDP_FP32, dqkv, datt, g, qkv, att, B, T, C, NH) ==
          DDP_OK, "att bwd");
    CHECK(grad_check("dqkv", c.qkv, 3 * n, step, att_objective, &c, dqkv, NULL, 1e-5, 1e-4) == 0,
          "attention dqkv T=%d C=%d NH=%d", T, C, NH);
    free(qkv), free(g), free(out), free(att), free(datt), free(dqkv);
    free(c.qkv), free(c.att), free(c.out);
}

/* ---- exp_branchless (math_shared.h: the CPU's softmax, cross-entropy and GELU) ----------- */

/* Within 1.5e-7 relative of exp over fp32's normal range (measured: at most 1.0e-7 over 5.3 M
 * points; the degree-6 polynomial would reach 2.6e-7), clamped outside it, NaN kept. */
static void check_exp(void)
{
    int bad = 0;
    for (double y = -87.0; y <= 88.0; y += 0.001953125 * 3.7) {
        double want = exp((double)(float)y), got = exp_branchless((float)y);
        if (!(fabs(got - want) <= 1.5e-7 * want) && bad++ < 5)
            fprintf(stderr, "exp_branchless(%.9g) = %.9g, want %.9g\n", y, got, want);
    }
    CHECK(bad == 0, "exp_branchless: %d values off by more than 1.5e-7", bad);
    CHECK(exp_branchless(-100.0f) <= 1.7e-38f && exp_branchless(-100.0f) >= 0.0f, "exp(-100)");
    CHECK(isfinite(exp_branchless(1000.0f)) && exp_branchless(1000.0f) > 1e38f, "exp(1000)");
    CHECK(isnan(exp_branchless(NAN)), "exp(NaN) is NaN");
    CHECK(exp_branchless(0.0f) == 1.0f, "exp(0) = %.9g", (double)exp_branchless(0.0f));
}

/* ---- GELU and add ------------------------------------------------------------------------ */

typedef struct gelu_case {
    size_t n;
    double *x, *y;
    const float *g;
} gelu_case;

static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_objective(void *p)
{
    gelu_case *c = p;
    for (size_t i = 0; i < c->n; i++)
        c->y[i] = gelu_ref(c->x[i]);
    return dot_gd(c->g, c->y, c->n);
}

static void check_gelu(test_rng *r)
{
    enum { N = 999 };
    float *x = rand_floats(r, N, -5, 5), *g = rand_floats(r, N, -1, 1), *y = nan_floats(N);
    float *dx = nan_floats(N), *inplace = test_floats(N);
    gelu_case c = {N, to_double(x, N), calloc(N, 8), g};
    CHECK(ops->gelu_fwd(ops, DDP_FP32, y, x, N) == DDP_OK, "gelu_fwd");
    gelu_objective(&c);
    CHECK(compare_d("gelu", y, c.y, N, 1e-6, 1e-5) == 0, "gelu forward");
    CHECK(ops->gelu_bwd(ops, DDP_FP32, dx, x, g, N) == DDP_OK, "gelu_bwd");
    CHECK(grad_check("gelu dx", c.x, N, 1, gelu_objective, &c, dx, NULL, 1e-6, 1e-5) == 0,
          "gelu dx");
    memcpy(inplace, g, sizeof(float) * N);
    CHECK(ops->gelu_bwd(ops, DDP_FP32, inplace, x, inplace, N) == DDP_OK, "gelu_bwd in place");
    CHECK(memcmp(inplace, dx, sizeof(float) * N) == 0, "gelu_bwd with dx aliasing dy differs");
    free(x), free(g), free(y), free(dx), free(inplace), free(c.x), free(c.y);
}

static void check_add(test_rng *r)
{
    enum { N = 1001 };
    float *a = rand_floats(r, N, -1, 1), *b = rand_floats(r, N, -1, 1), *y = nan_floats(N);
    double *want = calloc(N, sizeof *want);
    for (size_t i = 0; i < N; i++)
        want[i] = (double)a[i] + b[i];
    CHECK(ops->add(ops, DDP_FP32, y, a, b, N) == DDP_OK, "add");
    CHECK(compare_d("add", y, want, N, 0, 0x1p-23) == 0, "add forward");
    CHECK(ops->add(ops, DDP_FP32, a, a, b, N) == DDP_OK && memcmp(a, y, sizeof(float) * N) == 0,
          "add with y aliasing a differs");
    free(a), free(b), free(y), free(want);
}

/* ---- cross-entropy ----------------------------------------------------------------------- */

typedef struct xent_case {
    int rows, V, Vp;
    const int *targets;
    double *logits, *losses, dscale; // (rows, Vp) (rows)
} xent_case;

/* Over the first V columns only: the padding never enters. */
static double xent_objective(void *p)
{
    xent_case *c = p;
    double total = 0.0;
    for (int r = 0; r < c->rows; r++) {
        const double *z = c->logits + (size_t)r * c->Vp;
        double mx = z[0], sum = 0.0;
        for (int v = 1; v < c->V; v++)
            mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < c->V; v++)
            sum += exp(z[v] - mx);
        c->losses[r] = log(sum) + mx - z[c->targets[r]];
        total += c->losses[r];
    }
    return total * c->dscale;
}

/* The padding columns hold logits (1e4) that would dominate the softmax, or underflow every
 * exponential when taken as the maximum, if they were read. */
static void check_xent(test_rng *r, int rows, int V, int Vp)
{
    size_t n = (size_t)rows * Vp;
    float *logits = rand_floats(r, n, -4, 4), *losses = nan_floats(rows), *dl = nan_floats(n);
    float *alias = test_floats(n), *losses2 = nan_floats(rows);
    int *targets = malloc(sizeof(int) * rows);
    for (int i = 0; i < rows; i++) {
        targets[i] = (int)(test_uniform(r) * V);
        for (int v = V; v < Vp; v++)
            logits[(size_t)i * Vp + v] = 1e4f;
    }
    xent_case c = {rows, V, Vp, targets, to_double(logits, n), calloc(rows, 8), 1.0 / rows};
    CHECK(ops->xent_fwd_bwd(ops, DDP_FP32, dl, losses, logits, targets, rows, V, Vp,
                            1.0f / rows) == DDP_OK, "xent_fwd_bwd");
    xent_objective(&c);
    CHECK(compare_d("xent loss", losses, c.losses, rows, 1e-5, 1e-5) == 0, "xent loss V=%d", V);
    CHECK(grad_check("dlogits", c.logits, n, 1, xent_objective, &c, dl, NULL, 1e-6, 1e-5) == 0,
          "xent dlogits V=%d Vp=%d (padding 0)", V, Vp);
    memcpy(alias, logits, sizeof(float) * n);
    float ds = 1.0f / rows;
    ddp_status st =
        ops->xent_fwd_bwd(ops, DDP_FP32, alias, losses2, alias, targets, rows, V, Vp, ds);
    CHECK(st == DDP_OK && memcmp(alias, dl, sizeof(float) * n) == 0 &&
          memcmp(losses2, losses, 4 * rows) == 0,
          "xent with dlogits aliasing logits differs");
    test_fill_nan(losses2, rows);
    CHECK(ops->xent_fwd_bwd(ops, DDP_FP32, NULL, losses2, logits, targets, rows, V, Vp, 1.0f) ==
              DDP_OK &&
          memcmp(losses2, losses, 4 * rows) == 0, "xent without dlogits differs");
    free(logits), free(losses), free(dl), free(alias), free(losses2), free(targets);
    free(c.logits), free(c.losses);
}

/* ---- AdamW ------------------------------------------------------------------------------- */

/* One element, lr 0.1, betas (0.9, 0.95), eps 1e-8, wd 0.01, grad_scale 2, w0 = 1, m = v = 0,
 * gradients 0.5 then -0.25 (scaled: 1 then -0.5). By hand:
 * t=1: m = 0.1, v = 0.05, mhat = 0.1 / 0.1 = 1, vhat = 0.05 / 0.05 = 1,
 *      w = 1 - 0.1 (1 / (1 + 1e-8) + 0.01) = 0.899000001;
 * t=2: m = 0.09 - 0.05 = 0.04, v = 0.0475 + 0.0125 = 0.06, mhat = 0.04 / 0.19,
 *      vhat = 0.06 / 0.0975, w = 0.899000001 - 0.1 (mhat / (sqrt(vhat) + 1e-8) + 0.00899000001)
 *      = 0.871264... (computed below from these expressions). */
static void check_adamw_by_hand(void)
{
    float w = 1.0f, m = 0.0f, v = 0.0f, g1 = 0.5f, g2 = -0.25f;
    double w1 = 1.0 - 0.1 * (1.0 / (1.0 + 1e-8) + 0.01);
    double mhat = 0.04 / 0.19, vhat = 0.06 / 0.0975;
    double w2 = w1 - 0.1 * (mhat / (sqrt(vhat) + 1e-8) + 0.01 * w1);
    CHECK(ops->adamw_step(ops, &w, &m, &v, &g1, 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.01f, 1, 2.0f,
                          NULL) == DDP_OK,
          "adamw step 1");
    CHECK_CLOSE(m, 0.1, 1e-7, 1e-6, "adamw m1");
    CHECK_CLOSE(v, 0.05, 1e-7, 1e-6, "adamw v1");
    CHECK_CLOSE(w, w1, 1e-7, 1e-6, "adamw w1");
    CHECK(ops->adamw_step(ops, &w, &m, &v, &g2, 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.01f, 2, 2.0f,
                          NULL) == DDP_OK,
          "adamw step 2");
    CHECK_CLOSE(m, 0.04, 1e-7, 1e-6, "adamw m2");
    CHECK_CLOSE(v, 0.06, 1e-7, 1e-6, "adamw v2");
    CHECK_CLOSE(w, w2, 1e-7, 1e-6, "adamw w2");
    CHECK(fabs(w2 - 0.871264) < 1e-6, "the hand computation: %.9g", w2);
    CHECK(ops->adamw_step(ops, &w, &m, &v, &g2, 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.01f, 0, 1.0f,
                          NULL) == DDP_ERR_INVALID_ARG,
          "adamw step 0 is refused");
}

/* n elements over three steps against the formula in double (late steps: bias corrections far
 * from 1 - beta are exercised by t = 3). */
static void check_adamw_many(test_rng *r)
{
    enum { N = 257 };
    float *w = rand_floats(r, N, -1, 1), *m = test_floats(N), *v = test_floats(N);
    float *g = test_floats(N);
    double *dw = to_double(w, N), *dm = calloc(N, 8), *dv = calloc(N, 8);
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int t = 1; t <= 3; t++) {
        test_fill(r, g, N, -2, 2);
        for (int i = 0; i < N; i++) {
            double gi = gs * g[i];
            dm[i] = b1 * dm[i] + (1 - b1) * gi, dv[i] = b2 * dv[i] + (1 - b2) * gi * gi;
            double mh = dm[i] / (1 - pow(b1, t)), vh = dv[i] / (1 - pow(b2, t));
            dw[i] -= lr * (mh / (sqrt(vh) + eps) + wd * dw[i]);
        }
        CHECK(ops->adamw_step(ops, w, m, v, g, N, (float)lr, (float)b1, (float)b2, (float)eps,
                              (float)wd, t, (float)gs, NULL) == DDP_OK, "adamw step %d", t);
    }
    CHECK(compare_d("adamw w", w, dw, N, 1e-6, 1e-5) == 0, "adamw weights after 3 steps");
    CHECK(compare_d("adamw m", m, dm, N, 1e-6, 1e-5) == 0, "adamw m after 3 steps");
    CHECK(compare_d("adamw v", v, dv, N, 1e-6, 1e-5) == 0, "adamw v after 3 steps");
    /* the factor read from memory (grad_scale_dev, ddp_grad_clip_scale's) wins over the value,
     * bit for bit the value's step; the cast form alike */
    float *w2 = test_floats(N), *m2 = test_floats(N), *v2 = test_floats(N), f = 0.25f;
    float *w3 = test_floats(N), *m3 = test_floats(N), *v3 = test_floats(N);
    memcpy(w2, w, N * sizeof *w), memcpy(m2, m, N * sizeof *m), memcpy(v2, v, N * sizeof *v);
    CHECK(ops->adamw_step(ops, w, m, v, g, N, (float)lr, (float)b1, (float)b2, (float)eps,
                          (float)wd, 4, f, NULL) == DDP_OK, "adamw step 4 (value)");
    CHECK(ops->adamw_step(ops, w2, m2, v2, g, N, (float)lr, (float)b1, (float)b2, (float)eps,
                          (float)wd, 4, 7.0f, &f) == DDP_OK, "adamw step 4 (from memory)");
    CHECK(!memcmp(w, w2, N * sizeof *w) && !memcmp(m, m2, N * sizeof *m) &&
              !memcmp(v, v2, N * sizeof *v), "adamw: grad_scale_dev's factor, not grad_scale's");
    if (ops->adamw_step_cast) {
        void *wc = malloc(N * ops_dtype_size(ops, DDP_BF16));
        memcpy(w3, w2, N * sizeof *w), memcpy(m3, m2, N * sizeof *m), memcpy(v3, v2, N * sizeof *v);
        CHECK(ops->adamw_step_cast(ops, w3, m3, v3, g, N, (float)lr, (float)b1, (float)b2,
                                   (float)eps, (float)wd, 5, 7.0f, &f, DDP_BF16, wc, 1, 0) ==
                  DDP_OK, "adamw_step_cast 5 (from memory)");
        CHECK(ops->adamw_step(ops, w2, m2, v2, g, N, (float)lr, (float)b1, (float)b2, (float)eps,
                              (float)wd, 5, f, NULL) == DDP_OK, "adamw step 5 (value)");
        CHECK(wc && !memcmp(w3, w2, N * sizeof *w), "adamw_step_cast: grad_scale_dev's factor");
        free(wc);
    }
    free(w2), free(m2), free(v2), free(w3), free(m3), free(v3);
    free(w), free(m), free(v), free(g), free(dw), free(dm), free(dv);
}

/* ---- bf16 activations (ops.h's "in act") against the fp32 forms ---------------------------- */

#define BF16_ROUND 0x1p-8 /* one rounding to nearest bf16: at most 2^-9 relative (margin 2) */

/* x rounded to bf16 values in place: the inputs both forms read. */
static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = half_bf16_to_f32(half_f32_to_bf16(x[i]));
}

/* x (n floats) in bf16 as the handle stores it (malloc'd). */
static void *to_bf16(const float *x, size_t n)
{
    void *p = malloc(n * ops_dtype_size(ops, DDP_BF16));
    ops->cast(ops, DDP_BF16, p, DDP_FP32, x, n);
    return p;
}

/* A bf16 buffer of n elements holding NaN (outputs that must be overwritten). */
static void *nan_bf16(size_t n)
{
    float *x = nan_floats(n);
    void *p = to_bf16(x, n);
    free(x);
    return p;
}

/* Counts the elements of p (n, bf16) off the fp32 form's want by more than one rounding. */
static int compare_bf16(const char *what, const void *p, const float *want, size_t n)
{
    float *got = test_floats(n);
    ops->cast(ops, DDP_FP32, got, DDP_BF16, p, n);
    double *w = to_double(want, n);
    int bad = compare_d(what, got, w, n, 0, BF16_ROUND);
    free(got), free(w);
    return bad;
}

static void check_bf16_layernorm(test_rng *r, int rows, int C);
static void check_bf16_attention(test_rng *r, int B, int T, int C, int NH);
static void check_bf16_gelu_add(test_rng *r);
static void check_bf16_xent(test_rng *r, int rows, int V, int Vp);

static void check_bf16_all(test_rng *r)
{
    check_bf16_layernorm(r, 6, 64);
    check_bf16_layernorm(r, 3, 13);
    check_bf16_attention(r, 2, 5, 8, 2);
    check_bf16_attention(r, 1, 150, 8, 2);
    check_bf16_gelu_add(r);
    check_bf16_xent(r, 5, 9, 16);
    check_bf16_xent(r, 70, 1000, 1024); /* more rows than the 32 of a bf16-storage chunk */
}

static void check_bf16_layernorm(test_rng *r, int rows, int C)
{
    size_t n = (size_t)rows * C;
    float *x = rand_floats(r, n, -2, 3), *w = rand_floats(r, C, 0.5, 1.5);
    float *b = rand_floats(r, C, -1, 1), *g = rand_floats(r, n, -1, 1);
    float *out = nan_floats(n), *mean = nan_floats(rows), *rstd = nan_floats(rows);
    float *mean16 = nan_floats(rows), *rstd16 = nan_floats(rows);
    float *d32 = rand_floats(r, n + 2 * C, -1, 1), *d16 = test_floats(n + 2 * C);
    memcpy(d16, d32, (n + 2 * C) * sizeof(float));
    round_bf16(g, n);
    void *out16 = nan_bf16(n), *g16 = to_bf16(g, n), *dx16 = nan_bf16(n);
    CHECK(ops->layernorm_fwd(ops, DDP_FP32, out, mean, rstd, x, w, b, rows, C) == DDP_OK &&
          ops->layernorm_fwd(ops, DDP_BF16, out16, mean16, rstd16, x, w, b, rows, C) == DDP_OK,
          "layernorm_fwd bf16");
    CHECK(compare_bf16("ln out bf16", out16, out, n) == 0, "layernorm bf16 out C=%d", C);
    CHECK(memcmp(mean, mean16, rows * 4) == 0 && memcmp(rstd, rstd16, rows * 4) == 0,
          "layernorm bf16 statistics differ from fp32's");
    CHECK(ops->layernorm_bwd(ops, DDP_FP32, d32, NULL, d32 + n, d32 + n + C, g, x, w, mean, rstd,
                             rows, C) == DDP_OK &&
          ops->layernorm_bwd(ops, DDP_BF16, d16, dx16, d16 + n, d16 + n + C, g16, x, w, mean,
                             rstd, rows, C) == DDP_OK, "layernorm_bwd bf16");
    CHECK(memcmp(d32, d16, (n + 2 * C) * sizeof(float)) == 0,
          "layernorm bf16 dx, dw, db differ from fp32's");
    CHECK(compare_bf16("ln dx bf16", dx16, d32, n) == 0, "layernorm bf16 dx_act C=%d", C);
    free(x), free(w), free(b), free(g), free(out), free(mean), free(rstd), free(mean16);
    free(rstd16), free(d32), free(d16), free(out16), free(g16), free(dx16);
}

static void check_bf16_attention(test_rng *r, int B, int T, int C, int NH)
{
    size_t n = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = rand_floats(r, 3 * n, -1, 1), *g = rand_floats(r, n, -1, 1);
    round_bf16(qkv, 3 * n), round_bf16(g, n);
    float *out = nan_floats(n), *att = nan_floats(na), *att16 = nan_floats(na);
    float *datt = nan_floats(na), *dqkv = nan_floats(3 * n);
    void *qkv16 = to_bf16(qkv, 3 * n), *g16 = to_bf16(g, n), *out16 = nan_bf16(n);
    void *dqkv16 = nan_bf16(3 * n);
    CHECK(ops->attention_fwd(ops, DDP_BF16, DDP_FP32, out, att, qkv, B, T, C, NH) == DDP_OK &&
          ops->attention_fwd(ops, DDP_BF16, DDP_BF16, out16, att16, qkv16, B, T, C, NH) ==
          DDP_OK, "attention_fwd bf16");
    CHECK(compare_bf16("att out bf16", out16, out, n) == 0, "attention bf16 out T=%d", T);
    CHECK(memcmp(att, att16, na * 4) == 0, "attention bf16 probabilities differ from fp32's");
    CHECK(ops->attention_bwd(ops, DDP_BF16, DDP_FP32, dqkv, datt, g, qkv, att, B, T, C, NH) ==
          DDP_OK && ops->attention_bwd(ops, DDP_BF16, DDP_BF16, dqkv16, datt, g16, qkv16, att16,
                                       B, T, C, NH) == DDP_OK, "attention_bwd bf16");
    CHECK(compare_bf16("dqkv bf16", dqkv16, dqkv, 3 * n) == 0, "attention bf16 dqkv T=%d", T);
    free(qkv), free(g), free(out), free(att), free(att16), free(datt), free(dqkv);
    free(qkv16), free(g16), free(out16), free(dqkv16);
}

static void check_bf16_gelu_add(test_rng *r)
{
    enum { N = 999 };
    float *x = rand_floats(r, N, -5, 5), *g = rand_floats(r, N, -1, 1), *y = nan_floats(N);
    float *dx = nan_floats(N), *a = rand_floats(r, N, -1, 1), *s = nan_floats(N);
    float *s16 = nan_floats(N);
    round_bf16(x, N), round_bf16(g, N);
    void *x16 = to_bf16(x, N), *g16 = to_bf16(g, N), *y16 = nan_bf16(N), *dx16 = nan_bf16(N);
    size_t bytes = N * ops_dtype_size(ops, DDP_BF16);
    CHECK(ops->gelu_fwd(ops, DDP_FP32, y, x, N) == DDP_OK &&
          ops->gelu_fwd(ops, DDP_BF16, y16, x16, N) == DDP_OK, "gelu_fwd bf16");
    CHECK(compare_bf16("gelu bf16", y16, y, N) == 0, "gelu bf16 forward");
    CHECK(ops->gelu_bwd(ops, DDP_FP32, dx, x, g, N) == DDP_OK &&
          ops->gelu_bwd(ops, DDP_BF16, dx16, x16, g16, N) == DDP_OK, "gelu_bwd bf16");
    CHECK(compare_bf16("gelu dx bf16", dx16, dx, N) == 0, "gelu bf16 dx");
    CHECK(ops->gelu_bwd(ops, DDP_BF16, g16, x16, g16, N) == DDP_OK && memcmp(g16, dx16, bytes) == 0,
          "gelu_bwd bf16 with dx aliasing dy differs");
    CHECK(ops->add(ops, DDP_FP32, s, a, x, N) == DDP_OK &&
          ops->add(ops, DDP_BF16, s16, a, x16, N) == DDP_OK && memcmp(s, s16, N * 4) == 0,
          "add with a bf16 projection differs from fp32's");
    free(x), free(g), free(y), free(dx), free(a), free(s), free(s16), free(x16), free(g16);
    free(y16), free(dx16);
}

/* bf16 logits (the fused classifier): the losses are the fp32 form's on the same bf16 values, bit
 * for bit (every sum in fp32), dlogits its gradient rounded once, in place the same bytes;
 * scaling bf16 by a power of two (the loss scale) is exact, by 0.3 one rounding. */
static void check_bf16_xent(test_rng *r, int rows, int V, int Vp)
{
    size_t n = (size_t)rows * Vp, bytes = n * ops_dtype_size(ops, DDP_BF16);
    float *z = rand_floats(r, n, -4, 4), *dz = nan_floats(n), *loss = nan_floats(rows);
    float *loss16 = nan_floats(rows);
    int *targets = malloc(sizeof(int) * rows);
    for (int i = 0; i < rows; i++)
        targets[i] = (int)(test_uniform(r) * V);
    round_bf16(z, n);
    void *z16 = to_bf16(z, n), *dz16 = nan_bf16(n);
    float ds = 1.0f / rows;
    CHECK(ops->xent_fwd_bwd(ops, DDP_FP32, dz, loss, z, targets, rows, V, Vp, ds) == DDP_OK &&
          ops->xent_fwd_bwd(ops, DDP_BF16, dz16, loss16, z16, targets, rows, V, Vp, ds) ==
          DDP_OK, "xent_fwd_bwd bf16");
    CHECK(memcmp(loss, loss16, rows * sizeof(float)) == 0, "xent bf16 losses differ from fp32's");
    CHECK(compare_bf16("xent dlogits bf16", dz16, dz, n) == 0, "xent bf16 dlogits V=%d", V);
    test_fill_nan(loss16, rows);
    CHECK(ops->xent_fwd_bwd(ops, DDP_BF16, z16, loss16, z16, targets, rows, V, Vp, ds) ==
          DDP_OK && memcmp(z16, dz16, bytes) == 0 &&
          memcmp(loss, loss16, rows * sizeof(float)) == 0, "xent bf16 in place differs");
    CHECK(ops->scale(ops, DDP_FP32, dz, n, 0x1p10f) == DDP_OK, "scale");
    CHECK(ops->scale(ops, DDP_BF16, z16, n, 0x1p10f) == DDP_OK &&
          compare_bf16("scale bf16", z16, dz, n) == 0, "scale bf16 by 2^10");
    float *back = test_floats(n), *want = test_floats(n);
    ops->cast(ops, DDP_FP32, back, DDP_BF16, z16, n);
    for (size_t i = 0; i < n; i++)
        want[i] = back[i] * 0.3f;
    CHECK(ops->scale(ops, DDP_BF16, z16, n, 0.3f) == DDP_OK &&
          compare_bf16("scale bf16 by 0.3", z16, want, n) == 0, "scale bf16 by 0.3");
    free(z), free(dz), free(loss), free(loss16), free(targets), free(z16), free(dz16);
    free(back), free(want);
}

/* ---- main -------------------------------------------------------------------------------- */

static void check_all(test_rng *r)
{
    check_encoder(r);
    check_layernorm(r, 6, 64);
    check_layernorm(r, 3, 13); /* C not a multiple of the 8 summation lanes */
    check_attention(r, 2, 5, 8, 2, 1);
    check_attention(r, 3, 1, 4, 1, 1);   /* T = 1, NH = 1 */
    check_attention(r, 2, 7, 6, 1, 1);   /* NH = 1 */
    check_attention(r, 1, 150, 8, 2, 5); /* three causal blocks, the last partial */
    check_exp();
    check_gelu(r);
    check_add(r);
    check_xent(r, 5, 9, 16);
    check_xent(r, 3, 1000, 1024);
    check_xent(r, 2, 7, 7); /* no padding */
    check_adamw_by_hand();
    check_adamw_many(r);
    check_bf16_all(r);
}

/* bf16 stored as uint16_t, whatever this CPU does (fp16 stays emulated): the handle's view on a
 * CPU with AVX512_BF16, so that cpu_gpt.c's real-storage path (act_in, act_out, act_store through
 * ops->cast) runs on every CPU. The CPU backend's own cast follows the CPU, so this handle casts
 * with half.h's conversions (to nearest even, as the backend's). */
static bool stores_bf16(const ops_handle *h, ddp_dtype p)
{
    (void)h;
    return p == DDP_FP16;
}

static ddp_status cast_bf16_stored(const ops_handle *h, ddp_dtype to, void *dst, ddp_dtype from,
                                   const void *src, size_t n)
{
    (void)h;
    if (to == DDP_BF16 && from == DDP_FP32)
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = half_f32_to_bf16(((const float *)src)[i]);
    else if (to == DDP_FP32 && from == DDP_BF16)
        for (size_t i = 0; i < n; i++)
            ((float *)dst)[i] = half_bf16_to_f32(((const uint16_t *)src)[i]);
    else if (to == from)
        memmove(dst, src, n * (to == DDP_BF16 ? 2 : 4));
    else
        return DDP_ERR_UNSUPPORTED;
    return DDP_OK;
}

int main(void)
{
    test_rng r = {0x6a09e667f3bcc909ULL};
    for (int t = 0; t < 2; t++) {
        ops_handle *h;
        if (ops_cpu_open(NULL, 1, t == 1, &h) != DDP_OK)
            return 1;
        ops = h;
        CHECK(ops_require_gpt(h, "test_gpt_ops") == DDP_OK, "table %s lacks a transformer op",
              h->name);
        if (t == 0) {
            check_all(&r);
            ops_handle real = *h; /* the same backend, storing bf16 in 16 bits */
            real.emulates = stores_bf16;
            real.cast = cast_bf16_stored;
            ops = &real;
            CHECK(ops_dtype_size(ops, DDP_BF16) == 2, "the handle stores bf16 in 2 bytes");
            check_bf16_all(&r);
            ops = h;
        }
        ops_close(h);
    }
    return CHECK_DONE();
}
