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
// The logits through the row-parallel GEMV (the E x H router spread over
// the whole GPU, not one block per token), then a warp per token routes as
// cpu_route does: softmax statistics in f32, the k largest logits (lower
// index on ties), their probabilities, renormalised when norm, written in
// ascending expert order. Pick j is the largest logit strictly below pick
// j - 1 in the order (value descending, index ascending), so no flags and
// no shared memory are needed.

// a before b in the order (value descending, index ascending)
static __device__ __forceinline__ bool ranks_before(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

__global__ void topk_kernel(int *idx, float *weight, const float *logits, int T, int E, int k, int norm) {
    await_previous_kernel();
    int lane = threadIdx.x % WARP, t = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (t >= T) return;
    const float *lg = logits + (size_t)t * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    for (int e = lane; e < E; e += WARP) sum += expf(lg[e] - mx);
    sum = warp_sum(sum);
    int *id = idx + (size_t)t * k;
    float *wt = weight + (size_t)t * k, total = 0.0f, pv = INFINITY;
    int pi = -1; // the previous pick: (+inf, -1) ranks before everything
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = E; // nothing yet
        for (int e = lane; e < E; e += WARP)
            if (ranks_before(pv, pi, lg[e], e) && (bi == E || ranks_before(lg[e], e, bv, bi))) bv = lg[e], bi = e;
        for (int o = WARP / 2; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi < E && (bi == E || ranks_before(ov, oi, bv, bi))) bv = ov, bi = oi;
        }
        float p = expf(bv - mx) / sum;
        if (lane == 0) id[j] = bi, wt[j] = p;
        total += p;
        pv = bv, pi = bi;
    }
    if (lane != 0) return;
    // ascending expert order (lane 0 rereads its own writes)
    for (int j = 1; j < k; j++)
        for (int i = j; i > 0 && id[i] < id[i - 1]; i--) {
            int ti = id[i];
            id[i] = id[i - 1], id[i - 1] = ti;
            float tw = wt[i];
            wt[i] = wt[i - 1], wt[i - 1] = tw;
        }
    if (norm)
        for (int j = 0; j < k; j++) wt[j] /= total;
}

extern "C" void cuda_route(int *idx, float *weight, float *logits, const float *x, const bf16_bits *w_router, int T,
                           int E, int H, int k, int norm, const cuda_queue *queue) {
    cuda_matmul(logits, x, w_router, NULL, T, E, H, 0, queue);
    const int warps = 8;
    launch(queue, (T + warps - 1) / warps, warps * WARP, 0, topk_kernel, idx, weight, logits, T, E, k, norm);
}

// ------------------------------------------------------------------- grouping
//
// groups: [0] the number of experts chosen by any token, [1, 1+E) those
// experts ascending, [1+E, 2+2E) their first slot in the sorted list, then
// the sorted list of slots (slot s = token * k + j), ascending within an
// expert. One warp walks the slots in order, 32 at a time: lanes routed to
// the same expert find each other (__match_any_sync), and the lowest of them
// advances that expert's shared counter for all of them, so every update of
// a counter comes from one lane and the order within an expert is the slot
// order. O(T*k/32 + E/32) steps.

extern "C" size_t cuda_moe_group_ints(int T, int k, int E) { return 2 + 2 * (size_t)E + (size_t)T * k; }

// The lane's rank among the lanes of mask below it, and whether it leads.
static __device__ __forceinline__ int rank_in(unsigned mask, int lane) { return __popc(mask & ((1u << lane) - 1)); }

