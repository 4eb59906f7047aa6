#!/usr/bin/env bash
# gpu_gpt.sh - GPT-2 d12 on one GPU in one go, for a lent machine with minutes to spare. First a
# preflight (the GPU, driver, CUDA, cuBLAS, cuDNN, NCCL, nvrtc, free memory; a library a part
# needs that is missing stops that part with the reason). Then the parts, always in this order,
# each bounded so that the parts after it keep their share of --budget:
#   bench    ddp-train --model gpt2 --gpt-config d12 --seq 1024 --precision bf16 of the NEW build
#            at --batch 16 first; when that fails for a reason other than memory, once more with
#            every switch of models/ops/switches.h off (run 4's path), and when that trains, a
#            bisection of the switches with the time left, whose last line names the change that
#            failed. Then, while the part's time lasts: the new build with DDP_CUDA_ATTENTION=cudnn
#            (BENCH_CUDNN=0 leaves it out), the BASELINE build (--baseline) at B 16, the largest
#            batch of --batches that trains (tried in descending order; no --recompute),
#            DDP_CUDA_ATTENTION=materialized (BENCH_MATERIALIZED=1) and FLASH_IMPLS="1 3".
#   ncu      Nsight Compute over ONE steady step (step 3) of the new build at B 16, as it trained
#            in bench (with the switches off if it needed them), summed per kernel
#   suite    the CUDA suite of the carried build (benchmarks/run_suite.py, no meson needed)
#   llmc     llm.c's train_gpt2cu from random init (-e d12) on the same shards at B 16 and the
#            largest batch of bench
#   and, when named: ncu_llmc (llm.c's cuDNN attention kernels at B 16, ms a step), loss (200
#   steps, bf16 against fp32 activations), size (d48 at the largest batch that trains), zero (d12
#   at 2 ranks on the one GPU through tests/nccl_fake, --zero 1 and 2).
# A summary table comes last (also in OUT/summary.txt).
#
#   benchmarks/gpu_gpt.sh --build DIR [--baseline DIR] [--llmc PATH] [--data PREFIX] [--out DIR]
#       [--steps N] [--parts bench,ncu,suite,llmc[,ncu_llmc,loss,size,zero]] [--batches "64 48 32"]
#       [--budget SECONDS] [--peak TFLOPS] [--device cuda] [--suite-only TEST,TEST...]
#       [--dry-run [--dry-fail DDP_SWITCH] [--dry-hide LIB,...]]
#
# --build/--baseline: build folders holding train/ddp-train (and runtime/libddp.so*); the suite
# needs --build's meson-tests.json (`meson introspect --tests BUILD > BUILD/meson-tests.json`).
# --llmc: train_gpt2cu (PATH-nocudnn beside it is tried when PATH fails to start or its libraries
# are missing). --data: shards PREFIX_train_*.bin and PREFIX_val_*.bin (default
# data/text/austen). --steps (default 20): steady tokens/s are steps 2..N, for ddp-train from the
# arrival times of each step's progress line, for llm.c from its own per-step ms (run under stdbuf
# -oL, but its lines' arrival is not relied on; gpu_gpt.py says why); MFU in llm.c's convention
# (803.5 MFLOP/token at T 1024, 989.4 TFLOP/s). --parts names the parts to run (the order above
# holds whatever order they are named in). How long: about 7-8 minutes on an H100 with the four
# default parts (bench 2-4 minutes, ncu ~1, suite ~2, llm.c 2 runs); every run has a timeout, each
# part ends by its share (PART_MIN_S below keeps for each later part its minimum), and the whole
# stays within --budget (default 500 s): what is left over is reported as not run.
# --dry-run walks every part's logic on a machine without a GPU: stubs in OUT/.dry stand for
# nvidia-smi, ncu, mpirun, ddp-train (both builds), llm.c and the suite's tests, and print what
# the real ones print; --dry-fail DDP_X makes the new build fail at step 1 unless DDP_X=0 (the
# retry and the bisection then run and must name DDP_X); --dry-hide cudnn,nvrtc has the preflight
# treat those libraries as absent. tests/train/gpu_kit.py runs it in the test command.
# Outputs in --out (at most 8 files): summary.txt, suite.txt, suite.log, bench.log, runs.jsonl,
# ncu.csv, ncu_kernels.txt (ncu_llmc appends its table there).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build="" baseline="" llmc="" data=data/text/austen out=gpu-gpt-out steps=20
parts=bench,ncu,suite,llmc batches="64 48 32" budget=500 peak=989.4 device=cuda seq=1024
suite_only="" dry=0 dry_fail="" dry_hide=""
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --llmc) llmc=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --peak) peak=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --suite-only) suite_only=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --dry-fail) dry_fail=$2; shift 2 ;;
    --dry-hide) dry_hide=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_gpt.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] || [ "$dry" = 1 ] || { echo "gpu_gpt.sh: --build DIR is required (--help)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ "$dry" = 1 ]; then
  # shellcheck source=benchmarks/gpu_kit/dry_stubs.sh
  source "$here/gpu_kit/dry_stubs.sh"
  dry_setup "$out/.dry" # sets build, baseline, llmc, data where they are unset; PATH first
fi

# The switches of models/ops/switches.h (each 0: run 4's path) and the older one for the loads.
SWITCHES="DDP_LT_BIAS16 DDP_LT_EPILOGUES DDP_GPT_LOGITS16 DDP_ADD_LN_FUSED DDP_LN_BWD_FUSED
  DDP_ENC_SEG DDP_FLASH_BF16_OUT DDP_CLIP_DEVICE DDP_GPT_READ_COPY DDP_FLASH_LOADS"
off_value() { [ "$1" = DDP_FLASH_LOADS ] && echo plain || echo 0; }

# Each part's minimum in seconds, kept for it from the parts before (PART_MIN_S_<part>).
declare -A part_min=([bench]=${PART_MIN_S_bench:-90} [ncu]=${PART_MIN_S_ncu:-60}
  [suite]=${PART_MIN_S_suite:-60} [llmc]=${PART_MIN_S_llmc:-50} [ncu_llmc]=${PART_MIN_S_ncu_llmc:-45}
  [loss]=${PART_MIN_S_loss:-60} [size]=${PART_MIN_S_size:-60} [zero]=${PART_MIN_S_zero:-45})
ORDER="bench ncu suite llmc ncu_llmc loss size zero"
t0=$SECONDS
part_end=$budget # seconds after t0 at which the running part ends
left() { echo $((part_end - (SECONDS - t0))); }
# cap SECONDS: the smaller of SECONDS and the part's time left (at least 1)
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }
py() { python3 "$here/gpu_gpt.py" --peak "$peak" "$@"; }
# py with the switches the new build trained with (bench's retry and bisection: NEW_ENV)
py_new() { env "${NEW_ENV[@]}" python3 "$here/gpu_gpt.py" --peak "$peak" "$@"; }
rm -f "$out"/{summary.txt,suite.txt,suite.log,bench.log,runs.jsonl,ncu.csv,ncu_kernels.txt,ncu_llmc.csv}
runs=$out/runs.jsonl log=$out/bench.log
touch "$runs"

