/* comm_mpi.c - the MPI communicator: collectives on host memory.
 *
 * Blocking collectives run in the caller's thread on one duplicate of MPI_COMM_WORLD. Non-blocking
 * all-reduces are queued FIFO to ONE worker thread per communicator, which performs them in order
 * with blocking MPI calls on a second duplicate, so they progress while the caller computes; the
 * two duplicates keep the two threads' collectives apart (MPI_THREAD_MULTIPLE is required).
 * Reduce-scatters and all-gathers with per-rank counts (the sharded reducer, ddp_reduce_scatter,
 * ddp_allgather_typed) are queued on the same thread, in the same FIFO; their per-rank blocks
 * must fit one MPI call (INT_MAX elements, or bytes for the all-gather: not chunked).
 * All-reduce counts above INT_MAX are split into chunks; DDP_COMM_MAX_CHUNK (elements or bytes per MPI call)
 * lowers the chunk size, for tests and tuning. Every started request must be waited for before
 * the communicator is destroyed. Every MPI call runs under the watchdog's deadline (watchdog.c):
 * blocking ones on the caller's lane, queued all-reduces on the communication thread's lane.
 * 16-bit types: MPI has none, so bf16 and fp16 travel as MPI_UINT16_T with user-defined ops
 * (MPI_Op_create, commutative) that widen each pair of elements to fp32, add them and round back
 * to nearest even (half.h): the bytes on the wire are half of fp32's. 16-bit all-reduces
 * are sums (and averages) only: comm.c refuses MAX and MIN on them.
 * Desync check (desync.c; DDP_DESYNC_CHECK, on by default): inside each collective's watch, before
 * its first MPI call, the ranks compare what they are about to call, on the same communicator;
 * an all-reduce of runs is checked once, as a whole.
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>

#include "convert.h"
#include "ddp_trace.h"
#include "desync.h"
#include "half.h"
#include "internal.h"
#include "try.h"
#include "simd_clones.h"

typedef struct mpi_state mpi_state;

/* What a queued request does. */
typedef enum mpi_kind { MPI_KIND_ALLREDUCE, MPI_KIND_REDUCE_SCATTER, MPI_KIND_ALLGATHER } mpi_kind;

typedef struct mpi_request {
    const comm_ops *ops; /* first member: ddp_wait() dispatches on it */
    mpi_state *owner;
    mpi_kind kind;
    const void *send;    /* reduce-scatter / all-gather: the send buffer (MPI_IN_PLACE for one) */
    int *counts, *displs; /* reduce-scatter / all-gather: world entries each (owned); an
                             all-gather of runs: world entries per run */
    void *buf;
    size_t n;
    const size_t *run_off, *run_len; /* n_runs > 0: runs of buf instead of buf[0..n) */
    size_t *gather_at; /* an all-gather of n_runs runs: run i's first element (owned) */
    int n_runs;
    ddp_dtype dtype;
    ddp_reduce_op op;
    ddp_status status; /* valid once done */
    int done;
    int64_t trace_tag; /* args.arg of its "allreduce" trace span */
    struct mpi_request *next;
} mpi_request;

struct mpi_state {
    MPI_Comm comm;       /* blocking collectives, caller's thread */
    MPI_Comm async_comm; /* queued all-reduces, worker thread only */
    int size, rank;
    size_t max_chunk; /* elements or bytes per MPI call, <= INT_MAX */
    int desync;       /* the desync check is on (desync_agree) */
    MPI_Op half_sum[2];   /* user ops adding 16-bit elements: [0] bf16, [1] fp16 */
    pthread_t worker;
    int worker_started;
    pthread_mutex_t lock;
    pthread_cond_t work_cv; /* signalled when the queue grows or stopping is set */
    pthread_cond_t done_cv; /* signalled when a request completes */
    mpi_request *head, *tail;
    int stopping;
};

static const comm_ops mpi_ops;

