// End-to-end test of `tandem serve` with a real (reference) model, driven by the official `openai`
// npm client and raw fetch. Started by tests/unit/test_serve_e2e.c, which runs the servers and
// checks the SIGTERM exit. Expected outputs come from the PyTorch oracle (.cache/ref/oracle.json:
// greedy continuation and its log-probabilities) and from the server itself served alone (batch
// invariance), never from constants computed by the code under test.
// Usage: node tests/e2e/serve_real.test.js --port N --nochat M --override K --oracle PATH --model NAME
//        [--rounded 0|1]
'use strict';
const fs = require('fs');
const path = require('path');
const mod = require(path.join(__dirname, '../oracle/node_modules/openai'));
const OpenAI = mod.OpenAI || mod.default || mod;

const args = process.argv.slice(2);
const arg = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
const port = Number(arg('--port')), portNoChat = Number(arg('--nochat')), portOverride = Number(arg('--override'));
const MODEL = arg('--model') || 'llama2';
const oracle = JSON.parse(fs.readFileSync(arg('--oracle'), 'utf8'));
const base = `http://127.0.0.1:${port}`;
const mk = (p) => new OpenAI({ baseURL: `http://127.0.0.1:${p}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
const client = mk(port);

let passed = 0, failed = 0;
function check(cond, what, extra) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 600) : ''}`); }
}
const sleep = (ms) => new Promise(r => setTimeout(r, ms));
async function post(p, body, b = base) {
  const r = await fetch(b + p, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null; try { json = JSON.parse(text); } catch (e) {}
  return { status: r.status, json, text };
}
async function metrics() { return (await fetch(base + '/metrics')).text(); }
function metric(text, name, label) {
  for (const line of text.split('\n'))
    if (line.startsWith(name + '{') && (!label || line.includes(label))) return Number(line.split(' ').pop());
  return NaN;
}
const om = oracle.models.find(m => m.name === MODEL);
// --rounded 1: the server's kernels round activations (avx512-int8, the default where the CPU has
// it); a Q8_0/Q4_0/BF16 model is then checked against the activation-rounded oracle (models[].act,
// see tests/unit/test_oracle.c). The F32 model served by default has none: same oracle either way.
const greedy = (arg('--rounded') === '1' && om.act ? om.act : om).greedy;

async function testGreedyOracle() {
  // Token-id prompt and text prompt (the tokenizer adds BOS as the model's config says) must both
  // reproduce the oracle's greedy continuation and its log-probabilities.
  for (const prompt of [oracle.greedy_prompt, oracle.greedy_prompt_text]) {
    const c = await client.completions.create({ model: MODEL, prompt, max_tokens: oracle.n_greedy, temperature: 0,
                                               logprobs: 2, ignore_eos: true });
    const ch = c.choices[0];
    const lps = ch.logprobs.token_logprobs;
    let maxd = 0;
    for (let i = 0; i < lps.length; i++) maxd = Math.max(maxd, Math.abs(lps[i] - greedy.token_logprobs[i]));
    check(lps.length === oracle.n_greedy && maxd < 2e-4, `greedy logprobs vs oracle (${typeof prompt})`, { maxd, n: lps.length });
    check(ch.text === greedy.text, `greedy text vs oracle (${typeof prompt})`, [ch.text, greedy.text]);
    check(ch.finish_reason === 'length' && c.usage.prompt_tokens === oracle.greedy_prompt.length &&
          c.usage.completion_tokens === oracle.n_greedy, 'greedy usage', c.usage);
    check(ch.logprobs.top_logprobs.every(t => Object.keys(t).length >= 1 && Object.keys(t).length <= 3), 'top_logprobs sizes', ch.logprobs.top_logprobs);
    // The best alternative of each position is the oracle's top-1 (greedy picks it).
    const top1 = ch.logprobs.top_logprobs.map(t => Math.max(...Object.values(t)));
    check(top1.every((v, i) => Math.abs(v - greedy.top5[i][0][1]) < 2e-4), 'top-1 logprob vs oracle', top1);
  }
}

async function testChat() {
  const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Once upon a time' }];
  const tk = await post('/tokenize', { model: MODEL, messages: msgs });
  check(tk.status === 200 && tk.json.count > 5, 'tokenize messages', tk.json);
  // The template as @huggingface/jinja renders it (transformers.js), tokenized without specials.
  const { Template } = require(path.join(__dirname, '../oracle/node_modules/@huggingface/jinja'));
  const cfg = JSON.parse(fs.readFileSync(path.join(path.dirname(arg('--oracle')), om.path, 'tokenizer_config.json'), 'utf8'));
  const rendered = new Template(cfg.chat_template).render({ messages: msgs, add_generation_prompt: true,
                                                            bos_token: cfg.bos_token, eos_token: cfg.eos_token });
  const rt = await post('/tokenize', { model: MODEL, prompt: rendered, add_special_tokens: false });
  check(JSON.stringify(rt.json.tokens) === JSON.stringify(tk.json.tokens), 'chat template == @huggingface/jinja render', [rendered, rt.json, tk.json]);
  const chat = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 12, temperature: 0 });
  check(chat.usage.prompt_tokens === tk.json.count, 'chat prompt tokens == rendered template tokens', [chat.usage, tk.json.count]);
  // The same tokens as a completion prompt give the same greedy text.
  const comp = await client.completions.create({ model: MODEL, prompt: tk.json.tokens, max_tokens: 12, temperature: 0 });
  check(chat.choices[0].message.content === comp.choices[0].text && chat.choices[0].message.role === 'assistant',
        'chat == completion over the rendered template', [chat.choices[0].message.content, comp.choices[0].text]);
  // Chat streaming with include_usage: deltas concatenate to the same text; one usage chunk.
  const s = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 12, temperature: 0, stream: true,
                                                  stream_options: { include_usage: true } });
  let text = '', usage = null, fin = null, nUsage = 0;
  for await (const ch of s) {
    if (ch.usage) { usage = ch.usage; nUsage++; }
    for (const c of ch.choices) { text += c.delta.content || ''; if (c.finish_reason) fin = c.finish_reason; }
  }
  check(text === comp.choices[0].text && fin === chat.choices[0].finish_reason, 'streamed chat text', [text, comp.choices[0].text]);
  check(nUsage === 1 && usage.prompt_tokens === tk.json.count && usage.completion_tokens === chat.usage.completion_tokens,
        'stream usage chunk', usage);
  // Chat logprobs (chat format).
  const lp = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 4, temperature: 0,
                                                   logprobs: true, top_logprobs: 3 });
  const cl = lp.choices[0].logprobs.content;
  check(cl.length === lp.usage.completion_tokens && cl.every(x => x.top_logprobs.length === 3 && x.logprob <= 0),
        'chat logprobs', cl);
  // No template: a clear 400; an override template works.
  const nc = await post('/v1/chat/completions', { model: MODEL, messages: msgs, max_tokens: 2 }, `http://127.0.0.1:${portNoChat}`);
  check(nc.status === 400 && /chat template/.test(nc.json.error.message), 'no chat template -> 400', nc.json);
  const ov = await mk(portOverride).chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 3, temperature: 0 });
  check(ov.choices[0].message.role === 'assistant' && ov.usage.completion_tokens === 3, 'override template', ov);
  const ovt = await post('/tokenize', { model: MODEL, messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: true },
                         `http://127.0.0.1:${portOverride}`);
  const want = await post('/tokenize', { model: MODEL, prompt: '[user]hi[/user][bot]', add_special_tokens: false },
                          `http://127.0.0.1:${portOverride}`);
  check(ovt.status === 200 && JSON.stringify(ovt.json.tokens) === JSON.stringify(want.json.tokens), 'override template renders', [ovt.json, want.json]);
}

