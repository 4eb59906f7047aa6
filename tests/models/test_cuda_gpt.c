/* test_cuda_gpt.c - the CUDA backend's transformer ops (GPT-2) against the CPU backend's on the
 * same random inputs (the CPU is the oracle), plus checks that need no oracle: causal attention
 * rows that sum to 1 with zeros above the diagonal, cross-entropy padding columns that are exactly
 * 0, a deterministic embedding backward. An op either backend lacks (NULL) is skipped with a
 * message. Exits 77 (skipped) when there is no usable GPU or no CUDA build.
 *
 * Outputs that must be overwritten start as NaN on both sides (NaN fails every comparison); those
 * the ops add to start random. Tolerance |cuda - cpu| <= atol + rtol * |cpu|:
 *   exact (0, 0): encoder_fwd and add (one rounding, the same on both);
 *   1e-6 + 1e-5: GELU (tanhf differs by up to 2 ulp), AdamW (bias corrections may round
 *     differently), the moments 1e-7 + 1e-6;
 *   1e-5 + 1e-4: LayerNorm and the embedding backward (sums of at most 300 O(1) terms in another
 *     order), cross-entropy losses;
 *   1e-7 + 1e-5: cross-entropy gradients (O(1 / (rows V)) values, one softmax denominator each);
 *   1e-5 + 1e-4: attention forward, 1e-4 + 1e-3 backward (cuBLAS reorders and fuses the sums of
 *     its GEMMs over hs or T <= 70 terms; the backward chains three of them);
 *   attention in bf16, fused and materialised, against the CPU's fp32: relative norms (see
 *     check_attention_bf16).
 * bf16 activations (ops.h's "in act": the device ops read and write bf16) against the CPU's fp32
 * ops on the same inputs rounded to bf16: the tolerance of the fp32 comparison above plus one
 * rounding of what the device stores in bf16, 2^-8 relative (round to nearest is within 2^-9;
 * margin 2). Attention in bf16 activations: the relative norms of check_attention_bf16, whose
 * 1e-2 scale dwarfs the extra 2^-9 of the stored out and dqkv.
 */
#include <math.h>
#include <string.h>

#include "half.h"
#include "ops.h"
#include "switches.h"
#include "testutil.h"

static ops_handle *cpu, *gpu;
static ddp_ctx *ctx;

/* A host array and its device copy. */
typedef struct pair {
    float *h, *d;
    size_t n;
} pair;

static pair make_pair(test_rng *r, size_t n, double lo, double hi)
{
    pair p = {test_floats(n), ddp_alloc(gpu->ctx, n * sizeof(float)), n};
    test_fill(r, p.h, n, lo, hi);
    if (p.d)
        ddp_upload(gpu->ctx, p.d, p.h, n * sizeof(float));
    return p;
}

/* A pair that both sides must overwrite: NaN on both. */
static pair make_nan_pair(size_t n)
{
    pair p = {test_floats(n), ddp_alloc(gpu->ctx, n * sizeof(float)), n};
    test_fill_nan(p.h, n);
    if (p.d)
        ddp_upload(gpu->ctx, p.d, p.h, n * sizeof(float));
    return p;
}

static void drop_pair(pair *p)
{
    free(p->h);
    ddp_free(gpu->ctx, p->d);
}

/* The device copy of p, downloaded into a new host array. */
static float *download(const pair *p)
{
    float *back = test_floats(p->n);
    CHECK(ddp_download(gpu->ctx, back, p->d, p->n * sizeof(float)) == DDP_OK, "download");
    return back;
}

/* Compares the device result with the host result. */
static void compare_pair(const char *what, const pair *p, double atol, double rtol)
{
    float *back = download(p);
    int bad = test_compare(what, back, p->h, p->n, atol, rtol);
    CHECK(bad == 0, "%s: %d of %zu differ", what, bad, p->n);
    free(back);
}

/* A host array of values rounded to bf16 and its device copy in bf16 (uint16_t bits): the
 * activations of the bf16 forms. */
typedef struct bpair {
    float *h;
    uint16_t *d;
    size_t n;
} bpair;

/* Rounds p's host values to bf16 and uploads them. */
static void bpair_upload(bpair *p)
{
    uint16_t *bits = calloc(p->n ? p->n : 1, sizeof *bits);
    for (size_t i = 0; i < p->n; i++) {
        bits[i] = half_f32_to_bf16(p->h[i]);
        p->h[i] = half_bf16_to_f32(bits[i]);
    }
    if (p->d)
        ddp_upload(gpu->ctx, p->d, bits, p->n * sizeof *bits);
    free(bits);
}

/* Uniform in [lo, hi), rounded to bf16 (lo > hi: NaN, for outputs both sides overwrite). */
static bpair make_bpair(test_rng *r, size_t n, double lo, double hi)
{
    bpair p = {test_floats(n), ddp_alloc(gpu->ctx, n * sizeof(uint16_t)), n};
    if (lo > hi)
        test_fill_nan(p.h, n);
    else
        test_fill(r, p.h, n, lo, hi);
    bpair_upload(&p);
    return p;
}

static void drop_bpair(bpair *p)
{
    free(p->h);
    ddp_free(gpu->ctx, p->d);
}

/* The device's bf16 values of p as floats (a new host array). */
static float *bdownload(const bpair *p)
{
    uint16_t *bits = calloc(p->n ? p->n : 1, sizeof *bits);
    float *back = test_floats(p->n);
    CHECK(ddp_download(gpu->ctx, bits, p->d, p->n * sizeof *bits) == DDP_OK, "download");
    for (size_t i = 0; i < p->n; i++)
        back[i] = half_bf16_to_f32(bits[i]);
    free(bits);
    return back;
}

/* Compares the device's bf16 result with the host's fp32 one. */
static void compare_bpair(const char *what, const bpair *p, double atol, double rtol)
{
    float *back = bdownload(p);
    int bad = test_compare(what, back, p->h, p->n, atol, rtol);
    CHECK(bad == 0, "%s: %d of %zu differ", what, bad, p->n);
    free(back);
}

/* n ints uniform in [0, hi) on the host (*host) and the device (returned). */
static int *make_ints(test_rng *r, int n, int hi, int **host)
{
    *host = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++)
        (*host)[i] = (int)(test_uniform(r) * hi);
    int *d = ddp_alloc(gpu->ctx, (size_t)n * sizeof(int));
    if (d)
        ddp_upload(gpu->ctx, d, *host, (size_t)n * sizeof(int));
    return d;
}

/* Whether both backends implement the op (a NULL pointer in either table skips it). */
static bool both_have(bool on_cpu, bool on_gpu, const char *name)
{
    if (on_cpu && on_gpu)
        return true;
    fprintf(stderr, "test_cuda_gpt: %s skipped: not implemented by the %s backend\n", name,
            on_cpu ? "cuda" : "cpu");
    return false;
}
#define BOTH_HAVE(op) both_have(cpu->op != NULL, gpu->op != NULL, #op)

/* ---- embeddings ------------------------------------------------------------------------ */

