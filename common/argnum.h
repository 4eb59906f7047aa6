/* argnum.h - a command-line flag's value read whole as a number or a word, with the complaint a
 * user sees when it is not one ("PROG: --FLAG: expected ..., got 'TEXT'"): ddp-train's flag table
 * (train/train_opts.c) reads every value through these. */
#ifndef COMMON_ARGNUM_H
#define COMMON_ARGNUM_H

/* An integer in [min, max] into *out: 0; else -1 with "expected a positive (non-negative) integer,
 * got 'TEXT' (allowed: MIN to MAX)" printed to stderr. */
int argnum_long(const char *prog, const char *flag, const char *text, long min, long max,
                long *out);
/* A finite number in lo..hi, each end closed or open as ends says ("[]", "[)", "(]", "()"): 0;
 * else -1 with "expected a number in [LO, HI), got 'TEXT'" printed. */
int argnum_real(const char *prog, const char *flag, const char *text, double lo, double hi,
                const char *ends, double *out);
/* The index of text among words "a|b|c", plus base, into *out: 0; else -1 with "expected a, b or
 * c, got 'TEXT'" printed. */
int argnum_word(const char *prog, const char *flag, const char *words, const char *text, int base,
                int *out);

#endif
