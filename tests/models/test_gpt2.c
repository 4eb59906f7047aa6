/* test_gpt2.c - the GPT-2 model (gpt2.h) on the CPU ops: parameter table and seeded init, the
 * loss at init, gradients against central differences, batch consistency, llm.c's model files,
 * AdamW's decay split, the reducer's marks, training on a fixed batch in fp32, bf16 and fp16
 * (with loss scaling), activation recomputation (bit-identical gradients, less memory), and the
 * switches back to run 4's paths (the fused ops composed, fp32 logits, the fp32 master read).
 */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adamw_util.h"
#include "gpt2.h"
#include "half.h"
#include "math_shared.h"
#include "switches.h"
#include "testutil.h"

enum { B = 2, T = 16 };

/* A tiny GPT-2: 2 layers, 4 heads, 64 channels, maxT 16, vocabulary v. */
static gpt2_config tiny(int v)
{
    return (gpt2_config){.max_seq = T, .vocab = v, .layers = 2, .heads = 4, .channels = 64};
}

static gpt2 *make(const ops_handle *ops, gpt2_config cfg, ddp_dtype p, uint64_t seed)
{
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = p, .seed = seed};
    gpt2 *g = NULL;
    CHECK(gpt2_create(NULL, ops, &cfg, &o, &g) == DDP_OK, "gpt2_create");
    return g;
}

/* A batch of tokens and targets in [0, v): targets are the next tokens of a random sequence. */
static void make_batch(int v, uint64_t seed, int *tokens, int *targets)
{
    test_rng r = {seed};
    int seq[B * T + 1];
    for (int i = 0; i <= B * T; i++)
        seq[i] = (int)(test_uniform(&r) * v);
    for (int i = 0; i < B * T; i++) {
        tokens[i] = seq[i];
        targets[i] = seq[i + 1];
    }
}

/* The mean loss of a forward pass (without backward). */
static double loss_of(gpt2 *g, const int *tokens, const int *targets, int b)
{
    float loss = 0.0f;
    CHECK(gpt2_forward(g, tokens, targets, b, T, &loss, false) == DDP_OK, "forward");
    return loss;
}

/* The first rows rows of the last forward's logits as floats (malloc'd). */
static float *logits_of(const gpt2 *g, int rows)
{
    float *x = test_floats((size_t)rows * gpt2_cfg(g)->padded_vocab);
    CHECK(gpt2_logits_get(g, 0, (size_t)rows, x) == DDP_OK, "gpt2_logits_get");
    return x;
}

/* ---- layout and init ----------------------------------------------------------------------- */

static void check_layout(const ops_handle *ops)
{
    gpt2_config cfg = tiny(100);
    gpt2 *g = make(ops, cfg, DDP_FP32, 1);
    if (!g)
        return;
    const ddp_param_desc *d = gpt2_descs(g);
    int n = gpt2_n_params(g), vp = gpt2_cfg(g)->padded_vocab;
    CHECK(vp == 128, "padded vocab %d, want 128", vp);
    CHECK(n == 4 + 12 * 2, "%d parameter slices, want 28", n);
    CHECK(strcmp(d[0].name, "wte.weight") == 0 && strcmp(d[1].name, "wpe.weight") == 0, "embeddings");
    CHECK(strcmp(d[2].name, "h.0.ln_1.weight") == 0 && strcmp(d[3].name, "h.1.ln_1.weight") == 0,
          "tensor-major slices: %s, %s", d[2].name, d[3].name);
    CHECK(strcmp(d[6].name, "h.0.attn.c_attn.weight") == 0 && d[6].shape[0] == 192 &&
          d[6].shape[1] == 64, "c_attn weight (3C, C)");
    CHECK(strcmp(d[24].name, "h.0.mlp.c_proj.bias") == 0, "%s", d[24].name);
    CHECK(strcmp(d[n - 1].name, "ln_f.bias") == 0, "last slice %s", d[n - 1].name);
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        sum += gpt2_numel(g)[i];
        bool two_d = d[i].n_dims == 2;
        CHECK(gpt2_param_decays(g, i) == two_d, "%s decays iff 2-D", d[i].name);
    }
    CHECK(sum == gpt2_numel_total(g), "slices cover the buffer");
    CHECK(sum == gpt2_config_n_params(&cfg) + (size_t)(vp - 100) * 64, "numel %zu", sum);
    gpt2_config d12;
    CHECK(gpt2_config_preset("d12", &d12) == DDP_OK && gpt2_config_n_params(&d12) == 124439808,
          "d12 has GPT-2's 124,439,808 parameters");
    gpt2_config bad = tiny(100);
    bad.heads = 5;
    CHECK(gpt2_config_check(&bad) == DDP_ERR_INVALID_ARG, "64 channels in 5 heads refused");
    gpt2_memory mem;
    gpt2_memory_get(g, &mem);
    CHECK(mem.params == sum * 4 && mem.grads == sum * 4 && mem.activations > 0, "memory split");
    gpt2_destroy(g);
}

/* Mean and standard deviation of x[0..n). */
static void stats(const float *x, size_t n, double *mean, double *std)
{
    double s = 0.0, s2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
}

static void check_init_values(gpt2 *g)
{
    const float *w = gpt2_params(g);
    const size_t *numel = gpt2_numel(g);
    size_t off = 0, real = 100 * 64;
    double mean, std;
    stats(w, real, &mean, &std);
    CHECK(fabs(mean) < 0.002 && fabs(std - 0.02) < 0.001, "wte N(0, 0.02): %g, %g", mean, std);
    for (size_t e = real; e < numel[0]; e++)
        CHECK(w[e] == 0.0f, "padding row element %zu is %g", e, (double)w[e]);
    for (int i = 0; i < gpt2_n_params(g); i++, off += numel[i - 1]) {
        const char *name = gpt2_descs(g)[i].name;
        stats(w + off, numel[i], &mean, &std);
        if (strstr(name, "c_proj.weight"))
            CHECK(fabs(std - 0.01) < 0.001, "%s: std %g, want 0.02 / sqrt(4)", name, std);
        else if (strstr(name, "ln_") && strstr(name, "weight"))
            CHECK(mean == 1.0 && std == 0.0, "%s is ones", name);
        else if (strstr(name, "bias"))
            CHECK(mean == 0.0 && std == 0.0, "%s is zeros", name);
        else if (i > 0)
            CHECK(fabs(std - 0.02) < 0.002, "%s: std %g, want 0.02", name, std);
    }
}

