/* train_report.c - ddp-train output: progress bar or lines, classification report, JSON metrics lines. */
#include "train_report.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mkdir_p.h"

#define REPORT_BAR_WIDTH 30

double train_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void progress_init(progress_bar *p, int log_every, long total_steps, long samples_per_step)
{
    /* stderr tells a person's terminal: under mpirun stdout is a pseudo-terminal of its own */
    *p = (progress_bar){.tty = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO), .log_every = log_every,
                        .total_steps = total_steps, .samples_per_step = samples_per_step,
                        .unit = "samples"};
}

/* Seconds per step at step `step`: after the steady clock's mark, over the steps since it. */
static double progress_step_seconds(const progress_bar *p, long step)
{
    if (step > p->base_step && p->train_seconds > p->base_seconds && p->base_step > p->first_step)
        return (p->train_seconds - p->base_seconds) / (double)(step - p->base_step);
    return step > p->first_step ? p->train_seconds / (double)(step - p->first_step) : 0.0;
}

/* " | 123.4 ms/step | 38.2 % MFU" for a model that counts its FLOPs (the MFU part when the peak
 * is known), else "". */
static void progress_flops(char *buf, size_t n, const progress_bar *p, double per_step)
{
    buf[0] = '\0';
    if (!(p->flops_per_step > 0.0) || !(per_step > 0.0))
        return;
    int len = snprintf(buf, n, " | %.1f ms/step", 1e3 * per_step);
    if (p->peak_flops > 0.0 && len > 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, " | %.1f %% MFU",
                 100.0 * p->flops_per_step / per_step / p->peak_flops);
}

/* Writes "12m05s" style durations. */
static void format_duration(char *buf, size_t n, double seconds)
{
    long s = seconds > 0 ? (long)(seconds + 0.5) : 0;
    if (s >= 3600)
        snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else
        snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}

int progress_due(const progress_bar *p, long step)
{
    return step % p->log_every == 0 || step == p->total_steps || step == p->first_step + 1;
}

void progress_update(progress_bar *p, long step, int epoch, double loss)
{
    if (!p->tty && !progress_due(p, step))
        return;
    double per_step = progress_step_seconds(p, step);
    double rate = per_step > 0 ? (double)p->samples_per_step / per_step : 0.0;
    char eta[32], flops[64];
    long left = p->total_steps - step, evals = p->eval_every > 0 ? left / p->eval_every : 0;
    evals += step < p->total_steps; /* the one at the end */
    format_duration(eta, sizeof eta, per_step * (double)left + p->eval_seconds * (double)evals);
    progress_flops(flops, sizeof flops, p, per_step);
    if (!p->tty) {
        printf("step %ld/%ld epoch %d loss %.4f%s | %.0f %s/s | ETA %s%s\n", step, p->total_steps,
               epoch + 1, loss, p->extra, rate, p->unit, eta, flops);
        fflush(stdout);
        return;
    }
    int filled = (int)((double)REPORT_BAR_WIDTH * (double)step / (double)p->total_steps);
    char bar[REPORT_BAR_WIDTH + 1];
    for (int i = 0; i < REPORT_BAR_WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[REPORT_BAR_WIDTH] = '\0';
    printf("\r[%s] %ld/%ld epoch %d loss %.4f%s | %.0f %s/s | ETA %s%s  ", bar, step, p->total_steps,
           epoch + 1, loss, p->extra, rate, p->unit, eta, flops);
    fflush(stdout);
}

void progress_end(const progress_bar *p)
{
    if (p->tty)
        fputc('\n', stdout);
}

double confusion_accuracy(const float *confusion)
{
    double correct = 0.0, total = 0.0;
    for (int t = 0; t < REPORT_N_CLASSES; t++) {
        for (int q = 0; q < REPORT_N_CLASSES; q++)
            total += confusion[t * REPORT_N_CLASSES + q];
        correct += confusion[t * REPORT_N_CLASSES + t];
    }
    return total > 0 ? correct / total : 0.0;
}

/* Precision, recall, F1 and support of class c. */
static void class_scores(const float *confusion, int c, double *prec, double *rec, double *f1,
                             double *support)
{
    double tp = confusion[c * REPORT_N_CLASSES + c], predicted = 0.0, actual = 0.0;
    for (int k = 0; k < REPORT_N_CLASSES; k++) {
        predicted += confusion[k * REPORT_N_CLASSES + c];
        actual += confusion[c * REPORT_N_CLASSES + k];
    }
    *prec = predicted > 0 ? tp / predicted : 0.0;
    *rec = actual > 0 ? tp / actual : 0.0;
    *f1 = *prec + *rec > 0 ? 2.0 * *prec * *rec / (*prec + *rec) : 0.0;
    *support = actual;
}

void print_class_report(FILE *f, const float *confusion)
{
    double macro[3] = {0}, weighted[3] = {0}, total = 0.0;
    fprintf(f, "%12s %10s %10s %10s %10s\n\n", "", "precision", "recall", "f1-score", "support");
    for (int c = 0; c < REPORT_N_CLASSES; c++) {
        double s[3], support;
        class_scores(confusion, c, &s[0], &s[1], &s[2], &support);
        fprintf(f, "%12d %10.4f %10.4f %10.4f %10.0f\n", c, s[0], s[1], s[2], support);
        for (int k = 0; k < 3; k++) {
            macro[k] += s[k] / REPORT_N_CLASSES;
            weighted[k] += s[k] * support;
        }
        total += support;
    }
    for (int k = 0; k < 3 && total > 0; k++)
        weighted[k] /= total;
    fprintf(f, "\n%12s %10s %10s %10.4f %10.0f\n", "accuracy", "", "", confusion_accuracy(confusion),
            total);
    fprintf(f, "%12s %10.4f %10.4f %10.4f %10.0f\n", "macro avg", macro[0], macro[1], macro[2], total);
    fprintf(f, "%12s %10.4f %10.4f %10.4f %10.0f\n", "weighted avg", weighted[0], weighted[1],
            weighted[2], total);
}

/* v as a JSON number with format fmt, or null when it is NaN or infinite (a diverged loss): JSON
 * has no NaN or Infinity, and printf's "nan" or "-nan" would make the line unreadable. */
static const char *json_number(char *buf, size_t n, const char *fmt, double v)
{
    if (!isfinite(v))
        return "null";
    snprintf(buf, n, fmt, v);
    return buf;
}

/* ---- --metrics: whole lines ----------------------------------------------------------------- */

struct metrics_file {
    int fd;
    char *path;
    int failed; /* a write failed (warned about once) */
};

/* Creates the folder that holds path when it is missing (mkdir -p). 0, or -1 logged. */
static int metrics_folder(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash || slash == path)
        return 0;
    if (slash - path >= (ptrdiff_t)sizeof dir)
        errno = ENAMETOOLONG;
    else if (snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path) > 0 && mkdir_p(dir) == 0)
        return 0;
    DDP_ERROR("--metrics %s: cannot create its folder: %s; choose a writable place", path,
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
static int metrics_repair(const char *path)
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
        DDP_WARN("--metrics %s: its last line was cut off (%lld bytes without their newline: a run "
                 "killed while writing it); removed, so every line stays valid JSON", path,
                 (long long)(sb.st_size - keep));
    else
        DDP_ERROR("--metrics %s: cannot cut its torn last line off: %s; move the file away", path,
                  strerror(errno));
    close(fd);
    return rc;
}

