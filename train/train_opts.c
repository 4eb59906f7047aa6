/* train_opts.c - ddp-train command line: one table of flags, from which come getopt_long's table,
 * --help, each value's check and the "did you mean" of a mistyped flag; the checks across flags
 * run after the table's. */
#include "train_opts.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "argnum.h"
#include "suggest.h"

/* A macro's value as a string literal (the library's defaults in the usage text). */
#define TRAIN_STR_(x) #x
#define TRAIN_STR(x) TRAIN_STR_(x)

/* How a flag's value is read: see flag_row. */
typedef enum arg_kind {
    ARG_FLAG, ARG_INT, ARG_LONG, ARG_REAL, ARG_WORD, ARG_STR, ARG_FN, ARG_HELP, ARG_TEXT
} arg_kind;

/* The models a flag applies to; the others' flags are refused, all named in one message. */
typedef enum arg_scope { FOR_ANY, FOR_MNIST, FOR_GPT } arg_scope;

/* One flag: its name, its value's kind and range, where it is stored, its default and its help. */
typedef struct flag_row flag_row;
struct flag_row {
    const char *name;  /* without the dashes; NULL for ARG_TEXT, a paragraph of --help */
    const char *meta;  /* its value in --help ("N", "cpu|cuda|auto"); NULL: no value */
    arg_scope scope;
    arg_kind kind;
    size_t off;    /* offsetof(train_opts, the field): an int, a long, a double or a const char * */
    long min, max; /* ARG_INT, ARG_LONG: the range; ARG_FLAG: the value set; ARG_WORD: the first
                      word's */
    double lo, hi; /* ARG_REAL: the range, its ends closed or open as ends says */
    const char *ends; /* "[]", "[)" or "(]" */
    const char *words; /* ARG_WORD: "a|b|c" (NULL: meta's) */
    /* ARG_FN: reads the value in place of a kind: 0, or -1 with the complaint printed */
    int (*fn)(const flag_row *r, const char *v, train_opts *o);
    double def;        /* the default of an ARG_FLAG, ARG_INT, ARG_LONG or ARG_REAL (0: none set) */
    const char *help;  /* --help's lines beside the flag, '\n' between; NULL: none */
};

/* Each AS_ ends with .def, so that the help after it in a row is the next field. */
#define OFF(f) .off = offsetof(train_opts, f)
#define AS_FLAG(f, v, d) .kind = ARG_FLAG, OFF(f), .min = v, .def = d
#define AS_INT(f, a, b, d) .kind = ARG_INT, OFF(f), .min = a, .max = b, .def = d
#define AS_LONG(f, a, b, d) .kind = ARG_LONG, OFF(f), .min = a, .max = b, .def = d
#define AS_REAL(f, e, a, b, d) .kind = ARG_REAL, OFF(f), .ends = e, .lo = a, .hi = b, .def = d
#define AS_WORD(f, w, base) .kind = ARG_WORD, OFF(f), .words = w, .min = base, .def = 0
#define AS_STR(f) .kind = ARG_STR, OFF(f), .def = 0
#define AS_FN(p) .kind = ARG_FN, .fn = p, .def = 0
#define AS_HELP .kind = ARG_HELP, .def = 0
#define TEXT(s) {.kind = ARG_TEXT, .help = s}

/* ARG_WORD writes its index through an int. */
_Static_assert(sizeof(ddp_dtype) == sizeof(int), "--precision and --grad-dtype are stored as int");

/* A value of r's kind read whole (common/argnum.c): 0, or -1 with the complaint printed. */
static int parse_long(const flag_row *r, const char *text, long *out)
{
    return argnum_long("ddp-train", r->name, text, r->min, r->max, out);
}

static int parse_real(const flag_row *r, const char *text, double *out)
{
    return argnum_real("ddp-train", r->name, text, r->lo, r->hi, r->ends, out);
}

/* The index of text among r's words (its meta when it has none), plus r->min. */
static int parse_word(const flag_row *r, const char *text, int *out)
{
    return argnum_word("ddp-train", r->name, r->words ? r->words : r->meta, text, (int)r->min, out);
}

/* A word of r's meta that its parser refused: the complaint, -1. */
static int bad_word(const flag_row *r, const char *v)
{
    int i;
    (void)argnum_word("ddp-train", r->name, r->meta, v, 0, &i);
    return -1;
}

static int parse_model(const flag_row *r, const char *v, train_opts *o)
{
    o->gpt.on = strcmp(v, "gpt2") == 0;
    if (o->gpt.on || model_kind_parse(v, &o->model.kind) == DDP_OK)
        return 0;
    return bad_word(r, v);
}

static int parse_device(const flag_row *r, const char *v, train_opts *o)
{
    return ddp_backend_parse(v, &o->device) == DDP_OK ? 0 : bad_word(r, v);
}

static int parse_widths(const flag_row *r, const char *v, train_opts *o)
{
    if (model_widths_parse(v, &o->model) == DDP_OK)
        return 0;
    fprintf(stderr,
            "ddp-train: --widths: expected widths like 784-512-256-10 (784 first, 10 last, each 1 "
            "to %d, at most %d layers), got '%s'\n",
            MODEL_MLP_MAX_WIDTH, MODEL_MLP_MAX_LAYERS, v);
    return -1;
}

static int parse_preset(const flag_row *r, const char *v, train_opts *o)
{
    if (gpt2_config_preset(v, &o->gpt.cfg) == DDP_OK)
        return 0;
    fprintf(stderr,
            "ddp-train: --gpt-config: expected d12, d24, d36 or d48 (GPT-2 124M, 350M, 774M, "
            "1.5B), got '%s'\n", v);
    return -1;
}

