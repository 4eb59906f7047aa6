/* cuda_cudnn.cu - the CUDA backend's convolutions on cuDNN (forward, backward data, backward
 * filter), batched: one cuDNN call per batch. The GPU twin of cpu_dnnl.c: a plan per direction,
 * shape, batch, precision and TF32 setting, made on first use and cached. Making a plan measures
 * every algorithm cuDNN has for it (cudnnFindConvolution*Algorithm: PyTorch's
 * cudnn.benchmark) and keeps the fastest deterministic one that succeeded, with the workspace it
 * needs; one workspace serves all plans and grows to the largest. Winograd algorithms are left
 * out for their accuracy (conv_winograd). DDP_CUDNN_BENCHMARK=0 takes cuDNN's heuristic ranking
 * instead, for bit-identical reruns (conv_measure).
 *
 * cuDNN 9 still ships this (legacy) convolution API, marked deprecated in favour of the graph API;
 * its headers warn only under CUDNN_WARN_DEPRECATED.
 *
 * Precisions (ops.h): fp32 runs fp32 convolutions with FMA math (exact fp32) unless --tf32 lets
 * cuDNN use TF32 tensor cores (default math). bf16 runs bf16 tensors with fp32 compute on tensor
 * cores for forward and backward data; the weight gradient, fp32 by contract, is computed from
 * fp32 copies of x and dy (bf16 values are exact in TF32, so default math loses nothing). fp16 is
 * emulated: fp32 convolutions over half-rounded floats (exact in TF32, so default math), outputs
 * rounded to half after.
 */
#include <cudnn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_private.h"
#include "cuda_sdpa.h"

#define CONV_PLANS 32
#define CONV_KEY_LEN 10

enum { CONV_FWD = 1, CONV_BWD_DATA, CONV_BWD_FILTER };
static const char *const conv_kind_names[] = {"", "conv_fwd", "conv_bwd_data", "conv_bwd_filter"};

typedef struct conv_plan {
    long key[CONV_KEY_LEN];             /* kind, precision, shape, batch, tf32; 0: unused */
    cudnnTensorDescriptor_t x, y;       /* x (batch, c_in, h, w), y (batch, c_out, h_out, w_out) */
    cudnnFilterDescriptor_t w;          /* w (c_out, c_in, k, k) */
    cudnnConvolutionDescriptor_t conv;  /* with the chosen algorithm's math type */
    int algo;                           /* a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    cudnnMathType_t math;               /* the math type it runs with */
    size_t ws_bytes;                    /* workspace that algorithm needs */
} conv_plan;

#define SDPA_PLANS 8

/* A fused attention plan (cuda_sdpa.h) for one direction and shape. */
typedef struct sdpa_slot {
    int key[6]; /* bwd, B, T, NH, hs, dq_accum */
    sdpa_plan *plan; /* NULL: an unused slot */
} sdpa_slot;

/* A handle's cuDNN state (cuda_state.cudnn). */
typedef struct cudnn_state {
    cudnnHandle_t handle;
    sdpa_slot sdpa[SDPA_PLANS]; /* slot i % SDPA_PLANS is reused, as the convolutions' */
    int n_sdpa;
    conv_plan plans[CONV_PLANS];
    int n_made;     /* plans ever made; slot i % CONV_PLANS is reused */
    bool measure;   /* conv_measure(), read when the handle opened */
    char text[512]; /* what ops_cudnn_describe returns */
} cudnn_state;

static cudnn_state *cudnn_of(const ops_handle *ops) { return (cudnn_state *)cuda_of(ops)->cudnn; }

/* Whether algorithms are chosen by measurement (the default: the fastest for this GPU, though
 * timing noise may pick another one in the next run, so two runs need not match bit for bit) or,
 * with DDP_CUDNN_BENCHMARK=0, by cuDNN's heuristics, the same in every run on a GPU model
 * (PyTorch's cudnn.benchmark = False): for bit-identical reruns. */
static bool conv_measure(void)
{
    const char *env = getenv("DDP_CUDNN_BENCHMARK");
    return !(env && strcmp(env, "0") == 0);
}

ddp_status cudnn_open(ops_handle *ops)
{
    cuda_state *cu = cuda_of(ops);
    cudnn_state *cs = (cudnn_state *)calloc(1, sizeof *cs);
    if (!cs)
        return DDP_ERR_NOMEM;
    cu->cudnn = cs;
    cs->measure = conv_measure();
    TRY_CUDNN(cudnnCreate(&cs->handle));
    TRY_CUDNN(cudnnSetStream(cs->handle, cu->stream));
    return DDP_OK;
}

