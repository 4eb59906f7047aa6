#!/usr/bin/env bash
# zero_overlap.sh - two ZeRO costs on GPT-2 124M (d12) at 2 ranks (mpirun on this machine):
#
# Part 1, the parameters' all-gather after each optimizer step: how much of it the next forward
# pass hides (gather_overlap.py on a --trace of each run: forward.layer compute inside the gather
# over the gather's duration). --zero 2's buckets follow the backward pass's order, so gathered
# last bucket first they bring the embeddings and layer 0 first and the forward starts at once;
# --zero 1 keeps parameter-order buckets (tensor-major: layer 0's mlp.c_proj slice is among the
# last gathered), so its layer 0 waits for nearly everything.
# Part 2, --zero 2 with --accum 2: the largest peak RSS (VmHWM) over the ranks and tokens/s with
# --zero-accum local (the bucket buffers hold the full gradients while accumulating; stage 0's
# sums) and reduce (one reduce-scatter per micro-step; only a few buffers alive), beside --zero 1.
#
# Usage: benchmarks/zero_overlap.sh [BUILD_DIR (build-release)] [OUT_DIR (runs/zero-overlap)]
#   STEPS (8), DATA ('data/text/austen_train_*.bin'). Writes OUT_DIR/overlap.md, OUT_DIR/accum.md.
set -euo pipefail

build="${1:-build-release}"
out="${2:-runs/zero-overlap}"
steps="${STEPS:-8}"
data="${DATA:-data/text/austen_train_*.bin}"
train="$build/train/ddp-train"
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

[[ -x "$train" ]] || { echo "zero_overlap: $train not found; build first (meson compile -C $build)" >&2; exit 1; }
compgen -G "$data" >/dev/null || { echo "zero_overlap: no shard matches $data; run scripts/fetch-text.sh data/text" >&2; exit 1; }
mkdir -p "$out"

# run NAME ARGS...: d12 at 2 ranks; the log and the --metrics summary line are kept
run() {
    local name="$1"
    shift
    mpirun --oversubscribe --bind-to none -np 2 "$train" --model gpt2 --gpt-config d12 --seq 64 \
        --batch 4 --max-steps "$steps" --data "$data" --val-max-batches 1 --log-every 1000 \
        --device cpu --metrics "$out/$name.jsonl" "$@" >"$out/$name.log" 2>&1 ||
        { echo "zero_overlap: run $name failed (see $out/$name.log)" >&2; tail -5 "$out/$name.log" >&2; return 1; }
    grep '"summary"' "$out/$name.jsonl" >"$out/$name.json"
}
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$out/$1.json" "$2"; }

{
    echo "| run | steps x ranks | gather (ms, median) | forward compute inside it (ms) | hidden |"
    echo "| --- | ---: | ---: | ---: | ---: |"
} >"$out/overlap.md"
for z in 1 2; do
    run "overlap-z$z" --zero "$z" --trace "$out/overlap-z$z.trace.json"
    /usr/bin/python3 "$here/gather_overlap.py" "$out/overlap-z$z.trace.json" "d12, --zero $z" >>"$out/overlap.md"
done

{
    echo "| run (--accum 2) | largest VmHWM / rank (MiB) | communication buffers (MiB) | tokens/s |"
    echo "| --- | ---: | ---: | ---: |"
} >"$out/accum.md"
for v in "z1:--zero 1" "z2-local:--zero 2 --zero-accum local" "z2-reduce:--zero 2 --zero-accum reduce"; do
    name="accum-${v%%:*}"
    # shellcheck disable=SC2086
    run "$name" --accum 2 ${v#*:}
    printf '| %s | %.0f | %.1f | %.1f |\n' "${v#*:}" "$(field "$name" mem_peak_rss_max_mib)" \
        "$(field "$name" mem_comm_mib)" "$(field "$name" tokens_per_s)" >>"$out/accum.md"
done
cat "$out/overlap.md" "$out/accum.md"
