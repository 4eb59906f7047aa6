/* checkpoint_manager.c - a training program's checkpoints in one folder (ddp_checkpoint.h): the
 * step-N names, listing, the newest valid one with fallback to the previous ones, keeping the
 * newest K, removing interrupted saves, and folder saves by every rank, in the background when
 * asked.
 *
 * Names: DIR/step-<12 digits>.ckpt, a checkpoint file or a checkpoint folder (checkpoint_dir.c).
 * A folder without its MANIFEST is the debris of an interrupted save: never a checkpoint, removed
 * by the next prune. A checkpoint is removed MANIFEST first, so a kill during the removal leaves
 * such debris, never a folder that claims to be complete with some of its files gone.
 *
 * A background save: every rank starts one at the same steps; its thread writes this rank's file
 * from the caller's shard state, and rank 0's thread then waits for the other ranks' files to
 * appear (each is renamed into place only once complete and fsync'ed, so a file's presence means
 * it is whole) and writes the MANIFEST, then prunes. One save is in flight at a time: the next
 * save, ddp_ckpt_manager_wait (collective: the ranks agree on the outcome there) and
 * ddp_ckpt_manager_destroy (no collective: at exit the other ranks may be gone) wait for it.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddp_checkpoint.h"
#include "internal.h"

#define MGR_NAME_FMT "step-%012ld.ckpt"
#define MGR_PATH_MAX 4096
#define MGR_WAIT_S 300.0    /* rank 0's thread waits this long for the other ranks' files */

/* The save in flight. */
typedef struct mgr_save {
    int active;             /* started and not yet waited for (the same on every rank) */
    int has_thread;
    pthread_t thread;
    const ddp_state *shard; /* the caller's, unchanged until the save ends */
    char path[MGR_PATH_MAX];
    long step;
    ddp_status st;          /* this rank's write; rank 0: then the MANIFEST */
    int err;
    double t0;
    atomic_int written;     /* this rank's file is on disk, or its write failed */
    atomic_int cancel;      /* rank 0: another rank failed, write no MANIFEST */
} mgr_save;

struct ddp_ckpt_manager {
    ddp_ctx *ctx;           /* NULL: one process */
    char *dir;
    int keep, async, rank, world;
    int64_t *flags;         /* world failure flags of the ranks' agreements */
    ddp_param_desc *descs;  /* the last save's, for its MANIFEST (the caller's may be gone at exit) */
    int n_descs, cap_descs;
    double slowest_write;
    mgr_save pending;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A collective that fails stops the whole job, so no peer waits forever. */
static void mgr_must(const ddp_ckpt_manager *m, ddp_status st, const char *what)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("checkpoint folder %s: %s failed: %s; stopping every rank", m->dir, what, ddp_strerror(st));
    ddp_abort(m->ctx, 1);
}

/* Collective: each rank's failure flag into m->flags[world] (every rank); their count. */
static int64_t mgr_agree(ddp_ckpt_manager *m, int failed)
{
    int64_t n = failed != 0;
    if (m->world == 1)
        m->flags[0] = n;
    else
        mgr_must(m, ddp_agree_failed(m->ctx, failed, m->flags, &n),
                 "agreeing on the checkpoint's files");
    return n;
}

/* ---- names and listing -------------------------------------------------------------------------- */

