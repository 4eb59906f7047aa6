#!/usr/bin/env bash
# overlap.sh - does the reducer hide gradient communication behind the backward pass? Trains a ~10M-
# parameter MLP (40 MB of gradients a step) on a local 2-node Slurm cluster with rate-limited links.
#
# Usage: benchmarks/overlap.sh [--rate R|none] [--build DIR] [--data DIR] [--batch N] [--steps N]
#                              [--reps N]
#   --rate R    link limit for `slurm/cluster.sh start --rate R` (default 1gbit); none = unlimited
#   --build DIR build folder with train/ddp-train and launcher/ddp-launch (default build)
#   --data DIR  MNIST IDX folder (default data/mnist; scripts/fetch-mnist.sh fills it)
#   --batch N   samples per rank per step (default 256), --steps N steps per run (default 30),
#   --reps N    runs per configuration, interleaved; the median step time is reported (default 3)
# Configurations, all with --widths 784-2048-2048-2048-10 --threads 1 --device cpu:
#   compute     1 rank alone (srun -N1 -n1): the compute time of a step, no communication
#   overlap     2 nodes x 1 rank, --bucket-mb 4 --first-bucket-mb 1: buckets launched during backward
#   default     2 nodes x 1 rank, default caps (25 MiB, first 1 MiB)
#   no-overlap  2 nodes x 1 rank, caps of 1000 MiB: one bucket, launched when backward ends
# step time = batch x ranks / samples_per_s of the --metrics summary line (training steps only).
# exposed = step - step(compute): communication not hidden. hidden = 1 - exposed / exposed(no-overlap).
# Takes the cluster tests' lock (one cluster per machine) and stops its cluster on exit.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
export DDP_SLURM_BASE=${DDP_SLURM_BASE:-/tmp/ddp-slurm-bench}
CLUSTER="$SRC/slurm/cluster.sh"
LOCK=/tmp/ddp-cluster-test.lock   # shared with tests/cluster/run.sh
WIDTHS=784-2048-2048-2048-10
RUN_TIMEOUT=600                   # seconds one srun may take
RATE=1gbit
BUILD=build
DATA=$SRC/data/mnist
BATCH=256
STEPS=30
REPS=3
WORK=""
# name, ranks, --bucket-mb, --first-bucket-mb (compute: one bucket, a no-op all-reduce on 1 rank)
CONFIGS=("compute 1 1000 1000" "overlap 2 4 1" "default 2 25 1" "no-overlap 2 1000 1000")

die() { echo "overlap: error: $*" >&2; exit 1; }
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

parse_args() {
    while (($#)); do
        case $1 in
            --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
            --build) BUILD=${2:?--build needs a folder}; shift 2 ;;
            --data) DATA=${2:?--data needs a folder}; shift 2 ;;
            --batch) BATCH=${2:?--batch needs a number}; shift 2 ;;
            --steps) STEPS=${2:?--steps needs a number}; shift 2 ;;
            --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
            -h | --help) usage 0 ;;
            *) die "unknown option '$1' (try --help)" ;;
        esac
    done
    local n
    for n in "$BATCH" "$STEPS" "$REPS"; do
        [[ $n =~ ^[1-9][0-9]*$ ]] || die "--batch, --steps and --reps take positive numbers"
    done
    BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || die "build folder not found"
    [[ -x $BUILD/train/ddp-train && -x $BUILD/launcher/ddp-launch ]] ||
        die "$BUILD has no train/ddp-train or launcher/ddp-launch: build first (ninja -C $BUILD)"
    [[ -s $DATA/train-images-idx3-ubyte ]] ||
        die "$DATA: no MNIST files; run scripts/fetch-mnist.sh $DATA"
}

# n_buckets CAP_MB FIRST_CAP_MB: buckets the reducer plans for the MLP (parameters W(in, out), b(out)
# per layer, filled in reverse order; a parameter over the cap gets a bucket of its own).
n_buckets() {
    awk -v widths="$WIDTHS" -v cap="$1" -v first="$2" 'BEGIN {
        nw = split(widths, w, "-"); np = 0
        for (l = 1; l < nw; l++) { numel[++np] = w[l] * w[l + 1]; numel[++np] = w[l + 1] }
        mib = 1024 * 1024; nb = 0; p = np
        while (p >= 1) {
            c = (nb == 0 ? first : cap) * mib; n = numel[p--]
            while (p >= 1 && (n + numel[p]) * 4 <= c) n += numel[p--]
            nb++
        }
        print nb
    }'
}