# The header: when, where, what; then the preflight.
{
  echo "== gpu_gpt.sh $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)$([ "$dry" = 1 ] && echo ' (DRY RUN: stubs, nothing measured)')"
  for b in "$build" "$baseline"; do
    [ -n "$b" ] && echo "build $b: $(cat "$b/ddp-version.txt" 2>/dev/null || git -C "$b/.." describe --always --dirty 2>/dev/null || echo '?')"
  done
  [ -n "$llmc" ] && echo "llm.c: $llmc ($(head -1 "$(dirname "$llmc")/VERSION" 2>/dev/null || echo 'version unknown'))"
  py preflight --build "$build" ${llmc:+--llmc "$llmc"} --env "$out/.preflight.sh" ${dry_hide:+--hide "$dry_hide"}
} >"$out/header.txt"
cat "$out/header.txt"
PF_GPU=0 PF_DDP_MISSING="" PF_LLMC_MISSING="" PF_CUDNN=0 PF_NVRTC=0
# shellcheck source=/dev/null
[ -f "$out/.preflight.sh" ] && source "$out/.preflight.sh"
rm -f "$out/.preflight.sh"
compgen -G "${data}_train_*.bin" >/dev/null || echo "gpu_gpt.sh: no shards ${data}_train_*.bin (--data PREFIX)"

# Why a part that needs a GPU and ddp-train cannot run here ("": it can).
ddp_blocked() {
  [ "$PF_GPU" = 1 ] || { echo "no GPU (preflight)"; return; }
  [ -z "$PF_DDP_MISSING" ] || echo "ddp-train cannot start: $PF_DDP_MISSING not found (preflight)"
}

