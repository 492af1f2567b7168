// A deterministic mock of an OpenAI-compatible streaming server for the load generator's
// end-to-end test. Not a model: it streams " tok" chunks on a fixed schedule.
//
//   node mock_openai_server.js [--port 0] [--first-delay-ms 100] [--token-delay-ms 20] [--eos-at 5]
//                              [--tls-key KEY.pem --tls-cert CERT.pem]   (https instead of http)
//
// Prints "PORT <n>" on stdout once listening. Streams min(max_tokens, eos-at) token chunks
// (max_tokens of them with ignore_eos): the first after first-delay-ms, then one every
// token-delay-ms, then a usage chunk (when stream_options.include_usage) and [DONE].
// The model name selects a behaviour: mock-error (HTTP 500), mock-hang (never answers),
// mock-malformed (a broken JSON chunk), mock-nousage (no usage chunk), mock-empty (an empty-text
// chunk before the tokens), mock-split (every event
// written in two pieces split inside the JSON), mock-length (whole body with Content-Length),
// mock-drop-reused (closes a keep-alive connection when a second request arrives on it).
// GET /mock/stats reports the requests seen, the most in flight at once and the headers of the
// latest generation request (last_headers); POST /mock/reset.
'use strict';
const fs = require('fs');
const http = require('http');

const opt = { port: 0, firstDelayMs: 100, tokenDelayMs: 20, eosAt: 5, tlsKey: null, tlsCert: null };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i], v = Number(process.argv[i + 1]);
  if (k === '--tls-key') { opt.tlsKey = process.argv[i + 1]; continue; }
  if (k === '--tls-cert') { opt.tlsCert = process.argv[i + 1]; continue; }
  if (k === '--port') opt.port = v;
  else if (k === '--first-delay-ms') opt.firstDelayMs = v;
  else if (k === '--token-delay-ms') opt.tokenDelayMs = v;
  else if (k === '--eos-at') opt.eosAt = v;
  else { console.error('unknown option ' + k); process.exit(2); }
}

let stats;
function resetStats() {
  stats = { requests: 0, in_flight: 0, max_concurrent: 0, ignore_eos: 0, include_usage: 0,
            prompt_tokens: 0, completion_tokens: 0, connections: 0, dropped: 0, last_body: null, last_headers: null };
}
resetStats();

function json(res, code, obj) {
  const s = JSON.stringify(obj);
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(s) });
  res.end(s);
}