static int parse_seed(const flag_row *r, const char *v, train_opts *o)
{
    char *end = NULL;
    errno = 0;
    unsigned long long seed = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || !isdigit((unsigned char)v[0])) {
        fprintf(stderr, "ddp-train: --seed: expected a non-negative integer, got '%s' (allowed: 0 "
                        "to %llu)\n", v, (unsigned long long)UINT64_MAX);
        return -1;
    }
    o->seed = (uint64_t)seed;
    return 0;
}

/* RANK:STEP for --inject-inf. */
static int parse_inject(const flag_row *r, const char *v, train_opts *o)
{
    char *end = NULL;
    errno = 0;
    long rank = strtol(v, &end, 10);
    long step = end && *end == ':' ? strtol(end + 1, &end, 10) : -1;
    if (errno != 0 || !isdigit((unsigned char)v[0]) || *end != '\0' || rank < 0 || rank > INT_MAX ||
        step < 0 || o->n_inject == 8) {
        fprintf(stderr, "ddp-train: --inject-inf: expected RANK:STEP with non-negative integers "
                        "(at most 8 times), got '%s'\n", v);
        return -1;
    }
    o->inject_rank[o->n_inject] = (int)rank;
    o->inject_step[o->n_inject++] = step;
    return 0;
}

/* --peak-tflops: a positive number of TFLOP/s, with what to give on a bad value. */
static int parse_peak(const flag_row *r, const char *v, train_opts *o)
{
    if (parse_real(r, v, &o->gpt.peak_tflops) == 0)
        return 0;
    fprintf(stderr, "ddp-train: --peak-tflops is one device's peak in TFLOP/s for the run's "
                    "precision, e.g. --peak-tflops 989.4 for an H100 SXM in bf16 (dense); leave it "
                    "out to use the table of GPUs\n");
    return -1;
}

/* Every flag, in --help's order (the order the other model's flags are named in when refused). The
 * batch is not limited here: rank 0's data size bounds it. */