ddp_cmd() {  # ddp_cmd BUILD B STEPS: the ddp-train command line, in the array cmd
  cmd=("$1/train/ddp-train" --model gpt2 --gpt-config d12 --seq "$seq" --batch "$2" --precision bf16
    --device "$device" --max-steps "$3" --epochs 1000 --log-every 1 --val-max-batches 1
    --data "${data}_train_*.bin" --val-data "${data}_val_*.bin")
}

# train_ddp LABEL BUILD B [STEPS]: one run; exit 0 trained, 3 out of memory, 4 no GPU, else
# another failure. The environment's switches apply (NEW_ENV in bench's retry).
train_ddp() {
  local l n=${4:-$steps}; l=$(left)
  [ "$l" -gt 15 ] || { echo "gpu_gpt: $1 B $3: not run (budget spent)"; return 1; }
  ddp_cmd "$2" "$3" "$n"
  rm -f "$out/.metrics.json"
  py_new train --label "$1" --batch "$3" --seq "$seq" --steps "$n" --runs "$runs" --log "$log" \
    --metrics "$out/.metrics.json" --timeout "$(cap 150)" -- "${cmd[@]}" --metrics "$out/.metrics.json"
}

# The switches' assignments for env: every switch of the list $1 off.
switches_off() { local s; for s in $1; do echo "$s=$(off_value "$s")"; done; }

# The new build at B 16 with every switch off, then the bisection. Returns 0 when a configuration
# trained (NEW_ENV and NEW_LABEL then hold it), else the failure's exit status.
NEW_ENV=() NEW_LABEL=new
retry_switches_off() {
  echo "gpu_gpt: new failed at B 16 for a reason other than memory: once more with every switch" \
    "of models/ops/switches.h off (run 4's path: $(echo $SWITCHES | tr ' ' ','))"
  mapfile -t NEW_ENV < <(switches_off "$SWITCHES")
  train_ddp new-run4-path "$build" 16
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "gpu_gpt: new fails with every switch off too (exit $rc): not one of the changes since" \
      "run 4 alone (bench.log has its output)"
    NEW_ENV=()
    return $rc
  fi
  NEW_LABEL=new-run4-path
  bisect_switches
  return 0
}

