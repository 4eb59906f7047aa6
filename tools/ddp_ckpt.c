/* ddp_ckpt.c - ddp-ckpt: shows a checkpoint's signature, compares two checkpoints numerically,
 * lists, verifies and consolidates checkpoint folders (a file per rank and a MANIFEST).
 *
 *   ddp-ckpt show [--no-verify] FILE|FOLDER  (signature, then the training state's other entries)
 *   ddp-ckpt diff [--tol X] [--no-verify] A B  (files or folders)
 *   ddp-ckpt list PATH             (a checkpoint folder's files, or a --checkpoint-dir's checkpoints)
 *   ddp-ckpt verify PATH           (every CRC-32; a folder's MANIFEST and that it is complete)
 *   ddp-ckpt consolidate [--no-verify] FOLDER FILE   (one checkpoint file, as --checkpoint-format
 *                                                      file writes)
 *   ddp-ckpt export-llmc [--no-verify] CKPT OUT.bin  (a GPT-2 checkpoint's weights as llm.c's file)
 *
 * The commands that read values (show, diff, consolidate, export-llmc) first verify a folder as
 * --resume does: every file's size and CRC-32 against its MANIFEST, over all of its bytes (a file
 * is always checked whole as it is read); --no-verify skips the CRC-32, to look into a damaged
 * folder (the sizes and section tables are checked still: they say where the values are).
 *
 * diff prints max_abs_diff (largest |a - b| over all values) and max_rel_diff, the largest over
 * parameters of (largest |a - b| in the parameter) / max(largest |a|, largest |b| in it, 1e-12):
 * differences are measured against the scale of each tensor, so values that happen to sit near zero
 * do not blow the ratio up.
 * Exit status, like diff(1): 0 same signature (and max_rel_diff <= X with --tol), 1 the signatures
 * differ or max_rel_diff > X, 2 bad usage or an unreadable or corrupt file.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddp_checkpoint.h"
#include "gpt2.h"
#include "gpt2_ckpt.h"
#include "in_path.h"
#include "out_path.h"

#define CKPT_SAME 0
#define CKPT_DIFFERENT 1
#define CKPT_TROUBLE 2

static const char ckpt_usage_text[] =
    "usage: ddp-ckpt show [--no-verify] FILE|FOLDER\n"
    "       ddp-ckpt diff [--tol X] [--no-verify] A B\n"
    "       ddp-ckpt list PATH\n"
    "       ddp-ckpt verify PATH\n"
    "       ddp-ckpt consolidate [--no-verify] FOLDER FILE\n"
    "       ddp-ckpt export-llmc [--no-verify] CKPT OUT.bin\n"
    "  show    prints the signature (parameter names and shapes) and the training state\n"
    "          (optimizer buffers, counters, configuration) of a version 2 checkpoint\n"
    "  diff    checks that the signatures match and prints max_abs_diff and max_rel_diff\n"
    "          (per parameter: max |a-b| / max(max |a|, max |b|, 1e-12), largest over parameters)\n"
    "  --tol X exit 1 when max_rel_diff > X\n"
    "  list    a checkpoint folder's files (rank, bytes), or each checkpoint of a --checkpoint-dir\n"
    "          (file or folder, complete or not)\n"
    "  verify  checks every CRC-32 (a folder: its MANIFEST, that every file is there, complete and\n"
    "          of the same save, and each file's CRC-32); exit 0 valid, 2 not\n"
    "  consolidate  writes a checkpoint folder as one checkpoint file (today's format)\n"
    "  export-llmc  writes a GPT-2 checkpoint's weights (file or folder) as an llm.c model file\n"
    "          (fp32, the file ddp-train --save-llmc writes), without training\n"
    "  --no-verify  show, diff, consolidate and export-llmc first check a FOLDER as --resume\n"
    "          does (each file's size and CRC-32 against the MANIFEST) and refuse a corrupt one;\n"
    "          this skips the CRC-32, to look into a damaged folder (a FILE is always checked)\n"
    "A FOLDER is a checkpoint written by ddp-train --checkpoint-format folder.\n";

/* The options of a command (ckpt_parse_opts). */
typedef struct ckpt_opts {
    double tol;  /* diff --tol X; -1: none */
    int verify;  /* check a folder's files against its MANIFEST before reading (not --no-verify) */
} ckpt_opts;

