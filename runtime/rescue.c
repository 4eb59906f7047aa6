/* rescue.c - rescue copies: when the watchdog ends a job (a peer gone, a collective past its
 * deadline, an ABORT passed along the ring), each surviving process can leave the training state
 * of its last completed step in node-local memory before MPI_Abort, with no collective call, so
 * that the next generation of an elastic run starts from it instead of the last disk checkpoint.
 *
 * Consistency. The program brackets every change of the state it saves (the optimizer step and
 * the step counter) with ddp_rescue_hold and ddp_rescue_release(step): a mutex. The watchdog
 * thread takes it (waiting at most RESCUE_HOLD_S), so it sees the state between two steps; the
 * main thread, which may be blocked in a collective with the dead peer, never runs another
 * update: the process ends holding the mutex.
 *
 * One copy per node and step. Every rank of a plain data-parallel run holds the whole state, so
 * the first survivor on a node to create DIR/step-N.claim (O_EXCL) writes DIR/step-N.rescue
 * (ddp_state_save: temporary file, rename) and removes the claim; the others wait for the claim to
 * go (at most RESCUE_WAIT_S) before their MPI_Abort, since that abort makes the launcher kill every
 * process of the job, the writer too. A writer killed mid-write leaves a claim and no copy: the
 * next generation falls back to the disk checkpoint.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddp_checkpoint.h"
#include "internal.h"

#define RESCUE_HOLD_S 5.0  /* the longest wait for the main thread to finish an update */
#define RESCUE_WAIT_S 10.0 /* the longest wait for another rank's copy of the same step */
#define RESCUE_PATH_MAX 4096

static struct {
    pthread_mutex_t gate; /* held by the program while the state changes */
    char dir[RESCUE_PATH_MAX];
    ddp_rescue_fn fn;
    void *arg;
    long step;            /* the last completed step (ddp_rescue_release); -1: none yet */
    int armed, rank;
} rescue = {.gate = PTHREAD_MUTEX_INITIALIZER, .step = -1};

static double rescue_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ddp_status ddp_rescue_arm(ddp_ctx *ctx, const char *dir, long step, ddp_rescue_fn fn, void *arg)
{
    if (!ctx || !dir || !dir[0] || !fn || step < 0 || strlen(dir) + 32 > RESCUE_PATH_MAX)
        return DDP_ERR_INVALID_ARG;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        DDP_ERROR("rescue copies: cannot create the folder %s: %s", dir, strerror(errno));
        return DDP_ERR_IO;
    }
    pthread_mutex_lock(&rescue.gate);
    snprintf(rescue.dir, sizeof rescue.dir, "%s", dir);
    rescue.fn = fn;
    rescue.arg = arg;
    rescue.step = step;
    rescue.rank = ddp_rank(ctx);
    rescue.armed = 1;
    pthread_mutex_unlock(&rescue.gate);
    return DDP_OK;
}

void ddp_rescue_disarm(void)
{
    pthread_mutex_lock(&rescue.gate);
    rescue.armed = 0;
    pthread_mutex_unlock(&rescue.gate);
}

void ddp_rescue_hold(void) { pthread_mutex_lock(&rescue.gate); }

void ddp_rescue_release(long step)
{
    rescue.step = step;
    pthread_mutex_unlock(&rescue.gate);
}

int ddp_rescue_path(const char *dir, long step, char *path, size_t n)
{
    int len = snprintf(path, n, "%s/step-%012ld.rescue", dir, step);
    return len > 0 && (size_t)len < n ? 0 : -1;
}

ddp_status ddp_rescue_list(const char *dir, long **steps, size_t *n)
{
    if (!dir || !steps || !n)
        return DDP_ERR_INVALID_ARG;
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? DDP_OK : DDP_ERR_IO;
    size_t cap = 0;
    ddp_status st = DDP_OK;
    for (struct dirent *e; st == DDP_OK && (e = readdir(d));) {
        long step = ckpt_name_step(e->d_name, ".rescue");
        struct stat sb;
        if (step < 0 || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(sb.st_mode)) /* a link or anything else is not a copy written here */
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            long *grown = realloc(*steps, cap * sizeof *grown);
            if (!grown) {
                st = DDP_ERR_NOMEM;
                break;
            }
            *steps = grown;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (st != DDP_OK) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return st;
    }
    if (*n > 1)
        qsort(*steps, *n, sizeof **steps, ckpt_newest_first);
    return DDP_OK;
}

int ddp_rescue_clear(const char *dir)
{
    DIR *d = dir ? opendir(dir) : NULL;
    int removed = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat sb;
        if ((ckpt_name_step(e->d_name, ".rescue") < 0 && ckpt_name_step(e->d_name, ".claim") < 0) ||
            fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
            continue; /* only this file's own names, never through a link */
        removed += unlinkat(dirfd(d), e->d_name, 0) == 0;
    }
    closedir(d);
    ddp_checkpoint_remove_stale(dir); /* a writer's temporary file, killed mid-write */
    return removed;
}

