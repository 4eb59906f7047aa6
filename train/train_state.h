/* train_state.h - ddp-train's checkpoints: the whole training state (parameters, the optimizer's
 * buffers, the loss scale, position, configuration fingerprint) as one file or as a folder of one
 * file per rank (--checkpoint-format), kept in --checkpoint-dir by libddp's checkpoint manager
 * (step-N names, the newest --keep), writability checks before training, and resuming (from a
 * file, rank 0 reads and every rank receives; from a folder, every rank reads its own ranges).
 */
#ifndef TRAIN_STATE_H
#define TRAIN_STATE_H

#include <stddef.h>

#include "ddp.h"
#include "optim.h"
#include "train_opts.h"

/* Where training stands: the counters a checkpoint records besides the buffers. */
typedef struct train_pos {
    long step;          /* optimizer steps done since the start of training */
    long epoch;         /* epoch in progress */
    long step_in_epoch; /* optimizer steps done in that epoch */
} train_pos;

/* The buffers a checkpoint holds, the optimizer's (optim_buffers), all of the model's flat layout
 * and in backend memory: "params", the fp32 master weights, then SGD's "momentum" or AdamW's
 * "adam_m", "adam_v". */
#define TRAIN_MAX_OPT_BUFS OPTIM_MAX_BUFS
typedef struct train_buffers {
    const ddp_param_desc *descs;
    int n_params;
    size_t numel;             /* elements of the flat parameter buffer */
    int n_opt;
    const char *opt_names[TRAIN_MAX_OPT_BUFS];
    float *opt[TRAIN_MAX_OPT_BUFS];
    /* The buffers hold elements [opt_offset, opt_offset + opt_n) of the flat layout: (0, numel)
     * unless --zero shards them over the ranks (ddp_shard_range's shard). */
    size_t opt_offset, opt_n;
    char model_fp[96];        /* the model's configuration, e.g. "mlp 784-512-256-10" */
    ddp_dtype precision;      /* its compute precision (the fingerprint's config.precision) */
} train_buffers;

/* A failure only this rank may have seen (a collective's, a transfer's): stops the whole job, so
 * that no peer waits forever, logging `what` failed and why. Nothing for DDP_OK. */
void train_must(ddp_ctx *ctx, ddp_status st, const char *what);

/* A global batch fixed by a flag (--global-batch, --total-batch-tokens): the micro-steps follow
 * the world size, the samples per step do not, so a resume at another world size keeps the steps.
 * flag NULL: none (the global batch is the ranks' batches and micro-steps). */
typedef struct train_fixed_batch {
    const char *flag; /* e.g. "global-batch"; its fingerprint entry: config.<flag, '-' as '_'> */
    long value;
    const char *unit; /* what it counts, e.g. "samples" */
} train_fixed_batch;

/* What the state functions need to know about the run. */
typedef struct train_setup {
    ddp_ctx *ctx;
    const train_opts *o;
    train_buffers buf;
    size_t n_train;        /* training samples (GPT-2: windows of the token shards) */
    long steps_per_epoch;  /* optimizer steps per epoch */
    long total_steps;      /* planned optimizer steps (the cosine schedule's length) */
    int accum;             /* micro-steps per optimizer step */
    train_fixed_batch fixed;
    ddp_scaler *scaler;    /* the loss scaler (fp16), NULL without one: its state is saved */
    /* The learning rate at step over a plan of total_steps (a resume that changes the plan says
     * what it does to the rate); NULL: not said. */
    double (*lr)(void *lr_arg, long step, long total_steps);
    void *lr_arg;
} train_setup;

/* Rank 0, before training (--checkpoint-dir is checkpoint_place's): the folders of --save and
 * --trace must accept a new file, and the --save and --trace files must be new or
 * regular files (a symbolic link is followed); so must the task's own n output files paths[i]
 * (NULL: none), named in messages by flags[i]. DDP_ERR_IO or DDP_ERR_INVALID_ARG, logged with the
 * path, the reason and the fix. */
ddp_status train_check_outputs(const train_opts *o, const char *const *flags,
                               const char *const *paths, int n);

/* Collective (every rank calls it): rank 0 writes the whole training state at pos to path
 * (atomic), the optimizer buffers gathered from every rank's shard under --zero. Rank 0:
 * DDP_ERR_IO on a failed save (the previous file stays), DDP_ERR_NOMEM, or a download failure;
 * the other ranks DDP_OK (a failed gather stops the job). */
ddp_status train_save_state(const train_setup *s, const train_pos *pos, const char *path);

/* The optimizer's buffers, names and range in b (its parameter fields untouched). */
void train_buffers_of_optim(optim *opt, train_buffers *b);

/* Collective: rank 0 writes DIR/step-<12 digits>.ckpt for pos (--checkpoint-format folder: every
 * rank writes its file into that folder, rank 0 the MANIFEST last), then keeps only the newest
 * --keep ones and removes folders left without a MANIFEST. Errors as train_save_state; with
 * folders every rank returns its own write's outcome (rank 0 also fails when another rank did). */
ddp_status train_checkpoint(const train_setup *s, const train_pos *pos);

/* Collective, after the model is built: with --checkpoint-async, every rank allocates the staging
 * copy its saves reuse (rank 0 says its size). With --resume, rank 0 finds and checks the
 * checkpoint; every rank receives the position and loss scale from rank 0, and the parameters and
 * optimizer buffers from rank 0 (a file) or by reading its own ranges (a folder). *pos is zero and
 * *resumed 0 for a fresh start. Returns the same status on every rank: DDP_ERR_MISMATCH for a
 * checkpoint of another configuration (each difference logged), DDP_ERR_FORMAT/IO for an unusable
 * --resume FILE or when every checkpoint in the folder is corrupt. Failures of the collectives
 * abort the job. */
ddp_status train_resume(const train_setup *s, train_pos *pos, int *resumed);

/* Elastic (--snapshot-dir): after the resume at pos, removes the node's rescue snapshots (local
 * rank 0), arms libddp's rescue (ddp_rescue_arm) when the state is whole on every rank (--zero 0,
 * the CPU), and rank 0 says which. train_rescue_release: the state is settled at pos (after
 * ddp_rescue_hold and an update). */
void train_rescue_arm(const train_setup *s, const train_pos *pos);
void train_rescue_release(const train_pos *pos);

/* No collective (at exit the other ranks may be gone): waits for a checkpoint written in the
 * background (this rank's file; rank 0's MANIFEST once the other files are there) and closes
 * --checkpoint-dir's manager. Also registered with atexit; a second call does nothing. */
void train_checkpoints_end(void);

#endif /* TRAIN_STATE_H */
