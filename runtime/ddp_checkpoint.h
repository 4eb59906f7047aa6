/* ddp_checkpoint.h - checkpoints: the training state in a documented file format, saved atomically, read back, listed.
 *
 * Part of libddp's public interface, installed beside ddp.h: programs that use checkpoints include it
 * (it includes ddp.h, whose types it uses).
 */
#ifndef DDP_CHECKPOINT_H
#define DDP_CHECKPOINT_H

#include "ddp.h"

/* The first 8 bytes of every checkpoint file (a folder's rank files too): how a program tells a
 * ddp checkpoint from its other files. */
#define DDP_CKPT_MAGIC "DDPCKPT1"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Checkpoints: the training state in a documented file format (magic DDP_CKPT_MAGIC, version 2,
 * 64-bit offsets, CRC-32; see runtime/checkpoint.c). libddp knows no model or optimizer: a state
 * holds the parameters with their signature, plus any named entries the program adds: float
 * arrays (optimizer buffers such as "momentum"), 64-bit counters ("step", "epoch", ...), doubles
 * ("loss_scale") and short texts (a configuration fingerprint). Names are 1..DDP_NAME_MAX-1 bytes.
 * Version 1 files (parameters only) are still read.
 */
typedef struct ddp_state ddp_state;

typedef enum ddp_state_kind {
    DDP_STATE_SIGNATURE = 1, /* the parameter descriptors ("signature", always entry 0) */
    DDP_STATE_F32 = 2,       /* float array ("params", always entry 1, and the program's) */
    DDP_STATE_U64 = 3,       /* one unsigned 64-bit counter */
    DDP_STATE_F64 = 4,       /* one double */
    DDP_STATE_TEXT = 5       /* text of at most 4096 bytes */
} ddp_state_kind;

/* A new state holding copies of the descriptors and the parameter values (host memory);
 * params_host NULL: zeros, for the program to fill in place (ddp_state_f32_buffer "params").
 * DDP_ERR_INVALID_ARG for a NULL descs or out, n_params < 1 or a bad descriptor, DDP_ERR_NOMEM;
 * *out is NULL then (untouched when out itself is NULL). */
DDP_API ddp_status ddp_state_create(const ddp_param_desc *descs, int n_params,
                                    const float *params_host, ddp_state **out);
/* NULL is ignored. */
DDP_API void ddp_state_destroy(ddp_state *s);
/* Add or replace a named entry (values are copied); an entry of the same name and another kind is
 * replaced, except "signature" and "params". DDP_ERR_INVALID_ARG for a NULL state, a bad name,
 * "signature"/"params" with another kind, NULL values with n > 0, a NULL text or one over 4096
 * bytes, or when the entry table cannot grow (4096 entries, or no memory for it); DDP_ERR_NOMEM
 * when the values cannot be copied. On failure the state is unchanged. */
DDP_API ddp_status ddp_state_set_f32(ddp_state *s, const char *name, const float *values, size_t n);
DDP_API ddp_status ddp_state_set_u64(ddp_state *s, const char *name, uint64_t value);
DDP_API ddp_status ddp_state_set_f64(ddp_state *s, const char *name, double value);
DDP_API ddp_status ddp_state_set_text(ddp_state *s, const char *name, const char *text);
/* Setting an entry to a value of the same kind and size (the same count; a text of the same
 * length) copies it into the entry's memory: a state kept from one save to the next allocates
 * nothing.
 *
 * The staging copy of an asynchronous save without a copy of the copy: *values is the float entry
 * `name`'s own memory of n values for the program to write into (e.g. ddp_download straight into
 * it), valid as the getters' pointers. The entry is kept with its values when it has n values
 * already (so a staging state allocated once is reused between saves), else it is added (or
 * replaces the entry of that name) with n zeros, written once so its memory is mapped then and not
 * at the next save. DDP_ERR_INVALID_ARG for a NULL state or values, a bad name, "signature", or
 * "params" with another count than the signature's, DDP_ERR_NOMEM; on failure the state and
 * *values are unchanged. */
