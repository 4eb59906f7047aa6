/* watchdog_gpu.c - the watchdog's GPU stream lane (watchdog_gpu.sh checks the report). Each step
 * (micro-step 1) every rank queues two all-reduces on its stream, buckets 1 then 0, and waits for
 * them under the deadline (DDP_TIMEOUT). At step S (default 3) the last rank does not queue them:
 * it sleeps 60 s in "forward" (late) or stops itself with SIGSTOP (stop). The other ranks' streams
 * block in the first of them, their waits pass the deadline and call watchdog_survey, whose
 * wavefront on the GPU stream lane names the last rank, then the others waiting in it; then they
 * end the job (ddp_abort), as a program does after DDP_ERR_TIMEOUT. With S over 128 the lane's
 * slots (WATCH_STREAM_SLOTS) have been reused before. full: late, and step S has 300 all-reduces
 * (buckets 299 to 0), more than the lane's slots, none of which completes.
 * Usage: wd-gpu sim|cuda late|stop|full [S]
 *   sim   the cpu backend with a simulated stream per rank: a thread that runs the queued
 *         collectives in order, each one an MPI_Allreduce on a communicator of its own (a rank that
 *         never queues one leaves the others' streams blocked in it, as NCCL's kernels would be),
 *         and a marker per collective that completes after it, as a CUDA event does. The lane is
 *         opened on it as comm_nccl.c opens it on its events, and the wait polls it under the
 *         deadline and calls watchdog_survey when it passes, as cuda_wait.c does.
 *   cuda  the cuda backend: ddp_allreduce on device memory (NCCL, or the fake NCCL with every
 *         rank on one GPU) and ddp_synchronize, libddp's own wait; skipped (77) without a GPU per
 *         rank.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

enum { N_ELEMS = 256, N_FULL = 300 };

/* The simulated stream: collectives run in queue order on its thread. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t queued;                              /* collectives queued (under lock) */
    _Atomic uint64_t completed;                   /* collectives the stream has run */
    _Atomic uint64_t marker[WATCH_STREAM_SLOTS];  /* a slot's marker completes at this count */
    MPI_Comm comm;
} sim = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *sim_main(void *arg)
{
    (void)arg;
    for (uint64_t n = 1;; n++) {
        pthread_mutex_lock(&sim.lock);
        while (sim.queued < n)
            pthread_cond_wait(&sim.cond, &sim.lock);
        pthread_mutex_unlock(&sim.lock);
        int one = 1, sum = 0;
        MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, sim.comm);
        atomic_store(&sim.completed, n);
    }
    return NULL;
}

/* The lane's query (watch_stream_open), as comm_nccl.c's cudaEventQuery of the slot's event. */
static int sim_done(void *arg, int slot)
{
    (void)arg;
    return atomic_load(&sim.completed) >= atomic_load(&sim.marker[slot]);
}

/* Queues an all-reduce of bucket b and records its marker after it, as comm_nccl.c does. */
static void sim_queue(int b)
{
    uint64_t seq = watch_stream_begin("all-reduce", b, sizeof(int));
    pthread_mutex_lock(&sim.lock);
    uint64_t n = ++sim.queued;
    pthread_cond_signal(&sim.cond);
    pthread_mutex_unlock(&sim.lock);
    atomic_store(&sim.marker[seq % WATCH_STREAM_SLOTS], n);
    watch_stream_queued(seq);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for everything queued under the deadline; past it, cuda_wait.c's path. */
static ddp_status sim_wait(void)
{
    double limit = timeout_seconds(), end = now_s() + limit;
    pthread_mutex_lock(&sim.lock);
    uint64_t n = sim.queued;
    pthread_mutex_unlock(&sim.lock);
    while (atomic_load(&sim.completed) < n) {
        if (now_s() > end) {
            fprintf(stderr, "wd-gpu: simulated GPU work not complete after %.3g s (DDP_TIMEOUT)\n",
                    limit);
            watchdog_survey();
            return DDP_ERR_TIMEOUT;
        }
        nanosleep(&(struct timespec){.tv_nsec = 1000000L}, NULL);
    }
    return DDP_OK;
}

static int sim_start(void)
{
    pthread_t t;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &sim.comm) != MPI_SUCCESS ||
        pthread_create(&t, NULL, sim_main, NULL) != 0)
        return -1;
    pthread_detach(t);
    if (!watch_stream_open(sim_done, NULL)) {
        fprintf(stderr, "wd-gpu: the GPU stream lane did not open (DDP_WATCHDOG=0?)\n");
        return -1;
    }
    return 0;
}

