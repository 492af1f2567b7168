#!/bin/sh
# The starting policy for GRPO on plain-format addition, from nothing, with tandem's own commands:
# SFT text from the task's train split -> a byte-only tokenizer -> shards -> a deliberately short
# `tandem train` -> an HF directory -> pass@1 / pass@8 on 2000 held-out problems.
# Usage: recipes/rl-addition/make_policy.sh [OUT]   (default .cache/rl-addition; run from the repo root)
# Environment: TANDEM (default build/tandem), THREADS (default 1), and the knobs below.
set -eu
T=${TANDEM:-build/tandem}
OUT=${1:-.cache/rl-addition}
THREADS=${THREADS:-1}
MIN_DIGITS=${MIN_DIGITS:-1}   # the task's operand lengths (the RL loop must use the same)
MAX_DIGITS=${MAX_DIGITS:-3}
GEMM=${GEMM:-dnnl}            # the trainer's GEMM: dnnl (oneDNN, when built with it) or kernels
N_SFT=${N_SFT:-300000}        # SFT problems (train split, ~2.9M tokens): 3000 steps see each about once
STEPS=${STEPS:-3000}          # training steps of 8 x 128 tokens: the cap that keeps it imperfect
DIM=${DIM:-128}
LAYERS=${LAYERS:-4}
SEED=${SEED:-1}

mkdir -p "$OUT"
t0=$(date +%s)
stage() { echo "== $(($(date +%s) - t0)) s: $*" >&2; }

stage "SFT text"
# Documents of four problems (a blank line after every fourth): data prepare puts BOS before each
# document, so a quarter of the problems follow BOS exactly as an eval/RL prompt does, and three
# quarters of the answers (the first one's always) are followed by the stop string "\n"; the last
# one's newline is dropped by data prepare and BOS follows it. (One problem per document would end
# every answer with BOS, which stops nothing; with two, greedy decoding ended half of them with BOS.)
"$T" rl data --task addition --min-digits "$MIN_DIGITS" --max-digits "$MAX_DIGITS" --split train \
    --n "$N_SFT" --group 4 --seed "$SEED" -o "$OUT/sft.txt"

stage "tokenizer"
# 258 = the 256 bytes + BOS + EOS: no merges at all, so every digit stays its own token.
"$T" tokenizer train --vocab-size 258 --out "$OUT/tok" "$OUT/sft.txt"

stage "shards"
"$T" data prepare --tokenizer "$OUT/tok" --out "$OUT/data" --name add --docs blank --sep bos \
    --val-fraction 0.01 --threads "$THREADS" "$OUT/sft.txt"

stage "train"
OMP_WAIT_POLICY=passive "$T" train --dim "$DIM" --layers "$LAYERS" --heads 4 --ffn $((DIM * 3)) \
    --batch 8 --seq-len 128 --steps "$STEPS" --lr 2e-3 --min-lr 2e-4 --warmup 50 --wd 0.1 \
    --gemm "$GEMM" --bf16 --threads "$THREADS" --seed "$SEED" \
    --out "$OUT/ckpt" --keep 1 --eval-every 1000 --eval-batches 8 \
    --val "$OUT/data/add-val-000000.tdsh" --metrics "$OUT/metrics.jsonl" "$OUT/data/add-train-000000.tdsh"

stage "export"
"$T" export "$OUT/ckpt" --to hf -o "$OUT/policy" --tokenizer "$OUT/tok"

stage "eval"
"$T" rl eval "$OUT/policy" --task addition --min-digits "$MIN_DIGITS" --max-digits "$MAX_DIGITS" \
    --n 2000 --k 8 --temperature 1 --max-tokens 16 --seed "$SEED" --threads "$THREADS" --json "$OUT/eval.json"
stage "done: policy in $OUT/policy, result in $OUT/eval.json"
