/* mnist.c - MNIST IDX reader: validates magic, dimensions, counts, file sizes and labels. */
#include "mnist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DDP_IDX_IMAGES_MAGIC 0x00000803u
#define DDP_IDX_LABELS_MAGIC 0x00000801u
#define DDP_MNIST_SIDE 28
#define DDP_MNIST_CLASSES 10
#define DDP_MNIST_FIX "re-run scripts/fetch-mnist.sh"

/* One open IDX file: its path, stream and size in bytes. */
typedef struct ddp_idx_file {
    const char *path;
    FILE *f;
    uint64_t file_bytes;
} ddp_idx_file;

static uint32_t ddp_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Opens path and records its size. DDP_ERR_IO (logged) when it is missing, unreadable or not a
 * regular file. O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
static ddp_status ddp_idx_open(const char *path, ddp_idx_file *idx)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    idx->path = path;
    idx->f = NULL;
    if (fd < 0 || fstat(fd, &st) != 0) {
        DDP_ERROR("%s: cannot open: %s; %s", path, strerror(errno), DDP_MNIST_FIX);
    } else if (!S_ISREG(st.st_mode)) {
        DDP_ERROR("%s: not a regular file; %s", path, DDP_MNIST_FIX);
    } else if (!(idx->f = fdopen(fd, "rb"))) {
        DDP_ERROR("%s: cannot open: %s", path, strerror(errno));
    }
    if (!idx->f) {
        if (fd >= 0)
            close(fd);
        return DDP_ERR_IO;
    }
    idx->file_bytes = (uint64_t)st.st_size;
    return DDP_OK;
}

