#!/usr/bin/env bash
# gpt_memory.sh - what ZeRO (--zero 0|1|2) and --recompute cost and save, per rank, on the GPT.
#
# Part 1: a small GPT (4 layers x 256 channels x 128 tokens, batch 4) and GPT-2 124M (d12, 64
# tokens, batch 1) at 1, 2 and 4 ranks (mpirun on this machine) under each stage: the largest
# peak RSS (VmHWM) over the ranks, the model states (parameters + gradients + optimizer state)
# against the ZeRO formula's prediction, and tokens/s. At 1 rank the stages are the same run (a
# rank's shard is everything), so only --zero 0 runs there. ROUNDS rounds alternate the stages and
# the median tokens/s is kept (a 2-core machine drifts).
# Part 2: the largest GPT (channels 768, 12 heads, 256 tokens, batch 4, L layers) that fits in
# BUDGET_MIB of peak RSS per rank at 2 ranks, for --zero 0, 1, 2 and --zero 1 --recompute: the
# peak is linear in L, so two short runs (L 2 and 6) give its slope and the largest L under the
# budget, and runs at that L (one layer fewer while the peak is over the budget: the fit misses
# the transients) give the figure (its VmHWM printed beside the budget).
# Part 3: d12 (64 tokens, batch 4, STEPS3 steps) at 2 ranks. The parameters' all-gather after
# each optimizer step: how much of it the next forward pass hides (gather_overlap.py on a --trace
# of --zero 1 and --zero 2: forward.layer compute inside the gather over its duration); --zero
# 2's ready-order buckets bring the embeddings and layer 0 first, --zero 1's parameter-order
# buckets of the tensor-major layout bring layer 0's last slices among the last. Then --accum 2:
# the largest VmHWM, bucket buffers and tokens/s of --zero 1, --zero 2 --zero-accum local (the
# full gradients held while accumulating; stage 0's sums) and --zero-accum reduce.
# Part 4: d12 in bf16 (64 tokens, batch 1, 2 steps) at 2, 3 and 4 ranks, --zero 1 and 2: the
# model states per rank against the ZeRO paper's formula (16-bit weights + gradients + 12 bytes
# per parameter / N), and the largest VmHWM. Run it on two builds (BUILD_DIR) to compare layouts.
#
# Usage: benchmarks/gpt_memory.sh [BUILD_DIR (build-release)] [OUT_DIR (runs/gpt-memory)]
#   ROUNDS (2), BUDGET_MIB (3072), DATA ('data/text/austen_train_*.bin'), PARTS ("1 2"),
#   VARIANTS (part 2's, "z0 z1 z2 z1-recompute": a rerun of some of them), STEPS3 (8).
# Writes OUT_DIR/table.md, OUT_DIR/capacity.md, OUT_DIR/memory.dat and OUT_DIR/memory.png (gnuplot);
# part 3 OUT_DIR/overlap.md and OUT_DIR/accum.md; part 4 OUT_DIR/bf16.md.
set -euo pipefail

build="${1:-build-release}"
out="${2:-runs/gpt-memory}"
rounds="${ROUNDS:-2}"
budget="${BUDGET_MIB:-3072}"
data="${DATA:-data/text/austen_train_*.bin}"
train="$build/train/ddp-train"
export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

[[ -x "$train" ]] || { echo "gpt_memory: $train not found; build first (meson compile -C $build)" >&2; exit 1; }
compgen -G "$data" >/dev/null || { echo "gpt_memory: no shard matches $data; run scripts/fetch-text.sh data/text" >&2; exit 1; }
mkdir -p "$out"

# run NAME RANKS ARGS...: one training run; its summary line is kept in $out/NAME.json
run() {
    local name="$1" n="$2"
    shift 2
    mpirun --oversubscribe --bind-to none -np "$n" "$train" --model gpt2 --data "$data" \
        --val-max-batches 1 --log-every 1000 --metrics "$out/$name.jsonl" "$@" >"$out/$name.log" 2>&1 ||
        { echo "gpt_memory: run $name failed (see $out/$name.log)" >&2; tail -5 "$out/$name.log" >&2; return 1; }
    grep '"summary"' "$out/$name.jsonl" >"$out/$name.json"
}

# field NAME KEY: a number from a run's summary
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$out/$1.json" "$2"; }

