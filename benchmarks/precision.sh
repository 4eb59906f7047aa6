#!/usr/bin/env bash
# precision.sh - 16-bit training against fp32 and against PyTorch, back to back in one run:
# ddp-train fp32 / bf16 / fp16 (and bf16 with --grad-dtype bf16 where this ddp-train has it), the
# CNN also with the im2col + OpenBLAS convolutions it had before oneDNN (DDP_CPU_CONV=im2col), and
# the same training in PyTorch (benchmarks/torch_mnist.py: DDP over gloo, torch.autocast bf16 for
# the bf16 row). MLP and CNN, 2 ranks x 1 thread, batch 64 per rank, lr 0.05 momentum 0.9 cosine,
# CNN_EPOCHS epochs of MNIST for the CNN and 4x as many for the MLP (whose steps are short: fewer
# would leave well under a second of training to time); samples/s over the training steps and test
# accuracy after the last epoch. The MLP's ddp rows run MLP_REPS rounds (default 5), each round
# fp32, bf16, bf16 --grad-dtype bf16 and fp16 back to back: samples/s is the median of the rounds
# and an MLP ratio the median of the rounds' ratios (on a shared 2-core VM the MLP's memory-bound
# steps swing by 1.5x from one minute to the next; a round's runs see about the same machine).
#
# Usage: benchmarks/precision.sh [BUILD_DIR (build)] [CNN_EPOCHS (2)] [DATA_DIR (data/mnist)]
# Use a release build and a quiet machine for numbers worth quoting; the load is printed.
# DDP_CPU_ISA=avx2 (or baseline, avx512) caps ddp and, through torch_mnist.py, PyTorch alike (oneDNN,
# ATen and OpenBLAS kernels): the AVX2 class measured on an AVX-512 machine. The table ends with the
# machine, the ISA in use, OpenBLAS's core and the oneDNN implementations of both (cpu_report.sh).
set -euo pipefail

build="${1:-build}"
epochs="${2:-2}"
data="${3:-data/mnist}"
train="$build/train/ddp-train"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=benchmarks/cpu_report.sh
source "$here/cpu_report.sh"

export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# Waiting MPI ranks yield their core instead of spinning (gloo waits in the kernel too). On a busy
# machine a spinning rank loses its core to other work: measured 2-rank MLP 2,400 samples/s
# spinning against 11,700 yielding, at a load of 15 on 2 cores. Set it to 0 to measure spinning.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"

[[ -x "$train" ]] || { echo "precision: $train not found; build first (meson compile -C $build)" >&2; exit 1; }
[[ -d "$data" ]] || { echo "precision: $data: no such folder; run scripts/fetch-mnist.sh $data" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
    { echo "precision: Debian's PyTorch is missing: scripts/install-deps.sh test" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

epochs_of() { [[ $1 == mlp ]] && echo $((4 * epochs)) || echo "$epochs"; }

# "samples/s accuracy" of a ddp-train run: model $1, precision $2, then extra flags.
ddp_run() {
    local model=$1 prec=$2 metrics="$tmp/run.jsonl"
    shift 2
    mpirun --oversubscribe --bind-to none -np 2 "$train" --model "$model" --data "$data" --batch 64 \
        --threads 1 --device cpu --epochs "$(epochs_of "$model")" --lr 0.05 --momentum 0.9 --lr-schedule cosine \
        --precision "$prec" --log-every 100000 --metrics "$metrics" "$@" >"$tmp/run.log" 2>&1 ||
        { cat "$tmp/run.log" >&2; return 1; }
    grep '^cpu: \|^compute: \|^oneDNN (' "$tmp/run.log" >>"$tmp/cpu.txt" || true
    tail -n 1 "$metrics" | /usr/bin/python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["samples_per_s"], s["test_accuracy"])'
}

# The convolutions ddp-train had before oneDNN (im2col + OpenBLAS per image).
ddp_run_im2col() { DDP_CPU_CONV=im2col ddp_run "$@"; }

torch_run() {
    /usr/bin/python3 "$here/torch_mnist.py" --data "$data" --model "$1" --precision "$2" --ranks 2 \
        --epochs "$(epochs_of "$1")" | /usr/bin/python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["samples_per_s"], s["test_accuracy"])'
}

