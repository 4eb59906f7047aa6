/* train_state.c - ddp-train's checkpoints and resuming (see train_state.h).
 *
 * A checkpoint is a libddp state (runtime/checkpoint.c): the buffers of the optimizer (params, the
 * fp32 master weights; momentum, or adam_m and adam_v), the position (step, epoch, the sampler's
 * and the schedule's), the loss scale, and the config.* fingerprint texts that must match to
 * resume; docs/formats.md ("What ddp-train stores") lists every entry and what it means.
 * Resuming: rank 0 reads the checkpoint, checks the signature and the fingerprint, and broadcasts
 * the position, loss scale, parameters and optimizer buffers, so only rank 0 needs to see the
 * file.
 *
 * Sharded optimizer state (--zero 1|2): rank 0 gathers the other ranks' shards while it writes, so
 * the file is the same as an unsharded run's (one file, the format above) and any world size and
 * --zero stage resumes from it: each rank keeps its own range of the broadcast buffers. The gather
 * and the broadcast go in chunks of STATE_CHUNK elements per rank, so no rank holds more than
 * world_size x STATE_CHUNK floats beyond its own state; rank 0 already holds the whole state on
 * the host to write it.
 *
 * Checkpoint folders (--checkpoint-format folder, docs/formats.md): every rank writes its
 * ddp_shard_range slice of the parameters and optimizer buffers (its --zero shard when sharded)
 * into DIR/step-N.ckpt/rank-R-of-W.ckpt in parallel, and rank 0 writes the MANIFEST once all are on
 * disk (runtime/checkpoint_dir.c). Resuming, every rank reads only its ranges (any world size,
 * any stage) and the replicated buffers are broadcast range by range.
 *
 * --checkpoint-dir itself (the step-N names, keeping --keep, removing interrupted saves, the newest
 * valid checkpoint for --resume auto, --checkpoint-async's background writes) is libddp's
 * checkpoint manager (runtime/checkpoint_manager.c); this file stages what goes into it.
 */
#include "train_state.h"
#include "out_path.h"
#include "train_report.h"

#include "ddp_checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_FP_MAX 16
#define STATE_FP_VALUE 96
#define STATE_PATH_MAX 4096
#define STATE_CHUNK ((size_t)1 << 20) /* elements per rank per round of a shard gather */

typedef struct fp_entry {
    const char *key;
    char value[STATE_FP_VALUE];
    int reshardable; /* may differ with --resume-reshard */
} fp_entry;

void train_must(ddp_ctx *ctx, ddp_status st, const char *what)
{
    if (st == DDP_OK)
        return;
    DDP_ERROR("%s failed: %s; stopping every rank", what, ddp_strerror(st));
    ddp_abort(ctx, 1);
}

/* ---- configuration fingerprint ------------------------------------------------------------- */

void train_buffers_of_optim(optim *opt, train_buffers *b)
{
    b->n_opt = optim_buffers(opt, b->opt_names, b->opt);
    optim_range(opt, &b->opt_offset, &b->opt_n);
}

/* Whether the optimizer buffers are shards (the same answer on every rank). */
static int opt_sharded(const train_setup *s)
{
    return s->o->zero > 0 && ddp_world_size(s->ctx) > 1;
}

/* The fingerprint entry of a fixed global batch: config.<its flag, '-' as '_'>. */
static const char *fixed_key(const train_setup *s)
{
    static char key[64];
    snprintf(key, sizeof key, "config.%s", s->fixed.flag);
    for (char *c = key; *c; c++)
        *c = *c == '-' ? '_' : *c;
    return key;
}

/* Fills fp with the entries that must match to resume; returns their count. */
static int state_fingerprint(const train_setup *s, fp_entry *fp)
{
    const train_opts *o = s->o;
    int n = 0;
    fp[n] = (fp_entry){.key = "config.model"};
    snprintf(fp[n++].value, STATE_FP_VALUE, "%s", s->buf.model_fp);
#define STATE_FP_(k, resh, ...) \
    fp[n] = (fp_entry){.key = (k), .reshardable = (resh)}; \
    snprintf(fp[n++].value, STATE_FP_VALUE, __VA_ARGS__)
    STATE_FP_("config.world_size", 1, "%d", ddp_world_size(s->ctx));
    STATE_FP_("config.batch", 0, "%d", o->batch);
    STATE_FP_("config.accum", 0, "%d", o->accum);
    if (s->fixed.flag) { /* the micro-steps follow the world size; the samples per step not */
        fp[n] = (fp_entry){.key = fixed_key(s)};
        snprintf(fp[n++].value, STATE_FP_VALUE, "%ld", s->fixed.value);
    }
    STATE_FP_("config.seed", 0, "%llu", (unsigned long long)o->seed);
    STATE_FP_("config.shuffle", 0, "%s", o->shuffle ? "yes" : "no");
    STATE_FP_("config.augment", 0, "%s", o->augment ? "yes" : "no");
    if (o->cosine) {
        STATE_FP_("config.lr_schedule", 1, "cosine over %ld steps", s->total_steps);
    } else {
        STATE_FP_("config.lr_schedule", 0, "constant");
    }
    STATE_FP_("config.train_samples", 0, "%zu", s->n_train);
    STATE_FP_("config.precision", 0, "%s", model_precision_name(s->buf.precision));
    STATE_FP_("config.grad_dtype", 0, "%s", ddp_dtype_name(o->grad_dtype));
#undef STATE_FP_
    return n;
}

