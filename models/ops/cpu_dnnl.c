/* cpu_dnnl.c - oneDNN primitives for the CPU ops table: convolution (forward, backward data,
 * backward weights), 2x2 max-pooling and matmul, created once per shape and precision and kept in
 * a small cache (the CPU's cudnn.benchmark: oneDNN picks the implementation when the primitive is
 * created, and ops_dnnl_describe() names it).
 */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dnnl.h"
#include "cpu_isa.h"
#include "try.h"

#define DNNL_CACHE_SIZE 64
#define DNNL_MAX_ARGS 6
#define DNNL_KEY_LEN 10

/* One argument of a primitive. Convolutions choose their own (blocked) layouts: then the caller's
 * plain tensor is reordered into `prim` before (inputs) or out of it after (outputs) each run. */
typedef struct dnnl_arg {
    int id;                   /* DNNL_ARG_* */
    dnnl_memory_t user;       /* the caller's buffer (handle set per call), plain layout */
    dnnl_memory_t prim;       /* the primitive's layout, own buffer; NULL when it is plain */
    dnnl_primitive_t reorder; /* user -> prim for an input, prim -> user for an output */
} dnnl_arg;

typedef struct dnnl_entry {
    long key[DNNL_KEY_LEN]; /* kind, precision, shape: what the primitive was made for */
    dnnl_primitive_t prim;
    int n_args;
    dnnl_arg arg[DNNL_MAX_ARGS];
    char impl[64];          /* oneDNN's implementation name */
} dnnl_entry;

enum { K_CONV_FWD = 1, K_CONV_BWD_DATA, K_CONV_BWD_WEIGHTS, K_POOL_FWD, K_POOL_BWD, K_MATMUL,
       K_REORDER };
static const char *const dnnl_kind_names[] = {"", "conv_fwd", "conv_bwd_data", "conv_bwd_weights",
                                              "pool_fwd", "pool_bwd", "matmul", "reorder"};

/* The state of one ops handle: the engine, the stream and the cache of primitives. */
struct dnnl_state {
    dnnl_entry cache[DNNL_CACHE_SIZE];
    int n_made; /* primitives ever made; entry i % DNNL_CACHE_SIZE is reused */
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    char text[512]; /* what ops_dnnl_impls returns */
};

/* Logs a failed oneDNN call (try.h's wording) and returns `st`, the status its caller gives it. */
static ddp_status dnnl_fail(dnnl_status_t err, const char *what, ddp_status st)
{
    (void)check_dnnl_fail(err, what, __FILE__, __LINE__);
    return st;
}

static ddp_status dnnl_open(dnnl_state *d)
{
    if (d->strm)
        return DDP_OK;
    cpu_isa_export(); /* DDP_CPU_ISA's cap, before oneDNN first looks at the CPU */
    TRY_DNNL(dnnl_engine_create(&d->eng, dnnl_cpu, 0));
    TRY_DNNL(dnnl_stream_create(&d->strm, d->eng, dnnl_stream_default_flags));
    return DDP_OK;
}

static dnnl_data_type_t dnnl_dt(ddp_dtype p) { return p == DDP_BF16 ? dnnl_bf16 : dnnl_f32; }

/* ---- the cache -------------------------------------------------------------------------------- */

static dnnl_entry *dnnl_find(dnnl_state *d, const long *key)
{
    int n = d->n_made < DNNL_CACHE_SIZE ? d->n_made : DNNL_CACHE_SIZE;
    for (int i = 0; i < n; i++) {
        if (memcmp(d->cache[i].key, key, sizeof d->cache[i].key) == 0)
            return &d->cache[i];
    }
    return NULL;
}

static void dnnl_entry_release(dnnl_entry *e)
{
    for (int i = 0; i < e->n_args; i++) {
        dnnl_memory_destroy(e->arg[i].user);
        dnnl_memory_destroy(e->arg[i].prim);
        dnnl_primitive_destroy(e->arg[i].reorder);
    }
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    memset(e, 0, sizeof *e);
}

static bool dnnl_is_output(int id)
{
    return id == DNNL_ARG_DST || id == DNNL_ARG_DIFF_SRC || id == DNNL_ARG_DIFF_WEIGHTS ||
           id == DNNL_ARG_DIFF_BIAS;
}

/* Memory objects of one argument: the caller's plain layout `user` (NULL: the primitive's own,
 * as for workspaces) and, when the primitive chose another layout, its buffer and the reorder. */
