/* env.c - works out how ddp-launch was started (srun, mpirun, PMIx, Hydra, torchrun, nothing) and
 * the rank layout, cross-checking every source present and the command-line flags. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher.h"

enum field { F_RANK, F_SIZE, F_LRANK, F_LSIZE, F_NODE, F_NNODES, N_FIELDS };

static const char *const field_names[N_FIELDS] = {
    "rank", "world size", "local rank", "local world size", "node rank", "node count",
};

/* One source's view of the layout: value -1 = not given; var names where it came from. */
struct view {
    const char *who;
    int value[N_FIELDS];
    const char *var[N_FIELDS];
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

const char *launch_source_name(enum launch_source source)
{
    static const char *const names[] = {"none", "srun", "mpirun", "pmix", "hydra", "torchrun", "local"};
    return names[source];
}

void launch_options_init(struct launch_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->n_procs = opt->nproc_per_node = opt->ntasks_per_node = opt->master_port = -1;
    opt->max_restarts = opt->min_ranks = -1;
    opt->bind = LAUNCH_BIND_AUTO;
}

const char *launch_env_get(char *const *envp, const char *name)
{
    size_t len = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, len) == 0 && (*envp)[len] == '=')
            return *envp + len + 1;
    return NULL;
}

/* Parses a non-negative decimal int; -1 when S is not one. */
static int parse_count(const char *s)
{
    char *end;
    long v;
    if (!s || !*s)
        return -1;
    v = strtol(s, &end, 10);
    return (*end || v < 0 || v > 1 << 30) ? -1 : (int)v;
}

/* Reads field F of V from variable VAR (when set); a malformed value is an error. */
static int take(struct view *v, enum field f, char *const *envp, const char *var, char *err, size_t errlen)
{
    const char *s = launch_env_get(envp, var);
    if (!s || v->value[f] >= 0)
        return 0;
    v->value[f] = parse_count(s);
    v->var[f] = var;
    if (v->value[f] < 0) {
        set_err(err, errlen, "%s='%s' is not a non-negative number", var, s);
        return -1;
    }
    return 0;
}

static void view_init(struct view *v, const char *who)
{
    v->who = who;
    for (int f = 0; f < N_FIELDS; f++) {
        v->value[f] = -1;
        v->var[f] = NULL;
    }
}

int launch_slurm_tasks_on_node(const char *spec, int node)
{
    const char *p = spec;
    while (p && *p) {
        char *end;
        long count = strtol(p, &end, 10), reps = 1;
        if (end == p || count < 0)
            return -1;
        if (strncmp(end, "(x", 2) == 0) {
            reps = strtol(end + 2, &end, 10);
            if (*end++ != ')' || reps < 1)
                return -1;
        }
        if (node < reps)
            return (int)count;
        node -= (int)reps;
        if (*end != ',' && *end != '\0')
            return -1;
        p = *end ? end + 1 : end;
    }
    return -1;
}

static int read_srun(char *const *envp, struct view *v, char *err, size_t errlen)
{
    const char *per_node = launch_env_get(envp, "SLURM_STEP_TASKS_PER_NODE");
    view_init(v, "srun");
    if (take(v, F_RANK, envp, "SLURM_PROCID", err, errlen) || take(v, F_SIZE, envp, "SLURM_STEP_NUM_TASKS", err, errlen) ||
        take(v, F_SIZE, envp, "SLURM_NTASKS", err, errlen) || take(v, F_LRANK, envp, "SLURM_LOCALID", err, errlen) ||
        take(v, F_NODE, envp, "SLURM_NODEID", err, errlen) || take(v, F_NNODES, envp, "SLURM_STEP_NUM_NODES", err, errlen) ||
        take(v, F_NNODES, envp, "SLURM_NNODES", err, errlen))
        return -1;
    if (per_node && v->value[F_NODE] >= 0) {
        v->value[F_LSIZE] = launch_slurm_tasks_on_node(per_node, v->value[F_NODE]);
        v->var[F_LSIZE] = "SLURM_STEP_TASKS_PER_NODE";
        if (v->value[F_LSIZE] < 0) {
            set_err(err, errlen, "SLURM_STEP_TASKS_PER_NODE='%s' has no entry for node %d", per_node, v->value[F_NODE]);
            return -1;
        }
    }
    return 0;
}

/* This host's position in the job's Slurm node list (SLURMD_NODENAME, else the short host name),
 * or -1 when there is no list or the host is not in it. */
