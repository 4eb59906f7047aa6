/* test_checkpoint_dir.c - checkpoint folders without MPI: three "ranks" write uneven shards of a
 * 37-value buffer (x[i] = i * 0.5 - 7, closed form), rank 0 commits the MANIFEST; then ranges that
 * cross the pieces read back exactly, the state holds the counts and counters, consolidation gives
 * the single file's values, and a commit or an open refuses a missing file, a MANIFEST with a
 * corrupt byte, and a shard of another step, naming them. A FIFO in place of a shard file, of the
 * MANIFEST or of a single checkpoint file is refused at once by every read (an alarm ends the test
 * if one blocks, as opening a FIFO for reading used to), and a save neither removes nor replaces
 * it. ddp_checkpoint_open opens either kind, and with verify finds a flipped byte in a rank file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ddp_checkpoint.h"

#define N_VALUES 37
#define WORLD 3

static const ddp_param_desc descs[2] = {{"w", 2, {6, 6, 0, 0}}, {"b", 1, {1, 0, 0, 0}}};
static char dir[256];

static float value(size_t i) { return (float)i * 0.5f - 7.0f; }

/* Rank r's shard of params and of "m" (m = -params), with the step. */
static ddp_state *shard(int r, uint64_t step)
{
    size_t off, n;
    ddp_shard_range(N_VALUES, WORLD, r, &off, &n);
    float v[N_VALUES], m[N_VALUES];
    for (size_t i = 0; i < n; i++) {
        v[i] = value(off + i);
        m[i] = -v[i];
    }
    ddp_param_desc d = {"shard", 1, {(int64_t)n, 0, 0, 0}};
    ddp_state *s = NULL;
    CHECK(ddp_state_create(&d, 1, v, &s) == DDP_OK, "shard %d", r);
    ddp_state_set_u64(s, "shard.offset.params", off);
    ddp_state_set_f32(s, "m", m, n);
    ddp_state_set_u64(s, "shard.offset.m", off);
    ddp_state_set_u64(s, "step", step);
    ddp_state_set_f64(s, "loss_scale", 0.1);
    ddp_state_set_text(s, "config.model", "test model");
    return s;
}

/* Writes all shards of `step` into path and commits; returns the commit's status. */
static ddp_status write_folder(const char *path, uint64_t step, int skip_rank)
{
    CHECK(ddp_ckpt_dir_begin(path) == DDP_OK, "begin %s", path);
    ddp_state *meta = NULL;
    for (int r = 0; r < WORLD; r++) {
        ddp_state *s = shard(r, step);
        if (r != skip_rank)
            CHECK(ddp_ckpt_dir_write_shard(path, r, WORLD, s) == DDP_OK, "write rank %d", r);
        if (r == 0)
            meta = s;
        else
            ddp_state_destroy(s);
    }
    ddp_status st = ddp_ckpt_dir_commit(path, WORLD, descs, 2, meta);
    ddp_state_destroy(meta);
    return st;
}

