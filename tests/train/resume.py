#!/usr/bin/python3
"""resume.py - exact resume: 2 ranks training N steps straight give parameters bit-identical
(ddp-ckpt diff: max_abs_diff=0) to a run resumed from a checkpoint written in the middle of an epoch,
with gradient accumulation, augmentation and the cosine schedule; the saved file holds the whole
state (momentum, counters, fingerprint). With `misc` as MODEL it checks instead: --resume auto skips a
corrupt newest checkpoint (warning naming it) and uses the previous one, an empty folder is a fresh
start, a different configuration is refused naming what differs, another world size only with
--resume-reshard (which says the run is no longer bit-identical), --keep prunes old checkpoints, an
unwritable --save folder, a --save naming an existing folder and a --trace into a missing folder are
refused before training (special files: fault_campaign.py), an empty test set is refused, and a NaN loss
stops the run with exit 1 (or is skipped with --nan-policy skip). With `mlp` it also resumes an
fp16-gradient run whose loss scale grows every 5 steps: the scaler's scale and counter are state.

Usage: resume.py DDP_TRAIN DDP_CKPT MODEL|misc MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import re
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

# 480 samples, 2 ranks x batch 8 x accum 2 = 32 per step: 15 steps per epoch, 45 in 3 epochs.
# Checkpoints every 7 steps land in the middle of epochs (7, 14 in epoch 1; 21, 28 in epoch 2 ...).
EVERY = 7


def ckpt_name(step):
    return f"step-{step:012d}.ckpt"


class Run:
    def __init__(self, exe, ckpt, mpi, tmp, model):
        self.exe, self.ckpt, self.mpi, self.tmp, self.model = exe, ckpt, mpi, tmp, model
        self.data = os.path.join(tmp, "data")
        trainlib.write_dataset(self.data, 480, 60)

    def cmd(self, ranks=2, extra=()):
        widths = ["--widths", "784-32-10"] if self.model == "mlp" else []
        return self.mpi + [str(ranks), self.exe, "--model", self.model, *widths, "--data", self.data,
                           "--epochs", "3", "--batch", "8", "--accum", "2", "--augment",
                           "--lr-schedule", "cosine", "--device", "cpu", "--log-every", "100", *extra]

    def train(self, extra=(), ranks=2):
        return trainlib.run(self.cmd(ranks, extra), timeout=300)

    def diff(self, a, b):
        """max_abs_diff between two checkpoints (None when ddp-ckpt could not compare them)."""
        rc, out = trainlib.run([self.ckpt, "diff", a, b], timeout=60)
        m = re.search(r"max_abs_diff=(\S+)", out)
        print(out.strip())
        return float(m.group(1)) if rc == 0 and m else None


def straight_run(chk, r):
    """N steps straight, a checkpoint every EVERY steps into tmp/a, final state in tmp/straight.ckpt."""
    straight, dir_a = os.path.join(r.tmp, "straight.ckpt"), os.path.join(r.tmp, "a")
    # one file per checkpoint, read and truncated below (ckpt_folder.py tests the folders)
    rc, out = r.train(["--checkpoint-dir", dir_a, "--checkpoint-format", "file", "--checkpoint-every", str(EVERY),
                       "--keep", "100", "--save", straight])
    chk.check(rc == 0 and os.path.exists(straight), f"straight run with checkpoints every {EVERY} steps", out)
    rc, out = trainlib.run([r.ckpt, "show", straight], timeout=30)
    chk.check(rc == 0 and all(k in out for k in ("momentum", "step_in_epoch", "config.world_size = 2",
                                                  "lr_total_steps", "loss_scale")),
              "--save holds the whole training state (ddp-ckpt show)", out)
    return straight, dir_a


def exact(chk, r):
    straight, dir_a = straight_run(chk, r)
    resumed = os.path.join(r.tmp, "resumed.ckpt")
    for step in (EVERY, 3 * EVERY):  # epoch 1 step 7, epoch 2 step 6: both mid-epoch
        target = os.path.join(r.tmp, f"resumed{step}.ckpt")
        rc, out = r.train(["--checkpoint-dir", os.path.join(r.tmp, f"b{step}"),
                           "--resume", os.path.join(dir_a, ckpt_name(step)), "--save", target])
        chk.check(rc == 0 and f"at step {step} " in out, f"resume from step {step} (mid-epoch)", out)
        d = r.diff(straight, target)
        chk.check(d == 0.0, f"{r.model}: resumed from step {step} is bit-identical (max_abs_diff={d})")
    # negative control: the comparison can fail (another --lr is allowed but changes the result)
    rc, out = r.train(["--checkpoint-dir", os.path.join(r.tmp, "c"), "--lr", "0.06",
                       "--resume", os.path.join(dir_a, ckpt_name(EVERY)), "--save", resumed])
    d = r.diff(straight, resumed)
    chk.check(rc == 0 and d is not None and d > 0, f"negative control: --lr 0.06 after resume differs ({d})")


def exact_scaler(chk, r):
    """fp16 gradients with a loss scale that doubles every 5 finite steps: a resume that lost the
    scaler's scale or its counter would end with another scale (and skip other steps on overflow)."""
    fp16 = ["--grad-dtype", "fp16", "--loss-scale-init", "64", "--loss-scale-interval", "5"]
    straight, dir_a = os.path.join(r.tmp, "fp16-straight.ckpt"), os.path.join(r.tmp, "fp16-a")
    rc, out = r.train(fp16 + ["--checkpoint-dir", dir_a, "--checkpoint-every", str(EVERY), "--keep", "100",
                              "--save", straight])
    chk.check(rc == 0, "fp16 straight run with checkpoints", out)
    rc, out = trainlib.run([r.ckpt, "show", os.path.join(dir_a, ckpt_name(EVERY))], timeout=30)
    chk.check(rc == 0 and "loss_scale = 128" in out and "loss_scale_good_steps = 2" in out,
              "the step-7 checkpoint holds the scaler's state (scale 128, 2 finite steps since)", out)
    target = os.path.join(r.tmp, "fp16-resumed.ckpt")
    rc, out = r.train(fp16 + ["--checkpoint-dir", os.path.join(r.tmp, "fp16-b"),
                              "--resume", os.path.join(dir_a, ckpt_name(EVERY)), "--save", target])
    d = r.diff(straight, target)
    chk.check(rc == 0 and d == 0.0, f"fp16 + loss scaler: resumed from step {EVERY} is bit-identical "
                                    f"(max_abs_diff={d})", out)
    # A power-of-two scale leaves fp16 rounding unchanged unless a gradient overflows, so equal
    # parameters alone would not notice a lost scaler state: the final scale and counter must match.
    states = []
    for path in (straight, target):
        rc, out = trainlib.run([r.ckpt, "show", path], timeout=30)
        states.append(re.findall(r"loss_scale(?:_good_steps)? = \S+", out))
    chk.check(len(states[0]) == 2 and states[0] == states[1],
              f"the resumed run ends with the straight run's scaler state: {states[1]} vs {states[0]}")


