#!/usr/bin/env bash
# scaling_check.sh - test of benchmarks/scaling.sh on a local 2-node Slurm cluster (short runs):
# it must write runs.csv with one row per (mode, nodes, bucket, overlap, repetition) asked for -
# "one" bucket once, not once per overlap setting - and the gradient dtype asked for, allreduce.csv with every size for every node
# count and repetition, table.md with one row per configuration and node count, and four PNGs;
# then a tiny GPT-2 (--model gpt2): rows with the model, tokens/s and the exposed communication.
# Usage: tests/scaling/scaling_check.sh BUILD_DIR      (root; the script takes the cluster lock)
set -euo pipefail

SRC=${DDP_TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=$(realpath "${1:?usage: scaling_check.sh BUILD_DIR}")
OUT=$(mktemp -d /tmp/ddp-scaling-check.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
export DDP_SLURM_BASE=/tmp/ddp-slurm-scaling-check

fail() { echo "FAIL: $*"; exit 1; }

"$SRC/benchmarks/scaling.sh" --build "$BUILD" --local-cluster 2 --rate 1gbit --nodes 1,2 \
    --modes weak,strong --buckets 4,one --overlap on,off --reps 2 --steps 3 --batch 16 \
    --grad-dtypes bf16 --widths 784-64-10 --bench-sizes 4K:64K --out "$OUT/r" 2>&1 | tail -n 5 ||
    fail "scaling.sh failed"

python3 - "$OUT/r" <<'PY' || fail "the outputs do not match the configurations asked for"
import csv, itertools, sys
out = sys.argv[1]
runs = list(csv.DictReader(open(f"{out}/runs.csv")))
want = set()
for mode, nodes, rep in itertools.product(["weak", "strong"], ["1", "2"], ["1", "2"]):
    want |= {(mode, nodes, "4", "on", rep), (mode, nodes, "4", "off", rep), (mode, nodes, "one", "on", rep)}
got = [(r["mode"], r["nodes"], r["bucket_mb"], r["overlap"], r["rep"]) for r in runs]
ok = sorted(got) == sorted(want)
print(f"runs.csv: {len(got)} rows, want {len(want)}: {'ok' if ok else 'MISMATCH'}")
for r in runs:
    batch = int(r["batch_per_rank"]) * int(r["ranks"])
    if r["mode"] == "strong" and batch != 32 or r["mode"] == "weak" and int(r["batch_per_rank"]) != 16:
        ok = False; print("wrong batch in", r)
    if r["grad_dtype"] != "bf16":
        ok = False; print("--grad-dtypes bf16 not in", r)
    if float(r["samples_per_s"]) <= 0 or r["exposed_comm_ms"] == "":
        ok = False; print("missing figures in", r)
bench = list(csv.DictReader(open(f"{out}/allreduce.csv")))
sizes = sorted({int(b["size_bytes"]) for b in bench})
per = {(b["nodes"], b["rep"]) for b in bench}
bench_ok = sizes == [4096, 16384, 65536] and per == set(itertools.product(["1", "2"], ["1", "2"])) \
    and len(bench) == 12
print(f"allreduce.csv: sizes {sizes}, {len(bench)} rows: {'ok' if bench_ok else 'MISMATCH'}")
table = [l for l in open(f"{out}/table.md") if l.startswith("| weak") or l.startswith("| strong")]
table_ok = len(table) == 12
print(f"table.md: {len(table)} rows, want 12: {'ok' if table_ok else 'MISMATCH'}")
pngs_ok = all(open(f"{out}/{n}.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
              for n in ("throughput", "efficiency", "exposed", "busbw"))
print(f"PNGs: {'ok' if pngs_ok else 'MISSING'}")
sys.exit(0 if ok and bench_ok and table_ok and pngs_ok else 1)
PY
# The GPT (--model gpt2): a tiny one, one bucket, weak and strong: rows say the model, carry
# tokens/s and the exposed communication read from the trace; the table shows tokens/s.
"$SRC/benchmarks/scaling.sh" --build "$BUILD" --local-cluster 2 --rate 1gbit --nodes 1,2 \
    --model gpt2 --layers 1 --heads 2 --channels 64 --seq 16 --batch 2 --modes weak,strong \
    --buckets one --overlap on --reps 1 --steps 2 --grad-dtypes fp32 --bench-sizes 4K:16K \
    --out "$OUT/g" 2>&1 | tail -n 3 || fail "scaling.sh --model gpt2 failed"
python3 - "$OUT/g" <<'PY' || fail "the GPT's outputs are wrong"
import csv, sys
runs = list(csv.DictReader(open(f"{sys.argv[1]}/runs.csv")))
ok = len(runs) == 4
for r in runs:
    global_seqs = {"weak": 2 * int(r["ranks"]), "strong": 4}[r["mode"]]
    if r["model"] != "gpt2" or int(r["global_batch"]) != global_seqs or float(r["tokens_per_s"]) <= 0 \
            or abs(float(r["tokens_per_s"]) / float(r["samples_per_s"]) - 16) > 0.1 \
            or r["exposed_comm_ms"] == "" or (r["ranks"] == "2" and float(r["comm_ms"]) <= 0):
        ok = False; print("wrong GPT row", r)
table = [l for l in open(f"{sys.argv[1]}/table.md") if "| gpt2 |" in l and "tokens/s" in l]
ok = ok and len(table) == 4
print(f"GPT: {len(runs)} rows, {len(table)} table rows with tokens/s: {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
PY
echo PASS
