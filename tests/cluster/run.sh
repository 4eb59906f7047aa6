#!/usr/bin/env bash
# run.sh - real-Slurm-cluster tests of ddp-launch and ddp-train: starts a local 2-node cluster
# (slurm/cluster.sh), runs the chosen cases against it, reports each case PASS/FAIL with its time,
# and always stops the cluster. Exit 0 only when every case passed.
#
# Usage: tests/cluster/run.sh --launch PATH --train PATH [--mpi-default none|pmix] [CASE...]
#   (no CASE: all of them; --mpi-default: slurm.conf's MpiDefault, as cluster.sh takes it)
# Cases: print-env gpu-bind srun-pmix-train mpirun-sbatch-train mpirun-map-by-node templates
#   torch-allreduce pmi-trap requeue requeue-folder srun-sigterm log-dir kill-rank partition
#   elastic-nodes (templates needs --mpi-default none; templates and elastic-nodes get 3 nodes,
#   the others 2)
# Environment: DDP_TEST_SRCDIR (source tree; default: two levels up), DDP_SLURM_BASE (cluster state,
#   default /tmp/ddp-slurm-test). Only one cluster can run per machine (the network names are fixed):
#   concurrent runs queue on a lock, and a cluster left running by hand is stopped first.
set -euo pipefail

SRC=${DDP_TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DDP_SLURM_BASE=${DDP_SLURM_BASE:-/tmp/ddp-slurm-test}
CLUSTER="$SRC/slurm/cluster.sh"
DATA="$SRC/data/mnist"
# MLP, 4 epochs, 4 ranks x 64 samples, lr 0.1 on the 8,000-image set: test accuracy 0.93-0.94
# (2 epochs at lr 0.05 give only 0.91: too close to the bar).
TRAIN_ARGS=(--model mlp --epochs 4 --batch 64 --lr 0.1 --device auto)
MIN_ACC=0.90
JOB_TIMEOUT=420       # seconds any one srun or batch job may take
ALL_CASES=(print-env gpu-bind srun-pmix-train mpirun-sbatch-train mpirun-map-by-node templates
    torch-allreduce pmi-trap requeue requeue-folder srun-sigterm log-dir kill-rank partition
    elastic-nodes)
LAUNCH=""
TRAIN=""
WORK=""
MPI_DEFAULT=pmix

log() { echo "cluster-test: $*"; }
# fail MESSAGE: ends the current case (each case runs in a subshell) as failed.
fail() { echo "  FAIL: $*"; exit 1; }
now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# run_to FILE TIMEOUT CMD...: run CMD with a time limit, stdout+stderr to FILE; returns its status.
run_to() {
    local out=$1 limit=$2
    shift 2
    echo "  \$ $*" >"$out"
    timeout -k 10 "$limit" "$@" >>"$out" 2>&1
}

show_tail() { echo "  --- last lines of $1:"; tail -n "${2:-25}" "$1" | sed 's/^/  | /'; }

# check_metrics FILE WORLD: the last JSON line of FILE has world_size WORLD and
# test_accuracy >= MIN_ACC.
check_metrics() {
    [[ -s $1 ]] || fail "no metrics written to $1"
    python3 - "$1" "$2" "$MIN_ACC" <<'PY' || fail "metrics check failed for $1"
import json, sys
path, world, min_acc = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
lines = [l for l in open(path) if l.strip()]
last = json.loads(lines[-1])
ws = last.get("world_size")
if "val_loss" in last:  # the GPT: a finite validation loss below a uniform guess's ln(50257) = 10.8
    loss = last["val_loss"]
    print(f"  metrics: val_loss={loss} world_size={ws} ({len(lines)} lines)")
    ok = isinstance(loss, (int, float)) and 0 < loss < 10.9 and ws == world
else:
    acc = last.get("test_accuracy")
    print(f"  metrics: test_accuracy={acc} world_size={ws} ({len(lines)} lines)")
    ok = isinstance(acc, (int, float)) and acc >= min_acc and ws == world
if not ok:
    print(f"  want test_accuracy >= {min_acc} (val_loss < 10.9 for the GPT) and world_size == {world}")
sys.exit(0 if ok else 1)
PY
}

# wait_job ID LIMIT: poll `scontrol show job` until the job ends; succeed only on COMPLETED
# with exit code 0:0. Cancels the job after LIMIT seconds.
wait_job() {
    local id=$1 limit=$2 t0=$SECONDS info state
    while true; do
        info=$(scontrol show job -o "$id" 2>&1 || true)
        state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
        case $state in
            COMPLETED) grep -q 'ExitCode=0:0' <<<"$info" && return 0
                echo "  job $id completed with $(grep -o 'ExitCode=[0-9:]*' <<<"$info")"; return 1 ;;
            FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
                echo "  job $id ended $state ($(grep -o 'Reason=[^ ]*' <<<"$info"))"; return 1 ;;
        esac
        if ((SECONDS - t0 > limit)); then
            echo "  job $id still $state after ${limit}s; cancelling"
            scancel "$id" || true
            return 1
        fi
        sleep 0.5
    done
}

# submit NAME OUTFILE SBATCH-ARGS...: submit a batch job and wait for it; prints its id.
submit() {
    local name=$1 out=$2 id
    shift 2
    id=$(sbatch --parsable --job-name="$name" --output="$out" "$@") || fail "sbatch $* refused"
    id=${id%%;*}
    echo "  submitted $name as job $id"
    wait_job "$id" "$JOB_TIMEOUT" || { show_tail "$out" 40; fail "batch job $name ($id) did not complete"; }
}

# --- cases -----------------------------------------------------------------------------------------

