/* tokens.h - llm.c token shards: reading and checking them, the distributed training loader
 * (shuffled windows, exact resume) and the validation loader (every target token counted once).
 *
 * Shard format (llm.c's, docs/formats.md "Token shards"): a header of 256 little-endian int32,
 * header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = n_tokens (>= 0), the rest 0;
 * then n_tokens little-endian uint16 token ids. The file size is exactly 1024 + 2 * n_tokens.
 * A glob(3) pattern names the shards (llm.c's are '*_train_*.bin' and '*_val_*.bin' in a folder);
 * they are taken in the sorted order glob returns. Shards are mapped read-only (mmap), never read
 * whole, so they may be larger than memory.
 *
 * Training windows. With batch B and sequence T, a window is B*T + 1 consecutive tokens of one
 * shard: inputs are its first B*T tokens, targets the B*T tokens one further on (row b of the
 * (B, T) batch is inputs[b*T .. b*T + T)). Window k of a shard starts at token k*B*T, so
 * consecutive windows share one token and a shard of n tokens has floor((n - 1) / (B*T)) windows;
 * windows never cross shard boundaries, and the (n - 1) % (B*T) last targets of each shard are
 * not trained on. All windows of all shards, numbered shard by shard, form an epoch. Per epoch they
 * are permuted by ddp_sampler (seed, epoch; drop_last = 1: the permutation does not depend on the
 * world size, and its last n_windows % world entries are cut), and rank r takes positions
 * r, r + world, r + 2 * world, ... of the permutation: one window per step, steps per epoch =
 * floor(n_windows / world).
 *
 * Validation. The (n - 1) targets of each shard are cut into sequences of T targets (the last one
 * of a shard shorter when T does not divide n - 1); the sequences of all shards, numbered shard
 * by shard, are dealt to the ranks (sequence g goes to rank g % world). A rank's batches hold up to
 * B full-length sequences (rows of T), or one shorter tail sequence alone (1 row of t < T). Over
 * all ranks every target of every shard is in exactly one batch. The exact mean loss:
 *     each rank sums  loss_sum += mean_loss(batch) * b * t  and  n_sum += b * t  over its batches,
 *     then all-reduces both sums (DDP_SUM; fp64 is safest), and mean = loss_sum / n_sum;
 *     n_sum equals tokens_set_n_targets() of the validation set.
 * A rank may have fewer batches than another, or none: the loop has no collective inside.
 *
 * Token ids are checked against the caller's vocabulary size as windows and sequences are copied
 * (every id handed out is < vocab_size); tokens_set_scan() checks a whole set up front.
 * Errors are logged (DDP_ERROR) naming the file and the problem. Not thread-safe per object.
 */
#ifndef READERS_TOKENS_H
#define READERS_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "llmc_magic.h"

#define TOKENS_MAGIC LLMC_TOKENS_MAGIC
#define TOKENS_VERSION 1
#define TOKENS_HEADER_INTS 256
#define TOKENS_HEADER_BYTES (TOKENS_HEADER_INTS * 4)
#define TOKENS_EOT 50256 /* GPT-2's <|endoftext|>, which starts every document in llm.c's shards */

/* ---------------------------------------------------------------------------------------------
 * Shard sets.
 */
typedef struct tokens_set tokens_set;

typedef struct tokens_shard {
    const char *path;       /* as glob returned it; owned by the set */
    const uint16_t *tokens; /* (n_tokens,) mapped read-only; NULL when n_tokens is 0 */
    size_t n_tokens;
} tokens_shard;

/* Opens every file matching the glob(3) pattern (sorted) and checks each header and file size.
 * vocab_size (> 0, e.g. GPT2_VOCAB) bounds the token ids the loaders will hand out.
 * Returns DDP_ERR_IO when the pattern matches no file or a file cannot be opened, read or mapped,
 * DDP_ERR_FORMAT for a file shorter than the header, a bad magic or version, a negative count or a
 * size that disagrees with the header's count, DDP_ERR_INVALID_ARG for a NULL or empty pattern or
 * vocab_size outside [1, 65536], DDP_ERR_NOMEM. The message names the file. On failure *out is
 * NULL. */
ddp_status tokens_set_open(const char *pattern, int vocab_size, tokens_set **out);
/* The validation pattern that goes with a training pattern, as llm.c names its shards: the last
 * "train" in the pattern replaced by "val" ('DIR/x_train_*.bin' -> 'DIR/x_val_*.bin'), in a new
 * string (free() it). Returns DDP_ERR_INVALID_ARG (logged) when train_pattern is NULL or holds no
 * "train", DDP_ERR_NOMEM; on failure *out is NULL. */
ddp_status tokens_val_pattern(const char *train_pattern, char **out);
/* Unmaps and frees; NULL is ignored. Loaders made from the set must be destroyed first. */
void tokens_set_close(tokens_set *s);

/* The number of shards (0 for NULL), shard i (NULL when i is out of range). */
size_t tokens_set_n_shards(const tokens_set *s);
const tokens_shard *tokens_set_shard(const tokens_set *s, size_t i);
/* Sum of n_tokens over the shards (0 for NULL). */
size_t tokens_set_n_tokens(const tokens_set *s);
/* Sum over the shards of max(n_tokens - 1, 0): the targets the validation loader counts. */
size_t tokens_set_n_targets(const tokens_set *s);
/* The training windows of window_tokens - 1 targets each (B*T + 1 tokens, see above) the shards
 * hold: the sum over the shards of floor((n_tokens - 1) / (window_tokens - 1)); 0 for NULL or
 * window_tokens < 2. */
