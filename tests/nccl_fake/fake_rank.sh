#!/bin/sh
# fake_rank.sh LIBFAKENCCL PROGRAM [ARGS...] - one rank of a libddp test under the fake NCCL:
# mpirun -np N fake_rank.sh .../libfakenccl.so test_comm --backend cuda.
# The fake goes in front of the real NCCL for PROGRAM only (LD_PRELOAD set here, not in mpirun's
# environment, so mpirun itself never loads it). OMPI_COMM_WORLD_LOCAL_SIZE is removed because
# the multi-rank CUDA tests skip themselves when a host has fewer GPUs than ranks (they read it
# for that check only); libddp takes the local size from MPI, which still sees every rank.
set -e
lib=$1
shift
unset OMPI_COMM_WORLD_LOCAL_SIZE
LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
export LD_PRELOAD
exec "$@"