/* The warning's note on the rate at the checkpoint's step, before and after the new plan. */
static void rate_change(const train_setup *s, const ddp_state *st, long was, long now, char *buf,
                        size_t n)
{
    uint64_t step = 0;
    buf[0] = '\0';
    if (!s->lr || !ddp_state_u64(st, "step", &step))
        return;
    double before = s->lr(s->lr_arg, (long)step, was), after = s->lr(s->lr_arg, (long)step, now);
    snprintf(buf, n, "; at the checkpoint's step %llu the learning rate goes from %.3g (the "
             "%ld-step plan) to %.3g (x %.2f)", (unsigned long long)step, before, was, after,
             before > 0 ? after / before : 0.0);
}

/* A cosine schedule planned over another number of steps (a run extended or shortened with
 * --max-steps or --epochs): allowed, the rate recomputed over the new plan from the checkpoint's
 * step on, and said with the rate before and after at that step. */
static int schedule_extended(const train_setup *s, const ddp_state *st, const fp_entry *fp,
                             const char *theirs, const char *path)
{
    long was = 0, now = 0;
    if (strcmp(fp->key, "config.lr_schedule") != 0 || sscanf(theirs, "cosine over %ld steps", &was) != 1 ||
        sscanf(fp->value, "cosine over %ld steps", &now) != 1)
        return 0;
    if (now == 0) /* --sample-only: no step to plan */
        return 1;
    char rate[256];
    rate_change(s, st, was, now, rate, sizeof rate);
    DDP_WARN("--resume %s: the run was planned over %ld steps, now over %ld: the learning-rate "
             "schedule is recomputed over the new plan from the checkpoint's step on%s, so the "
             "result is no longer bit-identical to a straight %ld-step run", path, was, now, rate,
             now);
    return 1;
}

/* A checkpoint written with a fixed global batch before its config.* entry existed (the GPT's
 * --total-batch-tokens): its config.model ends in " accumN", N the micro-steps at its world size. */
static int older_fixed_batch(const train_setup *s, const fp_entry *fp, const char *theirs)
{
    size_t n = strlen(fp->value);
    int accum = 0, end = 0;
    if (!s->fixed.flag)
        return 0;
    if (strcmp(fp->key, fixed_key(s)) == 0)
        return theirs == NULL;
    return strcmp(fp->key, "config.model") == 0 && theirs && strncmp(theirs, fp->value, n) == 0 &&
           sscanf(theirs + n, " accum%d%n", &accum, &end) == 1 && theirs[n + (size_t)end] == '\0' &&
           (accum == s->accum || s->o->resume_reshard);
}

/* Rank 0: every fingerprint difference is logged; DDP_ERR_MISMATCH unless none (or only
 * reshardable ones under --resume-reshard). *other_world: the checkpoint's world size differs. */
static ddp_status check_fingerprint(const train_setup *s, const ddp_state *st, const char *path,
                                        int *other_world)
{
    fp_entry fp[STATE_FP_MAX];
    int n = state_fingerprint(s, fp), refused = 0;
    *other_world = 0;
    for (int i = 0; i < n; i++) {
        const char *theirs = ddp_state_text(st, fp[i].key);
        if ((theirs && (strcmp(theirs, fp[i].value) == 0 ||
                        schedule_extended(s, st, &fp[i], theirs, path))) ||
            older_fixed_batch(s, &fp[i], theirs))
            continue;
        int allowed = fp[i].reshardable && s->o->resume_reshard && theirs;
        *other_world |= strcmp(fp[i].key, "config.world_size") == 0;
        refused |= !allowed;
        DDP_LOG_(allowed ? DDP_LOG_WARN : DDP_LOG_ERROR, 0, "--resume %s: %s is %s in the checkpoint, "
                 "%s in this run%s", path, fp[i].key + 7, theirs ? theirs : "missing", fp[i].value,
                 allowed ? " (allowed by --resume-reshard)" : "");
    }
    if (!refused)
        return DDP_OK;
    DDP_ERROR("--resume %s: the checkpoint was written by another configuration: resume with the "
              "settings above%s, or start fresh with another --checkpoint-dir", path,
              *other_world && !s->o->resume_reshard
                  ? " (or add --resume-reshard to continue on another number of ranks, no longer "
                    "bit-identical)" : "");
    return DDP_ERR_MISMATCH;
}

/* ---- saving ---------------------------------------------------------------------------------- */

/* Collective: the buffers (the master weights, "params", then the optimizer's; gathered from the
 * shards) into a new state on rank 0 (*out NULL elsewhere). Every rank joins every gather,
 * whatever failed on rank 0. local: this rank's own whole buffers, no collective (unsharded). */
static ddp_status state_from_model(const train_setup *s, int local, ddp_state **out)
{
    const train_buffers *b = &s->buf;
    size_t n = b->numel;
    int root = local || ddp_rank(s->ctx) == 0, sharded = !local && opt_sharded(s);
    *out = NULL;
    float *host = root ? malloc(n * sizeof *host) : NULL;
    ddp_status st = !root || host ? DDP_OK : DDP_ERR_NOMEM;
    for (int i = 0; i < b->n_opt; i++) {
        if (sharded) /* every rank joins, whatever failed on rank 0 */
            train_must(s->ctx, ddp_shard_gather(s->ctx, n, b->opt[i], st == DDP_OK ? host : NULL,
                                                STATE_CHUNK), "gathering the shards");
        else if (root && st == DDP_OK)
            st = ddp_download(s->ctx, host, b->opt[i], n * sizeof *host);
        if (root && st == DDP_OK)
            st = i == 0 ? ddp_state_create(b->descs, b->n_params, host, out)
                        : ddp_state_set_f32(*out, b->opt_names[i], host, n);
    }
    if (st != DDP_OK && *out) {
        ddp_state_destroy(*out);
        *out = NULL;
    }
    free(host);
    return st;
}

