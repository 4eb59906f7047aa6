/* tokens.c - llm.c token shards mapped read-only, the shuffled distributed training loader and the
 * validation loader that counts every target once (contracts in tokens.h).
 */
#include "tokens.h"
#include "in_path.h"
#include "sample_fp.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A shard and its mapping. */
typedef struct shard_map {
    tokens_shard pub;
    void *base; /* the whole file mapped; NULL when not mapped */
    size_t bytes;
    char *path;
} shard_map;

struct tokens_set {
    shard_map *shards;
    size_t n_shards;
    size_t n_tokens;
    size_t n_targets;
    int vocab;
};

/* ---------------------------------------------------------------------------------------------
 * Shards.
 */

/* Checks the header and size of the mapped file m and fills m->pub. DDP_ERR_FORMAT on a bad
 * header, the message naming the file. */
static ddp_status shard_check(shard_map *m)
{
    int32_t h[TOKENS_HEADER_INTS];
    memcpy(h, m->base, sizeof h);
    if (h[0] != TOKENS_MAGIC) {
        DDP_ERROR("%s: magic %d, want %d: not an llm.c token shard%s", m->path, (int)h[0],
                  TOKENS_MAGIC, h[0] == LLMC_MODEL_MAGIC ? " (this is an llm.c model file)" : "");
        return DDP_ERR_FORMAT;
    }
    if (h[1] != TOKENS_VERSION) {
        DDP_ERROR("%s: token shard version %d, this reader knows version %d", m->path, (int)h[1],
                  TOKENS_VERSION);
        return DDP_ERR_FORMAT;
    }
    if (h[2] < 0) {
        DDP_ERROR("%s: the header's token count is negative (%d)", m->path, (int)h[2]);
        return DDP_ERR_FORMAT;
    }
    size_t want = TOKENS_HEADER_BYTES + 2 * (size_t)h[2];
    if (m->bytes != want) {
        DDP_ERROR("%s: the header announces %d tokens (%zu bytes with the header) but the file has "
                  "%zu bytes: truncated, or not a token shard", m->path, (int)h[2], want, m->bytes);
        return DDP_ERR_FORMAT;
    }
    m->pub.path = m->path;
    m->pub.n_tokens = (size_t)h[2];
    m->pub.tokens = h[2] ? (const uint16_t *)((const char *)m->base + TOKENS_HEADER_BYTES) : NULL;
    return DDP_OK;
}

/* Opens, sizes and maps the file m->path, then checks it. DDP_ERR_IO or DDP_ERR_FORMAT. */
static ddp_status shard_open(shard_map *m)
{
    struct stat st;
    char why[256];
    int fd = in_path_open(m->path, &st, why, sizeof why); /* a FIFO would block the open */
    if (fd < 0) {
        DDP_ERROR("token shard %s%s", m->path, why);
        return DDP_ERR_IO;
    }
    ddp_status rc = DDP_OK;
    if (st.st_size < TOKENS_HEADER_BYTES) {
        DDP_ERROR("%s: %lld bytes, shorter than the %d-byte header of a token shard", m->path,
                  (long long)st.st_size, TOKENS_HEADER_BYTES);
        rc = DDP_ERR_FORMAT;
    } else {
        m->bytes = (size_t)st.st_size;
        void *p = mmap(NULL, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            DDP_ERROR("%s: cannot map %zu bytes: %s", m->path, m->bytes, strerror(errno));
            rc = DDP_ERR_IO;
        } else {
            m->base = p;
            rc = shard_check(m);
        }
    }
    close(fd);
    return rc;
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* Expands pattern into g (sorted). DDP_ERR_IO when nothing matches or a folder is unreadable. */
static ddp_status set_glob(const char *pattern, glob_t *g)
{
    int rc = glob(pattern, GLOB_ERR, NULL, g);
    if (rc == 0)
        return DDP_OK;
    if (rc == GLOB_NOMATCH && !has_glob_chars(pattern))
        DDP_ERROR("%s: no such token shard", pattern);
    else if (rc == GLOB_NOMATCH)
        DDP_ERROR("no file matches the token shard pattern '%s'", pattern);
    else if (rc == GLOB_ABORTED)
        DDP_ERROR("token shard pattern '%s': a folder on its path cannot be read", pattern);
    else
        DDP_ERROR("token shard pattern '%s': glob failed (%d)", pattern, rc);
    return rc == GLOB_NOSPACE ? DDP_ERR_NOMEM : DDP_ERR_IO;
}

/* Opens the shards named by g into s. */
static ddp_status set_fill(tokens_set *s, const glob_t *g)
{
    s->shards = calloc(g->gl_pathc, sizeof *s->shards);
    if (!s->shards)
        return DDP_ERR_NOMEM;
    for (size_t i = 0; i < g->gl_pathc; i++) {
        shard_map *m = &s->shards[i];
        s->n_shards = i + 1;
        m->path = strdup(g->gl_pathv[i]);
        if (!m->path)
            return DDP_ERR_NOMEM;
        ddp_status rc = shard_open(m);
        if (rc != DDP_OK)
            return rc;
        s->n_tokens += m->pub.n_tokens;
        s->n_targets += m->pub.n_tokens ? m->pub.n_tokens - 1 : 0;
    }
    return DDP_OK;
}

/* A shard truncated while it is mapped (another process shortened the file) makes a read of the
 * lost pages raise SIGBUS. While a copy runs, this thread's bus_jump is armed and the handler
 * returns into set_copy, which names the file; a SIGBUS elsewhere gets the action there was. */
static _Thread_local sigjmp_buf *volatile bus_jump;
static struct sigaction bus_before;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    if (bus_jump)
        siglongjmp(*bus_jump, 1);
    if (bus_before.sa_flags & SA_SIGINFO && bus_before.sa_sigaction) {
        bus_before.sa_sigaction(sig, info, uctx);
        return;
    }
    sigaction(SIGBUS, &bus_before, NULL);
    raise(sig);
}

