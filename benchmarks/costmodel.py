#!/usr/bin/env python3
"""costmodel.py - a cost model of one data-parallel training step, past the machines at hand.

Formulas (times in seconds, sizes in bytes; p GPUs = N nodes x g GPUs per node):

Compute. Either measured: t_compute = samples_per_step_per_gpu / (samples/s of one GPU alone), or
from an assumed model FLOPs utilisation: t_compute = 6 * P * tokens_per_gpu / (MFU * peak_flops)
(forward 2PT, backward 4PT). The backward pass is 2/3 of it, the forward 1/3.

All-reduce of S bytes (alpha-beta costs; alpha per step, B bandwidth per GPU and direction):
  ring: 2(p-1) steps of S/p bytes each:  T_ring = 2(p-1) * (alpha + S / (p * B))
        (the bus-bandwidth convention of nccl-tests: busbw = algbw * 2(p-1)/p)
  tree: NCCL's double binary tree over nodes, a chain inside each node; the latency grows with
        log2(N) instead of p: T_tree = 2 * (ceil(log2 N) * alpha_net + (g - 1) * alpha_nvl)
        + 2 * S / B. Its bandwidth term is the ring's bound (2S/B up to the (p-1)/p factor): with one
        NIC per GPU NCCL's tree does not beat the ring's bandwidth (NVIDIA, nccl-tests issue 196).
  NCCL picks the faster one per call; so does this model. On one node (N = 1): alpha = alpha_nvl,
  B = B_nvl; across nodes every ring crosses the network, so alpha = alpha_net and
  B = min(B_net, B_nvl) (each GPU's traffic leaves through its own NIC: rail-optimised nodes).

Buckets and overlap: gradients come out at an even rate during the backward pass, last
parameters first; bucket k (caps as in libddp: the first bucket first_cap, the others cap) is
ready when the backward pass has produced its bytes: t_ready_k = t_bwd * (bytes up to k) / total.
All-reduces run one at a time, in order: end_k = max(t_ready_k, end_{k-1}) + T(S_k). Without
overlap every bucket is ready at t_bwd. Exposed communication = max(0, end_last - t_bwd).
  step = t_fwd + t_bwd + exposed + t_other,   efficiency = t_compute_alone / step
(weak scaling: the batch per GPU is fixed, so one GPU alone takes t_compute_alone per step).

Why efficiency falls below 90 % (the first that applies):
  compute too short: the all-reduces take longer than the whole backward pass, so no overlap
      can hide them (then: latency-bound when the alpha terms are most of it);
  latency-bound: the alpha terms are most of the exposed time (many small buckets, many steps);
  bandwidth-bound: the bucket(s) left after the backward pass take that long to move.

Defaults, for H100 SXM nodes of 8 GPUs (sources):
  B_nvl   = 450 GB/s per direction: NVLink 4, 900 GB/s bidirectional per GPU (NVIDIA H100 data
            sheet; DGX H100 user guide).
  B_net   = 50 GB/s = 400 Gb/s per GPU: one ConnectX-7 400 Gb/s NIC per GPU, 8 per DGX H100 node
            (DGX H100 user guide, network modules table). Both are peaks; the model multiplies
            them by link_efficiency = 0.9 (an assumption; calibrate with nccl-tests' busbw).
  alpha_nvl = 1 us, alpha_net = 5 us per step: assumptions of the right order for NCCL's LL/Simple
            protocols; calibrate with small-message nccl-tests or ddp-allreduce-bench times.
  peak    = 989 TFLOP/s dense BF16 (NVIDIA H100 SXM data sheet), MFU 0.40 (an assumption).
  gradients in 4 bytes (libddp's fp32 buckets; --grad-bytes 2 for 16-bit), caps 25 MiB / 1 MiB.
Other sources: nccl-tests doc/PERFORMANCE.md (algbw, busbw, 2(n-1)/n); NVIDIA developer blog
"Massively Scale Your Deep Learning Training with NCCL 2.4" (double binary trees, logarithmic
latency).

Usage:
  costmodel.py table [--params 1e6,1e7,1e8,1e9,7e9] [--gpus 8,...,4096] [options]
  costmodel.py plot OUT.png [options]          (gnuplot; efficiency vs GPUs per model size)
  costmodel.py local --calib BENCH2.csv ...    (see `local --help`: the local cluster check;
                                               --model gpt2 --layers L --channels C --seq T for
                                               the GPT's bucket plan, see gpt2_marks)
"""
import argparse
import csv
import math
import shutil
import statistics
import subprocess
import sys
import tempfile

