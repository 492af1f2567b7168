#!/usr/bin/env bash
# Sampler oracle: filtered next-token distributions computed in torch (HF logits-warper semantics).
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/sampler_oracle.py --out "${TANDEM_TEST_DATA:-.cache}/sampler_oracle.json"
