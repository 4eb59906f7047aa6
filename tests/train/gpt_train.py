#!/usr/bin/python3
"""gpt_train.py - ddp-train --model gpt2 end to end on small models and synthetic llm.c shards.

Modes:
  equivalence  2 ranks equal 1 process accumulating 2 micro-batches (fp32, clipping active: the
               global norm is over the averaged gradient, so both clip alike), to ddp-ckpt diff
               --tol 1e-4 (TOL says why not 1e-5); a different seed differs (negative control);
               3 ranks likewise; fp16 with the loss scaler skips a step with inf on every rank;
               the summary's MFU fields (llm.c's 6N + 6LCT, --peak-tflops 1, null without it).
  resume       a run of 6 steps over 2 epochs equals, bit for bit (tol 0), runs resumed from its
               step-2 (mid-epoch) and step-4 (epoch boundary) checkpoints: parameters, AdamW
               moments and the loader's position.
  llmc         --save-llmc writes llm.c's model file and --init-from reads it back; --sample-only
               samples from it without training, after a --prompt, greedy (--temperature 0: the
               same text twice) and at --top-k 5 (another --seed, another text), also without
               the training shards (no banner, optimizer state or throughput; a missing
               vocabulary named as --vocab); the first step's loss line comes at once, whatever
               --log-every; a 2000-token sample at 2 ranks under DDP_TIMEOUT 2 s (every rank
               draws it, none waits past the deadline; the text one process draws); needs
               data/text's GPT-2 vocabulary (scripts/fetch-text.sh).
  bad_input    missing shards, a bad magic, a token outside the vocabulary, a batch plan that does
               not divide, an --init-from that is no model file (a FIFO too): a clear message and
               exit 1 on every rank, no hang; a newcomer's frictions: an unquoted --data pattern,
               a warm-up or validation interval beyond the plan, a run extended on resume (the
               rate before and after), one with no step left (said so), an fp32 run's memory line
               (no bf16 in it).
  profile_step DDP_PROFILE_STEP=2 (the step a profiler records, ddp_profiler_range: a no-op on the
               CPU) changes nothing: the checkpoint equals a run without it, bit for bit; a value
               that is not a step number >= 1 stops the run with a clear message.
  text         (e2e) the real text of scripts/fetch-text.sh (data/text): a tiny GPT at 2 ranks; the
               validation loss falls from ~10.8 (uniform over 50,257) below the stated bound.

Why the windows coincide in `equivalence`: the loader cuts the shards into windows of B x T + 1
tokens and draws one permutation of them per epoch from (seed, epoch), independent of the world
size; rank r takes windows r, r + N, ... So at step s the 2 ranks read windows 2s and 2s + 1, and
one process with --accum 2 reads the same two as its micro-batches.

Usage: gpt_train.py MODE DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import json
import math
import os
import re
import stat
import struct
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

SHARD_MAGIC = 20240520
# Ranks against accumulation: the sums differ in rounding only (a GEMM that accumulates into the
# gradient rounds once, a separate product and sum twice), but AdamW divides each gradient by its
# own running RMS: the key third of attn.c_attn.bias has a true gradient of 0 (softmax ignores a
# shift of every score), so its rounding noise is normalised into steps of about lr. 1e-5 of the
# largest value holds for every other tensor; that bias moves ~1.5e-5 (measured), hence 1e-4.
TOL = "1e-4"
TEXT_VAL_BOUND = 7.0  # validation loss the tiny model must reach on Jane Austen (from ~10.8)


def write_shard(path, tokens, magic=SHARD_MAGIC):
    """An llm.c token shard: 256 int32 (magic, version 1, count), then uint16 tokens."""
    header = [magic, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def synthetic_tokens(n, seed, vocab=50257):
    """A learnable stream: short repeating phrases of tokens drawn from a small, spread-out set."""
    words = [(i * 7919 + 13) % vocab for i in range(40)]
    state, out = seed, []
    while len(out) < n:
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        start = (state >> 8) % 30
        out += words[start:start + 6] + [50256]
    return out[:n]


def write_data(tmp, n_train=8 * 1024, n_val=1500):
    folder = os.path.join(tmp, "shards")
    os.makedirs(folder, exist_ok=True)
    write_shard(os.path.join(folder, "syn_train_000001.bin"), synthetic_tokens(n_train, 1))
    write_shard(os.path.join(folder, "syn_train_000002.bin"), synthetic_tokens(n_train // 2, 2))
    write_shard(os.path.join(folder, "syn_val_000000.bin"), synthetic_tokens(n_val, 3))
    return os.path.join(folder, "syn_train_*.bin")


def tiny(exe, data, steps, extra=()):
    return [exe, "--model", "gpt2", "--layers", "2", "--heads", "2", "--channels", "64",
            "--seq", "16", "--batch", "2", "--data", data, "--max-steps", str(steps), "--epochs", "50",
            "--lr", "1e-3", "--warmup-steps", "2", "--device", "cpu", "--log-every", "1",
            "--val-max-batches", "4"] + list(extra)


def equivalence(chk, exe, ckpt, mpi, tmp):
    data = write_data(tmp)
    clip = ["--grad-clip", "0.05"]  # well under the norms of these steps: every step clips
    for n in (2, 3):
        fp = lambda name: ["--metrics", os.path.join(tmp, name + ".jsonl")]  # noqa: E731
        ranks = trainlib.train_save(chk, tmp, f"np{n}", tiny(exe, data, 4, clip + fp(f"np{n}")),
                                    prefix=mpi + [str(n)])
        single = trainlib.train_save(chk, tmp, f"accum{n}",
                                     tiny(exe, data, 4, clip + ["--accum", str(n)] + fp(f"accum{n}")))
        trainlib.diff_ckpt(chk, ckpt, ranks, single, True, f"gpt2: {n} ranks vs 1 process --accum {n}", TOL)
        fa, fb = trainlib.data_fps(ranks), trainlib.data_fps(single)  # token windows, not samples
        chk.check(len(fa) == 4 and fa == fb and all(s == n for _, s in fa.values()) and
                  len({x for x, _ in fa.values()}) == 4,
                  f"gpt2: {n} ranks vs --accum {n}: the same {n} token windows at every step, others "
                  "at each step (the --metrics data fingerprints)", f"{fa}\n{fb}")
    other = trainlib.train_save(chk, tmp, "accum2seed", tiny(exe, data, 4, clip + ["--accum", "2", "--seed", "7"]))
    trainlib.diff_ckpt(chk, ckpt, os.path.join(tmp, "accum2.ckpt"), other, False, "gpt2: another seed", TOL)
    rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, 4, clip), timeout=300)
    chk.check(rc == 0 and "replicas identical after training" in out, "2 ranks: replicas identical after training", out)
    # fp16 with the loss scaler: rank 1's inf at step 2 makes every rank skip that step alike
    rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, 6, ["--precision", "fp16", "--inject-inf", "1:2"]),
                           timeout=300)
    chk.check(rc == 0 and "step skipped on every rank" in out and "replicas identical after training" in out,
              "fp16: an inf on one rank skips the step on every rank; replicas identical", out)
    mfu_metrics(chk, exe, mpi, tmp, data)


def tiny_flops_per_token(T=16, L=2, C=64, Vp=50304, max_seq=1024):
    """llm.c's 6N + 6LCT, N from the shapes with wte's padding rows (tests/train/test_mfu.c)."""
    layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)
    n = Vp * C + max_seq * C + L * layer + 2 * C
    return 6 * n + 6 * L * C * T


def mfu_metrics(chk, exe, mpi, tmp, data):
    """--peak-tflops 1 at 2 ranks: the summary's mfu is tokens/s per rank (from step 2 on) x FLOPs
    per token / 1e12, and the progress lines show ms/step and MFU; without it the CPU's MFU is
    null and the lines have no MFU."""
    for ranks, extra in ((2, ["--peak-tflops", "1"]), (1, [])):
        metrics = os.path.join(tmp, f"mfu{ranks}.jsonl")
        rc, out = trainlib.run(mpi + [str(ranks)] + tiny(exe, data, 4, extra + ["--metrics", metrics]),
                               timeout=300)
        lines = [json.loads(l) for l in open(metrics)] if rc == 0 and os.path.exists(metrics) else [{}]
        s, what = lines[-1], f"{ranks} rank(s) {' '.join(extra) or 'without --peak-tflops'}"
        tps, flops = s.get("tokens_per_s_steady"), s.get("flops_per_token")
        chk.check(rc == 0 and flops == tiny_flops_per_token(), f"{what}: flops_per_token {flops} is "
                  f"6N + 6LCT = {tiny_flops_per_token()}", out)
        chk.check(isinstance(tps, (int, float)) and tps > 0 and s.get("ms_per_step", 0) > 0,
                  f"{what}: tokens_per_s_steady {tps} and ms_per_step {s.get('ms_per_step')} > 0")
        want_tflops = tps / ranks * tiny_flops_per_token() / 1e12 if tps else None
        got = s.get("model_tflops_per_rank")
        chk.check(want_tflops is not None and got is not None and abs(got - want_tflops) <= 1e-5 * want_tflops,
                  f"{what}: model_tflops_per_rank {got} = tokens/s per rank x FLOPs per token ({want_tflops})")
        progress = [l for l in out.splitlines() if l.startswith("step ") and "tokens/s" in l]
        chk.check(len(progress) == 4 and all("ms/step" in l for l in progress),
                  f"{what}: 4 progress lines with ms/step", out)
        if extra:
            got = s.get("mfu")
            chk.check(s.get("peak_tflops") == 1 and got is not None and want_tflops is not None
                      and abs(got - want_tflops) <= 1e-5 * want_tflops,
                      f"{what}: mfu {got} = model TFLOP/s per rank / 1 TFLOP/s ({want_tflops})")
            chk.check(all("% MFU" in l for l in progress), f"{what}: the progress lines show the MFU", out)
        else:
            chk.check("mfu" in s and s["mfu"] is None and s.get("peak_tflops", 0) is None,
                      f"{what}: mfu and peak_tflops are null on the CPU: {s.get('mfu')}, {s.get('peak_tflops')}")
            chk.check(not any("MFU" in l for l in progress), f"{what}: no MFU in the progress lines", out)


def resume(chk, exe, ckpt, mpi, tmp):
    # windows of 2 x 16 + 1 tokens: 9 in all, 8 used at 2 ranks: epochs of 4 steps
    data = write_data(tmp, n_train=200, n_val=200)
    base = tiny(exe, data, 6)
    straight = trainlib.train_save(chk, tmp, "straight", base + ["--checkpoint-dir", os.path.join(tmp, "c1"),
                                                                "--checkpoint-every", "2", "--keep", "5"],
                                   prefix=mpi + ["2"])
    for step, where in ((2, "mid-epoch"), (4, "at the epoch boundary")):
        mid = os.path.join(tmp, "c1", f"step-{step:012d}.ckpt")
        chk.check(os.path.exists(mid), f"the step-{step} checkpoint exists")
        resumed = trainlib.train_save(chk, tmp, f"resumed{step}", base + ["--resume", mid], prefix=mpi + ["2"])
        trainlib.diff_ckpt(chk, ckpt, straight, resumed, True, f"resumed from step {step} ({where}) equals the straight run", "0")
    rc, out = trainlib.run([ckpt, "show", straight], timeout=60)
    chk.check(rc == 0 and "adam_m" in out and "adam_v" in out, "the checkpoint holds both AdamW moments", out)


def val_loss(out):
    m = re.findall(r"step \d+: val loss (\S+)", out)
    return float(m[-1]) if m else None


def llmc(chk, exe, ckpt, mpi, tmp):
    """--save-llmc writes llm.c's model file; --init-from reads it back (its sizes win over the
    flags): with a learning rate of 1e-12 the first step leaves the weights as they were, so the
    validation loss is the saved model's."""
    data = write_data(tmp)
    path = os.path.join(tmp, "model.bin")
    rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, 4, ["--save-llmc", path,
                                                             "--log-every", "3"]), timeout=300)
    chk.check(rc == 0 and os.path.exists(path), f"--save-llmc writes {path} (exit {rc})", out)
    chk.check(re.findall(r"^step (\d+)/4 ", out, re.M) == ["1", "3", "4"],
              "--log-every 3: a loss line at the first step at once, then steps 3 and 4 (the last)",
              out)
    chk.check(re.search(r"memory per rank at start-up .* activations [\d.]+ MiB \(the logits [\d.]+ MiB", out)
              is not None, "the memory is reported before the first step, the logits broken out", out)
    with open(path, "rb") as f:
        header = struct.unpack("<8i", f.read(32))
    chk.check(header[:8] == (20240326, 3, 1024, 50257, 2, 2, 64, 50304),
              f"llm.c header: magic, version 3, maxT, V, L, NH, C, Vp = {header}")
    args = tiny(exe, data, 1, ["--init-from", path, "--lr", "1e-12", "--warmup-steps", "0"])
    args[args.index("--layers") + 1] = "3"  # the file's 2 layers win
    rc2, out2 = trainlib.run(mpi + ["2"] + args, timeout=300)
    a, b = val_loss(out), val_loss(out2)
    chk.check(rc2 == 0 and "L 2, heads 2, channels 64" in out2 and "from " + path in out2,
              "--init-from takes the file's sizes", out2)
    chk.check(a is not None and b is not None and abs(a - b) < 1e-3,
              f"--init-from continues from the saved weights: val loss {a} then {b}")
    sample_only(chk, exe, data, path)
    sample_ranks(chk, exe, data, path, mpi)


