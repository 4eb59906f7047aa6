/* supervise.c - the supervisors of ddp-launch -n N: without mpirun it forks the ranks, each in its
 * own process group, passes SIGUSR1/SIGUSR2 on to them, and when one fails (or on SIGINT/SIGTERM)
 * stops the others and names the rank that failed; with mpirun it waits for mpirun and turns a
 * SIGTERM into the clean stop that mpirun's own SIGTERM handling does not allow. In a Slurm batch
 * script (--max-restarts) it runs each generation's srun, reading srun's stderr line by line, and
 * the probe steps that tell a lost node from a live one. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

static volatile sig_atomic_t g_forward_signal;
static volatile sig_atomic_t g_stop_requests; /* SIGINT, SIGTERM, SIGHUP received */

static void on_signal(int sig)
{
    g_forward_signal = sig;
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
        g_stop_requests = 1;
}

int launch_stop_requested(void) { return g_stop_requests != 0; }

static int exit_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Stops the children still running, each with its process group (a rank's own children, e.g. a
 * shell's, go too): SIGTERM, then SIGKILL after a grace of 5 s. */
static void stop_children(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            kill(-pids[i], SIGTERM);
    for (int tick = 0; tick < 100; tick++) {
        int alive = 0;
        for (int i = 0; i < n; i++)
            if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == 0)
                alive++;
            else
                pids[i] = -1;
        if (!alive)
            return;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0 && kill(-pids[i], SIGKILL) == 0)
            waitpid(pids[i], NULL, 0);
}

/* Sends SIG to every child still running, with its process group. */
static void signal_children(const pid_t *pids, int n, int sig)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            kill(-pids[i], sig);
}

/* Names the rank that failed and how. */
static void report_failure(int rank, pid_t pid, int status)
{
    if (WIFSIGNALED(status))
        fprintf(stderr, "ddp-launch: rank %d (pid %ld) was killed by signal %d (%s); stopping the other ranks\n",
                rank, (long)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        fprintf(stderr, "ddp-launch: rank %d (pid %ld) exited with status %d; stopping the other ranks\n", rank,
                (long)pid, WEXITSTATUS(status));
}

/* Waits for the children; passes SIGUSR1/SIGUSR2 on to them (Slurm's --signal warning) and keeps
 * waiting; on the first failure, or SIGINT/SIGTERM (passed on too), stops the rest. Returns the
 * exit status to report: the first failing child's, 128 + the stopping signal, or 0. */
static int supervise(pid_t *pids, int n)
{
    int running = n, result = 0;
    while (running > 0) {
        int status, sig = g_forward_signal;
        pid_t pid;
        if (sig) {
            g_forward_signal = 0;
            signal_children(pids, n, sig);
            if (sig == SIGUSR1 || sig == SIGUSR2)
                continue;
            result = 128 + sig;
            break;
        }
        pid = waitpid(-1, &status, 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        int rank = -1;
        for (int i = 0; i < n; i++)
            if (pids[i] == pid) {
                rank = i;
                pids[i] = -1;
            }
        running--;
        if (exit_code(status) != 0) {
            result = exit_code(status);
            kill(-pid, SIGKILL); /* what the failed rank left behind in its group */
            report_failure(rank, pid, status);
            break;
        }
    }
    stop_children(pids, n);
    return result;
}

int launch_fork_ranks(const struct launch_layout *base, launch_rank_fn run, void *arg, char *err, size_t errlen)
{
    pid_t *pids = calloc((size_t)base->world_size, sizeof *pids);
    int rc;
    struct sigaction sa = {.sa_handler = on_signal};
    static const int forwarded[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    if (!pids) {
        snprintf(err, errlen, "out of memory for %d ranks", base->world_size);
        return -1;
    }
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaction(forwarded[i], &sa, NULL);
    for (int r = 0; r < base->world_size; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            struct launch_layout l = *base;
            setpgid(0, 0); /* own group: stop_children reaches the rank's children too */
            for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
                signal(forwarded[i], SIG_DFL);
            l.rank = l.local_rank = r;
            _exit(run(&l, arg));
        }
        if (pids[r] > 0)
            setpgid(pids[r], pids[r]); /* also here, so no kill can come before the child's own */
        if (pids[r] < 0) {
            snprintf(err, errlen, "fork failed: %s", strerror(errno));
            stop_children(pids, r);
            free(pids);
            return -1;
        }
    }
    rc = supervise(pids, base->world_size);
    free(pids);
    return rc;
}

int launch_supervise_mpirun(char *const *argv)
{
    static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: sleeps end on a signal */
    int stops = 0, status;
    for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++)
        sigaction(caught[i], &sa, NULL);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++)
            signal(caught[i], SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "ddp-launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    for (;;) {
        int sig = g_forward_signal;
        if (sig) {
            g_forward_signal = 0;
            if (sig == SIGUSR1 || sig == SIGUSR2) {
                kill(pid, sig);
            } else if (stops++ == 0) {
                fprintf(stderr, "ddp-launch: %s: asking every rank to stop after the same step (SIGUSR2 "
                        "through mpirun: ddp-train checkpoints and exits 0); another one ends the job\n",
                        strsignal(sig));
                kill(pid, SIGUSR2);
            } else {
                kill(pid, SIGTERM);
            }
        }
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid)
            return exit_code(status);
        if (done < 0 && errno != EINTR)
            return 1;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
}

