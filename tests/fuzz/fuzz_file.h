/* fuzz_file.h - gives a fuzz input a file path (a memfd named through /proc/self/fd) for the
 * harnesses of file readers; nothing is left on disk. Used by one harness per program. */
#ifndef FUZZ_FILE_H
#define FUZZ_FILE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* A file that holds exactly data[0..n): its path is written to path[len]. Aborts (a harness
 * failure, not a finding) when the kernel refuses a memfd. */
static inline void fuzz_input_file(int *fd, const char *label, const void *data, size_t n, char *path,
                                   size_t len)
{
    if (*fd < 0)
        *fd = memfd_create(label, 0);
    if (*fd < 0 || ftruncate(*fd, 0) != 0 || (n && pwrite(*fd, data, n, 0) != (ssize_t)n))
        abort();
    snprintf(path, len, "/proc/self/fd/%d", *fd);
}

#endif /* FUZZ_FILE_H */
