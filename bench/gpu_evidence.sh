#!/bin/sh
# Everything a GPU session should measure, in one command (one device call):
# build, check every CUDA kernel and model against the CPU, then the
# benchmarks issues 3, 4 and 6 ask for, each as one JSON line with the device,
# driver, date, commit and exact command. Copy OUT/*.jsonl to bench/results/.
#
#   sh bench/gpu_evidence.sh OUT [COMMIT]
# Overrides (empty skips; for a quick run or a CPU smoke test): DEVICE (cuda), PRESETS
# ("llama-3.2-3b qwen2.5-3b qwen3-8b"), CTXS ("128 2048"), PREFILLS ("128 512"),
# MOE (qwen1.5-moe-a2.7b; empty to skip), PREDICTOR (1; 0 to skip), PDL_AB (1; 0 to skip), BATCH (llama-3.2-1b; empty
# to skip) and BATCH_SIZES (1,8,32), GEN (64), REPS (3),
# TEST (1: run make test-cuda), COMPARE (1: bench/compare_hf.py against transformers),
# WORK (/tmp/polar-evidence: the checkpoints and predictor it writes).
#
# A device call is limited to 10 minutes; split the work across calls on the
# warm machine (build outputs stay there between calls):
#   PRESETS= MOE= PREDICTOR=0 BATCH= COMPARE=0 sh bench/gpu_evidence.sh $OUT # build + make test-cuda
#   TEST=0 COMPARE=0 sh bench/gpu_evidence.sh $OUT                           # the benchmarks
#   TEST=0 PRESETS= MOE= PREDICTOR=0 BATCH= sh bench/gpu_evidence.sh $OUT    # compare_hf.py, Llama-3.2-3B
#   TEST=0 COMPARE=0 PRESETS= MOE= BATCH= sh bench/gpu_evidence.sh $OUT      # the predictor alone ("warm": encoder
#                                                                             # and network loaded once, 50 questions)
set -u
OUT=${1:?usage: sh bench/gpu_evidence.sh OUT [COMMIT]}
COMMIT=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
DEVICE=${DEVICE:-cuda}
PRESETS=${PRESETS-llama-3.2-3b qwen2.5-3b qwen3-8b}
CTXS=${CTXS-128 2048}
PREFILLS=${PREFILLS-128 512}
MOE=${MOE-qwen1.5-moe-a2.7b}
GEN=${GEN:-64}
REPS=${REPS:-3}
TEST=${TEST:-1}
PREDICTOR=${PREDICTOR:-1}
BATCH=${BATCH-llama-3.2-1b}
BATCH_SIZES=${BATCH_SIZES:-1,8,32}
WORK=${WORK:-/tmp/polar-evidence}
mkdir -p "$OUT"
BIN=build/polar
if [ "$DEVICE" = cuda ]; then
    BIN=build-cuda/polar
    make -j"$(nproc)" cuda >"$OUT/build.log" 2>&1 || { echo "make cuda failed: see $OUT/build.log"; exit 1; }
    if [ "$TEST" = 1 ]; then
        make test-cuda >"$OUT/test-cuda.log" 2>&1
        echo "make test-cuda: exit $? (log in $OUT/test-cuda.log)"
        grep -E "^(PASS|FAIL)" "$OUT/test-cuda.log"
    fi
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
else
    make -j"$(nproc)" >"$OUT/build.log" 2>&1 || { echo "make failed: see $OUT/build.log"; exit 1; }
    GPU="cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    DRIVER=none
fi
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# bench NAME ARGS...: one JSON line {device, driver, date, commit, command, result}
bench() {
    name=$1
    shift
    if res=$("$BIN" bench --device "$DEVICE" --json "$@" 2>"$OUT/err.txt"); then
        extra=$(printf '%s\n' "$res" | sed -n 2p) # the predictor's line, when there is one
        printf '{"device":"%s","driver":"%s","date":"%s","commit":"%s","command":"%spolar bench --device %s --json %s","result":%s%s}\n' \
            "$GPU" "$DRIVER" "$DATE" "$COMMIT" "${POLAR_CUDA_PDL:+POLAR_CUDA_PDL=$POLAR_CUDA_PDL }" "$DEVICE" "$*" \
            "$(printf '%s' "$res" | head -n 1)" \
            "${extra:+,\"overhead\":$extra}" >>"$OUT/$name.jsonl"
        [ -n "$extra" ] && echo "  $name: $extra"
        printf '%s' "$res" | head -n 1 | sed 's/},{/}\n{/g' | grep -o '"program":"[^"]*".*"fraction_of_read":[0-9.]*' |
            sed -e "s/^/  $name: /" -e 's/"executed_layers".*"prefill_ms"/"prefill_ms"/' -e 's/"prefill_tok_s":[0-9.]*,//' \
                -e 's/"decode_tok_s".*"fraction_of_copy"/"fraction_of_copy"/'
    else
        echo "$name $*: FAILED: $(cat "$OUT/err.txt")"
    fi
}

# A skip program (two middle layers dropped) and a repeat one (two run twice).
programs() {
    D=$1
    h=$((D / 2))
    echo "0-$((h - 2)),$((h + 1))-$((D - 1))" "0-$((h - 1)),$((h - 2))-$((D - 1))"
}

# Depth of each preset (runtime/presets.c).
layers() {
    case $1 in
    llama-3.2-1b) echo 16 ;; llama-3.2-3b) echo 28 ;; qwen2.5-3b | qwen3-8b) echo 36 ;; qwen1.5-moe-a2.7b | qwen2.5-0.5b) echo 24 ;;
    *) echo 28 ;;
    esac
}