static mpi_state *mpi_of(comm_group *c)
{
    return (mpi_state *)c->impl;
}

static size_t mpi_min(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* ---- 16-bit user ops: inout[i] = round(widen(in[i]) + widen(inout[i])) ---------------------- */

SIMD_BODY void half_sum_body(const void *in, void *inout, int len, int fp16)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < len; i++)
        b[i] = half_encode(half_decode(a[i], fp16) + half_decode(b[i], fp16), fp16);
}
/* One body per type (fp16 a constant in each), so each variant's loop vectorises. */
SIMD_BODY void bf16_sum_body(const void *in, void *inout, int len) { half_sum_body(in, inout, len, 0); }
SIMD_BODY void fp16_sum_body(const void *in, void *inout, int len) { half_sum_body(in, inout, len, 1); }
SIMD_DISPATCH(bf16_sum, bf16_sum_body, (const void *in, void *inout, int len), (in, inout, len))
SIMD_DISPATCH(fp16_sum, fp16_sum_body, (const void *in, void *inout, int len), (in, inout, len))

static void mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    bf16_sum(in, inout, *len);
}

static void mpi_sum_fp16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    fp16_sum(in, inout, *len);
}

static ddp_status mpi_create_half_ops(mpi_state *s)
{
    ddp_status st = DDP_OK;
    TRY_MPI_GOTO(MPI_Op_create(mpi_sum_bf16, 1, &s->half_sum[0]));
    TRY_MPI_GOTO(MPI_Op_create(mpi_sum_fp16, 1, &s->half_sum[1]));
cleanup:
    return st;
}

static void mpi_free_half_ops(mpi_state *s)
{
    for (int h = 0; h < 2; h++)
        if (s->half_sum[h] != MPI_OP_NULL)
            MPI_Op_free(&s->half_sum[h]);
}

/* The MPI type and op for an element type and reduce op (AVG reduces as SUM). */
static void mpi_type_op(const mpi_state *s, ddp_dtype dtype, ddp_reduce_op op, MPI_Datatype *type,
                        MPI_Op *mop)
{
    *mop = op == DDP_MAX ? MPI_MAX : op == DDP_MIN ? MPI_MIN : MPI_SUM;
    switch (dtype) {
    case DDP_BF16:
    case DDP_FP16:
        *type = MPI_UINT16_T;
        *mop = s->half_sum[dtype == DDP_FP16];
        break;
    case DDP_FP64: *type = MPI_DOUBLE; break;
    case DDP_INT64: *type = MPI_INT64_T; break;
    default: *type = MPI_FLOAT; break;
    }
}

/* AVG: divides the sum by the world size, in the element's type (rounded once for 16 bits). */
static void mpi_divide(void *buf, size_t n, ddp_dtype dtype, int world)
{
    if (dtype == DDP_FP64) {
        for (size_t i = 0; i < n; i++)
            ((double *)buf)[i] /= (double)world;
        return;
    }
    if (dtype == DDP_FP32) {
        for (size_t i = 0; i < n; i++)
            ((float *)buf)[i] /= (float)world;
        return;
    }
    convert_host_scale(buf, dtype, n, 1.0f / (float)world);
}

/* A call as the desync check sees it (no root, one buffer, no per-rank counts). */
static desync_call mpi_call(const char *what, int dtype, int op, uint64_t count)
{
    return (desync_call){.what = what, .dtype = dtype, .op = op, .root = -1, .count = count};
}

/* The desync check of `call`, about to run on comm as collective seq of the lane: DDP_OK when the
 * check is off or call is NULL (a later run of an all-reduce of runs, checked as a whole). */
static ddp_status mpi_check(const mpi_state *s, MPI_Comm comm, int lane, uint64_t seq,
                            const desync_call *call)
{
    return s->desync && call ? desync_check(comm, lane, seq, call) : DDP_OK;
}

/* In-place all-reduce of buf[0..n) on comm, in chunks; AVG divides the sum by the world size.
 * call: what the desync check compares first (NULL: nothing). */
