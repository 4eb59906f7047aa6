/* cuda_sdpa.cu - cuda_sdpa.h's graphs: causal flash attention on cuDNN's runtime fusion engines,
 * built through the backend API as cudnn-frontend 1.x expands its SDPA nodes for cuDNN 9 (see the
 * header). Host code only.
 *
 * Every virtual tensor has the data type, dimensions and strides the frontend gives it: fp32
 * (its "intermediate" type) unless noted, the row and column indices int32, the mask boolean,
 * the probabilities and the transposed score gradients bf16 before the matmuls that read them.
 * Scalars (the scale, -inf, 1) are by-value fp32 tensors of shape (1, 1, 1, 1), passed in the
 * variant pack by host pointer as the frontend passes them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sdpa.h"

typedef cudnnBackendDescriptor_t bdesc;

/* Unique ids of the tensors the variant pack binds; virtual ones count up from UID_VIRTUAL. */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_ONE, UID_DO, UID_DQ,
    UID_DK, UID_DV, UID_SUM, UID_DQ_ACC, UID_VIRTUAL = 100
};

enum { MAX_DESCS = 192, MAX_OPS = 32, MAX_ENGINE_CFGS = 16 };

/* The descriptors one build makes, and its first failure. */
typedef struct builder {
    bdesc all[MAX_DESCS];
    int64_t dims[MAX_DESCS][4]; /* a tensor's dimensions (cuDNN checks them only in the graph) */
    int n_all;
    bdesc ops[MAX_OPS];
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t st;
    char what[160]; /* the call that failed */
} builder;

/* An execution plan and every descriptor it was made from (kept alive with it, as
 * cudnn-frontend keeps its graph's). */
struct sdpa_plan {
    bool bwd;
    sdpa_dims d;
    bdesc plan;
    int64_t ws_bytes;
    builder *b;
};

static void builder_free(builder *b)
{
    if (!b)
        return;
    for (int i = b->n_all - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(b->all[i]);
    free(b);
}

static bdesc make(builder *b, cudnnBackendDescriptorType_t type, const char *what)
{
    bdesc d = NULL;
    if (b->st != CUDNN_STATUS_SUCCESS)
        return NULL;
    if (b->n_all == MAX_DESCS) {
        b->st = CUDNN_STATUS_INTERNAL_ERROR;
        snprintf(b->what, sizeof b->what, "%s: more than %d descriptors", what, MAX_DESCS);
        return NULL;
    }
    b->st = cudnnBackendCreateDescriptor(type, &d);
    if (b->st != CUDNN_STATUS_SUCCESS) {
        snprintf(b->what, sizeof b->what, "creating the descriptor of %s", what);
        return NULL;
    }
    b->all[b->n_all++] = d;
    return d;
}

static void set(builder *b, bdesc d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value,
                const char *what)
{
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    b->st = cudnnBackendSetAttribute(d, name, type, count, value);
    if (b->st != CUDNN_STATUS_SUCCESS)
        snprintf(b->what, sizeof b->what, "%s: attribute %d", what, (int)name);
}

static void finalize(builder *b, bdesc d, const char *what)
{
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    b->st = cudnnBackendFinalize(d);
    if (b->st != CUDNN_STATUS_SUCCESS)
        snprintf(b->what, sizeof b->what, "finalizing %s", what);
}

/* A tensor of 4 dimensions; uid 0 takes the next virtual id. */
static bdesc tensor(builder *b, const char *name, int64_t uid, cudnnDataType_t type,
                    const int64_t dims[4], const int64_t strides[4], bool is_virtual, bool by_value)
{
    bdesc t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    if (t)
        memcpy(b->dims[b->n_all - 1], dims, sizeof b->dims[0]);
    int64_t id = uid ? uid : b->next_uid++, align = 16;
    bool virt = is_virtual, val = by_value;
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, name);
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, name);
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, name);
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, name);
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, name);
    if (virt)
        set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, name);
    if (val)
        set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &val, name);
    finalize(b, t, name);
    return t;
}

