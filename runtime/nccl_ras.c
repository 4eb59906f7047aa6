/* nccl_ras.c - NCCL's own view of a hung job in the watchdog's report: a client of the RAS
 * service that NCCL 2.24 and later run in every process (NCCL_RAS_ENABLE, on by default), asked
 * for its STATUS text when a deadline passes on a rank whose communicator is NCCL's.
 *
 * Protocol (NCCL's src/ras/client.cc and client_support.cc, alike from 2.24 to 2.30, and the user
 * guide's RAS page): text lines ending in '\n' on a TCP connection to NCCL_RAS_ADDR (HOST:PORT or
 * [IPv6]:PORT; default localhost:28028). The client says "CLIENT PROTOCOL 2", the server answers
 * "SERVER PROTOCOL <n>" (another n is no reason to stop: ncclras goes on too); "TIMEOUT <s>" (how
 * long RAS waits for the other processes' data) is answered "OK"; "STATUS" is answered with the
 * text report, after which the server closes the connection. The whole exchange has one deadline,
 * so a stopped or absent service costs the report at most RAS_ASK_S.
 * Not compiled out of CPU builds: the tests run the exchange against a fake service.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define RAS_PROTOCOL 2          /* NCCL_RAS_CLIENT_PROTOCOL of NCCL 2.24 to 2.30 */
#define RAS_DEFAULT_ADDR "localhost:28028"
#define RAS_CONNECT_S 1.0       /* a listener on this host answers a connect at once */
#define RAS_ASK_S 3.0           /* the whole exchange, in the watchdog's report */
#define RAS_MAX_LINES 60        /* of the answer, in the log */
#define RAS_LINE_CHARS 200

static double ras_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* poll for events on fd until the deadline: > 0 ready, 0 the deadline passed, < 0 an error. */
static int ras_wait(int fd, short events, double deadline)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        double left = deadline - ras_now();
        if (left <= 0)
            return 0;
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n >= 0 || errno != EINTR)
            return n;
    }
}

/* The outcome of a non-blocking connect on fd by the deadline: 0, or an errno value. */
static int ras_connect_wait(int fd, double deadline)
{
    int n = ras_wait(fd, POLLOUT, deadline), err = 0;
    socklen_t len = sizeof err;
    if (n <= 0)
        return n == 0 ? ETIMEDOUT : errno;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : errno;
}

/* A socket connected to one of host:port's addresses, each tried in turn, all within
 * RAS_CONNECT_S (and the deadline); -1 with why said. */
static int ras_connect(const char *host, const char *port, double deadline, char *why, size_t n)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res), fd = -1;
    if (rc != 0) {
        snprintf(why, n, "%s:%s does not resolve: %s", host, port, gai_strerror(rc));
        return -1;
    }
    double by = ras_now() + RAS_CONNECT_S;
    by = by < deadline ? by : deadline;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        int err = fd < 0 ? errno : connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS)
            err = ras_connect_wait(fd, by);
        if (err == 0)
            break;
        if (err == ETIMEDOUT)
            snprintf(why, n, "no answer to connecting within %.0f s", RAS_CONNECT_S);
        else
            snprintf(why, n, "connecting: %s", strerror(err));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Sends line whole by the deadline; 0, or -1 with why said. */
static int ras_send(int fd, const char *line, double deadline, char *why, size_t n)
{
    size_t len = strlen(line), done = 0;
    while (done < len) {
        ssize_t k = send(fd, line + done, len - done, MSG_NOSIGNAL);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && ras_wait(fd, POLLOUT, deadline) > 0)
            continue;
        snprintf(why, n, "sending %.*s: %s", (int)strcspn(line, "\n"), line,
                 k < 0 && errno != EAGAIN ? strerror(errno) : "no room within the deadline");
        return -1;
    }
    return 0;
}

/* Reads into buf (NUL-terminated, at most size - 1 bytes) until the connection ends, or with
 * line set until a newline ends what came; stops at the deadline. Returns the bytes read; *stop
 * says why it stopped short: 0 (ended as asked), ETIMEDOUT, ENOBUFS (buf full), or an errno. */
