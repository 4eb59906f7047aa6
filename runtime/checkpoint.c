/* checkpoint.c - checkpoint files: the training state (parameters with the model signature, named
 * float arrays, counters, configuration text), atomic saves, and CRC-32.
 *
 * Every integer and float is little-endian; sizes and offsets are 64-bit. Files start with the
 * 8-byte magic "DDPCKPT1" and a u32 version; this build writes version 2 and reads 1 and 2.
 *
 * Version 2 (the whole training state):
 *
 *   offset  size            field
 *   0       8               magic "DDPCKPT1"
 *   8       4               u32 version (2)
 *   12      4               u32 n_sections (2 .. 4096)
 *   16      8               u64 file_bytes: size of the whole file, CRC included
 *   24      8               u64 table offset (32)
 *   32      72 * n_sections section table, per section:
 *                             char name[48] (NUL-terminated, zero-padded, unique in the file)
 *                             u32 kind, u32 reserved (0)
 *                             u64 offset of the data from the start of the file (a multiple of 8)
 *                             u64 count (meaning per kind, below)
 *   ...                     section data in table order, each padded with zeros to 8 bytes
 *   file_bytes - 4  4       u32 CRC-32 (zlib) of every byte before it
 *
 *   kind 1 signature: count parameter records of 84 bytes: char name[48], u32 n_dims (<= 4),
 *          i64 shape[4] (unused dimensions 0). Exactly one, named "signature", first.
 *   kind 2 float32 array: count values. "params" (count = the signature's element total) is
 *          required and second; others are the program's, e.g. "momentum".
 *   kind 3 u64 value, count 1 (8 bytes): counters such as "step", "epoch".
 *   kind 4 f64 value, count 1 (8 bytes), e.g. "loss_scale".
 *   kind 5 text: count bytes of UTF-8 without NUL (count <= 4096): configuration fingerprint
 *          entries such as "config.world_size" = "2".
 *
 * Version 1 (parameters only; still read):
 *
 *   0       8               magic "DDPCKPT1"
 *   8       4               u32 version (1)
 *   12      4               u32 n_params
 *   16      8               u64 total elements
 *   24      84 * n_params   parameter records (as in the signature section)
 *   H       4 * total       float32 values (H = 24 + 84 * n_params)
 *   H+4*total  4            u32 CRC-32 of every byte before it
 *
 * A save first removes stale temporary files of interrupted saves in the target's folder
 * ("NAME.tmp.PID" whose process is gone and that start with the magic or are empty), writes
 * "PATH.tmp.<pid>", fsyncs it, renames it over PATH and fsyncs the folder, so PATH is always either
 * the old or the new complete file. The rename only ever replaces a regular file
 * (output_target): a symbolic link is followed (the file it points to is replaced, the link
 * stays), a dangling link, a folder, a device, a FIFO or a socket is refused before anything is
 * written. A failed save leaves errno at the system's reason (e.g. ENOSPC) for the caller's message.
 * A load reads the whole file and checks, in this order: magic, version, file size, CRC-32, then
 * the section table and every section's size and contents.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "ddp_checkpoint.h"
#include "in_path.h"
#include "internal.h"
#include "out_path.h"

#define DDP_CKPT_V1_HEADER_BYTES 24u
#define DDP_CKPT_V2_HEADER_BYTES 32u
#define DDP_CKPT_ENTRY_BYTES 72u
#define DDP_CKPT_RECORD_BYTES (DDP_NAME_MAX + 4u + 8u * DDP_MAX_DIMS)
#define DDP_CKPT_MAX_SECTIONS 4096u
#define DDP_CKPT_MAX_TEXT 4096u
#define DDP_CKPT_CHUNK 4096u /* values converted per write */

/* One section in memory; data is owned (malloc'ed), decoded to host byte order. */
typedef struct state_entry {
    char name[DDP_NAME_MAX];
    ddp_state_kind kind;
    uint64_t count;
    void *data; /* ddp_param_desc[count], float[count], uint64_t, double, or char[count + 1] */
} state_entry;

struct ddp_state {
    int version; /* 2 when created, the file's version when loaded */
    int n_entries, cap_entries;
    state_entry *entries; /* [0] signature, [1] params, then the program's entries */
};

uint32_t ckpt_crc32(const void *data, size_t n_bytes)
{
    return (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), data, n_bytes);
}

/* ---- little-endian encoding ------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- signature checks ---------------------------------------------------------------------- */

