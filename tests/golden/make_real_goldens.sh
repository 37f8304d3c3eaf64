#!/bin/sh
# The real-model goldens of tests/test_real_models.c, written once (not by
# make test): for each model NAME installed by `make models`,
#   tests/golden/real/NAME.llama.safetensors      by llama.cpp itself
#       (make_real_goldens.py on llama-cpp-python==0.3.36 built from source
#       for this CPU, with numpy and jinja2, into .deps/llama-py);
#   tests/golden/real/NAME.reference.safetensors  by polar's reference CPU
#       level on llama.cpp's tokens (test_real_models --measure under
#       POLAR_CPU=reference).
#
#   sh tests/golden/make_real_goldens.sh [NAME...]   (default: both real models)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=$ROOT/.deps/llama-py
VERSION=0.3.36
[ $# -gt 0 ] || set -- qwen2.5-coder-0.5b qwen2.5-coder-1.5b
if ! PYTHONPATH=$PY python3 -c "import llama_cpp, numpy, jinja2" 2>/dev/null; then
    echo "building llama-cpp-python $VERSION for this CPU into $PY (several minutes)..." >&2
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" python3 -m pip install --quiet --target "$PY" \
        --no-binary llama-cpp-python "llama-cpp-python==$VERSION" numpy jinja2 diskcache typing-extensions
fi
make --no-print-directory build/tests/test_real_models >/dev/null
mkdir -p tests/golden/real
for name in "$@"; do
    make --no-print-directory ".deps/models/$name.gguf"
    model=.deps/models/$name.gguf
    llama=tests/golden/real/$name.llama.safetensors
    ref=tests/golden/real/$name.reference.safetensors
    PYTHONPATH=$PY python3 tests/golden/make_real_goldens.py "$model" "$llama"
    rm -f "$ref"
    POLAR_CPU=reference build/tests/test_real_models --measure "$model" "$llama" "$ref.none" "$ref.tmp"
    mv "$ref.tmp" "$ref"
    echo "$ref: polar's reference level"
done
