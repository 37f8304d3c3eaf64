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

#include "blocks.cuh"
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

// Token t's routing by one warp from its E logits lg: idx[0..k) and
// weight[0..k) as the header says (lane 0 writes them).
static __device__ void route_token(int *id, float *wt, const float *lg, int E, int k, int norm, int lane) {
    float mx = -INFINITY, sum = 0.0f;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    for (int e = lane; e < E; e += WARP) sum += expf(lg[e] - mx);
    sum = warp_sum(sum);
    float total = 0.0f, pv = INFINITY;
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

__global__ void topk_kernel(int *idx, float *weight, const float *logits, int T, int E, int k, int norm) {
    await_previous_kernel();
    int lane = threadIdx.x % WARP, t = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (t >= T) return;
    route_token(idx + (size_t)t * k, weight + (size_t)t * k, logits + (size_t)t * E, E, k, norm, lane);
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

// Slot s's expert among e0..e0+E-1 as 0..E-1; -1 for a slot past n_slots or
// routed to an expert outside them (another rank's, under expert parallel).
static __device__ __forceinline__ int local_expert(const int *idx, int s, int n_slots, int e0, int E) {
    int e = s < n_slots ? idx[s] - e0 : -1;
    return e >= 0 && e < E ? e : -1;
}

// The lane's rank among the lanes of mask below it, and whether it leads.
static __device__ __forceinline__ int rank_in(unsigned mask, int lane) { return __popc(mask & ((1u << lane) - 1)); }

// The grouping by one warp (lane), cursor[E] in shared memory: counts,
// then each expert's next free place.
static __device__ void group_slots(int *groups, const int *idx, int n_slots, int e0, int E, int *cursor, int lane) {
    int *active = groups + 1, *offset = groups + 1 + E, *slots = groups + 2 + 2 * E;
    for (int e = lane; e < E; e += WARP) cursor[e] = 0;
    __syncwarp();
    for (int s0 = 0; s0 < n_slots; s0 += WARP) {
        int s = s0 + lane, e = local_expert(idx, s, n_slots, e0, E), in = e >= 0;
        unsigned peers = __match_any_sync(0xffffffffu, e);
        if (in && rank_in(peers, lane) == 0) cursor[e] += __popc(peers);
        __syncwarp();
    }
    // exclusive prefix over experts: lane l owns a contiguous range of them
    int per = (E + WARP - 1) / WARP, lo = lane * per, hi = lo + per < E ? lo + per : E;
    int mine = 0, mine_active = 0;
    for (int e = lo; e < hi; e++) mine += cursor[e], mine_active += cursor[e] > 0;
    int off = mine, act = mine_active;
    for (int o = 1; o < WARP; o <<= 1) { // inclusive scans
        int a = __shfl_up_sync(0xffffffffu, off, o), b = __shfl_up_sync(0xffffffffu, act, o);
        if (lane >= o) off += a, act += b;
    }
    off -= mine, act -= mine_active;
    for (int e = lo; e < hi; e++) {
        int c = cursor[e];
        if (c) active[act] = e, offset[act++] = off;
        cursor[e] = off;
        off += c;
    }
    if (lane == WARP - 1) offset[act] = off, groups[0] = act;
    __syncwarp();
    for (int s0 = 0; s0 < n_slots; s0 += WARP) {
        int s = s0 + lane, e = local_expert(idx, s, n_slots, e0, E), in = e >= 0;
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

__global__ void moe_group_kernel(int *groups, const int *idx, int n_slots, int e0, int E) {
    await_previous_kernel();
    extern __shared__ int cursor[];
    group_slots(groups, idx, n_slots, e0, E, cursor, threadIdx.x);
}

extern "C" void cuda_moe_group(int *groups, const int *idx, int T, int k, int e0, int E, const cuda_queue *queue) {
    launch(queue, 1, WARP, (size_t)E * sizeof(int), moe_group_kernel, groups, idx, T * k, e0, E);
}

// A pass of up to 8 tokens routed and grouped by one block (POLAR_CUDA_FUSED_ROUTE=1,
// off until a GPU times it; issue 42 item 5): its warps take the router's
// rows in turn as the row-parallel GEMV's warps do (the same sums), then a
// warp per token routes, then warp 0 groups: one launch for three. A
// decode step's router is E x H, a few hundred KB: one multiprocessor reads
// it in a few microseconds, about what the two launches cost.
// With mlp_norm, the block first writes x = RMSNorm(resid) itself (the
// rmsnorm kernel's operations at its 256 threads: the same bits), one
// launch fewer again.
__global__ void __launch_bounds__(256) route_group_kernel(int *groups, int *idx, float *weight, float *logits,
                                                          float *x, const float *resid, const bf16_bits *mlp_norm,
                                                          float eps, const bf16_bits *w, int T, int E, int H, int k,
                                                          int norm, int e0, int E_local) {
    await_previous_kernel();
    extern __shared__ int route_cursor[]; // [E_local], for group_slots
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    for (int t = 0; mlp_norm && t < T; t++) rmsnorm_row(x + (size_t)t * H, resid + (size_t)t * H, mlp_norm, H, eps);
    __syncthreads(); // the normed rows, written to global memory by the block, seen by it
    for (int r = warp; r < E; r += warps) {
        const float *xs[MAX_TOKENS_PER_PASS];
        float acc[MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS];
        int n = pass_inputs<false>(xs, acc, ss, x, 0, T, H);
        const uint16_t *wr = w + (size_t)r * H;
        rows_dots<1, 4, false>((float (*)[MAX_TOKENS_PER_PASS])acc, ss, &wr, NULL, xs, n, H, lane);
        store_row<false>(logits, E, r, 0, n, acc, ss, 0.0f, H, 0.0f, 0, lane);
    }
    __syncthreads(); // the logits, written to global memory by the block, seen by it
    for (int t = warp; t < T; t += warps)
        route_token(idx + (size_t)t * k, weight + (size_t)t * k, logits + (size_t)t * E, E, k, norm, lane);
    __syncthreads();
    if (warp == 0) group_slots(groups, idx, T * k, e0, E_local, route_cursor, lane);
}

extern "C" int cuda_route_group(int *groups, int *idx, float *weight, float *logits, float *x, const float *resid,
                                const bf16_bits *mlp_norm, float eps, const bf16_bits *w_router, int T, int E, int H,
                                int k, int norm, int e0, int E_local, const cuda_queue *queue) {
    if (T < 1 || T > MAX_TOKENS_PER_PASS) return 0;
    launch(queue, 1, 256, (size_t)E_local * sizeof(int), route_group_kernel, groups, idx, weight, logits, x, resid,
           mlp_norm, eps, w_router, T, E, H, k, norm, e0, E_local);
    return 1;
}

// --------------------------------------------------------------- expert GEMV
//
// blockIdx.y is a chosen expert (blocks past the number chosen exit), each
// warp one output row of it, the row read once per pass of up to 8 of the
// expert's slots. Without swiglu: y[s, rows] = x_s . W[e]^T. With swiglu
// (W[e] is the [2F, cols] gate-then-up block, F = rows / 2):
// y[s, F] = silu(x_s . gate_r) * (x_s . up_r). With a shared expert
// (sh.gate set) the grid's last blockIdx.y is its own: the same product
// over every token (sh.x rows, its gate and up apart), into sh.y. Its rows
// come out with the bits of the dense GEMVs (cuda_matmul_swiglu,
// cuda_matmul): a lane sums its columns in the same order whatever the
// loads in flight.

template <bool SHARED>
__global__ void expert_gemv_kernel(float *y, const float *x, const bf16_bits *w, const int *groups, int E, int k,
                                   int rows, int cols, int x_per_slot, int swiglu, cuda_shared_gemv sh, int T) {
    await_previous_kernel();
    bool shared = SHARED && blockIdx.y == gridDim.y - 1;
    if (!shared && (int)blockIdx.y >= groups[0]) return;
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, out_rows = shared ? sh.rows : swiglu ? rows / 2 : rows;
    if (r >= out_rows) return;
    int begin = 0, end = T, n_cols = shared ? sh.cols : cols;
    const int *slots = groups + 2 + 2 * E;
    const uint16_t *row[2];
    if (shared) {
        row[0] = sh.gate + (size_t)r * n_cols, row[1] = sh.up ? sh.up + (size_t)r * n_cols : NULL;
    } else {
        int e = groups[1 + blockIdx.y];
        begin = groups[1 + E + blockIdx.y], end = groups[2 + E + blockIdx.y];
        const bf16_bits *we = w + (size_t)e * rows * cols;
        row[0] = we + (size_t)r * cols, row[1] = swiglu ? we + (size_t)(out_rows + r) * cols : NULL;
    }
    for (int b = begin; b < end; b += MAX_TOKENS_PER_PASS) {
        int n = end - b < MAX_TOKENS_PER_PASS ? end - b : MAX_TOKENS_PER_PASS;
        const float *xs[MAX_TOKENS_PER_PASS];
        float gu[2][MAX_TOKENS_PER_PASS];
#pragma unroll
        for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
            int item = b + (i < n ? i : 0), s = shared ? 0 : slots[item];
            xs[i] = shared ? sh.x + (size_t)item * n_cols : x + (size_t)(x_per_slot ? s : s / k) * cols;
            gu[0][i] = gu[1][i] = 0.0f;
        }
        if (row[1]) rows_dots<2, 2, false>(gu, NULL, row, NULL, xs, n, n_cols, lane);
        else row_dots(gu[0], row[0], xs, n, n_cols, lane);
        float *dst = shared ? sh.y : y;
#pragma unroll
        for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
            if (i >= n) break;
            float gv = warp_sum(gu[0][i]), uv = row[1] ? warp_sum(gu[1][i]) : 0.0f;
            int o = shared ? b + i : slots[b + i]; // the output row: the shared expert's token, or the slot
            if (lane == 0) dst[(size_t)o * out_rows + r] = row[1] ? silu_mul(gv, uv) : gv;
        }
    }
}

extern "C" void cuda_expert_matmul(float *y, const float *x, const bf16_bits *w, const int *groups, int T, int k,
                                   int E, int rows, int cols, int x_per_slot, int swiglu, const cuda_shared_gemv *sh,
                                   const cuda_queue *queue) {
    const int threads = 256, warps = threads / WARP;
    int out_rows = swiglu ? rows / 2 : rows, chosen = T * k < E ? T * k : E;
    cuda_shared_gemv none = {};
    if (!sh) sh = &none;
    int grid_rows = sh->gate && sh->rows > out_rows ? sh->rows : out_rows;
    dim3 grid((grid_rows + warps - 1) / warps, chosen + (sh->gate ? 1 : 0));
    // a kernel of its own with the shared expert, so the routed-only one keeps its 80 registers on sm_90 (84)
    launch(queue, grid, threads, 0, sh->gate ? expert_gemv_kernel<true> : expert_gemv_kernel<false>, y, x, w, groups, E,
           k, rows, cols, x_per_slot, swiglu, *sh, T);
}

// ------------------------------------------------------- expert GEMM (prefill)
//
// The same product on tensor cores for a prefill chunk, where an expert has
// many slots: bf16 inputs (xb, rounded like the cuBLASLt path), f32
// accumulation. A block per (chosen expert, tile of EG_TILE_ROWS weight
// rows: with swiglu 64 gate rows and the up rows of the same 64 outputs,
// else 128 output rows), its 4 warps each owning two 16-row fragments of
// the tile, walking the expert's slots EG_SLOTS at a time. A prefill chunk
// reads every expert's weights (150 tokens at top 4 of 60 give an expert ~10
// slots), so the kernel is bound by how many weight bytes are in flight:
// the tile crosses to shared memory EG_KT columns at a time through
// registers, each thread issuing its 16-byte loads of the next tile before
// the tensor cores work on this one (16 KB in flight per block), in 128-byte
// row pieces.
//
// Weights kept as GGUF blocks (cuda_wmat: a dense matrix as one expert, or
// a GGUF's expert stacks, gate and up apart) cross to shared memory as
// bf16, each thread unpacking two 32-weight units of a tile row
// (unit_weights) where the bf16 rows are copied: the rounding of the
// chunked dequantization for cuBLASLt, without its round trip through
// device memory. Without groups (a dense matrix) blockIdx.y is a tile of
// EG_SLOTS tokens instead of an expert, and the outputs go to y's rows ldy
// apart, plus a bias and the old y when asked.

#define EG_TILE_ROWS 128
#define EG_SLOTS 32
#define EG_KT 64
#define EG_LD (EG_KT + 8) // 144-byte rows: the 8 rows of a fragment load fall in different banks
#define EG_THREADS 128
#define EG_PIECES (EG_KT / 8)                              // 16-byte pieces in a tile row
#define EG_W_LOADS (EG_TILE_ROWS * EG_PIECES / EG_THREADS) // 8 a thread
#define EG_X_LOADS (EG_SLOTS * EG_PIECES / EG_THREADS)     // 2 a thread
#define EG_ROW_STEP (EG_THREADS / EG_PIECES)               // tile rows between a thread's pieces

static_assert(EG_TILE_ROWS == EG_THREADS && EG_KT == 64, "blocks: a thread unpacks the two 32-weight units of one tile row");

// What an expert GEMM multiplies: bf16 weights w ([E, rows, cols]), or
// blocks (gate: [E * rows, cols] rows; with swiglu gate and up, each
// [E * rows / 2, cols]); y[slot * ldy + row] (+= when accumulate) + bias.
struct eg_args {
    float *y;
    const bf16_bits *xb, *w, *bias;
    cuda_wmat gate, up;
    const int *groups; // NULL: a dense matrix over T tokens
    int E, k, rows, cols, x_per_slot, T, ldy, accumulate;
};

// Tile row tr -> the weight row it holds, or -1 past the outputs.
template <bool SWIGLU> static __device__ __forceinline__ int eg_weight_row(int tr, int r_first, int out_rows) {
    int half = EG_TILE_ROWS / 2, out = r_first + (SWIGLU ? tr % half : tr);
    if (out >= out_rows) return -1;
    return SWIGLU && tr >= half ? out_rows + out : out;
}

// A 16-byte piece of src at column c (zeros past cols or for a missing row).
static __device__ __forceinline__ uint4 eg_piece(const bf16_bits *src, int c, int cols) {
    return src && c < cols ? *(const uint4 *)(src + c) : make_uint4(0, 0, 0, 0);
}

// Tile row tr's kt columns from k0 (kt 32 or 64) unpacked from its blocks
// into ws as bf16 (zeros for a missing row).
static __device__ __forceinline__ void eg_unpack_row(__nv_bfloat16 *ws, int tr, const uint8_t *row, int type, int k0,
                                                     int kt) {
    uint4 *dst = (uint4 *)(ws + tr * EG_LD);
    for (int u = 0; u < kt / 32; u++) {
        float v[32];
        if (row) unit_weights(type, row, k0 / 32 + u, v);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            unsigned pair[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = 8 * q + 2 * i;
                pair[i] = row ? (unsigned)to_bf(v[c]) | (unsigned)to_bf(v[c + 1]) << 16 : 0u;
            }
            dst[4 * u + q] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
        }
    }
}

template <bool SWIGLU, bool BLOCKS>
__global__ void __launch_bounds__(EG_THREADS) expert_gemm_kernel(eg_args a) {
    await_previous_kernel();
    using namespace nvcuda;
    const bool dense = a.groups == NULL;
    if (dense ? (int)blockIdx.y * EG_SLOTS >= a.T : (int)blockIdx.y >= a.groups[0]) return;
    // ws: the weight tile [EG_TILE_ROWS, EG_LD]; after a pass's last tile,
    // each warp's outputs [4][16 x 16] floats (16 KB of its 18 KB)
    __shared__ __align__(32) __nv_bfloat16 ws[EG_TILE_ROWS * EG_LD];
    __shared__ __align__(32) __nv_bfloat16 xs[EG_SLOTS * EG_LD]; // the pass's slots' inputs, a row each
    const int rows = a.rows, cols = a.cols, k = a.k, E = a.E;
    const int out_rows = SWIGLU ? rows / 2 : rows, block_rows = SWIGLU ? EG_TILE_ROWS / 2 : EG_TILE_ROWS;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, r_first = blockIdx.x * block_rows;
    const int piece = threadIdx.x % EG_PIECES * 8, row0 = threadIdx.x / EG_PIECES;
    // the warp's two fragments: with swiglu gate rows and their up rows
    // (tile rows frag_tr, frag_tr + 64), else tile rows frag_tr, frag_tr + 16;
    // fragment f's output rows start at out_first + 16 f
    const int frag_tr = SWIGLU ? warp * 16 : warp * 32, frag_step = SWIGLU ? EG_TILE_ROWS / 2 : 16;
    const int out_first = r_first + frag_tr;
    int e = 0, begin = blockIdx.y * EG_SLOTS, end = begin + EG_SLOTS < a.T ? begin + EG_SLOTS : a.T;
    if (!dense) e = a.groups[1 + blockIdx.y], begin = a.groups[1 + E + blockIdx.y], end = a.groups[2 + E + blockIdx.y];
    const int *slots = dense ? NULL : a.groups + 2 + 2 * E;
    const bf16_bits *wrow[EG_W_LOADS];
    const uint8_t *brow = NULL; // BLOCKS: tile row threadIdx.x's blocks
    int btype = 0;
    if (BLOCKS) {
        int r = eg_weight_row<SWIGLU>(threadIdx.x, r_first, out_rows);
        const cuda_wmat &m = SWIGLU && r >= out_rows ? a.up : a.gate;
        if (r >= 0)
            brow = (const uint8_t *)m.p + ((size_t)e * out_rows + (r >= out_rows ? r - out_rows : r)) * m.row_bytes;
        btype = m.type;
    } else {
        const bf16_bits *we = a.w + (size_t)e * rows * cols;
#pragma unroll
        for (int j = 0; j < EG_W_LOADS; j++) {
            int r = eg_weight_row<SWIGLU>(row0 + j * EG_ROW_STEP, r_first, out_rows);
            wrow[j] = r < 0 ? NULL : we + (size_t)r * cols;
        }
    }
    for (int b = begin; b < end; b += EG_SLOTS) {
        int n = end - b < EG_SLOTS ? end - b : EG_SLOTS;
        const bf16_bits *xrow[EG_X_LOADS];
#pragma unroll
        for (int j = 0; j < EG_X_LOADS; j++) {
            int jj = row0 + j * EG_ROW_STEP, s = jj < n ? (dense ? b + jj : slots[b + jj]) : 0;
            xrow[j] = jj < n ? a.xb + (size_t)(a.x_per_slot || dense ? s : s / k) * cols : NULL; // past n: zeros
        }
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][EG_SLOTS / 16]; // [row frag][slot frag]
#pragma unroll
        for (int f = 0; f < 2; f++)
#pragma unroll
            for (int g = 0; g < EG_SLOTS / 16; g++) wmma::fill_fragment(acc[f][g], 0.0f);
        uint4 wv[EG_W_LOADS], xv[EG_X_LOADS]; // wv: bf16 weights only
        if (!BLOCKS) {
#pragma unroll
            for (int j = 0; j < EG_W_LOADS; j++) wv[j] = eg_piece(wrow[j], piece, cols);
        }
#pragma unroll
        for (int j = 0; j < EG_X_LOADS; j++) xv[j] = eg_piece(xrow[j], piece, cols);
        for (int k0 = 0; k0 < cols; k0 += EG_KT) {
            int kt = cols - k0 < EG_KT ? cols - k0 : EG_KT; // a multiple of 16 (cols % 16 == 0; blocks: of 32)
            __syncthreads(); // every warp is done with the previous tile (or with its outputs in ws)
            if (BLOCKS) {
                eg_unpack_row(ws, threadIdx.x, brow, btype, k0, kt);
            } else {
#pragma unroll
                for (int j = 0; j < EG_W_LOADS; j++) *(uint4 *)(ws + (row0 + j * EG_ROW_STEP) * EG_LD + piece) = wv[j];
            }
#pragma unroll
            for (int j = 0; j < EG_X_LOADS; j++) *(uint4 *)(xs + (row0 + j * EG_ROW_STEP) * EG_LD + piece) = xv[j];
            __syncthreads();
            if (k0 + EG_KT < cols) { // the next tile's loads, in flight while the tensor cores work
                if (!BLOCKS) {
#pragma unroll
                    for (int j = 0; j < EG_W_LOADS; j++) wv[j] = eg_piece(wrow[j], k0 + EG_KT + piece, cols);
                }
#pragma unroll
                for (int j = 0; j < EG_X_LOADS; j++) xv[j] = eg_piece(xrow[j], k0 + EG_KT + piece, cols);
            }
            for (int kk = 0; kk < kt; kk += 16) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> xf[EG_SLOTS / 16];
#pragma unroll
                for (int g = 0; g < EG_SLOTS / 16; g++) wmma::load_matrix_sync(xf[g], xs + g * 16 * EG_LD + kk, EG_LD);
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> wf;
                    wmma::load_matrix_sync(wf, ws + (frag_tr + f * frag_step) * EG_LD + kk, EG_LD);
#pragma unroll
                    for (int g = 0; g < EG_SLOTS / 16; g++) wmma::mma_sync(acc[f][g], wf, xf[g], acc[f][g]);
                }
            }
        }
        __syncthreads(); // ws is free: the warps' outputs go there
        // cs[frag][slot][row] (16 rows of a slot contiguous), so 16 lanes
        // store 16 neighbouring floats of one slot's output row
        float *cs = (float *)ws + warp * 2 * (EG_SLOTS / 16) * 256;
