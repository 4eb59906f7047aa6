#!/usr/bin/env bash
# gpu-check.sh - one command to know whether ddp works on a GPU node: builds libddp with CUDA and
# NCCL (release, warnings as errors, SASS for this node's GPUs), runs the GPU test suite, runs the
# all-reduce benchmark over every GPU and (with data/mnist) the precision benchmark on one GPU, and
# prints a verdict table (each test passed / failed / skipped and why, the NCCL version, busbw per
# size, samples/s per precision). Exit status 0 when nothing failed.
#
#   srun -N1 --gpus-per-node=N scripts/gpu-check.sh          one node, N GPUs
#   srun -N2 --ntasks-per-node=1 --gpus-per-node=N scripts/gpu-check.sh
#        across nodes: the task of node 0 builds (shared file system), tests and runs the benchmark
#        over all nodes with `srun --overlap --mpi=pmix` (Slurm >= 20.11); the others wait for it.
#   scripts/gpu-check.sh                                      a GPU machine without Slurm
# Options: --build DIR (default build-gpu-check), --max-bytes SIZE (benchmark, default 256M),
#          --arch SM (e.g. 90; default: read from nvidia-smi), --suite NAME (default cuda),
#          -- MESON SETUP OPTIONS...
# Several ranks on one GPU: the suite includes the multi-rank tests with every rank on the one GPU
# through the test-only NCCL of tests/nccl_fake (libddp's comm, reducer, ZeRO and norm tests at 2-4
# ranks; ddp-train's GPT at 2 ranks with --zero 0/1/2, 2 ranks against 1 accumulating, a hung
# collective, a rank killed or frozen). `scripts/gpu-check.sh --suite nccl_fake` runs only those.
#   scripts/gpu-check.sh --nccl-log FILE...   only summarise the transports in NCCL_DEBUG=INFO logs
# Logs: DIR/gpu-check/*.log; NCCL's own log of the benchmark (NCCL_DEBUG=INFO) in DIR/gpu-check/nccl.*.log.
set -uo pipefail

# nccl_transports FILE...: what NCCL chose, from logs written with NCCL_DEBUG=INFO and
# NCCL_DEBUG_SUBSYS including INIT and GRAPH (NET adds the network lines). Prints one line per kind:
#   TRANSPORT N   connections per transport, from "Channel ... via P2P/CUMEM" (P2P/IPC, P2P/direct
#                 pointer: GPU to GPU over NVLink or PCIe), "via SHM/..." (through host memory),
#                 "via NET/IB/0/GDRDMA" (InfiniBand or RoCE, GPUDirect RDMA), "via NET/Socket/0"
#                 (TCP); send and receive sides are counted apart
#   paths I/N N   the path types of NCCL's graphs ("Pattern ..., type NVL/NET"): within a node
#                 (NVL = NVLink; PIX, PXB, PHB, SYS = PCIe, nearest first), between nodes
#   network TEXT  the devices NCCL's IB or Socket transport said it uses
# Returns 1 when no log has a "Channel ... via" line (one rank alone, or the logging was off).
nccl_transports() {
    awk '
        /Channel [0-9]+.* via / {
            t = $0; sub(/.* via /, "", t); split(t, f, "/")
            key = f[1] == "NET" || f[1] == "P2P" ? f[1] "/" f[2] : f[1]
            if (f[1] == "NET" && t ~ /\/GDRDMA/) key = key "/GDRDMA"
            conn[key]++; any = 1
        }
        /Pattern [0-9]+, crossNic .* type / { t = $0; sub(/.* type /, "", t); sub(/,.*/, "", t); paths[t]++ }
        /NET\/(IB|Socket) : Using/ { t = $0; sub(/.*NET\//, "", t); net[t] = 1 }
        END {
            for (k in conn) printf "%s %d\n", k, conn[k] | "sort"
            close("sort")
            for (k in paths) printf "paths %s %d\n", k, paths[k] | "sort"
            close("sort")
            for (k in net) printf "network %s\n", k | "sort"
            close("sort")
            exit !any
        }' "$@"
}

if [ "${1:-}" = --nccl-log ]; then
    shift
    nccl_transports "$@"
    exit
fi
cd "$(dirname "$0")/.." || exit 2
build=build-gpu-check max_bytes=256M arch="" suite=cuda
setup_extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --) shift; setup_extra=("$@"); break ;;
    *) echo "gpu-check.sh: unknown option '$1' (see the top of the script)" >&2; exit 2 ;;
  esac
done
logs=$build/gpu-check
task=${SLURM_PROCID:-0} nodes=${SLURM_NNODES:-1}
export OMPI_MCA_rmaps_base_oversubscribe=1

# Tasks other than node 0's wait for its verdict (the step must hold their nodes meanwhile).
if [ "$task" != 0 ]; then
  for _ in $(seq 7200); do
    [ -f "$logs/verdict.rc" ] && exit "$(cat "$logs/verdict.rc")"
    sleep 1
  done
  echo "gpu-check.sh: task $task: node 0 gave no verdict in 2 h" >&2; exit 1
fi
mkdir -p "$logs"; rm -f "$logs/verdict.rc"
verdict=() failed=0