MIB = 1024 * 1024


class Hardware:
    """Link parameters; bandwidths in bytes/s (per GPU, per direction), latencies in seconds."""

    def __init__(self, gpus_per_node=8, b_nvl=450e9, b_net=50e9, alpha_nvl=1e-6, alpha_net=5e-6,
                 link_efficiency=0.9):
        self.g = gpus_per_node
        self.b_nvl = b_nvl * link_efficiency
        self.b_net = b_net * link_efficiency
        self.alpha_nvl = alpha_nvl
        self.alpha_net = alpha_net


def ring_time(size, p, alpha, bw):
    """Ring all-reduce of `size` bytes over p ranks: 2(p-1) steps of size/p bytes."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * (alpha + size / (p * bw))


def link_of(hw, nodes):
    """(alpha, bandwidth) of a ring step: NVLink inside one node, the network across nodes."""
    if nodes <= 1:
        return hw.alpha_nvl, hw.b_nvl
    return hw.alpha_net, min(hw.b_net, hw.b_nvl)


def tree_time(size, nodes, hw):
    """NCCL double binary tree across nodes, a chain inside each node (see the top)."""
    p = nodes * hw.g
    if p <= 1:
        return 0.0
    _, bw = link_of(hw, nodes)
    depth = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    return 2 * (depth * hw.alpha_net + (hw.g - 1) * hw.alpha_nvl) + 2 * size / bw


def allreduce_time(size, nodes, hw):
    """(time, algorithm, latency part) of NCCL's choice: the faster of ring and tree."""
    p = nodes * hw.g
    alpha, bw = link_of(hw, nodes)
    ring = ring_time(size, p, alpha, bw)
    tree = tree_time(size, nodes, hw)
    if p <= 1:
        return 0.0, "none", 0.0
    if ring <= tree:
        return ring, "ring", 2 * (p - 1) * alpha
    depth = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    return tree, "tree", 2 * (depth * hw.alpha_net + (hw.g - 1) * hw.alpha_nvl)


def plan_buckets(total_bytes, cap, first_cap):
    """Bucket sizes in the order they become ready (libddp: the first bucket's cap is first_cap).
    Parameters are treated as divisible (a large model's layers are much smaller than its total)."""
    sizes, left = [], total_bytes
    while left > 0:
        s = min(left, first_cap if not sizes else cap)
        sizes.append(s)
        left -= s
    return sizes


def step_time(t_fwd, t_bwd, bucket_sizes, comm, overlap=True, t_other=0.0, ready_at=None):
    """Step time, exposed communication, total all-reduce time and latency part (see the top).
    comm(size) -> (time, latency part). ready_at: each bucket's ready time as a fraction of the
    backward pass (default: gradients at an even rate, bucket k ready with its last byte)."""
    total = sum(bucket_sizes)
    end, produced, comm_total, lat_total, exposed_lat = 0.0, 0.0, 0.0, 0.0, 0.0
    for k, s in enumerate(bucket_sizes):
        produced += s
        frac = produced / total if ready_at is None else ready_at[k]
        ready = t_bwd * frac if overlap else t_bwd
        t, lat = comm(s)
        start = max(ready, end)
        end = start + t
        comm_total += t
        lat_total += lat
        if end > t_bwd:  # the part of this bucket past the backward pass is exposed
            exposed_lat += lat * min(1.0, (end - max(start, t_bwd)) / t) if t > 0 else 0.0
    exposed = max(0.0, end - t_bwd)
    return t_fwd + t_bwd + exposed + t_other, exposed, comm_total, exposed_lat, lat_total


def why_inefficient(exposed, comm_total, t_bwd, exposed_lat, last_bucket):
    if comm_total > t_bwd:
        kind = "latency-bound" if exposed_lat > exposed / 2 else "bandwidth-bound"
        return (f"compute too short to hide communication: all-reduces {1e3 * comm_total:.2f} ms > "
                f"backward {1e3 * t_bwd:.2f} ms ({kind})")
    if exposed_lat > exposed / 2:
        return f"latency-bound: per-step latencies are {100 * exposed_lat / exposed:.0f}% of the exposed time"
    return (f"bandwidth-bound: the last bucket ({last_bucket / MIB:.1f} MiB) moves after the backward pass "
            f"({1e3 * exposed:.2f} ms exposed)")


