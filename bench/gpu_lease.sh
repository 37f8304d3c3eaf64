#!/bin/sh
# A whole GPU lease in one device call that must end by a deadline: build,
# test, measure, sanitize, in order of what matters most, each step given
# what is left of the time. A device session now gets 15 minutes in all
# (the machine's start included), so there is one call, not four. On an
# H200 (2026-11-26) it took 414 s, the evidence step (then capped at 150 s)
# cut off before the predictor and the A/B (then 120 s) after two rounds.
#
#   sh bench/gpu_lease.sh OUT [COMMIT]
# DEADLINE (555): seconds from the start by which every step has ended.
# BASE_TAR (ab-base.tar.gz): a base tree for bench/gpu_ab.sh (the commit last
# measured on a GPU; BASE_COMMIT names it); missing: the A/B step is skipped. The other knobs are
# gpu_evidence.sh's and gpu_ab.sh's, set below to what fits.
#
# Steps write into a work folder; after each step it is packed into
# OUT/lease.tar.gz (one file: a device call returns at most 8), so a step
# killed at the deadline still leaves the ones before it. A line per step
# (name, exit status, seconds) goes to stdout and OUT/steps.txt.
set -u
OUT=${1:?usage: sh bench/gpu_lease.sh OUT [COMMIT]}
COMMIT=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
DEADLINE=${DEADLINE:-555}
BASE_TAR=${BASE_TAR:-ab-base.tar.gz}
R=/tmp/polar-lease
rm -rf "$R"
mkdir -p "$OUT" "$R"
start=$(date +%s)
jobs=$(nproc)

pack() { tar -czf "$OUT/lease.tar.gz" -C "$R" . 2>/dev/null; }

# step NAME CAP COMMAND...: runs COMMAND with at most CAP seconds, never past
# the deadline (less 10 s to pack); skipped when under 15 s are left.
step() {
    name=$1 cap=$2
    shift 2
    left=$((DEADLINE - ($(date +%s) - start) - 10))
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 15 ]; then
        echo "$name: skipped (deadline)" | tee -a "$OUT/steps.txt"
        return
    fi
    t0=$(date +%s)
    timeout -k 5 "$cap" "$@" >"$R/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc, $(($(date +%s) - t0)) s (cap $cap s)" | tee -a "$OUT/steps.txt"
    pack
}

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    echo "commit $COMMIT"
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
    nvcc --version | tail -n 2
} >"$R/smi.txt" 2>&1

# The base tree builds alongside the tests (CPU only; the tests' CPU
# references slow down a little, their results do not change).
if [ -f "$BASE_TAR" ]; then
    (mkdir -p /tmp/polar-ab-base && tar -xzf "$BASE_TAR" -C /tmp/polar-ab-base &&
        nice make -C /tmp/polar-ab-base/base -j"$jobs" cuda >"$R/build-base.log" 2>&1) &
fi
step build 240 sh -c "make -j$jobs cuda && make -j$jobs CUDA=1 build-cuda/tests/test_cuda build-cuda/tests/test_cuda_batch \
    build-cuda/tests/mkgguf build-cuda/tests/mkpredictor"
[ -x build-cuda/polar ] || { tail -n 30 "$R/build.log"; exit 1; }

step test_cuda 200 ./build-cuda/tests/test_cuda
step test_cuda_batch 100 ./build-cuda/tests/test_cuda_batch
echo "tests: $(cat "$R"/test_cuda*.log | grep -c '^PASS') passed, $(cat "$R"/test_cuda*.log | grep -c '^FAIL') failed"
grep -h -B3 "^FAIL" "$R"/test_cuda*.log

