#!/usr/bin/env node
// chat_check.js - checks `wick tokenize MODEL --chat` on a GLM-5 model directory (its
// tokenizer.json made by glm_tokenizer.js): the GLM special tokens come out as their real ids
// at the right places, and the whole id list is what Hugging Face's tokenizers gives for the
// rendered text.
//
//   node tests/tools/chat_check.js --wick WICK --hf NODE_MODULES/tokenizers --tmp DIR MODEL_DIR
'use strict';
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

const ID = { '[gMASK]': 154822, '<sop>': 154824, '<|system|>': 154826, '<|user|>': 154827,
  '<|assistant|>': 154828, '<|observation|>': 154829, '<think>': 154841, '</think>': 154842 };

// Each case: messages, wick flags, and the expected ids with each text span written as null
// (any run of ordinary ids, at least one).
const CASES = [
  { name: 'system+user, thinking on', flags: [],
    messages: [{ role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'What is 12345 + 678?' }],
    want: ['[gMASK]', '<sop>', '<|system|>', null, '<|user|>', null, '<|assistant|>', '<think>'] },
  { name: 'user, thinking off', flags: ['--no-think'],
    messages: [{ role: 'user', content: '你好，世界! 😀' }],
    want: ['[gMASK]', '<sop>', '<|user|>', null, '<|assistant|>', '</think>'] },
  { name: 'history and tools', flags: [],
    messages: [{ role: 'user', content: "It's here" },
      { role: 'assistant', content: '<think>secret</think>\n\nAnswer one.' },
      { role: 'tool', content: '{"temp": 21}' },
      { role: 'user', content: 'And <think> inside text?' }],
    want: ['[gMASK]', '<sop>', '<|user|>', null, '<|assistant|>', '</think>', null,
      '<|observation|>', null, '<|user|>', null, '<think>', null, '<|assistant|>',
      '<think>'] },
  { name: 'no generation prompt', flags: ['--no-generation-prompt'],
    messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: ' a ' }],
    want: ['[gMASK]', '<sop>', '<|user|>', null, '<|assistant|>', '</think>', null] },
];

function matches(ids, want) {
  // want: special names and null (one or more ordinary ids)
  let i = 0;
  for (const w of want) {
    if (w !== null) {
      if (ids[i] !== ID[w]) return false;
      i++;
      continue;
    }
    const start = i;
    while (i < ids.length && !Object.values(ID).includes(ids[i])) i++;
    if (i === start) return false;
  }
  return i === ids.length;
}

async function main() {
  const argv = process.argv.slice(2);
  const a = { files: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--wick') a.wick = argv[++i];
    else if (argv[i] === '--hf') a.hf = argv[++i];
    else if (argv[i] === '--tmp') a.tmp = argv[++i];
    else a.files.push(argv[i]);
  }
  if (!a.wick || !a.hf || !a.tmp || a.files.length !== 1) {
    console.error('usage: chat_check.js --wick WICK --hf TOKENIZERS_DIR --tmp DIR MODEL_DIR');
    process.exit(2);
  }
  const dir = a.files[0];
  const { Tokenizer } = require(path.resolve(a.hf));
  const hf = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  let bad = 0;
  for (const c of CASES) {
    const f = path.join(a.tmp, 'chat.json');
    fs.writeFileSync(f, JSON.stringify(c.messages));
    const p = spawnSync(a.wick, ['tokenize', dir, '--chat', f, ...c.flags], { encoding: 'utf8' });
    if (p.status !== 0) {
      console.error(`FAIL: ${c.name}: wick exited ${p.status}: ${p.stderr}`);
      process.exit(1);
    }
    const out = JSON.parse(p.stdout);
    const hfIds = (await hf.encode(out.text, null, { addSpecialTokens: false })).getIds();
    const okSpecial = matches(out.ids, c.want);
    const okHf = JSON.stringify(hfIds) === JSON.stringify(out.ids);
    if (!okSpecial || !okHf) {
      bad++;
      console.error(`MISMATCH ${c.name}: text ${JSON.stringify(out.text)}\n  wick: ` +
        `${JSON.stringify(out.ids)}\n  hf:   ${JSON.stringify(hfIds)}\n  want: ` +
        `${JSON.stringify(c.want.map((w) => (w === null ? '...' : ID[w])))}`);
    } else {
      console.log(`${c.name}: ${JSON.stringify(out.text)} -> ${out.ids.length} ids, ` +
        'special ids in place, same as HF');
    }
  }
  if (bad) {
    console.error(`FAIL: ${bad} chat cases`);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(`FAIL: ${e.stack || e}`);
  process.exit(1);
});