def predict(params, gpus, hw, args):
    """One configuration: dict with step, efficiency, exposed, algorithm, reason."""
    nodes = max(1, gpus // hw.g)
    t_compute = 6 * params * args.tokens / (args.mfu * args.peak_tflops * 1e12)
    t_fwd, t_bwd = t_compute / 3, 2 * t_compute / 3
    sizes = plan_buckets(params * args.grad_bytes, args.bucket_mb * MIB, args.first_bucket_mb * MIB)
    comm = lambda s: (lambda r: (r[0], r[2]))(allreduce_time(s, nodes, hw))
    step, exposed, comm_total, exp_lat, _ = step_time(t_fwd, t_bwd, sizes, comm, not args.no_overlap)
    eff = t_compute / step
    algo = allreduce_time(sizes[-1], nodes, hw)[1]
    reason = why_inefficient(exposed, comm_total, t_bwd, exp_lat, sizes[-1]) if eff < 0.9 else ""
    return dict(params=params, gpus=gpus, step=step, eff=eff, exposed=exposed, comm=comm_total,
                compute=t_compute, algo=algo, buckets=len(sizes), reason=reason)


def hw_from(args):
    return Hardware(args.gpus_per_node, args.nvlink_gbs * 1e9, args.net_gbps / 8 * 1e9,
                    args.alpha_nvl_us * 1e-6, args.alpha_net_us * 1e-6, args.link_efficiency)


def cmd_table(args):
    hw = hw_from(args)
    print(f"# {args.gpus_per_node} GPUs/node, NVLink {args.nvlink_gbs:g} GB/s, network {args.net_gbps:g} Gb/s per "
          f"GPU (x{args.link_efficiency:g}), alpha {args.alpha_nvl_us:g}/{args.alpha_net_us:g} us, "
          f"{args.tokens} tokens/GPU/step, MFU {args.mfu:g} of {args.peak_tflops:g} TFLOP/s, "
          f"{args.grad_bytes}-byte gradients, buckets {args.bucket_mb:g}/{args.first_bucket_mb:g} MiB, "
          f"overlap {'off' if args.no_overlap else 'on'}")
    print(f"{'params':>8} {'gpus':>5} {'compute_ms':>10} {'comm_ms':>9} {'exposed_ms':>10} {'step_ms':>9} "
          f"{'eff':>6} {'algo':>5}  below 90% because")
    for params in args.params:
        for gpus in args.gpus:
            r = predict(params, gpus, hw, args)
            print(f"{params:8.0e} {gpus:5d} {1e3 * r['compute']:10.3f} {1e3 * r['comm']:9.3f} "
                  f"{1e3 * r['exposed']:10.3f} {1e3 * r['step']:9.3f} {100 * r['eff']:5.1f}% {r['algo']:>5}  "
                  f"{r['reason']}")


def cmd_plot(args):
    hw = hw_from(args)
    if not shutil.which("gnuplot"):
        sys.exit("costmodel: gnuplot not found: apt-get install -y gnuplot-nox")
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for i, params in enumerate(args.params):
            path = f"{tmp}/m{i}.dat"
            with open(path, "w") as f:
                for gpus in args.gpus:
                    f.write(f"{gpus} {predict(params, gpus, hw, args)['eff']}\n")
            plots.append(f"'{path}' using 1:2 with linespoints title '{params:.0e} parameters'")
        script = (f"set terminal pngcairo size 900,560 noenhanced\nset output '{args.out}'\n"
                  "set title 'predicted scaling efficiency, H100 nodes of 8 GPUs, 400 Gb/s per GPU'\n"
                  "set xlabel 'GPUs'\nset ylabel 'efficiency'\nset logscale x 2\nset yrange [0:1.05]\n"
                  "set grid\nset key bottom left\n"
                  "plot " + ", ".join(plots) + ", 0.9 with lines dashtype 2 lc rgb 'gray' title '90%'\n")
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"costmodel: wrote {args.out}")


# ---- GPT-2: the parameter table in marking order, and its buckets -------------------------------

