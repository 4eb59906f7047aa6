#!/usr/bin/env bash
# fuzz.sh - runs every libFuzzer harness of tests/fuzz (hostlist, launch_env, idx, checkpoint,
# train_opts) for SECONDS each, two at a time, in the sanitizer build (scripts/build-sanitize.sh).
# New inputs collect in BUILD/meson-logs/fuzz/fuzz_NAME.corpus; a crash, leak, timeout or sanitizer
# report fails the run and leaves its input beside them (tests/fuzz/run_fuzzer.sh says how to replay).
# Usage: scripts/fuzz.sh SECONDS [fuzz_NAME...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || {
  echo "usage: scripts/fuzz.sh SECONDS [fuzz_NAME...]   (SECONDS: a positive whole number, got '$seconds')"; exit 2; }
shift
dir=${DDP_TEST_SANBUILDDIR:-build-sanitize}
scripts/build-sanitize.sh "$dir"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(--suite fuzz)
DDP_FUZZ_SECONDS=$seconds exec meson test -C "$dir" --num-processes 2 --timeout-multiplier 0 \
  --print-errorlogs "${targets[@]}"