/* A small vocabulary V, so tokens repeat and the backward sums rows (V 2: runs of ~B T / 2 equal
 * tokens, each across several of the CUDA backward's 32-entry segments); run twice from the same
 * start on the device, the backward must give the same bits. */
static void check_encoder(test_rng *r, int B, int T, int C, int V)
{
    int *tok_h = NULL, *tok_d = make_ints(r, B * T, V, &tok_h);
    pair wte = make_pair(r, (size_t)V * C, -1, 1), wpe = make_pair(r, (size_t)T * C, -1, 1);
    pair out = make_nan_pair((size_t)B * T * C), dout = make_pair(r, (size_t)B * T * C, -1, 1);
    if (BOTH_HAVE(encoder_fwd)) {
        cpu->encoder_fwd(cpu, out.h, tok_h, DDP_FP32, wte.h, wpe.h, B, T, C);
        CHECK(gpu->encoder_fwd(gpu, out.d, tok_d, DDP_FP32, wte.d, wpe.d, B, T, C) == DDP_OK,
              "encoder_fwd");
        compare_pair("encoder_fwd", &out, 0, 0);
        /* wte in bf16 (a bf16 model's weights): the CPU's fp32 pass on wte widened */
        size_t nw = (size_t)V * C;
        float *tmp = test_floats(nw), *wide = test_floats(nw);
        void *w16 = ddp_alloc(gpu->ctx, nw * sizeof(uint16_t));
        for (size_t i = 0; i < nw; i++)
            wide[i] = tmp[i] = half_bf16_to_f32(half_f32_to_bf16(wte.h[i]));
        CHECK(ops_weights_put(gpu, DDP_BF16, w16, tmp, nw) == DDP_OK, "bf16 wte");
        cpu->encoder_fwd(cpu, out.h, tok_h, DDP_FP32, wide, wpe.h, B, T, C);
        CHECK(gpu->encoder_fwd(gpu, out.d, tok_d, DDP_BF16, w16, wpe.d, B, T, C) == DDP_OK,
              "encoder_fwd bf16");
        compare_pair("encoder_fwd bf16 wte", &out, 0, 0);
        ddp_free(gpu->ctx, w16);
        free(tmp), free(wide);
    }
    if (BOTH_HAVE(encoder_bwd)) {
        cpu->encoder_bwd(cpu, wte.h, wpe.h, dout.h, tok_h, B, T, C); /* wte, wpe: the gradients */
        CHECK(gpu->encoder_bwd(gpu, wte.d, wpe.d, dout.d, tok_d, B, T, C) == DDP_OK, "encoder_bwd");
        compare_pair("encoder_bwd dwte", &wte, 1e-5, 1e-4);
        compare_pair("encoder_bwd dwpe", &wpe, 1e-5, 1e-4);
    }
    if (gpu->encoder_bwd) {
        float *first = download(&wte);
        gpu->encoder_bwd(gpu, wte.d, wpe.d, dout.d, tok_d, B, T, C);
        float *again = download(&wte);
        ddp_upload(gpu->ctx, wte.d, first, wte.n * sizeof(float));
        gpu->encoder_bwd(gpu, wte.d, wpe.d, dout.d, tok_d, B, T, C);
        float *third = download(&wte);
        CHECK(memcmp(again, third, wte.n * sizeof(float)) == 0, "encoder_bwd is deterministic");
        free(first), free(again), free(third);
    }
    free(tok_h), ddp_free(gpu->ctx, tok_d);
    drop_pair(&wte), drop_pair(&wpe), drop_pair(&out), drop_pair(&dout);
}

/* ---- LayerNorm ------------------------------------------------------------------------- */

static void check_layernorm(test_rng *r, int rows, int C)
{
    size_t n = (size_t)rows * C;
    pair x = make_pair(r, n, -2, 3), w = make_pair(r, C, 0.5, 1.5), b = make_pair(r, C, -1, 1);
    pair out = make_nan_pair(n), mean = make_nan_pair(rows), rstd = make_nan_pair(rows);
    pair dout = make_pair(r, n, -1, 1), dx = make_pair(r, n, -1, 1);
    pair dw = make_pair(r, C, -1, 1), db = make_pair(r, C, -1, 1);
    if (BOTH_HAVE(layernorm_fwd)) {
        cpu->layernorm_fwd(cpu, DDP_FP32, out.h, mean.h, rstd.h, x.h, w.h, b.h, rows, C);
        CHECK(gpu->layernorm_fwd(gpu, DDP_FP32, out.d, mean.d, rstd.d, x.d, w.d, b.d, rows,
                                 C) == DDP_OK,
              "layernorm_fwd");
        compare_pair("layernorm out", &out, 1e-5, 1e-4);
        compare_pair("layernorm mean", &mean, 1e-5, 1e-4);
        compare_pair("layernorm rstd", &rstd, 1e-5, 1e-4);
    }
    if (BOTH_HAVE(layernorm_bwd) && cpu->layernorm_fwd) {
        ddp_upload(gpu->ctx, mean.d, mean.h, rows * sizeof(float)); /* the same statistics */
        ddp_upload(gpu->ctx, rstd.d, rstd.h, rows * sizeof(float));
        cpu->layernorm_bwd(cpu, DDP_FP32, dx.h, NULL, dw.h, db.h, dout.h, x.h, w.h, mean.h,
                           rstd.h, rows, C);
        CHECK(gpu->layernorm_bwd(gpu, DDP_FP32, dx.d, NULL, dw.d, db.d, dout.d, x.d, w.d, mean.d,
                                 rstd.d, rows, C) == DDP_OK, "layernorm_bwd");
        compare_pair("layernorm dx", &dx, 1e-5, 1e-4);
        compare_pair("layernorm dw", &dw, 1e-5, 1e-4);
        compare_pair("layernorm db", &db, 1e-5, 1e-4);
    }
    drop_pair(&x), drop_pair(&w), drop_pair(&b), drop_pair(&out), drop_pair(&mean);
    drop_pair(&rstd), drop_pair(&dout), drop_pair(&dx), drop_pair(&dw), drop_pair(&db);
}

/* ---- attention ------------------------------------------------------------------------- */

/* Every row of the device's att (B * NH * T rows of T) sums to 1 over keys 0..t, with exact
 * zeros after. */
static void check_causal_rows(const pair *att, int T)
{
    float *a = download(att);
    int bad = 0;
    for (size_t row = 0; row < att->n / T; row++) {
        int t = (int)(row % T);
        double s = 0.0;
        for (int j = 0; j < T; j++) {
            s += a[row * T + j];
            bad += j > t && a[row * T + j] != 0.0f;
        }
        bad += !(fabs(s - 1.0) <= 1e-5);
    }
    CHECK(bad == 0, "attention: %d causal rows not a distribution over keys 0..t", bad);
    free(a);
}

