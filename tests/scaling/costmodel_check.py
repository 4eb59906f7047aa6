#!/usr/bin/env python3
"""costmodel_check.py - unit test of benchmarks/costmodel.py: its ring all-reduce formula equals a
step-by-step simulation of the ring algorithm (reduce-scatter then all-gather, chunks of S/p moving
one hop per step, every rank's result checked against the exact sum) for small p and sizes; the
tree's latency grows with log2(nodes); the bucket/overlap schedule gives hand-computed times; the
GPT-2 bucket plan covers every gradient once, in the model's marking order.
Usage: costmodel_check.py SRC_DIR
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import costmodel  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    print(("ok     " if cond else "FAILED ") + what)
    failures += 0 if cond else 1


def simulate_ring(p, size, alpha, bw):
    """Runs the ring algorithm on p ranks holding vectors of p chunks (rank r, chunk c = r*10+c);
    returns (time, every rank ends with the exact sums). Each step every rank sends one chunk of
    size/p bytes to its right neighbour at the same time: a step costs alpha + (size/p)/bw."""
    data = [[float(r * 10 + c) for c in range(p)] for r in range(p)]
    t = 0.0
    for step in range(p - 1):  # reduce-scatter: rank r sends chunk (r - step) mod p
        sends = [(r, (r - step) % p, data[r][(r - step) % p]) for r in range(p)]
        for r, c, v in sends:
            data[(r + 1) % p][c] += v
        t += alpha + size / p / bw
    for step in range(p - 1):  # all-gather: rank r forwards its complete chunk (r + 1 - step) mod p
        sends = [(r, (r + 1 - step) % p, data[r][(r + 1 - step) % p]) for r in range(p)]
        for r, c, v in sends:
            data[(r + 1) % p][c] = v
        t += alpha + size / p / bw
    exact = [sum(r * 10 + c for r in range(p)) for c in range(p)]
    return t, all(row == exact for row in data)


for p in (2, 3, 4, 8):
    for size in (4096, 1 << 20, 40e6):
        t_sim, correct = simulate_ring(p, size, 7e-6, 1.2e8)
        t_model = costmodel.ring_time(size, p, 7e-6, 1.2e8)
        check(correct and math.isclose(t_sim, t_model, rel_tol=1e-12),
              f"ring p={p} S={size:g}: model {t_model:.6g} s = simulation {t_sim:.6g} s, sums exact")
check(costmodel.ring_time(1e6, 1, 1e-6, 1e9) == 0.0, "one rank: no all-reduce")
check(math.isclose(costmodel.ring_time(1e8, 2, 0, 1e9), 0.1), "2 ranks, no latency: S / B")

hw = costmodel.Hardware(gpus_per_node=8, alpha_nvl=1e-6, alpha_net=5e-6, link_efficiency=1.0)
lat = [costmodel.tree_time(0, n, hw) for n in (2, 4, 8, 16)]
check(all(math.isclose(b - a, 2 * 5e-6) for a, b in zip(lat, lat[1:])),
      "tree latency: 2 alpha_net more per doubling of nodes")
t, algo, _ = costmodel.allreduce_time(8, 512, hw)
check(algo == "tree", f"small message on 512 nodes: tree ({algo})")
t, algo, _ = costmodel.allreduce_time(1 << 30, 2, hw)
check(algo == "ring", f"1 GiB on 2 nodes: ring ({algo})")

check(costmodel.plan_buckets(100, 30, 10) == [10, 30, 30, 30], "buckets: first cap, then cap")
comm = lambda s: (s * 0.01, 0.0)  # 10 ms per byte-unit... 0.01 s per unit
step, exposed, total, _, _ = costmodel.step_time(1.0, 2.0, [10, 30, 30, 30], comm, overlap=False)
check(math.isclose(exposed, 1.0) and math.isclose(step, 4.0), "no overlap: all of it exposed")
# With overlap: ready at 0.2, 0.8, 1.4, 2.0 s; durations 0.1, 0.3, 0.3, 0.3: the last ends at 2.3.
step, exposed, total, _, _ = costmodel.step_time(1.0, 2.0, [10, 30, 30, 30], comm, overlap=True)
check(math.isclose(exposed, 0.3) and math.isclose(step, 3.3), f"overlap: only the last bucket exposed ({exposed:.3f})")

# The link fit: bench rows made by the ring formula (alpha 100 us, 118 MB/s at 2 ranks, sizes 4 KiB
# to 16 MiB), one large size 5% slow, sizes under the 256 KB token bucket 10x faster than the formula:
# alpha and B come back (a least-squares line gave a latency of milliseconds from such noise).
rows = []
for k, size in enumerate(4096 * 2 ** i for i in range(13)):
    t = costmodel.ring_time(size, 2, 100e-6, 118e6)
    t = 2 * 100e-6 + (t - 2 * 100e-6) / 10 if size < 256 * 1024 else t * (1.05 if k == 11 else 1.0)
    rows.append(dict(ranks="2", size_bytes=str(size), time_us=str(t * 1e6)))
alpha, bw = costmodel.fit_link(rows, 2)
check(abs(alpha - 100e-6) < 5e-6 and abs(bw / 118e6 - 1) < 0.02,
      f"link fit: alpha {alpha * 1e6:.1f} us (100), B {bw / 1e6:.1f} MB/s (118)")
# GPT-2: the marking order's parameter table holds every gradient (gpt2_config_n_params' count with
# the token embedding padded to 50304 rows), the first bucket is ln_f's, the tied token embedding
# is ready only at the end; a bucket ready at 100% of backward is all exposed even with overlap.
L, C, T = 2, 64, 32
marks = costmodel.gpt2_marks(L, C, T)
want = 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
check(sum(n for _, n, _ in marks) == want, f"gpt2: {sum(n for _, n, _ in marks)} gradients ({want})")
check(marks[0][0] == "ln_f.bias" and marks[-1][0] == "wte.weight" and marks[-1][2] == 1.0 and
      all(a[2] <= b[2] for a, b in zip(marks, marks[1:])), "gpt2: ln_f first, wte last, ready times rise")
sizes, ready = costmodel.group_buckets(marks, 25 * costmodel.MIB, costmodel.MIB)
check(sum(sizes) == 4 * want and sizes[-1] == 4 * 50304 * C and ready[-1] == 1.0,
      f"gpt2 buckets {sizes}: every byte once, wte alone and last")
comm = lambda s: (1.0, 0.0)
step, exposed, _, _, _ = costmodel.step_time(1.0, 2.0, [8, 8], comm, overlap=True, ready_at=[0.5, 1.0])
check(math.isclose(exposed, 1.0) and math.isclose(step, 4.0), "ready_at: the first bucket hidden, the last exposed")
sys.exit(1 if failures else 0)