typedef struct ckpt_file {
    const char *path;
    ddp_param_desc *descs;
    int n_params;
    float *params;
} ckpt_file;

static int ckpt_usage(const char *complaint)
{
    fprintf(stderr, "ddp-ckpt: %s\n%s", complaint, ckpt_usage_text);
    return CKPT_TROUBLE;
}

/* Opens the checkpoint folder at path; with verify, every file's CRC-32 over all of its bytes is
 * checked against the MANIFEST first, as --resume does (the failure names the file). */
static ddp_status folder_open(const char *path, int verify, ddp_ckpt_dir **d)
{
    ddp_state *file = NULL;
    ddp_status st = ddp_checkpoint_open(path, 0, &file, d);
    ddp_state_destroy(file); /* a file, not a folder: the callers checked */
    if (st != DDP_OK || !verify || (st = ddp_ckpt_dir_verify(*d)) == DDP_OK)
        return st;
    fprintf(stderr, "ddp-ckpt: %s: the folder's files do not match its %s (see above): refused; "
            "--no-verify reads it anyway\n", path, DDP_CKPT_MANIFEST);
    ddp_ckpt_dir_close(*d);
    *d = NULL;
    return st;
}

/* The parameters of a checkpoint folder, read whole, as ddp_checkpoint_load returns a file's. */
static ddp_status folder_params(const char *path, int verify, ckpt_file *c)
{
    ddp_ckpt_dir *d = NULL;
    ddp_status st = folder_open(path, verify, &d);
    const ddp_state *s = ddp_ckpt_dir_state(d);
    size_t n = ddp_state_numel(s);
    c->n_params = ddp_state_n_params(s);
    c->descs = st == DDP_OK ? malloc((size_t)c->n_params * sizeof *c->descs) : NULL;
    c->params = st == DDP_OK ? malloc((n ? n : 1) * sizeof *c->params) : NULL;
    if (st == DDP_OK && (!c->descs || !c->params))
        st = DDP_ERR_NOMEM;
    if (st == DDP_OK) {
        memcpy(c->descs, ddp_state_descs(s), (size_t)c->n_params * sizeof *c->descs);
        st = ddp_ckpt_dir_read_f32(d, "params", 0, n, c->params);
    }
    ddp_ckpt_dir_close(d);
    return st;
}

static ddp_status ckpt_open(const char *path, int verify, ckpt_file *c)
{
    c->path = path;
    ddp_status st = ddp_checkpoint_is_folder(path) ? folder_params(path, verify, c)
                                    : ddp_checkpoint_load(path, &c->descs, &c->n_params, &c->params);
    if (st != DDP_OK)
        fprintf(stderr, "ddp-ckpt: %s: cannot load: %s\n", path, ddp_strerror(st));
    return st;
}

static void ckpt_close(ckpt_file *c)
{
    free(c->descs);
    free(c->params);
}

/* Writes "[512, 784]". */
static void shape_text(const ddp_param_desc *d, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < d->n_dims && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)d->shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

