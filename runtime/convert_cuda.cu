/* convert_cuda.cu - CUDA twins of convert.c's element-type operations (cast between fp32 and
 * bf16/fp16, scale, add a cast buffer, zero, inf/NaN check) for the reducer and the loss scaler,
 * over half.h.
 *
 * Two sections: kernels, then launchers. Every launcher runs on the given stream (NULL: the
 * backend's stream, cuda_stream()) and ends with a cudaGetLastError check. Type codes are
 * ddp_dtype values: 0 fp32, 1 bf16, 2 fp16.
 */
#include <cuda_runtime.h>

#include <stdint.h>

#include "half.h"
extern "C" {
#include "convert.h"
#include "internal.h"
#include "try.h"
}

/* ---- kernels ------------------------------------------------------------------------------- */

static __device__ float convert_dev_load(const void *x, int t, size_t i)
{
    if (t == 0)
        return ((const float *)x)[i];
    return half_decode(((const uint16_t *)x)[i], t == 2);
}

static __device__ void convert_dev_store(void *x, int t, size_t i, float v)
{
    if (t == 0)
        ((float *)x)[i] = v;
    else
        ((uint16_t *)x)[i] = half_encode(v, t == 2);
}

__global__ void cast_kernel(void *dst, int dst_t, const void *src, int src_t, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        convert_dev_store(dst, dst_t, i, convert_dev_load(src, src_t, i));
}

__global__ void scale_typed_kernel(void *x, int t, size_t n, float alpha)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        convert_dev_store(x, t, i, convert_dev_load(x, t, i) * alpha);
}

/* dst[i] += src[i], added in fp32 and rounded to dst's type. */
__global__ void cast_add_kernel(void *dst, int dst_t, const void *src, int src_t, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        convert_dev_store(dst, dst_t, i,
                          convert_dev_load(dst, dst_t, i) + convert_dev_load(src, src_t, i));
}

/* Sets *flag to 1 when any element is inf or NaN (a benign race: every writer writes 1). */
__global__ void nonfinite_kernel(const void *x, int t, size_t n, unsigned int *flag)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (!half_f32_finite(convert_dev_load(x, t, i)))
            *flag = 1u;
}

/* ---- launchers ----------------------------------------------------------------------------- */

static const int conv_block = 256;

static unsigned int conv_grid(size_t n)
{
    size_t blocks = (n + conv_block - 1) / conv_block;
    return (unsigned int)(blocks < 4096 ? blocks : 4096); /* grid-stride loops cover the rest */
}

static cudaStream_t conv_stream(void *stream)
{
    return stream ? (cudaStream_t)stream : (cudaStream_t)cuda_stream();
}

extern "C" ddp_status convert_cuda_cast(void *dst, int dst_t, const void *src, int src_t, size_t n,
                                        void *stream)
{
    if (n == 0)
        return DDP_OK;
    cast_kernel<<<conv_grid(n), conv_block, 0, conv_stream(stream)>>>(
        dst, dst_t, src, src_t, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

extern "C" ddp_status convert_cuda_scale_typed(void *x, int t, size_t n, float alpha, void *stream)
{
    if (n == 0)
        return DDP_OK;
    scale_typed_kernel<<<conv_grid(n), conv_block, 0, conv_stream(stream)>>>(
        x, t, n, alpha);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

extern "C" ddp_status convert_cuda_cast_add(void *dst, int dst_t, const void *src, int src_t,
                                            size_t n, void *stream)
{
    if (n == 0)
        return DDP_OK;
    cast_add_kernel<<<conv_grid(n), conv_block, 0, conv_stream(stream)>>>(dst, dst_t, src, src_t, n);
    TRY_CUDA_LAUNCH();
    return DDP_OK;
}

/* Stream-ordered, unlike ddp_zero (libddp's stream): the reducer zeroes a recycled bucket buffer
 * on its own stream, after that stream's wait for the buffer's last reduce-scatter. */
extern "C" ddp_status convert_cuda_zero(void *x, size_t n_bytes, void *stream)
{
    if (n_bytes == 0)
        return DDP_OK;
    TRY_CUDA(cudaMemsetAsync(x, 0, n_bytes, conv_stream(stream)));
    return DDP_OK;
}

/* The flag lives in device memory allocated per call (once per optimizer step). The host waits
 * for the check under the deadline (cuda_wait.c) before it reads the flag, so the read does not
 * block on the stream. */
extern "C" ddp_status convert_cuda_nonfinite(const void *x, int t, size_t n, int *found, void *stream)
{
    cudaStream_t s = conv_stream(stream);
    unsigned int *flag = NULL, host = 0;
    ddp_status st = DDP_OK;
    TRY_CUDA_GOTO(cudaMallocAsync((void **)&flag, sizeof *flag, s));
    TRY_CUDA_GOTO(cudaMemsetAsync(flag, 0, sizeof *flag, s));
    if (n > 0) {
        nonfinite_kernel<<<conv_grid(n), conv_block, 0, s>>>(x, t, n, flag);
        TRY_CUDA_GOTO(cudaGetLastError());
    }
    TRY_OK_GOTO(cuda_stream_wait(s, "the inf/NaN check"));
    TRY_CUDA_GOTO(cudaMemcpyAsync(&host, flag, sizeof host, cudaMemcpyDeviceToHost, s));
    *found = host != 0;
cleanup:
    if (flag)
        cudaFreeAsync(flag, s); /* stream-ordered: queued, no host wait */
    return st;
}