async function testNLogprobsStops() {
  const prompt = 'The little dog';
  const req = { model: MODEL, prompt, max_tokens: 10, n: 3, temperature: 1.0, seed: 7, ignore_eos: true };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  check(a.choices.length === 3 && a.choices.every((c, i) => c.index === i && c.text === b.choices[i].text),
        'n=3 seeded is reproducible', [a.choices.map(c => c.text), b.choices.map(c => c.text)]);
  check(new Set(a.choices.map(c => c.text)).size >= 2 && a.usage.completion_tokens === 30, 'n=3 samples differ', a.choices.map(c => c.text));
  // Echo with prompt logprobs: prompt tokens come first, the first without a logprob.
  const e = await client.completions.create({ model: MODEL, prompt: oracle.prompts.len7, max_tokens: 1, echo: true, logprobs: 1, temperature: 0 });
  const tl = e.choices[0].logprobs.token_logprobs;
  check(tl.length === 8 && tl[0] === null && tl.slice(1).every(x => typeof x === 'number' && x <= 0), 'echo prompt logprobs', tl);
  // Against the oracle's per-position log-softmax (float32 [n, vocab]).
  const buf = fs.readFileSync(path.join(path.dirname(arg('--oracle')), om.logprobs.len7));
  const V = oracle.vocab_size, P = oracle.prompts.len7;
  let maxd = 0;
  for (let p = 1; p < P.length; p++) maxd = Math.max(maxd, Math.abs(tl[p] - buf.readFloatLE(((p - 1) * V + P[p]) * 4)));
  check(maxd < 2e-4, 'echo prompt logprobs vs oracle', maxd);
  // vLLM (and OpenAI: "up to logprobs+1 elements") put the prompt's own token in each prompt
  // top_logprobs entry, with its logprob.
  const el = e.choices[0].logprobs;
  check(el.top_logprobs.slice(1).every((t, i) => t[el.tokens[i + 1]] === el.token_logprobs[i + 1]),
        'echo prompt top_logprobs hold the prompt token', el.top_logprobs);
  // text_offset indexes the returned text (a Python/JS string), for a text prompt whose BOS is not
  // in it and with a two-byte character split over byte tokens.
  const ep = 'Once upon a time, h\u00e9llo';
  const et = await client.completions.create({ model: MODEL, prompt: ep, max_tokens: 3, echo: true, logprobs: 1,
                                               temperature: 0, ignore_eos: true });
  const tx = et.choices[0].text, lo = et.choices[0].logprobs;
  const bad = [];
  lo.tokens.forEach((t, i) => {
    const o = lo.text_offset[i];
    if (i > 0 && o < lo.text_offset[i - 1]) bad.push([i, t, o, 'decreasing']);
    if (t === '\ufffd') { if (tx[o] !== '\u00e9') bad.push([i, t, o]); }  // a byte of the split character
    else if (i === 0 && o !== 0) bad.push([i, t, o]);                       // BOS: not in the text, at 0
    else if (i > 0 && tx.substr(o, t.length) !== t) bad.push([i, t, o, tx.substr(o, t.length)]);
  });
  check(tx.startsWith(ep) && lo.tokens.length === et.usage.prompt_tokens + 3 && bad.length === 0 &&
        lo.tokens.filter(t => t === '\ufffd').length >= 1, 'echo text_offset indexes the returned text', { tx, bad, lo });
  // Stop strings: cut the greedy text before a substring from its middle (across tokens or not).
  const full = await client.completions.create({ model: MODEL, prompt: oracle.greedy_prompt_text, max_tokens: 16, temperature: 0, ignore_eos: true });
  const t = full.choices[0].text;
  const stop = ' town';
  const idx = t.indexOf(stop);
  check(idx > 0, 'greedy text has the stop string', t);
  const st = await client.completions.create({ model: MODEL, prompt: oracle.greedy_prompt_text, max_tokens: 16, temperature: 0,
                                               ignore_eos: true, stop: ['zzz', stop] });
  check(st.choices[0].text === t.slice(0, idx) && st.choices[0].finish_reason === 'stop', 'stop string', [st.choices[0].text, t.slice(0, idx)]);
  const ss = await client.completions.create({ model: MODEL, prompt: oracle.greedy_prompt_text, max_tokens: 16, temperature: 0,
                                               ignore_eos: true, stop: [stop], stream: true });
  let stext = '', sfin = null;
  for await (const ch of ss) for (const c of ch.choices) { stext += c.text || ''; if (c.finish_reason) sfin = c.finish_reason; }
  check(stext === t.slice(0, idx) && sfin === 'stop', 'streamed stop string', [stext, sfin]);
}

