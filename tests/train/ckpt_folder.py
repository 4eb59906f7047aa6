#!/usr/bin/python3
"""ckpt_folder.py - checkpoint folders (--checkpoint-format folder: a file per rank and a MANIFEST
written last by rank 0), under real mpirun with the MLP.

  format    a 2-rank run writing folders trains bit-identically to one writing files, and
            `ddp-ckpt consolidate` of each folder is byte-identical to the file of the same step;
            `ddp-ckpt verify`, `list`, `show` and `diff` take a folder.
  resume    exact: resumed from a folder at the same world size and stage, bit-identical to the
            straight run; resharded: from a 2-rank folder at 1 and 3 ranks (--resume-reshard), and
            from a 2-rank --zero 1 folder at --zero 0 and 2, the same final state as resuming the
            consolidated file the same way (byte-identical --save files).
  faults    --resume auto skips, naming it, a folder without MANIFEST (what a kill -9 during a
            save leaves; only such debris is a fresh start), one whose shard file is missing,
            truncated or from another step, and resumes from the previous checkpoint to the
            straight run's result; the next save's
            --keep removes the folders left without a MANIFEST; a corrupt byte is found by
            `ddp-ckpt verify` and refused by --resume and by `ddp-ckpt show`, `diff` and
            `consolidate` (which read it with --no-verify), naming the file, and --resume auto falls
            back past it to the previous checkpoint (in a folder's shard file and in a single
            file alike).
  async     --checkpoint-async: a run whose folders are written by background threads trains
            bit-identically to one writing files, reports its staging copy, and its folders are
            complete and consolidate byte-identical to the files; SIGTERM during such a run stops
            every rank, the stop's folder is complete, and --resume auto ends bit-identical to an
            uninterrupted run.
  gpt       the tiny GPT (AdamW: adam_m, adam_v) at 2 ranks under --zero 1: folders consolidate
            byte-identical to the files; resumed from a folder at 2 ranks --zero 1 it ends
            bit-identical to the straight run, at 3 ranks --zero 2 and 1 rank (--resume-reshard)
            like the consolidated file.
  disk_full a 512 KiB tmpfs fills up: every rank whose file fails names it and "No space left on
            device", no MANIFEST is written, the previous folders stay valid; exit 1 by default,
            0 with --checkpoint-errors warn. Needs root for mount (skipped without).

Usage: ckpt_folder.py MODE DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import filecmp
import os
import re
import shutil
import subprocess
import sys
import signal
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import gpt_train  # noqa: E402
import signal_stop  # noqa: E402
import trainlib  # noqa: E402

EVERY = 7  # 480 samples, 2 ranks x batch 8 x accum 2: 15 steps per epoch, 45 in all


def name(step):
    return f"step-{step:012d}.ckpt"


class Run:
    def __init__(self, exe, ckpt, mpi, tmp):
        self.exe, self.ckpt, self.mpi, self.tmp = exe, ckpt, mpi, tmp
        self.data = os.path.join(tmp, "data")
        trainlib.write_dataset(self.data, 480, 60)

    def train(self, extra=(), ranks=2):
        cmd = self.mpi + [str(ranks), self.exe, "--model", "mlp", "--widths", "784-32-10", "--data",
                          self.data, "--epochs", "3", "--batch", "8", "--accum", "2", "--augment",
                          "--lr-schedule", "cosine", "--device", "cpu", "--log-every", "100", *extra]
        return trainlib.run(cmd, timeout=300)

    def tool(self, *args):
        rc, out = trainlib.run([self.ckpt, *args], timeout=60)
        print(out.strip())
        return rc, out

    def straight(self, chk, tag, extra=()):
        """A run writing checkpoints every EVERY steps into TMP/TAG and its --save TMP/TAG.ckpt."""
        folder, save = os.path.join(self.tmp, tag), os.path.join(self.tmp, tag + ".ckpt")
        if not os.path.exists(save):
            rc, out = self.train(["--checkpoint-dir", folder, "--checkpoint-every", str(EVERY),
                                  "--keep", "100", "--save", save, *extra])
            chk.check(rc == 0, f"straight run {tag}: exit status {rc}", out)
        return folder, save


def same_file(chk, a, b, what):
    chk.check(os.path.exists(a) and os.path.exists(b) and filecmp.cmp(a, b, shallow=False),
              f"{what}: {os.path.basename(a)} and {os.path.basename(b)} byte-identical")


def check_format(chk, r):
    files, files_save = r.straight(chk, "file", ["--checkpoint-format", "file"])
    folders, folders_save = r.straight(chk, "folder", ["--checkpoint-format", "folder"])
    same_file(chk, files_save, folders_save, "writing folders changes no step of training")
    for step in (21, 45):
        path = os.path.join(folders, name(step))
        chk.check(os.path.isdir(path) and sorted(os.listdir(path)) ==
                  ["MANIFEST", "rank-00000-of-00002.ckpt", "rank-00001-of-00002.ckpt"],
                  f"{name(step)} is a folder of 2 rank files and a MANIFEST", str(os.listdir(path)))
        out_file = os.path.join(r.tmp, f"consolidated-{step}.ckpt")
        rc, out = r.tool("consolidate", path, out_file)
        chk.check(rc == 0, f"ddp-ckpt consolidate {name(step)}", out)
        same_file(chk, out_file, os.path.join(files, name(step)), f"consolidated step {step}")
    path = os.path.join(folders, name(21))
    rc, out = r.tool("verify", path)
    chk.check(rc == 0 and "valid" in out, "ddp-ckpt verify: a complete folder is valid", out)
    rc, out = r.tool("list", path)
    chk.check(rc == 0 and "step 21, 2 files" in out and "rank-00001-of-00002.ckpt" in out,
              "ddp-ckpt list FOLDER names its files", out)
    rc, out = r.tool("list", folders)
    chk.check(rc == 0 and out.count("folder complete") == 7, "ddp-ckpt list DIR: 7 complete folders", out)
    rc, out = r.tool("show", path)
    chk.check(rc == 0 and "fc1.weight" in out and "momentum: 25450 float32 values" in out and
              "step = 21" in out, "ddp-ckpt show FOLDER: signature and state", out)
    rc, out = r.tool("diff", path, os.path.join(files, name(21)))
    chk.check(rc == 0 and "max_abs_diff=0 " in out, "ddp-ckpt diff FOLDER FILE: the same values", out)


def resume_pair(chk, r, src_folder, src_file, tag, ranks, extra):
    """Resumes from the folder and from the consolidated file alike; the --save files must agree."""
    saves = []
    for kind, src in (("folder", src_folder), ("file", src_file)):
        save = os.path.join(r.tmp, f"{tag}-{kind}.ckpt")
        rc, out = r.train(["--checkpoint-dir", os.path.join(r.tmp, f"{tag}-{kind}"), "--resume", src,
                           "--save", save, *extra], ranks=ranks)
        chk.check(rc == 0 and "resumed from" in out, f"{tag}: resumed from the {kind}", out)
        saves.append(save)
    same_file(chk, saves[0], saves[1], f"{tag}: folder and consolidated file resume alike")


def check_resume(chk, r):
    _, files_save = r.straight(chk, "file", ["--checkpoint-format", "file"])
    folders, _ = r.straight(chk, "folder", ["--checkpoint-format", "folder"])
    src = os.path.join(folders, name(21))
    save = os.path.join(r.tmp, "exact.ckpt")
    rc, out = r.train(["--checkpoint-dir", os.path.join(r.tmp, "exact"), "--checkpoint-format", "folder",
                       "--resume", src, "--save", save])
    chk.check(rc == 0 and f"resumed from {src} at step 21" in out, "exact: resumed from the folder", out)
    same_file(chk, save, files_save, "exact resume from a folder (2 ranks, same stage)")
    consolidated = os.path.join(r.tmp, "c21.ckpt")
    r.tool("consolidate", src, consolidated)
    for ranks in (1, 3):
        resume_pair(chk, r, src, consolidated, f"reshard-{ranks}", ranks, ["--resume-reshard"])
    zfolders, _ = r.straight(chk, "zero1", ["--checkpoint-format", "folder", "--zero", "1"])
    zsrc, zfile = os.path.join(zfolders, name(21)), os.path.join(r.tmp, "z21.ckpt")
    r.tool("consolidate", zsrc, zfile)
    for stage in ("0", "2"):
        resume_pair(chk, r, zsrc, zfile, f"zero1-to-{stage}", 2, ["--zero", stage])


def auto_resume(chk, r, folder, what, want_in_out, files_save, fmt=("--checkpoint-format", "folder")):
    save = os.path.join(r.tmp, "auto.ckpt")
    rc, out = r.train(["--checkpoint-dir", folder, *fmt, "--resume", "auto", "--save", save])
    chk.check(rc == 0 and want_in_out in out and f"resumed from {folder}/{name(42)} at step 42" in out,
              f"{what}: skipped, naming {os.path.basename(want_in_out)}; resumed from step 42", out)
    same_file(chk, save, files_save, f"{what}: the result equals the straight run")
    return out


def flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def corrupt_reads(chk, r, folder, victim, intact):
    """ddp-ckpt show, diff and consolidate verify a folder as --resume does: a corrupt byte in a
    shard file is refused naming the file (diff used to report a tiny difference and exit 0);
    --no-verify reads it anyway."""
    out_file = os.path.join(r.tmp, "corrupt-consolidated.ckpt")
    for args in (["show", folder], ["diff", folder, intact], ["consolidate", folder, out_file]):
        rc, out = r.tool(*args)
        chk.check(rc == 2 and f"checksum mismatch: {victim} is corrupt" in out and "--no-verify" in out
                  and "max_abs_diff" not in out and not os.path.exists(out_file),
                  f"ddp-ckpt {args[0]}: a corrupt folder is refused naming the file", out)
        rc, out = r.tool(args[0], "--no-verify", *args[1:])
        chk.check(rc == 0 and "checksum mismatch" not in out, f"ddp-ckpt {args[0]} --no-verify reads it", out)
    rc, out = r.tool("diff", "--no-verify", folder, intact)
    m = re.search(r"max_abs_diff=(\S+)", out)
    chk.check(m is not None and float(m.group(1)) > 0, "diff --no-verify shows the corrupt value", out)
    os.unlink(out_file)


def check_faults(chk, r):
    files, files_save = r.straight(chk, "file", ["--checkpoint-format", "file"])
    folders, _ = r.straight(chk, "folder", ["--checkpoint-format", "folder"])

    def fresh(tag):
        dst = os.path.join(r.tmp, tag)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(folders, dst)
        return dst, os.path.join(dst, name(45))

    d, newest = fresh("killed")
    os.unlink(os.path.join(newest, "MANIFEST"))  # what a kill -9 during the save leaves
    debris = os.path.join(d, name(44))
    os.mkdir(debris)
    shutil.copy(os.path.join(newest, "rank-00000-of-00002.ckpt"), debris)
    auto_resume(chk, r, d, "no MANIFEST", f"skipping {newest}", files_save)
    chk.check(not os.path.exists(debris), "the next save's --keep removed the folder without MANIFEST")
    chk.check(os.path.exists(os.path.join(newest, "MANIFEST")), "the rewritten step 45 is complete")

    # A kill during the very first save leaves only debris: no checkpoint yet, a fresh start.
    d = os.path.join(r.tmp, "killed-first")
    os.makedirs(os.path.join(d, name(7)))
    shutil.copy(os.path.join(folders, name(7), "rank-00000-of-00002.ckpt"), os.path.join(d, name(7)))
    save = os.path.join(r.tmp, "auto-first.ckpt")
    rc, out = r.train(["--checkpoint-dir", d, "--checkpoint-format", "folder", "--checkpoint-every", str(EVERY),
                       "--resume", "auto", "--save", save])
    chk.check(rc == 0 and f"skipping {d}/{name(7)}" in out and "starting fresh" in out,
              "only a folder without MANIFEST: --resume auto skips it and starts fresh", out)
    same_file(chk, save, files_save, "only debris: the fresh run equals the straight run")

    d, newest = fresh("missing")
    victim = os.path.join(newest, "rank-00001-of-00002.ckpt")
    os.unlink(victim)
    auto_resume(chk, r, d, "a missing shard file", victim, files_save)

    d, newest = fresh("truncated")
    victim = os.path.join(newest, "rank-00000-of-00002.ckpt")
    os.truncate(victim, os.path.getsize(victim) - 100)
    auto_resume(chk, r, d, "a truncated shard file", victim, files_save)

    d, newest = fresh("other-step")
    victim = os.path.join(newest, "rank-00001-of-00002.ckpt")
    shutil.copy(os.path.join(d, name(42), "rank-00001-of-00002.ckpt"), victim)
    auto_resume(chk, r, d, "a shard file of another step", victim, files_save)

    d, newest = fresh("corrupt")
    victim = os.path.join(newest, "rank-00001-of-00002.ckpt")
    flip_byte(victim, 4096)
    rc, out = r.tool("verify", newest)
    chk.check(rc == 2 and victim in out, "ddp-ckpt verify: a corrupt byte, naming the file", out)
    corrupt_reads(chk, r, newest, victim, os.path.join(folders, name(45)))
    rc, out = r.train(["--checkpoint-dir", d, "--resume", newest])
    chk.check(rc != 0 and f"checksum mismatch: {victim}" in out and "epoch 3:" not in out,
              "--resume of a corrupt folder is refused naming the file", out)
    # Its MANIFEST is fine: the flipped byte shows only when the ranks check the files' CRCs, and
    # --resume auto must then fall back as for a missing file.
    out = auto_resume(chk, r, d, "a corrupt byte in a shard file", f"checksum mismatch: {victim}", files_save)
    chk.check(f"skipping {newest}" in out, "a corrupt byte: --resume auto says it skips the folder", out)

    # The same in a single-file checkpoint (its CRC is checked when rank 0 reads it whole).
    d = os.path.join(r.tmp, "corrupt-file")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(files, d)
    victim = os.path.join(d, name(45))
    flip_byte(victim, 4096)
    auto_resume(chk, r, d, "a corrupt byte in a single-file checkpoint", f"checksum mismatch: {victim}",
                files_save, fmt=())


def check_async(chk, r):
    files, files_save = r.straight(chk, "file", ["--checkpoint-format", "file"])
    folder, save = os.path.join(r.tmp, "async"), os.path.join(r.tmp, "async.ckpt")
    rc, out = r.train(["--checkpoint-dir", folder, "--checkpoint-every", str(EVERY), "--keep", "100",
                       "--checkpoint-format", "folder", "--checkpoint-async", "--save", save])
    chk.check(rc == 0 and "--checkpoint-async: each rank copies its shard to host memory" in out and
              "MiB on rank 0" in out, "async run: exit 0, the staging copy reported", out)
    chk.check(out.count("written in the background in") == 6, "6 saves written in the background "
              "(the one at the end at once)", out)
    same_file(chk, save, files_save, "async saves change no step of training")
    for step in (7, 21, 42, 45):
        path = os.path.join(folder, name(step))
        rc, out = r.tool("verify", path)
        chk.check(rc == 0, f"async: {name(step)} is complete and valid", out)
    consolidated = os.path.join(r.tmp, "async-21.ckpt")
    r.tool("consolidate", os.path.join(folder, name(21)), consolidated)
    same_file(chk, consolidated, os.path.join(files, name(21)), "async: consolidated step 21")
    async_stop(chk, r)


def async_stop(chk, r):
    """SIGTERM to every rank of an async run: the stop's save waits for the one in flight, then is
    written; --resume auto continues bit-identically. The planned steps are signal_stop.py's
    (fewer under the sanitizers, where each step is slower: it says why)."""
    folder = os.path.join(r.tmp, "async-term")
    common = ["--model", "mlp", "--widths", "784-128-10", "--data", r.data, "--batch", "32", "--epochs",
              "100000", "--max-steps", str(signal_stop.TERM_STEPS), "--device", "cpu", "--log-every", "10"]
    tag = f"{os.getpid()}-async-term"
    job = signal_stop.start(r.mpi + ["2", r.exe, *common, "--checkpoint-dir", folder, "--checkpoint-every",
                                     "100", "--keep", "100", "--checkpoint-format", "folder",
                                     "--checkpoint-async"], tag)
    first = os.path.join(folder, name(100), "MANIFEST")
    chk.check(signal_stop.wait_for(lambda: os.path.exists(first), 60), "the async run wrote step 100")
    pids = signal_stop.rank_pids(tag, os.path.basename(r.exe))
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    out = signal_stop.finish(chk, job, pids, 60)
    chk.check(job.returncode == 0, f"async SIGTERM: job exits 0 (status {job.returncode})", out)
    step = signal_stop.check_same_stop(chk, out, "SIGTERM", folder)
    rc, vout = r.tool("verify", os.path.join(folder, name(step)))
    chk.check(rc == 0, f"async SIGTERM: the stop's folder (step {step}) is complete", vout)
    resumed, straight = os.path.join(r.tmp, "async-resumed.ckpt"), os.path.join(r.tmp, "async-straight.ckpt")
    rc, out = trainlib.run(r.mpi + ["2", r.exe, *common, "--checkpoint-dir", folder, "--checkpoint-format",
                                    "folder", "--resume", "auto", "--save", resumed], timeout=300)
    chk.check(rc == 0 and f"at step {step} " in out, f"--resume auto continues from step {step}", out)
    rc, out = trainlib.run(r.mpi + ["2", r.exe, *common, "--save", straight], timeout=300)
    same_file(chk, resumed, straight, "async: stopped + resumed == uninterrupted")


def check_gpt(chk, r):
    data = gpt_train.write_data(r.tmp)

    def gpt(tag, ranks, extra):
        save = os.path.join(r.tmp, tag + ".ckpt")
        rc, out = trainlib.run(r.mpi + [str(ranks)] + gpt_train.tiny(r.exe, data, 12, extra + ["--save", save]),
                               timeout=300)
        chk.check(rc == 0, f"gpt {tag}: exit status {rc}", out)
        return save

    every = ["--checkpoint-every", "5", "--keep", "100", "--zero", "1"]
    files, folders = os.path.join(r.tmp, "gpt-files"), os.path.join(r.tmp, "gpt-folders")
    straight = gpt("gpt-file", 2, ["--checkpoint-dir", files, "--checkpoint-format", "file"] + every)
    gpt("gpt-folder", 2, ["--checkpoint-dir", folders, "--checkpoint-format", "folder"] + every)
    src, consolidated = os.path.join(folders, name(5)), os.path.join(r.tmp, "gpt-5.ckpt")
    rc, out = r.tool("consolidate", src, consolidated)
    same_file(chk, consolidated, os.path.join(files, name(5)), "gpt: consolidated step 5 (adam_m, adam_v)")
    resumed = gpt("gpt-resumed", 2, ["--zero", "1", "--resume", src])
    same_file(chk, resumed, straight, "gpt: resumed from the folder at 2 ranks --zero 1 == straight")
    for ranks, stage in ((3, "2"), (1, "0")):
        a = gpt(f"gpt-r{ranks}-folder", ranks, ["--zero", stage, "--resume", src, "--resume-reshard"])
        b = gpt(f"gpt-r{ranks}-file", ranks, ["--zero", stage, "--resume", consolidated, "--resume-reshard"])
        same_file(chk, a, b, f"gpt: {ranks} rank(s) --zero {stage} resume the folder like the file")


def disk_full_run(chk, r, mnt, policy):
    folder = os.path.join(mnt, policy)
    rc, out = r.train(["--checkpoint-dir", folder, "--checkpoint-format", "folder", "--checkpoint-every",
                       "5", "--max-steps", "30", "--checkpoint-errors", policy])
    want = 1 if policy == "stop" else 0
    chk.check(rc == want, f"disk full, --checkpoint-errors {policy}: exit status {rc} (want {want})", out)
    failed = os.path.join(folder, name(15))
    chk.check(f"{failed}/rank-0000" in out and "No space left on device" in out,
              f"{policy}: the failed write names its file and the reason", out)
    chk.check(not os.path.exists(os.path.join(failed, "MANIFEST")), f"{policy}: no MANIFEST for step 15")
    for step in (5, 10):
        rc2, out2 = r.tool("verify", os.path.join(folder, name(step)))
        chk.check(rc2 == 0, f"{policy}: the checkpoint of step {step} is still valid", out2)


def check_disk_full(chk, r):
    mnt = os.path.join(r.tmp, "mnt")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", mnt]).returncode != 0:
        print("cannot mount a tmpfs (needs root): skipped")
        sys.exit(77)
    try:
        for policy in ("stop", "warn"):
            disk_full_run(chk, r, mnt, policy)
            shutil.rmtree(os.path.join(mnt, policy), ignore_errors=True)
    finally:
        subprocess.run(["umount", mnt])


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    mode, exe, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory() as tmp:
        r = Run(exe, ckpt, mpi, tmp)
        {"format": check_format, "resume": check_resume, "faults": check_faults, "async": check_async, "gpt": check_gpt,
         "disk_full": check_disk_full}[mode](chk, r)
    chk.done()


if __name__ == "__main__":
    main()
