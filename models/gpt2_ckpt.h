/* gpt2_ckpt.h - a GPT-2's ddp checkpoint read as a model: its configuration (from the fingerprint
 * text config.model and the signature) and its parameters, from a checkpoint file or folder. For
 * ddp-train --init-from (weights only) and ddp-ckpt export-llmc.
 */
#ifndef MODELS_GPT2_CKPT_H
#define MODELS_GPT2_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "gpt2.h"

typedef struct gpt2_ckpt {
    gpt2_config cfg;        /* the model's sizes, padded_vocab from wte's rows */
    uint64_t step;          /* optimizer steps done when it was written (0 when not recorded) */
    int folder;             /* 1: a checkpoint folder (--checkpoint-format folder) */
    ddp_param_desc *descs;  /* n_params: the signature */
    int n_params;
    float *params;          /* numel: the flat parameter buffer (llm.c's layout), host memory */
    size_t numel;
} gpt2_ckpt;

/* 1 when path is a ddp checkpoint: a file that starts with the checkpoint magic, or a checkpoint
 * folder (with a MANIFEST, or what an interrupted save left: named step-N.ckpt, or holding a rank's
 * file, which gpt2_ckpt_read then refuses with the fix); else 0 (an llm.c model file, or anything
 * else, which its reader then names: a FIFO or other special file is not read). */
int gpt2_ckpt_is_ddp(const char *path);

/* Reads the checkpoint at path (a file, or a folder whose files' CRC-32 are all checked first
 * unless verify is 0: ddp-ckpt --no-verify) into *c; `flag` starts the messages (e.g.
 * "--init-from"). DDP_ERR_IO, DDP_ERR_FORMAT (corrupt, a folder without a MANIFEST, or not a
 * GPT-2's checkpoint: the log says which and the fix), DDP_ERR_NOMEM. *c is zeroed on failure. */
ddp_status gpt2_ckpt_read(const char *path, const char *flag, int verify, gpt2_ckpt *c);

/* 1 when the checkpoint's signature is the model's (names and shapes, in order); otherwise logs
 * the first difference (prefixed by flag and path) and returns 0. */
int gpt2_ckpt_same_signature(const gpt2_ckpt *c, const ddp_param_desc *descs, int n_params,
                            const char *flag, const char *path);

void gpt2_ckpt_free(gpt2_ckpt *c);

#endif /* MODELS_GPT2_CKPT_H */
