/* gpt2.c - GPT-2 (gpt2.h) on an ops handle: the weights (in the compute precision) and their fp32
 * gradients each in ONE backend allocation in llm.c's tensor-major layout (in 16 bits also the
 * fp32 widening of the small slices read in fp32), activations sized for max_batch x seq, and the
 * forward and backward
 * passes (each parameter slice marked ready as soon as its gradient is final). With
 * opts.reducer_grads there is no gradient allocation: backward writes each slice where the
 * reducer says (its bucket's buffer, ZeRO stage 2). The optimizer, AdamW with its moments and in 16
 * bits the fp32 master weights, is the trainer's (train/optim.c); llm.c's model files are in
 * gpt2_llmc.c.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_trace.h"
#include "gpt2_private.h"
#include "half.h"
#include "layers.h"
#include "switches.h"

/* The tensors of the flat buffer, in llm.c's order; T_LN1W .. T_FCPROJB have one slice per
 * layer. */
enum {
    T_WTE,      // (Vp, C)
    T_WPE,      // (maxT, C)
    T_LN1W,     // (L, C)
    T_LN1B,     // (L, C)
    T_QKVW,     // (L, 3C, C)
    T_QKVB,     // (L, 3C)
    T_ATTPROJW, // (L, C, C)
    T_ATTPROJB, // (L, C)
    T_LN2W,     // (L, C)
    T_LN2B,     // (L, C)
    T_FCW,      // (L, 4C, C)
    T_FCB,      // (L, 4C)
    T_FCPROJW,  // (L, C, 4C)
    T_FCPROJB,  // (L, C)
    T_LNFW,     // (C)
    T_LNFB,     // (C)
    N_TENSORS
};
#define LAYER_TENSORS (T_FCPROJB - T_LN1W + 1)
#define MAX_BUFS 40

/* PyTorch's names of the per-layer tensors (after "h.<l>."). */
static const char *const layer_names[LAYER_TENSORS] = {
    "ln_1.weight",      "ln_1.bias",      "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",      "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",  "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* What the backward pass reads, per layer where a layer's is needed (sized for max_batch x seq;
 * a pass on B x T uses the first B*T rows of each layer's slice). "in p": stored in the model's
 * precision, as the linear ops read them (fp32: the same as float); "in act": in the activation
 * precision (g->act: p in a bf16 run, so that nothing is cast between layers; fp32 otherwise).
 * Ls is 1 with opts.recompute (one slot that every layer's forward writes and backward's
 * recomputation refills), else L. */
typedef struct gpt2_acts {
    float *encoded;   // (B, T, C) embeddings: the residual stream entering layer 0
    void *ln1;        // (Ls, B, T, C) in p: ln_1's output, c_attn's input
    float *ln1_mean;  // (Ls, B, T)
    float *ln1_rstd;  // (Ls, B, T)
    void *qkv;        // (Ls, B, T, 3C) in act
    float *att;       // (Ls, attention_floats) attention's state: the probabilities
                      // (B, NH, T, T) or the fused kernel's output and log-sum-exp
    void *atty;       // (Ls, B, T, C) in p: attention output, attn.c_proj's input
    float *residual2; // (Ls, B, T, C) residual stream after attention
    void *ln2;        // (Ls, B, T, C) in p: ln_2's output, c_fc's input
    float *ln2_mean;  // (Ls, B, T)
    float *ln2_rstd;  // (Ls, B, T)
    void *fch;        // (Ls, B, T, 4C) in act: c_fc's output (GELU's input)
    void *fch_gelu;   // (Ls, B, T, 4C) in p: GELU's output, mlp.c_proj's input
    float *residual3; // (L, B, T, C) residual stream after the MLP: the block outputs, kept
                      // for every layer (layer l's input is residual3 of l - 1)
    void *lnf;        // (B, T, C) in p: ln_f's output, the LM head's input
    float *lnf_mean;  // (B, T)
    float *lnf_rstd;  // (B, T)
    void *logits;     // (B, T, Vp) in lt; their gradient after a forward pass for backward
    float *losses;    // (B, T)
    int *tokens;      // (B, T) the last forward pass's input (encoder_bwd reads it)
    void *proj;       // (B, T, C) in act: a projection's output before the residual add
    float *scratch;   // (B, T, 4C) an op's fp32 output before its cast to p (casts only)
} gpt2_acts;

/* Gradients of activations, reused by every layer ("casts only": the fp32-activation path of a
 * 16-bit run, gpt2.h's DDP_GPT_ACTIVATIONS=fp32). */
typedef struct gpt2_dacts {
    float *dresidual; // (B, T, C) the residual stream's
    void *dres_act;   // (B, T, C) in act: dresidual as the projections' backward reads it
                      // (written by LayerNorm's backward; act 16-bit only)
    void *dln;        // (B, T, C) in act: a LayerNorm output's
    void *datty;      // (B, T, C) in act
    void *dqkv;       // (B, T, 3C) in act
    float *datt;      // scratch of attention_bwd (the ops' attention_floats)
    void *dfch;       // (B, T, 4C) in act
    void *dy_c;       // (B, T, 4C) in p: a linear's output gradient (casts only)
    void *dx_c;       // (B, T, 4C) in p: a linear's input gradient (casts only)
    void *dlogits_c;  // (B, T, Vp) in p (16-bit p with fp32 logits only)
} gpt2_dacts;

struct gpt2 {
    ddp_ctx *ctx; /* whose memory the buffers are (NULL: host memory) */
    const ops_handle *ops;
    gpt2_config cfg;
    gpt2_opts opts;
    size_t es;                        /* bytes per element of the precision's storage */
    ddp_dtype act;                    /* the activations' precision (gpt2_acts' "in act") */
    size_t ea;                        /* bytes per element of its storage */
    ddp_dtype lt;                     /* the logits' ("in lt"): act, or fp32 with
                                         DDP_GPT_LOGITS16=0 (switches.h) */
    size_t el;                        /* bytes per element of its storage */
    int n_params;                     /* slices: 2 + 12 L + 2 */
    ddp_param_desc *descs;            // (n_params)
    size_t *numel;                    // (n_params)
    size_t *offset;                   // (n_params)
    unsigned char *tensor_of;         // (n_params) the tensor each slice belongs to
    size_t numel_total;
    /* The weights the passes read, in the precision's storage: in fp32 the master weights
     * (the optimizer's to update); in 16 bits the master is the optimizer's (train/optim.h). */
    void *weights;   // (numel_total)
    float *grads;    // (numel_total); NULL with opts.reducer_grads
    ddp_reducer *grad_r; /* opts.reducer_grads: the reducer of the backward pass under way */
    ddp_reducer *gather; /* gpt2_set_gather: forward waits for its all-gather slice by slice */
    /* 16 bits: what the passes read in fp32 (wpe, LayerNorm, the biases: param()) is the weights
     * widened, as llm.c reads bf16 weights, at the start of each part of every forward pass
     * (layer_ready). rparams holds those slices back to back, slice i at roff[i] (SIZE_MAX: read
     * in the precision itself: the matmul weights, and wte, which the encoder reads as it is).
     * NULL in fp32. */
    float *rparams;
    size_t *roff;    // (n_params)
    const float *master; /* gpt2_set_master: the fp32 master the passes read instead (NULL) */
    gpt2_acts a;
    gpt2_dacts d;
    void *bufs[MAX_BUFS];
    int n_bufs;
    bool alloc_failed;
    size_t act_bytes;
    int B, T;      /* the last forward pass's batch */
    bool pending;  /* a forward pass for backward has not been differentiated yet */
};

/* ---- configuration ------------------------------------------------------------------------- */

ddp_status gpt2_config_preset(const char *name, gpt2_config *cfg)
{
    static const struct {
        const char *name;
        int layers, heads, channels;
    } presets[] = {{"d12", 12, 12, 768}, {"d24", 24, 16, 1024}, {"d36", 36, 20, 1280},
                   {"d48", 48, 25, 1600}};
    for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) != 0)
            continue;
        *cfg = (gpt2_config){.max_seq = 1024, .vocab = GPT2_VOCAB, .padded_vocab = 50304,
                             .layers = presets[i].layers, .heads = presets[i].heads,
                             .channels = presets[i].channels};
        return DDP_OK;
    }
    return DDP_ERR_INVALID_ARG;
}