declare -A cfg=([small]="--layers 4 --heads 4 --channels 256 --seq 128 --batch 4 --max-steps 16"
                [d12]="--gpt-config d12 --seq 64 --batch 1 --max-steps 4")

part1() {
    echo "| config | ranks | --zero | peak RSS / rank (MiB) | model states (MiB) | predicted (MiB) | tokens/s |" >"$out/table.md"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" >>"$out/table.md"
    : >"$out/memory.dat"
    for c in small d12; do
        for n in 1 2 4; do
            stages="0 1 2"
            [[ $n == 1 ]] && stages="0"
            for r in $(seq 1 "$rounds"); do
                for z in $stages; do
                    # shellcheck disable=SC2086
                    run "$c-np$n-z$z-r$r" "$n" ${cfg[$c]} --zero "$z"
                    echo "gpt_memory: $c, $n rank(s), --zero $z, round $r: $(field "$c-np$n-z$z-r$r" tokens_per_s) tokens/s"
                done
            done
            for z in $stages; do
                tps=$(for r in $(seq 1 "$rounds"); do field "$c-np$n-z$z-r$r" tokens_per_s; done | sort -g |
                      awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
                f="$c-np$n-z$z-r1"
                rss=$(field "$f" mem_peak_rss_max_mib)
                printf '| %s | %d | %d | %.0f | %.1f | %.1f | %.1f |\n' "$c" "$n" "$z" "$rss" \
                    "$(field "$f" mem_states_mib)" "$(field "$f" mem_predicted_states_mib)" "$tps" >>"$out/table.md"
                echo "$c $n $z $rss $(field "$f" mem_states_mib) $(field "$f" mem_predicted_states_mib) $tps" >>"$out/memory.dat"
            done
        done
    done
    cat "$out/table.md"
    if command -v gnuplot >/dev/null; then
        gnuplot <<EOF
set terminal pngcairo size 900,420 noenhanced
set output "$out/memory.png"
set multiplot layout 1,2 title "GPT-2 d12 on $(nproc --all) CPU cores: memory per rank against ranks (mpirun, one host)"
set xlabel "ranks"; set ylabel "MiB per rank"; set xtics (1, 2, 4); set key top right; set grid
set title "peak RSS (VmHWM), largest rank"
plot for [z=0:2] "< awk '\$1==\"d12\" && (\$3==".z." || \$2==1)' $out/memory.dat" using 2:4 with linespoints title "--zero ".z
set title "model states: measured, formula"
plot for [z=0:2] "< awk '\$1==\"d12\" && (\$3==".z." || \$2==1)' $out/memory.dat" using 2:5 with points pt 7 title "--zero ".z." measured", \
     for [z=0:2] "< awk '\$1==\"d12\" && (\$3==".z." || \$2==1)' $out/memory.dat" using 2:6 with lines title "--zero ".z." formula"
unset multiplot
EOF
        echo "gpt_memory: plot in $out/memory.png"
    fi
}

part2() {
    local base="--channels 768 --heads 12 --seq 256 --batch 4 --max-steps 1"
    echo "| variant | MiB per layer | MiB at 0 layers | largest L in $budget MiB | parameters | its peak RSS (MiB) |" >"$out/capacity.md"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |" >>"$out/capacity.md"
    for v in "z0:--zero 0" "z1:--zero 1" "z2:--zero 2" "z1-recompute:--zero 1 --recompute"; do
        local tag="${v%%:*}" args="${v#*:}"
        [[ " ${VARIANTS:-z0 z1 z2 z1-recompute} " == *" $tag "* ]] || continue
        # shellcheck disable=SC2086
        run "cap-$tag-L2" 2 $base --layers 2 $args
        # shellcheck disable=SC2086
        run "cap-$tag-L6" 2 $base --layers 6 $args
        local m2 m6
        m2=$(field "cap-$tag-L2" mem_peak_rss_max_mib)
        m6=$(field "cap-$tag-L6" mem_peak_rss_max_mib)
        read -r slope at0 lmax < <(awk -v a="$m2" -v b="$m6" -v B="$budget" \
            'BEGIN {s = (b - a) / 4; z = a - 2 * s; printf "%.1f %.0f %d\n", s, z, int((B - z) / s)}')
        # the line's figure, checked: one layer fewer until the run's peak is under the budget
        while :; do
            # shellcheck disable=SC2086
            run "cap-$tag-max" 2 $base --layers "$lmax" $args
            awk -v m="$(field "cap-$tag-max" mem_peak_rss_max_mib)" -v B="$budget" 'BEGIN {exit !(m > B)}' || break
            echo "gpt_memory: $args: $lmax layers peak at $(field "cap-$tag-max" mem_peak_rss_max_mib) MiB, over $budget"
            lmax=$((lmax - 1))
        done
        printf '| %s | %s | %s | %d | %s | %.0f |\n' "$args" "$slope" "$at0" "$lmax" \
            "$(grep -o 'gpt2: [0-9]* parameters' "$out/cap-$tag-max.log" | head -1 | awk '{print $2}')" \
            "$(field "cap-$tag-max" mem_peak_rss_max_mib)" >>"$out/capacity.md"
        echo "gpt_memory: $args: $slope MiB per layer, at most $lmax layers in $budget MiB"
    done
    cat "$out/capacity.md"
}

part3() {
    local d12="--gpt-config d12 --seq 64 --batch 4 --max-steps ${STEPS3:-8} --device cpu"
    {
        echo "| run | steps x ranks | gather (ms, median) | forward compute inside it (ms) | hidden |"
        echo "| --- | ---: | ---: | ---: | ---: |"
    } >"$out/overlap.md"
    for z in 1 2; do
        # shellcheck disable=SC2086
        run "overlap-z$z" 2 $d12 --zero "$z" --trace "$out/overlap-z$z.trace.json"
        /usr/bin/python3 "$(dirname "$0")/gather_overlap.py" "$out/overlap-z$z.trace.json" \
            "d12, --zero $z" >>"$out/overlap.md"
    done
    {
        echo "| run (--accum 2) | largest VmHWM / rank (MiB) | bucket buffers (MiB) | tokens/s |"
        echo "| --- | ---: | ---: | ---: |"
    } >"$out/accum.md"
    for v in "z1:--zero 1" "z2-local:--zero 2 --zero-accum local" "z2-reduce:--zero 2 --zero-accum reduce"; do
        # shellcheck disable=SC2086
        run "accum-${v%%:*}" 2 $d12 --accum 2 ${v#*:}
        printf '| %s | %.0f | %.1f | %.1f |\n' "${v#*:}" "$(field "accum-${v%%:*}" mem_peak_rss_max_mib)" \
            "$(field "accum-${v%%:*}" mem_comm_mib)" "$(field "accum-${v%%:*}" tokens_per_s)" >>"$out/accum.md"
    done
    cat "$out/overlap.md" "$out/accum.md"
}

part4() {
    local d12="--gpt-config d12 --seq 64 --batch 1 --max-steps 2 --device cpu --precision bf16"
    {
        echo "| ranks | --zero | model states (MiB) | formula (MiB) | states / formula | parameters | optimizer state | largest VmHWM / rank (MiB) |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    } >"$out/bf16.md"
    for n in 2 3 4; do
        for z in 1 2; do
            # shellcheck disable=SC2086
            run "bf16-np$n-z$z" "$n" $d12 --zero "$z"
            local psi states
            psi=$(field "bf16-np$n-z$z" n_params)
            states=$(field "bf16-np$n-z$z" mem_states_mib)
            /usr/bin/python3 - "$n" "$z" "$psi" "$states" "$(field "bf16-np$n-z$z" mem_params_mib)" \
                "$(field "bf16-np$n-z$z" mem_optimizer_mib)" \
                "$(field "bf16-np$n-z$z" mem_peak_rss_max_mib)" >>"$out/bf16.md" <<'PY'
import sys
n, z, psi, states, params, opt, rss = (float(x) for x in sys.argv[1:])
formula = psi * (2 + (4 if z == 1 else 4 / n) + 12 / n) / 2**20
print(f"| {n:.0f} | {z:.0f} | {states:.1f} | {formula:.1f} | {states / formula:.3f} | {params:.1f} | "
      f"{opt:.1f} | {rss:.0f} |")
PY
        done
    done
    cat "$out/bf16.md"
}

echo "gpt_memory: $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc --all) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
for p in ${PARTS:-1 2}; do "part$p"; done