/* This process writes the copy of `step`: claim, state, save, claim removed. */
static void rescue_write(long step, const char *claim, double detected, const char *cause)
{
    char path[RESCUE_PATH_MAX + 32];
    double t0 = rescue_now();
    ddp_state *st = NULL;
    ddp_status rc = rescue.fn(rescue.arg, step, &st);
    if (rc == DDP_OK && ddp_rescue_path(rescue.dir, step, path, sizeof path) != 0)
        rc = DDP_ERR_INVALID_ARG;
    if (rc == DDP_OK) /* for the next generation's report: when, and how long it took */
        rc = ddp_state_set_f64(st, "rescue.detected_at", detected);
    if (rc == DDP_OK)
        rc = ddp_state_set_f64(st, "rescue.copy_s", rescue_now() - t0);
    if (rc == DDP_OK)
        rc = ddp_state_set_text(st, "rescue.cause", cause);
    if (rc == DDP_OK)
        rc = ddp_state_save(st, path);
    ddp_state_destroy(st);
    unlink(claim);
    if (rc == DDP_OK)
        DDP_WARN("rescue copy of step %ld written to %s in %.3f s (the next generation of an "
                 "elastic run starts from it)", step, path, rescue_now() - t0);
    else
        DDP_ERROR("rescue copy of step %ld: failed (%s): the next generation starts from the last "
                  "disk checkpoint", step, ddp_strerror(rc));
}

void rescue_on_end(const char *cause)
{
    if (!rescue.armed) /* read unlocked: the main thread may hold the gate forever */
        return;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall); /* compared across processes: the wall clock */
    double detected = (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec;
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_sec += (time_t)RESCUE_HOLD_S;
    if (pthread_mutex_timedlock(&rescue.gate, &at) != 0) {
        DDP_ERROR("rescue copy: the state did not settle within %.0f s (an optimizer step that "
                  "waits on a collective): none written", RESCUE_HOLD_S);
        return;
    }
    if (!rescue.armed) {
        pthread_mutex_unlock(&rescue.gate);
        return;
    }
    long step = rescue.step; /* the gate stays held: no update runs after the copy */
    char claim[RESCUE_PATH_MAX + 32], path[RESCUE_PATH_MAX + 32];
    snprintf(claim, sizeof claim, "%s/step-%012ld.claim", rescue.dir, step);
    ddp_rescue_path(rescue.dir, step, path, sizeof path);
    if (access(path, F_OK) == 0)
        return; /* another rank on this node wrote it already */
    int fd = open(claim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
        close(fd);
        rescue_write(step, claim, detected, cause);
        return;
    }
    double give_up = rescue_now() + RESCUE_WAIT_S; /* another rank writes it: wait, then abort */
    while (access(claim, F_OK) == 0 && rescue_now() < give_up)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
}

/* Appends "NAME X s" when both clocks are known and in order; returns b (the phase's end). */
static double phase(char *text, size_t n, const char *name, double a, double b)
{
    size_t len = strlen(text);
    if (a > 0 && b >= a && len < n)
        snprintf(text + len, n - len, "%s%s %.3f s", len ? ", " : "", name, b - a);
    return b > 0 ? b : a;
}

double ddp_rescue_phases(const ddp_ctx *ctx, const ddp_state *st, char *text, size_t n)
{
    double detected = 0, copy_s = 0, launched = 0, now;
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    now = (double)w.tv_sec + 1e-9 * (double)w.tv_nsec;
    const char *env = getenv("DDP_ELASTIC_LAUNCHED_AT");
    if (env)
        launched = strtod(env, NULL);
    if (st && ddp_state_f64(st, "rescue.detected_at", &detected))
        (void)ddp_state_f64(st, "rescue.copy_s", &copy_s);
    if (!text || n == 0)
        return -1;
    text[0] = '\0';
    double t = phase(text, n, "snapshot", detected, detected > 0 ? detected + copy_s : 0);
    t = phase(text, n, "relaunch", t, launched);
    t = phase(text, n, "process start", t, ctx ? ctx->init_begin : 0);
    t = phase(text, n, "ddp_init", t, ctx ? ctx->init_end : 0);
    phase(text, n, "load", t, now);
    double first = detected > 0 ? detected : launched > 0 ? launched : ctx ? ctx->init_begin : 0;
    size_t len = strlen(text);
    if (first > 0 && len < n)
        snprintf(text + len, n - len, ": %.3f s in all", now - first);
    return first > 0 ? now - first : -1;
}
