/* test_nccl_ras.c - the NCCL RAS client of the watchdog's report (runtime/nccl_ras.c) against a
 * fake RAS service on a thread of this process, which speaks NCCL's side of the exchange as
 * src/ras/client_support.cc does (2.24 to 2.30) or misbehaves on purpose: the handshake, TIMEOUT
 * and STATUS in order and the whole answer; another protocol number accepted; answers that are not
 * RAS's, silence, an answer stopped half-way, a small buffer, a refused connection, a bad port;
 * and the report as logged: the header with NCCL's version and the address, at most 60 lines,
 * what was left out, the one-line refusals (NCCL before 2.24, NCCL_RAS_ENABLE=0, a bad
 * NCCL_RAS_ADDR, nobody listening), nothing under DDP_NCCL_RAS=0 or without an NCCL communicator.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "internal.h"

typedef struct fake {
    int listener;
    char port[16];
    const char *hello;   /* answer to CLIENT PROTOCOL (with its newline); NULL: say nothing */
    const char *timeout; /* answer to TIMEOUT */
    const char *status;  /* sent after STATUS, in two pieces */
    int stall;           /* then keep the connection open until the client closes it */
    char seen[256];      /* the commands received, '|' after each */
    int contacted;
    pthread_t thread;
} fake;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A line from fd (without its newline) within 5 s; 0, or -1 at the end or the time limit. */
static int read_line(int fd, char *line, size_t n)
{
    size_t got = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (got + 1 < n && poll(&p, 1, 5000) > 0) {
        char c;
        if (recv(fd, &c, 1, 0) != 1)
            return -1;
        if (c == '\n') {
            line[got] = '\0';
            return 0;
        }
        line[got++] = c;
    }
    return -1;
}

static void say(int fd, const char *text)
{
    if (text)
        (void)!send(fd, text, strlen(text), MSG_NOSIGNAL);
}

/* Until the client closes the connection (at most 5 s). */
static void linger(int fd)
{
    char c;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, 5000) > 0 && recv(fd, &c, 1, 0) == 1)
        ;
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    struct pollfd p = {.fd = f->listener, .events = POLLIN};
    int fd = poll(&p, 1, 5000) > 0 ? accept(f->listener, NULL, NULL) : -1;
    char line[128];
    f->contacted = fd >= 0;
    while (fd >= 0 && read_line(fd, line, sizeof line) == 0) {
        strncat(f->seen, line, sizeof f->seen - strlen(f->seen) - 2);
        strcat(f->seen, "|");
        if (strncmp(line, "CLIENT PROTOCOL ", 16) == 0 && !f->hello)
            break;
        if (strncmp(line, "CLIENT PROTOCOL ", 16) == 0)
            say(fd, f->hello);
        else if (strncmp(line, "TIMEOUT ", 8) == 0)
            say(fd, f->timeout);
        else if (strcmp(line, "STATUS") == 0) {
            size_t half = strlen(f->status) / 2;
            (void)!send(fd, f->status, half, MSG_NOSIGNAL);
            usleep(20000);
            say(fd, f->status + half);
            if (!f->stall) {
                close(fd);
                return NULL;
            }
            break;
        }
    }
    if (fd >= 0) {
        linger(fd);
        close(fd);
    }
    return NULL;
}

/* Listens on 127.0.0.1 (a port of the kernel's choice) and serves one connection on a thread. */
static void fake_start(fake *f)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    f->listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (f->listener < 0 || bind(f->listener, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(f->listener, 4) != 0 || getsockname(f->listener, (struct sockaddr *)&a, &len) != 0) {
        perror("fake RAS service");
        exit(1);
    }
    snprintf(f->port, sizeof f->port, "%d", ntohs(a.sin_port));
    pthread_create(&f->thread, NULL, fake_main, f);
}

static void fake_stop(fake *f)
{
    pthread_join(f->thread, NULL);
    close(f->listener);
}

/* The canned STATUS answer: "line 1" .. "line n", blank lines between tens (RAS prints some). */
static void canned(char *text, size_t size, int n)
{
    size_t at = 0;
    for (int i = 1; i <= n && at < size; i++)
        at += (size_t)snprintf(text + at, size - at, "line %d\n%s", i, i % 10 ? "" : "\n");
}

