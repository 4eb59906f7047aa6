/* context.c - ddp_init / ddp_finalize: MPI start-up, rank topology (local rank, node rank),
 * cross-check of the launcher's environment, backend and communicator selection, start-up table.
 *
 * Failure policy: wherever ranks may disagree (one rank's environment or device is bad), every
 * rank first agrees on the outcome with an all-reduce of its status, so all ranks return the
 * error together and none is left waiting in a later collective. Every start-up collective,
 * MPI_Init and MPI_Finalize included, runs under the watchdog's deadline (watchdog.c), which is
 * started first and stopped last.
 */
#include <errno.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "internal.h"
#include "try.h"

#if HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

void ddp_init_opts_default(ddp_init_opts *opts)
{
    *opts = (ddp_init_opts){.backend = DDP_BACKEND_AUTO, .threads = 1, .print_table = 1};
}

ddp_status ddp_backend_parse(const char *name, ddp_backend_kind *out)
{
    static const char *names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; name && i < 3; i++) {
        if (strcasecmp(name, names[i]) == 0) {
            *out = (ddp_backend_kind)i;
            return DDP_OK;
        }
    }
    DDP_ERROR("unknown backend '%s': use cpu, cuda or auto", name ? name : "(null)");
    return DDP_ERR_INVALID_ARG;
}

const char *ddp_backend_name(ddp_backend_kind kind)
{
    switch (kind) {
    case DDP_BACKEND_AUTO:
        return "auto";
    case DDP_BACKEND_CPU:
        return "cpu";
    case DDP_BACKEND_CUDA:
        return "cuda";
    }
    return "unknown";
}

/* ---- MPI and topology ------------------------------------------------------------------------ */

static ddp_status ctx_start_mpi(ddp_ctx *ctx)
{
    int inited = 0, finalized = 0, provided = 0;
    ddp_status st = DDP_OK;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
        DDP_ERROR("MPI was already finalised: call ddp_init before MPI_Finalize");
        return DDP_ERR_STATE;
    }
    if (inited) {
        TRY_MPI_GOTO(MPI_Query_thread(&provided));
    } else {
        TRY_MPI_GOTO(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
        ctx->owns_mpi = 1;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        DDP_ERROR("MPI provides thread level %d but libddp needs MPI_THREAD_MULTIPLE (%d): "
                  "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let "
                  "ddp_init do it", provided, MPI_THREAD_MULTIPLE);
        st = DDP_ERR_MPI;
    }
cleanup:
    return st;
}

/* Node rank and count: the local-rank-0 processes number the nodes; each tells its node. */
static ddp_status ctx_nodes(ddp_ctx *ctx, MPI_Comm local)
{
    ddp_status st = DDP_OK;
    MPI_Comm leaders = MPI_COMM_NULL;
    int node[2] = {0, 1};
    TRY_MPI_GOTO(MPI_Comm_split(MPI_COMM_WORLD, ctx->local_rank == 0 ? 0 : MPI_UNDEFINED,
                                ctx->rank, &leaders));
    if (leaders != MPI_COMM_NULL) {
        TRY_MPI_GOTO(MPI_Comm_rank(leaders, &node[0]));
        TRY_MPI_GOTO(MPI_Comm_size(leaders, &node[1]));
    }
    TRY_MPI_GOTO(MPI_Bcast(node, 2, MPI_INT, 0, local));
    ctx->node_rank = node[0];
    ctx->n_nodes = node[1];
cleanup:
    if (leaders != MPI_COMM_NULL)
        MPI_Comm_free(&leaders);
    return st;
}

static ddp_status ctx_topology(ddp_ctx *ctx)
{
    ddp_status st = DDP_OK;
    MPI_Comm local = MPI_COMM_NULL;
    TRY_MPI_GOTO(MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank));
    TRY_MPI_GOTO(MPI_Comm_size(MPI_COMM_WORLD, &ctx->world_size));
    TRY_MPI_GOTO(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx->rank,
                                     MPI_INFO_NULL, &local));
    TRY_MPI_GOTO(MPI_Comm_rank(local, &ctx->local_rank));
    TRY_MPI_GOTO(MPI_Comm_size(local, &ctx->local_world_size));
    st = ctx_nodes(ctx, local);
