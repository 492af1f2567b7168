#!/usr/bin/env bash
# Trainer oracle (test_train_oracle): small random models as HF dirs, float64 PyTorch logits, loss,
# gradients and AdamW steps under $TANDEM_TEST_DATA/train_oracle (or .cache/train_oracle). ~3 s.
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/train_ref.py
