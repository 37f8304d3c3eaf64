#!/bin/sh
# Predicted programs against the base, by the paper's protocol (issue 46,
# item 4): on each data set, the predictor's top k programs (pass@k: any of
# them right; consensus@k: their majority answer) against base greedy
# decoding and k base samples at each of the paper's temperatures
# {0.3, 0.7, 1.0} ("Base (sampling)": the best over the temperatures), all
# with the same prompts (2 GSM8K-train shots, the boxed style). The baseline
# files do not depend on the predictor, so once run they serve every
# predictor compared later in the same OUT. Each evaluation writes
# OUT/NAME.jsonl and resumes it when run again (polar eval continues after
# the last complete line). Not part of make test.
#
#   sh bench/predictor_eval.sh OUT [--predictor FILE [--name NAME]] [--what baselines|predictor|all]
#                              [--sets "mawps:1500:565 gsm8k:0:300 asdiv:0:300"] [--temps "0.3 0.7 1.0"]
#                              [-k 5] [--samples 5] [--max-new 48] [--threads 1] [--model PATH]
#                              [--encoder E] [--decode beam|catalogue] [--table-only]
#
# A set is NAME:START:LIMIT, NAME.test.jsonl in ../shared/data. Writes
# OUT/table.md: one row per set, then the paired pass@k of the predictor
# against each temperature's samples (polar eval --compare); each
# FILE.jsonl's summary beside it as FILE.summary.json.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
POLAR=$ROOT/build/polar
OUT=${1:?usage: sh bench/predictor_eval.sh OUT [--predictor FILE] [options]}
shift
DATA=$ROOT/../shared/data PRED= NAME=predictor WHAT=all SETS="mawps:1500:565 gsm8k:0:300 asdiv:0:300"
TEMPS="0.3 0.7 1.0" K=5 SAMPLES=5 MAX_NEW=48 THREADS=1 MODEL= ENCODER= DECODE=beam TABLE_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
    --table-only) TABLE_ONLY=1; shift; continue ;;
    --predictor) PRED=${2:-} ;;
    --name) NAME=${2:-} ;;
    --what) WHAT=${2:-} ;;
    --sets) SETS=${2:-} ;;
    --temps) TEMPS=${2:-} ;;
    -k) K=${2:-} ;;
    --samples) SAMPLES=${2:-} ;;
    --max-new) MAX_NEW=${2:-} ;;
    --threads) THREADS=${2:-} ;;
    --model) MODEL=${2:-} ;;
    --encoder) ENCODER=${2:-} ;;
    --decode) DECODE=${2:-} ;;
    *) echo "predictor_eval.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    [ $# -ge 2 ] || { echo "predictor_eval.sh: usage error: $1 needs a value" >&2; exit 2; }
    shift 2
done
case $WHAT in baselines | predictor | all) ;; *) echo "predictor_eval.sh: usage error: --what baselines, predictor or all" >&2; exit 2 ;; esac
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null
mkdir -p "$OUT"
SHOTS="--shots 2 --shots-from $DATA/gsm8k.train.jsonl"

# evaluate FILE SET START LIMIT ARGS...: one resumable polar eval into OUT/FILE.jsonl
evaluate() {
    file=$1 set=$2 start=$3 limit=$4
    shift 4
    [ "$TABLE_ONLY" = 1 ] && return 0
    t0=$(date +%s)
    # shellcheck disable=SC2086
    "$POLAR" eval ${MODEL:+--model "$MODEL"} --data "$DATA/$set.test.jsonl" --start "$start" --limit "$limit" $SHOTS \
        --max-new "$MAX_NEW" --threads "$THREADS" --seed 1 --quiet "$@" -o "$OUT/$file.jsonl"
    echo "$file: $(($(date +%s) - t0)) s on $THREADS thread(s) ($(nproc) cores), $(grep -c '' "$OUT/$file.jsonl") questions" \
        >>"$OUT/times.txt"
}

for s in $SETS; do
    IFS=: read -r set start limit <<EOF
$s
EOF
    if [ "$WHAT" != predictor ]; then
        for t in $TEMPS; do evaluate "base-t$t-$set" "$set" "$start" "$limit" --samples "$SAMPLES" --temperature "$t"; done
    fi
    if [ "$WHAT" != baselines ] && [ -n "$PRED" ]; then
        evaluate "$NAME-$set" "$set" "$start" "$limit" --program auto --predictor "$PRED" ${ENCODER:+--encoder "$ENCODER"} \
            --decode "$DECODE" -k "$K"
    fi
