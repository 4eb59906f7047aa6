/* cuda_wait.c - host waits on CUDA work under the one deadline (DDP_TIMEOUT): instead of blocking
 * in cudaStreamSynchronize, which never returns when a peer of an NCCL collective died, a wait
 * polls cudaEventQuery and the communicator's asynchronous error (the "watch", set by
 * comm_nccl.c) until the event completes, the communicator reports an error, or the deadline
 * passes; then it aborts the communicator (ncclCommAbort, as NCCL's documentation prescribes
 * after an asynchronous error) so that the queued operations end. Also: ordering libddp's stream
 * with a caller's stream.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "internal.h"

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static ddp_status (*watch_check)(void *arg);
static void (*watch_on_timeout)(void *arg);
static void *watch_arg;

void cuda_set_watch(ddp_status (*check)(void *arg), void (*on_timeout)(void *arg), void *arg)
{
    pthread_mutex_lock(&watch_lock);
    watch_check = check;
    watch_on_timeout = on_timeout;
    watch_arg = arg;
    pthread_mutex_unlock(&watch_lock);
}

static double wait_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The watch's verdict (DDP_OK without a watch). */
static ddp_status wait_check_watch(void)
{
    pthread_mutex_lock(&watch_lock);
    ddp_status st = watch_check ? watch_check(watch_arg) : DDP_OK;
    pthread_mutex_unlock(&watch_lock);
    return st;
}

static void wait_expired(const char *what, double limit)
{
    DDP_ERROR("%s: GPU work not complete after %.3g s (DDP_TIMEOUT): a peer rank may have died or "
              "be stuck; aborting the NCCL communicator. Raise DDP_TIMEOUT if steps are this slow",
              what, limit);
    watchdog_survey();
    pthread_mutex_lock(&watch_lock);
    if (watch_on_timeout)
        watch_on_timeout(watch_arg);
    pthread_mutex_unlock(&watch_lock);
}

/* Sleeps a little longer each round: spin-yield first (short waits stay cheap), then up to 1 ms. */
static void wait_pause(int round)
{
    if (round < 64) {
        sched_yield();
        return;
    }
    long ns = round < 256 ? 20000L : 1000000L;
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = ns}, NULL);
}

ddp_status cuda_event_wait(void *event, const char *what)
{
    double limit = timeout_seconds(), deadline = wait_now() + limit;
    for (int round = 0;; round++) {
        cudaError_t q = cudaEventQuery((cudaEvent_t)event);
        if (q == cudaSuccess)
            return DDP_OK;
        if (q != cudaErrorNotReady) {
            DDP_ERROR("%s: cudaEventQuery failed: %s (%s)", what, cudaGetErrorString(q),
                      cudaGetErrorName(q));
            return DDP_ERR_CUDA;
        }
        ddp_status st = wait_check_watch();
        if (st != DDP_OK)
            return st;
        if (wait_now() > deadline) {
            wait_expired(what, limit);
            return DDP_ERR_TIMEOUT;
        }
        wait_pause(round);
    }
}

ddp_status cuda_stream_wait(void *stream, const char *what)
{
    cudaEvent_t ev = NULL;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventRecord(ev, (cudaStream_t)stream);
    if (err != cudaSuccess) {
        DDP_ERROR("%s: cannot record an event to wait for: %s", what, cudaGetErrorString(err));
        if (ev)
            cudaEventDestroy(ev);
        return DDP_ERR_CUDA;
    }
    ddp_status st = cuda_event_wait(ev, what);
    cudaEventDestroy(ev);
    return st;
}

ddp_status cuda_join(void *first, void *then)
{
    cudaEvent_t ev = NULL;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventRecord(ev, (cudaStream_t)first);
    if (err == cudaSuccess)
        err = cudaStreamWaitEvent((cudaStream_t)then, ev, 0);
    if (ev)
        cudaEventDestroy(ev); /* released once the wait has been satisfied */
    if (err != cudaSuccess) {
        DDP_ERROR("cannot order the streams: %s (%s)", cudaGetErrorString(err),
                  cudaGetErrorName(err));
        return DDP_ERR_CUDA;
    }
    return DDP_OK;
}