static void test_read_back(const char *path)
{
    ddp_ckpt_dir *d = NULL;
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_OK, "open");
    if (!d)
        return;
    CHECK(ddp_ckpt_dir_n_files(d) == WORLD, "files %d", ddp_ckpt_dir_n_files(d));
    const ddp_state *s = ddp_ckpt_dir_state(d);
    size_t n = 0;
    uint64_t step = 0;
    double scale = 0.0;
    CHECK(ddp_state_numel(s) == N_VALUES && ddp_state_n_params(s) == 2, "numel");
    CHECK(ddp_state_f32(s, "m", &n) == NULL && n == N_VALUES, "m: counts without values (%zu)", n);
    CHECK(ddp_state_u64(s, "step", &step) && step == 5, "step %llu", (unsigned long long)step);
    CHECK(ddp_state_f64(s, "loss_scale", &scale) && scale == 0.1, "loss_scale %g", scale);
    CHECK(strcmp(ddp_state_text(s, "config.model"), "test model") == 0, "text");
    CHECK(!ddp_state_u64(s, "shard.offset.m", &step), "shard.* stay in the files");
    for (size_t lo = 0; lo < N_VALUES; lo += 5) { /* ranges across the pieces (13, 12, 12) */
        float got[N_VALUES];
        size_t k = N_VALUES - lo < 17 ? N_VALUES - lo : 17;
        CHECK(ddp_ckpt_dir_read_f32(d, "m", lo, k, got) == DDP_OK, "read m [%zu, +%zu)", lo, k);
        for (size_t i = 0; i < k; i++)
            CHECK(got[i] == -value(lo + i), "m[%zu] = %g", lo + i, got[i]);
    }
    float one;
    CHECK(ddp_ckpt_dir_read_f32(d, "m", N_VALUES, 1, &one) == DDP_ERR_INVALID_ARG, "past the end");
    CHECK(ddp_ckpt_dir_read_f32(d, "nope", 0, 1, &one) == DDP_ERR_INVALID_ARG, "unknown buffer");
    for (int i = 0; i < WORLD; i++)
        CHECK(ddp_ckpt_dir_verify_file(d, i) == DDP_OK, "verify %d", i);
    char file[300];
    snprintf(file, sizeof file, "%s/whole.ckpt", dir);
    CHECK(ddp_ckpt_dir_consolidate(d, file) == DDP_OK, "consolidate");
    ddp_state *whole = NULL;
    CHECK(ddp_state_load(file, &whole) == DDP_OK, "load the consolidated file");
    const float *p = ddp_state_params(whole), *m = ddp_state_f32(whole, "m", &n);
    for (size_t i = 0; p && m && i < N_VALUES; i++)
        CHECK(p[i] == value(i) && m[i] == -value(i), "consolidated [%zu]", i);
    CHECK(ddp_state_save(s, file) == DDP_ERR_INVALID_ARG, "a folder's state has no values to save");
    ddp_state_destroy(whole);
    unlink(file);
    ddp_ckpt_dir_close(d);
}

/* ddp_checkpoint_open, the one call for either kind: the folder (its state without values), the
 * consolidated file (values held), and a flipped byte in a rank file found only with verify. */
static void test_either_kind(const char *path)
{
    char file[300];
    snprintf(file, sizeof file, "%s/either.ckpt", dir);
    ddp_state *f = NULL;
    ddp_ckpt_dir *d = NULL;
    CHECK(ddp_checkpoint_is_folder(path) && !ddp_checkpoint_is_folder(file), "is_folder");
    CHECK(ddp_checkpoint_open(path, 1, &f, &d) == DDP_OK && d && !f, "open the folder");
    const ddp_state *s = ddp_checkpoint_state(f, d);
    CHECK(s == ddp_ckpt_dir_state(d) && ddp_state_numel(s) == N_VALUES, "the folder's state");
    CHECK(d && ddp_ckpt_dir_consolidate(d, file) == DDP_OK, "consolidate");
    ddp_ckpt_dir_close(d);
    CHECK(ddp_checkpoint_open(file, 1, &f, &d) == DDP_OK && f && !d, "open the file");
    s = ddp_checkpoint_state(f, d);
    CHECK(s == f && ddp_state_params(s) && ddp_state_params(s)[3] == value(3), "the file's values");
    ddp_state_destroy(f);
    unlink(file);
    char p[1024];
    snprintf(p, sizeof p, "%s/rank-00001-of-00003.ckpt", path);
    FILE *g = fopen(p, "r+b");
    CHECK(g != NULL, "open %s", p);
    if (g) { /* a byte of the last value (the file ends with it and its 4-byte CRC word) */
        fseek(g, -9, SEEK_END);
        int c = fgetc(g);
        fseek(g, -9, SEEK_END);
        fputc(c ^ 0x10, g);
        fclose(g);
    }
    CHECK(ddp_checkpoint_open(path, 0, &f, &d) == DDP_OK && d, "without verify: opened");
    ddp_ckpt_dir_close(d);
    CHECK(ddp_checkpoint_open(path, 1, &f, &d) == DDP_ERR_FORMAT && !d && !f,
          "with verify: the flipped byte refused");
    CHECK(ddp_checkpoint_open(NULL, 1, &f, &d) == DDP_ERR_INVALID_ARG, "NULL path");
    CHECK(write_folder(path, 5, -1) == DDP_OK, "commit again");
}