declare -A sps acc rounds
row() { # name, then the command printing "samples/s accuracy"
    local name=$1 result
    shift
    result="$("$@")"
    sps[$name]=${result% *}
    acc[$name]=${result#* }
    printf "%-28s %12.0f %9.2f%%\n" "$name" "${sps[$name]}" "$(awk -v a="${acc[$name]}" 'BEGIN{print 100*a}')"
}
median() { tr ' ' '\n' | sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# ratio A B: sps[A] / sps[B], or the median of the per-round ratios where both ran in rounds.
ratio() {
    if [[ -n ${rounds[$1]:-} && -n ${rounds[$2]:-} ]]; then
        paste -d' ' <(tr ' ' '\n' <<<"${rounds[$1]}") <(tr ' ' '\n' <<<"${rounds[$2]}") |
            awk '{printf "%s ", $1 / $2}' | median | awk '{printf "%.2fx", $1}'
    else
        awk -v a="${sps[$1]}" -v b="${sps[$2]}" 'BEGIN { printf "%.2fx", a / b }'
    fi
}
# mlp_rounds NAME:PRECISION:FLAGS...: MLP_REPS rounds of these ddp MLP runs, then a row each
# (median samples/s; accuracy of the last round: the runs are deterministic).
mlp_rounds() {
    local spec name result
    for _ in $(seq "${MLP_REPS:-5}"); do
        for spec in "$@"; do
            IFS=: read -r name prec flags <<<"$spec"
            # shellcheck disable=SC2086
            result="$(ddp_run mlp "$prec" $flags)"
            rounds[$name]+="${rounds[$name]:+ }${result% *}"
            acc[$name]=${result#* }
        done
    done
    for spec in "$@"; do
        name=${spec%%:*}
        sps[$name]=$(median <<<"${rounds[$name]}")
        printf "%-28s %12.0f %9.2f%%  (median of %s: %s)\n" "$name" "${sps[$name]}" \
            "$(awk -v a="${acc[$name]}" 'BEGIN{print 100*a}')" "${MLP_REPS:-5}" "${rounds[$name]}"
    done
}

cpu_report_machine
grad16=()
"$train" --help | grep -q -- '--grad-dtype' && grad16=(--grad-dtype bf16)
printf "%-28s %12s %10s\n" run samples/s accuracy
mlp_rounds "ddp mlp fp32:fp32" "ddp mlp bf16:bf16" ${grad16:+"ddp mlp bf16 grad-bf16:bf16:${grad16[*]}"} \
    "ddp mlp fp16 (emulated):fp16"
row "pytorch mlp fp32" torch_run mlp fp32
row "pytorch mlp bf16 autocast" torch_run mlp bf16
row "ddp cnn fp32" ddp_run cnn fp32
row "ddp cnn fp32 im2col" ddp_run_im2col cnn fp32
row "ddp cnn bf16" ddp_run cnn bf16
[[ ${#grad16[@]} -gt 0 ]] && row "ddp cnn bf16 grad-bf16" ddp_run cnn bf16 "${grad16[@]}"
row "ddp cnn fp16 (emulated)" ddp_run cnn fp16
row "pytorch cnn fp32" torch_run cnn fp32
row "pytorch cnn bf16 autocast" torch_run cnn bf16
echo
echo "ratios (targets of issues 7 and 14 in brackets):"
echo "  MLP fp32 / PyTorch fp32:           $(ratio 'ddp mlp fp32' 'pytorch mlp fp32') [>= 2.5x on AVX2]"
echo "  MLP bf16 / ddp fp32:               $(ratio 'ddp mlp bf16' 'ddp mlp fp32')$([[ ${#grad16[@]} -gt 0 ]] && echo ", with --grad-dtype bf16 $(ratio 'ddp mlp bf16 grad-bf16' 'ddp mlp fp32')") [>= 1.4x]"
echo "  CNN bf16 / PyTorch bf16:           $(ratio 'ddp cnn bf16' 'pytorch cnn bf16 autocast') [>= 2x]"
echo "  CNN fp32 oneDNN / im2col (before): $(ratio 'ddp cnn fp32' 'ddp cnn fp32 im2col') [>= 1.5x]"
echo "  CNN bf16 / ddp fp32:               $(ratio 'ddp cnn bf16' 'ddp cnn fp32')"
echo "  CNN fp32 / PyTorch fp32:           $(ratio 'ddp cnn fp32' 'pytorch cnn fp32') [>= 1.5x on AVX2]"
echo "  accuracy bf16 - fp32:              MLP $(awk -v a="${acc[ddp mlp bf16]}" -v b="${acc[ddp mlp fp32]}" 'BEGIN{printf "%+.2f", 100*(a-b)}'), CNN $(awk -v a="${acc[ddp cnn bf16]}" -v b="${acc[ddp cnn fp32]}" 'BEGIN{printf "%+.2f", 100*(a-b)}') point [within 0.5]"
cpu_report_ddp "$tmp/cpu.txt"
for prec in fp32 bf16; do cpu_report_torch cnn "$prec"; done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); $epochs CNN epochs, $((4 * epochs)) MLP epochs (${MLP_REPS:-5} rounds), 2 ranks x 1 thread, batch 64 per rank, build $build, OMPI_MCA_mpi_yield_when_idle=$OMPI_MCA_mpi_yield_when_idle"
