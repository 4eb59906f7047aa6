/* device_cuda.cu - libddp's device-memory operations on CUDA: allocation, copies and the scale
 * kernel the reducer's averaging needs, all on the one stream that ddp_cuda_device_open() creates
 * (the stream NCCL orders its collectives against). The compute kernels live in models/ops/.
 */
#include <cuda_runtime.h>

#include "config.h"
extern "C" {
#include "internal.h"
}

static cudaStream_t ddp_dev_stream;
static int ddp_dev_open = -1;

static ddp_status ddp_dev_fail(cudaError_t err, const char *what, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s: %s (%s)", what, cudaGetErrorString(err),
                  cudaGetErrorName(err));
    return DDP_ERR_CUDA;
}

#define DDP_DEV_TRY(call)                                                       \
    do {                                                                        \
        cudaError_t ddp_err_ = (call);                                          \
        if (ddp_err_ != cudaSuccess)                                            \
            return ddp_dev_fail(ddp_err_, #call, __FILE__, __LINE__);           \
    } while (0)

/* ================================================================================ kernels == */

__global__ void ddp_dev_scale_kernel(float *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= alpha;
}

/* ============================================================================== launchers == */

static void *dev_alloc(size_t n_bytes)
{
    void *p = NULL;
    size_t n = n_bytes ? n_bytes : 1;
    cudaError_t err = cudaMalloc(&p, n);
    if (err != cudaSuccess) {
        ddp_dev_fail(err, "cudaMalloc", __FILE__, __LINE__);
        return NULL;
    }
    err = cudaMemsetAsync(p, 0, n, ddp_dev_stream);
    if (err == cudaSuccess)
        return p;
    ddp_dev_fail(err, "cudaMemsetAsync", __FILE__, __LINE__);
    cudaFree(p);
    return NULL;
}

static void dev_free(void *p)
{
    if (!p)
        return;
    cudaStreamSynchronize(ddp_dev_stream);
    cudaFree(p);
}

static ddp_status dev_upload(void *dst, const void *src_host, size_t n_bytes)
{
    DDP_DEV_TRY(cudaMemcpyAsync(dst, src_host, n_bytes, cudaMemcpyHostToDevice, ddp_dev_stream));
    DDP_DEV_TRY(cudaStreamSynchronize(ddp_dev_stream));
    return DDP_OK;
}

static ddp_status dev_download(void *dst_host, const void *src, size_t n_bytes)
{
    DDP_DEV_TRY(cudaMemcpyAsync(dst_host, src, n_bytes, cudaMemcpyDeviceToHost, ddp_dev_stream));
    DDP_DEV_TRY(cudaStreamSynchronize(ddp_dev_stream));
    return DDP_OK;
}

static ddp_status dev_scale(float *x, size_t n, float alpha)
{
    const unsigned block = 256;
    if (n == 0)
        return DDP_OK;
    ddp_dev_scale_kernel<<<(unsigned)((n + block - 1) / block), block, 0, ddp_dev_stream>>>(x, n, alpha);
    DDP_DEV_TRY(cudaGetLastError());
    return DDP_OK;
}

/* ==================================================================== table and lifecycle == */

static ddp_device_ops ddp_make_dev_ops(void)
{
    ddp_device_ops ops = {};
    ops.name = "cuda";
    ops.alloc = dev_alloc;
    ops.free = dev_free;
    ops.upload = dev_upload;
    ops.download = dev_download;
    ops.scale = dev_scale;
    return ops;
}

static const ddp_device_ops ddp_dev_table = ddp_make_dev_ops();

extern "C" const ddp_device_ops *ddp_device_cuda(void) { return &ddp_dev_table; }

extern "C" ddp_status ddp_cuda_device_open(int device)
{
    int n = ddp_cuda_device_count();
    if (device < 0 || device >= n) {
        DDP_ERROR("CUDA device %d requested, %d usable here", device, n);
        return DDP_ERR_NO_DEVICE;
    }
    if (ddp_dev_open >= 0)
        ddp_cuda_device_close();
    DDP_DEV_TRY(cudaSetDevice(device));
    DDP_DEV_TRY(cudaStreamCreateWithFlags(&ddp_dev_stream, cudaStreamNonBlocking));
    ddp_dev_open = device;
    return DDP_OK;
}

extern "C" void ddp_cuda_device_close(void)
{
    if (ddp_dev_stream) {
        cudaStreamSynchronize(ddp_dev_stream);
        cudaStreamDestroy(ddp_dev_stream);
    }
    ddp_dev_stream = NULL;
    ddp_dev_open = -1;
}

extern "C" void *ddp_cuda_stream(void) { return (void *)ddp_dev_stream; }
