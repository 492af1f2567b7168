#!/usr/bin/env bash
# Prefix-cache benchmark: TTFT of requests that share a long prompt prefix, `tandem serve` with the
# prefix cache on and with --no-prefix-caching, driven by `tandem bench serve --random-prefix-len`.
# Not a throughput benchmark: requests go one at a time (concurrency 1) so TTFT is the prefill.
#
# Usage: bench/prefix_cache.sh [MODEL]   (default /work/benchmodels/llama110m-q8_0.gguf)
# Env: TANDEM (binary, default build/tandem), PREFIX_LEN (1024), SUFFIX_LEN (32), OUTPUT_LEN (4),
#      NUM_PROMPTS (6), WARMUPS (1), THREADS (2), PORT (18400), KV (512M), OUT (markdown file,
#      default: stdout only), BENCH_ARGS (more `bench serve` options, e.g. "--random-vocab-offset 10
#      --random-vocab-size 300" for a small reference model).
# Both runs send the same prompts (same seed). One untimed warmup request goes first in both, so
# with the cache on the shared prefix is already cached when timing starts (vLLM's steady state);
# with it off every request prefills prefix + suffix. Hit rate from /metrics:
# vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (tokens, warmup included).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-/work/benchmodels/llama110m-q8_0.gguf}
TANDEM=${TANDEM:-build/tandem}
PREFIX_LEN=${PREFIX_LEN:-1024}
SUFFIX_LEN=${SUFFIX_LEN:-32}
OUTPUT_LEN=${OUTPUT_LEN:-4}
NUM_PROMPTS=${NUM_PROMPTS:-6}
WARMUPS=${WARMUPS:-1}
THREADS=${THREADS:-2}
PORT=${PORT:-18400}
KV=${KV:-512M}
TMP=$(mktemp -d)
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

metric() {  # metric NAME: value of a counter in $TMP/metrics
    awk -v n="$1" 'index($0, n "{") == 1 { v = $NF } END { print v + 0 }' "$TMP/metrics"
}

run_mode() {  # run_mode TAG LABEL [serve flags...]
    local tag=$1 label=$2
    shift 2
    "$TANDEM" serve "$MODEL" --port "$PORT" --threads "$THREADS" --kv-cache-memory "$KV" \
        --max-model-len $((PREFIX_LEN + SUFFIX_LEN + OUTPUT_LEN + 16)) "$@" >"$TMP/serve-$tag.log" 2>&1 &
    SRV=$!
    for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.2; done
    "$TANDEM" bench serve --port "$PORT" --num-prompts "$NUM_PROMPTS" --num-warmups "$WARMUPS" \
        --random-prefix-len "$PREFIX_LEN" --random-input-len "$SUFFIX_LEN" --random-output-len "$OUTPUT_LEN" \
        --ignore-eos --max-concurrency 1 --seed 1 --save-result --result-dir "$TMP" \
        --result-filename "$tag.json" ${BENCH_ARGS:-} >"$TMP/bench-$tag.txt" 2>&1 || {
        cat "$TMP/bench-$tag.txt" >&2
        exit 1
    }
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$TMP/metrics"
    kill "$SRV"
    wait "$SRV" 2>/dev/null || true
    SRV=
    local hits queries
    hits=$(metric 'vllm:prefix_cache_hits_total')
    queries=$(metric 'vllm:prefix_cache_queries_total')
    python3 - "$TMP/$tag.json" "$label" "$hits" "$queries" <<'EOF' >>"$TMP/rows"
import json, sys
r = json.load(open(sys.argv[1]))
hits, queries = float(sys.argv[3]), float(sys.argv[4])
rate = f"{100 * hits / queries:.1f}%" if queries else "n/a"
print(f"| {sys.argv[2]} | {r['completed']} | {r['mean_ttft_ms']:.1f} | {r['median_ttft_ms']:.1f} | "
      f"{r['mean_e2el_ms']:.1f} | {int(hits)} / {int(queries)} ({rate}) |")
EOF
}

run_mode on "prefix cache on"
run_mode off "--no-prefix-caching" --no-prefix-caching
{
    echo "Model \`$(basename "$MODEL")\`, prompts = ${PREFIX_LEN}-token shared prefix + ${SUFFIX_LEN} unique tokens," \
        "${OUTPUT_LEN} output tokens (ignore_eos), ${NUM_PROMPTS} timed requests after ${WARMUPS} warmup, concurrency 1," \
        "--threads ${THREADS}."
    echo
    echo "| server | requests | mean TTFT (ms) | median TTFT (ms) | mean E2EL (ms) | prefix-cache hits / queries (tokens) |"
    echo "|---|---|---|---|---|---|"
    cat "$TMP/rows"
} | tee "${OUT:-/dev/null}"
