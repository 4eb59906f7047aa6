/* test_init.c - ddp_init under different launches:
 *   (no args)                 singleton without mpirun: rank 0 of 1, one node; also status names,
 *                             backend names and the log line format
 *   --np N                    under mpirun -np N on one host: ranks, local ranks, node ranks
 *   --expect-error NAME       ddp_init must return the status NAME (e.g. DDP_ERR_ENV) on this rank
 *   --set-env-on-rank R V=X   before ddp_init, rank R (from OMPI_COMM_WORLD_RANK) sets V=X
 *   --backend cpu|cuda|auto   ask for that backend; cuda exits 77 where a GPU is present (nothing
 *                             to test), unless DDP_FAKE_CUDA_DEVICES says GPUs are simulated
 *   --expect-backend NAME     ddp_init must succeed and choose that backend (cpu or cuda)
 *   --mpi-first               the program initialises MPI itself: ddp_init must use it and
 *                             ddp_finalize must leave it running
 * Exit 0 on success, 1 on a failed check. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "ddp.h"

typedef struct test_args {
    int np;                   /* expected world size under mpirun; 0 = singleton checks */
    const char *expect_error; /* expected status name, or NULL for DDP_OK */
    int env_rank;             /* rank that sets env_assign, -1 for none */
    const char *env_assign;   /* "VAR=VALUE" */
    ddp_backend_kind backend;
    ddp_backend_kind expect_backend; /* AUTO: not checked */
    int mpi_first;
} test_args;

