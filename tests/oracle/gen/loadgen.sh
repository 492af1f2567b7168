#!/usr/bin/env bash
# Load-generator statistics oracle: numpy percentiles and vLLM's metric definitions.
set -euo pipefail
cd "$(dirname "$0")/../../.."
/usr/bin/python3 tests/reference/loadgen_oracle.py --out "${TANDEM_TEST_DATA:-.cache}/loadgen_oracle.json"