static ddp_status mpi_allreduce_on(MPI_Comm comm, const mpi_state *s, void *buf, size_t n,
                                   ddp_dtype dtype, ddp_reduce_op op, int lane, int bucket,
                                   const desync_call *call)
{
    ddp_status st = DDP_OK;
    MPI_Datatype type;
    MPI_Op mop;
    mpi_type_op(s, dtype, op, &type, &mop);
    size_t size = ddp_dtype_size(dtype);
    uint64_t seq = watch_enter(lane, "all-reduce", bucket, n * size);
    TRY_OK_GOTO(mpi_check(s, comm, lane, seq, call));
    for (size_t off = 0; off < n; off += s->max_chunk) {
        int m = (int)mpi_min(n - off, s->max_chunk);
        TRY_MPI_GOTO(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * size, m, type, mop, comm));
    }
    if (op == DDP_AVG)
        mpi_divide(buf, n, dtype, s->size);
cleanup:
    watch_leave(lane);
    return st;
}

static ddp_status mpi_allreduce(comm_group *c, void *buf, size_t n, ddp_dtype dtype,
                                ddp_reduce_op op)
{
    mpi_state *s = mpi_of(c);
    desync_call call = mpi_call("all-reduce", (int)dtype, (int)op, n);
    return mpi_allreduce_on(s->comm, s, buf, n, dtype, op, DDP_WATCH_CALLER, -1, &call);
}

/* The trace span of a queued request. */
static const char *mpi_span_name(mpi_kind kind)
{
    return kind == MPI_KIND_REDUCE_SCATTER ? "reduce_scatter"
           : kind == MPI_KIND_ALLGATHER    ? "allgather"
                                           : "allreduce";
}

/* Elements per reduce-scatter call: Open MPI's algorithms allocate temporaries of about the
 * call's size (the ring: three blocks; in place: a copy of the whole input), so a 150 MB bucket
 * (GPT-2's wte) in one call would cost more transient memory than ZeRO saves. Chunks of 16 MiB
 * of fp32 bound that, for a few more calls (~20 us each over shared memory). */
#define RS_CHUNK ((size_t)4 << 20)

/* Reduce-scatter of r->send into r->buf with r->counts, in chunks of the packed input (each a
 * reduce-scatter with the counts of the blocks' parts inside it). Out of place this rank's block
 * lands at r->buf; in place (send == buf) it stays where it is in the packed buffer, at the sum
 * of the lower ranks' counts (every other element is then undefined). AVG divides the block. */
