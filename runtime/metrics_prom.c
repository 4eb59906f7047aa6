/* metrics_prom.c - ddp_metrics's Prometheus text file (metrics_private.h): gauges with HELP and
 * TYPE lines and the job's label, the whole file replaced at each commit (node_exporter's
 * textfile collector reads it; a temporary file renamed over it, so never half a file). */
#include "metrics_private.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "out_path.h"

struct metrics_prom {
    char *target; /* the file replaced (a link's target) */
    char *tmp;    /* "<target>.tmp.<pid>" */
    char *what;   /* how messages name it, with its path */
    char label[160]; /* {slurm_job_id="..."} or {pid="..."} */
    int failed;   /* the last write failed (warned about) */
};

/* {name="value"} with value's backslashes, quotes and newlines escaped (the text format's rule);
 * a value too long for the buffer is cut. */
static void make_label(char *buf, size_t n, const char *name, const char *value)
{
    size_t k = (size_t)snprintf(buf, n, "{%s=\"", name);
    for (const char *c = value; *c && k + 4 < n; c++) {
        if (*c == '\\' || *c == '"' || *c == '\n')
            buf[k++] = '\\';
        buf[k++] = *c == '\n' ? 'n' : *c;
    }
    snprintf(buf + k, n - k, "\"}");
}

metrics_prom *metrics_prom_open(const char *path, const char *what, ddp_status *st)
{
    char why[1024];
    metrics_prom *p = calloc(1, sizeof *p);
    *st = DDP_ERR_NOMEM;
    if (!p)
        return NULL;
    int rc = out_path_target(path, &p->target, why, sizeof why);
    if (rc == OUT_PATH_OK)
        rc = out_path_probe_dir(p->target, why, sizeof why);
    if (rc != OUT_PATH_OK) {
        DDP_ERROR("%s %s%s", what, path, why);
        *st = rc == OUT_PATH_REFUSED ? DDP_ERR_INVALID_ARG : DDP_ERR_IO;
        metrics_prom_close(p);
        return NULL;
    }
    size_t tmp_len = strlen(p->target) + 32, what_len = strlen(what) + strlen(path) + 2;
    p->tmp = malloc(tmp_len);
    p->what = malloc(what_len);
    if (!p->tmp || !p->what) {
        metrics_prom_close(p);
        return NULL;
    }
    snprintf(p->tmp, tmp_len, "%s.tmp.%ld", p->target, (long)getpid());
    snprintf(p->what, what_len, "%s %s", what, path);
    const char *job = getenv("SLURM_JOB_ID");
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    make_label(p->label, sizeof p->label, job && *job ? "slurm_job_id" : "pid",
               job && *job ? job : pid);
    *st = DDP_OK;
    return p;
}

/* Finite v in as few digits as read back exactly (0.05, not 0.050000000000000003), 15 to 17. */
static const char *shortest(char *buf, size_t n, double v)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

/* One gauge: its HELP (backslashes escaped; help is one line) and TYPE lines and its sample. */
static void write_gauge(FILE *f, const char *label, const char *name, const char *help, double v)
{
    char num[32];
    fprintf(f, "# HELP %s ", name);
    for (const char *c = help; *c; c++) {
        if (*c == '\\')
            fputc('\\', f);
        fputc(*c, f);
    }
    fprintf(f, "\n# TYPE %s gauge\n%s%s ", name, name, label);
    if (isnan(v))
        fputs("NaN\n", f);
    else if (isinf(v))
        fputs(v > 0 ? "+Inf\n" : "-Inf\n", f);
    else
        fprintf(f, "%s\n", shortest(num, sizeof num, v));
}

ddp_status metrics_prom_write(metrics_prom *p, long step, const metrics_value *v, int n)
{
    FILE *f = fopen(p->tmp, "w");
    int err = f ? 0 : errno;
    if (f) {
        write_gauge(f, p->label, "ddp_step", "The optimizer step of the last update.",
                    (double)step);
        for (int i = 0; i < n; i++)
            write_gauge(f, p->label, v[i].prom, v[i].help, v[i].value);
        err = fflush(f) != 0 || ferror(f) ? errno : 0;
        if (fclose(f) != 0 && !err)
            err = errno;
        if (!err && rename(p->tmp, p->target) != 0)
            err = errno;
        if (err)
            unlink(p->tmp);
    }
    if (err && !p->failed)
        DDP_WARN("%s: writing it failed: %s; it keeps its last values until a write succeeds "
                 "(training goes on)", p->what, strerror(err));
    p->failed = err != 0;
    return err ? DDP_ERR_IO : DDP_OK;
}

void metrics_prom_close(metrics_prom *p)
{
    if (!p)
        return;
    free(p->target);
    free(p->tmp);
    free(p->what);
    free(p);
}
