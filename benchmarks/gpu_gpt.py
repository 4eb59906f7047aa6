#!/usr/bin/env python3
"""gpu_gpt.py - the measuring half of benchmarks/gpu_gpt.sh (GPT-2 on one GPU; see that script).

  gpu_gpt.py train --label L --batch B --seq T --steps N --runs FILE --log FILE [--timeout S]
                   [--metrics FILE] [--kind ddp|llmc] -- COMMAND...
      Runs COMMAND (ddp-train with --log-every 1, or llm.c's train_gpt2cu), stamps every output
      line with the time it arrived, and appends one JSON line to --runs: ok, why (oom, timeout,
      no-gpu, exit N), steady tokens/s, ms/step, MFU.
      Steady = steps 2..N. ddp-train (--kind ddp): (N - 1) x B x T over the time between the
      arrival of the lines of step 1 and step N (with --log-every 1 it prints each line right after
      the host waited for that step, so the arrival times are the steps' ends). llm.c (--kind
      llmc): the mean of its own per-step times for steps 2..N ("step k/N | ... | 33.13 ms | ...",
      CUDA events around each step), tokens/s = B x T / that mean; not arrival times, since its
      stdout through a pipe is block-buffered unless run under stdbuf -oL (all its lines can
      arrive at once). Its "total average iteration time" (the same steps 2..N) is kept beside it.
  gpu_gpt.py reparse --runs FILE --log FILE [--out FILE]
      Recomputes the llm.c records of --runs from their output in --log (bench.log) as `train`
      now does, and writes the records to --out (default: standard output).
  gpu_gpt.py ncu CSV [--step-ms MS] [--top N]
      ncu's CSV (--metrics gpu__time_duration.sum --csv) summed by kernel name: count, total ms,
      percent of the kernels' sum, sorted; and the sum against the step's measured time.
  gpu_gpt.py summary --runs FILE [--suite FILE] [--ncu FILE] [--header FILE]
      The table gpu_gpt.sh prints last.
  gpu_gpt.py preflight --build DIR [--llmc PATH] [--env FILE] [--hide LIB,...]
      What the machine has, before anything runs: the GPU (nvidia-smi: name, driver, memory,
      free memory), the CUDA runtime and driver versions, cuBLAS, cuDNN, NCCL and nvrtc (each
      loaded with ctypes and asked its version, or "not found"), and the libraries ddp-train and
      llm.c cannot find (ldd). --env writes the verdict as shell assignments for gpu_gpt.sh
      (PF_GPU, PF_DDP_MISSING, PF_LLMC_MISSING, PF_CUDNN, PF_NVRTC); --hide treats the named
      libraries as absent (gpu_gpt.sh --dry-run only).

MFU in llm.c's convention: FLOPs per token 6N + 6·L·C·T with N counting the padded vocabulary
(d12: N = 124,475,904, so 803.5 MFLOP per token at T 1024), over the dense bf16 peak (--peak,
default 989.4 TFLOP/s, the H100 SXM's and the H200's).
"""
import argparse
import collections
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

D12 = {"layers": 12, "channels": 768, "n_params": 124_475_904}
# N with the padded vocabulary (50,304 rows), as llm.c counts (models/gpt2_mfu.c, test_mfu)
MODELS = {"d12": D12, "d48": {"layers": 48, "channels": 1600, "n_params": 1_557_686_400}}
STEP_RE = re.compile(r"^\s*step\s+(\d+)/(\d+)\b")
LLMC_STEP_RE = re.compile(r"^\s*step\s+(\d+)/(\d+)\s*\|.*\|\s*([0-9.]+) ms\s*\|")
LLMC_AVG_RE = re.compile(r"total average iteration time: ([0-9.]+) ms")
OOM_RE = re.compile(r"out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
                    r"CUDNN_STATUS_ALLOC_FAILED|cannot allocate .* device|OOM", re.I)
NO_GPU_RE = re.compile(r"no usable (CUDA device|GPU)|no CUDA-capable device|CUDA driver version is "
                       r"insufficient|cudaErrorNoDevice|cudaErrorInsufficientDriver|NVIDIA driver", re.I)


def flops_per_token(seq, m=D12):
    return 6.0 * m["n_params"] + 6.0 * m["layers"] * m["channels"] * seq