static void check_attention(test_rng *r, int B, int T, int C, int NH)
{
    size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
    pair qkv = make_pair(r, 3 * n, -2, 2), out = make_nan_pair(n), att = make_nan_pair(n_att);
    pair dout = make_pair(r, n, -1, 1), dqkv = make_nan_pair(3 * n), datt = make_nan_pair(n_att);
    if (gpu->attention_fwd) {
        CHECK(gpu->attention_fwd(gpu, DDP_FP32, DDP_FP32, out.d, att.d, qkv.d, B, T, C, NH) ==
              DDP_OK, "attention_fwd");
        check_causal_rows(&att, T);
    }
    if (BOTH_HAVE(attention_fwd)) {
        cpu->attention_fwd(cpu, DDP_FP32, DDP_FP32, out.h, att.h, qkv.h, B, T, C, NH);
        compare_pair("attention out", &out, 1e-5, 1e-4);
        compare_pair("attention att", &att, 1e-5, 1e-4);
    }
    if (BOTH_HAVE(attention_bwd) && cpu->attention_fwd) {
        ddp_upload(gpu->ctx, att.d, att.h, n_att * sizeof(float)); /* the same probabilities */
        cpu->attention_bwd(cpu, DDP_FP32, DDP_FP32, dqkv.h, datt.h, dout.h, qkv.h, att.h, B, T, C,
                           NH);
        CHECK(gpu->attention_bwd(gpu, DDP_FP32, DDP_FP32, dqkv.d, datt.d, dout.d, qkv.d, att.d, B,
                                 T, C, NH) == DDP_OK, "attention_bwd");
        compare_pair("attention dqkv", &dqkv, 1e-4, 1e-3);
    }
    drop_pair(&qkv), drop_pair(&out), drop_pair(&att), drop_pair(&dout), drop_pair(&dqkv);
    drop_pair(&datt);
}

/* ||back - h|| / ||h|| over n values (infinite when back holds a NaN); frees back. */
static double rel_error_of(float *back, const float *h, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)back[i] - h[i];
        num += d * d;
        den += (double)h[i] * h[i];
    }
    free(back);
    return num == num ? sqrt(num / (den > 0 ? den : 1)) : INFINITY;
}

/* ||device - host|| / ||host|| over a pair. */
static double rel_error(const pair *p) { return rel_error_of(download(p), p->h, p->n); }

/* Attention in bf16 (the fused kernel when flash and hs is 64, else the materialised path on
 * bf16 GEMMs) against the CPU's fp32, on random q, k, v in [-2, 2]: the scores (std ~1.3 at hs
 * 64) carry q's and k's bf16 rounding (2^-9 relative each), the probabilities and v another
 * 2^-9 each, so the output is ~1 % off in norm and the gradients, three such products deep,
 * ~2 %: 3e-2 and 5e-2. A wrong index, mask or rescaling gives O(1). The device's state size
 * must be the fused kernel's (o and the log-sum-exp, no T x T) or the probabilities'. */
static void check_attention_bf16(test_rng *r, int B, int T, int C, int NH, bool flash)
{
    size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T, hs = (size_t)C / NH;
    CHECK(ops_cuda_set_attention(gpu, flash) == DDP_OK, "ops_cuda_set_attention");
    size_t n_dev = gpu->attention_floats(gpu, DDP_BF16, B, T, C, NH);
    size_t want = flash && hs == 64 ? (size_t)B * NH * T * (hs + 1) : n_att;
    CHECK(n_dev == want, "attention_floats %zu, expected %zu (flash %d, hs %zu)", n_dev, want,
          flash, hs);
    pair qkv = make_pair(r, 3 * n, -2, 2), out = make_nan_pair(n), dout = make_pair(r, n, -1, 1);
    pair dqkv = make_nan_pair(3 * n);
    float *att_h = test_floats(n_att), *datt_h = test_floats(n_att);
    float *att_d = ddp_alloc(gpu->ctx, n_dev * sizeof(float));
    float *datt_d = ddp_alloc(gpu->ctx, n_dev * sizeof(float));
    cpu->attention_fwd(cpu, DDP_FP32, DDP_FP32, out.h, att_h, qkv.h, B, T, C, NH);
    cpu->attention_bwd(cpu, DDP_FP32, DDP_FP32, dqkv.h, datt_h, dout.h, qkv.h, att_h, B, T, C, NH);
    CHECK(gpu->attention_fwd(gpu, DDP_BF16, DDP_FP32, out.d, att_d, qkv.d, B, T, C, NH) == DDP_OK,
          "attention_fwd bf16");
    CHECK(gpu->attention_bwd(gpu, DDP_BF16, DDP_FP32, dqkv.d, datt_d, dout.d, qkv.d, att_d, B, T,
                             C, NH) == DDP_OK, "attention_bwd bf16");
    double e_out = rel_error(&out), e_d = rel_error(&dqkv);
    printf("attention bf16 %s B %d T %d C %d NH %d: out %.2e, dqkv %.2e\n",
           flash && hs == 64 ? "fused" : "materialised", B, T, C, NH, e_out, e_d);
    CHECK(e_out <= 3e-2, "attention bf16 out: relative error %.3g > 3e-2", e_out);
    CHECK(e_d <= 5e-2, "attention bf16 dqkv: relative error %.3g > 5e-2", e_d);
    drop_pair(&qkv), drop_pair(&out), drop_pair(&dout), drop_pair(&dqkv);
    free(att_h), free(datt_h), ddp_free(gpu->ctx, att_d), ddp_free(gpu->ctx, datt_d);
    ops_cuda_set_attention(gpu, true);
}

/* The device's fp32 copy of p's (rounded) host values. */
static float *device_f32(const bpair *p)
{
    float *d = ddp_alloc(gpu->ctx, p->n * sizeof(float));
    if (d)
        ddp_upload(gpu->ctx, d, p->h, p->n * sizeof(float));
    return d;
}

/* Whether the device's bf16 p equals the device's fp32 d (n) rounded to bf16, bit for bit. */
static bool equals_rounded(const bpair *p, const float *d)
{
    float *a = bdownload(p), *b = test_floats(p->n);
    CHECK(ddp_download(gpu->ctx, b, d, p->n * sizeof(float)) == DDP_OK, "download");
    int bad = 0;
    for (size_t i = 0; i < p->n; i++)
        bad += a[i] != half_bf16_to_f32(half_f32_to_bf16(b[i]));
    free(a), free(b);
    return bad == 0;
}

/* An attention case with bf16 activations: random qkv and dout on both sides (bf16-rounded),
 * out and dqkv to be written, the device's state (n_dev floats), and the CPU's fp32 results on
 * the same values in out.h and dqkv.h. */
typedef struct attn16 {
    size_t n, n_dev;
    bpair qkv, out, dout, dqkv;
    float *att_h, *datt_h, *att_d, *datt_d;
} attn16;

