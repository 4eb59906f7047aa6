/* test_gpumap.c - test 6: GPU mapping with simulated device lists: a list Slurm narrowed, a list
 * not narrowed, too few GPUs, sharing, no GPU; and discovery with DDP_SIMULATE_GPUS. */
#include <string.h>

#include "../check.h"
#include "launcher.h"

static struct launch_gpu_list list_of(const char *spec)
{
    struct launch_gpu_list l;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(launch_gpu_list_parse(spec, &l, err, sizeof err) == 0, "parse '%s': %s", spec, err);
    return l;
}

static void narrowed_by_slurm(void)
{
    char *env[] = {"SLURM_GPUS_PER_TASK=1", "CUDA_VISIBLE_DEVICES=2", NULL};
    struct launch_gpu_list l = list_of("2");
    struct launch_gpu_choice c;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(launch_gpus_narrowed(env), "SLURM_GPUS_PER_TASK must mean narrowed");
    CHECK(launch_gpu_map(&l, 1, 3, 4, 0, &c, err, sizeof err) == 0, "narrowed map failed: %s", err);
    CHECK(c.device == 0 && strcmp(c.visible, "2") == 0, "narrowed: device %d visible '%s'", c.device, c.visible);
    char *bind_none[] = {"SLURM_GPU_BIND=none", NULL}, *plain[] = {"CUDA_VISIBLE_DEVICES=0,1", NULL};
    CHECK(!launch_gpus_narrowed(bind_none) && !launch_gpus_narrowed(plain), "not narrowed without Slurm's GPU binding");
    /* What Slurm 22.05 gives a task of `srun --gpus-per-task=1` (no SLURM_GPUS_PER_TASK outside sbatch),
     * of `srun --gpu-bind=none` inside `sbatch --gpus-per-task=1`, and of `--gpu-bind=closest`. */
    char *srun_per_task[] = {"SLURMD_TRES_BIND=gpu:per_task:1", "CUDA_VISIBLE_DEVICES=1", NULL};
    char *srun_map[] = {"SLURMD_TRES_BIND=gpu:verbose,map_gpu:1,0", NULL};
    char *step_none[] = {"SLURM_GPUS_PER_TASK=1", "SLURMD_TRES_BIND=gpu:none", NULL};
    char *closest[] = {"SLURMD_TRES_BIND=gpu:closest", "CUDA_VISIBLE_DEVICES=0,1", NULL};
    CHECK(launch_gpus_narrowed(srun_per_task) && launch_gpus_narrowed(srun_map), "SLURMD_TRES_BIND gpu binding must mean narrowed");
    CHECK(!launch_gpus_narrowed(step_none), "the step's --gpu-bind=none wins over the job's SLURM_GPUS_PER_TASK");
    CHECK(!launch_gpus_narrowed(closest), "--gpu-bind=closest shares a socket's list among its tasks: not narrowed");
}

static void not_narrowed(void)
{
    struct launch_gpu_list l = list_of("GPU-aaaa,GPU-bbbb,GPU-cccc,GPU-dddd");
    struct launch_gpu_choice c;
    char err[LAUNCH_ERRMSG_LEN];
    CHECK(l.n == 4 && strcmp(l.id[2], "GPU-cccc") == 0, "UUID list parsed as %d entries", l.n);
    for (int r = 0; r < 4; r++) {
        CHECK(launch_gpu_map(&l, 0, r, 4, 0, &c, err, sizeof err) == 0, "rank %d: %s", r, err);
        CHECK(c.device == r && c.n_sharing == 1, "rank %d got device %d shared by %d", r, c.device, c.n_sharing);
        CHECK(strcmp(c.visible, "GPU-aaaa,GPU-bbbb,GPU-cccc,GPU-dddd") == 0, "visible '%s'", c.visible);
    }
}

static void too_few_and_sharing(void)
{
    struct launch_gpu_list l = list_of("0,1");
    struct launch_gpu_choice c;
    char err[LAUNCH_ERRMSG_LEN] = "";
    CHECK(launch_gpu_map(&l, 0, 0, 3, 0, &c, err, sizeof err) != 0, "3 ranks on 2 GPUs must be refused");
    CHECK(strstr(err, "--share-gpus") && strstr(err, "--ntasks-per-node=2"), "message says what to change: %s", err);
    int want_dev[] = {0, 1, 0}, want_share[] = {2, 1, 2}, want_idx[] = {0, 0, 1};
    for (int r = 0; r < 3; r++) {
        CHECK(launch_gpu_map(&l, 0, r, 3, 1, &c, err, sizeof err) == 0, "sharing rank %d: %s", r, err);
        CHECK(c.device == want_dev[r] && c.n_sharing == want_share[r] && c.share_index == want_idx[r],
              "rank %d: device %d sharing %d index %d", r, c.device, c.n_sharing, c.share_index);
    }
}

static void no_gpu_and_discovery(void)
{
    struct launch_gpu_list l = list_of("");
    struct launch_gpu_choice c;
    char err[LAUNCH_ERRMSG_LEN];
    char *sim4[] = {"DDP_SIMULATE_GPUS=4", NULL}, *sim4_vis[] = {"DDP_SIMULATE_GPUS=4", "CUDA_VISIBLE_DEVICES=3,1", NULL};
    char *sim0[] = {"DDP_SIMULATE_GPUS=0", "CUDA_VISIBLE_DEVICES=0,1", NULL}, *bad[] = {"DDP_SIMULATE_GPUS=x", NULL};
    CHECK(launch_gpu_map(&l, 0, 1, 8, 0, &c, err, sizeof err) == 0 && c.device == -1, "no GPU: CPU backend");
    CHECK(list_of("-1").n == 0 && list_of("NoDevFiles").n == 0, "'-1' and NoDevFiles mean no GPU");
    CHECK(launch_gpu_discover(sim4, &l, err, sizeof err) == 0 && l.n == 4 && strcmp(l.id[3], "3") == 0, "4 simulated: %d", l.n);
    CHECK(launch_gpu_discover(sim4_vis, &l, err, sizeof err) == 0 && l.n == 2 && strcmp(l.id[0], "3") == 0,
          "CUDA_VISIBLE_DEVICES narrows the simulated GPUs: %d", l.n);
    CHECK(launch_gpu_discover(sim0, &l, err, sizeof err) == 0 && l.n == 0, "no driver GPU: a stale list is ignored");
    CHECK(launch_gpu_discover(bad, &l, err, sizeof err) != 0, "a malformed DDP_SIMULATE_GPUS is an error");
}

int main(void)
{
    narrowed_by_slurm();
    not_narrowed();
    too_few_and_sharing();
    no_gpu_and_discovery();
    return CHECK_DONE();
}
