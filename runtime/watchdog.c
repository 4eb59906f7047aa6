/* watchdog.c - no rank left hanging: a deadline on every collective, and death detection over a
 * side channel of TCP connections that does not depend on MPI.
 *
 * Deadlines. Every collective runs between watch_enter() and watch_leave() on one of two host
 * lanes: the caller's blocking collectives, and the communication thread's queued all-reduces.
 * Each call is one atomic store of (sequence number << 1 | active) into the lane, plus the label
 * of the collective: no system call, no lock. One thread per process (started by ddp_init, before
 * MPI_Init) looks at the lanes every tick; a lane that shows the same active collective for longer
 * than DDP_TIMEOUT seconds is past its deadline. MPI cannot cancel a blocked collective, so the way
 * out is to end the job: the watchdog logs the collective (sequence number, kind, bucket, size),
 * asks the peers where they are, names the ranks that never arrived, and calls MPI_Abort (which
 * mpirun and srun --mpi=pmix answer by killing every process of the job). Rank 0 acts at the
 * deadline; rank 1 WD_GRACE seconds later and the others 2 x WD_GRACE later, so that one report
 * names the culprit and only a frozen rank 0 (or 1) leaves the report to the next rank. Where an
 * NCCL communicator is open (the cuda backend), the report ends with NCCL RAS's view of the job
 * (nccl_ras.c), asked while the peers are; after a stuck GPU wait (watchdog_survey) the lowest
 * rank that answered asks it, so one rank does.
 *
 * GPU stream. NCCL collectives are queued on a stream and return at once, so the host lanes do
 * not say which one the GPU is in. A third lane does (watch_stream_*): comm_nccl.c records a CUDA
 * event after each collective it queues, into a ring of labelled slots, and the lane's state is
 * worked out when asked: the oldest collective whose event has not completed. It has no deadline
 * of its own: a host wait on GPU work that passes DDP_TIMEOUT (cuda_wait.c) calls
 * watchdog_survey, which gives the wavefront on this lane.
 *
 * Side channel. At ddp_init every rank opens a TCP listener on all its addresses and advertises one
 * IPv4 address (DDP_WATCHDOG_IF: an interface name or a CIDR subnet; else the first subnet in
 * OMPI_MCA_oob_tcp_if_include / OMPI_MCA_btl_tcp_if_include; else the first interface that is up
 * and not loopback or a container bridge; else 127.0.0.1). The addresses are exchanged over MPI and
 * rank r connects to rank r+1 mod N: a ring, two connections per process. The kernel closes the
 * sockets of a process that dies however it dies, so its ring neighbours see the connection end
 * within a tick, log "rank R (host H, pid P) is gone" and end the job; before MPI_Abort they send
 * ABORT along the ring, which every rank passes on and obeys, so the job ends even where MPI_Abort
 * does not reach every process. ddp_finalize (and ddp_abort) send BYE / ABORT first, so an orderly
 * exit is not taken for a death. "Where are you": a separate thread answers ASK on the listener
 * with this process's lanes; a rank past a deadline asks every peer at once. A peer that does not
 * answer within WD_ASK_S is frozen (SIGSTOP) or not scheduled; one whose lane is behind has not
 * reached the collective. A rank whose diagnosis reached no other rank at all (its own link is
 * down: a partition; or every other host is) ends within WD_ALONE_S instead of WD_END_S: MPI_Abort
 * needs that same network to reach the launcher, so waiting for it would only leave the cut-off
 * rank alive long after the others.
 *
 * When any rank cannot open its listener or reach its ring neighbour, the side channel is off for
 * the whole job (rank 0 says why and how to fix it) and deadlines alone remain. DDP_WATCHDOG=0
 * turns everything off (the same value must be given to every rank). The address exchange also
 * carries each rank's verdict on DDP_TIMEOUT (parsed here), so an invalid value anywhere fails ddp_init
 * everywhere.
 *
 * Desync (desync.c): ranks that called different collectives end the job through the same path
 * (watchdog_end_desync), rank 0 first, the others after its grace.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "desync.h"
#include "internal.h"

/* DDP_TIMEOUT: a whole-string decimal number of seconds in [DDP_TIMEOUT_MIN_S, DDP_TIMEOUT_MAX_S].
 * The bounds: a deadline under 0.1 s would end healthy jobs at their first collective (the
 * watchdog looks every quarter of it); one over a week is no deadline, which DDP_WATCHDOG=0 says. */
#define DDP_TIMEOUT_DEFAULT_S 300.0
#define DDP_TIMEOUT_MIN_S 0.1
#define DDP_TIMEOUT_MAX_S 604800.0

/* 1 with *out set when text is a valid DDP_TIMEOUT ("inf", "nan", "20s", "0" are not). */
static int timeout_parse(const char *text, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(x) || x < DDP_TIMEOUT_MIN_S ||
        x > DDP_TIMEOUT_MAX_S || !(isdigit((unsigned char)text[0]) || text[0] == '.'))
        return 0;
    *out = x;
    return 1;
}

double timeout_seconds(void)
{
    static double cached = -1;
    if (cached > 0)
        return cached;
    const char *v = getenv("DDP_TIMEOUT");
    double t = DDP_TIMEOUT_DEFAULT_S;
    if (v && *v && !timeout_parse(v, &t))
        t = DDP_TIMEOUT_DEFAULT_S; /* timeout_check reports it; start-up keeps a deadline */
    cached = t;
    return t;
}

ddp_status timeout_check(void)
{
    const char *v = getenv("DDP_TIMEOUT");
    double t;
    if (!v || !*v || timeout_parse(v, &t))
        return DDP_OK;
    DDP_ERROR("DDP_TIMEOUT='%s' is not a number of seconds from %g to %g (the deadline of every "
              "collective and wait; unset: %g): set it to a number such as 600, or unset it", v,
              DDP_TIMEOUT_MIN_S, DDP_TIMEOUT_MAX_S, DDP_TIMEOUT_DEFAULT_S);
    return DDP_ERR_ENV;
}


#define WD_MAGIC 0x44445057u   /* "DDPW" */
#define WD_VERSION 3u
#define WD_TICK_S 0.25         /* how often the thread looks at the lanes */
#define WD_GRACE_S 2.0         /* extra wait of rank 1, twice that for ranks >= 2 */
#define WD_ASK_S 1.5           /* how long a diagnosis waits for the peers' answers */
#define WD_CONNECT_S 10.0      /* ring set-up: connect and hello */
#define WD_END_S 15.0          /* ending the job: _exit if reporting and MPI_Abort take longer */
#define WD_ALONE_S 2.0         /* ... when no other rank could be reached (wd_alone) */
#define WD_ABORT_S 0.5         /* MPI_Abort called: the process ends by itself this much later */
#define WD_WHAT_LEN 24

enum { WD_HELLO = 1, WD_BYE, WD_ABORT, WD_ASK, WD_ANSWER };
enum { WD_WHY_DEADLINE, WD_WHY_DEATH, WD_WHY_ABORT, WD_WHY_DESYNC }; /* why a job is ended */

/* What ended the job, for a rank's message: "rank R (host H) <this>". */
static const char *wd_why_text(int why)
{
    return why == WD_WHY_ABORT    ? "called ddp_abort"
           : why == WD_WHY_DESYNC ? "found that the ranks called different collectives, a desync"
                                  : "saw a collective pass its deadline";
}

/* One message on the side channel, the same binary layout on every rank of a job. */
typedef struct wd_frame {
    uint32_t magic, type;
    uint64_t token;                         /* the job's: rank 0's random number */
    int32_t rank;                           /* sender */
    int32_t arg;                            /* ABORT: the rank where it started */
    int32_t why;                            /* ABORT: WD_WHY_* */
    uint64_t lane_state[DDP_WATCH_N_LANES]; /* ANSWER: seq << 1 | active */
    int32_t lane_bucket[DDP_WATCH_N_LANES];
    char lane_what[DDP_WATCH_N_LANES][WD_WHAT_LEN];
    int64_t step;                           /* ANSWER: ddp_watch_where's, -1 unknown */
    int32_t micro;
    char phase[WD_WHAT_LEN];
} wd_frame;