static void attn16_make(test_rng *r, int B, int T, int C, int NH, attn16 *a)
{
    size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
    a->n = n;
    a->n_dev = gpu->attention_floats(gpu, DDP_BF16, B, T, C, NH);
    a->qkv = make_bpair(r, 3 * n, -2, 2), a->out = make_bpair(r, n, 1, 0);
    a->dout = make_bpair(r, n, -1, 1), a->dqkv = make_bpair(r, 3 * n, 1, 0);
    a->att_h = test_floats(n_att), a->datt_h = test_floats(n_att);
    a->att_d = ddp_alloc(gpu->ctx, a->n_dev * sizeof(float));
    a->datt_d = ddp_alloc(gpu->ctx, a->n_dev * sizeof(float));
    cpu->attention_fwd(cpu, DDP_FP32, DDP_FP32, a->out.h, a->att_h, a->qkv.h, B, T, C, NH);
    cpu->attention_bwd(cpu, DDP_FP32, DDP_FP32, a->dqkv.h, a->datt_h, a->dout.h, a->qkv.h,
                       a->att_h, B, T, C, NH);
}

static void attn16_drop(attn16 *a)
{
    drop_bpair(&a->qkv), drop_bpair(&a->out), drop_bpair(&a->dout), drop_bpair(&a->dqkv);
    free(a->att_h), free(a->datt_h), ddp_free(gpu->ctx, a->att_d), ddp_free(gpu->ctx, a->datt_d);
}

/* check_attention_bf16 with bf16 activations: qkv and dout read, out and dqkv written in bf16 on
 * the device; the CPU's fp32 on the same (rounded) values is the reference. The device's fp32
 * activations on those values must give the same results before their rounding, bit for bit:
 * both feed the products the same bf16 values (the fused kernel reads bf16 qkv and dout in place,
 * fp32 ones split into bf16 heads), so this checks the in-place reads' addressing exactly. */
static void check_attention_act16(test_rng *r, int B, int T, int C, int NH, bool flash)
{
    CHECK(ops_cuda_set_attention(gpu, flash) == DDP_OK, "ops_cuda_set_attention");
    attn16 a;
    attn16_make(r, B, T, C, NH, &a);
    size_t n = a.n;
    CHECK(gpu->attention_fwd(gpu, DDP_BF16, DDP_BF16, a.out.d, a.att_d, a.qkv.d, B, T, C, NH) ==
          DDP_OK, "attention_fwd bf16 activations");
    CHECK(gpu->attention_bwd(gpu, DDP_BF16, DDP_BF16, a.dqkv.d, a.datt_d, a.dout.d, a.qkv.d,
                             a.att_d, B, T, C, NH) == DDP_OK, "attention_bwd bf16 activations");
    double e_out = rel_error_of(bdownload(&a.out), a.out.h, n);
    double e_d = rel_error_of(bdownload(&a.dqkv), a.dqkv.h, 3 * n);
    printf("attention bf16 activations %s B %d T %d C %d NH %d: out %.2e, dqkv %.2e\n",
           flash ? "flash" : "materialised", B, T, C, NH, e_out, e_d);
    CHECK(e_out <= 3e-2, "attention bf16 activations out: relative error %.3g > 3e-2", e_out);
    CHECK(e_d <= 5e-2, "attention bf16 activations dqkv: relative error %.3g > 5e-2", e_d);
    float *qkv32 = device_f32(&a.qkv), *dout32 = device_f32(&a.dout);
    float *out32 = ddp_alloc(gpu->ctx, n * sizeof(float));
    float *dqkv32 = ddp_alloc(gpu->ctx, 3 * n * sizeof(float));
    ddp_status f32 =
        gpu->attention_fwd(gpu, DDP_BF16, DDP_FP32, out32, a.att_d, qkv32, B, T, C, NH);
    if (f32 == DDP_OK)
        f32 = gpu->attention_bwd(gpu, DDP_BF16, DDP_FP32, dqkv32, a.datt_d, dout32, qkv32, a.att_d,
                                 B, T, C, NH);
    CHECK(f32 == DDP_OK, "attention fp32 activations");
    CHECK(equals_rounded(&a.out, out32) && equals_rounded(&a.dqkv, dqkv32),
          "attention (%s, T %d, C %d, NH %d): bf16 activations differ from fp32 ones rounded",
          flash ? "flash" : "materialised", T, C, NH);
    ddp_free(gpu->ctx, qkv32), ddp_free(gpu->ctx, dout32), ddp_free(gpu->ctx, out32);
    ddp_free(gpu->ctx, dqkv32);
    attn16_drop(&a);
    ops_cuda_set_attention(gpu, true);
}

/* cuDNN's fused attention (DDP_CUDA_ATTENTION=cudnn, models/ops/cuda_sdpa.cu) with bf16
 * activations against the CPU's fp32 on the same rounded values, with check_attention_bf16's
 * tolerances (the same bf16 products, in cuDNN's order); the state it keeps is the fused
 * kernel's size. Then the same inputs through the project's kernel: both near the reference,
 * and a second cuDNN forward and backward equal to the first bit for bit (the backward's
 * deterministic form, the default: dq written by its matmul). Reports and skips without cuDNN. */
static void check_attention_cudnn(test_rng *r, int B, int T, int C, int NH)
{
    if (ops_cuda_set_attention_cudnn(gpu, true) != DDP_OK) {
        printf("attention cudnn: skipped (this build has no cuDNN)\n");
        return;
    }
    attn16 a;
    attn16_make(r, B, T, C, NH, &a);
    size_t n = a.n;
    CHECK(a.n_dev == (size_t)B * T * (C + NH), "cudnn attention_floats %zu", a.n_dev);
    float *first_out = NULL, *first_d = NULL;
    for (int run = 0; run < 3; run++) { /* cuDNN, cuDNN again, the project's kernel */
        if (run == 2)
            ops_cuda_set_attention_cudnn(gpu, false);
        const char *name = run < 2 ? "cudnn" : "flash";
        ddp_status f = gpu->attention_fwd(gpu, DDP_BF16, DDP_BF16, a.out.d, a.att_d, a.qkv.d, B, T,
                                          C, NH);
        ddp_status b = f != DDP_OK ? f
                       : gpu->attention_bwd(gpu, DDP_BF16, DDP_BF16, a.dqkv.d, a.datt_d, a.dout.d,
                                            a.qkv.d, a.att_d, B, T, C, NH);
        CHECK(f == DDP_OK && b == DDP_OK, "attention %s B %d T %d C %d NH %d: %s / %s", name, B, T,
              C, NH, ddp_strerror(f), ddp_strerror(b));
        if (f != DDP_OK || b != DDP_OK)
            break;
        double e_out = rel_error_of(bdownload(&a.out), a.out.h, n);
        double e_d = rel_error_of(bdownload(&a.dqkv), a.dqkv.h, 3 * n);
        printf("attention bf16 activations %s B %d T %d C %d NH %d: out %.2e, dqkv %.2e\n", name,
               B, T, C, NH, e_out, e_d);
        CHECK(e_out <= 3e-2, "attention %s out: relative error %.3g > 3e-2", name, e_out);
        CHECK(e_d <= 5e-2, "attention %s dqkv: relative error %.3g > 5e-2", name, e_d);
        float *o = bdownload(&a.out), *d = bdownload(&a.dqkv);
        if (run == 1) {
            CHECK(!memcmp(o, first_out, n * sizeof *o),
                  "cudnn attention B %d T %d: a second forward differs", B, T);
            CHECK(!memcmp(d, first_d, 3 * n * sizeof *d),
                  "cudnn attention B %d T %d: a second backward differs (deterministic form)", B,
                  T);
        }
        if (run == 0) {
            first_out = o;
            first_d = d;
        } else {
            free(o), free(d);
        }
    }
    ops_cuda_set_attention_cudnn(gpu, false);
    free(first_out), free(first_d);
    attn16_drop(&a);
    ops_cuda_set_attention(gpu, true);
}

