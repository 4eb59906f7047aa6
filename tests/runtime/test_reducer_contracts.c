/* test_reducer_contracts.c - each ddp_reducer_* call outside the zero stages it is valid for
 * (ddp.h's table beside ddp_reducer) is refused under real mpirun: the documented status (or
 * NULL), exactly one logged error naming the call and the reducer's stage, and nothing changed:
 * a sync step after the refusals still averages exactly. The calls valid for a stage are
 * accepted without a word.
 *
 * Rank r writes grad[i] = r + i (i: index in the flat buffer), so the mean over W ranks is
 * exactly i + (W - 1) / 2: stage 0 has it everywhere, stage 1 in its shard of the gradient
 * buffer, stage 2 in ddp_reducer_shard_grads.
 */
#include <stdio.h>
#include <string.h>

#include "capture.h"
#include "check.h"

#define N_PARAMS 4
#define TOTAL 128

static const size_t numel[N_PARAMS] = {5, 70, 3, 50};
static size_t offset[N_PARAMS + 1];

/* ---- the log ------------------------------------------------------------------------------ */

static capture cap;
static char log_text[8192];

static void capture_stop(void)
{
    capture_end(&cap, log_text, sizeof log_text);
}

/* The captured log is exactly one line that names `who` and `what`. */
static void expect_one_error(const char *who, const char *what, const char *call)
{
    const char *nl = strchr(log_text, '\n');
    CHECK(nl && nl[1] == '\0' && strstr(log_text, who) && strstr(log_text, what),
          "%s: want one logged error naming %s and \"%s\"; the log says: %s", call, who, what,
          log_text);
}

static void expect_silent(const char *call)
{
    CHECK(log_text[0] == '\0', "%s: a valid call logged: %s", call, log_text);
}

/* ---- reducers and their steps --------------------------------------------------------------- */

static void small_caps(ddp_reducer_opts *o, int stage)
{
    ddp_reducer_opts_default(o);
    o->first_bucket_mb = 64.0 / (1024.0 * 1024.0);
    o->bucket_mb = 256.0 / (1024.0 * 1024.0);
    o->zero_stage = stage;
}

/* Stage 0 or 1 over grads, or stage 2 bucket-owned (grads NULL; collective). */
static ddp_reducer *make(ddp_ctx *ctx, void *grads, int stage)
{
    ddp_reducer_opts o;
    small_caps(&o, stage);
    ddp_reducer *r = NULL;
    ddp_status st = ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r);
    CHECK(st == DDP_OK && r, "create (zero_stage %d): %s", stage, ddp_strerror(st));
    return r;
}

/* Parameter p's contribution, rank + i, into dst (backend memory). */
static void put(ddp_ctx *ctx, void *dst, int p)
{
    float v[TOTAL];
    for (size_t i = 0; i < numel[p]; i++)
        v[i] = (float)ddp_rank(ctx) + (float)(offset[p] + i);
    ddp_upload(ctx, dst, v, numel[p] * sizeof(float));
}

/* The averaged shard (stage 0: everything) against i + (W - 1) / 2, exact. */
static void check_mean(ddp_ctx *ctx, ddp_reducer *r, const void *grads, int stage)
{
    size_t off = 0, n = 0;
    float got[TOTAL];
    ddp_reducer_shard(r, &off, &n);
    if (n == 0)
        return;
    const void *src = stage == 2 ? ddp_reducer_shard_grads(r) : (const float *)grads + off;
    ddp_download(ctx, got, src, n * sizeof(float));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += got[i] != (float)(off + i) + (float)(ddp_world_size(ctx) - 1) / 2.0f;
    CHECK(bad == 0, "zero_stage %d: %d of %zu shard elements are not the mean", stage, bad, n);
}

/* One sync step: every parameter written (stage 2 where grad_ptr says) and marked. */
static void sync_step(ddp_ctx *ctx, ddp_reducer *r, void *grads, int stage)
{
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin (zero_stage %d)", stage);
    for (int p = N_PARAMS - 1; p >= 0; p--) {
        void *dst = NULL;
        if (stage == 2)
            CHECK(ddp_reducer_grad_ptr(r, p, &dst) == DDP_OK && dst, "grad_ptr(%d)", p);
        else
            dst = (float *)grads + offset[p];
        if (dst)
            put(ctx, dst, p);
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d (zero_stage %d)", p, stage);
    }
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish (zero_stage %d)", stage);
    check_mean(ctx, r, grads, stage);
}

/* ---- the refusals --------------------------------------------------------------------------- */

/* Stages 0 and 1: grad_ptr inside a micro-step and shard_grads refused; the step then goes on. */
static void test_gradient_buffer_stage(ddp_ctx *ctx, ddp_reducer *r, float *grads, int stage)
{
    char stage_words[32];
    snprintf(stage_words, sizeof stage_words, "zero_stage %d", stage);
    void *ptr = grads;
    CHECK(ddp_reducer_begin(r, 1) == DDP_OK, "begin");
    capture_begin(&cap);
    ddp_status st = ddp_reducer_grad_ptr(r, 1, &ptr);
    capture_stop();
    CHECK(st == DDP_ERR_STATE && !ptr, "grad_ptr with zero_stage %d: \"%s\", want \"%s\"", stage,
          ddp_strerror(st), ddp_strerror(DDP_ERR_STATE));
    expect_one_error("ddp_reducer_grad_ptr", stage_words, "grad_ptr");
    for (int p = N_PARAMS - 1; p >= 0; p--) { /* the refused call left the step as it was */
        put(ctx, grads + offset[p], p);
        CHECK(ddp_reducer_mark_ready(r, p) == DDP_OK, "mark %d after the refusal", p);
    }
    CHECK(ddp_reducer_finish(r) == DDP_OK, "finish after the refusal (zero_stage %d)", stage);
    check_mean(ctx, r, grads, stage);
    capture_begin(&cap);
    void *shard = ddp_reducer_shard_grads(r);
    capture_stop();
    CHECK(!shard, "shard_grads with zero_stage %d is not NULL", stage);
    expect_one_error("ddp_reducer_shard_grads", stage_words, "shard_grads");
}

