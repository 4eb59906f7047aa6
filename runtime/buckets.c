/* buckets.c - gradient bucket planning: ddp_plan_buckets' contiguous slices of the flat gradient
 * buffer in reverse parameter order (the order a sequential model's backward produces gradients),
 * and the reducer's plans in any ready order, whose buckets are runs of the buffer. Capped in
 * bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static ddp_status plan_check(const size_t *numel, int n_params, size_t cap_bytes,
                             size_t first_cap_bytes, const ddp_bucket *buckets,
                             const int *n_buckets)
{
    if (!numel || !buckets || !n_buckets || n_params < 1) {
        DDP_ERROR("ddp_plan_buckets: need numel, buckets, n_buckets and n_params >= 1 "
                  "(got n_params %d)", n_params);
        return DDP_ERR_INVALID_ARG;
    }
    if (cap_bytes == 0 || first_cap_bytes == 0) {
        DDP_ERROR("ddp_plan_buckets: bucket caps must be positive (cap %zu bytes, first cap %zu "
                  "bytes)", cap_bytes, first_cap_bytes);
        return DDP_ERR_INVALID_ARG;
    }
    size_t total = 0;
    for (int i = 0; i < n_params; i++) {
        if (numel[i] == 0 || numel[i] > SIZE_MAX / sizeof(float) - total) {
            DDP_ERROR("ddp_plan_buckets: parameter %d has %zu elements: sizes must be non-zero and "
                      "the buffer must fit in memory", i, numel[i]);
            return DDP_ERR_INVALID_ARG;
        }
        total += numel[i];
    }
    return DDP_OK;
}

ddp_status ddp_plan_buckets(const size_t *numel, int n_params, size_t cap_bytes,
                            size_t first_cap_bytes, ddp_bucket *buckets, int *n_buckets)
{
    ddp_status st = plan_check(numel, n_params, cap_bytes, first_cap_bytes, buckets, n_buckets);
    if (st != DDP_OK)
        return st;
    size_t end = 0; /* element offset just past the last parameter */
    for (int i = 0; i < n_params; i++)
        end += numel[i];

    int nb = 0;
    int p = n_params - 1;
    while (p >= 0) {
        size_t cap = nb == 0 ? first_cap_bytes : cap_bytes;
        ddp_bucket b = {.first_param = p, .last_param = p, .offset = end - numel[p], .n = numel[p]};
        p--; /* the first parameter always goes in, even when larger than the cap */
        while (p >= 0 && (b.n + numel[p]) * sizeof(float) <= cap) {
            b.n += numel[p];
            b.offset -= numel[p];
            b.first_param = p--;
        }
        end = b.offset;
        buckets[nb++] = b;
    }
    *n_buckets = nb;
    return DDP_OK;
}

/* ---- the reducer's plans: buckets in any ready order, made of runs ------------------------- */

void bucket_plan_free(bucket_plan *plan)
{
    free(plan->buckets);
    free(plan->param_start);
    free(plan->params);
    free(plan->run_start);
    free(plan->run_off);
    free(plan->run_len);
    free(plan->wire_off);
    free(plan->param_bucket);
    *plan = (bucket_plan){0};
}

static ddp_status plan_alloc(bucket_plan *plan, int n_params)
{
    size_t n = (size_t)n_params;
    plan->buckets = calloc(n, sizeof *plan->buckets);
    plan->param_start = calloc(n + 1, sizeof *plan->param_start);
    plan->params = calloc(n, sizeof *plan->params);
    plan->run_start = calloc(n + 1, sizeof *plan->run_start);
    plan->run_off = calloc(n, sizeof *plan->run_off);
    plan->run_len = calloc(n, sizeof *plan->run_len);
    plan->wire_off = calloc(n, sizeof *plan->wire_off);
    plan->param_bucket = calloc(n, sizeof *plan->param_bucket);
    if (!plan->buckets || !plan->param_start || !plan->params || !plan->run_start ||
        !plan->run_off || !plan->run_len || !plan->wire_off || !plan->param_bucket) {
        DDP_ERROR("reducer: out of memory for a bucket plan of %d parameters", n_params);
        bucket_plan_free(plan);
        return DDP_ERR_NOMEM;
    }
    return DDP_OK;
}

/* Fills plan->params with `order` (or reverse order) and checks that it is a permutation,
 * using param_bucket as the seen-flags. */
static ddp_status plan_order(bucket_plan *plan, int n_params, const int *order)
{
    for (int i = 0; i < n_params; i++) {
        int p = order ? order[i] : n_params - 1 - i;
        if (p < 0 || p >= n_params || plan->param_bucket[p]) {
            DDP_ERROR("reducer: the ready order is not a permutation of the %d parameters "
                      "(parameter %d at position %d)", n_params, p, i);
            return DDP_ERR_INVALID_ARG;
        }
        plan->param_bucket[p] = 1;
        plan->params[i] = p;
    }
    return DDP_OK;
}

/* Groups plan->params greedily: a bucket takes the next parameter while its elements stay within
 * its cap (4 bytes each; the first parameter always goes in). */
