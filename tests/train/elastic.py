#!/usr/bin/python3
"""elastic.py - ddp-launch's generations on one machine (--max-restarts, --shrink-on-failure,
--min-ranks) with ddp-train, a rank killed with SIGKILL mid-run:

  restart    -n 3 --max-restarts 1 (200 steps): the killed generation ends (mpirun ends every rank), the next
             starts with 3 ranks, resumes from the newest checkpoint (DDP_ELASTIC_GENERATION implies
             --resume auto) and finishes: its final parameters equal an uninterrupted 3-rank run's
             bit for bit, and so does every step's data fingerprint in --metrics (the last line of
             each step: steps after the checkpoint were redone), none missing; the generation lines
             name what ended the first.
  shrink     --global-batch 48 --shrink-on-failure --min-ranks 2: the next generation has 2
             ranks (3 micro-steps of 8 each instead of 2) and finishes on the same samples at
             every step as an uninterrupted 3-rank run (the data fingerprints) and to its
             parameters within 1e-4 (the sums in another order: DDP == accumulation's tolerance).
  floor      -n 2 --shrink-on-failure --min-ranks 2: one rank fewer would be below the floor: the
             job ends with the killed generation's status, saying why.
  spent      --max-restarts 0: the job ends with the killed generation's status.
  usage      --min-ranks above -n, --min-ranks without --shrink-on-failure, --shrink-on-failure
             without --max-restarts, and --max-restarts inside mpirun: refused with exit 2 before
             anything starts.

Usage: elastic.py DDP_LAUNCH DDP_TRAIN DDP_CKPT
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

STEPS = 200  # at ~100 steps/s the 190 steps after the kill's trigger leave it time to land


def train_args(exe, data, ckdir, extra=()):
    return [exe, "--model", "mlp", "--widths", "784-64-10", "--data", data, "--epochs", "20",
            "--max-steps", str(STEPS), "--batch", "8", "--lr", "0.05", "--device", "cpu",
            "--log-every", "10", "--checkpoint-dir", ckdir, "--checkpoint-every", "5"] + list(extra)


def kill_one_rank(ckdir, proc, after="step-000000000010.ckpt"):
    """Once ckdir holds `after`, SIGKILLs one ddp-train process whose command line names ckdir.
    Returns its pid, or None when the run ended first."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(os.path.join(ckdir, after)):
            break
        time.sleep(0.01)
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if comm == "ddp-train" and ckdir.encode() in cmd:
            os.kill(pid, signal.SIGKILL)
            return pid
    return None


def elastic_run(chk, launch, args, ckdir, what):
    """Runs launch + args, kills one rank once step 10's checkpoint is there; returns (status,
    output)."""
    proc = subprocess.Popen(launch + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = kill_one_rank(ckdir, proc)
    chk.check(pid is not None, f"{what}: a rank was killed after step 10's checkpoint")
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def restart(chk, launch, exe, ckpt, data, tmp):
    straight = os.path.join(tmp, "straight.ckpt")
    m_straight = os.path.join(tmp, "straight.jsonl")
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3"] +
                           train_args(exe, data, os.path.join(tmp, "s"),
                                      ["--save", straight, "--metrics", m_straight]), timeout=300)
    chk.check(rc == 0, f"the uninterrupted 3-rank run: exit status {rc}", out)
    ckdir, saved, metrics = os.path.join(tmp, "r"), os.path.join(tmp, "r.ckpt"), os.path.join(tmp, "r.jsonl")
    rc, out = elastic_run(chk, launch + ["-n", "3", "--max-restarts", "1"],
                          train_args(exe, data, ckdir, ["--save", saved, "--metrics", metrics]),
                          ckdir, "restart")
    print(out[-3000:])
    chk.check(rc == 0 and "generation 1: 3 rank(s)" in out and "exit status 137" in out and
              "resumed from" in out and "the job is done" in out,
              "restart: the second generation of 3 ranks resumes and finishes", out)
    trainlib.diff_ckpt(chk, ckpt, straight, saved, True, "restart: the parameters of the uninterrupted run",
                       "0")
    with open(m_straight) as f, open(metrics) as g:
        want = {x["data_step"]: x["data_fp"] for x in map(trainlib.json.loads, f) if "data_step" in x}
        got = {x["data_step"]: x["data_fp"] for x in map(trainlib.json.loads, g) if "data_step" in x}
    chk.check(len(want) == STEPS and got == want,
              "restart: every step's data fingerprint is the uninterrupted run's (the last line of a "
              "redone step), none missing", f"{want}\n{got}")