def auto_and_keep(chk, r, straight):
    d = os.path.join(r.tmp, "auto")
    rc, out = r.train(["--checkpoint-dir", d, "--checkpoint-every", str(EVERY), "--max-steps", "30"])
    # --max-steps changes the cosine length: keep it out of the fingerprint comparison by using the
    # checkpoints of the 30-step run only for the --keep check.
    names = sorted(n for n in os.listdir(d) if n.startswith("step-"))  # not .ddp-lock
    chk.check(rc == 0 and names == [ckpt_name(s) for s in (21, 28, 30)],
              f"--keep 3 (default) keeps the newest three: {names}", out)
    shutil.rmtree(d)
    rc, out = r.train(["--checkpoint-dir", d, "--resume", "auto", "--save", os.path.join(r.tmp, "fresh.ckpt")])
    chk.check(rc == 0 and "no checkpoint in" in out and "starting fresh" in out,
              "--resume auto with an empty folder starts fresh", out)
    chk.check(r.diff(straight, os.path.join(r.tmp, "fresh.ckpt")) == 0.0, "the fresh start equals the straight run")
    # a folder with steps 7 and 14, the newest truncated: auto must warn and take step 7
    shutil.rmtree(d)
    os.makedirs(d)
    for step in (EVERY, 2 * EVERY):
        shutil.copy(os.path.join(r.tmp, "a", ckpt_name(step)), d)
    newest = os.path.join(d, ckpt_name(2 * EVERY))
    os.truncate(newest, os.path.getsize(newest) - 100)
    target = os.path.join(r.tmp, "auto.ckpt")
    rc, out = r.train(["--checkpoint-dir", d, "--resume", "auto", "--save", target])
    chk.check(rc == 0 and f"skipping {newest}" in out and f"resumed from {os.path.join(d, ckpt_name(EVERY))}" in out,
              "--resume auto skips the truncated newest checkpoint, naming it, and uses the previous", out)
    chk.check(r.diff(straight, target) == 0.0, "... and still ends bit-identical to the straight run")


