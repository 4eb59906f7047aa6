#!/usr/bin/python3
"""cuda_train.py - ddp-train on the GPU (skipped, exit 77, where there is none).

parity  MLP or CNN, 3 epochs on a synthetic set: the loss of every epoch on --device cuda equals
        the one on --device cpu within LOSS_RTOL, and two cuda runs give bit-identical parameters
        (ddp-ckpt diff --tol 0: max_abs_diff=0). LOSS_RTOL = 2e-3 (plus LOSS_ATOL): cuBLAS and OpenBLAS sum in
        different orders (and cuBLAS uses FMA), a few ulp per product that SGD with momentum carries
        along; on an H100 (MNIST, 125 steps) the gap was 1.2e-4 (MLP) and 2.4e-5 (CNN).
ddp     2 ranks on 2 GPUs equal 1 GPU accumulating 2 micro-batches (ddp-ckpt diff --tol 1e-5, as
        tests/train/equivalence.py on the CPU); skipped where the host has fewer than 2 GPUs.

Usage: cuda_train.py parity|ddp DDP_TRAIN DDP_CKPT MODEL MPIRUN MPIRUN_ARGS... (the last is -np)
"""
import json
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

LOSS_RTOL = 2e-3
LOSS_ATOL = 1e-5  # the metrics file has 6 decimals: a fitted CNN's loss can read 0.000000
NO_GPU = ("has no usable GPU", "built without CUDA", "NCCL needs one GPU per rank")


def train(tmp, name, args, prefix=()):
    """Runs ddp-train; returns (exit code, output, checkpoint path, epoch metrics)."""
    ckpt, metrics = os.path.join(tmp, name + ".ckpt"), os.path.join(tmp, name + ".jsonl")
    rc, out = trainlib.run(list(prefix) + args + ["--save", ckpt, "--metrics", metrics], timeout=600)
    epochs = []
    if rc == 0 and os.path.exists(metrics):
        epochs = [e for e in map(json.loads, open(metrics)) if not e.get("summary")]
    return rc, out, ckpt, epochs


def skip_if_no_gpu(rc, out):
    for reason in NO_GPU:
        if rc != 0 and reason in out:
            line = next(l for l in out.splitlines() if reason in l)
            print(line.strip())
            print(f"skipped: {reason}")
            sys.exit(77)


def diff(ckpt, a, b, tol):
    rc, out = trainlib.run([ckpt, "diff", "--tol", tol, a, b], timeout=60)
    print(out.strip())
    m = re.search(r"max_abs_diff=(\S+)", out)
    return rc, (float(m.group(1)) if m else None), out


def parity(chk, tmp, exe, ckpt, base):
    rc, out, gpu_a, gpu_ep = train(tmp, "cuda-a", base + ["--device", "cuda"])
    skip_if_no_gpu(rc, out)
    chk.check(rc == 0 and len(gpu_ep) == 3, f"cuda run: exit {rc}, {len(gpu_ep)} epochs", out)
    rc, out, cpu_c, cpu_ep = train(tmp, "cpu", base + ["--device", "cpu"])
    chk.check(rc == 0 and len(cpu_ep) == 3, f"cpu run: exit {rc}", out)
    for g, c in zip(gpu_ep, cpu_ep):
        gl, cl = g["train_loss"], c["train_loss"]
        gap = abs(gl - cl)
        chk.check(gap <= LOSS_ATOL + LOSS_RTOL * abs(cl), f"epoch {g['epoch']}: loss cuda {gl:.6f} "
                  f"cpu {cl:.6f} (|difference| {gap:.2e} <= {LOSS_ATOL} + {LOSS_RTOL} * cpu)")
    chk.check(cpu_ep and cpu_ep[-1]["train_loss"] < 0.5 * cpu_ep[0]["train_loss"],
              "the loss falls (the comparison is not between two idle runs)")
    rc, out, gpu_b, _ = train(tmp, "cuda-b", base + ["--device", "cuda"])
    chk.check(rc == 0, "second cuda run", out)
    rc, mad, out = diff(ckpt, gpu_a, gpu_b, "0")
    chk.check(rc == 0 and mad == 0.0, f"two cuda runs: identical parameters (max_abs_diff={mad})", out)
    rc, mad, out = diff(ckpt, gpu_a, cpu_c, "1")
    chk.check(rc == 0 and mad is not None and mad > 0, f"cuda vs cpu parameters differ only by "
              f"rounding (max_abs_diff={mad}, informative)", out)


def ddp(chk, tmp, exe, ckpt, base, mpi):
    rc, out, two, _ = train(tmp, "np2", base + ["--device", "cuda"], prefix=mpi + ["2"])
    skip_if_no_gpu(rc, out)
    chk.check(rc == 0, f"2 ranks on 2 GPUs: exit {rc}", out)
    rc, out, one, _ = train(tmp, "accum2", base + ["--device", "cuda", "--accum", "2"])
    chk.check(rc == 0, f"1 GPU --accum 2: exit {rc}", out)
    rc, mad, out = diff(ckpt, two, one, "1e-5")
    chk.check(rc == 0, f"2 GPUs equal 1 GPU accumulating 2 micro-batches (max_abs_diff={mad})", out)


def main():
    mode, exe, ckpt, model, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-cuda-train-") as tmp:
        probe = os.path.join(tmp, "probe")  # a tiny set: skip at once where the GPUs are missing
        trainlib.write_dataset(probe, 20, 10)
        rc, out = trainlib.run((mpi + ["2"] if mode == "ddp" else []) + [
            exe, "--data", probe, "--device", "cuda", "--epochs", "1", "--batch", "2"], timeout=120)
        skip_if_no_gpu(rc, out)
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 960, 100)
        base = [exe, "--model", model, "--data", data, "--batch", "32", "--lr", "0.05",
                "--momentum", "0.9", "--seed", "7", "--log-every", "10"]
        if mode == "parity":
            parity(chk, tmp, exe, ckpt, base + ["--epochs", "3"])
        else:
            ddp(chk, tmp, exe, ckpt, base + ["--epochs", "1", "--max-steps", "8"], mpi)
    sys.exit(1 if chk.failures else 0)


if __name__ == "__main__":
    main()