/* ---- bf16 activations: LayerNorm, GELU, add -------------------------------------------- */

#define BF16_ROUND 0x1p-8 /* one rounding to nearest bf16 (2^-9), margin 2 */

/* LayerNorm writing bf16 (from the fp32 residual) and its backward reading a bf16 dout, adding
 * into the fp32 dx and writing the sum in bf16 too (dx_act). */
static void check_layernorm_bf16(test_rng *r, int rows, int C)
{
    size_t n = (size_t)rows * C;
    pair x = make_pair(r, n, -2, 3), w = make_pair(r, C, 0.5, 1.5), b = make_pair(r, C, -1, 1);
    pair mean = make_nan_pair(rows), rstd = make_nan_pair(rows), dx = make_pair(r, n, -1, 1);
    pair dw = make_pair(r, C, -1, 1), db = make_pair(r, C, -1, 1);
    bpair out = make_bpair(r, n, 1, 0), dout = make_bpair(r, n, -1, 1);
    bpair dxa = make_bpair(r, n, 1, 0);
    cpu->layernorm_fwd(cpu, DDP_FP32, out.h, mean.h, rstd.h, x.h, w.h, b.h, rows, C);
    CHECK(gpu->layernorm_fwd(gpu, DDP_BF16, out.d, mean.d, rstd.d, x.d, w.d, b.d, rows, C) ==
          DDP_OK, "layernorm_fwd bf16");
    compare_bpair("layernorm bf16 out", &out, 1e-5, 1e-4 + BF16_ROUND);
    compare_pair("layernorm bf16 mean", &mean, 1e-5, 1e-4);
    compare_pair("layernorm bf16 rstd", &rstd, 1e-5, 1e-4);
    ddp_upload(gpu->ctx, mean.d, mean.h, rows * sizeof(float)); /* the same statistics */
    ddp_upload(gpu->ctx, rstd.d, rstd.h, rows * sizeof(float));
    cpu->layernorm_bwd(cpu, DDP_FP32, dx.h, dxa.h, dw.h, db.h, dout.h, x.h, w.h, mean.h, rstd.h,
                       rows, C);
    CHECK(gpu->layernorm_bwd(gpu, DDP_BF16, dx.d, dxa.d, dw.d, db.d, dout.d, x.d, w.d, mean.d,
                             rstd.d, rows, C) == DDP_OK, "layernorm_bwd bf16");
    compare_pair("layernorm bf16 dx", &dx, 1e-5, 1e-4);
    compare_pair("layernorm bf16 dw", &dw, 1e-5, 1e-4);
    compare_pair("layernorm bf16 db", &db, 1e-5, 1e-4);
    compare_bpair("layernorm bf16 dx_act", &dxa, 1e-5, 1e-4 + BF16_ROUND);
    drop_pair(&x), drop_pair(&w), drop_pair(&b), drop_pair(&mean), drop_pair(&rstd);
    drop_pair(&dx), drop_pair(&dw), drop_pair(&db), drop_bpair(&out), drop_bpair(&dout);
    drop_bpair(&dxa);
}

/* GELU forward and backward (in place) on bf16, then the residual add of a bf16 projection; n a
 * multiple of 8 takes the kernels that move eight elements a thread. */
static void check_elementwise_bf16(test_rng *r, size_t n)
{
    bpair x = make_bpair(r, n, -5, 5), y = make_bpair(r, n, 1, 0), g = make_bpair(r, n, -1, 1);
    pair a = make_pair(r, n, -1, 1);
    cpu->gelu_fwd(cpu, DDP_FP32, y.h, x.h, n);
    CHECK(gpu->gelu_fwd(gpu, DDP_BF16, y.d, x.d, n) == DDP_OK, "gelu_fwd bf16");
    compare_bpair("gelu_fwd bf16", &y, 1e-6, 1e-5 + BF16_ROUND);
    cpu->gelu_bwd(cpu, DDP_FP32, g.h, x.h, g.h, n);
    CHECK(gpu->gelu_bwd(gpu, DDP_BF16, g.d, x.d, g.d, n) == DDP_OK, "gelu_bwd bf16");
    compare_bpair("gelu_bwd bf16", &g, 1e-6, 1e-5 + BF16_ROUND);
    bpair_upload(&g); /* both sides add the same bf16 values: exact */
    cpu->add(cpu, DDP_FP32, a.h, a.h, g.h, n);
    CHECK(gpu->add(gpu, DDP_BF16, a.d, a.d, g.d, n) == DDP_OK, "add bf16");
    compare_pair("add bf16", &a, 0, 0);
    drop_bpair(&x), drop_bpair(&y), drop_bpair(&g), drop_pair(&a);
}

/* ---- elementwise and AdamW ------------------------------------------------------------- */

static void check_elementwise(test_rng *r)
{
    const size_t n = 100003;
    pair x = make_pair(r, n, -5, 5), y = make_nan_pair(n), g = make_pair(r, n, -1, 1);
    if (BOTH_HAVE(gelu_fwd)) {
        cpu->gelu_fwd(cpu, DDP_FP32, y.h, x.h, n);
        CHECK(gpu->gelu_fwd(gpu, DDP_FP32, y.d, x.d, n) == DDP_OK, "gelu_fwd");
        compare_pair("gelu_fwd", &y, 1e-6, 1e-5);
    }
    if (BOTH_HAVE(gelu_bwd)) { /* dx aliases dy */
        cpu->gelu_bwd(cpu, DDP_FP32, g.h, x.h, g.h, n);
        CHECK(gpu->gelu_bwd(gpu, DDP_FP32, g.d, x.d, g.d, n) == DDP_OK, "gelu_bwd");
        compare_pair("gelu_bwd", &g, 1e-6, 1e-5);
    }
    if (BOTH_HAVE(add)) { /* y aliases a; both sides add the same g (gelu_bwd's differ by 1e-6) */
        ddp_upload(gpu->ctx, g.d, g.h, n * sizeof(float));
        cpu->add(cpu, DDP_FP32, x.h, x.h, g.h, n);
        CHECK(gpu->add(gpu, DDP_FP32, x.d, x.d, g.d, n) == DDP_OK, "add");
        compare_pair("add", &x, 0, 0);
    }
    drop_pair(&x), drop_pair(&y), drop_pair(&g);
}

/* Two AdamW steps (t = 1, 2) with clipping's grad_scale and weight decay; the GPU's second step
 * reads its factor from device memory (grad_scale_dev, given a wrong grad_scale beside it). */
