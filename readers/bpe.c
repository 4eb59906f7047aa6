/* bpe.c - GPT-2's encoder.json read by a small JSON parser for its one shape (a flat object of
 * string -> integer), token strings mapped back through GPT-2's byte alphabet; or llm.c's
 * gpt2_tokenizer.bin, which holds each token's bytes as they are (bpe.h). Also the whole-file read
 * the encoder (bpe_encode.c) and the shard writer use; this file calls neither.
 */
#include "bpe.h"
#include "llmc_magic.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BPE_MAX_ID 1000000
#define LLMC_TOKENIZER_HEADER 256      /* u32 header words: magic, version 1|2, vocab size, EOT */

typedef struct bpe_token {
    size_t off; /* into pool */
    uint32_t len;
    int defined;
} bpe_token;

struct bpe_vocab {
    uint8_t *pool; /* every token's bytes, back to back */
    size_t pool_len, pool_cap;
    bpe_token *tok; /* (cap,) indexed by id */
    int cap;
    int size; /* largest id + 1 */
};

/* The parser's input: text[0..n) of the file at path. */
typedef struct json_in {
    const char *text;
    size_t n, at;
    const char *path;
} json_in;

void bpe_alphabet_inverse(int cp_to_byte[BPE_ALPHABET])
{
    for (int c = 0; c < BPE_ALPHABET; c++)
        cp_to_byte[c] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        cp_to_byte[printable ? b : 256 + extra++] = b;
    }
}

static ddp_status json_fail(const json_in *in, const char *what)
{
    DDP_ERROR("%s: byte %zu: %s (a GPT-2 encoder.json is one JSON object of token string -> id)",
              in->path, in->at, what);
    return DDP_ERR_FORMAT;
}

static void json_ws(json_in *in)
{
    while (in->at < in->n && strchr(" \t\r\n", in->text[in->at]) && in->text[in->at])
        in->at++;
}