static void conv_plan_release(conv_plan *pl)
{
    if (pl->x)
        LOG_CUDNN(cudnnDestroyTensorDescriptor(pl->x));
    if (pl->y)
        LOG_CUDNN(cudnnDestroyTensorDescriptor(pl->y));
    if (pl->w)
        LOG_CUDNN(cudnnDestroyFilterDescriptor(pl->w));
    if (pl->conv)
        LOG_CUDNN(cudnnDestroyConvolutionDescriptor(pl->conv));
    memset(pl, 0, sizeof *pl);
}

void cudnn_close(ops_handle *ops)
{
    cudnn_state *cs = cudnn_of(ops);
    if (!cs)
        return;
    for (int i = 0; i < CONV_PLANS; i++)
        conv_plan_release(&cs->plans[i]);
    for (int i = 0; i < SDPA_PLANS; i++)
        sdpa_free(cs->sdpa[i].plan);
    if (cs->handle)
        LOG_CUDNN(cudnnDestroy(cs->handle));
    free(cs);
    cuda_of(ops)->cudnn = NULL;
}

/* ---- plans ------------------------------------------------------------------------------- */

/* The tensors' data type: bf16 storage, except the weight gradient's fp32 copies; float else. */
static cudnnDataType_t conv_data_type(int kind, ddp_dtype p)
{
    return p == DDP_BF16 && kind != CONV_BWD_FILTER ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* The math type asked for (see the top of the file). */
static cudnnMathType_t conv_math(const ops_handle *ops, int kind, ddp_dtype p)
{
    cuda_state *cu = cuda_of(ops);
    if (conv_data_type(kind, p) == CUDNN_DATA_BFLOAT16)
        return CUDNN_TENSOR_OP_MATH;
    if (p == DDP_FP32)
        return cu->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    return CUDNN_DEFAULT_MATH;
}

static ddp_status conv_describe(const ops_handle *ops, conv_plan *pl, int kind, ddp_dtype p,
                                const ops_conv_shape *s, int batch)
{
    cudnnDataType_t dt = conv_data_type(kind, p);
    TRY_CUDNN(cudnnCreateTensorDescriptor(&pl->x));
    TRY_CUDNN(cudnnCreateTensorDescriptor(&pl->y));
    TRY_CUDNN(cudnnCreateFilterDescriptor(&pl->w));
    TRY_CUDNN(cudnnCreateConvolutionDescriptor(&pl->conv));
    TRY_CUDNN(cudnnSetTensor4dDescriptor(pl->x, CUDNN_TENSOR_NCHW, dt, batch, s->c_in, s->h, s->w));
    TRY_CUDNN(cudnnSetTensor4dDescriptor(pl->y, CUDNN_TENSOR_NCHW, dt, batch, s->c_out, s->h_out,
                                         s->w_out));
    TRY_CUDNN(cudnnSetFilter4dDescriptor(pl->w, dt, CUDNN_TENSOR_NCHW, s->c_out, s->c_in, s->k, s->k));
    TRY_CUDNN(cudnnSetConvolution2dDescriptor(pl->conv, s->pad, s->pad, 1, 1, 1, 1,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    TRY_CUDNN(cudnnSetConvolutionMathType(pl->conv, conv_math(ops, kind, p)));
    return DDP_OK;
}

/* Whether algo of direction kind is a Winograd variant. Their transforms cost accuracy: on the
 * H100, cuDNN 9.19, fp32 backward data of a 5x5 convolution missed the CPU's result by ~1e-3 of
 * the output's scale with FMA math (FFT and GEMM algorithms: ~1e-6), and ~1e-2 on fp16 values
 * with TF32 math, where the emulation counts on half values staying exact. So no precision
 * takes one unless nothing else runs. */
static bool conv_winograd(int kind, int algo)
{
    if (kind == CONV_FWD)
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    if (kind == CONV_BWD_DATA)
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/* The index of the first result (cuDNN sorts them, fastest or most promising first) that
 * succeeded and is deterministic (same inputs, same bits: no atomics), ran with FMA math when
 * fma_only, and is no Winograd variant unless winograd; -1 if none. */
template <typename Perf>
static int conv_fastest(int kind, const Perf *perf, int n, bool fma_only, bool winograd)
{
    for (int i = 0; i < n; i++) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC &&
            (!fma_only || perf[i].mathType == CUDNN_FMA_MATH) &&
            (winograd || !conv_winograd(kind, (int)perf[i].algo)))
            return i;
    }
    return -1;
}

/* At debug level (DDP_LOG_LEVEL=debug): every result of the ranking, in cuDNN's order, as
 * "algo:ms:math[:nd][:failed]", so a choice can be checked against the alternatives. */
template <typename Perf> static void conv_log_results(int kind, const Perf *perf, int n)
{
    if (ddp_log_get_level() < DDP_LOG_DEBUG)
        return;
    char text[1024];
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof text; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, " %d:%.3f:%d%s%s", (int)perf[i].algo,
                                (double)perf[i].time, (int)perf[i].mathType,
                                perf[i].determinism == CUDNN_DETERMINISTIC ? "" : ":nd",
                                perf[i].status == CUDNN_STATUS_SUCCESS ? "" : ":failed");
    DDP_DEBUG("cuDNN %s results (algo:ms:math):%s", conv_kind_names[kind], text);
}

/* Keeps the fastest measured algorithm and its math type, Winograd variants only as a last
 * resort (conv_winograd). cuDNN's search also times default math (TF32 on Ampere) when FMA math
 * was asked for: exact fp32 prefers an FMA result and keeps FMA math whatever it picks, so TF32
 * never slips in without --tf32. Returns the index chosen, or -1 when no algorithm ran (logged). */
template <typename Perf>
static int conv_choose(const ops_handle *ops, conv_plan *pl, int kind, ddp_dtype p,
                       const Perf *perf, int n)
{
    bool fma = conv_math(ops, kind, p) == CUDNN_FMA_MATH;
    conv_log_results(kind, perf, n);
    int i = conv_fastest(kind, perf, n, fma, false);
    i = i < 0 ? conv_fastest(kind, perf, n, false, false) : i;
    i = i < 0 ? conv_fastest(kind, perf, n, false, true) : i;
    if (i < 0) {
        DDP_ERROR("cuDNN: no deterministic %s algorithm runs for this shape in %s (%d tried)",
                  conv_kind_names[kind], p == DDP_BF16 ? "bf16" : "fp32", n);
        return -1;
    }
    pl->algo = (int)perf[i].algo;
    pl->ws_bytes = perf[i].memory;
    DDP_DEBUG("cuDNN %s: algorithm %d, %.3f ms, workspace %zu bytes, math type %d",
              conv_kind_names[kind], pl->algo, (double)perf[i].time, pl->ws_bytes,
              (int)perf[i].mathType);
    return i;
}

/* The chosen result's math type on the descriptor (FMA stays for exact fp32). */
static ddp_status conv_set_math(const ops_handle *ops, conv_plan *pl, int kind, ddp_dtype p,
                                cudnnMathType_t math)
{
    pl->math = conv_math(ops, kind, p) == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : math;
    TRY_CUDNN(cudnnSetConvolutionMathType(pl->conv, pl->math));
    return DDP_OK;
}

/* Ranks the algorithms of the plan's direction, by measurement (cuDNN allocates its own test
 * buffers) or heuristics (conv_measure), keeps the first usable one and sizes its workspace with
 * the math type it will run with. */
static ddp_status conv_find(const ops_handle *ops, conv_plan *pl, int kind, ddp_dtype p)
{
    int n = 0, i;
    size_t bytes = 0;
    bool measure = cudnn_of(ops)->measure;
    if (kind == CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        if (measure)
            TRY_CUDNN(cudnnFindConvolutionForwardAlgorithm(cudnn_of(ops)->handle, pl->x, pl->w, pl->conv, pl->y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
        else
            TRY_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_of(ops)->handle, pl->x, pl->w, pl->conv, pl->y,
                                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
        if ((i = conv_choose(ops, pl, kind, p, perf, n)) < 0)
            return DDP_ERR_UNSUPPORTED;
        TRY_OK(conv_set_math(ops, pl, kind, p, perf[i].mathType));
        TRY_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(cudnn_of(ops)->handle, pl->x, pl->w, pl->conv, pl->y,
                                                          perf[i].algo, &bytes));
    } else if (kind == CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        if (measure)
            TRY_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(
                cudnn_of(ops)->handle, pl->w, pl->y, pl->conv, pl->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
        else
            TRY_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                cudnn_of(ops)->handle, pl->w, pl->y, pl->conv, pl->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
        if ((i = conv_choose(ops, pl, kind, p, perf, n)) < 0)
            return DDP_ERR_UNSUPPORTED;
        TRY_OK(conv_set_math(ops, pl, kind, p, perf[i].mathType));
        TRY_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_of(ops)->handle, pl->w, pl->y, pl->conv,
                                                               pl->x, perf[i].algo, &bytes));
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        if (measure)
            TRY_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(
                cudnn_of(ops)->handle, pl->x, pl->y, pl->conv, pl->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
        else
            TRY_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                cudnn_of(ops)->handle, pl->x, pl->y, pl->conv, pl->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
        if ((i = conv_choose(ops, pl, kind, p, perf, n)) < 0)
            return DDP_ERR_UNSUPPORTED;
        TRY_OK(conv_set_math(ops, pl, kind, p, perf[i].mathType));
        TRY_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_of(ops)->handle, pl->x, pl->y, pl->conv,
                                                                 pl->w, perf[i].algo, &bytes));
    }
    pl->ws_bytes = bytes > pl->ws_bytes ? bytes : pl->ws_bytes;
    return DDP_OK;
}

