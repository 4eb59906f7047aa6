/* test_sampler.c - the distributed sampler against PyTorch's DistributedSampler semantics, over
 * many (n, world size, shuffle, drop_last) configurations, single process (every rank simulated).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"

static const int worlds[] = {1, 2, 3, 4, 7, 8};
#define N_WORLDS ((int)(sizeof worlds / sizeof worlds[0]))

/* Per-rank length as PyTorch computes it (math.ceil on true division). */
static size_t torch_num_samples(size_t n, int world, int drop_last)
{
    if (drop_last && n % (size_t)world != 0)
        return (size_t)ceil(((double)n - world) / world);
    return (size_t)ceil((double)n / world);
}

static ddp_sampler *make(size_t n, int world, int rank, uint64_t seed, int shuffle, int drop_last)
{
    ddp_sampler_opts o = {.n_samples = n, .world_size = world, .rank = rank, .seed = seed,
                          .shuffle = shuffle, .drop_last = drop_last};
    ddp_sampler *s = NULL;
    ddp_status st = ddp_sampler_create(&o, &s);
    CHECK(st == DDP_OK && s, "create n=%zu world=%d rank=%d: %s", n, world, rank, ddp_strerror(st));
    return s;
}

/* The world-1, no-drop permutation of [0, n) for (seed, epoch): the reference order. */
static size_t *reference_perm(size_t n, uint64_t seed, uint64_t epoch, int shuffle)
{
    size_t *perm = malloc(n * sizeof *perm);
    ddp_sampler *s = make(n, 1, 0, seed, shuffle, 0);
    if (!perm || !s || ddp_sampler_len(s) != n || ddp_sampler_indices(s, epoch, perm) != DDP_OK) {
        CHECK(0, "reference permutation n=%zu failed", n);
        free(perm);
        perm = NULL;
    }
    ddp_sampler_destroy(s);
    return perm;
}

/* Checks every rank of one configuration against the reference permutation. */
static void check_config(size_t n, int world, int shuffle, int drop_last, uint64_t seed,
                         uint64_t epoch, const size_t *perm)
{
    size_t want_len = torch_num_samples(n, world, drop_last);
    size_t total = want_len * (size_t)world;
    size_t *idx = malloc((want_len + 1) * sizeof *idx);
    unsigned *seen = calloc(n, sizeof *seen);
    for (int r = 0; r < world && idx && seen; r++) {
        ddp_sampler *s = make(n, world, r, seed, shuffle, drop_last);
        if (!s)
            continue;
        CHECK(ddp_sampler_len(s) == want_len, "n=%zu world=%d drop=%d: len %zu, want %zu", n,
              world, drop_last, ddp_sampler_len(s), want_len);
        CHECK(ddp_sampler_indices(s, epoch, idx) == DDP_OK, "indices failed");
        for (size_t k = 0; k < want_len; k++) {
            size_t pos = (size_t)r + k * (size_t)world; /* position in the padded/cut list */
            CHECK(idx[k] < n, "index %zu out of range", idx[k]);
            CHECK(idx[k] == perm[pos % n], "n=%zu world=%d rank=%d k=%zu: %zu, want %zu", n, world,
                  r, k, idx[k], perm[pos % n]);
            if (idx[k] < n)
                seen[idx[k]]++;
        }
        ddp_sampler_destroy(s);
    }
    /* counts: positions [0, min(n, total)) once each, padding positions [n, total) once more */
    for (size_t i = 0; i < n && seen; i++) {
        size_t want = 0;
        for (size_t pos = 0; pos < total; pos++)
            want += perm[pos % n] == i;
        CHECK(seen[i] == want, "n=%zu world=%d drop=%d: sample %zu seen %u times, want %zu", n,
              world, drop_last, i, seen[i], want);
        if (total <= n) /* no padding: disjoint, and only the cut tail is missing */
            CHECK(seen[i] <= 1, "sample %zu given to two ranks without padding", i);
        if (total >= n) /* padding or exact: every sample is used */
            CHECK(seen[i] >= 1, "sample %zu never used", i);
    }
    CHECK(!drop_last || n - total < (size_t)world, "drop_last cut %zu >= world", n - total);
    free(idx);
    free(seen);
}

