/* fuzz_launch_env.c - libFuzzer harness: ddp-launch's reading of its environment (launcher/env.c,
 * and the GPU list of launcher/gpumap.c) on any set of variables.
 *
 * Input: lines. "NAME=value" lines form the environment; lines "@n=N", "@nproc=N", "@ntasks=N",
 * "@port=N", "@addr=HOST" and "@share" set ddp-launch's flags -n, --nproc-per-node,
 * --ntasks-per-node, --master-port, --master-addr and --share-gpus (numbers as ddp-launch accepts
 * them: 1 to 2^20, the port at most 65535). Besides the sanitizers' checks: an accepted layout is
 * consistent (every rank, local rank and node inside its count, MASTER_PORT a TCP port,
 * MASTER_ADDR set), so is the GPU choice, and a refusal says why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "launcher.h"

#define FUZZ_MAX_VARS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A flag value as ddp-launch's parser would let it through, or -1 (not given). */
static int flag_number(const char *s, long max)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v <= 0 || v > max ? -1 : (int)v;
}

/* Splits text (modified in place) into envp[] and the flags. */
static void split_input(char *text, char **envp, struct launch_options *opt)
{
    int n = 0;
    launch_options_init(opt);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "@n=", 3) == 0)
            opt->n_procs = flag_number(line + 3, 1 << 20);
        else if (strncmp(line, "@nproc=", 7) == 0)
            opt->nproc_per_node = flag_number(line + 7, 1 << 20);
        else if (strncmp(line, "@ntasks=", 8) == 0)
            opt->ntasks_per_node = flag_number(line + 8, 1 << 20);
        else if (strncmp(line, "@port=", 6) == 0)
            opt->master_port = flag_number(line + 6, 65535);
        else if (strncmp(line, "@addr=", 6) == 0)
            opt->master_addr = line + 6;
        else if (strcmp(line, "@share") == 0)
            opt->share_gpus = 1;
        else if (n < FUZZ_MAX_VARS)
            envp[n++] = line;
    }
    envp[n] = NULL;
}

static void check_layout(const struct launch_layout *l)
{
    int ok = l->world_size > 0 && l->rank >= 0 && l->rank < l->world_size && l->local_world_size > 0 &&
             l->local_rank >= 0 && l->local_rank < l->local_world_size &&
             l->local_world_size <= l->world_size && l->n_nodes > 0 && l->node_rank >= 0 &&
             l->node_rank < l->n_nodes && l->master_port >= 0 && l->master_port <= 65535 &&
             l->master_addr[0] != '\0';
    if (!ok)
        abort();
}

/* What ddp-launch does next with the environment: its GPU list and this rank's device. */
static void map_gpus(char *const *envp, const struct launch_options *opt, const struct launch_layout *l)
{
    const char *cvd = launch_env_get(envp, "CUDA_VISIBLE_DEVICES");
    char err[LAUNCH_ERRMSG_LEN] = "";
    struct launch_gpu_list *gpus = calloc(1, sizeof *gpus);
    struct launch_gpu_choice *choice = calloc(1, sizeof *choice);
    if (gpus && choice && cvd) {
        if (launch_gpu_list_parse(cvd, gpus, err, sizeof err) == 0) {
            if (gpus->n < 0 || gpus->n > LAUNCH_MAX_GPUS)
                abort();
            int narrowed = launch_gpus_narrowed(envp);
            if (launch_gpu_map(gpus, narrowed, l->local_rank, l->local_world_size, opt->share_gpus, choice, err,
                               sizeof err) == 0 && (choice->device < -1 || choice->device >= gpus->n))
                abort();
        } else if (err[0] == '\0') {
            abort();
        }
    }
    free(gpus);
    free(choice);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), *envp[FUZZ_MAX_VARS + 1], err[LAUNCH_ERRMSG_LEN] = "";
    struct launch_options opt;
    struct launch_layout layout;
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    split_input(text, envp, &opt);
    if (launch_layout_detect(envp, &opt, &layout, err, sizeof err) == 0) {
        check_layout(&layout);
        map_gpus(envp, &opt, &layout);
    } else if (err[0] == '\0') {
        abort();
    }
    free(text);
    return 0;
}