/* A by-value fp32 constant (the frontend's Tensor_attributes(float)), of shape (1, 1, 1, 1):
 * cuDNN refuses a pointwise operand of another rank than x's ("xDesc.getNbDims() !=
 * bDesc.getNbDims()", seen when these were 1-D). */
static bdesc constant(builder *b, const char *name, int64_t uid)
{
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(b, name, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

/* Tensor t's dimensions as made (NULL for another descriptor). */
static const int64_t *dims_of(const builder *b, bdesc t)
{
    for (int i = 0; t && i < b->n_all; i++)
        if (b->all[i] == t)
            return b->dims[i];
    return NULL;
}

/* Fails the build (what: the operation) when ok is false: the shape checks cuDNN leaves to the
 * operation graph, which needs a GPU, made here so that a graph wrong in shape fails anywhere. */
static void shape_check(builder *b, bool ok, const char *what, const char *rule)
{
    if (b->st != CUDNN_STATUS_SUCCESS || ok)
        return;
    b->st = CUDNN_STATUS_BAD_PARAM;
    snprintf(b->what, sizeof b->what, "%s: shapes: %s", what, rule);
}

/* Whether x broadcasts to y: each dimension equal or 1. */
static bool broadcasts(const int64_t *x, const int64_t *y)
{
    for (int i = 0; i < 4; i++)
        if (x[i] != y[i] && x[i] != 1)
            return false;
    return true;
}

static void add_op(builder *b, bdesc op, const char *what)
{
    finalize(b, op, what);
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    if (b->n_ops == MAX_OPS) {
        b->st = CUDNN_STATUS_INTERNAL_ERROR;
        snprintf(b->what, sizeof b->what, "%s: more than %d operations", what, MAX_OPS);
        return;
    }
    b->ops[b->n_ops++] = op;
}

/* y = op(x[, b2[, t]]): a pointwise operation of mode m computed in type math (axis for
 * GEN_INDEX, else unused); alpha1 = alpha2 = 1 as the frontend sets them. */
static void pointwise(builder *b, const char *what, cudnnPointwiseMode_t m, cudnnDataType_t math,
                      bdesc x, bdesc b2, bdesc t, bdesc y, int64_t axis)
{
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    const int64_t *dx = dims_of(b, x), *dy = dims_of(b, y);
    const int64_t *db = dims_of(b, b2), *dt = dims_of(b, t);
    shape_check(b, dx && dy && !memcmp(dx, dy, sizeof b->dims[0]), what, "y's shape is not x's");
    shape_check(b, !b2 || (db && broadcasts(db, dy)), what, "b does not broadcast to y");
    shape_check(b, !t || (dt && broadcasts(dt, dy)), what, "t does not broadcast to y");
    bdesc pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m, what);
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, what);
    if (m == CUDNN_POINTWISE_GEN_INDEX)
        set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    finalize(b, pw, what);
    bdesc op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    float one = 1.0f;
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw,
        what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what);
    if (b2)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b2,
            what);
    if (t)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t,
            what);
    add_op(b, op, what);
}

/* y = the reduction (mode m, fp32) of x over the dimensions where y has extent 1. */
static void reduction(builder *b, const char *what, cudnnReduceTensorOp_t m, bdesc x, bdesc y)
{
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    const int64_t *dx = dims_of(b, x), *dy = dims_of(b, y);
    shape_check(b, dx && dy && broadcasts(dy, dx), what,
                "y is not x with some dimensions reduced to 1");
    bdesc rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &m, what);
    set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, what);
    finalize(b, rd, what);
    bdesc op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    add_op(b, op, what);
}

/* c = a b over the last two dimensions, batched over the first two, computed in fp32. */
static void matmul(builder *b, const char *what, bdesc a, bdesc bm, bdesc c)
{
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    const int64_t *da = dims_of(b, a), *db = dims_of(b, bm), *dc = dims_of(b, c);
    shape_check(b, da && db && dc && da[0] == dc[0] && da[1] == dc[1] && db[0] == dc[0] &&
                       db[1] == dc[1] && da[2] == dc[2] && db[3] == dc[3] && da[3] == db[2],
                what, "not (M x K) (K x N) = (M x N) over the same batch");
    bdesc mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, what);
    finalize(b, mm, what);
    bdesc op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what);
    add_op(b, op, what);
}

