/* train_opts.c - ddp-train command line: getopt_long flags, each value validated with a clear message. */
#include "train_opts.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

/* A macro's value as a string literal (the library's defaults in the usage text). */
#define TRAIN_STR_(x) #x
#define TRAIN_STR(x) TRAIN_STR_(x)

enum {
    OPT_MODEL = 1000, OPT_WIDTHS, OPT_DATA, OPT_EPOCHS, OPT_MAX_STEPS, OPT_BATCH, OPT_LR,
    OPT_MOMENTUM, OPT_WEIGHT_DECAY, OPT_SEED, OPT_BUCKET_MB, OPT_FIRST_BUCKET_MB, OPT_ACCUM,
    OPT_DEVICE, OPT_THREADS, OPT_METRICS, OPT_SAVE, OPT_NO_SHUFFLE, OPT_LOG_EVERY,
    OPT_BROADCAST_INIT, OPT_LR_SCHEDULE, OPT_AUGMENT, OPT_PRECISION, OPT_GRAD_DTYPE, OPT_LOSS_SCALE_INIT,
    OPT_LOSS_SCALE_INTERVAL, OPT_WORKERS, OPT_INJECT_INF, OPT_TRACE, OPT_NO_OVERLAP, OPT_LINK_CHECK,
    OPT_HELP, OPT_CKPT_DIR, OPT_CKPT_EVERY, OPT_KEEP, OPT_RESUME, OPT_RESUME_RESHARD, OPT_REQUEUE,
    OPT_CKPT_ERRORS, OPT_NAN_POLICY, OPT_TF32, OPT_ZERO, OPT_CKPT_FORMAT, OPT_CKPT_ASYNC,
    /* GPT-2 flags, parsed by parse_gpt_opt (keep them last) */
    OPT_GPT_CONFIG, OPT_LAYERS, OPT_HEADS, OPT_CHANNELS, OPT_SEQ, OPT_VAL_DATA, OPT_VAL_EVERY,
    OPT_VAL_MAX_BATCHES, OPT_TOTAL_BATCH_TOKENS, OPT_WARMUP_STEPS, OPT_LR_FLOOR, OPT_GRAD_CLIP,
    OPT_INIT_FROM, OPT_SAVE_LLMC, OPT_SAMPLE, OPT_VOCAB, OPT_RECOMPUTE, OPT_ZERO_ACCUM,
    OPT_PEAK_TFLOPS, OPT_PROMPT, OPT_TEMPERATURE, OPT_TOP_K, OPT_SAMPLE_ONLY, OPT_END
};

static const struct option train_long_opts[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"widths", required_argument, NULL, OPT_WIDTHS},
    {"data", required_argument, NULL, OPT_DATA},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"max-steps", required_argument, NULL, OPT_MAX_STEPS},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"lr", required_argument, NULL, OPT_LR},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
    {"seed", required_argument, NULL, OPT_SEED},
    {"bucket-mb", required_argument, NULL, OPT_BUCKET_MB},
    {"first-bucket-mb", required_argument, NULL, OPT_FIRST_BUCKET_MB},
    {"accum", required_argument, NULL, OPT_ACCUM},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"save", required_argument, NULL, OPT_SAVE},
    {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
    {"log-every", required_argument, NULL, OPT_LOG_EVERY},
    {"broadcast-init", no_argument, NULL, OPT_BROADCAST_INIT},
    {"lr-schedule", required_argument, NULL, OPT_LR_SCHEDULE},
    {"augment", no_argument, NULL, OPT_AUGMENT},
    {"precision", required_argument, NULL, OPT_PRECISION},
    {"grad-dtype", required_argument, NULL, OPT_GRAD_DTYPE},
    {"tf32", no_argument, NULL, OPT_TF32},
    {"zero", required_argument, NULL, OPT_ZERO},
    {"recompute", no_argument, NULL, OPT_RECOMPUTE},
    {"zero-accum", required_argument, NULL, OPT_ZERO_ACCUM},
    {"loss-scale-init", required_argument, NULL, OPT_LOSS_SCALE_INIT},
    {"loss-scale-interval", required_argument, NULL, OPT_LOSS_SCALE_INTERVAL},
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"inject-inf", required_argument, NULL, OPT_INJECT_INF},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
    {"link-check", no_argument, NULL, OPT_LINK_CHECK},
    {"help", no_argument, NULL, OPT_HELP},
    {"checkpoint-dir", required_argument, NULL, OPT_CKPT_DIR},
    {"checkpoint-every", required_argument, NULL, OPT_CKPT_EVERY},
    {"keep", required_argument, NULL, OPT_KEEP},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"resume-reshard", no_argument, NULL, OPT_RESUME_RESHARD},
    {"requeue", no_argument, NULL, OPT_REQUEUE},
    {"checkpoint-errors", required_argument, NULL, OPT_CKPT_ERRORS},
    {"checkpoint-format", required_argument, NULL, OPT_CKPT_FORMAT},
    {"checkpoint-async", no_argument, NULL, OPT_CKPT_ASYNC},
    {"nan-policy", required_argument, NULL, OPT_NAN_POLICY},
    {"gpt-config", required_argument, NULL, OPT_GPT_CONFIG},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"channels", required_argument, NULL, OPT_CHANNELS},
    {"seq", required_argument, NULL, OPT_SEQ},
    {"val-data", required_argument, NULL, OPT_VAL_DATA},
    {"val-every", required_argument, NULL, OPT_VAL_EVERY},
    {"val-max-batches", required_argument, NULL, OPT_VAL_MAX_BATCHES},
    {"total-batch-tokens", required_argument, NULL, OPT_TOTAL_BATCH_TOKENS},
    {"warmup-steps", required_argument, NULL, OPT_WARMUP_STEPS},
    {"lr-floor", required_argument, NULL, OPT_LR_FLOOR},
    {"grad-clip", required_argument, NULL, OPT_GRAD_CLIP},
    {"init-from", required_argument, NULL, OPT_INIT_FROM},
    {"save-llmc", required_argument, NULL, OPT_SAVE_LLMC},
    {"sample", required_argument, NULL, OPT_SAMPLE},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"peak-tflops", required_argument, NULL, OPT_PEAK_TFLOPS},
    {"prompt", required_argument, NULL, OPT_PROMPT},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"sample-only", no_argument, NULL, OPT_SAMPLE_ONLY},
    {NULL, 0, NULL, 0},
};

