/* layers.c - linear, conv2d, ReLU, 2x2 max-pool and softmax cross-entropy, forward and backward,
 * over the backend ops table: the precision-aware ops where the backend has them (oneDNN and
 * OpenBLAS on the CPU), else fp32 primitives (im2col + GEMM per image, argmax max-pool).
 */
#include <stdlib.h>

#include "layers.h"

/* The fp32 fallback serves only fp32 (model creation checks the precision first, but a table
 * may lack one layer's 16-bit op, e.g. the GPU's convolutions without cuDNN): logs which. */
static ddp_status fp32_only(const ops_handle *ops, ddp_dtype p, const char *layer)
{
    if (p == DDP_FP32)
        return DDP_OK;
    DDP_ERROR("%s: the %s backend has this layer in fp32 only (no 16-bit op); use --precision fp32",
              layer, ops->name);
    return DDP_ERR_UNSUPPORTED;
}

/* ---- linear -------------------------------------------------------------------------------- */

ddp_status layer_linear_fwd(const ops_handle *ops, ddp_dtype p, const void *x, const void *w,
                            const float *b, int batch, int in, int out, void *y, bool y_fp32)
{
    if (ops->linear_fwd)
        return ops->linear_fwd(ops, p, x, w, b, batch, in, out, y, y_fp32);
    TRY_OK(fp32_only(ops, p, __func__));
    TRY_OK(ops->gemm(ops, false, true, batch, out, in, 1.0f, x, w, 0.0f, y));
    return ops->bias_add(ops, y, b, batch, out);
}

ddp_status layer_linear_bwd_params(const ops_handle *ops, ddp_dtype p, const void *x, const void *dy,
                                   int batch, int in, int out, float *dw, float *db,
                                   bool accumulate)
{
    if (ops->linear_bwd_params)
        return ops->linear_bwd_params(ops, p, x, dy, batch, in, out, dw, db, accumulate);
    TRY_OK(fp32_only(ops, p, __func__));
    if (dw)
        TRY_OK(ops->gemm(ops, true, false, out, in, batch, 1.0f, dy, x, accumulate ? 1.0f : 0.0f, dw));
    if (db && !accumulate)
        TRY_OK(ddp_zero(ops->ctx, db, (size_t)out * sizeof *db));
    return db ? ops->bias_grad(ops, db, dy, batch, out) : DDP_OK;
}

ddp_status layer_linear_bwd_input(const ops_handle *ops, ddp_dtype p, const void *w, const void *dy,
                                  int batch, int in, int out, void *dx)
{
    if (ops->linear_bwd_input)
        return ops->linear_bwd_input(ops, p, w, dy, batch, in, out, dx);
    TRY_OK(fp32_only(ops, p, __func__));
    return ops->gemm(ops, false, false, batch, in, out, 1.0f, dy, w, 0.0f, dx);
}

/* ---- conv2d -------------------------------------------------------------------------------- */

ddp_status layer_conv_init(const ops_handle *ops, layer_conv *cv, int c_in, int h, int w, int c_out, int k,
                           int pad)
{
    int h_out = h + 2 * pad - k + 1, w_out = w + 2 * pad - k + 1;
    if (c_in < 1 || c_out < 1 || k < 1 || pad < 0 || h_out < 1 || w_out < 1)
        return DDP_ERR_INVALID_ARG;
    *cv = (layer_conv){.c_in = c_in, .h = h, .w = w, .c_out = c_out, .k = k, .pad = pad,
                     .h_out = h_out, .w_out = w_out};
    size_t n = (size_t)h_out * w_out;
    float *host = malloc(n * sizeof *host); // (h_out * w_out)
    cv->ones = ddp_alloc(ops->ctx, n * sizeof(float));
    ddp_status st = host && cv->ones ? DDP_OK : DDP_ERR_NOMEM;
    for (size_t i = 0; st == DDP_OK && i < n; i++)
        host[i] = 1.0f;
    if (st == DDP_OK)
        st = ddp_upload(ops->ctx, cv->ones, host, n * sizeof(float));
    free(host);
    if (st != DDP_OK)
        layer_conv_release(ops, cv);
    return st;
}

