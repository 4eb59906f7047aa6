/* checkpoint.c - checkpoint files (parameters plus the model signature) and CRC-32.
 *
 * File format, version 1. Every integer and float is little-endian; sizes and offsets are 64-bit.
 *
 *   offset  size            field
 *   0       8               magic "DDPCKPT1"
 *   8       4               u32 version (1)
 *   12      4               u32 n_params
 *   16      8               u64 total elements (sum of the parameters' element counts)
 *   24      84 * n_params   per parameter: char name[48] (NUL-terminated, zero-padded),
 *                           u32 n_dims (<= 4), i64 shape[4] (unused dimensions 0)
 *   H       4 * total       float32 values, parameters in order (H = 24 + 84 * n_params)
 *   H+4*total  4            u32 CRC-32 (zlib) of every byte before it
 *
 * A save writes "PATH.tmp.<pid>", fsyncs it and renames it over PATH, so an existing PATH is
 * replaced only by a complete file. A load checks, in this order: magic, version, file size,
 * CRC-32, then every parameter record (n_dims, shapes, element counts adding up to the total).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "internal.h"

#define DDP_CKPT_MAGIC "DDPCKPT1"
#define DDP_CKPT_VERSION 1u
#define DDP_CKPT_HEADER_BYTES 24u
#define DDP_CKPT_RECORD_BYTES (DDP_NAME_MAX + 4u + 8u * DDP_MAX_DIMS)
#define DDP_CKPT_CHUNK 4096u /* values converted per write/read */

uint32_t ddp_crc32(const void *data, size_t n_bytes)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    const unsigned char *p = data;
    while (n_bytes > 0) {
        uInt part = n_bytes > (size_t)UINT32_MAX ? UINT32_MAX : (uInt)n_bytes;
        crc = crc32(crc, p, part);
        p += part;
        n_bytes -= part;
    }
    return (uint32_t)crc;
}

/* ---- little-endian encoding ------------------------------------------------------------- */

static void ddp_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void ddp_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t ddp_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t ddp_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- numel and signature checks ---------------------------------------------------------- */

/* Element count of a parameter; 0 and *ok = 0 when n_dims or a dimension is invalid. */
static uint64_t ddp_desc_numel_checked(const ddp_param_desc *d, int *ok)
{
    uint64_t n = 1;
    *ok = d->n_dims >= 0 && d->n_dims <= DDP_MAX_DIMS;
    for (int i = 0; *ok && i < d->n_dims; i++) {
        if (d->shape[i] < 0 || (d->shape[i] > 0 && n > UINT64_MAX / (uint64_t)d->shape[i]))
            *ok = 0;
        else
            n *= (uint64_t)d->shape[i];
    }
    return *ok ? n : 0;
}

/* Sum of the element counts; DDP_ERR_INVALID_ARG (logged with `who`) on a bad descriptor. */
static ddp_status ddp_descs_total(const ddp_param_desc *descs, int n_params, const char *who,
                                  uint64_t *total)
{
    uint64_t sum = 0;
    for (int i = 0; i < n_params; i++) {
        int ok;
        uint64_t n = ddp_desc_numel_checked(&descs[i], &ok);
        if (!ok || n > UINT64_MAX / 4 - sum) {
            DDP_ERROR("%s: parameter %d (\"%.*s\") has n_dims %d or a shape that is invalid "
                      "(need 0 <= n_dims <= %d and non-negative dimensions)", who, i,
                      DDP_NAME_MAX, descs[i].name, descs[i].n_dims, DDP_MAX_DIMS);
            return DDP_ERR_INVALID_ARG;
        }
        sum += n;
    }
    *total = sum;
    return DDP_OK;
}

/* ---- save ---------------------------------------------------------------------------------- */

typedef struct ddp_ckpt_writer {
    FILE *f;
    const char *path;
    uLong crc;
    int failed;
} ddp_ckpt_writer;

static void ddp_ckpt_write(ddp_ckpt_writer *w, const void *data, size_t n_bytes)
{
    if (w->failed || n_bytes == 0)
        return;
    if (fwrite(data, 1, n_bytes, w->f) != n_bytes) {
        DDP_ERROR("checkpoint: writing %s failed: %s (check free disk space)", w->path,
                  strerror(errno));
        w->failed = 1;
        return;
    }
    w->crc = crc32_z(w->crc, data, n_bytes);
}