static int is_permutation(const size_t *perm, size_t n)
{
    unsigned char *hit = calloc(n, 1);
    int ok = hit != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        ok = perm[i] < n && !hit[perm[i]];
        if (ok)
            hit[perm[i]] = 1;
    }
    free(hit);
    return ok;
}

static void check_n(size_t n)
{
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        size_t *perm = reference_perm(n, 17, 3, shuffle);
        if (!perm)
            return;
        CHECK(is_permutation(perm, n), "n=%zu: not a permutation", n);
        for (size_t i = 0; !shuffle && i < n; i++)
            CHECK(perm[i] == i, "shuffle=0 must give the identity (n=%zu, i=%zu)", n, i);
        for (int w = 0; w < N_WORLDS; w++)
            for (int drop = 0; drop <= 1; drop++)
                if (!drop || n >= (size_t)worlds[w])
                    check_config(n, worlds[w], shuffle, drop, 17, 3, perm);
        free(perm);
    }
}

static void test_epochs_and_seeds(void)
{
    size_t n = 1000;
    size_t *a = reference_perm(n, 5, 0, 1), *b = reference_perm(n, 5, 0, 1);
    size_t *c = reference_perm(n, 5, 1, 1), *d = reference_perm(n, 6, 0, 1);
    if (a && b && c && d) {
        CHECK(memcmp(a, b, n * sizeof *a) == 0, "same seed and epoch must repeat");
        CHECK(memcmp(a, c, n * sizeof *a) != 0, "epochs 0 and 1 gave the same order");
        CHECK(memcmp(a, d, n * sizeof *a) != 0, "seeds 5 and 6 gave the same order");
        size_t fixed = 0;
        for (size_t i = 0; i < n; i++)
            fixed += a[i] == i;
        CHECK(fixed < 10, "shuffled order keeps %zu of 1000 in place", fixed);
    }
    free(a);
    free(b);
    free(c);
    free(d);
}

/* Over many epochs every permutation of 4 items appears about equally often (24 of them). */
static void test_uniform_shuffle(void)
{
    enum { EPOCHS = 4800 };
    unsigned counts[256] = {0};
    ddp_sampler *s = make(4, 1, 0, 11, 1, 0);
    for (uint64_t e = 0; s && e < EPOCHS; e++) {
        size_t p[4];
        ddp_sampler_indices(s, e, p);
        counts[p[0] | p[1] << 2 | p[2] << 4 | p[3] << 6]++;
    }
    ddp_sampler_destroy(s);
    int distinct = 0;
    for (int k = 0; k < 256; k++) {
        distinct += counts[k] > 0;
        /* expected 200 per permutation, sigma ~14: 120..280 is > 5 sigma */
        CHECK(counts[k] == 0 || (counts[k] > 120 && counts[k] < 280),
              "permutation code %d drawn %u times of %d", k, counts[k], EPOCHS);
    }
    CHECK(distinct == 24, "%d of the 24 permutations of 4 items drawn", distinct);
}