static const flag_row rows[] = {
    TEXT("usage: ddp-train [options]   (run one process, or many with mpirun / srun / "
         "ddp-launch)\n"),
    {"model", "mlp|cnn|gpt2", FOR_ANY, AS_FN(parse_model),
     "model (default mlp; gpt2: see the GPT-2 flags at the end)"},
    {"widths", "W-W-..", FOR_MNIST, AS_FN(parse_widths),
     "MLP layer widths, 784 first, 10 last (default 784-512-256-10)"},
    {"data", "DIR", FOR_ANY, AS_STR(data_dir),
     "MNIST IDX folder, files plain or .gz (default data/mnist;\n"
     "scripts/fetch-mnist.sh fills it)"},
    {"epochs", "N", FOR_ANY, AS_INT(epochs, 1, TRAIN_MAX_EPOCHS, 8), "epochs (default 8)"},
    {"max-steps", "N", FOR_ANY, AS_LONG(max_steps, 0, TRAIN_MAX_STEPS, 0),
     "stop after N optimizer steps, 0 = no limit (default 0)"},
    {"batch", "N", FOR_ANY, AS_INT(batch, 1, INT_MAX, 64),
     "samples per rank per micro-step (default 64)"},
    {"accum", "K", FOR_ANY, AS_INT(accum, 1, INT_MAX, 1),
     "micro-steps per optimizer step (gradient accumulation, default 1)"},
    {"global-batch", "N", FOR_MNIST, AS_LONG(global_batch, 1, LONG_MAX / 2, 0),
     "samples per optimizer step over all ranks (whole --batch micro-batches,\n"
     "shared by the ranks, unevenly where needed): sets --accum, the same at\n"
     "any world size"},
    {"lr", "X", FOR_ANY, AS_REAL(lr, "[]", TRAIN_MIN_LR, TRAIN_MAX_LR, 0.05),
     "learning rate (default 0.05)"},
    {"momentum", "X", FOR_MNIST, AS_REAL(momentum, "[)", 0, 1, 0.9),
     "SGD momentum in [0, 1) (default 0.9)"},
    {"lr-schedule", "S", FOR_MNIST, AS_WORD(cosine, "constant|cosine", 0),
     "constant, or cosine: decays the rate to 0 over the planned steps"},
    {"weight-decay", "X", FOR_ANY, AS_REAL(weight_decay, "[]", 0, TRAIN_MAX_WEIGHT_DECAY, 0),
     "L2 weight decay (default 0)"},
    {"seed", "N", FOR_ANY, AS_FN(parse_seed), "initialisation and shuffling seed (default 42)"},
    {"bucket-mb", "X", FOR_ANY,
     AS_REAL(bucket_mb, "(]", 0, TRAIN_MAX_BUCKET_MB, DDP_BUCKET_MB_DEFAULT),
     "gradient bucket cap, MiB (default " TRAIN_STR(DDP_BUCKET_MB_DEFAULT) ")"},
    {"first-bucket-mb", "X", FOR_ANY,
     AS_REAL(first_bucket_mb, "(]", 0, TRAIN_MAX_BUCKET_MB, DDP_FIRST_BUCKET_MB_DEFAULT),
     "first bucket cap, MiB (default " TRAIN_STR(DDP_FIRST_BUCKET_MB_DEFAULT) ")"},
    {"zero", "0|1|2", FOR_ANY, AS_INT(zero, 0, 2, 0),
     "ZeRO sharding over the ranks (default 0: none): 1 shards the\n"
     "optimizer state (gradients reduce-scattered, parameters\n"
     "all-gathered), 2 also keeps only this rank's shard of the gradients\n"
     "(no full gradient buffer: backward writes into bucket buffers\n"
     "that are reduce-scattered; GPT: see --zero-accum)"},
    {"device", "cpu|cuda|auto", FOR_ANY, AS_FN(parse_device), "backend (default auto)"},
    {"threads", "N", FOR_ANY, AS_INT(threads, 1, TRAIN_MAX_THREADS, 1),
     "BLAS threads per rank on the CPU (default 1)"},
    {"precision", "P", FOR_ANY, AS_WORD(model.precision, "fp32|bf16|fp16", 0),
     "fp32, bf16 or fp16 (default fp32): activations and GEMM/convolution\n"
     "inputs in 16 bits, fp32 accumulation, fp32 master weights, optimizer\n"
     "state, loss and softmax. bf16 on the CPU runs natively with\n"
     "AVX512_BF16 (or AMX), elsewhere emulated like fp16; fp16 is emulated\n"
     "(values rounded to fp16, arithmetic in fp32; on a GPU on TF32 tensor\n"
     "cores, exact for fp16 values); bf16 on a GPU needs compute\n"
     "capability 8.0 (Ampere) or newer"},
    {"tf32", NULL, FOR_ANY, AS_FLAG(tf32, 1, 0),
     "TF32 tensor cores for fp32 GEMMs and convolutions on the GPU (like\n"
     "torch.backends.cuda.matmul.allow_tf32); ignored on the CPU"},
    {"metrics", "FILE", FOR_ANY, AS_STR(metrics_path),
     "rank 0 writes JSON lines: one per epoch, then a summary (each line whole; the\n"
     "folder is created; --resume appends)"},
    {"tensorboard", "DIR", FOR_ANY, AS_STR(tensorboard_dir),
     "rank 0 writes a TensorBoard event file in DIR (tensorboard --logdir DIR):\n"
     "loss, learning rate, gradient norm, throughput, MFU, evaluations, memory"},
    {"prometheus", "FILE", FOR_ANY, AS_STR(prometheus_path),
     "rank 0 rewrites FILE (a .prom file for node_exporter's textfile\n"
     "collector) as the progress lines come (--log-every) and after\n"
     "evaluations, at most once a second, and at the end"},
    {"save", "FILE", FOR_ANY, AS_STR(save_path),
     "rank 0 writes the trained parameters as a checkpoint (FILE: see below)"},
    {"augment", NULL, FOR_MNIST, AS_FLAG(augment, 1, 0),
     "shift each training image by up to 2 pixels (from seed, epoch, sample)"},
    {"no-shuffle", NULL, FOR_ANY, AS_FLAG(shuffle, 0, 1),
     "keep the data order (identity permutation)"},
    {"log-every", "N", FOR_ANY, AS_INT(log_every, 1, INT_MAX, 50),
     "progress line every N steps when not on a terminal (default 50)"},
    {"broadcast-init", NULL, FOR_ANY, AS_FLAG(broadcast_init, 1, 0),
     "copy rank 0's initial parameters to every rank"},
    {"grad-dtype", "T", FOR_ANY, AS_WORD(grad_dtype, "fp32|bf16|fp16", 0),
     "gradient all-reduce in fp32, bf16 or fp16 (default fp32): 16 bits halve\n"
     "the bytes (PyTorch's compression hooks); fp16 (here or in --precision)\n"
     "adds dynamic loss scaling"},
    {"loss-scale-init", "X", FOR_ANY, AS_REAL(loss_scale_init, "(]", 0, FLT_MAX, 65536),
     "fp16: first loss scale (default 65536, as torch's GradScaler)"},
    {"loss-scale-interval", "N", FOR_ANY, AS_LONG(loss_scale_interval, 1, LONG_MAX, 2000),
     "fp16: steps without inf/NaN before the scale doubles (default 2000)"},
    {"workers", "N", FOR_ANY, AS_INT(workers, 0, TRAIN_MAX_WORKERS, 1),
     "data threads that prepare the next batches (default 1; 0 = none);\n"
     "batches are the same whatever N"},
    {"inject-inf", "RANK:STEP", FOR_ANY, AS_FN(parse_inject),
     "test aid: make RANK's gradients inf at optimizer STEP (0-based; needs\n"
     "--grad-dtype fp16 or --precision fp16): every rank must skip that\n"
     "step; up to 8 times"},
    {"no-overlap", NULL, FOR_ANY, AS_FLAG(no_overlap, 1, 0),
     "launch every gradient bucket after the backward pass (no overlap)"},
    {"trace", "FILE", FOR_ANY, AS_STR(trace_path),
     "rank 0 writes the job's timeline (Chrome trace-event JSON: open it in\n"
     "Perfetto or chrome://tracing); the summary then prints the exposed\n"
     "communication per step and the part hidden behind backward"},
    {"link-check", NULL, FOR_ANY, AS_FLAG(link_check, 1, 0),
     "before training, measure each rank's links to its ring neighbours\n"
     "and rank 0, and name nodes whose links are under half the median"},
    {"straggler-every", "N", FOR_ANY, AS_INT(straggler_every, 0, INT_MAX, DDP_STRAGGLER_EVERY),
     "every N steps name the slow ranks (default " TRAIN_STR(DDP_STRAGGLER_EVERY) ", 0: off)"},
    {"straggler-threshold", "X", FOR_ANY, AS_REAL(straggler_threshold, "(]", 1, 100, 1.5),
     "... slow: compute over X times the others' median (1.5; docs/running.md)"},
    {"nan-policy", "stop|skip", FOR_ANY, AS_WORD(nan_skip, NULL, 0),
     "a NaN/inf loss stops the run with exit 1 (stop, default) or its step\n"
     "is not applied (skip)"},
    {"checkpoint-dir", "DIR", FOR_ANY, AS_STR(checkpoint_dir),
     "the full training state goes to DIR/step-N.ckpt (created; locked\n"
     "against a second job; see --checkpoint-format)"},
    {"checkpoint-every", "N", FOR_ANY, AS_LONG(checkpoint_every, 0, LONG_MAX, 0),
     "... every N optimizer steps (default 0: on a stop and at the end)"},
    {"keep", "K", FOR_ANY, AS_INT(keep, 1, INT_MAX, 3),
     "checkpoints kept in DIR, older ones removed (default 3)"},
    {"checkpoint-errors", "E", FOR_ANY, AS_WORD(checkpoint_errors_warn, "stop|warn", 0),
     "stop (default: a failed save ends the run, exit 1) or warn (go on)"},
    {"checkpoint-format", "F", FOR_ANY, AS_WORD(checkpoint_format, "auto|file|folder", 0),
     "auto (default: folder when every rank sees DIR, checked at start-up,\n"
     "else file), file (rank 0 writes DIR/step-N.ckpt) or folder (every rank\n"
     "writes its shard into the folder DIR/step-N.ckpt/, rank 0 a MANIFEST)"},
    {"checkpoint-async", NULL, FOR_ANY, AS_FLAG(checkpoint_async, 1, 0),
     "(folder) each rank copies its shard to host memory and a background\n"
     "thread writes it while training goes on; a save waits for the one\n"
     "before, the save at the end of the run is written at once"},
    {"resume", "auto|FILE", FOR_ANY, AS_STR(resume),
     "continue bit-identically from FILE, or (auto) from the newest valid\n"
     "checkpoint in DIR, starting fresh when there is none"},
    {"snapshot-dir", "DIR", FOR_ANY, AS_STR(snapshot_dir),
     "elastic (ddp-launch --max-restarts sets DDP_SNAPSHOT_DIR): when a peer\n"
     "is lost, the survivors leave their last step there (node-local, e.g.\n"
     "/dev/shm), which the next generation resumes from (needs\n"
     "--checkpoint-dir, the fallback; --zero 0 on the CPU); %h in DIR: the\n"
     "node's name; off: none"},
    {"resume-reshard", NULL, FOR_ANY, AS_FLAG(resume_reshard, 1, 0),
     "allow resuming with another number of ranks (no longer bit-identical)"},
    {"requeue", NULL, FOR_ANY, AS_FLAG(requeue, 1, 0),
     "under Slurm: after a stop by signal, rank 0 runs scontrol requeue"},
    {"help", NULL, FOR_ANY, AS_HELP, "this text"},
    TEXT("SIGUSR1 (e.g. sbatch --signal=USR1@120) or SIGTERM (time limit, scancel) stops every "
         "rank after\n"
         "the same step; rank 0 then writes a checkpoint into --checkpoint-dir, evaluates, writes "
         "--save\n"
         "and the metrics summary (\"stopped_by_signal\": true); with --requeue it requeues the "
         "job; all\n"
         "exit 0.\n"
         "--save and --trace replace FILE atomically (a temporary file renamed over it), so FILE "
         "must be a\n"
         "new or a regular file; a symbolic link is followed to the file it names, which must "
         "exist. A\n"
         "folder, a device (/dev/null too), a FIFO, a socket or a dangling link is refused before "
         "training,\n"
         "as is a folder that does not accept a new file.\n"
         "DDP_TIMEOUT=S: the deadline of every collective, 0.1 to 604800 seconds (default 300); "
         "any other\n"
         "value stops every rank before training.\n"),
    TEXT("GPT-2 (--model gpt2; AdamW, warm-up then cosine decay, global-norm clipping):\n"),
    {"gpt-config", "d12|d24|d36|d48", FOR_GPT, AS_FN(parse_preset),
     "GPT-2 124M, 350M, 774M, 1.5B (default d12)"},
    TEXT("  --layers N --heads N --channels N   a smaller model (override the preset's sizes)\n"),
    {"layers", "N", FOR_GPT, AS_INT(gpt.cfg.layers, 1, GPT2_MAX_LAYERS, 0), NULL},
    {"heads", "N", FOR_GPT, AS_INT(gpt.cfg.heads, 1, 1024, 0), NULL},
    {"channels", "N", FOR_GPT, AS_INT(gpt.cfg.channels, 1, 65536, 0), NULL},
    {"seq", "T", FOR_GPT, AS_INT(gpt.seq, 1, 1 << 20, 64),
     "tokens per sequence (default 64, at most 1024)"},
    TEXT("  --data PATTERN          llm.c token shards (default data/text/austen_train_*.bin;\n"
         "                          scripts/fetch-text.sh makes them); --batch is sequences per "
         "rank\n"),
    {"val-data", "PATTERN", FOR_GPT, AS_STR(gpt.val_data),
     "validation shards (default: PATTERN with train -> val)"},
    {"val-every", "N", FOR_GPT, AS_INT(gpt.val_every, 0, INT_MAX, 0),
     "validation loss every N steps and at the end (default 0: the end)"},
    {"val-max-batches", "N", FOR_GPT, AS_LONG(gpt.val_batches, 0, LONG_MAX, 0),
     "cap the validation batches per rank (default 0: every token)"},
    {"total-batch-tokens", "N", FOR_GPT, AS_LONG(gpt.total_batch_tokens, 1, LONG_MAX / 2, 0),
     "tokens per optimizer step over all ranks (llm.c's -d): sets --accum"},
    {"warmup-steps", "N", FOR_GPT, AS_LONG(gpt.warmup_steps, 0, TRAIN_MAX_STEPS, 0),
     "linear warm-up steps (default 0); then cosine decay to"},
    {"lr-floor", "F", FOR_GPT, AS_REAL(gpt.lr_floor, "[]", 0, 1, 0.1),
     "... lr x F at the last step (default 0.1; --lr default 6e-4,\n"
     "--weight-decay default 0.1, on 2-D weights only)"},
    {"grad-clip", "X", FOR_GPT, AS_REAL(gpt.grad_clip, "[]", 0, 1e6, 1),
     "clip the global gradient norm to X (default 1.0; 0: off)"},
    {"init-from", "FILE", FOR_GPT, AS_STR(gpt.init_from),
     "start from the weights of an llm.c model file (gpt2_124M.bin: fp32\n"
     "or bf16) or of a GPT-2 ddp checkpoint (file or folder): the sizes\n"
     "are its own; optimizer, step and schedule start afresh"},
    {"save-llmc", "FILE", FOR_GPT, AS_STR(gpt.save_llmc),
     "write the trained weights as an llm.c model file (fp32)"},
    {"sample", "N", FOR_GPT, AS_INT(gpt.sample, 0, TRAIN_MAX_SAMPLE, 0),
     "rank 0 prints N tokens generated after training (needs --vocab)"},
    {"prompt", "TEXT", FOR_GPT, AS_STR(gpt.prompt),
     "... that continue TEXT (GPT-2's BPE: needs vocab.bpe beside the\n"
     "vocabulary; default: from <|endoftext|>)"},
    {"temperature", "X", FOR_GPT, AS_REAL(gpt.temperature, "[]", 0, 100, 1),
     "... drawn at temperature X (default 1; 0: the most likely token)"},
    {"top-k", "K", FOR_GPT, AS_INT(gpt.top_k, 0, 1000000, 0),
     "... among the K most likely tokens (default 0: all)"},
    {"sample-only", NULL, FOR_GPT, AS_FLAG(gpt.sample_only, 1, 0),
     "no training: sample from --init-from FILE (an llm.c model file or a\n"
     "ddp checkpoint) or --resume FILE; --sample defaults to 256; with\n"
     "--save-llmc it also exports the weights"},
    {"vocab", "FILE", FOR_GPT, AS_STR(gpt.vocab),
     "GPT-2's encoder.json or llm.c's gpt2_tokenizer.bin (default: the\n"
     "one beside the data, encoder.json first)"},
    {"recompute", NULL, FOR_GPT, AS_FLAG(gpt.recompute, 1, 0),
     "activation checkpointing: each block keeps only its input and runs\n"
     "its forward again during backward (less memory; up to 22 % more\n"
     "block compute, see docs/gpt2.md)"},
    {"zero-accum", "local|reduce", FOR_GPT, AS_WORD(gpt.zero_accum, NULL, 1),
     "--zero 2 with --accum > 1: local (default) adds the micro-steps\n"
     "in the bucket buffers and reduce-scatters once (bit-identical to\n"
     "--zero 0; the full gradients alive while accumulating); reduce\n"
     "reduce-scatters every micro-step (the gradient memory saved; sums\n"
     "in another order, a rounding apart)"},
    {"peak-tflops", "X", FOR_GPT, .fn = parse_peak,
     AS_REAL(gpt.peak_tflops, "(]", 0, TRAIN_MAX_PEAK_TFLOPS, 0),
     "the peak TFLOP/s of one device that the MFU (model FLOPs per\n"
     "token 6N + 6LCT, llm.c's count, x tokens/s per rank) is measured\n"
     "against (default: a table of NVIDIA GPUs by name and precision;\n"
     "on the CPU or an unknown GPU the MFU is not printed)"},
};

