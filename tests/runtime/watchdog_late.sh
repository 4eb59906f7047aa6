#!/bin/sh
# watchdog_late.sh - the deadline of a collective and the "where are you" diagnosis: 3 ranks of
# wd-late (watchdog_late.c), rank 1 sleeps 60 s before a barrier, DDP_TIMEOUT=2. Within 15 s the job
# must end with a non-zero status, the message must name the barrier past its deadline and rank 1
# as behind (it answers the query with an older collective), and no rank may be left running.
# Usage: watchdog_late.sh MPIRUN [MPIRUN_ARGS...] -np 3 WD_LATE
set -u
out=$(mktemp)
trap 'rm -f "$out"; pkill -KILL -x wd-late 2>/dev/null' EXIT
start=$(date +%s)
DDP_TIMEOUT=2 timeout -k 5 40 "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
sed 's/^/  | /' "$out"
fails=0
check() { if eval "$2"; then echo "ok     $1"; else echo "FAILED $1"; fails=$((fails + 1)); fi; }
check "the job ended within 15 s (took ${took} s)" "[ $took -le 15 ]"
check "exit status non-zero ($rc)" "[ $rc -ne 0 ]"
check "the barrier is named as past its deadline" "grep -q 'collective #[0-9]* (barrier.*past its deadline' '$out'"
check "rank 1 is named as behind" "grep -q 'rank 1 (host .*behind: has not reached collective' '$out'"
check "rank 2 arrived (not named)" "! grep -q '  rank 2 (host' '$out'"
check "no barrier completed" "! grep -q 'barrier returned' '$out'"
# Zombies (ended, not yet reaped by their parent) do not count as running.
check "no rank left running" "! ps -C wd-late -o stat= | grep -qv '^Z'"
exit $((fails > 0))
