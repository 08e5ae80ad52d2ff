#!/usr/bin/env node
// openai_client.js - drives `wick dev` as real clients do. Modes:
//
//   basic       with the official `openai` npm package: a chat completion, a streaming chat
//               completion, a streaming text completion, list and retrieve the model, and a
//               request naming another model (must be a 404 NotFoundError). Every response
//               must parse and carry non-empty text.
//   load        N concurrent streaming clients for S seconds over raw fetch, each reading the
//               Server-Sent Events itself so that a stream missing its final "data: [DONE]"
//               is caught; prints the time to first token p50/p99 as JSON.
//   disconnect  starts a long stream, reads a few chunks, aborts the connection, then runs a
//               second request to completion; prints both ids as JSON.
//
//   node openai_client.js MODE --openai DIR --base URL --key KEY --model NAME
//        [--clients N --seconds S --max-tokens N]
'use strict';
const path = require('path');

function args() {
  const a = { clients: 50, seconds: 15, maxTokens: 32 };
  const v = process.argv.slice(2);
  a.mode = v[0];
  for (let i = 1; i < v.length; i++) {
    const k = v[i];
    const val = v[++i];
    if (k === '--openai') a.openai = val;
    else if (k === '--base') a.base = val;
    else if (k === '--key') a.key = val;
    else if (k === '--model') a.model = val;
    else if (k === '--clients') a.clients = +val;
    else if (k === '--seconds') a.seconds = +val;
    else if (k === '--max-tokens') a.maxTokens = +val;
    else throw new Error(`unknown flag ${k}`);
  }
  if (!a.base || !a.model || !['basic', 'load', 'disconnect'].includes(a.mode))
    throw new Error('usage: openai_client.js basic|load|disconnect --base URL --model NAME ...');
  return a;
}

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

async function basic(a) {
  const OpenAI = require(path.resolve(a.openai)).default;
  const client = new OpenAI({ baseURL: a.base, apiKey: a.key, maxRetries: 0, timeout: 60000 });

  const chat = await client.chat.completions.create({
    model: a.model, max_tokens: 40, temperature: 0,
    messages: [{ role: 'system', content: 'Once upon a time' }, { role: 'user', content: ', there was' }],
  });
  check(chat.object === 'chat.completion' && /^chatcmpl-/.test(chat.id), `chat: ${JSON.stringify(chat)}`);
  const text = chat.choices[0].message.content;
  check(typeof text === 'string' && text.length > 0, 'chat: empty text');
  check(chat.choices[0].message.role === 'assistant', 'chat: role');
  check(['stop', 'length'].includes(chat.choices[0].finish_reason), 'chat: finish_reason');
  check(chat.usage.completion_tokens > 0 && chat.usage.prompt_tokens > 0 &&
    chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'chat: usage');
  console.log(`chat (${chat.usage.prompt_tokens}+${chat.usage.completion_tokens} tokens): ${JSON.stringify(text)}`);

  // The same request streamed: greedy, so the text must be the same.
  const stream = await client.chat.completions.create({
    model: a.model, max_tokens: 40, temperature: 0, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'system', content: 'Once upon a time' }, { role: 'user', content: ', there was' }],
  });
  let streamed = '', chunks = 0, finish = null, usage = null, role = null;
  for await (const c of stream) {
    check(c.object === 'chat.completion.chunk' && c.id && c.model === a.model, `chunk: ${JSON.stringify(c)}`);
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) streamed += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    chunks++;
  }
  check(role === 'assistant' && finish && usage && usage.completion_tokens > 0, 'stream: role/finish/usage');
  check(streamed === text, `stream text ${JSON.stringify(streamed)} != ${JSON.stringify(text)}`);
  console.log(`streamed chat: ${chunks} chunks, same text as the plain request`);

  const cs = await client.completions.create({ model: a.model, prompt: 'Once upon a time', max_tokens: 20, stream: true });
  let ctext = '';
  for await (const c of cs) ctext += c.choices.map((ch) => ch.text).join('');
  check(ctext.length > 0, 'completion stream: empty');
  console.log(`streamed completion: ${JSON.stringify(ctext)}`);

  // no max_tokens on the legacy endpoint: OpenAI's default, 16 tokens
  const short = await client.completions.create({ model: a.model, prompt: 'Once upon a time', temperature: 0 });
  check(short.usage.completion_tokens === 16 && short.choices[0].finish_reason === 'length',
    `completion without max_tokens: ${JSON.stringify(short)}`);
  console.log(`completion without max_tokens: ${short.usage.completion_tokens} tokens, ${short.choices[0].finish_reason}`);

  const models = await client.models.list();
  const ids = models.data.map((m) => m.id);
  check(ids.length === 1 && ids[0] === a.model, `models: ${JSON.stringify(ids)}`);
  const one = await client.models.retrieve(a.model);
  check(one.id === a.model, 'models.retrieve');
  console.log(`models: ${JSON.stringify(ids)}`);

  try {
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    throw new Error('a request for another model succeeded');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404, `another model: ${e}`);
    check(e.error && e.error.code === 'model_not_found', `another model: ${JSON.stringify(e.error)}`);
    console.log(`another model: 404 ${e.error.code}`);
  }
  try {
    const bad = new OpenAI({ baseURL: a.base, apiKey: 'wrong-key', maxRetries: 0 });
    await bad.models.list();
    throw new Error('a wrong key was accepted');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, `wrong key: ${e}`);
    console.log('wrong key: 401');
  }
}

