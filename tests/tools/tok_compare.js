#!/usr/bin/env node
// tok_compare.js - compares `wick tokenize` with Hugging Face's tokenizers library.
//
//   node tests/tools/tok_compare.js --wick WICK --hf NODE_MODULES/tokenizers --tmp DIR
//        [--count N] [--seed S] [--variants] TOKENIZER.json...
//
// For each tokenizer.json: generates N strings with a seeded PRNG (the same strings every
// run), encodes them all with one `wick tokenize --jsonl` process and with HF, and compares
// the ids, without and with special tokens. Then decodes HF's ids both ways and compares
// the text. With --variants, also checks variants of each file that exercise other
// components (Metaspace pre-tokenizer and decoder, unk without byte fallback, added tokens
// with normalized/lstrip/rstrip/single_word). Prints one summary line per file; on any
// mismatch prints the string and both results, and exits 1.
'use strict';
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

function parseArgs(argv) {
  const a = { count: 1200, seed: 1, variants: false, files: [] };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    if (k === '--wick') a.wick = argv[++i];
    else if (k === '--hf') a.hf = argv[++i];
    else if (k === '--tmp') a.tmp = argv[++i];
    else if (k === '--count') a.count = parseInt(argv[++i], 10);
    else if (k === '--seed') a.seed = parseInt(argv[++i], 10);
    else if (k === '--variants') a.variants = true;
    else a.files.push(k);
  }
  if (!a.wick || !a.hf || !a.tmp || !a.files.length) {
    console.error('usage: tok_compare.js --wick WICK --hf TOKENIZERS_DIR --tmp DIR ' +
                  '[--count N] [--seed S] [--variants] TOKENIZER.json...');
    process.exit(2);
  }
  return a;
}

// mulberry32: a small seeded PRNG, so the strings are the same on every run.
function prng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ['Once', 'upon', 'a', 'time', 'there', 'was', 'little', 'girl', 'named', 'Lily',
  'she', 'loved', 'to', 'play', 'outside', 'the', 'park', 'One', 'day', 'saw', 'big', 'red',
  'ball', 'Hello', 'world', 'tokenizer', 'wick', 'inference', 'engine', "don't", "it's",
  'HELLO', 'CamelCase', 'snake_case', 'x', 'I', 'an', 'antidisestablishmentarianism'];
const SPACES = [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \t ', '\u00a0', '\u3000',
  '\u2028', '\u200b', '\ufeff'];
const PUNCT = ['.', ',', '!', '?', ';', ':', "'", '"', '(', ')', '[', ']', '{', '}', '-', '--',
  '...', '/', '\\', '@', '#', '$', '%', '^', '&', '*', '+', '=', '~', '`', '|', '<', '>', '_'];
const INTL = ['café', 'naïve', 'Ångström', 'über', 'e\u0301', 'ñ', 'ß', 'œuvre', '你好', '世界',
  '日本語', 'の', '한국어', 'Привет', 'мир', 'αβγ', 'Ωμέγα', 'مرحبا', 'שלום', 'नमस्ते', 'สวัสดี',
  'ქართული', 'Ελληνικά', 'ǅ', 'ﬁ', '①', '½', '™', '€', '£', '¥', '°', '×', '→', '∑', '√'];
const EMOJI = ['🦙', '😀', '👍', '👍🏽', '👨‍👩‍👧', '🇫🇷', '❤️', '🤖', '🎉', '𝔘𝔫𝔦', '𠜎'];
const SPECIAL = ['<s>', '</s>', '<unk>', '<s', 's>', '<<s>>', '</s></s>', '<s><s>', '<0x41>',
  '\u2581', '\u2581\u2581', '<|im_end|>', ' <|im_end|> ', 'upon a time', 'qqx', ' qqx ',
  'aqqx', '\u0000', '\u0001', '\u007f'];

function randomCodepoint(r) {
  const k = r();
  let c;
  if (k < 0.5) c = 0x20 + Math.floor(r() * 0x5f);
  else if (k < 0.8) c = 0xa0 + Math.floor(r() * 0x2000);
  else if (k < 0.95) c = 0x3000 + Math.floor(r() * 0xa000);
  else c = 0x10000 + Math.floor(r() * 0x20000);
  if (c >= 0xd800 && c <= 0xdfff) c = 0x41; // no lone surrogates: HF takes valid Unicode
  return String.fromCodePoint(c);
}

function pick(r, list) {
  return list[Math.floor(r() * list.length)];
}

function genString(r, i) {
  if (i === 1) return 'a'.repeat(100000); // one 100 KB BPE word
  if (i === 2) { // 100 KB of text with few spaces: long words
    let s = '';
    while (s.length < 100000) s += pick(r, WORDS) + (r() < 0.05 ? ' ' : pick(r, PUNCT));
    return s;
  }
  if (i % 97 === 0) { // long strings, up to ~20 KB
    const parts = [];
    const n = 200 + Math.floor(r() * 2000);
    for (let k = 0; k < n; k++) parts.push(pick(r, WORDS), r() < 0.1 ? pick(r, PUNCT) : ' ');
    return parts.join('');
  }
  const n = 1 + Math.floor(r() * 12);
  let s = r() < 0.2 ? pick(r, SPACES) : '';
  for (let k = 0; k < n; k++) {
    const c = r();
    if (c < 0.35) s += pick(r, WORDS);
    else if (c < 0.5) s += pick(r, SPACES);
    else if (c < 0.6) s += String(Math.floor(r() * 1e6 * (r() < 0.5 ? 1 : 1e6)));
    else if (c < 0.7) s += pick(r, PUNCT);
    else if (c < 0.8) s += pick(r, INTL);
    else if (c < 0.86) s += pick(r, EMOJI);
    else if (c < 0.92) s += pick(r, SPECIAL);
    else for (let m = 1 + Math.floor(r() * 5); m > 0; m--) s += randomCodepoint(r);
    if (r() < 0.5) s += ' ';
  }
  if (r() < 0.15) s += pick(r, SPACES);
  return s;
}

