#!/bin/sh
# Run every test program and the CLI tests; print each case and end with
# "N passed, M failed". A program that dies (signal, non-zero exit without a
# FAIL line) counts as one more failure.
BUILD=${BUILD:-build}
export BUILD
passed=0
failed=0
log=$(mktemp)
run() {
    name=$1
    shift
    "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    p=$(grep -c '^PASS ' "$log")
    f=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name (exited with status $rc)"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}
for t in test_json test_program test_safetensors test_config test_model test_kernels test_simd test_golden \
    test_cache test_default_model test_quant test_tokenizer test_gguf test_predictor test_threads test_search test_sample \
    test_answer test_dataset test_eval test_train test_batch test_alloc; do
    run "$t" "$BUILD/tests/$t"
done
# The NEON kernels under qemu-user (POLAR_NEON_RUN: qemu and its sysroot),
# when make test found the cross tools: f32 kernels, then quantized ones.
if [ -n "${POLAR_NEON_RUN:-}" ]; then
    run test_simd_neon $POLAR_NEON_RUN build-neon/test_simd
    run test_quant_neon $POLAR_NEON_RUN build-neon/test_quant_kernels
fi
# The CUDA code under the CPU emulation (tests/cuda_emu), when make test
# built it: the emulation's self-test, then test_cuda's kernel tests (full
# size) and small-model tests (--quick) and test_cuda_batch (--quick) with the threads of each block
# resumed in forward order, and the order-sensitive ones reversed and
# shuffled (a result that changes shows a missing barrier). 16
# multiprocessors keep the split-K attention and cooperative grids small:
# the same code runs, with fewer idle blocks.
if [ -n "${POLAR_CUDA_EMU:-}" ]; then
    run test_cuda_emu "$POLAR_CUDA_EMU/tests/test_cuda_emu"
    emu() {
        order=$1
        shift
        echo "== test_cuda under the CUDA emulation, thread order $order: $*"
        run "test_cuda ($order)" env POLAR_CUDA_EMU_ORDER="$order" POLAR_CUDA_EMU_SMS=16 OMP_WAIT_POLICY=passive \
            "$POLAR_CUDA_EMU/tests/test_cuda" "$@"
    }
    # shellcheck disable=SC2086 # the names are lists
    emu forward $POLAR_CUDA_EMU_KERNEL_TESTS
    # shellcheck disable=SC2086
    emu forward --quick $POLAR_CUDA_EMU_MODEL_TESTS
    for order in reverse random; do
        # shellcheck disable=SC2086
        emu $order --quick $POLAR_CUDA_EMU_ORDER_TESTS
    done
    # the CUDA batch step against a rounding CPU batch, in every order
    for order in forward reverse random; do
        run "test_cuda_batch ($order)" env POLAR_CUDA_EMU_ORDER="$order" POLAR_CUDA_EMU_SMS=16 \
            OMP_WAIT_POLICY=passive "$POLAR_CUDA_EMU/tests/test_cuda_batch" --quick
    done
    # Data races (tests/cuda_emu/race.h), when make test could build the
    # kernels with ThreadSanitizer (POLAR_CUDA_EMU_RACE: that build): the
    # emulation's race self-test, then some kernel tests (make
    # test-cuda-race runs them all).
    if [ -n "${POLAR_CUDA_EMU_RACE:-}" ]; then
        echo "== the CUDA emulation with ThreadSanitizer: $POLAR_CUDA_EMU_RACE_TESTS"
        # shellcheck disable=SC2086 # the variable holds assignments; the names are a list
        run "test_cuda_emu (races)" env $POLAR_CUDA_EMU_RACE_ENV "$POLAR_CUDA_EMU_RACE/tests/test_cuda_emu"
        # a process each: ThreadSanitizer's clocks keep every fiber a test made
        for t in $POLAR_CUDA_EMU_RACE_TESTS; do
            # shellcheck disable=SC2086
            run "test_cuda $t (races)" env $POLAR_CUDA_EMU_RACE_ENV "$POLAR_CUDA_EMU_RACE/tests/test_cuda" --quick "$t"
        done
    else
        echo "== the CUDA kernels' race check skipped: the C++ compiler's ThreadSanitizer does not build or run here"
    fi
fi
run cli_test sh tests/cli_test.sh
rm -f "$log"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
