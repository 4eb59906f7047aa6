#!/usr/bin/python3
"""fault_campaign.py - what a fault campaign found, as two modes:

files: --save and --trace only ever replace a regular file. A character device (made with mknod in
  a temporary folder; root only, skipped with a message otherwise), a FIFO, a socket, a folder and a
  dangling symbolic link are refused before training (exit 1, the message names the path and what it
  is, no epoch runs, the special file is left as it was, nothing is created where a dangling link
  points); a symbolic link to a regular file is followed: that file gets the checkpoint or the trace,
  the link stays. The library refuses the same files by itself: ddp_state_save called through
  ctypes, as a program that skipped ddp-train's check would, leaves each special file as it was.
reads: a FIFO in place of a checkpoint folder's shard file, of its MANIFEST and of a single
  checkpoint file: every ddp-ckpt command (show, diff, verify, list, consolidate, export-llmc) and
  ddp-train --resume exit non-zero within seconds (a hang is cut at READ_S and fails), the message
  naming the FIFO, saying it is not a regular file and what to do; --resume auto skips the folder
  with the FIFO, naming it, and resumes from the checkpoint before.
metrics: --metrics in a folder that does not exist creates it (as --checkpoint-dir is created),
  and one that cannot be created is refused naming it. A tiny GPT at 2 ranks writing a line per
  step is killed with SIGKILL just after a checkpoint: the file ends with a whole line and holds
  every step up to that checkpoint (those are never run again). A torn last line (what a kill inside
  a write leaves: the test appends one) is cut off when --resume appends, with a note, so every line
  of the file parses as JSON, the restart line included, and every step is in it.
timeout: an invalid DDP_TIMEOUT (0, -5, abc, 20s, nan, inf) ends the run before training on every
  rank, non-zero and within seconds, with a message naming the variable, the value and the allowed
  range; a valid one (2.5) trains.

Usage: fault_campaign.py files|reads|metrics|timeout DDP_TRAIN DDP_CKPT LIBDDP MPIRUN MPIRUN_ARGS... (the
last of which is -np)
"""
import ctypes
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402
from ckpt_kill_async import Job  # noqa: E402
from gpt_train import tiny, write_data  # noqa: E402

QUICK_S = 30  # a run refused before training takes far less than this
READ_S = 20  # a special file is refused at once: a read that hangs is cut here and fails
FIFO_WORDS = ["is a FIFO (named pipe), not a regular file", "put the regular file back"]


class Tools:
    def __init__(self, argv, tmp):
        self.train, self.ckpt, self.libddp, self.mpi = argv[0], argv[1], argv[2], argv[3:]
        self.data = os.path.join(tmp, "data")
        trainlib.write_dataset(self.data, 240, 40)

    def cmd(self, *extra):
        return self.mpi + ["2", self.train, "--model", "mlp", "--widths", "784-16-10", "--data", self.data,
                           "--batch", "8", "--max-steps", "4", "--epochs", "1", "--device", "cpu", *extra]


