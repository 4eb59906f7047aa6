/* fake_nccl.c - a test-only NCCL over MPI, so that several ranks can share one GPU: libddp's
 * multi-rank NCCL paths run on a machine with one GPU (NCCL 2.28 refuses two ranks of a
 * communicator on one GPU). Never installed; put in front of the real NCCL with LD_PRELOAD
 * (tests/nccl_fake/fake_rank.sh) or linked instead of it (test_fake_nccl).
 *
 * Identity: ncclGetVersion reports FAKE_NCCL_VERSION_CODE, the NCCL it was built against with
 * patch level 99 (2.28.99 for NCCL 2.28.9's header; NCCL has never had such a patch level), and
 * the library exports `const int fake_nccl_marker` (the same code), which libddp looks up with
 * dlsym(RTLD_DEFAULT, ...) to allow two ranks on one GPU (runtime/context.c).
 *
 * Semantics. ncclCommInitRank splits MPI_COMM_WORLD (color: a hash of the unique id, key: rank),
 * so EVERY rank of MPI_COMM_WORLD must call it, for the same communicators in the same order
 * (libddp does: one communicator over the world); nranks and rank are checked against the split.
 * MPI must be initialised with MPI_THREAD_MULTIPLE (libddp's ddp_init asks for it and refuses
 * less; the fake checks again): the MPI calls run on CUDA's host-function thread while the
 * caller's threads use MPI on other communicators. Each collective, on the stream it was given:
 * device -> pinned staging copies of the input (and of the output buffer, so that an operation
 * that fails leaves it unchanged), ONE host function running the MPI equivalent on the staged
 * bytes (MPI_Iallreduce, MPI_Ireduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast,
 * polled with MPI_Test so that ncclCommAbort can end the wait), staging -> device copies of the
 * output, and a host function that returns the staging buffer to a process-wide pool (never
 * freed while a copy or host function may still use it). bf16/fp16 reductions are done in fp32
 * (widened, reduced, rounded once to nearest even); ncclAvg is a sum divided by nranks (integer
 * division for integer types). A group (ncclGroupStart/End, nested) records its calls and queues,
 * per (communicator, stream), one host function that runs them in call order; every rank issues
 * the same sequence, so MPI matches them. A call refused inside a group fails the whole group:
 * ncclGroupEnd returns the first error and queues nothing (NCCL does the same).
 * Argument rules (NCCL's, and stricter where NCCL leaves the result undefined): comm non-NULL,
 * datatype and built-in op in range (no ncclRedOpCreatePreMulSum ops; no fp8 reductions), root
 * in 0..nranks-1, buffers that this rank uses non-NULL when count > 0 and reachable by the GPU
 * (as NCCL_CHECK_POINTERS=1 checks: device memory of the current device, managed or pinned), and
 * send and receive buffers either the in-place form of the NCCL user guide (sendbuff == recvbuff;
 * ReduceScatter: recvbuff == sendbuff + rank * recvcount; AllGather: sendbuff == recvbuff + rank *
 * sendcount) or not overlapping at all: ncclInvalidArgument otherwise, with ncclGetLastError
 * saying why.
 * Faults, read from the environment at each ncclCommInitRank; operations are counted per
 * communicator, one per collective call, from 0, in issue order:
 *   FAKE_NCCL_ASYNC_ERROR_AFTER=N  operation N (the N+1-th) and every later one do nothing (their
 *                                  outputs keep their contents) and ncclCommGetAsyncError reports
 *                                  ncclRemoteError once the stream reaches it;
 *   FAKE_NCCL_HANG_AFTER=N         operation N's host function blocks until ncclCommAbort is
 *                                  called on its communicator (a collective that never
 *                                  completes: DDP_TIMEOUT's case); later ones do nothing;
 *   FAKE_NCCL_DELAY_MS=D           each host function sleeps D ms before its MPI calls (the
 *                                  stream is busy for D ms: overlap and exposed time);
 *   FAKE_NCCL_RANK=R               the faults above apply only to communicator rank R.
 * ncclCommAbort never waits: it wakes a blocked host function (hang, delay or an MPI wait, which
 * then leaves its request and staging behind, as MPI may still write there) and returns; the
 * communicator's memory goes when its last queued host function has run.
 * Limits: counts whose bytes across ranks exceed INT_MAX are refused (MPI's int counts); one
 * stream per communicator at a time (host functions of two streams may interleave differently
 * on different ranks); no point-to-point, no ncclCommSplit, no CUDA graphs; speed is MPI over
 * host memory, not NVLink.
 */
