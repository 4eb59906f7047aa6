#!/usr/bin/env python3
"""gpu_kit.py - the GPU kit's script logic without a GPU (issue 42 item 5), so that a typo in it
cannot spend a GPU window: benchmarks/gpu_gpt.sh --dry-run with its stubs (gpu_kit/dry_stubs.sh)

  - every part, named out of order, runs in the kit's order (bench, ncu, suite, llm.c, ncu_llmc,
    loss, size, zero), each with its share of the budget, and the summary follows;
  - a new build that fails at B 16 unless DDP_ENC_SEG=0 is retried with every switch off, the
    bisection names DDP_ENC_SEG, its confirmation trains, and ncu profiles with DDP_ENC_SEG=0;
  - a failure with every switch off too is said to be none of the changes;
  - the preflight names the GPU, driver, CUDA, cuBLAS, cuDNN, NCCL, nvrtc and free memory; nvrtc
    hidden skips cuDNN's attention and llm.c's cuDNN build with that reason; no GPU stops every
    part with that reason;
  - no shell error anywhere, at most 8 files left in the output folder;
  - the kit's switch list is models/ops/switches.c's table (the default path's) and
    DDP_FLASH_LOADS;
  - benchmarks/gpu_kit/carry_size.sh refuses a payload over the device tool's 64 MiB;
  - every kit script parses (bash -n).

    gpu_kit.py SRCDIR
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainlib  # noqa: E402

SHELL_ERRORS = re.compile(r"command not found|syntax error|unbound variable|No such file or "
                          r"directory|Traceback|bad substitution|unknown part", re.I)


def dry(src, out, *args, env=None):
    cmd = ["bash", os.path.join(src, "benchmarks", "gpu_gpt.sh"), "--dry-run", "--out", out,
           "--steps", "6"] + list(args)
    e = dict(os.environ, **(env or {}))
    e.pop("DRY_FAIL", None)
    return trainlib.run(cmd, timeout=180, env=e)


def clean(chk, rc, out, folder, what):
    errs = [l for l in out.splitlines() if SHELL_ERRORS.search(l)]
    chk.check(rc == 0 and not errs, f"{what}: exit {rc}, no shell error", "\n".join(errs) or out[-3000:])
    left = sorted(os.listdir(folder))
    chk.check(len(left) <= 8 and ".dry" not in left, f"{what}: {len(left)} files left: {left}")


def every_part(chk, src, tmp):
    folder = os.path.join(tmp, "all")
    rc, out = dry(src, folder, "--parts", "zero,size,loss,ncu_llmc,llmc,suite,ncu,bench",
                  "--dry-fail", "DDP_ENC_SEG")
    clean(chk, rc, out, folder, "every part")
    heads = ["== bench", "== ncu: one steady", "== suite", "== llm.c", "== ncu: llm.c's", "== loss",
             "== size", "== zero", "run  (the summary)"]
    at = [out.find(h) for h in heads[:-1]]
    m = re.search(r"^run\s+B\s+tokens/s", out, re.M)
    at.append(m.start() if m else -1)
    chk.check(all(a >= 0 for a in at) and at == sorted(at),
              f"the parts in the kit's order, then the summary: {list(zip(heads, at))}")
    for p in ("bench", "ncu", "suite", "llmc", "ncu_llmc", "loss", "size", "zero"):
        chk.check(re.search(rf"^\[\d+ s of 500; {p} until \d+ s\]$", out, re.M) is not None,
                  f"part {p} announced with its end")
    chk.check("once more with every switch of models/ops/switches.h off" in out,
              "new failed at B 16: retried with every switch off")
    chk.check("gpu_gpt: the change that failed: DDP_ENC_SEG" in out, "the bisection names DDP_ENC_SEG")
    chk.check("confirmed: with only DDP_ENC_SEG off the new build trains" in out, "and confirms it")
    chk.check("of " in out and "at B 16 with DDP_ENC_SEG=0" in out, "ncu profiles the configuration that trained")
    for what in ("GPU NVIDIA H200 (dry-run stub)", "driver 580.00", "free 143000 MiB", "CUDA runtime",
                 "cuBLAS", "cuDNN", "NCCL", "nvrtc"):
        chk.check(what in out, f"the preflight names {what}")
    chk.check("val loss bf16 activations (flash)" in out, "the loss part compares the activations")
    chk.check("1 passed, 0 failed" in out and "1 skipped" in out, "the suite ran its two stub tests")
    chk.check(re.search(r"^new-without-ENC_SEG\s+48\s+[\d,]+", out, re.M) is not None,
              "the largest batch (48: 64 is out of memory) with the switch that trained")


def not_a_change(chk, src, tmp):
    folder = os.path.join(tmp, "none")
    rc, out = dry(src, folder, "--parts", "bench", "--dry-fail", "DDP_NOT_A_SWITCH")
    clean(chk, rc, out, folder, "fails with every switch off")
    chk.check("new fails with every switch off too" in out and "bisect 1" not in out,
              "a failure with every switch off: no bisection, said", out[-2000:])


def missing(chk, src, tmp):
    folder = os.path.join(tmp, "nvrtc")
    rc, out = dry(src, folder, "--parts", "llmc,bench", "--dry-hide", "nvrtc")
    clean(chk, rc, out, folder, "nvrtc hidden")
    chk.check("nvrtc not found" in out and "new-cudnn skipped: nvrtc not found" in out,
              "no nvrtc: cuDNN's attention skipped with the reason")
    chk.check("its build without cuDNN runs" in out, "llm.c: its build without cuDNN instead")
    chk.check(out.find("== bench") < out.find("== llm.c"), "bench before llm.c whatever the order named")
    chk.check("once more with every switch" not in out, "no retry when new trains")
    folder = os.path.join(tmp, "nogpu")
    rc, out = dry(src, folder, "--parts", "bench,ncu,suite,llmc", env={"DRY_NO_GPU": "1"})
    clean(chk, rc, out, folder, "no GPU")
    for p in ("bench", "ncu", "suite", "llm.c"):
        chk.check(f"gpu_gpt: {p} skipped: no GPU (preflight)" in out, f"no GPU: {p} stops saying so")


def switch_list(chk, src):
    table = open(os.path.join(src, "models", "ops", "switches.c")).read()
    want = [v for v, d in re.findall(r'\{"(DDP_[A-Z0-9_]+)",.*?,\s*(true|false)\}', table, re.S)
            if d == "true"] + ["DDP_FLASH_LOADS"]
    kit = open(os.path.join(src, "benchmarks", "gpu_gpt.sh")).read()
    m = re.search(r'^SWITCHES="([^"]*)"', kit, re.M)
    got = m.group(1).split() if m else []
    chk.check(len(want) > 5 and got == want, f"the kit's switches {got} are switches.c's {want}")


def carry(chk, src, tmp):
    script = os.path.join(src, "benchmarks", "gpu_kit", "carry_size.sh")
    small, big = os.path.join(tmp, "small.bin"), os.path.join(tmp, "big.bin")
    with open(small, "wb") as f:
        f.write(b"\0" * 4096)
    with open(big, "wb") as f:
        f.truncate(70 << 20)
    rc, out = trainlib.run(["bash", script, src, small], timeout=60)
    chk.check(rc == 0 and re.search(r"carry: \d+ MiB of 64", out) is not None, "a small payload fits", out)
    rc, out = trainlib.run(["bash", script, src, big], timeout=60)
    chk.check(rc == 1 and "over the device tool's 64 MiB" in out, "70 MiB refused", out)


def syntax(chk, src):
    for f in ("benchmarks/gpu_gpt.sh", "benchmarks/gpu_kit/device.sh", "benchmarks/gpu_kit/env.sh",
              "benchmarks/gpu_kit/pack.sh", "benchmarks/gpu_kit/dry_stubs.sh",
              "benchmarks/gpu_kit/carry_size.sh"):
        p = subprocess.run(["bash", "-n", os.path.join(src, f)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        chk.check(p.returncode == 0, f"bash -n {f}", p.stdout)


def main():
    src = sys.argv[1]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="gpu_kit_") as tmp:
        syntax(chk, src)
        switch_list(chk, src)
        carry(chk, src, tmp)
        every_part(chk, src, tmp)
        not_a_change(chk, src, tmp)
        missing(chk, src, tmp)
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())
