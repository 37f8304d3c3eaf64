// Mixture-of-experts kernels, the CPU's moe_forward on the GPU: a fused
// router, tokens grouped by expert on the device, a grouped expert GEMV that
// reads each chosen expert's rows once for all its tokens, and a combine
// without atomics (every output element is summed by one thread in a fixed
// order, so two runs give the same bits).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "common.cuh"
#include "ops.h"

// --------------------------------------------------------------------- router
//
// A block per token: the E router logits (a warp per expert row) into shared
// memory, then warp 0 routes as cpu_route does: softmax statistics in f32,
// the k largest logits (lower index on ties), their probabilities,
// renormalised when norm, written in ascending expert order.
__global__ void route_kernel(int *idx, float *weight, const float *x, const bf16_bits *w_router, int E, int H, int k,
                             int norm) {
    extern __shared__ float logit[]; // [E], then taken flags [E]
    int *taken = (int *)(logit + E);
    int t = blockIdx.x, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
    const float *xs[MAX_TOKENS_PER_PASS];
    for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) xs[i] = x + (size_t)t * H;
    for (int e = warp; e < E; e += warps) {
        float acc[MAX_TOKENS_PER_PASS] = {0};
        row_dots(acc, w_router + (size_t)e * H, xs, 1, H, lane);
        float v = warp_sum(acc[0]);
        if (lane == 0) logit[e] = v, taken[e] = 0;
    }
    __syncthreads();
    if (warp != 0) return;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, logit[e]);
    mx = warp_max(mx);
    for (int e = lane; e < E; e += WARP) sum += expf(logit[e] - mx);
    sum = warp_sum(sum);
    int *id = idx + (size_t)t * k;
    float *wt = weight + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = E;
        for (int e = lane; e < E; e += WARP)
            if (!taken[e] && (bi == E || logit[e] > bv)) bv = logit[e], bi = e;
        for (int o = WARP / 2; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi < E && (bi == E || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        if (lane == 0) {
            taken[bi] = 1;
            id[j] = bi;
            wt[j] = expf(bv - mx) / sum;
        }
        __syncwarp();
    }
    if (lane != 0) return;
    if (norm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += wt[j];
        for (int j = 0; j < k; j++) wt[j] /= s;
    }
    for (int j = 1; j < k; j++)
        for (int i = j; i > 0 && id[i] < id[i - 1]; i--) {
            int ti = id[i];
            id[i] = id[i - 1], id[i - 1] = ti;
            float tw = wt[i];
            wt[i] = wt[i - 1], wt[i - 1] = tw;
        }
}

extern "C" void cuda_route(int *idx, float *weight, const float *x, const bf16_bits *w_router, int T, int E, int H,
                           int k, int norm, void *stream) {
    route_kernel<<<T, 256, (size_t)E * (sizeof(float) + sizeof(int)), st(stream)>>>(idx, weight, x, w_router, E, H, k,
                                                                                     norm);
}

// ------------------------------------------------------------------- grouping
//
// groups: [0] the number of experts chosen by any token, [1, 1+E) those
// experts ascending, [1+E, 2+2E) their first slot in the sorted list, then
// the sorted list of slots (slot s = token * k + j), ascending within an
// expert. One block: a thread per expert counts and then fills its slots.

extern "C" size_t cuda_moe_group_ints(int T, int k, int E) { return 2 + 2 * (size_t)E + (size_t)T * k; }

__global__ void moe_group_kernel(int *groups, const int *idx, int n_slots, int E) {
    extern __shared__ int count[]; // [E], then start [E]
    int *start = count + E, *active = groups + 1, *offset = groups + 1 + E, *slots = groups + 2 + 2 * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int s = 0; s < n_slots; s++) c += idx[s] == e;
        count[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int a = 0, off = 0;
        for (int e = 0; e < E; e++) {
            start[e] = off;
            if (count[e]) active[a] = e, offset[a++] = off;
            off += count[e];
        }
        offset[a] = off;
        groups[0] = a;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int p = start[e];
        for (int s = 0; s < n_slots && p < start[e] + count[e]; s++)
            if (idx[s] == e) slots[p++] = s;
    }
}

extern "C" void cuda_moe_group(int *groups, const int *idx, int T, int k, int E, void *stream) {
    moe_group_kernel<<<1, 1024, 2 * (size_t)E * sizeof(int), st(stream)>>>(groups, idx, T * k, E);
}

