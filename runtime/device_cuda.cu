/* device_cuda.cu - libddp's device-memory operations on CUDA: allocation (zeroed before it
 * returns), transfers through pinned bounce buffers, copies, and the scale kernel the reducer's
 * averaging needs, all on the one stream that cuda_device_open() creates (the stream NCCL
 * orders its collectives against); and the double-buffered pinned staging of training batches on
 * a copy stream beside it; the checkpoint snapshots' downloads into page-locked memory on a third
 * (ddp_checkpoint.h). Every host wait polls under the deadline (cuda_wait.c): none blocks in
 * cudaStreamSynchronize, nor in a copy from or to pageable memory (which may wait for the
 * stream). The compute kernels live in models/ops/.
 */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <string.h>

#include "config.h"
extern "C" {
#include "internal.h"
#include "try.h"
}

static cudaStream_t dev_stream;  // libddp's stream: allocation, transfers, collectives
static cudaStream_t copy_stream; // the batch staging's uploads
static cudaStream_t snap_stream; // the checkpoint snapshots' downloads
static int dev_open = -1;

/* ================================================================================ kernels == */

__global__ void scale_kernel(float *x, size_t n, float alpha)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= alpha;
}

/* ============================================================================== launchers == */

/* ---- pinned host buffers: the one staging mechanism ---------------------------------------------
 * A pinned buffer is refilled only after the copy that last read or wrote it has completed (its
 * event, waited for under the deadline), and grows on demand. The transfers of ddp_upload and
 * ddp_download bounce through two of them; the batch staging has one per slot and part. */
typedef struct pinned {
    void *host;       // (n_bytes) cudaHostAlloc'd
    size_t n_bytes;
    cudaEvent_t done; // recorded after the copy that last used host
    bool busy;        // done recorded and not yet waited for
} pinned;

static ddp_status dev_wait_streams(const char *what);

/* Waits until b is free and holds at least n bytes. */
static ddp_status pinned_reserve(pinned *b, size_t n, const char *what)
{
    if (b->busy) {
        ddp_status st = cuda_event_wait(b->done, what);
        if (st != DDP_OK)
            return st;
        b->busy = false;
    }
    if (!b->done)
        TRY_CUDA(cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming));
    if (n <= b->n_bytes)
        return DDP_OK;
    void *old = b->host; /* forgotten first: never freed twice */
    size_t old_n = b->n_bytes;
    b->host = NULL;
    b->n_bytes = 0;
    if (old) { /* cudaFreeHost waits for the whole device: drain it under the deadline first */
        ddp_status st = dev_wait_streams(what);
        if (st != DDP_OK) {
            DDP_ERROR("%s: a %zu-byte pinned buffer left allocated: the GPU did not drain", what,
                      old_n);
            return st;
        }
        TRY_CUDA(cudaFreeHost(old));
    }
    TRY_CUDA(cudaHostAlloc(&b->host, n, cudaHostAllocDefault));
    b->n_bytes = n;
    return DDP_OK;
}

/* Marks b as in use by the work queued so far on stream. */
static ddp_status pinned_record(pinned *b, cudaStream_t stream)
{
    TRY_CUDA(cudaEventRecord(b->done, stream));
    b->busy = true;
    return DDP_OK;
}

static void pinned_release(pinned *b)
{
    if (b->host)
        cudaFreeHost(b->host);
    if (b->done)
        cudaEventDestroy(b->done);
    *b = pinned{};
}

/* ---- allocation and transfers on libddp's stream ------------------------------------------- */

/* Transfers larger than this go in pieces of this size, alternating the two bounce buffers. */
static const size_t bounce_max = (size_t)16 << 20;
static pinned bounce[2];
static int bounce_next;

static pinned *bounce_take(void)
{
    pinned *b = &bounce[bounce_next];
    bounce_next ^= 1;
    return b;
}

