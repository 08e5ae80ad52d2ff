#!/usr/bin/env node
// tok_compare.js - compares `wick tokenize` with Hugging Face's tokenizers library.
//
//   node tests/tools/tok_compare.js --wick WICK --hf NODE_MODULES/tokenizers --tmp DIR
//        [--count N] [--seed S] [--set spm|bytelevel] [--variants] [--prepared]
//        TOKENIZER.json...
//
// For each tokenizer.json: generates N strings with a seeded PRNG (the same strings every
// run), encodes them all with one `wick tokenize --jsonl` process and with HF, and compares
// the ids, without and with special tokens. Then decodes HF's ids both ways and compares
// the text. --set picks the strings: spm (the default) for SentencePiece vocabularies;
// bytelevel for byte-level BPE, weighted towards what its regexes and NFC split on: code,
// whitespace and newline runs, digit groups, contractions in every case, CJK, emoji, mixed
// scripts, punctuation runs, decomposed accents, chat markup. With --variants, also checks
// variants of each file that exercise other components: for SentencePiece files, Metaspace
// pre-tokenizer and decoder, unk without byte fallback, added tokens with
// normalized/lstrip/rstrip/single_word; for byte-level files, the GLM/cl100k and llama.cpp
// regex forms, GPT-2's ByteLevel regex with and without add_prefix_space, a Split before a
// regex ByteLevel, ignore_merges, added-token options and a template post-processor. Prints
// one summary line per file; on any mismatch prints the string and both results, and exits 1.
// With --prepared, each file is also written in wick's prepared form (`wick tokenize F
// --prepare P`, what a snapshot's tokenizer.prepared holds) and `wick tokenize P` must print
// exactly what the JSON gave, line for line.
'use strict';
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

function parseArgs(argv) {
  const a = { count: 1200, seed: 1, variants: false, set: 'spm', files: [] };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    if (k === '--wick') a.wick = argv[++i];
    else if (k === '--hf') a.hf = argv[++i];
    else if (k === '--tmp') a.tmp = argv[++i];
    else if (k === '--count') a.count = parseInt(argv[++i], 10);
    else if (k === '--seed') a.seed = parseInt(argv[++i], 10);
    else if (k === '--variants') a.variants = true;
    else if (k === '--prepared') a.prepared = true;
    else if (k === '--set') a.set = argv[++i];
    else a.files.push(k);
  }
  if (!a.wick || !a.hf || !a.tmp || !a.files.length || !['spm', 'bytelevel'].includes(a.set)) {
    console.error('usage: tok_compare.js --wick WICK --hf TOKENIZERS_DIR --tmp DIR ' +
                  '[--count N] [--seed S] [--set spm|bytelevel] [--variants] [--prepared] ' +
                  'TOKENIZER.json...');
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

// ---- byte-level strings ---------------------------------------------------------------------

const CODE = ['#include <stdio.h>\n', 'int main(void) {\n', '    return 0;\n', '}\n',
  'for (i = 0; i < n; i++) {\n\t\tx[i] += y[i];\n\t}\n', 'def f(x):\n    return x**2\n',
  'if a != b and not c:\n\tpass\n', 'const x = (a) => a?.b ?? 0;', 'fn main() -> i32 {}',
  '{"key": [1, 2.5e-3, null, true]}', 'SELECT * FROM t WHERE id=42;', '#!/bin/sh\nset -eu\n',
  '    # comment\n', '/* block */', '// line', 'x->y', 'a::b', 'i++;', 'foo_bar_baz(1,2)',
  '<div class="x">&nbsp;</div>', '```python\nprint("hi")\n```', '$HOME/.bashrc', '0x1F3A',
  'std::vector<int> v{1,2,3};', 'println!("{}", x);', 'e.g.', 'i.e.', 'a=b+c*d/e-f%g',
  '\\n', 'C:\\Users\\x', '@decorator\n', 'lambda: None', 'a | b & c ^ ~d', '!==', '=>'];
const WS = [' ', '  ', '   ', '    ', '        ', '\t', '\t\t', ' \t', '\t ', '\n', '\n\n',
  '\n\n\n', '\r\n', '\r\n\r\n', '\r', ' \n', '\n ', ' \n ', '  \n\n  ', '\t\n',
  '\u00a0', '\u3000', '\u2028', '\u0085', '\u000b', '\u000c', '\u2003', '\u200b',
  '\ufeff', '\u180e', '\u202f', '\u205f', ' \u00a0 ', '\n\u3000\n'];
const DIGITS = ['0', '7', '42', '123', '1234', '12345', '1234567', '3.14159', '1,000,000',
  '2024-01-31', '10:30', '-17', '+1e10', '0.5%', '\u0663\u0664\u0665', '\uff11\uff12\uff13',
  '\u00b2', '\u00bd', '\u2460\u2461', '\u2167', '\u0967\u0968', '\u4e00\u4e8c\u4e09',
  '\ud835\udfcf\ud835\udfd0', '1\u00b2\u00b3', '999999999999', '007', '$9.99', 'v1.2.3'];
const CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'Ve",
  "'m", "'M", "'ll", "'LL", "'Ll", "'lL", "'d", "'D", "'\u017f", "'x", "''", "'", "\u2019s",
  "don't", "DON'T", "I'm", "I'M", "we'll", "WE'LL", "she'd", "you're", "they've", "it's",
  "IT'S", "'sa", "'stop", " 's", "x'ss", "rock'n'roll", "'tis", "o'clock", "'re'", "'\u0130"];