/* Element count of a parameter; 0 and *ok = 0 when n_dims or a dimension is invalid. */
static uint64_t desc_numel_checked(const ddp_param_desc *d, int *ok)
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
static ddp_status descs_total(const ddp_param_desc *descs, int n_params, const char *who,
                              uint64_t *total)
{
    uint64_t sum = 0;
    for (int i = 0; i < n_params; i++) {
        int ok;
        uint64_t n = desc_numel_checked(&descs[i], &ok);
        if (!ok || n > UINT64_MAX / 8 - sum) {
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

/* ---- the state in memory ------------------------------------------------------------------ */

static void entry_free(state_entry *e)
{
    free(e->data);
    e->data = NULL;
}

void ddp_state_destroy(ddp_state *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_entries; i++)
        entry_free(&s->entries[i]);
    free(s->entries);
    free(s);
}

/* Bytes of an entry's host data (text: count + 1 for the NUL). */
static size_t entry_host_bytes(ddp_state_kind kind, uint64_t count)
{
    switch (kind) {
    case DDP_STATE_SIGNATURE: return (size_t)count * sizeof(ddp_param_desc);
    case DDP_STATE_F32: return (size_t)count * sizeof(float);
    case DDP_STATE_TEXT: return (size_t)count + 1;
    default: return 8;
    }
}

/* The entry called name, or NULL. */
static state_entry *state_find(const ddp_state *s, const char *name)
{
    for (int i = 0; s && name && i < s->n_entries; i++)
        if (strncmp(s->entries[i].name, name, DDP_NAME_MAX) == 0)
            return &s->entries[i];
    return NULL;
}

static ddp_status state_grow(ddp_state *s)
{
    int cap = s->cap_entries ? 2 * s->cap_entries : 16;
    state_entry *e = realloc(s->entries, (size_t)cap * sizeof *e);
    if (!e)
        return DDP_ERR_NOMEM;
    s->entries = e;
    s->cap_entries = cap;
    return DDP_OK;
}

/* Checks an entry name: 1 to DDP_NAME_MAX - 1 characters. */
static ddp_status state_check_name(const ddp_state *s, const char *name)
{
    if (s && name && name[0] && strlen(name) < DDP_NAME_MAX)
        return DDP_OK;
    DDP_ERROR("ddp_state: need a state and an entry name of 1 to %d characters (got \"%s\")",
              DDP_NAME_MAX - 1, name ? name : "(null)");
    return DDP_ERR_INVALID_ARG;
}

/* The slot for a new or replaced entry `name` of `kind`; NULL (logged) when it cannot be had. */
static state_entry *state_slot(ddp_state *s, const char *name, ddp_state_kind kind)
{
    state_entry *e = state_find(s, name);
    if (e && e->kind != kind && e - s->entries < 2) {
        DDP_ERROR("ddp_state: \"%s\" is reserved for the parameters", name);
        return NULL;
    }
    if (e)
        return e;
    if (s->n_entries == (int)DDP_CKPT_MAX_SECTIONS) {
        DDP_ERROR("ddp_state: more than %u entries", DDP_CKPT_MAX_SECTIONS);
        return NULL;
    }
    if (s->n_entries == s->cap_entries && state_grow(s) != DDP_OK) {
        DDP_ERROR("ddp_state: out of memory for the entry table");
        return NULL;
    }
    e = &s->entries[s->n_entries++];
    *e = (state_entry){.kind = kind};
    strcpy(e->name, name);
    return e;
}

/* Adds (or replaces) the entry `name`, taking ownership of data (freed on failure). */
static ddp_status state_adopt(ddp_state *s, const char *name, ddp_state_kind kind,
                              uint64_t count, void *data)
{
    ddp_status st = state_check_name(s, name);
    state_entry *e = st == DDP_OK ? state_slot(s, name, kind) : NULL;
    if (!e) {
        free(data);
        return st != DDP_OK ? st : DDP_ERR_INVALID_ARG;
    }
    entry_free(e);
    e->kind = kind;
    e->count = count;
    e->data = data;
    return DDP_OK;
}

/* Adds (or replaces) the entry `name` with a copy of data (count items of kind); an entry of the
 * same kind and count keeps its memory (a state reused from one save to the next allocates
 * nothing). */
static ddp_status state_put(ddp_state *s, const char *name, ddp_state_kind kind, uint64_t count,
                            const void *data)
{
    if (count > SIZE_MAX / sizeof(ddp_param_desc) || (count && !data)) {
        DDP_ERROR("ddp_state: \"%s\": no data or an impossible count %llu", name ? name : "",
                  (unsigned long long)count);
        return DDP_ERR_INVALID_ARG;
    }
    size_t n_bytes = entry_host_bytes(kind, count);
    size_t data_bytes = kind == DDP_STATE_TEXT ? (size_t)count : n_bytes;
    state_entry *e = state_find(s, name);
    if (e && e->kind == kind && e->count == count && e->data) { /* the same size: reused in place */
        if (data_bytes)
            memmove(e->data, data, data_bytes);
        return DDP_OK;
    }
    char *copy = malloc(n_bytes ? n_bytes : 1);
    if (!copy) {
        DDP_ERROR("ddp_state: out of memory for \"%s\" (%zu bytes)", name ? name : "", n_bytes);
        return DDP_ERR_NOMEM;
    }
    if (data_bytes)
        memcpy(copy, data, data_bytes);
    if (kind == DDP_STATE_TEXT)
        copy[count] = '\0';
    return state_adopt(s, name, kind, count, copy);
}

static ddp_state *state_new(int version)
{
    ddp_state *s = calloc(1, sizeof *s);
    if (s)
        s->version = version;
    return s;
}

/* A new float entry `name` of n zeros owned by s (written, so its pages are mapped), at *values. */
static ddp_status f32_zeros(ddp_state *s, const char *name, uint64_t n, float **values)
{
    float *data = n <= SIZE_MAX / sizeof(float) ? malloc(n ? (size_t)n * sizeof(float) : 1) : NULL;
    if (!data) {
        DDP_ERROR("ddp_state: out of memory for \"%s\" (%llu values)", name, (unsigned long long)n);
        return DDP_ERR_NOMEM;
    }
    memset(data, 0, n ? (size_t)n * sizeof(float) : 1);
    ddp_status st = state_adopt(s, name, DDP_STATE_F32, n, data); /* frees data on failure */
    if (st == DDP_OK)
        *values = data;
    return st;
}

ddp_status ddp_state_create(const ddp_param_desc *descs, int n_params, const float *params_host,
                            ddp_state **out)
{
    if (!out || !descs || n_params < 1) {
        DDP_ERROR("ddp_state_create: need descriptors, n_params >= 1 and an output (got n_params %d)",
                  n_params);
        return DDP_ERR_INVALID_ARG;
    }
    *out = NULL;
    uint64_t total;
    ddp_status st = descs_total(descs, n_params, "ddp_state_create", &total);
    if (st != DDP_OK)
        return st;
    ddp_state *s = state_new(2);
    st = s ? state_put(s, "signature", DDP_STATE_SIGNATURE, (uint64_t)n_params, descs)
           : DDP_ERR_NOMEM;
    float *zeros = NULL;
    if (st == DDP_OK && params_host)
        st = state_put(s, "params", DDP_STATE_F32, total, params_host);
    else if (st == DDP_OK)
        st = f32_zeros(s, "params", total, &zeros);
    if (st != DDP_OK) {
        DDP_ERROR("ddp_state_create: cannot hold %llu values: %s", (unsigned long long)total,
                  ddp_strerror(st));
        ddp_state_destroy(s);
        return st;
    }
    *out = s;
    return DDP_OK;
}

ddp_status ddp_state_set_f32(ddp_state *s, const char *name, const float *values, size_t n)
{
    return state_put(s, name, DDP_STATE_F32, n, values);
}

ddp_status ddp_state_f32_buffer(ddp_state *s, const char *name, size_t n, float **values)
{
    if (!values) {
        DDP_ERROR("ddp_state_f32_buffer: need an output for \"%s\"", name ? name : "(null)");
        return DDP_ERR_INVALID_ARG;
    }
    state_entry *e = state_find(s, name);
    if (e && e->kind == DDP_STATE_F32 && e->count == n && e->data) {
        *values = e->data;
        return DDP_OK;
    }
    if (e && e - s->entries < 2) {
        DDP_ERROR("ddp_state_f32_buffer: \"%s\" is reserved for the parameters (\"params\": "
                  "%llu values, not %zu)", name, (unsigned long long)s->entries[1].count, n);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status st = state_check_name(s, name);
    return st == DDP_OK ? f32_zeros(s, name, n, values) : st;
}

ddp_status ddp_state_set_u64(ddp_state *s, const char *name, uint64_t value)
{
    return state_put(s, name, DDP_STATE_U64, 1, &value);
}

ddp_status ddp_state_set_f64(ddp_state *s, const char *name, double value)
{
    return state_put(s, name, DDP_STATE_F64, 1, &value);
}

ddp_status ddp_state_set_text(ddp_state *s, const char *name, const char *text)
{
    size_t n = text ? strlen(text) : 0;
    if (!text || n > DDP_CKPT_MAX_TEXT) {
        DDP_ERROR("ddp_state_set_text: \"%s\": need a text of at most %u bytes", name ? name : "",
                  DDP_CKPT_MAX_TEXT);
        return DDP_ERR_INVALID_ARG;
    }
    return state_put(s, name, DDP_STATE_TEXT, n, text);
}

int ddp_state_version(const ddp_state *s) { return s ? s->version : 0; }
int ddp_state_n_params(const ddp_state *s) { return s ? (int)s->entries[0].count : 0; }
const ddp_param_desc *ddp_state_descs(const ddp_state *s) { return s ? s->entries[0].data : NULL; }
const float *ddp_state_params(const ddp_state *s) { return s ? s->entries[1].data : NULL; }
size_t ddp_state_numel(const ddp_state *s) { return s ? (size_t)s->entries[1].count : 0; }
int ddp_state_n_entries(const ddp_state *s) { return s ? s->n_entries : 0; }

ddp_status ddp_state_entry_info(const ddp_state *s, int i, const char **name, ddp_state_kind *kind,
                                uint64_t *count)
{
    if (!s || i < 0 || i >= s->n_entries || !name || !kind || !count)
        return DDP_ERR_INVALID_ARG;
    *name = s->entries[i].name;
    *kind = s->entries[i].kind;
    *count = s->entries[i].count;
    return DDP_OK;
}

/* The entry `name` when it has `kind`, else NULL. */
static const state_entry *state_get(const ddp_state *s, const char *name, ddp_state_kind kind)
{
    const state_entry *e = state_find(s, name);
    return e && e->kind == kind ? e : NULL;
}

const float *ddp_state_f32(const ddp_state *s, const char *name, size_t *n)
{
    const state_entry *e = state_get(s, name, DDP_STATE_F32);
    if (n)
        *n = e ? (size_t)e->count : 0;
    return e ? e->data : NULL;
}

int ddp_state_u64(const ddp_state *s, const char *name, uint64_t *value)
{
    const state_entry *e = state_get(s, name, DDP_STATE_U64);
    if (e && value)
        memcpy(value, e->data, sizeof *value);
    return e != NULL;
}

int ddp_state_f64(const ddp_state *s, const char *name, double *value)
{
    const state_entry *e = state_get(s, name, DDP_STATE_F64);
    if (e && value)
        memcpy(value, e->data, sizeof *value);
    return e != NULL;
}

const char *ddp_state_text(const ddp_state *s, const char *name)
{
    const state_entry *e = state_get(s, name, DDP_STATE_TEXT);
    return e ? e->data : NULL;
}

/* ---- save ---------------------------------------------------------------------------------- */

/* Bytes of a section's data in the file, before padding. */
static uint64_t disk_bytes(ddp_state_kind kind, uint64_t count)
{
    switch (kind) {
    case DDP_STATE_SIGNATURE: return DDP_CKPT_RECORD_BYTES * count;
    case DDP_STATE_F32: return 4 * count;
    case DDP_STATE_TEXT: return count;
    default: return 8;
    }
}

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

typedef struct ckpt_writer {
    FILE *f;
    const char *path;
    uLong crc;
    int failed;
    int err; /* errno of the first failure */
} ckpt_writer;

/* Records the first failure's errno and logs it with `what` ("writing", "flushing", ...). */
static void ckpt_fail(ckpt_writer *w, const char *what)
{
    if (!w->failed) {
        w->err = errno;
        DDP_ERROR("checkpoint: %s %s failed: %s%s", what, w->path, strerror(w->err),
                  w->err == ENOSPC || w->err == EDQUOT ? " (free space there)" : "");
    }
    w->failed = 1;
}

static void ckpt_write(ckpt_writer *w, const void *data, size_t n_bytes)
{
    if (w->failed || n_bytes == 0)
        return;
    if (fwrite(data, 1, n_bytes, w->f) != n_bytes) {
        ckpt_fail(w, "writing");
        return;
    }
    w->crc = crc32_z(w->crc, data, n_bytes);
}

/* Header and section table; section data follows in table order from the end of the table. */
static void ckpt_write_table(ckpt_writer *w, const ddp_state *s, uint64_t file_bytes)
{
    unsigned char head[DDP_CKPT_V2_HEADER_BYTES];
    memcpy(head, DDP_CKPT_MAGIC, 8);
    put_u32(head + 8, 2);
    put_u32(head + 12, (uint32_t)s->n_entries);
    put_u64(head + 16, file_bytes);
    put_u64(head + 24, DDP_CKPT_V2_HEADER_BYTES);
    ckpt_write(w, head, sizeof head);
    uint64_t offset = DDP_CKPT_V2_HEADER_BYTES + (uint64_t)DDP_CKPT_ENTRY_BYTES * s->n_entries;
    for (int i = 0; i < s->n_entries; i++) {
        const state_entry *e = &s->entries[i];
        unsigned char rec[DDP_CKPT_ENTRY_BYTES] = {0};
        memcpy(rec, e->name, DDP_NAME_MAX);
        put_u32(rec + 48, (uint32_t)e->kind);
        put_u64(rec + 56, offset);
        put_u64(rec + 64, e->count);
        ckpt_write(w, rec, sizeof rec);
        offset += pad8(disk_bytes(e->kind, e->count));
    }
}

static void ckpt_write_records(ckpt_writer *w, const ddp_param_desc *descs, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        unsigned char rec[DDP_CKPT_RECORD_BYTES] = {0};
        strncpy((char *)rec, descs[i].name, DDP_NAME_MAX - 1);
        put_u32(rec + DDP_NAME_MAX, (uint32_t)descs[i].n_dims);
        for (int d = 0; d < descs[i].n_dims; d++)
            put_u64(rec + DDP_NAME_MAX + 4 + 8 * d, (uint64_t)descs[i].shape[d]);
        ckpt_write(w, rec, sizeof rec);
    }
}

static void ckpt_write_floats(ckpt_writer *w, const float *values, uint64_t total)
{
    unsigned char buf[4 * DDP_CKPT_CHUNK];
    for (uint64_t i = 0; i < total && !w->failed; i += DDP_CKPT_CHUNK) {
        size_t n = total - i < DDP_CKPT_CHUNK ? (size_t)(total - i) : DDP_CKPT_CHUNK;
        for (size_t k = 0; k < n; k++) {
            uint32_t bits;
            memcpy(&bits, &values[i + k], 4);
            put_u32(buf + 4 * k, bits);
        }
        ckpt_write(w, buf, 4 * n);
    }
}

/* One section's data and its zero padding. */
static void ckpt_write_section(ckpt_writer *w, const state_entry *e)
{
    unsigned char word[8] = {0};
    if (e->kind == DDP_STATE_SIGNATURE) {
        ckpt_write_records(w, e->data, e->count);
    } else if (e->kind == DDP_STATE_F32) {
        ckpt_write_floats(w, e->data, e->count);
    } else if (e->kind == DDP_STATE_TEXT) {
        ckpt_write(w, e->data, (size_t)e->count);
    } else {
        uint64_t bits;
        memcpy(&bits, e->data, 8);
        put_u64(word, bits);
        ckpt_write(w, word, 8);
        return;
    }
    uint64_t n = disk_bytes(e->kind, e->count);
    memset(word, 0, sizeof word);
    ckpt_write(w, word, (size_t)(pad8(n) - n));
}

static uint64_t ckpt_file_bytes(const ddp_state *s)
{
    uint64_t n = DDP_CKPT_V2_HEADER_BYTES + (uint64_t)DDP_CKPT_ENTRY_BYTES * s->n_entries;
    for (int i = 0; i < s->n_entries; i++)
        n += pad8(disk_bytes(s->entries[i].kind, s->entries[i].count));
    return n + 4;
}

/* Flushes and fsyncs the temporary file and closes it; DDP_OK only if all of it reached disk.
 * On DDP_ERR_IO errno is the first failure's. */
static ddp_status ckpt_close(ckpt_writer *w)
{
    if (!w->failed && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        ckpt_fail(w, "flushing");
    if (fclose(w->f) != 0)
        ckpt_fail(w, "closing");
    errno = w->err;
    return w->failed ? DDP_ERR_IO : DDP_OK;
}

static ddp_status ckpt_write_file(const char *tmp, const ddp_state *s)
{
    ckpt_writer w = {.f = fopen(tmp, "wb"), .path = tmp, .crc = crc32(0L, Z_NULL, 0)};
    if (!w.f) {
        DDP_ERROR("checkpoint: cannot create %s: %s (is the folder there and writable?)", tmp,
                  strerror(errno));
        return DDP_ERR_IO;
    }
    ckpt_write_table(&w, s, ckpt_file_bytes(s));
    for (int i = 0; i < s->n_entries; i++)
        ckpt_write_section(&w, &s->entries[i]);
    unsigned char tail[4];
    put_u32(tail, (uint32_t)w.crc);
    ckpt_write(&w, tail, sizeof tail);
    return ckpt_close(&w);
}

/* Splits path into its folder (malloc'ed, "." when there is none) and its last component. */
static char *path_dir(const char *path, const char **base)
{
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!slash)
        return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (dir) {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return dir;
}

/* 1 when `name` is "BASE.tmp.PID" for a PID other than ours whose process is gone. */
static int is_stale_temp(const char *name)
{
    const char *tag = strstr(name, ".tmp.");
    while (tag && strstr(tag + 1, ".tmp."))
        tag = strstr(tag + 1, ".tmp.");
    if (!tag || tag == name || !tag[5])
        return 0;
    char *end;
    errno = 0;
    long pid = strtol(tag + 5, &end, 10);
    if (*end || errno || pid <= 0 || pid == (long)getpid())
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* 1 when the file is empty or starts with the checkpoint magic (only those are removed). */
static int looks_like_checkpoint(int dir_fd, const char *name)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char magic[8];
    ssize_t got = read(fd, magic, sizeof magic);
    close(fd);
    return got == 0 || (got == 8 && memcmp(magic, DDP_CKPT_MAGIC, 8) == 0);
}

/* Removes the stale temporary files listed in the open folder d (named dir_path in the log). */
static void remove_stale_in(DIR *d, const char *dir_path)
{
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!is_stale_temp(de->d_name) || !looks_like_checkpoint(dirfd(d), de->d_name))
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) == 0)
            DDP_INFO("checkpoint: removed %s/%s, left by an interrupted save", dir_path, de->d_name);
    }
}

