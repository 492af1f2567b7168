#!/usr/bin/env bash
# llama.cpp's llama-bench and `tandem bench` side by side on the very same GGUF files, same threads,
# interleaved (A B A B ...) so that a noisy, shared machine disturbs both sides alike. Writes a
# markdown table (bench/compare_table.py) and keeps every raw JSON record. Builds nothing.
#
# usage: bench/compare_llama.sh LLAMA_BUILD_DIR [model.gguf ...]
#   LLAMA_BUILD_DIR  a llama.cpp CMake build directory (bin/llama-bench inside it)
#   models           default: every /work/benchmodels/*.gguf ($TANDEM_BENCH_MODELS)
# environment (defaults): TANDEM_BIN=build/tandem THREADS=2 PP=512 TG=128 REPS=3 ROUNDS=2
#   LLAMA_EXTRA=""   extra llama-bench flags, e.g. "--poll 0" (threads sleep instead of spinning)
#   OUT_DIR=${TMPDIR:-/tmp}/tandem-compare-<date>   (raw.jsonl, table.md, log.txt)
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
LLAMA_DIR=$1
shift
LLAMA_BENCH=$LLAMA_DIR/bin/llama-bench
[ -x "$LLAMA_BENCH" ] || { echo "compare_llama: no $LLAMA_BENCH" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TANDEM_BIN=${TANDEM_BIN:-$ROOT/build/tandem}
[ -x "$TANDEM_BIN" ] || { echo "compare_llama: no $TANDEM_BIN (build tandem first)" >&2; exit 2; }
TD_SRC=$(cd "$(dirname "$TANDEM_BIN")/.." && pwd)  # the checkout the binary was built from
THREADS=${THREADS:-2}
PP=${PP:-512}
TG=${TG:-128}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-2}
MODELS_DIR=${TANDEM_BENCH_MODELS:-/work/benchmodels}
if [ $# -gt 0 ]; then
    MODELS=("$@")
else
    MODELS=("$MODELS_DIR"/*.gguf)
fi
OUT_DIR=${OUT_DIR:-${TMPDIR:-/tmp}/tandem-compare-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT_DIR"
RAW=$OUT_DIR/raw.jsonl
LOG=$OUT_DIR/log.txt
: > "$RAW"
: > "$LOG"

LLAMA_CMD="$LLAMA_BENCH -t $THREADS -p $PP -n $TG -r $REPS -o json${LLAMA_EXTRA:+ $LLAMA_EXTRA}"
TD_PP_CMD="$TANDEM_BIN bench pp $PP MODEL -t $THREADS -r $REPS --json"
TD_TG_CMD="$TANDEM_BIN bench tg $TG MODEL -t $THREADS -r $REPS --json"

# record KIND MODEL ROUND JSON: one line of raw.jsonl
record() {
    /usr/bin/python3 -c 'import json,sys; print(json.dumps({"side": sys.argv[1], "model": sys.argv[2], "round": int(sys.argv[3]), "data": json.loads(sys.argv[4])}))' \
        "$1" "$2" "$3" "$4" >> "$RAW"
}

ceilings() {
    local j
    j=$("$TANDEM_BIN" bench ceilings -t "$THREADS" --json)
    record ceilings - "$1" "$j"
    echo "$j"
}

echo "compare_llama: $(date -u '+%Y-%m-%d %H:%M UTC'), output in $OUT_DIR" | tee -a "$LOG"
C=$(ceilings 0)
GBS=$(echo "$C" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["ceilings"]["read_gbs"])')
GFL=$(echo "$C" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["ceilings"]["fma_gflops"])')
I8=$(echo "$C" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["ceilings"].get("int8_giops", 0))')
BF=$(echo "$C" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["ceilings"].get("bf16_gflops", 0))')
echo "ceilings (tandem bench ceilings -t $THREADS): $GBS GB/s read, $GFL GFLOP/s FP32 FMA, $I8 GOP/s int8, $BF GFLOP/s BF16" | tee -a "$LOG"
CEIL_FLAGS="--ceil-gbs $GBS --ceil-gflops $GFL"
[ "$I8" != 0 ] && CEIL_FLAGS="$CEIL_FLAGS --ceil-int8-giops $I8"
[ "$BF" != 0 ] && CEIL_FLAGS="$CEIL_FLAGS --ceil-bf16-gflops $BF"

for model in "${MODELS[@]}"; do
    for round in $(seq 1 "$ROUNDS"); do
        echo "[$(date -u +%H:%M:%S)] $(basename "$model") round $round: llama-bench" | tee -a "$LOG"
        if ! j=$($LLAMA_CMD -m "$model" 2>>"$LOG"); then
            echo "compare_llama: llama-bench failed on $model (see $LOG)" | tee -a "$LOG" >&2
            continue 2
        fi
        record llama.cpp "$model" "$round" "$j"
        echo "[$(date -u +%H:%M:%S)] $(basename "$model") round $round: tandem" | tee -a "$LOG"
        for test in pp tg; do
            n=$PP
            [ "$test" = tg ] && n=$TG
            # shellcheck disable=SC2086  # CEIL_FLAGS is a list of flags
            if ! j=$("$TANDEM_BIN" bench "$test" "$n" "$model" -t "$THREADS" -r "$REPS" --json $CEIL_FLAGS 2>>"$LOG"); then
                echo "compare_llama: tandem bench $test failed on $model (see $LOG)" | tee -a "$LOG" >&2
                continue 3
            fi
            record tandem "$model" "$round" "$j"
        done
    done
done
ceilings 1 > /dev/null

{
    echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'). Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores" \
        "(shared with other jobs: numbers are noisy)."
    echo "llama.cpp: $(git -C "$LLAMA_DIR/.." log -1 --format='%h (%cd)' --date=short 2>/dev/null || echo '?')," \
        "tandem: $(git -C "$TD_SRC" log -1 --format='%h' 2>/dev/null || echo '?')$(git -C "$TD_SRC" diff --quiet 2>/dev/null || echo '+dirty') ($TANDEM_BIN)."
    echo
    /usr/bin/python3 "$ROOT/bench/compare_table.py" "$RAW"
    echo
    echo "Commands (each model, $ROUNDS rounds, interleaved llama.cpp then tandem):"
    echo
    echo "    $LLAMA_CMD -m MODEL"
    echo "    $TD_PP_CMD $CEIL_FLAGS"
    echo "    $TD_TG_CMD $CEIL_FLAGS"
    echo "    $TANDEM_BIN bench ceilings -t $THREADS --json   # before and after"
} > "$OUT_DIR/table.md"
cat "$OUT_DIR/table.md"
