#!/usr/bin/python3
"""nvtx_ranges.py - ddp-train's NVTX ranges, as a tool attached to NVTX sees them.

NVTX loads the injection library nvtx_inject.c (NVTX_INJECTION64_PATH, the way Nsight Systems
attaches), which writes every range each rank pushes and pops. 2 ranks, MNIST MLP (synthetic data),
4 steps of 2 micro-batches, gradient buckets of 0.5 MiB (2 or more):
  - on every thread of every rank the pushes and pops balance and nest (no pop without a push,
    nothing left open at exit);
  - on the main thread: 4 "step" ranges (payloads 0..3), inside each "forward" and "backward" with
    the micro-batch as payload (0 and 1, in order) and one "optimizer" with the step as payload;
  - on the communication thread: in each step, one "allreduce" per bucket, payload the bucket
    (0..B-1, B >= 2, the same B on both ranks), not nested in anything there;
  - the same with --trace on as with it off (the ranges do not depend on tracing);
  - DDP_NVTX=0: NVTX never loads the tool (no log at all), the run succeeds;
  - DDP_NVTX=yes: refused on every rank, naming the variable and its values; so are
    DDP_NCCL_RAS=on and DDP_WATCH_GPU_LANE=off (the other switches of libddp's diagnostics,
    runtime/nccl_ras.c and runtime/comm_nccl.c).

Usage: nvtx_ranges.py DDP_TRAIN INJECTION_SO MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import glob
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

STEPS, ACCUM = 4, 2


def read_log(path):
    """(rank, [(kind, tid, name, payload)]) of one process's log."""
    rank, events = None, []
    for line in open(path).read().splitlines():
        f = line.split(" ")
        if f[0] == "init":
            rank = int(f[2]) if f[2] != "-" else None
        elif f[0] == "push":
            events.append(("push", int(f[1]), f[2], None if f[3] == "-" else int(f[3])))
        elif f[0] == "pop":
            events.append(("pop", int(f[1]), None, None))
    return rank, events


def ranges(events):
    """Closed ranges in push order: dicts name, payload, tid, parent (name or None), step (the
    main thread's open "step" payload when pushed); and the nesting errors."""
    stacks, out, errors, step = {}, [], [], None
    for kind, tid, name, payload in events:
        stack = stacks.setdefault(tid, [])
        if kind == "push":
            r = {"name": name, "payload": payload, "tid": tid, "step": step,
                 "parent": stack[-1]["name"] if stack else None}
            stack.append(r)
            out.append(r)
            if name == "step":
                step = payload
        elif not stack:
            errors.append(f"thread {tid}: a pop without an open range")
        elif stack.pop()["name"] == "step":
            step = None
    errors += [f"thread {t}: left open: {[r['name'] for r in s]}" for t, s in stacks.items() if s]
    return out, errors


def check_rank(chk, rank, events, what):
    """The checks of one rank's ranges; returns its number of buckets (or None)."""
    rs, errors = ranges(events)
    chk.check(not errors, f"{what} rank {rank}: ranges balance and nest on every thread",
              "\n".join(errors[:10]))
    steps = [r for r in rs if r["name"] == "step"]
    chk.check([r["payload"] for r in steps] == list(range(STEPS)),
              f"{what} rank {rank}: {STEPS} step ranges, payloads 0..{STEPS - 1}",
              str([r["payload"] for r in steps]))
    main = steps[0]["tid"] if steps else None
    buckets = None
    for s in range(STEPS):
        inner = [r for r in rs if r["step"] == s and r["tid"] == main and r["parent"] == "step"]
        for name in ("forward", "backward"):
            got = [r["payload"] for r in inner if r["name"] == name]
            chk.check(got == list(range(ACCUM)),
                      f"{what} rank {rank} step {s}: {name} per micro-batch (payloads {got})")
        opt = [r["payload"] for r in inner if r["name"] == "optimizer"]
        chk.check(opt == [s], f"{what} rank {rank} step {s}: one optimizer range, payload the "
                  f"step ({opt})")
        comm = [r for r in rs if r["step"] == s and r["name"] == "allreduce"]
        got = sorted(r["payload"] for r in comm)
        n = len(got)
        chk.check(n >= 2 and got == list(range(n)) and
                  all(r["tid"] != main and r["parent"] is None for r in comm),
                  f"{what} rank {rank} step {s}: one allreduce per bucket on the communication "
                  f"thread (payloads {got})")
        buckets = n if buckets in (None, n) else -1
    return buckets


def run_case(chk, cmd, inject, tmp, name, env_extra, expect_logs):
    out = os.path.join(tmp, name)
    os.makedirs(out)
    env = dict(os.environ, NVTX_INJECTION64_PATH=inject, NVTX_TEST_DIR=out, **env_extra)
    rc, text = trainlib.run(cmd, timeout=120, env=env)
    logs = sorted(glob.glob(os.path.join(out, "nvtx.*.log")))
    chk.check(rc == 0, f"{name}: ddp-train exits 0 (status {rc})", text)
    if not expect_logs:
        chk.check(not logs, f"{name}: NVTX never loaded the tool (no log: {len(logs)})")
        return None
    chk.check(len(logs) == 2, f"{name}: the tool was loaded by 2 processes ({len(logs)})")
    per_rank = dict(read_log(p) for p in logs)
    chk.check(sorted(per_rank) == [0, 1], f"{name}: one log per rank ({sorted(per_rank, key=str)})")
    buckets = {r: check_rank(chk, r, ev, name) for r, ev in per_rank.items()}
    chk.check(len(set(buckets.values())) == 1 and None not in buckets.values(),
              f"{name}: the same buckets on every rank ({buckets})")
    return buckets


def main():
    train, inject, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 480, 60)
        cmd = mpirun + ["2", train, "--model", "mlp", "--data", data, "--epochs", "1",
                        "--max-steps", str(STEPS), "--accum", str(ACCUM), "--batch", "8",
                        "--device", "cpu", "--bucket-mb", "0.5"]
        plain = run_case(chk, cmd, inject, tmp, "nvtx", {}, True)
        traced = run_case(chk, cmd + ["--trace", os.path.join(tmp, "trace.json")], inject, tmp,
                          "nvtx_traced", {}, True)
        chk.check(plain == traced, f"--trace changes no range ({plain} and {traced} buckets)")
        run_case(chk, cmd, inject, tmp, "nvtx_off", {"DDP_NVTX": "0"}, False)
        for var, value in (("DDP_NVTX", "yes"), ("DDP_NCCL_RAS", "on"),
                           ("DDP_WATCH_GPU_LANE", "off")):
            rc, text = trainlib.run(cmd, timeout=60, env=dict(os.environ, **{var: value}))
            chk.check(rc != 0 and f"{var}={value}: expected 0" in text and "Traceback" not in text,
                      f"{var}={value} is refused naming the variable (status {rc})", text)
    chk.done()


if __name__ == "__main__":
    main()
