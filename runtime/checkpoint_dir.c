/* checkpoint_dir.c - checkpoint folders: a version 2 checkpoint file per rank holding its slices
 * of the float buffers, and a text MANIFEST written last (see ddp_checkpoint.h, docs/formats.md).
 *
 * MANIFEST, one item per line, fields separated by one space, in this order:
 *   DDPCKPTDIR 1                    magic and version
 *   files W                         the ranks that wrote it, one file each
 *   numel N                         elements of every float buffer
 *   signature P                     then P lines: param NAME N_DIMS D0 D1 D2 D3
 *   file NAME BYTES CRC             W lines: size and CRC-32 word (hex) of rank r's file
 *   piece FILE NAME OFFSET COUNT    the elements [OFFSET, OFFSET + COUNT) of buffer NAME are
 *                                   section NAME of file index FILE
 *   buffer NAME | u64 NAME V | f64 NAME HEXFLOAT | text NAME VALUE   the state's entries in order
 *   crc32 HEX                       CRC-32 of every byte before this line
 * Shard files are read by section table (pread), never whole, except by ddp_ckpt_dir_verify_file.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "ddp_checkpoint.h"
#include "in_path.h"
#include "internal.h"
#include "path_join.h"

#define DIR_MAGIC "DDPCKPTDIR 1"
#define DIR_SHARD_FMT "rank-%05d-of-%05d.ckpt"
#define DIR_MAX_MANIFEST ((size_t)64 << 20)
#define DIR_PATH_MAX 4096
#define DIR_HEADER_BYTES 32u
#define DIR_ENTRY_BYTES 72u
#define DIR_MAX_SECTIONS 4096u

typedef struct dir_section {
    char name[DDP_NAME_MAX];
    uint32_t kind;
    uint64_t offset, count;
} dir_section;

/* One rank's file: its path, size, CRC word and section table. */
typedef struct dir_file {
    char *path;
    uint64_t bytes;
    uint32_t crc;
    int n_sections;
    dir_section *sections;
} dir_file;

typedef struct dir_piece {
    int file;
    char name[DDP_NAME_MAX];
    uint64_t offset, count, at; /* at: the section's data offset in the file */
} dir_piece;

struct ddp_ckpt_dir {
    char *dir;
    int n_files, n_pieces;
    dir_file *files;
    dir_piece *pieces;
    ddp_state *state; /* signature, counts, counters, doubles, texts */
};

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* ---- a shard file's section table ------------------------------------------------------------ */

static ddp_status pread_all(int fd, void *buf, size_t n, uint64_t at, const char *path)
{
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(at + done));
        if (got <= 0) {
            DDP_ERROR("checkpoint folder: reading %s failed: %s", path,
                      got < 0 ? strerror(errno) : "the file is truncated");
            return got < 0 ? DDP_ERR_IO : DDP_ERR_FORMAT;
        }
        done += (size_t)got;
    }
    return DDP_OK;
}

/* Opens a file of the folder to read (*sb: its stat, unless NULL). A FIFO, socket, device or
 * folder in its place is refused at once, never read (common/in_path.h). -1 on failure, logged
 * naming the file, errno set (ENOENT: missing, EINVAL: not a regular file). */
static int open_read(const char *path, struct stat *sb)
{
    char why[512];
    int fd = in_path_open(path, sb, why, sizeof why);
    if (fd < 0) {
        int err = errno;
        DDP_ERROR("checkpoint folder: %s%s", path,
                  err == ENOENT ? ": missing (the folder is incomplete)" : why);
        errno = err;
    }
    return fd;
}

static void file_free(dir_file *f)
{
    free(f->path);
    free(f->sections);
}

/* Decodes the section table of an open version 2 file. */
static ddp_status table_parse(int fd, dir_file *f)
{
    unsigned char head[DIR_HEADER_BYTES];
    ddp_status st = f->bytes >= DIR_HEADER_BYTES + 4 ? pread_all(fd, head, sizeof head, 0, f->path)
                                                      : DDP_ERR_FORMAT;
    uint32_t n = st == DDP_OK ? le32(head + 12) : 0;
    if (st != DDP_OK || memcmp(head, DDP_CKPT_MAGIC, 8) != 0 || le32(head + 8) != 2 ||
        le64(head + 16) != f->bytes || n > DIR_MAX_SECTIONS ||
        DIR_HEADER_BYTES + (uint64_t)n * DIR_ENTRY_BYTES > f->bytes - 4) {
        DDP_ERROR("checkpoint folder: %s is not a complete version 2 checkpoint file (truncated, or "
                  "another file)", f->path);
        return DDP_ERR_FORMAT;
    }
    unsigned char *table = malloc((size_t)n * DIR_ENTRY_BYTES + 4);
    f->sections = calloc(n ? n : 1, sizeof *f->sections);
    if (!table || !f->sections) {
        free(table);
        return DDP_ERR_NOMEM;
    }
    st = pread_all(fd, table, (size_t)n * DIR_ENTRY_BYTES, DIR_HEADER_BYTES, f->path);
    for (uint32_t i = 0; st == DDP_OK && i < n; i++) {
        const unsigned char *rec = table + (size_t)i * DIR_ENTRY_BYTES;
        dir_section *s = &f->sections[i];
        memcpy(s->name, rec, DDP_NAME_MAX);
        s->name[DDP_NAME_MAX - 1] = '\0';
        s->kind = le32(rec + 48);
        s->offset = le64(rec + 56);
        s->count = le64(rec + 64);
        if (s->kind == DDP_STATE_F32 && (s->count > f->bytes / 4 || s->offset > f->bytes - 4 - 4 * s->count)) {
            DDP_ERROR("checkpoint folder: %s: section \"%s\" lies past the end: the file is corrupt",
                      f->path, s->name);
            st = DDP_ERR_FORMAT;
        }
    }
    f->n_sections = (int)n;
    unsigned char tail[4];
    if (st == DDP_OK && (st = pread_all(fd, tail, 4, f->bytes - 4, f->path)) == DDP_OK)
        f->crc = le32(tail);
    free(table);
    return st;
}

