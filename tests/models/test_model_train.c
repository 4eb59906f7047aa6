/* test_model_train.c - sanity of the whole training step: both models, trained with SGD on a tiny
 * synthetic data set whose classes are separable (SGD of ddp-train's optimizer, train/optim.h), drive the loss down and fit the batch; also the
 * model's parameter table (names, shapes, order, seeded init range) and the config parsers.
 */
#include <string.h>

#include "model.h"
#include "optim.h"
#include "testutil.h"

enum { BATCH = 32, PIXELS = 784, CLASSES = 10 };

/* Class c: a bright 7x7 square at a class-specific place of a 28x28 image, plus noise. */
static void make_batch(test_rng *r, float *x, int *labels)
{
    for (int i = 0; i < BATCH; i++) {
        int c = i % CLASSES, top = (c / 4) * 9, left = (c % 4) * 7;
        labels[i] = c;
        test_fill(r, x + i * PIXELS, PIXELS, 0.0, 0.3);
        for (int y = top; y < top + 7; y++)
            for (int xx = left; xx < left + 7; xx++)
                x[i * PIXELS + y * 28 + xx] += 0.7f;
    }
}

static void train(model_kind kind, int steps, float lr)
{
    model_config cfg;
    model_config_default(&cfg, kind);
    cfg.max_batch = BATCH;
    model *m = NULL;
    ops_handle *ops = NULL;
    CHECK(ops_cpu_open(NULL, 1, false, &ops) == DDP_OK && model_create(NULL, ops, &cfg, &m) == DDP_OK, "create");
    if (!m) {
        ops_close(ops);
        return;
    }
    test_rng r = {4242};
    static float x[BATCH * PIXELS];
    int labels[BATCH], pred[BATCH], correct = 0;
    float first = 0.0f, loss = 0.0f;
    make_batch(&r, x, labels);
    optim_opts oo = {.kind = OPTIM_SGD, .momentum = 0.9f, .weight_decay = 1e-4f};
    optim *o = NULL;
    optim_weights w = {.w = NULL};
    w.w = model_weights(m, &w.p);
    CHECK(optim_create(NULL, ops, &oo, model_numel(m), model_n_params(m), NULL, &w, &o) == DDP_OK,
          "optimizer");
    for (int s = 0; o && s < steps; s++) {
        CHECK(model_zero_grad(m) == DDP_OK, "zero_grad");
        CHECK(model_forward(m, x, labels, BATCH, &loss, &correct, pred) == DDP_OK, "forward");
        CHECK(model_backward(m, NULL) == DDP_OK, "backward");
        CHECK(optim_step(o, model_grads(m), lr, s + 1, 1.0f) == DDP_OK, "sgd");
        if (s == 0)
            first = loss;
    }
    CHECK(model_forward(m, x, labels, BATCH, &loss, &correct, pred) == DDP_OK, "forward");
    int agree = 0;
    for (int i = 0; i < BATCH; i++)
        agree += pred[i] == labels[i];
    const char *name = kind == MODEL_CNN ? "cnn" : "mlp";
    fprintf(stderr, "%s: loss %.4f -> %.4f, %d/%d correct\n", name, first, loss, correct, BATCH);
    CHECK(first > 2.0f && first < 2.6f, "%s: initial loss %g is near ln 10", name, first);
    CHECK(loss < 0.25f * first, "%s: loss %g did not fall below a quarter of %g", name, loss, first);
    CHECK(correct == BATCH && agree == correct, "%s: %d correct, %d predictions agree", name, correct, agree);
    optim_destroy(o);
    model_destroy(m);
    ops_close(ops);
}

static void check_layout(void)
{
    model_config cfg;
    model_config_default(&cfg, MODEL_CNN);
    model *m = NULL;
    ops_handle *ops = NULL;
    CHECK(ops_cpu_open(NULL, 1, false, &ops) == DDP_OK && model_create(NULL, ops, &cfg, &m) == DDP_OK, "create cnn");
    if (!m) {
        ops_close(ops);
        return;
    }
    static const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                  "fc1.weight", "fc1.bias"};
    static const size_t numel[] = {500, 20, 10000, 20, 9800, 10};
    const ddp_param_desc *d = model_descs(m);
    CHECK(model_n_params(m) == 6, "cnn has 6 parameters");
    for (int i = 0; i < 6 && i < model_n_params(m); i++) {
        CHECK(strcmp(d[i].name, names[i]) == 0, "param %d is %s, want %s", i, d[i].name, names[i]);
        CHECK(model_numel(m)[i] == numel[i], "%s numel %zu", names[i], model_numel(m)[i]);
    }
    CHECK(d[2].n_dims == 4 && d[2].shape[0] == 20 && d[2].shape[1] == 20 && d[2].shape[3] == 5, "conv2 shape");
    CHECK(d[4].n_dims == 2 && d[4].shape[0] == 10 && d[4].shape[1] == 980, "fc1 shape (out, in)");
    CHECK(model_numel_total(m) == 20350, "total %zu", model_numel_total(m));
    const float *p = model_params(m) + 520; /* conv2.weight: bound 1/sqrt(500) */
    float mx = 0.0f;
    for (int i = 0; i < 10000; i++)
        mx = fabsf(p[i]) > mx ? fabsf(p[i]) : mx;
    CHECK(mx <= 1.0f / sqrtf(500.0f) && mx > 0.9f / sqrtf(500.0f), "conv2 init range %g", mx);
    model_destroy(m);
    ops_close(ops);
}

static void check_parsers(void)
{
    model_config cfg;
    model_kind k;
    model_config_default(&cfg, MODEL_MLP);
    CHECK(cfg.n_widths == 4 && cfg.widths[1] == 512 && cfg.max_batch == 64 && cfg.seed == 42, "defaults");
    CHECK(model_kind_parse("cnn", &k) == DDP_OK && k == MODEL_CNN, "parse cnn");
    CHECK(model_kind_parse("mlp", &k) == DDP_OK && k == MODEL_MLP, "parse mlp");
    CHECK(model_kind_parse("resnet", &k) == DDP_ERR_INVALID_ARG, "reject resnet");
    CHECK(model_widths_parse("784-100-10", &cfg) == DDP_OK && cfg.n_widths == 3 && cfg.widths[1] == 100, "widths");
    CHECK(model_widths_parse("784-100-9", &cfg) == DDP_ERR_INVALID_ARG, "last must be 10");
    CHECK(model_widths_parse("784--10", &cfg) == DDP_ERR_INVALID_ARG, "empty width");
    CHECK(model_widths_parse("784-10-", &cfg) == DDP_ERR_INVALID_ARG, "trailing dash");
    CHECK(model_widths_parse("784-1-1-1-1-1-1-1-1-10", &cfg) == DDP_ERR_INVALID_ARG, "too many layers");
    CHECK(cfg.n_widths == 3, "a failed parse leaves the config alone");
}

int main(void)
{
    check_parsers();
    check_layout();
    train(MODEL_MLP, 30, 0.05f);
    train(MODEL_CNN, 30, 0.05f);
    return CHECK_DONE();
}
