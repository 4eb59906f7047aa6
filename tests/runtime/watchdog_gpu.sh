#!/bin/sh
# watchdog_gpu.sh - the wavefront on the GPU stream lane (wd-gpu, watchdog_gpu.c): at step S the
# last rank never queues the step's all-reduces, the others' streams block in the first (#N), their
# waits pass DDP_TIMEOUT (2 s; 3 s on the cuda backend, whose NCCL start-up shares it) and call
# watchdog_survey. The first rank to report must say that #N (all-reduce of bucket 1) is the
# oldest collective not complete on its GPU stream, then the wavefront: the last rank first, then
# the others in one line waiting in #N at step S, gradient sync, micro-step 1, and the same as
# JSON with lane 2. Modes:
# late  the last rank sleeps in "forward": it answers, behind at step S, forward, micro-step 1,
#       its last collective #N-1 (all-reduce of bucket 0) finished
# stop  the last rank stops itself (SIGSTOP): it does not answer, frozen
# full  late, and step S has 300 all-reduces, more than the lane's 256 slots, none complete: the
#       oldest the ring holds (2S + 45, sim only) is named "ring full: or earlier"
# All: the job ends with a non-zero status within DDP_TIMEOUT + 10 s, no rank finishes its steps,
# and no rank is left running 10 s after mpirun returned. On the simulated stream (sim) N is
# 2S + 1 (two all-reduces a step). mpirun's status 77 (every rank skipped: no GPU) is passed on.
# Usage: watchdog_gpu.sh late|stop|full S MPIRUN [MPIRUN_ARGS...] -np N -x DDP_TIMEOUT
#        -x WD_GPU_TAG [fake_rank.sh LIB] WD_GPU sim|cuda late|stop|full S
set -u
mode=$1
step=$2
shift 2
case $mode in
late | stop | full) ;;
*) echo "usage: watchdog_gpu.sh late|stop|full S MPIRUN ..." >&2; exit 2 ;;
esac
# what the others wait in (its label, its JSON what and bucket), #N on the simulated stream
label="all-reduce of bucket 1" what=all-reduce bucket=1 sim_n=$((2 * step + 1))
[ "$mode" = full ] && label="ring full: or earlier" what=$label bucket=-1 sim_n=$((2 * step + 45))
np=$(echo "$*" | sed -n 's/.* -np \([0-9]*\) .*/\1/p')
last=$(( ${np:-3} - 1 ))
others="0-$((last - 1))"
[ "$last" = 2 ] && others="0,1"
[ "$last" = 1 ] && others="0"
timeout=2
case " $* " in *" cuda "*) timeout=3 ;; esac
limit=$((timeout + 10))
out=$(mktemp)
# This job's ranks carry a tag (mpirun -x WD_GPU_TAG): other jobs' wd-gpu are neither counted nor
# killed.
WD_GPU_TAG="wd-gpu-$$-$(date +%s%N)"
export WD_GPU_TAG
ours() {
    for p in $(ps -C wd-gpu -o pid=); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "WD_GPU_TAG=$WD_GPU_TAG" && echo "$p"
    done
}
trap 'rm -f "$out"; for p in $(ours); do kill -KILL "$p" 2>/dev/null; done' EXIT
start=$(date +%s)
DDP_TIMEOUT=$timeout timeout -k 5 60 "$@" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
sed 's/^/  | /' "$out"
if [ $rc = 77 ]; then
    echo "skipped: no GPU per rank"
    exit 77
fi
fails=0
check() { if eval "$2"; then echo "ok     $1"; else echo "FAILED $1"; fails=$((fails + 1)); fi; }
check "the job ended within $limit s (took ${took} s)" "[ $took -le $limit ]"
check "exit status non-zero ($rc)" "[ $rc -ne 0 ]"
# The first reporting rank's lines only: the others' lines may come between them.
who=$(grep -m1 -o '^\[rank [0-9]* [^]]*\] error: the oldest collective not complete' "$out" |
      sed 's/\] error: .*/]/')