/* Opens path and reads its size, section table and CRC word into f (f->path taken over). */
static ddp_status table_read(char *path, dir_file *f)
{
    *f = (dir_file){.path = path};
    struct stat sb;
    int fd = open_read(path, &sb);
    if (fd < 0)
        return errno == ENOENT || errno == EINVAL ? DDP_ERR_FORMAT : DDP_ERR_IO;
    f->bytes = (uint64_t)sb.st_size;
    ddp_status st = table_parse(fd, f);
    close(fd);
    return st;
}

static const dir_section *section_find(const dir_file *f, const char *name, uint32_t kind)
{
    for (int i = 0; i < f->n_sections; i++)
        if (strcmp(f->sections[i].name, name) == 0 && f->sections[i].kind == kind)
            return &f->sections[i];
    return NULL;
}

/* The u64 section `name` of f; 0 when absent (*found 0). */
static ddp_status section_u64(const dir_file *f, const char *name, uint64_t *v, int *found)
{
    const dir_section *s = section_find(f, name, DDP_STATE_U64);
    *found = s != NULL;
    *v = 0;
    if (!s)
        return DDP_OK;
    int fd = open_read(f->path, NULL);
    unsigned char b[8];
    ddp_status st = fd >= 0 ? pread_all(fd, b, 8, s->offset, f->path) : DDP_ERR_IO;
    if (fd >= 0)
        close(fd);
    if (st == DDP_OK)
        *v = le64(b);
    return st;
}

/* ---- writing ----------------------------------------------------------------------------------- */

static char *shard_path(const char *dir, int rank, int world)
{
    char name[64];
    snprintf(name, sizeof name, DIR_SHARD_FMT, rank, world);
    return path_join(dir, name);
}

/* Digits only, at least one: the rest of name from p. */
static int all_digits(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return n > 0;
}

/* The length of name's base when it is MANIFEST or rank-RRRRR-of-WWWWW.ckpt, else 0. */
static size_t own_base(const char *name)
{
    if (strncmp(name, DDP_CKPT_MANIFEST, strlen(DDP_CKPT_MANIFEST)) == 0)
        return strlen(DDP_CKPT_MANIFEST);
    /* "rank-" 5 digits "-of-" 5 digits ".ckpt": 24 bytes */
    int ok = strlen(name) >= 24 && strncmp(name, "rank-", 5) == 0 && all_digits(name + 5, 5) &&
             strncmp(name + 10, "-of-", 4) == 0 && all_digits(name + 14, 5) &&
             strncmp(name + 19, ".ckpt", 5) == 0;
    return ok ? 24 : 0;
}

int ckpt_dir_own_name(const char *name)
{
    size_t base = own_base(name);
    if (!base)
        return 0;
    const char *rest = name + base;
    return rest[0] == '\0' ||
           (strncmp(rest, ".tmp.", 5) == 0 && all_digits(rest + 5, strlen(rest + 5)));
}

/* Removes dir's entry name when it is a regular file (never through a link); 0 or -1 (errno). */
static int remove_regular(DIR *d, const char *name)
{
    struct stat sb;
    if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISREG(sb.st_mode)) {
        errno = S_ISLNK(sb.st_mode) ? ELOOP : EISDIR;
        return -1;
    }
    return unlinkat(dirfd(d), name, 0) == 0 || errno == ENOENT ? 0 : -1;
}

int ckpt_dir_remove_own(DIR *d, const char *dir)
{
    if (remove_regular(d, DDP_CKPT_MANIFEST) != 0)
        return -1;
    int left = 0;
    struct dirent *de;
    rewinddir(d);
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        int own = ckpt_dir_own_name(de->d_name);
        if (own && remove_regular(d, de->d_name) == 0)
            continue;
        if (++left <= 4)
            DDP_WARN("checkpoint folder %s: left %s in place: %s", dir, de->d_name,
                     own ? (errno == ELOOP ? "a symbolic link, never followed nor removed by ddp"
                                           : strerror(errno))
                         : "not a file ddp writes (move it away to let ddp remove the folder)");
    }
    return left;
}

