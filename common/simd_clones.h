/* simd_clones.h - SIMD_DISPATCH: a hot element-wise loop compiled three times, for AVX-512
 * (x86-64-v4's vector features), AVX2 (x86-64-v3's) and the baseline (SSE2), the one to run chosen
 * at each call by the CPU's level as DDP_CPU_ISA caps it (common/cpu_isa.h), so a capped run takes
 * the loops a lesser CPU takes. The project is built for the baseline, where libddp's host casts and
 * 16-bit all-reduce sums run 4 floats at a time: measured on an AVX-512 EPYC, 401,408 elements (the
 * MLP's first layer), fp32 -> bf16 137 us baseline, 58 us AVX2, 32 us AVX-512; the bf16 sum 240 /
 * 115 / 45 us.
 *
 * Usage: the loop as a `SIMD_BODY static void NAME_body(PARAMS)`, then
 * `SIMD_DISPATCH(NAME, NAME_body, (PARAMS), (ARGS))` defines `static void NAME(PARAMS)`. The
 * body is inlined into a function compiled for each target, so the compiler vectorises it for each.
 *
 * Results do not depend on the variant: the loops are element-wise (no reassociated sums) and C
 * code is compiled with -ffp-contract=off (meson.build), so no variant fuses a multiply and an add.
 * Host code only (not for nvcc); elsewhere than x86-64, or with -DDDP_NO_SIMD_CLONES (to measure
 * the baseline: meson setup -Dc_args=-DDDP_NO_SIMD_CLONES), NAME just calls the body.
 */
#ifndef COMMON_SIMD_CLONES_H
#define COMMON_SIMD_CLONES_H

#define SIMD_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(DDP_NO_SIMD_CLONES)
#include "cpu_isa.h"

#define SIMD_TARGET_AVX2 "avx2,fma,f16c,bmi,bmi2,lzcnt,movbe"
#define SIMD_DISPATCH(name, body, params, args)                                               \
    __attribute__((target(SIMD_TARGET_AVX2 ",avx512f,avx512bw,avx512vl,avx512dq"))) static void \
        name##_avx512 params { body args; }                                                      \
    __attribute__((target(SIMD_TARGET_AVX2))) static void name##_avx2 params { body args; }    \
    static void name params                                                                       \
    {                                                                                             \
        isa_level level_ = cpu_features_level(cpu_effective());                                 \
        if (level_ >= CPU_ISA_AVX512)                                                             \
            name##_avx512 args;                                                                   \
        else if (level_ == CPU_ISA_AVX2)                                                          \
            name##_avx2 args;                                                                     \
        else                                                                                      \
            body args;                                                                            \
    }
#else
#define SIMD_DISPATCH(name, body, params, args) \
    static void name params { body args; }
#endif

#endif
