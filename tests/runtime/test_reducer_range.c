/* test_reducer_range.c - 16-bit all-reduces must not overflow where the mean fits: under real
 * mpirun (8 and 3 ranks) every rank's fp16 gradients are about 40000, so their SUM (at least
 * 80000) is beyond fp16's largest finite value 65504 while their MEAN is not.
 *
 * Rank r fills grad[i] = s_i * (40000 + 32 r) with s_i = +1 for even i, -1 for odd i (exact in
 * fp16: multiples of 32 between 32768 and 65504); the mean over W ranks is
 * s_i * (40000 + 16 (W - 1)). Summing first gives inf; dividing before the sum (the reducer's
 * 16-bit wire) gives the mean within fp16 rounding: the pre-division by a power of two is exact,
 * then W - 1 pairwise sums and the final division each round by at most half a unit in the last
 * place (2^-11 relative), so the tolerance is (W + 1) * 2^-11 relative.
 * Cases: fp16 gradients (fp16 on the wire), fp32 gradients with an fp16 wire, and the latter
 * accumulated over 2 micro-steps (the local sum, 2 x 40000, does not fit fp16 either).
 */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ddp.h"
#include "half.h"

#define N_PARAMS 3
static const size_t numel[N_PARAMS] = {5, 300, 11};
#define N_TOTAL 316

static float contribution(int rank, size_t i)
{
    return (i % 2 ? -1.0f : 1.0f) * (40000.0f + 32.0f * (float)rank);
}

static void store(void *buf, ddp_dtype t, size_t i, float v)
{
    if (t == DDP_FP32)
        ((float *)buf)[i] = v;
    else
        ((uint16_t *)buf)[i] = half_encode(v, 1);
}

static float load(const void *buf, ddp_dtype t, size_t i)
{
    return t == DDP_FP32 ? ((const float *)buf)[i] : half_decode(((const uint16_t *)buf)[i], 1);
}

/* One micro-step: this rank's contribution added to grads (zero before the first), marked in
 * reverse order. */
static void micro_step(ddp_ctx *ctx, ddp_reducer *r, void *grads, ddp_dtype gt, int sync, int first)
{
    CHECK(ddp_reducer_begin(r, sync) == DDP_OK, "begin");
    for (size_t i = 0; i < N_TOTAL; i++)
        store(grads, gt, i, (first ? 0.0f : load(grads, gt, i)) + contribution(ddp_rank(ctx), i));
    for (int p = N_PARAMS - 1; p >= 0; p--)
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d", p);
}

static void check_case(ddp_ctx *ctx, ddp_dtype gt, int micro_steps)
{
    ddp_reducer_opts o;
    ddp_reducer_opts_default(&o);
    o.first_bucket_mb = 64.0 / (1024 * 1024); /* several buckets */
    o.grad_dtype = gt;
    o.comm_dtype = DDP_FP16;
    void *grads = calloc(N_TOTAL, ddp_dtype_size(gt));
    ddp_reducer *r = NULL;
    CHECK(grads && ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r) == DDP_OK,
          "create %s", ddp_dtype_name(gt));
    if (!r || !grads) {
        free(grads);
        return;
    }
    for (int m = 0; m < micro_steps; m++)
        micro_step(ctx, r, grads, gt, m == micro_steps - 1, m == 0);
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish");
    int w = ddp_world_size(ctx), shown = 0;
    double rtol = (w + 1) * 0x1p-11;
    for (size_t i = 0; i < N_TOTAL && shown < 5; i++) {
        double want = (i % 2 ? -1.0 : 1.0) * (40000.0 + 16.0 * (w - 1)), got = load(grads, gt, i);
        if (!(fabs(got - want) <= rtol * fabs(want))) {
            CHECK(0, "grad %s, fp16 wire, %d micro-step(s), %d ranks: mean[%zu] = %.9g, want %.9g "
                  "(rtol %g)", ddp_dtype_name(gt), micro_steps, w, i, got, want, rtol);
            shown++;
        }
    }
    ddp_reducer_destroy(r);
    free(grads);
}

int main(void)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    CHECK(ddp_world_size(ctx) >= 2, "run with 2 ranks or more: one rank's 40000 fits fp16");
    check_case(ctx, DDP_FP16, 1);
    check_case(ctx, DDP_FP32, 1);
    check_case(ctx, DDP_FP32, 2);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
