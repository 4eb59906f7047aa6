/* elastic.c - ddp-launch's generations (--max-restarts): on a workstation, one mpirun (or set of
 * forked ranks) per generation, shrinking by one rank after a failure if asked
 * (--shrink-on-failure, --min-ranks); in a Slurm batch script, one srun per generation over the
 * nodes still healthy (--min-nodes), a lost node left out. Each generation learns its number
 * (DDP_ELASTIC_GENERATION) and where the survivors leave their rescue snapshots
 * (DDP_SNAPSHOT_DIR, node-local memory). docs/reliability.md describes both. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

#define USAGE_EXIT 2 /* ddp-launch's statuses: bad usage, a launch that cannot start */
#define SETUP_EXIT 1

/* ---- generations (--max-restarts) ---------------------------------------------------------- */

/* The elastic flags fit this launch: on this machine (no launcher around ddp-launch, no Slurm
 * allocation), with --max-restarts, --min-ranks within -n, no --min-nodes. Exits 2 otherwise,
 * naming the usage. */
/* DDP_ELASTIC_LAUNCHED_AT: when this generation is launched (wall clock, seconds since the epoch),
 * from which the program's resume line counts its phases (ddp_rescue_phases). */
static void elastic_mark_launch(void)
{
    struct timespec w;
    char at[32];
    clock_gettime(CLOCK_REALTIME, &w);
    snprintf(at, sizeof at, "%.3f", (double)w.tv_sec + 1e-9 * (double)w.tv_nsec);
    setenv("DDP_ELASTIC_LAUNCHED_AT", at, 1);
}

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
    elastic_mark_launch();
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
int launch_elastic(const struct launch_options *opt, struct launch_layout *base, char **args)
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
        elastic_mark_launch();
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