ddp_status ddp_ckpt_dir_begin(const char *dir)
{
    struct stat sb = {0};
    if (!dir || (mkdir(dir, 0777) != 0 && errno != EEXIST)) {
        DDP_ERROR("checkpoint folder %s: cannot create it: %s", dir ? dir : "(null)", strerror(errno));
        return dir ? DDP_ERR_IO : DDP_ERR_INVALID_ARG;
    }
    if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        DDP_ERROR("checkpoint folder %s: exists and is not a folder%s; ddp writes its checkpoint "
                  "folders itself (move it away)", dir,
                  S_ISLNK(sb.st_mode) ? " (a symbolic link, which ddp never writes through)" : "");
        return DDP_ERR_INVALID_ARG;
    }
    DIR *d = opendir(dir);
    int left = d ? ckpt_dir_remove_own(d, dir) : -1;
    int err = errno;
    if (d)
        closedir(d);
    if (left < 0) {
        DDP_ERROR("checkpoint folder %s: cannot %s: %s", dir, d ? "remove its MANIFEST" : "list it",
                  strerror(err));
        return DDP_ERR_IO;
    }
    return ckpt_fsync_dir(dir);
}

ddp_status ddp_ckpt_dir_write_shard(const char *dir, int rank, int world_size, const ddp_state *shard)
{
    uint64_t v;
    if (!dir || rank < 0 || rank >= world_size || !ddp_state_u64(shard, "shard.offset.params", &v)) {
        DDP_ERROR("ddp_ckpt_dir_write_shard: need a folder, 0 <= rank < world_size and a shard state "
                  "with \"shard.offset.params\"");
        return DDP_ERR_INVALID_ARG;
    }
    char *path = shard_path(dir, rank, world_size);
    ddp_status st = path ? ddp_state_save(shard, path) : DDP_ERR_NOMEM;
    int err = errno;
    free(path);
    errno = err;
    return st;
}

int ddp_ckpt_dir_files_present(const char *dir, int world_size)
{
    int present = dir != NULL && world_size >= 1;
    for (int r = 0; present && r < world_size; r++) {
        char *path = shard_path(dir, r, world_size);
        present = path && access(path, F_OK) == 0;
        free(path);
    }
    return present;
}

/* A growing text. */
typedef struct text_buf {
    char *p;
    size_t n, cap;
    int failed;
} text_buf;

static void text_add(text_buf *t, const char *fmt, ...)
{
    va_list ap;
    for (int pass = 0; pass < 2 && !t->failed; pass++) {
        va_start(ap, fmt);
        int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            t->failed = 1;
        } else if (t->p && t->n + (size_t)k < t->cap) {
            t->n += (size_t)k;
            return;
        } else {
            size_t cap = (t->cap + (size_t)k + 1) * 2;
            char *g = realloc(t->p, cap);
            t->failed = !g;
            t->p = g ? g : t->p;
            t->cap = g ? cap : t->cap;
        }
    }
}

/* Pieces of every file's float sections; each needs its "shard.offset.NAME". */
static ddp_status collect_pieces(ddp_ckpt_dir *d)
{
    for (int r = 0; r < d->n_files; r++) {
        const dir_file *f = &d->files[r];
        for (int i = 0; i < f->n_sections; i++) {
            const dir_section *s = &f->sections[i];
            if (s->kind != DDP_STATE_F32)
                continue;
            char key[DDP_NAME_MAX + 16];
            uint64_t off;
            int found;
            snprintf(key, sizeof key, "shard.offset.%s", s->name);
            ddp_status st = section_u64(f, key, &off, &found);
            if (st != DDP_OK || !found) {
                DDP_ERROR("checkpoint folder: %s: no \"%s\": not a shard file", f->path, key);
                return st != DDP_OK ? st : DDP_ERR_FORMAT;
            }
            dir_piece *g = realloc(d->pieces, (size_t)(d->n_pieces + 1) * sizeof *g);
            if (!g)
                return DDP_ERR_NOMEM;
            d->pieces = g;
            g[d->n_pieces++] = (dir_piece){.file = r, .offset = off, .count = s->count, .at = s->offset};
            memcpy(g[d->n_pieces - 1].name, s->name, DDP_NAME_MAX);
        }
    }
    return DDP_OK;
}

/* Every piece of buffer `name` together covers [0, numel) once. */
static ddp_status check_cover(const ddp_ckpt_dir *d, const char *name, uint64_t numel)
{
    uint64_t at = 0;
    for (int progress = 1; progress && at < numel;) {
        progress = 0;
        for (int i = 0; i < d->n_pieces; i++) {
            const dir_piece *p = &d->pieces[i];
            if (strcmp(p->name, name) == 0 && p->offset == at && p->count > 0) {
                at += p->count;
                progress = 1;
            }
        }
    }
    uint64_t sum = 0;
    for (int i = 0; i < d->n_pieces; i++)
        sum += strcmp(d->pieces[i].name, name) == 0 ? d->pieces[i].count : 0;
    if (at == numel && sum == numel)
        return DDP_OK;
    DDP_ERROR("checkpoint folder %s: the pieces of \"%s\" do not cover its %llu values exactly once "
              "(a shard file is missing or from another save)", d->dir, name,
              (unsigned long long)numel);
    return DDP_ERR_FORMAT;
}

