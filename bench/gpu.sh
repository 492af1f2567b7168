#!/usr/bin/env bash
# One prepared GPU check (issue 10): builds tandem with CUDA (Release), runs test_cuda, then
# measures on random-weight 1B- and 8B-shaped Llama models in BF16 and Q8_0:
#   decode  (tandem bench tg 128): tokens/s and its fraction of HBM bandwidth (bytes read / s)
#   prefill (tandem bench pp 512): tokens/s and its fraction of dense BF16 tensor throughput
#   serving (tandem serve --backend cuda + tandem bench serve): output tokens/s at concurrency 1/16/64
# and writes one JSON (all raw results) and one markdown table. Meant for a fresh machine with one
# NVIDIA GPU (16 cores) in under 8 minutes: the 8B files are the long pole (about 25 GB written).
#   OUT=dir (default bench/gpu-out)   MODELS=dir (default /tmp/tandem-gpu-models)
#   PEAK_GBS (default 4800, H200 HBM3e)   PEAK_BF16_TFLOPS (default 989, H200 dense BF16)
#   SKIP_8B=1 (1B only)   SKIP_SERVE=1   SKIP_SETUP=1 (Debian packages already installed)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/bench/gpu-out}
MODELS=${MODELS:-/tmp/tandem-gpu-models}
PEAK_GBS=${PEAK_GBS:-4800}
PEAK_BF16_TFLOPS=${PEAK_BF16_TFLOPS:-989}
BUILD=$ROOT/build-gpu
PY=${PY:-/usr/bin/python3}
mkdir -p "$OUT" "$MODELS"
t_start=$(date +%s)
say() { echo "[gpu.sh $(($(date +%s) - t_start))s] $*"; }
die() { echo "gpu.sh: $*" >&2; exit 1; }

