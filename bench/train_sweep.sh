#!/bin/sh
# The paper's training recipe for the predictor (its appendix "Training
# Configuration"): AdamW with a cosine schedule and linear warm-up, the
# learning rate, batch size and number of epochs chosen on the validation
# split from {1e-4, 3e-4, 5e-4, 8e-4, 1e-3, 3e-3} x {32, 128, 256} x {3, 10}.
# One `polar train` per point of the grid, every one on the same labels,
# encoder, seed and validation questions (the last sixth, as polar train
# splits them), the questions encoded once (one --features-cache for all);
# the point with the lowest validation loss (each run keeps its best epoch)
# is copied to OUT/best.safetensors. Not part of make test.
#
#   sh bench/train_sweep.sh OUT --labels FILE... [--lrs "1e-4 ..."] [--batches "32 128 256"]
#                           [--epochs "3 10"] [--warmup 10] [--seed 1] [--select loss|beam|catalogue]
#                           [-- TRAIN_OPTIONS...]
#
# --select beam|catalogue (not the paper's recipe): each run keeps the epoch,
# and the sweep the point, whose top 5 by that decoder hold a valid program
# for the most validation questions, ties to the lower validation loss.
#
# OUT/sweep.md: one row per point (the saved epoch, its validation loss, steps, and
# for how many questions its top program is valid, by the beam and decoding the
# catalogue, beside the commonest program),
# sorted as --select chooses; OUT/logs/: each run's --log; OUT/runs/: each predictor.
# Options after -- go to every polar train (--model, --encoder, --dropout ...).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
POLAR=$ROOT/build/polar
OUT=${1:?usage: sh bench/train_sweep.sh OUT --labels FILE... [options] [-- TRAIN_OPTIONS...]}
shift
LABELS= LRS="1e-4 3e-4 5e-4 8e-4 1e-3 3e-3" BATCHES="32 128 256" EPOCHS="3 10" WARMUP=10 SEED=1 SELECT=loss
while [ $# -gt 0 ]; do
    case $1 in
    --) shift; break ;;
    --labels)
        shift
        while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do LABELS="$LABELS $1"; shift; done
        continue ;;
    --lrs) LRS=${2:-} ;;
    --batches) BATCHES=${2:-} ;;
    --epochs) EPOCHS=${2:-} ;;
    --warmup) WARMUP=${2:-} ;;
    --seed) SEED=${2:-} ;;
    --select) SELECT=${2:-} ;;
    *) echo "train_sweep.sh: usage error: unknown option '$1'" >&2; exit 2 ;;
    esac
    [ $# -ge 2 ] || { echo "train_sweep.sh: usage error: $1 needs a value" >&2; exit 2; }
    shift 2
done
[ -n "$LABELS" ] || { echo "train_sweep.sh: usage error: --labels FILE... is required" >&2; exit 2; }
for f in $LABELS; do
    [ -e "$f" ] || [ ! -e "$f.gz" ] || { echo "train_sweep.sh: $f: only $f.gz is there; run sh bench/unpack_results.sh first" >&2; exit 2; }
done
case $SELECT in
loss) ORDER="-k1,1g" ;;
beam) ORDER="-k12,12nr -k1,1g" ;;
catalogue) ORDER="-k13,13nr -k1,1g" ;;
*) echo "train_sweep.sh: usage error: --select loss, beam or catalogue" >&2; exit 2 ;;
esac
[ -x "$POLAR" ] || make -C "$ROOT" -s all >/dev/null
mkdir -p "$OUT/logs" "$OUT/runs"
ROWS=$OUT/rows.txt
: >"$ROWS"