function handleGenerate(req, res, body, chat) {
  req.socket.served = (req.socket.served || 0) + 1;
  if (body.includes('"mock-drop-reused"') && req.socket.served > 1) {
    stats.dropped++;  // a keep-alive connection that dies under a new request, before any reply
    req.socket.destroy();
    return;
  }
  stats.requests++;
  stats.in_flight++;
  stats.max_concurrent = Math.max(stats.max_concurrent, stats.in_flight);
  let finished = false;
  res.on('close', () => { if (!finished) { finished = true; stats.in_flight--; } });
  let b;
  try { b = JSON.parse(body); } catch (e) { return json(res, 400, { error: { message: 'bad json' } }); }
  stats.last_body = b;
  stats.last_headers = req.headers;
  const model = b.model || '';
  if (b.ignore_eos) stats.ignore_eos++;
  const includeUsage = !!(b.stream_options && b.stream_options.include_usage);
  if (includeUsage) stats.include_usage++;
  const maxTokens = b.max_tokens ?? b.max_completion_tokens ?? 16;
  const n = b.ignore_eos ? maxTokens : Math.min(maxTokens, opt.eosAt);
  let promptTokens;
  if (chat) promptTokens = String(b.messages[b.messages.length - 1].content).split(/\s+/).filter(Boolean).length;
  else promptTokens = Array.isArray(b.prompt) ? b.prompt.length : String(b.prompt).split(/\s+/).length;
  stats.prompt_tokens += promptTokens;

  if (model === 'mock-error') return json(res, 500, { error: { message: 'mock failure', code: 500 } });
  if (model === 'mock-hang') return;  // the client's timeout must end it

  const tokenChunk = (k) => chat
    ? { id: 'chatcmpl-mock', object: 'chat.completion.chunk', model,
        choices: [{ index: 0, delta: k === 0 ? { role: 'assistant', content: ' tok' } : { content: ' tok' },
                    finish_reason: k === n - 1 ? (b.ignore_eos || n === maxTokens ? 'length' : 'stop') : null }] }
    : { id: 'cmpl-mock', object: 'text_completion', model,
        choices: [{ index: 0, text: ' tok',
                    finish_reason: k === n - 1 ? (b.ignore_eos || n === maxTokens ? 'length' : 'stop') : null }] };
  const usageChunk = { id: 'cmpl-mock', model, choices: [],
                       usage: { prompt_tokens: promptTokens, completion_tokens: n, total_tokens: promptTokens + n } };
  const events = [];
  for (let k = 0; k < n; k++) events.push('data: ' + JSON.stringify(tokenChunk(k)) + '\n\n');
  if (model === 'mock-malformed') events.splice(1, 0, 'data: {"choices": [ broken\n\n');
  let tokenChunks = n;
  if (model === 'mock-empty') {  // a chunk with choices but empty text first, as for a special token
    const empty = chat ? { choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] }
                       : { choices: [{ index: 0, text: '' }] };
    events.unshift('data: ' + JSON.stringify(empty) + '\n\n');
    tokenChunks = n + 1;
  }
  if (includeUsage && model !== 'mock-nousage') events.push('data: ' + JSON.stringify(usageChunk) + '\n\n');
  events.push('data: [DONE]\n\n');
  stats.completion_tokens += n;

  if (model === 'mock-length') {  // everything at once, Content-Length framing, after the first delay
    setTimeout(() => {
      const s = events.join('');
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Content-Length': Buffer.byteLength(s) });
      res.end(s);
    }, opt.firstDelayMs);
    return;
  }
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  res.flushHeaders();
  let i = 0;
  const send = () => {
    if (res.destroyed) return;
    const ev = events[i++];
    if (model === 'mock-split' && ev.length > 12) {
      const cut = Math.floor(ev.length / 2);
      res.write(ev.slice(0, cut));
      setTimeout(() => { if (!res.destroyed) { res.write(ev.slice(cut)); next(); } }, 2);
      return;
    }
    res.write(ev);
    next();
  };
  const next = () => {
    if (i >= events.length) { res.end(); return; }
    // token chunks keep the schedule; usage and [DONE] follow the last token at once
    setTimeout(send, i < tokenChunks ? opt.tokenDelayMs : 0);
  };
  setTimeout(send, opt.firstDelayMs);
}

const handler = (req, res) => {
  let body = '';
  req.on('data', (d) => { body += d; });
  req.on('end', () => {
    const url = req.url.split('?')[0];
    if (req.method === 'GET' && url === '/v1/models')
      return json(res, 200, { object: 'list', data: [{ id: 'mock-model', object: 'model', root: 'mock-model' }] });
    if (req.method === 'GET' && url === '/mock/stats') return json(res, 200, stats);
    if (req.method === 'POST' && url === '/mock/reset') { resetStats(); return json(res, 200, { ok: true }); }
    if (req.method === 'POST' && url === '/v1/completions') return handleGenerate(req, res, body, false);
    if (req.method === 'POST' && url === '/v1/chat/completions') return handleGenerate(req, res, body, true);
    json(res, 404, { error: { message: 'not found: ' + url } });
  });
};
const server = opt.tlsKey
  ? require('https').createServer({ key: fs.readFileSync(opt.tlsKey), cert: fs.readFileSync(opt.tlsCert) }, handler)
  : http.createServer(handler);
server.on(opt.tlsKey ? 'secureConnection' : 'connection', () => { stats.connections++; });
server.keepAliveTimeout = 10000;
server.listen(opt.port, '127.0.0.1', () => {
  process.stdout.write('PORT ' + server.address().port + '\n');
});
// The test kills us; also leave if our parent goes away (stdin closes).
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
