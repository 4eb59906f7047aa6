#!/usr/bin/env bash
# build-sanitize.sh - configures (once) and compiles the sanitizer build: clang 16 (the first Debian
# clang with _Float16 on x86-64, which models/ops uses), AddressSanitizer +
# UndefinedBehaviorSanitizer, the libFuzzer harnesses of tests/fuzz, warnings as errors. No CUDA
# (ASan and the CUDA runtime do not mix); b_lundef=false because clang leaves the sanitizer
# runtime's symbols undefined in shared libraries. tests/meson.build sets the sanitizers' options.
# Usage: scripts/build-sanitize.sh [DIR]   (default build-sanitize; prints DIR's compile log tail
# and exits 1 when the build fails). Needs clang-16 and libclang-rt-16-dev (scripts/install-deps.sh test).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-sanitize}
command -v clang-16 >/dev/null 2>&1 || { echo "build-sanitize: clang-16 not found: run scripts/install-deps.sh test"; exit 1; }
if [ ! -f "$dir/build.ninja" ]; then
  CC=clang-16 meson setup "$dir" -Dwerror=true --buildtype=debugoptimized -Dcuda=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false -Dfuzz=enabled >/dev/null
fi
meson compile -C "$dir" >/dev/null 2>"$dir.compile.log" || {
  tail -n 60 "$dir.compile.log"; echo "build-sanitize: build of $dir failed"; exit 1; }