#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "fake_half.h"
#include "fake_nccl.h"
#include "fake_queue.h"

__attribute__((visibility("default"))) const int fake_nccl_marker = FAKE_NCCL_VERSION_CODE;

enum { FK_ALIGN = 64, FK_ID_MAGIC_BYTES = 16 };
static const char fk_id_magic[FK_ID_MAGIC_BYTES] = "fake-nccl-id-v1";

typedef struct fk_faults {
    long long error_after, hang_after; /* operation numbers; -1: none */
    int delay_ms;
} fk_faults;

struct ncclComm {
    MPI_Comm mpi;
    int rank, nranks, device;
    fk_faults faults;
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* abort, a unit released */
    atomic_int aborted;
    atomic_int refs;          /* the caller's (until destroy or abort) and one per queued unit */
    atomic_llong n_ops;       /* collective calls issued */
    int inflight;             /* queued units not yet released (lock) */
    ncclResult_t async;       /* lock */
    char async_why[200];      /* lock */
};

typedef enum fk_kind { FK_ALLREDUCE, FK_REDUCE, FK_REDUCE_SCATTER, FK_ALLGATHER, FK_BROADCAST } fk_kind;

static const char *const fk_names[] = {"ncclAllReduce", "ncclReduce", "ncclReduceScatter",
                                       "ncclAllGather", "ncclBroadcast"};

typedef struct fk_call {
    fk_kind kind;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    size_t count;      /* NCCL's count: per rank block for ReduceScatter (recv) and AllGather (send) */
    const void *send;
    void *recv;
    ncclComm_t comm;
    cudaStream_t stream;
    size_t in_bytes, out_bytes, in_off, out_off; /* what this rank reads and writes; staging */
} fk_call;

/* A staging buffer of the pool; the node travels with the buffer. */
typedef struct fk_buf {
    char *p;
    size_t bytes;
    struct fk_buf *next;
} fk_buf;

/* The calls one host function runs: one (communicator, stream) of a group, or one call. */
typedef struct fk_unit {
    ncclComm_t comm;
    fk_call *calls;
    int n_calls;
    long long first_op, last_op;
    fk_buf *staging;
    int leak; /* an MPI request still refers to the staging: never reuse it */
} fk_unit;

/* ---- errors ----------------------------------------------------------------------------------- */

static pthread_mutex_t fk_error_lock = PTHREAD_MUTEX_INITIALIZER;
static char fk_last_error[256];

static ncclResult_t fk_fail(ncclResult_t r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&fk_error_lock);
    memcpy(fk_last_error, msg, sizeof msg);
    pthread_mutex_unlock(&fk_error_lock);
    if (getenv("NCCL_DEBUG"))
        fprintf(stderr, "fake NCCL WARN %s\n", msg);
    return r;
}

/* The communicator's asynchronous error (the first one stays); logged on stderr. */
static void fk_set_async(ncclComm_t c, ncclResult_t r, const char *why)
{
    pthread_mutex_lock(&c->lock);
    if (c->async == ncclSuccess) {
        c->async = r;
        snprintf(c->async_why, sizeof c->async_why, "%s", why);
        fprintf(stderr, "fake NCCL rank %d: %s\n", c->rank, why);
    }
    pthread_mutex_unlock(&c->lock);
}

static int fk_broken(ncclComm_t c)
{
    pthread_mutex_lock(&c->lock);
    int broken = c->async != ncclSuccess;
    pthread_mutex_unlock(&c->lock);
    return broken || atomic_load(&c->aborted);
}

/* ---- element types ---------------------------------------------------------------------------- */

static size_t fk_size(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 1; /* int8, uint8, the fp8 types */
    }
}

static int fk_is_half(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclBfloat16;
}