cleanup:
    if (local != MPI_COMM_NULL)
        MPI_Comm_free(&local);
    return st;
}

/* All ranks agree on the outcome of a step that may fail on some of them. Returns this rank's
 * own error, else the largest error code of the failing ranks (logged once, on rank 0, with the
 * lowest rank that has it), else DDP_OK. */
static ddp_status ctx_agree(const ddp_ctx *ctx, ddp_status mine, const char *step)
{
    int in[2] = {(int)mine, ctx->rank}, out[2] = {0, 0};
    watch_enter(DDP_WATCH_CALLER, "start-up agreement", -1, sizeof in);
    int rc = MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD);
    watch_leave(DDP_WATCH_CALLER);
    if (rc != MPI_SUCCESS) {
        DDP_ERROR("could not agree with the other ranks on %s", step);
        return mine != DDP_OK ? mine : DDP_ERR_MPI;
    }
    if (mine != DDP_OK)
        return mine;
    if (out[0] != DDP_OK)
        ddp_log_write(DDP_LOG_ERROR, 1, NULL, 0, "rank %d failed during %s (%s); every rank stops",
                      out[1], step, ddp_strerror((ddp_status)out[0]));
    return (ddp_status)out[0];
}

/* ---- environment cross-check ----------------------------------------------------------------- */

typedef enum env_kind { ENV_RANK, ENV_SIZE, ENV_LOCAL_RANK, ENV_LOCAL_SIZE } env_kind;

static void env_report(const ddp_ctx *ctx, const char *var, long want, env_kind kind, int mpi)
{
    if (kind == ENV_SIZE && mpi == 1 && strncmp(var, "SLURM_", 6) == 0)
        DDP_ERROR("MPI sees a world of 1 process in a Slurm step of %s=%ld tasks: each task started "
                  "MPI alone (a singleton), without the step's process manager: run srun "
                  "--mpi=pmix (or set MpiDefault=pmix in slurm.conf); in a container, give it "
                  "Slurm's PMIx (and scontrol) from the host", var, want);
    else if (kind == ENV_SIZE)
        DDP_ERROR("started %d process%s with %s=%ld in the environment: launch with mpirun -np "
                  "%ld or srun -n %ld, or unset %s", mpi, mpi == 1 ? "" : "es", var, want, want,
                  want, var);
    else if (kind == ENV_LOCAL_SIZE)
        DDP_ERROR("%d process%s run on host %s but %s=%ld: start %ld per node or unset %s", mpi,
                  mpi == 1 ? "" : "es", ctx->hostname, var, want, want, var);
    else
        DDP_ERROR("MPI says this is %srank %d but %s=%ld: the variable comes from another launch; "
                  "unset %s or start the program with mpirun, srun --mpi=pmix or ddp-launch",
                  kind == ENV_LOCAL_RANK ? "local " : "", mpi, var, want, var);
}

/* DDP_OK when var is unset or equals the MPI value; else DDP_ERR_ENV with a message. */
static ddp_status env_check(const ddp_ctx *ctx, const char *var, env_kind kind, int mpi)
{
    const char *text = getenv(var);
    if (!text || !*text)
        return DDP_OK;
    char *end = NULL;
    errno = 0;
    long want = strtol(text, &end, 10);
    if (errno || *end != '\0') {
        DDP_ERROR("%s=%s is not a number: unset it or fix the launcher", var, text);
        return DDP_ERR_ENV;
    }
    if (want == mpi)
        return DDP_OK;
    env_report(ctx, var, want, kind, mpi);
    return DDP_ERR_ENV;
}

/* DDP_OK when the switch var (what it turns off) is unset, 0 or 1; else DDP_ERR_ENV, logged. */
static ddp_status env_switch(const char *var, const char *what)
{
    const char *v = getenv(var);
    if (!v || !*v || strcmp(v, "0") == 0 || strcmp(v, "1") == 0)
        return DDP_OK;
    DDP_ERROR("%s=%s: expected 0 (%s off) or 1 (on, the default): set one of them or unset it",
              var, v, what);
    return DDP_ERR_ENV;
}

