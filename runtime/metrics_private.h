/* metrics_private.h - what ddp_metrics (metrics.c) shares with its two writers: the TensorBoard
 * event file (metrics_tb.c, built with protobuf-c and ISA-L) and the Prometheus text file
 * (metrics_prom.c). */
#ifndef DDP_METRICS_PRIVATE_H
#define DDP_METRICS_PRIVATE_H

#include "ddp.h"

/* One named value (ddp_metrics_set). */
typedef struct metrics_value {
    char *name;   /* "train/loss": TensorBoard's tag */
    char *prom;   /* "ddp_train_loss" */
    char *help;   /* one line */
    double value;
    int dirty;    /* set since the last commit */
} metrics_value;

typedef struct metrics_tb metrics_tb;
/* Creates the event file in dir (mkdir -p) and writes its version event. NULL on failure,
 * logged with `what` (nothing is left behind). */
metrics_tb *metrics_tb_open(const char *dir, const char *what);
/* One event at step holding the dirty values among v[0..n) (none: no event), after a SessionLog
 * START at step when this is the first write; flushed.
 * DDP_ERR_IO on failure, warned about; the file then ends there (nothing more is written, so
 * no torn record is followed by others). */
ddp_status metrics_tb_write(metrics_tb *tb, long step, const metrics_value *v, int n);
/* Closes the file; NULL is ignored. */
void metrics_tb_close(metrics_tb *tb);

typedef struct metrics_prom metrics_prom;
/* Checks path (common/out_path's rule, its folder writable) and makes the job's label. NULL on
 * failure, logged with `what`; *st says which failure (DDP_ERR_INVALID_ARG, DDP_ERR_IO,
 * DDP_ERR_NOMEM). */
metrics_prom *metrics_prom_open(const char *path, const char *what, ddp_status *st);
/* Replaces the file with ddp_step = step and every value of v[0..n). DDP_ERR_IO on failure,
 * warned about once until a write succeeds again. */
ddp_status metrics_prom_write(metrics_prom *p, long step, const metrics_value *v, int n);
/* Frees p; NULL is ignored (the file stays). */
void metrics_prom_close(metrics_prom *p);

#endif /* DDP_METRICS_PRIVATE_H */
