/* suggest.c - the nearest long option to a mistyped one (see suggest.h). */
#include "suggest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Levenshtein distance of a[0..na) and b[0..nb), '_' and '-' equal; capped at 64-letter names. */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    size_t row[65];
    if (na > 64 || nb > 64)
        return (size_t)-1;
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            char ca = a[i - 1] == '_' ? '-' : a[i - 1], cb = b[j - 1] == '_' ? '-' : b[j - 1];
            size_t best = diag + (ca != cb);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = row[j];
            row[j] = best;
        }
    }
    return row[nb];
}

const char *suggest_option(const struct option *longs, const char *arg)
{
    while (*arg == '-')
        arg++;
    size_t n = strcspn(arg, "=");
    if (n == 0)
        return NULL;
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (const struct option *o = longs; o->name; o++) {
        size_t len = strlen(o->name), d = edit_distance(arg, n, o->name, len);
        size_t limit = len <= 4 ? 1 : len / 3 > 2 ? len / 3 : 2;
        if (d <= limit && d < best_d) {
            best = o->name;
            best_d = d;
        }
    }
    return best;
}

int suggest_first_rank(void)
{
    static const char *vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return strcmp(v, "0") == 0;
    }
    return 1;
}

void suggest_usage_error(const char *prog, const struct option *longs, bool unknown,
                         const char *what, const char *arg, const char *tail)
{
    if (!suggest_first_rank())
        return;
    const char *near = unknown ? suggest_option(longs, arg) : NULL;
    fprintf(stderr, "%s: %s '%s'", prog, what, arg);
    if (near)
        fprintf(stderr, "; did you mean --%s?", near);
    fputs(tail, stderr);
}
