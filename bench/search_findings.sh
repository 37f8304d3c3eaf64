#!/bin/sh
# The PoLar paper's search findings by its protocol (issue 46, items 2 and 3),
# on the same questions with the same prompt, model, budget and build:
#   spaces: Skip-only, Loop-only and Skip&Loop searches (polar search --actions
#           skip|loop|both), equal budgets (--sims per question);
#   depths: the Skip&Loop search with a length budget of D-4, D-2, D, D+2 and
#           D+4 layers (--max-layers), D the model's depth.
# Each search writes OUT/NAME.jsonl and resumes it when run again (polar
# search continues after the last complete line), so a long run can be
# stopped and picked up. Then one markdown table per finding, from polar
# search --summary --json, and its paired comparisons (polar search
# --compare) go to stdout and OUT/findings.md. Not part of
# make test.
#
#   sh bench/search_findings.sh OUT [--what spaces|depths|all] [--model PATH] [--data FILE]
#                               [--start 0] [--limit 300] [--sims 100] [--threads 2] [--layers D]
#                               [--table-only]
#
# Defaults: the default model (D 30), MAWPS test [0, 300), 2 GSM8K-train shots,
# 100 simulations: the committed MAWPS run's settings.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: sh bench/search_findings.sh OUT [--what spaces|depths|all] [options]}
shift
WHAT=all MODEL= DATA=$ROOT/../shared/data/mawps.test.jsonl START=0 LIMIT=300 SIMS=100 THREADS=2 D=30 TABLE_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
    --table-only) TABLE_ONLY=1; shift; continue ;;
    --what) WHAT=${2:-} ;;
    --model) MODEL=${2:-} ;;
    --data) DATA=${2:-} ;;
    --start) START=${2:-} ;;
    --limit) LIMIT=${2:-} ;;
    --sims) SIMS=${2:-} ;;
    --threads) THREADS=${2:-} ;;
    --layers) D=${2:-} ;;
    *) echo "search_findings.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    [ $# -ge 2 ] || { echo "search_findings.sh: usage error: $1 needs a value" >&2; exit 2; }
    shift 2
done
case $WHAT in spaces | depths | all) ;; *) echo "search_findings.sh: usage error: --what spaces, depths or all" >&2; exit 2 ;; esac
POLAR=$ROOT/build/polar
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null
mkdir -p "$OUT"
SHOTS="--shots 2 --shots-from $ROOT/../shared/data/gsm8k.train.jsonl"

# search NAME ARGS...: one resumable search of the questions into OUT/NAME.jsonl
search() {
    name=$1
    shift
    [ "$TABLE_ONLY" = 1 ] && return 0
    t0=$(date +%s)
    # shellcheck disable=SC2086
    "$POLAR" search ${MODEL:+--model "$MODEL"} --data "$DATA" --start "$START" --limit "$LIMIT" --sims "$SIMS" \
        $SHOTS --threads "$THREADS" --batch 8 --quiet "$@" -o "$OUT/$name.jsonl"
    echo "$name: $(($(date +%s) - t0)) s on $THREADS thread(s) ($(nproc) cores), $(grep -c '' "$OUT/$name.jsonl") questions" \
        >>"$OUT/times.txt"
}

# row NAME LABEL: a table row from OUT/NAME.jsonl's summary
row() {
    f=$OUT/$1.jsonl
    if [ ! -s "$f" ]; then
        echo "| $2 | (not run) | | | | | | | |"
        return
    fi
    j=$("$POLAR" search --summary "$f" --layers "$D" --json)
    lengths=$("$POLAR" search --summary "$f" --layers "$D" | sed -n 's/^fixed questions by their shortest valid program, layers: //p')
    get() { printf '%s' "$j" | grep -o "\"$1\":[^,}]*" | cut -d: -f2 | tr -d '"'; }
    pct() { awk -v v="$1" 'BEGIN { printf "%.1f%%", 100 * v }'; }
    echo "| $2 | $(get questions) | $(get programs_evaluated) | $(pct "$(get with_valid_program)") |" \
        "$(pct "$(get base_correct)") | $(pct "$(get base_wrong_fixed)") | $(get mean_shortest_valid_length) |" \
        "$(get valid_programs): $(get valid_skip_only) / $(get valid_repeat_only) / $(get valid_skip_and_repeat) / $(get valid_no_edit) |" \
        "$lengths |"
}

# paired A B LABEL: a row of polar search --compare OUT/A.jsonl --with OUT/B.jsonl
paired() {
    if [ ! -s "$OUT/$1.jsonl" ] || [ ! -s "$OUT/$2.jsonl" ]; then
        echo "| $3 | (not run) | |"
        return
    fi
    j=$("$POLAR" search --compare "$OUT/$1.jsonl" --with "$OUT/$2.jsonl" --json)
    cell() {
        c=$(printf '%s' "$j" | grep -o "\"$1\":{[^}]*}")
        get() { printf '%s' "$c" | grep -o "\"$1\":[^,}]*" | cut -d: -f2; }
        echo "$(get a_only) / $(get b_only) / $(get both), p $(awk -v p="$(get p)" 'BEGIN { if (p < 0.001) print "< 0.001"; else printf "%.3f", p }')"
    }
    echo "| $3 | $(cell with_valid) | $(cell base_wrong_fixed) |"
}

paired_header() {
    echo
    echo "Paired over the questions both searched (only the first / only the second / both; exact two-sided McNemar p):"
    echo
    echo "| $1 | with a valid program | base-wrong fixed |"
    echo "|---|---|---|"
}

header() {
    echo "| $1 | questions | programs evaluated | with a valid program | base correct | base-wrong fixed |" \
        "shortest valid, mean layers | valid programs: skip only / repeat only / both / base |" \
        "base-wrong fixed, by the length of their shortest valid program |"
    echo "|---|---|---|---|---|---|---|---|---|"
}

if [ "$WHAT" != depths ]; then
    for a in skip loop both; do search "actions-$a" --actions "$a"; done
fi
if [ "$WHAT" != spaces ]; then
    for k in -4 -2 0 2 4; do search "depth-$((D + k))" --actions both --max-layers $((D + k)); done
fi

{
    echo "Questions [$START, $((START + LIMIT))) of $(basename "$DATA"), $SIMS simulations each, D = $D, $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown build)."
    echo
    if [ "$WHAT" != depths ]; then
        echo "Finding 1, action spaces with equal budgets:"
        echo
        header "space"
        row actions-skip "Skip only"
        row actions-loop "Loop only"
        row actions-both "Skip & Loop"
        paired_header "spaces"
        paired actions-loop actions-skip "Loop vs Skip"
        paired actions-both actions-skip "Skip & Loop vs Skip"
        paired actions-both actions-loop "Skip & Loop vs Loop"
        echo
    fi
    if [ "$WHAT" != spaces ]; then
        echo "Finding 2, depth budget (Skip & Loop, --max-layers):"
        echo
        header "max layers"
        for k in -4 -2 0 2 4; do row "depth-$((D + k))" "$((D + k)) (D$( [ $k -ge 0 ] && echo "+$k" || echo "$k"))"; done
        paired_header "max layers"
        for k in -4 -2 2 4; do paired "depth-$((D + k))" "depth-$D" "$((D + k)) vs $D"; done
    fi
} | tee "$OUT/findings.md"