def fps(path):
    with open(path) as f:  # the last line of each step: a redone step's
        return {x["data_step"]: x["data_fp"] for x in map(trainlib.json.loads, f) if "data_step" in x}


def shrink(chk, launch, exe, ckpt, data, tmp):
    fixed = ["--global-batch", "48"]
    straight, m_straight = os.path.join(tmp, "g.ckpt"), os.path.join(tmp, "g.jsonl")
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3"] +
                           train_args(exe, data, os.path.join(tmp, "gs"),
                                      fixed + ["--save", straight, "--metrics", m_straight]), timeout=300)
    chk.check(rc == 0 and "accum: from --global-batch 48" in out, f"--global-batch at 3 ranks: {rc}", out)
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "5"] +
                           train_args(exe, data, os.path.join(tmp, "g5"), fixed), timeout=300)
    chk.check(rc == 1 and "--global-batch 48 is not a multiple of --batch 8 x 5 rank(s) = 40" in out
              and out.count("is not a multiple") == 1 and "step 1/" not in out,
              "--global-batch that 5 ranks do not divide: refused before training, said once", out)
    ckdir, saved, metrics = os.path.join(tmp, "k"), os.path.join(tmp, "k.ckpt"), os.path.join(tmp, "k.jsonl")
    rc, out = elastic_run(chk, launch + ["-n", "3", "--max-restarts", "1", "--shrink-on-failure",
                                         "--min-ranks", "2"],
                          train_args(exe, data, ckdir, fixed + ["--save", saved, "--metrics", metrics]),
                          ckdir, "shrink")
    chk.check(rc == 0 and "generation 1: 2 rank(s)" in out and "each step on the same samples" in out
              and "the job is done" in out, "shrink: the second generation has 2 ranks and finishes", out)
    want, got = fps(m_straight), fps(metrics)
    chk.check(len(want) == STEPS and got == want,
              "shrink: every step read the samples of the uninterrupted 3-rank run (data fingerprints)",
              f"{want}\n{got}")
    trainlib.diff_ckpt(chk, ckpt, straight, saved, True, "shrink: the parameters of the uninterrupted run",
                       "1e-4")


def ends(chk, launch, exe, data, tmp, name, flags, says):
    ckdir = os.path.join(tmp, name)
    rc, out = elastic_run(chk, launch + flags, train_args(exe, data, ckdir), ckdir, name)
    chk.check(rc != 0 and says in out and "generation 1:" not in out,
              f"{name}: the job ends with the killed generation's status ({rc}), saying: {says}", out)


def usage(chk, launch, exe):
    cases = [(["-n", "2", "--max-restarts", "1", "--shrink-on-failure", "--min-ranks", "3"],
              "--min-ranks 3 is above the 2 rank(s) of -n"),
             (["-n", "2", "--max-restarts", "1", "--min-ranks", "1"], "--min-ranks bounds --shrink-on-failure"),
             (["-n", "2", "--shrink-on-failure"], "add --max-restarts R"),
             (["--max-restarts", "-1"], "--max-restarts needs a number from 0 to 1000")]
    for flags, says in cases:
        rc, out = trainlib.run(launch + flags + [exe, "--help"], timeout=60)
        chk.check(rc == 2 and says in out, f"usage: {' '.join(flags)} is refused (exit 2): {says}", out)
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "-np", "1"] + launch + ["--max-restarts", "1", exe,
                                                                                 "--help"], timeout=60)
    chk.check(rc == 2 and "outside mpirun and srun" in out,
              "usage: --max-restarts inside mpirun is refused (exit 2), naming the usage", out)


def main():
    launch, exe, ckpt = [sys.argv[1]], sys.argv[2], sys.argv[3]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-elastic-") as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 480, 60)
        usage(chk, launch, exe)
        restart(chk, launch, exe, ckpt, data, tmp)
        shrink(chk, launch, exe, ckpt, data, tmp)
        ends(chk, launch, exe, data, tmp, "floor",
             ["-n", "2", "--max-restarts", "2", "--shrink-on-failure", "--min-ranks", "2"],
             "below --min-ranks 2: the job ends")
        ends(chk, launch, exe, data, tmp, "spent", ["-n", "2", "--max-restarts", "0"],
             "no restart left (--max-restarts 0): the job ends")
    chk.done()


if __name__ == "__main__":
    main()
