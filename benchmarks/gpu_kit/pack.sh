#!/usr/bin/env bash
# pack.sh - prepares a GPU machine run of benchmarks/gpu_gpt.sh from a machine without a GPU, for
# GPU machines that have the CUDA toolkit, ncu and the cuDNN/NCCL/cuBLAS Python wheels but neither
# Open MPI nor meson (the ones this project is lent). It builds the working tree and a baseline
# commit here and writes, into the git-ignored folder .gpu/ of the checkout:
#   kit.tar.xz      runtime libraries the GPU machine lacks: Open MPI 4.1 (bin, libs, plugins,
#                   share/, etc/), PMIx, hwloc, libevent, oneDNN, OpenBLAS (pthread), and fallbacks
#                   (zlib, libgomp, libudev, libgfortran, ...) that env.sh links in only where the
#                   system lacks them. Built once from `apt-get download` + `dpkg -x` (never into /);
#                   KIT=1 rebuilds it.
#   payload.tar.xz  new/ (build-gpu's programs, the CUDA suite's test binaries, libddp, the tests'
#                   JSON), base/ (the baseline's ddp-train + libddp), llmc/ (llm.c's train_gpt2cu,
#                   when .gpu/llmc/ holds one: built from its public source as
#                   docs/perf/gpu-gpt2.md says in words, never part of this repository), data/ (the
#                   Jane Austen shards of scripts/fetch-text.sh)
#   env.sh, device.sh  copies of this folder's: sourced / run there (device.sh unpacks, sources
#                   env.sh, runs benchmarks/gpu_gpt.sh with its arguments into $OUT)
# Then the GPU machine runs `bash .gpu/device.sh [gpu_gpt.sh options]` with those four files.
# Usage: benchmarks/gpu_kit/pack.sh   (SRC=the checkout, BASE_COMMIT=218ed66 (the last build measured
# on a GPU, docs/perf/gpu-gpt2.md's run 4; f917111 was the first baseline), BASE=/tmp/ddp-base-COMMIT,
# KIT=0)
set -euo pipefail
kit_src=$(cd "$(dirname "$0")" && pwd)
SRC=${SRC:-$(cd "$kit_src/../.." && pwd)}
here=$SRC/.gpu
mkdir -p "$here"
grep -qxF '/.gpu/' "$SRC/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$SRC/.git/info/exclude"
cp "$kit_src/env.sh" "$kit_src/device.sh" "$here/"
BASE_COMMIT=${BASE_COMMIT:-218ed66}
BASE=${BASE:-/tmp/ddp-base-$BASE_COMMIT}
setup=(--buildtype=release -Dwerror=true -Dcuda=enabled -Dnccl=enabled -Dcudnn=enabled -Dgpu_arch=90)
say() { echo "pack: $*"; }

# 1. The NEW build: the working tree as it is now.
[ -f "$SRC/build-gpu/build.ninja" ] || meson setup "$SRC/build-gpu" "$SRC" "${setup[@]}"
say "building $SRC/build-gpu (log $here/build-new.log)"
ninja -C "$SRC/build-gpu" >"$here/build-new.log" 2>&1 || { tail -30 "$here/build-new.log"; exit 1; }
meson introspect --tests "$SRC/build-gpu" >"$SRC/build-gpu/meson-tests.json"
git -C "$SRC" describe --always --dirty >"$SRC/build-gpu/ddp-version.txt"

# 2. The BASELINE build: commit $BASE_COMMIT in a worktree of its own.
if [ ! -d "$BASE" ]; then git -C "$SRC" worktree add "$BASE" "$BASE_COMMIT"; fi
[ -f "$BASE/build-gpu/build.ninja" ] || meson setup "$BASE/build-gpu" "$BASE" "${setup[@]}"
say "building $BASE/build-gpu (train/ddp-train)"
ninja -C "$BASE/build-gpu" train/ddp-train >"$here/build-base.log" 2>&1 || { tail -30 "$here/build-base.log"; exit 1; }
git -C "$BASE" describe --always --dirty >"$BASE/build-gpu/ddp-version.txt"

