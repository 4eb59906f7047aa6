/* malloc_policy.c - see malloc_policy.h. */
#include <malloc.h>
#include <stdlib.h>

#include "malloc_policy.h"

#define MALLOC_MMAP_THRESHOLD (256 << 20)
#define MALLOC_TRIM_THRESHOLD (1 << 30)

static const char *malloc_text = "glibc malloc thresholds: defaults";

void malloc_policy(void)
{
    int mmap_set = getenv("MALLOC_MMAP_THRESHOLD_") != NULL;
    int trim_set = getenv("MALLOC_TRIM_THRESHOLD_") != NULL;
    int ok = 1;
    if (!mmap_set)
        ok &= mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1;
    if (!trim_set)
        ok &= mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) == 1;
    if (!ok)
        malloc_text = "glibc malloc thresholds: mallopt refused, defaults kept";
    else if (mmap_set || trim_set)
        malloc_text = "glibc malloc thresholds: from the environment (MALLOC_*_THRESHOLD_), the rest 256 MiB mmap / 1 GiB trim";
    else
        malloc_text = "glibc malloc thresholds: mmap 256 MiB, trim 1 GiB";
}

const char *malloc_describe(void)
{
    return malloc_text;
}
