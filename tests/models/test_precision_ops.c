/* test_precision_ops.c - every precision-aware op of the CPU ops table (cast, linear, conv,
 * ReLU, max-pool, image reorder) in fp32, bf16 and fp16 against an fp64 reference.
 *
 * The reference is computed in double from the inputs as the op sees them (rounded to the
 * precision), so what is measured is the op's own error. Tolerances, per output element with
 * ref the fp64 value and S the sum of the magnitudes of the terms that make it:
 *   |got - ref| <= 1e-5 * S + r * |ref|
 * 1e-5 * S bounds fp32 accumulation (products of 16-bit values are exact in fp32; summing k
 * terms errs by at most k * 6e-8 * S, 3e-5 * S at the largest k = 500 here, and by about
 * sqrt(k) * 6e-8 * S = 1.3e-6 * S in practice); r is the rounding of a 16-bit output: 2^-8 for
 * bf16 (8 significant bits: half an ulp is 2^-9 relative), 2^-10 for fp16 (11 bits), 0 for fp32
 * and for fp32 outputs (logits, parameter gradients). A wrong transpose, layout or index errs by
 * O(S). Casts, ReLU, max-pool and reorders move values without arithmetic: they must be exact
 * (casts: equal to round-to-nearest-even computed here with rint on the scaled significand).
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "testutil.h"

typedef struct prec {
    ddp_dtype p;
    const char *name;
    int bits;     /* significant bits */
    int min_exp;  /* exponent of the smallest subnormal step */
    double r;     /* output rounding bound, relative */
} prec;

static const prec precs[] = {
    {DDP_FP32, "fp32", 24, -149, 0.0},
    {DDP_BF16, "bf16", 8, -133, 1.0 / 256},
    {DDP_FP16, "fp16", 11, -24, 1.0 / 1024},
};

static ops_handle *ops;

/* x rounded to nearest even with `bits` significant bits (the fp64 model of a cast). */
static double round_to(double x, const prec *q)
{
    if (x == 0.0 || !isfinite(x))
        return x;
    int e;
    frexp(x, &e);
    int quantum = e - q->bits > q->min_exp ? e - q->bits : q->min_exp;
    return ldexp(rint(ldexp(x, -quantum)), quantum);
}

/* A buffer in precision q holding x[0..n) cast; NULL-free by CHECK. */
static void *to_prec(const prec *q, const float *x, size_t n)
{
    void *d = malloc(n * 4 + 4);
    CHECK(ops->cast(ops, q->p, d, DDP_FP32, x, n) == DDP_OK, "cast to %s", q->name);
    return d;
}

/* x[0..n) replaced by the values a cast to q keeps (what the op sees). */
static void round_in_place(const prec *q, float *x, size_t n)
{
    void *d = to_prec(q, x, n);
    CHECK(ops->cast(ops, DDP_FP32, x, q->p, d, n) == DDP_OK, "cast from %s", q->name);
    free(d);
}

/* Reads n values of precision q (out_fp32: they are fp32) back as float. */
static float *from_prec(const prec *q, const void *d, size_t n, int out_fp32)
{
    float *x = test_floats(n);
    CHECK(ops->cast(ops, DDP_FP32, x, out_fp32 ? DDP_FP32 : q->p, d, n) == DDP_OK, "cast back");
    return x;
}

/* Counts outputs outside |got - ref| <= 1e-5 S + r |ref|, and 16-bit outputs (r > 0) that the
 * precision cannot hold (the fp16 emulation must round what it stores), printing the first five. */
static int compare(const char *what, const prec *q, const float *got, const double *ref,
                   const double *mag, size_t n, double r)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = 1e-5 * mag[i] + r * fabs(ref[i]) + 1e-30;
        int held = r == 0.0 || round_to(got[i], q) == (double)got[i];
        if (!(fabs((double)got[i] - ref[i]) <= tol) || !held) {
            if (bad < 5)
                fprintf(stderr, "%s %s[%zu]: got %.9g, want %.9g (tol %.3g)\n", q->name, what, i,
                        (double)got[i], ref[i], tol);
            bad++;
        }
    }
    return bad;
}

