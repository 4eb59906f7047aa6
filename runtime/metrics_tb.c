/* metrics_tb.c - ddp_metrics's TensorBoard event file (metrics_private.h): Event messages of
 * tb_event.proto (TensorBoard's own field numbers) packed by protobuf-c, in TFRecord framing with
 * CRC-32C from ISA-L (Intel's storage library, libisal: crc32_iscsi is CRC-32C; Debian 12
 * packages no CRC-32C library of its own, such as google/crc32c, and zlib has CRC-32 only). */
#include "metrics_private.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mkdir_p.h"
#include "tb_event.pb-c.h"

struct metrics_tb {
    FILE *f;
    char *path;
    const char *what;
    int started; /* the SessionLog START is written (at the first write's step) */
    int failed;  /* a write failed (warned about; nothing more is written) */
};

/* CRC-32C (Castagnoli) of buf, masked as TFRecord frames store it (TensorFlow's
 * crc32c::Mask: rotated right by 15 bits plus a constant, so that a CRC of data that holds CRCs
 * stays strong). crc32_iscsi neither inverts on entry nor on exit: both are done here. */
static uint32_t masked_crc32c(const void *buf, size_t n)
{
    uint32_t crc = crc32_iscsi((unsigned char *)buf, (int)n, 0xffffffffu) ^ 0xffffffffu;
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* v little-endian into p[0..bytes). */
static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* One record: length (8 bytes), its masked CRC (4), the packed event, its masked CRC (4). */
static int write_record(FILE *f, const Tensorboard__Event *ev)
{
    size_t n = tensorboard__event__get_packed_size(ev);
    unsigned char head[12], tail[4];
    unsigned char *data = malloc(n ? n : 1);
    if (!data) {
        errno = ENOMEM;
        return -1;
    }
    tensorboard__event__pack(ev, data);
    put_le(head, n, 8);
    put_le(head + 8, masked_crc32c(head, 8), 4);
    put_le(tail, masked_crc32c(data, n), 4);
    int ok = fwrite(head, 1, sizeof head, f) == sizeof head && fwrite(data, 1, n, f) == n &&
             fwrite(tail, 1, sizeof tail, f) == sizeof tail;
    free(data);
    return ok ? 0 : -1;
}

/* Now, in seconds since the epoch (Event.wall_time). */
static double wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The file's first event: its version. */
static int write_version(FILE *f)
{
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    return write_record(f, &ev) == 0 && fflush(f) == 0 ? 0 : -1;
}

/* The run (re)starts at step. */
static int write_start(FILE *f, long step)
{
    Tensorboard__SessionLog log = TENSORBOARD__SESSION_LOG__INIT;
    log.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &log;
    return write_record(f, &ev);
}

/* Creates dir/events.out.tfevents.<time>.<host>.<pid> (never an existing file). NULL with errno
 * on failure; *path malloc'ed on success. */
static FILE *create_file(const char *dir, char **path)
{
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    size_t len = strlen(dir) + strlen(host) + 64;
    *path = malloc(len);
    if (!*path) {
        errno = ENOMEM;
        return NULL;
    }
    snprintf(*path, len, "%s/events.out.tfevents.%010lld.%s.%ld", dir, (long long)time(NULL),
             host, (long)getpid());
    int fd = open(*path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f && fd >= 0) {
        int err = errno;
        close(fd);
        unlink(*path);
        errno = err;
    }
    return f;
}

metrics_tb *metrics_tb_open(const char *dir, const char *what)
{
    metrics_tb *tb = calloc(1, sizeof *tb);
    if (!tb) {
        DDP_ERROR("%s %s: out of memory", what, dir);
        return NULL;
    }
    tb->what = what;
    if (mkdir_p(dir) != 0) {
        DDP_ERROR("%s %s: cannot create the folder: %s; choose a writable place", what, dir,
                  strerror(errno));
    } else if (!(tb->f = create_file(dir, &tb->path))) {
        DDP_ERROR("%s %s: cannot create the event file %s: %s; choose a writable folder", what,
                  dir, tb->path ? tb->path : "", strerror(errno));
    } else if (write_version(tb->f) != 0) {
        DDP_ERROR("%s %s: cannot write the event file %s: %s", what, dir, tb->path,
                  strerror(errno));
        fclose(tb->f);
        tb->f = NULL;
        unlink(tb->path);
    } else {
        return tb;
    }
    free(tb->path);
    free(tb);
    return NULL;
}

/* The event of the n_dirty (> 0) values set since the last commit. 0, or -1 with errno set. */
static int write_values(FILE *f, long step, const metrics_value *v, int n, int n_dirty)
{
    Tensorboard__Summary__Value *vals = calloc((size_t)n_dirty, sizeof *vals);
    Tensorboard__Summary__Value **ptrs = calloc((size_t)n_dirty, sizeof *ptrs);
    Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
    int rc = -1;
    errno = ENOMEM;
    if (vals && ptrs) {
        for (int i = 0; i < n; i++) {
            if (!v[i].dirty)
                continue;
            Tensorboard__Summary__Value *x = &vals[summary.n_value];
            tensorboard__summary__value__init(x);
            x->tag = v[i].name;
            x->value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
            x->simple_value = (float)v[i].value;
            ptrs[summary.n_value++] = x;
        }
        summary.value = ptrs;
        Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
        ev.wall_time = wall_time();
        ev.step = step;
        ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
        ev.summary = &summary;
        rc = write_record(f, &ev);
    }
    free(vals);
    free(ptrs);
    return rc;
}

ddp_status metrics_tb_write(metrics_tb *tb, long step, const metrics_value *v, int n)
{
    if (tb->failed)
        return DDP_ERR_IO;
    int n_dirty = 0;
    for (int i = 0; i < n; i++)
        n_dirty += v[i].dirty != 0;
    int rc = tb->started ? 0 : write_start(tb->f, step);
    tb->started = 1;
    if (rc == 0 && n_dirty > 0)
        rc = write_values(tb->f, step, v, n, n_dirty);
    if (rc == 0 && fflush(tb->f) == 0)
        return DDP_OK;
    tb->failed = 1;
    DDP_WARN("%s: writing %s failed: %s; it ends there, no further events are written (training "
             "goes on)", tb->what, tb->path, strerror(errno));
    return DDP_ERR_IO;
}

void metrics_tb_close(metrics_tb *tb)
{
    if (!tb)
        return;
    if (fclose(tb->f) != 0 && !tb->failed)
        DDP_WARN("%s: closing %s failed: %s; its last events may be missing", tb->what, tb->path,
                 strerror(errno));
    free(tb->path);
    free(tb);
}
