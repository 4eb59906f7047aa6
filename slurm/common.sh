# shellcheck shell=bash disable=SC2034  # sourced by the templates, which use launch, train, train_args
# common.sh - the preamble shared by the sbatch templates in this folder (sourced, not run): where
# the programs, data and outputs are, the training defaults, and the ddp-launch and ddp-train paths.
# Every variable can be set before sbatch (sbatch hands the environment to the job):
#   DDP_BIN   a meson build directory (programs in launcher/ and train/) or an install's bin/
#   DDP_DATA  the four MNIST IDX files, visible on every node (shared file system)
#   DDP_OUT   metrics, checkpoint and per-rank logs (DDP_OUT/logs/rank.N.out|err) of this job
#   DDP_MODEL mlp|cnn   DDP_EPOCHS   DDP_BATCH (per rank)   DDP_LR
#   DDP_TRAIN_ARGS  extra ddp-train flags, space-separated
# Sets: launch, train (the programs' paths) and train_args (an array: ddp-train's flags).
# Open MPI programs under srun need `srun --mpi=pmix` (Slurm's own default, MpiDefault=none, and
# --mpi=pmi2 cannot start Open MPI 4); the templates say it on every srun line.

DDP_BIN=${DDP_BIN:-$SLURM_SUBMIT_DIR/build}
DDP_DATA=${DDP_DATA:-$SLURM_SUBMIT_DIR/data/mnist}
DDP_OUT=${DDP_OUT:-$SLURM_SUBMIT_DIR/runs/$SLURM_JOB_ID}
DDP_MODEL=${DDP_MODEL:-mlp}
DDP_EPOCHS=${DDP_EPOCHS:-4}
DDP_BATCH=${DDP_BATCH:-64}
DDP_LR=${DDP_LR:-0.1}
DDP_TRAIN_ARGS=${DDP_TRAIN_ARGS:-}

# ddp_prog NAME: the path of program NAME in a build tree (launcher/, train/) or in DDP_BIN itself.
ddp_prog() {
    local p
    for p in "$DDP_BIN/launcher/$1" "$DDP_BIN/train/$1" "$DDP_BIN/$1"; do
        [[ -x $p ]] && { echo "$p"; return 0; }
    done
    echo "$0: $1 not found under DDP_BIN=$DDP_BIN (set DDP_BIN to a build or bin directory)" >&2
    return 1
}

launch=$(ddp_prog ddp-launch)
train=$(ddp_prog ddp-train)
# shellcheck disable=SC2206  # DDP_TRAIN_ARGS is meant to split into words
train_args=(--model "$DDP_MODEL" --data "$DDP_DATA" --device auto --epochs "$DDP_EPOCHS"
    --batch "$DDP_BATCH" --lr "$DDP_LR" --metrics "$DDP_OUT/metrics.jsonl" --save "$DDP_OUT/model.ckpt"
    $DDP_TRAIN_ARGS)
mkdir -p "$DDP_OUT"
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: $SLURM_NTASKS tasks, output in $DDP_OUT"