static ddp_status mpi_reduce_scatter_run(const mpi_state *s, const mpi_request *r)
{
    ddp_status st = DDP_OK;
    MPI_Datatype type;
    MPI_Op mop;
    mpi_type_op(s, r->dtype, r->op, &type, &mop);
    size_t total = 0, mine = 0, es = ddp_dtype_size(r->dtype);
    for (int q = 0; q < s->size; q++) {
        mine += q < s->rank ? (size_t)r->counts[q] : 0;
        total += (size_t)r->counts[q];
    }
    int in_place = r->send == r->buf;
    int *counts = malloc((size_t)s->size * sizeof *counts);
    if (!counts)
        return DDP_ERR_NOMEM; /* joins no collective: the peers wait for the deadline */
    desync_call call = mpi_call("reduce-scatter", (int)r->dtype, (int)r->op, total);
    call.counts = r->counts;
    call.n_counts = (size_t)s->size;
    uint64_t seq = watch_enter(DDP_WATCH_ASYNC, "reduce-scatter", (int)r->trace_tag, total * es);
    TRY_OK_GOTO(mpi_check(s, s->async_comm, DDP_WATCH_ASYNC, seq, &call));
    for (size_t at = 0; at < total; at += RS_CHUNK) {
        size_t end = total - at < RS_CHUNK ? total : at + RS_CHUNK, lo = 0, got = 0, from = 0;
        for (int q = 0; q < s->size; q++) { /* block q is [lo, lo + counts[q]) of the input */
            size_t a = lo > at ? lo : at, e = lo + (size_t)r->counts[q] < end ? lo + (size_t)r->counts[q] : end;
            counts[q] = e > a ? (int)(e - a) : 0;
            if (q == s->rank) {
                got = (size_t)counts[q];
                from = a;
            }
            lo += (size_t)r->counts[q];
        }
        char *chunk = (char *)r->buf + at * es;
        if (in_place) /* MPI puts this rank's part at the chunk's start: moved to its place */
            TRY_MPI_GOTO(MPI_Reduce_scatter(MPI_IN_PLACE, chunk, counts, type, mop, s->async_comm));
        else
            TRY_MPI_GOTO(MPI_Reduce_scatter((const char *)r->send + at * es,
                                            (char *)r->buf + (got ? from - mine : 0) * es, counts,
                                            type, mop, s->async_comm));
        if (in_place && got > 0)
            memmove((char *)r->buf + from * es, chunk, got * es);
    }
    if (r->op == DDP_AVG)
        mpi_divide((char *)r->buf + (in_place ? mine * es : 0), (size_t)r->counts[s->rank],
                   r->dtype, s->size);
cleanup:
    watch_leave(DDP_WATCH_ASYNC);
    free(counts);
    return st;
}

/* All-gather (v) of r->send into r->buf, counts and displacements in bytes; for an all-gather
 * of runs, each run's in place in turn (stopping at the first failure). */
static ddp_status mpi_allgather_run(const mpi_state *s, const mpi_request *r)
{
    ddp_status st = DDP_OK;
    size_t total = 0, sets = r->gather_at ? (size_t)r->n_runs : 1;
    for (size_t k = 0; k < sets * (size_t)s->size; k++)
        total += (size_t)r->counts[k];
    desync_call call = mpi_call("all-gather", (int)r->dtype, -1, total / ddp_dtype_size(r->dtype));
    call.counts = r->counts; /* bytes */
    call.n_counts = sets * (size_t)s->size;
    call.n_runs = r->gather_at ? r->n_runs : 0;
    uint64_t seq = watch_enter(DDP_WATCH_ASYNC, "all-gather", (int)r->trace_tag, total);
    TRY_OK_GOTO(mpi_check(s, s->async_comm, DDP_WATCH_ASYNC, seq, &call));
    if (!r->gather_at)
        TRY_MPI_GOTO(MPI_Allgatherv(r->send, r->send == MPI_IN_PLACE ? 0 : r->counts[s->rank],
                                    MPI_BYTE, r->buf, r->counts, r->displs, MPI_BYTE,
                                    s->async_comm));
    for (size_t i = 0; r->gather_at && i < sets; i++) {
        size_t at = i * (size_t)s->size;
        TRY_MPI_GOTO(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE,
                                    (char *)r->buf + r->gather_at[i] * ddp_dtype_size(r->dtype),
                                    r->counts + at, r->displs + at, MPI_BYTE, s->async_comm));
    }
cleanup:
    watch_leave(DDP_WATCH_ASYNC);
    return st;
}

/* A queued request: buf[0..n), or each of its runs in turn (stopping at the first failure), or
 * a reduce-scatter or all-gather. */
