#!/usr/bin/env bash
# Issue 16: decode TPOT of structured output. One `tandem serve` on a random-weight Qwen2.5-0.5B
# shape carrying the real Qwen3 vocabulary (bench/make_bench_models.py --tokenizer qwen3), driven by
# `tandem bench serve` (vLLM's TPOT: (E2EL - TTFT) / (output tokens - 1)), in interleaved rounds:
#   single stream: unconstrained | json_schema (guided_json) | regex (guided_regex)
#   batched:       8 unconstrained | 1 json_schema + 7 unconstrained (two clients at once)
# The grammars never complete within the output length (minItems / an unbounded repetition), so
# every constrained request decodes exactly OUT tokens under its mask. One warm-up request per
# grammar first (it builds the position tables; its TPOT is printed as "cold").
# Not a test: prints a table (medians over rounds, min-max spread) and the ratios.
# Usage: bench/structured_tpot.sh [MODEL.gguf]   env: TANDEM_BIN, THREADS (2), ROUNDS (3), OUT (64),
#        N1 (requests per single-stream run, 3), N8 (requests per client slot in batched runs, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${TANDEM_BIN:-build/tandem}
MODEL=${1:-${TANDEM_BENCH_MODELS:-/work/benchmodels}/qwen05b-qwen3tok-q8_0.gguf}
THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-3} OUT=${OUT:-64} N1=${N1:-3} N8=${N8:-2}
[ -f "$MODEL" ] || { echo "no $MODEL: /usr/bin/python3 bench/make_bench_models.py --models qwen05b --types q8_0 --tokenizer qwen3" >&2; exit 1; }
TMP=$(mktemp -d /tmp/structured_tpot.XXXXXX)
"$BIN" serve "$MODEL" --port 0 --threads "$THREADS" --max-seqs 8 --served-model-name m >"$TMP/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 300); do grep -q "listening on http://" "$TMP/serve.log" && break; sleep 0.2; done
PORT=$(grep -o "listening on http://[^ ]*" "$TMP/serve.log" | head -1 | sed 's/.*://')
[ -n "$PORT" ] || { cat "$TMP/serve.log" >&2; exit 1; }

SCHEMA='{"type":"array","minItems":40,"items":{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string","maxLength":16},"score":{"type":"number"},"tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":3},"ok":{"type":"boolean"}},"required":["id","name","score","tags","ok"],"additionalProperties":false}}'
REGEX='([A-Z][a-z]+ [0-9]{1,3}(\\.[0-9]+)?, )+'
JSON_BODY="{\"guided_json\": $SCHEMA}"
RE_BODY="{\"guided_regex\": \"$REGEX\"}"

# run NAME N CONCURRENCY [EXTRA_BODY]: one bench serve run, its result JSON in $TMP/NAME.json
run() {
  local extra=()
  [ -n "${4:-}" ] && extra=(--extra-body "$4")
  "$BIN" bench serve --base-url "http://127.0.0.1:$PORT" --model m --dataset-name random --random-input-len 16 \
    --random-output-len "$OUT" --ignore-eos --num-prompts "$2" --max-concurrency "$3" "${extra[@]}" \
    --save-result --result-filename "$TMP/$1.json" >"$TMP/$1.log" 2>&1 || { cat "$TMP/$1.log" >&2; exit 1; }
}
tpot() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['failed']==0, r['errors']; print(r['mean_tpot_ms'])" "$TMP/$1.json"; }

run cold_json 1 1 "$JSON_BODY"; COLD_JSON=$(tpot cold_json)
run cold_re 1 1 "$RE_BODY"; COLD_RE=$(tpot cold_re)
: >"$TMP/rows"
for r in $(seq "$ROUNDS"); do
  run u1 "$N1" 1; run j1 "$N1" 1 "$JSON_BODY"; run r1 "$N1" 1 "$RE_BODY"
  run u8 $((8 * N8)) 8
  run mixu $((7 * N8)) 7 & P1=$!
  run mixj "$N8" 1 "$JSON_BODY" & P2=$!
  wait $P1 $P2
  echo "$r $(tpot u1) $(tpot j1) $(tpot r1) $(tpot u8) $(tpot mixu) $(tpot mixj)" >>"$TMP/rows"
done
python3 - "$TMP/rows" "$COLD_JSON" "$COLD_RE" "$MODEL" "$THREADS" "$OUT" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split()[1:])) for l in open(sys.argv[1]) if l.strip()]
cols = ["1 stream unconstrained", "1 stream json_schema", "1 stream regex", "8 unconstrained",
        "1 json + 7 unconstrained: the 7", "1 json + 7 unconstrained: the json one"]
med = [statistics.median(r[i] for r in rows) for i in range(len(cols))]
print(f"model {sys.argv[4]}, --threads {sys.argv[5]}, {sys.argv[6]} output tokens, {len(rows)} rounds")
print(f"{'TPOT (ms), median [min-max]':44s}")
for i, c in enumerate(cols):
    v = [r[i] for r in rows]
    print(f"  {c:40s} {med[i]:8.2f}  [{min(v):.2f}-{max(v):.2f}]")
print(f"  {'cold json_schema (first request)':40s} {float(sys.argv[2]):8.2f}")
print(f"  {'cold regex (first request)':40s} {float(sys.argv[3]):8.2f}")
print("ratios (median TPOT / unconstrained):")
print(f"  json_schema 1 stream   {med[1] / med[0]:.3f}")
print(f"  regex 1 stream         {med[2] / med[0]:.3f}")
print(f"  batched: the 7 unconstrained beside 1 json  {med[4] / med[3]:.3f}")
print(f"  batched: the json one beside 7              {med[5] / med[3]:.3f}")
EOF