def llmc_steady(lines, batch, seq, peak):
    """The steady figures of one llm.c run from its own output lines: {} without step lines.
    Its per-step ms are CUDA events around each step; the mean over steps 2..N leaves the first
    out, as its "total average iteration time" does (train_gpt2.cu sums steps with step > 0 and
    divides by N - 1)."""
    ms = {}
    avg = None
    for line in lines:
        m = LLMC_STEP_RE.match(line)
        if m:
            ms[int(m.group(1))] = float(m.group(3))
        m = LLMC_AVG_RE.search(line)
        if m and float(m.group(1)) > 0:
            avg = float(m.group(1))
    rec = {}
    if avg is not None:
        rec["llmc_own_ms"] = avg
        rec["llmc_own_tokens_per_s"] = round(batch * seq / (avg / 1e3), 1)
    steady = [v for k, v in sorted(ms.items()) if k >= 2]
    if len(steady) >= 2:
        mean = sum(steady) / len(steady)
        tps = batch * seq / (mean / 1e3)
        rec.update(steady_steps=f"2..{max(ms)}", steady_from="llm.c's per-step ms",
                   tokens_per_s=round(tps, 1), ms_per_step=round(mean, 2),
                   mfu=round(tps * flops_per_token(seq) / (peak * 1e12), 4))
    return rec


def cmd_train(a):
    start = time.monotonic()
    steps = {}  # step -> arrival time (s since start)
    tail = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(a.log, "a") as log:
        log.write(f"\n==== {a.label} B {a.batch}: {' '.join(a.command)}\n")
        log.flush()
        try:
            p = subprocess.Popen(a.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as e:
            p, rc, timed_out = None, 127, False
            tail.append(str(e))
            log.write(f"cannot start: {e}\n")
        if p:
            deadline = start + a.timeout
            timed_out = False

            def on_alarm(*_):
                nonlocal timed_out
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, max(1.0, deadline - time.monotonic()))
            for raw in p.stdout:
                t = time.monotonic() - start
                line = raw.decode(errors="replace").rstrip("\n")
                log.write(f"[{t:8.3f}] {line}\n")
                m = STEP_RE.match(line)
                if m:
                    steps[int(m.group(1))] = t
                tail.append(line)
                del tail[:-200]
            p.wait()
            signal.setitimer(signal.ITIMER_REAL, 0)
            rc = p.returncode
            log.write(f"==== {a.label} B {a.batch}: exit {rc}{' (timed out)' if timed_out else ''} "
                      f"after {time.monotonic() - start:.1f} s\n")
    text = "\n".join(tail)
    rec = {"label": a.label, "kind": a.kind, "batch": a.batch, "seq": a.seq, "steps": a.steps,
           "exit": rc, "wall_s": round(time.monotonic() - start, 2), "ok": False, "why": ""}
    last = max(steps) if steps else 0
    if rc == 0 and 1 in steps and last >= 3:
        dt = steps[last] - steps[1]
        tok = (last - 1) * a.batch * a.seq
        tps = tok / dt if dt > 0 else 0.0
        rec.update(ok=True, steady_steps=f"2..{last}", tokens_per_s=round(tps, 1),
                   ms_per_step=round(1e3 * dt / (last - 1), 2),
                   mfu=round(tps * flops_per_token(a.seq, MODELS[a.model]) / (a.peak * 1e12), 4))
    elif timed_out:
        rec["why"] = f"timeout ({a.timeout:.0f} s)"
    elif OOM_RE.search(text):
        rec["why"] = "oom"
    elif NO_GPU_RE.search(text):
        rec["why"] = "no-gpu"
    else:
        rec["why"] = f"exit {rc}" + (f", {last} step line(s)" if rc == 0 else "")
    if a.kind == "llmc":
        # its own per-step times, not the lines' arrival times (block-buffered stdout)
        own = llmc_steady(tail, a.batch, a.seq, a.peak)
        if rec["ok"] and "tokens_per_s" in own:
            rec.update(own)
        else:
            rec.update({k: v for k, v in own.items() if k.startswith("llmc_own")})
    if a.metrics and os.path.exists(a.metrics):
        for line in open(a.metrics):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("summary"):
                for k in ("tokens_per_s", "train_seconds", "mem_device_used_mib", "mem_activations_mib",
                          "tokens_per_s_steady", "mfu", "ms_per_step"):
                    if k in j:
                        rec["ddp_" + k] = j[k]
    with open(a.runs, "a") as f:
        f.write(json.dumps(rec) + "\n")
    state = "ok" if rec["ok"] else f"FAILED ({rec['why']})"
    extra = f": {rec['tokens_per_s']:,.0f} tokens/s, {rec['ms_per_step']} ms/step, MFU {100 * rec['mfu']:.1f} %" if rec["ok"] else ""
    print(f"gpu_gpt: {a.label} B {a.batch}: {state}{extra} ({rec['wall_s']:.0f} s)", flush=True)
    return 0 if rec["ok"] else {"oom": 3, "no-gpu": 4}.get(rec["why"], 1)