/* DDP_NVTX (trace.c), DDP_NCCL_RAS (nccl_ras.c) and DDP_WATCH_GPU_LANE (comm_nccl.c). */
static ddp_status ctx_check_switches(void)
{
    const char *nvtx = getenv("DDP_NVTX");
    if (!HAVE_NVTX && nvtx && strcmp(nvtx, "1") == 0)
        DDP_WARN0("DDP_NVTX=1, but this libddp was built without NVTX (the CUDA toolkit's "
                  "nvtx3/nvToolsExt.h): no ranges; rebuild where meson finds the header");
    ddp_status st = env_switch("DDP_NVTX", "NVTX ranges");
    if (st == DDP_OK)
        st = env_switch("DDP_NCCL_RAS", "NCCL RAS's view in the hang report");
    return st == DDP_OK ? env_switch("DDP_WATCH_GPU_LANE", "the hang report's GPU stream lane")
                        : st;
}

static ddp_status ctx_check_env(const ddp_ctx *ctx)
{
    if (ctx_check_switches() != DDP_OK)
        return DDP_ERR_ENV;
    struct {
        const char *var;
        env_kind kind;
    } vars[] = {{"RANK", ENV_RANK}, {"WORLD_SIZE", ENV_SIZE}, {"LOCAL_RANK", ENV_LOCAL_RANK},
                {"LOCAL_WORLD_SIZE", ENV_LOCAL_SIZE}, {"OMPI_COMM_WORLD_RANK", ENV_RANK},
                {"OMPI_COMM_WORLD_SIZE", ENV_SIZE}, {"OMPI_COMM_WORLD_LOCAL_RANK", ENV_LOCAL_RANK},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", ENV_LOCAL_SIZE}, {"PMIX_RANK", ENV_RANK},
                {"SLURM_PROCID", ENV_RANK}, {"SLURM_NTASKS", ENV_SIZE}};
    int n_vars = (int)(sizeof vars / sizeof vars[0]);
    /* Under mpirun inside an allocation, SLURM_* describe the allocation, not this job: they are
     * trusted only in a Slurm job step (srun) that mpirun did not start. */
    if (getenv("OMPI_COMM_WORLD_SIZE") || !getenv("SLURM_STEP_ID"))
        n_vars -= 2;
    const int mpi[] = {ctx->rank, ctx->world_size, ctx->local_rank, ctx->local_world_size};
    for (int i = 0; i < n_vars; i++) {
        ddp_status st = env_check(ctx, vars[i].var, vars[i].kind, mpi[vars[i].kind]);
        if (st != DDP_OK)
            return st;
    }
    return DDP_OK;
}

/* ---- backend and communicators ---------------------------------------------------------------- */

static ddp_status ctx_gpu_clash(ddp_ctx *ctx, int device, char own[32], int *other);

/* 1 when this rank could have a GPU of its own: CUDA sees one per local rank, or exactly one that
 * no other rank of this host sees (Slurm narrowed CUDA_VISIBLE_DEVICES per task). Collective
 * over the host's ranks. */
static int ctx_gpu_of_own(ddp_ctx *ctx, int count, ddp_status *st)
{
    char own[32];
    int other = -1;
    *st = ctx_gpu_clash(ctx, count == 1 ? 0 : -1, own, &other);
    return count >= ctx->local_world_size || (count == 1 && other < 0);
}

/* AUTO becomes CUDA only when every rank has a GPU of its own and this build can communicate on
 * it (NCCL), so all ranks use the same backend; otherwise rank 0 says why it is the cpu. */
