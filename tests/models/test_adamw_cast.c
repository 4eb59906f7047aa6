/* test_adamw_cast.c - AdamW that writes the 16-bit copy in its pass (ops.h adamw_step_cast) and
 * the stochastic rounding to bf16 it uses (math_shared.h bf16_round_stochastic), on the CPU:
 *   - the rounding gives one of the two bf16 values around x (x itself when it is one), keeps
 *     inf and NaN, and is a pure function of (x, seed, step, index);
 *   - it is unbiased: the mean of N roundings of one x (N indices, or N steps at one index) is x
 *     within 5 standard deviations of that mean. Each rounding is the lower neighbour plus one
 *     ulp with probability f (the dropped bits over 2^16), so the mean's deviation has standard
 *     deviation ulp sqrt(f (1 - f) / N); 5 of them fail a correct rounding with probability
 *     6e-7 per value. Nearest-even rounding is off by min(f, 1 - f) ulp, 63 to 577 standard
 *     deviations at these N and f: the check would catch it (negative control);
 *   - adamw_step_cast's w, m and v equal adamw_step's bit for bit, its bf16 copy is the rounding
 *     of the new w by (seed, t, index0 + i), its fp16 copy is cast's (nearest even);
 *   - a shard stepped at its offset (the state's range under ZeRO) writes the same elements as
 *     the whole, and cast_stochastic at an offset rounds them as adamw_step_cast did (the model's
 *     cast of the slices the all-gather brings).
 */
#include <math.h>
#include <string.h>

#include "math_shared.h"
#include "ops.h"
#include "testutil.h"

static const ops_handle *ops;

/* The float of bf16 bits h. */
static double bf16_value(uint16_t h) { return (double)bf16_bits_to_f32(h); }

/* Element i of a copy in precision p as this backend stores it, as the float it holds. */
static float copy_at(const void *wc, ddp_dtype p, size_t i)
{
    if (ops_dtype_size(ops, p) == 2)
        return bf16_bits_to_f32(((const uint16_t *)wc)[i]);
    return ((const float *)wc)[i];
}

static void check_neighbours(test_rng *r)
{
    uint64_t key = sr_key(42, 7);
    int bad = 0, up = 0;
    for (int k = 0; k < 200000; k++) {
        float x = (float)((test_uniform(r) - 0.5) * pow(2.0, (double)(k % 40) - 20.0));
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        uint16_t lo = (uint16_t)(u >> 16), b = bf16_round_stochastic(x, key, (uint64_t)k);
        bool exact = (u & 0xffffu) == 0;
        if (!(b == lo || (!exact && b == lo + 1)))
            bad++;
        up += b != lo;
        if (b != bf16_round_stochastic(x, key, (uint64_t)k)) /* the same call, the same bits */
            bad++;
    }
    CHECK(bad == 0, "%d of 200000 roundings not a neighbour or not repeatable", bad);
    CHECK(up > 60000 && up < 140000, "%d of 200000 rounded away from zero (about half expected)",
          up);
    CHECK(bf16_round_stochastic(1.0f, key, 3) == 0x3f80, "an exact bf16 stays");
    CHECK(bf16_round_stochastic(-2.5f, key, 3) == 0xc020, "an exact negative bf16 stays");
    CHECK(bf16_round_stochastic(INFINITY, key, 3) == 0x7f80, "inf stays inf");
    CHECK(bf16_round_stochastic(-INFINITY, key, 3) == 0xff80, "-inf stays -inf");
    uint16_t nan = bf16_round_stochastic(NAN, key, 3);
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0, "NaN stays NaN (0x%04x)", nan);
    CHECK(bf16_round_stochastic(0.0f, key, 3) == 0, "0 stays 0");
    /* a pure function of (seed, step, index): another seed, step or index draws other bits */
    int same_seed = 0, same_step = 0, same_index = 0;
    float x = 1.0f + 0x8000 * 0x1p-23f; /* halfway between two bf16 values */
    for (uint64_t i = 0; i < 10000; i++) {
        uint16_t b = bf16_round_stochastic(x, sr_key(42, 7), i);
        same_seed += b == bf16_round_stochastic(x, sr_key(43, 7), i);
        same_step += b == bf16_round_stochastic(x, sr_key(42, 8), i);
        same_index += b == bf16_round_stochastic(x, sr_key(42, 7), i + 1);
    }
    CHECK(same_seed > 4000 && same_seed < 6000, "another seed: %d of 10000 alike (about half)",
          same_seed);
    CHECK(same_step > 4000 && same_step < 6000, "another step: %d of 10000 alike", same_step);
    CHECK(same_index > 4000 && same_index < 6000, "another index: %d of 10000 alike", same_index);
    CHECK(sr_key(42, 7) == sr_key(42, 7) && sr_key(42, 7) != sr_key(7, 42), "sr_key");
}

