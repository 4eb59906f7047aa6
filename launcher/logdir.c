/* logdir.c - --log-dir: each rank's stdout and stderr go to DIR/rank.N.out and DIR/rank.N.err.
 *
 * The program writes to its log files itself (its fd 1 and 2 are the files, opened before exec),
 * so the files are complete whatever happens to any other process, and the program keeps ddp-launch's
 * PID: its exit status and Slurm's or mpirun's signals reach it unchanged. For rank 0 a follower
 * process also copies both files to the terminal (the original stdout and stderr). The follower is
 * a grandchild (not a child of the program, which may wait for its own children), ignores the
 * signals that stop jobs, wakes on inotify, watches the program through a pidfd, and exits once the
 * program has exited and the files are copied. A pipe to a tee process was rejected: a killed tee
 * would make the program's next write fail (SIGPIPE), and the file would lose what the tee had not
 * read. The follower's copy is best effort: a SIGKILL to every process of the step (scancel, or
 * Slurm cleaning up the step) can cut the terminal copy short, never the files. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"
#include "mkdir_p.h"

enum { FD_OUT = 3, FD_ERR, FD_PID, FD_FIRST_FREE }; /* the follower's descriptors */

void launch_log_paths(const char *dir, int rank, char *out_path, char *err_path, size_t len)
{
    snprintf(out_path, len, "%s/rank.%d.out", dir, rank);
    snprintf(err_path, len, "%s/rank.%d.err", dir, rank);
}

int launch_log_dir_prepare(const char *dir, char *abs_out, size_t len, char *err, size_t errlen)
{
    char resolved[PATH_MAX];
    if (mkdir_p(dir) != 0 || !realpath(dir, resolved)) {
        snprintf(err, errlen, "--log-dir %s: cannot create the folder: %s (choose a writable folder)", dir,
                 strerror(errno));
        return -1;
    }
    if (snprintf(abs_out, len, "%s", resolved) >= (int)len) {
        snprintf(err, errlen, "--log-dir %s: path too long", dir);
        return -1;
    }
    return 0;
}

/* Writes all of BUF to FD; -1 when FD is gone (the terminal closed). */
static int write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Copies what was appended to the file at FROM since the last call to TO; -1 when TO is gone. */
static int copy_new(int from, int to)
{
    char buf[65536];
    for (;;) {
        ssize_t r = read(from, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        if (write_all(to, buf, (size_t)r) != 0)
            return -1;
    }
}

/* The follower's loop: copies both files to fds 1 and 2 until the program has exited. */
static void follow(const char *out_path, const char *err_path)
{
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    struct pollfd fds[2] = {{.fd = FD_PID, .events = POLLIN}, {.fd = ino, .events = POLLIN}};
    if (ino >= 0) {
        inotify_add_watch(ino, out_path, IN_MODIFY);
        inotify_add_watch(ino, err_path, IN_MODIFY);
    }
    for (;;) {
        char events[4096];
        if (copy_new(FD_OUT, STDOUT_FILENO) != 0 || copy_new(FD_ERR, STDERR_FILENO) != 0)
            return;
        if (fds[0].revents & POLLIN) /* exited: the copies above were the last */
            return;
        fds[0].revents = fds[1].revents = 0;
        if (poll(fds, ino >= 0 ? 2 : 1, 200) > 0 && (fds[1].revents & POLLIN))
            while (read(ino, events, sizeof events) > 0) {
            }
    }
}

/* In the follower: ignores the signals that stop a job, keeps only its descriptors, and follows. */
_Noreturn static void follower_main(int rd_out, int rd_err, int pidfd, const char *out_path, const char *err_path)
{
    static const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTTOU};
    int null = open("/dev/null", O_RDONLY);
    /* Out of the way first, so that placing one descriptor cannot close another. */
    int high_out = fcntl(rd_out, F_DUPFD, 64), high_err = fcntl(rd_err, F_DUPFD, 64), high_pid = fcntl(pidfd, F_DUPFD, 64);
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        signal(ignored[i], SIG_IGN);
    prctl(PR_SET_NAME, "ddp-log-tee", 0, 0, 0);
    if (chdir("/") != 0 || high_out < 0 || high_err < 0 || high_pid < 0 || dup2(high_out, FD_OUT) < 0 || dup2(high_err, FD_ERR) < 0 ||
        dup2(high_pid, FD_PID) < 0)
        _exit(1);
    if (null >= 0)
        dup2(null, STDIN_FILENO);
    syscall(SYS_close_range, FD_FIRST_FREE, ~0U, 0);
    follow(out_path, err_path);
    _exit(0);
}

/* Starts the follower as a grandchild (its parent exits at once and is reaped here). */
static int start_follower(const char *out_path, const char *err_path, char *err, size_t errlen)
{
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0), saved = errno;
    int rd_out = open(out_path, O_RDONLY | O_CLOEXEC), rd_err = open(err_path, O_RDONLY | O_CLOEXEC);
    int status = -1;
    pid_t child = -1;
    if (pidfd >= 0 && rd_out >= 0 && rd_err >= 0) {
        fflush(NULL);
        child = fork();
        if (child == 0) {
            pid_t follower = fork();
            if (follower == 0)
                follower_main(rd_out, rd_err, pidfd, out_path, err_path);
            _exit(follower > 0 ? 0 : errno);
        }
        saved = errno;
    } else if (pidfd >= 0) {
        saved = errno;
    }
    if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) != 0)
        saved = WEXITSTATUS(status);
    if (status != 0)
        snprintf(err, errlen, "rank 0's output goes to its log files only (no copy on the terminal): %s",
                 strerror(saved));
    close(pidfd);
    close(rd_out);
    close(rd_err);
    return status == 0 ? 0 : -1;
}

/* Opens PATH for the program's output: created or truncated, appended to. */
static int open_log(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        snprintf(err, errlen, "--log-dir: cannot open %s: %s (choose a writable folder)", path, strerror(errno));
    return fd;
}

int launch_log_redirect(const char *dir, int rank, int tee, char *err, size_t errlen)
{
    char out_path[PATH_MAX + 32], err_path[PATH_MAX + 32];
    int out_fd, err_fd, rc = 0;
    launch_log_paths(dir, rank, out_path, err_path, sizeof out_path);
    out_fd = open_log(out_path, err, errlen);
    err_fd = out_fd < 0 ? -1 : open_log(err_path, err, errlen);
    if (err_fd < 0) {
        if (out_fd >= 0)
            close(out_fd);
        return -1;
    }
    if (tee && start_follower(out_path, err_path, err, errlen) != 0)
        rc = 1;
    fflush(NULL);
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0) {
        snprintf(err, errlen, "--log-dir: cannot redirect to %s: %s", out_path, strerror(errno));
        rc = -1;
    }
    close(out_fd);
    close(err_fd);
    return rc;
}
