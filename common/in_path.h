/* in_path.h - the one rule for a file that ddp reads whole or by ranges (checkpoint files, a
 * checkpoint folder's MANIFEST and shard files, --init-from and llm.c model files): it must be a
 * regular file, and finding out never blocks. Opening a FIFO for reading waits for a writer, and
 * reading a FIFO, socket or device may never end, so each is refused before anything is read.
 */
#ifndef COMMON_IN_PATH_H
#define COMMON_IN_PATH_H

#include <stddef.h>
#include <sys/stat.h>

/* Opens PATH read-only (O_CLOEXEC) without waiting: a PATH that is not a regular file is refused
 * before it is opened (a device is never opened); the open is non-blocking (a FIFO put there in
 * the meantime opens at once), fstat then refuses anything but a regular file (its result goes
 * to *SB unless SB is NULL), and the descriptor is put back in blocking mode. Returns the descriptor, or
 * -1 with errno set (EINVAL for a file that is not regular, else open's) and WHY (LEN bytes)
 * saying what PATH is and how to fix it, written to follow the path (" is a FIFO (named pipe),
 * not a regular file: ...", ": No such file or directory"): print "%s%s", path, why. */
int in_path_open(const char *path, struct stat *sb, char *why, size_t len);

/* What a file that is not regular is, in words: "a folder", "a character device", "a FIFO (named
 * pipe)", ... */
const char *in_path_kind(mode_t mode);

#endif /* COMMON_IN_PATH_H */
