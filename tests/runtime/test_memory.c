/* test_memory.c - libddp's backend memory on the CPU backend (and on host memory without a
 * context): ddp_alloc returns zeroed memory; ddp_upload, ddp_download, ddp_copy and ddp_zero
 * round-trip exact bytes; the double-buffered batch staging (ddp_stage_upload, _acquire,
 * _release) delivers each round's batch into its slot while the host buffer is reused at once,
 * and refuses a slot or part outside {0, 1}; ddp_memory_info sees a device allocation (and says
 * unsupported for host memory); the checkpoint snapshots (ddp_snapshot_*: on CUDA page-locked memory
 * and a side stream): a copy holds the values of when it was queued although the fenced stream
 * overwrites the source at once, waited for from another thread; unpinned memory is copied at once.
 * One process (ddp_init without a launcher).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "ddp_checkpoint.h"

enum { N = 4099 }; /* odd: no size a copy loop could round to */

/* Every byte of a fresh allocation is 0 (dirtying the heap first, so calloc-like behaviour
 * is what is tested, not a fresh page). */
static void check_alloc_zeroed(ddp_ctx *ctx, const char *who)
{
    for (int round = 0; round < 4; round++) {
        unsigned char *dirty = malloc(N);
        if (dirty)
            memset(dirty, 0xa5, N);
        free(dirty);
        unsigned char *p = ddp_alloc(ctx, N), back[N];
        CHECK(p != NULL, "%s: ddp_alloc(%d)", who, N);
        memset(back, 0x5a, N);
        CHECK(!p || ddp_download(ctx, back, p, N) == DDP_OK, "%s: download", who);
        int nonzero = 0;
        for (int i = 0; p && i < N; i++)
            nonzero += back[i] != 0;
        CHECK(nonzero == 0, "%s: %d of %d bytes of a fresh allocation are not zero", who, nonzero, N);
        ddp_free(ctx, p);
    }
    ddp_free(ctx, NULL);
}

static void check_round_trip(ddp_ctx *ctx, const char *who)
{
    unsigned char host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 7 + 3);
    unsigned char *a = ddp_alloc(ctx, N), *b = ddp_alloc(ctx, N);
    CHECK(a && b, "%s: two allocations", who);
    if (!a || !b)
        return;
    CHECK(ddp_upload(ctx, a, host, N) == DDP_OK, "%s: upload", who);
    CHECK(ddp_copy(ctx, b, a, N) == DDP_OK, "%s: copy", who);
    CHECK(ddp_zero(ctx, a, N) == DDP_OK, "%s: zero", who);
    CHECK(ddp_download(ctx, back, b, N) == DDP_OK && memcmp(back, host, N) == 0,
          "%s: upload + copy + download round trip", who);
    memset(back, 1, N);
    CHECK(ddp_download(ctx, back, a, N) == DDP_OK && back[0] == 0 && back[N - 1] == 0 &&
              memchr(back, 1, N) == NULL,
          "%s: zero cleared every byte", who);
    CHECK(ddp_upload(ctx, NULL, host, N) == DDP_ERR_INVALID_ARG, "%s: NULL destination refused", who);
    CHECK(ddp_copy(ctx, b, NULL, N) == DDP_ERR_INVALID_ARG, "%s: NULL source refused", who);
    CHECK(ddp_zero(ctx, a, 0) == DDP_OK && ddp_copy(ctx, b, a, 0) == DDP_OK, "%s: empty ops", who);
    ddp_free(ctx, a);
    ddp_free(ctx, b);
}

