/* test_reducer_kernels.cu - a slow kernel for test_reducer_stream.c: it holds its stream for a
 * given time (the GPU's global nanosecond timer), then adds a value to a buffer, as a backward
 * pass still computing the gradients the host has already marked ready.
 *
 * Two sections: kernels, then launchers (each on an explicit stream, ending with an error check).
 */
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

/* ---- kernels ------------------------------------------------------------------------------- */

static __device__ uint64_t spin_now_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Every thread waits until ns nanoseconds after it started, then x[i] += v over a grid-stride
 * loop (n may be 0: a pure wait). */
__global__ void spin_add_kernel(float *x, size_t n, float v, uint64_t ns)
{
    uint64_t t0 = spin_now_ns();
    while (spin_now_ns() - t0 < ns)
        ;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += v;
}

/* ---- launchers ----------------------------------------------------------------------------- */

/* Queues the spin (ms milliseconds) and the addition on the cudaStream_t `stream`. 0 on success,
 * -1 when the launch fails. Few blocks, all resident at once, so the wait is ms, not a multiple. */
extern "C" int test_spin_add(void *stream, float *x, size_t n, float v, double ms)
{
    size_t blocks = (n + 255) / 256;
    blocks = blocks < 1 ? 1 : blocks > 32 ? 32 : blocks;
    spin_add_kernel<<<(unsigned int)blocks, 256, 0, (cudaStream_t)stream>>>(x, n, v,
                                                                            (uint64_t)(ms * 1e6));
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