static int slurm_node_index(char *const *envp)
{
    const char *list = launch_env_get(envp, "SLURM_JOB_NODELIST"), *name = launch_env_get(envp, "SLURMD_NODENAME");
    char host[LAUNCH_HOST_LEN], err[LAUNCH_ERRMSG_LEN];
    struct launch_hostlist hl;
    int index = -1;
    if (!name) {
        if (gethostname(host, sizeof host) != 0)
            return -1;
        host[sizeof host - 1] = '\0';
        host[strcspn(host, ".")] = '\0';
        name = host;
    }
    if (!list || launch_hostlist_expand(list, &hl, err, sizeof err) != 0)
        return -1;
    for (size_t i = 0; i < hl.n && index < 0; i++)
        if (strcmp(hl.names[i], name) == 0)
            index = (int)i;
    launch_hostlist_free(&hl);
    return index;
}

/* Open MPI's mpirun: its variables, plus the node: mpirun inside a Slurm allocation starts its
 * daemons on the allocation's nodes in node-list order, so a rank's node is its host's position in
 * SLURM_JOB_NODELIST, whatever --map-by placed where; OMPI_MCA_orte_num_nodes counts the nodes. */
static int read_mpirun(char *const *envp, struct view *v, char *err, size_t errlen)
{
    view_init(v, "mpirun");
    int rc = take(v, F_RANK, envp, "OMPI_COMM_WORLD_RANK", err, errlen) |
             take(v, F_SIZE, envp, "OMPI_COMM_WORLD_SIZE", err, errlen) |
             take(v, F_LRANK, envp, "OMPI_COMM_WORLD_LOCAL_RANK", err, errlen) |
             take(v, F_LSIZE, envp, "OMPI_COMM_WORLD_LOCAL_SIZE", err, errlen) |
             take(v, F_NNODES, envp, "OMPI_MCA_orte_num_nodes", err, errlen);
    int node = slurm_node_index(envp);
    if (rc == 0 && node >= 0 && v->value[F_NNODES] > node) {
        v->value[F_NODE] = node;
        v->var[F_NODE] = "SLURM_JOB_NODELIST";
    }
    return rc;
}

static int read_views(char *const *envp, struct view views[], int *n, char *err, size_t errlen)
{
    struct view *v = &views[*n];
    int rc = 0;
    if (launch_env_get(envp, "OMPI_COMM_WORLD_RANK")) {
        rc |= read_mpirun(envp, v, err, errlen);
        v = &views[++*n];
    }
    if (launch_env_get(envp, "PMI_RANK")) {
        view_init(v, launch_env_get(envp, "MPI_LOCALRANKID") ? "hydra" : "PMI");
        rc |= take(v, F_RANK, envp, "PMI_RANK", err, errlen) | take(v, F_SIZE, envp, "PMI_SIZE", err, errlen) |
              take(v, F_LRANK, envp, "MPI_LOCALRANKID", err, errlen) | take(v, F_LSIZE, envp, "MPI_LOCALNRANKS", err, errlen);
        v = &views[++*n];
    }
    if (launch_env_get(envp, "SLURM_PROCID") &&
        (launch_env_get(envp, "SLURM_STEP_NUM_TASKS") || launch_env_get(envp, "SLURM_STEP_TASKS_PER_NODE"))) {
        rc |= read_srun(envp, v, err, errlen);
        v = &views[++*n];
    }
    if (launch_env_get(envp, "PMIX_RANK")) {
        view_init(v, "PMIx");
        rc |= take(v, F_RANK, envp, "PMIX_RANK", err, errlen);
        v = &views[++*n];
    }
    if (launch_env_get(envp, "RANK") && launch_env_get(envp, "WORLD_SIZE")) {
        view_init(v, "torchrun-style variables");
        rc |= take(v, F_RANK, envp, "RANK", err, errlen) | take(v, F_SIZE, envp, "WORLD_SIZE", err, errlen) |
              take(v, F_LRANK, envp, "LOCAL_RANK", err, errlen) | take(v, F_LSIZE, envp, "LOCAL_WORLD_SIZE", err, errlen) |
              take(v, F_NODE, envp, "GROUP_RANK", err, errlen) | take(v, F_NODE, envp, "NODE_RANK", err, errlen);
        ++*n;
    }
    return rc ? -1 : 0;
}