static void bus_install(void)
{
    struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &bus_before);
}

ddp_status tokens_set_open(const char *pattern, int vocab_size, tokens_set **out)
{
    pthread_once(&bus_once, bus_install);
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!pattern || !*pattern || vocab_size < 1 || vocab_size > 65536) {
        DDP_ERROR("tokens_set_open: need a non-empty pattern and a vocabulary size in [1, 65536] "
                  "(got %d)", vocab_size);
        return DDP_ERR_INVALID_ARG;
    }
    glob_t g;
    ddp_status rc = set_glob(pattern, &g);
    if (rc != DDP_OK)
        return rc;
    tokens_set *s = calloc(1, sizeof *s);
    rc = s ? set_fill(s, &g) : DDP_ERR_NOMEM;
    globfree(&g);
    if (rc == DDP_ERR_NOMEM)
        DDP_ERROR("tokens_set_open: out of memory for the shards of '%s'", pattern);
    if (rc != DDP_OK) {
        tokens_set_close(s);
        return rc;
    }
    s->vocab = vocab_size;
    *out = s;
    return DDP_OK;
}

ddp_status tokens_val_pattern(const char *train_pattern, char **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    const char *last = NULL;
    for (const char *p = train_pattern; p && (p = strstr(p, "train")) != NULL; p++)
        last = p;
    if (!last) {
        DDP_ERROR("token shard pattern '%s' holds no \"train\" to replace by \"val\": give the "
                  "validation pattern explicitly", train_pattern ? train_pattern : "(null)");
        return DDP_ERR_INVALID_ARG;
    }
    size_t head = (size_t)(last - train_pattern), n = strlen(train_pattern) - 2;
    char *v = malloc(n + 1);
    if (!v)
        return DDP_ERR_NOMEM;
    snprintf(v, n + 1, "%.*sval%s", (int)head, train_pattern, last + 5);
    *out = v;
    return DDP_OK;
}

void tokens_set_close(tokens_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_shards; i++) {
        if (s->shards[i].base)
            munmap(s->shards[i].base, s->shards[i].bytes);
        free(s->shards[i].path);
    }
    free(s->shards);
    free(s);
}

size_t tokens_set_n_shards(const tokens_set *s) { return s ? s->n_shards : 0; }

const tokens_shard *tokens_set_shard(const tokens_set *s, size_t i)
{
    return s && i < s->n_shards ? &s->shards[i].pub : NULL;
}

size_t tokens_set_n_tokens(const tokens_set *s) { return s ? s->n_tokens : 0; }
size_t tokens_set_n_targets(const tokens_set *s) { return s ? s->n_targets : 0; }
int tokens_set_vocab(const tokens_set *s) { return s ? s->vocab : 0; }

size_t tokens_set_n_windows(const tokens_set *s, size_t window_tokens)
{
    size_t n = 0;
    for (size_t i = 0; s && window_tokens > 1 && i < s->n_shards; i++) {
        size_t nt = s->shards[i].pub.n_tokens;
        n += nt ? (nt - 1) / (window_tokens - 1) : 0;
    }
    return n;
}

