/* check.h - minimal assertions for the test programs: a failed CHECK prints file:line and the
 * condition, counts the failure, and the test exits 1 at the end (CHECK_DONE). Exit 77 = skipped. */
#ifndef TEST_CHECK_H
#define TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_failures_;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            check_failures_++;                                                  \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* |a - b| <= atol + rtol * |b|, b being the reference. */
#define CHECK_CLOSE(a, b, atol, rtol, what)                                     \
    CHECK(fabs((double)(a) - (double)(b)) <= (atol) + (rtol) * fabs((double)(b)), \
          "%s: got %.9g, want %.9g", (what), (double)(a), (double)(b))

#define CHECK_DONE() (check_failures_ ? (fprintf(stderr, "%d check(s) failed\n", check_failures_), 1) : 0)

#define TEST_SKIP 77

/* The runtime tests' start, where libddp's header is on the include path. */
#if defined(__has_include)
#if __has_include("ddp.h")
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

/* GPUs a CUDA run needs on this host: one, or one per rank of the host (NCCL's rule without a
 * shared GPU; OMPI_COMM_WORLD_LOCAL_SIZE ranks). */
enum { CHECK_GPU_ONE, CHECK_GPU_PER_RANK };

/* Parses `name [--backend cpu|cuda]` (default cpu) and joins the job without the start-up table.
 * Returns 0 with *ctx set; else the exit status for main: 2 bad usage, TEST_SKIP when the CUDA
 * backend was asked for and this host has too few GPUs (gpus says how many: CHECK_GPU_*), 1 when
 * ddp_init fails. */
static inline int check_ddp_init(int argc, char **argv, const char *name, int gpus, ddp_ctx **ctx)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    *ctx = NULL;
    if (argc == 3 && !strcmp(argv[1], "--backend")) {
        if (ddp_backend_parse(argv[2], &io.backend) != DDP_OK)
            return 2;
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--backend cpu|cuda]\n", name);
        return 2;
    }
    if (io.backend == DDP_BACKEND_CUDA) {
        const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        int need = gpus == CHECK_GPU_PER_RANK && local ? atoi(local) : 1;
        int have = ddp_cuda_device_count();
        if (have < need) {
            fprintf(stderr, "%s: skipped: %d GPU(s) on this host, %d needed\n", name, have, need);
            return TEST_SKIP;
        }
    }
    io.print_table = 0;
    return ddp_init(&io, ctx) == DDP_OK ? 0 : 1;
}
#endif
#endif

#endif /* TEST_CHECK_H */