def cmd_reparse(a):
    """The llm.c records of --runs recomputed from their blocks of --log."""
    stamp = re.compile(r"^\[\s*[0-9.]+\] ")
    blocks, cur = {}, None
    for line in open(a.log, errors="replace"):
        line = line.rstrip("\n")
        m = re.match(r"^==== (.+) B (\d+): (.*)$", line)
        if m:
            key = (m.group(1), int(m.group(2)))
            cur = None if m.group(3).startswith("exit ") else blocks.setdefault(key, [])
            if cur is not None:
                cur.clear()
            continue
        if cur is not None:
            cur.append(stamp.sub("", line))
    out = []
    for line in open(a.runs):
        r = json.loads(line)
        lines = blocks.get((r["label"], r["batch"]))
        if r["kind"] == "llmc" and r["ok"] and lines:
            own = llmc_steady(lines, r["batch"], r["seq"], a.peak)
            if "tokens_per_s" in own:
                r.update(own)
        out.append(json.dumps(r))
    f = open(a.out, "w") if a.out and a.out != "-" else sys.stdout
    f.write("\n".join(out) + "\n")
    return 0


def short_name(name):
    """A kernel's demangled name without its return type and parameter list (templates kept)."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            return name[:i]
    return name


def read_ncu(path):
    """{kernel name: [count, total ns]} from ncu's --csv output (details or raw page)."""
    text = open(path, errors="replace").read()
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return {}
    # the CSV's lines all start with a quote; anything else (==PROF== notes, the program's own
    # output when ncu's report went to the same stream) is left out
    rows = list(csv.reader(io.StringIO("\n".join(l for l in lines[start:] if l.startswith('"')))))
    head = rows[0]
    name_col = head.index("Kernel Name") if "Kernel Name" in head else None
    if name_col is None:
        return {}
    scale = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
    out = {}
    if "Metric Name" in head:  # details page: one row per kernel and metric
        mn, mu, mv = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
        for r in rows[1:]:
            if len(r) <= mv or r[mn] != "gpu__time_duration.sum":
                continue
            ns = float(r[mv].replace(",", "")) * scale.get(r[mu].strip(), 1.0)
            e = out.setdefault(short_name(r[name_col]), [0, 0.0])
            e[0] += 1
            e[1] += ns
    elif "gpu__time_duration.sum" in head:  # raw page: a units row, then one row per kernel
        c = head.index("gpu__time_duration.sum")
        unit = rows[1][c].strip() if len(rows) > 1 else "nsecond"
        for r in rows[2:]:
            if len(r) <= c or not r[c].strip():
                continue
            ns = float(r[c].replace(",", "")) * scale.get(unit, 1.0)
            e = out.setdefault(short_name(r[name_col]), [0, 0.0])
            e[0] += 1
            e[1] += ns
    return out


def cmd_ncu(a):
    k = {}
    for path in [a.csv] + a.also:  # ncu's --log-file, else wherever its report went
        if os.path.exists(path):
            k = read_ncu(path)
            if k:
                break
    if not k:
        print(f"gpu_gpt: no kernel rows with gpu__time_duration.sum in {a.csv}")
        return 1
    if a.per_call:
        return ncu_per_call(k, a.per_call)
    total = sum(v[1] for v in k.values())
    n = sum(v[0] for v in k.values())
    print(f"per-kernel GPU time of one steady training step (ncu gpu__time_duration.sum, summed by name):")
    print(f"{'kernel':90} {'count':>6} {'ms':>9} {'%':>6}")
    for name, (c, ns) in sorted(k.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"{name[:90]:90} {c:6d} {ns / 1e6:9.3f} {100 * ns / total:6.1f}")
    if len(k) > a.top:
        rest = sorted(k.items(), key=lambda kv: -kv[1][1])[a.top:]
        print(f"{'(' + str(len(rest)) + ' more kernels)':90} {sum(v[0] for _, v in rest):6d} "
              f"{sum(v[1] for _, v in rest) / 1e6:9.3f} {100 * sum(v[1] for _, v in rest) / total:6.1f}")
    line = f"{n} kernels, {len(k)} names, {total / 1e6:.2f} ms of kernel time"
    if a.step_ms:
        line += (f"; the step took {a.step_ms:.2f} ms without the profiler (steady ms/step of the same "
                 f"build and batch): kernels cover {100 * total / 1e6 / a.step_ms:.0f} % of it")
    print(line)
    return 0