static const char train_usage_text[] =
    "usage: ddp-train [options]   (run one process, or many with mpirun / srun / ddp-launch)\n"
    "  --model mlp|cnn|gpt2    model (default mlp; gpt2: see the GPT-2 flags at the end)\n"
    "  --widths W-W-..         MLP layer widths, 784 first, 10 last (default 784-512-256-10)\n"
    "  --data DIR              MNIST IDX folder, files plain or .gz (default data/mnist;\n"
    "                          scripts/fetch-mnist.sh fills it)\n"
    "  --epochs N              epochs (default 8)\n"
    "  --max-steps N           stop after N optimizer steps, 0 = no limit (default 0)\n"
    "  --batch N               samples per rank per micro-step (default 64)\n"
    "  --accum K               micro-steps per optimizer step (gradient accumulation, default 1)\n"
    "  --lr X                  learning rate (default 0.05)\n"
    "  --lr-schedule S         constant, or cosine: decays the rate to 0 over the planned steps\n"
    "  --momentum X            SGD momentum in [0, 1) (default 0.9)\n"
    "  --weight-decay X        L2 weight decay (default 0)\n"
    "  --seed N                initialisation and shuffling seed (default 42)\n"
    "  --bucket-mb X           gradient bucket cap, MiB (default " TRAIN_STR(DDP_BUCKET_MB_DEFAULT) ")\n"
    "  --first-bucket-mb X     first bucket cap, MiB (default " TRAIN_STR(DDP_FIRST_BUCKET_MB_DEFAULT) ")\n"
    "  --zero 0|1|2            ZeRO sharding over the ranks (default 0: none): 1 shards the\n"
    "                          optimizer state (gradients reduce-scattered, parameters\n"
    "                          all-gathered), 2 also keeps only this rank's shard of the gradients\n"
    "                          (no full gradient buffer: backward writes into bucket buffers\n"
    "                          that are reduce-scattered; GPT: see --zero-accum)\n"
    "  --device cpu|cuda|auto  backend (default auto)\n"
    "  --threads N             BLAS threads per rank on the CPU (default 1)\n"
    "  --precision P           fp32, bf16 or fp16 (default fp32): activations and GEMM/convolution\n"
    "                          inputs in 16 bits, fp32 accumulation, fp32 master weights, optimizer\n"
    "                          state, loss and softmax. bf16 on the CPU runs natively with\n"
    "                          AVX512_BF16 (or AMX), elsewhere emulated like fp16; fp16 is emulated\n"
    "                          (values rounded to fp16, arithmetic in fp32; on a GPU on TF32 tensor\n"
    "                          cores, exact for fp16 values); bf16 on a GPU needs compute\n"
    "                          capability 8.0 (Ampere) or newer\n"
    "  --tf32                  TF32 tensor cores for fp32 GEMMs and convolutions on the GPU (like\n"
    "                          torch.backends.cuda.matmul.allow_tf32); ignored on the CPU\n"
    "  --metrics FILE          rank 0 writes JSON lines: one per epoch, then a summary\n"
    "  --save FILE             rank 0 writes the trained parameters as a checkpoint (FILE: see below)\n"
    "  --augment               shift each training image by up to 2 pixels (from seed, epoch, sample)\n"
    "  --no-shuffle            keep the data order (identity permutation)\n"
    "  --log-every N           progress line every N steps when not on a terminal (default 50)\n"
    "  --broadcast-init        copy rank 0's initial parameters to every rank\n"
    "  --grad-dtype T          gradient all-reduce in fp32, bf16 or fp16 (default fp32): 16 bits halve\n"
    "                          the bytes (PyTorch's compression hooks); fp16 (here or in --precision)\n"
    "                          adds dynamic loss scaling\n"
    "  --loss-scale-init X     fp16: first loss scale (default 65536, as torch's GradScaler)\n"
    "  --loss-scale-interval N fp16: steps without inf/NaN before the scale doubles (default 2000)\n"
    "  --workers N             data threads that prepare the next batches (default 1; 0 = none);\n"
    "                          batches are the same whatever N\n"
    "  --inject-inf RANK:STEP  test aid: make RANK's gradients inf at optimizer STEP (0-based; needs\n"
    "                          --grad-dtype fp16 or --precision fp16): every rank must skip that\n"
    "                          step; up to 8 times\n";