/* The cached plan of one direction, made (and measured) on first use. */
static ddp_status conv_plan_get(const ops_handle *ops, int kind, ddp_dtype p,
                                const ops_conv_shape *s, int batch, conv_plan **out)
{
    cuda_state *cu = cuda_of(ops);
    long key[CONV_KEY_LEN] = {kind, p, batch, s->c_in, s->h, s->w, s->c_out, s->k, s->pad, cu->tf32};
    int n = cudnn_of(ops)->n_made < CONV_PLANS ? cudnn_of(ops)->n_made : CONV_PLANS;
    for (int i = 0; i < n; i++) {
        if (memcmp(cudnn_of(ops)->plans[i].key, key, sizeof key) == 0) {
            *out = &cudnn_of(ops)->plans[i];
            return DDP_OK;
        }
    }
    if (!cudnn_of(ops) || batch < 1)
        return DDP_ERR_INVALID_ARG;
    conv_plan *pl = &cudnn_of(ops)->plans[cudnn_of(ops)->n_made % CONV_PLANS];
    conv_plan_release(pl);
    ddp_status st = conv_describe(ops, pl, kind, p, s, batch);
    if (st == DDP_OK)
        st = conv_find(ops, pl, kind, p);
    if (st != DDP_OK) {
        conv_plan_release(pl);
        return st;
    }
    memcpy(pl->key, key, sizeof key);
    cudnn_of(ops)->n_made++;
    *out = pl;
    return DDP_OK;
}

