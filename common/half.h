/* half.h - fp32 <-> bf16 / fp16 conversions shared by the CPU and CUDA code (host+device
 * under nvcc), so the CPU tests exercise the exact bit operations the CUDA kernels run.
 *
 * 16-bit values travel as uint16_t bit patterns. float -> 16 bits rounds to nearest, ties to even
 * (IEEE 754's default, what PyTorch's .to(torch.bfloat16 / torch.float16) does); NaN stays NaN
 * (quiet), values beyond the fp16 range become +-inf, tiny values become fp16 subnormals or zero.
 * 16 bits -> float is exact. Integer arithmetic only: the same bits on every CPU and GPU.
 */
#ifndef COMMON_HALF_H
#define COMMON_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HALF_HD __host__ __device__
#else
#define HALF_HD
#endif

static inline HALF_HD uint32_t half_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

static inline HALF_HD float half_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- bfloat16: fp32's sign and exponent, 7 stored mantissa bits ---------------------------- */

static inline HALF_HD uint16_t half_f32_to_bf16(float f)
{
    uint32_t u = half_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep the sign, force quiet */
    u += 0x7fffu + ((u >> 16) & 1u);            /* round to nearest even on the 16 dropped bits */
    return (uint16_t)(u >> 16);
}

static inline HALF_HD float half_bf16_to_f32(uint16_t h)
{
    return half_f32_from_bits((uint32_t)h << 16);
}

/* ---- IEEE fp16: 5 exponent bits (bias 15), 10 mantissa bits, max 65504 ----------------------- */

/* |f| below 2^-14 (bits a): an fp16 subnormal m * 2^-24, m rounded to nearest even. */
static inline HALF_HD uint16_t half_f16_subnormal(uint32_t a)
{
    if (a <= 0x33000000u) /* <= 2^-25: half of the smallest subnormal ties to even (zero) */
        return 0;
    uint32_t e = a >> 23;                      /* biased exponent, 102..112 here */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;  /* value = m * 2^(e - 150) */
    uint32_t shift = 126u - e;                 /* units of 2^-24: m >> (126 - e) */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may carry into 0x400: the smallest normal, encoded correctly */
    return (uint16_t)q;
}

static inline HALF_HD uint16_t half_f32_to_f16(float f)
{
    uint32_t u = half_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds beyond 65504: inf */
    if (a < 0x38800000u)
        return (uint16_t)(sign | half_f16_subnormal(a));
    a += 0xfffu + ((a >> 13) & 1u); /* round to nearest even on the 13 dropped bits */
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13)); /* exponent bias 127 -> 15 */
}

static inline HALF_HD float half_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu, mant = (uint32_t)h & 0x3ffu;
    if (exp == 0x1fu)
        return half_f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return half_f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* ---- by element type: code 1 = bf16, 2 = fp16 (ddp_dtype's DDP_BF16, DDP_FP16) -------------- */

static inline HALF_HD uint16_t half_encode(float f, int fp16)
{
    return fp16 ? half_f32_to_f16(f) : half_f32_to_bf16(f);
}

static inline HALF_HD float half_decode(uint16_t h, int fp16)
{
    return fp16 ? half_f16_to_f32(h) : half_bf16_to_f32(h);
}

/* True when f is neither inf nor NaN (exponent bits not all ones). */
static inline HALF_HD int half_f32_finite(float f)
{
    return (half_f32_bits(f) & 0x7f800000u) != 0x7f800000u;
}

#endif /* COMMON_HALF_H */
