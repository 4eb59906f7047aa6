/* test_buckets.c - gradient bucket planning: a worked example, then the documented invariants
 * (reverse order, contiguous cover, caps, closing rule, oversized parameters) on random plans.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "internal.h" /* ddp_plan_buckets */

#define MAX_PARAMS 64

/* Checks every documented property of a plan (failures are counted by CHECK). */
static void check_plan(const size_t *numel, int n_params, size_t cap, size_t first_cap,
                       const ddp_bucket *b, int nb)
{
    size_t offset[MAX_PARAMS + 1] = {0};
    for (int i = 0; i < n_params; i++)
        offset[i + 1] = offset[i] + numel[i];
    unsigned char covered[4096] = {0};
    CHECK(nb >= 1 && nb <= n_params, "%d buckets for %d parameters", nb, n_params);
    for (int k = 0; k < nb; k++) {
        size_t cap_k = k == 0 ? first_cap : cap;
        int next_hi = k == 0 ? n_params - 1 : b[k - 1].first_param - 1;
        CHECK(b[k].last_param == next_hi, "bucket %d ends at %d, want %d (reverse order)", k,
              b[k].last_param, next_hi);
        CHECK(b[k].first_param <= b[k].last_param && b[k].first_param >= 0, "bucket %d: %d..%d",
              k, b[k].first_param, b[k].last_param);
        if (b[k].first_param < 0 || b[k].last_param >= n_params || b[k].first_param > b[k].last_param)
            return;
        CHECK(b[k].offset == offset[b[k].first_param], "bucket %d offset %zu, want %zu", k,
              b[k].offset, offset[b[k].first_param]);
        CHECK(b[k].n == offset[b[k].last_param + 1] - offset[b[k].first_param],
              "bucket %d holds %zu elements", k, b[k].n);
        size_t bytes = b[k].n * sizeof(float);
        CHECK(bytes <= cap_k || b[k].first_param == b[k].last_param,
              "bucket %d: %zu bytes over its cap %zu with several parameters", k, bytes, cap_k);
        if (b[k].first_param > 0) /* closed only because the next parameter did not fit */
            CHECK(bytes + numel[b[k].first_param - 1] * sizeof(float) > cap_k,
                  "bucket %d closed early (%zu bytes, next %zu, cap %zu)", k, bytes,
                  numel[b[k].first_param - 1] * sizeof(float), cap_k);
        for (size_t e = b[k].offset; e < b[k].offset + b[k].n && e < sizeof covered; e++)
            covered[e]++;
    }
    CHECK(b[nb - 1].first_param == 0, "last bucket starts at %d, not 0", b[nb - 1].first_param);
    for (size_t e = 0; e < offset[n_params] && e < sizeof covered; e++)
        CHECK(covered[e] == 1, "gradient element %zu lies in %d buckets", e, covered[e]);
}

/* numel {5,5,10,40,3,4}, first cap 8 floats, cap 20 floats:
 * bucket 0 = params 4..5 (7), bucket 1 = param 3 alone (40 > cap), bucket 2 = params 0..2 (20,
 * exactly the cap). */
static void test_example(void)
{
    const size_t numel[] = {5, 5, 10, 40, 3, 4};
    const ddp_bucket want[] = {{4, 5, 60, 7}, {3, 3, 20, 40}, {0, 2, 0, 20}};
    ddp_bucket b[6];
    int nb = -1;
    CHECK(ddp_plan_buckets(numel, 6, 20 * sizeof(float), 8 * sizeof(float), b, &nb) == DDP_OK,
          "plan failed");
    CHECK(nb == 3, "%d buckets, want 3", nb);
    for (int k = 0; k < 3 && nb == 3; k++)
        CHECK(b[k].first_param == want[k].first_param && b[k].last_param == want[k].last_param &&
                  b[k].offset == want[k].offset && b[k].n == want[k].n,
              "bucket %d = {%d..%d, off %zu, n %zu}", k, b[k].first_param, b[k].last_param,
              b[k].offset, b[k].n);
    check_plan(numel, 6, 20 * sizeof(float), 8 * sizeof(float), b, nb);
}

static void test_one_bucket_and_singletons(void)
{
    const size_t numel[] = {3, 1, 4, 1, 5};
    ddp_bucket b[5];
    int nb = 0;
    CHECK(ddp_plan_buckets(numel, 5, 1 << 20, 1 << 20, b, &nb) == DDP_OK && nb == 1,
          "a large cap must give one bucket, got %d", nb);
    check_plan(numel, 5, 1 << 20, 1 << 20, b, nb);
    CHECK(ddp_plan_buckets(numel, 5, 1, 1, b, &nb) == DDP_OK && nb == 5,
          "a 1-byte cap must give one bucket per parameter, got %d", nb);
    check_plan(numel, 5, 1, 1, b, nb);
}

static void test_random(void)
{
    srand(12345);
    for (int trial = 0; trial < 2000; trial++) {
        int n_params = 1 + rand() % MAX_PARAMS;
        size_t numel[MAX_PARAMS];
        for (int i = 0; i < n_params; i++)
            numel[i] = 1 + (size_t)(rand() % (rand() % 4 ? 20 : 60));
        size_t cap = (size_t)(1 + rand() % 200), first_cap = (size_t)(1 + rand() % 200);
        ddp_bucket b[MAX_PARAMS];
        int nb = 0;
        ddp_status st = ddp_plan_buckets(numel, n_params, cap, first_cap, b, &nb);
        CHECK(st == DDP_OK, "trial %d: %s", trial, ddp_strerror(st));
        if (st == DDP_OK)
            check_plan(numel, n_params, cap, first_cap, b, nb);
    }
}

static void test_invalid(void)
{
    const size_t numel[] = {4, 0, 4};
    ddp_bucket b[3];
    int nb = 7;
    CHECK(ddp_plan_buckets(numel, 1, 0, 64, b, &nb) == DDP_ERR_INVALID_ARG, "cap 0 accepted");
    CHECK(ddp_plan_buckets(numel, 1, 64, 0, b, &nb) == DDP_ERR_INVALID_ARG, "first cap 0 accepted");
    CHECK(ddp_plan_buckets(numel, 0, 64, 64, b, &nb) == DDP_ERR_INVALID_ARG, "0 params accepted");
    CHECK(ddp_plan_buckets(numel, 3, 64, 64, b, &nb) == DDP_ERR_INVALID_ARG,
          "zero-sized parameter accepted");
    CHECK(ddp_plan_buckets(NULL, 1, 64, 64, b, &nb) == DDP_ERR_INVALID_ARG, "NULL numel accepted");
    CHECK(ddp_plan_buckets(numel, 1, 64, 64, NULL, &nb) == DDP_ERR_INVALID_ARG,
          "NULL buckets accepted");
    CHECK(nb == 7, "n_buckets written on failure");
}

int main(void)
{
    test_example();
    test_one_bucket_and_singletons();
    test_random();
    test_invalid();
    return CHECK_DONE();
}
