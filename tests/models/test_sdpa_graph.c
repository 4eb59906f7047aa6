/* test_sdpa_graph.c - cuDNN's fused-attention graphs (models/ops/cuda_sdpa.h) built without a
 * GPU: every tensor and operation descriptor of the forward (14 operations) and backward (21, the
 * deterministic form with dq written by its matmul; 22 in the dq_accum form) graphs made, given its attributes and finalized by cuDNN, and every operation's shapes checked
 * (matmul dimensions, broadcasts, reductions, reshapes), at d12's shape and at small and odd
 * ones; bad dims refused; the cuDNN version gate on faked versions. What needs a GPU (the operation graph, cuDNN's engines, the results)
 * is test_cuda_gpt's. Runs wherever cuDNN is installed; no GPU needed. */
#include <stdio.h>
#include <string.h>

#include "cuda_sdpa.h"
#include "testutil.h"

static void check_shape(int B, int NH, int T, int hs)
{
    long long C = (long long)NH * hs;
    for (int form = 0; form < 3; form++) { /* forward, backward, backward with dq_accum */
        sdpa_dims d = {B, NH, T, hs, 3 * C, C, form == 2};
        int n_ops = -1, want = form == 0 ? 14 : form == 1 ? 21 : 22;
        const char *name = form == 0 ? "forward" : form == 1 ? "backward" : "backward dq_accum";
        sdpa_plan *plan = (sdpa_plan *)1;
        ddp_status st = sdpa_build(NULL, &d, form > 0, &plan, &n_ops);
        CHECK(st == DDP_OK, "%s B %d NH %d T %d hs %d: %s", name, B, NH, T, hs, ddp_strerror(st));
        CHECK(n_ops == want, "%s: %d operations (want %d)", name, n_ops, want);
        CHECK(plan == NULL, "no handle, no plan");
    }
    printf("sdpa graphs B %d NH %d T %d hs %d: forward 14, backward 21 (dq_accum 22) operations "
           "finalized\n", B, NH, T, hs);
}

/* The version gate with faked versions (sdpa_version_ok): 9.10.2 and newer of the major built
 * against pass; older, 9.10.0/9.10.1, 8.x and another major are refused, the reason naming the
 * version found. */
static void check_version_gate(void)
{
    char why[256];
    const struct {
        size_t version, compiled;
        bool ok;
        const char *named;
    } cases[] = {{91900, 91900, true, ""},     {91002, 91900, true, ""},
                 {92100, 91900, true, ""},     {91001, 91900, false, "9.10.1"},
                 {91000, 91900, false, "9.10.0"}, {90600, 91900, false, "9.6.0"},
                 {8907, 91900, false, "8.9.7"}, {100000, 91900, false, "10.0.0"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strcpy(why, "unset");
        bool ok = sdpa_version_ok(cases[i].version, cases[i].compiled, why, sizeof why);
        CHECK(ok == cases[i].ok, "cuDNN %zu against %zu: %s (want %s)", cases[i].version,
              cases[i].compiled, ok ? "taken" : "refused", cases[i].ok ? "taken" : "refused");
        CHECK(ok ? why[0] == '\0' : strstr(why, cases[i].named) != NULL,
              "cuDNN %zu: the reason '%s' names %s", cases[i].version, why, cases[i].named);
    }
    CHECK(!sdpa_version_ok(91001, 91900, NULL, 0), "no room for the reason: still refused");
    CHECK(sdpa_version_ok(cudnnGetVersion(), CUDNN_VERSION, why, sizeof why) ==
              (cudnnGetVersion() >= SDPA_MIN_CUDNN),
          "the cuDNN here (%zu): %s", cudnnGetVersion(), why);
    printf("version gate: cuDNN %zu here, %d needed\n", cudnnGetVersion(), SDPA_MIN_CUDNN);
}

int main(void)
{
    check_version_gate();
    check_shape(16, 12, 1024, 64); /* d12 at B 16 */
    check_shape(1, 1, 1, 64);
    check_shape(3, 4, 33, 64);
    check_shape(2, 2, 100, 32);
    int n_ops = -1;
    sdpa_dims narrow = {2, 12, 64, 64, 3 * 768 - 1, 768, false};
    sdpa_dims zero = {0, 12, 64, 64, 3 * 768, 768, false};
    CHECK(sdpa_build(NULL, &narrow, false, NULL, &n_ops) == DDP_ERR_INVALID_ARG,
          "ld_qkv < 3C refused");
    CHECK(sdpa_build(NULL, &zero, true, NULL, &n_ops) == DDP_ERR_INVALID_ARG, "B 0 refused");
    CHECK(sdpa_build(NULL, NULL, true, NULL, &n_ops) == DDP_ERR_INVALID_ARG, "NULL dims refused");
    if (CHECK_DONE())
        return 1;
    printf("test_sdpa_graph: passed\n");
    return 0;
}
