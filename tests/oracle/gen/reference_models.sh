#!/usr/bin/env bash
# PyTorch oracle: random-weight reference models of every architecture (HF dirs and GGUF in F32,
# F16, BF16, Q8_0, Q4_0) and their log-probabilities, under $TANDEM_TEST_DATA/ref.
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/make_models.py --out "${TANDEM_TEST_DATA:-.cache}/ref"
