/* device.h - the backend memory libddp owns for itself and for the programs and models above it
 * (ddp_alloc and friends, the reducer's buffers, the collectives' arguments): host memory on the
 * CPU, device memory on CUDA, with the transfers, the copy stream and the double-buffered pinned
 * staging of training batches. Every host wait on CUDA goes through cuda_wait.c's deadline.
 *
 * Private to libddp. The compute (GEMM, convolution, ...) lives with the models (models/ops/).
 */
#ifndef DDP_DEVICE_H
#define DDP_DEVICE_H

#include <stddef.h>

#include "ddp.h"

typedef struct device_ops {
    const char *name; /* "cpu" or "cuda" */
    /* zeroed, the zeroing complete (the host waited for it); NULL on failure */
    void *(*alloc)(size_t n_bytes);
    void (*free)(void *p); /* after the queued work that may read p; NULL is ignored */
    ddp_status (*upload)(void *dst, const void *src_host, size_t n_bytes);
    ddp_status (*download)(void *dst_host, const void *src, size_t n_bytes);
    ddp_status (*copy)(void *dst, const void *src, size_t n_bytes); /* queued, no host wait */
    ddp_status (*zero)(void *dst, size_t n_bytes);                  /* queued, no host wait */
    ddp_status (*scale)(float *x, size_t n, float alpha);           /* x *= alpha */
    /* the double-buffered staging of ddp.h's ddp_stage_* (slot and part already checked) */
    ddp_status (*stage_upload)(int slot, int part, void *dst, const void *src_host, size_t n_bytes);
    ddp_status (*stage_acquire)(int slot);
    ddp_status (*stage_release)(int slot);
    /* the device's memory in use and its size (ddp_memory_info); NULL on the CPU */
    ddp_status (*info)(size_t *used, size_t *total);
    /* cudaProfilerStart (start != 0) or cudaProfilerStop (ddp_profiler_range); NULL on the CPU */
    ddp_status (*profiler)(int start);
    /* ddp_checkpoint.h's snapshots: a copy to the host on a side stream; the others NULL on the CPU
     * (pinning, the fence and the wait have nothing to do where the copy is a memcpy) */
    ddp_status (*snapshot_pin)(void *host, size_t n_bytes);
    ddp_status (*snapshot_unpin)(void *host);
    ddp_status (*snapshot_copy)(void *dst_host, const void *src, size_t n_bytes);
    ddp_status (*snapshot_fence)(void);
    ddp_status (*snapshot_wait)(void);
} device_ops;

/* Host memory (always built). */
const device_ops *device_ops_cpu(void);
/* Device memory on the streams of cuda_device_open(), or NULL in a build without CUDA. */
const device_ops *device_ops_cuda(void);
/* Makes `device` current for this thread and creates the stream every operation of libddp is
 * ordered on, and the copy stream of the batch staging. DDP_ERR_CUDA on failure;
 * DDP_ERR_UNSUPPORTED without a CUDA build. */
ddp_status cuda_device_open(int device);
/* Waits (under the deadline) for both streams, then releases them and the staging. */
void cuda_device_close(void);
/* The stream of cuda_device_open() (a cudaStream_t); NULL before it or without CUDA. */
void *cuda_stream(void);
/* Adds (on != 0) or removes a stream created outside device_cuda.cu (the NCCL communicator's)
 * to those drained, under the deadline, before a call that waits for the whole device: cudaFree,
 * cudaFreeHost and cudaHostUnregister never block on a stuck collective, they are skipped (the
 * memory left allocated, logged) when the drain times out. At most 4; nothing without CUDA. */
void cuda_track_stream(void *stream, int on);
/* cudaFree(p) once every stream (libddp's and the tracked ones) has drained: waited for under the
 * deadline (wait != 0), or found idle now (wait 0: teardown after a failure, which must not
 * spend another deadline); otherwise p is left allocated (logged with `what`). NULL: nothing. */
void cuda_free_drained(void *p, const char *what, int wait);

#endif /* DDP_DEVICE_H */
