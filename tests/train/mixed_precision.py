#!/usr/bin/python3
"""mixed_precision.py - ddp-train's 16-bit gradient all-reduce, loss scaler and data workers, under
real mpirun on a synthetic data set (trainlib). One mode per meson test:

  scaler  --grad-dtype fp16, rank 1 ALONE gets inf gradients at steps 3 and 5 (--inject-inf): every
          rank reports exactly those steps skipped, the scale halves twice (1024 -> 256) and grows
          back after 4 finite steps (512 at the end of 12 steps), and the replicas are identical
          after training. A skipped step changes nothing: 12 steps with step 11 skipped equal 11
          steps, bit for bit.
  bytes   --grad-dtype bf16 sends exactly half the bytes per step of fp32 (the communicator's
          payload counter), and still converges: in one epoch (30 steps, lr 0.02) the train loss
          falls from ln 10 = 2.30 to about 1.75 like fp32's (within 1.5x + 0.02), and test accuracy
          is >= 90% and within 3 points of fp32 (bf16 keeps 8 significant bits of each averaged
          gradient: a 2^-9 relative rounding that SGD averages out).
  workers --workers 0, 1 and 3 give bit-identical parameters after 50 steps with --augment
          (crossing an epoch boundary); another seed gives different ones (the comparison can fail).

Usage: mixed_precision.py MODE DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import filecmp
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402


CKPT = None  # ddp-ckpt, from the command line


def same_params(a, b):
    """Parameters bit-identical (ddp-ckpt diff): the files also hold the step,
    the loss scale and the schedule, which differ between runs of other lengths."""
    rc, out = trainlib.run([CKPT, "diff", a, b], timeout=60)
    m = re.search(r"max_abs_diff=(\S+)", out)
    print(out.strip())
    return rc == 0 and m is not None and float(m.group(1)) == 0.0


def train(chk, mpi, exe, data, name, args, tmp):
    path = os.path.join(tmp, name + ".ckpt")
    cmd = mpi + ["2", exe, "--data", data, "--device", "cpu", "--batch", "8", "--log-every", "1000",
                 "--save", path] + args
    rc, out = trainlib.run(cmd, timeout=240)
    chk.check(rc == 0 and os.path.exists(path), f"train {name}: exit status {rc}", out)
    return path, out


def check_scaler(chk, mpi, exe, data, tmp):
    fp16 = ["--epochs", "1", "--grad-dtype", "fp16", "--loss-scale-init", "1024",
            "--loss-scale-interval", "4"]
    _, out = train(chk, mpi, exe, data, "inject", fp16 + ["--max-steps", "12", "--inject-inf", "1:3",
                                                          "--inject-inf", "1:5"], tmp)
    for rank in (0, 1):
        want = f"[rank {rank} "
        lines = [l for l in out.splitlines() if l.startswith(want) and "step(s) skipped" in l]
        chk.check(len(lines) == 1 and "2 step(s) skipped for inf/NaN [3,5], final scale 512" in lines[0],
                  f"rank {rank} skipped exactly steps 3 and 5 and ends at scale 512", "\n".join(lines) or out)
    chk.check(out.count("scale 1024 -> 512") == 1 and out.count("scale 512 -> 256") == 1,
              "the scale halved at each skip", out)
    chk.check("replicas identical after training" in out, "replicas identical after the skips", out)
    last, _ = train(chk, mpi, exe, data, "skip-last", fp16 + ["--max-steps", "12", "--inject-inf", "0:11"], tmp)
    eleven, _ = train(chk, mpi, exe, data, "eleven", fp16 + ["--max-steps", "11"], tmp)
    chk.check(same_params(last, eleven), "a skipped step leaves the parameters untouched")
    twelve, _ = train(chk, mpi, exe, data, "twelve", fp16 + ["--max-steps", "12"], tmp)
    chk.check(not same_params(twelve, eleven), "negative control: a taken step changes them")


def accuracy(out):
    m = re.findall(r"test accuracy ([0-9.]+)%", out)
    return float(m[-1]) if m else -1.0


def train_loss(out):
    m = re.findall(r"train loss ([0-9.]+)", out)
    return float(m[-1]) if m else -1.0


def bytes_per_step(out):
    m = re.search(r"gradient all-reduce \((\w+) on the wire\): \d+ all-reduces, \d+ bytes, (\d+) bytes per step", out)
    return int(m.group(2)) if m else -1


def check_bytes(chk, mpi, exe, data, tmp):
    runs = {}
    for dtype in ("fp32", "bf16"):
        _, out = train(chk, mpi, exe, data, dtype, ["--epochs", "1", "--lr", "0.02", "--grad-dtype", dtype], tmp)
        runs[dtype] = (bytes_per_step(out), accuracy(out), train_loss(out))
        print(f"{dtype}: {runs[dtype][0]} bytes per step, accuracy {runs[dtype][1]}%, last epoch's "
              f"train loss {runs[dtype][2]}")
    (b32, a32, l32), (b16, a16, l16) = runs["fp32"], runs["bf16"]
    chk.check(b32 > 0 and 2 * b16 == b32, f"bf16 sends half the bytes per step: {b16} vs {b32}")
    chk.check(a16 >= 90.0 and abs(a16 - a32) <= 3.0, f"bf16 converges: {a16}% vs fp32 {a32}%")
    chk.check(0 <= l16 <= 1.5 * l32 + 0.02, f"bf16 train loss {l16} close to fp32's {l32}")


def check_workers(chk, mpi, exe, data, tmp):
    common = ["--epochs", "2", "--max-steps", "50", "--augment"]
    paths = {w: train(chk, mpi, exe, data, f"workers{w}", common + ["--workers", str(w)], tmp)[0]
             for w in (0, 1, 3)}
    for w in (1, 3):
        chk.check(filecmp.cmp(paths[0], paths[w], shallow=False),
                  f"--workers {w} gives the parameters of --workers 0, bit for bit")
    other, _ = train(chk, mpi, exe, data, "seed43", common + ["--workers", "3", "--seed", "43"], tmp)
    chk.check(not filecmp.cmp(paths[3], other, shallow=False), "negative control: another seed differs")


def main():
    global CKPT
    mode, exe, CKPT, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-mixed-") as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 480, 200)
        {"scaler": check_scaler, "bytes": check_bytes, "workers": check_workers}[mode](chk, mpi, exe, data, tmp)
    chk.done()


if __name__ == "__main__":
    main()
