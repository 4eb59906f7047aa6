/* test_half.c - fp32 <-> bf16 / fp16 conversions of half.h (the code the CPU reducer, the
 * MPI 16-bit sums and the CUDA kernels share) against independent oracles:
 *  - fp16: the compiler's _Float16 (IEEE binary16, round to nearest even), on every 16-bit
 *    pattern and on 4 million float bit patterns spread over the whole range;
 *  - bf16: the nearer of the two bf16 neighbours computed in double, ties to the even one.
 * Then convert.c's array loops (the reducer's casts, scaling and inf/NaN checks on host memory;
 * internal, so this test links libddp's objects) against these element functions.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "convert.h"
#include "half.h"

/* GCC's IEEE binary16 type (an extension to ISO C, hence __extension__). */
__extension__ typedef _Float16 f16;

static uint16_t f16_bits(f16 h)
{
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

static f16 f16_from(uint16_t u)
{
    f16 h;
    memcpy(&h, &u, sizeof h);
    return h;
}

static int is_nan(float f) { return f != f; }

/* Counts a mismatch; the first five are printed. */
static void mismatch(int *count, const char *what, uint32_t pattern, uint32_t got, uint32_t want)
{
    if ((*count)++ < 5)
        fprintf(stderr, "%s: input 0x%08x gives 0x%04x, want 0x%04x\n", what, pattern, got, want);
}

/* Every fp16 and bf16 pattern widens exactly and narrows back to itself (NaN stays NaN). */
static void check_all_patterns(void)
{
    int bad16 = 0, badbf = 0;
    for (uint32_t u = 0; u < 65536; u++) {
        float f = half_f16_to_f32((uint16_t)u), ref = (float)f16_from((uint16_t)u);
        if (is_nan(ref) ? !is_nan(f) : (f != ref || half_f32_to_f16(f) != u || signbit(f) != signbit(ref)))
            mismatch(&bad16, "fp16 widen and narrow", u, half_f32_to_f16(f), u);
        float b = half_bf16_to_f32((uint16_t)u);
        if (is_nan(b) ? !is_nan(half_bf16_to_f32(half_f32_to_bf16(b))) : half_f32_to_bf16(b) != u)
            mismatch(&badbf, "bf16 widen and narrow", u, half_f32_to_bf16(b), u);
    }
    CHECK(bad16 == 0 && badbf == 0, "%d fp16 and %d bf16 patterns wrong", bad16, badbf);
}

/* The bf16 value nearest to f, ties to even, by comparing distances in double. */
static uint16_t bf16_oracle(float f)
{
    uint32_t u = half_f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* magnitude neighbours */
    double dl = fabs((double)f - (double)half_bf16_to_f32(lo));
    double dh = fabs((double)half_bf16_to_f32(hi) - (double)f);
    if ((u & 0xffffu) == 0)
        return lo;
    return dl < dh ? lo : dh < dl ? hi : (lo & 1u) ? hi : lo;
}

static void check_rounding(void)
{
    uint64_t state = 0x9e3779b97f4a7c15ull;
    int bad16 = 0, badbf = 0;
    for (int i = 0; i < 4000000; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(state >> 32);
        if (i % 4 == 1)
            u = (u & 0xffff0000u) | 0x8000u; /* an exact bf16 tie */
        if (i % 4 == 2)
            u = (u & 0xffffe000u) | 0x1000u; /* an exact fp16 tie (normal range) */
        float f = half_f32_from_bits(u);
        if (is_nan(f))
            continue;
        if (half_f32_to_f16(f) != f16_bits((f16)f))
            mismatch(&bad16, "fp16 rounding", u, half_f32_to_f16(f), f16_bits((f16)f));
        if ((u & 0x7f800000u) < 0x7f000000u && half_f32_to_bf16(f) != bf16_oracle(f))
            mismatch(&badbf, "bf16 rounding", u, half_f32_to_bf16(f), bf16_oracle(f));
    }
    CHECK(bad16 == 0 && badbf == 0, "%d fp16 and %d bf16 roundings wrong", bad16, badbf);
}

/* Landmarks a reader can check by hand. */
static void check_landmarks(void)
{
    CHECK(half_f32_to_f16(65504.0f) == 0x7bff, "fp16 max");
    CHECK(half_f32_to_f16(65519.0f) == 0x7bff && half_f32_to_f16(65520.0f) == 0x7c00, "fp16 overflow");
    CHECK(half_f32_to_f16(0x1p-24f) == 0x0001 && half_f32_to_f16(0x1p-25f) == 0, "fp16 subnormals");
    CHECK(half_f32_to_bf16(1.0f / 3.0f) == 0x3eab, "bf16(1/3) = 0x%04x", half_f32_to_bf16(1.0f / 3.0f));
    CHECK(half_f32_to_bf16(3.4e38f) == 0x7f80, "bf16 of a float above its max rounds to inf");
    CHECK(!half_f32_finite(half_f16_to_f32(0x7c00)) && !half_f32_finite(half_bf16_to_f32(0x7fc0)) &&
              half_f32_finite(65504.0f), "finite checks");
}

/* The array loops of convert.c give, element by element, what the functions above give. */
static void check_array_loops(void)
{
    enum { N = 65536 + 13 }; /* every 16-bit pattern, and a tail past any vector width */
    float *f = malloc(N * sizeof *f), *back = malloc(N * sizeof *back);
    uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    CHECK(f && back && h && h2, "out of memory");
    if (!f || !back || !h || !h2)
        goto out;
    for (int fp16 = 0; fp16 <= 1; fp16++) {
        ddp_dtype t = fp16 ? DDP_FP16 : DDP_BF16;
        int bad = 0;
        for (uint32_t i = 0; i < N; i++)
            h[i] = (uint16_t)(i * 40503u); /* a permutation of the patterns */
        convert_host_cast(back, DDP_FP32, h, t, N);
        for (uint32_t i = 0; i < N; i++)
            if (half_f32_bits(back[i]) != half_f32_bits(half_decode(h[i], fp16)))
                mismatch(&bad, fp16 ? "cast fp16 -> fp32" : "cast bf16 -> fp32", h[i], half_f32_bits(back[i]) >> 16,
                         half_f32_bits(half_decode(h[i], fp16)) >> 16);
        for (uint32_t i = 0; i < N; i++)
            f[i] = half_f32_from_bits(i * 2654435761u);
        convert_host_cast(h2, t, f, DDP_FP32, N);
        for (uint32_t i = 0; i < N; i++)
            if (h2[i] != half_encode(f[i], fp16) && !(is_nan(f[i]) && is_nan(half_decode(h2[i], fp16))))
                mismatch(&bad, fp16 ? "cast fp32 -> fp16" : "cast fp32 -> bf16", half_f32_bits(f[i]), h2[i],
                         half_encode(f[i], fp16));
        memcpy(h2, h, N * sizeof *h);
        convert_host_scale(h2, t, N, 0.375f);
        for (uint32_t i = 0; i < N; i++)
            if (h2[i] != half_encode(half_decode(h[i], fp16) * 0.375f, fp16) && !is_nan(half_decode(h[i], fp16)))
                mismatch(&bad, "scale", h[i], h2[i], half_encode(half_decode(h[i], fp16) * 0.375f, fp16));
        convert_host_cast_scale(back, DDP_FP32, h, t, N, 0.375f); /* the reducer's unpack, one pass */
        for (uint32_t i = 0; i < N; i++) {
            float want = half_decode(h[i], fp16) * 0.375f;
            if (half_f32_bits(back[i]) != half_f32_bits(want) && !(is_nan(want) && is_nan(back[i])))
                mismatch(&bad, "cast and scale to fp32", h[i], half_f32_bits(back[i]) >> 16, half_f32_bits(want) >> 16);
        }
        CHECK(bad == 0, "%s: %d array elements differ from the element functions", fp16 ? "fp16" : "bf16", bad);
        for (uint32_t i = 0; i < N; i++)
            h2[i] = half_encode((float)(i % 1000) - 500.0f, fp16);
        CHECK(!convert_host_nonfinite(h2, t, N), "%s: finite values reported non-finite", fp16 ? "fp16" : "bf16");
        h2[N - 1] = half_encode(1.0f / 0.0f, fp16);
        CHECK(convert_host_nonfinite(h2, t, N), "%s: an inf in the last element missed", fp16 ? "fp16" : "bf16");
    }
    for (uint32_t i = 0; i < N; i++)
        f[i] = (float)i;
    CHECK(!convert_host_nonfinite(f, DDP_FP32, N), "fp32: finite values reported non-finite");
    f[N / 2] = half_f32_from_bits(0x7fc00000u);
    CHECK(convert_host_nonfinite(f, DDP_FP32, N), "fp32: a NaN in the middle missed");
out:
    free(f), free(back), free(h), free(h2);
}

int main(void)
{
    check_landmarks();
    check_all_patterns();
    check_rounding();
    check_array_loops();
    return CHECK_DONE();
}
