/* device.c - libddp's host-memory device operations (staging is a plain copy), the count of usable GPUs, and, in a build
 * without CUDA, the CUDA entry points of device.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"

#if HAVE_CUDA
#include <cuda_runtime.h>

int cuda_probe(char *why, size_t why_size)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (why_size)
        why[0] = '\0';
    if (err == cudaSuccess)
        return n;
    cudaGetLastError(); /* clears the error so that later calls start clean */
    if (why_size)
        snprintf(why, why_size, "cudaGetDeviceCount failed: %s (%s)%s", cudaGetErrorString(err),
                 cudaGetErrorName(err),
                 err == cudaErrorInsufficientDriver
                     ? "; the NVIDIA driver is missing or older than this CUDA runtime"
                     : "");
    DDP_DEBUG("no usable CUDA device: %s", cudaGetErrorString(err));
    return 0;
}

int ddp_cuda_device_count(void) { return cuda_probe(NULL, 0); }

ddp_status cuda_bus_id(int device, char *out, int size)
{
    cudaError_t err = cudaDeviceGetPCIBusId(out, size, device);
    if (err == cudaSuccess)
        return DDP_OK;
    DDP_ERROR("cudaDeviceGetPCIBusId(%d): %s", device, cudaGetErrorString(err));
    return DDP_ERR_CUDA;
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

static ddp_status cpu_zero(void *dst, size_t n_bytes)
{
    if (n_bytes && !dst)
        return DDP_ERR_INVALID_ARG;
    if (n_bytes)
        memset(dst, 0, n_bytes);
    return DDP_OK;
}

static ddp_status cpu_scale(float *x, size_t n, float alpha)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
    return DDP_OK;
}

/* Staging on the host is the copy itself: the batch is in place when the call returns. */
static ddp_status cpu_stage_upload(int slot, int part, void *dst, const void *src_host,
                                   size_t n_bytes)
{
    (void)slot, (void)part;
    return cpu_copy(dst, src_host, n_bytes);
}

static ddp_status cpu_stage_mark(int slot)
{
    (void)slot;
    return DDP_OK;
}

static const device_ops cpu_device = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .scale = cpu_scale,
    .stage_upload = cpu_stage_upload,
    .stage_acquire = cpu_stage_mark,
    .stage_release = cpu_stage_mark,
    .snapshot_copy = cpu_copy,
};

const device_ops *device_ops_cpu(void) { return &cpu_device; }

#if !HAVE_CUDA

const device_ops *device_ops_cuda(void) { return NULL; }

int ddp_cuda_device_count(void) { return 0; }

ddp_status cuda_device_open(int device)
{
    DDP_ERROR("CUDA device %d requested, but this build has no CUDA backend", device);
    return DDP_ERR_UNSUPPORTED;
}

void cuda_device_close(void) {}

void *cuda_stream(void) { return NULL; }

void cuda_track_stream(void *stream, int on)
{
    (void)stream;
    (void)on;
}

void cuda_free_drained(void *p, const char *what, int wait)
{
    (void)p;
    (void)what;
    (void)wait;
}

int cuda_probe(char *why, size_t why_size)
{
    if (why_size)
        snprintf(why, why_size, "this libddp was built without CUDA");
    return 0;
}

ddp_status cuda_bus_id(int device, char *out, int size)
{
    (void)device, (void)out, (void)size;
    return DDP_ERR_UNSUPPORTED;
}

ddp_status cuda_join(void *first, void *then)
{
    (void)first, (void)then;
    return DDP_ERR_UNSUPPORTED;
}

ddp_status cuda_stream_wait(void *stream, const char *what)
{
    (void)stream, (void)what;
    return DDP_ERR_UNSUPPORTED;
}

#endif