const CJK = ['\u4f60\u597d', '\u4e16\u754c', '\u6211\u662f\u4e00\u4e2a\u6a21\u578b',
  '\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002', '\u65e5\u672c\u8a9e', '\u3053\u3093\u306b\u3061\u306f',
  '\u30ab\u30bf\u30ab\u30ca', '\ud55c\uad6d\uc5b4', '\uc548\ub155\ud558\uc138\uc694',
  '\uff0c', '\u3001', '\u300c\u5f15\u7528\u300d', '\u1100\u1161\u11a8',
  '\u4e2d\u6587English\u6df7\u5408', '\ud840\udc0b', '\u9fa5\u3400'];
const MIXED = ['Hello\u4e16\u754c', 'abc\u0414\u0416', '\u041f\u0440\u0438\u0432\u0435\u0442',
  '\u0645\u0631\u062d\u0628\u0627 123', '\u05e9\u05dc\u05d5\u05dd', '\u0928\u092e\u0938\u094d\u0924\u0947',
  '\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35', '\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8',
  '\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac', 'caf\u00e9', 'cafe\u0301', 'A\u030a',
  '\u212b', 'e\u0323\u0302', '\u1ec7', 'a\u0316\u0301', '\u1e9b\u0323', '\u01c5', '\ufb01',
  'na\u00efve', '\u00dcber', '\u0130stanbul', 'stra\u00dfe', 'x\u0344', '\u0b47\u0b3e'];
const EMOJI_BL = ['\ud83d\ude00', '\ud83d\udc4d\ud83c\udffd', '\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67',
  '\ud83c\uddeb\ud83c\uddf7', '\u2764\ufe0f', '1\ufe0f\u20e3', '\ud83e\udd99', '\ud83c\udf89\ud83c\udf89',
  '\u263a', '\u2728', '\ud83e\udd16 ok', '\ud83d\udd25\ud83d\udd25\ud83d\udd25'];
const PUNCT_BL = ['!!!', '...', '?!?!', '\u2014', '\u00ab\u00bb', '\u201c\u201d', '---===',
  '```', ' ...\n\n', '):\n', '!\r\n', ';;', '&&', '||', '\u3002\u3002', '**bold**', '~~', '#',
  '@@', '%%', ' ?', ' .\n', '<<>>', '[[]]', '(\u00b0\u25a1\u00b0)', '\u2026', '\u00bf\u00a1'];
