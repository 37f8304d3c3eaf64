#!/bin/sh
# Where the GPU time goes, per kernel, for the cases whose issue-10 targets
# are missed: a dense decode step, a dense 512-token prefill, the MoE
# forward, the predictor kernel.
# Nsight Compute with --clock-control none (the device's clocks left as
# found) times each kernel alone, serialised, so small kernels read high
# against graph replay: use the table to rank kernels, polar bench for
# totals. One device call (build-cuda/ must exist: gpu_evidence.sh's first
# call builds it).
#
#   sh bench/gpu_profile.sh OUT
# Overrides (empty skips): DECODE (llama-3.2-3b), PREFILL (llama-3.2-3b:
# a 512-token prompt), MOE (qwen1.5-moe-a2.7b), PREDICTOR (1; 0 skips), WORK (/tmp/polar-evidence: gpu_evidence.sh's
# predictor and encoder, made here when missing).
# Writes OUT/NAME.csv (ncu --csv --page raw) and OUT/NAME.txt: per kernel
# name, launches, total and mean us, DRAM GB read + written, GB/s; largest
# total first.
set -u
OUT=${1:?usage: sh bench/gpu_profile.sh OUT}
DECODE=${DECODE-llama-3.2-3b}
PREFILL=${PREFILL-llama-3.2-3b}
MOE=${MOE-qwen1.5-moe-a2.7b}
PREDICTOR=${PREDICTOR:-1}
WORK=${WORK:-/tmp/polar-evidence}
BIN=build-cuda/polar
NCU=${NCU:-ncu}
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "no $BIN: run make cuda (or gpu_evidence.sh's first call) first"; exit 1; }

# summarize CSV: the raw page's rows summed per kernel name. The CSV quotes
# every field and kernel names may hold commas, so fields are split by hand.
summarize() {
    awk '
    function split_csv(line, f,    n, i, c, q, cur) {
        n = 0; cur = ""; q = 0
        for (i = 1; i <= length(line); i++) {
            c = substr(line, i, 1)
            if (c == "\"") q = !q
            else if (c == "," && !q) { f[++n] = cur; cur = "" }
            else cur = cur c
        }
        f[++n] = cur
        return n
    }
    !hdr && /"Kernel Name"/ {
        n = split_csv($0, h)
        for (i = 1; i <= n; i++) col[h[i]] = i
        hdr = 1; next
    }
    hdr {
        split_csv($0, f)
        if (f[col["ID"]] !~ /^[0-9]+$/) next # the units row
        k = f[col["Kernel Name"]]
        t[k] += f[col["gpu__time_duration.sum"]]
        b[k] += f[col["dram__bytes_read.sum"]] + f[col["dram__bytes_write.sum"]]
        cnt[k]++
    }
    END {
        for (k in t) printf "%12.1f %8d %10.2f %9.4f %8.1f  %s\n", t[k] / 1e3, cnt[k], t[k] / cnt[k] / 1e3,
                                b[k] / 1e9, (t[k] > 0 ? b[k] / t[k] : 0), k
    }' "$1" | sort -rn | { printf '%12s %8s %10s %9s %8s  %s\n' "total us" launches "mean us" "DRAM GB" "GB/s" kernel; cat; }
}

# profile NAME ARGS...: ncu over one polar bench run.
profile() {
    name=$1
    shift
    if "$NCU" --clock-control none --csv --page raw --print-units base --metrics "$METRICS" "$@" \
        >"$OUT/$name.csv" 2>"$OUT/$name.err"; then
        summarize "$OUT/$name.csv" >"$OUT/$name.txt"
        echo "== $name: $*"
        head -n 16 "$OUT/$name.txt"
    else
        echo "== $name: ncu failed (exit $?): $(tail -n 3 "$OUT/$name.err")"
    fi
}

# A decode step at context 128 (plus its prefill and graph capture): the
# per-layer kernels' launches are gen + 1 times the layers.
[ -n "$DECODE" ] && profile decode "$BIN" bench --device cuda --preset "$DECODE" --prompt-len 128 --gen 3 --reps 1
# A 512-token prefill (target: 50% of tensor-core peak; 21% on 2026-11-23,
# and 2048 tokens took 8.7x as long as 512: the CUDA-core attention kernel
# is the suspect), then one decode step.
[ -n "$PREFILL" ] && profile prefill "$BIN" bench --device cuda --preset "$PREFILL" --prompt-len 512 --gen 1 --reps 1
# The MoE preset's 150-token forward (target 15 ms) and two decode steps.
[ -n "$MOE" ] && profile moe "$BIN" bench --device cuda --preset "$MOE" --prompt-len 150 --gen 2 --reps 1
# The fused predictor kernel alone, T 256, D 36 (target 50 us): its 52+
# launches (the per-run call and the warm ones) in one row.
if [ "$PREDICTOR" = 1 ]; then
    mkdir -p "$WORK"
    if [ ! -f "$WORK/pred36.safetensors" ] || [ ! -f "$WORK/encoder/tokenizer.json" ]; then
        make -s build/tests/mkpredictor >/dev/null 2>&1 && ./build/tests/mkpredictor 36 1024 "$WORK/pred36.safetensors" &&
            "$BIN" mkmodel --preset qwen3-embedding-0.6b --out "$WORK/encoder" >/dev/null &&
            gzip -dc tests/golden/tokenizer/qwen.tokenizer.json.gz >"$WORK/encoder/tokenizer.json" ||
            echo "predictor setup failed"
    fi
    profile predictor --kernel-name predictor_kernel "$BIN" bench --device cuda --preset qwen2.5-3b --prompt-len 8 \
        --gen 1 --reps 1 --predictor "$WORK/pred36.safetensors" --encoder "$WORK/encoder" --question-len 256
fi