/* The launcher in charge: the first view in precedence order mpirun, hydra, srun, PMIx, torchrun. */
static enum launch_source primary_source(const struct view *views, int n, int *index)
{
    static const struct { const char *who; enum launch_source source; } order[] = {
        {"mpirun", LAUNCH_SOURCE_MPIRUN}, {"hydra", LAUNCH_SOURCE_HYDRA}, {"srun", LAUNCH_SOURCE_SRUN},
        {"PMIx", LAUNCH_SOURCE_PMIX}, {"torchrun-style variables", LAUNCH_SOURCE_TORCHRUN},
    };
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++)
        for (int i = 0; i < n; i++)
            if (strcmp(views[i].who, order[k].who) == 0) {
                *index = i;
                return order[k].source;
            }
    *index = -1;
    return LAUNCH_SOURCE_NONE;
}

/* Slurm variables describe the allocation (or Open MPI's daemon step), not the ranks, when mpirun
 * or mpiexec started this process: they take no part in the cross-check then. */
static int view_applies(enum launch_source primary, const struct view *v)
{
    return !(strcmp(v->who, "srun") == 0 && (primary == LAUNCH_SOURCE_MPIRUN || primary == LAUNCH_SOURCE_HYDRA));
}

static const char *fix_hint(enum field f)
{
    switch (f) {
    case F_SIZE: return "start as many tasks as -n says (srun -n / mpirun -np), or drop -n";
    case F_LSIZE: return "make srun's --ntasks-per-node and ddp-launch's --nproc-per-node/--ntasks-per-node agree";
    default: return "unset the stale variables (e.g. RANK, WORLD_SIZE exported by the job script)";
    }
}

/* Merges view V into M (the layout so far, with its source per field); disagreement is an error. */
static int merge(struct view *m, const struct view *v, char *err, size_t errlen)
{
    for (int f = 0; f < N_FIELDS; f++) {
        if (v->value[f] < 0)
            continue;
        if (m->value[f] < 0) {
            m->value[f] = v->value[f];
            m->var[f] = v->var[f];
            continue;
        }
        if (m->value[f] != v->value[f]) {
            set_err(err, errlen, "%s: %s says %d (%s) but %s says %d (%s); %s", field_names[f], m->who,
                    m->value[f], m->var[f], v->who, v->value[f], v->var[f], fix_hint((enum field)f));
            return -1;
        }
    }
    return 0;
}

/* The views of the flags and of SLURM_NTASKS_PER_NODE, which only cross-check. */
static int flag_views(char *const *envp, const struct launch_options *opt, enum launch_source primary,
                      struct view views[], int *n, char *err, size_t errlen)
{
    struct view *v = &views[*n];
    view_init(v, "ddp-launch's flags");
    if (primary != LAUNCH_SOURCE_NONE) {
        v->value[F_SIZE] = opt->n_procs;
        v->var[F_SIZE] = "-n";
    }
    v->value[F_LSIZE] = opt->nproc_per_node;
    v->var[F_LSIZE] = "--nproc-per-node";
    if (opt->nproc_per_node < 0) {
        v->value[F_LSIZE] = opt->ntasks_per_node;
        v->var[F_LSIZE] = "--ntasks-per-node";
    } else if (opt->ntasks_per_node >= 0 && opt->ntasks_per_node != opt->nproc_per_node) {
        set_err(err, errlen, "--nproc-per-node %d and --ntasks-per-node %d disagree", opt->nproc_per_node, opt->ntasks_per_node);
        return -1;
    }
    ++*n;
    if (primary == LAUNCH_SOURCE_SRUN && launch_env_get(envp, "SLURM_NTASKS_PER_NODE")) {
        v = &views[(*n)++];
        view_init(v, "the job's --ntasks-per-node");
        return take(v, F_LSIZE, envp, "SLURM_NTASKS_PER_NODE", err, errlen);
    }
    return 0;
}

/* Fills the fields no source gave: one node unless told otherwise, ranks laid out node by node. */
static void derive(struct view *m)
{
    int *x = m->value;
    if (x[F_LSIZE] < 0)
        x[F_LSIZE] = x[F_NNODES] > 0 && x[F_SIZE] % x[F_NNODES] == 0 ? x[F_SIZE] / x[F_NNODES] : x[F_SIZE];
    if (x[F_LSIZE] <= 0)
        return;
    if (x[F_LRANK] < 0)
        x[F_LRANK] = x[F_RANK] % x[F_LSIZE];
    if (x[F_NODE] < 0)
        x[F_NODE] = x[F_RANK] / x[F_LSIZE];
    if (x[F_NNODES] < 0)
        x[F_NNODES] = (x[F_SIZE] + x[F_LSIZE] - 1) / x[F_LSIZE];
}

