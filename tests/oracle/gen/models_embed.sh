#!/usr/bin/env bash
# Embeddings oracle (test_server_embed): pooled final hidden states of the reference models computed
# in PyTorch. Needs the models: make_models.py first (a no-op when they are up to date).
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/make_models.py
/usr/bin/python3 tests/reference/embed_oracle.py
