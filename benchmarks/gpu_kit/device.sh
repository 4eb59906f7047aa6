#!/usr/bin/env bash
# device.sh - the whole GPU machine run (pack.sh copies it into .gpu/), from the repo root there:
#   bash .gpu/device.sh [gpu_gpt.sh options, e.g. --parts bench,ncu]
# carry: .gpu/kit.tar.xz .gpu/payload.tar.xz .gpu/env.sh .gpu/device.sh; timeout_s 590.
# Unpacks the kit and the payload into /tmp/ddp-kit, puts the NEW build at build-gpu/ (the suite's
# test scripts are read from this checkout), sources env.sh and runs benchmarks/gpu_gpt.sh with
# everything under $OUT (at most 8 files come back). BUDGET (default 480 s) bounds gpu_gpt.sh.
set -u
cd "$(dirname "$0")/.." || exit 2
T0=$SECONDS
export DDP_KIT=/tmp/ddp-kit
rm -rf "$DDP_KIT" && mkdir -p "$DDP_KIT" || exit 2
tar -xJf .gpu/kit.tar.xz -C "$DDP_KIT" && tar -xJf .gpu/payload.tar.xz -C "$DDP_KIT" || { echo "device.sh: unpacking failed"; exit 2; }
rm -rf build-gpu && mv "$DDP_KIT/new" build-gpu || exit 2
# shellcheck source=/dev/null
source .gpu/env.sh
OUT=${OUT:-/tmp/gpu-gpt-out}
mkdir -p "$OUT"
echo "device.sh: unpacked in $((SECONDS - T0)) s; wheels' libraries: ${DDP_WHEEL_LIBS:-none found}"
for b in build-gpu/train/ddp-train "$DDP_KIT/base/train/ddp-train" "$DDP_KIT/llmc/train_gpt2cu"; do
  [ -e "$b" ] || continue
  miss=$(ldd "$b" 2>&1 | grep "not found" | awk '{print $1}' | paste -sd ' ' -)
  echo "device.sh: $b: ${miss:+MISSING }${miss:-every library found}"
done
llmc=()
[ -x "$DDP_KIT/llmc/train_gpt2cu" ] && llmc=(--llmc "$DDP_KIT/llmc/train_gpt2cu")
benchmarks/gpu_gpt.sh --build build-gpu --baseline "$DDP_KIT/base" "${llmc[@]}" \
  --data "$DDP_KIT/data/austen" --out "$OUT" --budget "${BUDGET:-480}" "$@"
rc=$?
echo "device.sh: $((SECONDS - T0)) s in all"
exit $rc
