// Device helpers shared by the CUDA kernels: warp and block reductions,
// bf16 unpacking, and the row dot product every GEMV is built on.
#ifndef POLAR_CUDA_COMMON_CUH
#define POLAR_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops.h"

#define WARP 32
#define MAX_TOKENS_PER_PASS 8 // inputs one pass over a weight row serves

// The stream a C caller passed as void *.
static inline cudaStream_t st(void *s) { return (cudaStream_t)s; }

// Token t's position and block table, and the pool row of position j
// under that table (cuda_kv_map, ops.h).
static __device__ __forceinline__ int kv_pos(const cuda_kv_map &m, int t) {
    return m.run.pos0 ? *m.run.pos0 + t : m.pos[t];
}
static __device__ __forceinline__ const int *kv_table(const cuda_kv_map &m, int t) {
    return m.run.pos0 ? m.run.table : m.tables + m.table[t];
}
// An entry never mapped (-1) reads as 2^32 - 1 blocks: far past any pool,
// so a kernel that reads one faults instead of landing on the rows before
// the pool (another sequence's, or another pool's).
static __device__ __forceinline__ size_t kv_row(const int *table, int j) {
    return (size_t)(unsigned)table[j / CUDA_KV_BLOCK] * CUDA_KV_BLOCK + j % CUDA_KV_BLOCK;
}

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

// acc[r][t] += this lane's share of w_r[j..j+8) . xs[t][j..j+8) for the R
// rows' 16-byte chunks p[r].
template <int R>
static __device__ __forceinline__ void dot8(float (*acc)[MAX_TOKENS_PER_PASS], const uint4 *p,
                                            const float *const xs[MAX_TOKENS_PER_PASS], int n, int j) {
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        float4 a = *(const float4 *)(xs[t] + j), b = *(const float4 *)(xs[t] + j + 4);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float w0 = __uint_as_float(p[r].x << 16), w1 = __uint_as_float(p[r].x & 0xffff0000u);
            float w2 = __uint_as_float(p[r].y << 16), w3 = __uint_as_float(p[r].y & 0xffff0000u);
            float w4 = __uint_as_float(p[r].z << 16), w5 = __uint_as_float(p[r].z & 0xffff0000u);
            float w6 = __uint_as_float(p[r].w << 16), w7 = __uint_as_float(p[r].w & 0xffff0000u);
            acc[r][t] += w0 * a.x + w1 * a.y + w2 * a.z + w3 * a.w + w4 * b.x + w5 * b.y + w6 * b.z + w7 * b.w;
        }
    }
}

// This lane's share of w_r . xs[t] for R weight rows and the n <=
// MAX_TOKENS_PER_PASS inputs (warp_sum the results). With cols % 8 == 0 each
// lane streams 16 bytes of each row per step, U steps' loads issued before
// the first FMA so that U * R loads per lane are in flight (decode is bound
// by how many bytes are in flight, not by arithmetic); every row is read
// once for all n inputs.
template <int R, int U>
static __device__ __forceinline__ void rows_dots(float (*acc)[MAX_TOKENS_PER_PASS], const uint16_t *const *wr,
                                                 const float *const xs[MAX_TOKENS_PER_PASS], int n, int cols,
                                                 int lane) {
    if ((cols & 7) == 0) {
        const int step = WARP * 8;
        int j = lane * 8;
        for (; j + (U - 1) * step < cols; j += U * step) {
            uint4 p[U][R];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) p[u][r] = __ldcs((const uint4 *)(wr[r] + j + u * step));
#pragma unroll
            for (int u = 0; u < U; u++) dot8<R>(acc, p[u], xs, n, j + u * step);
        }
        for (; j < cols; j += step) {
            uint4 p[R];
#pragma unroll
            for (int r = 0; r < R; r++) p[r] = __ldcs((const uint4 *)(wr[r] + j));
            dot8<R>(acc, p, xs, n, j);
        }
    } else {
        for (int j = lane; j < cols; j += WARP) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wj = bf(wr[r][j]);
#pragma unroll
                for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
                    if (t >= n) break;
                    acc[r][t] += wj * xs[t][j];
                }
            }
        }
    }
}

// One row: rows_dots with four steps in flight.
static __device__ __forceinline__ void row_dots(float acc[MAX_TOKENS_PER_PASS], const uint16_t *wr,
                                                const float *const xs[MAX_TOKENS_PER_PASS], int n, int cols,
                                                int lane) {
    rows_dots<1, 4>((float (*)[MAX_TOKENS_PER_PASS])acc, &wr, xs, n, cols, lane);
}

static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#endif
