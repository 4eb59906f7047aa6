/* test_gpt2_sample.c - text generation (gpt2_sample.h): the draw's distribution at a temperature
 * (against the closed form), greedy and top-k restrictions, and generation from a tiny GPT-2 on
 * the CPU ops: the prompt kept, only real vocabulary ids drawn, the same seed the same text, the
 * context window sliding past the model's positions, a greedy run equal to argmax step by step,
 * passes padded to the window (a GPU's default) drawing the same tokens over one shape.
 */
#include <math.h>
#include <string.h>

#include "gpt2_sample.h"
#include "testutil.h"

enum { N_DRAWS = 40000 };

/* Draw frequencies of logits {0, ln 3}: p(1) = 3^(1/t) / (1 + 3^(1/t)) at temperature t. */
static void check_temperature(void)
{
    const float logits[2] = {0.0f, logf(3.0f)};
    float scratch[2];
    const float temps[] = {1.0f, 0.5f, 2.0f};
    for (size_t k = 0; k < sizeof temps / sizeof temps[0]; k++) {
        uint64_t rng = 7;
        int ones = 0;
        for (int i = 0; i < N_DRAWS; i++)
            ones += gpt2_sample_draw(logits, 2, temps[k], 0, &rng, scratch);
        double want = pow(3.0, 1.0 / temps[k]) / (1.0 + pow(3.0, 1.0 / temps[k]));
        double got = (double)ones / N_DRAWS; /* 4 standard deviations: < 0.01 */
        CHECK(fabs(got - want) < 4.0 * sqrt(want * (1 - want) / N_DRAWS),
              "temperature %g: p(1) %.4f, want %.4f", temps[k], got, want);
    }
}

/* Greedy takes the argmax; top-k 1 too at any temperature; top-k 3 never leaves the three
 * largest, and reaches each of them. */
static void check_restrictions(void)
{
    float logits[10], scratch[10];
    for (int i = 0; i < 10; i++)
        logits[i] = (float)((i * 7) % 10) * 0.1f; /* largest at i = 7 (0.9), then 4, 1 */
    uint64_t rng = 3;
    int seen[10] = {0}, stray = 0;
    for (int i = 0; i < 2000; i++) {
        CHECK(gpt2_sample_draw(logits, 10, 0.0f, 0, &rng, scratch) == 7, "greedy: the argmax");
        CHECK(gpt2_sample_draw(logits, 10, 5.0f, 1, &rng, scratch) == 7, "top-k 1: the argmax");
        int d = gpt2_sample_draw(logits, 10, 5.0f, 3, &rng, scratch);
        seen[d]++;
        stray += d != 7 && d != 4 && d != 1;
    }
    CHECK(stray == 0, "top-k 3: %d draws outside the three largest", stray);
    CHECK(seen[7] && seen[4] && seen[1], "top-k 3: each of the three drawn (%d %d %d)", seen[7],
          seen[4], seen[1]);
}

/* The sequence lengths the attention saw (test_attention_fwd wraps the CPU's). */
static int n_passes, min_T, max_T;
static ddp_status (*cpu_attention_fwd)(const ops_handle *, ddp_dtype, ddp_dtype, void *, float *,
                                       const void *, int, int, int, int);

static ddp_status test_attention_fwd(const ops_handle *o, ddp_dtype p, ddp_dtype act, void *out,
                                     float *att, const void *qkv, int B, int T, int C, int NH)
{
    n_passes++;
    min_T = T < min_T ? T : min_T;
    max_T = T > max_T ? T : max_T;
    return cpu_attention_fwd(o, p, act, out, att, qkv, B, T, C, NH);
}

/* Padded passes (o->pad 1, a GPU's default): every forward over the whole window, so cuDNN would
 * plan one shape, and the same greedy tokens as passes over the real tokens (causal attention:
 * the padding after the last real row does not reach it); the CPU's default pads nothing. */
