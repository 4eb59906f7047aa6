#!/bin/sh
# watchdog_blocked.sh - the watchdog ends a rank even when its error message cannot be written:
# 2 ranks of wd-late (watchdog_late.c --block-stderr), rank 0's stderr a full pipe nobody reads,
# rank 1 late by 60 s for a barrier, DDP_TIMEOUT=2. Rank 0's watchdog fires and blocks writing its
# message; its backstop (_exit 15 s after ending began) must end rank 0, and mpirun the job, well
# before rank 1 would arrive: within 35 s, non-zero, the barrier never completed, no rank left.
# Usage: watchdog_blocked.sh MPIRUN [MPIRUN_ARGS...] -np 2 WD_LATE 60 --block-stderr
set -u
out=$(mktemp)
trap 'rm -f "$out"; pkill -KILL -x wd-late 2>/dev/null' EXIT
start=$(date +%s)
DDP_TIMEOUT=2 timeout -k 5 90 "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
sed 's/^/  | /' "$out"
fails=0
check() { if eval "$2"; then echo "ok     $1"; else echo "FAILED $1"; fails=$((fails + 1)); fi; }
check "the job ended within 35 s (took ${took} s)" "[ $took -le 35 ]"
check "exit status non-zero ($rc)" "[ $rc -ne 0 ]"
check "rank 0 blocked its stderr" "! grep -q 'could not block stderr' '$out'"
check "no barrier completed" "! grep -q 'barrier returned' '$out'"
check "no rank left running" "! ps -C wd-late -o stat= | grep -qv '^Z'"
exit $((fails > 0))
