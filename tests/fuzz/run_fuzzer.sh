#!/usr/bin/env bash
# run_fuzzer.sh - runs one libFuzzer harness for a time budget, starting from its seed corpus.
# Usage: run_fuzzer.sh HARNESS SEED_DIR WORK_DIR [SECONDS]   (SECONDS: DDP_FUZZ_SECONDS, else 12)
# New inputs go to WORK_DIR/NAME.corpus (the seeds are only read); a crash, leak, timeout, memory
# blow-up or sanitizer report exits non-zero and leaves the input as WORK_DIR/NAME.crash-* etc.,
# with the command that replays it.
set -euo pipefail
harness=$1 seeds=$2 work=$3
seconds=${4:-${DDP_FUZZ_SECONDS:-12}}
name=$(basename "$harness")
mkdir -p "$work/$name.corpus"
# Fast unwinding here: the harnesses start no MPI, so no library without frame pointers allocates.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# -close_fd_mask=3: the code under test reports every refusal on stderr; libFuzzer keeps its own
# output and the sanitizers' reports on a copy of stderr.
status=0
"$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -error_exitcode=1 -timeout_exitcode=1 -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$work/$name." \
  "$work/$name.corpus" "$seeds" || status=$?
if [ "$status" -ne 0 ]; then
  echo "$name FAILED (status $status); replay the saved input with: $harness $work/$name.<crash|leak|timeout|oom>-..."
fi
exit "$status"
