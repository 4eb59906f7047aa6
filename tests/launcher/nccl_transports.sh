#!/bin/sh
# nccl_transports.sh - scripts/gpu-check.sh's summary of NCCL_DEBUG=INFO logs, on sample logs (no GPU
# needed): connections counted per transport (P2P, SHM, NET/IB with GPUDirect RDMA, NET/Socket),
# the graphs' path types and the network devices; a log without channels is an error.
# Usage: nccl_transports.sh GPU_CHECK_SH DATA_DIR
gpu_check=$1 data=$2
fails=0

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

summary() { bash "$gpu_check" --nccl-log "$@" | paste -sd'|' -; }

check "2 nodes, NVLink within, InfiniBand between" "$(summary "$data/nccl-ib-nvlink.log")" \
    "NET/IB/GDRDMA 4|P2P/CUMEM 3|paths NVL/NET 2|network IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.10.0.11<0>"
check "no P2P and no InfiniBand: host memory within, TCP between" "$(summary "$data/nccl-socket-shm.log")" \
    "NET/Socket 2|SHM 1|paths SYS/NET 1|network Socket : Using [0]eth0:192.168.1.17<0>"
check "several logs add up" "$(summary "$data/nccl-ib-nvlink.log" "$data/nccl-socket-shm.log" | cut -d'|' -f1-4)" \
    "NET/IB/GDRDMA 4|NET/Socket 2|P2P/CUMEM 3|SHM 1"
grep -v ' via ' "$data/nccl-ib-nvlink.log" >"${TMPDIR:-/tmp}/nccl-no-channels.$$.log"
bash "$gpu_check" --nccl-log "${TMPDIR:-/tmp}/nccl-no-channels.$$.log" >/dev/null
check "a log without channel lines: exit status" "$?" 1
rm -f "${TMPDIR:-/tmp}/nccl-no-channels.$$.log"
exit $((fails > 0))
