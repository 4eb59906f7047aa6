/* gemm_peak.c - ddp-gemm-peak: the single-core fp32 GEMM peak of this CPU, the yardstick of the
 * GPT benchmark's "model FLOPs per second against the GEMM peak" (benchmarks/gpt_cpu.sh).
 *
 * Runs OpenBLAS's cblas_sgemm on one thread (OPENBLAS_NUM_THREADS=1 is set before the library
 * starts its threads: run it with the same environment as the training) for square sizes and the
 * GPT-2 124M shapes (B*T = 256 rows against 768 x 2304 and 768 x 3072 weights), best of REPS per
 * shape, and prints one line per shape and a last "peak" line: the best GFLOP/s seen. Kernel
 * selection follows ddp's policy (ops_blas_prefer_fast_kernels, the same core as ddp-train).
 * Usage: ddp-gemm-peak [REPS (5)]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cblas.h>

#include "ops.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GFLOP/s of C(m,n) = A(m,k) B(k,n)^T over reps calls (after one warm-up call). */
static double gemm_gflops(int m, int n, int k, int reps)
{
    float *a = malloc((size_t)m * k * sizeof *a), *b = malloc((size_t)n * k * sizeof *b);
    float *c = malloc((size_t)m * n * sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return 0.0;
    }
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)n * k; i++)
        b[i] = (float)(i % 7) * 0.02f;
    double best = 0.0;
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        double gf = 2.0 * m * n * k / (now_s() - t0) / 1e9;
        if (r > 0 && gf > best)
            best = gf;
    }
    free(a), free(b), free(c);
    return best;
}

int main(int argc, char **argv)
{
    if (ops_blas_prefer_fast_kernels(argv) != 0)
        return 2;
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) {
        fprintf(stderr, "ddp-gemm-peak: REPS must be a positive integer, got '%s'\n", argv[1]);
        return 2;
    }
    ops_cpu_set_threads(1);
    static const int shapes[][3] = {{512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048},
                                    {256, 2304, 768}, {256, 3072, 768}, {256, 768, 3072}};
    double peak = 0.0;
    printf("%s\n", ops_blas_describe());
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double gf = gemm_gflops(shapes[i][0], shapes[i][1], shapes[i][2], reps);
        printf("sgemm %5d x %5d x %5d: %7.1f GFLOP/s\n", shapes[i][0], shapes[i][1], shapes[i][2], gf);
        peak = gf > peak ? gf : peak;
    }
    printf("peak %.1f GFLOP/s (one thread, fp32)\n", peak);
    return 0;
}
