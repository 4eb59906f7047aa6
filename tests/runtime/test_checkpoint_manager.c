/* test_checkpoint_manager.c - libddp's checkpoint manager driven directly, one process (no MPI):
 * three folder saves with keep 2 (one at once, two in the background) leave the newest two; the
 * newest valid one is found and reads back its values; a folder without a MANIFEST is skipped and
 * removed by the next save; a corrupt MANIFEST falls back to the previous checkpoint, and when
 * every one is corrupt the answer is DDP_ERR_FORMAT, not a fresh start; a background save is
 * complete once waited for, and one left in flight is completed by destroy; a single file is saved
 * and found too; links in the folder are never followed nor removed, nor files a save does not
 * write (links_and_foreign). With --mpi (mpirun -np 2): the same with every rank writing its slice,
 * and a rank without a shard failing the save on every rank, at once and in the background.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ddp_checkpoint.h"

#define N_VALUES 37

static const ddp_param_desc descs[2] = {{"w", 2, {6, 6, 0, 0}}, {"b", 1, {1, 0, 0, 0}}};
static char dir[256];

static float value(long step, size_t i) { return (float)i * 0.5f - 7.0f + (float)step; }

static int rank, world = 1;

/* This rank's slice (ddp_shard_range) of the state at step: "params" and "m" (m = -params). */
static ddp_state *shard(long step)
{
    size_t off, n;
    ddp_shard_range(N_VALUES, world, rank, &off, &n);
    ddp_param_desc d = {"shard", 1, {(int64_t)n, 0, 0, 0}};
    ddp_state *s = NULL;
    float *p = NULL, *m = NULL;
    CHECK(ddp_state_create(&d, 1, NULL, &s) == DDP_OK, "shard of step %ld", step);
    CHECK(ddp_state_f32_buffer(s, "params", n, &p) == DDP_OK &&
          ddp_state_f32_buffer(s, "m", n, &m) == DDP_OK, "buffers of step %ld", step);
    for (size_t i = 0; p && m && i < n; i++) {
        p[i] = value(step, off + i);
        m[i] = -p[i];
    }
    ddp_state_set_u64(s, "shard.offset.params", off);
    ddp_state_set_u64(s, "shard.offset.m", off);
    ddp_state_set_u64(s, "step", (uint64_t)step);
    return s;
}

static char *ckpt(long step)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/step-%012ld.ckpt", dir, step);
    return p;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int has_manifest(long step)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", ckpt(step), DDP_CKPT_MANIFEST);
    return exists(p);
}

/* The steps in the folder, newest first, as "3 2" for the messages; their count. */
static size_t listing(const ddp_ckpt_manager *m, char *text, size_t n)
{
    long *steps = NULL;
    size_t count = 0;
    text[0] = '\0';
    CHECK(ddp_ckpt_manager_list(m, &steps, &count) == DDP_OK, "list failed");
    for (size_t i = 0; i < count; i++)
        snprintf(text + strlen(text), n - strlen(text), "%s%ld", i ? " " : "", steps[i]);
    free(steps);
    return count;
}

/* The newest valid checkpoint older than below is want (-1: none); a folder's "params" and "m"
 * read back as saved. */
static void expect_newest(const ddp_ckpt_manager *m, long below, long want, ddp_status want_st,
                          const char *what)
{
    char path[4096] = "";
    long step = -2;
    ddp_state *file = NULL;
    ddp_ckpt_dir *d = NULL;
    ddp_status st = ddp_ckpt_manager_newest(m, below, &step, path, sizeof path, &file, &d);
    CHECK(st == want_st && step == want, "%s: newest is step %ld (%s), status %s; want %ld, %s", what,
          step, path, ddp_strerror(st), want, ddp_strerror(want_st));
    CHECK(want < 0 || strcmp(path, ckpt(want)) == 0, "%s: path %s", what, path);
    CHECK(want >= 0 || (!file && !d), "%s: none, yet something opened", what);
    float got[N_VALUES], m_got[N_VALUES];
    if (d) {
        CHECK(ddp_ckpt_dir_read_f32(d, "params", 0, N_VALUES, got) == DDP_OK &&
              ddp_ckpt_dir_read_f32(d, "m", 0, N_VALUES, m_got) == DDP_OK, "%s: read", what);
        CHECK(ddp_ckpt_dir_n_files(d) == world, "%s: %d files", what, ddp_ckpt_dir_n_files(d));
        for (int i = 0; i < ddp_ckpt_dir_n_files(d); i++)
            CHECK(ddp_ckpt_dir_verify_file(d, i) == DDP_OK, "%s: file %d's CRC-32", what, i);
    } else if (file) {
        size_t n = 0;
        const float *p = ddp_state_params(file), *mm = ddp_state_f32(file, "m", &n);
        CHECK(p && mm && n == N_VALUES, "%s: the file's buffers", what);
        if (p && mm && n == N_VALUES) {
            memcpy(got, p, sizeof got);
            memcpy(m_got, mm, sizeof m_got);
        }
    }
    for (size_t i = 0; (d || file) && i < N_VALUES; i++)
        CHECK(got[i] == value(want, i) && m_got[i] == -value(want, i), "%s: value %zu: %g %g", what, i,
              got[i], m_got[i]);
    ddp_ckpt_dir_close(d);
    ddp_state_destroy(file);
}

