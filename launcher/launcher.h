/* launcher.h - private interface between the parts of ddp-launch: launch-environment detection
 * (env.c), Slurm hostlist expansion (hostlist.c), GPU mapping (gpumap.c), CPU binding (bind.c) and
 * trap detection (traps.c). The logic takes its inputs as arguments (an environment array, device
 * lists, a topology) so the tests drive it without starting processes.
 *
 * Failure convention: functions returning int return 0 on success and -1 on failure, after writing
 * a one-line message that says what to change into err[errlen]; their outputs are then undefined
 * unless documented otherwise. Nothing here exits the process. */
#ifndef DDP_LAUNCHER_H
#define DDP_LAUNCHER_H

#include <stddef.h>

#include "config.h"

#if HAVE_HWLOC
#include <hwloc.h>
#endif

#define DDP_ERRMSG_LEN 1024
#define DDP_MAX_GPUS 64
#define DDP_GPU_ID_LEN 96
#define DDP_HOST_LEN 256

/* Who started this process. */
enum source {
    DDP_SOURCE_NONE,     /* nothing: ddp-launch starts the ranks itself (-n) or runs one rank */
    DDP_SOURCE_SRUN,     /* Slurm step: SLURM_PROCID with SLURM_STEP_* */
    DDP_SOURCE_MPIRUN,   /* Open MPI's mpirun: OMPI_COMM_WORLD_* */
    DDP_SOURCE_PMIX,     /* a PMIx launcher that gives PMIX_RANK only */
    DDP_SOURCE_HYDRA,    /* MPICH's mpiexec (Hydra): PMI_RANK with MPI_LOCALRANKID */
    DDP_SOURCE_TORCHRUN, /* torchrun-style RANK / WORLD_SIZE / LOCAL_RANK */
    DDP_SOURCE_LOCAL,    /* a child forked by ddp-launch -n N */
};

/* Name used in DDP_LAUNCHER and messages: "srun", "mpirun", ... ("none" for DDP_SOURCE_NONE). */
const char *source_name(enum source source);

enum bind_mode { DDP_BIND_AUTO, DDP_BIND_FORCE, DDP_BIND_NONE };

/* Command-line choices; numbers are -1 and strings NULL when not given. */
struct options {
    int n_procs;         /* -n N */
    int nproc_per_node;  /* --nproc-per-node N */
    int ntasks_per_node; /* --ntasks-per-node N (a cross-check) */
    int master_port;     /* --master-port P */
    const char *master_addr; /* --master-addr HOST */
    const char *log_dir;     /* --log-dir DIR */
    enum bind_mode bind;
    int share_gpus, print_env, dry_run, verbose;
};

/* Options with nothing given. */
void options_init(struct options *opt);

/* The rank layout of this process. */
struct layout {
    enum source source;
    int rank, world_size, local_rank, local_world_size, node_rank, n_nodes;
    char master_addr[DDP_HOST_LEN];
    int master_port;
    char job_key[128]; /* names this launch (all ranks agree); used for the --print-env folder */
};

/* ---- env.c ------------------------------------------------------------------------------- */

/* Value of NAME in the NULL-terminated array envp ("NAME=value"), or NULL when absent. */
const char *env_get(char *const *envp, const char *name);

/* Works out the layout from envp and the options. Sources that disagree on a value, values out of
 * range, and flags that contradict the launcher are errors naming both sides. With no launcher in
 * envp the layout has source DDP_SOURCE_NONE, world size -n (or 1), and rank 0. */
int layout_detect(char *const *envp, const struct options *opt, struct layout *out,
                      char *err, size_t errlen);

/* Number of tasks on node NODE from a Slurm per-node count list such as "2(x3),1"; -1 when the
 * list is malformed or too short. */
int slurm_tasks_on_node(const char *spec, int node);

/* Derived MASTER_PORTs lie in [DDP_PORT_MIN, DDP_PORT_END): above the usual service ports and
 * below Linux's ephemeral range (32768-60999), where a bind could find the port taken. */
#define DDP_PORT_MIN 20000
#define DDP_PORT_END 32768
/* A port in that range from a 64-bit hash. */
int port_from_hash(unsigned long long h);
/* The port derived from a Slurm job and step: a hash of both into the range, so the steps of one
 * job, and jobs sharing a node, get different ports (unless the hash collides: set MASTER_PORT). */
int master_port(unsigned long long job_id, unsigned long long step_id);

/* ---- hostlist.c -------------------------------------------------------------------------- */

struct hostlist {
    size_t n;
    char **names;
};

/* Expands a Slurm hostlist ("gpu-a[007-009,11],b3", "rack[1-2]-n[01-02]") as Slurm does: commas
 * outside brackets separate hosts, a bracket holds numbers and ranges whose zero padding follows
 * the lower bound, several groups multiply, and text after the last group is rejected like Slurm.
 * On failure out is empty. Free with hostlist_free (NULL-safe, idempotent). */
int hostlist_expand(const char *list, struct hostlist *out, char *err, size_t errlen);
void hostlist_free(struct hostlist *hl);

/* ---- gpumap.c ---------------------------------------------------------------------------- */

/* Devices as CUDA_VISIBLE_DEVICES names them (ordinals, UUIDs, MIG ids), with PCI bus ids when known. */
struct gpu_list {
    int n;
    char id[DDP_MAX_GPUS][DDP_GPU_ID_LEN];
    char busid[DDP_MAX_GPUS][32]; /* "0000:3b:00.0", or "" when unknown */
};

/* Parses a CUDA_VISIBLE_DEVICES value; "", "-1", "none" and "NoDevFiles" give no device. */
int gpu_list_parse(const char *spec, struct gpu_list *out, char *err, size_t errlen);

