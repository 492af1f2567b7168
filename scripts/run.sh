#!/usr/bin/env bash
# The main job: build tandem and generate text with a small model.
# Until the embedded default model lands, that model is the random-weight Llama reference model
# made by tests/reference/make_models.py (PyTorch): the text is gibberish, the machinery is real.
#   scripts/run.sh [extra `tandem run` flags, e.g. --prompt "Hello" -n 64 --temperature 0.8]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
make -C build -j2 tandem 2>&1 | grep -E 'warning|error' >&2 || true
model=.cache/ref/llama2
if [ ! -d "$model" ]; then
  echo "run: generating the reference models (tests/reference/make_models.py)" >&2
  /usr/bin/python3 tests/reference/make_models.py --out .cache/ref >&2
fi
if [ $# -eq 0 ]; then set -- --prompt "Once upon a time" -n 32; fi
exec build/tandem run "$model" "$@"