def snapshot(path):
    """What is at path without following a link: (kind, detail) to compare before and after."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ("missing", None)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("folder", sorted(os.listdir(path)))
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            return ("file", f.read())
    return (stat.S_IFMT(st.st_mode), st.st_rdev)


def make_specials(folder):
    """{name: (path, words the refusal must hold)} of the files that must never be replaced; the
    socket stays bound while the returned socket object lives."""
    os.makedirs(folder)
    made, keep = {}, None
    dev = os.path.join(folder, "null-like")
    if os.geteuid() == 0:
        try:
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the numbers of /dev/null
            made["character device"] = (dev, ["is a character device"])
        except OSError as e:
            print(f"skipped: the character device case: mknod failed ({e})")
    else:
        print("skipped: the character device case: mknod needs root")
    fifo = os.path.join(folder, "fifo")
    os.mkfifo(fifo)
    made["FIFO"] = (fifo, ["is a FIFO"])
    sock_path = os.path.join(folder, "sock")
    keep = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    keep.bind(sock_path)
    made["socket"] = (sock_path, ["is a socket"])
    sub = os.path.join(folder, "folder")
    os.makedirs(sub)
    made["folder"] = (sub, ["is a folder"])
    dangling = os.path.join(folder, "dangling")
    os.symlink(os.path.join(folder, "nowhere", "x.ckpt"), dangling)
    made["dangling symbolic link"] = (dangling, ["does not exist (a dangling link)"])
    return made, keep


def refused_by_train(chk, tools, flag, kind, path, words):
    before = snapshot(path)
    t0 = time.monotonic()
    rc, out = trainlib.run(tools.cmd(flag, path), timeout=120)
    took = time.monotonic() - t0
    chk.check(rc == 1 and took < QUICK_S, f"{flag} {kind}: exit 1 within seconds (exit {rc}, {took:.1f} s)", out)
    chk.check(all(w in out for w in [f"{flag} {path}"] + words) and "before training" in out,
              f"{flag} {kind}: the message names the path and says {' / '.join(words)}", out)
    chk.check("epoch 1:" not in out, f"{flag} {kind}: refused before training", out)
    chk.check(snapshot(path) == before, f"{flag} {kind}: left as it was")
    if kind == "dangling symbolic link":
        chk.check(not os.path.exists(os.path.dirname(os.readlink(path))),
                  f"{flag} {kind}: nothing created where it points")


def followed_link(chk, tools, tmp):
    """--save and --trace through links to regular files: the targets are replaced, the links stay."""
    real_ckpt, real_trace = os.path.join(tmp, "real.ckpt"), os.path.join(tmp, "real.json")
    link_ckpt, link_trace = os.path.join(tmp, "link.ckpt"), os.path.join(tmp, "link.json")
    for real, link in ((real_ckpt, link_ckpt), (real_trace, link_trace)):
        with open(real, "w") as f:
            f.write("old contents\n")
        os.symlink(os.path.basename(real), link)  # relative, as people make them
    rc, out = trainlib.run(tools.cmd("--save", link_ckpt, "--trace", link_trace), timeout=120)
    chk.check(rc == 0 and "epoch 1:" in out, "--save and --trace through symbolic links: training runs", out)
    chk.check(snapshot(link_ckpt) == ("link", "real.ckpt") and snapshot(link_trace) == ("link", "real.json"),
              "the links are still links to their files")
    rc, show = trainlib.run([tools.ckpt, "show", real_ckpt], timeout=30)
    chk.check(rc == 0 and "momentum" in show, "--save wrote the checkpoint into the file the link points to", show)
    try:
        with open(real_trace) as f:
            fmt = json.load(f)["otherData"]["format"]
    except (OSError, ValueError, KeyError) as e:
        fmt = repr(e)
    chk.check(fmt == "ddp-trace", f"--trace wrote the trace into the file the link points to ({fmt})")
    left = sorted(n for n in os.listdir(tmp) if ".tmp" in n)
    chk.check(not left, f"no temporary file left ({left})")


class ParamDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 48), ("n_dims", ctypes.c_int), ("shape", ctypes.c_int64 * 4)]


def refused_by_library(chk, libddp, specials):
    """ddp_state_save on each special file: DDP_ERR_INVALID_ARG (1) and the file left as it was. A
    sanitizer build's libddp needs the sanitizer runtime loaded first, which Python has not: there
    only ddp-train's refusals above are checked (the plain build checks the library too)."""
    try:
        lib = ctypes.CDLL(libddp)
    except OSError as e:
        if "__asan" not in str(e) and "__ubsan" not in str(e):
            raise
        print(f"library checks not run in this sanitizer build: Python cannot load {libddp} ({e})")
        return
    lib.ddp_state_create.argtypes = [ctypes.POINTER(ParamDesc), ctypes.c_int, ctypes.POINTER(ctypes.c_float),
                                     ctypes.POINTER(ctypes.c_void_p)]
    lib.ddp_state_save.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ddp_state_destroy.argtypes = [ctypes.c_void_p]
    desc = ParamDesc(b"w", 1, (ctypes.c_int64 * 4)(3, 0, 0, 0))
    values = (ctypes.c_float * 3)(1.0, 2.0, 3.0)
    state = ctypes.c_void_p()
    if not chk.check(lib.ddp_state_create(ctypes.byref(desc), 1, values, ctypes.byref(state)) == 0,
                     "library: ddp_state_create"):
        return
    for kind, (path, _) in specials.items():
        before = snapshot(path)
        rc = lib.ddp_state_save(state, path.encode())
        chk.check(rc == 1 and snapshot(path) == before,
                  f"library: ddp_state_save refuses the {kind} (status {rc}, want 1) and leaves it as it was")
    lib.ddp_state_destroy(state)