static ddp_status ctx_resolve_backend(ddp_ctx *ctx, ddp_backend_kind asked)
{
    if (asked != DDP_BACKEND_AUTO) {
        ctx->backend = asked;
        return DDP_OK;
    }
    ddp_status st = DDP_OK;
    int count = device_ops_cuda() != NULL ? ddp_cuda_device_count() : 0;
    int has = count > 0, own = ctx_gpu_of_own(ctx, count, &st);
    if (st != DDP_OK)
        return st;
    if (has && !HAVE_NCCL) {
        DDP_WARN0("a GPU is visible, but this libddp was built without NCCL, which the cuda backend "
                  "needs to communicate: using the cpu backend (rebuild with meson -Dnccl=enabled "
                  "to train on the GPU)");
        has = 0;
    }
    int in[3] = {has && own, -has, -(has && !own)}, out[3] = {0, 0, 0};
    watch_enter(DDP_WATCH_CALLER, "backend agreement", -1, sizeof in);
    int rc = MPI_Allreduce(in, out, 3, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    watch_leave(DDP_WATCH_CALLER);
    if (rc != MPI_SUCCESS) {
        DDP_ERROR("could not agree on the backend with the other ranks");
        return DDP_ERR_MPI;
    }
    if (out[2] < 0)
        DDP_WARN0("a host runs more ranks than it has GPUs (NCCL needs one GPU per rank): every "
                  "rank uses the cpu backend; start one rank per GPU to train on the GPUs");
    else if (out[0] == 0 && out[1] < 0)
        DDP_WARN0("some ranks have no GPU: every rank uses the cpu backend");
    ctx->backend = out[0] ? DDP_BACKEND_CUDA : DDP_BACKEND_CPU;
    return DDP_OK;
}

/* Chooses this rank's GPU (ctx->device) without touching it. Local, no collectives. */
static ddp_status ctx_pick_device(ddp_ctx *ctx)
{
    if (!device_ops_cuda()) {
        DDP_ERROR("backend cuda asked, but this libddp was built without CUDA: use the cpu "
                  "backend, or rebuild with meson -Dcuda=enabled");
        return DDP_ERR_UNSUPPORTED;
    }
    char why[256];
    int count = cuda_probe(why, sizeof why);
    if (count <= 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        DDP_ERROR("backend cuda asked, but host %s has no usable GPU: %s (CUDA_VISIBLE_DEVICES=%s); "
                  "run on GPU nodes with a current driver, or use the cpu backend", ctx->hostname,
                  why[0] ? why : "CUDA reports 0 devices", vis ? vis : "unset");
        return DDP_ERR_NO_DEVICE;
    }
    /* One GPU per rank: local rank r takes device r; a rank that sees exactly one device
     * (Slurm narrowed CUDA_VISIBLE_DEVICES per task) takes it. NCCL does not support two ranks
     * of one communicator on one GPU, so other layouts are refused here rather than hanging. */
    if (count < ctx->local_world_size && count != 1) {
        DDP_ERROR("host %s runs %d ranks but sees %d GPUs: NCCL needs one GPU per rank; start at "
                  "most %d ranks per node (--ntasks-per-node=%d) or use the cpu backend",
                  ctx->hostname, ctx->local_world_size, count, count, count);
        return DDP_ERR_NO_DEVICE;
    }
    ctx->device = count == 1 ? 0 : ctx->local_rank;
    return DDP_OK;
}

/* Finds a local rank other than this one whose bus id equals bus[me]; -1 if none. */
static int ctx_same_gpu(const char (*bus)[32], int n, int me)
{
    for (int r = 0; r < n; r++)
        if (r != me && bus[me][0] && !strcmp(bus[r], bus[me]))
            return r;
    return -1;
}

/* Finds another rank of this host that would use the same GPU as this one (device; -1: none):
 * *other is its local rank, or -1; own receives this rank's bus id ("" without a device).
 * Collective over the host's ranks. DDP_ERR_MPI on failure. */
static ddp_status ctx_gpu_clash(ddp_ctx *ctx, int device, char own[32], int *other)
{
    enum { MAX_LOCAL = 256 }; /* more ranks than any host has GPUs: nothing to compare */
    ddp_status st = DDP_OK;
    MPI_Comm local = MPI_COMM_NULL;
    char bus[MAX_LOCAL][32];
    *other = -1;
    own[0] = '\0';
    if (ctx->local_world_size > MAX_LOCAL)
        return DDP_OK;
    if (device >= 0 && cuda_bus_id(device, own, 32) != DDP_OK)
        own[0] = '\0';
    TRY_MPI_GOTO(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx->rank,
                                     MPI_INFO_NULL, &local));
    TRY_MPI_GOTO(MPI_Allgather(own, 32, MPI_CHAR, bus, 32, MPI_CHAR, local));
    *other = ctx_same_gpu((const char(*)[32])bus, ctx->local_world_size, ctx->local_rank);
cleanup:
    if (local != MPI_COMM_NULL)
        MPI_Comm_free(&local);
    return st;
}