/* The same seed gives the same values on 1 and 2 threads; another seed others. */
static void check_init(void)
{
    ops_handle *one = NULL, *two = NULL;
    CHECK(ops_cpu_open(NULL, 1, false, &one) == DDP_OK && ops_cpu_open(NULL, 2, false, &two) ==
          DDP_OK, "ops");
    gpt2 *a = make(one, tiny(100), DDP_FP32, 7), *b = make(two, tiny(100), DDP_FP32, 7);
    gpt2 *c = make(one, tiny(100), DDP_FP32, 8), *h = make(one, tiny(100), DDP_BF16, 7);
    if (a && b && c && h) {
        size_t n = gpt2_numel_total(a);
        CHECK(memcmp(gpt2_params(a), gpt2_params(b), n * sizeof(float)) == 0, "same seed, same init");
        CHECK(memcmp(gpt2_params(a), gpt2_params(c), n * sizeof(float)) != 0, "seeds differ");
        check_init_values(a);
        /* bf16: the model holds only its bf16 weights, the fp32 init rounded to nearest even */
        float *wide = test_floats(n);
        ddp_dtype p = DDP_FP32;
        CHECK(gpt2_params(h) == NULL && gpt2_weights(h, &p) && p == DDP_BF16, "bf16 weights");
        CHECK(gpt2_weights_get(h, wide) == DDP_OK, "bf16 weights widened");
        int wrong = 0;
        for (size_t i = 0; i < n; i++)
            wrong += wide[i] != half_bf16_to_f32(half_f32_to_bf16(gpt2_params(a)[i]));
        CHECK(wrong == 0, "bf16 init: %d of %zu weights are not the fp32 init's nearest even", wrong,
              n);
        for (size_t i = 0; i < n; i++)
            wide[i] = gpt2_params(c)[i];
        CHECK(gpt2_weights_set(h, wide) == DDP_OK && gpt2_weights_get(h, wide) == DDP_OK,
              "bf16 weights set");
        wrong = 0;
        for (size_t i = 0; i < n; i++)
            wrong += wide[i] != half_bf16_to_f32(half_f32_to_bf16(gpt2_params(c)[i]));
        CHECK(wrong == 0, "gpt2_weights_set: %d of %zu weights not rounded to bf16", wrong, n);
        free(wide);
    }
    gpt2_destroy(h);
    gpt2_destroy(a);
    gpt2_destroy(b);
    gpt2_destroy(c);
    ops_close(one);
    ops_close(two);
    ops_cpu_set_threads(1); /* the thread count is the process's: back to the tests' one */
}

/* With GPT-2's vocabulary and weights of std 0.02, the logits are nearly equal: ln(V) (their
 * std is about 0.16, so the mean target logit of 32 positions varies by about 0.03). */
static void check_init_loss(const ops_handle *ops)
{
    gpt2 *g = make(ops, tiny(GPT2_VOCAB), DDP_FP32, 3);
    if (!g)
        return;
    int tokens[B * T], targets[B * T];
    make_batch(GPT2_VOCAB, 11, tokens, targets);
    double loss = loss_of(g, tokens, targets, B);
    fprintf(stderr, "loss at init %.4f, ln V %.4f\n", loss, log(GPT2_VOCAB));
    CHECK(fabs(loss - log(GPT2_VOCAB)) < 0.1, "loss at init %g, want ln V = 10.825", loss);
    gpt2_destroy(g);
}

/* ---- gradients ----------------------------------------------------------------------------- */

/* The loss at w + t u for slice values w (n) and direction u: w is restored after. */
static double loss_along(gpt2 *g, float *w, const float *u, size_t n, float t, const int *tokens,
                         const int *targets)
{
    float *save = test_floats(n);
    memcpy(save, w, n * sizeof(float));
    for (size_t e = 0; e < n; e++)
        w[e] += t * u[e];
    double loss = loss_of(g, tokens, targets, B);
    memcpy(w, save, n * sizeof(float));
    free(save);
    return loss;
}

/* d/dt L(w + t u) at 0 by the five-point central difference (truncation O(h^4)). */
static double central(gpt2 *g, float *w, const float *u, size_t n, float h, const int *tokens,
                      const int *targets)
{
    double d1 = loss_along(g, w, u, n, h, tokens, targets) -
                loss_along(g, w, u, n, -h, tokens, targets);
    double d2 = loss_along(g, w, u, n, 2 * h, tokens, targets) -
                loss_along(g, w, u, n, -2 * h, tokens, targets);
    return (8.0 * d1 - d2) / (12.0 * h);
}

/* Each parameter slice's gradient g against finite differences along a random direction u of
 * +-1 entries: g.u = d/dt L(w + t u). One direction covers every element of the slice, and g.u
 * (about |g| sqrt(n)) stands far above the float noise of the loss (about 4.6, rounded to 5e-7 and
 * summed over 32 positions: about 1e-6), which the five-point quotient at h = 4e-3 divides by
 * 12h / 18: about 2e-4. Measured: every slice within 0.4 of the tolerance 4e-4 + 0.5 % |g.u|. */
static void check_gradients(const ops_handle *ops)
{
    gpt2 *g = make(ops, tiny(100), DDP_FP32, 5);
    if (!g)
        return;
    int tokens[B * T], targets[B * T];
    make_batch(100, 13, tokens, targets);
    float loss = 0.0f, h = 4e-3f;
    CHECK(gpt2_zero_grad(g) == DDP_OK, "zero_grad");
    CHECK(gpt2_forward(g, tokens, targets, B, T, &loss, true) == DDP_OK, "forward");
    CHECK(gpt2_backward(g, NULL, 1.0f) == DDP_OK, "backward");
    CHECK(gpt2_backward(g, NULL, 1.0f) == DDP_ERR_STATE, "a second backward is refused");
    float *w = gpt2_params(g), *u = test_floats(gpt2_numel_total(g)); /* direction, any slice */
    test_rng r = {77};
    size_t off = 0;
    for (int i = 0; i < gpt2_n_params(g); off += gpt2_numel(g)[i], i++) {
        size_t n = gpt2_numel(g)[i];
        double ana = 0.0;
        for (size_t e = 0; e < n; e++) {
            u[e] = test_uniform(&r) < 0.5 ? -1.0f : 1.0f;
            ana += (double)gpt2_grads(g)[off + e] * u[e];
        }
        double num = central(g, w + off, u, n, h, tokens, targets);
        CHECK(fabs(num - ana) <= 4e-4 + 5e-3 * fabs(ana),
              "%s: g.u %.6g, central difference %.6g", gpt2_descs(g)[i].name, ana, num);
    }
    free(u);
    gpt2_destroy(g);
}