/* Counters and fingerprint texts. */
static ddp_status state_add_position(const train_setup *s, train_pos p, ddp_state *st)
{
    if (p.step_in_epoch >= s->steps_per_epoch) { /* a finished epoch: the next one is in progress */
        p.epoch++;
        p.step_in_epoch = 0;
    }
    const struct { const char *name; uint64_t value; } counters[] = {
        {"step", (uint64_t)p.step}, {"epoch", (uint64_t)p.epoch},
        {"step_in_epoch", (uint64_t)p.step_in_epoch}, {"sampler_seed", s->o->seed},
        {"sampler_epoch", (uint64_t)p.epoch}, {"augment_seed", s->o->seed},
        {"augment_epoch", (uint64_t)p.epoch}, {"lr_step", (uint64_t)p.step},
        {"lr_total_steps", (uint64_t)s->total_steps},
        {"world_size", (uint64_t)ddp_world_size(s->ctx)},
    };
    double scale = 1.0;
    int64_t good_steps = 0;
    if (s->scaler)
        ddp_scaler_get_state(s->scaler, &scale, &good_steps);
    ddp_status rc = ddp_state_set_f64(st, "loss_scale", scale);
    if (rc == DDP_OK)
        rc = ddp_state_set_u64(st, "loss_scale_good_steps", (uint64_t)good_steps);
    for (size_t i = 0; rc == DDP_OK && i < sizeof counters / sizeof counters[0]; i++)
        rc = ddp_state_set_u64(st, counters[i].name, counters[i].value);
    fp_entry fp[STATE_FP_MAX];
    int n = state_fingerprint(s, fp);
    for (int i = 0; rc == DDP_OK && i < n; i++)
        rc = ddp_state_set_text(st, fp[i].key, fp[i].value);
    return rc;
}

/* Collective: the whole training state at pos on rank 0 (*out; NULL on the other ranks). */
static ddp_status whole_state(const train_setup *s, const train_pos *pos, ddp_state **out)
{
    ddp_status rc = state_from_model(s, 0, out);
    if (ddp_rank(s->ctx) == 0 && rc == DDP_OK)
        rc = state_add_position(s, *pos, *out);
    return rc;
}

/* ---- rescue snapshots (elastic: libddp's ddp_rescue_*) --------------------------------------- */

static train_pos rescue_pos; /* the position of the last completed step (train_rescue_release) */

/* ddp_rescue_arm's fn, in the watchdog's thread with the state settled: this rank's own whole
 * state, no collective. */
static ddp_status rescue_state(void *arg, long step, ddp_state **out)
{
    const train_setup *s = arg;
    ddp_status rc = state_from_model(s, 1, out);
    if (rc == DDP_OK && rescue_pos.step == step)
        rc = state_add_position(s, rescue_pos, *out);
    else if (rc == DDP_OK)
        rc = DDP_ERR_STATE;
    return rc;
}

void train_rescue_release(const train_pos *pos)
{
    rescue_pos = *pos;
    ddp_rescue_release(pos->step);
}

void train_rescue_arm(const train_setup *s, const train_pos *pos)
{
    const char *dir = s->o->snapshot_dir, *off = NULL;
    if (!dir)
        return;
    if (ddp_local_rank(s->ctx) == 0 && ddp_rescue_clear(dir) > 0) /* loaded, or older than that */
        DDP_INFO("removed the rescue snapshots in %s", dir);
    if (opt_sharded(s))
        off = "--zero shards the optimizer: a lost rank's shard goes with it";
    else if (ddp_backend(s->ctx) != DDP_BACKEND_CPU)
        off = "on the CPU only so far";
    rescue_pos = *pos;
    if (!off && ddp_rescue_arm(s->ctx, dir, pos->step, rescue_state, (void *)s) != DDP_OK)
        off = "the folder cannot be used (see above)";
    if (ddp_rank(s->ctx) != 0)
        return;
    if (off)
        printf("elastic: no rescue snapshots (%s): a restart resumes from the newest checkpoint in "
               "%s\n", off, s->o->checkpoint_dir);
    else
        printf("elastic: rescue snapshots in %s (a lost peer: each node's survivors leave the last "
               "step; a restart resumes from it, else from %s)\n", dir, s->o->checkpoint_dir);
}

ddp_status train_save_state(const train_setup *s, const train_pos *pos, const char *path)
{
    ddp_state *st = NULL;
    ddp_status rc = whole_state(s, pos, &st);
    if (ddp_rank(s->ctx) != 0)
        return rc;
    errno = 0;
    if (rc == DDP_OK)
        rc = ddp_state_save(st, path);
    int err = errno;
    ddp_state_destroy(st);
    errno = rc == DDP_ERR_IO ? err : 0; /* the system's reason of a failed save (e.g. ENOSPC), kept
                                           for the callers' messages: DDP_ERR_IO alone says less */
    return rc;
}

/* The staging copy (libddp's ddp_ckpt_stage): this rank's ddp_shard_range slice of every optimizer
 * buffer (its --zero shard when they are sharded, else the same slice of the replicated buffer),
 * plus the position and fingerprint (state_add_position), kept for the run: allocated at start-up
 * with --checkpoint-async (page-locked, the copies queued on a side stream, the optimizer's next
 * step waiting for them on the GPU: optim.c's ddp_snapshot_fence), else at a save and freed after
 * it. The background write reads it, so the next save waits for that write first. */
