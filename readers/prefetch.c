/* prefetch.c - worker threads that make ddp-train's training batches ahead (see prefetch.h).
 *
 * Slots: a ring of `depth` (2 x workers, at least 1) buffers. Batch k goes to slot k % depth.
 * A worker may fill slot k % depth once the training thread released batch k - depth; the
 * training thread takes batch k once it is filled. One mutex and one condition variable guard
 * the ring; workers gather without holding it.
 */
#include "prefetch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sample_fp.h"

typedef struct prefetch_slot {
    float *x;  /* (batch, pixels) */
    int *y;    /* (batch) */
    long seq;  /* batch held, -1 when free */
    uint64_t fp; /* its samples' fingerprint (sample_fp.h) */
} prefetch_slot;

typedef struct prefetch_worker {
    prefetch *owner;
    int index;
    pthread_t thread;
    int started;
    ddp_sampler *sampler;
    size_t *indices; /* the sampler's indices of `epoch` */
    long epoch;      /* -1: none yet */
} prefetch_worker;

struct prefetch {
    prefetch_plan plan;
    size_t pixels;
    long first;       /* first batch of the sequence: first_step * accum */
    long n_batches;   /* total_steps * accum */
    int depth;
    prefetch_slot *slots;
    prefetch_worker *workers; /* plan.workers entries, or one used inline when 0 */
    int n_workers;
    long next;        /* next batch the training thread takes */
    uint64_t last_fp; /* the fingerprint of the batch prefetch_next returned last */
    long released;    /* batches released so far (all of [0, released)) */
    int stopping, failed;
    pthread_mutex_t lock;
    pthread_cond_t cv;
};

/* SplitMix64 finaliser: a well-mixed 64-bit hash. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void model_augment_shift(float *img, int rows, int cols, uint64_t seed, int epoch, size_t sample)
{
    uint64_t h = mix64(mix64(seed ^ ((uint64_t)epoch << 40)) + sample);
    int dy = (int)(h % 5) - 2, dx = (int)((h >> 8) % 5) - 2;
    float src[28 * 28], background = (0.0f - 0.1307f) / 0.3081f;
    if (rows * cols > 28 * 28 || (dx == 0 && dy == 0))
        return;
    memcpy(src, img, (size_t)rows * (size_t)cols * sizeof *src);
    for (int y = 0; y < rows; y++) {
        for (int x = 0; x < cols; x++) {
            int sy = y - dy, sx = x - dx;
            int inside = sy >= 0 && sy < rows && sx >= 0 && sx < cols;
            img[y * cols + x] = inside ? src[sy * cols + sx] : background;
        }
    }
}

/* Makes batch k into slot s with worker w's sampler. */
static ddp_status make_batch(prefetch *p, prefetch_worker *w, long k, prefetch_slot *s)
{
    const prefetch_plan *pl = &p->plan;
    long step = k / pl->accum, epoch = step / pl->steps_per_epoch;
    if (w->epoch != epoch) {
        ddp_status st = ddp_sampler_indices(w->sampler, (uint64_t)epoch, w->indices);
        if (st != DDP_OK)
            return st;
        w->epoch = epoch;
    }
    size_t first = (size_t)((step % pl->steps_per_epoch) * pl->accum + k % pl->accum) * (size_t)pl->batch;
    const size_t *idx = w->indices + first;
    mnist_gather(pl->data, idx, pl->batch, s->x, s->y);
    s->fp = 0;
    for (int i = 0; i < pl->batch; i++)
        s->fp += sample_fp(idx[i]);
    for (int i = 0; pl->augment && i < pl->batch; i++)
        model_augment_shift(s->x + (size_t)i * p->pixels, pl->data->rows, pl->data->cols, pl->seed,
                            (int)epoch, idx[i]);
    return DDP_OK;
}

