/* jsonl.h - a JSON-lines file (ddp-train's --metrics) that a run killed at any moment leaves
 * whole: each line is formatted whole and written with one write(2) (a kill inside the write
 * itself aside, which the next jsonl_open with append repairs). */
#ifndef COMMON_JSONL_H
#define COMMON_JSONL_H

#include <stddef.h>

typedef struct jsonl_file jsonl_file;

/* Opens path for lines; `what` names it in messages (e.g. "--metrics"). Its folder is created when
 * missing (mkdir -p); a new file (truncated), or with append the lines go after the file's: a
 * last line without its newline (a run killed while writing it) is cut back to the line before,
 * with a note in the log, so every line stays valid JSON. A FIFO without a reader fails (ENXIO)
 * instead of blocking. NULL on failure, logged naming the path and the reason. what must outlive
 * the file. */
jsonl_file *jsonl_open(const char *path, int append, const char *what);
/* Writes one line: fmt and its arguments, which end with "\n". A failed write is warned about
 * once (the lines after it may be missing). */
void jsonl_line(jsonl_file *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Closes the file; NULL is ignored. */
void jsonl_close(jsonl_file *m);
/* The file's descriptor, for a writer of whole lines of its own (one write(2) each, e.g. libddp's
 * straggler table); -1 for NULL. */
int jsonl_fd(const jsonl_file *m);

/* v as a JSON number printed with fmt (e.g. "%.6f") into buf (n bytes), or "null" when it is NaN
 * or infinite (a diverged loss): JSON has neither, and printf's "nan" would make the line
 * unreadable. Returns buf or the literal "null". */
const char *jsonl_num(char *buf, size_t n, const char *fmt, double v);

#endif /* COMMON_JSONL_H */
