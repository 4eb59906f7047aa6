/* test_metrics.c - ddp_metrics (ddp_metrics.h) without a job: the Prometheus file's exact text
 * (HELP, TYPE, the job's label escaped, NaN and infinities, the shortest exact numbers), names
 * refused, a commit into a removed folder failing and the next one writing again, NULL handles,
 * the least interval between rewrites (the rest written at close), a reader never seeing half a
 * file during 300 rewrites;
 * the TensorBoard file's records (their framing; tests/train/dashboards.py decodes them) and its
 * refusal in a build without protobuf-c. */
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "ddp_metrics.h"

/* The whole of path (malloc'ed, NUL-terminated; *n its length); NULL when unreadable. */
static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf = f ? calloc(1, 1 << 16) : NULL;
    *n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    if (f)
        fclose(f);
    return buf;
}

static void null_handles(void)
{
    ddp_metrics *m = (ddp_metrics *)1;
    CHECK(ddp_metrics_set(NULL, "x", 1.0, "h") == DDP_OK, "a NULL handle sets nothing");
    CHECK(ddp_metrics_commit(NULL, 3) == DDP_OK, "a NULL handle commits nothing");
    ddp_metrics_close(NULL);
    CHECK(ddp_metrics_open(NULL, &m) == DDP_ERR_INVALID_ARG && m == NULL, "NULL options refused");
    ddp_metrics_opts none = {0};
    CHECK(ddp_metrics_open(&none, &m) == DDP_OK && m, "no outputs: a handle that writes nothing");
    CHECK(ddp_metrics_set(m, "a/b", 1.0, "h") == DDP_OK && ddp_metrics_commit(m, 1) == DDP_OK,
          "set and commit without outputs");
    ddp_metrics_close(m);
}

static void bad_names(ddp_metrics *m)
{
    char long_name[102];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    const char *bad[] = {"", "1abc", "_a", "a-b", "a b", "step", "a.b", long_name};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(ddp_metrics_set(m, bad[i], 1.0, "h") == DDP_ERR_INVALID_ARG, "'%s' refused", bad[i]);
    CHECK(ddp_metrics_set(m, "x", 1.0, NULL) == DDP_ERR_INVALID_ARG, "a NULL help refused");
    CHECK(ddp_metrics_set(m, "train/loss", 1.0, NULL) == DDP_OK, "a known figure's help is libddp's");
    CHECK(ddp_metrics_set(m, "x", 1.0, "two\nlines") == DDP_ERR_INVALID_ARG, "a help of 2 lines");
    CHECK(ddp_metrics_set(m, "train_loss", 1.0, "h") == DDP_ERR_INVALID_ARG,
          "train_loss clashes with train/loss (both ddp_train_loss)");
}

/* The Prometheus file in dir: exact text, then a failed and a recovered commit. */
static void prometheus(const char *dir)
{
    char path[600], folder[512];
    snprintf(folder, sizeof folder, "%s/textfile", dir);
    snprintf(path, sizeof path, "%s/ddp.prom", folder);
    CHECK(mkdir(folder, 0777) == 0, "mkdir %s", folder);
    setenv("SLURM_JOB_ID", "4\"2\\", 1); /* a quote and a backslash, escaped in the label */
    ddp_metrics_opts o = {.prometheus_path = path};
    ddp_metrics *m = NULL;
    CHECK(ddp_metrics_open(&o, &m) == DDP_OK && m, "open %s", path);
    CHECK(access(path, F_OK) != 0, "nothing written before the first commit");
    ddp_metrics_set(m, "train/loss", 0.05, "Loss \\ help.");
    ddp_metrics_set(m, "train/nan", NAN, "N.");
    ddp_metrics_set(m, "up", INFINITY, "U.");
    ddp_metrics_set(m, "down", -INFINITY, "D.");
    ddp_metrics_set(m, "third", 1.0 / 3.0, "T.");
    bad_names(m);
    ddp_metrics_set(m, "train/loss", 0.25, "another help is ignored");
    CHECK(ddp_metrics_commit(m, 7) == DDP_OK, "commit at step 7");
    const char *want =
        "# HELP ddp_step The optimizer step of the last update.\n# TYPE ddp_step gauge\n"
        "ddp_step{slurm_job_id=\"4\\\"2\\\\\"} 7\n"
        "# HELP ddp_train_loss Loss \\\\ help.\n# TYPE ddp_train_loss gauge\n"
        "ddp_train_loss{slurm_job_id=\"4\\\"2\\\\\"} 0.25\n"
        "# HELP ddp_train_nan N.\n# TYPE ddp_train_nan gauge\n"
        "ddp_train_nan{slurm_job_id=\"4\\\"2\\\\\"} NaN\n"
        "# HELP ddp_up U.\n# TYPE ddp_up gauge\nddp_up{slurm_job_id=\"4\\\"2\\\\\"} +Inf\n"
        "# HELP ddp_down D.\n# TYPE ddp_down gauge\nddp_down{slurm_job_id=\"4\\\"2\\\\\"} -Inf\n"
        "# HELP ddp_third T.\n# TYPE ddp_third gauge\n"
        "ddp_third{slurm_job_id=\"4\\\"2\\\\\"} 0.3333333333333333\n";
    size_t n = 0;
    char *got = slurp(path, &n);
    CHECK(got && strcmp(got, want) == 0, "the file:\n%s\nwant:\n%s", got ? got : "(none)", want);
    free(got);
    /* the folder removed: the commit fails (warned), the next one after it is back writes */
    CHECK(unlink(path) == 0 && rmdir(folder) == 0, "remove %s", folder);
    CHECK(ddp_metrics_commit(m, 8) == DDP_ERR_IO, "a commit into a removed folder fails");
    CHECK(mkdir(folder, 0777) == 0, "mkdir %s again", folder);
    CHECK(ddp_metrics_commit(m, 9) == DDP_OK && access(path, F_OK) == 0, "the next one writes");
    got = slurp(path, &n);
    CHECK(got && strstr(got, "} 9\n"), "ddp_step 9");
    free(got);
    ddp_metrics_close(m);
    unsetenv("SLURM_JOB_ID");
    o.prometheus_path = folder;
    CHECK(ddp_metrics_open(&o, &m) == DDP_ERR_INVALID_ARG && !m, "a folder as the file: refused");
    snprintf(path, sizeof path, "%s/none/x.prom", dir);
    o.prometheus_path = path;
    CHECK(ddp_metrics_open(&o, &m) == DDP_ERR_INVALID_ARG && !m, "a missing folder: refused");
}