function genStrings(count, seed) {
  const r = prng(seed);
  const fixed = ['', ' ', '  ', '\n', 'Once upon a time', ' Once upon a time', 'Hello world',
    'Hello  world ', '<s>', '</s>', '<s>Hello</s>', 'a<s>b', ' <s> ', '\u2581', 'The quick brown ' +
    'fox jumps over the lazy dog.', '1234567890', '3.14159', '$100,000.00'];
  const out = fixed.slice();
  for (let i = 0; out.length < count; i++) out.push(genString(r, i));
  return out;
}

// Variants of one tokenizer.json that exercise other components, each a [name, json] pair.
function variants(base) {
  const clone = () => JSON.parse(JSON.stringify(base));
  const out = [];
  const meta = { type: 'Metaspace', replacement: '\u2581', add_prefix_space: true };
  let v = clone(); // the older Llama form: Metaspace pre-tokenizer (split) and decoder
  v.normalizer = null;
  v.pre_tokenizer = meta;
  v.decoder = meta;
  out.push(['metaspace-always-split', v]);
  v = clone(); // the non-legacy form: prepend only at the very start, no split
  v.normalizer = null;
  v.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first',
    split: false };
  out.push(['metaspace-first', v]);
  v = clone(); // unknown characters become <unk>, fused
  v.model.byte_fallback = false;
  out.push(['unk-fused', v]);
  v = clone();
  v.model.byte_fallback = false;
  v.model.fuse_unk = false;
  out.push(['unk-unfused', v]);
  v = clone(); // added tokens with the less common options
  const vocab = v.model.vocab;
  let next = Object.keys(vocab).length;
  const add = (t) => {
    const id = Object.prototype.hasOwnProperty.call(vocab, t.content) ? vocab[t.content] : next++;
    v.added_tokens.push(Object.assign({ id, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: false }, t));
  };
  add({ content: '<|im_end|>', lstrip: true, rstrip: true, special: true });
  add({ content: 'upon a time', normalized: true });
  add({ content: 'qqx', single_word: true });
  out.push(['added-options', v]);
  return out;
}

function runWick(wick, tokPath, jsonlPath, special) {
  const args = ['tokenize', tokPath, '--jsonl', jsonlPath];
  if (special) args.push('--special');
  const p = spawnSync(wick, args, { maxBuffer: 1 << 30, encoding: 'utf8' });
  if (p.status !== 0) {
    console.error(`FAIL: ${wick} ${args.join(' ')} exited ${p.status}: ${p.stderr}`);
    process.exit(1);
  }
  return p.stdout.split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
}

async function compare(a, Tokenizer, name, tokPath, strings) {
  const tok = Tokenizer.fromFile(tokPath);
  let bad = 0;
  const report = (what, s, hf, wk) => {
    if (++bad <= 10) {
      console.error(`MISMATCH ${name} ${what} for ${JSON.stringify(s)}\n  hf:   ` +
                    `${JSON.stringify(hf)}\n  wick: ${JSON.stringify(wk)}`);
    }
  };
  const jsonl = path.join(a.tmp, `${name}.jsonl`);
  let encOk = 0, decOk = 0, total = 0;
  for (const special of [false, true]) {
    const hfIds = [];
    for (const s of strings) {
      hfIds.push((await tok.encode(s, null, { addSpecialTokens: special })).getIds());
    }
    // one wick process: every string, then HF's ids to decode
    fs.writeFileSync(jsonl, strings.map((s) => JSON.stringify(s)).concat(
      hfIds.map((ids) => JSON.stringify(ids))).join('\n') + '\n');
    const out = runWick(a.wick, tokPath, jsonl, special);
    if (out.length !== 2 * strings.length) {
      console.error(`FAIL: ${name}: wick printed ${out.length} lines for ${2 * strings.length}`);
      process.exit(1);
    }
    for (let i = 0; i < strings.length; i++) {
      total++;
      const wk = out[i].ids;
      if (JSON.stringify(wk) === JSON.stringify(hfIds[i])) encOk++;
      else report(`encode (special=${special})`, strings[i], hfIds[i], wk);
      const hfText = await tok.decode(hfIds[i], !special);
      const wkText = out[strings.length + i].text;
      if (hfText === wkText) decOk++;
      else report(`decode (skip_special=${!special}) of ${JSON.stringify(hfIds[i])}`,
                  strings[i], hfText, wkText);
    }
  }
  console.log(`${name}: ${encOk}/${total} encodings agree, ${decOk}/${total} decodings agree`);
  return bad === 0;
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const { Tokenizer } = require(path.resolve(a.hf));
  const strings = genStrings(a.count, a.seed);
  let ok = true;
  for (const f of a.files) {
    const base = path.basename(path.dirname(f)) + '-' + path.basename(f, '.json');
    ok = (await compare(a, Tokenizer, base, f, strings)) && ok;
    if (!a.variants) continue;
    for (const [vname, json] of variants(JSON.parse(fs.readFileSync(f, 'utf8')))) {
      const vp = path.join(a.tmp, `${base}-${vname}.json`);
      fs.writeFileSync(vp, JSON.stringify(json));
      ok = (await compare(a, Tokenizer, `${base}-${vname}`, vp, strings)) && ok;
    }
  }
  if (!ok) {
    console.error('FAIL: wick and Hugging Face tokenizers disagree (see above)');
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(`FAIL: ${e.stack || e}`);
  process.exit(1);
});
