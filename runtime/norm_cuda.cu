/* norm_cuda.cu - the CUDA sum of squares behind ddp_grad_sumsq / ddp_grad_norm (norm.c): fp64
 * per thread, per block and across blocks, each step in a fixed order, so the result depends only
 * on the element count and the values (the same on every rank and every run).
 *
 * Two sections: kernels, then launchers. The launchers run on the given stream (NULL: the
 * backend's stream) and check every launch; norm_cuda_sumsq waits once on the host for the
 * result, under the deadline (cuda_wait.c), norm_cuda_clip_scale leaves its results on the
 * device (ddp_grad_clip_scale). Type codes are ddp_dtype values: 0 fp32, 1 bf16, 2 fp16.
 */
#include <cuda_runtime.h>

#include <stdint.h>

#include "half.h"
extern "C" {
#include "convert.h"
#include "internal.h"
#include "try.h"
}

#define NORM_BLOCK 256       /* threads per block (a power of two: the tree halves it) */
#define NORM_MAX_BLOCKS 1024 /* partial sums, added by one block of NORM_MAX_BLOCKS threads */

/* ---- kernels ------------------------------------------------------------------------------- */

static __device__ double norm_load(const void *x, int t, size_t i)
{
    if (t == 0)
        return (double)((const float *)x)[i];
    return (double)half_decode(((const uint16_t *)x)[i], t == 2);
}

/* Adds the block's values s[0..width) into s[0] by halving (a fixed tree); width a power of 2. */
static __device__ void norm_block_tree(double *s, unsigned int width)
{
    for (unsigned int w = width / 2; w > 0; w /= 2) {
        __syncthreads();
        if (threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
    }
}

/* partial[b] = the sum of squares of the elements block b's threads visit (grid-stride). */
__global__ void sumsq_partial_kernel(const void *x, int t, size_t n, double *partial)
{
    __shared__ double s[NORM_BLOCK];
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = norm_load(x, t, i);
        acc += v * v;
    }
    s[threadIdx.x] = acc;
    norm_block_tree(s, NORM_BLOCK);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s[0];
}

/* *out = partial[0] + ... + partial[n_partial - 1] in a fixed tree; one block of
 * NORM_MAX_BLOCKS threads, n_partial <= NORM_MAX_BLOCKS. */
__global__ void sumsq_final_kernel(const double *partial, unsigned int n_partial, double *out)
{
    __shared__ double s[NORM_MAX_BLOCKS];
    s[threadIdx.x] = threadIdx.x < n_partial ? partial[threadIdx.x] : 0.0;
    norm_block_tree(s, NORM_MAX_BLOCKS);
    if (threadIdx.x == 0)
        *out = s[0];
}

/* *norm_out, *scale_out from the sum of squares at *sumsq (norm_clip_scale); one thread. */
__global__ void clip_scale_kernel(const double *sumsq, double max_norm, double *norm_out,
                                  float *scale_out)
{
    norm_clip_scale(*sumsq, max_norm, norm_out, scale_out);
}

/* ---- launchers ----------------------------------------------------------------------------- */

/* Blocks of the partial pass: one per NORM_BLOCK elements, at most NORM_MAX_BLOCKS (grid-stride
 * loops cover the rest); a function of n alone, which fixes the order of the sums. */
static unsigned int norm_grid(size_t n)
{
    size_t blocks = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    return (unsigned int)(blocks < 1 ? 1 : blocks < NORM_MAX_BLOCKS ? blocks : NORM_MAX_BLOCKS);
}

static ddp_status norm_launch(const void *x, int t, size_t n, double *scratch, unsigned int grid,
                              cudaStream_t s)
{
    sumsq_partial_kernel<<<grid, NORM_BLOCK, 0, s>>>(x, t, n, scratch);
    TRY_CUDA_LAUNCH();
    sumsq_final_kernel<<<1, NORM_MAX_BLOCKS, 0, s>>>(scratch, grid, scratch + grid);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* The scratch (grid partial sums and the result) is device memory allocated per call, stream-
 * ordered (once per optimizer step); the host waits for the kernels under the deadline before it
 * copies the one result back, so the copy does not block on the stream (a copy to pageable host
 * memory returns once it is done, as convert_cuda_nonfinite relies on too). */
extern "C" ddp_status norm_cuda_sumsq(const void *x, int t, size_t n, double *out, void *stream)
{
    cudaStream_t s = stream ? (cudaStream_t)stream : (cudaStream_t)cuda_stream();
    unsigned int grid = norm_grid(n);
    double *scratch = NULL, host = 0.0;
    ddp_status st = DDP_OK;
    TRY_CUDA_GOTO(cudaMallocAsync((void **)&scratch, (grid + 1) * sizeof(double), s));
    TRY_OK_GOTO(norm_launch(x, t, n, scratch, grid, s));
    TRY_OK_GOTO(cuda_stream_wait(s, "the gradient norm"));
    TRY_CUDA_GOTO(cudaMemcpyAsync(&host, scratch + grid, sizeof host, cudaMemcpyDeviceToHost, s));
    *out = host;
cleanup:
    if (scratch)
        cudaFreeAsync(scratch, s);
    return st;
}

/* As norm_cuda_sumsq, with the result left on the device for clip_scale_kernel: nothing waits
 * (the scratch is freed in stream order after the kernel). */
extern "C" ddp_status norm_cuda_clip_scale(const void *x, int t, size_t n, double max_norm,
                                           double *norm_out, float *scale_out, void *stream)
{
    cudaStream_t s = stream ? (cudaStream_t)stream : (cudaStream_t)cuda_stream();
    unsigned int grid = norm_grid(n);
    double *scratch = NULL;
    ddp_status st = DDP_OK;
    TRY_CUDA_GOTO(cudaMallocAsync((void **)&scratch, (grid + 1) * sizeof(double), s));
    TRY_OK_GOTO(norm_launch(x, t, n, scratch, grid, s));
    clip_scale_kernel<<<1, 1, 0, s>>>(scratch + grid, max_norm, norm_out, scale_out);
    TRY_CUDA_GOTO(cudaGetLastError());
cleanup:
    if (scratch)
        cudaFreeAsync(scratch, s);
    return st;
}
