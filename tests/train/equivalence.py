#!/usr/bin/python3
"""equivalence.py - the proof that data parallelism is right: training on N ranks equals training on
one process that accumulates N micro-batches, and K accumulated micro-batches equal one K-times
larger batch, to float rounding (ddp-ckpt diff --tol 1e-5).

Why the samples coincide: the sampler draws one permutation P of the data set from (seed, epoch),
independent of the world size. Rank r of N takes positions r, r+N, r+2N, ... of P, so at optimizer
step s its batch of b is P[(s*b + j)*N + r] for j < b, and the union over ranks is exactly the window
P[s*b*N .. (s+1)*b*N). One process with --accum N takes its indices s*b*N .. (s+1)*b*N of P (all of
P, since it is rank 0 of 1) as N micro-batches of b: the same window. The reducer averages over ranks
and micro-steps with equal weights, so both compute the mean gradient over the same N*b samples. The
data set size (480) is a multiple of every b*N used here, so the sampler pads nothing.
The test can fail: a different seed, or one step fewer, must exceed the tolerance.
Each run's --metrics carries a data fingerprint per step (the samples' indices hashed and summed over
the ranks): N ranks and one process with --accum N read the same samples at every step, each step
other samples than the others, and another seed other samples.

Usage: equivalence.py DDP_TRAIN DDP_CKPT MODEL MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

TOL = "1e-5"
BATCH = 8
STEPS = 4


def train(chk, tmp, name, args, prefix=()):
    metrics = os.path.join(tmp, name + ".jsonl")
    return trainlib.train_save(chk, tmp, name, args + ["--metrics", metrics], prefix)


def same_data(chk, a, b, n, what):
    """The per-step data fingerprints of runs a and b agree, each step read n samples, and no two
    steps read the same samples."""
    fa, fb = trainlib.data_fps(a), trainlib.data_fps(b)
    chk.check(len(fa) == STEPS and fa == fb, f"{what}: the same samples at every step", f"{fa}\n{fb}")
    chk.check(all(s == n for _, s in fa.values()) and len({fp for fp, _ in fa.values()}) == STEPS,
              f"{what}: {n} samples a step, other samples at each step", str(fa))


def diff(chk, ckpt, a, b, want_same, what):
    trainlib.diff_ckpt(chk, ckpt, a, b, want_same, what, TOL)


def main():
    exe, ckpt, model, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-equiv-") as tmp:
        data = os.path.join(tmp, "data")
        trainlib.write_dataset(data, 480, 60)
        def common(steps):
            return [exe, "--model", model, "--data", data, "--epochs", "1", "--max-steps", str(steps),
                    "--lr", "0.05", "--momentum", "0.9", "--device", "cpu", "--log-every", "1"]
        base = common(STEPS)
        batch = ["--batch", str(BATCH)]
        ranks = {}
        for n in (2, 3):
            ranks[n] = train(chk, tmp, f"np{n}", base + batch, prefix=mpi + [str(n)])
            single = train(chk, tmp, f"accum{n}", base + batch + ["--accum", str(n)])
            diff(chk, ckpt, ranks[n], single, True, f"{model}: {n} ranks vs 1 process --accum {n}")
            same_data(chk, ranks[n], single, n * BATCH, f"{model}: {n} ranks vs 1 process --accum {n}")
        # Augmentation shifts depend on (seed, epoch, sample index) only, and the cosine rate on the
        # step: both leave the equivalence intact.
        extra = ["--augment", "--lr-schedule", "cosine"]
        aug_ranks = train(chk, tmp, "np2aug", base + batch + extra, prefix=mpi + ["2"])
        aug_single = train(chk, tmp, "accum2aug", base + batch + extra + ["--accum", "2"])
        diff(chk, ckpt, aug_ranks, aug_single, True, f"{model}: --augment --lr-schedule cosine, 2 ranks vs --accum 2")
        diff(chk, ckpt, ranks[2], aug_ranks, False, f"{model}: --augment changes the result")
        accum = train(chk, tmp, "accum4", base + batch + ["--accum", "4"])
        big = train(chk, tmp, "batch32", base + ["--batch", str(4 * BATCH)])
        diff(chk, ckpt, accum, big, True, f"{model}: --accum 4 --batch {BATCH} vs --batch {4 * BATCH}")
        seed = train(chk, tmp, "seed43", base + batch + ["--accum", "2", "--seed", "43"])
        diff(chk, ckpt, ranks[2], seed, False, f"{model}: other seed")
        chk.check(trainlib.data_fps(seed) != trainlib.data_fps(ranks[2]),
                  f"{model}: another seed reads other samples (the fingerprints differ)")
        fewer = train(chk, tmp, "fewer", common(STEPS - 1) + batch + ["--accum", "2"])
        diff(chk, ckpt, ranks[2], fewer, False, f"{model}: one step fewer")
        other = train(chk, tmp, "other", [exe, "--model", "mlp", "--widths", "784-32-10", "--data", data,
                                          "--max-steps", "1", "--device", "cpu"])
        rc, out = trainlib.run([ckpt, "diff", ranks[2], other], timeout=60)
        chk.check(rc == 1 and "signatures differ" in out, "ddp-ckpt diff names a signature difference", out)
        print(out.strip())
        rc, out = trainlib.run([ckpt, "show", ranks[2]], timeout=60)
        chk.check(rc == 0 and "parameters" in out and "total:" in out, "ddp-ckpt show", out)
        print(out)
    chk.done()


if __name__ == "__main__":
    main()