/* The shared workspace, grown to the plan's need. */
static ddp_status conv_workspace(const ops_handle *ops, const conv_plan *pl, void **ws)
{
    return cuda_scratch(ops, CUDA_SCRATCH_CUDNN_WS, pl->ws_bytes ? pl->ws_bytes : 1, ws);
}

/* ---- the ops ----------------------------------------------------------------------------- */

/* bf16: cuDNN rounds the convolution to bf16 and the bias add rounds again (cuDNN's legacy
 * bf16 convolution has no fp32 output); fp32 and fp16: the bias is added to the fp32 result, and
 * fp16 rounds once. */
static ddp_status cudnn_conv_fwd(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                 int batch, const void *x, const void *w, const float *b, void *y)
{
    conv_plan *pl;
    void *ws;
    const float one = 1.0f, zero = 0.0f;
    TRY_OK(conv_plan_get(ops, CONV_FWD, p, s, batch, &pl));
    TRY_OK(conv_workspace(ops, pl, &ws));
    TRY_CUDNN(cudnnConvolutionForward(cudnn_of(ops)->handle, &one, pl->x, x, pl->w, w, pl->conv,
                                      (cudnnConvolutionFwdAlgo_t)pl->algo, ws, pl->ws_bytes,
                                      &zero, pl->y, y));
    return cuda_add_channel_bias(ops, p, y, b, batch, s->c_out, s->h_out * s->w_out);
}

