/* train.c - the smallest data-parallel training program on libddp, using nothing but ddp.h: linear
 * regression y = w.x + b on synthetic data, trained with SGD by every rank on its shard of each
 * batch, gradients averaged by a ddp_reducer. Build with the Makefile (pkg-config ddp), run with
 * `mpirun -np N ./train [batch-per-rank] [epochs]` (or under srun --mpi=pmix / ddp-launch).
 *
 * It prints the loss per epoch on rank 0 and, on every rank, a final line
 * "final rank=R world=W w0=... w1=... b=... loss=..." so that runs can be compared: N ranks with
 * batch B per rank follow one rank with batch N*B (the same samples per step, the same mean). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ddp.h>

enum { N_SAMPLES = 1024, DIM = 8, N_PARAMS = 2 };
static const uint64_t SEED = 42;

/* The data set, identical on every rank: x uniform in [-1, 1), y = x . w_true + b_true. */
struct data {
    float x[N_SAMPLES * DIM]; /* (N_SAMPLES, DIM) */
    float y[N_SAMPLES];       /* (N_SAMPLES) */
};

static void make_data(struct data *d)
{
    float w_true[DIM];
    ddp_init_uniform(d->x, N_SAMPLES * DIM, SEED + 1, 0, -1.0f, 1.0f);
    ddp_init_uniform(w_true, DIM, SEED + 1, 1, -2.0f, 2.0f);
    for (int i = 0; i < N_SAMPLES; i++) {
        float s = 0.5f;
        for (int j = 0; j < DIM; j++)
            s += d->x[i * DIM + j] * w_true[j];
        d->y[i] = s;
    }
}

/* Model: params = [w (DIM) | b (1)], one flat buffer; grads has the same layout. */
static float predict(const float *params, const float *x)
{
    float s = params[DIM];
    for (int j = 0; j < DIM; j++)
        s += params[j] * x[j];
    return s;
}

/* Adds the mean-squared-error gradient of the samples idx[0..n) to grads. */
static void accumulate_grads(const struct data *d, const float *params, const size_t *idx, size_t n, float *grads)
{
    for (size_t k = 0; k < n; k++) {
        const float *x = &d->x[idx[k] * DIM];
        float e = 2.0f * (predict(params, x) - d->y[idx[k]]) / (float)n;
        for (int j = 0; j < DIM; j++)
            grads[j] += e * x[j];
        grads[DIM] += e;
    }
}

static double full_loss(const struct data *d, const float *params)
{
    double sum = 0;
    for (int i = 0; i < N_SAMPLES; i++) {
        double e = predict(params, &d->x[i * DIM]) - d->y[i];
        sum += e * e;
    }
    return sum / N_SAMPLES;
}

/* One step: local gradient of this rank's batch, averaged over ranks by the reducer, then SGD. */
static ddp_status step(ddp_reducer *red, const struct data *d, float *params, float *grads, const size_t *idx,
                       size_t batch, float lr)
{
    ddp_status st;
    memset(grads, 0, (DIM + 1) * sizeof *grads);
    if ((st = ddp_reducer_begin(red, 1)) != DDP_OK)
        return st;
    accumulate_grads(d, params, idx, batch, grads);
    /* backward order: the last parameter (b) is final first */
    if ((st = ddp_reducer_mark_ready(red, 1)) != DDP_OK || (st = ddp_reducer_mark_ready(red, 0)) != DDP_OK ||
        (st = ddp_reducer_finish(red)) != DDP_OK)
        return st;
    for (int j = 0; j <= DIM; j++)
        params[j] -= lr * grads[j];
    return DDP_OK;
}

static ddp_status train(ddp_ctx *ctx, const struct data *d, float *params, size_t batch, int epochs)
{
    static const ddp_param_desc descs[N_PARAMS] = {{"w", 1, {DIM}}, {"b", 1, {1}}};
    const size_t numel[N_PARAMS] = {DIM, 1};
    float grads[DIM + 1];
    ddp_sampler *smp = NULL;
    ddp_reducer *red = NULL;
    size_t *idx = NULL;
    ddp_status st;
    ddp_init_uniform(params, DIM, SEED, 0, -0.1f, 0.1f); /* identical start on every rank */
    ddp_init_uniform(params + DIM, 1, SEED, 1, -0.1f, 0.1f);
    if ((st = ddp_verify_replicas(ctx, descs, N_PARAMS, params)) != DDP_OK ||
        (st = ddp_reducer_create(ctx, grads, numel, N_PARAMS, NULL, &red)) != DDP_OK ||
        (st = ddp_sampler_create(&(ddp_sampler_opts){.n_samples = N_SAMPLES, .world_size = ddp_world_size(ctx),
                                                     .rank = ddp_rank(ctx), .seed = SEED, .shuffle = 1},
                                 &smp)) != DDP_OK)
        goto done;
    idx = malloc(ddp_sampler_len(smp) * sizeof *idx);
    st = idx ? DDP_OK : DDP_ERR_NOMEM;
    for (int epoch = 0; st == DDP_OK && epoch < epochs; epoch++) {
        st = ddp_sampler_indices(smp, (uint64_t)epoch, idx);
        for (size_t s = 0; st == DDP_OK && (s + 1) * batch <= ddp_sampler_len(smp); s++)
            st = step(red, d, params, grads, idx + s * batch, batch, 0.05f);
        if (ddp_rank(ctx) == 0)
            printf("epoch %d loss %.6g\n", epoch, full_loss(d, params));
    }
    if (st == DDP_OK)
        st = ddp_verify_replicas(ctx, descs, N_PARAMS, params); /* still identical after training */
done:
    free(idx);
    ddp_sampler_destroy(smp);
    ddp_reducer_destroy(red);
    return st;
}

int main(int argc, char **argv)
{
    size_t batch = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    int epochs = argc > 2 ? atoi(argv[2]) : 5;
    static struct data d;
    float params[DIM + 1];
    ddp_init_opts io;
    ddp_ctx *ctx;
    ddp_status st;
    if (batch == 0 || epochs <= 0) {
        fprintf(stderr, "usage: train [batch-per-rank > 0] [epochs > 0]\n");
        return 2;
    }
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU; /* the gradients live in host memory */
    if ((st = ddp_init(&io, &ctx)) != DDP_OK) {
        fprintf(stderr, "ddp_init: %s\n", ddp_strerror(st));
        return 1;
    }
    make_data(&d);
    st = train(ctx, &d, params, batch, epochs);
    if (st != DDP_OK) {
        fprintf(stderr, "rank %d: training failed: %s\n", ddp_rank(ctx), ddp_strerror(st));
        ddp_abort(ctx, 1); /* the other ranks may be waiting in a collective */
    }
    printf("final rank=%d world=%d w0=%.7g w1=%.7g b=%.7g loss=%.7g\n", ddp_rank(ctx), ddp_world_size(ctx),
           params[0], params[1], params[DIM], full_loss(&d, params));
    ddp_finalize(ctx);
    return 0;
}
