/* trace.c - the per-rank timeline: spans and instant events in a preallocated buffer, clock
 * offsets between nodes measured over MPI, and one Chrome trace-event JSON file for the job.
 *
 * Recording: one process-wide buffer, allocated and touched by ddp_trace_start; a slot is claimed with one relaxed atomic increment, so the
 * caller's thread and the communicator's thread record without a lock. Timestamps are
 * CLOCK_MONOTONIC nanoseconds of this node.
 * Clock alignment (ddp_trace_start): rank 0 plays ping-pong with the first rank of every other
 * node (local rank 0); in each round it sends, the peer answers with its clock t_p, and rank 0 reads
 * its clock before (t0) and after (t1). offset = t_p - (t0 + t1) / 2 from the round with the
 * smallest t1 - t0; its error is at most half that round trip. Every rank of a node uses the
 * node's offset (they share one clock).
 * File: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"format": "ddp-trace",
 * "version": 1, "world_size": N, "dropped": D}}; ts in microseconds from rank 0's start,
 * pid = rank, tid = recording thread; "M" metadata events name the rows.
 * NVTX (built with the NVTX v3 headers: HAVE_NVTX): every span is also an NVTX range on the
 * calling thread, whether tracing is on or not, for Nsight Systems' timeline: message the span's
 * name (the string itself: nothing is formatted), payload its arg as an int64 (the bucket, the
 * micro-batch, the step). Without a tool attached NVTX's first call finds none and every later
 * push or pop is a load and a branch on a null function pointer (benchmarks/trace_cost.c).
 * DDP_NVTX=0 leaves them out (read at the first span; ddp_init refuses other values than 0 and 1).
 */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "ddp_trace.h"
#include "internal.h"
#if HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#define DDP_TRACE_DEFAULT_EVENTS ((size_t)1 << 19)
#define DDP_TRACE_NAME 40   /* bytes of a name in the gathered records */
#define DDP_TRACE_ROUNDS 16 /* ping-pong rounds per node for the clock offset */
#define DDP_TRACE_VERSION 1

typedef struct trace_event {
    const char *name;
    int64_t t_ns;
    int64_t arg;
    int32_t tid;
    char ph; /* 'B', 'E' or 'i' */
} trace_event;

/* The gathered form: fixed size, names copied. */
typedef struct trace_record {
    char name[DDP_TRACE_NAME];
    int64_t t_ns; /* aligned to rank 0's clock, from rank 0's start */
    int64_t arg;
    int32_t tid;
    char ph;
    char pad[3];
} trace_record;

static atomic_int trace_on;
static trace_event *trace_buf;
static size_t trace_cap;
static atomic_size_t trace_n;
static atomic_long trace_dropped;
static atomic_int trace_next_tid;
static int64_t trace_offset_ns; /* this node's clock minus rank 0's */
static int64_t trace_t0_ns;     /* rank 0's clock at start */
static int trace_cuda;          /* a CUDA context: exposed communication from the reducer's events */
static _Thread_local int trace_tid = -1;
static _Thread_local int64_t trace_tag = -1;

void trace_set_tag(int64_t tag) { trace_tag = tag; }
int64_t trace_current_tag(void) { return trace_tag; }

static int64_t trace_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ddp_trace_enabled(void)
{
    return atomic_load_explicit(&trace_on, memory_order_relaxed);
}

static void trace_record_event(const char *name, int64_t arg, char ph)
{
    if (__builtin_expect(!atomic_load_explicit(&trace_on, memory_order_relaxed), 1))
        return;
    size_t i = atomic_fetch_add_explicit(&trace_n, 1, memory_order_relaxed);
    if (i >= trace_cap) {
        atomic_fetch_add_explicit(&trace_dropped, 1, memory_order_relaxed);
        return;
    }
    if (trace_tid < 0)
        trace_tid = atomic_fetch_add(&trace_next_tid, 1);
    trace_buf[i] = (trace_event){.name = name ? name : "?", .t_ns = trace_now_ns(), .arg = arg,
                                 .tid = trace_tid, .ph = ph};
}

/* ---- NVTX ranges --------------------------------------------------------------------------- */

#if HAVE_NVTX
static _Atomic int nvtx_state = -1; /* -1: DDP_NVTX not read yet, 0: off, 1: on */

