#!/usr/bin/env bash
# scaling.sh - a scaling study in one command: ddp-train (weak and strong scaling) and
# ddp-allreduce-bench at 1, 2, 4, ... nodes, over sweeps of bucket cap, overlap and gradient dtype;
# every configuration repeated, the median kept; a CSV of every run, a markdown table and PNG plots.
# The model is an MLP on MNIST (default) or a GPT-2 on llm.c token shards (--model gpt2).
#
# Usage: inside an allocation:  sbatch -N 4 benchmarks/scaling.sbatch [options]
#                               or, from an salloc shell: benchmarks/scaling.sh [options]
#        on the local cluster:  benchmarks/scaling.sh --local-cluster 4 --rate 1gbit [options]
# Options:
#   --build DIR          build folder with train/ddp-train, launcher/ddp-launch and
#                        benchmarks/ddp-allreduce-bench (default: build-release, else build)
#   --out DIR            results folder (default scaling-results/YYYYmmdd-HHMMSS)
#   --nodes LIST         node counts, e.g. 1,2,4 (default 1, 2, 4, ... up to the allocation)
#   --ranks-per-node N   (default: SLURM_NTASKS_PER_NODE, else 1)
#   --modes LIST         weak (fixed batch per rank) and/or strong (fixed global batch); default both
#   --model mlp|gpt2     the model (default mlp); gpt2: --layers/--heads/--channels/--seq below
#   --batch N            weak: samples (GPT: sequences of --seq tokens) per rank per step
#                        (default 64; GPT 8)
#   --global-batch N     strong: samples (GPT: sequences) per step across ranks (default batch x
#                        the most ranks); must divide by every rank count
#   --buckets LIST       bucket caps in MiB, "one" = a single bucket launched after backward
#                        (default 1,4,25,one)
#   --overlap LIST       on,off: buckets launched during backward, or all after it (default on,off;
#                        "one" runs once, it has no overlap to switch)
#   --grad-dtypes LIST   gradient all-reduce dtypes for ddp-train --grad-dtype, e.g. fp32,bf16;
#                        "default" = the trainer's default, no flag. Default: fp32,bf16 when this
#                        ddp-train has --grad-dtype, else default. Naming a dtype for a ddp-train
#                        without the flag is an error.
#   --reps N             runs per configuration, the median is kept (default 3)
#   --steps N            optimizer steps per run (default 30)
#   --widths W           MLP widths (default 784-2048-2048-2048-10: 10.0M parameters, 40 MB of
#                        gradients per step)
#   --layers N --heads N --channels N --seq T   the GPT (default 4, 4, 256, 64: 16.3M parameters,
#                        12.9M of them the 50304 x 256 token embedding; 65 MB of gradients per
#                        step; 0.7-1.1 s per step of the default 8 x 64 tokens on one AVX2 core)
#   --device cpu|cuda    (default cpu)
#   --bench-sizes A:B    all-reduce sizes for ddp-allreduce-bench -b A -e B (default 4K:64M, x4)
#   --bench-factor F     each bench size is the previous one times F (default 4)
#   --bench-idle-ms N    ddp-allreduce-bench --idle-ms N: each all-reduce timed alone after N ms of
#                        idle link, as between training steps (default 0: back to back, as
#                        nccl-tests)
#   --data DIR|PATTERN   MNIST IDX folder (default data/mnist); GPT: token shards (default
#                        'data/text/austen_train_*.bin', scripts/fetch-text.sh makes them)
#   --local-cluster N    start slurm/cluster.sh with N nodes first (root) and stop it at the end;
#   --rate R, --rate-node N=R   its link limits (see slurm/cluster.sh)
# Output in --out: runs.csv (every ddp-train run), allreduce.csv (every bench size and run),
#   table.md (medians, efficiency), throughput.png, efficiency.png, exposed.png, busbw.png
#   (benchmarks/scaling_report.py makes the last five from the CSVs; run it again to redo them).
# Efficiency = samples/s / (samples/s at the fewest ranks x ranks / those ranks), per configuration.
# GPT rows also carry tokens_per_s (samples/s x --seq), and the table shows tokens/s for them; the
# GPT's metrics have no exposed-communication figures, so its rows take them from the trace.
# Exposed communication per step = the time the step waited for its all-reduces (ddp-train --trace),
# the mean over ranks; exposed_min_ms = the least of the ranks' (the slowest rank's) wait.
# step_med_ms and exposed_min_med_ms: the steady state, medians over the steps (rank 0's step; the
# least wait of each step), without the first step's connections and set-up.
# A ddp-train run that fails is run once more (logged); a second failure ends the study.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
LOCK=/tmp/ddp-cluster-test.lock # shared with tests/cluster/run.sh and overlap.sh
RUN_TIMEOUT=900
BUILD="" OUT="" NODES_LIST="" RPN=${SLURM_NTASKS_PER_NODE:-1} MODES=weak,strong BATCH=
GLOBAL_BATCH="" BUCKETS=1,4,25,one OVERLAPS=on,off DTYPES="" REPS=3 STEPS=30
WIDTHS=784-2048-2048-2048-10 DEVICE=cpu BENCH_SIZES=4K:64M BENCH_FACTOR=4 BENCH_IDLE_MS=0 DATA=""
MODEL=mlp LAYERS=4 HEADS=4 CHANNELS=256 SEQ=64
LOCAL_NODES="" CLUSTER_ARGS=()