/* ---- cast ------------------------------------------------------------------------------------ */

static void check_cast(const prec *q, test_rng *rng)
{
    enum { N = 4096 };
    float x[N];
    test_fill(rng, x, N, -3, 3);
    x[0] = 1.0f + 1.0f / 512; /* exactly halfway between two bf16 values: rounds to even (1.0) */
    x[1] = 70000.0f;          /* beyond fp16's range: inf, as fp16 storage would hold */
    x[2] = 3e-6f;             /* fp16 subnormal */
    void *d = to_prec(q, x, N);
    float *got = from_prec(q, d, N, 0);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double want = round_to(x[i], q);
        if (q->p == DDP_FP16 && fabs(want) > 65504.0)
            want = want > 0 ? INFINITY : -INFINITY;
        if ((double)got[i] != want && bad++ < 5)
            fprintf(stderr, "%s cast[%d]: %.9g -> %.9g, want %.9g\n", q->name, i, (double)x[i],
                    (double)got[i], want);
    }
    CHECK(bad == 0, "%s cast: %d values not rounded to nearest even", q->name, bad);
    free(d), free(got);
}

/* ---- linear ---------------------------------------------------------------------------------- */

enum { LB = 5, LI = 37, LO = 11 };

static void check_linear(const prec *q, test_rng *rng)
{
    float x[LB * LI], w[LO * LI], b[LO], dy[LB * LO], dw[LO * LI], db[LO];
    test_fill(rng, x, LB * LI, -1, 1), test_fill(rng, w, LO * LI, -1, 1), test_fill(rng, b, LO, -1, 1);
    test_fill(rng, dy, LB * LO, -1, 1), test_fill(rng, dw, LO * LI, -1, 1), test_fill(rng, db, LO, -1, 1);
    round_in_place(q, x, LB * LI), round_in_place(q, w, LO * LI), round_in_place(q, dy, LB * LO);
    void *xq = to_prec(q, x, LB * LI), *wq = to_prec(q, w, LO * LI), *dyq = to_prec(q, dy, LB * LO);
    double ref[LO * LI], mag[LO * LI];
    for (int logits = 0; logits < 2; logits++) {
        float y[LB * LO];
        CHECK(ops->linear_fwd(ops, q->p, xq, wq, b, LB, LI, LO, y, logits) == DDP_OK, "linear_fwd");
        float *got = from_prec(q, y, LB * LO, logits);
        for (int n = 0; n < LB; n++) {
            for (int o = 0; o < LO; o++) {
                double s = b[o], m = fabs(b[o]);
                for (int i = 0; i < LI; i++)
                    s += (double)x[n * LI + i] * w[o * LI + i], m += fabs((double)x[n * LI + i] * w[o * LI + i]);
                ref[n * LO + o] = s, mag[n * LO + o] = m;
            }
        }
        CHECK(compare("linear_fwd", q, got, ref, mag, LB * LO, logits ? 0.0 : q->r) == 0,
              "%s linear_fwd (fp32 output %d)", q->name, logits);
        free(got);
    }
    /* Adding to dw and db, then overwriting them: NaN there must not reach the result. */
    for (int acc = 1; acc >= 0; acc--) {
        float dw0[LO * LI], db0[LO];
        if (!acc)
            test_fill_nan(dw, LO * LI), test_fill_nan(db, LO);
        memcpy(dw0, dw, sizeof dw), memcpy(db0, db, sizeof db);
        CHECK(ops->linear_bwd_params(ops, q->p, xq, dyq, LB, LI, LO, dw, db, acc) == DDP_OK, "linear_bwd_params");
        for (int o = 0; o < LO; o++) {
            for (int i = 0; i < LI; i++) {
                double s = acc ? dw0[o * LI + i] : 0.0, m = fabs(s);
                for (int n = 0; n < LB; n++)
                    s += (double)dy[n * LO + o] * x[n * LI + i], m += fabs((double)dy[n * LO + o] * x[n * LI + i]);
                ref[o * LI + i] = s, mag[o * LI + i] = m;
            }
        }
        CHECK(compare("linear dw", q, dw, ref, mag, LO * LI, 0.0) == 0, "%s linear dw (accumulate %d)", q->name, acc);
        for (int o = 0; o < LO; o++) {
            double s = acc ? db0[o] : 0.0, m = fabs(s);
            for (int n = 0; n < LB; n++)
                s += dy[n * LO + o], m += fabs(dy[n * LO + o]);
            ref[o] = s, mag[o] = m;
        }
        CHECK(compare("linear db", q, db, ref, mag, LO, 0.0) == 0, "%s linear db (accumulate %d)", q->name, acc);
    }
    void *dxq = malloc(sizeof x);
    CHECK(ops->linear_bwd_input(ops, q->p, wq, dyq, LB, LI, LO, dxq) == DDP_OK, "linear_bwd_input");
    float *dx = from_prec(q, dxq, LB * LI, 0);
    for (int n = 0; n < LB; n++) {
        for (int i = 0; i < LI; i++) {
            double s = 0, m = 0;
            for (int o = 0; o < LO; o++)
                s += (double)dy[n * LO + o] * w[o * LI + i], m += fabs((double)dy[n * LO + o] * w[o * LI + i]);
            ref[n * LI + i] = s, mag[n * LI + i] = m;
        }
    }
    CHECK(compare("linear dx", q, dx, ref, mag, LB * LI, q->r) == 0, "%s linear dx", q->name);
    free(xq), free(wq), free(dyq), free(dxq), free(dx);
}

