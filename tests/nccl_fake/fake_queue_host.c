/* fake_queue_host.c - the fake NCCL's stream without CUDA, for the CPU-only test build
 * (test_fake_nccl_host): buffers are host memory, copies and host functions run at once on the
 * calling thread, in call order, which is the order a stream would run them in. */
#include <stdlib.h>
#include <string.h>

#include "fake_queue.h"

void *fake_queue_alloc(size_t n_bytes, char *why)
{
    void *p = malloc(n_bytes ? n_bytes : 1);
    if (!p)
        strcpy(why, "out of host memory for the staging buffer");
    return p;
}

void fake_queue_free(void *p)
{
    free(p);
}

int fake_queue_copy(void *dst, const void *src, size_t n_bytes, cudaStream_t stream, char *why)
{
    (void)stream;
    (void)why;
    if (n_bytes)
        memmove(dst, src, n_bytes);
    return 0;
}

int fake_queue_host_fn(void (*fn)(void *), void *arg, cudaStream_t stream, char *why)
{
    (void)stream;
    (void)why;
    fn(arg);
    return 0;
}

int fake_queue_device(void)
{
    return 0;
}

int fake_queue_check_pointer(const void *p, const char *name, char *why)
{
    (void)p;
    (void)name;
    (void)why;
    return 0;
}