const MARKUP = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|im_start|>user\nhi<|im_end|>\n',
  '<tool_call>', '</tool_call>', '<think>', '</think>', '<think>\n\n</think>\n\n', '[gMASK]<sop>',
  '[gMASK]<sop><|user|>hi<|assistant|><think>', '<|system|>', '<|user|>', '<|assistant|>',
  '<|observation|>', '<tool_response>x</tool_response>', '<arg_key>k</arg_key>',
  '<arg_value>v</arg_value>', '<|user|>\n', '< |user| >', '<|user', 'user|>', '<sop><sop>',
  ' <|usr|> ', 'a<|usr|>b', 'qqx', ' qqx ', 'aqqx', 'caf\u00e9!', '\u4e16\u754c!'];

function genStringBL(r, i) {
  if (i === 1) return 'a'.repeat(100000);
  if (i === 2) { // ~100 KB of code
    let s = '';
    while (s.length < 100000) s += pick(r, CODE) + (r() < 0.3 ? pick(r, WS) : '');
    return s;
  }
  if (i === 3) return ' '.repeat(5000) + '\n'.repeat(5000) + '7'.repeat(5000) + 'x';
  if (i % 97 === 0) { // long mixed strings, up to ~20 KB
    const parts = [];
    const n = 200 + Math.floor(r() * 2000);
    const lists = [WORDS, CJK, DIGITS, CONTRACTIONS, WS, CODE, MIXED];
    for (let k = 0; k < n; k++) parts.push(pick(r, pick(r, lists)), r() < 0.5 ? ' ' : '');
    return parts.join('');
  }
  const groups = [[CODE, 0.14], [WS, 0.14], [DIGITS, 0.1], [CONTRACTIONS, 0.1], [CJK, 0.08],
    [MIXED, 0.1], [EMOJI_BL, 0.06], [PUNCT_BL, 0.08], [MARKUP, 0.05], [WORDS, 0.12],
    [null, 0.03]];
  const n = 1 + Math.floor(r() * 12);
  let s = r() < 0.2 ? pick(r, WS) : '';
  for (let k = 0; k < n; k++) {
    let c = r(), g = null;
    for (const [list, w] of groups) { if (c < w) { g = list; break; } c -= w; }
    if (g) s += pick(r, g);
    else for (let m = 1 + Math.floor(r() * 5); m > 0; m--) s += randomCodepoint(r);
    const j = r();
    if (j < 0.35) s += ' ';
    else if (j < 0.45) s += pick(r, WS);
  }
  if (r() < 0.15) s += pick(r, WS);
  return s;
}

function genStringsBL(count, seed) {
  const r = prng(seed);
  const fixed = ['', ' ', '\n', '\n\n', ' \n', '\t', 'Hello world', ' Hello world',
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like tea?",
    '3 33 333 3333 33333 333333 3333333', '   Hello\n\n  world  ', 'a\u00a0\u00a0b',
    '\u4f60\u597d\uff0c\u4e16\u754c\uff01', 'caf\u00e9 cafe\u0301', '\ud83d\ude00\ud83d\ude00 \u2764\ufe0f',
    '[gMASK]<sop><|system|>You are helpful.<|user|>Hi<|assistant|><think>',
    '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n'];
  const out = fixed.slice();
  for (let i = 0; out.length < count; i++) out.push(genStringBL(r, i));
  return out;
}

function isByteLevel(json) {
  const has = (p) => p && (p.type === 'ByteLevel' ||
    (p.type === 'Sequence' && (p.pretokenizers || []).some(has)));
  return has(json.pre_tokenizer);
}