DDP_API ddp_status ddp_state_f32_buffer(ddp_state *s, const char *name, size_t n, float **values);

/* Getters; they never fail. The f32 getter returns NULL (and *n = 0; n may be NULL) when there is
 * no float entry of that name; u64/f64 return 1 and set *value (when value is not NULL) when the
 * entry exists with that kind, else 0; text returns NULL when absent. Pointers stay valid until
 * the entry is replaced or the state destroyed. A NULL state has no entries: version 0, 0
 * parameters and elements, NULL descriptors and values, no named entry.
 * ddp_state_version: 1 or 2, the format the state came from (2 for a created state). */
DDP_API int ddp_state_version(const ddp_state *s);
DDP_API int ddp_state_n_params(const ddp_state *s);
DDP_API const ddp_param_desc *ddp_state_descs(const ddp_state *s);
DDP_API const float *ddp_state_params(const ddp_state *s);
DDP_API size_t ddp_state_numel(const ddp_state *s);
DDP_API const float *ddp_state_f32(const ddp_state *s, const char *name, size_t *n);
DDP_API int ddp_state_u64(const ddp_state *s, const char *name, uint64_t *value);
DDP_API int ddp_state_f64(const ddp_state *s, const char *name, double *value);
DDP_API const char *ddp_state_text(const ddp_state *s, const char *name);
/* Entry i (0 <= i < ddp_state_n_entries) for listings: its name (valid as the getters' pointers),
 * kind and count. DDP_ERR_INVALID_ARG out of range or for a NULL argument (outputs untouched). */
DDP_API int ddp_state_n_entries(const ddp_state *s);
DDP_API ddp_status ddp_state_entry_info(const ddp_state *s, int i, const char **name,
                                        ddp_state_kind *kind, uint64_t *count);

/* Writes s to path atomically: removes stale "*.tmp.PID" files of dead processes in the folder
 * (only empty ones or ones starting with the checkpoint magic), writes PATH.tmp.<pid>, fsyncs,
 * renames over path, fsyncs the folder. path must be new or a regular file (a symbolic link is
 * followed to the file it names); a folder, device, FIFO, socket or dangling link is refused with
 * DDP_ERR_INVALID_ARG. On failure (DDP_ERR_IO: the log names the path and the system's reason,
 * e.g. "No space left on device", and errno holds it) the existing path is left as it was and the
 * temporary file is removed. */
DDP_API ddp_status ddp_state_save(const ddp_state *s, const char *path);
/* Reads a version 1 or 2 checkpoint. DDP_ERR_IO for a missing/unreadable file, DDP_ERR_FORMAT for
 * a bad magic, version, size, checksum or section (the log says which), DDP_ERR_NOMEM.
 * On failure *out is untouched. The whole file is read into memory once. */
DDP_API ddp_status ddp_state_load(const char *path, ddp_state **out);
/* Removes stale temporary files of interrupted saves in dir (see ddp_state_save); NULL is the
 * current folder. DDP_ERR_IO when the folder cannot be listed; a file that cannot be removed is
 * left as it is, without an error. */
DDP_API ddp_status ddp_checkpoint_remove_stale(const char *dir);

/* Reads the parameters of a version 1 or 2 checkpoint. On success *descs (n_params entries) and
 * *params (host, numel total) are malloc'ed and owned by the caller. DDP_ERR_INVALID_ARG for a
 * NULL argument, else errors as ddp_state_load; on failure the outputs are untouched. */
DDP_API ddp_status ddp_checkpoint_load(const char *path, ddp_param_desc **descs, int *n_params,
                                       float **params);

