#!/usr/bin/python3
"""ckpt_kill_async.py - kill -9 during asynchronous folder saves, at random moments (issue 29's
faults): a 2-rank MLP under real mpirun saves a folder at every step with --checkpoint-format folder
--checkpoint-async (so a background write is nearly always under way), and is killed with SIGKILL
KILLS times in a row: the whole job (mpirun and both ranks, as a lost node) or one rank (the rest
killed if the job has not ended within 0.5 s). Each run after a kill resumes with --resume auto.

After each kill: the newest folder with a MANIFEST passes `ddp-ckpt verify`; the next run says it
resumed from exactly that one (never from debris: a folder without MANIFEST, whatever files it
holds); once that run has completed two saves (so the first one's pruning has finished), the debris
the kill left is gone or rewritten complete. A last run, not killed, ends with exit 0, no folder
without MANIFEST and no temporary file left, and its folders valid.

The moments are drawn from a seeded generator (printed; --seed N replays it, timing aside): half of
the kills wait until a folder without MANIFEST (a write in flight) is seen and strike within 5 ms,
the others at a uniform moment of the run's first 0.4 s of training.

Usage: ckpt_kill_async.py [--seed N] [--kills K] DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (-np last)
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

START_LIMIT = 30.0  # seconds for a run to report its resume (or fresh start)


def name(step):
    return f"step-{step:012d}.ckpt"


def tagged_pids(tag):
    """{pid: (rank, argv0)} of the processes whose environment holds DDP_KILL_TEST=tag (mpirun and
    the ranks; rank -1 for mpirun)."""
    found = {}
    for pid, env in trainlib.tagged("DDP_KILL_TEST", tag).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except OSError:
            continue
        rank = env.get(b"OMPI_COMM_WORLD_RANK")
        found[pid] = (int(rank) if rank and rank.isdigit() else -1, argv0)
    return found


def kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def folders(d):
    """({step: complete}, [temporary files]) of the checkpoint folder d."""
    state, tmps = {}, []
    for entry in os.listdir(d) if os.path.isdir(d) else []:
        m = re.fullmatch(r"step-(\d{12})\.ckpt", entry)
        path = os.path.join(d, entry)
        if m and os.path.isdir(path):
            files = os.listdir(path)
            state[int(m.group(1))] = "MANIFEST" in files
            tmps += [os.path.join(path, f) for f in files if ".tmp" in f]
        elif ".tmp" in entry:
            tmps.append(path)
    return state, tmps


class Job:
    def __init__(self, cmd, tag, log_path):
        print("$ " + " ".join(cmd), flush=True)
        self.tag, self.log_path = tag, log_path
        # Output into a file, never a pipe: an undrained pipe would block the ranks.
        self.log = open(log_path, "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env=dict(os.environ, DDP_KILL_TEST=tag))

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_output(self, pattern, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = re.search(pattern, self.output())
            if m or self.proc.poll() is not None:
                return m
            time.sleep(0.01)
        return None

    def kill_everything(self):
        """SIGKILL to every process left of the job (by tag), then mpirun's session; reaped."""
        for _ in range(3):
            kill_pids(tagged_pids(self.tag))
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait()
        deadline = time.monotonic() + 10
        while tagged_pids(self.tag) and time.monotonic() < deadline:
            kill_pids(tagged_pids(self.tag))
            time.sleep(0.05)
        self.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("train")
    ap.add_argument("ckpt")
    ap.add_argument("mpi", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (replay: ckpt_kill_async.py --seed {seed} ...)", flush=True)
    rng = random.Random(seed)
    chk = trainlib.Checker()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 160, 20)
        d = os.path.join(tmp, "ckpt")
        # A folder at every step: the writer thread is busy nearly all the time (each save waits
        # for the one before), so most moments fall inside a background write. 784-256-10 makes
        # each rank's file about 0.8 MB (parameters and momentum).
        common = [a.train, "--model", "mlp", "--widths", "784-256-10", "--data", data, "--batch", "8",
                  "--epochs", "100000", "--device", "cpu", "--log-every", "1000", "--checkpoint-dir", d,
                  "--checkpoint-every", "1", "--keep", "2", "--checkpoint-format", "folder",
                  "--checkpoint-async", "--resume", "auto"]
        prev_debris, landed = set(), 0
        for k in range(a.kills):
            state, _ = folders(d)
            complete = sorted(s for s, ok in state.items() if ok)
            want = complete[-1] if complete else None
            job = Job(a.mpi + ["2"] + common + ["--max-steps", "1000000"], f"{os.getpid()}-{k}",
                      os.path.join(tmp, f"run-{k}.log"))
            try:  # every process of the job is killed and reaped, whatever happens here
                started = job.wait_output(r"resumed from \S+ at step (\d+)|no checkpoint in \S+: starting fresh",
                                          START_LIMIT)
                how = rng.choice(["job", "job", "rank0", "rank1"])
                in_flight = rng.random() < 0.5
                delay = rng.uniform(0.0, 0.005) if in_flight else rng.uniform(0.0, 0.4)
                if started and in_flight:
                    # A write in flight: a folder without MANIFEST newer than the resumed step.
                    deadline = time.monotonic() + 2.0
                    while time.monotonic() < deadline and job.proc.poll() is None:
                        st, _ = folders(d)
                        if any(not ok and (want is None or s > want) for s, ok in st.items()):
                            break
                        time.sleep(0.001)
                time.sleep(delay)
                pids = tagged_pids(job.tag)
                ranks = {r: pid for pid, (r, argv0) in pids.items()
                         if r >= 0 and argv0.endswith(os.path.basename(a.train).encode())}
                if how == "job":
                    kill_pids(pids)  # mpirun and every rank at once
                else:
                    kill_pids([ranks[int(how[-1])]] if int(how[-1]) in ranks else pids)
                    try:
                        job.proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                job.kill_everything()
            out = job.output()
            tail = out[-3000:]
            chk.check(started is not None, f"kill {k + 1}: the run started within {START_LIMIT:.0f} s", tail)
            if want is None:
                chk.check(started is not None and started.group(1) is None,
                          f"kill {k + 1}: no complete folder yet: the run starts fresh", tail)
            else:
                got = started.group(1) if started else None
                chk.check(got is not None and int(got) == want and f"resumed from {d}/{name(want)} " in out,
                          f"kill {k + 1}: resumed from the newest complete folder, step {want} (got {got})", tail)
            saves = out.count("written in the background in")
            state, tmps = folders(d)
            debris = {s for s, ok in state.items() if not ok}
            complete = sorted(s for s, ok in state.items() if ok)
            landed += bool(debris or tmps)
            print(f"kill {k + 1} ({how}, {'in a write' if in_flight else 'anywhere'}, +{delay * 1000:.1f} ms): "
                  f"{saves} background saves completed; complete {complete}, without MANIFEST "
                  f"{sorted(debris)}, temporary files {len(tmps)}", flush=True)
            if saves >= 2:
                # A step this run wrote whole and then pruned (MANIFEST first) is this kill's
                # debris, not the previous one's: a kill during that removal leaves it again.
                rewritten = {int(s) for s in re.findall(r"\(step (\d+)\): written in the background", out)}
                left = {s for s in (prev_debris & debris) - rewritten if not complete or s < complete[-1]}
                chk.check(not left, f"kill {k + 1}: the previous kill's debris was removed by this run's "
                          f"saves (left: {sorted(left)})")
            if complete:
                rc, vout = trainlib.run([a.ckpt, "verify", os.path.join(d, name(complete[-1]))], timeout=60)
                chk.check(rc == 0, f"kill {k + 1}: the newest complete folder, step {complete[-1]}, is valid",
                          vout)
            prev_debris = debris
        print(f"{landed} of {a.kills} kills left a folder without MANIFEST or a temporary file", flush=True)

        # The last run is not killed: it resumes, saves a few folders and ends; no debris is left.
        state, _ = folders(d)
        complete = sorted(s for s, ok in state.items() if ok)
        last = complete[-1] if complete else 0
        rc, out = trainlib.run(a.mpi + ["2"] + common + ["--max-steps", str(last + 4)], timeout=120)
        chk.check(rc == 0 and (not complete or f"resumed from {d}/{name(last)} at step {last} " in out),
                  f"the last run resumes from step {last} and ends (exit {rc})", out[-3000:])
        state, tmps = folders(d)
        chk.check(state and all(state.values()) and not tmps,
                  f"no debris after the last run's saves: {sorted(state.items())}, temporary files {tmps}")
        for s in sorted(state):
            rc, vout = trainlib.run([a.ckpt, "verify", os.path.join(d, name(s))], timeout=60)
            chk.check(rc == 0, f"the last run's folder of step {s} is valid", vout)
    print(f"{a.kills} kills and the last run in {time.monotonic() - t_start:.1f} s (seed {seed})", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