static void test_exchange(void)
{
    static char status[4096], buf[8192];
    char why[200];
    canned(status, sizeof status, 100);
    fake f = {.hello = "SERVER PROTOCOL 2\n", .timeout = "OK\n", .status = status};
    fake_start(&f);
    long got = ras_query("127.0.0.1", f.port, 3.0, buf, sizeof buf, why, sizeof why);
    fake_stop(&f);
    CHECK(got == (long)strlen(status) && strcmp(buf, status) == 0, "the whole answer: %ld of %zu",
          got, strlen(status));
    CHECK(why[0] == '\0', "came whole, yet: %s", why);
    CHECK(strcmp(f.seen, "CLIENT PROTOCOL 2|TIMEOUT 1|STATUS|") == 0, "commands: %s", f.seen);

    fake g = {.hello = "server protocol 3\n", .timeout = "ok\n", .status = "Job summary\n"};
    fake_start(&g);
    got = ras_query("127.0.0.1", g.port, 5.0, buf, sizeof buf, why, sizeof why);
    fake_stop(&g);
    CHECK(got == 12 && strcmp(buf, "Job summary\n") == 0, "protocol 3, any case: %ld '%s' (%s)",
          got, buf, why);
    CHECK(strstr(g.seen, "TIMEOUT 2|") != NULL, "TIMEOUT is half the time: %s", g.seen);
}

/* A socket bound to a port of 127.0.0.1 that never listens (connecting to it is refused): its
 * number in port, the socket returned (to close). */
static int refused_port(char port[16])
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("a port that refuses");
        exit(1);
    }
    snprintf(port, 16, "%d", ntohs(a.sin_port));
    return fd;
}

static void test_refusals(void)
{
    char buf[256], why[200];
    fake f = {.hello = "HTTP/1.1 400 Bad Request\n", .status = ""};
    fake_start(&f);
    long got = ras_query("127.0.0.1", f.port, 3.0, buf, sizeof buf, why, sizeof why);
    fake_stop(&f);
    CHECK(got == -1 && strstr(why, "CLIENT PROTOCOL 2: unexpected answer 'HTTP/1.1 400"),
          "not RAS: %ld (%s)", got, why);

    fake g = {.hello = "SERVER PROTOCOL 2\n", .timeout = "ERROR: Invalid timeout value\n",
              .status = ""};
    fake_start(&g);
    got = ras_query("127.0.0.1", g.port, 3.0, buf, sizeof buf, why, sizeof why);
    fake_stop(&g);
    CHECK(got == -1 && strstr(why, "TIMEOUT 1: unexpected answer 'ERROR"), "TIMEOUT refused: "
          "%ld (%s)", got, why);

    fake s = {.hello = NULL};
    fake_start(&s);
    double t0 = now_s();
    got = ras_query("127.0.0.1", s.port, 0.5, buf, sizeof buf, why, sizeof why);
    double took = now_s() - t0;
    fake_stop(&s);
    CHECK(got == -1 && strstr(why, "no answer by the deadline"), "silence: %ld (%s)", got, why);
    CHECK(took >= 0.45 && took < 2.5, "silence ends at the deadline (0.5 s): %.2f s", took);

    char port[16];
    int fd = refused_port(port);
    got = ras_query("127.0.0.1", port, 3.0, buf, sizeof buf, why, sizeof why);
    CHECK(got == -1 && strstr(why, "connecting: Connection refused"), "refused: %ld (%s)", got,
          why);
    close(fd);
    got = ras_query("127.0.0.1", "ras", 3.0, buf, sizeof buf, why, sizeof why);
    CHECK(got == -1 && strstr(why, "127.0.0.1:ras does not resolve"), "bad port: %s", why);
}

static void test_cut_short(void)
{
    static char status[4096], buf[8192];
    char small[64], why[200];
    canned(status, sizeof status, 100);
    fake f = {.hello = "SERVER PROTOCOL 2\n", .timeout = "OK\n", .status = status, .stall = 1};
    fake_start(&f);
    double t0 = now_s();
    long got = ras_query("127.0.0.1", f.port, 1.0, buf, sizeof buf, why, sizeof why);
    double took = now_s() - t0;
    fake_stop(&f);
    CHECK(got == (long)strlen(status) && strcmp(buf, status) == 0 &&
          strstr(why, "cut short: the rest did not come by the deadline"), "stalled: %ld (%s)",
          got, why);
    CHECK(took >= 0.9 && took < 3.0, "a stalled answer ends at the deadline (1 s): %.2f s", took);

    canned(status, sizeof status, 100);
    fake g = {.hello = "SERVER PROTOCOL 2\n", .timeout = "OK\n", .status = status};
    fake_start(&g);
    got = ras_query("127.0.0.1", g.port, 3.0, small, sizeof small, why, sizeof why);
    fake_stop(&g);
    CHECK(got == 63 && strncmp(small, status, 63) == 0 && strstr(why, "longer than the buffer"),
          "a small buffer: %ld (%s)", got, why);
}