def sample_ranks(chk, exe, data, model, mpi):
    """--sample at 2 ranks under a deadline (DDP_TIMEOUT 2 s, rank 1's report 2 s after it; MPI_Init
    is under it too, so not less on a loaded machine) shorter than the sampling (2000 tokens,
    about 13 s here): every rank draws the sample, so none waits past the deadline for rank 0's
    (which ended the job at 4 s before); rank 0 alone prints it, the same text as one process
    (without the deadline) draws."""
    vocab = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "text",
                         "encoder.json")
    if not os.path.exists(vocab):
        return  # sample_only says what is missing
    extra = ["--init-from", model, "--sample-only", "--sample", "2000", "--vocab", vocab,
             "--prompt", "It is a truth", "--temperature", "1", "--top-k", "8"]
    texts = []
    for prefix in (mpi + ["2", "-x", "DDP_TIMEOUT"], []):
        env = dict(os.environ, DDP_TIMEOUT="2") if prefix else None
        rc, out = trainlib.run(prefix + tiny(exe, data, 1, extra), timeout=600, env=env)
        found = re.findall(r"^sample \(2000 tokens[^\n]*\n(.*)$", out, re.M)
        chk.check(rc == 0 and len(found) == 1 and "deadline" not in out,
                  f"--sample 2000 at {2 if prefix else 1} rank(s)"
                  f"{', DDP_TIMEOUT 2' if prefix else ''}: exit 0, one "
                  f"sample, no deadline passed (exit {rc}, {len(found)} samples)", out)
        texts.append(found[0] if found else None)
    chk.check(texts[0] is not None and texts[0] == texts[1],
              "the sample at 2 ranks is the one a single process draws")


