#!/usr/bin/python3
"""cuda_train.py - ddp-train on the GPU (skipped, exit 77, where there is none).

parity  MLP or CNN, 3 epochs on a synthetic set: the loss of every epoch on --device cuda equals
        the one on --device cpu within LOSS_RTOL, both with cuDNN's algorithms chosen by measurement
        (the default) and by its heuristics (DDP_CUDNN_BENCHMARK=0); two heuristic cuda runs give
        bit-identical parameters (ddp-ckpt diff --tol 0: max_abs_diff=0; measured choices may differ
        between runs, as with PyTorch's cudnn.benchmark). LOSS_RTOL = 2e-3 (plus LOSS_ATOL): cuBLAS,
        cuDNN and OpenBLAS/oneDNN sum in different orders (and use FMA), a few ulp per product that
        SGD with momentum carries along; on an H100 (MNIST, 125 steps, before cuDNN) the gap was
        1.2e-4 (MLP) and 2.4e-5 (CNN).
precision  --precision bf16 and fp16, 3 epochs: the loss of every epoch on cuda equals the CPU's
        in the same precision within PREC_RTOL[precision] and the loss falls. bf16 keeps 8
        significant bits (2^-8 per rounding, the same rounding on both backends but from sums in
        another order, so a value may land one ulp away) and those differences grow through SGD:
        PREC_RTOL bf16 = 5e-2; fp16 (11 bits, emulated on both) 1e-2. bf16 is skipped on a GPU older
        than compute capability 8.0 (the message says so); a CPU without AVX512_BF16 emulates it.
ddp     2 ranks on 2 GPUs equal 1 GPU accumulating 2 micro-batches (ddp-ckpt diff --tol 1e-5, as
        tests/train/equivalence.py on the CPU); skipped where the host has fewer than 2 GPUs. cuDNN's
        algorithms by heuristics (DDP_CUDNN_BENCHMARK=0), so every rank and run convolves alike.
trace   --trace on the GPU, 1 rank, 4 steps, 3 buckets (as tests/scaling/trace_check.py on the CPU):
        the NCCL all-reduces' spans (host functions on the communication stream) nest on their own
        thread row, every bucket's span appears once per step, and each begins after the reducer
        queued that bucket in the same step.

Usage: cuda_train.py parity|precision|ddp|trace DDP_TRAIN DDP_CKPT MODEL MPIRUN MPIRUN_ARGS... (the last is -np)
"""
import json
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

LOSS_RTOL = 2e-3
PREC_RTOL = {"bf16": 5e-2, "fp16": 1e-2}
HEURISTIC = dict(os.environ, DDP_CUDNN_BENCHMARK="0")  # cuDNN's algorithms by heuristics: reruns match
LOSS_ATOL = 1e-5  # the metrics file has 6 decimals: a fitted CNN's loss can read 0.000000
TRACE_STEPS, TRACE_BUCKETS = 4, 3  # 784-64-64-10 with a 0.01 MiB first bucket and 0.02 MiB cap
NO_GPU = ("has no usable GPU", "built without CUDA", "NCCL needs one GPU per rank")


def train(tmp, name, args, prefix=(), env=None):
    """Runs ddp-train; returns (exit code, output, checkpoint path, epoch metrics)."""
    ckpt, metrics = os.path.join(tmp, name + ".ckpt"), os.path.join(tmp, name + ".jsonl")
    rc, out = trainlib.run(list(prefix) + args + ["--save", ckpt, "--metrics", metrics], timeout=600,
                           env=env)
    epochs = []
    if rc == 0 and os.path.exists(metrics):
        epochs = [e for e in map(json.loads, open(metrics)) if "epoch" in e]  # not the per-step
        # data lines, the straggler table's windows or the summary
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


def same_losses(chk, what, gpu_ep, cpu_ep, rtol):
    chk.check(len(gpu_ep) == len(cpu_ep) == 3, f"{what}: 3 epochs on each backend")
    for g, c in zip(gpu_ep, cpu_ep):
        gl, cl = g["train_loss"], c["train_loss"]
        gap = abs(gl - cl)
        chk.check(gap <= LOSS_ATOL + rtol * abs(cl), f"{what} epoch {g['epoch']}: loss cuda {gl:.6f} "
                  f"cpu {cl:.6f} (|difference| {gap:.2e} <= {LOSS_ATOL} + {rtol} * cpu)")
    chk.check(cpu_ep and cpu_ep[-1]["train_loss"] < 0.5 * cpu_ep[0]["train_loss"],
              f"{what}: the loss falls (the comparison is not between two idle runs)")


