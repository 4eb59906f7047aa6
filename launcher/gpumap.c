/* gpumap.c - GPU discovery without linking CUDA (libcuda loaded with dlopen) and the mapping of
 * local ranks to devices, honouring a CUDA_VISIBLE_DEVICES that Slurm has narrowed. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int launch_gpu_list_parse(const char *spec, struct launch_gpu_list *out, char *err, size_t errlen)
{
    const char *p = spec ? spec : "";
    memset(out, 0, sizeof *out);
    if (strcmp(p, "-1") == 0 || strcmp(p, "none") == 0 || strcmp(p, "NoDevFiles") == 0)
        return 0;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= LAUNCH_GPU_ID_LEN || out->n == LAUNCH_MAX_GPUS) {
            set_err(err, errlen, "CUDA_VISIBLE_DEVICES='%s': empty, too long or more than %d entries", spec, LAUNCH_MAX_GPUS);
            return -1;
        }
        memcpy(out->id[out->n++], p, len);
        p += len + (p[len] == ',');
    }
    return 0;
}

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_get_fn)(int *, int);
typedef int (*cu_busid_fn)(char *, int, int);

/* Asks the CUDA driver how many devices it sees and their PCI bus ids; 0 without a driver. */
static int driver_devices(char busid[][32], int max)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int count = 0;
    if (!lib)
        return 0;
    cu_init_fn init = (cu_init_fn)(size_t)dlsym(lib, "cuInit");
    cu_count_fn get_count = (cu_count_fn)(size_t)dlsym(lib, "cuDeviceGetCount");
    cu_get_fn get = (cu_get_fn)(size_t)dlsym(lib, "cuDeviceGet");
    cu_busid_fn get_busid = (cu_busid_fn)(size_t)dlsym(lib, "cuDeviceGetPCIBusId");
    if (!init || !get_count || init(0) != 0 || get_count(&count) != 0)
        count = 0;
    count = count < max ? count : max;
    for (int i = 0; i < count && get && get_busid; i++) {
        int dev;
        if (get(&dev, i) != 0 || get_busid(busid[i], 32, dev) != 0)
            busid[i][0] = '\0';
    }
    dlclose(lib);
    return count;
}

int launch_gpu_discover(char *const *envp, struct launch_gpu_list *out, char *err, size_t errlen)
{
    const char *visible = launch_env_get(envp, "CUDA_VISIBLE_DEVICES");
    const char *simulate = launch_env_get(envp, "DDP_SIMULATE_GPUS");
    char busid[LAUNCH_MAX_GPUS][32] = {{0}};
    int count;
    if (simulate) {
        char *end;
        long n = strtol(simulate, &end, 10);
        if (*end || n < 0 || n > LAUNCH_MAX_GPUS) {
            set_err(err, errlen, "DDP_SIMULATE_GPUS='%s' is not a number of GPUs (0..%d)", simulate, LAUNCH_MAX_GPUS);
            return -1;
        }
        count = (int)n;
    } else {
        count = driver_devices(busid, LAUNCH_MAX_GPUS);
    }
    if (visible) {
        if (launch_gpu_list_parse(visible, out, err, errlen) != 0)
            return -1;
    } else {
        memset(out, 0, sizeof *out);
        for (out->n = 0; out->n < count; out->n++)
            snprintf(out->id[out->n], LAUNCH_GPU_ID_LEN, "%d", out->n);
    }
    out->n = out->n < count ? out->n : count;
    for (int i = 0; i < out->n; i++)
        memcpy(out->busid[i], busid[i], sizeof busid[i]);
    return 0;
}

/* True when a --gpu-bind value gives each task its own GPUs: not "none", and not "closest",
 * which gives every task on a socket the same list. */
static int bind_narrows(const char *bind)
{
    return bind && *bind && !strstr(bind, "none") && !strstr(bind, "closest");
}

int launch_gpus_narrowed(char *const *envp)
{
    /* slurmd's record of the step's binding ("gpu:per_task:1", "gpu:map_gpu:1,0", "gpu:none"); a
     * task started by srun alone has it but not SLURM_GPUS_PER_TASK, which comes from sbatch. */
    const char *tres = launch_env_get(envp, "SLURMD_TRES_BIND");
    if (tres && strncmp(tres, "gpu:", 4) == 0)
        return bind_narrows(tres + 4);
    return launch_env_get(envp, "SLURM_GPUS_PER_TASK") != NULL || bind_narrows(launch_env_get(envp, "SLURM_GPU_BIND"));
}

/* Writes the ids of LIST joined by commas into OUT (the value for CUDA_VISIBLE_DEVICES). */
static void join_ids(const struct launch_gpu_list *list, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < list->n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? "," : "", list->id[i]);
}

int launch_gpu_map(const struct launch_gpu_list *visible, int narrowed, int local_rank, int local_size,
                   int share, struct launch_gpu_choice *out, char *err, size_t errlen)
{
    int n = visible->n;
    memset(out, 0, sizeof *out);
    out->device = -1;
    out->n_sharing = 1;
    if (n == 0)
        return 0;
    join_ids(visible, out->visible, sizeof out->visible);
    if (narrowed) {
        out->device = 0;
        return 0;
    }
    if (local_size > n && !share) {
        set_err(err, errlen, "%d ranks on this node but only %d GPU%s visible (CUDA_VISIBLE_DEVICES=%s): start at most "
                "%d tasks per node (srun --ntasks-per-node=%d), or pass --share-gpus to let ranks share GPUs",
                local_size, n, n == 1 ? "" : "s", out->visible, n, n);
        return -1;
    }
    out->device = local_rank % n;
    out->share_index = local_rank / n;
    out->n_sharing = (local_size - out->device + n - 1) / n;
    return 0;
}