static int nvtx_on(void)
{
    int on = atomic_load_explicit(&nvtx_state, memory_order_relaxed);
    if (__builtin_expect(on < 0, 0)) { /* every thread that gets here reads the same value */
        const char *env = getenv("DDP_NVTX");
        on = !(env && strcmp(env, "0") == 0);
        atomic_store_explicit(&nvtx_state, on, memory_order_relaxed);
    }
    return on;
}

void nvtx_range_push(const char *name, int64_t arg)
{
    if (!nvtx_on())
        return;
    nvtxEventAttributes_t a = {.version = NVTX_VERSION, .size = NVTX_EVENT_ATTRIB_STRUCT_SIZE,
                               .messageType = NVTX_MESSAGE_TYPE_ASCII,
                               .message.ascii = name ? name : "?",
                               .payloadType = NVTX_PAYLOAD_TYPE_INT64, .payload.llValue = arg};
    nvtxRangePushEx(&a);
}

void nvtx_range_pop(void)
{
    if (nvtx_on())
        nvtxRangePop();
}
#else
void nvtx_range_push(const char *name, int64_t arg)
{
    (void)name;
    (void)arg;
}

void nvtx_range_pop(void) {}
#endif

void ddp_trace_begin(const char *name, int64_t arg)
{
    nvtx_range_push(name, arg);
    trace_record_event(name, arg, 'B');
}

void ddp_trace_end(const char *name, int64_t arg)
{
    trace_record_event(name, arg, 'E');
    nvtx_range_pop();
}

void trace_span_begin(const char *name, int64_t arg) { trace_record_event(name, arg, 'B'); }
void trace_span_end(const char *name, int64_t arg) { trace_record_event(name, arg, 'E'); }
void ddp_trace_instant(const char *name, int64_t arg) { trace_record_event(name, arg, 'i'); }

/* ---- start: clock offsets ------------------------------------------------------------------ */

