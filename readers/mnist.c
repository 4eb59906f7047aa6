/* mnist.c - MNIST IDX reader: validates magic, dimensions, counts, file sizes and labels; reads
 * gzip'ed files (NAME.gz) through zlib's inflate. */
#include "mnist.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MNIST_IDX_IMAGES_MAGIC 0x00000803u
#define MNIST_IDX_LABELS_MAGIC 0x00000801u
#define MNIST_SIDE 28
#define MNIST_CLASSES 10
#define MNIST_FIX "re-run scripts/fetch-mnist.sh"
#define MNIST_GZ_FIX "re-download it, or run gunzip -t on it to check"
#define MNIST_GZ_CHUNK 65536 /* compressed bytes read per fread */

/* One open IDX file: its path, stream and size in bytes. A gzip'ed file is unpacked into mem when
 * opened; file_bytes is then its unpacked size and pos the read position in mem. */
typedef struct idx_file {
    const char *path;
    const char *fix; /* how to get a good copy, for the messages */
    FILE *f;
    uint8_t *mem;
    uint64_t file_bytes, pos;
} idx_file;

static uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static int is_gz(const char *path)
{
    size_t n = strlen(path);
    return n > 3 && strcmp(path + n - 3, ".gz") == 0;
}

/* Room for at least one more byte after `have` in *mem (capacity *cap, doubled when full). */
static ddp_status gz_grow(uint8_t **mem, size_t *cap, size_t have)
{
    if (have < *cap)
        return DDP_OK;
    size_t new_cap = *cap * 2;
    uint8_t *grown = new_cap > *cap ? realloc(*mem, new_cap) : NULL;
    if (!grown)
        return DDP_ERR_NOMEM;
    *mem = grown;
    *cap = new_cap;
    return DDP_OK;
}

/* Inflates idx->f into idx->mem (capacity *cap, *have bytes unpacked) until the input ends or
 * inflate fails; one gzip member after another, as gunzip does. Returns inflate's last code
 * (Z_STREAM_END: the input ended right after a whole member), or Z_MEM_ERROR when idx->mem cannot
 * grow. *read_bytes counts the compressed bytes read. */
static int gz_inflate(idx_file *idx, z_stream *z, size_t *cap, size_t *have, uint64_t *read_bytes)
{
    unsigned char in[MNIST_GZ_CHUNK];
    int ret = Z_OK;
    for (;;) {
        if (z->avail_in == 0) {
            z->next_in = in;
            z->avail_in = (uInt)fread(in, 1, sizeof in, idx->f);
            *read_bytes += z->avail_in;
            if (z->avail_in == 0)
                return ret;
        }
        if (ret == Z_STREAM_END && inflateReset(z) != Z_OK) /* another member follows */
            return Z_STREAM_ERROR;
        if (gz_grow(&idx->mem, cap, *have) != DDP_OK)
            return Z_MEM_ERROR;
        uInt room = *cap - *have > UINT_MAX ? UINT_MAX : (uInt)(*cap - *have);
        z->next_out = idx->mem + *have;
        z->avail_out = room;
        ret = inflate(z, Z_NO_FLUSH);
        *have += room - z->avail_out;
        if (ret != Z_OK && ret != Z_STREAM_END)
            return ret;
    }
}

/* Logs why unpacking failed: inflate's code ret after read_bytes compressed bytes, have unpacked. */
static ddp_status gz_failure(const idx_file *idx, const z_stream *z, int ret, uint64_t read_bytes,
                                 size_t have)
{
    uint64_t at = read_bytes - z->avail_in;
    if (ferror(idx->f)) {
        DDP_ERROR("%s: read error: %s; %s", idx->path, strerror(errno), MNIST_GZ_FIX);
        return DDP_ERR_IO;
    }
    if (ret == Z_MEM_ERROR) {
        DDP_ERROR("%s: out of memory unpacking it (%zu bytes unpacked so far)", idx->path, have);
        return DDP_ERR_NOMEM;
    }
    if (ret == Z_OK || ret == Z_BUF_ERROR) {
        DDP_ERROR("%s: truncated gzip stream (the file ends after %llu bytes, %zu unpacked, in the middle "
                  "of the compressed data); %s", idx->path, (unsigned long long)read_bytes, have, MNIST_GZ_FIX);
        return DDP_ERR_FORMAT;
    }
    DDP_ERROR("%s: corrupt gzip data (zlib: %s, found at byte %llu of %llu); %s", idx->path,
              z->msg ? z->msg : "error", (unsigned long long)at, (unsigned long long)idx->file_bytes, MNIST_GZ_FIX);
    return DDP_ERR_FORMAT;
}

