#!/usr/bin/env bash
# trace_overhead.sh - what ddp-train --trace costs: the same training run with and without the
# timeline, interleaved (off, on, off, on, ...), the median samples/s of each and their ratio; and
# the cost of one record call (ddp-trace-cost: tracing off = one predictable branch).
# Usage: benchmarks/trace_overhead.sh BUILD_DIR [REPS] [STEPS]     (default 7 reps of 300 steps)
# 2 ranks under mpirun on the CPU, MLP 784-512-256-10, batch 64: a small step (a few ms) with
# about 40 trace events, the worst case for the relative cost.
set -euo pipefail

BUILD=$(cd "${1:?usage: trace_overhead.sh BUILD_DIR [REPS] [STEPS]}" && pwd)
REPS=${2:-7}
STEPS=${3:-300}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/ddp-trace-overhead.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=1

# run_one on|off REP: prints samples/s of one run.
run_one() {
    local extra=()
    [[ $1 == off ]] || extra=(--trace "$WORK/t$2.json")
    mpirun --oversubscribe --bind-to none -np 2 "$BUILD/train/ddp-train" --device cpu --epochs 1000 \
        --max-steps "$STEPS" --data "$SRC/data/mnist" --log-every 100000 --metrics "$WORK/m.jsonl" \
        "${extra[@]}" >"$WORK/log" 2>&1 || { tail "$WORK/log" >&2; exit 1; }
    tail -n 1 "$WORK/m.jsonl" | sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p'
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

off=() on=()
for ((r = 1; r <= REPS; r++)); do
    off+=("$(run_one off "$r")")
    on+=("$(run_one on "$r")")
done
m_off=$(median "${off[@]}")
m_on=$(median "${on[@]}")
echo "samples/s without trace: ${off[*]} (median $m_off)"
echo "samples/s with --trace:  ${on[*]} (median $m_on)"
awk -v a="$m_off" -v b="$m_on" 'BEGIN { printf "traced / untraced = %.3f (cost %.1f%%)\n", b / a, 100 * (1 - b / a) }'
# The same cost from its parts, immune to the machine's other load: record calls per step (the
# last traced run's file) x CPU time per call / the median traced step time.
cost=$("$BUILD/benchmarks/ddp-trace-cost" 1000000)
echo "$cost"
ns=$(sed -n 's/.* on \([0-9.]*\) ns.*/\1/p' <<<"$cost")
python3 - "$WORK/t$REPS.json" "$ns" "$m_on" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
steps = sum(1 for e in ev if e["pid"] == 0 and e["name"] == "step" and e["ph"] == "B")
rec = sum(1 for e in ev if e["pid"] == 0 and e["ph"] in "BEi")
per_step = rec / steps
step_s = 64 * 2 / float(sys.argv[3])
frac = per_step * float(sys.argv[2]) * 1e-9 / step_s
print(f"rank 0 records {per_step:.1f} events per step (evaluation included); x {float(sys.argv[2]):.0f} ns "
      f"= {per_step * float(sys.argv[2]) / 1e3:.1f} us of a {1e3 * step_s:.2f} ms step: {100 * frac:.2f}%")
PY
echo "($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
