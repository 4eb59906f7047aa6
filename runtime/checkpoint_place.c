/* checkpoint_place.c - claiming a program's checkpoint folder before training
 * (ddp_ckpt_dir_claim, ddp_checkpoint.h): its length, its lock (one job per folder), and which
 * ranks see it.
 *
 * The lock: rank 0 holds a POSIX record lock (fcntl, which NFS and Lustre carry to their lock
 * servers, unlike flock on some mounts) on DIR/.ddp-lock until it exits, and writes into the file
 * who holds it; the kernel drops the lock when the process ends however it ends, so a requeued or
 * killed job leaves nothing to clean. A file system without locks gets a warning, not a refusal.
 *
 * Visibility: rank 0 creates DIR/.ddp-probe-TOKEN (TOKEN random per job), every rank looks for
 * it, and the ranks add up who saw it. A node-local path (/tmp, a local scratch disk) exists on
 * every node but holds rank 0's probe only on rank 0's node.
 */
#include "ddp_checkpoint.h"
#include "mkdir_p.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PLACE_LOCK ".ddp-lock"
#define PLACE_PROBE ".ddp-probe-"
#define PLACE_PATH (DDP_CKPT_DIR_MAX + 64)
#define PLACE_NAMED 8 /* ranks named in a message, then a count */

/* How messages name the folder (ddp_ckpt_dir_claim's `what`). */
static const char *place_what = "checkpoint folder";
static int lock_fd = -1; /* rank 0's lock on the folder, held until the process exits */

/* A collective that fails leaves no rank waiting: the whole job stops. */
static void place_must(ddp_ctx *ctx, ddp_status st)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("%s: agreeing on it failed: %s; stopping every rank", place_what,
              ddp_strerror(st));
    ddp_abort(ctx, 1);
}

/* Who holds the lock, from the file the holder wrote (empty when unreadable). */
static void read_holder(int fd, char *out, size_t n)
{
    ssize_t got = pread(fd, out, n - 1, 0);
    out[got > 0 ? got : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
}

/* Rank 0: writes who holds the lock into it. */
static void write_holder(int fd)
{
    char host[256] = "?", when[64] = "";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    const char *job = getenv("SLURM_JOB_ID");
    if (ftruncate(fd, 0) == 0)
        dprintf(fd, "host %s, pid %ld%s%s, since %s\n", host, (long)getpid(),
                job ? ", Slurm job " : "", job ? job : "", when);
}

/* Rank 0: the folder's lock for this process's life. DDP_ERR_INVALID_ARG when another job holds
 * it, DDP_ERR_IO when the lock file cannot be made; a file system without locks is warned about. */
static ddp_status take_lock(const char *dir)
{
    char path[PLACE_PATH];
    snprintf(path, sizeof path, "%s/%s", dir, PLACE_LOCK);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    struct stat sb;
    int regular = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    if (!regular) {
        DDP_ERROR("%s %s: cannot open its lock file %s: %s (it must be a regular "
                  "file ddp can write; checked before training, so nothing is lost)", place_what,
                  dir, path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return DDP_ERR_IO;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &fl) == 0) {
        write_holder(fd);
        lock_fd = fd;
        return DDP_OK;
    }
    int err = errno;
    if (err == EACCES || err == EAGAIN) {
        char holder[512];
        read_holder(fd, holder, sizeof holder);
        DDP_ERROR("%s %s is in use by another job (%s): two jobs saving into one "
                  "folder would remove and mix each other's checkpoints; give this job its own "
                  "folder, or wait until that job ends", place_what, dir, holder[0] ? holder : "?");
        close(fd);
        return DDP_ERR_INVALID_ARG;
    }
    DDP_WARN("%s %s: its file system takes no locks (%s): nothing stops another job "
             "from saving into the same folder, so give each job its own", place_what, dir,
             strerror(err));
    close(fd);
    return DDP_OK;
}

/* Rank 0: creates the folder, takes its lock, writes the probe file for token. */
static ddp_status prepare_folder(const char *dir, uint64_t token)
{
    if (mkdir_p(dir) != 0) {
        DDP_ERROR("%s %s: cannot create it: %s; choose a writable place", place_what, dir,
                  strerror(errno));
        return DDP_ERR_IO;
    }
    ddp_status st = take_lock(dir);
    char path[PLACE_PATH];
    snprintf(path, sizeof path, "%s/%s%016" PRIx64, dir, PLACE_PROBE, token);
    int fd = st == DDP_OK ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666) : -1;
    if (st == DDP_OK && fd < 0) {
        DDP_ERROR("%s %s: cannot create a file in it: %s; choose a writable place "
                  "(checked before training, so nothing is lost)", place_what, dir,
                  strerror(errno));
        st = DDP_ERR_IO;
    }
    if (fd >= 0)
        close(fd);
    return st;
}

