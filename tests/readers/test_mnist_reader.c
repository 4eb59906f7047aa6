/* test_mnist_reader.c - the MNIST IDX reader on small files written here: valid data, normalisation,
 * gzip'ed files (NAME.gz) read as the plain ones, and each kind of bad input giving the documented
 * status and a message that names the problem. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

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

static void test_path(char *path, size_t len, const char *name)
{
    snprintf(path, len, "%s/%s", test_dir, name);
}

/* Reads test_dir/name whole into a new buffer; *n its size. */
static unsigned char *read_whole(const char *name, size_t *n)
{
    char path[512];
    test_path(path, sizeof path, name);
    FILE *f = fopen(path, "rb");
    unsigned char *buf = malloc(64 * 1024);
    *n = f && buf ? fread(buf, 1, 64 * 1024, f) : 0;
    if (f)
        fclose(f);
    return buf;
}

/* Replaces test_dir/name by test_dir/name.gz, written by zlib's gzwrite in gzip members of
 * member_bytes unpacked bytes (the last one shorter), then cut to its first keep_bytes (0: whole)
 * and with 4 bytes in the middle inverted when flip. */
static void gzip_file(const char *name, size_t member_bytes, size_t keep_bytes, int flip)
{
    char path[512], gz[600], gz_name[64];
    size_t n, gz_bytes;
    unsigned char *data = read_whole(name, &n);
    test_path(path, sizeof path, name);
    snprintf(gz_name, sizeof gz_name, "%s.gz", name);
    test_path(gz, sizeof gz, gz_name);
    remove(gz);
    for (size_t at = 0; at < n; at += member_bytes) {
        unsigned len = (unsigned)(n - at < member_bytes ? n - at : member_bytes);
        gzFile z = gzopen(gz, "ab9");
        CHECK(z && gzwrite(z, data + at, len) == (int)len && gzclose(z) == Z_OK, "gzip %s", name);
    }
    free(data);
    remove(path);
    data = read_whole(gz_name, &gz_bytes);
    gz_bytes = keep_bytes ? keep_bytes : gz_bytes;
    for (size_t i = 0; flip && i < 4; i++)
        data[gz_bytes / 2 + i] ^= 0xff;
    FILE *f = fopen(gz, "wb");
    fwrite(data, 1, gz_bytes, f);
    fclose(f);
    free(data);
}

/* Loads split "train" of dir with stderr captured into `captured`. */
static ddp_status load_captured(const char *dir, mnist *d)
{
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", test_dir);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    ddp_status st = mnist_load_dir(dir, "train", d);
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
    mnist d;
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
    mnist d;
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
    mnist_gather(&d, idx, 2, x, y);
    float want = ((float)((3 * 7 + 10) % 256) / 255.0f - 0.1307f) / 0.3081f;
    CHECK_CLOSE(x[10], want, 1e-6, 1e-6, "normalised pixel");
    CHECK_CLOSE(x[PIXELS], (7.0f / 255.0f - 0.1307f) / 0.3081f, 1e-6, 1e-6, "second sample pixel 0");
    CHECK(y[0] == 3 && y[1] == 1, "gathered labels %d %d", y[0], y[1]);
    mnist_free(&d);
    CHECK(d.images == NULL && d.n == 0, "free zeroes");
    mnist_free(NULL);
}