static dnnl_status_t dnnl_arg_make(dnnl_state *d, dnnl_arg *a, int id,
                                   const dnnl_memory_desc_t *prim_md,
                                   const dnnl_memory_desc_t *user)
{
    a->id = id;
    dnnl_status_t err = dnnl_memory_create(&a->user, user ? user : prim_md, d->eng, DNNL_MEMORY_NONE);
    if (err != dnnl_success || !user || dnnl_memory_desc_equal(user, prim_md))
        return err;
    dnnl_primitive_desc_t rpd;
    err = dnnl_memory_create(&a->prim, prim_md, d->eng, DNNL_MEMORY_ALLOCATE);
    if (err == dnnl_success)
        err = dnnl_is_output(id) ? dnnl_reorder_primitive_desc_create(&rpd, prim_md, d->eng, user, d->eng, NULL)
                                 : dnnl_reorder_primitive_desc_create(&rpd, user, d->eng, prim_md, d->eng, NULL);
    if (err != dnnl_success)
        return err;
    err = dnnl_primitive_create(&a->reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    return err;
}

/* Makes the primitive of pd into the next cache slot, with argument i in the caller's layout
 * users[i] (NULL: the primitive's). Destroys pd. Returns the entry or NULL (logged). */
static dnnl_entry *dnnl_make(dnnl_state *d, const long *key, dnnl_primitive_desc_t pd,
                             const int *args, const dnnl_memory_desc_t *const *users, int n_args)
{
    dnnl_entry *e = &d->cache[d->n_made % DNNL_CACHE_SIZE];
    dnnl_entry_release(e);
    dnnl_status_t err = dnnl_primitive_create(&e->prim, pd);
    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(e->impl, sizeof e->impl, "%s", impl);
    for (int i = 0; err == dnnl_success && i < n_args; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, args[i]);
        e->n_args = i + 1;
        err = dnnl_arg_make(d, &e->arg[i], args[i], md, users ? users[i] : NULL);
    }
    dnnl_primitive_desc_destroy(pd);
    if (err != dnnl_success) {
        dnnl_entry_release(e);
        dnnl_fail(err, "primitive creation", DDP_ERR_BLAS);
        return NULL;
    }
    memcpy(e->key, key, sizeof e->key);
    d->n_made++;
    DDP_DEBUG("oneDNN %s: %s", dnnl_kind_names[key[0]], e->impl);
    return e;
}

/* Runs a reorder from `from` to `to`. */
static ddp_status reorder_run(dnnl_state *d, dnnl_primitive_t r, dnnl_memory_t from,
                              dnnl_memory_t to)
{
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    TRY_DNNL(dnnl_primitive_execute(r, d->strm, 2, args));
    return DDP_OK;
}

/* Runs e on the buffers ptrs[i] (one per argument, in the order given at creation), reordering
 * the arguments whose layout the primitive chose. */
static ddp_status dnnl_run(dnnl_state *d, dnnl_entry *e, void *const *ptrs)
{
    dnnl_exec_arg_t args[DNNL_MAX_ARGS];
    for (int i = 0; i < e->n_args; i++) {
        dnnl_arg *a = &e->arg[i];
        TRY_DNNL(dnnl_memory_set_data_handle(a->user, ptrs[i]));
        args[i] = (dnnl_exec_arg_t){.arg = a->id, .memory = a->prim ? a->prim : a->user};
        if (a->prim && !dnnl_is_output(a->id))
            TRY_OK(reorder_run(d, a->reorder, a->user, a->prim));
    }
    TRY_DNNL(dnnl_primitive_execute(e->prim, d->strm, e->n_args, args));
    for (int i = 0; i < e->n_args; i++) {
        if (e->arg[i].prim && dnnl_is_output(e->arg[i].id))
            TRY_OK(reorder_run(d, e->arg[i].reorder, e->arg[i].prim, e->arg[i].user));
    }
    TRY_DNNL(dnnl_stream_wait(d->strm));
    return DDP_OK;
}

/* ---- convolution ------------------------------------------------------------------------------ */

/* The caller's plain tensors and the `any` layouts the primitive may choose from. */
typedef struct conv_mds {
    dnnl_memory_desc_t src, wei, bias, dst, wei_f32;      /* plain: NCHW, OIHW, fp32 bias */
    dnnl_memory_desc_t any_src, any_wei, any_dst, any_wei_f32;
    dnnl_dims_t strides, pad;
} conv_mds;