#define N_ROWS (sizeof rows / sizeof rows[0])
#define OPT_ID0 1000 /* getopt_long's value of rows[i] is OPT_ID0 + i */

/* The rows' defaults, then those of the values without a row of numbers (0 is --device auto and
 * --grad-dtype fp32). */
static void train_opts_default(train_opts *o)
{
    memset(o, 0, sizeof *o);
    model_config_default(&o->model, MODEL_MLP);
    gpt2_config_preset("d12", &o->gpt.cfg);
    for (const flag_row *r = rows; r < rows + N_ROWS; r++) {
        void *p = (char *)o + r->off;
        if (r->def == 0)
            continue;
        if (r->kind == ARG_REAL)
            *(double *)p = r->def;
        else if (r->kind == ARG_LONG)
            *(long *)p = (long)r->def;
        else
            *(int *)p = (int)r->def;
    }
    o->data_dir = "data/mnist";
    o->seed = 42;
    o->gpt.beta1 = 0.9;
    o->gpt.beta2 = 0.95;
    o->gpt.eps = 1e-8;
}

/* Whether the flag called name was on the command line (seen[i] for rows[i]). */
static int given(const unsigned char *seen, const char *name)
{
    for (size_t i = 0; i < N_ROWS; i++)
        if (rows[i].name && strcmp(rows[i].name, name) == 0)
            return seen[i];
    return 0;
}