/* Checks that a name can stand in a MANIFEST line. */
static ddp_status manifest_name_ok(const char *name)
{
    if (name[0] && !strpbrk(name, " \n\r"))
        return DDP_OK;
    DDP_ERROR("checkpoint folder: the name \"%s\" holds a space or a line break, which a MANIFEST "
              "line cannot", name);
    return DDP_ERR_INVALID_ARG;
}

/* The state's entries (buffers, counters, doubles, texts), "shard.*" left out, as MANIFEST lines. */
static ddp_status manifest_entries(text_buf *t, const ddp_state *meta)
{
    for (int i = 2; i < ddp_state_n_entries(meta); i++) {
        const char *name;
        ddp_state_kind kind;
        uint64_t count, u = 0;
        double x = 0.0;
        ddp_state_entry_info(meta, i, &name, &kind, &count);
        if (strncmp(name, "shard.", 6) == 0)
            continue;
        if (manifest_name_ok(name) != DDP_OK)
            return DDP_ERR_INVALID_ARG;
        if (kind == DDP_STATE_F32) {
            text_add(t, "buffer %s\n", name);
        } else if (kind == DDP_STATE_U64 && ddp_state_u64(meta, name, &u)) {
            text_add(t, "u64 %s %" PRIu64 "\n", name, u);
        } else if (kind == DDP_STATE_F64 && ddp_state_f64(meta, name, &x)) {
            text_add(t, "f64 %s %a\n", name, x);
        } else if (kind == DDP_STATE_TEXT) {
            const char *v = ddp_state_text(meta, name);
            if (strpbrk(v, "\n\r")) {
                DDP_ERROR("checkpoint folder: the text \"%s\" holds a line break", name);
                return DDP_ERR_INVALID_ARG;
            }
            text_add(t, "text %s %s\n", name, v);
        }
    }
    return DDP_OK;
}

/* The MANIFEST's text for the files and pieces of d. */
static ddp_status manifest_text(const ddp_ckpt_dir *d, const ddp_param_desc *descs, int n_params,
                                uint64_t numel, const ddp_state *meta, text_buf *t)
{
    text_add(t, "%s\nfiles %d\nnumel %" PRIu64 "\nsignature %d\n", DIR_MAGIC, d->n_files, numel, n_params);
    for (int i = 0; i < n_params; i++) {
        if (manifest_name_ok(descs[i].name) != DDP_OK)
            return DDP_ERR_INVALID_ARG;
        text_add(t, "param %s %d", descs[i].name, descs[i].n_dims);
        for (int k = 0; k < DDP_MAX_DIMS; k++)
            text_add(t, " %" PRId64, k < descs[i].n_dims ? descs[i].shape[k] : 0);
        text_add(t, "\n");
    }
    for (int r = 0; r < d->n_files; r++) {
        const char *base = strrchr(d->files[r].path, '/');
        text_add(t, "file %s %" PRIu64 " %08" PRIx32 "\n", base ? base + 1 : d->files[r].path,
                 d->files[r].bytes, d->files[r].crc);
    }
    for (int i = 0; i < d->n_pieces; i++)
        text_add(t, "piece %d %s %" PRIu64 " %" PRIu64 "\n", d->pieces[i].file, d->pieces[i].name,
                 d->pieces[i].offset, d->pieces[i].count);
    ddp_status st = manifest_entries(t, meta);
    if (st == DDP_OK)
        text_add(t, "crc32 %08" PRIx32 "\n", t->p ? ckpt_crc32(t->p, t->n) : 0u);
    return t->failed ? DDP_ERR_NOMEM : st;
}

/* Writes text to dir/MANIFEST atomically. */
static ddp_status manifest_write(const char *dir, const text_buf *t)
{
    char *path = path_join(dir, DDP_CKPT_MANIFEST), tmp[DIR_PATH_MAX];
    if (!path)
        return DDP_ERR_NOMEM;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(t->p, 1, t->n, f) == t->n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    ok = f && fclose(f) == 0 && ok;
    ok = ok && rename(tmp, path) == 0;
    err = ok ? 0 : errno ? errno : err;
    if (!ok) {
        DDP_ERROR("checkpoint folder: writing %s failed: %s%s", path, strerror(err),
                  err == ENOSPC || err == EDQUOT ? " (free space there)" : "");
        unlink(tmp);
    }
    free(path);
    ddp_status st = ok ? ckpt_fsync_dir(dir) : DDP_ERR_IO;
    errno = ok ? errno : err;
    return st;
}