/* What every rank learns about every other at ddp_init. */
typedef struct wd_peer {
    uint32_t addr; /* IPv4, network order */
    uint16_t port; /* network order */
    int16_t ok;    /* the listener is open */
    int32_t pid;
    int32_t timeout_bad; /* DDP_TIMEOUT is invalid here (timeout_check): ddp_init fails everywhere */
    uint64_t token;
    char host[64];
} wd_peer;

/* One host lane; aligned so the two lanes' writers do not share a cache line. */
typedef struct wd_lane {
    _Alignas(64) _Atomic uint64_t state; /* seq << 1 | active */
    _Atomic(const char *) what;
    _Atomic int bucket;
    _Atomic size_t n_bytes;
} wd_lane;

static wd_lane wd_lanes[DDP_WATCH_GPU]; /* the host lanes */

/* The GPU stream's lane: one slot per collective queued, reused WATCH_STREAM_SLOTS later. The
 * slot's sequence number is a stamp: 0 while the label is rewritten, so a query that read the
 * slot while it changed sees another stamp afterwards and skips it (a seqlock). */
typedef struct wd_slot {
    _Atomic uint64_t seq;
    _Atomic(const char *) what;
    _Atomic int bucket;
    _Atomic size_t n_bytes;
} wd_slot;

static struct {
    wd_slot slot[WATCH_STREAM_SLOTS];
    _Atomic uint64_t last;            /* the newest collective queued; 0: none yet */
    int (*done)(void *arg, int slot); /* watch_stream_open's; NULL: the lane is closed */
    void *arg;
    pthread_mutex_t lock;             /* done and arg, against a query in progress */
} wd_stream = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A lane as the report reads it. */
typedef struct wd_view {
    uint64_t state; /* seq << 1 | active */
    const char *what;
    int bucket;
    size_t n_bytes;
} wd_view;

/* Where this rank stands (ddp_watch_where), for the wavefront of a deadline's report. */
static _Atomic int64_t wd_where_step = -1;
static _Atomic int wd_where_micro = -1;
static _Atomic(const char *) wd_where_phase;

void ddp_watch_where(long step, int micro, const char *phase)
{
    atomic_store_explicit(&wd_where_step, step, memory_order_relaxed);
    atomic_store_explicit(&wd_where_micro, micro, memory_order_relaxed);
    atomic_store_explicit(&wd_where_phase, phase, memory_order_relaxed);
}
static _Atomic int wd_enabled;        /* lanes are written */

/* The watchdog thread and the side channel; owned by watchdog_start/stop. */
static struct {
    pthread_mutex_t lock;
    pthread_t thread, answerer;
    int running, answering;
    int wake[2];        /* pipe: wakes the thread for a stop or new ring sockets */
    int stopping;
    double timeout, grace;
    int rank, world;
    int listener;
    int ring_fd[2];     /* [0] to rank - 1 (accepted), [1] to rank + 1 (connected); -1 none */
    int ring_peer[2];
    int ring_bye[2];    /* the peer said goodbye: its closing is no death */
    wd_peer *peers;     /* world entries once the side channel is up */
    uint64_t token;
} wd = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = {-1, -1}, .listener = -1,
        .ring_fd = {-1, -1}, .ring_peer = {-1, -1}};

/* ---- the lanes (hot path) ------------------------------------------------------------------ */

uint64_t watch_enter(int lane, const char *what, int bucket, size_t n_bytes)
{
    if (!atomic_load_explicit(&wd_enabled, memory_order_relaxed))
        return 0;
    wd_lane *l = &wd_lanes[lane];
    uint64_t seq = (atomic_load_explicit(&l->state, memory_order_relaxed) >> 1) + 1;
    atomic_store_explicit(&l->what, what, memory_order_relaxed);
    atomic_store_explicit(&l->bucket, bucket, memory_order_relaxed);
    atomic_store_explicit(&l->n_bytes, n_bytes, memory_order_relaxed);
    atomic_store_explicit(&l->state, seq << 1 | 1u, memory_order_release);
    return seq;
}

void watch_leave(int lane)
{
    if (!atomic_load_explicit(&wd_enabled, memory_order_relaxed))
        return;
    wd_lane *l = &wd_lanes[lane];
    uint64_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
    atomic_store_explicit(&l->state, s & ~(uint64_t)1, memory_order_release);
}

/* ---- the GPU stream's lane ----------------------------------------------------------------- */

int watch_stream_open(int (*done)(void *arg, int slot), void *arg)
{
    pthread_mutex_lock(&wd.lock);
    int running = wd.running; /* DDP_WATCHDOG=0: no report reads the lane */
    pthread_mutex_unlock(&wd.lock);
    if (!running)
        return 0;
    pthread_mutex_lock(&wd_stream.lock);
    for (int i = 0; i < WATCH_STREAM_SLOTS; i++) /* an earlier stream's: their markers are gone */
        atomic_store(&wd_stream.slot[i].seq, 0);
    wd_stream.done = done;
    wd_stream.arg = arg;
    pthread_mutex_unlock(&wd_stream.lock);
    return 1;
}

void watch_stream_close(void)
{
    pthread_mutex_lock(&wd_stream.lock);
    wd_stream.done = NULL;
    wd_stream.arg = NULL;
    pthread_mutex_unlock(&wd_stream.lock);
}

