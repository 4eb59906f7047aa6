/* comm_nccl.c - the NCCL communicator: collectives on device memory for the CUDA backend.
 *
 * Bootstrap: rank 0 makes the unique id and broadcasts it over MPI_COMM_WORLD (with its status,
 * so a failure there stops every rank instead of leaving them in ncclCommInitRank).
 * Streams: every operation runs on the communicator's own non-blocking stream, ordered after the
 * work already queued on the backend's compute stream (event recorded there, waited for here);
 * completing an operation makes the compute stream wait for the operation's done event, so later
 * kernels see the result without blocking the host. A caller stream given to allreduce_start (the
 * reducer's ddp_reducer_opts.stream) takes the compute stream's place in both roles. The runs of
 * a reducer bucket in ready order are all-reduced inside one ncclGroupStart/End. Operations are
 * issued under a lock, since the reducer may start them from another thread than the caller's.
 * Reduce-scatters and all-gathers (the sharded reducer) use ncclReduceScatter / ncclAllGather when
 * every rank's block has the same count, else a group of one ncclReduce / ncclBroadcast per rank
 * (the shards of a bucket differ in size); they are compiled here but were never run on a GPU.
 * Which calls each of these collectives makes (offsets, counts, roots, in-place forms) is planned
 * by nccl_plan.c, without NCCL, and the CPU tests execute the plans on a simulated NCCL
 * (tests/runtime/test_nccl_plan.c); this file issues exactly a plan's calls.
 * Timeline (ddp_trace_start): each all-reduce's "allreduce" span is recorded by two host functions
 * (cudaLaunchHostFunc) queued on the communication stream around ncclAllReduce, so it begins when
 * the stream reaches the all-reduce (after the gradients it waits for) and ends when the NCCL
 * kernel has finished, on the host clock the rest of the trace uses. CUDA runs host functions on a
 * thread of its own: the spans get that thread's row. They call no CUDA function (the CUDA
 * runtime API forbids it there) and are queued only while tracing is on.
 * NVTX (trace.c, DDP_NVTX): each collective's range ("allreduce", "reduce_scatter", "allgather",
 * payload the bucket, or -1) spans its issuing on the calling thread, always: Nsight Systems
 * projects it onto the NCCL kernels launched inside it, so the GPU timeline names each bucket's
 * collective without host functions on the stream (those cost the stream a round trip to the
 * host, so they stay tracing's alone and push no range).
 * Failures (NCCL's user guide, "Fault tolerance"): an operation that returns ncclSuccess may still
 * fail later; ncclCommGetAsyncError reports it, and after an error nothing can be assumed about
 * the queued operations, so the communicator is aborted (ncclCommAbort), never waited for. Host
 * waits (cuda_wait.c) poll the event and this communicator's asynchronous error under the
 * deadline (DDP_TIMEOUT) and abort it when the deadline passes; every later operation then fails
 * at once with DDP_ERR_NCCL.
 * The watchdog's GPU stream lane (watchdog.c, watch_stream_*): every collective takes the lane's
 * next sequence number and one of WATCH_STREAM_SLOTS events, recorded right after it on the
 * communication stream, so that a wait past its deadline can tell which collective the stream is
 * in (the oldest whose event has not completed). One cudaEventRecord per collective;
 * DDP_WATCH_GPU_LANE=0 (or DDP_WATCHDOG=0) records none.
 */
#include <mpi.h>
#include <pthread.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp_trace.h"
#include "internal.h"
#include "nccl_plan.h"
#include "try.h"

typedef struct nccl_state {
    ncclComm_t comm;
    int device;           /* the communicator's CUDA device */
    int world;            /* its ranks */
    cudaStream_t stream;  /* communication stream */
    cudaEvent_t ready;    /* recorded on the compute stream before each operation */
    float *scratch;       /* one device float, for the barrier */
    pthread_mutex_t lock; /* serialises issuing operations and the abort */
    int aborted;          /* comm was aborted (and freed by NCCL) after an error or a timeout */
    struct nccl_closer *aborter; /* the thread running ncclCommAbort, joined at destroy */
    pthread_t abort_thread;
    cudaEvent_t *lane;    /* the GPU stream lane's markers, one per slot; NULL: the lane is off */
} nccl_state;

typedef struct nccl_request {
    const comm_ops *ops; /* first member: ddp_wait() dispatches on it */
    nccl_state *owner;
    cudaEvent_t done;    /* recorded on the communication stream after the operation */
    cudaStream_t follow; /* the caller's stream (reducer), NULL: the compute stream */
} nccl_request;

static const comm_ops nccl_ops;
static ddp_status nccl_watch_check(void *arg);

static nccl_state *nccl_of(comm_group *c)
{
    return (nccl_state *)c->impl;
}

static cudaStream_t nccl_compute_stream(void)
{
    return (cudaStream_t)cuda_stream();
}

