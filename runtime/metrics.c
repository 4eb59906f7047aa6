/* metrics.c - ddp_metrics (ddp_metrics.h): the named values and the calls, which hand them to the
 * TensorBoard and Prometheus writers (metrics_tb.c, metrics_prom.c). */
#include "ddp_metrics.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "metrics_private.h"

#define METRICS_NAME_MAX 100

struct ddp_metrics {
    metrics_tb *tb;     /* NULL: no event file */
    metrics_prom *prom; /* NULL: no Prometheus file */
    metrics_value *v;   /* n of cap, in the order first set */
    int n, cap;
    double prom_every;  /* opts.prometheus_interval_s */
    double prom_at;     /* when the Prometheus file was last written (CLOCK_MONOTONIC); 0: never */
    long prom_step;     /* the last commit's step ... */
    int prom_pending;   /* ... not yet in the Prometheus file */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The Prometheus file with the last commit's step and the values now. */
static ddp_status prom_flush(ddp_metrics *m, double now)
{
    ddp_status st = metrics_prom_write(m->prom, m->prom_step, m->v, m->n);
    m->prom_at = now;
    m->prom_pending = st != DDP_OK;
    return st;
}

/* The event file, or DDP_ERR_UNSUPPORTED in a libddp built without protobuf-c or ISA-L. */
static ddp_status open_tb(ddp_metrics *m, const ddp_metrics_opts *o)
{
    const char *what = o->tensorboard_what ? o->tensorboard_what : "TensorBoard folder";
    if (!o->tensorboard_dir[0]) {
        DDP_ERROR("%s is empty: name a folder for the event file", what);
        return DDP_ERR_INVALID_ARG;
    }
#if HAVE_TENSORBOARD
    m->tb = metrics_tb_open(o->tensorboard_dir, what);
    return m->tb ? DDP_OK : DDP_ERR_IO;
#else
    DDP_ERROR("%s %s: this libddp was built without TensorBoard event files: install protobuf-c "
              "and ISA-L (apt-get install libprotobuf-c-dev protobuf-c-compiler libisal-dev, as "
              "scripts/install-deps.sh does) and build again (-Dtensorboard=enabled makes meson "
              "insist on them)", what, o->tensorboard_dir);
    return DDP_ERR_UNSUPPORTED;
#endif
}

ddp_status ddp_metrics_open(const ddp_metrics_opts *opts, ddp_metrics **out)
{
    if (out)
        *out = NULL;
    if (!opts || !out) {
        DDP_ERROR("ddp_metrics_open: need options and a place for the handle");
        return DDP_ERR_INVALID_ARG;
    }
    ddp_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return DDP_ERR_NOMEM;
    ddp_status st = DDP_OK;
    m->prom_every = opts->prometheus_interval_s > 0.0 ? opts->prometheus_interval_s : 0.0;
    if (opts->prometheus_path)
        m->prom = metrics_prom_open(opts->prometheus_path, opts->prometheus_what ?
                                    opts->prometheus_what : "Prometheus file", &st);
    if (st == DDP_OK && opts->tensorboard_dir)
        st = open_tb(m, opts);
    if (st != DDP_OK) {
        ddp_metrics_close(m);
        return st;
    }
    *out = m;
    return DDP_OK;
}

/* 1 when name is 1 to METRICS_NAME_MAX of [A-Za-z0-9_/] beginning with a letter. */
static int name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > METRICS_NAME_MAX || !((name[0] | 0x20) >= 'a' && (name[0] | 0x20) <= 'z'))
        return 0;
    return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/") == n;
}

/* *out: the value named `name`, added (with its Prometheus name and help) when new.
 * DDP_ERR_INVALID_ARG (logged) for a name that clashes with another's Prometheus name,
 * DDP_ERR_NOMEM. */