#pragma unroll
        for (int f = 0; f < 2; f++)
#pragma unroll
            for (int g = 0; g < EG_SLOTS / 16; g++)
                wmma::store_matrix_sync(cs + (f * (EG_SLOTS / 16) + g) * 256, acc[f][g], 16, wmma::mem_col_major);
        __syncwarp();
        const int per_frag = EG_SLOTS * 16; // (slot, row) pairs of a row fragment
        for (int i = lane; i < (SWIGLU ? 1 : 2) * per_frag; i += WARP) {
            int f = i / per_frag, j = i % per_frag / 16, r = i % 16, row = out_first + 16 * f + r;
            if (j >= n || row >= out_rows) continue;
            float v = cs[f * per_frag + j * 16 + r];
            if (SWIGLU) v = silu_mul(v, cs[per_frag + j * 16 + r]);
            float *out = a.y + (size_t)(dense ? b + j : slots[b + j]) * a.ldy + row;
            if (a.bias) v += bf(a.bias[row]);
            *out = a.accumulate ? *out + v : v;
        }
    }
}

// The launch over groups (experts), or without them over T tokens.
static void expert_gemm(const eg_args &a, bool swiglu, bool blocks, const cuda_queue *queue) {
    int out_rows = swiglu ? a.rows / 2 : a.rows, block_rows = swiglu ? EG_TILE_ROWS / 2 : EG_TILE_ROWS;
    int chosen = a.groups ? (a.T * a.k < a.E ? a.T * a.k : a.E) : (a.T + EG_SLOTS - 1) / EG_SLOTS;
    dim3 grid((out_rows + block_rows - 1) / block_rows, chosen);
    auto kernel = swiglu ? (blocks ? expert_gemm_kernel<true, true> : expert_gemm_kernel<true, false>)
                         : (blocks ? expert_gemm_kernel<false, true> : expert_gemm_kernel<false, false>);
    launch(queue, grid, EG_THREADS, 0, kernel, a);
}