/* Consumes character c after white space; 1 when it was there. */
static int json_eat(json_in *in, char c)
{
    json_ws(in);
    if (in->at < in->n && in->text[in->at] == c) {
        in->at++;
        return 1;
    }
    return 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads one escape after the backslash into *cp; -1 when malformed. */
static int json_escape(json_in *in, long *cp)
{
    static const char plain[] = "\"\\/bfnrt", value[] = "\"\\/\b\f\n\r\t";
    if (in->at >= in->n)
        return -1;
    char c = in->text[in->at++];
    const char *k = c ? strchr(plain, c) : NULL;
    if (k) {
        *cp = (unsigned char)value[k - plain];
        return 0;
    }
    if (c != 'u' || in->n - in->at < 4)
        return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(in->text[in->at++]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    *cp = v;
    return 0;
}

/* Reads one code point of a string (raw UTF-8 up to two bytes, or an escape) into *cp.
 * Returns 0, 1 at the closing quote, -1 when malformed; a longer UTF-8 sequence gives a code
 * point above the alphabet (caught by the caller). */
static int json_char(json_in *in, long *cp)
{
    if (in->at >= in->n)
        return -1;
    unsigned char c = (unsigned char)in->text[in->at++];
    if (c == '"')
        return 1;
    if (c == '\\')
        return json_escape(in, cp);
    if (c < 0x20)
        return -1;
    if (c < 0x80 || c >= 0xE0) {
        *cp = c < 0x80 ? c : 0x10000; /* 3- and 4-byte sequences are outside the alphabet */
        return 0;
    }
    if (c < 0xC0 || in->at >= in->n || ((unsigned char)in->text[in->at] & 0xC0) != 0x80)
        return -1;
    *cp = ((long)(c & 0x1F) << 6) | ((unsigned char)in->text[in->at++] & 0x3F);
    return 0;
}

static int pool_push(bpe_vocab *v, uint8_t byte)
{
    if (v->pool_len == v->pool_cap) {
        size_t cap = v->pool_cap ? 2 * v->pool_cap : 1 << 16;
        uint8_t *p = realloc(v->pool, cap);
        if (!p)
            return -1;
        v->pool = p;
        v->pool_cap = cap;
    }
    v->pool[v->pool_len++] = byte;
    return 0;
}

/* Reads a token string (after its opening quote) into the pool as bytes. */
static ddp_status json_token(json_in *in, bpe_vocab *v, const int *cp_to_byte)
{
    for (;;) {
        long cp = 0;
        int r = json_char(in, &cp);
        if (r == 1)
            return DDP_OK;
        if (r < 0)
            return json_fail(in, "malformed string");
        if (cp >= BPE_ALPHABET || cp_to_byte[cp] < 0)
            return json_fail(in, "a code point outside GPT-2's byte alphabet");
        if (pool_push(v, (uint8_t)cp_to_byte[cp]) != 0)
            return DDP_ERR_NOMEM;
    }
}

/* Reads a non-negative integer id. */
static ddp_status json_id(json_in *in, long *id)
{
    json_ws(in);
    size_t digits = 0;
    long x = 0;
    while (in->at < in->n && in->text[in->at] >= '0' && in->text[in->at] <= '9') {
        x = x * 10 + (in->text[in->at++] - '0');
        if (x > BPE_MAX_ID)
            return json_fail(in, "an id above 1,000,000");
        digits++;
    }
    if (!digits)
        return json_fail(in, "expected a non-negative integer id");
    *id = x;
    return DDP_OK;
}

/* Records token id as the bytes pool[off..pool_len). */
static ddp_status vocab_set(json_in *in, bpe_vocab *v, long id, size_t off)
{
    if (id >= v->cap) {
        int cap = v->cap ? v->cap : 1024;
        while (cap <= id)
            cap *= 2;
        bpe_token *t = realloc(v->tok, (size_t)cap * sizeof *t);
        if (!t)
            return DDP_ERR_NOMEM;
        memset(t + v->cap, 0, (size_t)(cap - v->cap) * sizeof *t);
        v->tok = t;
        v->cap = cap;
    }
    if (v->tok[id].defined)
        return json_fail(in, "an id given to two tokens");
    v->tok[id] = (bpe_token){off, (uint32_t)(v->pool_len - off), 1};
    if (id >= v->size)
        v->size = (int)id + 1;
    return DDP_OK;
}

/* Parses the whole object. */
static ddp_status json_parse(json_in *in, bpe_vocab *v)
{
    int cp_to_byte[BPE_ALPHABET];
    bpe_alphabet_inverse(cp_to_byte);
    if (!json_eat(in, '{'))
        return json_fail(in, "expected '{'");
    if (json_eat(in, '}'))
        return json_fail(in, "an empty object");
    do {
        long id = 0;
        size_t off = v->pool_len;
        if (!json_eat(in, '"'))
            return json_fail(in, "expected a token string");
        ddp_status rc = json_token(in, v, cp_to_byte);
        if (rc == DDP_OK && !json_eat(in, ':'))
            rc = json_fail(in, "expected ':'");
        if (rc == DDP_OK)
            rc = json_id(in, &id);
        if (rc == DDP_OK)
            rc = vocab_set(in, v, id, off);
        if (rc != DDP_OK)
            return rc;
    } while (json_eat(in, ','));
    if (!json_eat(in, '}'))
        return json_fail(in, "expected ',' or '}'");
    json_ws(in);
    return in->at == in->n ? DDP_OK : json_fail(in, "text after the object");
}

/* llm.c's tokenizer file (tokenizer.h, dev/data/tokenizer.py): 256 little-endian u32 (magic
 * 20240328, version 1 or 2, the vocabulary size, in version 2 the EOT id), then per token a u8
 * length (1..255) and that many bytes. */
static ddp_status llmc_fail(const char *path, size_t at, const char *what)
{
    DDP_ERROR("%s: byte %zu: %s (llm.c's gpt2_tokenizer.bin: a 1024-byte header, magic 20240328, "
              "then per token a length byte and the token's bytes)", path, at, what);
    return DDP_ERR_FORMAT;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static ddp_status llmc_parse(const char *path, const unsigned char *b, size_t n, bpe_vocab *v)
{
    size_t at = 4 * LLMC_TOKENIZER_HEADER;
    if (n < at)
        return llmc_fail(path, n, "shorter than the header");
    uint32_t version = le32(b + 4), size = le32(b + 8);
    if (version != 1 && version != 2)
        return llmc_fail(path, 4, "version not 1 or 2");
    if (size == 0 || size > BPE_MAX_ID)
        return llmc_fail(path, 8, "a vocabulary size of 0 or above 1,000,000");
    json_in where = {NULL, n, 0, path}; /* vocab_set's complaint names the file */
    for (uint32_t id = 0; id < size; id++) {
        if (at >= n)
            return llmc_fail(path, at, "ends before the last token");
        size_t len = b[at++], off = v->pool_len;
        if (len == 0)
            return llmc_fail(path, at - 1, "a token of length 0");
        if (len > n - at)
            return llmc_fail(path, at, "ends inside a token");
        for (size_t i = 0; i < len; i++)
            if (pool_push(v, b[at + i]) != 0)
                return DDP_ERR_NOMEM;
        at += len;
        where.at = at;
        ddp_status rc = vocab_set(&where, v, (long)id, off);
        if (rc != DDP_OK)
            return rc;
    }
    return at == n ? DDP_OK : llmc_fail(path, at, "bytes after the last token");
}

/* Reads the whole file at path into *text (*n bytes; free() it). DDP_ERR_IO (logged) or
 * DDP_ERR_NOMEM. */
ddp_status bpe_read_file(const char *path, uint8_t **text, size_t *n)
{
    *text = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        DDP_ERROR("%s: cannot open: %s", path, strerror(errno));
        return DDP_ERR_IO;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        uint8_t *p = realloc(buf, cap * 2);
        if (!p)
            free(buf);
        buf = p;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf)
        return DDP_ERR_NOMEM;
    if (err) {
        DDP_ERROR("%s: read error (a folder?)", path);
        free(buf);
        return DDP_ERR_IO;
    }
    *text = buf;
    *n = len;
    return DDP_OK;
}

ddp_status bpe_vocab_load(const char *path, bpe_vocab **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!path)
        return DDP_ERR_INVALID_ARG;
    char *text = NULL;
    size_t n = 0;
    ddp_status rc = bpe_read_file(path, (uint8_t **)&text, &n);
    if (rc == DDP_ERR_IO)
        DDP_ERROR("%s: GPT-2's vocabulary (encoder.json or llm.c's gpt2_tokenizer.bin) is needed here; "
                  "scripts/fetch-text.sh and scripts/tokenize.sh put encoder.json beside the shards", path);
    if (rc != DDP_OK)
        return rc;
    bpe_vocab *v = calloc(1, sizeof *v);
    json_in in = {text, n, 0, path};
    int llmc = n >= 4 && le32((const unsigned char *)text) == (uint32_t)LLMC_TOKENIZER_MAGIC;
    rc = !v ? DDP_ERR_NOMEM : llmc ? llmc_parse(path, (const unsigned char *)text, n, v) : json_parse(&in, v);
    free(text);
    if (rc == DDP_ERR_NOMEM)
        DDP_ERROR("%s: out of memory", path);
    if (rc != DDP_OK) {
        bpe_vocab_free(v);
        return rc;
    }
    *out = v;
    return DDP_OK;
}

ddp_status bpe_vocab_load_beside(const char *pattern, bpe_vocab **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!pattern)
        return DDP_ERR_INVALID_ARG;
    const char *slash = strrchr(pattern, '/');
    int dir_len = slash ? (int)(slash - pattern) : 1;
    size_t n = (size_t)dir_len + sizeof "/gpt2_tokenizer.bin";
    char *path = malloc(n);
    if (!path)
        return DDP_ERR_NOMEM;
    const char *dir = slash ? pattern : ".";
    snprintf(path, n, "%.*s/gpt2_tokenizer.bin", dir_len, dir);
    if (access(path, F_OK) != 0) /* encoder.json first, llm.c's file when only it is there */
        snprintf(path, n, "%.*s/encoder.json", dir_len, dir);
    else {
        char *json = malloc(n);
        if (json)
            snprintf(json, n, "%.*s/encoder.json", dir_len, dir);
        if (json && access(json, F_OK) == 0)
            snprintf(path, n, "%s", json);
        free(json);
    }
    ddp_status rc = bpe_vocab_load(path, out);
    free(path);
    return rc;
}

