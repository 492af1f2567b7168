#!/bin/sh
# The staleness ablation: the same GRPO run (rl.json's settings, STEPS steps) synchronous (eta 0)
# and asynchronous with eta 1 and 4 (rollouts on the colocated engine's thread while the trainer
# trains), one run each; prints a table row per run from its metrics.jsonl.
# Usage: recipes/rl-addition/ablation.sh [STEPS]   (default 1000; after make_policy.sh)
set -eu
T=${TANDEM:-build/tandem}
STEPS=${1:-1000}
BASE=${BASE:-recipes/rl-addition/rl.json}
OUT=${OUT:-.cache/rl-addition/ablation}
mkdir -p "$OUT"
for eta in 0 1 4; do
  mode=async; [ "$eta" = 0 ] && mode=sync
  sed -e "s#\"out_dir\": *\"[^\"]*\"#\"out_dir\": \"$OUT/eta$eta\"#" \
      -e "s#\"steps\": *[0-9]*#\"steps\": $STEPS#" \
      -e "s#\"mode\": *\"[a-z]*\"#\"mode\": \"$mode\", \"max_staleness\": $eta#" \
      -e "s#\"ckpt_every\": *[0-9]*#\"ckpt_every\": 0#" "$BASE" > "$OUT/eta$eta.json"
  rm -rf "$OUT/eta$eta"
  t0=$(date +%s)
  "$T" rl --config "$OUT/eta$eta.json" > "$OUT/eta$eta.log" 2>&1
  echo "eta $eta: $(($(date +%s) - t0)) s" >&2
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
print("| eta | wall s | steps | pass@1 start -> end | pass@8 end | reward last 100 steps | staleness max / mean | dropped | lp_diff_mean |")
print("|---:|---:|---:|---|---:|---:|---|---:|---:|")
for eta in (0, 1, 4):
    lines = [json.loads(l) for l in open(f"{out}/eta{eta}/metrics.jsonl") if l.strip()]
    steps = [l for l in lines if "reward" in l]
    evals = [l for l in lines if "pass1" in l]
    r = sum(l["reward"] for l in steps[-100:]) / len(steps[-100:])
    print(f"| {eta} | {steps[-1]['elapsed_s']:.0f} | {len(steps)} | {evals[0]['pass1']:.4f} -> {evals[-1]['pass1']:.4f} | "
          f"{evals[-1].get('pass_k', float('nan')):.4f} | {r:.4f} | {max(l['staleness_max'] for l in steps):.0f} / "
          f"{sum(l['staleness_mean'] for l in steps) / len(steps):.3f} | {steps[-1]['dropped']:.0f} | "
          f"{sum(l['lp_diff_mean'] for l in steps) / len(steps):.2e} |")
PY