void layer_conv_release(const ops_handle *ops, layer_conv *cv)
{
    if (cv && ops)
        ddp_free(ops->ctx, cv->ones);
    if (cv)
        cv->ones = NULL;
}

size_t layer_conv_col_numel(const layer_conv *cv)
{
    return (size_t)cv->c_in * cv->k * cv->k * cv->h_out * cv->w_out;
}

bool layer_conv_direct(const ops_handle *ops)
{
    return ops->conv_fwd && ops->conv_bwd_params && ops->conv_bwd_input;
}

static ops_conv_shape ops_conv_shape_of(const layer_conv *cv)
{
    return (ops_conv_shape){.c_in = cv->c_in, .h = cv->h, .w = cv->w, .c_out = cv->c_out,
                            .k = cv->k, .pad = cv->pad, .h_out = cv->h_out, .w_out = cv->w_out};
}

ddp_status layer_conv_fwd(const ops_handle *ops, ddp_dtype p, const layer_conv *cv, const void *x,
                          const void *w, const float *b, int batch, float *col, void *y)
{
    if (layer_conv_direct(ops)) {
        ops_conv_shape s = ops_conv_shape_of(cv);
        return ops->conv_fwd(ops, p, &s, batch, x, w, b, y);
    }
    TRY_OK(fp32_only(ops, p, __func__));
    int hw = cv->h_out * cv->w_out, ckk = cv->c_in * cv->k * cv->k;
    size_t x_numel = (size_t)cv->c_in * cv->h * cv->w, y_numel = (size_t)cv->c_out * hw;
    for (int n = 0; n < batch; n++) {
        float *col_n = col + n * layer_conv_col_numel(cv); // (ckk, hw)
        float *y_n = (float *)y + n * y_numel;            // (c_out, hw)
        TRY_OK(ops->im2col(ops, (const float *)x + n * x_numel, cv->c_in, cv->h, cv->w, cv->k, cv->pad,
                           col_n));
        TRY_OK(ops->gemm(ops, false, false, cv->c_out, hw, ckk, 1.0f, w, col_n, 0.0f, y_n));
        TRY_OK(ops->gemm(ops, false, false, cv->c_out, hw, 1, 1.0f, b, cv->ones, 1.0f, y_n));
    }
    return DDP_OK;
}

ddp_status layer_conv_bwd_params(const ops_handle *ops, ddp_dtype p, const layer_conv *cv,
                                 const void *x, const float *col, const void *dy, int batch,
                                 float *dw, float *db, bool accumulate)
{
    if (layer_conv_direct(ops)) {
        ops_conv_shape s = ops_conv_shape_of(cv);
        return ops->conv_bwd_params(ops, p, &s, batch, x, dy, dw, db, accumulate);
    }
    TRY_OK(fp32_only(ops, p, __func__));
    int hw = cv->h_out * cv->w_out, ckk = cv->c_in * cv->k * cv->k;
    if (!accumulate) {
        TRY_OK(ddp_zero(ops->ctx, dw, (size_t)cv->c_out * ckk * sizeof *dw));
        TRY_OK(ddp_zero(ops->ctx, db, (size_t)cv->c_out * sizeof *db));
    }
    for (int n = 0; n < batch; n++) {
        const float *dy_n = (const float *)dy + (size_t)n * cv->c_out * hw; // (c_out, hw)
        const float *col_n = col + n * layer_conv_col_numel(cv);
        TRY_OK(ops->gemm(ops, false, true, cv->c_out, ckk, hw, 1.0f, dy_n, col_n, 1.0f, dw));
        TRY_OK(ops->gemm(ops, false, false, cv->c_out, 1, hw, 1.0f, dy_n, cv->ones, 1.0f, db));
    }
    return DDP_OK;
}

