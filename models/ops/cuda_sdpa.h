/* cuda_sdpa.h - causal scaled-dot-product attention on cuDNN's fused flash-attention engines,
 * through the backend graph API (cudnn_graph.h; cudnn-frontend is C++ and not packaged here).
 *
 * cuDNN 9.19's native SDPA operation has no causal mask, so each direction is the expanded graph
 * that cudnn-frontend 1.x builds for SDPA (its CompositeSDPANode and CompositeSDPABackwardNode),
 * node for node: the matmuls, pointwise and reduction operations whose pattern the runtime fusion
 * engines recognise as flash attention. bf16 q, k, v, o and gradients, fp32 softmax statistics and
 * compute, the scores scaled by `scale` and masked causally (row >= column).
 *
 * Forward (14 operations): o (B, NH, T, hs) and stats (B, NH, T): the log-sum-exp of each row's
 * scaled, masked scores. Backward (21): from q, k, v, o, dout and stats, dq, dk, dv; sum (B, NH,
 * T fp32: rowsum(dout o)) is a buffer the graph writes and reads. That is the deterministic form
 * (the frontend's set_deterministic_algorithm(true), as llm.c asks for: dq written by its matmul,
 * the engines' dP-workspace kernels); the other (sdpa_dims.dq_accum, 22 operations, the frontend's
 * default) sums dq in dq_acc (B, NH, T, hs fp32) with atomics and copies it to dq, so dq may
 * differ from run to run.
 *
 * Layouts: q, k, v (and dq, dk, dv) are rows of the model's qkv (B, T, ld_qkv): q of head h at
 * element (b T + t) ld_qkv + h hs, k C further, v 2C (C = NH hs); o and dout are rows of
 * (B, T, ld_o). */
#ifndef CUDA_SDPA_H
#define CUDA_SDPA_H

#include <cudnn.h>
#include <stdbool.h>
#include <stddef.h>

#include "ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sdpa_dims {
    int B, NH, T, hs;
    long long ld_qkv; /* row stride of q, k, v, dq, dk, dv (3C in the model) */
    long long ld_o;   /* row stride of o and dout (C) */
    bool dq_accum;    /* backward: the form with the fp32 dq accumulator (not deterministic) */
} sdpa_dims;

typedef struct sdpa_plan sdpa_plan;

/* The lowest cuDNN the graphs are written for, 9.10.2 (cudnnGetVersion 91002), as
 * cudnn-frontend's SDPA nodes read: the causal mask fills -inf (below 9.10 the frontend fills the
 * lowest float instead), dQ_accum needs no zeroing by the caller (below 9.6 the frontend memsets
 * it), and the frontend refuses bf16 SDPA on 9.10.0 and 9.10.1 for known bugs. */
#define SDPA_MIN_CUDNN 91002

/* Whether cuDNN of version `version` (cudnnGetVersion's number, e.g. 91900) runs these graphs
 * when the program was compiled against `compiled` (CUDNN_VERSION): at least SDPA_MIN_CUDNN and
 * of the same major version (the backend API's descriptors are kept within a major). When not,
 * why (n bytes, may be NULL) names the version found and the one needed. */
bool sdpa_version_ok(size_t version, size_t compiled, char *why, size_t n);

/* The graph of one direction (bwd false: forward) for d: every tensor and operation descriptor
 * made and finalized, and with a handle also the operation graph, the first engine
 * configuration of cuDNN's heuristics (mode A) whose execution plan finalizes, and that plan.
 * Without a handle (a machine without a GPU: cudnnCreate needs one) it stops after the
 * operations, which checks every attribute the graph sets. *n_ops: the operations made.
 * DDP_ERR_INVALID_ARG for bad dims; DDP_ERR_UNSUPPORTED when a descriptor or the plan fails
 * (logged with cuDNN's own message). */
ddp_status sdpa_build(cudnnHandle_t handle, const sdpa_dims *d, bool bwd, sdpa_plan **out,
                      int *n_ops);
/* The plan's workspace in bytes (0 without a plan). */
size_t sdpa_workspace(const sdpa_plan *p);
void sdpa_free(sdpa_plan *p);

/* Runs a forward plan on the handle's stream: qkv (q at qkv, k at qkv + C, v at qkv + 2C elements),
 * o and stats as above; ws: sdpa_workspace bytes. */
ddp_status sdpa_run_fwd(cudnnHandle_t handle, const sdpa_plan *p, const void *qkv, void *o,
                        float *stats, float scale, void *ws);
/* Runs a backward plan: dqkv as qkv; sum and, for the dq_accum form, dq_acc as above (contents
 * on entry unused; dq_acc unread otherwise and may be NULL). */
ddp_status sdpa_run_bwd(cudnnHandle_t handle, const sdpa_plan *p, const void *qkv, const void *o,
                        const void *dout, const float *stats, void *dqkv, float *sum,
                        float *dq_acc, float scale, void *ws);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_SDPA_H */
