/* launcher.h - private interface between the parts of ddp-launch: launch-environment detection
 * (env.c), Slurm hostlist expansion (hostlist.c), GPU mapping (gpumap.c), CPU binding (bind.c),
 * trap detection (traps.c), log files (logdir.c), the --print-env job table (jobtable.c) and the
 * fork supervisor (supervise.c); ddp_launch.c holds main, the options and the exec. The logic takes its inputs as arguments (an environment array, device
 * lists, a topology) so the tests drive it without starting processes.
 *
 * Failure convention: functions returning int return 0 on success and -1 on failure, after writing
 * a one-line message that says what to change into err[errlen]; their outputs are then undefined
 * unless documented otherwise. Nothing here exits the process. */
#ifndef LAUNCHER_H
#define LAUNCHER_H

#include <stddef.h>

#include "blas_policy.h"
#include "config.h"

#if HAVE_HWLOC
#include <hwloc.h>
#endif

#define LAUNCH_ERRMSG_LEN 1024
#define LAUNCH_MAX_GPUS 64
#define LAUNCH_GPU_ID_LEN 96
#define LAUNCH_HOST_LEN 256

/* Who started this process. */
enum launch_source {
    LAUNCH_SOURCE_NONE,     /* nothing: ddp-launch starts the ranks itself (-n) or runs one rank */
    LAUNCH_SOURCE_SRUN,     /* Slurm step: SLURM_PROCID with SLURM_STEP_* */
    LAUNCH_SOURCE_MPIRUN,   /* Open MPI's mpirun: OMPI_COMM_WORLD_* */
    LAUNCH_SOURCE_PMIX,     /* a PMIx launcher that gives PMIX_RANK only */
    LAUNCH_SOURCE_HYDRA,    /* MPICH's mpiexec (Hydra): PMI_RANK with MPI_LOCALRANKID */
    LAUNCH_SOURCE_TORCHRUN, /* torchrun-style RANK / WORLD_SIZE / LOCAL_RANK */
    LAUNCH_SOURCE_LOCAL,    /* a child forked by ddp-launch -n N */
};

/* Name used in DDP_LAUNCHER and messages: "srun", "mpirun", ... ("none" for LAUNCH_SOURCE_NONE). */
const char *launch_source_name(enum launch_source source);

enum launch_bind_mode { LAUNCH_BIND_AUTO, LAUNCH_BIND_FORCE, LAUNCH_BIND_NONE };

/* Command-line choices; numbers are -1 and strings NULL when not given. */
struct launch_options {
    int n_procs;         /* -n N */
    int nproc_per_node;  /* --nproc-per-node N */
    int ntasks_per_node; /* --ntasks-per-node N (a cross-check) */
    int master_port;     /* --master-port P */
    const char *master_addr; /* --master-addr HOST */
    const char *log_dir;     /* --log-dir DIR */
    enum launch_bind_mode bind;
    int share_gpus, print_env, dry_run, verbose;
    int max_restarts;    /* --max-restarts R: generations after the first (-1: not given) */
    int min_ranks;       /* --min-ranks K (-1: not given) */
    int shrink;          /* --shrink-on-failure */
    int min_nodes;       /* --min-nodes K, Slurm generations (0: not given) */
};

/* Options with nothing given. */
void launch_options_init(struct launch_options *opt);

/* The rank layout of this process. */
struct launch_layout {
    enum launch_source source;
    int rank, world_size, local_rank, local_world_size, node_rank, n_nodes;
    char master_addr[LAUNCH_HOST_LEN];
    int master_port;
    char job_key[128]; /* names this launch (all ranks agree); used for the --print-env folder */
};

/* ---- env.c ------------------------------------------------------------------------------- */

/* Value of NAME in the NULL-terminated array envp ("NAME=value"), or NULL when absent. */
const char *launch_env_get(char *const *envp, const char *name);

/* Works out the layout from envp and the options. Sources that disagree on a value, values out of
 * range, and flags that contradict the launcher are errors naming both sides. With no launcher in
 * envp the layout has source LAUNCH_SOURCE_NONE, world size -n (or 1), and rank 0. */
int launch_layout_detect(char *const *envp, const struct launch_options *opt, struct launch_layout *out,
                         char *err, size_t errlen);

/* Number of tasks on node NODE from a Slurm per-node count list such as "2(x3),1"; -1 when the
 * list is malformed or too short. */
int launch_slurm_tasks_on_node(const char *spec, int node);

