#!/usr/bin/env bash
# gpu_precision.sh - the GPU backend's precisions back to back in one run, on one GPU: ddp-train
# --device cuda in fp32, fp32 with --tf32, bf16 and fp16 (emulated: fp32 math on half values), the
# CNN also with the im2col + cuBLAS convolutions it had before cuDNN (DDP_CUDA_CONV=im2col) and with
# cuDNN's heuristic algorithm choice instead of measurement (DDP_CUDNN_BENCHMARK=0). MLP and CNN,
# batch BATCH, lr 0.05 momentum 0.9 cosine, EPOCHS epochs of MNIST; the ratio to fp32 of the same
# model, and test accuracy after the last epoch.
#
# samples/s is the steady rate: the epochs after the first, together. The first epoch pays once for
# cuDNN's algorithm search (every algorithm of five convolution plans timed), lazy kernel loading
# and library set-up, about 0.3 s, which at 31 steps of a small data set outweighs the steps
# themselves; it is shown apart ("1st epoch"). With EPOCHS 1 the first epoch is all there is. The
# cuDNN algorithms chosen are printed below the table (ddp-train's report after its first step).
#
# Usage: benchmarks/gpu_precision.sh [BUILD_DIR (build)] [EPOCHS (6)] [DATA_DIR (data/mnist)] [BATCH (256)]
# A row whose run fails prints the reason instead, and the script then exits 1 (bf16 refused before
# compute capability 8.0 is a skip, not a failure).
set -euo pipefail

build="${1:-build}"
epochs="${2:-6}"
data="${3:-data/mnist}"
batch="${4:-256}"
train="$build/train/ddp-train"

[[ -x "$train" ]] || { echo "gpu_precision: $train not found; build first (meson compile -C $build)" >&2; exit 1; }
[[ -d "$data" ]] || { echo "gpu_precision: $data: no such folder; run scripts/fetch-mnist.sh $data" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# "samples/s first_epoch_samples/s accuracy" of one run: environment setting $1 (or ""), model $2,
# precision $3, then extra flags; "failed: reason" when the run fails.
run() {
    local setting=$1 model=$2 prec=$3 metrics="$tmp/run.jsonl"
    shift 3
    if ! env ${setting:+"$setting"} "$train" --model "$model" --data "$data" --batch "$batch" --device cuda --epochs "$epochs" \
        --lr 0.05 --momentum 0.9 --lr-schedule cosine --precision "$prec" --log-every 100000 \
        --metrics "$metrics" "$@" >"$tmp/run.log" 2>&1; then
        echo "failed: $(grep -m1 -iE 'error|refuse|cannot' "$tmp/run.log" || tail -n 1 "$tmp/run.log")"
        return 0
    fi
    local impl
    impl=$(grep -m1 '^cuDNN' "$tmp/run.log" || true)
    [[ -z $impl ]] || echo "$model $prec $setting $*: $impl" | tr -s ' ' >>"$tmp/impl.txt"
    python3 - "$metrics" "$batch" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
epochs = [l for l in lines if "epoch" in l]
steady = epochs[1:] or epochs
samples = [e["steps"] * int(sys.argv[2]) for e in steady]
seconds = sum(n / e["samples_per_s"] for n, e in zip(samples, steady))
print(sum(samples) / seconds, epochs[0]["samples_per_s"], lines[-1]["test_accuracy"])
PY
}

n_failed=0
printf '%-6s %-34s %12s %9s %10s %9s\n' model configuration samples/s vs_fp32 "1st epoch" accuracy
for model in mlp cnn; do
    configs=("fp32|" "fp32|--tf32" "bf16|" "fp16|")
    [[ $model == cnn ]] && configs+=("fp32|DDP_CUDA_CONV=im2col" "fp32|DDP_CUDNN_BENCHMARK=0" "bf16|DDP_CUDNN_BENCHMARK=0")
    base=""
    for c in "${configs[@]}"; do
        prec=${c%%|*} extra=${c#*|} setting="" flags=()
        if [[ $extra == DDP_* ]]; then setting=$extra; elif [[ -n $extra ]]; then flags=("$extra"); fi
        out=$(run "$setting" "$model" "$prec" "${flags[@]}")
        if [[ $out == failed* ]]; then
            [[ $out == *"--precision $prec on the cuda backend"* ]] && out="skipped: ${out#failed: }" || n_failed=$((n_failed + 1))
            printf '%-6s %-34s %s\n' "$model" "$prec $extra" "$out"
            continue
        fi
        read -r sps first acc <<<"$out"
        [[ $prec == fp32 && -z $extra ]] && base=$sps
        ratio=$(python3 -c "print(f'{$sps / $base:.2f}x' if '$base' else '-')")
        printf '%-6s %-34s %12.0f %9s %10.0f %8.2f%%\n' "$model" "$prec $extra" "$sps" "$ratio" "$first" \
            "$(python3 -c "print(100 * $acc)")"
    done
done
echo
[[ -f $tmp/impl.txt ]] && cat "$tmp/impl.txt"
[[ $n_failed == 0 ]] || { echo "gpu_precision: $n_failed run(s) failed" >&2; exit 1; }