/* dst[k] = src[k] as int32 for k < n; whether one is >= vocab. */
static uint32_t copy_ids(const uint16_t *src, size_t n, int vocab, int32_t *dst)
{
    uint32_t bad = 0;
    for (size_t k = 0; k < n; k++) {
        dst[k] = src[k];
        bad |= (uint32_t)(src[k] >= vocab);
    }
    return bad;
}

/* Copies tokens [off, off + n) of shard i into dst as int32, checking each id against the
 * vocabulary. DDP_ERR_FORMAT naming the file, offset and value of the first bad id; DDP_ERR_IO
 * naming the file when it was truncated under the job. */
static ddp_status set_copy(const tokens_set *s, size_t i, size_t off, size_t n, int32_t *dst)
{
    const tokens_shard *sh = &s->shards[i].pub;
    const uint16_t *src = sh->tokens + off;
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1)) {
        bus_jump = NULL;
        struct stat st;
        long long now = stat(sh->path, &st) == 0 ? (long long)st.st_size : -1;
        DDP_ERROR("%s: the file shrank while training read it (now %lld bytes, %zu when opened; "
                  "tokens %zu-%zu are gone): another process truncated or rewrote it; restore the "
                  "shard and resume from the last checkpoint", sh->path, now, s->shards[i].bytes,
                  off, off + n);
        return DDP_ERR_IO;
    }
    bus_jump = &jump;
    atomic_signal_fence(memory_order_seq_cst); /* armed before the first read, disarmed after the last */
    uint32_t bad = copy_ids(src, n, s->vocab, dst);
    atomic_signal_fence(memory_order_seq_cst);
    bus_jump = NULL;
    if (!bad)
        return DDP_OK;
    for (size_t k = 0; k < n; k++)
        if (src[k] >= s->vocab) {
            DDP_ERROR("%s: token %zu is %u, outside the vocabulary of %d ids (tokenised with "
                      "another vocabulary?)", sh->path, off + k, (unsigned)src[k], s->vocab);
            break;
        }
    return DDP_ERR_FORMAT;
}

ddp_status tokens_set_scan(const tokens_set *s)
{
    if (!s)
        return DDP_ERR_INVALID_ARG;
    enum { CHUNK = 4096 };
    int32_t buf[CHUNK];
    for (size_t i = 0; i < s->n_shards; i++) {
        size_t n = s->shards[i].pub.n_tokens;
        for (size_t off = 0; off < n; off += CHUNK) {
            ddp_status rc = set_copy(s, i, off, n - off < CHUNK ? n - off : CHUNK, buf);
            if (rc != DDP_OK)
                return rc;
        }
    }
    return DDP_OK;
}

/* B*T as a size; 0 when B or T < 1 or the product exceeds INT32_MAX (logged, naming `who`). */
static size_t batch_tokens(const char *who, int batch, int seq)
{
    if (batch < 1 || seq < 1 || (int64_t)batch * seq > INT32_MAX) {
        DDP_ERROR("%s: batch %d x sequence %d: both must be >= 1 and their product <= %d", who,
                  batch, seq, INT32_MAX);
        return 0;
    }
    return (size_t)batch * (size_t)seq;
}

/* ---------------------------------------------------------------------------------------------
 * Training loader.
 */
struct tokens_loader {
    const tokens_set *set;
    tokens_loader_opts o;
    size_t bt;            /* B*T */
    size_t *first_window; /* (n_shards + 1,) global index of each shard's first window */
    size_t n_windows;
    size_t per_rank; /* windows per epoch */
    ddp_sampler *sampler;
    size_t *idx; /* (per_rank,) this rank's windows of epoch idx_epoch */
    uint64_t idx_epoch;
    int idx_valid;
    tokens_pos pos;
    uint64_t last_fp; /* the last window's fingerprint (sample_fp.h) */
};

/* Fills first_window and n_windows: shard i of n tokens has (n - 1) / bt windows. */
static void loader_count(tokens_loader *l)
{
    size_t acc = 0;
    for (size_t i = 0; i < l->set->n_shards; i++) {
        size_t n = l->set->shards[i].pub.n_tokens;
        l->first_window[i] = acc;
        acc += n ? (n - 1) / l->bt : 0;
    }
    l->first_window[l->set->n_shards] = acc;
    l->n_windows = acc;
}

static ddp_status loader_check(const tokens_set *set, const tokens_loader_opts *o)
{
    if (!set || !o) {
        DDP_ERROR("tokens_loader_create: NULL set or options");
        return DDP_ERR_INVALID_ARG;
    }
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size) {
        DDP_ERROR("tokens_loader_create: rank %d outside [0, world size %d)", o->rank,
                  o->world_size);
        return DDP_ERR_INVALID_ARG;
    }
    return batch_tokens("tokens_loader_create", o->batch, o->seq) ? DDP_OK : DDP_ERR_INVALID_ARG;
}

