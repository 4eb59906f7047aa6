/* checkpoint_place.c - where ddp-train's checkpoints go, settled before training (see
 * checkpoint_place.h): libddp claims the folder (ddp_ckpt_dir_claim: length, lock, which ranks
 * see it), and the format follows.
 */
#include "checkpoint_place.h"

#include "ddp_checkpoint.h"

#include <stdio.h>

ddp_status checkpoint_place(ddp_ctx *ctx, train_opts *o)
{
    if (!o->checkpoint_dir)
        return DDP_OK;
    int world = ddp_world_size(ctx), look = o->checkpoint_format != TRAIN_CKPT_FILE;
    int64_t n_blind = 0;
    char ranks[128];
    ddp_status st = ddp_ckpt_dir_claim(ctx, o->checkpoint_dir, "--checkpoint-dir", look, &n_blind,
                                       ranks, sizeof ranks);
    if (st != DDP_OK)
        return st;
    o->checkpoint_folder = look && n_blind == 0;
    if (!look) { /* only rank 0 writes: nothing to look for */
        snprintf(o->checkpoint_why, sizeof o->checkpoint_why, "--checkpoint-format file");
    } else if (n_blind == 0) {
        if (o->checkpoint_format == TRAIN_CKPT_FOLDER)
            snprintf(o->checkpoint_why, sizeof o->checkpoint_why, "--checkpoint-format folder");
        else
            snprintf(o->checkpoint_why, sizeof o->checkpoint_why,
                     "every rank (%d) sees the folder", world);
    } else if (o->checkpoint_async || o->checkpoint_format == TRAIN_CKPT_FOLDER) {
        if (ddp_rank(ctx) == 0)
            DDP_ERROR("%s needs a --checkpoint-dir every rank sees (every rank writes its own file "
                      "there), but rank(s) %s do not see %s (a node-local path?): give a folder "
                      "on a shared file system, or --checkpoint-format file (rank 0 writes one "
                      "file)", o->checkpoint_async ? "--checkpoint-async"
                                                   : "--checkpoint-format folder",
                      ranks, o->checkpoint_dir);
        return DDP_ERR_INVALID_ARG;
    } else {
        snprintf(o->checkpoint_why, sizeof o->checkpoint_why,
                 "rank(s) %s do not see the folder (node-local?); on a shared folder every rank "
                 "would write its own file", ranks);
    }
    return DDP_OK;
}
