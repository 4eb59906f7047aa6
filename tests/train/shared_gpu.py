#!/usr/bin/python3
"""shared_gpu.py - ddp-train --model gpt2 with several ranks on ONE GPU, through the test-only NCCL
(tests/nccl_fake: every collective of the trainer, the ZeRO reduce-scatter and all-gather, the
checkpoint's shard gather, run over MPI on staged copies, so the multi-rank NCCL paths of
ddp-train run on the one-GPU machines this project gets). Skipped (exit 77) without a GPU.

Modes:
  zero   the tiny GPT at 2 ranks, fp32 and bf16: the checkpoints of --zero 1 and --zero 2 are
         byte-identical to --zero 0's (parameters, the AdamW moments gathered from the shards,
         everything), as tests/train/zero.py shows on the CPU: at 2 ranks every element's sum
         is the one addition a + b whatever the collective. The fp32 runs' --trace: the
         parameters' gather is at most one operation (one "allgather" span, one NCCL group)
         per bucket and step.
  accum  the tiny GPT (fp32, clipping active): 2 ranks equal 1 rank accumulating 2 micro-batches,
         to ddp-ckpt diff --tol TOL (gpt_train.py says why 1e-4 and not 1e-5); another seed
         differs (negative control).
  ckpt   the tiny GPT at 2 ranks, --zero 1: checkpoint folders saved with --checkpoint-async (each
         rank's shard copied into page-locked memory on a side stream, ddp_snapshot_copy, the
         optimizer's next step fenced behind the copy) consolidate byte-identical to the files a
         synchronous run saves at the same steps, and the two runs' final states are identical.
  hang   a collective that never completes on rank 1 (FAKE_NCCL_HANG_AFTER, FAKE_NCCL_RANK=1)
         under DDP_TIMEOUT=HANG_TIMEOUT: every rank ends within DDP_TIMEOUT + HANG_SLACK s, the
         exit status is non-zero and the output names DDP_TIMEOUT. (A rank killed or frozen with
         SIGSTOP: kill_rank.py --fake-nccl, the same trials as on the CPU.)

Usage: shared_gpu.py MODE DDP_TRAIN DDP_CKPT FAKE_RANK LIBFAKENCCL MPIRUN MPIRUN_ARGS... (-np last)
FAKE_RANK and LIBFAKENCCL "-": no fake and --device cpu, a check of this script's comparisons on a
machine without a GPU (zero and accum; hang needs the fake).
"""
import collections
import filecmp
import json
import os
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import gpt_train  # noqa: E402
import trainlib  # noqa: E402

TOL = gpt_train.TOL
HANG_TIMEOUT = 8    # DDP_TIMEOUT of the hang case (start-up runs under it too: not too short)
HANG_SLACK = 10     # seconds after DDP_TIMEOUT for every rank to report and exit
HANG_AFTER = 12     # the NCCL operation that never completes: a few steps into training
NO_GPU = ("has no usable GPU", "built without CUDA", "NCCL needs one GPU per rank")


class Job:
    def __init__(self, exe, fake_rank, lib, mpi):
        self.exe, self.mpi = exe, mpi
        self.fake = [] if fake_rank == "-" else [fake_rank, lib]
        self.device = "cpu" if fake_rank == "-" else "cuda"

    def cmd(self, n, data, steps, extra=()):
        args = gpt_train.tiny(self.exe, data, steps, extra)
        args[args.index("--device") + 1] = self.device
        return self.mpi + [str(n)] + self.fake + args

    def skip_without_gpu(self, data):
        """Exit 77 when the GPU or the CUDA build is missing (the first run says which)."""
        trainlib.skip_without_nvidia_device()
        rc, out = trainlib.run(self.cmd(2, data, 1), timeout=300)
        for reason in NO_GPU:
            if rc != 0 and reason in out:
                print(next(l for l in out.splitlines() if reason in l).strip())
                print(f"skipped: {reason}")
                sys.exit(77)


def gathers_per_bucket(chk, trace, steps, what):
    """At most one "allgather" span per bucket (its tag) and step in rank 0's trace, and some."""
    try:
        events = json.load(open(trace))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        chk.check(False, f"{what}: the trace {trace} is readable ({e})")
        return
    pid0 = min((e["pid"] for e in events if "pid" in e), default=None)
    per_tag = collections.Counter(e["args"]["arg"] for e in events
                                  if e.get("name") == "allgather" and e.get("ph") == "B" and e.get("pid") == pid0)
    most = max(per_tag.values(), default=0)
    chk.check(per_tag and most <= steps, f"{what}: {sum(per_tag.values())} gathers over {len(per_tag)} "
              f"buckets in {steps} steps, at most {most} per bucket (<= one per bucket and step)")