/* Creates the sampler once the windows are counted. */
static ddp_status loader_sampler(tokens_loader *l)
{
    if (l->n_windows < (size_t)l->o.world_size) {
        DDP_ERROR("token shards (%zu, first %s): %zu windows of %d x %d + 1 tokens for %d ranks; "
                  "every rank needs at least one: use a smaller batch or sequence, fewer ranks or "
                  "more data", l->set->n_shards, l->set->n_shards ? l->set->shards[0].path : "-",
                  l->n_windows, l->o.batch, l->o.seq, l->o.world_size);
        return DDP_ERR_INVALID_ARG;
    }
    ddp_sampler_opts so = {.n_samples = l->n_windows, .world_size = l->o.world_size,
                           .rank = l->o.rank, .seed = l->o.seed, .shuffle = l->o.shuffle != 0,
                           .drop_last = 1, .block = l->o.blocks_per_step ? 1 : 0,
                           .blocks_per_step = l->o.blocks_per_step};
    ddp_status rc = ddp_sampler_create(&so, &l->sampler);
    if (rc != DDP_OK)
        return rc;
    l->per_rank = ddp_sampler_len(l->sampler);
    l->idx = malloc(l->per_rank * sizeof *l->idx);
    return l->idx ? DDP_OK : DDP_ERR_NOMEM;
}

ddp_status tokens_loader_create(const tokens_set *set, const tokens_loader_opts *opts,
                                tokens_loader **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    ddp_status rc = loader_check(set, opts);
    if (rc != DDP_OK)
        return rc;
    tokens_loader *l = calloc(1, sizeof *l);
    if (l)
        l->first_window = malloc((set->n_shards + 1) * sizeof *l->first_window);
    if (!l || !l->first_window) {
        free(l);
        return DDP_ERR_NOMEM;
    }
    l->set = set;
    l->o = *opts;
    l->bt = (size_t)opts->batch * (size_t)opts->seq;
    loader_count(l);
    rc = loader_sampler(l);
    if (rc != DDP_OK) {
        tokens_loader_destroy(l);
        return rc;
    }
    *out = l;
    return DDP_OK;
}

void tokens_loader_destroy(tokens_loader *l)
{
    if (!l)
        return;
    ddp_sampler_destroy(l->sampler);
    free(l->idx);
    free(l->first_window);
    free(l);
}

size_t tokens_loader_steps_per_epoch(const tokens_loader *l) { return l ? l->per_rank : 0; }
size_t tokens_loader_n_windows(const tokens_loader *l) { return l ? l->n_windows : 0; }