static ddp_ckpt_stage *stage;

static void stage_free(void)
{
    ddp_ckpt_stage_destroy(stage);
    stage = NULL;
}

/* The staging copy's memory, once (kept by later calls); DDP_ERR_NOMEM. */
static ddp_status stage_alloc(const train_setup *s)
{
    if (stage)
        return DDP_OK;
    return ddp_ckpt_stage_create(s->ctx, s->buf.numel, s->buf.opt_names, s->buf.n_opt,
                                 s->o->checkpoint_async, &stage);
}

/* Rank 0, once (--checkpoint-async): prints the staging copy's size, since that host memory stays
 * allocated for the whole run (every save reuses it) and counts against the job's memory. */
static void stage_report(const train_setup *s, const char *when)
{
    static int reported;
    size_t off, n;
    ddp_ckpt_stage_range(stage, &off, &n);
    if (ddp_rank(s->ctx) != 0 || !stage || reported++)
        return;
    printf("--checkpoint-async: each rank copies its shard to host memory for the background write, "
           "into staging memory allocated %s and kept for every save: %.1f MiB on rank 0 (%zu values "
           "of each buffer)\n", when, (double)ddp_ckpt_stage_bytes(stage) / (1 << 20), n);
    fflush(stdout);
}

/* The staging copy of this rank's shard at pos: each buffer's copy queued once, into the state
 * (the writer waits for the copies; the next optimizer step too, on the GPU). */
static ddp_status stage_shard(const train_setup *s, train_pos pos)
{
    const train_buffers *b = &s->buf;
    size_t off, n;
    ddp_status st = stage_alloc(s);
    ddp_ckpt_stage_range(stage, &off, &n);
    for (int i = 0; st == DDP_OK && i < b->n_opt; i++) /* from the range, at the slice */
        st = ddp_ckpt_stage_copy(stage, s->ctx, i, b->opt[i] + (off - b->opt_offset));
    if (st == DDP_OK)
        st = state_add_position(s, pos, ddp_ckpt_stage_state(stage));
    return st;
}

/* Why a save failed, for a message: the system's reason (errno, set by train_save_state) for
 * DDP_ERR_IO, else the status's text. */
static const char *save_error(ddp_status st)
{
    return st == DDP_ERR_IO && errno != 0 ? strerror(errno) : ddp_strerror(st);
}

/* Rank 0: the saves of this run that failed (--checkpoint-errors warn tells the first in full). */
static long saves_failed;

/* Rank 0: a failed save, with the system's reason and what to do about it; with
 * --checkpoint-errors warn the first in full, each later one in a line with the count. */
static void report_failed_save(const train_setup *s, const char *path, long step, ddp_status st)
{
    int err = st == DDP_ERR_IO ? errno : 0;
    const char *why = save_error(st);
    saves_failed++;
    if (!s->o->checkpoint_errors_warn)
        DDP_ERROR("checkpoint %s at step %ld failed: %s; the previous checkpoints are kept (%s, "
                  "or use another --checkpoint-dir, or --checkpoint-errors warn to go on)", path,
                  step, why, out_path_advice(err));
    else if (saves_failed == 1)
        DDP_ERROR("checkpoint %s at step %ld failed: %s; the previous checkpoints are kept (%s, "
                  "or use another --checkpoint-dir); training goes on (--checkpoint-errors warn), "
                  "each later failed save is counted in a line", path, step, why,
                  out_path_advice(err));
    else
        DDP_WARN("checkpoint %s at step %ld failed too: %s (%ld failed saves so far)", path, step,
                 why, saves_failed);
}

/* ---- the checkpoint folder (libddp's checkpoint manager) ---------------------------------------- */

/* --checkpoint-dir's manager: created at its first use (every rank, or rank 0 alone to resume),
 * destroyed at exit, which waits for a save written in the background (a stop by signal ends the
 * run with its save in flight: this rank's write finishes, and rank 0's MANIFEST once the others'
 * files are there; no collective: the ranks may be gone). */
static ddp_ckpt_manager *manager;

void train_checkpoints_end(void)
{
    ddp_ckpt_manager_destroy(manager);
    manager = NULL;
}

static ddp_ckpt_manager *state_manager(const train_setup *s)
{
    if (manager)
        return manager;
    train_must(s->ctx, ddp_ckpt_manager_create(s->ctx, s->o->checkpoint_dir, s->o->keep,
                                               s->o->checkpoint_async, &manager),
               "creating the checkpoint manager");
    atexit(train_checkpoints_end);
    return manager;
}

/* Collective, --checkpoint-format folder: the save in flight ends (the staging copy is free then),
 * every rank stages its shard, and the manager writes the folder: in the background when asked
 * (--checkpoint-async, except at the end of the run, where nothing is left to overlap), else at
 * once. The failure of the save before is returned first. */
static ddp_status save_folder(const train_setup *s, const train_pos *pos, int background)
{
    ddp_ckpt_manager *m = state_manager(s);
    ddp_status prev = ddp_ckpt_manager_wait(m);
    int prev_err = errno;
    ddp_status staged = stage_shard(s, *pos);
    if (s->o->checkpoint_async)
        stage_report(s, "at the first save");
    const ddp_state *shard = staged == DDP_OK ? ddp_ckpt_stage_state(stage) : NULL;
    ddp_status st = ddp_ckpt_manager_save(m, pos->step, shard, s->buf.descs, s->buf.n_params,
                                          background);
    int err = errno;
    if (staged != DDP_OK && st != DDP_OK)
        st = staged;
    if (!s->o->checkpoint_async) /* a synchronous save keeps no memory between saves */
        stage_free();
    errno = prev != DDP_OK ? prev_err : err;
    return prev != DDP_OK ? prev : st;
}

