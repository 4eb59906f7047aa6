/* train_gpt.h - ddp-train --model gpt2: GPT-2 on llm.c token shards with AdamW, learning-rate
 * warm-up and cosine decay, global-norm clipping, validation loss, checkpoints and sampling. */
#ifndef DDP_TRAIN_GPT_H
#define DDP_TRAIN_GPT_H

#include <signal.h>

#include "ddp.h"
#include "train_opts.h"

/* The stop requests the signal handlers set (SIGUSR1, SIGTERM), read at the ranks' agreements. */
typedef struct train_signals {
    volatile sig_atomic_t *usr1;
    volatile sig_atomic_t *term;
} train_signals;

/* The whole run on a joined context. Returns a failure only when every rank agrees on it; other
 * failures abort the job. *requeue: rank 0 should requeue the Slurm job. */
ddp_status train_gpt_run(ddp_ctx *ctx, const train_opts *o, train_signals sig, int *requeue);

#endif /* DDP_TRAIN_GPT_H */