uint64_t watch_stream_begin(const char *what, int bucket, size_t n_bytes)
{
    uint64_t seq = atomic_load_explicit(&wd_stream.last, memory_order_relaxed) + 1;
    wd_slot *s = &wd_stream.slot[seq % WATCH_STREAM_SLOTS];
    atomic_store_explicit(&s->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* the stamp changes before the label */
    atomic_store_explicit(&s->what, what, memory_order_relaxed);
    atomic_store_explicit(&s->bucket, bucket, memory_order_relaxed);
    atomic_store_explicit(&s->n_bytes, n_bytes, memory_order_relaxed);
    return seq;
}

void watch_stream_queued(uint64_t seq)
{
    atomic_store_explicit(&wd_stream.slot[seq % WATCH_STREAM_SLOTS].seq, seq, memory_order_release);
    atomic_store_explicit(&wd_stream.last, seq, memory_order_release);
}

/* Reads collective seq's slot into v and asks whether its marker completed (*done); 0 when the
 * slot holds another collective, or was rewritten while it was read. Under wd_stream.lock. */
static int wd_slot_read(uint64_t seq, wd_view *v, int *done)
{
    const wd_slot *s = &wd_stream.slot[seq % WATCH_STREAM_SLOTS];
    if (atomic_load_explicit(&s->seq, memory_order_acquire) != seq)
        return 0;
    v->what = atomic_load_explicit(&s->what, memory_order_relaxed);
    v->bucket = atomic_load_explicit(&s->bucket, memory_order_relaxed);
    v->n_bytes = atomic_load_explicit(&s->n_bytes, memory_order_relaxed);
    *done = wd_stream.done(wd_stream.arg, (int)(seq % WATCH_STREAM_SLOTS));
    atomic_thread_fence(memory_order_acquire); /* the label was read before the stamp again */
    return atomic_load_explicit(&s->seq, memory_order_relaxed) == seq;
}

/* The GPU stream's lane now: the oldest collective held whose marker has not completed (active),
 * else the last one (finished); nothing (state 0) before the first or while the lane is closed.
 * The stream completes its collectives in order, so the first found not complete is the oldest,
 * unless none of the slots holds a complete one: then one before them may be the oldest. */
static wd_view wd_stream_view(void)
{
    wd_view v = {.state = 0, .bucket = -1};
    pthread_mutex_lock(&wd_stream.lock);
    uint64_t last = atomic_load_explicit(&wd_stream.last, memory_order_acquire);
    uint64_t first = last > WATCH_STREAM_SLOTS ? last - WATCH_STREAM_SLOTS + 1 : 1;
    int any_done = 0;
    for (uint64_t seq = first; wd_stream.done && seq <= last; seq++) {
        wd_view s = {.state = seq << 1};
        int done = 1;
        if (!wd_slot_read(seq, &s, &done))
            continue;
        v = s;
        if (done) {
            any_done = 1;
            continue;
        }
        v.state |= 1;
        if (!any_done && first > 1)
            v = (wd_view){.state = v.state, .what = "ring full: or earlier", .bucket = -1};
        break;
    }
    pthread_mutex_unlock(&wd_stream.lock);
    return v;
}

/* Lane `lane` as it stands: a host lane's atomics, or the GPU stream's worked out now. */
static wd_view wd_lane_view(int lane)
{
    if (lane == DDP_WATCH_GPU)
        return wd_stream_view();
    const wd_lane *l = &wd_lanes[lane];
    return (wd_view){.state = atomic_load(&l->state), .what = atomic_load(&l->what),
                     .bucket = atomic_load(&l->bucket), .n_bytes = atomic_load(&l->n_bytes)};
}

/* How the messages name a lane. */
static const char *wd_lane_name(int lane)
{
    return lane == DDP_WATCH_ASYNC ? "communication thread"
           : lane == DDP_WATCH_GPU ? "GPU stream"
                                   : "caller";
}

/* "all-reduce of bucket 3, 4096 bytes, GPU stream": a collective's label and its lane, in text. */
static void wd_label_text(const wd_view *v, int lane, char *text, size_t n)
{
    char bucket[32] = "";
    if (v->bucket >= 0)
        snprintf(bucket, sizeof bucket, " of bucket %d", v->bucket);
    snprintf(text, n, "%s%s, %zu bytes, %s", v->what ? v->what : "?", bucket, v->n_bytes,
             wd_lane_name(lane));
}

/* ---- small helpers --------------------------------------------------------------------------- */

static double wd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *wd_host(int rank)
{
    return wd.peers && rank >= 0 && rank < wd.world ? wd.peers[rank].host : "?";
}

static int wd_pid(int rank)
{
    return wd.peers && rank >= 0 && rank < wd.world ? wd.peers[rank].pid : 0;
}

static void wd_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static int wd_send_frame(int fd, const wd_frame *f)
{
    return send(fd, f, sizeof *f, MSG_NOSIGNAL) == (ssize_t)sizeof *f ? 0 : -1;
}

static wd_frame wd_frame_make(uint32_t type, int why, int arg)
{
    return (wd_frame){.magic = WD_MAGIC ^ WD_VERSION, .type = type, .token = wd.token,
                      .rank = wd.rank, .why = why, .arg = arg};
}

static int wd_frame_valid(const wd_frame *f)
{
    return f->magic == (WD_MAGIC ^ WD_VERSION) && f->token == wd.token;
}

/* Receives one frame within seconds; 0 on success. */
static int wd_recv_frame(int fd, wd_frame *f, double seconds)
{
    size_t got = 0;
    double end = wd_now() + seconds;
    while (got < sizeof *f) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = (int)((end - wd_now()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0)
            return -1;
        ssize_t n = recv(fd, (char *)f + got, sizeof *f - got, 0);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* ---- ending the job ---------------------------------------------------------------------------- */

/* Sends a frame to both ring neighbours (an ABORT once: the first reason is the one passed on). */
static void wd_tell_ring(uint32_t type, int why, int arg)
{
    static atomic_int aborted;
    wd_frame f = wd_frame_make(type, why, arg);
    if (type == WD_ABORT && atomic_exchange(&aborted, 1))
        return;
    for (int i = 0; i < 2; i++)
        if (wd.ring_fd[i] >= 0)
            wd_send_frame(wd.ring_fd[i], &f);
}

static _Atomic int64_t wd_backstop_at_ms; /* when the backstop ends the process (wd_now, ms); 0: not armed */

static void *wd_backstop_main(void *arg)
{
    (void)arg;
    for (int64_t left; (left = atomic_load(&wd_backstop_at_ms) - (int64_t)(wd_now() * 1000)) > 0;) {
        struct timespec ts = {.tv_nsec = (left < 100 ? left : 100) * 1000000}; /* it may move closer */
        nanosleep(&ts, NULL);
    }
    _exit(1);
}

/* Ending the job has begun: whatever blocks from here on (a message into a full stderr pipe that
 * nobody reads, an MPI_Abort whose launcher is stuck or out of reach) ends with _exit after
 * `seconds` (WD_END_S; wd_alone brings it closer). A later call only moves the end closer. */
static void wd_arm_backstop(double seconds)
{
    int64_t at = (int64_t)((wd_now() + seconds) * 1000), cur = 0;
    pthread_t t;
    if (atomic_compare_exchange_strong(&wd_backstop_at_ms, &cur, at)) {
        if (pthread_create(&t, NULL, wd_backstop_main, NULL) == 0)
            pthread_detach(t);
        return;
    }
    while (at < cur && !atomic_compare_exchange_weak(&wd_backstop_at_ms, &cur, at))
        ;
}

/* Ends the whole job: ABORT along the ring (why: WD_WHY_*, arg: the rank it concerns), then
 * MPI_Abort; _exit when MPI cannot abort, or when that takes past the backstop. */
static _Noreturn void wd_end_job(int why, int arg)
{
    int inited = 0, finalized = 0;
    wd_arm_backstop(WD_END_S);
    wd_tell_ring(WD_ABORT, why, arg);
    char cause[160];
    if (why == WD_WHY_DEATH)
        snprintf(cause, sizeof cause, "rank %d (host %s, pid %d) was lost", arg, wd_host(arg),
                 wd_pid(arg));
    else
        snprintf(cause, sizeof cause, "rank %d (host %s) %s", arg, wd_host(arg), wd_why_text(why));
    rescue_on_end(cause); /* before MPI_Abort, which has the launcher kill every process */
    fflush(stdout);
    fflush(stderr);
    /* a rank is gone and the ring told every other: MPI_Abort waits for the launcher's kill (2 s
     * under mpirun), which a restart (ddp-launch --max-restarts) would wait for. Not after a
     * deadline: a frozen rank needs the launcher, and mpirun 4.1 sometimes crashes on a process
     * that ends while its MPI_Abort message is in flight (seen 1 in 6 at 3 ranks, each aborting). */
    if (wd.peers && why == WD_WHY_DEATH)
        wd_arm_backstop(WD_ABORT_S);
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    const char *caller = atomic_load(&wd_lanes[DDP_WATCH_CALLER].what);
    int in_finalize = caller && strcmp(caller, "MPI_Finalize") == 0; /* MPI_Abort could hang there */
    if (inited && !finalized && !in_finalize)
        MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

void watchdog_announce_abort(void)
{
    pthread_mutex_lock(&wd.lock);
    wd_tell_ring(WD_ABORT, WD_WHY_ABORT, wd.rank);
    pthread_mutex_unlock(&wd.lock);
}

void watchdog_end_desync(int lane)
{
    if (wd.rank > 0) { /* rank 0 ends the job: this rank only if it has not within the grace */
        double grace = wd.grace > 0 ? wd.grace : WD_GRACE_S;
        struct timespec ts = {.tv_sec = (time_t)grace,
                              .tv_nsec = (long)((grace - (double)(time_t)grace) * 1e9)};
        watch_leave(lane); /* no deadline report while it waits */
        nanosleep(&ts, NULL);
        DDP_ERROR("the ranks called different collectives (desync), and rank 0 has not ended the "
                  "job within %.0f s; ending it", grace);
    }
    pthread_mutex_lock(&wd.lock); /* held until the process ends: finalize cannot free the peers */
    wd_end_job(WD_WHY_DESYNC, 0);
}

/* ---- the diagnosis ("where are you") ----------------------------------------------------------- */

/* This process's answer: its lanes and where it stands. */
static wd_frame wd_answer_frame(void)
{
    wd_frame ans = wd_frame_make(WD_ANSWER, 0, -1);
    for (int i = 0; i < DDP_WATCH_N_LANES; i++) {
        wd_view v = wd_lane_view(i);
        ans.lane_state[i] = v.state;
        ans.lane_bucket[i] = v.bucket;
        snprintf(ans.lane_what[i], WD_WHAT_LEN, "%s", v.what ? v.what : "none");
    }
    const char *phase = atomic_load(&wd_where_phase);
    ans.step = atomic_load(&wd_where_step);
    ans.micro = atomic_load(&wd_where_micro);
    snprintf(ans.phase, WD_WHAT_LEN, "%s", phase ? phase : "");
    return ans;
}

/* What one peer said. */
enum { WD_UNREACHABLE = -2, WD_GONE, WD_CONNECTING, WD_ASKED, WD_ANSWERED };
typedef struct wd_reply {
    int fd;
    int state; /* WD_UNREACHABLE (no route, host unreachable), WD_GONE (refused or reset),
                  WD_CONNECTING, WD_ASKED, WD_ANSWERED */
    wd_frame f;
    size_t got;
} wd_reply;

/* Starts a non-blocking connection to rank r; returns the socket, or -1 with errno set. */
static int wd_connect_start(int r)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = wd.peers[r].port,
                             .sin_addr.s_addr = wd.peers[r].addr};
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* The state of a connection attempt that failed with err: no route is not a refusal. */
static int wd_failed_state(int err)
{
    return err == ENETUNREACH || err == EHOSTUNREACH || err == ENETDOWN || err == EHOSTDOWN ||
                   err == ETIMEDOUT ? WD_UNREACHABLE : WD_GONE;
}

/* A connection became writable (connected: send ASK) or readable (read the answer). */
static void wd_reply_event(wd_reply *rep, short revents)
{
    if (rep->state == WD_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        wd_frame ask = wd_frame_make(WD_ASK, 0, -1);
        int ok = getsockopt(rep->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 &&
                 !(revents & (POLLERR | POLLHUP)) && wd_send_frame(rep->fd, &ask) == 0;
        rep->state = ok ? WD_ASKED : wd_failed_state(err);
        return;
    }
    ssize_t got = recv(rep->fd, (char *)&rep->f + rep->got, sizeof rep->f - rep->got, 0);
    if (got <= 0)
        rep->state = WD_GONE;
    else if ((rep->got += (size_t)got) == sizeof rep->f)
        rep->state = wd_frame_valid(&rep->f) && rep->f.type == WD_ANSWER ? WD_ANSWERED : WD_GONE;
}

/* One poll round over the connections still open; returns how many are. */
static int wd_ask_round(wd_reply *rep, struct pollfd *p, int n, int ms)
{
    int open = 0;
    for (int r = 0; r < n; r++) {
        int live = rep[r].state == WD_CONNECTING || rep[r].state == WD_ASKED;
        p[r] = (struct pollfd){.fd = live ? rep[r].fd : -1,
                               .events = rep[r].state == WD_CONNECTING ? POLLOUT : POLLIN};
        open += live;
    }
    if (open && poll(p, (nfds_t)n, ms) > 0)
        for (int r = 0; r < n; r++)
            if (p[r].fd >= 0 && p[r].revents)
                wd_reply_event(&rep[r], p[r].revents);
    open = 0;
    for (int r = 0; r < n; r++)
        open += rep[r].state == WD_CONNECTING || rep[r].state == WD_ASKED;
    return open;
}

/* Asks every peer for its lanes, all at once, waiting at most WD_ASK_S. */
static void wd_ask_all(wd_reply *rep, struct pollfd *p)
{
    double end = wd_now() + WD_ASK_S;
    for (int r = 0; r < wd.world; r++) {
        rep[r] = (wd_reply){.fd = r == wd.rank ? -1 : wd_connect_start(r), .state = WD_GONE};
        if (rep[r].fd >= 0)
            rep[r].state = WD_CONNECTING;
        else if (r != wd.rank)
            rep[r].state = wd_failed_state(errno);
    }
    for (int ms; (ms = (int)((end - wd_now()) * 1000)) > 0 && wd_ask_round(rep, p, wd.world, ms) > 0;)
        ;
    for (int r = 0; r < wd.world; r++)
        wd_close(&rep[r].fd);
}

/* The wavefront: every rank (this one too) by where it stands, one line per place, the ranks
 * that hold the collective up first: frozen, gone, unreachable, behind (oldest first), on
 * another sequence, and last the ranks waiting inside it. A few lines whatever the world size. */
enum { WD_K_FROZEN, WD_K_GONE, WD_K_UNREACHABLE, WD_K_BEHIND, WD_K_DIFFERS, WD_K_ARRIVED };

static int wd_kind(const wd_reply *rep, int lane, uint64_t seq)
{
    if (rep->state == WD_ASKED)
        return WD_K_FROZEN;
    if (rep->state == WD_GONE)
        return WD_K_GONE;
    if (rep->state != WD_ANSWERED)
        return WD_K_UNREACHABLE;
    uint64_t s = rep->f.lane_state[lane];
    if ((s >> 1) == seq && (s & 1))
        return WD_K_ARRIVED;
    return (s >> 1) < seq ? WD_K_BEHIND : WD_K_DIFFERS;
}

/* Whether two ranks stand at the same place (one line of the report). */
static int wd_same_place(const wd_reply *a, const wd_reply *b, int lane, uint64_t seq)
{
    int k = wd_kind(a, lane, seq);
    if (k != wd_kind(b, lane, seq))
        return 0;
    const wd_frame *x = &a->f, *y = &b->f;
    return k < WD_K_BEHIND ||
           (x->lane_state[lane] == y->lane_state[lane] && x->lane_bucket[lane] == y->lane_bucket[lane] &&
            strncmp(x->lane_what[lane], y->lane_what[lane], WD_WHAT_LEN) == 0 && x->step == y->step &&
            x->micro == y->micro && strncmp(x->phase, y->phase, WD_WHAT_LEN) == 0);
}

/* Appends to buf (size bytes, *len used so far), cut at its end. */
static void wd_cat(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (*len < size) {
        int k = vsnprintf(buf + *len, size - *len, fmt, ap);
        *len = k < 0 ? size : (*len + (size_t)k < size ? *len + (size_t)k : size - 1);
    }
    va_end(ap);
}

/* The ranks r with group[r] == g: "0-3,5" in list (160 bytes, at most 8 runs), their hosts "a, b"
 * in hosts (200 bytes, at most 3, then ", ..."); returns their count, *one the last of them. */
static int wd_ranks_lists(const int *group, int g, char *list, char *hosts, int *one)
{
    size_t ll = 0, hl = 0;
    int count = 0, runs = 0, n_hosts = 0, more_hosts = 0;
    list[0] = hosts[0] = '\0';
    const char *seen[3] = {0};
    for (int r = 0; r < wd.world; r++) {
        if (group[r] != g)
            continue;
        count++;
        *one = r;
        int h = 0;
        while (h < n_hosts && strcmp(seen[h], wd_host(r)) != 0)
            h++;
        if (h == n_hosts && n_hosts == 3)
            more_hosts = 1;
        else if (h == n_hosts) {
            seen[n_hosts++] = wd_host(r);
            wd_cat(hosts, sizeof hosts, &hl, "%s%s", h ? ", " : "", wd_host(r));
        }
        int prev = r > 0 && group[r - 1] == g, next = r + 1 < wd.world && group[r + 1] == g;
        if (!prev && ++runs <= 8)
            wd_cat(list, 160, &ll, "%s%d", runs > 1 ? "," : "", r);
        else if (!prev && runs == 9)
            wd_cat(list, 160, &ll, ",...");
        else if (prev && !next && runs <= 8)
            wd_cat(list, 160, &ll, "-%d", r);
    }
    if (more_hosts)
        wd_cat(hosts, 200, &hl, ", ...");
    return count;
}

/* "ranks 0-3,5 (hosts a, b)" for the ranks r with group[r] == g, in text (n bytes); one rank
 * with its pid. */
static void wd_ranks_text(const int *group, int g, char *text, size_t n)
{
    char list[160], hosts[200];
    int one = -1, count = wd_ranks_lists(group, g, list, hosts, &one);
    if (count == 1)
        snprintf(text, n, "rank %d (host %s, pid %d)", one, hosts, wd_pid(one));
    else
        snprintf(text, n, "ranks %s (host%s %s)", list, strchr(hosts, ',') ? "s" : "", hosts);
}

/* s (at most n bytes) for a JSON string: a quote, a backslash or a control byte becomes '?'. */
static void wd_json_str(char *dst, size_t size, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && s[i] && k + 1 < size; i++)
        dst[k++] = s[i] == '"' || s[i] == '\\' || (unsigned char)s[i] < 0x20 ? '?' : s[i];
    dst[k] = '\0';
}

/* The wavefront's groups (order[0..n_groups), their leaders) as one JSON line for log readers:
 * {"collective":SEQ,"lane":L,"groups":[{"ranks":"5","count":1,"hosts":"a","state":"frozen",
 * "step":7,"micro":-1,"phase":"forward","at":SEQ,"active":1,"what":"barrier","bucket":-1},...]}. */
static void wd_log_json(const int *group, const int *order, int n_groups, const wd_reply *rep,
                        int lane, uint64_t seq)
{
    static const char *const states[] = {"frozen", "gone", "unreachable", "behind", "differs",
                                         "waiting"};
    char json[4096], list[160], hosts[200], phase[WD_WHAT_LEN + 1], what[WD_WHAT_LEN + 1];
    size_t len = 0;
    wd_cat(json, sizeof json, &len, "{\"collective\":%llu,\"lane\":%d,\"groups\":[",
           (unsigned long long)seq, lane);
    for (int i = 0; i < n_groups && len + 600 < sizeof json; i++) {
        const wd_reply *r = &rep[order[i]];
        int one, count = wd_ranks_lists(group, group[order[i]], list, hosts, &one);
        wd_json_str(phase, sizeof phase, r->f.phase, WD_WHAT_LEN);
        wd_json_str(what, sizeof what, r->f.lane_what[lane], WD_WHAT_LEN);
        int k = wd_kind(r, lane, seq), answered = k >= WD_K_BEHIND;
        wd_cat(json, sizeof json, &len, "%s{\"ranks\":\"%s\",\"count\":%d,\"hosts\":\"%s\","
               "\"state\":\"%s\"", i ? "," : "", list, count, hosts, states[k]);
        if (answered)
            wd_cat(json, sizeof json, &len, ",\"step\":%lld,\"micro\":%d,\"phase\":\"%s\","
                   "\"at\":%llu,\"active\":%d,\"what\":\"%s\",\"bucket\":%d",
                   (long long)r->f.step, r->f.micro, phase,
                   (unsigned long long)(r->f.lane_state[lane] >> 1),
                   (int)(r->f.lane_state[lane] & 1), what, r->f.lane_bucket[lane]);
        wd_cat(json, sizeof json, &len, "}");
    }
    wd_cat(json, sizeof json, &len, "]}");
    DDP_ERROR("wavefront (JSON): %s", json);
}

/* ": at step S, PHASE, micro-step M" of an answer ("" where the program does not say). */
static void wd_where_text(const wd_frame *f, char *text, size_t n)
{
    int len = 0;
    text[0] = '\0';
    if (f->step >= 0)
        len = snprintf(text, n, " at step %lld", (long long)f->step);
    if (f->phase[0] && (size_t)len < n)
        len += snprintf(text + len, n - (size_t)len, "%s%.*s", len ? ", " : " in ", WD_WHAT_LEN, f->phase);
    if (f->micro >= 0 && (size_t)len < n)
        snprintf(text + len, n - (size_t)len, ", micro-step %d", f->micro);
}

/* Logs one line of the wavefront: the ranks of group g and where they stand. */
static void wd_log_place(const int *group, int g, const wd_reply *rep, int lane, uint64_t seq)
{
    char ranks[400], where[128], coll[96];
    wd_ranks_text(group, g, ranks, sizeof ranks);
    const wd_frame *f = &rep->f;
    uint64_t s = f->lane_state[lane];
    int k = wd_kind(rep, lane, seq);
    wd_where_text(f, where, sizeof where);
    char bucket[32] = "";
    if (f->lane_bucket[lane] >= 0)
        snprintf(bucket, sizeof bucket, " of bucket %d", f->lane_bucket[lane]);
    snprintf(coll, sizeof coll, "#%llu (%.*s%s)", (unsigned long long)(s >> 1), WD_WHAT_LEN,
             f->lane_what[lane], bucket);
    if (k == WD_K_FROZEN)
        DDP_ERROR("  %s: did not answer within %.1f s: frozen (SIGSTOP, a debugger) or not getting "
                  "CPU time", ranks, WD_ASK_S);
    else if (k == WD_K_GONE)
        DDP_ERROR("  %s: refused the connection: its process is gone", ranks);
    else if (k == WD_K_UNREACHABLE)
        DDP_ERROR("  %s: no connection within %.1f s: its host is down or unreachable", ranks, WD_ASK_S);
    else if (k == WD_K_BEHIND)
        DDP_ERROR("  %s%s: behind, has not reached #%llu: its last on this lane is %s, %s", ranks,
                  where, (unsigned long long)seq, coll, (s & 1) ? "still in it" : "finished");
    else if (k == WD_K_DIFFERS)
        DDP_ERROR("  %s%s: at %s, %s: the ranks' sequences of collectives differ", ranks, where, coll,
                  (s & 1) ? "in it" : "finished");
    else
        DDP_ERROR("  %s%s: waiting in %s", ranks, where, coll);
}

static const wd_reply *wd_sort_rep; /* qsort's context: the watchdog thread only */
static int wd_sort_lane;
static uint64_t wd_sort_seq;

static int wd_place_order(const void *a, const void *b)
{
    const wd_reply *x = &wd_sort_rep[*(const int *)a], *y = &wd_sort_rep[*(const int *)b];
    int kx = wd_kind(x, wd_sort_lane, wd_sort_seq), ky = wd_kind(y, wd_sort_lane, wd_sort_seq);
    uint64_t sx = x->f.lane_state[wd_sort_lane] >> 1, sy = y->f.lane_state[wd_sort_lane] >> 1;
    if (kx != ky)
        return kx - ky;
    return (sx > sy) - (sx < sy);
}

/* Logs the wavefront of collective seq on lane from the peers' replies (rep: wd_ask_all's, this
 * rank's entry filled here); returns how many peers could be reached (their host answered:
 * connected, or refused), -1 when out of memory. */
static int wd_wavefront(wd_reply *rep, int lane, uint64_t seq)
{
    int *group = malloc((size_t)wd.world * sizeof *group), *lead = malloc((size_t)wd.world * sizeof *lead);
    int arrived = 0, reached = 0, n_groups = 0;
    if (!group || !lead) {
        free(group);
        free(lead);
        return -1;
    }
    rep[wd.rank] = (wd_reply){.fd = -1, .state = WD_ANSWERED, .f = wd_answer_frame()};
    for (int r = 0; r < wd.world; r++) {
        int g = 0;
        while (g < n_groups && !wd_same_place(&rep[lead[g]], &rep[r], lane, seq))
            g++;
        if (g == n_groups)
            lead[n_groups++] = r;
        group[r] = g;
        arrived += wd_kind(&rep[r], lane, seq) == WD_K_ARRIVED;
        reached += r != wd.rank && (rep[r].state == WD_GONE || rep[r].state >= WD_ASKED);
    }
    int *order = malloc((size_t)n_groups * sizeof *order);
    DDP_ERROR("where the ranks are (the ones that hold collective #%llu up first):",
              (unsigned long long)seq);
    for (int g = 0; order && g < n_groups; g++)
        order[g] = lead[g];
    wd_sort_rep = rep;
    wd_sort_lane = lane;
    wd_sort_seq = seq;
    if (order)
        qsort(order, (size_t)n_groups, sizeof *order, wd_place_order);
    for (int i = 0; i < n_groups; i++) {
        int r = order ? order[i] : lead[i];
        wd_log_place(group, group[r], &rep[r], lane, seq);
    }
    if (arrived == wd.world)
        DDP_ERROR("every rank is inside collective #%llu: the transport under %s is stuck "
                  "(network?)", (unsigned long long)seq, lane == DDP_WATCH_GPU ? "NCCL" : "MPI");
    else
        DDP_ERROR("%d of %d ranks never arrived at collective #%llu (named above)", wd.world - arrived,
                  wd.world, (unsigned long long)seq);
    wd_log_json(group, order ? order : lead, n_groups, rep, lane, seq);
    free(order);
    free(group);
    free(lead);
    return reached;
}

/* Asks the peers where they are and logs the wavefront (wd_wavefront); returns its count. */
static int wd_diagnose(int lane, uint64_t seq)
{
    wd_reply *rep = calloc((size_t)wd.world, sizeof *rep);
    struct pollfd *p = calloc((size_t)wd.world, sizeof *p);
    int reached = -1;
    if (rep && p) {
        wd_ask_all(rep, p);
        reached = wd_wavefront(rep, lane, seq);
    }
    free(rep);
    free(p);
    return reached;
}

/* 1 when no lower rank answered the watchdog (rep: every rank's reply; NULL without them: rank 0
 * alone): this rank then asks NCCL's RAS for the job's view, so that one rank does. */
static int wd_speaks_for_job(const wd_reply *rep)
{
    for (int r = 0; rep && r < wd.rank; r++)
        if (rep[r].state == WD_ANSWERED)
            return 0;
    return rep || wd.rank <= 0;
}

/* Without the GPU stream's lane: logs each peer that is gone, unreachable or frozen (rep), or that
 * every one answered. group: room for world entries. */
static void wd_survey_silent(const wd_reply *rep, int *group)
{
    int silent = 0;
    for (int r = 0; r < wd.world; r++) /* one group per kind of silence, -1: answered */
        silent += (group[r] = r == wd.rank || rep[r].state == WD_ANSWERED
                                  ? -1 : wd_kind(&rep[r], DDP_WATCH_CALLER, 0)) >= 0;
    if (silent)
        DDP_ERROR("the ranks that did not answer the watchdog:");
    for (int k = WD_K_FROZEN; k <= WD_K_UNREACHABLE; k++)
        for (int r = 0; r < wd.world; r++)
            if (group[r] == k) { /* the group's first rank speaks for it */
                wd_log_place(group, k, &rep[r], DDP_WATCH_CALLER, 0);
                break;
            }
    if (!silent)
        DDP_ERROR("every other rank answered the watchdog (none is gone or frozen): the GPU work "
                  "itself is stuck, or a peer waits elsewhere");
}

/* A host wait on GPU work passed the deadline (cuda_wait.c). When the GPU stream's lane has a
 * collective not complete, the wavefront on that lane names who holds it up, as a host lane's
 * deadline does; without it (DDP_WATCH_GPU_LANE=0, or no collective stuck) the peers can still say
 * whether they live. Skipped while another thread holds the watchdog (it is diagnosing already). */
void watchdog_survey(void)
{
    if (!atomic_load(&wd_enabled) || pthread_mutex_trylock(&wd.lock) != 0)
        return;
    wd_view gpu = wd_stream_view();
    if (gpu.state & 1) { /* said even where no peer can be asked (the side channel off) */
        char label[128];
        wd_label_text(&gpu, DDP_WATCH_GPU, label, sizeof label);
        DDP_ERROR("the oldest collective not complete on this rank's GPU stream: #%llu (%s)",
                  (unsigned long long)(gpu.state >> 1), label);
    }
    wd_reply *rep = wd.peers && wd.world > 1 ? calloc((size_t)wd.world, sizeof *rep) : NULL;
    struct pollfd *p = rep ? calloc((size_t)wd.world, sizeof *p) : NULL;
    int *group = p ? malloc((size_t)wd.world * sizeof *group) : NULL;
    if (group) {
        wd_ask_all(rep, p);
        if (gpu.state & 1)
            wd_wavefront(rep, DDP_WATCH_GPU, gpu.state >> 1);
        else
            wd_survey_silent(rep, group);
    }
    if (wd_speaks_for_job(group ? rep : NULL))
        ras_report(); /* NCCL's view of the job (nccl_ras.c) */
    free(group);
    free(rep);
    free(p);
    pthread_mutex_unlock(&wd.lock);
}

/* ", this host's interface NAME is down" (or has no carrier) for the interface of this rank's
 * side-channel address, else "". */
static void wd_own_link(char *text, size_t size)
{
    struct ifaddrs *ifs = NULL;
    text[0] = '\0';
    if (getifaddrs(&ifs) != 0)
        return;
    for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
            ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr != wd.peers[wd.rank].addr)
            continue;
        if (!(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING))
            snprintf(text, size, ", and this host's interface %s %s", i->ifa_name,
                     !(i->ifa_flags & IFF_UP) ? "is down" : "has no carrier (link down)");
        break;
    }
    freeifaddrs(ifs);
}

/* No other rank could be reached: this host is cut off from the network (or every other host is
 * down). MPI_Abort goes over the same network to the launcher (mpirun, or srun through slurmd)
 * and would block until the backstop, leaving this rank alive WD_END_S after the others: it gets
 * WD_ALONE_S instead, then the process exits by itself. */
static void wd_alone(void)
{
    char link[128];
    wd_own_link(link, sizeof link);
    DDP_ERROR("no other rank could be reached%s: this host is cut off from the others (or they are "
              "all down), so MPI_Abort may not reach the launcher either; this process ends within "
              "%.0f s", link, WD_ALONE_S);
    wd_arm_backstop(WD_ALONE_S);
}

/* A lane passed its deadline: report, diagnose, end the job. */
static _Noreturn void wd_fire(int lane, uint64_t state, double waited)
{
    pthread_mutex_lock(&wd.lock); /* held until the process ends: finalize cannot free the peers */
    wd_arm_backstop(WD_END_S);
    char label[128];
    wd_view v = wd_lane_view(lane);
    wd_label_text(&v, lane, label, sizeof label);
    DDP_ERROR("collective #%llu (%s) has waited %.0f s, past its deadline (DDP_TIMEOUT=%g s); "
              "ending the job", (unsigned long long)(state >> 1), label, waited, wd.timeout);
    ras_ask_start(); /* NCCL's view (nccl_ras.c), asked while the peers are */
    int reached = wd.peers ? wd_diagnose(lane, state >> 1) : -1;
    ras_ask_log();
    if (reached == 0)
        wd_alone();
    wd_end_job(WD_WHY_DEADLINE, wd.rank);
}

/* ---- the watchdog thread ----------------------------------------------------------------------- */

/* Checks the lanes; fires when one is stuck past the deadline (and this rank's grace). */
static void wd_check_lanes(uint64_t *seen, double *since)
{
    double now = wd_now();
    for (int i = 0; i < DDP_WATCH_GPU; i++) { /* host lanes; the GPU stream: cuda_wait.c */
        uint64_t s = atomic_load_explicit(&wd_lanes[i].state, memory_order_acquire);
        if (!(s & 1) || s != seen[i]) {
            seen[i] = s;
            since[i] = now;
            continue;
        }
        if (now - since[i] > wd.timeout + wd.grace)
            wd_fire(i, s, now - since[i]);
    }
}

/* A ring socket is readable: a frame, or the end of the connection. */
static void wd_ring_event(int i)
{
    wd_frame f;
    int peer = wd.ring_peer[i];
    ssize_t n = recv(wd.ring_fd[i], &f, sizeof f, MSG_WAITALL);
    if (n == (ssize_t)sizeof f && wd_frame_valid(&f) && f.type == WD_BYE) {
        wd.ring_bye[i] = 1;
        return;
    }
    if (n == (ssize_t)sizeof f && wd_frame_valid(&f) && f.type == WD_ABORT && f.why == WD_WHY_DESYNC) {
        /* every rank saw the desync and ends the job itself (watchdog_end_desync) after rank 0's
         * MPI_Abort had its grace; more aborts at once only trouble mpirun (seen: its crash), and
         * the ring's closings that follow are no deaths */
        wd_tell_ring(WD_ABORT, f.why, f.arg);
        wd.ring_bye[0] = wd.ring_bye[1] = 1;
        return;
    }
    if (n == (ssize_t)sizeof f && wd_frame_valid(&f) && f.type == WD_ABORT) {
        wd_arm_backstop(WD_END_S);
        wd_tell_ring(WD_ABORT, f.why, f.arg); /* before the message, which may block */
        if (f.why == WD_WHY_DEATH)
            DDP_ERROR("ending the job: rank %d (host %s, pid %d) is gone", f.arg, wd_host(f.arg), wd_pid(f.arg));
        else
            DDP_ERROR("ending the job: rank %d (host %s) %s (see its message)", f.arg, wd_host(f.arg),
                      wd_why_text(f.why));
        wd_end_job(f.why, f.arg);
    }
    if (wd.ring_bye[i]) {
        wd_close(&wd.ring_fd[i]);
        return;
    }
    wd_arm_backstop(WD_END_S);
    wd_tell_ring(WD_ABORT, WD_WHY_DEATH, peer); /* before the message, which may block */
    DDP_ERROR("rank %d (host %s, pid %d) is gone: its side-channel connection closed without a goodbye "
              "(killed, crashed, or exited without ddp_finalize); ending the job", peer, wd_host(peer),
              wd_pid(peer));
    wd_end_job(WD_WHY_DEATH, peer);
}

static void *wd_thread(void *arg)
{
    uint64_t seen[DDP_WATCH_GPU] = {0};
    double since[DDP_WATCH_GPU] = {0};
    int tick_ms = (int)(1000 * (wd.timeout / 4 < WD_TICK_S ? wd.timeout / 4 : WD_TICK_S)) + 1;
    (void)arg;
    pthread_setname_np(pthread_self(), "ddp-watchdog"); /* visible in top -H, gdb, /proc */
    for (;;) {
        struct pollfd p[3] = {{.fd = wd.wake[0], .events = POLLIN}};
        pthread_mutex_lock(&wd.lock);
        if (wd.stopping) {
            pthread_mutex_unlock(&wd.lock);
            return NULL;
        }
        for (int i = 0; i < 2; i++)
            p[1 + i] = (struct pollfd){.fd = wd.ring_bye[i] ? -1 : wd.ring_fd[i], .events = POLLIN};
        pthread_mutex_unlock(&wd.lock);
        if (poll(p, 3, tick_ms) > 0) {
            char drain[16];
            if (p[0].revents)
                (void)!read(wd.wake[0], drain, sizeof drain);
            pthread_mutex_lock(&wd.lock);
            for (int i = 0; i < 2; i++)
                if (p[1 + i].revents && wd.ring_fd[i] == p[1 + i].fd && !wd.stopping)
                    wd_ring_event(i);
            pthread_mutex_unlock(&wd.lock);
        }
        wd_check_lanes(seen, since);
    }
}

static void wd_wake(void)
{
    if (wd.wake[1] >= 0)
        (void)!write(wd.wake[1], "w", 1);
}

/* ---- the answering thread -------------------------------------------------------------------- */

static void wd_answer(int fd)
{
    wd_frame ask;
    if (wd_recv_frame(fd, &ask, 0.5) != 0 || !wd_frame_valid(&ask) || ask.type != WD_ASK)
        return;
    wd_frame ans = wd_answer_frame();
    wd_send_frame(fd, &ans);
}

static void *wd_answerer(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "ddp-wd-answer");
    for (;;) {
        int fd = accept4(wd.listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0 && (errno == EINTR || errno == ECONNABORTED))
            continue;
        if (fd < 0)
            return NULL; /* shut down by watchdog_stop */
        wd_answer(fd);
        close(fd);
    }
}