static ddp_status conv_describe(ddp_dtype p, const ops_conv_shape *s, int batch, conv_mds *d)
{
    dnnl_dims_t src = {batch, s->c_in, s->h, s->w}, wei = {s->c_out, s->c_in, s->k, s->k};
    dnnl_dims_t bias = {s->c_out}, dst = {batch, s->c_out, s->h_out, s->w_out};
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->src, 4, src, dnnl_dt(p), dnnl_nhwc));
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->wei, 4, wei, dnnl_dt(p), dnnl_oihw));
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->bias, 1, bias, dnnl_f32, dnnl_a));
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->dst, 4, dst, dnnl_dt(p), dnnl_nhwc));
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->wei_f32, 4, wei, dnnl_f32, dnnl_oihw));
    d->any_src = d->src; /* images stay NHWC: no reorders of activations */
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->any_wei, 4, wei, dnnl_dt(p), dnnl_format_tag_any));
    d->any_dst = d->dst;
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&d->any_wei_f32, 4, wei, dnnl_f32, dnnl_format_tag_any));
    d->strides[0] = d->strides[1] = 1;
    d->pad[0] = d->pad[1] = s->pad;
    return DDP_OK;
}

static bool dnnl_impl_is(const_dnnl_primitive_desc_t pd, const char *prefix)
{
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return strncmp(impl, prefix, strlen(prefix)) == 0;
}

/* The forward primitive descriptor (also the hint of the backward ones): oneDNN's first choice,
 * except over a single input channel (an image model's first layer), where oneDNN 2.6 puts brgconv
 * first on AVX-512 but its direct jit kernel, next in line, is faster: 64x1x28x28 -> 20 channels 5x5,
 * one thread, AMD Zen with AVX-512, medians of 25: fp32 0.61 ms against 0.88, bf16 0.50 against 0.77. */
static ddp_status conv_fwd_pd(dnnl_state *d, const ops_conv_shape *s, const conv_mds *cm,
                              dnnl_primitive_desc_t *pd)
{
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_iterator_t it;
    TRY_DNNL(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct,
                                                &cm->any_src, &cm->any_wei, &cm->bias, &cm->any_dst, cm->strides,
                                                cm->pad, cm->pad));
    TRY_DNNL(dnnl_primitive_desc_iterator_create(&it, &cd, NULL, d->eng, NULL));
    *pd = dnnl_primitive_desc_iterator_fetch(it);
    if (*pd && s->c_in == 1 && dnnl_impl_is(*pd, "brg") &&
        dnnl_primitive_desc_iterator_next(it) == dnnl_success) {
        dnnl_primitive_desc_t next = dnnl_primitive_desc_iterator_fetch(it);
        if (next && dnnl_impl_is(next, "jit")) {
            dnnl_primitive_desc_destroy(*pd);
            *pd = next;
        } else {
            dnnl_primitive_desc_destroy(next);
        }
    }
    dnnl_primitive_desc_iterator_destroy(it);
    return *pd ? DDP_OK : dnnl_fail(dnnl_runtime_error, "convolution forward", DDP_ERR_UNSUPPORTED);
}

static void conv_key(long *key, int kind, ddp_dtype p, const ops_conv_shape *s, int batch)
{
    long k[DNNL_KEY_LEN] = {kind, p, batch, s->c_in, s->h, s->w, s->c_out, s->k, s->pad, 0};
    memcpy(key, k, sizeof k);
}

