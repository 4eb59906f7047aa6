/* in_path.c - opening a file to read, refusing at once what is not a regular file (in_path.h). */
#include "in_path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *in_path_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a folder"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISFIFO(mode) ? "a FIFO (named pipe)"
           : S_ISSOCK(mode) ? "a socket"
                            : "not a regular file";
}

/* WHY for a PATH of this mode; errno EINVAL; -1. */
static int refuse(mode_t mode, char *why, size_t len)
{
    snprintf(why, len, " is %s, not a regular file: reading it could wait forever or never end, so "
             "it is refused; put the regular file back in its place, or name another path",
             in_path_kind(mode));
    errno = EINVAL;
    return -1;
}

int in_path_open(const char *path, struct stat *out, char *why, size_t len)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) /* a device is not even opened */
        return refuse(sb.st_mode, why, len);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO put there since: no wait */
    if (fd < 0) {
        int err = errno;
        snprintf(why, len, ": %s", strerror(err));
        errno = err;
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (fstat(fd, &sb) != 0 || flags < 0 || (S_ISREG(sb.st_mode) &&
                                              fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)) {
        int err = errno;
        snprintf(why, len, ": cannot be examined: %s", strerror(err));
        close(fd);
        errno = err;
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return refuse(sb.st_mode, why, len);
    }
    if (out)
        *out = sb;
    return fd;
}
