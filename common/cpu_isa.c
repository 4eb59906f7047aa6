/* cpu_isa.c - the CPU's features from cpuid, the DDP_CPU_ISA cap applied to them, and the cap handed
 * to oneDNN (see cpu_isa.h). */
#include "cpu_isa.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const level_names[] = {"baseline", "avx2", "avx512", "native"};

/* cpuid leaf 7 (sub-leaf 0) EDX bit 22: AMX-BF16. clang's and older GCCs' __builtin_cpu_supports
 * do not all know "f16c" or "amx-bf16", so both come from cpuid. */
static bool cpuid_bit(unsigned leaf, unsigned sub, int reg, unsigned bit)
{
    unsigned r[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]))
        return false;
    return (r[reg] >> bit) & 1u;
}

void cpu_features_detect(struct cpu_features *out)
{
    __builtin_cpu_init();
    memset(out, 0, sizeof *out);
    out->avx2 = __builtin_cpu_supports("avx2");
    out->fma = __builtin_cpu_supports("fma");
    out->f16c = __builtin_cpu_supports("avx") && cpuid_bit(1, 0, 2, 29); /* ECX.F16C */
    out->avx512f = __builtin_cpu_supports("avx512f");
    out->avx512bw = __builtin_cpu_supports("avx512bw");
    out->avx512vl = __builtin_cpu_supports("avx512vl");
    out->avx512dq = __builtin_cpu_supports("avx512dq");
    out->avx512bf16 = __builtin_cpu_supports("avx512bf16");
    out->amx_bf16 = out->avx512f && cpuid_bit(7, 0, 3, 22); /* EDX.AMX-BF16 */
}

void cpu_features_cap(struct cpu_features *f, isa_level cap)
{
    if (cap < CPU_ISA_NATIVE)
        f->avx512bf16 = f->amx_bf16 = false;
    if (cap < CPU_ISA_AVX512)
        f->avx512f = f->avx512bw = f->avx512vl = f->avx512dq = false;
    if (cap < CPU_ISA_AVX2)
        f->avx2 = f->fma = f->f16c = false;
}

isa_level cpu_features_level(const struct cpu_features *f)
{
    if (!f->avx2 || !f->fma || !f->f16c)
        return CPU_ISA_BASELINE;
    if (!f->avx512f || !f->avx512bw || !f->avx512vl || !f->avx512dq)
        return CPU_ISA_AVX2;
    return f->avx512bf16 || f->amx_bf16 ? CPU_ISA_NATIVE : CPU_ISA_AVX512;
}

int isa_parse(const char *value, isa_level *out, char *err, size_t errlen)
{
    *out = CPU_ISA_NATIVE;
    if (!value || !value[0])
        return 0;
    for (int i = CPU_ISA_BASELINE; i <= CPU_ISA_NATIVE; i++) {
        if (strcmp(value, level_names[i]) == 0) {
            *out = (isa_level)i;
            return 0;
        }
    }
    snprintf(err, errlen, "%s='%s' is not a CPU level: use baseline, avx2, avx512 or native (or unset it)",
             CPU_ISA_ENV, value);
    return -1;
}

const char *isa_name(isa_level level)
{
    return level >= CPU_ISA_BASELINE && level <= CPU_ISA_NATIVE ? level_names[level] : "?";
}

/* The process's view, filled once (libddp's MPI progress thread may ask first). */
static struct {
    isa_level cap, cpu_level;
    struct cpu_features raw, eff;
} g_isa;
static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;

static void isa_fill(void)
{
    char err[160];
    if (isa_parse(getenv(CPU_ISA_ENV), &g_isa.cap, err, sizeof err) != 0)
        g_isa.cap = CPU_ISA_NATIVE;
    cpu_features_detect(&g_isa.raw);
    g_isa.cpu_level = cpu_features_level(&g_isa.raw);
    g_isa.eff = g_isa.raw;
    cpu_features_cap(&g_isa.eff, g_isa.cap);
}

static void isa_init(void)
{
    pthread_once(&g_isa_once, isa_fill);
}

const struct cpu_features *cpu_effective(void)
{
    isa_init();
    return &g_isa.eff;
}

bool cpu_bf16_native(void)
{
    return cpu_effective()->avx512bf16; /* every CPU with AMX-BF16 has it too; ddp's own casts need it */
}

int cpu_isa_check(char *err, size_t errlen)
{
    isa_level cap;
    return isa_parse(getenv(CPU_ISA_ENV), &cap, err, errlen);
}

const char *cpu_isa_describe(void)
{
    static char text[256];
    const struct cpu_features *f = cpu_effective();
    isa_level level = cpu_features_level(f);
    const char *vec = level >= CPU_ISA_AVX512 ? "AVX-512 F/BW/VL/DQ"
                      : level == CPU_ISA_AVX2 ? "AVX2, FMA, F16C" : "SSE2";
    const char *bf16 = f->amx_bf16 ? "bf16 native (AVX512_BF16, AMX)" : f->avx512bf16 ? "bf16 native (AVX512_BF16)"
                                                                                   : "bf16 emulated";
    int n = snprintf(text, sizeof text, "%s (%s, %s)", isa_name(level), vec, bf16);
    if (level < g_isa.cpu_level && n > 0 && (size_t)n < sizeof text)
        snprintf(text + n, sizeof text - (size_t)n, ", capped by %s=%s (CPU: %s)", CPU_ISA_ENV,
                 isa_name(g_isa.cap), isa_name(g_isa.cpu_level));
    return text;
}

const char *cpu_model_name(void)
{
    static char name[49];
    unsigned r[12];
    if (name[0])
        return name;
    for (unsigned i = 0; i < 3; i++)
        if (!__get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]))
            return strcpy(name, "unknown CPU");
    memcpy(name, r, 48);
    name[48] = '\0';
    size_t start = strspn(name, " "), len = strlen(name);
    while (len > start && name[len - 1] == ' ')
        name[--len] = '\0';
    memmove(name, name + start, len - start + 1);
    return name[0] ? name : strcpy(name, "unknown CPU");
}

void cpu_isa_export(void)
{
    /* oneDNN's names (its "CPU dispatcher control"); it has no level below SSE4.1, where it runs
     * reference code, so the baseline cap is SSE41. */
    static const char *const onednn[] = {"SSE41", "AVX2", "AVX512_CORE"};
    static bool done;
    isa_init();
    if (done || g_isa.cap >= g_isa.cpu_level)
        return;
    done = true;
    setenv("ONEDNN_MAX_CPU_ISA", onednn[g_isa.cap], 1);
}