def gpt2_marks(layers, channels, seq, vocab=50257, positions=1024):
    """[(name, numel, ready)] in the order models/gpt2.c's backward marks the gradients ready:
    ln_f after the LM head, then each layer from the last (c_proj and c_fc of the MLP, ln_2, the
    attention's c_proj, c_attn, ln_1; bias before weight), then wpe and wte (tied with the LM head:
    complete only after the encoder's part, at the end). ready = the share of the backward FLOPs
    done (per token: a linear layer of n x m weights 4nm, the causal attention 4 seq C, the LM head
    4 C x padded vocab; layer norms, GELU and the encoder counted as nothing)."""
    c, vp = channels, (vocab + 127) // 128 * 128
    steps = [(4 * c * vp, [("ln_f.bias", c), ("ln_f.weight", c)])]
    for l in reversed(range(layers)):
        h = f"h.{l}."
        steps += [(16 * c * c, [(h + "mlp.c_proj.bias", c), (h + "mlp.c_proj.weight", 4 * c * c)]),
                  (16 * c * c, [(h + "mlp.c_fc.bias", 4 * c), (h + "mlp.c_fc.weight", 4 * c * c)]),
                  (0, [(h + "ln_2.bias", c), (h + "ln_2.weight", c)]),
                  (4 * c * c, [(h + "attn.c_proj.bias", c), (h + "attn.c_proj.weight", c * c)]),
                  (4 * seq * c + 12 * c * c, [(h + "attn.c_attn.bias", 3 * c), (h + "attn.c_attn.weight", 3 * c * c)]),
                  (0, [(h + "ln_1.bias", c), (h + "ln_1.weight", c)])]
    steps.append((0, [("wpe.weight", positions * c), ("wte.weight", vp * c)]))
    total, done, out = sum(f for f, _ in steps), 0, []
    for flops, params in steps:
        done += flops
        out += [(name, n, done / total) for name, n in params]
    return out


def group_buckets(marks, cap, first_cap, grad_bytes=4):
    """libddp's buckets after the rebuild in ready order: parameters in marking order, a bucket
    takes the next one always and more while its fp32 size stays within the cap (the first bucket's
    cap is first_cap). Returns ([bytes on the wire], [ready: its last parameter's])."""
    sizes, ready, i = [], [], 0
    while i < len(marks):
        lim = first_cap if not sizes else cap
        n, i = marks[i][1], i + 1
        while i < len(marks) and (n + marks[i][1]) * 4 <= lim:
            n, i = n + marks[i][1], i + 1
        sizes.append(n * grad_bytes)
        ready.append(marks[i - 1][2])
    return sizes, ready


# ---- the local cluster: calibrate on 2 nodes, predict 2 and 4 --------------------------------

def bench_curve(bench_rows, ranks):
    """[(size, median time)] of ddp-allreduce-bench at `ranks`, by size."""
    by = {}
    for r in bench_rows:
        if int(r["ranks"]) == ranks:
            by.setdefault(int(r["size_bytes"]), []).append(float(r["time_us"]) * 1e-6)
    return [(s, statistics.median(t)) for s, t in sorted(by.items())]


def fit_link(bench_rows, ranks, min_bw_bytes=4 * MIB):
    """alpha (s per step) and B (bytes/s) of a ring, T(S) = 2(p-1) alpha + 2(p-1)/p * S / B, read off
    ddp-allreduce-bench times (medians per size) at `ranks` as nccl-tests' figures are: alpha from the
    smallest size, B the median over the sizes of at least min_bw_bytes of 2(p-1)/p * S / (T - 2(p-1)
    alpha). Not a least-squares line over all sizes: on a token-bucket link (tc tbf, 256 KB burst)
    small messages pass at the unshaped rate, and the large sizes' noise of a few ms moved such a
    line's intercept, alpha, from about 0.1 ms to 2.5 ms."""
    if ranks < 2:
        sys.exit(f"costmodel: --calib-ranks {ranks}: the ring is fitted to all-reduces of 2 or more ranks")
    pts = bench_curve(bench_rows, ranks)
    large = [(s, t) for s, t in pts if s >= min_bw_bytes]
    if len(pts) < 2 or not large or pts[0][0] >= min_bw_bytes:
        sys.exit(f"costmodel: need ddp-allreduce-bench times at {ranks} ranks for a small size (latency) and "
                 f"sizes of at least {min_bw_bytes} bytes (bandwidth), e.g. scaling.sh --bench-sizes 4K:16M")
    p = ranks
    alpha = pts[0][1] / (2 * (p - 1))
    bws = [2 * (p - 1) / p * s / (t - 2 * (p - 1) * alpha) for s, t in large if t > 2 * (p - 1) * alpha]
    if not bws:
        sys.exit(f"costmodel: the large all-reduces at {ranks} ranks took no longer than the smallest one")
    return alpha, statistics.median(bws)