/* Streams of other files (cuda_track_stream: the NCCL communicator's), drained with ours. */
enum { tracked_max = 4 };
static void *tracked[tracked_max];
static pthread_mutex_t tracked_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" void cuda_track_stream(void *stream, int on)
{
    pthread_mutex_lock(&tracked_lock);
    for (int i = 0; i < tracked_max; i++)
        if (tracked[i] == (on ? NULL : stream)) {
            tracked[i] = on ? stream : NULL;
            break;
        }
    pthread_mutex_unlock(&tracked_lock);
}

/* libddp's stream, the copy stream, the snapshots' stream and the tracked ones (NULL where
 * absent): what may still read or write device memory, and what a device-wide synchronisation
 * would wait for. */
enum { streams_max = 3 + tracked_max };
static void all_streams(void *all[streams_max])
{
    all[0] = dev_stream;
    all[1] = copy_stream;
    all[2] = snap_stream;
    pthread_mutex_lock(&tracked_lock);
    memcpy(all + 3, tracked, sizeof tracked);
    pthread_mutex_unlock(&tracked_lock);
}

/* Waits for all_streams under the deadline: call it first, so that cudaFree, cudaFreeHost and
 * cudaHostUnregister find the device idle. */
static ddp_status dev_wait_streams(const char *what)
{
    void *all[streams_max];
    all_streams(all);
    ddp_status st = DDP_OK;
    for (int i = 0; st == DDP_OK && i < streams_max; i++)
        if (all[i])
            st = cuda_stream_wait(all[i], what);
    return st;
}

/* Zeroed, and the zeroing complete before it returns: ordered with every stream. After a failed
 * wait the memory is left allocated (freeing it would wait for the stuck GPU). */
static void *dev_alloc(size_t n_bytes)
{
    void *p = NULL;
    size_t n = n_bytes ? n_bytes : 1;
    cudaError_t err = cudaMalloc(&p, n);
    if (err != cudaSuccess) {
        (void)check_cuda_fail(err, "cudaMalloc", __FILE__, __LINE__);
        return NULL;
    }
    err = cudaMemsetAsync(p, 0, n, dev_stream);
    if (err != cudaSuccess) {
        (void)check_cuda_fail(err, "cudaMemsetAsync", __FILE__, __LINE__);
        cudaFree(p);
        return NULL;
    }
    if (cuda_stream_wait(dev_stream, "zeroing new device memory") == DDP_OK)
        return p;
    DDP_ERROR("ddp_alloc: %zu bytes left allocated: the GPU did not finish zeroing them", n);
    return NULL;
}

/* Whether every stream of all_streams is idle now (no wait). */
static bool dev_streams_idle(void)
{
    void *all[streams_max];
    all_streams(all);
    for (void *s : all)
        if (s && cudaStreamQuery((cudaStream_t)s) != cudaSuccess)
            return false;
    return true;
}

/* Frees after the queued work of every stream (cudaFree waits for the whole device); otherwise p
 * is left allocated. */
extern "C" void cuda_free_drained(void *p, const char *what, int wait)
{
    if (!p)
        return;
    if (wait ? dev_wait_streams(what) != DDP_OK : !dev_streams_idle()) {
        DDP_ERROR("%s: device memory left allocated: the GPU work using it did not finish", what);
        return;
    }
    cudaError_t err = cudaFree(p);
    if (err != cudaSuccess)
        (void)check_cuda_fail(err, "cudaFree", __FILE__, __LINE__);
}

static void dev_free(void *p) { cuda_free_drained(p, "ddp_free", 1); }

/* Copies into a bounce buffer and queues its upload: the caller may reuse src_host at once, and
 * the host waits only for a bounce buffer whose previous transfer is still running. */
static ddp_status dev_upload(void *dst, const void *src_host, size_t n_bytes)
{
    for (size_t done = 0; done < n_bytes;) {
        size_t n = n_bytes - done < bounce_max ? n_bytes - done : bounce_max;
        pinned *b = bounce_take();
        ddp_status st = pinned_reserve(b, n, "upload staging");
        if (st != DDP_OK)
            return st;
        memcpy(b->host, (const char *)src_host + done, n);
        TRY_CUDA(cudaMemcpyAsync((char *)dst + done, b->host, n, cudaMemcpyHostToDevice,
                                 dev_stream));
        TRY_OK(pinned_record(b, dev_stream));
        done += n;
    }
    return DDP_OK;
}