static void ddp_ckpt_write_signature(ddp_ckpt_writer *w, const ddp_param_desc *descs,
                                     int n_params, uint64_t total)
{
    unsigned char head[DDP_CKPT_HEADER_BYTES];
    memcpy(head, DDP_CKPT_MAGIC, 8);
    ddp_put_u32(head + 8, DDP_CKPT_VERSION);
    ddp_put_u32(head + 12, (uint32_t)n_params);
    ddp_put_u64(head + 16, total);
    ddp_ckpt_write(w, head, sizeof head);
    for (int i = 0; i < n_params; i++) {
        unsigned char rec[DDP_CKPT_RECORD_BYTES] = {0};
        strncpy((char *)rec, descs[i].name, DDP_NAME_MAX - 1);
        ddp_put_u32(rec + DDP_NAME_MAX, (uint32_t)descs[i].n_dims);
        for (int d = 0; d < descs[i].n_dims; d++)
            ddp_put_u64(rec + DDP_NAME_MAX + 4 + 8 * d, (uint64_t)descs[i].shape[d]);
        ddp_ckpt_write(w, rec, sizeof rec);
    }
}

static void ddp_ckpt_write_values(ddp_ckpt_writer *w, const float *values, uint64_t total)
{
    unsigned char buf[4 * DDP_CKPT_CHUNK];
    for (uint64_t i = 0; i < total && !w->failed; i += DDP_CKPT_CHUNK) {
        size_t n = total - i < DDP_CKPT_CHUNK ? (size_t)(total - i) : DDP_CKPT_CHUNK;
        for (size_t k = 0; k < n; k++) {
            uint32_t bits;
            memcpy(&bits, &values[i + k], 4);
            ddp_put_u32(buf + 4 * k, bits);
        }
        ddp_ckpt_write(w, buf, 4 * n);
    }
}

/* Flushes and fsyncs the temporary file and closes it; DDP_OK only if all of it reached disk. */
static ddp_status ddp_ckpt_close(ddp_ckpt_writer *w)
{
    int bad = w->failed;
    if (!bad && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)) {
        DDP_ERROR("checkpoint: flushing %s failed: %s", w->path, strerror(errno));
        bad = 1;
    }
    if (fclose(w->f) != 0 && !bad) {
        DDP_ERROR("checkpoint: closing %s failed: %s", w->path, strerror(errno));
        bad = 1;
    }
    return bad ? DDP_ERR_IO : DDP_OK;
}

static ddp_status ddp_ckpt_write_file(const char *tmp, const ddp_param_desc *descs, int n_params,
                                      const float *params_host, uint64_t total)
{
    ddp_ckpt_writer w = {.f = fopen(tmp, "wb"), .path = tmp, .crc = crc32(0L, Z_NULL, 0)};
    if (!w.f) {
        DDP_ERROR("checkpoint: cannot create %s: %s (is the directory writable?)", tmp,
                  strerror(errno));
        return DDP_ERR_IO;
    }
    ddp_ckpt_write_signature(&w, descs, n_params, total);
    ddp_ckpt_write_values(&w, params_host, total);
    unsigned char tail[4];
    ddp_put_u32(tail, (uint32_t)w.crc);
    ddp_ckpt_write(&w, tail, sizeof tail);
    return ddp_ckpt_close(&w);
}

ddp_status ddp_checkpoint_save(const char *path, const ddp_param_desc *descs, int n_params,
                               const float *params_host)
{
    if (!path || !descs || n_params < 1 || !params_host) {
        DDP_ERROR("ddp_checkpoint_save: need a path, descriptors, n_params >= 1 and the values "
                  "(got n_params %d)", n_params);
        return DDP_ERR_INVALID_ARG;
    }
    uint64_t total;
    ddp_status st = ddp_descs_total(descs, n_params, "ddp_checkpoint_save", &total);
    if (st != DDP_OK)
        return st;
    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len);
    if (!tmp) {
        DDP_ERROR("ddp_checkpoint_save: out of memory");
        return DDP_ERR_NOMEM;
    }
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    st = ddp_ckpt_write_file(tmp, descs, n_params, params_host, total);
    if (st == DDP_OK && rename(tmp, path) != 0) {
        DDP_ERROR("ddp_checkpoint_save: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        st = DDP_ERR_IO;
    }
    if (st != DDP_OK)
        unlink(tmp); /* the old checkpoint, if any, is left as it was */
    free(tmp);
    return st;
}

