#!/usr/bin/python3
"""ckpt_place.py - where ddp-train's checkpoints go, settled before training (train/checkpoint_place.c):

format: --checkpoint-format auto (the default) at 4 ranks on one machine, where every rank sees the
  folder, writes a folder of per-rank files per checkpoint (4 rank files and a MANIFEST) and the
  start-up line says so and why; --checkpoint-format file still writes one file; a step saved
  again as the other kind (a run resumed from the step before) replaces the folder by a file and
  the file by a folder.
node_local: ranks 2 and 3 in their own mount namespace with an empty tmpfs over the checkpoint
  folder's parent, as on another node with a node-local path (root and unshare; skipped, exit 77,
  otherwise): auto falls back to one file through rank 0 and the start-up line names ranks 2 and 3;
  --checkpoint-format folder and --checkpoint-async are refused before training, naming them.
lock: a second job on a folder another job is using is refused before training, naming the holder
  (its pid), and the first job's checkpoints stay valid; once the first job has ended (or was
  killed with kill -9) the folder is free again.
links: a step folder that is a symbolic link to another run's checkpoint folder (files named as a
  save names them, and an unrelated file) is neither followed nor removed by --keep: every file
  outside stays, the link stays and is named in a warning; a file the user left in a step folder
  stays too.
length: a --checkpoint-dir of 4,033 bytes (one over DDP_CKPT_DIR_MAX) is refused before training,
  naming its length and the limit, on every rank within seconds; 4,032 bytes trains and saves.

Usage: ckpt_place.py MODE DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
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
import trainlib  # noqa: E402

QUICK_S = 30  # a run refused before training takes far less than this


class Tools:
    def __init__(self, argv, tmp):
        self.train, self.ckpt, self.mpi = argv[0], argv[1], argv[2:]
        self.data = os.path.join(tmp, "data")
        trainlib.write_dataset(self.data, 240, 40)

    def cmd(self, ranks, *extra, prefix=()):
        return self.mpi + [str(ranks), *prefix, self.train, "--model", "mlp", "--widths", "784-16-10",
                           "--data", self.data, "--batch", "8", "--epochs", "1000", "--device", "cpu",
                           *extra]


def checkpoints_line(out):
    return next((line for line in out.splitlines() if line.startswith("checkpoints:")), "")


def fmt(chk, tools, tmp):
    folder = os.path.join(tmp, "auto")
    rc, out = trainlib.run(tools.cmd(4, "--max-steps", "6", "--checkpoint-dir", folder,
                                     "--checkpoint-every", "3"), timeout=120)
    step = os.path.join(folder, "step-000000000006.ckpt")
    files = sorted(os.listdir(step)) if os.path.isdir(step) else []
    want = ["MANIFEST"] + [f"rank-{r:05d}-of-00004.ckpt" for r in range(4)]
    chk.check(rc == 0 and files == want, f"auto at 4 ranks on one machine: a folder of per-rank files "
              f"({files})", out)
    line = checkpoints_line(out)
    chk.check("a folder of per-rank files" in line and "every rank (4) sees the folder" in line,
              "auto: the start-up line says which format and why", line or out)
    rc, out = trainlib.run([tools.ckpt, "verify", step], timeout=60)
    chk.check(rc == 0, "auto: ddp-ckpt verify accepts the folder", out)
    # the same step saved again as a file replaces the folder (and a folder replaces a file)
    for kind, check in (("file", os.path.isfile), ("folder", os.path.isdir)):
        rc, out = trainlib.run(tools.cmd(4, "--max-steps", "6", "--checkpoint-dir", folder,
                                         "--checkpoint-format", kind, "--checkpoint-every", "3",
                                         "--resume", os.path.join(folder, "step-000000000003.ckpt")),
                               timeout=120)
        ok = rc == 0 and check(step) and trainlib.run([tools.ckpt, "verify", step], timeout=60)[0] == 0
        chk.check(ok, f"step 6 saved again as a {kind} replaces the other kind", out)
    folder = os.path.join(tmp, "file")
    rc, out = trainlib.run(tools.cmd(2, "--max-steps", "3", "--checkpoint-dir", folder,
                                     "--checkpoint-format", "file"), timeout=120)
    chk.check(rc == 0 and os.path.isfile(os.path.join(folder, "step-000000000003.ckpt")),
              "--checkpoint-format file: one file", out)
    chk.check("one file per checkpoint" in checkpoints_line(out), "file: the start-up line says so", out)


def node_local(chk, tools, tmp):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("skipped: a mount namespace per rank needs root and unshare")
        sys.exit(77)
    local = os.path.join(tmp, "local")
    os.makedirs(local)
    wrap = os.path.join(tmp, "other_node.sh")
    with open(wrap, "w") as f:  # ranks 2 and 3: an empty tmpfs over LOCAL, as on another node
        f.write("#!/bin/sh\n"
                "if [ \"${OMPI_COMM_WORLD_RANK:-0}\" -ge 2 ]; then\n"
                f"  exec unshare -m sh -c 'mount -t tmpfs tmpfs {local} && exec \"$0\" \"$@\"' \"$@\"\n"
                "fi\nexec \"$@\"\n")
    os.chmod(wrap, 0o755)
    folder = os.path.join(local, "ckpt")
    base = ("--max-steps", "4", "--checkpoint-dir", folder, "--checkpoint-every", "2")
    rc, out = trainlib.run(tools.cmd(4, *base, prefix=[wrap]), timeout=120)
    line = checkpoints_line(out)
    chk.check(rc == 0 and os.path.isfile(os.path.join(folder, "step-000000000004.ckpt")),
              "node-local folder, auto: one file through rank 0", out)
    chk.check("one file per checkpoint" in line and "rank(s) 2, 3 do not see the folder" in line,
              "node-local: the start-up line says which and names the ranks that do not see it",
              line or out)
    for extra, flag in ((("--checkpoint-format", "folder"), "--checkpoint-format folder"),
                        (("--checkpoint-async",), "--checkpoint-async")):
        t0 = time.monotonic()
        rc, out = trainlib.run(tools.cmd(4, *base, *extra, prefix=[wrap]), timeout=120)
        took = time.monotonic() - t0
        chk.check(rc != 0 and took < QUICK_S and "epoch 1" not in out and "step 1/" not in out,
                  f"node-local, {flag}: refused before training ({took:.1f} s, exit {rc})", out)
        chk.check(re.search(rf"{flag} needs a --checkpoint-dir every rank sees.*rank\(s\) 2, 3 do not "
                            r"see.*--checkpoint-format file", out) is not None,
                  f"node-local, {flag}: the message names the ranks and the fix", out)


def job_pids(tag):
    return list(trainlib.tagged("DDP_PLACE_TEST", tag))


def start_holder(tools, folder, tag):
    """A job that saves every 200 steps into folder; returns it once its first save is done."""
    env = dict(os.environ, DDP_PLACE_TEST=tag)
    job = subprocess.Popen(tools.cmd(2, "--max-steps", "1000", "--checkpoint-dir", folder,
                                     "--checkpoint-every", "200"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           stdin=subprocess.DEVNULL)
    seen = ""
    for line in job.stdout:
        seen += line
        if line.startswith("checkpoint ") and "(step 200)" in line:
            break
    return job, seen


def lock(chk, tools, tmp):
    try:
        lock_cases(chk, tools, tmp)
    finally:  # a failed check leaves no job behind: every process of both jobs, by pid
        for pid in job_pids("first") + job_pids("killed"):
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def lock_cases(chk, tools, tmp):
    folder = os.path.join(tmp, "shared")
    first, seen = start_holder(tools, folder, "first")
    pids = job_pids("first")
    for pid in pids:  # hold the first job in the middle of its run while the second one starts
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    rc, out = trainlib.run(tools.cmd(2, "--max-steps", "400", "--checkpoint-dir", folder,
                                     "--checkpoint-every", "100"), timeout=120)
    took = time.monotonic() - t0
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    holder = [p for p in pids if str(p) in out]
    chk.check(rc != 0 and took < QUICK_S and "in use by another job" in out and holder,
              f"a second job on the same folder is refused before training, naming the holder's pid "
              f"({took:.1f} s, exit {rc})", out)
    rest, _ = first.communicate(timeout=120)
    chk.check(first.returncode == 0, "the first job goes on and ends well", seen + rest)
    rc, out = trainlib.run([tools.ckpt, "verify", os.path.join(folder, "step-000000001000.ckpt")],
                           timeout=60)
    chk.check(rc == 0, "the first job's last checkpoint is valid", out)
    rc, out = trainlib.run(tools.cmd(2, "--max-steps", "1200", "--checkpoint-dir", folder, "--resume",
                                     "auto"), timeout=120)
    chk.check(rc == 0, "once the first job has ended, the folder is free", out)
    killed, _ = start_holder(tools, os.path.join(tmp, "killed"), "killed")
    for pid in job_pids("killed"):
        os.kill(pid, signal.SIGKILL)
    killed.kill()
    killed.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while job_pids("killed") and time.monotonic() < deadline:
        time.sleep(0.2)
    rc, out = trainlib.run(tools.cmd(2, "--max-steps", "300", "--checkpoint-dir",
                                     os.path.join(tmp, "killed"), "--resume", "auto"), timeout=120)
    chk.check(rc == 0 and "resumed from" in out and "step-000000000200" in out, "after kill -9 of the job that held it, the folder is free "
              "(the lock went with the processes)", out)


def snapshot(root):
    found = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                found[os.path.relpath(os.path.join(d, n), root)] = f.read()
    return found


def links(chk, tools, tmp):
    other = os.path.join(tmp, "other-run")
    os.makedirs(other)
    for name in ("MANIFEST", "rank-00000-of-00002.ckpt", "rank-00001-of-00002.ckpt", "notes.txt"):
        with open(os.path.join(other, name), "w") as f:
            f.write("another run's " + name)
    before = snapshot(other)
    folder = os.path.join(tmp, "ckpt")
    os.makedirs(folder)
    link = os.path.join(folder, "step-000000000001.ckpt")
    os.symlink(other, link)
    mine = os.path.join(folder, "step-000000000002.ckpt")
    os.makedirs(mine)
    with open(os.path.join(mine, "MANIFEST"), "w") as f:
        f.write("stale")
    with open(os.path.join(mine, "my-notes.txt"), "w") as f:
        f.write("the user's")
    rc, out = trainlib.run(tools.cmd(2, "--max-steps", "6", "--checkpoint-dir", folder,
                                     "--checkpoint-every", "2", "--keep", "1"), timeout=120)
    chk.check(rc == 0, "training with --keep 1 beside a linked step folder", out)
    chk.check(snapshot(other) == before, "every file in the linked folder outside is left as it was",
              str(sorted(snapshot(other))))
    chk.check(os.path.islink(link), "the link itself stays (ddp removes nothing it did not write)")
    chk.check(re.search(r"step-000000000001\.ckpt: it is a symbolic link \(to [^)]*other-run\)", out)
              is not None, "the warning names the link and where it points", out)
    chk.check(os.listdir(mine) == ["my-notes.txt"], "a step folder keeps the user's file (only a save's "
              f"files removed: {os.listdir(mine)})", out)
    steps = sorted(n for n in os.listdir(folder) if n.startswith("step-"))
    chk.check("step-000000000006.ckpt" in steps and "step-000000000004.ckpt" not in steps,
              f"--keep 1 still prunes ddp's own checkpoints ({steps})", out)


def length(chk, tools, tmp):
    def deep(total):
        path = tmp
        while len(path) < total:
            path = os.path.join(path, "d" * min(200, total - len(path) - 1))
        return path

    for size, ok in ((4033, False), (4032, True)):
        folder = deep(size)
        assert len(folder) == size, len(folder)
        t0 = time.monotonic()
        rc, out = trainlib.run(tools.cmd(2, "--max-steps", "2", "--checkpoint-dir", folder), timeout=120)
        took = time.monotonic() - t0
        if ok:
            chk.check(rc == 0 and os.path.isdir(os.path.join(folder, "step-000000000002.ckpt")),
                      f"a --checkpoint-dir of {size} bytes trains and saves", out)
        else:
            chk.check(rc != 0 and took < QUICK_S and "step 1/" not in out and "epoch 1" not in out,
                      f"a --checkpoint-dir of {size} bytes is refused before training ({took:.1f} s)",
                      out)
            chk.check(f"the path is {size} bytes, over the 4032" in out,
                      "the message names the length and the limit", out)


def main():
    mode = sys.argv[1]
    modes = {"format": fmt, "node_local": node_local, "lock": lock, "links": links, "length": length}
    if mode not in modes:
        sys.exit(f"unknown mode {mode}: one of {', '.join(modes)}")
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-place-") as tmp:
        modes[mode](chk, Tools(sys.argv[2:], tmp), tmp)
    chk.done()


if __name__ == "__main__":
    main()