static void check_adamw(test_rng *r)
{
    const size_t n = 50001;
    pair w = make_pair(r, n, -1, 1), m = make_pair(r, n, -0.1, 0.1), v = make_pair(r, n, 0, 0.01);
    pair g = make_pair(r, n, -1, 1);
    bool both = BOTH_HAVE(adamw_step);
    float half = 0.5f, *half_d = ddp_alloc(gpu->ctx, sizeof half);
    CHECK(half_d && ddp_upload(gpu->ctx, half_d, &half, sizeof half) == DDP_OK, "the factor");
    for (int t = 1; both && t <= 2; t++) {
        cpu->adamw_step(cpu, w.h, m.h, v.h, g.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f, NULL);
        CHECK(gpu->adamw_step(gpu, w.d, m.d, v.d, g.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                              t == 1 ? 0.5f : 3.0f, t == 1 ? NULL : half_d) == DDP_OK,
              "adamw_step");
    }
    ddp_free(gpu->ctx, half_d);
    if (both) {
        compare_pair("adamw w", &w, 1e-6, 1e-5);
        compare_pair("adamw m", &m, 1e-7, 1e-6);
        compare_pair("adamw v", &v, 1e-7, 1e-6);
    }
    CHECK(!gpu->adamw_step || gpu->adamw_step(gpu, w.d, m.d, v.d, g.d, n, 1e-3f, 0.9f, 0.95f,
                                              1e-8f, 0.1f, 0, 1.0f, NULL) == DDP_ERR_INVALID_ARG,
          "adamw_step refuses t = 0");
    drop_pair(&w), drop_pair(&m), drop_pair(&v), drop_pair(&g);
}

/* ---- cross-entropy --------------------------------------------------------------------- */

/* The device's padding columns [V, Vp) of dlogits (rows, Vp) are exactly 0. */
static void check_padding_zero(const pair *dz, int rows, int V, int Vp)
{
    float *d = download(dz);
    int bad = 0;
    for (int row = 0; row < rows; row++)
        for (int c = V; c < Vp; c++)
            bad += d[(size_t)row * Vp + c] != 0.0f;
    CHECK(bad == 0, "xent: %d padding gradients are not 0", bad);
    free(d);
}

/* Logits whose padding columns are large (they must be ignored); dlogits separate, in place
 * (aliasing the logits), and NULL (losses only). */
static void check_xent(test_rng *r, int rows, int V, int Vp)
{
    size_t n = (size_t)rows * Vp;
    pair z = make_pair(r, n, -5, 5), dz = make_nan_pair(n), loss = make_nan_pair(rows);
    for (int row = 0; row < rows; row++)
        for (int c = V; c < Vp; c++)
            z.h[(size_t)row * Vp + c] = 50.0f;
    ddp_upload(gpu->ctx, z.d, z.h, n * sizeof(float));
    int *tgt_h = NULL, *tgt_d = make_ints(r, rows, V, &tgt_h);
    float dscale = 1.0f / (float)rows;
    if (BOTH_HAVE(xent_fwd_bwd)) {
        cpu->xent_fwd_bwd(cpu, DDP_FP32, NULL, loss.h, z.h, tgt_h, rows, V, Vp, dscale);
        CHECK(gpu->xent_fwd_bwd(gpu, DDP_FP32, NULL, loss.d, z.d, tgt_d, rows, V, Vp, dscale) ==
              DDP_OK, "xent_fwd_bwd without dlogits");
        compare_pair("xent losses (no dlogits)", &loss, 1e-5, 1e-4);
        cpu->xent_fwd_bwd(cpu, DDP_FP32, dz.h, loss.h, z.h, tgt_h, rows, V, Vp, dscale);
        CHECK(gpu->xent_fwd_bwd(gpu, DDP_FP32, dz.d, loss.d, z.d, tgt_d, rows, V, Vp, dscale) ==
              DDP_OK, "xent_fwd_bwd");
        compare_pair("xent losses", &loss, 1e-5, 1e-4);
        compare_pair("xent dlogits", &dz, 1e-7, 1e-5);
        cpu->xent_fwd_bwd(cpu, DDP_FP32, z.h, loss.h, z.h, tgt_h, rows, V, Vp, dscale);
        CHECK(gpu->xent_fwd_bwd(gpu, DDP_FP32, z.d, loss.d, z.d, tgt_d, rows, V, Vp, dscale) ==
              DDP_OK, "xent_fwd_bwd in place");
        compare_pair("xent losses (in place)", &loss, 1e-5, 1e-4);
        compare_pair("xent dlogits (in place)", &z, 1e-7, 1e-5);
        check_padding_zero(&z, rows, V, Vp);
    } else if (gpu->xent_fwd_bwd) {
        CHECK(gpu->xent_fwd_bwd(gpu, DDP_FP32, dz.d, loss.d, z.d, tgt_d, rows, V, Vp, dscale) ==
              DDP_OK, "xent_fwd_bwd");
        check_padding_zero(&dz, rows, V, Vp);
    }
    free(tgt_h), ddp_free(gpu->ctx, tgt_d);
    drop_pair(&z), drop_pair(&dz), drop_pair(&loss);
}

/* add_layernorm_fwd (the residual add feeding ln_2, one kernel) against add then layernorm_fwd on
 * the device, in fp32 and bf16 activations: bit for bit (the same sums in the same order). */
static void check_add_layernorm(test_rng *r, int rows, int C)
{
    size_t n = (size_t)rows * C;
    pair a = make_pair(r, n, -2, 2), w = make_pair(r, (size_t)C, 0.5, 1.5);
    pair b = make_pair(r, (size_t)C, -1, 1), p32 = make_pair(r, n, -1, 1);
    bpair p16 = make_bpair(r, n, -1, 1);
    for (int bf = 0; bf < 2; bf++) {
        ddp_dtype act = bf ? DDP_BF16 : DDP_FP32;
        const void *proj = bf ? (const void *)p16.d : (const void *)p32.d;
        size_t es = bf ? 2 : 4;
        float *y1 = (float *)ddp_alloc(gpu->ctx, n * 4), *y2 = (float *)ddp_alloc(gpu->ctx, n * 4);
        void *o1 = ddp_alloc(gpu->ctx, n * es), *o2 = ddp_alloc(gpu->ctx, n * es);
        float *st1 = (float *)ddp_alloc(gpu->ctx, 4 * rows * 4), *st2 = st1 + 2 * rows;
        CHECK(gpu->add(gpu, act, y1, a.d, proj, n) == DDP_OK &&
              gpu->layernorm_fwd(gpu, act, o1, st1, st1 + rows, y1, w.d, b.d, rows, C) == DDP_OK &&
              gpu->add_layernorm_fwd(gpu, act, y2, a.d, proj, o2, st2, st2 + rows, w.d, b.d, rows,
                                     C) == DDP_OK, "add_layernorm_fwd %s", ddp_dtype_name(act));
        unsigned char *h1 = (unsigned char *)malloc(n * 4 * 2 + 4 * rows * 4), *h2 = h1 + n * 4;
        unsigned char *hs = h2 + n * 4;
        CHECK(ddp_download(gpu->ctx, h1, y1, n * 4) == DDP_OK &&
              ddp_download(gpu->ctx, h2, y2, n * 4) == DDP_OK && memcmp(h1, h2, n * 4) == 0,
              "add_layernorm_fwd %s: the sum differs from add's", ddp_dtype_name(act));
        CHECK(ddp_download(gpu->ctx, h1, o1, n * es) == DDP_OK &&
              ddp_download(gpu->ctx, h2, o2, n * es) == DDP_OK && memcmp(h1, h2, n * es) == 0,
              "add_layernorm_fwd %s: the output differs from layernorm_fwd's", ddp_dtype_name(act));
        CHECK(ddp_download(gpu->ctx, hs, st1, 4 * rows * 4) == DDP_OK &&
              memcmp(hs, hs + 2 * rows * 4, 2 * rows * 4) == 0,
              "add_layernorm_fwd %s: mean or rstd differ", ddp_dtype_name(act));
        free(h1);
        ddp_free(gpu->ctx, y1), ddp_free(gpu->ctx, y2), ddp_free(gpu->ctx, o1);
        ddp_free(gpu->ctx, o2), ddp_free(gpu->ctx, st1);
    }
    drop_pair(&a), drop_pair(&w), drop_pair(&b), drop_pair(&p32), drop_bpair(&p16);
}

