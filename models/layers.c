/* layers.c - linear, conv2d (im2col + gemm per image), ReLU, 2x2 max-pool and softmax
 * cross-entropy, forward and backward, over the backend ops table.
 */
#include <stdlib.h>

#include "layers.h"

/* ---- linear -------------------------------------------------------------------------------- */

ddp_status ddp_linear_fwd(const ddp_ops *ops, const float *x, const float *w, const float *b,
                          int batch, int in, int out, float *y)
{
    DDP_TRY_(ops->gemm(false, true, batch, out, in, 1.0f, x, w, 0.0f, y));
    return ops->bias_add(y, b, batch, out);
}

ddp_status ddp_linear_bwd_params(const ddp_ops *ops, const float *x, const float *dy, int batch,
                                 int in, int out, float *dw, float *db)
{
    DDP_TRY_(ops->gemm(true, false, out, in, batch, 1.0f, dy, x, 1.0f, dw));
    return ops->bias_grad(db, dy, batch, out);
}

ddp_status ddp_linear_bwd_input(const ddp_ops *ops, const float *w, const float *dy, int batch,
                                int in, int out, float *dx)
{
    return ops->gemm(false, false, batch, in, out, 1.0f, dy, w, 0.0f, dx);
}

/* ---- conv2d -------------------------------------------------------------------------------- */

ddp_status ddp_conv_init(const ddp_ops *ops, ddp_conv *cv, int c_in, int h, int w, int c_out, int k,
                         int pad)
{
    int h_out = h + 2 * pad - k + 1, w_out = w + 2 * pad - k + 1;
    if (c_in < 1 || c_out < 1 || k < 1 || pad < 0 || h_out < 1 || w_out < 1)
        return DDP_ERR_INVALID_ARG;
    *cv = (ddp_conv){.c_in = c_in, .h = h, .w = w, .c_out = c_out, .k = k, .pad = pad,
                     .h_out = h_out, .w_out = w_out};
    size_t n = (size_t)h_out * w_out;
    float *host = malloc(n * sizeof *host); // (h_out * w_out)
    cv->ones = ops->alloc(n * sizeof(float));
    ddp_status st = host && cv->ones ? DDP_OK : DDP_ERR_NOMEM;
    for (size_t i = 0; st == DDP_OK && i < n; i++)
        host[i] = 1.0f;
    if (st == DDP_OK)
        st = ops->upload(cv->ones, host, n * sizeof(float));
    free(host);
    if (st != DDP_OK)
        ddp_conv_release(ops, cv);
    return st;
}

void ddp_conv_release(const ddp_ops *ops, ddp_conv *cv)
{
    if (cv && ops)
        ops->free(cv->ones);
    if (cv)
        cv->ones = NULL;
}

size_t ddp_conv_col_numel(const ddp_conv *cv)
{
    return (size_t)cv->c_in * cv->k * cv->k * cv->h_out * cv->w_out;
}

ddp_status ddp_conv_fwd(const ddp_ops *ops, const ddp_conv *cv, const float *x, const float *w,
                        const float *b, int batch, float *col, float *y)
{
    int hw = cv->h_out * cv->w_out, ckk = cv->c_in * cv->k * cv->k;
    size_t x_numel = (size_t)cv->c_in * cv->h * cv->w, y_numel = (size_t)cv->c_out * hw;
    for (int n = 0; n < batch; n++) {
        float *col_n = col + n * ddp_conv_col_numel(cv); // (ckk, hw)
        float *y_n = y + n * y_numel;                     // (c_out, hw)
        DDP_TRY_(ops->im2col(x + n * x_numel, cv->c_in, cv->h, cv->w, cv->k, cv->pad, col_n));
        DDP_TRY_(ops->gemm(false, false, cv->c_out, hw, ckk, 1.0f, w, col_n, 0.0f, y_n));
        DDP_TRY_(ops->gemm(false, false, cv->c_out, hw, 1, 1.0f, b, cv->ones, 1.0f, y_n));
    }
    return DDP_OK;
}

ddp_status ddp_conv_bwd_params(const ddp_ops *ops, const ddp_conv *cv, const float *col,
                               const float *dy, int batch, float *dw, float *db)
{
    int hw = cv->h_out * cv->w_out, ckk = cv->c_in * cv->k * cv->k;
    for (int n = 0; n < batch; n++) {
        const float *dy_n = dy + (size_t)n * cv->c_out * hw; // (c_out, hw)
        const float *col_n = col + n * ddp_conv_col_numel(cv);
        DDP_TRY_(ops->gemm(false, true, cv->c_out, ckk, hw, 1.0f, dy_n, col_n, 1.0f, dw));
        DDP_TRY_(ops->gemm(false, false, cv->c_out, 1, hw, 1.0f, dy_n, cv->ones, 1.0f, db));
    }
    return DDP_OK;
}

ddp_status ddp_conv_bwd_input(const ddp_ops *ops, const ddp_conv *cv, const float *w,
                              const float *dy, int batch, float *dcol, float *dx)
{
    int hw = cv->h_out * cv->w_out, ckk = cv->c_in * cv->k * cv->k;
    size_t x_n = (size_t)cv->c_in * cv->h * cv->w;
    DDP_TRY_(ops->zero(dx, (size_t)batch * x_n * sizeof(float)));
    for (int n = 0; n < batch; n++) {
        const float *dy_n = dy + (size_t)n * cv->c_out * hw; // (c_out, hw)
        DDP_TRY_(ops->gemm(true, false, ckk, hw, cv->c_out, 1.0f, w, dy_n, 0.0f, dcol));
        DDP_TRY_(ops->col2im(dcol, cv->c_in, cv->h, cv->w, cv->k, cv->pad, dx + n * x_n));
    }
    return DDP_OK;
}

/* ---- ReLU, max-pool, loss ------------------------------------------------------------------ */

ddp_status ddp_relu_layer_fwd(const ddp_ops *ops, const float *x, size_t n, float *y)
{
    return ops->relu_fwd(y, x, n);
}

ddp_status ddp_relu_layer_bwd(const ddp_ops *ops, const float *dy, const float *y, size_t n,
                              float *dx)
{
    return ops->relu_bwd(dx, dy, y, n);
}

ddp_status ddp_pool_fwd(const ddp_ops *ops, const float *x, int planes, int h, int w, float *y,
                        int *argmax)
{
    return ops->maxpool_fwd(x, planes, h, w, y, argmax);
}

ddp_status ddp_pool_bwd(const ddp_ops *ops, const float *dy, const int *argmax, int planes, int h,
                        int w, float *dx)
{
    DDP_TRY_(ops->zero(dx, (size_t)planes * h * w * sizeof(float)));
    return ops->maxpool_bwd(dy, argmax, planes, h, w, dx);
}

ddp_status ddp_xent_fwd(const ddp_ops *ops, const float *logits, const int *labels, int batch,
                        int classes, float *dlogits, float *loss, int *correct)
{
    return ops->softmax_xent(logits, labels, batch, classes, dlogits, loss, correct);
}
