#!/bin/sh
# Before and after on the GPU, in one device call: the working tree's build
# against a base tree's, the same polar bench commands alternated (base,
# head, base, head, ...) so drift of the machine hits both alike. For the
# changes written without a GPU (checked only under the CUDA emulation)
# that the next lease must measure.
#
#   git archive --prefix=base/ BASE_COMMIT -- . ':!bench/results' ':!tests' | gzip >ab-base.tar.gz
#       (untracked, so it travels with the tree; 64 MiB in all)
#   sh bench/gpu_ab.sh OUT ab-base.tar.gz [ROUNDS]
#
# ROUNDS (3): alternations of each case. CASES: lines of polar bench
# arguments (default below: decode at ctx 128 on two dense presets, the MoE
# preset's 150-token forward and decode, 512- and 2048-token prefills). DEVICE
# (cuda; cpu for a smoke test of this script). HEAD_COMMIT, BASE_COMMIT:
# the commits to record where git cannot tell (a device machine gets no
# .git). The base is built once, in /tmp/polar-ab-base (kept between calls
# on a warm machine).
# Writes OUT/ab.jsonl: {"build", "commit", "round", "command", "result"}
# per run, and prints per case and build the best prefill_ms and
# decode_ms_per_token of the base program.
set -u
OUT=${1:?usage: sh bench/gpu_ab.sh OUT BASE_TAR [ROUNDS]}
TAR=${2:?usage: sh bench/gpu_ab.sh OUT BASE_TAR [ROUNDS]}
ROUNDS=${3:-3}
DEVICE=${DEVICE:-cuda}
BASE_DIR=${BASE_DIR:-/tmp/polar-ab-base}
CASES=${CASES:-"--preset llama-3.2-3b --prompt-len 128 --gen 64 --reps 3
--preset qwen2.5-3b --prompt-len 128 --gen 64 --reps 3
--preset qwen1.5-moe-a2.7b --prompt-len 150 --gen 16 --reps 3
--preset llama-3.2-3b --prompt-len 512 --gen 1 --reps 3
--preset llama-3.2-3b --prompt-len 2048 --gen 1 --reps 3"}
target=cuda bin=build-cuda/polar
[ "$DEVICE" = cuda ] || target=all bin=build/polar
mkdir -p "$OUT" "$BASE_DIR"

make -j"$(nproc)" "$target" >"$OUT/build-head.log" 2>&1 || { echo "head build failed: see $OUT/build-head.log"; exit 1; }
if [ ! -x "$BASE_DIR/base/$bin" ]; then
    tar -xf "$TAR" -C "$BASE_DIR" || { echo "cannot unpack $TAR into $BASE_DIR"; exit 1; }
    make -C "$BASE_DIR/base" -j"$(nproc)" "$target" >"$OUT/build-base.log" 2>&1 ||
        { echo "base build failed: see $OUT/build-base.log"; exit 1; }
fi
# the commits: git archive writes the base's into the tarball
head_commit=${HEAD_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo head)}
base_commit=${BASE_COMMIT:-$( (gzip -dc "$TAR" 2>/dev/null || cat "$TAR") | git get-tar-commit-id 2>/dev/null)}
[ -n "$base_commit" ] || base_commit=base

# run BUILD BIN ROUND ARGS...: one JSON line in ab.jsonl
run() {
    build=$1 polar=$2 round=$3
    shift 3
    commit=$head_commit
    [ "$build" = base ] && commit=$base_commit
    if res=$("$polar" bench --device "$DEVICE" --json "$@" 2>"$OUT/err.txt" | head -n 1); then
        printf '{"build":"%s","commit":"%s","round":%d,"command":"polar bench --device %s --json %s","result":%s}\n' \
            "$build" "$commit" "$round" "$DEVICE" "$*" "$res" >>"$OUT/ab.jsonl"
    else
        echo "$build $*: FAILED: $(cat "$OUT/err.txt")"
    fi
}

printf '%s\n' "$CASES" | while IFS= read -r args; do
    [ -n "$args" ] || continue
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        # shellcheck disable=SC2086 # args is a list
        run base "$BASE_DIR/base/$bin" "$r" $args
        # shellcheck disable=SC2086
        run head "./$bin" "$r" $args
        r=$((r + 1))
    done
done
rm -f "$OUT/err.txt"

# the best of the rounds, per case and build (the first run: the base program)
[ -f "$OUT/ab.jsonl" ] || { echo "no results"; exit 1; }
awk '
function field(line, key,    i, rest) {
    i = index(line, "\"" key "\":")
    if (!i) return ""
    rest = substr(line, i + length(key) + 3)
    return substr(rest, 1, match(rest, /[,}]/) - 1) + 0
}
{
    cmd = $0; sub(/.*"command":"/, "", cmd); sub(/".*/, "", cmd)
    b = $0; sub(/.*"build":"/, "", b); sub(/".*/, "", b)
    k = cmd SUBSEP b
    p = field($0, "prefill_ms"); d = field($0, "decode_ms_per_token")
    if (!(k in pre) || p < pre[k]) pre[k] = p
    if (!(k in dec) || d < dec[k]) dec[k] = d
    if (!(cmd in seen)) { seen[cmd] = 1; order[++n] = cmd }
}
END {
    for (i = 1; i <= n; i++) {
        c = order[i]; pb = pre[c SUBSEP "base"]; db = dec[c SUBSEP "base"]
        printf "%s\n  base: prefill %.3f ms, decode %.4f ms/token\n  head: prefill %.3f ms, decode %.4f ms/token (%s, %s)\n",
            c, pb, db, pre[c SUBSEP "head"], dec[c SUBSEP "head"],
            (pb > 0 ? sprintf("%.3fx", pre[c SUBSEP "head"] / pb) : "-"),
            (db > 0 ? sprintf("%.3fx", dec[c SUBSEP "head"] / db) : "-")
    }
}' "$OUT/ab.jsonl"
