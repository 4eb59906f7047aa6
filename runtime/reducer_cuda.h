/* reducer_cuda.h - the reducer's exposed communication on CUDA, measured with CUDA events
 * (reducer_cuda.c).
 *
 * A sync step's exposed interval starts when the reducer's stream has done the work queued
 * before finish() (the backward pass) and ends when that stream has also waited for every
 * bucket's all-reduce: its length, max(0, all-reduces done - backward done), is the time the step
 * waited for communication that the backward pass did not hide. Two events per interval, read
 * with cudaEventElapsedTime once complete: never a host wait while training. The same timer
 * measures the other waits of a stream for communication: a bucket-owned reducer's wait for an
 * older reduce-scatter in the middle of the backward pass (its buffer is recycled), and the
 * forward pass's waits for the parameters' all-gather. A few intervals may be in flight (the host
 * runs ahead of the device); when all slots are in flight the oldest is given up (counted, not
 * measured).
 *
 * Private to libddp. Streams are cudaStream_t values, never NULL here (the caller resolves NULL
 * to ddp_backend_stream()). Without CUDA in the build every function fails with
 * DDP_ERR_UNSUPPORTED or reports nothing.
 */
#ifndef DDP_REDUCER_CUDA_H
#define DDP_REDUCER_CUDA_H

#include <stdint.h>

#include "ddp.h"

typedef struct exposed_timer exposed_timer;

/* Creates the timer's events on the current device, room for `slots` (>= 1) intervals in
 * flight. DDP_ERR_CUDA (logged) or DDP_ERR_NOMEM on failure, *out NULL then;
 * DDP_ERR_UNSUPPORTED without CUDA. */
ddp_status exposed_timer_create(int slots, exposed_timer **out);
/* Frees the events (pending intervals are dropped). NULL is ignored. */
void exposed_timer_destroy(exposed_timer *t);
/* Starts an interval: records its start event on `stream` after everything queued there. */
ddp_status exposed_timer_start(exposed_timer *t, void *stream);
/* Ends the interval begun by the last start: records its end event on `stream`. */
ddp_status exposed_timer_stop(exposed_timer *t, void *stream);
/* The oldest ended interval whose events have completed: 1 and its length in *ns (removed from
 * the timer), else 0. With wait != 0 it first waits for that interval's end under the deadline
 * (DDP_TIMEOUT; cuda_wait.c), else it never blocks. A CUDA error drops the interval (logged). */
int exposed_timer_next(exposed_timer *t, int wait, int64_t *ns);
/* Intervals given up so far because every slot was still in flight. */
long exposed_timer_dropped(const exposed_timer *t);

#endif /* DDP_REDUCER_CUDA_H */
