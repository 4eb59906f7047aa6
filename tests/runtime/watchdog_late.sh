#!/bin/sh
# watchdog_late.sh - the watchdog against a rank late for a barrier (wd-late, watchdog_late.c),
# DDP_TIMEOUT=2. Two modes:
# late     3 ranks, rank 1 sleeps 60 s before the barrier. Within 15 s the job must end with a
#          non-zero status, the message must name the barrier past its deadline and rank 1 as
#          behind (it answers the query with an older collective), and rank 2 not.
# blocked  2 ranks, rank 0's stderr a full pipe nobody reads (--block-stderr), rank 1 late by 60 s.
#          Rank 0's watchdog fires and blocks writing its message; its backstop (_exit 15 s after
#          ending began) must end rank 0, and mpirun the job, well before rank 1 would arrive:
#          within 35 s, non-zero.
# Both: the barrier never completed and no rank is left running.
# Usage: watchdog_late.sh late|blocked MPIRUN [MPIRUN_ARGS...] -np N WD_LATE 60 [--block-stderr]
set -u
mode=$1
shift
case $mode in
late) limit=15 cap=40 ;;
blocked) limit=35 cap=90 ;;
*) echo "usage: watchdog_late.sh late|blocked MPIRUN ..." >&2; exit 2 ;;
esac
out=$(mktemp)
trap 'rm -f "$out"; pkill -KILL -x wd-late 2>/dev/null' EXIT
start=$(date +%s)
DDP_TIMEOUT=2 timeout -k 5 "$cap" "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
sed 's/^/  | /' "$out"
fails=0
check() { if eval "$2"; then echo "ok     $1"; else echo "FAILED $1"; fails=$((fails + 1)); fi; }
check "the job ended within $limit s (took ${took} s)" "[ $took -le $limit ]"
check "exit status non-zero ($rc)" "[ $rc -ne 0 ]"
if [ "$mode" = late ]; then
    check "the barrier is named as past its deadline" "grep -q 'collective #[0-9]* (barrier.*past its deadline' '$out'"
    check "rank 1 is named as behind" "grep -q 'rank 1 (host .*behind: has not reached collective' '$out'"
    check "rank 2 arrived (not named)" "! grep -q '  rank 2 (host' '$out'"
else
    check "rank 0 blocked its stderr" "! grep -q 'could not block stderr' '$out'"
fi
check "no barrier completed" "! grep -q 'barrier returned' '$out'"
# Zombies (ended, not yet reaped by their parent) do not count as running.
check "no rank left running" "! ps -C wd-late -o stat= | grep -qv '^Z'"
exit $((fails > 0))
