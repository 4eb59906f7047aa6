/* backend.c - backend selection helpers (the context's ops table, the check that a backend has
 * every op a model needs) and, in a build without CUDA, the CUDA entry points of backend.h.
 */
#include <stdio.h>

#include "config.h"
#include "internal.h"

const ddp_ops *ddp_backend_ops(const ddp_ctx *ctx) { return ctx ? ctx->ops : NULL; }

/* Logs the first op the backend lacks; returns DDP_ERR_UNSUPPORTED. */
static ddp_status ddp_op_missing(const ddp_ops *ops, const char *who, const char *op)
{
    DDP_ERROR("%s: the %s backend does not implement %s yet; run with --device cpu",
              who ? who : "model", ops->name ? ops->name : "unnamed", op);
    return DDP_ERR_UNSUPPORTED;
}

#define DDP_REQUIRE_OP_(field)                              \
    do {                                                    \
        if (!ops->field)                                    \
            return ddp_op_missing(ops, who, #field);        \
    } while (0)

ddp_status ddp_backend_require(const ddp_ops *ops, const char *who)
{
    if (!ops) {
        DDP_ERROR("%s: no backend ops table", who ? who : "model");
        return DDP_ERR_INVALID_ARG;
    }
    DDP_REQUIRE_OP_(alloc);
    DDP_REQUIRE_OP_(free);
    DDP_REQUIRE_OP_(upload);
    DDP_REQUIRE_OP_(download);
    DDP_REQUIRE_OP_(copy);
    DDP_REQUIRE_OP_(zero);
    DDP_REQUIRE_OP_(sync);
    DDP_REQUIRE_OP_(gemm);
    DDP_REQUIRE_OP_(bias_add);
    DDP_REQUIRE_OP_(bias_grad);
    DDP_REQUIRE_OP_(relu_fwd);
    DDP_REQUIRE_OP_(relu_bwd);
    DDP_REQUIRE_OP_(scale);
    DDP_REQUIRE_OP_(axpy);
    DDP_REQUIRE_OP_(sgd_step);
    DDP_REQUIRE_OP_(im2col);
    DDP_REQUIRE_OP_(col2im);
    DDP_REQUIRE_OP_(maxpool_fwd);
    DDP_REQUIRE_OP_(maxpool_bwd);
    DDP_REQUIRE_OP_(softmax_xent);
    DDP_REQUIRE_OP_(softmax_xent_acc);
    return DDP_OK;
}

#if !HAVE_CUDA

const ddp_ops *ddp_cuda_ops(void) { return NULL; }

int ddp_cuda_device_count(void) { return 0; }

ddp_status ddp_cuda_backend_open(int device)
{
    DDP_ERROR("CUDA device %d requested, but this build has no CUDA backend", device);
    return DDP_ERR_UNSUPPORTED;
}

void ddp_cuda_backend_close(void) {}

void *ddp_cuda_stream(void) { return NULL; }

int ddp_cuda_probe(char *why, size_t why_size)
{
    if (why_size)
        snprintf(why, why_size, "this libddp was built without CUDA");
    return 0;
}

ddp_status ddp_cuda_bus_id(int device, char *out, int size)
{
    (void)device, (void)out, (void)size;
    return DDP_ERR_UNSUPPORTED;
}

ddp_status ddp_cuda_join(void *first, void *then)
{
    (void)first, (void)then;
    return DDP_ERR_UNSUPPORTED;
}

#endif