/* backward ADDS d(loss_scale * loss): a pass with scale 1 and one with scale 4, without zeroing
 * in between, give 5 times a single pass's gradients (a power of two scales exactly; what is left
 * is the rounding of the sums: 1e-5 relative, 1e-7 absolute for entries that cancel, as wte's
 * rows of the head's GEMM do). */
static void check_accumulation(const ops_handle *ops)
{
    gpt2 *g = make(ops, tiny(100), DDP_FP32, 6);
    if (!g)
        return;
    int tokens[B * T], targets[B * T];
    make_batch(100, 15, tokens, targets);
    size_t n = gpt2_numel_total(g);
    float *once = test_floats(n);
    for (int pass = 0; pass < 3; pass++) {
        if (pass != 2)
            CHECK(gpt2_zero_grad(g) == DDP_OK, "zero_grad");
        CHECK(gpt2_forward(g, tokens, targets, B, T, NULL, true) == DDP_OK, "forward");
        CHECK(gpt2_backward(g, NULL, pass == 2 ? 4.0f : 1.0f) == DDP_OK, "backward");
        if (pass == 0)
            for (size_t i = 0; i < n; i++)
                once[i] = 5.0f * gpt2_grads(g)[i];
    }
    CHECK(test_compare("accumulated", gpt2_grads(g), once, n, 1e-7, 1e-5) == 0,
          "1 x + 4 x the gradient");
    free(once);
    gpt2_destroy(g);
}

/* Two sequences in one batch give each one's logits and the mean of their losses. */
static void check_batch_consistency(const ops_handle *ops)
{
    gpt2 *g = make(ops, tiny(100), DDP_FP32, 9);
    if (!g)
        return;
    int tokens[B * T], targets[B * T];
    make_batch(100, 17, tokens, targets);
    size_t nl = (size_t)T * gpt2_cfg(g)->padded_vocab;
    float *both = test_floats(2 * nl);
    CHECK(gpt2_forward(g, tokens, NULL, B, T, NULL, false) == DDP_OK, "forward B=2");
    CHECK(gpt2_logits_get(g, 0, B * T, both) == DDP_OK, "logits B=2");
    double l2 = loss_of(g, tokens, targets, B), l1 = 0.0;
    for (int s = 0; s < B; s++) {
        CHECK(gpt2_forward(g, tokens + s * T, NULL, 1, T, NULL, false) == DDP_OK, "forward B=1");
        float *one = logits_of(g, T);
        CHECK(test_compare("logits", one, both + s * nl, nl, 1e-5, 1e-4) == 0,
              "sequence %d alone", s);
        free(one);
        l1 += loss_of(g, tokens + s * T, targets + s * T, 1) / B;
    }
    CHECK_CLOSE(l1, l2, 1e-5, 1e-5, "mean of the B=1 losses");
    free(both);
    gpt2_destroy(g);
}

/* ---- llm.c files --------------------------------------------------------------------------- */

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n, "write %s", path);
    if (f)
        fclose(f);
}

/* Damaged and mismatched files fail with the documented status, the model unchanged; a FIFO is
 * refused at once (opening it to read waited for a writer; alarm ends the test if it does). */
static void check_llmc_errors(const ops_handle *ops, gpt2 *g, const char *path)
{
    char bad[256];
    snprintf(bad, sizeof bad, "%s.bad", path);
    gpt2_config cfg;
    CHECK(gpt2_llmc_read_config("/nonexistent/model.bin", &cfg) == DDP_ERR_IO, "missing file");
    alarm(20);
    CHECK(mkfifo(bad, 0600) == 0 && gpt2_llmc_read_config(bad, &cfg) == DDP_ERR_IO &&
              gpt2_llmc_load(g, bad) == DDP_ERR_IO, "a FIFO refused");
    alarm(0);
    remove(bad);
    int32_t h[256] = {20240326, 4};
    write_bytes(bad, h, sizeof h);
    CHECK(gpt2_llmc_read_config(bad, &cfg) == DDP_ERR_FORMAT, "version 4 refused");
    h[0] = 1234;
    write_bytes(bad, h, sizeof h);
    CHECK(gpt2_llmc_read_config(bad, &cfg) == DDP_ERR_FORMAT, "bad magic refused");
    int32_t good[256] = {20240326, 3, T, 100, 2, 4, 64, 128};
    write_bytes(bad, good, sizeof good); /* a header without parameters */
    float before = gpt2_params(g)[5];
    CHECK(gpt2_llmc_load(g, bad) == DDP_ERR_FORMAT && gpt2_params(g)[5] == before, "truncated");
    gpt2 *other = make(ops, (gpt2_config){.max_seq = T, .vocab = 100, .layers = 1, .heads = 4,
                                          .channels = 64}, DDP_FP32, 1);
    CHECK(other && gpt2_llmc_load(other, path) == DDP_ERR_MISMATCH, "1 layer vs 2 refused");
    CHECK(gpt2_llmc_save(g, bad, DDP_FP16) == DDP_ERR_INVALID_ARG, "fp16 files refused");
    gpt2_destroy(other);
    remove(bad);
}