/* A save of step (background or at once); the shard stays alive until the save ends (the caller
 * frees it after the wait). */
static ddp_status save(ddp_ckpt_manager *m, long step, int background, ddp_state **keep)
{
    *keep = shard(step);
    return ddp_ckpt_manager_save(m, step, *keep, descs, 2, background);
}

/* Flips a bit of step's MANIFEST (its CRC-32 then fails). */
static void corrupt_manifest(long step)
{
    char manifest[600];
    snprintf(manifest, sizeof manifest, "%s/%s", ckpt(step), DDP_CKPT_MANIFEST);
    FILE *f = fopen(manifest, "r+b");
    CHECK(f != NULL, "cannot open %s", manifest);
    if (!f)
        return;
    fseek(f, 20, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 20, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
}

static void remove_tree(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", path);
}

/* Writes text into folder/name. */
static void put(const char *folder, const char *name, const char *text)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", folder, name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL, "cannot create %s", p);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int has(const char *folder, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", folder, name);
    return exists(p);
}

/* Links and other files in the folder (m keeps 2; steps 7 and 8 are there): a step name linked
 * to a folder outside (another run's checkpoint, with names a save writes) and one linked to a
 * file are never followed nor removed, a step folder keeps the files a save does not write, a
 * linked newest step is not resumed from, and a folder save refuses to write through a link. */
static void links_and_foreign(ddp_ckpt_manager *m)
{
    char out[300], file_out[600];
    snprintf(out, sizeof out, "%s_outside", dir);
    CHECK(mkdir(out, 0777) == 0, "mkdir %s", out);
    put(out, DDP_CKPT_MANIFEST, "another run's");
    put(out, "rank-00000-of-00001.ckpt", "another run's");
    put(out, "notes.txt", "unrelated");
    snprintf(file_out, sizeof file_out, "%s/single.ckpt", out);
    put(out, "single.ckpt", "another run's file");
    CHECK(symlink(out, ckpt(1)) == 0 && symlink(file_out, ckpt(3)) == 0, "symlinks");
    CHECK(mkdir(ckpt(2), 0777) == 0, "mkdir step 2");
    put(ckpt(2), DDP_CKPT_MANIFEST, "stale");
    put(ckpt(2), "rank-00000-of-00001.ckpt", "stale");
    put(ckpt(2), "notes.txt", "the user's");
    char eight[600];
    snprintf(eight, sizeof eight, "%s", ckpt(8)); /* ckpt's buffer is static */
    CHECK(symlink(eight, ckpt(10)) == 0, "a link as the newest step");
    expect_newest(m, LONG_MAX, 8, DDP_OK, "a link as the newest step");
    CHECK(ddp_ckpt_dir_begin(ckpt(1)) == DDP_ERR_INVALID_ARG, "a folder save wrote through a link");

    ddp_state *s9;
    CHECK(save(m, 9, 0, &s9) == DDP_OK && has_manifest(9), "step 9 saved");
    ddp_state_destroy(s9);
    CHECK(has(out, DDP_CKPT_MANIFEST) && has(out, "rank-00000-of-00001.ckpt") &&
              has(out, "notes.txt") && has(out, "single.ckpt"),
          "the prune removed files outside the checkpoint folder");
    struct stat sb;
    CHECK(lstat(ckpt(1), &sb) == 0 && S_ISLNK(sb.st_mode) && lstat(ckpt(3), &sb) == 0 &&
          S_ISLNK(sb.st_mode) && lstat(ckpt(10), &sb) == 0, "the prune removed a link");
    CHECK(has(ckpt(2), "notes.txt") && !has(ckpt(2), DDP_CKPT_MANIFEST) &&
          !has(ckpt(2), "rank-00000-of-00001.ckpt"), "step 2: not exactly a save's files removed");
    CHECK(!exists(ckpt(7)) && has_manifest(8), "keep 2: steps 9 and 8 kept, 7 removed");
    unlink(ckpt(1));
    unlink(ckpt(3));
    unlink(ckpt(10));
    remove_tree(out);
}