def sample_only(chk, exe, data, model):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    vocab = os.path.join(root, "data", "text", "encoder.json")
    if not os.path.exists(vocab):
        chk.check(False, "data/text has GPT-2's vocabulary: run scripts/fetch-text.sh data/text and test again")
        return
    def run(*extra):
        cmd = tiny(exe, data, 1, ["--init-from", model, "--sample-only", "--sample", "12", "--vocab", vocab,
                                  "--prompt", "It is a truth", *extra])
        rc, out = trainlib.run(cmd, timeout=300)
        m = re.search(r"^sample \(12 tokens after the prompt[^\n]*\n(.*)$", out, re.M)
        chk.check(rc == 0 and m is not None, f"--sample-only {' '.join(extra)}: a sample is printed", out)
        chk.check(not re.search(r"^step \d+/", out, re.M), "--sample-only trains no step", out)
        return m.group(1) if m else None
    greedy = [run("--temperature", "0") for _ in range(2)]
    chk.check(greedy[0] is not None and greedy[0] == greedy[1] and greedy[0].startswith("It is a truth"),
              f"greedy sampling: the prompt, then the same text twice ({greedy})")
    drawn = [run("--temperature", "1", "--top-k", "5", "--seed", str(seed)) for seed in (1, 2)]
    chk.check(drawn[0] is not None and drawn[0] != drawn[1], f"top-k 5 at two seeds: two texts ({drawn})")
    sample_without_data(chk, exe, data, model, vocab)


