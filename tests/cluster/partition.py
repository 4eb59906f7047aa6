#!/usr/bin/python3
"""partition.py - a partitioned node: in the middle of training under plain `srun --mpi=pmix -N2`
(one rank per node, DDP_TIMEOUT=--timeout), the link of rank 1's node goes down while its processes
stay alive. Every process of the job (both ranks and srun) must be gone within DDP_TIMEOUT + 10 s of
the cut, the exit status must be non-zero, rank 0 must name rank 1 as unreachable and rank 1 must say
that it reached no other rank. Prints when each process ended. Two ways to cut (--how, both by
default): outside, `ip link set ddpvN down` on the bridge's end of the node's veth (the node's eth0
loses its carrier: packets vanish); inside, `ip link set eth0 down` in the node's namespace (its
routes go: connecting fails at once with "network unreachable").
Needs a running local cluster (slurm/cluster.sh, whose names ddpvN, ddp-nodeN and 10.200.0.1 are
used here; tests/cluster/run.sh partition) and root. Whatever happens, the link is brought back up
and every process of the job still there is killed by PID. The ranks write their output to files
through srun --output (srun cannot forward the cut-off rank's lines).

Usage: partition.py --train DDP_TRAIN --launch DDP_LAUNCH --data DIR --work DIR [--timeout S]
                    [--how outside,inside]
"""
import argparse
import os
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import trainlib  # noqa: E402  (tests/train: finding a job's processes)

START_LIMIT = 120.0  # seconds for the job to start and finish its first epoch
SLACK = 10.0         # the goal: every process gone within DDP_TIMEOUT + 10 s
QUEUE_LIMIT = 120.0  # seconds for Slurm to see the job end once the link is back
GATEWAY = "10.200.0.1"  # slurm/cluster.sh's bridge: the nodes' default route


def link_commands(how, node):
    """The commands that cut node N's link and restore it."""
    n = node[len("node"):]
    if how == "outside":
        return [["ip", "link", "set", f"ddpv{n}", "down"]], [["ip", "link", "set", f"ddpv{n}", "up"]]
    ns = f"ddp-node{n}"
    return ([["ip", "-n", ns, "link", "set", "eth0", "down"]],
            [["ip", "-n", ns, "link", "set", "eth0", "up"],
             ["ip", "-n", ns, "route", "replace", "default", "via", GATEWAY]])


def tagged(tag):
    """{pid: environ} of the live processes whose environment holds DDP_HANG_TEST=tag."""
    return trainlib.tagged("DDP_HANG_TEST", tag)


def ranks_of(tag):
    """{rank: (pid, node name)} of the job's ddp-train processes."""
    out = {}
    for pid, env in tagged(tag).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                prog = f.read().split(b"\0")[0]
        except OSError:
            continue
        rank = env.get(b"SLURM_PROCID", b"")
        if prog.endswith(b"ddp-train") and rank.isdigit():
            out[int(rank)] = (pid, env.get(b"SLURMD_NODENAME", b"?").decode())
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ")[-1][:1] != b"Z"
    except OSError:
        return False


class Drain:
    """Reads srun's output as it comes (an undrained pipe would block the job)."""

    def __init__(self, stream):
        self.parts = []
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.thread.start()

    def _run(self, stream):
        for line in iter(stream.readline, ""):
            self.parts.append(line)

    def text(self):
        self.thread.join(5.0)
        return "".join(self.parts)


def kill_left(tag, job):
    """Kills by PID what is left of the job: its tagged processes and srun's process group."""
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if job.poll() is None:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except OSError:
            pass
        job.wait()


def wait_started(tag, job, metrics):
    """{rank: (pid, node)} once both ranks run on two nodes and the first epoch is done, else None."""
    deadline = time.monotonic() + START_LIMIT
    while time.monotonic() < deadline and job.poll() is None:
        ranks = ranks_of(tag)
        if len(ranks) == 2 and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            return ranks
        time.sleep(0.1)
    return None


