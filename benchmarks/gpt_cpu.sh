#!/usr/bin/env bash
# gpt_cpu.sh - GPT-2 training on the CPU, ddp against PyTorch, back to back in one run: ddp-train
# --model gpt2 and benchmarks/gpt_torch.py (the same model in PyTorch, DistributedDataParallel over
# gloo, AdamW with clipping) at 2 ranks x 1 thread on the Jane Austen shards, for two
# configurations: a small one (4 layers x 256 channels x 128 tokens) and GPT-2 124M (d12) at a short
# sequence. Each row: tokens/s over all ranks, the model FLOPs per second per rank (6N + 12LTC per
# token, N without wte's padding rows, as nanoGPT counts) and that as a fraction of this
# CPU's single-core fp32 GEMM peak (ddp-gemm-peak: OpenBLAS, one thread, best shape). ddp-train's
# figure is over all its training steps (the first, which builds oneDNN's primitives and the
# buckets, included); PyTorch's over the steps after 3 warm-up steps. The rounds alternate the two
# (ddp, torch, ddp, torch, ...) and the medians are kept: a shared 2-core machine drifts.
#
# Usage: benchmarks/gpt_cpu.sh [BUILD_DIR (build-release)] [ROUNDS (3)] [DATA ('data/text/austen_train_*.bin')]
# Needs a release build (meson setup build-release --buildtype=release) and the shards
# (scripts/fetch-text.sh data/text). GPT_CONFIGS="small d12" picks configurations; PRECISIONS
# ("fp32", plus "bf16" on a CPU with AVX512_BF16) the precisions.
set -euo pipefail

build="${1:-build-release}"
rounds="${2:-3}"
data="${3:-data/text/austen_train_*.bin}"
train="$build/train/ddp-train"
peak_bin="$build/benchmarks/ddp-gemm-peak"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=benchmarks/cpu_report.sh
source "$here/cpu_report.sh"

export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

[[ -x "$train" && -x "$peak_bin" ]] ||
    { echo "gpt_cpu: $train or $peak_bin not found; build first (meson compile -C $build)" >&2; exit 1; }
compgen -G "$data" >/dev/null || { echo "gpt_cpu: no shard matches $data; run scripts/fetch-text.sh data/text" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
    { echo "gpt_cpu: Debian's PyTorch is missing: scripts/install-deps.sh test" >&2; exit 1; }

if [[ -z "${PRECISIONS:-}" ]]; then
    PRECISIONS=fp32
    grep -qw avx512_bf16 /proc/cpuinfo && PRECISIONS="fp32 bf16"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Layers, heads, channels, sequence, batch (sequences per rank) and steps of a configuration.
config_of() {
    case $1 in
        small) echo "4 4 256 128 4 20" ;;
        d12) echo "12 12 768 64 4 8" ;;
        *) echo "gpt_cpu: unknown configuration $1 (small, d12)" >&2; exit 1 ;;
    esac
}

# "tokens/s GFLOP/s-per-rank" of ddp-train: configuration $1, precision $2.
ddp_run() {
    local l h c t b s metrics="$tmp/ddp.jsonl"
    read -r l h c t b s <<<"$(config_of "$1")"
    mpirun --oversubscribe --bind-to none -np 2 "$train" --model gpt2 --layers "$l" --heads "$h" \
        --channels "$c" --seq "$t" --batch "$b" --max-steps "$s" --precision "$2" --device cpu \
        --threads 1 --data "$data" --val-max-batches 1 --log-every 100000 --metrics "$metrics" \
        >"$tmp/ddp.log" 2>&1 || { cat "$tmp/ddp.log" >&2; return 1; }
    grep '^cpu: \|^compute: ' "$tmp/ddp.log" | head -n 2 >"$tmp/cpu.txt" || true
    tail -n 1 "$metrics" | /usr/bin/python3 -c \
        'import json,sys; s=json.load(sys.stdin); print(s["tokens_per_s"], s["model_gflops_per_rank"])'
}

# The same for PyTorch.
torch_run() {
    local l h c t b s
    read -r l h c t b s <<<"$(config_of "$1")"
    /usr/bin/python3 "$here/gpt_torch.py" --ranks 2 --layers "$l" --heads "$h" --channels "$c" \
        --seq "$t" --batch "$b" --steps "$s" --warmup 3 --precision "$2" --data "$data" \
        >"$tmp/torch.log" 2>&1 || { cat "$tmp/torch.log" >&2; return 1; }
    grep '^{' "$tmp/torch.log" | tail -n 1 | /usr/bin/python3 -c \
        'import json,sys; s=json.load(sys.stdin); print(s["tokens_per_s"], s["model_gflops_per_rank"])'
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

cpu_report_machine
peak=$("$peak_bin" 5 | awk '/^peak/ {print $2}')
echo "single-core fp32 GEMM peak: $peak GFLOP/s (ddp-gemm-peak: OpenBLAS, one thread, best shape)"
echo
printf '| configuration | precision | ddp tokens/s | PyTorch tokens/s | ddp / PyTorch | ddp GFLOP/s per rank | of GEMM peak | PyTorch GFLOP/s per rank |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for cfg in ${GPT_CONFIGS:-small d12}; do
    for prec in $PRECISIONS; do
        : >"$tmp/ddp.txt"
        : >"$tmp/torch.txt"
        for ((r = 0; r < rounds; r++)); do
            ddp_run "$cfg" "$prec" >>"$tmp/ddp.txt"
            torch_run "$cfg" "$prec" >>"$tmp/torch.txt"
        done
        d_tps=$(cut -d' ' -f1 "$tmp/ddp.txt" | median)
        d_gf=$(cut -d' ' -f2 "$tmp/ddp.txt" | median)
        t_tps=$(cut -d' ' -f1 "$tmp/torch.txt" | median)
        t_gf=$(cut -d' ' -f2 "$tmp/torch.txt" | median)
        awk -v c="$cfg" -v p="$prec" -v dt="$d_tps" -v tt="$t_tps" -v dg="$d_gf" -v tg="$t_gf" -v pk="$peak" \
            'BEGIN {printf "| %s | %s | %.0f | %.0f | %.2fx | %.1f | %.0f%% | %.1f |\n", c, p, dt, tt, dt / tt, dg, 100 * dg / pk, tg}'
        echo "  rounds: ddp [$(cut -d' ' -f1 "$tmp/ddp.txt" | tr '\n' ' ')] torch [$(cut -d' ' -f1 "$tmp/torch.txt" | tr '\n' ' ')] tokens/s" >&2
    done
done
echo
cpu_report_ddp "$tmp/cpu.txt"
echo "torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__, "threads", torch.get_num_threads())')"