def sample_without_data(chk, exe, data, model, vocab):
    """--sample-only needs the weights and the vocabulary only: no shards, no training banner, no
    optimizer state, no throughput (with the shards there or not); a missing vocabulary names
    --vocab."""
    absent = os.path.join(os.path.dirname(model), "no-such-shards", "x_train_*.bin")
    base = [exe, "--model", "gpt2", "--device", "cpu", "--init-from", model, "--sample-only",
            "--sample", "8", "--data", absent]
    for shards in (data, absent):
        rc, out = trainlib.run(base[:-1] + [shards, "--vocab", vocab], timeout=300)
        what = "without the training shards" if shards == absent else "with the shards there"
        chk.check(rc == 0 and re.search(r"^sample \(8 tokens", out, re.M) is not None,
                  f"--sample-only {what}: a sample", out)
        chk.check(not re.search(r"rank\(s\), backend|optimizer state|tokens/s|^data:|after "
                                r"training", out, re.M),
                  f"--sample-only {what}: no training banner, optimizer state or throughput", out)
    rc, out = trainlib.run(base, timeout=300)
    chk.check(rc != 0 and "--vocab" in out and "--data" not in out.replace(absent, ""),
              "--sample-only without a vocabulary: the error names --vocab", out)


def expect_failure(chk, cmd, pattern, what):
    rc, out = trainlib.run(cmd, timeout=120)
    chk.check(rc not in (0, -999) and re.search(pattern, out) is not None,
              f"{what}: exit {rc}, message matches /{pattern}/", out)


