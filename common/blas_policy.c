/* blas_policy.c - the one OpenBLAS kernel policy, compiled into both ddp-launch and models/ops: the CPU
 * features (cpuid, or a simulated list for tests), the core they call for, and whether a preset
 * OPENBLAS_CORETYPE (the user's choice, always kept) is in force. */
#include "blas_policy.h"

#include <stdio.h>
#include <string.h>

static const char *const feature_names[] = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16"};
#define N_FEATURES (sizeof feature_names / sizeof feature_names[0])

static bool *feature_slot(struct ddp_cpu_features *f, size_t i)
{
    bool *slots[N_FEATURES] = {&f->avx512f, &f->avx512bw, &f->avx512vl, &f->avx512dq, &f->avx512bf16};
    return slots[i];
}

static void features_detect(struct ddp_cpu_features *out)
{
    __builtin_cpu_init();
    out->avx512f = __builtin_cpu_supports("avx512f");
    out->avx512bw = __builtin_cpu_supports("avx512bw");
    out->avx512vl = __builtin_cpu_supports("avx512vl");
    out->avx512dq = __builtin_cpu_supports("avx512dq");
    out->avx512bf16 = __builtin_cpu_supports("avx512bf16");
}

/* Sets the feature named by the LEN characters at WORD; -1 when the name is unknown. */
static int feature_set(struct ddp_cpu_features *f, const char *word, size_t len)
{
    for (size_t i = 0; i < N_FEATURES; i++) {
        if (strlen(feature_names[i]) == len && strncmp(word, feature_names[i], len) == 0) {
            *feature_slot(f, i) = true;
            return 0;
        }
    }
    return -1;
}

int ddp_cpu_features_get(const char *simulate, struct ddp_cpu_features *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!simulate) {
        features_detect(out);
        return 0;
    }
    if (strcmp(simulate, "none") == 0 || simulate[0] == '\0')
        return 0;
    for (const char *p = simulate; *p;) {
        size_t len = strcspn(p, ",");
        if (feature_set(out, p, len) != 0) {
            snprintf(err, errlen, "%s=%s: unknown feature '%.*s'; use a comma-separated list of "
                     "avx512f, avx512bw, avx512vl, avx512dq, avx512bf16, or none",
                     DDP_BLAS_SIMULATE_ENV, simulate, (int)len, p);
            return -1;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

const char *ddp_blas_core_for(const struct ddp_cpu_features *f)
{
    if (!f->avx512f || !f->avx512bw || !f->avx512vl || !f->avx512dq)
        return NULL;
    return f->avx512bf16 ? "Cooperlake" : "SkylakeX";
}

int ddp_blas_decide(const char *coretype, const char *setter, const char *simulate,
                    struct ddp_blas_decision *out, char *err, size_t errlen)
{
    struct ddp_cpu_features f;
    memset(out, 0, sizeof *out);
    if (ddp_cpu_features_get(simulate, &f, err, errlen) != 0)
        return -1;
    out->core = ddp_blas_core_for(&f);
    out->current = coretype;
    out->preset = coretype && !setter ? coretype : NULL;
    out->apply = !coretype && out->core;
    return 0;
}

void ddp_blas_decision_describe(const struct ddp_blas_decision *d, const char *setter, char *out, size_t len)
{
    const char *policy = d->core ? d->core : "OpenBLAS's own choice";
    if (d->preset)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s preset by the user (policy for this CPU: %s)", d->preset, policy);
    else if (d->current && setter)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s set by %s (policy)", d->current, setter);
    else if (d->core)
        snprintf(out, len, "OPENBLAS_CORETYPE=%s (policy)", d->core);
    else
        snprintf(out, len, "OPENBLAS_CORETYPE unset: CPU lacks AVX-512 F/BW/VL/DQ, OpenBLAS chooses");
}
