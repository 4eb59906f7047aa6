#!/usr/bin/env bash
# test.sh - the README's test command: installs what the tests need, builds everything (the CUDA
# parts too where the toolkit is present) with warnings as errors, fetches MNIST and the GPT's text
# shards, runs the whole test suite (unit, mpirun, and real-Slurm-cluster tests), the models suite
# and the tests whose outcome depends on the CPU's compute paths (suite isa) again with the CPU
# capped at AVX2 (where it has AVX-512), the models suite capped at the baseline (DDP_CPU_ISA), then a
# second build with clang, AddressSanitizer and UndefinedBehaviorSanitizer that runs the models,
# runtime, train and launcher suites and the libFuzzer harnesses (suite fuzz, 12 s each), and ends
# with "N passed, N failed, N skipped" over both builds.
# Usage: scripts/test.sh [meson test arguments, e.g. --suite runtime]
#   With arguments only the first build runs them, unless DDP_TEST_SANITIZE=1 (then both do).
#   DDP_TEST_SANITIZE=0 skips the sanitizer build; DDP_TEST_ISA_RUNS=0 the capped runs (=1 adds them).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh test
# CUDA's standard prefix: put nvcc on PATH so meson finds it (the CUDA backend is then built).
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
scripts/fetch-mnist.sh data/mnist
scripts/fetch-text.sh data/text # Jane Austen as GPT-2 token shards (the GPT's e2e test)

builddir=${DDP_TEST_BUILDDIR:-build-test}
if [ -f "$builddir/build.ninja" ]; then
  meson configure "$builddir" -Dwerror=true >/dev/null
else
  meson setup "$builddir" -Dwerror=true --buildtype=debugoptimized >/dev/null
fi
meson compile -C "$builddir" >/dev/null 2>"$builddir.compile.log" || {
  tail -n 60 "$builddir.compile.log"; echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

status=0
meson test -C "$builddir" --print-errorlogs --num-processes 2 "$@" || status=$?
logs=("$builddir/meson-logs/testlog.json")

# The lesser CPUs, tested on this one: the models suite and suite isa (tests/train/meson.build: the
# DDP equivalences, 16-bit training and accuracy, bf16 emulation) again under DDP_CPU_ISA=avx2
# (common/cpu_isa.h: oneDNN capped at AVX2, OpenBLAS's Haswell kernels, bf16 emulated), and the
# models suite under DDP_CPU_ISA=baseline. The rest of the train and e2e suites (loop, files, faults:
# about 10 minutes) does the same on every CPU. A CPU without AVX-512 ran its own AVX2 paths above; the
# reverse is impossible: the AVX-512 and native bf16 paths run only where the CPU has them.
isa_runs=${DDP_TEST_ISA_RUNS:-$([ $# -eq 0 ] && echo 1 || echo 0)}
if [ "$isa_runs" = 1 ]; then
  if grep -qw avx512f /proc/cpuinfo; then
    echo "test.sh: the models suite and suite isa again with DDP_CPU_ISA=avx2"
    DDP_CPU_ISA=avx2 meson test -C "$builddir" --print-errorlogs --num-processes 2 --logbase testlog-avx2 \
      --suite models --suite isa || status=$?
    logs+=("$builddir/meson-logs/testlog-avx2.json")
  else
    echo "test.sh: this CPU has no AVX-512: the run above was the AVX2 run; the AVX-512 and native bf16" \
      "paths cannot be tested here (their tests skipped, saying so)"
  fi
  echo "test.sh: the models suite again with DDP_CPU_ISA=baseline"
  DDP_CPU_ISA=baseline meson test -C "$builddir" --print-errorlogs --num-processes 2 --logbase testlog-baseline \
    --suite models || status=$?
  logs+=("$builddir/meson-logs/testlog-baseline.json")
fi

# The sanitizer build (clang, ASan + UBSan, libFuzzer harnesses; see scripts/build-sanitize.sh).
sanitize=${DDP_TEST_SANITIZE:-$([ $# -eq 0 ] && echo 1 || echo 0)}
if [ "$sanitize" = 1 ]; then
  sandir=${DDP_TEST_SANBUILDDIR:-build-sanitize}
  suites=(--suite models --suite readers --suite runtime --suite train --suite launcher --suite fuzz)
  [ $# -eq 0 ] || suites=("$@")
  if scripts/build-sanitize.sh "$sandir"; then
    meson test -C "$sandir" --print-errorlogs --num-processes 2 "${suites[@]}" || status=$?
    logs+=("$sandir/meson-logs/testlog.json")
  else
    status=1
    build_failures=1
  fi
fi

# Count results from meson's own logs: OK and EXPECTEDFAIL pass, SKIP is skipped (no GPU), the rest
# fail; a build that failed counts as one failure.
python3 - "${build_failures:-0}" "${logs[@]}" <<'PY'
import json, sys
passed = skipped = 0
failed = int(sys.argv[1])
for log in sys.argv[2:]:
    for line in open(log):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