metrics_file *metrics_open(const char *path, int append)
{
    if (metrics_folder(path) != 0 || (append && metrics_repair(path) != 0))
        return NULL;
    int mode = append ? O_APPEND : O_TRUNC;
    int fd = open(path, O_WRONLY | O_CREAT | mode | O_NONBLOCK | O_CLOEXEC, 0666);
    metrics_file *m = fd >= 0 && fcntl(fd, F_SETFL, append ? O_APPEND : 0) == 0
                          ? calloc(1, sizeof *m) : NULL;
    if (m && (m->path = strdup(path)) != NULL) {
        m->fd = fd;
        return m;
    }
    DDP_ERROR("--metrics %s: cannot create the file: %s", path, strerror(m ? ENOMEM : errno));
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

void metrics_line(metrics_file *m, const char *fmt, ...)
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
        DDP_WARN("--metrics %s: writing a line failed: %s; the lines after it may be missing "
                 "(training goes on)", m->path, line ? strerror(errno) : "out of memory");
    }
    free(line);
}

void metrics_close(metrics_file *m)
{
    if (!m)
        return;
    close(m->fd);
    free(m->path);
    free(m);
}

void metrics_epoch(metrics_file *m, const epoch_stats *e)
{
    char loss[64];
    metrics_line(m, "{\"epoch\":%d,\"steps\":%ld,\"train_loss\":%s,\"test_accuracy\":%.6f,"
                 "\"samples_per_s\":%.1f}\n",
                 e->epoch, e->steps, json_number(loss, sizeof loss, "%.6f", e->train_loss),
                 e->test_accuracy, e->samples_per_s);
}

/* A figure that may be missing (negative): JSON null, else the number. */
#define json_opt(buf, v) ((v) < 0 ? "null" : json_number(buf, sizeof buf, "%.3f", (v)))
/* A count that may be missing (negative): JSON null, else the integer. */
#define json_count(buf, v) ((v) < 0 ? "null" : json_number(buf, sizeof buf, "%.0f", (double)(v)))

void metrics_summary(metrics_file *m, const train_opts *o, const run_stats *r)
{
    char loss[64], comm[256];
    metrics_line(m, "{\"summary\":true,\"model\":\"%s\",\"backend\":\"%s\",\"world_size\":%d,"
                 "\"batch\":%d,\"accum\":%d,\"epochs\":%d,\"steps\":%ld,\"train_loss\":%s,"
                 "\"test_accuracy\":%.6f,\"samples_per_s\":%.1f,\"train_seconds\":%.3f,"
                 "\"wall_seconds\":%.3f,\"stopped_by_signal\":%s%s}\n",
                 o->model.kind == MODEL_CNN ? "cnn" : "mlp", r->backend, r->world_size, o->batch,
                 o->accum, r->epochs, r->steps,
                 json_number(loss, sizeof loss, "%.6f", r->train_loss), r->test_accuracy,
                 r->samples_per_s, r->train_seconds, r->wall_seconds,
                 r->stopped_by_signal ? "true" : "false", metrics_comm(comm, sizeof comm, r));
}

const char *metrics_comm(char *buf, size_t n, const run_stats *r)
{
    char exposed[64], comm[64], hidden[64], gather[64], calls[32], bytes[32];
    snprintf(buf, n, ",\"exposed_comm_ms\":%s,\"comm_ms\":%s,\"hidden_fraction\":%s,"
             "\"gather_wait_ms\":%s,\"allgather_calls\":%s,\"allgather_bytes\":%s",
             json_opt(exposed, r->exposed_comm_ms), json_opt(comm, r->comm_ms),
             json_opt(hidden, r->hidden_fraction), json_opt(gather, r->gather_wait_ms),
             json_count(calls, r->allgather_calls), json_count(bytes, r->allgather_bytes));
    return buf;
}
