/* test_gradcheck.c - every layer's backward pass (and both full models') against central finite
 * differences of the float forward pass, on the CPU backend: once with its oneDNN convolutions and
 * pooling, once with the im2col + OpenBLAS ones (ops_cpu_open with im2col).
 *
 * Layers are checked through the objective L = sum(G * y) with a fixed random G, so dL/dy = G.
 * Tolerances: a layer that is linear in the perturbed value (linear, conv) has an exact central
 * difference, so the error is float rounding of the forward pass divided by 2*eps: with eps = 1e-2
 * and O(1) outputs that is about 1e-5; we allow 1e-3 + 1e-2 * |numeric|. ReLU and max-pool inputs
 * are kept at least 10 * eps away from their kinks and ties so the difference stays exact.
 * The full models' loss is a float scalar near 2.3: its rounding (2.4e-7) over 2 * eps = 6e-4 gives
 * up to 4e-4 of noise, hence 1e-3 + 5e-2 * |numeric|. A larger eps makes perturbations cross ReLU
 * kinks and pool ties of the 20-channel CNN (eps = 3e-3 gives several such mismatches in conv2.bias,
 * whose shift moves 196 units at once), so eps = 3e-4, and one mismatch in 24 per tensor is
 * tolerated for a kink; a wrong gradient fails nearly all of them.
 */
#include <string.h>

#include "layers.h"
#include "model.h"
#include "testutil.h"

#define F32 DDP_FP32

static const ops_handle *cpu; /* the table under test: oneDNN convolutions, then im2col */

static double dot_g(const float *g, const float *y, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * (double)y[i];
    return s;
}

/* ---- linear ------------------------------------------------------------------------------ */

typedef struct linear_case {
    int batch, in, out;
    float *x, *w, *b, *g, *y; // (batch,in) (out,in) (out) (batch,out) (batch,out)
} linear_case;

static double linear_objective(void *p)
{
    linear_case *c = p;
    layer_linear_fwd(cpu, F32, c->x, c->w, c->b, c->batch, c->in, c->out, c->y, false);
    return dot_g(c->g, c->y, (size_t)c->batch * c->out);
}

