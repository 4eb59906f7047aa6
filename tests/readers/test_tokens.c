/* test_tokens.c - llm.c token shards: reading good files and refusing each kind of bad one with a
 * message naming the file; the training loader (windows, disjoint ranks whose union is the cut
 * epoch, the permutation's independence from the world size, per-epoch shuffling, exact resume
 * with set_pos); the validation loader (every target once over 1, 2, 3 and 80 ranks) and the
 * validation pattern derived from a training pattern.
 *
 * Every token of the test shards is its global position (shard bases are consecutive), so a value
 * tells which shard and offset it came from.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../check.h"
#include "tokens.h"

#define MAX_FILES 32
#define N_SHARDS 6
#define B 2
#define T 5
#define BT (B * T)
#define VOCAB 65536

/* Shard sizes, uneven on purpose: 9, 3, 24, 0, 0 and 5 windows of 10 + 1 tokens. */
static const size_t shard_n[N_SHARDS] = {100, 37, 250, 1, 0, 51};
static size_t shard_base[N_SHARDS];
static size_t first_window[N_SHARDS + 1];

static char dir[64];
static char files[MAX_FILES][128];
static int n_files;

/* Records a file of the temporary folder for the cleanup and returns its path. */
static const char *tmp_path(const char *name)
{
    snprintf(files[n_files], sizeof files[0], "%s/%s", dir, name);
    return files[n_files++];
}

/* Writes a shard file: the header (magic, version, count) then n uint16 tokens. */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                        const uint16_t *tok, size_t n)
{
    int32_t h[TOKENS_HEADER_INTS] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(h, sizeof h, 1, f);
    if (n)
        fwrite(tok, sizeof *tok, n, f);
    fclose(f);
}

/* The good set: t_train_00000{0..5}.bin written in reverse order (glob must sort), plus a
 * t_val_000000.bin the train pattern must not pick up. */
static void write_good_set(void)
{
    size_t base = 0, w = 0;
    for (int s = 0; s < N_SHARDS; s++) {
        shard_base[s] = base;
        first_window[s] = w;
        base += shard_n[s];
        w += shard_n[s] ? (shard_n[s] - 1) / BT : 0;
    }
    first_window[N_SHARDS] = w;
    uint16_t tok[512];
    for (int s = N_SHARDS - 1; s >= 0; s--) {
        for (size_t k = 0; k < shard_n[s]; k++)
            tok[k] = (uint16_t)(shard_base[s] + k);
        char name[64];
        snprintf(name, sizeof name, "t_train_%06d.bin", s);
        write_shard(tmp_path(name), TOKENS_MAGIC, 1, (int32_t)shard_n[s], tok, shard_n[s]);
    }
    write_shard(tmp_path("t_val_000000.bin"), TOKENS_MAGIC, 1, 3, tok, 3);
}

static tokens_set *open_good(void)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/*_train_*.bin", dir);
    tokens_set *set = NULL;
    CHECK(tokens_set_open(pattern, VOCAB, &set) == DDP_OK, "open %s", pattern);
    return set;
}

/* ---------------------------------------------------------------------------------------------
 * Errors: captured stderr must name the file.
 */
static char captured[4096];
static int saved_fd = -1;