static int desc_equal(const ddp_param_desc *a, const ddp_param_desc *b)
{
    if (strncmp(a->name, b->name, DDP_NAME_MAX) != 0 || a->n_dims != b->n_dims)
        return 0;
    for (int i = 0; i < a->n_dims; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

/* Returns 1 when the signatures match; otherwise prints the first difference. */
static int ckpt_same_signature(const ckpt_file *a, const ckpt_file *b)
{
    if (a->n_params != b->n_params) {
        fprintf(stderr, "ddp-ckpt: signatures differ: %s has %d parameters, %s has %d\n", a->path,
                a->n_params, b->path, b->n_params);
        return 0;
    }
    for (int i = 0; i < a->n_params; i++) {
        if (desc_equal(&a->descs[i], &b->descs[i]))
            continue;
        char sa[96], sb[96];
        shape_text(&a->descs[i], sa, sizeof sa);
        shape_text(&b->descs[i], sb, sizeof sb);
        fprintf(stderr, "ddp-ckpt: signatures differ at parameter %d: %s has '%.*s' %s, %s has '%.*s' %s\n",
                i, a->path, DDP_NAME_MAX, a->descs[i].name, sa, b->path, DDP_NAME_MAX, b->descs[i].name, sb);
        return 0;
    }
    return 1;
}

/* |x - y| with NaN and infinity taken as values: 0 when both are NaN or both the same infinity,
 * infinite when only one is NaN (fmax would otherwise drop the NaN and call the values equal). */
static double value_diff(double x, double y)
{
    if (isnan(x) || isnan(y))
        return isnan(x) && isnan(y) ? 0.0 : INFINITY;
    return x == y ? 0.0 : fabs(x - y);
}

/* Largest |a-b| and relative difference of one parameter of n values; the scale is taken over
 * the finite values, and an infinite difference is an infinite relative difference. */
static void param_diff(const float *a, const float *b, size_t n, double *abs_diff, double *rel_diff)
{
    double diff = 0.0, scale = 1e-12;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, value_diff(a[i], b[i]));
        if (isfinite(a[i]))
            scale = fmax(scale, fabs((double)a[i]));
        if (isfinite(b[i]))
            scale = fmax(scale, fabs((double)b[i]));
    }
    *abs_diff = diff;
    *rel_diff = diff / scale;
}

/* Compares values parameter by parameter; prints the result; returns max_rel_diff. */
static double ckpt_compare(const ckpt_file *a, const ckpt_file *b)
{
    double max_abs = 0.0, max_rel = 0.0;
    int worst = 0;
    size_t offset = 0;
    for (int i = 0; i < a->n_params; i++) {
        size_t n = ddp_param_numel(&a->descs[i]);
        double abs_diff, rel_diff;
        param_diff(a->params + offset, b->params + offset, n, &abs_diff, &rel_diff);
        max_abs = fmax(max_abs, abs_diff);
        if (rel_diff > max_rel) {
            max_rel = rel_diff;
            worst = i;
        }
        offset += n;
    }
    printf("max_abs_diff=%.6g max_rel_diff=%.6g", max_abs, max_rel);
    if (max_rel > 0.0)
        printf(" (largest in %.*s)", DDP_NAME_MAX, a->descs[worst].name);
    putchar('\n');
    return max_rel;
}

/* Parses a command's options: --no-verify, and --tol X (X >= 0) where tol_ok; leaves the
 * operands at argv[optind..]. Returns CKPT_SAME, else CKPT_TROUBLE with the complaint printed. */