/* Six rounds alternate the slots; the host buffers are overwritten right after each upload. */
static void check_staging(ddp_ctx *ctx, const char *who)
{
    enum { L = 64 };
    float *x = malloc(N * sizeof *x), *back = malloc(N * sizeof *back);
    int labels[L], labels_back[L];
    float *xd[2] = {ddp_alloc(ctx, N * sizeof(float)), ddp_alloc(ctx, N * sizeof(float))};
    int *yd[2] = {ddp_alloc(ctx, sizeof labels), ddp_alloc(ctx, sizeof labels)};
    CHECK(x && back && xd[0] && xd[1] && yd[0] && yd[1], "%s: staging buffers", who);
    if (!x || !back || !xd[0] || !xd[1] || !yd[0] || !yd[1])
        return;
    CHECK(ddp_stage_upload(ctx, 2, 0, xd[0], x, 4) == DDP_ERR_INVALID_ARG, "%s: slot 2 refused", who);
    CHECK(ddp_stage_upload(ctx, 0, -1, xd[0], x, 4) == DDP_ERR_INVALID_ARG, "%s: part -1 refused", who);
    CHECK(ddp_stage_acquire(ctx, -1) == DDP_ERR_INVALID_ARG, "%s: acquire of slot -1 refused", who);
    CHECK(ddp_stage_release(ctx, 2) == DDP_ERR_INVALID_ARG, "%s: release of slot 2 refused", who);
    for (int round = 0; round < 6; round++) {
        int s = round & 1;
        for (int i = 0; i < N; i++)
            x[i] = (float)(round * N + i);
        for (int i = 0; i < L; i++)
            labels[i] = round * L + i;
        CHECK(ddp_stage_upload(ctx, s, 0, xd[s], x, N * sizeof *x) == DDP_OK, "%s: stage images", who);
        CHECK(ddp_stage_upload(ctx, s, 1, yd[s], labels, sizeof labels) == DDP_OK, "%s: stage labels", who);
        memset(x, 0xff, N * sizeof *x), memset(labels, 0xff, sizeof labels);
        CHECK(ddp_stage_acquire(ctx, s) == DDP_OK, "%s: acquire", who);
        CHECK(ddp_download(ctx, back, xd[s], N * sizeof *back) == DDP_OK, "%s: download", who);
        CHECK(ddp_download(ctx, labels_back, yd[s], sizeof labels) == DDP_OK, "%s: download labels", who);
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += back[i] != (float)(round * N + i);
        for (int i = 0; i < L; i++)
            bad += labels_back[i] != round * L + i;
        CHECK(bad == 0, "%s: round %d: %d values differ from the batch staged", who, round, bad);
        CHECK(ddp_stage_release(ctx, s) == DDP_OK, "%s: release", who);
    }
    for (int s = 0; s < 2; s++)
        ddp_free(ctx, xd[s]), ddp_free(ctx, yd[s]);
    free(x), free(back);
}

/* ddp_memory_info: unsupported for host memory (zeros given back); on CUDA the memory in use
 * grows by at least a 64 MiB allocation (cudaMalloc commits it) and falls back after the free. */
typedef struct snap_waiter {
    ddp_ctx *ctx;
    ddp_status st;
} snap_waiter;

static void *snap_wait_main(void *arg)
{
    snap_waiter *w = arg;
    w->st = ddp_snapshot_wait(w->ctx);
    return NULL;
}

/* 32 Mi floats: long enough a copy that an upload not fenced behind it would overwrite its source
 * while it runs (a separate copy engine each way). */
