/* mkdir_p.h - `mkdir -p` for the launcher (--log-dir) and ddp-train (--checkpoint-dir, --save). */
#ifndef COMMON_MKDIR_P_H
#define COMMON_MKDIR_P_H

/* Creates dir and its missing parents (mode 0777 before the umask). An existing folder, also one
 * that another rank created at the same moment, is success. Returns 0, or -1 with errno set
 * (ENAMETOOLONG for a path over PATH_MAX). */
int mkdir_p(const char *dir);

#endif /* COMMON_MKDIR_P_H */