def zero(chk, job, ckpt, tmp, data):
    steps = 6
    for prec in ("fp32", "bf16"):
        saved = {}
        for stage in (0, 1, 2):
            path = os.path.join(tmp, f"{prec}-zero{stage}.ckpt")
            trace = os.path.join(tmp, f"{prec}-zero{stage}.json")
            traced = ["--trace", trace] if prec == "fp32" and stage > 0 else []
            rc, out = trainlib.run(job.cmd(2, data, steps, ["--precision", prec, "--zero", str(stage),
                                                             "--save", path] + traced), timeout=300)
            if chk.check(rc == 0 and os.path.exists(path), f"{prec} --zero {stage} at 2 ranks: exit {rc}", out):
                saved[stage] = path
                if traced:
                    gathers_per_bucket(chk, trace, steps, f"{prec} --zero {stage}")
        for stage in (1, 2):
            if 0 in saved and stage in saved:
                chk.check(filecmp.cmp(saved[0], saved[stage], shallow=False),
                          f"{prec}: --zero {stage}'s checkpoint is byte-identical to --zero 0's")


def accum(chk, job, ckpt, tmp, data):
    clip = ["--grad-clip", "0.05"]  # under these steps' norms: every step clips
    ranks = trainlib.train_save(chk, tmp, "np2", [], prefix=job.cmd(2, data, 4, clip))
    single = trainlib.train_save(chk, tmp, "accum2", [], prefix=job.cmd(1, data, 4, clip + ["--accum", "2"]))
    trainlib.diff_ckpt(chk, ckpt, ranks, single, True, "2 ranks vs 1 rank --accum 2", TOL)
    other = trainlib.train_save(chk, tmp, "accum2seed", [],
                                prefix=job.cmd(1, data, 4, clip + ["--accum", "2", "--seed", "7"]))
    trainlib.diff_ckpt(chk, ckpt, single, other, False, "another seed", TOL)


def ckpt_async(chk, job, ckpt, tmp, data):
    every = ["--checkpoint-every", "4", "--keep", "100", "--zero", "1"]
    files, folders = os.path.join(tmp, "files"), os.path.join(tmp, "folders")
    runs = {}
    for tag, extra in (("file", ["--checkpoint-dir", files]),
                       ("async", ["--checkpoint-dir", folders, "--checkpoint-format", "folder",
                                  "--checkpoint-async"])):
        save = os.path.join(tmp, tag + ".ckpt")
        rc, out = trainlib.run(job.cmd(2, data, 12, every + extra + ["--save", save]), timeout=300)
        if chk.check(rc == 0, f"{tag} saves at 2 ranks: exit {rc}", out):
            runs[tag] = save
        if tag == "async":
            chk.check("staging memory allocated at start-up" in out and "page-locking" not in out,
                      "async: the staging copy reported, its page-locking not refused", out)
    if len(runs) == 2:
        chk.check(filecmp.cmp(runs["file"], runs["async"], shallow=False),
                  "async folder saves change no step of training (the final states are identical)")
    for step in (4, 8):
        name = f"step-{step:012d}.ckpt"
        out_path = os.path.join(tmp, f"consolidated-{step}.ckpt")
        rc, out = trainlib.run([ckpt, "consolidate", os.path.join(folders, name), out_path], timeout=120)
        chk.check(rc == 0 and filecmp.cmp(out_path, os.path.join(files, name), shallow=False),
                  f"step {step}: the async folder consolidates byte-identical to the file", out)


def hang(chk, job, ckpt, tmp, data):
    if not job.fake:
        print("hang needs the test-only NCCL: nothing to check with --device cpu")
        return
    env = dict(os.environ, DDP_TIMEOUT=str(HANG_TIMEOUT), FAKE_NCCL_HANG_AFTER=str(HANG_AFTER),
               FAKE_NCCL_RANK="1")
    t0 = time.monotonic()
    rc, out = trainlib.run(job.cmd(2, data, 200), timeout=HANG_TIMEOUT + HANG_SLACK + 120, env=env)
    took = time.monotonic() - t0
    chk.check(rc not in (0, -999), f"a collective hung on rank 1: the job ended with status {rc}", out)
    chk.check("DDP_TIMEOUT" in out, "the output names DDP_TIMEOUT", out)
    # The whole run includes start-up (a few seconds) before the hang: bound it loosely from above.
    chk.check(took <= HANG_TIMEOUT + HANG_SLACK + 60, f"every rank ended {took:.1f} s after the start "
              f"(DDP_TIMEOUT {HANG_TIMEOUT} s)")


def main():
    if len(sys.argv) < 8 or sys.argv[1] not in ("zero", "accum", "ckpt", "hang"):
        sys.exit(__doc__)
    mode, exe, ckpt, fake_rank, lib = sys.argv[1:6]
    job = Job(exe, fake_rank, lib, sys.argv[6:])
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-shared-gpu-") as tmp:
        data = gpt_train.write_data(tmp)
        if job.fake:
            job.skip_without_gpu(data)
        {"zero": zero, "accum": accum, "ckpt": ckpt_async, "hang": hang}[mode](chk, job, ckpt, tmp, data)
    chk.done()


if __name__ == "__main__":
    main()
