/* buckets.c - gradient bucket planning: contiguous slices of the flat gradient buffer, filled in
 * reverse parameter order (the order backward produces gradients), capped in bytes.
 */
#include <stdlib.h>

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