/* ---- the side channel: set-up at ddp_init ---------------------------------------------------- */

/* Whether the IPv4 interface (name, addr in network order) matches spec: a name or a CIDR. */
static int wd_if_matches(const char *spec, size_t len, const char *name, uint32_t addr)
{
    char text[64], *slash;
    struct in_addr net;
    if (len == 0 || len >= sizeof text)
        return 0;
    memcpy(text, spec, len);
    text[len] = '\0';
    if (strcmp(text, name) == 0)
        return 1;
    slash = strchr(text, '/');
    if (!slash)
        return 0;
    *slash = '\0';
    long bits = strtol(slash + 1, NULL, 10);
    if (inet_pton(AF_INET, text, &net) != 1 || bits < 0 || bits > 32)
        return 0;
    uint32_t mask = bits == 0 ? 0 : htonl(~(uint32_t)0 << (32 - bits));
    return (addr & mask) == (net.s_addr & mask);
}

/* The first up IPv4 interface matching one item of the comma-separated spec, or 0. */
static uint32_t wd_addr_for(const struct ifaddrs *ifs, const char *spec)
{
    for (const char *item = spec; item && *item; item += strcspn(item, ",") + (item[strcspn(item, ",")] == ',')) {
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
                continue;
            uint32_t a = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr;
            if (wd_if_matches(item, strcspn(item, ","), i->ifa_name, a))
                return a;
        }
    }
    return 0;
}

