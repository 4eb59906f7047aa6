/* test_blas_kernels.c - the CPU backend's sgemm on training shapes, under whichever OpenBLAS core
 * it is asked for (meson runs it with the argument SkylakeX, Prescott and none), against a naive
 * double-precision GEMM; and ops_blas_describe() names the core asked for.
 *
 * Usage: test_blas_kernels [CORE]. With CORE the test re-executes itself with OPENBLAS_CORETYPE=CORE
 * (OpenBLAS reads it when it loads), after asking the CPU, as DDP_CPU_ISA caps it, for the features
 * CORE's kernels need: an AVX-512 core on a CPU without AVX-512 F/BW/VL/DQ exits 77 (skipped),
 * naming what is missing, instead of dying of SIGILL.
 *
 * Tolerance: per element |c - ref| <= 1e-5 * S, S = sum_p |a_ip b_pj| (plus 1e-7). Float
 * accumulation over k terms is bounded by k * 6e-8 * S in the worst case (4.7e-5 * S at k = 784)
 * and behaves like sqrt(k) * 6e-8 * S (1.7e-6 * S) in practice; a wrong kernel, transpose or
 * stride misses by O(S).
 *
 * main() then calls ops_blas_prefer_fast_kernels(argv) as programs do: in the entry without a core
 * on an AVX-512 CPU the BLAS in use must then be an AVX-512 core (re-executed if OpenBLAS chose a
 * slower one); the entries with a core must keep what they asked for.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cpu_isa.h"
#include "ops.h"
#include "testutil.h"

static int gemm_mismatches(bool ta, bool tb, int m, int n, int k, const float *a, const float *b,
                           const float *c)
{
    int bad = 0;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0.0, mag = 0.0;
            for (int p = 0; p < k; p++) {
                double t = (double)(ta ? a[(size_t)p * m + i] : a[(size_t)i * k + p]) *
                           (double)(tb ? b[(size_t)j * k + p] : b[(size_t)p * n + j]);
                s += t;
                mag += fabs(t);
            }
            double got = c[(size_t)i * n + j];
            if (!(fabs(got - s) <= 1e-7 + 1e-5 * mag)) {
                if (bad < 5)
                    fprintf(stderr, "c[%d,%d] = %.9g, want %.9g (S = %g)\n", i, j, got, s, mag);
                bad++;
            }
        }
    }
    return bad;
}

static void check_shape(const ops_handle *cpu, test_rng *r, bool ta, bool tb, int m, int n, int k)
{
    float *a = test_floats((size_t)m * k), *b = test_floats((size_t)k * n);
    float *c = test_floats((size_t)m * n);
    test_fill(r, a, (size_t)m * k, -1, 1), test_fill(r, b, (size_t)k * n, -1, 1);
    CHECK(cpu->gemm(cpu, ta, tb, m, n, k, 1.0f, a, b, 0.0f, c) == DDP_OK, "gemm");
    int bad = gemm_mismatches(ta, tb, m, n, k, a, b, c);
    CHECK(bad == 0, "%d mismatches in %dx%dx%d trans_a=%d trans_b=%d", bad, m, n, k, ta, tb);
    free(a), free(b), free(c);
}

/* Case-insensitive search of needle in hay. */
static int contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

/* Whether the CPU, as DDP_CPU_ISA caps it, runs OpenBLAS's AVX-512 (SkylakeX) kernels. */
static int cpu_has_avx512(void)
{
    return cpu_features_level(cpu_effective()) >= CPU_ISA_AVX512;
}

/* Runs this program again with OPENBLAS_CORETYPE=core, or exits 77 when the CPU lacks what the
 * core's kernels need (only the AVX-512 cores need more than any x86-64 CPU has). */
static void reexec_with_core(const char *core, char **argv)
{
    const char *have = getenv("OPENBLAS_CORETYPE");
    if (have && strcasecmp(have, core) == 0)
        return;
    bool avx512 = strcasecmp(core, "SkylakeX") == 0 || strcasecmp(core, "Cooperlake") == 0;
    if (avx512 && !cpu_has_avx512()) {
        printf("skipped: OpenBLAS core %s needs AVX-512 F/BW/VL/DQ; this CPU runs %s\n", core,
               cpu_isa_describe());
        exit(77);
    }
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);
    perror("test_blas_kernels: re-exec");
    exit(1);
}

static void check_describe(void)
{
    const char *d = ops_blas_describe();
    const char *want = getenv("OPENBLAS_CORETYPE");
    fprintf(stderr, "%s\n", d);
    CHECK(strstr(d, "OpenBLAS") != NULL, "describe names the library: %s", d);
    if (want) {
        char core[64];
        snprintf(core, sizeof core, "core=%s", want);
        CHECK(contains_nocase(d, core), "describe reports %s: %s", core, d);
    } else if (cpu_has_avx512()) {
        CHECK(contains_nocase(d, "core=SkylakeX") || contains_nocase(d, "core=Cooperlake") ||
                  contains_nocase(d, "core=SapphireRapids"),
              "AVX-512 CPU but a slow core after ops_blas_prefer_fast_kernels: %s", d);
    }
    CHECK(strstr(d, "threads=1") != NULL, "OPENBLAS_NUM_THREADS=1 is reported: %s", d);
    ops_cpu_set_threads(2);
    CHECK(strstr(ops_blas_describe(), "threads=2") != NULL, "set_threads(2): %s", ops_blas_describe());
    ops_cpu_set_threads(0);
    CHECK(strstr(ops_blas_describe(), "threads=1") != NULL, "set_threads(0) means 1: %s", ops_blas_describe());
}

int main(int argc, char **argv)
{
    if (argc > 1)
        reexec_with_core(argv[1], argv);
    ops_blas_prefer_fast_kernels(argv);
    ops_handle *cpu = NULL;
    if (ops_cpu_open(NULL, 1, false, &cpu) != DDP_OK)
        return 1;
    test_rng r = {777};
    check_describe();
    check_shape(cpu, &r, false, true, 64, 512, 784);  /* forward: x W^T */
    check_shape(cpu, &r, true, false, 512, 784, 64);  /* weight gradient: dy^T x */
    check_shape(cpu, &r, false, false, 64, 784, 512); /* input gradient: dy W */
    check_shape(cpu, &r, true, true, 65, 129, 255);   /* odd sizes, both transposed */
    check_shape(cpu, &r, false, false, 20, 196, 500); /* conv2 forward per image */
    ops_close(cpu);
    return CHECK_DONE();
}
