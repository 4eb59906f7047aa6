/* checkpoint_place.h - where ddp-train's checkpoints go, settled before training: the length of
 * --checkpoint-dir, its lock (one job per folder), which ranks see it, and so the format. */
#ifndef TRAIN_CHECKPOINT_PLACE_H
#define TRAIN_CHECKPOINT_PLACE_H

#include "ddp.h"
#include "train_opts.h"

/* Collective, before training, with --checkpoint-dir (nothing to do without one): refuses a path
 * longer than DDP_CKPT_DIR_MAX; rank 0 creates the folder and locks it for this process's life
 * (a second job on the same folder is refused, naming the job that holds it) and leaves a probe
 * file that every rank looks for. Then --checkpoint-format auto becomes a folder of per-rank files
 * when every rank sees the folder, else one file through rank 0; folder (and --checkpoint-async)
 * with a rank that does not see it is refused, naming the ranks. Sets o->checkpoint_folder and
 * o->checkpoint_why (the start-up line's reason). Every rank returns the same status: DDP_OK,
 * DDP_ERR_INVALID_ARG (refused, logged by rank 0 with the fix), DDP_ERR_IO. */
ddp_status checkpoint_place(ddp_ctx *ctx, train_opts *o);

#endif /* TRAIN_CHECKPOINT_PLACE_H */
