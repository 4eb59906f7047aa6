/* ops.c - choosing and opening the ops table for a context's backend, and the check that a
 * backend has every op a model needs.
 */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ops.h"

ddp_status ddp_ops_open(ddp_ctx *ctx, int threads, const ddp_ops **out)
{
    *out = NULL;
    if (ddp_backend(ctx) == DDP_BACKEND_CUDA) {
        const char *conv = getenv("DDP_CUDA_CONV");
        if (conv && strcmp(conv, "im2col") != 0 && strcmp(conv, "cudnn") != 0) {
            DDP_ERROR("DDP_CUDA_CONV=%s: use cudnn (the default) or im2col", conv);
            return DDP_ERR_INVALID_ARG;
        }
        DDP_TRY_(ddp_cuda_backend_open(ddp_device(ctx), ddp_backend_stream(ctx)));
        *out = conv && strcmp(conv, "im2col") == 0 ? ddp_cuda_ops_im2col() : ddp_cuda_ops();
        return DDP_OK;
    }
    ddp_cpu_set_threads(threads);
    const char *conv = getenv("DDP_CPU_CONV");
    if (conv && strcmp(conv, "im2col") != 0 && strcmp(conv, "onednn") != 0) {
        DDP_ERROR("DDP_CPU_CONV=%s: use onednn (the default) or im2col", conv);
        return DDP_ERR_INVALID_ARG;
    }
    *out = conv && strcmp(conv, "im2col") == 0 ? ddp_cpu_ops_im2col() : ddp_cpu_ops();
    return DDP_OK;
}

void ddp_ops_close(const ddp_ops *ops)
{
    if (ops && (ops == ddp_cuda_ops() || ops == ddp_cuda_ops_im2col()))
        ddp_cuda_backend_close();
}

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

ddp_status ddp_backend_require_precision(const ddp_ops *ops, ddp_dtype p, const char *who)
{
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    const char *why = NULL;
    if (p == DDP_FP32)
        return DDP_OK;
    if (!ops->supports || !ops->cast || !ops->linear_fwd || !ops->act_relu_fwd) {
        DDP_ERROR("%s: the %s backend has no %s ops yet; use --precision fp32", who ? who : "model",
                  ops->name, names[p]);
        return DDP_ERR_UNSUPPORTED;
    }
    if (!ops->supports(p, &why)) {
        DDP_ERROR("%s: --precision %s on the %s backend: %s", who ? who : "model", names[p], ops->name,
                  why ? why : "not supported");
        return DDP_ERR_UNSUPPORTED;
    }
    return DDP_OK;
}

#if !HAVE_CUDA

const ddp_ops *ddp_cuda_ops(void) { return NULL; }

const ddp_ops *ddp_cuda_ops_im2col(void) { return NULL; }

ddp_status ddp_cuda_backend_open(int device, void *stream)
{
    DDP_ERROR("CUDA device %d requested, but this build has no CUDA backend", device);
    return DDP_ERR_UNSUPPORTED;
}

void ddp_cuda_backend_close(void) {}

ddp_status ddp_cuda_set_tf32(bool on)
{
    (void)on;
    return DDP_OK;
}

const char *ddp_cuda_describe(ddp_dtype p)
{
    (void)p;
    return "";
}

#endif

#if !HAVE_CUDA || !HAVE_CUDNN

const char *ddp_cudnn_describe(ddp_dtype p)
{
    (void)p;
    return "";
}

#endif
