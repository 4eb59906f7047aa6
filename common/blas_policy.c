/* blas_policy.c - the one OpenBLAS kernel policy, compiled into both ddp-launch and models/ops: the CPU
 * features (cpuid, or a simulated list for tests) capped by DDP_CPU_ISA, the core they call for, and
 * whether a preset OPENBLAS_CORETYPE (the user's choice, kept unless a cap overrides it) is in force. */
#include "blas_policy.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const feature_names[] = {"avx2",     "fma",      "f16c",       "avx512f", "avx512bw",
                                            "avx512vl", "avx512dq", "avx512bf16", "amx_bf16"};
#define N_FEATURES (sizeof feature_names / sizeof feature_names[0])

static bool *feature_slot(struct cpu_features *f, size_t i)
{
    bool *slots[N_FEATURES] = {&f->avx2,     &f->fma,      &f->f16c,       &f->avx512f, &f->avx512bw,
                               &f->avx512vl, &f->avx512dq, &f->avx512bf16, &f->amx_bf16};
    return slots[i];
}

/* Sets the feature named by the LEN characters at WORD; -1 when the name is unknown. */
static int feature_set(struct cpu_features *f, const char *word, size_t len)
{
    for (size_t i = 0; i < N_FEATURES; i++) {
        if (strlen(feature_names[i]) == len && strncmp(word, feature_names[i], len) == 0) {
            *feature_slot(f, i) = true;
            return 0;
        }
    }
    return -1;
}

static int features_simulate(const char *simulate, struct cpu_features *out, char *err, size_t errlen)
{
    if (strcmp(simulate, "none") == 0 || simulate[0] == '\0')
        return 0;
    for (const char *p = simulate; *p;) {
        size_t len = strcspn(p, ",");
        if (feature_set(out, p, len) != 0) {
            snprintf(err, errlen, "%s=%s: unknown feature '%.*s'; use a comma-separated list of "
                     "avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512bf16, amx_bf16, or none",
                     BLAS_SIMULATE_ENV, simulate, (int)len, p);
            return -1;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

int cpu_features_get(const char *simulate, const char *isa, struct cpu_features *out, char *err,
                     size_t errlen)
{
    isa_level cap;
    memset(out, 0, sizeof *out);
    if (isa_parse(isa, &cap, err, errlen) != 0)
        return -1;
    if (!simulate)
        cpu_features_detect(out);
    else if (features_simulate(simulate, out, err, errlen) != 0)
        return -1;
    cpu_features_cap(out, cap);
    return 0;
}

const char *blas_core_for(const struct cpu_features *f, bool capped)
{
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq)
        return f->avx512bf16 ? "Cooperlake" : "SkylakeX";
    if (!capped)
        return NULL;
    return f->avx2 && f->fma ? "Haswell" : "Prescott";
}

/* The level an OpenBLAS core's kernels need: AVX-512 cores, AVX and AVX2 cores (counted as avx2),
 * and the rest (SSE-era cores and names this table does not know: baseline). */
static isa_level core_level(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx[] = {"Haswell", "Zen", "Sandybridge", "Bulldozer", "Piledriver", "Steamroller",
                                      "Excavator"};
    for (size_t i = 0; i < sizeof avx512 / sizeof avx512[0]; i++)
        if (strcasecmp(core, avx512[i]) == 0)
            return CPU_ISA_AVX512;
    for (size_t i = 0; i < sizeof avx / sizeof avx[0]; i++)
        if (strcasecmp(core, avx[i]) == 0)
            return CPU_ISA_AVX2;
    return CPU_ISA_BASELINE;
}

int blas_policy_decide(const char *coretype, const char *setter, const char *simulate, const char *isa,
                       struct blas_decision *out, char *err, size_t errlen)
{
    struct cpu_features raw, f;
    memset(out, 0, sizeof *out);
    if (cpu_features_get(simulate, NULL, &raw, err, errlen) != 0 ||
        cpu_features_get(simulate, isa, &f, err, errlen) != 0)
        return -1;
    bool capped = cpu_features_level(&f) < cpu_features_level(&raw);
    out->core = blas_core_for(&f, capped);
    out->current = coretype;
    out->preset = coretype && !setter ? coretype : NULL;
    out->cap = capped ? isa : NULL;
    bool above_cap = coretype && capped && core_level(coretype) > cpu_features_level(&f);
    out->apply = out->core && (!coretype || above_cap);
    return 0;
}

void blas_decision_describe(const struct blas_decision *d, const char *setter, char *out, size_t len)
{
    const char *policy = d->core ? d->core : "OpenBLAS's own choice";
    if (d->cap && d->preset && d->apply)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s for DDP_CPU_ISA=%s (replaces the preset %s)", d->core, d->cap,
                 d->preset);
    else if (d->preset)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s preset by the user (policy for this CPU: %s)", d->preset, policy);
    else if (d->current && setter)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s set by %s (policy%s%s)", d->current, setter,
                 d->cap ? ", DDP_CPU_ISA=" : "", d->cap ? d->cap : "");
    else if (d->core)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s (policy%s%s)", d->core, d->cap ? ", DDP_CPU_ISA=" : "",
                 d->cap ? d->cap : "");
    else
        snprintf(out, len, "OPENBLAS_CORETYPE unset: CPU lacks AVX-512 F/BW/VL/DQ, OpenBLAS chooses");
}