static void capture_begin(void)
{
    fflush(stderr);
    saved_fd = dup(2);
    int fd = open(tmp_path("stderr.txt"), O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
}

static const char *capture_end(void)
{
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    n_files--; /* reuse the slot: the file is rewritten each time */
    FILE *f = fopen(files[n_files], "r");
    size_t n = f ? fread(captured, 1, sizeof captured - 1, f) : 0;
    captured[n] = '\0';
    if (f)
        fclose(f);
    unlink(files[n_files]);
    return captured;
}

/* Opens pattern expecting status want and a message holding `needle`. */
static void expect_open_error(const char *what, const char *pattern, int vocab, ddp_status want,
                              const char *needle)
{
    tokens_set *set = (tokens_set *)&set;
    capture_begin();
    ddp_status rc = tokens_set_open(pattern, vocab, &set);
    const char *msg = capture_end();
    CHECK(rc == want, "%s: status %s, want %s", what, ddp_strerror(rc), ddp_strerror(want));
    CHECK(set == NULL, "%s: *out not NULL on failure", what);
    CHECK(!needle || strstr(msg, needle), "%s: message '%s' lacks '%s'", what, msg, needle);
}

static void test_bad_files(void)
{
    uint16_t tok[64];
    for (int k = 0; k < 64; k++)
        tok[k] = (uint16_t)k;
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/*_nothing_*.bin", dir);
    expect_open_error("missing file", tmp_path("missing.bin"), VOCAB, DDP_ERR_IO, "missing.bin");
    n_files--; /* never created */
    expect_open_error("no match", pattern, VOCAB, DDP_ERR_IO, "_nothing_");
    FILE *f = fopen(tmp_path("short.bin"), "wb");
    fwrite(tok, 1, 100, f);
    fclose(f);
    expect_open_error("short file", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "short.bin");
    write_shard(tmp_path("magic.bin"), 1234, 1, 10, tok, 10);
    expect_open_error("bad magic", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "magic.bin");
    write_shard(tmp_path("model.bin"), 20240326, 1, 10, tok, 10);
    expect_open_error("model file", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "model file");
    write_shard(tmp_path("version.bin"), TOKENS_MAGIC, 2, 10, tok, 10);
    expect_open_error("bad version", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "version.bin");
    write_shard(tmp_path("negative.bin"), TOKENS_MAGIC, 1, -5, tok, 0);
    expect_open_error("negative count", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "negative");
    write_shard(tmp_path("truncated.bin"), TOKENS_MAGIC, 1, 10, tok, 9);
    expect_open_error("truncated", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "truncated.bin");
    write_shard(tmp_path("long.bin"), TOKENS_MAGIC, 1, 10, tok, 11);
    expect_open_error("too long", files[n_files - 1], VOCAB, DDP_ERR_FORMAT, "long.bin");
    mkdir(tmp_path("dir_x.bin"), 0700);
    expect_open_error("a folder", files[n_files - 1], VOCAB, DDP_ERR_IO, "dir_x.bin");
    rmdir(files[--n_files]);
    CHECK(mkfifo(tmp_path("fifo_x.bin"), 0600) == 0, "mkfifo");
    expect_open_error("a FIFO (its open would wait for a writer)", files[n_files - 1], VOCAB,
                      DDP_ERR_IO, "FIFO");
    unlink(files[--n_files]);
    expect_open_error("vocab 0", files[0], 0, DDP_ERR_INVALID_ARG, NULL);
    expect_open_error("vocab 65537", files[0], 65537, DDP_ERR_INVALID_ARG, NULL);
    expect_open_error("NULL pattern", NULL, VOCAB, DDP_ERR_INVALID_ARG, NULL);
    snprintf(pattern, sizeof pattern, "%s/*.bin", dir); /* good shards and bad ones together */
    expect_open_error("a bad file among good ones", pattern, VOCAB, DDP_ERR_FORMAT, NULL);
}

/* A shard whose token 25 is 60000: the set opens (headers are fine); the scan and both loaders
 * refuse it with vocabulary 50257, naming the file and the offset. */
static void test_bad_token(void)
{
    uint16_t tok[40];
    for (int k = 0; k < 40; k++)
        tok[k] = (uint16_t)(k == 25 ? 60000 : k);
    const char *path = tmp_path("vocab.bin");
    write_shard(path, TOKENS_MAGIC, 1, 40, tok, 40);
    tokens_set *set = NULL;
    CHECK(tokens_set_open(path, 50257, &set) == DDP_OK, "the header of vocab.bin is valid");
    capture_begin();
    ddp_status rc = tokens_set_scan(set);
    const char *msg = capture_end();
    CHECK(rc == DDP_ERR_FORMAT && strstr(msg, "vocab.bin") && strstr(msg, "token 25 is 60000"),
          "scan: %s, '%s'", ddp_strerror(rc), msg);
    tokens_loader *l = NULL;
    tokens_loader_opts o = {.batch = 1, .seq = 10, .world_size = 1, .rank = 0};
    CHECK(tokens_loader_create(set, &o, &l) == DDP_OK, "loader on vocab.bin");
    int32_t in[40], tg[40]; /* the validation batch below is 4 x 10 */
    CHECK(tokens_loader_next(l, in, tg) == DDP_OK && tokens_loader_next(l, in, tg) == DDP_OK,
          "the first two windows are clean");
    capture_begin();
    rc = tokens_loader_next(l, in, tg);
    msg = capture_end();
    CHECK(rc == DDP_ERR_FORMAT && strstr(msg, "vocab.bin"), "loader: %s, '%s'", ddp_strerror(rc),
          msg);
    CHECK(tokens_loader_pos(l).step == 2, "the position stays at the bad window");
    tokens_val *v = NULL;
    CHECK(tokens_val_create(set, 4, 10, 1, 0, &v) == DDP_OK, "val on vocab.bin");
    int b = -1, t = -1;
    capture_begin();
    rc = tokens_val_next(v, in, tg, &b, &t);
    capture_end();
    CHECK(rc == DDP_ERR_FORMAT, "val: %s", ddp_strerror(rc));
    tokens_val_destroy(v);
    tokens_loader_destroy(l);
    tokens_set_close(set);
}

static void test_good_set(const tokens_set *set)
{
    CHECK(tokens_set_n_shards(set) == N_SHARDS, "%zu shards", tokens_set_n_shards(set));
    size_t total = 0, targets = 0;
    for (size_t s = 0; s < N_SHARDS; s++) {
        const tokens_shard *sh = tokens_set_shard(set, s);
        char name[32];
        snprintf(name, sizeof name, "t_train_%06zu.bin", s);
        CHECK(sh && strstr(sh->path, name), "shard %zu is %s", s, sh ? sh->path : "NULL");
        CHECK(sh && sh->n_tokens == shard_n[s], "shard %zu: %zu tokens", s, sh ? sh->n_tokens : 0);
        for (size_t k = 0; sh && k < sh->n_tokens; k++)
            CHECK((size_t)sh->tokens[k] == shard_base[s] + k, "shard %zu token %zu", s, k);
        total += shard_n[s];
        targets += shard_n[s] ? shard_n[s] - 1 : 0;
    }
    CHECK(tokens_set_shard(set, N_SHARDS) == NULL, "shard out of range");
    CHECK(tokens_set_n_tokens(set) == total, "n_tokens %zu", tokens_set_n_tokens(set));
    CHECK(tokens_set_n_targets(set) == targets, "n_targets %zu", tokens_set_n_targets(set));
    CHECK(tokens_set_scan(set) == DDP_OK, "scan of the good set");
}

/* ---------------------------------------------------------------------------------------------
 * Training loader.
 */

/* The global window index of a window starting with token value v; checks inputs and targets. */
static long window_id(const int32_t *in, const int32_t *tg)
{
    size_t v = (size_t)in[0];
    for (int s = 0; s < N_SHARDS; s++) {
        if (v < shard_base[s] || v >= shard_base[s] + shard_n[s])
            continue;
        size_t off = v - shard_base[s];
        int ok = off % BT == 0 && off + BT + 1 <= shard_n[s];
        for (int i = 0; ok && i < BT; i++)
            ok = (size_t)in[i] == v + (size_t)i && (size_t)tg[i] == v + (size_t)i + 1;
        CHECK(ok, "window at shard %d offset %zu is not a contiguous aligned window", s, off);
        return ok ? (long)(first_window[s] + off / BT) : -1;
    }
    CHECK(0, "token %zu is in no shard", v);
    return -1;
}

static tokens_loader *make_loader(const tokens_set *set, int world, int rank, uint64_t seed,
                                  int shuffle)
{
    tokens_loader_opts o = {B, T, world, rank, seed, shuffle, 0};
    tokens_loader *l = NULL;
    CHECK(tokens_loader_create(set, &o, &l) == DDP_OK, "loader world %d rank %d", world, rank);
    return l;
}

/* Takes n windows from l into ids. */
static void take(tokens_loader *l, long *ids, size_t n)
{
    int32_t in[BT], tg[BT];
    for (size_t i = 0; i < n; i++) {
        ids[i] = -1;
        if (tokens_loader_next(l, in, tg) == DDP_OK)
            ids[i] = window_id(in, tg);
    }
}

/* Rank rank's windows of epoch e on world ranks (steps_per_epoch of them, into ids). */
static size_t epoch_ids(const tokens_set *set, int world, int rank, uint64_t seed, int shuffle,
                        uint64_t e, long *ids)
{
    tokens_loader *l = make_loader(set, world, rank, seed, shuffle);
    size_t n = tokens_loader_steps_per_epoch(l);
    CHECK(tokens_loader_set_pos(l, (tokens_pos){e, 0}) == DDP_OK, "set_pos epoch %llu",
          (unsigned long long)e);
    take(l, ids, n);
    tokens_loader_destroy(l);
    return n;
}

static int same_ids(const long *a, const long *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void test_loader_order(const tokens_set *set)
{
    size_t nw = first_window[N_SHARDS];
    long plain[64], e0[64], e1[64], again[64], seed2[64];
    CHECK(epoch_ids(set, 1, 0, 7, 0, 0, plain) == nw, "world 1: %zu windows per epoch", nw);
    int in_order = 1;
    for (size_t i = 0; i < nw; i++)
        in_order &= plain[i] == (long)i;
    CHECK(in_order, "without shuffle the windows come in shard order");
    epoch_ids(set, 1, 0, 7, 1, 0, e0);
    epoch_ids(set, 1, 0, 7, 1, 1, e1);
    epoch_ids(set, 1, 0, 7, 1, 0, again);
    epoch_ids(set, 1, 0, 8, 1, 0, seed2);
    int seen[64] = {0}, perm = 1;
    for (size_t i = 0; i < nw; i++)
        perm &= e0[i] >= 0 && e0[i] < (long)nw && !seen[e0[i]]++;
    CHECK(perm, "a shuffled epoch is a permutation of all windows");
    CHECK(!same_ids(e0, plain, nw), "the shuffle changes the order");
    CHECK(!same_ids(e0, e1, nw), "epochs 0 and 1 differ");
    CHECK(same_ids(e0, again, nw), "the same seed gives the same order");
    CHECK(!same_ids(e0, seed2, nw), "another seed gives another order");
}

/* Rank r's i-th window of epoch e on W ranks is position r + W*i of the 1-rank order: so ranks
 * are disjoint, their union is the epoch cut to a multiple of W, and the permutation does not
 * depend on the world size. */
static void test_loader_ranks(const tokens_set *set)
{
    size_t nw = first_window[N_SHARDS];
    static const int worlds[] = {2, 3, 4, 7, 41};
    for (uint64_t e = 0; e < 4; e += 3) {
        long one[64];
        epoch_ids(set, 1, 0, 11, 1, e, one);
        for (size_t k = 0; k < sizeof worlds / sizeof *worlds; k++) {
            int W = worlds[k], seen[64] = {0}, dup = 0, match = 1;
            size_t union_n = 0;
            for (int r = 0; r < W; r++) {
                long ids[64];
                size_t n = epoch_ids(set, W, r, 11, 1, e, ids);
                CHECK(n == nw / (size_t)W, "world %d: %zu steps per epoch", W, n);
                for (size_t i = 0; i < n; i++) {
                    match &= ids[i] == one[(size_t)r + (size_t)W * i];
                    dup |= ids[i] < 0 || seen[ids[i]]++;
                    union_n++;
                }
            }
            CHECK(match, "epoch %llu world %d: rank windows are not the 1-rank order dealt out",
                  (unsigned long long)e, W);
            CHECK(!dup && union_n == nw / (size_t)W * (size_t)W, "world %d: union %zu, dup %d", W,
                  union_n, dup);
        }
    }
    tokens_loader_opts o = {B, T, 42, 0, 1, 1, 0};
    tokens_loader *l = (tokens_loader *)&l;
    capture_begin();
    ddp_status rc = tokens_loader_create(set, &o, &l);
    const char *msg = capture_end();
    CHECK(rc == DDP_ERR_INVALID_ARG && l == NULL && strstr(msg, "41 windows"),
          "41 windows on 42 ranks: %s '%s'", ddp_strerror(rc), msg);
    tokens_loader_opts bad[] = {{0, T, 1, 0, 1, 1, 0}, {B, 0, 1, 0, 1, 1, 0},
                                {B, T, 2, 2, 1, 1, 0}, {65536, 65536, 1, 0, 1, 1, 0}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        capture_begin();
        CHECK(tokens_loader_create(set, &bad[k], &l) == DDP_ERR_INVALID_ARG, "bad options %zu", k);
        capture_end();
    }
}

/* A stream across epochs, then set_pos on fresh and used loaders reproduces it from any point. */
static void test_loader_resume(const tokens_set *set)
{
    const int W = 3, R = 1;
    tokens_loader *a = make_loader(set, W, R, 5, 1);
    size_t per = tokens_loader_steps_per_epoch(a); /* 13 */
    size_t n = 3 * per + 4;
    long stream[64], e[3][64], got[64];
    take(a, stream, n);
    tokens_pos end = tokens_loader_pos(a);
    CHECK(end.epoch == 3 && end.step == 4, "position after %zu steps: (%llu, %llu)", n,
          (unsigned long long)end.epoch, (unsigned long long)end.step);
    for (int k = 0; k < 3; k++)
        epoch_ids(set, W, R, 5, 1, (uint64_t)k, e[k]);
    CHECK(same_ids(stream, e[0], per) && same_ids(stream + per, e[1], per) &&
              same_ids(stream + 2 * per, e[2], per),
          "the stream is epoch 0, 1, 2 in turn");
    const tokens_pos at[] = {{0, 0}, {0, 5}, {0, per}, {1, 0}, {1, per - 1}, {2, 7}};
    for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
        size_t from = at[k].epoch * per + at[k].step;
        tokens_loader *b = make_loader(set, W, R, 5, 1);
        CHECK(tokens_loader_set_pos(b, at[k]) == DDP_OK, "set_pos %zu", k);
        tokens_pos p = tokens_loader_pos(b);
        CHECK(p.epoch == at[k].epoch && p.step == at[k].step, "pos reads back %zu", k);
        take(b, got, n - from);
        CHECK(same_ids(got, stream + from, n - from), "fresh loader from (%llu, %llu)",
              (unsigned long long)at[k].epoch, (unsigned long long)at[k].step);
        tokens_loader_destroy(b);
        CHECK(tokens_loader_set_pos(a, at[k]) == DDP_OK, "set_pos back %zu", k);
        take(a, got, n - from);
        CHECK(same_ids(got, stream + from, n - from), "used loader from (%llu, %llu)",
              (unsigned long long)at[k].epoch, (unsigned long long)at[k].step);
    }
    tokens_pos before = tokens_loader_pos(a);
    capture_begin();
    CHECK(tokens_loader_set_pos(a, (tokens_pos){0, per + 1}) == DDP_ERR_INVALID_ARG,
          "a step beyond the epoch");
    capture_end();
    CHECK(tokens_loader_pos(a).step == before.step, "a refused set_pos changes nothing");
    tokens_loader_destroy(a);
}

/* ---------------------------------------------------------------------------------------------
 * Validation loader.
 */

/* One rank's pass: counts each target value in count[], checks shapes and rows. Returns the
 * targets seen. */
static size_t val_pass(tokens_val *v, int vb, int vt, int *count, size_t *batches)
{
    int32_t in[64], tg[64];
    int b = 0, t = 0;
    size_t seen = 0;
    *batches = 0;
    while (tokens_val_next(v, in, tg, &b, &t) == DDP_OK && b > 0) {
        CHECK(b <= vb && t >= 1 && t <= vt && (t == vt || b == 1), "batch shape %d x %d", b, t);
        for (int i = 0; i < b * t; i++) {
            CHECK(tg[i] == in[i] + 1, "target follows input");
            CHECK(i % t == 0 || in[i] == in[i - 1] + 1, "a row is contiguous");
            count[tg[i]]++;
        }
        seen += (size_t)(b * t);
        (*batches)++;
    }
    return seen;
}

static void test_val(const tokens_set *set)
{
    static const int worlds[] = {1, 2, 3, 80}; /* 65 sequences: 80 leaves ranks empty */
    const int vb = 3, vt = 7;
    for (size_t k = 0; k < sizeof worlds / sizeof *worlds; k++) {
        int W = worlds[k], count[512] = {0};
        size_t total = 0;
        for (int r = 0; r < W; r++) {
            tokens_val *v = NULL;
            CHECK(tokens_val_create(set, vb, vt, W, r, &v) == DDP_OK, "val %d/%d", r, W);
            size_t batches = 0, seen = val_pass(v, vb, vt, count, &batches);
            CHECK(seen == tokens_val_n_targets(v), "rank %d: %zu targets", r, seen);
            CHECK(batches == tokens_val_n_batches(v), "rank %d: %zu batches", r, batches);
            total += seen;
            tokens_val_destroy(v);
        }
        CHECK(total == tokens_set_n_targets(set), "world %d: %zu targets in all", W, total);
        int once = 1;
        for (int s = 0; s < N_SHARDS; s++)
            for (size_t o = 0; o < shard_n[s]; o++)
                once &= count[shard_base[s] + o] == (o > 0);
        CHECK(once, "world %d: every target once, no shard's first token", W);
    }
    tokens_val *v = NULL;
    CHECK(tokens_val_create(set, vb, vt, 1, 0, &v) == DDP_OK, "val");
    int32_t in1[64], tg1[64], in2[64], tg2[64];
    int b1, t1, b2, t2;
    tokens_val_next(v, in1, tg1, &b1, &t1);
    tokens_val_rewind(v);
    tokens_val_next(v, in2, tg2, &b2, &t2);
    CHECK(b1 == b2 && t1 == t2 && !memcmp(in1, in2, sizeof(int32_t) * (size_t)(b1 * t1)),
          "rewind restarts the pass");
    tokens_val_destroy(v);
}

static void test_val_pattern(void)
{
    static const char *cases[][2] = {{"d/x_train_*.bin", "d/x_val_*.bin"},
                                     {"train/a_train_*.bin", "train/a_val_*.bin"},
                                     {"train", "val"}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char *v = NULL;
        CHECK(tokens_val_pattern(cases[k][0], &v) == DDP_OK && v && !strcmp(v, cases[k][1]),
              "%s -> %s, got %s", cases[k][0], cases[k][1], v ? v : "NULL");
        free(v);
    }
    char *v = (char *)&v;
    capture_begin();
    CHECK(tokens_val_pattern("d/x_*.bin", &v) == DDP_ERR_INVALID_ARG && !v, "no train in it");
    capture_end();
}

/* A shard truncated under a running loader (its pages past the new end gone from the mapping):
 * the window that reaches them is refused naming the file, no SIGBUS. */
static void test_truncated(void)
{
    enum { N = 8000 };
    static uint16_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 50000);
    const char *path = tmp_path("cut_train_000001.bin");
    write_shard(path, TOKENS_MAGIC, 1, N, tok, N);
    tokens_set *set = NULL;
    tokens_loader *l = NULL;
    CHECK(tokens_set_open(path, VOCAB, &set) == DDP_OK, "open the shard to cut");
    tokens_loader_opts o = {.batch = 1, .seq = 10, .world_size = 1, .rank = 0, .shuffle = 0};
    CHECK(set && tokens_loader_create(set, &o, &l) == DDP_OK, "loader on the shard to cut");
    int32_t x[10], y[10];
    CHECK(l && tokens_loader_next(l, x, y) == DDP_OK, "the first window, before the cut");
    CHECK(truncate(path, 4096) == 0, "truncate to 4096 bytes");
    capture_begin();
    ddp_status rc = DDP_OK;
    for (int w = 1; l && rc == DDP_OK && w < N / 11; w++)
        rc = tokens_loader_next(l, x, y);
    const char *msg = capture_end();
    CHECK(rc == DDP_ERR_IO, "a window past the cut: %s, want DDP_ERR_IO", ddp_strerror(rc));
    CHECK(strstr(msg, "cut_train_000001.bin") && strstr(msg, "shrank") && strstr(msg, "now 4096 bytes"),
          "the message names the file and its new size: '%s'", msg);
    tokens_loader_destroy(l);
    tokens_set_close(set);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ddp_tokens_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    write_good_set();
    tokens_set *set = open_good();
    if (set) {
        test_good_set(set);
        test_loader_order(set);
        test_loader_ranks(set);
        test_loader_resume(set);
        test_val(set);
    }
    tokens_set_close(set);
    test_bad_files();
    test_bad_token();
    test_val_pattern();
    test_truncated();
    for (int i = 0; i < n_files; i++)
        unlink(files[i]);
    rmdir(dir);
    return CHECK_DONE();
}