# Issue 43: a GGUF's blocks kept on the GPU against the same file uploaded
# as bf16 (POLAR_CUDA_BLOCKS=0), alternated: an 8-layer Llama-3.2-1B-shaped
# Q4_K_M (tied Q6_K head), decode at ctx 128 and a 512-token prefill. Blocks
# twice: every kept type by dp4a on quantized inputs (q8=1, the default since
# 2026-11-27, after the H200 run) and unpacked to f32 as on 2026-11-27
# (POLAR_CUDA_BLOCKS_Q8=0, there 2.9x slower than bf16); the prefill by the
# fused WMMA tiles (the default since) and by the chunked dequantization for
# cuBLASLt of that run (POLAR_CUDA_BLOCKS_GEMM=chunked); decode with each
# warp's rows staged in shared memory by cp.async while the block quantizes
# its inputs (POLAR_CUDA_BLOCKS_STAGE=1, emulation only until this run).
# The prefetch and fused-merge switches were measured then (slower: docs/cuda.md).
step blocks 180 env COMMIT="$COMMIT" OUTFILE="$R/blocks.jsonl" sh -c '
    ./build-cuda/tests/mkgguf llama-3.2-1b /tmp/polar-q4km.gguf q4_k_m 1 8 || exit 1
    for rep in 1 2; do for cfg in "1 1 fused 0" "1 1 fused 1" "1 0 fused 0" "0 1 fused 0" "1 1 chunked 0"; do
        for len in "128 --gen 32" "512 --gen 1"; do
        set -- $cfg
        [ "$4" = 1 ] && [ "${len%% *}" = 512 ] && continue # staging is a decode GEMV matter
        POLAR_CUDA_BLOCKS=$1 POLAR_CUDA_BLOCKS_Q8=$2 POLAR_CUDA_BLOCKS_GEMM=$3 POLAR_CUDA_BLOCKS_STAGE=$4 \
            ./build-cuda/polar bench --device cuda --json --model /tmp/polar-q4km.gguf --prompt-len $len --reps 2 \
            >/tmp/polar-blocks.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"blocks\":$1,\"q8\":$2,\"gemm\":\"$3\",\"stage\":$4,\"result\":/; s/\$/}/" \
            /tmp/polar-blocks.json >>"$OUTFILE"
    done; done; done'

# The routed experts kept as blocks (since 2026-11-27, emulation only): a
# 2-layer Qwen1.5-MoE-shaped Q4_K_M, decode at ctx 128, blocks against bf16.
step blocks_moe 90 env COMMIT="$COMMIT" OUTFILE="$R/blocks.jsonl" sh -c '
    ./build-cuda/tests/mkgguf qwen1.5-moe-a2.7b /tmp/polar-moe-q4km.gguf q4_k_m 1 2 || exit 1
    for rep in 1 2; do for b in 1 0; do
        POLAR_CUDA_BLOCKS=$b ./build-cuda/polar bench --device cuda --json --model /tmp/polar-moe-q4km.gguf \
            --prompt-len 128 --gen 16 --reps 2 >/tmp/polar-blocks.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"blocks\":$b,\"q8\":1,\"gemm\":\"fused\",\"stage\":0,\"result\":/; s/\$/}/" /tmp/polar-blocks.json \
            >>"$OUTFILE"
    done; done'

# Issue 42 item 4: passes of 3-8 tokens over bf16 weights on the tensor-core
# GEMV (POLAR_CUDA_MMA_GEMV=1, emulation only until this run) against
# cuBLASLt (the default: batch 8 1.70 ms a step against 1.107 for batch 1 on
# the 2026-11-27 H200), alternated, 1B preset.
step mma 90 env COMMIT="$COMMIT" OUTFILE="$R/mma.jsonl" sh -c '
    for rep in 1 2; do for v in 0 1; do
        POLAR_CUDA_MMA_GEMV=$v ./build-cuda/polar bench --device cuda --json --preset llama-3.2-1b \
            --batch 1,3,4,8 --prompt-len 128 --gen 32 --reps 2 >/tmp/polar-mma.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"mma\":$v,\"result\":/; s/\$/}/" /tmp/polar-mma.json >>"$OUTFILE"
    done; done'

# Issue 42 item 3: RoPE and the K/V store in the q/k/v GEMV's epilogue
# (POLAR_CUDA_FUSED_ROPE=1: one launch a dense layer fewer, the same bits;
# emulation only until this run) against the separate kernel, alternated,
# 1B preset at ctx 128 and 2048 (the prefetch and fused merge were slower on
# 2026-11-27).
step rope 80 env COMMIT="$COMMIT" OUTFILE="$R/rope.jsonl" sh -c '
    for rep in 1 2; do for v in 0 1; do for len in 128 2048; do
        POLAR_CUDA_FUSED_ROPE=$v ./build-cuda/polar bench --device cuda --json --preset llama-3.2-1b \
            --prompt-len $len --gen 32 --reps 2 >/tmp/polar-rope.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"fused_rope\":$v,\"result\":/; s/\$/}/" /tmp/polar-rope.json >>"$OUTFILE"
    done; done; done'

