/* argnum.c - a flag's value read whole as a number or a word (see argnum.h). */
#include "argnum.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int argnum_long(const char *prog, const char *flag, const char *text, long min, long max,
                long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "%s: --%s: expected %s integer, got '%s' (allowed: %ld to %ld)\n", prog,
                flag, min > 0 ? "a positive" : "a non-negative", text, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int argnum_real(const char *prog, const char *flag, const char *text, double lo, double hi,
                const char *ends, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    int in = (ends[0] == '(' ? v > lo : v >= lo) && (ends[1] == ')' ? v < hi : v <= hi);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || !in) {
        fprintf(stderr, "%s: --%s: expected a number in %c%.10g, %.10g%c, got '%s'\n", prog, flag,
                ends[0], lo, hi, ends[1], text);
        return -1;
    }
    *out = v;
    return 0;
}

int argnum_word(const char *prog, const char *flag, const char *words, const char *text, int base,
                int *out)
{
    const char *w = words;
    for (int i = base;; i++, w += strcspn(w, "|") + 1) {
        size_t len = strcspn(w, "|");
        if (strncmp(w, text, len) == 0 && text[len] == '\0') {
            *out = i;
            return 0;
        }
        if (!w[len])
            break;
    }
    fprintf(stderr, "%s: --%s: expected ", prog, flag);
    for (w = words; *w; w++) {
        if (*w != '|')
            fputc(*w, stderr);
        else
            fputs(strchr(w + 1, '|') ? ", " : " or ", stderr);
    }
    fprintf(stderr, ", got '%s'\n", text);
    return -1;
}