/* Every file's "step" equals meta's (when meta has one). */
static ddp_status check_steps(const ddp_ckpt_dir *d, const ddp_state *meta)
{
    uint64_t want, got;
    int found;
    if (!ddp_state_u64(meta, "step", &want))
        return DDP_OK;
    for (int r = 0; r < d->n_files; r++) {
        ddp_status st = section_u64(&d->files[r], "step", &got, &found);
        if (st != DDP_OK)
            return st;
        if (found && got != want) {
            DDP_ERROR("checkpoint folder: %s is from step %" PRIu64 ", the checkpoint from step %"
                      PRIu64 ": a file of another save", d->files[r].path, got, want);
            return DDP_ERR_FORMAT;
        }
    }
    return DDP_OK;
}

ddp_status ddp_ckpt_dir_commit(const char *dir, int world_size, const ddp_param_desc *descs,
                               int n_params, const ddp_state *meta)
{
    if (!dir || world_size < 1 || !descs || n_params < 1 || !meta) {
        DDP_ERROR("ddp_ckpt_dir_commit: need a folder, world_size >= 1, descriptors and a state");
        return DDP_ERR_INVALID_ARG;
    }
    ddp_ckpt_dir d = {.dir = (char *)dir, .n_files = world_size};
    d.files = calloc((size_t)world_size, sizeof *d.files);
    ddp_status st = d.files ? DDP_OK : DDP_ERR_NOMEM;
    for (int r = 0; st == DDP_OK && r < world_size; r++) {
        char *path = shard_path(dir, r, world_size);
        st = path ? table_read(path, &d.files[r]) : DDP_ERR_NOMEM;
    }
    uint64_t numel = 0;
    for (int i = 0; i < n_params; i++)
        numel += ddp_param_numel(&descs[i]);
    if (st == DDP_OK)
        st = collect_pieces(&d);
    for (int i = 1; st == DDP_OK && i < ddp_state_n_entries(meta); i++) {
        const char *name;
        ddp_state_kind kind;
        uint64_t count;
        ddp_state_entry_info(meta, i, &name, &kind, &count);
        if (kind == DDP_STATE_F32)
            st = check_cover(&d, name, numel);
    }
    if (st == DDP_OK)
        st = check_steps(&d, meta);
    text_buf t = {0};
    if (st == DDP_OK)
        st = manifest_text(&d, descs, n_params, numel, meta, &t);
    if (st == DDP_OK)
        st = manifest_write(dir, &t);
    int err = errno;
    free(t.p);
    for (int r = 0; d.files && r < world_size; r++)
        file_free(&d.files[r]);
    free(d.files);
    free(d.pieces);
    errno = err;
    return st;
}

/* ---- reading the MANIFEST ---------------------------------------------------------------------- */

void ddp_ckpt_dir_close(ddp_ckpt_dir *d)
{
    if (!d)
        return;
    for (int r = 0; d->files && r < d->n_files; r++)
        file_free(&d->files[r]);
    free(d->files);
    free(d->pieces);
    ddp_state_destroy(d->state);
    free(d->dir);
    free(d);
}

/* Reads dir/MANIFEST whole and checks its last line's CRC-32; *text NUL-terminated, cut before it. */
static ddp_status manifest_read(const char *dir, char **text)
{
    char *path = path_join(dir, DDP_CKPT_MANIFEST), why[512] = ": out of memory";
    int fd = path ? in_path_open(path, NULL, why, sizeof why) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (!path || errno == ENOENT)
            DDP_ERROR("checkpoint folder %s: no %s (%s): not a complete checkpoint", dir,
                      DDP_CKPT_MANIFEST, path ? strerror(errno) : "out of memory");
        else
            DDP_ERROR("checkpoint folder %s: %s%s", dir, path, fd >= 0 ? ": out of memory" : why);
        if (fd >= 0)
            close(fd);
        free(path);
        return DDP_ERR_IO;
    }
    char *buf = malloc(DIR_MAX_MANIFEST + 1);
    size_t n = buf ? fread(buf, 1, DIR_MAX_MANIFEST, f) : 0;
    fclose(f);
    ddp_status st = buf ? DDP_OK : DDP_ERR_NOMEM;
    if (buf) {
        buf[n] = '\0';
        char *last = n > 1 ? buf + n - 2 : buf;
        while (last > buf && *last != '\n')
            last--;
        unsigned crc = 0;
        if (last == buf || sscanf(last + 1, "crc32 %x", &crc) != 1 ||
            crc != ckpt_crc32(buf, (size_t)(last + 1 - buf)) || strncmp(buf, DIR_MAGIC "\n", 13) != 0) {
            DDP_ERROR("checkpoint folder: %s is truncated or corrupt (its magic or CRC-32 does not "
                      "match)", path);
            st = DDP_ERR_FORMAT;
        }
        last[1] = '\0';
    }
    free(path);
    if (st != DDP_OK)
        free(buf);
    else
        *text = buf;
    return st;
}

/* The next line of *at (NUL-terminated in place), NULL at the end. */
static char *next_line(char **at)
{
    char *line = *at;
    if (!line || !*line)
        return NULL;
    char *nl = strchr(line, '\n');
    *at = nl ? nl + 1 : line + strlen(line);
    if (nl)
        *nl = '\0';
    return line;
}

