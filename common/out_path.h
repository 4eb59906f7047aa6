/* out_path.h - the one rule for a file that ddp replaces by writing a temporary file beside it and
 * renaming it over the target: libddp's ddp_state_save and trace writer (at write time), ddp-train's
 * --save, --trace and --save-llmc (checked before training, so a bad path costs no training), and
 * ddp-ckpt's outputs.
 *
 * The target is a new file or a regular one; a symbolic link is followed to the file it names (the
 * link stays), which must exist. A folder, a device (/dev/null included), a FIFO or a socket is
 * refused: a rename would put a regular file in its place. The callers print the reason with their
 * own prefix (the flag, the command) and what they add ("checked before training").
 */
#ifndef COMMON_OUT_PATH_H
#define COMMON_OUT_PATH_H

#include <stddef.h>
#include <sys/types.h>

enum { OUT_PATH_OK = 0, OUT_PATH_REFUSED = 1, OUT_PATH_ERROR = 2 };

/* Resolves PATH to the file to replace: *target (malloc'ed) on OUT_PATH_OK. OUT_PATH_REFUSED: PATH
 * breaks the rule (empty, ends with '/', a dangling or looping link, not a regular file);
 * OUT_PATH_ERROR: it cannot be examined (permissions, out of memory). Either way *target is NULL
 * and WHY (LEN bytes) says what PATH is and how to fix it, written to follow the path itself
 * (" is a folder: ...", ": a symbolic link to ..."): print "%s%s", path, why. */
int out_path_target(const char *path, char **target, char *why, size_t len);

/* The folder of TARGET (out_path_target's) accepts a new file: a probe file is created there and
 * removed. OUT_PATH_OK, or OUT_PATH_REFUSED with WHY as above. */
int out_path_probe_dir(const char *target, char *why, size_t len);

/* out_path_target and out_path_probe_dir together, for a check before the work that writes PATH:
 * OUT_PATH_OK; OUT_PATH_REFUSED when PATH breaks the rule; OUT_PATH_ERROR when it cannot be
 * examined or its folder takes no new file. WHY as above. */
int out_path_check(const char *path, char *why, size_t len);

/* What to do about a write into a folder that failed with the system's reason ERR (errno; 0 when
 * none is known), in words that a caller may follow with ", or use another <its flag>": "free space
 * there or raise the quota", "the file system is mounted read-only: remount it read-write", ... */
const char *out_path_advice(int err);

/* What a file that is not regular is, in words: "a folder", "a character device", "a FIFO (named
 * pipe)", ... (in_path_kind's words: the files read and written are described alike) */
const char *out_path_kind(mode_t mode);

#endif