/* ---- image layout ---------------------------------------------------------------------------- */

/* Index of NCHW element (n, c, y, x) in the table's image layout. */
static size_t img_at(int n, int c, int y, int x, int C, int H, int W)
{
    if (ops->channels_last)
        return (((size_t)n * H + y) * W + x) * C + c;
    return (((size_t)n * C + c) * H + y) * W + x;
}

/* NCHW host data -> the table's layout (in place through a copy). */
static void to_layout(float *v, int N, int C, int H, int W)
{
    size_t total = (size_t)N * C * H * W;
    float *t = test_floats(total);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    t[img_at(n, c, y, x, C, H, W)] = v[(((size_t)n * C + c) * H + y) * W + x];
    memcpy(v, t, total * sizeof *v);
    free(t);
}

/* ---- conv ------------------------------------------------------------------------------------ */

typedef struct conv_data {
    ops_conv_shape s;
    int batch;
    float *x, *w, *b, *dy; /* NCHW / OIHW host values, rounded to the precision */
} conv_data;

/* fp64 forward (kind 0), input gradient (1) or weight gradient (2) by direct summation. */
static void conv_reference(const conv_data *d, int kind, double *ref, double *mag)
{
    const ops_conv_shape *s = &d->s;
    size_t n_out = kind == 0 ? (size_t)d->batch * s->c_out * s->h_out * s->w_out
                 : kind == 1 ? (size_t)d->batch * s->c_in * s->h * s->w
                             : (size_t)s->c_out * s->c_in * s->k * s->k;
    memset(ref, 0, n_out * sizeof *ref), memset(mag, 0, n_out * sizeof *mag);
    for (int n = 0; n < d->batch; n++)
    for (int o = 0; o < s->c_out; o++)
    for (int oy = 0; oy < s->h_out; oy++)
    for (int ox = 0; ox < s->w_out; ox++) {
        size_t yi = (((size_t)n * s->c_out + o) * s->h_out + oy) * s->w_out + ox;
        if (kind == 0)
            ref[yi] += d->b[o], mag[yi] += fabs(d->b[o]);
        for (int c = 0; c < s->c_in; c++)
        for (int ky = 0; ky < s->k; ky++)
        for (int kx = 0; kx < s->k; kx++) {
            int iy = oy + ky - s->pad, ix = ox + kx - s->pad;
            if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
                continue;
            size_t xi = (((size_t)n * s->c_in + c) * s->h + iy) * s->w + ix;
            size_t wi = (((size_t)o * s->c_in + c) * s->k + ky) * s->k + kx;
            double t = kind == 0 ? (double)d->x[xi] * d->w[wi]
                     : kind == 1 ? (double)d->dy[yi] * d->w[wi] : (double)d->dy[yi] * d->x[xi];
            size_t at = kind == 0 ? yi : kind == 1 ? xi : wi;
            ref[at] += t, mag[at] += fabs(t);
        }
    }
}

