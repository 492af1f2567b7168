#!/usr/bin/env bash
# Weight sync on one host: a 0.5B BF16 model pushed into a running `tandem serve` (bf16 wire), as
# HTTP bodies and through shared memory (--shm), from the GGUF (td_export_model_get: bf16 -> f32
# -> bf16) and from an f32 copy in memory (--f32-source: what the RL loop pushes). Each mode pushes
# REPEAT times from one process (the first push is cold: page faults in the client's buffers);
# the stderr line of each push gives the split (buckets: packing and transfer, overlapped; commit:
# the engine update). Not a test: figures depend on the load (printed before each mode).
# Usage: bench/bench_wsync.sh [build-dir=build] [model=/work/benchmodels/qwen05b-bf16.gguf]
#        (env: REPEAT=4, PORT=18473)
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-/work/benchmodels/qwen05b-bf16.gguf}
REPEAT=${REPEAT:-4}
PORT=${PORT:-18473}
T="$BUILD/tandem"
[ -x "$T" ] || { echo "bench_wsync.sh: $T missing (build first)" >&2; exit 1; }
"$T" serve "$MODEL" --port "$PORT" --threads 2 --kv-cache-memory 64M --enable-weight-sync \
    --weight-sync-dtype bf16 --weight-sync-max-bucket-mb 300 --weight-sync-shm >/tmp/bench_wsync_server.log 2>&1 &
SRV=$!
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 0.5; done
for mode in "" "--shm" "--f32-source" "--shm --f32-source"; do
    echo "== ${mode:-bodies} ($(uptime | sed 's/.*load/load/'))"
    # shellcheck disable=SC2086
    "$T" weights push "http://127.0.0.1:$PORT" "$MODEL" --repeat "$REPEAT" $mode 2>&1 >/dev/null |
        sed 's/^tandem weights push: //'
done