/* fp32 save then load is exact; a bf16 file holds the values rounded to nearest even. */
static void check_llmc(const ops_handle *ops)
{
    char path[] = "/tmp/test_gpt2_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    gpt2 *a = make(ops, tiny(100), DDP_FP32, 21), *b = make(ops, tiny(100), DDP_FP32, 22);
    if (a && b) {
        size_t n = gpt2_numel_total(a);
        gpt2_config cfg;
        CHECK(gpt2_llmc_save(a, path, DDP_FP32) == DDP_OK, "save fp32");
        CHECK(gpt2_llmc_read_config(path, &cfg) == DDP_OK && cfg.layers == 2 && cfg.vocab == 100
              && cfg.padded_vocab == 128 && cfg.channels == 64 && cfg.max_seq == T, "config");
        CHECK(gpt2_llmc_load(b, path) == DDP_OK, "load fp32");
        CHECK(memcmp(gpt2_params(a), gpt2_params(b), n * sizeof(float)) == 0, "fp32 round trip");
        CHECK(gpt2_llmc_save(a, path, DDP_BF16) == DDP_OK && gpt2_llmc_load(b, path) == DDP_OK,
              "bf16 save and load");
        int wrong = 0;
        for (size_t i = 0; i < n; i++)
            wrong += gpt2_params(b)[i] != half_bf16_to_f32(half_f32_to_bf16(gpt2_params(a)[i]));
        CHECK(wrong == 0, "%d values not rounded to bf16", wrong);
        check_llmc_errors(ops, a, path);
    }
    gpt2_destroy(a);
    gpt2_destroy(b);
    remove(path);
}

/* ---- AdamW --------------------------------------------------------------------------------- */

/* With zero gradients a step only decays: the 2-D weights by (1 - lr wd), the rest not at all.
 * Then a step with gradients matches adamw_update element by element. */
static void check_adamw(const ops_handle *ops)
{
    gpt2 *g = make(ops, tiny(100), DDP_FP32, 31);
    if (!g)
        return;
    size_t n = gpt2_numel_total(g), off = 0;
    float *w0 = test_floats(n);
    memcpy(w0, gpt2_params(g), n * sizeof(float));
    optim *o = NULL, *o2 = NULL;
    CHECK(gpt2_zero_grad(g) == DDP_OK && test_adamw(g, &o, 0.1f, 0.5f, 1, 1.0f) == DDP_OK,
          "adamw");
    for (int i = 0; i < gpt2_n_params(g); off += gpt2_numel(g)[i], i++) {
        float f = gpt2_param_decays(g, i) ? 1.0f - 0.1f * 0.5f : 1.0f;
        int bad = 0;
        for (size_t e = 0; e < gpt2_numel(g)[i]; e++)
            bad += fabsf(gpt2_params(g)[off + e] - f * w0[off + e]) > 1e-7f;
        CHECK(bad == 0, "%s after a step with zero gradients", gpt2_descs(g)[i].name);
    }
    test_rng r = {5};
    test_fill(&r, gpt2_grads(g), n, -1.0, 1.0);
    float *w = w0, *m = test_floats(n), *v = test_floats(n), *state[OPTIM_MAX_BUFS];
    const char *names[OPTIM_MAX_BUFS];
    memcpy(w, gpt2_params(g), n * sizeof(float));
    /* step 2 decays by 0.1: another optimizer, whose zero moments are step 1's (zero gradients) */
    CHECK(o && optim_buffers(o, names, state) == 3 && strcmp(names[0], "params") == 0 &&
              state[0] == gpt2_params(g), "the master (fp32: the model's weights), two moments");
    memcpy(m, state[1], n * sizeof(float));
    memcpy(v, state[2], n * sizeof(float));
    CHECK(test_adamw(g, &o2, 1e-3f, 0.1f, 2, 0.5f) == DDP_OK, "adamw t=2");
    off = 0;
    for (int i = 0; i < gpt2_n_params(g); off += gpt2_numel(g)[i], i++) {
        float wd = gpt2_param_decays(g, i) ? 0.1f : 0.0f, bc1 = 1.0f - 0.81f;
        float bc2 = 1.0f - 0.95f * 0.95f;
        for (size_t e = off; e < off + gpt2_numel(g)[i]; e++)
            w[e] = adamw_update(w[e], &m[e], &v[e], gpt2_grads(g)[e], 0.5f, 1e-3f, 0.9f, 0.95f,
                                1e-8f, wd, bc1, bc2);
    }
    CHECK(test_compare("adamw", gpt2_params(g), w, n, 1e-7, 1e-5) == 0, "AdamW against the scalar");
    CHECK(test_adamw(g, &o2, 1e-3f, 0.1f, 0, 1.0f) == DDP_ERR_INVALID_ARG, "t = 0 refused");
    optim_destroy(o);
    optim_destroy(o2);
    free(w0);
    free(m);
    free(v);
    gpt2_destroy(g);
}

/* ---- precision and the reducer ----------------------------------------------------------- */

/* bf16 rounds the matmuls' inputs: logits near fp32's (std about 0.16; bf16 keeps 8 bits, so a
 * logit moves by about 1e-3) but not equal. */
static void check_bf16_logits(const ops_handle *ops)
{
    gpt2 *a = make(ops, tiny(100), DDP_FP32, 51), *b = make(ops, tiny(100), DDP_BF16, 51);
    int tokens[B * T], targets[B * T];
    make_batch(100, 23, tokens, targets);
    if (a && b) {
        size_t n = (size_t)B * T * gpt2_cfg(a)->padded_vocab;
        CHECK(gpt2_forward(a, tokens, NULL, B, T, NULL, false) == DDP_OK &&
              gpt2_forward(b, tokens, NULL, B, T, NULL, false) == DDP_OK, "forward");
        float *la = logits_of(a, B * T), *lb = logits_of(b, B * T);
        CHECK(test_compare("bf16 logits", lb, la, n, 2e-2, 0.0) == 0, "bf16 logits near fp32's");
        CHECK(memcmp(la, lb, n * sizeof(float)) != 0, "bf16 rounds");
        free(la);
        free(lb);
    }
    gpt2_destroy(a);
    gpt2_destroy(b);
}

/* grad_pass (below) for the activations test. */
static float grad_pass(gpt2 *g, const int *tokens, const int *targets);

