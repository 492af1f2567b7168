// Encodes texts with Hugging Face tokenizers (Rust, via @anush008/tokenizers) for test_bpe_train:
// node tests/oracle/bpe_encode_oracle.js TOKENIZER_JSON IN.json OUT.json
// IN.json: array of hex-encoded UTF-8 strings. OUT.json: array of {ids, ids_special, decoded_hex}
// (ids without special tokens, ids with the post-processor, decode of ids as hex).
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));

async function main() {
  const [tokPath, inPath, outPath] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const texts = JSON.parse(fs.readFileSync(inPath, 'utf8')).map((h) => Buffer.from(h, 'hex').toString('utf8'));
  const out = [];
  for (const text of texts) {
    const e = await tok.encode(text, null, { addSpecialTokens: false });
    const es = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = Array.from(e.getIds());
    const dec = await tok.decode(ids, false);
    out.push({ ids, ids_special: Array.from(es.getIds()), decoded_hex: Buffer.from(dec, 'utf8').toString('hex') });
  }
  fs.writeFileSync(outPath, JSON.stringify(out));
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
