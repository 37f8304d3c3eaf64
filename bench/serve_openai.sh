#!/bin/sh
# The official openai Python client against polar serve (bench/serve_openai.py):
# the client pip-installed into a virtualenv (.deps/openai-venv, once), a
# server on a free port of 127.0.0.1 with the default model and an API key,
# the checks, then SIGTERM. Not part of make test (it needs the network once,
# for pip).
#
#   sh bench/serve_openai.sh [BUILD]     (BUILD: the build folder, default build)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
POLAR=$ROOT/$BUILD/polar
VENV=${POLAR_OPENAI_VENV:-$ROOT/.deps/openai-venv}
[ -x "$POLAR" ] || { echo "serve_openai.sh: error: $POLAR is missing (run make)" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
    python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet openai ||
        { echo "serve_openai.sh: error: cannot install the openai client into $VENV" >&2; exit 1; }
fi
D=$(mktemp -d)
KEY=openai-test-key
"$POLAR" serve --port 0 --ctx 1024 --max-batch 8 --api-key "$KEY" >"$D/out" 2>"$D/err" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; rm -rf "$D"' EXIT
PORT=
for _ in $(seq 600); do
    PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$D/out")
    [ -n "$PORT" ] && break
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "serve_openai.sh: error: the server did not start: $(cat "$D/err")" >&2; exit 1; }
"$VENV/bin/python" "$ROOT/bench/serve_openai.py" --url "http://127.0.0.1:$PORT/v1" --api-key "$KEY" --polar "$POLAR"
rc=$?
kill -TERM "$SERVER"
wait "$SERVER" || rc=1
exit $rc