def local_predict(args):
    """Predicted step time for each measured multi-rank configuration; returns rows for the report.
    Compute is measured (the critical path: step - the slowest rank's wait, from the same runs:
    namespace nodes share the machine's cores, so compute depends on the rank count and on the
    machine's other load); the model predicts the communication: the ring's alpha and B fitted to
    ddp-allreduce-bench at --calib-ranks ranks give every bucket's all-reduce at every rank count.
    The GPT (--model gpt2) has its own bucket plan (gpt2_marks, group_buckets: the largest
    gradient, the tied token embedding, is ready only at the end of the backward pass); each row
    also carries the prediction from the compute measured at 1 rank (pred_1rank: what the step
    would take if the ranks did not share cores). Returns ((alpha, B), rows)."""
    alpha, bw = fit_link(list(csv.DictReader(open(args.calib))), args.calib_ranks)
    groups, alone = {}, {}
    for r in csv.DictReader(open(args.runs)):
        if r["mode"] != "weak":
            continue
        key = (r["bucket_mb"], r["overlap"])
        if int(r["ranks"]) > 1:
            groups.setdefault((int(r["ranks"]),) + key, []).append(r)
        else:
            alone.setdefault(key, []).append(r)
    out = []
    # The steady state (medians over each run's steps) where runs.csv has it, else means over steps.
    step_of = lambda r: float(r.get("step_med_ms") or r["step_ms"])
    wait_of = lambda r: float(r.get("exposed_min_med_ms") or r["exposed_min_ms"])
    compute_of = lambda rows: statistics.median(step_of(r) - wait_of(r) for r in rows) * 1e-3
    for (ranks, bucket, overlap), runs in sorted(groups.items()):
        t_compute = compute_of(runs)
        sizes, ready = bucket_plan_of(args, bucket)
        comm = lambda s: (ring_time(s, ranks, alpha, bw), 2 * (ranks - 1) * alpha)
        bwd = args.backward_share

        def predict_from(t):
            return step_time(t * (1 - bwd), t * bwd, sizes, comm, overlap == "on", ready_at=ready)[:2]

        step, exposed = predict_from(t_compute)
        step1 = predict_from(compute_of(alone[(bucket, overlap)]))[0] if (bucket, overlap) in alone else None
        measured = statistics.median(step_of(r) for r in runs) * 1e-3
        out.append(dict(ranks=ranks, bucket=bucket, overlap=overlap, predicted=step, measured=measured,
                        pred_1rank=step1, buckets=len(sizes),
                        error=(step - measured) / measured, compute=t_compute, exposed=exposed,
                        exposed_measured=statistics.median(wait_of(r) for r in runs) * 1e-3))
    return (alpha, bw), out


def bucket_plan_of(args, bucket):
    """(bucket sizes in bytes, ready fractions or None) of one --buckets value of scaling.sh."""
    cap = 1e12 if bucket == "one" else float(bucket) * MIB
    first = 1e12 if bucket == "one" else min(float(bucket), 1.0) * MIB
    if args.model == "gpt2":
        return group_buckets(gpt2_marks(args.layers, args.channels, args.seq), cap, first)
    return plan_buckets(args.grad_bytes_total, cap, first), None