/* A token no other job shares, in (0, 2^63): the probe file's name. */
static uint64_t probe_token(void)
{
    uint64_t t = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &t, sizeof t) != (ssize_t)sizeof t) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        t = (uint64_t)ts.tv_nsec * 6364136223846793005ull ^ (uint64_t)ts.tv_sec ^
            (uint64_t)getpid() << 32;
    }
    if (fd >= 0)
        close(fd);
    return t >> 1 | 1; /* an int64 above 0: 0 means "rank 0 failed" below */
}

/* "2, 5, 7 and 3 more" for the ranks whose flag is set; their count. */
static int64_t name_ranks(const int64_t *flag, int world, char *out, size_t n)
{
    int64_t count = 0;
    out[0] = '\0';
    for (int r = 0; r < world; r++)
        if (flag[r] && ++count <= PLACE_NAMED)
            snprintf(out + strlen(out), n - strlen(out), "%s%d", count > 1 ? ", " : "", r);
    if (count > PLACE_NAMED)
        snprintf(out + strlen(out), n - strlen(out), " and %" PRId64 " more", count - PLACE_NAMED);
    return count;
}

/* Collective: per rank, 1 when it does not see rank 0's probe for token (or cannot write into the
 * folder), into blind[world]. */
static void look(ddp_ctx *ctx, const char *dir, uint64_t token, int64_t *blind, int world)
{
    char path[PLACE_PATH];
    snprintf(path, sizeof path, "%s/%s%016" PRIx64, dir, PLACE_PROBE, token);
    struct stat sb;
    int rank = ddp_rank(ctx);
    memset(blind, 0, (size_t)world * sizeof *blind);
    blind[rank] = !(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && access(dir, W_OK | X_OK) == 0);
    int mine = (int)blind[rank], first = -1;
    if (world > 1)
        place_must(ctx, ddp_allreduce_host(ctx, blind, (size_t)world, DDP_INT64, DDP_SUM));
    for (int r = 0; r < world && first < 0; r++)
        first = blind[r] ? r : -1;
    if (mine && rank == first) /* one line with a host name, whatever the world size */
        DDP_WARN("%s %s: this rank does not see rank 0's probe file %s (or cannot "
                 "write there): not the folder rank 0 sees", place_what, dir, path);
    if (rank == 0)
        unlink(path);
}

ddp_status ddp_ckpt_dir_claim(ddp_ctx *ctx, const char *dir, const char *what, int look_for_probe,
                              int64_t *n_blind, char *blind, size_t n)
{
    place_what = what ? what : "checkpoint folder";
    int rank0 = ddp_rank(ctx) == 0, world = ddp_world_size(ctx);
    *n_blind = 0;
    if (n > 0)
        blind[0] = '\0';
    size_t len = strlen(dir);
    if (len > DDP_CKPT_DIR_MAX) { /* the same answer on every rank: no collective needed */
        if (rank0)
            DDP_ERROR("%s: the path is %zu bytes, over the %d that leave room for "
                      "the checkpoint names below it (the system's limit is %d bytes for a "
                      "whole path): choose a shorter path, e.g. a symbolic link to the folder",
                      place_what, len, DDP_CKPT_DIR_MAX, PATH_MAX);
        return DDP_ERR_INVALID_ARG;
    }
    /* [0]: rank 0's outcome (0 ok, else a ddp_status), [1]: the probe's token (0 on failure) */
    int64_t agreed[2] = {0, 0};
    if (rank0) {
        uint64_t token = probe_token();
        ddp_status st = prepare_folder(dir, token);
        agreed[0] = st;
        agreed[1] = st == DDP_OK ? (int64_t)token : 0;
    }
    if (world > 1)
        place_must(ctx, ddp_allreduce_host(ctx, agreed, 2, DDP_INT64, DDP_SUM));
    if (agreed[0] != DDP_OK || !look_for_probe)
        return (ddp_status)agreed[0];
    int64_t *flags = calloc((size_t)world, sizeof *flags);
    if (!flags) /* the same on every rank only by luck: stop them all */
        place_must(ctx, DDP_ERR_NOMEM);
    look(ctx, dir, (uint64_t)agreed[1], flags, world);
    char names[256];
    *n_blind = name_ranks(flags, world, names, sizeof names);
    if (n > 0)
        snprintf(blind, n, "%s", names);
    free(flags);
    return DDP_OK;
}
