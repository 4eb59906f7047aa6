#!/usr/bin/python3
"""straggler.py - the straggler table of ddp-train (on by default; runtime/ddp_straggler.h).

quiet: 4 ranks, CNN, 200 steps, nothing perturbed: no rank is named, the run's summary says so,
  --metrics holds a window line every 5 steps with each rank's figures, and --prometheus the last
  judgement's (no rank named).
noisy: 2 ranks, CNN; once training runs, rank 1 is stopped and continued in a loop, 30 ms of every
  100 ms (a noisy neighbour): the table must name rank 1 and its node within 20 steps of the first
  stop, never name rank 0, and --metrics must list rank 1 as named.
Both run the CNN (a step computes more than it communicates, as a real model's does) with
OMPI_MCA_mpi_yield_when_idle=1: 4 ranks share 2 cores here (docs/reliability.md, the measurements).
cuda: one process on a GPU (exit 77 without one): the windows' figures come from CUDA events
  (compute > 0 in every window once events were read), DDP_STRAGGLER_CLOCK=host times the CPU's
  clocks, and another value stops the run naming the variable.

Usage: straggler.py quiet|noisy|cuda DDP_TRAIN MPIRUN MPIRUN_ARGS... (the argument after the last is
the rank count). Every process this script starts is continued and killed by PID when it fails.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")  # more ranks than cores (see above)
SANITIZED = bool(os.environ.get("DDP_TEST_SANITIZED"))
QUIET_STEPS = 100 if SANITIZED else 200  # the sanitizers' build computes 2-3x slower
NOISY_STEPS = 120
EVERY = 5           # --straggler-every's default, the metrics' window
WITHIN = 20         # steps from the first stop by which rank 1 must be named
STOP_S, PERIOD_S = 0.030, 0.100
FIRST_STOP_STEP = 20  # the noisy neighbour begins after this many steps (past the first ones)


def train_cmd(argv, ranks, data, metrics, steps, extra=()):
    exe, mpirun = argv[0], argv[1:]
    return mpirun + [str(ranks), exe, "--model", "cnn", "--data", data, "--epochs", "1000",
                     "--max-steps", str(steps), "--batch", "128", "--device", "cpu", "--threads", "1",
                     "--log-every", "1000", "--metrics", metrics] + list(extra)


def windows(metrics):
    """The straggler lines of --metrics, in order."""
    with open(metrics) as f:
        return [json.loads(x)["straggler"] for x in f if '"straggler"' in x]


def last_step(metrics):
    """The newest data_step in --metrics (0 before the first); the file grows while we read."""
    try:
        with open(metrics) as f:
            steps = [json.loads(x)["data_step"] for x in f if '"data_step"' in x and x.endswith("}\n")]
    except OSError:
        return 0
    return max(steps, default=0)


def quiet(chk, argv, tmp, data):
    metrics, prom = os.path.join(tmp, "quiet.jsonl"), os.path.join(tmp, "quiet.prom")
    rc, out = trainlib.run(train_cmd(argv, 4, data, metrics, QUIET_STEPS, ["--prometheus", prom]),
                           timeout=300)
    print(out[-3000:])
    chk.check(rc == 0, f"4 unperturbed ranks train {QUIET_STEPS} steps (exit {rc})")
    chk.check("straggler table at step" not in out, "no table line: no rank named", out)
    summary = [x for x in out.splitlines() if x.startswith("straggler table: ")]
    chk.check(len(summary) == 1 and f"{QUIET_STEPS} steps in {QUIET_STEPS // EVERY} windows of {EVERY}; "
              "0 rank(s) ever named" in summary[0], "the run's summary: no rank ever named", out)
    w = windows(metrics) if os.path.exists(metrics) else []
    chk.check(len(w) == QUIET_STEPS // EVERY and [x["step"] for x in w] ==
              list(range(EVERY, QUIET_STEPS + 1, EVERY)), f"--metrics: a window line every {EVERY} steps "
              f"({len(w)} lines)")
    good = all(len(x["compute_ms"]) == len(x["wait_ms"]) == len(x["cpu_cores"]) == 4 and x["named"] == []
               and all(c > 0 for c in x["compute_ms"]) and all(c >= 0 for c in x["wait_ms"]) for x in w)
    chk.check(bool(w) and good, "each window: 4 ranks' compute (> 0), wait and CPU figures, none named",
              json.dumps(w[:2]))
    gauges = dict(re.findall(r"^ddp_(straggler_\w+)\{[^}]*\} (\S+)$", open(prom).read(), re.M)
                  if os.path.exists(prom) else [])
    chk.check(gauges.get("straggler_named_ranks") == "0" and
              0 < float(gauges.get("straggler_max_compute_ratio", 0)) < 1.5 and
              float(gauges.get("straggler_median_compute_seconds", 0)) > 0,
              f"--prometheus: the last judgement's figures, no rank named ({gauges})")


def find_rank(tag, rank, exe, limit):
    """The PID of rank `rank` of the job tagged `tag` (its ddp-train process), or None."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        for pid, env in trainlib.tagged("DDP_STRAGGLER_TEST", tag).items():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    prog = f.read().split(b"\0")[0]
            except OSError:
                continue
            if env.get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode() and prog.endswith(exe.encode()):
                return pid
        time.sleep(0.2)
    return None