async function testConcurrentEqualsSolo() {
  const N = 32;
  const prompts = [];
  for (let i = 0; i < N; i++) prompts.push(`Story ${i}: ` + 'once upon a time '.repeat(1 + (i % 5)));
  const solo = [];
  for (const p of prompts) {
    const c = await client.completions.create({ model: MODEL, prompt: p, max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 0 });
    solo.push(c.choices[0]);
  }
  const m0 = await metrics();
  const streams = await Promise.all(prompts.map(async (p) => {
    const s = await client.completions.create({ model: MODEL, prompt: p, max_tokens: 12, temperature: 0, ignore_eos: true,
                                               logprobs: 0, stream: true });
    let text = '', lps = [];
    for await (const ch of s) for (const c of ch.choices) { text += c.text || ''; if (c.logprobs) lps.push(...c.logprobs.token_logprobs); }
    return { text, lps };
  }));
  let same = 0, maxd = 0;
  for (let i = 0; i < N; i++) {
    const lpOk = streams[i].lps.length === solo[i].logprobs.token_logprobs.length;
    for (let k = 0; lpOk && k < streams[i].lps.length; k++) maxd = Math.max(maxd, Math.abs(streams[i].lps[k] - solo[i].logprobs.token_logprobs[k]));
    if (streams[i].text === solo[i].text && lpOk) same++;
  }
  check(same === N && maxd < 1e-4, '32 simultaneous streams == solo', { same, maxd });
  const m1 = await metrics();
  check(metric(m1, 'vllm:prefix_cache_hits_total') > metric(m0, 'vllm:prefix_cache_hits_total'), 'repeated prompts hit the prefix cache',
        [metric(m0, 'vllm:prefix_cache_hits_total'), metric(m1, 'vllm:prefix_cache_hits_total')]);
}

