/* log.c - rank-prefixed logging to stderr: "[rank R host] message". The level comes from
 * DDP_LOG_LEVEL (error|warn|info|debug, default info) and is checked by the DDP_* macros before
 * their arguments are evaluated. Each line is written with one call so that lines of concurrent
 * threads and processes do not interleave within a line. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static ddp_log_level log_level = DDP_LOG_INFO;
static int log_rank = -1;
static char log_host[64];

static void log_init_once(void)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    const char *env = getenv("DDP_LOG_LEVEL");
    if (gethostname(log_host, sizeof log_host - 1) != 0)
        snprintf(log_host, sizeof log_host, "?");
    if (!env || !*env)
        return;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(env, names[i]) == 0) {
            log_level = (ddp_log_level)i;
            return;
        }
    }
    fprintf(stderr, "[rank - %s] warning: DDP_LOG_LEVEL=%s is not one of error, warn, info, "
                    "debug; using info\n", log_host, env);
}

ddp_log_level ddp_log_get_level(void)
{
    pthread_once(&log_once, log_init_once);
    return log_level;
}

void ddp_log_set_level(ddp_log_level level)
{
    pthread_once(&log_once, log_init_once);
    if (level >= DDP_LOG_ERROR && level <= DDP_LOG_DEBUG)
        log_level = level;
}

void log_set_identity(int rank, const char *hostname)
{
    pthread_once(&log_once, log_init_once);
    log_rank = rank;
    if (hostname && *hostname)
        snprintf(log_host, sizeof log_host, "%s", hostname);
}

static const char *log_basename(const char *file)
{
    const char *slash = strrchr(file, '/');
    return slash ? slash + 1 : file;
}

/* Writes the "[rank R host] tag file:line: " prefix into buf; returns its length. */
static int log_prefix(char *buf, size_t size, ddp_log_level level, const char *file, int line)
{
    static const char *tags[] = {"error: ", "warning: ", "", "debug: "};
    char rank[16] = "-";
    if (log_rank >= 0)
        snprintf(rank, sizeof rank, "%d", log_rank);
    int show_where = file && (level == DDP_LOG_ERROR || log_level == DDP_LOG_DEBUG);
    if (show_where)
        return snprintf(buf, size, "[rank %s %s] %s%s:%d: ", rank, log_host, tags[level],
                        log_basename(file), line);
    return snprintf(buf, size, "[rank %s %s] %s", rank, log_host, tags[level]);
}

void ddp_log_write(ddp_log_level level, int only_rank0, const char *file, int line,
                   const char *fmt, ...)
{
    char buf[2048];
    if (level > ddp_log_get_level() || level < DDP_LOG_ERROR)
        return;
    if (only_rank0 && log_rank > 0)
        return;
    int len = log_prefix(buf, sizeof buf, level, file, line);
    if (len < 0 || (size_t)len >= sizeof buf - 2)
        len = 0;
    size_t room = sizeof buf - (size_t)len - 1; /* one byte kept for the newline */
    va_list ap;
    va_start(ap, fmt);
    int body = vsnprintf(buf + len, room, fmt, ap);
    va_end(ap);
    if (body > 0)
        len += (size_t)body < room ? body : (int)room - 1; /* truncated lines keep their start */
    buf[len++] = '\n';
    fwrite(buf, 1, (size_t)len, stderr);
}
