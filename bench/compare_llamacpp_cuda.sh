#!/bin/sh
# polar against llama.cpp's CUDA backend on one GPU, the same GGUF files, in
# one run (issue 43): llama-bench's pp512 and tg128 (every layer on the GPU,
# flash attention on) beside polar bench --device cuda with the blocks kept
# (POLAR_CUDA_BLOCKS=1), alternating file by file and rep by rep. Not part of
# make test.
#
# Here (a machine with the network, no GPU needed), once: llama.cpp's source
# from the same ggml as the CPU comparison (the PyPI llama-cpp-python source
# package, bench/llamacpp_build.sh's download), trimmed to what llama-bench
# with CUDA builds from (~9 MB), to carry to the GPU machine:
#
#   sh bench/compare_llamacpp_cuda.sh --pack-src .deps/llama-cuda-src.tar.gz
#
# (.deps is ignored by git: a device call carries it by naming it in carry.)
#
# On the GPU machine (nothing fetched there: it has cmake, ninja and nvcc;
# llama-bench builds in build-llama-cuda/ for the GPU's compute capability,
# ~144 CUDA files, about 36 s each on one core of a 2-core EPYC), after
# `make cuda` and `make CUDA=1 build-cuda/tests/mkgguf`:
#
#   sh bench/compare_llamacpp_cuda.sh OUT [--src FILE.tar.gz | --llama-bench PATH]
#        [--shapes llama-3.2-1b,llama-3.2-3b,qwen3-8b] [--types q4_k_m,q4_0,q8_0,iq4_xs]
#        [--layers N] [--reps 3] [--prompt 512] [--gen 128] [--bf16]
#
# --layers N cuts each preset to its first N layers (mkgguf's LAYERS: files
# written faster, the same per-layer work); --bf16 also times polar on the
# same files uploaded as bf16 (POLAR_CUDA_BLOCKS=0). Writes OUT/runs.jsonl
# (a line per run: tool, file, rep, and its JSON) and OUT/table.md (best of
# reps: tokens/s of each and polar's ratio), with the GPU, driver and commit.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}

if [ "${1:-}" = --pack-src ]; then
    OUTFILE=${2:?usage: sh bench/compare_llamacpp_cuda.sh --pack-src FILE.tar.gz}
    sh "$ROOT/bench/llamacpp_build.sh" >/dev/null # downloads and unpacks the source when missing
    SRC=$ROOT/.deps/llama.cpp/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
    # models, docs, tests, examples and the other GPU backends are not built with
    # LLAMA_BUILD_TESTS/EXAMPLES off and GGML_CUDA alone
    tar -czf "$OUTFILE" -C "$SRC" --exclude=./models --exclude=./docs --exclude=./tests --exclude=./examples \
        --exclude=./benches --exclude=./.git --exclude=./ggml/src/ggml-sycl --exclude=./ggml/src/ggml-vulkan \
        --exclude=./ggml/src/ggml-opencl --exclude=./ggml/src/ggml-hexagon --exclude=./ggml/src/ggml-cann \
        --exclude=./ggml/src/ggml-musa --exclude=./ggml/src/ggml-webgpu --exclude=./ggml/src/ggml-metal .
    echo "$OUTFILE: llama.cpp of llama-cpp-python $LLAMA_CPP_PYTHON, $(du -h "$OUTFILE" | cut -f1)"
    exit 0
fi

OUT=${1:?usage: sh bench/compare_llamacpp_cuda.sh OUT [options] (or --pack-src FILE)}
shift
SRC_TAR=$ROOT/.deps/llama-cuda-src.tar.gz LLAMA_BENCH= SHAPES=llama-3.2-1b,llama-3.2-3b,qwen3-8b
TYPES=q4_k_m,q4_0,q8_0,iq4_xs LAYERS= REPS=3 PROMPT=512 GEN=128 BF16=0
while [ $# -gt 0 ]; do
    case $1 in
    --bf16) BF16=1; shift; continue ;;
    --src) SRC_TAR=${2:-} ;;
    --llama-bench) LLAMA_BENCH=${2:-} ;;
    --shapes) SHAPES=${2:-} ;;
    --types) TYPES=${2:-} ;;
    --layers) LAYERS=${2:-} ;;
    --reps) REPS=${2:-} ;;
    --prompt) PROMPT=${2:-} ;;
    --gen) GEN=${2:-} ;;
    *) echo "compare_llamacpp_cuda.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    [ $# -ge 2 ] || { echo "compare_llamacpp_cuda.sh: usage error: $1 needs a value" >&2; exit 2; }
    shift 2
done
POLAR=${POLAR:-$ROOT/build-cuda/polar} MKGGUF=${MKGGUF:-$ROOT/build-cuda/tests/mkgguf}
for f in "$POLAR" "$MKGGUF"; do
    [ -x "$f" ] || { echo "compare_llamacpp_cuda.sh: error: $f missing (make cuda; make CUDA=1 build-cuda/tests/mkgguf)" >&2; exit 1; }
done
mkdir -p "$OUT"

