#!/bin/bash
# shared_gpu_allowed.sh COMMAND... - runs a 2-rank ddp_init (COMMAND: mpirun ... fake_rank.sh
# with fake_cuda.so, which shows every rank the same single GPU) and passes when libddp allowed
# the shared GPU because the fake NCCL is in use, instead of refusing it. Whatever ddp_init did
# next does not count: without a GPU opening the simulated device fails, with one it succeeds.
out=$(timeout 60 "$@" 2>&1)
echo "$out"
if ! grep -q 'share GPU .*: allowed, the NCCL in use is the test-only fake' <<<"$out"; then
    echo "FAIL: libddp did not say it allows the shared GPU under the fake NCCL"
    exit 1
fi
if grep -q 'would share GPU' <<<"$out"; then
    echo "FAIL: libddp refused the shared GPU under the fake NCCL"
    exit 1
fi
echo "PASS: the shared GPU was allowed under the fake NCCL"