# best_of LOG: "val_loss epoch steps train_top1 val_top1 cat_train_top1 cat_val_top1 val_top5
# cat_val_top5" of the epoch polar train saved (the last marked best); the counts: questions
# whose top program (top 5) holds one of their valid programs
best_of() {
    grep '"best":true' "$1" | tail -n 1 | awk -F'[:,}]' '{
        for (i = 1; i < NF; i++) {
            if ($i ~ /"epoch"$/) e = $(i + 1)
            if ($i ~ /"val_loss"$/) v = $(i + 1)
            if ($i ~ /"steps"$/) s = $(i + 1)
            if ($i ~ /"train_top1_valid"$/) t1 = $(i + 1)
            if ($i ~ /"val_top1_valid"$/) v1 = $(i + 1)
            if ($i ~ /"catalogue_train_top1_valid"$/) c1 = $(i + 1)
            if ($i ~ /"catalogue_val_top1_valid"$/) cv = $(i + 1)
            if ($i ~ /^"val_top5_valid"$/) v5 = $(i + 1)
            if ($i ~ /"catalogue_val_top5_valid"$/) c5 = $(i + 1)
        }
        print v, e, s, t1, v1, c1, cv, v5, c5
    }'
}

for lr in $LRS; do
    for b in $BATCHES; do
        for e in $EPOCHS; do
            name=lr$lr-b$b-e$e
            t0=$(date +%s)
            # shellcheck disable=SC2086
            if ! "$POLAR" train --labels $LABELS --lr "$lr" --batch "$b" --epochs "$e" --warmup "$WARMUP" --seed "$SEED" \
                --features-cache "$OUT/features.safetensors" --log "$OUT/logs/$name.jsonl" --select "$SELECT" \
                -o "$OUT/runs/$name.safetensors" "$@" 2>"$OUT/logs/$name.stderr"; then
                echo "train_sweep.sh: error: $name: polar train failed ($OUT/logs/$name.stderr):" >&2
                tail -n 3 "$OUT/logs/$name.stderr" >&2
                exit 1
            fi
            best=$(best_of "$OUT/logs/$name.jsonl")
            [ -n "$best" ] || { echo "train_sweep.sh: error: $name: no validation loss in its log" >&2; exit 1; }
            # "$@" holds the options for polar train: split the best epoch's fields with read, not set
            read -r vloss epoch steps top1_tr top1_va cat_tr cat_va top5_va cat5_va <<EOF
$best
EOF
            echo "$vloss $epoch $steps $lr $b $e $(($(date +%s) - t0)) $top1_tr $top1_va $cat_tr $cat_va $top5_va $cat5_va" \
                >>"$ROWS"
            echo "$name: saved epoch $epoch (validation loss $vloss, $steps steps); top program valid for" \
                "$top1_tr training, $top1_va validation questions ($cat_tr and $cat_va decoding the catalogue)" >&2
        done
    done
done

# shellcheck disable=SC2086
sort $ORDER "$ROWS" -o "$ROWS"
set -- $(head -n 1 "$ROWS")
cp "$OUT/runs/lr$4-b$5-e$6.safetensors" "$OUT/best.safetensors"
ERR=$OUT/logs/lr$4-b$5-e$6.stderr
commonest=$(sed -n 's/^the commonest valid program of the training questions: \([^ ]*\) .*/\1/p' "$ERR")
saved=$(sed -n 's/^saved epoch [0-9]* ([^)]*): top program valid for [0-9]* of \([0-9]*\) training questions (the commonest program: \([0-9]*\)), [0-9]* of \([0-9]*\) validation (\([0-9]*\)).*/\2 of \1 training and \4 of \3 validation questions/p' "$ERR")
[ -n "$commonest" ] && [ -n "$saved" ] ||
    { echo "train_sweep.sh: error: $ERR: no commonest program or no 'saved epoch' line" >&2; exit 1; }
{
    echo "| lr | batch | epochs | validation loss | saved epoch | steps then | top program valid: training / validation questions | the same, decoding the catalogue | validation questions with a valid program in the top 5: beam / catalogue | seconds |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    awk '{ printf "| %s | %s | %s | %.4f | %s | %s | %s / %s | %s / %s | %s / %s | %s |\n", $4, $5, $6, $1, $2, $3, $8, $9, $10, $11, $12, $13, $7 }' "$ROWS"
    echo
    echo "Beside it, the commonest valid program of the training questions, $commonest, is valid for $saved"
    echo "(what a predictor that gives every question the same top program gets)."
    echo
    echo "Chosen by --select $SELECT: lr $4, batch $5, $6 epochs (epoch $2, validation loss $1): $OUT/best.safetensors."
    echo "Warm-up $WARMUP steps, seed $SEED; labels:$LABELS"
} | tee "$OUT/sweep.md"
