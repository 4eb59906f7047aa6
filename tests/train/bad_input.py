#!/usr/bin/python3
"""bad_input.py - ddp-train and ddp-ckpt on bad command lines and bad data: each run exits non-zero
within seconds with a message naming the problem; under mpirun both ranks exit, none hangs.
Absurd flag values (2^63 steps, NaN or infinite rates, ...) are refused with the allowed range, a
batch larger than a rank's share of the data with the largest that fits, and a FIFO where a file
belongs without waiting for the other end.
--data naming a file (/dev/zero) is told that it is not a folder. A truncated NAME.gz (read when
NAME is absent) under mpirun: every rank names the file and the
problem, and the job ends at once.
A run whose loss diverges to NaN stops with exit 1; with --nan-policy skip it goes on and still
writes valid JSON metrics; ddp-ckpt diff does not call NaN equal to a number.

Usage: bad_input.py DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import gzip
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import zlib

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

QUICK_S = 30  # "within seconds": a failing start-up must take far less than this


def expect(chk, what, cmd, want_rc, words):
    """Runs cmd; checks the exit status (want_rc, or any non-zero when None), the time and the words."""
    start = time.monotonic()
    rc, out = trainlib.run(cmd, timeout=120)
    took = time.monotonic() - start
    rc_ok = rc != 0 and rc != -999 if want_rc is None else rc == want_rc
    chk.check(rc_ok, f"{what}: exit status {rc}", out)
    chk.check(took < QUICK_S, f"{what}: finished in {took:.1f} s")
    for w in words:
        chk.check(w in out, f"{what}: message mentions '{w}'", out)
    return out


def absurd_values():
    """Values that parse but would overflow, never end, never learn or not be numbers at all: each
    refused with the allowed range."""
    lr = "expected a number in [1e-12, 1000]"
    return [
        (["--max-steps", str(2 ** 63)], [f"--max-steps: expected a non-negative integer, got '{2 ** 63}' "
                                         "(allowed: 0 to 1000000000000)"]),
        (["--epochs", "1000001"], ["--epochs: expected a positive integer, got '1000001' (allowed: 1 to 1000000)"]),
        (["--workers", "100000"], ["--workers: expected a non-negative integer, got '100000' (allowed: 0 to 256)"]),
        (["--threads", "100000"], ["--threads: expected a positive integer, got '100000' (allowed: 1 to 1024)"]),
        (["--seed", str(2 ** 64)], [f"got '{2 ** 64}' (allowed: 0 to 18446744073709551615)"]),
        (["--lr", "nan"], [f"--lr: {lr}, got 'nan'"]),
        (["--lr", "inf"], [f"--lr: {lr}, got 'inf'"]),
        (["--lr", "0"], [f"--lr: {lr}, got '0'"]),
        (["--lr", "1e308"], [f"--lr: {lr}, got '1e308'"]),
        (["--momentum", "nan"], ["--momentum: expected a number in [0, 1), got 'nan'"]),
        (["--weight-decay", "1e9"], ["--weight-decay: expected a number in [0, 1000], got '1e9'"]),
        (["--bucket-mb", "inf"], ["--bucket-mb: expected a number in (0, 1048576], got 'inf'"]),
        (["--widths", "784-2000000-10"], ["each 1 to 1048576", "784-2000000-10"]),
    ]


def bad_flags(chk, train):
    cases = [
        (["--bogus"], ["unknown option '--bogus'", "ddp-train --help lists them"]),
        # torchrun's and llm.c users' spellings: the nearest flag named
        (["--max_steps", "1"], ["unknown option '--max_steps'; did you mean --max-steps?"]),
        (["--checkpoint-direc", "x"], ["did you mean --checkpoint-dir?"]),
        # flags of the other model kind are refused, each named, not silently ignored
        (["--model", "mlp", "--recompute", "--layers", "5", "--seq", "9999"],
         ["--layers, --seq, --recompute: GPT-2 flags, not used by --model mlp"]),
        (["--model", "cnn", "--warmup-steps", "3"], ["--warmup-steps: GPT-2 flags, not used by --model cnn"]),
        (["--model", "gpt2", "--momentum", "0.5", "--lr-schedule", "cosine", "--widths", "784-10"],
         ["--widths, --momentum, --lr-schedule: not used by --model gpt2"]),
        (["--model", "gpt2", "--augment"], ["--augment: not used by --model gpt2"]),
        # sampling flags without a sample; --sample-only without weights
        (["--model", "gpt2", "--prompt", "Once"], ["--prompt shapes the text --sample N generates"]),
        (["--model", "gpt2", "--sample-only"], ["--sample-only samples from trained weights: add --init-from"]),
        # micro-steps given twice (MNIST)
        (["--model", "mlp", "--global-batch", "48", "--accum", "2"],
         ["--accum and --global-batch 48: the samples per step set the micro-steps"]),
        # --sample-only has no optimizer, so no training state to save
        (["--model", "gpt2", "--sample-only", "--init-from", "m.bin", "--save", "s.ckpt"],
         ["--sample-only trains nothing, so --save would save no training state"]),
        (["--model", "gpt2", "--sample-only", "--init-from", "m.bin", "--checkpoint-dir", "d"],
         ["--sample-only trains nothing, so --checkpoint-dir would save no training state"]),
        (["--model", "gpt2", "--sample", "5", "--temperature", "-1"], ["--temperature: expected a number in [0, 100]"]),
        # micro-steps given twice
        (["--model", "gpt2", "--total-batch-tokens", "1024", "--accum", "2"],
         ["--accum 2 and --total-batch-tokens 1024", "give one of the two"]),
        (["--batch", "abc"], ["--batch: expected a positive integer, got 'abc'"]),
        (["--batch", "0"], ["--batch: expected a positive integer, got '0'"]),
        (["--epochs", "3x"], ["--epochs: expected a positive integer, got '3x'"]),
        (["--device", "gpu"], ["--device: expected cpu, cuda or auto, got 'gpu'"]),
        (["--model", "rnn"], ["--model: expected mlp, cnn or gpt2, got 'rnn'"]),
        (["--lr", "-1"], ["--lr: expected a number in [1e-12, 1000], got '-1'"]),
        (["--momentum", "1.5"], ["--momentum: expected a number in [0, 1), got '1.5'"]),
        (["--widths", "784-abc-10"], ["--widths", "784-abc-10"]),
        (["--lr-schedule", "step"], ["--lr-schedule: expected constant or cosine, got 'step'"]),
        (["--batch"], ["missing value for option '--batch'"]),
        (["--seed", " -1"], ["--seed: expected a non-negative integer, got ' -1'"]),
        (["extra"], ["unexpected argument 'extra'"]),
        (["--grad-dtype", "fp8"], ["--grad-dtype: expected fp32, bf16 or fp16, got 'fp8'"]),
        (["--workers", "-1"], ["--workers: expected a non-negative integer, got '-1'"]),
        (["--loss-scale-init", "0"], ["--loss-scale-init: expected a number in (0, 3.402823466e+38], got '0'"]),
        (["--inject-inf", "1-3", "--grad-dtype", "fp16"], ["--inject-inf: expected RANK:STEP"]),
        (["--inject-inf", "1:3"], ["--inject-inf tests the fp16 loss scaler: add --grad-dtype fp16 or --precision fp16"]),
        (["--model", "gpt2", "--zero", "2", "--zero-accum", "later"],
         ["--zero-accum: expected local or reduce, got 'later'"]),
        (["--zero-accum", "reduce"], ["--zero-accum: GPT-2 flags, not used by --model mlp: add --model gpt2"]),
        (["--model", "gpt2", "--peak-tflops", "-3"],
         ["--peak-tflops: expected a number in (0, 1000000], got '-3'", "e.g. --peak-tflops 989.4"]),
        (["--model", "gpt2", "--peak-tflops", "abc"],
         ["--peak-tflops: expected a number in (0, 1000000], got 'abc'", "leave it out"]),
        (["--peak-tflops", "100"], ["--peak-tflops: GPT-2 flags, not used by --model mlp: add --model gpt2"]),
        (["--model", "gpt2", "--zero", "1", "--zero-accum", "reduce"],
         ["--zero-accum chooses how --zero 2 accumulates micro-steps: add --zero 2"]),
    ]
    for args, words in cases + absurd_values():
        expect(chk, "ddp-train " + " ".join(args), [train] + args, 2, words)
    out = expect(chk, "ddp-train --bogus", [train, "--bogus"], 2, [])
    chk.check(len(out.splitlines()) <= 3, "an unknown option gets a short usage, not the whole list", out)
    rc, out = trainlib.run([train, "--model", "gpt2", "--init-from", "/nonexistent/m.bin", "--layers", "6"],
                           timeout=60)
    chk.check(rc != 0 and "--layers is ignored: with --init-from /nonexistent/m.bin the model's sizes are "
              "the file's" in out, "size flags beside --init-from: the file's sizes win, and it is said", out)
    rc, out = trainlib.run([train, "--model", "gpt2", "--lr", "0.1", "--data", "/nonexistent/x_*.bin"],
                           timeout=60)
    chk.check(rc != 0 and "--lr 0.1 with --model gpt2 is an SGD-sized rate" in out,
              "an MNIST-sized --lr with the GPT is warned about", out)
    rc, out = trainlib.run([train, "--help"], timeout=60)
    chk.check(rc == 0 and "--max-steps" in out, "ddp-train --help exits 0 with the usage", out)


def corrupt(folder, name, data):
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def bad_data(chk, train, tmp):
    good = os.path.join(tmp, "good")
    trainlib.write_dataset(good, 40, 10)
    missing = os.path.join(tmp, "missing")
    expect(chk, "missing data folder", [train, "--data", missing], None,
           [missing + ": no such folder", "fetch-mnist.sh"])
    expect(chk, "a file as the data folder", [train, "--data", "/dev/zero"], None,
           ["/dev/zero: exists but is not a folder"])
    cases = {
        "wrong magic": ("train-images-idx3-ubyte", lambda b: struct.pack(">I", 0x1F8B0800) + b[4:],
                        ["train-images-idx3-ubyte", "bad magic"]),
        "truncated images": ("train-images-idx3-ubyte", lambda b: b[:1000],
                             ["train-images-idx3-ubyte: truncated", "40 images of 28x28", "fetch-mnist.sh"]),
        "mismatched counts": ("t10k-labels-idx1-ubyte", lambda b: struct.pack(">II", 0x801, 9) + b[8:17],
                              ["10 images", "9 labels"]),
        "label out of range": ("train-labels-idx1-ubyte", lambda b: b[:-1] + bytes([12]),
                               ["label 12", "0..9"]),
    }
    # A FIFO (a named pipe with no writer) where a data file belongs: opening it must not wait.
    fifo = os.path.join(tmp, "fifo")
    shutil.copytree(good, fifo)
    os.remove(os.path.join(fifo, "train-images-idx3-ubyte"))
    os.mkfifo(os.path.join(fifo, "train-images-idx3-ubyte"))
    expect(chk, "a FIFO as the images file", [train, "--data", fifo], None,
           ["train-images-idx3-ubyte: not a regular file"])
    metrics = os.path.join(tmp, "metrics.fifo")
    os.mkfifo(metrics)
    expect(chk, "--metrics to a FIFO nobody reads", [train, "--data", good, "--metrics", metrics], 1,
           ["--metrics " + metrics + ": cannot create the file: No such device or address"])
    expect(chk, "batch larger than the data set", [train, "--data", good, "--batch", "100000"], 1,
           ["--batch 100000 x --accum 1 is more than the 40 training samples", "from 1 to 40"])
    for what, (name, change, words) in cases.items():
        folder = os.path.join(tmp, what.replace(" ", "_"))
        shutil.copytree(good, folder)
        with open(os.path.join(good, name), "rb") as f:
            corrupt(folder, name, change(f.read()))
        expect(chk, what, [train, "--data", folder], None, words)


def usage_once(chk, train, mpi):
    """A usage error under mpirun -np 3 is printed once (by rank 0), not once per rank."""
    out = expect(chk, "mpirun -np 3 ddp-train --max_steps 1", mpi + ["3", train, "--max_steps", "1"], None,
                 ["did you mean --max-steps?"])
    chk.check(out.count("unknown option") == 1, "mpirun -np 3: the unknown option is named once", out)


def under_mpirun(chk, train, mpi, tmp):
    missing = os.path.join(tmp, "missing")
    out = expect(chk, "mpirun -np 2, missing data folder", mpi + ["2", train, "--data", missing], None,
                 ["no such folder"])
    lines = [l for l in out.splitlines() if "no such folder" in l]
    chk.check(len(lines) >= 2, f"both ranks report the missing folder ({len(lines)} lines)", out)
    # A configuration every rank refuses alike is agreed on: both ranks exit 1, no MPI_Abort.
    data = os.path.join(tmp, "good")
    out = expect(chk, "mpirun -np 2, unusable --bucket-mb",
                 mpi + ["2", train, "--data", data, "--device", "cpu", "--batch", "4", "--bucket-mb", "1e-9"],
                 1, ["bucket_mb = 1e-09 MiB is not a usable bucket cap"])
    chk.check("MPI_ABORT" not in out, "an agreed configuration error does not abort the job", out)
    # A batch larger than a rank's share of the data: refused where the data is loaded, on every
    # rank alike, with the largest batch x accum that fits.
    out = expect(chk, "mpirun -np 2, batch x accum larger than each rank's 20 samples",
                 mpi + ["2", train, "--data", data, "--device", "cpu", "--batch", "15", "--accum", "2"], 1,
                 ["--batch 15 x --accum 2 is more than the 20 training samples each of the 2 rank(s)",
                  "allowed is --batch x --accum from 1 to 20"])
    lines = [l for l in out.splitlines() if "allowed is --batch x --accum" in l]
    chk.check(len(lines) == 2 and "MPI_ABORT" not in out, "both ranks refuse the batch, no abort", out)
    # Node-local copies that differ (here: rank 1 reads another folder, MPMD) would give the ranks
    # different step plans, and their collectives would hang: every rank must refuse instead.
    other = os.path.join(tmp, "other")
    trainlib.write_dataset(other, 300, 50)
    flags = ["--device", "cpu", "--batch", "4", "--epochs", "1"]
    out = expect(chk, "mpirun, ranks with different data",
                 mpi + ["1", train, "--data", data] + flags + [":", "-np", "1", train, "--data", other] + flags,
                 1, ["give every rank the same data", "300 train / 50 test samples here"])
    chk.check("MPI_ABORT" not in out, "different data is agreed on, not aborted", out)


def truncated_gz(chk, train, mpi, tmp):
    """train-images-idx3-ubyte.gz cut in half, the plain file absent: both ranks fail, naming it."""
    folder = os.path.join(tmp, "truncated_gz")
    shutil.copytree(os.path.join(tmp, "good"), folder)
    images = os.path.join(folder, "train-images-idx3-ubyte")
    with open(images, "rb") as f:
        packed = gzip.compress(f.read())
    os.remove(images)
    corrupt(folder, "train-images-idx3-ubyte.gz", packed[:len(packed) // 2])
    out = expect(chk, "mpirun -np 2, truncated .gz", mpi + ["2", train, "--data", folder, "--device", "cpu"], 1,
                 [images + ".gz: truncated gzip stream", "gunzip -t"])
    lines = [l for l in out.splitlines() if "truncated gzip stream" in l]
    chk.check(len(lines) == 2 and "MPI_ABORT" not in out, f"both ranks report the truncated .gz ({len(lines)} "
              "lines), no abort", out)


def ckpt_cli(chk, ckpt, tmp):
    bogus = os.path.join(tmp, "bogus.ckpt")
    corrupt(tmp, "bogus.ckpt", b"not a checkpoint at all" * 10)
    expect(chk, "ddp-ckpt show on a corrupt file", [ckpt, "show", bogus], 2, ["bogus.ckpt"])
    expect(chk, "ddp-ckpt diff with a missing file", [ckpt, "diff", bogus, os.path.join(tmp, "none")], 2,
           ["cannot load"])
    fifo = os.path.join(tmp, "ckpt.fifo")
    os.mkfifo(fifo)
    expect(chk, "ddp-ckpt show on a FIFO", [ckpt, "show", fifo], 2,
           ["ckpt.fifo is a FIFO (named pipe), not a regular file", "put the regular file back"])
    expect(chk, "ddp-ckpt without a command", [ckpt], 2, ["usage:"])
    expect(chk, "ddp-ckpt diff with one file", [ckpt, "diff", bogus], 2, ["two checkpoint files"])
    expect(chk, "ddp-ckpt diff --tol abc", [ckpt, "diff", "--tol", "abc", bogus, bogus], 2, ["--tol"])


def diverged_metrics(chk, train, tmp):
    data = os.path.join(tmp, "diverge")
    trainlib.write_dataset(data, 100, 20)
    metrics = os.path.join(tmp, "diverge.jsonl")
    rc, out = trainlib.run([train, "--data", data, "--epochs", "1", "--batch", "10", "--lr", "1000",
                            "--device", "cpu"], timeout=120)
    chk.check(rc == 1 and "the loss became NaN or inf" in out, f"diverging run stops with exit 1 (status {rc})", out)
    rc, out = trainlib.run([train, "--data", data, "--epochs", "1", "--batch", "10", "--lr", "1000",
                            "--device", "cpu", "--metrics", metrics, "--nan-policy", "skip"], timeout=120)
    chk.check(rc == 0, f"diverging run with --nan-policy skip exits 0 (status {rc})", out)
    lines = open(metrics).read().splitlines() if os.path.exists(metrics) else []

    def reject(constant):  # json.loads alone accepts NaN and Infinity, which JSON does not have
        raise ValueError(f"{constant} is not JSON")

    def strict(line):
        try:
            return json.loads(line, parse_constant=reject)
        except ValueError:
            return None
    parsed = [strict(l) for l in lines]
    loss_lines = [p for p in parsed if p is not None and "data_step" not in p
                  and "straggler" not in p]  # epoch, summary
    chk.check(len(loss_lines) == 2 and None not in parsed, "diverged metrics lines are valid JSON",
              "\n".join(lines))
    chk.check(all(p.get("train_loss", 0) is None for p in loss_lines),
              "a NaN train_loss is written as null", "\n".join(lines))


def write_ckpt(path, values):
    """A one-parameter checkpoint ("w", shape [len(values)]) in the format of runtime/checkpoint.c."""
    n = len(values)
    head = b"DDPCKPT1" + struct.pack("<IIQ", 1, 1, n)
    record = b"w".ljust(48, b"\0") + struct.pack("<Iqqqq", 1, n, 0, 0, 0)
    body = head + record + struct.pack(f"<{n}f", *values)
    with open(path, "wb") as f:
        f.write(body + struct.pack("<I", zlib.crc32(body)))


def ckpt_nan(chk, ckpt, tmp):
    paths = {}
    for name, values in {"num": [1.0, 2.0, 3.0], "nan": [1.0, float("nan"), 3.0],
                         "inf": [1.0, 2.0, float("inf")]}.items():
        paths[name] = os.path.join(tmp, name + ".ckpt")
        write_ckpt(paths[name], values)
    for a, b in [("num", "nan"), ("nan", "num"), ("num", "inf")]:
        expect(chk, f"ddp-ckpt diff --tol 0.5 {a} {b}", [ckpt, "diff", "--tol", "0.5", paths[a], paths[b]],
               1, ["max_rel_diff=inf"])
    expect(chk, "ddp-ckpt diff --tol 0 nan nan", [ckpt, "diff", "--tol", "0", paths["nan"], paths["nan"]],
           0, ["max_rel_diff=0"])


def main():
    train, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-bad-input-") as tmp:
        bad_flags(chk, train)
        bad_data(chk, train, tmp)
        under_mpirun(chk, train, mpi, tmp)
        usage_once(chk, train, mpi)
        truncated_gz(chk, train, mpi, tmp)
        ckpt_cli(chk, ckpt, tmp)
        ckpt_nan(chk, ckpt, tmp)
        diverged_metrics(chk, train, tmp)
    chk.done()


if __name__ == "__main__":
    main()
