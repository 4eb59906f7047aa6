/* out_path.c - the rule for files replaced by a temporary file and a rename (see out_path.h). */
#include "out_path.h"
#include "in_path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *out_path_kind(mode_t mode) { return in_path_kind(mode); }

int out_path_target(const char *path, char **target, char *why, size_t len)
{
    struct stat sb;
    size_t n = path ? strlen(path) : 0;
    *target = NULL;
    if (n == 0 || path[n - 1] == '/') {
        snprintf(why, len, " %s: name a file, such as model.bin", n ? "ends with '/'" : "is empty");
        return OUT_PATH_REFUSED;
    }
    int exists = lstat(path, &sb) == 0;
    if (!exists && errno != ENOENT) {
        snprintf(why, len, ": cannot be examined: %s", strerror(errno));
        return OUT_PATH_ERROR;
    }
    int link = exists && S_ISLNK(sb.st_mode);
    char *t = link ? realpath(path, NULL) : strdup(path);
    if (!t && link) {
        int e = errno;
        char to[4096] = "?";
        ssize_t got = readlink(path, to, sizeof to - 1);
        to[got > 0 ? got : 1] = '\0';
        snprintf(why, len, ": a symbolic link to %s, which %s: point the link at a file, remove it, or "
                 "name another path", to, e == ENOENT ? "does not exist (a dangling link)"
                 : e == ELOOP ? "loops" : strerror(e));
        return e == ENOENT || e == ELOOP ? OUT_PATH_REFUSED : OUT_PATH_ERROR;
    }
    if (!t) {
        snprintf(why, len, ": out of memory");
        return OUT_PATH_ERROR;
    }
    if (exists && stat(t, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(why, len, "%s%s is %s: the file is written beside it and renamed over a regular file, "
                 "so a folder, a device, a FIFO or a socket is never replaced; %s",
                 link ? ", a symbolic link to " : "", link ? t : "", out_path_kind(sb.st_mode),
                 S_ISDIR(sb.st_mode) ? "name a file, e.g. one in that folder"
                                     : "name a regular file or a new one");
        free(t);
        return OUT_PATH_REFUSED;
    }
    *target = t;
    return OUT_PATH_OK;
}

int out_path_probe_dir(const char *target, char *why, size_t len)
{
    const char *slash = strrchr(target, '/');
    int n = slash ? (slash == target ? 1 : (int)(slash - target)) : 1;
    size_t size = strlen(target) + 64;
    char *dir = malloc(size), *probe = malloc(size + 32);
    if (!dir || !probe) {
        free(dir);
        free(probe);
        snprintf(why, len, ": out of memory");
        return OUT_PATH_ERROR;
    }
    snprintf(dir, size, "%.*s", n, slash ? target : ".");
    snprintf(probe, size + 32, "%s/.ddp-write-test.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600), rc = OUT_PATH_OK;
    if (fd < 0) {
        snprintf(why, len, ": cannot write into the folder %s: %s; create it, make it writable, or "
                 "choose another path", dir, strerror(errno));
        rc = OUT_PATH_REFUSED;
    } else {
        close(fd);
        unlink(probe);
    }
    free(dir);
    free(probe);
    return rc;
}

int out_path_check(const char *path, char *why, size_t len)
{
    char *target = NULL;
    int rc = out_path_target(path, &target, why, len);
    if (rc == OUT_PATH_OK && out_path_probe_dir(target, why, len) != OUT_PATH_OK)
        rc = OUT_PATH_ERROR;
    free(target);
    return rc;
}

const char *out_path_advice(int err)
{
    switch (err) {
    case ENOSPC:
    case EDQUOT:
        return "free space there or raise the quota";
    case EROFS:
        return "the file system is mounted read-only: remount it read-write";
    case EACCES:
    case EPERM:
        return "this user may not write there: fix the folder's permissions or owner (or its "
               "immutable attribute, chattr -i)";
    case ENOENT:
    case EEXIST:
    case ENOTEMPTY:
    case ESTALE:
        return "a file or folder of the save vanished or appeared while it was written: the folder "
               "was removed, or another job writes into the same folder (give each job its own)";
    case EIO:
        return "the storage reported an I/O error: check the disk and the file system";
    default:
        return "check the folder";
    }
}
