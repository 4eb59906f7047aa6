/* gpt2_sample.c - text generation from a GPT-2 (see gpt2_sample.h). */
#include "gpt2_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: a uniform double in [0, 1). */
static double next_uniform(uint64_t *rng)
{
    uint64_t z = (*rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* The k-th largest of a[0..n) (1 <= k <= n), found by quickselect; reorders a. */
static float kth_largest(float *a, int n, int k)
{
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot)
                i++;
            while (a[j] < pivot)
                j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return a[want];
    }
    return a[want];
}

int gpt2_sample_draw(const float *logits, int V, float temperature, int top_k, uint64_t *rng,
                     float *scratch)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        best = logits[i] > logits[best] ? i : best;
    double u = next_uniform(rng); /* drawn even when greedy: the sequence of draws stays aligned */
    if (temperature <= 0.0f)
        return best;
    float floor = -INFINITY;
    if (top_k > 0 && top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof *scratch);
        floor = kth_largest(scratch, V, top_k);
    }
    double max = logits[best], sum = 0.0, inv_t = 1.0 / temperature;
    for (int i = 0; i < V; i++)
        if (logits[i] >= floor)
            sum += exp((logits[i] - max) * inv_t);
    double acc = 0.0, target = u * sum;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (logits[i] < floor)
            continue;
        acc += exp((logits[i] - max) * inv_t);
        last = i;
        if (acc > target)
            return i;
    }
    return last;
}

ddp_status gpt2_sample(gpt2 *g, ddp_ctx *ctx, int *seq, int n_prompt, int window,
                       const gpt2_sample_opts *o, int *tokens_dev)
{
    if (!g || !seq || !o || !tokens_dev || n_prompt < 1 || window < 1 || o->n_tokens < 0 ||
        o->top_k < 0 || !(o->temperature >= 0.0f))
        return DDP_ERR_INVALID_ARG;
    const gpt2_config *c = gpt2_cfg(g);
    int V = c->vocab, Vp = c->padded_vocab;
    for (int i = 0; i < n_prompt; i++)
        if (seq[i] < 0 || seq[i] >= V)
            return DDP_ERR_INVALID_ARG;
    float *row = malloc((size_t)Vp * sizeof *row), *scratch = malloc((size_t)V * sizeof *scratch);
    ddp_status st = row && scratch ? DDP_OK : DDP_ERR_NOMEM;
    uint64_t rng = o->seed;
    bool pad = o->pad > 0 || (o->pad == 0 && ctx && ddp_backend(ctx) == DDP_BACKEND_CUDA);
    int *padded = pad ? calloc((size_t)window, sizeof *padded) : NULL; /* token 0 after the end */
    if (pad && !padded)
        st = DDP_ERR_NOMEM;
    for (int i = n_prompt; st == DDP_OK && i < n_prompt + o->n_tokens; i++) {
        int len = i < window ? i : window;
        const int *win = seq + i - len;
        if (pad) {
            memcpy(padded, win, (size_t)len * sizeof *win);
            win = padded;
        }
        st = ddp_upload(ctx, tokens_dev, win, (size_t)(pad ? window : len) * sizeof *win);
        if (st == DDP_OK)
            st = gpt2_forward(g, tokens_dev, NULL, 1, pad ? window : len, NULL, false);
        if (st == DDP_OK)
            st = gpt2_logits_get(g, (size_t)len - 1, 1, row);
        if (st == DDP_OK)
            seq[i] = gpt2_sample_draw(row, V, o->temperature, o->top_k, &rng, scratch);
    }
    free(row);
    free(scratch);
    free(padded);
    return st;
}