/* One step's n_buckets all-reduces, the last bucket first, and the wait: simulated, or libddp's
 * on the cuda backend (buf != NULL). */
static ddp_status step_sync(ddp_ctx *ctx, float *buf, int n_buckets)
{
    ddp_status st = DDP_OK;
    for (int b = n_buckets - 1; b >= 0 && st == DDP_OK; b--) {
        if (!buf) {
            sim_queue(b);
            continue;
        }
        trace_set_tag(b); /* the bucket the lane's label names, as the reducer tags it */
        st = ddp_allreduce(ctx, buf, N_ELEMS, DDP_SUM);
        trace_set_tag(-1);
    }
    if (st != DDP_OK)
        return st;
    return buf ? ddp_synchronize(ctx) : sim_wait();
}

/* 1 (saying why) when this host has fewer GPUs than ranks: NCCL needs one per rank. */
static int skip_without_gpus(void)
{
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int ranks = local ? atoi(local) : 1, gpus = ddp_cuda_device_count();
    if (gpus >= ranks)
        return 0;
    fprintf(stderr, "wd-gpu: skipped: %d rank(s) on this host but %d GPU(s)\n", ranks, gpus);
    return 1;
}

int main(int argc, char **argv)
{
    long late_step = argc == 4 ? atol(argv[3]) : 3;
    if (argc < 3 || argc > 4 || (strcmp(argv[1], "sim") && strcmp(argv[1], "cuda")) ||
        (strcmp(argv[2], "late") && strcmp(argv[2], "stop") && strcmp(argv[2], "full")) ||
        late_step < 0) {
        fprintf(stderr, "usage: wd-gpu sim|cuda late|stop|full [STEP]\n");
        return 2;
    }
    int cuda = strcmp(argv[1], "cuda") == 0, stop = strcmp(argv[2], "stop") == 0;
    int full = strcmp(argv[2], "full") == 0;
    if (cuda && skip_without_gpus())
        return 77;
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = cuda ? DDP_BACKEND_CUDA : DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    if (ddp_init(&opts, &ctx) != DDP_OK)
        return 1;
    int rank = ddp_rank(ctx), last = ddp_world_size(ctx) - 1;
    float *buf = cuda ? ddp_alloc(ctx, N_ELEMS * sizeof(float)) : NULL;
    if (cuda ? !buf : sim_start() != 0)
        ddp_abort(ctx, 1);
    for (long step = 0; step < late_step + 3; step++) {
        ddp_watch_where(step, 1, "forward");
        if (step == late_step && rank == last && stop)
            raise(SIGSTOP);
        else if (step == late_step && rank == last)
            sleep(60);
        ddp_watch_where(step, 1, "gradient sync");
        ddp_status st = step_sync(ctx, buf, full && step == late_step ? N_FULL : 2);
        if (st != DDP_OK) {
            fprintf(stderr, "wd-gpu: rank %d: step %ld: %s; ending the job\n", rank, step,
                    ddp_strerror(st));
            ddp_abort(ctx, 1);
        }
    }
    printf("rank %d: all steps done\n", rank); /* never: the last rank held a step up */
    ddp_free(ctx, buf);
    ddp_finalize(ctx);
    return 0;
}
