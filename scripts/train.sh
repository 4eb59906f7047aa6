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
[ -f "$builddir/build.ninja" ] || meson setup "$builddir" --buildtype=release >/dev/null
meson compile -C "$builddir" >/dev/null

mpi_flags=(-np 2 --bind-to core)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
[ "$(nproc)" -lt 2 ] && mpi_flags+=(--oversubscribe)
exec mpirun "${mpi_flags[@]}" -x OPENBLAS_NUM_THREADS=1 \
  "$builddir/models/ddp-train" --model cnn --data data/mnist --epochs 8 --batch 64 \
  --lr 0.05 --momentum 0.9 --lr-schedule cosine --augment --device cpu \
  --metrics "$builddir/train-metrics.jsonl" "$@"