/* Reads n_words big-endian 32-bit header words; the first must be `magic`. */
static ddp_status ddp_idx_header(ddp_idx_file *idx, uint32_t magic, uint32_t *words, int n_words)
{
    unsigned char buf[16];
    size_t n_bytes = (size_t)n_words * 4;
    if (idx->file_bytes < n_bytes || fread(buf, 1, n_bytes, idx->f) != n_bytes) {
        DDP_ERROR("%s: truncated: %llu bytes is shorter than the %zu-byte IDX header; %s", idx->path,
                  (unsigned long long)idx->file_bytes, n_bytes, DDP_MNIST_FIX);
        return DDP_ERR_FORMAT;
    }
    for (int i = 0; i < n_words; i++)
        words[i] = ddp_be32(buf + 4 * i);
    if (words[0] != magic) {
        DDP_ERROR("%s: bad magic number 0x%08x, expected 0x%08x (%s); is it a gzip'ed or wrong file? %s",
                  idx->path, words[0], magic, magic == DDP_IDX_IMAGES_MAGIC ? "idx3-ubyte images"
                  : "idx1-ubyte labels", DDP_MNIST_FIX);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* Checks that the file is exactly header + body bytes long; `what` describes the header's claim. */
static ddp_status ddp_idx_check_size(const ddp_idx_file *idx, uint64_t expect_bytes, const char *what)
{
    if (idx->file_bytes == expect_bytes)
        return DDP_OK;
    DDP_ERROR("%s: %s: header says %s (%llu bytes) but the file has %llu bytes; %s", idx->path,
              idx->file_bytes < expect_bytes ? "truncated" : "extra bytes at the end", what,
              (unsigned long long)expect_bytes, (unsigned long long)idx->file_bytes, DDP_MNIST_FIX);
    return DDP_ERR_FORMAT;
}

/* Reads the body (n_bytes) into a new buffer *out. */
static ddp_status ddp_idx_body(ddp_idx_file *idx, size_t n_bytes, uint8_t **out)
{
    uint8_t *buf = malloc(n_bytes ? n_bytes : 1);
    if (!buf) {
        DDP_ERROR("%s: out of memory for %zu bytes", idx->path, n_bytes);
        return DDP_ERR_NOMEM;
    }
    if (fread(buf, 1, n_bytes, idx->f) != n_bytes) {
        DDP_ERROR("%s: read error: %s; %s", idx->path, strerror(errno), DDP_MNIST_FIX);
        free(buf);
        return DDP_ERR_IO;
    }
    *out = buf;
    return DDP_OK;
}

/* Images file: magic, count, rows, cols (must be 28 x 28), then count*rows*cols bytes. */
static ddp_status ddp_mnist_read_images(ddp_idx_file *idx, ddp_mnist *d)
{
    uint32_t h[4];
    ddp_status st = ddp_idx_header(idx, DDP_IDX_IMAGES_MAGIC, h, 4);
    if (st != DDP_OK)
        return st;
    if (h[2] != DDP_MNIST_SIDE || h[3] != DDP_MNIST_SIDE) {
        DDP_ERROR("%s: images are %ux%u, but these models need 28x28 MNIST images; %s", idx->path,
                  h[2], h[3], DDP_MNIST_FIX);
        return DDP_ERR_FORMAT;
    }
    char what[96];
    snprintf(what, sizeof what, "%u images of %ux%u", h[1], h[2], h[3]);
    uint64_t body = (uint64_t)h[1] * h[2] * h[3];
    st = ddp_idx_check_size(idx, 16 + body, what);
    if (st != DDP_OK)
        return st;
    d->n = h[1];
    d->rows = (int)h[2];
    d->cols = (int)h[3];
    return ddp_idx_body(idx, (size_t)body, &d->images);
}

/* Labels file: magic, count, then count bytes each in 0..9. */
static ddp_status ddp_mnist_read_labels(ddp_idx_file *idx, size_t *n, uint8_t **labels)
{
    uint32_t h[2];
    ddp_status st = ddp_idx_header(idx, DDP_IDX_LABELS_MAGIC, h, 2);
    if (st != DDP_OK)
        return st;
    char what[64];
    snprintf(what, sizeof what, "%u labels", h[1]);
    st = ddp_idx_check_size(idx, 8 + (uint64_t)h[1], what);
    if (st != DDP_OK)
        return st;
    st = ddp_idx_body(idx, h[1], labels);
    if (st != DDP_OK)
        return st;
    for (uint32_t i = 0; i < h[1]; i++) {
        if ((*labels)[i] >= DDP_MNIST_CLASSES) {
            DDP_ERROR("%s: label %u of sample %u is outside 0..9; %s", idx->path, (*labels)[i], i,
                      DDP_MNIST_FIX);
            free(*labels);
            *labels = NULL;
            return DDP_ERR_FORMAT;
        }
    }
    *n = h[1];
    return DDP_OK;
}

/* Reads both files into d (partially filled on failure; the caller frees). */
static ddp_status ddp_mnist_read_pair(const char *images_path, const char *labels_path, ddp_mnist *d)
{
    ddp_idx_file img = {0}, lab = {0};
    size_t n_labels = 0;
    ddp_status st = ddp_idx_open(images_path, &img);
    if (st == DDP_OK)
        st = ddp_mnist_read_images(&img, d);
    if (st == DDP_OK)
        st = ddp_idx_open(labels_path, &lab);
    if (st == DDP_OK)
        st = ddp_mnist_read_labels(&lab, &n_labels, &d->labels);
    if (st == DDP_OK && n_labels != d->n) {
        DDP_ERROR("%s has %zu images but %s has %zu labels: the files do not belong together; %s",
                  images_path, d->n, labels_path, n_labels, DDP_MNIST_FIX);
        st = DDP_ERR_FORMAT;
    }
    if (img.f)
        fclose(img.f);
    if (lab.f)
        fclose(lab.f);
    return st;
}

ddp_status ddp_mnist_load(const char *images_path, const char *labels_path, ddp_mnist *out)
{
    ddp_mnist d = {0};
    if (!images_path || !labels_path || !out)
        return DDP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    ddp_status st = ddp_mnist_read_pair(images_path, labels_path, &d);
    if (st != DDP_OK) {
        ddp_mnist_free(&d);
        return st;
    }
    *out = d;
    return DDP_OK;
}

ddp_status ddp_mnist_load_dir(const char *dir, const char *split, ddp_mnist *out)
{
    struct stat st;
    if (!dir || !split || !out)
        return DDP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (strcmp(split, "train") != 0 && strcmp(split, "t10k") != 0) {
        DDP_ERROR("unknown MNIST split '%s' (expected train or t10k)", split);
        return DDP_ERR_INVALID_ARG;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        DDP_ERROR("%s: no such folder; run scripts/fetch-mnist.sh %s or pass --data", dir, dir);
        return DDP_ERR_IO;
    }
    size_t n_bytes = strlen(dir) + 32;
    char *images = malloc(n_bytes), *labels = malloc(n_bytes);
    ddp_status s = DDP_ERR_NOMEM;
    if (images && labels) {
        snprintf(images, n_bytes, "%s/%s-images-idx3-ubyte", dir, split);
        snprintf(labels, n_bytes, "%s/%s-labels-idx1-ubyte", dir, split);
        s = ddp_mnist_load(images, labels, out);
    }
    free(images);
    free(labels);
    return s;
}

void ddp_mnist_free(ddp_mnist *d)
{
    if (!d)
        return;
    free(d->images);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

void ddp_mnist_gather(const ddp_mnist *d, const size_t *idx, int n, float *x, int *y)
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
