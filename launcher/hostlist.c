/* hostlist.c - expansion of Slurm hostlists ("gpu-a[007-009,11],b3") into host names, following
 * the rules of Slurm's own parser as `scontrol show hostnames` applies them. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher.h"

#define MAX_RANGE_HOSTS 65536UL  /* Slurm refuses larger ranges */
#define MAX_HOSTS (1UL << 20)

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int push_name(struct launch_hostlist *hl, const char *name, char *err, size_t errlen)
{
    if (hl->n >= MAX_HOSTS) {
        set_err(err, errlen, "hostlist: more than %lu hosts", MAX_HOSTS);
        return -1;
    }
    if ((hl->n & (hl->n + 1)) == 0 || hl->n == 0) {
        char **grown = realloc(hl->names, (2 * hl->n + 2) * sizeof *grown);
        if (!grown) {
            set_err(err, errlen, "hostlist: out of memory");
            return -1;
        }
        hl->names = grown;
    }
    hl->names[hl->n] = strdup(name);
    if (!hl->names[hl->n]) {
        set_err(err, errlen, "hostlist: out of memory");
        return -1;
    }
    hl->n++;
    return 0;
}

/* Parses one "lo" or "lo-hi" of a bracket group (digits only, lo <= hi). */
static int parse_range(const char *s, size_t len, unsigned long *lo, unsigned long *hi, int *width)
{
    size_t dash = 0;
    while (dash < len && s[dash] != '-')
        dash++;
    if (dash == 0 || dash + 1 == len)
        return -1;
    for (size_t i = 0; i < len; i++)
        if (i != dash && !isdigit((unsigned char)s[i]))
            return -1;
    *lo = strtoul(s, NULL, 10);
    *hi = dash < len ? strtoul(s + dash + 1, NULL, 10) : *lo;
    *width = (int)dash;
    return *lo <= *hi && *hi - *lo < MAX_RANGE_HOSTS && dash < 10 ? 0 : -1;
}

static int expand_from(struct launch_hostlist *hl, char *buf, size_t blen, const char *rest,
                       const char *token, char *err, size_t errlen);

/* Expands the bracket group starting after '[' at GROUP, then the rest of the token. */
static int expand_group(struct launch_hostlist *hl, char *buf, size_t blen, const char *group,
                        const char *token, char *err, size_t errlen)
{
    const char *close = strchr(group, ']');
    const char *p = group, *end;
    do {
        const char *comma = memchr(p, ',', (size_t)(close - p));
        end = comma ? comma : close;
        unsigned long lo, hi;
        int width;
        if (parse_range(p, (size_t)(end - p), &lo, &hi, &width) != 0) {
            set_err(err, errlen, "hostlist: bad range '%.*s' in '%s'", (int)(end - p), p, token);
            return -1;
        }
        for (unsigned long v = lo; v <= hi; v++) {
            int w = snprintf(buf + blen, LAUNCH_HOST_LEN - blen, "%0*lu", width, v);
            if (w < 0 || blen + (size_t)w >= LAUNCH_HOST_LEN) {
                set_err(err, errlen, "hostlist: host name too long in '%s'", token);
                return -1;
            }
            if (expand_from(hl, buf, blen + (size_t)w, close + 1, token, err, errlen) != 0)
                return -1;
        }
        p = end + 1;
    } while (end < close);
    return 0;
}

/* Appends the literal text of REST up to the next '[' to buf[0..blen) and expands from there. */
static int expand_from(struct launch_hostlist *hl, char *buf, size_t blen, const char *rest,
                       const char *token, char *err, size_t errlen)
{
    const char *open = strchr(rest, '[');
    size_t lit = open ? (size_t)(open - rest) : strlen(rest);
    if (blen + lit >= LAUNCH_HOST_LEN) {
        set_err(err, errlen, "hostlist: host name too long in '%s'", token);
        return -1;
    }
    memcpy(buf + blen, rest, lit);
    buf[blen + lit] = '\0';
    if (!open)
        return push_name(hl, buf, err, errlen);
    return expand_group(hl, buf, blen + lit, open + 1, token, err, errlen);
}

/* Checks the bracket structure of one token: groups close, do not nest, and nothing follows the
 * last group (Slurm rejects "n[1-2]-ib"). A token without '[' is a plain name. */
static int check_token(const char *token, char *err, size_t errlen)
{
    int depth = 0;
    const char *last_close = NULL;
    if (!strchr(token, '['))
        return 0;
    for (const char *p = token; *p; p++) {
        if (*p == '[' || *p == ']') {
            int opening = *p == '[';
            if (opening == (depth == 1)) {
                set_err(err, errlen, "hostlist: unbalanced brackets in '%s'", token);
                return -1;
            }
            depth = opening;
            last_close = opening ? last_close : p;
        } else if (isspace((unsigned char)*p)) {
            set_err(err, errlen, "hostlist: white space in '%s'", token);
            return -1;
        }
    }
    if (depth != 0 || last_close[1] != '\0') {
        set_err(err, errlen, "hostlist: '%s' %s", token,
                depth ? "has an unclosed '['" : "has text after its last ']' (Slurm forbids a suffix)");
        return -1;
    }
    return 0;
}

static int expand_token(struct launch_hostlist *hl, const char *token, char *err, size_t errlen)
{
    char buf[LAUNCH_HOST_LEN];
    if (check_token(token, err, errlen) != 0)
        return -1;
    return expand_from(hl, buf, 0, token, token, err, errlen);
}

int launch_hostlist_expand(const char *list, struct launch_hostlist *out, char *err, size_t errlen)
{
    char *copy = strdup(list ? list : "");
    int rc = copy ? 0 : -1;
    char *start = copy;
    int depth = 0;
    out->n = 0;
    out->names = NULL;
    if (rc != 0)
        set_err(err, errlen, "hostlist: out of memory");
    for (char *p = copy; rc == 0; p++) {
        depth += (*p == '[') - (*p == ']');
        if ((*p == ',' && depth <= 0) || *p == '\0') {
            int at_end = *p == '\0';
            *p = '\0';
            if (*start)
                rc = expand_token(out, start, err, errlen);
            start = p + 1;
            if (at_end)
                break;
        }
    }
    free(copy);
    if (rc != 0)
        launch_hostlist_free(out);
    return rc;
}

void launch_hostlist_free(struct launch_hostlist *hl)
{
    if (!hl)
        return;
    for (size_t i = 0; i < hl->n; i++)
        free(hl->names[i]);
    free(hl->names);
    hl->names = NULL;
    hl->n = 0;
}
