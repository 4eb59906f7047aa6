# dry_stubs.sh - sourced by benchmarks/gpu_gpt.sh --dry-run: stand-ins for what needs a GPU, so
# that every part's script logic runs on a machine without one (tests/train/gpu_kit.py). Each
# stub prints what the real program prints where gpu_gpt.sh and gpu_gpt.py read it, and nothing
# is measured:
#   nvidia-smi     one GPU ("NVIDIA H200 (dry-run stub)") for the preflight's query; none with
#                  DRY_NO_GPU=1
#   ncu            writes its --log-file as ncu's CSV (details page) of a few kernels
#   mpirun         writes the --trace and --metrics files the zero part reads
#   ddp-train      step lines, "step N: val loss" with --val-every, a --metrics summary; out of
#                  memory above B $DRY_MAX_BATCH (default 48); with DRY_FAIL=DDP_X it fails at
#                  step 1 (an illegal memory access) unless DDP_X holds its off value
#   train_gpt2cu   llm.c's step lines and its average iteration time (and its -nocudnn twin)
#   the suite      meson-tests.json with a test that passes and one that skips (77)
# dry_setup DIR sets build, baseline, llmc and data (where unset) to the stubs' and puts DIR/bin
# first on PATH; dry_cleanup DIR removes it all.

# dry_stub PATH: writes standard input to PATH as an executable script.
dry_stub() {
  cat >"$1" && chmod +x "$1"
}

dry_setup() {
  local d=$1
  rm -rf "$d"
  mkdir -p "$d/bin" "$d/new/train" "$d/new/tests/nccl_fake" "$d/base/train" "$d/llmc" "$d/data"
  export DRY_FAIL=${dry_fail:-} PATH="$d/bin:$PATH"
  dry_stub "$d/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# dry-run stub of nvidia-smi: the fields of --query-gpu for one GPU
q=""
for a in "$@"; do case $a in --query-gpu=*) q=${a#--query-gpu=} ;; esac; done
[ "${DRY_NO_GPU:-0}" = 1 ] && { echo "No devices were found"; exit 6; }
[ -n "$q" ] || { echo "NVIDIA H200 (dry-run stub)"; exit 0; }
out=()
IFS=, read -r -a f <<<"$q"
for x in "${f[@]}"; do
  case $x in
    name) out+=("NVIDIA H200 (dry-run stub)") ;;
    driver_version) out+=("580.00") ;;
    memory.total) out+=("143771 MiB") ;;
    memory.free) out+=("143000 MiB") ;;
    *) out+=("?") ;;
  esac
done
(IFS=,; echo "${out[*]}") | sed 's/,/, /g'
EOF
  dry_stub "$d/bin/ncu" <<'EOF'
#!/usr/bin/env bash
# dry-run stub of Nsight Compute: --log-file gets a CSV of a few kernels (details page)
log=""
while [ $# -gt 0 ]; do [ "$1" = --log-file ] && log=$2; shift; done
[ -n "$log" ] || exit 0
h='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
{
  echo "==PROF== dry-run stub"
  echo "$h"
  i=0
  for k in "flash_fwd2_kernel<1>(args)" "flash_bwd_kv2_kernel<1>(args)" "nvjet_sm90_tst_256x128(args)" \
      "cudnn_generated_fort_native_sdpa_sm90_flash_fprop(args)" "layernorm_fwd_kernel<unsigned short>(args)"; do
    for rep in 1 2; do
      echo "\"$i\",\"1\",\"ddp-train\",\"dry\",\"void $k\",\"1\",\"7\",\"(128, 1, 1)\",\"(192, 16, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"nsecond\",\"$((100000 * (i % 5 + 1)))\""
      i=$((i + 1))
    done
  done
} >"$log"
EOF
  dry_stub "$d/bin/mpirun" <<'EOF'
#!/usr/bin/env bash
# dry-run stub of mpirun for gpu_gpt.sh's zero part: the --trace and --metrics files it reads
trace="" metrics=""
while [ $# -gt 0 ]; do
  case $1 in --trace) trace=$2 ;; --metrics) metrics=$2 ;; esac
  shift
