/* test_scaler.c - the loss scaler's GradScaler semantics under real mpirun, where only ONE rank
 * (the last) sees inf/NaN in its gradients.
 *
 * Growth interval 3, scale 1024, gradients 8 * scale on every rank (finite). Schedule:
 * steps 0-2 finite (scale doubles after step 2), step 3 the last rank alone has +inf, step 4 it
 * has NaN (both skipped on EVERY rank, scale halves each time, gradients untouched), steps 5-7
 * finite again (grows after 3). On finite steps the gradients come back unscaled (exactly 8:
 * scales are powers of two). Also: the defaults are GradScaler's, the state round-trips, bad
 * options and states are refused. Every gradient type (fp32, bf16, fp16) is run.
 * Gradients are staged through host memory, so `--backend cuda` runs the same checks on device
 * memory (the inf/NaN kernel); it exits 77 where there is no GPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "half.h"

#define N 37

static void fill(void *g, ddp_dtype t, float v, int poison)
{
    for (int i = 0; i < N; i++) {
        float x = poison && i == N / 2 ? (poison == 1 ? INFINITY : NAN) : v;
        if (t == DDP_FP32)
            ((float *)g)[i] = x;
        else
            ((uint16_t *)g)[i] = half_encode(x, t == DDP_FP16);
    }
}

static float get(const void *g, ddp_dtype t, int i)
{
    return t == DDP_FP32 ? ((const float *)g)[i] : half_decode(((const uint16_t *)g)[i], t == DDP_FP16);
}

static void run_schedule(ddp_ctx *ctx, ddp_dtype t)
{
    static const double want_scale[8] = {1024, 1024, 2048, 1024, 512, 512, 512, 1024}; /* after */
    int last = ddp_rank(ctx) == ddp_world_size(ctx) - 1;
    ddp_scaler_opts o;
    ddp_scaler_opts_default(&o);
    o.init_scale = 1024;
    o.growth_interval = 3;
    ddp_scaler *s = NULL;
    CHECK(ddp_scaler_create(ctx, &o, &s) == DDP_OK, "create");
    uint16_t g[2 * N];
    void *dev = ddp_alloc(ctx, sizeof g);
    for (int step = 0; s && dev && step < 8; step++) {
        int poison = last && step == 3 ? 1 : last && step == 4 ? 2 : 0;
        float scaled = (float)(8.0 * ddp_scaler_scale(s));
        fill(g, t, scaled, poison);
        ddp_upload(ctx, dev, g, sizeof g);
        int ok = -1;
        CHECK(ddp_scaler_unscale_update(s, dev, t, N, &ok) == DDP_OK, "%s step %d", ddp_dtype_name(t), step);
        ddp_download(ctx, g, dev, sizeof g);
        int want_ok = step != 3 && step != 4;
        CHECK(ok == want_ok, "%s step %d: step_ok %d on rank %d, want %d", ddp_dtype_name(t), step,
              ok, ddp_rank(ctx), want_ok);
        CHECK(ddp_scaler_scale(s) == want_scale[step], "%s step %d: scale %g, want %g",
              ddp_dtype_name(t), step, ddp_scaler_scale(s), want_scale[step]);
        float want_g = want_ok ? 8.0f : scaled; /* skipped steps leave the gradients as they were */
        CHECK(get(g, t, 0) == want_g && get(g, t, N - 1) == want_g, "%s step %d: grad %g, want %g",
              ddp_dtype_name(t), step, get(g, t, 0), want_g);
    }
    CHECK(ddp_scaler_skipped_steps(s) == 2, "skipped %lld", (long long)ddp_scaler_skipped_steps(s));
    double scale = 0;
    int64_t tracker = -1;
    CHECK(ddp_scaler_get_state(s, &scale, &tracker) == DDP_OK && scale == 1024 && tracker == 0,
          "state %g %lld", scale, (long long)tracker);
    CHECK(ddp_scaler_set_state(s, 256, 2) == DDP_OK, "set_state");
    CHECK(ddp_scaler_get_state(s, &scale, &tracker) == DDP_OK && scale == 256 && tracker == 2,
          "state after set %g %lld", scale, (long long)tracker);
    CHECK(ddp_scaler_set_state(s, 256, 3) == DDP_ERR_INVALID_ARG, "tracker == interval accepted");
    CHECK(ddp_scaler_set_state(s, INFINITY, 0) == DDP_ERR_INVALID_ARG, "inf scale accepted");
    CHECK(ddp_scaler_set_state(s, 0, 0) == DDP_ERR_INVALID_ARG, "zero scale accepted");
    ddp_scaler_destroy(s);
    ddp_free(ctx, dev);
}

static void check_options(ddp_ctx *ctx)
{
    ddp_scaler_opts o;
    ddp_scaler_opts_default(&o);
    CHECK(o.init_scale == 65536 && o.growth_factor == 2 && o.backoff_factor == 0.5 &&
              o.growth_interval == 2000, "defaults are not GradScaler's");
    ddp_scaler *s = NULL;
    CHECK(ddp_scaler_create(ctx, NULL, &s) == DDP_OK && ddp_scaler_scale(s) == 65536, "NULL opts");
    ddp_scaler_destroy(s);
    ddp_scaler_destroy(NULL);
    o.backoff_factor = 1.0;
    s = (ddp_scaler *)&o;
    CHECK(ddp_scaler_create(ctx, &o, &s) == DDP_ERR_INVALID_ARG && !s, "backoff 1 accepted");
    ddp_scaler_opts_default(&o);
    o.growth_interval = 0;
    CHECK(ddp_scaler_create(ctx, &o, &s) == DDP_ERR_INVALID_ARG, "interval 0 accepted");
}

int main(int argc, char **argv)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    if (argc == 3 && strcmp(argv[1], "--backend") == 0 && ddp_backend_parse(argv[2], &io.backend) != DDP_OK)
        return 2;
    if (io.backend == DDP_BACKEND_CUDA && ddp_cuda_device_count() == 0)
        return TEST_SKIP;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    check_options(ctx);
    run_schedule(ctx, DDP_FP32);
    run_schedule(ctx, DDP_BF16);
    run_schedule(ctx, DDP_FP16);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
