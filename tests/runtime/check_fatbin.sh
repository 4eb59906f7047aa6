#!/usr/bin/env bash
# check_fatbin.sh - the CUDA code carries machine code (SASS) for every architecture in gpu_arch
# and PTX for the newest one, so newer GPUs compile it at load time instead of failing with
# "no kernel image is available". Needs cuobjdump (CUDA toolkit); skipped (77) without it.
# usage: check_fatbin.sh LIBRARY ARCH...
set -euo pipefail
lib=$1
shift
tool=$(command -v cuobjdump || true)
[ -n "$tool" ] || [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" ] || tool=${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump
if [ -z "$tool" ]; then
  echo "skipped: cuobjdump not found (install the CUDA toolkit's cuobjdump to check the fat binary)"
  exit 77
fi
elf=$("$tool" --list-elf "$lib")
ptx=$("$tool" --list-ptx "$lib")
newest=0
for a in "$@"; do
  grep -q "sm_$a" <<<"$elf" || { echo "FAIL: no SASS for sm_$a in $lib"; echo "$elf"; exit 1; }
  [ "$a" -gt "$newest" ] && newest=$a
done
grep -q "sm_$newest" <<<"$ptx" || { echo "FAIL: no PTX for compute_$newest in $lib"; echo "$ptx"; exit 1; }
echo "PASS: SASS for sm_${*// /, sm_}; PTX for compute_$newest"