/* ||a - b|| / ||b|| over n floats. */
static double rel_norm(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* bf16 activations end to end (the default) against DDP_GPT_ACTIVATIONS=fp32 (casts around the
 * linears) and fp32: one forward and backward each. Both bf16 forms round the matmuls' inputs
 * alike; the end-to-end form also rounds qkv, the attention output's and the MLP's activations
 * and their gradients (2^-9 relative each), so its loss stays within the 2e-2 of
 * check_bf16_logits' logits and its gradients within a few 2^-9 of fp32's in norm (3e-2 allows
 * the roundings of two layers' chains; measured 4.0e-3 and 3.8e-3). Another value of the
 * variable is refused. */
static void check_activations(const ops_handle *ops)
{
    gpt2 *a = make(ops, tiny(100), DDP_FP32, 52), *b = make(ops, tiny(100), DDP_BF16, 52);
    setenv("DDP_GPT_ACTIVATIONS", "fp32", 1);
    gpt2 *c = make(ops, tiny(100), DDP_BF16, 52);
    setenv("DDP_GPT_ACTIVATIONS", "bf16", 1);
    gpt2_config cfg = tiny(100);
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = DDP_BF16, .seed = 52};
    gpt2 *bad = NULL;
    CHECK(gpt2_create(NULL, ops, &cfg, &o, &bad) == DDP_ERR_INVALID_ARG && !bad,
          "DDP_GPT_ACTIVATIONS=bf16 refused (fp32 or p)");
    unsetenv("DDP_GPT_ACTIVATIONS");
    int tokens[B * T], targets[B * T];
    make_batch(100, 29, tokens, targets);
    if (a && b && c) {
        size_t np = gpt2_numel_total(a);
        float la = grad_pass(a, tokens, targets), lb = grad_pass(b, tokens, targets);
        float lc = grad_pass(c, tokens, targets);
        CHECK(fabsf(lb - la) < 2e-2f && fabsf(lc - la) < 2e-2f, "losses %g (bf16), %g (fp32 "
              "activations), %g (fp32)", (double)lb, (double)lc, (double)la);
        double eb = rel_norm(gpt2_grads(b), gpt2_grads(a), np);
        double ec = rel_norm(gpt2_grads(c), gpt2_grads(a), np);
        printf("gradients against fp32: bf16 activations %.2e, fp32 activations %.2e\n", eb, ec);
        CHECK(eb < 3e-2 && ec < 3e-2, "gradients: relative errors %g, %g", eb, ec);
        CHECK(memcmp(gpt2_grads(b), gpt2_grads(c), np * sizeof(float)) != 0,
              "DDP_GPT_ACTIVATIONS=fp32 changes the path");
    }
    gpt2_destroy(a);
    gpt2_destroy(b);
    gpt2_destroy(c);
}

/* gpt2_ready_order is the order backward marks in: the one the reducer recorded and rebuilt its
 * buckets in after its first sync step (its buckets' parameters, bucket after bucket). */
static void check_ready_order(const gpt2 *g, const ddp_reducer *r)
{
    int n = gpt2_n_params(g), k = 0, *want = malloc((size_t)n * sizeof *want);
    gpt2_ready_order(g, want);
    CHECK(ddp_reducer_bucket_order(r) == DDP_BUCKETS_READY_ORDER, "buckets rebuilt");
    for (int b = 0; b < ddp_reducer_n_buckets(r); b++) {
        const int *params = NULL;
        int m = ddp_reducer_bucket_params(r, b, &params);
        for (int j = 0; j < m && k < n; j++, k++)
            CHECK(params[j] == want[k], "position %d: backward marks %d, gpt2_ready_order says %d",
                  k, params[j], want[k]);
    }
    CHECK(k == n, "%d of %d parameters in the buckets", k, n);
    free(want);
}

/* opts.reducer_grads (with recompute or not): no gradient buffer; one micro-step on a
 * bucket-owned reducer of one rank gives `plain` (n floats, the flat buffer's gradients) in its
 * shard, bit for bit; the calls that need the flat buffer are refused. */
static void check_reducer_grads(ddp_ctx *ctx, const ops_handle *ops, const float *plain, size_t n,
                                int recompute)
{
    gpt2_config cfg = tiny(100);
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = DDP_FP32, .seed = 61,
                   .reducer_grads = true, .recompute = recompute};
    gpt2 *g = NULL;
    ddp_reducer *r = NULL;
    ddp_reducer_opts ro;
    ddp_reducer_opts_default(&ro);
    ro.bucket_mb = ro.first_bucket_mb = 1.0 / 64;
    ro.zero_stage = 2;
    CHECK(gpt2_create(ctx, ops, &cfg, &o, &g) == DDP_OK, "create (reducer_grads)");
    int *order = g ? malloc((size_t)gpt2_n_params(g) * sizeof *order) : NULL;
    if (order) {
        gpt2_ready_order(g, order);
        ro.ready_order = order;
        CHECK(ddp_reducer_create(ctx, NULL, gpt2_numel(g), gpt2_n_params(g), &ro, &r) == DDP_OK,
              "bucket-owned reducer");
    }
    free(order);
    gpt2_memory m;
    if (g)
        gpt2_memory_get(g, &m);
    CHECK(g && !gpt2_grads(g) && m.grads == 0 && gpt2_zero_grad(g) == DDP_OK, "no gradients");
    int tokens[B * T], targets[B * T];
    make_batch(100, 29, tokens, targets);
    CHECK(r && gpt2_forward(g, tokens, targets, B, T, NULL, true) == DDP_OK, "forward");
    CHECK(r && gpt2_backward(g, NULL, 1.0f) == DDP_ERR_INVALID_ARG, "backward without reducer");
    CHECK(r && gpt2_forward(g, tokens, targets, B, T, NULL, true) == DDP_OK &&
              ddp_reducer_begin(r, 1) == DDP_OK && gpt2_backward(g, r, 1.0f) == DDP_OK &&
              ddp_reducer_finish(r) == DDP_OK, "a step with the reducer's buckets");
    if (r)
        CHECK(test_compare("bucket-owned", ddp_reducer_shard_grads(r), plain, n, 0.0, 0.0) == 0,
              "recompute %d: the reducer's shard is the flat buffer's gradients", recompute);
    ddp_reducer_destroy(r);
    gpt2_destroy(g);
}

/* Backward marks every slice exactly once on a one-rank reducer (buckets of 16 KiB: many), whose
 * average is then the gradient itself. */