static void test_invalid(void)
{
    ddp_sampler_opts o = {.n_samples = 10, .world_size = 4, .rank = 4};
    ddp_sampler *s = (ddp_sampler *)&o;
    CHECK(ddp_sampler_create(&o, &s) == DDP_ERR_INVALID_ARG && !s, "rank == world accepted");
    o.rank = -1;
    CHECK(ddp_sampler_create(&o, &s) == DDP_ERR_INVALID_ARG && !s, "rank -1 accepted");
    o.rank = 0;
    o.world_size = 0;
    CHECK(ddp_sampler_create(&o, &s) == DDP_ERR_INVALID_ARG && !s, "world 0 accepted");
    o.world_size = 4;
    o.n_samples = 0;
    CHECK(ddp_sampler_create(&o, &s) == DDP_ERR_INVALID_ARG && !s, "n_samples 0 accepted");
    o.n_samples = 3;
    o.drop_last = 1;
    CHECK(ddp_sampler_create(&o, &s) == DDP_ERR_INVALID_ARG && !s, "empty drop_last accepted");
    CHECK(ddp_sampler_create(NULL, &s) == DDP_ERR_INVALID_ARG, "NULL opts accepted");
    o.n_samples = 4;
    CHECK(ddp_sampler_create(&o, &s) == DDP_OK && s, "4 samples on 4 ranks with drop_last");
    CHECK(ddp_sampler_indices(s, 0, NULL) == DDP_ERR_INVALID_ARG, "NULL out accepted");
    ddp_sampler_destroy(s);
    ddp_sampler_destroy(NULL);
}

/* Blocks (uneven shares of a step): for every world size up to the step's blocks, step s's
 * indices over all ranks are exactly the permutation's positions of step s (as the strided layout
 * gives them when the world divides the step), rank r's are the blocks r, r + world, ... in order,
 * and the lengths add up to the whole steps. */
static void test_blocks(size_t n, size_t block, int per_step, uint64_t seed)
{
    size_t *perm = reference_perm(n, seed, 3, 1), step = block * (size_t)per_step;
    size_t steps = n / step, *idx = malloc(n * sizeof *idx);
    for (int world = 1; world <= per_step && perm && idx; world++) {
        size_t total = 0;
        for (int r = 0; r < world; r++) {
            ddp_sampler_opts o = {.n_samples = n, .world_size = world, .rank = r, .seed = seed,
                                  .shuffle = 1, .block = block, .blocks_per_step = per_step};
            ddp_sampler *s = NULL;
            CHECK(ddp_sampler_create(&o, &s) == DDP_OK, "blocks: create world %d rank %d", world, r);
            size_t own = (size_t)(per_step - r + world - 1) / (size_t)world, k = 0;
            CHECK(s && ddp_sampler_len(s) == steps * own * block, "blocks %zu x %d, world %d rank "
                  "%d: len %zu, want %zu", block, per_step, world, r, ddp_sampler_len(s),
                  steps * own * block);
            if (!s || ddp_sampler_indices(s, 3, idx) != DDP_OK)
                continue;
            for (size_t st = 0; st < steps; st++) /* rank r's blocks of step st, in order */
                for (int v = r; v < per_step; v += world)
                    for (size_t i = 0; i < block; i++, k++)
                        CHECK(idx[k] == perm[st * step + (size_t)v * block + i], "blocks: world %d "
                              "rank %d step %zu block %d: %zu", world, r, st, v, idx[k]);
            total += ddp_sampler_len(s);
            ddp_sampler_destroy(s);
        }
        CHECK(total == steps * step, "blocks: world %d: %zu indices, want %zu", world, total,
              steps * step);
    }
    ddp_sampler_opts bad = {.n_samples = n, .world_size = per_step + 1, .block = block,
                            .blocks_per_step = per_step};
    ddp_sampler *s = NULL;
    CHECK(ddp_sampler_create(&bad, &s) == DDP_ERR_INVALID_ARG && !s, "fewer blocks than ranks");
    bad.world_size = 1;
    bad.n_samples = step - 1;
    CHECK(ddp_sampler_create(&bad, &s) == DDP_ERR_INVALID_ARG && !s, "no whole step accepted");
    free(perm);
    free(idx);
}

int main(void)
{
    for (size_t n = 1; n <= 40; n++)
        check_n(n);
    check_n(97);
    check_n(1000);
    check_n(1001);
    test_epochs_and_seeds();
    test_uniform_shuffle();
    test_invalid();
    test_blocks(103, 4, 5, 11);
    test_blocks(1000, 8, 12, 42);
    test_blocks(7, 1, 7, 5);
    return CHECK_DONE();
}
