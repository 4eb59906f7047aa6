#!/bin/sh
# gpu_exports.sh - what ddp-launch exports on a GPU node (GPUs faked with DDP_SIMULATE_GPUS): every
# rank keeps the node's whole CUDA_VISIBLE_DEVICES (NCCL reaches the peer GPUs over P2P/NVLink only
# when the processes can see them) and picks its own with DDP_DEVICE = LOCAL_RANK; a list Slurm
# narrowed per task is passed on as it is, with DDP_DEVICE=0. Usage: gpu_exports.sh DDP_LAUNCH
launch=$1
fails=0

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

# One rank of a torchrun-style launch: LOCAL_RANK and WORLD_SIZE from the environment.
# rank_says LOCAL_RANK LOCAL_SIZE VISIBLE_OR_UNSET [NAME=VALUE...]
rank_says() {
    lr=$1 ls=$2 vis=$3
    shift 3
    set -- RANK="$lr" WORLD_SIZE="$ls" LOCAL_RANK="$lr" LOCAL_WORLD_SIZE="$ls" DDP_SIMULATE_GPUS=4 "$@"
    [ "$vis" = unset ] || set -- CUDA_VISIBLE_DEVICES="$vis" "$@"
    # shellcheck disable=SC2016  # expanded by the rank's shell
    env -i PATH="$PATH" "$@" "$launch" --bind=none sh -c 'echo "device=$DDP_DEVICE visible=$CUDA_VISIBLE_DEVICES"' 2>&1
}

for r in 0 1 2 3; do
    check "4 GPUs, local rank $r of 4: the whole list, its own device" "$(rank_says $r 4 GPU-a,GPU-b,GPU-c,GPU-d)" \
        "device=$r visible=GPU-a,GPU-b,GPU-c,GPU-d"
done
check "no CUDA_VISIBLE_DEVICES: every GPU the driver sees, by ordinal" "$(rank_says 1 2 unset)" "device=1 visible=0,1,2,3"
check "2 ranks on 4 GPUs: rank 1 takes GPU 1, still sees all four" "$(rank_says 1 2 3,5,7,9)" "device=1 visible=3,5,7,9"
check "5 ranks on 4 GPUs without --share-gpus: refused" \
    "$(rank_says 4 5 0,1,2,3 | grep -c 'only 4 GPUs visible')" 1

# The fork path (-n 2 without mpirun): both ranks see both GPUs.
# shellcheck disable=SC2016
out=$(env -i PATH="$PATH" DDP_LOCAL_FORK=1 DDP_SIMULATE_GPUS=2 CUDA_VISIBLE_DEVICES=0,1 "$launch" --bind=none -n 2 \
    sh -c 'echo "rank=$RANK device=$DDP_DEVICE visible=$CUDA_VISIBLE_DEVICES"' | sort | paste -sd' ' -)
check "-n 2 forked on 2 GPUs" "$out" "rank=0 device=0 visible=0,1 rank=1 device=1 visible=0,1"

# Under srun with --gpus-per-task (SLURMD_TRES_BIND=gpu:per_task:1) Slurm has already narrowed the
# list: ddp-launch keeps it and every task uses its device 0.
# shellcheck disable=SC2016
out=$(env -i PATH="$PATH" DDP_SIMULATE_GPUS=1 CUDA_VISIBLE_DEVICES=2 SLURMD_TRES_BIND=gpu:per_task:1 SLURM_PROCID=1 \
    SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_STEP_NUM_NODES=1 SLURM_STEP_TASKS_PER_NODE=2 \
    SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_STEP_NODELIST=node1 DDP_MPI_PROGRAM=none "$launch" --bind=none \
    sh -c 'echo "device=$DDP_DEVICE visible=$CUDA_VISIBLE_DEVICES"' 2>&1)
check "srun, narrowed by Slurm: kept, device 0" "$out" "device=0 visible=2"
exit $((fails > 0))