static ddp_status cudnn_conv_bwd_input(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                       int batch, const void *w, const void *dy, void *dx)
{
    conv_plan *pl;
    void *ws;
    const float one = 1.0f, zero = 0.0f;
    TRY_OK(conv_plan_get(ops, CONV_BWD_DATA, p, s, batch, &pl));
    TRY_OK(conv_workspace(ops, pl, &ws));
    TRY_CUDNN(cudnnConvolutionBackwardData(cudnn_of(ops)->handle, &one, pl->w, w, pl->y, dy, pl->conv,
                                           (cudnnConvolutionBwdDataAlgo_t)pl->algo, ws,
                                           pl->ws_bytes, &zero, pl->x, dx));
    if (p != DDP_FP16)
        return DDP_OK;
    return cuda_round_fp16(ops, (float *)dx, (size_t)batch * s->c_in * s->h * s->w);
}

/* fp32 copies of bf16 x and dy for the weight gradient (see the top); the tensors themselves
 * otherwise. */
static ddp_status conv_fp32_inputs(const ops_handle *ops, ddp_dtype p, const ops_conv_shape *s,
                                   int batch, const void **x, const void **dy)
{
    if (p != DDP_BF16)
        return DDP_OK;
    size_t n_x = (size_t)batch * s->c_in * s->h * s->w, n_y = (size_t)batch * s->c_out * s->h_out * s->w_out;
    void *xf, *dyf;
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_CONV_X, n_x * sizeof(float), &xf));
    TRY_OK(cuda_scratch(ops, CUDA_SCRATCH_CONV_DY, n_y * sizeof(float), &dyf));
    TRY_OK(cuda_to_fp32(ops, p, (float *)xf, *x, n_x));
    TRY_OK(cuda_to_fp32(ops, p, (float *)dyf, *dy, n_y));
    *x = xf;
    *dy = dyf;
    return DDP_OK;
}

/* cuDNN adds into dw with beta = 1 (the layer contract accumulates); beta = 0 overwrites, and then
 * cuDNN does not read dw (its documentation). */
static ddp_status cudnn_conv_bwd_params(const ops_handle *ops, ddp_dtype p,
                                        const ops_conv_shape *s, int batch, const void *x,
                                        const void *dy, float *dw, float *db, bool accumulate)
{
    conv_plan *pl;
    void *ws;
    const void *xf = x, *dyf = dy;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    TRY_OK(conv_plan_get(ops, CONV_BWD_FILTER, p, s, batch, &pl));
    TRY_OK(conv_fp32_inputs(ops, p, s, batch, &xf, &dyf));
    TRY_OK(conv_workspace(ops, pl, &ws));
    TRY_CUDNN(cudnnConvolutionBackwardFilter(cudnn_of(ops)->handle, &one, pl->x, xf, pl->y, dyf, pl->conv,
                                             (cudnnConvolutionBwdFilterAlgo_t)pl->algo, ws,
                                             pl->ws_bytes, &beta, pl->w, dw));
    return cuda_channel_sums(ops, p, dy, batch, s->c_out, s->h_out * s->w_out, db, accumulate);
}

size_t cudnn_version(void) { return cudnnGetVersion(); }

bool cudnn_attention_usable(void)
{
    char why[256];
    if (sdpa_version_ok(cudnnGetVersion(), CUDNN_VERSION, why, sizeof why))
        return true;
    DDP_WARN("DDP_CUDA_ATTENTION=cudnn: %s; the project's fused kernel runs instead", why);
    return false;
}

extern "C" const char *ops_cudnn_describe(const ops_handle *ops, ddp_dtype p)
{
    static const char *const maths[] = {"default", "tensor-op", "tensor-op with conversion", "fma"};
    if (!ops || !ops->name || strncmp(ops->name, "cuda", 4) != 0 || !cudnn_of(ops))
        return "";
    char *text = cudnn_of(ops)->text;
    const size_t text_size = sizeof cudnn_of(ops)->text;
    size_t len = 0;
    int n = cudnn_of(ops)->n_made < CONV_PLANS ? cudnn_of(ops)->n_made : CONV_PLANS;
    text[0] = '\0';
    for (int kind = CONV_FWD; kind <= CONV_BWD_FILTER; kind++) {
        for (int i = 0; i < n && len < text_size; i++) {
            const conv_plan *pl = &cudnn_of(ops)->plans[i];
            if (pl->key[0] != kind || pl->key[1] != p)
                continue;
            len += (size_t)snprintf(text + len, text_size - len, "%s%s algo %d (%s math)",
                                    len ? ", " : "", conv_kind_names[kind], pl->algo,
                                    (int)pl->math >= 0 && (int)pl->math < 4 ? maths[pl->math] : "?");
            break;
        }
    }
    return text;
}

