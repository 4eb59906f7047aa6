#!/usr/bin/env bash
# train_throughput.sh - training throughput (samples/s) of ddp-train for MLP and CNN at 1 and 2 ranks,
# and of PyTorch DDP at 2 ranks (benchmarks/torch_mnist.py), fp32, side by side.
#
# Usage: benchmarks/train_throughput.sh [BUILD_DIR (build)] [STEPS (300)] [DATA_DIR (data/mnist)]
#   REPS=N (3): rounds; each round runs, per model, ddp 1 rank, ddp 2 ranks and PyTorch 2 ranks back
#   to back (interleaved), so a pair sees about the same machine. samples/s is the median of the
#   rounds, ddp/pytorch the median of the rounds' ratios. TORCH=0 leaves PyTorch out.
#   DDP_CPU_ISA=avx2 (or baseline, avx512) caps ddp and, through torch_mnist.py, PyTorch alike
#   (oneDNN, ATen and OpenBLAS kernels), e.g. to measure the AVX2 class on an AVX-512 machine.
#
# Each run: mpirun -np R ddp-train --model M --batch 64 (per rank) --threads 1 --device cpu
# --max-steps STEPS; samples/s is the summary line of --metrics (all ranks' samples over the time
# spent in training steps, evaluation excluded; torch_mnist.py measures alike). Scaling efficiency =
# samples/s(2) / (2 * samples/s(1)). The table starts with the machine, the ISA in use, OpenBLAS's
# core and oneDNN's implementations (ddp-train's start-up report; PyTorch's from torch_mnist.py).
# Use a release build (meson setup -Dbuildtype=release) and a quiet machine for numbers worth quoting.
set -euo pipefail

build="${1:-build}"
steps="${2:-300}"
data="${3:-data/mnist}"
reps="${REPS:-3}"
train="$build/train/ddp-train"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=benchmarks/cpu_report.sh
source "$here/cpu_report.sh"

export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# Waiting ranks yield their core, as gloo's do (see precision.sh); 0 measures spinning.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"

[[ -x "$train" ]] || { echo "train_throughput: $train not found; build first (ninja -C $build)" >&2; exit 1; }
[[ -d "$data" ]] || { echo "train_throughput: $data: no such folder; run scripts/fetch-mnist.sh $data" >&2; exit 1; }
torch="${TORCH:-1}"
if [[ $torch != 0 ]] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "train_throughput: no PyTorch (scripts/install-deps.sh test): ddp only" >&2
    torch=0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Prints samples/s of one ddp-train run: model $1, ranks $2.
ddp_sps() {
    local metrics="$tmp/$1-$2.jsonl"
    mpirun --oversubscribe --bind-to none -np "$2" "$train" --model "$1" --data "$data" --batch 64 \
        --threads 1 --device cpu --epochs 1000 --max-steps "$steps" --log-every 100000 \
        --metrics "$metrics" >"$tmp/$1-$2.log" 2>&1 || { cat "$tmp/$1-$2.log" >&2; return 1; }
    tail -n 1 "$metrics" | sed -n 's/.*"samples_per_s":\([0-9]*\).*/\1/p'
}

# Prints samples/s of one PyTorch run, 2 ranks: model $1.
torch_sps() {
    /usr/bin/python3 "$here/torch_mnist.py" --data "$data" --model "$1" --precision fp32 --ranks 2 \
        --epochs 1000 --max-steps "$steps" | sed -n 's/.*"samples_per_s": \([0-9]*\).*/\1/p'
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

declare -A runs # "model ranks" or "model torch" -> samples/s of each round, space-separated
ratios=()
for _ in $(seq "$reps"); do
    for model in mlp cnn; do
        runs[$model 1]+=" $(ddp_sps "$model" 1)"
        ddp2="$(ddp_sps "$model" 2)"
        runs[$model 2]+=" $ddp2"
        if [[ $torch != 0 ]]; then
            pt="$(torch_sps "$model")"
            runs[$model torch]+=" $pt"
            ratios+=("$model $(awk -v a="$ddp2" -v b="$pt" 'BEGIN { print a / b }')")
        fi
    done
done

cpu_report_machine
cpu_report_ddp "$tmp"/*.log
if [[ $torch != 0 ]]; then
    for model in mlp cnn; do cpu_report_torch "$model" fp32; done
fi
echo
printf "%-6s %6s %14s %11s %18s %12s\n" model ranks "ddp samples/s" efficiency "pytorch samples/s" ddp/pytorch
for model in mlp cnn; do
    one="$(median <<<"${runs[$model 1]}")"
    two="$(median <<<"${runs[$model 2]}")"
    printf "%-6s %6d %14.0f %11s %18s %12s\n" "$model" 1 "$one" "" "" ""
    eff="$(awk -v s="$two" -v b="$one" 'BEGIN { printf "%.1f%%", 100 * s / (2 * b) }')"
    pt="" ratio=""
    if [[ $torch != 0 ]]; then
        pt="$(median <<<"${runs[$model torch]}" | awk '{ printf "%.0f", $1 }')"
        ratio="$(printf '%s\n' "${ratios[@]}" | awk -v m="$model" '$1 == m { print $2 }' | median |
            awk '{ printf "%.2fx", $1 }')"
    fi
    printf "%-6s %6d %14.0f %11s %18s %12s\n" "$model" 2 "$two" "$eff" "$pt" "$ratio"
done
echo
for key in "mlp 1" "mlp 2" "mlp torch" "cnn 1" "cnn 2" "cnn torch"; do
    [[ -n ${runs[$key]:-} ]] && echo "  rounds $key:${runs[$key]}"
done
echo "($steps steps per run, $reps rounds interleaved (ddp 1 rank, ddp 2 ranks, PyTorch 2 ranks), batch 64" \
    "per rank, 1 thread per rank, fp32, build $build; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
