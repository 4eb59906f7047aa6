/* layers.h - forward and backward passes of the layers the reference models are made of (linear,
 * conv2d, ReLU, 2x2 max-pool, softmax cross-entropy), written against the backend ops table.
 * Private to models/ and its tests.
 *
 * Every pointer is backend memory. Backward functions ADD parameter gradients (dw, db) into their
 * outputs and OVERWRITE input gradients (dx); the parameter part and the input part are separate
 * calls, so a model can mark a layer's gradients ready before it computes the input gradient.
 */
#ifndef DDP_LAYERS_H
#define DDP_LAYERS_H

#include "backend.h"

/* Returns from the enclosing function with the status of `call` when it failed. */
#define DDP_TRY_(call)                          \
    do {                                        \
        ddp_status ddp_st_ = (call);            \
        if (ddp_st_ != DDP_OK)                  \
            return ddp_st_;                     \
    } while (0)

/* ---- linear: y (batch, out) = x (batch, in) W^T + b, W (out, in), b (out) ----------------- */

ddp_status ddp_linear_fwd(const ddp_ops *ops, const float *x, const float *w, const float *b,
                          int batch, int in, int out, float *y);
/* dw (out, in) += dy^T x; db (out) += column sums of dy (batch, out). */
ddp_status ddp_linear_bwd_params(const ddp_ops *ops, const float *x, const float *dy, int batch,
                                 int in, int out, float *dw, float *db);
/* dx (batch, in) = dy (batch, out) W. */
ddp_status ddp_linear_bwd_input(const ddp_ops *ops, const float *w, const float *dy, int batch,
                                int in, int out, float *dx);

/* ---- conv2d: stride 1, square kernel k, zero padding pad, NCHW ------------------------------ */

typedef struct ddp_conv {
    int c_in, h, w;      /* input image (c_in, h, w) */
    int c_out, k, pad;   /* weight (c_out, c_in, k, k), bias (c_out) */
    int h_out, w_out;    /* output image (c_out, h_out, w_out) */
    float *ones;         // (h_out * w_out) all ones, backend memory: bias as a rank-1 gemm
} ddp_conv;

/* Fills the shape and allocates the ones vector. DDP_ERR_INVALID_ARG for a bad shape,
 * DDP_ERR_NOMEM when the allocation fails. */
ddp_status ddp_conv_init(const ddp_ops *ops, ddp_conv *cv, int c_in, int h, int w, int c_out, int k,
                         int pad);
void ddp_conv_release(const ddp_ops *ops, ddp_conv *cv);
/* Elements of one image's im2col matrix: (c_in*k*k, h_out*w_out). */
size_t ddp_conv_col_numel(const ddp_conv *cv);

/* y (batch, c_out, h_out, w_out) from x (batch, c_in, h, w); col (batch, c_in*k*k, h_out*w_out)
 * receives every image's im2col matrix, which the backward pass reuses. */
ddp_status ddp_conv_fwd(const ddp_ops *ops, const ddp_conv *cv, const float *x, const float *w,
                        const float *b, int batch, float *col, float *y);
/* dw += sum over images of dy_n col_n^T; db += row sums of every dy_n. */
ddp_status ddp_conv_bwd_params(const ddp_ops *ops, const ddp_conv *cv, const float *col,
                               const float *dy, int batch, float *dw, float *db);
/* dx (batch, c_in, h, w) from dy; dcol is scratch of ddp_conv_col_numel() elements. */
ddp_status ddp_conv_bwd_input(const ddp_ops *ops, const ddp_conv *cv, const float *w,
                              const float *dy, int batch, float *dcol, float *dx);

/* ---- ReLU, max-pool, loss ----------------------------------------------------------------- */

ddp_status ddp_relu_layer_fwd(const ddp_ops *ops, const float *x, size_t n, float *y);
/* dx = dy where y > 0, else 0. */
ddp_status ddp_relu_layer_bwd(const ddp_ops *ops, const float *dy, const float *y, size_t n,
                              float *dx);

/* y (planes, h/2, w/2) and argmax from x (planes, h, w). */
ddp_status ddp_pool_fwd(const ddp_ops *ops, const float *x, int planes, int h, int w, float *y,
                        int *argmax);
/* dx (planes, h, w) = dy routed to each window's winner (dx is zeroed here first). */
ddp_status ddp_pool_bwd(const ddp_ops *ops, const float *dy, const int *argmax, int planes, int h,
                        int w, float *dx);

/* Mean cross-entropy of logits (batch, classes) against labels; dlogits may be NULL. */
ddp_status ddp_xent_fwd(const ddp_ops *ops, const float *logits, const int *labels, int batch,
                        int classes, float *dlogits, float *loss, int *correct);

#endif /* DDP_LAYERS_H */