# ddp-launch --print-env under srun -N2 --ntasks-per-node=2, running `env` as the program: every
# task's exported RANK, LOCAL_RANK, NODE_RANK, sizes and MASTER_ADDR follow from Slurm's block
# distribution and the host the task really ran on; rank 0's table names both nodes.
case_print_env() {
    local out=$WORK/print-env.out
    # shellcheck disable=SC2016  # $(hostname) is for the task's shell
    run_to "$out" 60 srun -N2 --ntasks-per-node=2 --label "$LAUNCH" --print-env \
        sh -c 'env; echo "TASK_HOST=$(hostname)"' ||
        { show_tail "$out"; fail "srun ... ddp-launch --print-env exited non-zero"; }
    python3 - "$out" <<'PY' || { show_tail "$out" 80; fail "wrong environment"; }
import re, sys
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TASK_HOST")
env, table = {}, []
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\d+): ([A-Z_]+)=(.*)$", line)
    if m:
        env.setdefault(int(m[1]), {})[m[2]] = m[3]
    elif line.startswith("0: "):
        table.append(line)
errors = []
if sorted(env) != [0, 1, 2, 3]:
    errors.append(f"environment from tasks {sorted(env)}, want 0-3")
for task, e in sorted(env.items()):
    want = {"RANK": task, "WORLD_SIZE": 4, "LOCAL_RANK": task % 2, "LOCAL_WORLD_SIZE": 2,
            "NODE_RANK": task // 2, "DDP_RANK": task, "DDP_NODE_RANK": task // 2, "DDP_NNODES": 2,
            "TASK_HOST": f"node{task // 2 + 1}"}
    for k, v in want.items():
        if e.get(k) != str(v):
            errors.append(f"task {task}: {k}={e.get(k)}, want {v}")
    print(f"  task {task}: " + " ".join(f"{k}={e.get(k)}" for k in keys))
addrs = {e.get("MASTER_ADDR") for e in env.values()}
ports = {e.get("MASTER_PORT") for e in env.values()}
if len(addrs) != 1 or not addrs <= {"node1", "10.200.0.11"}:
    errors.append(f"MASTER_ADDR {addrs}, want node1 (10.200.0.11) on every task")
if len(ports) != 1 or not all(p and p.isdigit() and 0 < int(p) < 65536 for p in ports):
    errors.append(f"MASTER_PORT {ports}, want one valid port on every task")
text = "".join(table)
if "node1" not in text or "node2" not in text:
    errors.append("rank 0's --print-env table does not name node1 and node2")
for e in errors:
    print("  " + e)
sys.exit(1 if errors else 0)
PY
}

# srun --gpus-per-task=1 (and --gpu-bind=map_gpu) narrow CUDA_VISIBLE_DEVICES per task (the
# cluster's placeholder GPUs, counted by DDP_SIMULATE_GPUS): each rank keeps its own list and uses
# its device 0, instead of being refused for having fewer GPUs than local ranks. Under
# --gpus-per-node each rank keeps the node's whole list and uses its local rank's GPU.
case_gpu_bind() {
    local out=$WORK/gpu-bind.out opts
    for opts in "--gpus-per-task=1" "--gpus-per-node=2 --gpu-bind=map_gpu:1,0"; do
        # shellcheck disable=SC2086,SC2016  # opts splits into words; $VARS are for the task's shell
        run_to "$out" 60 env DDP_SIMULATE_GPUS=4 srun -N1 --ntasks-per-node=2 $opts "$LAUNCH" \
            sh -c 'echo "rank=$RANK device=$DDP_DEVICE visible=$CUDA_VISIBLE_DEVICES"' ||
            { show_tail "$out"; fail "srun $opts ... ddp-launch exited non-zero"; }
        grep '^rank=' "$out" | sort | sed "s/^/  $opts: /"
        [[ $(grep -c '^rank=[01] device=0 visible=[0-3]$' "$out") -eq 2 ]] ||
            { show_tail "$out"; fail "srun $opts: want 2 ranks on device 0 of their own GPU"; }
        [[ $(grep '^rank=' "$out" | sed 's/.*visible=//' | sort -u | wc -l) -eq 2 ]] ||
            fail "srun $opts: the two ranks must see different GPUs"
    done
    # --gpus-per-node (what the templates ask for): Slurm gives both tasks the node's list, and
    # ddp-launch passes it on whole, local rank r taking its r-th GPU.
    # shellcheck disable=SC2016
    run_to "$out" 60 env DDP_SIMULATE_GPUS=4 srun -N1 --ntasks-per-node=2 --gpus-per-node=2 "$LAUNCH" \
        sh -c 'echo "rank=$RANK device=$DDP_DEVICE visible=$CUDA_VISIBLE_DEVICES"' ||
        { show_tail "$out"; fail "srun --gpus-per-node=2 ... ddp-launch exited non-zero"; }
    grep '^rank=' "$out" | sort | sed "s/^/  --gpus-per-node=2: /"
    [[ $(grep -c '^rank=0 device=0 visible=[0-3],[0-3]$' "$out") -eq 1 &&
        $(grep -c '^rank=1 device=1 visible=[0-3],[0-3]$' "$out") -eq 1 ]] ||
        { show_tail "$out"; fail "srun --gpus-per-node=2: want rank r on device r of the whole list"; }
    [[ $(grep '^rank=' "$out" | sed 's/.*visible=//' | sort -u | wc -l) -eq 1 ]] ||
        fail "srun --gpus-per-node=2: the two ranks must see the same list"
}

