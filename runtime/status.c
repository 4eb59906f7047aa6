/* status.c - status code names (from the X-macro table in ddp.h) and the library version. */
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