static int validate(const struct view *m, char *err, size_t errlen)
{
    const int *x = m->value;
    if (x[F_SIZE] <= 0) {
        set_err(err, errlen, "%s gives the rank but not the world size: pass -n N", m->who);
        return -1;
    }
    if (x[F_RANK] >= x[F_SIZE] || x[F_LSIZE] <= 0 || x[F_LRANK] >= x[F_LSIZE] || x[F_LSIZE] > x[F_SIZE] ||
        x[F_NNODES] <= 0 || x[F_NODE] >= x[F_NNODES]) {
        set_err(err, errlen, "impossible layout from %s: rank %d of %d, local rank %d of %d, node %d of %d",
                m->who, x[F_RANK], x[F_SIZE], x[F_LRANK], x[F_LSIZE], x[F_NODE], x[F_NNODES]);
        return -1;
    }
    return 0;
}

static int first_host(const char *list, char *out, char *err, size_t errlen)
{
    struct launch_hostlist hl;
    if (launch_hostlist_expand(list, &hl, err, errlen) != 0)
        return -1;
    if (hl.n == 0) {
        launch_hostlist_free(&hl);
        set_err(err, errlen, "empty Slurm node list '%s'", list);
        return -1;
    }
    snprintf(out, LAUNCH_HOST_LEN, "%s", hl.names[0]);
    launch_hostlist_free(&hl);
    return 0;
}

/* MASTER_ADDR: the flag, the environment, the first host of the Slurm node list (the step's under
 * srun, the job's under mpirun/mpiexec, where rank 0 runs beside mpirun), or loopback on one node. */
static int master_addr(char *const *envp, const struct launch_options *opt, struct launch_layout *l, char *err, size_t errlen)
{
    const char *step = launch_env_get(envp, "SLURM_STEP_NODELIST"), *job = launch_env_get(envp, "SLURM_JOB_NODELIST");
    const char *set = opt->master_addr ? opt->master_addr : launch_env_get(envp, "MASTER_ADDR");
    const char *list = l->source == LAUNCH_SOURCE_SRUN && step ? step : job;
    if (set && !*set) {
        set_err(err, errlen, "%s is empty: give rank 0's host name or address, or unset it",
                opt->master_addr ? "--master-addr" : "MASTER_ADDR");
        return -1;
    }
    if (set && strlen(set) >= sizeof l->master_addr) {
        set_err(err, errlen, "%s is %zu characters long; at most %zu fit: give a shorter host name or address",
                opt->master_addr ? "--master-addr" : "MASTER_ADDR", strlen(set), sizeof l->master_addr - 1);
        return -1;
    }
    if (set) {
        snprintf(l->master_addr, sizeof l->master_addr, "%s", set);
        return 0;
    }
    if (list && (l->source == LAUNCH_SOURCE_SRUN || l->source == LAUNCH_SOURCE_MPIRUN || l->source == LAUNCH_SOURCE_HYDRA))
        return first_host(list, l->master_addr, err, errlen);
    if (l->n_nodes == 1) {
        snprintf(l->master_addr, sizeof l->master_addr, "127.0.0.1");
        return 0;
    }
    set_err(err, errlen, "%s spans %d nodes and does not say where rank 0 runs: pass --master-addr HOST or export MASTER_ADDR",
            launch_source_name(l->source), l->n_nodes);
    return -1;
}

/* SplitMix64's finaliser: every input bit affects every output bit. */
static unsigned long long mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int launch_port_from_hash(unsigned long long h)
{
    return LAUNCH_PORT_MIN + (int)(h % (unsigned long long)(LAUNCH_PORT_END - LAUNCH_PORT_MIN));
}

int launch_master_port(unsigned long long job_id, unsigned long long step_id)
{
    return launch_port_from_hash(mix64(mix64(job_id) ^ step_id));
}

static unsigned long long hash_string(const char *s)
{
    unsigned long long h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return mix64(h);
}

/* A MASTER_PORT in the environment must be a TCP port: anything else would reach the program. */
static int check_master_port(char *const *envp, char *err, size_t errlen)
{
    const char *port = launch_env_get(envp, "MASTER_PORT");
    int v = parse_count(port);
    if (port && (v < 1 || v > 65535)) {
        set_err(err, errlen, "MASTER_PORT='%s' is not a TCP port: give a number from 1 to 65535, or unset it "
                "(ddp-launch then derives one from the job)", port);
        return -1;
    }
    return 0;
}