/* ---------------------------------------------------------------------------------------------
 * Checkpoint folders (runtime/checkpoint_dir.c; docs/formats.md): one file per rank, each a
 * version 2 checkpoint of its slices ("pieces") of the float buffers, and a text MANIFEST that
 * rank 0 writes last, atomically, once every rank's file is on disk. A folder without a MANIFEST is
 * not a checkpoint. A shard file's state: the signature is one pseudo-parameter "shard" of the
 * params slice's length, "params" the slice, any other float entry a slice of that buffer, and
 * u64 "shard.offset.NAME" the slice's first element in the flat buffer; entries named "shard.*"
 * stay in the file, every other counter, double and text of rank 0's file goes into the MANIFEST.
 * The saving program does the collectives: rank 0 calls ddp_ckpt_dir_begin, every rank
 * ddp_ckpt_dir_write_shard, and after all of them succeeded rank 0 calls ddp_ckpt_dir_commit.
 */
#define DDP_CKPT_MANIFEST "MANIFEST"
typedef struct ddp_ckpt_dir ddp_ckpt_dir;

/* Rank 0, before the shards: creates dir (not its parents) when missing, removes its MANIFEST (the
 * folder is no checkpoint until the new one is committed) and every other regular file in it whose
 * name a save writes (rank files, temporary files), so no piece of an older save survives; any
 * other entry is left (warned about). DDP_ERR_INVALID_ARG when dir exists and is not a folder (a
 * symbolic link included: never written through), DDP_ERR_IO (logged with the system's reason,
 * errno kept). */
DDP_API ddp_status ddp_ckpt_dir_begin(const char *dir);
/* Every rank: writes shard (see above) as dir/rank-RRRRR-of-WWWWW.ckpt like ddp_state_save
 * (temporary file, fsync, rename, fsync of the folder). Errors as ddp_state_save; a shard without
 * "shard.offset.params" is DDP_ERR_INVALID_ARG (ddp_ckpt_dir_commit refuses a float entry without
 * its "shard.offset.NAME"). */
DDP_API ddp_status ddp_ckpt_dir_write_shard(const char *dir, int rank, int world_size,
                                            const ddp_state *shard);
/* 1 when all world_size rank files of dir are there (each appears, by a rename, only once it is
 * complete and fsync'ed), else 0. For a rank 0 that learns of the others' writes from the files. */
DDP_API int ddp_ckpt_dir_files_present(const char *dir, int world_size);
/* Rank 0, after every rank's ddp_ckpt_dir_write_shard succeeded: reads the section table of each
 * of the world_size files, checks that every float buffer's pieces cover [0, numel) exactly (numel:
 * the descriptors' total) and that every file holds the same "step", then writes dir/MANIFEST
 * (temporary file, fsync, rename, fsync). meta: rank 0's shard state (its counters, doubles and
 * texts go into the MANIFEST). DDP_ERR_FORMAT naming the file that does not fit, DDP_ERR_INVALID_ARG
 * for a name with a space or a text with a line break, DDP_ERR_IO (errno kept). */
DDP_API ddp_status ddp_ckpt_dir_commit(const char *dir, int world_size, const ddp_param_desc *descs,
                                       int n_params, const ddp_state *meta);

/* Opens a checkpoint folder: reads and checks the MANIFEST (its CRC-32, the pieces cover every
 * buffer), and for every file its size and CRC-32 word against the MANIFEST, its header, section
 * table and "step" (a file missing, truncated or from another save is named). The values are not
 * read: ddp_ckpt_dir_verify_file checks a file's CRC-32 over all of its bytes. DDP_ERR_IO (no
 * MANIFEST, an unreadable file), DDP_ERR_FORMAT (logged naming the file), DDP_ERR_NOMEM; *out
 * untouched on failure. */
DDP_API ddp_status ddp_ckpt_dir_open(const char *dir, ddp_ckpt_dir **out);
/* NULL is ignored. */
DDP_API void ddp_ckpt_dir_close(ddp_ckpt_dir *d);
/* The checkpoint's state without its values: the signature, "params" and the other float
 * buffers with their counts (ddp_state_f32 returns NULL, *n the count), the counters, doubles and
 * texts. Owned by d. */