/* got (table layout) back to NCHW order for comparison. */
static float *from_layout(const float *got, int N, int C, int H, int W)
{
    float *v = test_floats((size_t)N * C * H * W);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    v[(((size_t)n * C + c) * H + y) * W + x] = got[img_at(n, c, y, x, C, H, W)];
    return v;
}

static void check_conv(const prec *q, test_rng *rng, int c_in, int k, int pad)
{
    conv_data d = {.s = {.c_in = c_in, .h = 9, .w = 7, .c_out = 4, .k = k, .pad = pad}, .batch = 2};
    ops_conv_shape *s = &d.s;
    s->h_out = s->h + 2 * pad - k + 1, s->w_out = s->w + 2 * pad - k + 1;
    size_t nx = (size_t)d.batch * c_in * s->h * s->w, nw = (size_t)s->c_out * c_in * k * k;
    size_t ny = (size_t)d.batch * s->c_out * s->h_out * s->w_out;
    d.x = test_floats(nx), d.w = test_floats(nw), d.b = test_floats(s->c_out), d.dy = test_floats(ny);
    test_fill(rng, d.x, nx, -1, 1), test_fill(rng, d.w, nw, -1, 1), test_fill(rng, d.b, s->c_out, -1, 1);
    test_fill(rng, d.dy, ny, -1, 1);
    round_in_place(q, d.x, nx), round_in_place(q, d.w, nw), round_in_place(q, d.dy, ny);
    float *xl = test_floats(nx), *dyl = test_floats(ny);
    memcpy(xl, d.x, nx * 4), memcpy(dyl, d.dy, ny * 4);
    to_layout(xl, d.batch, c_in, s->h, s->w), to_layout(dyl, d.batch, s->c_out, s->h_out, s->w_out);
    void *xq = to_prec(q, xl, nx), *wq = to_prec(q, d.w, nw), *dyq = to_prec(q, dyl, ny);
    void *out = malloc((nx > ny ? nx : ny) * 4);
    double *ref = malloc((nx + ny + nw) * sizeof *ref), *mag = malloc((nx + ny + nw) * sizeof *mag);

    CHECK(ops->conv_fwd(ops, q->p, s, d.batch, xq, wq, d.b, out) == DDP_OK, "conv_fwd");
    float *raw = from_prec(q, out, ny, 0), *got = from_layout(raw, d.batch, s->c_out, s->h_out, s->w_out);
    conv_reference(&d, 0, ref, mag);
    CHECK(compare("conv_fwd", q, got, ref, mag, ny, q->r) == 0, "%s conv_fwd c_in %d k %d", q->name, c_in, k);
    free(raw), free(got);

    CHECK(ops->conv_bwd_input(ops, q->p, s, d.batch, wq, dyq, out) == DDP_OK, "conv_bwd_input");
    raw = from_prec(q, out, nx, 0), got = from_layout(raw, d.batch, c_in, s->h, s->w);
    conv_reference(&d, 1, ref, mag);
    CHECK(compare("conv dx", q, got, ref, mag, nx, q->r) == 0, "%s conv dx c_in %d k %d", q->name, c_in, k);
    free(raw), free(got);

    float *dw = test_floats(nw), *db = test_floats(s->c_out);
    test_fill(rng, dw, nw, -1, 1), test_fill(rng, db, s->c_out, -1, 1);
    double *dw0 = malloc(nw * sizeof *dw0), db0[8];
    for (size_t i = 0; i < nw; i++)
        dw0[i] = dw[i];
    for (int o = 0; o < s->c_out; o++)
        db0[o] = db[o];
    /* Adding to dw and db, then overwriting them (NaN there must not reach the result). */
    for (int acc = 1; acc >= 0; acc--) {
        if (!acc) {
            test_fill_nan(dw, nw), test_fill_nan(db, (size_t)s->c_out);
            for (size_t i = 0; i < nw; i++)
                dw0[i] = 0.0;
            for (int o = 0; o < s->c_out; o++)
                db0[o] = 0.0;
        }
        CHECK(ops->conv_bwd_params(ops, q->p, s, d.batch, xq, dyq, dw, db, acc) == DDP_OK, "conv_bwd_params");
        conv_reference(&d, 2, ref, mag);
        for (size_t i = 0; i < nw; i++)
            ref[i] += dw0[i], mag[i] += fabs(dw0[i]);
        CHECK(compare("conv dw", q, dw, ref, mag, nw, 0.0) == 0, "%s conv dw (accumulate %d) c_in %d", q->name, acc, c_in);
        for (int o = 0; o < s->c_out; o++) {
            ref[o] = db0[o], mag[o] = fabs(db0[o]);
            for (size_t i = 0; i < ny; i++) {
                if ((i / ((size_t)s->h_out * s->w_out)) % s->c_out == (size_t)o)
                    ref[o] += d.dy[i], mag[o] += fabs(d.dy[i]);
            }
        }
        CHECK(compare("conv db", q, db, ref, mag, s->c_out, 0.0) == 0, "%s conv db (accumulate %d)", q->name, acc);
    }
    free(dw), free(db), free(dw0), free(xq), free(wq), free(dyq), free(out), free(ref), free(mag);
    free(xl), free(dyl), free(d.x), free(d.w), free(d.b), free(d.dy);
}