/* Derived MASTER_PORTs lie in [LAUNCH_PORT_MIN, LAUNCH_PORT_END): above the usual service ports and
 * below Linux's ephemeral range (32768-60999), where a bind could find the port taken. */
#define LAUNCH_PORT_MIN 20000
#define LAUNCH_PORT_END 32768
/* A port in that range from a 64-bit hash. */
int launch_port_from_hash(unsigned long long h);
/* The port derived from a Slurm job and step: a hash of both into the range, so the steps of one
 * job, and jobs sharing a node, get different ports (unless the hash collides: set MASTER_PORT). */
int launch_master_port(unsigned long long job_id, unsigned long long step_id);

/* ---- hostlist.c -------------------------------------------------------------------------- */

struct launch_hostlist {
    size_t n;
    char **names;
};

/* Expands a Slurm hostlist ("gpu-a[007-009,11],b3", "rack[1-2]-n[01-02]") as Slurm does: commas
 * outside brackets separate hosts, a bracket holds numbers and ranges whose zero padding follows
 * the lower bound, several groups multiply, and text after the last group is rejected like Slurm.
 * On failure out is empty. Free with launch_hostlist_free (NULL-safe, idempotent). */
int launch_hostlist_expand(const char *list, struct launch_hostlist *out, char *err, size_t errlen);
void launch_hostlist_free(struct launch_hostlist *hl);

/* ---- gpumap.c ---------------------------------------------------------------------------- */

/* Devices as CUDA_VISIBLE_DEVICES names them (ordinals, UUIDs, MIG ids), with PCI bus ids when known. */
struct launch_gpu_list {
    int n;
    char id[LAUNCH_MAX_GPUS][LAUNCH_GPU_ID_LEN];
    char busid[LAUNCH_MAX_GPUS][32]; /* "0000:3b:00.0", or "" when unknown */
};

/* Parses a CUDA_VISIBLE_DEVICES value; "", "-1", "none" and "NoDevFiles" give no device. */
int launch_gpu_list_parse(const char *spec, struct launch_gpu_list *out, char *err, size_t errlen);

/* Finds this process's visible GPUs: CUDA_VISIBLE_DEVICES (when set) limited to the number the
 * CUDA driver reports (libcuda loaded with dlopen; no driver means no GPU). DDP_SIMULATE_GPUS=N
 * replaces the driver's count by N (a testing aid). */
int launch_gpu_discover(char *const *envp, struct launch_gpu_list *out, char *err, size_t errlen);

/* True when Slurm has narrowed CUDA_VISIBLE_DEVICES to this task's own GPUs (--gpus-per-task or
 * --gpu-bind other than none/closest), as slurmd's SLURMD_TRES_BIND says, or without it
 * SLURM_GPUS_PER_TASK / SLURM_GPU_BIND in envp. */
int launch_gpus_narrowed(char *const *envp);

struct launch_gpu_choice {
    int device;       /* ordinal within `visible` (what DDP_DEVICE says), -1 = CPU backend */
    char visible[LAUNCH_MAX_GPUS * LAUNCH_GPU_ID_LEN]; /* CUDA_VISIBLE_DEVICES to export; "" = no GPU */
    int n_sharing;    /* local ranks using this device (1 unless --share-gpus) */
    int share_index;  /* this rank's position among them */
};

/* Maps local rank LOCAL_RANK of LOCAL_SIZE to a device of `visible`, whose whole list is exported
 * (never narrowed to the rank's own GPU: NCCL's P2P transport needs the peers visible). Narrowed
 * lists are used as Slurm gave them (device 0); otherwise local rank r gets device r, or r mod n
 * when SHARE is set.
 * Fails when there are more local ranks than devices and SHARE is not set. */
int launch_gpu_map(const struct launch_gpu_list *visible, int narrowed, int local_rank, int local_size,
                   int share, struct launch_gpu_choice *out, char *err, size_t errlen);

/* ---- traps.c ----------------------------------------------------------------------------- */

/* Finds PROGRAM as execvp would (in envp's PATH unless it holds a '/'), into PATH_OUT; -1 when no
 * executable file is found. */
int launch_find_program(char *const *envp, const char *program, char *path_out, size_t len);

enum launch_mpi_flavour { LAUNCH_MPI_NONE, LAUNCH_MPI_OPENMPI, LAUNCH_MPI_MPICH };

