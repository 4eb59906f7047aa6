"""trainlib.py - shared helpers of the ddp-train tests: a synthetic IDX data set and process running.

The synthetic set is deterministic and learnable: class c is a bright 2-D bump at a position that
depends on c, on a background of pseudo-random noise from a fixed linear congruential generator.
"""
import glob
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

SIDE = 28


def _lcg(state):
    """Next state of a 32-bit linear congruential generator (Numerical Recipes constants)."""
    return (1664525 * state + 1013904223) & 0xFFFFFFFF


def _image(label, sample, state):
    """One 28x28 image of class `label` as bytes; returns (bytes, new LCG state)."""
    cy = 6 + (label // 5) * 14 + (sample % 3) - 1
    cx = 4 + (label % 5) * 5 + (sample % 2)
    pixels = bytearray(SIDE * SIDE)
    for y in range(SIDE):
        for x in range(SIDE):
            state = _lcg(state)
            noise = (state >> 24) % 48
            bump = 220.0 * math.exp(-((y - cy) ** 2 + (x - cx) ** 2) / 8.0)
            pixels[y * SIDE + x] = min(255, int(bump) + noise)
    return bytes(pixels), state


def write_split(folder, split, n, seed):
    """Writes SPLIT-images-idx3-ubyte and SPLIT-labels-idx1-ubyte with n samples (labels i % 10)."""
    state = seed
    images = bytearray()
    labels = bytearray()
    for i in range(n):
        label = i % 10
        img, state = _image(label, i, state)
        images += img
        labels.append(label)
    with open(os.path.join(folder, f"{split}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, SIDE, SIDE) + images)
    with open(os.path.join(folder, f"{split}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + labels)


def write_dataset(folder, n_train, n_test):
    """A complete synthetic MNIST-format folder."""
    os.makedirs(folder, exist_ok=True)
    write_split(folder, "train", n_train, 12345)
    write_split(folder, "t10k", n_test, 777)


def four_step_run(exe, model, tmp):
    """Writes a small dataset under tmp and returns ddp-train's arguments for the 4-step runs that the
    16-bit comparisons share (batch 8, lr 0.05, momentum 0.9, on the CPU)."""
    data = os.path.join(tmp, "data")
    write_dataset(data, 480, 60)
    return [exe, "--model", model, "--data", data, "--epochs", "1", "--max-steps", "4", "--batch", "8",
            "--lr", "0.05", "--momentum", "0.9", "--device", "cpu", "--log-every", "1"]


def train_to_accuracy(chk, cmd, metrics, timeout, min_accuracy, epochs):
    """Runs a 2-rank training (cmd writes --metrics METRICS) and checks exit 0, one metrics line per
    epoch and a summary, world_size 2 and the test accuracy >= min_accuracy; returns the output."""
    start = time.monotonic()
    rc, out = run(cmd, timeout=timeout)
    took = time.monotonic() - start
    print(out)
    chk.check(rc == 0, f"training exits 0 (status {rc}) in {took:.1f} s")
    lines = open(metrics).read().splitlines() if os.path.exists(metrics) else []
    lines = [x for x in lines if '"data_step"' not in x and '"straggler"' not in x]  # per-step
    # data lines and the straggler table's windows aside
    chk.check(len(lines) == epochs + 1, f"metrics file has {epochs} epoch lines and a summary ({len(lines)} lines)")
    if lines:
        summary = json.loads(lines[-1])
        acc = summary.get("test_accuracy", 0.0)
        print(f"summary: {lines[-1]}")
        chk.check(summary.get("world_size") == 2, "summary says world_size 2")
        chk.check(acc >= min_accuracy, f"test accuracy {acc:.4f} >= {min_accuracy}")
    return out


IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")


def require_idx(data, what, fix):
    """Exits 1 (FAILED, never skipped) naming the missing files when data lacks one of the four IDX
    files, plain or .gz; fix says how to get them."""
    absent = [f for f in IDX_FILES
              if not any(os.path.isfile(os.path.join(data, f + ext)) for ext in ("", ".gz"))]
    if absent:
        print(f"FAILED: {what} is missing from {data} ({', '.join(absent)}); {fix} and test again")
        sys.exit(1)


def run(cmd, timeout, env=None):
    """Runs cmd; returns (exit code, stdout + stderr). A timeout is a failure reported as code -999."""
    print("$ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           env=env, encoding="utf-8", errors="replace", stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:  # a sample's text may end inside a UTF-8 sequence
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -999, out + f"\n(timed out after {timeout} s)"
    return p.returncode, p.stdout


def skip_without_nvidia_device():
    """Exit 77 at once where the NVIDIA driver has no device node (/dev/nvidia0, ...): no GPU can
    run here, so a multi-process GPU test need not start mpirun to learn it. Where there are
    nodes, the test's own first run decides (it may still find no usable GPU)."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        print("skipped: no NVIDIA device node (/dev/nvidia0, ...): no GPU here")
        sys.exit(77)


def tagged(var, tag):
    """{pid: environ (bytes keys and values)} of the live (not zombie) processes whose environment
    holds VAR=TAG: how the fault tests find a job's mpirun and ranks to kill or watch."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().split(b") ")[-1][:1] == b"Z":
                    continue  # ended; its parent has not reaped it yet
        except (OSError, ValueError):
            continue
        if env.get(var.encode()) == tag.encode():
            found[int(pid)] = env
    return found


def nesting_errors(events):
    """Chrome trace events (ddp-train --trace): B/E must form a stack per (pid, tid), names
    matching; ts must not decrease per thread. Returns the problems found."""
    stacks, last_ts, errors = {}, {}, []
    for e in events:
        if e["ph"] not in "BEi":
            continue
        key = (e["pid"], e["tid"])
        if e["ts"] < last_ts.get(key, -1e300):
            errors.append(f"time goes back on {key} at {e['name']} ts={e['ts']}")
        last_ts[key] = e["ts"]
        stack = stacks.setdefault(key, [])
        if e["ph"] == "B":
            stack.append(e["name"])
        elif e["ph"] == "E" and (not stack or stack.pop() != e["name"]):
            errors.append(f"{key}: end of {e['name']} does not close the innermost open span")
    errors += [f"{k}: spans left open: {s}" for k, s in stacks.items() if s]
    return errors


class Checker:
    """Counts failed checks; exit status 1 when any failed."""

    def __init__(self):
        self.failures = 0

    def check(self, cond, what, detail=""):
        print(("ok     " if cond else "FAILED ") + what, flush=True)
        if not cond:
            self.failures += 1
            if detail:
                print("       " + detail.strip().replace("\n", "\n       ")[-3000:], flush=True)
        return cond

    def done(self):
        if self.failures:
            print(f"{self.failures} check(s) failed")
        sys.exit(1 if self.failures else 0)


def train_save(chk, tmp, name, args, prefix=()):
    """Runs prefix + args + --save TMP/NAME.ckpt; checks the exit status; returns the checkpoint."""
    path = os.path.join(tmp, name + ".ckpt")
    rc, out = run(list(prefix) + args + ["--save", path], timeout=300)
    chk.check(rc == 0 and os.path.exists(path), f"train {name}: exit status {rc}", out)
    return path


def data_fps(ckpt_path):
    """The per-step data fingerprints that --metrics wrote beside a train_save checkpoint (the run
    passed --metrics CKPT.jsonl): {step: (data_fp, samples)}."""
    with open(ckpt_path[:-len(".ckpt")] + ".jsonl") as f:
        lines = [json.loads(x) for x in f if '"data_step"' in x]
    return {x["data_step"]: (x["data_fp"], x["samples"]) for x in lines}


def diff_ckpt(chk, ckpt, a, b, want_same, what, tol):
    """ddp-ckpt diff --tol TOL A B: want_same, the parameters agree to tol; otherwise they differ by
    more than 10 x tol (a negative control that shows the comparison can fail)."""
    rc, out = run([ckpt, "diff", "--tol", tol, a, b], timeout=60)
    print(out.strip())
    m = re.search(r"max_rel_diff=(\S+)", out)
    if want_same:
        chk.check(rc == 0 and m is not None, f"{what}: same to --tol {tol}", out)
    else:
        chk.check(rc == 1 and m is not None and float(m.group(1)) > float(tol) * 10,
                  f"{what}: differs beyond 10x --tol {tol} (negative control)", out)
