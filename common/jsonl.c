/* jsonl.c - a JSON-lines file that a kill leaves whole (jsonl.h). */
#include "jsonl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddp.h"
#include "mkdir_p.h"

struct jsonl_file {
    int fd;
    char *path;
    const char *what; /* the flag or name messages give the file */
    int failed; /* a write failed (warned about once) */
};

/* Creates the folder that holds path when it is missing (mkdir -p). 0, or -1 logged. */
static int jsonl_folder(const char *path, const char *what)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash || slash == path)
        return 0;
    if (slash - path >= (ptrdiff_t)sizeof dir)
        errno = ENAMETOOLONG;
    else if (snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path) > 0 && mkdir_p(dir) == 0)
        return 0;
    DDP_ERROR("%s %s: cannot create its folder: %s; choose a writable place", what, path,
              strerror(errno));
    return -1;
}

/* Bytes of fd's first `size` up to and including its last '\n'; 0 when there is none, -1 when
 * the file cannot be read. */
static off_t last_newline_end(int fd, off_t size)
{
    char buf[4096];
    for (off_t end = size; end > 0;) {
        off_t at = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
        if (pread(fd, buf, (size_t)(end - at), at) != end - at)
            return -1;
        for (off_t i = end - at; i-- > 0;)
            if (buf[i] == '\n')
                return at + i + 1;
        end = at;
    }
    return 0;
}

/* A regular file at path whose last byte is not '\n' (a run killed while writing its last line)
 * is cut back to its last newline, with a note. Anything else is left to the open. 0, or -1
 * logged. */
static int jsonl_repair(const char *path, const char *what)
{
    struct stat sb;
    char last = '\n';
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 ||
        (pread(fd, &last, 1, sb.st_size - 1) == 1 && last == '\n')) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    off_t keep = last_newline_end(fd, sb.st_size);
    int rc = keep >= 0 && ftruncate(fd, keep) == 0 ? 0 : -1;
    if (rc == 0)
        DDP_WARN("%s %s: its last line was cut off (%lld bytes without their newline: a run "
                 "killed while writing it); removed, so every line stays valid JSON", what, path,
                 (long long)(sb.st_size - keep));
    else
        DDP_ERROR("%s %s: cannot cut its torn last line off: %s; move the file away", what,
                  path, strerror(errno));
    close(fd);
    return rc;
}

jsonl_file *jsonl_open(const char *path, int append, const char *what)
{
    if (jsonl_folder(path, what) != 0 || (append && jsonl_repair(path, what) != 0))
        return NULL;
    int mode = append ? O_APPEND : O_TRUNC;
    int fd = open(path, O_WRONLY | O_CREAT | mode | O_NONBLOCK | O_CLOEXEC, 0666);
    jsonl_file *m = fd >= 0 && fcntl(fd, F_SETFL, append ? O_APPEND : 0) == 0
                          ? calloc(1, sizeof *m) : NULL;
    if (m && (m->path = strdup(path)) != NULL) {
        m->fd = fd;
        m->what = what;
        return m;
    }
    DDP_ERROR("%s %s: cannot create the file: %s", what, path, strerror(m ? ENOMEM : errno));
    free(m);
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* Writes n bytes whole; 0, or -1 with errno set. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            return -1;
        p += put;
        n -= (size_t)put;
    }
    return 0;
}

void jsonl_line(jsonl_file *m, const char *fmt, ...)
{
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *line = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (line)
        vsnprintf(line, (size_t)n + 1, fmt, again);
    va_end(again);
    if ((!line || write_all(m->fd, line, (size_t)n) != 0) && !m->failed) {
        m->failed = 1;
        DDP_WARN("%s %s: writing a line failed: %s; the lines after it may be missing "
                 "(training goes on)", m->what, m->path, line ? strerror(errno) : "out of memory");
    }
    free(line);
}

void jsonl_close(jsonl_file *m)
{
    if (!m)
        return;
    close(m->fd);
    free(m->path);
    free(m);
}


const char *jsonl_num(char *buf, size_t n, const char *fmt, double v)
{
    if (!isfinite(v))
        return "null";
    snprintf(buf, n, fmt, v);
    return buf;
}

int jsonl_fd(const jsonl_file *m)
{
    return m ? m->fd : -1;
}