/* DDP_ERR_INVALID_ARG with a log line unless lo <= v <= hi. */
static ddp_status check_range(const char *field, int v, int lo, int hi)
{
    if (v >= lo && v <= hi)
        return DDP_OK;
    DDP_ERROR("gpt2 configuration: %s = %d outside [%d, %d]", field, v, lo, hi);
    return DDP_ERR_INVALID_ARG;
}

ddp_status gpt2_config_check(gpt2_config *cfg)
{
    if (!cfg)
        return DDP_ERR_INVALID_ARG;
    TRY_OK(check_range("max_seq", cfg->max_seq, 1, 1 << 20));
    TRY_OK(check_range("vocab", cfg->vocab, 1, 1 << 24));
    TRY_OK(check_range("layers", cfg->layers, 1, GPT2_MAX_LAYERS));
    TRY_OK(check_range("heads", cfg->heads, 1, 1 << 10));
    TRY_OK(check_range("channels", cfg->channels, 1, 1 << 16));
    if (cfg->channels % cfg->heads != 0) {
        DDP_ERROR("gpt2 configuration: channels %d not divisible by heads %d", cfg->channels,
                  cfg->heads);
        return DDP_ERR_INVALID_ARG;
    }
    if (cfg->padded_vocab == 0)
        cfg->padded_vocab = (cfg->vocab + 127) / 128 * 128;
    return check_range("padded_vocab", cfg->padded_vocab, cfg->vocab, (1 << 24) + 128);
}

size_t gpt2_config_n_params(const gpt2_config *cfg)
{
    size_t c = (size_t)cfg->channels, per_layer = 12 * c * c + 13 * c;
    return (size_t)cfg->vocab * c + (size_t)cfg->max_seq * c + (size_t)cfg->layers * per_layer +
           2 * c;
}

/* ---- parameters ---------------------------------------------------------------------------- */

/* Rows and columns of one slice of tensor t (columns 0: a 1-D slice). */
static void tensor_shape(const gpt2_config *cfg, int t, int64_t *rows, int64_t *cols)
{
    int64_t c = cfg->channels;
    static const int mult_rows[N_TENSORS] = {0, 0, 1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1, 1, 1};
    *rows = c * mult_rows[t];
    *cols = t == T_QKVW || t == T_ATTPROJW || t == T_FCW ? c : t == T_FCPROJW ? 4 * c : 0;
    if (t == T_WTE || t == T_WPE) {
        *rows = t == T_WTE ? cfg->padded_vocab : cfg->max_seq;
        *cols = c;
    }
}

static void add_slice(gpt2 *g, int t, const char *name)
{
    int i = g->n_params++;
    ddp_param_desc *d = &g->descs[i];
    int64_t rows, cols;
    tensor_shape(&g->cfg, t, &rows, &cols);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->n_dims = cols ? 2 : 1;
    d->shape[0] = rows;
    d->shape[1] = cols;
    g->numel[i] = ddp_param_numel(d);
    g->offset[i] = g->numel_total;
    g->tensor_of[i] = (unsigned char)t;
    g->numel_total += g->numel[i];
}

/* The parameter table, in buffer order. DDP_ERR_NOMEM. */
static ddp_status describe_params(gpt2 *g)
{
    int n = 4 + LAYER_TENSORS * g->cfg.layers;
    g->descs = calloc((size_t)n, sizeof *g->descs);
    g->numel = calloc((size_t)n, sizeof *g->numel);
    g->offset = calloc((size_t)n, sizeof *g->offset);
    g->tensor_of = calloc((size_t)n, sizeof *g->tensor_of);
    if (!g->descs || !g->numel || !g->offset || !g->tensor_of)
        return DDP_ERR_NOMEM;
    char name[DDP_NAME_MAX];
    add_slice(g, T_WTE, "wte.weight");
    add_slice(g, T_WPE, "wpe.weight");
    for (int t = T_LN1W; t <= T_FCPROJB; t++) {
        for (int l = 0; l < g->cfg.layers; l++) {
            snprintf(name, sizeof name, "h.%d.%s", l, layer_names[t - T_LN1W]);
            add_slice(g, t, name);
        }
    }
    add_slice(g, T_LNFW, "ln_f.weight");
    add_slice(g, T_LNFB, "ln_f.bias");
    return DDP_OK;
}

/* Index in the parameter table of tensor t's slice of layer l (l ignored for the others). */
static int slice(const gpt2 *g, int t, int l)
{
    if (t >= T_LN1W && t <= T_FCPROJB)
        return 2 + (t - T_LN1W) * g->cfg.layers + l;
    return t == T_WTE ? 0 : t == T_WPE ? 1 : g->n_params - (t == T_LNFW ? 2 : 1);
}

/* Tensor t's slice of layer l as the passes read it in fp32 (never a matmul weight nor wte): the
 * weights, or in 16 bits their widened copy (rparams) or the master (gpt2_set_master). */
static const float *param(gpt2 *g, int t, int l)
{
    int i = slice(g, t, l);
    if (g->master)
        return g->master + g->offset[i];
    return g->rparams ? g->rparams + g->roff[i] : (float *)g->weights + g->offset[i];
}

/* Whether tensor t is read in fp32 by param() (all but the four matmul weights and wte). */
static bool read_in_fp32(int t)
{
    return t != T_QKVW && t != T_ATTPROJW && t != T_FCW && t != T_FCPROJW && t != T_WTE;
}

/* Where backward adds tensor t's slice of layer l's gradient: the flat buffer, or with
 * opts.reducer_grads the place the reducer gives it in this micro-step (inside its bucket's
 * buffer, zeroed when the bucket takes it). Every gradient access goes through here. */