__global__ void moe_group_kernel(int *groups, const int *idx, int n_slots, int E) {
    await_previous_kernel();
    extern __shared__ int cursor[]; // [E]: counts, then each expert's next free place
    int lane = threadIdx.x, *active = groups + 1, *offset = groups + 1 + E, *slots = groups + 2 + 2 * E;
    for (int e = lane; e < E; e += WARP) cursor[e] = 0;
    __syncwarp();
    for (int s0 = 0; s0 < n_slots; s0 += WARP) {
        int s = s0 + lane, in = s < n_slots, e = in ? idx[s] : -1;
        unsigned peers = __match_any_sync(0xffffffffu, e);
        if (in && rank_in(peers, lane) == 0) cursor[e] += __popc(peers);
        __syncwarp();
    }
    // exclusive prefix over experts: lane l owns a contiguous range of them
    int per = (E + WARP - 1) / WARP, e0 = lane * per, e1 = e0 + per < E ? e0 + per : E;
    int mine = 0, mine_active = 0;
    for (int e = e0; e < e1; e++) mine += cursor[e], mine_active += cursor[e] > 0;
    int off = mine, act = mine_active;
    for (int o = 1; o < WARP; o <<= 1) { // inclusive scans
        int a = __shfl_up_sync(0xffffffffu, off, o), b = __shfl_up_sync(0xffffffffu, act, o);
        if (lane >= o) off += a, act += b;
    }
    off -= mine, act -= mine_active;
    for (int e = e0; e < e1; e++) {
        int c = cursor[e];
        if (c) active[act] = e, offset[act++] = off;
        cursor[e] = off;
        off += c;
    }
    if (lane == WARP - 1) offset[act] = off, groups[0] = act;
    __syncwarp();
    for (int s0 = 0; s0 < n_slots; s0 += WARP) {
        int s = s0 + lane, in = s < n_slots, e = in ? idx[s] : -1;
        unsigned peers = __match_any_sync(0xffffffffu, e);
        int base = 0;
        if (in) base = cursor[e];
        __syncwarp();
        if (in) {
            slots[base + rank_in(peers, lane)] = s;
            if (rank_in(peers, lane) == 0) cursor[e] = base + __popc(peers);
        }
        __syncwarp();
    }
}

extern "C" void cuda_moe_group(int *groups, const int *idx, int T, int k, int E, const cuda_queue *queue) {
    launch(queue, 1, WARP, (size_t)E * sizeof(int), moe_group_kernel, groups, idx, T * k, E);
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
    await_previous_kernel();
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
        if (swiglu) {
            float gu[2][MAX_TOKENS_PER_PASS];
#pragma unroll
            for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) gu[0][i] = gu[1][i] = 0.0f;
            const uint16_t *rows2[2] = {we + (size_t)r * cols, we + (size_t)(out_rows + r) * cols};
            rows_dots<2, 2, false>(gu, NULL, rows2, NULL, xs, n, cols, lane);
#pragma unroll
            for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) g[i] = gu[0][i], u[i] = gu[1][i];
        } else {
            row_dots(g, we + (size_t)r * cols, xs, n, cols, lane);
        }
#pragma unroll
        for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
            if (i >= n) break;
            float gv = warp_sum(g[i]), uv = swiglu ? warp_sum(u[i]) : 0.0f;
            if (lane == 0) y[(size_t)slots[b + i] * out_rows + r] = swiglu ? silu_mul(gv, uv) : gv;
        }
    }
}

extern "C" void cuda_expert_matmul(float *y, const float *x, const bf16_bits *w, const int *groups, int T, int k,
                                   int E, int rows, int cols, int x_per_slot, int swiglu, const cuda_queue *queue) {
    const int threads = 256, warps = threads / WARP;
    int out_rows = swiglu ? rows / 2 : rows, chosen = T * k < E ? T * k : E;
    dim3 grid((out_rows + warps - 1) / warps, chosen);
    launch(queue, grid, threads, 0, expert_gemv_kernel, y, x, w, groups, E, k, rows, cols, x_per_slot, swiglu);
}

// ------------------------------------------------------- expert GEMM (prefill)
//
// The same product on tensor cores for a prefill chunk, where an expert has
// many slots: bf16 inputs (xb, rounded like the cuBLASLt path), f32
// accumulation. A block per (64 output rows, chosen expert); each of its 4
// warps owns 16 rows and walks the expert's slots 16 at a time, the slots'
// input rows gathered into shared memory KT columns at a time (rows padded
// by 8 bf16 so the 16 rows of a fragment load fall in different banks).

