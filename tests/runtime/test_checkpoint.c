/* test_checkpoint.c - checkpoint round trips (parameters only, and the whole training state with
 * float arrays, counters, doubles and texts), reading version 1 files, every kind of corruption (with
 * the logged reason), atomic replacement (a failed save leaves the existing file as it was) and the
 * removal of stale temporary files of interrupted saves.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "ddp_checkpoint.h"
#include "internal.h"

#define N_PARAMS 3
#define N_VALUES (6 * 5 + 5 + 1)
/* Version 2 layout of a parameters-only file: header 32, table 2 x 72, records 3 x 84 padded to
 * 256, values 36 x 4, CRC 4. */
#define SIG_AT (32 + 2 * 72)
#define VALUES_AT (SIG_AT + 256)
#define FILE_BYTES (VALUES_AT + 4 * N_VALUES + 4)

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

/* A parameters-only checkpoint (the signature and "params"), saved the way programs save one:
 * ddp_state_create, then ddp_state_save. Fails as they do. */
static ddp_status save_params(const char *path, const ddp_param_desc *d, int n, const float *v)
{
    ddp_state *s = NULL;
    ddp_status st = ddp_state_create(d, n, v, &s);
    if (st == DDP_OK)
        st = ddp_state_save(s, path);
    ddp_state_destroy(s);
    return st;
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

/* 1 when both files are there and hold the same bytes (files of this test: under 64 KiB). */
static int files_equal(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na > 0 && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
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
    capture c;
    capture_begin(&c);
    ddp_param_desc *d = NULL;
    float *v = NULL;
    int n = -1;
    ddp_status st = ddp_checkpoint_load(path, &d, &n, &v);
    char text[4096];
    capture_end(&c, text, sizeof text);
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
    CHECK(save_params(p, descs, N_PARAMS, v) == DDP_OK, "save failed");
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
    CHECK(size == FILE_BYTES, "file is %zu bytes, want %d", size, FILE_BYTES);
    CHECK(memcmp(buf, "DDPCKPT1", 8) == 0 && buf[8] == 2 && buf[12] == 2 && buf[16] == FILE_BYTES % 256 &&
              buf[17] == FILE_BYTES / 256 && buf[24] == 32,
          "header is not magic, version 2, 2 sections, file size, table offset 32 (little-endian)");
    CHECK(ckpt_crc32(buf, size - 4) == (uint32_t)(buf[size - 4] | buf[size - 3] << 8 |
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
        uint32_t crc = ckpt_crc32(buf, size - 4);
        for (int i = 0; i < 4; i++)
            buf[size - 4 + (size_t)i] = (unsigned char)(crc >> (8 * i));
    }
    write_all(path_in(name), buf, size - cut);
    free(buf);
}

static void test_corruption(void)
{
    write_damaged("magic.ckpt", 0, 'X', 0, 1);
    expect_load(path_in("magic.ckpt"), DDP_ERR_FORMAT, "is not a ddp checkpoint (bad magic)");
    write_damaged("version.ckpt", 8, 3, 0, 1);
    expect_load(path_in("version.ckpt"), DDP_ERR_FORMAT, "written by a newer ddp");
    write_damaged("trunc.ckpt", 0, 'D', 1, 0);
    expect_load(path_in("trunc.ckpt"), DDP_ERR_FORMAT, "is truncated: expected");
    write_damaged("short.ckpt", 0, 'D', FILE_BYTES - 10, 0);
    expect_load(path_in("short.ckpt"), DDP_ERR_FORMAT, "is truncated");
    write_damaged("flip.ckpt", VALUES_AT + 17, 0x5a, 0, 0);
    expect_load(path_in("flip.ckpt"), DDP_ERR_FORMAT, "checksum mismatch");
    write_damaged("dims.ckpt", SIG_AT + DDP_NAME_MAX, 5, 0, 1); /* n_dims 5 with a valid CRC */
    expect_load(path_in("dims.ckpt"), DDP_ERR_FORMAT, "n_dims");
    write_damaged("neg.ckpt", SIG_AT + DDP_NAME_MAX + 4 + 7, 0x80, 0, 1); /* shape[0] < 0 */
    expect_load(path_in("neg.ckpt"), DDP_ERR_FORMAT, "corrupt");
    write_damaged("kind.ckpt", 32 + 72 + 48, 3, 0, 1); /* "params" claims to be a counter */
    expect_load(path_in("kind.ckpt"), DDP_ERR_FORMAT, "section 1 (\"params\", kind 3");
    write_damaged("align.ckpt", 32 + 72 + 56, VALUES_AT % 256 + 4, 0, 1); /* offset not 8-aligned */
    expect_load(path_in("align.ckpt"), DDP_ERR_FORMAT, "is invalid");
    write_damaged("count.ckpt", 32 + 72 + 64, N_VALUES + 1, 0, 1); /* one value more than stored */
    expect_load(path_in("count.ckpt"), DDP_ERR_FORMAT, "do not add up to 37 elements");
    write_damaged("sections.ckpt", 12, 0xff, 0, 1); /* 255 sections: the table overruns the file */
    expect_load(path_in("sections.ckpt"), DDP_ERR_FORMAT, "impossible section table");
    expect_load(path_in("missing.ckpt"), DDP_ERR_IO, "missing.ckpt");
    expect_load(path_in("ok.ckpt"), DDP_OK, "");
}

/* A version 1 file, written byte by byte as its documented layout says, still loads. */
static void test_version1(const float *v)
{
    unsigned char buf[24 + 84 * N_PARAMS + 4 * N_VALUES + 4] = {0};
    memcpy(buf, "DDPCKPT1", 8);
    buf[8] = 1;
    buf[12] = N_PARAMS;
    buf[16] = N_VALUES;
    for (int i = 0; i < N_PARAMS; i++) {
        unsigned char *rec = buf + 24 + 84 * i;
        strcpy((char *)rec, descs[i].name);
        rec[48] = (unsigned char)descs[i].n_dims;
        for (int d = 0; d < descs[i].n_dims; d++)
            rec[52 + 8 * d] = (unsigned char)descs[i].shape[d];
    }
    for (int i = 0; i < N_VALUES; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], 4);
        for (int k = 0; k < 4; k++)
            buf[24 + 84 * N_PARAMS + 4 * i + k] = (unsigned char)(bits >> (8 * k));
    }
    uint32_t crc = ckpt_crc32(buf, sizeof buf - 4);
    for (int k = 0; k < 4; k++)
        buf[sizeof buf - 4 + (size_t)k] = (unsigned char)(crc >> (8 * k));
    write_all(path_in("v1.ckpt"), buf, sizeof buf);
    ddp_state *s = NULL;
    CHECK(ddp_state_load(path_in("v1.ckpt"), &s) == DDP_OK, "version 1 file not read");
    CHECK(ddp_state_version(s) == 1 && ddp_state_n_params(s) == N_PARAMS && ddp_state_numel(s) == N_VALUES,
          "version 1: version %d, %d params, %zu values", ddp_state_version(s), ddp_state_n_params(s),
          ddp_state_numel(s));
    CHECK(s && memcmp(ddp_state_params(s), v, sizeof(float) * N_VALUES) == 0, "version 1 values differ");
    CHECK(s && strcmp(ddp_state_descs(s)[0].name, "fc1.weight") == 0 && ddp_state_descs(s)[0].shape[1] == 5,
          "version 1 signature differs");
    ddp_state_destroy(s);
    write_all(path_in("v1short.ckpt"), buf, sizeof buf - 3);
    expect_load(path_in("v1short.ckpt"), DDP_ERR_FORMAT, "is truncated: expected");
}