def mismatch(chk, r):
    first = os.path.join(r.tmp, "a", ckpt_name(EVERY))
    rc, out = trainlib.run(r.cmd(2, ["--batch", "4", "--checkpoint-dir", os.path.join(r.tmp, "m"),
                                     "--resume", first]), timeout=120)
    chk.check(rc == 1 and "batch is 8 in the checkpoint, 4 in this run" in out and "epoch 1:" not in out,
              "another --batch is refused, naming the difference, before training", out)
    rc, out = r.train(["--checkpoint-dir", os.path.join(r.tmp, "m"), "--resume", first], ranks=3)
    chk.check(rc == 1 and "world_size is 2 in the checkpoint, 3 in this run" in out and "--resume-reshard" in out,
              "another world size is refused and --resume-reshard suggested", out)
    rc, out = r.train(["--checkpoint-dir", os.path.join(r.tmp, "m"), "--resume", first, "--resume-reshard"], ranks=3)
    chk.check(rc == 0 and "no longer bit-identical" in out, "--resume-reshard continues on 3 ranks and says so", out)
    rc, out = r.train(["--resume", os.path.join(r.tmp, "nothere.ckpt")])
    chk.check(rc == 1 and "nothere.ckpt" in out, "--resume of a missing file is refused naming it", out)


def bad_outputs(chk, r):
    rc, out = r.train(["--save", os.path.join(r.tmp, "no", "such", "dir", "x.ckpt")])
    chk.check(rc == 1 and "cannot write into the folder" in out and "epoch 1:" not in out,
              "--save into a missing folder is refused before training", out)
    folder = os.path.join(r.tmp, "a")  # exists: straight_run's checkpoints
    rc, out = r.train(["--save", folder])
    chk.check(rc == 1 and f"--save {folder} is a folder" in out and "epoch 1:" not in out and
              os.path.isdir(folder), "--save naming an existing folder is refused before training", out)
    rc, out = r.train(["--trace", os.path.join(r.tmp, "no", "such", "dir", "t.json")])
    chk.check(rc == 1 and "--trace" in out and "cannot write into the folder" in out and "epoch 1:" not in out,
              "--trace into a missing folder is refused before training", out)
    blocker = os.path.join(r.tmp, "file")
    open(blocker, "w").close()
    rc, out = r.train(["--checkpoint-dir", os.path.join(blocker, "sub")])
    chk.check(rc == 1 and "--checkpoint-dir" in out and "epoch 1:" not in out,
              "--checkpoint-dir under a file is refused before training", out)
    empty = os.path.join(r.tmp, "emptytest")
    trainlib.write_dataset(empty, 480, 0)
    rc, out = trainlib.run(r.mpi + ["2", r.exe, "--data", empty, "--device", "cpu"], timeout=120)
    chk.check(rc == 1 and "test set" in out and "0 samples" in out, "an empty test set is refused", out)


def nan(chk, r):
    rc, out = r.train(["--lr", "1000", "--lr-schedule", "constant"])
    chk.check(rc == 1 and "the loss became NaN or inf" in out, "a NaN/inf loss stops the run with exit 1", out)
    rc, out = r.train(["--lr", "1000", "--lr-schedule", "constant", "--nan-policy", "skip"])
    chk.check(rc == 0 and "is not applied (--nan-policy skip)" in out, "--nan-policy skip goes on", out)


def main():
    exe, ckpt, model, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-resume-") as tmp:
        r = Run(exe, ckpt, mpi, tmp, "mlp" if model == "misc" else model)
        if model != "misc":
            exact(chk, r)
            if model == "mlp":
                exact_scaler(chk, r)
        else:
            auto_and_keep(chk, r, straight_run(chk, r)[0])
            mismatch(chk, r)
            bad_outputs(chk, r)
            nan(chk, r)
    chk.done()


if __name__ == "__main__":
    main()