# One culprit among the switches, by halves: the candidates' second half off, the first on (the
# switches already cleared on); a failure puts the culprit in the first half. Short runs (4
# steps); stops when the part's time runs out, naming what is left.
bisect_switches() {
  local cand=($SWITCHES) k=0 n half on off rc
  while [ ${#cand[@]} -gt 1 ]; do
    [ "$(left)" -gt 40 ] || { echo "gpu_gpt: bisection stopped (budget): the change that failed is one of ${cand[*]}"; return; }
    n=${#cand[@]} half=$((n / 2)) k=$((k + 1))
    on="${cand[*]:0:half}" off="${cand[*]:half}"
    echo "gpu_gpt: bisect $k: on: $on; off: $off"
    mapfile -t NEW_ENV < <(switches_off "$off")
    train_ddp "bisect-$k" "$build" 16 4
    rc=$?
    if [ $rc -eq 0 ]; then cand=($off); else cand=(${on}); fi
  done
  echo "gpu_gpt: the change that failed: ${cand[0]} (off: ${cand[0]}=$(off_value "${cand[0]}");" \
    "docs/running.md says what it restores)"
  mapfile -t NEW_ENV < <(switches_off "${cand[0]}")
  if [ "$(left)" -gt 40 ]; then # only it off: confirmed, or another change fails too
    train_ddp "new-without-${cand[0]#DDP_}" "$build" 16 4 && NEW_LABEL="new-without-${cand[0]#DDP_}" &&
      echo "gpu_gpt: confirmed: with only ${cand[0]} off the new build trains" && return
    echo "gpu_gpt: with only ${cand[0]} off it still fails: more than one change fails; every switch stays off"
  fi
  mapfile -t NEW_ENV < <(switches_off "$SWITCHES")
}

# bench LABEL BUILD: one run at B 16
declare -A best_b=()
bench() {
  echo "-- $1: $2"
  [ -x "$2/train/ddp-train" ] || { echo "gpu_gpt: $1: no $2/train/ddp-train"; return; }
  train_ddp "$1" "$2" 16
}

# largest LABEL BUILD RC16: the largest batch of $batches that trains, after B 16 ended with RC16
largest() {
  local b rc=$3
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "gpu_gpt: $1 failed at B 16 for a reason other than memory: no largest-batch search"; return
  fi
  for b in $batches; do
    [ "$b" -gt 16 ] || continue
    train_ddp "$1" "$2" "$b"
    rc=$?
    if [ $rc -eq 0 ]; then best_b[new]=$b; return; fi
    [ $rc -eq 3 ] || { echo "gpu_gpt: $1 B $b failed for a reason other than memory: stopping the search"; return; }
  done
}

part_bench() {
  echo "== bench: ddp-train GPT-2 d12, T $seq, bf16, $steps steps per run"
  local why; why=$(ddp_blocked)
  [ -z "$why" ] || { echo "gpu_gpt: bench skipped: $why"; return; }
  echo "-- new: $build"
  train_ddp new "$build" 16
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 4 ]; then
    retry_switches_off
    rc=$?
  fi
  [ $rc -eq 0 ] && best_b[new]=16
  # cuDNN's fused attention (models/ops/cuda_sdpa.cu; BENCH_CUDNN=0 leaves it out): needs cuDNN
  # 9.10.2 or newer (the gate would run the project's kernel) and nvrtc (runtime compilation)
  if [ "${BENCH_CUDNN:-1}" = 1 ]; then
    if [ "$PF_NVRTC" != 1 ]; then echo "gpu_gpt: new-cudnn skipped: nvrtc not found (cuDNN's runtime-compiled attention engines need it)"
    elif [ "$PF_CUDNN" -lt 91002 ]; then echo "gpu_gpt: new-cudnn skipped: cuDNN $PF_CUDNN found, the attention graphs need 91002 (9.10.2) or newer"
    else DDP_CUDA_ATTENTION=cudnn bench new-cudnn "$build"
    fi
  fi
  [ -n "$baseline" ] && bench baseline "$baseline"
  largest "$NEW_LABEL" "$build" $rc
  # the same build with the reference attention (bf16 GEMMs around the T x T softmax: 115.9 ms a
  # step in run 1, 2026-11-27); BENCH_MATERIALIZED=1 adds it
  [ "${BENCH_MATERIALIZED:-0}" = 1 ] && DDP_CUDA_ATTENTION=materialized bench new-materialized "$build"
  # the fused kernel's implementations (cuda_flash.h: 1 = v1, 2 = v2 forward, 3 = v2 both ways)
  [ -n "${FLASH_IMPLS:-}" ] && for v in $FLASH_IMPLS; do DDP_FLASH_IMPL=$v bench "new-flash$v" "$build"; done
  return 0
}

part_suite() {
  echo "== suite: the CUDA tests of $build (benchmarks/run_suite.py)"
  if [ ! -f "$build/meson-tests.json" ]; then
    echo "gpu_gpt: no $build/meson-tests.json (meson introspect --tests BUILD > BUILD/meson-tests.json)" | tee "$out/suite.txt"
    return
  fi
  local why; why=$(ddp_blocked)
  [ -z "$why" ] || { echo "gpu_gpt: suite skipped: $why" | tee "$out/suite.txt"; return; }
  local d; d=$(cap "${SUITE_S:-180}")  # SUITE_S: seconds for the whole suite (default 180)
  timeout $((d + 15)) python3 "$here/run_suite.py" "$build/meson-tests.json" --suite cuda \
    --log "$out/suite.log" --deadline "$d" --timeout-cap 120 ${suite_only:+--only "$suite_only"} 2>&1 |
    tee "$out/suite.txt"
}

part_llmc() {
  echo "== llm.c: $llmc"
  if [ -z "$llmc" ] || [ ! -x "$llmc" ]; then echo "gpu_gpt: llm.c skipped (no --llmc PATH)"; return; fi
  [ "$PF_GPU" = 1 ] || { echo "gpu_gpt: llm.c skipped: no GPU (preflight)"; return; }
  local bs="16 ${best_b[new]:-}" exe=$llmc tag="llm.c" sb=env
  if [ -n "$PF_LLMC_MISSING" ]; then
    [ -x "$llmc-nocudnn" ] || { echo "gpu_gpt: llm.c skipped: $PF_LLMC_MISSING not found (preflight)"; return; }
    echo "gpu_gpt: llm.c: $PF_LLMC_MISSING not found (preflight): its build without cuDNN runs"
    exe=$llmc-nocudnn tag="llm.c (no cuDNN)"
  fi
  # llm.c's printf through a pipe is block-buffered: stdbuf -oL makes bench.log's stamps real
  command -v stdbuf >/dev/null && sb="stdbuf -oL"
  for b in $(echo "$bs" | tr ' ' '\n' | awk '!seen[$0]++'); do
    [ "$(left)" -gt 15 ] || { echo "gpu_gpt: llm.c B $b: not run (budget spent)"; continue; }
    py train --label "$tag" --kind llmc --batch "$b" --seq "$seq" --steps "$steps" --runs "$runs" \
      --log "$log" --timeout "$(cap 120)" -- $sb "$exe" -i "${data}_train_*.bin" -j "${data}_val_*.bin" \
      -e d12 -b "$b" -t "$seq" -x "$steps" -v 100000 -m 1 -s 0
    rc=$?
    # exit 3: out of memory, 4: no GPU; any other failure of the cuDNN build: try the one without
    if [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 4 ] && [ "$exe" = "$llmc" ] && [ -x "$llmc-nocudnn" ]; then
      echo "gpu_gpt: $llmc failed: trying $llmc-nocudnn (llm.c's own attention kernels, no cuDNN)"
      exe=$llmc-nocudnn tag="llm.c (no cuDNN)"
      py train --label "$tag" --kind llmc --batch "$b" --seq "$seq" --steps "$steps" --runs "$runs" \
        --log "$log" --timeout "$(cap 120)" -- $sb "$exe" -i "${data}_train_*.bin" -j "${data}_val_*.bin" \
        -e d12 -b "$b" -t "$seq" -x "$steps" -v 100000 -m 1 -s 0
    fi
  done
}

find_ncu() { command -v ncu || compgen -G "/usr/local/cuda/bin/ncu" || compgen -G "/opt/nvidia/nsight-compute/*/ncu" | head -1; }

part_ncu() {
  echo "== ncu: one steady step (step 3) of $build at B 16${NEW_ENV[*]:+ with ${NEW_ENV[*]}}"
  local why; why=$(ddp_blocked)
  [ -z "$why" ] || { echo "gpu_gpt: ncu skipped: $why" | tee "$out/ncu_kernels.txt"; return; }
  local ncu; ncu=$(find_ncu)
  if [ -z "$ncu" ]; then echo "gpu_gpt: ncu not found: per-kernel table skipped" | tee "$out/ncu_kernels.txt"; return; fi
  [ "$(left)" -gt 30 ] || { echo "gpu_gpt: ncu not run (budget spent)" | tee "$out/ncu_kernels.txt"; return; }
  # --clock-control none: the card's own clocks (ncu would lock them to base), --cache-control
  # none: no cache flush between kernels, as in training; DDP_PROFILE_STEP brackets step 3 with
  # cudaProfilerStart/Stop, so only its kernels are profiled.
  ddp_cmd "$build" 16 3
  echo "==== ncu: ${NEW_ENV[*]} ${cmd[*]}" >>"$log"
  env "${NEW_ENV[@]}" DDP_PROFILE_STEP=3 timeout "$(cap 150)" "$ncu" --profile-from-start off \
    --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$out/ncu.csv" "${cmd[@]}" >>"$log" 2>&1
  echo "ncu exit $? (its CSV: ncu.csv; the program's output: bench.log)"
  local ms; ms=$(python3 -c "
import json,sys
r=[json.loads(l) for l in open(sys.argv[1])]
r=[x for x in r if x['label']==sys.argv[2] and x['batch']==16 and x['ok']]
print(r[0]['ms_per_step'] if r else 0)" "$runs" "$NEW_LABEL")
  py ncu "$out/ncu.csv" --step-ms "$ms" --also "$log" | tee "$out/ncu_kernels.txt"
}

# llm.c's attention at B 16 (cuDNN's fused kernels, the speed issue 25's attention is measured
# against): only the kernels whose names say attention, softmax or cuDNN, over a run of 3 steps
# (its validation passes at steps 0 and 3 add forward calls), each kernel's time per call x 12
# calls a step (one per layer). Compare with the attention rows of the ncu part's table.
part_ncu_llmc() {
  echo "== ncu: llm.c's attention kernels at B 16 (time per call x 12 layers)"
  if [ -z "$llmc" ] || [ ! -x "$llmc" ]; then echo "gpu_gpt: ncu of llm.c skipped (no --llmc PATH)"; return; fi
  [ "$PF_GPU" = 1 ] || { echo "gpu_gpt: ncu of llm.c skipped: no GPU (preflight)"; return; }
  [ -z "$PF_LLMC_MISSING" ] || { echo "gpu_gpt: ncu of llm.c skipped: $PF_LLMC_MISSING not found (preflight)"; return; }
  local ncu; ncu=$(find_ncu)
  [ -n "$ncu" ] || { echo "gpu_gpt: ncu not found"; return; }
  [ "$(left)" -gt 40 ] || { echo "gpu_gpt: ncu of llm.c not run (budget spent)"; return; }
  echo "==== ncu of llm.c" >>"$log"
  timeout "$(cap 120)" "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --kernel-name 'regex:cudnn|sdpa|flash|fmha|ttention|oftmax' \
    --log-file "$out/ncu_llmc.csv" "$llmc" -i "${data}_train_*.bin" -j "${data}_val_*.bin" -e d12 \
    -b 16 -t "$seq" -x 3 -v 100000 -m 1 -s 0 >>"$log" 2>&1
  echo "ncu exit $?"
  # appended to ncu_kernels.txt, the CSV removed: the device tool brings back 8 files
  { echo; echo "llm.c, B 16:"; py ncu "$out/ncu_llmc.csv" --per-call 12; } | tee -a "$out/ncu_kernels.txt"
  rm -f "$out/ncu_llmc.csv"
}

# d12 at 2 ranks on the one GPU through the test-only NCCL (tests/nccl_fake), --zero 1 and 2, 5
# steps, traced: the parameters' all-gathers per bucket and step, the forward's gather waits and
# stage 2's mid-backward waits (host spans and CUDA-timed instants), the --metrics fields. The fake
# stages every collective through host memory and MPI: its times say nothing of NCCL's.
part_zero() {
  echo "== zero: d12, T $seq, bf16, B 4 per rank, 2 ranks on one GPU (the test-only NCCL), 5 steps"
  local lib=$build/tests/nccl_fake/libfakenccl.so z why; why=$(ddp_blocked)
  [ -z "$why" ] || { echo "gpu_gpt: zero skipped: $why"; return; }
  [ -f "$lib" ] || { echo "gpu_gpt: no $lib (a build with CUDA and NCCL has it)"; return; }
  for z in 1 2; do
    [ "$(left)" -gt 30 ] || { echo "gpu_gpt: zero $z: not run (budget spent)"; continue; }
    ddp_cmd "$build" 4 5
    echo "==== zero $z: mpirun -np 2 fake_rank.sh ${cmd[*]} --zero $z" >>"$log"
    env "${NEW_ENV[@]}" timeout "$(cap 90)" mpirun -np 2 "$here/../tests/nccl_fake/fake_rank.sh" "$lib" "${cmd[@]}" --zero "$z" \
      --trace "$out/.zero.json" --metrics "$out/.zero.jsonl" >>"$log" 2>&1
    echo "-- --zero $z: exit $?"
    py zero --trace "$out/.zero.json" --metrics "$out/.zero.jsonl"
    rm -f "$out/.zero.json" "$out/.zero.jsonl"
  done
}

# The largest preset, d48 (1.5B parameters), at T 1024: the first of B 8, 4, 2 that trains.
part_size() {
  echo "== size: d48 (1.5B), T $seq, bf16, 6 steps per run"
  local why; why=$(ddp_blocked)
  [ -z "$why" ] || { echo "gpu_gpt: size skipped: $why"; return; }
  for b in 8 4 2; do
    [ "$(left)" -gt 40 ] || { echo "gpu_gpt: d48 B $b: not run (budget spent)"; return; }
    ddp_cmd "$build" "$b" 6
    cmd=("${cmd[@]/#d12/d48}")
    py_new train --label d48 --model d48 --batch "$b" --seq "$seq" --steps 6 --runs "$runs" --log "$log" \
      --timeout "$(cap 120)" -- "${cmd[@]}"
    local rc=$?
    [ $rc -eq 0 ] && return
    [ $rc -eq 3 ] || { echo "gpu_gpt: d48 B $b failed for a reason other than memory"; return; }
  done
}

# 200 steps of d12 at B 16: the validation loss at step 200 over 20 batches (llm.c's default), in
# bench.log ("step 200: val loss"), for the fused attention with bf16 activations end to end (the
# default), the fused attention with fp32 activations (DDP_GPT_ACTIVATIONS=fp32: the path before,
# casts around every linear; issue 25 wants the two within 0.02), and the materialised attention,
# in that order, each while more than 40 s of the part's time are left (LOSS_LABELS: another list;
# a label is a DDP_CUDA_ATTENTION value, with -fp32act for fp32 activations, e.g. "cudnn
# flash-fp32act" for cuDNN's attention; each bf16 label is compared with flash-fp32act).
part_loss() {
  echo "== loss: d12 B 16, 200 steps, validation at the end (20 batches)"
  local label att acts line why; why=$(ddp_blocked)
  [ -z "$why" ] || { echo "gpu_gpt: loss skipped: $why"; return; }
  declare -A val=()
  for label in ${LOSS_LABELS:-flash flash-fp32act materialized}; do
    [ "$(left)" -gt 40 ] || { echo "gpu_gpt: loss $label: not run (budget spent)"; continue; }
    att=${label%-fp32act} acts=p
    [ "$label" = flash-fp32act ] && acts=fp32
    cmd=("$build/train/ddp-train" --model gpt2 --gpt-config d12 --seq "$seq" --batch 16
      --precision bf16 --device "$device" --max-steps 200 --epochs 1000 --log-every 1
      --val-every 200 --val-max-batches 20 --data "${data}_train_*.bin" --val-data "${data}_val_*.bin")
    DDP_CUDA_ATTENTION=$att DDP_GPT_ACTIVATIONS=$acts py_new train --label "loss-$label" --batch 16 \
      --seq "$seq" --steps 200 --runs "$runs" --log "$log" --timeout "$(cap 100)" -- "${cmd[@]}"
    line=$(grep "^\[.*\] step 200: val loss" "$log" | tail -1)
    [ -n "$line" ] && echo "gpu_gpt: loss-$label: $line"
    val[$label]=$(sed -n 's/.*step 200: val loss \([0-9.]*\).*/\1/p' <<<"$line")
  done
  # each bf16-activation label (flash, cudnn) against the fp32 activations
  for label in "${!val[@]}"; do
    [ "$label" = flash-fp32act ] || [ "$label" = materialized ] && continue
    [ -n "${val[$label]}" ] && [ -n "${val[flash-fp32act]:-}" ] &&
      awk -v l="$label" -v a="${val[$label]}" -v b="${val[flash-fp32act]}" 'BEGIN { d = a - b; printf \
        "gpu_gpt: val loss bf16 activations (%s) %s - fp32 activations %s = %+.4f (target |d| <= 0.02: %s)\n", \
        l, a, b, d, (d <= 0.02 && d >= -0.02) ? "met" : "missed" }'
  done
}

# The parts named, in ORDER; each ends when the parts after it still have their minimum left.
declare -A named=()
IFS=, read -r -a plist <<<"$parts"
for p in "${plist[@]}"; do
  case " $ORDER " in
    *" $p "*) named[$p]=1 ;;
    *) echo "gpu_gpt.sh: unknown part '$p' (${ORDER// /, })" ;;
  esac
done
run_list=()
for p in $ORDER; do [ -n "${named[$p]:-}" ] && run_list+=("$p"); done
for i in "${!run_list[@]}"; do
  p=${run_list[$i]} reserve=0
  for q in "${run_list[@]:i+1}"; do reserve=$((reserve + ${part_min[$q]})); done
  part_end=$((budget - reserve))
  echo; echo "[$((SECONDS - t0)) s of $budget; $p until $part_end s]"
  "part_$p"
done
part_end=$budget
rm -f "$out/.metrics.json"
echo
py summary --runs "$runs" --suite "$out/suite.txt" --ncu "$out/ncu_kernels.txt" --header "$out/header.txt" \
  | tee "$out/summary.txt"
rm -f "$out/header.txt"
[ "$dry" = 1 ] && dry_cleanup "$out/.dry"
echo "(gpu_gpt.sh: $((SECONDS - t0)) s; outputs in $out)"