/* Every kind of entry survives a save and a load bit for bit; absent entries read as absent. */
static void test_state_round_trip(const float *v)
{
    ddp_state *s = NULL;
    CHECK(ddp_state_create(descs, N_PARAMS, v, &s) == DDP_OK, "create failed");
    float mom[N_VALUES];
    for (int i = 0; i < N_VALUES; i++)
        mom[i] = -v[i] * 0.5f;
    CHECK(ddp_state_set_f32(s, "momentum", mom, N_VALUES) == DDP_OK, "set momentum");
    CHECK(ddp_state_set_f32(s, "empty", NULL, 0) == DDP_OK, "set an empty array");
    CHECK(ddp_state_set_u64(s, "step", 7) == DDP_OK && ddp_state_set_u64(s, "step", 12345) == DDP_OK,
          "set/replace step");
    CHECK(ddp_state_set_u64(s, "big", UINT64_MAX) == DDP_OK, "set big");
    CHECK(ddp_state_set_f64(s, "loss_scale", 65536.0) == DDP_OK, "set loss_scale");
    CHECK(ddp_state_set_text(s, "config.model", "mlp 784-512-256-10") == DDP_OK, "set text");
    CHECK(ddp_state_set_u64(s, "params", 1) == DDP_ERR_INVALID_ARG, "\"params\" taken by a counter");
    char long_name[DDP_NAME_MAX + 1];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[DDP_NAME_MAX] = '\0';
    CHECK(ddp_state_set_u64(s, long_name, 1) == DDP_ERR_INVALID_ARG, "over-long name accepted");
    CHECK(ddp_state_save(s, path_in("state.ckpt")) == DDP_OK, "state save failed");
    ddp_state_destroy(s);
    s = NULL;
    CHECK(ddp_state_load(path_in("state.ckpt"), &s) == DDP_OK, "state load failed");
    if (!s)
        return;
    size_t n = 0;
    const float *m = ddp_state_f32(s, "momentum", &n);
    CHECK(m && n == N_VALUES && memcmp(m, mom, sizeof mom) == 0, "momentum differs");
    CHECK(ddp_state_f32(s, "empty", &n) != NULL && n == 0, "empty array lost");
    uint64_t u = 0;
    double d = 0.0;
    CHECK(ddp_state_u64(s, "step", &u) && u == 12345, "step %llu", (unsigned long long)u);
    CHECK(ddp_state_u64(s, "big", &u) && u == UINT64_MAX, "big %llu", (unsigned long long)u);
    CHECK(ddp_state_f64(s, "loss_scale", &d) && d == 65536.0, "loss_scale %g", d);
    CHECK(ddp_state_text(s, "config.model") && strcmp(ddp_state_text(s, "config.model"), "mlp 784-512-256-10") == 0,
          "text differs");
    CHECK(!ddp_state_u64(s, "absent", &u) && !ddp_state_u64(s, "loss_scale", &u) &&
              ddp_state_text(s, "step") == NULL && ddp_state_f32(s, "step", NULL) == NULL,
          "absent or other-kind entries read as present");
    CHECK(memcmp(ddp_state_params(s), v, sizeof(float) * N_VALUES) == 0 && ddp_state_version(s) == 2,
          "params or version differ");
    CHECK(ddp_state_n_entries(s) == 8, "%d entries, want 8", ddp_state_n_entries(s));
    ddp_state_destroy(s);
    ddp_state_destroy(NULL);
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
    CHECK(save_params(target, descs, N_PARAMS, v) == DDP_OK, "first save failed");
    size_t before_n, after_n;
    unsigned char *before = read_all(target, &before_n);
    CHECK(mkdir(blocker, 0755) == 0, "mkdir %s", blocker);
    chmod(sub, 0555);
    float changed[N_VALUES];
    for (int i = 0; i < N_VALUES; i++)
        changed[i] = v[i] + 1.0f;
    CHECK(save_params(target, descs, N_PARAMS, changed) == DDP_ERR_IO,
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
    CHECK(save_params(path_in("bad.ckpt"), bad, 1, v) == DDP_ERR_INVALID_ARG,
          "n_dims 5 saved");
    bad[0].n_dims = 2;
    bad[0].shape[1] = -3;
    CHECK(save_params(path_in("bad.ckpt"), bad, 1, v) == DDP_ERR_INVALID_ARG,
          "negative shape saved");
    CHECK(save_params(path_in("bad.ckpt"), descs, 0, v) == DDP_ERR_INVALID_ARG,
          "0 parameters saved");
    CHECK(access(path_in("bad.ckpt"), F_OK) != 0, "a rejected save created a file");
}

/* PID of a process that has exited (and been reaped). */
static long dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return (long)pid;
}