static ddp_status grad(gpt2 *g, int t, int l, float **out)
{
    int i = slice(g, t, l);
    if (!g->opts.reducer_grads) {
        *out = g->grads + g->offset[i];
        return DDP_OK;
    }
    void *p = NULL;
    ddp_status st = ddp_reducer_grad_ptr(g->grad_r, i, &p);
    *out = p;
    return st;
}
/* A weight in the model's precision: what the matmuls read. */
static const void *cweight(gpt2 *g, int t, int l)
{
    return (const char *)g->weights + g->offset[slice(g, t, l)] * g->es;
}

/* GPT-2's initialisation of slice i into host (numel[i] floats). */
static void init_slice(const gpt2 *g, int i, float *host)
{
    int t = g->tensor_of[i];
    size_t n = g->numel[i];
    float std = 0.02f;
    if (t == T_ATTPROJW || t == T_FCPROJW)
        std = 0.02f / sqrtf(2.0f * (float)g->cfg.layers);
    if (t == T_LN1W || t == T_LN2W || t == T_LNFW) {
        for (size_t e = 0; e < n; e++)
            host[e] = 1.0f;
    } else if (g->descs[i].n_dims == 1) {
        memset(host, 0, n * sizeof *host);
    } else {
        size_t real = t == T_WTE ? (size_t)g->cfg.vocab * g->cfg.channels : n;
        ddp_init_normal(host, real, g->opts.seed, (uint32_t)i, std);
        memset(host + real, 0, (n - real) * sizeof *host); /* wte's padding rows */
    }
}

/* Seeded initialisation on the host, one slice at a time, each uploaded. */
static ddp_status init_params(gpt2 *g)
{
    size_t largest = 0;
    for (int i = 0; i < g->n_params; i++)
        largest = g->numel[i] > largest ? g->numel[i] : largest;
    float *host = malloc(largest * sizeof *host); // (largest slice)
    if (!host)
        return DDP_ERR_NOMEM;
    ddp_status st = DDP_OK;
    for (int i = 0; st == DDP_OK && i < g->n_params; i++) {
        init_slice(g, i, host);
        st = ops_weights_put(g->ops, g->opts.precision, (char *)g->weights + g->offset[i] * g->es,
                             host, g->numel[i]);
    }
    free(host);
    return st;
}

ddp_status gpt2_weights_set(gpt2 *g, const float *host)
{
    size_t chunk = (size_t)1 << 20;
    float *tmp = malloc(chunk * sizeof *tmp);
    ddp_status st = tmp ? DDP_OK : DDP_ERR_NOMEM;
    for (size_t at = 0; st == DDP_OK && at < g->numel_total; at += chunk) {
        size_t k = g->numel_total - at < chunk ? g->numel_total - at : chunk;
        memcpy(tmp, host + at, k * sizeof *tmp);
        st = ops_weights_put(g->ops, g->opts.precision, (char *)g->weights + at * g->es, tmp, k);
    }
    free(tmp);
    return st;
}

ddp_status gpt2_weights_get(const gpt2 *g, float *host)
{
    return ops_weights_get(g->ops, g->opts.precision, host, g->weights, g->numel_total);
}

/* ---- memory -------------------------------------------------------------------------------- */

/* A zeroed backend buffer of n_bytes owned by the model; NULL when out of memory. */
static void *buf(gpt2 *g, size_t n_bytes)
{
    void *p = g->n_bufs < MAX_BUFS ? ddp_alloc(g->ctx, n_bytes) : NULL;
    if (p) {
        g->bufs[g->n_bufs++] = p;
        g->act_bytes += n_bytes;
    } else {
        g->alloc_failed = true;
    }
    return p;
}

/* fp32 buffers of per_row floats for each of the max_batch x seq rows, times `layers`. */
static float *rows_f(gpt2 *g, size_t per_row, int layers)
{
    return buf(g, (size_t)layers * g->opts.max_batch * g->opts.seq * per_row * sizeof(float));
}

/* The same in the model's precision. */
static void *rows_p(gpt2 *g, size_t per_row, int layers)
{
    return buf(g, (size_t)layers * g->opts.max_batch * g->opts.seq * per_row * g->es);
}

/* The same in the activations' precision. */
static void *rows_a(gpt2 *g, size_t per_row, int layers)
{
    return buf(g, (size_t)layers * g->opts.max_batch * g->opts.seq * per_row * g->ea);
}

/* The floats of one layer's attention state (the ops' attention_floats at the largest batch). */
static size_t att_floats(const gpt2 *g)
{
    return g->ops->attention_floats(g->ops, g->opts.precision, g->opts.max_batch, g->opts.seq,
                                    g->cfg.channels, g->cfg.heads);
}

/* The per-layer activations: Ls layers of scratch (1 with recompute, else L), L block outputs. */
static void alloc_layer_acts(gpt2 *g)
{
    gpt2_acts *a = &g->a;
    int Ls = g->opts.recompute ? 1 : g->cfg.layers;
    size_t c = (size_t)g->cfg.channels;
    a->ln1 = rows_p(g, c, Ls);
    a->ln1_mean = rows_f(g, 1, Ls);
    a->ln1_rstd = rows_f(g, 1, Ls);
    a->qkv = rows_a(g, 3 * c, Ls);
    a->att = buf(g, Ls * att_floats(g) * sizeof(float));
    a->atty = rows_p(g, c, Ls);
    a->residual2 = rows_f(g, c, Ls);
    a->ln2 = rows_p(g, c, Ls);
    a->ln2_mean = rows_f(g, 1, Ls);
    a->ln2_rstd = rows_f(g, 1, Ls);
    a->fch = rows_a(g, 4 * c, Ls);
    a->fch_gelu = rows_p(g, 4 * c, Ls);
    a->residual3 = rows_f(g, c, g->cfg.layers);
}

static ddp_status alloc_acts(gpt2 *g)
{
    gpt2_acts *a = &g->a;
    gpt2_dacts *d = &g->d;
    size_t c = (size_t)g->cfg.channels, vp = (size_t)g->cfg.padded_vocab;
    bool p16 = g->opts.precision != DDP_FP32, casts = g->act != g->opts.precision;
    a->encoded = rows_f(g, c, 1);
    alloc_layer_acts(g);
    a->lnf = rows_p(g, c, 1);
    a->lnf_mean = rows_f(g, 1, 1);
    a->lnf_rstd = rows_f(g, 1, 1);
    a->logits = buf(g, (size_t)g->opts.max_batch * g->opts.seq * vp * g->el);
    a->losses = rows_f(g, 1, 1);
    a->tokens = buf(g, (size_t)g->opts.max_batch * g->opts.seq * sizeof(int));
    a->proj = rows_a(g, c, 1);
    d->dresidual = rows_f(g, c, 1);
    d->dln = rows_a(g, c, 1);
    d->datty = rows_a(g, c, 1);
    d->dqkv = rows_a(g, 3 * c, 1);
    d->datt = buf(g, att_floats(g) * sizeof(float));
    d->dfch = rows_a(g, 4 * c, 1);
    if (g->act != DDP_FP32)
        d->dres_act = rows_a(g, c, 1);
    if (casts) {
        a->scratch = rows_f(g, 4 * c, 1);
        d->dy_c = rows_p(g, 4 * c, 1);
        d->dx_c = rows_p(g, 4 * c, 1);
    }
    if (p16 && g->lt == DDP_FP32)
        d->dlogits_c = rows_p(g, vp, 1);
    return g->alloc_failed ? DDP_ERR_NOMEM : DDP_OK;
}

