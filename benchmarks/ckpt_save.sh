#!/bin/bash
# ckpt_save.sh - checkpoint save time of GPT-2 d12 (--zero 1), a single file gathered through rank 0
# (--checkpoint-format file) against a folder of per-rank files (--checkpoint-format folder), at 1,
# 2, 4 and 8 ranks (8 oversubscribed on a small machine), both formats at each count in the same
# invocation so their ratio is read from one run; then resumes the 4-rank folder at 1, 2, 3 and 4
# ranks and the consolidated file alike, and compares their validation losses.
#
#   benchmarks/ckpt_save.sh [BUILD [OUT]]     (RANKS="1 2 4 8", RESUME_RANKS="1 2 3 4" to change;
#                                              MODE=resume: only the resumes, from OUT/folder-4;
#                                              CKPT_DIR=/dev/shm/x: checkpoints there instead of OUT)
#
# Each run trains 1 step and saves at its end (--checkpoint-every 0). ddp-train prints per save
#   checkpoint DIR/step-N.ckpt (step N): T s                                   (file)
#   checkpoint DIR/step-N.ckpt (step N): T s, the slowest rank's file W s        (folder)
# T: the whole save as every rank waits for it (file: gather + rank 0's write + fsync; folder:
# every rank's write + fsync, then the MANIFEST), W: the slowest rank's own file (its copy to the
# host and its write). Output: a table with both, and the file/folder ratio.
set -euo pipefail

build="${1:-build-release}"
out="${2:-runs/ckpt-save}"
ranks="${RANKS:-1 2 4 8}"
resume_ranks="${RESUME_RANKS:-1 2 3 4}"
data="${DATA:-data/text/austen_train_*.bin}"
val="${VAL:-data/text/austen_val_*.bin}"
train="$build/train/ddp-train"
ckpt="$build/train/ddp-ckpt"
export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

[[ -x "$train" ]] || { echo "ckpt_save: $train not found; build first" >&2; exit 1; }
compgen -G "$data" >/dev/null || { echo "ckpt_save: no shard matches $data (scripts/fetch-text.sh)" >&2; exit 1; }
mode="${MODE:-all}"
ckdir="${CKPT_DIR:-$out}"
[[ "$mode" == resume ]] || rm -rf "$out" "$ckdir"
mkdir -p "$out" "$ckdir"

gpt() { # NAME RANKS ARGS...
    local name="$1" n="$2"
    shift 2
    mpirun --oversubscribe --bind-to none -np "$n" "$train" --model gpt2 --gpt-config d12 --seq 64 \
        --batch 1 --data "$data" --val-data "$val" --val-max-batches 2 --log-every 1000 "$@" \
        >"$out/$name.log" 2>&1 || { echo "ckpt_save: $name failed (see $out/$name.log)" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}

save_line() { grep -m1 -E '^checkpoint .*\(step [0-9]+\): ' "$out/$1.log"; }
seconds() { sed -E 's/.*\): ([0-9.]+) s.*/\1/'; }

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