def bad_input(chk, exe, ckpt, mpi, tmp):
    data = write_data(tmp)
    folder = os.path.dirname(data)
    expect_failure(chk, mpi + ["2"] + tiny(exe, os.path.join(tmp, "none_train_*.bin"), 2),
                   r"none_train_\*\.bin", "no shard matches the pattern")
    write_shard(os.path.join(folder, "bad_train_000001.bin"), synthetic_tokens(4000, 1), magic=1234)
    write_shard(os.path.join(folder, "bad_val_000000.bin"), synthetic_tokens(400, 1))
    expect_failure(chk, mpi + ["2"] + tiny(exe, os.path.join(folder, "bad_train_*.bin"), 2),
                   r"bad_train_000001\.bin.*magic|magic.*bad_train_000001\.bin", "a shard with a bad magic")
    write_shard(os.path.join(folder, "big_train_000001.bin"), [60000] * 4000)
    write_shard(os.path.join(folder, "big_val_000000.bin"), synthetic_tokens(400, 1))
    expect_failure(chk, mpi + ["2"] + tiny(exe, os.path.join(folder, "big_train_*.bin"), 2),
                   r"60000", "a token outside the vocabulary")
    expect_failure(chk, mpi + ["2"] + tiny(exe, data, 2, ["--total-batch-tokens", "100"]),
                   r"--total-batch-tokens 100 is not a multiple", "--total-batch-tokens that does not divide")
    expect_failure(chk, tiny(exe, data, 2, ["--seq", "2048"]), r"--seq 2048", "--seq past the positions")
    expect_failure(chk, tiny(exe, os.path.join(folder, "syn_*_000001.bin"), 2, ["--val-data", os.path.join(tmp, "x_*.bin")]),
                   r"x_\*\.bin", "a validation pattern that matches nothing")
    different_data(chk, exe, mpi, tmp)
    switches(chk, exe, data)
    newcomer(chk, exe, tmp, data)
    empty_validation(chk, exe, mpi, tmp, data)
    bad_init_from(chk, exe, mpi, tmp, data)
    bad_save_llmc(chk, exe, mpi, tmp, data)


RUN4_SWITCHES = ["DDP_LT_BIAS16", "DDP_LT_EPILOGUES", "DDP_GPT_LOGITS16", "DDP_ADD_LN_FUSED",
                 "DDP_LN_BWD_FUSED", "DDP_ENC_SEG", "DDP_FLASH_BF16_OUT", "DDP_CLIP_DEVICE",
                 "DDP_GPT_READ_COPY"]


def switches(chk, exe, data):
    """models/ops/switches.h in ddp-train: a value other than 0 or 1 stops the run naming the
    variable; every switch 0 in bf16 (the CPU takes fp32 logits, the host's clip factor and the
    fp32 master's reads) trains, says so on the start-up report, and ends near the default."""
    env = dict(os.environ, DDP_ENC_SEG="off")
    rc, out = trainlib.run(tiny(exe, data, 2), timeout=120, env=env)
    chk.check(rc not in (0, -999) and "DDP_ENC_SEG=off: use 0" in out,
              f"DDP_ENC_SEG=off refused: exit {rc}", out)
    losses = []
    for off in (False, True):
        env = dict(os.environ, **{v: "0" for v in RUN4_SWITCHES}) if off else None
        rc, out = trainlib.run(tiny(exe, data, 6, ["--precision", "bf16", "--val-every", "6"]),
                               timeout=120, env=env)
        line = re.search(r"^switches: (.*)$", out, re.M)
        said = line is not None and all(v + "=0 (" in line.group(1) for v in RUN4_SWITCHES)
        chk.check(rc == 0 and val_loss(out) is not None and said == off,
                  f"bf16 with every switch {'0' if off else 'unset'}: exit {rc}, the switches: line "
                  f"{'naming each' if off else 'absent'}", out)
        losses.append(val_loss(out))
    if None not in losses:
        chk.check(abs(losses[0] - losses[1]) < 0.05, f"val loss {losses[1]} with the switches 0, "
                  f"{losses[0]} without: within 0.05")


