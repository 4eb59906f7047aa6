#!/usr/bin/python3
"""elastic.py - what a lost rank costs under ddp-launch --max-restarts on this machine: one of N
ranks SIGKILLed mid-run, the time from the kill to each phase of the next generation and the steps
redone, for three ways of carrying the run over: checkpoints on disk every K steps alone (today's
path without elastic: what a requeue resumes from), checkpoints in node-local memory (/dev/shm)
every step, written in the background (--checkpoint-async), and the survivors' rescue snapshot of
their last step (ddp-launch's default, the disk checkpoints as the fallback).

Phases (wall clock from the kill, read from the job's output lines as they arrive):
  save     the survivors' "rescue copy of step N written" line (rescue snapshots only)
  detect   the launcher's line that the killed generation ended (mpirun stopped every rank)
  start    the next generation's line (a new mpirun)
  resumed  ddp-train's "resumed from ... at step S" (MPI init, the checkpoint read and loaded)
  step     the first step line after it (--log-every 1): training goes on
Steps redone: the last step the killed generation printed, minus S.

Usage: benchmarks/elastic.py [--build build-release] [--ranks 4] [--model mlp|gpt2]
         [--every 50] [--rounds 3]
Prints a table per configuration (median of the rounds); the model and data as in the tests
(MNIST MLP on data/mnist; the tiny GPT on data/text/austen_train_*.bin).
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def train_cmd(args, ckdir, extra):
    exe = os.path.join(args.build, "train", "ddp-train")
    if args.model == "mlp":
        cmd = [exe, "--model", "mlp", "--data", "data/mnist", "--batch", "32", "--epochs", "50",
               "--max-steps", str(args.steps)]
    else:
        cmd = [exe, "--model", "gpt2", "--layers", "2", "--heads", "2", "--channels", "64", "--seq", "64",
               "--batch", "4", "--data", "data/text/austen_train_*.bin", "--max-steps", str(args.steps),
               "--val-max-batches", "1"]
    return cmd + ["--device", "cpu", "--log-every", "1", "--checkpoint-dir", ckdir] + extra


def one_round(args, ckdir, extra):
    launch = os.path.join(args.build, "launcher", "ddp-launch")
    cmd = [launch, "-n", str(args.ranks), "--max-restarts", "1"] + train_cmd(args, ckdir, extra)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    killed_at, last_step, marks = None, 0, {}
    for line in proc.stdout:
        now = time.monotonic()
        m = re.match(r"step (\d+)/", line)
        if m and killed_at is None:
            last_step = int(m.group(1))
            if last_step >= args.kill_at:
                pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
                for pid in pids:
                    try:
                        with open(f"/proc/{pid}/comm") as f:
                            comm = f.read().strip()
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            mine = ckdir.encode() in f.read()
                    except OSError:
                        continue
                    if comm == "ddp-train" and mine:
                        os.kill(pid, signal.SIGKILL)
                        killed_at = time.monotonic()
                        break
            continue
        if killed_at is None:
            continue
        if m and "resumed" in marks and "step" not in marks:
            marks["step"] = now - killed_at
        elif m and "resumed" not in marks:
            last_step = max(last_step, int(m.group(1)))
        if "generation 0 ended" in line or ("generation 1:" in line and "detect" not in marks):
            marks.setdefault("detect", now - killed_at)
        if "generation 1:" in line:
            marks["start"] = now - killed_at
        if "rescue copy of step" in line and "written" in line:
            marks.setdefault("save", now - killed_at)
        r = re.search(r"resumed from \S+ at step (\d+)", line)
        if r:
            marks["resumed"] = now - killed_at
            marks["redone"] = last_step - int(r.group(1))
    proc.wait()
    return proc.returncode, marks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-release")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--model", default="mlp", choices=["mlp", "gpt2"])
    ap.add_argument("--every", type=int, default=50, help="disk checkpoints every K steps")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kill-at", type=int, default=120, help="kill after this step's line")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    every = ["--checkpoint-every", str(args.every)]
    configs = [(f"disk, every {args.every} steps", None, every + ["--snapshot-dir", "off"]),
               ("/dev/shm, every step, async", "/dev/shm",
                ["--checkpoint-every", "1", "--checkpoint-async", "--keep", "2", "--snapshot-dir", "off"]),
               (f"rescue snapshot (disk every {args.every})", None, every)]
    print(f"elastic: {time.strftime('%Y-%m-%d')}, {args.model}, {args.ranks} ranks, one SIGKILLed after "
          f"step {args.kill_at} of {args.steps}; seconds from the kill (median of {args.rounds} rounds)")
    print("| carried over by | save | detect | next generation | resumed | first step (x disk) | steps redone (x disk) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = None  # the first configuration's medians: the ratios' denominators
    for name, root, extra in configs:
        got = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="ddp-elastic-bench-", dir=root) as ckdir:
                rc, marks = one_round(args, ckdir, extra)
            if rc != 0 or len({"detect", "start", "resumed", "step", "redone"} - set(marks)):
                print(f"round failed (exit {rc}, {marks})", file=sys.stderr)
                continue
            got.append(marks)
        if not got:
            continue
        med = {k: statistics.median(m[k] for m in got if k in m) for k in got[0]}
        save = f"{med['save']:.2f}" if "save" in med else "-"
        base = base or med
        print(f"| {name} | {save} | {med['detect']:.2f} | {med['start']:.2f} | {med['resumed']:.2f} | "
              f"{med['step']:.2f} ({med['step'] / base['step']:.2f}x) | {med['redone']:.0f} "
              f"({med['redone'] / max(base['redone'], 1):.2f}x) |")


if __name__ == "__main__":
    main()
