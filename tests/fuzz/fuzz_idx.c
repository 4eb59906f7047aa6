/* fuzz_idx.c - libFuzzer harness: the MNIST IDX reader (readers/mnist.c) on any pair of files.
 *
 * Input: a mode byte, a little-endian u16 k, then the images file (the next k bytes, fewer when the
 * input is shorter), then the labels file (the rest). With mode bit 0 set, the harness appends to
 * the images file as many pixel bytes as its header claims (up to 64 KiB), so the fuzzer spends its
 * mutations on headers and labels rather than on 784 bytes per image. With mode bit 1 set, both
 * files are read as gzip data (the reader's .gz path: the harness names them images.gz and
 * labels.gz, symlinks to its memory files) and bit 0 is ignored. Besides the sanitizers' checks: an
 * accepted pair has 28x28 images, as many labels as images, every label in 0..9, and every sample
 * can be gathered. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_file.h"
#include "mnist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int images_fd = -1, labels_fd = -1;
static char gz_dir[512], images_gz[600], labels_gz[600]; /* the .gz names, made once */

static void gz_names_remove(void)
{
    unlink(images_gz);
    unlink(labels_gz);
    rmdir(gz_dir);
}

/* Makes images_gz and labels_gz: symlinks to the memory files' paths, in a private temporary folder
 * removed at exit. Aborts (a harness failure) when the folder or a link cannot be made. */
static void gz_names(const char *images, const char *labels)
{
    const char *tmp = getenv("TMPDIR");
    if (gz_dir[0])
        return;
    snprintf(gz_dir, sizeof gz_dir, "%s/ddp-fuzz-idx-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(gz_dir))
        abort();
    snprintf(images_gz, sizeof images_gz, "%s/images.gz", gz_dir);
    snprintf(labels_gz, sizeof labels_gz, "%s/labels.gz", gz_dir);
    atexit(gz_names_remove);
    if (symlink(images, images_gz) != 0 || symlink(labels, labels_gz) != 0)
        abort();
}

/* Gathers every sample (so out-of-bounds pixels or labels would be read) and checks the labels. */
static void check_data(const mnist *d)
{
    size_t pixels = (size_t)d->rows * (size_t)d->cols;
    float *x = malloc(pixels * sizeof *x);
    int y;
    if (d->rows != 28 || d->cols != 28 || !x)
        abort();
    for (size_t i = 0; i < d->n; i++) {
        mnist_gather(d, &i, 1, x, &y);
        if (y < 0 || y > 9)
            abort();
    }
    free(x);
}

/* The images file: the k given bytes, plus (when pad) the pixel bytes their header claims. */
static uint8_t *images_file(const uint8_t *data, size_t k, int pad, size_t *n)
{
    size_t claimed = 0;
    if (pad && k >= 16) {
        uint64_t count = (uint64_t)data[4] << 24 | (uint64_t)data[5] << 16 | data[6] << 8 | data[7];
        claimed = count * 784 <= 65536 ? (size_t)count * 784 : 0;
    }
    uint8_t *file = malloc(k + claimed + 1);
    if (!file)
        abort();
    memcpy(file, data, k);
    for (size_t i = 0; i < claimed; i++)
        file[k + i] = (uint8_t)(i * 7);
    *n = k + claimed;
    return file;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char images[64], labels[64];
    mnist d;
    if (size < 3)
        return 0;
    int gz = data[0] & 2, pad = !gz && (data[0] & 1);
    size_t k = (size_t)data[1] | (size_t)data[2] << 8, n_images;
    data += 3;
    size -= 3;
    if (k > size)
        k = size;
    uint8_t *file = images_file(data, k, pad, &n_images);
    fuzz_input_file(&images_fd, "images", file, n_images, images, sizeof images);
    fuzz_input_file(&labels_fd, "labels", data + k, size - k, labels, sizeof labels);
    if (gz)
        gz_names(images, labels);
    if (mnist_load(gz ? images_gz : images, gz ? labels_gz : labels, &d) == DDP_OK) {
        check_data(&d);
        mnist_free(&d);
    } else if (d.images || d.labels || d.n) {
        abort();
    }
    free(file);
    return 0;
}