/* Why ranks may share a GPU here, or NULL: the NCCL in use is the test-only fake of
 * tests/nccl_fake (it exports fake_nccl_marker; collectives over MPI), or NCCL 2.30 or later with
 * its experimental NCCL_MULTI_RANK_GPU_ENABLE=1. Never without NCCL. */
static const char *ctx_shared_gpu_allowed(void)
{
#if HAVE_NCCL
    if (dlsym(RTLD_DEFAULT, "fake_nccl_marker"))
        return "the NCCL in use is the test-only fake of tests/nccl_fake (collectives over MPI)";
    const char *multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    int v = 0;
    if (multi && !strcmp(multi, "1") && ncclGetVersion(&v) == ncclSuccess && v >= 23000)
        return "NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1";
#endif
    return NULL;
}

/* Refuses two ranks of this host on one GPU (each saw exactly one device, but the same one: the
 * job gave every rank the same one-GPU list). NCCL before 2.30 does not support it ("may lead to
 * hangs"); the fake NCCL and NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 do, and then it is
 * allowed and logged. Collective over the host's ranks; `mine` is this rank's status so far, and
 * a rank without a device takes part with an empty bus id. */
static ddp_status ctx_check_shared_gpu(ddp_ctx *ctx, ddp_status mine)
{
    char own[32];
    int other = -1;
    ddp_status st = ctx_gpu_clash(ctx, mine == DDP_OK ? ctx->device : -1, own, &other);
    const char *allowed = ctx_shared_gpu_allowed();
    if (mine == DDP_OK && st == DDP_OK && other >= 0 && allowed) {
        DDP_INFO0("local ranks %d and %d of host %s share GPU %s: allowed, %s", ctx->local_rank,
                  other, ctx->hostname, own, allowed);
    } else if (mine == DDP_OK && st == DDP_OK && other >= 0) {
        DDP_ERROR("local ranks %d and %d of host %s would share GPU %s: each rank sees one GPU, "
                  "the same one, and NCCL needs one GPU per rank; start at most one rank per GPU "
                  "(e.g. mpirun -np 1, --ntasks-per-node=<GPUs>), give each rank its own GPU "
                  "(ddp-launch, srun --gpus-per-task=1), or use the cpu backend (NCCL >= 2.30 "
                  "allows it with NCCL_MULTI_RANK_GPU_ENABLE=1)",
                  ctx->local_rank, other, ctx->hostname, own);
        st = DDP_ERR_NO_DEVICE;
    }
    return mine != DDP_OK ? mine : st;
}

static ddp_status ctx_open_device(ddp_ctx *ctx)
{
    ddp_status st = ctx_check_shared_gpu(ctx, ctx_pick_device(ctx));
    if (st != DDP_OK)
        return st;
    st = cuda_device_open(ctx->device);
    if (st != DDP_OK)
        DDP_ERROR("cannot open GPU %d on host %s: %s", ctx->device, ctx->hostname,
                  ddp_strerror(st));
    return st;
}

static ddp_status ctx_open_backend(ddp_ctx *ctx, const ddp_init_opts *opts)
{
    ddp_status st = ctx_resolve_backend(ctx, opts->backend);
    if (st != DDP_OK)
        return st;
    ctx->threads = opts->threads > 0 ? opts->threads : 1;
    if (ctx->backend == DDP_BACKEND_CUDA) {
        /* dev is set wherever the device opened, so ctx_release closes it when a peer failed */
        st = ctx_open_device(ctx);
        ctx->dev = st == DDP_OK ? device_ops_cuda() : NULL;
        return ctx_agree(ctx, st, "GPU set-up");
    }
    ctx->dev = device_ops_cpu();
    return DDP_OK;
}

static ddp_status ctx_open_comms(ddp_ctx *ctx)
{
    ddp_status st = comm_mpi_create(&ctx->host_comm);
    if (st != DDP_OK)
        return st;
    if (ctx->backend == DDP_BACKEND_CUDA)
        return comm_nccl_create(ctx->rank, ctx->world_size, &ctx->comm);
    ctx->comm = ctx->host_comm;
    return DDP_OK;
}

/* ---- start-up table --------------------------------------------------------------------------- */

typedef struct rank_row {
    int rank, local_rank, node_rank, device;
    char host[64];
    char cpus[128];
} rank_row;

