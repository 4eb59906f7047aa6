/* fuzz_idx.c - libFuzzer harness: the MNIST IDX reader (models/mnist.c) on any pair of files.
 *
 * Input: a little-endian u16 k, then the images file (the next k bytes, fewer when the input is
 * shorter), then the labels file (the rest). Besides the sanitizers' checks: an accepted pair has
 * 28x28 images, as many labels as images, every label in 0..9, and every sample can be gathered. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "mnist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int images_fd = -1, labels_fd = -1;

/* Gathers every sample (so out-of-bounds pixels or labels would be read) and checks the labels. */
static void check_data(const ddp_mnist *d)
{
    size_t pixels = (size_t)d->rows * (size_t)d->cols;
    float *x = malloc(pixels * sizeof *x);
    int y;
    if (d->rows != 28 || d->cols != 28 || !x)
        abort();
    for (size_t i = 0; i < d->n; i++) {
        ddp_mnist_gather(d, &i, 1, x, &y);
        if (y < 0 || y > 9)
            abort();
    }
    free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char images[64], labels[64];
    ddp_mnist d;
    if (size < 2)
        return 0;
    size_t k = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (k > size)
        k = size;
    ddp_fuzz_file(&images_fd, "images", data, k, images, sizeof images);
    ddp_fuzz_file(&labels_fd, "labels", data + k, size - k, labels, sizeof labels);
    if (ddp_mnist_load(images, labels, &d) == DDP_OK) {
        check_data(&d);
        ddp_mnist_free(&d);
    } else if (d.images || d.labels || d.n) {
        abort();
    }
    return 0;
}
