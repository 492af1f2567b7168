#!/usr/bin/env bash
# Inputs of test_bpe_train: plain Brown text (.cache/brown.txt or $TANDEM_TEST_DATA/brown.txt).
# The test itself runs its oracles (tests/reference/bpe_train_ref.py, tests/oracle/bpe_encode_oracle.js).
set -euo pipefail
cd "$(dirname "$0")/../../.."
[ -s "${TANDEM_TEST_DATA:-.cache}/brown.txt" ] || node bench/brown_text.js >/dev/null