async function testAbort() {
  const ab0 = metric(await metrics(), 'tandem:engine_aborted_requests_total');
  const ctl = new AbortController();
  const s = await client.completions.create({ model: MODEL, prompt: 'abort me please', max_tokens: 490, stream: true, ignore_eos: true },
                                            { signal: ctl.signal });
  let n = 0;
  try { for await (const ch of s) { if (++n === 3) ctl.abort(); } } catch (e) { /* aborted */ }
  let m = '', ab = ab0, usage = 1, running = 1;
  for (let i = 0; i < 200 && (ab <= ab0 || usage !== 0 || running !== 0); i++) {
    await sleep(20);
    m = await metrics();
    ab = metric(m, 'tandem:engine_aborted_requests_total');
    usage = metric(m, 'vllm:kv_cache_usage_perc');
    running = metric(m, 'vllm:num_requests_running');
  }
  check(ab === ab0 + 1 && usage === 0 && running === 0, 'client abort frees every block', { ab0, ab, usage, running });
}

async function testErrors() {
  let r = await post('/v1/completions', { model: MODEL, prompt: Array(600).fill(65), max_tokens: 4 });
  check(r.status === 400 && /maximum context length/.test(r.json.error.message), 'prompt longer than the context -> 400', r.json);
  r = await post('/v1/completions', { model: MODEL, prompt: 'hi', max_tokens: 100000 });
  check(r.status === 400, 'max_tokens too large -> 400', r.json);
  r = await post('/v1/completions', { model: 'nope', prompt: 'hi', max_tokens: 2 });
  check(r.status === 404 && r.json.error.code === 404, 'unknown model -> 404', r.json);
  r = await post('/v1/completions', { model: MODEL, prompt: [1, 2, 99999], max_tokens: 2 });
  check(r.status === 400, 'token id outside the vocabulary -> 400', r.json);
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === MODEL && models.data[0].max_model_len === 512, 'models.list', models.data);
  const h = await fetch(base + '/health');
  check(h.status === 200, '/health', h.status);
}