/* Collective, --checkpoint-format file: rank 0 gathers the state and writes it as the step's
 * file, then prunes the folder as the manager's saves do. */
static ddp_status save_file(const train_setup *s, const train_pos *pos, const char *path)
{
    /* this step saved as a folder before: removed first (if that fails, logged, the save's rename
     * fails and is reported as any failed save is) */
    if (ddp_rank(s->ctx) == 0 && ddp_checkpoint_is_folder(path))
        ddp_ckpt_manager_remove(state_manager(s), pos->step);
    ddp_status rc = train_save_state(s, pos, path);
    if (ddp_rank(s->ctx) == 0 && rc == DDP_OK)
        ddp_ckpt_manager_prune(state_manager(s));
    return rc;
}

ddp_status train_checkpoint(const train_setup *s, const train_pos *pos)
{
    char path[STATE_PATH_MAX];
    ddp_ckpt_manager_path(state_manager(s), pos->step, path, sizeof path);
    double t0 = train_now();
    int background = s->o->checkpoint_async && pos->step < s->total_steps;
    ddp_status st = s->o->checkpoint_folder ? save_folder(s, pos, background) : save_file(s, pos, path);
    double took = train_now() - t0;
    if (ddp_rank(s->ctx) != 0) {
        if (st != DDP_OK)
            DDP_ERROR("checkpoint %s at step %ld: this rank's file failed: %s", path, pos->step,
                      save_error(st));
        return st;
    }
    if (st != DDP_OK) {
        report_failed_save(s, path, pos->step, st);
        return st;
    }
    if (background)
        printf("checkpoint %s (step %ld): staged in %.3f s, writing in the background\n", path,
               pos->step, took);
    else if (s->o->checkpoint_folder)
        printf("checkpoint %s (step %ld): %.3f s, the slowest rank's file %.3f s\n", path, pos->step,
               took, ddp_ckpt_manager_slowest_write(manager));
    else
        printf("checkpoint %s (step %ld): %.3f s\n", path, pos->step, took);
    fflush(stdout);
    return DDP_OK;
}

/* ---- writability before training ------------------------------------------------------------- */

/* --save, --trace or --save-llmc FILE: common/out_path's rule (the file a save may replace), and
 * its folder accepts a new file. */
static ddp_status check_output_file(const char *flag, const char *path)
{
    char why[1024];
    int rc = out_path_check(path, why, sizeof why);
    if (rc != OUT_PATH_OK)
        DDP_ERROR("%s %s%s (checked before training, so nothing is lost)", flag, path, why);
    return rc == OUT_PATH_OK ? DDP_OK : rc == OUT_PATH_REFUSED ? DDP_ERR_INVALID_ARG : DDP_ERR_IO;
}

ddp_status train_check_outputs(const train_opts *o, const char *const *flags,
                               const char *const *paths, int n)
{
    /* --checkpoint-dir was created, locked and written into at start-up (checkpoint_place.c) */
    ddp_status st = DDP_OK;
    if (o->save_path)
        st = check_output_file("--save", o->save_path);
    if (st == DDP_OK && o->trace_path)
        st = check_output_file("--trace", o->trace_path);
    for (int i = 0; st == DDP_OK && i < n; i++)
        if (paths[i])
            st = check_output_file(flags[i], paths[i]);
    return st;
}

/* ---- resuming -------------------------------------------------------------------------------- */

/* A checkpoint that is opened: a file read whole (rank 0), or a folder whose MANIFEST and file
 * tables are read (the values stay on disk until every rank reads its part). */
typedef struct resume_src {
    ddp_state *file;
    ddp_ckpt_dir *dir;
} resume_src;

/* The state to check: the file's, or the folder's (its buffers' counts without values). */
static const ddp_state *src_state(const resume_src *r)
{
    return ddp_checkpoint_state(r->file, r->dir);
}

static void src_close(resume_src *r)
{
    ddp_state_destroy(r->file);
    ddp_ckpt_dir_close(r->dir);
    *r = (resume_src){0};
}

/* Opens the checkpoint file or folder at path. */
static ddp_status src_open(const char *path, resume_src *r)
{
    return ddp_checkpoint_open(path, 0, &r->file, &r->dir);
}

/* Rank 0, --resume auto: opens the newest valid checkpoint of the folder older than step *below
 * (ddp_ckpt_manager_newest; path written to `path`, its step to *below); *out stays empty when the
 * folder has none. A folder's files are checked against their CRC only when every rank reads them
 * (load_folder): one that fails there is skipped by calling this again with *below at its step. */
static ddp_status find_newest(const train_setup *s, char *path, resume_src *out, long *below)
{
    long step = -1;
    ddp_status st = ddp_ckpt_manager_newest(state_manager(s), *below, &step, path, STATE_PATH_MAX,
                                            &out->file, &out->dir);
    if (step >= 0)
        *below = step;
    return st;
}