/* --help: each flag and its value in 24 columns (or 3 spaces past a longer one), its help
 * beside. */
static void print_usage(void)
{
    for (const flag_row *r = rows; r < rows + N_ROWS; r++) {
        if (r->kind == ARG_TEXT)
            fputs(r->help, stdout);
        if (r->kind == ARG_TEXT || !r->help)
            continue;
        char flag[64];
        int n = snprintf(flag, sizeof flag, "--%s%s%s", r->name, r->meta ? " " : "",
                         r->meta ? r->meta : "");
        printf("  %-*s", n < 24 ? 24 : n + 3, flag);
        for (const char *line = r->help, *nl;; line = nl + 1) {
            nl = strchr(line, '\n');
            printf("%*s%.*s\n", line == r->help ? 0 : 26, "",
                   nl ? (int)(nl - line) : (int)strlen(line), line);
            if (!nl)
                break;
        }
    }
}

/* The flags given that belong to the other model kind: GPT-2 flags with MLP/CNN, the SGD and MLP
 * flags with GPT-2. Prints the complaint naming them and returns -1, or 0 when none was given. */
static int refuse_other_model_flags(const train_opts *o, const unsigned char *seen)
{
    arg_scope other = o->gpt.on ? FOR_MNIST : FOR_GPT;
    char names[512];
    size_t len = 0;
    names[0] = '\0';
    for (size_t i = 0; i < N_ROWS; i++)
        if (seen[i] && rows[i].scope == other && len < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s--%s", len ? ", " : "",
                                    rows[i].name);
    if (!names[0])
        return 0;
    if (o->gpt.on)
        fprintf(stderr,
                "ddp-train: %s: not used by --model gpt2 (AdamW with warm-up and cosine decay: "
                "--lr, --warmup-steps, --lr-floor; sizes: --gpt-config or --layers/--heads/"
                "--channels); leave them out\n",
                names);
    else
        fprintf(stderr,
                "ddp-train: %s: GPT-2 flags, not used by --model %s: add --model gpt2 or leave "
                "them out\n",
                names, o->model.kind == MODEL_CNN ? "cnn" : "mlp");
    return -1;
}

