#!/bin/sh
# desync.sh - ranks that call different collectives (desync-calls, desync_calls.c) end the job
# with an error naming both ranks, their hosts, the sequence number and both calls: within
# LIMIT s, non-zero exit, the mismatched call never returns, no rank left running. DDP_TIMEOUT=20:
# without the check the job would hang until that deadline (or the call would return), too late.
# Modes (the program's, see desync_calls.c):
# size     2 ranks, all-reduce of 1000 vs 999 floats; run twice, after 1 and after 4 warm-up
#          all-reduces: the second names a sequence number 3 higher (it counts collectives)
# op       3 ranks, the last one's all-reduce a max: rank 0 and rank 2 named, "1 of 3 ranks"
# dtype    2 ranks, host all-reduce of fp32 vs fp64
# async    2 ranks, sizes differ on the communication thread (ddp_allreduce_start)
# kind     2 ranks, all-reduce vs broadcast
# equal    3 ranks, every kind of collective alike: all pass with correct results, exit 0
# env      2 ranks, DDP_DESYNC_CHECK=0 on rank 0 only, then =yes everywhere: ddp_init fails on
#          every rank, naming the variable
# The check is on unless DDP_DESYNC_CHECK says otherwise in the caller's environment: run with
# DDP_DESYNC_CHECK=0 to see the mismatch modes fail.
# Usage: desync.sh MODE PROGRAM MPIRUN [MPIRUN_ARGS...] -np N
set -u
mode=$1 prog=$2
shift 2
limit=10
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fails=0
check() { if eval "$2"; then echo "ok     $1"; else echo "FAILED $1"; fails=$((fails + 1)); fi; }

# run MODE BEFORE: runs the job into $out; sets rc and took.
run() {
    start=$(date +%s)
    DDP_TIMEOUT=20 timeout -k 5 60 "$@" -x DDP_TIMEOUT -x DDP_DESYNC_CHECK "$prog" "$run_mode" \
        "$run_before" >"$out" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    sed 's/^/  | /' "$out"
}

# The job ended quickly, non-zero, and the mismatched call never returned.
ended() {
    check "the job ended within $limit s (took ${took} s)" "[ $took -le $limit ]"
    check "exit status non-zero ($rc)" "[ $rc -ne 0 ]"
    check "no mismatched call returned" "! grep -q 'desynced call returned' '$out'"
}

# named RANK_B CALL_A CALL_B LANE: the error line names both ranks with hosts and calls.
named() {
    pat="desync at collective #[0-9]* on the $4 lane: rank 0 (host [^)]*) called $2, rank $1 (host [^)]*) called $3\$"
    check "the error names rank 0 ($2) and rank $1 ($3) on the $4 lane" "grep -q \"\$pat\" '$out'"
}

seq_of() { sed -n 's/.*desync at collective #\([0-9]*\) .*/\1/p' "$out" | head -1; }

[ -n "${DDP_DESYNC_CHECK+x}" ] || export DDP_DESYNC_CHECK=
run_before=2 run_mode=$mode
case $mode in
size)
    run_before=1
    run "$@"
    ended
    named 1 'all-reduce of 1000 fp32 (sum)' 'all-reduce of 999 fp32 (sum)' caller
    check "1 of 2 ranks differ" "grep -q '1 of 2 ranks called another collective' '$out'"
    first=$(seq_of)
    run_before=4
    run "$@"
    ended
    second=$(seq_of)
    check "3 more collectives before it: sequence number $first + 3 (got ${second:-none})" \
        "[ -n '$first' ] && [ -n '$second' ] && [ \$(($first + 3)) -eq $second ]" ;;
op)
    run "$@"
    ended
    named 2 'all-reduce of 1000 fp32 (sum)' 'all-reduce of 1000 fp32 (max)' caller
    check "1 of 3 ranks differ" "grep -q '1 of 3 ranks called another collective' '$out'" ;;
dtype)
    run "$@"
    ended
    named 1 'all-reduce of 1000 fp32 (sum)' 'all-reduce of 1000 fp64 (sum)' caller ;;
async)
    run "$@"
    ended
    named 1 'all-reduce of 1000 fp32 (sum)' 'all-reduce of 999 fp32 (sum)' "communication thread's" ;;
kind)
    run "$@"
    ended
    named 1 'all-reduce of 1000 fp32 (sum)' 'broadcast of 4000 bytes from rank 0' caller ;;
equal)
    run "$@"
    check "exit status 0 ($rc)" "[ $rc -eq 0 ]"
    check "every rank passed every collective" "[ \$(grep -c 'all collectives passed' '$out') -eq 3 ]"
    check "no desync reported" "! grep -qi desync '$out'" ;;
env)
    # Every rank's own line: mpirun must not kill one rank for another's exit before it prints
    # (it did, once in 5 runs). Without that kill mpirun exits 0 whatever the ranks' codes, so
    # each rank's line, printed just before its exit 2, is what says that it failed.
    export OMPI_MCA_orte_abort_on_non_zero_status=0
    run_mode=mixed
    run "$@"
    check "mixed: ended within $limit s (took ${took} s)" "[ $took -le $limit ]"
    check "mixed: ddp_init failed on both ranks" "[ \$(grep -c 'ddp_init failed: invalid or inconsistent environment' '$out') -eq 2 ]"
    check "mixed: the message names the ranks and the fix" \
        "grep -q 'DDP_DESYNC_CHECK differs between ranks: on for rank 1, 0 for rank 0; .*same value' '$out'"
    run_mode=equal
    DDP_DESYNC_CHECK=yes
    run "$@"
    check "yes: ddp_init failed on both ranks" "[ \$(grep -c 'ddp_init failed: invalid or inconsistent environment' '$out') -eq 2 ]"
    check "yes: the message names the value and the choices" "grep -q \"DDP_DESYNC_CHECK='yes' is not 0 or 1\" '$out'" ;;
*) echo "usage: desync.sh size|op|dtype|async|kind|equal|env PROGRAM MPIRUN ..." >&2; exit 2 ;;
esac
# Zombies do not count as running; wait up to 10 s for a rank that mpirun killed to end.
alive() { ps -C desync-calls -o stat= | grep -qv '^Z'; }
n=0
while alive && [ $n -lt 20 ]; do sleep 0.5; n=$((n + 1)); done
check "no rank left running (waited $((n / 2)) s)" "! alive"
exit $((fails > 0))