/* The cached primitive of one convolution direction, made on first use. */
static ddp_status conv_get(dnnl_state *d, int kind, ddp_dtype p, const ops_conv_shape *s, int batch,
                           dnnl_entry **out)
{
    long key[DNNL_KEY_LEN];
    conv_key(key, kind, p, s, batch);
    if ((*out = dnnl_find(d, key)))
        return DDP_OK;
    conv_mds cm;
    dnnl_primitive_desc_t fwd = NULL, pd = NULL;
    ddp_status st = dnnl_open(d);
    if (st == DDP_OK)
        st = conv_describe(p, s, batch, &cm);
    if (st == DDP_OK)
        st = conv_fwd_pd(d, s, &cm, &fwd);
    if (st != DDP_OK)
        return st;
    dnnl_convolution_desc_t cd;
    dnnl_status_t err = dnnl_success;
    static const int fwd_args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST};
    static const int data_args[] = {DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC};
    static const int wei_args[] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS,
                                   DNNL_ARG_DIFF_BIAS};
    const dnnl_memory_desc_t *fwd_users[] = {&cm.src, &cm.wei, &cm.bias, &cm.dst};
    const dnnl_memory_desc_t *data_users[] = {&cm.wei, &cm.dst, &cm.src};
    const dnnl_memory_desc_t *wei_users[] = {&cm.src, &cm.dst, &cm.wei_f32, &cm.bias};
    if (kind == K_CONV_FWD) {
        *out = dnnl_make(d, key, fwd, fwd_args, fwd_users, 4);
        return *out ? DDP_OK : DDP_ERR_BLAS;
    }
    if (kind == K_CONV_BWD_DATA)
        err = dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &cm.any_src,
                                                       &cm.any_wei, &cm.any_dst, cm.strides, cm.pad, cm.pad);
    else
        err = dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &cm.any_src,
                                                          &cm.any_wei_f32, &cm.bias, &cm.any_dst,
                                                          cm.strides, cm.pad, cm.pad);
    if (err == dnnl_success)
        err = dnnl_primitive_desc_create(&pd, &cd, NULL, d->eng, fwd);
    dnnl_primitive_desc_destroy(fwd);
    if (err != dnnl_success)
        return dnnl_fail(err, dnnl_kind_names[kind], DDP_ERR_UNSUPPORTED);
    *out = kind == K_CONV_BWD_DATA ? dnnl_make(d, key, pd, data_args, data_users, 3)
                                   : dnnl_make(d, key, pd, wei_args, wei_users, 4);
    return *out ? DDP_OK : DDP_ERR_BLAS;
}

ddp_status ops_dnnl_conv_fwd(dnnl_state *d, ddp_dtype p, const ops_conv_shape *s, int batch,
                             const void *x, const void *w, const float *b, void *y)
{
    dnnl_entry *e;
    TRY_OK(conv_get(d, K_CONV_FWD, p, s, batch, &e));
    void *ptrs[] = {(void *)x, (void *)w, (void *)b, y};
    return dnnl_run(d, e, ptrs);
}

ddp_status ops_dnnl_conv_bwd_data(dnnl_state *d, ddp_dtype p, const ops_conv_shape *s, int batch,
                                  const void *w, const void *dy, void *dx)
{
    dnnl_entry *e;
    TRY_OK(conv_get(d, K_CONV_BWD_DATA, p, s, batch, &e));
    void *ptrs[] = {(void *)w, (void *)dy, dx};
    return dnnl_run(d, e, ptrs);
}

ddp_status ops_dnnl_conv_bwd_weights(dnnl_state *d, ddp_dtype p, const ops_conv_shape *s, int batch,
                                     const void *x, const void *dy, float *dw, float *db)
{
    dnnl_entry *e;
    TRY_OK(conv_get(d, K_CONV_BWD_WEIGHTS, p, s, batch, &e));
    void *ptrs[] = {(void *)x, (void *)dy, dw, db};
    return dnnl_run(d, e, ptrs);
}

/* ---- pooling ---------------------------------------------------------------------------------- */

static ddp_status pool_get(dnnl_state *d, int kind, ddp_dtype p, int n, int c, int h, int w,
                           dnnl_entry **out)
{
    long key[DNNL_KEY_LEN] = {kind, p, n, c, h, w};
    if ((*out = dnnl_find(d, key)))
        return DDP_OK;
    TRY_OK(dnnl_open(d));
    dnnl_memory_desc_t src, dst;
    dnnl_dims_t sd = {n, c, h, w}, dd = {n, c, h / 2, w / 2};
    dnnl_dims_t two = {2, 2}, zero = {0, 0};
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_dt(p), dnnl_nhwc));
    TRY_DNNL(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_dt(p), dnnl_nhwc));
    dnnl_pooling_desc_t fd, bd;
    dnnl_primitive_desc_t fwd = NULL, pd = NULL;
    TRY_DNNL(dnnl_pooling_forward_desc_init(&fd, dnnl_forward_training, dnnl_pooling_max, &src, &dst,
                                            two, two, zero, zero));
    TRY_DNNL(dnnl_primitive_desc_create(&fwd, &fd, NULL, d->eng, NULL));
    static const int fwd_args[] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_WORKSPACE};
    static const int bwd_args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WORKSPACE, DNNL_ARG_DIFF_SRC};
    if (kind == K_POOL_FWD) {
        *out = dnnl_make(d, key, fwd, fwd_args, NULL, 3);
        return *out ? DDP_OK : DDP_ERR_BLAS;
    }
    dnnl_status_t err = dnnl_pooling_backward_desc_init(&bd, dnnl_pooling_max, &src, &dst, two, two,
                                                        zero, zero);
    if (err == dnnl_success)
        err = dnnl_primitive_desc_create(&pd, &bd, NULL, d->eng, fwd);
    dnnl_primitive_desc_destroy(fwd);
    if (err != dnnl_success)
        return dnnl_fail(err, "pooling backward", DDP_ERR_UNSUPPORTED);
    *out = dnnl_make(d, key, pd, bwd_args, NULL, 3);
    return *out ? DDP_OK : DDP_ERR_BLAS;
}