done
[ -n "$trace" ] && echo '{"traceEvents":[{"pid":0,"ph":"X","name":"allgather","args":{"arg":"b0"}},{"pid":0,"ph":"X","name":"step"},{"pid":1,"ph":"X","name":"allgather","args":{"arg":"b0"}}]}' >"$trace"
[ -n "$metrics" ] && echo '{"summary":true,"gather_wait_ms":0.1,"allgather_calls":5}' >"$metrics"
echo "mpirun (dry-run stub): 2 ranks"
EOF
  local t
  for t in new base; do
    dry_stub "$d/$t/train/ddp-train" <<'EOF'
#!/usr/bin/env bash
# dry-run stub of ddp-train --model gpt2: step lines, a validation line, a --metrics summary
B=16 N=20 metrics="" val=0
while [ $# -gt 0 ]; do
  case $1 in --batch) B=$2 ;; --max-steps) N=$2 ;; --metrics) metrics=$2 ;; --val-every) val=$2 ;; esac
  shift
done
echo "ddp-train (dry-run stub): B $B, $N steps${DRY_FAIL:+, fails unless $DRY_FAIL is off}"
if [ -n "${DRY_FAIL:-}" ]; then
  off=0; [ "$DRY_FAIL" = DDP_FLASH_LOADS ] && off=plain
  if [ "${!DRY_FAIL:-}" != "$off" ]; then
    echo "[rank 0 dry] cuda_gpt.cu:1: an illegal memory access was encountered (stub: $DRY_FAIL on)"
    exit 1
  fi
fi
[ "$B" -gt "${DRY_MAX_BATCH:-48}" ] && { echo "[rank 0 dry] error: cudaMalloc: out of memory"; exit 1; }
for ((s = 1; s <= N; s++)); do
  sleep 0.003
  echo "step $s/$N | loss 7.0 | 55.1 ms/step | 297402 tokens/s"
done
[ "$val" -gt 0 ] && echo "step $N: val loss 5.5820"
[ -n "$metrics" ] && echo '{"summary":true,"tokens_per_s":297402,"mem_device_used_mib":14709}' >"$metrics"
exit 0
EOF
    echo "dry-run stub ($t)" >"$d/$t/ddp-version.txt"
  done
  : >"$d/new/tests/nccl_fake/libfakenccl.so"
  dry_stub "$d/llmc/train_gpt2cu" <<'EOF'
#!/usr/bin/env bash
# dry-run stub of llm.c's train_gpt2cu: its step lines and average
B=16 N=20
while [ $# -gt 0 ]; do case $1 in -b) B=$2 ;; -x) N=$2 ;; esac; shift; done
for ((s = 1; s <= N; s++)); do
  printf "step %4d/%d | loss 7.000000 (+nanz)| norm 1.0000 (+nanz)| lr 6.00e-04 | 33.13 ms | 40.6%% bf16 MFU | 494500 tok/s\n" "$s" "$N"
done
echo "total average iteration time: 33.130000 ms"
EOF
  cp "$d/llmc/train_gpt2cu" "$d/llmc/train_gpt2cu-nocudnn"
  echo "dry-run stub" >"$d/llmc/VERSION"
  dry_stub "$d/new/tests/pass.sh" <<<$'#!/usr/bin/env bash\necho "dry-run stub test: passed"'
  dry_stub "$d/new/tests/skip.sh" <<<$'#!/usr/bin/env bash\necho "dry-run stub test: skipped: no GPU (stub)"; exit 77'
  python3 - "$d/new" <<'EOF'
import json, sys
b = sys.argv[1]
env = {"DDP_TEST_BUILDDIR": b, "DDP_TEST_SRCDIR": b.rsplit("/", 1)[0]}
tests = [{"name": n, "cmd": [f"{b}/tests/{n}.sh"], "suite": ["ddp:cuda"], "env": env,
          "timeout": 30, "workdir": None} for n in ("pass", "skip")]
json.dump(tests, open(f"{b}/meson-tests.json", "w"))
EOF
  : >"$d/data/austen_train_000001.bin"
  : >"$d/data/austen_val_000000.bin"
  build=${build:-$d/new} baseline=${baseline:-$d/base} llmc=${llmc:-$d/llmc/train_gpt2cu}
  [ "$data" != data/text/austen ] || data=$d/data/austen
}

dry_cleanup() {
  rm -rf "$1"
}
