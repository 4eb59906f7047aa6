/* testutil.h - helpers shared by the model and backend tests: a seeded random source, array
 * comparison that prints the first few mismatches, and a central-difference gradient checker.
 */
#ifndef TEST_MODELS_UTIL_H
#define TEST_MODELS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../check.h"
#include "ops.h"

/* xorshift64*: deterministic test inputs. */
typedef struct test_rng {
    uint64_t s;
} test_rng;

static inline double test_uniform(test_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

/* Fills x[0..n) with values uniform in [lo, hi). */
static inline void test_fill(test_rng *r, float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * test_uniform(r));
}

static inline float *test_floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* Poison for outputs that must be overwritten, not read (NaN fails every comparison). */
static inline void test_fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* Counts elements with |got - want| > atol + rtol * |want|, printing the first five.
 * Returns the count; the caller CHECKs it. */
static inline int test_compare(const char *what, const float *got, const float *want, size_t n,
                               double atol, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= atol + rtol * fabs((double)want[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s[%zu]: got %.9g, want %.9g\n", what, i, (double)got[i],
                        (double)want[i]);
            bad++;
        }
    }
    return bad;
}

/* A scalar objective of the current inputs, evaluated in double from the float forward pass. */
typedef double (*test_objective)(void *ctx);

/* Compares analytic[i] with the central difference (f(v+e) - f(v-e)) / (2e) for every step-th
 * element of v (the actual float perturbation is used as e). Returns the mismatch count, printing
 * the first five. */
static inline int test_gradcheck(const char *what, float *v, size_t n, size_t step,
                                 const float *analytic, test_objective f, void *ctx, float eps,
                                 double atol, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i += step) {
        float save = v[i], hi = save + eps, lo = save - eps;
        v[i] = hi;
        double f_hi = f(ctx);
        v[i] = lo;
        double f_lo = f(ctx);
        v[i] = save;
        double num = (f_hi - f_lo) / ((double)hi - (double)lo);
        double d = fabs((double)analytic[i] - num);
        if (!(d <= atol + rtol * fabs(num))) {
            if (bad < 5)
                fprintf(stderr, "%s[%zu]: analytic %.7g, numeric %.7g\n", what, i,
                        (double)analytic[i], num);
            bad++;
        }
    }
    return bad;
}

/* The GPU tests' set-up: a one-rank CUDA context (ddp_init runs without a launcher), its ops
 * handle, and a CPU handle on host memory, the oracle. Returns TEST_SKIP (77) without a usable
 * GPU, 1 when opening failed, 0 on success. test_cuda_close releases all three. */
static inline int test_cuda_open(const char *who, ddp_ctx **ctx, ops_handle **gpu, ops_handle **cpu)
{
    if (ddp_cuda_device_count() == 0) {
        fprintf(stderr, "%s: skipped: no usable GPU\n", who);
        return TEST_SKIP;
    }
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CUDA;
    io.print_table = 0;
    if (ddp_init(&io, ctx) != DDP_OK)
        return 1;
    if (ops_cuda_open(*ctx, false, gpu) != DDP_OK || ops_cpu_open(NULL, 1, false, cpu) != DDP_OK)
        return 1;
    return 0;
}

static inline void test_cuda_close(ddp_ctx *ctx, ops_handle *gpu, ops_handle *cpu)
{
    ops_close(gpu);
    ops_close(cpu);
    ddp_finalize(ctx);
}

#endif /* TEST_MODELS_UTIL_H */