/* Unpacks the gzip file idx->f into idx->mem and sets file_bytes to the unpacked size. Truncated,
 * corrupt or non-gzip data is DDP_ERR_FORMAT (logged, naming the file and the problem). */
static ddp_status idx_gunzip(idx_file *idx)
{
    z_stream z = {0};
    size_t cap = (size_t)idx->file_bytes * 2 + 4096, have = 0;
    uint64_t read_bytes = 0;
    if (!(idx->mem = malloc(cap)) || inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
        DDP_ERROR("%s: out of memory to unpack it", idx->path);
        return DDP_ERR_NOMEM;
    }
    int ret = gz_inflate(idx, &z, &cap, &have, &read_bytes);
    ddp_status st = DDP_OK;
    if (ret != Z_STREAM_END || ferror(idx->f))
        st = gz_failure(idx, &z, ret, read_bytes, have);
    inflateEnd(&z);
    uint8_t *fit = realloc(idx->mem, have ? have : 1); /* give back the doubling's slack */
    if (fit)
        idx->mem = fit;
    idx->file_bytes = have;
    return st;
}

/* Opens path and records its size; a path ending in .gz is unpacked into memory. DDP_ERR_IO (logged)
 * when it is missing, unreadable or not a regular file; DDP_ERR_FORMAT when a .gz is not whole gzip
 * data. O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
static ddp_status idx_open(const char *path, idx_file *idx)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    idx->path = path;
    idx->fix = is_gz(path) ? MNIST_GZ_FIX : MNIST_FIX;
    idx->f = NULL;
    if (fd < 0 || fstat(fd, &st) != 0) {
        DDP_ERROR("%s: cannot open: %s; %s", path, strerror(errno), idx->fix);
    } else if (!S_ISREG(st.st_mode)) {
        DDP_ERROR("%s: not a regular file; %s", path, idx->fix);
    } else if (!(idx->f = fdopen(fd, "rb"))) {
        DDP_ERROR("%s: cannot open: %s", path, strerror(errno));
    }
    if (!idx->f) {
        if (fd >= 0)
            close(fd);
        return DDP_ERR_IO;
    }
    idx->file_bytes = (uint64_t)st.st_size;
    return is_gz(path) ? idx_gunzip(idx) : DDP_OK;
}

static void idx_close(idx_file *idx)
{
    if (idx->f)
        fclose(idx->f);
    free(idx->mem);
    idx->f = NULL;
    idx->mem = NULL;
}

/* Reads up to n bytes at the read position (of the file, or of mem for a gzip'ed one). */
static size_t idx_read(idx_file *idx, void *buf, size_t n)
{
    if (!idx->mem)
        return fread(buf, 1, n, idx->f);
    uint64_t left = idx->file_bytes - idx->pos;
    n = n < left ? n : (size_t)left;
    memcpy(buf, idx->mem + idx->pos, n);
    idx->pos += n;
    return n;
}

