/* ddp_launch.c - ddp-launch: finds out how it was started, computes the rank layout, maps the rank
 * to a GPU and CPU cores, exports the torchrun-style and DDP_* variables and execs the program. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blas_policy.h"
#include "launcher.h"
#include "suggest.h"

extern char **environ;

#define USAGE_EXIT 2
#define SETUP_EXIT 1

/* --help, in pieces shorter than the 4095 characters ISO C promises for one string literal. */
static const char *const help_text[] = {
    "Usage: ddp-launch [options] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts one rank of a data-parallel job: works out how it was started, exports the rank layout\n"
    "and replaces itself with PROGRAM (exec), so Slurm's signals reach the program.\n"
    "\n"
    "Launchers recognised (first match wins; the others present must agree, or it stops and names both):\n"
    "  mpirun    Open MPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE\n"
    "  hydra     MPICH mpiexec: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS\n"
    "  srun      Slurm step: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID,\n"
    "            SLURM_STEP_NUM_NODES, SLURM_STEP_TASKS_PER_NODE (PMIX_RANK/PMI_RANK cross-checked)\n"
    "  pmix      PMIX_RANK only (give the world size with -n)\n"
    "  torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK\n"
    "  none      -n N starts N ranks on this node: through `mpirun -np N --bind-to none` when mpirun\n"
    "            is in PATH (--oversubscribe beyond the core count, --allow-run-as-root as root),\n"
    "            which ddp-launch waits for: SIGUSR1/SIGUSR2 are passed on, the first SIGTERM, SIGINT\n"
    "            or SIGHUP as SIGUSR2 (ddp-train stops every rank after the same step, checkpoints\n"
    "            and exits 0), a second one as SIGTERM (mpirun ends the job);\n"
    "            otherwise by forking N children: SIGUSR1/SIGUSR2 are passed on to them, and when one\n"
    "            fails (or on SIGINT/SIGTERM) the others are stopped, naming the rank that failed.\n"
    "            Forking refuses an MPI program: forked ranks cannot join one MPI job.\n"
    "            Without -n: one rank.\n"
    "\n"
    "Options:\n"
    "  -n N                  number of ranks; under a launcher only a cross-check of its world size\n"
    "  --nproc-per-node N    ranks per node (cross-checked against the launcher); without a launcher\n"
    "                        and without -n, starts N ranks here (torchrun's --nproc-per-node, also\n"
    "                        spelt --nproc_per_node)\n"
    "  --ntasks-per-node N   the same check, named as srun's option\n"
    "  --bind=auto|force|none  CPU binding (default auto): each rank gets the cores nearest its GPU,\n"
    "                        or an even share of the node's allowed cores; auto keeps a binding made\n"
    "                        by Slurm or mpirun, force replaces it, none leaves the process unbound\n"
    "  --share-gpus          allow more ranks per node than GPUs (rank r uses GPU r mod n)\n"
    "  --master-addr HOST    MASTER_ADDR (default: $MASTER_ADDR, else the first host of the Slurm\n"
    "                        node list, else 127.0.0.1 on one node)\n"
    "  --master-port P       MASTER_PORT (default: $MASTER_PORT, else a hash into 20000..32767, below\n"
    "                        Linux's ephemeral ports, of SLURM_JOB_ID and SLURM_STEP_ID under srun, of\n"
    "                        the launch's id under other launchers, of ddp-launch's pid for forked -n)\n"
    "  --log-dir DIR         each rank's stdout and stderr to DIR/rank.N.out and DIR/rank.N.err\n"
    "                        (DIR is created; files are truncated); rank 0's also to the terminal\n"
    "                        (a follower process copies them; the program writes the files itself)\n"
    "  --print-env           print the job's table (rank, host, node, local rank, GPU, CPU set,\n"
    "                        threads, OpenBLAS core, log files) on rank 0, then run PROGRAM\n"
    "  --dry-run             the same table, without running PROGRAM\n"
    ,
    "  --max-restarts R      elastic, on this machine with -n N, or in a Slurm batch\n"
    "                        script (not under srun or mpirun): when a generation of ranks\n"
    "                        fails (a rank dies: mpirun or srun ends them all), start a new\n"
    "                        one, up to R times; PROGRAM resumes from its newest checkpoint\n"
    "                        (ddp-train does so with --checkpoint-dir: DDP_ELASTIC_GENERATION\n"
    "                        >= 1 implies --resume auto and --resume-reshard) or rescue\n"
    "                        snapshot (DDP_SNAPSHOT_DIR: node-local memory unless given).\n"
    "                        A line per generation: its ranks and what ended the one before\n"
    "  --shrink-on-failure   each new generation has one rank fewer than the failed one (a\n"
    "                        workstation loses processes, not slots: the default restarts N ranks)\n"
    "  --min-ranks K         with --shrink-on-failure: end the job rather than go below K ranks\n"
    ,
    "  Under Slurm (SLURM_JOB_ID set, no job step: an sbatch script, salloc's shell), each\n"
    "  generation is one `srun --kill-on-bad-exit=1` of --ntasks-per-node ranks on each node\n"
    "  still healthy (--mpi=pmix for an Open MPI program unless SLURM_MPI_TYPE is set); a node\n"
    "  whose tasks srun reports killed by a signal (or not at all) and that a probe step\n"
    "  cannot reach, or that Slurm reports down, drained or not responding, is left out of\n"
    "  the next ones. Ask sbatch for --no-kill, or Slurm ends the whole job when it marks the\n"
    "  node down. DDP_SNAPSHOT_DIR defaults to /dev/shm/ddp-snapshots-<job id>-%h (%h: the\n"
    "  node's name), removed on every node still healthy at the end.\n"
    "  --ntasks-per-node T   ranks per node of every generation (default: the allocation's\n"
    "                        SLURM_NTASKS_PER_NODE, else its SLURM_TASKS_PER_NODE when even)\n"
    "  --min-nodes K         end the job rather than run a generation on fewer than K nodes\n"
    "                        (default 1; needs --max-restarts, at most the allocation's nodes)\n"
    "  -v, --verbose         print this rank's exported variables on stderr\n"
    "  -h, --help            this text;  --version  the version\n"
    "\n"
    ,
    "GPUs: ddp-launch does not narrow CUDA_VISIBLE_DEVICES: every rank of a node gets the node's whole\n"
    "  list (as given, else every GPU the CUDA driver sees) and local rank r takes visible device r\n"
    "  (DDP_DEVICE=r, like torchrun's LOCAL_RANK), so NCCL can reach the peer GPUs over NVLink or PCIe\n"
    "  P2P. A list Slurm narrowed per task (--gpus-per-task, or --gpu-bind other than none or closest:\n"
    "  SLURMD_TRES_BIND, else SLURM_GPUS_PER_TASK or SLURM_GPU_BIND) is passed on as given\n"
    "  (DDP_DEVICE=0); ask Slurm for --gpus-per-node instead. More local ranks than GPUs is an error\n"
    "  unless --share-gpus. No GPU (no CUDA driver): the rank uses the CPU backend.\n"
    "\n"
    "Exports: RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK GROUP_RANK MASTER_ADDR MASTER_PORT\n"
    "  CUDA_VISIBLE_DEVICES (when GPUs), DDP_RANK DDP_WORLD_SIZE DDP_LOCAL_RANK DDP_LOCAL_WORLD_SIZE\n"
    "  DDP_NODE_RANK DDP_NNODES DDP_DEVICE (GPU ordinal or \"cpu\") DDP_CPUSET DDP_LAUNCHER\n"
    "  (srun|mpirun|pmix|hydra|torchrun|local); unless already set: OMP_NUM_THREADS and\n"
    "  OPENBLAS_NUM_THREADS (cores bound). OPENBLAS_CORETYPE by ddp's one policy (shared with\n"
    "  ddp-train): SkylakeX with AVX-512 F/BW/VL/DQ, Cooperlake with BF16 too, else unset; a preset\n"
    "  OPENBLAS_CORETYPE is kept (DDP_OPENBLAS_CORETYPE_BY=ddp-launch marks one it set).\n"
    "\n"
    "--print-env gathering: every rank writes its line to $DDP_PRINT_DIR (default\n"
    "  /tmp/ddp-printenv-<launch id>, e.g. slurm-<job>.<step>); rank 0 waits up to\n"
    "  $DDP_PRINT_TIMEOUT seconds (default 10) and prints the table, naming ranks whose line did not\n"
    "  arrive (point DDP_PRINT_DIR at a shared folder when nodes do not share /tmp).\n"
    "\n"
    "Refused with a fix (exit 1): an Open MPI program under srun without PMIx (--mpi=pmi2/none),\n"
    "  an Open MPI program under MPICH's mpiexec and the reverse, disagreeing sources or flags,\n"
    "  more local ranks than GPUs. MPI programs are recognised with ldd (override for scripts:\n"
    "  DDP_MPI_PROGRAM=openmpi|mpich|none).\n"
    "Testing aids: DDP_SIMULATE_GPUS=N replaces the CUDA driver's device count; DDP_LOCAL_FORK=1\n"
    "  makes -n fork instead of using mpirun; DDP_SIMULATE_CPU_FEATURES=avx512f,avx512bw,... (or\n"
    "  none) replaces the CPU features the OpenBLAS policy sees.\n"
    "Exit status: PROGRAM's; 1 for a launch it refuses; 2 for a usage error; 127 when PROGRAM is\n"
    "  not found.\n",
};