# Issue 42 item 2: the bf16 GEMVs' loads as a ring (POLAR_CUDA_GEMV_RING=1:
# U loads a lane in flight to a row's end, the same bits; emulation only
# until this run) against groups of U, alternated: the 3B preset (3072
# columns: a decode step's q/k/v, o and gate/up had 4 of 12 steps one load
# at a time) and the 1B (2048: no such tail), ctx 128.
step ring 80 env COMMIT="$COMMIT" OUTFILE="$R/ring.jsonl" sh -c '
    for rep in 1 2; do for v in 0 1; do for preset in llama-3.2-3b llama-3.2-1b; do
        POLAR_CUDA_GEMV_RING=$v ./build-cuda/polar bench --device cuda --json --preset $preset \
            --prompt-len 128 --gen 32 --reps 2 >/tmp/polar-ring.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"gemv_ring\":$v,\"result\":/; s/\$/}/" /tmp/polar-ring.json >>"$OUTFILE"
    done; done; done'

# Issue 42 item 5: the MoE layer's norm, router, top-k and grouping in one block
# and the shared expert inside the experts' launches (POLAR_CUDA_FUSED_ROUTE=1,
# five launches a Qwen1.5-MoE layer fewer, the same bits; emulation only until
# this run), alternated, Qwen1.5-MoE preset decode.
step route 70 env COMMIT="$COMMIT" OUTFILE="$R/route.jsonl" sh -c '
    for rep in 1 2; do for v in 0 1; do
        POLAR_CUDA_FUSED_ROUTE=$v ./build-cuda/polar bench --device cuda --json --preset qwen1.5-moe-a2.7b \
            --prompt-len 128 --gen 32 --reps 2 >/tmp/polar-route.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"fused_route\":$v,\"result\":/; s/\$/}/" /tmp/polar-route.json >>"$OUTFILE"
    done; done'

# Issue 42 item 6: the predictor's linears staging 128 columns a step
# (POLAR_CUDA_PRED_WIDE=1: a quarter of the load round trips, spills on
# sm_90; the same bits) and 32 columns through a 4-stage cp.async ring
# (POLAR_CUDA_PRED_ASYNC=1), and the LayerNorms fused into the linears after
# them (POLAR_CUDA_PRED_FUSE_NORM=1: 14 grid syncs, not 18) against 32, alternated; all with the
# encoder's states written straight into the predictor's input (since
# 2026-11-27: no pageable copies; the 0.42 ms of 2026-11-26 included them).
# A D = 16 hash predictor, a Qwen3-Embedding-0.6B-shaped encoder, 256-token questions.
step predictor 150 env COMMIT="$COMMIT" OUTFILE="$R/predictor.jsonl" sh -c '
    W=/tmp/polar-pred && mkdir -p $W && ./build-cuda/tests/mkpredictor 16 1024 $W/pred16.safetensors &&
        ./build-cuda/polar mkmodel --preset qwen3-embedding-0.6b --out $W/encoder >/dev/null &&
        gzip -dc tests/golden/tokenizer/qwen.tokenizer.json.gz >$W/encoder/tokenizer.json || exit 1
    for rep in 1 2; do for v in 0 1 2 3; do
        POLAR_CUDA_PRED_WIDE=$((v == 1)) POLAR_CUDA_PRED_ASYNC=$((v == 2)) POLAR_CUDA_PRED_FUSE_NORM=$((v == 3)) \
            ./build-cuda/polar bench --device cuda --json \
            --preset llama-3.2-1b --prompt-len 16 --gen 1 --reps 1 --predictor $W/pred16.safetensors --encoder $W/encoder \
            --question-len 256 >/tmp/polar-pred.json || exit 1
        sed "s/^/{\"commit\":\"$COMMIT\",\"pred_wide\":$((v == 1)),\"pred_async\":$((v == 2)),\"pred_fuse_norm\":$((v == 3)),\"result\":/; s/\$/}/" \
            /tmp/polar-pred.json >>"$OUTFILE"
    done; done'

# Sanitizer on the new kernels (blocks), then the A/B against
# the last GPU-measured base, before the longer benchmarks.
step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 ./build-cuda/tests/test_cuda --quick
wait # the base build
if [ -x /tmp/polar-ab-base/base/build-cuda/polar ]; then
    step ab 150 env HEAD_COMMIT="$COMMIT" BASE_COMMIT="${BASE_COMMIT:-}" CASES="--preset llama-3.2-3b --prompt-len 128 --gen 32 --reps 2