static void *worker_main(void *arg)
{
    prefetch_worker *w = arg;
    prefetch *p = w->owner;
    for (long k = p->first + w->index; k < p->n_batches; k += p->n_workers) {
        prefetch_slot *s = &p->slots[k % p->depth];
        pthread_mutex_lock(&p->lock);
        while (!p->stopping && p->released < k - p->depth + 1)
            pthread_cond_wait(&p->cv, &p->lock);
        int stop = p->stopping;
        pthread_mutex_unlock(&p->lock);
        if (stop)
            break;
        ddp_status st = make_batch(p, w, k, s);
        pthread_mutex_lock(&p->lock);
        s->seq = k;
        p->failed |= st != DDP_OK;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

static ddp_status worker_init(prefetch *p, prefetch_worker *w, int index)
{
    *w = (prefetch_worker){.owner = p, .index = index, .epoch = -1};
    ddp_status st = ddp_sampler_create(&p->plan.sampler, &w->sampler);
    if (st != DDP_OK)
        return st;
    w->indices = malloc(ddp_sampler_len(w->sampler) * sizeof *w->indices);
    return w->indices ? DDP_OK : DDP_ERR_NOMEM;
}

static ddp_status prefetch_alloc(prefetch *p)
{
    p->slots = calloc((size_t)p->depth, sizeof *p->slots);
    p->workers = calloc((size_t)(p->n_workers ? p->n_workers : 1), sizeof *p->workers);
    if (!p->slots || !p->workers)
        return DDP_ERR_NOMEM;
    for (int i = 0; i < p->depth; i++) {
        p->slots[i].seq = -1;
        p->slots[i].x = malloc((size_t)p->plan.batch * p->pixels * sizeof *p->slots[i].x);
        p->slots[i].y = malloc((size_t)p->plan.batch * sizeof *p->slots[i].y);
        if (!p->slots[i].x || !p->slots[i].y)
            return DDP_ERR_NOMEM;
    }
    ddp_status st = DDP_OK;
    for (int w = 0; st == DDP_OK && w < (p->n_workers ? p->n_workers : 1); w++)
        st = worker_init(p, &p->workers[w], w);
    return st;
}

static ddp_status prefetch_start(prefetch *p)
{
    for (int w = 0; w < p->n_workers; w++) {
        if (pthread_create(&p->workers[w].thread, NULL, worker_main, &p->workers[w]) != 0) {
            DDP_ERROR("--workers %d: cannot start data worker thread %d; use fewer workers or 0",
                      p->n_workers, w);
            return DDP_ERR_NOMEM;
        }
        p->workers[w].started = 1;
    }
    return DDP_OK;
}

ddp_status prefetch_create(const prefetch_plan *plan, prefetch **out)
{
    *out = NULL;
    if (!plan->data || plan->batch < 1 || plan->accum < 1 || plan->steps_per_epoch < 1 ||
        plan->total_steps < 0 || plan->first_step < 0 || plan->first_step > plan->total_steps ||
        plan->workers < 0) {
        DDP_ERROR("prefetch_create: invalid plan (batch %d, accum %d, steps per epoch %ld, "
                  "first step %ld of %ld, workers %d)", plan->batch, plan->accum,
                  plan->steps_per_epoch, plan->first_step, plan->total_steps, plan->workers);
        return DDP_ERR_INVALID_ARG;
    }
    prefetch *p = calloc(1, sizeof *p);
    if (!p)
        return DDP_ERR_NOMEM;
    p->plan = *plan;
    p->pixels = (size_t)plan->data->rows * (size_t)plan->data->cols;
    p->n_batches = plan->total_steps * plan->accum;
    p->first = p->next = p->released = plan->first_step * plan->accum;
    p->n_workers = plan->workers;
    p->depth = plan->workers > 0 ? 2 * plan->workers : 1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cv, NULL);
    ddp_status st = prefetch_alloc(p);
    if (st == DDP_OK)
        st = prefetch_start(p);
    if (st != DDP_OK) {
        if (st == DDP_ERR_NOMEM)
            DDP_ERROR("out of memory for %d data worker(s) and %d batch slots", p->n_workers, p->depth);
        prefetch_destroy(p);
        return st;
    }
    *out = p;
    return DDP_OK;
}

ddp_status prefetch_next(prefetch *p, const float **x, const int **y)
{
    if (p->next >= p->n_batches || p->next > p->released) {
        DDP_ERROR("prefetch_next: batch %ld asked for, plan has %ld (release each batch first)",
                  p->next, p->n_batches);
        return DDP_ERR_STATE;
    }
    prefetch_slot *s = &p->slots[p->next % p->depth];
    ddp_status st = DDP_OK;
    if (p->n_workers == 0) {
        st = make_batch(p, &p->workers[0], p->next, s);
    } else {
        pthread_mutex_lock(&p->lock);
        while (s->seq != p->next && !p->failed)
            pthread_cond_wait(&p->cv, &p->lock);
        st = p->failed ? DDP_ERR_STATE : DDP_OK;
        pthread_mutex_unlock(&p->lock);
    }
    if (st != DDP_OK) {
        DDP_ERROR("a data worker failed to make batch %ld (see above)", p->next);
        return st;
    }
    *x = s->x;
    *y = s->y;
    p->last_fp = s->fp;
    p->next++;
    return DDP_OK;
}

void prefetch_release(prefetch *p)
{
    pthread_mutex_lock(&p->lock);
    p->released = p->next;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
}

void prefetch_destroy(prefetch *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
    for (int w = 0; p->workers && w < (p->n_workers ? p->n_workers : 1); w++) {
        if (p->workers[w].started)
            pthread_join(p->workers[w].thread, NULL);
        ddp_sampler_destroy(p->workers[w].sampler);
        free(p->workers[w].indices);
    }
    for (int i = 0; p->slots && i < p->depth; i++) {
        free(p->slots[i].x);
        free(p->slots[i].y);
    }
    free(p->slots);
    free(p->workers);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

uint64_t prefetch_last_fp(const prefetch *p) { return p->last_fp; }
