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

// A queue's stream (NULL: the default stream).
static inline cudaStream_t st(const cuda_queue *q) { return q ? (cudaStream_t)q->stream : (cudaStream_t)0; }

// Programmatic dependent launch (sm_90 and later). A kernel launched by
// launch() on a queue with overlap may be scheduled while the previous
// kernel of the stream finishes, so its blocks are resident when that
// kernel's last ones end: a decode step is some 200 short kernels, and on
// an H100 the gaps between them took about a third of a step. What keeps
// it correct: every kernel launch() starts calls await_previous_kernel()
// first, before it reads or writes anything (the CUDA emulation fails a
// thread that exits without it). The next kernel is let in only then, so
// at most two grids hold the GPU.
static __device__ __forceinline__ void await_previous_kernel() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();           // the previous kernel has finished, its writes visible
    cudaTriggerProgrammaticLaunchCompletion(); // the next one may be scheduled
#endif
}

// Asks L2 for the 128-byte lines of bytes at p (one lane of WARP: lines
// lane, lane + 32, ...): a GEMV's weight row before await_previous_kernel(),
// which is safe because no kernel writes weights. A hint: nothing under the
// emulation, and nothing changes but timing on a GPU.
static __device__ __forceinline__ void prefetch_l2(const void *p, size_t bytes, int lane) {
#if defined(__CUDA_ARCH__)
    for (size_t off = (size_t)lane * 128; off < bytes; off += (size_t)WARP * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + off));
#else
    (void)p, (void)bytes, (void)lane;
#endif
}

// Launches kernel(args) on q's stream (grid, block, dynamic shared memory as
// in the launch brackets), overlapping the previous kernel when q asks for
// it. The kernel begins with await_previous_kernel(). A failed launch is the
// last error (cudaGetLastError), as with the brackets.
template <typename... P, typename... A>
static inline void launch(const cuda_queue *q, dim3 grid, dim3 block, size_t smem, void (*kernel)(P...),
                          A &&...args) {
    cudaLaunchAttribute overlap[1];
    overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st(q);
    cfg.attrs = overlap, cfg.numAttrs = q && q->overlap ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

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

// One row's RMSNorm by the whole block: o = w * (x / rms(x)). Its sum's
// order depends on blockDim, so launches that must agree use the same.
static __device__ __forceinline__ void rmsnorm_row(float *o, const float *xr, const uint16_t *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = bf(w[i]) * (xr[i] * inv);
}

// acc[r][t] += this lane's share of w_r[j..j+8) . xs[t][j..j+8) for the R
// rows' 16-byte chunks p[r]. With NORM the inputs are normed on the fly:
// ss[t] gathers x^2 and each x is scaled by its norm weight (nw, 8 bf16) as
// loaded; the caller multiplies the dots by 1/rms (rms_scale).
template <int R, bool NORM>
static __device__ __forceinline__ void dot8(float (*acc)[MAX_TOKENS_PER_PASS], float *ss, const uint4 *p, uint4 nw,
                                            const float *const xs[MAX_TOKENS_PER_PASS], int n, int j) {
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        float4 a = *(const float4 *)(xs[t] + j), b = *(const float4 *)(xs[t] + j + 4);
        if (NORM) {
            ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
            a.x *= __uint_as_float(nw.x << 16), a.y *= __uint_as_float(nw.x & 0xffff0000u);
            a.z *= __uint_as_float(nw.y << 16), a.w *= __uint_as_float(nw.y & 0xffff0000u);
            b.x *= __uint_as_float(nw.z << 16), b.y *= __uint_as_float(nw.z & 0xffff0000u);
            b.z *= __uint_as_float(nw.w << 16), b.w *= __uint_as_float(nw.w & 0xffff0000u);
        }
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
// once for all n inputs. With NORM (norm: the RMSNorm weights, cols of
// them) the inputs are the residual rows, normed as dot8 says, and ss[t]
// holds this lane's share of sum x^2. RING (POLAR_CUDA_GEMV_RING=1): the U
// loads are a ring, step s + U requested as step s is multiplied, so U stay
// in flight to the row's end (the groups of U wait for their slowest load
// between groups, and the steps past the last whole group went one at a
// time: 4 of 12 at 3072 columns in a decode step). The same steps in the
// same order either way: the same bits.
template <int R, int U, bool NORM, bool RING = false>
static __device__ __forceinline__ void rows_dots(float (*acc)[MAX_TOKENS_PER_PASS], float *ss,
                                                 const uint16_t *const *wr, const uint16_t *norm,
                                                 const float *const xs[MAX_TOKENS_PER_PASS], int n, int cols,
                                                 int lane) {
    const uint4 no_norm = {0, 0, 0, 0};
    if (RING && (cols & 7) == 0) {
        const int step = WARP * 8, j0 = lane * 8, steps = j0 < cols ? (cols - j0 + step - 1) / step : 0;
        uint4 p[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (u < steps)
#pragma unroll
                for (int r = 0; r < R; r++) p[u][r] = __ldcs((const uint4 *)(wr[r] + j0 + u * step));
        for (int s0 = 0; s0 < steps; s0 += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int s = s0 + u, j = j0 + s * step;
                if (s >= steps) break;
                uint4 cur[R];
#pragma unroll
                for (int r = 0; r < R; r++) cur[r] = p[u][r];
                if (s + U < steps)
#pragma unroll
                    for (int r = 0; r < R; r++) p[u][r] = __ldcs((const uint4 *)(wr[r] + j + U * step));
                dot8<R, NORM>(acc, ss, cur, NORM ? *(const uint4 *)(norm + j) : no_norm, xs, n, j);
            }
        }
    } else if ((cols & 7) == 0) {
        const int step = WARP * 8;
        int j = lane * 8;
        for (; j + (U - 1) * step < cols; j += U * step) {
            uint4 p[U][R];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) p[u][r] = __ldcs((const uint4 *)(wr[r] + j + u * step));
#pragma unroll
            for (int u = 0; u < U; u++)
                dot8<R, NORM>(acc, ss, p[u], NORM ? *(const uint4 *)(norm + j + u * step) : no_norm, xs, n,
                              j + u * step);
        }
        for (; j < cols; j += step) {
            uint4 p[R];
#pragma unroll
            for (int r = 0; r < R; r++) p[r] = __ldcs((const uint4 *)(wr[r] + j));
            dot8<R, NORM>(acc, ss, p, NORM ? *(const uint4 *)(norm + j) : no_norm, xs, n, j);
        }
    } else {
        for (int j = lane; j < cols; j += WARP) {
            float nj = NORM ? bf(norm[j]) : 1.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wj = bf(wr[r][j]);
#pragma unroll
                for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
                    if (t >= n) break;
                    acc[r][t] += wj * (NORM ? nj * xs[t][j] : xs[t][j]);
                }
            }
#pragma unroll
            for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
                if (!NORM || t >= n) break;
                ss[t] += xs[t][j] * xs[t][j];
            }
        }
    }
}