def ncu_per_call(k, calls):
    """Kernels profiled over several steps: each one's mean time per call, and that times the calls
    a step makes (one per layer), summed: the step's time in these kernels."""
    print(f"per-kernel GPU time per call (ncu gpu__time_duration.sum), x {calls} calls a step:")
    print(f"{'kernel':90} {'calls':>6} {'us/call':>9} {'ms/step':>8}")
    step = 0.0
    for name, (c, ns) in sorted(k.items(), key=lambda kv: -kv[1][1] / kv[1][0]):
        per = ns / c
        step += per * calls / 1e6
        print(f"{name[:90]:90} {c:6d} {per / 1e3:9.1f} {per * calls / 1e6:8.3f}")
    print(f"{len(k)} names; {step:.2f} ms a step at {calls} calls each")
    return 0


def ldd_missing(path):
    """The libraries `ldd path` cannot find ("" for a script or a program it cannot read)."""
    if not path or not os.path.exists(path):
        return ""
    try:
        out = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return " ".join(l.split()[0] for l in out.splitlines() if "not found" in l)


def ldd_path(path, stem):
    """Where ldd resolves path's library named stem (e.g. libcudnn.so), else None."""
    if not path or not os.path.exists(path):
        return None
    try:
        out = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for l in out.splitlines():
        f = l.split()
        if f and f[0].startswith(stem) and "=>" in f and len(f) > 2 and f[2].startswith("/"):
            return f[2]
    return None


def load(names, hidden):
    """The first of names ctypes can load (a path or a soname), else None."""
    import ctypes
    for n in names:
        if not n or any(h and h in os.path.basename(n) for h in hidden):
            continue
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