def watch(procs, job, limit):
    """Polls until every process has ended or limit + 5 s passed; {name: seconds after the cut}."""
    t0, ended = time.monotonic(), {}
    while len(ended) < len(procs) and time.monotonic() - t0 < limit + 5:
        for name, pid in procs.items():
            gone = job.poll() is not None if pid == job.pid else not alive(pid)
            if name not in ended and gone:
                ended[name] = time.monotonic() - t0
        time.sleep(0.05)
    return ended


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def check_messages(out_of, errors):
    """Rank 0 names rank 1 as unreachable; rank 1 says it reached no other rank."""
    wants = [(0, ("rank 1 (host node", "no connection"), "rank 0 names rank 1 as unreachable"),
             (1, ("no other rank could be reached",), "rank 1 says it is cut off")]
    for rank, parts, what in wants:
        lines = [line for line in out_of(rank).splitlines() if all(p in line for p in parts)]
        print(f"  {what}: " + (lines[0].strip()[:300] if lines else "NO"), flush=True)
        if not lines:
            errors.append(f"{what}: no line with {' ... '.join(parts)}")


def wait_queue_empty(limit):
    """After the link is back, Slurm gets the job's end from the node: True once the queue is empty."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        p = subprocess.run(["squeue", "-h"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if p.returncode == 0 and not p.stdout.strip():
            print(f"  Slurm's queue empty {time.monotonic() - t0:.1f} s after the link came back", flush=True)
            return True
        time.sleep(0.5)
    return False


def report(procs, ended, limit, errors):
    for name in procs:
        t = ended.get(name)
        print(f"  {name}: " + (f"gone {t:.1f} s after the cut" if t is not None else
                               f"still running {limit + 5:.0f} s after the cut"), flush=True)
        if t is None or t > limit:
            errors.append(f"{name} outlived DDP_TIMEOUT + {SLACK:.0f} s = {limit:.0f} s")


def trial(a, how):
    """One partition; returns a list of failure messages (empty: passed)."""
    tag = f"partition-{os.getpid()}-{how}"
    metrics, out_pattern = os.path.join(a.work, f"{tag}.jsonl"), os.path.join(a.work, f"{tag}-%t.out")
    env = dict(os.environ, DDP_HANG_TEST=tag, DDP_TIMEOUT=str(a.timeout), CUDA_VISIBLE_DEVICES="")
    cmd = ["srun", "--mpi=pmix", "-N2", "--ntasks-per-node=1", f"--output={out_pattern}", a.launch, a.train,
           "--model", "mlp", "--data", a.data, "--epochs", "100000", "--batch", "32", "--log-every", "100000",
           "--device", "cpu", "--metrics", metrics]
    print(f"  cut {how}: $ DDP_TIMEOUT={a.timeout:g} {' '.join(cmd)}", flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           stdin=subprocess.DEVNULL, start_new_session=True)
    drain, restore, errors = Drain(job.stdout), [], []
    try:
        ranks = wait_started(tag, job, metrics)
        if not ranks or ranks[0][1] == ranks[1][1]:
            return [f"the job did not start training on two nodes ({ranks})\n" + drain.text()]
        cut, restore = link_commands(how, ranks[1][1])
        procs = {f"rank 0 ({ranks[0][1]}, pid {ranks[0][0]})": ranks[0][0],
                 f"rank 1 ({ranks[1][1]}, pid {ranks[1][0]}, cut off)": ranks[1][0], "srun": job.pid}
        for c in cut:
            subprocess.run(c, check=True)
        print(f"  training; cut {ranks[1][1]}'s link ({' '.join(cut[0])}) with its processes alive", flush=True)
        limit = a.timeout + SLACK
        report(procs, watch(procs, job, limit), limit, errors)
    finally:
        for c in restore:
            subprocess.run(c)
        kill_left(tag, job)
    if not wait_queue_empty(QUEUE_LIMIT):
        errors.append(f"the job was still in Slurm's queue {QUEUE_LIMIT:.0f} s after the link came back")
    check_messages(lambda r: read(out_pattern.replace("%t", str(r))), errors)
    if job.returncode == 0:
        errors.append("srun exited 0, want non-zero")
    if errors:
        errors += ["srun's output:\n" + drain.text()[-3000:]] + \
                  [f"rank {r}'s output:\n" + read(out_pattern.replace("%t", str(r)))[-3000:] for r in (0, 1)]
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--launch", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--how", default="outside,inside")
    a = ap.parse_args()
    errors = []
    for how in a.how.split(","):
        if how not in ("outside", "inside"):
            ap.error(f"--how: outside or inside, got {how}")
        errors += [f"cut {how}: {e}" for e in trial(a, how)]
    for e in errors:
        print("  FAIL: " + e, flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
