/* gpt2_llmc.c - llm.c's GPT-2 model files (gpt2.h): a header of 256 int32 (magic 20240326,
 * version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, Vp), then the parameters in the flat layout.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "ddp_checkpoint.h" /* DDP_CKPT_MAGIC: a ddp checkpoint given instead */
#include "gpt2_private.h"
#include "half.h"
#include "in_path.h"
#include "llmc_magic.h"

/* ---- header -------------------------------------------------------------------------------- */

/* Logs what a file with a wrong magic is, when it is a file of another kind we know. */
static void wrong_magic(const char *path, const int32_t *h)
{
    if (memcmp(h, DDP_CKPT_MAGIC, 8) == 0)
        DDP_ERROR("%s is a ddp checkpoint (ddp-train --save or --checkpoint-dir), not an llm.c "
                  "GPT-2 model file: ddp-train --init-from takes its weights as it is, --resume %s "
                  "continues its run, and ddp-ckpt export-llmc %s OUT.bin writes llm.c's format",
                  path, path, path);
    else if (h[0] == LLMC_TOKENS_MAGIC)
        DDP_ERROR("%s is an llm.c token shard (magic %d), not a model file: give token shards to "
                  "--data or --val-data", path, LLMC_TOKENS_MAGIC);
    else
        DDP_ERROR("%s: magic %d, want %d (not an llm.c GPT-2 model file)", path, (int)h[0],
                  GPT2_LLMC_MAGIC);
}