/* This process's CPU affinity as a list of ranges, e.g. "0-3,8,10-11". */
static void ctx_affinity(char *out, size_t size)
{
    cpu_set_t set;
    size_t len = 0;
    out[0] = '\0';
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        snprintf(out, size, "?");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && len + 24 < size; c++) {
        if (!CPU_ISSET(c, &set))
            continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
            last++;
        len += (size_t)snprintf(out + len, size - len, len ? ",%d" : "%d", c);
        if (last > c)
            len += (size_t)snprintf(out + len, size - len, "-%d", last);
        c = last;
    }
}

static void ctx_print_rows(const ddp_ctx *ctx, const rank_row *rows)
{
    DDP_INFO0("libddp %s: backend %s, %d rank(s) on %d node(s), %d compute thread(s) per rank",
              ddp_version(), ddp_backend_name(ctx->backend), ctx->world_size, ctx->n_nodes,
              ctx->threads);
    DDP_INFO0("%5s  %-20s  %5s  %4s  %6s  %s", "rank", "host", "local", "node", "device", "cpus");
    for (int r = 0; r < ctx->world_size; r++) {
        char device[16] = "cpu"; /* a GPU's index, or the CPU (device -1) */
        if (rows[r].device >= 0)
            snprintf(device, sizeof device, "gpu %d", rows[r].device);
        DDP_INFO0("%5d  %-20s  %5d  %4d  %6s  %s", rows[r].rank, rows[r].host, rows[r].local_rank,
                  rows[r].node_rank, device, rows[r].cpus);
    }
}

/* Gathers one row per rank to rank 0, which prints the table. Collective. */
static ddp_status ctx_print_table(const ddp_ctx *ctx)
{
    ddp_status st = DDP_OK;
    rank_row mine = {.rank = ctx->rank, .local_rank = ctx->local_rank,
                     .node_rank = ctx->node_rank, .device = ctx->device};
    snprintf(mine.host, sizeof mine.host, "%.63s", ctx->hostname);
    ctx_affinity(mine.cpus, sizeof mine.cpus);
    rank_row *rows = ctx->rank == 0 ? calloc((size_t)ctx->world_size, sizeof *rows) : NULL;
    int ok = ctx->rank != 0 || rows != NULL;
    watch_enter(DDP_WATCH_CALLER, "start-up rank table", -1, sizeof mine);
    TRY_MPI_GOTO(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (!ok) {
        DDP_WARN0("out of memory for the rank table; not printed");
        goto cleanup;
    }
    TRY_MPI_GOTO(MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, rows, (int)sizeof mine, MPI_BYTE, 0,
                            MPI_COMM_WORLD));
    if (ctx->rank == 0)
        ctx_print_rows(ctx, rows);
cleanup:
    watch_leave(DDP_WATCH_CALLER);
    free(rows);
    return st;
}

/* ---- init / finalize -------------------------------------------------------------------------- */

/* Releases what ctx holds; finalises MPI when ctx started it. The ring says goodbye first, so
 * that ranks leaving at different moments are not taken for dead ones. */
static void ctx_release(ddp_ctx *ctx)
{
    watchdog_disconnect();
    if (ctx->comm && ctx->comm != ctx->host_comm)
        ctx->comm->ops->destroy(ctx->comm);
    if (ctx->host_comm)
        ctx->host_comm->ops->destroy(ctx->host_comm);
    if (ctx->backend == DDP_BACKEND_CUDA && ctx->dev)
        cuda_device_close();
    if (ctx->owns_mpi) {
        watch_enter(DDP_WATCH_CALLER, "MPI_Finalize", -1, 0);
        MPI_Finalize();
        watch_leave(DDP_WATCH_CALLER);
    }
    watchdog_stop();
    free(ctx);
}