/* The GPT's flags that contradict each other: sizes given with --init-from (the file's sizes are
 * the model's: said, once), --accum with --total-batch-tokens (which sets the micro-steps:
 * refused). */
static int refuse_gpt_conflicts(const train_opts *o, const unsigned char *seen)
{
    static const char *const sizes[] = {"gpt-config", "layers", "heads", "channels"};
    for (size_t i = 0; o->gpt.init_from && i < sizeof sizes / sizeof sizes[0]; i++) {
        if (given(seen, sizes[i]) && suggest_first_rank()) {
            fprintf(stderr,
                    "ddp-train: note: --%s is ignored: with --init-from %s the model's sizes "
                    "are the file's (see the start-up report)\n",
                    sizes[i], o->gpt.init_from);
        }
    }
    if (o->gpt.total_batch_tokens && given(seen, "accum")) {
        fprintf(stderr,
                "ddp-train: --accum %d and --total-batch-tokens %ld: the tokens per step set the "
                "micro-steps (total / (batch x seq x ranks)); give one of the two\n",
                o->accum, o->gpt.total_batch_tokens);
        return -1;
    }
    return 0;
}

/* --sample-only needs weights to start from and samples 256 tokens unless told; the sampling
 * flags need a sample. */
static int check_sampling(train_opts *o, const unsigned char *seen)
{
    train_gpt_opts *g = &o->gpt;
    if (g->sample_only && !g->init_from && !o->resume) {
        fprintf(stderr,
                "ddp-train: --sample-only samples from trained weights: add --init-from FILE "
                "(an llm.c model file or a ddp checkpoint) or --resume FILE\n");
        return -1;
    }
    if (g->sample_only && !o->resume && (o->save_path || o->checkpoint_dir)) {
        fprintf(stderr, "ddp-train: --sample-only trains nothing, so --%s would save no training "
                "state: leave it out (--save-llmc exports the weights)\n",
                o->save_path ? "save" : "checkpoint-dir");
        return -1;
    }
    if (g->sample_only && !given(seen, "sample"))
        g->sample = 256;
    static const char *const needs[] = {"prompt", "temperature", "top-k"};
    for (size_t i = 0; g->sample == 0 && i < sizeof needs / sizeof needs[0]; i++) {
        if (given(seen, needs[i])) {
            fprintf(stderr,
                    "ddp-train: --%s shapes the text --sample N generates: add --sample N (or "
                    "--sample-only)\n",
                    needs[i]);
            return -1;
        }
    }
    return 0;
}

/* After parsing: the GPT's defaults where the user gave no value, and the flags that do not fit
 * the model (0 when consistent, else -1 with the complaint printed). */
static int finish_gpt_opts(train_opts *o, const unsigned char *seen)
{
    train_gpt_opts *g = &o->gpt;
    if (!g->on && g->init_from) {
        /* the MNIST models have no weights-only start: say what continues their checkpoints */
        fprintf(stderr,
                "ddp-train: --init-from %s: starting from weights alone is for --model gpt2 "
                "(an llm.c model file or a GPT-2 checkpoint); --model %s continues its "
                "checkpoints with --resume %s (weights, optimizer state and step)\n",
                g->init_from, o->model.kind == MODEL_CNN ? "cnn" : "mlp", g->init_from);
        return -1;
    }
    if (refuse_other_model_flags(o, seen) != 0)
        return -1;
    if (o->global_batch && given(seen, "accum")) {
        fprintf(stderr, "ddp-train: --accum and --global-batch %ld: the samples per step set the "
                "micro-steps (global / (batch x ranks)); give one of the two\n", o->global_batch);
        return -1;
    }
    if (!g->on)
        return 0;
    if (refuse_gpt_conflicts(o, seen) != 0 || check_sampling(o, seen) != 0)
        return -1;
    if (!given(seen, "data"))
        o->data_dir = "data/text/austen_train_*.bin";
    if (!given(seen, "lr"))
        o->lr = 6e-4;
    else if (o->lr > TRAIN_GPT_LR_WARN && suggest_first_rank())
        fprintf(stderr,
                "ddp-train: warning: --lr %g with --model gpt2 is an SGD-sized rate (MNIST's): "
                "AdamW trains GPT-2 at about 6e-4 (the default, llm.c's) and usually diverges "
                "above %g; leave --lr out for the default\n",
                o->lr, TRAIN_GPT_LR_WARN);
    if (!given(seen, "weight-decay"))
        o->weight_decay = 0.1;
    if (!given(seen, "batch"))
        o->batch = 4;
    o->cosine = 1;
    g->cfg.padded_vocab = 0; /* recomputed from the vocabulary by gpt2_config_check */
    if (!g->init_from && gpt2_config_check(&g->cfg) != DDP_OK) {
        fprintf(stderr, "ddp-train: the GPT-2 sizes do not fit (see above): --channels must be a "
                        "multiple of --heads\n");
        return -1;
    }
    if (!g->init_from && g->seq > g->cfg.max_seq) {
        fprintf(stderr, "ddp-train: --seq %d is longer than the model's %d positions: allowed is "
                        "1 to %d\n", g->seq, g->cfg.max_seq, g->cfg.max_seq);
        return -1;
    }
    if (g->zero_accum && o->zero != 2) {
        fprintf(stderr, "ddp-train: --zero-accum chooses how --zero 2 accumulates micro-steps: "
                        "add --zero 2 (--zero %d keeps a full gradient buffer, which accumulates "
                        "locally)\n", o->zero);
        return -1;
    }
    return 0;
}

