#!/bin/sh
# The main job until a real default model exists: build a small random
# Llama-shaped model, then run the base program and a skip+repeat program on
# the same prompt, side by side.
set -e
POLAR=${1:-build/polar}
DIR=${DEMO_DIR:-build/demo-model}
"$POLAR" mkmodel --arch llama --layers 8 --hidden 256 --heads 8 --kv-heads 2 --ffn 768 --vocab 2048 --seed 42 --out "$DIR"
echo
echo "== base program (all 8 layers once)"
"$POLAR" run --model "$DIR" --tokens 1,72,15,900,4 --max-new 16
echo
echo "== skip + repeat: layers 2 and 5 skipped, layers 6-7 run twice"
"$POLAR" run --model "$DIR" --tokens 1,72,15,900,4 --max-new 16 --program 0-1,3-4,6-7x2
