#!/usr/bin/env bash
# GRPO oracle (test_rl_grpo): a small random policy and reference as HF dirs, float64 PyTorch
# GRPO losses, gradients and two AdamW epochs under $TANDEM_TEST_DATA/grpo_oracle (or
# .cache/grpo_oracle). ~2 s.
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/grpo_ref.py
