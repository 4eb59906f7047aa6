/* sampler.c - distributed sampler with the semantics of PyTorch's DistributedSampler.
 *
 * Per epoch: a permutation of [0, n) by Fisher-Yates driven by a Philox-4x32-10 stream keyed on
 * (seed, epoch) (identity without shuffle); it depends on n, seed and epoch only, never on the
 * world size. The permuted list is padded cyclically (drop_last = 0) or cut (drop_last = 1) to
 * total = per_rank * world_size, and rank r takes positions r, r + world_size, ...
 * per_rank is ceil(n / world) without drop_last and floor(n / world) with it (PyTorch's
 * ceil((n - world) / world) when n % world != 0).
 * With blocks (an uneven share of a step's micro-batches), rank r takes, of every whole step of
 * blocks_per_step blocks, the blocks r, r + world, ...: its own blocks per step times the steps.
 */
#include <stdlib.h>

#include <Random123/philox.h>

#include "internal.h"

/* Separates the sampler's streams from the initialisation streams (rng.c) of the same seed. */
#define DDP_SAMPLER_STREAM_TAG 0x53414d50u /* "SAMP" */

struct ddp_sampler {
    ddp_sampler_opts opts;
    size_t per_rank; /* indices per rank per epoch */
    size_t *perm;    /* n_samples entries, rebuilt per epoch */
};

/* A sequential stream of 32-bit words from Philox keyed on (seed, epoch). */
typedef struct perm_stream {
    philox4x32_key_t key;
    uint32_t epoch_lo, epoch_hi;
    uint64_t block;
    philox4x32_ctr_t words;
    int used; /* words already consumed from `words` */
} perm_stream;

static void perm_stream_init(perm_stream *st, uint64_t seed, uint64_t epoch)
{
    st->key.v[0] = (uint32_t)seed;
    st->key.v[1] = (uint32_t)(seed >> 32);
    st->epoch_lo = (uint32_t)epoch;
    st->epoch_hi = (uint32_t)(epoch >> 32) ^ DDP_SAMPLER_STREAM_TAG;
    st->block = 0;
    st->used = 4;
}

static uint32_t perm_stream_next32(perm_stream *st)
{
    if (st->used == 4) {
        philox4x32_ctr_t ctr = {{(uint32_t)st->block, (uint32_t)(st->block >> 32), st->epoch_lo,
                                 st->epoch_hi}};
        st->words = philox4x32(ctr, st->key);
        st->block++;
        st->used = 0;
    }
    return st->words.v[st->used++];
}

/* Uniform integer in [0, bound] without modulo bias (rejection on 64-bit draws). */
static uint64_t perm_stream_upto(perm_stream *st, uint64_t bound)
{
    uint64_t range = bound + 1;
    if (range == 0) /* bound is UINT64_MAX: every draw is valid */
        return ((uint64_t)perm_stream_next32(st) << 32) | perm_stream_next32(st);
    uint64_t limit = UINT64_MAX - (UINT64_MAX % range + 1) % range; /* largest usable draw */
    for (;;) {
        uint64_t r = ((uint64_t)perm_stream_next32(st) << 32) | perm_stream_next32(st);
        if (r <= limit)
            return r % range;
    }
}

static void sampler_permute(ddp_sampler *s, uint64_t epoch)
{
    size_t n = s->opts.n_samples;
    for (size_t i = 0; i < n; i++)
        s->perm[i] = i;
    if (!s->opts.shuffle)
        return;
    perm_stream st;
    perm_stream_init(&st, s->opts.seed, epoch);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)perm_stream_upto(&st, i);
        size_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
}

/* With blocks: how many of a step's blocks are this rank's. */
static size_t sampler_own_blocks(const ddp_sampler_opts *o)
{
    return (size_t)(o->blocks_per_step - o->rank + o->world_size - 1) / (size_t)o->world_size;
}