static ddp_status mpi_run_request(const mpi_state *s, const mpi_request *r)
{
    if (r->kind == MPI_KIND_REDUCE_SCATTER)
        return mpi_reduce_scatter_run(s, r);
    if (r->kind == MPI_KIND_ALLGATHER)
        return mpi_allgather_run(s, r);
    int bucket = (int)r->trace_tag;
    desync_call call = mpi_call("all-reduce", (int)r->dtype, (int)r->op, r->n);
    if (r->n_runs == 0)
        return mpi_allreduce_on(s->async_comm, s, r->buf, r->n, r->dtype, r->op, DDP_WATCH_ASYNC,
                                bucket, &call);
    size_t size = ddp_dtype_size(r->dtype);
    ddp_status st = DDP_OK;
    call.n_runs = r->n_runs;
    call.run_len = r->run_len;
    for (int i = 0; i < r->n_runs; i++)
        call.count += r->run_len[i];
    for (int i = 0; i < r->n_runs && st == DDP_OK; i++)
        st = mpi_allreduce_on(s->async_comm, s, (char *)r->buf + r->run_off[i] * size,
                              r->run_len[i], r->dtype, r->op, DDP_WATCH_ASYNC, bucket,
                              i == 0 ? &call : NULL);
    return st;
}

static void *mpi_worker(void *arg)
{
    mpi_state *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->work_cv, &s->lock);
        if (!s->head)
            break; /* stopping, and the queue is drained */
        mpi_request *r = s->head;
        pthread_mutex_unlock(&s->lock);
        const char *span = mpi_span_name(r->kind);
        ddp_trace_begin(span, r->trace_tag);
        ddp_status st = mpi_run_request(s, r);
        ddp_trace_end(span, r->trace_tag);
        pthread_mutex_lock(&s->lock);
        s->head = r->next;
        if (!s->head)
            s->tail = NULL;
        r->status = st;
        r->done = 1;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Queues r (filled by the caller) on the communication thread and hands it out as *req. */
static void mpi_enqueue(mpi_state *s, mpi_request *r, ddp_request **req)
{
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->lock);
    *req = (ddp_request *)r;
}

static mpi_request *mpi_new_request(mpi_state *s, void *buf, ddp_dtype dtype, ddp_reduce_op op)
{
    mpi_request *r = calloc(1, sizeof *r);
    if (!r) {
        DDP_ERROR("out of memory for an all-reduce request");
        return NULL;
    }
    *r = (mpi_request){.ops = &mpi_ops, .owner = s, .buf = buf, .dtype = dtype, .op = op,
                       .trace_tag = trace_current_tag()};
    return r;
}

static ddp_status mpi_allreduce_start(comm_group *c, void *buf, size_t n, ddp_dtype dtype,
                                      ddp_reduce_op op, void *stream, ddp_request **req)
{
    (void)stream; /* host memory: nothing to order against */
    mpi_request *r = mpi_new_request(mpi_of(c), buf, dtype, op);
    if (!r)
        return DDP_ERR_NOMEM;
    r->n = n;
    mpi_enqueue(mpi_of(c), r, req);
    return DDP_OK;
}

static ddp_status mpi_allreduce_runs_start(comm_group *c, void *base, const size_t *off,
                                           const size_t *len, int n_runs, ddp_dtype dtype,
                                           ddp_reduce_op op, void *stream, ddp_request **req)
{
    (void)stream;
    mpi_request *r = mpi_new_request(mpi_of(c), base, dtype, op);
    if (!r)
        return DDP_ERR_NOMEM;
    r->run_off = off;
    r->run_len = len;
    r->n_runs = n_runs;
    mpi_enqueue(mpi_of(c), r, req);
    return DDP_OK;
}

/* counts[q] * unit as ints in r->counts (and their prefix sums in r->displs), for n_sets sets of
 * world counts one after the other (each set's displacements from its own start);
 * DDP_ERR_UNSUPPORTED when one is over INT_MAX, which these MPI calls cannot take in one piece. */