// RL fields: logprobs_mode (raw / processed), return_token_ids, weights_versions, token-id prompts.
async function testRlFields() {
  const prompt = oracle.greedy_prompt;  // token ids
  const n = oracle.n_greedy;
  // Processed at temperature 0 with top_k 5: log-softmax over the oracle's 5 best (PyTorch), not the
  // whole vocabulary; raw stays the oracle's.
  const lse5 = (i) => { const v = greedy.top5[i].map(e => e[1]); const m = Math.max(...v);
                        return m + Math.log(v.reduce((a, x) => a + Math.exp(x - m), 0)); };
  const g = await client.completions.create({ model: MODEL, prompt, max_tokens: n, temperature: 0, top_k: 5, logprobs: 5,
                                             ignore_eos: true, logprobs_mode: 'processed', return_token_ids: true });
  const gc = g.choices[0];
  let maxd = 0;
  for (let i = 0; i < n; i++) maxd = Math.max(maxd, Math.abs(gc.logprobs.token_logprobs[i] - (greedy.token_logprobs[i] - lse5(i))));
  check(gc.text === greedy.text && maxd < 2e-4, 'processed greedy top_k 5 logprobs vs oracle log-softmax over its top 5', { maxd, text: gc.text });
  check(gc.logprobs.top_logprobs.every(t => Object.keys(t).length <= 5), 'processed alternatives come from the kept set', gc.logprobs.top_logprobs[0]);
  check(JSON.stringify(gc.prompt_token_ids) === JSON.stringify(prompt), 'completions prompt_token_ids', gc.prompt_token_ids);
  check(Array.isArray(gc.token_ids) && gc.token_ids.length === n, 'token_ids length', gc.token_ids);
  const dt = await post('/detokenize', { model: MODEL, tokens: gc.token_ids });
  check(dt.json && dt.json.prompt === gc.text, 'detokenize(token_ids) == text', [dt.json, gc.text]);
  check(Array.isArray(gc.weights_versions) && gc.weights_versions.length === n && gc.weights_versions.every(v => v === 0),
        'weights_versions: one 0 per token', gc.weights_versions);

  // Sampling: the same seed gives the same tokens in both modes; temperature != 1 makes the values differ.
  const body = { model: MODEL, prompt, max_tokens: 16, temperature: 0.7, top_p: 0.9, seed: 7, logprobs: 0, ignore_eos: true,
                 return_token_ids: true };
  const raw = await post('/v1/completions', { ...body, logprobs_mode: 'raw_logprobs' });
  const pro = await post('/v1/completions', { ...body, logprobs_mode: 'processed_logprobs' });
  const rc = raw.json.choices[0], pc = pro.json.choices[0];
  check(JSON.stringify(rc.token_ids) === JSON.stringify(pc.token_ids) && rc.token_ids.length === 16, 'same seed, same tokens in both modes', [rc.token_ids, pc.token_ids]);
  const differ = rc.logprobs.token_logprobs.filter((v, i) => v !== pc.logprobs.token_logprobs[i]).length;
  check(differ >= 12, 'raw and processed logprobs differ at temperature 0.7', [rc.logprobs.token_logprobs, pc.logprobs.token_logprobs]);
  check(pc.logprobs.token_logprobs.every(v => v <= 0 && v > -50), 'processed logprobs finite and <= 0', pc.logprobs.token_logprobs);
  check(pc.weights_versions.length === 16 && pro.json.usage.completion_tokens === 16, 'weights_versions length == completion tokens', pc.weights_versions);
  // Temperature 1 and no filters: processed == raw (up to the last bits of two summation orders).
  const one = { ...body, temperature: 1, top_p: 1 };
  const r1 = (await post('/v1/completions', { ...one, logprobs_mode: 'raw' })).json.choices[0];
  const p1 = (await post('/v1/completions', { ...one, logprobs_mode: 'processed' })).json.choices[0];
  const d1 = Math.max(...r1.logprobs.token_logprobs.map((v, i) => Math.abs(v - p1.logprobs.token_logprobs[i])));
  check(d1 < 1e-5, 'temperature 1, no filters: processed == raw', d1);

  // Streaming: the chunks' token_ids concatenate to the non-streamed ids; every chunk carries a
  // weights_version; the first carries prompt_token_ids.
  const stream = await client.completions.create({ ...body, logprobs_mode: 'processed', stream: true });
  const ids = [], lps = [];
  let first = null, versions_ok = true;
  for await (const ch of stream) {
    const c = ch.choices[0];
    if (!c) continue;
    if (!first) first = c;
    ids.push(...(c.token_ids || []));
    if (c.logprobs) lps.push(...c.logprobs.token_logprobs);
    versions_ok = versions_ok && 'weights_version' in c && (c.token_ids.length === 0 || c.weights_version === 0);
  }
  check(JSON.stringify(ids) === JSON.stringify(pc.token_ids), 'streamed token_ids == non-streamed', [ids, pc.token_ids]);
  check(JSON.stringify(lps) === JSON.stringify(pc.logprobs.token_logprobs), 'streamed processed logprobs == non-streamed', [lps, pc.logprobs.token_logprobs]);
  check(versions_ok, 'every streamed chunk carries weights_version');
  check(first && JSON.stringify(first.prompt_token_ids) === JSON.stringify(prompt), 'first chunk carries prompt_token_ids', first);

  // A stop token id ends the choice and is the last of its token_ids (as vLLM).
  const stopId = gc.token_ids[3];
  const st = await post('/v1/completions', { model: MODEL, prompt, max_tokens: n, temperature: 0, return_token_ids: true,
                                             stop_token_ids: [stopId] });
  const sc = st.json.choices[0];
  check(sc.finish_reason === 'stop' && sc.token_ids[sc.token_ids.length - 1] === stopId &&
        sc.token_ids.length === gc.token_ids.indexOf(stopId) + 1 && sc.weights_versions.length === sc.token_ids.length,
        'stop token id is the last token id', sc);

  // Chat: prompt_token_ids at the top level == /tokenize of the messages; default mode is raw.
  const msgs = [{ role: 'user', content: 'Once upon a time' }];
  const tk = await post('/tokenize', { model: MODEL, messages: msgs });
  const cr = await post('/v1/chat/completions', { model: MODEL, messages: msgs, max_tokens: 6, temperature: 0.5, seed: 3,
                                                  logprobs: true, return_token_ids: true, ignore_eos: true });
  check(cr.status === 200 && JSON.stringify(cr.json.prompt_token_ids) === JSON.stringify(tk.json.tokens), 'chat prompt_token_ids', cr.json);
  const cc = cr.json.choices[0];
  check(cc.token_ids.length === 6 && cc.weights_versions.length === 6 && cc.logprobs.content.length === 6, 'chat token_ids / weights_versions', cc);
  const cp = await post('/v1/chat/completions', { model: MODEL, messages: msgs, max_tokens: 6, temperature: 0.5, seed: 3,
                                                  logprobs: true, ignore_eos: true, logprobs_mode: 'processed' });
  const cpc = cp.json.choices[0];
  check(cpc.logprobs.content.every((e, i) => e.logprob !== cc.logprobs.content[i].logprob), 'chat processed != raw at temperature 0.5',
        [cpc.logprobs.content.map(e => e.logprob), cc.logprobs.content.map(e => e.logprob)]);
  check(!('token_ids' in cpc) && Array.isArray(cpc.weights_versions), 'no token_ids unless asked; weights_versions always', cpc);

  for (const [route, b] of [['/v1/completions', { prompt }], ['/v1/chat/completions', { messages: msgs }]]) {
    const bad = await post(route, { model: MODEL, max_tokens: 2, logprobs_mode: 'raw_logits', ...b });
    check(bad.status === 400 && bad.json.error.param === 'logprobs_mode' && /logprobs_mode/.test(bad.json.error.message),
          `bad logprobs_mode -> 400 (${route})`, bad.json);
  }
  const oov = await post('/v1/completions', { model: MODEL, prompt: [1, 2, oracle.vocab_size], max_tokens: 2 });
  check(oov.status === 400 && oov.json.error.param === 'prompt' && /vocabulary/.test(oov.json.error.message), 'token id prompt outside the vocabulary -> 400', oov.json);
}

(async () => {
  const t0 = Date.now();
  for (const [name, fn] of [['greedy oracle', testGreedyOracle], ['chat', testChat], ['n/logprobs/stops', testNLogprobsStops],
                            ['32 streams', testConcurrentEqualsSolo], ['abort', testAbort], ['errors', testErrors],
                            ['rl fields', testRlFields]]) {
    try { await fn(); } catch (e) { failed++; console.error(`FAIL ${name}: ${e && e.stack || e}`); }
  }
  console.log(`serve_real.test.js: ${passed} passed, ${failed} failed (${Date.now() - t0} ms)`);
  process.exit(failed ? 1 : 0);
})();