/* MPI's type for a reduction on t (16-bit floats are widened to MPI_FLOAT); MPI_DATATYPE_NULL: none. */
static MPI_Datatype fk_mpi_type(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16:
    case ncclBfloat16:
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op fk_mpi_op(ncclRedOp_t op)
{
    return op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX : op == ncclMin ? MPI_MIN : MPI_SUM;
}

/* ncclAvg: x[i] /= n, in the reduction's type (16-bit floats: their fp32 form). */
static void fk_divide(void *x, size_t count, ncclDataType_t t, int n)
{
    for (size_t i = 0; i < count; i++) {
        switch (t) {
        case ncclInt8: ((int8_t *)x)[i] = (int8_t)(((int8_t *)x)[i] / n); break;
        case ncclUint8: ((uint8_t *)x)[i] = (uint8_t)(((uint8_t *)x)[i] / (unsigned)n); break;
        case ncclInt32: ((int32_t *)x)[i] /= n; break;
        case ncclUint32: ((uint32_t *)x)[i] /= (uint32_t)n; break;
        case ncclInt64: ((int64_t *)x)[i] /= n; break;
        case ncclUint64: ((uint64_t *)x)[i] /= (uint64_t)n; break;
        case ncclFloat64: ((double *)x)[i] /= n; break;
        default: ((float *)x)[i] /= (float)n; break;
        }
    }
}

static void fk_widen(const uint16_t *h, float *f, size_t n, ncclDataType_t t)
{
    for (size_t i = 0; i < n; i++)
        f[i] = t == ncclBfloat16 ? fake_bf16_to_f32(h[i]) : fake_f16_to_f32(h[i]);
}

static void fk_narrow(const float *f, uint16_t *h, size_t n, ncclDataType_t t)
{
    for (size_t i = 0; i < n; i++)
        h[i] = t == ncclBfloat16 ? fake_f32_to_bf16(f[i]) : fake_f32_to_f16(f[i]);
}

/* ---- the host functions ----------------------------------------------------------------------- */

static void fk_deadline(struct timespec *t, long ms)
{
    clock_gettime(CLOCK_REALTIME, t);
    t->tv_sec += ms / 1000;
    t->tv_nsec += (ms % 1000) * 1000000L;
    if (t->tv_nsec >= 1000000000L) {
        t->tv_sec++;
        t->tv_nsec -= 1000000000L;
    }
}

/* Sleeps ms milliseconds, or until the communicator is aborted. */
static void fk_sleep(ncclComm_t c, int ms)
{
    struct timespec until;
    fk_deadline(&until, ms);
    pthread_mutex_lock(&c->lock);
    while (!atomic_load(&c->aborted))
        if (pthread_cond_timedwait(&c->wake, &c->lock, &until) != 0)
            break;
    pthread_mutex_unlock(&c->lock);
}

/* The injected hang: blocks until the communicator is aborted. */
static void fk_hang(ncclComm_t c, long long op)
{
    fprintf(stderr, "fake NCCL rank %d: operation %lld hangs until ncclCommAbort "
            "(FAKE_NCCL_HANG_AFTER)\n", c->rank, op);
    pthread_mutex_lock(&c->lock);
    while (!atomic_load(&c->aborted))
        pthread_cond_wait(&c->wake, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* 0 when the request completed; -1: MPI failed; -2: the communicator was aborted first (the
 * request is left behind: its buffers must not be reused). */
static int fk_wait(ncclComm_t c, MPI_Request *req)
{
    const struct timespec nap = {0, 20000};
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return -1;
        if (done)
            return 0;
        if (atomic_load(&c->aborted))
            return -2;
        nanosleep(&nap, NULL);
    }
}

/* AllReduce, Reduce and ReduceScatter on the staged bytes (see fk_wait for the result). */
static int fk_run_reduce(ncclComm_t c, const fk_call *k, const void *in, void *out)
{
    size_t n_in = k->kind == FK_REDUCE_SCATTER ? k->count * (size_t)c->nranks : k->count;
    int half = fk_is_half(k->type), gets = k->kind != FK_REDUCE || c->rank == k->root;
    MPI_Datatype t = fk_mpi_type(k->type);
    MPI_Op op = fk_mpi_op(k->op);
    const void *send = in;
    void *recv = out;
    float *wide = NULL;
    if (half) {
        wide = malloc((n_in + k->count) * sizeof *wide + 1);
        if (!wide)
            return -1;
        fk_widen(in, wide, n_in, k->type);
        send = wide;
        recv = wide + n_in;
    }
    MPI_Request req;
    int n = (int)k->count, rc;
    if (k->kind == FK_ALLREDUCE)
        rc = MPI_Iallreduce(send, recv, n, t, op, c->mpi, &req);
    else if (k->kind == FK_REDUCE)
        rc = MPI_Ireduce(send, recv, n, t, op, k->root, c->mpi, &req);
    else
        rc = MPI_Ireduce_scatter_block(send, recv, n, t, op, c->mpi, &req);
    rc = rc == MPI_SUCCESS ? fk_wait(c, &req) : -1;
    if (rc == 0 && gets && k->op == ncclAvg)
        fk_divide(recv, k->count, k->type, c->nranks);
    if (rc == 0 && gets && half)
        fk_narrow(recv, out, k->count, k->type);
    if (rc != -2)
        free(wide);
    return rc;
}

static int fk_run_call(ncclComm_t c, const fk_call *k, char *staging)
{
    char *in = staging + k->in_off, *out = staging + k->out_off;
    size_t size = fk_size(k->type);
    int bytes = (int)(k->count * size), rc;
    MPI_Request req;
    switch (k->kind) {
    case FK_ALLGATHER:
        rc = MPI_Iallgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, c->mpi, &req);
        break;
    case FK_BROADCAST:
        if (c->rank == k->root)
            memcpy(out, in, (size_t)bytes);
        rc = MPI_Ibcast(out, bytes, MPI_BYTE, k->root, c->mpi, &req);
        break;
    default:
        return fk_run_reduce(c, k, in, out);
    }
    return rc == MPI_SUCCESS ? fk_wait(c, &req) : -1;
}

/* Host function: the unit's calls in order, after its faults. Calls no CUDA API. */
static void fk_unit_run(void *arg)
{
    fk_unit *u = arg;
    ncclComm_t c = u->comm;
    const fk_faults *f = &c->faults;
    char why[200];
    if (f->delay_ms > 0)
        fk_sleep(c, f->delay_ms);
    if (f->hang_after >= u->first_op && f->hang_after <= u->last_op)
        fk_hang(c, f->hang_after);
    if (f->error_after >= 0 && u->last_op >= f->error_after) {
        snprintf(why, sizeof why, "injected asynchronous error at operation %lld "
                 "(FAKE_NCCL_ASYNC_ERROR_AFTER=%lld)", u->last_op, f->error_after);
        fk_set_async(c, ncclRemoteError, why);
    }
    for (int i = 0; i < u->n_calls && !fk_broken(c); i++) {
        int rc = fk_run_call(c, &u->calls[i], u->staging->p);
        u->leak = rc == -2;
        if (rc == -1) {
            snprintf(why, sizeof why, "MPI failed in %s (operation %lld)",
                     fk_names[u->calls[i].kind], u->first_op + i);
            fk_set_async(c, ncclSystemError, why);
        }
    }
}

static void fk_comm_unref(ncclComm_t c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- the staging pool ------------------------------------------------------------------------- */

enum { FK_POOL_MIN = 1 << 16 };
#define FK_POOL_KEEP ((size_t)256 << 20) /* free staging kept for reuse; more is freed */

static pthread_mutex_t fk_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static fk_buf *fk_pool;
static size_t fk_pool_bytes;

/* Host function (or the issuing thread): the buffer is free again. */
static void fk_pool_put(fk_buf *b)
{
    pthread_mutex_lock(&fk_pool_lock);
    b->next = fk_pool;
    fk_pool = b;
    fk_pool_bytes += b->bytes;
    pthread_mutex_unlock(&fk_pool_lock);
}

/* Frees pooled buffers beyond FK_POOL_KEEP; issuing thread only (cudaFreeHost). */
static void fk_pool_trim(void)
{
    fk_buf *drop = NULL;
    pthread_mutex_lock(&fk_pool_lock);
    while (fk_pool && fk_pool_bytes > FK_POOL_KEEP) {
        fk_buf *b = fk_pool;
        fk_pool = b->next;
        fk_pool_bytes -= b->bytes;
        b->next = drop;
        drop = b;
    }
    pthread_mutex_unlock(&fk_pool_lock);
    while (drop) {
        fk_buf *next = drop->next;
        fake_queue_free(drop->p);
        free(drop);
        drop = next;
    }
}

/* The smallest free buffer of at least n_bytes, else a new one; NULL (why filled) on failure. */
static fk_buf *fk_pool_get(size_t n_bytes, char *why)
{
    fk_buf **best = NULL;
    pthread_mutex_lock(&fk_pool_lock);
    for (fk_buf **b = &fk_pool; *b; b = &(*b)->next)
        if ((*b)->bytes >= n_bytes && (!best || (*b)->bytes < (*best)->bytes))
            best = b;
    fk_buf *got = best ? *best : NULL;
    if (got) {
        *best = got->next;
        fk_pool_bytes -= got->bytes;
    }
    pthread_mutex_unlock(&fk_pool_lock);
    fk_pool_trim();
    if (got)
        return got;
    size_t bytes = FK_POOL_MIN;
    while (bytes < n_bytes)
        bytes *= 2;
    got = calloc(1, sizeof *got);
    if (got)
        got->p = fake_queue_alloc(bytes, why);
    else
        strcpy(why, "out of host memory");
    if (!got || !got->p) {
        free(got);
        return NULL;
    }
    got->bytes = bytes;
    return got;
}

/* ---- queueing --------------------------------------------------------------------------------- */

/* Host function after the output copies: the staging goes back to the pool, the unit ends. */
static void fk_unit_release(void *arg)
{
    fk_unit *u = arg;
    ncclComm_t c = u->comm;
    if (!u->leak)
        fk_pool_put(u->staging);
    free(u->calls);
    free(u);
    pthread_mutex_lock(&c->lock);
    c->inflight--;
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
    fk_comm_unref(c);
}

static size_t fk_round(size_t n)
{
    return (n + FK_ALIGN - 1) / FK_ALIGN * FK_ALIGN;
}

/* Queues the copies and host functions of u on stream s (see the file comment): 0 on success;
 * 1: nothing of u was queued to run (the caller undoes it); 2: the run was queued but not the
 * release (u and its staging are left behind). Sets the last error on failure. */
static int fk_queue_unit(fk_unit *u, cudaStream_t s)
{
    char why[128] = "";
    int rc = 0;
    for (int i = 0; i < u->n_calls && !rc; i++) {
        fk_call *k = &u->calls[i];
        rc = fake_queue_copy(u->staging->p + k->in_off, k->send, k->in_bytes, s, why);
        if (!rc)
            rc = fake_queue_copy(u->staging->p + k->out_off, k->recv, k->out_bytes, s, why);
    }
    if (!rc)
        rc = fake_queue_host_fn(fk_unit_run, u, s, why);
    if (rc) {
        fk_fail(ncclUnhandledCudaError, "%s", why);
        return 1;
    }
    for (int i = 0; i < u->n_calls && !rc; i++) {
        fk_call *k = &u->calls[i];
        rc = fake_queue_copy(k->recv, u->staging->p + k->out_off, k->out_bytes, s, why);
    }
    if (!rc)
        rc = fake_queue_host_fn(fk_unit_release, u, s, why);
    if (rc) {
        fk_fail(ncclUnhandledCudaError, "%s (after the operation was queued)", why);
        return 2;
    }
    return 0;
}

/* Lays out the staging of calls[0..n) (one communicator, one stream) and queues them as one unit,
 * in call order. */
static ncclResult_t fk_issue(const fk_call *calls, int n)
{
    ncclComm_t c = calls[0].comm;
    char why[128] = "out of host memory";
    fk_unit *u = calloc(1, sizeof *u);
    fk_call *copy = malloc((size_t)n * sizeof *copy);
    size_t off = 0;
    if (u && copy) {
        memcpy(copy, calls, (size_t)n * sizeof *copy);
        for (int i = 0; i < n; i++) {
            copy[i].in_off = off;
            off += fk_round(copy[i].in_bytes);
            copy[i].out_off = off;
            off += fk_round(copy[i].out_bytes);
        }
        *u = (fk_unit){.comm = c, .calls = copy, .n_calls = n};
        u->staging = fk_pool_get(off, why);
    }
    if (!u || !copy || !u->staging) {
        free(u);
        free(copy);
        return fk_fail(ncclSystemError, "%s", why);
    }
    u->first_op = atomic_fetch_add(&c->n_ops, n);
    u->last_op = u->first_op + n - 1;
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_lock(&c->lock);
    c->inflight++;
    pthread_mutex_unlock(&c->lock);
    int rc = fk_queue_unit(u, calls[0].stream);
    if (rc == 1)
        fk_unit_release(u);
    return rc ? ncclUnhandledCudaError : ncclSuccess;
}

/* ---- argument rules --------------------------------------------------------------------------- */

static int fk_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

/* The in-place forms of the NCCL user guide ("In-place Operations"); any other overlap of the
 * buffers this rank uses is refused. */
static int fk_in_place(const fk_call *k, size_t size)
{
    const char *send = k->send, *recv = k->recv;
    size_t block = k->count * size * (size_t)k->comm->rank;
    if (k->kind == FK_REDUCE_SCATTER)
        return recv == send + block;
    if (k->kind == FK_ALLGATHER)
        return send == recv + block;
    return send == recv;
}

static ncclResult_t fk_check_buffers(const fk_call *k, const char *name)
{
    char why[128];
    if (k->in_bytes && !k->send)
        return fk_fail(ncclInvalidArgument, "%s : sendbuff is NULL with count %zu", name, k->count);
    if (k->out_bytes && !k->recv)
        return fk_fail(ncclInvalidArgument, "%s : recvbuff is NULL with count %zu", name, k->count);
    if ((k->in_bytes && fake_queue_check_pointer(k->send, "sendbuff", why)) ||
        (k->out_bytes && fake_queue_check_pointer(k->recv, "recvbuff", why)))
        return fk_fail(ncclInvalidArgument, "%s : %s", name, why);
    if (fk_overlap(k->send, k->in_bytes, k->recv, k->out_bytes) && !fk_in_place(k, fk_size(k->type)))
        return fk_fail(ncclInvalidArgument, "%s : sendbuff %p and recvbuff %p overlap but are not "
                       "the in-place form (see NCCL's \"In-place Operations\")", name, k->send, k->recv);
    return ncclSuccess;
}

/* NCCL's checks of a collective's arguments; fills the bytes this rank reads and writes. */
static ncclResult_t fk_check(fk_call *k)
{
    const char *name = fk_names[k->kind];
    int reduces = k->kind != FK_ALLGATHER && k->kind != FK_BROADCAST;
    if (!k->comm)
        return fk_fail(ncclInvalidArgument, "%s : comm is NULL", name);
    ncclComm_t c = k->comm;
    if ((int)k->type < 0 || (int)k->type >= (int)ncclNumTypes)
        return fk_fail(ncclInvalidArgument, "%s : invalid type %d", name, (int)k->type);
    if (reduces && ((int)k->op < 0 || (int)k->op >= (int)ncclNumOps))
        return fk_fail(ncclInvalidArgument, "%s : invalid reduction operation %d (the fake NCCL "
                       "has only the built-in ones)", name, (int)k->op);
    if (reduces && fk_mpi_type(k->type) == MPI_DATATYPE_NULL)
        return fk_fail(ncclInvalidArgument, "%s : the fake NCCL does not reduce fp8 (type %d)",
                       name, (int)k->type);
    if ((k->kind == FK_REDUCE || k->kind == FK_BROADCAST) && (k->root < 0 || k->root >= c->nranks))
        return fk_fail(ncclInvalidArgument, "%s : invalid root %d (root should be in the 0..%d "
                       "range)", name, k->root, c->nranks);
    size_t size = fk_size(k->type), n = (size_t)c->nranks, wide = fk_is_half(k->type) ? 4 : size;
    if (k->count > (size_t)INT32_MAX / (n * wide))
        return fk_fail(ncclInvalidArgument, "%s : count %zu: the fake NCCL takes at most %d bytes "
                       "across ranks per call (MPI's int counts)", name, k->count, INT32_MAX);
    size_t bytes = k->count * size;
    int root = c->rank == k->root;
    k->in_bytes = k->kind == FK_REDUCE_SCATTER ? bytes * n : k->kind == FK_BROADCAST && !root ? 0 : bytes;
    k->out_bytes = k->kind == FK_ALLGATHER ? bytes * n : k->kind == FK_REDUCE && !root ? 0 : bytes;
    return fk_check_buffers(k, name);
}

/* ---- groups ----------------------------------------------------------------------------------- */

static _Thread_local int fk_group_depth;
static _Thread_local fk_call *fk_group_calls;
static _Thread_local int fk_group_n, fk_group_cap;
static _Thread_local ncclResult_t fk_group_error;

static ncclResult_t fk_group_add(const fk_call *k)
{
    if (fk_group_n == fk_group_cap) {
        int cap = fk_group_cap ? 2 * fk_group_cap : 16;
        fk_call *more = realloc(fk_group_calls, (size_t)cap * sizeof *more);
        if (!more)
            return fk_fail(ncclSystemError, "out of host memory for the group's calls");
        fk_group_calls = more;
        fk_group_cap = cap;
    }
    fk_group_calls[fk_group_n++] = *k;
    return ncclSuccess;
}

/* Queues the group's calls: one unit per (communicator, stream), in order of first appearance,
 * each with its calls in call order. Returns the first failure. */
static ncclResult_t fk_group_flush(void)
{
    ncclResult_t first = ncclSuccess;
    int n = fk_group_n;
    fk_call *all = fk_group_calls, *mine = malloc((size_t)(n ? n : 1) * sizeof *mine);
    char *taken = calloc((size_t)(n ? n : 1), 1);
    if (!mine || !taken)
        first = fk_fail(ncclSystemError, "out of host memory for the group");
    for (int i = 0; i < n && first == ncclSuccess; i++) {
        int m = 0;
        for (int j = i; j < n; j++)
            if (!taken[j] && all[j].comm == all[i].comm && all[j].stream == all[i].stream) {
                taken[j] = 1;
                mine[m++] = all[j];
            }
        if (m)
            first = fk_issue(mine, m);
    }
    free(mine);
    free(taken);
    fk_group_n = 0;
    return first;
}

/* A collective: checked, then recorded (inside a group) or queued at once. */
static ncclResult_t fk_collective(fk_call k)
{
    ncclResult_t r = fk_check(&k);
    if (fk_group_depth == 0)
        return r == ncclSuccess ? fk_issue(&k, 1) : r;
    if (r == ncclSuccess)
        r = fk_group_add(&k);
    if (r != ncclSuccess && fk_group_error == ncclSuccess)
        fk_group_error = r;
    return r;
}

ncclResult_t ncclGroupStart(void)
{
    fk_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (fk_group_depth == 0)
        return fk_fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call");
    if (--fk_group_depth > 0)
        return ncclSuccess;
    ncclResult_t r = fk_group_error;
    fk_group_error = ncclSuccess;
    if (r == ncclSuccess)
        return fk_group_flush();
    fk_group_n = 0; /* a refused call discards the whole group, as in NCCL */
    return r;
}

/* ---- collectives ------------------------------------------------------------------------------ */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return fk_collective((fk_call){.kind = FK_ALLREDUCE, .type = datatype, .op = op, .count = count,
                                   .send = sendbuff, .recv = recvbuff, .comm = comm,
                                   .stream = stream});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return fk_collective((fk_call){.kind = FK_REDUCE, .type = datatype, .op = op, .root = root,
                                   .count = count, .send = sendbuff, .recv = recvbuff,
                                   .comm = comm, .stream = stream});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return fk_collective((fk_call){.kind = FK_REDUCE_SCATTER, .type = datatype, .op = op,
                                   .count = recvcount, .send = sendbuff, .recv = recvbuff,
                                   .comm = comm, .stream = stream});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return fk_collective((fk_call){.kind = FK_ALLGATHER, .type = datatype, .count = sendcount,
                                   .send = sendbuff, .recv = recvbuff, .comm = comm,
                                   .stream = stream});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return fk_collective((fk_call){.kind = FK_BROADCAST, .type = datatype, .root = root,
                                   .count = count, .send = sendbuff, .recv = recvbuff,
                                   .comm = comm, .stream = stream});
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

/* ---- communicators ---------------------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fk_fail(ncclInvalidArgument, "ncclGetVersion : version is NULL");
    *version = FAKE_NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return fk_fail(ncclInvalidArgument, "ncclGetUniqueId : uniqueId is NULL");
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, fk_id_magic, FK_ID_MAGIC_BYTES);
    char *rnd = uniqueId->internal + FK_ID_MAGIC_BYTES;
    if (getrandom(rnd, 16, 0) != 16) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        long mix[2] = {(long)t.tv_nsec ^ (long)getpid() << 20, (long)t.tv_sec};
        memcpy(rnd, mix, sizeof mix);
    }
    return ncclSuccess;
}

/* FNV-1a of the id: the MPI_Comm_split color (non-negative, as MPI requires). */
static int fk_color(const ncclUniqueId *id)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof id->internal; i++)
        h = (h ^ (uint8_t)id->internal[i]) * 16777619u;
    return (int)(h & 0x3fffffffu);
}