static void check_reducer(void)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    ddp_ctx *ctx = NULL;
    ops_handle *ops = NULL;
    CHECK(ddp_init(&io, &ctx) == DDP_OK && ops_cpu_open(ctx, 1, false, &ops) == DDP_OK, "init");
    gpt2_config cfg = tiny(100);
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = DDP_FP32, .seed = 61};
    gpt2 *g = NULL;
    ddp_reducer *r = NULL;
    ddp_reducer_opts ro;
    ddp_reducer_opts_default(&ro);
    ro.bucket_mb = ro.first_bucket_mb = 1.0 / 64;
    CHECK(ops && gpt2_create(ctx, ops, &cfg, &o, &g) == DDP_OK, "create on a context");
    CHECK(g && ddp_reducer_create(ctx, gpt2_grads(g), gpt2_numel(g), gpt2_n_params(g), &ro, &r) ==
          DDP_OK, "reducer");
    int tokens[B * T], targets[B * T];
    make_batch(100, 29, tokens, targets);
    size_t n = g ? gpt2_numel_total(g) : 0;
    float *plain = test_floats(n);
    for (int pass = 0; r && pass < 2; pass++) { /* without, then with the reducer */
        CHECK(gpt2_zero_grad(g) == DDP_OK, "zero_grad");
        CHECK(gpt2_forward(g, tokens, targets, B, T, NULL, true) == DDP_OK, "forward");
        CHECK(!pass || ddp_reducer_begin(r, 1) == DDP_OK, "begin");
        CHECK(gpt2_backward(g, pass ? r : NULL, 1.0f) == DDP_OK, "backward marks each slice once");
        CHECK(!pass || ddp_reducer_finish(r) == DDP_OK, "every slice marked");
        if (!pass)
            memcpy(plain, gpt2_grads(g), n * sizeof(float));
        else
            CHECK(test_compare("reduced", gpt2_grads(g), plain, n, 0.0, 0.0) == 0, "1 rank: same");
    }
    CHECK(ddp_reducer_n_buckets(r) > 4, "%d buckets", ddp_reducer_n_buckets(r));
    check_ready_order(g, r);
    for (int rec = 0; g && rec < 2; rec++)
        check_reducer_grads(ctx, ops, plain, n, rec);
    free(plain);
    ddp_reducer_destroy(r);
    gpt2_destroy(g);
    ops_close(ops);
    ddp_finalize(ctx);
}

/* ---- activation recomputation ------------------------------------------------------------ */

/* A GPT-2 of 3 layers, 2 heads, 32 channels, vocabulary 100 (scratch of one layer or three). */
static gpt2 *make_small(const ops_handle *ops, ddp_dtype p, bool recompute)
{
    gpt2_config cfg = {.max_seq = T, .vocab = 100, .layers = 3, .heads = 2, .channels = 32};
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = p, .seed = 71, .recompute = recompute};
    gpt2 *g = NULL;
    CHECK(gpt2_create(NULL, ops, &cfg, &o, &g) == DDP_OK, "gpt2_create (recompute %d)", recompute);
    return g;
}

/* One forward for backward and backward of g (gradients zeroed first); the mean loss. */
static float grad_pass(gpt2 *g, const int *tokens, const int *targets)
{
    float loss = 0.0f;
    CHECK(gpt2_zero_grad(g) == DDP_OK, "zero_grad");
    CHECK(gpt2_forward(g, tokens, targets, B, T, &loss, true) == DDP_OK, "forward");
    CHECK(gpt2_backward(g, NULL, 1.0f) == DDP_OK, "backward");
    return loss;
}

/* The number of elements in which x and y (n floats) differ as bits. */
static size_t bits_differ(const float *x, const float *y, size_t n)
{
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += memcmp(&x[i], &y[i], sizeof(float)) != 0;
    return wrong;
}

/* Two steps (the second after an AdamW update, so the 16-bit weights are refreshed) of a plain
 * model and one that recomputes: same loss and every gradient element, bit for bit; then the
 * logits of a forward pass without targets (validation, sampling). */
static void compare_recompute(gpt2 *plain, gpt2 *rec, ddp_dtype p)
{
    const char *name = ddp_dtype_name(p);
    int tokens[B * T], targets[B * T];
    make_batch(100, 73, tokens, targets);
    size_t n = gpt2_numel_total(plain), nl = (size_t)B * T * gpt2_cfg(plain)->padded_vocab;
    optim *oa = NULL, *ob = NULL;
    for (int s = 1; s <= 2; s++) {
        float la = grad_pass(plain, tokens, targets), lb = grad_pass(rec, tokens, targets);
        CHECK(memcmp(&la, &lb, sizeof la) == 0, "%s step %d: loss %.9g, recompute %.9g", name, s,
              la, lb);
        size_t wrong = bits_differ(gpt2_grads(plain), gpt2_grads(rec), n);
        CHECK(wrong == 0, "%s step %d: %zu of %zu gradient elements differ", name, s, wrong, n);
        CHECK(test_adamw(plain, &oa, 1e-3f, 0.1f, s, 1.0f) == DDP_OK &&
              test_adamw(rec, &ob, 1e-3f, 0.1f, s, 1.0f) == DDP_OK, "adamw");
    }
    optim_destroy(oa);
    optim_destroy(ob);
    CHECK(gpt2_forward(plain, tokens, NULL, B, T, NULL, false) == DDP_OK &&
          gpt2_forward(rec, tokens, NULL, B, T, NULL, false) == DDP_OK, "forward without targets");
    float *lp = logits_of(plain, B * T), *lr = logits_of(rec, B * T);
    CHECK(bits_differ(lp, lr, nl) == 0, "%s: logits differ", name);
    free(lp);
    free(lr);
}

/* ---- the optional fused ops (ops.h), as the model calls them ------------------------------ */

static int n_gelu_fwd, n_gelu_bwd, n_add_ln; /* calls of the composites below */

/* linear_gelu_fwd as the composite the CPU has no need of: linear_fwd, then gelu_fwd on pre. */
static ddp_status composed_gelu_fwd(const ops_handle *o, ddp_dtype p, const void *x,
                                    const void *w, const float *b, int batch, int in, int out,
                                    void *pre, void *y)
{
    n_gelu_fwd++;
    TRY_OK(o->linear_fwd(o, p, x, w, b, batch, in, out, pre, p == DDP_FP32));
    return o->gelu_fwd(o, p, y, pre, (size_t)batch * out);
}

