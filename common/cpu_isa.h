/* cpu_isa.h - what this x86-64 CPU can run, and the one switch that caps what ddp dispatches:
 * DDP_CPU_ISA=baseline|avx2|avx512|native. Compiled into ddp-launch and the models' programs (like
 * blas_policy.c), so both see the same CPU.
 *
 * A cap hides the features above it from every decision ddp takes: its own feature checks (bf16
 * computed natively or emulated, F16C conversions), the OpenBLAS core policy (blas_policy.c) and what
 * it passes to oneDNN (ONEDNN_MAX_CPU_ISA). So an AVX-512 machine runs the code paths of an AVX2 or
 * a baseline one; a cap above what the CPU has changes nothing (an AVX2 machine cannot run the
 * AVX-512 paths). Levels:
 *   baseline  x86-64 (SSE2): no AVX2, no F16C, no AVX-512, bf16 emulated
 *   avx2      x86-64-v3's vector part (AVX2, FMA, F16C): bf16 emulated
 *   avx512    x86-64-v4 (AVX-512 F, BW, VL, DQ), no AVX512_BF16/AMX: bf16 emulated
 *   native    no cap (the default): what the CPU has
 *
 * Failure convention (as blas_policy.h): functions returning int return 0 on success and -1 on
 * failure, after writing a one-line message that names the problem and the fix into err[errlen]. */
#ifndef COMMON_CPU_ISA_H
#define COMMON_CPU_ISA_H

#include <stdbool.h>
#include <stddef.h>

#define CPU_ISA_ENV "DDP_CPU_ISA"

typedef enum isa_level {
    CPU_ISA_BASELINE = 0,
    CPU_ISA_AVX2,
    CPU_ISA_AVX512,
    CPU_ISA_NATIVE
} isa_level;

/* The CPU features ddp's decisions look at. */
struct cpu_features {
    bool avx2, fma, f16c;                           /* x86-64-v3's vector features */
    bool avx512f, avx512bw, avx512vl, avx512dq;     /* x86-64-v4 */
    bool avx512bf16, amx_bf16;                      /* bf16 arithmetic */
};

/* The features of the CPU at hand (cpuid), uncapped. */
void cpu_features_detect(struct cpu_features *out);
/* Clears in f every feature above the level cap. */
void cpu_features_cap(struct cpu_features *f, isa_level cap);
/* The highest level whose features f has all of (native when f has bf16 arithmetic too). */
isa_level cpu_features_level(const struct cpu_features *f);

/* Parses a DDP_CPU_ISA value; NULL or "" mean native. Fails on any other word. */
int isa_parse(const char *value, isa_level *out, char *err, size_t errlen);
/* "baseline", "avx2", "avx512" or "native". */
const char *isa_name(isa_level level);

/* The process's effective features: the CPU's, capped by DDP_CPU_ISA (read once; an invalid value
 * caps nothing here: programs refuse it first with cpu_isa_check). */
const struct cpu_features *cpu_effective(void);
/* Whether this process computes bf16 natively (AVX512_BF16, which every AMX CPU has too, not
 * capped away). */
bool cpu_bf16_native(void);
/* Checks DDP_CPU_ISA; fails on a value that is not a level. */
int cpu_isa_check(char *err, size_t errlen);
/* The level in effect and whether a cap lowered it, for start-up reports and benchmark tables, e.g.
 * "avx512 (AVX-512 F/BW/VL/DQ, bf16 emulated), capped by DDP_CPU_ISA=avx512 (CPU: native)". */
const char *cpu_isa_describe(void);
/* The CPU's brand string from cpuid ("AMD EPYC 9R14 96-Core Processor"), trimmed; "unknown CPU"
 * where cpuid has none. */
const char *cpu_model_name(void);
/* When DDP_CPU_ISA caps this CPU, sets ONEDNN_MAX_CPU_ISA to the cap's oneDNN name (overriding a
 * preset) so oneDNN dispatches no higher. Call before oneDNN creates its first primitive; later calls
 * do nothing. */
void cpu_isa_export(void);

#endif