// Reads one SSE response; returns {ttft, text, done, id}.
async function sse(res, onChunk) {
  const dec = new TextDecoder();
  let buf = '', text = '', done = false, id = null, ttft = null, finish = null;
  const reader = res.body.getReader();
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      check(ev.startsWith('data: '), `not an SSE data event: ${JSON.stringify(ev)}`);
      const data = ev.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      check(!done, 'data after [DONE]');
      const j = JSON.parse(data);
      check(!j.error, `error event: ${data}`);
      id = j.id;
      for (const ch of j.choices) {
        const t = ch.delta ? ch.delta.content : ch.text;
        if (t) {
          if (ttft === null) ttft = performance.now();
          text += t;
        }
        if (ch.finish_reason) {
          finish = ch.finish_reason;
          if (ttft === null) ttft = performance.now(); /* stopped at its first token */
        }
      }
      if (onChunk && (await onChunk(j))) return { text, done, id, ttft, finish, aborted: true };
    }
  }
  return { text, done, id, ttft, finish };
}

function request(a, body, signal) {
  return fetch(`${a.base}/chat/completions`, {
    method: 'POST', signal,
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${a.key}` },
    body: JSON.stringify(body),
  });
}

function pct(v, p) {
  const s = [...v].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

async function load(a) {
  const end = performance.now() + a.seconds * 1000;
  const ttfts = [];
  let streams = 0, tokens = 0;
  async function client(k) {
    let n = 0;
    while (performance.now() < end) {
      const t0 = performance.now();
      const res = await request(a, {
        model: a.model, stream: true, max_tokens: a.maxTokens, seed: k * 1000 + n++,
        messages: [{ role: 'user', content: `Once upon a time ${k}` }],
      });
      check(res.status === 200 && /text\/event-stream/.test(res.headers.get('content-type')),
        `client ${k}: HTTP ${res.status}`);
      const r = await sse(res);
      check(r.done, `client ${k}: the stream ended without data: [DONE]`);
      /* empty only when the model's first token ends it (a stop id: EOS, or BOS) */
      check(r.text.length > 0 || r.finish === 'stop', `client ${k}: empty stream (${r.finish})`);
      ttfts.push(r.ttft - t0);
      streams++;
      tokens += r.text.length;
    }
  }
  await Promise.all(Array.from({ length: a.clients }, (_, k) => client(k)));
  const out = { clients: a.clients, seconds: a.seconds, streams, ttft_p50_ms: +pct(ttfts, 50).toFixed(1),
    ttft_p99_ms: +pct(ttfts, 99).toFixed(1), ttft_max_ms: +Math.max(...ttfts).toFixed(1), chars: tokens };
  console.log(JSON.stringify(out));
}

async function disconnect(a) {
  const ac = new AbortController();
  const resA = await request(a, {
    model: a.model, stream: true, max_tokens: a.maxTokens, temperature: 0,
    messages: [{ role: 'user', content: 'Once upon a time' }],
  }, ac.signal);
  check(resA.status === 200, `A: HTTP ${resA.status}`);
  let seen = 0;
  let idA = null;
  try {
    const r = await sse(resA, async (j) => { idA = j.id; return ++seen >= 5; });
    check(r.aborted, 'A finished before it could be abandoned');
  } finally {
    ac.abort();
  }
  const resB = await request(a, {
    model: a.model, stream: true, max_tokens: 5, temperature: 0,
    messages: [{ role: 'user', content: 'The dog' }],
  });
  check(resB.status === 200, `B: HTTP ${resB.status}`);
  const b = await sse(resB);
  check(b.done && b.text.length > 0, 'B did not complete');
  console.log(JSON.stringify({ a: idA, a_chunks_read: seen, b: b.id, b_text: b.text }));
}

const a = args();
({ basic, load, disconnect })[a.mode](a).catch((e) => {
  console.error(`FAIL: ${e.stack || e}${e.cause ? ` (cause: ${e.cause.stack || e.cause})` : ""}`);
  process.exit(1);
});
