/* fake_queue_cuda.c - the fake NCCL's stream: the CUDA runtime's. Staging is pinned host memory
 * (cudaHostAlloc), copies are cudaMemcpyAsync on the caller's stream, and the MPI work runs in a
 * host function (cudaLaunchHostFunc), which CUDA runs on a thread of its own once the work queued
 * before it on that stream has finished; the host function calls no CUDA API (the runtime API
 * forbids it there). */
#include <stdio.h>

#include <cuda_runtime.h>

#include "fake_queue.h"

static int fail(cudaError_t err, const char *what, char *why)
{
    snprintf(why, 128, "%s: %s", what, cudaGetErrorString(err));
    return -1;
}

void *fake_queue_alloc(size_t n_bytes, char *why)
{
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, n_bytes ? n_bytes : 1, cudaHostAllocPortable);
    if (err != cudaSuccess) {
        fail(err, "cudaHostAlloc of the staging buffer", why);
        return NULL;
    }
    return p;
}

void fake_queue_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

int fake_queue_copy(void *dst, const void *src, size_t n_bytes, cudaStream_t stream, char *why)
{
    if (!n_bytes)
        return 0;
    cudaError_t err = cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDefault, stream);
    return err == cudaSuccess ? 0 : fail(err, "cudaMemcpyAsync", why);
}

int fake_queue_host_fn(void (*fn)(void *), void *arg, cudaStream_t stream, char *why)
{
    cudaError_t err = cudaLaunchHostFunc(stream, fn, arg);
    return err == cudaSuccess ? 0 : fail(err, "cudaLaunchHostFunc", why);
}

int fake_queue_device(void)
{
    int device = 0;
    return cudaGetDevice(&device) == cudaSuccess ? device : 0;
}

int fake_queue_check_pointer(const void *p, const char *name, char *why)
{
    struct cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, p);
    if (err != cudaSuccess)
        return fail(err, name, why);
    if (attr.type == cudaMemoryTypeUnregistered || !attr.devicePointer) {
        snprintf(why, 128, "%s %p is pageable host memory, which the GPU cannot reach", name, p);
        return -1;
    }
    if (attr.type == cudaMemoryTypeDevice && attr.device != fake_queue_device()) {
        snprintf(why, 128, "%s %p is on device %d, not the communicator's", name, p, attr.device);
        return -1;
    }
    return 0;
}
