#!/bin/sh
# local_ranks.sh - ddp-launch -n N on this node: through mpirun every PROGRAM argument arrives; in
# the fork path SIGUSR1 reaches every rank (Slurm's --signal warning) and the job goes on; with
# --print-env, ranks that never report are named, and only those; torchrun's --nproc-per-node N
# (also --nproc_per_node) starts N ranks without -n; a mistyped option is named once with the
# nearest one. Usage: local_ranks.sh DDP_LAUNCH
launch=$1
fails=0
tmp=$(mktemp -d /tmp/ddp-local-ranks.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

# shellcheck disable=SC2016,SC2046  # $# is for the ranks' shell; seq gives the arguments
got=$("$launch" -n 2 -- sh -c 'echo "$#"' sh $(seq 1500) | sort -u)
check "mpirun path: 1500 arguments reach each rank" "$got" 1500

# shellcheck disable=SC2016
DDP_LOCAL_FORK=1 "$launch" -n 2 -- sh -c \
    'trap "echo usr1 \$RANK >>$0/usr1; exit 0" USR1; echo >"$0/up.$RANK"; for _ in $(seq 100); do sleep 0.1; done' "$tmp" &
pid=$!
for _ in $(seq 100); do [ -e "$tmp/up.0" ] && [ -e "$tmp/up.1" ] && break; sleep 0.1; done
kill -USR1 "$pid"
( sleep 10; kill -KILL "$pid" ) >/dev/null 2>&1 &
watchdog=$!
wait "$pid"
check "fork path: exit status after SIGUSR1" "$?" 0
kill "$watchdog" 2>/dev/null
check "fork path: ranks that got SIGUSR1" "$(sort "$tmp/usr1" 2>/dev/null | paste -sd' ')" "usr1 0 usr1 1"

# shellcheck disable=SC2016
got=$("$launch" --nproc-per-node 3 -- sh -c 'echo "$RANK/$WORLD_SIZE"' | sort | paste -sd' ')
check "--nproc-per-node 3 without -n: three ranks" "$got" "0/3 1/3 2/3"
# shellcheck disable=SC2016
got=$("$launch" --nproc_per_node 2 -- sh -c 'echo "$LOCAL_WORLD_SIZE"' | sort -u)
check "--nproc_per_node (torchrun's spelling)" "$got" 2
out=$("$launch" --nprocs-per-nod 2 -- true 2>&1); rc=$?
check "a mistyped option: exit status" "$rc" 2
check "a mistyped option: the nearest named" "$out" \
    "ddp-launch: unknown option '--nprocs-per-nod'; did you mean --nproc-per-node? (see ddp-launch --help)"
out=$("$launch" -n 2 --nproc-per-node 3 -- true 2>&1); rc=$?
check "-n 2 against --nproc-per-node 3: refused" "$rc" 1
check "-n 2 against --nproc-per-node 3: both named" \
    "$(printf '%s\n' "$out" | grep -c -- '-n 2 starts 2 ranks on this node but --nproc-per-node says 3')" 1

out=$(env -i PATH="$PATH" RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 DDP_PRINT_TIMEOUT=0.3 \
    DDP_PRINT_DIR="$tmp/print" "$launch" --dry-run 2>&1)
check "--print-env: missing ranks named" "$(printf '%s\n' "$out" | sed -n 's/^ *rank \([0-9]*\) missing.*/\1/p' | paste -sd' ')" "1 2"
exit $((fails > 0))