die() { echo "scaling: error: $*" >&2; exit 1; }
log() { echo "scaling: $*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

parse_args() {
    while (($#)); do
        case $1 in
            --build) BUILD=${2:?}; shift 2 ;;
            --out) OUT=${2:?}; shift 2 ;;
            --nodes) NODES_LIST=${2:?}; shift 2 ;;
            --ranks-per-node) RPN=${2:?}; shift 2 ;;
            --modes) MODES=${2:?}; shift 2 ;;
            --batch) BATCH=${2:?}; shift 2 ;;
            --global-batch) GLOBAL_BATCH=${2:?}; shift 2 ;;
            --buckets) BUCKETS=${2:?}; shift 2 ;;
            --overlap) OVERLAPS=${2:?}; shift 2 ;;
            --grad-dtypes) DTYPES=${2:?}; shift 2 ;;
            --reps) REPS=${2:?}; shift 2 ;;
            --steps) STEPS=${2:?}; shift 2 ;;
            --widths) WIDTHS=${2:?}; shift 2 ;;
            --model) MODEL=${2:?}; shift 2 ;;
            --layers) LAYERS=${2:?}; shift 2 ;;
            --heads) HEADS=${2:?}; shift 2 ;;
            --channels) CHANNELS=${2:?}; shift 2 ;;
            --seq) SEQ=${2:?}; shift 2 ;;
            --device) DEVICE=${2:?}; shift 2 ;;
            --bench-sizes) BENCH_SIZES=${2:?}; shift 2 ;;
            --bench-idle-ms) BENCH_IDLE_MS=${2:?}; shift 2 ;;
            --bench-factor) BENCH_FACTOR=${2:?}; shift 2 ;;
            --data) DATA=${2:?}; shift 2 ;;
            --local-cluster) LOCAL_NODES=${2:?}; shift 2 ;;
            --rate | --rate-node) CLUSTER_ARGS+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
            -h | --help) usage 0 ;;
            *) die "unknown option '$1' (try --help)" ;;
        esac
    done
}

positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 takes a positive integer (got '$2')"; }

# The model's defaults and data; MODEL_ARGS: ddp-train's model flags.
check_model() {
    [[ $MODEL == mlp || $MODEL == gpt2 ]] || die "--model: mlp or gpt2, not '$MODEL'"
    if [[ $MODEL == mlp ]]; then
        BATCH=${BATCH:-64} DATA=${DATA:-$SRC/data/mnist}
        [[ -s $DATA/train-images-idx3-ubyte ]] || die "$DATA: no MNIST files; run scripts/fetch-mnist.sh $DATA"
        MODEL_ARGS=(--model mlp --widths "$WIDTHS" --data "$DATA")
        return
    fi
    BATCH=${BATCH:-8} DATA=${DATA:-$SRC/data/text/austen_train_*.bin}
    positive --layers "$LAYERS"; positive --heads "$HEADS"; positive --channels "$CHANNELS"
    positive --seq "$SEQ"
    compgen -G "$DATA" >/dev/null || die "--data $DATA: no token shards; run scripts/fetch-text.sh data/text"
    MODEL_ARGS=(--model gpt2 --layers "$LAYERS" --heads "$HEADS" --channels "$CHANNELS" --seq "$SEQ"
        --data "$DATA" --val-max-batches 1)
}

