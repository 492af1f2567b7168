// End-to-end test of tandem's OpenAI-compatible server with the official `openai` npm client and raw
// fetch. Started by tests/unit/test_server_e2e.c against the deterministic mock engine
// (tests/unit/serve_mock.h): byte tokens (id = byte + 3, BOS 0), template "role: content\n...assistant:",
// choice j repeats the prompt's bytes from byte j, EOS before '!', logprob -0.5, alternatives -1.5, ...
// Usage: node tests/e2e/openai_client.test.js --port N --port2 M   (M: a server with max_connections 4)
'use strict';
const path = require('path');
const mod = require(path.join(__dirname, '../oracle/node_modules/openai'));
const OpenAI = mod.OpenAI || mod.default || mod;

const args = process.argv.slice(2);
const arg = (name) => { const i = args.indexOf(name); return i >= 0 ? Number(args[i + 1]) : 0; };
const port = arg('--port'), port2 = arg('--port2');
const base = `http://127.0.0.1:${port}`;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'x', maxRetries: 0, timeout: 20000 });
const MODEL = 'mock-model';

let passed = 0, failed = 0;
function check(cond, what, extra) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 400) : ''}`); }
}
// Expected mock output: the content bytes of the prompt, cyclic from byte j.
function mockOut(content, j, n) { let s = ''; for (let k = 0; k < n; k++) s += content[(k + j) % content.length]; return s; }
const chatPrompt = (msgs) => msgs.map(m => `${m.role}: ${m.content}\n`).join('') + 'assistant:';

async function post(p, body, raw) {
  const r = await fetch(base + p, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                   body: raw !== undefined ? raw : JSON.stringify(body) });
  const text = await r.text();
  let json = null; try { json = JSON.parse(text); } catch (e) {}
  return { status: r.status, json, text };
}
function isErr(res, status, param) {
  const e = res.json && res.json.error;
  return res.status === status && e && typeof e.message === 'string' && typeof e.type === 'string' &&
         'param' in e && e.code === status && (param === undefined || e.param === param);
}
async function metrics() { return (await fetch(base + '/metrics')).text(); }
function metric(text, name, label) {
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') && (!label || line.includes(label))) return Number(line.split(' ').pop());
  }
  return NaN;
}
const sleep = (ms) => new Promise(r => setTimeout(r, ms));

async function testBasics() {
  const c = await client.completions.create({ model: MODEL, prompt: 'hello world', max_tokens: 5 });
  check(c.object === 'text_completion' && c.choices[0].text === 'hello' && c.choices[0].finish_reason === 'length', 'completion text', c);
  check(c.usage.prompt_tokens === 12 && c.usage.completion_tokens === 5 && c.usage.total_tokens === 17, 'completion usage', c.usage);

  const msgs = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }];
  const ch = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 7 });
  const want = mockOut(chatPrompt(msgs), 0, 7);
  check(ch.object === 'chat.completion' && ch.choices[0].message.role === 'assistant' &&
        ch.choices[0].message.content === want && ch.choices[0].finish_reason === 'length', 'chat message', ch);
  check(ch.usage.prompt_tokens === chatPrompt(msgs).length && ch.usage.completion_tokens === 7, 'chat usage (no BOS in chat)', ch.usage);

  const eos = await client.completions.create({ model: MODEL, prompt: 'hi!', max_tokens: 10 });
  check(eos.choices[0].text === 'hi' && eos.choices[0].finish_reason === 'stop', 'EOS finishes with stop', eos.choices[0]);
  const ign = await client.completions.create({ model: MODEL, prompt: 'hi!', max_tokens: 4, ignore_eos: true });
  check(ign.choices[0].text === 'hi!h' && ign.choices[0].finish_reason === 'length', 'ignore_eos', ign.choices[0]);

  const multi = await client.completions.create({ model: MODEL, prompt: ['ab', 'cd'], max_tokens: 3, n: 2 });
  const texts = multi.choices.map(x => [x.index, x.text]);
  check(JSON.stringify(texts) === JSON.stringify([[0, 'aba'], [1, 'bab'], [2, 'cdc'], [3, 'dcd']]), 'list of prompts x n=2', texts);
  const toks = await client.completions.create({ model: MODEL, prompt: [107, 108], max_tokens: 2 });
  check(toks.choices[0].text === 'hi', 'token-array prompt', toks.choices[0]);
  const toks2 = await client.completions.create({ model: MODEL, prompt: [[107, 108], [100]], max_tokens: 2 });
  check(toks2.choices.length === 2 && toks2.choices[1].text === 'aa', 'list of token arrays', toks2.choices);
  const echo = await client.completions.create({ model: MODEL, prompt: 'xy', max_tokens: 2, echo: true });
  check(echo.choices[0].text === 'xyxy', 'echo', echo.choices[0]);

  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === MODEL && models.data[0].object === 'model', 'models.list', models.data);
}

async function testNAndStops() {
  const n3 = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'abc' }], max_tokens: 4, n: 3 });
  const p = chatPrompt([{ role: 'user', content: 'abc' }]);
  check(n3.choices.length === 3 && n3.choices.every(c => c.message.content === mockOut(p, c.index, 4)), 'chat n=3', n3.choices);

  const st = await client.completions.create({ model: MODEL, prompt: 'hello world', max_tokens: 11, stop: ['wor'] });
  check(st.choices[0].text === 'hello ' && st.choices[0].finish_reason === 'stop', 'stop string not emitted', st.choices[0]);
  const st2 = await client.completions.create({ model: MODEL, prompt: 'hello world', max_tokens: 11, stop: 'zz' });
  check(st2.choices[0].text === 'hello world' && st2.choices[0].finish_reason === 'length', 'unmatched stop string', st2.choices[0]);
  // A stop string that straddles tokens, streamed: nothing of it may leak into any chunk.
  const stream = await client.completions.create({ model: MODEL, prompt: 'hello world', max_tokens: 11, stop: ['lo w', 'xyz'], stream: true });
  let text = '', fin = null, leaked = false, empty = 0;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text; if (c.text.includes('lo')) leaked = true; if (c.finish_reason) fin = c.finish_reason;
      if (!c.text && !c.finish_reason) empty++;
    }
  }
  check(text === 'hel' && fin === 'stop' && !leaked && empty === 0, 'streamed stop across tokens', { text, fin, leaked, empty });
  const sid = await client.completions.create({ model: MODEL, prompt: 'hello', max_tokens: 5, stop_token_ids: [111] });  // 'l'
  check(sid.choices[0].text === 'he' && sid.choices[0].finish_reason === 'stop', 'stop_token_ids', sid.choices[0]);
}

async function testLogprobs() {
  const c = await client.completions.create({ model: MODEL, prompt: 'hello', max_tokens: 4, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  check(lp && JSON.stringify(lp.tokens) === JSON.stringify(['h', 'e', 'l', 'l']), 'legacy logprobs tokens', lp);
  check(lp && lp.token_logprobs.every(v => v === -0.5) && JSON.stringify(lp.text_offset) === '[0,1,2,3]', 'legacy token_logprobs/text_offset', lp);
  check(lp && lp.top_logprobs.length === 4 && lp.top_logprobs[0].h === -0.5 && lp.top_logprobs[0].i === -1.5 &&
        Object.keys(lp.top_logprobs[0]).length === 2, 'legacy top_logprobs', lp && lp.top_logprobs);
  const e = await client.completions.create({ model: MODEL, prompt: 'ab', max_tokens: 1, logprobs: 0, echo: true });
  const el = e.choices[0].logprobs;
  check(e.choices[0].text === 'aba' && el.tokens.length === 4 && el.token_logprobs[0] === null &&
        el.token_logprobs[1] === -1 && el.token_logprobs[3] === -0.5 && JSON.stringify(el.text_offset) === '[0,0,1,2]',
        'echo + logprobs include prompt tokens', el);

  const ch = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'q' }], max_tokens: 2, logprobs: true, top_logprobs: 3 });
  const cl = ch.choices[0].logprobs;
  check(cl && cl.content.length === 2 && cl.content[0].token === 'u' && cl.content[0].logprob === -0.5 &&
        JSON.stringify(cl.content[0].bytes) === '[117]' && cl.content[0].top_logprobs.length === 3 &&
        cl.content[0].top_logprobs[1].token === 'v' && cl.content[0].top_logprobs[1].logprob === -1.5, 'chat logprobs', cl);
  const nol = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'q' }], max_tokens: 1 });
  check(nol.choices[0].logprobs === null, 'chat logprobs null when not asked', nol.choices[0]);
}

async function testStreaming() {
  const msgs = [{ role: 'user', content: 'stream me' }];
  const s = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 6, n: 2, stream: true,
                                                   stream_options: { include_usage: true }, logprobs: true });
  const out = ['', ''], fin = [null, null], roleFirst = [false, false], seen = [0, 0];
  let usage = null, objOk = true, lpOk = true;
  for await (const chunk of s) {
    objOk = objOk && chunk.object === 'chat.completion.chunk';
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (seen[c.index]++ === 0) roleFirst[c.index] = c.delta.role === 'assistant';
      if (c.delta.content) { out[c.index] += c.delta.content; lpOk = lpOk && c.logprobs && c.logprobs.content.length === 1; }
      if (c.finish_reason) fin[c.index] = c.finish_reason;
    }
  }
  const p = chatPrompt(msgs);
  check(objOk && out[0] === mockOut(p, 0, 6) && out[1] === mockOut(p, 1, 6), 'chat stream n=2 text', out);
  check(roleFirst[0] && roleFirst[1] && fin[0] === 'length' && fin[1] === 'length' && lpOk, 'chat stream role/finish/logprobs', { roleFirst, fin, lpOk });
  check(usage && usage.completion_tokens === 12 && usage.prompt_tokens === p.length, 'stream usage chunk', usage);

  // Raw SSE framing: every event is "data: <json>\n\n", usage chunk has empty choices, ends with [DONE].
  const r = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'abc', max_tokens: 3, stream: true, stream_options: { include_usage: true } }) });
  const body = await r.text();
  const events = body.split('\n\n').filter(x => x.length);
  check(r.headers.get('content-type').startsWith('text/event-stream'), 'SSE content type', r.headers.get('content-type'));
  check(events.every(e => e.startsWith('data: ')) && events[events.length - 1] === 'data: [DONE]' && body.endsWith('\n\n'), 'SSE framing', body.slice(-200));
  const objs = events.slice(0, -1).map(e => JSON.parse(e.slice(6)));
  const last = objs[objs.length - 1];
  check(objs.every(o => o.object === 'text_completion') && last.choices.length === 0 && last.usage.completion_tokens === 3 &&
        objs.map(o => (o.choices[0] || {}).text || '').join('') === 'abc', 'completion stream chunks', objs);
  const noUsage = await post('/v1/completions', { prompt: 'abc', max_tokens: 2, stream: true });
  check(!noUsage.text.includes('"usage"') && noUsage.text.endsWith('data: [DONE]\n\n'), 'no usage chunk unless asked', noUsage.text);
}

async function testRawRoutes() {
  const h = await fetch(base + '/health');
  check(h.status === 200, '/health', h.status);
  const t = await post('/tokenize', { prompt: 'ab' });
  check(t.status === 200 && JSON.stringify(t.json.tokens) === '[0,100,101]' && t.json.count === 3 && t.json.max_model_len === 256, '/tokenize prompt', t.json);
  const t2 = await post('/tokenize', { prompt: 'ab', add_special_tokens: false });
  check(t2.json && t2.json.count === 2, '/tokenize add_special_tokens false', t2.json);
  const t3 = await post('/tokenize', { model: MODEL, messages: [{ role: 'user', content: 'x' }] });
  check(t3.json && t3.json.count === 'user: x\nassistant:'.length, '/tokenize messages', t3.json);
  const d = await post('/detokenize', { tokens: [0, 100, 101] });
  check(d.status === 200 && d.json.prompt === 'ab', '/detokenize', d.json);
  const d2 = await post('/detokenize', { tokens: [100, 999] });
  check(isErr(d2, 400), '/detokenize out-of-vocab id', d2.json);
  const m = await metrics();
  for (const name of ['vllm:time_to_first_token_seconds_bucket', 'vllm:inter_token_latency_seconds_bucket',
                      'vllm:request_time_per_output_token_seconds_bucket', 'vllm:e2e_request_latency_seconds_count',
                      'vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
                      'vllm:prefix_cache_queries_total', 'vllm:prefix_cache_hits_total', 'vllm:prompt_tokens_total',
                      'vllm:generation_tokens_total', 'vllm:request_success_total'])
    check(m.includes(name + '{') && m.includes('model_name="mock-model"'), `metric ${name}`);
  check(metric(m, 'vllm:e2e_request_latency_seconds_count') > 10 && metric(m, 'vllm:generation_tokens_total') > 50, 'metrics counted requests',
        [metric(m, 'vllm:e2e_request_latency_seconds_count'), metric(m, 'vllm:generation_tokens_total')]);
  check(metric(m, 'vllm:request_success_total', 'finished_reason="length"') > 5 &&
        metric(m, 'vllm:request_success_total', 'finished_reason="stop"') > 2, 'request_success_total by reason');
  check(metric(m, 'vllm:prefix_cache_hits_total') > 0, 'prefix cache hits from repeated prompts');
  check(metric(m, 'vllm:time_to_first_token_seconds_bucket', 'le="+Inf"') === metric(m, 'vllm:time_to_first_token_seconds_count'), 'histogram +Inf = count');
}

async function testErrors() {
  let r = await post('/v1/completions', null, '{"prompt": "x", ');
  check(isErr(r, 400), 'malformed JSON -> 400', r.text);
  r = await post('/v1/completions', null, '[1,2]');
  check(isErr(r, 400), 'non-object body -> 400', r.text);
  r = await post('/v1/completions', { prompt: 'x', max_tokens: '5' });
  check(isErr(r, 400, 'max_tokens'), 'string max_tokens -> 400 naming it', r.json);
  r = await post('/v1/completions', { prompt: 'x', temperature: 'hot' });
  check(isErr(r, 400, 'temperature'), 'string temperature -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', temperature: 3 });
  check(isErr(r, 400, 'temperature'), 'temperature out of range -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', stream: 'yes' });
  check(isErr(r, 400, 'stream'), 'string stream -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', stream_options: { include_usage: true } });
  check(isErr(r, 400, 'stream_options'), 'stream_options without stream -> 400', r.json);
  r = await post('/v1/completions', { prompt: 12 });
  check(isErr(r, 400, 'prompt'), 'numeric prompt -> 400', r.json);
  r = await post('/v1/completions', { prompt: [1, 'a'] });
  check(isErr(r, 400, 'prompt'), 'mixed prompt list -> 400', r.json);
  r = await post('/v1/completions', { prompt: [5000] });
  check(isErr(r, 400, 'prompt'), 'out-of-vocab token -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', suffix: 'y' });
  check(isErr(r, 400, 'suffix'), 'suffix rejected', r.json);
  r = await post('/v1/completions', { max_tokens: 3 });
  check(isErr(r, 400, 'prompt'), 'missing prompt -> 400', r.json);
  r = await post('/v1/chat/completions', { messages: 'hi' });
  check(isErr(r, 400, 'messages'), 'messages not an array -> 400', r.json);
  r = await post('/v1/chat/completions', { messages: [{ content: 'x' }] });
  check(isErr(r, 400, 'messages'), 'message without role -> 400', r.json);
  r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 });
  check(isErr(r, 400, 'top_logprobs'), 'top_logprobs without logprobs -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', logit_bias: { abc: 1 } });
  check(isErr(r, 400, 'logit_bias'), 'bad logit_bias key -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', stop: [1] });
  check(isErr(r, 400, 'stop'), 'non-string stop -> 400', r.json);
  // Unknown model (the client raises NotFoundError).
  try { await client.completions.create({ model: 'nope', prompt: 'x' }); check(false, 'unknown model must throw'); }
  catch (e) { check(e.status === 404 && e.error && /nope/.test(e.error.message), 'unknown model -> 404', { status: e.status, error: e.error }); }
  // Context limits (max_model_len 256).
  r = await post('/v1/completions', { prompt: 'x'.repeat(300) });
  check(isErr(r, 400) && /maximum context length is 256/.test(r.json.error.message), 'prompt longer than context -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x'.repeat(200), max_tokens: 100 });
  check(isErr(r, 400, 'max_tokens'), 'prompt + max_tokens beyond context -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', max_tokens: 1000 });
  check(isErr(r, 400, 'max_tokens'), 'max_tokens beyond limit -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', max_tokens: 0 });
  check(isErr(r, 400, 'max_tokens'), 'max_tokens 0 -> 400', r.json);
  r = await post('/v1/completions', { prompt: 'x', n: 100 });
  check(isErr(r, 400, 'n'), 'n beyond limit -> 400', r.json);
  // Body beyond the 64 KiB limit.
  r = await post('/v1/completions', { prompt: 'x'.repeat(100000) });
  check(isErr(r, 413), 'body too large -> 413', r.status);
  const big = new TextEncoder().encode(JSON.stringify({ prompt: 'x'.repeat(100000) }));
  const rs = await fetch(base + '/v1/completions', { method: 'POST', duplex: 'half', headers: { 'Content-Type': 'application/json' },
    body: new ReadableStream({ start(ctl) { ctl.enqueue(big.slice(0, 50000)); ctl.enqueue(big.slice(50000)); ctl.close(); } }) });
  const rsj = await rs.json().catch(() => null);
  check(rs.status === 413 && rsj && rsj.error.code === 413, 'chunked body too large -> 413', rs.status);
  // Request line + headers beyond the per-connection cap (MHD answers itself).
  const hb = await fetch(base + '/health', { headers: { 'X-Big': 'x'.repeat(100000) } }).catch(() => null);
  check(hb && hb.status === 431, 'header block too large -> 431', hb && hb.status);
  // Routes and methods.
  r = await post('/v2/whatever', {});
  check(isErr(r, 404), 'unknown route -> 404', r.json);
  const g = await fetch(base + '/v1/completions');
  const gj = await g.json().catch(() => null);
  check(g.status === 405 && gj && gj.error && gj.error.code === 405, 'wrong method -> 405', gj);
  const c = await client.completions.create({ model: MODEL, prompt: 'still', max_tokens: 3 });
  check(c.choices[0].text === 'sti', 'server keeps serving after errors', c.choices[0]);
}

async function testConcurrency() {
  // Every stream waits after its first chunk until all N have one, so all N are open at once.
  const N = 300;
  let started = 0, release;
  const barrier = new Promise(r => { release = r; });
  const one = async (i) => {
    const prompt = `p${i}-`;
    const s = await client.completions.create({ model: MODEL, prompt, max_tokens: 150, stream: true, ignore_eos: true });
    let text = '', fin = null, first = true;
    for await (const ch of s) {
      for (const c of ch.choices) { text += c.text; if (c.finish_reason) fin = c.finish_reason; }
      if (first) { first = false; if (++started === N) release(); await barrier; }
    }
    return text === mockOut(prompt, 0, 150) && fin === 'length';
  };
  const t0 = Date.now();
  const timer = setTimeout(() => release(), 90000);  // never hang: a missing stream fails below
  const res = await Promise.all(Array.from({ length: N }, (_, i) => one(i).catch(e => { console.error(String(e)); return false; })));
  clearTimeout(timer);
  const ok = res.filter(Boolean).length;
  check(started === N, `${N} streams open at once`, started);
  check(ok === N, `${N} concurrent streams complete correctly`, ok);
  console.log(`concurrency: ${N} streams x 150 tokens in ${Date.now() - t0} ms`);
}

async function testAbort() {
  const before = await metrics();
  const ab0 = metric(before, 'tandem:engine_aborted_requests_total');
  const ctl = new AbortController();
  const s = await client.completions.create({ model: MODEL, prompt: 'abort me', max_tokens: 240, stream: true, ignore_eos: true },
                                            { signal: ctl.signal });
  let n = 0;
  try { for await (const ch of s) { if (++n === 3) ctl.abort(); } } catch (e) { /* aborted */ }
  let ab = ab0, fin = 0;
  for (let i = 0; i < 100 && (ab <= ab0 || !(fin >= 1)); i++) { await sleep(20); const m = await metrics(); ab = metric(m, 'tandem:engine_aborted_requests_total'); fin = metric(m, 'vllm:request_success_total', 'finished_reason="abort"'); }
  check(ab === ab0 + 1 && fin >= 1, 'client abort cancels the engine request', { ab0, ab, fin });
  const m = await metrics();
  check(metric(m, 'vllm:num_requests_running') === 0 && metric(m, 'vllm:kv_cache_usage_perc') === 0, 'engine freed everything', [metric(m, 'vllm:num_requests_running'), metric(m, 'vllm:kv_cache_usage_perc')]);
}

async function testConnectionLimit() {
  if (!port2) return;
  const b2 = `http://127.0.0.1:${port2}`;
  const ctls = [], statuses = [];
  const open = [];
  for (let i = 0; i < 7; i++) {
    const ctl = new AbortController(); ctls.push(ctl);
    open.push(fetch(b2 + '/v1/completions', { method: 'POST', signal: ctl.signal, headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'slow', max_tokens: 200, stream: true, ignore_eos: true }) })
      .then(async r => { statuses.push(r.status); if (r.status !== 200) return r.json(); return null; }).catch(() => null));
    await sleep(30);
  }
  const bodies = await Promise.all(open);
  const rej = bodies.filter(b => b && b.error && b.error.code === 503);
  check(statuses.filter(s => s === 200).length >= 4 && rej.length >= 1, 'beyond max_connections -> 503 JSON', statuses);
  ctls.forEach(c => c.abort());
  await sleep(100);
}

(async () => {
  const t0 = Date.now();
  for (const [name, fn] of [['basics', testBasics], ['n/stops', testNAndStops], ['logprobs', testLogprobs],
                            ['streaming', testStreaming], ['errors', testErrors], ['raw routes', testRawRoutes],
                            ['concurrency', testConcurrency], ['abort', testAbort], ['connection limit', testConnectionLimit]]) {
    try { await fn(); } catch (e) { failed++; console.error(`FAIL ${name}: ${e && e.stack || e}`); }
  }
  console.log(`openai e2e: ${passed} passed, ${failed} failed (${Date.now() - t0} ms)`);
  process.exit(failed ? 1 : 0);
})();