ddp_status ddp_checkpoint_remove_stale(const char *dir_path)
{
    const char *dir = dir_path ? dir_path : ".";
    DIR *d = opendir(dir);
    if (!d) {
        DDP_ERROR("checkpoint: cannot list %s: %s", dir, strerror(errno));
        return DDP_ERR_IO;
    }
    remove_stale_in(d, dir);
    closedir(d);
    return DDP_OK;
}

/* fsync of the folder, so the rename itself survives a crash (internal.h). */
ddp_status ckpt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        DDP_ERROR("checkpoint: cannot sync the folder %s: %s", dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return DDP_ERR_IO;
    }
    close(fd);
    return DDP_OK;
}

/* Writes "PATH.tmp.<pid>" and renames it over path; the folder is synced afterwards. On
 * DDP_ERR_IO errno is the system's reason. */
static ddp_status ckpt_replace(const char *path, const char *dir, const ddp_state *s)
{
    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len);
    if (!tmp) {
        DDP_ERROR("checkpoint: out of memory");
        return DDP_ERR_NOMEM;
    }
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    ddp_status st = ckpt_write_file(tmp, s);
    if (st == DDP_OK && rename(tmp, path) != 0) {
        DDP_ERROR("checkpoint: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        st = DDP_ERR_IO;
    }
    int err = errno;
    if (st != DDP_OK)
        unlink(tmp); /* the old checkpoint, if any, is left as it was */
    else if ((st = ckpt_fsync_dir(dir)) != DDP_OK)
        err = errno;
    free(tmp);
    errno = err;
    return st;
}