static long long fk_env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? atoll(v) : -1;
}

/* The faults FAKE_NCCL_* ask for on this communicator rank. */
static fk_faults fk_read_faults(int rank)
{
    fk_faults f = {-1, -1, 0};
    long long only = fk_env("FAKE_NCCL_RANK");
    if (only >= 0 && only != rank)
        return f;
    f.error_after = fk_env("FAKE_NCCL_ASYNC_ERROR_AFTER");
    f.hang_after = fk_env("FAKE_NCCL_HANG_AFTER");
    long long delay = fk_env("FAKE_NCCL_DELAY_MS");
    f.delay_ms = delay > 0 ? (int)delay : 0;
    return f;
}

/* MPI initialised (not finalised) with MPI_THREAD_MULTIPLE; else the reason. */
static const char *fk_mpi_unusable(void)
{
    int init = 0, fin = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return "MPI is not initialised (call MPI_Init_thread with MPI_THREAD_MULTIPLE first)";
    MPI_Query_thread(&level);
    return level < MPI_THREAD_MULTIPLE ? "MPI was initialised below MPI_THREAD_MULTIPLE (the "
                                         "fake calls MPI from CUDA's host-function thread)" : NULL;
}

static ncclComm_t fk_comm_new(MPI_Comm mpi, int rank, int nranks)
{
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->mpi = mpi;
    c->rank = rank;
    c->nranks = nranks;
    c->device = fake_queue_device();
    c->faults = fk_read_faults(rank);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    atomic_init(&c->aborted, 0);
    atomic_init(&c->refs, 1);
    atomic_init(&c->n_ops, 0);
    return c;
}

