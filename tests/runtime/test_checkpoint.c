/* test_checkpoint.c - checkpoint round trip, every kind of corruption (with the logged reason),
 * and atomic replacement: a failed save leaves the existing file as it was.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ddp.h"
#include "internal.h"

#define N_PARAMS 3
#define N_VALUES (6 * 5 + 5 + 1)

static char dir[256];

static const ddp_param_desc descs[N_PARAMS] = {
    {"fc1.weight", 2, {6, 5, 0, 0}},
    {"fc1.bias", 1, {5, 0, 0, 0}},
    {"scale", 0, {0, 0, 0, 0}},
};

static void make_values(float *v)
{
    for (int i = 0; i < N_VALUES; i++)
        v[i] = (float)i * 0.25f - 3.0f;
    v[1] = -0.0f;
    v[2] = 1e-40f; /* subnormal */
}

static char *path_in(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = malloc(1 << 16);
    *n = f && buf ? fread(buf, 1, 1 << 16, f) : 0;
    if (f)
        fclose(f);
    return buf;
}

static void write_all(const char *path, const unsigned char *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n, "cannot write %s", path);
    if (f)
        fclose(f);
}

/* Loads path with stderr captured; checks the status and that the log contains `reason`. */
static void expect_load(const char *path, ddp_status want, const char *reason)
{
    fflush(stderr);
    int saved = dup(2);
    FILE *log = tmpfile();
    dup2(fileno(log), 2);
    ddp_param_desc *d = NULL;
    float *v = NULL;
    int n = -1;
    ddp_status st = ddp_checkpoint_load(path, &d, &n, &v);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[4096] = {0};
    rewind(log);
    size_t got = fread(text, 1, sizeof text - 1, log);
    text[got] = '\0';
    fclose(log);
    CHECK(st == want, "%s: load gave \"%s\", want \"%s\"", reason, ddp_strerror(st),
          ddp_strerror(want));
    CHECK(strstr(text, reason) != NULL, "log lacks \"%s\"; it says: %s", reason, text);
    CHECK(st == DDP_OK || (d == NULL && v == NULL && n == -1), "%s: outputs touched", reason);
    if (st == DDP_OK) {
        free(d);
        free(v);
    }
}

static void test_round_trip(const float *v)
{
    const char *p = path_in("ok.ckpt");
    CHECK(ddp_checkpoint_save(p, descs, N_PARAMS, v) == DDP_OK, "save failed");
    ddp_param_desc *d = NULL;
    float *w = NULL;
    int n = 0;
    CHECK(ddp_checkpoint_load(p, &d, &n, &w) == DDP_OK, "load failed");
    if (!d || !w)
        return;
    CHECK(n == N_PARAMS, "n_params %d", n);
    for (int i = 0; i < N_PARAMS && n == N_PARAMS; i++) {
        CHECK(strcmp(d[i].name, descs[i].name) == 0, "name %d: %s", i, d[i].name);
        CHECK(d[i].n_dims == descs[i].n_dims, "n_dims %d: %d", i, d[i].n_dims);
        for (int k = 0; k < descs[i].n_dims; k++)
            CHECK(d[i].shape[k] == descs[i].shape[k], "shape %d,%d", i, k);
    }
    CHECK(memcmp(w, v, sizeof(float) * N_VALUES) == 0, "values differ bit for bit");
    free(d);
    free(w);
    size_t size;
    unsigned char *buf = read_all(p, &size);
    CHECK(size == 24 + 84 * N_PARAMS + 4 * N_VALUES + 4, "file is %zu bytes", size);
    CHECK(memcmp(buf, "DDPCKPT1", 8) == 0 && buf[8] == 1 && buf[12] == N_PARAMS,
          "header is not magic, version 1 LE, n_params LE");
    CHECK(ddp_crc32(buf, size - 4) == (uint32_t)(buf[size - 4] | buf[size - 3] << 8 |
                                                 buf[size - 2] << 16 | (uint32_t)buf[size - 1] << 24),
          "trailing CRC-32 is not the zlib CRC of the rest");
    free(buf);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "temporary file %s left behind", tmp);
}

/* Writes a damaged copy of the good file: bytes [at] = value, CRC recomputed when fix_crc. */
static void write_damaged(const char *name, size_t at, unsigned char value, size_t cut, int fix_crc)
{
    size_t size;
    unsigned char *buf = read_all(path_in("ok.ckpt"), &size);
    if (at < size)
        buf[at] = value;
    if (fix_crc) {
        uint32_t crc = ddp_crc32(buf, size - 4);
        for (int i = 0; i < 4; i++)
            buf[size - 4 + (size_t)i] = (unsigned char)(crc >> (8 * i));
    }
    write_all(path_in(name), buf, size - cut);
    free(buf);
}