def cmd_local(args):
    (alpha, bw), rows = local_predict(args)
    idle = sorted({r.get("idle_ms") or "0" for r in csv.DictReader(open(args.calib))})
    print(f"# calibration: ring fitted to ddp-allreduce-bench at {args.calib_ranks} ranks (--idle-ms {','.join(idle)}): "
          f"alpha {1e6 * alpha:.1f} us/step, B {bw / 1e6:.1f} MB/s per rank")
    total = sum(bucket_plan_of(args, "one")[0])
    what = (f"GPT-2 L {args.layers}, C {args.channels}, seq {args.seq}" if args.model == "gpt2" else "MLP")
    print(f"# compute measured (step - the slowest rank's wait, steady state), backward {args.backward_share:.2f} "
          f"of it; {what}: {total / 1e6:.2f} MB of gradients")
    print(f"{'ranks':>5} {'buckets':>7} {'overlap':>7} {'n_buck':>6} {'compute_ms':>10} {'comm_pred':>9} "
          f"{'comm_meas':>9} {'pred_ms':>8} {'meas_ms':>8} {'error':>7} {'pred_1rank':>10}")
    worst = 0.0
    for r in rows:
        p1 = "-" if r["pred_1rank"] is None else f"{1e3 * r['pred_1rank']:.1f}"
        print(f"{r['ranks']:5d} {r['bucket']:>7} {r['overlap']:>7} {r['buckets']:6d} {1e3 * r['compute']:10.1f} "
              f"{1e3 * r['exposed']:9.1f} {1e3 * r['exposed_measured']:9.1f} "
              f"{1e3 * r['predicted']:8.1f} {1e3 * r['measured']:8.1f} {100 * r['error']:6.1f}% {p1:>10}")
        if r["overlap"] == "off" or r["bucket"] == "one" or args.include_overlap:
            worst = max(worst, abs(r["error"]))
    print(f"worst error {100 * worst:.1f}% (limit {100 * args.max_error:.0f}%) over the configurations "
          f"{'without overlap' if not args.include_overlap else 'with and without overlap'}")
    return 0 if worst <= args.max_error else 1


def number_list(text):
    return [float(x) if "e" in x or "." in x else int(x) for x in text.split(",")]


def common(p):
    p.add_argument("--params", type=number_list, default=[1e6, 1e7, 1e8, 1e9, 7e9])
    p.add_argument("--gpus", type=lambda t: [int(x) for x in t.split(",")],
                   default=[8 * 2 ** k for k in range(10)])
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nvlink-gbs", type=float, default=450.0, help="GB/s per GPU per direction")
    p.add_argument("--net-gbps", type=float, default=400.0, help="Gb/s per GPU (NIC) per direction")
    p.add_argument("--link-efficiency", type=float, default=0.9)
    p.add_argument("--alpha-nvl-us", type=float, default=1.0)
    p.add_argument("--alpha-net-us", type=float, default=5.0)
    p.add_argument("--tokens", type=int, default=16384, help="tokens (samples) per GPU per step")
    p.add_argument("--mfu", type=float, default=0.4)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--grad-bytes", type=int, default=4)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float, default=1.0)
    p.add_argument("--no-overlap", action="store_true")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common(sub.add_parser("table", help="predictions for every model size and GPU count"))
    p = sub.add_parser("plot", help="efficiency vs GPUs, one line per model size (PNG)")
    common(p)
    p.add_argument("out")
    p = sub.add_parser("local", help="predicted vs measured step time on the local cluster")
    p.add_argument("--calib", required=True, help="allreduce.csv of benchmarks/scaling.sh (calibration)")
    p.add_argument("--calib-ranks", type=int, default=2,
                   help="fit the ring's alpha and bandwidth to the all-reduce benchmark at this many ranks "
                        "(default 2); they predict every rank count")
    p.add_argument("--runs", required=True, help="runs.csv of benchmarks/scaling.sh (weak scaling)")
    p.add_argument("--grad-bytes-total", type=float, help="gradient bytes per step (the MLP; required for it)")
    p.add_argument("--model", choices=("mlp", "gpt2"), default="mlp",
                   help="gpt2: the gradient bytes and the bucket plan from --layers/--channels/--seq")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--backward-share", type=float, default=2 / 3,
                   help="the backward pass's share of the measured compute (default 2/3; the rest: forward, "
                        "optimizer); read it off a 1-rank trace")
    p.add_argument("--include-overlap", action="store_true",
                   help="count configurations with overlap in the verdict too (see docs/scaling/README.md: the "
                        "2-core machine slows both sides of an overlap, which the model does not know)")
    p.add_argument("--max-error", type=float, default=0.15)
    args = ap.parse_args()
    if args.cmd == "table":
        cmd_table(args)
    elif args.cmd == "plot":
        cmd_plot(args)
    else:
        if args.model == "mlp" and args.grad_bytes_total is None:
            ap.error("local: the MLP needs --grad-bytes-total")
        sys.exit(cmd_local(args))


if __name__ == "__main__":
    main()
