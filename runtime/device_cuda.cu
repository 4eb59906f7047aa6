/* device_cuda.cu - libddp's device-memory operations on CUDA: allocation, copies and the scale
 * kernel the reducer's averaging needs, all on the one stream that ddp_cuda_device_open() creates
 * (the stream NCCL orders its collectives against). The compute kernels live in models/ops/.
 */
#include <cuda_runtime.h>

#include <string.h>

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

/* ---- uploads through pinned staging: no host wait per upload ----------------------------------
 * An upload copies the caller's (pageable) buffer into one of two pinned staging buffers, queues
 * the copy to the device and returns: the caller may reuse its buffer at once, and the host does
 * not wait for the device. A staging buffer is reused only after the copy that last read it has
 * completed (its event, waited for under the deadline). Larger uploads go directly and wait. */
static const size_t ddp_stage_max = (size_t)64 << 20;

typedef struct ddp_stage {
    void *host;         // (n_bytes) pinned
    size_t n_bytes;
    cudaEvent_t done;   // recorded after the copy that reads host
    bool busy;          // done not yet waited for
} ddp_stage;

static ddp_stage ddp_stages[2];
static int ddp_stage_next;

/* Waits until s is free and holds at least n bytes. */
static ddp_status ddp_stage_reserve(ddp_stage *s, size_t n)
{
    if (s->busy) {
        ddp_status st = ddp_cuda_event_wait(s->done, "upload staging");
        if (st != DDP_OK)
            return st;
        s->busy = false;
    }
    if (!s->done)
        DDP_DEV_TRY(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
    if (n <= s->n_bytes)
        return DDP_OK;
    if (s->host)
        cudaFreeHost(s->host);
    s->host = NULL;
    s->n_bytes = 0;
    DDP_DEV_TRY(cudaHostAlloc(&s->host, n, cudaHostAllocDefault));
    s->n_bytes = n;
    return DDP_OK;
}

static void ddp_stages_release(void)
{
    for (ddp_stage &s : ddp_stages) {
        if (s.host)
            cudaFreeHost(s.host);
        if (s.done)
            cudaEventDestroy(s.done);
        s = ddp_stage{};
    }
}

static ddp_status dev_upload(void *dst, const void *src_host, size_t n_bytes)
{
    if (n_bytes > ddp_stage_max) {
        DDP_DEV_TRY(cudaMemcpyAsync(dst, src_host, n_bytes, cudaMemcpyHostToDevice,
                                    ddp_dev_stream));
        return ddp_cuda_stream_wait(ddp_dev_stream, "upload");
    }
    if (n_bytes == 0)
        return DDP_OK;
    ddp_stage *s = &ddp_stages[ddp_stage_next];
    ddp_stage_next ^= 1;
    ddp_status st = ddp_stage_reserve(s, n_bytes);
    if (st != DDP_OK)
        return st;
    memcpy(s->host, src_host, n_bytes);
    DDP_DEV_TRY(cudaMemcpyAsync(dst, s->host, n_bytes, cudaMemcpyHostToDevice, ddp_dev_stream));
    DDP_DEV_TRY(cudaEventRecord(s->done, ddp_dev_stream));
    s->busy = true;
    return DDP_OK;
}

static ddp_status dev_download(void *dst_host, const void *src, size_t n_bytes)
{
    DDP_DEV_TRY(cudaMemcpyAsync(dst_host, src, n_bytes, cudaMemcpyDeviceToHost, ddp_dev_stream));
    return ddp_cuda_stream_wait(ddp_dev_stream, "download");
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
        ddp_cuda_stream_wait(ddp_dev_stream, "closing the device");
        ddp_stages_release();
        cudaStreamDestroy(ddp_dev_stream);
    }
    ddp_dev_stream = NULL;
    ddp_dev_open = -1;
}

extern "C" void *ddp_cuda_stream(void) { return (void *)ddp_dev_stream; }