/* Stage 0: the three gathers refused (gather_wait with nothing under way too). */
static void test_gathers_unsharded(ddp_reducer *r, float *params)
{
    const char *who[] = {"ddp_reducer_gather_start", "ddp_reducer_gather_params",
                         "ddp_reducer_gather_wait", "ddp_reducer_gather_wait"};
    for (int c = 0; c < 4; c++) {
        capture_begin(&cap);
        ddp_status st = c == 0   ? ddp_reducer_gather_start(r, params, DDP_FP32)
                        : c == 1 ? ddp_reducer_gather_params(r, params, DDP_FP32)
                                 : ddp_reducer_gather_wait(r, c == 2 ? -1 : 0);
        capture_stop();
        CHECK(st == DDP_ERR_STATE, "%s with zero_stage 0: \"%s\", want \"%s\"", who[c],
              ddp_strerror(st), ddp_strerror(DDP_ERR_STATE));
        expect_one_error(who[c], "zero_stage 0", who[c]);
    }
}

/* Options for bucket-owned gradients only, given with a gradient buffer: refused by create. */
static void test_owned_options(ddp_ctx *ctx, float *grads)
{
    static const int order[N_PARAMS] = {3, 2, 1, 0};
    for (int stage = 0; stage < 2; stage++) {
        for (int opt = 0; opt < 2; opt++) {
            ddp_reducer_opts o;
            small_caps(&o, stage);
            o.local_accum = opt == 0;
            o.ready_order = opt == 1 ? order : NULL;
            ddp_reducer *r = (ddp_reducer *)&o; /* not NULL: create must reset it */
            capture_begin(&cap);
            ddp_status st = ddp_reducer_create(ctx, grads, numel, N_PARAMS, &o, &r);
            capture_stop();
            const char *name = opt == 0 ? "local_accum" : "ready_order";
            CHECK(st == DDP_ERR_INVALID_ARG && !r, "%s with a gradient buffer (zero_stage %d): "
                  "\"%s\"", name, stage, ddp_strerror(st));
            expect_one_error("ddp_reducer_create", name, name);
            if (st == DDP_OK) /* wrongly accepted */
                ddp_reducer_destroy(r);
        }
    }
}

/* Stages 1 and 2 take the gathers; stage 2 its own calls: accepted, nothing logged. */
static void test_valid_calls(ddp_reducer *sharded, ddp_reducer *owned, float *params)
{
    capture_begin(&cap);
    ddp_status wait = ddp_reducer_gather_wait(sharded, -1);
    ddp_status gather = ddp_reducer_gather_params(owned, params, DDP_FP32);
    void *shard = ddp_reducer_shard_grads(owned);
    capture_stop();
    CHECK(wait == DDP_OK && gather == DDP_OK && shard, "valid calls refused: gather_wait \"%s\", "
          "gather_params \"%s\", shard_grads %p", ddp_strerror(wait), ddp_strerror(gather), shard);
    expect_silent("gather_wait (zero_stage 1), gather_params and shard_grads (zero_stage 2)");
}

int main(int argc, char **argv)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(argc, argv, "test_reducer_contracts", CHECK_GPU_ONE, &ctx);
    if (rc != 0)
        return rc;
    for (int p = 0; p < N_PARAMS; p++)
        offset[p + 1] = offset[p] + numel[p];
    CHECK(offset[N_PARAMS] == TOTAL, "layout of %zu elements", offset[N_PARAMS]);
    float *grads[2] = {ddp_alloc(ctx, TOTAL * sizeof(float)),
                       ddp_alloc(ctx, TOTAL * sizeof(float))};
    float *params = ddp_alloc(ctx, TOTAL * sizeof(float));
    ddp_reducer *r[3] = {make(ctx, grads[0], 0), make(ctx, grads[1], 1), make(ctx, NULL, 2)};
    if (grads[0] && grads[1] && params && r[0] && r[1] && r[2]) {
        test_gradient_buffer_stage(ctx, r[0], grads[0], 0);
        test_gradient_buffer_stage(ctx, r[1], grads[1], 1);
        test_gathers_unsharded(r[0], params);
        test_owned_options(ctx, grads[0]);
        sync_step(ctx, r[2], NULL, 2);
        test_valid_calls(r[1], r[2], params);
        for (int s = 0; s < 3; s++) /* after the refusals, every stage still averages exactly */
            sync_step(ctx, r[s], s < 2 ? grads[s] : NULL, s);
    }
    for (int s = 0; s < 3; s++)
        ddp_reducer_destroy(r[s]);
    ddp_free(ctx, grads[0]);
    ddp_free(ctx, grads[1]);
    ddp_free(ctx, params);
    int failed = CHECK_DONE();
    ddp_finalize(ctx);
    return failed;
}