typedef struct manifest_head {
    int n_files, n_params;
    uint64_t numel;
    ddp_param_desc *descs;
} manifest_head;

static ddp_status parse_head(char **at, manifest_head *h)
{
    next_line(at);
    char *l1 = next_line(at), *l2 = next_line(at), *l3 = next_line(at);
    if (!l3 || sscanf(l1, "files %d", &h->n_files) != 1 || sscanf(l2, "numel %" SCNu64, &h->numel) != 1 ||
        sscanf(l3, "signature %d", &h->n_params) != 1 || h->n_files < 1 || h->n_files > 1 << 20 ||
        h->n_params < 1 || h->n_params > 1 << 20)
        return DDP_ERR_FORMAT;
    h->descs = calloc((size_t)h->n_params, sizeof *h->descs);
    if (!h->descs)
        return DDP_ERR_NOMEM;
    uint64_t total = 0;
    for (int i = 0; i < h->n_params; i++) {
        char *l = next_line(at);
        ddp_param_desc *p = &h->descs[i];
        if (!l || sscanf(l, "param %47s %d %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, p->name,
                         &p->n_dims, &p->shape[0], &p->shape[1], &p->shape[2], &p->shape[3]) != 6 ||
            p->n_dims < 0 || p->n_dims > DDP_MAX_DIMS)
            return DDP_ERR_FORMAT;
        total += ddp_param_numel(p);
    }
    return total == h->numel ? DDP_OK : DDP_ERR_FORMAT;
}

/* A "file NAME BYTES CRC" line into d->files[r]. */
static ddp_status parse_file(ddp_ckpt_dir *d, int r, const char *line, uint64_t *bytes, uint32_t *crc)
{
    char name[256];
    unsigned c;
    if (!line || sscanf(line, "file %255s %" SCNu64 " %x", name, bytes, &c) != 3 || strchr(name, '/'))
        return DDP_ERR_FORMAT;
    *crc = c;
    d->files[r].path = path_join(d->dir, name);
    return d->files[r].path ? DDP_OK : DDP_ERR_NOMEM;
}

/* A file against its MANIFEST line: size, CRC word, table, the pieces' sections. */
static ddp_status check_file(ddp_ckpt_dir *d, int r, uint64_t bytes, uint32_t crc)
{
    dir_file *f = &d->files[r];
    char *path = f->path;
    ddp_status st = table_read(path, f);
    if (st == DDP_OK && (f->bytes != bytes || f->crc != crc)) {
        DDP_ERROR("checkpoint folder: %s has %" PRIu64 " bytes and CRC-32 %08" PRIx32 ", the MANIFEST "
                  "says %" PRIu64 " and %08" PRIx32 ": truncated, or from another save", path, f->bytes,
                  f->crc, bytes, crc);
        st = DDP_ERR_FORMAT;
    }
    return st;
}

/* The pieces' lines; each section must be in its file with that count. */
static ddp_status parse_piece(ddp_ckpt_dir *d, const char *line)
{
    dir_piece p = {0};
    if (sscanf(line, "piece %d %47s %" SCNu64 " %" SCNu64, &p.file, p.name, &p.offset, &p.count) != 4 ||
        p.file < 0 || p.file >= d->n_files)
        return DDP_ERR_FORMAT;
    const dir_section *s = section_find(&d->files[p.file], p.name, DDP_STATE_F32);
    if (!s || s->count != p.count) {
        DDP_ERROR("checkpoint folder: %s has no section \"%s\" of %" PRIu64 " values: from another "
                  "save", d->files[p.file].path, p.name, p.count);
        return DDP_ERR_FORMAT;
    }
    p.at = s->offset;
    dir_piece *g = realloc(d->pieces, (size_t)(d->n_pieces + 1) * sizeof *g);
    if (!g)
        return DDP_ERR_NOMEM;
    d->pieces = g;
    g[d->n_pieces++] = p;
    return DDP_OK;
}

/* A buffer, u64, f64 or text line into the state. */
static ddp_status parse_entry(ddp_ckpt_dir *d, char *line, uint64_t numel)
{
    char kind[8] = "", name[DDP_NAME_MAX] = "";
    int used = 0;
    if (sscanf(line, "%7s %47s %n", kind, name, &used) < 2)
        return DDP_ERR_FORMAT;
    char *value = line + used;
    if (strcmp(kind, "buffer") == 0)
        return check_cover(d, name, numel) == DDP_OK ? ckpt_state_add_count(d->state, name, numel)
                                                     : DDP_ERR_FORMAT;
    if (strcmp(kind, "text") == 0) {
        char *sp = strchr(line + strlen(kind) + 1, ' ');
        return ddp_state_set_text(d->state, name, sp ? sp + 1 : "");
    }
    char *end = NULL;
    errno = 0;
    if (strcmp(kind, "u64") == 0) {
        uint64_t v = strtoull(value, &end, 10);
        return errno || end == value ? DDP_ERR_FORMAT : ddp_state_set_u64(d->state, name, v);
    }
    double x = strtod(value, &end);
    return strcmp(kind, "f64") || errno || end == value ? DDP_ERR_FORMAT
                                                        : ddp_state_set_f64(d->state, name, x);
}

