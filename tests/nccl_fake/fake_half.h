/* fake_half.h - the fake NCCL's 16-bit float conversions (bf16 and IEEE fp16 <-> fp32, round to
 * nearest even, NaN kept quiet, fp16 overflow to inf, subnormals exact). Host only: the fake sums
 * 16-bit elements in fp32 on the host (fake_nccl.c) and the tests check these against bit patterns.
 */
#ifndef FAKE_HALF_H
#define FAKE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fake_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float fake_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float fake_bf16_to_f32(uint16_t h)
{
    return fake_bits_f32((uint32_t)h << 16);
}

static inline uint16_t fake_f32_to_bf16(float f)
{
    uint32_t u = fake_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign, make it quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fake_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* inf, NaN */
        return fake_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero, subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return fake_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t fake_f32_to_f16(float f)
{
    uint32_t u = fake_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* rounds to 65520 or more: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal, rounded to a multiple of 2^-24 */
        float v = fake_bits_f32(a) * 16777216.0f; /* exact: a power-of-two scale */
        uint32_t m = (uint32_t)v;
        float rest = v - (float)m;
        if (rest > 0.5f || (rest == 0.5f && (m & 1u)))
            m++;
        return (uint16_t)(sign | m);
    }
    a += 0xfffu + ((a >> 13) & 1u); /* round the 13 dropped bits to nearest even */
    return (uint16_t)(sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
}

#endif /* FAKE_HALF_H */