/* The first up IPv4 interface that is not loopback or a container/VM bridge, or 0. */
static uint32_t wd_addr_default(const struct ifaddrs *ifs)
{
    static const char *skip[] = {"docker", "virbr", "br-", "veth", "lxc"};
    for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        int skipped = 0;
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++)
            skipped |= strncmp(i->ifa_name, skip[k], strlen(skip[k])) == 0;
        if (!skipped)
            return ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr;
    }
    return 0;
}

/* The address this rank advertises (see the top of the file). */
static uint32_t wd_pick_addr(void)
{
    const char *specs[] = {getenv("DDP_WATCHDOG_IF"), getenv("OMPI_MCA_oob_tcp_if_include"),
                           getenv("OMPI_MCA_btl_tcp_if_include")};
    struct ifaddrs *ifs = NULL;
    uint32_t a = 0;
    if (getifaddrs(&ifs) != 0)
        return htonl(INADDR_LOOPBACK);
    for (size_t k = 0; k < 3 && !a; k++)
        a = wd_addr_for(ifs, specs[k]);
    if (!a)
        a = wd_addr_default(ifs);
    freeifaddrs(ifs);
    return a ? a : htonl(INADDR_LOOPBACK);
}

/* Opens the listener on every address; fills the port (network order). -1 on failure. */
static int wd_listen(uint16_t *port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = sa.sin_port;
    return fd;
}

