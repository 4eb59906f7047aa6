#!/bin/sh
# traps.sh - test 8: the known traps end within seconds with a non-zero exit and a message saying
# how to fix them; a failing rank of `-n N` (fork path) stops the others instead of hanging and is
# named; the fork path refuses MPI programs.
# Usage: traps.sh DDP_LAUNCH MPI_HELLO (an Open MPI program).
launch=$1 mpi_prog=$2
fails=0

# srun_env TYPE: the variables a task of `srun -n2 --mpi=TYPE` sees, without PMIx.
srun_env() {
    echo "SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 \
SLURM_STEP_NUM_NODES=1 SLURM_STEP_TASKS_PER_NODE=2 SLURM_JOB_NODELIST=node1 SLURM_STEP_NODELIST=node1 \
SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_MPI_TYPE=$1"
}

# expect NAME PATTERN CMD...: CMD must exit non-zero within 10 s and print PATTERN on stderr.
expect() {
    name=$1 pattern=$2
    shift 2
    start=$(date +%s)
    out=$(timeout 10 "$@" 2>&1 >/dev/null)
    rc=$?
    took=$(( $(date +%s) - start ))
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! printf '%s' "$out" | grep -q -- "$pattern"; then
        echo "FAIL $name: rc=$rc after ${took}s, stderr: $out"
        fails=$((fails + 1))
    else
        echo "ok   $name (rc=$rc, ${took}s): $out"
    fi
}

for type in pmi2 none; do
    # shellcheck disable=SC2046
    expect "open mpi program under srun --mpi=$type (ldd)" "srun --mpi=pmix" \
        env -i PATH="$PATH" $(srun_env $type) "$launch" "$mpi_prog"
    # shellcheck disable=SC2046
    expect "script declared an Open MPI program, --mpi=$type" "SLURM_MPI_TYPE=$type" \
        env -i PATH="$PATH" DDP_MPI_PROGRAM=openmpi $(srun_env $type) "$launch" sh -c 'sleep 60'
done
# shellcheck disable=SC2046
expect "--ntasks-per-node disagrees with the step" "ntasks-per-node" \
    env -i PATH="$PATH" $(srun_env pmix) "$launch" --ntasks-per-node 4 true
# shellcheck disable=SC2046
expect "more local ranks than GPUs" "share-gpus" \
    env -i PATH="$PATH" DDP_SIMULATE_GPUS=1 $(srun_env pmix) "$launch" true
expect "two world sizes" "WORLD_SIZE" \
    env -i PATH="$PATH" OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 \
    OMPI_COMM_WORLD_LOCAL_SIZE=2 RANK=0 WORLD_SIZE=4 "$launch" true
expect "usage error" "bind" "$launch" --bind=sometimes true
# shellcheck disable=SC2016
expect "a failing forked rank stops the others, named" "rank 1 (pid [0-9]*) exited with status 3; stopping the other ranks" \
    env DDP_LOCAL_FORK=1 "$launch" -n 3 sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'
# Forked ranks of an MPI program could not join one job: refused at once, with the fix.
expect "DDP_LOCAL_FORK=1 with an MPI program (ldd)" "cannot join one MPI job.*unset DDP_LOCAL_FORK" \
    env DDP_LOCAL_FORK=1 "$launch" -n 2 "$mpi_prog"
expect "no mpirun in PATH with an MPI program" "mpirun is not in PATH.*apt-get install openmpi-bin" \
    env PATH=/nonexistent DDP_MPI_PROGRAM=openmpi "$launch" -n 2 "$mpi_prog"

# The same launches are accepted once fixed (PMIx present, --share-gpus, a plain program).
# shellcheck disable=SC2046
env -i PATH="$PATH" PMIX_RANK=0 DDP_MPI_PROGRAM=openmpi $(srun_env pmix) "$launch" true >/dev/null ||
    { echo "FAIL: srun --mpi=pmix refused"; fails=$((fails + 1)); }
# shellcheck disable=SC2046
env -i PATH="$PATH" DDP_SIMULATE_GPUS=1 $(srun_env pmix) "$launch" --share-gpus true >/dev/null ||
    { echo "FAIL: --share-gpus refused"; fails=$((fails + 1)); }
# shellcheck disable=SC2046
env -i PATH="$PATH" $(srun_env pmi2) "$launch" true >/dev/null ||
    { echo "FAIL: a non-MPI program under --mpi=pmi2 refused"; fails=$((fails + 1)); }
exit $((fails > 0))