/* A save removes the temporary files that interrupted saves (dead processes) left in its folder,
 * but not files of live processes nor files that are not checkpoints. */
static void test_stale_temps(const float *v)
{
    char stale[600], live[600], foreign[600];
    long gone = dead_pid();
    snprintf(stale, sizeof stale, "%s.tmp.%ld", path_in("other.ckpt"), gone);
    snprintf(live, sizeof live, "%s.tmp.%ld", path_in("other.ckpt"), (long)getppid());
    snprintf(foreign, sizeof foreign, "%s.tmp.%ld", path_in("notes.txt"), gone);
    write_all(stale, (const unsigned char *)"DDPCKPT1 partial", 16);
    write_all(live, (const unsigned char *)"DDPCKPT1 partial", 16);
    write_all(foreign, (const unsigned char *)"user notes", 10);
    CHECK(save_params(path_in("ok.ckpt"), descs, N_PARAMS, v) == DDP_OK, "save failed");
    CHECK(access(stale, F_OK) != 0, "stale temporary file %s was not removed", stale);
    CHECK(access(live, F_OK) == 0, "temporary file of a live process %s was removed", live);
    CHECK(access(foreign, F_OK) == 0, "a file that is not a checkpoint (%s) was removed", foreign);
    remove(live);
    remove(foreign);
}