# 3. The runtime libraries (once).
if [ ! -f "$here/kit.tar.xz" ] || [ "${KIT:-0}" = 1 ]; then
  k=$(mktemp -d /tmp/ddp-kit-pack.XXXXXX)
  mkdir -p "$k/debs" "$k/stage"
  (cd "$k/debs" && apt-get download openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 \
      libevent-core-2.1-7 libevent-pthreads-2.1-7 libdnnl2 libopenblas0-pthread libgfortran5 \
      libquadmath0 libgomp1 libudev1 libnuma1 zlib1g ocl-icd-libopencl1 2>&1 | tail -1)
  for f in "$k"/debs/*.deb; do dpkg -x "$f" "$k/stage"; done
  s=$k/stage; L=$s/usr/lib/x86_64-linux-gnu
  mkdir -p "$k/kit/ompi/usr/bin" "$k/kit/ompi/usr/lib" "$k/kit/lib" "$k/kit/fallback"
  # Open MPI: the prefix keeps Debian's layout (OPAL_PREFIX relocates it); plugins whose libraries
  # are not carried (UCX, libfabric, verbs, PSM, netlink) are left out, and env.sh's MCA settings
  # (pml ob1, btl self,vader,tcp) never ask for them.
  mv "$s/etc" "$k/kit/ompi/etc"
  mkdir -p "$k/kit/ompi/usr/share"; mv "$s/usr/share/openmpi" "$k/kit/ompi/usr/share/"
  for b in orterun orted ompi_info; do mv "$s/usr/bin/$b" "$k/kit/ompi/usr/bin/"; done
  ln -s orterun "$k/kit/ompi/usr/bin/mpirun"; ln -s orterun "$k/kit/ompi/usr/bin/mpiexec"
  mkdir -p "$k/kit/ompi/usr/lib/x86_64-linux-gnu"
  O=$k/kit/ompi/usr/lib/x86_64-linux-gnu
  mv "$L/openmpi" "$L/pmix2" "$O/"
  rm -rf "$O/openmpi/include" "$O/openmpi/lib/"*java* "$O/openmpi/lib/"*.mod
  for p in atomic_ucx btl_ofi btl_openib btl_usnic mtl_ofi mtl_psm mtl_psm2 osc_ucx pml_ucx \
      reachable_netlink spml_ucx sshmem_ucx; do rm -f "$O/openmpi/lib/openmpi3/mca_$p.so"; done
  rm -f "$O/openmpi/lib/openmpi3/"mca_spml_* "$O/openmpi/lib/openmpi3/"mca_sshmem_* \
      "$O/openmpi/lib/openmpi3/"mca_scoll_* "$O/openmpi/lib/openmpi3/"mca_memheap_*
  for f in libmpi.so.40* libopen-rte.so.40* libopen-pal.so.40* libpmix.so.2* libmca_common_dstore.so* \
      libmca_common_monitoring.so* libmca_common_ompio.so* libmca_common_sm.so* libhwloc.so.15* \
      libevent_core-2.1.so.7* libevent_pthreads-2.1.so.7* libdnnl.so.2*; do
    mv "$L"/$f "$k/kit/lib/" 2>/dev/null || true
  done
  cp -L "$L/openblas-pthread/libopenblas.so.0" "$k/kit/lib/libopenblas.so.0"
  for f in libz.so.1* libgomp.so.1* libudev.so.1* libgfortran.so.5* libquadmath.so.0* libnuma.so.1* \
      libOpenCL.so.1*; do
    mv "$L"/$f "$k/kit/fallback/" 2>/dev/null || mv "$s/lib/x86_64-linux-gnu"/$f "$k/kit/fallback/" 2>/dev/null || true
  done
  strip --strip-unneeded "$k"/kit/lib/*.so* "$k"/kit/fallback/*.so* 2>/dev/null || true
  XZ_OPT=-9T0 tar -C "$k/kit" -cJf "$here/kit.tar.xz" .
  rm -rf "$k"
fi

# 4. The payload: builds, llm.c, data.
p=$(mktemp -d /tmp/ddp-payload.XXXXXX)
n=$SRC/build-gpu
mkdir -p "$p/new" "$p/base/train" "$p/base/runtime" "$p/data"
( cd "$n" && python3 - <<'PY'
import json, os
tests = json.load(open("meson-tests.json"))
build = os.getcwd()
keep = {"train/ddp-train", "tools/ddp-ckpt", "launcher/ddp-launch", "meson-tests.json", "ddp-version.txt"}
for t in tests:
    if not any(s.split(":")[-1] == "cuda" for s in t["suite"]):
        continue
    for a in t["cmd"]:
        if a.startswith(build + "/") and os.path.exists(a):
            keep.add(os.path.relpath(a, build))
for f in os.listdir("runtime"):
    if (f.startswith("libddp.so") and not f.endswith(".p")) or f == "libddp_cuda.a":
        keep.add("runtime/" + f)
for f in os.listdir("runtime/libddp_cuda.a.p"):  # the thin archive's objects (cuda_fatbin reads them)
    keep.add("runtime/libddp_cuda.a.p/" + f)
open("/tmp/ddp-pack-list.txt", "w").write("\n".join(sorted(keep)) + "\n")
PY
  tar -cf - -T /tmp/ddp-pack-list.txt ) | tar -xf - -C "$p/new"
for f in $(find "$p/new" -type f -perm -u+x ! -name '*.so*'); do strip --strip-unneeded "$f" 2>/dev/null || true; done
strip --strip-unneeded "$p"/new/runtime/libddp.so.*.*[0-9]
cp -a "$BASE/build-gpu/train/ddp-train" "$p/base/train/"
find "$BASE/build-gpu/runtime" -maxdepth 1 -name 'libddp.so*' ! -name '*.p' -exec cp -a {} "$p/base/runtime/" \;
cp "$BASE/build-gpu/ddp-version.txt" "$p/base/"
strip --strip-unneeded "$p/base/train/ddp-train" "$p"/base/runtime/libddp.so.*.*[0-9]
if [ -x "$here/llmc/train_gpt2cu" ]; then
  mkdir -p "$p/llmc"; cp "$here"/llmc/train_gpt2cu* "$here/llmc/VERSION" "$p/llmc/"
else
  say "no .gpu/llmc/train_gpt2cu: llm.c is left out (docs/perf/gpu-gpt2.md says how to build it)"
fi
[ -f "$SRC/data/text/austen_val_000000.bin" ] || "$SRC/scripts/fetch-text.sh" "$SRC/data/text"
cp "$SRC"/data/text/austen_*.bin "$p/data/"
XZ_OPT=-9T0 tar -C "$p" -cJf "$here/payload.tar.xz" .
rm -rf "$p"

# 5. Sizes: what travels (the working tree and the carried .gpu/ files) against the device tool's
# limit; over it, pack.sh fails here rather than the call later.
say "kit.tar.xz $(du -h "$here/kit.tar.xz" | cut -f1), payload.tar.xz $(du -h "$here/payload.tar.xz" | cut -f1)"
"$kit_src/carry_size.sh" "$SRC" "$here/kit.tar.xz" "$here/payload.tar.xz" "$here/env.sh" \
  "$here/device.sh" || exit 1
say "carry: [\".gpu/kit.tar.xz\", \".gpu/payload.tar.xz\", \".gpu/env.sh\", \".gpu/device.sh\"]"
say "device command: bash .gpu/device.sh   (timeout_s 590; the script keeps to --budget seconds)"
