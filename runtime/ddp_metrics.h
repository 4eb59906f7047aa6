/* ddp_metrics.h - training metrics where people look at them: named scalars written to a
 * TensorBoard event file and to a Prometheus text file (node_exporter's textfile collector).
 *
 * Part of libddp's public interface, installed beside ddp.h (which it includes).
 */
#ifndef DDP_METRICS_H
#define DDP_METRICS_H

#include "ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * A program sets named values (ddp_metrics_set) and commits them at a step (ddp_metrics_commit):
 *  - TensorBoard: the values set since the last commit become one event (a Summary of
 *    simple_value scalars, tagged with their names) in DIR/events.out.tfevents.<time>.<host>.<pid>,
 *    framed as TFRecords (length, masked CRC-32C of the length, the event, masked CRC-32C of the
 *    event) and flushed at each commit, so `tensorboard --logdir DIR` shows them while the run
 *    goes on. The first commit's step is taken as where the run (re)starts: a SessionLog START
 *    there precedes its values, and TensorBoard then forgets the points that an earlier run in
 *    DIR wrote at or after that step (a resumed run's past its checkpoint). So commit first at
 *    the starting step (0, or the resumed one), e.g. with the run's constants. Needs libddp
 *    built with protobuf-c and ISA-L.
 *  - Prometheus: every value set so far, as gauges named "ddp_" + the name with '/' as '_'
 *    ("train/loss": ddp_train_loss), with their HELP and TYPE lines, and the gauge ddp_step (the
 *    last commit's step), each with one label naming the job: slurm_job_id="<SLURM_JOB_ID>"
 *    under Slurm, else pid="<this process's id>". A commit (at most one per
 *    opts.prometheus_interval_s) writes the whole file beside PATH ("PATH.tmp.<pid>") and
 *    renames it over PATH, so a scraper never reads half a file (point node_exporter's
 *    --collector.textfile.directory at PATH's folder; PATH should end in .prom).
 * One handle is for one thread. The calls accept a NULL handle and then do nothing (DDP_OK):
 * ranks without outputs call them alike.
 */
typedef struct ddp_metrics ddp_metrics;

typedef struct ddp_metrics_opts {
    const char *tensorboard_dir; /* the event file's folder (created when missing); NULL: none */
    const char *prometheus_path; /* the text file; NULL: none */
    /* The least time between two rewrites of the Prometheus file, in seconds (0: one at every
     * commit). A scraper reads it every 15 s or so, and a rewrite costs about 1 ms on ext4 (the
     * rename over the old file starts its write-back): 1 s keeps that under 0.1 %. A commit
     * that comes sooner only updates the values; the next rewrite or ddp_metrics_close writes
     * them. */
    double prometheus_interval_s;
    /* How messages name the folder and the file (e.g. a program's flags "--tensorboard" and
     * "--prometheus"); NULL: "TensorBoard folder", "Prometheus file". */
    const char *tensorboard_what, *prometheus_what;
} ddp_metrics_opts;

/* Opens the outputs that opts names: the event file is created (with its version event) and
 * PATH checked (a regular or new file, as ddp_state_save's: not a folder, device or FIFO; its
 * folder accepts a new file), so a program learns at start-up that they cannot be written.
 * *out is NULL on failure: DDP_ERR_INVALID_ARG for NULL opts or out, an empty DIR, or a PATH
 * refused (logged: what it is, or that its folder is missing or not writable, and the fix),
 * DDP_ERR_IO when DIR or the event file cannot be created (logged with the system's reason;
 * nothing is left behind), DDP_ERR_UNSUPPORTED for a TensorBoard folder when
 * libddp was built without protobuf-c or ISA-L (logged: the packages to install), DDP_ERR_NOMEM.
 * Both outputs NULL: *out is a handle that writes nothing. */
DDP_API ddp_status ddp_metrics_open(const ddp_metrics_opts *opts, ddp_metrics **out);

/* Sets the value of `name` for the next commit; help (one line, kept from the first call for a
 * name) is Prometheus's HELP; NULL for the figures libddp knows (world_size, train/loss,
 * train/epoch_loss, train/learning_rate, train/grad_norm, train/samples_per_second,
 * train/tokens_per_second, train/mfu_ratio, eval/val_loss, eval/test_accuracy,
 * memory/peak_rss_bytes, memory/device_used_bytes). A name is 1 to 100 of [A-Za-z0-9_/], beginning with a letter, and
 * is TensorBoard's tag; "step" is taken (ddp_step). Use Prometheus's conventions: base units
 * named at the end ("_seconds", "_bytes", "_ratio"), and no "_total" (these are gauges).
 * NaN and infinities are kept as such. DDP_ERR_INVALID_ARG (logged) for a bad or taken name or
 * a NULL help of another name, or a name that maps to another's Prometheus name ("a/b" and "a_b");
 * DDP_ERR_NOMEM; the value is then not set. */
DDP_API ddp_status ddp_metrics_set(ddp_metrics *m, const char *name, double value,
                                   const char *help);

/* Writes the values at `step`: the TensorBoard event of those set since the last commit (none:
 * no event), then the Prometheus file (unless it was written less than
 * opts.prometheus_interval_s ago). A failed write returns DDP_ERR_IO, warned about once per
 * output: the event file ends there (no event is written after a torn one); the Prometheus file
 * keeps its last content and a later commit tries again. The values stay set. */
DDP_API ddp_status ddp_metrics_commit(ddp_metrics *m, long step);

/* Writes the Prometheus file when the last commit is not in it yet, flushes and closes the
 * outputs and frees the handle; NULL is ignored. Never fails (a failed write is warned about). */
DDP_API void ddp_metrics_close(ddp_metrics *m);

#ifdef __cplusplus
}
#endif

#endif /* DDP_METRICS_H */
