#!/usr/bin/env python3
"""trace_check.py - test of ddp-train --trace: 3 ranks under mpirun, 3 gradient buckets, 2 micro-steps
per optimizer step. The file must be JSON in the Chrome trace-event format with the ddp-trace
magic and version; one process row (pid) per rank, named; on every rank, spans nest per thread (a
stack of B/E with matching names) with timestamps that never go back; every optimizer step holds
each bucket's "allreduce.queued" instant exactly once and each bucket's "allreduce" span (the
communicator's thread) exactly once, inside the step; the step's data/forward/backward/optimizer
spans and the "reducer.wait" span lie inside it. The summary prints the exposed communication and
the metrics carry it. With overlap the first bucket is queued during the backward pass; with
--no-overlap every bucket after it. The CNN's layers are traced too. A trace path in a missing folder
fails before training with a message naming it.

Usage: trace_check.py DDP_TRAIN MPIRUN MPIRUN_ARGS... (the argument after the last is the rank count)
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import trainlib  # noqa: E402

# More ranks than cores: ranks must yield the core while they wait (see the cluster notes).
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")

RANKS = 3
STEPS = 4
ACCUM = 2
# 784-64-64-10: parameters W0 (50176) b0 W1 (4096) b1 W2 (640) b2; first cap 0.01 MiB = 2621
# floats holds b2, W2, b1; cap 0.02 MiB = 5242 floats holds W1, b0; W0 gets a bucket alone.
N_BUCKETS = 3
STEP_CHILDREN = ("data", "forward", "backward", "reducer.wait", "optimizer", "allreduce.queued")


def spans(events, pid, tid, name):
    """(begin ts, end ts, arg) of every span `name` on (pid, tid), in order."""
    out, open_ = [], None
    for e in events:
        if e["pid"] == pid and e["tid"] == tid and e["name"] == name:
            if e["ph"] == "B":
                open_ = e["ts"]
            elif e["ph"] == "E":
                out.append((open_, e["ts"], e["args"]["arg"]))
    return out


def check_step(c, events, pid, step, index):
    """The events of one optimizer step on rank pid."""
    t0, t1, _ = step
    inside = [e for e in events if e["pid"] == pid and t0 <= e["ts"] <= t1 and e["ph"] in "BEi"]
    queued = sorted(e["args"]["arg"] for e in inside if e["name"] == "allreduce.queued")
    ok = c.check(queued == list(range(N_BUCKETS)),
                 f"rank {pid} step {index}: every bucket queued once", f"got {queued}")
    comm = [e for e in inside if e["name"] == "allreduce" and e["tid"] != 0]
    began = sorted(e["args"]["arg"] for e in comm if e["ph"] == "B")
    ended = sorted(e["args"]["arg"] for e in comm if e["ph"] == "E")
    ok &= c.check(began == ended == list(range(N_BUCKETS)),
                  f"rank {pid} step {index}: every bucket's all-reduce ran once, inside the step",
                  f"began {began} ended {ended}")
    names = {e["name"] for e in inside if e["tid"] == 0}
    ok &= c.check(all(n in names for n in STEP_CHILDREN),
                  f"rank {pid} step {index}: data, forward, backward, wait, optimizer inside",
                  f"names {sorted(names)}")
    micro = [e for e in inside if e["name"] == "backward" and e["ph"] == "B"]
    return ok & c.check(len(micro) == ACCUM, f"rank {pid} step {index}: {ACCUM} backward passes")


def queued_during_backward(events, pid):
    """For each step of rank pid: are some buckets queued before its last backward pass ends?"""
    out = []
    for t0, t1, _ in spans(events, pid, 0, "step"):
        ends = [b for _, b, _ in spans(events, pid, 0, "backward") if t0 <= b <= t1]
        queued = [e["ts"] for e in events if e["pid"] == pid and e["name"] == "allreduce.queued"
                  and t0 <= e["ts"] <= t1]
        out.append(min(queued) < max(ends))
    return out


def check_file(c, path):
    with open(path) as f:
        doc = json.load(f)
    events = doc.get("traceEvents", [])
    other = doc.get("otherData", {})
    c.check(other.get("format") == "ddp-trace" and other.get("version") == 1, "magic and version")
    c.check(other.get("world_size") == RANKS and other.get("dropped") == 0, "world size, nothing dropped")
    c.check(all({"name", "ph", "ts", "pid", "tid"} <= e.keys() for e in events)
            and all(e["ph"] in "BEiM" for e in events), "every event has the trace-event fields")
    rows = {e["pid"] for e in events if e["name"] == "process_name"}
    c.check(rows == set(range(RANKS)) and {e["pid"] for e in events} == rows, "one named row per rank")
    errors = trainlib.nesting_errors(events)
    c.check(not errors, "spans nest per thread and time goes forward", "\n".join(errors[:5]))
    for pid in range(RANKS):
        steps = spans(events, pid, 0, "step")
        if c.check(len(steps) == STEPS, f"rank {pid}: {STEPS} steps", f"got {len(steps)}"):
            for i, s in enumerate(steps):
                check_step(c, events, pid, s, i)


def main():
    exe, mpirun = sys.argv[1], sys.argv[2:]
    c = trainlib.Checker()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 480, 30)
        trace, metrics = os.path.join(tmp, "t.json"), os.path.join(tmp, "m.jsonl")
        args = ["--device", "cpu", "--widths", "784-64-64-10", "--data", data, "--epochs", "1",
                "--max-steps", str(STEPS), "--batch", "8", "--accum", str(ACCUM),
                "--first-bucket-mb", "0.01", "--bucket-mb", "0.02", "--metrics", metrics]
        rc, out = trainlib.run(mpirun + [str(RANKS), exe] + args + ["--trace", trace], 180)
        if c.check(rc == 0 and os.path.exists(trace), "ddp-train --trace runs and writes the file", out):
            check_file(c, trace)
            c.check("communication (trace, mean over ranks)" in out, "summary prints exposed communication", out)
            with open(metrics) as f:
                last = json.loads(f.read().splitlines()[-1])
            c.check(isinstance(last.get("exposed_comm_ms"), float), "metrics carry exposed_comm_ms", str(last))
            with open(trace) as f:
                during = queued_during_backward(json.load(f)["traceEvents"], 0)
            c.check(all(during), "overlap: the first bucket is queued during the backward pass", str(during))
        rc, out = trainlib.run(mpirun + ["2", exe] + args + ["--trace", trace, "--no-overlap"], 180)
        if c.check(rc == 0, "ddp-train --no-overlap --trace runs", out):
            with open(trace) as f:
                during = queued_during_backward(json.load(f)["traceEvents"], 0)
            c.check(not any(during), "--no-overlap: every bucket is queued after the backward pass", str(during))
        cnn = ["--device", "cpu", "--model", "cnn", "--data", data, "--epochs", "1", "--max-steps", "2",
               "--batch", "8", "--trace", trace]
        rc, out = trainlib.run(mpirun + ["2", exe] + cnn, 180)
        if c.check(rc == 0, "ddp-train --model cnn --trace runs", out):
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
            errors = trainlib.nesting_errors(events)
            c.check(not errors, "cnn: spans nest per thread", "\n".join(errors[:5]))
            for t0, t1, _ in spans(events, 0, 0, "step"):
                layers = sorted(a for b, e, a in spans(events, 0, 0, "backward.layer") if t0 <= b <= t1)
                c.check(layers == [0, 1, 2], "cnn: every layer's backward inside the step", str(layers))
        bad = os.path.join(tmp, "missing", "t.json")
        rc, out = trainlib.run(mpirun + ["2", exe] + args + ["--trace", bad], 180)
        c.check(rc != 0 and "missing/t.json" in out and "cannot write into the folder" in out and
                "epoch 1:" not in out, "a trace file in a missing folder fails before training, naming it", out)
    c.done()


if __name__ == "__main__":
    main()