ddp_status ops_dnnl_pool_fwd(dnnl_state *d, ddp_dtype p, const void *x, int n, int c, int h, int w,
                             void *y, void *ws, size_t ws_bytes)
{
    dnnl_entry *e;
    TRY_OK(pool_get(d, K_POOL_FWD, p, n, c, h, w, &e));
    const dnnl_memory_desc_t *md;
    TRY_DNNL(dnnl_memory_get_memory_desc(e->arg[2].user, &md));
    if (dnnl_memory_desc_get_size(md) > ws_bytes) {
        DDP_ERROR("pool_fwd: oneDNN needs a %zu-byte workspace, the caller gave %zu",
                  dnnl_memory_desc_get_size(md), ws_bytes);
        return DDP_ERR_INVALID_ARG;
    }
    void *ptrs[] = {(void *)x, y, ws};
    return dnnl_run(d, e, ptrs);
}

ddp_status ops_dnnl_pool_bwd(dnnl_state *d, ddp_dtype p, const void *dy, const void *ws, int n,
                             int c, int h, int w, void *dx)
{
    dnnl_entry *e;
    TRY_OK(pool_get(d, K_POOL_BWD, p, n, c, h, w, &e));
    void *ptrs[] = {(void *)dy, (void *)ws, dx};
    return dnnl_run(d, e, ptrs);
}

/* ---- layout ----------------------------------------------------------------------------------- */

ddp_status ops_dnnl_image_reorder(dnnl_state *d, ddp_dtype p, const void *src, void *dst, int n,
                                  int c, int h, int w, bool to_nchw)
{
    long key[DNNL_KEY_LEN] = {K_REORDER, p, n, c, h, w, to_nchw};
    dnnl_entry *e = dnnl_find(d, key);
    if (!e) {
        TRY_OK(dnnl_open(d));
        dnnl_memory_desc_t nhwc, nchw;
        dnnl_dims_t dims = {n, c, h, w};
        dnnl_primitive_desc_t pd;
        TRY_DNNL(dnnl_memory_desc_init_by_tag(&nhwc, 4, dims, dnnl_dt(p), dnnl_nhwc));
        TRY_DNNL(dnnl_memory_desc_init_by_tag(&nchw, 4, dims, dnnl_dt(p), dnnl_nchw));
        TRY_DNNL(dnnl_reorder_primitive_desc_create(&pd, to_nchw ? &nhwc : &nchw, d->eng,
                                                    to_nchw ? &nchw : &nhwc, d->eng, NULL));
        static const int args[] = {DNNL_ARG_FROM, DNNL_ARG_TO};
        if (!(e = dnnl_make(d, key, pd, args, NULL, 2)))
            return DDP_ERR_BLAS;
    }
    void *ptrs[] = {(void *)src, dst};
    return dnnl_run(d, e, ptrs);
}

/* ---- matmul ----------------------------------------------------------------------------------- */

/* A (rows, cols) row-major matrix, or the transposed view of a (cols, rows) one. */
static dnnl_status_t mm_md(dnnl_memory_desc_t *md, int rows, int cols, bool trans, dnnl_data_type_t dt)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : cols, trans ? rows : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

