/* path_join.h - "DIR/NAME" in a new string (free() it); NULL when out of memory. Header-only, for
 * libddp (checkpoint folders) and the readers (token shard folders) alike. */
#ifndef COMMON_PATH_JOIN_H
#define COMMON_PATH_JOIN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

#endif /* COMMON_PATH_JOIN_H */
