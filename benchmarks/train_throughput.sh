#!/usr/bin/env bash
# train_throughput.sh - training throughput (samples/s) of ddp-train for MLP and CNN at 1 and 2 ranks.
#
# Usage: benchmarks/train_throughput.sh [BUILD_DIR (build)] [STEPS (300)] [DATA_DIR (data/mnist)]
#
# Each run: mpirun -np R ddp-train --model M --batch 64 (per rank) --threads 1 --device cpu
# --max-steps STEPS; samples/s is the summary line of --metrics (all ranks' samples over the time
# spent in training steps, evaluation excluded). Scaling efficiency = samples/s(R) / (R * samples/s(1)).
# Use a release build (meson setup -Dbuildtype=release) for numbers worth quoting.
set -euo pipefail

build="${1:-build}"
steps="${2:-300}"
data="${3:-data/mnist}"
train="$build/models/ddp-train"

export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OPENBLAS_NUM_THREADS=1

[[ -x "$train" ]] || { echo "train_throughput: $train not found; build first (ninja -C $build)" >&2; exit 1; }
[[ -d "$data" ]] || { echo "train_throughput: $data: no such folder; run scripts/fetch-mnist.sh $data" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Prints samples/s of one run: model $1, ranks $2.
samples_per_s() {
    local metrics="$tmp/$1-$2.jsonl"
    mpirun --oversubscribe --bind-to none -np "$2" "$train" --model "$1" --data "$data" --batch 64 \
        --threads 1 --device cpu --epochs 1000 --max-steps "$steps" --log-every 100000 \
        --metrics "$metrics" >"$tmp/$1-$2.log" 2>&1 || { cat "$tmp/$1-$2.log" >&2; return 1; }
    tail -n 1 "$metrics" | sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p'
}

printf "%-6s %6s %12s %11s\n" model ranks samples/s efficiency
for model in mlp cnn; do
    base=""
    for ranks in 1 2; do
        sps="$(samples_per_s "$model" "$ranks")"
        [[ -n "$base" ]] || base="$sps"
        eff="$(awk -v s="$sps" -v b="$base" -v r="$ranks" 'BEGIN { printf "%.1f%%", 100 * s / (r * b) }')"
        printf "%-6s %6d %12.1f %11s\n" "$model" "$ranks" "$sps" "$eff"
    done
done
echo "($steps steps per run, batch 64 per rank, 1 thread per rank, $(nproc) cores, build $build)"