def newcomer(chk, exe, tmp, data):
    """A newcomer's frictions (issue 38): an unquoted --data pattern the shell expanded to one
    shard (the derived validation name is said to be derived, with the fix); --warmup-steps and
    --val-every beyond the steps planned (warned once, with the numbers and the fix); a run
    extended on resume (the warning gives the rate at the resumed step before and after)."""
    one = os.path.join(os.path.dirname(data), "syn_train_000001.bin")
    expect_failure(chk, tiny(exe, one, 2), r"syn_val_000001\.bin, the name derived from --data "
                   r".*--data names one file.*quote the pattern.*--val-data",
                   "--data naming one shard (an unquoted pattern): the derived name and the fix")
    rc, out = trainlib.run(tiny(exe, one, 2), timeout=120)
    chk.check(rc not in (0, -999) and not re.search(r"\w+\.c:\d+:", out),
              "a user's error carries no source location (file.c:123:)", out)
    rc, out = trainlib.run(tiny(exe, data, 3, ["--warmup-steps", "5", "--val-every", "8"]),
                           timeout=300)
    warm = r"warning: --warmup-steps 5 is more than the 3 steps planned.*use --warmup-steps 3 or fewer"
    val = r"warning: --val-every 8 is more than the 3 steps planned.*--val-every 3 or fewer"
    chk.check(rc == 0 and len(re.findall(warm, out)) == 1 and len(re.findall(val, out)) == 1,
              "--warmup-steps 5 and --val-every 8 over 3 steps: one warning each, numbers and fix",
              out)
    rc, out = trainlib.run(tiny(exe, data, 3, ["--val-every", "3"]), timeout=300)
    chk.check(rc == 0 and "is more than the" not in out, "a plan that fits: no warning", out)
    ckdir = os.path.join(tmp, "extend")
    rc, out = trainlib.run(tiny(exe, data, 4, ["--checkpoint-dir", ckdir, "--checkpoint-every", "2",
                                               "--warmup-steps", "0"]), timeout=300)
    mid = os.path.join(ckdir, f"step-{2:012d}.ckpt")
    rc2, out2 = trainlib.run(tiny(exe, data, 12, ["--resume", mid, "--warmup-steps", "0"]),
                             timeout=300)
    m = re.search(r"planned over 4 steps, now over 12.*at the checkpoint's step 2 the learning "
                  r"rate goes from (\S+) \(the 4-step plan\) to (\S+) \(x", out2)
    # cosine from 1e-3 to 1e-4 (--lr-floor 0.1): step 2 of 4 is 1e-4 + 0.5 (1 + cos(2 pi / 3)) 9e-4,
    # of 12 1e-4 + 0.5 (1 + cos(2 pi / 11)) 9e-4
    want = [1e-4 + 0.5 * (1 + math.cos(math.pi * 2 / 3)) * 9e-4,
            1e-4 + 0.5 * (1 + math.cos(math.pi * 2 / 11)) * 9e-4]
    chk.check(rc == 0 and rc2 == 0 and m is not None
              and all(abs(float(g) - w) < 5e-3 * w for g, w in zip(m.groups(), want)),
              f"extended on resume: the rate at step 2 before and after ({want})", out + out2)
    end = os.path.join(ckdir, f"step-{4:012d}.ckpt")
    rc, out = trainlib.run(tiny(exe, data, 4, ["--resume", end, "--warmup-steps", "0"]),
                           timeout=300)
    chk.check(rc == 0 and "from step 2 on: not measured (no step in this run)" in out,
              "a resumed run with no step left: 'no step in this run', not 'one step'", out)
    chk.check(re.search(r"the logits [\d.]+ MiB of them: B x T x padded vocabulary in fp32", out)
              is not None and "bf16 in bf16 runs" not in out,
              "an fp32 run's memory line: logits in fp32, no bf16", out)


def bad_save_llmc(chk, exe, mpi, tmp, data):
    """--save-llmc onto what a file write must not replace (a character device like /dev/full, a
    FIFO, a folder) or into a missing folder: refused before training under mpirun -np 2, the
    special file left as it was; through a symbolic link the file it names is written."""
    dev, fifo = os.path.join(tmp, "full"), os.path.join(tmp, "fifo")
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # a private copy of /dev/full (root)
    os.mkfifo(fifo)
    cases = [(dev, "is a character device"), (fifo, "is a FIFO"), (tmp, "is a folder"),
             (os.path.join(tmp, "none", "m.bin"), "cannot write into the folder")]
    for path, words in cases:
        rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, 2, ["--save-llmc", path]), timeout=120)
        chk.check(rc not in (0, -999) and f"--save-llmc {path}" in out and words in out and "step 1/" not in out,
                  f"--save-llmc onto {words.split()[-1]}: refused before training", out)
    chk.check(stat.S_ISCHR(os.lstat(dev).st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode),
              "the device and the FIFO are still what they were")
    target, link = os.path.join(tmp, "target.bin"), os.path.join(tmp, "link.bin")
    open(target, "wb").close()
    os.symlink(target, link)
    rc, out = trainlib.run(tiny(exe, data, 2, ["--save-llmc", link]), timeout=120)
    chk.check(rc == 0 and os.path.islink(link) and os.path.getsize(target) > 1024,
              "--save-llmc through a symbolic link writes the file it names, the link stays", out)


