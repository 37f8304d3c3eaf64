#!/bin/bash
# Run the test programs and the CLI tests; print each job's cases as it
# ends and finish with "N passed, M failed". A job that dies (signal,
# non-zero exit without a FAIL line) counts as one more failure.
#
#   bash tests/run.sh [-j N] [NAME...]
#
# -j N: N jobs at a time (independent processes; default 1). NAMEs keep the
# jobs whose name is one of them or starts with one and a space (test_cuda
# keeps "test_cuda (forward)" and the other orders); shell patterns work
# (test_c*). The environment variables make test sets say which builds and
# tools are there (see the Makefile).
BUILD=${BUILD:-build}
export BUILD
max_jobs=1
while [ $# -gt 0 ]; do
    case $1 in
    -j) max_jobs=$2; shift 2 ;;
    -j*) max_jobs=${1#-j}; shift ;;
    *) break ;;
    esac
done
case $max_jobs in '' | *[!0-9]* | 0) echo "tests/run.sh: -j takes a whole number of jobs, not '$max_jobs'" >&2; exit 2 ;; esac
filters=("$@")
# several jobs at once: their OpenMP threads sleep rather than spin while they wait
[ "$max_jobs" -gt 1 ] && export OMP_WAIT_POLICY=passive
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
n=0
passed=0
failed=0
shown=0
names=()

wanted() {
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do
        # shellcheck disable=SC2254 # the filters are patterns
        case "$1" in $f | "$f "*) return 0 ;; esac
    done
    return 1
}

# Print every finished job not printed yet, in the order the jobs started,
# stopping at the first still running.
show() {
    while [ "$shown" -lt "$n" ] && [ -f "$dir/$shown.rc" ]; do
        local log=$dir/$shown.log rc p f
        read -r rc took <"$dir/$shown.rc"
        echo "== ${names[$shown]} (${took} s)"
        cat "$log"
        p=$(grep -c '^PASS ' "$log")
        f=$(grep -c '^FAIL ' "$log")
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "FAIL ${names[$shown]} (exited with status $rc)"
            f=1
        fi
        passed=$((passed + p))
        failed=$((failed + f))
        shown=$((shown + 1))
    done
}

# run NAME CMD...: one job.
run() {
    local name=$1
    shift
    wanted "$name" || return 0
    while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do
        wait -n
        show
    done
    names[n]=$name
    (
        t0=$(date +%s%N)
        "$@" >"$dir/$n.log" 2>&1
        rc=$?
        t1=$(date +%s%N)
        echo "$rc $(((t1 - t0) / 1000000000)).$((((t1 - t0) / 100000000) % 10))" >"$dir/$n.tmp"
        mv "$dir/$n.tmp" "$dir/$n.rc" # whole, for show()
    ) &
    n=$((n + 1))
}

# The jobs start longest first (a race check, the emulated kernel and model
# tests, the CLI script), so that with -j the short ones fill in beside them.
#
# Data races (tests/cuda_emu/race.h), when make test could build the kernels
# with ThreadSanitizer (POLAR_CUDA_EMU_RACE: that build): the emulation's
# race self-test, then some kernel tests (make test-cuda-race runs them
# all), a process each: ThreadSanitizer's clocks keep every fiber a test made.
if [ -n "${POLAR_CUDA_EMU_RACE:-}" ]; then
    for t in $POLAR_CUDA_EMU_RACE_TESTS; do
        # shellcheck disable=SC2086 # the variable holds assignments
        run "test_cuda $t (races)" env $POLAR_CUDA_EMU_RACE_ENV "$POLAR_CUDA_EMU_RACE/tests/test_cuda" --quick "$t"
    done
    # shellcheck disable=SC2086
    run "test_cuda_emu (races)" env $POLAR_CUDA_EMU_RACE_ENV "$POLAR_CUDA_EMU_RACE/tests/test_cuda_emu"
elif [ -n "${POLAR_CUDA_EMU:-}" ]; then
    echo "== the CUDA kernels' race check skipped: the C++ compiler's ThreadSanitizer does not build or run here"
fi
# The CUDA code under the CPU emulation (tests/cuda_emu), when make test
# built it: test_cuda's kernel tests (full size) and small-model tests
# (--quick) with the threads of each block resumed in forward order, the
# emulation's self-test, test_cuda_batch (--quick) in every order, and the
# order-sensitive tests reversed and shuffled (a result that changes shows
# a missing barrier). 16 multiprocessors keep the split-K attention and
# cooperative grids small: the same code runs, with fewer idle blocks.
if [ -n "${POLAR_CUDA_EMU:-}" ]; then
    # emu WHAT ORDER ARGS...: test_cuda's tests ARGS, the threads of each block in ORDER
    emu() {
        local what=$1 order=$2
        shift 2
        run "test_cuda ($what, $order)" env POLAR_CUDA_EMU_ORDER="$order" POLAR_CUDA_EMU_SMS=16 \
            OMP_WAIT_POLICY=passive "$POLAR_CUDA_EMU/tests/test_cuda" "$@"
    }
    # shellcheck disable=SC2086 # the names are lists
    emu kernels forward $POLAR_CUDA_EMU_KERNEL_TESTS
    # shellcheck disable=SC2086
    emu models forward --quick $POLAR_CUDA_EMU_MODEL_TESTS
fi
run cli_test sh tests/cli_test.sh
# polar serve over HTTP (curl, 127.0.0.1)
run serve_test bash tests/serve_test.sh
if [ -n "${POLAR_CUDA_EMU:-}" ]; then
    run test_cuda_emu "$POLAR_CUDA_EMU/tests/test_cuda_emu"
    # the CUDA batch step against a rounding CPU batch, in every order
    for order in forward reverse random; do
        run "test_cuda_batch ($order)" env POLAR_CUDA_EMU_ORDER="$order" POLAR_CUDA_EMU_SMS=16 \
            OMP_WAIT_POLICY=passive "$POLAR_CUDA_EMU/tests/test_cuda_batch" --quick
    done
    # tensor parallel over the emulated NCCL (4 emulated GPUs) against one GPU
    run "test_cuda_batch (tensor parallel)" env POLAR_CUDA_EMU_SMS=16 OMP_WAIT_POLICY=passive \
        "$POLAR_CUDA_EMU/tests/test_cuda_batch" --quick batch_tp batch_tp_blocks batch_tp_nodes batch_tp_outputs batch_tp_refused
    for order in reverse random; do
        # shellcheck disable=SC2086
        emu "order-sensitive" $order --quick $POLAR_CUDA_EMU_ORDER_TESTS
    done
fi
# The NEON kernels under qemu-user (POLAR_NEON_RUN: qemu and its sysroot),
# when make test found the cross tools: f32 kernels, then quantized ones.
if [ -n "${POLAR_NEON_RUN:-}" ]; then
    # shellcheck disable=SC2086 # qemu and its options
    run test_simd_neon $POLAR_NEON_RUN build-neon/test_simd
    # shellcheck disable=SC2086
    run test_quant_neon $POLAR_NEON_RUN build-neon/test_quant_kernels
fi
for t in test_json test_program test_safetensors test_config test_model test_kernels test_simd test_golden \
    test_cache test_default_model test_quant test_tokenizer test_gguf test_predictor test_threads test_search test_sample \
    test_answer test_dataset test_eval test_train test_catalogue test_batch test_alloc test_perplexity test_real_models; do
    run "$t" "$BUILD/tests/$t"
done
wait
show
[ "$n" -eq 0 ] && echo "tests/run.sh: no job is called ${filters[*]}" >&2 && exit 2
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
