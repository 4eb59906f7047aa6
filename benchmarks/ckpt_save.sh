#!/bin/bash
# ckpt_save.sh - checkpoint save time of GPT-2 d12 (--zero 1), a single file gathered through rank 0
# (--checkpoint-format file) against a folder of per-rank files (--checkpoint-format folder), at 1,
# 2, 4 and 8 ranks (8 oversubscribed on a small machine), both formats at each count in the same
# invocation so their ratio is read from one run; then resumes the 4-rank folder at 1, 2, 3 and 4
# ranks and the consolidated file alike, and compares their validation losses.
#
#   benchmarks/ckpt_save.sh [BUILD [OUT]]     (RANKS="1 2 4 8", RESUME_RANKS="1 2 3 4" to change;
#                                              MODE=resume: only the resumes, from OUT/folder-4;
#                                              MODE=stall: only the training stall of a save, below;
#                                              CKPT_DIR=/dev/shm/x: checkpoints there instead of OUT)
#
# MODE=stall: the training stall of a save, issue 29's "step-time increase at the save step", for a
# synchronous single file, a synchronous folder and a folder written by --checkpoint-async, in one
# invocation (STALL_RANKS=4, STALL_CONFIG=d12, --zero 1, STALL_STEPS=10 steps, a save after step
# STALL_AT=6 and the one at the end). From the --trace timeline (rank 0's "step" spans), the
# interval from the start of one step to the start of the next: the stall is the interval across
# the save minus the median of the others (the first, warm-up interval left out). Where the
# background write shares the CPU with training, the steps after the save slow down too: their
# excess over the median before the save is shown as "after". Also rank 0's "checkpoint" span of
# that save (what training waits for, without the other steps' noise on a shared machine).
#
# Each run trains 1 step and saves at its end (--checkpoint-every 0). ddp-train prints per save
#   checkpoint DIR/step-N.ckpt (step N): T s                                   (file)
#   checkpoint DIR/step-N.ckpt (step N): T s, the slowest rank's file W s        (folder)
# T: the whole save as every rank waits for it (file: gather + rank 0's write + fsync; folder:
# every rank's copy to the host, its write + fsync, then the MANIFEST), W: the slowest rank's own
# file (its write + fsync, timed by libddp's checkpoint manager; before it, W held the copy to the
# host too). Output: a table with both, and the file/folder ratio.
set -euo pipefail

build="${1:-build-release}"
out="${2:-runs/ckpt-save}"
ranks="${RANKS:-1 2 4 8}"
resume_ranks="${RESUME_RANKS:-1 2 3 4}"
data="${DATA:-data/text/austen_train_*.bin}"
val="${VAL:-data/text/austen_val_*.bin}"
train="$build/train/ddp-train"
ckpt="$build/tools/ddp-ckpt"
export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

[[ -x "$train" ]] || { echo "ckpt_save: $train not found; build first" >&2; exit 1; }
compgen -G "$data" >/dev/null || { echo "ckpt_save: no shard matches $data (scripts/fetch-text.sh)" >&2; exit 1; }
mode="${MODE:-all}"
ckdir="${CKPT_DIR:-$out}"
[[ "$mode" == resume || "$mode" == stall ]] || rm -rf "$out" "$ckdir"
mkdir -p "$out" "$ckdir"

