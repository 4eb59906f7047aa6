/* test_cuda_adamw_cast.c - the CUDA backend's adamw_step_cast and cast_stochastic against the
 * CPU's (the oracle) on the same random inputs. Exits 77 (skipped) without a usable GPU.
 *   - w, m, v after two steps within test_cuda_gpt.c's AdamW tolerances (w 1e-6 + 1e-5 relative,
 *     the moments 1e-7 + 1e-6: nvcc may fuse a multiply and an add that the CPU rounds apart);
 *   - the bf16 copy: where the two fp32 weights are the same bits, the same bits (one rounding
 *     function, math_shared.h, on both); everywhere, the rounding of the GPU's own new weight by
 *     (seed, t, index0 + i), computed on the host; fp16: the GPU cast of its own weight;
 *   - cast_stochastic on the same fp32 input: the CPU's bits exactly;
 *   - a shard stepped at its flat offset: the whole's elements, byte for byte.
 */
#include <string.h>

#include "math_shared.h"
#include "ops.h"
#include "half.h"
#include "testutil.h"

static ops_handle *cpu, *gpu;
static ddp_ctx *ctx;

#define HP 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f /* lr, beta1, beta2, eps, wd */

/* Element i of a copy in precision p as backend o stores it, as the float it holds. */
static float copy_at(const ops_handle *o, const void *wc, ddp_dtype p, size_t i)
{
    if (ops_dtype_size(o, p) == 2)
        return bf16_bits_to_f32(((const uint16_t *)wc)[i]);
    return ((const float *)wc)[i];
}

/* n floats on the device, uploaded from h. */
static float *up(const float *h, size_t n)
{
    float *d = ddp_alloc(gpu->ctx, n * sizeof *d);
    CHECK(d && ddp_upload(gpu->ctx, d, h, n * sizeof *d) == DDP_OK, "upload");
    return d;
}

/* bytes of device memory d, downloaded into a new host buffer. */
static void *down(const void *d, size_t bytes)
{
    void *h = calloc(1, bytes ? bytes : 1);
    CHECK(ddp_download(gpu->ctx, h, d, bytes) == DDP_OK, "download");
    return h;
}

static void check_step(test_rng *r, ddp_dtype p, size_t n, size_t index0)
{
    const uint32_t seed = 31337;
    float *h[4]; /* w, m, v, g on the host: the CPU's */
    double lo[4] = {-1, -0.1, 0, -1}, hi[4] = {1, 0.1, 0.01, 1};
    float *d[4];
    for (int k = 0; k < 4; k++) {
        h[k] = test_floats(n);
        test_fill(r, h[k], n, lo[k], hi[k]);
        d[k] = up(h[k], n);
    }
    size_t ch = ops_dtype_size(cpu, p), cg = ops_dtype_size(gpu, p);
    void *wc_h = calloc(n, ch), *wc_d = ddp_alloc(gpu->ctx, n * cg);
    for (int t = 1; t <= 2; t++) {
        CHECK(cpu->adamw_step_cast(cpu, h[0], h[1], h[2], h[3], n, HP, t, 0.5f, NULL, p, wc_h, seed,
                                   index0) == DDP_OK, "cpu adamw_step_cast");
        CHECK(gpu->adamw_step_cast(gpu, d[0], d[1], d[2], d[3], n, HP, t, 0.5f, NULL, p, wc_d, seed,
                                   index0) == DDP_OK, "cuda adamw_step_cast");
    }
    float *w = down(d[0], n * sizeof(float)), *m = down(d[1], n * sizeof(float));
    float *v = down(d[2], n * sizeof(float));
    void *wc = down(wc_d, n * cg);
    CHECK(test_compare("w", w, h[0], n, 1e-6, 1e-5) == 0, "p %d: w", (int)p);
    CHECK(test_compare("m", m, h[1], n, 1e-7, 1e-6) == 0, "p %d: m", (int)p);
    CHECK(test_compare("v", v, h[2], n, 1e-7, 1e-6) == 0, "p %d: v", (int)p);
    float *fp16 = NULL;
    if (p == DDP_FP16) { /* the GPU's nearest even of its own weights */
        float *tmp = ddp_alloc(gpu->ctx, n * sizeof *tmp);
        CHECK(gpu->cast(gpu, DDP_FP16, tmp, DDP_FP32, d[0], n) == DDP_OK, "cast");
        fp16 = down(tmp, n * sizeof *tmp);
        ddp_free(gpu->ctx, tmp);
    }
    int same_w = 0, bad_same = 0, bad_own = 0;
    uint64_t key = sr_key(seed, 2);
    for (size_t i = 0; p != DDP_FP32 && i < n; i++) {
        float got = copy_at(gpu, wc, p, i), cpu_got = copy_at(cpu, wc_h, p, i);
        float own = p == DDP_BF16 ? bf16_bits_to_f32(bf16_round_stochastic(w[i], key, index0 + i))
                                  : fp16[i];
        if (memcmp(&w[i], &h[0][i], sizeof(float)) == 0) {
            same_w++;
            if (memcmp(&got, &cpu_got, sizeof got) != 0 && bad_same++ < 5)
                fprintf(stderr, "p %d: wc[%zu] %.9g, cpu %.9g (same w)\n", (int)p, i,
                        (double)got, (double)cpu_got);
        }
        if (memcmp(&got, &own, sizeof got) != 0 && bad_own++ < 5)
            fprintf(stderr, "p %d: wc[%zu] %.9g, its w rounds to %.9g\n", (int)p, i, (double)got,
                    (double)own);
    }
    if (p != DDP_FP32)
        printf("p %d: %d of %zu fp32 weights the same bits on both\n", (int)p, same_w, n);
    CHECK(bad_same == 0, "p %d: %d copy elements differ where w is the same", (int)p, bad_same);
    CHECK(bad_own == 0, "p %d: %d copy elements are not the rounding of the GPU's w", (int)p,
          bad_own);
    free(fp16), free(w), free(m), free(v), free(wc), free(wc_h);
    ddp_free(gpu->ctx, wc_d);
    for (int k = 0; k < 4; k++)
        free(h[k]), ddp_free(gpu->ctx, d[k]);
}