check_args() {
    check_model
    positive --ranks-per-node "$RPN"; positive --batch "$BATCH"; positive --reps "$REPS"
    positive --steps "$STEPS"
    [[ -z $LOCAL_NODES ]] || positive --local-cluster "$LOCAL_NODES"
    [[ -z $GLOBAL_BATCH ]] || positive --global-batch "$GLOBAL_BATCH"
    local m b o
    for m in ${MODES//,/ }; do [[ $m == weak || $m == strong ]] || die "--modes: weak or strong, not '$m'"; done
    for b in ${BUCKETS//,/ }; do
        [[ $b == one || $b =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--buckets: MiB numbers or 'one', not '$b'"
    done
    for o in ${OVERLAPS//,/ }; do [[ $o == on || $o == off ]] || die "--overlap: on or off, not '$o'"; done
    [[ $BENCH_FACTOR =~ ^[0-9]+$ ]] && ((BENCH_FACTOR >= 2)) || die "--bench-factor takes an integer >= 2 (got '$BENCH_FACTOR')"
    [[ $BENCH_IDLE_MS =~ ^[0-9]+$ ]] || die "--bench-idle-ms takes milliseconds >= 0 (got '$BENCH_IDLE_MS')"
    [[ $BENCH_SIZES =~ ^[0-9]+[KMG]?:[0-9]+[KMG]?$ ]] || die "--bench-sizes takes MIN:MAX, e.g. 4K:64M"
    if [[ -z $BUILD ]]; then
        BUILD=$SRC/build-release
        [[ -d $BUILD ]] || BUILD=$SRC/build
    fi
    BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || die "build folder not found (--build DIR)"
    TRAIN=$BUILD/train/ddp-train LAUNCH=$BUILD/launcher/ddp-launch BENCH=$BUILD/benchmarks/ddp-allreduce-bench
    [[ -x $TRAIN && -x $LAUNCH && -x $BENCH ]] ||
        die "$BUILD lacks ddp-train, ddp-launch or ddp-allreduce-bench: build first (meson compile -C $BUILD)"
    local has_flag=0 d help
    # Read the whole help first: grep -q would close the pipe early and, under pipefail, fail.
    help=$("$TRAIN" --help)
    [[ $help == *--grad-dtype* ]] && has_flag=1
    if [[ -z $DTYPES ]]; then
        DTYPES=default
        ((has_flag)) && DTYPES="fp32 bf16"
    fi
    for d in $DTYPES; do
        [[ $d == default || $has_flag == 1 ]] ||
            die "--grad-dtypes $d: this ddp-train has no --grad-dtype (16-bit training is not in this" \
                "build); leave --grad-dtypes out or give 'default'"
    done
}

# The node counts: --nodes, else 1, 2, 4, ... up to the allocation (SLURM_JOB_NUM_NODES).
plan_nodes() {
    if [[ -z $NODES_LIST ]]; then
        local max=${SLURM_JOB_NUM_NODES:-1} n=1
        NODES_LIST=""
        while ((n <= max)); do NODES_LIST+="${NODES_LIST:+,}$n"; n=$((n * 2)); done
        ((max & (max - 1))) && NODES_LIST+=",$max"
    fi
    local n
    for n in ${NODES_LIST//,/ }; do positive --nodes "$n"; done
    local last=${NODES_LIST##*,}
    [[ -n $GLOBAL_BATCH ]] || GLOBAL_BATCH=$((BATCH * last * RPN))
}

start_local_cluster() {
    [[ -n $LOCAL_NODES ]] || return 0
    [[ -z ${SLURM_JOB_ID:-} ]] || die "--local-cluster inside a Slurm allocation: leave it out"
    export DDP_SLURM_BASE=${DDP_SLURM_BASE:-/tmp/ddp-slurm-scaling}
    exec 9>"$LOCK"
    flock -w 1800 9 || die "another cluster user held $LOCK for 30 min"
    trap '"$SRC/slurm/cluster.sh" stop >/dev/null 2>&1 || true' EXIT
    "$SRC/slurm/cluster.sh" start --nodes "$LOCAL_NODES" --cpus "$RPN" "${CLUSTER_ARGS[@]}" >&2 ||
        die "the local cluster did not start"
    # shellcheck source=/dev/null
    source "$DDP_SLURM_BASE/env.sh"
    [[ -n ${NODES_LIST} ]] || SLURM_JOB_NUM_NODES=$LOCAL_NODES
}

# srun N CMD...: CMD on N nodes, RPN tasks each.
run_on() {
    local n=$1
    shift
    timeout -k 10 "$RUN_TIMEOUT" srun --mpi=pmix -N "$n" --ntasks-per-node="$RPN" --kill-on-bad-exit=1 "$@"
}

# train_once MODE NODES BUCKET OVERLAP DTYPE REP: one ddp-train run; appends a row to runs.csv.
train_once() {
    local mode=$1 n=$2 bucket=$3 overlap=$4 dtype=$5 rep=$6 ranks=$(($2 * RPN)) per_rank
    per_rank=$BATCH
    if [[ $mode == strong ]]; then
        ((GLOBAL_BATCH % ranks == 0)) || die "--global-batch $GLOBAL_BATCH does not divide by $ranks ranks"
        per_rank=$((GLOBAL_BATCH / ranks))
    fi
    local tag="$mode-n$n-b$bucket-o$overlap-d$dtype-r$rep" args=()
    if [[ $bucket == one ]]; then args+=(--bucket-mb 100000 --first-bucket-mb 100000)
    else args+=(--bucket-mb "$bucket" --first-bucket-mb "$(awk -v b="$bucket" 'BEGIN { print (b < 1 ? b : 1) }')"); fi
    [[ $overlap == on ]] || args+=(--no-overlap)
    [[ $dtype == default ]] || args+=(--grad-dtype "$dtype")
    local log="$OUT/logs/$tag.log" metrics="$OUT/logs/$tag.jsonl" trace="$OUT/logs/$tag.trace.json" try
    for try in 1 2; do
        run_on "$n" "$LAUNCH" "$TRAIN" "${MODEL_ARGS[@]}" --device "$DEVICE" \
            --batch "$per_rank" --epochs 1000 --max-steps "$STEPS" --threads 1 --log-every 100000 \
            --trace "$trace" --metrics "$metrics" "${args[@]}" >"$log" 2>&1 && break
        tail -n 15 "$log" >&2
        # A job that failed once is run once more (logged): on a shared machine Open MPI's TCP
        # start-up has failed now and then; a second failure ends the study.
        ((try == 1)) || die "ddp-train failed twice ($tag); log: $log"
        log "ddp-train failed ($tag, log above); running it once more"
        mv "$log" "$log.failed"
    done
    python3 - "$metrics" "$trace" "$MODEL,$mode,$n,$RPN,$ranks,$per_rank,$((per_rank * ranks)),$bucket,$overlap,$dtype,$rep" "$SEQ" \
        >>"$OUT/runs.csv" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().splitlines()[-1])
step_ms = 1000.0 * s["train_seconds"] / max(s["steps"], 1)
f = lambda v: "" if v is None else f"{v:.3f}"
# The slowest rank's wait per step: the others also waited for it (load imbalance), it waited for
# the all-reduces alone. Means over the steps, and the steady state: medians over the steps (the
# first step also makes connections and oneDNN primitives) of rank 0's step and of the least wait.
spans = {}  # (name, rank) -> [durations in ms, in step order]
begin = {}
for e in json.load(open(sys.argv[2]))["traceEvents"]:
    # rank rows: the step and its wait on the main row, the all-reduces on the communicator's
    if (e["name"] in ("reducer.wait", "step") and e["tid"] == 0 or e["name"] == "allreduce") \
            and e["ph"] in "BE":
        key = (e["name"], e["pid"])
        if e["ph"] == "B":
            begin[key] = e["ts"]
        elif key in begin:
            spans.setdefault(key, []).append((e["ts"] - begin.pop(key)) / 1000.0)
waits = [v for (name, _), v in spans.items() if name == "reducer.wait" and v]
least = min((sum(v) / len(v) for v in waits), default=None)
median = lambda v: sorted(v)[len(v) // 2] if v else None
n_steps = min((len(v) for v in waits), default=0)
least_med = median([min(v[k] for v in waits) for k in range(n_steps)]) if n_steps else None
step_med = median(spans.get(("step", 0), []))
tokens = ""
if s.get("model") == "gpt2":  # throughput in tokens; the communication figures from the trace
    tokens = f'{s["tokens_per_s"]:.1f}'
    s["samples_per_s"] = s["tokens_per_s"] / int(sys.argv[4])
    ranks = [p for (name, p) in spans if name == "reducer.wait"]
    steps = max(s["steps"], 1)
    exposed = [sum(spans[("reducer.wait", p)]) / steps for p in ranks]
    comm = [sum(spans.get(("allreduce", p), [])) / steps for p in ranks]
    s["exposed_comm_ms"] = sum(exposed) / len(exposed) if ranks else None
    s["comm_ms"] = sum(comm) / len(comm) if ranks else None
    s["hidden_fraction"] = (max(0.0, 1 - s["exposed_comm_ms"] / s["comm_ms"])
                            if ranks and s["world_size"] > 1 and s["comm_ms"] > 0 else (0.0 if ranks else None))
print(f'{sys.argv[3]},{s["samples_per_s"]:.1f},{tokens},{step_ms:.3f},{f(s["exposed_comm_ms"])},'
      f'{f(s["comm_ms"])},{f(s["hidden_fraction"])},{f(least)},{f(step_med)},{f(least_med)}')
PY
    log "$tag: $(tail -n 1 "$OUT/runs.csv" | cut -d, -f12-)"
}

# bench_once NODES REP: ddp-allreduce-bench over the sizes; appends rows to allreduce.csv.
bench_once() {
    local n=$1 rep=$2 log="$OUT/logs/allreduce-n$1-r$2.log"
    run_on "$n" "$BENCH" --device "$DEVICE" -b "${BENCH_SIZES%%:*}" -e "${BENCH_SIZES##*:}" -f "$BENCH_FACTOR" -n 5 -w 2 \
        --idle-ms "$BENCH_IDLE_MS" >"$log" 2>&1 || { tail -n 15 "$log" >&2; die "ddp-allreduce-bench failed on $n nodes; log: $log"; }
    awk -v n="$n" -v rpn="$RPN" -v rep="$rep" -v idle="$BENCH_IDLE_MS" '$1 ~ /^[0-9]+$/ && NF >= 8 {
        printf "%d,%d,%d,%d,%s,%s,%s,%s,%s,%s\n", n, rpn, n * rpn, rep, $1, $5, $6, $7, $8, idle }' "$log" \
        >>"$OUT/allreduce.csv"
}

# The sweep: every (mode, nodes, bucket, overlap, dtype), REPS times, interleaved by repetition.
sweep() {
    local rep mode n b o d
    echo "model,mode,nodes,ranks_per_node,ranks,batch_per_rank,global_batch,bucket_mb,overlap,grad_dtype,rep,samples_per_s,tokens_per_s,step_ms,exposed_comm_ms,comm_ms,hidden_fraction,exposed_min_ms,step_med_ms,exposed_min_med_ms" >"$OUT/runs.csv"
    echo "nodes,ranks_per_node,ranks,rep,size_bytes,time_us,algbw_gbs,busbw_gbs,wrong,idle_ms" >"$OUT/allreduce.csv"
    for ((rep = 1; rep <= REPS; rep++)); do
        for n in ${NODES_LIST//,/ }; do
            bench_once "$n" "$rep"
            for mode in ${MODES//,/ }; do
                for b in ${BUCKETS//,/ }; do
                    for o in ${OVERLAPS//,/ }; do
                        [[ $b == one && $o == off && $OVERLAPS == *on* ]] && continue
                        for d in $DTYPES; do train_once "$mode" "$n" "$b" "$o" "$d" "$rep"; done
                    done
                done
            done
        done
    done
}

model_text() {
    if [[ $MODEL == mlp ]]; then echo "MLP $WIDTHS"
    else echo "GPT-2 L $LAYERS, heads $HEADS, channels $CHANNELS, seq $SEQ"; fi
}

main() {
    parse_args "$@"
    DTYPES=${DTYPES//,/ }
    check_args
    start_local_cluster
    plan_nodes
    command -v srun >/dev/null || die "srun not found: run inside a Slurm allocation (sbatch/salloc) or with --local-cluster N"
    OUT=${OUT:-$SRC/scaling-results/$(date +%Y%m%d-%H%M%S)}
    mkdir -p "$OUT/logs"
    log "nodes $NODES_LIST x $RPN rank(s); modes $MODES; buckets $BUCKETS; overlap $OVERLAPS;" \
        "dtypes ${DTYPES:-default}; $REPS reps of $STEPS steps; $(model_text); $(nproc) cores here"
    sweep
    python3 "$SRC/benchmarks/scaling_report.py" "$OUT" --note "$(nproc) cores on $(hostname -s); load $(cut -d' ' -f1-3 /proc/loadavg)"
    log "results in $OUT (runs.csv, allreduce.csv, table.md, *.png)"
}

main "$@"