static size_t ras_read(int fd, char *buf, size_t size, int line, double deadline, int *stop)
{
    size_t got = 0;
    *stop = 0;
    while (!(line && got > 0 && buf[got - 1] == '\n')) {
        if (got + 1 >= size) {
            *stop = ENOBUFS;
            break;
        }
        int w = ras_wait(fd, POLLIN, deadline);
        ssize_t k = w > 0 ? recv(fd, buf + got, size - 1 - got, 0) : -1;
        if (k == 0)
            break;
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (w > 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        *stop = w == 0 ? ETIMEDOUT : errno;
        break;
    }
    buf[got] = '\0';
    return got;
}

/* Says cmd (a line) and reads the one-line answer, which must begin with want (any case); 0, or
 * -1 with why said. */
static int ras_say(int fd, const char *cmd, const char *want, double deadline, char *why,
                   size_t n)
{
    char answer[128];
    int stop = 0, cmd_len = (int)strcspn(cmd, "\n");
    if (ras_send(fd, cmd, deadline, why, n) != 0)
        return -1;
    size_t got = ras_read(fd, answer, sizeof answer, 1, deadline, &stop);
    if (got > 0 && stop == 0 && answer[got - 1] == '\n' &&
        strncasecmp(answer, want, strlen(want)) == 0)
        return 0;
    if (got == 0 || (stop != 0 && stop != ENOBUFS))
        snprintf(why, n, "%.*s: %s", cmd_len, cmd,
                 stop == ETIMEDOUT ? "no answer by the deadline"
                 : stop ? strerror(stop) : "the connection closed without an answer");
    else
        snprintf(why, n, "%.*s: unexpected answer '%.*s' (not %s...)", cmd_len, cmd,
                 (int)strcspn(answer, "\r\n"), answer, want);
    return -1;
}

long ras_query(const char *host, const char *port, double timeout_s, char *buf, size_t n,
               char *why, size_t why_n)
{
    double deadline = ras_now() + timeout_s;
    int wait_s = (int)(timeout_s / 2) > 1 ? (int)(timeout_s / 2) : 1, stop = 0;
    char line[64];
    buf[0] = why[0] = '\0';
    int fd = ras_connect(host, port, deadline, why, why_n);
    if (fd < 0)
        return -1;
    long got = -1;
    snprintf(line, sizeof line, "CLIENT PROTOCOL %d\n", RAS_PROTOCOL);
    if (ras_say(fd, line, "SERVER PROTOCOL ", deadline, why, why_n) == 0) {
        snprintf(line, sizeof line, "TIMEOUT %d\n", wait_s);
        if (ras_say(fd, line, "OK", deadline, why, why_n) == 0 &&
            ras_send(fd, "STATUS\n", deadline, why, why_n) == 0)
            got = (long)ras_read(fd, buf, n, 0, deadline, &stop);
    }
    close(fd);
    if (got == 0 && stop != 0 && stop != ENOBUFS) {
        snprintf(why, why_n, "STATUS: %s", stop == ETIMEDOUT ? "no answer by the deadline"
                                                             : strerror(stop));
        return -1;
    }
    if (got > 0 && stop != 0)
        snprintf(why, why_n, "cut short: %s", stop == ETIMEDOUT ? "the rest did not come by the deadline"
                                             : stop == ENOBUFS  ? "longer than the buffer"
                                                                : strerror(stop));
    else if (got == 0)
        snprintf(why, why_n, "an empty answer");
    return got;
}

/* ---- in the watchdog's report --------------------------------------------------------------- */

static _Atomic int ras_version; /* NCCL's version code while an NCCL communicator is open, else 0 */

void ras_use_nccl(int nccl_version)
{
    atomic_store(&ras_version, nccl_version);
}

/* NCCL_RAS_ADDR as NCCL reads it: HOST:PORT or [IPv6]:PORT, default localhost:28028; 0, or -1
 * when it is neither. */
static int ras_addr(char *host, size_t host_n, char *port, size_t port_n)
{
    const char *env = getenv("NCCL_RAS_ADDR"), *a = env && *env ? env : RAS_DEFAULT_ADDR;
    const char *colon = strrchr(a, ':'), *h = a;
    if (!colon || !colon[1] || strlen(colon + 1) >= port_n)
        return -1;
    size_t len = (size_t)(colon - a);
    if (a[0] == '[') {
        if (len < 3 || a[len - 1] != ']')
            return -1;
        h++;
        len -= 2;
    }
    if (len == 0 || len >= host_n)
        return -1;
    memcpy(host, h, len);
    host[len] = '\0';
    snprintf(port, port_n, "%s", colon + 1);
    return 0;
}

/* One query at a time (the watchdog asks under its lock), on a thread of its own between
 * ras_ask_start and ras_ask_log so that it overlaps the peers' diagnosis. */
enum { RAS_IDLE, RAS_SAY, RAS_THREAD, RAS_INLINE };
static struct {
    int state; /* RAS_IDLE, RAS_SAY (why not, no query), RAS_THREAD (running there),
                  RAS_INLINE (to run in ras_ask_log) */
    pthread_t thread;
    char host[256], port[16], why[200];
    long got;
    char text[16384];
} ras;

static void *ras_ask_main(void *arg)
{
    (void)arg;
    ras.got = ras_query(ras.host, ras.port, RAS_ASK_S, ras.text, sizeof ras.text, ras.why,
                        sizeof ras.why);
    return NULL;
}

/* What the report says about RAS: RAS_IDLE (nothing), RAS_SAY (only why not, in ras.why) or
 * RAS_INLINE (ask it). */
static int ras_plan(void)
{
    const char *off = getenv("DDP_NCCL_RAS"), *enable = getenv("NCCL_RAS_ENABLE");
    int v = atomic_load(&ras_version);
    if (v <= 0 || (off && strcmp(off, "0") == 0))
        return RAS_IDLE;
    if (v < 22400)
        snprintf(ras.why, sizeof ras.why, "NCCL %d.%d.%d has no RAS service (NCCL 2.24 and later "
                 "have one)", v / 10000, v / 100 % 100, v % 100);
    else if (enable && strcmp(enable, "0") == 0)
        snprintf(ras.why, sizeof ras.why, "off in this job (NCCL_RAS_ENABLE=0), so no view from "
                 "NCCL");
    else if (ras_addr(ras.host, sizeof ras.host, ras.port, sizeof ras.port) != 0)
        snprintf(ras.why, sizeof ras.why, "NCCL_RAS_ADDR='%.100s' is not HOST:PORT or [IPv6]:PORT, "
                 "so NCCL's service cannot be asked", getenv("NCCL_RAS_ADDR"));
    else
        return RAS_INLINE;
    return RAS_SAY;
}

void ras_ask_start(void)
{
    ras.state = ras_plan();
    if (ras.state == RAS_INLINE && pthread_create(&ras.thread, NULL, ras_ask_main, NULL) == 0)
        ras.state = RAS_THREAD;
}

/* Logs text's non-empty lines, at most RAS_MAX_LINES, each cut at RAS_LINE_CHARS. */
static void ras_log_lines(const char *text)
{
    int shown = 0, left = 0;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n"), end = len;
        while (end > 0 && (p[end - 1] == '\r' || p[end - 1] == ' '))
            end--;
        if (end > 0 && shown < RAS_MAX_LINES) {
            DDP_ERROR("NCCL RAS | %.*s", (int)(end < RAS_LINE_CHARS ? end : RAS_LINE_CHARS), p);
            shown++;
        } else if (end > 0) {
            left++;
        }
        p += len + (p[len] == '\n');
    }
    if (left > 0)
        DDP_ERROR("NCCL RAS | ... %d more line%s left out (all: ncclras -h %s -p %s)", left,
                  left == 1 ? "" : "s", ras.host, ras.port);
}

void ras_ask_log(void)
{
    if (ras.state == RAS_IDLE)
        return;
    if (ras.state == RAS_SAY) {
        DDP_ERROR("NCCL RAS: %s", ras.why);
        ras.state = RAS_IDLE;
        return;
    }
    if (ras.state == RAS_THREAD)
        pthread_join(ras.thread, NULL);
    else
        ras_ask_main(NULL);
    ras.state = RAS_IDLE;
    int v = atomic_load(&ras_version);
    if (ras.got < 0) {
        DDP_ERROR("NCCL RAS (%s:%s) could not be asked: %s (is NCCL's RAS listening elsewhere? "
                  "NCCL_RAS_ADDR says where; DDP_NCCL_RAS=0 leaves this out)", ras.host, ras.port,
                  ras.why);
        return;
    }
    DDP_ERROR("NCCL RAS's view of the job (NCCL %d.%d.%d, %s:%s)%s%s:", v / 10000, v / 100 % 100,
              v % 100, ras.host, ras.port, ras.why[0] ? "; " : "", ras.why);
    ras_log_lines(ras.text);
}

void ras_report(void)
{
    ras_ask_start();
    ras_ask_log();
}
