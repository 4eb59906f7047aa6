/* blas.c - OpenBLAS kernel selection (re-exec with OPENBLAS_CORETYPE on AVX-512 CPUs that the
 * library does not recognise) and a one-line description of the BLAS in use.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ops.h"

/* OpenBLAS core names whose kernels use AVX-512. */
static int ddp_core_is_avx512(const char *core)
{
    static const char *const fast[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++) {
        if (core && strcasecmp(core, fast[i]) == 0)
            return 1;
    }
    return 0;
}

/* The AVX-512 core this CPU can run, or NULL when it lacks the SkylakeX instruction set
 * (F, BW, VL, DQ). Cooperlake adds the BF16 kernels. */
static const char *ddp_cpu_avx512_core(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
        return NULL;
    return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
}

void ddp_blas_prefer_fast_kernels(char **argv)
{
    const char *skip = getenv("DDP_NO_BLAS_REEXEC");
    if (getenv("OPENBLAS_CORETYPE") || (skip && strcmp(skip, "1") == 0) || !argv || !argv[0])
        return;
    const char *want = ddp_cpu_avx512_core();
    const char *have = openblas_get_corename();
    if (!want || ddp_core_is_avx512(have))
        return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0) {
        DDP_WARN("cannot set OPENBLAS_CORETYPE=%s; keeping OpenBLAS core %s", want, have);
        return;
    }
    DDP_DEBUG("OpenBLAS chose core %s on an AVX-512 CPU; re-executing with OPENBLAS_CORETYPE=%s",
              have, want);
    execv("/proc/self/exe", argv);
    DDP_WARN("re-exec with OPENBLAS_CORETYPE=%s failed; keeping OpenBLAS core %s", want, have);
}

const char *ddp_blas_describe(void)
{
    static char text[512];
    const char *config = openblas_get_config();
    const char *core = openblas_get_corename();
    snprintf(text, sizeof text, "%s core=%s threads=%d", config ? config : "OpenBLAS",
             core ? core : "unknown", openblas_get_num_threads());
    return text;
}