static void check_linear(test_rng *r)
{
    linear_case c = {.batch = 3, .in = 7, .out = 5};
    c.x = test_floats(21), c.w = test_floats(35), c.b = test_floats(5), c.g = test_floats(15);
    c.y = test_floats(15);
    float *dx = test_floats(21), *dw = test_floats(35), *db = test_floats(5);
    test_fill(r, c.x, 21, -1, 1), test_fill(r, c.w, 35, -1, 1), test_fill(r, c.b, 5, -1, 1);
    test_fill(r, c.g, 15, -1, 1);
    test_fill_nan(dw, 35), test_fill_nan(db, 5); /* overwritten, never read */
    CHECK(layer_linear_bwd_params(cpu, F32, c.x, c.g, 3, 7, 5, dw, db, false) == DDP_OK, "linear bwd params");
    CHECK(layer_linear_bwd_input(cpu, F32, c.w, c.g, 3, 7, 5, dx) == DDP_OK, "linear bwd input");
    CHECK(test_gradcheck("linear dx", c.x, 21, 1, dx, linear_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "linear dx");
    CHECK(test_gradcheck("linear dw", c.w, 35, 1, dw, linear_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "linear dw");
    CHECK(test_gradcheck("linear db", c.b, 5, 1, db, linear_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "linear db");
    free(c.x), free(c.w), free(c.b), free(c.g), free(c.y), free(dx), free(dw), free(db);
}

/* ---- conv2d ------------------------------------------------------------------------------ */

typedef struct conv_case {
    layer_conv cv;
    int batch;
    float *x, *w, *b, *g, *y, *col;
} conv_case;

static double conv_objective(void *p)
{
    conv_case *c = p;
    layer_conv_fwd(cpu, F32, &c->cv, c->x, c->w, c->b, c->batch, c->col, c->y);
    return dot_g(c->g, c->y, (size_t)c->batch * c->cv.c_out * c->cv.h_out * c->cv.w_out);
}

static void check_conv(test_rng *r, int c_in, int h, int w, int c_out, int k, int pad)
{
    conv_case c = {.batch = 2};
    CHECK(layer_conv_init(cpu, &c.cv, c_in, h, w, c_out, k, pad) == DDP_OK, "conv init");
    size_t n_x = (size_t)c.batch * c_in * h * w, n_w = (size_t)c_out * c_in * k * k;
    size_t n_y = (size_t)c.batch * c_out * c.cv.h_out * c.cv.w_out;
    c.x = test_floats(n_x), c.w = test_floats(n_w), c.b = test_floats((size_t)c_out);
    c.g = test_floats(n_y), c.y = test_floats(n_y);
    c.col = test_floats(c.batch * layer_conv_col_numel(&c.cv));
    float *dx = test_floats(n_x), *dw = test_floats(n_w), *db = test_floats((size_t)c_out);
    float *dcol = test_floats(layer_conv_col_numel(&c.cv));
    test_fill(r, c.x, n_x, -1, 1), test_fill(r, c.w, n_w, -1, 1);
    test_fill(r, c.b, (size_t)c_out, -1, 1), test_fill(r, c.g, n_y, -1, 1);
    conv_objective(&c); /* fills col for the parameter gradients */
    test_fill_nan(dw, n_w), test_fill_nan(db, (size_t)c_out); /* overwritten */
    CHECK(layer_conv_bwd_params(cpu, F32, &c.cv, c.x, c.col, c.g, c.batch, dw, db, false) == DDP_OK,
          "conv bwd params");
    CHECK(layer_conv_bwd_input(cpu, F32, &c.cv, c.w, c.g, c.batch, dcol, dx) == DDP_OK, "conv bwd input");
    CHECK(test_gradcheck("conv dx", c.x, n_x, 1, dx, conv_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "conv dx k=%d", k);
    CHECK(test_gradcheck("conv dw", c.w, n_w, 1, dw, conv_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "conv dw k=%d", k);
    CHECK(test_gradcheck("conv db", c.b, (size_t)c_out, 1, db, conv_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "conv db k=%d", k);
    layer_conv_release(cpu, &c.cv);
    free(c.x), free(c.w), free(c.b), free(c.g), free(c.y), free(c.col);
    free(dx), free(dw), free(db), free(dcol);
}

/* ---- ReLU and max-pool ------------------------------------------------------------------- */

typedef struct ew_case {
    int planes, h, w; /* pool shape; relu uses planes*h*w elements */
    float *x, *g, *y;
    int *arg;
    int pool;
} ew_case;

static double ew_objective(void *p)
{
    ew_case *c = p;
    size_t n = (size_t)c->planes * c->h * c->w;
    if (!c->pool) {
        layer_relu_fwd(cpu, F32, c->x, n, c->y);
        return dot_g(c->g, c->y, n);
    }
    layer_pool_fwd(cpu, F32, c->x, 1, c->planes, c->h, c->w, c->y, c->arg, n * sizeof(int));
    return dot_g(c->g, c->y, n / 4);
}

/* Values k * 0.25 - offset for a random permutation of k: distinct, 0.25 apart, none near 0. */
static void fill_spaced(test_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i * 0.25f - (float)n * 0.125f + 0.125f;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(test_uniform(r) * (double)(i + 1));
        float t = x[i];
        x[i] = x[j], x[j] = t;
    }
}

static void check_relu_pool(test_rng *r)
{
    ew_case c = {.planes = 3, .h = 6, .w = 4};
    size_t n = 72;
    c.x = test_floats(n), c.g = test_floats(n), c.y = test_floats(n);
    c.arg = calloc(n, sizeof(int));
    float *dx = test_floats(n);
    fill_spaced(r, c.x, n), test_fill(r, c.g, n, -1, 1);
    ew_objective(&c);
    CHECK(layer_relu_bwd(cpu, F32, c.g, c.y, n, dx) == DDP_OK, "relu bwd");
    CHECK(test_gradcheck("relu dx", c.x, n, 1, dx, ew_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "relu dx");
    c.pool = 1;
    ew_objective(&c);
    CHECK(layer_pool_bwd(cpu, F32, c.g, c.arg, 1, c.planes, c.h, c.w, dx) == DDP_OK, "pool bwd");
    CHECK(test_gradcheck("pool dx", c.x, n, 1, dx, ew_objective, &c, 1e-2f, 1e-3, 1e-2) == 0, "pool dx");
    free(c.x), free(c.g), free(c.y), free(c.arg), free(dx);
}

/* ---- softmax cross-entropy --------------------------------------------------------------- */

typedef struct xent_case {
    float *z;
    int labels[4];
} xent_case;

static double xent_objective(void *p)
{
    xent_case *c = p;
    float loss = 0.0f;
    layer_xent_fwd(cpu, c->z, c->labels, 4, 6, NULL, &loss, NULL);
    return loss;
}

static void check_xent(test_rng *r)
{
    xent_case c = {.labels = {0, 5, 2, 2}};
    c.z = test_floats(24);
    float *dz = test_floats(24);
    test_fill(r, c.z, 24, -3, 3);
    float loss;
    CHECK(layer_xent_fwd(cpu, c.z, c.labels, 4, 6, dz, &loss, NULL) == DDP_OK, "xent");
    CHECK(test_gradcheck("xent dz", c.z, 24, 1, dz, xent_objective, &c, 1e-2f, 1e-4, 1e-2) == 0, "xent dz");
    free(c.z), free(dz);
}

/* ---- full models ------------------------------------------------------------------------- */

typedef struct model_case {
    model *m;
    float *x;
    int labels[2];
} model_case;

static double model_objective(void *p)
{
    model_case *c = p;
    float loss = 0.0f;
    model_forward(c->m, c->x, c->labels, 2, &loss, NULL, NULL);
    return loss;
}

/* Checks about 24 elements of every parameter tensor. */
static void check_model(test_rng *r, model_kind kind)
{
    model_config cfg;
    model_config_default(&cfg, kind);
    model_widths_parse("784-24-16-10", &cfg);
    cfg.max_batch = 2;
    model_case c = {.labels = {3, 7}};
    CHECK(model_create(NULL, cpu, &cfg, &c.m) == DDP_OK, "model create");
    if (!c.m)
        return;
    c.x = test_floats(2 * 784);
    test_fill(r, c.x, 2 * 784, 0, 1);
    float loss;
    float *params = model_params(c.m), *grads = model_grads(c.m);
    size_t total = model_numel_total(c.m);
    test_fill_nan(grads, total); /* zero_grad: the backward overwrites, never reads */
    CHECK(model_zero_grad(c.m) == DDP_OK, "zero grad");
    CHECK(model_forward(c.m, c.x, c.labels, 2, &loss, NULL, NULL) == DDP_OK, "forward");
    CHECK(model_backward(c.m, NULL) == DDP_OK, "backward");
    /* A second backward without zero_grad adds (to rounding: the im2col path adds image by
     * image); after zero_grad it overwrites (bit for bit: the same computation again). */
    float *once = malloc(total * sizeof *once);
    memcpy(once, grads, total * sizeof *once);
    for (int zero = 0; zero < 2; zero++) {
        if (zero)
            CHECK(model_zero_grad(c.m) == DDP_OK, "zero grad");
        CHECK(model_forward(c.m, c.x, c.labels, 2, &loss, NULL, NULL) == DDP_OK, "forward");
        CHECK(model_backward(c.m, NULL) == DDP_OK, "backward");
        size_t bad = 0;
        for (size_t i = 0; i < total; i++)
            bad += zero ? grads[i] != once[i] : !(fabsf(grads[i] - 2.0f * once[i]) <= 1e-5f * fabsf(once[i]) + 1e-7f);
        CHECK(bad == 0, "%zu gradients not %s after a second backward", bad, zero ? "overwritten" : "added");
        memcpy(grads, once, total * sizeof *once);
    }
    free(once);
    const ddp_param_desc *d = model_descs(c.m);
    size_t off = 0;
    for (int i = 0; i < model_n_params(c.m); i++) {
        size_t n = model_numel(c.m)[i], step = n / 24 ? n / 24 : 1;
        int bad = test_gradcheck(d[i].name, params + off, n, step, grads + off, model_objective, &c,
                                 3e-4f, 1e-3, 5e-2);
        CHECK(bad <= 1, "%s model: %d mismatches in %s", kind == MODEL_CNN ? "cnn" : "mlp", bad, d[i].name);
        off += n;
    }
    model_destroy(c.m);
    free(c.x);
}

int main(void)
{
    for (int t = 0; t < 2; t++) {
        ops_handle *h = NULL;
        if (ops_cpu_open(NULL, 1, t == 1, &h) != DDP_OK)
            return 1;
        cpu = h;
        printf("ops table %s\n", cpu->name);
        test_rng r = {0x9E3779B97F4A7C15ULL};
        check_linear(&r);
        check_conv(&r, 2, 6, 5, 3, 3, 1);
        check_conv(&r, 1, 7, 6, 2, 5, 2);
        check_conv(&r, 3, 5, 5, 2, 3, 0);
        check_relu_pool(&r);
        check_xent(&r);
        check_model(&r, MODEL_MLP);
        check_model(&r, MODEL_CNN);
        ops_close(h);
    }
    return CHECK_DONE();
}