extern "C" int cuda_expert_gemm(float *y, const bf16_bits *xb, const bf16_bits *w, const int *groups, int T, int k,
                                int E, int rows, int cols, int x_per_slot, int swiglu, const cuda_queue *queue) {
    int out_rows = swiglu ? rows / 2 : rows;
    if (cols % 16 || out_rows % 16) return 0; // whole 16 x 16 tiles only
    eg_args a = {y, xb, w, NULL, {}, {}, groups, E, k, rows, cols, x_per_slot, T, out_rows, 0};
    expert_gemm(a, swiglu, false, queue);
    return 1;
}

extern "C" void cuda_expert_gemm_blocks(float *y, const bf16_bits *xb, cuda_wmat gate, cuda_wmat up,
                                        const int *groups, int T, int k, int E, int rows, int cols, int x_per_slot,
                                        const cuda_queue *queue) {
    int swiglu = up.p != NULL;
    eg_args a = {y, xb, NULL, NULL, gate, up, groups, E, k, swiglu ? 2 * rows : rows, cols, x_per_slot, T, rows, 0};
    expert_gemm(a, swiglu, true, queue);
}

extern "C" void cuda_gemm_blocks(float *y, int ldy, const bf16_bits *xb, cuda_wmat gate, cuda_wmat up,
                                 const bf16_bits *bias, int T, int rows, int cols, int accumulate,
                                 const cuda_queue *queue) {
    int swiglu = up.p != NULL;
    eg_args a = {y, xb, NULL, bias, gate, up, NULL, 1, 1, swiglu ? 2 * rows : rows, cols, 1, T, ldy, accumulate};
    expert_gemm(a, swiglu, true, queue);
}