/* Connects to rank r and says hello; the socket, or -1 (with the reason in err). */
static int wd_connect_ring(int r, double seconds, char *err, size_t err_len)
{
    int fd = wd_connect_start(r), soerr = 0;
    socklen_t len = sizeof soerr;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    wd_frame hello = wd_frame_make(WD_HELLO, 0, -1);
    if (fd < 0 || poll(&p, 1, (int)(seconds * 1000)) <= 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0 ||
        fcntl(fd, F_SETFL, 0) != 0 || wd_send_frame(fd, &hello) != 0) {
        snprintf(err, err_len, "%s", soerr ? strerror(soerr) : fd < 0 ? strerror(errno) : "timed out");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Accepts rank prev's hello within seconds (other connections are dropped); the socket or -1. */
static int wd_accept_ring(int prev, double seconds)
{
    double end = wd_now() + seconds;
    for (;;) {
        struct pollfd p = {.fd = wd.listener, .events = POLLIN};
        wd_frame f;
        int ms = (int)((end - wd_now()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0)
            return -1;
        int fd = accept4(wd.listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        if (wd_recv_frame(fd, &f, end - wd_now()) == 0 && wd_frame_valid(&f) && f.type == WD_HELLO &&
            f.rank == prev)
            return fd;
        close(fd);
    }
}

/* Builds this rank's two ring connections; 0 on success, else -1 with a message in err. */
static int wd_build_ring(char *err, size_t err_len)
{
    int next = (wd.rank + 1) % wd.world, prev = (wd.rank + wd.world - 1) % wd.world;
    char why[128] = "";
    struct in_addr a = {.s_addr = wd.peers[next].addr};
    wd.ring_fd[1] = wd_connect_ring(next, WD_CONNECT_S, why, sizeof why);
    if (wd.ring_fd[1] < 0) {
        snprintf(err, err_len, "cannot connect to rank %d (host %s) at %s:%u: %s", next, wd_host(next),
                 inet_ntoa(a), ntohs(wd.peers[next].port), why);
        return -1;
    }
    wd.ring_fd[0] = wd_accept_ring(prev, WD_CONNECT_S);
    if (wd.ring_fd[0] < 0) {
        snprintf(err, err_len, "rank %d (host %s) did not connect within %.0f s", prev, wd_host(prev), WD_CONNECT_S);
        return -1;
    }
    wd.ring_peer[0] = prev;
    wd.ring_peer[1] = next;
    return 0;
}

/* Rank 0's random job token, so that strangers' connections are told apart. */
static uint64_t wd_make_token(void)
{
    uint64_t t = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&t, sizeof t, 1, f) != 1)
        t = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (f)
        fclose(f);
    return t;
}

/* Every rank's address, port, pid and host (collective, under a deadline). */
static ddp_status wd_exchange(const char *hostname)
{
    wd_peer me = {.pid = getpid(), .token = wd.rank == 0 ? wd_make_token() : 0,
                  .timeout_bad = timeout_check() != DDP_OK};
    snprintf(me.host, sizeof me.host, "%s", hostname);
    if (wd.running && (wd.listener = wd_listen(&me.port)) >= 0) {
        me.addr = wd_pick_addr();
        me.ok = 1;
    }
    wd.peers = calloc((size_t)wd.world, sizeof *wd.peers);
    if (!wd.peers) {
        DDP_ERROR("out of memory for the side channel's table of %d ranks", wd.world);
        return DDP_ERR_NOMEM; /* the peers' deadline ends the job */
    }
    watch_enter(DDP_WATCH_CALLER, "side-channel set-up", -1, sizeof me);
    int rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, wd.peers, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD);
    watch_leave(DDP_WATCH_CALLER);
    if (rc != MPI_SUCCESS) {
        DDP_ERROR("exchanging side-channel addresses failed (MPI error %d)", rc);
        return DDP_ERR_MPI;
    }
    wd.token = wd.peers[0].token;
    return DDP_OK;
}

/* The first rank whose listener is not open, or -1; *n_open counts the open ones. */
static int wd_first_closed(int *n_open)
{
    int first = -1;
    *n_open = 0;
    for (int r = 0; r < wd.world; r++) {
        *n_open += wd.peers[r].ok;
        if (!wd.peers[r].ok && first < 0)
            first = r;
    }
    return first;
}

/* All ranks agree whether the ring stands; returns 1 when it does everywhere. quiet: the reason
 * is known and logged already. */
static int wd_agree_ring(int failed, int quiet)
{
    int in[2] = {failed, wd.rank}, out[2] = {0, 0};
    watch_enter(DDP_WATCH_CALLER, "side-channel agreement", -1, sizeof in);
    int rc = MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD);
    watch_leave(DDP_WATCH_CALLER);
    if (rc == MPI_SUCCESS && out[0] == 0)
        return 1;
    if (!quiet)
            DDP_WARN0("the side channel that detects dead ranks at once is off (rank %d could not set it up); "
                  "collectives keep their deadline (DDP_TIMEOUT). Fix: DDP_WATCHDOG_IF=<interface or subnet> "
                  "on which the nodes reach each other", out[1]);
    return 0;
}

