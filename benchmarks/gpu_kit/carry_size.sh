#!/usr/bin/env bash
# carry_size.sh - what a device-tool call carries, against its limit (/work/.library/device's
# README: the working tree that travels, tracked and untracked-not-ignored files, shared/ and the
# carried paths, at most 64 MiB):
#   benchmarks/gpu_kit/carry_size.sh SRC CARRIED...
# prints the working tree's bytes, each carried path's and the sum against the limit; exit 1
# (with what to leave out) when the sum is over it, a warning past 56 MiB (room for the
# transfer's own files). pack.sh calls it after packing; CARRY_LIMIT_MIB changes the limit.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: carry_size.sh SRC CARRIED..." >&2; exit 2; }
src=$1
shift
limit=$((${CARRY_LIMIT_MIB:-64} * 1048576))
# the working tree's files as the tool sends them (git's view: tracked, untracked not ignored)
tree=$(cd "$src" && git ls-files -co --exclude-standard -z 2>/dev/null | xargs -0 -r stat -c %s 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
# shared/ travels even where git ignores it
if [ -d "$src/shared" ] && git -C "$src" check-ignore -q shared 2>/dev/null; then
  tree=$((tree + $(du -sb "$src/shared" | cut -f1)))
fi
total=$tree
echo "carry: the working tree's files: $((tree / 1024)) KiB"
for f in "$@"; do
  [ -e "$f" ] || { echo "carry_size.sh: $f: not found" >&2; exit 2; }
  n=$(du -sb --apparent-size "$f" | cut -f1)
  total=$((total + n))
  echo "carry: $f: $((n / 1024)) KiB"
done
echo "carry: $((total / 1048576)) MiB of $((limit / 1048576)) ($total bytes)"
if [ "$total" -gt "$limit" ]; then
  echo "carry_size.sh: $((total / 1048576)) MiB is over the device tool's $((limit / 1048576)) MiB: the call" \
    "would be refused; carry less (KIT=1 rebuilds the kit, a baseline or llm.c can stay behind)" >&2
  exit 1
fi
[ "$total" -gt $((limit - 8 * 1048576)) ] && echo "carry_size.sh: WARNING: within 8 MiB of the limit"
exit 0
