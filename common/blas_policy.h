/* blas_policy.h - the one OpenBLAS kernel policy of ddp: which OPENBLAS_CORETYPE a CPU gets. The
 * same source (common/blas_policy.c) is compiled into ddp-launch and models/ops, so the core the
 * launcher exports and the core the library re-executes with cannot differ.
 *
 * Failure convention: functions returning int return 0 on success and -1 on failure, after
 * writing a one-line message that names the problem and the fix into err[errlen]. */
#ifndef COMMON_BLAS_POLICY_H
#define COMMON_BLAS_POLICY_H

#include <stdbool.h>
#include <stddef.h>

#include "cpu_isa.h"

/* Names the variable set next to OPENBLAS_CORETYPE by whoever applied the policy ("ddp-launch" or
 * "models/ops"); OPENBLAS_CORETYPE without it is the user's preset. */
#define BLAS_SETTER_ENV "DDP_OPENBLAS_CORETYPE_BY"
/* Testing aid: a comma-separated feature list replacing the CPU's own, e.g.
 * "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16", or "none". Only the kernel policy
 * reads it (nothing runs on simulated features). */
#define BLAS_SIMULATE_ENV "DDP_SIMULATE_CPU_FEATURES"

/* The CPU's features, or those SIMULATE lists (NULL: the real CPU), capped by the DDP_CPU_ISA value
 * isa (NULL: no cap). Fails on a word that names no feature the policy knows, or a bad isa. */
int cpu_features_get(const char *simulate, const char *isa, struct cpu_features *out, char *err,
                     size_t errlen);

/* The OpenBLAS core for these features: "Cooperlake" (AVX-512 F, BW, VL, DQ and BF16), "SkylakeX"
 * (F, BW, VL, DQ), or NULL (leave the choice to OpenBLAS). When capped (a DDP_CPU_ISA cap removed
 * features), a CPU left without AVX-512 gets "Haswell" (AVX2 kernels) where it keeps AVX2 and
 * "Prescott" (SSE3 kernels, OpenBLAS's lowest x86-64 core) otherwise, so OpenBLAS's own choice
 * (made on the real CPU) cannot exceed the cap. */
const char *blas_core_for(const struct cpu_features *f, bool capped);

/* What a process should do about OPENBLAS_CORETYPE. */
struct blas_decision {
    const char *preset; /* the user's OPENBLAS_CORETYPE (kept as given unless capped), or NULL */
    const char *core;   /* the policy's core for this CPU (NULL: OpenBLAS's own choice) */
    const char *current; /* OPENBLAS_CORETYPE as found (preset or set by ddp), or NULL */
    const char *cap;    /* the DDP_CPU_ISA level that capped the CPU's features, or NULL */
    bool apply;         /* true: set OPENBLAS_CORETYPE=core (unset, or a preset above the cap) */
};

/* Decides from the values of OPENBLAS_CORETYPE, BLAS_SETTER_ENV, BLAS_SIMULATE_ENV and
 * DDP_CPU_ISA (each NULL when unset). An OPENBLAS_CORETYPE already set is kept: one set by ddp
 * (ddp-launch before models/ops) is the policy already applied, any other is the user's preset,
 * except that a DDP_CPU_ISA cap replaces a preset whose kernels need more than the cap allows (an
 * AVX-512 core under avx2, an AVX or AVX2 core under baseline): the cap is the explicit choice of
 * what may run. Fails on a bad simulated feature list
 * or DDP_CPU_ISA value. */
int blas_policy_decide(const char *coretype, const char *setter, const char *simulate, const char *isa,
                       struct blas_decision *out, char *err, size_t errlen);

/* One line for start-up reports, e.g. "OPENBLAS_CORETYPE=Haswell preset by the user (policy for this
 * CPU: Cooperlake)" or "OPENBLAS_CORETYPE=SkylakeX set by ddp-launch (policy)". */
void blas_decision_describe(const struct blas_decision *d, const char *setter, char *out, size_t len);

#endif