/* y = x seen with y's dimensions and strides (a transpose). */
static void reshape(builder *b, const char *what, bdesc x, bdesc y)
{
    if (b->st != CUDNN_STATUS_SUCCESS)
        return;
    const int64_t *dx = dims_of(b, x), *dy = dims_of(b, y);
    shape_check(b, dx && dy && dx[0] * dx[1] * dx[2] * dx[3] == dy[0] * dy[1] * dy[2] * dy[3], what,
                "x and y hold different numbers of elements");
    bdesc op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    add_op(b, op, what);
}

/* The shapes both graphs use. */
typedef struct shapes {
    int64_t bhtd[4], bhdt[4], bhtt[4], bht1[4], one[4];
    int64_t s_qkv[4], s_qkv_t[4]; /* q, k, v rows; k and v as (B, NH, hs, T) */
    int64_t s_o[4];               /* o and dout rows */
    int64_t s_tt[4], s_tt_t[4];   /* (B, NH, T, T) row-major, and its transpose's view */
    int64_t s_t1[4];              /* (B, NH, T, 1) */
} shapes;

static shapes shapes_of(const sdpa_dims *d)
{
    int64_t B = d->B, H = d->NH, T = d->T, D = d->hs, L = d->ld_qkv, LO = d->ld_o;
    shapes s = {
        {B, H, T, D}, {B, H, D, T}, {B, H, T, T}, {B, H, T, 1}, {1, 1, 1, 1},
        {T * L, D, L, 1}, {T * L, D, 1, L}, {T * LO, D, LO, 1},
        {H * T * T, T * T, T, 1}, {H * T * T, T * T, 1, T}, {H * T, T, 1, 1},
    };
    return s;
}

/* The causal mask of scores x (fp32, (B, NH, T, T)) into y: the frontend's diagonal band mask
 * with right bound 0, top-left aligned: row and column indices (int32), row >= column (boolean),
 * x where true, else -inf. */