/* Queues each piece into a bounce buffer, waits for it under the deadline, copies it out. */
static ddp_status dev_download(void *dst_host, const void *src, size_t n_bytes)
{
    for (size_t done = 0; done < n_bytes;) {
        size_t n = n_bytes - done < bounce_max ? n_bytes - done : bounce_max;
        pinned *b = bounce_take();
        ddp_status st = pinned_reserve(b, n, "download staging");
        if (st != DDP_OK)
            return st;
        TRY_CUDA(cudaMemcpyAsync(b->host, (const char *)src + done, n, cudaMemcpyDeviceToHost,
                                 dev_stream));
        TRY_OK(pinned_record(b, dev_stream));
        st = cuda_event_wait(b->done, "download");
        if (st != DDP_OK)
            return st;
        b->busy = false;
        memcpy((char *)dst_host + done, b->host, n);
        done += n;
    }
    return DDP_OK;
}

static ddp_status dev_copy(void *dst, const void *src, size_t n_bytes)
{
    if (n_bytes)
        TRY_CUDA(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, dev_stream));
    return DDP_OK;
}

static ddp_status dev_zero(void *dst, size_t n_bytes)
{
    if (n_bytes)
        TRY_CUDA(cudaMemsetAsync(dst, 0, n_bytes, dev_stream));
    return DDP_OK;
}

static ddp_status dev_scale(float *x, size_t n, float alpha)
{
    const unsigned block = 256;
    if (n == 0)
        return DDP_OK;
    scale_kernel<<<(unsigned)((n + block - 1) / block), block, 0, dev_stream>>>(x, n, alpha);
    TRY_CUDA(cudaGetLastError());
    return DDP_OK;
}

/* ---- double-buffered batch staging on the copy stream ----------------------------------------
 * Slot s's part p is copied into its pinned buffer and uploaded on the copy stream once the
 * compute that last read the slot is done (stage_release recorded it on libddp's stream);
 * stage_acquire makes libddp's stream wait for the slot's uploads. So the upload of batch i+1
 * (slot 1) overlaps the compute of batch i (slot 0). */
typedef struct stage_slot {
    pinned part[2];       // host staging; part[p].done: recorded after part p's upload
    cudaEvent_t released; // recorded on libddp's stream after the slot's last reader
    bool released_set;
} stage_slot;

static stage_slot stage_slots[2];

static ddp_status dev_stage_upload(int slot, int part, void *dst, const void *src_host,
                                   size_t n_bytes)
{
    if (n_bytes == 0)
        return DDP_OK;
    stage_slot *s = &stage_slots[slot];
    pinned *b = &s->part[part];
    ddp_status st = pinned_reserve(b, n_bytes, "batch staging");
    if (st != DDP_OK)
        return st;
    memcpy(b->host, src_host, n_bytes);
    if (s->released_set)
        TRY_CUDA(cudaStreamWaitEvent(copy_stream, s->released, 0));
    TRY_CUDA(cudaMemcpyAsync(dst, b->host, n_bytes, cudaMemcpyHostToDevice, copy_stream));
    return pinned_record(b, copy_stream);
}

static ddp_status dev_stage_acquire(int slot)
{
    for (pinned &b : stage_slots[slot].part) {
        if (b.busy)
            TRY_CUDA(cudaStreamWaitEvent(dev_stream, b.done, 0));
    }
    return DDP_OK;
}

static ddp_status dev_stage_release(int slot)
{
    stage_slot *s = &stage_slots[slot];
    if (!s->released)
        TRY_CUDA(cudaEventCreateWithFlags(&s->released, cudaEventDisableTiming));
    TRY_CUDA(cudaEventRecord(s->released, dev_stream));
    s->released_set = true;
    return DDP_OK;
}