/* cast_stochastic on the same input: the CPU's bits; and a shard's adamw_step_cast at its offset
 * against the whole's, on the GPU. */
static void check_cast_and_shards(test_rng *r, size_t n, size_t k)
{
    const uint32_t seed = 5, step = 17;
    float *x = test_floats(n);
    test_fill(r, x, n, -3, 3);
    float *xd = up(x, n);
    size_t ch = ops_dtype_size(cpu, DDP_BF16), cg = ops_dtype_size(gpu, DDP_BF16);
    void *yh = calloc(n, ch), *yd = ddp_alloc(gpu->ctx, n * cg);
    CHECK(cpu->cast_stochastic(cpu, DDP_BF16, yh, x, n, seed, step, 1000) == DDP_OK, "cpu cast");
    CHECK(gpu->cast_stochastic(gpu, DDP_BF16, yd, xd, n, seed, step, 1000) == DDP_OK, "cuda cast");
    void *y = down(yd, n * cg);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float a = copy_at(gpu, y, DDP_BF16, i), b = copy_at(cpu, yh, DDP_BF16, i);
        bad += memcmp(&a, &b, sizeof a) != 0;
    }
    CHECK(bad == 0, "cast_stochastic: %d of %zu differ from the CPU's", bad, n);
    free(y), free(yh);

    /* the whole at index 0 into yd; the shards [0, k), [k, n) at their offsets into zd */
    float *st[2][4];
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 4; b++)
            st[s][b] = up(x, n); /* w, m, v, g all from x: m, v >= 0 needs v = |x| */
    float *absx = test_floats(n);
    for (size_t i = 0; i < n; i++)
        absx[i] = x[i] < 0 ? -x[i] : x[i];
    for (int s = 0; s < 2; s++)
        CHECK(ddp_upload(gpu->ctx, st[s][2], absx, n * sizeof(float)) == DDP_OK, "upload v");
    void *zd = ddp_alloc(gpu->ctx, n * cg);
    CHECK(gpu->adamw_step_cast(gpu, st[0][0], st[0][1], st[0][2], st[0][3], n, HP, 4, 1.0f,
                               NULL, DDP_BF16, yd, seed, 0) == DDP_OK, "whole");
    size_t cut[3] = {0, k, n};
    for (int s = 0; s < 2; s++) {
        size_t a = cut[s], len = cut[s + 1] - a;
        CHECK(gpu->adamw_step_cast(gpu, st[1][0] + a, st[1][1] + a, st[1][2] + a, st[1][3] + a, len,
                                   HP, 4, 1.0f, NULL, DDP_BF16, (char *)zd + a * cg, seed,
                                   a) == DDP_OK,
              "shard");
    }
    void *wy = down(yd, n * cg), *wz = down(zd, n * cg);
    CHECK(memcmp(wy, wz, n * cg) == 0, "cuda: the shards' copy is the whole's byte for byte");
    free(wy), free(wz), free(absx), free(x);
    for (int s = 0; s < 2; s++)
        for (int b = 0; b < 4; b++)
            ddp_free(gpu->ctx, st[s][b]);
    ddp_free(gpu->ctx, xd), ddp_free(gpu->ctx, yd), ddp_free(gpu->ctx, zd);
}