static void causal_mask(builder *b, const shapes *s, bdesc x, bdesc neg_inf, bdesc y)
{
    bdesc row = tensor(b, "row index", 0, CUDNN_DATA_INT32, s->bhtt, s->s_tt, true, false);
    bdesc col = tensor(b, "column index", 0, CUDNN_DATA_INT32, s->bhtt, s->s_tt, true, false);
    bdesc keep = tensor(b, "row >= column", 0, CUDNN_DATA_BOOLEAN, s->bhtt, s->s_tt, true, false);
    cudnnPointwiseMode_t index = CUDNN_POINTWISE_GEN_INDEX;
    pointwise(b, "gen_row_index", index, CUDNN_DATA_FLOAT, x, NULL, NULL, row, 2);
    pointwise(b, "gen_col_index", index, CUDNN_DATA_FLOAT, x, NULL, NULL, col, 3);
    pointwise(b, "row>=col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, 0);
    pointwise(b, "binary_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep,
              y, 0);
}

/* An fp32 virtual tensor of shape dims, strides st. */
static bdesc vf32(builder *b, const char *name, const int64_t *dims, const int64_t *st)
{
    return tensor(b, name, 0, CUDNN_DATA_FLOAT, dims, st, true, false);
}

/* op(x[, b2]) in fp32 into a new fp32 virtual tensor of x's shape (dims, st), returned. */
static bdesc pw_new(builder *b, const char *what, cudnnPointwiseMode_t m, bdesc x, bdesc b2,
                    const int64_t *dims, const int64_t *st)
{
    bdesc y = vf32(b, what, dims, st);
    pointwise(b, what, m, CUDNN_DATA_FLOAT, x, b2, NULL, y, 0);
    return y;
}

static void build_fwd(builder *b, const shapes *s)
{
    cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
    bdesc q = tensor(b, "Q", UID_Q, bf, s->bhtd, s->s_qkv, false, false);
    bdesc kt = tensor(b, "K^T", UID_K, bf, s->bhdt, s->s_qkv_t, false, false);
    bdesc v = tensor(b, "V", UID_V, bf, s->bhtd, s->s_qkv, false, false);
    bdesc scale = tensor(b, "attn_scale", UID_SCALE, f, s->one, s->one, false, true);
    bdesc neg_inf = constant(b, "-inf", UID_NEG_INF);
    bdesc o = tensor(b, "O", UID_O, bf, s->bhtd, s->s_o, false, false);
    bdesc stats = tensor(b, "Stats", UID_STATS, f, s->bht1, s->s_t1, false, false);

    bdesc sc = vf32(b, "S", s->bhtt, s->s_tt);
    matmul(b, "bmm1 (Q K^T)", q, kt, sc);
    bdesc scaled = pw_new(b, "attn_scale", CUDNN_POINTWISE_MUL, sc, scale, s->bhtt, s->s_tt);
    bdesc masked = vf32(b, "masked S", s->bhtt, s->s_tt);
    causal_mask(b, s, scaled, neg_inf, masked);
    /* the softmax with its statistics: max, exp(x - max), sum, log-sum-exp, division */
    bdesc mx = vf32(b, "max", s->bht1, s->s_t1);
    reduction(b, "Max", CUDNN_REDUCE_TENSOR_MAX, masked, mx);
    bdesc sub = pw_new(b, "sub", CUDNN_POINTWISE_SUB, masked, mx, s->bhtt, s->s_tt);
    bdesc ex = pw_new(b, "exp", CUDNN_POINTWISE_EXP, sub, NULL, s->bhtt, s->s_tt);
    bdesc sum = vf32(b, "SumExp", s->bht1, s->s_t1);
    reduction(b, "sum", CUDNN_REDUCE_TENSOR_ADD, ex, sum);
    bdesc lg = pw_new(b, "log", CUDNN_POINTWISE_LOG, sum, NULL, s->bht1, s->s_t1);
    pointwise(b, "add", CUDNN_POINTWISE_ADD, f, mx, lg, NULL, stats, 0);
    bdesc p = tensor(b, "P", 0, bf, s->bhtt, s->s_tt, true, false);
    pointwise(b, "div", CUDNN_POINTWISE_DIV, f, ex, sum, NULL, p, 0);
    matmul(b, "bmm2 (P V)", p, v, o);
}

static void build_bwd(builder *b, const shapes *s, const sdpa_dims *d)
{
    cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
    int64_t H = d->NH, T = d->T, D = d->hs;
    int64_t s_dot[4] = {H * T * D, T * D, H * D, 1}, s_acc[4] = {H * T * D, T * D, D, 1};
    bdesc q = tensor(b, "Q", UID_Q, bf, s->bhtd, s->s_qkv, false, false);
    bdesc kt = tensor(b, "K^T", UID_K, bf, s->bhdt, s->s_qkv_t, false, false);
    bdesc vt = tensor(b, "V^T", UID_V, bf, s->bhdt, s->s_qkv_t, false, false);
    bdesc o = tensor(b, "O", UID_O, bf, s->bhtd, s->s_o, false, false);
    bdesc dout = tensor(b, "dO", UID_DO, bf, s->bhtd, s->s_o, false, false);
    bdesc stats = tensor(b, "Stats", UID_STATS, f, s->bht1, s->s_t1, false, false);
    bdesc scale = tensor(b, "attn_scale", UID_SCALE, f, s->one, s->one, false, true);
    bdesc neg_inf = constant(b, "-inf", UID_NEG_INF);
    bdesc one = constant(b, "1", UID_ONE);
    bdesc dq = tensor(b, "dQ", UID_DQ, bf, s->bhtd, s->s_qkv, false, false);
    bdesc dk = tensor(b, "dK", UID_DK, bf, s->bhtd, s->s_qkv, false, false);
    bdesc dv = tensor(b, "dV", UID_DV, bf, s->bhtd, s->s_qkv, false, false);
    bdesc ssum = tensor(b, "softmax_sum", UID_SUM, f, s->bht1, s->s_t1, false, false);

    /* softmax_sum = rowsum(dO o) x 1 */
    bdesc prod = pw_new(b, "mul_dO_O", CUDNN_POINTWISE_MUL, dout, o, s->bhtd, s_dot);
    bdesc rsum = vf32(b, "rowsum", s->bht1, s->s_t1);
    reduction(b, "reduce_dO_o", CUDNN_REDUCE_TENSOR_ADD, prod, rsum);
    pointwise(b, "scale_dropout_inv", CUDNN_POINTWISE_MUL, f, rsum, one, NULL, ssum, 0);
    /* the probabilities again: exp(mask(S scale - stats)) */
    bdesc sc = vf32(b, "S", s->bhtt, s->s_tt);
    matmul(b, "matmul_Q_KT", q, kt, sc);
    bdesc scaled = pw_new(b, "mul_s_attn_scale", CUDNN_POINTWISE_MUL, sc, scale, s->bhtt, s->s_tt);
    bdesc shifted = pw_new(b, "sub_s_m", CUDNN_POINTWISE_SUB, scaled, stats, s->bhtt, s->s_tt);
    bdesc masked = vf32(b, "masked", s->bhtt, s->s_tt);
    causal_mask(b, s, shifted, neg_inf, masked);
    bdesc p = pw_new(b, "exp_s", CUDNN_POINTWISE_EXP, masked, NULL, s->bhtt, s->s_tt);
    /* dV = P^T dO */
    bdesc pt = tensor(b, "P^T", 0, bf, s->bhtt, s->s_tt_t, true, false);
    reshape(b, "reshape_p", p, pt);
    matmul(b, "matmul_pT_dO", pt, dout, dv);
    /* dS = P (dO V^T - softmax_sum) scale */
    bdesc dp = vf32(b, "dP", s->bhtt, s->s_tt);
    matmul(b, "matmul_dO_VT", dout, vt, dp);
    bdesc dp_sub = pw_new(b, "sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, dp, ssum, s->bhtt, s->s_tt);
    bdesc ds = pw_new(b, "mul_dP_exp_s", CUDNN_POINTWISE_MUL, dp_sub, p, s->bhtt, s->s_tt);
    bdesc ds_scaled = pw_new(b, "mul_dS_attn_scale", CUDNN_POINTWISE_MUL, ds, scale, s->bhtt,
                             s->s_tt);
    /* dK = dS^T Q */
    bdesc dst = tensor(b, "dS^T", 0, bf, s->bhtt, s->s_tt_t, true, false);
    reshape(b, "reshape_dS", ds_scaled, dst);
    matmul(b, "matmul_dST_Q", dst, q, dk);
    /* dQ = dS K: written by the matmul (deterministic), or accumulated in fp32 with atomics
     * and then rounded (dq_accum) */
    bdesc k = vf32(b, "K", s->bhtd, s->s_qkv);
    reshape(b, "reshape_k", kt, k);
    if (!d->dq_accum) {
        matmul(b, "matmul_dS_K", ds_scaled, k, dq);
        return;
    }
    bdesc dq_acc = tensor(b, "dQ_accum", UID_DQ_ACC, f, s->bhtd, s_acc, false, false);
    matmul(b, "matmul_dS_K", ds_scaled, k, dq_acc);
    pointwise(b, "identity_dQ", CUDNN_POINTWISE_IDENTITY, f, dq_acc, NULL, NULL, dq, 0);
}

/* The operation graph, cuDNN's heuristics (mode A) and the first engine configuration whose
 * execution plan finalizes; the plan kept in *plan (not in b's list). */
static void build_plan(builder *b, cudnnHandle_t handle, bdesc *plan, int64_t *ws_bytes)
{
    bdesc graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->n_ops, b->ops,
        "the operation graph");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
        "the operation graph");
    finalize(b, graph, "the operation graph");
    bdesc heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
        "the heuristics");
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "the heuristics");
    finalize(b, heur, "the heuristics (no engine for this graph?)");
    bdesc cfgs[MAX_ENGINE_CFGS];
    int n_cfg = 0;
    for (; n_cfg < MAX_ENGINE_CFGS && b->st == CUDNN_STATUS_SUCCESS; n_cfg++)
        cfgs[n_cfg] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine configuration");
    int64_t got = 0;
    if (b->st == CUDNN_STATUS_SUCCESS) {
        b->st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, n_cfg, &got, cfgs);
        if (b->st != CUDNN_STATUS_SUCCESS)
            snprintf(b->what, sizeof b->what, "reading the heuristics' engine configurations");
    }
    if (b->st == CUDNN_STATUS_SUCCESS && got == 0) {
        b->st = CUDNN_STATUS_NOT_SUPPORTED;
        snprintf(b->what, sizeof b->what, "the heuristics: no engine configuration for this graph");
    }
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; b->st == CUDNN_STATUS_SUCCESS && i < got && !*plan; i++) {
        bdesc p = NULL;
        last = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
        if (last != CUDNN_STATUS_SUCCESS)
            break;
        last = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                        &handle);
        if (last == CUDNN_STATUS_SUCCESS)
            last = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (last == CUDNN_STATUS_SUCCESS)
            last = cudnnBackendFinalize(p);
        int64_t one = 0;
        if (last == CUDNN_STATUS_SUCCESS)
            last = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                            CUDNN_TYPE_INT64, 1, &one, ws_bytes);
        if (last == CUDNN_STATUS_SUCCESS)
            *plan = p;
        else
            cudnnBackendDestroyDescriptor(p);
    }
    if (b->st == CUDNN_STATUS_SUCCESS && !*plan) {
        b->st = last;
        snprintf(b->what, sizeof b->what,
                 "finalizing an execution plan (%lld configurations tried)", (long long)got);
    }
}

