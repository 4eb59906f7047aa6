#!/usr/bin/python3
"""bf16_emulation.py - bf16 emulated (fp32 arithmetic, every op's output rounded to bf16, float
storage: what a CPU without AVX512_BF16 runs) trains like native bf16 (AVX512_BF16 kernels) on a CPU
that has both: the same 4 steps natively, under DDP_CPU_ISA=avx512 (AVX-512 fp32 kernels, bf16
emulated) and under DDP_CPU_ISA=avx2 (AVX2 kernels, emulated) end with the same parameters.

Tolerance 1e-4 for the MLP and 5e-4 for the CNN (ddp-ckpt diff's max relative difference), as in
precision_equivalence.py and for the same reason: both runs round the same op outputs to bf16 at the same points (native kernels write
bf16, the emulation rounds its fp32 output to nearest even, the same rounding), so they differ only
where the fp32 accumulation inside a GEMM or convolution runs in another order (other kernels, other
blocking): a few fp32 ulps (~1e-7 relative), which can flip one bf16 rounding by one ulp (2^-8) for
one step; through lr 0.05 and 4 steps that stays below 1e-4. Measured on an AVX-512 BF16 EPYC:
MLP 4.9e-8, CNN 5.5e-6 (avx512 cap) and 1.2e-4 (avx2 cap: jit:avx2 convolutions sum in another
order than brgconv). The CNN's figures were 1.5e-7 and 1.9e-5 while the model read its biases
from fp32 master weights; since the optimizer owns the master the models read every
parameter in bf16 as llm.c does, biases widened, and a convolution's bias, added at every output
pixel, carries a flipped rounding further. A run that did not round to bf16 at all differs by
~1.5e-2 to 2e-2 (bf16 vs fp32), and the test checks that this negative control exceeds 10x the
tolerance.

Also: the start-up report says "bf16: emulated" in the emulated runs only.
Exits 77 (skipped) where native bf16 cannot run: the CPU lacks AVX512_BF16, or DDP_CPU_ISA caps it.

Usage: bf16_emulation.py DDP_TRAIN DDP_CKPT MODEL
"""
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402

TOL = {"mlp": "1e-4", "cnn": "5e-4"}


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def main():
    exe, ckpt, model = sys.argv[1], sys.argv[2], sys.argv[3]
    cap = os.environ.get("DDP_CPU_ISA", "native") or "native"
    if "avx512_bf16" not in cpu_flags() or cap != "native":
        print(f"skipped: native bf16 needs AVX512_BF16 uncapped (cpuinfo has avx512_bf16: "
              f"{'avx512_bf16' in cpu_flags()}; DDP_CPU_ISA={cap})")
        sys.exit(77)
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-bf16emu-") as tmp:
        base = trainlib.four_step_run(exe, model, tmp) + ["--accum", "2"]
        runs = {}
        for isa in ("native", "avx512", "avx2"):
            path = os.path.join(tmp, f"{isa}.ckpt")
            env = dict(os.environ, DDP_CPU_ISA=isa)
            rc, out = trainlib.run(base + ["--precision", "bf16", "--save", path], timeout=300, env=env)
            chk.check(rc == 0 and os.path.exists(path), f"bf16 under DDP_CPU_ISA={isa}: exit status {rc}", out)
            emulated = "bf16: emulated" in out
            chk.check(emulated == (isa != "native"),
                      f"DDP_CPU_ISA={isa}: start-up report says emulated={emulated}", out)
            runs[isa] = path
        for isa in ("avx512", "avx2"):
            trainlib.diff_ckpt(chk, ckpt, runs["native"], runs[isa], True,
                               f"{model}: native bf16 vs emulated (DDP_CPU_ISA={isa})", TOL[model])
        fp32 = trainlib.train_save(chk, tmp, "fp32", base)
        trainlib.diff_ckpt(chk, ckpt, runs["avx2"], fp32, False, f"{model}: emulated bf16 vs fp32", TOL[model])
    chk.done()


if __name__ == "__main__":
    main()
