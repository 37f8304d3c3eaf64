#!/bin/sh
# Unpacks the committed results' gzipped JSONL (labels, eval records) beside
# themselves, so the commands in their READMEs and the label-files lists run
# as written. The copies are in bench/results/.gitignore: they are never
# tracked and never travel to a GPU lease (its tree is capped at 64 MiB).
# A copy newer than its .gz is kept: a resumed search may have grown it;
# `gzip -9 -n -c F > F.gz` puts it back before committing.
#
#   sh bench/unpack_results.sh [FOLDER...]   (default: all of bench/results)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "$ROOT/bench/results"
n=0 kept=0
for f in $(find "$@" -name '*.jsonl.gz' | sort); do
    out=${f%.gz}
    if [ -e "$out" ] && [ "$out" -nt "$f" ]; then
        kept=$((kept + 1))
        continue
    fi
    gzip -dc "$f" >"$out.tmp" || { rm -f "$out.tmp"; echo "unpack_results.sh: error: $f: cannot unpack" >&2; exit 1; }
    mv "$out.tmp" "$out"
    n=$((n + 1))
done
echo "unpack_results.sh: $n unpacked, $kept kept (newer than their .gz)"
