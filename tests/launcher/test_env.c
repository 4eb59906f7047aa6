/* test_env.c - launch-environment detection: each launcher's variables give the right layout,
 * MASTER_ADDR comes from the expanded node list, MASTER_PORT from the job and step, and sources or
 * flags that disagree, an empty MASTER_ADDR and a MASTER_PORT that is no TCP port are errors. */
#include <string.h>

#include "../check.h"
#include "launcher.h"

static int detect(char **env, const struct launch_options *opt, struct launch_layout *l, char *err)
{
    struct launch_options defaults;
    launch_options_init(&defaults);
    err[0] = '\0';
    return launch_layout_detect(env, opt ? opt : &defaults, l, err, LAUNCH_ERRMSG_LEN);
}

/* Derived ports: in [LAUNCH_PORT_MIN, LAUNCH_PORT_END) (below Linux's ephemeral ports), deterministic,
 * different for the steps of a job and for neighbouring jobs, including the pairs a linear formula
 * job * 31 + step would confuse, and spread over the range. */
static void master_ports(void)
{
    int seen_low = 0, seen_high = 0, collisions = 0;
    CHECK(launch_master_port(1234, 2) == launch_master_port(1234, 2), "port not deterministic");
    CHECK(launch_master_port(1234, 2) != launch_master_port(1234, 3), "two steps of a job get one port");
    CHECK(launch_master_port(1234, 31) != launch_master_port(1235, 0), "job j step 31 = job j+1 step 0");
    for (unsigned long long job = 1; job <= 2000; job++) {
        int p = launch_master_port(job, 0), q = launch_master_port(job, 4294967294ULL); /* batch step */
        CHECK(p >= LAUNCH_PORT_MIN && p < LAUNCH_PORT_END && q >= LAUNCH_PORT_MIN && q < LAUNCH_PORT_END,
              "port %d / %d out of range", p, q);
        seen_low |= p < LAUNCH_PORT_MIN + 1000;
        seen_high |= p >= LAUNCH_PORT_END - 1000;
        collisions += p == launch_master_port(job + 1, 0);
    }
    CHECK(seen_low && seen_high, "ports do not spread over the range");
    CHECK(collisions < 5, "%d neighbouring jobs share a port", collisions);
}

static void srun_two_nodes(void)
{
    char *env[] = {"SLURM_PROCID=5", "SLURM_STEP_NUM_TASKS=6", "SLURM_NTASKS=6", "SLURM_LOCALID=1",
                   "SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=3", "SLURM_STEP_TASKS_PER_NODE=2(x3)",
                   "SLURM_STEP_NODELIST=gpu-a[007-009]", "SLURM_JOB_NODELIST=gpu-a[001-009]",
                   "SLURM_JOB_ID=1234", "SLURM_STEP_ID=2", "PMIX_RANK=5", NULL};
    struct launch_layout l;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(detect(env, NULL, &l, err) == 0, "srun: %s", err);
    CHECK(l.source == LAUNCH_SOURCE_SRUN && l.rank == 5 && l.world_size == 6 && l.local_rank == 1 &&
          l.local_world_size == 2 && l.node_rank == 2 && l.n_nodes == 3, "srun layout wrong");
    CHECK(strcmp(l.master_addr, "gpu-a007") == 0, "MASTER_ADDR %s", l.master_addr);
    CHECK(l.master_port == launch_master_port(1234, 2), "MASTER_PORT %d", l.master_port);
    master_ports();
}

static void mpirun_inside_sbatch(void)
{
    /* The batch script's Slurm variables describe the allocation, not mpirun's ranks. */
    char *env[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                   "OMPI_COMM_WORLD_LOCAL_SIZE=2", "PMIX_RANK=3", "SLURM_PROCID=0", "SLURM_NTASKS=8",
                   "SLURM_STEP_NUM_TASKS=2", "SLURM_JOB_NODELIST=n[3-4]", NULL};
    struct launch_layout l;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(detect(env, NULL, &l, err) == 0, "mpirun: %s", err);
    CHECK(l.source == LAUNCH_SOURCE_MPIRUN && l.rank == 3 && l.world_size == 4 && l.node_rank == 1 && l.n_nodes == 2,
          "mpirun layout wrong: node %d of %d", l.node_rank, l.n_nodes);
    CHECK(strcmp(l.master_addr, "n3") == 0, "MASTER_ADDR %s", l.master_addr);
}