// --------------------------------------------------------------- expert GEMV
//
// blockIdx.y is a chosen expert (blocks past the number chosen exit), each
// warp one output row of it, the row read once per pass of up to 8 of the
// expert's slots. Without swiglu: y[s, rows] = x_s . W[e]^T. With swiglu
// (W[e] is the [2F, cols] gate-then-up block, F = rows / 2):
// y[s, F] = silu(x_s . gate_r) * (x_s . up_r).

__global__ void expert_gemv_kernel(float *y, const float *x, const bf16_bits *w, const int *groups, int E, int k,
                                   int rows, int cols, int x_per_slot, int swiglu) {
    if ((int)blockIdx.y >= groups[0]) return;
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, out_rows = swiglu ? rows / 2 : rows;
    if (r >= out_rows) return;
    int e = groups[1 + blockIdx.y], begin = groups[1 + E + blockIdx.y], end = groups[2 + E + blockIdx.y];
    const int *slots = groups + 2 + 2 * E;
    const bf16_bits *we = w + (size_t)e * rows * cols;
    for (int b = begin; b < end; b += MAX_TOKENS_PER_PASS) {
        int n = end - b < MAX_TOKENS_PER_PASS ? end - b : MAX_TOKENS_PER_PASS;
        const float *xs[MAX_TOKENS_PER_PASS];
        float g[MAX_TOKENS_PER_PASS], u[MAX_TOKENS_PER_PASS];
#pragma unroll
        for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
            int s = slots[b + (i < n ? i : 0)];
            xs[i] = x + (size_t)(x_per_slot ? s : s / k) * cols;
            g[i] = u[i] = 0.0f;
        }
        row_dots(g, we + (size_t)r * cols, xs, n, cols, lane);
        if (swiglu) row_dots(u, we + (size_t)(out_rows + r) * cols, xs, n, cols, lane);
#pragma unroll
        for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
            if (i >= n) break;
            float gv = warp_sum(g[i]), uv = swiglu ? warp_sum(u[i]) : 0.0f;
            if (lane == 0) y[(size_t)slots[b + i] * out_rows + r] = swiglu ? silu_mul(gv, uv) : gv;
        }
    }
}

extern "C" void cuda_expert_matmul(float *y, const float *x, const bf16_bits *w, const int *groups, int T, int k,
                                   int E, int rows, int cols, int x_per_slot, int swiglu, void *stream) {
    const int threads = 256, warps = threads / WARP;
    int out_rows = swiglu ? rows / 2 : rows, chosen = T * k < E ? T * k : E;
    dim3 grid((out_rows + warps - 1) / warps, chosen);
    expert_gemv_kernel<<<grid, threads, 0, st(stream)>>>(y, x, w, groups, E, k, rows, cols, x_per_slot, swiglu);
}

// ------------------------------------------------------- expert GEMM (prefill)
//
// The same product on tensor cores for a prefill chunk, where an expert has
// many slots: bf16 inputs (xb, rounded like the cuBLASLt path), f32
// accumulation. A block per (64 output rows, chosen expert); each of its 4
// warps owns 16 rows and walks the expert's slots 16 at a time, the slots'
// input rows gathered into shared memory KT columns at a time.

#define EG_ROWS 64
#define EG_SLOTS 16
#define EG_KT 128