DDP_API const ddp_state *ddp_ckpt_dir_state(const ddp_ckpt_dir *d);
/* Files of the folder (the ranks that wrote it) and file i's path (owned by d; NULL out of range). */
DDP_API int ddp_ckpt_dir_n_files(const ddp_ckpt_dir *d);
DDP_API const char *ddp_ckpt_dir_file(const ddp_ckpt_dir *d, int i);
/* Reads elements [offset, offset + n) of the float buffer `name` into dst from the files that hold
 * them (pread of those bytes only). DDP_ERR_INVALID_ARG for an unknown name or a range past the
 * end, DDP_ERR_IO (logged with the file). */
DDP_API ddp_status ddp_ckpt_dir_read_f32(const ddp_ckpt_dir *d, const char *name, size_t offset,
                                         size_t n, float *dst);
/* The same into backend memory dst (element offset at dst[0]), through a host buffer of at most
 * 4 Mi floats. Errors as ddp_ckpt_dir_read_f32 and ddp_upload, DDP_ERR_NOMEM. */
DDP_API ddp_status ddp_ckpt_dir_read_dev(ddp_ctx *ctx, const ddp_ckpt_dir *d, const char *name,
                                         size_t offset, size_t n, float *dst);
/* Reads all of file i and checks its CRC-32. DDP_ERR_FORMAT (logged naming it), DDP_ERR_IO. */
DDP_API ddp_status ddp_ckpt_dir_verify_file(const ddp_ckpt_dir *d, int i);
/* ddp_ckpt_dir_verify_file of every file, in order; the first failure. */
DDP_API ddp_status ddp_ckpt_dir_verify(const ddp_ckpt_dir *d);
/* Writes the whole checkpoint as one version 2 file (ddp_state_save) at path. Errors as
 * ddp_ckpt_dir_read_f32 and ddp_state_save, DDP_ERR_NOMEM. */
DDP_API ddp_status ddp_ckpt_dir_consolidate(const ddp_ckpt_dir *d, const char *path);

/* Either kind of checkpoint, the one call that tells them apart: 1 when path is a folder (a
 * checkpoint folder, complete or not; a link to one included), else 0. */
DDP_API int ddp_checkpoint_is_folder(const char *path);
/* Opens a checkpoint file or folder: a file is read and checked whole into *file
 * (ddp_state_load), a folder opened into *dir (ddp_ckpt_dir_open) and, with verify, every one of
 * its files read and checked (ddp_ckpt_dir_verify_file; without it only the sizes, headers and
 * steps are). Exactly one output is set on success, both NULL on failure. DDP_ERR_INVALID_ARG for
 * a NULL argument, else the errors of those calls (logged naming the file). */
DDP_API ddp_status ddp_checkpoint_open(const char *path, int verify, ddp_state **file,
                                       ddp_ckpt_dir **dir);
/* The state of what ddp_checkpoint_open opened: file, else ddp_ckpt_dir_state(dir) (the values of
 * a folder's buffers are not held: ddp_ckpt_dir_read_f32 reads them). NULL when both are NULL. */
DDP_API const ddp_state *ddp_checkpoint_state(const ddp_state *file, const ddp_ckpt_dir *dir);

/* ---------------------------------------------------------------------------------------------
 * Snapshots: the copy of training state to the host for a checkpoint written in the background,
 * without the host or libddp's stream waiting for it (on CUDA: pinned memory, a side stream).
 *   ddp_snapshot_pin(ctx, host, n)    page-locks host memory the copies will go to (once, e.g. at
 *                                     start-up: cudaHostRegister); ddp_snapshot_unpin(ctx, host)
 *                                     undoes it, before the memory is freed.
 *   ddp_snapshot_copy(ctx, dst, src, n)  queues backend memory src -> host dst on a side stream,
 *                                     after the work queued so far on libddp's stream, and returns.
 *                                     A dst outside pinned memory is copied at once (ddp_download).
 *   ddp_snapshot_fence(ctx)           libddp's stream waits, on the GPU, for the copies queued so
 *                                     far: call it before work that overwrites their sources (the
 *                                     optimizer step). No host wait; nothing when none is pending.
 *   ddp_snapshot_wait(ctx)            the host waits for the copies queued so far, under the
 *                                     deadline (DDP_TIMEOUT); from any thread: the checkpoint
 *                                     manager's writer calls it before it reads the state.
 * On the CPU backend the copy is a memcpy and the other four do nothing. DDP_ERR_STATE for a
 * context whose device did not open, DDP_ERR_INVALID_ARG for a NULL buffer, DDP_ERR_CUDA (the
 * pinning refused, e.g. out of page-locked memory: the copies then go through ddp_download),
 * DDP_ERR_TIMEOUT / DDP_ERR_NCCL from a wait.
 */