def empty_validation(chk, exe, mpi, tmp, data):
    """A validation set of 0 or 1 tokens has no target: refused at start-up naming the file and its
    count (not "val loss nan" and exit 0)."""
    for n in (0, 1):
        val = os.path.join(tmp, f"tiny{n}_val.bin")
        write_shard(val, synthetic_tokens(n, 3))
        rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, 2, ["--val-data", val]), timeout=120)
        chk.check(rc not in (0, -999) and f"{val}: {n} token" in out and "T + 1 = 17" in out
                  and "step 1" not in out,
                  f"a validation shard of {n} token(s): refused at start-up naming it and the 17 "
                  f"tokens of a window (exit {rc})", out)


def bad_init_from(chk, exe, mpi, tmp, data):
    """--init-from given what is not an llm.c model file: a 1 KiB file whose header says d48 is
    refused by its size before the 1.5B-parameter model is built (it took 58 s and 6.4 GiB); a
    folder and a token shard are named as such, with the option that takes them; a FIFO is refused
    at once as not a regular file (opening it used to wait for a writer forever); a checkpoint
    folder without its MANIFEST (an interrupted save) is named as such, with the fix (it used to be
    called "not an llm.c model file")."""
    d48 = os.path.join(tmp, "d48_header_only.bin")
    with open(d48, "wb") as f:
        f.write(struct.pack("<256i", *([20240326, 3, 1024, 50257, 48, 25, 1600, 50304] + [0] * 248)))
    start = time.monotonic()
    rc, out = trainlib.run(tiny(exe, data, 1, ["--init-from", d48]), timeout=180)
    took = time.monotonic() - start
    chk.check(rc not in (0, -999) and f"{d48}: 1024 bytes, want 6230746624" in out and took < 10,
              f"--init-from a 1 KiB file with a d48 header: refused by its size in {took:.1f} s "
              f"(exit {rc})", out)
    # a GPT-2's ddp checkpoint is taken (weights only): gpt_init.py tests it and its refusals
    shard = os.path.join(os.path.dirname(data), "syn_val_000000.bin")
    fifo = os.path.join(tmp, "model.fifo")  # opening it to read must not wait for a writer
    os.mkfifo(fifo)
    interrupted = [os.path.join(tmp, "ck", "step-000000000004.ckpt"), os.path.join(tmp, "weights")]
    for folder in interrupted:  # what a save killed before its MANIFEST leaves
        os.makedirs(folder)
        with open(os.path.join(folder, "rank-00000-of-00002.ckpt"), "wb") as f:
            f.write(b"DDPCKPT1" + bytes(64))
    unfinished = [f"{interrupted[0]}: a checkpoint folder without its MANIFEST", "interrupted",
                  "give a complete step folder"]
    for path, words, what in ((tmp, ["is a folder", "llm.c model file"], "a folder"),
                              (shard, ["token shard", "--data"], "a token shard"),
                              (interrupted[0], unfinished, "an interrupted save's step folder"),
                              (interrupted[1], [f"{interrupted[1]}: a checkpoint folder without"],
                               "a folder of an interrupted save's rank file"),
                              (fifo, [f"{fifo} is a FIFO (named pipe), not a regular file",
                                      "put the regular file back"], "a FIFO")):
        start = time.monotonic()
        rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, 1, ["--init-from", path]), timeout=60)
        took = time.monotonic() - start
        try:  # a reader blocked in open() (the bug) gets end of file instead of staying behind
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        chk.check(rc not in (0, -999) and all(w in out for w in words) and took < 30,
                  f"--init-from {what}: exit {rc} in {took:.1f} s, the message says {words}", out)


def mpmd(mpi, first, second):
    """mpirun ... -np 1 FIRST : -np 1 SECOND (rank 0 runs FIRST, rank 1 SECOND)."""
    return mpi + ["1"] + first + [":", "-np", "1"] + second