/* The rest of the usage text (C17 guarantees string literals of 4095 characters only). */
static const char train_usage_more[] =
    "  --no-overlap            launch every gradient bucket after the backward pass (no overlap)\n"
    "  --trace FILE            rank 0 writes the job's timeline (Chrome trace-event JSON: open it in\n"
    "                          Perfetto or chrome://tracing); the summary then prints the exposed\n"
    "                          communication per step and the part hidden behind backward\n"
    "  --link-check            before training, measure each rank's links to its ring neighbours\n"
    "                          and rank 0, and name nodes whose links are under half the median\n"
    "  --nan-policy stop|skip  a NaN/inf loss stops the run with exit 1 (stop, default) or its step\n"
    "                          is not applied (skip)\n"
    "  --checkpoint-dir DIR    rank 0 writes the full training state to DIR/step-N.ckpt (created)\n"
    "  --checkpoint-every N    ... every N optimizer steps (default 0: on a stop and at the end)\n"
    "  --keep K                checkpoints kept in DIR, older ones removed (default 3)\n"
    "  --checkpoint-errors E   stop (default: a failed save ends the run, exit 1) or warn (go on)\n"
    "  --checkpoint-format F   file (default: rank 0 writes DIR/step-N.ckpt) or folder (every rank\n"
    "                          writes its shard into the folder DIR/step-N.ckpt/, rank 0 a MANIFEST)\n"
    "  --checkpoint-async      (folder) each rank copies its shard to host memory and a background\n"
    "                          thread writes it while training goes on; a save waits for the one\n"
    "                          before, the save at the end of the run is written at once\n"
    "  --resume auto|FILE      continue bit-identically from FILE, or (auto) from the newest valid\n"
    "                          checkpoint in DIR, starting fresh when there is none\n"
    "  --resume-reshard        allow resuming with another number of ranks (no longer bit-identical)\n"
    "  --requeue               under Slurm: after a stop by signal, rank 0 runs scontrol requeue\n"
    "  --help                  this text\n"
    "SIGUSR1 (e.g. sbatch --signal=USR1@120) or SIGTERM (time limit, scancel) stops every rank after\n"
    "the same step; rank 0 then writes a checkpoint into --checkpoint-dir, evaluates, writes --save\n"
    "and the metrics summary (\"stopped_by_signal\": true); with --requeue it requeues the job; all\n"
    "exit 0.\n"
    "--save and --trace replace FILE atomically (a temporary file renamed over it), so FILE must be a\n"
    "new or a regular file; a symbolic link is followed to the file it names, which must exist. A\n"
    "folder, a device (/dev/null too), a FIFO, a socket or a dangling link is refused before training,\n"
    "as is a folder that does not accept a new file.\n"
    "DDP_TIMEOUT=S: the deadline of every collective, 0.1 to 604800 seconds (default 300); any other\n"
    "value stops every rank before training.\n";
/* The GPT-2 flags. */
static const char train_usage_gpt[] =
    "GPT-2 (--model gpt2; AdamW, warm-up then cosine decay, global-norm clipping):\n"
    "  --gpt-config d12|d24|d36|d48   GPT-2 124M, 350M, 774M, 1.5B (default d12)\n"
    "  --layers N --heads N --channels N   a smaller model (override the preset's sizes)\n"
    "  --seq T                 tokens per sequence (default 64, at most 1024)\n"
    "  --data PATTERN          llm.c token shards (default data/text/austen_train_*.bin;\n"
    "                          scripts/fetch-text.sh makes them); --batch is sequences per rank\n"
    "  --val-data PATTERN      validation shards (default: PATTERN with train -> val)\n"
    "  --val-every N           validation loss every N steps and at the end (default 0: the end)\n"
    "  --val-max-batches N     cap the validation batches per rank (default 0: every token)\n"
    "  --total-batch-tokens N  tokens per optimizer step over all ranks (llm.c's -d): sets --accum\n"
    "  --warmup-steps N        linear warm-up steps (default 0); then cosine decay to\n"
    "  --lr-floor F            ... lr x F at the last step (default 0.1; --lr default 6e-4,\n"
    "                          --weight-decay default 0.1, on 2-D weights only)\n"
    "  --grad-clip X           clip the global gradient norm to X (default 1.0; 0: off)\n"
    "  --init-from FILE        start from the weights of an llm.c model file (gpt2_124M.bin: fp32\n"
    "                          or bf16) or of a GPT-2 ddp checkpoint (file or folder): the sizes\n"
    "                          are its own; optimizer, step and schedule start afresh\n"
    "  --save-llmc FILE        write the trained weights as an llm.c model file (fp32)\n"
    "  --sample N              rank 0 prints N tokens generated after training (needs --vocab)\n"
    "  --prompt TEXT           ... that continue TEXT (GPT-2's BPE: needs vocab.bpe beside the\n"
    "                          vocabulary; default: from <|endoftext|>)\n"
    "  --temperature X         ... drawn at temperature X (default 1; 0: the most likely token)\n"
    "  --top-k K               ... among the K most likely tokens (default 0: all)\n"
    "  --sample-only           no training: sample from --init-from FILE (an llm.c model file or a\n"
    "                          ddp checkpoint) or --resume FILE; --sample defaults to 256; with\n"
    "                          --save-llmc it also exports the weights\n"
    "  --vocab FILE            GPT-2's encoder.json or llm.c's gpt2_tokenizer.bin (default: the\n"
    "                          one beside the data, encoder.json first)\n"
    "  --recompute             activation checkpointing: each block keeps only its input and runs\n"
    "                          its forward again during backward (less memory; up to 22 % more\n"
    "                          block compute, see docs/gpt2.md)\n"
    "  --zero-accum local|reduce   --zero 2 with --accum > 1: local (default) adds the micro-steps\n"
    "                          in the bucket buffers and reduce-scatters once (bit-identical to\n"
    "                          --zero 0; the full gradients alive while accumulating); reduce\n"
    "                          reduce-scatters every micro-step (the gradient memory saved; sums\n"
    "                          in another order, a rounding apart)\n"
    "  --peak-tflops X         the peak TFLOP/s of one device that the MFU (model FLOPs per\n"
    "                          token 6N + 6LCT, llm.c's count, x tokens/s per rank) is measured\n"
    "                          against (default: a table of NVIDIA GPUs by name and precision;\n"
    "                          on the CPU or an unknown GPU the MFU is not printed)\n";