__global__ void __launch_bounds__(128) expert_gemm_kernel(float *y, const bf16_bits *xb, const bf16_bits *w,
                                                          const int *groups, int E, int k, int rows, int cols,
                                                          int x_per_slot, int swiglu) {
    using namespace nvcuda;
    if ((int)blockIdx.y >= groups[0]) return;
    __shared__ __align__(32) __nv_bfloat16 xs[EG_SLOTS * EG_KT];
    __shared__ __align__(32) float cs[4][2][16 * 16];
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, out_rows = swiglu ? rows / 2 : rows;
    int r0 = blockIdx.x * EG_ROWS + warp * 16, active = r0 < out_rows;
    int e = groups[1 + blockIdx.y], begin = groups[1 + E + blockIdx.y], end = groups[2 + E + blockIdx.y];
    const int *slots = groups + 2 + 2 * E;
    const __nv_bfloat16 *we = (const __nv_bfloat16 *)w + (size_t)e * rows * cols;
    for (int b = begin; b < end; b += EG_SLOTS) {
        int n = end - b < EG_SLOTS ? end - b : EG_SLOTS;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_g, acc_u;
        wmma::fill_fragment(acc_g, 0.0f);
        wmma::fill_fragment(acc_u, 0.0f);
        for (int k0 = 0; k0 < cols; k0 += EG_KT) {
            int kt = cols - k0 < EG_KT ? cols - k0 : EG_KT;
            __syncthreads(); // the previous tile is consumed
            for (int i = threadIdx.x; i < EG_SLOTS * kt; i += blockDim.x) {
                int j = i / kt, c = i % kt;
                bf16_bits v = 0; // slots past n read zeros
                if (j < n) {
                    int s = slots[b + j];
                    v = xb[(size_t)(x_per_slot ? s : s / k) * cols + k0 + c];
                }
                xs[j * EG_KT + c] = __ushort_as_bfloat16(v);
            }
            __syncthreads();
            if (!active) continue;
            for (int kk = 0; kk < kt; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> xf;
                wmma::load_matrix_sync(xf, xs + kk, EG_KT);
                wmma::load_matrix_sync(a, we + (size_t)r0 * cols + k0 + kk, cols);
                wmma::mma_sync(acc_g, a, xf, acc_g);
                if (swiglu) {
                    wmma::load_matrix_sync(a, we + (size_t)(out_rows + r0) * cols + k0 + kk, cols);
                    wmma::mma_sync(acc_u, a, xf, acc_u);
                }
            }
        }
        if (!active) continue;
        // cs[row][slot]: row r0 + i, slot j
        wmma::store_matrix_sync(cs[warp][0], acc_g, 16, wmma::mem_row_major);
        if (swiglu) wmma::store_matrix_sync(cs[warp][1], acc_u, 16, wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < 16 * 16; i += WARP) {
            int r = i / 16, j = i % 16;
            if (j >= n || r0 + r >= out_rows) continue;
            float v = swiglu ? silu_mul(cs[warp][0][i], cs[warp][1][i]) : cs[warp][0][i];
            y[(size_t)slots[b + j] * out_rows + r0 + r] = v;
        }
        __syncwarp();
    }
}

extern "C" int cuda_expert_gemm(float *y, const bf16_bits *xb, const bf16_bits *w, const int *groups, int T, int k,
                                int E, int rows, int cols, int x_per_slot, int swiglu, void *stream) {
    int out_rows = swiglu ? rows / 2 : rows;
    if (cols % 16 || out_rows % 16) return 0; // whole 16 x 16 tiles only
    int chosen = T * k < E ? T * k : E;
    dim3 grid((out_rows + EG_ROWS - 1) / EG_ROWS, chosen);
    expert_gemm_kernel<<<grid, 128, 0, st(stream)>>>(y, xb, w, groups, E, k, rows, cols, x_per_slot, swiglu);
    return 1;
}

// -------------------------------------------------------------------- combine

// A block per token: x[t] += sum_j weight[t, j] * y[t*k + j] in j order, plus
// sigmoid(xn[t] . gate_w) * shared[t] when there is a shared expert.
__global__ void moe_combine_kernel(float *x, const float *y, const float *weight, const float *shared,
                                   const float *xn, const bf16_bits *gate_w, int k, int H) {
    int t = blockIdx.x;
    float sig = 0.0f;
    if (shared) {
        float d = 0.0f;
        for (int i = threadIdx.x; i < H; i += blockDim.x) d += xn[(size_t)t * H + i] * bf(gate_w[i]);
        sig = 1.0f / (1.0f + expf(-block_sum(d)));
    }
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float out = 0.0f;
        for (int j = 0; j < k; j++) out += y[((size_t)t * k + j) * H + i] * weight[(size_t)t * k + j];
        if (shared) out += sig * shared[(size_t)t * H + i];
        x[(size_t)t * H + i] += out;
    }
}

extern "C" void cuda_moe_combine(float *x, const float *y, const float *weight, const float *shared, const float *xn,
                                 const bf16_bits *gate_w, int T, int k, int H, void *stream) {
    moe_combine_kernel<<<T, 256, 0, st(stream)>>>(x, y, weight, shared, xn, gate_w, k, H);
}
