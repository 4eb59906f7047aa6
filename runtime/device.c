/* device.c - libddp's host-memory device operations, the count of usable GPUs, and, in a build
 * without CUDA, the CUDA entry points of device.h.
 */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"

#if HAVE_CUDA
#include <cuda_runtime.h>

int ddp_cuda_device_count(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clears the error so that later calls start clean */
        DDP_DEBUG("no usable CUDA device: %s", cudaGetErrorString(err));
        return 0;
    }
    return n;
}
#endif

static void *cpu_alloc(size_t n_bytes) { return calloc(n_bytes ? n_bytes : 1, 1); }

static void cpu_free(void *p) { free(p); }

static ddp_status cpu_copy(void *dst, const void *src, size_t n_bytes)
{
    if (n_bytes && (!dst || !src))
        return DDP_ERR_INVALID_ARG;
    if (n_bytes)
        memmove(dst, src, n_bytes);
    return DDP_OK;
}

static ddp_status cpu_scale(float *x, size_t n, float alpha)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
    return DDP_OK;
}

static const ddp_device_ops cpu_device = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .scale = cpu_scale,
};

const ddp_device_ops *ddp_device_cpu(void) { return &cpu_device; }

#if !HAVE_CUDA

const ddp_device_ops *ddp_device_cuda(void) { return NULL; }

int ddp_cuda_device_count(void) { return 0; }

ddp_status ddp_cuda_device_open(int device)
{
    DDP_ERROR("CUDA device %d requested, but this build has no CUDA backend", device);
    return DDP_ERR_UNSUPPORTED;
}

void ddp_cuda_device_close(void) {}

void *ddp_cuda_stream(void) { return NULL; }

#endif
