// End-to-end test of structured output through the official `openai` npm client against a real
// `tandem serve` (the reference Qwen3 model: random weights, so only the grammar makes the output
// valid). Started by tests/unit/test_structured_e2e.c. Every output is checked by an independent
// oracle: JSON.parse plus ajv for JSON schemas, a JavaScript RegExp for regexes, GBNF and choices,
// a prefix-tolerant JSON reader for json_object outputs cut by max_tokens.
// Usage: node tests/e2e/structured.test.js --port N --model NAME
'use strict';
const path = require('path');
const mod = require(path.join(__dirname, '../oracle/node_modules/openai'));
const OpenAI = mod.OpenAI || mod.default || mod;
const Ajv2020 = require(path.join(__dirname, '../oracle/node_modules/ajv/dist/2020')).default;

const args = process.argv.slice(2);
const arg = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
const MODEL = arg('--model') || 'qwen3';
const client = new OpenAI({ baseURL: `http://127.0.0.1:${Number(arg('--port'))}/v1`, apiKey: 'x', maxRetries: 0,
                            timeout: 60000 });

let passed = 0, failed = 0;
function check(cond, what, extra) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL ${what}${extra !== undefined ? ': ' + JSON.stringify(extra).slice(0, 800) : ''}`); }
}
const msgs = (s) => [{ role: 'user', content: s }];

// Whether s is a prefix of some JSON text (a value followed by nothing): a recursive-descent reader
// that accepts running out of input anywhere. Returns 'full', 'prefix' or false.
function jsonPrefix(s) {
  let i = 0;
  const END = {};
  const ws = () => { while (i < s.length && ' \t\n\r'.includes(s[i])) i++; };
  const need = () => { if (i >= s.length) throw END; };
  function lit(w) { for (const c of w) { need(); if (s[i++] !== c) throw new Error('literal'); } }
  function str() {
    lit('"');
    for (;;) {
      need();
      const c = s[i++];
      if (c === '"') return;
      if (c === '\\') {
        need();
        const e = s[i++];
        if (e === 'u') { for (let k = 0; k < 4; k++) { need(); if (!/[0-9a-fA-F]/.test(s[i++])) throw new Error('\\u'); } }
        else if (!'"\\/bfnrt'.includes(e)) throw new Error('escape');
      } else if (c < ' ') throw new Error('control');
    }
  }
  function num() {
    const m = /^-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][+-]?[0-9]*)?/.exec(s.slice(i));
    if (!m[0].length) throw new Error('number');
    i += m[0].length;
    if (i >= s.length) throw END;  // a number can always go on
  }
  function value() {
    ws(); need();
    const c = s[i];
    if (c === '{') {
      i++; ws(); need();
      if (s[i] === '}') { i++; return; }
      for (;;) { ws(); str(); ws(); lit(':'); value(); ws(); need(); const d = s[i++]; if (d === '}') return; if (d !== ',') throw new Error(','); }
    } else if (c === '[') {
      i++; ws(); need();
      if (s[i] === ']') { i++; return; }
      for (;;) { value(); ws(); need(); const d = s[i++]; if (d === ']') return; if (d !== ',') throw new Error(','); }
    } else if (c === '"') str();
    else if (c === 't') lit('true');
    else if (c === 'f') lit('false');
    else if (c === 'n') lit('null');
    else num();
  }
  try { value(); ws(); return i === s.length ? 'full' : false; } catch (e) { return e === END ? 'prefix' : false; }
}

async function streamText(body) {
  const st = await client.chat.completions.create({ ...body, stream: true });
  let text = '', finish = null, n = 0;
  for await (const ch of st) {
    n++;
    const c = ch.choices[0];
    if (c && c.delta && c.delta.content) text += c.delta.content;
    if (c && c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, n };
}

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    n: { type: 'integer', minimum: 0 },
    ok: { type: 'boolean' },
    tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 },
    pt: { type: 'object', properties: { x: { type: 'number' }, y: { type: ['null', 'boolean'] } }, required: ['x', 'y'] },
  },
  required: ['name', 'n', 'ok', 'tags', 'pt'],
  additionalProperties: false,
};

async function testJsonSchema() {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  const validate = ajv.compile(SCHEMA);
  const rf = { type: 'json_schema', json_schema: { name: 'thing', schema: SCHEMA, strict: true } };
  for (let seed = 1; seed <= 4; seed++) {
    const body = { model: MODEL, messages: msgs('Describe a thing as JSON.'), response_format: rf, max_tokens: 400,
                   temperature: 1.0, seed };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    let v = null; try { v = JSON.parse(c.message.content); } catch (e) {}
    check(c.finish_reason === 'stop', `json_schema seed ${seed}: finish stop`, [c.finish_reason, c.message.content]);
    check(v !== null && validate(v), `json_schema seed ${seed}: ajv validates`, [c.message.content, validate.errors]);
    // streaming: same request, same seed, same text
    const s = await streamText(body);
    check(s.text === c.message.content && s.finish === 'stop' && s.n > 2, `json_schema seed ${seed}: stream == non-stream`,
          [s.text, c.message.content, s.finish]);
  }
  // vLLM's guided_json on the completions endpoint
  const r = await client.completions.create({ model: MODEL, prompt: 'JSON:', max_tokens: 400, temperature: 0.8, seed: 7,
                                              guided_json: SCHEMA });
  let v = null; try { v = JSON.parse(r.choices[0].text); } catch (e) {}
  check(r.choices[0].finish_reason === 'stop' && v !== null && validate(v), 'completions guided_json: ajv validates',
        [r.choices[0].text, validate.errors]);
  // llama.cpp's top-level json_schema, streamed on chat
  const l = await streamText({ model: MODEL, messages: msgs('JSON:'), max_tokens: 400, temperature: 0.8, seed: 11,
                               json_schema: SCHEMA });
  let lv = null; try { lv = JSON.parse(l.text); } catch (e) {}
  check(l.finish === 'stop' && lv !== null && validate(lv), 'llama.cpp json_schema (stream): ajv validates',
        [l.text, l.finish, validate.errors]);
}

async function testJsonObject() {
  let full = 0;
  for (let seed = 1; seed <= 6; seed++) {
    const body = { model: MODEL, messages: msgs('JSON please'), response_format: { type: 'json_object' }, max_tokens: 120,
                   temperature: 1.0, seed };
    const r = seed % 2 ? await client.chat.completions.create(body) : null;
    const text = r ? r.choices[0].message.content : (await streamText(body)).text;
    const finish = r ? r.choices[0].finish_reason : null;
    const p = jsonPrefix(text);
    if (p === 'full') {
      full++;
      const v = JSON.parse(text);
      check(v !== null && typeof v === 'object' && !Array.isArray(v), `json_object seed ${seed}: an object`, text);
      if (r) check(finish === 'stop', `json_object seed ${seed}: finish stop when complete`, [finish, text]);
    } else {
      // cut by max_tokens: a prefix of a JSON object
      check(p === 'prefix' && text.trimStart().startsWith('{') && (!r || finish === 'length'),
            `json_object seed ${seed}: a JSON object or, cut by max_tokens, a prefix of one`, [p, finish, text]);
    }
  }
  console.log(`json_object: ${full} of 6 complete within 120 tokens`);
}

async function testRegexChoiceGrammar() {
  const re = '[a-z]{2,4}-\\d{3}(\\.[0-9]+)?';
  for (const stream of [false, true]) {
    for (let seed = 1; seed <= 3; seed++) {
      const body = { model: MODEL, messages: msgs('code?'), max_tokens: 60, temperature: 1.0, seed, guided_regex: re };
      const text = stream ? (await streamText(body)).text : (await client.chat.completions.create(body)).choices[0].message.content;
      check(new RegExp(`^(?:${re})$`).test(text), `guided_regex ${stream ? 'stream' : ''} seed ${seed}: full match`, text);
    }
  }
  const choices = ['red', 'green', 'blue', 'dark red'];
  const seen = new Set();
  for (let seed = 1; seed <= 6; seed++) {
    const r = await client.chat.completions.create({ model: MODEL, messages: msgs('colour?'), max_tokens: 10,
                                                     temperature: 1.0, seed, guided_choice: choices });
    const c = r.choices[0];
    check(choices.includes(c.message.content) && c.finish_reason === 'stop', `guided_choice seed ${seed}`, [c.message.content, c.finish_reason]);
    seen.add(c.message.content);
  }
  const gbnf = 'root ::= answer ("," answer)*\nanswer ::= "yes" | "no" | "maybe" [0-9]\n';
  const gre = /^(yes|no|maybe[0-9])(,(yes|no|maybe[0-9]))*$/;
  for (let seed = 1; seed <= 3; seed++) {
    const r = await client.completions.create({ model: MODEL, prompt: 'answers:', max_tokens: 40, temperature: 1.0, seed,
                                                grammar: gbnf });
    const t = r.choices[0].text;
    // cut by max_tokens: then a prefix of a match (every complete answer before the cut matches)
    const ok = r.choices[0].finish_reason === 'stop' ? gre.test(t)
                                                     : gre.test(t.replace(/,?[^,]*$/, '') || 'yes');
    check(ok, `llama.cpp grammar seed ${seed}`, [t, r.choices[0].finish_reason]);
  }
}

async function testErrors() {
  const bad = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { d: { type: 'string', format: 'date' } } } } } },
     "$.properties.d: keyword 'format' is not supported"],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } },
     "keyword 'uniqueItems' is not supported"],
    [{ guided_regex: 'a(?=b)' }, 'lookaround'],
    [{ grammar: 'root ::= "a" undefined-rule\n' }, "undefined rule 'undefined-rule'"],
    [{ guided_choice: [] }, "'guided_choice' must be a non-empty array of strings"],
    [{ guided_regex: 'a', guided_choice: ['a'] }, 'guided_regex'],
  ];
  for (const [extra, want] of bad) {
    let status = 0, msg = '';
    try {
      await client.chat.completions.create({ model: MODEL, messages: msgs('x'), max_tokens: 5, ...extra });
    } catch (e) { status = e.status; msg = e.message || ''; }
    check(status === 400 && msg.includes(want), `400 naming the problem (${want})`, [status, msg]);
  }
}

(async () => {
  try {
    await testJsonSchema();
    await testJsonObject();
    await testRegexChoiceGrammar();
    await testErrors();
  } catch (e) {
    failed++;
    console.error('FAIL exception:', e && e.stack ? e.stack : e);
  }
  console.log(`structured e2e: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})();