/* Gzip'ed files read as the plain ones (one member or several); NAME wins over NAME.gz. */
static void test_gzip(void)
{
    mnist plain, packed;
    write_valid();
    CHECK(load_captured(test_dir, &plain) == DDP_OK, "plain folder: %s", captured);
    gzip_file("train-images-idx3-ubyte", 1000, 0, 0); /* 3,936 bytes: 4 members */
    gzip_file("train-labels-idx1-ubyte", 1000, 0, 0);
    ddp_status st = load_captured(test_dir, &packed);
    CHECK(st == DDP_OK, "gzip'ed folder: %s (%s)", ddp_strerror(st), captured);
    if (st == DDP_OK) {
        CHECK(packed.n == plain.n && packed.rows == SIDE && packed.cols == SIDE, "gzip'ed shape %zu", packed.n);
        CHECK(memcmp(packed.images, plain.images, plain.n * PIXELS) == 0, "gzip'ed images equal the plain");
        CHECK(memcmp(packed.labels, plain.labels, plain.n) == 0, "gzip'ed labels equal the plain");
    }
    mnist_free(&packed);
    mnist_free(&plain);
    /* The .gz says the last label is 7, the plain file says 4: the plain one is read while it is there. */
    write_labels("train-labels-idx1-ubyte", 0x801, N_SAMPLES, 7);
    gzip_file("train-labels-idx1-ubyte", 1 << 20, 0, 0);
    write_labels("train-labels-idx1-ubyte", 0x801, N_SAMPLES, 4);
    for (int with_plain = 1; with_plain >= 0; with_plain--) {
        char path[512];
        test_path(path, sizeof path, "train-labels-idx1-ubyte");
        if (!with_plain)
            remove(path);
        st = load_captured(test_dir, &packed);
        int want = with_plain ? 4 : 7;
        CHECK(st == DDP_OK && packed.labels[N_SAMPLES - 1] == want, "%s: last label %d, want %d (%s)",
              with_plain ? "NAME and NAME.gz" : "NAME.gz only", st == DDP_OK ? packed.labels[N_SAMPLES - 1] : -1,
              want, captured);
        mnist_free(&packed);
    }
    write_valid();
}

/* A truncated, corrupt or non-gzip .gz: DDP_ERR_FORMAT, the file and the problem named. */
static void test_bad_gzip(void)
{
    const char *images = "train-images-idx3-ubyte";
    gzip_file(images, 1 << 20, 40, 0);
    expect_failure("truncated .gz", DDP_ERR_FORMAT,
                   (const char *const[]){"train-images-idx3-ubyte.gz: truncated gzip stream", "gunzip -t", NULL});
    gzip_file(images, 1 << 20, 0, 1);
    expect_failure("corrupt .gz", DDP_ERR_FORMAT,
                   (const char *const[]){"train-images-idx3-ubyte.gz: corrupt gzip data", "zlib: ", NULL});
    char path[512], gz[512];
    test_path(path, sizeof path, images);
    test_path(gz, sizeof gz, "train-images-idx3-ubyte.gz");
    rename(path, gz);
    expect_failure("plain data named .gz", DDP_ERR_FORMAT,
                   (const char *const[]){"train-images-idx3-ubyte.gz: corrupt gzip data", "incorrect header check",
                                         NULL});
    /* Whole gzip data whose unpacked IDX is short: the IDX check, on the unpacked size. */
    write_images(images, 0x803, 8000, SIDE, N_SAMPLES);
    gzip_file(images, 1 << 20, 0, 0);
    expect_failure("short IDX in a .gz", DDP_ERR_FORMAT,
                   (const char *const[]){"train-images-idx3-ubyte.gz: truncated", "8000 images", "unpacked",
                                         "re-download", NULL});
    remove(gz);
}

static void test_bad_inputs(void)
{
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope", test_dir);
    mnist d;
    CHECK(load_captured(missing, &d) == DDP_ERR_IO, "missing folder status");
    CHECK(strstr(captured, "no such folder") && strstr(captured, "fetch-mnist.sh") && strstr(captured, missing),
          "missing folder message: %s", captured);
    char file[300];
    snprintf(file, sizeof file, "%s/train-images-idx3-ubyte", test_dir);
    CHECK(load_captured(file, &d) == DDP_ERR_IO, "a file as the folder: status");
    CHECK(strstr(captured, file) && strstr(captured, ": exists but is not a folder"), "a file as the folder: %s",
          captured);

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
    test_gzip();
    test_bad_gzip();
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "stderr.txt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", test_dir, names[i]);
        remove(path);
    }
    rmdir(test_dir);
    return CHECK_DONE();
}