# note NAME STATUS DETAIL: one row of the verdict table.
note() { verdict+=("$(printf '%-30s %-8s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && failed=1; return 0; }

gpus=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null)
n_gpus=$(grep -c . <<<"$gpus")
if [ "$n_gpus" -eq 0 ]; then
  echo "gpu-check.sh: nvidia-smi lists no GPU on $(hostname): run on a GPU node (srun --gpus-per-node=N)" >&2
  exit 1
fi
[ -n "$arch" ] || arch=$(sed 's/.*, *//; s/\.//' <<<"$gpus" | sort -un | paste -sd, -)
note "node" INFO "$(hostname): $n_gpus GPU(s): $(cut -d, -f1 <<<"$gpus" | sort | uniq -c | xargs), sm_$arch"

# 1. Build.
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release -Dwerror=true -Dcuda=enabled -Dnccl=enabled \
    "-Dgpu_arch=$arch" "${setup_extra[@]}" >"$logs/setup.log" 2>&1
fi
if meson compile -C "$build" >"$logs/compile.log" 2>&1; then
  note "build (CUDA, NCCL)" PASS "release, -Dwerror=true, gpu_arch=$arch"
else
  note "build (CUDA, NCCL)" FAIL "see $logs/setup.log, $logs/compile.log"
  printf '%s\n' "${verdict[@]}"; echo 1 >"$logs/verdict.rc"; exit 1
fi

# 2. The GPU suite (or --suite's), then a verdict per test from meson's log (a skip says why).
meson test -C "$build" --suite "$suite" --print-errorlogs --num-processes 1 >"$logs/tests.log" 2>&1
python3 - "$build/meson-logs/testlog.json" >"$logs/tests.table" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    res = {"OK": "PASS", "SKIP": "SKIP", "EXPECTEDFAIL": "PASS"}.get(t["result"], "FAIL")
    out = (t.get("stdout") or "") + (t.get("stderr") or "")
    why = [l for l in out.splitlines() if "skipped:" in l]
    detail = why[-1].split("skipped:", 1)[1].strip() if why and res == "SKIP" else f"{t['duration']:.1f} s"
    if res == "FAIL":
        detail = "see the test's output in tests.log"
    name = t["name"].split(" / ")[-1].split(":")[-1]  # "ddp:suite / name" or "suite - ddp:name"
    print(f"{name[:30]:30} {res:8} {detail[:110]}")
PY
while IFS= read -r row; do verdict+=("$row"); [[ $row == *" FAIL "* ]] && failed=1; done <"$logs/tests.table"

# 3. The all-reduce benchmark over every GPU of the job.
bench=$build/benchmarks/ddp-allreduce-bench
if [ "$nodes" -gt 1 ]; then
  launch=(srun --overlap --mpi=pmix -N "$nodes" --ntasks-per-node="$n_gpus")
else
  launch=(mpirun --bind-to none -np "$n_gpus")
fi
# NCCL logs its choices (transports per channel, graph path types, network devices) to files of its
# own, one per process, so they do not interleave with the benchmark's table.
rm -f "$logs"/nccl.*.log
if NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET NCCL_DEBUG_FILE="$PWD/$logs/nccl.%h.%p.log" \
    "${launch[@]}" "$bench" --device cuda -e "$max_bytes" >"$logs/bench.log" 2>&1; then
  note "all-reduce benchmark" PASS "$((nodes * n_gpus)) rank(s): ${launch[*]}"
else
  note "all-reduce benchmark" FAIL "see $logs/bench.log"
fi
nccl=$(grep -o 'NCCL [0-9.]* (built against [0-9.]*)' "$logs/bench.log" | head -1)
note "NCCL" INFO "${nccl:-version not reported (see $logs/bench.log)}"
if nccl_transports "$logs"/nccl.*.log >"$logs/transports.txt" 2>/dev/null; then
  note "NCCL transports" INFO "$(grep -v '^paths \|^network ' "$logs/transports.txt" | paste -sd, - | sed 's/,/, /g')"
elif [ "$((nodes * n_gpus))" -eq 1 ]; then
  note "NCCL transports" SKIP "one rank: no peer to connect to"
else
  note "NCCL transports" INFO "not found: no 'Channel ... via' line in $logs/nccl.*.log"
fi

# 4. The precisions on one GPU (benchmarks/gpu_precision.sh: fp32, --tf32, bf16, fp16; cuDNN
#    against the former im2col convolutions), when MNIST is here.
if [ -d data/mnist ]; then
  if benchmarks/gpu_precision.sh "$build" 6 data/mnist >"$logs/precision.log" 2>&1; then
    note "precision benchmark" PASS "one GPU, 6 epochs per row, the first not in samples/s: table below"
  else
    note "precision benchmark" FAIL "see $logs/precision.log"
  fi
else
  note "precision benchmark" SKIP "no data/mnist (scripts/fetch-mnist.sh data/mnist)"
fi

echo
echo "== ddp gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), logs in $logs"
printf '%-30s %-8s %s\n' "check" "verdict" "detail"
printf '%s\n' "${verdict[@]}"
echo
echo "all-reduce (float sum, $((nodes * n_gpus)) rank(s); busbw = algbw * 2(n-1)/n, 0 for one rank):"
awk '/^# +size/ {print "  " substr($0, 3)} /^ +[0-9]+ +[0-9]+ +float/ {print "  " $0}' "$logs/bench.log"
grep -E '^# (Out of bounds|Avg bus)' "$logs/bench.log" | sed 's/^# /  /'
if [ -s "$logs/transports.txt" ]; then
  echo
  echo "NCCL's choices (connections per transport; graph path types within/between nodes, NVL = NVLink;"
  echo "network devices), from $logs/nccl.*.log:"
  sed 's/^/  /' "$logs/transports.txt"
fi
[ -f "$logs/precision.log" ] && { echo; echo "precisions on one GPU (samples/s, ratio to fp32, accuracy):"; sed 's/^/  /' "$logs/precision.log"; }
echo "$failed" >"$logs/verdict.rc"
[ "$failed" = 0 ] && echo "VERDICT: ddp works on this GPU node" || echo "VERDICT: FAILED (see above)"
exit "$failed"