/* DDP_ERR_ENV on every rank when DDP_TIMEOUT is invalid on any (each such rank has said why). */
static ddp_status wd_agree_timeout(void)
{
    int bad = -1, n_bad = 0;
    for (int r = 0; r < wd.world; r++)
        if (wd.peers[r].timeout_bad && n_bad++ == 0)
            bad = r;
    if (n_bad == 0)
        return DDP_OK;
    if (!wd.peers[wd.rank].timeout_bad)
        DDP_ERROR("%d rank(s) have an invalid DDP_TIMEOUT, first rank %d (host %s): see its message; "
                  "not starting", n_bad, bad, wd_host(bad));
    return DDP_ERR_ENV;
}

ddp_status watchdog_connect(int rank, int world, const char *hostname)
{
    char err[256] = "";
    pthread_mutex_lock(&wd.lock);
    wd.rank = rank;
    wd.world = world;
    wd.grace = rank == 0 ? 0 : rank == 1 ? WD_GRACE_S : 2 * WD_GRACE_S;
    pthread_mutex_unlock(&wd.lock);
    if (world < 2)
        return timeout_check();
    ddp_status st = wd_exchange(hostname);
    if (st == DDP_OK && (st = wd_agree_timeout()) != DDP_OK)
        watchdog_disconnect();
    if (st != DDP_OK)
        return st;
    int n_open = 0, closed = wd_first_closed(&n_open), failed = closed >= 0;
    if (closed >= 0 && rank == 0 && n_open > 0)
        DDP_WARN("the side channel that detects dead ranks at once is off: rank %d (host %s) has no listener "
                 "(DDP_WATCHDOG=0 there, or no socket); collectives keep their deadline", closed, wd_host(closed));
    if (!failed && (failed = wd_build_ring(err, sizeof err) != 0))
        DDP_WARN("side channel: %s", err);
    if (wd_agree_ring(failed, closed >= 0) && pthread_create(&wd.answerer, NULL, wd_answerer, NULL) == 0) {
        wd.answering = 1;
        wd_wake(); /* the thread now polls the ring */
        return DDP_OK;
    }
    watchdog_disconnect();
    return DDP_OK;
}

