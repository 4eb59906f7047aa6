/* grad_pool.c - the bucket buffers of a reducer that owns the gradients (zero_stage 2 without a
 * flat gradient buffer, internal.h): a bucket takes a buffer when the backward pass first writes
 * one of its gradients in a micro-step and gives it back once its reduce-scatter has been waited
 * for.
 *
 * Buffers are freed only with the pool. A bucket takes the buffer it had last time when that one
 * is free: a program that writes and marks its parameters in the same order every step then
 * takes the same buffers at the same moments, and allocates nothing after its first step. Else
 * the smallest free buffer that fits, else a new one of the bucket's allocation size (the
 * reducer's choice: the largest of the buckets that share buffers, so that any of them fits any
 * of their buffers and the pool holds about as many as are alive at once, not one per size).
 */
#include <stdlib.h>

#include "internal.h"

typedef struct pool_buf {
    void *grads;  /* cap elements of the gradients' type, backend memory */
    void *wire;   /* cap elements of the wire type, or NULL when it is the gradients' */
    size_t cap;
    int holder;   /* the bucket holding it, -1 when free */
} pool_buf;

struct grad_pool {
    ddp_ctx *ctx;
    ddp_dtype grad_t, wire_t;
    size_t *alloc_n; /* n_buckets: the elements of a new buffer for each bucket */
    int n_buckets;
    pool_buf *bufs; /* n_buckets entries (a bucket holds one buffer at most), n_bufs in use */
    int n_bufs;
    int *held;      /* n_buckets: the buffer each bucket holds, -1 */
    int *last;      /* n_buckets: the buffer each bucket held last, -1 */
    size_t bytes;
};

ddp_status grad_pool_create(ddp_ctx *ctx, int n_buckets, const size_t *alloc_n, ddp_dtype grad_t,
                            ddp_dtype wire_t, grad_pool **out)
{
    *out = NULL;
    grad_pool *p = calloc(1, sizeof *p);
    if (p) {
        p->bufs = calloc((size_t)n_buckets, sizeof *p->bufs);
        p->held = malloc((size_t)n_buckets * sizeof *p->held);
        p->last = malloc((size_t)n_buckets * sizeof *p->last);
        p->alloc_n = malloc((size_t)n_buckets * sizeof *p->alloc_n);
    }
    if (!p || !p->bufs || !p->held || !p->last || !p->alloc_n) {
        DDP_ERROR("reducer: out of memory for the table of %d bucket buffers", n_buckets);
        grad_pool_destroy(p);
        return DDP_ERR_NOMEM;
    }
    p->ctx = ctx;
    p->grad_t = grad_t;
    p->wire_t = wire_t;
    p->n_buckets = n_buckets;
    for (int b = 0; b < n_buckets; b++) {
        p->held[b] = p->last[b] = -1;
        p->alloc_n[b] = alloc_n[b];
    }
    *out = p;
    return DDP_OK;
}

void grad_pool_destroy(grad_pool *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_bufs; i++) {
        ddp_free(p->ctx, p->bufs[i].grads);
        ddp_free(p->ctx, p->bufs[i].wire);
    }
    free(p->bufs);
    free(p->held);
    free(p->last);
    free(p->alloc_n);
    free(p);
}

/* A free buffer of at least n elements: the bucket's last one, else the smallest; -1 if none. */
static int pool_find(const grad_pool *p, int b, size_t n)
{
    int last = p->last[b], best = -1;
    if (last >= 0 && p->bufs[last].holder < 0 && p->bufs[last].cap >= n)
        return last;
    for (int i = 0; i < p->n_bufs; i++) {
        const pool_buf *f = &p->bufs[i];
        if (f->holder < 0 && f->cap >= n && (best < 0 || f->cap < p->bufs[best].cap))
            best = i;
    }
    return best;
}

/* A new buffer of max(n, bucket b's allocation size) elements; -1 when out of memory (logged). */
static int pool_grow(grad_pool *p, int b, size_t n)
{
    pool_buf *f = &p->bufs[p->n_bufs];
    size_t cap = n > p->alloc_n[b] ? n : p->alloc_n[b];
    f->grads = ddp_alloc(p->ctx, cap * ddp_dtype_size(p->grad_t));
    f->wire = p->wire_t != p->grad_t ? ddp_alloc(p->ctx, cap * ddp_dtype_size(p->wire_t)) : NULL;
    if (!f->grads || (p->wire_t != p->grad_t && !f->wire)) {
        DDP_ERROR("reducer: out of memory for a bucket buffer of %zu elements (the pool holds "
                  "%d buffers, %.1f MiB): use smaller buckets", cap, p->n_bufs,
                  (double)p->bytes / (1024.0 * 1024.0));
        ddp_free(p->ctx, f->grads);
        ddp_free(p->ctx, f->wire);
        *f = (pool_buf){0};
        return -1;
    }
    f->cap = cap;
    f->holder = -1;
    p->bytes += cap * (ddp_dtype_size(p->grad_t) + (f->wire ? ddp_dtype_size(p->wire_t) : 0));
    return p->n_bufs++;
}

ddp_status grad_pool_take(grad_pool *p, int b, size_t n, void **grads, void **wire, int *fresh)
{
    *fresh = p->held[b] < 0;
    if (*fresh) {
        int i = pool_find(p, b, n);
        if (i < 0 && p->n_bufs == p->n_buckets) { /* the table holds one buffer per bucket */
            DDP_ERROR("reducer: bucket %d needs a buffer of %zu elements, but the pool already "
                      "holds %d (one per bucket), none free and large enough", b, n, p->n_bufs);
            return DDP_ERR_STATE;
        }
        if (i < 0 && (i = pool_grow(p, b, n)) < 0)
            return DDP_ERR_NOMEM;
        p->bufs[i].holder = b;
        p->held[b] = p->last[b] = i;
    }
    *grads = p->bufs[p->held[b]].grads;
    *wire = p->bufs[p->held[b]].wire;
    return DDP_OK;
}

void grad_pool_give_back(grad_pool *p, int b)
{
    if (p->held[b] < 0)
        return;
    p->bufs[p->held[b]].holder = -1;
    p->held[b] = -1;
}

size_t grad_pool_bytes(const grad_pool *p)
{
    return p ? p->bytes : 0;
}
