/* test_gpt2_cuda.c - GPT-2 (gpt2.h) on the CUDA backend against the CPU backend (the oracle):
 * the same seed and batch, then the loss, every gradient and the losses of 3 AdamW steps, in
 * fp32, bf16 and fp16 (fp16 with the loss scaled by 1024). Exits 77 (skipped) without a usable GPU
 * or CUDA build.
 *
 * Gradients are compared by relative L2 distance, ||gpu - cpu|| / ||cpu||, as the MNIST models'
 * parity tests do: fp32 1e-4 per parameter slice (summation orders differ: about 1e-6 expected);
 * the 16-bit precisions over the whole gradient, bf16 2^-4 and fp16 2^-7 (each side rounds the
 * matmul inputs to 16 bits after fp32 sums that differ in their last bits, so single roundings
 * flip an ulp apart and the differences grow through the layers). Losses: fp32 1e-5 relative,
 * bf16 1e-2, fp16 2e-3. bf16 also with head size 64 (2 heads of 128 channels), where the GPU's
 * attention is the fused kernel, and again on cuDNN's fused attention (DDP_CUDA_ATTENTION=cudnn;
 * reported and left out in a build without cuDNN): the model's use of each path, with bf16's
 * tolerances.
 */
#include <string.h>

#include "adamw_util.h"
#include "gpt2.h"
#include "testutil.h"

enum { B = 2, T = 16, V = 300 };

typedef struct prec {
    ddp_dtype p;
    float loss_scale;
    double loss_rtol, grad_rtol; /* see the top */
    int heads;                   /* 0: 4 heads of 16 (64 channels); else heads of 64 */
    bool cudnn;                  /* cuDNN's fused attention on the GPU */
} prec;

static const prec precs[] = {
    {DDP_FP32, 1.0f, 1e-5, 1e-4, 0, false},
    {DDP_BF16, 1.0f, 1e-2, 1.0 / 16, 0, false},
    {DDP_FP16, 1024.0f, 2e-3, 1.0 / 128, 0, false},
    {DDP_BF16, 1.0f, 1e-2, 1.0 / 16, 2, false},
    {DDP_BF16, 1.0f, 1e-2, 1.0 / 16, 2, true},
};

/* One side: the model, the batch and the loss accumulator in the backend's memory. */
typedef struct side {
    ddp_ctx *ctx;
    gpt2 *g;
    int *tokens, *targets; // (B, T)
    float *loss;           // (1)
    float *grads;          // (numel_total) host copy
} side;

static int open_side(side *s, ddp_ctx *ctx, const ops_handle *ops, const prec *pr,
                     const int *tokens, const int *targets)
{
    gpt2_config cfg = {.max_seq = T, .vocab = V, .layers = 2, .heads = pr->heads ? pr->heads : 4,
                       .channels = pr->heads ? 64 * pr->heads : 64};
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = pr->p, .seed = 77};
    size_t n_tok = (size_t)B * T * sizeof(int);
    *s = (side){.ctx = ctx};
    CHECK(gpt2_create(ctx, ops, &cfg, &o, &s->g) == DDP_OK, "gpt2_create on %s", ops->name);
    s->tokens = ddp_alloc(ctx, n_tok);
    s->targets = ddp_alloc(ctx, n_tok);
    s->loss = ddp_alloc(ctx, sizeof(float));
    if (!s->g || !s->tokens || !s->targets || !s->loss)
        return -1;
    s->grads = test_floats(gpt2_numel_total(s->g));
    CHECK(ddp_upload(ctx, s->tokens, tokens, n_tok) == DDP_OK &&
          ddp_upload(ctx, s->targets, targets, n_tok) == DDP_OK, "upload the batch");
    return 0;
}

static void close_side(side *s)
{
    gpt2_destroy(s->g);
    ddp_free(s->ctx, s->tokens);
    ddp_free(s->ctx, s->targets);
    ddp_free(s->ctx, s->loss);
    free(s->grads);
}

