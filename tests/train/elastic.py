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
             parameters within 1e-4 (the sums in another order: DDP == accumulation's tolerance);
             5 ranks share its 6 micro-batches unevenly (2, 1, 1, 1, 1) to the same samples and
             parameters; --global-batch 44 (not whole micro-batches) and 16 (fewer micro-batches
             than ranks) are refused.
  rescue     4 ranks, --global-batch 64 (8 micro-batches), rank 1 killed at step 20: the 3
             survivors carry on from their rescue snapshot, sharing 3, 3, 2, to the samples and
             parameters of the uninterrupted run.
  floor      -n 2 --shrink-on-failure --min-ranks 2: one rank fewer would be below the floor: the
             job ends with the killed generation's status, saying why.
  spent      --max-restarts 0: the job ends with the killed generation's status.
  usage      --min-ranks above -n, --min-ranks without --shrink-on-failure, --shrink-on-failure
             without --max-restarts, and --max-restarts inside mpirun: refused with exit 2 before
             anything starts.

Usage: elastic.py DDP_LAUNCH DDP_TRAIN DDP_CKPT
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import gpt_train  # noqa: E402
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
    # 5 ranks share the 6 micro-batches unevenly (2, 1, 1, 1, 1): the same samples, the same mean
    uneven, m_uneven = os.path.join(tmp, "g5.ckpt"), os.path.join(tmp, "g5.jsonl")
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "5"] +
                           train_args(exe, data, os.path.join(tmp, "g5"),
                                      fixed + ["--save", uneven, "--metrics", m_uneven]), timeout=300)
    want, got = fps(m_straight), fps(m_uneven) if rc == 0 else {}
    chk.check(rc == 0 and len(want) == STEPS and got == want,
              "--global-batch 48 at 5 ranks (6 micro-batches shared 2, 1, 1, 1, 1): every step on the "
              "samples of the 3-rank run", out)
    trainlib.diff_ckpt(chk, ckpt, straight, uneven, True, "5 uneven ranks: the parameters of the "
                       "3-rank run", "1e-4")
    for g, np, why in (("44", "3", "is not a multiple of --batch 8"),
                       ("16", "3", "has fewer micro-batches of --batch 8 = 8 samples than ranks")):
        rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", np] +
                               train_args(exe, data, os.path.join(tmp, "gx"), ["--global-batch", g]),
                               timeout=300)
        chk.check(rc == 1 and f"--global-batch {g} {why}" in out and out.count(why) == 1 and
                  "step 1/" not in out, f"--global-batch {g} at {np} ranks: refused before training, "
                  "said once", out)
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