/* Finds this process's visible GPUs: CUDA_VISIBLE_DEVICES (when set) limited to the number the
 * CUDA driver reports (libcuda loaded with dlopen; no driver means no GPU). DDP_SIMULATE_GPUS=N
 * replaces the driver's count by N (a testing aid). */
int gpu_discover(char *const *envp, struct gpu_list *out, char *err, size_t errlen);

/* True when Slurm has narrowed CUDA_VISIBLE_DEVICES to this task's own GPUs (--gpus-per-task or
 * --gpu-bind other than none/closest), as slurmd's SLURMD_TRES_BIND says, or without it
 * SLURM_GPUS_PER_TASK / SLURM_GPU_BIND in envp. */
int gpus_narrowed(char *const *envp);

struct gpu_choice {
    int device;       /* ordinal within `visible` (what DDP_DEVICE says), -1 = CPU backend */
    char visible[DDP_MAX_GPUS * DDP_GPU_ID_LEN]; /* CUDA_VISIBLE_DEVICES to export; "" = no GPU */
    int n_sharing;    /* local ranks using this device (1 unless --share-gpus) */
    int share_index;  /* this rank's position among them */
};

/* Maps local rank LOCAL_RANK of LOCAL_SIZE to a device of `visible`. Narrowed lists are used as
 * Slurm gave them (device 0); otherwise local rank r gets device r, or r mod n when SHARE is set.
 * Fails when there are more local ranks than devices and SHARE is not set. */
int gpu_map(const struct gpu_list *visible, int narrowed, int local_rank, int local_size,
                int share, struct gpu_choice *out, char *err, size_t errlen);

/* ---- traps.c ----------------------------------------------------------------------------- */

/* Finds PROGRAM as execvp would (in envp's PATH unless it holds a '/'), into PATH_OUT; -1 when no
 * executable file is found. */
int find_program(char *const *envp, const char *program, char *path_out, size_t len);

enum mpi_flavour { DDP_MPI_NONE, DDP_MPI_OPENMPI, DDP_MPI_MPICH };

/* Which MPI PROGRAM is linked with: DDP_MPI_PROGRAM=openmpi|mpich|none in envp wins, otherwise
 * the libraries ldd lists for the program found in PATH. Scripts and unknown files give NONE. */
enum mpi_flavour program_mpi(char *const *envp, const char *program);

/* Refuses launches known to fail or hang (an Open MPI program under srun without PMIx, under
 * MPICH's mpiexec, or an MPICH program under Open MPI's mpirun); the message says how to fix it. */
int check_traps(char *const *envp, const struct layout *layout, enum mpi_flavour mpi,
                    char *err, size_t errlen);

/* ---- bind.c ------------------------------------------------------------------------------ */

#if HAVE_HWLOC
/* Loads the machine's topology, or the synthetic description SYNTHETIC when not NULL (e.g.
 * "pack:2 core:4 pu:2"); WITH_IO keeps PCI devices for GPU locality. */
int topology_load(hwloc_topology_t *topo, const char *synthetic, int with_io, char *err,
                      size_t errlen);

/* Into OUT, the cores of DOMAIN split evenly into COUNT contiguous shares: share INDEX. With more
 * shares than cores, share i gets core i mod n_cores. Fails when DOMAIN holds no PU. */
int bind_split(hwloc_topology_t topo, hwloc_const_cpuset_t domain, int index, int count,
                   hwloc_cpuset_t out);

/* Into OUT, the CPUs nearest the GPU at PCI bus id BUSID; fails when the topology does not know it. */
int gpu_near_cpuset(hwloc_topology_t topo, const char *busid, hwloc_cpuset_t out);

enum bind_action { DDP_BIND_KEPT, DDP_BIND_BOUND, DDP_BIND_UNBOUND };

struct bind_request {
    enum bind_mode mode;
    hwloc_const_cpuset_t current; /* the binding the process has now */
    int local_rank, local_size;
    hwloc_const_cpuset_t *gpu_near; /* per local rank, the CPUs near its GPU; NULL entries or array = none */
};

/* Chooses this rank's CPU set: --bind=none keeps CURRENT; a CURRENT narrower than the allowed
 * CPUs is an existing binding, kept unless the mode is force; otherwise the ranks sharing a GPU's
 * CPUs split them, and ranks without GPU locality split the allowed CPUs. */
int bind_plan(hwloc_topology_t topo, const struct bind_request *req, hwloc_cpuset_t out,
                  enum bind_action *action);

/* Number of whole cores in SET (of PUs when it holds no whole core), at least 1. */
int cpuset_cores(hwloc_topology_t topo, hwloc_const_cpuset_t set);
#endif

/* ---- logdir.c --------------------------------------------------------------------------- */

/* Creates DIR and its parents (ranks may race: an existing folder is fine) and writes its absolute
 * path into ABS_OUT. */
int log_dir_prepare(const char *dir, char *abs_out, size_t len, char *err, size_t errlen);

/* The paths of rank RANK's log files: DIR/rank.RANK.out and DIR/rank.RANK.err. */
void log_paths(const char *dir, int rank, char *out_path, char *err_path, size_t len);

/* Points this process's stdout and stderr at rank RANK's log files in DIR (created or truncated),
 * to be inherited by the program it execs. With TEE, first starts a follower process that copies
 * both files to the current stdout and stderr until this process has exited. Returns 0; 1 when
 * the logs are in place but the follower could not start (err says so); -1 when nothing was
 * redirected (err says why). */
int log_redirect(const char *dir, int rank, int tee, char *err, size_t errlen);

#endif /* DDP_LAUNCHER_H */