/* The stream an operation follows and completes on: the caller's, else the compute stream. */
static cudaStream_t nccl_order_stream(cudaStream_t follow)
{
    return follow ? follow : nccl_compute_stream();
}

/* NCCL's element type and reduction for ours (every ddp_dtype has one). */
static ncclDataType_t nccl_type(ddp_dtype t)
{
    switch (t) {
    case DDP_BF16: return ncclBfloat16;
    case DDP_FP16: return ncclFloat16;
    case DDP_FP64: return ncclFloat64;
    case DDP_INT64: return ncclInt64;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(ddp_reduce_op op)
{
    return op == DDP_AVG ? ncclAvg : op == DDP_MAX ? ncclMax : op == DDP_MIN ? ncclMin : ncclSum;
}

/* Makes the communication stream wait for the work queued so far on the compute stream. Makes
 * the communicator's device current first: the caller may be another thread than the one that
 * opened the backend, and events are created on the current device. */
static ddp_status nccl_follow(nccl_state *s, cudaStream_t follow)
{
    ddp_status st = DDP_OK;
    TRY_CUDA_GOTO(cudaSetDevice(s->device));
    TRY_CUDA_GOTO(cudaEventRecord(s->ready, nccl_order_stream(follow)));
    TRY_CUDA_GOTO(cudaStreamWaitEvent(s->stream, s->ready, 0));
cleanup:
    return st;
}

/* The watchdog's GPU stream lane (watch_stream_*): whether slot's marker has completed, asked on
 * the watchdog's answering thread and on the thread of a wait past its deadline. A thread's first
 * CUDA call would make device 0 current there (creating its primary context, on another rank's
 * GPU), so the communicator's device is made current first, once per thread; cudaEventQuery
 * itself does not block. An error counts as not complete. */
static int nccl_lane_done(void *arg, int slot)
{
    static _Thread_local int current = -1; /* the device this thread made current here */
    const nccl_state *s = arg;
    if (current != s->device && cudaSetDevice(s->device) == cudaSuccess)
        current = s->device;
    return cudaEventQuery(s->lane[slot]) == cudaSuccess;
}

/* Destroys the lane's markers (once queried no more: watch_stream_close). */
static void nccl_lane_free(nccl_state *s)
{
    for (int i = 0; s->lane && i < WATCH_STREAM_SLOTS; i++)
        if (s->lane[i])
            cudaEventDestroy(s->lane[i]);
    free(s->lane);
    s->lane = NULL;
}

/* The GPU stream's lane: a marker per slot and the watchdog's query, unless DDP_WATCH_GPU_LANE=0
 * (read here, once) or the watchdog is off; then no marker is ever recorded. */
static ddp_status nccl_lane_open(nccl_state *s)
{
    const char *env = getenv("DDP_WATCH_GPU_LANE");
    ddp_status st = DDP_OK;
    if (env && strcmp(env, "0") == 0)
        return DDP_OK;
    s->lane = calloc(WATCH_STREAM_SLOTS, sizeof *s->lane);
    if (!s->lane) {
        DDP_ERROR("out of memory for the GPU stream lane's %d events", WATCH_STREAM_SLOTS);
        return DDP_ERR_NOMEM;
    }
    for (int i = 0; i < WATCH_STREAM_SLOTS; i++)
        TRY_CUDA_GOTO(cudaEventCreateWithFlags(&s->lane[i], cudaEventDisableTiming));
    if (!watch_stream_open(nccl_lane_done, s))
        nccl_lane_free(s);
cleanup:
    return st;
}

/* The collective just queued on the lane: the next sequence number, its label (what, the bucket
 * being tagged, n_bytes) in its slot, and the slot's marker recorded after it. Nothing when the
 * lane is off. */
static ddp_status nccl_lane_mark(nccl_state *s, const char *what, size_t n_bytes)
{
    ddp_status st = DDP_OK;
    if (!s->lane)
        return DDP_OK;
    uint64_t seq = watch_stream_begin(what, (int)trace_current_tag(), n_bytes);
    TRY_CUDA_GOTO(cudaEventRecord(s->lane[seq % WATCH_STREAM_SLOTS], s->stream));
    watch_stream_queued(seq);
cleanup:
    return st;
}

/* Records the end of the operation just queued (collective `what` of n_bytes, for the GPU stream
 * lane); the event is owned by the caller. */
static ddp_status nccl_mark_done(nccl_state *s, const char *what, size_t n_bytes,
                                 cudaEvent_t *done)
{
    ddp_status st = DDP_OK;
    TRY_OK_GOTO(nccl_lane_mark(s, what, n_bytes));
    TRY_CUDA_GOTO(cudaEventCreateWithFlags(done, cudaEventDisableTiming));
    TRY_CUDA_GOTO(cudaEventRecord(*done, s->stream));
    return DDP_OK;
cleanup:
    if (*done)
        cudaEventDestroy(*done);
    *done = NULL;
    return st;
}

/* Makes the compute stream wait for `done`, reports NCCL's asynchronous errors, frees `done`. */
static ddp_status nccl_follow_compute(nccl_state *s)
{
    return nccl_follow(s, NULL);
}

/* Makes `follow` (NULL: the compute stream) wait for `done`, reports NCCL's asynchronous errors,
 * frees `done`. */
static ddp_status nccl_complete_on(nccl_state *s, cudaEvent_t done, cudaStream_t follow)
{
    ddp_status st = DDP_OK;
    TRY_CUDA_GOTO(cudaStreamWaitEvent(nccl_order_stream(follow), done, 0));
    st = nccl_watch_check(s);
cleanup:
    cudaEventDestroy(done);
    return st;
}

/* ncclCommDestroy and ncclCommAbort run on a thread of their own, so that the host waits for them
 * under the deadline (or not at all). Destroy finalises the communicator, flushing its proxy work,
 * which a dead or stuck peer can hold up; abort frees the communicator's device memory, which waits
 * for every kernel on the GPU, a stuck one too (seen with NCCL 2.28 on an H200: a wait that passed
 * its deadline returned only when the caller's spinning kernel ended). A thread past the deadline
 * is left behind, logged: the process is ending. */
typedef struct nccl_closer {
    ncclComm_t comm;
    ncclResult_t (*close)(ncclComm_t comm); /* ncclCommDestroy or ncclCommAbort */
    int done;                               /* set (atomically) when close returned */
} nccl_closer;

static double nccl_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *nccl_closer_main(void *arg)
{
    nccl_closer *d = arg;
    d->close(d->comm);
    __atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Starts close(comm) on a thread; NULL (nothing started) when no thread could be made. */
static nccl_closer *nccl_closer_start(ncclComm_t comm, ncclResult_t (*close)(ncclComm_t),
                                      pthread_t *thread)
{
    nccl_closer *d = malloc(sizeof *d);
    if (d)
        *d = (nccl_closer){.comm = comm, .close = close, .done = 0};
    if (d && pthread_create(thread, NULL, nccl_closer_main, d) != 0) {
        free(d);
        d = NULL;
    }
    return d;
}

/* Waits up to the deadline for a closer thread: joined and freed when done, else logged and left
 * behind (it may still write d->done). */
static void nccl_closer_finish(nccl_closer *d, pthread_t thread, const char *what)
{
    double limit = timeout_seconds(), deadline = nccl_now() + limit;
    while (!__atomic_load_n(&d->done, __ATOMIC_ACQUIRE) && nccl_now() < deadline)
        nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 1000000L}, NULL);
    if (__atomic_load_n(&d->done, __ATOMIC_ACQUIRE)) {
        pthread_join(thread, NULL);
        free(d);
        return;
    }
    DDP_ERROR("%s did not return within %.3g s (DDP_TIMEOUT): a peer rank may have died or a "
              "kernel be stuck; leaving the communicator behind", what, limit);
    pthread_detach(thread);
}

/* Aborts the communicator once: the queued operations end (with undefined results) instead of
 * waiting forever for a peer; the abort itself runs on a thread (above), so the caller returns at
 * its deadline. Call with s->lock held. */
static void nccl_abort_locked(nccl_state *s)
{
    if (!s->aborted && s->comm) {
        s->aborter = nccl_closer_start(s->comm, ncclCommAbort, &s->abort_thread);
        if (!s->aborter) /* no thread: abort here, however long it takes */
            ncclCommAbort(s->comm);
        s->comm = NULL;
        s->aborted = 1;
    }
}

static void nccl_abort(nccl_state *s)
{
    pthread_mutex_lock(&s->lock);
    nccl_abort_locked(s);
    pthread_mutex_unlock(&s->lock);
}

/* The watch of host waits: NCCL's asynchronous error, which aborts the communicator. Under the
 * lock, so that no other thread aborts (frees) the communicator while it is queried. */
static ddp_status nccl_watch_check(void *arg)
{
    nccl_state *s = arg;
    ddp_status st = DDP_ERR_NCCL;
    ncclResult_t async = ncclSuccess, r = ncclSuccess;
    pthread_mutex_lock(&s->lock);
    if (!s->aborted) {
        r = ncclCommGetAsyncError(s->comm, &async);
        st = r == ncclSuccess && (async == ncclSuccess || async == ncclInProgress) ? DDP_OK
                                                                                    : DDP_ERR_NCCL;
    }
    if (st != DDP_OK && !s->aborted) {
        DDP_ERROR("NCCL reported an asynchronous error: %s (%s); aborting the communicator",
                  ncclGetErrorString(r != ncclSuccess ? r : async), ncclGetLastError(s->comm));
        nccl_abort_locked(s);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void nccl_watch_timeout(void *arg)
{
    nccl_abort(arg);
}

/* DDP_ERR_NCCL (logged) once the communicator was aborted; call with s->lock held. */
static ddp_status nccl_usable(const nccl_state *s)
{
    if (!s->aborted)
        return DDP_OK;
    DDP_ERROR("the NCCL communicator was aborted after an earlier error or timeout (see above); "
              "stop the job (ddp_abort)");
    return DDP_ERR_NCCL;
}

static ddp_status nccl_complete(nccl_state *s, cudaEvent_t done)
{
    return nccl_complete_on(s, done, NULL);
}

/* Host functions on the communication stream: the all-reduce's trace span (arg: its tag). */
static void CUDART_CB nccl_trace_begin(void *tag)
{
    trace_span_begin("allreduce", (int64_t)(intptr_t)tag);
}

static void CUDART_CB nccl_trace_end(void *tag)
{
    trace_span_end("allreduce", (int64_t)(intptr_t)tag);
}

/* The same spans for the reduce-scatters and all-gathers (the sharded reducer's). */
static void CUDART_CB nccl_trace_rs_begin(void *tag)
{
    trace_span_begin("reduce_scatter", (int64_t)(intptr_t)tag);
}

static void CUDART_CB nccl_trace_rs_end(void *tag)
{
    trace_span_end("reduce_scatter", (int64_t)(intptr_t)tag);
}

static void CUDART_CB nccl_trace_ag_begin(void *tag)
{
    trace_span_begin("allgather", (int64_t)(intptr_t)tag);
}

static void CUDART_CB nccl_trace_ag_end(void *tag)
{
    trace_span_end("allgather", (int64_t)(intptr_t)tag);
}

/* One call of a plan on the communication stream, its pointers taken in the caller's send and
 * recv as nccl_plan.h defines them. */
static ncclResult_t nccl_issue_call(nccl_state *s, const nccl_call *c, const void *send,
                                    void *recv, ddp_dtype dtype, ddp_reduce_op op)
{
    size_t size = ddp_dtype_size(dtype);
    const char *from = c->send_buf == NCCL_BUF_RECV ? (const char *)recv : (const char *)send;
    const void *sp = from + c->send_off * size;
    void *rp = (char *)recv + c->recv_off * size;
    ncclDataType_t t = nccl_type(dtype);
    switch (c->kind) {
    case NCCL_CALL_ALLREDUCE:
        return ncclAllReduce(sp, rp, c->count, t, nccl_op(op), s->comm, s->stream);
    case NCCL_CALL_REDUCE_SCATTER:
        return ncclReduceScatter(sp, rp, c->count, t, nccl_op(op), s->comm, s->stream);
    case NCCL_CALL_REDUCE:
        return ncclReduce(sp, rp, c->count, t, nccl_op(op), c->root, s->comm, s->stream);
    case NCCL_CALL_ALLGATHER:
        return ncclAllGather(sp, rp, c->count, t, s->comm, s->stream);
    case NCCL_CALL_BROADCAST:
        return ncclBroadcast(sp, rp, c->count, t, c->root, s->comm, s->stream);
    }
    return ncclInvalidArgument;
}

/* Logs the failure of call i of a plan; ncclReduce and ncclBroadcast name the rank's block. */
static void nccl_call_failed(const nccl_call *c, int i, ncclResult_t r)
{
    static const char *const names[] = {/* by nccl_call_kind */ "ncclAllReduce",
                                        "ncclReduceScatter", "ncclReduce", "ncclAllGather",
                                        "ncclBroadcast"};
    if (c->kind == NCCL_CALL_REDUCE)
        DDP_ERROR("ncclReduce for rank %d's block failed: %s", c->root, ncclGetErrorString(r));
    else if (c->kind == NCCL_CALL_BROADCAST)
        DDP_ERROR("ncclBroadcast of rank %d's block failed: %s", c->root, ncclGetErrorString(r));
    else
        DDP_ERROR("%s of %zu elements (call %d) failed: %s (%s)", names[c->kind], c->count, i,
                  ncclGetErrorString(r), ncclGetLastError(NULL));
}

/* Issues a plan's calls in order, between ncclGroupStart and ncclGroupEnd when it is grouped;
 * stops at the first failed call (logged), DDP_ERR_NCCL then. Call with s->lock held. */
static ddp_status nccl_issue_plan(nccl_state *s, const nccl_plan *p, const void *send,
                                  void *recv, ddp_dtype dtype, ddp_reduce_op op)
{
    if (p->grouped)
        TRY_NCCL(ncclGroupStart());
    ddp_status st = DDP_OK;
    for (int i = 0; i < p->n_calls && st == DDP_OK; i++) {
        ncclResult_t r = nccl_issue_call(s, &p->calls[i], send, recv, dtype, op);
        if (r != ncclSuccess) {
            nccl_call_failed(&p->calls[i], i, r);
            st = DDP_ERR_NCCL;
        }
    }
    if (p->grouped) {
        ncclResult_t end = ncclGroupEnd(); /* the group is closed even after a failed call */
        if (st == DDP_OK)
            TRY_NCCL(end);
    }
    return st;
}

/* The runs' all-reduces in place, inside one group when there are several (launched together). */
static ddp_status nccl_issue_runs(nccl_state *s, void *base, const size_t *off, const size_t *len,
                                  int n_runs, ddp_dtype dtype, ddp_reduce_op op)
{
    nccl_plan plan;
    ddp_status st = nccl_plan_allreduce_runs(off, len, n_runs, &plan);
    if (st == DDP_OK)
        st = nccl_issue_plan(s, &plan, base, base, dtype, op);
    nccl_plan_free(&plan);
    return st;
}

/* Queues the all-reduce of runs (what: "all-reduce", or "barrier" for the GPU stream lane) after
 * `follow` and records its end in *done. */
static ddp_status nccl_issue_allreduce(nccl_state *s, const char *what, void *base,
                                       const size_t *off, const size_t *len, int n_runs,
                                       ddp_dtype dtype, ddp_reduce_op op, cudaStream_t follow,
                                       cudaEvent_t *done)
{
    ddp_status st = DDP_OK;
    size_t n = 0;
    for (int i = 0; i < n_runs; i++)
        n += len[i];
    void *tag = (void *)(intptr_t)trace_current_tag();
    int traced = ddp_trace_enabled();
    nvtx_range_push("allreduce", (int64_t)(intptr_t)tag);
    pthread_mutex_lock(&s->lock);
    st = nccl_usable(s);
    if (st == DDP_OK)
        st = nccl_follow(s, follow);
    if (st != DDP_OK)
        goto cleanup;
    if (traced)
        TRY_CUDA_GOTO(cudaLaunchHostFunc(s->stream, nccl_trace_begin, tag));
    st = nccl_issue_runs(s, base, off, len, n_runs, dtype, op);
    if (st != DDP_OK)
        goto cleanup;
    if (traced)
        TRY_CUDA_GOTO(cudaLaunchHostFunc(s->stream, nccl_trace_end, tag));
    st = nccl_mark_done(s, what, n * ddp_dtype_size(dtype), done);
cleanup:
    pthread_mutex_unlock(&s->lock);
    nvtx_range_pop();
    return st;
}

static ddp_status nccl_allreduce_runs_start(comm_group *c, void *base, const size_t *off,
                                            const size_t *len, int n_runs, ddp_dtype dtype,
                                            ddp_reduce_op op, void *stream, ddp_request **req)
{
    nccl_state *s = nccl_of(c);
    nccl_request *r = calloc(1, sizeof *r);
    if (!r) {
        DDP_ERROR("out of memory for an all-reduce request");
        return DDP_ERR_NOMEM;
    }
    *r = (nccl_request){.ops = &nccl_ops, .owner = s, .follow = (cudaStream_t)stream};
    ddp_status st = nccl_issue_allreduce(s, "all-reduce", base, off, len, n_runs, dtype, op,
                                         r->follow, &r->done);
    if (st != DDP_OK) {
        free(r);
        return st;
    }
    *req = (ddp_request *)r;
    return DDP_OK;
}

static ddp_status nccl_allreduce_start(comm_group *c, void *buf, size_t n, ddp_dtype dtype,
                                       ddp_reduce_op op, void *stream, ddp_request **req)
{
    size_t zero = 0; /* NCCL reads the arguments when the call is queued */
    return nccl_allreduce_runs_start(c, buf, &zero, &n, 1, dtype, op, stream, req);
}

/* The reduce-scatter's calls (nccl_plan_reduce_scatter): ncclReduceScatter for equal blocks, else
 * one ncclReduce per rank inside a group. recv == send is the in-place form of comm_ops: recv
 * becomes this rank's block of send, which NCCL's user guide ("In-place Operations") makes in
 * place for both calls. Call with s->lock held. */
static ddp_status nccl_issue_reduce_scatter(nccl_state *s, const void *send, void *recv,
                                            const size_t *counts, ddp_dtype dtype,
                                            ddp_reduce_op op)
{
    int world = 0, rank = 0;
    TRY_NCCL(ncclCommCount(s->comm, &world));
    TRY_NCCL(ncclCommUserRank(s->comm, &rank));
    nccl_plan plan;
    ddp_status st = nccl_plan_reduce_scatter(counts, world, rank, recv == send, &plan);
    if (st == DDP_OK)
        st = nccl_issue_plan(s, &plan, send, recv, dtype, op);
    nccl_plan_free(&plan);
    return st;
}

/* The all-gather's calls (nccl_plan_allgatherv): ncclAllGather for equal blocks, else one
 * ncclBroadcast per rank (root q sends block q) inside a group. In place when send is this
 * rank's block of recv. Call with s->lock held. */
static ddp_status nccl_issue_allgatherv(nccl_state *s, const void *send, void *recv,
                                        const size_t *counts, ddp_dtype dtype)
{
    int world = 0, rank = 0;
    TRY_NCCL(ncclCommCount(s->comm, &world));
    TRY_NCCL(ncclCommUserRank(s->comm, &rank));
    size_t mine = rank < world ? nccl_plan_block_offset(counts, rank) : 0;
    int in_place = (const char *)send == (const char *)recv + mine * ddp_dtype_size(dtype);
    nccl_plan plan;
    ddp_status st = nccl_plan_allgatherv(counts, world, rank, in_place, &plan);
    if (st == DDP_OK)
        st = nccl_issue_plan(s, &plan, send, recv, dtype, DDP_SUM);
    nccl_plan_free(&plan);
    return st;
}

/* The all-gather of runs' calls (nccl_plan_allgatherv_runs): every run's in-place all-gather(v),
 * all in one group. Call with s->lock held. */
static ddp_status nccl_issue_allgatherv_runs(nccl_state *s, void *base, const size_t *off,
                                             int n_runs, const size_t *counts, ddp_dtype dtype)
{
    int world = 0, rank = 0;
    TRY_NCCL(ncclCommCount(s->comm, &world));
    TRY_NCCL(ncclCommUserRank(s->comm, &rank));
    nccl_plan plan;
    ddp_status st = nccl_plan_allgatherv_runs(off, n_runs, counts, world, rank, &plan);
    if (st == DDP_OK)
        st = nccl_issue_plan(s, &plan, base, base, dtype, DDP_SUM);
    nccl_plan_free(&plan);
    return st;
}

/* Queues a trace host function on the communication stream. */
static ddp_status nccl_host_func(nccl_state *s, cudaHostFn_t fn, void *tag)
{
    ddp_status st = DDP_OK;
    TRY_CUDA_GOTO(cudaLaunchHostFunc(s->stream, fn, tag));
cleanup:
    return st;
}

/* Queues a reduce-scatter (gather = 0) or all-gather after `follow` and hands out its request;
 * run_off not NULL: the all-gather of n_runs runs of recv (send unused). */
static ddp_status nccl_shard_start(comm_group *c, int gather, const void *send, void *recv,
                                   const size_t *counts, const size_t *run_off, int n_runs,
                                   ddp_dtype dtype, ddp_reduce_op op, void *stream,
                                   ddp_request **req)
{
    nccl_state *s = nccl_of(c);
    nccl_request *r = calloc(1, sizeof *r);
    if (!r) {
        DDP_ERROR("out of memory for a collective's request");
        return DDP_ERR_NOMEM;
    }
    *r = (nccl_request){.ops = &nccl_ops, .owner = s, .follow = (cudaStream_t)stream};
    void *tag = (void *)(intptr_t)trace_current_tag();
    int traced = ddp_trace_enabled();
    nvtx_range_push(gather ? "allgather" : "reduce_scatter", (int64_t)(intptr_t)tag);
    pthread_mutex_lock(&s->lock);
    ddp_status st = nccl_usable(s);
    if (st == DDP_OK)
        st = nccl_follow(s, r->follow);
    if (st == DDP_OK && traced)
        st = nccl_host_func(s, gather ? nccl_trace_ag_begin : nccl_trace_rs_begin, tag);
    if (st == DDP_OK)
        st = run_off  ? nccl_issue_allgatherv_runs(s, recv, run_off, n_runs, counts, dtype)
             : gather ? nccl_issue_allgatherv(s, send, recv, counts, dtype)
                      : nccl_issue_reduce_scatter(s, send, recv, counts, dtype, op);
    if (st == DDP_OK && traced)
        st = nccl_host_func(s, gather ? nccl_trace_ag_end : nccl_trace_rs_end, tag);
    /* every rank's blocks (of every run): the elements the collective moves in all */
    size_t n = nccl_plan_block_offset(counts, run_off ? n_runs * s->world : s->world);
    if (st == DDP_OK)
        st = nccl_mark_done(s, gather ? "all-gather" : "reduce-scatter",
                            n * ddp_dtype_size(dtype), &r->done);
    pthread_mutex_unlock(&s->lock);
    nvtx_range_pop();
    if (st != DDP_OK) {
        free(r);
        return st;
    }
    *req = (ddp_request *)r;
    return DDP_OK;
}

static ddp_status nccl_reduce_scatter_start(comm_group *c, const void *send, void *recv,
                                            const size_t *counts, ddp_dtype dtype,
                                            ddp_reduce_op op, void *stream, ddp_request **req)
{
    return nccl_shard_start(c, 0, send, recv, counts, NULL, 0, dtype, op, stream, req);
}

static ddp_status nccl_allgatherv_start(comm_group *c, const void *send, void *recv,
                                        const size_t *counts, ddp_dtype dtype, void *stream,
                                        ddp_request **req)
{
    return nccl_shard_start(c, 1, send, recv, counts, NULL, 0, dtype, DDP_SUM, stream, req);
}

static ddp_status nccl_allgatherv_runs_start(comm_group *c, void *base, const size_t *off,
                                             int n_runs, const size_t *counts, ddp_dtype dtype,
                                             void *stream, ddp_request **req)
{
    return nccl_shard_start(c, 1, base, base, counts, off, n_runs, dtype, DDP_SUM, stream, req);
}

static ddp_status nccl_wait(ddp_request *req)
{
    nccl_request *r = (nccl_request *)req;
    ddp_status st = nccl_complete_on(r->owner, r->done, r->follow);
    free(r);
    return st;
}

/* A blocking all-reduce (what: its name on the GPU stream lane): ordered on the compute stream. */
static ddp_status nccl_allreduce_as(comm_group *c, const char *what, void *buf, size_t n,
                                    ddp_dtype dtype, ddp_reduce_op op)
{
    cudaEvent_t done = NULL;
    size_t zero = 0;
    ddp_status st = nccl_issue_allreduce(nccl_of(c), what, buf, &zero, &n, 1, dtype, op, NULL,
                                         &done);
    return st == DDP_OK ? nccl_complete(nccl_of(c), done) : st;
}

static ddp_status nccl_allreduce(comm_group *c, void *buf, size_t n, ddp_dtype dtype,
                                 ddp_reduce_op op)
{
    return nccl_allreduce_as(c, "all-reduce", buf, n, dtype, op);
}

static ddp_status nccl_broadcast(comm_group *c, void *buf, size_t n_bytes, int root)
{
    nccl_state *s = nccl_of(c);
    cudaEvent_t done = NULL;
    pthread_mutex_lock(&s->lock);
    ddp_status st = nccl_usable(s);
    if (st == DDP_OK)
        st = nccl_follow_compute(s);
    if (st != DDP_OK)
        goto cleanup;
    TRY_NCCL_GOTO(ncclBroadcast(buf, buf, n_bytes, ncclUint8, root, s->comm, s->stream));
    st = nccl_mark_done(s, "broadcast", n_bytes, &done);
cleanup:
    pthread_mutex_unlock(&s->lock);
    return st == DDP_OK ? nccl_complete(s, done) : st;
}

static ddp_status nccl_allgather(comm_group *c, const void *send, void *recv, size_t n_bytes)
{
    nccl_state *s = nccl_of(c);
    cudaEvent_t done = NULL;
    pthread_mutex_lock(&s->lock);
    ddp_status st = nccl_usable(s);
    if (st == DDP_OK)
        st = nccl_follow_compute(s);
    if (st != DDP_OK)
        goto cleanup;
    TRY_NCCL_GOTO(ncclAllGather(send, recv, n_bytes, ncclUint8, s->comm, s->stream));
    st = nccl_mark_done(s, "all-gather", n_bytes, &done);
cleanup:
    pthread_mutex_unlock(&s->lock);
    return st == DDP_OK ? nccl_complete(s, done) : st;
}

/* NCCL has no barrier: a one-float all-reduce, waited for by the host under the deadline. */
static ddp_status nccl_barrier(comm_group *c)
{
    nccl_state *s = nccl_of(c);
    ddp_status st = nccl_allreduce_as(c, "barrier", s->scratch, 1, DDP_FP32, DDP_SUM);
    return st == DDP_OK ? cuda_stream_wait(s->stream, "barrier") : st;
}

static void nccl_destroy_bounded(nccl_state *s)
{
    pthread_t thread;
    nccl_closer *d = nccl_closer_start(s->comm, ncclCommDestroy, &thread);
    if (!d) {
        nccl_abort(s); /* no thread: abort, which does not wait for peers */
        return;
    }
    s->comm = NULL;
    nccl_closer_finish(d, thread, "ncclCommDestroy");
}

/* After an asynchronous error (a peer died, a network fault) or past the deadline the queued
 * operations never complete: abort the communicator instead of waiting for them. */
static void nccl_close_comm(nccl_state *s)
{
    if (s->aborted)
        return;
    if (nccl_watch_check(s) != DDP_OK)
        return;
    if (cuda_stream_wait(s->stream, "closing the NCCL communicator") != DDP_OK) {
        nccl_abort(s);
        return;
    }
    nccl_destroy_bounded(s);
}

static void nccl_destroy(comm_group *c)
{
    if (!c)
        return;
    nccl_state *s = nccl_of(c);
    cuda_set_watch(NULL, NULL, NULL);
    ras_use_nccl(0);
    if (s->lane)
        watch_stream_close(); /* no query of its markers from here on */
    if (s->comm || s->aborted)
        nccl_close_comm(s);
    if (s->aborter)
        nccl_closer_finish(s->aborter, s->abort_thread, "ncclCommAbort");
    else if (s->stream)
        cuda_stream_wait(s->stream, "closing the NCCL stream");
    /* its stream still tracked; after an abort (a failed peer) nothing more is waited for */
    cuda_free_drained(s->scratch, "closing the NCCL communicator", !s->aborter && !s->aborted);
    if (s->ready)
        cudaEventDestroy(s->ready);
    nccl_lane_free(s);
    if (s->stream) {
        cuda_track_stream(s->stream, 0);
        cudaStreamDestroy(s->stream);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
    free(c);
}

static const comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .allreduce_start = nccl_allreduce_start,
    .allreduce_runs_start = nccl_allreduce_runs_start,
    .wait = nccl_wait,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter_start = nccl_reduce_scatter_start,
    .allgatherv_start = nccl_allgatherv_start,
    .allgatherv_runs_start = nccl_allgatherv_runs_start,
    .barrier = nccl_barrier,
    .destroy = nccl_destroy,
};

/* Rank 0's unique id (and whether making it worked), broadcast over MPI_COMM_WORLD. */
static ddp_status nccl_bootstrap_id(int rank, ncclUniqueId *id)
{
    struct {
        int ok;
        ncclUniqueId id;
    } boot = {.ok = 1};
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&boot.id);
        if (r != ncclSuccess) {
            DDP_ERROR("ncclGetUniqueId failed: %s", ncclGetErrorString(r));
            boot.ok = 0;
        }
    }
    if (MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        DDP_ERROR("MPI_Bcast of the NCCL unique id failed");
        return DDP_ERR_MPI;
    }
    if (!boot.ok) {
        DDP_ERROR("rank 0 could not create the NCCL unique id (see its log)");
        return DDP_ERR_NCCL;
    }
    *id = boot.id;
    return DDP_OK;
}

/* Rank 0 logs the NCCL library in use and the one libddp was built against; the watchdog's
 * report learns it (NCCL RAS, nccl_ras.c). */
static void nccl_report_version(void)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return;
    ras_use_nccl(v);
    DDP_INFO0("NCCL %d.%d.%d (built against %d.%d.%d)", v / 10000, v / 100 % 100, v % 100,
              NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

/* The collective steps (id broadcast, ncclCommInitRank on the device the backend made current)
 * come first, so that a local failure cannot leave peers waiting in them; a failure after them
 * is local and reported to every rank by the caller's agreement step. */
static ddp_status nccl_open(nccl_state *s, int rank, int world_size)
{
    ncclUniqueId id;
    /* Both steps wait for every rank: under the watchdog's deadline, so a frozen peer ends the job. */
    watch_enter(DDP_WATCH_CALLER, "NCCL start-up", -1, sizeof id);
    ddp_status st = nccl_bootstrap_id(rank, &id);
    ncclResult_t init = st == DDP_OK ? ncclCommInitRank(&s->comm, world_size, id, rank) : ncclSuccess;
    watch_leave(DDP_WATCH_CALLER);
    if (st != DDP_OK)
        return st;
    if (init != ncclSuccess) {
        DDP_ERROR("ncclCommInitRank failed: %s (%s)", ncclGetErrorString(init), ncclGetLastError(NULL));
        return DDP_ERR_NCCL;
    }
    TRY_NCCL_GOTO(ncclCommCuDevice(s->comm, &s->device));
    s->world = world_size;
    nccl_report_version();
    TRY_CUDA_GOTO(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    cuda_track_stream(s->stream, 1); /* drained before libddp's cudaFree and cudaFreeHost */
    TRY_CUDA_GOTO(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    TRY_OK_GOTO(nccl_lane_open(s));
    TRY_CUDA_GOTO(cudaMalloc((void **)&s->scratch, sizeof(float)));
    /* on the communication stream: the legacy default stream does not order non-blocking ones */
    TRY_CUDA_GOTO(cudaMemsetAsync(s->scratch, 0, sizeof(float), s->stream));
cleanup:
    return st;
}

ddp_status comm_nccl_create(int rank, int world_size, comm_group **out)
{
    *out = NULL;
    comm_group *c = calloc(1, sizeof *c);
    nccl_state *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c);
        free(s);
        DDP_ERROR("out of memory for the NCCL communicator");
        return DDP_ERR_NOMEM;
    }
    pthread_mutex_init(&s->lock, NULL);
    *c = (comm_group){.ops = &nccl_ops, .impl = s};
    ddp_status st = nccl_open(s, rank, world_size);
    if (st != DDP_OK) {
        if (s->comm) /* a local failure after init: abort is local, destroy may wait for peers */
            ncclCommAbort(s->comm);
        s->comm = NULL;
        nccl_destroy(c);
        return st;
    }
    cuda_set_watch(nccl_watch_check, nccl_watch_timeout, s);
    *out = c;
    return DDP_OK;
}
