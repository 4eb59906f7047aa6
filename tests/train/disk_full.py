#!/usr/bin/python3
"""disk_full.py - a checkpoint save that fails because the disk is full says so (path and "No space
left on device", in the write's message and in the failed checkpoint's summary line, not a bare
"input/output error", with the advice to free space), leaves the previous checkpoints valid and no
temporary file behind, and ends the run with exit 1 (the other rank says it is exiting); with
--checkpoint-errors warn the run goes on to the end and exits 0, no rank claims to be exiting, and
the failure is told in full once, each later one in a short line with the count. A --save into the
full disk names the reason too and exits 1. The full disk is a 512 KiB tmpfs mounted by the test
(room for two checkpoints of the small MLP), unmounted in all cases.
Other reasons get their own advice, not "free space there": a tiny GPT's checkpoint folder made
read-only (the tmpfs remounted ro), immutable (chattr +i) or removed (as another job's cleanup
would) after its step-10 checkpoint: the step-20 save fails naming the system's reason and what to
do about that reason (remount read-write; permissions or chattr -i; another job in the folder).
Needs root for mount and chattr: exits 77 (skipped) otherwise.

Usage: disk_full.py DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402
from ckpt_kill_async import Job  # noqa: E402
from gpt_train import tiny, write_data  # noqa: E402


def ckpt_name(step):
    return f"step-{step:012d}.ckpt"


def train_cmd(train, mpi, data, *extra):
    return mpi + ["2", train, "--model", "mlp", "--widths", "784-32-10", "--data", data, "--batch", "8",
                  "--max-steps", "30", "--device", "cpu", *extra]


def scenario(chk, train, ckpt, mpi, data, mnt, policy):
    folder = os.path.join(mnt, policy)
    # one file through rank 0 (ckpt_folder.py's disk_full mode fills the disk under folder saves)
    rc, out = trainlib.run(train_cmd(train, mpi, data, "--checkpoint-dir", folder, "--checkpoint-format", "file",
                                     "--checkpoint-every", "5",
                                     "--checkpoint-errors", policy), timeout=300)
    want_rc = 1 if policy == "stop" else 0
    chk.check(rc == want_rc, f"--checkpoint-errors {policy}: exit status {rc} (want {want_rc})", out)
    chk.check(f"{folder}/{ckpt_name(15)}" in out and "No space left on device" in out,
              f"{policy}: the failed save names the path and the reason", out)
    summary = [line for line in out.splitlines() if f"{ckpt_name(15)} at step 15 failed:" in line]
    chk.check(len(summary) == 1 and "failed: No space left on device;" in summary[0]
              and "free space there" in summary[0],
              f"{policy}: the checkpoint's summary line gives the reason, not a bare I/O error, and "
              f"the advice to free space", out)
    exiting = [line for line in out.splitlines() if "rank(s) failed" in line and "exiting" in line]
    if policy == "stop":
        chk.check("step 30/30" not in out, "stop: training ended at the failed save", out)
        chk.check(len(exiting) == 1, "stop: the other rank says it is exiting", out)
    else:
        chk.check("training goes on" in out and "throughput:" in out, "warn: training goes on to the end", out)
        chk.check(not exiting, f"warn: no rank claims to be exiting ({exiting[:1]})", out)
        full = [line for line in out.splitlines() if "training goes on" in line]
        later = [line for line in out.splitlines() if "failed too: No space left on device" in line]
        counts = [f"({n} failed saves so far)" for n in (2, 3, 4)]
        chk.check(len(full) == 1 and len(later) == 3 and all(c in line for c, line in zip(counts, later)),
                  f"warn: the first failed save is told in full once ({len(full)} lines), the 3 later "
                  f"ones in a short line each with the count", out)
    names = sorted(n for n in os.listdir(folder) if n.startswith("step-"))  # not .ddp-lock
    chk.check(names == [ckpt_name(5), ckpt_name(10)], f"{policy}: the earlier checkpoints are kept, no "
              f"temporary file is left ({names})")
    for name in names:
        rc, show = trainlib.run([ckpt, "show", os.path.join(folder, name)], timeout=30)
        chk.check(rc == 0 and "step = " in show, f"{policy}: {name} is still valid", show)
    subprocess.run(["rm", "-rf", folder])


def save_full(chk, train, mpi, data, mnt):
    """--save into a disk that has no room left: the reason, exit 1, no temporary file."""
    folder = os.path.join(mnt, "save")
    os.makedirs(folder)
    with open(os.path.join(folder, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass  # full
    path = os.path.join(folder, "model.ckpt")
    rc, out = trainlib.run(train_cmd(train, mpi, data, "--save", path), timeout=300)
    chk.check(rc == 1 and f"--save {path}: No space left on device" in out,
              "--save into a full disk: exit 1, naming the path and the reason", out)
    names = sorted(os.listdir(folder))
    chk.check(names == ["filler"], f"--save into a full disk: no temporary file left ({names})")
    subprocess.run(["rm", "-rf", folder])


def break_folder(how, folder, mnt):
    """Makes the checkpoint folder unwritable the way `how` says; returns a command that undoes it.
    Should that fail, the run trains to its end and the checks below say so."""
    if how == "read-only":
        # a read-only bind mount over the folder: remounting the whole file system read-only is
        # refused (EBUSY) while a file on it is open for writing, as the folder's lock file is
        subprocess.run(["mount", "--bind", folder, folder])
        subprocess.run(["mount", "-o", "remount,ro,bind", folder])
        return ["umount", folder]
    if how == "immutable":
        subprocess.run(["chattr", "+i", folder])
        return ["chattr", "-i", folder]
    shutil.rmtree(folder)  # another job's cleanup, or a second job pruning the same folder
    return ["true"]


ADVICE = {"read-only": ["Read-only file system", "mounted read-only: remount it read-write"],
          "immutable": ["Operation not permitted", "permissions or owner", "chattr -i"],
          "removed": ["No such file or directory",
                      "another job writes into the same folder (give each job its own)"]}


def failed_for(chk, train, mpi, tmp, mnt, how):
    """A tiny GPT checkpointing every 10 steps; after step 10's file the folder breaks (`how`): the
    step-20 save (or step 10's, still syncing the folder) fails naming the reason and the advice
    for it, not "free space there"."""
    folder = os.path.join(mnt, how)
    args = tiny(train, write_data(tmp), 40, ["--checkpoint-dir", folder, "--checkpoint-format", "file",
                                             "--checkpoint-every", "10"])
    job = Job(mpi + ["2"] + args, "save-" + how, os.path.join(tmp, how + ".log"))
    first = os.path.join(folder, "step-000000000010.ckpt")
    deadline = time.monotonic() + 120
    while not os.path.exists(first) and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    undo = break_folder(how, folder, mnt) if os.path.exists(first) else ["true"]
    try:
        job.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pass
    job.kill_everything()
    subprocess.run(undo)
    out = job.output()
    # the folder can break while step 10's save still syncs it (its file renamed into place, the
    # folder not yet synced): then that save is the one that fails, for the same reason
    line = next((x for x in out.splitlines()
                 if re.search(r"step-0000000000(10|20)\.ckpt at step (10|20) failed:", x)), "")
    chk.check(job.proc.returncode == 1 and "step 40/40" not in out,
              f"{how} folder: the step-20 (or step-10) save fails and the run stops with exit 1 "
              f"(exit {job.proc.returncode})", out)
    chk.check(all(w in line for w in ADVICE[how]) and "free space" not in line,
              f"{how} folder: the failure names the reason and its own advice ({ADVICE[how][1]}), "
              f"not \"free space there\"", out)


def main():
    train, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3:]
    if os.geteuid() != 0:
        print("skipped: mounting the small tmpfs that plays the full disk needs root")
        sys.exit(77)
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-diskfull-") as tmp:
        data, mnt = os.path.join(tmp, "data"), os.path.join(tmp, "mnt")
        trainlib.write_dataset(data, 480, 60)
        os.makedirs(mnt)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", mnt]).returncode == 0
        chk.check(mounted, "mounted a 512 KiB tmpfs")
        try:
            if mounted:
                for policy in ("stop", "warn"):
                    scenario(chk, train, ckpt, mpi, data, mnt, policy)
                save_full(chk, train, mpi, data, mnt)
        finally:
            if mounted and subprocess.run(["umount", mnt]).returncode != 0:
                subprocess.run(["umount", "-l", mnt])
        big = os.path.join(tmp, "big")  # room for a tiny GPT's checkpoints (about 40 MB each)
        os.makedirs(big)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", big]).returncode == 0
        chk.check(mounted, "mounted a 256 MiB tmpfs")
        try:
            for how in ADVICE if mounted else ():
                failed_for(chk, train, mpi, tmp, big, how)
        finally:
            if mounted and subprocess.run(["umount", big]).returncode != 0:
                subprocess.run(["umount", "-l", big])
    chk.done()


if __name__ == "__main__":
    main()
