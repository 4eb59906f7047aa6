/* check.h - minimal assertions for the test programs: a failed CHECK prints file:line and the
 * condition, counts the failure, and the test exits 1 at the end (CHECK_DONE). Exit 77 = skipped. */
#ifndef DDP_TEST_CHECK_H
#define DDP_TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_failures_;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            check_failures_++;                                                  \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* |a - b| <= atol + rtol * |b|, b being the reference. */
#define CHECK_CLOSE(a, b, atol, rtol, what)                                     \
    CHECK(fabs((double)(a) - (double)(b)) <= (atol) + (rtol) * fabs((double)(b)), \
          "%s: got %.9g, want %.9g", (what), (double)(a), (double)(b))

#define CHECK_DONE() (check_failures_ ? (fprintf(stderr, "%d check(s) failed\n", check_failures_), 1) : 0)

#define DDP_TEST_SKIP 77

#endif /* DDP_TEST_CHECK_H */