/* Reads n_words big-endian 32-bit header words; the first must be `magic`. */
static ddp_status idx_header(idx_file *idx, uint32_t magic, uint32_t *words, int n_words)
{
    unsigned char buf[16];
    size_t n_bytes = (size_t)n_words * 4;
    if (idx->file_bytes < n_bytes || idx_read(idx, buf, n_bytes) != n_bytes) {
        DDP_ERROR("%s: truncated: %llu bytes is shorter than the %zu-byte IDX header; %s", idx->path,
                  (unsigned long long)idx->file_bytes, n_bytes, idx->fix);
        return DDP_ERR_FORMAT;
    }
    for (int i = 0; i < n_words; i++)
        words[i] = be32(buf + 4 * i);
    if (words[0] != magic) {
        DDP_ERROR("%s: bad magic number 0x%08x, expected 0x%08x (%s); is it a gzip'ed or wrong file? %s",
                  idx->path, words[0], magic, magic == MNIST_IDX_IMAGES_MAGIC ? "idx3-ubyte images"
                  : "idx1-ubyte labels", idx->fix);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* Checks that the file is exactly header + body bytes long; `what` describes the header's claim. */
static ddp_status idx_check_size(const idx_file *idx, uint64_t expect_bytes, const char *what)
{
    if (idx->file_bytes == expect_bytes)
        return DDP_OK;
    DDP_ERROR("%s: %s: header says %s (%llu bytes) but the file has %llu bytes%s; %s", idx->path,
              idx->file_bytes < expect_bytes ? "truncated" : "extra bytes at the end", what,
              (unsigned long long)expect_bytes, (unsigned long long)idx->file_bytes,
              idx->mem ? " unpacked" : "", idx->fix);
    return DDP_ERR_FORMAT;
}

/* Reads the body (n_bytes) into a new buffer *out. A gzip'ed file hands over its unpacked bytes,
 * moved to the front, instead of a copy (the size check before guarantees n_bytes are left). */
static ddp_status idx_body(idx_file *idx, size_t n_bytes, uint8_t **out)
{
    if (idx->mem) {
        memmove(idx->mem, idx->mem + idx->pos, n_bytes);
        *out = idx->mem;
        idx->mem = NULL;
        return DDP_OK;
    }
    uint8_t *buf = malloc(n_bytes ? n_bytes : 1);
    if (!buf) {
        DDP_ERROR("%s: out of memory for %zu bytes", idx->path, n_bytes);
        return DDP_ERR_NOMEM;
    }
    if (fread(buf, 1, n_bytes, idx->f) != n_bytes) {
        DDP_ERROR("%s: read error: %s; %s", idx->path, strerror(errno), idx->fix);
        free(buf);
        return DDP_ERR_IO;
    }
    *out = buf;
    return DDP_OK;
}

/* Images file: magic, count, rows, cols (must be 28 x 28), then count*rows*cols bytes. */
static ddp_status mnist_read_images(idx_file *idx, mnist *d)
{
    uint32_t h[4];
    ddp_status st = idx_header(idx, MNIST_IDX_IMAGES_MAGIC, h, 4);
    if (st != DDP_OK)
        return st;
    if (h[2] != MNIST_SIDE || h[3] != MNIST_SIDE) {
        DDP_ERROR("%s: images are %ux%u, but these models need 28x28 MNIST images; %s", idx->path,
                  h[2], h[3], idx->fix);
        return DDP_ERR_FORMAT;
    }
    char what[96];
    snprintf(what, sizeof what, "%u images of %ux%u", h[1], h[2], h[3]);
    uint64_t body = (uint64_t)h[1] * h[2] * h[3];
    st = idx_check_size(idx, 16 + body, what);
    if (st != DDP_OK)
        return st;
    d->n = h[1];
    d->rows = (int)h[2];
    d->cols = (int)h[3];
    return idx_body(idx, (size_t)body, &d->images);
}

/* Labels file: magic, count, then count bytes each in 0..9. */
static ddp_status mnist_read_labels(idx_file *idx, size_t *n, uint8_t **labels)
{
    uint32_t h[2];
    ddp_status st = idx_header(idx, MNIST_IDX_LABELS_MAGIC, h, 2);
    if (st != DDP_OK)
        return st;
    char what[64];
    snprintf(what, sizeof what, "%u labels", h[1]);
    st = idx_check_size(idx, 8 + (uint64_t)h[1], what);
    if (st != DDP_OK)
        return st;
    st = idx_body(idx, h[1], labels);
    if (st != DDP_OK)
        return st;
    for (uint32_t i = 0; i < h[1]; i++) {
        if ((*labels)[i] >= MNIST_CLASSES) {
            DDP_ERROR("%s: label %u of sample %u is outside 0..9; %s", idx->path, (*labels)[i], i,
                      idx->fix);
            free(*labels);
            *labels = NULL;
            return DDP_ERR_FORMAT;
        }
    }
    *n = h[1];
    return DDP_OK;
}

/* Reads both files into d (partially filled on failure; the caller frees). */
static ddp_status mnist_read_pair(const char *images_path, const char *labels_path, mnist *d)
{
    idx_file img = {0}, lab = {0};
    size_t n_labels = 0;
    ddp_status st = idx_open(images_path, &img);
    if (st == DDP_OK)
        st = mnist_read_images(&img, d);
    if (st == DDP_OK)
        st = idx_open(labels_path, &lab);
    if (st == DDP_OK)
        st = mnist_read_labels(&lab, &n_labels, &d->labels);
    if (st == DDP_OK && n_labels != d->n) {
        DDP_ERROR("%s has %zu images but %s has %zu labels: the files do not belong together; %s",
                  images_path, d->n, labels_path, n_labels, lab.fix);
        st = DDP_ERR_FORMAT;
    }
    idx_close(&img);
    idx_close(&lab);
    return st;
}

ddp_status mnist_load(const char *images_path, const char *labels_path, mnist *out)
{
    mnist d = {0};
    if (!images_path || !labels_path || !out)
        return DDP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    ddp_status st = mnist_read_pair(images_path, labels_path, &d);
    if (st != DDP_OK) {
        mnist_free(&d);
        return st;
    }
    *out = d;
    return DDP_OK;
}

/* The path of dir/NAME, or of dir/NAME.gz when NAME is absent and NAME.gz is there; NULL (logged)
 * when out of memory. The caller frees it. */
static char *mnist_path(const char *dir, const char *split, const char *kind)
{
    struct stat st;
    size_t n_bytes = strlen(dir) + strlen(split) + strlen(kind) + 8;
    char *path = malloc(n_bytes);
    if (!path) {
        DDP_ERROR("out of memory for a path in %s", dir);
        return NULL;
    }
    snprintf(path, n_bytes, "%s/%s-%s.gz", dir, split, kind);
    int have_gz = stat(path, &st) == 0;
    path[strlen(path) - 3] = '\0';
    if (have_gz && stat(path, &st) != 0 && errno == ENOENT)
        strcat(path, ".gz");
    return path;
}

ddp_status mnist_load_dir(const char *dir, const char *split, mnist *out)
{
    struct stat st;
    if (!dir || !split || !out)
        return DDP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (strcmp(split, "train") != 0 && strcmp(split, "t10k") != 0) {
        DDP_ERROR("unknown MNIST split '%s' (expected train or t10k)", split);
        return DDP_ERR_INVALID_ARG;
    }
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            DDP_ERROR("%s: no such folder; run scripts/fetch-mnist.sh %s or pass --data", dir, dir);
        else
            DDP_ERROR("%s: cannot open the folder: %s", dir, strerror(errno));
        return DDP_ERR_IO;
    }
    if (!S_ISDIR(st.st_mode)) {
        DDP_ERROR("%s: exists but is not a folder; pass --data the folder that holds the IDX files "
                  "(scripts/fetch-mnist.sh DIR fills one)", dir);
        return DDP_ERR_IO;
    }
    char *images = mnist_path(dir, split, "images-idx3-ubyte");
    char *labels = mnist_path(dir, split, "labels-idx1-ubyte");
    ddp_status s = images && labels ? mnist_load(images, labels, out) : DDP_ERR_NOMEM;
    free(images);
    free(labels);
    return s;
}

void mnist_free(mnist *d)
{
    if (!d)
        return;
    free(d->images);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

void mnist_gather(const mnist *d, const size_t *idx, int n, float *x, int *y)
{
    const float mean = 0.1307f, std = 0.3081f;
    size_t pixels = (size_t)d->rows * (size_t)d->cols;
    for (int i = 0; i < n; i++) {
        const uint8_t *src = d->images + idx[i] * pixels;
        float *dst = x + (size_t)i * pixels;
        for (size_t p = 0; p < pixels; p++)
            dst[p] = ((float)src[p] / 255.0f - mean) / std;
        y[i] = d->labels[idx[i]];
    }
}