class Neighbour(threading.Thread):
    """Stops and continues a process, STOP_S of every PERIOD_S, once the run passed FIRST_STOP_STEP;
    `first` is the step --metrics had reached at the first stop."""

    def __init__(self, pid, metrics):
        super().__init__(daemon=True)
        self.pid, self.metrics, self.first = pid, metrics, None
        self.done = threading.Event()

    def run(self):
        try:
            while not self.done.is_set() and last_step(self.metrics) < FIRST_STOP_STEP:
                time.sleep(0.02)
            self.first = last_step(self.metrics)
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(STOP_S)
                os.kill(self.pid, signal.SIGCONT)
                time.sleep(PERIOD_S - STOP_S)
        except ProcessLookupError:
            pass  # the job ended
        finally:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def noisy(chk, argv, tmp, data):
    metrics = os.path.join(tmp, "noisy.jsonl")
    tag = f"{os.getpid()}-noisy"
    job = subprocess.Popen(train_cmd(argv, 2, data, metrics, NOISY_STEPS), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                           env=dict(os.environ, DDP_STRAGGLER_TEST=tag))
    pid = find_rank(tag, 1, argv[0], 60)
    neighbour = Neighbour(pid, metrics) if pid else None
    if neighbour:
        neighbour.start()
    try:
        out, _ = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
    finally:
        if neighbour:
            neighbour.done.set()
            neighbour.join()
        for left in trainlib.tagged("DDP_STRAGGLER_TEST", tag):  # ranks a killed mpirun left behind
            try:
                os.kill(left, signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(out[-4000:])
    first = neighbour.first if neighbour else None
    chk.check(pid is not None and first is not None, f"rank 1 (pid {pid}) stopped 30 ms of every 100 ms "
              f"from step {first}")
    chk.check(job.returncode == 0, f"the job trains {NOISY_STEPS} steps (exit {job.returncode})")
    if first is None:
        return
    w = windows(metrics) if os.path.exists(metrics) else []
    named = [x["step"] for x in w if 1 in x["named"]]
    chk.check(bool(named) and first < named[0] <= first + WITHIN, f"--metrics names rank 1 within {WITHIN} "
              f"steps of the first stop (at step {named[0] if named else None}, first stop at {first})")
    chk.check(not any(0 in x["named"] for x in w), "rank 0 is never named")
    lines = out.splitlines()
    at = next((i for i, x in enumerate(lines) if x.startswith("straggler table at step")), None)
    host = os.uname().nodename
    table = lines[at:at + 2] if at is not None else []
    chk.check(len(table) == 2 and f"at step {named[0] if named else -1}:" in table[0] and
              table[1].startswith(f"  rank 1 (node {host[:63]}): compute "),
              "the table line names rank 1 and its node at that step", "\n".join(table or lines[-20:]))
    summary = [x for x in lines if x.startswith("straggler table: ")]
    chk.check(len(summary) == 1 and "1 rank(s) ever named" in summary[0] and "slowest rank 1" in summary[0],
              "the run's summary names rank 1 the slowest", "\n".join(summary))


def cuda(chk, argv, tmp, data):
    """One process on the GPU: the device's clocks, the host's on request, a bad clock refused."""
    for clock in ("device", "host", "gpu"):
        metrics = os.path.join(tmp, f"cuda-{clock}.jsonl")
        rc, out = trainlib.run([argv[0], "--model", "mlp", "--data", data, "--epochs", "100",
                                "--max-steps", "40", "--batch", "64", "--device", "cuda", "--metrics",
                                metrics], timeout=300, env=dict(os.environ, DDP_STRAGGLER_CLOCK=clock))
        if rc != 0 and ("has no usable GPU" in out or "built without CUDA" in out):
            print("skipped: no usable GPU here")
            sys.exit(77)
        if clock == "gpu":
            chk.check(rc != 0 and "DDP_STRAGGLER_CLOCK=gpu: expected host" in out,
                      "DDP_STRAGGLER_CLOCK=gpu stops the run, naming the variable", out[-2000:])
            continue
        w = windows(metrics) if rc == 0 else []
        chk.check(rc == 0 and len(w) == 8 and all(x["steps"] == 5 for x in w),
                  f"{clock} clocks: 40 steps, a window every 5 ({len(w)})", out[-2000:])
        chk.check(bool(w) and all(x["compute_ms"][0] > 0 and x["wait_ms"][0] >= 0 for x in w[1:]),
                  f"{clock} clocks: every window after the first has compute > 0 and wait >= 0",
                  json.dumps(w))
        chk.check("straggler table: 40 steps in 8 windows of 5" in out, f"{clock} clocks: the summary", out)


def main():
    modes = {"quiet": quiet, "noisy": noisy, "cuda": cuda}
    if len(sys.argv) < 4 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    if sys.argv[1] == "cuda":
        trainlib.skip_without_nvidia_device()
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 5120, 200)
        modes[sys.argv[1]](chk, sys.argv[2:], tmp, data)
    chk.done()


if __name__ == "__main__":
    main()
