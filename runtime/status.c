/* status.c - status code names (from the X-macro table in ddp.h) and the library version. */
#include <math.h>
#include <stdlib.h>

#include "config.h"
#include "internal.h"

const char *ddp_strerror(ddp_status s)
{
    switch (s) {
#define DDP_STATUS_CASE_(name, text) \
    case name:                       \
        return text;
        DDP_STATUS_LIST(DDP_STATUS_CASE_)
#undef DDP_STATUS_CASE_
    }
    return "unknown status";
}

const char *ddp_version(void)
{
    return DDP_VERSION;
}

int ddp_version_number(void)
{
    return DDP_VERSION_NUMBER;
}

double ddp_timeout_seconds(void)
{
    static double cached = -1;
    if (cached > 0)
        return cached;
    const char *v = getenv("DDP_TIMEOUT");
    double t = 300;
    if (v && *v) {
        char *end;
        double x = strtod(v, &end);
        if (*end == '\0' && isfinite(x) && x > 0)
            t = x;
        else
            DDP_WARN("DDP_TIMEOUT='%s' is not a positive number of seconds; using %.0f", v, t);
    }
    cached = t;
    return t;
}