static int g_rank = -1;

static void fail(const char *fmt, const char *msg)
{
    if (g_rank >= 0)
        fprintf(stderr, "ddp-launch[rank %d]: ", g_rank);
    else
        fprintf(stderr, "ddp-launch: ");
    fprintf(stderr, fmt, msg);
    fputc('\n', stderr);
}

/* Parses a positive int option value; exits with a usage error otherwise. */
static int positive(const char *s, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v <= 0 || v > 1 << 20) {
        fprintf(stderr, "ddp-launch: %s needs a positive number, got '%s' (see --help)\n", what, s);
        exit(USAGE_EXIT);
    }
    return (int)v;
}

static enum launch_bind_mode bind_mode(const char *s)
{
    if (strcmp(s, "auto") == 0)
        return LAUNCH_BIND_AUTO;
    if (strcmp(s, "force") == 0)
        return LAUNCH_BIND_FORCE;
    if (strcmp(s, "none") == 0)
        return LAUNCH_BIND_NONE;
    fprintf(stderr, "ddp-launch: --bind takes auto, force or none, got '%s'\n", s);
    exit(USAGE_EXIT);
}

/* An unknown option or a missing value: one line naming it, with the nearest option for an
 * unknown one, printed by the job's first rank only (every rank parses the same line); exits 2. */
static void usage_error(int c, const char *arg, const struct option *longs)
{
    if (suggest_first_rank()) {
        const char *near = c == '?' && arg[0] == '-' && arg[1] == '-' ? suggest_option(longs, arg) : NULL;
        fprintf(stderr, "ddp-launch: %s '%s'", c == ':' ? "missing value for option" : "unknown option", arg);
        if (near)
            fprintf(stderr, "; did you mean --%s?", near);
        fputs(" (see ddp-launch --help)\n", stderr);
    }
    exit(USAGE_EXIT);
}

enum { OPT_NPPN = 256, OPT_NTPN, OPT_BIND, OPT_SHARE, OPT_PRINT, OPT_DRY, OPT_PORT, OPT_ADDR,
       OPT_LOGDIR, OPT_VERSION, OPT_RESTARTS, OPT_MIN_RANKS, OPT_SHRINK, OPT_MIN_NODES };

/* Parses a count in [0, 1000] (--max-restarts); exits with a usage error otherwise. */
static int count(const char *s, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v > 1000) {
        fprintf(stderr, "ddp-launch: %s needs a number from 0 to 1000, got '%s' (see --help)\n",
                what, s);
        exit(USAGE_EXIT);
    }
    return (int)v;
}