static ddp_status sampler_check(const ddp_sampler_opts *o)
{
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size) {
        DDP_ERROR("ddp_sampler_create: rank %d is outside [0, world_size %d): pass the rank and "
                  "world size from ddp_rank()/ddp_world_size()", o->rank, o->world_size);
        return DDP_ERR_INVALID_ARG;
    }
    if (o->n_samples == 0) {
        DDP_ERROR("ddp_sampler_create: n_samples is 0: the dataset must hold at least one sample");
        return DDP_ERR_INVALID_ARG;
    }
    if (o->block && (o->blocks_per_step < o->world_size ||
                     o->n_samples / o->block < (size_t)o->blocks_per_step)) {
        DDP_ERROR("ddp_sampler_create: blocks of %zu: %d per step for %d ranks over %zu samples: "
                  "every rank needs a block per step and the data a whole step", o->block,
                  o->blocks_per_step, o->world_size, o->n_samples);
        return DDP_ERR_INVALID_ARG;
    }
    if (!o->block && o->drop_last && o->n_samples < (size_t)o->world_size) {
        DDP_ERROR("ddp_sampler_create: drop_last with %zu samples on %d ranks leaves no sample per "
                  "rank: use drop_last = 0 or fewer ranks", o->n_samples, o->world_size);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

ddp_status ddp_sampler_create(const ddp_sampler_opts *opts, ddp_sampler **out)
{
    if (!out) {
        DDP_ERROR("ddp_sampler_create: out is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    *out = NULL;
    if (!opts) {
        DDP_ERROR("ddp_sampler_create: opts is NULL");
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = sampler_check(opts);
    if (st != DDP_OK)
        return st;
    ddp_sampler *s = calloc(1, sizeof *s);
    size_t *perm = opts->n_samples <= SIZE_MAX / sizeof *perm
                       ? malloc(opts->n_samples * sizeof *perm)
                       : NULL;
    if (!s || !perm) {
        DDP_ERROR("ddp_sampler_create: out of memory for %zu samples", opts->n_samples);
        free(s);
        free(perm);
        return DDP_ERR_NOMEM;
    }
    size_t world = (size_t)opts->world_size;
    s->opts = *opts;
    s->perm = perm;
    s->per_rank = opts->drop_last ? opts->n_samples / world
                                  : opts->n_samples / world + (opts->n_samples % world != 0);
    if (opts->block) /* whole steps, of which this rank's blocks */
        s->per_rank = opts->n_samples / (opts->block * (size_t)opts->blocks_per_step) *
                      sampler_own_blocks(opts) * opts->block;
    *out = s;
    return DDP_OK;
}

void ddp_sampler_destroy(ddp_sampler *s)
{
    if (!s)
        return;
    free(s->perm);
    free(s);
}

size_t ddp_sampler_len(const ddp_sampler *s)
{
    return s ? s->per_rank : 0;
}

ddp_status ddp_sampler_indices(ddp_sampler *s, uint64_t epoch, size_t *out)
{
    if (!s || !out) {
        DDP_ERROR("ddp_sampler_indices: %s is NULL", s ? "out" : "sampler");
        return DDP_ERR_INVALID_ARG;
    }
    sampler_permute(s, epoch);
    size_t n = s->opts.n_samples, world = (size_t)s->opts.world_size;
    if (s->opts.block) {
        size_t b = s->opts.block, step = b * (size_t)s->opts.blocks_per_step, k = 0;
        for (size_t first = 0; k < s->per_rank; first += step)
            for (size_t v = (size_t)s->opts.rank; v < (size_t)s->opts.blocks_per_step; v += world)
                for (size_t i = 0; i < b; i++)
                    out[k++] = s->perm[first + v * b + i];
        return DDP_OK;
    }
    size_t pos = (size_t)s->opts.rank;
    for (size_t k = 0; k < s->per_rank; k++, pos += world)
        out[k] = s->perm[pos % n]; /* positions past n repeat the start (padding) */
    return DDP_OK;
}
