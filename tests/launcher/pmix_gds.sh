#!/bin/sh
# pmix_gds.sh - under srun --mpi=pmix (Slurm's variables and PMIX_RANK) ddp-launch exports
# PMIX_MCA_gds=hash, the workaround for Open MPI 4.1's start-up crash with PMIx's shared-memory data
# store (launcher/ddp_launch.c, export_layout); a value the user set is kept, and nothing is exported
# without PMIx or outside srun. Usage: pmix_gds.sh DDP_LAUNCH
launch=$1
fails=0

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

# srun_rank [NAME=VALUE...]: what rank 1 of a 2-task srun step sees as PMIX_MCA_gds
srun_rank() {
    # shellcheck disable=SC2016  # expanded by the rank's shell
    env -i PATH="$PATH" SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=1 SLURM_NODEID=0 \
        SLURM_STEP_NUM_NODES=1 SLURM_STEP_TASKS_PER_NODE=2 SLURM_JOB_ID=7 SLURM_STEP_ID=0 \
        SLURM_STEP_NODELIST=node1 DDP_MPI_PROGRAM=none "$@" "$launch" --bind=none \
        sh -c 'echo "gds=${PMIX_MCA_gds-unset}"' 2>&1
}

check "srun --mpi=pmix: the hash data store" "$(srun_rank PMIX_RANK=1 PMIX_NAMESPACE=slurm.pmix.7.0)" "gds=hash"
check "srun --mpi=pmix, PMIX_MCA_gds set by the user: kept" \
    "$(srun_rank PMIX_RANK=1 PMIX_NAMESPACE=slurm.pmix.7.0 PMIX_MCA_gds=ds21)" "gds=ds21"
check "srun without PMIx: nothing exported" "$(srun_rank)" "gds=unset"
# shellcheck disable=SC2016
out=$(env -i PATH="$PATH" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "$launch" --bind=none \
    sh -c 'echo "gds=${PMIX_MCA_gds-unset}"' 2>&1)
check "torchrun-style variables: nothing exported" "$out" "gds=unset"
exit $((fails > 0))