static void staging_release(void)
{
    for (pinned &b : bounce)
        pinned_release(&b);
    for (stage_slot &s : stage_slots) {
        for (pinned &b : s.part)
            pinned_release(&b);
        if (s.released)
            cudaEventDestroy(s.released);
        s = stage_slot{};
    }
    bounce_next = 0;
}

/* ---- snapshots on a side stream (ddp_checkpoint.h) --------------------------------------------
 * Host memory the caller page-locked (cudaHostRegister, at most snap_max regions) receives
 * cudaMemcpyAsync on snap_stream, which first waits for the work queued so far on libddp's stream
 * (snap_ready); snap_done is recorded after the last copy. The fence makes libddp's stream wait for
 * snap_done on the GPU; the wait polls it under the deadline (any thread: the background writer). */
enum { snap_max = 16 };
static struct {
    char *host;
    size_t n_bytes;
} snap_pinned[snap_max];
static cudaEvent_t snap_ready, snap_done;
static bool snap_queued;  // a copy queued since the last fence
static bool snap_started; // snap_done recorded at least once

static ddp_status dev_snapshot_pin(void *host, size_t n_bytes)
{
    int i = 0;
    while (i < snap_max && snap_pinned[i].host)
        i++;
    if (i == snap_max) {
        DDP_ERROR("ddp_snapshot_pin: more than %d regions pinned at once", snap_max);
        return DDP_ERR_INVALID_ARG;
    }
    TRY_CUDA(cudaHostRegister(host, n_bytes, cudaHostRegisterDefault));
    snap_pinned[i].host = (char *)host;
    snap_pinned[i].n_bytes = n_bytes;
    return DDP_OK;
}

static ddp_status dev_snapshot_unpin(void *host)
{
    for (auto &r : snap_pinned)
        if (r.host == host) { /* cudaHostUnregister waits for the whole device: drain it first */
            ddp_status st = dev_wait_streams("unpinning a checkpoint snapshot");
            if (st != DDP_OK)
                return st; /* left pinned */
            r.host = NULL;
            r.n_bytes = 0;
            TRY_CUDA(cudaHostUnregister(host));
            return DDP_OK;
        }
    return DDP_OK; // never pinned (its pinning failed): nothing to undo
}

/* Whether [p, p + n) lies in one pinned region. */
static bool snap_is_pinned(const void *p, size_t n)
{
    const char *c = (const char *)p;
    for (const auto &r : snap_pinned)
        if (r.host && c >= r.host && n <= r.n_bytes && (size_t)(c - r.host) <= r.n_bytes - n)
            return true;
    return false;
}

static ddp_status dev_snapshot_copy(void *dst_host, const void *src, size_t n_bytes)
{
    if (!snap_is_pinned(dst_host, n_bytes))
        return dev_download(dst_host, src, n_bytes);
    if (!snap_ready) {
        TRY_CUDA(cudaEventCreateWithFlags(&snap_ready, cudaEventDisableTiming));
        TRY_CUDA(cudaEventCreateWithFlags(&snap_done, cudaEventDisableTiming));
    }
    TRY_CUDA(cudaEventRecord(snap_ready, dev_stream));
    TRY_CUDA(cudaStreamWaitEvent(snap_stream, snap_ready, 0));
    TRY_CUDA(cudaMemcpyAsync(dst_host, src, n_bytes, cudaMemcpyDeviceToHost, snap_stream));
    TRY_CUDA(cudaEventRecord(snap_done, snap_stream));
    snap_queued = snap_started = true;
    return DDP_OK;
}

static ddp_status dev_snapshot_fence(void)
{
    if (!snap_queued)
        return DDP_OK;
    TRY_CUDA(cudaStreamWaitEvent(dev_stream, snap_done, 0));
    snap_queued = false;
    return DDP_OK;
}