static int parse_args(int argc, char **argv, test_args *a)
{
    *a = (test_args){.env_rank = -1, .backend = DDP_BACKEND_CPU};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--np") && i + 1 < argc)
            a->np = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--expect-error") && i + 1 < argc)
            a->expect_error = argv[++i];
        else if (!strcmp(argv[i], "--set-env-on-rank") && i + 2 < argc) {
            a->env_rank = atoi(argv[++i]);
            a->env_assign = argv[++i];
        } else if (!strcmp(argv[i], "--mpi-first")) {
            a->mpi_first = 1;
        } else if (!strcmp(argv[i], "--expect-backend") && i + 1 < argc) {
            if (ddp_backend_parse(argv[++i], &a->expect_backend) != DDP_OK)
                return -1;
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            if (ddp_backend_parse(argv[++i], &a->backend) != DDP_OK)
                return -1;
        } else {
            fprintf(stderr, "test_init: unknown argument '%s'\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

static const char *status_name(ddp_status s)
{
#define NAME_CASE_(name, text) \
    if (s == name)             \
        return #name;
    DDP_STATUS_LIST(NAME_CASE_)
#undef NAME_CASE_
    return "?";
}

static int evaluated;
static int side_effect(void)
{
    return ++evaluated;
}

/* Logs to a temporary file in place of stderr and returns what was written (static buffer). */
static const char *capture_log(void (*emit)(void))
{
    static char text[4096];
    capture c;
    capture_begin(&c);
    emit();
    capture_end(&c, text, sizeof text);
    return text;
}

static void emit_lines(void)
{
    DDP_INFO("info line %d", 42);
    DDP_DEBUG("debug line %d", side_effect());
    ddp_log_write(DDP_LOG_DEBUG, 0, __FILE__, __LINE__, "direct debug line");
    DDP_ERROR("error line");
}

static void check_log(const ddp_ctx *ctx)
{
    char prefix[300];
    snprintf(prefix, sizeof prefix, "[rank 0 %s] info line 42\n", ddp_hostname(ctx));
    ddp_log_set_level(DDP_LOG_INFO);
    const char *text = capture_log(emit_lines);
    CHECK(strstr(text, prefix) != NULL, "info line with prefix '%s' in:\n%s", prefix, text);
    CHECK(strstr(text, "debug line") == NULL && evaluated == 0,
          "debug line written or its arguments evaluated at level info:\n%s", text);
    /* a user reads the message; the source location only at the debug level */
    CHECK(strstr(text, "error: error line") != NULL, "error line without file:line:\n%s", text);
    ddp_log_set_level(DDP_LOG_DEBUG);
    text = capture_log(emit_lines);
    ddp_log_set_level(DDP_LOG_INFO);
    CHECK(strstr(text, "error: test_init.c:") != NULL, "debug: error line shows file:line:\n%s",
          text);
}

static void check_singleton(const ddp_ctx *ctx)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    CHECK(ddp_rank(ctx) == 0 && ddp_world_size(ctx) == 1, "rank %d of %d", ddp_rank(ctx),
          ddp_world_size(ctx));
    CHECK(ddp_local_rank(ctx) == 0 && ddp_local_world_size(ctx) == 1, "local %d of %d",
          ddp_local_rank(ctx), ddp_local_world_size(ctx));
    CHECK(ddp_node_rank(ctx) == 0 && ddp_num_nodes(ctx) == 1, "node %d of %d", ddp_node_rank(ctx),
          ddp_num_nodes(ctx));
    CHECK(!strcmp(ddp_hostname(ctx), host), "hostname '%s' vs '%s'", ddp_hostname(ctx), host);
    CHECK(ddp_backend(ctx) == DDP_BACKEND_CPU && ddp_device(ctx) == -1, "cpu backend, no device");
    CHECK(!strcmp(ddp_strerror(DDP_ERR_ENV), "invalid or inconsistent environment"), "strerror");
    CHECK(!strcmp(ddp_strerror((ddp_status)999), "unknown status"), "strerror of unknown");
    CHECK(!strcmp(ddp_version(), "0.1.0") && ddp_version_number() == 100, "version %s",
          ddp_version());
    ddp_backend_kind k = DDP_BACKEND_CPU;
    CHECK(ddp_backend_parse("cuda", &k) == DDP_OK && k == DDP_BACKEND_CUDA, "parse cuda");
    CHECK(ddp_backend_parse("gpu", &k) == DDP_ERR_INVALID_ARG, "parse gpu is an error");
    CHECK(!strcmp(ddp_backend_name(DDP_BACKEND_AUTO), "auto"), "backend name");
    check_log(ctx);
}

static void check_mpirun(ddp_ctx *ctx, int np)
{
    int rank = ddp_rank(ctx);
    CHECK(ddp_world_size(ctx) == np, "world size %d, want %d", ddp_world_size(ctx), np);
    /* One host: every rank is on node 0 and its local rank is its rank. */
    CHECK(ddp_local_world_size(ctx) == np, "local world %d", ddp_local_world_size(ctx));
    CHECK(ddp_local_rank(ctx) == rank, "local rank %d, rank %d", ddp_local_rank(ctx), rank);
    CHECK(ddp_node_rank(ctx) == 0 && ddp_num_nodes(ctx) == 1, "node %d of %d",
          ddp_node_rank(ctx), ddp_num_nodes(ctx));
    int *ranks = calloc((size_t)np, sizeof *ranks);
    if (!ranks)
        ddp_abort(ctx, 1);
    CHECK(ddp_allgather(ctx, &rank, ranks, sizeof rank) == DDP_OK, "allgather ranks");
    for (int r = 0; r < np; r++)
        CHECK(ranks[r] == r, "rank slot %d holds %d", r, ranks[r]);
    free(ranks);
}

static void set_env_if_mine(const test_args *a)
{
    const char *me = getenv("OMPI_COMM_WORLD_RANK");
    if (a->env_assign && me && atoi(me) == a->env_rank)
        putenv((char *)a->env_assign);
}

/* MPI started by the program: ddp_init joins it, ddp_finalize leaves it to the program. */
static int run_mpi_first(int np)
{
    int provided = 0, finalized = 1;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = DDP_BACKEND_CPU;
    opts.print_table = 0;
    ddp_ctx *ctx = NULL;
    CHECK(ddp_init(&opts, &ctx) == DDP_OK, "ddp_init after MPI_Init_thread");
    if (ctx) {
        check_mpirun(ctx, np);
        ddp_finalize(ctx);
    }
    MPI_Finalized(&finalized);
    CHECK(!finalized, "ddp_finalize finalised MPI that the program started");
    int world = 0;
    CHECK(MPI_Allreduce(&np, &world, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS &&
              world == np * np, "MPI still usable after ddp_finalize");
    MPI_Finalize();
    return CHECK_DONE();
}

int main(int argc, char **argv)
{
    test_args a;
    if (parse_args(argc, argv, &a) != 0)
        return 2;
    if (a.backend == DDP_BACKEND_CUDA && ddp_cuda_device_count() > 0 &&
        !getenv("DDP_FAKE_CUDA_DEVICES"))
        return TEST_SKIP;
    if (a.mpi_first)
        return run_mpi_first(a.np);
    set_env_if_mine(&a);
    ddp_init_opts opts;
    ddp_init_opts_default(&opts);
    opts.backend = a.backend;
    opts.print_table = a.np > 0;
    ddp_ctx *ctx = NULL;
    ddp_status st = ddp_init(&opts, &ctx);
    if (a.expect_error) {
        CHECK(!strcmp(status_name(st), a.expect_error), "ddp_init returned %s, want %s",
              status_name(st), a.expect_error);
        CHECK(st == DDP_OK || ctx == NULL, "context left on failure");
        if (st == DDP_OK)
            ddp_finalize(ctx);
        return CHECK_DONE();
    }
    if (st != DDP_OK) {
        fprintf(stderr, "ddp_init: %s\n", ddp_strerror(st));
        return 1;
    }
    if (a.expect_backend != DDP_BACKEND_AUTO)
        CHECK(ddp_backend(ctx) == a.expect_backend, "backend %s, want %s",
              ddp_backend_name(ddp_backend(ctx)), ddp_backend_name(a.expect_backend));
    if (a.np > 0)
        check_mpirun(ctx, a.np);
    else
        check_singleton(ctx);
    ddp_finalize(ctx);
    return CHECK_DONE();
}