/* Fills OPT from argv; returns the index of PROGRAM. Exits 0 for --help/--version, 2 on errors. */
static int parse_options(int argc, char **argv, struct launch_options *opt)
{
    static const struct option longs[] = {
        {"nproc-per-node", required_argument, NULL, OPT_NPPN}, {"ntasks-per-node", required_argument, NULL, OPT_NTPN},
        {"nproc_per_node", required_argument, NULL, OPT_NPPN}, /* torchrun's spelling */
        {"bind", required_argument, NULL, OPT_BIND}, {"share-gpus", no_argument, NULL, OPT_SHARE},
        {"print-env", no_argument, NULL, OPT_PRINT}, {"dry-run", no_argument, NULL, OPT_DRY},
        {"master-port", required_argument, NULL, OPT_PORT}, {"master-addr", required_argument, NULL, OPT_ADDR},
        {"verbose", no_argument, NULL, 'v'}, {"help", no_argument, NULL, 'h'},
        {"log-dir", required_argument, NULL, OPT_LOGDIR}, {"version", no_argument, NULL, OPT_VERSION},
        {"max-restarts", required_argument, NULL, OPT_RESTARTS},
        {"min-ranks", required_argument, NULL, OPT_MIN_RANKS},
        {"shrink-on-failure", no_argument, NULL, OPT_SHRINK},
        {"min-nodes", required_argument, NULL, OPT_MIN_NODES},
        {NULL, 0, NULL, 0},
    };
    int c;
    launch_options_init(opt);
    opterr = 0; /* unknown options: one line with the nearest one (default: below) */
    while ((c = getopt_long(argc, argv, "+:n:vh", longs, NULL)) != -1) {
        switch (c) {
        case 'n': opt->n_procs = positive(optarg, "-n"); break;
        case OPT_NPPN: opt->nproc_per_node = positive(optarg, "--nproc-per-node"); break;
        case OPT_NTPN: opt->ntasks_per_node = positive(optarg, "--ntasks-per-node"); break;
        case OPT_BIND: opt->bind = bind_mode(optarg); break;
        case OPT_SHARE: opt->share_gpus = 1; break;
        case OPT_PRINT: opt->print_env = 1; break;
        case OPT_DRY: opt->dry_run = opt->print_env = 1; break;
        case OPT_PORT: opt->master_port = positive(optarg, "--master-port"); break;
        case OPT_ADDR: opt->master_addr = optarg; break;
        case OPT_LOGDIR: opt->log_dir = optarg; break;
        case OPT_RESTARTS: opt->max_restarts = count(optarg, "--max-restarts"); break;
        case OPT_MIN_RANKS: opt->min_ranks = positive(optarg, "--min-ranks"); break;
        case OPT_SHRINK: opt->shrink = 1; break;
        case OPT_MIN_NODES: opt->min_nodes = positive(optarg, "--min-nodes"); break;
        case 'v': opt->verbose = 1; break;
        case 'h':
            for (size_t i = 0; i < sizeof help_text / sizeof help_text[0]; i++)
                fputs(help_text[i], stdout);
            exit(0);
        case OPT_VERSION: printf("ddp-launch %s\n", DDP_VERSION); exit(0);
        default: usage_error(c, argv[optind - 1], longs);
        }
    }
    if (optind >= argc && !opt->dry_run) {
        fputs("ddp-launch: no PROGRAM given (usage: ddp-launch [options] [--] PROGRAM [ARGS...])\n", stderr);
        exit(USAGE_EXIT);
    }
    if (opt->master_port > 65535) {
        fputs("ddp-launch: --master-port must be at most 65535\n", stderr);
        exit(USAGE_EXIT);
    }
    return optind;
}

/* ---- the exports ------------------------------------------------------------------------- */

static void put(const char *name, const char *value, int overwrite, int verbose)
{
    setenv(name, value, overwrite);
    if (verbose)
        fprintf(stderr, "ddp-launch[rank %d]:   %s=%s\n", g_rank, name, getenv(name));
}

static void put_int(const char *name, int value, int verbose)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%d", value);
    put(name, buf, 1, verbose);
}

static void export_layout(const struct launch_layout *l, int v)
{
    put_int("RANK", l->rank, v);
    put_int("WORLD_SIZE", l->world_size, v);
    put_int("LOCAL_RANK", l->local_rank, v);
    put_int("LOCAL_WORLD_SIZE", l->local_world_size, v);
    put_int("NODE_RANK", l->node_rank, v);
    put_int("GROUP_RANK", l->node_rank, v);
    put("MASTER_ADDR", l->master_addr, 1, v);
    put_int("MASTER_PORT", l->master_port, v);
    put_int("DDP_RANK", l->rank, v);
    put_int("DDP_WORLD_SIZE", l->world_size, v);
    put_int("DDP_LOCAL_RANK", l->local_rank, v);
    put_int("DDP_LOCAL_WORLD_SIZE", l->local_world_size, v);
    put_int("DDP_NODE_RANK", l->node_rank, v);
    put_int("DDP_NNODES", l->n_nodes, v);
    put("DDP_LAUNCHER", launch_source_name(l->source), 1, v);
    /* srun --mpi=pmix with Open MPI 4.1 and PMIx 4.2 (Debian 12's Slurm 22.05): with PMIx's shared-memory
     * data store, a rank still waiting in MPI_Init's modex fence can receive a peer's first MPI
     * message before its PML has registered the handler for it, and dies of SIGSEGV at address 0
     * (ob1's match callback, called from the TCP BTL). Measured on the local 2-node cluster with a
     * plain MPI program: 4 of 250 starts crashed; 0 of 300 with the hash data store. A value the user
     * set is kept. */
    if (l->source == LAUNCH_SOURCE_SRUN && getenv("PMIX_RANK"))
        put("PMIX_MCA_gds", "hash", 0, v);
}

static void export_setup(const struct launch_setup *s, int v)
{
    char threads[32];
    snprintf(threads, sizeof threads, "%d", s->threads);
    if (s->gpu.device >= 0) {
        put("CUDA_VISIBLE_DEVICES", s->gpu.visible, 1, v);
        put_int("DDP_DEVICE", s->gpu.device, v);
    } else {
        put("DDP_DEVICE", "cpu", 1, v);
    }
    put("DDP_CPUSET", s->cpuset, 1, v);
    put("OMP_NUM_THREADS", threads, 0, v);
    put("OPENBLAS_NUM_THREADS", threads, 0, v);
    if (s->blas.apply) {
        put("OPENBLAS_CORETYPE", s->blas.core, 1, v); /* apply: unset, or a preset a cap overrides */
        put(BLAS_SETTER_ENV, "ddp-launch", 1, v);
    }
}

/* ddp's one OpenBLAS kernel policy (common/blas_policy.c, also in models/ops) for this rank; a preset
 * OPENBLAS_CORETYPE is kept unless DDP_CPU_ISA caps the CPU below it. Fills s->blas and s->blas_note; -1 on a bad simulated feature list. */
static int decide_blas(struct launch_setup *s, int verbose)
{
    char err[LAUNCH_ERRMSG_LEN];
    const char *setter = getenv(BLAS_SETTER_ENV);
    if (blas_policy_decide(getenv("OPENBLAS_CORETYPE"), setter, getenv(BLAS_SIMULATE_ENV), getenv(CPU_ISA_ENV),
                           &s->blas, err, sizeof err) != 0) {
        fail("error: %s", err);
        return -1;
    }
    if (s->blas.preset)
        snprintf(s->blas_note, sizeof s->blas_note, "%s(preset)", s->blas.preset);
    else
        snprintf(s->blas_note, sizeof s->blas_note, "%s", s->blas.core ? s->blas.core : s->blas.current ? s->blas.current : "-");
    if (verbose) {
        char line[512];
        blas_decision_describe(&s->blas, s->blas.apply ? "ddp-launch" : setter, line, sizeof line);
        fprintf(stderr, "ddp-launch[rank %d]: BLAS: %s\n", g_rank, line);
    }
    return 0;
}

/* ---- one rank ------------------------------------------------------------------------------ */