static void hydra_torchrun_pmix(void)
{
    char *hydra[] = {"PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=3", NULL};
    char *torch[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
                     "MASTER_ADDR=head", "MASTER_PORT=29500", NULL};
    char *pmix[] = {"PMIX_RANK=1", NULL};
    struct launch_options opt;
    struct launch_layout l;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(detect(hydra, NULL, &l, err) == 0 && l.source == LAUNCH_SOURCE_HYDRA && l.rank == 2 &&
          strcmp(l.master_addr, "127.0.0.1") == 0, "hydra: %s", err);
    CHECK(detect(torch, NULL, &l, err) == 0 && l.source == LAUNCH_SOURCE_TORCHRUN && l.node_rank == 1 &&
          l.n_nodes == 2 && strcmp(l.master_addr, "head") == 0 && l.master_port == 29500, "torchrun: %s", err);
    CHECK(detect(pmix, NULL, &l, err) != 0 && strstr(err, "-n"), "PMIx alone lacks the world size: %s", err);
    static char long_addr[LAUNCH_HOST_LEN + 16] = "MASTER_ADDR=";
    memset(long_addr + strlen(long_addr), 'h', LAUNCH_HOST_LEN);
    torch[5] = long_addr;
    CHECK(detect(torch, NULL, &l, err) != 0 && strstr(err, "MASTER_ADDR"), "a MASTER_ADDR too long must be refused: %s", err);
    torch[5] = "MASTER_ADDR=";
    CHECK(detect(torch, NULL, &l, err) != 0 && strstr(err, "MASTER_ADDR is empty"), "an empty MASTER_ADDR must be refused: %s", err);
    torch[5] = "MASTER_ADDR=head";
    for (int i = 0; i < 3; i++) {
        char *bad_ports[] = {"MASTER_PORT=65536", "MASTER_PORT=0", "MASTER_PORT=29500x"};
        torch[6] = bad_ports[i];
        CHECK(detect(torch, NULL, &l, err) != 0 && strstr(err, "from 1 to 65535"), "%s must be refused: %s", bad_ports[i], err);
    }
    torch[6] = "MASTER_PORT=29500";
    launch_options_init(&opt);
    opt.n_procs = 2;
    CHECK(detect(pmix, &opt, &l, err) == 0 && l.source == LAUNCH_SOURCE_PMIX && l.world_size == 2, "pmix -n 2: %s", err);
}

static void disagreements(void)
{
    char *two_sizes[] = {"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                         "SLURM_STEP_TASKS_PER_NODE=4", "RANK=0", "WORLD_SIZE=2", NULL};
    char *per_node[] = {"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                        "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_NTASKS_PER_NODE=4", NULL};
    char *srun4[] = {"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=4", "SLURM_NODEID=0", "SLURM_STEP_TASKS_PER_NODE=4", NULL};
    struct launch_options opt;
    struct launch_layout l;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(detect(two_sizes, NULL, &l, err) != 0 && strstr(err, "SLURM_STEP_NUM_TASKS") && strstr(err, "WORLD_SIZE"),
          "two world sizes must name both: %s", err);
    CHECK(detect(per_node, NULL, &l, err) != 0 && strstr(err, "SLURM_NTASKS_PER_NODE") &&
          strstr(err, "SLURM_STEP_TASKS_PER_NODE"), "--ntasks-per-node vs the step: %s", err);
    launch_options_init(&opt);
    opt.ntasks_per_node = 2;
    CHECK(detect(srun4, &opt, &l, err) != 0 && strstr(err, "--ntasks-per-node"), "flag vs step: %s", err);
    launch_options_init(&opt);
    opt.n_procs = 8;
    CHECK(detect(srun4, &opt, &l, err) != 0 && strstr(err, "-n") && strstr(err, "says 4"), "-n vs srun: %s", err);
    opt.n_procs = 4;
    CHECK(detect(srun4, &opt, &l, err) == 0, "-n agreeing with srun is fine: %s", err);
}

static void nothing(void)
{
    char *env[] = {"HOME=/root", NULL};
    struct launch_options opt;
    struct launch_layout l;
    char err[LAUNCH_ERRMSG_LEN];
    launch_options_init(&opt);
    opt.n_procs = 3;
    CHECK(detect(env, &opt, &l, err) == 0 && l.source == LAUNCH_SOURCE_NONE && l.world_size == 3 && l.local_world_size == 3,
          "no launcher: %s", err);
    opt.nproc_per_node = 2;
    CHECK(detect(env, &opt, &l, err) != 0, "-n 3 with --nproc-per-node 2 on one node must be refused");
    CHECK(launch_slurm_tasks_on_node("2(x3),1", 3) == 1 && launch_slurm_tasks_on_node("2(x3),1", 2) == 2 &&
          launch_slurm_tasks_on_node("2(x3),1", 4) == -1, "SLURM_STEP_TASKS_PER_NODE parsing");
}

int main(void)
{
    srun_two_nodes();
    mpirun_inside_sbatch();
    hydra_torchrun_pmix();
    disagreements();
    nothing();
    return CHECK_DONE();
}
