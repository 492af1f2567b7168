// Validates JSON texts against JSON schemas with ajv (an independent validator): reads a JSON file
// [{"schema": {...}, "outputs": ["text", ...]}, ...] and prints one line per output ("ok" or the
// reason), exiting 1 if any output fails to parse or validate. Used by tests/unit/test_grammar.c.
const fs = require('fs');
const Ajv2020 = require('ajv/dist/2020').default;
const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
let bad = 0;
for (const [ci, c] of cases.entries()) {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  const validate = ajv.compile(c.schema);
  for (const out of c.outputs) {
    let v;
    try { v = JSON.parse(out); } catch (e) { console.log(`case ${ci}: does not parse: ${JSON.stringify(out)}`); bad++; continue; }
    if (!validate(v)) { console.log(`case ${ci}: invalid ${JSON.stringify(out)}: ${ajv.errorsText(validate.errors)}`); bad++; continue; }
  }
  console.log(`case ${ci}: ${c.outputs.length} outputs checked`);
}
process.exit(bad ? 1 : 0);
