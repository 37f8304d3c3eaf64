#!/bin/sh
# llama.cpp's tools for this CPU, for the comparison scripts (not part of make
# test): from the PyPI source package llama-cpp-python (a registry download,
# no other network), configured once into .deps/llama.cpp (ignored by git),
# each TARGET built when missing.
#
#   sh bench/llamacpp_build.sh TARGET...    (llama-bench, llama-perplexity, llama-quantize, ...)
#
# Prints the folder of the binaries. LLAMA_CPP_PYTHON picks the version.
# LLAMACPP_LEVEL picks the instructions, matching polar's POLAR_CPU levels:
# native (the default: GGML_NATIVE, into .deps/llama.cpp/build), or generic,
# avx2, avx2vnni, avx512, avx512vnni (GGML_NATIVE off and that level's
# instructions only, x86, each in .deps/llama.cpp/build-LEVEL).
set -eu
LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
LEVEL=${LLAMACPP_LEVEL:-native}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS=$ROOT/.deps/llama.cpp
OFF="-DGGML_NATIVE=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF"
AVX2="-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
case $LEVEL in
native) ISA="-DGGML_NATIVE=ON" ;;
generic) ISA="$OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF
    -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF" ;;
avx2) ISA="$OFF $AVX2 -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF" ;;
avx2vnni) ISA="$OFF $AVX2 -DGGML_AVX_VNNI=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF" ;;
avx512) ISA="$OFF $AVX2 -DGGML_AVX_VNNI=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=OFF" ;;
avx512vnni) ISA="$OFF $AVX2 -DGGML_AVX_VNNI=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON" ;;
*) echo "llamacpp_build.sh: error: LLAMACPP_LEVEL=$LEVEL is not native, generic, avx2, avx2vnni, avx512 or avx512vnni" >&2
    exit 2 ;;
esac
BUILD=$DEPS/build-$LEVEL
[ "$LEVEL" != native ] || BUILD=$DEPS/build
BIN=$BUILD/bin
SRC=$DEPS/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
CMAKE=cmake
for target in "$@"; do
    [ -x "$BIN/$target" ] && continue
    echo "building $target ($LEVEL) from llama-cpp-python $LLAMA_CPP_PYTHON (once, into $BUILD)..." >&2
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
    # shellcheck disable=SC2086 # ISA: one -D option a word
    [ -f "$BUILD/CMakeCache.txt" ] ||
        "$CMAKE" -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release $ISA -DLLAMA_CURL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$BUILD.log" 2>&1 ||
        { echo "llamacpp_build.sh: error: cmake configure failed, see $BUILD.log" >&2; exit 1; }
    "$CMAKE" --build "$BUILD" --target "$target" -j "$(nproc)" >>"$BUILD.log" 2>&1 ||
        { echo "llamacpp_build.sh: error: building $target failed, see $BUILD.log" >&2; exit 1; }
done
echo "$BIN"
