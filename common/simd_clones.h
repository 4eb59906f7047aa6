/* simd_clones.h - DDP_SIMD_CLONES: compile a hot element-wise loop three times, for AVX-512
 * (x86-64-v4), AVX2 (x86-64-v3) and the baseline (SSE2), the one to run chosen once by the
 * dynamic loader for the CPU at hand (GCC and Clang `target_clones`, an ifunc). The project is
 * built for the baseline, where libddp's host casts and 16-bit all-reduce sums run 4 floats at a
 * time: measured on an AVX-512 EPYC, 401,408 elements (the MLP's first layer),
 * fp32 -> bf16 137 us baseline, 58 us AVX2, 32 us AVX-512; the bf16 sum 240 / 115 / 45 us.
 *
 * Results do not depend on the clone: the loops are element-wise (no reassociated sums) and C
 * code is compiled with -ffp-contract=off (meson.build), so no clone fuses a multiply and an add.
 * Host code only (not for nvcc); elsewhere than x86-64, or with -DDDP_NO_SIMD_CLONES (to measure
 * the baseline: meson setup -Dc_args=-DDDP_NO_SIMD_CLONES), the macro is empty.
 */
#ifndef DDP_SIMD_CLONES_H
#define DDP_SIMD_CLONES_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(DDP_NO_SIMD_CLONES)
#define DDP_SIMD_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DDP_SIMD_CLONES
#endif

#endif