ddp_status sdpa_build(cudnnHandle_t handle, const sdpa_dims *d, bool bwd, sdpa_plan **out,
                      int *n_ops)
{
    if (out)
        *out = NULL;
    if (n_ops)
        *n_ops = 0;
    if (!d) {
        DDP_ERROR("cuDNN attention: no dims");
        return DDP_ERR_INVALID_ARG;
    }
    if (d->B < 1 || d->NH < 1 || d->T < 1 || d->hs < 1 || d->ld_qkv < 3LL * d->NH * d->hs ||
        d->ld_o < (long long)d->NH * d->hs) {
        DDP_ERROR("cuDNN attention: B %d, NH %d, T %d, hs %d, ld_qkv %lld, ld_o %lld: want each "
                  "at least 1, ld_qkv >= 3 NH hs and ld_o >= NH hs", d->B, d->NH, d->T, d->hs,
                  d->ld_qkv, d->ld_o);
        return DDP_ERR_INVALID_ARG;
    }
    builder *b = (builder *)calloc(1, sizeof *b);
    if (!b)
        return DDP_ERR_NOMEM;
    b->next_uid = UID_VIRTUAL;
    shapes s = shapes_of(d);
    if (bwd)
        build_bwd(b, &s, d);
    else
        build_fwd(b, &s);
    bdesc plan = NULL;
    int64_t ws = 0;
    if (handle && b->st == CUDNN_STATUS_SUCCESS)
        build_plan(b, handle, &plan, &ws);
    ddp_status st = DDP_OK;
    if (b->st != CUDNN_STATUS_SUCCESS) {
        char msg[512] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        DDP_ERROR("cuDNN attention (%s, B %d NH %d T %d hs %d): %s: %s%s%s",
                  bwd ? "backward" : "forward", d->B, d->NH, d->T, d->hs, b->what,
                  cudnnGetErrorString(b->st), *msg ? ": " : "", msg);
        st = DDP_ERR_UNSUPPORTED;
    }
    if (n_ops)
        *n_ops = b->n_ops;
    sdpa_plan *p = st == DDP_OK && plan && out ? (sdpa_plan *)calloc(1, sizeof *p) : NULL;
    if (!p) {
        if (plan)
            cudnnBackendDestroyDescriptor(plan);
        builder_free(b);
        return st == DDP_OK && plan && out ? DDP_ERR_NOMEM : st;
    }
    *p = sdpa_plan{bwd, *d, plan, ws, b};
    *out = p;
    return DDP_OK;
}

