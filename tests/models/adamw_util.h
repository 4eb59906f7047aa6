/* adamw_util.h - the model tests' AdamW: ddp-train's optimizer (train/optim.h) over every element
 * of a GPT-2, weight decay on the 2-D weights (gpt2_param_decays), betas 0.9 and 0.95, eps 1e-8. */
#ifndef TEST_ADAMW_UTIL_H
#define TEST_ADAMW_UTIL_H

#include <stdlib.h>

#include "gpt2.h"
#include "optim.h"

/* One AdamW step of g's gradients; *o is created (weight decay wd) at its first use and is the
 * caller's to destroy. The failure of optim_create or optim_step. */
static inline ddp_status test_adamw(gpt2 *g, optim **o, float lr, float wd, int t, float scale)
{
    if (!*o) {
        int n = gpt2_n_params(g);
        bool *decays = malloc((size_t)n * sizeof *decays);
        if (!decays)
            return DDP_ERR_NOMEM;
        for (int i = 0; i < n; i++)
            decays[i] = gpt2_param_decays(g, i);
        optim_opts oo = {.kind = OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = wd, .decays = decays};
        optim_weights w = {.w = NULL, .seed = 7};
        w.w = gpt2_weights(g, &w.p);
        ddp_status st = optim_create(gpt2_ctx(g), gpt2_ops(g), &oo, gpt2_numel(g), n, NULL, &w, o);
        free(decays);
        TRY_OK(st);
    }
    return optim_step(*o, gpt2_grads(g), lr, t, scale);
}

#endif /* TEST_ADAMW_UTIL_H */
