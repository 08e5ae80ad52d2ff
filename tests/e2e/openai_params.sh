# OpenAI's request parameters beyond the basics, through wick dev and a queue job on
# stories260K, with the official `openai` npm client: log probabilities, logit processing and
# structured output.
#   1. a queue job (input.logprobs, top_logprobs 3, greedy): an entry for each of token_ids,
#      each logprob and its top 3 the log-softmax of `wick logits` over the same ids (another
#      path: no scheduler, no worker, one prefill), the tokens' bytes make the text
#   2. /v1/completions with the same prompt (logprobs 3): the legacy shape (tokens,
#      token_logprobs, top_logprobs, text_offset) with the job's very numbers, whole and
#      streamed
#   3. a chat (logprobs, top_logprobs 2), whole and streamed: the same entries, spread over
#      the chunks, the tokens making the content; sampled (temperature 1.3, top_k 4, with
#      speculation) the logprobs are still the model's, not the sampler's
#   4. refusals: top_logprobs 21, top_logprobs without logprobs, completions logprobs 21
#   5. the logit processing the same requests take: logit_bias (a token banned never comes, one
#      favoured is all that comes, an id outside the vocabulary a 400), frequency_penalty and
#      presence_penalty (greedy: the text changes, and its logprobs stay the model's own)
#   6. structured output: response_format json_schema (greedy with a free string, sampled, with
#      string lengths and integer ranges, and
#      streamed: each ends with the document, which parses and has the schema's keys and
#      types), json_object (an object, or cut by max_tokens where it began one), a schema
#      keyword not supported a 400 naming it, a queue job's output.text
#   7. scoring (lm-evaluation-harness's requests): a queue job with a prompt of token ids,
#      prompt_logprobs 3 and max_tokens 0, each entry against wick logits (its rank too);
#      vLLM's prompt_logprobs member, keyed by id, the job's numbers; /v1/completions
#      with echo (max_tokens 0 and 1, a token-id prompt and a batch of one), its numbers the
#      job's, whole and streamed (the prompt's chunk first)
#   8. several choices: a list of token-id prompts (lm-evaluation-harness's batches) scored in
#      one request, each choice the job's numbers; n 3 with a seed, choice i the lone request
#      with seed + i; a chat streamed with n 2, joined by index; n 129 refused
#   9. the prefix cache: a prompt sent again has all but its last token cached, a chat's next
#      turn most of its prompt, and n 4 choices run one prefill (3 copies of it), n 3 with
#      prompt_logprobs too (the first choice scores the prompt for all); the answers are
#      those of a server with --prefix-cache off
#  10. vLLM's /tokenize (a prompt's and a chat's count, as their requests bill them) and
#      /detokenize (the ids back into the prompt)
#  11. OpenAI's Responses API (client.responses): the chat's very text, usage and logprobs
#      (greedy, and sampled with a seed), whole, streamed (responses.stream's events in order,
#      numbered, its final response the same) and cut at max_output_tokens (incomplete);
#      instructions billed as a system message; text.format json_schema; previous_response_id
#      (the chat of the whole conversation; inputTokens.count counts what these bill), its
#      input items paged through inputItems.list, a kept response read back and deleted, store
#      false keeping none; the refusals
#  12. Anthropic's Messages API (@anthropic-ai/sdk's messages): the chat's text and usage
#      (input_tokens + cache_read_input_tokens its prompt_tokens), whole and streamed
#      (messages.stream's events in order, its final message the same), also under Claude
#      Code's own model name (--model-alias 'claude-*'); stop_sequences cut
#      the text (stop_reason stop_sequence, the string); system (a string or text blocks)
#      billed as a system message, as countTokens counts; max_tokens 100000 held to the
#      limit; refusals in Anthropic's shape (no max_tokens, an image, a server tool: 400
#      invalid_request_error; an unknown model: 404 not_found_error)
#  13. --responses-dir: a dev session ends idle and a new one goes on from its response
#      (previous_response_id through the official client: the chat of the whole
#      conversation, its turns before read from the prefix cache the first left with
#      --prefix-cache-dir), reads it back and deletes it, and a third has it not
source tests/e2e/lib.sh
need_openai
need_anthropic
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$TMPD"' EXIT
m=$(stories)
PROMPT="Once upon a time, Lily"

# 1. a queue job, against wick logits
mkdir -p "$TMPD/jobs"
python3 - "$PROMPT" >"$TMPD/jobs/j.json" <<'EOF' || fail "the job"
import json, sys
print(json.dumps({"id": "lp1", "input": {"prompt": sys.argv[1], "max_tokens": 24,
                  "temperature": 0, "logprobs": True, "top_logprobs": 3}}))
