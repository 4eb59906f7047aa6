/* reducer_cuda.c - the reducer's exposed-communication timer on CUDA events (reducer_cuda.h):
 * a ring of start/end event pairs, one pair per interval in flight; stubs without CUDA.
 */
#include <stdlib.h>

#include "config.h"
#include "internal.h"
#include "reducer_cuda.h"

#if HAVE_CUDA
#include <cuda_runtime.h>

struct exposed_timer {
    int slots;          /* intervals the host may run ahead of the device, measured */
    cudaEvent_t *start; /* (slots) the stream's earlier work done */
    cudaEvent_t *end;   /* (slots) ... and its waits for the communication done */
    int head;    /* slot of the oldest ended interval not read */
    int n_ended; /* ended intervals not read, in slots head, head + 1, ... */
    int open;    /* the interval in slot head + n_ended was started, not ended */
    long dropped;
};

static ddp_status timer_check(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return DDP_OK;
    DDP_ERROR("reducer: exposed-communication timer: %s failed: %s (%s)", what,
              cudaGetErrorString(err), cudaGetErrorName(err));
    return DDP_ERR_CUDA;
}

ddp_status exposed_timer_create(int slots, exposed_timer **out)
{
    *out = NULL;
    slots = slots > 0 ? slots : 1;
    exposed_timer *t = calloc(1, sizeof *t);
    cudaEvent_t *start = calloc((size_t)slots, sizeof *start);
    cudaEvent_t *end = calloc((size_t)slots, sizeof *end);
    if (!t || !start || !end) {
        DDP_ERROR("reducer: out of memory for the exposed-communication timer");
        free(t);
        free(start);
        free(end);
        return DDP_ERR_NOMEM;
    }
    *t = (exposed_timer){.slots = slots, .start = start, .end = end};
    ddp_status st = DDP_OK;
    for (int i = 0; i < slots && st == DDP_OK; i++) {
        st = timer_check(cudaEventCreate(&t->start[i]), "cudaEventCreate");
        if (st == DDP_OK)
            st = timer_check(cudaEventCreate(&t->end[i]), "cudaEventCreate");
    }
    if (st != DDP_OK) {
        exposed_timer_destroy(t);
        return st;
    }
    *out = t;
    return DDP_OK;
}

void exposed_timer_destroy(exposed_timer *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->slots; i++) {
        if (t->start[i])
            cudaEventDestroy(t->start[i]);
        if (t->end[i])
            cudaEventDestroy(t->end[i]);
    }
    free(t->start);
    free(t->end);
    free(t);
}

/* Forgets the oldest ended interval. */
static void timer_pop(exposed_timer *t)
{
    t->head = (t->head + 1) % t->slots;
    t->n_ended--;
}

ddp_status exposed_timer_start(exposed_timer *t, void *stream)
{
    if (t->n_ended == t->slots) { /* every slot in flight: give the oldest up */
        timer_pop(t);
        t->dropped++;
    }
    int slot = (t->head + t->n_ended) % t->slots;
    ddp_status st = timer_check(cudaEventRecord(t->start[slot], (cudaStream_t)stream),
                                "cudaEventRecord of the start");
    t->open = st == DDP_OK;
    return st;
}

ddp_status exposed_timer_stop(exposed_timer *t, void *stream)
{
    if (!t->open)
        return DDP_OK; /* its start failed, and said so */
    int slot = (t->head + t->n_ended) % t->slots;
    t->open = 0;
    ddp_status st = timer_check(cudaEventRecord(t->end[slot], (cudaStream_t)stream),
                                "cudaEventRecord of the end");
    if (st == DDP_OK)
        t->n_ended++;
    return st;
}

int exposed_timer_next(exposed_timer *t, int wait, int64_t *ns)
{
    if (t->n_ended == 0)
        return 0;
    int slot = t->head;
    if (wait && cuda_event_wait(t->end[slot], "reducer: exposed-communication timer") != DDP_OK) {
        timer_pop(t); /* the wait said why */
        return 0;
    }
    cudaError_t err = cudaEventQuery(t->end[slot]);
    if (err == cudaErrorNotReady)
        return 0;
    float ms = 0.0f;
    if (err == cudaSuccess)
        err = cudaEventElapsedTime(&ms, t->start[slot], t->end[slot]);
    timer_pop(t);
    if (timer_check(err, "reading the events") != DDP_OK)
        return 0;
    *ns = (int64_t)((double)ms * 1e6);
    return 1;
}

long exposed_timer_dropped(const exposed_timer *t)
{
    return t ? t->dropped : 0;
}

#else /* no CUDA in this build: the reducer never creates a timer on the CPU backend */

ddp_status exposed_timer_create(int slots, exposed_timer **out)
{
    (void)slots;
    *out = NULL;
    DDP_ERROR("reducer: this libddp was built without CUDA");
    return DDP_ERR_UNSUPPORTED;
}

void exposed_timer_destroy(exposed_timer *t)
{
    (void)t;
}

ddp_status exposed_timer_start(exposed_timer *t, void *stream)
{
    (void)t, (void)stream;
    return DDP_ERR_UNSUPPORTED;
}

ddp_status exposed_timer_stop(exposed_timer *t, void *stream)
{
    (void)t, (void)stream;
    return DDP_ERR_UNSUPPORTED;
}

int exposed_timer_next(exposed_timer *t, int wait, int64_t *ns)
{
    (void)t, (void)wait, (void)ns;
    return 0;
}

long exposed_timer_dropped(const exposed_timer *t)
{
    (void)t;
    return 0;
}

#endif