static int ckpt_parse_opts(int argc, char **argv, int tol_ok, ckpt_opts *o)
{
    static const struct option opts[] = {{"tol", required_argument, NULL, 't'},
                                         {"no-verify", no_argument, NULL, 'n'},
                                         {NULL, 0, NULL, 0}};
    *o = (ckpt_opts){.tol = -1.0, .verify = 1};
    opterr = 0;
    optind = 1;
    int id;
    while ((id = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (id == 'n') {
            o->verify = 0;
            continue;
        }
        if (id != 't' || !tol_ok)
            return ckpt_usage(id == ':' ? "--tol needs a value" : "unknown option");
        char *end = NULL;
        errno = 0;
        o->tol = strtod(optarg, &end);
        if (errno != 0 || end == optarg || *end != '\0' || !(o->tol >= 0.0) || !isfinite(o->tol)) {
            fprintf(stderr, "ddp-ckpt: --tol: expected a number >= 0, got '%s'\n", optarg);
            return CKPT_TROUBLE;
        }
    }
    return CKPT_SAME;
}

static int ckpt_diff(int argc, char **argv)
{
    ckpt_opts o;
    int rc = ckpt_parse_opts(argc, argv, 1, &o);
    double tol = o.tol;
    if (rc != CKPT_SAME)
        return rc;
    if (argc - optind != 2)
        return ckpt_usage("diff needs two checkpoint files");
    ckpt_file a = {0}, b = {0};
    rc = CKPT_TROUBLE;
    if (ckpt_open(argv[optind], o.verify, &a) == DDP_OK &&
        ckpt_open(argv[optind + 1], o.verify, &b) == DDP_OK) {
        rc = CKPT_DIFFERENT;
        if (ckpt_same_signature(&a, &b)) {
            double rel = ckpt_compare(&a, &b);
            rc = tol >= 0.0 && rel > tol ? CKPT_DIFFERENT : CKPT_SAME;
            if (rc != CKPT_SAME)
                fprintf(stderr, "ddp-ckpt: max_rel_diff %.6g exceeds --tol %g\n", rel, tol);
        }
    }
    ckpt_close(&a);
    ckpt_close(&b);
    return rc;
}

/* The training state's entries besides the parameters: arrays by size, values and texts in full
 * (a folder's files were verified, or not, by ckpt_open). */
static void ckpt_show_state(const char *path)
{
    ddp_state *loaded = NULL;
    ddp_ckpt_dir *folder = NULL;
    if (ddp_checkpoint_open(path, 0, &loaded, &folder) != DDP_OK)
        return;
    const ddp_state *st = ddp_checkpoint_state(loaded, folder);
    if (folder)
        printf("checkpoint folder: %d files (one per rank that wrote it)\n",
               ddp_ckpt_dir_n_files(folder));
    printf("format version %d; training state:%s\n", ddp_state_version(st),
           ddp_state_n_entries(st) > 2 ? "" : " none (parameters only)");
    for (int i = 2; i < ddp_state_n_entries(st); i++) {
        const char *name;
        ddp_state_kind kind;
        uint64_t count, u = 0;
        double d = 0.0;
        ddp_state_entry_info(st, i, &name, &kind, &count);
        if (kind == DDP_STATE_F32)
            printf("  %s: %llu float32 values\n", name, (unsigned long long)count);
        else if (kind == DDP_STATE_U64 && ddp_state_u64(st, name, &u))
            printf("  %s = %llu\n", name, (unsigned long long)u);
        else if (kind == DDP_STATE_F64 && ddp_state_f64(st, name, &d))
            printf("  %s = %.17g\n", name, d);
        else if (kind == DDP_STATE_TEXT)
            printf("  %s = %s\n", name, ddp_state_text(st, name));
    }
    ddp_state_destroy(loaded);
    ddp_ckpt_dir_close(folder);
}

static int ckpt_show(int argc, char **argv)
{
    ckpt_opts o;
    if (ckpt_parse_opts(argc, argv, 0, &o) != CKPT_SAME)
        return CKPT_TROUBLE;
    if (argc - optind != 1)
        return ckpt_usage("show needs one checkpoint file");
    ckpt_file c = {0};
    if (ckpt_open(argv[optind], o.verify, &c) != DDP_OK)
        return CKPT_TROUBLE;
    size_t total = 0;
    printf("%s: %d parameters\n", c.path, c.n_params);
    for (int i = 0; i < c.n_params; i++) {
        char shape[96];
        size_t n = ddp_param_numel(&c.descs[i]);
        shape_text(&c.descs[i], shape, sizeof shape);
        printf("  %2d %-24.*s %-20s %zu\n", i, DDP_NAME_MAX, c.descs[i].name, shape, n);
        total += n;
    }
    printf("total: %zu values\n", total);
    ckpt_show_state(c.path);
    ckpt_close(&c);
    return CKPT_SAME;
}

/* list FOLDER: its files with their sizes. */
static int list_folder(const char *path)
{
    ddp_ckpt_dir *d = NULL;
    if (ddp_ckpt_dir_open(path, &d) != DDP_OK) {
        fprintf(stderr, "ddp-ckpt: %s: not a complete checkpoint folder (see above)\n", path);
        return CKPT_TROUBLE;
    }
    uint64_t step = 0;
    ddp_state_u64(ddp_ckpt_dir_state(d), "step", &step);
    printf("%s: checkpoint folder, step %llu, %d files\n", path, (unsigned long long)step,
           ddp_ckpt_dir_n_files(d));
    for (int i = 0; i < ddp_ckpt_dir_n_files(d); i++) {
        struct stat sb;
        const char *f = ddp_ckpt_dir_file(d, i);
        printf("  %-5d %-40s %lld bytes\n", i, f, stat(f, &sb) == 0 ? (long long)sb.st_size : -1LL);
    }
    ddp_ckpt_dir_close(d);
    return CKPT_SAME;
}

/* list DIR (a --checkpoint-dir): each "step-*.ckpt", what it is and whether it is complete. */
static int list_dir(const char *path)
{
    DIR *dir = opendir(path);
    if (!dir) {
        fprintf(stderr, "ddp-ckpt: %s: cannot list it: %s\n", path, strerror(errno));
        return CKPT_TROUBLE;
    }
    struct dirent *de;
    char full[8192], manifest[8300];
    while ((de = readdir(dir)) != NULL) {
        if (strncmp(de->d_name, "step-", 5) != 0)
            continue;
        snprintf(full, sizeof full, "%s/%s", path, de->d_name);
        snprintf(manifest, sizeof manifest, "%s/%s", full, DDP_CKPT_MANIFEST);
        struct stat sb;
        int folder = ddp_checkpoint_is_folder(full);
        printf("  %-28s %-6s %s\n", de->d_name, folder ? "folder" : "file",
               !folder ? "" : stat(manifest, &sb) == 0 ? "complete" : "incomplete (no MANIFEST)");
    }
    closedir(dir);
    return CKPT_SAME;
}

static int ckpt_list(int argc, char **argv)
{
    if (argc != 2)
        return ckpt_usage("list needs one path");
    char manifest[8300];
    snprintf(manifest, sizeof manifest, "%s/%s", argv[1], DDP_CKPT_MANIFEST);
    struct stat sb;
    if (!ddp_checkpoint_is_folder(argv[1]))
        return ckpt_usage("list needs a checkpoint folder or a --checkpoint-dir");
    return stat(manifest, &sb) == 0 ? list_folder(argv[1]) : list_dir(argv[1]);
}

static int ckpt_verify(int argc, char **argv)
{
    if (argc != 2)
        return ckpt_usage("verify needs one checkpoint file or folder");
    const char *path = argv[1];
    ddp_state *s = NULL;
    ddp_ckpt_dir *d = NULL;
    ddp_status st = ddp_checkpoint_open(path, 1, &s, &d);
    ddp_state_destroy(s);
    ddp_ckpt_dir_close(d);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-ckpt: %s: not valid: %s (see above)\n", path, ddp_strerror(st));
        return CKPT_TROUBLE;
    }
    printf("%s: valid\n", path);
    return CKPT_SAME;
}

