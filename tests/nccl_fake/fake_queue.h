/* fake_queue.h - how the fake NCCL (fake_nccl.c) puts work on a stream: the CUDA runtime's
 * (fake_queue_cuda.c: asynchronous copies and a host function on the caller's stream) or, for the
 * CPU-only test build, the calling thread's (fake_queue_host.c: "device" pointers are host
 * pointers, everything runs at once). Each function returns 0 on success, else fills `why` (at
 * least 128 bytes) and returns -1. Only the issuing thread calls them, never a host function.
 */
#ifndef FAKE_QUEUE_H
#define FAKE_QUEUE_H

#include <stddef.h>
#include <nccl.h>

/* Staging memory the stream's copies may use (pinned); NULL on failure. */
void *fake_queue_alloc(size_t n_bytes, char *why);
void fake_queue_free(void *p);

/* Queues a copy of n_bytes (either direction) on stream. */
int fake_queue_copy(void *dst, const void *src, size_t n_bytes, cudaStream_t stream, char *why);

/* Queues fn(arg) on stream, after the work queued before it. fn makes no CUDA call. */
int fake_queue_host_fn(void (*fn)(void *), void *arg, cudaStream_t stream, char *why);

/* The calling thread's current device (ncclCommCuDevice reports it); 0 without CUDA. */
int fake_queue_device(void);

/* 0 when p can be a collective's buffer (memory of the current device, managed or pinned host
 * memory), else -1 with the reason, as NCCL's NCCL_CHECK_POINTERS=1 check refuses it. */
int fake_queue_check_pointer(const void *p, const char *name, char *why);

#endif /* FAKE_QUEUE_H */
