#!/usr/bin/env bash
# test.sh - the README's test command: installs what the tests need, builds everything (the CUDA
# parts too where the toolkit is present) with warnings as errors, fetches MNIST, runs the whole
# test suite (unit, mpirun, and real-Slurm-cluster tests) and ends with "N passed, N failed".
# Usage: scripts/test.sh [meson test arguments, e.g. --suite runtime]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh test
# CUDA's standard prefix: put nvcc on PATH so meson finds it (the CUDA backend is then built).
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
scripts/fetch-mnist.sh data/mnist

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

# Count results from meson's own log: OK and EXPECTEDFAIL pass, SKIP is skipped (no GPU), the rest fail.
python3 - "$builddir/meson-logs/testlog.json" <<'PY'
import json, sys
passed = failed = skipped = 0
for line in open(sys.argv[1]):
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
