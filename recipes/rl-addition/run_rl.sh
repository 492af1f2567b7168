#!/bin/sh
# GRPO on plain-format addition from the SFT policy of make_policy.sh, then the pictures.
# Usage: recipes/rl-addition/run_rl.sh [CONFIG]   (default recipes/rl-addition/rl.json; run from
# the repository root after make_policy.sh). Environment: TANDEM (default build/tandem).
# Writes the run's checkpoints, metrics.jsonl and PNGs under the config's out_dir.
set -eu
T=${TANDEM:-build/tandem}
CFG=${1:-recipes/rl-addition/rl.json}
OUT=$(sed -n 's/.*"out_dir": *"\([^"]*\)".*/\1/p' "$CFG")
[ -n "$OUT" ] || { echo "run_rl.sh: no out_dir in $CFG" >&2; exit 2; }
t0=$(date +%s)
"$T" rl --config "$CFG"
echo "== rl: $(($(date +%s) - t0)) s" >&2
M="$OUT/metrics.jsonl"
"$T" plot "$M" --metric pass1,pass_k -o "$OUT/pass.png" --title "held-out pass@1 and pass@8"
"$T" plot "$M" --metric reward,solved -o "$OUT/reward.png" --title "rollout reward and solved fraction"
"$T" plot "$M" --metric kl,entropy -o "$OUT/kl_entropy.png" --title "KL to the reference and entropy"
"$T" plot "$M" --metric sync_s,rollout_s,train_s -o "$OUT/time.png" --title "seconds per step"
"$T" plot "$M" --metric staleness_max,staleness_mean -o "$OUT/staleness.png" --title "staleness (versions)"
echo "== pictures in $OUT/*.png" >&2