/* Flags that only make sense together; 0 when consistent, else -1 with the complaint printed. */
static int check_resume_opts(const train_opts *o)
{
    const char *need_dir = o->checkpoint_every ? "--checkpoint-every"
                           : o->resume && strcmp(o->resume, "auto") == 0 ? "--resume auto" : NULL;
    if (need_dir && !o->checkpoint_dir) {
        fprintf(stderr, "ddp-train: %s needs --checkpoint-dir DIR (where checkpoints are kept)\n",
                need_dir);
        return -1;
    }
    if (o->checkpoint_async && !(o->checkpoint_dir && o->checkpoint_format != TRAIN_CKPT_FILE)) {
        fprintf(stderr,
                "ddp-train: --checkpoint-async needs --checkpoint-dir DIR and a folder per "
                "checkpoint (--checkpoint-format auto or folder: each rank writes its own file in "
                "the background)\n");
        return -1;
    }
    if (o->resume && !o->resume[0]) {
        fprintf(stderr, "ddp-train: --resume: expected auto or a checkpoint file, got ''\n");
        return -1;
    }
    return 0;
}

/* One flag's value into o. Returns 0 when accepted, -1 when invalid (message printed), 1 for
 * --help. */
static int apply(const flag_row *r, const char *v, train_opts *o)
{
    void *p = (char *)o + r->off;
    long n;
    if (r->fn)
        return r->fn(r, v, o);
    switch (r->kind) {
    case ARG_FLAG: *(int *)p = (int)r->min; return 0;
    case ARG_STR: *(const char **)p = v; return 0;
    case ARG_INT:
        if (parse_long(r, v, &n) != 0)
            return -1;
        *(int *)p = (int)n;
        return 0;
    case ARG_LONG: return parse_long(r, v, (long *)p);
    case ARG_REAL: return parse_real(r, v, (double *)p);
    case ARG_WORD: return parse_word(r, v, (int *)p);
    default: return 1;
    }
}

/* An unknown option, a missing value or a stray argument: one line naming it, by the job's first
 * rank only (every rank parses the same command line). */
static void usage_error(const struct option *longs, const char *what, const char *arg)
{
    suggest_usage_error("ddp-train", longs, strcmp(what, "unknown option") == 0, what, arg,
                        "\nusage: ddp-train [options]; ddp-train --help lists them\n");
}

int train_sample_only(const train_opts *o)
{
    return o->gpt.sample_only && !o->resume;
}

