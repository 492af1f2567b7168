// POST /v1/embeddings through the official `openai` npm client: embeddings.create without an
// encoding_format (the client then asks for base64 and decodes it itself), with "float", and an
// error. Started by tests/unit/test_server_embed.c against `tandem serve` on the llama2 reference
// model with the default pooling (last, L2-normalised); expected values come from the PyTorch
// oracle (tests/reference/embed_oracle.py), never from the server.
// Usage: node tests/e2e/embeddings.test.js --port N --oracle PATH --model NAME
'use strict';
const fs = require('fs');
const path = require('path');
const mod = require(path.join(__dirname, '../oracle/node_modules/openai'));
const OpenAI = mod.OpenAI || mod.default || mod;

const args = process.argv.slice(2);
const arg = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
const port = Number(arg('--port'));
const MODEL = arg('--model') || 'm';
const oracle = JSON.parse(fs.readFileSync(arg('--oracle'), 'utf8'));
const ref = oracle.models.find(m => m.name === 'llama2');
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });

let passed = 0, failed = 0;
function check(cond, what, extra) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 600) : ''}`); }
}
// Cosine > 0.9999 and every value within 1e-5 of the oracle's.
function near(got, want) {
  if (!Array.isArray(got) || got.length !== want.length) return false;
  let dot = 0, ng = 0, nw = 0, maxd = 0;
  for (let i = 0; i < want.length; i++) {
    dot += got[i] * want[i]; ng += got[i] * got[i]; nw += want[i] * want[i];
    maxd = Math.max(maxd, Math.abs(got[i] - want[i]));
  }
  return dot / Math.sqrt(ng * nw) > 0.9999 && maxd <= 1e-5;
}

(async () => {
  const texts = oracle.inputs.map((x, i) => [x, i]).filter(([x]) => x.text !== undefined);
  const r = await client.embeddings.create({ model: MODEL, input: texts.map(([x]) => x.text) });
  check(r.object === 'list' && r.data.length === texts.length, 'list of embeddings', r.object);
  texts.forEach(([x, i], k) => {
    check(r.data[k].index === k && near(r.data[k].embedding, ref.last[i]), `default (base64) input ${i} vs oracle`);
  });
  const want = texts.reduce((n, [x]) => n + x.ids.length, 0);
  check(r.usage.prompt_tokens === want && r.usage.total_tokens === want, 'usage', r.usage);
  // The same batch (so the same forwards) as floats: as float32, exactly the values the client
  // decoded (JSON numbers carry at least 15 significant digits, which pin a float32 down).
  const f = await client.embeddings.create({ model: MODEL, input: texts.map(([x]) => x.text), encoding_format: 'float' });
  const same = (it, k) => it.embedding.every((v, d) => Math.fround(v) === r.data[k].embedding[d]);
  check(f.data.length === texts.length && f.data.every(same), 'float form == the client-decoded base64 form');
  const ids = oracle.inputs[6].ids;
  const t = await client.embeddings.create({ model: MODEL, input: [ids] });
  check(near(t.data[0].embedding, ref.last[6]), 'token-id input vs oracle');
  try {
    await client.embeddings.create({ model: MODEL, input: 'x', dimensions: 7 });
    check(false, 'dimensions 7 refused');
  } catch (e) {
    check(e.status === 400 && /dimensions/.test(e.message), 'dimensions 7 -> 400', e.message);
  }
  console.log(`embeddings.test.js: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})().catch(e => { console.error(e); process.exit(1); });