static ddp_status mpi_int_counts(const mpi_state *s, mpi_request *r, const size_t *counts,
                                 int n_sets, size_t unit, const char *what)
{
    size_t n = (size_t)s->size * (size_t)(n_sets > 0 ? n_sets : 1);
    r->counts = calloc(n, sizeof *r->counts);
    r->displs = calloc(n, sizeof *r->displs);
    if (!r->counts || !r->displs) {
        DDP_ERROR("out of memory for a %s request", what);
        return DDP_ERR_NOMEM;
    }
    for (size_t k = 0, at = 0; k < (size_t)n_sets * (size_t)s->size; k++) {
        int q = (int)(k % (size_t)s->size);
        at = q == 0 ? 0 : at;
        if (counts[k] > INT_MAX / unit || at > INT_MAX) {
            DDP_ERROR("%s: rank %d's block of %zu elements (or the blocks before it) is over "
                      "INT_MAX units, which one MPI call cannot take: use smaller buckets",
                      what, q, counts[k]);
            return DDP_ERR_UNSUPPORTED;
        }
        r->counts[k] = (int)(counts[k] * unit);
        r->displs[k] = (int)at;
        at += counts[k] * unit;
    }
    return DDP_OK;
}

/* Frees a request that was never queued. */
static void mpi_drop_request(mpi_request *r)
{
    free(r->counts);
    free(r->displs);
    free(r->gather_at);
    free(r);
}

static ddp_status mpi_reduce_scatter_start(comm_group *c, const void *send, void *recv,
                                           const size_t *counts, ddp_dtype dtype,
                                           ddp_reduce_op op, void *stream, ddp_request **req)
{
    (void)stream;
    mpi_state *s = mpi_of(c);
    mpi_request *r = mpi_new_request(s, recv, dtype, op);
    if (!r)
        return DDP_ERR_NOMEM;
    r->kind = MPI_KIND_REDUCE_SCATTER;
    r->send = send;
    ddp_status st = mpi_int_counts(s, r, counts, 1, 1, "reduce-scatter");
    if (st != DDP_OK) {
        mpi_drop_request(r);
        return st;
    }
    mpi_enqueue(s, r, req);
    return DDP_OK;
}

static ddp_status mpi_allgatherv_start(comm_group *c, const void *send, void *recv,
                                       const size_t *counts, ddp_dtype dtype, void *stream,
                                       ddp_request **req)
{
    (void)stream;
    mpi_state *s = mpi_of(c);
    mpi_request *r = mpi_new_request(s, recv, dtype, DDP_SUM);
    if (!r)
        return DDP_ERR_NOMEM;
    r->kind = MPI_KIND_ALLGATHER;
    ddp_status st = mpi_int_counts(s, r, counts, 1, ddp_dtype_size(dtype), "all-gather");
    if (st != DDP_OK) {
        mpi_drop_request(r);
        return st;
    }
    r->send = (const char *)send == (char *)recv + r->displs[s->rank] ? MPI_IN_PLACE : send;
    mpi_enqueue(s, r, req);
    return DDP_OK;
}

static ddp_status mpi_allgatherv_runs_start(comm_group *c, void *base, const size_t *off,
                                            int n_runs, const size_t *counts, ddp_dtype dtype,
                                            void *stream, ddp_request **req)
{
    (void)stream;
    mpi_state *s = mpi_of(c);
    mpi_request *r = mpi_new_request(s, base, dtype, DDP_SUM);
    if (!r)
        return DDP_ERR_NOMEM;
    r->kind = MPI_KIND_ALLGATHER;
    r->n_runs = n_runs;
    r->gather_at = malloc((n_runs > 0 ? (size_t)n_runs : 1) * sizeof *r->gather_at);
    if (!r->gather_at) {
        DDP_ERROR("out of memory for an all-gather of %d runs", n_runs);
        mpi_drop_request(r);
        return DDP_ERR_NOMEM;
    }
    ddp_status st = mpi_int_counts(s, r, counts, n_runs, ddp_dtype_size(dtype),
                                   "all-gather of runs");
    if (st != DDP_OK) {
        mpi_drop_request(r);
        return st;
    }
    for (int i = 0; i < n_runs; i++)
        r->gather_at[i] = off[i];
    mpi_enqueue(s, r, req);
    return DDP_OK;
}