report=$(grep -F -- "$who " "$out" | sed -n '/the oldest collective not complete/,/wavefront (JSON)/p')
n=$(echo "$report" | sed -n '1s/.*GPU stream: #\([0-9]*\) .*/\1/p')
prev=$(( ${n:-0} - 1 ))  # the last rank's last collective: step S - 1's last
[ "$mode" = full ] && prev=$((2 * step))
check "a rank reported the oldest collective not complete on its GPU stream: #${n:-?} ($label, ..., GPU stream)" \
    "[ -n '$who' ] && [ -n '$n' ] && echo \"\$report\" | sed -n 1p | grep -q ' ($label, [0-9]* bytes, GPU stream)'"
case " $* " in *" sim "*) check "on the simulated stream that is #$sim_n" "[ '$n' = $sim_n ]" ;; esac
wave=$(echo "$report" | sed -n '/where the ranks are/,$p')
check "the wavefront's heading follows, for #$n" \
    "echo \"\$wave\" | sed -n 1p | grep -q 'where the ranks are (the ones that hold collective #$n up first)'"
if [ "$mode" != stop ]; then
    check "first rank $last: behind at step $step, forward, micro-step 1, its last #$prev (all-reduce of bucket 0) finished" \
        "echo \"\$wave\" | sed -n 2p | grep -q ' rank $last (host [^)]*) at step $step, forward, micro-step 1: behind, has not reached #$n: its last on this lane is #$prev (all-reduce of bucket 0), finished'"
else
    check "first rank $last: frozen" \
        "echo \"\$wave\" | sed -n 2p | grep -q ' rank $last (host [^)]*): did not answer within'"
fi
check "then ranks $others in one line: at step $step, gradient sync, micro-step 1, waiting in #$n ($label)" \
    "echo \"\$wave\" | sed -n 3p | grep -q ' ranks\{0,1\} $others (host [^)]*) at step $step, gradient sync, micro-step 1: waiting in #$n ($label)'"
check "then the total: 1 of $np ranks never arrived at #$n" \
    "echo \"\$wave\" | sed -n 4p | grep -q '1 of $np ranks never arrived at collective #$n'"
json=$(echo "$report" | sed -n 's/.*wavefront (JSON): //p' | head -1)
state=behind
[ "$mode" = stop ] && state=frozen
check "the JSON line: collective $n, lane 2, rank $last $state first, then ranks $others waiting in #$n" \
    "echo '$json' | python3 -c '
import json, sys
w = json.load(sys.stdin)
g = w[\"groups\"]
ok = w[\"collective\"] == $n and w[\"lane\"] == 2 and len(g) == 2
ok = ok and (g[0][\"ranks\"], g[0][\"count\"], g[0][\"state\"]) == (\"$last\", 1, \"$state\")
ok = ok and (g[1][\"ranks\"], g[1][\"count\"], g[1][\"state\"]) == (\"$others\", $last, \"waiting\")
ok = ok and (g[1][\"step\"], g[1][\"micro\"], g[1][\"phase\"]) == ($step, 1, \"gradient sync\")
ok = ok and (g[1][\"at\"], g[1][\"active\"], g[1][\"what\"], g[1][\"bucket\"]) == ($n, 1, \"$what\", $bucket)
if \"$state\" == \"behind\":
    ok = ok and (g[0][\"step\"], g[0][\"micro\"], g[0][\"phase\"]) == ($step, 1, \"forward\")
    ok = ok and (g[0][\"at\"], g[0][\"active\"], g[0][\"what\"], g[0][\"bucket\"]) == ($prev, 0, \"all-reduce\", 0)
sys.exit(not ok)'"
check "no rank finished its steps" "! grep -q 'all steps done' '$out'"
# Zombies (ended, not yet reaped by their parent) do not count as running.
alive() { for p in $(ours); do ps -o stat= -p "$p" | grep -qv '^Z' && return 0; done; return 1; }
w=0
while alive && [ $w -lt 20 ]; do sleep 0.5; w=$((w + 1)); done
alive && for p in $(ours); do ps -o pid=,stat=,etime=,args= -p "$p"; done | sed 's/^/  left: /'
check "no rank left running 10 s after mpirun returned (waited $((w / 2)) s)" "! alive"
exit $((fails > 0))