/* Which MPI PROGRAM is linked with: DDP_MPI_PROGRAM=openmpi|mpich|none in envp wins, otherwise
 * the libraries ldd lists for the program found in PATH. Scripts and unknown files give NONE. */
enum launch_mpi_flavour launch_program_mpi(char *const *envp, const char *program);

/* Refuses launches known to fail or hang (an Open MPI program under srun without PMIx, under
 * MPICH's mpiexec, or an MPICH program under Open MPI's mpirun); the message says how to fix it. */
int launch_check_traps(char *const *envp, const struct launch_layout *layout, enum launch_mpi_flavour mpi,
                       char *err, size_t errlen);

/* ---- bind.c ------------------------------------------------------------------------------ */

#if HAVE_HWLOC
/* Loads the machine's topology, or the synthetic description SYNTHETIC when not NULL (e.g.
 * "pack:2 core:4 pu:2"); WITH_IO keeps PCI devices for GPU locality. */
int launch_topology_load(hwloc_topology_t *topo, const char *synthetic, int with_io, char *err,
                         size_t errlen);

/* Into OUT, the cores of DOMAIN split evenly into COUNT contiguous shares: share INDEX. With more
 * shares than cores, share i gets core i mod n_cores. Fails when DOMAIN holds no PU. */
int launch_bind_split(hwloc_topology_t topo, hwloc_const_cpuset_t domain, int index, int count,
                      hwloc_cpuset_t out);

/* Into OUT, the CPUs nearest the GPU at PCI bus id BUSID; fails when the topology does not know it. */
int launch_gpu_near_cpuset(hwloc_topology_t topo, const char *busid, hwloc_cpuset_t out);

enum launch_bind_action { LAUNCH_BIND_KEPT, LAUNCH_BIND_BOUND, LAUNCH_BIND_UNBOUND };

struct launch_bind_request {
    enum launch_bind_mode mode;
    hwloc_const_cpuset_t current; /* the binding the process has now */
    int local_rank, local_size;
    hwloc_const_cpuset_t *gpu_near; /* per local rank, the CPUs near its GPU; NULL entries or array = none */
};

/* Chooses this rank's CPU set: --bind=none keeps CURRENT; a CURRENT narrower than the allowed
 * CPUs is an existing binding, kept unless the mode is force; otherwise the ranks sharing a GPU's
 * CPUs split them, and ranks without GPU locality split the allowed CPUs. */
int launch_bind_plan(hwloc_topology_t topo, const struct launch_bind_request *req, hwloc_cpuset_t out,
                     enum launch_bind_action *action);

/* Number of whole cores in SET (of PUs when it holds no whole core), at least 1. */
int launch_cpuset_cores(hwloc_topology_t topo, hwloc_const_cpuset_t set);
#endif

/* What run-time set-up decided for one rank: the exports and its --print-env line. */
struct launch_setup {
    struct launch_gpu_choice gpu;
    struct blas_decision blas;
    char blas_note[96]; /* --print-env's BLAS column: the core, "X(preset)" or "-" (OpenBLAS's own) */
    char log_dir[4096]; /* --log-dir made absolute, or "" */
    char logs[8400];    /* "DIR/rank.N.out DIR/rank.N.err" for --print-env, or "" */
    char cpuset[512];
    int threads;
    char host[LAUNCH_HOST_LEN];
};

/* Chooses this rank's CPUs (launch_bind_plan, nearest its GPU when the GPUs' bus ids are known)
 * and, unless opt->dry_run, binds the process; fills s->cpuset and s->threads. Returns 0; 1 when
 * the binding could not be applied (the rank runs unbound; err says so); -1 when the topology
 * cannot be loaded or holds no allowed CPU. Without hwloc: no binding, the rank's share of the
 * online CPUs as threads, and 0. */
int launch_bind_rank(const struct launch_options *opt, const struct launch_layout *l,
                     const struct launch_gpu_list *gpus, int narrowed, struct launch_setup *s, char *err,
                     size_t errlen);

/* ---- jobtable.c -------------------------------------------------------------------------- */

/* --print-env: writes this rank's line to $DDP_PRINT_DIR (default /tmp/ddp-printenv-<job key>);
 * rank 0 then waits up to $DDP_PRINT_TIMEOUT seconds (default 10) for every rank's line and prints
 * the table on stdout, naming the ranks missing. Returns 0; 1 when the folder cannot be written
 * (this rank's line is printed alone; err says so). */
