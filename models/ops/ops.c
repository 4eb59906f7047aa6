/* ops.c - opening and closing the ops handle for a context's backend, and the checks that a
 * backend has every op a model needs.
 */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "half.h"
#include "ops.h"
#include "switches.h"

/* DDP_OK when the environment variable `name` is unset or one of the two values; `*second` says
 * whether it is the second. */
static ddp_status conv_choice(const char *name, const char *first, const char *second, bool *is_second)
{
    const char *v = getenv(name);
    *is_second = v && strcmp(v, second) == 0;
    if (!v || *is_second || strcmp(v, first) == 0)
        return DDP_OK;
    DDP_ERROR("%s=%s: use %s (the default) or %s", name, v, first, second);
    return DDP_ERR_INVALID_ARG;
}

ddp_status ops_open(ddp_ctx *ctx, int threads, ops_handle **out)
{
    bool im2col = false;
    *out = NULL;
    TRY_OK(ops_switches_check());
    if (ctx && ddp_backend(ctx) == DDP_BACKEND_CUDA) {
        TRY_OK(conv_choice("DDP_CUDA_CONV", "cudnn", "im2col", &im2col));
        return ops_cuda_open(ctx, im2col, out);
    }
    TRY_OK(conv_choice("DDP_CPU_CONV", "onednn", "im2col", &im2col));
    return ops_cpu_open(ctx, threads, im2col, out);
}

void ops_close(ops_handle *ops)
{
    if (!ops)
        return;
    if (ops->ctx && ddp_synchronize(ops->ctx) != DDP_OK)
        DDP_WARN("ops_close: the queued work did not complete; releasing the handle anyway");
    ops->release(ops);
}

/* Logs the first op the backend lacks; returns DDP_ERR_UNSUPPORTED. */
static ddp_status op_missing(const ops_handle *ops, const char *who, const char *op)
{
    DDP_ERROR("%s: the %s backend does not implement %s yet; run with --device cpu",
              who ? who : "model", ops->name ? ops->name : "unnamed", op);
    return DDP_ERR_UNSUPPORTED;
}

#define REQUIRE_OP_(field)                                  \
    do {                                                    \
        if (!ops->field)                                    \
            return op_missing(ops, who, #field);            \
    } while (0)

ddp_status ops_require(const ops_handle *ops, const char *who)
{
    if (!ops) {
        DDP_ERROR("%s: no ops handle", who ? who : "model");
        return DDP_ERR_INVALID_ARG;
    }
    REQUIRE_OP_(gemm);
    REQUIRE_OP_(bias_add);
    REQUIRE_OP_(bias_grad);
    REQUIRE_OP_(relu_fwd);
    REQUIRE_OP_(relu_bwd);
    REQUIRE_OP_(scale);
    REQUIRE_OP_(axpy);
    REQUIRE_OP_(sgd_step);
    REQUIRE_OP_(im2col);
    REQUIRE_OP_(col2im);
    REQUIRE_OP_(maxpool_fwd);
    REQUIRE_OP_(maxpool_bwd);
    REQUIRE_OP_(softmax_xent);
    REQUIRE_OP_(softmax_xent_acc);
    return DDP_OK;
}

ddp_status ops_require_gpt(const ops_handle *ops, const char *who)
{
    TRY_OK(ops_require(ops, who));
    REQUIRE_OP_(cast);
    REQUIRE_OP_(linear_fwd);
    REQUIRE_OP_(linear_bwd_params);
    REQUIRE_OP_(linear_bwd_input);
    REQUIRE_OP_(encoder_fwd);
    REQUIRE_OP_(encoder_bwd);
    REQUIRE_OP_(layernorm_fwd);
    REQUIRE_OP_(layernorm_bwd);
    REQUIRE_OP_(attention_fwd);
    REQUIRE_OP_(attention_bwd);
    REQUIRE_OP_(attention_floats);
    REQUIRE_OP_(gelu_fwd);
    REQUIRE_OP_(gelu_bwd);
    REQUIRE_OP_(add);
    REQUIRE_OP_(xent_fwd_bwd);
    REQUIRE_OP_(adamw_step);
    return DDP_OK;
}

ddp_status ops_require_precision(const ops_handle *ops, ddp_dtype p, const char *who)
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
    if (!ops->supports(ops, p, &why)) {
        DDP_ERROR("%s: --precision %s on the %s backend: %s", who ? who : "model", names[p], ops->name,
                  why ? why : "not supported");
        return DDP_ERR_UNSUPPORTED;
    }
    return DDP_OK;
}

#if !HAVE_CUDA

ddp_status ops_cuda_open(ddp_ctx *ctx, bool im2col, ops_handle **out)
{
    (void)ctx, (void)im2col;
    *out = NULL;
    DDP_ERROR("a CUDA ops handle requested, but this build has no CUDA backend");
    return DDP_ERR_UNSUPPORTED;
}

ddp_status ops_cuda_set_tf32(ops_handle *ops, bool on)
{
    (void)ops, (void)on;
    return DDP_OK;
}

ddp_status ops_cuda_set_attention(ops_handle *ops, bool flash)
{
    (void)flash;
    return ops ? DDP_OK : DDP_ERR_INVALID_ARG;
}

ddp_status ops_cuda_set_attention_cudnn(ops_handle *ops, bool on)
{
    (void)on;
    return ops ? DDP_OK : DDP_ERR_INVALID_ARG;
}

const char *ops_cuda_describe(const ops_handle *ops, ddp_dtype p)
{
    (void)ops, (void)p;
    return "";
}

const char *ops_cuda_device_name(const ops_handle *ops)
{
    (void)ops;
    return "";
}

#endif

#if !HAVE_CUDA || !HAVE_CUDNN

const char *ops_cudnn_describe(const ops_handle *ops, ddp_dtype p)
{
    (void)ops, (void)p;
    return "";
}

#endif

ddp_status ops_weights_put(const ops_handle *ops, ddp_dtype p, void *dst, float *host, size_t n)
{
    size_t es = ops_dtype_size(ops, p);
    if (es == 2) { /* bf16 bits, narrowed in place */
        uint16_t *bits = (uint16_t *)host;
        for (size_t e = 0; e < n; e++)
            bits[e] = half_f32_to_bf16(host[e]);
    } else if (p != DDP_FP32) { /* float storage of 16-bit values */
        for (size_t e = 0; e < n; e++)
            host[e] = p == DDP_BF16 ? half_bf16_to_f32(half_f32_to_bf16(host[e]))
                                    : half_f16_to_f32(half_f32_to_f16(host[e]));
    }
    return ddp_upload(ops->ctx, dst, host, n * es);
}

ddp_status ops_weights_get(const ops_handle *ops, ddp_dtype p, float *host, const void *src,
                           size_t n)
{
    if (ops_dtype_size(ops, p) != 2)
        return ddp_download(ops->ctx, host, src, n * sizeof *host);
    size_t chunk = (size_t)1 << 20;
    uint16_t *bits = malloc((n < chunk ? (n ? n : 1) : chunk) * sizeof *bits);
    ddp_status st = bits ? DDP_OK : DDP_ERR_NOMEM;
    for (size_t at = 0; st == DDP_OK && at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        st = ddp_download(ops->ctx, bits, (const uint16_t *)src + at, k * sizeof *bits);
        for (size_t e = 0; st == DDP_OK && e < k; e++)
            host[at + e] = half_bf16_to_f32(bits[e]);
    }
    free(bits);
    return st;
}