/* ras_report's log, with NCCL_RAS_ADDR pointing at f when given. */
static void report(fake *f, char *text, size_t size)
{
    char addr[64];
    if (f) {
        snprintf(addr, sizeof addr, "127.0.0.1:%s", f->port);
        setenv("NCCL_RAS_ADDR", addr, 1);
    }
    capture c;
    capture_begin(&c);
    ras_report();
    capture_end(&c, text, size);
    if (f)
        fake_stop(f);
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

static void test_report(void)
{
    static char status[4096], text[32768];
    canned(status, sizeof status, 100);
    ras_use_nccl(22809);
    fake f = {.hello = "SERVER PROTOCOL 2\n", .timeout = "OK\n", .status = status};
    fake_start(&f);
    report(&f, text, sizeof text);
    char head[128];
    snprintf(head, sizeof head, "NCCL RAS's view of the job (NCCL 2.28.9, 127.0.0.1:%s):", f.port);
    CHECK(strstr(text, head) != NULL, "the header: %.300s", text);
    CHECK(count(text, "NCCL RAS | line ") == 60 && strstr(text, "NCCL RAS | line 60\n") &&
          !strstr(text, "line 61\n"), "60 lines: %d", count(text, "NCCL RAS | line "));
    CHECK(strstr(text, "NCCL RAS | ... 40 more lines left out (all: ncclras -h 127.0.0.1 -p "),
          "what was left out: %s", text + (strlen(text) > 300 ? strlen(text) - 300 : 0));
    CHECK(!strstr(text, "NCCL RAS | \n"), "no blank lines");

    setenv("DDP_NCCL_RAS", "0", 1);
    fake off = {.hello = "SERVER PROTOCOL 2\n", .timeout = "OK\n", .status = status};
    fake_start(&off);
    snprintf(head, sizeof head, "127.0.0.1:%s", off.port);
    setenv("NCCL_RAS_ADDR", head, 1);
    capture c;
    capture_begin(&c);
    ras_report();
    capture_end(&c, text, sizeof text);
    shutdown(off.listener, SHUT_RDWR); /* its thread waits in poll: wake it */
    fake_stop(&off);
    CHECK(text[0] == '\0' && !off.contacted, "DDP_NCCL_RAS=0: nothing (%s)", text);
    unsetenv("DDP_NCCL_RAS");

    char port[16], want[256];
    int fd = refused_port(port);
    snprintf(head, sizeof head, "127.0.0.1:%s", port);
    setenv("NCCL_RAS_ADDR", head, 1);
    report(NULL, text, sizeof text);
    close(fd);
    snprintf(want, sizeof want, "NCCL RAS (%s) could not be asked: connecting: Connection refused",
             head);
    CHECK(count(text, "\n") == 1 && strstr(text, want), "unreachable: one line: %s", text);
    setenv("NCCL_RAS_ADDR", "localhost", 1);
    report(NULL, text, sizeof text);
    CHECK(count(text, "\n") == 1 && strstr(text, "NCCL_RAS_ADDR='localhost' is not HOST:PORT"),
          "a bad address: %s", text);
    setenv("NCCL_RAS_ENABLE", "0", 1);
    report(NULL, text, sizeof text);
    CHECK(count(text, "\n") == 1 && strstr(text, "NCCL RAS: off in this job (NCCL_RAS_ENABLE=0)"),
          "RAS off: %s", text);
    unsetenv("NCCL_RAS_ENABLE");
    ras_use_nccl(22304);
    report(NULL, text, sizeof text);
    CHECK(count(text, "\n") == 1 && strstr(text, "NCCL 2.23.4 has no RAS service"),
          "NCCL 2.23: %s", text);
    ras_use_nccl(0);
    report(NULL, text, sizeof text);
    CHECK(text[0] == '\0', "no NCCL communicator: nothing (%s)", text);
    unsetenv("NCCL_RAS_ADDR");
}

int main(void)
{
    unsetenv("DDP_NCCL_RAS");
    unsetenv("NCCL_RAS_ENABLE");
    test_exchange();
    test_refusals();
    test_cut_short();
    test_report();
    return CHECK_DONE();
}