static int ckpt_consolidate(int argc, char **argv)
{
    ckpt_opts o;
    if (ckpt_parse_opts(argc, argv, 0, &o) != CKPT_SAME)
        return CKPT_TROUBLE;
    if (argc - optind != 2)
        return ckpt_usage("consolidate needs a checkpoint folder and a file to write");
    const char *in = argv[optind], *out = argv[optind + 1];
    ddp_ckpt_dir *d = NULL;
    ddp_status st = folder_open(in, o.verify, &d);
    if (st == DDP_OK)
        st = ddp_ckpt_dir_consolidate(d, out);
    ddp_ckpt_dir_close(d);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-ckpt: consolidate %s: %s (see above)\n", in, ddp_strerror(st));
        return CKPT_TROUBLE;
    }
    printf("wrote %s\n", out);
    return CKPT_SAME;
}

/* OUT of export-llmc: the rule ddp-train checks --save-llmc by before training (common/out_path.h),
 * checked before the checkpoint is read. *target (malloc'ed) is the file to write. Returns 0, or 2
 * with the reason printed. */
static int export_target(const char *path, char **target)
{
    char why[1024];
    if (out_path_target(path, target, why, sizeof why) != OUT_PATH_OK ||
        out_path_probe_dir(*target, why, sizeof why) != OUT_PATH_OK) {
        fprintf(stderr, "ddp-ckpt: export-llmc: output %s%s\n", path, why);
        free(*target);
        *target = NULL;
        return CKPT_TROUBLE;
    }
    return CKPT_SAME;
}