/* sgd_step_cast in bf16 (the MNIST models' step in 16 bits, one pass): the weights and momentum
 * of the GPU's own sgd_step bit for bit, and the bf16 weights their nearest even. */
static void check_sgd(test_rng *r, size_t n)
{
    float *h[3]; /* w, m, g */
    float *d[2][3];
    for (int k = 0; k < 3; k++) {
        h[k] = test_floats(n);
        test_fill(r, h[k], n, -1, 1);
        d[0][k] = up(h[k], n);
        d[1][k] = up(h[k], n);
    }
    uint16_t *wc_d = ddp_alloc(gpu->ctx, n * sizeof *wc_d);
    CHECK(gpu->sgd_step_cast(gpu, d[0][0], d[0][1], d[0][2], n, 0.1f, 0.9f, 0.01f, DDP_BF16,
                             wc_d) == DDP_OK, "cuda sgd_step_cast");
    CHECK(gpu->sgd_step(gpu, d[1][0], d[1][1], d[1][2], n, 0.1f, 0.9f, 0.01f) == DDP_OK,
          "cuda sgd_step");
    float *w = down(d[0][0], n * sizeof(float)), *m = down(d[0][1], n * sizeof(float));
    float *w1 = down(d[1][0], n * sizeof(float)), *m1 = down(d[1][1], n * sizeof(float));
    uint16_t *wc = down(wc_d, n * sizeof *wc_d);
    CHECK(memcmp(w, w1, n * sizeof *w) == 0 && memcmp(m, m1, n * sizeof *m) == 0,
          "sgd_step_cast: weights and momentum of sgd_step");
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += wc[i] != half_f32_to_bf16(w[i]);
    CHECK(bad == 0, "sgd_step_cast: %zu of %zu bf16 weights are not the nearest even", bad, n);
    for (int k = 0; k < 3; k++) {
        free(h[k]);
        ddp_free(gpu->ctx, d[0][k]);
        ddp_free(gpu->ctx, d[1][k]);
    }
    ddp_free(gpu->ctx, wc_d);
    free(w), free(m), free(w1), free(m1), free(wc);
}

int main(void)
{
    int rc = test_cuda_open("test_cuda_adamw_cast", &ctx, &gpu, &cpu);
    if (rc != 0)
        return rc;
    test_rng r = {2718};
    CHECK(gpu->adamw_step_cast && gpu->cast_stochastic && cpu->adamw_step_cast &&
              cpu->cast_stochastic, "both backends have adamw_step_cast and cast_stochastic");
    if (gpu->adamw_step_cast && cpu->adamw_step_cast) {
        for (int p = 0; p < 3; p++) {
            ddp_dtype d = p == 0 ? DDP_FP32 : p == 1 ? DDP_BF16 : DDP_FP16;
            if (d == DDP_BF16 && !gpu->supports(gpu, DDP_BF16, NULL))
                continue;
            check_step(&r, d, 50001, 0);
            check_step(&r, d, 4097, 987654321);
        }
    }
    if (gpu->cast_stochastic && cpu->cast_stochastic && gpu->supports(gpu, DDP_BF16, NULL))
        check_cast_and_shards(&r, 30011, 12345);
    CHECK(gpu->sgd_step_cast != NULL, "the CUDA backend has sgd_step_cast");
    if (gpu->sgd_step_cast && gpu->supports(gpu, DDP_BF16, NULL))
        check_sgd(&r, 20011);
    test_cuda_close(ctx, gpu, cpu);
    return CHECK_DONE();
}