/* Copies the complete lines in BUF[0..*LEN) to stderr, handing each to ON_LINE; keeps the rest
 * (a line not yet ended) at the start of BUF. A line longer than the buffer is cut. */
static void emit_lines(char *buf, size_t *len, size_t cap, launch_line_fn on_line, void *arg)
{
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] != '\n')
            continue;
        buf[i] = '\0';
        fprintf(stderr, "%s\n", buf + start);
        if (on_line)
            on_line(buf + start, arg);
        start = i + 1;
    }
    memmove(buf, buf + start, *len - start);
    *len -= start;
    if (*len == cap) { /* no newline in a full buffer: pass it on as one line */
        buf[cap - 1] = '\n';
        emit_lines(buf, len, cap, on_line, arg);
    }
}

/* Passes a signal ddp-launch received on to PID: SIGUSR1/SIGUSR2 as they are, SIGINT, SIGTERM
 * and SIGHUP as SIGTERM (srun hands it to every task: ddp-train stops after the same step). */
static void pass_signal(pid_t pid)
{
    int sig = g_forward_signal;
    if (!sig)
        return;
    g_forward_signal = 0;
    kill(pid, sig == SIGUSR1 || sig == SIGUSR2 ? sig : SIGTERM);
}

int launch_supervise_lines(char *const *argv, launch_line_fn on_line, void *arg)
{
    static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: poll ends on a signal */
    int fds[2], status;
    char buf[8192];
    size_t len = 0;
    for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++)
        sigaction(caught[i], &sa, NULL);
    if (pipe(fds) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++)
            signal(caught[i], SIG_DFL);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "ddp-launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    for (int open_fd = 1; open_fd;) { /* until srun (and whatever inherited its stderr) closes it */
        pass_signal(pid);
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        if (poll(&p, 1, 200) <= 0)
            continue;
        ssize_t n = read(fds[0], buf + len, sizeof buf - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            open_fd = 0;
            if (len < sizeof buf)
                buf[len++] = '\n'; /* the last line, even without its newline */
        } else {
            len += (size_t)n;
        }
        emit_lines(buf, &len, sizeof buf, on_line, arg);
    }
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 1;
        else
            pass_signal(pid);
    return exit_code(status);
}

int launch_run_probes(char *const *const *argvs, int n, double limit_s, int *status)
{
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    struct timespec t0, t;
    if (!pids)
        return -1;
    fflush(NULL);
    for (int i = 0; i < n; i++) {
        status[i] = -1;
        pids[i] = fork();
        if (pids[i] == 0) {
            int null = open("/dev/null", O_RDWR);
            dup2(null, STDOUT_FILENO);
            dup2(null, STDERR_FILENO);
            execvp(argvs[i][0], argvs[i]);
            _exit(127);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int left = n; left > 0;) {
        for (int i = 0; i < n; i++) {
            int st;
            if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                status[i] = exit_code(st);
                pids[i] = -1;
                left--;
            } else if (pids[i] < 0 && status[i] == -1) {
                status[i] = -2; /* fork failed: not probed */
                left--;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > limit_s)
            break;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0 && kill(pids[i], SIGKILL) == 0)
            waitpid(pids[i], NULL, 0);
    free(pids);
    return 0;
}