static void train_opts_default(train_opts *o)
{
    memset(o, 0, sizeof *o);
    model_config_default(&o->model, MODEL_MLP);
    o->data_dir = "data/mnist";
    o->epochs = 8;
    o->batch = 64;
    o->accum = 1;
    o->lr = 0.05;
    o->momentum = 0.9;
    o->seed = 42;
    o->bucket_mb = DDP_BUCKET_MB_DEFAULT;
    o->first_bucket_mb = DDP_FIRST_BUCKET_MB_DEFAULT;
    o->device = DDP_BACKEND_AUTO;
    o->threads = 1;
    o->shuffle = 1;
    o->log_every = 50;
    o->grad_dtype = DDP_FP32;
    o->loss_scale_init = 65536.0;
    o->loss_scale_interval = 2000;
    o->workers = 1;
    o->keep = 3;
    gpt2_config_preset("d12", &o->gpt.cfg);
    o->gpt.seq = 64;
    o->gpt.lr_floor = 0.1;
    o->gpt.grad_clip = 1.0;
    o->gpt.beta1 = 0.9;
    o->gpt.beta2 = 0.95;
    o->gpt.eps = 1e-8;
    o->gpt.temperature = 1.0;
}

/* RANK:STEP for --inject-inf. */
static int parse_inject(const char *text, train_opts *o)
{
    char *end = NULL;
    errno = 0;
    long rank = strtol(text, &end, 10);
    long step = end && *end == ':' ? strtol(end + 1, &end, 10) : -1;
    if (errno != 0 || !isdigit((unsigned char)text[0]) || *end != '\0' || rank < 0 ||
        rank > INT_MAX || step < 0 || o->n_inject == 8) {
        fprintf(stderr, "ddp-train: --inject-inf: expected RANK:STEP with non-negative integers "
                        "(at most 8 times), got '%s'\n", text);
        return -1;
    }
    o->inject_rank[o->n_inject] = (int)rank;
    o->inject_step[o->n_inject++] = step;
    return 0;
}

/* Parses a whole-string integer in [min, max]; prints the complaint with the allowed range and
 * returns -1 otherwise. */