--preset llama-3.2-3b --prompt-len 512 --gen 1 --reps 2
--preset qwen1.5-moe-a2.7b --prompt-len 150 --gen 16 --reps 2" sh bench/gpu_ab.sh "$R/ab" "$BASE_TAR" 2
fi

# issue 15's GPU targets (batches 2-8 too: the multi-token GEMV's range, 3x
# slower a step than batch 32 on 2026-11-26), then issue 10's: one preset each, two reps.
step batch 150 env PRESETS= MOE= PREDICTOR=0 PDL_AB=0 COMPARE=0 TEST=0 GEN=32 REPS=2 BATCH_SIZES=1,2,4,8,16,32 \
    sh bench/gpu_evidence.sh "$R/batch" "$COMMIT"
step evidence 210 env PRESETS=llama-3.2-3b CTXS=128 PREFILLS="128 512" BATCH= COMPARE=0 TEST=0 GEN=32 REPS=2 \
    sh bench/gpu_evidence.sh "$R/evidence" "$COMMIT"
# Does initcheck see what cuBLASLt writes? kernel_prefill_ops has the bias
# kernel read a cuBLASLt product in memory nothing else wrote (its values
# checked): reports there mean it does not (2026-11-26: 100 reports of rows
# only cuBLASLt writes, in test_cuda_batch).
step initcheck_gemm 40 compute-sanitizer --tool initcheck --error-exitcode 1 ./build-cuda/tests/test_cuda --quick \
    kernel_prefill_ops
step memcheck_batch 60 compute-sanitizer --tool memcheck --error-exitcode 1 ./build-cuda/tests/test_cuda_batch --quick
step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 ./build-cuda/tests/test_cuda --quick \
    kernel_matmul kernel_rmsnorm_swiglu_argmax kernel_fused_gemv kernel_prefill_ops kernel_kv_store kernel_attention kernel_moe \
    kernel_blocks_matmul kernel_blocks_fused kernel_blocks_staged kernel_blocks_experts kernel_mma_gemv kernel_qkv_rope kernel_route_group
pack
for f in batch evidence ab; do tail -n 25 "$R/$f.log" 2>/dev/null; done
grep -o '"blocks":[0-9]\|"q8":[0-9]\|"gemm":"[a-z]*"\|"stage":[0-9]\|"model":"[^"]*"\|"prompt_len":[0-9]*\|"device_weights_vs_stored":[0-9.]*\|"decode_ms_per_token":[0-9.]*\|"prefill_ms":[0-9.]*\|"fraction_of_read":[0-9.]*' \
    "$R/blocks.jsonl" 2>/dev/null | paste -d' ' - - - - - - - - - - | sed 's/^/  blocks: /'
grep -o '"fused_rope":[0-9]*\|"prompt_len":[0-9]*\|"decode_ms_per_token":[0-9.]*\|"launches_per_step":[0-9]*' "$R/rope.jsonl" \
    2>/dev/null | paste -d' ' - - - - | sed 's/^/  rope: /'
grep -o '"fused_route":[0-9]*\|"decode_ms_per_token":[0-9.]*\|"launches_per_step":[0-9]*' "$R/route.jsonl" 2>/dev/null |
    paste -d' ' - - - | sed 's/^/  route: /'
grep -o '"mma":[0-9]*\|"batch":[0-9]*,"programs":"[a-z]*"\|"decode_ms_per_step":[0-9.]*' "$R/mma.jsonl" 2>/dev/null |
    paste -d' ' - - - | sed 's/^/  mma: /'
grep -o '"pred_wide":[0-9]*\|"pred_async":[0-9]*\|"pred_fuse_norm":[0-9]*\|"predictor_device":"[a-z]*"\|"encoder_median_ms":[0-9.]*\|"predictor_median_ms":[0-9.]*' \
    "$R/predictor.jsonl" 2>/dev/null | paste -d' ' - - - - - - | sed 's/^/  predictor: /'
grep -o '"gemv_ring":[0-9]*\|"model":"[^"]*"\|"decode_ms_per_token":[0-9.]*\|"fraction_of_copy":[0-9.]*' "$R/ring.jsonl" \
    2>/dev/null | paste -d' ' - - - - | sed 's/^/  ring: /'
echo "total $(($(date +%s) - start)) s"