/* ---- load ---------------------------------------------------------------------------------- */

typedef struct ddp_ckpt_reader {
    FILE *f;
    const char *path;
    uLong crc;
} ddp_ckpt_reader;

static ddp_status ddp_ckpt_read(ddp_ckpt_reader *r, void *data, size_t n_bytes)
{
    if (fread(data, 1, n_bytes, r->f) != n_bytes) {
        DDP_ERROR("checkpoint: reading %s failed: %s", r->path,
                  ferror(r->f) ? strerror(errno) : "unexpected end of file");
        return ferror(r->f) ? DDP_ERR_IO : DDP_ERR_FORMAT;
    }
    r->crc = crc32_z(r->crc, data, n_bytes);
    return DDP_OK;
}

/* Checks magic and version of the 24-byte header and the file size it implies. */
static ddp_status ddp_ckpt_check_header(const char *path, const unsigned char *head,
                                        uint64_t file_bytes)
{
    if (memcmp(head, DDP_CKPT_MAGIC, 8) != 0) {
        DDP_ERROR("%s is not a ddp checkpoint (bad magic)", path);
        return DDP_ERR_FORMAT;
    }
    uint32_t version = ddp_get_u32(head + 8);
    if (version != DDP_CKPT_VERSION) {
        DDP_ERROR("%s has checkpoint format version %u, %s (this build reads version %u)", path,
                  version, version > DDP_CKPT_VERSION ? "written by a newer ddp" : "unknown",
                  DDP_CKPT_VERSION);
        return DDP_ERR_FORMAT;
    }
    uint64_t n_params = ddp_get_u32(head + 12), total = ddp_get_u64(head + 16);
    if (n_params < 1 || n_params > INT32_MAX || total > (UINT64_MAX - (1u << 30)) / 4 / 2) {
        DDP_ERROR("%s has an impossible size (%llu parameters, %llu elements): the file is corrupt",
                  path, (unsigned long long)n_params, (unsigned long long)total);
        return DDP_ERR_FORMAT;
    }
    uint64_t expected = DDP_CKPT_HEADER_BYTES + DDP_CKPT_RECORD_BYTES * n_params + 4 * total + 4;
    if (expected != file_bytes) {
        DDP_ERROR(file_bytes < expected ? "%s is truncated: expected %llu bytes, found %llu"
                                        : "%s has trailing data: expected %llu bytes, found %llu",
                  path, (unsigned long long)expected, (unsigned long long)file_bytes);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* Decodes the parameter records and checks them against the header's element total. */
static ddp_status ddp_ckpt_parse_records(const char *path, const unsigned char *recs, int n_params,
                                         uint64_t total, ddp_param_desc *descs)
{
    for (int i = 0; i < n_params; i++) {
        const unsigned char *rec = recs + (size_t)i * DDP_CKPT_RECORD_BYTES;
        uint32_t n_dims = ddp_get_u32(rec + DDP_NAME_MAX);
        if (memchr(rec, 0, DDP_NAME_MAX) == NULL || n_dims > DDP_MAX_DIMS) {
            DDP_ERROR("%s: parameter %d has an unterminated name or n_dims %u > %d: the file is "
                      "corrupt", path, i, n_dims, DDP_MAX_DIMS);
            return DDP_ERR_FORMAT;
        }
        memset(&descs[i], 0, sizeof descs[i]);
        memcpy(descs[i].name, rec, DDP_NAME_MAX);
        descs[i].n_dims = (int)n_dims;
        for (uint32_t d = 0; d < n_dims; d++)
            descs[i].shape[d] = (int64_t)ddp_get_u64(rec + DDP_NAME_MAX + 4 + 8 * d);
    }
    uint64_t sum;
    if (ddp_descs_total(descs, n_params, path, &sum) != DDP_OK || sum != total) {
        DDP_ERROR("%s: the parameter shapes are invalid or do not add up to %llu elements: the "
                  "file is corrupt", path, (unsigned long long)total);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* Reads the values (decoding little-endian in place) and the trailing CRC, and checks it. */
static ddp_status ddp_ckpt_read_values(ddp_ckpt_reader *r, float *values, uint64_t total)
{
    for (uint64_t i = 0; i < total; i += DDP_CKPT_CHUNK) {
        size_t n = total - i < DDP_CKPT_CHUNK ? (size_t)(total - i) : DDP_CKPT_CHUNK;
        unsigned char *bytes = (unsigned char *)(values + i);
        ddp_status st = ddp_ckpt_read(r, bytes, 4 * n);
        if (st != DDP_OK)
            return st;
        for (size_t k = 0; k < n; k++) {
            uint32_t bits = ddp_get_u32(bytes + 4 * k);
            memcpy(&values[i + k], &bits, 4);
        }
    }
    uLong crc = r->crc;
    unsigned char tail[4];
    ddp_status st = ddp_ckpt_read(r, tail, sizeof tail);
    if (st == DDP_OK && ddp_get_u32(tail) != (uint32_t)crc) {
        DDP_ERROR("checksum mismatch: %s is corrupt", r->path);
        st = DDP_ERR_FORMAT;
    }
    return st;
}

static ddp_status ddp_ckpt_read_body(ddp_ckpt_reader *r, int n_params, uint64_t total,
                                     ddp_param_desc **descs_out, float **params_out)
{
    unsigned char *recs = malloc((size_t)n_params * DDP_CKPT_RECORD_BYTES);
    ddp_param_desc *descs = malloc((size_t)n_params * sizeof *descs);
    float *values = total <= SIZE_MAX / 4 ? malloc(total ? (size_t)total * 4 : 1) : NULL;
    ddp_status st = DDP_ERR_NOMEM;
    if (!recs || !descs || !values)
        DDP_ERROR("%s: out of memory for %d parameters, %llu elements", r->path, n_params,
                  (unsigned long long)total);
    else if ((st = ddp_ckpt_read(r, recs, (size_t)n_params * DDP_CKPT_RECORD_BYTES)) == DDP_OK &&
             (st = ddp_ckpt_read_values(r, values, total)) == DDP_OK)
        st = ddp_ckpt_parse_records(r->path, recs, n_params, total, descs);
    free(recs);
    if (st != DDP_OK) {
        free(descs);
        free(values);
        return st;
    }
    *descs_out = descs;
    *params_out = values;
    return DDP_OK;
}

static ddp_status ddp_ckpt_load_file(ddp_ckpt_reader *r, ddp_param_desc **descs, int *n_params,
                                     float **params)
{
    struct stat sb;
    if (fstat(fileno(r->f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        DDP_ERROR("%s is not a regular file", r->path);
        return DDP_ERR_IO;
    }
    uint64_t file_bytes = (uint64_t)sb.st_size;
    if (file_bytes < DDP_CKPT_HEADER_BYTES) {
        DDP_ERROR("%s is truncated: expected at least %u bytes, found %llu", r->path,
                  DDP_CKPT_HEADER_BYTES, (unsigned long long)file_bytes);
        return DDP_ERR_FORMAT;
    }
    unsigned char head[DDP_CKPT_HEADER_BYTES];
    ddp_status st = ddp_ckpt_read(r, head, sizeof head);
    if (st == DDP_OK)
        st = ddp_ckpt_check_header(r->path, head, file_bytes);
    if (st != DDP_OK)
        return st;
    int n = (int)ddp_get_u32(head + 12);
    st = ddp_ckpt_read_body(r, n, ddp_get_u64(head + 16), descs, params);
    if (st == DDP_OK)
        *n_params = n;
    return st;
}

ddp_status ddp_checkpoint_load(const char *path, ddp_param_desc **descs, int *n_params,
                               float **params)
{
    if (!path || !descs || !n_params || !params) {
        DDP_ERROR("ddp_checkpoint_load: path and every output pointer must be non-NULL");
        return DDP_ERR_INVALID_ARG;
    }
    /* O_NONBLOCK: a FIFO must not block the open (ddp_ckpt_load_file refuses it). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ddp_ckpt_reader r = {.f = fd >= 0 ? fdopen(fd, "rb") : NULL, .path = path, .crc = crc32(0L, Z_NULL, 0)};
    if (!r.f) {
        DDP_ERROR("cannot open checkpoint %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return DDP_ERR_IO;
    }
    ddp_status st = ddp_ckpt_load_file(&r, descs, n_params, params);
    fclose(r.f);
    return st;
}
