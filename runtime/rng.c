/* rng.c - seeded parameter initialisation from Philox-4x32-10 (Random123, counter based).
 *
 * Stream layout: key = the 64-bit seed (low word first); counter = (block low, block high,
 * param_index, 0), where block = element / 4. One Philox call gives four 32-bit words, word w of
 * block b belongs to element 4 * b + w, so element e depends only on (seed, param_index, e):
 * the same value whatever the buffer size, chunking, thread count, rank or backend.
 * Uniforms keep the top 24 bits of a word (float's mantissa precision); normals use Box-Muller on
 * the word pairs (0, 1) and (2, 3) of a block, computed in double and rounded once to float.
 */
#include <math.h>

#include <Random123/philox.h>

#include "internal.h"

#define DDP_RNG_U24_SCALE (1.0 / 16777216.0) /* 2^-24 */

static philox4x32_ctr_t rng_block(uint64_t seed, uint32_t param_index, uint64_t block)
{
    philox4x32_ctr_t ctr = {{(uint32_t)block, (uint32_t)(block >> 32), param_index, 0}};
    philox4x32_key_t key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    return philox4x32(ctr, key);
}

/* [0, 1) in steps of 2^-24. */
static double u01_closed_open(uint32_t w)
{
    return (double)(w >> 8) * DDP_RNG_U24_SCALE;
}

/* (0, 1] in steps of 2^-24: safe for log(). */
static double u01_open_closed(uint32_t w)
{
    return (double)((w >> 8) + 1u) * DDP_RNG_U24_SCALE;
}

void ddp_init_uniform(float *x, size_t n, uint64_t seed, uint32_t param_index, float lo, float hi)
{
    const double width = (double)hi - (double)lo;
    for (size_t e = 0; e < n; e += 4) {
        philox4x32_ctr_t r = rng_block(seed, param_index, (uint64_t)(e / 4));
        for (size_t w = 0; w < 4 && e + w < n; w++) {
            float v = (float)((double)lo + width * u01_closed_open(r.v[w]));
            /* rounding to float may land on hi; keep the interval half-open */
            x[e + w] = (v >= hi && hi > lo) ? nextafterf(hi, lo) : v;
        }
    }
}

/* Box-Muller: two uniforms give two independent standard normals. */
static void box_muller(uint32_t a, uint32_t b, double out[2])
{
    const double two_pi = 6.283185307179586476925286766559;
    double radius = sqrt(-2.0 * log(u01_open_closed(a)));
    double angle = two_pi * u01_closed_open(b);
    out[0] = radius * cos(angle);
    out[1] = radius * sin(angle);
}

void ddp_init_normal(float *x, size_t n, uint64_t seed, uint32_t param_index, float std)
{
    for (size_t e = 0; e < n; e += 4) {
        philox4x32_ctr_t r = rng_block(seed, param_index, (uint64_t)(e / 4));
        double z[4];
        box_muller(r.v[0], r.v[1], z);
        box_muller(r.v[2], r.v[3], z + 2);
        for (size_t w = 0; w < 4 && e + w < n; w++)
            x[e + w] = (float)(z[w] * (double)std);
    }
}
