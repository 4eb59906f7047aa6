#!/usr/bin/python3
"""zero.py - ddp-train --zero 1|2 (ZeRO: the optimizer state, and at stage 2 the gradients,
sharded over the ranks) against --zero 0.

Modes:
  equivalence  GPT (fp32, clipping active, 12 steps) and MLP (30 steps): at 2 ranks --zero 1 and --zero 2
               write checkpoints byte-identical to --zero 0 (parameters, the moments gathered
               from the shards, everything): the GPT at --accum 1 and 2 (also in bf16, whose
               ranks all-gather the bf16 weights, slice by slice during the forward pass),
               the MLP at --accum 2; the all-gather's bytes per step in bf16 half fp32's where
               bf16 is stored in 2 bytes, equal where it is emulated in floats, and no gather
               beyond the steps' (the optimizer's fp32 master stays sharded; gather_bytes);
               the GPT's --zero 2 --zero-accum reduce at --accum 2 within TOL_RANKS (see
               below); at 3 ranks (a parameter count that 3 x 64 does not divide: the last
               shard is shorter) and at 4 ranks, stages 1 and 2, the parameters agree to
               TOL_RANKS; another seed differs (negative control). The GPT's --zero 1 and 2 runs
               at --accum 2 are traced: their --metrics summary carries gather_wait_ms (the
               forward passes' waits for the parameters' gather) and exposed_comm_ms.
  resume       a sharded run resumed from its mid-epoch checkpoint equals the straight run bit
               for bit (GPT --zero 1 (not under the sanitizers) and 2, MLP --zero 2, 2 ranks); a
               checkpoint written by 4 ranks under --zero 1 resumes on 2 ranks (--resume-reshard,
               --zero 2) to the same parameters and loss as the unsharded run resharded alike,
               within TOL_RANKS.
  memory       GPT-2 d12 at 4 ranks: --zero 1 lowers the largest peak RSS (VmHWM) over the ranks
               by at least 0.6 x (12 Psi - 12 Psi / 4) bytes against --zero 0 (issue 17's bound;
               this fp32 run shards 8 of its 16 bytes per parameter, which saves 6 Psi);
               --zero 2 lowers it below --zero 1's by at least 0.6 x (4 Psi - 4 Psi / 4 - B),
               B the bucket buffers the backward pass writes into (the report's communication
               buffers): the full gradients (4 Psi) give way to the shard (4 Psi / 4) and the
               buckets; and the report's model states equal the formula's prediction.
               The tiny GPT in bf16 at 2, 3 and 4 ranks, --zero 1 and 2: the model states per
               rank within 10 % of the ZeRO paper's formula, 16-bit weights + gradients + 12
               bytes per parameter / N (the optimizer's fp32 master and the two moments, sharded;
               the weights' storage is 4 bytes where bf16 is emulated in floats), and the
               optimizer state alone within 1 % of 12 Psi / N.

Why 2 ranks are bit-identical and 3 or 4 are not: at 2 ranks every element's sum is the one
addition a + b, whatever the collective; at 3 or more, Open MPI's reduce-scatter adds the ranks'
contributions in another order than its all-reduce does, so sums differ in the last bit, and
AdamW normalises that noise where a gradient is ~0 (attn.c_attn.bias, see gpt_train.py's TOL).
The GPT's --zero 2 keeps its gradients in the reducer's bucket buffers. At --accum 2 with
--zero-accum local (the default) the buckets keep their buffers through the micro-steps and are
reduce-scattered once, so the sums are --zero 0's, (a1 + a2) + (b1 + b2): bit-identical. With
--zero-accum reduce (the memory saving) every micro-step is reduce-scattered and the shard adds
the sums, (a1 + b1) + (a2 + b2): a rounding apart (DeepSpeed's stage 2 does the same). The
MLP's --zero 2 writes into the reducer's buckets too (model_config.reducer_grads) and stays
bit-identical alike.

Usage: zero.py MODE DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import filecmp
import json
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import gpt_train  # noqa: E402
import trainlib  # noqa: E402

TOL_RANKS = "1e-4"  # relative to the largest value of each tensor; measured 7.7e-5 at 3 and 4 ranks
D12_PSI = 124475904  # elements of d12's flat buffer (wte padded to 50,304 rows)
GPT_STEPS = 12  # the tiny GPT's steps in `equivalence` (its 50,304-row head: ~0.1 s a step)
# Under ASan/UBSan (tests/meson.build sets DDP_TEST_SANITIZED) `equivalence` runs the cases whose
# memory use differs: 2 ranks (GPT --accum 2, GPT in bf16, whose ranks gather the bf16 copy, and
# MLP), --zero-accum reduce, 3 ranks (shards of unequal length) and the MLP at 3 ranks; the plain
# build runs all of them (about half the time without these: accum 1, 4 ranks, another seed, and
# the all-gather's bytes, gather_bytes).
SANITIZED = os.environ.get("DDP_TEST_SANITIZED") == "1"


def gpt(exe, data, steps, extra=(), accum="2"):
    return gpt_train.tiny(exe, data, steps, ["--grad-clip", "0.05", "--accum", accum] + list(extra))


def mlp(exe, data, steps, extra=()):
    return [exe, "--model", "mlp", "--data", data,
            "--epochs", "3", "--max-steps", str(steps), "--batch", "32", "--accum", "2",
            "--log-every", "10", "--device", "cpu"] + list(extra)


def same_file(chk, a, b, what):
    chk.check(os.path.exists(a) and os.path.exists(b) and filecmp.cmp(a, b, shallow=False),
              f"{what}: checkpoints byte-identical")


def waits_in_summary(chk, metrics, what):
    """A traced --zero run's summary: the forward passes' waits for the parameters' gather and the
    steps' exposed communication (stage 2: the waits mid-backward included) are numbers."""
    try:
        summary = json.loads(open(metrics).read().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        chk.check(False, f"{what}: the metrics summary is readable ({e})")
        return
    fields = ("gather_wait_ms", "exposed_comm_ms", "comm_ms")
    chk.check(all(isinstance(summary.get(k), (int, float)) and summary[k] >= 0 for k in fields),
              f"{what}: the summary has {', '.join(fields)} ("
              + ", ".join(f"{k} {summary.get(k)}" for k in fields) + ")", str(summary))


def equivalence(chk, exe, ckpt, mpi, tmp):
    data = gpt_train.write_data(tmp)
    digits = os.path.join(tmp, "digits")
    trainlib.write_dataset(digits, 2048, 256)
    cases = (("gpt-a1", lambda z: gpt(exe, data, GPT_STEPS, ["--zero", z], accum="1")),
             ("gpt", lambda z: gpt(exe, data, GPT_STEPS, ["--zero", z])),
             ("gpt-bf16", lambda z: gpt(exe, data, GPT_STEPS, ["--zero", z, "--precision", "bf16"])),
             ("mlp", lambda z: mlp(exe, digits, 30, ["--zero", z])))
    if SANITIZED:
        print("sanitizer build: the cases whose memory use differs (see SANITIZED)")
        cases = [c for c in cases if c[0] in ("gpt", "gpt-bf16", "mlp")]
    for name, cmd in cases:
        base = trainlib.train_save(chk, tmp, f"{name}-np2-z0", cmd("0"), prefix=mpi + ["2"])
        for z in ("1", "2"):
            # the GPT traced (which changes no result): the summary's waits for communication
            traced = name == "gpt"
            metrics = os.path.join(tmp, f"{name}-np2-z{z}.jsonl")
            extra = ["--trace", os.path.join(tmp, f"{name}-np2-z{z}.json"), "--metrics", metrics] if traced else []
            got = trainlib.train_save(chk, tmp, f"{name}-np2-z{z}", cmd(z) + extra, prefix=mpi + ["2"])
            same_file(chk, base, got, f"{name}: 2 ranks, --zero {z} vs --zero 0 after the steps")
            if traced:
                waits_in_summary(chk, metrics, f"{name}: 2 ranks, --zero {z}")
    # --zero-accum reduce adds the micro-steps' reduce-scattered sums (see the top)
    got = trainlib.train_save(chk, tmp, "gpt-np2-z2-reduce",
                              gpt(exe, data, GPT_STEPS, ["--zero", "2", "--zero-accum", "reduce"]),
                              prefix=mpi + ["2"])
    trainlib.diff_ckpt(chk, ckpt, os.path.join(tmp, "gpt-np2-z0.ckpt"), got, True,
                       "gpt: 2 ranks, --zero 2 --zero-accum reduce vs --zero 0", TOL_RANKS)
    for n, stages in ((3, ("1", "2")),) + (() if SANITIZED else ((4, ("1", "2")),)):
        base = trainlib.train_save(chk, tmp, f"gpt-np{n}-z0", gpt(exe, data, GPT_STEPS, ["--zero", "0"]),
                                   prefix=mpi + [str(n)])
        for z in stages:
            got = trainlib.train_save(chk, tmp, f"gpt-np{n}-z{z}", gpt(exe, data, GPT_STEPS, ["--zero", z]),
                                      prefix=mpi + [str(n)])
            trainlib.diff_ckpt(chk, ckpt, base, got, True, f"gpt: {n} ranks, --zero {z} vs --zero 0", TOL_RANKS)
    if not SANITIZED:
        other = trainlib.train_save(chk, tmp, "gpt-np3-z1-seed",
                                    gpt(exe, data, GPT_STEPS, ["--zero", "1", "--seed", "7"]), prefix=mpi + ["3"])
        trainlib.diff_ckpt(chk, ckpt, os.path.join(tmp, "gpt-np3-z0.ckpt"), other, False, "gpt: another seed",
                           TOL_RANKS)
    if not SANITIZED:
        gather_bytes(chk, exe, data, mpi, tmp)
    base = trainlib.train_save(chk, tmp, "mlp-np3-z0", mlp(exe, digits, 30, ["--zero", "0"]), prefix=mpi + ["3"])
    got = trainlib.train_save(chk, tmp, "mlp-np3-z2", mlp(exe, digits, 30, ["--zero", "2"]), prefix=mpi + ["3"])
    trainlib.diff_ckpt(chk, ckpt, base, got, True, "mlp: 3 ranks, --zero 2 vs --zero 0", TOL_RANKS)


def gather_bytes(chk, exe, data, mpi, tmp):
    """ZeRO's all-gather after each step moves the weights the passes read, in bf16 runs bf16: per
    step half the fp32 run's bytes where bf16 is stored in 2 bytes (a GPU, AVX512_BF16), the same
    where the CPU emulates it in floats; nothing else is gathered (the optimizer's fp32 master stays
    sharded: the checkpoint gathers it in its own chunks, not through the reducer). From the
    --metrics summary's allgather counters (rank 0) of runs of 6 and 12 steps, at 2 ranks,
    --zero 1."""
    got, native = {}, False
    for prec in ("fp32", "bf16"):
        for n in (6, 12):
            metrics = os.path.join(tmp, f"gather-{prec}-{n}.jsonl")
            cmd = mpi + ["2"] + gpt(exe, data, n, ["--zero", "1", "--precision", prec, "--metrics", metrics])
            rc, out = trainlib.run(cmd, timeout=300)
            chk.check(rc == 0, f"gather bytes: {prec}, {n} steps: exit status {rc}", out)
            native |= prec == "bf16" and "bf16 native" in out
            s = summary(metrics) if rc == 0 else {}
            got[prec, n] = (s.get("allgather_calls") or 0, s.get("allgather_bytes") or 0)
    step = {p: ((got[p, 12][0] - got[p, 6][0]) / 6, (got[p, 12][1] - got[p, 6][1]) / 6)
            for p in ("fp32", "bf16")}
    ratio = 0.5 if native else 1.0
    print(f"all-gather per step: fp32 {step['fp32'][0]:.0f} calls, {step['fp32'][1]:.0f} bytes; "
          f"bf16 {step['bf16'][0]:.0f} calls, {step['bf16'][1]:.0f} bytes (bf16 {'native' if native else 'emulated'})")
    chk.check(step["fp32"][1] > 0 and step["bf16"][1] == ratio * step["fp32"][1],
              f"gather bytes: a bf16 step moves {ratio} x an fp32 step's ({step['bf16'][1]:.0f} vs "
              f"{step['fp32'][1]:.0f})")
    chk.check(step["bf16"][0] == step["fp32"][0], "gather bytes: as many gathers a step in bf16 as in fp32")
    for p in ("fp32", "bf16"):
        chk.check(got[p, 12] == (12 * step[p][0], 12 * step[p][1]),
                  f"gather bytes: the {p} run's total is its steps' alone, no gather of fp32 "
                  f"parameters at the end ({got[p, 12]})")


def last_loss(out):
    m = re.findall(r"step \d+: val loss (\S+)", out)
    return float(m[-1]) if m else None


def resume(chk, exe, ckpt, mpi, tmp):
    data = gpt_train.write_data(tmp, n_train=400, n_val=200)
    digits = os.path.join(tmp, "digits")
    trainlib.write_dataset(digits, 2048, 256)
    cases = (("gpt", lambda extra: gpt(exe, data, 6, ["--zero", "1"] + extra)),
             ("gpt-z2", lambda extra: gpt(exe, data, 6, ["--zero", "2"] + extra)),
             ("mlp", lambda extra: mlp(exe, digits, 6, ["--zero", "2"] + extra)))
    if SANITIZED:  # the GPT's --zero 1 shards are saved and read below too (4 ranks -> 2)
        print("sanitizer build: the GPT's --zero 1 resume is left to the plain build")
        cases = cases[1:]
    for name, cmd in cases:
        folder = os.path.join(tmp, f"{name}-c")
        straight = trainlib.train_save(chk, tmp, f"{name}-straight", cmd(["--checkpoint-dir", folder,
                                       "--checkpoint-every", "3", "--keep", "5"]), prefix=mpi + ["2"])
        mid = os.path.join(folder, f"step-{3:012d}.ckpt")
        chk.check(os.path.exists(mid), f"{name}: the step-3 checkpoint exists")
        resumed = trainlib.train_save(chk, tmp, f"{name}-resumed", cmd(["--resume", mid]), prefix=mpi + ["2"])
        same_file(chk, straight, resumed, f"{name}: a sharded run resumed at step 3 vs the straight run")
    # 4 ranks write, 2 ranks continue: sharded (--zero 1 then 2) against unsharded (--zero 0)
    outs, finals = {}, {}
    for z_from, z_to in (("0", "0"), ("1", "2")):
        folder = os.path.join(tmp, f"reshard-{z_from}")
        trainlib.train_save(chk, tmp, f"np4-z{z_from}", gpt(exe, data, 2, ["--zero", z_from, "--checkpoint-dir", folder]),
                            prefix=mpi + ["4"])
        path = os.path.join(tmp, f"np2-from-z{z_from}.ckpt")
        rc, out = trainlib.run(mpi + ["2"] + gpt(exe, data, 6, ["--zero", z_to, "--checkpoint-dir", folder,
                                                                "--resume", "auto", "--resume-reshard",
                                                                "--save", path]), timeout=300)
        chk.check(rc == 0 and "resumed from" in out, f"4 ranks --zero {z_from} resharded onto 2 ranks --zero {z_to}", out)
        outs[z_from], finals[z_from] = out, path
    trainlib.diff_ckpt(chk, ckpt, finals["0"], finals["1"], True, "resharded: sharded vs unsharded", TOL_RANKS)
    a, b = last_loss(outs["0"]), last_loss(outs["1"])
    chk.check(a is not None and b is not None and abs(a - b) <= 1e-4 * abs(a),
              f"resharded: validation loss {b} vs the unsharded run's {a} (1e-4 relative)")


def summary(path):
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    return next((x for x in lines if x.get("summary")), {})


def memory(chk, exe, ckpt, mpi, tmp):
    if "ASAN_OPTIONS" in os.environ:  # the sanitizer build: its allocator's quarantine and shadow
        print("SKIP: peak RSS under AddressSanitizer is the sanitizer's, not ddp's; the plain build measures it")
        sys.exit(77)
    data = gpt_train.write_data(tmp, n_train=4096, n_val=400)
    got = {}
    for z in ("0", "1", "2"):
        metrics = os.path.join(tmp, f"d12-z{z}.json")
        cmd = [exe, "--model", "gpt2", "--gpt-config", "d12", "--seq", "16", "--batch", "1",
               "--data", data, "--max-steps", "1", "--val-max-batches", "1", "--device", "cpu",
               "--zero", z, "--metrics", metrics]
        rc, out = trainlib.run(mpi + ["4"] + cmd, timeout=900)
        print("\n".join(x for x in out.splitlines() if x.startswith("memory")))
        chk.check(rc == 0, f"d12, 4 ranks, --zero {z}: exit status {rc}", out)
        got[z] = summary(metrics) if rc == 0 else {}
    s0, s1, s2 = got["0"], got["1"], got["2"]
    psi = s0.get("n_params", 0)
    chk.check(psi == D12_PSI, f"d12's flat buffer holds {psi} elements ({D12_PSI} expected)")
    need = 0.6 * (12 * psi - 12 * psi / 4) / 2**20
    saved = s0.get("mem_peak_rss_max_mib", 0) - s1.get("mem_peak_rss_max_mib", 0)
    chk.check(saved >= need, f"--zero 1 lowers the largest VmHWM by {saved:.0f} MiB (at least {need:.0f} MiB)", str(got))
    # stage 2 trades the full gradients for the shard and the bucket buffers (mem_comm_mib: the
    # reducer's buffers, which at stage 2 are the buckets and nothing else)
    buckets = s2.get("mem_comm_mib", 1e9)
    need = 0.6 * ((4 * psi - 4 * psi / 4) / 2**20 - buckets)
    saved = s1.get("mem_peak_rss_max_mib", 0) - s2.get("mem_peak_rss_max_mib", 0)
    chk.check(need > 0 and saved >= need,
              f"--zero 2 lowers the largest VmHWM below --zero 1's by {saved:.0f} MiB (at least {need:.0f} MiB; "
              f"bucket buffers {buckets:.0f} MiB)", str(got))
    chk.check(s2.get("mem_grads_mib", 0) < s1.get("mem_grads_mib", 0) / 3.9,
              "--zero 2: each rank holds a quarter of the gradients (the shard)")
    for z, s in got.items():
        pred, meas = s.get("mem_predicted_states_mib", -1), s.get("mem_states_mib", -2)
        chk.check(abs(pred - meas) <= 0.01 * pred, f"--zero {z}: model states {meas} MiB = the prediction {pred} MiB")
    chk.check(abs(s0.get("mem_optimizer_mib", 0) / 4 - s1.get("mem_optimizer_mib", 0)) < 1.0,
              "--zero 1: each rank holds a quarter of the AdamW moments")
    bf16_states(chk, exe, mpi, tmp)


def bf16_states(chk, exe, mpi, tmp):
    """bf16: the master weights are the optimizer's, sharded like the moments (the ZeRO paper's 16-bit
    weights + gradients + 12 bytes per parameter / N)."""
    data = gpt_train.write_data(tmp, n_train=2048, n_val=200)
    for n in ("2", "3", "4"):
        for z in ("1", "2"):
            metrics = os.path.join(tmp, f"bf16-np{n}-z{z}.json")
            rc, out = trainlib.run(mpi + [n] + gpt(exe, data, 2, ["--zero", z, "--precision", "bf16",
                                                               "--metrics", metrics]), timeout=300)
            print("\n".join(x for x in out.splitlines() if x.startswith("memory predicted")))
            chk.check(rc == 0, f"bf16, {n} ranks, --zero {z}: exit status {rc}", out)
            s = summary(metrics) if rc == 0 else {}
            psi, w = s.get("n_params", 0), 2 if "bf16 native" in out else 4
            grads = 4 if z == "1" else 4 / int(n)
            formula = psi * (w + grads + 12 / int(n)) / 2**20
            meas = s.get("mem_states_mib", -1)
            chk.check(psi > 0 and abs(meas - formula) <= 0.1 * formula,
                      f"bf16, {n} ranks, --zero {z}: model states {meas:.2f} MiB within 10 % of "
                      f"{w} + {grads:g} + 12 / {n} bytes x {psi} = {formula:.2f} MiB", out)
            opt = s.get("mem_optimizer_mib", -1)
            chk.check(abs(opt - psi * 12 / int(n) / 2**20) <= 0.01 * opt,
                      f"bf16, {n} ranks, --zero {z}: optimizer state {opt:.2f} MiB = 12 Psi / {n} "
                      "(the fp32 master and the moments of the shard)")


def main():
    mode, exe, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-zero-") as tmp:
        {"equivalence": equivalence, "resume": resume, "memory": memory}[mode](chk, exe, ckpt, mpi, tmp)
    chk.done()


if __name__ == "__main__":
    main()