/* Rank 0's side of the ping-pong with `peer`; returns peer clock minus rank 0's clock. */
static int trace_offset_with(MPI_Comm comm, int peer, int64_t *offset)
{
    int64_t best_rtt = INT64_MAX, t_peer = 0;
    for (int k = 0; k < DDP_TRACE_ROUNDS; k++) {
        int64_t t0 = trace_now_ns();
        if (MPI_Send(&t0, 1, MPI_INT64_T, peer, 0, comm) != MPI_SUCCESS ||
            MPI_Recv(&t_peer, 1, MPI_INT64_T, peer, 0, comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return -1;
        int64_t t1 = trace_now_ns();
        if (t1 - t0 < best_rtt) {
            best_rtt = t1 - t0;
            *offset = t_peer - (t0 + t1) / 2;
        }
    }
    return 0;
}

/* A node leader's side: answer every round with this node's clock. */
static int trace_answer(MPI_Comm comm)
{
    for (int k = 0; k < DDP_TRACE_ROUNDS; k++) {
        int64_t t;
        if (MPI_Recv(&t, 1, MPI_INT64_T, 0, 0, comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return -1;
        t = trace_now_ns();
        if (MPI_Send(&t, 1, MPI_INT64_T, 0, 0, comm) != MPI_SUCCESS)
            return -1;
    }
    return 0;
}

/* Measures this node's clock offset to rank 0 (see the top of the file); 0 on success. */
static int trace_measure_offsets(ddp_ctx *ctx, MPI_Comm comm)
{
    int n = ctx->world_size, leader = ctx->local_rank == 0 && ctx->node_rank != 0;
    int64_t *node_off = calloc((size_t)ctx->n_nodes, sizeof *node_off);
    int *leaders = calloc((size_t)n, sizeof *leaders), rc = 0;
    if (!node_off || !leaders)
        rc = -1;
    /* Every rank learns which ranks lead a node other than rank 0's. */
    int flag = leader ? ctx->node_rank : -1;
    if (rc == 0 && MPI_Allgather(&flag, 1, MPI_INT, leaders, 1, MPI_INT, comm) != MPI_SUCCESS)
        rc = -1;
    for (int r = 1; rc == 0 && r < n; r++) {
        if (leaders[r] < 0)
            continue;
        if (ctx->rank == 0)
            rc = trace_offset_with(comm, r, &node_off[leaders[r]]);
        else if (ctx->rank == r)
            rc = trace_answer(comm);
    }
    if (rc == 0 && MPI_Bcast(node_off, ctx->n_nodes, MPI_INT64_T, 0, comm) != MPI_SUCCESS)
        rc = -1;
    if (rc == 0)
        trace_offset_ns = node_off[ctx->node_rank];
    free(node_off);
    free(leaders);
    return rc;
}

ddp_status ddp_trace_start(ddp_ctx *ctx, size_t max_events)
{
    if (!ctx) {
        DDP_ERROR("ddp_trace_start: context is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    int busy = ddp_trace_enabled(), any_busy = 0, failed = 0, any_failed = 0;
    if (MPI_Allreduce(&busy, &any_busy, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return DDP_ERR_MPI;
    if (any_busy) {
        DDP_ERROR("ddp_trace_start: tracing is already on: call ddp_trace_write() first");
        return DDP_ERR_STATE;
    }
    trace_cap = max_events ? max_events : DDP_TRACE_DEFAULT_EVENTS;
    trace_buf = malloc(trace_cap * sizeof *trace_buf);
    failed = !trace_buf;
    /* Touch every page now: a first-touch page fault while recording costs microseconds (measured
     * in a VM: about 0.7 us per event until the pages were touched, 0.1 us after). */
    if (trace_buf)
        memset(trace_buf, 0, trace_cap * sizeof *trace_buf);
    MPI_Comm comm = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) {
        DDP_ERROR("ddp_trace_start: MPI_Comm_dup failed; tracing stays off");
        free(trace_buf);
        trace_buf = NULL;
        return DDP_ERR_MPI;
    }
    if (MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS ||
        any_failed || trace_measure_offsets(ctx, comm) != 0) {
        DDP_ERROR("ddp_trace_start: %s", any_failed ? "out of memory for the trace buffer on some "
                  "rank: pass a smaller max_events" : "measuring clock offsets over MPI failed");
        free(trace_buf);
        trace_buf = NULL;
        MPI_Comm_free(&comm);
        return any_failed ? DDP_ERR_NOMEM : DDP_ERR_MPI;
    }
    int64_t t0 = trace_now_ns() - trace_offset_ns; /* rank 0's clock, any rank's view */
    MPI_Bcast(&t0, 1, MPI_INT64_T, 0, comm);
    MPI_Comm_free(&comm);
    trace_t0_ns = t0;
    atomic_store(&trace_n, 0);
    atomic_store(&trace_dropped, 0);
    atomic_store(&trace_next_tid, 1);
    trace_tid = 0;
    trace_cuda = ctx->backend == DDP_BACKEND_CUDA;
    atomic_store(&trace_on, 1);
    return DDP_OK;
}

/* ---- statistics -------------------------------------------------------------------------- */

enum { TRACE_WAIT, TRACE_COMM, TRACE_BACKWARD, TRACE_RECYCLE, TRACE_GATHER, TRACE_N_KINDS };

static int trace_kind(const char *name)
{
    static const char *names[TRACE_N_KINDS] = {"reducer.wait", "allreduce", "backward",
                                               "reducer.recycle_wait", "reducer.gather_wait"};
    for (int k = 0; k < TRACE_N_KINDS; k++)
        if (strcmp(name, names[k]) == 0)
            return k;
    /* the sharded reducer's collectives are communication too */
    if (strcmp(name, "reduce_scatter") == 0 || strcmp(name, "allgather") == 0)
        return TRACE_COMM;
    return -1;
}

ddp_status ddp_trace_get_stats(ddp_trace_stats *out)
{
    if (!out || !ddp_trace_enabled()) {
        DDP_ERROR("ddp_trace_get_stats: tracing is off (call ddp_trace_start) or out is NULL");
        return DDP_ERR_STATE;
    }
    size_t n = atomic_load(&trace_n);
    n = n < trace_cap ? n : trace_cap;
    double total[TRACE_N_KINDS] = {0};
    long syncs = 0, n_device = 0, gathers = 0, n_device_gathers = 0;
    double device_s = 0.0; /* CUDA: the reducer's "reducer.exposed" instants (nanoseconds) */
    double device_gather_s = 0.0; /* CUDA: its "reducer.gather_exposed" instants */
    /* Spans of one kind do not nest; begin times per (thread, kind), for up to 8 threads. */
    int64_t open[8][TRACE_N_KINDS] = {{0}};
    for (size_t i = 0; i < n; i++) {
        const trace_event *e = &trace_buf[i];
        if (e->ph == 'i' && strcmp(e->name, "reducer.exposed") == 0) {
            device_s += (double)e->arg * 1e-9;
            n_device++;
            continue;
        }
        if (e->ph == 'i' && strcmp(e->name, "reducer.recycle_exposed") == 0) {
            device_s += (double)e->arg * 1e-9; /* the steps' exposed time, mid-backward */
            continue;
        }
        if (e->ph == 'i' && strcmp(e->name, "reducer.gather_exposed") == 0) {
            device_gather_s += (double)e->arg * 1e-9;
            n_device_gathers++;
            continue;
        }
        int k = e->ph == 'i' || e->tid >= 8 ? -1 : trace_kind(e->name);
        if (k < 0)
            continue;
        if (e->ph == 'B')
            open[e->tid][k] = e->t_ns;
        else if (open[e->tid][k]) {
            total[k] += (double)(e->t_ns - open[e->tid][k]) * 1e-9;
            open[e->tid][k] = 0;
            syncs += k == TRACE_WAIT;
            gathers += k == TRACE_GATHER;
        }
    }
    int device = trace_cuda || n_device > 0;
    *out = (ddp_trace_stats){
        .n_syncs = syncs,
        .exposed_s = device ? device_s : total[TRACE_WAIT] + total[TRACE_RECYCLE],
        .n_exposed = device ? n_device : syncs,
        .comm_s = total[TRACE_COMM], .backward_s = total[TRACE_BACKWARD],
        .n_dropped = atomic_load(&trace_dropped),
        .gather_wait_s = trace_cuda ? device_gather_s : total[TRACE_GATHER],
        .n_gather_waits = trace_cuda ? n_device_gathers : gathers};
    return DDP_OK;
}

/* ---- writing ------------------------------------------------------------------------------- */

/* Writes s as a JSON string body (quotes, backslashes and control characters escaped). */
static void trace_json_string(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

static void trace_write_meta(FILE *f, int rank, const char *host, int n_threads)
{
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
               "\"rank %d (", rank, rank);
    trace_json_string(f, host);
    fprintf(f, ")\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}},\n", rank, rank);
    for (int t = 0; t < n_threads; t++)
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,\"tid\":%d,\"args\":"
                   "{\"name\":\"%s\"}},\n", rank, t, t == 0 ? "main" : t == 1 ? "comm" : "thread");
}

static void trace_write_event(FILE *f, int rank, const trace_record *e)
{
    fprintf(f, "{\"name\":\"");
    trace_json_string(f, e->name);
    fprintf(f, "\",\"ph\":\"%c\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d,", e->ph, (double)e->t_ns * 1e-3,
            rank, e->tid);
    if (e->ph == 'i')
        fprintf(f, "\"s\":\"t\",");
    fprintf(f, "\"args\":{\"arg\":%lld}}", (long long)e->arg);
}

/* Creates the temporary file tmp (a new file: O_EXCL never opens a FIFO or a device left at that
 * name); NULL, logged, on failure. */
static FILE *trace_create_tmp(const char *tmp)
{
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        DDP_ERROR("trace: cannot create %s: %s (check that the folder exists and is writable)", tmp,
                  strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
    }
    return f;
}

/* Writes the events of every rank; counts[r] records of rank r, in order, in recs. */
static void trace_write_events(FILE *f, int world, const int *counts, const trace_record *recs,
                               const char *hosts, long dropped)
{
    fprintf(f, "{\"traceEvents\":[\n");
    size_t at = 0;
    for (int r = 0; r < world; r++) {
        int n_threads = 1;
        for (int i = 0; i < counts[r]; i++)
            n_threads = recs[at + (size_t)i].tid + 1 > n_threads ? recs[at + (size_t)i].tid + 1
                                                                  : n_threads;
        trace_write_meta(f, r, hosts + (size_t)r * 64, n_threads);
        for (int i = 0; i < counts[r]; i++, at++) {
            trace_write_event(f, r, &recs[at]);
            fprintf(f, r == world - 1 && i == counts[r] - 1 ? "\n" : ",\n");
        }
    }
    fprintf(f, "%s],\"displayTimeUnit\":\"ms\",\"otherData\":{\"format\":\"ddp-trace\","
               "\"version\":%d,\"world_size\":%d,\"dropped\":%ld}}\n",
            at == 0 ? "{\"name\":\"empty\",\"ph\":\"i\",\"ts\":0,\"pid\":0,\"tid\":0,\"s\":\"t\"}"
                    : "", DDP_TRACE_VERSION, world, dropped);
}

/* Rank 0: the whole file, replaced atomically (a temporary file renamed over the target: see
 * output_target for what may be replaced). */
static ddp_status trace_write_file(const char *path, int world, const int *counts,
                                   const trace_record *recs, const char *hosts, long dropped)
{
    char *target = NULL;
    ddp_status st = output_target("trace", path, &target);
    if (st != DDP_OK)
        return st;
    size_t tmp_size = strlen(target) + 32;
    char *tmp = malloc(tmp_size);
    if (tmp)
        snprintf(tmp, tmp_size, "%s.tmp.%ld", target, (long)getpid());
    FILE *f = tmp ? trace_create_tmp(tmp) : NULL;
    st = f ? DDP_OK : tmp ? DDP_ERR_IO : DDP_ERR_NOMEM;
    if (f) {
        trace_write_events(f, world, counts, recs, hosts, dropped);
        int err = fflush(f) != 0 || ferror(f) ? errno : 0;
        if (fclose(f) != 0 && !err)
            err = errno;
        if (err || rename(tmp, target) != 0) {
            DDP_ERROR("trace: writing %s failed: %s", target, strerror(err ? err : errno));
            unlink(tmp);
            st = DDP_ERR_IO;
        }
    }
    free(tmp);
    free(target);
    return st;
}

/* This rank's events as records on rank 0's time line. *out is malloc'ed. */
static ddp_status trace_make_records(trace_record **out, int *count)
{
    size_t n = atomic_load(&trace_n);
    n = n < trace_cap ? n : trace_cap;
    if (n > (size_t)(INT32_MAX / (int)sizeof(trace_record))) {
        DDP_ERROR("trace: %zu events are too many to gather: pass a smaller max_events", n);
        return DDP_ERR_INVALID_ARG;
    }
    trace_record *r = calloc(n ? n : 1, sizeof *r);
    if (!r)
        return DDP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        snprintf(r[i].name, sizeof r[i].name, "%s", trace_buf[i].name);
        r[i].t_ns = trace_buf[i].t_ns - trace_offset_ns - trace_t0_ns;
        r[i].arg = trace_buf[i].arg;
        r[i].tid = trace_buf[i].tid;
        r[i].ph = trace_buf[i].ph;
    }
    *out = r;
    *count = (int)n;
    return DDP_OK;
}

/* Gathers every rank's records (and host names) to rank 0, which writes the file. */
static ddp_status trace_gather_write(ddp_ctx *ctx, const char *path, const trace_record *mine,
                                     int count, long dropped)
{
    int world = ctx->world_size, root = ctx->rank == 0;
    int *counts = root ? calloc((size_t)world, sizeof *counts) : NULL;
    int *displs = root ? calloc((size_t)world, sizeof *displs) : NULL;
    char *hosts = root ? calloc((size_t)world, 64) : NULL, host[64];
    long total_dropped = 0;
    trace_record *all = NULL;
    ddp_status st = DDP_OK;
    snprintf(host, sizeof host, "%.63s", ctx->hostname);
    if (root && (!counts || !displs || !hosts))
        st = DDP_ERR_NOMEM;
    int bad = MPI_Gather(&count, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS ||
              MPI_Gather(host, 64, MPI_CHAR, hosts, 64, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS ||
              MPI_Reduce(&dropped, &total_dropped, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
    if (bad)
        st = DDP_ERR_MPI;
    long long bytes = 0;
    for (int r = 0; root && st == DDP_OK && r < world; r++) {
        displs[r] = (int)bytes;
        bytes += (long long)counts[r] * (long long)sizeof(trace_record);
        counts[r] *= (int)sizeof(trace_record);
        if (bytes > INT32_MAX)
            st = DDP_ERR_INVALID_ARG;
    }
    if (root && st == DDP_OK && !(all = malloc((size_t)bytes + 1)))
        st = DDP_ERR_NOMEM;
    bad |= MPI_Bcast(&st, 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
    if (!bad && st == DDP_OK)
        bad = MPI_Gatherv(mine, count * (int)sizeof(trace_record), MPI_BYTE, all, counts, displs,
                          MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
    if (bad)
        st = DDP_ERR_MPI;
    if (root && st == DDP_OK) {
        for (int r = 0; r < world; r++)
            counts[r] /= (int)sizeof(trace_record);
        st = trace_write_file(path, world, counts, all, hosts, total_dropped);
    }
    free(all);
    free(counts);
    free(displs);
    free(hosts);
    return st;
}

ddp_status ddp_trace_write(ddp_ctx *ctx, const char *path)
{
    int on = ddp_trace_enabled(), all_on = 0;
    if (!ctx || MPI_Allreduce(&on, &all_on, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return ctx ? DDP_ERR_MPI : DDP_ERR_INVALID_ARG;
    /* On CUDA the collectives' spans are recorded by host functions on the streams: let the
     * queued ones run before the buffer is closed (a timeout is logged; the file is written). */
    if (on && ctx->backend == DDP_BACKEND_CUDA)
        ddp_synchronize(ctx);
    atomic_store(&trace_on, 0);
    ddp_status st = DDP_OK;
    if (!all_on) {
        DDP_ERROR("ddp_trace_write: tracing is off on some rank: call ddp_trace_start() first");
        st = DDP_ERR_STATE;
    }
    if (st == DDP_OK && ctx->rank == 0 && !path) {
        DDP_ERROR("ddp_trace_write: no file name given on rank 0");
        st = DDP_ERR_INVALID_ARG;
    }
    trace_record *mine = NULL;
    int count = 0;
    if (st == DDP_OK)
        st = trace_make_records(&mine, &count);
    int local = st, worst = 0;
    if (MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        worst = DDP_ERR_MPI;
    st = (ddp_status)worst;
    if (st == DDP_OK)
        st = trace_gather_write(ctx, path, mine, count, atomic_load(&trace_dropped));
    int final = st;
    MPI_Bcast(&final, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(mine);
    free(trace_buf);
    trace_buf = NULL;
    return (ddp_status)final;
}

ddp_status ddp_trace_summarize(ddp_ctx *ctx, ddp_trace_summary *out)
{
    *out = (ddp_trace_summary){-1.0, -1.0, -1.0, -1.0};
    ddp_trace_stats s;
    if (!ddp_trace_enabled() || ddp_trace_get_stats(&s) != DDP_OK)
        return DDP_OK;
    double syncs = s.n_syncs > 0 ? (double)s.n_syncs : 1.0;
    /* CUDA: the exposed time is read from events one sync late, so it may cover none yet */
    int unmeasured = s.n_exposed == 0 && s.n_syncs > 0;
    double measured = s.n_exposed > 0 ? (double)s.n_exposed : 1.0;
    /* ZeRO's gather waits per synchronisation (the forward pass's; stage 2's waits in the
     * middle of the backward pass are in exposed_s already) */
    double v[6] = {1e3 * s.exposed_s / measured, 1e3 * s.comm_s / syncs, (double)s.n_dropped,
                   unmeasured, 1e3 * s.gather_wait_s / syncs, (double)s.n_gather_waits};
    ddp_status st = ddp_allreduce_host(ctx, v, 6, DDP_FP64, DDP_SUM);
    if (st != DDP_OK)
        return st;
    int world = ddp_world_size(ctx);
    out->comm_ms = v[1] / world;
    if (v[5] > 0)
        out->gather_wait_ms = v[4] / world;
    if (v[3] == 0) { /* else exposed and hidden stay -1: unknown */
        out->exposed_comm_ms = v[0] / world;
        double hidden = out->comm_ms > 0 ? 1.0 - out->exposed_comm_ms / out->comm_ms : 0.0;
        out->hidden_fraction = hidden < 0 ? 0 : hidden;
    }
    if (v[2] > 0 && ddp_rank(ctx) == 0)
        DDP_WARN("trace: %.0f events were dropped (buffer full); the figures cover the start", v[2]);
    return DDP_OK;
}