long ckpt_name_step(const char *name, const char *suffix)
{
    size_t n = strlen(name), s = strlen(suffix);
    if (n != 5 + 12 + s || strncmp(name, "step-", 5) != 0 || strcmp(name + 17, suffix) != 0)
        return -1;
    long step = 0;
    for (int i = 5; i < 17; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

int ckpt_newest_first(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

ddp_status ddp_ckpt_manager_path(const ddp_ckpt_manager *m, long step, char *path, size_t n)
{
    int len = m && path && step >= 0 ? snprintf(path, n, "%s/" MGR_NAME_FMT, m->dir, step) : -1;
    if (len < 0 || (size_t)len >= n) {
        DDP_ERROR("ddp_ckpt_manager_path: need a manager, step >= 0 and room for the path (step %ld)", step);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

ddp_status ddp_ckpt_manager_list(const ddp_ckpt_manager *m, long **steps, size_t *n)
{
    if (!m || !steps || !n)
        return DDP_ERR_INVALID_ARG;
    DIR *d = opendir(m->dir);
    if (!d) {
        DDP_ERROR("checkpoint folder %s: cannot list it: %s", m->dir, strerror(errno));
        return DDP_ERR_IO;
    }
    size_t cap = 0, count = 0;
    long *list = NULL;
    ddp_status st = DDP_OK;
    struct dirent *de;
    while (st == DDP_OK && (de = readdir(d)) != NULL) {
        long step = ckpt_name_step(de->d_name, ".ckpt");
        if (step < 0)
            continue;
        if (count == cap) {
            long *grown = realloc(list, (cap = cap ? 2 * cap : 16) * sizeof *grown);
            if (!grown) {
                st = DDP_ERR_NOMEM;
                break;
            }
            list = grown;
        }
        list[count++] = step;
    }
    closedir(d);
    if (st != DDP_OK) {
        free(list);
        return st;
    }
    if (count)
        qsort(list, count, sizeof *list, ckpt_newest_first);
    *steps = list;
    *n = count;
    return DDP_OK;
}

/* 1 when path itself is a symbolic link: a step name in the folder that ddp never wrote, never
 * reads as this folder's checkpoint and never removes (nor anything it points to). */
static int is_link(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
}

static void warn_link(const ddp_ckpt_manager *m, const char *path, const char *doing)
{
    char target[MGR_PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    DDP_WARN("checkpoint folder %s: %s %s: it is a symbolic link (to %s), which ddp neither "
             "follows nor removes (give a checkpoint elsewhere to --resume PATH, and remove the "
             "link)", m->dir, doing, path, n > 0 ? target : "?");
}

/* 1 when the checkpoint folder path has its MANIFEST (the save that wrote it completed). */
static int folder_complete(const char *path)
{
    char manifest[MGR_PATH_MAX + 16];
    snprintf(manifest, sizeof manifest, "%s/%s", path, DDP_CKPT_MANIFEST);
    return access(manifest, F_OK) == 0;
}

/* Removes a checkpoint file, or from a checkpoint folder the files a save wrote (MANIFEST first)
 * and then the folder, when nothing else is in it; never through a link (the caller skips links).
 * 0, or -1 with errno set. */
static int remove_checkpoint(const char *path)
{
    if (!ddp_checkpoint_is_folder(path))
        return unlink(path);
    DIR *d = opendir(path);
    int left = d ? ckpt_dir_remove_own(d, path) : -1;
    int err = errno;
    if (d)
        closedir(d);
    errno = left > 0 ? ENOTEMPTY : err;
    return left != 0 ? -1 : rmdir(path);
}

ddp_status ddp_ckpt_manager_remove(const ddp_ckpt_manager *m, long step)
{
    char path[MGR_PATH_MAX];
    ddp_status st = ddp_ckpt_manager_path(m, step, path, sizeof path);
    if (st != DDP_OK)
        return st;
    if (is_link(path)) {
        warn_link(m, path, "not replacing");
        return DDP_ERR_INVALID_ARG;
    }
    if (remove_checkpoint(path) == 0 || errno == ENOENT)
        return DDP_OK;
    DDP_ERROR("checkpoint folder %s: cannot replace %s: %s", m->dir, path, strerror(errno));
    return DDP_ERR_IO;
}

void ddp_ckpt_manager_prune(const ddp_ckpt_manager *m)
{
    long *steps = NULL;
    size_t n = 0;
    if (!m || ddp_ckpt_manager_list(m, &steps, &n) != DDP_OK)
        return;
    char path[MGR_PATH_MAX];
    int kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (ddp_ckpt_manager_path(m, steps[i], path, sizeof path) != DDP_OK)
            continue;
        if (is_link(path)) {
            warn_link(m, path, "not removing");
            continue;
        }
        int debris = ddp_checkpoint_is_folder(path) && !folder_complete(path);
        if (!debris && kept < m->keep) {
            kept++;
            continue;
        }
        if (remove_checkpoint(path) != 0)
            DDP_WARN("checkpoint folder %s: cannot remove %s (keeping %d): %s", m->dir, path, m->keep,
                     strerror(errno));
        else if (debris)
            DDP_INFO("checkpoint: removed %s, an interrupted save (no %s)", path, DDP_CKPT_MANIFEST);
    }
    free(steps);
}

ddp_status ddp_ckpt_manager_newest(const ddp_ckpt_manager *m, long below, long *step, char *path,
                                   size_t n, ddp_state **file, ddp_ckpt_dir **dir)
{
    if (!m || !step || !path || !file || !dir)
        return DDP_ERR_INVALID_ARG;
    *step = -1;
    *file = NULL;
    *dir = NULL;
    long *steps = NULL;
    size_t count = 0, older = 0, newer = 0;
    ddp_status st = ddp_ckpt_manager_list(m, &steps, &count);
    for (size_t i = 0; st == DDP_OK && i < count && *step < 0; i++) {
        newer += steps[i] >= below;
        if (steps[i] >= below || ddp_ckpt_manager_path(m, steps[i], path, n) != DDP_OK)
            continue;
        if (is_link(path)) {
            warn_link(m, path, "skipping");
            continue;
        }
        if (ddp_checkpoint_is_folder(path) && !folder_complete(path)) {
            /* not a checkpoint: a save killed before its MANIFEST. Only such debris (a kill during
             * the first save) leaves "none", not a folder of checkpoints that are all invalid. */
            DDP_WARN("checkpoint folder %s: skipping %s: no %s, a save that did not complete (the next "
                     "save removes it)", m->dir, path, DDP_CKPT_MANIFEST);
            continue;
        }
        older++;
        ddp_status o = ddp_checkpoint_open(path, 0, file, dir);
        if (o == DDP_OK)
            *step = steps[i];
        else
            DDP_WARN("checkpoint folder %s: skipping %s: it is corrupt or truncated (see above)%s", m->dir,
                     path, i + 1 < count ? "; trying the previous checkpoint" : "");
    }
    free(steps);
    if (st == DDP_OK && older > 0 && *step < 0) {
        DDP_ERROR("checkpoint folder %s: none of the %zu checkpoints %sin it is valid: move them away "
                  "to start fresh", m->dir, older, newer ? "left " : "");
        st = DDP_ERR_FORMAT;
    }
    if (*step < 0 && n > 0)
        path[0] = '\0';
    return st;
}

/* ---- the manager --------------------------------------------------------------------------------- */

ddp_status ddp_ckpt_manager_create(ddp_ctx *ctx, const char *dir, int keep, int async,
                                   ddp_ckpt_manager **out)
{
    if (!dir || !dir[0] || strlen(dir) > DDP_CKPT_DIR_MAX || keep < 1 || !out) {
        DDP_ERROR("ddp_ckpt_manager_create: need a folder (at most %d bytes), keep >= 1 and an output "
                  "(got keep %d)", DDP_CKPT_DIR_MAX, keep);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_ckpt_manager *m = calloc(1, sizeof *m);
    int world = ddp_world_size(ctx);
    if (m) {
        m->dir = strdup(dir);
        m->flags = calloc((size_t)world, sizeof *m->flags);
    }
    if (!m || !m->dir || !m->flags) {
        if (m) {
            free(m->dir);
            free(m->flags);
        }
        free(m);
        return DDP_ERR_NOMEM;
    }
    m->ctx = ctx;
    m->keep = keep;
    m->async = async != 0;
    m->rank = ddp_rank(ctx);
    m->world = world;
    *out = m;
    return DDP_OK;
}

double ddp_ckpt_manager_slowest_write(const ddp_ckpt_manager *m) { return m ? m->slowest_write : 0.0; }

/* The descriptors for the MANIFEST, kept in m (their memory reused from one save to the next). */
static ddp_status keep_descs(ddp_ckpt_manager *m, const ddp_param_desc *descs, int n_params)
{
    if (n_params > m->cap_descs) {
        ddp_param_desc *grown = realloc(m->descs, (size_t)n_params * sizeof *grown);
        if (!grown)
            return DDP_ERR_NOMEM;
        m->descs = grown;
        m->cap_descs = n_params;
    }
    memcpy(m->descs, descs, (size_t)n_params * sizeof *descs);
    m->n_descs = n_params;
    return DDP_OK;
}

/* Rank 0's thread: waits for every rank's file, then writes the MANIFEST and prunes. */
static ddp_status async_commit(ddp_ckpt_manager *m, mgr_save *a)
{
    double deadline = now_s() + MGR_WAIT_S;
    while (!ddp_ckpt_dir_files_present(a->path, m->world)) {
        if (atomic_load(&a->cancel))
            return DDP_ERR_IO;
        if (now_s() > deadline) {
            DDP_ERROR("checkpoint %s: the other ranks' files did not appear within %.0f s: no MANIFEST",
                      a->path, MGR_WAIT_S);
            return DDP_ERR_TIMEOUT;
        }
        usleep(2000);
    }
    errno = 0;
    ddp_status st = ddp_ckpt_dir_commit(a->path, m->world, m->descs, m->n_descs, a->shard);
    a->err = errno;
    if (st == DDP_OK) {
        DDP_INFO("checkpoint %s (step %ld): written in the background in %.3f s", a->path, a->step,
                 now_s() - a->t0);
        ddp_ckpt_manager_prune(m);
    }
    return st;
}

static void *async_main(void *arg)
{
    ddp_ckpt_manager *m = arg;
    mgr_save *a = &m->pending;
    errno = 0;
    a->st = ddp_snapshot_wait(m->ctx); /* the shard's copies from the device (ddp_snapshot_copy) */
    if (a->st == DDP_OK)
        a->st = ddp_ckpt_dir_write_shard(a->path, m->rank, m->world, a->shard);
    a->err = errno;
    atomic_store(&a->written, 1);
    if (m->rank == 0 && a->st == DDP_OK)
        a->st = async_commit(m, a);
    return NULL;
}

/* Waits for this process's thread (rank 0: its MANIFEST too, unless cancelled). */
static ddp_status async_join(mgr_save *a)
{
    if (a->has_thread)
        pthread_join(a->thread, NULL);
    a->active = a->has_thread = 0;
    errno = a->err;
    return a->st;
}

ddp_status ddp_ckpt_manager_wait(ddp_ckpt_manager *m)
{
    if (!m)
        return DDP_ERR_INVALID_ARG;
    mgr_save *a = &m->pending;
    if (!a->active)
        return DDP_OK;
    while (!atomic_load(&a->written))
        usleep(1000);
    int64_t failed = mgr_agree(m, a->st != DDP_OK);
    int mine = m->flags[m->rank] != 0;
    if (m->rank == 0 && failed)
        atomic_store(&a->cancel, 1);
    ddp_status st = async_join(a);
    int err = errno;
    if (m->rank == 0 && failed && !mine) { /* rank 0 wrote its file, another rank did not */
        ddp_log_failed_ranks(m->flags, m->world, a->path);
        st = DDP_ERR_IO;
        err = 0;
    }
    if (st != DDP_OK)
        DDP_ERROR("checkpoint %s at step %ld (written in the background) failed%s%s; the previous "
                  "checkpoints are kept", a->path, a->step, err ? ": " : "", err ? strerror(err) : "");
    errno = err;
    return st;
}

void ddp_ckpt_manager_destroy(ddp_ckpt_manager *m)
{
    if (!m)
        return;
    mgr_save *a = &m->pending;
    if (a->active && async_join(a) != DDP_OK)
        DDP_ERROR("checkpoint %s (step %ld), written in the background: failed: %s", a->path, a->step,
                  a->err ? strerror(a->err) : "see above");
    free(m->descs);
    free(m->flags);
    free(m->dir);
    free(m);
}

ddp_status ddp_ckpt_manager_save_file(ddp_ckpt_manager *m, long step, const ddp_state *state)
{
    char path[MGR_PATH_MAX];
    ddp_status st = ddp_ckpt_manager_path(m, step, path, sizeof path);
    if (st != DDP_OK)
        return st;
    errno = 0;
    st = ddp_state_save(state, path);
    int err = errno;
    if (st == DDP_OK)
        ddp_ckpt_manager_prune(m);
    errno = st == DDP_ERR_IO ? err : 0;
    return st;
}

ddp_status ddp_ckpt_manager_save(ddp_ckpt_manager *m, long step, const ddp_state *shard,
                                 const ddp_param_desc *descs, int n_params, int background)
{
    if (!m)
        return DDP_ERR_INVALID_ARG;
    char path[MGR_PATH_MAX];
    ddp_status prev = ddp_ckpt_manager_wait(m);
    int prev_err = errno;
    ddp_status st = ddp_ckpt_manager_path(m, step, path, sizeof path);
    if (st == DDP_OK && m->rank == 0)
        st = descs && n_params >= 1 ? keep_descs(m, descs, n_params) : DDP_ERR_INVALID_ARG;
    if (st == DDP_OK && m->rank == 0 && !ddp_checkpoint_is_folder(path) && !is_link(path))
        st = ddp_ckpt_manager_remove(m, step); /* a file of this step (written as a file before) */
    if (st == DDP_OK && m->rank == 0)
        st = ddp_ckpt_dir_begin(path);
    mgr_agree(m, st != DDP_OK);
    if (m->flags[0]) /* rank 0 could not begin: no rank writes, the others did not fail */
        return m->rank == 0 ? st : prev;
    mgr_save *a = &m->pending;
    if (background && m->async) {
        *a = (mgr_save){.active = 1, .shard = shard, .step = step, .t0 = now_s(),
                        .st = shard ? DDP_OK : DDP_ERR_INVALID_ARG};
        atomic_init(&a->written, 1);
        atomic_init(&a->cancel, 0);
        snprintf(a->path, sizeof a->path, "%s", path);
        if (a->st == DDP_OK) {
            atomic_store(&a->written, 0);
            a->has_thread = pthread_create(&a->thread, NULL, async_main, m) == 0;
            if (!a->has_thread) {
                a->st = DDP_ERR_NOMEM;
                atomic_store(&a->written, 1);
            }
        }
        errno = prev != DDP_OK ? prev_err : 0;
        return prev; /* this save's failure is known when it ends */
    }
    double t0 = now_s();
    errno = 0;
    st = shard ? ddp_snapshot_wait(m->ctx) : DDP_ERR_INVALID_ARG;
    if (st == DDP_OK)
        st = ddp_ckpt_dir_write_shard(path, m->rank, m->world, shard);
    int err = errno;
    m->slowest_write = now_s() - t0;
    if (m->world > 1)
        mgr_must(m, ddp_allreduce_host(m->ctx, &m->slowest_write, 1, DDP_FP64, DDP_MAX),
                 "agreeing on the checkpoint's write time");
    int64_t failed = mgr_agree(m, st != DDP_OK);
    if (m->rank == 0 && st == DDP_OK && failed) {
        ddp_log_failed_ranks(m->flags, m->world, path);
        st = DDP_ERR_IO;
        err = 0;
    } else if (m->rank == 0 && st == DDP_OK) {
        errno = 0;
        st = ddp_ckpt_dir_commit(path, m->world, m->descs, m->n_descs, shard);
        err = errno;
        if (st == DDP_OK)
            ddp_ckpt_manager_prune(m);
    }
    if (prev != DDP_OK) { /* the one before failed: said first */
        st = prev;
        err = prev_err;
    }
    errno = st == DDP_ERR_IO ? err : 0;
    return st;
}
