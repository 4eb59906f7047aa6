/* ddp_train.c - ddp-train: data-parallel training of the reference models with libddp. The loop
 * is loop.c's; the models are its tasks: MNIST (task_mnist.c) and GPT-2 (task_gpt.c).
 *
 * SIGUSR1 (Slurm's --signal=USR1@SECONDS before the time limit) and SIGTERM (the time limit
 * itself, scancel; SIGUSR2 means the same, as ddp-launch -n N sends it through mpirun) stop
 * training after a step the ranks agree on (loop.c); the handlers only set flags, so a second
 * signal during a save changes nothing. With --requeue, rank 0 then has Slurm requeue the job
 * (requeue_job), last, after MPI is closed. Exit status: 0 done (or stopped by a signal), 1 a
 * failure, 2 bad options.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint_place.h"
#include "ddp.h"
#include "loop.h"
#include "malloc_policy.h"
#include "suggest.h"
#include "train_opts.h"
#include "train_state.h"

static volatile sig_atomic_t got_usr1, got_term; /* set by the handlers */

static void train_on_signal(int sig)
{
    if (sig == SIGTERM || sig == SIGUSR2)
        got_term = 1;
    else
        got_usr1 = 1;
}

/* Rank 0, with --requeue under Slurm, after a stop by signal: the stop's checkpoint complete, then
 * `scontrol requeue $SLURM_JOB_ID` (Slurm ends this job's processes and starts it again, and
 * --resume auto continues). DDP_ERR_ENV when the job id is missing or scontrol failed (logged). */
static ddp_status requeue_job(void)
{
    train_checkpoints_end();
    const char *job = getenv("SLURM_JOB_ID");
    if (!job || !job[0]) {
        DDP_ERROR("--requeue: SLURM_JOB_ID is not set (not a Slurm job): nothing to requeue");
        return DDP_ERR_ENV;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("scontrol", "scontrol", "requeue", job, (char *)NULL);
        fprintf(stderr, "--requeue: cannot run scontrol: %s\n", strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        DDP_ERROR("--requeue: `scontrol requeue %s` failed (status %d): requeue the job by hand, "
                  "it continues from its checkpoint with --resume auto", job,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return DDP_ERR_ENV;
    }
    printf("requeued Slurm job %s: it continues from the checkpoint when it starts again\n", job);
    fflush(stdout);
    return DDP_OK;
}

int main(int argc, char **argv)
{
    if (ops_blas_prefer_fast_kernels(argv) != 0)
        return 2;
    malloc_policy();
    struct sigaction sa = {.sa_handler = train_on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    train_opts o;
    train_parse_result pr = train_parse_args(argc, argv, &o);
    if (pr == TRAIN_PARSE_USAGE && !suggest_first_rank())
        sleep(2); /* the first rank says why: mpirun ends the job at the first exit, so not before */
    if (pr != TRAIN_PARSE_RUN)
        return pr == TRAIN_PARSE_HELP ? 0 : 2;
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = o.device;
    io.threads = o.threads;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&io, &ctx);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-train: cannot start: %s\n", ddp_strerror(st));
        return 1;
    }
    int requeue = 0;
    st = checkpoint_place(ctx, &o);
    if (st == DDP_OK)
        st = train_run(ctx, &o, o.gpt.on ? &train_task_gpt : &train_task_mnist,
                       (train_signals){.usr1 = &got_usr1, .term = &got_term}, &requeue);
    ddp_finalize(ctx);
    if (requeue) /* last, after MPI is closed: Slurm ends this job's processes when it requeues */
        st = requeue_job();
    return st == DDP_OK ? 0 : 1;
}
