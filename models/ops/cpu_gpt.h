/* cpu_gpt.h - the CPU's transformer ops (cpu_gpt.c), for the CPU ops table (ops_cpu.c). Private to
 * models/ops/. Semantics, shapes and what each output overwrites or adds: ops.h, section
 * "transformer ops". Every function returns DDP_ERR_INVALID_ARG (logged) for a shape that is not
 * positive (C not divisible by NH, Vp < V, a step t < 1), DDP_ERR_NOMEM (logged) when the fp32
 * copies of bf16-stored activations cannot be allocated, DDP_OK otherwise.
 * Aliasing: only what ops.h allows (gelu_bwd's dx and dy, add's y with a or b, xent_fwd_bwd's
 * dlogits and logits); layernorm_bwd's dx, dx_act, dw, db and adamw_step's four buffers must be
 * distinct from each other and from the inputs (the loops are compiled with restrict).
 */
#ifndef OPS_CPU_GPT_H
#define OPS_CPU_GPT_H

#include <stddef.h>

#include "ops.h"

ddp_status ops_cpu_encoder_fwd(const ops_handle *ops, float *out, const int *tokens,
                               ddp_dtype wp, const void *wte, const float *wpe, int B, int T,
                               int C);
ddp_status ops_cpu_encoder_bwd(const ops_handle *ops, float *dwte, float *dwpe, const float *dout,
                               const int *tokens, int B, int T, int C);
ddp_status ops_cpu_layernorm_fwd(const ops_handle *ops, ddp_dtype act, void *out, float *mean,
                                 float *rstd, const float *x, const float *w, const float *b,
                                 int rows, int C);
ddp_status ops_cpu_layernorm_bwd(const ops_handle *ops, ddp_dtype act, float *dx, void *dx_act,
                                 float *dw, float *db, const void *dout, const float *x,
                                 const float *w, const float *mean, const float *rstd, int rows,
                                 int C);
ddp_status ops_cpu_attention_fwd(const ops_handle *ops, ddp_dtype p, ddp_dtype act, void *out,
                                 float *att, const void *qkv, int B, int T, int C, int NH);
ddp_status ops_cpu_attention_bwd(const ops_handle *ops, ddp_dtype p, ddp_dtype act, void *dqkv,
                                 float *datt, const void *dout, const void *qkv, const float *att,
                                 int B, int T, int C, int NH);
size_t ops_cpu_attention_floats(const ops_handle *ops, ddp_dtype p, int B, int T, int C, int NH);
ddp_status ops_cpu_gelu_fwd(const ops_handle *ops, ddp_dtype act, void *y, const void *x,
                            size_t n);
ddp_status ops_cpu_gelu_bwd(const ops_handle *ops, ddp_dtype act, void *dx, const void *x,
                            const void *dy, size_t n);
ddp_status ops_cpu_add(const ops_handle *ops, ddp_dtype act, float *y, const float *a,
                       const void *b, size_t n);
ddp_status ops_cpu_xent_fwd_bwd(const ops_handle *ops, ddp_dtype act, void *dlogits,
                                float *losses, const void *logits, const int *targets, int rows,
                                int V, int Vp, float dscale);
ddp_status ops_cpu_adamw_step(const ops_handle *ops, float *w, float *m, float *v, const float *g,
                              size_t n, float lr, float beta1, float beta2, float eps, float wd,
                              int t, float grad_scale, const float *grad_scale_dev);
/* adamw_step_cast's bf16 (ops.h): ops_cpu_adamw_step's w, m, v bit for bit, and each new weight
 * rounded stochastically (math_shared.h) by (seed, t, index0 + i) into wc as bf16 bits, or with
 * wc NULL into wf as the bf16 values in floats (emulated bf16). */
ddp_status ops_cpu_adamw_bf16(float *w, float *m, float *v, const float *g, size_t n, float lr,
                              float beta1, float beta2, float eps, float wd, int t,
                              float grad_scale, uint16_t *wc, float *wf, uint32_t seed,
                              size_t index0);
/* cast_stochastic's bf16: src rounded by (seed, step, index0 + i) into wc or wf as above. */
void ops_cpu_cast_bf16_sr(const float *src, size_t n, uint32_t seed, uint32_t step, size_t index0,
                          uint16_t *wc, float *wf);

#endif /* OPS_CPU_GPT_H */