int launch_table_gather(const struct launch_layout *l, const struct launch_setup *s, char *err,
                        size_t errlen);

/* ---- supervise.c ------------------------------------------------------------------------- */

/* One forked rank: runs rank L, returns its exit status (only when it does not exec). */
typedef int (*launch_rank_fn)(const struct launch_layout *l, void *arg);

/* Forks base->world_size ranks (rank = local rank = r, each in its own process group) running RUN,
 * passes SIGUSR1/SIGUSR2 on to them, and on the first failure, SIGINT or SIGTERM stops the others
 * (SIGTERM, SIGKILL after 5 s) and names the rank that failed on stderr. Returns the exit status
 * to report (the first failing rank's, 128 + the stopping signal, or 0); -1 when a fork fails
 * (the ranks already started are stopped; err says why). */
int launch_fork_ranks(const struct launch_layout *base, launch_rank_fn run, void *arg, char *err,
                      size_t errlen);

/* Runs argv (mpirun and its arguments) as a child in this process group and waits for it; returns
 * its exit status (128 + signal when killed; 127 when it cannot be started, -1 when fork fails).
 * Signals sent to ddp-launch are passed on so that the job can stop cleanly: SIGUSR1 and SIGUSR2
 * as they are (mpirun hands both to every rank); the first SIGTERM, SIGINT or SIGHUP as SIGUSR2
 * (ddp-train stops every rank after the same step, checkpoints and exits 0, as on SIGTERM; mpirun
 * itself would end the job at once on SIGTERM), a second one as SIGTERM. */
int launch_supervise_mpirun(char *const *argv);
/* Whether SIGINT, SIGTERM or SIGHUP reached ddp-launch while it supervised (the user's stop: no
 * restart follows). */
int launch_stop_requested(void);

/* One line of a child's stderr (without its newline). */
typedef void (*launch_line_fn)(const char *line, void *arg);

/* Runs argv (srun and its arguments) as a child and waits for it, copying its stderr to this
 * process's stderr line by line and handing each line to ON_LINE (NULL: none); its stdout is this
 * process's. SIGUSR1 and SIGUSR2 are passed on as they are, SIGINT, SIGTERM and SIGHUP as SIGTERM
 * (launch_stop_requested then says so). Returns the child's exit status (128 + signal when killed,
 * 127 when it cannot be started); -1 when the pipe or the fork fails (nothing was started). */
int launch_supervise_lines(char *const *argv, launch_line_fn on_line, void *arg);

/* Runs the N commands ARGVS[i] at once, their output discarded, for at most LIMIT_S seconds:
 * STATUS[i] is command i's exit status, -1 when it was still running at the limit (it is then
 * killed), -2 when it could not be forked. Returns 0; -1 when out of memory (nothing ran). */
int launch_run_probes(char *const *const *argvs, int n, double limit_s, int *status);

/* ---- logdir.c --------------------------------------------------------------------------- */

/* Creates DIR and its parents (ranks may race: an existing folder is fine) and writes its absolute
 * path into ABS_OUT. */
int launch_log_dir_prepare(const char *dir, char *abs_out, size_t len, char *err, size_t errlen);

/* The paths of rank RANK's log files: DIR/rank.RANK.out and DIR/rank.RANK.err. */
void launch_log_paths(const char *dir, int rank, char *out_path, char *err_path, size_t len);

/* Points this process's stdout and stderr at rank RANK's log files in DIR (created or truncated),
 * to be inherited by the program it execs. With TEE, first starts a follower process that copies
 * both files to the current stdout and stderr until this process has exited. Returns 0; 1 when
 * the logs are in place but the follower could not start (err says so); -1 when nothing was
 * redirected (err says why). */
int launch_log_redirect(const char *dir, int rank, int tee, char *err, size_t errlen);

/* ---- ddp-launch's own (ddp_launch.c, elastic.c) -------------------------------------------- */

/* ddp-launch -n N on this machine: the ranks through mpirun when there is one, else forked.
 * Returns the job's exit status. */
int launch_local(const struct launch_options *opt, struct launch_layout *l, char **args);

/* --max-restarts, --shrink-on-failure, --min-ranks, --min-nodes: generation after generation
 * (elastic.c), on this machine or in a Slurm batch script; exits 2 for flags that do not fit the
 * launch. Returns the last generation's exit status. */
int launch_elastic(const struct launch_options *opt, struct launch_layout *base, char **args);

#endif /* LAUNCHER_H */
