#!/usr/bin/env bash
# Tokenizer oracles: HF tokenizers ids/decodes (.cache/tokenizer_oracle.json, .cache/brown.txt) and
# vocab-only GGUF files built from the same tokenizer.json files (.cache/tok_*.gguf).
set -euo pipefail
cd "$(dirname "$0")/../../.."
node tests/oracle/tokenize_oracle.js
/usr/bin/python3 tests/reference/make_tokenizer_gguf.py
