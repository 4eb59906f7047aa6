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
# wave     12 (or 64) ranks at step 7, rank 1 late (in "forward"), rank 5 frozen (SIGSTOP), the others in
#          the barrier ("backward"), DDP_TIMEOUT=4 (12 ranks start on 2 cores): the wavefront names
#          rank 5 frozen, rank 1 behind at step 7 in forward, and the 10 others in one line, waiting
#          in the barrier at step 7 in backward: 3 lines between its heading and its total.
# All: the barrier never completed and no rank is left running (10 s after mpirun returned).
# With 64 ranks (more than 16) DDP_TIMEOUT is 8 and the limit 60 s: the report stays 3 lines.
# Usage: watchdog_late.sh late|blocked|wave MPIRUN [MPIRUN_ARGS...] -np N WD_LATE 60 [--block-stderr|--wave]
set -u
mode=$1
shift
np=$(echo "$*" | sed -n 's/.* -np \([0-9]*\) .*/\1/p')
case $mode in
late) limit=15 cap=40 timeout=2 ;;
blocked) limit=35 cap=90 timeout=2 ;;
wave) limit=30 cap=90 timeout=4 ;;
*) echo "usage: watchdog_late.sh late|blocked|wave MPIRUN ..." >&2; exit 2 ;;
esac
# 64 ranks oversubscribing 2 cores start and answer slower: a longer deadline, more time
[ "$mode" = wave ] && [ "${np:-0}" -gt 16 ] && limit=60 cap=150 timeout=8
last=$(( ${np:-12} - 1 ))
out=$(mktemp)
trap 'rm -f "$out"; pkill -KILL -x wd-late 2>/dev/null' EXIT
start=$(date +%s)
DDP_TIMEOUT=$timeout timeout -k 5 "$cap" "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
sed 's/^/  | /' "$out"
fails=0
check() { if eval "$2"; then echo "ok     $1"; else echo "FAILED $1"; fails=$((fails + 1)); fi; }
check "the job ended within $limit s (took ${took} s)" "[ $took -le $limit ]"
check "exit status non-zero ($rc)" "[ $rc -ne 0 ]"
if [ "$mode" = late ]; then
    check "the barrier is named as past its deadline" "grep -q 'collective #[0-9]* (barrier.*past its deadline' '$out'"
    check "rank 1 is named as behind" "grep -q ' rank 1 (host [^)]*): behind, has not reached #' '$out'"
    check "ranks 0 and 2 wait in the barrier, one line" "grep -q ' ranks 0,2 (host [^)]*): waiting in #[0-9]* (barrier)' '$out'"
elif [ "$mode" = wave ]; then
    # The reporting rank's lines only: the others' lines may come between them.
    who=$(grep -m1 -o '^\[rank [0-9]* [^]]*\] error: where the ranks are' "$out" | sed 's/\] error: .*/]/')
    report=$(grep -F -- "$who " "$out" | sed -n '/where the ranks are/,/never arrived/p' | head -20)
    check "the wavefront names rank 5 as frozen" "echo \"\$report\" | grep -q ' rank 5 (host [^)]*): did not answer'"
    check "rank 1 behind, at step 7 in forward" "echo \"\$report\" | grep -q ' rank 1 (host [^)]*) at step 7, forward: behind'"
    check "the $((last - 1)) others in one line: at step 7 in backward, waiting in the barrier" \
        "echo \"\$report\" | grep -q ' ranks 0,2-4,6-$last (host [^)]*) at step 7, backward: waiting in #[0-9]* (barrier)'"
    check "frozen first, then behind, then waiting: 3 lines between the heading and the total" \
        "[ \"\$(echo \"\$report\" | sed -n '2p;3p;4p' | grep -c -e 'did not answer' -e behind -e 'waiting in')\" = 3 ] && [ \$(echo \"\$report\" | wc -l) = 5 ] && echo \"\$report\" | sed -n 2p | grep -q 'did not answer' && echo \"\$report\" | sed -n 3p | grep -q behind"
    # the same wavefront as one JSON line for log readers
    json=$(grep -F -- "$who " "$out" | sed -n 's/.*wavefront (JSON): //p' | head -1)
    check "the JSON line: rank 5 frozen, rank 1 behind at step 7 in forward, $((last - 1)) waiting in the barrier" \
        "echo '$json' | python3 -c 'import json, sys; g = json.load(sys.stdin)[\"groups\"]; sys.exit(not ([(x[\"ranks\"], x[\"count\"], x[\"state\"]) for x in g] == [(\"5\", 1, \"frozen\"), (\"1\", 1, \"behind\"), (\"0,2-4,6-$last\", $((last - 1)), \"waiting\")] and g[1][\"step\"] == 7 and g[1][\"phase\"] == \"forward\" and g[2][\"phase\"] == \"backward\" and g[2][\"what\"] == \"barrier\"))'"
else
    check "rank 0 blocked its stderr" "! grep -q 'could not block stderr' '$out'"
fi
check "no barrier completed" "! grep -q 'barrier returned' '$out'"
# Zombies (ended, not yet reaped by their parent) do not count as running. mpirun may return while
# a rank it killed is still ending (an ASan build's exit takes a while; CI saw it once): wait up to
# 10 s for the last one, then list what is left.
alive() { ps -C wd-late -o stat= | grep -qv '^Z'; }
n=0
while alive && [ $n -lt 20 ]; do sleep 0.5; n=$((n + 1)); done
alive && ps -C wd-late -o pid=,stat=,etime=,args= | sed 's/^/  left: /'
check "no rank left running 10 s after mpirun returned (waited $((n / 2)) s)" "! alive"
exit $((fails > 0))
