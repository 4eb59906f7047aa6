#!/usr/bin/env bash
# train.sh - the README's main command: installs what training needs, builds (release), fetches
# MNIST and trains the LeNet-style CNN with 2 data-parallel ranks on the CPU through mpirun,
# printing per-epoch test accuracy, a classification report and the throughput.
# Usage: scripts/train.sh [extra ddp-train flags, e.g. --epochs 4]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh train
scripts/fetch-mnist.sh data/mnist

builddir=build-release
buildlog=$builddir/meson-logs/compile-log.txt

# Reads ninja's output ("[n/N] Compiling ...") and prints one line per tenth of the steps done.
progress() {
  awk '$1 ~ /^\[[0-9]+\/[0-9]+\]$/ {
         split(substr($1, 2, length($1) - 2), f, "/")
         q = int(10 * f[1] / f[2])
         if (q > shown) {
           printf "train.sh:   %3d%% (%d of %d steps)\n", int(100 * f[1] / f[2]), f[1], f[2]
           fflush()
           shown = q
         }
       }'
}

# Configures (once) and compiles the release build; the compiler's output goes to $buildlog, and
# its tail to stderr when the build fails.
build() {
  local out t0=$SECONDS
  if [ ! -f "$builddir/build.ninja" ]; then
    echo "train.sh: configuring $builddir (meson setup)"
    out=$(meson setup "$builddir" --buildtype=release 2>&1) || { echo "$out" >&2; return 1; }
  fi
  echo "train.sh: building $builddir (1-2 minutes on 2 cores the first time; log: $buildlog)"
  if ! meson compile -C "$builddir" 2>&1 | tee "$buildlog" | progress; then
    tail -n 30 "$buildlog" >&2
    echo "train.sh: the build failed; the whole output is in $buildlog" >&2
    return 1
  fi
  if grep -q 'no work to do' "$buildlog"; then
    echo "train.sh: $builddir is up to date"
  else
    echo "train.sh: $builddir built in $((SECONDS - t0)) s"
  fi
}

build

mpi_flags=(-np 2 --bind-to core)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
[ "$(nproc)" -lt 2 ] && mpi_flags+=(--oversubscribe)
exec mpirun "${mpi_flags[@]}" -x OPENBLAS_NUM_THREADS=1 \
  "$builddir/train/ddp-train" --model cnn --data data/mnist --epochs 8 --batch 64 \
  --lr 0.05 --momentum 0.9 --lr-schedule cosine --augment --device cpu \
  --metrics "$builddir/train-metrics.jsonl" "$@"