def lib_versions(exe, hidden):
    """{library: version text or None} of the CUDA libraries the runs need."""
    import ctypes
    out = {}
    i, j, k = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    rt = load([ldd_path(exe, "libcudart.so"), "libcudart.so.13", "libcudart.so.12", "libcudart.so"], hidden)
    if rt and rt.cudaRuntimeGetVersion(ctypes.byref(i)) == 0:
        driver = f", driver API {j.value // 1000}.{j.value % 1000 // 10}" \
            if rt.cudaDriverGetVersion(ctypes.byref(j)) == 0 and j.value else ""
        out["CUDA runtime"] = f"{i.value // 1000}.{i.value % 1000 // 10}{driver}"
    else:
        out["CUDA runtime"] = None
    bl = load([ldd_path(exe, "libcublas.so"), "libcublas.so.13", "libcublas.so.12"], hidden)
    if bl and all(bl.cublasGetProperty(n, ctypes.byref(v)) == 0 for n, v in ((0, i), (1, j), (2, k))):
        out["cuBLAS"] = f"{i.value}.{j.value}.{k.value}"
    else:
        out["cuBLAS"] = None
    dn = load([ldd_path(exe, "libcudnn.so"), "libcudnn.so.9", "libcudnn.so"], hidden)
    if dn:
        dn.cudnnGetVersion.restype = ctypes.c_size_t
        v = dn.cudnnGetVersion()
        out["cuDNN"] = f"{v // 10000}.{v % 10000 // 100}.{v % 100} ({v})" if v >= 90000 else str(v)
        out["cudnn_number"] = v
    else:
        out["cuDNN"] = None
    nc = load([ldd_path(exe, "libnccl.so"), "libnccl.so.2", "libnccl.so"], hidden)
    if nc and nc.ncclGetVersion(ctypes.byref(i)) == 0:
        v = i.value
        out["NCCL"] = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else str(v)
    else:
        out["NCCL"] = None
    nv = load(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"], hidden)
    out["nvrtc"] = f"{i.value}.{j.value}" if nv and nv.nvrtcVersion(ctypes.byref(i), ctypes.byref(j)) == 0 \
        else None
    return out


def cmd_preflight(a):
    hidden = [h for h in (a.hide or "").split(",") if h]
    exe = os.path.join(a.build, "train", "ddp-train")
    try:  # without a GPU nvidia-smi says "No devices were found" and exits 6
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.free",
                            "--format=csv,noheader"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=60)
        smi = p.stdout.strip() if p.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        smi = ""
    gpu = smi.splitlines()[0] if smi else ""
    if gpu:
        f = [x.strip() for x in gpu.split(",")]
        print(f"preflight: GPU {f[0]}, driver {f[1] if len(f) > 1 else '?'}, memory "
              f"{f[2] if len(f) > 2 else '?'}, free {f[3] if len(f) > 3 else '?'}")
    else:
        print("preflight: GPU none (nvidia-smi lists no GPU): the GPU parts stop")
    v = lib_versions(exe, hidden)
    print("preflight: " + ", ".join(f"{n} {v[n] or 'not found'}"
                                    for n in ("CUDA runtime", "cuBLAS", "cuDNN", "NCCL", "nvrtc")))
    ddp_missing = ldd_missing(exe)
    llmc_missing = ldd_missing(a.llmc) if a.llmc else ""
    for h in hidden:  # a library hidden for a dry run counts as missing for the programs too
        if h in ("cudnn", "nccl", "cublas"):
            ddp_missing = (ddp_missing + f" lib{h}.so (hidden)").strip()
        if a.llmc and h in ("cudnn", "nvrtc", "cublas"):
            llmc_missing = (llmc_missing + f" lib{h}.so (hidden)").strip()
    print(f"preflight: ddp-train ({exe}): " + (f"MISSING {ddp_missing}" if ddp_missing else
                                               "every library found"))
    if a.llmc:
        print(f"preflight: llm.c ({a.llmc}): " + (f"MISSING {llmc_missing}" if llmc_missing else
                                                  "every library found"))
    if a.env:
        with open(a.env, "w") as f:
            f.write(f"PF_GPU={1 if gpu else 0}\n")
            f.write(f"PF_DDP_MISSING='{ddp_missing}'\n")
            f.write(f"PF_LLMC_MISSING='{llmc_missing}'\n")
            f.write(f"PF_CUDNN={v.get('cudnn_number', 0) if v['cuDNN'] else 0}\n")
            f.write(f"PF_NVRTC={1 if v['nvrtc'] else 0}\n")
    return 0


def cmd_summary(a):
    runs = [json.loads(l) for l in open(a.runs)] if a.runs and os.path.exists(a.runs) else []
    if a.header and os.path.exists(a.header):
        print(open(a.header).read().rstrip())
    print(f"\nGPT-2 d12, T {runs[0]['seq'] if runs else 1024}, bf16, one GPU; steady = steps 2..N; "
          f"MFU = tokens/s x {flops_per_token(runs[0]['seq'] if runs else 1024) / 1e6:.1f} MFLOP / {a.peak} TFLOP/s")
    print(f"{'run':22} {'B':>4} {'tokens/s':>10} {'ms/step':>9} {'MFU':>7} {'vs llm.c':>9}  note")
    llmc = {r["batch"]: r for r in runs if r["kind"] == "llmc" and r["ok"]}
    for r in runs:
        if r["ok"]:
            ref = llmc.get(r["batch"])
            ratio = f"{r['tokens_per_s'] / ref['tokens_per_s']:.3f}x" if ref and r["kind"] != "llmc" else ""
            note = []
            if r["kind"] == "llmc":
                if r.get("steady_from"):
                    note.append(f"from its per-step ms, steps {r['steady_steps']}")
                else:
                    note.append("from the lines' arrival times (stdout block-buffered?)")
                if "llmc_own_tokens_per_s" in r:
                    note.append(f"its own average {r['llmc_own_ms']:.3f} ms = "
                                f"{r['llmc_own_tokens_per_s']:,.0f} tok/s")
            if r.get("ddp_mem_device_used_mib"):
                note.append(f"device {r['ddp_mem_device_used_mib']:,.0f} MiB")
            if r.get("ddp_tokens_per_s_steady"):
                note.append(f"ddp-train's own steady {r['ddp_tokens_per_s_steady']:,.0f}")
            print(f"{r['label'][:22]:22} {r['batch']:4d} {r['tokens_per_s']:10,.0f} {r['ms_per_step']:9.2f} "
                  f"{100 * r['mfu']:6.1f}% {ratio:>9}  {'; '.join(note)}")
        else:
            print(f"{r['label'][:22]:22} {r['batch']:4d} {'-':>10} {'-':>9} {'-':>7} {'':>9}  failed: {r['why']}")
    for path, what in ((a.suite, "suite"), (a.ncu, "ncu")):
        if path and os.path.exists(path):
            lines = open(path).read().rstrip().splitlines()
            if what == "suite":
                print("\n" + (lines[-1] if lines else "suite: no output"))
                fails = [l for l in lines if re.search(r" (FAIL|TIMEOUT) ", l)]
                for l in fails:
                    print("  " + l)
            else:
                print("\n" + "\n".join(lines if len(lines) <= 15 else lines[:14] + lines[-1:]))
    return 0


