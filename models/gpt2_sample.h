/* gpt2_sample.h - text generation from a GPT-2 (gpt2.h): a prompt, then tokens drawn one at a
 * time from the last position's logits, at a temperature, optionally among the k most likely. */
#ifndef GPT2_SAMPLE_H
#define GPT2_SAMPLE_H

#include <stdint.h>

#include "gpt2.h"

typedef struct gpt2_sample_opts {
    int n_tokens;      /* tokens generated after the prompt */
    float temperature; /* the logits are divided by it; 0: the most likely token (greedy) */
    int top_k;         /* draw among the k largest logits (ties at the k-th included); 0: all */
    uint64_t seed;     /* the generator's seed: the same seed, prompt and model give the same text */
    int pad;           /* 1: every pass over `window` tokens, the real ones first and token 0
                          after them (causal: the last real row's logits are unchanged), as llm.c
                          samples, so a backend that plans per shape (cuDNN's attention) plans
                          once, not once per token; -1: over the real tokens only; 0 (the
                          default): 1 on a CUDA context, -1 elsewhere (the CPU plans nothing and
                          pays for every row) */
} gpt2_sample_opts;

/* seq[0..n_prompt) holds the prompt (n_prompt >= 1, ids < the vocabulary); writes o->n_tokens
 * more tokens after it (seq must hold n_prompt + o->n_tokens). Each comes from a forward pass
 * (B 1) over the last `window` tokens at most (window <= the model's opts.seq; padded to window
 * as o->pad says), through
 * tokens_dev, a backend buffer of `window` ints the caller owns. The vocabulary's padding rows
 * are never drawn. DDP_ERR_INVALID_ARG for bad arguments; a forward or copy failure as it is. */
ddp_status gpt2_sample(gpt2 *g, ddp_ctx *ctx, int *seq, int n_prompt, int window,
                       const gpt2_sample_opts *o, int *tokens_dev);

/* One draw from logits[0..V) (host memory) under temperature and top_k as above, with the
 * splitmix64 generator *rng; scratch holds V floats. */
int gpt2_sample_draw(const float *logits, int V, float temperature, int top_k, uint64_t *rng,
                     float *scratch);

#endif /* GPT2_SAMPLE_H */