def parity(chk, tmp, exe, ckpt, base):
    rc, out, gpu_a, gpu_ep = train(tmp, "cuda-a", base + ["--device", "cuda"], env=HEURISTIC)
    skip_if_no_gpu(rc, out)
    chk.check(rc == 0, f"cuda run: exit {rc}", out)
    rc, out, cpu_c, cpu_ep = train(tmp, "cpu", base + ["--device", "cpu"])
    chk.check(rc == 0, f"cpu run: exit {rc}", out)
    same_losses(chk, "heuristic cuDNN", gpu_ep, cpu_ep, LOSS_RTOL)
    rc, out, _, bench_ep = train(tmp, "cuda-bench", base + ["--device", "cuda"])
    chk.check(rc == 0, f"cuda run, algorithms measured: exit {rc}", out)
    same_losses(chk, "measured cuDNN", bench_ep, cpu_ep, LOSS_RTOL)
    rc, out, gpu_b, _ = train(tmp, "cuda-b", base + ["--device", "cuda"], env=HEURISTIC)
    chk.check(rc == 0, "second cuda run", out)
    rc, mad, out = diff(ckpt, gpu_a, gpu_b, "0")
    chk.check(rc == 0 and mad == 0.0, f"two cuda runs: identical parameters (max_abs_diff={mad})", out)
    rc, mad, out = diff(ckpt, gpu_a, cpu_c, "1")
    chk.check(rc == 0 and mad is not None and mad > 0, f"cuda vs cpu parameters differ only by "
              f"rounding (max_abs_diff={mad}, informative)", out)


def precision(chk, tmp, exe, ckpt, base):
    for prec in ("fp16", "bf16"):
        args = base + ["--precision", prec]
        rc, out, _, gpu_ep = train(tmp, "cuda-" + prec, args + ["--device", "cuda"])
        skip_if_no_gpu(rc, out)
        if rc != 0 and prec == "bf16" and "--precision bf16 on the cuda backend" in out:
            print(f"bf16 skipped on this GPU: {out.strip().splitlines()[-1]}")
            continue
        chk.check(rc == 0, f"cuda {prec} run: exit {rc}", out)
        rc, out, _, cpu_ep = train(tmp, "cpu-" + prec, args + ["--device", "cpu"])
        chk.check(rc == 0, f"cpu {prec} run: exit {rc}", out)
        same_losses(chk, prec, gpu_ep, cpu_ep, PREC_RTOL[prec])


def ddp(chk, tmp, exe, ckpt, base, mpi):
    rc, out, two, _ = train(tmp, "np2", base + ["--device", "cuda"], prefix=mpi + ["2"], env=HEURISTIC)
    skip_if_no_gpu(rc, out)
    chk.check(rc == 0, f"2 ranks on 2 GPUs: exit {rc}", out)
    rc, out, one, _ = train(tmp, "accum2", base + ["--device", "cuda", "--accum", "2"], env=HEURISTIC)
    chk.check(rc == 0, f"1 GPU --accum 2: exit {rc}", out)
    rc, mad, out = diff(ckpt, two, one, "1e-5")
    chk.check(rc == 0, f"2 GPUs equal 1 GPU accumulating 2 micro-batches (max_abs_diff={mad})", out)


def trace(chk, tmp, base):
    path = os.path.join(tmp, "t.json")
    args = base + ["--device", "cuda", "--widths", "784-64-64-10", "--first-bucket-mb", "0.01",
                   "--bucket-mb", "0.02", "--trace", path]
    rc, out, _, _ = train(tmp, "trace", args)
    if not chk.check(rc == 0 and os.path.exists(path), "cuda --trace runs and writes the file", out):
        return
    events = [e for e in json.load(open(path))["traceEvents"] if e["pid"] == 0 and e["ph"] in "BEi"]
    bad = trainlib.nesting_errors(events)
    chk.check(not bad, "spans nest per thread and time goes forward", "\n".join(bad[:5]))
    queued = [(e["ts"], e["args"]["arg"]) for e in events if e["name"] == "allreduce.queued"]
    began = [(e["ts"], e["args"]["arg"], e["tid"]) for e in events if e["name"] == "allreduce" and e["ph"] == "B"]
    want = [b for _ in range(TRACE_STEPS) for b in range(TRACE_BUCKETS)]
    chk.check([a for _, a in queued] == want, f"every bucket queued once per step ({TRACE_STEPS} steps)",
              str(queued))
    chk.check([a for _, a, _ in began] == want and all(t != 0 for _, _, t in began),
              "every bucket's NCCL all-reduce span once per step, off the main thread", str(began))
    chk.check(len(began) == len(queued) and all(b[0] >= q[0] for b, q in zip(began, queued)),
              "each all-reduce begins after its bucket was queued", f"queued {queued} began {began}")


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
        elif mode == "precision":
            precision(chk, tmp, exe, ckpt, base + ["--epochs", "3"])
        elif mode == "trace":
            trace(chk, tmp, base + ["--epochs", "1", "--max-steps", str(TRACE_STEPS)])
        else:
            ddp(chk, tmp, exe, ckpt, base + ["--epochs", "1", "--max-steps", "8"], mpi)
    sys.exit(1 if chk.failures else 0)


if __name__ == "__main__":
    main()
