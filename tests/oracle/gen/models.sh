#!/usr/bin/env bash
# Reference models and their PyTorch oracle (test_oracle, test_cli_run): small random-weight
# llama2/llama3/mistral/qwen2/qwen3 models as HF dirs and GGUF files, per-position log-probabilities
# and greedy continuations, under $TANDEM_TEST_DATA/ref (or .cache/ref); for Q8_0/Q4_0/BF16 files
# also the same with activations rounded as the avx512-int8 kernels round them (models[].act).
# A no-op when up to date (~40 s on 2 cores otherwise).
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/make_models.py
