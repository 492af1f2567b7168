#!/usr/bin/env bash
# Side by side: `tandem serve` vs llama.cpp's `llama-server` on the same GGUF files, both driven by
# the same client (`tandem bench serve`: random token-id prompts of fixed length, fixed output
# length with ignore_eos, streaming /v1/completions), interleaved at each concurrency (tandem, then
# llama-server). Writes a markdown table. It does not build llama.cpp.
#
# Usage: bench/compare_serve.sh LLAMA_BUILD_DIR MODEL.gguf...
#   LLAMA_BUILD_DIR: a llama.cpp build directory holding bin/llama-server
# Env: TANDEM (default build/tandem), CONCURRENCIES ("1 4 16 64"), INPUT_LEN (128), OUTPUT_LEN (32),
#      THREADS (2: both servers), LLAMA_THREADS (llama-server -t, default THREADS), KV (tandem --kv-cache-memory, 1G), RUN_TIMEOUT (seconds per
#      benchmark run, 1800), PORT (18500; llama-server gets PORT+1), OUT (markdown file; default
#      stdout only), RESULT_DIR (keeps the result JSON files and server logs; default a temp dir).
# Requests per run: max(8, 2 * concurrency), seed = concurrency: no run repeats another's prompts
# (both servers cache prompt prefixes; a repeated prompt would skip its prefill). Before the runs each server answers one non-streaming
# request whose usage must say INPUT_LEN prompt and OUTPUT_LEN completion tokens (sanity check);
# every run's total output tokens must equal requests * OUTPUT_LEN (the "tokens ok" column).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 6,17p "$0" >&2; exit 2; }
LLAMA_DIR=$1
shift
LLAMA_SERVER=$LLAMA_DIR/bin/llama-server
[ -x "$LLAMA_SERVER" ] || { echo "no $LLAMA_SERVER" >&2; exit 2; }
TANDEM=${TANDEM:-build/tandem}
CONCURRENCIES=${CONCURRENCIES:-"1 4 16 64"}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-32}
THREADS=${THREADS:-2}
LLAMA_THREADS=${LLAMA_THREADS:-$THREADS}
KV=${KV:-1G}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
PORT=${PORT:-18500}
LPORT=$((PORT + 1))
RESULT_DIR=${RESULT_DIR:-$(mktemp -d)}
mkdir -p "$RESULT_DIR"
MAXC=1
for c in $CONCURRENCIES; do [ "$c" -gt "$MAXC" ] && MAXC=$c; done
SEQ_LEN=$((INPUT_LEN + OUTPUT_LEN + 16))
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_up() {  # wait_up PORT PID
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

sanity() {  # sanity PORT NAME: one request, usage must match the asked lengths
    local ids
    ids=$(python3 -c "print(','.join(str(1000 + (i * 37) % 1000) for i in range($INPUT_LEN)))")
    curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": [$ids], \"max_tokens\": $OUTPUT_LEN, \"ignore_eos\": true, \"temperature\": 0}" \
        >"$RESULT_DIR/sanity-$2.json"
    python3 - "$RESULT_DIR/sanity-$2.json" "$2" "$INPUT_LEN" "$OUTPUT_LEN" <<'EOF'
import json, sys
u = json.load(open(sys.argv[1]))["usage"]
ok = u["prompt_tokens"] == int(sys.argv[3]) and u["completion_tokens"] == int(sys.argv[4])
print(f"sanity {sys.argv[2]}: usage {u} {'ok' if ok else 'MISMATCH'}", file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}

row() {  # row SERVER MODEL C N JSON|-: one table row
    python3 - "$@" "$OUTPUT_LEN" <<'EOF'
import json, sys
server, model, c, n, path, out_len = sys.argv[1:7]
if path == "-":
    print(f"| {model} | {c} | {server} | {n} | timed out / failed | | | | | | |")
    sys.exit(0)
r = json.load(open(path))
ok = r["completed"] == int(n) and r["total_output_tokens"] == int(n) * int(out_len)
print(f"| {model} | {c} | {server} | {r['completed']}/{n} | {r['output_throughput']:.2f} | "
      f"{r['mean_ttft_ms']:.0f} | {r['median_ttft_ms']:.0f} | {r['mean_tpot_ms']:.1f} | {r['median_tpot_ms']:.1f} | "
      f"{r['duration']:.1f} | {'yes' if ok else 'NO'} |")
EOF
}

bench() {  # bench PORT SERVER MODEL C: one run; prints its row
    local port=$1 server=$2 model=$3 c=$4
    local n=$((2 * c > 8 ? 2 * c : 8))
    local tag="$model-$server-c$c"
    echo "$(date -u +%T) $server $model concurrency $c: $n requests" >&2
    if timeout "$RUN_TIMEOUT" "$TANDEM" bench serve --port "$port" --num-prompts "$n" --max-concurrency "$c" \
        --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" --ignore-eos --seed "$c" \
        --save-result --result-dir "$RESULT_DIR" --result-filename "$tag.json" >"$RESULT_DIR/$tag.txt" 2>&1; then
        row "$server" "$model" "$c" "$n" "$RESULT_DIR/$tag.json"
    else
        row "$server" "$model" "$c" "$n" -
    fi
}

{
    echo "Threads: tandem --threads $THREADS, llama-server -t $LLAMA_THREADS; prompts $INPUT_LEN random token ids, $OUTPUT_LEN output tokens (ignore_eos);"
    echo "requests per run max(8, 2 x concurrency); client \`tandem bench serve\` (streaming /v1/completions)."
    echo "tandem: \`serve --threads $THREADS --max-seqs $MAXC --max-model-len $SEQ_LEN --kv-cache-memory $KV\`;"
    echo "llama-server: \`-t $LLAMA_THREADS --parallel $MAXC -c $((MAXC * SEQ_LEN)) -cb --no-webui\` ($(cd "$LLAMA_DIR/.." && git log -1 --format=%h 2>/dev/null || echo '?'))."
    echo
    echo "| model | conc. | server | done | output tok/s | mean TTFT (ms) | median TTFT (ms) | mean TPOT (ms) | median TPOT (ms) | duration (s) | tokens ok |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
} | tee "${OUT:-/dev/null}"

for model in "$@"; do
    name=$(basename "$model" .gguf)
    "$TANDEM" serve "$model" --port "$PORT" --threads "$THREADS" --max-seqs "$MAXC" --max-model-len "$SEQ_LEN" \
        --kv-cache-memory "$KV" >"$RESULT_DIR/serve-tandem-$name.log" 2>&1 &
    tpid=$!
    PIDS+=("$tpid")
    "$LLAMA_SERVER" -m "$model" --port "$LPORT" -t "$LLAMA_THREADS" --parallel "$MAXC" -c $((MAXC * SEQ_LEN)) -cb \
        --no-webui >"$RESULT_DIR/serve-llama-$name.log" 2>&1 &
    lpid=$!
    PIDS+=("$lpid")
    wait_up "$PORT" "$tpid" || { echo "tandem serve did not start" >&2; exit 1; }
    wait_up "$LPORT" "$lpid" || { echo "llama-server did not start" >&2; exit 1; }
    sanity "$PORT" "tandem-$name"
    sanity "$LPORT" "llama-$name"
    for c in $CONCURRENCIES; do
        bench "$PORT" tandem "$name" "$c" | tee -a "${OUT:-/dev/null}"
        bench "$LPORT" llama-server "$name" "$c" | tee -a "${OUT:-/dev/null}"
    done
    kill "$tpid" "$lpid"
    wait "$tpid" "$lpid" 2>/dev/null || true
    PIDS=()
done