/* The launch's name (shared by all its ranks) and, unless given, MASTER_PORT derived from it. */
static void job_key_and_port(char *const *envp, const struct launch_options *opt, struct launch_layout *l)
{
    const char *job = launch_env_get(envp, "SLURM_JOB_ID"), *step = launch_env_get(envp, "SLURM_STEP_ID");
    const char *ompi = launch_env_get(envp, "OMPI_MCA_ess_base_jobid"), *ns = launch_env_get(envp, "PMIX_NAMESPACE");
    const char *port = launch_env_get(envp, "MASTER_PORT"), *run = launch_env_get(envp, "TORCHELASTIC_RUN_ID");
    if (l->source == LAUNCH_SOURCE_SRUN && job)
        snprintf(l->job_key, sizeof l->job_key, "slurm-%s.%s", job, step ? step : "0");
    else if (l->source == LAUNCH_SOURCE_MPIRUN && ompi)
        snprintf(l->job_key, sizeof l->job_key, "ompi-%s", ompi);
    else if (ns)
        snprintf(l->job_key, sizeof l->job_key, "pmix-%s", ns);
    else if (run)
        snprintf(l->job_key, sizeof l->job_key, "torchrun-%s", run);
    else
        snprintf(l->job_key, sizeof l->job_key, "%s-%.64s-%.16s", launch_source_name(l->source), l->master_addr, port ? port : "");
    l->master_port = opt->master_port >= 0 ? opt->master_port : parse_count(port);
    if (l->master_port >= 0)
        return;
    if (l->source == LAUNCH_SOURCE_SRUN && job)
        l->master_port = launch_master_port(strtoull(job, NULL, 10), step ? strtoull(step, NULL, 10) : 0);
    else
        l->master_port = launch_port_from_hash(hash_string(l->job_key));
}

static void fill_layout(const struct view *m, enum launch_source source, struct launch_layout *out)
{
    out->source = source;
    out->rank = m->value[F_RANK];
    out->world_size = m->value[F_SIZE];
    out->local_rank = m->value[F_LRANK];
    out->local_world_size = m->value[F_LSIZE];
    out->node_rank = m->value[F_NODE];
    out->n_nodes = m->value[F_NNODES];
}

/* Layout of a process nothing launched: -n N ranks on this node, this being rank 0. Without -n,
 * --nproc-per-node N (torchrun's flag) or --ntasks-per-node N says how many. */
static int no_launcher(const struct launch_options *opt, struct view *m, char *err, size_t errlen)
{
    int per_node = opt->nproc_per_node > 0 ? opt->nproc_per_node : opt->ntasks_per_node;
    int n = opt->n_procs > 0 ? opt->n_procs : per_node > 0 ? per_node : 1;
    if (per_node > 0 && per_node != n) {
        set_err(err, errlen, "-n %d starts %d ranks on this node but --%s says %d: make them agree", n, n,
                opt->nproc_per_node > 0 ? "nproc-per-node" : "ntasks-per-node", per_node);
        return -1;
    }
    m->value[F_RANK] = m->value[F_LRANK] = m->value[F_NODE] = 0;
    m->value[F_SIZE] = m->value[F_LSIZE] = n;
    m->value[F_NNODES] = 1;
    for (int f = 0; f < N_FIELDS; f++)
        m->var[f] = "-n";
    return 0;
}

int launch_layout_detect(char *const *envp, const struct launch_options *opt, struct launch_layout *out,
                         char *err, size_t errlen)
{
    struct view views[8], merged;
    int n = 0, primary_index;
    enum launch_source source;
    memset(out, 0, sizeof *out);
    if (read_views(envp, views, &n, err, errlen) != 0)
        return -1;
    source = primary_source(views, n, &primary_index);
    view_init(&merged, source == LAUNCH_SOURCE_NONE ? "ddp-launch" : views[primary_index].who);
    if (source == LAUNCH_SOURCE_NONE) {
        if (no_launcher(opt, &merged, err, errlen) != 0)
            return -1;
    } else if (merge(&merged, &views[primary_index], err, errlen) != 0) {
        return -1;
    }
    if (flag_views(envp, opt, source, views, &n, err, errlen) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (i != primary_index && view_applies(source, &views[i]) && merge(&merged, &views[i], err, errlen) != 0)
            return -1;
    derive(&merged);
    if (validate(&merged, err, errlen) != 0)
        return -1;
    fill_layout(&merged, source, out);
    if (master_addr(envp, opt, out, err, errlen) != 0 || check_master_port(envp, err, errlen) != 0)
        return -1;
    job_key_and_port(envp, opt, out);
    return 0;
}
