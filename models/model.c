/* model.c - the reference models of model.h: an MLP of configurable widths and a LeNet-style CNN,
 * with parameters and gradients each in ONE backend allocation, on any ops table (the optimizer's
 * state is train/optim.c's).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_trace.h"
#include "layers.h"
#include "math_shared.h"
#include "model.h"

#define MODEL_MAX_PARAMS (2 * MODEL_MLP_MAX_LAYERS)
#define MODEL_MAX_BUFS 32
#define MODEL_CLASSES 10
#define MODEL_IMAGE_SIDE 28
#define MODEL_CNN_CHANNELS 20

/* Activations of the MLP: layer l maps widths[l] to widths[l+1]. */
/* Activations are in the model's precision (void *); the logits are fp32. */
typedef struct mlp_acts {
    void *z[MODEL_MLP_MAX_LAYERS];  // (batch, widths[l+1]) layer outputs; the last is the logits
    void *a[MODEL_MLP_MAX_LAYERS];  // (batch, widths[l+1]) ReLU of z[l], hidden layers only
    void *dz[MODEL_MLP_MAX_LAYERS]; // (batch, widths[l+1]) gradient w.r.t. z[l], hidden layers only
    void *dh;                     // (batch, max hidden width) gradient w.r.t. a layer's input
} mlp_acts;

/* Activations of the CNN (shapes per sample, times batch). */
typedef struct cnn_acts {
    layer_conv conv1, conv2;
    float *col1;   // (25, 784) im2col of the input (im2col path only)
    void *z1;      // (20, 28, 28) conv1 output (before ReLU: see cnn_forward)
    void *p1;      // (20, 14, 14) pool1 output, ReLU applied in place
    int *arg1;     // (20, 14, 14) pool1 winners or workspace
    float *col2;   // (500, 196) im2col of p1 (im2col path only)
    void *z2;      // (20, 14, 14) conv2 output (before ReLU)
    void *p2;      // (980) pool2 output, ReLU applied in place
    void *p2r;     // (980) p2 as NCHW rows = fc input (channels-last backends)
    void *dp2r;    // (980) gradient w.r.t. p2r
    int *arg2;     // (980)
    float *logits; // (10) fp32
    void *dp2;     // (980) gradient w.r.t. p2
    void *dz2;     // (20, 14, 14) gradient w.r.t. conv2's output
    void *dp1;     // (20, 14, 14) gradient w.r.t. p1
    void *dz1;     // (20, 28, 28) gradient w.r.t. conv1's output
    float *dcol;   // (500, 196) one image's im2col gradient (scratch, im2col path only)
} cnn_acts;

struct model {
    ddp_ctx *ctx; /* whose memory the model's buffers are (NULL: host memory) */
    const ops_handle *ops;
    model_config cfg;
    int n_params;
    ddp_param_desc descs[MODEL_MAX_PARAMS];
    size_t numel[MODEL_MAX_PARAMS];
    size_t offset[MODEL_MAX_PARAMS];
    float bound[MODEL_MAX_PARAMS]; /* init range: U(-bound, bound), bound = 1/sqrt(fan_in) */
    size_t numel_total;
    void *weights;   // (numel_total) backend memory, in the model's precision (fp32: the master)
    float *grads;    // (numel_total) same layout, fp32
    /* 16 bits: the biases (read in fp32) widened from the weights as each layer's forward
     * begins, parameter i at rparams + roff[i] (SIZE_MAX: a weight, read in the precision). NULL
     * in fp32. */
    float *rparams;
    size_t roff[MODEL_MAX_PARAMS];
    bool grads_fresh;  /* the next backward overwrites grads (model_zero_grad) */
    ddp_reducer *gather; /* model_set_gather: forward waits for its all-gather layer by layer */
    void *xc;          // (max_batch, 784) the input in the model's precision (unused for fp32)
    void *dlogits_c;   // (max_batch, classes) scaled dlogits in the model's precision
    void *bufs[MODEL_MAX_BUFS]; /* activation allocations, freed by destroy */
    int n_bufs;
    int alloc_failed; /* an activation allocation failed */
    mlp_acts mlp;
    cnn_acts cnn;
    float *dlogits; // (max_batch, classes) fp32
    const void *x;  /* input of the last forward, in the model's precision */
    int batch;      /* its batch size; 0 when there is none to differentiate */
};

/* ---- configuration ------------------------------------------------------------------------- */

