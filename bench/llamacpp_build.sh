#!/bin/sh
# llama.cpp's tools for this CPU, for the comparison scripts (not part of make
# test): from the PyPI source package llama-cpp-python (a registry download,
# no other network), configured once into .deps/llama.cpp (ignored by git)
# with GGML_NATIVE, each TARGET built when missing.
#
#   sh bench/llamacpp_build.sh TARGET...    (llama-bench, llama-perplexity, llama-quantize, ...)
#
# Prints the folder of the binaries. LLAMA_CPP_PYTHON picks the version.
set -eu
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS=$ROOT/.deps/llama.cpp
BIN=$DEPS/build/bin
SRC=$DEPS/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
CMAKE=cmake
for target in "$@"; do
    [ -x "$BIN/$target" ] && continue
    echo "building $target from llama-cpp-python $LLAMA_CPP_PYTHON (once, into $DEPS)..." >&2
    mkdir -p "$DEPS"
    if [ ! -d "$SRC" ]; then
        python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$DEPS"
        tar xzf "$DEPS/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$DEPS"
    fi
    if ! command -v cmake >/dev/null 2>&1; then
        [ -x "$DEPS/cmake/bin/cmake" ] || PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --target "$DEPS/cmake" cmake
        CMAKE="$DEPS/cmake/bin/cmake"
        export PYTHONPATH="$DEPS/cmake${PYTHONPATH:+:$PYTHONPATH}"
    fi
    [ -f "$DEPS/build/CMakeCache.txt" ] ||
        "$CMAKE" -S "$SRC" -B "$DEPS/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$DEPS/cmake.log" 2>&1 ||
        { echo "llamacpp_build.sh: error: cmake configure failed, see $DEPS/cmake.log" >&2; exit 1; }
    "$CMAKE" --build "$DEPS/build" --target "$target" -j "$(nproc)" >>"$DEPS/cmake.log" 2>&1 ||
        { echo "llamacpp_build.sh: error: building $target failed, see $DEPS/cmake.log" >&2; exit 1; }
done
echo "$BIN"