gpt() { # NAME RANKS ARGS...
    local name="$1" n="$2"
    shift 2
    mpirun --oversubscribe --bind-to none -np "$n" "$train" --model gpt2 --gpt-config d12 --seq 64 \
        --batch 1 --data "$data" --val-data "$val" --val-max-batches 2 --log-every 1000 "$@" \
        >"$out/$name.log" 2>&1 || { echo "ckpt_save: $name failed (see $out/$name.log)" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}

# The stall of one run's save, from its --trace FILE: "interval_at_save median stall after".
stall_of() { # TRACE SAVE_STEP
    python3 - "$1" "$2" <<'PY'
import json, statistics, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
at = int(sys.argv[2])  # the save follows the step whose span has index at - 1 (0-based)
begin = {}
for e in events:
    if e.get("name") == "step" and e.get("ph") == "B" and e.get("pid") == 0:
        begin.setdefault(int(e.get("args", {}).get("arg", len(begin))), e["ts"])
steps = sorted(begin)
ts = [begin[s] for s in steps]
iv = [(b - a) / 1e6 for a, b in zip(ts, ts[1:])]  # iv[i]: step i and whatever follows it
i_save = steps.index(at - 1)
others = [x for i, x in enumerate(iv) if i >= 1 and i != i_save]
before = [x for i, x in enumerate(iv) if 1 <= i < i_save]
med, med_before = statistics.median(others), statistics.median(before)
after = sum(x - med_before for x in iv[i_save + 1:])
# rank 0's "checkpoint" span inside that interval: the save as training waits for it, free of the
# step-time noise of a shared machine
spans, opened = [], None
for e in events:
    if e.get("name") == "checkpoint" and e.get("pid") == 0 and e.get("ph") in "BE":
        if e["ph"] == "B":
            opened = e["ts"]
        elif opened is not None and ts[i_save] <= opened < ts[i_save + 1]:
            spans.append((e["ts"] - opened) / 1e6)
print(f"{iv[i_save]:.2f} {med:.2f} {iv[i_save] - med:.2f} {after:.2f} {sum(spans):.3f}")
PY
}

save_line() { grep -m1 -E '^checkpoint .*\(step [0-9]+\): ' "$out/$1.log"; }
seconds() { sed -E 's/.*\): ([0-9.]+) s.*/\1/'; }

if [[ "$mode" == stall ]]; then
    n="${STALL_RANKS:-4}" cfg="${STALL_CONFIG:-d12}" steps="${STALL_STEPS:-10}" at="${STALL_AT:-6}"
    echo "GPT-2 $cfg, $n ranks, --zero 1, $steps steps, a save after step $at (and at the end)"
    echo
    echo "| save | step interval at the save (s) | median of the others (s) | stall (s) | after: later steps' excess (s) | checkpoint span (s) | stall / file's | span / file's |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    base="" base_span=""
    for kind in file folder async; do
        fmt=(--checkpoint-format "$kind")
        [[ "$kind" == async ]] && fmt=(--checkpoint-format folder --checkpoint-async)
        rm -rf "$ckdir/stall-$kind"
        gpt "stall-$kind" "$n" --gpt-config "$cfg" --zero 1 --max-steps "$steps" --checkpoint-every "$at" \
            --checkpoint-dir "$ckdir/stall-$kind" "${fmt[@]}" --trace "$out/stall-$kind.json"
        read -r iv med stall after span < <(stall_of "$out/stall-$kind.json" "$at")
        [[ -n "$base" ]] || { base="$stall"; base_span="$span"; }
        printf '| %s | %s | %s | %s | %s | %s | %.3f | %.3f |\n' "$kind" "$iv" "$med" "$stall" "$after" \
            "$span" "$(echo "$stall / $base" | bc -l)" "$(echo "$span / $base_span" | bc -l)"
        rm -rf "$ckdir/stall-$kind"
    done
    exit 0
fi

[[ "$mode" == resume ]] || {
echo "| ranks | file: save (s) | folder: save (s) | folder: slowest rank's file (s) | slowest file / file save |"
echo "| --- | --- | --- | --- | --- |"
for n in $ranks; do
    zero=1
    [[ "$n" == 1 ]] && zero=0
    gpt "file-$n" "$n" --zero "$zero" --max-steps 1 --checkpoint-dir "$ckdir/file-$n" --checkpoint-format file
    gpt "folder-$n" "$n" --zero "$zero" --max-steps 1 --checkpoint-dir "$ckdir/folder-$n" --checkpoint-format folder
    f=$(save_line "file-$n" | seconds)
    d=$(save_line "folder-$n" | seconds)
    w=$(save_line "folder-$n" | sed -E "s/.*file ([0-9.]+) s.*/\1/")
    printf '| %s | %s | %s | %s | %.2f |\n' "$n" "$f" "$d" "$w" "$(echo "$w / $f" | bc -l)"
    [[ "$n" == 4 ]] || rm -rf "$ckdir/file-$n" "$ckdir/folder-$n"
done
}

src="$ckdir/folder-4/step-000000000001.ckpt"
[[ -d "$src" ]] || exit 0
"$ckpt" consolidate "$src" "$out/consolidated.ckpt" >/dev/null
val_loss() { grep -o '"val_loss":[^,]*' "$out/$1.jsonl" | tail -1 | cut -d: -f2; }
echo
echo "| resumed at | from the 4-rank --zero 1 folder: val loss | from the consolidated file: val loss | same |"
echo "| --- | --- | --- | --- |"
for n in $resume_ranks; do
    for kind in folder file; do
        from="$src"
        [[ "$kind" == file ]] && from="$out/consolidated.ckpt"
        gpt "resume-$kind-$n" "$n" --zero "$([[ "$n" == 1 ]] && echo 0 || echo 1)" --max-steps 2 --val-every 1 --resume "$from" --resume-reshard \
            --metrics "$out/resume-$kind-$n.jsonl"
    done
    a=$(val_loss "resume-folder-$n")
    b=$(val_loss "resume-file-$n")
    echo "| $n | $a | $b | $([[ "$a" == "$b" ]] && echo yes || echo NO) |"
done