/* The MLP's fused linear + GELU (ops.h linear_gelu_fwd, linear_bwd_input_gelu) in bf16 against the
 * CPU's fp32 linear and GELU on the same bf16 values. cuBLASLt's epilogues (in and out multiples of
 * 8) round the bias to bf16 (2^-9 of |b| <= 1, so atol 2^-8 plus the sums' order) and each output
 * once (rtol BF16_ROUND); y is GELU of the unrounded sum (GELU' <= 1.13: atol 2^-7); dx rounds
 * once where the unfused path rounds twice. Other shapes take the unfused path, same bounds. */
static void check_linear_gelu_bf16(test_rng *r, int batch, int in, int out)
{
    size_t nx = (size_t)batch * in, ny = (size_t)batch * out;
    bpair x = make_bpair(r, nx, -1, 1), w = make_bpair(r, (size_t)out * in, -1, 1);
    bpair pre = make_bpair(r, ny, 1, 0), y = make_bpair(r, ny, 1, 0);
    pair b = make_pair(r, (size_t)out, -1, 1);
    cpu->linear_fwd(cpu, DDP_FP32, x.h, w.h, b.h, batch, in, out, pre.h, true);
    cpu->gelu_fwd(cpu, DDP_FP32, y.h, pre.h, ny);
    CHECK(gpu->linear_gelu_fwd(gpu, DDP_BF16, x.d, w.d, b.d, batch, in, out, pre.d, y.d) ==
          DDP_OK, "linear_gelu_fwd bf16");
    compare_bpair("linear_gelu_fwd pre", &pre, 0x1p-8 + 1e-5 * sqrt((double)in), BF16_ROUND);
    compare_bpair("linear_gelu_fwd y", &y, 0x1p-7 + 1e-5 * sqrt((double)in), BF16_ROUND);
    /* backward, as c_proj's: dx (batch, in) = (dy (batch, out) w) * GELU'(g (batch, in)) */
    bpair dy = make_bpair(r, ny, -1, 1), g = make_bpair(r, nx, -3, 3), dx = make_bpair(r, nx, 1, 0);
    bpair w2 = make_bpair(r, (size_t)out * in, -1, 1);
    cpu->linear_bwd_input(cpu, DDP_FP32, w2.h, dy.h, batch, in, out, dx.h);
    cpu->gelu_bwd(cpu, DDP_FP32, dx.h, g.h, dx.h, nx);
    CHECK(gpu->linear_bwd_input_gelu(gpu, DDP_BF16, w2.d, dy.d, g.d, batch, in, out, dx.d) ==
          DDP_OK, "linear_bwd_input_gelu bf16");
    compare_bpair("linear_bwd_input_gelu dx", &dx, 1e-5 * sqrt((double)out), 2 * BF16_ROUND);
    drop_bpair(&x), drop_bpair(&w), drop_bpair(&pre), drop_bpair(&y), drop_pair(&b);
    drop_bpair(&dy), drop_bpair(&g), drop_bpair(&dx), drop_bpair(&w2);
}

/* bf16 logits (the fused classifier, in place as the GPT runs it) against the CPU's fp32 on the
 * same bf16 values: the losses within the fp32 comparison's tolerance, dlogits within it plus one
 * rounding, the padding exactly 0; then the loss scale on bf16 (2^10: exact). vec: Vp a multiple
 * of 4 takes the four-column loads. */
static void check_xent_bf16(test_rng *r, int rows, int V, int Vp)
{
    size_t n = (size_t)rows * Vp;
    bpair z = make_bpair(r, n, -5, 5);
    pair loss = make_nan_pair(rows);
    float *dz = test_floats(n);
    int *tgt_h = NULL, *tgt_d = make_ints(r, rows, V, &tgt_h);
    float dscale = 1.0f / (float)rows;
    cpu->xent_fwd_bwd(cpu, DDP_FP32, dz, loss.h, z.h, tgt_h, rows, V, Vp, dscale);
    CHECK(gpu->xent_fwd_bwd(gpu, DDP_BF16, z.d, loss.d, z.d, tgt_d, rows, V, Vp, dscale) == DDP_OK,
          "xent_fwd_bwd bf16");
    compare_pair("xent bf16 losses", &loss, 1e-5, 1e-4);
    memcpy(z.h, dz, n * sizeof(float));
    compare_bpair("xent bf16 dlogits", &z, 1e-7, 1e-5 + BF16_ROUND);
    float *back = bdownload(&z);
    int bad = 0;
    for (int row = 0; row < rows; row++)
        for (int c = V; c < Vp; c++)
            bad += back[(size_t)row * Vp + c] != 0.0f;
    CHECK(bad == 0, "xent bf16: %d padding gradients are not 0", bad);
    for (size_t i = 0; i < n; i++)
        z.h[i] = back[i] * 0x1p10f;
    CHECK(gpu->scale(gpu, DDP_BF16, z.d, n, 0x1p10f) == DDP_OK, "scale bf16");
    compare_bpair("scale bf16 by 2^10", &z, 0, 0);
    free(back), free(dz), free(tgt_h), ddp_free(gpu->ctx, tgt_d);
    drop_bpair(&z), drop_pair(&loss);
}

/* A linear with a bias writing bf16 (every GPT linear under bf16 activations) against the CPU's
 * fp32 on the same bf16 values. On cuBLASLt's bias epilogue the bias is rounded to bf16 first
 * (2^-9 of |b| <= 1: atol 2^-8); exact_bias, the fp32 scratch and bias kernel (DDP_LT_BIAS16=0)
 * add it unrounded, so only the sums' order and one rounding remain. */