static ddp_status mpi_wait(ddp_request *req)
{
    mpi_request *r = (mpi_request *)req;
    mpi_state *s = r->owner;
    pthread_mutex_lock(&s->lock);
    while (!r->done)
        pthread_cond_wait(&s->done_cv, &s->lock);
    ddp_status st = r->status;
    pthread_mutex_unlock(&s->lock);
    mpi_drop_request(r);
    return st;
}

static ddp_status mpi_broadcast(comm_group *c, void *buf, size_t n_bytes, int root)
{
    mpi_state *s = mpi_of(c);
    ddp_status st = DDP_OK;
    desync_call call = mpi_call("broadcast", -1, -1, n_bytes);
    call.root = root;
    uint64_t seq = watch_enter(DDP_WATCH_CALLER, "broadcast", -1, n_bytes);
    TRY_OK_GOTO(mpi_check(s, s->comm, DDP_WATCH_CALLER, seq, &call));
    for (size_t off = 0; off < n_bytes; off += s->max_chunk) {
        int m = (int)mpi_min(n_bytes - off, s->max_chunk);
        TRY_MPI_GOTO(MPI_Bcast((char *)buf + off, m, MPI_BYTE, root, s->comm));
    }
cleanup:
    watch_leave(DDP_WATCH_CALLER);
    return st;
}

/* One chunk of an all-gather: bytes [off, off + m) of every rank's block. The receive type is
 * m bytes with an extent of n_bytes, so rank r's piece lands at recv + r * n_bytes + off. */
static ddp_status mpi_allgather_chunk(mpi_state *s, const char *send, char *recv, size_t n_bytes,
                                      size_t off, int m)
{
    ddp_status st = DDP_OK;
    MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    TRY_MPI_GOTO(MPI_Type_contiguous(m, MPI_BYTE, &piece));
    TRY_MPI_GOTO(MPI_Type_create_resized(piece, 0, (MPI_Aint)n_bytes, &strided));
    TRY_MPI_GOTO(MPI_Type_commit(&strided));
    TRY_MPI_GOTO(MPI_Allgather(send + off, m, MPI_BYTE, recv + off, 1, strided, s->comm));
cleanup:
    if (strided != MPI_DATATYPE_NULL)
        MPI_Type_free(&strided);
    if (piece != MPI_DATATYPE_NULL)
        MPI_Type_free(&piece);
    return st;
}

static ddp_status mpi_allgather_all(comm_group *c, const void *send, void *recv, size_t n_bytes)
{
    mpi_state *s = mpi_of(c);
    ddp_status st = DDP_OK;
    if (n_bytes <= s->max_chunk) {
        TRY_MPI_GOTO(MPI_Allgather(send, (int)n_bytes, MPI_BYTE, recv, (int)n_bytes, MPI_BYTE,
                                   s->comm));
        return DDP_OK;
    }
    for (size_t off = 0; off < n_bytes && st == DDP_OK; off += s->max_chunk)
        st = mpi_allgather_chunk(s, send, recv, n_bytes, off,
                                 (int)mpi_min(n_bytes - off, s->max_chunk));
cleanup:
    return st;
}

static ddp_status mpi_allgather(comm_group *c, const void *send, void *recv, size_t n_bytes)
{
    mpi_state *s = mpi_of(c);
    desync_call call = mpi_call("all-gather", -1, -1, n_bytes);
    uint64_t seq = watch_enter(DDP_WATCH_CALLER, "all-gather", -1, n_bytes);
    ddp_status st = mpi_check(s, s->comm, DDP_WATCH_CALLER, seq, &call);
    if (st == DDP_OK)
        st = mpi_allgather_all(c, send, recv, n_bytes);
    watch_leave(DDP_WATCH_CALLER);
    return st;
}

static ddp_status mpi_barrier(comm_group *c)
{
    ddp_status st = DDP_OK;
    mpi_state *s = mpi_of(c);
    desync_call call = mpi_call("barrier", -1, -1, 0);
    uint64_t seq = watch_enter(DDP_WATCH_CALLER, "barrier", -1, 0);
    TRY_OK_GOTO(mpi_check(s, s->comm, DDP_WATCH_CALLER, seq, &call));
    TRY_MPI_GOTO(MPI_Barrier(s->comm));
cleanup:
    watch_leave(DDP_WATCH_CALLER);
    return st;
}

