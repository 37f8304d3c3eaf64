#!/bin/sh
# What a program costs in quality: polar perplexity of the default model
# under a few programs against the base program's log-probabilities, on
# GSM8K train text (bench/gsm8k_text.py). A markdown table on stdout, JSON
# lines with --json. Not part of make test.
#
#   sh bench/program_costs.sh [--text FILE] [--ctx 512] [--chunks 8] [--threads 2] [--json OUT] [SPEC...]
#
# Without SPECs: a one-layer skip, a one-layer repeat, and the programs
# `polar search` found valid most often on MAWPS [0,300) and GSM8K train
# [2,202) (bench/results/2026-11-23-search-mawps, 2026-11-24-search-gsm8k).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
POLAR=$ROOT/build/polar
TEXT= CTX=512 CHUNKS=8 THREADS=2 JSON=
while [ $# -gt 0 ]; do
    case $1 in
    --text) TEXT=$2 ;;
    --ctx) CTX=$2 ;;
    --chunks) CHUNKS=$2 ;;
    --threads) THREADS=$2 ;;
    --json) JSON=$2 ;;
    -*) echo "program_costs.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    *) break ;;
    esac
    shift 2 || { echo "program_costs.sh: usage error: $1 needs a value" >&2; exit 2; }
done
[ $# -gt 0 ] || set -- 0-13,15-29 0-14,14-29 0-4,6-11,10-29 0-4,3-26,26-29 0-7,7-13,12-26,28-29 0-4,7-25,25,27-29
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [ -z "$TEXT" ]; then
    TEXT=$OUT/gsm8k.txt
    python3 "$ROOT/bench/gsm8k_text.py" --data "$ROOT/../shared/data/gsm8k.train.jsonl" -o "$TEXT" 2>/dev/null
fi
ARGS="--ctx $CTX --chunks $CHUNKS --threads $THREADS --quiet --json"
"$POLAR" perplexity -f "$TEXT" $ARGS --kl-divergence-base "$OUT/base.lp" >"$OUT/base.json"
for spec in "$@"; do
    "$POLAR" perplexity --program "$spec" $ARGS --kl-divergence "$OUT/base.lp" >>"$OUT/programs.jsonl"
done
python3 - "$OUT/base.json" "$OUT/programs.jsonl" "$JSON" "$CTX" "$CHUNKS" <<'PY'
import json, sys, subprocess, datetime
base = json.load(open(sys.argv[1]))
rows = [json.loads(line) for line in open(sys.argv[2])]
print(f"Default model (SmolLM2-135M-Instruct Q4_1), GSM8K train text, {base['chunks']} chunks of {base['ctx']} "
      f"({base['tokens']} tokens scored), polar's {base['cpu_kernels']} kernels; KL divergence from the base program.\n")
print("| program | layers run | PPL | ln(PPL / PPL(base)) | mean KLD | 99% KLD | same top token |")
print("|---|---|---|---|---|---|---|")
print(f"| base (0-29) | 30 | {base['ppl']:.4f} +/- {base['ppl_err']:.4f} | 0 | 0 | 0 | 100% |")
for r in rows:
    k = r["reference"]
    print(f"| {r['program']} | {r['executed_layers']} | {r['ppl']:.4f} +/- {r['ppl_err']:.4f} | "
          f"{k['ln_ratio']:.4f} +/- {k['ln_ratio_err']:.4f} | {k['kld']:.4f} +/- {k['kld_err']:.4f} | "
          f"{k['kld_p99']:.3f} | {100 * k['same_top']:.1f}% |")
if sys.argv[3]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(sys.argv[3], "a") as f:
        f.write(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "commit": commit, "command": "sh bench/program_costs.sh", "ctx": int(sys.argv[4]),
                            "chunks": int(sys.argv[5]), "base": base, "programs": rows}) + "\n")
PY