// Variants of a byte-level tokenizer.json (GPT-4 family Split + ByteLevel, as Qwen's).
function variantsBL(base) {
  const clone = () => JSON.parse(JSON.stringify(base));
  const out = [];
  const qre = base.pre_tokenizer.pretokenizers[0].pattern.Regex;
  const glm = qre.replace('\\p{N}|', '\\p{N}{1,3}|');
  let v = clone(); // cl100k / Llama-3 / GLM-4: (?i:...) and 1-3 digits
  v.pre_tokenizer.pretokenizers[0].pattern.Regex = glm;
  out.push(['glm-regex', v]);
  v = clone(); // llama.cpp's CHATGLM4 form of it (glm.md section 4)
  v.pre_tokenizer.pretokenizers[0].pattern.Regex = glm.replace(
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])");
  out.push(['glm-llamacpp-regex', v]);
  v = clone(); // GPT-2: ByteLevel alone with its own regex, no normalizer
  v.normalizer = null;
  v.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true,
    use_regex: true };
  out.push(['gpt2', v]);
  v = clone();
  v.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true,
    use_regex: true };
  out.push(['gpt2-prefix-space', v]);
  v = clone(); // the ByteLevel step splits each Split piece again, with a prefix space
  v.pre_tokenizer.pretokenizers[1].use_regex = true;
  v.pre_tokenizer.pretokenizers[1].add_prefix_space = true;
  out.push(['split-then-bytelevel-regex', v]);
  v = clone();
  v.model.ignore_merges = true;
  out.push(['ignore-merges', v]);
  v = clone(); // added-token options, normalized (NFC) added tokens, a BOS template
  const vocab = v.model.vocab;
  let next = Math.max(...v.added_tokens.map((t) => t.id)) + 1;
  const add = (t) => {
    const id = Object.prototype.hasOwnProperty.call(vocab, t.content) ? vocab[t.content] : next++;
    v.added_tokens.push(Object.assign({ id, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: false }, t));
  };
  add({ content: '<|usr|>', lstrip: true, rstrip: true, special: true });
  add({ content: 'caf\u00e9', normalized: true });
  add({ content: 'qqx', single_word: true });
  add({ content: '\u4e16\u754c!', normalized: false });
  v.post_processor = { type: 'Sequence', processors: [
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<|im_start|>', type_id: 0 } },
      { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|im_end|>', type_id: 0 } }],
    pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|im_start|>': { id: '<|im_start|>', ids: [151644], tokens: ['<|im_start|>'] },
      '<|im_end|>': { id: '<|im_end|>', ids: [151645], tokens: ['<|im_end|>'] } } }] };
  out.push(['added-options', v]);
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
  let encOk = 0, decOk = 0, total = 0, prepOk = 0;
  const prep = path.join(a.tmp, `${name}.prepared`);
  if (a.prepared) {
    const p = spawnSync(a.wick, ['tokenize', tokPath, '--prepare', prep], { encoding: 'utf8' });
    if (p.status !== 0) {
      console.error(`FAIL: ${a.wick} tokenize ${tokPath} --prepare exited ${p.status}: ${p.stderr}`);
      process.exit(1);
    }
  }
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
    if (a.prepared) {
      const po = runWick(a.wick, prep, jsonl, special);
      for (let i = 0; i < out.length; i++) {
        if (JSON.stringify(po[i]) === JSON.stringify(out[i])) prepOk++;
        else report(`prepared against JSON (special=${special}), line ${i}`,
                    strings[i % strings.length], out[i], po[i]);
      }
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
  console.log(`${name}: ${encOk}/${total} encodings agree, ${decOk}/${total} decodings agree` +
              (a.prepared ? `; prepared: ${prepOk}/${2 * total} lines as the JSON's` : ''));
  return bad === 0;
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const { Tokenizer } = require(path.resolve(a.hf));
  const strings = a.set === 'bytelevel' ? genStringsBL(a.count, a.seed)
    : genStrings(a.count, a.seed);
  let ok = true;
  for (const f of a.files) {
    const base = path.basename(path.dirname(f)) + '-' + path.basename(f, '.json');
    ok = (await compare(a, Tokenizer, base, f, strings)) && ok;
    if (!a.variants) continue;
    const json0 = JSON.parse(fs.readFileSync(f, 'utf8'));
    for (const [vname, json] of (isByteLevel(json0) ? variantsBL : variants)(json0)) {
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