static int parse_long(const char *flag, const char *text, long min, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "ddp-train: --%s: expected %s integer, got '%s' (allowed: %ld to %ld)\n", flag,
                min > 0 ? "a positive" : "a non-negative", text, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_int_in(const char *flag, const char *text, int min, int max, int *out)
{
    long v;
    if (parse_long(flag, text, min, max, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_int(const char *flag, const char *text, int min, int *out)
{
    return parse_int_in(flag, text, min, INT_MAX, out);
}

/* Parses a whole-string number v in the interval from lo to hi, each end open or closed; the
 * message names the interval, e.g. "expected a number in [0, 1)". */
static int parse_double(const char *flag, const char *text, double lo, int lo_open, double hi,
                            int hi_open, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    int in = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || !in) {
        fprintf(stderr, "ddp-train: --%s: expected a number in %c%.10g, %.10g%c, got '%s'\n", flag,
                lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', text);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_seed(const char *text, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || !isdigit((unsigned char)text[0])) {
        fprintf(stderr, "ddp-train: --seed: expected a non-negative integer, got '%s' (allowed: 0 to %llu)\n",
                text, (unsigned long long)UINT64_MAX);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* Flags that name a choice: model kind, widths, learning-rate schedule, precision, device. */
static int parse_choice(int id, const char *text, train_opts *o)
{
    if (id == OPT_PRECISION) {
        if (model_precision_parse(text, &o->model.precision) != DDP_OK) {
            fprintf(stderr, "ddp-train: --precision: expected fp32, bf16 or fp16, got '%s'\n", text);
            return -1;
        }
        return 0;
    }
    if (id == OPT_LR_SCHEDULE) {
        o->cosine = strcmp(text, "cosine") == 0;
        if (!o->cosine && strcmp(text, "constant") != 0) {
            fprintf(stderr, "ddp-train: --lr-schedule: expected constant or cosine, got '%s'\n", text);
            return -1;
        }
        return 0;
    }
    if (id == OPT_MODEL) {
        model_kind kind;
        o->gpt.on = strcmp(text, "gpt2") == 0;
        if (o->gpt.on)
            return 0;
        if (model_kind_parse(text, &kind) != DDP_OK) {
            fprintf(stderr, "ddp-train: --model: expected mlp, cnn or gpt2, got '%s'\n", text);
            return -1;
        }
        o->model.kind = kind;
        return 0;
    }
    if (id == OPT_WIDTHS) {
        if (model_widths_parse(text, &o->model) != DDP_OK) {
            fprintf(stderr, "ddp-train: --widths: expected widths like 784-512-256-10 (784 first, 10 "
                            "last, each 1 to %d, at most %d layers), got '%s'\n", MODEL_MLP_MAX_WIDTH,
                    MODEL_MLP_MAX_LAYERS, text);
            return -1;
        }
        return 0;
    }
    if (id == OPT_GRAD_DTYPE) {
        if (ddp_dtype_parse(text, &o->grad_dtype) != DDP_OK) {
            fprintf(stderr, "ddp-train: --grad-dtype: expected fp32, bf16 or fp16, got '%s'\n", text);
            return -1;
        }
        return 0;
    }
    if (ddp_backend_parse(text, &o->device) != DDP_OK) {
        fprintf(stderr, "ddp-train: --device: expected cpu, cuda or auto, got '%s'\n", text);
        return -1;
    }
    return 0;
}

/* Flags with a numeric value. The batch is not limited here: rank 0's data size bounds it (see
 * train_plan in ddp_train.c). */
static int parse_number(int id, const char *v, train_opts *o)
{
    switch (id) {
    case OPT_EPOCHS: return parse_int_in("epochs", v, 1, TRAIN_MAX_EPOCHS, &o->epochs);
    case OPT_MAX_STEPS: return parse_long("max-steps", v, 0, TRAIN_MAX_STEPS, &o->max_steps);
    case OPT_BATCH: o->given |= TRAIN_GIVEN_BATCH; return parse_int("batch", v, 1, &o->batch);
    case OPT_ACCUM: o->given |= TRAIN_GIVEN_ACCUM; return parse_int("accum", v, 1, &o->accum);
    case OPT_THREADS: return parse_int_in("threads", v, 1, TRAIN_MAX_THREADS, &o->threads);
    case OPT_LOG_EVERY: return parse_int("log-every", v, 1, &o->log_every);
    case OPT_LR: o->given |= TRAIN_GIVEN_LR; return parse_double("lr", v, TRAIN_MIN_LR, 0, TRAIN_MAX_LR, 0, &o->lr);
    case OPT_MOMENTUM: return parse_double("momentum", v, 0.0, 0, 1.0, 1, &o->momentum);
    case OPT_WEIGHT_DECAY:
        o->given |= TRAIN_GIVEN_WD;
        return parse_double("weight-decay", v, 0.0, 0, TRAIN_MAX_WEIGHT_DECAY, 0, &o->weight_decay);
    case OPT_BUCKET_MB:
        return parse_double("bucket-mb", v, 0.0, 1, TRAIN_MAX_BUCKET_MB, 0, &o->bucket_mb);
    case OPT_FIRST_BUCKET_MB:
        return parse_double("first-bucket-mb", v, 0.0, 1, TRAIN_MAX_BUCKET_MB, 0, &o->first_bucket_mb);
    case OPT_SEED: return parse_seed(v, &o->seed);
    case OPT_WORKERS: return parse_int_in("workers", v, 0, TRAIN_MAX_WORKERS, &o->workers);
    case OPT_LOSS_SCALE_INTERVAL:
        return parse_long("loss-scale-interval", v, 1, LONG_MAX, &o->loss_scale_interval);
    case OPT_LOSS_SCALE_INIT:
        return parse_double("loss-scale-init", v, 0.0, 1, FLT_MAX, 0, &o->loss_scale_init);
    case OPT_INJECT_INF: return parse_inject(v, o);
    default: return parse_choice(id, v, o);
    }
}

/* Checkpoint, resume and NaN flags. */
static int parse_resume_opt(int id, const char *v, train_opts *o)
{
    switch (id) {
    case OPT_CKPT_DIR: o->checkpoint_dir = v; return 0;
    case OPT_RESUME: o->resume = v; return 0;
    case OPT_RESUME_RESHARD: o->resume_reshard = 1; return 0;
    case OPT_REQUEUE: o->requeue = 1; return 0;
    case OPT_CKPT_EVERY: return parse_long("checkpoint-every", v, 0, LONG_MAX, &o->checkpoint_every);
    case OPT_KEEP: return parse_int("keep", v, 1, &o->keep);
    case OPT_CKPT_ASYNC: o->checkpoint_async = 1; return 0;
    case OPT_CKPT_FORMAT:
        o->checkpoint_folder = strcmp(v, "folder") == 0;
        if (o->checkpoint_folder || strcmp(v, "file") == 0)
            return 0;
        fprintf(stderr, "ddp-train: --checkpoint-format: expected file or folder, got '%s'\n", v);
        return -1;
    case OPT_CKPT_ERRORS:
        o->checkpoint_errors_warn = strcmp(v, "warn") == 0;
        if (o->checkpoint_errors_warn || strcmp(v, "stop") == 0)
            return 0;
        fprintf(stderr, "ddp-train: --checkpoint-errors: expected stop or warn, got '%s'\n", v);
        return -1;
    default:
        o->nan_skip = strcmp(v, "skip") == 0;
        if (o->nan_skip || strcmp(v, "stop") == 0)
            return 0;
        fprintf(stderr, "ddp-train: --nan-policy: expected stop or skip, got '%s'\n", v);
        return -1;
    }
}

/* --peak-tflops: a positive number of TFLOP/s, with what to give on a bad value. */
static int parse_peak(const char *v, double *out)
{
    if (parse_double("peak-tflops", v, 0.0, 1, TRAIN_MAX_PEAK_TFLOPS, 0, out) == 0)
        return 0;
    fprintf(stderr, "ddp-train: --peak-tflops is one device's peak in TFLOP/s for the run's "
                    "precision, e.g. --peak-tflops 989.4 for an H100 SXM in bf16 (dense); leave it "
                    "out to use the table of GPUs\n");
    return -1;
}

/* GPT-2 flags (--model gpt2). */
static int parse_gpt_size(int id, const char *v, train_opts *o)
{
    gpt2_config *c = &o->gpt.cfg;
    switch (id) {
    case OPT_LAYERS: return parse_int_in("layers", v, 1, GPT2_MAX_LAYERS, &c->layers);
    case OPT_HEADS: return parse_int_in("heads", v, 1, 1024, &c->heads);
    case OPT_CHANNELS: return parse_int_in("channels", v, 1, 65536, &c->channels);
    default: return parse_int_in("seq", v, 1, 1 << 20, &o->gpt.seq);
    }
}

static int parse_gpt_opt(int id, const char *v, train_opts *o)
{
    train_gpt_opts *g = &o->gpt;
    switch (id) {
    case OPT_GPT_CONFIG:
        if (gpt2_config_preset(v, &g->cfg) == DDP_OK)
            return 0;
        fprintf(stderr, "ddp-train: --gpt-config: expected d12, d24, d36 or d48 (GPT-2 124M, 350M, "
                        "774M, 1.5B), got '%s'\n", v);
        return -1;
    case OPT_VAL_DATA: g->val_data = v; return 0;
    case OPT_INIT_FROM: g->init_from = v; return 0;
    case OPT_SAVE_LLMC: g->save_llmc = v; return 0;
    case OPT_VOCAB: g->vocab = v; return 0;
    case OPT_RECOMPUTE: g->recompute = 1; return 0;
    case OPT_ZERO_ACCUM:
        if (strcmp(v, "local") == 0 || strcmp(v, "reduce") == 0) {
            g->zero_accum = v[0] == 'l' ? 1 : 2;
            return 0;
        }
        fprintf(stderr, "ddp-train: --zero-accum: expected local or reduce, got '%s'\n", v);
        return -1;
    case OPT_VAL_EVERY: return parse_int("val-every", v, 0, &g->val_every);
    case OPT_VAL_MAX_BATCHES: return parse_long("val-max-batches", v, 0, LONG_MAX, &g->val_batches);
    case OPT_TOTAL_BATCH_TOKENS:
        return parse_long("total-batch-tokens", v, 1, LONG_MAX / 2, &g->total_batch_tokens);
    case OPT_WARMUP_STEPS: return parse_long("warmup-steps", v, 0, TRAIN_MAX_STEPS, &g->warmup_steps);
    case OPT_LR_FLOOR: return parse_double("lr-floor", v, 0.0, 0, 1.0, 0, &g->lr_floor);
    case OPT_GRAD_CLIP: return parse_double("grad-clip", v, 0.0, 0, 1e6, 0, &g->grad_clip);
    case OPT_SAMPLE: return parse_int_in("sample", v, 0, TRAIN_MAX_SAMPLE, &g->sample);
    case OPT_PROMPT: g->prompt = v; return 0;
    case OPT_TEMPERATURE: return parse_double("temperature", v, 0.0, 0, 100.0, 0, &g->temperature);
    case OPT_TOP_K: return parse_int_in("top-k", v, 0, 1000000, &g->top_k);
    case OPT_SAMPLE_ONLY: g->sample_only = 1; return 0;
    case OPT_PEAK_TFLOPS: return parse_peak(v, &g->peak_tflops);
    default: return parse_gpt_size(id, v, o);
    }
}

/* The long name of option id. */
static const char *opt_name(int id)
{
    for (const struct option *p = train_long_opts; p->name; p++)
        if (p->val == id)
            return p->name;
    return "?";
}

/* The flags given (seen[id - OPT_MODEL]) that belong to the other model kind: GPT-2 flags with
 * MLP/CNN, the SGD and MLP flags with GPT-2. Prints the complaint naming them and returns -1, or
 * returns 0 when none was given. */
static int refuse_other_model_flags(const train_opts *o, const unsigned char *seen)
{
    static const int mnist_only[] = {OPT_WIDTHS, OPT_MOMENTUM, OPT_LR_SCHEDULE, OPT_AUGMENT};
    char names[512];
    size_t len = 0;
    names[0] = '\0';
    for (int id = OPT_MODEL; id < OPT_END; id++) {
        int other = 0;
        if (!o->gpt.on)
            other = id >= OPT_GPT_CONFIG;
        for (size_t i = 0; o->gpt.on && i < sizeof mnist_only / sizeof mnist_only[0]; i++)
            other |= id == mnist_only[i];
        if (other && seen[id - OPT_MODEL] && len < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s--%s", len ? ", " : "", opt_name(id));
    }
    if (!names[0])
        return 0;
    if (o->gpt.on)
        fprintf(stderr, "ddp-train: %s: not used by --model gpt2 (AdamW with warm-up and cosine decay: "
                        "--lr, --warmup-steps, --lr-floor; sizes: --gpt-config or --layers/--heads/"
                        "--channels); leave them out\n", names);
    else
        fprintf(stderr, "ddp-train: %s: GPT-2 flags, not used by --model %s: add --model gpt2 or leave "
                        "them out\n", names, o->model.kind == MODEL_CNN ? "cnn" : "mlp");
    return -1;
}

/* The GPT's flags that contradict each other: sizes given with --init-from (the file's sizes are
 * the model's: said, once), --accum with --total-batch-tokens (which sets the micro-steps: refused). */
static int refuse_gpt_conflicts(const train_opts *o, const unsigned char *seen)
{
    static const int sizes[] = {OPT_GPT_CONFIG, OPT_LAYERS, OPT_HEADS, OPT_CHANNELS};
    for (size_t i = 0; o->gpt.init_from && i < sizeof sizes / sizeof sizes[0]; i++) {
        if (seen[sizes[i] - OPT_MODEL] && suggest_first_rank()) {
            fprintf(stderr, "ddp-train: note: --%s is ignored: with --init-from %s the model's sizes "
                            "are the file's (see the start-up report)\n", opt_name(sizes[i]),
                    o->gpt.init_from);
        }
    }
    if (o->gpt.total_batch_tokens && seen[OPT_ACCUM - OPT_MODEL]) {
        fprintf(stderr, "ddp-train: --accum %d and --total-batch-tokens %ld: the tokens per step set the "
                        "micro-steps (total / (batch x seq x ranks)); give one of the two\n", o->accum,
                o->gpt.total_batch_tokens);
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
        fprintf(stderr, "ddp-train: --sample-only samples from trained weights: add --init-from FILE "
                        "(an llm.c model file or a ddp checkpoint) or --resume FILE\n");
        return -1;
    }
    if (g->sample_only && !seen[OPT_SAMPLE - OPT_MODEL])
        g->sample = 256;
    static const int needs[] = {OPT_PROMPT, OPT_TEMPERATURE, OPT_TOP_K};
    for (size_t i = 0; g->sample == 0 && i < sizeof needs / sizeof needs[0]; i++) {
        if (seen[needs[i] - OPT_MODEL]) {
            fprintf(stderr, "ddp-train: --%s shapes the text --sample N generates: add --sample N (or "
                            "--sample-only)\n", opt_name(needs[i]));
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
        fprintf(stderr, "ddp-train: --init-from %s: starting from weights alone is for --model gpt2 "
                        "(an llm.c model file or a GPT-2 checkpoint); --model %s continues its "
                        "checkpoints with --resume %s (weights, optimizer state and step)\n",
                g->init_from, o->model.kind == MODEL_CNN ? "cnn" : "mlp", g->init_from);
        return -1;
    }
    if (refuse_other_model_flags(o, seen) != 0)
        return -1;
    if (!g->on)
        return 0;
    if (refuse_gpt_conflicts(o, seen) != 0 || check_sampling(o, seen) != 0)
        return -1;
    if (!(o->given & TRAIN_GIVEN_DATA))
        o->data_dir = "data/text/austen_train_*.bin";
    if (!(o->given & TRAIN_GIVEN_LR))
        o->lr = 6e-4;
    else if (o->lr > TRAIN_GPT_LR_WARN && suggest_first_rank())
        fprintf(stderr, "ddp-train: warning: --lr %g with --model gpt2 is an SGD-sized rate (MNIST's): "
                        "AdamW trains GPT-2 at about 6e-4 (the default, llm.c's) and usually diverges "
                        "above %g; leave --lr out for the default\n", o->lr, TRAIN_GPT_LR_WARN);
    if (!(o->given & TRAIN_GIVEN_WD))
        o->weight_decay = 0.1;
    if (!(o->given & TRAIN_GIVEN_BATCH))
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
        fprintf(stderr, "ddp-train: %s needs --checkpoint-dir DIR (where checkpoints are kept)\n", need_dir);
        return -1;
    }
    if (o->checkpoint_async && !(o->checkpoint_dir && o->checkpoint_folder)) {
        fprintf(stderr, "ddp-train: --checkpoint-async needs --checkpoint-dir DIR and --checkpoint-format "
                "folder (each rank writes its own file in the background)\n");
        return -1;
    }
    if (o->resume && !o->resume[0]) {
        fprintf(stderr, "ddp-train: --resume: expected auto or a checkpoint file, got ''\n");
        return -1;
    }
    return 0;
}

/* One flag. Returns 0 when accepted, -1 when invalid (message printed), 1 for --help. */
static int train_apply_opt(int id, const char *v, train_opts *o)
{
    switch (id) {
    case OPT_DATA: o->data_dir = v; o->given |= TRAIN_GIVEN_DATA; return 0;
    case OPT_METRICS: o->metrics_path = v; return 0;
    case OPT_SAVE: o->save_path = v; return 0;
    case OPT_NO_SHUFFLE: o->shuffle = 0; return 0;
    case OPT_AUGMENT: o->augment = 1; return 0;
    case OPT_TF32: o->tf32 = 1; return 0;
    case OPT_ZERO: return parse_int_in("zero", v, 0, 2, &o->zero);
    case OPT_BROADCAST_INIT: o->broadcast_init = 1; return 0;
    case OPT_TRACE: o->trace_path = v; return 0;
    case OPT_NO_OVERLAP: o->no_overlap = 1; return 0;
    case OPT_LINK_CHECK: o->link_check = 1; return 0;
    case OPT_HELP: return 1;
    default:
        if (id >= OPT_GPT_CONFIG)
            return parse_gpt_opt(id, v, o);
        return id >= OPT_CKPT_DIR ? parse_resume_opt(id, v, o) : parse_number(id, v, o);
    }
}

/* An unknown option, a missing value or a stray argument: one line naming it (with the nearest
 * flag for an unknown one) and where the flags are listed, printed by the job's first rank only
 * (every rank parses the same command line). */
static void usage_error(const char *what, const char *arg)
{
    if (!suggest_first_rank())
        return;
    const char *near = strcmp(what, "unknown option") == 0 ? suggest_option(train_long_opts, arg) : NULL;
    fprintf(stderr, "ddp-train: %s '%s'", what, arg);
    if (near)
        fprintf(stderr, "; did you mean --%s?", near);
    fputs("\nusage: ddp-train [options]; ddp-train --help lists them\n", stderr);
}

train_parse_result train_parse_args(int argc, char **argv, train_opts *o)
{
    unsigned char seen[OPT_END - OPT_MODEL] = {0};
    train_opts_default(o);
    opterr = 0;
    optind = 0; /* glibc: 0 resets getopt entirely, so a parse left inside "-hh" cannot leak into this one */
    int id;
    while ((id = getopt_long(argc, argv, ":h", train_long_opts, NULL)) != -1) {
        int rc;
        if (id == 'h') {
            rc = 1;
        } else if (id == '?' || id == ':') {
            usage_error(id == '?' ? "unknown option" : "missing value for option", argv[optind - 1]);
            return DDP_TRAIN_USAGE;
        } else {
            seen[id - OPT_MODEL] = 1;
            rc = train_apply_opt(id, optarg, o);
        }
        if (rc == 1) {
            fputs(train_usage_text, stdout);
            fputs(train_usage_more, stdout);
            fputs(train_usage_gpt, stdout);
            return DDP_TRAIN_HELP;
        }
        if (rc != 0)
            return DDP_TRAIN_USAGE;
    }
    if (optind < argc) {
        usage_error("unexpected argument", argv[optind]);
        return DDP_TRAIN_USAGE;
    }
    if (o->n_inject > 0 && o->grad_dtype != DDP_FP16 && o->model.precision != DDP_FP16) {
        fprintf(stderr, "ddp-train: --inject-inf tests the fp16 loss scaler: add --grad-dtype fp16 "
                        "or --precision fp16\n");
        return DDP_TRAIN_USAGE;
    }
    if (check_resume_opts(o) != 0 || finish_gpt_opts(o, seen) != 0)
        return DDP_TRAIN_USAGE;
    o->model.seed = o->seed;
    o->model.max_batch = o->batch;
    return DDP_TRAIN_RUN;
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
    fprintf(f, "\ndata: %s\nepochs: %d  max-steps: %ld  batch per rank: %d  ", o->data_dir, o->epochs,
            o->max_steps, o->batch);
    if (o->gpt.on && o->gpt.total_batch_tokens)
        fprintf(f, "accum: from --total-batch-tokens %ld\n", o->gpt.total_batch_tokens);
    else
        fprintf(f, "accum: %d\n", o->accum);
    if (o->gpt.on)
        fprintf(f, "adamw: lr %g, warm-up %ld steps, cosine to %g x lr; betas %g, %g; eps %g; weight "
                "decay %g (2-D weights); grad clip %g\n", o->lr, o->gpt.warmup_steps, o->gpt.lr_floor,
                o->gpt.beta1, o->gpt.beta2, o->gpt.eps, o->weight_decay, o->gpt.grad_clip);
    else
        fprintf(f, "sgd: lr %g (%s)  momentum %g  weight decay %g  seed %llu  shuffle %s\n", o->lr,
            o->cosine ? "cosine" : "constant", o->momentum, o->weight_decay, (unsigned long long)o->seed,
            o->shuffle ? "yes" : "no");
    fprintf(f, "buckets: %g MiB (first %g MiB)%s  broadcast-init: %s  threads: %d  augment: %s\n",
            o->bucket_mb, o->first_bucket_mb, o->no_overlap ? " launched after backward" : "",
            o->broadcast_init ? "yes" : "no", o->threads,
            o->augment ? "shifts up to 2 px" : "no");
    fprintf(f, "precision: %s%s\n", model_precision_name(o->model.precision),
            o->tf32 ? "  (fp32 GEMMs and convolutions on TF32 tensor cores on a GPU)" : "");
    fprintf(f, "gradient all-reduce: %s", ddp_dtype_name(o->grad_dtype));
    if (o->grad_dtype == DDP_FP16)
        fprintf(f, " with loss scaling (scale %g, doubled after %ld finite steps)", o->loss_scale_init,
                o->loss_scale_interval);
    fprintf(f, "  data workers: %d\n", o->workers);
    if (o->checkpoint_dir)
        fprintf(f, "checkpoints: %s every %ld steps (keep %d, errors %s, %s)", o->checkpoint_dir,
                o->checkpoint_every, o->keep, o->checkpoint_errors_warn ? "warn" : "stop",
                o->checkpoint_folder ? (o->checkpoint_async ? "a folder per checkpoint, written in the "
                "background" : "a folder per checkpoint") : "a file per checkpoint");
    else
        fputs("checkpoints: none (--checkpoint-dir)", f);
    fprintf(f, "  resume: %s  nan-policy: %s\n", o->resume ? o->resume : "no", o->nan_skip ? "skip" : "stop");
}
