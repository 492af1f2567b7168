#!/usr/bin/env bash
# Sanity check before quoting llama.cpp's speed: llama.cpp (llama-simple, greedy) and `tandem run`
# (temperature 0) continue the same prompt on the same GGUF; prints both continuations and how many
# leading tokens agree. Random-weight models have small top-1 margins (logits are nearly flat), so
# a late divergence on a quantized type can be rounding; a wrong model diverges at once.
#
# usage: bench/llama_agree.sh LLAMA_BUILD_DIR model.gguf [...]
# environment (defaults): TANDEM_BIN=build/tandem N=16 PROMPT="hello world" THREADS=2
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
LLAMA_DIR=$1
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TANDEM_BIN=${TANDEM_BIN:-$ROOT/build/tandem}
N=${N:-16}
PROMPT=${PROMPT:-hello world}
THREADS=${THREADS:-2}
status=0
for model in "$@"; do
    # llama-simple prints the prompt's pieces (BOS included) and then the generated pieces.
    l=$("$LLAMA_DIR/bin/llama-simple" -m "$model" -n "$N" "$PROMPT" 2>/dev/null)
    t=$("$TANDEM_BIN" run "$model" --prompt "$PROMPT" -n "$N" --temperature 0 --threads "$THREADS" --json 2>/dev/null)
    /usr/bin/python3 - "$model" "$PROMPT" "$l" "$t" <<'EOF' || status=1
import json, os, re, sys
model, prompt, l, t = sys.argv[1:5]
gen_l = l.split(prompt, 1)[1] if prompt in l else l
gen_t = json.loads(t)["text"]
tok = re.compile(r"\[pad\d+\]|<\|eos\|>|.", re.S)
a, b = tok.findall(gen_l), tok.findall(gen_t)
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
print(f"{os.path.basename(model)}: {n}/{max(len(a), len(b))} leading tokens agree")
print(f"  llama.cpp: {''.join(a)}")
print(f"  tandem:    {''.join(b)}")
sys.exit(0 if n > 0 else 1)
EOF
done
exit $status
