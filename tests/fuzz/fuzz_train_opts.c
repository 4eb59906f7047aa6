/* fuzz_train_opts.c - libFuzzer harness: ddp-train's command line (models/train_opts.c) on any
 * arguments. Input: the arguments after "ddp-train", one per line. Besides the sanitizers'
 * checks: every accepted command line has every value inside the range its flag documents. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train_opts.h"

#define FUZZ_MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int in(double v, double lo, double hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

static void check_opts(const train_opts *o)
{
    const model_config *m = &o->model;
    int ok = o->epochs >= 1 && o->epochs <= TRAIN_MAX_EPOCHS && o->max_steps >= 0 &&
             o->max_steps <= TRAIN_MAX_STEPS && o->batch >= 1 && o->accum >= 1 && o->threads >= 1 &&
             o->threads <= TRAIN_MAX_THREADS && o->log_every >= 1 && o->workers >= 0 &&
             o->workers <= TRAIN_MAX_WORKERS && o->loss_scale_init > 0.0 && o->loss_scale_init <= FLT_MAX &&
             in(o->lr, TRAIN_MIN_LR, TRAIN_MAX_LR) && in(o->momentum, 0.0, 1.0) && o->momentum < 1.0 &&
             in(o->weight_decay, 0.0, TRAIN_MAX_WEIGHT_DECAY) && o->bucket_mb > 0.0 &&
             in(o->bucket_mb, 0.0, TRAIN_MAX_BUCKET_MB) && o->first_bucket_mb > 0.0 &&
             in(o->first_bucket_mb, 0.0, TRAIN_MAX_BUCKET_MB) && o->data_dir && m->max_batch == o->batch &&
             m->seed == o->seed && (m->kind == MODEL_MLP || m->kind == MODEL_CNN);
    if (m->kind == MODEL_MLP) {
        ok = ok && m->n_widths >= 2 && m->n_widths <= MODEL_MLP_MAX_LAYERS + 1 && m->widths[0] == 784 &&
             m->widths[m->n_widths - 1] == 10;
        for (int i = 0; ok && i < m->n_widths; i++)
            ok = m->widths[i] >= 1 && m->widths[i] <= MODEL_MLP_MAX_WIDTH;
    }
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), *argv[FUZZ_MAX_ARGS + 2] = {"ddp-train"};
    int argc = 1;
    train_opts o;
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    for (char *p = text; argc <= FUZZ_MAX_ARGS && p; argc++) {
        argv[argc] = p;
        p = strchr(p, '\n');
        if (p)
            *p++ = '\0';
    }
    argv[argc] = NULL;
    if (train_parse_args(argc, argv, &o) == TRAIN_PARSE_RUN)
        check_opts(&o);
    free(text);
    return 0;
}
