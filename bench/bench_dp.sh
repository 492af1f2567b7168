#!/usr/bin/env bash
# Data-parallel training on one machine, side by side in one run: the 30M shape (dim 384, 8 layers,
# 6 heads, ffn 1024, vocab 32000, tied; batch 8 x 256 global) as 1 rank x 2 threads against
# 2 ranks x 1 thread (mpirun), for ZeRO 0, 1 and 2; and 2 ranks with one 10 GB bucket (the whole
# gradient reduced after backward: nothing overlaps) against the default 25 MiB buckets, which gives
# the share of the communication the buckets hide: 1 - exposed(buckets) / exposed(one bucket).
# Per configuration: tokens/s (median of the timed steps), seconds per step blocked on
# communication after backward (comm_wait_s), and the bytes handed to collectives per step
# (comm_bytes) beside the formula (4 P for an all-reduce; 8 P for ZeRO's reduce-scatter + all-gather).
# Usage: bench/bench_dp.sh [build-dir=build]   (env: STEPS=4 (the first is a warm-up), ROUNDS=2,
#        OUT=.cache/bench_dp). Needs mpirun (openmpi-bin). Not a test: figures depend on the load.
set -euo pipefail
BUILD=${1:-build}
OUT=${OUT:-.cache/bench_dp}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
for b in tandem bench_train_data; do
    [ -x "$BUILD/$b" ] || { echo "bench_dp.sh: $BUILD/$b missing (build first)" >&2; exit 1; }
done
command -v mpirun >/dev/null || { echo "bench_dp.sh: mpirun not found (apt install openmpi-bin)" >&2; exit 1; }
[ -f "$OUT/rand32k.tdsh" ] || "$BUILD/bench_train_data" "$OUT/rand32k.tdsh" 32000 200000
MODEL=(--dim 384 --layers 8 --heads 6 --ffn 1024 --vocab 32000 --batch 8 --seq-len 256 --steps "$STEPS" --warmup 1)
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
run() {  # run NAME NP THREADS [extra...]
    local name=$1 np=$2 th=$3; shift 3
    rm -f "$OUT/$name.jsonl"
    if [ "$np" = 1 ]; then
        "$BUILD/tandem" train "${MODEL[@]}" --threads "$th" --metrics "$OUT/$name.jsonl" "$@" "$OUT/rand32k.tdsh" >"$OUT/$name.log" 2>&1
    else
        "${MPI[@]}" -np "$np" "$BUILD/tandem" train "${MODEL[@]}" --threads "$th" --metrics "$OUT/$name.jsonl" "$@" \
            "$OUT/rand32k.tdsh" >"$OUT/$name.log" 2>&1
    fi
}
CONFIGS=("1x2:1:2" "2x1_z0:2:1:--zero 0" "2x1_z1:2:1:--zero 1" "2x1_z2:2:1:--zero 2" "2x1_onebucket:2:1:--zero 0 --bucket-mb 10000")
for r in $(seq "$ROUNDS"); do  # interleaved: every configuration once per round
    for c in "${CONFIGS[@]}"; do
        IFS=: read -r name np th extra <<<"$c"
        # shellcheck disable=SC2086
        run "${name}_r$r" "$np" "$th" $extra
    done
done
export OUT ROUNDS
/usr/bin/python3 - <<'PY'
import json, os, statistics
OUT, R = os.environ["OUT"], int(os.environ["ROUNDS"])
names = ["1x2", "2x1_z0", "2x1_z1", "2x1_z2", "2x1_onebucket"]
P = None
rows = {}
for n in names:
    tps, wait, byt, step = [], [], [], []
    for r in range(1, R + 1):
        lines = [json.loads(l) for l in open(f"{OUT}/{n}_r{r}.jsonl")][1:]  # the first step warms up
        tps += [l["tokens_per_s"] for l in lines]
        wait += [l["comm_wait_s"] for l in lines]
        byt += [l["comm_bytes"] for l in lines]
        step += [l["step_s"] for l in lines]
    rows[n] = (statistics.median(tps), statistics.median(wait), statistics.median(byt), statistics.median(step))
    if P is None:
        for l in open(f"{OUT}/{n}_r1.log"):
            if l.startswith("train:") and "parameters," in l:
                P = int(l.split()[1])
print(f"parameters P = {P}")
print("| config | tokens/s | step s | comm_wait_s / step | bytes / step | formula |")
print("|---|---:|---:|---:|---:|---|")
formula = {"1x2": "0", "2x1_z0": "4 P", "2x1_z1": "8 P", "2x1_z2": "8 P", "2x1_onebucket": "4 P"}
for n in names:
    t, w, b, s = rows[n]
    f = formula[n]
    fv = {"0": 0, "4 P": 4 * P, "8 P": 8 * P}[f]
    print(f"| {n} | {t:.0f} | {s:.3f} | {w:.4f} | {b:.0f} | {f} = {fv} |")
e1, e0 = rows["2x1_z0"][1], rows["2x1_onebucket"][1]
print(f"hidden by 25 MiB buckets: 1 - {e1:.4f} / {e0:.4f} = {100 * (1 - e1 / e0) if e0 > 0 else 0:.0f} %")
PY
