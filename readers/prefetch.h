/* prefetch.h - ddp-train's training batches, made ahead of time by worker threads (PyTorch's
 * DataLoader workers): gather from the sampler's indices, augment, convert to float.
 *
 * The batches form one sequence fixed by the plan: micro-batch k is micro-step k % accum of
 * global optimizer step s = k / accum, in epoch s / steps_per_epoch, taking samples
 * [(s % steps_per_epoch) * accum + k % accum] * batch ... of that epoch's sampler indices. Each
 * batch is a pure function of (data, sampler, seed, epoch, k): the same seed gives the same
 * batches whatever the number of workers. Worker w makes batches k = w, w + N, ...; a bounded
 * ring of 2N slots holds the finished ones until the training thread takes them in order.
 */
#ifndef READERS_PREFETCH_H
#define READERS_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "mnist.h"

typedef struct prefetch_plan {
    const mnist *data;     /* training split (kept, not owned) */
    ddp_sampler_opts sampler;  /* the training sampler's options (each worker makes its own) */
    int batch, accum;
    long steps_per_epoch, total_steps;
    long first_step;           /* the sequence starts at this optimizer step (0, or a resumed one) */
    uint64_t seed;             /* augmentation seed */
    int augment;               /* shift images by up to 2 pixels */
    int workers;               /* 0: batches made on the calling thread when asked for */
} prefetch_plan;

typedef struct prefetch prefetch;

/* Starts the workers. DDP_ERR_INVALID_ARG for a bad plan, DDP_ERR_NOMEM when buffers or threads
 * cannot be had (logged). On failure *out is NULL. */
ddp_status prefetch_create(const prefetch_plan *plan, prefetch **out);
/* The next micro-batch of the sequence: *x (batch, rows*cols) floats and *y (batch) labels in
 * host memory, valid until prefetch_release(). DDP_ERR_STATE past the planned end or when a
 * worker failed (logged). */
ddp_status prefetch_next(prefetch *p, const float **x, const int **y);
/* The fingerprint of the last prefetch_next()'s samples (sample_fp.h: the sum over them). */
uint64_t prefetch_last_fp(const prefetch *p);
/* Gives the batch of the last prefetch_next() back to the workers. */
void prefetch_release(prefetch *p);
/* Stops the workers (even mid-plan, e.g. after SIGUSR1) and frees everything. NULL is ignored. */
void prefetch_destroy(prefetch *p);

/* Shifts one normalised (rows, cols) image by an offset in [-2, 2]^2 drawn from (seed, epoch,
 * sample), so the result does not depend on the rank; uncovered pixels get the background. */
void model_augment_shift(float *img, int rows, int cols, uint64_t seed, int epoch, size_t sample);

#endif /* READERS_PREFETCH_H */
