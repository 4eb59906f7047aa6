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
    return CHECK_DONE();
}