# srun --mpi=pmix -N2 -n4 ddp-launch ddp-train: the MLP (TRAIN_ARGS) reaches MIN_ACC with world size 4.
case_srun_pmix_train() {
    local out=$WORK/srun-train.out
    run_to "$out" "$JOB_TIMEOUT" srun --mpi=pmix -N2 -n4 --ntasks-per-node=2 "$LAUNCH" "$TRAIN" \
        "${TRAIN_ARGS[@]}" --data "$DATA" --metrics "$WORK/srun-train.jsonl" ||
        { show_tail "$out"; fail "srun training exited non-zero"; }
    check_metrics "$WORK/srun-train.jsonl" 4
}

# mpirun inside an sbatch allocation of 2 nodes x 2 tasks launching ddp-launch ddp-train.
case_mpirun_sbatch_train() {
    local script=$WORK/mpirun-job.sh
    cat >"$script" <<EOF
#!/bin/bash
set -euo pipefail
echo "allocation: \$SLURM_JOB_NODELIST tasks \$SLURM_NTASKS"
mpirun -np "\$SLURM_NTASKS" --map-by slot --bind-to none "$LAUNCH" "$TRAIN" ${TRAIN_ARGS[*]} \
    --data "$DATA" --metrics "$WORK/mpirun-train.jsonl"
EOF
    submit ddp-test-mpirun "$WORK/mpirun-job.out" -N2 --ntasks-per-node=2 "$script"
    check_metrics "$WORK/mpirun-train.jsonl" 4
}