// -------------------------------------------------------------------- combine

// A block per token: x[t] (+)= sum_j weight[t, j] * y[t*k + j] in j order over
// the slots of experts e0..e0+E-1, plus sigmoid(xn[t] . gate_w) * shared[t]
// when there is a shared expert.
__global__ void moe_combine_kernel(float *x, const float *y, const float *weight, const int *idx, int e0, int E,
                                   const float *shared, const float *xn, const bf16_bits *gate_w, int k, int H,
                                   int residual) {
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
        for (int j = 0; j < k; j++) {
            int e = idx[(size_t)t * k + j] - e0;
            if (e >= 0 && e < E) out += y[((size_t)t * k + j) * H + i] * weight[(size_t)t * k + j];
        }
        if (shared) out += sig * shared[(size_t)t * H + i];
        x[(size_t)t * H + i] = residual ? x[(size_t)t * H + i] + out : out;
    }
}

extern "C" void cuda_moe_combine(float *x, const float *y, const float *weight, const int *idx, int e0, int E,
                                 const float *shared, const float *xn, const bf16_bits *gate_w, int T, int k, int H,
                                 int residual, const cuda_queue *queue) {
    launch(queue, T, 256, 0, moe_combine_kernel, x, y, weight, idx, e0, E, shared, xn, gate_w, k, H, residual);
}