static void mpi_destroy(comm_group *c)
{
    if (!c)
        return;
    mpi_state *s = mpi_of(c);
    if (s->worker_started) {
        pthread_mutex_lock(&s->lock);
        s->stopping = 1;
        pthread_cond_signal(&s->work_cv);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->worker, NULL);
    }
    mpi_free_half_ops(s);
    watch_enter(DDP_WATCH_CALLER, "MPI_Comm_free", -1, 0);
    if (s->async_comm != MPI_COMM_NULL)
        MPI_Comm_free(&s->async_comm);
    if (s->comm != MPI_COMM_NULL)
        MPI_Comm_free(&s->comm);
    watch_leave(DDP_WATCH_CALLER);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
    free(c);
}

static const comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .allreduce_start = mpi_allreduce_start,
    .allreduce_runs_start = mpi_allreduce_runs_start,
    .allgatherv_runs_start = mpi_allgatherv_runs_start,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .allgatherv_start = mpi_allgatherv_start,
    .wait = mpi_wait,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
};

/* INT_MAX, or DDP_COMM_MAX_CHUNK when it is a smaller positive number. */
static size_t mpi_max_chunk(void)
{
    const char *env = getenv("DDP_COMM_MAX_CHUNK");
    char *end = NULL;
    long long v = env ? strtoll(env, &end, 10) : 0;
    if (env && (*end != '\0' || v <= 0))
        DDP_WARN("DDP_COMM_MAX_CHUNK=%s is not a positive integer; ignored", env);
    if (env && *end == '\0' && v > 0 && v < INT_MAX)
        return (size_t)v;
    return INT_MAX;
}

static ddp_status mpi_dup(MPI_Comm *out)
{
    ddp_status st = DDP_OK;
    watch_enter(DDP_WATCH_CALLER, "MPI_Comm_dup", -1, 0);
    TRY_MPI_GOTO(MPI_Comm_dup(MPI_COMM_WORLD, out));
    TRY_MPI_GOTO(MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN));
cleanup:
    watch_leave(DDP_WATCH_CALLER);
    return st;
}

ddp_status comm_mpi_create(comm_group **out)
{
    ddp_status st = DDP_OK;
    *out = NULL;
    comm_group *c = calloc(1, sizeof *c);
    mpi_state *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c);
        free(s);
        DDP_ERROR("out of memory for the MPI communicator");
        return DDP_ERR_NOMEM;
    }
    *c = (comm_group){.ops = &mpi_ops, .impl = s};
    s->comm = s->async_comm = MPI_COMM_NULL;
    s->half_sum[0] = s->half_sum[1] = MPI_OP_NULL;
    s->max_chunk = mpi_max_chunk();
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    st = mpi_dup(&s->comm);
    if (st == DDP_OK)
        st = desync_agree(s->comm, &s->desync);
    if (st == DDP_OK)
        st = mpi_create_half_ops(s);
    if (st == DDP_OK)
        st = mpi_dup(&s->async_comm);
    if (st == DDP_OK)
        TRY_MPI_GOTO(MPI_Comm_size(s->comm, &s->size));
    if (st == DDP_OK)
        TRY_MPI_GOTO(MPI_Comm_rank(s->comm, &s->rank));
    if (st == DDP_OK && pthread_create(&s->worker, NULL, mpi_worker, s) != 0) {
        DDP_ERROR("cannot start the MPI communication thread");
        st = DDP_ERR_NOMEM;
    }
    s->worker_started = st == DDP_OK;
cleanup:
    if (st != DDP_OK) {
        mpi_destroy(c);
        return st;
    }
    *out = c;
    return DDP_OK;
}
