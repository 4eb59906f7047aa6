#!/usr/bin/python3
"""bad_input.py - ddp-train and ddp-ckpt on bad command lines and bad data: each run exits non-zero
within seconds with a message naming the problem; under mpirun both ranks exit, none hangs.

Usage: bad_input.py DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import shutil
import struct
import sys
import tempfile
import time

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


def bad_flags(chk, train):
    cases = [
        (["--bogus"], ["unknown option '--bogus'", "usage:"]),
        (["--batch", "abc"], ["--batch: expected a positive integer, got 'abc'"]),
        (["--batch", "0"], ["--batch: expected a positive integer, got '0'"]),
        (["--epochs", "3x"], ["--epochs: expected a positive integer, got '3x'"]),
        (["--device", "gpu"], ["--device: expected cpu, cuda or auto, got 'gpu'"]),
        (["--model", "rnn"], ["--model: expected mlp or cnn, got 'rnn'"]),
        (["--lr", "-1"], ["--lr: expected a positive number, got '-1'"]),
        (["--momentum", "1.5"], ["--momentum: expected a number in [0, 1), got '1.5'"]),
        (["--widths", "784-abc-10"], ["--widths", "784-abc-10"]),
        (["--lr-schedule", "step"], ["--lr-schedule: expected constant or cosine, got 'step'"]),
        (["--batch"], ["missing value for option '--batch'"]),
        (["extra"], ["unexpected argument 'extra'"]),
    ]
    for args, words in cases:
        expect(chk, "ddp-train " + " ".join(args), [train] + args, 2, words)
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
    for what, (name, change, words) in cases.items():
        folder = os.path.join(tmp, what.replace(" ", "_"))
        shutil.copytree(good, folder)
        with open(os.path.join(good, name), "rb") as f:
            corrupt(folder, name, change(f.read()))
        expect(chk, what, [train, "--data", folder], None, words)


def under_mpirun(chk, train, mpi, tmp):
    missing = os.path.join(tmp, "missing")
    out = expect(chk, "mpirun -np 2, missing data folder", mpi + ["2", train, "--data", missing], None,
                 ["no such folder"])
    lines = [l for l in out.splitlines() if "no such folder" in l]
    chk.check(len(lines) >= 2, f"both ranks report the missing folder ({len(lines)} lines)", out)


def ckpt_cli(chk, ckpt, tmp):
    bogus = os.path.join(tmp, "bogus.ckpt")
    corrupt(tmp, "bogus.ckpt", b"not a checkpoint at all" * 10)
    expect(chk, "ddp-ckpt show on a corrupt file", [ckpt, "show", bogus], 2, ["bogus.ckpt"])
    expect(chk, "ddp-ckpt diff with a missing file", [ckpt, "diff", bogus, os.path.join(tmp, "none")], 2,
           ["cannot load"])
    expect(chk, "ddp-ckpt without a command", [ckpt], 2, ["usage:"])
    expect(chk, "ddp-ckpt diff with one file", [ckpt, "diff", bogus], 2, ["two checkpoint files"])
    expect(chk, "ddp-ckpt diff --tol abc", [ckpt, "diff", "--tol", "abc", bogus, bogus], 2, ["--tol"])


def main():
    train, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-bad-input-") as tmp:
        bad_flags(chk, train)
        bad_data(chk, train, tmp)
        under_mpirun(chk, train, mpi, tmp)
        ckpt_cli(chk, ckpt, tmp)
    chk.done()


if __name__ == "__main__":
    main()
