#!/usr/bin/env node
// tok_vectors.js - checks `wick tokenize` against llama.cpp's tokenizer test vectors.
//
//   node tests/tools/tok_vectors.js --wick WICK --tmp DIR TOKENIZER.json VOCAB.inp VOCAB.out
//
// The format is llama.cpp's tests/test-tokenizer-0.cpp: the .inp file holds the test strings,
// each followed by "\n__ggml_vocab_test__\n"; line i of the .out file holds the ids of
// string i, separated by spaces (no special tokens added). Prints one summary line; on any
// mismatch prints the string and both id lists, and exits 1.
'use strict';
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

function main() {
  const argv = process.argv.slice(2);
  const a = { files: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--wick') a.wick = argv[++i];
    else if (argv[i] === '--tmp') a.tmp = argv[++i];
    else a.files.push(argv[i]);
  }
  if (!a.wick || !a.tmp || a.files.length !== 3) {
    console.error('usage: tok_vectors.js --wick WICK --tmp DIR TOKENIZER.json VOCAB.inp ' +
                  'VOCAB.out');
    process.exit(2);
  }
  const [tokPath, inpPath, outPath] = a.files;
  const raw = fs.readFileSync(inpPath, 'utf8');
  const sep = '\n__ggml_vocab_test__\n';
  const inputs = [];
  for (let pos = 0; pos < raw.length;) {
    const next = raw.indexOf(sep, pos);
    if (next < 0) { inputs.push(raw.slice(pos)); break; }
    inputs.push(raw.slice(pos, next));
    pos = next + sep.length;
  }
  const want = fs.readFileSync(outPath, 'utf8').split('\n');
  if (want.length && want[want.length - 1] === '') want.pop();
  if (want.length !== inputs.length || inputs.length === 0) {
    console.error(`FAIL: ${inpPath} has ${inputs.length} strings, ${outPath} ${want.length} lines`);
    process.exit(1);
  }
  const jsonl = path.join(a.tmp, 'vectors.jsonl');
  fs.writeFileSync(jsonl, inputs.map((s) => JSON.stringify(s)).join('\n') + '\n');
  const p = spawnSync(a.wick, ['tokenize', tokPath, '--jsonl', jsonl],
                      { maxBuffer: 1 << 28, encoding: 'utf8' });
  if (p.status !== 0) {
    console.error(`FAIL: wick tokenize exited ${p.status}: ${p.stderr}`);
    process.exit(1);
  }
  const got = p.stdout.split('\n').filter((l) => l.length).map((l) => JSON.parse(l).ids);
  let ok = 0;
  for (let i = 0; i < inputs.length; i++) {
    const w = want[i].trim() === '' ? [] : want[i].trim().split(/ +/).map(Number);
    if (JSON.stringify(w) === JSON.stringify(got[i])) ok++;
    else console.error(`MISMATCH for ${JSON.stringify(inputs[i])}\n  llama.cpp: ` +
                       `${JSON.stringify(w)}\n  wick:      ${JSON.stringify(got[i])}`);
  }
  console.log(`${path.basename(inpPath)}: ${ok}/${inputs.length} vectors agree`);
  if (ok !== inputs.length) process.exit(1);
}

main();