static int exec_program(char **args)
{
    fflush(NULL);
    execvp(args[0], args);
    fprintf(stderr, "ddp-launch[rank %d]: cannot run %s: %s\n", g_rank, args[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

/* --log-dir: creates the folder (unless dry-run) and names this rank's files in S; -1 on failure. */
static int prepare_logs(const struct launch_options *opt, const struct launch_layout *l, struct launch_setup *s)
{
    char err[LAUNCH_ERRMSG_LEN], out_path[4200], err_path[4200];
    if (!opt->log_dir)
        return 0;
    if (opt->dry_run)
        snprintf(s->log_dir, sizeof s->log_dir, "%s", opt->log_dir);
    else if (launch_log_dir_prepare(opt->log_dir, s->log_dir, sizeof s->log_dir, err, sizeof err) != 0) {
        fail("error: %s", err);
        return -1;
    }
    launch_log_paths(s->log_dir, l->rank, out_path, err_path, sizeof out_path);
    snprintf(s->logs, sizeof s->logs, "%s %s", out_path, err_path);
    return 0;
}

/* Sends this rank's output to its log files (rank 0's also to the terminal); -1 on failure. */
static int redirect_logs(const struct launch_layout *l, const struct launch_setup *s)
{
    char err[LAUNCH_ERRMSG_LEN];
    int rc = launch_log_redirect(s->log_dir, l->rank, l->rank == 0, err, sizeof err);
    if (rc != 0)
        fail(rc > 0 ? "warning: %s" : "error: %s", err);
    return rc < 0 ? -1 : 0;
}

/* Binds this rank (bind.c), printing what went wrong; -1 when the rank cannot start. */
static int bind_rank(const struct launch_options *opt, const struct launch_layout *l, const struct launch_gpu_list *gpus,
                     int narrowed, struct launch_setup *s)
{
    char err[LAUNCH_ERRMSG_LEN];
    int rc = launch_bind_rank(opt, l, gpus, narrowed, s, err, sizeof err);
    if (rc != 0)
        fail(rc > 0 ? "warning: %s" : "error: %s", err);
    return rc < 0 ? -1 : 0;
}

/* Runs rank L: checks traps, maps the GPU, binds, exports, prints, execs. Returns an exit status
 * only when it does not exec. */
static int run_rank(const struct launch_options *opt, const struct launch_layout *l, char **args)
{
    char err[LAUNCH_ERRMSG_LEN];
    struct launch_gpu_list gpus;
    struct launch_setup s;
    int narrowed = l->source == LAUNCH_SOURCE_SRUN && launch_gpus_narrowed(environ);
    g_rank = l->rank;
    memset(&s, 0, sizeof s);
    gethostname(s.host, sizeof s.host - 1);
    if (args[0] && launch_check_traps(environ, l, launch_program_mpi(environ, args[0]), err, sizeof err) != 0) {
        fail("error: %s", err);
        return SETUP_EXIT;
    }
    if (launch_gpu_discover(environ, &gpus, err, sizeof err) != 0 ||
        launch_gpu_map(&gpus, narrowed, l->local_rank, l->local_world_size, opt->share_gpus, &s.gpu, err, sizeof err) != 0) {
        fail("error: %s", err);
        return SETUP_EXIT;
    }
    if (bind_rank(opt, l, &gpus, narrowed, &s) != 0 || decide_blas(&s, opt->verbose) != 0 ||
        prepare_logs(opt, l, &s) != 0)
        return SETUP_EXIT;
    if (opt->verbose)
        fprintf(stderr, "ddp-launch[rank %d]: launcher %s, exporting:\n", l->rank, launch_source_name(l->source));
    export_layout(l, opt->verbose);
    export_setup(&s, opt->verbose);
    if (opt->print_env && launch_table_gather(l, &s, err, sizeof err) != 0)
        fail("warning: %s", err);
    if (opt->dry_run || !args[0])
        return 0;
    if (s.log_dir[0] && redirect_logs(l, &s) != 0)
        return SETUP_EXIT;
    return exec_program(args);
}

/* ---- -n N without a launcher --------------------------------------------------------------- */

/* Runs `mpirun -np N --bind-to none ddp-launch <the same flags minus -n> -- PROGRAM ARGS`
 * (ddp-launch binds the ranks itself, as --bind says) and waits for it, passing signals on
 * (launch_supervise_mpirun). Returns mpirun's exit status, or -1 with errno when it cannot start. */
static int run_mpirun(const struct launch_options *opt, char **args)
{
    char self[4096], np[16], port[16], nppn[16], ntpn[16];
    const char **argv;
    int n = 0, n_args = 0;
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    while (args[n_args])
        n_args++;
    argv = malloc((size_t)(32 + n_args) * sizeof *argv); /* 32: more than the flags below */
    if (len <= 0 || !argv) {
        free(argv);
        return -1;
    }
    self[len] = '\0';
    snprintf(np, sizeof np, "%d", opt->n_procs);
    argv[n++] = "mpirun";
    argv[n++] = "-np";
    argv[n++] = np;
    argv[n++] = "--bind-to";
    argv[n++] = "none";
    if (opt->n_procs > sysconf(_SC_NPROCESSORS_ONLN))
        argv[n++] = "--oversubscribe";
    if (geteuid() == 0)
        argv[n++] = "--allow-run-as-root";
    argv[n++] = self;
    argv[n++] = opt->bind == LAUNCH_BIND_FORCE ? "--bind=force" : opt->bind == LAUNCH_BIND_NONE ? "--bind=none" : "--bind=auto";
    if (opt->share_gpus)
        argv[n++] = "--share-gpus";
    if (opt->print_env)
        argv[n++] = opt->dry_run ? "--dry-run" : "--print-env";
    if (opt->verbose)
        argv[n++] = "--verbose";
    if (opt->master_addr) {
        argv[n++] = "--master-addr";
        argv[n++] = opt->master_addr;
    }
    if (opt->log_dir) {
        argv[n++] = "--log-dir";
        argv[n++] = opt->log_dir;
    }
    snprintf(port, sizeof port, "%d", opt->master_port);
    snprintf(nppn, sizeof nppn, "%d", opt->nproc_per_node);
    snprintf(ntpn, sizeof ntpn, "%d", opt->ntasks_per_node);
    if (opt->master_port > 0) {
        argv[n++] = "--master-port";
        argv[n++] = port;
    }
    if (opt->nproc_per_node > 0) {
        argv[n++] = "--nproc-per-node";
        argv[n++] = nppn;
    }
    if (opt->ntasks_per_node > 0) {
        argv[n++] = "--ntasks-per-node";
        argv[n++] = ntpn;
    }
    argv[n++] = "--";
    for (int i = 0; i < n_args; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int rc = launch_supervise_mpirun((char *const *)argv);
    int saved = errno;
    free(argv);
    errno = saved;
    return rc;
}

struct fork_args {
    const struct launch_options *opt;
    char **args;
};

static int run_forked_rank(const struct launch_layout *l, void *arg)
{
    const struct fork_args *a = arg;
    return run_rank(a->opt, l, a->args);
}

/* Forks the -n ranks on this node, each running run_rank, and supervises them (supervise.c). */
static int fork_ranks(const struct launch_options *opt, const struct launch_layout *base, char **args)
{
    char err[LAUNCH_ERRMSG_LEN];
    struct fork_args a = {opt, args};
    int rc = launch_fork_ranks(base, run_forked_rank, &a, err, sizeof err);
    if (rc < 0) {
        fail("error: %s", err);
        return SETUP_EXIT;
    }
    return rc;
}

/* Forked ranks of an MPI program would each start alone (an MPI job needs mpirun's or srun's
 * runtime to join its processes): refuse at once with the fix. Returns 0 when PROGRAM may fork. */
static int refuse_fork_of_mpi(char **args, int forced)
{
    if (!args[0] || launch_program_mpi(environ, args[0]) == LAUNCH_MPI_NONE)
        return 0;
    fprintf(stderr, "ddp-launch: error: %s is an MPI program, and ranks forked by ddp-launch cannot join one MPI "
            "job (each would start alone). %s: %s, or start the job with mpirun -np N or "
            "srun --mpi=pmix -n N (DDP_MPI_PROGRAM=none overrides the detection for programs that do not use MPI)\n",
            args[0], forced ? "DDP_LOCAL_FORK=1 asks for forking" : "mpirun is not in PATH",
            forced ? "unset DDP_LOCAL_FORK" : "install Open MPI's mpirun (Debian: apt-get install openmpi-bin)");
    return -1;
}

static int launch_local(const struct launch_options *opt, struct launch_layout *l, char **args)
{
    char path[4096];
    const char *force_fork = getenv("DDP_LOCAL_FORK");
    int forced = force_fork && strcmp(force_fork, "1") == 0;
    l->source = LAUNCH_SOURCE_LOCAL;
    snprintf(l->job_key, sizeof l->job_key, "local-%ld", (long)getpid());
    if (opt->master_port < 0 && !getenv("MASTER_PORT"))
        l->master_port = launch_port_from_hash((unsigned long long)getpid());
    if (l->world_size == 1)
        return run_rank(opt, l, args);
    if (!forced && launch_find_program(environ, "mpirun", path, sizeof path) == 0) {
        struct launch_options o = *opt;
        o.n_procs = l->world_size; /* -n, or --nproc-per-node without it */
        int rc = run_mpirun(&o, args);
        if (rc >= 0)
            return rc;
        fail("warning: cannot start mpirun (%s); forking the ranks instead", strerror(errno));
    }
    if (!opt->dry_run && refuse_fork_of_mpi(args, forced) != 0)
        return SETUP_EXIT;
    return fork_ranks(opt, l, args);
}

/* ---- generations (--max-restarts) ---------------------------------------------------------- */

/* The elastic flags fit this launch: on this machine (no launcher around ddp-launch, no Slurm
 * allocation), with --max-restarts, --min-ranks within -n, no --min-nodes. Exits 2 otherwise,
 * naming the usage. */
static void check_elastic(const struct launch_options *opt, const struct launch_layout *l)
{
    const char *bad = NULL;
    char buf[512];
    if (l->source != LAUNCH_SOURCE_NONE) {
        snprintf(buf, sizeof buf, "--max-restarts, --min-nodes, --shrink-on-failure and "
                 "--min-ranks start the generations of ranks themselves, but this ddp-launch is "
                 "one rank of a job %s started: run `ddp-launch -n N --max-restarts R PROGRAM "
                 "...` once, outside mpirun and srun (in a Slurm batch script: `ddp-launch "
                 "--max-restarts R [--min-nodes K] PROGRAM ...`, which runs srun itself)",
                 launch_source_name(l->source));
        bad = buf;
    } else if (opt->min_nodes > 0) {
        bad = "--min-nodes counts the nodes of Slurm generations, and this is no Slurm allocation "
              "(no SLURM_JOB_ID): run `ddp-launch --max-restarts R --min-nodes K PROGRAM ...` in "
              "an sbatch script; on one machine, -n N --max-restarts R --shrink-on-failure "
              "--min-ranks K bounds the ranks";
    } else if (opt->max_restarts < 0) {
        bad = "--shrink-on-failure and --min-ranks shape the restarts: add --max-restarts R";
    } else if (opt->min_ranks > 0 && !opt->shrink) {
        bad = "--min-ranks bounds --shrink-on-failure: without it every generation has -n ranks";
    } else if (opt->min_ranks > l->world_size) {
        snprintf(buf, sizeof buf, "--min-ranks %d is above the %d rank(s) of -n: give at most %d",
                 opt->min_ranks, l->world_size, l->world_size);
        bad = buf;
    }
    if (bad) {
        fprintf(stderr, "ddp-launch: %s\n", bad);
        exit(USAGE_EXIT);
    }
}

/* The rescue snapshots' folder of this launch (DDP_SNAPSHOT_DIR, ddp-train's --snapshot-dir),
 * node-local memory: made here unless the user set one; "" when none could be made. */
static char snapshot_dir[256];

static void snapshot_dir_make(void)
{
    const char *set = getenv("DDP_SNAPSHOT_DIR");
    if (set && *set)
        return;
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(snapshot_dir, sizeof snapshot_dir, "%s/ddp-snapshots-%ld-%ld", base, (long)getuid(),
             (long)getpid());
    if (mkdir(snapshot_dir, 0700) != 0) {
        fprintf(stderr, "ddp-launch: warning: cannot create %s (%s): no rescue snapshots; restarts "
                "resume from the disk checkpoints\n", snapshot_dir, strerror(errno));
        snapshot_dir[0] = '\0';
        return;
    }
    setenv("DDP_SNAPSHOT_DIR", snapshot_dir, 1);
}

/* Removes the folder snapshot_dir_make made, with what ddp-train left in it (plain files only:
 * its own names; a link is removed, never followed). */
static void snapshot_dir_remove(void)
{
    DIR *d = snapshot_dir[0] ? opendir(snapshot_dir) : NULL;
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat sb;
        if (strncmp(e->d_name, "step-", 5) == 0 &&
            fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(sb.st_mode))
            unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
    rmdir(snapshot_dir);
}

/* ---- generations under Slurm (--max-restarts in a batch script) ----------------------------- */

/* In a Slurm allocation but in no job step (an sbatch script, salloc's shell), and started by no
 * launcher: ddp-launch --max-restarts then runs one srun per generation itself. */
static int in_allocation(const struct launch_layout *l)
{
    const char *job = getenv("SLURM_JOB_ID");
    return l->source == LAUNCH_SOURCE_NONE && job && *job && !getenv("SLURM_STEP_ID");
}

/* The allocation and what the generation running said about each of its nodes. */
struct slurm_job {
    struct launch_hostlist nodes; /* SLURM_JOB_NODELIST */
    char *healthy;                /* per node: in the next generation */
    char *exited;                 /* per node: srun reported a task that exited with a status */
    char (*killed)[96];           /* per node: srun's report of a task killed by a signal, or "" */
    char (*why)[160];             /* per node: why it was left out */
    int per_node;                 /* ranks per node */
    const char *job_id;
};

static void usage_exit(const char *msg)
{
    fprintf(stderr, "ddp-launch: %s\n", msg);
    exit(USAGE_EXIT);
}

/* Ranks per node of every generation: --ntasks-per-node / --nproc-per-node, else the job's
 * SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE when every node has the same count. */
static int slurm_per_node(const struct launch_options *opt, size_t n_nodes)
{
    const char *ntpn = getenv("SLURM_NTASKS_PER_NODE"), *tpn = getenv("SLURM_TASKS_PER_NODE");
    if (opt->ntasks_per_node > 0 || opt->nproc_per_node > 0)
        return opt->ntasks_per_node > 0 ? opt->ntasks_per_node : opt->nproc_per_node;
    if (ntpn && atoi(ntpn) > 0)
        return atoi(ntpn);
    int first = tpn ? launch_slurm_tasks_on_node(tpn, 0) : -1;
    for (size_t i = 1; first > 0 && i < n_nodes; i++)
        if (launch_slurm_tasks_on_node(tpn, (int)i) != first)
            first = -1;
    if (first <= 0)
        usage_exit("the allocation's tasks per node are uneven (SLURM_TASKS_PER_NODE): give "
                   "--ntasks-per-node T, the ranks of each node in every generation");
    return first;
}

/* The elastic flags fit a Slurm batch script: no -n, --shrink-on-failure or --min-ranks (the
 * generations lose nodes), --min-nodes only with --max-restarts and at most the allocation's
 * nodes. Fills JOB's node list and ranks per node; exits 2 otherwise, naming the usage. */
static void check_slurm_elastic(const struct launch_options *opt, struct slurm_job *job)
{
    char err[LAUNCH_ERRMSG_LEN] = "", buf[1400];
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (opt->n_procs > 0)
        usage_exit("in a Slurm allocation the generations' sizes come from its nodes: give "
                   "--ntasks-per-node T (ranks per node), not -n");
    if (opt->shrink || opt->min_ranks > 0)
        usage_exit("in a Slurm allocation a failed generation loses nodes, not ranks: "
                   "--shrink-on-failure and --min-ranks are for -n N on one machine; bound the "
                   "nodes with --max-restarts R --min-nodes K");
    if (opt->max_restarts < 0)
        usage_exit("--min-nodes bounds the restarts of Slurm generations: add --max-restarts R");
    if (!list || launch_hostlist_expand(list, &job->nodes, err, sizeof err) != 0 ||
        job->nodes.n == 0) {
        snprintf(buf, sizeof buf, "SLURM_JOB_NODELIST='%s' names no nodes%s%s", list ? list : "",
                 list ? ": " : "", list ? err : "");
        usage_exit(buf);
    }
    if (opt->min_nodes > (int)job->nodes.n) {
        snprintf(buf, sizeof buf, "--min-nodes %d is above the %zu node(s) of this allocation "
                 "(SLURM_JOB_NODELIST=%s): give at most %zu", opt->min_nodes, job->nodes.n, list,
                 job->nodes.n);
        usage_exit(buf);
    }
    job->per_node = slurm_per_node(opt, job->nodes.n);
}

/* The index of node NAME (LEN characters) in the allocation, or -1. */
static int node_index(const struct slurm_job *job, const char *name, size_t len)
{
    for (size_t i = 0; i < job->nodes.n; i++)
        if (strlen(job->nodes.names[i]) == len && strncmp(job->nodes.names[i], name, len) == 0)
            return (int)i;
    return -1;
}

/* One line of srun's stderr: "srun: error: NODE: task(s) LIST: Exited with exit code N" says the
 * node was alive to the end; any other end ("Killed", "Segmentation fault", ...) is a signal. */
static void srun_line(const char *line, void *arg)
{
    struct slurm_job *job = arg;
    static const char prefix[] = "srun: error: ";
    if (strncmp(line, prefix, sizeof prefix - 1) != 0)
        return;
    const char *node = line + sizeof prefix - 1, *colon = strstr(node, ": task");
    const char *what = colon ? strstr(colon + 2, ": ") : NULL;
    int i = colon ? node_index(job, node, (size_t)(colon - node)) : -1;
    if (i < 0 || !what)
        return;
    if (strncmp(what + 2, "Exited with exit code", 21) == 0)
        job->exited[i] = 1;
    else if (!job->killed[i][0])
        snprintf(job->killed[i], sizeof job->killed[i], "%s", colon + 2);
}

/* The names of the healthy nodes, comma-separated, into a new string (NULL when out of memory). */
static char *healthy_list(const struct slurm_job *job, int *n)
{
    size_t len = 1;
    for (size_t i = 0; i < job->nodes.n; i++)
        len += strlen(job->nodes.names[i]) + 1;
    char *out = calloc(1, len);
    *n = 0;
    for (size_t i = 0; out && i < job->nodes.n; i++)
        if (job->healthy[i]) {
            strcat(out, *n ? "," : "");
            strcat(out, job->nodes.names[i]);
            ++*n;
        }
    return out;
}

/* Slurm's state of node I ("down*", "drained", "mixed", ...) is one a step cannot use: down,
 * drained or draining, failing, or not responding ('*'). Writes the state into STATE. */
static int node_state_bad(const struct slurm_job *job, size_t i, char *state, size_t n)
{
    char cmd[512];
    state[0] = '\0';
    snprintf(cmd, sizeof cmd, "sinfo -h -N -o '%%T' -n '%s' 2>/dev/null", job->nodes.names[i]);
    FILE *f = popen(cmd, "r");
    if (!f)
        return 0;
    if (fgets(state, (int)n, f))
        state[strcspn(state, " \n")] = '\0';
    pclose(f);
    return strchr(state, '*') || strncmp(state, "down", 4) == 0 ||
           strncmp(state, "drain", 5) == 0 || strncmp(state, "fail", 4) == 0;
}

#define PROBE_LIMIT_S 30.0 /* a probe step that has not run `true` by then: the node is lost */

/* After a failed generation: leaves out the nodes Slurm reports unusable, then those srun did
 * not report alive (a task killed by a signal, or no report) where a one-task probe step cannot
 * run `true` within PROBE_LIMIT_S. Returns the number of nodes left out. */
static int exclude_lost(struct slurm_job *job)
{
    struct probe {
        char *argv[9];
        char nodearg[300];
        int node;
    } *p = calloc(job->nodes.n, sizeof *p);
    char ***argvs = calloc(job->nodes.n, sizeof *argvs), state[64];
    int n_probe = 0, lost = 0, *status = calloc(job->nodes.n, sizeof *status);
    for (size_t i = 0; p && argvs && status && i < job->nodes.n; i++) {
        if (!job->healthy[i])
            continue;
        if (node_state_bad(job, i, state, sizeof state)) {
            snprintf(job->why[i], sizeof job->why[i], "Slurm reports it %s", state);
            job->healthy[i] = 0;
            lost++;
        } else if (!job->exited[i]) {
            struct probe *q = &p[n_probe];
            char **a = q->argv;
            snprintf(q->nodearg, sizeof q->nodearg, "--nodelist=%s", job->nodes.names[i]);
            a[0] = "srun", a[1] = "--nodes=1", a[2] = "--ntasks=1", a[3] = q->nodearg;
            a[4] = "--mpi=none", a[5] = "--overlap", a[6] = "--quiet", a[7] = "true", a[8] = NULL;
            argvs[n_probe] = a;
            q->node = (int)i;
            n_probe++;
        }
    }
    if (n_probe > 0 &&
        launch_run_probes((char *const *const *)argvs, n_probe, PROBE_LIMIT_S, status) == 0) {
        for (int k = 0; k < n_probe; k++) {
            int i = p[k].node;
            if (status[k] == 0)
                continue;
            snprintf(job->why[i], sizeof job->why[i], "srun: %s; a probe step %s",
                     job->killed[i][0] ? job->killed[i] : "no exit status of its tasks",
                     status[k] == -1 ? "did not start there in time" : "could not start there");
            job->healthy[i] = 0;
            lost++;
        }
    }
    free(p);
    free(argvs);
    free(status);
    return lost;
}

/* Appends the exit of generation GEN to ENDED, with the nodes left out and why. */
static void describe_end(const struct slurm_job *job, int gen, int rc, double secs, char *ended,
                         size_t n)
{
    size_t len = (size_t)snprintf(ended, n, "generation %d ended with exit status %d after %.1f s",
                                  gen, rc, secs);
    const char *sep = "; left out: ";
    for (size_t i = 0; i < job->nodes.n && len < n; i++)
        if (job->why[i][0]) {
            len += (size_t)snprintf(ended + len, n - len, "%s%s (%s)", sep, job->nodes.names[i],
                                    job->why[i]);
            sep = ", ";
        }
}

/* srun's command line for one generation on NODES (N of them): ddp-launch itself as each task,
 * with the flags a rank needs, then PROGRAM and its arguments. Returns a new array. */
static char **srun_argv(const struct launch_options *opt, const struct slurm_job *job,
                        const char *nodes, int n, char **args, char bufs[4][320])
{
    static char self[4096];
    int n_args = 0, k = 0;
    while (args[n_args])
        n_args++;
    char **a = calloc((size_t)n_args + 32, sizeof *a);
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (!a || len <= 0) {
        free(a);
        return NULL;
    }
    self[len] = '\0';
    snprintf(bufs[0], 320, "--nodes=%d", n);
    snprintf(bufs[1], 320, "--ntasks=%d", n * job->per_node);
    snprintf(bufs[2], 320, "--ntasks-per-node=%d", job->per_node);
    snprintf(bufs[3], 320, "%d", opt->master_port);
    a[k++] = "srun", a[k++] = "--kill-on-bad-exit=1", a[k++] = bufs[0], a[k++] = bufs[1];
    a[k++] = bufs[2], a[k++] = "--nodelist", a[k++] = (char *)nodes;
    if (!getenv("SLURM_MPI_TYPE") && launch_program_mpi(environ, args[0]) == LAUNCH_MPI_OPENMPI)
        a[k++] = "--mpi=pmix"; /* Open MPI 4 cannot start under Slurm's PMI-2 or none */
    a[k++] = self;
    a[k++] = opt->bind == LAUNCH_BIND_FORCE  ? "--bind=force"
             : opt->bind == LAUNCH_BIND_NONE ? "--bind=none"
                                             : "--bind=auto";
    if (opt->share_gpus)
        a[k++] = "--share-gpus";
    if (opt->print_env)
        a[k++] = opt->dry_run ? "--dry-run" : "--print-env";
    if (opt->verbose)
        a[k++] = "--verbose";
    if (opt->master_addr)
        a[k++] = "--master-addr", a[k++] = (char *)opt->master_addr;
    if (opt->master_port > 0)
        a[k++] = "--master-port", a[k++] = bufs[3];
    if (opt->log_dir)
        a[k++] = "--log-dir", a[k++] = (char *)opt->log_dir;
    a[k++] = "--";
    for (int i = 0; i < n_args; i++)
        a[k++] = args[i];
    return a;
}

/* DDP_SNAPSHOT_DIR for the generations, unless the user set one: a folder per node in node-local
 * memory, /dev/shm/ddp-snapshots-<job id>-%h (ddp-train puts the node's name for %h and creates
 * the folder; a flat name, since on other nodes no parent folder of ours exists). Returns the
 * prefix before the node's name to remove at the end, or "" when the user's folder is kept. */
static const char *slurm_snapshot_dir(const struct slurm_job *job)
{
    static char prefix[256];
    const char *set = getenv("DDP_SNAPSHOT_DIR");
    char dir[300];
    struct stat sb;
    if (set && *set)
        return "";
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(prefix, sizeof prefix, "%s/ddp-snapshots-%s-", base, job->job_id);
    snprintf(dir, sizeof dir, "%s%%h", prefix);
    setenv("DDP_SNAPSHOT_DIR", dir, 1);
    return prefix;
}

/* Removes each healthy node's snapshot folder (PREFIX + its name) with one task per node. */
static void slurm_snapshot_remove(const struct slurm_job *job, const char *prefix)
{
    int n;
    char *nodes = healthy_list(job, &n), a1[32], a2[32], a3[300];
    if (!nodes || !*prefix || n == 0) {
        free(nodes);
        return;
    }
    snprintf(a1, sizeof a1, "--nodes=%d", n);
    snprintf(a2, sizeof a2, "--ntasks=%d", n);
    snprintf(a3, sizeof a3, "%s", prefix);
    char *argv[] = {"srun", a1, a2, "--ntasks-per-node=1", "--nodelist", nodes, "--mpi=none",
                    "--overlap", "--quiet", "sh", "-c", "rm -rf -- \"$0$SLURMD_NODENAME\"", a3,
                    NULL};
    char *const *probes[] = {argv};
    int status;
    launch_run_probes(probes, 1, PROBE_LIMIT_S, &status);
    free(nodes);
}

/* Runs generation GEN on the healthy nodes (a line first: its ranks, nodes, and ENDED, what ended
 * the one before) and returns srun's exit status; SECS gets its duration. */
static int slurm_generation(const struct launch_options *opt, struct slurm_job *job, int gen,
                            const char *ended, char **args, double *secs)
{
    int n, rc;
    char num[16], bufs[4][320];
    char *nodes = healthy_list(job, &n);
    char **argv = nodes ? srun_argv(opt, job, nodes, n, args, bufs) : NULL;
    *secs = 0;
    if (!argv) {
        free(nodes);
        fprintf(stderr, "ddp-launch: out of memory for generation %d's srun line\n", gen);
        return SETUP_EXIT;
    }
    fprintf(stderr, "ddp-launch: generation %d: %d rank(s) on %d node(s) (%s), %d per node "
            "(restarts left %d); started after %s\n", gen, n * job->per_node, n, nodes,
            job->per_node, opt->max_restarts - gen, ended);
    snprintf(num, sizeof num, "%d", gen);
    setenv("DDP_ELASTIC_GENERATION", num, 1);
    memset(job->exited, 0, job->nodes.n);
    memset(job->killed, 0, job->nodes.n * sizeof job->killed[0]);
    memset(job->why, 0, job->nodes.n * sizeof job->why[0]);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = launch_supervise_lines(argv, srun_line, job);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rc < 0) {
        fprintf(stderr, "ddp-launch: cannot start srun: %s\n", strerror(errno));
        rc = SETUP_EXIT;
    }
    free(argv);
    free(nodes);
    return rc;
}

/* Generation after generation, each one srun over the allocation's healthy nodes, until one ends
 * with exit status 0, the job is stopped, --max-restarts restarts are spent, or fewer than
 * --min-nodes nodes would be left. Returns the last generation's exit status. */
static int launch_slurm_elastic(const struct launch_options *opt, char **args)
{
    struct slurm_job job = {.job_id = getenv("SLURM_JOB_ID")};
    check_slurm_elastic(opt, &job);
    size_t n = job.nodes.n;
    job.healthy = malloc(n);
    job.exited = malloc(n);
    job.killed = malloc(n * sizeof *job.killed);
    job.why = malloc(n * sizeof *job.why);
    if (!job.healthy || !job.exited || !job.killed || !job.why) {
        fprintf(stderr, "ddp-launch: out of memory for %zu nodes\n", n);
        return SETUP_EXIT;
    }
    memset(job.healthy, 1, n);
    const char *prefix = slurm_snapshot_dir(&job);
    int min = opt->min_nodes > 0 ? opt->min_nodes : 1, rc, left;
    char ended[2048] = "the job's start";
    for (int gen = 0;; gen++) {
        double secs;
        rc = slurm_generation(opt, &job, gen, ended, args, &secs);
        if (rc == 0 || launch_stop_requested()) {
            fprintf(stderr, "ddp-launch: generation %d ended with exit status %d after %.1f s%s\n",
                    gen, rc, secs, rc == 0 ? ": the job is done" : " (stopped by a signal)");
            break;
        }
        exclude_lost(&job);
        describe_end(&job, gen, rc, secs, ended, sizeof ended);
        free(healthy_list(&job, &left));
        if (gen >= opt->max_restarts) {
            fprintf(stderr, "ddp-launch: %s; no restart left (--max-restarts %d): the job ends\n",
                    ended, opt->max_restarts);
            break;
        }
        if (left < min) {
            fprintf(stderr, "ddp-launch: %s; %d node(s) left, below --min-nodes %d: the job "
                    "ends\n", ended, left, min);
            break;
        }
    }
    slurm_snapshot_remove(&job, prefix);
    launch_hostlist_free(&job.nodes);
    free(job.healthy);
    free(job.exited);
    free(job.killed);
    free(job.why);
    return rc;
}

/* Generation after generation of -n ranks (launch_local) until one ends with exit status 0, the
 * user stops the job, --max-restarts restarts are spent, or a shrink would go below --min-ranks;
 * in a Slurm allocation, srun's generations (launch_slurm_elastic).
 * Each generation learns its number (DDP_ELASTIC_GENERATION, from 0) and gets its own master port.
 * Returns the last generation's exit status. */
static int launch_elastic(const struct launch_options *opt, struct launch_layout *base, char **args)
{
    if (in_allocation(base))
        return launch_slurm_elastic(opt, args);
    check_elastic(opt, base);
    snapshot_dir_make();
    atexit(snapshot_dir_remove);
    int n = base->world_size, min = opt->shrink ? (opt->min_ranks > 0 ? opt->min_ranks : 1) : n;
    char ended[256] = "the job's start";
    for (int gen = 0;; gen++) {
        fprintf(stderr, "ddp-launch: generation %d: %d rank(s) on this node (restarts left %d); "
                "started after %s\n", gen, n, opt->max_restarts - gen, ended);
        char num[16];
        snprintf(num, sizeof num, "%d", gen);
        setenv("DDP_ELASTIC_GENERATION", num, 1);
        struct launch_layout l = *base;
        struct launch_options o = *opt;
        l.world_size = o.n_procs = n;
        if (opt->master_port < 0 && !getenv("MASTER_PORT"))
            l.master_port = launch_port_from_hash((unsigned long long)getpid() * 1000003ull + gen);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = launch_local(&o, &l, args);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (rc == 0 || launch_stop_requested()) {
            fprintf(stderr, "ddp-launch: generation %d ended with exit status %d after %.1f s%s\n",
                    gen, rc, secs, rc == 0 ? ": the job is done" : " (stopped by a signal)");
            return rc;
        }
        snprintf(ended, sizeof ended, "generation %d ended with exit status %d after %.1f s%s", gen,
                 rc, secs, rc > 128 ? " (a rank was killed by a signal)" : "");
        if (gen >= opt->max_restarts) {
            fprintf(stderr, "ddp-launch: %s; no restart left (--max-restarts %d): the job ends\n",
                    ended, opt->max_restarts);
            return rc;
        }
        if (opt->shrink && n - 1 < min) {
            fprintf(stderr, "ddp-launch: %s; one rank fewer would be %d, below --min-ranks %d: the "
                    "job ends\n", ended, n - 1, min);
            return rc;
        }
        n -= opt->shrink;
    }
}

int main(int argc, char **argv)
{
    struct launch_options opt;
    struct launch_layout layout;
    char err[LAUNCH_ERRMSG_LEN];
    int first = parse_options(argc, argv, &opt);
    char **args = argv + first;
    if (launch_layout_detect(environ, &opt, &layout, err, sizeof err) != 0) {
        fail("error: %s", err);
        return SETUP_EXIT;
    }
    if (opt.max_restarts >= 0 || opt.min_ranks > 0 || opt.shrink || opt.min_nodes > 0)
        return launch_elastic(&opt, &layout, args);
    if (layout.source == LAUNCH_SOURCE_NONE)
        return launch_local(&opt, &layout, args);
    return run_rank(&opt, &layout, args);
}