static void cleanup(void)
{
    const char *names[] = {"ok.ckpt", "magic.ckpt", "version.ckpt", "trunc.ckpt", "short.ckpt",
                           "flip.ckpt", "dims.ckpt", "neg.ckpt", "kind.ckpt", "align.ckpt", "count.ckpt",
                           "sections.ckpt", "v1.ckpt", "v1short.ckpt", "state.ckpt", "staged.ckpt", "copied.ckpt",
                           "ro/model.ckpt", "ro"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        remove(path_in(names[i]));
    rmdir(dir);
}

/* A staging state (ddp_state_create without values, ddp_state_f32_buffer) is filled in place and
 * reused: the same buffers at the next save, same-size setters copy into the entry, and the file
 * is the one ddp_state_set_f32 writes (byte for byte). */
static void test_staging(const float *v)
{
    ddp_state *s = NULL;
    float *p = NULL, *m = NULL, *again = NULL;
    CHECK(ddp_state_create(descs, N_PARAMS, NULL, &s) == DDP_OK, "create without values failed");
    if (!s)
        return;
    CHECK(ddp_state_f32_buffer(s, "params", N_VALUES, &p) == DDP_OK && p == ddp_state_params(s),
          "params buffer is not the state's");
    CHECK(p && p[0] == 0.0f && p[N_VALUES - 1] == 0.0f, "a new buffer is not zeros");
    CHECK(ddp_state_f32_buffer(s, "params", N_VALUES + 1, &again) == DDP_ERR_INVALID_ARG && !again,
          "params with another count accepted");
    CHECK(ddp_state_f32_buffer(s, "signature", 1, &again) == DDP_ERR_INVALID_ARG,
          "signature taken by a buffer");
    CHECK(ddp_state_f32_buffer(s, "momentum", N_VALUES, NULL) == DDP_ERR_INVALID_ARG, "NULL output");
    CHECK(ddp_state_f32_buffer(s, "momentum", N_VALUES, &m) == DDP_OK && m, "momentum buffer");
    if (!p || !m) {
        ddp_state_destroy(s);
        return;
    }
    for (int round = 0; round < 2; round++) { /* two saves through the same buffers */
        memcpy(p, v, sizeof(float) * N_VALUES);
        for (int i = 0; i < N_VALUES; i++)
            m[i] = -v[i] * (float)(round + 1);
        CHECK(ddp_state_f32_buffer(s, "momentum", N_VALUES, &again) == DDP_OK && again == m,
              "round %d: the buffer was not kept", round);
        const char *text = ddp_state_text(s, "config.model");
        CHECK(ddp_state_set_u64(s, "step", (uint64_t)round) == DDP_OK &&
              ddp_state_set_text(s, "config.model", round ? "mlp 2" : "mlp 1") == DDP_OK, "setters");
        CHECK(!round || ddp_state_text(s, "config.model") == text, "a same-length text moved");
        CHECK(ddp_state_save(s, path_in("staged.ckpt")) == DDP_OK, "round %d: save failed", round);
        ddp_state *ref = NULL;
        CHECK(ddp_state_create(descs, N_PARAMS, v, &ref) == DDP_OK &&
              ddp_state_set_f32(ref, "momentum", m, N_VALUES) == DDP_OK &&
              ddp_state_set_u64(ref, "step", (uint64_t)round) == DDP_OK &&
              ddp_state_set_text(ref, "config.model", round ? "mlp 2" : "mlp 1") == DDP_OK &&
              ddp_state_save(ref, path_in("copied.ckpt")) == DDP_OK, "reference save failed");
        ddp_state_destroy(ref);
        char staged[512];
        snprintf(staged, sizeof staged, "%s", path_in("staged.ckpt"));
        CHECK(files_equal(staged, path_in("copied.ckpt")),
              "round %d: the staged file differs from the copied one", round);
    }
    ddp_state_destroy(s);
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
    test_version1(v);
    test_state_round_trip(v);
    test_staging(v);
    test_stale_temps(v);
    test_failed_save_keeps_old(v);
    test_invalid_save(v);
    cleanup();
    return CHECK_DONE();
}