static ddp_status mm_pd(dnnl_state *d, ddp_dtype p, const long *key, dnnl_primitive_desc_t *pd)
{
    int m = (int)key[2], n = (int)key[3], k = (int)key[4];
    bool ta = key[5], tb = key[6], has_bias = key[7], c_fp32 = key[8], acc = key[9];
    dnnl_memory_desc_t a, b, bias, c;
    TRY_DNNL(mm_md(&a, m, k, ta, dnnl_dt(p)));
    TRY_DNNL(mm_md(&b, k, n, tb, dnnl_dt(p)));
    TRY_DNNL(mm_md(&bias, 1, n, false, dnnl_f32));
    TRY_DNNL(mm_md(&c, m, n, false, c_fp32 ? dnnl_f32 : dnnl_dt(p)));
    dnnl_matmul_desc_t md;
    TRY_DNNL(dnnl_matmul_desc_init(&md, &a, &b, has_bias ? &bias : NULL, &c));
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_status_t err = dnnl_primitive_attr_create(&attr);
    if (err == dnnl_success && acc)
        err = dnnl_post_ops_create(&po);
    if (err == dnnl_success && acc)
        err = dnnl_post_ops_append_sum(po, 1.0f);
    if (err == dnnl_success && acc)
        err = dnnl_primitive_attr_set_post_ops(attr, po);
    if (err == dnnl_success)
        err = dnnl_primitive_desc_create(pd, &md, attr, d->eng, NULL);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return err == dnnl_success ? DDP_OK : dnnl_fail(err, "matmul", DDP_ERR_UNSUPPORTED);
}

ddp_status ops_dnnl_matmul(dnnl_state *d, ddp_dtype p, int m, int n, int k, const void *a,
                           bool trans_a, const void *b, bool trans_b, const float *bias, void *c,
                           bool c_fp32, bool accumulate)
{
    long key[DNNL_KEY_LEN] = {K_MATMUL, p, m, n, k, trans_a, trans_b, bias != NULL, c_fp32, accumulate};
    dnnl_entry *e = dnnl_find(d, key);
    if (!e) {
        dnnl_primitive_desc_t pd;
        TRY_OK(dnnl_open(d));
        TRY_OK(mm_pd(d, p, key, &pd));
        static const int with_bias[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST};
        static const int no_bias[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        e = bias ? dnnl_make(d, key, pd, with_bias, NULL, 4) : dnnl_make(d, key, pd, no_bias, NULL, 3);
        if (!e)
            return DDP_ERR_BLAS;
    }
    void *with[] = {(void *)a, (void *)b, (void *)bias, c}, *without[] = {(void *)a, (void *)b, c};
    return dnnl_run(d, e, bias ? with : without);
}

int ops_dnnl_has_avx512(void)
{
    cpu_isa_export();
    return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

/* ---- report ----------------------------------------------------------------------------------- */

/* Whether an entry before `i` of this kind and precision already has the implementation of i. */
static bool dnnl_impl_seen(dnnl_state *d, int i)
{
    const dnnl_entry *e = &d->cache[i];
    for (int j = 0; j < i; j++) {
        if (d->cache[j].key[0] == e->key[0] && d->cache[j].key[1] == e->key[1] &&
            strcmp(d->cache[j].impl, e->impl) == 0)
            return true;
    }
    return false;
}

const char *ops_dnnl_impls(dnnl_state *d, ddp_dtype p)
{
    char *text = d->text;
    size_t len = 0;
    int n = d->n_made < DNNL_CACHE_SIZE ? d->n_made : DNNL_CACHE_SIZE;
    text[0] = '\0';
    for (int kind = K_CONV_FWD; kind <= K_MATMUL; kind++) {
        bool first = true; /* "conv_fwd A+B": each kind once, then its distinct implementations */
        for (int i = 0; i < n; i++) {
            const dnnl_entry *e = &d->cache[i];
            if (e->key[0] != kind || e->key[1] != p || dnnl_impl_seen(d, i))
                continue;
            if (first)
                len += (size_t)snprintf(text + len, sizeof d->text - len, "%s%s %s", len ? ", " : "",
                                        dnnl_kind_names[kind], e->impl);
            else
                len += (size_t)snprintf(text + len, sizeof d->text - len, "+%s", e->impl);
            if (len >= sizeof d->text)
                return text;
            first = false;
        }
    }
    return text;
}

/* ---- the state -------------------------------------------------------------------------------- */

ddp_status ops_dnnl_create(dnnl_state **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? DDP_OK : DDP_ERR_NOMEM;
}

void ops_dnnl_destroy(dnnl_state *d)
{
    if (!d)
        return;
    for (int i = 0; i < DNNL_CACHE_SIZE; i++)
        dnnl_entry_release(&d->cache[i]);
    if (d->strm)
        dnnl_stream_destroy(d->strm);
    if (d->eng)
        dnnl_engine_destroy(d->eng);
    free(d);
}
