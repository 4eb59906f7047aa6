#!/usr/bin/python3
"""kill_rank.py - no rank left hanging: kill -9 (or SIGSTOP) of one rank in the middle of training (rank
1 in odd trials, rank 0 in even ones), in each way of starting a job. Every process of the job must be
gone within 30 s, the exit status must be non-zero, and the output must name the rank that died.

Usage: kill_rank.py --train DDP_TRAIN --launch DDP_LAUNCH [--trials N] [--modes M,...] [--stop]
Modes: mpirun, launch-mpirun (ddp-launch -n 2 through mpirun), launch-fork (ddp-launch -n 2 forking a
  non-MPI program, since MPI programs are refused there), srun (srun --mpi=pmix -N2, written plainly,
  Slurm's default KillOnBadExit=0), sbatch-mpirun (mpirun inside an sbatch allocation of 2 nodes).
  srun and sbatch-mpirun need a running local cluster (slurm/cluster.sh; tests/cluster/run.sh kill-rank).
--stop: SIGSTOP instead of kill -9, with DDP_TIMEOUT=STOP_TIMEOUT; the job must end within
  DDP_TIMEOUT + 10 s with the timeout message naming the frozen rank and (mpirun, launch-mpirun)
  where the other rank waits: its step, phase, collective number and bucket (the wavefront).
--trials: per mode (10 when run by hand for the issue's numbers; the test suite uses fewer).
--fake-nccl FAKE_RANK LIBFAKENCCL: mode mpirun only, both ranks on ONE GPU (--device cuda) through the
  test-only NCCL (tests/nccl_fake/fake_rank.sh): the survivor waits in a NCCL collective, not in MPI.
  Exit 77 (skipped) without a GPU.
Every process this script starts is killed by PID (and process group) when a trial fails.
"""
import argparse
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

KILL_LIMIT = 30.0   # seconds from kill -9 until every process of the job is gone
STOP_TIMEOUT = 8    # DDP_TIMEOUT of the SIGSTOP trials (MPI_Init is under it too: not too short)
START_LIMIT = 90.0  # seconds for the job to start training


def tagged_pids(tag):
    """{pid: rank} of the processes whose environment holds DDP_HANG_TEST=tag (rank -1 if unknown)."""
    found = {}
    for pid, env in trainlib.tagged("DDP_HANG_TEST", tag).items():
        rank = env.get(b"RANK") or env.get(b"OMPI_COMM_WORLD_RANK") or env.get(b"SLURM_PROCID")
        found[pid] = int(rank) if rank and rank.isdigit() else -1
    return found


def rank_pids(tag, prog):
    """{rank: pid} of the job's `prog` processes (the ranks themselves)."""
    out = {}
    for pid, rank in tagged_pids(tag).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(prog.encode()) and rank >= 0:
            out[rank] = pid
    return out


def kill_all(tag, job):
    """Kills what is left of a trial, by PID: the job's processes and the launcher's group."""
    for pid in tagged_pids(tag):
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


class Mode:
    """How one launch mode starts a job, and how its end is observed."""

    def __init__(self, args, work):
        self.a, self.work = args, work

    def train_cmd(self, tag):
        a = self.a
        gpu = list(a.fake_nccl) + [a.train, "--device", "cuda"] if a.fake_nccl else [a.train]
        return gpu + ["--model", "mlp", "--data", a.data, "--epochs", "100000", "--batch", "32",
                      "--log-every", "100000", "--metrics", os.path.join(self.work, f"{tag}.jsonl")]

    def command(self, mode, tag):
        a = self.a
        timeout = ["-x", "DDP_TIMEOUT"] if a.stop else []
        mpi = ["mpirun", "--oversubscribe", "--bind-to", "none", "-x", "DDP_HANG_TEST"] + timeout + ["-np", "2"]
        if mode == "mpirun":
            return mpi + self.train_cmd(tag), "ddp-train"
        if mode == "launch-mpirun":
            return [a.launch, "-n", "2"] + self.train_cmd(tag), "ddp-train"
        if mode == "launch-fork":
            loop = "while :; do sleep 0.05; done"
            return [a.launch, "-n", "2", "sh", "-c", loop], "sh"
        if mode == "srun":
            return ["srun", "--mpi=pmix", "-N2", "--ntasks-per-node=1", a.launch] + self.train_cmd(tag), "ddp-train"
        if mode == "sbatch-mpirun":
            script = os.path.join(self.work, f"{tag}.sh")
            with open(script, "w") as f:
                f.write("#!/bin/bash\n" + " ".join(mpi + ["--map-by", "node", a.launch] + self.train_cmd(tag)) + "\n")
            out = os.path.join(self.work, f"{tag}.out")
            return ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--output={out}", script], "ddp-train"
        raise SystemExit(f"unknown mode {mode}")