size_t sdpa_workspace(const sdpa_plan *p) { return p ? (size_t)p->ws_bytes : 0; }

/* "9.10.2" for cuDNN's version number v (9.x: major 10000 minor 100; 8.x: 1000 and 100). */
static void version_text(size_t v, char *out, size_t n)
{
    size_t major = v >= 90000 ? v / 10000 : v / 1000, rest = v >= 90000 ? v % 10000 : v % 1000;
    snprintf(out, n, "%zu.%zu.%zu", major, rest / 100, rest % 100);
}

static size_t version_major(size_t v) { return v >= 90000 ? v / 10000 : v / 1000; }

bool sdpa_version_ok(size_t version, size_t compiled, char *why, size_t n)
{
    char found[32], need[32], built[32];
    version_text(version, found, sizeof found);
    version_text(SDPA_MIN_CUDNN, need, sizeof need);
    version_text(compiled, built, sizeof built);
    bool old = version < SDPA_MIN_CUDNN, other = version_major(version) != version_major(compiled);
    if (why && n && old)
        snprintf(why, n, "cuDNN %s found, the attention graphs need %s or newer (-inf in the "
                 "causal mask, fixes of 9.10.0/9.10.1)", found, need);
    else if (why && n && other)
        snprintf(why, n, "cuDNN %s found, built against %s: another major version", found, built);
    else if (why && n)
        why[0] = '\0';
    return !old && !other;
}