ddp_status layer_conv_bwd_input(const ops_handle *ops, ddp_dtype p, const layer_conv *cv,
                                const void *w, const void *dy, int batch, float *dcol, void *dx)
{
    if (layer_conv_direct(ops)) {
        ops_conv_shape s = ops_conv_shape_of(cv);
        return ops->conv_bwd_input(ops, p, &s, batch, w, dy, dx);
    }
    TRY_OK(fp32_only(ops, p, __func__));
    int hw = cv->h_out * cv->w_out, ckk = cv->c_in * cv->k * cv->k;
    size_t x_n = (size_t)cv->c_in * cv->h * cv->w;
    TRY_OK(ddp_zero(ops->ctx, dx, (size_t)batch * x_n * sizeof(float)));
    for (int n = 0; n < batch; n++) {
        const float *dy_n = (const float *)dy + (size_t)n * cv->c_out * hw; // (c_out, hw)
        TRY_OK(ops->gemm(ops, true, false, ckk, hw, cv->c_out, 1.0f, w, dy_n, 0.0f, dcol));
        TRY_OK(ops->col2im(ops, dcol, cv->c_in, cv->h, cv->w, cv->k, cv->pad, (float *)dx + n * x_n));
    }
    return DDP_OK;
}

/* ---- ReLU, max-pool, loss ------------------------------------------------------------------ */

ddp_status layer_relu_fwd(const ops_handle *ops, ddp_dtype p, const void *x, size_t n, void *y)
{
    if (ops->act_relu_fwd)
        return ops->act_relu_fwd(ops, p, y, x, n);
    TRY_OK(fp32_only(ops, p, __func__));
    return ops->relu_fwd(ops, y, x, n);
}

ddp_status layer_relu_bwd(const ops_handle *ops, ddp_dtype p, const void *dy, const void *y,
                          size_t n, void *dx)
{
    if (ops->act_relu_bwd)
        return ops->act_relu_bwd(ops, p, dx, dy, y, n);
    TRY_OK(fp32_only(ops, p, __func__));
    return ops->relu_bwd(ops, dx, dy, y, n);
}

ddp_status layer_pool_fwd(const ops_handle *ops, ddp_dtype p, const void *x, int n, int c, int h,
                          int w, void *y, int *arg, size_t ws_bytes)
{
    if (ops->pool_fwd && ops->pool_bwd)
        return ops->pool_fwd(ops, p, x, n, c, h, w, y, arg, ws_bytes);
    TRY_OK(fp32_only(ops, p, __func__));
    return ops->maxpool_fwd(ops, x, n * c, h, w, y, arg);
}

ddp_status layer_pool_bwd(const ops_handle *ops, ddp_dtype p, const void *dy, const int *arg, int n,
                          int c, int h, int w, void *dx)
{
    if (ops->pool_fwd && ops->pool_bwd)
        return ops->pool_bwd(ops, p, dy, arg, n, c, h, w, dx);
    TRY_OK(fp32_only(ops, p, __func__));
    TRY_OK(ddp_zero(ops->ctx, dx, (size_t)n * c * h * w * sizeof(float)));
    return ops->maxpool_bwd(ops, dy, arg, n * c, h, w, dx);
}

const void *layer_image_as_rows(const ops_handle *ops, ddp_dtype p, const void *img, void *tmp,
                                int n, int c, int h, int w)
{
    if (!ops->channels_last || c == 1)
        return img;
    return ops->image_reorder(ops, p, img, tmp, n, c, h, w, true) == DDP_OK ? tmp : NULL;
}

ddp_status layer_rows_to_image(const ops_handle *ops, ddp_dtype p, const void *rows, void *img,
                               int n, int c, int h, int w)
{
    if (!ops->channels_last || c == 1)
        return rows == img ? DDP_OK : ddp_copy(ops->ctx, img, rows, (size_t)n * c * h * w * ops_dtype_size(ops, p));
    return ops->image_reorder(ops, p, rows, img, n, c, h, w, false);
}

ddp_status layer_xent_fwd(const ops_handle *ops, const float *logits, const int *labels, int batch,
                          int classes, float *dlogits, float *loss, int *correct)
{
    return ops->softmax_xent(ops, logits, labels, batch, classes, dlogits, loss, correct);
}