EOF
spool_jobs "$m" "$TMPD/q" "$TMPD/jobs/j.json"
[ -f "$TMPD/q/done/lp1.json" ] || fail "no result for the job: $(ls -R "$TMPD/q")"
cp "$TMPD/q/done/lp1.json" "$TMPD/job.json"
pids=$("$WICK" tokenize "$m" --text "$PROMPT" | python3 -c 'import json, sys
print(",".join(map(str, json.load(sys.stdin)["ids"])))')
python3 - "$TMPD/job.json" "$pids" >"$TMPD/ids" <<'EOF' || fail "the job's result"
import json, sys
r = json.load(open(sys.argv[1]))
o, u = r["output"], r["usage"]
ids = [int(x) for x in sys.argv[2].split(",")]
if u["prompt_tokens"] == len(ids) + 1:
    ids = [1] + ids  # the BOS the tokenizer's post-processor adds
assert u["prompt_tokens"] == len(ids), (u, ids)
print(",".join(map(str, ids + o["token_ids"])))
EOF
"$WICK" logits "$m" --tokens "$(cat "$TMPD/ids")" --all-positions >"$TMPD/logits.json" ||
  fail "wick logits"
python3 - "$TMPD/job.json" "$TMPD/logits.json" <<'EOF' || fail "the job's logprobs"
import json, math, sys
r = json.load(open(sys.argv[1]))
rows = json.load(open(sys.argv[2]))["logits"]
o = r["output"]
lp = o["logprobs"]["content"]
n = len(o["token_ids"])
assert len(lp) == n == r["usage"]["completion_tokens"], (len(lp), n)
text = b"".join(bytes(e["bytes"]) for e in lp).decode()
assert text == o["text"], (text, o["text"])
worst = 0
for k, (tok, e) in enumerate(zip(o["token_ids"], lp)):
    row = rows[len(rows) - n - 1 + k]  # the logits before token k
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    worst = max(worst, abs(e["logprob"] - (row[tok] - lse)))
    order = sorted(range(len(row)), key=lambda v: (-row[v], v))[:3]
    assert len(e["top_logprobs"]) == 3, e
    for t, v in zip(e["top_logprobs"], order):
        assert abs(t["logprob"] - (row[v] - lse)) < 1e-3, (k, t, v)
    assert e["top_logprobs"][0]["bytes"] == e["bytes"], (k, e)  # greedy: the top one
assert worst < 1e-3, worst
print(f"1. a queue job: {n} tokens, each logprob and top 3 within {worst:.1g} of the "
      f"log-softmax of wick logits; the bytes make the text")
EOF

# 2-4 through wick dev (with speculation, so that a step's rows past the first give tokens)
P=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
"$WICK" dev --model "$m" --listen 127.0.0.1:$P --idle-timeout 60 --speculate 3 \
  --draft-cost 0.1 --ledger "$TMPD/ledger" --model-alias 'claude-*' 2>"$TMPD/dev.log" &
wait_dev $P $! "$TMPD/dev.log"
node - "$OPENAI" "http://127.0.0.1:$P/v1" "$(basename "$m")" "$PROMPT" \
  "$TMPD/job.json" <<'EOF' || fail "the openai client"
const [openaiDir, base, model, prompt, jobPath] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const fs = require('fs');
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const job = JSON.parse(fs.readFileSync(jobPath)).output;
const text = (entries) => Buffer.concat(entries.map((e) => Buffer.from(e.bytes))).toString();
const near = (a, b) => Math.abs(a - b) < 1e-6;
let section6 = false;
const person = (names) => ({ type: 'object', required: ['age', 'happy', 'pet', 'name'],
  properties: { age: { type: 'integer' }, happy: { type: 'boolean' },
                pet: { enum: ['cat', 'dog'] },
                name: names ? { enum: names } : { type: 'string' } } });
const checkPerson = (text, what) => {
  let v = null;
  try { v = JSON.parse(text); } catch (x) { assert(false, `${what}: not JSON: ${text}`); }
  assert(Object.keys(v).sort().join() === 'age,happy,name,pet' && Number.isInteger(v.age) &&
         typeof v.happy === 'boolean' && ['cat', 'dog'].includes(v.pet) &&
         typeof v.name === 'string', `${what}: not the schema's: ${text}`);
  return v;
};
(async () => {
  // 2. legacy completions: the job's numbers
  const c = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0,
                                              logprobs: 3 });
  const l = c.choices[0].logprobs;
  assert(c.choices[0].text === job.text, `completion text ${c.choices[0].text}`);
  const want = job.logprobs.content;
  assert(l.tokens.length === want.length && l.tokens.join('') === c.choices[0].text,
         `tokens ${JSON.stringify(l.tokens)}`);
  let off = 0;
  for (let k = 0; k < want.length; k++) {
    assert(near(l.token_logprobs[k], want[k].logprob), `token_logprobs[${k}]`);
    assert(l.text_offset[k] === off, `text_offset[${k}] ${l.text_offset[k]}, want ${off}`);
    off += [...l.tokens[k]].length;
    const top = l.top_logprobs[k];
    for (const t of want[k].top_logprobs)
      assert(near(top[t.token], t.logprob), `top_logprobs[${k}][${t.token}]`);
  }
  const cs = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0,
                                               logprobs: 3, stream: true });
  const sl = [];
  for await (const ch of cs)
    if (ch.choices[0].logprobs) sl.push(...ch.choices[0].logprobs.token_logprobs);
  assert(sl.length === want.length && sl.every((x, k) => near(x, want[k].logprob)),
         `streamed token_logprobs ${JSON.stringify(sl)}`);
  console.log(`2. completions: the job's ${want.length} logprobs, tokens and text offsets; ` +
              'streamed the same');

  // 3. chat, whole and streamed
  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 30,
                                                   temperature: 0, logprobs: true,
                                                   top_logprobs: 2 });
  const e = r.choices[0].logprobs.content;
  assert(e.length === r.usage.completion_tokens, `${e.length} entries, ` +
         `${r.usage.completion_tokens} tokens`);
  assert(text(e) === r.choices[0].message.content, 'the bytes do not make the content');
  for (const x of e) {
    assert(x.logprob <= 0 && x.top_logprobs.length === 2, JSON.stringify(x));
    assert(x.top_logprobs[0].token === x.token && near(x.top_logprobs[0].logprob, x.logprob),
           `greedy, not the top token: ${JSON.stringify(x)}`);
    assert(x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob, 'tops out of order');
  }
  const s = await client.chat.completions.create({ model, messages, max_tokens: 30,
                                                   temperature: 0, logprobs: true,
                                                   top_logprobs: 2, stream: true });
  const se = [];
  let chunks = 0, content = '';
  for await (const ch of s) {
    const d = ch.choices[0];
    if (d && d.delta && d.delta.content) content += d.delta.content;
    if (d && d.logprobs) { se.push(...d.logprobs.content); chunks++; }
  }
  assert(content === r.choices[0].message.content, 'streamed content');
  assert(se.length === e.length && se.every((x, k) => x.token === e[k].token &&
                                            near(x.logprob, e[k].logprob)),
         `streamed entries ${JSON.stringify(se.map((x) => x.token))}`);
  assert(chunks > 1, `the entries came in ${chunks} chunk(s)`);
  // sampled: the model's logprobs, not the sampler's
  const h = await client.chat.completions.create({ model, messages, max_tokens: 30,
                                                   temperature: 1.3, top_k: 4, seed: 5,
                                                   logprobs: true, top_logprobs: 5 });
  const he = h.choices[0].logprobs.content;
  assert(text(he) === h.choices[0].message.content, 'sampled: the bytes');
  for (const x of he) {
    const t = x.top_logprobs.find((y) => y.token === x.token);
    assert(t && near(t.logprob, x.logprob), `sampled outside the top 4? ${JSON.stringify(x)}`);
    const mass = x.top_logprobs.reduce((a, y) => a + Math.exp(y.logprob), 0);
    assert(mass <= 1 + 1e-5, `top 5 mass ${mass}`);
  }
  console.log(`3. chat: ${e.length} entries (the tokens make the content), streamed the same ` +
              `in ${chunks} chunks; sampled at 1.3, top_k 4: the model's own logprobs`);

  // 4. refusals
  const bad = [
    [() => client.chat.completions.create({ model, messages, logprobs: true, top_logprobs: 21 }),
     'top_logprobs'],
    [() => client.chat.completions.create({ model, messages, top_logprobs: 2 }), 'top_logprobs'],
    [() => client.completions.create({ model, prompt, logprobs: 21 }), 'logprobs']];
  for (const [call, param] of bad) {
    let err = null;
    try { await call(); } catch (x) { err = x; }
    assert(err && err.status === 400 && err.param === param,
           `want a 400 naming ${param}: ${err && err.status} ${err && err.message}`);
  }
  console.log('4. refused: top_logprobs 21, top_logprobs without logprobs, logprobs 21');

  // 5. logit processing
  const ids = job.token_ids;
  const first = job.logprobs.content[0].token;
  const ban = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0,
                                                logit_bias: { [ids[0]]: -100 }, logprobs: 1 });
  const bt = ban.choices[0].logprobs.tokens;
  assert(!bt.includes(first) && ban.choices[0].text !== job.text,
         `banned ${JSON.stringify(first)}: ${JSON.stringify(bt)}`);
  const up = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0.8,
                                               seed: 3, logit_bias: { [ids[2]]: 100 } });
  const want8 = job.logprobs.content[2].token.repeat(8);
  assert(up.choices[0].text === want8, `favoured: ${JSON.stringify(up.choices[0].text)}`);
  const plain = await client.completions.create({ model, prompt, max_tokens: 60,
                                                  temperature: 0 });
  for (const pen of [{ frequency_penalty: 1.5 }, { presence_penalty: 2 }]) {
    const q = await client.completions.create({ model, prompt, max_tokens: 60, temperature: 0,
                                                logprobs: 1, ...pen });
    const ql = q.choices[0].logprobs;
    assert(q.choices[0].text !== plain.choices[0].text, `${JSON.stringify(pen)}: the same text`);
    // the tokens before the first that differs: the job's own logprobs (raw, unpenalized)
    for (let k = 0; k < want.length && ql.tokens[k] === want[k].token; k++)
      assert(near(ql.token_logprobs[k], job.logprobs.content[k].logprob),
             `${JSON.stringify(pen)}: token ${k}'s logprob is not the model's`);
  }
  let err = null;
  try {
    await client.completions.create({ model, prompt, logit_bias: { 100000: 1 } });
  } catch (x) { err = x; }
  assert(err && err.status === 400 && /outside the vocabulary/.test(err.message),
         `an id outside the vocabulary: ${err && err.message}`);
  section6 = true;
  console.log(`5. logit_bias: ${JSON.stringify(first)} banned never comes, ` +
              `${JSON.stringify(job.logprobs.content[2].token)} at +100 is all that comes ` +
              '(sampled); frequency and presence penalties change the text; an id outside ' +
              'the vocabulary is a 400');

  // 6. structured output
  assert(section6, 'section 5 did not run');
  const fmt = (names) => ({ type: 'json_schema',
                            json_schema: { name: 'person', strict: true, schema: person(names) } });
  const g = await client.chat.completions.create({ model, messages, max_tokens: 400,
                                                   temperature: 0, response_format: fmt() });
  assert(g.choices[0].finish_reason === 'stop', `greedy: ${g.choices[0].finish_reason}`);
  const gv = checkPerson(g.choices[0].message.content, 'greedy');
  const names = ['Lily', 'Ben', 'Tom'];
  for (const seed of [1, 2, 3]) {
    const h = await client.chat.completions.create({ model, messages, max_tokens: 400, seed,
                                                     temperature: 0.7,
                                                     response_format: fmt(names) });
    assert(h.choices[0].finish_reason === 'stop', `seed ${seed}: ${h.choices[0].finish_reason}`);
    assert(names.includes(checkPerson(h.choices[0].message.content, `seed ${seed}`).name),
           'a name outside the enum');
  }
  const st = await client.chat.completions.create({ model, messages, max_tokens: 400,
                                                    temperature: 0, response_format: fmt(),
                                                    stream: true });
  let sc = '';
  for await (const ch of st) sc += ch.choices[0]?.delta?.content || '';
  assert(sc === g.choices[0].message.content, `streamed: ${sc}`);
  const o = await client.completions.create({ model, prompt, max_tokens: 60, temperature: 0,
                                              response_format: { type: 'json_object' } });
  const ot = o.choices[0].text;
  if (o.choices[0].finish_reason === 'stop')
    assert(typeof JSON.parse(ot) === 'object' && !Array.isArray(JSON.parse(ot)), ot);
  else
    assert(/^\s*\{/.test(ot), `json_object: ${ot}`);
  // bounds: a name of 3 to 8 characters, an age from 18 to 99, a count above 0
  const bounded = { type: 'object', additionalProperties: false,
                    required: ['name', 'age', 'n', 'day', 'code', 'score', 'price', 'dozens'],
                    properties: { name: { type: 'string', minLength: 3, maxLength: 8 },
                                  age: { type: 'integer', minimum: 18, maximum: 99 },
                                  n: { type: 'integer', exclusiveMinimum: 0 },
                                  day: { type: 'string', format: 'date' },
                                  code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
                                  score: { type: 'number', minimum: 0, maximum: 1 },
                                  price: { type: 'number', minimum: 0, multipleOf: 0.01 },
                                  dozens: { type: 'integer', minimum: 1, maximum: 100,
                                            multipleOf: 12 } } };
  const seen = [];
  for (const seed of [1, 2, 3, 4]) {
    const b = await client.chat.completions.create({ model, messages, max_tokens: 200, seed,
      temperature: 1.0, response_format: { type: 'json_schema',
                                           json_schema: { name: 'b', schema: bounded } } });
    assert(b.choices[0].finish_reason === 'stop', `bounded ${seed}: ${b.choices[0].finish_reason}`);
    const v = JSON.parse(b.choices[0].message.content);
    const len = [...v.name].length;
    const day = /^(\d{4})-(\d{2})-(\d{2})$/.exec(v.day);
    const real = day && new Date(`${v.day}T00:00:00Z`).getUTCDate() === Number(day[3]);
    // (the price's text: at most 2 digits after its point, a multiple of 0.01)
    const cents = /"price"\s*:\s*-?(\d+)(\.(\d{1,2}))?\s*[,}]/.test(b.choices[0].message.content);
    assert(len >= 3 && len <= 8 && Number.isInteger(v.age) && v.age >= 18 && v.age <= 99 &&
           Number.isInteger(v.n) && v.n > 0 && real && /^[A-Z]{2}-\d{3}$/.test(v.code) &&
           typeof v.score === 'number' && v.score >= 0 && v.score <= 1 && cents &&
           Number.isInteger(v.dozens) && v.dozens % 12 === 0 && v.dozens >= 12 && v.dozens <= 96,
           `bounded ${seed}: ${b.choices[0].message.content}`);
    seen.push(v);
  }
  let err6 = null;
  try {
    const schema = { type: 'string', format: 'uri' };
    await client.chat.completions.create({ model, messages, response_format: {
      type: 'json_schema', json_schema: { name: 'x', schema } } });
  } catch (x) { err6 = x; }
  assert(err6 && err6.status === 400 && /"uri"/.test(err6.message),
         `format uri: ${err6 && err6.message}`);
  err6 = null;
  try {
    const schema = { type: 'number', multipleOf: 0.3 };
    await client.chat.completions.create({ model, messages, response_format: {
      type: 'json_schema', json_schema: { name: 'x', schema } } });
  } catch (x) { err6 = x; }
  assert(err6 && err6.status === 400 && /multipleOf/.test(err6.message),
         `multipleOf 0.3: ${err6 && err6.message}`);
  console.log(`6. structured output: ${JSON.stringify(gv)} (greedy, whole and streamed), ` +
              `3 sampled from the enum of names; json_object ${o.choices[0].finish_reason}; ` +
              `4 sampled within minLength, maxLength, minimum, maximum, exclusiveMinimum, ` +
              `format date, a pattern, a number in [0, 1], multipleOf 0.01 and 12 ` +
              `(${JSON.stringify(seen[0])}); format uri and multipleOf 0.3 are 400s naming them`);
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF

