/* test_optim.c - ddp-train's optimizer (train/optim.h) owns the master weights, on the CPU:
 *   - in bf16 it keeps the fp32 master of its range, initialised from the model's bf16 weights
 *     (checkpoint buffer "params"), and holds 12 bytes per parameter (master and two moments);
 *   - an AdamW step moves that master exactly as an fp32 optimizer moves the same fp32 weights,
 *     and writes the bf16 weights as the rounding of the new master by (seed, step, index)
 *     (cast_stochastic), so the weights are a function of the master and the step;
 *   - optim_round(t) rewrites the weights from the master as step t would (a resume);
 *   - SGD writes its bf16 weights to nearest even (sgd_step_cast);
 *   - in fp32 the master is the model's weights ("params" points at them), 8 bytes a parameter;
 *   - DDP_CLIP_DEVICE=0 passes the clip factor from the host, bit for bit the device's.
 */
#include <string.h>

#include "half.h"
#include "ops.h"
#include "optim.h"
#include "testutil.h"

enum { N0 = 3000, N1 = 1097, N = N0 + N1 }; /* two slices: one decays, one does not */

static const ops_handle *ops;
static const size_t numel[2] = {N0, N1};
static const bool decays[2] = {true, false};

static optim *make(optim_kind kind, void *w, ddp_dtype p)
{
    optim_opts oo = {.kind = kind, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .momentum = 0.9f,
                     .weight_decay = 0.1f, .decays = decays};
    optim_weights ow = {.w = w, .p = p, .seed = 1234};
    optim *o = NULL;
    CHECK(optim_create(NULL, ops, &oo, numel, 2, NULL, &ow, &o) == DDP_OK, "optim_create");
    return o;
}

/* The fp32 master of o ("params", its first checkpoint buffer). */
static float *master_of(optim *o)
{
    const char *names[OPTIM_MAX_BUFS];
    float *bufs[OPTIM_MAX_BUFS];
    int n = optim_buffers(o, names, bufs);
    CHECK(n >= 2 && strcmp(names[0], "params") == 0, "the first buffer is the master, \"params\"");
    return bufs[0];
}

/* Elements of the bf16 weights w that are not `want` rounded stochastically at step t. */
static int not_rounded(const void *w, const float *want, uint32_t t)
{
    size_t es = ops_dtype_size(ops, DDP_BF16);
    void *expect = malloc(N * es);
    CHECK(ops->cast_stochastic(ops, DDP_BF16, expect, want, N, 1234, t, 0) == DDP_OK, "cast");
    int bad = memcmp(expect, w, N * es) != 0;
    free(expect);
    return bad;
}

static void check_adamw_bf16(test_rng *r)
{
    float *init = test_floats(N), *g = test_floats(N), *w32 = test_floats(N);
    test_fill(r, init, N, -0.1, 0.1);
    test_fill(r, g, N, -1.0, 1.0);
    void *w16 = malloc(N * sizeof(float)); /* bf16 bits, or floats where bf16 is emulated */
    memcpy(w32, init, N * sizeof(float));
    CHECK(ops_weights_put(ops, DDP_BF16, w16, w32, N) == DDP_OK, "bf16 weights");
    CHECK(ops_weights_get(ops, DDP_BF16, init, w16, N) == DDP_OK, "widened");
    memcpy(w32, init, N * sizeof(float)); /* the fp32 optimizer starts where the master does */
    optim *o16 = make(OPTIM_ADAMW, w16, DDP_BF16), *o32 = make(OPTIM_ADAMW, w32, DDP_FP32);
    if (!o16 || !o32)
        return;
    float *master = master_of(o16);
    CHECK(memcmp(master, init, N * sizeof(float)) == 0,
          "the master starts as the model's bf16 weights widened");
    CHECK(optim_state_bytes(o16) == 3 * N * sizeof(float) &&
              optim_state_bytes(o32) == 2 * N * sizeof(float),
          "bf16: master and two moments (12 bytes a parameter); fp32: the two moments");
    CHECK(master_of(o32) == w32, "fp32: the master is the model's weights");
    for (int t = 1; t <= 3; t++) {
        CHECK(optim_step(o16, g, 1e-2f, t, 1.0f) == DDP_OK &&
                  optim_step(o32, g, 1e-2f, t, 1.0f) == DDP_OK, "adamw step %d", t);
        CHECK(memcmp(master, w32, N * sizeof(float)) == 0,
              "step %d: the bf16 run's master moves as the fp32 weights do", t);
        CHECK(!not_rounded(w16, master, (uint32_t)t),
              "step %d: the bf16 weights are the master rounded stochastically at step %d", t, t);
    }
    CHECK(optim_round(o16, 7) == DDP_OK && !not_rounded(w16, master, 7),
          "optim_round(7): the weights are the master rounded as step 7 rounds it");
    optim_destroy(o16);
    optim_destroy(o32);
    free(init), free(g), free(w32), free(w16);
}