done

# field JSON KEY [I]: a number, or the I-th (1-based) of a list, from a summary
field() {
    printf '%s' "$1" | grep -o "\"$2\":[^,}]*\(,[^\"}]*\)*" | head -n 1 | cut -d: -f2 | tr -d '[]' |
        awk -F, -v i="${3:-1}" '{ print $i }'
}
pct() { awk -v v="$1" 'BEGIN { if (v == "") print "-"; else printf "%.1f", 100 * v }'; }
# summary FILE.jsonl: its summary JSON, also kept as FILE.summary.json
summary() {
    [ -s "$1" ] && "$POLAR" eval --summary-of "$1" --summary "${1%.jsonl}.summary.json" >/dev/null &&
        cat "${1%.jsonl}.summary.json"
}

{
    echo "Base greedy, base sampling (k samples at each temperature; best: the best over them, for each k) and"
    echo "the predictor's top $K programs ($NAME), percent of the questions; $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown build)."
    echo
    echo "| set | questions | base greedy | sampling pass@1 / pass@$K / consensus@$K by temperature | best sampling pass@1 / pass@$K | $NAME pass@1 / pass@3 / pass@$K / consensus@$K | $NAME: distinct top programs / lists |"
    echo "|---|---|---|---|---|---|---|"
    for s in $SETS; do
        IFS=: read -r set start limit <<EOF
$s
EOF
        greedy= by_t= best1= bestk= n=
        for t in $TEMPS; do
            j=$(summary "$OUT/base-t$t-$set.jsonl") || { by_t="$by_t T $t (not run);"; continue; }
            n=$(field "$j" questions) greedy=$(field "$j" pass_at_k 1)
            p1=$(field "$j" base_sampling_pass_at_k 1) pk=$(field "$j" base_sampling_pass_at_k "$K")
            by_t="$by_t T $t: $(pct "$p1") / $(pct "$pk") / $(pct "$(field "$j" base_sampling_consensus_at_k "$K")");"
            best1=$(awk -v a="$best1" -v b="$p1" 'BEGIN { print (a == "" || b > a) ? b : a }')
            bestk=$(awk -v a="$bestk" -v b="$pk" 'BEGIN { print (a == "" || b > a) ? b : a }')
        done
        pred="(not run)" distinct=
        if j=$(summary "$OUT/$NAME-$set.jsonl"); then
            n=${n:-$(field "$j" questions)}
            pred="$(pct "$(field "$j" pass_at_k 1)") / $(pct "$(field "$j" pass_at_k 3)") / $(pct "$(field "$j" pass_at_k "$K")") / $(pct "$(field "$j" consensus_at_k "$K")")"
            distinct="$(field "$j" distinct_top_programs) / $(field "$j" distinct_program_lists)"
        fi
        echo "| $set [$start, $((start + limit))) | ${n:--} | $(pct "$greedy") |${by_t%;} | $(pct "$best1") / $(pct "$bestk") | $pred | $distinct |"
    done
    echo
    echo "Paired pass@$K: questions only $NAME's $K programs answer / only the $K samples / both; exact two-sided McNemar p"
    echo "(polar eval --compare $NAME-SET.jsonl --with base-tT-SET.jsonl --lists runs,samples -k $K)."
    echo
    echo "| set |$(for t in $TEMPS; do printf ' T %s |' "$t"; done)"
    echo "|---|$(for t in $TEMPS; do printf -- '---|'; done)"
    for s in $SETS; do
        set=${s%%:*} row=
        for t in $TEMPS; do
            c=$("$POLAR" eval --compare "$OUT/$NAME-$set.jsonl" --with "$OUT/base-t$t-$set.jsonl" --lists runs,samples \
                -k "$K" --summary /dev/stdout 2>/dev/null | grep -o "{\"k\":$K,[^}]*}" | head -n 1) || c=
            if [ -n "$c" ]; then
                row="$row $(field "$c" a_only) / $(field "$c" b_only) / $(field "$c" both), p $(awk -v p="$(field "$c" p)" \
                    'BEGIN { if (p < 0.001) print "< 0.001"; else printf "%.3f", p }') |"
            else
                row="$row (not run) |"
            fi
        done
        echo "| $set |$row"
    done
} | tee "$OUT/table.md"