def kill_at_step(metrics, proc, step):
    """Once rank 0's --metrics shows step `step`'s data, SIGKILLs rank 1 of the job writing it
    (ddp-train, the command line naming `metrics`). Returns its pid, or None when the run ended first."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            with open(metrics) as f:
                if any(x.get("data_step", 0) >= step for x in map(trainlib.json.loads, f)):
                    break
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                rank1 = b"OMPI_COMM_WORLD_RANK=1" in f.read().split(b"\0")
        except OSError:
            continue
        if cmd[0].endswith(b"ddp-train") and metrics.encode() in cmd and rank1:
            os.kill(pid, signal.SIGKILL)
            return pid
    return None


def rescue(chk, launch, exe, ckpt, data, tmp):
    """4 ranks, --global-batch 64, no disk checkpoint before the end: rank 1 killed at step 20;
    the 3 survivors' rescue snapshot carries the run over, at most 1 step redone, and they share the
    8 micro-batches of a step unevenly (3, 3, 2)."""
    fixed = ["--global-batch", "64", "--checkpoint-every", "0", "--max-steps", "60", "--log-every", "1"]
    straight, m_straight = os.path.join(tmp, "u.ckpt"), os.path.join(tmp, "u.jsonl")
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4"] +
                           train_args(exe, data, os.path.join(tmp, "us"), fixed +
                                      ["--save", straight, "--metrics", m_straight]), timeout=300)
    chk.check(rc == 0, f"rescue: the uninterrupted 4-rank run: exit status {rc}", out)
    ckdir, saved, metrics = os.path.join(tmp, "e"), os.path.join(tmp, "e.ckpt"), os.path.join(tmp, "e.jsonl")
    shm = os.path.join(tmp, "shm")
    env = dict(os.environ, DDP_SNAPSHOT_DIR=shm)
    proc = subprocess.Popen(launch + ["-n", "4", "--max-restarts", "1", "--shrink-on-failure"] +
                            train_args(exe, data, ckdir, fixed + ["--save", saved, "--metrics", metrics]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    pid = kill_at_step(metrics, proc, 20)
    out, _ = proc.communicate(timeout=300)
    print(out[-4000:])
    chk.check(pid is not None, "rescue: rank 1 was killed at step 20")
    m = re.search(r"resumed from (\S+) at step (\d+)", out)
    lines = [trainlib.json.loads(x) for x in open(metrics)]
    cut = next((i for i, x in enumerate(lines) if x.get("restart")), len(lines))
    last = max((x["data_step"] for x in lines[:cut] if "data_step" in x), default=0)
    chk.check(proc.returncode == 0 and "generation 1: 3 rank(s)" in out and m is not None and
              m.group(1) == os.path.join(shm, f"step-{int(m.group(2)):012d}.rescue") and
              "the job is done" in out and not os.listdir(shm) and
              re.search(r"elastic: generation 1: [0-9.]+ s from the failure's detection to this "
                        r"resume \(rank 1 \(host \S+, pid " + str(pid) + r"\) was lost", out) is not None,
              "rescue: the 3 survivors resume from the rescue snapshot (no disk checkpoint) and "
              "finish; the snapshot is removed", out)
    chk.check(m is not None and 0 <= last - int(m.group(2)) <= 1 and int(m.group(2)) >= 19,
              f"rescue: at most 1 step redone (the killed generation reached step {last}, the "
              f"next resumed at {m.group(2) if m else None})")
    want, got = fps(m_straight), fps(metrics)
    chk.check(len(want) == 60 and got == want,
              "rescue: every step read the samples of the uninterrupted 4-rank run", f"{want}\n{got}")
    trainlib.diff_ckpt(chk, ckpt, straight, saved, True, "rescue: the parameters of the uninterrupted run",
                       "1e-4")
    # snapshots that are not this run's: skipped, named, the disk checkpoint used
    bad = os.path.join(tmp, "bad")
    os.mkdir(bad)
    with open(straight, "rb") as f:
        whole = f.read()
    with open(os.path.join(bad, "step-000000000999.rescue"), "wb") as f:
        f.write(whole[:len(whole) // 2])
    shutil.copy(os.path.join(tmp, "g.ckpt"), os.path.join(bad, "step-000000000998.rescue"))
    rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"] +
                           train_args(exe, data, os.path.join(tmp, "us"), fixed[:-4] +
                                      ["--max-steps", "62", "--resume", "auto", "--resume-reshard",
                                       "--snapshot-dir", bad]), timeout=300)
    chk.check(rc == 0 and f"skipping the rescue snapshot {bad}/step-000000000999.rescue: unreadable or "
              "corrupt" in out and f"skipping the rescue snapshot {bad}/step-000000000998.rescue: "
              "global_batch is 48 there, 64 in this run" in out and
              re.search(r"resumed from \S+/us/step-0+60\.ckpt at step 60 ", out) is not None,
              "rescue: a truncated snapshot and one of another configuration are skipped, named; the "
              "disk checkpoint is loaded", out)
    # --zero 1: the optimizer is sharded; no snapshot, the restart uses the disk checkpoint
    ckdir, metrics = os.path.join(tmp, "z"), os.path.join(tmp, "z.jsonl")
    proc = subprocess.Popen(launch + ["-n", "3", "--max-restarts", "1"] +
                            train_args(exe, data, ckdir, ["--zero", "1", "--checkpoint-every", "10",
                                                          "--log-every", "1", "--metrics", metrics]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    pid = kill_at_step(metrics, proc, 25)
    out, _ = proc.communicate(timeout=300)
    chk.check(pid is not None and proc.returncode == 0 and "no rescue snapshots (--zero shards" in out
              and re.search(r"resumed from \S+/step-0+([1-9]\d*0)\.ckpt at step \1 ", out) is not None
              and ".rescue" not in out,
              "rescue: under --zero 1 none is written (said at start-up); the restart resumes from "
              "the newest disk checkpoint (every 10 steps)", out)


def gpt(chk, launch, exe, ckpt, tmp):
    """The tiny GPT (AdamW), --total-batch-tokens 320 (10 micro-batches): 4 ranks take 3, 3, 2, 2
    of them, then 3 ranks 4, 3, 3. Rank 1
    of 4 killed at step 12 of 30, under --zero 0 (the rescue snapshot) and --zero 1 (the disk
    checkpoint every 10 steps): every step on the tokens of the uninterrupted run, the parameters
    within 1e-4 of its."""
    data = gpt_train.write_data(tmp)
    fixed = ["--total-batch-tokens", "320", "--grad-clip", "1.0", "--checkpoint-every", "10"]
    for zero, source in (("0", r"\S+\.rescue"), ("1", r"\S+/step-0+10\.ckpt")):
        # the uninterrupted run of the same stage: 4 ranks add in another order at --zero 1
        # (reduce-scatter) than at --zero 0 (all-reduce), a difference AdamW amplifies where a
        # gradient is ~0 (the key bias), see zero.py
        straight, m_straight = os.path.join(tmp, f"gu{zero}.ckpt"), os.path.join(tmp, f"gu{zero}.jsonl")
        rc, out = trainlib.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4"] +
                               gpt_train.tiny(exe, data, 30, fixed + [
                                   "--save", straight, "--metrics", m_straight, "--zero", zero,
                                   "--checkpoint-dir", os.path.join(tmp, f"gs{zero}")]), timeout=300)
        chk.check(rc == 0 and "accum: from --total-batch-tokens 320" in out,
                  f"gpt --zero {zero}: the uninterrupted 4-rank run: exit status {rc}", out)
        ckdir, saved = os.path.join(tmp, f"g{zero}"), os.path.join(tmp, f"g{zero}.ckpt")
        metrics = os.path.join(tmp, f"g{zero}.jsonl")
        cmd = gpt_train.tiny(exe, data, 30, fixed + ["--checkpoint-dir", ckdir, "--zero", zero,
                                                     "--save", saved, "--metrics", metrics])
        proc = subprocess.Popen(launch + ["-n", "4", "--max-restarts", "1", "--shrink-on-failure"] + cmd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        pid = kill_at_step(metrics, proc, 12)
        out, _ = proc.communicate(timeout=300)
        print(out[-3000:])
        m = re.search(r"resumed from (" + source + r") at step (\d+)", out)
        chk.check(pid is not None and proc.returncode == 0 and "generation 1: 3 rank(s)" in out and m
                  and "each step on the same tokens" in out,
                  f"gpt --zero {zero}: rank 1 killed at step 12; 3 ranks resume from "
                  f"{'the rescue snapshot' if zero == '0' else 'the disk checkpoint'} and finish", out)
        want, got = fps(m_straight), fps(metrics)
        chk.check(len(want) == 30 and got == want,
                  f"gpt --zero {zero}: every step on the tokens of the uninterrupted run", f"{want}\n{got}")
        trainlib.diff_ckpt(chk, ckpt, straight, saved, True,
                           f"gpt --zero {zero}: the parameters of the uninterrupted run", "1e-4")


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
        rescue(chk, launch, exe, ckpt, data, tmp)
        gpt(chk, launch, exe, ckpt, tmp)
        ends(chk, launch, exe, data, tmp, "floor",
             ["-n", "2", "--max-restarts", "2", "--shrink-on-failure", "--min-ranks", "2"],
             "below --min-ranks 2: the job ends")
        ends(chk, launch, exe, data, tmp, "spent", ["-n", "2", "--max-restarts", "0"],
             "no restart left (--max-restarts 0): the job ends")
    chk.done()


if __name__ == "__main__":
    main()