/* Collective over MPI_COMM_WORLD: a rank refusing its arguments still takes part in the split
 * (with MPI_UNDEFINED), so that the others fail instead of waiting. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    const char *mpi_why = fk_mpi_unusable();
    if (mpi_why)
        return fk_fail(ncclInvalidUsage, "ncclCommInitRank : %s", mpi_why);
    int ok = comm && nranks >= 1 && rank >= 0 && rank < nranks &&
             !memcmp(commId.internal, fk_id_magic, FK_ID_MAGIC_BYTES);
    MPI_Comm mpi = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, ok ? fk_color(&commId) : MPI_UNDEFINED, rank, &mpi) != MPI_SUCCESS)
        return fk_fail(ncclSystemError, "ncclCommInitRank : MPI_Comm_split failed");
    if (!ok)
        return fk_fail(ncclInvalidArgument, "ncclCommInitRank : comm %p, rank %d of %d, or an id "
                       "not made by the fake NCCL's ncclGetUniqueId", (void *)comm, rank, nranks);
    int size = 0, me = -1;
    MPI_Comm_size(mpi, &size);
    MPI_Comm_rank(mpi, &me);
    if (size != nranks || me != rank) {
        MPI_Comm_free(&mpi);
        return fk_fail(ncclInvalidUsage, "ncclCommInitRank : rank %d of %d asked, but %d MPI "
                       "processes came with this id (every rank of MPI_COMM_WORLD must call "
                       "ncclCommInitRank, the fake splits MPI_COMM_WORLD)", rank, nranks, size);
    }
    *comm = fk_comm_new(mpi, rank, nranks);
    if (!*comm) {
        MPI_Comm_free(&mpi);
        return fk_fail(ncclSystemError, "ncclCommInitRank : out of host memory");
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    (void)config; /* blocking, whatever it asks */
    return ncclCommInitRank(comm, nranks, commId, rank);
}