static ddp_status composed_gelu_bwd(const ops_handle *o, ddp_dtype p, const void *w,
                                    const void *dy, const void *pre, int batch, int in, int out,
                                    void *dx)
{
    n_gelu_bwd++;
    TRY_OK(o->linear_bwd_input(o, p, w, dy, batch, in, out, dx));
    return o->gelu_bwd(o, p, dx, pre, dx, (size_t)batch * in);
}

/* add_layernorm_fwd as the composite: add, then layernorm_fwd on y. */
static ddp_status composed_add_ln(const ops_handle *o, ddp_dtype act, float *y, const float *a,
                                  const void *b, void *out, float *mean, float *rstd,
                                  const float *w, const float *bias, int rows, int C)
{
    n_add_ln++;
    TRY_OK(o->add(o, act, y, a, b, (size_t)rows * C));
    return o->layernorm_fwd(o, act, out, mean, rstd, y, w, bias, rows, C);
}

/* The model's fused branches (taken on CUDA: cuBLASLt's epilogues, one kernel for the residual add
 * and ln_2) driven on the CPU through the composites: once per layer (each way for GELU) where
 * the activations are in p (fp32, bf16), never with casts (fp16), and the loss and every gradient
 * bit for bit those of the unfused path, so the branches hand the ops the right buffers. */
static void check_fused_ops(const ops_handle *ops)
{
    ops_handle fused = *ops;
    fused.linear_gelu_fwd = composed_gelu_fwd;
    fused.linear_bwd_input_gelu = composed_gelu_bwd;
    fused.add_layernorm_fwd = composed_add_ln;
    const ddp_dtype ps[] = {DDP_FP32, DDP_BF16, DDP_FP16};
    int tokens[B * T], targets[B * T];
    make_batch(100, 41, tokens, targets);
    for (int i = 0; i < 3; i++) {
        gpt2 *a = make(ops, tiny(100), ps[i], 61), *b = make(&fused, tiny(100), ps[i], 61);
        if (!a || !b) {
            gpt2_destroy(a);
            gpt2_destroy(b);
            continue;
        }
        n_gelu_fwd = n_gelu_bwd = n_add_ln = 0;
        float la = grad_pass(a, tokens, targets), lb = grad_pass(b, tokens, targets);
        int L = gpt2_cfg(a)->layers, want = ps[i] == DDP_FP16 ? 0 : L;
        const char *name = ddp_dtype_name(ps[i]);
        CHECK(n_gelu_fwd == want && n_gelu_bwd == want && n_add_ln == want, "%s: fused calls: "
              "GELU %d forward, %d backward, add + ln_2 %d; want %d each", name, n_gelu_fwd,
              n_gelu_bwd, n_add_ln, want);
        CHECK(memcmp(&la, &lb, sizeof la) == 0, "%s: loss %.9g, fused %.9g", name, la, lb);
        size_t wrong = bits_differ(gpt2_grads(a), gpt2_grads(b), gpt2_numel_total(a));
        CHECK(wrong == 0, "%s: %zu gradient elements differ with the fused ops", name, wrong);
        gpt2_destroy(a);
        gpt2_destroy(b);
    }
}

/* The switches of the fused ops (models/ops/switches.h) as a backend's open applies them: with
 * DDP_LT_EPILOGUES=0 the GELU goes through linear and gelu, with DDP_ADD_LN_FUSED=0 the residual
 * add and ln_2 through add and layernorm_fwd (no composite called), bit for bit the fused run. */
static void check_fused_switches(const ops_handle *ops)
{
    const char *vars[] = {"DDP_LT_EPILOGUES", "DDP_ADD_LN_FUSED"};
    int tokens[B * T], targets[B * T];
    make_batch(100, 43, tokens, targets);
    for (int v = 0; v < 2; v++) {
        ops_handle fused = *ops;
        fused.linear_gelu_fwd = composed_gelu_fwd;
        fused.linear_bwd_input_gelu = composed_gelu_bwd;
        fused.add_layernorm_fwd = composed_add_ln;
        setenv(vars[v], "0", 1);
        ops_switches_apply(&fused);
        unsetenv(vars[v]);
        gpt2 *a = make(ops, tiny(100), DDP_BF16, 62), *b = make(&fused, tiny(100), DDP_BF16, 62);
        if (a && b) {
            n_gelu_fwd = n_gelu_bwd = n_add_ln = 0;
            float la = grad_pass(a, tokens, targets), lb = grad_pass(b, tokens, targets);
            int L = gpt2_cfg(a)->layers, gelu = v == 0 ? 0 : L, add_ln = v == 1 ? 0 : L;
            CHECK(n_gelu_fwd == gelu && n_gelu_bwd == gelu && n_add_ln == add_ln,
                  "%s=0: GELU fused %d / %d times, add + ln_2 %d (want %d, %d)", vars[v],
                  n_gelu_fwd, n_gelu_bwd, n_add_ln, gelu, add_ln);
            CHECK(memcmp(&la, &lb, sizeof la) == 0 &&
                      bits_differ(gpt2_grads(a), gpt2_grads(b), gpt2_numel_total(a)) == 0,
                  "%s=0: the loss and gradients of the composed path", vars[v]);
        }
        gpt2_destroy(a);
        gpt2_destroy(b);
    }
}

/* DDP_GPT_LOGITS16=0 (run 4's logits) in bf16: the LM head writes fp32 logits (4 bytes each,
 * values bf16 cannot hold), the cross-entropy runs on them and their gradient is cast to bf16;
 * the loss within bf16's rounding of the default's (bf16 logits) and training goes on. */
