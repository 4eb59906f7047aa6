/* gpt2_dump.c - the C side of gpt2_vs_torch.sh: loads an llm.c model file and a batch file
 * (int32 B, T, then B*T inputs and B*T targets), and writes what gpt2_torch.py's "ref" writes:
 * float32 the mean loss, the flat gradient, then the flat parameters after --steps AdamW steps on
 * the same batch (betas 0.9, 0.95, eps 1e-8, weight decay on the 2-D weights, gradients clipped
 * by their global norm as torch.nn.utils.clip_grad_norm_ does).
 *
 * Usage: gpt2_dump --model M.bin --batch X.bin --out O.bin [--steps K] [--lr 1e-3] [--wd 0.1]
 *                  [--clip 1.0]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw_util.h"
#include "gpt2.h"

typedef struct dump_args {
    const char *model, *batch, *out;
    int steps;
    float lr, wd, clip;
} dump_args;

static int parse(int argc, char **argv, dump_args *a)
{
    *a = (dump_args){.lr = 1e-3f, .wd = 0.1f, .clip = 1.0f};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--model") == 0)
            a->model = v;
        else if (strcmp(k, "--batch") == 0)
            a->batch = v;
        else if (strcmp(k, "--out") == 0)
            a->out = v;
        else if (strcmp(k, "--steps") == 0)
            a->steps = atoi(v);
        else if (strcmp(k, "--lr") == 0)
            a->lr = strtof(v, NULL);
        else if (strcmp(k, "--wd") == 0)
            a->wd = strtof(v, NULL);
        else if (strcmp(k, "--clip") == 0)
            a->clip = strtof(v, NULL);
        else
            return -1;
    }
    return a->model && a->batch && a->out && argc % 2 == 1 && a->steps >= 0 ? 0 : -1;
}

/* Reads the batch file: *tokens and *targets (B*T each, malloc'ed). */
static int read_batch(const char *path, int *B, int *T, int **tokens, int **targets)
{
    FILE *f = fopen(path, "rb");
    int32_t bt[2];
    if (!f || fread(bt, sizeof bt, 1, f) != 1 || bt[0] < 1 || bt[1] < 1) {
        fprintf(stderr, "%s: cannot read the batch header\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    size_t n = (size_t)bt[0] * bt[1];
    *B = bt[0];
    *T = bt[1];
    *tokens = malloc(n * sizeof(int));
    *targets = malloc(n * sizeof(int));
    int ok = *tokens && *targets && fread(*tokens, sizeof(int), n, f) == n &&
             fread(*targets, sizeof(int), n, f) == n;
    fclose(f);
    if (!ok)
        fprintf(stderr, "%s: cannot read %zu tokens and targets\n", path, n);
    return ok ? 0 : -1;
}

/* Zeroed gradients, forward and backward on the batch; the mean loss. */
static ddp_status loss_and_grads(gpt2 *g, const int *tokens, const int *targets, int B, int T,
                                 float *loss)
{
    *loss = 0.0f;
    TRY_OK(gpt2_zero_grad(g));
    TRY_OK(gpt2_forward(g, tokens, targets, B, T, loss, true));
    return gpt2_backward(g, NULL, 1.0f);
}

/* PyTorch's clip_grad_norm_ factor: min(1, clip / (norm + 1e-6)), the norm summed in double. */
static float clip_scale(gpt2 *g, float clip)
{
    const float *gr = gpt2_grads(g);
    double s = 0.0;
    for (size_t i = 0; i < gpt2_numel_total(g); i++)
        s += (double)gr[i] * gr[i];
    double scale = clip / (sqrt(s) + 1e-6);
    printf("grad_norm %.7f\n", sqrt(s));
    return clip > 0.0f && scale < 1.0 ? (float)scale : 1.0f;
}

static ddp_status run(gpt2 *g, const dump_args *a, const int *tokens, const int *targets, int B,
                      int T, FILE *out)
{
    float loss;
    size_t n = gpt2_numel_total(g);
    TRY_OK(gpt2_llmc_load(g, a->model));
    TRY_OK(loss_and_grads(g, tokens, targets, B, T, &loss));
    printf("loss %.7f\n", loss);
    if (fwrite(&loss, sizeof loss, 1, out) != 1 || fwrite(gpt2_grads(g), sizeof(float), n, out) != n)
        return DDP_ERR_IO;
    optim *o = NULL;
    ddp_status st = DDP_OK;
    for (int t = 1; st == DDP_OK && t <= a->steps; t++) {
        if (t > 1)
            st = loss_and_grads(g, tokens, targets, B, T, &loss);
        if (st == DDP_OK)
            st = test_adamw(g, &o, a->lr, a->wd, t, clip_scale(g, a->clip));
        if (st == DDP_OK)
            printf("step %d: loss %.7f\n", t, loss);
    }
    optim_destroy(o);
    TRY_OK(st);
    if (a->steps > 0 && fwrite(gpt2_params(g), sizeof(float), n, out) != n)
        return DDP_ERR_IO;
    return DDP_OK;
}

int main(int argc, char **argv)
{
    dump_args a;
    gpt2_config cfg;
    int B = 0, T = 0, *tokens = NULL, *targets = NULL;
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: %s --model M.bin --batch X.bin --out O.bin [--steps K] [--lr LR] "
                        "[--wd WD] [--clip NORM]\n", argv[0]);
        return 2;
    }
    if (gpt2_llmc_read_config(a.model, &cfg) != DDP_OK ||
        read_batch(a.batch, &B, &T, &tokens, &targets) != 0)
        return 1;
    ops_handle *ops = NULL;
    gpt2 *g = NULL;
    gpt2_opts o = {.max_batch = B, .seq = T, .precision = DDP_FP32, .seed = 0};
    FILE *out = fopen(a.out, "wb");
    ddp_status st = out ? ops_cpu_open(NULL, 1, false, &ops) : DDP_ERR_IO;
    if (st == DDP_OK)
        st = gpt2_create(NULL, ops, &cfg, &o, &g);
    if (st == DDP_OK)
        st = run(g, &a, tokens, targets, B, T, out);
    if (out && fclose(out) != 0)
        st = DDP_ERR_IO;
    if (st != DDP_OK)
        fprintf(stderr, "gpt2_dump: %s\n", ddp_strerror(st));
    gpt2_destroy(g);
    ops_close(ops);
    free(tokens);
    free(targets);
    return st == DDP_OK ? 0 : 1;
}