#define EG_ROWS 64
#define EG_SLOTS 16
#define EG_KT 128
#define EG_LD (EG_KT + 8)

__global__ void __launch_bounds__(128) expert_gemm_kernel(float *y, const bf16_bits *xb, const bf16_bits *w,
                                                          const int *groups, int E, int k, int rows, int cols,
                                                          int x_per_slot, int swiglu) {
    await_previous_kernel();
    using namespace nvcuda;
    if ((int)blockIdx.y >= groups[0]) return;
    __shared__ __align__(32) __nv_bfloat16 xs[EG_SLOTS * EG_LD];
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
            // 16-byte pieces of 8 columns (cols % 16 == 0, so kt is a
            // multiple of 16 and every piece is aligned)
            for (int i = threadIdx.x; i < EG_SLOTS * (EG_KT / 8); i += blockDim.x) {
                int j = i / (EG_KT / 8), c = i % (EG_KT / 8) * 8;
                if (c >= kt) continue;
                uint4 v = make_uint4(0, 0, 0, 0); // slots past n read zeros
                if (j < n) {
                    int s = slots[b + j];
                    v = *(const uint4 *)(xb + (size_t)(x_per_slot ? s : s / k) * cols + k0 + c);
                }
                *(uint4 *)(xs + j * EG_LD + c) = v;
            }
            __syncthreads();
            if (!active) continue;
            for (int kk = 0; kk < kt; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> xf;
                wmma::load_matrix_sync(xf, xs + kk, EG_LD);
                wmma::load_matrix_sync(a, we + (size_t)r0 * cols + k0 + kk, cols);
                wmma::mma_sync(acc_g, a, xf, acc_g);
                if (swiglu) {
                    wmma::load_matrix_sync(a, we + (size_t)(out_rows + r0) * cols + k0 + kk, cols);
                    wmma::mma_sync(acc_u, a, xf, acc_u);
                }
            }
        }
        if (!active) continue;
        // cs[slot][row]: slot j, row r0 + r; lanes walk rows, so 16 lanes
        // store 16 neighbouring floats of one slot's output row
        wmma::store_matrix_sync(cs[warp][0], acc_g, 16, wmma::mem_col_major);
        if (swiglu) wmma::store_matrix_sync(cs[warp][1], acc_u, 16, wmma::mem_col_major);
        __syncwarp();
        for (int i = lane; i < 16 * 16; i += WARP) {
            int j = i / 16, r = i % 16;
            if (j >= n || r0 + r >= out_rows) continue;
            float v = swiglu ? silu_mul(cs[warp][0][i], cs[warp][1][i]) : cs[warp][0][i];
            y[(size_t)slots[b + j] * out_rows + r0 + r] = v;
        }
        __syncwarp();
    }
}

extern "C" int cuda_expert_gemm(float *y, const bf16_bits *xb, const bf16_bits *w, const int *groups, int T, int k,
                                int E, int rows, int cols, int x_per_slot, int swiglu, const cuda_queue *queue) {
    int out_rows = swiglu ? rows / 2 : rows;
    if (cols % 16 || out_rows % 16) return 0; // whole 16 x 16 tiles only
    int chosen = T * k < E ? T * k : E;
    dim3 grid((out_rows + EG_ROWS - 1) / EG_ROWS, chosen);
    launch(queue, grid, 128, 0, expert_gemm_kernel, y, xb, w, groups, E, k, rows, cols, x_per_slot, swiglu);
    return 1;
}

// -------------------------------------------------------------------- combine

// A block per token: x[t] += sum_j weight[t, j] * y[t*k + j] in j order, plus
// sigmoid(xn[t] . gate_w) * shared[t] when there is a shared expert.
__global__ void moe_combine_kernel(float *x, const float *y, const float *weight, const float *shared,
                                   const float *xn, const bf16_bits *gate_w, int k, int H) {
    await_previous_kernel();
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
                                 const bf16_bits *gate_w, int T, int k, int H, const cuda_queue *queue) {
    launch(queue, T, 256, 0, moe_combine_kernel, x, y, weight, shared, xn, gate_w, k, H);
}