/* Rank 0: the checkpoint's signature and buffers fit the model. */
static ddp_status check_buffers(const train_setup *s, const ddp_state *st, const char *path)
{
    const train_buffers *b = &s->buf;
    int n = b->n_params;
    int same = ddp_state_n_params(st) == n && ddp_state_numel(st) == b->numel;
    for (int i = 0; same && i < n; i++)
        same = memcmp(&ddp_state_descs(st)[i], &b->descs[i], sizeof(ddp_param_desc)) == 0;
    if (!same) {
        DDP_ERROR("--resume %s: the checkpoint holds another model (%d parameters, %zu values; this "
                  "run has %d, %zu): use the same --model and sizes", path, ddp_state_n_params(st),
                  ddp_state_numel(st), n, b->numel);
        return DDP_ERR_MISMATCH;
    }
    uint64_t v;
    int whole = ddp_state_u64(st, "step", &v) && ddp_state_u64(st, "epoch", &v) &&
                ddp_state_u64(st, "step_in_epoch", &v) && ddp_state_u64(st, "world_size", &v);
    for (int i = 1; whole && i < b->n_opt; i++) { /* 0: "params", the state's own */
        size_t n_opt = 0; /* a folder's state has the counts without the values */
        ddp_state_f32(st, b->opt_names[i], &n_opt);
        whole = n_opt == b->numel;
    }
    if (!whole) {
        DDP_ERROR("--resume %s: the file holds parameters only, not a training state (optimizer "
                  "buffers and position): resume from a checkpoint written by --checkpoint-dir or "
                  "--save", path);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* Rank 0: the position to continue from; converted through the samples consumed when the world
 * size changed (--resume-reshard). */
static train_pos read_position(const train_setup *s, const ddp_state *st)
{
    uint64_t step = 0, epoch = 0, in_epoch = 0, world = 1;
    ddp_state_u64(st, "step", &step);
    ddp_state_u64(st, "epoch", &epoch);
    ddp_state_u64(st, "step_in_epoch", &in_epoch);
    ddp_state_u64(st, "world_size", &world);
    train_pos p = {.step = (long)step, .epoch = (long)epoch, .step_in_epoch = (long)in_epoch};
    long now = ddp_world_size(s->ctx);
    if ((long)world == now || s->fixed.flag) { /* a fixed global batch: the same steps */
        if ((long)world != now)
            DDP_WARN("--%s %ld: %llu ranks wrote the checkpoint, %ld run now, each step on the "
                     "same %s (summed in another order)", s->fixed.flag, s->fixed.value,
                     (unsigned long long)world, now, s->fixed.unit);
        return p;
    }
    p.step_in_epoch = (long)((in_epoch * world + (uint64_t)now - 1) / (uint64_t)now);
    if (p.step_in_epoch > s->steps_per_epoch)
        p.step_in_epoch = s->steps_per_epoch;
    p.step = p.epoch * s->steps_per_epoch + p.step_in_epoch;
    DDP_WARN("--resume-reshard: %llu ranks wrote the checkpoint, %ld run now: continuing at step %ld "
             "(epoch %ld, step %ld of it); the run is no longer bit-identical to an uninterrupted one",
             (unsigned long long)world, now, p.step, p.epoch + 1, p.step_in_epoch);
    return p;
}

/* Why the rescue snapshot's state is not this run's (another model or configuration; the world
 * size may differ), in why; NULL when it is. */
static const char *rescue_foreign(const train_setup *s, const ddp_state *st, char *why, size_t n)
{
    if (ddp_state_numel(st) != s->buf.numel || ddp_state_n_params(st) != s->buf.n_params)
        return snprintf(why, n, "another model"), why;
    fp_entry fp[STATE_FP_MAX];
    int k = state_fingerprint(s, fp);
    for (int i = 0; i < k; i++) {
        const char *theirs = ddp_state_text(st, fp[i].key);
        if (!fp[i].reshardable && (!theirs || strcmp(theirs, fp[i].value) != 0))
            return snprintf(why, n, "%s is %s there, %s in this run", fp[i].key + 7,
                            theirs ? theirs : "missing", fp[i].value), why;
    }
    return NULL;
}

/* Rank 0, --resume auto with --snapshot-dir: the newest rescue snapshot this run can load that is
 * newer than the disk checkpoint in *out (step *below) replaces it; others are skipped, said. */
static void prefer_rescue(const train_setup *s, char *path, resume_src *out, long *below)
{
    long *steps = NULL, disk = src_state(out) ? *below : -1;
    size_t n = 0;
    if (ddp_rescue_list(s->o->snapshot_dir, &steps, &n) != DDP_OK)
        DDP_WARN("--snapshot-dir %s cannot be listed: %s", s->o->snapshot_dir, strerror(errno));
    for (size_t i = 0; i < n && steps[i] > disk; i++) {
        char p[STATE_PATH_MAX], why[256];
        resume_src r = {0};
        const char *bad = "unreadable or corrupt (see above)";
        ddp_rescue_path(s->o->snapshot_dir, steps[i], p, sizeof p);
        if (src_open(p, &r) == DDP_OK && !(bad = rescue_foreign(s, src_state(&r), why, sizeof why))) {
            if (disk >= 0)
                printf("--resume auto: the rescue snapshot of step %ld is newer than the disk "
                       "checkpoint of step %ld\n", steps[i], disk);
            src_close(out);
            *out = r;
            *below = steps[i];
            snprintf(path, STATE_PATH_MAX, "%s", p);
            break;
        }
        DDP_WARN("--resume auto: skipping the rescue snapshot %s: %s; falling back to an older one "
                 "or the disk checkpoint", p, bad);
        src_close(&r);
    }
    free(steps);
}

/* Rank 0: finds, opens and checks the checkpoint (--resume auto: the newest older than step
 * *below; see find_newest); *out empty for a fresh start. */
static ddp_status open_resume(const train_setup *s, char *path, resume_src *out, long *below)
{
    const train_opts *o = s->o;
    ddp_status st;
    *out = (resume_src){0};
    if (strcmp(o->resume, "auto") == 0) {
        long tried = *below;
        st = find_newest(s, path, out, below);
        if (st == DDP_OK && o->snapshot_dir && tried == LONG_MAX)
            prefer_rescue(s, path, out, below);
        if (st == DDP_OK && !src_state(out) && tried == LONG_MAX) {
            printf("--resume auto: no checkpoint in %s: starting fresh\n", o->checkpoint_dir);
        } else if (st == DDP_OK && !src_state(out)) { /* never a fresh start past a corrupt one */
            DDP_ERROR("--resume auto: no valid checkpoint in %s older than step %ld, whose folder "
                      "cannot be used: move them away to start fresh", o->checkpoint_dir, tried);
            st = DDP_ERR_FORMAT;
        }
    } else {
        snprintf(path, STATE_PATH_MAX, "%s", o->resume);
        st = src_open(path, out);
        if (st != DDP_OK)
            DDP_ERROR("--resume %s: cannot use this %s (see above)", path,
                      ddp_checkpoint_is_folder(path) ? "folder" : "file");
    }
    int other_world = 0;
    if (st == DDP_OK && src_state(out))
        st = check_buffers(s, src_state(out), path);
    if (st == DDP_OK && src_state(out))
        st = check_fingerprint(s, src_state(out), path, &other_world);
    if (st != DDP_OK)
        src_close(out);
    return st;
}

/* Broadcasts n_bytes of host memory from rank 0, through backend memory. */
static void bcast_host(ddp_ctx *ctx, void *host, size_t n_bytes)
{
    void *dev = ddp_alloc(ctx, n_bytes);
    train_must(ctx, dev ? DDP_OK : DDP_ERR_NOMEM, "allocating a broadcast buffer");
    train_must(ctx, ddp_upload(ctx, dev, host, n_bytes), "uploading the resume header");
    train_must(ctx, ddp_broadcast(ctx, dev, n_bytes, 0), "broadcasting the resume header");
    train_must(ctx, ddp_download(ctx, host, dev, n_bytes), "downloading the resume header");
    ddp_free(ctx, dev);
}

/* Rank 0 uploads the checkpoint's buffers; every rank receives them (its shard of the optimizer
 * buffers when they are sharded). */
static void bcast_buffers(const train_setup *s, const ddp_state *st)
{
    const train_buffers *b = &s->buf;
    size_t bytes = b->numel * sizeof(float);
    for (int i = 0; i < b->n_opt; i++) {
        const float *host = !st ? NULL : i == 0 ? ddp_state_params(st)
                                                : ddp_state_f32(st, b->opt_names[i], NULL);
        if (opt_sharded(s)) {
            train_must(s->ctx, ddp_range_broadcast(s->ctx, b->numel, host, b->opt_offset, b->opt_n,
                                                   b->opt[i], STATE_CHUNK * 4),
                       "broadcasting the checkpoint's shards");
            continue;
        }
        if (host)
            train_must(s->ctx, ddp_upload(s->ctx, b->opt[i], host, bytes), "uploading optimizer state");
        train_must(s->ctx, ddp_broadcast(s->ctx, b->opt[i], bytes, 0), "broadcasting optimizer state");
    }
}

/* This rank's reads: its ddp_shard_range slice of every buffer (under --zero, its own shard). */
static ddp_status read_shares(const train_setup *s, const ddp_ckpt_dir *d)
{
    const train_buffers *b = &s->buf;
    size_t off, n;
    ddp_shard_range(b->numel, ddp_world_size(s->ctx), ddp_rank(s->ctx), &off, &n);
    ddp_status st = DDP_OK; /* sharded, the slice is the --zero shard: the whole range */
    for (int i = 0; st == DDP_OK && i < b->n_opt; i++)
        st = ddp_ckpt_dir_read_dev(s->ctx, d, b->opt_names[i], off, n,
                                   b->opt[i] + (off - b->opt_offset));
    return st;
}

/* Collective, resuming from the checkpoint folder path (d: rank 0's open folder; the other ranks
 * open it): every rank checks the CRC-32 of files rank, rank + world, ... and reads only the byte
 * ranges it needs (resharded to this run's ranks and --zero stage: the ranges are offsets into
 * the flat buffers), then the replicated buffers' ranges are broadcast. Same status on every rank. */
static ddp_status load_folder(const train_setup *s, const char *path, const ddp_ckpt_dir *d0, int is_auto)
{
    int rank = ddp_rank(s->ctx), world = ddp_world_size(s->ctx);
    ddp_ckpt_dir *mine = NULL;
    ddp_status st = rank == 0 ? DDP_OK : ddp_ckpt_dir_open(path, &mine);
    const ddp_ckpt_dir *d = rank == 0 ? d0 : mine;
    for (int i = rank; st == DDP_OK && i < ddp_ckpt_dir_n_files(d); i += world)
        st = ddp_ckpt_dir_verify_file(d, i);
    if (st == DDP_OK)
        st = read_shares(s, d);
    int64_t *flags = malloc((size_t)world * sizeof *flags);
    train_must(s->ctx, flags ? DDP_OK : DDP_ERR_NOMEM, "allocating the resume flags");
    int64_t failed = 0;
    train_must(s->ctx, ddp_agree_failed(s->ctx, st != DDP_OK, flags, &failed),
               "agreeing on the checkpoint's files");
    if (rank == 0)
        ddp_log_failed_ranks(flags, world, "--resume: reading the checkpoint folder");
    free(flags);
    ddp_ckpt_dir_close(mine);
    if (failed) {
        if (is_auto && rank == 0)
            DDP_WARN("--resume auto: skipping %s: a file of it cannot be used (see the messages "
                     "above); trying the previous checkpoint", path);
        else if (!is_auto)
            DDP_ERROR("--resume %s: the folder cannot be used (see the messages above); move it away "
                      "to resume from the previous checkpoint", path);
        return st != DDP_OK ? st : DDP_ERR_FORMAT;
    }
    for (int i = 0; i < s->buf.n_opt && !opt_sharded(s); i++)
        train_must(s->ctx, ddp_shard_allgather(s->ctx, s->buf.numel, s->buf.opt[i]),
                   "broadcasting a checkpoint's ranges");
    return DDP_OK;
}

/* Collective, one try: rank 0 opens the checkpoint (--resume auto: the newest older than step
 * *below), every rank loads it. head: status, resumed, step, epoch, step_in_epoch, a folder; the
 * same on every rank. *folder_failed: a folder whose files failed to read (every rank). */
static void resume_try(const train_setup *s, int64_t head[6], char *path, resume_src *src, long *below,
                       int *folder_failed)
{
    const ddp_state *st = NULL;
    *folder_failed = 0;
    if (ddp_rank(s->ctx) == 0) {
        head[0] = open_resume(s, path, src, below);
        st = src_state(src);
        train_pos p = st ? read_position(s, st) : (train_pos){0};
        head[1] = st != NULL;
        head[2] = p.step;
        head[3] = p.epoch;
        head[4] = p.step_in_epoch;
        head[5] = src->dir != NULL;
    }
    double scaler_state[2] = {1.0, 0.0}; /* loss scale, finite steps since its last change */
    if (st) {
        uint64_t good = 0;
        ddp_state_f64(st, "loss_scale", &scaler_state[0]);
        ddp_state_u64(st, "loss_scale_good_steps", &good);
        scaler_state[1] = (double)good;
    }
    bcast_host(s->ctx, head, 6 * sizeof *head);
    bcast_host(s->ctx, scaler_state, sizeof scaler_state);
    if (head[1] && head[5]) {
        bcast_host(s->ctx, path, STATE_PATH_MAX);
        ddp_status lf = load_folder(s, path, src->dir, strcmp(s->o->resume, "auto") == 0);
        *folder_failed = head[0] == DDP_OK && lf != DDP_OK;
        head[0] = head[0] == DDP_OK ? lf : head[0];
    } else if (head[1]) {
        bcast_buffers(s, src->file);
    }
    if (head[1] && head[0] == DDP_OK && s->scaler &&
        ddp_scaler_set_state(s->scaler, scaler_state[0], (int64_t)scaler_state[1]) != DDP_OK) {
        DDP_ERROR("--resume: the checkpoint's loss scale %g after %.0f finite steps does not fit this "
                  "run's scaler (see above): resume with the same --loss-scale-interval",
                  scaler_state[0], scaler_state[1]);
        head[0] = DDP_ERR_MISMATCH;
    }
}

ddp_status train_resume(const train_setup *s, train_pos *pos, int *resumed)
{
    *pos = (train_pos){0};
    *resumed = 0;
    if (s->o->checkpoint_async && s->o->checkpoint_dir) { /* the staging copy before training */
        if (stage_alloc(s) != DDP_OK)
            DDP_WARN("--checkpoint-async: no memory for the staging copy of the saves now; the first "
                     "save tries again");
        stage_report(s, "at start-up");
    }
    if (!s->o->resume)
        return DDP_OK;
    int64_t head[6];
    resume_src src = {0};
    char path[STATE_PATH_MAX] = "";
    long below = LONG_MAX; /* rank 0, --resume auto: only checkpoints older than this step */
    int folder_failed = 0;
    /* --resume auto: a folder whose MANIFEST is fine but one of whose files fails its CRC (a flipped
     * bit) or cannot be read shows it only when the ranks read the files in parallel; it is then
     * skipped like a corrupt file, and the previous checkpoint loaded (every rank rewrites all of
     * its buffers, so the failed try leaves nothing behind). */
    do {
        src_close(&src);
        head[0] = DDP_OK;
        head[1] = head[2] = head[3] = head[4] = head[5] = 0;
        resume_try(s, head, path, &src, &below, &folder_failed);
    } while (folder_failed && strcmp(s->o->resume, "auto") == 0);
    if (head[1] && head[0] == DDP_OK && ddp_rank(s->ctx) == 0)
        printf("resumed from %s at step %lld (epoch %lld, %lld steps into it)\n", path,
               (long long)head[2], (long long)head[3] + 1, (long long)head[4]);
    const char *gen = getenv("DDP_ELASTIC_GENERATION"), *cause = NULL;
    char phases[256];
    if (head[0] == DDP_OK && ddp_rank(s->ctx) == 0 && gen && strcmp(gen, "0") != 0) {
        double all = ddp_rescue_phases(s->ctx, head[1] ? src.file : NULL, phases, sizeof phases);
        if (head[1] && (cause = ddp_state_text(src.file, "rescue.cause")) != NULL)
            printf("elastic: generation %s: %.2f s from the failure's detection to this resume "
                   "(%s; the step in flight is redone)\n", gen, all, cause);
        printf("elastic: generation %s phases: %s\n", gen, phases);
    }
    src_close(&src);
    *pos = (train_pos){.step = head[2], .epoch = head[3], .step_in_epoch = head[4]};
    *resumed = (int)head[1];
    if (head[0] != DDP_OK && ddp_rank(s->ctx) != 0)
        DDP_ERROR("rank 0 cannot resume (see its messages); exiting");
    return (ddp_status)head[0];
}
