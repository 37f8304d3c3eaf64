// The product of 3 to 16 tokens with a bf16 matrix on tensor cores (issue
// 42 item 4; POLAR_CUDA_MMA_GEMV=1, off until a GPU times it). Decode passes
// of more than CUDA_GEMV_TOKENS tokens (a batch's sequences, a mixed-program
// batch's extra passes) went to cuBLASLt, 1.5x a one-token step at 8 tokens
// on the H200 (2026-11-27): its tiles are made for many tokens. Here the
// weights are read once, by WMMA 16x16x16 fragments straight from global
// memory, and the tokens' inputs rounded to bf16 (as cuda_to_bf16 rounds
// them for cuBLASLt) are the other operand, tokens past T zero.
//
// A block is 16 output rows. Their columns go in groups of 64 to the
// block's 8 warps in turn (so 8 warps read neighbouring 128-byte pieces of
// the same rows, and a 2048-row matrix still has 1024 warps); each warp sums
// its groups in its accumulator fragment, then the block adds the 8 warps'
// sums in warp order: the same result whatever order the warps run in.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

#include "common.cuh"
#include "ops.h"

using namespace nvcuda;

#define MG_WARPS 8
#define MG_STEPS 4  // k-steps of 16 columns in a group of 64
#define MG_TOKENS 16 // tokens a fragment holds

// y[t, r0 + r] (=, or += with accumulate) x_t . w_{r0 + r} + bias, r < 16,
// t < T <= 16, r0 = 16 blockIdx.x; cols a multiple of 64.
__global__ void __launch_bounds__(MG_WARPS * WARP) mma_gemv_kernel(float *y, int ldy, const float *x,
                                                                  const bf16_bits *w, const bf16_bits *bias, int T,
                                                                  int cols, int accumulate) {
    // a warp's group of inputs: per k-step a 16 x 16 column-major tile,
    // element (k, t) at t * 16 + k, so token t's 16 values are 32 bytes
    __shared__ __align__(32) __nv_bfloat16 xs[MG_WARPS][MG_STEPS][16 * MG_TOKENS];
    __shared__ __align__(32) float sums[MG_WARPS][16 * MG_TOKENS]; // a warp's sums, [row][token]
    await_previous_kernel();
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, r0 = blockIdx.x * 16;
    const __nv_bfloat16 *rows = (const __nv_bfloat16 *)w + (size_t)r0 * cols;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    // the lane stages token t's columns 32 half .. 32 half + 31 of a group: k-steps 2 half, 2 half + 1
    int t = lane / 2, half = lane % 2;
    for (int g = warp; g < cols / 64; g += MG_WARPS) {
        int k0 = 64 * g;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[MG_STEPS];
#pragma unroll
        for (int s = 0; s < MG_STEPS; s++) wmma::load_matrix_sync(a[s], rows + k0 + 16 * s, cols);
        const float *xt = x + (size_t)t * cols + k0 + 32 * half;
#pragma unroll
        for (int s = 0; s < 2; s++) {
            unsigned pair[8];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float4 v = t < T ? *(const float4 *)(xt + 16 * s + 4 * q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                pair[2 * q] = (unsigned)to_bf(v.x) | (unsigned)to_bf(v.y) << 16;
                pair[2 * q + 1] = (unsigned)to_bf(v.z) | (unsigned)to_bf(v.w) << 16;
            }
            uint4 *dst = (uint4 *)&xs[warp][2 * half + s][16 * t];
            dst[0] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
            dst[1] = make_uint4(pair[4], pair[5], pair[6], pair[7]);
        }
        __syncwarp(); // the tiles staged by every lane
#pragma unroll
        for (int s = 0; s < MG_STEPS; s++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
            wmma::load_matrix_sync(b, xs[warp][s], 16);
            wmma::mma_sync(acc, a[s], b, acc);
        }
        __syncwarp(); // read before the next group overwrites them
    }
    wmma::store_matrix_sync(sums[warp], acc, MG_TOKENS, wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * T; i += blockDim.x) {
        int tok = i / 16, r = i % 16; // neighbouring threads: neighbouring rows of y
        float v = 0.0f;
        for (int k = 0; k < MG_WARPS; k++) v += sums[k][r * MG_TOKENS + tok];
        if (bias) v += bf(bias[r0 + r]);
        float *dst = &y[(size_t)tok * ldy + r0 + r];
        *dst = accumulate ? *dst + v : v;
    }
}

extern "C" int cuda_matmul_mma(float *y, int ldy, const float *x, const bf16_bits *w, const bf16_bits *bias, int T,
                               int rows, int cols, int accumulate, const cuda_queue *queue) {
    // fragments read 32-byte aligned pieces of w's rows; x's rows in float4s
    if (T < 1 || T > MG_TOKENS || rows < 16 || rows % 16 || cols % 64 || (uintptr_t)w % 32 || (uintptr_t)x % 16)
        return 0;
    launch(queue, rows / 16, MG_WARPS * WARP, 0, mma_gemv_kernel, y, ldy, x, w, bias, T, cols, accumulate);
    return 1;
}