if [ -z "$LLAMA_BENCH" ]; then
    [ -f "$SRC_TAR" ] || { echo "compare_llamacpp_cuda.sh: error: no llama.cpp source at $SRC_TAR (--pack-src makes it)" >&2; exit 1; }
    B=$ROOT/build-llama-cuda
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
    if [ ! -x "$B/bin/llama-bench" ]; then
        rm -rf "$B" && mkdir -p "$B/src" && tar -xzf "$SRC_TAR" -C "$B/src"
        t0=$(date +%s)
        cmake -S "$B/src" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$cap" \
            -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=OFF >"$OUT/llama-build.log" 2>&1 &&
            ninja -C "$B" llama-bench >>"$OUT/llama-build.log" 2>&1 ||
            { echo "compare_llamacpp_cuda.sh: error: building llama-bench failed, see $OUT/llama-build.log" >&2; exit 1; }
        echo "llama-bench (CUDA, sm_$cap) built in $(($(date +%s) - t0)) s" | tee -a "$OUT/llama-build.log"
    fi
    LLAMA_BENCH=$B/bin/llama-bench
fi

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    echo "commit $(cd "$ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1
} >"$OUT/machine.txt"

# field NAME: its number in the JSON on stdin (the first one)
field() { grep -o "\"$1\": *[0-9.e+-]*" | head -n 1 | sed 's/.*: *//'; }
# best FILE TOOL WHAT: the largest tokens/s of that tool and phase in runs.jsonl for the file
best() {
    grep "\"file\":\"$1\",\"tool\":\"$2\",\"what\":\"$3\"" "$OUT/runs.jsonl" | grep -o "\"tok_s\":[0-9.e+-]*" |
        cut -d: -f2 | sort -g | tail -n 1
}
record() { # FILE TOOL WHAT REP TOK_S JSON
    printf '{"file":"%s","tool":"%s","what":"%s","rep":%s,"tok_s":%s,"result":%s}\n' "$1" "$2" "$3" "$4" "$5" "$6" \
        >>"$OUT/runs.jsonl"
}

: >"$OUT/runs.jsonl"
dir=/tmp/polar-cmp-cuda
mkdir -p "$dir"
files=
for shape in $(echo "$SHAPES" | tr , ' '); do
    for type in $(echo "$TYPES" | tr , ' '); do
        f=$dir/$shape.$type${LAYERS:+.$LAYERS}.gguf
        [ -s "$f" ] || "$MKGGUF" "$shape" "$f" "$type" 1 $LAYERS >/dev/null
        files="$files $f"
    done
done
for rep in $(seq 1 "$REPS"); do
    for f in $files; do
        name=$(basename "$f" .gguf)
        "$LLAMA_BENCH" -m "$f" -ngl 99 -fa on -p "$PROMPT" -n "$GEN" -r 1 -o jsonl >"$dir/llama.jsonl" 2>/dev/null || true
        pp=$(grep '"n_gen": 0' "$dir/llama.jsonl" | field avg_ts || true)
        tg=$(grep '"n_prompt": 0' "$dir/llama.jsonl" | field avg_ts || true)
        record "$name" llama.cpp prefill "$rep" "${pp:-null}" "[$(paste -sd, "$dir/llama.jsonl")]"
        record "$name" llama.cpp decode "$rep" "${tg:-null}" null
        for blocks in 1 $([ "$BF16" = 1 ] && echo 0); do
            tool=polar$([ "$blocks" = 0 ] && echo -bf16 || true)
            p=$(POLAR_CUDA_BLOCKS=$blocks "$POLAR" bench --device cuda --json --model "$f" --prompt-len "$PROMPT" --gen 1 --reps 1)
            d=$(POLAR_CUDA_BLOCKS=$blocks "$POLAR" bench --device cuda --json --model "$f" --prompt-len 1 --gen "$GEN" --reps 1)
            record "$name" "$tool" prefill "$rep" "$(printf '%s' "$p" | grep -o '"prefill_tok_s":[0-9.]*' | cut -d: -f2)" "$p"
            record "$name" "$tool" decode "$rep" "$(printf '%s' "$d" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)" "$d"
        done
    done
done

{
    echo "# polar against llama.cpp CUDA, $(sed -n 3p "$OUT/machine.txt")"
    echo
    echo "$(sed -n 2p "$OUT/machine.txt"), $(sed -n 1p "$OUT/machine.txt"); llama-bench (build" \
        "$(grep -o '"build_commit": "[^"]*"' "$OUT/runs.jsonl" | head -n 1 | cut -d'"' -f4)) -ngl 99 -fa on -p $PROMPT -n $GEN;"
    echo "polar bench --device cuda, POLAR_CUDA_BLOCKS=1 (prefill: --prompt-len $PROMPT; decode: --gen $GEN after one"
    echo "prompt token, as tg$GEN starts from an empty cache); best of $REPS alternated runs, tokens/s."
    echo
    echo "| file | llama.cpp pp$PROMPT | polar | ratio | llama.cpp tg$GEN | polar | ratio |$([ "$BF16" = 1 ] && echo " polar bf16 pp | tg |")"
    echo "|---|---|---|---|---|---|---|$([ "$BF16" = 1 ] && echo "---|---|")"
    for f in $files; do
        n=$(basename "$f" .gguf)
        lp=$(best "$n" llama.cpp prefill) pp=$(best "$n" polar prefill) ld=$(best "$n" llama.cpp decode) pd=$(best "$n" polar decode)
        row=$(awk -v a="$lp" -v b="$pp" -v c="$ld" -v d="$pd" 'BEGIN {
            r1 = a > 0 ? sprintf("%.2f", b / a) : "-"; r2 = c > 0 ? sprintf("%.2f", d / c) : "-"
            printf "%s | %s | %s | %s | %s | %s", a, b, r1, c, d, r2 }')
        extra=$([ "$BF16" = 1 ] && echo " $(best "$n" polar-bf16 prefill) | $(best "$n" polar-bf16 decode) |" || true)
        echo "| $n | $row |$extra"
    done
} | tee "$OUT/table.md"