/* ---- ReLU, max-pool, reorder: exact ---------------------------------------------------------- */

enum { PN = 2, PC = 3, PH = 6, PW = 8, PT = PN * PC * PH * PW };

static int count_diff(const float *a, const double *b, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += (double)a[i] != b[i];
    return bad;
}

static void check_relu(const prec *q, test_rng *rng)
{
    float x[PT], dy[PT];
    test_fill(rng, x, PT, -1, 1), test_fill(rng, dy, PT, -1, 1);
    round_in_place(q, x, PT), round_in_place(q, dy, PT);
    void *xq = to_prec(q, x, PT), *dyq = to_prec(q, dy, PT), *yq = malloc(PT * 4), *dxq = malloc(PT * 4);
    CHECK(ops->act_relu_fwd(ops, q->p, yq, xq, PT) == DDP_OK, "relu fwd");
    CHECK(ops->act_relu_bwd(ops, q->p, dxq, dyq, yq, PT) == DDP_OK, "relu bwd");
    float *y = from_prec(q, yq, PT, 0), *dx = from_prec(q, dxq, PT, 0);
    double ry[PT], rdx[PT];
    for (int i = 0; i < PT; i++)
        ry[i] = x[i] > 0 ? x[i] : 0.0, rdx[i] = x[i] > 0 ? dy[i] : 0.0;
    CHECK(count_diff(y, ry, PT) == 0, "%s relu fwd not exact", q->name);
    CHECK(count_diff(dx, rdx, PT) == 0, "%s relu bwd not exact", q->name);
    free(xq), free(dyq), free(yq), free(dxq), free(y), free(dx);
}