static ddp_status parse_body(ddp_ckpt_dir *d, char *at, uint64_t numel)
{
    ddp_status st = DDP_OK;
    for (int r = 0; st == DDP_OK && r < d->n_files; r++) {
        uint64_t bytes;
        uint32_t crc;
        st = parse_file(d, r, next_line(&at), &bytes, &crc);
        if (st == DDP_OK)
            st = check_file(d, r, bytes, crc);
    }
    char *line;
    while (st == DDP_OK && (line = next_line(&at)) != NULL)
        st = strncmp(line, "piece ", 6) == 0 ? parse_piece(d, line) : parse_entry(d, line, numel);
    if (st == DDP_OK)
        st = check_cover(d, "params", numel);
    if (st == DDP_OK)
        st = check_steps(d, d->state);
    return st;
}

ddp_status ddp_ckpt_dir_open(const char *dir, ddp_ckpt_dir **out)
{
    if (!dir || !out)
        return DDP_ERR_INVALID_ARG;
    char *text = NULL;
    ddp_status st = manifest_read(dir, &text);
    if (st != DDP_OK)
        return st;
    ddp_ckpt_dir *d = calloc(1, sizeof *d);
    manifest_head h = {0};
    char *at = text;
    st = d && (d->dir = strdup(dir)) ? parse_head(&at, &h) : DDP_ERR_NOMEM;
    if (st == DDP_OK) {
        d->n_files = h.n_files;
        d->files = calloc((size_t)h.n_files, sizeof *d->files);
        d->state = ckpt_state_meta(h.descs, h.n_params, h.numel);
        st = d->files && d->state ? parse_body(d, at, h.numel) : DDP_ERR_NOMEM;
    }
    if (st == DDP_ERR_FORMAT)
        DDP_ERROR("checkpoint folder %s: its %s or a file it lists is not valid (see above)", dir,
                  DDP_CKPT_MANIFEST);
    free(h.descs);
    free(text);
    if (st != DDP_OK)
        ddp_ckpt_dir_close(d);
    else
        *out = d;
    return st;
}

const ddp_state *ddp_ckpt_dir_state(const ddp_ckpt_dir *d) { return d ? d->state : NULL; }
int ddp_ckpt_dir_n_files(const ddp_ckpt_dir *d) { return d ? d->n_files : 0; }

const char *ddp_ckpt_dir_file(const ddp_ckpt_dir *d, int i)
{
    return d && i >= 0 && i < d->n_files ? d->files[i].path : NULL;
}

/* ---- reading values ---------------------------------------------------------------------------- */

/* Elements [lo, hi) of piece p into dst (element lo of the buffer at dst[0]). */
static ddp_status piece_read(const ddp_ckpt_dir *d, const dir_piece *p, uint64_t lo, uint64_t hi,
                             float *dst)
{
    const char *path = d->files[p->file].path;
    int fd = open_read(path, NULL);
    if (fd < 0)
        return DDP_ERR_IO;
    ddp_status st = pread_all(fd, dst, (size_t)(hi - lo) * 4, p->at + 4 * (lo - p->offset), path);
    close(fd);
    unsigned char *b = (unsigned char *)dst;
    for (uint64_t i = 0; st == DDP_OK && i < hi - lo; i++) { /* little-endian on disk */
        uint32_t bits = le32(b + 4 * i);
        memcpy(&dst[i], &bits, 4);
    }
    return st;
}

ddp_status ddp_ckpt_dir_read_f32(const ddp_ckpt_dir *d, const char *name, size_t offset, size_t n,
                                 float *dst)
{
    size_t numel = 0;
    ddp_state_f32(d ? d->state : NULL, name, &numel);
    if (!d || !dst || !name || offset > numel || n > numel - offset) {
        DDP_ERROR("ddp_ckpt_dir_read_f32: no buffer \"%s\" or elements [%zu, %zu) past its %zu",
                  name ? name : "(null)", offset, offset + n, numel);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = DDP_OK;
    for (int i = 0; st == DDP_OK && i < d->n_pieces; i++) {
        const dir_piece *p = &d->pieces[i];
        uint64_t lo = p->offset > offset ? p->offset : offset;
        uint64_t hi = p->offset + p->count < offset + n ? p->offset + p->count : offset + n;
        if (strcmp(p->name, name) == 0 && lo < hi)
            st = piece_read(d, p, lo, hi, dst + (lo - offset));
    }
    return st;
}

ddp_status ddp_ckpt_dir_verify_file(const ddp_ckpt_dir *d, int i)
{
    if (!d || i < 0 || i >= d->n_files)
        return DDP_ERR_INVALID_ARG;
    const dir_file *f = &d->files[i];
    int fd = open_read(f->path, NULL);
    size_t chunk = (size_t)4 << 20;
    unsigned char *buf = fd >= 0 ? malloc(chunk) : NULL;
    ddp_status st = fd < 0 ? DDP_ERR_IO : buf ? DDP_OK : DDP_ERR_NOMEM;
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint64_t at = 0; st == DDP_OK && at < f->bytes - 4; at += chunk) {
        size_t k = f->bytes - 4 - at < chunk ? (size_t)(f->bytes - 4 - at) : chunk;
        st = pread_all(fd, buf, k, at, f->path);
        crc = st == DDP_OK ? crc32_z(crc, buf, k) : crc;
    }
    if (st == DDP_OK && (uint32_t)crc != f->crc) {
        DDP_ERROR("checksum mismatch: %s is corrupt", f->path);
        st = DDP_ERR_FORMAT;
    }
    free(buf);
    if (fd >= 0)
        close(fd);
    return st;
}