// 1/rms of a token from the warp's lanes' shares of sum x^2 (every lane
// gets it): the cpu_rmsnorm statistic.
static __device__ __forceinline__ float rms_scale(float ss, int cols, float eps) {
    return 1.0f / sqrtf(warp_sum(ss) / (float)cols + eps);
}

// One row: rows_dots with four steps in flight.
static __device__ __forceinline__ void row_dots(float acc[MAX_TOKENS_PER_PASS], const uint16_t *wr,
                                                const float *const xs[MAX_TOKENS_PER_PASS], int n, int cols,
                                                int lane) {
    rows_dots<1, 4, false>((float (*)[MAX_TOKENS_PER_PASS])acc, NULL, &wr, NULL, xs, n, cols, lane);
}

// A GEMV warp's pass over tokens t0..t0+n-1 (n returned; 1 when ONE): each
// token's input row xs[t] (slots past n point at the first row, never
// read), sums acc and ss zeroed.
template <bool ONE>
static __device__ __forceinline__ int pass_inputs(const float *xs[MAX_TOKENS_PER_PASS], float *acc, float *ss,
                                                  const float *x, int t0, int T, int cols) {
    int n = ONE ? 1 : T - t0 < MAX_TOKENS_PER_PASS ? T - t0 : MAX_TOKENS_PER_PASS;
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++)
        xs[t] = x + (size_t)(t0 + (t < n ? t : 0)) * cols, acc[t] = ss[t] = 0.0f;
    return n;
}

// The warp's row r for its n tokens: each lane's share acc[t] summed (with
// NORM times 1/rms of ss[t]), plus b, written by lane 0 into y (rows ld
// apart), or added to it with accumulate.
template <bool NORM>
static __device__ __forceinline__ void store_row(float *y, int ld, int r, int t0, int n, const float *acc,
                                                 const float *ss, float b, int cols, float eps, int accumulate,
                                                 int lane) {
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        float v = warp_sum(acc[t]);
        if (NORM) v *= rms_scale(ss[t], cols, eps);
        if (lane == 0) {
            float *dst = &y[(size_t)(t0 + t) * ld + r];
            *dst = accumulate ? *dst + (v + b) : v + b;
        }
    }
}

// Passes of up to MAX_TOKENS_PER_PASS tokens over T (a GEMV launch's grid.y).
static inline unsigned passes(int T) { return (unsigned)((T + MAX_TOKENS_PER_PASS - 1) / MAX_TOKENS_PER_PASS); }

static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#endif
