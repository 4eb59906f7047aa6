/* test_sdpa_graph.c - cuDNN's fused-attention graphs (models/ops/cuda_sdpa.h) built without a
 * GPU: every tensor and operation descriptor of the forward (14 operations) and backward (21, the
 * deterministic form with dq written by its matmul; 22 in the dq_accum form) graphs made, given its attributes and finalized by cuDNN, and every operation's shapes checked
 * (matmul dimensions, broadcasts, reductions, reshapes), at d12's shape and at small and odd
 * ones; bad dims refused. What needs a GPU (the operation graph, cuDNN's engines, the results)
 * is test_cuda_gpt's. Runs wherever cuDNN is installed; no GPU needed. */
#include <stdio.h>

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

int main(void)
{
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