/* Zeroed gradients, forward, backward; the loss returned, the gradients copied to the host. */
static float step(side *s, const prec *pr)
{
    float zero = 0.0f, loss = NAN;
    CHECK(ddp_upload(s->ctx, s->loss, &zero, sizeof zero) == DDP_OK, "zero the loss");
    CHECK(gpt2_zero_grad(s->g) == DDP_OK, "zero_grad");
    CHECK(gpt2_forward(s->g, s->tokens, s->targets, B, T, s->loss, true) == DDP_OK, "forward");
    CHECK(gpt2_backward(s->g, NULL, pr->loss_scale) == DDP_OK, "backward");
    CHECK(ddp_download(s->ctx, &loss, s->loss, sizeof loss) == DDP_OK, "loss");
    CHECK(ddp_download(s->ctx, s->grads, gpt2_grads(s->g),
                       gpt2_numel_total(s->g) * sizeof(float)) == DDP_OK, "grads");
    return loss;
}

/* ||a - b|| / ||b|| over n elements (0 when both are 0). */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0.0 ? sqrt(d / r) : sqrt(d);
}

static void compare_grads(const side *gpu, const side *cpu, const prec *pr, const char *name)
{
    if (pr->p != DDP_FP32) {
        double e = rel_l2(gpu->grads, cpu->grads, gpt2_numel_total(cpu->g));
        CHECK(e <= pr->grad_rtol, "%s: gradients %.3g apart (relative L2)", name, e);
        return;
    }
    size_t off = 0;
    for (int i = 0; i < gpt2_n_params(cpu->g); off += gpt2_numel(cpu->g)[i], i++) {
        double e = rel_l2(gpu->grads + off, cpu->grads + off, gpt2_numel(cpu->g)[i]);
        CHECK(e <= pr->grad_rtol, "fp32: %s's gradient %.3g apart", gpt2_descs(cpu->g)[i].name, e);
    }
}

static void check_precision(ddp_ctx *ctx, ops_handle *gpu_ops, const ops_handle *cpu_ops,
                            const prec *pr, const int *tokens, const int *targets)
{
    side gpu = {0}, cpu = {0};
    const char *name = pr->cudnn ? "bf16, hs 64, cuDNN attention"
                       : pr->heads ? "bf16, hs 64" : ddp_dtype_name(pr->p);
    if (pr->cudnn && ops_cuda_set_attention_cudnn(gpu_ops, true) != DDP_OK) {
        printf("%s: skipped (this build has no cuDNN)\n", name);
        return;
    }
    if (open_side(&gpu, ctx, gpu_ops, pr, tokens, targets) == 0 &&
        open_side(&cpu, NULL, cpu_ops, pr, tokens, targets) == 0) {
        optim *og = NULL, *oc = NULL;
        for (int t = 1; t <= 3; t++) {
            float lg = step(&gpu, pr), lc = step(&cpu, pr);
            fprintf(stderr, "%s step %d: loss gpu %.7f cpu %.7f\n", name, t, lg, lc);
            CHECK_CLOSE(lg, lc, 0.0, pr->loss_rtol, name);
            if (t == 1)
                compare_grads(&gpu, &cpu, pr, name);
            CHECK(test_adamw(gpu.g, &og, 1e-3f, 0.1f, t, 1.0f / pr->loss_scale) == DDP_OK &&
                  test_adamw(cpu.g, &oc, 1e-3f, 0.1f, t, 1.0f / pr->loss_scale) == DDP_OK,
                  "adamw");
        }
        optim_destroy(og);
        optim_destroy(oc);
    }
    close_side(&gpu);
    close_side(&cpu);
    ops_cuda_set_attention_cudnn(gpu_ops, false);
}

int main(void)
{
    ddp_ctx *ctx = NULL;
    ops_handle *gpu = NULL, *cpu = NULL;
    int rc = test_cuda_open("test_gpt2_cuda", &ctx, &gpu, &cpu);
    if (rc != 0)
        return rc;
    int tokens[B * T], targets[B * T];
    test_rng r = {99};
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int)(test_uniform(&r) * V);
        targets[i] = (int)(test_uniform(&r) * V);
    }
    for (size_t i = 0; i < sizeof precs / sizeof precs[0]; i++)
        check_precision(ctx, gpu, cpu, &precs[i], tokens, targets);
    test_cuda_close(ctx, gpu, cpu);
    return CHECK_DONE();
}