void bpe_vocab_free(bpe_vocab *v)
{
    if (!v)
        return;
    free(v->pool);
    free(v->tok);
    free(v);
}

int bpe_vocab_size(const bpe_vocab *v) { return v ? v->size : 0; }

const uint8_t *bpe_token_bytes(const bpe_vocab *v, int id, size_t *n_bytes)
{
    if (n_bytes)
        *n_bytes = 0;
    if (!v || id < 0 || id >= v->size || !v->tok[id].defined)
        return NULL;
    if (n_bytes)
        *n_bytes = v->tok[id].len;
    return v->pool + v->tok[id].off;
}

ddp_status bpe_decode(const bpe_vocab *v, const int32_t *ids, size_t n, char **out,
                      size_t *n_bytes)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!v || (!ids && n) || !n_bytes)
        return DDP_ERR_INVALID_ARG;
    size_t total = 0, len = 0;
    for (size_t i = 0; i < n; i++) {
        if (!bpe_token_bytes(v, ids[i], &len)) {
            DDP_ERROR("bpe_decode: id %d at position %zu is not in the vocabulary (%d ids)",
                      (int)ids[i], i, v->size);
            return DDP_ERR_INVALID_ARG;
        }
        total += len;
    }
    char *text = malloc(total + 1);
    if (!text)
        return DDP_ERR_NOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = bpe_token_bytes(v, ids[i], &len);
        memcpy(text + at, b, len);
        at += len;
    }
    text[total] = '\0';
    *out = text;
    *n_bytes = total;
    return DDP_OK;
}