/* Under mpirun (--mpi): every rank writes its slice; rank 0's background thread waits for the
 * others' files. A rank without a shard fails the save on every rank (rank 0: no MANIFEST), in the
 * background too (found at the wait), and the next save removes the debris. */
static int ranks_main(void)
{
    ddp_ctx *ctx = NULL;
    int rc = check_ddp_init(1, NULL, "test_checkpoint_manager", CHECK_GPU_ONE, &ctx);
    if (rc != 0)
        return rc;
    rank = ddp_rank(ctx);
    world = ddp_world_size(ctx);
    snprintf(dir, sizeof dir, "%s/ddp_mgr_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (rank == 0 && !mkdtemp(dir))
        perror("mkdtemp");
    CHECK(ddp_broadcast(ctx, dir, sizeof dir, 0) == DDP_OK, "broadcasting the folder");
    ddp_ckpt_manager *m = NULL;
    CHECK(ddp_ckpt_manager_create(ctx, dir, 2, 1, &m) == DDP_OK && m, "create failed");
    ddp_state *s[7] = {0};
    char list[256];
    CHECK(ddp_ckpt_manager_save(m, 1, s[1] = shard(1), descs, 2, 0) == DDP_OK, "step 1 at once");
    CHECK(ddp_ckpt_manager_save(m, 2, s[2] = shard(2), descs, 2, 1) == DDP_OK, "step 2 started");
    CHECK(ddp_ckpt_manager_save(m, 3, s[3] = shard(3), descs, 2, 1) == DDP_OK, "step 3 started");
    CHECK(ddp_ckpt_manager_wait(m) == DDP_OK, "step 3: the wait failed");
    if (rank == 0) {
        CHECK(listing(m, list, sizeof list) == 2 && strcmp(list, "3 2") == 0, "keep 2: left %s", list);
        expect_newest(m, LONG_MAX, 3, DDP_OK, "two ranks");
    }
    /* rank 1 has no shard: at once, then in the background */
    ddp_state *mine = rank == 1 ? NULL : (s[4] = shard(4));
    ddp_status st = ddp_ckpt_manager_save(m, 4, mine, descs, 2, 0);
    CHECK(st != DDP_OK, "rank %d: step 4 without rank 1's shard succeeded", rank);
    mine = rank == 1 ? NULL : (s[5] = shard(5));
    CHECK(ddp_ckpt_manager_save(m, 5, mine, descs, 2, 1) == DDP_OK, "step 5 started");
    CHECK(ddp_ckpt_manager_wait(m) != DDP_OK, "rank %d: the wait of step 5 succeeded", rank);
    CHECK(rank != 0 || (!has_manifest(4) && !has_manifest(5)), "a MANIFEST without every file");
    CHECK(ddp_ckpt_manager_save(m, 6, s[6] = shard(6), descs, 2, 1) == DDP_OK, "step 6 started");
    CHECK(ddp_ckpt_manager_wait(m) == DDP_OK, "step 6: the wait failed");
    if (rank == 0) {
        CHECK(listing(m, list, sizeof list) == 2 && strcmp(list, "6 3") == 0, "after step 6: %s", list);
        expect_newest(m, LONG_MAX, 6, DDP_OK, "after the failed saves");
    }
    ddp_ckpt_manager_destroy(m);
    for (int i = 0; i < 7; i++)
        ddp_state_destroy(s[i]);
    ddp_barrier(ctx);
    if (rank == 0)
        remove_tree(dir);
    rc = CHECK_DONE();
    ddp_finalize(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--mpi") == 0)
        return ranks_main();
    snprintf(dir, sizeof dir, "%s/ddp_mgr_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ddp_ckpt_manager *m = NULL;
    char list[256];
    CHECK(ddp_ckpt_manager_create(NULL, dir, 0, 1, &m) == DDP_ERR_INVALID_ARG && !m, "keep 0 accepted");
    CHECK(ddp_ckpt_manager_create(NULL, NULL, 2, 1, &m) == DDP_ERR_INVALID_ARG, "no folder accepted");
    CHECK(ddp_ckpt_manager_create(NULL, dir, 2, 1, &m) == DDP_OK && m, "create failed");
    if (!m)
        return CHECK_DONE();
    char path[8];
    CHECK(ddp_ckpt_manager_path(m, 1, path, sizeof path) == DDP_ERR_INVALID_ARG,
          "a path that does not fit accepted");
    CHECK(ddp_ckpt_manager_path(m, -1, list, sizeof list) == DDP_ERR_INVALID_ARG, "step -1 accepted");
    expect_newest(m, LONG_MAX, -1, DDP_OK, "an empty folder");
    CHECK(ddp_ckpt_manager_wait(m) == DDP_OK, "wait with nothing in flight");

    /* Three saves, keep 2: step 1 at once, 2 and 3 in the background (3 waits for 2). */
    ddp_state *s1, *s2, *s3;
    CHECK(save(m, 1, 0, &s1) == DDP_OK && has_manifest(1), "step 1 saved at once");
    CHECK(ddp_ckpt_manager_slowest_write(m) > 0.0, "step 1: no write time");
    CHECK(save(m, 2, 1, &s2) == DDP_OK, "step 2 started in the background");
    CHECK(save(m, 3, 1, &s3) == DDP_OK, "step 3 started (after step 2's end)");
    CHECK(has_manifest(2), "step 2 complete once the next save began");
    CHECK(ddp_ckpt_manager_wait(m) == DDP_OK, "step 3: the wait failed");
    CHECK(has_manifest(3), "step 3 complete after the wait");
    ddp_state_destroy(s1);
    ddp_state_destroy(s2);
    ddp_state_destroy(s3);
    CHECK(listing(m, list, sizeof list) == 2 && strcmp(list, "3 2") == 0, "keep 2: left %s", list);
    expect_newest(m, LONG_MAX, 3, DDP_OK, "after three saves");
    expect_newest(m, 3, 2, DDP_OK, "older than step 3");

    /* An interrupted save: a folder without MANIFEST is skipped, and the next save removes it. */
    CHECK(mkdir(ckpt(4), 0777) == 0, "mkdir step 4");
    char debris[600];
    snprintf(debris, sizeof debris, "%s/rank-00000-of-00001.ckpt", ckpt(4));
    FILE *f = fopen(debris, "wb");
    if (f) {
        fputs("DDPCKPT1 half a file", f);
        fclose(f);
    }
    expect_newest(m, LONG_MAX, 3, DDP_OK, "a folder without MANIFEST");
    ddp_state *s5;
    CHECK(save(m, 5, 1, &s5) == DDP_OK, "step 5 started");
    CHECK(ddp_ckpt_manager_wait(m) == DDP_OK && has_manifest(5), "step 5 complete after the wait");
    ddp_state_destroy(s5);
    CHECK(!exists(ckpt(4)), "the folder without MANIFEST was not removed");
    CHECK(listing(m, list, sizeof list) == 2 && strcmp(list, "5 3") == 0, "after step 5: %s", list);

    /* A corrupt MANIFEST: the previous checkpoint; every one corrupt: DDP_ERR_FORMAT. */
    corrupt_manifest(5);
    expect_newest(m, LONG_MAX, 3, DDP_OK, "a corrupt MANIFEST");
    expect_newest(m, 3, -1, DDP_OK, "nothing older than step 3");
    corrupt_manifest(3);
    expect_newest(m, LONG_MAX, -1, DDP_ERR_FORMAT, "every checkpoint corrupt");

    /* A save left in flight: destroy completes it; a new manager finds it. */
    ddp_state *s6;
    CHECK(save(m, 6, 1, &s6) == DDP_OK, "step 6 started");
    ddp_ckpt_manager_destroy(m);
    ddp_state_destroy(s6);
    m = NULL;
    CHECK(has_manifest(6), "destroy did not complete the save in flight");
    CHECK(ddp_ckpt_manager_create(NULL, dir, 2, 0, &m) == DDP_OK && m, "create again");
    if (!m)
        return CHECK_DONE();
    expect_newest(m, LONG_MAX, 6, DDP_OK, "after destroy");

    /* A single file (rank 0's whole state), found like a folder; keep 2 drops step 5. */
    ddp_state *whole = shard(7);
    CHECK(ddp_ckpt_manager_save_file(m, 7, whole) == DDP_OK, "file of step 7");
    ddp_state_destroy(whole);
    CHECK(listing(m, list, sizeof list) == 2 && strcmp(list, "7 6") == 0, "after the file: %s", list);
    expect_newest(m, LONG_MAX, 7, DDP_OK, "a file");
    /* background without async: at once */
    ddp_state *s8;
    CHECK(save(m, 8, 1, &s8) == DDP_OK && has_manifest(8), "a background save without async waits");
    ddp_state_destroy(s8);
    links_and_foreign(m);
    ddp_ckpt_manager_destroy(m);
    ddp_ckpt_manager_destroy(NULL);
    remove_tree(dir);
    return CHECK_DONE();
}