void cudnn_conv_ops(ops_handle *ops)
{
    ops->conv_fwd = cudnn_conv_fwd;
    ops->conv_bwd_params = cudnn_conv_bwd_params;
    ops->conv_bwd_input = cudnn_conv_bwd_input;
}

/* ---- fused attention (cuda_sdpa.h) ------------------------------------------------------- */

/* The plan of direction bwd for (B, T, NH, hs) in the model's layout (qkv rows of 3C, o and
 * dout rows of C), made on first use into the next of SDPA_PLANS slots in turn; a plan evicted
 * from its slot is freed only after libddp's stream drained (ddp_synchronize, under
 * DDP_TIMEOUT), since queued work may still run it. Sampling pads its passes to one shape
 * (gpt2_sample_opts.pad), so training, validation and sampling take three plans. */
static ddp_status sdpa_plan_for(const ops_handle *ops, bool bwd, int B, int T, int NH, int hs,
                                const sdpa_plan **out)
{
    cudnn_state *cs = cudnn_of(ops);
    bool acc = bwd && !cuda_of(ops)->cudnn_det; /* DDP_CUDNN_DETERMINISTIC=0: the other form */
    int key[6] = {bwd, B, T, NH, hs, acc};
    for (int i = 0; i < SDPA_PLANS; i++)
        if (cs->sdpa[i].plan && !memcmp(cs->sdpa[i].key, key, sizeof key)) {
            *out = cs->sdpa[i].plan;
            return DDP_OK;
        }
    long long C = (long long)NH * hs;
    sdpa_dims d = {B, NH, T, hs, 3 * C, C, acc};
    sdpa_slot *slot = &cs->sdpa[cs->n_sdpa % SDPA_PLANS];
    if (slot->plan) { /* queued work may still run its kernels: the stream drains first */
        ddp_status st = ddp_synchronize(ops->ctx);
        if (st != DDP_OK) {
            DDP_ERROR("cuDNN attention: the stream did not drain (%s): the plan it may still run "
                      "is kept and no plan made for B %d T %d", ddp_strerror(st), B, T);
            return st;
        }
        sdpa_free(slot->plan);
        slot->plan = NULL;
    }
    sdpa_plan *p = NULL;
    TRY_OK(sdpa_build(cs->handle, &d, bwd, &p, NULL));
    cs->n_sdpa++;
    memcpy(slot->key, key, sizeof key);
    slot->plan = p;
    DDP_DEBUG("cuDNN attention %s B %d T %d NH %d hs %d: workspace %zu bytes",
              bwd ? "backward" : "forward", B, T, NH, hs, sdpa_workspace(p));
    *out = p;
    return DDP_OK;
}

static ddp_status sdpa_ws(const ops_handle *ops, const sdpa_plan *p, void **ws)
{
    size_t bytes = sdpa_workspace(p);
    *ws = NULL;
    return bytes ? cuda_scratch(ops, CUDA_SCRATCH_CUDNN_WS, bytes, ws) : DDP_OK;
}

ddp_status cudnn_attention_fwd(const ops_handle *ops, int B, int T, int NH, int hs,
                               const uint16_t *qkv, uint16_t *out, float *stats, float scale)
{
    const sdpa_plan *p = NULL;
    void *ws = NULL;
    TRY_OK(sdpa_plan_for(ops, false, B, T, NH, hs, &p));
    TRY_OK(sdpa_ws(ops, p, &ws));
    return sdpa_run_fwd(cudnn_of(ops)->handle, p, qkv, out, stats, scale, ws);
}

ddp_status cudnn_attention_bwd(const ops_handle *ops, int B, int T, int NH, int hs,
                               const uint16_t *qkv, const uint16_t *o, const uint16_t *dout,
                               const float *stats, uint16_t *dqkv, float *sum, float *dq_acc,
                               float scale)
{
    const sdpa_plan *p = NULL;
    void *ws = NULL;
    TRY_OK(sdpa_plan_for(ops, true, B, T, NH, hs, &p));
    TRY_OK(sdpa_ws(ops, p, &ws));
    return sdpa_run_bwd(cudnn_of(ops)->handle, p, qkv, o, dout, stats, dqkv, sum, dq_acc, scale,
                        ws);
}
