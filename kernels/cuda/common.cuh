// Device helpers shared by the CUDA kernels: warp and block reductions,
// bf16 unpacking, and the row dot product every GEMV is built on.
#ifndef POLAR_CUDA_COMMON_CUH
#define POLAR_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define WARP 32
#define MAX_TOKENS_PER_PASS 8 // inputs one pass over a weight row serves

// The stream a C caller passed as void *.
static inline cudaStream_t st(void *s) { return (cudaStream_t)s; }

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float((unsigned)b << 16); }

static __device__ __forceinline__ uint16_t to_bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// Sum over a block of up to 1024 threads; every thread gets the result.
static __device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[WARP];
    __shared__ float total;
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = warp_sum(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < (int)(blockDim.x + WARP - 1) / WARP ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

// This lane's share of w_row . xs[t] for the n <= MAX_TOKENS_PER_PASS inputs
// (warp_sum the results). With cols % 8 == 0 each lane loads 8 bf16 (16
// bytes) of the row per step, and the row is read once for all n inputs.
static __device__ __forceinline__ void row_dots(float acc[MAX_TOKENS_PER_PASS], const uint16_t *wr,
                                                const float *const xs[MAX_TOKENS_PER_PASS], int n, int cols,
                                                int lane) {
    if ((cols & 7) == 0) {
        for (int j = lane * 8; j < cols; j += WARP * 8) {
            uint4 p = *(const uint4 *)(wr + j);
            float w0 = __uint_as_float(p.x << 16), w1 = __uint_as_float(p.x & 0xffff0000u);
            float w2 = __uint_as_float(p.y << 16), w3 = __uint_as_float(p.y & 0xffff0000u);
            float w4 = __uint_as_float(p.z << 16), w5 = __uint_as_float(p.z & 0xffff0000u);
            float w6 = __uint_as_float(p.w << 16), w7 = __uint_as_float(p.w & 0xffff0000u);
#pragma unroll
            for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
                if (t >= n) break;
                float4 a = *(const float4 *)(xs[t] + j), b = *(const float4 *)(xs[t] + j + 4);
                acc[t] += w0 * a.x + w1 * a.y + w2 * a.z + w3 * a.w + w4 * b.x + w5 * b.y + w6 * b.z + w7 * b.w;
            }
        }
    } else {
        for (int j = lane; j < cols; j += WARP) {
            float wj = bf(wr[j]);
#pragma unroll
            for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
                if (t >= n) break;
                acc[t] += wj * xs[t][j];
            }
        }
    }
}

static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#endif
