#!/usr/bin/env bash
# ab_builds.sh - the same training runs on two builds of ddp-train, interleaved in one run: the
# throughput ratio B / A per configuration (before and after a change, on the same machine, so the
# drift of a 2-core machine falls on both alike).
#
# Usage: benchmarks/ab_builds.sh BUILD_A BUILD_B [OUT_DIR (runs/ab)]
#   ROUNDS (3): each round runs every configuration on A then on B; the table gives the median
#   rate of each and the median of the rounds' B / A ratios.
#   MNIST (data/mnist), TEXT ('data/text/austen_train_*.bin'): the data. NAMES: the configurations
#   to run (default all, below).
# Configurations, 2 ranks under mpirun, --device cpu: the MLP in fp32 and bf16 (300 steps of 64),
# the CNN in fp32 (100 steps), a small GPT (4 layers x 256 channels x 128 tokens, batch 4, 12
# steps) in fp32 and bf16 at --zero 0 and 1. Rates are the --metrics summary's (samples/s or
# tokens/s over the time in training steps). Use release builds.
set -euo pipefail
set -f # the shard pattern goes to ddp-train as it is

a="${1:?usage: ab_builds.sh BUILD_A BUILD_B [OUT_DIR]}"
b="${2:?usage: ab_builds.sh BUILD_A BUILD_B [OUT_DIR]}"
out="${3:-runs/ab}"
rounds="${ROUNDS:-3}"
mnist="${MNIST:-data/mnist}"
text="${TEXT:-data/text/austen_train_*.bin}"
export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for build in "$a" "$b"; do
    [[ -x "$build/train/ddp-train" ]] || { echo "ab_builds: $build/train/ddp-train not found" >&2; exit 1; }
done
mkdir -p "$out"

gpt="--model gpt2 --data $text --layers 4 --heads 4 --channels 256 --seq 128 --batch 4 --max-steps 12 --val-max-batches 1"
declare -A cfg=(
    [mlp-fp32]="--model mlp --data $mnist --max-steps 300 --batch 64 --epochs 5"
    [mlp-bf16]="--model mlp --data $mnist --max-steps 300 --batch 64 --epochs 5 --precision bf16"
    [cnn-fp32]="--model cnn --data $mnist --max-steps 100 --batch 64 --epochs 5"
    [gpt-fp32-z0]="$gpt"
    [gpt-bf16-z0]="$gpt --precision bf16"
    [gpt-fp32-z1]="$gpt --zero 1"
    [gpt-bf16-z1]="$gpt --precision bf16 --zero 1"
)
read -ra names <<<"${NAMES:-mlp-fp32 mlp-bf16 cnn-fp32 gpt-fp32-z0 gpt-bf16-z0 gpt-fp32-z1 gpt-bf16-z1}"

# rate BUILD LABEL NAME ROUND: one run; prints its samples/s or tokens/s
rate() {
    local m="$out/$3-$2-$4.jsonl"
    # shellcheck disable=SC2086
    mpirun --oversubscribe --bind-to none -np 2 "$1/train/ddp-train" ${cfg[$3]} --device cpu \
        --threads 1 --log-every 1000 --metrics "$m" >"${m%.jsonl}.log" 2>&1 ||
        { echo "ab_builds: $3 on $1 failed (${m%.jsonl}.log)" >&2; return 1; }
    /usr/bin/python3 -c 'import json,sys
s = [json.loads(x) for x in open(sys.argv[1]) if "summary" in x][-1]
print(s.get("tokens_per_s") or s.get("samples_per_s"))' "$m"
}

echo "ab_builds: $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), A $a, B $b"
declare -A got
for ((r = 0; r < rounds; r++)); do
    for n in "${names[@]}"; do
        got[$n,a,$r]=$(rate "$a" a "$n" "$r")
        got[$n,b,$r]=$(rate "$b" b "$n" "$r")
    done
done
{
    echo "| run (2 ranks) | A (median) | B (median) | B / A (median of $rounds rounds) |"
    echo "| --- | ---: | ---: | ---: |"
    for n in "${names[@]}"; do
        ra="" rb=""
        for ((r = 0; r < rounds; r++)); do ra+="${got[$n,a,$r]} "; rb+="${got[$n,b,$r]} "; done
        /usr/bin/python3 -c 'import statistics as st, sys
a = [float(x) for x in sys.argv[2].split()]; b = [float(x) for x in sys.argv[3].split()]
print(f"| {sys.argv[1]} | {st.median(a):.1f} | {st.median(b):.1f} | "
      f"{st.median([y / x for x, y in zip(a, b)]):.3f} |")' "$n" "$ra" "$rb"
    done
} | tee "$out/table.md"