for p in $PRESETS; do
    D=$(layers "$p")
    set -- $(programs "${D:-28}")
    for ctx in $CTXS; do
        bench decode --preset "$p" --prompt-len "$ctx" --gen "$GEN" --reps "$REPS" --program "$1"
        bench decode --preset "$p" --prompt-len "$ctx" --gen "$GEN" --reps "$REPS" --program "$2"
    done
    for n in $PREFILLS; do bench prefill --preset "$p" --prompt-len "$n" --gen 1 --reps "$REPS"; done
done
# Each kernel launched to overlap the previous one (programmatic dependent
# launch, the default from sm_90) against POLAR_CUDA_PDL=0: base-program
# decode at the first context, alternated, in decode-pdl.jsonl. PDL_AB=0 skips.
if [ "${PDL_AB:-1}" = 1 ]; then
    for p in $PRESETS; do
        for pdl in 0 1 0 1; do
            if [ "$pdl" = 0 ]; then export POLAR_CUDA_PDL=0; else unset POLAR_CUDA_PDL; fi
            bench decode-pdl --preset "$p" --prompt-len "${CTXS%% *}" --gen "$GEN" --reps "$REPS"
        done
        unset POLAR_CUDA_PDL
    done
fi
if [ -n "$MOE" ]; then
    D=$(layers "$MOE")
    set -- $(programs "${D:-24}")
    bench moe --preset "$MOE" --prompt-len 128 --gen "$GEN" --reps "$REPS" --program "$1"
    bench moe --preset "$MOE" --prompt-len 128 --gen "$GEN" --reps "$REPS" --program "$2"
    bench moe --preset "$MOE" --prompt-len 150 --gen 1 --reps "$REPS"
fi
# Batches (issue 15): decode tok/s against batch size, every sequence on one
# program and on distinct ones, on the Llama-3.2-1B preset; one JSON line
# per configuration in batch.jsonl. Then the same with POLAR_CUDA_GRAPHS=0
# (every step call by call) in batch-nographs.jsonl: what the step graphs
# save. BATCH= skips.
if [ -n "$BATCH" ]; then
    args="--preset $BATCH --batch $BATCH_SIZES --prompt-len 128 --gen $GEN --reps $REPS"
    for graphs in 1 0; do
        file=batch env_note=
        [ "$graphs" = 0 ] && file=batch-nographs env_note="POLAR_CUDA_GRAPHS=0 "
        # shellcheck disable=SC2086 # args is a list
        if res=$(POLAR_CUDA_GRAPHS=$graphs "$BIN" bench --device "$DEVICE" --json $args 2>"$OUT/err.txt"); then
            printf '%s\n' "$res" | while IFS= read -r line; do
                printf '{"device":"%s","driver":"%s","date":"%s","commit":"%s","command":"%spolar bench --device %s --json %s","result":%s}\n' \
                    "$GPU" "$DRIVER" "$DATE" "$COMMIT" "$env_note" "$DEVICE" "$args" "$line" >>"$OUT/$file.jsonl"
            done
            printf '%s\n' "$res" | grep -o '"batch":[0-9]*,"programs":"[a-z]*".*"vs_batch1":[0-9.]*' | sed "s/^/  $file: /"
        else
            echo "$env_note$file $args: FAILED: $(cat "$OUT/err.txt")"
        fi
    done
fi
# The predictor (issue 6): a D = 36 predictor with hash weights over token
# states from the Qwen3-Embedding-0.6B shape, at 128 and 256 question tokens.
if [ "$PREDICTOR" = 1 ]; then
    mkdir -p "$WORK"
    make -s build/tests/mkpredictor >/dev/null 2>&1 && ./build/tests/mkpredictor 36 1024 "$WORK/pred36.safetensors" &&
        "$BIN" mkmodel --preset qwen3-embedding-0.6b --out "$WORK/encoder" >/dev/null &&
        gzip -dc tests/golden/tokenizer/qwen.tokenizer.json.gz >"$WORK/encoder/tokenizer.json" || echo "predictor setup failed"
    for q in 128 256; do
        bench predictor --preset qwen2.5-3b --prompt-len 150 --gen 1 --reps "$REPS" --predictor "$WORK/pred36.safetensors" \
            --encoder "$WORK/encoder" --question-len "$q"
    done
fi
# Against transformers on the same GPU (the device image has torch and
# transformers): a real-shape Llama-3.2-3B and the MoE preset written as
# checkpoints, base and a skip program. COMPARE=0 skips.
if [ "${COMPARE:-1}" = 1 ] && [ "$DEVICE" = cuda ]; then
    for p in llama-3.2-3b ${MOE:+$MOE}; do
        D=$(layers "$p")
        set -- $(programs "${D:-28}")
        "$BIN" mkmodel --preset "$p" --out "$WORK/$p" >/dev/null || { echo "mkmodel $p failed"; continue; }
        for prog in base "$1"; do
            python3 bench/compare_hf.py --model "$WORK/$p" --program "$prog" --device cuda --polar "$BIN" \
                --json "$OUT/compare-$p-$(echo "$prog" | tr ',' '_').json" 2>&1 | tail -n 3
        done
        rm -rf "${WORK:?}/$p"
    done
fi
rm -f "$OUT/err.txt"
echo "results in $OUT: $(ls "$OUT")"