/* ---- where a save goes ---------------------------------------------------------------------- */

ddp_status output_target(const char *what, const char *path, char **out)
{
    char why[1024];
    int rc = out_path_target(path, out, why, sizeof why);
    if (rc != OUT_PATH_OK) {
        DDP_ERROR("%s %s%s", what, path, why);
        return rc == OUT_PATH_REFUSED ? DDP_ERR_INVALID_ARG : DDP_ERR_IO;
    }
    return DDP_OK;
}

ddp_status ddp_state_save(const ddp_state *s, const char *path)
{
    if (!s || !path || !path[0]) {
        DDP_ERROR("ddp_state_save: need a state and a path");
        return DDP_ERR_INVALID_ARG;
    }
    for (int i = 0; i < s->n_entries; i++) {
        if (s->entries[i].count > 0 && !s->entries[i].data) {
            DDP_ERROR("ddp_state_save: %s: \"%s\" has no values (the state of a checkpoint folder "
                      "holds only the counts: ddp_ckpt_dir_consolidate writes a file)", path,
                      s->entries[i].name);
            return DDP_ERR_INVALID_ARG;
        }
    }
    char *target = NULL, *dir = NULL;
    const char *base = "";
    ddp_status st = output_target("checkpoint", path, &target);
    if (st == DDP_OK && (!(dir = path_dir(target, &base)) || !base[0])) {
        DDP_ERROR("ddp_state_save: %s: %s", path, dir ? "names a folder, not a file" : "out of memory");
        st = dir ? DDP_ERR_INVALID_ARG : DDP_ERR_NOMEM;
    }
    if (st == DDP_OK) {
        DIR *d = opendir(dir); /* cleaning up is best effort: a folder we cannot list may be writable */
        if (d) {
            remove_stale_in(d, dir);
            closedir(d);
        }
        st = ckpt_replace(target, dir, s);
    }
    int err = errno;
    free(dir);
    free(target);
    errno = err;
    return st;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* Reads the whole regular file at path into *buf (malloc'ed) of *size bytes. A FIFO, socket,
 * device or folder is refused before anything is read, without waiting (common/in_path.h). */
static ddp_status ckpt_slurp(const char *path, unsigned char **buf, uint64_t *size)
{
    char why[512];
    struct stat sb;
    int fd = in_path_open(path, &sb, why, sizeof why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        DDP_ERROR("checkpoint %s%s", path, fd >= 0 ? ": out of memory" : why);
        if (fd >= 0)
            close(fd);
        return fd >= 0 ? DDP_ERR_NOMEM : DDP_ERR_IO;
    }
    ddp_status st = DDP_OK;
    if ((uint64_t)sb.st_size > SIZE_MAX - 1 || !(*buf = malloc((size_t)sb.st_size + 1))) {
        DDP_ERROR("%s: out of memory for %lld bytes", path, (long long)sb.st_size);
        st = DDP_ERR_NOMEM;
    } else if (fread(*buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        DDP_ERROR("reading %s failed: %s", path, ferror(f) ? strerror(errno) : "the file shrank");
        free(*buf);
        st = DDP_ERR_IO;
    }
    *size = (uint64_t)sb.st_size;
    fclose(f);
    return st;
}

static ddp_status ckpt_size_error(const char *path, uint64_t expected, uint64_t found)
{
    DDP_ERROR(found < expected ? "%s is truncated: expected %llu bytes, found %llu"
                               : "%s has trailing data: expected %llu bytes, found %llu",
              path, (unsigned long long)expected, (unsigned long long)found);
    return DDP_ERR_FORMAT;
}

/* The CRC-32 in the last 4 bytes must match the bytes before it. */
static ddp_status ckpt_check_crc(const char *path, const unsigned char *buf, uint64_t size)
{
    if (get_u32(buf + size - 4) == ckpt_crc32(buf, (size_t)size - 4))
        return DDP_OK;
    DDP_ERROR("checksum mismatch: %s is corrupt", path);
    return DDP_ERR_FORMAT;
}

/* Decodes n parameter records and checks them against the expected element total. */
static ddp_status ckpt_parse_records(const char *path, const unsigned char *recs, uint64_t n,
                                     uint64_t total, ddp_param_desc *descs)
{
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char *rec = recs + i * DDP_CKPT_RECORD_BYTES;
        uint32_t n_dims = get_u32(rec + DDP_NAME_MAX);
        if (memchr(rec, 0, DDP_NAME_MAX) == NULL || n_dims > DDP_MAX_DIMS) {
            DDP_ERROR("%s: parameter %llu has an unterminated name or n_dims %u > %d: the file is "
                      "corrupt", path, (unsigned long long)i, n_dims, DDP_MAX_DIMS);
            return DDP_ERR_FORMAT;
        }
        memset(&descs[i], 0, sizeof descs[i]);
        memcpy(descs[i].name, rec, DDP_NAME_MAX);
        descs[i].n_dims = (int)n_dims;
        for (uint32_t d = 0; d < n_dims; d++)
            descs[i].shape[d] = (int64_t)get_u64(rec + DDP_NAME_MAX + 4 + 8 * d);
    }
    uint64_t sum;
    if (descs_total(descs, (int)n, path, &sum) != DDP_OK || sum != total) {
        DDP_ERROR("%s: the parameter shapes are invalid or do not add up to %llu elements: the "
                  "file is corrupt", path, (unsigned long long)total);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

/* Decodes a section's data at `at` into host memory (malloc'ed, *out) and checks it. */
static ddp_status ckpt_decode(const char *path, ddp_state_kind kind, uint64_t count,
                              const unsigned char *at, uint64_t total, void **out)
{
    size_t n_bytes = entry_host_bytes(kind, count);
    unsigned char *host = malloc(n_bytes ? n_bytes : 1);
    if (!host) {
        DDP_ERROR("%s: out of memory for a section of %zu bytes", path, n_bytes);
        return DDP_ERR_NOMEM;
    }
    ddp_status st = DDP_OK;
    if (kind == DDP_STATE_SIGNATURE) {
        st = ckpt_parse_records(path, at, count, total, (ddp_param_desc *)host);
    } else if (kind == DDP_STATE_F32) {
        for (uint64_t i = 0; i < count; i++) {
            uint32_t bits = get_u32(at + 4 * i);
            memcpy(host + 4 * i, &bits, 4);
        }
    } else if (kind == DDP_STATE_TEXT) {
        memcpy(host, at, (size_t)count);
        host[count] = '\0';
    } else {
        uint64_t bits = get_u64(at);
        memcpy(host, &bits, 8);
    }
    if (st != DDP_OK)
        free(host);
    else
        *out = host;
    return st;
}

/* Version 1: header, records, values, CRC. */
static ddp_status ckpt_parse_v1(const char *path, const unsigned char *buf, uint64_t size,
                                ddp_state *s)
{
    if (size < DDP_CKPT_V1_HEADER_BYTES)
        return ckpt_size_error(path, DDP_CKPT_V1_HEADER_BYTES, size);
    uint64_t n_params = get_u32(buf + 12), total = get_u64(buf + 16);
    if (n_params < 1 || n_params > INT32_MAX || total > (UINT64_MAX - (1u << 30)) / 4 / 2) {
        DDP_ERROR("%s has an impossible size (%llu parameters, %llu elements): the file is corrupt",
                  path, (unsigned long long)n_params, (unsigned long long)total);
        return DDP_ERR_FORMAT;
    }
    uint64_t values_at = DDP_CKPT_V1_HEADER_BYTES + DDP_CKPT_RECORD_BYTES * n_params;
    uint64_t expected = values_at + 4 * total + 4;
    if (expected != size)
        return ckpt_size_error(path, expected, size);
    ddp_status st = ckpt_check_crc(path, buf, size);
    void *descs = NULL, *values = NULL;
    if (st == DDP_OK)
        st = ckpt_decode(path, DDP_STATE_SIGNATURE, n_params, buf + DDP_CKPT_V1_HEADER_BYTES,
                         total, &descs);
    if (st == DDP_OK)
        st = state_adopt(s, "signature", DDP_STATE_SIGNATURE, n_params, descs);
    if (st == DDP_OK)
        st = ckpt_decode(path, DDP_STATE_F32, total, buf + values_at, total, &values);
    if (st == DDP_OK)
        st = state_adopt(s, "params", DDP_STATE_F32, total, values);
    return st;
}

/* Largest count a section of kind may have in a file of `room` bytes of data. */
static int ckpt_count_ok(ddp_state_kind kind, uint64_t count, uint64_t room)
{
    switch (kind) {
    case DDP_STATE_SIGNATURE: return count >= 1 && count <= INT32_MAX && count <= room / DDP_CKPT_RECORD_BYTES;
    case DDP_STATE_F32: return count <= room / 4;
    case DDP_STATE_TEXT: return count <= DDP_CKPT_MAX_TEXT && count <= room;
    case DDP_STATE_U64:
    case DDP_STATE_F64: return count == 1 && room >= 8;
    default: return 0;
    }
}

/* Checks table entry i (kind, name, placement after *data_end) and moves *data_end past it. */
static ddp_status ckpt_check_entry(const char *path, const unsigned char *rec, int i,
                                   uint64_t size, uint64_t *data_end)
{
    uint32_t kind = get_u32(rec + 48);
    uint64_t offset = get_u64(rec + 56), count = get_u64(rec + 64);
    uint64_t room = offset <= size - 4 ? size - 4 - offset : 0;
    int ok = memchr(rec, 0, DDP_NAME_MAX) != NULL && rec[0] != 0 && get_u32(rec + 52) == 0 &&
             offset % 8 == 0 && offset >= *data_end && offset <= size - 4 && /* also for 0 elements */
             ckpt_count_ok((ddp_state_kind)kind, count, room);
    static const char *required[2] = {"signature", "params"};
    static const uint32_t required_kind[2] = {DDP_STATE_SIGNATURE, DDP_STATE_F32};
    if (ok && i < 2)
        ok = strcmp((const char *)rec, required[i]) == 0 && kind == required_kind[i];
    if (ok && pad8(disk_bytes((ddp_state_kind)kind, count)) > room)
        ok = 0;
    if (!ok) {
        DDP_ERROR("%s: section %d (\"%.*s\", kind %u, offset %llu, count %llu) is invalid: the file "
                  "is corrupt", path, i, DDP_NAME_MAX - 1, (const char *)rec, kind,
                  (unsigned long long)offset, (unsigned long long)count);
        return DDP_ERR_FORMAT;
    }
    *data_end = offset + pad8(disk_bytes((ddp_state_kind)kind, count));
    return DDP_OK;
}

/* Checks and decodes section i of a version 2 file into s. */
static ddp_status ckpt_load_entry(const char *path, const unsigned char *buf, uint64_t size,
                                  int i, uint64_t total, uint64_t *data_end, ddp_state *s)
{
    const unsigned char *rec = buf + DDP_CKPT_V2_HEADER_BYTES + (uint64_t)i * DDP_CKPT_ENTRY_BYTES;
    ddp_status st = ckpt_check_entry(path, rec, i, size, data_end);
    if (st != DDP_OK)
        return st;
    if (state_find(s, (const char *)rec)) {
        DDP_ERROR("%s: section name \"%s\" appears twice: the file is corrupt", path, rec);
        return DDP_ERR_FORMAT;
    }
    ddp_state_kind kind = (ddp_state_kind)get_u32(rec + 48);
    uint64_t count = get_u64(rec + 64);
    void *data = NULL;
    st = ckpt_decode(path, kind, count, buf + get_u64(rec + 56), total, &data);
    if (st == DDP_OK)
        st = state_adopt(s, (const char *)rec, kind, count, data);
    return st;
}

/* Version 2: header, section table, sections, CRC. */
static ddp_status ckpt_parse_v2(const char *path, const unsigned char *buf, uint64_t size,
                                ddp_state *s)
{
    if (size < DDP_CKPT_V2_HEADER_BYTES + 4)
        return ckpt_size_error(path, DDP_CKPT_V2_HEADER_BYTES + 4, size);
    uint64_t n = get_u32(buf + 12), file_bytes = get_u64(buf + 16);
    if (file_bytes != size)
        return ckpt_size_error(path, file_bytes, size);
    ddp_status st = ckpt_check_crc(path, buf, size);
    if (st != DDP_OK)
        return st;
    uint64_t data_end = DDP_CKPT_V2_HEADER_BYTES + DDP_CKPT_ENTRY_BYTES * n;
    if (n < 2 || n > DDP_CKPT_MAX_SECTIONS || get_u64(buf + 24) != DDP_CKPT_V2_HEADER_BYTES ||
        data_end > size - 4) {
        DDP_ERROR("%s has an impossible section table (%llu sections): the file is corrupt", path,
                  (unsigned long long)n);
        return DDP_ERR_FORMAT;
    }
    /* the signature's element counts must add up to the params section's count */
    uint64_t total = get_u64(buf + DDP_CKPT_V2_HEADER_BYTES + DDP_CKPT_ENTRY_BYTES + 64);
    for (int i = 0; st == DDP_OK && i < (int)n; i++)
        st = ckpt_load_entry(path, buf, size, i, total, &data_end, s);
    return st;
}

ddp_status ddp_state_load(const char *path, ddp_state **out)
{
    if (!path || !out) {
        DDP_ERROR("ddp_state_load: need a path and an output");
        return DDP_ERR_INVALID_ARG;
    }
    unsigned char *buf = NULL;
    uint64_t size = 0;
    ddp_status st = ckpt_slurp(path, &buf, &size);
    if (st != DDP_OK)
        return st;
    uint32_t version = size >= 12 ? get_u32(buf + 8) : 0;
    ddp_state *s = NULL;
    if (size < 12 || memcmp(buf, DDP_CKPT_MAGIC, 8) != 0) {
        DDP_ERROR(size < 12 ? "%s is truncated: expected at least 24 bytes"
                            : "%s is not a ddp checkpoint (bad magic)", path);
        st = DDP_ERR_FORMAT;
    } else if (version != 1 && version != 2) {
        DDP_ERROR("%s has checkpoint format version %u, %s (this build reads versions 1 and 2)", path,
                  version, version > 2 ? "written by a newer ddp" : "unknown");
        st = DDP_ERR_FORMAT;
    } else if (!(s = state_new((int)version))) {
        DDP_ERROR("ddp_state_load: out of memory");
        st = DDP_ERR_NOMEM;
    } else {
        st = version == 1 ? ckpt_parse_v1(path, buf, size, s) : ckpt_parse_v2(path, buf, size, s);
    }
    free(buf);
    if (st != DDP_OK)
        ddp_state_destroy(s);
    else
        *out = s;
    return st;
}

ddp_status ddp_checkpoint_load(const char *path, ddp_param_desc **descs, int *n_params,
                               float **params)
{
    if (!path || !descs || !n_params || !params) {
        DDP_ERROR("ddp_checkpoint_load: path and every output pointer must be non-NULL");
        return DDP_ERR_INVALID_ARG;
    }
    ddp_state *s = NULL;
    ddp_status st = ddp_state_load(path, &s);
    if (st != DDP_OK)
        return st;
    state_entry *sig = &s->entries[0], *val = &s->entries[1];
    *descs = sig->data;
    *n_params = (int)sig->count;
    *params = val->data;
    sig->data = val->data = NULL; /* now the caller's */
    ddp_state_destroy(s);
    return DDP_OK;
}

/* ---- states without values, for checkpoint folders (internal.h) --------------------------------- */

ddp_state *ckpt_state_meta(const ddp_param_desc *descs, int n_params, uint64_t numel)
{
    ddp_state *s = state_new(2);
    if (!s || state_put(s, "signature", DDP_STATE_SIGNATURE, (uint64_t)n_params, descs) != DDP_OK ||
        state_adopt(s, "params", DDP_STATE_F32, numel, NULL) != DDP_OK) {
        ddp_state_destroy(s);
        return NULL;
    }
    return s;
}

ddp_status ckpt_state_add_count(ddp_state *s, const char *name, uint64_t count)
{
    return state_adopt(s, name, DDP_STATE_F32, count, NULL);
}
