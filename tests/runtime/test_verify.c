/* test_verify.c - replica verification under mpirun. A four-parameter model is initialised from
 * --seed on every rank, then checked with ddp_verify_replicas:
 *   (no flags)             equal replicas: must return DDP_OK (exit 0)
 *   --bad-rank R           rank R initialises parameter --bad-param (default 2) from another seed
 *   --bad-shape-rank R     rank R gives parameter 1 another shape
 *   --repair               after the expected mismatch, ddp_broadcast_params must make the
 *                          replicas equal to rank 0's (exit 0 when it does)
 * Without --repair, a rank that sees DDP_ERR_MISMATCH prints "rank N got DDP_ERR_MISMATCH" and
 * exits 3; it exits 0 only when the mismatch went unnoticed, 1 on any other status. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"

#define N_PARAMS 4

typedef struct test_args {
    uint64_t seed;
    int bad_rank, bad_param, bad_shape_rank, repair;
} test_args;

static int parse_args(int argc, char **argv, test_args *a)
{
    *a = (test_args){.seed = 42, .bad_rank = -1, .bad_param = 2, .bad_shape_rank = -1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            a->seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--bad-rank") && i + 1 < argc)
            a->bad_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bad-param") && i + 1 < argc)
            a->bad_param = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bad-shape-rank") && i + 1 < argc)
            a->bad_shape_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repair"))
            a->repair = 1;
        else {
            fprintf(stderr, "test_verify: unknown argument '%s'\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

static void make_descs(ddp_param_desc *d, int bad_shape)
{
    static const struct {
        const char *name;
        int n_dims;
        int64_t shape[2];
    } model[N_PARAMS] = {{"fc1.weight", 2, {16, 8}}, {"fc1.bias", 1, {16, 0}},
                         {"fc2.weight", 2, {4, 16}}, {"fc2.bias", 1, {4, 0}}};
    for (int i = 0; i < N_PARAMS; i++) {
        memset(&d[i], 0, sizeof d[i]);
        snprintf(d[i].name, sizeof d[i].name, "%s", model[i].name);
        d[i].n_dims = model[i].n_dims;
        d[i].shape[0] = model[i].shape[0];
        d[i].shape[1] = model[i].shape[1];
    }
    if (bad_shape)
        d[1].shape[0] = 17;
}

/* Flat parameters; parameter bad_param (or none: -1) drawn from seed + 1. */
static float *make_params(const ddp_param_desc *d, uint64_t seed, int bad_param, size_t *n_total)
{
    size_t n = 0;
    for (int i = 0; i < N_PARAMS; i++)
        n += ddp_param_numel(&d[i]);
    float *x = malloc(n * sizeof *x);
    if (!x)
        return NULL;
    size_t off = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        size_t k = ddp_param_numel(&d[i]);
        ddp_init_uniform(x + off, k, i == bad_param ? seed + 1 : seed, (uint32_t)i, -0.5f, 0.5f);
        off += k;
    }
    *n_total = n;
    return x;
}

/* After the mismatch: broadcast rank 0's values, check them, verify again. */
static void repair(ddp_ctx *ctx, const ddp_param_desc *d, float *x, size_t n, uint64_t seed)
{
    size_t n_ref = 0;
    float *ref = make_params(d, seed, -1, &n_ref);
    if (!ref)
        ddp_abort(ctx, 1);
    CHECK(ddp_broadcast_params(ctx, x, n) == DDP_OK, "broadcast_params");
    CHECK(memcmp(x, ref, n * sizeof *x) == 0, "rank %d differs from rank 0 after broadcast",
          ddp_rank(ctx));
    CHECK(ddp_verify_replicas(ctx, d, N_PARAMS, x) == DDP_OK, "verify after broadcast");
    free(ref);
}

static int run(ddp_ctx *ctx, const test_args *a)
{
    int rank = ddp_rank(ctx);
    ddp_param_desc d[N_PARAMS];
    make_descs(d, rank == a->bad_shape_rank);
    size_t n = 0;
    float *x = make_params(d, a->seed, rank == a->bad_rank ? a->bad_param : -1, &n);
    if (!x)
        ddp_abort(ctx, 1);
    ddp_status st = ddp_verify_replicas(ctx, d, N_PARAMS, x);
    int broken = a->bad_rank >= 0 || a->bad_shape_rank >= 0;
    int rc = 0;
    if (a->repair) {
        CHECK(st == DDP_ERR_MISMATCH, "first verify returned %s", ddp_strerror(st));
        repair(ctx, d, x, n, a->seed);
        rc = CHECK_DONE();
    } else if (st == DDP_ERR_MISMATCH) {
        fprintf(stderr, "test_verify: rank %d got DDP_ERR_MISMATCH\n", rank);
        rc = 3;
    } else if (st != DDP_OK || broken) {
        fprintf(stderr, "test_verify: rank %d: verify returned %s\n", rank, ddp_strerror(st));
        rc = st == DDP_OK ? 0 : 1;
    }
    free(x);
    return rc;
}

int main(int argc, char **argv)
{
    test_args a;
    if (parse_args(argc, argv, &a) != 0)
        return 2;
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&opts, &ctx);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp_init: %s\n", ddp_strerror(st));
        return 1;
    }
    int rc = run(ctx, &a);
    ddp_finalize(ctx);
    return rc;
}