/* Reads and checks the header of an open file: its configuration and version. */
static ddp_status parse_header(FILE *f, const char *path, gpt2_config *cfg, int *version)
{
    int32_t h[GPT2_LLMC_HEADER];
    if (fread(h, sizeof h, 1, f) != 1) {
        DDP_ERROR("%s: shorter than llm.c's header of %d int32 (%zu bytes)", path, GPT2_LLMC_HEADER,
                  sizeof h);
        return DDP_ERR_FORMAT;
    }
    if (h[0] != GPT2_LLMC_MAGIC) {
        wrong_magic(path, h);
        return DDP_ERR_FORMAT;
    }
    if (h[1] != GPT2_LLMC_FP32 && h[1] != GPT2_LLMC_BF16) {
        DDP_ERROR("%s: version %d, want %d (fp32) or %d (bf16)", path, (int)h[1], GPT2_LLMC_FP32,
                  GPT2_LLMC_BF16);
        return DDP_ERR_FORMAT;
    }
    *version = h[1];
    *cfg = (gpt2_config){.max_seq = h[2], .vocab = h[3], .layers = h[4], .heads = h[5],
                         .channels = h[6], .padded_vocab = h[7]};
    if (cfg->padded_vocab == 0 || gpt2_config_check(cfg) != DDP_OK) {
        DDP_ERROR("%s: the header's sizes are invalid (maxT %d, V %d, L %d, NH %d, C %d, Vp %d)",
                  path, (int)h[2], (int)h[3], (int)h[4], (int)h[5], (int)h[6], (int)h[7]);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* DDP_ERR_FORMAT unless the file holds exactly the header and n elements of es bytes. */
static ddp_status check_size(FILE *f, const char *path, size_t n, size_t es)
{
    off_t want = (off_t)(GPT2_LLMC_HEADER * sizeof(int32_t) + n * es);
    if (fseeko(f, 0, SEEK_END) != 0) {
        DDP_ERROR("%s: cannot seek: %s", path, strerror(errno));
        return DDP_ERR_IO;
    }
    off_t got = ftello(f);
    if (got != want) {
        DDP_ERROR("%s: %lld bytes, want %lld (the header and the %zu %s parameters its sizes "
                  "give): truncated, or not a complete llm.c model file", path, (long long)got,
                  (long long)want, n, es == 2 ? "bf16" : "fp32");
        return DDP_ERR_FORMAT;
    }
    return fseeko(f, GPT2_LLMC_HEADER * sizeof(int32_t), SEEK_SET) == 0 ? DDP_OK : DDP_ERR_IO;
}

/* Elements of the flat parameter buffer the header describes (wte with its padding rows). */
static size_t file_numel(const gpt2_config *cfg)
{
    gpt2_config padded = *cfg;
    padded.vocab = cfg->padded_vocab;
    return gpt2_config_n_params(&padded);
}

/* path opened to read. An llm.c model file must be a regular file: anything else is refused at
 * once, never read, and a FIFO does not block the open (common/in_path.h). NULL on failure, logged
 * (a folder with the file to name in it). */
static FILE *open_regular(const char *path)
{
    char why[512] = ": no path";
    struct stat sb;
    int fd = path ? in_path_open(path, &sb, why, sizeof why) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (f)
        return f;
    if (fd >= 0) {
        DDP_ERROR("%s: cannot open: %s", path, strerror(errno));
        close(fd);
    } else if (path && errno == EINVAL && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DDP_ERROR("%s is a folder, not an llm.c model file: name the file (such as %s/gpt2_124M.bin)",
                  path, path);
    } else {
        DDP_ERROR("%s%s", path ? path : "(null)", why);
    }
    return NULL;
}

/* Opens path and checks its header and its size against the header's (before anything is
 * allocated for the model); *f is NULL on failure, else positioned after the header. */
static ddp_status open_model(const char *path, FILE **f, gpt2_config *cfg, int *version)
{
    *f = open_regular(path);
    if (!*f)
        return DDP_ERR_IO;
    ddp_status st = parse_header(*f, path, cfg, version);
    if (st == DDP_OK)
        st = check_size(*f, path, file_numel(cfg), *version == GPT2_LLMC_BF16 ? 2 : 4);
    if (st != DDP_OK) {
        fclose(*f);
        *f = NULL;
    }
    return st;
}

ddp_status gpt2_llmc_read_config(const char *path, gpt2_config *cfg)
{
    FILE *f;
    int version;
    gpt2_config c;
    TRY_OK(open_model(path, &f, &c, &version));
    fclose(f);
    *cfg = c;
    return DDP_OK;
}

/* DDP_ERR_MISMATCH (naming the first field that differs) unless the file's configuration is the
 * model's. */
static ddp_status same_config(const char *path, const gpt2_config *file, const gpt2_config *model)
{
    const char *names[] = {"maxT", "V", "L", "NH", "C", "Vp"};
    int a[] = {file->max_seq, file->vocab, file->layers, file->heads, file->channels,
               file->padded_vocab};
    int b[] = {model->max_seq, model->vocab, model->layers, model->heads, model->channels,
               model->padded_vocab};
    for (int i = 0; i < 6; i++) {
        if (a[i] != b[i]) {
            DDP_ERROR("%s: %s = %d, the model has %d", path, names[i], a[i], b[i]);
            return DDP_ERR_MISMATCH;
        }
    }
    return DDP_OK;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* Reads n parameters (es bytes each: fp32, or bf16 widened in place) into host. */
static ddp_status read_params(FILE *f, const char *path, float *host, size_t n, size_t es)
{
    if (fread(host, es, n, f) != n) {
        DDP_ERROR("%s: reading %zu parameters failed: %s", path, n,
                  ferror(f) ? strerror(errno) : "end of file");
        return DDP_ERR_IO;
    }
    const uint16_t *h16 = (const uint16_t *)host;
    for (size_t i = n; es == 2 && i-- > 0;) /* backwards: element i's bytes precede float i's */
        host[i] = half_bf16_to_f32(h16[i]);
    return DDP_OK;
}

ddp_status gpt2_llmc_load(gpt2 *g, const char *path)
{
    FILE *f;
    int version;
    gpt2_config file;
    TRY_OK(open_model(path, &f, &file, &version));
    size_t n = gpt2_numel_total(g), es = version == GPT2_LLMC_BF16 ? 2 : 4;
    ddp_status st = same_config(path, &file, gpt2_cfg(g));
    float *host = st == DDP_OK ? malloc(n * sizeof *host) : NULL; // (n)
    if (st == DDP_OK && !host)
        st = DDP_ERR_NOMEM;
    if (st == DDP_OK)
        st = read_params(f, path, host, n, es);
    if (st == DDP_OK)
        st = gpt2_weights_set(g, host);
    fclose(f);
    free(host);
    return st;
}

/* ---- save ---------------------------------------------------------------------------------- */

/* Writes header and n parameters (narrowed to bf16 in place when bf16) to f. */
static ddp_status write_model(FILE *f, const gpt2_config *cfg, float *host, size_t n, bool bf16)
{
    int32_t h[GPT2_LLMC_HEADER] = {GPT2_LLMC_MAGIC, bf16 ? GPT2_LLMC_BF16 : GPT2_LLMC_FP32,
                                   cfg->max_seq, cfg->vocab, cfg->layers, cfg->heads,
                                   cfg->channels, cfg->padded_vocab};
    uint16_t *h16 = (uint16_t *)host;
    for (size_t i = 0; bf16 && i < n; i++) /* forwards: float i is read before it is overwritten */
        h16[i] = half_f32_to_bf16(host[i]);
    if (fwrite(h, sizeof h, 1, f) != 1 || fwrite(host, bf16 ? 2 : 4, n, f) != n)
        return DDP_ERR_IO;
    return DDP_OK;
}

ddp_status gpt2_llmc_write(const char *path, const gpt2_config *cfg, float *host, ddp_dtype dtype)
{
    if (dtype != DDP_FP32 && dtype != DDP_BF16) {
        DDP_ERROR("gpt2_llmc_write: %s: llm.c's files hold fp32 or bf16, not %s", path,
                  ddp_dtype_name(dtype));
        return DDP_ERR_INVALID_ARG;
    }
    gpt2_config c = *cfg;
    if (c.padded_vocab == 0 || gpt2_config_check(&c) != DDP_OK) {
        DDP_ERROR("gpt2_llmc_write: %s: the configuration is invalid (see above)", path);
        return DDP_ERR_INVALID_ARG;
    }
    size_t len = strlen(path) + 5;
    char *tmp = malloc(len);
    if (!tmp)
        return DDP_ERR_NOMEM;
    snprintf(tmp, len, "%s.tmp", path);
    ddp_status st = DDP_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        DDP_ERROR("%s: cannot create: %s", tmp, strerror(errno));
        st = DDP_ERR_IO;
    } else {
        st = write_model(f, &c, host, file_numel(&c), dtype == DDP_BF16);
        if (fclose(f) != 0 || st != DDP_OK || rename(tmp, path) != 0) {
            DDP_ERROR("%s: writing the model failed: %s", path, strerror(errno));
            remove(tmp);
            st = DDP_ERR_IO;
        }
    }
    free(tmp);
    return st;
}

ddp_status gpt2_llmc_save(gpt2 *g, const char *path, ddp_dtype dtype)
{
    size_t n = gpt2_numel_total(g);
    float *host = malloc(n * sizeof *host); // (n)
    ddp_status st = host ? DDP_OK : DDP_ERR_NOMEM;
    if (st == DDP_OK)
        st = gpt2_weights_get(g, host);
    /* the same writer as ddp-ckpt export-llmc's, so the two files are byte for byte the same */
    if (st == DDP_OK)
        st = gpt2_llmc_write(path, gpt2_cfg(g), host, dtype);
    free(host);
    return st;
}