static void check_pool(const prec *q, test_rng *rng)
{
    enum { PO = PT / 4 };
    float x[PT], dy[PO];
    for (int i = 0; i < PT; i++) /* distinct integers (exact in every precision): no ties */
        x[i] = (float)(i - PT / 2);
    for (int i = PT - 1; i > 0; i--) {
        int j = (int)(test_uniform(rng) * (i + 1));
        float t = x[i];
        x[i] = x[j], x[j] = t;
    }
    test_fill(rng, dy, PO, -1, 1);
    round_in_place(q, dy, PO);
    double ry[PO], rdx[PT] = {0};
    for (int p = 0; p < PN * PC; p++)
    for (int oy = 0; oy < PH / 2; oy++)
    for (int ox = 0; ox < PW / 2; ox++) {
        size_t o = ((size_t)p * (PH / 2) + oy) * (PW / 2) + ox, best = 0;
        for (int dy2 = 0; dy2 < 2; dy2++)
            for (int dx2 = 0; dx2 < 2; dx2++) {
                size_t at = ((size_t)p * PH + 2 * oy + dy2) * PW + 2 * ox + dx2;
                if ((dy2 == 0 && dx2 == 0) || x[at] > x[best])
                    best = at;
            }
        ry[o] = x[best], rdx[best] = dy[o];
    }
    float xl[PT], dyl[PO];
    memcpy(xl, x, sizeof x), memcpy(dyl, dy, sizeof dy);
    to_layout(xl, PN, PC, PH, PW), to_layout(dyl, PN, PC, PH / 2, PW / 2);
    void *xq = to_prec(q, xl, PT), *dyq = to_prec(q, dyl, PO), *yq = malloc(PO * 4), *dxq = malloc(PT * 4);
    int ws[PO];
    CHECK(ops->pool_fwd(ops, q->p, xq, PN, PC, PH, PW, yq, ws, sizeof ws) == DDP_OK, "pool fwd");
    CHECK(ops->pool_bwd(ops, q->p, dyq, ws, PN, PC, PH, PW, dxq) == DDP_OK, "pool bwd");
    float *yr = from_prec(q, yq, PO, 0), *dxr = from_prec(q, dxq, PT, 0);
    float *y = from_layout(yr, PN, PC, PH / 2, PW / 2), *dx = from_layout(dxr, PN, PC, PH, PW);
    CHECK(count_diff(y, ry, PO) == 0, "%s pool fwd not exact", q->name);
    CHECK(count_diff(dx, rdx, PT) == 0, "%s pool bwd not exact", q->name);
    CHECK(ops->pool_fwd(ops, q->p, xq, PN, PC, PH, PW, yq, ws, 1) == DDP_ERR_INVALID_ARG,
          "%s pool fwd accepted a too small workspace", q->name);
    free(xq), free(dyq), free(yq), free(dxq), free(yr), free(dxr), free(y), free(dx);
}

static void check_reorder(const prec *q, test_rng *rng)
{
    float x[PT], back[PT];
    test_fill(rng, x, PT, -1, 1);
    round_in_place(q, x, PT);
    void *xq = to_prec(q, x, PT), *tq = malloc(PT * 4), *bq = malloc(PT * 4);
    CHECK(ops->image_reorder(ops, q->p, xq, tq, PN, PC, PH, PW, false) == DDP_OK, "to nhwc");
    float *t = from_prec(q, tq, PT, 0);
    int bad = 0;
    for (int n = 0; n < PN; n++)
        for (int c = 0; c < PC; c++)
            for (int i = 0; i < PH * PW; i++)
                bad += t[((size_t)n * PH * PW + i) * PC + c] != x[((size_t)n * PC + c) * PH * PW + i];
    CHECK(bad == 0, "%s NCHW -> NHWC: %d misplaced", q->name, bad);
    CHECK(ops->image_reorder(ops, q->p, tq, bq, PN, PC, PH, PW, true) == DDP_OK, "to nchw");
    CHECK(ops->cast(ops, DDP_FP32, back, q->p, bq, PT) == DDP_OK, "cast");
    CHECK(memcmp(back, x, sizeof x) == 0, "%s NHWC -> NCHW does not undo it", q->name);
    free(xq), free(tq), free(bq), free(t);
}

int main(void)
{
    if (ops_cpu_open(NULL, 1, false, &ops) != DDP_OK)
        return 1;
    test_rng rng = {0x243F6A8885A308D3ULL};
    for (size_t i = 0; i < sizeof precs / sizeof precs[0]; i++) {
        const prec *q = &precs[i];
        /* every precision runs on every x86-64 CPU (bf16 emulated without bf16 arithmetic) */
        CHECK(ops->supports(ops, q->p, NULL), "%s refused by the CPU table", q->name);
        printf("%s%s\n", q->name, ops->emulates(ops, q->p) ? " (emulated in float storage)" : "");
        check_cast(q, &rng);
        check_linear(q, &rng);
        check_conv(q, &rng, 3, 3, 1);
        check_conv(q, &rng, 1, 5, 2);
        check_conv(q, &rng, 20, 5, 2);
        check_relu(q, &rng);
        check_pool(q, &rng);
        check_reorder(q, &rng);
    }
    return CHECK_DONE();
}
