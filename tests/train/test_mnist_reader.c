/* test_mnist_reader.c - the MNIST IDX reader on small files written here: valid data, normalisation,
 * and each kind of bad input giving the documented status and a message that names the problem. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ddp.h"
#include "mnist.h"

#define N_SAMPLES 5
#define SIDE 28
#define PIXELS (SIDE * SIDE)

static char test_dir[256];
static char captured[4096]; /* stderr of the last call made under capture */

static void put_be32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* Images file: header (magic, n_header, rows, cols), then n_body images where pixel p of image i
 * is (i * 7 + p) % 256. */
static void write_images(const char *name, uint32_t magic, uint32_t n_header, uint32_t rows,
                         uint32_t n_body)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    FILE *f = fopen(path, "wb");
    put_be32(f, magic);
    put_be32(f, n_header);
    put_be32(f, rows);
    put_be32(f, SIDE);
    for (uint32_t i = 0; i < n_body * rows * SIDE; i++)
        fputc((int)(((i / PIXELS) * 7 + i % PIXELS) % 256), f);
    fclose(f);
}

/* Labels file: header (magic, n), then labels i % 10, except the last, set to last_label. */
static void write_labels(const char *name, uint32_t magic, uint32_t n, int last_label)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    FILE *f = fopen(path, "wb");
    put_be32(f, magic);
    put_be32(f, n);
    for (uint32_t i = 0; i < n; i++)
        fputc(i + 1 == n ? last_label : (int)(i % 10), f);
    fclose(f);
}

/* The four files of a valid folder. */
static void write_valid(void)
{
    write_images("train-images-idx3-ubyte", 0x803, N_SAMPLES, SIDE, N_SAMPLES);
    write_labels("train-labels-idx1-ubyte", 0x801, N_SAMPLES, (N_SAMPLES - 1) % 10);
    write_images("t10k-images-idx3-ubyte", 0x803, 3, SIDE, 3);
    write_labels("t10k-labels-idx1-ubyte", 0x801, 3, 2);
}

/* Loads split "train" of dir with stderr captured into `captured`. */
static ddp_status load_captured(const char *dir, ddp_mnist *d)
{
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", test_dir);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    ddp_status st = ddp_mnist_load_dir(dir, "train", d);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    FILE *f = fopen(path, "r");
    size_t n = fread(captured, 1, sizeof captured - 1, f);
    captured[n] = '\0';
    fclose(f);
    return st;
}

/* Expects failure `want` with a message containing every one of the NULL-terminated words. */
static void expect_failure(const char *what, ddp_status want, const char *const *words)
{
    ddp_mnist d;
    memset(&d, 0xab, sizeof d);
    ddp_status st = load_captured(test_dir, &d);
    CHECK(st == want, "%s: status %s, want %s", what, ddp_strerror(st), ddp_strerror(want));
    CHECK(d.n == 0 && d.images == NULL && d.labels == NULL, "%s: output not zeroed", what);
    for (int i = 0; words[i]; i++)
        CHECK(strstr(captured, words[i]) != NULL, "%s: message lacks '%s': %s", what, words[i], captured);
    write_valid();
}

static void test_valid(void)
{
    ddp_mnist d;
    write_valid();
    ddp_status st = load_captured(test_dir, &d);
    CHECK(st == DDP_OK, "valid folder: %s (%s)", ddp_strerror(st), captured);
    if (st != DDP_OK)
        return;
    CHECK(d.n == N_SAMPLES && d.rows == SIDE && d.cols == SIDE, "shape %zu x %d x %d", d.n, d.rows, d.cols);
    CHECK(d.images[3 * PIXELS + 10] == (3 * 7 + 10) % 256, "pixel value %d", d.images[3 * PIXELS + 10]);
    CHECK(d.labels[2] == 2, "label %d", d.labels[2]);
    size_t idx[2] = {3, 1};
    float x[2 * PIXELS];
    int y[2];
    ddp_mnist_gather(&d, idx, 2, x, y);
    float want = ((float)((3 * 7 + 10) % 256) / 255.0f - 0.1307f) / 0.3081f;
    CHECK_CLOSE(x[10], want, 1e-6, 1e-6, "normalised pixel");
    CHECK_CLOSE(x[PIXELS], (7.0f / 255.0f - 0.1307f) / 0.3081f, 1e-6, 1e-6, "second sample pixel 0");
    CHECK(y[0] == 3 && y[1] == 1, "gathered labels %d %d", y[0], y[1]);
    ddp_mnist_free(&d);
    CHECK(d.images == NULL && d.n == 0, "free zeroes");
    ddp_mnist_free(NULL);
}

static void test_bad_inputs(void)
{
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope", test_dir);
    ddp_mnist d;
    CHECK(load_captured(missing, &d) == DDP_ERR_IO, "missing folder status");
    CHECK(strstr(captured, "no such folder") && strstr(captured, "fetch-mnist.sh") && strstr(captured, missing),
          "missing folder message: %s", captured);

    write_images("train-images-idx3-ubyte", 0x1f8b0808, N_SAMPLES, SIDE, N_SAMPLES);
    expect_failure("wrong magic", DDP_ERR_FORMAT,
                   (const char *const[]){"train-images-idx3-ubyte", "magic", "fetch-mnist.sh", NULL});
    write_images("train-images-idx3-ubyte", 0x803, 8000, SIDE, N_SAMPLES);
    expect_failure("truncated", DDP_ERR_FORMAT,
                   (const char *const[]){"train-images-idx3-ubyte", "truncated", "8000 images", NULL});
    write_images("train-images-idx3-ubyte", 0x803, 2, SIDE, N_SAMPLES);
    expect_failure("extra bytes", DDP_ERR_FORMAT, (const char *const[]){"extra bytes", NULL});
    write_images("train-images-idx3-ubyte", 0x803, N_SAMPLES, 32, N_SAMPLES);
    expect_failure("wrong size", DDP_ERR_FORMAT, (const char *const[]){"32x28", "28x28", NULL});
    write_labels("train-labels-idx1-ubyte", 0x801, N_SAMPLES - 1, 1);
    expect_failure("count mismatch", DDP_ERR_FORMAT,
                   (const char *const[]){"5 images", "4 labels", "train-labels-idx1-ubyte", NULL});
    write_labels("train-labels-idx1-ubyte", 0x801, N_SAMPLES, 10);
    expect_failure("label out of range", DDP_ERR_FORMAT,
                   (const char *const[]){"label 10", "0..9", "train-labels-idx1-ubyte", NULL});
    write_labels("train-labels-idx1-ubyte", 0x803, N_SAMPLES, 1);
    expect_failure("labels magic", DDP_ERR_FORMAT, (const char *const[]){"labels", "magic", NULL});
    char path[512];
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", test_dir);
    remove(path);
    expect_failure("missing file", DDP_ERR_IO,
                   (const char *const[]){"train-labels-idx1-ubyte", "fetch-mnist.sh", NULL});
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(test_dir, sizeof test_dir, "%s/ddp-mnist-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(test_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_valid();
    test_bad_inputs();
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte", "stderr.txt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", test_dir, names[i]);
        remove(path);
    }
    rmdir(test_dir);
    return CHECK_DONE();
}