size_t tokens_set_n_windows(const tokens_set *s, size_t window_tokens);
/* The vocabulary size given to tokens_set_open (0 for NULL). */
int tokens_set_vocab(const tokens_set *s);

/* Reads every token of every shard (touches all pages: for data much larger than memory this is a
 * full read from disk) and checks each id against the vocabulary size. Returns DDP_ERR_FORMAT
 * naming the first bad file, token offset and value; DDP_ERR_INVALID_ARG for NULL. */
ddp_status tokens_set_scan(const tokens_set *s);

/* ---------------------------------------------------------------------------------------------
 * Training loader: one window (B*T + 1 tokens) per call, shuffled per epoch.
 */
typedef struct tokens_loader tokens_loader;

typedef struct tokens_loader_opts {
    int batch;      /* B >= 1 */
    int seq;        /* T >= 1 */
    int world_size; /* >= 1 */
    int rank;       /* [0, world_size) */
    uint64_t seed;  /* the permutation of epoch e comes from (seed, e) */
    int shuffle;    /* 0: windows in shard order each epoch (for tests), else permuted */
    int blocks_per_step; /* 0: rank r takes windows r, r + world, ...; else a step's windows over
                            all ranks, shared unevenly (ddp_sampler's blocks of one window) */
} tokens_loader_opts;

/* The position of a loader: the epoch and the number of windows (steps) this rank has taken in it.
 * Both are the same on every rank at the same step, so rank 0's is the checkpoint's. */
typedef struct tokens_pos {
    uint64_t epoch;
    uint64_t step; /* in [0, tokens_loader_steps_per_epoch()] */
} tokens_pos;

/* A loader over set (which must outlive it) at position (epoch 0, step 0).
 * Returns DDP_ERR_INVALID_ARG for NULL arguments, B or T < 1, B*T too large, a rank outside
 * [0, world_size), or when the shards hold fewer windows than there are ranks (the message gives
 * the counts and what to change); DDP_ERR_NOMEM. On failure *out is NULL. */
ddp_status tokens_loader_create(const tokens_set *set, const tokens_loader_opts *opts,
                                tokens_loader **out);
/* NULL is ignored. */
void tokens_loader_destroy(tokens_loader *l);

/* Windows per rank per epoch (0 for NULL); the same on every rank unless blocks_per_step shares
 * them unevenly. */
size_t tokens_loader_steps_per_epoch(const tokens_loader *l);
/* Windows in the epoch over all ranks before the cut (0 for NULL). */
size_t tokens_loader_n_windows(const tokens_loader *l);

/* Writes the next window's inputs (B*T) and targets (B*T), int32 in host memory, and advances the
 * position; after the epoch's last step the next call starts the next epoch at step 0.
 * Returns DDP_ERR_INVALID_ARG for NULL arguments, DDP_ERR_FORMAT (naming the file and offset) for
 * a token id >= the vocabulary size; on failure the position is unchanged (the outputs may be
 * partly written). */
ddp_status tokens_loader_next(tokens_loader *l, int32_t *inputs, int32_t *targets);

/* The fingerprint of the last window tokens_loader_next gave (sample_fp.h of its global window
 * index); 0 before the first, or for NULL. */
uint64_t tokens_loader_last_fp(const tokens_loader *l);
/* The position the next call of tokens_loader_next starts from. {0, 0} for NULL. */
tokens_pos tokens_loader_pos(const tokens_loader *l);
/* Moves to pos: the following calls produce exactly what a loader that reached pos by calls of
 * tokens_loader_next would produce. A step equal to steps_per_epoch means "end of that epoch".
 * Returns DDP_ERR_INVALID_ARG (position unchanged) for NULL or a step beyond steps_per_epoch. */
ddp_status tokens_loader_set_pos(tokens_loader *l, tokens_pos pos);

/* ---------------------------------------------------------------------------------------------
 * Validation loader: every target once over all ranks (see the top of this file).
 */
typedef struct tokens_val tokens_val;

/* A validation loader over set (which must outlive it) for this rank, at its first batch.
 * Returns DDP_ERR_INVALID_ARG for NULL arguments, batch or seq < 1, B*T too large or a rank outside
 * [0, world_size); DDP_ERR_NOMEM. A rank with no sequence is valid (it has 0 batches).
 * On failure *out is NULL. */
ddp_status tokens_val_create(const tokens_set *set, int batch, int seq, int world_size, int rank,
                             tokens_val **out);
/* NULL is ignored. */
void tokens_val_destroy(tokens_val *v);

/* This rank's batches per pass (may differ between ranks) and the targets they hold; 0 for NULL. */
size_t tokens_val_n_batches(const tokens_val *v);
size_t tokens_val_n_targets(const tokens_val *v);

/* Writes the next batch: *b rows of *t tokens, inputs and targets (b*t each, row-major (b, t);
 * room for B*T each), with 1 <= *b <= B and 1 <= *t <= T (*t < T only when *b == 1).
 * At the end of the pass writes *b = *t = 0 and returns DDP_OK (the next call starts a new pass).
 * Returns DDP_ERR_INVALID_ARG for NULL arguments, DDP_ERR_FORMAT (naming file and offset) for a
 * token id >= the vocabulary size (the pass stays at that batch). */
ddp_status tokens_val_next(tokens_val *v, int32_t *inputs, int32_t *targets, int *b, int *t);
/* Back to the first batch of the pass. NULL is ignored. */
void tokens_val_rewind(tokens_val *v);

#endif /* READERS_TOKENS_H */