def files(chk, tools, tmp):
    specials, keep = make_specials(os.path.join(tmp, "special"))
    for kind, (path, words) in specials.items():
        for flag in ("--save", "--trace"):
            refused_by_train(chk, tools, flag, kind, path, words)
    refused_by_library(chk, tools.libddp, specials)
    keep.close()
    followed_link(chk, tools, tmp)


def release(fifo):
    """Opens the FIFO for writing and closes it: a reader blocked in open() (the bug) gets end of
    file and goes, instead of staying behind the test forever."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody is reading it: nothing blocked


def refused_at_once(chk, cmd, fifo, what):
    """cmd ends non-zero within seconds, naming the FIFO and saying what it is and what to do."""
    t0 = time.monotonic()
    rc, out = trainlib.run(cmd, timeout=READ_S)
    took = time.monotonic() - t0
    release(fifo)
    chk.check(rc not in (0, -999) and took < READ_S / 2,
              f"{what}: exit non-zero within seconds (exit {rc}, {took:.1f} s)", out)
    chk.check(all(w in out for w in [fifo] + FIFO_WORDS),
              f"{what}: names {fifo}, says it is a FIFO, not a regular file, and what to do", out)


def fifo_in_place(path):
    """Replaces the file at path by a FIFO (a named pipe nobody writes); returns path."""
    os.remove(path)
    os.mkfifo(path)
    return path


def special_reads(chk, tools, tmp):
    ckdir, save = os.path.join(tmp, "ck"), os.path.join(tmp, "final.ckpt")
    rc, out = trainlib.run(tools.cmd("--checkpoint-dir", ckdir, "--checkpoint-every", "2",
                                     "--checkpoint-format", "folder", "--save", save), timeout=120)
    chk.check(rc == 0, f"a run writing checkpoint folders at steps 2 and 4: exit {rc}", out)
    step4 = "step-000000000004.ckpt"
    shard_dir, manifest_dir = os.path.join(tmp, "fifo_shard"), os.path.join(tmp, "fifo_manifest")
    shutil.copytree(ckdir, shard_dir)  # --resume auto below: step 2 intact, step 4 not
    shutil.copytree(ckdir, manifest_dir)
    shard = fifo_in_place(os.path.join(shard_dir, step4, "rank-00001-of-00002.ckpt"))
    manifest = fifo_in_place(os.path.join(manifest_dir, step4, "MANIFEST"))
    single = os.path.join(tmp, "fifo.ckpt")
    os.mkfifo(single)
    out_file = os.path.join(tmp, "out.bin")
    for fifo, path, what in ((shard, os.path.dirname(shard), "a shard file"),
                             (manifest, os.path.dirname(manifest), "a folder's MANIFEST"),
                             (single, single, "a single checkpoint file")):
        folder = path != fifo
        cmds = [["show", path], ["diff", path, save], ["verify", path], ["export-llmc", path, out_file]]
        cmds += [["list", path], ["consolidate", path, out_file]] if folder else []
        for args in cmds:
            refused_at_once(chk, [tools.ckpt] + args, fifo, f"FIFO as {what}: ddp-ckpt {args[0]}")
        refused_at_once(chk, tools.cmd("--resume", path), fifo, f"FIFO as {what}: ddp-train --resume")
    t0 = time.monotonic()
    rc, out = trainlib.run(tools.cmd("--checkpoint-dir", shard_dir, "--checkpoint-format", "folder",
                                     "--resume", "auto"), timeout=READ_S * 3)
    release(shard)
    chk.check(time.monotonic() - t0 < READ_S * 2 and "epoch 1:" in out,
              "--resume auto past a folder with a FIFO: trains on", out)
    # its save of step 4 neither removes nor replaces the FIFO (ddp removes only what it wrote):
    # refused naming it, exit 1, the FIFO left where it was
    chk.check(rc == 1 and re.search(rf"{re.escape(shard)} is a FIFO", out) is not None
              and stat.S_ISFIFO(os.lstat(shard).st_mode),
              f"... and its save of step 4 leaves the FIFO in place, refused naming it (exit {rc})", out)
    chk.check(f"skipping {os.path.dirname(shard)}" in out and all(w in out for w in FIFO_WORDS)
              and "step 2" in out,
              "--resume auto: the folder with the FIFO is skipped naming it, step 2's is resumed", out)


GPT_STEPS, GPT_EVERY = 60, 10


def metrics_lines(path):
    """(the lines of the metrics file, whether it ends with a newline, the lines that are no JSON)."""
    with open(path) as f:
        text = f.read()
    lines = text.splitlines()
    bad = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            bad.append(line)
    return lines, text.endswith("\n"), bad


def steps_in(lines):
    """The steps that have a per-step line (that parses)."""
    steps = set()
    for line in lines:
        try:
            steps.add(json.loads(line).get("step"))
        except ValueError:
            pass
    return steps - {None}


def newest_checkpoint(folder):
    steps = [int(n[5:17]) for n in os.listdir(folder) if n.startswith("step-") and n.endswith(".ckpt")]
    return max(steps, default=0)


def metrics_killed(chk, tools, tmp):
    """kill -9 just after the checkpoint of step GPT_EVERY * 2; returns the metrics path, the data
    and the checkpoint folder."""
    data, ckdir = write_data(tmp), os.path.join(tmp, "gpt_ck")
    metrics = os.path.join(tmp, "runs", "new", "metrics.jsonl")  # runs/new does not exist yet
    args = ["--checkpoint-dir", ckdir, "--checkpoint-every", str(GPT_EVERY), "--metrics", metrics]
    job = Job(tools.mpi + ["2"] + tiny(tools.train, data, GPT_STEPS, args), "metrics-kill",
              os.path.join(tmp, "killed.log"))
    target = os.path.join(ckdir, f"step-{2 * GPT_EVERY:012d}.ckpt")
    deadline = time.monotonic() + 120
    while not os.path.exists(target) and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    job.kill_everything()
    out = job.output()
    chk.check(os.path.exists(target) and "step 60/60" not in out,
              f"the GPT run was killed with SIGKILL after its step {2 * GPT_EVERY} checkpoint", out)
    chk.check(os.path.isfile(metrics), "--metrics in a missing folder: the folder and file are created", out)
    if not os.path.isfile(metrics):
        return None, data, ckdir
    lines, ended, bad = metrics_lines(metrics)
    saved = newest_checkpoint(ckdir)
    missing = sorted(set(range(1, saved + 1)) - steps_in(lines))
    chk.check(ended and not bad, f"after kill -9: every line of --metrics is whole JSON ({len(lines)} "
              f"lines, ends with a newline: {ended}, bad: {bad[-1:]})")
    chk.check(saved >= 2 * GPT_EVERY and not missing,
              f"after kill -9: a line for every step up to the checkpoint of step {saved} (missing "
              f"{missing[:5]}{'...' if len(missing) > 5 else ''})")
    return metrics, data, ckdir


def metrics_resumed(chk, tools, metrics, data, ckdir):
    """A torn last line appended, the run resumed to its end: every line is JSON, every step is in."""
    with open(metrics, "a") as f:
        f.write('{"step":999,"train_lo')  # a kill inside a write
    args = ["--checkpoint-dir", ckdir, "--checkpoint-every", str(GPT_EVERY), "--metrics", metrics,
            "--resume", "auto"]
    rc, out = trainlib.run(tools.mpi + ["2"] + tiny(tools.train, data, GPT_STEPS, args), timeout=300)
    chk.check(rc == 0, f"resumed to the end: exit {rc}", out)
    chk.check("its last line was cut off" in out and metrics in out,
              "the resumed run notes that it cut the torn last line off", out)
    lines, ended, bad = metrics_lines(metrics)
    missing = sorted(set(range(1, GPT_STEPS + 1)) - steps_in(lines))
    chk.check(ended and not bad, f"after the resume every line parses as JSON ({len(lines)} lines, "
              f"bad: {bad[:1]})")
    chk.check(any('"restart":true' in line for line in lines) and '"summary":true' in lines[-1]
              and not missing and 999 not in steps_in(lines),
              f"the restart line, every step 1..{GPT_STEPS} (missing {missing[:5]}) and the summary")


def metrics_folder_refused(chk, tools, tmp):
    """A folder for --metrics that cannot be created (a file is in the way): refused, named."""
    blocker = os.path.join(tmp, "a_file")
    open(blocker, "w").close()
    path = os.path.join(blocker, "sub", "metrics.jsonl")
    t0 = time.monotonic()
    rc, out = trainlib.run(tools.cmd("--metrics", path), timeout=120)
    took = time.monotonic() - t0
    chk.check(rc == 1 and took < QUICK_S and "epoch 1:" not in out,
              f"--metrics under a regular file: exit 1 before training (exit {rc}, {took:.1f} s)", out)
    chk.check(f"--metrics {path}: cannot create its folder: Not a directory" in out,
              "--metrics under a regular file: the message names the path and the reason", out)


def metrics(chk, tools, tmp):
    metrics_folder_refused(chk, tools, tmp)
    path, data, ckdir = metrics_killed(chk, tools, tmp)
    if path:
        metrics_resumed(chk, tools, path, data, ckdir)


def bad_timeout(chk, tools):
    mpi = tools.mpi[:-1] + ["-x", "DDP_TIMEOUT", tools.mpi[-1]]
    for value in ("0", "-5", "abc", "20s", "nan", "inf"):
        t0 = time.monotonic()
        rc, out = trainlib.run(mpi + tools.cmd()[len(tools.mpi):], timeout=120,
                               env=dict(os.environ, DDP_TIMEOUT=value))
        took = time.monotonic() - t0
        chk.check(rc not in (0, -999) and took < QUICK_S,
                  f"DDP_TIMEOUT={value}: exit non-zero within seconds (exit {rc}, {took:.1f} s)", out)
        said = [line for line in out.splitlines()
                if f"DDP_TIMEOUT='{value}'" in line and "from 0.1 to 604800" in line]
        chk.check(len(said) == 2, f"DDP_TIMEOUT={value}: both ranks name the variable, the value and the "
                  f"allowed range ({len(said)} lines)", out)
        chk.check("epoch 1:" not in out, f"DDP_TIMEOUT={value}: refused before training", out)
    rc, out = trainlib.run(mpi + tools.cmd()[len(tools.mpi):], timeout=120, env=dict(os.environ, DDP_TIMEOUT="2.5"))
    chk.check(rc == 0 and "epoch 1:" in out, "DDP_TIMEOUT=2.5 trains", out)


def main():
    mode = sys.argv[1]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-fault-") as tmp:
        tools = Tools(sys.argv[2:], tmp)
        if mode == "files":
            files(chk, tools, tmp)
        elif mode == "reads":
            special_reads(chk, tools, tmp)
        elif mode == "metrics":
            metrics(chk, tools, tmp)
        elif mode == "timeout":
            bad_timeout(chk, tools)
        else:
            sys.exit(f"unknown mode {mode}: files, reads, metrics or timeout")
    chk.done()


if __name__ == "__main__":
    main()