def cmd_zero(a):
    """One traced multi-rank run: per rank, the parameters' all-gathers (spans per bucket tag), the
    forward's gather waits and stage 2's mid-backward waits (host spans, and the CUDA-timed
    instants); then the --metrics summary's communication fields."""
    try:
        events = json.load(open(a.trace))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        print(f"gpu_gpt zero: no trace ({e})")
        return 1
    for pid in sorted({e["pid"] for e in events if "pid" in e}):
        mine = [e for e in events if e.get("pid") == pid and e.get("ph") in ("B", "X", "i", "I")]
        tags = collections.Counter(e.get("args", {}).get("arg") for e in mine if e.get("name") == "allgather")
        count = collections.Counter(e.get("name") for e in mine)
        print(f"rank {pid}: {sum(tags.values())} all-gathers over {len(tags)} buckets, at most "
              f"{max(tags.values(), default=0)} per bucket in {count['step']} steps; forward gather waits "
              f"{count['reducer.gather_wait']} spans, {count['reducer.gather_exposed']} CUDA-timed; "
              f"mid-backward waits {count['reducer.recycle_wait']} spans, {count['reducer.recycle_exposed']} CUDA-timed")
    try:
        summary = [json.loads(line) for line in open(a.metrics) if line.strip()][-1]
    except (OSError, ValueError, IndexError) as e:
        print(f"gpu_gpt zero: no metrics ({e})")
        return 1
    print("metrics: " + ", ".join(f"{k} {summary.get(k)}" for k in
                                  ("gather_wait_ms", "exposed_comm_ms", "comm_ms", "hidden_fraction", "ms_per_step",
                                   "allgather_calls", "allgather_bytes")))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", type=float, default=989.4, help="dense bf16 peak, TFLOP/s")
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train")
    t.add_argument("--label", required=True)
    t.add_argument("--kind", default="ddp", choices=["ddp", "llmc"])
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--model", choices=sorted(MODELS), default="d12",
                   help="the preset whose FLOPs per token the MFU counts (default d12)")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--runs", required=True)
    t.add_argument("--log", required=True)
    t.add_argument("--metrics")
    t.add_argument("--timeout", type=float, default=300)
    t.add_argument("command", nargs=argparse.REMAINDER)
    n = sub.add_parser("ncu")
    n.add_argument("csv")
    n.add_argument("--step-ms", type=float, default=0)
    n.add_argument("--also", nargs="*", default=[], help="other files to look in for the CSV")
    n.add_argument("--top", type=int, default=25)
    n.add_argument("--per-call", type=int, default=0,
                   help="kernels from several steps: time per call x this many calls a step")
    s = sub.add_parser("summary")
    s.add_argument("--runs")
    s.add_argument("--suite")
    s.add_argument("--ncu")
    s.add_argument("--header")
    r = sub.add_parser("reparse")
    r.add_argument("--runs", required=True)
    r.add_argument("--log", required=True)
    r.add_argument("--out", default="-")
    pf = sub.add_parser("preflight")
    pf.add_argument("--build", required=True)
    pf.add_argument("--llmc")
    pf.add_argument("--env")
    pf.add_argument("--hide", help="libraries to treat as absent (dry runs)")
    z = sub.add_parser("zero")
    z.add_argument("--trace", required=True)
    z.add_argument("--metrics", required=True)
    a = ap.parse_args()
    if a.what == "train":
        if a.command and a.command[0] == "--":
            a.command = a.command[1:]
        return cmd_train(a)
    return {"ncu": cmd_ncu, "summary": cmd_summary, "reparse": cmd_reparse, "zero": cmd_zero,
            "preflight": cmd_preflight}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