static ddp_status dev_snapshot_wait(void)
{
    if (!snap_started)
        return DDP_OK;
    TRY_CUDA(cudaSetDevice(dev_open)); // this thread may be another than the one that queued
    return cuda_event_wait(snap_done, "checkpoint snapshot");
}

static void snapshot_release(void)
{
    for (auto &r : snap_pinned)
        if (r.host)
            cudaHostUnregister(r.host);
    for (auto &r : snap_pinned)
        r = {};
    if (snap_ready)
        cudaEventDestroy(snap_ready);
    if (snap_done)
        cudaEventDestroy(snap_done);
    snap_ready = snap_done = NULL;
    snap_queued = snap_started = false;
}

static ddp_status dev_info(size_t *used, size_t *total)
{
    size_t free_b = 0, total_b = 0;
    cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
    if (err != cudaSuccess) {
        DDP_ERROR("cudaMemGetInfo: %s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
        return DDP_ERR_CUDA;
    }
    *used = total_b - free_b;
    *total = total_b;
    return DDP_OK;
}

static ddp_status dev_profiler(int start)
{
    cudaError_t err = start ? cudaProfilerStart() : cudaProfilerStop();
    if (err != cudaSuccess) {
        DDP_ERROR("%s: %s (%s)", start ? "cudaProfilerStart" : "cudaProfilerStop",
                  cudaGetErrorString(err), cudaGetErrorName(err));
        return DDP_ERR_CUDA;
    }
    return DDP_OK;
}

/* ==================================================================== table and lifecycle == */

static device_ops make_dev_ops(void)
{
    device_ops ops = {};
    ops.name = "cuda";
    ops.alloc = dev_alloc;
    ops.free = dev_free;
    ops.upload = dev_upload;
    ops.download = dev_download;
    ops.copy = dev_copy;
    ops.zero = dev_zero;
    ops.scale = dev_scale;
    ops.stage_upload = dev_stage_upload;
    ops.stage_acquire = dev_stage_acquire;
    ops.stage_release = dev_stage_release;
    ops.info = dev_info;
    ops.profiler = dev_profiler;
    ops.snapshot_pin = dev_snapshot_pin;
    ops.snapshot_unpin = dev_snapshot_unpin;
    ops.snapshot_copy = dev_snapshot_copy;
    ops.snapshot_fence = dev_snapshot_fence;
    ops.snapshot_wait = dev_snapshot_wait;
    return ops;
}

static const device_ops dev_table = make_dev_ops();

extern "C" const device_ops *device_ops_cuda(void) { return &dev_table; }

extern "C" ddp_status cuda_device_open(int device)
{
    int n = ddp_cuda_device_count();
    if (device < 0 || device >= n) {
        DDP_ERROR("CUDA device %d requested, %d usable here", device, n);
        return DDP_ERR_NO_DEVICE;
    }
    if (dev_open >= 0)
        cuda_device_close();
    TRY_CUDA(cudaSetDevice(device));
    TRY_CUDA(cudaStreamCreateWithFlags(&dev_stream, cudaStreamNonBlocking));
    TRY_CUDA(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
    TRY_CUDA(cudaStreamCreateWithFlags(&snap_stream, cudaStreamNonBlocking));
    dev_open = device;
    return DDP_OK;
}

/* After a failed wait the streams and buffers are left as they are: destroying them would wait
 * for the stuck GPU (the process is ending or the job is being aborted). */
extern "C" void cuda_device_close(void)
{
    if (dev_stream && dev_wait_streams("closing the device") == DDP_OK) {
        staging_release();
        snapshot_release();
        cudaStreamDestroy(dev_stream);
        if (copy_stream)
            cudaStreamDestroy(copy_stream);
        if (snap_stream)
            cudaStreamDestroy(snap_stream);
    }
    dev_stream = NULL;
    copy_stream = NULL;
    snap_stream = NULL;
    dev_open = -1;
}

extern "C" void *cuda_stream(void) { return (void *)dev_stream; }