void model_config_default(model_config *cfg, model_kind kind)
{
    static const int widths[] = {784, 512, 256, 10};
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->n_widths = (int)(sizeof widths / sizeof widths[0]);
    memcpy(cfg->widths, widths, sizeof widths);
    cfg->max_batch = 64;
    cfg->seed = 42;
}

static const char *const precision_names[] = {"fp32", "bf16", "fp16"};

ddp_status model_precision_parse(const char *name, ddp_dtype *out)
{
    for (int p = DDP_FP32; p <= DDP_FP16; p++) {
        if (name && strcmp(name, precision_names[p]) == 0) {
            *out = (ddp_dtype)p;
            return DDP_OK;
        }
    }
    return DDP_ERR_INVALID_ARG;
}

const char *model_precision_name(ddp_dtype p)
{
    return p >= DDP_FP32 && p <= DDP_FP16 ? precision_names[p] : "?";
}

ddp_status model_kind_parse(const char *name, model_kind *out)
{
    if (name && strcmp(name, "mlp") == 0)
        *out = MODEL_MLP;
    else if (name && strcmp(name, "cnn") == 0)
        *out = MODEL_CNN;
    else
        return DDP_ERR_INVALID_ARG;
    return DDP_OK;
}

ddp_status model_widths_parse(const char *text, model_config *cfg)
{
    int widths[MODEL_MLP_MAX_LAYERS + 1];
    int n = 0;
    const char *p = text;
    while (p && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > MODEL_MLP_MAX_WIDTH || n == MODEL_MLP_MAX_LAYERS + 1 ||
            (*end && *end != '-') || (*end == '-' && !end[1]))
            return DDP_ERR_INVALID_ARG;
        widths[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (n < 2 || widths[0] != MODEL_IMAGE_SIDE * MODEL_IMAGE_SIDE || widths[n - 1] != MODEL_CLASSES)
        return DDP_ERR_INVALID_ARG;
    cfg->n_widths = n;
    memcpy(cfg->widths, widths, (size_t)n * sizeof widths[0]);
    return DDP_OK;
}

/* ---- parameters ---------------------------------------------------------------------------- */

static void add_param(model *m, const char *layer, const char *what, int n_dims,
                          const int64_t *shape, int fan_in)
{
    int i = m->n_params++;
    ddp_param_desc *d = &m->descs[i];
    snprintf(d->name, sizeof d->name, "%s.%s", layer, what);
    d->n_dims = n_dims;
    memcpy(d->shape, shape, (size_t)n_dims * sizeof shape[0]);
    m->numel[i] = ddp_param_numel(d);
    m->offset[i] = m->numel_total;
    m->numel_total += m->numel[i];
    m->bound[i] = 1.0f / sqrtf((float)fan_in);
}

/* Weight (out, in) and bias (out). */
static void add_linear(model *m, const char *layer, int in, int out)
{
    int64_t w[2] = {out, in}, b[1] = {out};
    add_param(m, layer, "weight", 2, w, in);
    add_param(m, layer, "bias", 1, b, in);
}

/* Weight (out, in, k, k) and bias (out). */
static void add_conv(model *m, const char *layer, int in, int out, int k)
{
    int64_t w[4] = {out, in, k, k}, b[1] = {out};
    add_param(m, layer, "weight", 4, w, in * k * k);
    add_param(m, layer, "bias", 1, b, in * k * k);
}

static void describe_params(model *m)
{
    if (m->cfg.kind == MODEL_CNN) {
        add_conv(m, "conv1", 1, MODEL_CNN_CHANNELS, 5);
        add_conv(m, "conv2", MODEL_CNN_CHANNELS, MODEL_CNN_CHANNELS, 5);
        add_linear(m, "fc1", MODEL_CNN_CHANNELS * 7 * 7, MODEL_CLASSES);
        return;
    }
    for (int l = 0; l + 1 < m->cfg.n_widths; l++) {
        char layer[16];
        snprintf(layer, sizeof layer, "fc%d", l + 1);
        add_linear(m, layer, m->cfg.widths[l], m->cfg.widths[l + 1]);
    }
}

/* Bias i as the layers read it, fp32: the weights, or their widened copy in 16 bits. */
static float *param(model *m, int i)
{
    return m->rparams ? m->rparams + m->roff[i] : (float *)m->weights + m->offset[i];
}
/* Parameter i in the model's precision: what GEMMs and convolutions read. */
static const void *cparam(model *m, int i)
{
    return (const char *)m->weights + m->offset[i] * ops_dtype_size(m->ops, m->cfg.precision);
}
/* Where backward writes parameter i's gradient: the flat buffer, or under cfg.reducer_grads the
 * place r gives it in this micro-step (inside its bucket's buffer, zeroed when handed out). */
static ddp_status grad(model *m, ddp_reducer *r, int i, float **out)
{
    if (!m->cfg.reducer_grads) {
        *out = m->grads + m->offset[i];
        return DDP_OK;
    }
    void *p = NULL;
    ddp_status st = ddp_reducer_grad_ptr(r, i, &p);
    *out = p;
    return st;
}

/* Seeded initialisation on the host, then one upload. */
static ddp_status init_params(model *m)
{
    float *host = malloc(m->numel_total * sizeof *host); // (numel_total)
    if (!host)
        return DDP_ERR_NOMEM;
    for (int i = 0; i < m->n_params; i++)
        ddp_init_uniform(host + m->offset[i], m->numel[i], m->cfg.seed, (uint32_t)i, -m->bound[i],
                         m->bound[i]);
    ddp_status st = ops_weights_put(m->ops, m->cfg.precision, m->weights, host, m->numel_total);
    free(host);
    return st;
}

/* ---- activations --------------------------------------------------------------------------- */

/* A zeroed backend buffer of n_bytes owned by the model; NULL when out of memory. */
static void *buf(model *m, size_t n_bytes)
{
    void *p = m->n_bufs < MODEL_MAX_BUFS ? ddp_alloc(m->ctx, n_bytes) : NULL;
    if (p)
        m->bufs[m->n_bufs++] = p;
    else
        m->alloc_failed = 1;
    return p;
}

static float *fbuf(model *m, size_t per_sample)
{
    return buf(m, (size_t)m->cfg.max_batch * per_sample * sizeof(float));
}

/* An activation buffer in the model's precision. */
static void *abuf(model *m, size_t per_sample)
{
    return buf(m, (size_t)m->cfg.max_batch * per_sample * ops_dtype_size(m->ops, m->cfg.precision));
}

static ddp_status alloc_mlp(model *m)
{
    mlp_acts *a = &m->mlp;
    int n_layers = m->cfg.n_widths - 1, widest = 1;
    for (int l = 0; l < n_layers; l++) {
        size_t w = (size_t)m->cfg.widths[l + 1];
        a->z[l] = l + 1 == n_layers ? fbuf(m, w) : abuf(m, w);
        if (l + 1 == n_layers)
            break;
        a->a[l] = abuf(m, w);
        a->dz[l] = abuf(m, w);
        widest = m->cfg.widths[l + 1] > widest ? m->cfg.widths[l + 1] : widest;
    }
    a->dh = abuf(m, (size_t)widest);
    return m->alloc_failed ? DDP_ERR_NOMEM : DDP_OK;
}

static ddp_status alloc_cnn(model *m)
{
    cnn_acts *a = &m->cnn;
    const int c = MODEL_CNN_CHANNELS, s = MODEL_IMAGE_SIDE;
    TRY_OK(layer_conv_init(m->ops, &a->conv1, 1, s, s, c, 5, 2));
    TRY_OK(layer_conv_init(m->ops, &a->conv2, c, s / 2, s / 2, c, 5, 2));
    size_t big = (size_t)c * s * s, mid = big / 4, small = big / 16;
    if (!layer_conv_direct(m->ops)) {
        a->col1 = fbuf(m, layer_conv_col_numel(&a->conv1));
        a->col2 = fbuf(m, layer_conv_col_numel(&a->conv2));
        a->dcol = buf(m, layer_conv_col_numel(&a->conv2) * sizeof(float));
    }
    a->z1 = abuf(m, big);
    a->p1 = abuf(m, mid);
    a->arg1 = buf(m, (size_t)m->cfg.max_batch * mid * sizeof(int));
    a->z2 = abuf(m, mid);
    a->p2 = abuf(m, small);
    a->p2r = abuf(m, small);
    a->dp2r = abuf(m, small);
    a->arg2 = buf(m, (size_t)m->cfg.max_batch * small * sizeof(int));
    a->logits = fbuf(m, MODEL_CLASSES);
    a->dp2 = abuf(m, small);
    a->dz2 = abuf(m, mid);
    a->dp1 = abuf(m, mid);
    a->dz1 = abuf(m, big);
    return m->alloc_failed ? DDP_ERR_NOMEM : DDP_OK;
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

static ddp_status check_config(const model_config *cfg)
{
    if (cfg->max_batch < 1 || (cfg->kind != MODEL_MLP && cfg->kind != MODEL_CNN) ||
        cfg->precision < DDP_FP32 || cfg->precision > DDP_FP16)
        return DDP_ERR_INVALID_ARG;
    if (cfg->kind == MODEL_CNN)
        return DDP_OK;
    if (cfg->n_widths < 2 || cfg->n_widths > MODEL_MLP_MAX_LAYERS + 1)
        return DDP_ERR_INVALID_ARG;
    for (int i = 0; i < cfg->n_widths; i++) {
        if (cfg->widths[i] < 1)
            return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

static ddp_status model_setup(model *m)
{
    describe_params(m);
    m->weights = ddp_alloc(m->ctx, m->numel_total * ops_dtype_size(m->ops, m->cfg.precision));
    m->grads = m->cfg.reducer_grads ? NULL : ddp_alloc(m->ctx, m->numel_total * sizeof(float));
    if (!m->weights || (!m->grads && !m->cfg.reducer_grads))
        return DDP_ERR_NOMEM;
    int classes = m->cfg.kind == MODEL_CNN ? MODEL_CLASSES : m->cfg.widths[m->cfg.n_widths - 1];
    m->dlogits = fbuf(m, (size_t)classes);
    m->dlogits_c = m->dlogits;
    if (m->cfg.precision != DDP_FP32) {
        size_t n = 0;
        for (int i = 0; i < m->n_params; i++) {
            m->roff[i] = m->descs[i].n_dims == 1 ? n : SIZE_MAX;
            n += m->descs[i].n_dims == 1 ? m->numel[i] : 0;
        }
        m->rparams = fbuf(m, n);
        m->xc = abuf(m, MODEL_IMAGE_SIDE * MODEL_IMAGE_SIDE);
        m->dlogits_c = abuf(m, (size_t)classes);
    }
    TRY_OK(m->cfg.kind == MODEL_CNN ? alloc_cnn(m) : alloc_mlp(m));
    return init_params(m);
}

ddp_status model_create(ddp_ctx *ctx, const ops_handle *ops, const model_config *cfg,
                        model **out)
{
    *out = NULL;
    if (ops && ops->ctx != ctx) {
        DDP_ERROR("model_create: the ops handle was opened on another context");
        return DDP_ERR_INVALID_ARG;
    }
    if (!cfg || check_config(cfg) != DDP_OK) {
        DDP_ERROR("model_create: invalid model configuration");
        return DDP_ERR_INVALID_ARG;
    }
    TRY_OK(ops_require(ops, cfg->kind == MODEL_CNN ? "cnn" : "mlp"));
    TRY_OK(ops_require_precision(ops, cfg->precision,
                                           cfg->kind == MODEL_CNN ? "cnn" : "mlp"));
    model *m = calloc(1, sizeof *m);
    if (!m)
        return DDP_ERR_NOMEM;
    m->ctx = ctx;
    m->ops = ops;
    m->cfg = *cfg;
    ddp_status st = model_setup(m);
    if (st == DDP_ERR_NOMEM)
        DDP_ERROR("model_create: out of memory for %zu parameters (values and gradients) "
                  "and the activations of %d samples: use a smaller batch or model",
                  m->numel_total, cfg->max_batch);
    else if (st != DDP_OK)
        DDP_ERROR("model_create: %s", ddp_strerror(st));
    if (st != DDP_OK) {
        model_destroy(m);
        return st;
    }
    *out = m;
    return DDP_OK;
}

void model_destroy(model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_bufs; i++)
        ddp_free(m->ctx, m->bufs[i]);
    layer_conv_release(m->ops, &m->cnn.conv1);
    layer_conv_release(m->ops, &m->cnn.conv2);
    ddp_free(m->ctx, m->weights);
    ddp_free(m->ctx, m->grads);
    free(m);
}

int model_n_params(const model *m) { return m->n_params; }
const ddp_param_desc *model_descs(const model *m) { return m->descs; }
const size_t *model_numel(const model *m) { return m->numel; }
size_t model_numel_total(const model *m) { return m->numel_total; }
float *model_params(model *m) { return m->cfg.precision == DDP_FP32 ? m->weights : NULL; }
void *model_weights(model *m, ddp_dtype *p)
{
    *p = m->cfg.precision;
    return m->weights;
}
float *model_grads(model *m) { return m->grads; }
void model_set_gather(model *m, ddp_reducer *r) { m->gather = r; }
const ops_handle *model_ops(const model *m) { return m->ops; }

/* ---- forward ------------------------------------------------------------------------------- */

/* Parameters lo..hi as the next layer reads them: with model_set_gather their all-gather has
 * arrived, and in 16 bits the biases among them are widened. */
static ddp_status gathered(model *m, int lo, int hi)
{
    size_t es = ops_dtype_size(m->ops, m->cfg.precision);
    for (int i = lo; i <= hi; i++) {
        if (m->gather)
            TRY_OK(ddp_reducer_gather_wait(m->gather, i));
        if (m->rparams && m->roff[i] != SIZE_MAX)
            TRY_OK(m->ops->cast(m->ops, DDP_FP32, m->rparams + m->roff[i], m->cfg.precision,
                                (const char *)m->weights + m->offset[i] * es, m->numel[i]));
    }
    return DDP_OK;
}

/* Returns the logits (batch, classes) of the MLP. */
static ddp_status mlp_forward(model *m, const float **logits)
{
    mlp_acts *a = &m->mlp;
    int n_layers = m->cfg.n_widths - 1;
    ddp_dtype p = m->cfg.precision;
    const void *h = m->x; // (batch, widths[l])
    for (int l = 0; l < n_layers; l++) {
        int in = m->cfg.widths[l], out = m->cfg.widths[l + 1];
        ddp_trace_begin("forward.layer", l);
        TRY_OK(gathered(m, 2 * l, 2 * l + 1));
        TRY_OK(layer_linear_fwd(m->ops, p, h, cparam(m, 2 * l), param(m, 2 * l + 1),
                                m->batch, in, out, a->z[l], l + 1 == n_layers));
        if (l + 1 < n_layers)
            TRY_OK(layer_relu_fwd(m->ops, p, a->z[l], (size_t)m->batch * out, a->a[l]));
        ddp_trace_end("forward.layer", l);
        if (l + 1 == n_layers)
            break;
        h = a->a[l];
    }
    *logits = a->z[n_layers - 1];
    return DDP_OK;
}

static ddp_status cnn_forward(model *m, const float **logits)
{
    cnn_acts *a = &m->cnn;
    const ops_handle *o = m->ops;
    ddp_dtype p = m->cfg.precision;
    const int c = MODEL_CNN_CHANNELS;
    int b = m->batch, planes = b * c;
    size_t ws1 = (size_t)planes * 14 * 14 * sizeof(int), ws2 = (size_t)planes * 7 * 7 * sizeof(int);
    /* pool(relu(z)) computed as relu(pool(z)): the same values (max and ReLU commute) and, in the
     * backward pass, the same gradients (a window whose max is <= 0 gets none either way), with the
     * ReLU on a quarter of the elements. */
    ddp_trace_begin("forward.layer", 0); /* conv1, pool, relu */
    TRY_OK(gathered(m, 0, 1));
    TRY_OK(layer_conv_fwd(o, p, &a->conv1, m->x, cparam(m, 0), param(m, 1), b, a->col1, a->z1));
    TRY_OK(layer_pool_fwd(o, p, a->z1, b, c, 28, 28, a->p1, a->arg1, ws1));
    TRY_OK(layer_relu_fwd(o, p, a->p1, (size_t)planes * 14 * 14, a->p1));
    ddp_trace_end("forward.layer", 0);
    ddp_trace_begin("forward.layer", 1); /* conv2, pool, relu */
    TRY_OK(gathered(m, 2, 3));
    TRY_OK(layer_conv_fwd(o, p, &a->conv2, a->p1, cparam(m, 2), param(m, 3), b, a->col2, a->z2));
    TRY_OK(layer_pool_fwd(o, p, a->z2, b, c, 14, 14, a->p2, a->arg2, ws2));
    TRY_OK(layer_relu_fwd(o, p, a->p2, (size_t)planes * 7 * 7, a->p2));
    ddp_trace_end("forward.layer", 1);
    ddp_trace_begin("forward.layer", 2); /* fc */
    TRY_OK(gathered(m, 4, 5));
    const void *rows = layer_image_as_rows(o, p, a->p2, a->p2r, b, c, 7, 7); // (b, 980) NCHW order
    if (!rows)
        return DDP_ERR_BLAS;
    TRY_OK(layer_linear_fwd(o, p, rows, cparam(m, 4), param(m, 5), b, c * 7 * 7, MODEL_CLASSES,
                            a->logits, true));
    ddp_trace_end("forward.layer", 2);
    *logits = a->logits;
    return DDP_OK;
}

/* Puts the input in the model's precision. */
static ddp_status model_prepare(model *m, const float *x, int batch)
{
    ddp_dtype p = m->cfg.precision;
    m->x = x;
    if (p == DDP_FP32)
        return DDP_OK;
    m->x = m->xc;
    return m->ops->cast(m->ops, p, m->xc, DDP_FP32, x, (size_t)batch * MODEL_IMAGE_SIDE * MODEL_IMAGE_SIDE);
}

/* Downloads the logits and writes each row's argmax to pred_host. */
static ddp_status predict(model *m, const float *logits, int classes, int *pred_host)
{
    float *host = malloc((size_t)m->batch * classes * sizeof *host); // (batch, classes)
    if (!host)
        return DDP_ERR_NOMEM;
    ddp_status st = ddp_download(m->ctx, host, logits, (size_t)m->batch * classes * sizeof *host);
    for (int r = 0; st == DDP_OK && r < m->batch; r++)
        row_max(host + (size_t)r * classes, classes, &pred_host[r]);
    free(host);
    return st;
}

static int model_classes(const model *m)
{
    return m->cfg.kind == MODEL_CNN ? MODEL_CLASSES : m->cfg.widths[m->cfg.n_widths - 1];
}

/* Checks the batch and runs the layers up to the logits. */
static ddp_status model_logits(model *m, const float *x, const int *labels, int batch,
                               const float **logits)
{
    if (batch < 1 || batch > m->cfg.max_batch || !x || !labels) {
        DDP_ERROR("model_forward: batch %d outside [1, %d] or no input", batch,
                  m->cfg.max_batch);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status prep = model_prepare(m, x, batch);
    if (prep != DDP_OK)
        return prep;
    m->batch = batch;
    ddp_status st = m->cfg.kind == MODEL_CNN ? cnn_forward(m, logits)
                                                 : mlp_forward(m, logits);
    if (st != DDP_OK)
        m->batch = 0;
    return st;
}

ddp_status model_forward_train(model *m, const float *x, const int *labels, int batch,
                               float *loss_acc)
{
    const float *logits = NULL;
    ddp_status st = model_logits(m, x, labels, batch, &logits);
    if (st == DDP_OK)
        st = m->ops->softmax_xent_acc(m->ops, logits, labels, batch, model_classes(m), m->dlogits,
                                      loss_acc);
    if (st != DDP_OK)
        m->batch = 0;
    return st;
}

ddp_status model_forward(model *m, const float *x, const int *labels, int batch,
                         float *loss, int *correct, int *pred_host)
{
    const float *logits = NULL;
    int classes = model_classes(m);
    float l = 0.0f;
    int c = 0;
    ddp_status st = model_logits(m, x, labels, batch, &logits);
    if (st == DDP_OK)
        st = layer_xent_fwd(m->ops, logits, labels, batch, classes, m->dlogits, &l, &c);
    if (st == DDP_OK && pred_host)
        st = predict(m, logits, classes, pred_host);
    if (st != DDP_OK) {
        m->batch = 0;
        return st;
    }
    if (loss)
        *loss = l;
    if (correct)
        *correct = c;
    return DDP_OK;
}

/* ---- backward ------------------------------------------------------------------------------ */

/* Marks parameters hi, hi-1, ..., lo ready (reverse order). */
static ddp_status mark(ddp_reducer *r, int hi, int lo)
{
    for (int i = hi; r && i >= lo; i--)
        TRY_OK(ddp_reducer_mark_ready(r, i));
    return DDP_OK;
}

static ddp_status mlp_backward(model *m, ddp_reducer *r)
{
    mlp_acts *a = &m->mlp;
    ddp_dtype p = m->cfg.precision;
    bool acc = m->cfg.reducer_grads || !m->grads_fresh;
    float *gw = NULL, *gb = NULL;
    const void *g = m->dlogits_c; // (batch, widths[l+1]): gradient w.r.t. z[l]
    for (int l = m->cfg.n_widths - 2; l >= 0; l--) {
        int in = m->cfg.widths[l], out = m->cfg.widths[l + 1];
        const void *h = l ? a->a[l - 1] : m->x; // (batch, in)
        ddp_trace_begin("backward.layer", l);
        /* The bias first (a column sum), marked before the weight GEMM: a bucket that holds this
         * bias and the layers after it is launched without waiting for the GEMM (the first
         * bucket holds the first layer's bias: 1 MiB fits every layer but its weights). */
        TRY_OK(grad(m, r, 2 * l + 1, &gb));
        TRY_OK(layer_linear_bwd_params(m->ops, p, h, g, m->batch, in, out, NULL, gb, acc));
        TRY_OK(mark(r, 2 * l + 1, 2 * l + 1));
        TRY_OK(grad(m, r, 2 * l, &gw));
        TRY_OK(layer_linear_bwd_params(m->ops, p, h, g, m->batch, in, out, gw, NULL, acc));
        TRY_OK(mark(r, 2 * l, 2 * l));
        if (l > 0) {
            TRY_OK(layer_linear_bwd_input(m->ops, p, cparam(m, 2 * l), g, m->batch, in, out, a->dh));
            TRY_OK(layer_relu_bwd(m->ops, p, a->dh, a->a[l - 1], (size_t)m->batch * in, a->dz[l - 1]));
        }
        ddp_trace_end("backward.layer", l);
        if (l == 0)
            break;
        g = a->dz[l - 1];
    }
    return DDP_OK;
}

static ddp_status cnn_backward(model *m, ddp_reducer *r)
{
    cnn_acts *a = &m->cnn;
    const ops_handle *o = m->ops;
    ddp_dtype p = m->cfg.precision;
    const int c = MODEL_CNN_CHANNELS;
    int b = m->batch, planes = b * c, fc_in = c * 7 * 7;
    bool acc = m->cfg.reducer_grads || !m->grads_fresh;
    float *gw = NULL, *gb = NULL;
    const void *rows = o->channels_last ? a->p2r : a->p2; /* what the forward pass fed fc1 */
    void *drows = o->channels_last ? a->dp2r : a->dp2;
    ddp_trace_begin("backward.layer", 2); /* fc */
    TRY_OK(grad(m, r, 4, &gw));
    TRY_OK(grad(m, r, 5, &gb));
    TRY_OK(layer_linear_bwd_params(o, p, rows, m->dlogits_c, b, fc_in, MODEL_CLASSES, gw, gb, acc));
    TRY_OK(mark(r, 5, 4));
    TRY_OK(layer_linear_bwd_input(o, p, cparam(m, 4), m->dlogits_c, b, fc_in, MODEL_CLASSES, drows));
    TRY_OK(layer_rows_to_image(o, p, drows, a->dp2, b, c, 7, 7));
    ddp_trace_end("backward.layer", 2);
    ddp_trace_begin("backward.layer", 1); /* relu, pool, conv2 */
    TRY_OK(layer_relu_bwd(o, p, a->dp2, a->p2, (size_t)planes * 7 * 7, a->dp2));
    TRY_OK(layer_pool_bwd(o, p, a->dp2, a->arg2, b, c, 14, 14, a->dz2));
    TRY_OK(grad(m, r, 2, &gw));
    TRY_OK(grad(m, r, 3, &gb));
    TRY_OK(layer_conv_bwd_params(o, p, &a->conv2, a->p1, a->col2, a->dz2, b, gw, gb, acc));
    TRY_OK(mark(r, 3, 2));
    TRY_OK(layer_conv_bwd_input(o, p, &a->conv2, cparam(m, 2), a->dz2, b, a->dcol, a->dp1));
    ddp_trace_end("backward.layer", 1);
    ddp_trace_begin("backward.layer", 0); /* relu, pool, conv1 */
    TRY_OK(layer_relu_bwd(o, p, a->dp1, a->p1, (size_t)planes * 14 * 14, a->dp1));
    TRY_OK(layer_pool_bwd(o, p, a->dp1, a->arg1, b, c, 28, 28, a->dz1));
    TRY_OK(grad(m, r, 0, &gw));
    TRY_OK(grad(m, r, 1, &gb));
    TRY_OK(layer_conv_bwd_params(o, p, &a->conv1, m->x, a->col1, a->dz1, b, gw, gb, acc));
    ddp_trace_end("backward.layer", 0);
    return mark(r, 1, 0);
}

/* The loss gradient (fp32, scaled by model_scale_loss_grad when the caller scales the loss) in
 * the model's precision, for the backward pass. The loss itself stays fp32. */
static ddp_status dlogits_in_precision(model *m)
{
    size_t n = (size_t)m->batch * MODEL_CLASSES;
    if (m->cfg.kind == MODEL_MLP)
        n = (size_t)m->batch * (size_t)m->cfg.widths[m->cfg.n_widths - 1];
    if (m->cfg.precision == DDP_FP32)
        return DDP_OK;
    return m->ops->cast(m->ops, m->cfg.precision, m->dlogits_c, DDP_FP32, m->dlogits, n);
}

ddp_status model_backward(model *m, ddp_reducer *r)
{
    if (m->batch < 1) {
        DDP_ERROR("model_backward: no successful forward pass to differentiate");
        return DDP_ERR_STATE;
    }
    if (m->cfg.reducer_grads && !r) {
        DDP_ERROR("model_backward: the model has no gradient buffer (reducer_grads): pass the reducer");
        return DDP_ERR_INVALID_ARG;
    }
    TRY_OK(dlogits_in_precision(m));
    TRY_OK(m->cfg.kind == MODEL_CNN ? cnn_backward(m, r) : mlp_backward(m, r));
    m->grads_fresh = false;
    return DDP_OK;
}

ddp_status model_scale_loss_grad(model *m, float scale)
{
    if (m->batch < 1) {
        DDP_ERROR("model_scale_loss_grad: no forward pass to scale");
        return DDP_ERR_STATE;
    }
    return m->ops->scale(m->ops, DDP_FP32, m->dlogits,
                         (size_t)m->batch * (size_t)model_classes(m), scale);
}

/* No pass over memory (PyTorch's zero_grad(set_to_none=True) spares it alike): the next backward
 * overwrites each gradient instead of adding to it. */
ddp_status model_zero_grad(model *m)
{
    m->grads_fresh = true;
    return DDP_OK;
}

/* ---- classification report ------------------------------------------------------------------ */

double model_confusion_accuracy(const float *confusion)
{
    double correct = 0.0, total = 0.0;
    for (int t = 0; t < MODEL_N_CLASSES; t++) {
        for (int q = 0; q < MODEL_N_CLASSES; q++)
            total += confusion[t * MODEL_N_CLASSES + q];
        correct += confusion[t * MODEL_N_CLASSES + t];
    }
    return total > 0 ? correct / total : 0.0;
}

/* Precision, recall, F1 and support of class c. */
static void class_scores(const float *confusion, int c, double *prec, double *rec, double *f1,
                         double *support)
{
    double tp = confusion[c * MODEL_N_CLASSES + c], predicted = 0.0, actual = 0.0;
    for (int k = 0; k < MODEL_N_CLASSES; k++) {
        predicted += confusion[k * MODEL_N_CLASSES + c];
        actual += confusion[c * MODEL_N_CLASSES + k];
    }
    *prec = predicted > 0 ? tp / predicted : 0.0;
    *rec = actual > 0 ? tp / actual : 0.0;
    *f1 = *prec + *rec > 0 ? 2.0 * *prec * *rec / (*prec + *rec) : 0.0;
    *support = actual;
}

void model_class_report(FILE *f, const float *confusion)
{
    double macro[3] = {0}, weighted[3] = {0}, total = 0.0;
    fprintf(f, "%12s %10s %10s %10s %10s\n\n", "", "precision", "recall", "f1-score", "support");
    for (int c = 0; c < MODEL_N_CLASSES; c++) {
        double s[3], support;
        class_scores(confusion, c, &s[0], &s[1], &s[2], &support);
        fprintf(f, "%12d %10.4f %10.4f %10.4f %10.0f\n", c, s[0], s[1], s[2], support);
        for (int k = 0; k < 3; k++) {
            macro[k] += s[k] / MODEL_N_CLASSES;
            weighted[k] += s[k] * support;
        }
        total += support;
    }
    for (int k = 0; k < 3 && total > 0; k++)
        weighted[k] /= total;
    fprintf(f, "\n%12s %10s %10s %10.4f %10.0f\n", "accuracy", "", "",
            model_confusion_accuracy(confusion), total);
    fprintf(f, "%12s %10.4f %10.4f %10.4f %10.0f\n", "macro avg", macro[0], macro[1], macro[2],
            total);
    fprintf(f, "%12s %10.4f %10.4f %10.4f %10.0f\n", "weighted avg", weighted[0], weighted[1],
            weighted[2], total);
}
