# shellcheck shell=bash disable=SC2034  # sourced by the templates, which use launch, train, train_args
# common.sh - the preamble shared by the sbatch templates in this folder (sourced, not run): where
# the programs, data and outputs are, the training defaults, and the ddp-launch and ddp-train paths.
# Every variable can be set before sbatch (sbatch hands the environment to the job):
#   DDP_BIN   a meson build directory (programs in launcher/ and train/) or an install's bin/
#   DDP_MODEL mlp|cnn|gpt2 (default mlp)
#   DDP_DATA  the model's data, visible on every node (shared file system): the folder of the four
#             MNIST IDX files (default data/mnist), or for gpt2 a pattern of llm.c token shards
#             (default 'data/text/austen_train_*.bin'; the validation shards: train -> val)
#   DDP_OUT   metrics, checkpoint and per-rank logs (DDP_OUT/logs/rank.N.out|err) of this job
#   DDP_EPOCHS   DDP_BATCH (per rank; default 64, gpt2 4 sequences)   DDP_LR (default 0.1, gpt2
#             6e-4: AdamW's rate; an SGD-sized rate makes the GPT diverge)
#   DDP_GPT_ARGS  the GPT's flags (sizes, sequence, warm-up, validation), space-separated
#   DDP_TRAIN_ARGS  extra ddp-train flags, space-separated
# Sets: launch, train (the programs' paths) and train_args (an array: ddp-train's flags).
# Open MPI programs under srun need `srun --mpi=pmix` (Slurm's own default, MpiDefault=none, and
# --mpi=pmi2 cannot start Open MPI 4); the templates say it on every srun line.

DDP_BIN=${DDP_BIN:-$SLURM_SUBMIT_DIR/build}
DDP_OUT=${DDP_OUT:-$SLURM_SUBMIT_DIR/runs/$SLURM_JOB_ID}
DDP_MODEL=${DDP_MODEL:-mlp}
DDP_EPOCHS=${DDP_EPOCHS:-4}
if [[ $DDP_MODEL == gpt2 ]]; then
    DDP_DATA=${DDP_DATA:-$SLURM_SUBMIT_DIR/data/text/austen_train_*.bin}
    DDP_BATCH=${DDP_BATCH:-4}
    DDP_LR=${DDP_LR:-6e-4}
else
    DDP_DATA=${DDP_DATA:-$SLURM_SUBMIT_DIR/data/mnist}
    DDP_BATCH=${DDP_BATCH:-64}
    DDP_LR=${DDP_LR:-0.1}
fi
DDP_GPT_ARGS=${DDP_GPT_ARGS:-}
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
# shellcheck disable=SC2206  # DDP_TRAIN_ARGS and DDP_GPT_ARGS are meant to split into words
train_args=(--model "$DDP_MODEL" --data "$DDP_DATA" --device auto --epochs "$DDP_EPOCHS"
    --batch "$DDP_BATCH" --lr "$DDP_LR" --metrics "$DDP_OUT/metrics.jsonl" --save "$DDP_OUT/model.ckpt")
[[ $DDP_MODEL != gpt2 ]] || train_args+=($DDP_GPT_ARGS)
# shellcheck disable=SC2206
train_args+=($DDP_TRAIN_ARGS)
mkdir -p "$DDP_OUT"
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: $SLURM_NTASKS tasks, output in $DDP_OUT"
