/* capture.h - stderr captured around a call in the test programs, to check what libddp logs
 * (that a refusal names the call and says why). */
#ifndef TEST_CAPTURE_H
#define TEST_CAPTURE_H

#include <stdio.h>
#include <unistd.h>

typedef struct capture {
    int saved;  /* the real stderr, -1 when it was not redirected */
    FILE *file; /* where stderr goes meanwhile, NULL when no temporary file could be made */
} capture;

/* From here on stderr goes to a temporary file (it stays where it was when none can be made). */
static inline void capture_begin(capture *c)
{
    fflush(stderr);
    c->file = tmpfile();
    c->saved = c->file ? dup(2) : -1;
    if (c->saved >= 0)
        dup2(fileno(c->file), 2);
}

/* stderr back where it was; text (size >= 1 bytes) gets what was written meanwhile, truncated
 * and NUL-terminated ("" when nothing could be captured). */
static inline void capture_end(capture *c, char *text, size_t size)
{
    fflush(stderr);
    text[0] = '\0';
    if (c->saved >= 0) {
        dup2(c->saved, 2);
        close(c->saved);
    }
    if (!c->file)
        return;
    rewind(c->file);
    text[fread(text, 1, size - 1, c->file)] = '\0';
    fclose(c->file);
}

#endif /* TEST_CAPTURE_H */
