/* supervise.c - the supervisors of ddp-launch -n N: without mpirun it forks the ranks, each in its
 * own process group, passes SIGUSR1/SIGUSR2 on to them, and when one fails (or on SIGINT/SIGTERM)
 * stops the others and names the rank that failed; with mpirun it waits for mpirun and turns a
 * SIGTERM into the clean stop that mpirun's own SIGTERM handling does not allow. */
#include <errno.h>
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