static void check_snapshot(ddp_ctx *ctx, const char *who)
{
    const size_t n = (size_t)32 << 20, bytes = n * sizeof(float);
    float *old = malloc(bytes), *fresh = malloc(bytes), *snap = malloc(bytes), *back = malloc(bytes);
    float *x = ddp_alloc(ctx, bytes);
    CHECK(old && fresh && snap && back && x, "%s: snapshot buffers", who);
    if (!old || !fresh || !snap || !back || !x)
        goto out;
    for (size_t i = 0; i < n; i++) {
        old[i] = (float)(i % 1000003);
        fresh[i] = -1.0f - (float)(i % 997);
    }
    memset(snap, 0, bytes);
    CHECK(ddp_snapshot_pin(ctx, snap, bytes) == DDP_OK, "%s: pin", who);
    CHECK(ddp_upload(ctx, x, old, bytes) == DDP_OK, "%s: upload", who);
    CHECK(ddp_snapshot_copy(ctx, snap, x, bytes) == DDP_OK, "%s: snapshot copy queued", who);
    CHECK(ddp_snapshot_fence(ctx) == DDP_OK, "%s: fence", who);
    CHECK(ddp_upload(ctx, x, fresh, bytes) == DDP_OK, "%s: overwrite after the fence", who);
    snap_waiter w = {.ctx = ctx, .st = DDP_ERR_STATE};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, snap_wait_main, &w) == 0, "%s: waiter thread", who);
    pthread_join(t, NULL);
    CHECK(w.st == DDP_OK, "%s: wait from another thread: %s", who, ddp_strerror(w.st));
    CHECK(memcmp(snap, old, bytes) == 0, "%s: the snapshot holds the values of when it was queued", who);
    CHECK(ddp_download(ctx, back, x, bytes) == DDP_OK && memcmp(back, fresh, bytes) == 0,
          "%s: the source was overwritten after it", who);
    CHECK(ddp_snapshot_unpin(ctx, snap) == DDP_OK, "%s: unpin", who);
    /* not pinned (any more): a plain download, the values there when the call returns */
    CHECK(ddp_snapshot_copy(ctx, back, x, 1000 * sizeof(float)) == DDP_OK && back[999] == fresh[999],
          "%s: unpinned snapshot copy", who);
    CHECK(ddp_snapshot_wait(ctx) == DDP_OK && ddp_snapshot_fence(ctx) == DDP_OK, "%s: nothing pending", who);
    CHECK(ddp_snapshot_copy(ctx, NULL, x, 4) == DDP_ERR_INVALID_ARG && ddp_snapshot_copy(ctx, NULL, NULL, 0) == DDP_OK &&
              ddp_snapshot_pin(ctx, NULL, 4) == DDP_ERR_INVALID_ARG && ddp_snapshot_unpin(ctx, back) == DDP_OK,
          "%s: NULL buffers refused, empty and never-pinned ones accepted", who);
out:
    ddp_free(ctx, x);
    free(old);
    free(fresh);
    free(snap);
    free(back);
}

static void check_memory_info(ddp_ctx *ctx, const char *who)
{
    size_t used = 1, total = 1;
    ddp_status st = ddp_memory_info(ctx, &used, &total);
    if (!ctx || ddp_backend(ctx) == DDP_BACKEND_CPU) {
        CHECK(st == DDP_ERR_UNSUPPORTED && used == 0 && total == 0,
              "%s: memory_info on host memory: %s, used %zu, total %zu", who, ddp_strerror(st),
              used, total);
        return;
    }
    CHECK(st == DDP_OK && used > 0 && total >= used, "%s: memory_info: %s, used %zu of %zu", who,
          ddp_strerror(st), used, total);
    const size_t n = (size_t)64 << 20;
    void *p = ddp_alloc(ctx, n);
    size_t with = 0, after = 0;
    CHECK(p && ddp_memory_info(ctx, &with, NULL) == DDP_OK && with >= used + n,
          "%s: memory in use %zu -> %zu after a %zu-byte allocation", who, used, with, n);
    ddp_free(ctx, p);
    CHECK(ddp_memory_info(ctx, &after, NULL) == DDP_OK && after < with,
          "%s: memory in use %zu after freeing (was %zu)", who, after, with);
}

int main(int argc, char **argv)
{
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.print_table = 0;
    io.backend = DDP_BACKEND_CPU;
    if (argc > 2 && strcmp(argv[1], "--backend") == 0 && ddp_backend_parse(argv[2], &io.backend) != DDP_OK)
        return 2;
    if (io.backend == DDP_BACKEND_CUDA && ddp_cuda_device_count() == 0) {
        fprintf(stderr, "test_memory: skipped: no usable GPU\n");
        return TEST_SKIP;
    }
    check_alloc_zeroed(NULL, "host");
    check_round_trip(NULL, "host");
    check_staging(NULL, "host");
    check_memory_info(NULL, "host");
    ddp_ctx *ctx = NULL;
    CHECK(ddp_init(&io, &ctx) == DDP_OK, "ddp_init");
    if (!ctx)
        return CHECK_DONE();
    const char *who = ddp_backend_name(ddp_backend(ctx));
    check_alloc_zeroed(ctx, who);
    check_round_trip(ctx, who);
    check_staging(ctx, who);
    check_snapshot(ctx, who);
    check_memory_info(ctx, who);
    CHECK(ddp_synchronize(ctx) == DDP_OK, "%s: synchronize", who);
    ddp_finalize(ctx);
    return CHECK_DONE();
}