# 6 (continued). a queue job with response_format
python3 - >"$TMPD/jobs/s.json" <<'EOF' || fail "the structured job"
import json
schema = {"type": "object", "required": ["pet", "happy"],
          "properties": {"pet": {"enum": ["cat", "dog"]}, "happy": {"type": "boolean"}}}
print(json.dumps({"id": "s1", "input": {"prompt": "Once upon a time", "max_tokens": 200,
                  "temperature": 0, "response_format": {"type": "json_schema",
                  "json_schema": {"name": "s", "schema": schema}}}}))
EOF
spool_jobs "$m" "$TMPD/q" "$TMPD/jobs/s.json"
python3 - "$TMPD/q/done/s1.json" <<'EOF' || fail "the structured job's result"
import json, sys
r = json.load(open(sys.argv[1]))
o = r["output"]
assert r["status"] == "COMPLETED" and o["finish_reason"] == "stop", r
v = json.loads(o["text"])
assert sorted(v) == ["happy", "pet"] and v["pet"] in ("cat", "dog"), o["text"]
assert isinstance(v["happy"], bool), o["text"]
print("6. a queue job with response_format json_schema:", json.dumps(v))
EOF
# 7. scoring a text (lm-evaluation-harness's way): prompt logprobs, echo, token-id prompts.
# A queue job scores section 1's ids (its prompt and its 24 tokens) with max_tokens 0: each
# entry is the log-softmax of wick logits' row before it, the first null.
python3 - "$(cat "$TMPD/ids")" >"$TMPD/jobs/p.json" <<'EOF' || fail "the scoring job"
import json, sys
ids = [int(x) for x in sys.argv[1].split(",")]
print(json.dumps({"id": "pl1", "input": {"prompt": ids, "max_tokens": 0,
                  "prompt_logprobs": 3}}))
EOF
spool_jobs "$m" "$TMPD/q" "$TMPD/jobs/p.json"
python3 - "$TMPD/q/done/pl1.json" "$TMPD/logits.json" "$(cat "$TMPD/ids")" \
  "$TMPD/job.json" <<'EOF' || fail "the scoring job's result"
import json, math, sys
r = json.load(open(sys.argv[1]))
rows = json.load(open(sys.argv[2]))["logits"]
ids = [int(x) for x in sys.argv[3].split(",")]
job = json.load(open(sys.argv[4]))["output"]
o = r["output"]
assert r["status"] == "COMPLETED" and o["token_ids"] == [] and o["finish_reason"] == "length", r
assert o["prompt_token_ids"] == ids and r["usage"]["prompt_tokens"] == len(ids), o
pl = o["prompt_logprobs"]
assert len(pl) == len(ids) and pl[0]["logprob"] is None and pl[0]["top_logprobs"] == [], pl[0]
worst = 0
for k in range(1, len(ids)):
    row = rows[k - 1]
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    worst = max(worst, abs(pl[k]["logprob"] - (row[ids[k]] - lse)))
    order = sorted(range(len(row)), key=lambda v: (-row[v], v))[:3]
    assert len(pl[k]["top_logprobs"]) == 3, pl[k]
    for t, v in zip(pl[k]["top_logprobs"], order):
        assert abs(t["logprob"] - (row[v] - lse)) < 1e-3 and t["id"] == v, (k, t, v)
    # vLLM's rank: 1 + the tokens the model found likelier
    assert pl[k]["rank"] == 1 + sum(x > row[ids[k]] for x in row), (k, pl[k]["rank"])
assert worst < 1e-3, worst
# the job of section 1 generated the last 24 of these: the same numbers
n = len(job["token_ids"])
d = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(pl[-n:], job["logprobs"]["content"]))
assert d < 1e-5, d
text = b"".join(bytes(e["bytes"]) for e in pl).decode()
assert text.endswith(job["text"]), (text, job["text"])
print(f"7. a scoring job (max_tokens 0, {len(ids)} token ids): each prompt logprob and top 3 "
      f"within {worst:.1g} of wick logits, each rank and alternative's id theirs; its last "
      f"{n} are the generating job's (within {d:.1g})")
EOF
node - "$OPENAI" "http://127.0.0.1:$P/v1" "$(basename "$m")" "$(cat "$TMPD/ids")" \
  "$TMPD/q/done/pl1.json" <<'EOF' || fail "the openai client: echo"
