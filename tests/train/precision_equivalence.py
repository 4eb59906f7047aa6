#!/usr/bin/python3
"""precision_equivalence.py - 16-bit training stays data-parallel: a 2-rank bf16 (and fp16) run
equals one process accumulating the same 2 micro-batches in that precision (see equivalence.py for
why the samples coincide), and the tolerance is tight enough to tell bf16 from fp32.

Tolerance 1e-4 (ddp-ckpt diff's max relative difference), justified by where the two runs can
differ: every sample's forward and backward pass is the same computation in both (same micro-batch
size, same kernels, same 16-bit roundings); only the fp32 sum of the two micro-batches' gradients
is formed in another order (the all-reduce vs. accumulation into the gradient buffer), a few fp32
ulps (~1e-7 relative, measured 1e-7). Such a difference can flip the 16-bit rounding of a weight
copy at the next step, which moves that copy by one bf16 ulp (2^-8 relative) for one step; through
lr 0.05 and 4 steps that stays orders of magnitude below 1e-4. The bf16 rounding itself is far
above it: bf16 against fp32 differs by ~1e-2 after 4 steps (measured 1.7e-2), and the test checks
that this negative control exceeds the tolerance, so a run silently computing in fp32 (or in the
wrong precision on one rank) fails.

Also: --precision with a bad value is refused with a message naming the valid ones.

Usage: precision_equivalence.py DDP_TRAIN DDP_CKPT MODEL MPIRUN MPIRUN_ARGS... (the last is -np)
"""
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

TOL = "1e-4"


def train(chk, tmp, name, args, prefix=()):
    return trainlib.train_save(chk, tmp, name, args, prefix)


def diff(chk, ckpt, a, b, want_same, what):
    trainlib.diff_ckpt(chk, ckpt, a, b, want_same, what, TOL)


def main():
    exe, ckpt, model, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-prec-") as tmp:
        base = trainlib.four_step_run(exe, model, tmp)
        single = {}
        for prec in ("bf16", "fp16"):
            ranks = train(chk, tmp, f"np2_{prec}", base + ["--precision", prec], prefix=mpi + ["2"])
            single[prec] = train(chk, tmp, f"accum2_{prec}", base + ["--precision", prec, "--accum", "2"])
            diff(chk, ckpt, ranks, single[prec], True, f"{model} {prec}: 2 ranks vs 1 process --accum 2")
        fp32 = train(chk, tmp, "accum2_fp32", base + ["--accum", "2"])
        diff(chk, ckpt, single["bf16"], fp32, False, f"{model}: bf16 vs fp32")
        rc, out = trainlib.run(base + ["--precision", "fp8"], timeout=60)
        chk.check(rc == 2 and "expected fp32, bf16 or fp16, got 'fp8'" in out,
                  f"--precision fp8 refused with exit 2 and the valid values (status {rc})", out)
    chk.done()


if __name__ == "__main__":
    main()
