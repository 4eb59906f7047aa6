/* device.h - the few backend-memory operations libddp itself needs (the reducer's buffers, the
 * collectives' arguments, ddp_alloc and friends): host memory on the CPU, device memory on CUDA.
 *
 * Private to libddp. The compute (GEMM, convolution, ...) lives with the models (models/ops/).
 */
#ifndef DDP_DEVICE_H
#define DDP_DEVICE_H

#include <stddef.h>

#include "ddp.h"

typedef struct ddp_device_ops {
    const char *name;               /* "cpu" or "cuda" */
    void *(*alloc)(size_t n_bytes); /* zeroed; NULL on failure */
    void (*free)(void *p);          /* NULL is ignored */
    ddp_status (*upload)(void *dst, const void *src_host, size_t n_bytes);
    ddp_status (*download)(void *dst_host, const void *src, size_t n_bytes);
    ddp_status (*scale)(float *x, size_t n, float alpha); /* x *= alpha */
} ddp_device_ops;

/* Host memory (always built). */
const ddp_device_ops *ddp_device_cpu(void);
/* Device memory on the stream of ddp_cuda_device_open(), or NULL in a build without CUDA. */
const ddp_device_ops *ddp_device_cuda(void);
/* Makes `device` current for this thread and creates the stream every operation of libddp is
 * ordered on. DDP_ERR_CUDA on failure; DDP_ERR_UNSUPPORTED without a CUDA build. */
ddp_status ddp_cuda_device_open(int device);
void ddp_cuda_device_close(void);
/* The stream of ddp_cuda_device_open() (a cudaStream_t); NULL before it or without CUDA. */
void *ddp_cuda_stream(void);

#endif /* DDP_DEVICE_H */