def different_data(chk, exe, mpi, tmp):
    """Ranks given shards of different sizes: refused at start-up with every rank's count, not a
    hang after the smaller rank's last window (DDP_TIMEOUT=20 would end that hang after 20 s)."""
    folder = os.path.join(tmp, "sizes")
    os.makedirs(folder)
    val = os.path.join(folder, "v_val.bin")
    write_shard(val, synthetic_tokens(200, 3))
    for name, windows in (("w20", 20), ("w10", 10)):  # windows of 2 x 16 + 1 tokens
        write_shard(os.path.join(folder, name + "_train.bin"), synthetic_tokens(windows * 32 + 1, 1))
    env = dict(os.environ, DDP_TIMEOUT="20")

    def run(data, vdata):
        return tiny(exe, os.path.join(folder, data + "_train.bin"), 50, ["--val-data", vdata])
    start = time.monotonic()
    rc, out = trainlib.run(mpmd(mpi, run("w20", val), run("w10", val)), timeout=120, env=env)
    took = time.monotonic() - start
    chk.check(rc not in (0, -999) and re.search(r"rank 0: 641 tokens, 20 windows", out) is not None
              and re.search(r"rank 1: 321 tokens, 10 windows", out) is not None and took < 15,
              f"training shards of 20 and 10 windows on 2 ranks: refused at start-up naming both "
              f"counts (exit {rc}, {took:.1f} s)", out)
    chk.check("step 1" not in out, "... before any step", out)
    short = os.path.join(folder, "short_val.bin")
    write_shard(short, synthetic_tokens(100, 3))
    rc, out = trainlib.run(mpmd(mpi, run("w20", val), run("w20", short)), timeout=120, env=env)
    chk.check(rc not in (0, -999) and "rank 0: 641 tokens, 20 windows of 33, 200 validation tokens" in out
              and "rank 1: 641 tokens, 20 windows of 33, 100 validation tokens" in out,
              f"validation shards of 200 and 100 tokens on 2 ranks: refused naming both (exit {rc})", out)


def profile_step(chk, exe, ckpt, mpi, tmp):
    data = write_data(tmp)
    plain = trainlib.train_save(chk, tmp, "plain", tiny(exe, data, 4))
    path = os.path.join(tmp, "profiled.ckpt")
    rc, out = trainlib.run(tiny(exe, data, 4) + ["--save", path], timeout=300,
                           env=dict(os.environ, DDP_PROFILE_STEP="2"))
    chk.check(rc == 0 and os.path.exists(path), f"DDP_PROFILE_STEP=2: exit status {rc}", out)
    trainlib.diff_ckpt(chk, ckpt, plain, path, True, "DDP_PROFILE_STEP=2 equals the plain run", "0")
    for bad in ("0", "two", "3x", ""):
        rc, out = trainlib.run(tiny(exe, data, 2), timeout=120, env=dict(os.environ, DDP_PROFILE_STEP=bad))
        chk.check(rc not in (0, -999) and f"DDP_PROFILE_STEP={bad}: expected a step number" in out,
                  f"DDP_PROFILE_STEP='{bad}': exit {rc} with a clear message", out)


def text(chk, exe, ckpt, mpi, tmp):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    data = os.path.join(root, "data", "text", "austen_train_*.bin")
    if not os.path.exists(os.path.join(root, "data", "text", "austen_val_000000.bin")):
        print("FAILED: data/text has no Jane Austen shards: run scripts/fetch-text.sh data/text and test again")
        sys.exit(1)
    metrics = os.path.join(tmp, "m.jsonl")
    cmd = mpi + ["2", exe, "--model", "gpt2", "--layers", "2", "--heads", "4", "--channels", "128",
                 "--seq", "64", "--batch", "4", "--data", data, "--max-steps", "150", "--lr", "3e-3",
                 "--warmup-steps", "10", "--device", "cpu", "--log-every", "25", "--val-every", "75",
                 "--val-max-batches", "16", "--metrics", metrics, "--sample", "24"]
    rc, out = trainlib.run(cmd, timeout=900)
    print(out)
    chk.check(rc == 0, f"training exits 0 (status {rc})")
    lines = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    vals = [l["val_loss"] for l in lines if "val_loss" in l and not l.get("summary")]
    summary = lines[-1] if lines else {}
    print("validation losses:", vals, "summary:", summary)
    chk.check(len(vals) >= 2, "validation loss reported during and at the end of training")
    chk.check(bool(vals) and vals[-1] < TEXT_VAL_BOUND, f"final validation loss {vals[-1] if vals else None} < {TEXT_VAL_BOUND}")
    chk.check(summary.get("tokens_per_s", 0) > 0, "the summary has tokens_per_s")
    chk.check("sample (24 tokens" in out, "a sample is printed")


def main():
    mode, exe, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-gpt-") as tmp:
        {"equivalence": equivalence, "resume": resume, "bad_input": bad_input, "llmc": llmc,
         "profile_step": profile_step, "text": text}[mode](
            chk, exe, ckpt, mpi, tmp)
    chk.done()


if __name__ == "__main__":
    main()