#if HAVE_TENSORBOARD
/* Records of an event file: each 8-byte length, 4-byte CRC, data, 4-byte CRC; -1 when torn. */
static int count_records(const unsigned char *p, size_t n)
{
    int count = 0;
    for (size_t at = 0; at < n; count++) {
        uint64_t len = 0;
        if (n - at < 12)
            return -1;
        for (int i = 7; i >= 0; i--)
            len = (len << 8) | p[at + (size_t)i];
        if (len > n - at - 16)
            return -1;
        at += 16 + (size_t)len;
    }
    return count;
}
#endif

/* Commits at most one rewrite per interval: the values of one that comes sooner are written at
 * close. */
static void interval(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/interval.prom", dir);
    ddp_metrics_opts o = {.prometheus_path = path, .prometheus_interval_s = 3600};
    ddp_metrics *m = NULL;
    CHECK(ddp_metrics_open(&o, &m) == DDP_OK, "open %s", path);
    ddp_metrics_set(m, "x", 1, "X.");
    ddp_metrics_commit(m, 1);
    ddp_metrics_set(m, "x", 2, "X.");
    ddp_metrics_commit(m, 2);
    size_t n = 0;
    char *got = slurp(path, &n);
    CHECK(got && strstr(got, "} 1\n# HELP ddp_x X.\n# TYPE ddp_x gauge\nddp_x{") &&
          !strstr(got, "} 2\n"), "the second commit, within the interval, not written:\n%s", got);
    free(got);
    ddp_metrics_close(m);
    got = slurp(path, &n);
    CHECK(got && strstr(got, "} 2\n") && !strstr(got, "} 1\n"), "written at close:\n%s", got);
    free(got);
}

/* A reader of the file while it is rewritten (node_exporter's): never half a file. */
typedef struct reader {
    const char *path;
    atomic_int stop;
    long reads, torn;
} reader;

static void *read_loop(void *arg)
{
    reader *r = arg;
    static char buf[1 << 14];
    while (!atomic_load(&r->stop)) {
        FILE *f = fopen(r->path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        r->reads++;
        r->torn += strncmp(buf, "# HELP ddp_step", 15) != 0 || !strstr(buf, "ddp_last{");
    }
    return NULL;
}

static void atomic_rewrites(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/atomic.prom", dir);
    ddp_metrics_opts o = {.prometheus_path = path};
    ddp_metrics *m = NULL;
    CHECK(ddp_metrics_open(&o, &m) == DDP_OK, "open %s", path);
    ddp_metrics_set(m, "last", 0, "L.");
    ddp_metrics_commit(m, 0);
    reader r = {.path = path};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, read_loop, &r) == 0, "reader thread");
    for (int i = 1; i <= 300; i++) {
        ddp_metrics_set(m, "last", i, "L.");
        ddp_metrics_commit(m, i);
    }
    atomic_store(&r.stop, 1);
    pthread_join(th, NULL);
    ddp_metrics_close(m);
    CHECK(r.reads > 0 && r.torn == 0, "%ld reads during 300 rewrites, %ld of them torn", r.reads,
          r.torn);
}

static void tensorboard(const char *dir)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s/tb/run", dir);
    ddp_metrics_opts o = {.tensorboard_dir = folder};
    ddp_metrics *m = NULL;
    ddp_status st = ddp_metrics_open(&o, &m);
#if HAVE_TENSORBOARD
    CHECK(st == DDP_OK && m, "open %s: %s", folder, ddp_strerror(st));
    ddp_metrics_set(m, "world_size", 2, "W.");
    ddp_metrics_commit(m, 5);  /* the START at 5, then world_size */
    ddp_metrics_commit(m, 6);  /* nothing set since: no event */
    ddp_metrics_set(m, "train/loss", 1.5, "L.");
    ddp_metrics_commit(m, 10); /* train/loss */
    ddp_metrics_close(m);
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s/events.out.tfevents.*", folder);
    glob_t g;
    CHECK(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1, "one event file in %s", folder);
    const char *name = g.gl_pathc == 1 ? g.gl_pathv[0] : "";
    size_t n = 0;
    char *buf = slurp(name, &n);
    int records = buf ? count_records((unsigned char *)buf, n) : -1;
    CHECK(records == 4, "4 whole records (version, START, 2 summaries), got %d", records);
    free(buf);
    globfree(&g);
#else
    CHECK(st == DDP_ERR_UNSUPPORTED && !m, "without protobuf-c: refused (%s)", ddp_strerror(st));
#endif
}

int main(void)
{
    char dir[] = "/tmp/ddp-test-metrics-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    null_handles();
    prometheus(dir);
    interval(dir);
    atomic_rewrites(dir);
    tensorboard(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return CHECK_DONE();
}