static void check_padding(ddp_ctx *ctx, const ops_handle *ops)
{
    enum { T = 8, V = 50, N = 12 };
    ops_handle wrapped = *ops;
    cpu_attention_fwd = ops->attention_fwd;
    wrapped.attention_fwd = test_attention_fwd;
    gpt2_config cfg = {.max_seq = T, .vocab = V, .layers = 2, .heads = 2, .channels = 32};
    gpt2_opts o = {.max_batch = 1, .seq = T, .precision = DDP_FP32, .seed = 6};
    gpt2 *g = NULL;
    CHECK(gpt2_create(ctx, &wrapped, &cfg, &o, &g) == DDP_OK, "create (wrapped attention)");
    int *dev = ddp_alloc(ctx, T * sizeof(int));
    int a[2 + N] = {4, 9}, b[2 + N] = {4, 9}, c[2 + N] = {4, 9};
    const int pads[3] = {1, -1, 0};
    int *outs[3] = {a, b, c};
    for (int k = 0; g && dev && k < 3; k++) {
        gpt2_sample_opts so = {.n_tokens = N, .temperature = 0.0f, .seed = 1, .pad = pads[k]};
        n_passes = 0, min_T = 1 << 30, max_T = 0;
        CHECK(gpt2_sample(g, ctx, outs[k], 2, T, &so, dev) == DDP_OK, "sample, pad %d", pads[k]);
        bool whole = min_T == T && max_T == T, grows = min_T == 2 && max_T == T;
        CHECK(n_passes == 2 * N && (pads[k] > 0 ? whole : grows), "pad %d: %d passes over T %d..%d "
              "(%d layers x %d tokens)", pads[k], n_passes, min_T, max_T, 2, N);
    }
    CHECK(!memcmp(a, b, sizeof a), "padded passes draw the same greedy tokens");
    CHECK(!memcmp(b, c, sizeof b), "the CPU's default: no padding, the same tokens");
    ddp_free(ctx, dev);
    gpt2_destroy(g);
}

static void check_generation(void)
{
    enum { T = 8, V = 50, N = 20 };
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    ops_handle *ops = NULL;
    gpt2 *g = NULL;
    CHECK(ddp_init(&io, &ctx) == DDP_OK && ops_cpu_open(ctx, 1, false, &ops) == DDP_OK, "init");
    gpt2_config cfg = {.max_seq = T, .vocab = V, .layers = 2, .heads = 2, .channels = 32};
    gpt2_opts o = {.max_batch = 1, .seq = T, .precision = DDP_FP32, .seed = 5};
    CHECK(ops && gpt2_create(ctx, ops, &cfg, &o, &g) == DDP_OK, "create");
    int *dev = ddp_alloc(ctx, T * sizeof(int));
    if (!g || !dev)
        return;
    CHECK(gpt2_cfg(g)->padded_vocab > V, "the vocabulary is padded (%d)", gpt2_cfg(g)->padded_vocab);
    int a[3 + N] = {4, 9, 2}, b[3 + N] = {4, 9, 2}, c[3 + N] = {4, 9, 2};
    gpt2_sample_opts so = {.n_tokens = N, .temperature = 1.0f, .top_k = 0, .seed = 11};
    CHECK(gpt2_sample(g, ctx, a, 3, T, &so, dev) == DDP_OK, "sample");
    CHECK(gpt2_sample(g, ctx, b, 3, T, &so, dev) == DDP_OK, "sample again");
    CHECK(!memcmp(a, b, sizeof a), "the same seed gives the same tokens");
    CHECK(a[0] == 4 && a[1] == 9 && a[2] == 2, "the prompt is kept");
    for (int i = 3; i < 3 + N; i++)
        CHECK(a[i] >= 0 && a[i] < V, "token %d = %d: a real vocabulary id", i, a[i]);
    so.seed = 12;
    CHECK(gpt2_sample(g, ctx, c, 3, T, &so, dev) == DDP_OK && memcmp(a, c, sizeof a),
          "another seed, other tokens");
    /* Greedy with a window of 4: each token is the argmax of the logits of the last 4 tokens. */
    so.temperature = 0.0f;
    CHECK(gpt2_sample(g, ctx, a, 3, 4, &so, dev) == DDP_OK, "greedy");
    int n_vp = gpt2_cfg(g)->padded_vocab;
    float *row = test_floats((size_t)n_vp);
    for (int i = 3; i < 3 + N && row; i++) {
        int len = i < 4 ? i : 4;
        CHECK(ddp_upload(ctx, dev, a + i - len, (size_t)len * sizeof(int)) == DDP_OK &&
              gpt2_forward(g, dev, NULL, 1, len, NULL, false) == DDP_OK &&
              gpt2_logits_get(g, (size_t)len - 1, 1, row) == DDP_OK,
              "forward %d", i);
        int best = 0;
        for (int j = 1; j < V; j++)
            best = row[j] > row[best] ? j : best;
        CHECK(a[i] == best, "greedy token %d = %d, the argmax is %d", i, a[i], best);
    }
    free(row);
    int bad[2] = {V, 0};
    CHECK(gpt2_sample(g, ctx, bad, 1, T, &so, dev) == DDP_ERR_INVALID_ARG, "a prompt id past the vocabulary");
    ddp_free(ctx, dev);
    gpt2_destroy(g);
    check_padding(ctx, ops);
    ops_close(ops);
    ddp_finalize(ctx);
}

int main(void)
{
    check_temperature();
    check_restrictions();
    check_generation();
    return CHECK_DONE();
}
