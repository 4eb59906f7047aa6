/* layers.h - forward and backward passes of the layers the reference models are made of (linear,
 * conv2d, ReLU, 2x2 max-pool, softmax cross-entropy), written against the ops handle.
 * Private to models/ and its tests.
 *
 * Every pointer is backend memory. Activations (void *) are stored in precision p (ops.h);
 * weights w are the model's compute copy in p; biases and gradients dw, db are fp32. A backend
 * without the precision-aware ops (ops.h's second group) runs fp32 on its primitives (im2col +
 * GEMM convolutions, argmax max-pool). Backward functions ADD parameter gradients (dw, db) into their
 * outputs and OVERWRITE input gradients (dx); the parameter part and the input part are separate
 * calls, so a model can mark a layer's gradients ready before it computes the input gradient.
 */
#ifndef LAYERS_H
#define LAYERS_H

#include "ops.h"

/* ---- linear: y (batch, out) = x (batch, in) W^T + b, W (out, in), b (out) ----------------- */

/* y is fp32 when y_fp32 (logits), else in p. */
ddp_status layer_linear_fwd(const ops_handle *ops, ddp_dtype p, const void *x, const void *w,
                            const float *b, int batch, int in, int out, void *y, bool y_fp32);
/* dw (out, in) += dy^T x; db (out) += column sums of dy (batch, out); a NULL dw or db is skipped;
 * accumulate false overwrites dw and db instead (their old contents are not read). */
ddp_status layer_linear_bwd_params(const ops_handle *ops, ddp_dtype p, const void *x, const void *dy,
                                   int batch, int in, int out, float *dw, float *db,
                                   bool accumulate);
/* dx (batch, in) = dy (batch, out) W. */
ddp_status layer_linear_bwd_input(const ops_handle *ops, ddp_dtype p, const void *w, const void *dy,
                                  int batch, int in, int out, void *dx);

/* ---- conv2d: stride 1, square kernel k, zero padding pad, NCHW ------------------------------ */

typedef struct layer_conv {
    int c_in, h, w;      /* input image (c_in, h, w) */
    int c_out, k, pad;   /* weight (c_out, c_in, k, k), bias (c_out) */
    int h_out, w_out;    /* output image (c_out, h_out, w_out) */
    float *ones;         // (h_out * w_out) all ones, backend memory: bias as a rank-1 gemm
} layer_conv;

/* Fills the shape and allocates the ones vector. DDP_ERR_INVALID_ARG for a bad shape,
 * DDP_ERR_NOMEM when the allocation fails. */
ddp_status layer_conv_init(const ops_handle *ops, layer_conv *cv, int c_in, int h, int w, int c_out, int k,
                           int pad);
void layer_conv_release(const ops_handle *ops, layer_conv *cv);
/* Elements of one image's im2col matrix: (c_in*k*k, h_out*w_out). */
size_t layer_conv_col_numel(const layer_conv *cv);
/* Whether ops convolves without im2col (then the col buffers below are unused and may be NULL). */
bool layer_conv_direct(const ops_handle *ops);

/* y (batch, c_out, h_out, w_out) from x (batch, c_in, h, w); on the im2col path col (batch,
 * c_in*k*k, h_out*w_out) receives every image's im2col matrix, which the backward pass reuses. */
ddp_status layer_conv_fwd(const ops_handle *ops, ddp_dtype p, const layer_conv *cv, const void *x,
                          const void *w, const float *b, int batch, float *col, void *y);
/* dw += the weight gradient, db += the bias gradient, from x (or col) and dy (accumulate false:
 * overwritten). */
ddp_status layer_conv_bwd_params(const ops_handle *ops, ddp_dtype p, const layer_conv *cv,
                                 const void *x, const float *col, const void *dy, int batch,
                                 float *dw, float *db, bool accumulate);
/* dx (batch, c_in, h, w) from dy; dcol is scratch of layer_conv_col_numel() elements (im2col path). */
ddp_status layer_conv_bwd_input(const ops_handle *ops, ddp_dtype p, const layer_conv *cv,
                                const void *w, const void *dy, int batch, float *dcol, void *dx);

/* ---- ReLU, max-pool, loss ----------------------------------------------------------------- */

ddp_status layer_relu_fwd(const ops_handle *ops, ddp_dtype p, const void *x, size_t n, void *y);
/* dx = dy where y > 0, else 0 (dx may alias dy). */
ddp_status layer_relu_bwd(const ops_handle *ops, ddp_dtype p, const void *dy, const void *y,
                          size_t n, void *dx);

/* y (n, c, h/2, w/2) from x (n, c, h, w) images; arg (ws_bytes, at least one int per output)
 * keeps the winners (or the backend's workspace) for the backward pass. */
ddp_status layer_pool_fwd(const ops_handle *ops, ddp_dtype p, const void *x, int n, int c, int h,
                          int w, void *y, int *arg, size_t ws_bytes);
/* dx (n, c, h, w) = dy routed to each window's winner. */
ddp_status layer_pool_bwd(const ops_handle *ops, ddp_dtype p, const void *dy, const int *arg, int n,
                          int c, int h, int w, void *dx);
/* Images in the backend's layout as NCHW rows (for a linear layer), and back: on a channels-last
 * backend a reorder into `tmp`, returned; otherwise `img` itself. NULL when the reorder failed. */
const void *layer_image_as_rows(const ops_handle *ops, ddp_dtype p, const void *img, void *tmp,
                                int n, int c, int h, int w);
ddp_status layer_rows_to_image(const ops_handle *ops, ddp_dtype p, const void *rows, void *img,
                               int n, int c, int h, int w);

/* Mean cross-entropy of fp32 logits (batch, classes) against labels; dlogits (fp32) may be NULL. */
ddp_status layer_xent_fwd(const ops_handle *ops, const float *logits, const int *labels, int batch,
                          int classes, float *dlogits, float *loss, int *correct);

#endif /* LAYERS_H */