/* The shard holding global window w: the last i with first_window[i] <= w (binary search). */
static size_t loader_shard_of(const tokens_loader *l, size_t w)
{
    size_t lo = 0, hi = l->set->n_shards; /* first_window[lo] <= w < first_window[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->first_window[mid] <= w)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

ddp_status tokens_loader_next(tokens_loader *l, int32_t *inputs, int32_t *targets)
{
    if (!l || !inputs || !targets)
        return DDP_ERR_INVALID_ARG;
    tokens_pos p = l->pos;
    if (p.step >= l->per_rank)
        p = (tokens_pos){p.epoch + 1, 0};
    if (!l->idx_valid || l->idx_epoch != p.epoch) {
        ddp_status rc = ddp_sampler_indices(l->sampler, p.epoch, l->idx);
        if (rc != DDP_OK)
            return rc;
        l->idx_epoch = p.epoch;
        l->idx_valid = 1;
    }
    size_t w = l->idx[p.step];
    size_t shard = loader_shard_of(l, w);
    size_t off = (w - l->first_window[shard]) * l->bt;
    ddp_status rc = set_copy(l->set, shard, off, l->bt, inputs);
    if (rc == DDP_OK)
        rc = set_copy(l->set, shard, off + 1, l->bt, targets);
    if (rc != DDP_OK)
        return rc;
    l->pos = (tokens_pos){p.epoch, p.step + 1};
    l->last_fp = sample_fp(w);
    return DDP_OK;
}

uint64_t tokens_loader_last_fp(const tokens_loader *l) { return l ? l->last_fp : 0; }

tokens_pos tokens_loader_pos(const tokens_loader *l)
{
    return l ? l->pos : (tokens_pos){0, 0};
}

ddp_status tokens_loader_set_pos(tokens_loader *l, tokens_pos pos)
{
    if (!l)
        return DDP_ERR_INVALID_ARG;
    if (pos.step > l->per_rank) {
        DDP_ERROR("tokens_loader_set_pos: step %llu beyond the %zu steps of an epoch (a checkpoint "
                  "of another batch, sequence, world size or data?)",
                  (unsigned long long)pos.step, l->per_rank);
        return DDP_ERR_INVALID_ARG;
    }
    l->pos = pos;
    return DDP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Validation loader.
 */
typedef struct val_seq {
    size_t shard;
    size_t start; /* first input token; targets start one further */
    size_t len;   /* targets, <= T */
} val_seq;

struct tokens_val {
    const tokens_set *set;
    int batch, seq;
    val_seq *seqs; /* (n_seqs,) this rank's sequences in global order */
    size_t n_seqs;
    size_t cursor; /* next sequence to hand out */
    size_t n_batches, n_targets;
};

/* Walks the global sequences and counts those of `rank` (sequence g goes to rank g % world),
 * storing them in v->seqs when fill is set. Returns the count. */
static size_t val_walk(tokens_val *v, int world, int rank, int fill)
{
    size_t g = 0, kept = 0, T = (size_t)v->seq;
    for (size_t i = 0; i < v->set->n_shards; i++) {
        size_t nt = v->set->shards[i].pub.n_tokens;
        nt = nt ? nt - 1 : 0;
        for (size_t start = 0; start < nt; start += T, g++) {
            if (g % (size_t)world != (size_t)rank)
                continue;
            if (fill)
                v->seqs[kept] = (val_seq){i, start, nt - start < T ? nt - start : T};
            kept++;
        }
    }
    return kept;
}

/* The number of sequences in the batch starting at sequence c (0 at the end). */
static size_t val_span(const tokens_val *v, size_t c)
{
    if (c >= v->n_seqs)
        return 0;
    if (v->seqs[c].len < (size_t)v->seq)
        return 1;
    size_t k = 0;
    while (k < (size_t)v->batch && c + k < v->n_seqs && v->seqs[c + k].len == (size_t)v->seq)
        k++;
    return k;
}

ddp_status tokens_val_create(const tokens_set *set, int batch, int seq, int world_size, int rank,
                             tokens_val **out)
{
    if (!out)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    if (!set || world_size < 1 || rank < 0 || rank >= world_size) {
        DDP_ERROR("tokens_val_create: NULL set, or rank %d outside [0, world size %d)", rank,
                  world_size);
        return DDP_ERR_INVALID_ARG;
    }
    if (!batch_tokens("tokens_val_create", batch, seq))
        return DDP_ERR_INVALID_ARG;
    tokens_val *v = calloc(1, sizeof *v);
    if (!v)
        return DDP_ERR_NOMEM;
    *v = (tokens_val){.set = set, .batch = batch, .seq = seq};
    v->n_seqs = val_walk(v, world_size, rank, 0);
    v->seqs = malloc((v->n_seqs ? v->n_seqs : 1) * sizeof *v->seqs);
    if (!v->seqs) {
        free(v);
        return DDP_ERR_NOMEM;
    }
    val_walk(v, world_size, rank, 1);
    for (size_t c = 0, k; (k = val_span(v, c)) > 0; c += k) {
        v->n_batches++;
        v->n_targets += k * v->seqs[c].len;
    }
    *out = v;
    return DDP_OK;
}

void tokens_val_destroy(tokens_val *v)
{
    if (!v)
        return;
    free(v->seqs);
    free(v);
}

size_t tokens_val_n_batches(const tokens_val *v) { return v ? v->n_batches : 0; }
size_t tokens_val_n_targets(const tokens_val *v) { return v ? v->n_targets : 0; }

ddp_status tokens_val_next(tokens_val *v, int32_t *inputs, int32_t *targets, int *b, int *t)
{
    if (!v || !inputs || !targets || !b || !t)
        return DDP_ERR_INVALID_ARG;
    size_t k = val_span(v, v->cursor);
    if (k == 0) {
        *b = *t = 0;
        v->cursor = 0;
        return DDP_OK;
    }
    size_t len = v->seqs[v->cursor].len;
    for (size_t r = 0; r < k; r++) {
        const val_seq *q = &v->seqs[v->cursor + r];
        ddp_status rc = set_copy(v->set, q->shard, q->start, len, inputs + r * len);
        if (rc == DDP_OK)
            rc = set_copy(v->set, q->shard, q->start + 1, len, targets + r * len);
        if (rc != DDP_OK)
            return rc;
    }
    v->cursor += k;
    *b = (int)k;
    *t = (int)len;
    return DDP_OK;
}

void tokens_val_rewind(tokens_val *v)
{
    if (v)
        v->cursor = 0;
}
