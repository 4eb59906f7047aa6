#!/bin/sh
# log_dir.sh - ddp-launch --log-dir under -n 2 (the mpirun path and the fork path): each rank's
# stdout and stderr land in DIR/rank.N.out and DIR/rank.N.err with that rank's lines only; rank 0's
# lines, and only those, also reach the terminal, complete even after a large burst; --print-env
# names the files; the program keeps ddp-launch's PID, its exit status and SIGTERM.
# Usage: log_dir.sh DDP_LAUNCH
launch=$1
fails=0
tmp=$(mktemp -d /tmp/ddp-log-dir.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# run NAME CMD...: runs CMD with stdout and stderr through pipes into $tmp/NAME.stdout and .stderr,
# its pid in $tmp/NAME.pid and exit status in $tmp/NAME.status. Returns when both pipes reach EOF:
# when every process holding them, the log follower included, has finished writing.
run() {
    name=$1
    shift
    { { "$@" & echo $! >"$tmp/$name.pid"; wait $!; echo $? >"$tmp/$name.status"; } 2>&1 1>&3 |
        cat >"$tmp/$name.stderr"; } 3>&1 | cat >"$tmp/$name.stdout"
}

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

# The program: 50 numbered lines on stdout and on stderr, each naming the rank; rank 1 then waits
# (up to 20 s) for rank 0's last line in the log folder $1, so that a failure of rank 1 cannot stop
# rank 0 early, and exits with $0.
# shellcheck disable=SC2016  # for the ranks' shell
prog='for i in $(seq 50); do echo "out rank=$RANK line=$i"; echo "err rank=$RANK line=$i" >&2; done
[ "$RANK" = 1 ] || exit 0
for _ in $(seq 200); do grep -qs "line=50" "$1/rank.0.err" && break; sleep 0.1; done; exit "$0"'

# check_files PATH_NAME DIR: per rank, both files hold exactly that rank's 50 lines.
check_files() {
    for r in 0 1; do
        for s in out err; do
            f=$2/rank.$r.$s
            check "$1: $f lines of rank $r" "$(grep -c "^$s rank=$r line=" "$f" 2>/dev/null)" 50
            check "$1: $f other lines" "$(grep -vc "^$s rank=$r line=" "$f" 2>/dev/null)" 0
        done
    done
}

# check_terminal PATH_NAME OUT ERR: the terminal got rank 0's lines (all 50 of each) and nothing of rank 1.
check_terminal() {
    check "$1: terminal stdout, rank 0 lines" "$(grep -c '^out rank=0 line=' "$2")" 50
    check "$1: terminal stderr, rank 0 lines" "$(grep -c '^err rank=0 line=' "$3")" 50
    check "$1: terminal, rank 1 lines" "$(cat "$2" "$3" | grep -c 'rank=1 line=')" 0
}

run mpirun "$launch" -n 2 --log-dir "$tmp/mpirun" --print-env -- sh -c "$prog" 0 "$tmp/mpirun"
check "mpirun path: exit status" "$(cat "$tmp/mpirun.status")" 0
check_files "mpirun path" "$tmp/mpirun"
check_terminal "mpirun path" "$tmp/mpirun.stdout" "$tmp/mpirun.stderr"
check "mpirun path: --print-env names rank 1's files" \
    "$(grep -c "LOGS=$tmp/mpirun/rank.1.out $tmp/mpirun/rank.1.err" "$tmp/mpirun.stdout")" 1

run fork env DDP_LOCAL_FORK=1 "$launch" -n 2 --log-dir "$tmp/fork" -- sh -c "$prog" 5 "$tmp/fork"
check "fork path: exit status of the failing rank" "$(cat "$tmp/fork.status")" 5
check_files "fork path" "$tmp/fork"
check_terminal "fork path" "$tmp/fork.stdout" "$tmp/fork.stderr"

# A burst at exit: the terminal copy of rank 0 equals its file, to the last line.
run burst "$launch" --log-dir "$tmp/burst" -- seq 200000
check "burst: exit status" "$(cat "$tmp/burst.status")" 0
cmp -s "$tmp/burst.stdout" "$tmp/burst/rank.0.out"
check "burst: terminal copy equals the file ($(wc -l <"$tmp/burst/rank.0.out") lines)" "$?" 0

# The program is ddp-launch's process (exec), so SIGTERM reaches it and its exit status comes back;
# what it prints after the signal still reaches the file and the terminal.
# shellcheck disable=SC2016
run sig "$launch" --log-dir "$tmp/sig" -- sh -c 'trap "echo got-term; exit 9" TERM; echo "pid=$$"
    while :; do sleep 0.05; done' &
for _ in $(seq 100); do grep -q '^pid=' "$tmp/sig/rank.0.out" 2>/dev/null && break; sleep 0.1; done
pid=$(cat "$tmp/sig.pid")
pids="$pid"
check "signal: the program's PID is ddp-launch's" "$(sed -n 's/^pid=//p' "$tmp/sig/rank.0.out")" "$pid"
kill -TERM "$pid"
wait
check "signal: exit status set by the program's trap" "$(cat "$tmp/sig.status")" 9
check "signal: last words in the file" "$(tail -n 1 "$tmp/sig/rank.0.out")" got-term
check "signal: last words on the terminal" "$(tail -n 1 "$tmp/sig.stdout")" got-term

out=$("$launch" --log-dir /proc/no-such-dir true 2>&1)
check "unwritable folder: exit status" "$?" 1
case $out in *"--log-dir /proc/no-such-dir: cannot create the folder"*) check "unwritable folder: message" named named ;;
    *) check "unwritable folder: message" "$out" "--log-dir /proc/no-such-dir: cannot create the folder ..." ;; esac
exit $((fails > 0))