train_parse_result train_parse_args(int argc, char **argv, train_opts *o)
{
    unsigned char seen[N_ROWS] = {0};
    struct option longs[N_ROWS + 1] = {{0}};
    for (size_t i = 0, j = 0; i < N_ROWS; i++) {
        if (rows[i].kind != ARG_TEXT)
            longs[j++] = (struct option){rows[i].name,
                                         rows[i].kind == ARG_FLAG || rows[i].kind == ARG_HELP
                                             ? no_argument
                                             : required_argument,
                                         NULL, OPT_ID0 + (int)i};
    }
    train_opts_default(o);
    opterr = 0;
    optind = 0; /* glibc: 0 resets getopt entirely: a parse left inside "-hh" cannot leak here */
    int id;
    while ((id = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        int rc = 1;
        if (id == '?' || id == ':') {
            usage_error(longs, id == '?' ? "unknown option" : "missing value for option",
                        argv[optind - 1]);
            return TRAIN_PARSE_USAGE;
        }
        if (id != 'h') {
            seen[id - OPT_ID0] = 1;
            rc = apply(&rows[id - OPT_ID0], optarg, o);
        }
        if (rc == 1) {
            print_usage();
            return TRAIN_PARSE_HELP;
        }
        if (rc != 0)
            return TRAIN_PARSE_USAGE;
    }
    if (optind < argc) {
        usage_error(longs, "unexpected argument", argv[optind]);
        return TRAIN_PARSE_USAGE;
    }
    if (o->n_inject > 0 && o->grad_dtype != DDP_FP16 && o->model.precision != DDP_FP16) {
        fprintf(stderr, "ddp-train: --inject-inf tests the fp16 loss scaler: add --grad-dtype fp16 "
                        "or --precision fp16\n");
        return TRAIN_PARSE_USAGE;
    }
    const char *snap = getenv("DDP_SNAPSHOT_DIR"); /* ddp-launch --max-restarts */
    if (o->snapshot_dir && !o->checkpoint_dir) {
        fprintf(stderr, "ddp-train: --snapshot-dir needs --checkpoint-dir DIR (the disk checkpoints "
                        "a missing snapshot falls back to)\n");
        return TRAIN_PARSE_USAGE;
    } else if (!o->snapshot_dir && o->checkpoint_dir && snap && *snap) {
        o->snapshot_dir = snap;
    }
    if (o->snapshot_dir && strcmp(o->snapshot_dir, "off") == 0)
        o->snapshot_dir = NULL;
    const char *h = o->snapshot_dir ? strstr(o->snapshot_dir, "%h") : NULL;
    if (h) { /* one folder per node where nodes share /dev/shm (Slurm's name, else the host's) */
        static char dir[4096], host[256] = "";
        const char *node = getenv("SLURMD_NODENAME");
        if (!node || !*node)
            node = gethostname(host, sizeof host - 1) == 0 ? host : "node";
        snprintf(dir, sizeof dir, "%.*s%s%s", (int)(h - o->snapshot_dir), o->snapshot_dir, node, h + 2);
        o->snapshot_dir = dir;
    }
    const char *gen = getenv("DDP_ELASTIC_GENERATION"); /* ddp-launch --max-restarts */
    if (gen && atoi(gen) > 0 && o->checkpoint_dir) { /* a restart resumes, on any world size */
        o->resume = o->resume ? o->resume : "auto";
        o->resume_reshard = 1;
    }
    if (check_resume_opts(o) != 0 || finish_gpt_opts(o, seen) != 0)
        return TRAIN_PARSE_USAGE;
    o->model.seed = o->seed;
    o->model.max_batch = o->batch;
    return TRAIN_PARSE_RUN;
}

void train_print_opts(FILE *f, const train_opts *o)
{
    const gpt2_config *c = &o->gpt.cfg;
    if (o->gpt.on && o->gpt.init_from)
        fprintf(f, "model: gpt2 from %s (its sizes), seq %d", o->gpt.init_from, o->gpt.seq);
    else if (o->gpt.on)
        fprintf(f, "model: gpt2 L %d, heads %d, channels %d, seq %d (positions %d, vocabulary %d "
                "padded to %d)", c->layers, c->heads, c->channels, o->gpt.seq, c->max_seq, c->vocab,
                c->padded_vocab);
    else
        fprintf(f, "model: %s", o->model.kind == MODEL_CNN ? "cnn" : "mlp");
    if (!o->gpt.on && o->model.kind == MODEL_MLP) {
        fputs(" widths ", f);
        for (int i = 0; i < o->model.n_widths; i++)
            fprintf(f, "%s%d", i ? "-" : "", o->model.widths[i]);
    }
    fprintf(f, "\ndata: %s\nepochs: %d  max-steps: %ld  batch per rank: %d  ", o->data_dir,
            o->epochs, o->max_steps, o->batch);
    if (o->gpt.on && o->gpt.total_batch_tokens)
        fprintf(f, "accum: from --total-batch-tokens %ld\n", o->gpt.total_batch_tokens);
    else if (o->global_batch)
        fprintf(f, "accum: from --global-batch %ld\n", o->global_batch);
    else
        fprintf(f, "accum: %d\n", o->accum);
    if (o->gpt.on)
        fprintf(f,
                "adamw: lr %g, warm-up %ld steps, cosine to %g x lr; betas %g, %g; eps %g; weight "
                "decay %g (2-D weights); grad clip %g\n",
                o->lr, o->gpt.warmup_steps, o->gpt.lr_floor, o->gpt.beta1, o->gpt.beta2, o->gpt.eps,
                o->weight_decay, o->gpt.grad_clip);
    else
        fprintf(f, "sgd: lr %g (%s)  momentum %g  weight decay %g  seed %llu  shuffle %s\n", o->lr,
                o->cosine ? "cosine" : "constant", o->momentum, o->weight_decay,
                (unsigned long long)o->seed, o->shuffle ? "yes" : "no");
    fprintf(f, "buckets: %g MiB (first %g MiB)%s  broadcast-init: %s  threads: %d  augment: %s\n",
            o->bucket_mb, o->first_bucket_mb, o->no_overlap ? " launched after backward" : "",
            o->broadcast_init ? "yes" : "no", o->threads,
            o->augment ? "shifts up to 2 px" : "no");
    fprintf(f, "precision: %s%s\n", model_precision_name(o->model.precision),
            o->tf32 ? "  (fp32 GEMMs and convolutions on TF32 tensor cores on a GPU)" : "");
    fprintf(f, "gradient all-reduce: %s", ddp_dtype_name(o->grad_dtype));
    if (o->grad_dtype == DDP_FP16)
        fprintf(f, " with loss scaling (scale %g, doubled after %ld finite steps)",
                o->loss_scale_init, o->loss_scale_interval);
    fprintf(f, "  data workers: %d\n", o->workers);
    if (o->checkpoint_dir)
        fprintf(f, "checkpoints: %s every %ld steps (keep %d, errors %s, %s: %s)",
                o->checkpoint_dir, o->checkpoint_every, o->keep,
                o->checkpoint_errors_warn ? "warn" : "stop",
                !o->checkpoint_folder ? "one file per checkpoint, written by rank 0"
                : o->checkpoint_async ? "a folder of per-rank files per checkpoint, written in the "
                                        "background"
                                      : "a folder of per-rank files per checkpoint",
                o->checkpoint_why[0] ? o->checkpoint_why : "not settled yet");
    else
        fputs("checkpoints: none (--checkpoint-dir)", f);
    fprintf(f, "  resume: %s  nan-policy: %s\n", o->resume ? o->resume : "no",
            o->nan_skip ? "skip" : "stop");
}