/* Copies the counters, doubles and texts of the folder's state into s. */
static ddp_status copy_scalars(const ddp_state *from, ddp_state *s)
{
    ddp_status st = DDP_OK;
    for (int i = 2; st == DDP_OK && i < ddp_state_n_entries(from); i++) {
        const char *name;
        ddp_state_kind kind;
        uint64_t count, u = 0;
        double x = 0.0;
        ddp_state_entry_info(from, i, &name, &kind, &count);
        if (kind == DDP_STATE_U64 && ddp_state_u64(from, name, &u))
            st = ddp_state_set_u64(s, name, u);
        else if (kind == DDP_STATE_F64 && ddp_state_f64(from, name, &x))
            st = ddp_state_set_f64(s, name, x);
        else if (kind == DDP_STATE_TEXT)
            st = ddp_state_set_text(s, name, ddp_state_text(from, name));
    }
    return st;
}

ddp_status ddp_ckpt_dir_consolidate(const ddp_ckpt_dir *d, const char *path)
{
    if (!d || !path)
        return DDP_ERR_INVALID_ARG;
    size_t numel = ddp_state_numel(d->state);
    float *buf = malloc((numel ? numel : 1) * sizeof *buf);
    ddp_state *s = NULL;
    ddp_status st = buf ? ddp_ckpt_dir_read_f32(d, "params", 0, numel, buf) : DDP_ERR_NOMEM;
    if (st == DDP_OK)
        st = ddp_state_create(ddp_state_descs(d->state), ddp_state_n_params(d->state), buf, &s);
    for (int i = 2; st == DDP_OK && i < ddp_state_n_entries(d->state); i++) {
        const char *name;
        ddp_state_kind kind;
        uint64_t count;
        ddp_state_entry_info(d->state, i, &name, &kind, &count);
        if (kind != DDP_STATE_F32)
            continue;
        st = ddp_ckpt_dir_read_f32(d, name, 0, numel, buf);
        if (st == DDP_OK)
            st = ddp_state_set_f32(s, name, buf, numel);
    }
    free(buf);
    if (st == DDP_OK)
        st = copy_scalars(d->state, s);
    if (st == DDP_OK)
        st = ddp_state_save(s, path);
    ddp_state_destroy(s);
    return st;
}

ddp_status ddp_ckpt_dir_verify(const ddp_ckpt_dir *d)
{
    ddp_status st = d ? DDP_OK : DDP_ERR_INVALID_ARG;
    for (int i = 0; st == DDP_OK && i < d->n_files; i++)
        st = ddp_ckpt_dir_verify_file(d, i);
    return st;
}

/* ---- either kind ----------------------------------------------------------------------------- */

int ddp_checkpoint_is_folder(const char *path)
{
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

ddp_status ddp_checkpoint_open(const char *path, int verify, ddp_state **file, ddp_ckpt_dir **dir)
{
    if (!path || !file || !dir)
        return DDP_ERR_INVALID_ARG;
    *file = NULL;
    *dir = NULL;
    if (!ddp_checkpoint_is_folder(path))
        return ddp_state_load(path, file);
    ddp_status st = ddp_ckpt_dir_open(path, dir);
    if (st == DDP_OK && verify)
        st = ddp_ckpt_dir_verify(*dir);
    if (st != DDP_OK) {
        ddp_ckpt_dir_close(*dir);
        *dir = NULL;
    }
    return st;
}

const ddp_state *ddp_checkpoint_state(const ddp_state *file, const ddp_ckpt_dir *dir)
{
    return file ? file : dir ? ddp_ckpt_dir_state(dir) : NULL;
}

ddp_status ddp_ckpt_dir_read_dev(ddp_ctx *ctx, const ddp_ckpt_dir *d, const char *name,
                                 size_t offset, size_t n, float *dst)
{
    size_t chunk = n < ((size_t)4 << 20) ? n : (size_t)4 << 20;
    float *host = malloc((chunk ? chunk : 1) * sizeof *host);
    ddp_status st = host ? DDP_OK : DDP_ERR_NOMEM;
    for (size_t at = 0; st == DDP_OK && at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        st = ddp_ckpt_dir_read_f32(d, name, offset + at, k, host);
        if (st == DDP_OK)
            st = ddp_upload(ctx, dst + at, host, k * sizeof *host);
    }
    free(host);
    return st;
}