def job_state(job_id):
    p = subprocess.run(["scontrol", "show", "job", "-o", job_id], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    for word in p.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1], p.stdout
    return "GONE", p.stdout


def wait_started(mode, tag, prog, job, metrics):
    """Waits until both ranks run and training has gone a little way (ddp-train: its first epoch
    is in the metrics file; a shell: 2 s); returns {rank: pid}, or None."""
    deadline = time.monotonic() + START_LIMIT
    while time.monotonic() < deadline:
        ranks = rank_pids(tag, prog)
        trained = prog == "sh" or (os.path.exists(metrics) and os.path.getsize(metrics) > 0)
        if len(ranks) == 2 and trained:
            time.sleep(2.0 if prog == "sh" else 0.5)
            ranks = rank_pids(tag, prog)
            return ranks if len(ranks) == 2 else None
        if mode != "sbatch-mpirun" and job.poll() is not None:
            return None
        time.sleep(0.1)
    return None


def job_over(mode, tag, job, job_id):
    """Whether every process of the job has ended (and the launcher or batch job with them)."""
    if tagged_pids(tag):
        return False
    if mode == "sbatch-mpirun":
        return job_state(job_id)[0] not in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING")
    return job.poll() is not None


class Drain:
    """Reads a job's output as it comes, as a terminal or Slurm does: an undrained pipe fills
    (64 KiB, about 800 epoch lines) and then blocks the launcher and the ranks on their writes."""

    def __init__(self, stream):
        self.parts = []
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.thread.start()

    def _run(self, stream):
        for line in iter(stream.readline, ""):
            self.parts.append(line)

    def text(self, wait=5.0):
        self.thread.join(wait)
        return "".join(self.parts)