static void test_faults(const char *path)
{
    char p[1024];
    ddp_ckpt_dir *d = NULL;
    CHECK(write_folder(path, 5, 1) == DDP_ERR_FORMAT, "commit refuses a missing file");
    snprintf(p, sizeof p, "%s/MANIFEST", path);
    CHECK(access(p, F_OK) != 0, "no MANIFEST after a refused commit");
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_ERR_IO && !d, "no MANIFEST: not a checkpoint");
    CHECK(write_folder(path, 5, -1) == DDP_OK, "commit");
    FILE *f = fopen(p, "r+b");
    if (f) {
        fseek(f, 20, SEEK_SET);
        fputc('X', f);
        fclose(f);
    }
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_ERR_FORMAT && !d, "a corrupt MANIFEST is refused");
    CHECK(write_folder(path, 5, -1) == DDP_OK, "commit again");
    ddp_state *other = shard(2, 6);
    char held[300];
    snprintf(held, sizeof held, "%s/held", dir);
    CHECK(ddp_ckpt_dir_begin(held) == DDP_OK, "begin held");
    ddp_ckpt_dir_write_shard(held, 2, WORLD, other);
    ddp_state_destroy(other);
    snprintf(p, sizeof p, "%s/rank-00002-of-00003.ckpt", path);
    char from[1024];
    snprintf(from, sizeof from, "%s/rank-00002-of-00003.ckpt", held);
    CHECK(rename(from, p) == 0, "replace rank 2's file by one of step 6");
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_ERR_FORMAT && !d, "a shard of another step is refused");
}

/* Replaces the file at path by a FIFO nobody writes; 0 on success. */
static int fifo_in_place(const char *path)
{
    return unlink(path) == 0 && mkfifo(path, 0600) == 0 ? 0 : -1;
}

static void test_fifos(const char *path)
{
    char p[1024];
    ddp_ckpt_dir *d = NULL;
    float got[N_VALUES];
    alarm(20); /* a read that blocks on a FIFO fails the test instead of hanging it */
    CHECK(write_folder(path, 5, -1) == DDP_OK, "commit");
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_OK, "open before a shard becomes a FIFO");
    snprintf(p, sizeof p, "%s/rank-00000-of-00003.ckpt", path); /* the values (shard alignment) */
    CHECK(fifo_in_place(p) == 0, "a FIFO in place of rank 0's file");
    CHECK(ddp_ckpt_dir_verify_file(d, 0) == DDP_ERR_IO, "verify refuses the FIFO");
    CHECK(ddp_ckpt_dir_read_f32(d, "params", 0, N_VALUES, got) == DDP_ERR_IO,
          "reading through the FIFO is refused");
    ddp_ckpt_dir_close(d);
    d = NULL;
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_ERR_FORMAT && !d, "open refuses a FIFO shard");
    ddp_state *zero = shard(0, 5);
    CHECK(ddp_ckpt_dir_begin(path) == DDP_OK &&
              ddp_ckpt_dir_write_shard(path, 0, WORLD, zero) != DDP_OK,
          "a save refuses to remove or replace the FIFO");
    ddp_state_destroy(zero);
    struct stat sb;
    CHECK(lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO is left where it was");
    unlink(p); /* as its owner would */
    CHECK(write_folder(path, 5, -1) == DDP_OK, "commit again");
    snprintf(p, sizeof p, "%s/MANIFEST", path);
    CHECK(fifo_in_place(p) == 0, "a FIFO in place of the MANIFEST");
    CHECK(ddp_ckpt_dir_open(path, &d) == DDP_ERR_IO && !d, "open refuses a FIFO MANIFEST");
    ddp_state *s = NULL;
    snprintf(p, sizeof p, "%s/fifo.ckpt", dir);
    CHECK(mkfifo(p, 0600) == 0, "a FIFO as a checkpoint file");
    CHECK(ddp_state_load(p, &s) == DDP_ERR_IO && !s, "ddp_state_load refuses a FIFO");
    alarm(0);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s/ddp_ckptdir_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/step-000000000005.ckpt", dir);
    CHECK(write_folder(path, 5, -1) == DDP_OK, "commit");
    CHECK(ddp_ckpt_dir_files_present(path, WORLD) == 1, "files present");
    test_read_back(path);
    test_either_kind(path);
    test_faults(path);
    test_fifos(path);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return CHECK_DONE();
}