void sdpa_free(sdpa_plan *p)
{
    if (!p)
        return;
    cudnnBackendDestroyDescriptor(p->plan);
    builder_free(p->b);
    free(p);
}

/* Executes p with n bindings (uids[i] -> ptrs[i]). */
static ddp_status run(cudnnHandle_t handle, const sdpa_plan *p, int n, const int64_t *uids,
                      void *const *ptrs, void *ws)
{
    bdesc pack = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                      uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendExecute(handle, p->plan, pack);
    if (pack)
        cudnnBackendDestroyDescriptor(pack);
    if (st == CUDNN_STATUS_SUCCESS)
        return DDP_OK;
    char msg[512] = "";
    cudnnGetLastErrorString(msg, sizeof msg);
    DDP_ERROR("cuDNN attention %s: executing the plan: %s%s%s", p->bwd ? "backward" : "forward",
              cudnnGetErrorString(st), *msg ? ": " : "", msg);
    return DDP_ERR_UNSUPPORTED;
}

ddp_status sdpa_run_fwd(cudnnHandle_t handle, const sdpa_plan *p, const void *qkv, void *o,
                        float *stats, float scale, void *ws)
{
    if (!p || p->bwd)
        return DDP_ERR_INVALID_ARG;
    size_t C = (size_t)p->d.NH * p->d.hs;
    const uint16_t *x = (const uint16_t *)qkv;
    float neg_inf = -INFINITY, sc = scale;
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[] = {(void *)x, (void *)(x + C), (void *)(x + 2 * C), o, stats, &sc, &neg_inf};
    return run(handle, p, 7, uids, ptrs, ws);
}

ddp_status sdpa_run_bwd(cudnnHandle_t handle, const sdpa_plan *p, const void *qkv, const void *o,
                        const void *dout, const float *stats, void *dqkv, float *sum,
                        float *dq_acc, float scale, void *ws)
{
    if (!p || !p->bwd)
        return DDP_ERR_INVALID_ARG;
    size_t C = (size_t)p->d.NH * p->d.hs;
    const uint16_t *x = (const uint16_t *)qkv;
    uint16_t *dx = (uint16_t *)dqkv;
    float neg_inf = -INFINITY, sc = scale, one = 1.0f;
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_SCALE, UID_NEG_INF,
                      UID_ONE, UID_DQ, UID_DK, UID_DV, UID_SUM, UID_DQ_ACC};
    void *ptrs[] = {(void *)x, (void *)(x + C), (void *)(x + 2 * C), (void *)o, (void *)dout,
                    (void *)stats, &sc, &neg_inf, &one, dx, dx + C, dx + 2 * C, sum, dq_acc};
    if (p->d.dq_accum && !dq_acc)
        return DDP_ERR_INVALID_ARG;
    return run(handle, p, p->d.dq_accum ? 14 : 13, uids, ptrs, ws); /* dq_acc last */
}