static void check_linear_bias_bf16(test_rng *r, int batch, int in, int out, bool exact_bias)
{
    bpair x = make_bpair(r, (size_t)batch * in, -1, 1), w = make_bpair(r, (size_t)out * in, -1, 1);
    bpair y = make_bpair(r, (size_t)batch * out, 1, 0);
    pair b = make_pair(r, (size_t)out, -1, 1);
    cpu->linear_fwd(cpu, DDP_FP32, x.h, w.h, b.h, batch, in, out, y.h, true);
    CHECK(gpu->linear_fwd(gpu, DDP_BF16, x.d, w.d, b.d, batch, in, out, y.d, false) == DDP_OK,
          "linear_fwd bf16 out");
    double atol = (exact_bias ? 0.0 : 0x1p-8) + 1e-5 * sqrt((double)in);
    compare_bpair(exact_bias ? "linear bf16, bias unrounded" : "linear bf16", &y, atol,
                  BF16_ROUND);
    drop_bpair(&x), drop_bpair(&w), drop_bpair(&y), drop_pair(&b);
}

/* Run 4's paths (models/ops/switches.h): a handle opened with every switch 0 has no fused ops in
 * its table (the model composes them), and its kernels pass the checks above against the CPU:
 * the linear's bias unrounded, LayerNorm's two-kernel backward, the embedding's backward in the
 * CPU's order (so exactly the CPU's), the attention's fp32 outputs merged. */
static void check_switches_off(test_rng *r)
{
    for (int i = 0; i < OPS_SW_COUNT; i++)
        setenv(ops_switch_info((ops_switch)i)->var, "0", 1);
    ops_handle *dflt = gpu;
    gpu = NULL;
    CHECK(ops_cuda_open(ctx, false, &gpu) == DDP_OK, "ops_cuda_open with every switch 0");
    if (gpu) {
        CHECK(!gpu->linear_gelu_fwd && !gpu->linear_bwd_input_gelu && !gpu->add_layernorm_fwd,
              "switches 0: the fused ops are left out of the table");
        check_linear_bias_bf16(r, 70, 96, 384, true);
        check_layernorm(r, 70, 300);
        check_layernorm_bf16(r, 70, 300);
        check_attention_act16(r, 2, 129, 256, 4, true);
        int B = 4, T = 64, C = 40, *tok_h = NULL, *tok_d = make_ints(r, B * T, 2, &tok_h);
        pair dwte = make_pair(r, 2 * (size_t)C, -1, 1), dwpe = make_pair(r, (size_t)T * C, -1, 1);
        pair dout = make_pair(r, (size_t)B * T * C, -1, 1);
        cpu->encoder_bwd(cpu, dwte.h, dwpe.h, dout.h, tok_h, B, T, C);
        CHECK(gpu->encoder_bwd(gpu, dwte.d, dwpe.d, dout.d, tok_d, B, T, C) == DDP_OK,
              "encoder_bwd, DDP_ENC_SEG=0");
        compare_pair("encoder_bwd dwte, DDP_ENC_SEG=0 (the CPU's order)", &dwte, 0, 0);
        free(tok_h), ddp_free(gpu->ctx, tok_d);
        drop_pair(&dwte), drop_pair(&dwpe), drop_pair(&dout);
        ops_close(gpu);
    }
    gpu = dflt;
    for (int i = 0; i < OPS_SW_COUNT; i++)
        unsetenv(ops_switch_info((ops_switch)i)->var);
}

int main(void)
{
    int rc = test_cuda_open("test_cuda_gpt", &ctx, &gpu, &cpu);
    if (rc != 0)
        return rc;
    test_rng r = {1606};
    CHECK(ops_require_gpt(gpu, "test_cuda_gpt") == DDP_OK, "cuda implements every GPT op");
    check_encoder(&r, 2, 13, 96, 11);
    check_encoder(&r, 3, 40, 70, 11);
    check_encoder(&r, 4, 64, 40, 2);
    check_layernorm(&r, 26, 96);
    check_layernorm(&r, 70, 300);
    check_attention(&r, 2, 13, 96, 4);
    check_attention(&r, 3, 70, 64, 2);
    check_attention(&r, 2, 9, 6, 2); /* hs 3: the heads moved one float at a time */
    if (gpu->supports(gpu, DDP_BF16, NULL)) {
        for (int flash = 0; flash <= 1; flash++) {
            check_attention_bf16(&r, 2, 70, 128, 2, flash);  /* hs 64, a partial tile */
            check_attention_bf16(&r, 1, 1, 64, 1, flash);    /* T = 1 */
            check_attention_bf16(&r, 2, 129, 256, 4, flash); /* three tiles, one row past */
            check_attention_bf16(&r, 1, 256, 128, 2, flash); /* whole tiles */
            check_attention_bf16(&r, 2, 13, 96, 4, flash);   /* hs 24: always materialised */
            check_attention_act16(&r, 2, 70, 128, 2, flash);
            check_attention_act16(&r, 2, 129, 256, 4, flash);
            check_attention_act16(&r, 2, 13, 96, 4, flash);
            check_attention_act16(&r, 2, 9, 6, 2, flash); /* hs 3: one element at a time */
        }
        check_layernorm_bf16(&r, 26, 96);
        check_layernorm_bf16(&r, 70, 300);
        check_elementwise_bf16(&r, 100003);
        check_elementwise_bf16(&r, 100000);
        check_add_layernorm(&r, 70, 300);
        check_add_layernorm(&r, 26, 96);
        check_linear_gelu_bf16(&r, 70, 96, 384);  /* c_fc's shape, C 96: the epilogues */
        check_linear_gelu_bf16(&r, 70, 384, 96);  /* c_proj's, for the backward */
        check_linear_gelu_bf16(&r, 33, 29, 100);  /* 100 and 29 not multiples of 8: unfused */
        check_xent_bf16(&r, 26, 100, 128);
        check_xent_bf16(&r, 9, 1000, 1024);
        check_xent_bf16(&r, 5, 37, 39); /* one column at a time */
        check_linear_bias_bf16(&r, 70, 96, 384, false);
        check_switches_off(&r);
    }
    check_elementwise(&r);
    check_adamw(&r);
    check_xent(&r, 26, 100, 128);
    check_xent(&r, 9, 1000, 1024);
    check_xent(&r, 5, 37, 39); /* Vp not a multiple of 4: one column at a time */
    /* last: cuDNN's graphs have not run on a GPU before; a fault there leaves the checks above
     * reported (their lines flushed first) */
    fflush(stdout);
    if (gpu->supports(gpu, DDP_BF16, NULL)) {
        check_attention_cudnn(&r, 2, 70, 128, 2);   /* hs 64, T not a multiple of 64 */
        check_attention_cudnn(&r, 2, 256, 768, 12); /* d12's heads, four tiles */
        /* three more shapes: ten plans for the eight slots, so two are evicted (after the
         * stream drained) and the next shapes still right */
        check_attention_cudnn(&r, 1, 64, 128, 2);
        check_attention_cudnn(&r, 1, 96, 128, 2);
        check_attention_cudnn(&r, 3, 33, 128, 2);
    }
    test_cuda_close(ctx, gpu, cpu);
    return CHECK_DONE();
}