static ddp_status ctx_setup(ddp_ctx *ctx, const ddp_init_opts *opts)
{
    watchdog_start();
    watch_enter(DDP_WATCH_CALLER, "MPI_Init", -1, 0);
    ddp_status st = ctx_start_mpi(ctx);
    watch_leave(DDP_WATCH_CALLER);
    watch_enter(DDP_WATCH_CALLER, "start-up topology", -1, 0);
    if (st == DDP_OK)
        st = ctx_topology(ctx);
    watch_leave(DDP_WATCH_CALLER);
    if (st != DDP_OK)
        return st;
    log_set_identity(ctx->rank, ctx->hostname);
    st = watchdog_connect(ctx->rank, ctx->world_size, ctx->hostname);
    if (st != DDP_OK)
        return st;
    st = ctx_agree(ctx, ctx_check_env(ctx), "the environment check");
    if (st == DDP_OK)
        st = ctx_open_backend(ctx, opts);
    if (st == DDP_OK)
        st = ctx_agree(ctx, ctx_open_comms(ctx), "communicator set-up");
    if (st == DDP_OK && opts->print_table)
        st = ctx_print_table(ctx);
    return st;
}

/* The wall clock in seconds since the epoch: compared across processes (an elastic restart). */
static double wall_now(void)
{
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    return (double)w.tv_sec + 1e-9 * (double)w.tv_nsec;
}

ddp_status ddp_init(const ddp_init_opts *opts, ddp_ctx **out)
{
    ddp_init_opts defaults;
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!opts) {
        ddp_init_opts_default(&defaults);
        opts = &defaults;
    }
    if (opts->backend < DDP_BACKEND_AUTO || opts->backend > DDP_BACKEND_CUDA) {
        DDP_ERROR("ddp_init: unknown backend %d (use DDP_BACKEND_AUTO, _CPU or _CUDA)",
                  (int)opts->backend);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        DDP_ERROR("out of memory for the context");
        return DDP_ERR_NOMEM;
    }
    ctx->device = -1;
    ctx->backend = DDP_BACKEND_CPU;
    ctx->init_begin = wall_now();
    if (gethostname(ctx->hostname, sizeof ctx->hostname - 1) != 0)
        snprintf(ctx->hostname, sizeof ctx->hostname, "unknown-host");
    ddp_status st = ctx_setup(ctx, opts);
    if (st != DDP_OK) {
        ctx_release(ctx);
        return st;
    }
    ctx->init_end = wall_now();
    *out = ctx;
    return DDP_OK;
}

void ddp_finalize(ddp_ctx *ctx)
{
    if (ctx)
        ctx_release(ctx);
}

void ddp_abort(ddp_ctx *ctx, int code)
{
    int inited = 0, finalized = 0;
    (void)ctx;
    fflush(stdout);
    fflush(stderr);
    watchdog_announce_abort(); /* the ring ends the job even where MPI_Abort reaches no peer */
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized)
        MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* ---- accessors and memory --------------------------------------------------------------------- */

int ddp_rank(const ddp_ctx *ctx) { return ctx ? ctx->rank : 0; }
int ddp_world_size(const ddp_ctx *ctx) { return ctx ? ctx->world_size : 1; }
int ddp_local_rank(const ddp_ctx *ctx) { return ctx ? ctx->local_rank : 0; }
int ddp_local_world_size(const ddp_ctx *ctx) { return ctx ? ctx->local_world_size : 1; }
int ddp_node_rank(const ddp_ctx *ctx) { return ctx ? ctx->node_rank : 0; }
int ddp_num_nodes(const ddp_ctx *ctx) { return ctx ? ctx->n_nodes : 1; }
const char *ddp_hostname(const ddp_ctx *ctx) { return ctx ? ctx->hostname : ""; }
ddp_backend_kind ddp_backend(const ddp_ctx *ctx) { return ctx ? ctx->backend : DDP_BACKEND_CPU; }
int ddp_device(const ddp_ctx *ctx) { return ctx ? ctx->device : -1; }
void *ddp_backend_stream(const ddp_ctx *ctx)
{
    return ctx && ctx->backend == DDP_BACKEND_CUDA ? cuda_stream() : NULL;
}

/* The context's backend memory; host memory without a context. NULL for a context whose device
 * did not open. */
static const device_ops *ctx_dev(const ddp_ctx *ctx)
{
    return ctx ? ctx->dev : device_ops_cpu();
}

void *ddp_alloc(ddp_ctx *ctx, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    return dev ? dev->alloc(n_bytes) : NULL;
}

void ddp_free(ddp_ctx *ctx, void *p)
{
    const device_ops *dev = ctx_dev(ctx);
    if (dev && p)
        dev->free(p);
}