# run_one NAME RANKS CAP FIRST REP: one training run; prints its step time in ms.
run_one() {
    local name=$1 ranks=$2 out="$WORK/$1.$5" sps
    timeout -k 10 "$RUN_TIMEOUT" srun --mpi=pmix -N "$ranks" --ntasks-per-node=1 \
        "$BUILD/launcher/ddp-launch" "$BUILD/train/ddp-train" --model mlp --widths "$WIDTHS" \
        --data "$DATA" --batch "$BATCH" --threads 1 --device cpu --epochs 1000 --max-steps "$STEPS" \
        --bucket-mb "$3" --first-bucket-mb "$4" --log-every 100000 --metrics "$out.jsonl" \
        >"$out.log" 2>&1 || { tail -n 20 "$out.log" >&2; die "$name run $5 failed (log above)"; }
    sps=$(tail -n 1 "$out.jsonl" | sed -n 's/.*"summary":true.*"samples_per_s":\([0-9.]*\).*/\1/p')
    [[ -n $sps ]] || die "$name run $5: no summary line in $out.jsonl"
    awk -v b="$BATCH" -v r="$ranks" -v s="$sps" 'BEGIN { printf "%.1f\n", 1000 * b * r / s }'
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

start_cluster() {
    local rate=()
    [[ $RATE == none ]] || rate=(--rate "$RATE")
    "$CLUSTER" start --nodes 2 --cpus 4 "${rate[@]}" >"$WORK/start.out" 2>&1 ||
        { cat "$WORK/start.out" >&2; die "the Slurm cluster did not start"; }
    # shellcheck source=/dev/null
    source "$DDP_SLURM_BASE/env.sh"
}

cleanup() {
    "$CLUSTER" stop >/dev/null 2>&1 || echo "overlap: warning: could not stop the cluster" >&2
    [[ -z $WORK ]] || rm -rf "$WORK"
}

# Runs every configuration REPS times, interleaved (rep 1 of each, then rep 2, ...), so that slow
# drift of the machine spreads over all of them; fills STEP_MS[name] with the median.
declare -A STEP_MS RUNS
measure() {
    local rep c name ranks cap first ms
    for ((rep = 1; rep <= REPS; rep++)); do
        for c in "${CONFIGS[@]}"; do
            read -r name ranks cap first <<<"$c"
            ms=$(run_one "$name" "$ranks" "$cap" "$first" "$rep")
            RUNS[$name]="${RUNS[$name]:-}${RUNS[$name]:+ }$ms"
            echo "overlap: $name run $rep: $ms ms/step" >&2
        done
    done
    for c in "${CONFIGS[@]}"; do
        read -r name _ <<<"$c"
        # shellcheck disable=SC2086  # the runs are a space-separated list of numbers
        STEP_MS[$name]=$(median ${RUNS[$name]})
    done
}

report() {
    local c name ranks cap first comp=${STEP_MS[compute]} exposed_no
    exposed_no=$(awk -v s="${STEP_MS[no-overlap]}" -v c="$comp" 'BEGIN { print s - c }')
    printf "%-10s %5s %7s %9s %9s %12s %7s  %s\n" config ranks buckets samples/s "step(ms)" \
        "exposed(ms)" hidden "runs (ms/step)"
    for c in "${CONFIGS[@]}"; do
        read -r name ranks cap first <<<"$c"
        awk -v n="$name" -v r="$ranks" -v nb="$(n_buckets "$cap" "$first")" -v s="${STEP_MS[$name]}" \
            -v c="$comp" -v en="$exposed_no" -v b="$BATCH" -v runs="${RUNS[$name]}" 'BEGIN {
            if (n == "compute") { e = "-"; h = "-" }
            else { e = sprintf("%.1f", s - c); h = en > 0 ? sprintf("%.0f%%", 100 * (1 - (s - c) / en)) : "n/a" }
            printf "%-10s %5d %7d %9.1f %9.1f %12s %7s  %s\n", n, r, nb, 1000 * b * r / s, s, e, h, runs
        }'
    done
    echo "(rate ${RATE}; batch $BATCH per rank, $STEPS steps, median of $REPS runs; $WIDTHS =" \
        "$(awk -v w="$WIDTHS" 'BEGIN { n = split(w, x, "-"); for (l = 1; l < n; l++) p += x[l] * x[l + 1] + x[l + 1]; printf "%d", p }')" \
        "parameters; $(nproc) cores)"
    echo "exposed = step - step(compute); hidden = 1 - exposed / exposed(no-overlap)"
}

main() {
    parse_args "$@"
    exec 9>"$LOCK"
    flock -w 1800 9 || die "another cluster user held $LOCK for 30 min"
    WORK=$(mktemp -d /tmp/ddp-overlap.XXXXXX)
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    start_cluster
    measure
    report
}

main "$@"