static void check_logits_switch(const ops_handle *ops)
{
    gpt2 *a = make(ops, tiny(100), DDP_BF16, 53);
    setenv("DDP_GPT_LOGITS16", "0", 1);
    gpt2 *b = make(ops, tiny(100), DDP_BF16, 53);
    unsetenv("DDP_GPT_LOGITS16");
    int tokens[B * T], targets[B * T];
    make_batch(100, 31, tokens, targets);
    if (a && b) {
        gpt2_memory ma, mb;
        gpt2_memory_get(a, &ma);
        gpt2_memory_get(b, &mb);
        size_t n = (size_t)B * T * gpt2_cfg(a)->padded_vocab;
        CHECK(mb.logits == n * sizeof(float) && ma.logits == n * ops_dtype_size(ops, DDP_BF16),
              "logits bytes: %zu with the switch 0 (want fp32's %zu), %zu without", mb.logits,
              n * sizeof(float), ma.logits);
        CHECK(gpt2_forward(b, tokens, NULL, B, T, NULL, false) == DDP_OK, "forward, fp32 logits");
        float *lb = logits_of(b, B * T);
        size_t wide = 0;
        for (size_t i = 0; i < n; i++)
            wide += half_bf16_to_f32(half_f32_to_bf16(lb[i])) != lb[i];
        CHECK(wide > n / 2, "fp32 logits: %zu of %zu not bf16 values", wide, n);
        free(lb);
        float la = grad_pass(a, tokens, targets), l1 = grad_pass(b, tokens, targets);
        CHECK(fabsf(la - l1) < 1e-2f, "losses %g (bf16 logits), %g (fp32 logits)", (double)la,
              (double)l1);
        double e = rel_norm(gpt2_grads(b), gpt2_grads(a), gpt2_numel_total(a));
        CHECK(e < 3e-2 && e > 0, "gradients against the default's: relative %g", e);
    }
    gpt2_destroy(a);
    gpt2_destroy(b);
}

/* gpt2_set_master (DDP_GPT_READ_COPY=0's path): the passes read wte, wpe, LayerNorm and the biases
 * from the fp32 master: a master equal to the weights widened gives the default's loss bit for
 * bit, one with ln_f's bias moved another loss, and NULL the default's again. */
static void check_master(const ops_handle *ops)
{
    gpt2 *g = make(ops, tiny(100), DDP_BF16, 54);
    int tokens[B * T], targets[B * T];
    make_batch(100, 37, tokens, targets);
    if (!g)
        return;
    size_t n = gpt2_numel_total(g);
    float *master = test_floats(n);
    CHECK(gpt2_weights_get(g, master) == DDP_OK, "weights_get");
    double base = loss_of(g, tokens, targets, B);
    gpt2_set_master(g, master);
    CHECK(loss_of(g, tokens, targets, B) == base, "the master equal to the copy: the same loss");
    int C = gpt2_cfg(g)->channels;
    for (int c = 0; c < C; c++) /* ln_f's bias, the last slice */
        master[n - C + c] += 0.5f * (float)(c % 3);
    double moved = loss_of(g, tokens, targets, B);
    CHECK(moved != base, "ln_f's bias read from the master: loss %g, default %g", moved, base);
    for (size_t i = 0; i < n - (size_t)C; i++) /* wte, wpe, the layers: moved too */
        master[i] *= 1.5f;
    CHECK(loss_of(g, tokens, targets, B) != moved, "the rest read from the master too");
    gpt2_set_master(g, NULL);
    CHECK(loss_of(g, tokens, targets, B) == base, "unset: the copy again");
    free(master);
    gpt2_destroy(g);
}

/* Recomputation changes nothing but the memory: activations strictly smaller (printed). */
static void check_recompute(const ops_handle *ops, ddp_dtype p)
{
    gpt2 *plain = make_small(ops, p, false), *rec = make_small(ops, p, true);
    if (plain && rec) {
        compare_recompute(plain, rec, p);
        gpt2_memory ma, mb;
        gpt2_memory_get(plain, &ma);
        gpt2_memory_get(rec, &mb);
        fprintf(stderr, "%s activations: %zu bytes, with recompute %zu\n", ddp_dtype_name(p),
                ma.activations, mb.activations);
        CHECK(mb.activations < ma.activations, "recompute keeps fewer activations");
        CHECK(mb.params == ma.params && mb.grads == ma.grads, "the same state");
    }
    gpt2_destroy(plain);
    gpt2_destroy(rec);
}

/* ---- training ------------------------------------------------------------------------------ */

/* 30 AdamW steps on one batch: the model memorises it. The loss is scaled by loss_scale in
 * backward and the gradients unscaled by the step (fp16's loss scaling). */
static void check_training(const ops_handle *ops, ddp_dtype p, float loss_scale)
{
    gpt2 *g = make(ops, tiny(100), p, 41);
    if (!g)
        return;
    int tokens[B * T], targets[B * T];
    make_batch(100, 19, tokens, targets);
    float first = 0.0f, last = 0.0f;
    optim *o = NULL;
    for (int s = 1; s <= 30; s++) {
        float loss = 0.0f;
        CHECK(gpt2_zero_grad(g) == DDP_OK, "zero_grad");
        CHECK(gpt2_forward(g, tokens, targets, B, T, &loss, true) == DDP_OK, "forward");
        CHECK(gpt2_backward(g, NULL, loss_scale) == DDP_OK, "backward");
        CHECK(test_adamw(g, &o, 3e-3f, 0.0f, s, 1.0f / loss_scale) == DDP_OK, "step");
        first = s == 1 ? loss : first;
        last = loss;
    }
    const char *name = ddp_dtype_name(p);
    fprintf(stderr, "%s: loss %.4f -> %.4f in 30 steps\n", name, first, last);
    CHECK(fabsf(first - logf(100.0f)) < 0.1f, "%s: first loss %g near ln 100", name, first);
    CHECK(last < 0.5f * first, "%s: loss %g -> %g did not halve", name, first, last);
    optim_destroy(o);
    gpt2_destroy(g);
}

int main(void)
{
    ops_handle *ops = NULL;
    if (ops_cpu_open(NULL, 1, false, &ops) != DDP_OK)
        return 1;
    if (ops_require_gpt(ops, "test_gpt2") != DDP_OK) {
        ops_close(ops);
        return 1;
    }
    check_layout(ops);
    check_init();
    check_init_loss(ops);
    check_gradients(ops);
    check_accumulation(ops);
    check_batch_consistency(ops);
    check_llmc(ops);
    check_adamw(ops);
    check_bf16_logits(ops);
    check_activations(ops);
    check_fused_ops(ops);
    check_fused_switches(ops);
    check_logits_switch(ops);
    check_master(ops);
    check_training(ops, DDP_FP32, 1.0f);
    check_training(ops, DDP_BF16, 1.0f);
    check_training(ops, DDP_FP16, 1024.0f);
    check_recompute(ops, DDP_FP32);
    check_recompute(ops, DDP_BF16);
    ops_close(ops);
    check_reducer();
    return CHECK_DONE();
}
