#!/usr/bin/env bash
# Reference models and their PyTorch oracle (test_oracle, test_cli_run): small random-weight
# llama2/llama3/mistral/qwen2/qwen3 models as HF dirs and GGUF files, per-position log-probabilities
# and greedy continuations, under $TANDEM_TEST_DATA/ref (or .cache/ref). A no-op when up to date.
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/make_models.py