/* 1 when path is a folder or a regular file that opens; else 0, the reason printed (a FIFO or
 * other special file is refused without being read: common/in_path.h). */
static int input_opens(const char *path, const char *cmd)
{
    char why[512];
    if (ddp_checkpoint_is_folder(path))
        return 1;
    int fd = in_path_open(path, NULL, why, sizeof why);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    fprintf(stderr, "ddp-ckpt: %s: %s%s\n", cmd, path, why);
    return 0;
}

/* export-llmc CKPT OUT: the checkpoint's parameters in llm.c's file (gpt2_llmc_write, the writer of
 * --save-llmc: the same bytes for the same weights). The output is checked before the checkpoint
 * is read, so a bad path costs no read of a large model. */
static int ckpt_export_llmc(int argc, char **argv)
{
    ckpt_opts o;
    if (ckpt_parse_opts(argc, argv, 0, &o) != CKPT_SAME)
        return CKPT_TROUBLE;
    if (argc - optind != 2)
        return ckpt_usage("export-llmc needs a GPT-2 checkpoint (file or folder) and the llm.c "
                          "model file to write");
    const char *in = argv[optind], *out = argv[optind + 1];
    char *target = NULL;
    int rc = export_target(out, &target);
    if (rc != CKPT_SAME) {
        free(target);
        return rc;
    }
    struct stat a, b;
    if (stat(in, &a) == 0 && stat(target, &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino) {
        fprintf(stderr, "ddp-ckpt: export-llmc: the output %s is the checkpoint %s itself: name "
                "another file\n", out, in);
        free(target);
        return CKPT_TROUBLE;
    }
    if (!input_opens(in, "export-llmc")) {
        free(target);
        return CKPT_TROUBLE;
    }
    if (!gpt2_ckpt_is_ddp(in)) {
        fprintf(stderr, "ddp-ckpt: export-llmc: %s is not a ddp checkpoint (a file starting with "
                "DDPCKPT1, or a checkpoint folder with its %s): give one that ddp-train --model "
                "gpt2 wrote with --save or --checkpoint-dir\n", in, DDP_CKPT_MANIFEST);
        free(target);
        return CKPT_TROUBLE;
    }
    gpt2_ckpt c;
    ddp_status st = gpt2_ckpt_read(in, "ddp-ckpt export-llmc", o.verify, &c);
    if (st == DDP_OK)
        st = gpt2_llmc_write(target, &c.cfg, c.params, DDP_FP32);
    if (st != DDP_OK) {
        fprintf(stderr, "ddp-ckpt: export-llmc %s: %s (see above); nothing was written\n", in,
                ddp_strerror(st));
        rc = CKPT_TROUBLE;
    } else {
        printf("wrote %s (llm.c model file, fp32: L %d, heads %d, channels %d, positions %d, "
               "vocabulary %d padded to %d) from the weights of %s at step %llu\n", out,
               c.cfg.layers, c.cfg.heads, c.cfg.channels, c.cfg.max_seq, c.cfg.vocab,
               c.cfg.padded_vocab, in, (unsigned long long)c.step);
    }
    gpt2_ckpt_free(&c);
    free(target);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return ckpt_usage("missing command");
    if (strcmp(argv[1], "show") == 0)
        return ckpt_show(argc - 1, argv + 1);
    if (strcmp(argv[1], "diff") == 0)
        return ckpt_diff(argc - 1, argv + 1);
    if (strcmp(argv[1], "list") == 0)
        return ckpt_list(argc - 1, argv + 1);
    if (strcmp(argv[1], "verify") == 0)
        return ckpt_verify(argc - 1, argv + 1);
    if (strcmp(argv[1], "consolidate") == 0)
        return ckpt_consolidate(argc - 1, argv + 1);
    if (strcmp(argv[1], "export-llmc") == 0)
        return ckpt_export_llmc(argc - 1, argv + 1);
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(ckpt_usage_text, stdout);
        return CKPT_SAME;
    }
    return ckpt_usage("unknown command (expected show, diff, list, verify, consolidate or "
                      "export-llmc)");
}