def describe_left(tag, job):
    """One line per process of the job still there: pid, rank, state and where it sleeps."""
    lines = [f"launcher (pid {job.pid}) still running" if job.poll() is None else ""]
    for pid, rank in sorted(tagged_pids(tag).items()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        lines.append(f"left: pid {pid} rank {rank} {name} state {state} in {wchan or '-'}")
    return "\n".join(line for line in lines if line) + "\n"


def output_of(mode, tag, drain, work):
    if mode == "sbatch-mpirun":
        try:
            return open(os.path.join(work, f"{tag}.out")).read()
        except OSError:
            return ""
    return drain.text() if drain else ""


def exit_status(mode, job, job_id):
    if mode != "sbatch-mpirun":
        return job.returncode
    info = job_state(job_id)[1]
    code = [w for w in info.split() if w.startswith("ExitCode=")]
    return 0 if code == ["ExitCode=0:0"] else 1


def expected_messages(mode, victim, stop):
    """Alternatives of substrings that one output line must hold together: the dead or frozen rank
    named, by libddp's watchdog or by the launcher (mpirun often kills the survivors before their
    own message gets out; srun names the task)."""
    if stop:
        return [[f"rank {victim} (host", "did not answer"]]
    if mode == "launch-fork":
        return [[f"ddp-launch: rank {victim} (pid", "killed by signal 9"]]
    ours = [f"rank {victim} (host", "is gone"]
    if mode == "srun":
        return [ours, [f"task {victim}: Killed"]]
    return [ours, [f"process rank {victim} with PID", "exited on signal 9"]]


def one_trial(modes, mode, n, stop, chk):
    tag = f"{os.getpid()}-{mode}-{n}"
    cmd, prog = modes.command(mode, tag)
    # CPU training: hide the GPUs, or ddp-launch rightly refuses 2 ranks on a 1-GPU machine.
    env = dict(os.environ, DDP_HANG_TEST=tag)
    if not modes.a.fake_nccl:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if stop:
        env["DDP_TIMEOUT"] = str(STOP_TIMEOUT)
    if mode == "launch-fork":
        env["DDP_LOCAL_FORK"] = "1"
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           stdin=subprocess.DEVNULL, start_new_session=True)
    job_id, drain = None, None
    if mode == "sbatch-mpirun":
        job_id = job.communicate(timeout=30)[0].strip().split(";")[0]
    else:
        drain = Drain(job.stdout)
    try:
        t_start = time.monotonic()
        ranks = wait_started(mode, tag, prog, job, os.path.join(modes.work, f"{tag}.jsonl"))
        if not chk.check(ranks is not None, f"{mode} #{n}: both ranks started and trained",
                         "" if ranks else output_of(mode, tag, drain, modes.work)):
            return None
        started = time.monotonic() - t_start
        victim = n % 2  # trials alternate: rank 1, rank 0, rank 1, ...
        os.kill(ranks[victim], signal.SIGSTOP if stop else signal.SIGKILL)
        t0 = time.monotonic()
        limit = STOP_TIMEOUT + 10 if stop else KILL_LIMIT
        while time.monotonic() - t0 < limit + 5 and not job_over(mode, tag, job, job_id):
            time.sleep(0.05)
        took = time.monotonic() - t0
        over = job_over(mode, tag, job, job_id)
        left = "" if over else describe_left(tag, job)
        if job.poll() is None and mode != "sbatch-mpirun":
            kill_all(tag, job)
        out = output_of(mode, tag, drain, modes.work)
        what = "SIGSTOP" if stop else "kill -9"
        chk.check(over and took <= limit, f"{mode} #{n}: {what} of rank {victim} (pid {ranks[victim]}, "
                  f"{started:.1f} s after the start): every process gone after {took:.2f} s (limit {limit:.0f} s)",
                  left + out)
        chk.check(exit_status(mode, job, job_id) != 0, f"{mode} #{n}: exit status non-zero")
        patterns = expected_messages(mode, victim, stop)
        named = [line for line in out.splitlines() if any(all(p in line for p in alt) for alt in patterns)]
        chk.check(bool(named), f"{mode} #{n}: the output names rank {victim} (" +
                  " or ".join(" ... ".join(alt) for alt in patterns) + ")", out)
        if named:
            print("       " + named[0][:300], flush=True)
        if stop and mode in ("mpirun", "launch-mpirun") and not modes.a.fake_nccl:  # the wavefront: where the live rank waits (step, phase, bucket)
            # where the stop lands decides the collective: the gradients' all-reduce (in "gradient
            # sync", naming its bucket), or another (the stop flags' at the end of a step, the
            # evaluation's): the step, the phase and the collective's number are always there
            wave = re.search(rf"rank {1 - victim} \(host [^)]+\) at step \d+, (gradient sync: waiting in "
                             r"#\d+ \(all-reduce of bucket \d+\)|[a-z ]+: waiting in #\d+ \([a-z -]+\))", out)
            chk.check(wave is not None, f"{mode} #{n}: the report says where rank {1 - victim} waits: "
                      "its step, phase, collective # (and bucket)", out)
        return took
    finally:
        kill_all(tag, job)
        if job_id:
            subprocess.run(["scancel", job_id], stderr=subprocess.DEVNULL)


def skip_without_gpu(modes):
    """Exit 77 when the one-GPU run cannot start (no GPU, or a build without CUDA)."""
    trainlib.skip_without_nvidia_device()
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"] + modes.train_cmd("probe")
    cmd[cmd.index("--epochs") + 1] = "1"
    rc, out = trainlib.run(cmd + ["--max-steps", "1"], timeout=300)
    for reason in ("has no usable GPU", "built without CUDA", "NCCL needs one GPU per rank"):
        if rc != 0 and reason in out:
            print(f"skipped: {reason}")
            sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--launch", required=True)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--modes", default="mpirun,launch-mpirun,launch-fork")
    ap.add_argument("--stop", action="store_true")
    ap.add_argument("--data", help="IDX folder (default: a small synthetic set)")
    ap.add_argument("--fake-nccl", nargs=2, metavar=("FAKE_RANK", "LIBFAKENCCL"))
    a = ap.parse_args()
    if a.fake_nccl and a.modes != "mpirun":
        ap.error("--fake-nccl runs mode mpirun only")
    a.train, a.launch = os.path.realpath(a.train), os.path.realpath(a.launch)
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-kill-") as work:
        if not a.data:
            a.data = os.path.join(work, "data")
            trainlib.write_dataset(a.data, 2000, 200)
        modes = Mode(a, work)
        if a.fake_nccl:
            skip_without_gpu(modes)
        for mode in a.modes.split(","):
            times = [one_trial(modes, mode, n + 1, a.stop, chk) for n in range(a.trials)]
            times = [t for t in times if t is not None]
            if times:
                print(f"{mode}: {'SIGSTOP' if a.stop else 'kill -9'}, {len(times)} trial(s): worst "
                      f"{max(times):.2f} s, best {min(times):.2f} s", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
