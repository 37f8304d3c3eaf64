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
    test_answer test_dataset test_eval test_train; do
    run "$t" "$BUILD/tests/$t"
done
# The NEON kernels under qemu-user, when make test found the cross tools.
if [ -n "${POLAR_NEON_TEST:-}" ]; then
    run test_simd_neon $POLAR_NEON_TEST
fi
run cli_test sh tests/cli_test.sh
rm -f "$log"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
