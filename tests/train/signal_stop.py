#!/usr/bin/python3
"""signal_stop.py - SIGUSR1 (Slurm's --signal) sent to ONE rank stops EVERY rank after the same step:
the job exits 0, the summary says stopped_by_signal, and --save wrote a valid checkpoint.

Usage: signal_stop.py DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402


def rank_pids(parent, program):
    """PIDs of this test's `program` processes (DDP_SIGNAL_TEST=parent in their environment), keyed
    by their OMPI_COMM_WORLD_RANK."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().split(b"\0")[0].endswith(program.encode()):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        rank = env.get(b"OMPI_COMM_WORLD_RANK")
        if rank is not None and env.get(b"DDP_SIGNAL_TEST") == parent.encode():
            found[int(rank)] = int(pid)
    return found


def wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def main():
    train, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-signal-") as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 2000, 200)
        metrics, saved = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "final.ckpt")
        cmd = mpi + ["2", train, "--model", "mlp", "--data", data, "--epochs", "100000",
                     "--metrics", metrics, "--save", saved]
        print("$ " + " ".join(cmd), flush=True)
        tag = f"{os.getpid()}"
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL, env=dict(os.environ, DDP_SIGNAL_TEST=tag))
        started = wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0, 60)
        chk.check(started, "training ran its first epoch")
        pids = rank_pids(tag, os.path.basename(train))
        chk.check(sorted(pids) == [0, 1], f"found both ranks' processes ({pids})")
        if 1 in pids:
            os.kill(pids[1], signal.SIGUSR1)  # only rank 1: rank 0 must learn it from rank 1
        try:
            out, _ = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            out, _ = job.communicate()
            chk.check(False, "the job stopped within 60 s of the signal", out)
        print(out)
        chk.check(job.returncode == 0, f"job exits 0 (status {job.returncode})")
        chk.check("SIGUSR1 received: every rank stops after step" in out, "rank 0 reports the stop")
        lines = open(metrics).read().splitlines()
        summary = json.loads(lines[-1]) if lines else {}
        chk.check(summary.get("stopped_by_signal") is True, "summary says stopped_by_signal")
        chk.check(0 < summary.get("epochs", 0) < 100000, f"stopped early ({summary.get('epochs')} epochs)")
        rc, show = trainlib.run([ckpt, "show", saved], timeout=30)
        chk.check(rc == 0 and "fc1.weight" in show, "--save wrote a valid checkpoint", show)
    chk.done()


if __name__ == "__main__":
    main()
