#!/bin/sh
# bind_process.sh - test 7 on this machine: ranks started by ddp-launch -n 2 (mpirun and fork
# paths) are bound to disjoint CPU sets covering the allowed CPUs; a binding made with taskset is
# kept unless --bind=force; --bind=none leaves it. Usage: bind_process.sh DDP_LAUNCH
launch=$1
fails=0
all=$(sed -n 's/Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)   # the CPUs we may use, e.g. 0-1
first=$(printf '%s' "$all" | sed 's/[-,].*//')
report='echo "$RANK $DDP_CPUSET $(sed -n "s/Cpus_allowed_list:[[:space:]]*//p" /proc/self/status) $OMP_NUM_THREADS"'

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

# cover OUTPUT: the union of the ranks' actual CPU lists, and whether any two overlap.
cover() {
    printf '%s\n' "$1" | awk '{ n = split($3, parts, ","); for (i = 1; i <= n; i++) {
        m = split(parts[i], r, "-"); hi = (m == 2) ? r[2] : r[1];
        for (c = r[1]; c <= hi; c++) { if (c in seen) dup = 1; seen[c] = 1 } } }
        END { print (dup ? "overlap" : "disjoint") }'
}

ncpu=$(taskset -c "$all" nproc)
if [ "$ncpu" -ge 2 ]; then
    for mode in mpirun fork; do
        if [ $mode = fork ]; then export DDP_LOCAL_FORK=1; fi
        out=$("$launch" -n 2 -- sh -c "$report" | sort)
        unset DDP_LOCAL_FORK
        check "$mode: two ranks reported" "$(printf '%s\n' "$out" | wc -l)" 2
        check "$mode: actual bindings" "$(cover "$out")" disjoint
        check "$mode: DDP_CPUSET is the actual binding" "$(printf '%s\n' "$out" | awk '$2 != $3' | wc -l)" 0
        if [ $mode = fork ]; then export DDP_LOCAL_FORK=1; fi
        unbound=$("$launch" -n 2 --bind=none -- sh -c "$report" | awk '{ print $3 }' | sort -u)
        check "$mode: --bind=none leaves both ranks unbound" "$unbound" "$all"
        unset DDP_LOCAL_FORK
        total=$(printf '%s\n' "$out" | awk '{ print $3 }' | paste -sd, | tr ',' '\n' | wc -l)
        check "$mode: one core each on a 2-CPU machine" "$(printf '%s\n' "$out" | awk '{ print $4 }' | sort -u)" 1
        [ "$ncpu" -eq 2 ] && check "$mode: two CPU lists cover both CPUs" "$total" 2
    done
fi
out=$(taskset -c "$first" "$launch" -- sh -c "$report")
check "taskset binding kept" "$(echo "$out" | awk '{ print $2 " " $3 }')" "$first $first"
out=$(taskset -c "$first" "$launch" --bind=force -- sh -c "$report")
check "--bind=force replaces it" "$(echo "$out" | awk '{ print $2 " " $3 }')" "$all $all"
out=$(taskset -c "$first" "$launch" --bind=none -- sh -c "$report")
check "--bind=none leaves it" "$(echo "$out" | awk '{ print $3 }')" "$first"
exit $((fails > 0))