static void test_corruption(void)
{
    const size_t values_at = 24 + 84 * N_PARAMS;
    write_damaged("magic.ckpt", 0, 'X', 0, 1);
    expect_load(path_in("magic.ckpt"), DDP_ERR_FORMAT, "is not a ddp checkpoint (bad magic)");
    write_damaged("version.ckpt", 8, 2, 0, 1);
    expect_load(path_in("version.ckpt"), DDP_ERR_FORMAT, "written by a newer ddp");
    write_damaged("trunc.ckpt", 0, 'D', 1, 0);
    expect_load(path_in("trunc.ckpt"), DDP_ERR_FORMAT, "is truncated: expected");
    write_damaged("short.ckpt", 0, 'D', 24 + 84 * N_PARAMS + 4 * N_VALUES, 0);
    expect_load(path_in("short.ckpt"), DDP_ERR_FORMAT, "is truncated");
    write_damaged("flip.ckpt", values_at + 17, 0x5a, 0, 0);
    expect_load(path_in("flip.ckpt"), DDP_ERR_FORMAT, "checksum mismatch");
    write_damaged("dims.ckpt", 24 + DDP_NAME_MAX, 5, 0, 1); /* n_dims 5 with a valid CRC */
    expect_load(path_in("dims.ckpt"), DDP_ERR_FORMAT, "n_dims");
    write_damaged("neg.ckpt", 24 + DDP_NAME_MAX + 4 + 7, 0x80, 0, 1); /* shape[0] < 0 */
    expect_load(path_in("neg.ckpt"), DDP_ERR_FORMAT, "corrupt");
    expect_load(path_in("missing.ckpt"), DDP_ERR_IO, "missing.ckpt");
    expect_load(path_in("ok.ckpt"), DDP_OK, "");
}

/* A save that cannot create its temporary file fails and leaves the old checkpoint unchanged.
 * The directory is made read-only; root ignores that, so the temporary name is also taken by a
 * directory, which no one can open for writing. */
static void test_failed_save_keeps_old(const float *v)
{
    char sub[300], target[400], blocker[500];
    snprintf(sub, sizeof sub, "%s/ro", dir);
    snprintf(target, sizeof target, "%s/model.ckpt", sub);
    snprintf(blocker, sizeof blocker, "%s.tmp.%ld", target, (long)getpid());
    CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
    CHECK(ddp_checkpoint_save(target, descs, N_PARAMS, v) == DDP_OK, "first save failed");
    size_t before_n, after_n;
    unsigned char *before = read_all(target, &before_n);
    CHECK(mkdir(blocker, 0755) == 0, "mkdir %s", blocker);
    chmod(sub, 0555);
    float changed[N_VALUES];
    for (int i = 0; i < N_VALUES; i++)
        changed[i] = v[i] + 1.0f;
    CHECK(ddp_checkpoint_save(target, descs, N_PARAMS, changed) == DDP_ERR_IO,
          "save into an unwritable place did not fail with DDP_ERR_IO");
    unsigned char *after = read_all(target, &after_n);
    CHECK(before_n == after_n && memcmp(before, after, before_n) == 0,
          "the old checkpoint changed after a failed save");
    free(before);
    free(after);
    chmod(sub, 0755);
    rmdir(blocker);
}

static void test_invalid_save(const float *v)
{
    ddp_param_desc bad[1] = {{"w", 5, {1, 1, 1, 1}}};
    CHECK(ddp_checkpoint_save(path_in("bad.ckpt"), bad, 1, v) == DDP_ERR_INVALID_ARG,
          "n_dims 5 saved");
    bad[0].n_dims = 2;
    bad[0].shape[1] = -3;
    CHECK(ddp_checkpoint_save(path_in("bad.ckpt"), bad, 1, v) == DDP_ERR_INVALID_ARG,
          "negative shape saved");
    CHECK(ddp_checkpoint_save(path_in("bad.ckpt"), descs, 0, v) == DDP_ERR_INVALID_ARG,
          "0 parameters saved");
    CHECK(access(path_in("bad.ckpt"), F_OK) != 0, "a rejected save created a file");
}

static void cleanup(void)
{
    const char *names[] = {"ok.ckpt", "magic.ckpt", "version.ckpt", "trunc.ckpt", "short.ckpt",
                           "flip.ckpt", "dims.ckpt", "neg.ckpt", "ro/model.ckpt", "ro"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        remove(path_in(names[i]));
    rmdir(dir);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s/ddp_ckpt_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    float v[N_VALUES];
    make_values(v);
    test_round_trip(v);
    test_corruption();
    test_failed_save_keeps_old(v);
    test_invalid_save(v);
    cleanup();
    return CHECK_DONE();
}
