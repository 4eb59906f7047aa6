/* ddp_launch.c - ddp-launch: finds out how it was started, computes the rank layout, maps the rank
 * to a GPU and CPU cores, exports the torchrun-style and DDP_* variables and execs the program. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    suggest_usage_error("ddp-launch", longs, c == '?' && arg[0] == '-' && arg[1] == '-',
                        c == ':' ? "missing value for option" : "unknown option", arg,
                        " (see ddp-launch --help)\n");
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

int launch_local(const struct launch_options *opt, struct launch_layout *l, char **args)
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
