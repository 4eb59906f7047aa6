/* fuzz_checkpoint.c - libFuzzer harness: ddp_checkpoint_load (runtime/checkpoint.c) on any file.
 *
 * Input: one mode byte, then the file. A random file almost never carries a valid CRC-32, which
 * the reader checks before it looks at the parameter records: with mode bit 0 set, the harness
 * rewrites the last 4 bytes as the CRC-32 of the bytes before them, so the fuzzer reaches the
 * checks behind it. Besides the sanitizers' checks: an accepted file gives at least one parameter,
 * each with a NUL-terminated name and 0..DDP_MAX_DIMS non-negative dimensions, and every value
 * can be read; a refusal leaves the outputs unset. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "ddp_checkpoint.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int ckpt_fd = -1;
static volatile float value_sink; /* every loaded value is read into it */

/* Checks every descriptor and reads every value (ASan then checks the buffer is that long). */
static void check_loaded(const ddp_param_desc *descs, int n_params, const float *params)
{
    if (n_params < 1)
        abort();
    for (int i = 0; i < n_params; i++) {
        const ddp_param_desc *d = &descs[i];
        if (!memchr(d->name, 0, DDP_NAME_MAX) || d->n_dims < 0 || d->n_dims > DDP_MAX_DIMS)
            abort();
        size_t numel = 1;
        for (int k = 0; k < d->n_dims; k++) {
            if (d->shape[k] < 0)
                abort();
            numel *= (size_t)d->shape[k];
        }
        for (size_t e = 0; e < numel; e++)
            value_sink = params[e];
        params += numel;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    ddp_param_desc *descs = NULL;
    float *params = NULL;
    int n_params = -1;
    if (size < 1)
        return 0;
    uint8_t *file = malloc(size - 1 + 1);
    if (!file)
        return 0;
    memcpy(file, data + 1, size - 1);
    size_t n = size - 1;
    if ((data[0] & 1) && n >= 4) {
        uint32_t crc = (uint32_t)crc32(0L, file, (uInt)(n - 4));
        for (int i = 0; i < 4; i++)
            file[n - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
    }
    fuzz_input_file(&ckpt_fd, "checkpoint", file, n, path, sizeof path);
    if (ddp_checkpoint_load(path, &descs, &n_params, &params) == DDP_OK) {
        check_loaded(descs, n_params, params);
        free(descs);
        free(params);
    } else if (descs || params || n_params != -1) {
        abort();
    }
    free(file);
    return 0;
}
