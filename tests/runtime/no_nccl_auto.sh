#!/usr/bin/env bash
# no_nccl_auto.sh - `--device auto` in a build with CUDA but without NCCL where a GPU is visible
# (simulated by fake_cuda.so, one GPU per rank): every rank must fall back to the cpu backend with
# a message saying why, instead of failing in ddp_init. Builds libddp and test_init with
# -Dnccl=disabled under BUILDDIR/no-nccl (kept between runs).
# usage: no_nccl_auto.sh SRCDIR BUILDDIR FAKE_CUDA_SO MPIRUN [MPIRUN ARGS...] -np   (2 is added)
set -euo pipefail
src=$1 build=$2 fake=$3
shift 3
sub=$build/no-nccl
# meson test sets MALLOC_PERTURB_, which garbles compiler output that a nested meson setup reads.
unset MALLOC_PERTURB_
if [ ! -f "$sub/build.ninja" ]; then
  meson setup "$sub" "$src" -Dnccl=disabled -Dcudnn=disabled -Dhwloc=disabled -Dgpu_arch=80 --buildtype=plain \
    -Dwerror=true >"$sub.log" 2>&1 || { tail -n 30 "$sub.log"; exit 1; }
fi
meson compile -C "$sub" test_init >"$sub.log" 2>&1 || { tail -n 30 "$sub.log"; exit 1; }
out=$(LD_PRELOAD=$fake DDP_FAKE_CUDA_DEVICES=1 DDP_FAKE_CUDA_BUS=per-rank \
  "$@" 2 "$sub/tests/runtime/test_init" --np 2 --backend auto --expect-backend cpu 2>&1) || {
  echo "$out"; echo "FAIL: ddp_init with --backend auto did not fall back to the cpu backend"; exit 1; }
echo "$out"
grep -q "built without NCCL" <<<"$out" || { echo "FAIL: no message saying why"; exit 1; }
echo "PASS: auto fell back to the cpu backend with a message"