command -v nvidia-smi >/dev/null || die "no nvidia-smi: this script needs an NVIDIA GPU and its driver"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
[ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null || die "no nvcc (CUDA toolkit in /usr/local/cuda)"
export PATH=/usr/local/cuda/bin:$PATH

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  say "setup (Debian packages)"
  scripts/setup.sh >"$OUT/setup.log" 2>&1 || { tail -n 30 "$OUT/setup.log"; die "scripts/setup.sh failed"; }
fi

say "build (Release, CUDA)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON >"$OUT/configure.log" 2>&1 \
  || { cat "$OUT/configure.log"; die "configure failed"; }
grep 'tandem: optional  CUDA' "$OUT/configure.log" | sed 's/^-- //'
grep -q 'the cuda backend' "$OUT/configure.log" || die "CMake did not enable the CUDA backend (see $OUT/configure.log)"
make -C "$BUILD" -j"$(nproc)" tandem test_cuda >"$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; die "build failed"; }
TANDEM=$BUILD/tandem

say "test_cuda"
set +e
"$BUILD/test_cuda" >"$OUT/test_cuda.log" 2>&1
rc=$?
set -e
tail -n 5 "$OUT/test_cuda.log"
[ $rc = 77 ] && die "test_cuda skipped: the backend found no GPU ($(head -n 1 "$OUT/test_cuda.log"))"
[ $rc = 0 ] || { grep -i fail "$OUT/test_cuda.log" | head -n 40; echo "gpu.sh: test_cuda FAILED (rc $rc); measuring anyway" >&2; }
test_rc=$rc

# Random-weight models: bench/make_bench_models.py has the 1B shape; the 8B shape (Llama 3.1 8B)
# is added to its table here, so both are written the same way.
say "random-weight models into $MODELS"
SHAPES="llama1b"
[ "${SKIP_8B:-0}" = 1 ] || SHAPES="llama1b,llama8b"
"$PY" - "$MODELS" "$SHAPES" <<'PYEOF' >"$OUT/models.log" 2>&1 || { tail -n 20 "$OUT/models.log"; die "model generation failed"; }
import sys
sys.path.insert(0, "bench")
import make_bench_models as M
M.MODELS["llama8b"] = dict(arch="llama", dim=4096, layers=32, heads=32, kv=8, ffn=14336, vocab=128256,
                           tie=False, bias=False, theta=500000.0, eps=1e-5, ctx=131072, seed=8000)
sys.argv = ["make_bench_models.py", "--models", sys.argv[2], "--types", "bf16,q8_0", "--out", sys.argv[1]]
M.main()
PYEOF
ls -la "$MODELS" | tail -n +2

export TANDEM_BACKEND=cuda
results=$OUT/results.jsonl
: >"$results"
for shape in ${SHAPES//,/ }; do
  for ty in bf16 q8_0; do
    m=$MODELS/$shape-$ty.gguf
    [ -f "$m" ] || die "missing $m"
    say "$shape $ty: tg128, pp512"
    "$TANDEM" bench tg 128 "$m" --backend cuda -r 3 --no-ceil --json >"$OUT/tg-$shape-$ty.json" 2>"$OUT/tg-$shape-$ty.log" \
      || { tail "$OUT/tg-$shape-$ty.log"; die "bench tg failed on $m"; }
    "$TANDEM" bench pp 512 "$m" --backend cuda -r 3 --no-ceil --json >"$OUT/pp-$shape-$ty.json" 2>"$OUT/pp-$shape-$ty.log" \
      || { tail "$OUT/pp-$shape-$ty.log"; die "bench pp failed on $m"; }
    "$PY" -c 'import json,sys; [print(json.dumps(dict(json.load(open(f)), shape=sys.argv[1], kind=k))) for k, f in (("tg", sys.argv[2]), ("pp", sys.argv[3]))]' \
      "$shape-$ty" "$OUT/tg-$shape-$ty.json" "$OUT/pp-$shape-$ty.json" >>"$results"
    if [ "${SKIP_SERVE:-0}" != 1 ]; then
      port=$((18000 + RANDOM % 1000))
      "$TANDEM" serve "$m" --backend cuda --port "$port" --max-seqs 64 --max-model-len 2048 --kv-cache-dtype bf16 \
        >"$OUT/serve-$shape-$ty.log" 2>&1 &
      spid=$!
      for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break
        kill -0 $spid 2>/dev/null || { tail "$OUT/serve-$shape-$ty.log"; die "tandem serve exited on $m"; }
        sleep 1
      done
      for c in 1 16 64; do
        say "$shape $ty: serving at concurrency $c"
        n=$((c * 4 > 16 ? c * 4 : 16))
        "$TANDEM" bench serve --port "$port" --num-prompts $n --max-concurrency $c --random-input-len 512 \
          --random-output-len 128 --ignore-eos --num-warmups 2 --json >"$OUT/serve-$shape-$ty-c$c.txt" 2>&1 \
          || { kill $spid; tail "$OUT/serve-$shape-$ty-c$c.txt"; die "bench serve failed"; }
        "$PY" - "$OUT/serve-$shape-$ty-c$c.txt" "$shape-$ty" "$c" >>"$results" <<'PYEOF'
import json, sys
text = open(sys.argv[1]).read()
start = text.rfind("\n{") + 1 if not text.startswith("{") else 0  # --json prints the object last
obj = json.loads(text[start:])
print(json.dumps(dict(obj, shape=sys.argv[2], kind="serve", concurrency=int(sys.argv[3]))))
PYEOF
      done
      kill $spid && wait $spid 2>/dev/null || true
    fi
  done
done

say "report"
"$PY" - "$results" "$OUT" "$PEAK_GBS" "$PEAK_BF16_TFLOPS" "$test_rc" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, peak_gbs, peak_tf, test_rc = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
gpu = open(out + "/gpu.txt").read().strip()
md = ["# tandem on %s (cuda backend)" % gpu, "",
      "test_cuda: %s. Ceilings: HBM %.0f GB/s (decode), dense BF16 %.0f TFLOP/s (prefill)." %
      ("passed" if test_rc == 0 else "FAILED (rc %d)" % test_rc, peak_gbs, peak_tf), "",
      "| model | test | tokens/s | achieved | fraction of ceiling |", "|---|---|---:|---:|---:|"]
for r in rows:
    if r["kind"] == "tg":
        r["frac_hbm"] = r["gbs"] / peak_gbs
        md.append("| %s | tg128 | %.1f | %.0f GB/s | %.1f %% of HBM |" % (r["shape"], r["avg_ts"], r["gbs"], 100 * r["frac_hbm"]))
    elif r["kind"] == "pp":
        r["frac_bf16"] = r["gflops"] / (peak_tf * 1e3)
        md.append("| %s | pp512 | %.1f | %.1f TFLOP/s | %.1f %% of BF16 |" % (r["shape"], r["avg_ts"], r["gflops"] / 1e3, 100 * r["frac_bf16"]))
    else:
        md.append("| %s | serve c=%d | %.1f out | %.1f req/s, TTFT p50 %.0f ms | |" % (
            r["shape"], r["concurrency"], r.get("output_throughput", 0), r.get("request_throughput", 0),
            r.get("median_ttft_ms", 0)))
json.dump({"gpu": gpu, "peak_gbs": peak_gbs, "peak_bf16_tflops": peak_tf, "test_cuda_rc": test_rc, "results": rows},
          open(out + "/gpu.json", "w"), indent=1)
open(out + "/gpu.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PYEOF
say "done: $OUT/gpu.json, $OUT/gpu.md"
[ "$test_rc" = 0 ] || exit 1