static void check_sgd_bf16(test_rng *r)
{
    float *host = test_floats(N), *g = test_floats(N), *wide = test_floats(N);
    test_fill(r, host, N, -0.1, 0.1);
    test_fill(r, g, N, -1.0, 1.0);
    void *w16 = malloc(N * sizeof(float));
    CHECK(ops_weights_put(ops, DDP_BF16, w16, host, N) == DDP_OK, "bf16 weights");
    optim *o = make(OPTIM_SGD, w16, DDP_BF16);
    if (!o)
        return;
    CHECK(optim_step(o, g, 0.05f, 1, 1.0f) == DDP_OK, "sgd step");
    float *master = master_of(o);
    CHECK(ops_weights_get(ops, DDP_BF16, wide, w16, N) == DDP_OK, "widened");
    int bad = 0;
    for (size_t i = 0; i < N; i++)
        bad += wide[i] != half_bf16_to_f32(half_f32_to_bf16(master[i]));
    CHECK(bad == 0, "sgd: %d of %d bf16 weights are not the master's nearest even", bad, N);
    CHECK(optim_state_bytes(o) == 2 * N * sizeof(float), "sgd bf16: master and momentum");
    optim_destroy(o);
    free(host), free(g), free(wide), free(w16);
}

/* DDP_CLIP_DEVICE=0 (run 4's path, models/ops/switches.h): the host fetches the norm and passes
 * the clip factor; the weights and the norm bit for bit those of the factor kept where the
 * gradients are (the default), over steps that clip (clip 0.5 under a norm of ~37). */
static void check_clip_switch(test_rng *r)
{
    float *w[2] = {test_floats(N), test_floats(N)}, *g = test_floats(N);
    test_fill(r, w[0], N, -0.1, 0.1);
    memcpy(w[1], w[0], N * sizeof(float));
    optim_opts oo = {.kind = OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                     .weight_decay = 0.1f, .decays = decays, .clip = 0.5};
    optim *o[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        optim_weights ow = {.w = w[i], .p = DDP_FP32, .seed = 1234};
        if (i == 1)
            setenv("DDP_CLIP_DEVICE", "0", 1);
        CHECK(optim_create(NULL, ops, &oo, numel, 2, NULL, &ow, &o[i]) == DDP_OK, "create");
        unsetenv("DDP_CLIP_DEVICE");
    }
    for (long t = 1; t <= 3 && o[0] && o[1]; t++) {
        test_fill(r, g, N, -1.0, 1.0);
        int applied[2] = {0, 0};
        for (int i = 0; i < 2; i++)
            CHECK(optim_update(o[i], g, NULL, 1e-3f, t, &applied[i]) == DDP_OK && applied[i],
                  "update %d", i);
        double n0 = optim_last_norm(o[0]), n1 = optim_last_norm(o[1]);
        CHECK(n0 == n1 && n0 > 1.0, "step %ld: norms %.17g (device path), %.17g (host)", t, n0, n1);
        CHECK(memcmp(w[0], w[1], N * sizeof(float)) == 0, "step %ld: the weights differ", t);
    }
    optim_destroy(o[0]), optim_destroy(o[1]);
    free(w[0]), free(w[1]), free(g);
}

int main(void)
{
    ops_handle *h = NULL;
    CHECK(ops_cpu_open(NULL, 1, false, &h) == DDP_OK, "ops");
    ops = h;
    test_rng r = {99};
    if (h) {
        check_adamw_bf16(&r);
        check_sgd_bf16(&r);
        check_clip_switch(&r);
    }
    ops_close(h);
    return CHECK_DONE();
}