/* ---- start and stop ------------------------------------------------------------------------- */

ddp_status watchdog_start(void)
{
    const char *env = getenv("DDP_WATCHDOG");
    if (env && strcmp(env, "0") == 0) { /* the lanes still count for the desync check's messages */
        const char *desync = getenv("DDP_DESYNC_CHECK");
        atomic_store(&wd_enabled, !(desync && strcmp(desync, "0") == 0));
        return DDP_OK;
    }
    pthread_mutex_lock(&wd.lock);
    if (wd.running) {
        pthread_mutex_unlock(&wd.lock);
        return DDP_OK;
    }
    wd.timeout = timeout_seconds();
    wd.grace = 0;
    wd.rank = -1;
    wd.stopping = 0;
    int ok = pipe2(wd.wake, O_CLOEXEC | O_NONBLOCK) == 0;
    atomic_store(&wd_enabled, ok);
    if (ok && pthread_create(&wd.thread, NULL, wd_thread, NULL) != 0)
        ok = 0;
    wd.running = ok;
    pthread_mutex_unlock(&wd.lock);
    if (!ok)
        DDP_WARN("cannot start the watchdog thread: collectives have no deadline");
    return DDP_OK;
}

/* Sends BYE on the ring, stops the answerer and closes the side channel. */
static void wd_side_close(void)
{
    wd_tell_ring(WD_BYE, 0, -1);
    if (wd.answering) {
        shutdown(wd.listener, SHUT_RDWR);
        pthread_join(wd.answerer, NULL);
        wd.answering = 0;
    }
    for (int i = 0; i < 2; i++) {
        wd_close(&wd.ring_fd[i]);
        wd.ring_bye[i] = 0;
        wd.ring_peer[i] = -1;
    }
    wd_close(&wd.listener);
    free(wd.peers);
    wd.peers = NULL;
}

void watchdog_disconnect(void)
{
    pthread_mutex_lock(&wd.lock);
    wd_side_close();
    pthread_mutex_unlock(&wd.lock);
    wd_wake();
}

void watchdog_stop(void)
{
    watchdog_disconnect();
    pthread_mutex_lock(&wd.lock);
    int running = wd.running;
    wd.stopping = 1;
    pthread_mutex_unlock(&wd.lock);
    if (!running)
        return;
    wd_wake();
    pthread_join(wd.thread, NULL);
    wd_close(&wd.wake[0]);
    wd_close(&wd.wake[1]);
    wd.running = 0;
    atomic_store(&wd_enabled, 0);
}