const [openaiDir, base, model, idList, scored] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const fs = require('fs');
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const near = (a, b) => Math.abs(a - b) < 1e-6;
const ids = idList.split(',').map(Number);
const pl = JSON.parse(fs.readFileSync(scored)).output.prompt_logprobs;
const ptext = Buffer.concat(pl.map((e) => Buffer.from(e.bytes))).toString();
(async () => {
  // the job's numbers through echo: max_tokens 0, a token-id prompt
  const a = await client.completions.create({ model, prompt: ids, max_tokens: 0, echo: true,
                                              logprobs: 3 });
  const l = a.choices[0].logprobs;
  assert(a.choices[0].text === ptext, `echo text ${JSON.stringify(a.choices[0].text)}`);
  assert(l.tokens.length === ids.length && l.token_logprobs[0] === null &&
         l.top_logprobs[0] === null, `first entry ${l.tokens[0]} ${l.token_logprobs[0]}`);
  for (let k = 1; k < ids.length; k++) {
    assert(near(l.token_logprobs[k], pl[k].logprob), `token_logprobs[${k}]`);
    for (const t of pl[k].top_logprobs)
      assert(near(l.top_logprobs[k][t.token], t.logprob), `top_logprobs[${k}][${t.token}]`);
  }
  let off = 0;
  for (let k = 0; k < ids.length; k++) {
    assert(l.text_offset[k] === off, `text_offset[${k}]`);
    off += [...l.tokens[k]].length;
  }
  assert(a.usage.prompt_tokens === ids.length && a.usage.completion_tokens === 0, 'usage');
  // lm-evaluation-harness's loglikelihood request: a batch of one token-id context, one token
  // more, greedy; the continuation's logprobs are token_logprobs[ctxlen:-1]
  const ctxlen = 6;
  const b = await client.completions.create({ model, prompt: [ids], max_tokens: 1,
                                              temperature: 0, echo: true, logprobs: 1 });
  const bl = b.choices[0].logprobs;
  assert(bl.tokens.length === ids.length + 1, `${bl.tokens.length} tokens`);
  const cont = bl.token_logprobs.slice(ctxlen, -1);
  const sum = cont.reduce((x, y) => x + y, 0);
  const want = pl.slice(ctxlen).reduce((x, e) => x + e.logprob, 0);
  assert(Math.abs(sum - want) < 1e-4, `loglikelihood ${sum}, want ${want}`);
  let greedy = true;
  for (let k = ctxlen; k < ids.length; k++) {
    const top = Object.values(bl.top_logprobs[k]);
    greedy = greedy && near(bl.token_logprobs[k], Math.max(...top));
  }
  assert(b.choices[0].text.startsWith(ptext) && b.choices[0].text.length > ptext.length,
         'echo + 1 token');
  // streamed: the prompt's chunk first, then the tokens; the same text and numbers
  const s = await client.completions.create({ model, prompt: ids, max_tokens: 5, temperature: 0,
                                              echo: true, logprobs: 2, stream: true });
  let st = '', sl = [], first = null;
  for await (const ch of s) {
    const c = ch.choices[0];
    if (first === null) first = c.text;
    st += c.text;
    if (c.logprobs) sl.push(...c.logprobs.token_logprobs);
  }
  const w = await client.completions.create({ model, prompt: ids, max_tokens: 5, temperature: 0,
                                              echo: true, logprobs: 2 });
  assert(first === ptext, `the stream's first chunk ${JSON.stringify(first)}`);
  assert(st === w.choices[0].text, `streamed ${JSON.stringify(st)}`);
  const wl = w.choices[0].logprobs.token_logprobs;
  assert(sl.length === wl.length && sl.every((x, k) => x === wl[k] || near(x, wl[k])),
         `streamed token_logprobs ${sl.length} of ${wl.length}`);
  // refused: max_tokens 0 without echo, an id outside the vocabulary
  for (const [req, what] of [[{ prompt: ids, max_tokens: 0 }, /max_tokens/],
                             [{ prompt: [1, 100000], echo: true }, /outside the vocabulary/]]) {
    let err = null;
    try { await client.completions.create({ model, ...req }); } catch (x) { err = x; }
    assert(err && err.status === 400 && what.test(err.message), `${err && err.message}`);
  }
  console.log(`7. echo: a token-id prompt scored with max_tokens 0 gives the job's ` +
              `${ids.length - 1} logprobs, text and offsets; lm-eval's request ` +
              `(ctxlen ${ctxlen}): loglikelihood ${sum.toFixed(4)}, greedy ${greedy}; ` +
              `streamed, the prompt's chunk first and the same numbers; max_tokens 0 ` +
              'without echo and an id outside the vocabulary are 400s');
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF

# ... and vLLM's prompt_logprobs member: the same job's numbers, keyed by token id, with ranks
node - "$OPENAI" "http://127.0.0.1:$P/v1" "$(basename "$m")" "$(cat "$TMPD/ids")" \
  "$TMPD/q/done/pl1.json" <<'EOF' || fail "the openai client: prompt_logprobs"
const [openaiDir, base, model, idList, scored] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const fs = require('fs');
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const near = (a, b) => Math.abs(a - b) < 1e-6;
const ids = idList.split(',').map(Number);
const pl = JSON.parse(fs.readFileSync(scored)).output.prompt_logprobs;
// one position's dict against the job's entry k, with `most` alternatives
const check = (d, k, most, what) => {
  const e = pl[k], own = d[String(ids[k])];
  assert(own && near(own.logprob, e.logprob) && own.rank === e.rank,
         `${what}: position ${k}: ${JSON.stringify(own)} against ${e.logprob}, rank ${e.rank}`);
  const tops = e.top_logprobs.slice(0, most);
  tops.forEach((t, j) => {
    const x = d[String(t.id)];
    assert(x && near(x.logprob, t.logprob) && x.rank === j + 1 && x.decoded_token === t.token,
           `${what}: position ${k}, alternative ${j}: ${JSON.stringify(x)}`);
  });
  const extra = tops.some((t) => t.id === ids[k]) ? 0 : 1;
  assert(Object.keys(d).length === tops.length + extra, `${what}: position ${k}: ` +
         `${Object.keys(d).length} keys`);
};
(async () => {
  const a = await client.completions.create({ model, prompt: ids, max_tokens: 1,
                                              temperature: 0, prompt_logprobs: 3 });
  const p = a.choices[0].prompt_logprobs;
  assert(Array.isArray(p) && p.length === ids.length && p[0] === null, `${JSON.stringify(p)}`);
  for (let k = 1; k < ids.length; k++) check(p[k], k, 3, 'prompt_logprobs 3');
  const ranked = pl.slice(1).filter((e) => e.rank > 3).length;
  // beside echo with logprobs 1: the prompt scored with the larger, each shown as asked
  const b = await client.completions.create({ model, prompt: ids, max_tokens: 0, echo: true,
                                              logprobs: 1, prompt_logprobs: 2 });
  const bl = b.choices[0].logprobs;
  for (let k = 1; k < ids.length; k++) {
    assert(Object.keys(bl.top_logprobs[k]).length === 1, `echo's top_logprobs[${k}]`);
    check(b.choices[0].prompt_logprobs[k], k, 2, 'beside echo');
  }
  // a chat: its one prompt's, beside the choices (vLLM's place)
  const c = await client.chat.completions.create({ model, max_tokens: 2,
    messages: [{ role: 'user', content: 'Once upon a time' }], prompt_logprobs: 1 });
  assert(Array.isArray(c.prompt_logprobs) && c.prompt_logprobs.length === c.usage.prompt_tokens &&
         c.prompt_logprobs[0] === null && !('prompt_logprobs' in c.choices[0]),
         `chat: ${JSON.stringify(c.prompt_logprobs)}`);
  // refused: with stream, and past 20
  for (const [req, what] of [[{ stream: true, prompt_logprobs: 1 }, /stream/],
                             [{ prompt_logprobs: 21 }, /0 to 20/]]) {
    let err = null;
    try { await client.completions.create({ model, prompt: ids, ...req }); } catch (x) { err = x; }
    assert(err && err.status === 400 && err.param === 'prompt_logprobs' && what.test(err.message),
           `${err && err.message}`);
  }
  console.log(`7. vLLM's prompt_logprobs: ${ids.length - 1} positions, each the job's ` +
              `logprob and rank keyed by its id (${ranked} ranked past 3, listed beside the ` +
              'top 3), beside echo each shown as asked, a chat\'s beside its choices; with ' +
              'stream and past 20 400s');
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF

# 8. several choices: a batch of prompts (lm-evaluation-harness's batch_size > 1) and n, each
# choice what the same request alone gives
node - "$OPENAI" "http://127.0.0.1:$P/v1" "$(basename "$m")" "$(cat "$TMPD/ids")" \
  "$TMPD/q/done/pl1.json" <<'EOF' || fail "the openai client: several choices"
const [openaiDir, base, model, idList, scored] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const fs = require('fs');
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const ids = idList.split(',').map(Number);
const pl = JSON.parse(fs.readFileSync(scored)).output.prompt_logprobs;
(async () => {
  // three contexts scored in one request: each choice the prefix's own logprobs
  const lens = [7, 19, ids.length];
  const a = await client.completions.create({ model, prompt: lens.map((n) => ids.slice(0, n)),
                                              max_tokens: 0, echo: true, logprobs: 1 });
  assert(a.choices.length === 3, `${a.choices.length} choices`);
  let worst = 0;
  a.choices.forEach((c, i) => {
    assert(c.index === i, `choice ${i} has index ${c.index}`);
    const l = c.logprobs.token_logprobs;
    assert(l.length === lens[i] && l[0] === null, `choice ${i}: ${l.length} entries`);
    for (let k = 1; k < l.length; k++) worst = Math.max(worst, Math.abs(l[k] - pl[k].logprob));
  });
  assert(worst < 1e-4, `a batch's logprobs are ${worst} from the job's`);
  const want = lens.reduce((x, y) => x + y, 0);
  assert(a.usage.prompt_tokens === want && a.usage.completion_tokens === 0,
         `usage ${JSON.stringify(a.usage)}`);
  // n 3 with a seed: choice i is the lone request with seed + i
  const prompt = 'Once upon a time, Tom';
  const req = { model, prompt, max_tokens: 12, temperature: 1.0 };
  const n3 = await client.completions.create({ ...req, n: 3, seed: 5 });
  assert(n3.choices.length === 3, `${n3.choices.length} choices`);
  for (let i = 0; i < 3; i++) {
    const one = await client.completions.create({ ...req, seed: 5 + i });
    assert(n3.choices[i].index === i && n3.choices[i].text === one.choices[0].text,
           `choice ${i}: ${JSON.stringify(n3.choices[i].text)} vs seed ${5 + i}: ` +
           JSON.stringify(one.choices[0].text));
  }
  const distinct = new Set(n3.choices.map((c) => c.text)).size;
  assert(distinct > 1, 'the three choices are one text');
  const one = await client.completions.create({ ...req, seed: 5 });
  assert(n3.usage.prompt_tokens === one.usage.prompt_tokens, 'the prompt counted once');
  // a chat streamed with n 2: each choice's chunks by index make that choice's content
  const chat = { model, messages: [{ role: 'user', content: 'Tell me about a cat.' }],
                 max_tokens: 10, temperature: 0.9, seed: 11, n: 2 };
  const whole = await client.chat.completions.create(chat);
  const s = await client.chat.completions.create({ ...chat, stream: true,
                                                   stream_options: { include_usage: true } });
  const got = ['', ''], fins = [null, null];
  let usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      got[c.index] += c.delta.content || '';
      if (c.finish_reason) fins[c.index] = c.finish_reason;
    }
  }
  for (let i = 0; i < 2; i++)
    assert(got[i] === whole.choices[i].message.content && fins[i],
           `streamed choice ${i}: ${JSON.stringify(got[i])}`);
  assert(usage && usage.completion_tokens === whole.usage.completion_tokens, 'stream usage');
  let err = null;
  try { await client.completions.create({ ...req, n: 129 }); } catch (x) { err = x; }
  assert(err && err.status === 400 && /n is the number of choices/.test(err.message),
         `n 129: ${err && err.message}`);
  console.log(`8. several choices: 3 token-id contexts in one request scored within ` +
              `${worst.toExponential(1)} of the job's; n 3 with seed 5 gives the lone requests ` +
              `with seeds 5, 6, 7 (${distinct} distinct texts), the prompt counted once; a chat ` +
              'streamed with n 2 joins by index into the whole response\'s choices; n 129 a 400');
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF

# 9. the prefix cache: a prompt sent again, a chat's next turn; against a server without it
P2=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
"$WICK" dev --model "$m" --listen 127.0.0.1:$P2 --idle-timeout 60 --speculate 3 \
  --draft-cost 0.1 --prefix-cache off 2>"$TMPD/dev2.log" &
wait_dev $P2 $! "$TMPD/dev2.log"
node - "$OPENAI" "http://127.0.0.1:$P/v1" "http://127.0.0.1:$P2/v1" "$(basename "$m")" \
  <<'EOF' || fail "the openai client: prefix cache"
const [openaiDir, base, base2, model] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const on = new OpenAI({ apiKey: 'none', baseURL: base });
const off = new OpenAI({ apiKey: 'none', baseURL: base2 });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const cached = (r) => (r.usage.prompt_tokens_details || {}).cached_tokens || 0;
const lpGap = (a, b) => Math.max(...a.map((x, k) => Math.abs(x - b[k])));
(async () => {
  // the same prompt twice: the second runs only its last token, and gives the same tokens
  const req = { model, prompt: 'One sunny morning, a little bird named Pip flew over the',
                max_tokens: 8, temperature: 0, logprobs: 1 };
  const a = await on.completions.create(req);
  const b = await on.completions.create(req);
  assert(cached(b) === b.usage.prompt_tokens - 1,
         `the prompt again: ${cached(b)} of ${b.usage.prompt_tokens} cached`);
  assert(b.choices[0].text === a.choices[0].text, `${JSON.stringify(b.choices[0].text)}`);
  const g1 = lpGap(a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs);
  assert(g1 < 1e-4, `logprobs ${g1} apart`);
  // a conversation's next turn runs only what is new; the answer is the one a server without
  // the cache gives
  const turn1 = [{ role: 'user', content: 'Tell me a story about a frog named Bob.' }];
  const chat = { model, max_tokens: 16, temperature: 0, logprobs: true };
  const r1 = await on.chat.completions.create({ ...chat, messages: turn1 });
  const turn2 = [...turn1, { role: 'assistant', content: r1.choices[0].message.content },
                 { role: 'user', content: 'What did Bob do next?' }];
  const r2 = await on.chat.completions.create({ ...chat, messages: turn2 });
  const w2 = await off.chat.completions.create({ ...chat, messages: turn2 });
  assert(cached(r2) >= r1.usage.prompt_tokens / 2 && cached(r2) < r2.usage.prompt_tokens,
         `turn 2: ${cached(r2)} of ${r2.usage.prompt_tokens} cached (turn 1: ` +
         `${r1.usage.prompt_tokens} + ${r1.usage.completion_tokens})`);
  assert(cached(w2) === 0 && !w2.usage.prompt_tokens_details, 'the cache off reports none');
  assert(r2.choices[0].message.content === w2.choices[0].message.content,
         `turn 2: ${JSON.stringify(r2.choices[0].message.content)} against ` +
         JSON.stringify(w2.choices[0].message.content));
  const lp = (r) => r.choices[0].logprobs.content.map((e) => e.logprob);
  const g2 = lpGap(lp(r2), lp(w2));
  assert(g2 < 1e-4, `turn 2's logprobs ${g2} from the uncached server's`);
  const cachedTotal = async () => {
    const m = await (await fetch(base.replace('/v1', '/metrics'))).text();
    return Number((m.match(/^wick_prompt_cached_tokens_total (\d+)/m) || [])[1]);
  };
  // four choices of a new prompt: the first prefills it, the other three copy that prefill
  // (each has all but the last token cached, as /metrics counts per choice); they sample what
  // four prefills on the server without the cache sample
  const before = await cachedTotal();
  const four = { model, prompt: 'Anna found a shiny blue stone under the old oak tree, and',
                 max_tokens: 10, temperature: 0.9, seed: 11, n: 4 };
  const c4 = await on.completions.create(four);
  const w4 = await off.completions.create(four);
  const copied = (await cachedTotal()) - before;
  assert(copied === 3 * (c4.usage.prompt_tokens - 1),
         `4 choices of ${c4.usage.prompt_tokens} tokens: ${copied} cached`);
  for (let i = 0; i < 4; i++)
    assert(c4.choices[i].text === w4.choices[i].text,
           `choice ${i}: ${JSON.stringify(c4.choices[i].text)} against ` +
           JSON.stringify(w4.choices[i].text));
  assert(new Set(c4.choices.map((c) => c.text)).size > 1, 'the 4 choices are all one text');
  // three choices with prompt_logprobs: the first scores the prompt for all three, the
  // other two copy its prefill; every choice shows the same entries, the uncached server's
  const before3 = await cachedTotal();
  const three = { model, prompt: 'Tim had a red kite that flew over the hill and', n: 3,
                  max_tokens: 4, temperature: 0.9, seed: 3, prompt_logprobs: 2 };
  const c3 = await on.completions.create(three);
  const w3 = await off.completions.create(three);
  const copied3 = (await cachedTotal()) - before3;
  assert(copied3 === 2 * (c3.usage.prompt_tokens - 1),
         `3 scored choices of ${c3.usage.prompt_tokens} tokens: ${copied3} cached`);
  const plp0 = JSON.stringify(w3.choices[0].prompt_logprobs);
  assert(plp0.length > 20, `prompt_logprobs: ${plp0}`);
  for (let i = 0; i < 3; i++)
    assert(JSON.stringify(c3.choices[i].prompt_logprobs) === plp0 &&
           JSON.stringify(w3.choices[i].prompt_logprobs) === plp0 &&
           c3.choices[i].text === w3.choices[i].text,
           `scored choice ${i}: ${JSON.stringify(c3.choices[i])} against ` +
           JSON.stringify(w3.choices[i]));
  const total = await cachedTotal();
  assert(total >= cached(b) + cached(r2) + copied + copied3, `metrics: ${total} cached tokens`);
  console.log(`9. prefix cache: the same prompt again ran 1 of its ${b.usage.prompt_tokens} ` +
              `tokens (the same text, logprobs within ${g1.toExponential(1)}); a chat's ` +
              `second turn had ${cached(r2)} of its ${r2.usage.prompt_tokens} prompt tokens ` +
              `cached and answered as a server with --prefix-cache off does (logprobs ` +
              `within ${g2.toExponential(1)}); 4 choices of one ${c4.usage.prompt_tokens}-` +
              `token prompt ran it once (${copied} tokens copied) and sampled what the ` +
              `uncached server sampled; 3 with prompt_logprobs scored it once ` +
              `(${copied3} tokens copied), each with the uncached server's entries; ` +
              `/metrics counts ${total} cached tokens`);
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF
# ... and the bills: each request's cached tokens in the ledger, as its usage said
"$WICK" usage "$TMPD/ledger" --by request --format json >"$TMPD/usage.json" ||
  fail "wick usage: $(tail -n 2 "$TMPD/usage.json")"
curl -sf "http://127.0.0.1:$P/metrics" >"$TMPD/metrics.txt" || fail "/metrics"
python3 - "$TMPD/usage.json" "$TMPD/metrics.txt" <<'EOF' || fail "the ledger's cached tokens"
import json, re, sys
rows = json.load(open(sys.argv[1]))["rows"]
total = int(re.search(r"^wick_prompt_cached_tokens_total (\d+)$", open(sys.argv[2]).read(),
                      re.M).group(1))
hit = [r for r in rows if r["cached_tokens"] > 0]
assert hit and all(r["cached_tokens"] < r["prompt_tokens"] for r in hit), hit[:3]
assert sum(r["cached_tokens"] for r in rows) == total, (sum(r["cached_tokens"] for r in rows), total)
# the scheduler's own counts (wick_prefix_cache_*): the same tokens, every hit a request's
m = open(sys.argv[2]).read()
get = lambda k: int(re.search(r"^" + re.escape(k) + r" (\d+)$", m, re.M).group(1))
adm = {r: get(f'wick_prefix_cache_admissions_total{{result="{r}"}}')
       for r in ("taken", "copied", "miss")}
assert get("wick_prefix_cache_tokens_total") == total, (m, total)
assert adm["taken"] + adm["copied"] == len(hit) and adm["copied"] >= 3, (adm, len(hit))
print(f"9. the ledger: {len(hit)} of {len(rows)} requests billed with cached tokens, "
      f"{total} in all, as /metrics counts; the scheduler's counts agree ({adm['taken']} "
      f"taken, {adm['copied']} copied, {adm['miss']} missed)")
EOF

# 10. vLLM's /tokenize and /detokenize: a prompt's and a chat's count is the prompt_tokens
# their completion requests bill; the ids decode back into the text
node - "http://127.0.0.1:$P" "$(basename "$m")" <<'EOF' || fail "/tokenize and /detokenize"
const [base, model] = process.argv.slice(2);
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const post = async (path, body) => {
  const r = await fetch(base + path, { method: 'POST', body: JSON.stringify(body),
                                       headers: { 'Content-Type': 'application/json' } });
  return [r.status, await r.json()];
};
(async () => {
  const prompt = 'One sunny morning, a little bird named Pip flew over the';
  const [s1, t1] = await post('/tokenize', { model, prompt });
  const [, c1] = await post('/v1/completions', { model, prompt, max_tokens: 1 });
  assert(s1 === 200 && t1.count === t1.tokens.length && t1.count === c1.usage.prompt_tokens,
         `prompt: ${JSON.stringify(t1)} against ${JSON.stringify(c1.usage)}`);
  const messages = [{ role: 'system', content: 'Be brief.' },
                    { role: 'user', content: 'Tell me about Pip.' }];
  const [, t2] = await post('/tokenize', { model, messages });
  const [, c2] = await post('/v1/chat/completions', { model, messages, max_tokens: 1 });
  assert(t2.count === c2.usage.prompt_tokens, `chat: ${t2.count} against ` +
         `${c2.usage.prompt_tokens}`);
  const [, t3] = await post('/tokenize', { model, prompt, add_special_tokens: false });
  const [s4, d] = await post('/detokenize', { model, tokens: t3.tokens });
  assert(t3.count === t1.count - 1 && s4 === 200 && d.prompt === prompt,
         `detokenize: ${JSON.stringify(d)}`);
  const card = (await (await fetch(base + '/v1/models')).json()).data[0];
  assert(card.max_model_len === t1.max_model_len && card.max_model_len > 0,
         `the model card: ${JSON.stringify(card)}`);
  const [s5, e5] = await post('/detokenize', { model, tokens: [1, 1 << 30] });
  assert(s5 === 400 && /token id/.test(e5.error.message), `${s5} ${JSON.stringify(e5)}`);
  // a long message counted twice: the second time its ids come from the tokenizer's memo
  const memo = async () => {
    const t = await (await fetch(base + '/metrics')).text();
    const hit = t.match(/^wick_tokenizer_memo_segments_total\{result="hit"\} (\d+)$/m);
    assert(hit, `no memo counts in /metrics`);
    return Number(hit[1]);
  };
  const long = [{ role: 'user', content: 'Pip flew over the hill. '.repeat(60) }];
  const h0 = await memo();
  const [, l1] = await post('/tokenize', { model, messages: long });
  const [, l2] = await post('/tokenize', { model, messages: long });
  const h1 = await memo();
  assert(l1.count === l2.count && l1.tokens.join() === l2.tokens.join() && h1 === h0 + 1,
         `the memo: ${h0} then ${h1} hits, ${l1.count} and ${l2.count} tokens`);
  console.log(`10. /tokenize: a prompt's ${t1.count} tokens and a chat's ${t2.count}, as their ` +
              'requests bill them; /detokenize gives the prompt back; an id past the ' +
              `vocabulary a 400; /v1/models says max_model_len ${card.max_model_len}; a long ` +
              `message counted again came from the tokenizer's memo (${l2.count} tokens)`);
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF

# 11. OpenAI's Responses API: a request runs as the chat of the same messages
node - "$OPENAI" "http://127.0.0.1:$P/v1" "$(basename "$m")" "$PROMPT" <<'EOF' ||
const [openaiDir, base, model, prompt] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const messages = [{ role: 'user', content: prompt }];
const text = (r) => r.output.filter((o) => o.type === 'message')
  .map((o) => o.content.map((c) => c.text).join('')).join('');
(async () => {
  // greedy, with logprobs: the chat's text, usage and entries
  const lp = { include: ['message.output_text.logprobs'], top_logprobs: 2 };
  const r = await client.responses.create({ model, input: prompt, temperature: 0,
                                            max_output_tokens: 40, ...lp });
  const c = await client.chat.completions.create({ model, messages, temperature: 0,
    max_tokens: 40, logprobs: true, top_logprobs: 2 });
  const ct = c.choices[0].message.content;
  assert(r.object === 'response' && r.id.startsWith('resp_') && r.model === model,
         JSON.stringify(r).slice(0, 300));
  assert(r.output_text === ct && text(r) === ct, `${JSON.stringify(r.output_text)} against ` +
         `the chat's ${JSON.stringify(ct)}`);
  assert(r.usage.input_tokens === c.usage.prompt_tokens &&
         r.usage.output_tokens === c.usage.completion_tokens &&
         r.usage.total_tokens === c.usage.total_tokens, `${JSON.stringify(r.usage)} against ` +
         JSON.stringify(c.usage));
  const fin = c.choices[0].finish_reason;
  assert(r.status === (fin === 'length' ? 'incomplete' : 'completed'), `${r.status} ${fin}`);
  const rl = r.output[0].content[0].logprobs, cl = c.choices[0].logprobs.content;
  assert(rl.length === cl.length && rl.length === r.usage.output_tokens &&
         rl.every((e, i) => e.token === cl[i].token && e.logprob === cl[i].logprob &&
                  e.top_logprobs.length === 2 &&
                  e.top_logprobs[1].logprob === cl[i].top_logprobs[1].logprob),
         `logprobs: ${JSON.stringify(rl.slice(0, 2))} against ${JSON.stringify(cl.slice(0, 2))}`);
  // streamed: the events in order and numbered; the deltas, their logprobs and the final
  // response are the response not streamed
  const s = client.responses.stream({ model, input: prompt, temperature: 0,
                                      max_output_tokens: 40, ...lp });
  const types = [];
  let deltas = '', dlp = 0, seq = 0;
  for await (const ev of s) {
    assert(ev.sequence_number === seq++, `event ${types.length}: ${JSON.stringify(ev)}`);
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') {
      deltas += ev.delta;
      dlp += ev.logprobs.length;
    }
  }
  const sf = await s.finalResponse();
  const want = ['response.created', 'response.in_progress', 'response.output_item.added',
                'response.content_part.added'];
  assert(want.every((t, i) => types[i] === t) &&
         types.slice(-4).join() === ['response.output_text.done', 'response.content_part.done',
                                     'response.output_item.done', 'response.' + r.status].join(),
         types.join());
  assert(deltas === ct && dlp === rl.length && sf.output_text === ct &&
         sf.usage.output_tokens === r.usage.output_tokens && sf.status === r.status,
         `streamed: ${JSON.stringify(deltas)}, ${dlp} entries, ${JSON.stringify(sf.output_text)}`);
  // cut at max_output_tokens
  const cut = await client.responses.create({ model, input: prompt, temperature: 0,
                                              max_output_tokens: 3 });
  assert(cut.status === 'incomplete' && cut.incomplete_details?.reason === 'max_output_tokens' &&
         cut.usage.output_tokens === 3 && ct.startsWith(cut.output_text),
         JSON.stringify(cut).slice(0, 400));
  // sampled with a seed: the chat's draw
  const samp = { temperature: 1.0, top_p: 0.9, seed: 7 };
  const rs = await client.responses.create({ model, input: prompt, max_output_tokens: 30,
                                             ...samp });
  const cs = await client.chat.completions.create({ model, messages, max_tokens: 30, ...samp });
  assert(rs.output_text === cs.choices[0].message.content,
         `seeded: ${JSON.stringify(rs.output_text)} against ` +
         JSON.stringify(cs.choices[0].message.content));
  // instructions: a system message, billed as the chat's
  const ri = await client.responses.create({ model, input: prompt, instructions: 'Be brief.',
                                             max_output_tokens: 1 });
  const ci = await client.chat.completions.create({ model, max_tokens: 1, messages: [
    { role: 'system', content: 'Be brief.' }, ...messages] });
  assert(ri.usage.input_tokens === ci.usage.prompt_tokens &&
         ri.usage.input_tokens > r.usage.input_tokens && ri.instructions === 'Be brief.',
         `instructions: ${ri.usage.input_tokens} against ${ci.usage.prompt_tokens}`);
  // structured output
  const js = await client.responses.create({ model, input: prompt, max_output_tokens: 60,
    text: { format: { type: 'json_schema', name: 'pet', schema: { type: 'object',
      required: ['pet'], properties: { pet: { enum: ['cat', 'dog'] } } } } } });
  assert(['cat', 'dog'].includes(JSON.parse(js.output_text).pet) &&
         js.text.format.type === 'json_schema', js.output_text);
  // a conversation kept by the server: previous_response_id runs the chat of the whole
  // conversation (the new instructions first, the old ones not carried), and the kept
  // response is read back and dropped
  const t1 = await client.responses.create({ model, input: prompt, temperature: 0,
                                             max_output_tokens: 12, instructions: 'Be brief.' });
  const t2 = await client.responses.create({ model, input: 'Then', temperature: 0,
    max_output_tokens: 12, previous_response_id: t1.id, instructions: 'Go on.' });
  const cc = await client.chat.completions.create({ model, temperature: 0, max_tokens: 12,
    messages: [{ role: 'system', content: 'Go on.' }, ...messages,
               { role: 'assistant', content: t1.output_text }, { role: 'user', content: 'Then' }] });
  assert(t2.output_text === cc.choices[0].message.content &&
         t2.usage.input_tokens === cc.usage.prompt_tokens && t2.previous_response_id === t1.id &&
         t1.store === true, `previous_response_id: ${JSON.stringify(t2.output_text)} ` +
         `(${t2.usage.input_tokens}) against the chat's ` +
         `${JSON.stringify(cc.choices[0].message.content)} (${cc.usage.prompt_tokens})`);
  // inputTokens.count: what a request would bill, the kept conversation's turns included
  const n1 = await client.responses.inputTokens.count({ model, input: prompt,
                                                        instructions: 'Be brief.' });
  const n2 = await client.responses.inputTokens.count({ model, input: 'Then',
    previous_response_id: t1.id, instructions: 'Go on.' });
  assert(n1.object === 'response.input_tokens' && n1.input_tokens === ri.usage.input_tokens &&
         n2.input_tokens === t2.usage.input_tokens,
         `inputTokens.count: ${JSON.stringify(n1)} against ${ri.usage.input_tokens}, ` +
         `${JSON.stringify(n2)} against ${t2.usage.input_tokens}`);
  // the second's input items through the client's pager (two at a time, in order, and newest
  // first): the first's input and answer, then its own, the first's item ids the same (its
  // answer's the id of its output message)
  const listed = async (id, query) => {
    const all = [];
    for await (const it of client.responses.inputItems.list(id, query)) all.push(it);
    return all;
  };
  const asc = await listed(t2.id, { order: 'asc', limit: 2 });
  const desc = await listed(t2.id, { limit: 1 });
  const first = await listed(t1.id);
  const said = asc.map((it) => `${it.role}:${it.content[0].text}`);
  const wantSaid = [`user:${prompt}`, `assistant:${t1.output_text}`, 'user:Then'];
  assert(JSON.stringify(said) === JSON.stringify(wantSaid) && asc[1].type === 'message' &&
         asc[1].content[0].type === 'output_text' && asc[0].content[0].type === 'input_text' &&
         JSON.stringify(desc.map((it) => it.id)) ===
           JSON.stringify(asc.map((it) => it.id).reverse()) &&
         first.length === 1 && first[0].id === asc[0].id &&
         asc[1].id === t1.output.find((o) => o.type === 'message').id,
         `input items: ${JSON.stringify(asc)}, newest first ${JSON.stringify(desc)}, ` +
         `the first's ${JSON.stringify(first)}`);
  const badLimit = await client.responses.inputItems.list(t2.id, { limit: 0 })
    .then(() => 200, (e) => `${e.status} ${e.param}`);
  assert(badLimit === '400 limit', `input items with limit 0: ${badLimit}`);
  const back = await client.responses.retrieve(t1.id);
  assert(back.id === t1.id && back.output_text === t1.output_text, JSON.stringify(back));
  const del = await client.responses.delete(t1.id).then(() => 'deleted', (e) => e.status);
  const gone = await client.responses.retrieve(t1.id).then(() => 200, (e) => e.status);
  assert(del === 'deleted' && gone === 404, `delete: ${del}, then ${gone}`);
  const unkept = await client.responses.create({ model, input: prompt, max_output_tokens: 1,
                                                 store: false });
  const ugone = await client.responses.retrieve(unkept.id).then(() => 200, (e) => e.status);
  assert(unkept.store === false && ugone === 404, `store false: ${ugone}`);
  // refusals, each naming its member
  const refusals = [[{ previous_response_id: 'resp_1' }, 'previous_response_id'],
                    [{ max_output_tokens: 0 }, 'max_output_tokens'],
                    [{ tools: [{ type: 'web_search' }] }, 'tools'],
                    [{ input: [{ role: 'user', content: [{ type: 'input_image',
                                                            image_url: 'http://x/a.png' }] }] },
                     'input'],
                    [{ text: { format: { type: 'json_schema', name: 'x' } } }, 'text.format'],
                    [{ reasoning: { effort: 'max' } }, 'reasoning.effort'],
                    [{ model: 'other' }, 'model']];
  for (const [body, param] of refusals) {
    let st = 0, got = null;
    try {
      await client.responses.create({ model, input: prompt, ...body });
    } catch (e) { st = e.status; got = e.param; }
    assert((st === 400 || (st === 404 && param === 'model')) && got === param,
           `${JSON.stringify(body)}: ${st} ${got}`);
  }
  console.log(`11. responses: ${r.usage.output_tokens} tokens, the chat's text, usage and ` +
              `logprobs (greedy and seeded), whole and in ${types.length} stream events; ` +
              `cut at 3 tokens incomplete; instructions billed as a system message ` +
              `(${ri.usage.input_tokens} against ${r.usage.input_tokens}); a json_schema ` +
              `answer ${js.output_text}; previous_response_id ran the chat of the whole ` +
              `conversation (${t2.usage.input_tokens} tokens, as inputTokens.count counts), ` +
              `its ${asc.length} input items listed (in pages of 2 and 1), the kept ` +
              `response read back and deleted; ${refusals.length} refusals, each naming its ` +
              `member`);
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF
  fail "the Responses API"

# 12. Anthropic's Messages API (@anthropic-ai/sdk): a request runs as the chat of the same
# messages
node - "$ANTHROPIC" "$OPENAI" "http://127.0.0.1:$P" "$(basename "$m")" "$PROMPT" <<'EOF' ||
const [anthropicDir, openaiDir, base, model, prompt] = process.argv.slice(2);
const Anthropic = require(anthropicDir).default;
const OpenAI = require(openaiDir);
const client = new Anthropic({ apiKey: 'none', baseURL: base });
const openai = new OpenAI({ apiKey: 'none', baseURL: base + '/v1' });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const J = JSON.stringify;
const messages = [{ role: 'user', content: prompt }];
const billed = (u) => u.input_tokens + u.cache_read_input_tokens; // the prompt, cached or not
const text = (r) => r.content.map((b) => b.text).join('');
(async () => {
  // a. greedy: the chat's text and usage
  const ask = { model, max_tokens: 40, temperature: 0, messages };
  const r = await client.messages.create(ask);
  const c = await openai.chat.completions.create({ model, messages, temperature: 0,
                                                   max_tokens: 40 });
  const ct = c.choices[0].message.content;
  const stop = c.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn';
  assert(r.type === 'message' && r.id.startsWith('msg_') && r.role === 'assistant' &&
         r.model === model && r.stop_sequence === null, J(r).slice(0, 300));
  assert(r.content.length === 1 && r.content[0].type === 'text' && r.content[0].text === ct,
         `${J(r.content)} against the chat's ${J(ct)}`);
  assert(billed(r.usage) === c.usage.prompt_tokens &&
         r.usage.output_tokens === c.usage.completion_tokens &&
         r.usage.cache_creation_input_tokens === 0 && r.stop_reason === stop,
         `${J(r.usage)} ${r.stop_reason} against ${J(c.usage)} ${c.choices[0].finish_reason}`);
  // Claude Code's own model name, an alias (--model-alias 'claude-*'): the same message
  const aliased = await client.messages.create({ ...ask, model: 'claude-sonnet-4-5-20250929' });
  assert(text(aliased) === ct && aliased.model === model, `aliased: ${J(aliased).slice(0, 300)}`);
  // the models, listed and read by both clients (one shape serves both)
  const listed = [];
  for await (const x of client.models.list()) listed.push(x);
  const card = await client.models.retrieve(model);
  const oaiListed = (await openai.models.list()).data;
  assert(listed.length === 1 && listed[0].id === model && listed[0].type === 'model' &&
         listed[0].display_name === model && !isNaN(Date.parse(listed[0].created_at)) &&
         card.id === model && oaiListed.length === 1 && oaiListed[0].id === model,
         `models: ${J(listed)} ${J(card)} ${J(oaiListed)}`);
  // b. streamed: the events in order, the deltas the text, the final message the same
  const s = client.messages.stream(ask);
  const types = [];
  let deltas = '';
  for await (const ev of s) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta')
      deltas += ev.delta.text;
  }
  const sf = await s.finalMessage();
  assert(types.slice(0, 2).join() === 'message_start,content_block_start' &&
         types.slice(-3).join() === 'content_block_stop,message_delta,message_stop',
         types.join());
  assert(deltas === ct && text(sf) === ct && sf.stop_reason === r.stop_reason &&
         sf.usage.output_tokens === r.usage.output_tokens && sf.id.startsWith('msg_'),
         `streamed: ${J(deltas)}, final ${J(sf).slice(0, 300)}`);
  // c. stop_sequences: a word of the text cuts it before that word, whole and streamed
  const word = ct.trim().split(/\s+/)[2];
  const cutText = ct.slice(0, ct.indexOf(word));
  const sq = { ...ask, stop_sequences: [word, 'zzzq'] };
  const cut = await client.messages.create(sq);
  const sc = await client.messages.stream(sq).finalMessage();
  for (const [how, x] of [['whole', cut], ['streamed', sc]])
    assert(text(x) === cutText && x.stop_reason === 'stop_sequence' && x.stop_sequence === word,
           `stop_sequences [${word}] (${how}): ${J(x.content)} ${x.stop_reason} ` +
           `${J(x.stop_sequence)}, not ${J(cutText)}`);
  // d. system, a string or text blocks: billed as the chat's system message; e. countTokens
  // counts what the same request bills
  const one = { model, max_tokens: 1, messages };
  const bare = await client.messages.create(one);
  const csys = await openai.chat.completions.create({ model, max_tokens: 1, messages: [
    { role: 'system', content: 'Be brief.' }, ...messages] });
  let counted = 0;
  for (const system of ['Be brief.', [{ type: 'text', text: 'Be brief.' }]]) {
    const rs = await client.messages.create({ ...one, system });
    const n = await client.messages.countTokens({ model, messages, system });
    assert(billed(rs.usage) > billed(bare.usage) &&
           billed(rs.usage) === csys.usage.prompt_tokens,
           `system ${J(system)}: ${J(rs.usage)} against ${J(bare.usage)} without, the ` +
           `chat's ${csys.usage.prompt_tokens}`);
    assert(n.input_tokens === billed(rs.usage), `countTokens ${J(n)} against ${J(rs.usage)}`);
    counted = n.input_tokens;
  }
  const n0 = await client.messages.countTokens({ model, messages });
  assert(n0.input_tokens === billed(bare.usage), `countTokens ${J(n0)} against ${J(bare.usage)}`);
  // a prefill (a last message of the assistant's) is continued: its answer goes on where the
  // greedy text went on after those words, and chat's continue_final_message runs the same
  const words = ct.split(' ').slice(0, 4).join(' '); // (the text's first words)
  const pre = await client.messages.create({ model, max_tokens: 12, temperature: 0,
    messages: [...messages, { role: 'assistant', content: words }] });
  const cpre = await openai.chat.completions.create({ model, max_tokens: 12, temperature: 0,
    messages: [...messages, { role: 'assistant', content: words }],
    continue_final_message: true });
  assert(ct.startsWith(words + text(pre)) && text(pre).length > 0 &&
         text(pre) === cpre.choices[0].message.content,
         `prefill ${J(words)}: ${J(text(pre))} (chat ${J(cpre.choices[0].message.content)}), ` +
         `against the text ${J(ct)}`);
  // f. max_tokens past the server's limit is held to it (the SDK's own timeout check set aside)
  let big = null, bigErr = null;
  try {
    big = await client.messages.create({ ...ask, max_tokens: 100000 }, { timeout: 60000 });
  } catch (x) { bigErr = x; }
  assert(big?.type === 'message' && big.usage.output_tokens > 0 &&
         big.usage.output_tokens <= 4096 &&
         ['end_turn', 'max_tokens', 'stop_sequence'].includes(big.stop_reason),
         'max_tokens 100000: ' + (bigErr ? `${bigErr.status} ${J(bigErr.error)}`
                                         : J(big).slice(0, 300)));
  // g. refusals, Anthropic's shape: 400 invalid_request_error, an unknown model 404
  const raw = await fetch(base + '/v1/messages', { method: 'POST', body: J({ model, messages }),
    headers: { 'content-type': 'application/json', 'x-api-key': 'none' } });
  const rawBody = await raw.json();
  assert(raw.status === 400 && rawBody.type === 'error' &&
         rawBody.error?.type === 'invalid_request_error' &&
         /max_tokens/.test(rawBody.error.message), `no max_tokens: ${raw.status} ${J(rawBody)}`);
  const image = { type: 'image', source: { type: 'base64', media_type: 'image/png',
                                           data: 'AAAA' } };
  const refusals = [
    [{ messages: [{ role: 'user', content: [image, { type: 'text', text: 'What is it?' }] }] },
     400, 'invalid_request_error', /image/],
    [{ tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 400,
     'invalid_request_error', /web_search_20250305/],
    [{ model: 'other' }, 404, 'not_found_error', /other/]];
  for (const [body, status, type, says] of refusals) {
    let err = null;
    try { await client.messages.create({ ...ask, ...body }); } catch (x) { err = x; }
    assert(err && err.status === status && err.error?.type === 'error' &&
           err.error?.error?.type === type && says.test(err.error.error.message),
           `${J(body)}: ${err && err.status} ${J(err && err.error)}`);
  }
  console.log(`12. messages: ${r.usage.output_tokens} tokens, the chat's text and usage ` +
              `(${r.usage.input_tokens} + ${r.usage.cache_read_input_tokens} cached input ` +
              `tokens), stop_reason ${r.stop_reason}, also as claude-sonnet-4-5-20250929 ` +
              `(--model-alias; models.list and retrieve in Anthropic's shape), ` +
              `whole and in ${types.length} stream ` +
              `events; stop_sequences [${J(word)}] cut it (${J(cutText)}); system billed as ` +
              `a system message (${counted} tokens against ${billed(bare.usage)}), as ` +
              `countTokens counts; max_tokens 100000 held (${big.usage.output_tokens} tokens, ` +
              `${big.stop_reason}); no max_tokens, an image, web_search a 400 ` +
              `invalid_request_error, an unknown model a 404 not_found_error`);
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF
  fail "the Messages API"

# 13. --responses-dir: the kept responses outlive the dev session. One ends when idle; the
# next, on the same directories, goes on from its response, its earlier turns read from the
# prefix cache the first wrote at its exit.
P3=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
kept_dev() { # LOG: a dev session on $P3, over $TMPD/kept and $TMPD/pc
  "$WICK" dev --model "$m" --listen 127.0.0.1:$P3 --idle-timeout 3 --responses-dir \
    "$TMPD/kept" --prefix-cache-dir "$TMPD/pc" --ledger "$TMPD/ledger3" 2>"$1" &
  DEV3=$!
  wait_dev $P3 $DEV3 "$1"
}
kept_client() { # STEP [ID]
  node - "$OPENAI" "http://127.0.0.1:$P3/v1" "$(basename "$m")" "$PROMPT" "$@" <<'EOF'
const [openaiDir, base, model, prompt, step, id] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const ask = { model, temperature: 0, max_output_tokens: 12 };
(async () => {
  if (step === 'first') {
    const r = await client.responses.create({ ...ask, input: prompt });
    assert(r.store !== false && r.output_text.length > 0, JSON.stringify(r));
    console.log(`${r.id} ${JSON.stringify(r.output_text)}`);
  } else if (step === 'next') {
    const before = await client.responses.retrieve(id);
    const r = await client.responses.create({ ...ask, input: 'And then?',
                                              previous_response_id: id });
    const c = await client.chat.completions.create({ model, temperature: 0, max_tokens: 12,
      messages: [{ role: 'user', content: prompt },
                 { role: 'assistant', content: before.output_text },
                 { role: 'user', content: 'And then?' }] });
    assert(r.output_text === c.choices[0].message.content &&
           r.usage.input_tokens === c.usage.prompt_tokens,
           `${JSON.stringify(r.output_text)} (${r.usage.input_tokens} tokens) against the ` +
           `chat's ${JSON.stringify(c.choices[0].message.content)} (${c.usage.prompt_tokens})`);
    const cached = r.usage.input_tokens_details.cached_tokens;
    assert(cached > 0, `no prompt token cached: ${JSON.stringify(r.usage)}`);
    const del = await client.responses.delete(id).then(() => 'deleted', (e) => e.status);
    assert(del === 'deleted', `delete: ${del}`);
    console.log(`${r.usage.input_tokens} prompt tokens, ${cached} of them cached`);
  } else {
    const st = await client.responses.retrieve(id).then(() => 200, (e) => e.status);
    let err = null;
    try {
      await client.responses.create({ ...ask, input: 'x', previous_response_id: id });
    } catch (e) { err = e; }
    assert(st === 404 && err?.status === 400 && err?.code === 'previous_response_not_found',
           `deleted, yet: ${st}, ${err?.status} ${err?.code}`);
  }
})().catch((x) => { console.error('FAIL:', x); process.exit(1); });
EOF
}
kept_dev "$TMPD/kept1.log"
first=$(kept_client first) || fail "--responses-dir: the first session's response"
wait $DEV3 || fail "the first kept session did not end idle with 0: $(tail -n 3 "$TMPD/kept1.log")"
ls "$TMPD/kept" | has "^${first%% *}\." || fail "--responses-dir: no file of ${first%% *}"
kept_dev "$TMPD/kept2.log"
has ": 1 kept responses" <"$TMPD/kept2.log" || fail "the second session: $(cat "$TMPD/kept2.log")"
next=$(kept_client next "${first%% *}") || fail "--responses-dir: the next session"
kill -TERM $DEV3 && wait $DEV3 || fail "the second kept session"
kept_dev "$TMPD/kept3.log"
kept_client gone "${first%% *}" || fail "--responses-dir: a deleted response"
kill -TERM $DEV3 && wait $DEV3 || fail "the third kept session"
echo "13. --responses-dir: $first kept by a session that ended idle; the next went on from it" \
  "as the chat of the whole conversation ($next), then deleted it; the third has it not"

# the benchmark of the host's part of these picks runs (its figures: README)
"$WICK" bench picks "$m" -n 20 --runs 1 >"$TMPD/picks.txt" || fail "wick bench picks"
tail -n 1 "$TMPD/picks.txt" | python3 -c 'import json, sys
t = json.load(sys.stdin)["ms_per_token"]
assert sorted(t) == sorted(["plain", "logprobs", "penalties", "logit_bias", "json_object",
                            "json_schema", "pattern", "pattern_any", "pattern_dates"]) and \
       all(v > 0 for v in t.values()), t' ||
  fail "wick bench picks: $(cat "$TMPD/picks.txt")"
echo "wick bench picks: $(sed -n 1p "$TMPD/picks.txt")"
echo "openai_params: ok"