/* The mean of n roundings of x (indices 0..n-1 at one step, or steps 1..n at one index) within
 * 5 standard deviations of x; the same for nearest even fails (the negative control). */
static void check_unbiased(float x, int n)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    double lo = bf16_value((uint16_t)(u >> 16)), ulp = bf16_value((uint16_t)((u >> 16) + 1)) - lo;
    double f = ((double)x - lo) / ulp, sd = fabs(ulp) * sqrt(f * (1.0 - f) / n);
    double by_index = 0.0, by_step = 0.0;
    uint64_t key = sr_key(1234, 5);
    for (int i = 0; i < n; i++) {
        by_index += bf16_value(bf16_round_stochastic(x, key, (uint64_t)i));
        by_step += bf16_value(bf16_round_stochastic(x, sr_key(1234, (uint32_t)i + 1), 777));
    }
    by_index /= n;
    by_step /= n;
    CHECK(fabs(by_index - x) <= 5.0 * sd, "x %.9g (f %.3f): mean over indices %.9g, |diff| %.3g "
          "> 5 sd %.3g", (double)x, f, by_index, fabs(by_index - x), 5.0 * sd);
    CHECK(fabs(by_step - x) <= 5.0 * sd, "x %.9g (f %.3f): mean over steps %.9g, |diff| %.3g "
          "> 5 sd %.3g", (double)x, f, by_step, fabs(by_step - x), 5.0 * sd);
    double rne = bf16_value((uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
    CHECK(fabs(rne - x) > 5.0 * sd, "negative control: nearest even %.9g within 5 sd of %.9g", rne,
          (double)x);
}

/* Buffers of one AdamW problem: w, m, v, g (n each) and the copy wc (n, storage of p). */
typedef struct prob {
    float *w, *m, *v, *g;
    void *wc;
    size_t n;
} prob;

static prob make_prob(test_rng *r, size_t n, ddp_dtype p)
{
    prob q = {test_floats(n), test_floats(n), test_floats(n), test_floats(n),
              calloc(n, ops_dtype_size(ops, p)), n};
    test_fill(r, q.w, n, -1, 1);
    test_fill(r, q.m, n, -0.1, 0.1);
    test_fill(r, q.v, n, 0, 0.01);
    test_fill(r, q.g, n, -1, 1);
    return q;
}

static prob copy_prob(const prob *a, ddp_dtype p)
{
    prob q = {test_floats(a->n), test_floats(a->n), test_floats(a->n), test_floats(a->n),
              calloc(a->n, ops_dtype_size(ops, p)), a->n};
    memcpy(q.w, a->w, a->n * sizeof(float));
    memcpy(q.m, a->m, a->n * sizeof(float));
    memcpy(q.v, a->v, a->n * sizeof(float));
    memcpy(q.g, a->g, a->n * sizeof(float));
    return q;
}

static void drop_prob(prob *q) { free(q->w), free(q->m), free(q->v), free(q->g), free(q->wc); }

/* Element a of q's copy in precision p. */
static const char *copy_ptr(const prob *q, ddp_dtype p, size_t a)
{
    return (const char *)q->wc + a * ops_dtype_size(ops, p);
}

static bool same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

#define HP 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f /* lr, beta1, beta2, eps, wd */

/* Two steps (t = 1, 2; clipping's grad_scale 0.5) of adamw_step_cast against adamw_step. */
static void check_against_adamw(test_rng *r, ddp_dtype p, size_t n, size_t index0)
{
    prob a = make_prob(r, n, p), b = copy_prob(&a, p);
    const uint32_t seed = 2024;
    for (int t = 1; t <= 2; t++) {
        CHECK(ops->adamw_step(ops, a.w, a.m, a.v, a.g, n, HP, t, 0.5f, NULL) == DDP_OK,
              "adamw_step");
        CHECK(ops->adamw_step_cast(ops, b.w, b.m, b.v, b.g, n, HP, t, 0.5f, NULL, p, b.wc, seed,
                                   index0) == DDP_OK,
              "adamw_step_cast");
    }
    CHECK(same_bits(a.w, b.w, n) && same_bits(a.m, b.m, n) && same_bits(a.v, b.v, n),
          "p %d: adamw_step_cast's w, m, v are adamw_step's bit for bit", (int)p);
    int bad = 0;
    uint64_t key = sr_key(seed, 2);
    for (size_t i = 0; p != DDP_FP32 && i < n; i++) { /* fp32 has no copy */
        float want = a.w[i]; /* fp16: cast's nearest even */
        if (p == DDP_BF16)
            want = bf16_bits_to_f32(bf16_round_stochastic(a.w[i], key, index0 + i));
        else if (p == DDP_FP16)
            ops->cast(ops, DDP_FP16, &want, DDP_FP32, &a.w[i], 1);
        float got = copy_at(b.wc, p, i);
        if (memcmp(&got, &want, sizeof got) != 0 && bad++ < 5)
            fprintf(stderr, "p %d: wc[%zu] %.9g, want %.9g\n", (int)p, i, (double)got,
                    (double)want);
    }
    CHECK(bad == 0, "p %d: %d of %zu copy elements differ from the rounding of w", (int)p, bad, n);
    CHECK(ops->adamw_step_cast(ops, b.w, b.m, b.v, b.g, n, HP, 0, 1.0f, NULL, p, b.wc, seed,
                               index0) == DDP_ERR_INVALID_ARG,
          "adamw_step_cast refuses t = 0");
    drop_prob(&a), drop_prob(&b);
}

/* The whole stepped at index 0 against two shards [0, k) and [k, n) stepped at their offsets
 * (the ZeRO ranks' ranges); cast_stochastic of the new w's shard at its offset against the
 * copy adamw_step_cast wrote. */
static void check_shards(test_rng *r, ddp_dtype p, size_t n, size_t k)
{
    prob whole = make_prob(r, n, p), parts = copy_prob(&whole, p);
    const uint32_t seed = 99;
    const int t = 3;
    size_t es = ops_dtype_size(ops, p);
    CHECK(ops->adamw_step_cast(ops, whole.w, whole.m, whole.v, whole.g, n, HP, t, 1.0f, NULL, p,
                               whole.wc, seed, 0) == DDP_OK, "whole");
    size_t cut[3] = {0, k, n};
    for (int s = 0; s < 2; s++) {
        size_t a = cut[s], m = cut[s + 1] - a;
        CHECK(ops->adamw_step_cast(ops, parts.w + a, parts.m + a, parts.v + a, parts.g + a, m, HP,
                                   t, 1.0f, NULL, p, (char *)parts.wc + a * es, seed, a) == DDP_OK,
              "shard");
    }
    CHECK(same_bits(whole.w, parts.w, n) && same_bits(whole.m, parts.m, n) &&
              same_bits(whole.v, parts.v, n), "p %d: shards' w, m, v are the whole's", (int)p);
    CHECK(memcmp(whole.wc, parts.wc, n * es) == 0,
          "p %d: shards' copy is the whole's byte for byte", (int)p);
    /* the model rounds a gathered slice alike: cast_stochastic at the slice's flat offset */
    void *cast = calloc(n, es);
    CHECK(ops->cast_stochastic(ops, p, (char *)cast + k * es, whole.w + k, n - k, seed, t, k) ==
              DDP_OK, "cast_stochastic");
    CHECK(memcmp((char *)cast + k * es, copy_ptr(&whole, p, k), (n - k) * es) == 0,
          "p %d: cast_stochastic at the offset rounds as adamw_step_cast", (int)p);
    /* the wrong offset rounds otherwise (the check can fail) */
    CHECK(ops->cast_stochastic(ops, p, cast, whole.w + k, n - k, seed, t, 0) == DDP_OK,
          "cast_stochastic at 0");
    CHECK(p != DDP_BF16 || memcmp(cast, copy_ptr(&whole, p, k), (n - k) * es) != 0,
          "negative control: another index rounds otherwise");
    free(cast);
    drop_prob(&whole), drop_prob(&parts);
}

int main(void)
{
    ops_handle *h = NULL;
    if (ops_cpu_open(NULL, 1, false, &h) != DDP_OK)
        return 1;
    ops = h;
    test_rng r = {77};
    check_neighbours(&r);
    const int N = 1000000;
    check_unbiased(1.0f + 0x4000 * 0x1p-23f, N);          /* f = 1/4 */
    check_unbiased(-3.0f - 0xc000 * 0x1p-22f, N);         /* f = 3/4, negative */
    check_unbiased(0.1f, N);                              /* f = 0.6 */
    check_unbiased(1e-3f, N);
    check_unbiased(1.0f + 0x0100 * 0x1p-23f, N);          /* f = 1/256 */
    CHECK(ops->adamw_step_cast && ops->cast_stochastic,
          "the CPU has adamw_step_cast and cast_stochastic");
    for (int p = 0; p < 3 && ops->adamw_step_cast; p++) {
        ddp_dtype d = p == 0 ? DDP_FP32 : p == 1 ? DDP_BF16 : DDP_FP16;
        check_against_adamw(&r, d, 10007, 0);
        check_against_adamw(&r, d, 333, 123456789);
        if (d != DDP_FP32)
            check_shards(&r, d, 5003, 2011);
    }
    ops_close(h);
    return CHECK_DONE();
}