static ddp_status find_or_add(ddp_metrics *m, const char *name, const char *help,
                              metrics_value **out)
{
    char prom[METRICS_NAME_MAX + 8];
    snprintf(prom, sizeof prom, "ddp_%s", name);
    for (char *c = prom; *c; c++)
        *c = *c == '/' ? '_' : *c;
    for (int i = 0; i < m->n; i++) {
        if (strcmp(m->v[i].prom, prom) != 0)
            continue;
        if (strcmp(m->v[i].name, name) == 0) {
            *out = &m->v[i];
            return DDP_OK;
        }
        DDP_ERROR("ddp_metrics_set: '%s' and '%s' are both %s in Prometheus: rename one", name,
                  m->v[i].name, prom);
        return DDP_ERR_INVALID_ARG;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        metrics_value *v = realloc(m->v, (size_t)cap * sizeof *v);
        if (!v)
            return DDP_ERR_NOMEM;
        m->v = v;
        m->cap = cap;
    }
    metrics_value *v = &m->v[m->n];
    *v = (metrics_value){.name = strdup(name), .prom = strdup(prom), .help = strdup(help)};
    if (!v->name || !v->prom || !v->help) {
        free(v->name);
        free(v->prom);
        free(v->help);
        return DDP_ERR_NOMEM;
    }
    m->n++;
    *out = v;
    return DDP_OK;
}

/* The help of a training figure every data-parallel program reports (ddp_metrics_set's NULL). */
static const char *const known_help[][2] = {
    {"world_size", "Ranks in the job."},
    {"train/loss", "Training loss: rank 0's mean over its micro-batches since the last report."},
    {"train/epoch_loss", "Training loss: the last epoch's mean over the ranks."},
    {"train/learning_rate", "Learning rate of the last step."},
    {"train/grad_norm", "Global gradient norm of the last step applied."},
    {"train/samples_per_second", "Samples per second, all ranks."},
    {"train/tokens_per_second", "Tokens per second, all ranks."},
    {"train/mfu_ratio", "Model FLOPs utilisation: model FLOP/s per rank over the device's peak."},
    {"eval/val_loss", "Validation loss, the last."},
    {"eval/test_accuracy", "Test accuracy after the last epoch (0 to 1)."},
    {"memory/peak_rss_bytes", "The largest peak resident memory (VmHWM) over the ranks."},
    {"memory/device_used_bytes", "The most device memory in use over the ranks."},
};

static const char *help_of(const char *name)
{
    for (size_t i = 0; name && i < sizeof known_help / sizeof known_help[0]; i++)
        if (strcmp(name, known_help[i][0]) == 0)
            return known_help[i][1];
    return NULL;
}

ddp_status ddp_metrics_set(ddp_metrics *m, const char *name, double value, const char *help)
{
    if (!m)
        return DDP_OK;
    help = help ? help : help_of(name);
    if (!name || !help || !name_ok(name) || strcmp(name, "step") == 0 || strchr(help, '\n')) {
        DDP_ERROR("ddp_metrics_set: '%s' (help: %s) is not a metric: the name is 1 to %d of "
                  "[A-Za-z0-9_/], beginning with a letter, not \"step\"; the help one line",
                  name ? name : "(null)", help ? help : "(null)", METRICS_NAME_MAX);
        return DDP_ERR_INVALID_ARG;
    }
    metrics_value *v = NULL;
    ddp_status st = find_or_add(m, name, help, &v);
    if (st != DDP_OK)
        return st;
    v->value = value;
    v->dirty = 1;
    return DDP_OK;
}

ddp_status ddp_metrics_commit(ddp_metrics *m, long step)
{
    if (!m)
        return DDP_OK;
    ddp_status st = DDP_OK;
#if HAVE_TENSORBOARD
    if (m->tb)
        st = metrics_tb_write(m->tb, step, m->v, m->n);
#endif
    double now = now_s();
    m->prom_step = step;
    m->prom_pending = 1;
    if (m->prom && (m->prom_at == 0.0 || now - m->prom_at >= m->prom_every)) {
        ddp_status ps = prom_flush(m, now);
        st = st != DDP_OK ? st : ps;
    }
    for (int i = 0; i < m->n; i++)
        m->v[i].dirty = 0;
    return st;
}

void ddp_metrics_close(ddp_metrics *m)
{
    if (!m)
        return;
#if HAVE_TENSORBOARD
    metrics_tb_close(m->tb);
#endif
    if (m->prom && m->prom_pending)
        prom_flush(m, now_s());
    metrics_prom_close(m->prom);
    for (int i = 0; i < m->n; i++) {
        free(m->v[i].name);
        free(m->v[i].prom);
        free(m->v[i].help);
    }
    free(m->v);
    free(m);
}
