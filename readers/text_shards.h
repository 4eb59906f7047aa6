/* text_shards.h - a user's text (a file, or a folder of files) turned into llm.c token shards
 * (tokens.h) with GPT-2's BPE (bpe.h): the work of ddp-tokenize (tools/ddp_tokenize.c).
 *
 * Documents. A file is one document; a folder's files (all of its tree, hidden names skipped) are
 * documents in the byte order of their paths; empty files, links to folders and outdir (when it is
 * inside the folder) are skipped. Every file must be UTF-8
 * (a leading byte-order mark is dropped); with latin1 every byte is read as ISO-8859-1 and turned
 * into UTF-8. In the shards every document is preceded by <|endoftext|> (50256), as in llm.c's.
 *
 * Validation split, deterministic (the same input gives the same bytes), a part of every file so
 * that validation holds every kind of text there is: each document is cut after the first newline
 * at or after val_fraction of its bytes that leaves text after it (or, when there is none, after
 * the last newline before), the first part validation and the second training, each a document of
 * its own. A document with no such cut (a single line) goes whole to one side: the j-th of them
 * (0-based, in path order) to validation when round((j + 1) F) > round(j F) for F = val_fraction,
 * which spreads about F of them through the order (and, when no document could be cut and the
 * rule picks none, the last of them); a single such document alone is refused. A warning says
 * when the validation set comes from one file of several that is under a tenth of the text.
 * The validation parts are written first (NAME_val_*), then the training parts, in path order.
 *
 * Output in outdir (created when missing): NAME_val_000000.bin (then _000001 ... when the
 * validation tokens fill more than one shard), then NAME_train_NNNNNN.bin numbered on, at most
 * shard_tokens tokens each (documents run on across shards, as in llm.c), and GPT-2's encoder.json
 * and vocab.bpe copied beside them (ddp-train --sample reads encoder.json there). Everything is
 * written into a hidden folder in outdir first and renamed into place at the end, so a failed run
 * leaves no shard and no vocabulary file behind (and removes outdir when it created it).
 */
#ifndef READERS_TEXT_SHARDS_H
#define READERS_TEXT_SHARDS_H

#include <stddef.h>

#include "ddp.h"

typedef struct text_shards_opts {
    const char *name;      /* shard prefix, e.g. "text": [A-Za-z0-9._-]+ */
    const char *vocab_dir; /* holds GPT-2's encoder.json and vocab.bpe */
    double val_fraction;   /* in (0, 0.5] */
    size_t shard_tokens;   /* the most tokens in one shard, >= 2 (llm.c: 100,000,000) */
    int latin1;            /* 1: the input is ISO-8859-1, converted to UTF-8 */
} text_shards_opts;

#define TEXT_SHARDS_TOP 5 /* the most frequent tokens reported */

/* One of the most frequent tokens: its id, count and text, escaped for a terminal (\n, \t, \r,
 * \\ and other control bytes as \xHH). */
typedef struct text_shards_top {
    int id;
    size_t n;
    char text[64];
} text_shards_top;

typedef struct text_shards_result {
    size_t n_docs;                     /* documents (files) */
    size_t n_val_docs;                 /* documents with a validation part ... */
    size_t n_val_whole;                /* ... of which whole (too short to cut at a line) */
    size_t val_bytes, train_bytes;     /* of UTF-8 text */
    size_t val_tokens, train_tokens;   /* <|endoftext|> included */
    int n_val_shards, n_train_shards;  /* val shards numbered from 0, train shards on from there */
    text_shards_top top[TEXT_SHARDS_TOP]; /* the most frequent tokens, most first (n 0: unused) */
} text_shards_result;

/* Tokenises input (a file or a folder) into outdir as described above and fills *r.
 * Returns, each logged (DDP_ERROR) naming the path, the problem and the fix: DDP_ERR_INVALID_ARG
 * for bad options, a missing input, an input without text, outdir not a folder or already holding
 * shards named NAME, too little text for a validation split; DDP_ERR_FORMAT for a file that is not
 * UTF-8 (with the byte offset and line); DDP_ERR_IO for the vocabulary files missing or a failed
 * read or write; DDP_ERR_NOMEM. On failure nothing is left in outdir. */
ddp_status text_shards_make(const char *input, const char *outdir, const text_shards_opts *o,
                            text_shards_result *r);

#endif /* READERS_TEXT_SHARDS_H */