DDP_API ddp_status ddp_snapshot_pin(ddp_ctx *ctx, void *host, size_t n_bytes);
DDP_API ddp_status ddp_snapshot_unpin(ddp_ctx *ctx, void *host);
DDP_API ddp_status ddp_snapshot_copy(ddp_ctx *ctx, void *dst_host, const void *src, size_t n_bytes);
DDP_API ddp_status ddp_snapshot_fence(ddp_ctx *ctx);
DDP_API ddp_status ddp_snapshot_wait(ddp_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * The staging copy (runtime/checkpoint_stage.c): what a rank puts into a checkpoint folder, its
 * ddp_shard_range slice of each of a program's n_bufs float buffers of n_total values, in a state
 * of its own (one 1-D parameter "shard" of the slice's length; buffer i named names[i], with
 * the u64 "shard.offset.NAME", the slice's first element), allocated once and reused by every
 * save: a save copies into it and never allocates. The program adds its own entries (position,
 * fingerprint) to ddp_ckpt_stage_state and hands that state to ddp_ckpt_manager_save.
 *   ddp_ckpt_stage_create(ctx, n_total, names, n_bufs, pin, &out)  with pin, page-locks the buffers
 *       (ddp_snapshot_pin) so the copies go on the side stream; a refused pinning is warned about
 *       (the copies then wait on the host). ctx NULL: one process. DDP_ERR_INVALID_ARG (NULL out,
 *       names, or more than 8 buffers), DDP_ERR_NOMEM.
 *   ddp_ckpt_stage_copy(s, ctx, i, src)  queues the copy of buffer i's slice from src (backend
 *       memory, the slice's first value) into the staging copy (ddp_snapshot_copy's errors).
 *   ddp_ckpt_stage_state(s)    the state (NULL for a NULL s).
 *   ddp_ckpt_stage_range(s, &offset, &n)  the slice; ddp_ckpt_stage_bytes(s): its bytes in all
 *       buffers.
 *   ddp_ckpt_stage_destroy(s)  unpins and frees; NULL is ignored.
 */
typedef struct ddp_ckpt_stage ddp_ckpt_stage;
DDP_API ddp_status ddp_ckpt_stage_create(ddp_ctx *ctx, size_t n_total, const char *const *names,
                                         int n_bufs, int pin, ddp_ckpt_stage **out);
DDP_API ddp_status ddp_ckpt_stage_copy(ddp_ckpt_stage *s, ddp_ctx *ctx, int i, const float *src);
DDP_API ddp_state *ddp_ckpt_stage_state(const ddp_ckpt_stage *s);
DDP_API void ddp_ckpt_stage_range(const ddp_ckpt_stage *s, size_t *offset, size_t *n);
DDP_API size_t ddp_ckpt_stage_bytes(const ddp_ckpt_stage *s);
DDP_API void ddp_ckpt_stage_destroy(ddp_ckpt_stage *s);

/* ---------------------------------------------------------------------------------------------
 * Rescue copies (runtime/rescue.c): when the watchdog ends the job (a peer gone, a collective past
 * its deadline, an ABORT along the ring), a process armed with ddp_rescue_arm writes the training
 * state of its last completed step as DIR/step-<12 digits>.rescue (a checkpoint file, saved
 * atomically) before MPI_Abort, with no collective call: fn(arg, step, &state) builds it in the
 * watchdog's thread. For a state every rank holds whole (plain data parallelism): one copy per
 * node and step (the first rank to claim it writes, the others wait for it, at most 10 s). DIR is
 * node-local memory, e.g. under /dev/shm; the next generation of an elastic run loads the newest
 * copy (ddp_rescue_list) when it is newer than the disk checkpoints. Each copy also holds
 * "rescue.detected_at" (when this process saw the job end: seconds since the epoch, f64) and
 * "rescue.copy_s" (how long fn took), and the text "rescue.cause" (why the job ended, e.g. "rank 2
 * (host n2, pid 4242) was lost").
 *   ddp_rescue_arm(ctx, dir, step, fn, arg)  creates dir (0700) if needed; step: the state's now.
 *       DDP_ERR_INVALID_ARG for NULL or empty arguments or a dir over 4000 bytes, DDP_ERR_IO when
 *       dir cannot be created (logged).
 *   ddp_rescue_hold() / ddp_rescue_release(step)  bracket every change of the state (the optimizer
 *       step and the step counter): a copy is never taken inside (the watchdog waits at most 5 s).
 *   ddp_rescue_disarm()  no copy from here on (e.g. before the end of training).
 *   ddp_rescue_list(dir, &steps, &n)  the steps of the copies in dir, newest first (malloc'ed; a
 *       missing dir has none); links and other non-files are left out. DDP_ERR_IO, DDP_ERR_NOMEM.
 *   ddp_rescue_path(dir, step, path, n)  0, or -1 when n bytes are too few.
 *   ddp_rescue_clear(dir)  removes the copies, unfinished claims and temporary files of dir (never
 *       through a link); returns how many copies and claims went.
 */
typedef ddp_status (*ddp_rescue_fn)(void *arg, long step, ddp_state **out);
DDP_API ddp_status ddp_rescue_arm(ddp_ctx *ctx, const char *dir, long step, ddp_rescue_fn fn,
                                  void *arg);
DDP_API void ddp_rescue_hold(void);
DDP_API void ddp_rescue_release(long step);
DDP_API void ddp_rescue_disarm(void);
DDP_API ddp_status ddp_rescue_list(const char *dir, long **steps, size_t *n);
DDP_API int ddp_rescue_path(const char *dir, long step, char *path, size_t n);
DDP_API int ddp_rescue_clear(const char *dir);
/* An elastic restart's phases, for a log line, into text (n bytes): from the failure's detection
 * (the rescue copy st's "rescue.detected_at"; st NULL: a restart from a disk checkpoint, whose
 * phases start at the launch) to the copy written ("rescue.copy_s"), to the new generation's launch
 * (DDP_ELASTIC_LAUNCHED_AT, set by ddp-launch), to ddp_init's start (the process's start-up), to
 * its end (MPI, NCCL), and to now (the program's loading): e.g. "snapshot 0.010 s, relaunch 0.610
 * s, process start 0.050 s, ddp_init 0.300 s, load 0.040 s: 1.010 s in all". A phase whose clock is
 * missing is left out. Returns the seconds in all (-1 when nothing is known). */
DDP_API double ddp_rescue_phases(const ddp_ctx *ctx, const ddp_state *st, char *text, size_t n);

/* ---------------------------------------------------------------------------------------------
 * The checkpoint manager (runtime/checkpoint_manager.c): a training program's checkpoints in one
 * folder, each DIR/step-<12 digits>.ckpt (a checkpoint file, or a checkpoint folder as above), the
 * newest `keep` kept. A folder without its MANIFEST is the debris of an interrupted save: never a
 * checkpoint, and removed by the next prune. A step name that is a symbolic link is not this
 * folder's checkpoint: never read, followed or removed. A folder save is collective: every rank
 * writes its shard, rank 0 the MANIFEST once all are on disk. With async, a save may go to a
 * background thread on every rank while training goes on (rank 0's writes the MANIFEST once the
 * other ranks' files appear); one save is in flight at a time, and the next save,
 * ddp_ckpt_manager_wait and ddp_ckpt_manager_destroy wait for it. After a save completes, rank 0
 * prunes: every checkpoint past the newest `keep` and every folder without a MANIFEST is removed
 * (a folder MANIFEST first, so a kill during the removal leaves debris, never a folder that claims
 * to be complete). What a state holds (buffers, position, a configuration fingerprint) is the
 * program's.
 */
typedef struct ddp_ckpt_manager ddp_ckpt_manager;
/* The longest folder a manager takes, in bytes: the rest of the system's 4096-byte path limit is
 * the room for the names below it (step folder, rank file, temporary suffix). */
#define DDP_CKPT_DIR_MAX 4032

/* Collective, before a job's first checkpoint into dir: claims the folder. A dir longer than
 * DDP_CKPT_DIR_MAX is refused; rank 0 creates dir and locks it for this process's life (a POSIX
 * record lock on DIR/.ddp-lock, which names the holder: a second job on the same folder is
 * refused, naming the job that holds it; a file system without locks is warned about); with
 * look_for_probe it also leaves a probe file that every rank looks for, so the caller learns
 * whether every rank sees dir (per-rank files work there) or not (a node-local path: only rank
 * 0 can write): *n_blind ranks do not see it (0 without look_for_probe), named in blind (n bytes,
 * e.g. "2, 5, 7 and 3 more"). Every rank returns the same status: DDP_OK, DDP_ERR_INVALID_ARG (too
 * long, or another job holds the lock; logged by rank 0 with the fix), DDP_ERR_IO (dir cannot be
 * created or written, logged). A failed collective ends the job. `what` names the folder in the
 * messages (a program's flag, e.g. "--checkpoint-dir"; NULL: "checkpoint folder"). */
DDP_API ddp_status ddp_ckpt_dir_claim(ddp_ctx *ctx, const char *dir, const char *what,
                                      int look_for_probe, int64_t *n_blind, char *blind, size_t n);

/* A manager of the checkpoints in dir (an existing folder), keeping the newest keep (>= 1); async:
 * ddp_ckpt_manager_save may write in the background. ctx: the job whose ranks save together (NULL:
 * one process, rank 0 of 1). DDP_ERR_INVALID_ARG for a NULL or empty dir (or one over
 * DDP_CKPT_DIR_MAX bytes),
 * keep < 1 or a NULL out; DDP_ERR_NOMEM. */
DDP_API ddp_status ddp_ckpt_manager_create(ddp_ctx *ctx, const char *dir, int keep, int async,
                                           ddp_ckpt_manager **out);
/* Waits for the save in flight without a collective (at exit, after a stop, the other ranks may be
 * gone): this rank's write, and on rank 0 the MANIFEST once the other ranks' files are there (at
 * most 300 s); a failure is logged. Then frees m. NULL is ignored. */
DDP_API void ddp_ckpt_manager_destroy(ddp_ckpt_manager *m);

/* Step's checkpoint path, DIR/step-<12 digits>.ckpt, into path (n bytes). DDP_ERR_INVALID_ARG for
 * a NULL argument, step < 0 or a path that does not fit. */
DDP_API ddp_status ddp_ckpt_manager_path(const ddp_ckpt_manager *m, long step, char *path, size_t n);
/* The steps of every step-N.ckpt in the folder (complete or not), newest first: *steps malloc'ed
 * (NULL when there is none), *n of them. DDP_ERR_IO when the folder cannot be listed (logged),
 * DDP_ERR_NOMEM, DDP_ERR_INVALID_ARG for a NULL argument; outputs untouched on failure. */
DDP_API ddp_status ddp_ckpt_manager_list(const ddp_ckpt_manager *m, long **steps, size_t *n);
/* Opens the newest valid checkpoint older than step `below` (LONG_MAX: any): its path into path
 * (n bytes), its step into *step, and either *file (a file, read and checked whole) or *dir (a
 * folder: its MANIFEST and every file's size, header and step checked; the files' CRC-32 are read
 * by ddp_ckpt_dir_verify_file). A folder without a MANIFEST, a corrupt or truncated file, and a
 * folder with a file missing, truncated or from another save are skipped with a warning naming
 * them ("skipping PATH"). None to open: *step -1, both outputs NULL, and DDP_OK when every name
 * was an interrupted save (or there is none), DDP_ERR_FORMAT (logged) when there were checkpoints
 * and none is valid. DDP_ERR_IO when the folder cannot be listed, DDP_ERR_INVALID_ARG for a NULL
 * argument. The caller closes what it gets (ddp_state_destroy, ddp_ckpt_dir_close). */
DDP_API ddp_status ddp_ckpt_manager_newest(const ddp_ckpt_manager *m, long below, long *step,
                                           char *path, size_t n, ddp_state **file,
                                           ddp_ckpt_dir **dir);
/* Removes every checkpoint past the newest keep and every folder without a MANIFEST (a file that
 * cannot be removed is warned about and left). Only what a save writes is removed: a step name that
 * is a symbolic link is never followed nor removed (warned about, naming it), and a folder keeps
 * every file whose name a save does not write (warned about; the folder stays then). The saves do
 * it; one process at a time (rank 0). */
DDP_API void ddp_ckpt_manager_prune(const ddp_ckpt_manager *m);
/* One process (rank 0): removes step's checkpoint, a file or a folder (only the files a save
 * writes, then the folder), so that a checkpoint of the other kind can take its name; the saves
 * call it when the step exists as the other kind. DDP_OK when it is gone (or was never there),
 * DDP_ERR_INVALID_ARG for a NULL manager, a step < 0 or a symbolic link (never removed; warned
 * about), DDP_ERR_IO when it cannot be removed (logged, e.g. a file a save does not write in the
 * folder). */
DDP_API ddp_status ddp_ckpt_manager_remove(const ddp_ckpt_manager *m, long step);

/* One process (the one that holds the whole state, e.g. rank 0 after a gather): writes state as
 * step's checkpoint file (ddp_state_save: atomic), then prunes. Errors as ddp_state_save (errno
 * holds the system's reason of a DDP_ERR_IO); the previous checkpoints stay then. */
DDP_API ddp_status ddp_ckpt_manager_save_file(ddp_ckpt_manager *m, long step, const ddp_state *state);
/* Collective: step's checkpoint folder from every rank's shard (see ddp_ckpt_dir_write_shard; NULL:
 * this rank has none, e.g. its staging failed, and its write counts as failed). The save in flight
 * ends first (ddp_ckpt_manager_wait). Rank 0 empties the folder (ddp_ckpt_dir_begin), every rank
 * writes its file, and rank 0 writes the MANIFEST (descs, n_params: the whole model's parameters;
 * only rank 0's are read) once every rank's is on disk, then prunes. background with async: the
 * writes and the MANIFEST go to the background thread and this returns once they started (shard
 * must then stay unchanged until the save ends; buffers filled by ddp_snapshot_copy are waited for
 * before they are read); its failure is returned by the call that waits for
 * it. Every rank returns its own outcome (rank 0 also fails when another rank did: no MANIFEST, the
 * folder is no checkpoint), the failure of the save before first; errno holds the system's reason
 * of a DDP_ERR_IO. */
DDP_API ddp_status ddp_ckpt_manager_save(ddp_ckpt_manager *m, long step, const ddp_state *shard,
                                         const ddp_param_desc *descs, int n_params, int background);
/* Collective: the save in flight, if any, ends: every rank waits for its own write, the ranks agree,
 * rank 0 waits for its MANIFEST (none when a rank failed). Every rank returns its own write's
 * outcome, rank 0 also fails when another rank did; a failure is logged with the path. DDP_OK when
 * no save is in flight; DDP_ERR_INVALID_ARG for a NULL m. */
DDP_API ddp_status ddp_ckpt_manager_wait(ddp_ckpt_manager *m);
/* Seconds of the slowest rank's file write (with its fsync) at the last synchronous folder save
 * (the same on every rank); 0 before one, or for a NULL m. */
DDP_API double ddp_ckpt_manager_slowest_write(const ddp_ckpt_manager *m);

#ifdef __cplusplus
}
#endif

#endif /* DDP_CHECKPOINT_H */