ddp_status ddp_upload(ddp_ctx *ctx, void *dst, const void *src_host, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    if (n_bytes && (!dst || !src_host))
        return DDP_ERR_INVALID_ARG;
    return dev->upload(dst, src_host, n_bytes);
}

ddp_status ddp_download(ddp_ctx *ctx, void *dst_host, const void *src, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    if (n_bytes && (!dst_host || !src))
        return DDP_ERR_INVALID_ARG;
    return dev->download(dst_host, src, n_bytes);
}

ddp_status ddp_copy(ddp_ctx *ctx, void *dst, const void *src, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    if (n_bytes && (!dst || !src))
        return DDP_ERR_INVALID_ARG;
    return dev->copy(dst, src, n_bytes);
}

ddp_status ddp_zero(ddp_ctx *ctx, void *dst, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    if (n_bytes && !dst)
        return DDP_ERR_INVALID_ARG;
    return dev->zero(dst, n_bytes);
}

ddp_status ddp_memory_info(ddp_ctx *ctx, size_t *used, size_t *total)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    size_t u = 0, t = 0;
    ddp_status st = dev->info ? dev->info(&u, &t) : DDP_ERR_UNSUPPORTED;
    if (used)
        *used = u;
    if (total)
        *total = t;
    return st;
}

ddp_status ddp_profiler_range(ddp_ctx *ctx, int start)
{
    if (!ctx)
        return DDP_ERR_STATE;
    const device_ops *dev = ctx_dev(ctx);
    return dev && dev->profiler ? dev->profiler(start) : DDP_OK;
}

/* ---- snapshots (ddp_checkpoint.h) ---------------------------------------------------------- */

ddp_status ddp_snapshot_pin(ddp_ctx *ctx, void *host, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    if (!host && n_bytes)
        return DDP_ERR_INVALID_ARG;
    return dev->snapshot_pin && n_bytes ? dev->snapshot_pin(host, n_bytes) : DDP_OK;
}

ddp_status ddp_snapshot_unpin(ddp_ctx *ctx, void *host)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    return dev->snapshot_unpin && host ? dev->snapshot_unpin(host) : DDP_OK;
}

ddp_status ddp_snapshot_copy(ddp_ctx *ctx, void *dst_host, const void *src, size_t n_bytes)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    if (n_bytes && (!dst_host || !src))
        return DDP_ERR_INVALID_ARG;
    return n_bytes ? dev->snapshot_copy(dst_host, src, n_bytes) : DDP_OK;
}

ddp_status ddp_snapshot_fence(ddp_ctx *ctx)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    return dev->snapshot_fence ? dev->snapshot_fence() : DDP_OK;
}

ddp_status ddp_snapshot_wait(ddp_ctx *ctx)
{
    const device_ops *dev = ctx_dev(ctx);
    if (!dev)
        return DDP_ERR_STATE;
    return dev->snapshot_wait ? dev->snapshot_wait() : DDP_OK;
}

/* The staging's checks: two slots, two parts. */
static ddp_status ctx_stage_check(const ddp_ctx *ctx, int slot, int part)
{
    if (!ctx_dev(ctx))
        return DDP_ERR_STATE;
    if (slot < 0 || slot > 1 || part < 0 || part > 1) {
        DDP_ERROR("batch staging: slot %d, part %d: both must be 0 or 1", slot, part);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

ddp_status ddp_stage_upload(ddp_ctx *ctx, int slot, int part, void *dst, const void *src_host,
                            size_t n_bytes)
{
    ddp_status st = ctx_stage_check(ctx, slot, part);
    if (st == DDP_OK && n_bytes && (!dst || !src_host))
        st = DDP_ERR_INVALID_ARG;
    return st == DDP_OK ? ctx_dev(ctx)->stage_upload(slot, part, dst, src_host, n_bytes) : st;
}

ddp_status ddp_stage_acquire(ddp_ctx *ctx, int slot)
{
    ddp_status st = ctx_stage_check(ctx, slot, 0);
    return st == DDP_OK ? ctx_dev(ctx)->stage_acquire(slot) : st;
}

ddp_status ddp_stage_release(ddp_ctx *ctx, int slot)
{
    ddp_status st = ctx_stage_check(ctx, slot, 0);
    return st == DDP_OK ? ctx_dev(ctx)->stage_release(slot) : st;
}

long ddp_host_peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}