static void plan_group(bucket_plan *plan, const size_t *numel, int n_params, size_t cap_bytes,
                       size_t first_cap_bytes)
{
    int nb = 0, i = 0;
    while (i < n_params) {
        size_t cap = nb == 0 ? first_cap_bytes : cap_bytes, n = numel[plan->params[i]];
        plan->param_start[nb] = i++;
        while (i < n_params && (n + numel[plan->params[i]]) * sizeof(float) <= cap)
            n += numel[plan->params[i++]];
        nb++;
    }
    plan->param_start[nb] = n_params;
    plan->n_buckets = nb;
}

static int plan_cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Bucket b's runs (its parameters sorted, neighbours merged) and its public view; `sorted` has
 * room for its parameters, `start` holds every parameter's element offset. */
static void plan_runs(bucket_plan *plan, int b, const size_t *numel, const size_t *start,
                      int *sorted, int *n_runs)
{
    int first = plan->param_start[b], count = plan->param_start[b + 1] - first;
    memcpy(sorted, plan->params + first, (size_t)count * sizeof *sorted);
    qsort(sorted, (size_t)count, sizeof *sorted, plan_cmp_int);
    plan->run_start[b] = *n_runs;
    size_t n = 0;
    for (int k = 0; k < count; k++) {
        int p = sorted[k];
        plan->param_bucket[p] = b;
        n += numel[p];
        if (k > 0 && sorted[k - 1] == p - 1) {
            plan->run_len[*n_runs - 1] += numel[p];
            continue;
        }
        plan->run_off[*n_runs] = start[p];
        plan->run_len[(*n_runs)++] = numel[p];
    }
    plan->run_start[b + 1] = *n_runs;
    plan->buckets[b] = (ddp_bucket){.first_param = sorted[0], .last_param = sorted[count - 1],
                                    .offset = start[sorted[0]], .n = n};
}

/* Runs, public views and wire offsets of every bucket. */
static ddp_status plan_layout(bucket_plan *plan, const size_t *numel, int n_params)
{
    size_t *start = malloc((size_t)n_params * sizeof *start);
    int *sorted = malloc((size_t)n_params * sizeof *sorted);
    if (!start || !sorted) {
        free(start);
        free(sorted);
        DDP_ERROR("reducer: out of memory for a bucket plan of %d parameters", n_params);
        return DDP_ERR_NOMEM;
    }
    size_t off = 0, wire = 0;
    for (int p = 0; p < n_params; p++) {
        start[p] = off;
        off += numel[p];
    }
    int n_runs = 0;
    for (int b = 0; b < plan->n_buckets; b++) {
        plan_runs(plan, b, numel, start, sorted, &n_runs);
        plan->wire_off[b] = wire;
        wire += plan->buckets[b].n;
    }
    free(start);
    free(sorted);
    return DDP_OK;
}

ddp_status bucket_plan_build(const size_t *numel, int n_params, const int *order,
                             size_t cap_bytes, size_t first_cap_bytes, bucket_plan *plan)
{
    *plan = (bucket_plan){0};
    ddp_bucket unused = {0}; /* plan_check wants somewhere for ddp_plan_buckets' outputs */
    int unused_n = 0;
    ddp_status st = plan_check(numel, n_params, cap_bytes, first_cap_bytes, &unused, &unused_n);
    if (st == DDP_OK)
        st = plan_alloc(plan, n_params);
    if (st == DDP_OK)
        st = plan_order(plan, n_params, order);
    if (st == DDP_OK) {
        plan_group(plan, numel, n_params, cap_bytes, first_cap_bytes);
        st = plan_layout(plan, numel, n_params);
    }
    if (st != DDP_OK)
        bucket_plan_free(plan);
    return st;
}

int bucket_plan_same(const bucket_plan *a, const bucket_plan *b)
{
    if (a->n_buckets != b->n_buckets)
        return 0;
    for (int k = 0; k < a->n_buckets; k++) {
        int ra = a->run_start[k], rb = b->run_start[k], n = a->run_start[k + 1] - ra;
        if (n != b->run_start[k + 1] - rb)
            return 0;
        for (int i = 0; i < n; i++)
            if (a->run_off[ra + i] != b->run_off[rb + i] ||
                a->run_len[ra + i] != b->run_len[rb + i])
                return 0;
    }
    return 1;
}

/* ---- ZeRO shards ----------------------------------------------------------------------------- */

ddp_status ddp_shard_range(size_t total, int world_size, int rank, size_t *offset, size_t *n)
{
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        DDP_ERROR("ddp_shard_range: rank %d of world size %d: need world_size >= 1 and "
                  "0 <= rank < world_size", rank, world_size);
        return DDP_ERR_INVALID_ARG;
    }
    size_t w = (size_t)world_size, per = total / w + (total % w != 0);
    per = (per + DDP_SHARD_ALIGN - 1) / DDP_SHARD_ALIGN * DDP_SHARD_ALIGN;
    size_t lo = per * (size_t)rank;
    if (lo > total)
        lo = total;
    size_t hi = total - lo < per ? total : lo + per;
    if (offset)
        *offset = lo;
    if (n)
        *n = hi - lo;
    return DDP_OK;
}