/* Waits until every queued operation of c has run (no deadline: callers put their own). */
static void fk_drain(ncclComm_t c)
{
    pthread_mutex_lock(&c->lock);
    while (c->inflight > 0 && !atomic_load(&c->aborted))
        pthread_cond_wait(&c->wake, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return fk_fail(ncclInvalidArgument, "ncclCommFinalize : comm is NULL");
    fk_drain(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    fk_drain(comm);
    MPI_Comm_free(&comm->mpi);
    fk_comm_unref(comm);
    return ncclSuccess;
}

/* Wakes whatever of comm waits (hang, delay, MPI wait) and returns at once; the MPI
 * communicator is left behind (a request may still be pending on it). */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    pthread_mutex_lock(&comm->lock);
    atomic_store(&comm->aborted, 1);
    pthread_cond_broadcast(&comm->wake);
    pthread_mutex_unlock(&comm->lock);
    fk_comm_unref(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return fk_fail(ncclInvalidArgument, "ncclCommGetAsyncError : comm or asyncError is NULL");
    pthread_mutex_lock(&comm->lock);
    *asyncError = comm->async;
    pthread_mutex_unlock(&comm->lock);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fk_fail(ncclInvalidArgument, "ncclCommCount : comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return fk_fail(ncclInvalidArgument, "ncclCommCuDevice : comm or device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fk_fail(ncclInvalidArgument, "ncclCommUserRank : comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* The communicator's asynchronous error if it has one, else the last refused call's reason.
 * The string stays valid until the next failure. */
const char *ncclGetLastError(ncclComm_t comm)
{
    if (comm) {
        pthread_mutex_lock(&comm->lock);
        int has = comm->async != ncclSuccess;
        pthread_mutex_unlock(&comm->lock);
        if (has)
            return comm->async_why;
    }
    return fk_last_error;
}
