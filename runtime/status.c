/* status.c - status code names (from the X-macro table in ddp.h) and the library version. */
#include <ctype.h>
#include <errno.h>
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

/* DDP_TIMEOUT: a whole-string decimal number of seconds in [DDP_TIMEOUT_MIN_S, DDP_TIMEOUT_MAX_S].
 * The bounds: a deadline under 0.1 s would end healthy jobs at their first collective (the
 * watchdog looks every quarter of it); one over a week is no deadline, which DDP_WATCHDOG=0 says. */
#define DDP_TIMEOUT_DEFAULT_S 300.0
#define DDP_TIMEOUT_MIN_S 0.1
#define DDP_TIMEOUT_MAX_S 604800.0

/* 1 with *out set when text is a valid DDP_TIMEOUT ("inf", "nan", "20s", "0" are not). */
static int timeout_parse(const char *text, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(x) || x < DDP_TIMEOUT_MIN_S ||
        x > DDP_TIMEOUT_MAX_S || !(isdigit((unsigned char)text[0]) || text[0] == '.'))
        return 0;
    *out = x;
    return 1;
}

double timeout_seconds(void)
{
    static double cached = -1;
    if (cached > 0)
        return cached;
    const char *v = getenv("DDP_TIMEOUT");
    double t = DDP_TIMEOUT_DEFAULT_S;
    if (v && *v && !timeout_parse(v, &t))
        t = DDP_TIMEOUT_DEFAULT_S; /* timeout_check reports it; start-up keeps a deadline */
    cached = t;
    return t;
}

ddp_status timeout_check(void)
{
    const char *v = getenv("DDP_TIMEOUT");
    double t;
    if (!v || !*v || timeout_parse(v, &t))
        return DDP_OK;
    DDP_ERROR("DDP_TIMEOUT='%s' is not a number of seconds from %g to %g (the deadline of every "
              "collective and wait; unset: %g): set it to a number such as 600, or unset it", v,
              DDP_TIMEOUT_MIN_S, DDP_TIMEOUT_MAX_S, DDP_TIMEOUT_DEFAULT_S);
    return DDP_ERR_ENV;
}
