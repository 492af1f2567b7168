#!/usr/bin/env bash
# Model-format samples for test_gguf, test_safetensors, test_model_load: GGUF/safetensors files,
# tiny HF model dirs and GGUF models (valid and broken) under $TANDEM_TEST_DATA/formats (or
# .cache/formats), written by the independent Python writers.
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/make_format_samples.py