# mpirun --map-by node inside an sbatch allocation: ranks alternate between the nodes, and each
# rank's NODE_RANK / GROUP_RANK must still be its host's node (not rank / local size).
case_mpirun_map_by_node() {
    local script=$WORK/map-by-node.sh out=$WORK/map-by-node.out
    cat >"$script" <<EOF
#!/bin/bash
mpirun -np 4 --map-by node --bind-to none "$LAUNCH" \
    sh -c 'echo "rank=\$RANK node=\$NODE_RANK group=\$GROUP_RANK local=\$LOCAL_RANK nodes=\$DDP_NNODES host=\$(hostname)"'
EOF
    submit ddp-test-map-by-node "$out" -N2 --ntasks-per-node=2 "$script"
    python3 - "$out" <<'PY' || { show_tail "$out" 40; fail "wrong node ranks under mpirun --map-by node"; }
import sys
rows = [dict(kv.split("=") for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("rank=")]
errors = [] if len(rows) == 4 else [f"{len(rows)} ranks reported, want 4"]
for r in rows:
    node = int(r["host"][len("node"):]) - 1
    print(f"  rank {r['rank']} on {r['host']}: NODE_RANK={r['node']} GROUP_RANK={r['group']} "
          f"LOCAL_RANK={r['local']}")
    if (r["node"], r["group"], r["nodes"]) != (str(node), str(node), "2"):
        errors.append(f"rank {r['rank']} on {r['host']}: NODE_RANK={r['node']}, want {node}")
    if r["local"] != str(int(r["rank"]) // 2):
        errors.append(f"rank {r['rank']}: LOCAL_RANK={r['local']}, want {int(r['rank']) // 2}")
for e in errors:
    print("  " + e)
sys.exit(1 if errors else 0)
PY
}

# Every slurm/*.sbatch runs to completion as written (its own training defaults) under Slurm's own
# default MpiDefault=none, so every srun line must ask for PMIx itself: submitted from the source
# tree as the templates say, with only the programs, data and output folder passed through the
# environment variables the templates document. The GPU directives are met by the cluster's
# placeholder GPUs; ddp-train's --device auto falls back to the CPU.
case_templates() {
    local t name failed=0 n=0 t0 mpi
    mpi=$(scontrol show config | sed -n 's/^MpiDefault *= *//p')
    echo "  cluster MpiDefault=$mpi"
    [[ $mpi == none ]] || fail "the templates case needs MpiDefault=none: run.sh --mpi-default none templates"
    for t in "$SRC"/slurm/*.sbatch; do
        name=$(basename "$t" .sbatch)
        n=$((n + 1))
        t0=$(now)
        if (run_template "$t" "$name"); then
            echo "  template $name: PASS ($(elapsed "$t0") s)"
        else
            echo "  template $name: FAIL ($(elapsed "$t0") s)"
            failed=$((failed + 1))
        fi
    done
    ((n > 0)) || fail "no templates found in $SRC/slurm"
    ((failed == 0)) || fail "$failed of $n templates failed"
}

# run_template FILE NAME (in a subshell): submit it from the source tree, wait, check its metrics
# and its per-rank logs (DDP_OUT/logs: one .out and .err per rank; rank 0's last line also in the
# job's output).
run_template() {
    local world r last
    export DDP_BIN=$BUILD DDP_DATA=$DATA DDP_OUT=$WORK/$2
    if [[ $2 == gpt2 ]]; then # the GPT template: Austen's shards, a tiny GPT-2 for a few steps
        export DDP_DATA="$SRC/data/text/austen_train_*.bin" DDP_BATCH=2 DDP_CKPT_EVERY=3
        export DDP_MAX_STEPS=6 DDP_GPT_ARGS="--layers 2 --heads 2 --channels 32 --seq 32 \
--warmup-steps 2 --val-every 3 --val-max-batches 2"
    fi
    cd "$SRC"
    submit "tmpl-$2" "$WORK/$2.out" "$1"
    grep -q '^done: ' "$WORK/$2.out" || { show_tail "$WORK/$2.out"; fail "no 'done:' line in the job output"; }
    world=$(expected_world "$1")
    check_metrics "$DDP_OUT/metrics.jsonl" "$world"
    if [[ $2 == gpt2 ]]; then
        compgen -G "$DDP_OUT/checkpoints/step-*.ckpt" >/dev/null || fail "the GPT template wrote no checkpoint"
        [[ -s $DDP_OUT/gpt2.bin ]] || fail "the GPT template wrote no llm.c model file (--save-llmc)"
        grep -q '^step [0-9]*/6 ' "$DDP_OUT/logs/rank.0.out" \
            || fail "DDP_MAX_STEPS=6 did not reach ddp-train as --max-steps 6"
        ! grep -q 'is more than the [0-9]* steps planned' "$WORK/$2.out" "$DDP_OUT/logs/rank.0.err" \
            || fail "the GPT template warns that its plan does not fit"
    fi
    for ((r = 0; r < world; r++)); do
        [[ -f $DDP_OUT/logs/rank.$r.out && -f $DDP_OUT/logs/rank.$r.err ]] || fail "no log files of rank $r in $DDP_OUT/logs"
    done
    [[ $(find "$DDP_OUT/logs" -type f | wc -l) -eq $((2 * world)) ]] || fail "log files other than ranks 0..$((world - 1))'s"
    last=$(grep -v '^ *$' "$DDP_OUT/logs/rank.0.err" | tail -n 1)
    if [[ -z $last ]] || ! grep -qF -- "$last" "$WORK/$2.out"; then
        fail "rank 0's last log line '$last' is not in the job output"
    fi
}

# expected_world TEMPLATE: nodes x tasks-per-node from its #SBATCH lines.
expected_world() {
    local nodes tpn
    nodes=$(sed -n 's/^#SBATCH --nodes=\([0-9]*\).*/\1/p' "$1")
    tpn=$(sed -n 's/^#SBATCH --ntasks-per-node=\([0-9]*\).*/\1/p' "$1")
    echo $((${nodes:-1} * ${tpn:-1}))
}

# PyTorch's gloo all-reduce, env:// rendezvous from ddp-launch's variables, 2 nodes x 2 tasks.
case_torch_allreduce() {
    local out=$WORK/torch.out py=""
    for py in /usr/bin/python3 python3; do
        "$py" -c 'import torch' 2>/dev/null && break
        py=""
    done
    [[ -n $py ]] || fail "no python3 here imports torch: apt-get install python3-torch"
    run_to "$out" 300 srun -N2 --ntasks-per-node=2 "$LAUNCH" "$py" "$SRC/tests/cluster/torch_allreduce.py" ||
        { show_tail "$out" 40; fail "torch all-reduce job exited non-zero"; }
    grep 'torch-allreduce' "$out" | sed 's/^/  /'
    [[ $(grep -c 'torch-allreduce rank [0-3]/4 host node[12]: ok' "$out") -eq 4 ]] ||
        fail "want 4 ranks reporting ok"
    [[ $(grep -c 'host node1: ok' "$out") -eq 2 && $(grep -c 'host node2: ok' "$out") -eq 2 ]] ||
        fail "want 2 ranks on each node"
}

# srun without PMIx (--mpi=pmi2, --mpi=none) cannot wire up Open MPI: ddp-launch must stop the job
# within seconds with its explanation (naming --mpi=pmix) and a non-zero exit, not hang.
case_pmi_trap() {
    local mpi out t0 secs rc
    for mpi in pmi2 none; do
        out=$WORK/trap-$mpi.out
        t0=$(now)
        rc=0
        run_to "$out" 60 srun --mpi="$mpi" -N2 --ntasks-per-node=1 "$LAUNCH" "$TRAIN" --model mlp \
            --data "$DATA" --epochs 1 --metrics "$WORK/trap-$mpi.jsonl" || rc=$?
        secs=$(elapsed "$t0")
        echo "  --mpi=$mpi: exit $rc after ${secs}s"
        ((rc != 0)) || { show_tail "$out"; fail "--mpi=$mpi: exit status 0, want non-zero"; }
        ((rc != 124 && rc != 137)) || { show_tail "$out"; fail "--mpi=$mpi: still running after 60 s"; }
        awk -v s="$secs" 'BEGIN { exit !(s < 20) }' || fail "--mpi=$mpi: took ${secs}s, want < 20 s"
        grep -q -- '--mpi=pmix' "$out" || { show_tail "$out"; fail "--mpi=$mpi: no hint to use --mpi=pmix"; }
        grep -m1 -- '--mpi=pmix' "$out" | sed 's/^/  message: /'
    done
}

# job_field ID FIELD: one field of `scontrol show job` (e.g. JobState, Restarts).
job_field() { scontrol show job -o "$1" 2>/dev/null | grep -o "$2=[^ ]*" | cut -d= -f2; }

# wait_file PATTERN SECONDS: until a file matches the glob.
wait_file() {
    local t0=$SECONDS
    until compgen -G "$1" >/dev/null; do
        ((SECONDS - t0 < $2)) || return 1
        sleep 0.2
    done
}

# A job whose work outlasts its time limit requeues itself and finishes (slurm/requeue.sbatch).
# What is emulated: the warning that --signal=USR1@SECONDS sends before a limit given in minutes
# would make this test last minutes, so the test sends the same SIGUSR1 to the job's steps with
# `scancel --signal=USR1` once the first checkpoint exists; and the cluster runs with
# --requeue-delay 10 (Slurm holds a requeued job for cred_expire, 120 s by default; measured here:
# PENDING with Reason=BeginTime for 2 min 18 s). Everything else is real: the template's srun,
# ddp-train's stop, checkpoint and `scontrol requeue`, Slurm's requeue, and --resume auto. The final
# parameters must be bit-identical to an uninterrupted run of the same length.
case_requeue() { requeue_run requeue ""; }
# The same with checkpoint folders written in the background (--checkpoint-format folder
# --checkpoint-async): each rank writes its file on its node, the stop's save completes before the
# requeue, and the requeued run resumes from the folder.
case_requeue_folder() { requeue_run requeue-folder "--checkpoint-format folder --checkpoint-async"; }

# requeue_run NAME EXTRA_ARGS: the requeue case with extra ddp-train flags for the requeued job.
requeue_run() {
    local dir=$WORK/$1 out=$WORK/$1.out id restarts step
    local args="--widths 784-64-10 --max-steps 1500 --device cpu --log-every 100"
    id=$(DDP_BIN=$BUILD DDP_DATA=$DATA DDP_OUT=$dir DDP_EPOCHS=100 DDP_BATCH=32 DDP_LR=0.05 \
        DDP_CKPT_EVERY=50 DDP_TRAIN_ARGS="$args $2" DDP_SRC=$SRC sbatch --parsable --chdir="$SRC" --output="$out" \
        --nodes=2 --ntasks-per-node=1 --time=10 "$SRC/slurm/requeue.sbatch") || fail "sbatch refused"
    id=${id%%;*}
    echo "  submitted slurm/requeue.sbatch as job $id"
    wait_file "$dir/checkpoints/step-*.ckpt" 180 || { show_tail "$out"; scancel "$id"; fail "no checkpoint"; }
    scancel --signal=USR1 "$id" || fail "scancel --signal=USR1 $id failed"
    echo "  first checkpoint written; sent SIGUSR1 to the job's steps (the time-limit warning)"
    wait_job "$id" "$JOB_TIMEOUT" || { show_tail "$out" 60; fail "the job did not complete"; }
    restarts=$(job_field "$id" Restarts)
    step=$(sed -n 's/.*SIGUSR1 received: every rank stops after step \([0-9]*\).*/\1/p' "$out" | head -n 1)
    grep -E 'requeued Slurm|resumed from|stops after|^done|^job ' "$out" | sed 's/^/  | /'
    ((${restarts:-0} >= 1)) ||
        { show_tail "$out" 40; fail "not requeued (Restarts=$restarts; did it finish before the signal?)"; }
    [[ -n $step ]] || fail "no stop reported"
    grep -q "requeued Slurm job $id" "$out" || fail "rank 0 did not requeue the job"
    grep -q "resumed from $dir/checkpoints/step-$(printf %012d "$step").ckpt at step $step " "$out" ||
        fail "the requeued run did not resume from the step-$step checkpoint"
    grep -q '^done: ' "$out" || fail "no 'done:' line after the requeued run"
    [[ -z $2 || -f $dir/checkpoints/step-000000001500.ckpt/MANIFEST ]] ||
        fail "the last checkpoint is not a complete folder (flags: $2)"
    [[ -z $2 ]] || grep -q 'written in the background' "$out" || fail "no save was written in the background"
    # shellcheck disable=SC2086  # args splits into flags
    run_to "$WORK/$1-ref.out" "$JOB_TIMEOUT" srun --mpi=pmix -N2 --ntasks-per-node=1 "$LAUNCH" \
        "$TRAIN" --model mlp --data "$DATA" --epochs 100 --batch 32 --lr 0.05 $args \
        --save "$WORK/$1-ref.ckpt" ||
        { show_tail "$WORK/$1-ref.out"; fail "the uninterrupted reference run failed"; }
    "$BUILD/tools/ddp-ckpt" diff "$WORK/$1-ref.ckpt" "$dir/model.ckpt" >"$WORK/$1-diff.out" 2>&1 || true
    sed 's/^/  /' "$WORK/$1-diff.out"
    grep -q 'max_abs_diff=0 ' "$WORK/$1-diff.out" ||
        fail "stopped + requeued + resumed differs from the uninterrupted run"
}

# A plain `scancel` (as a time limit does) sends SIGTERM to every task of the step, then SIGKILL after
# KillWait (5 s here): both ranks, on two nodes, stop after the same step and rank 0 checkpoints it.
case_srun_sigterm() {
    local dir=$WORK/sigterm out=$WORK/sigterm.out script=$WORK/sigterm.sh id step t0
    cat >"$script" <<EOF
#!/bin/bash
srun --mpi=pmix --kill-on-bad-exit=1 "$LAUNCH" "$TRAIN" --model mlp --widths 784-64-10 --data "$DATA" \
    --epochs 1000 --batch 32 --device cpu --log-every 1000 --checkpoint-dir "$dir" --checkpoint-every 50
EOF
    id=$(sbatch --parsable --output="$out" --nodes=2 --ntasks-per-node=1 "$script") || fail "sbatch refused"
    id=${id%%;*}
    wait_file "$dir/step-*.ckpt" 180 || { show_tail "$out"; scancel "$id"; fail "no checkpoint"; }
    scancel "$id"
    echo "  first checkpoint written; scancel $id"
    t0=$SECONDS
    while [[ $(job_field "$id" JobState) =~ ^(RUNNING|COMPLETING|PENDING)$ ]] && ((SECONDS - t0 < 60)); do
        sleep 0.5
    done
    echo "  job state $(job_field "$id" JobState) after $((SECONDS - t0)) s"
    grep -E 'SIGTERM|stops after|checkpoint /' "$out" | tail -n 4 | sed 's/^/  | /'
    step=$(sed -n 's/.*SIGTERM received: every rank stops after step \([0-9]*\).*/\1/p' "$out" | head -n 1)
    [[ -n $step ]] || { show_tail "$out"; fail "rank 0 did not report a SIGTERM stop"; }
    [[ $(grep -c "this rank stops after step $step\$" "$out") -eq 2 ]] ||
        { show_tail "$out"; fail "not both ranks stopped after step $step"; }
    "$BUILD/tools/ddp-ckpt" show "$dir/step-$(printf %012d "$step").ckpt" | grep -q "^  step = $step\$" ||
        fail "no valid checkpoint of step $step"
}

# srun -N2 --ntasks-per-node=2 ddp-launch --log-dir: ddp-launch runs once per rank and redirects its
# own rank: every rank's lines (tagged with rank and host) land in its two files and nowhere else,
# on the node it ran on; srun's output holds rank 0's lines only, all of them, even after a burst.
case_log_dir() {
    local out=$WORK/log-dir.out logs=$WORK/logs
    # shellcheck disable=SC2016  # for the task's shell
    run_to "$out" 60 srun -N2 --ntasks-per-node=2 --label "$LAUNCH" --log-dir "$logs" sh -c \
        'for i in $(seq 20); do echo "out rank=$RANK host=$(hostname) line=$i"; echo "err rank=$RANK host=$(hostname) line=$i" >&2; done' ||
        { show_tail "$out"; fail "srun ... ddp-launch --log-dir exited non-zero"; }
    python3 - "$out" "$logs" <<'PY' || { show_tail "$out" 40; fail "wrong per-rank logs"; }
import os, re, sys
out, logs = sys.argv[1], sys.argv[2]
errors = []
files = sorted(os.listdir(logs))
want_files = sorted(f"rank.{r}.{s}" for r in range(4) for s in ("out", "err"))
if files != want_files:
    errors.append(f"log files {files}, want {want_files}")
for r in range(4):
    for s in ("out", "err"):
        path = os.path.join(logs, f"rank.{r}.{s}")
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        want = [f"{s} rank={r} host=node{r // 2 + 1} line={i}" for i in range(1, 21)]
        print(f"  {path}: {len(lines)} lines, {sum(l in want for l in lines)} of rank {r} on node{r // 2 + 1}")
        if lines != want:
            errors.append(f"{path} does not hold exactly rank {r}'s 20 {s} lines")
terminal = [l for l in open(out).read().splitlines() if re.match(r"\s*\d+: ", l)]
for s in ("out", "err"):
    got = [l for l in terminal if re.match(rf"\s*0: {s} rank=0 host=node1 line=\d+$", l)]
    if len(got) != 20:
        errors.append(f"srun output: {len(got)} of rank 0's {s} lines, want 20")
others = [l for l in terminal if not re.match(r"\s*0: (out|err) rank=0 ", l)]
if others:
    errors.append(f"srun output has lines of other ranks: {others[:3]}")
for e in errors:
    print("  " + e)
sys.exit(1 if errors else 0)
PY
    # A burst at the end of the step: srun's copy of rank 0 is complete, to the last line.
    run_to "$out" 60 srun -N2 --ntasks-per-node=1 "$LAUNCH" --log-dir "$WORK/burst" sh -c 'seq 100000; echo last-line' ||
        { show_tail "$out"; fail "srun ... ddp-launch --log-dir (burst) exited non-zero"; }
    echo "  burst: srun output $(grep -c '^[0-9]' "$out") numbers + '$(tail -n 1 "$out")', rank 0's file $(wc -l <"$WORK/burst/rank.0.out") lines"
    [[ $(grep -c '^[0-9]' "$out") -eq 100000 && $(tail -n 1 "$out") == last-line ]] ||
        fail "srun's output lost part of rank 0's burst"
}

# No rank left hanging: kill -9 of rank 1 in the middle of training under plain
# `srun --mpi=pmix -N2` (Slurm's default KillOnBadExit=0) and under mpirun in an sbatch allocation of
# 2 nodes, then SIGSTOP under srun with DDP_TIMEOUT=8 (tests/train/kill_rank.py; 2 trials per mode
# here; DDP_KILL_TRIALS=10 DDP_STOP_TRIALS=N for more).
case_kill_rank() {
    local py=$SRC/tests/train/kill_rank.py trials=${DDP_KILL_TRIALS:-2}
    "$py" --train "$TRAIN" --launch "$LAUNCH" --modes srun,sbatch-mpirun --trials "$trials" ||
        fail "a job outlived the death of one of its ranks (see above)"
    "$py" --train "$TRAIN" --launch "$LAUNCH" --modes srun --stop --trials "${DDP_STOP_TRIALS:-1}" ||
        fail "a job outlived the freezing of one of its ranks (see above)"
}

# A partitioned node: node2's link goes down in the middle of training under plain
# `srun --mpi=pmix -N2` with DDP_TIMEOUT=10, its processes alive; once from outside its namespace
# (no carrier), once from inside (no route). Every process of the job (both ranks and srun) must be
# gone within DDP_TIMEOUT + 10 s of the cut, rank 0 must name rank 1 as unreachable and rank 1 say
# it is cut off (tests/cluster/partition.py, which always restores the link, kills what is left by
# PID and waits until Slurm has the job's end).
case_partition() {
    "$SRC/tests/cluster/partition.py" --train "$TRAIN" --launch "$LAUNCH" --data "$DATA" --work "$WORK" \
        --timeout "${DDP_PARTITION_TIMEOUT:-10}" || fail "the partition test failed (see above)"
}

# kill_node N: SIGKILL node N's ddp-train processes (found in its network namespace), then its
# slurmd (the node stops answering Slurm; its slurmstepd still reports the tasks' end to srun).
kill_node() {
    local p pids=()
    for p in $(ip netns pids "ddp-node$1"); do
        [[ $(cat "/proc/$p/comm" 2>/dev/null) != ddp-train ]] || pids+=("$p")
    done
    ((${#pids[@]})) || fail "no ddp-train runs on node$1"
    kill -KILL "${pids[@]}" "$(cat "$DDP_SLURM_BASE/node$1/slurmd.pid")" ||
        fail "cannot kill node$1's tasks and slurmd"
    echo "  killed node$1: ddp-train ${pids[*]} and its slurmd"
}

# wait_for SECONDS CMD...: until CMD succeeds (polled every 0.2 s); fails after SECONDS.
wait_for() {
    local t0=$SECONDS
    until "${@:2}"; do
        ((SECONDS - t0 < $1)) || return 1
        sleep 0.2
    done
}

# checkpoint_or_end DIR ID: DIR/checkpoints holds a checkpoint, or job ID no longer runs (fails).
checkpoint_or_end() {
    compgen -G "$1/checkpoints/step-*" >/dev/null && return 0
    [[ $(job_field "$2" JobState) =~ ^(PENDING|RUNNING)$ ]] ||
        fail "job $2 ended before a checkpoint"
    return 1
}

# stepped_after_resume FILE: a step line follows the first 'resumed from' line of FILE.
stepped_after_resume() { sed -n '/^resumed from/,$p' "$1" | grep -q '^step '; }

# job_end ID LIMIT: waits until the job has ended; prints "STATE EXITCODE" (e.g. COMPLETED 0:0).
job_end() {
    local t0=$SECONDS state
    while state=$(job_field "$1" JobState) && [[ $state =~ ^(PENDING|RUNNING|COMPLETING|)$ ]]; do
        ((SECONDS - t0 < $2)) || { scancel "$1"; echo "TIMEOUT -"; return; }
        sleep 0.5
    done
    echo "$state $(job_field "$1" ExitCode)"
}

# submit_elastic NAME OUT SBATCH-ARGS...: slurm/elastic.sbatch with a long MLP run, checkpoints
# every 50 steps and DDP_TIMEOUT=10; prints the job id.
submit_elastic() {
    local id
    id=$(DDP_BIN=$BUILD DDP_DATA=$DATA DDP_OUT=$WORK/$1 DDP_SRC=$SRC DDP_EPOCHS=1000 DDP_LR=0.05 \
        DDP_CKPT_EVERY=50 DDP_TIMEOUT=10 DDP_TRAIN_ARGS="--widths 784-64-10 --device cpu \
--max-steps 100000 --log-every 10" sbatch --parsable --chdir="$SRC" --output="$2" "${@:3}" \
        "$SRC/slurm/elastic.sbatch") || fail "sbatch slurm/elastic.sbatch refused"
    echo "${id%%;*}"
}

# slurm/elastic.sbatch on 3 nodes x 2 ranks (--max-restarts 2 --min-nodes 2, --global-batch 96):
# once it trains, node3's ranks are SIGKILLed with its slurmd. The next generation must run on
# node1 and node2 only, resume from a rescue snapshot or checkpoint, and train again within
# DDP_TIMEOUT + 30 s of the kill; no generation may read the lost node's snapshot folder (nodes
# share /dev/shm here: a snapshot planted there at the kill must not be looked at); the job must
# outlive Slurm marking node3 down (--no-kill) and end with exit status 0 (stopped cleanly by
# SIGUSR1 once node3 is down and training went on). Then the floor: the template on node1 and
# node2 with --min-nodes 2 loses node2 and must end, non-zero, saying why.
case_elastic_nodes() {
    local out=$WORK/elastic.out id snap lost t_kill secs resumed end
    id=$(submit_elastic elastic "$out" --nodes=3 --ntasks-per-node=2)
    # the nodes share /dev/shm, and a restarted cluster numbers its jobs from 1 again
    # shellcheck disable=SC2064  # the job ids now; the floor's job is the next one
    trap "rm -rf /dev/shm/ddp-snapshots-{$id,$((id + 1))}-node[1-3]" EXIT
    echo "  submitted slurm/elastic.sbatch as job $id (3 nodes x 2 ranks)"
    wait_for 120 checkpoint_or_end "$WORK/elastic" "$id" ||
        { show_tail "$out"; fail "no checkpoint"; }
    snap=$(sed -n 's/^elastic: rescue snapshots in \([^ ]*\) .*/\1/p' "$out" | head -n 1)
    [[ -n $snap ]] || { show_tail "$out"; fail "no rescue snapshots announced"; }
    lost=${snap%node1}node3 # the lost node's folder (node1's name replaced), or the one folder
    [[ $snap == *node1 ]] || lost=$snap
    t_kill=$(now)
    kill_node 3
    mkdir -p "$lost"
    echo "planted by the test" >"$lost/step-000000099999.rescue"
    wait_for 40 stepped_after_resume "$out" ||
        { show_tail "$out" 40; fail "no step after a resume within 40 s of the kill"; }
    secs=$(elapsed "$t_kill")
    grep '^ddp-launch: generation' "$out" | sed 's/^/  | /'
    resumed=$(grep -m1 '^resumed from' "$out")
    echo "  $resumed"
    echo "  kill to the next generation's first step: $secs s (limit DDP_TIMEOUT + 30 = 40 s)"
    awk -v s="$secs" 'BEGIN { exit !(s <= 40) }' || fail "training went on only after $secs s"
    grep -q '^ddp-launch: generation 1: 4 rank(s) on 2 node(s) (node1,node2), .*left out: node3 (' \
        "$out" || fail "generation 1 is not node1 and node2 with node3 left out"
    [[ $resumed != *"$lost/"* ]] || fail "generation 1 resumed from the lost node's folder $lost"
    ! grep -F -- "$lost/" "$out" || fail "a generation looked at the lost node's folder $lost"
    t_kill=$SECONDS
    until [[ $(sinfo -h -N -n node3 -o %T) == down* ]]; do
        ((SECONDS - t_kill < 120)) || fail "Slurm did not mark node3 down within 120 s"
        sleep 0.5
    done
    echo "  Slurm marked node3 $(sinfo -h -N -n node3 -o %T)"
    local steps
    steps=$(grep -c '^step ' "$out")
    until (($(grep -c '^step ' "$out") >= steps + 2)); do
        [[ $(job_field "$id" JobState) == RUNNING ]] ||
            { show_tail "$out"; fail "the job ended when node3 went down"; }
        sleep 0.2
    done
    scancel --signal=USR1 "$id" || fail "scancel --signal=USR1 $id failed"
    end=$(job_end "$id" 120)
    echo "  training went on after node3 went down; SIGUSR1 sent: job $end"
    [[ $end == "COMPLETED 0:0" ]] || { show_tail "$out"; fail "job $end, want COMPLETED 0:0"; }
    grep -q '^ddp-launch: generation 1 ended with exit status 0 .*the job is done' "$out" ||
        fail "generation 1 did not end the job with exit status 0"
    tail -n 1 "$WORK/elastic/metrics.jsonl" | grep -q '"world_size":4' ||
        fail "the last metrics line is not of 4 ranks"
    elastic_floor
}

# The floor: --min-nodes 2 on node1 and node2, node2 lost: no generation 1, a non-zero exit, why.
elastic_floor() {
    local out=$WORK/elastic-floor.out id end
    id=$(DDP_MIN_NODES=2 submit_elastic elastic-floor "$out" --nodes=2 --exclude=node3)
    echo "  submitted the template as job $id on node1 and node2 with --min-nodes 2"
    wait_for 120 checkpoint_or_end "$WORK/elastic-floor" "$id" ||
        { show_tail "$out"; fail "no checkpoint"; }
    kill_node 2
    end=$(job_end "$id" 120)
    grep -E '^ddp-launch: generation' "$out" | sed 's/^/  | /'
    echo "  job $end"
    [[ $end == FAILED* && $end != "FAILED 0:0" ]] || fail "job ended $end, want FAILED, non-zero"
    grep -q "^ddp-launch: generation 0 ended with exit status [1-9][0-9]* .*left out: node2 (.*; 1 \
node(s) left, below --min-nodes 2: the job ends" "$out" || fail "the end does not say why"
    ! grep -q '^ddp-launch: generation 1:' "$out" || fail "a generation ran below --min-nodes"
}

# --- driver ----------------------------------------------------------------------------------------

cleanup() {
    local t0
    t0=$(now)
    "$CLUSTER" stop >/dev/null 2>&1 || log "warning: cluster stop failed"
    log "cluster stopped in $(elapsed "$t0") s"
    [[ -z $WORK ]] || rm -rf "$WORK"
}

main() {
    local cases=() c t0 rc passed=0 failed=()
    while (($#)); do
        case $1 in
            --launch) LAUNCH=$2; shift 2 ;;
            --train) TRAIN=$2; shift 2 ;;
            --mpi-default) MPI_DEFAULT=$2; shift 2 ;;
            *) cases+=("$1"); shift ;;
        esac
    done
    ((${#cases[@]})) || cases=("${ALL_CASES[@]}")
    [[ -x $LAUNCH && -x $TRAIN ]] || { log "need --launch and --train executables"; exit 2; }
    LAUNCH=$(realpath "$LAUNCH")
    TRAIN=$(realpath "$TRAIN")
    BUILD=$(cd "$(dirname "$LAUNCH")/.." && pwd)
    [[ -s $DATA/train-images-idx3-ubyte ]] ||
        { log "FAIL: no MNIST in $DATA (run scripts/fetch-mnist.sh $DATA)"; exit 1; }

    exec 9>/tmp/ddp-cluster-test.lock
    flock -w 1800 9 || { log "FAIL: another cluster test held the lock for 30 min"; exit 1; }
    WORK=$(mktemp -d /tmp/ddp-cluster-test.XXXXXX)
    trap cleanup EXIT
    t0=$(now)
    # requeue: a requeued job may start again after 10 s instead of Slurm's default 120 s
    local nodes=2 # slurm/elastic.sbatch asks for 3; every other case for 2 at most
    [[ " ${cases[*]} " != *" templates "* && " ${cases[*]} " != *" elastic-"* ]] || nodes=3
    "$CLUSTER" start --nodes "$nodes" --cpus 4 --gpus 4 --requeue-delay 10 \
        --mpi-default "$MPI_DEFAULT" \
        >"$WORK/start.out" 2>&1 ||
        { cat "$WORK/start.out"; log "FAIL: the Slurm cluster did not start"; exit 1; }
    log "cluster started in $(elapsed "$t0") s ($nodes nodes, MpiDefault=$MPI_DEFAULT)"
    # shellcheck source=/dev/null
    source "$DDP_SLURM_BASE/env.sh"
    cd "$WORK"

    for c in "${cases[@]}"; do
        declare -F "case_${c//-/_}" >/dev/null || { log "unknown case '$c'"; failed+=("$c"); continue; }
        log "case $c ..."
        t0=$(now)
        set +e
        (set -e; "case_${c//-/_}")
        rc=$?
        set -e
        if ((rc == 0)); then
            log "case $c: PASS ($(elapsed "$t0") s)"
            passed=$((passed + 1))
        else
            log "case $c: FAIL ($(elapsed "$t0") s)"
            failed+=("$c")
        fi
    done
    log "$passed passed, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}"
    ((${#failed[@]} == 0))
}

main "$@"
