#!/usr/bin/env bash
# watchdog_cost.sh - what the watchdog (runtime/watchdog.c: deadlines on collectives, the TCP ring)
# costs in training throughput: ddp-train with DDP_WATCHDOG=1 and DDP_WATCHDOG=0, interleaved in one
# run, REPS pairs; prints the median samples/s of each, their ratio, and the median of the pairs'
# ratios (each pair runs back to back, so it is the figure least moved by other load on the machine),
# and the CPU time of the watchdog's own threads as a share of the ranks' (load-insensitive).
#
# Usage: benchmarks/watchdog_cost.sh [BUILD_DIR (build)] [REPS (5)] [STEPS (300)] [DATA_DIR (data/mnist)]
# Each run: mpirun -np 2 ddp-train --model MODEL (mlp, or $DDP_BENCH_MODEL) --batch 64 --threads 1
# --device cpu --max-steps STEPS. The MLP's step is short (a few ms), so a per-collective cost would
# show there first. Use a release build (meson setup -Dbuildtype=release) for numbers worth quoting.
set -euo pipefail

build="${1:-build}"
reps="${2:-5}"
steps="${3:-300}"
data="${4:-data/mnist}"
model="${DDP_BENCH_MODEL:-mlp}"
train="$build/train/ddp-train"

export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OPENBLAS_NUM_THREADS=1

[[ -x "$train" ]] || { echo "watchdog_cost: $train not found; build first (ninja -C $build)" >&2; exit 1; }
[[ -d "$data" ]] || { echo "watchdog_cost: $data: no such folder; run scripts/fetch-mnist.sh $data" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Samples the CPU time (clock ticks) of the ranks' threads until they end: one line "watchdog total"
# with the last values seen of the watchdog's two threads and of the whole processes.
thread_cpu() {
    python3 - "$1" <<'PY'
import os, sys, time
parent, last = sys.argv[1], {}
def ticks(path):
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime
pids = []
while os.path.exists(f"/proc/{parent}"):  # cheap: /proc is scanned only until both ranks are found
    if len(pids) < 2:
        pids = [p for p in filter(str.isdigit, os.listdir("/proc")) if os.path.exists(f"/proc/{p}/comm")
                and open(f"/proc/{p}/comm").read().strip() == "ddp-train"]
    for pid in pids:
        try:
            wd = sum(ticks(f"/proc/{pid}/task/{t}/stat") for t in os.listdir(f"/proc/{pid}/task")
                     if open(f"/proc/{pid}/task/{t}/comm").read().strip() in ("ddp-watchdog", "ddp-wd-answer"))
            last[pid] = (wd, ticks(f"/proc/{pid}/stat"))
        except (OSError, ValueError, IndexError):
            pass
    time.sleep(1.0)
print(sum(v[0] for v in last.values()), sum(v[1] for v in last.values()))
PY
}

# Prints samples/s of one run with DDP_WATCHDOG=$1 (with 1, the threads' CPU goes to $tmp/cpu).
samples_per_s() {
    local metrics="$tmp/m-$1.jsonl" pid
    DDP_WATCHDOG="$1" mpirun --oversubscribe --bind-to none -np 2 -x DDP_WATCHDOG "$train" --model "$model" \
        --data "$data" --batch 64 --threads 1 --device cpu --epochs 1000 --max-steps "$steps" \
        --log-every 100000 --metrics "$metrics" >"$tmp/log-$1" 2>&1 &
    pid=$!
    [[ $1 == 0 ]] || thread_cpu "$pid" >>"$tmp/cpu"
    wait "$pid" || { cat "$tmp/log-$1" >&2; return 1; }
    tail -n 1 "$metrics" | sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

on=() off=() ratios=()
for ((i = 1; i <= reps; i++)); do
    on+=("$(samples_per_s 1)")
    off+=("$(samples_per_s 0)")
    ratios+=("$(awk -v a="${on[-1]}" -v b="${off[-1]}" 'BEGIN { printf "%.4f", a / b }')")
    echo "pair $i: watchdog on ${on[-1]} samples/s, off ${off[-1]} samples/s, ratio ${ratios[-1]}"
done
m_on=$(printf '%s\n' "${on[@]}" | median)
m_off=$(printf '%s\n' "${off[@]}" | median)
printf "%-13s %12s\n" watchdog "samples/s"
printf "%-13s %12.1f\n" on "$m_on" off "$m_off"
awk -v a="$m_on" -v b="$m_off" 'BEGIN { printf "ratio of medians on/off: %.3f\n", a / b }'
echo "median of the pairs' ratios on/off: $(printf '%s\n' "${ratios[@]}" | median)"
awk '{ w += $1; t += $2 } END { printf "watchdog threads: %d of %d clock ticks of the ranks (%.3f%%)\n", w, t, t ? 100 * w / t : 0 }' "$tmp/cpu"
echo "load average before the last pair: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(model $model, 2 ranks, $steps steps per run, batch 64 per rank, median of $reps interleaved runs, $(nproc) cores, build $build)"