static ddp_status alloc_state(gpt2 *g)
{
    g->weights = ddp_alloc(g->ctx, g->numel_total * g->es);
    g->grads = g->opts.reducer_grads ? NULL : ddp_alloc(g->ctx, g->numel_total * sizeof(float));
    if (!g->weights || (!g->grads && !g->opts.reducer_grads))
        return DDP_ERR_NOMEM;
    if (g->opts.precision == DDP_FP32)
        return DDP_OK;
    g->roff = malloc((size_t)g->n_params * sizeof *g->roff);
    if (!g->roff)
        return DDP_ERR_NOMEM;
    size_t n = 0;
    for (int i = 0; i < g->n_params; i++) {
        g->roff[i] = read_in_fp32(g->tensor_of[i]) ? n : SIZE_MAX;
        n += read_in_fp32(g->tensor_of[i]) ? g->numel[i] : 0;
    }
    g->rparams = ddp_alloc(g->ctx, n * sizeof(float));
    return g->rparams ? DDP_OK : DDP_ERR_NOMEM;
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

static ddp_status check_opts(const gpt2_config *cfg, const gpt2_opts *opts)
{
    if (!opts || opts->max_batch < 1 || opts->seq < 1 || opts->seq > cfg->max_seq ||
        (long long)opts->max_batch * opts->seq > INT_MAX / 4) {
        DDP_ERROR("gpt2_create: batch %d x sequence %d invalid (sequence at most %d)",
                  opts ? opts->max_batch : 0, opts ? opts->seq : 0, cfg->max_seq);
        return DDP_ERR_INVALID_ARG;
    }
    if (opts->precision != DDP_FP32 && opts->precision != DDP_BF16 &&
        opts->precision != DDP_FP16) {
        DDP_ERROR("gpt2_create: precision %s: use fp32, bf16 or fp16",
                  ddp_dtype_name(opts->precision));
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

static ddp_status check_create(ddp_ctx *ctx, const ops_handle *ops, gpt2_config *cfg,
                               const gpt2_opts *opts)
{
    if (!ops || ops->ctx != ctx) {
        DDP_ERROR("gpt2_create: no ops handle, or one opened on another context");
        return DDP_ERR_INVALID_ARG;
    }
    TRY_OK(gpt2_config_check(cfg));
    TRY_OK(check_opts(cfg, opts));
    TRY_OK(ops_require_gpt(ops, "gpt2"));
    return ops_require_precision(ops, opts->precision, "gpt2");
}

/* g->act and g->ea from the precision and DDP_GPT_ACTIVATIONS (gpt2.h): bf16 activations in a
 * bf16 run unless it says fp32; fp32 otherwise; the logits in act, or fp32 with
 * DDP_GPT_LOGITS16=0 (run 4's: the LM head writes fp32, its gradient cast to bf16) (fp16 keeps fp32 activations: its range needs the
 * loss scale's care, which only the fp32-activation path has been tested with).
 * DDP_ERR_INVALID_ARG (logged) for another value of the variable. */
static ddp_status activations_precision(gpt2 *g)
{
    const char *env = getenv("DDP_GPT_ACTIVATIONS");
    if (env && *env && strcmp(env, "fp32") != 0 && strcmp(env, "p") != 0) {
        DDP_ERROR("gpt2_create: DDP_GPT_ACTIVATIONS=%s: use fp32 (the fp32-activation path) or "
                  "p (the run's precision, the default)", env);
        return DDP_ERR_INVALID_ARG;
    }
    bool fp32 = env && strcmp(env, "fp32") == 0;
    g->act = g->opts.precision == DDP_BF16 && !fp32 ? DDP_BF16 : DDP_FP32;
    g->ea = ops_dtype_size(g->ops, g->act);
    g->lt = ops_switch_on(OPS_SW_LOGITS16) ? g->act : DDP_FP32;
    g->el = ops_dtype_size(g->ops, g->lt);
    return DDP_OK;
}

static ddp_status gpt2_setup(gpt2 *g)
{
    TRY_OK(describe_params(g));
    TRY_OK(alloc_state(g));
    TRY_OK(alloc_acts(g));
    return init_params(g);
}

ddp_status gpt2_create(ddp_ctx *ctx, const ops_handle *ops, const gpt2_config *cfg,
                       const gpt2_opts *opts, gpt2 **out)
{
    *out = NULL;
    if (!cfg)
        return DDP_ERR_INVALID_ARG;
    gpt2_config c = *cfg;
    TRY_OK(check_create(ctx, ops, &c, opts));
    gpt2 *g = calloc(1, sizeof *g);
    if (!g)
        return DDP_ERR_NOMEM;
    g->ctx = ctx;
    g->ops = ops;
    g->cfg = c;
    g->opts = *opts;
    g->es = ops_dtype_size(ops, opts->precision);
    ddp_status st = activations_precision(g);
    if (st == DDP_OK)
        st = gpt2_setup(g);
    if (st == DDP_ERR_NOMEM)
        DDP_ERROR("gpt2_create: out of memory for %zu parameters (their weights and fp32 "
                  "gradients) and the activations of %d x %d tokens: use a smaller batch or model",
                  g->numel_total, opts->max_batch, opts->seq);
    else if (st != DDP_OK)
        DDP_ERROR("gpt2_create: %s", ddp_strerror(st));
    if (st != DDP_OK) {
        gpt2_destroy(g);
        return st;
    }
    *out = g;
    return DDP_OK;
}

void gpt2_destroy(gpt2 *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_bufs; i++)
        ddp_free(g->ctx, g->bufs[i]);
    ddp_free(g->ctx, g->rparams);
    free(g->roff);
    ddp_free(g->ctx, g->weights);
    ddp_free(g->ctx, g->grads);
    free(g->descs);
    free(g->numel);
    free(g->offset);
    free(g->tensor_of);
    free(g);
}

const gpt2_config *gpt2_cfg(const gpt2 *g) { return &g->cfg; }
int gpt2_n_params(const gpt2 *g) { return g->n_params; }
const ddp_param_desc *gpt2_descs(const gpt2 *g) { return g->descs; }
const size_t *gpt2_numel(const gpt2 *g) { return g->numel; }
size_t gpt2_numel_total(const gpt2 *g) { return g->numel_total; }
ddp_ctx *gpt2_ctx(const gpt2 *g) { return g->ctx; }
const ops_handle *gpt2_ops(const gpt2 *g) { return g->ops; }

bool gpt2_param_decays(const gpt2 *g, int i)
{
    return i >= 0 && i < g->n_params && g->descs[i].n_dims == 2;
}

float *gpt2_params(gpt2 *g) { return g->opts.precision == DDP_FP32 ? g->weights : NULL; }

void *gpt2_weights(gpt2 *g, ddp_dtype *p)
{
    *p = g->opts.precision;
    return g->weights;
}

void gpt2_set_gather(gpt2 *g, ddp_reducer *r) { g->gather = r; }

void gpt2_set_master(gpt2 *g, const float *master)
{
    g->master = g->opts.precision != DDP_FP32 ? master : NULL;
}
float *gpt2_grads(gpt2 *g) { return g->grads; }

ddp_status gpt2_logits_get(const gpt2 *g, size_t row, size_t n_rows, float *host)
{
    size_t vp = (size_t)g->cfg.padded_vocab, n = n_rows * vp;
    if (row > (size_t)g->B * g->T || n_rows > (size_t)g->B * g->T - row)
        return DDP_ERR_INVALID_ARG;
    const char *src = (const char *)g->a.logits + row * vp * g->el;
    if (g->el == sizeof(float)) /* ddp_download: host memory too (ctx NULL) */
        return ddp_download(g->ctx, host, src, n * sizeof(float));
    uint16_t *h = malloc(n * sizeof *h); /* bf16 storage: the bits, widened here */
    if (!h)
        return DDP_ERR_NOMEM;
    ddp_status st = ddp_download(g->ctx, h, src, n * sizeof *h);
    for (size_t i = 0; st == DDP_OK && i < n; i++)
        host[i] = half_bf16_to_f32(h[i]);
    free(h);
    return st;
}

void gpt2_memory_get(const gpt2 *g, gpt2_memory *out)
{
    size_t widened = 0;
    for (int i = 0; g->rparams && i < g->n_params; i++)
        widened += g->roff[i] != SIZE_MAX ? g->numel[i] * sizeof(float) : 0;
    out->params = g->numel_total * g->es + widened;
    out->grads = g->grads ? g->numel_total * sizeof(float) : 0;
    out->activations = g->act_bytes;
    out->logits = (size_t)g->opts.max_batch * g->opts.seq * g->cfg.padded_vocab * g->el;
}

/* ---- precision ----------------------------------------------------------------------------- */

/* Whether the activations are fp32 in a 16-bit run: casts around every linear. */
static bool casts(const gpt2 *g) { return g->act != g->opts.precision; }

/* Where an op writes (in act) what a linear then reads in p: dst itself without casts, else the
 * scratch (cast into dst by to_p). */
static void *out_act(gpt2 *g, void *dst) { return casts(g) ? (void *)g->a.scratch : dst; }

/* dst (n, in p) = src (in act) with casts; nothing otherwise (src is dst). */
static ddp_status to_p(gpt2 *g, void *dst, const void *src, size_t n)
{
    if (!casts(g))
        return DDP_OK;
    return g->ops->cast(g->ops, g->opts.precision, dst, g->act, src, n);
}

/* src (in act) as a linear reads it: itself without casts, else cast into buf_p. */
static ddp_status as_p(gpt2 *g, const void *src, void *buf_p, size_t n, const void **out)
{
    *out = casts(g) ? buf_p : src;
    return to_p(g, buf_p, src, n);
}

/* rparams' part of slice i from the weights: its first n elements (nothing for a slice read in
 * the precision itself, or in fp32). */
static ddp_status widen_slice(gpt2 *g, int i, size_t n)
{
    if (!g->rparams || g->roff[i] == SIZE_MAX || g->master)
        return DDP_OK;
    return g->ops->cast(g->ops, DDP_FP32, g->rparams + g->roff[i], g->opts.precision,
                        (const char *)g->weights + g->offset[i] * g->es, n);
}

/* ---- forward ------------------------------------------------------------------------------- */

/* The slot of layer l's scratch activations (the gpt2_acts fields of Ls layers): l, or with
 * recompute the one slot all layers share. */
static size_t slot(const gpt2 *g, int l) { return g->opts.recompute ? 0 : (size_t)l; }

/* Layer l's slice of an fp32 per-layer scratch activation of per_row floats per row. */
static float *at_f(const gpt2 *g, float *base, int l, size_t per_row)
{
    return base + slot(g, l) * g->opts.max_batch * g->opts.seq * per_row;
}

/* The same for an activation in p. */
static void *at_p(const gpt2 *g, void *base, int l, size_t per_row)
{
    return (char *)base + slot(g, l) * g->opts.max_batch * g->opts.seq * per_row * g->es;
}

/* The same for an activation in act. */
static void *at_a(const gpt2 *g, void *base, int l, size_t per_row)
{
    return (char *)base + slot(g, l) * g->opts.max_batch * g->opts.seq * per_row * g->ea;
}

/* Layer l's attention state (the per-layer att of attention_fwd). */
static float *att_of(const gpt2 *g, int l)
{
    return g->a.att + slot(g, l) * att_floats(g);
}

/* Layer l's output residual stream (B, T, C), kept for every layer. */
static float *block_out(const gpt2 *g, int l)
{
    return g->a.residual3 + (size_t)l * g->opts.max_batch * g->opts.seq * g->cfg.channels;
}

/* Layer l's input residual stream: the embeddings for layer 0, else layer l - 1's output. */
static const float *block_in(const gpt2 *g, int l)
{
    return l ? block_out(g, l - 1) : g->a.encoded;
}

/* y (rows, out; in act) = x (rows, in; in p) W^T + b for weight tensor t (bias t + 1) of
 * layer l. */
static ddp_status linear_fwd(gpt2 *g, int t, int l, const void *x, int in, int out, void *y)
{
    return g->ops->linear_fwd(g->ops, g->opts.precision, x, cweight(g, t, l), param(g, t + 1, l),
                              g->B * g->T, in, out, y, g->act == DDP_FP32);
}

/* The residual add after attention (residual2 = residual + proj) and ln_2 on its result, the
 * MLP's input: one fused op where the ops have it (ops.h add_layernorm_fwd), bit for bit the two. */
static ddp_status residual_ln2(gpt2 *g, int l, const float *residual)
{
    const ops_handle *o = g->ops;
    gpt2_acts *a = &g->a;
    int rows = g->B * g->T, C = g->cfg.channels;
    size_t n = (size_t)rows * C;
    float *r2 = at_f(g, a->residual2, l, C), *mean = at_f(g, a->ln2_mean, l, 1);
    float *rstd = at_f(g, a->ln2_rstd, l, 1);
    void *ln2 = at_p(g, a->ln2, l, C);
    if (!casts(g) && o->add_layernorm_fwd)
        return o->add_layernorm_fwd(o, g->act, r2, residual, a->proj, ln2, mean, rstd,
                                    param(g, T_LN2W, l), param(g, T_LN2B, l), rows, C);
    TRY_OK(o->add(o, g->act, r2, residual, a->proj, n));
    void *h = out_act(g, ln2);
    TRY_OK(o->layernorm_fwd(o, g->act, h, mean, rstd, r2, param(g, T_LN2W, l),
                            param(g, T_LN2B, l), rows, C));
    return to_p(g, ln2, h, n);
}

/* ln_1, attention, attn.c_proj, the residual add and ln_2 of layer l. */
static ddp_status attn_fwd(gpt2 *g, int l, const float *residual)
{
    const ops_handle *o = g->ops;
    gpt2_acts *a = &g->a;
    int rows = g->B * g->T, C = g->cfg.channels, NH = g->cfg.heads;
    size_t n = (size_t)rows * C;
    void *ln1 = at_p(g, a->ln1, l, C), *atty = at_p(g, a->atty, l, C);
    void *qkv = at_a(g, a->qkv, l, 3 * (size_t)C), *h = out_act(g, ln1);
    TRY_OK(o->layernorm_fwd(o, g->act, h, at_f(g, a->ln1_mean, l, 1), at_f(g, a->ln1_rstd, l, 1),
                            residual, param(g, T_LN1W, l), param(g, T_LN1B, l), rows, C));
    TRY_OK(to_p(g, ln1, h, n));
    TRY_OK(linear_fwd(g, T_QKVW, l, ln1, C, 3 * C, qkv));
    h = out_act(g, atty);
    TRY_OK(o->attention_fwd(o, g->opts.precision, g->act, h, att_of(g, l), qkv, g->B, g->T, C,
                            NH));
    TRY_OK(to_p(g, atty, h, n));
    TRY_OK(linear_fwd(g, T_ATTPROJW, l, atty, C, C, a->proj));
    return residual_ln2(g, l, residual);
}

/* c_fc and the GELU of layer l (on ln_2's output, attn_fwd's last): the rest of the MLP's
 * activations that backward reads. */
static ddp_status mlp_hidden_fwd(gpt2 *g, int l)
{
    const ops_handle *o = g->ops;
    gpt2_acts *a = &g->a;
    int rows = g->B * g->T, C = g->cfg.channels;
    size_t n = (size_t)rows * C;
    void *fch = at_a(g, a->fch, l, 4 * (size_t)C);
    void *ln2 = at_p(g, a->ln2, l, C), *gelu = at_p(g, a->fch_gelu, l, 4 * (size_t)C), *h;
    if (!casts(g) && o->linear_gelu_fwd) /* fused (cuBLASLt's GELU epilogue on CUDA bf16) */
        return o->linear_gelu_fwd(o, g->opts.precision, ln2, cweight(g, T_FCW, l),
                                  param(g, T_FCB, l), rows, C, 4 * C, fch, gelu);
    TRY_OK(linear_fwd(g, T_FCW, l, ln2, C, 4 * C, fch));
    h = out_act(g, gelu);
    TRY_OK(o->gelu_fwd(o, g->act, h, fch, 4 * n));
    return to_p(g, gelu, h, 4 * n);
}

/* The MLP and the residual add of layer l: the block's output. */
static ddp_status mlp_fwd(gpt2 *g, int l)
{
    gpt2_acts *a = &g->a;
    int C = g->cfg.channels;
    size_t n = (size_t)g->B * g->T * C;
    TRY_OK(mlp_hidden_fwd(g, l));
    TRY_OK(linear_fwd(g, T_FCPROJW, l, at_p(g, a->fch_gelu, l, 4 * (size_t)C), 4 * C, C, a->proj));
    return g->ops->add(g->ops, g->act, block_out(g, l), at_f(g, a->residual2, l, C), a->proj, n);
}

/* ln_f and the LM head (logits = lnf wte^T, the zero bias). */
static ddp_status head_fwd(gpt2 *g)
{
    const ops_handle *o = g->ops;
    gpt2_acts *a = &g->a;
    int rows = g->B * g->T, C = g->cfg.channels, L = g->cfg.layers;
    void *h = out_act(g, a->lnf);
    TRY_OK(o->layernorm_fwd(o, g->act, h, a->lnf_mean, a->lnf_rstd, block_out(g, L - 1),
                            param(g, T_LNFW, 0), param(g, T_LNFB, 0), rows, C));
    TRY_OK(to_p(g, a->lnf, h, (size_t)rows * C));
    return o->linear_fwd(o, g->opts.precision, a->lnf, cweight(g, T_WTE, 0), NULL, rows, C,
                         g->cfg.padded_vocab, a->logits, g->lt == DDP_FP32);
}

/* Slice i as the next part of the forward pass reads it: with gpt2_set_gather its all-gather
 * has arrived (ddp_reducer_gather_wait: on CUDA the compute stream waits, not the host), and in
 * 16 bits its first n elements are widened for param(). */
static ddp_status slice_ready(gpt2 *g, int i, size_t n)
{
    if (g->gather)
        TRY_OK(ddp_reducer_gather_wait(g->gather, i));
    return widen_slice(g, i, n);
}

/* The slices the next part of the forward pass reads: layer l's twelve; l = -1: the embeddings
 * (wpe's first T rows); l = L: ln_f. */
static ddp_status layer_ready(gpt2 *g, int l)
{
    if (l < 0) {
        int wpe = slice(g, T_WPE, 0);
        TRY_OK(slice_ready(g, slice(g, T_WTE, 0), 0));
        return slice_ready(g, wpe, (size_t)g->T * g->cfg.channels);
    }
    if (l == g->cfg.layers) {
        TRY_OK(slice_ready(g, slice(g, T_LNFW, 0), (size_t)g->cfg.channels));
        return slice_ready(g, slice(g, T_LNFB, 0), (size_t)g->cfg.channels);
    }
    for (int t = T_LN1W; t <= T_FCPROJB; t++) {
        int i = slice(g, t, l);
        TRY_OK(slice_ready(g, i, g->numel[i]));
    }
    return DDP_OK;
}

static ddp_status layers_fwd(gpt2 *g, const int *tokens)
{
    const ops_handle *o = g->ops;
    size_t n_tok = (size_t)g->B * g->T;
    TRY_OK(ddp_copy(g->ctx, g->a.tokens, tokens, n_tok * sizeof(int)));
    TRY_OK(layer_ready(g, -1));
    bool fp32_wte = g->master != NULL; /* gpt2_set_master: wte from the master too */
    const void *wte = fp32_wte ? (const void *)(g->master + g->offset[slice(g, T_WTE, 0)])
                               : cweight(g, T_WTE, 0);
    TRY_OK(o->encoder_fwd(o, g->a.encoded, g->a.tokens, fp32_wte ? DDP_FP32 : g->opts.precision,
                          wte, param(g, T_WPE, 0), g->B, g->T, g->cfg.channels));
    for (int l = 0; l < g->cfg.layers; l++) {
        TRY_OK(layer_ready(g, l));
        ddp_trace_begin("forward.layer", l);
        TRY_OK(attn_fwd(g, l, block_in(g, l)));
        TRY_OK(mlp_fwd(g, l));
        ddp_trace_end("forward.layer", l);
    }
    TRY_OK(layer_ready(g, g->cfg.layers));
    return head_fwd(g);
}

/* Whether the model's buffers are host memory (then the inputs can be checked). */
static bool host_memory(const gpt2 *g)
{
    return !g->ctx || ddp_backend(g->ctx) == DDP_BACKEND_CPU;
}

/* DDP_ERR_INVALID_ARG (logged) when host memory holds a token outside [0, V). */
static ddp_status check_tokens(const gpt2 *g, const int *x, size_t n, const char *what)
{
    for (size_t i = 0; x && host_memory(g) && i < n; i++) {
        if (x[i] < 0 || x[i] >= g->cfg.vocab) {
            DDP_ERROR("gpt2_forward: %s[%zu] = %d outside [0, %d)", what, i, x[i], g->cfg.vocab);
            return DDP_ERR_INVALID_ARG;
        }
    }
    return DDP_OK;
}

static ddp_status check_batch(const gpt2 *g, const int *tokens, const int *targets, int B, int T)
{
    if (!tokens || B < 1 || B > g->opts.max_batch || T < 1 || T > g->opts.seq) {
        DDP_ERROR("gpt2_forward: batch %d x %d outside [1, %d] x [1, %d] or no tokens", B, T,
                  g->opts.max_batch, g->opts.seq);
        return DDP_ERR_INVALID_ARG;
    }
    TRY_OK(check_tokens(g, tokens, (size_t)B * T, "tokens"));
    return check_tokens(g, targets, (size_t)B * T, "targets");
}

/* The cross-entropy (and, for backward, the logits' gradient in place); the mean loss added to
 * loss_acc as the column sum of the losses scaled by 1 / rows. */
static ddp_status loss_fwd(gpt2 *g, const int *targets, float *loss_acc, bool for_backward)
{
    const ops_handle *o = g->ops;
    int rows = g->B * g->T;
    float inv = 1.0f / (float)rows;
    TRY_OK(o->xent_fwd_bwd(o, g->lt, for_backward ? g->a.logits : NULL, g->a.losses,
                           g->a.logits, targets, rows, g->cfg.vocab, g->cfg.padded_vocab, inv));
    if (!loss_acc)
        return DDP_OK;
    TRY_OK(o->scale(o, DDP_FP32, g->a.losses, (size_t)rows, inv));
    return o->bias_grad(o, loss_acc, g->a.losses, rows, 1);
}

ddp_status gpt2_forward(gpt2 *g, const int *tokens, const int *targets, int B, int T,
                        float *loss_acc, bool for_backward)
{
    g->pending = false;
    TRY_OK(check_batch(g, tokens, targets, B, T));
    g->B = B;
    g->T = T;
    TRY_OK(layers_fwd(g, tokens));
    if (!targets)
        return DDP_OK;
    TRY_OK(loss_fwd(g, targets, loss_acc, for_backward));
    g->pending = for_backward;
    return DDP_OK;
}

/* ---- backward ------------------------------------------------------------------------------ */

/* Marks tensor t's slice of layer l ready on r (when not NULL). */
static ddp_status mark(gpt2 *g, ddp_reducer *r, int t, int l)
{
    return r ? ddp_reducer_mark_ready(r, slice(g, t, l)) : DDP_OK;
}

/* dx (rows, in; in act) = dy (rows, out; in p) w (out, in; in p): directly, or with casts
 * through dx_c; times GELU'(gelu_pre) when gelu_pre (rows, in; in act: c_fc's output) is not
 * NULL, fused where the ops can (ops.h linear_bwd_input_gelu). */
static ddp_status linear_dx(gpt2 *g, const void *w, const void *dyp, int in, int out, void *dx,
                            const void *gelu_pre)
{
    const ops_handle *o = g->ops;
    ddp_dtype p = g->opts.precision;
    int rows = g->B * g->T;
    if (gelu_pre && !casts(g) && o->linear_bwd_input_gelu)
        return o->linear_bwd_input_gelu(o, p, w, dyp, gelu_pre, rows, in, out, dx);
    void *dxp = casts(g) ? g->d.dx_c : dx;
    TRY_OK(o->linear_bwd_input(o, p, w, dyp, rows, in, out, dxp));
    if (casts(g))
        TRY_OK(o->cast(o, g->act, dx, p, dxp, (size_t)rows * in));
    return gelu_pre ? o->gelu_bwd(o, g->act, dx, gelu_pre, dx, (size_t)rows * in) : DDP_OK;
}

/* Backward of the linear with weight tensor t (bias t + 1) of layer l, input x (rows, in; in p),
 * output gradient dy (rows, out; in act): the bias gradient (marked), the weight gradient
 * (marked), then dx (rows, in; in act) = dy W (linear_dx, through GELU's backward with
 * gelu_pre). */
static ddp_status linear_bwd(gpt2 *g, ddp_reducer *r, int t, int l, const void *x,
                             const void *dy, int in, int out, void *dx, const void *gelu_pre)
{
    const ops_handle *o = g->ops;
    ddp_dtype p = g->opts.precision;
    int rows = g->B * g->T;
    const void *dyp;
    float *dw, *db;
    TRY_OK(as_p(g, dy, g->d.dy_c, (size_t)rows * out, &dyp));
    TRY_OK(grad(g, t + 1, l, &db));
    TRY_OK(o->linear_bwd_params(o, p, x, dyp, rows, in, out, NULL, db, true));
    TRY_OK(mark(g, r, t + 1, l));
    TRY_OK(grad(g, t, l, &dw));
    TRY_OK(o->linear_bwd_params(o, p, x, dyp, rows, in, out, dw, NULL, true));
    TRY_OK(mark(g, r, t, l));
    return linear_dx(g, cweight(g, t, l), dyp, in, out, dx, gelu_pre);
}

/* The residual stream's gradient as the projections' backward reads it (in act). */
static const void *dres(const gpt2 *g)
{
    return g->act == DDP_FP32 ? (const void *)g->d.dresidual : g->d.dres_act;
}

/* LayerNorm backward of tensor t (weight; bias t + 1) of layer l: ADDS into dresidual (and, in
 * 16-bit activations, writes the sum into dres_act). */
static ddp_status ln_bwd(gpt2 *g, ddp_reducer *r, int t, int l, const float *x, const float *mean,
                         const float *rstd)
{
    const ops_handle *o = g->ops;
    float *dw, *db;
    TRY_OK(grad(g, t, l, &dw));
    TRY_OK(grad(g, t + 1, l, &db));
    TRY_OK(o->layernorm_bwd(o, g->act, g->d.dresidual, g->d.dres_act, dw, db, g->d.dln, x,
                            param(g, t, l), mean, rstd, g->B * g->T, g->cfg.channels));
    TRY_OK(mark(g, r, t + 1, l));
    return mark(g, r, t, l);
}

/* The MLP of layer l, then ln_2: dresidual becomes the gradient of residual2. */
static ddp_status mlp_bwd(gpt2 *g, ddp_reducer *r, int l)
{
    gpt2_acts *a = &g->a;
    gpt2_dacts *d = &g->d;
    int C = g->cfg.channels;
    void *fch = at_a(g, a->fch, l, 4 * (size_t)C);
    TRY_OK(linear_bwd(g, r, T_FCPROJW, l, at_p(g, a->fch_gelu, l, 4 * (size_t)C), dres(g),
                      4 * C, C, d->dfch, fch));
    TRY_OK(linear_bwd(g, r, T_FCW, l, at_p(g, a->ln2, l, C), d->dfch, C, 4 * C, d->dln, NULL));
    return ln_bwd(g, r, T_LN2W, l, at_f(g, a->residual2, l, C), at_f(g, a->ln2_mean, l, 1),
                  at_f(g, a->ln2_rstd, l, 1));
}

/* The attention of layer l, then ln_1: dresidual becomes the gradient of the layer's input. */
static ddp_status attn_bwd(gpt2 *g, ddp_reducer *r, int l)
{
    gpt2_acts *a = &g->a;
    gpt2_dacts *d = &g->d;
    int C = g->cfg.channels, NH = g->cfg.heads;
    void *qkv = at_a(g, a->qkv, l, 3 * (size_t)C);
    const float *input = block_in(g, l);
    TRY_OK(linear_bwd(g, r, T_ATTPROJW, l, at_p(g, a->atty, l, C), dres(g), C, C, d->datty,
                      NULL));
    TRY_OK(g->ops->attention_bwd(g->ops, g->opts.precision, g->act, d->dqkv, d->datt, d->datty,
                                 qkv, att_of(g, l), g->B, g->T, C, NH));
    TRY_OK(linear_bwd(g, r, T_QKVW, l, at_p(g, a->ln1, l, C), d->dqkv, C, 3 * C, d->dln, NULL));
    return ln_bwd(g, r, T_LN1W, l, input, at_f(g, a->ln1_mean, l, 1), at_f(g, a->ln1_rstd, l, 1));
}

/* The LM head's part of wte's gradient (wte is marked after the encoder's part), then ln_f:
 * dresidual becomes the gradient of the last layer's output. */
static ddp_status head_bwd(gpt2 *g, ddp_reducer *r, float loss_scale)
{
    const ops_handle *o = g->ops;
    ddp_dtype p = g->opts.precision;
    int rows = g->B * g->T, C = g->cfg.channels, Vp = g->cfg.padded_vocab;
    size_t n = (size_t)rows * Vp;
    const void *dlogits = g->a.logits; /* in lt; fp32 in a 16-bit run is cast to p */
    float *dwte;
    if (loss_scale != 1.0f)
        TRY_OK(o->scale(o, g->lt, g->a.logits, n, loss_scale));
    if (g->lt != p) {
        TRY_OK(o->cast(o, p, g->d.dlogits_c, DDP_FP32, g->a.logits, n));
        dlogits = g->d.dlogits_c;
    }
    TRY_OK(grad(g, T_WTE, 0, &dwte));
    TRY_OK(o->linear_bwd_params(o, p, g->a.lnf, dlogits, rows, C, Vp, dwte, NULL, true));
    TRY_OK(linear_dx(g, cweight(g, T_WTE, 0), dlogits, C, Vp, g->d.dln, NULL));
    TRY_OK(ddp_zero(g->ctx, g->d.dresidual, (size_t)rows * C * sizeof(float)));
    return ln_bwd(g, r, T_LNFW, 0, block_out(g, g->cfg.layers - 1), g->a.lnf_mean,
                  g->a.lnf_rstd);
}

/* With recompute: layer l's scratch activations again from its kept input, by the forward's ops
 * on the forward's values (so bit for bit the forward's); mlp.c_proj and the residual add, whose
 * output is kept, are left out. Nothing without recompute, nor for the last layer: the slot still
 * holds its activations (backward follows its forward pass directly, as another forward pass
 * clears g->pending). */
static ddp_status recompute_fwd(gpt2 *g, int l)
{
    if (!g->opts.recompute || l == g->cfg.layers - 1)
        return DDP_OK;
    ddp_trace_begin("backward.recompute", l);
    TRY_OK(attn_fwd(g, l, block_in(g, l)));
    TRY_OK(mlp_hidden_fwd(g, l));
    ddp_trace_end("backward.recompute", l);
    return DDP_OK;
}

ddp_status gpt2_backward(gpt2 *g, ddp_reducer *r, float loss_scale)
{
    if (!g->pending) {
        DDP_ERROR("gpt2_backward: no forward pass with targets for backward to differentiate");
        return DDP_ERR_STATE;
    }
    if (g->opts.reducer_grads && !r) {
        DDP_ERROR("gpt2_backward: the gradients live in the reducer's buckets (gpt2_opts."
                  "reducer_grads): pass the reducer");
        return DDP_ERR_INVALID_ARG;
    }
    g->pending = false;
    g->grad_r = r;
    TRY_OK(head_bwd(g, r, loss_scale));
    for (int l = g->cfg.layers - 1; l >= 0; l--) {
        TRY_OK(recompute_fwd(g, l));
        ddp_trace_begin("backward.layer", l);
        TRY_OK(mlp_bwd(g, r, l));
        TRY_OK(attn_bwd(g, r, l));
        ddp_trace_end("backward.layer", l);
    }
    float *dwte, *dwpe;
    TRY_OK(grad(g, T_WTE, 0, &dwte));
    TRY_OK(grad(g, T_WPE, 0, &dwpe));
    TRY_OK(g->ops->encoder_bwd(g->ops, dwte, dwpe, g->d.dresidual, g->a.tokens, g->B, g->T,
                               g->cfg.channels));
    TRY_OK(mark(g, r, T_WPE, 0));
    return mark(g, r, T_WTE, 0);
}

void gpt2_ready_order(const gpt2 *g, int *order)
{
    /* a layer's slices as mlp_bwd, then attn_bwd mark them: each linear (linear_bwd) and each
     * LayerNorm (ln_bwd) its bias, then its weight */
    static const int layer_marks[LAYER_TENSORS] = {
        T_FCPROJB, T_FCPROJW, T_FCB, T_FCW, T_LN2B, T_LN2W,         /* mlp_bwd */
        T_ATTPROJB, T_ATTPROJW, T_QKVB, T_QKVW, T_LN1B, T_LN1W};    /* attn_bwd */
    int k = 0;
    order[k++] = slice(g, T_LNFB, 0); /* head_bwd */
    order[k++] = slice(g, T_LNFW, 0);
    for (int l = g->cfg.layers - 1; l >= 0; l--)
        for (int j = 0; j < LAYER_TENSORS; j++)
            order[k++] = slice(g, layer_marks[j], l);
    order[k++] = slice(g, T_WPE, 0); /* the encoder's, wte after its LM head's part */
    order[k] = slice(g, T_WTE, 0);
}

ddp_status gpt2_zero_grad(gpt2 *g)
{
    return g->grads ? ddp_zero(g->ctx, g->grads, g->numel_total * sizeof(float)) : DDP_OK;
}
