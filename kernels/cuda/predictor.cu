// The PoLar predictor as one fused CUDA kernel: projection, cross-attention,
// both encoder layers and both heads in a single cooperative launch, stages
// separated by grid syncs. f32 throughout, the math of the CPU forward
// (predictor/train.c, with dropout off).
//
// Linear layers are block tiles (16 inputs x 32 output rows, the reduction
// staged through shared memory TK columns at a time, the next chunk's loads
// in flight while this one is multiplied): a weight row is read once per 16
// inputs and an input once per 32 rows. TK 32, or 128 with
// POLAR_CUDA_PRED_WIDE=1: a quarter of the steps, each a load round trip
// the multiply-adds of 32 columns do not hide (untimed: a GPU decides); or
// TK 32 with POLAR_CUDA_PRED_ASYNC=1: PRED_STAGES chunks in flight at once,
// copied by cp.async straight into a ring of shared-memory stages (no
// register round trip, three chunks' loads behind the one multiplied).
// With POLAR_CUDA_PRED_FUSE_NORM=1 (TK 32 or 128) the encoder layers'
// LayerNorms run inside the linears that read them (ln_input): 14 grid syncs
// a call instead of 18.
// Every variant sums each output in the same order: the same bits. Attention is a warp per (query,
// head) with its probabilities in shared memory. The grid is at most two
// blocks per multiprocessor (launch bounds hold the registers to 128 for
// that): up to T 256 no stage has more tiles, and a grid sync costs more the
// more blocks it waits for.
#include <cooperative_groups.h>
#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "predictor_cuda.h"
#include "common.cuh"

namespace cg = cooperative_groups;

#define LN_EPS 1e-5f
#define TILE_IN 16   // inputs (tokens or layer positions) per tile
#define TILE_ROWS 32 // output rows per tile
#define PRED_STAGES 4 // chunks in flight with POLAR_CUDA_PRED_ASYNC=1
#define WARPS (PRED_CUDA_THREADS / WARP)

static_assert(PRED_CUDA_THREADS == 256, "linear's thread layout: 16 inputs x 16 row pairs");

// A linear's input given as LayerNorm(x + y) (w, b its weights), computed
// as the linear stages it; out (may be null) receives the normed rows.
struct ln_input {
    const float *y, *w, *b;
    float *out;
};

// Mean and 1 / std of row x + y (d values), by one warp: every lane gets them.
static __device__ __forceinline__ void ln_row_stats(const float *xr, const float *yr, int d, float *mean_out,
                                                    float *inv_out) {
    int lane = threadIdx.x % WARP;
    float mean = 0.0f;
    for (int c = lane; c < d; c += WARP) mean += xr[c] + yr[c];
    mean = warp_sum(mean) / (float)d;
    float var = 0.0f;
    for (int c = lane; c < d; c += WARP) var += (xr[c] + yr[c] - mean) * (xr[c] + yr[c] - mean);
    float inv = 1.0f / sqrtf(warp_sum(var) / (float)d + LN_EPS);
    *mean_out = mean, *inv_out = inv;
}

// One normed value, the same expression wherever it is computed (same bits).
static __device__ __forceinline__ float ln_value(float x, float y, float mean, float inv, float w, float b) {
    return (x + y - mean) * inv * w + b;
}

// acc0 (acc1) += a chunk's TK columns of input xr against weight row w0
// (w1), in column order: the one multiply loop of every linear variant.
template <int TK>
static __device__ __forceinline__ void chunk_dots(const float *xr, const float *w0r, const float *w1r, float *acc0,
                                                  float *acc1) {
#pragma unroll
    for (int k = 0; k < TK; k += 4) {
        float4 a = *(const float4 *)&xr[k];
        float4 w0 = *(const float4 *)&w0r[k], w1 = *(const float4 *)&w1r[k];
        *acc0 += a.x * w0.x, *acc0 += a.y * w0.y, *acc0 += a.z * w0.z, *acc0 += a.w * w0.w;
        *acc1 += a.x * w1.x, *acc1 += a.y * w1.y, *acc1 += a.z * w1.z, *acc1 += a.w * w1.w;
    }
}

// Outputs (t, r) and (t, r + 16) of a tile: the sums plus bias, relu'd.
static __device__ __forceinline__ void store_pair(float *y, const float *b, int n, int rows, int relu, int t, int r,
                                                  float acc0, float acc1) {
    float acc[2] = {acc0, acc1};
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int ri = r + 16 * i;
        if (t >= n || ri >= rows) continue;
        float v = acc[i] + (b ? b[ri] : 0.0f);
        y[(size_t)t * rows + ri] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// A linear's shared staging, one per TK (the normed and plain linears of a
// kernel share it: two copies would pass the 48 KB of static shared memory).
template <int TK>
struct linear_smem {
    __align__(16) float xs[TILE_IN][TK];
    __align__(16) float ws[TILE_ROWS][TK + 4]; // +4: rows tx and tx + 1 start 4 banks apart
    float ln_mean[TILE_IN], ln_inv[TILE_IN];   // the normed input rows' statistics
    ln_input ln;                               // what the normed linears norm (a shared value: the plain
                                               // linears' calls keep their registers)
};

template <int TK>
static __device__ __forceinline__ linear_smem<TK> &linear_shared() {
    __shared__ linear_smem<TK> sm;
    return sm;
}

// The input the next linear<TK, 1> calls norm, for the whole block.
template <int TK>
static __device__ void normed_input(const float *y, const float *w, const float *b, float *out) {
    __syncthreads(); // a linear before may still read the last one
    if (threadIdx.x == 0) linear_shared<TK>().ln = ln_input{y, w, b, out};
    __syncthreads();
}

// y[n, rows] = x[n, cols] . W[rows, cols]^T + b  (relu: max(0, .)). Tiles go
// to blocks from block `skew` on, so two linears of one stage share the grid.
// Each thread owns input ty and rows tx, tx + 16 of its tile and sums the
// columns in order (the same bits for every TK).
template <int TK, int LN = 0>
static __device__ void linear(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols,
                              int relu, int skew) {
    constexpr int PER = PRED_CUDA_THREADS / TK; // threads a column: inputs and rows xi + PER i
    linear_smem<TK> &sm = linear_shared<TK>();
    auto &xs = sm.xs;
    auto &ws = sm.ws;
    float *ln_mean = sm.ln_mean, *ln_inv = sm.ln_inv;
    const ln_input *ln = &sm.ln; // LN: set by normed_input
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int row_tiles = (rows + TILE_ROWS - 1) / TILE_ROWS, tiles = (n + TILE_IN - 1) / TILE_IN * row_tiles;
    int first = (int)((blockIdx.x + gridDim.x - (unsigned)skew % gridDim.x) % gridDim.x);
    for (int tile = first; tile < tiles; tile += gridDim.x) {
        int t0 = tile / row_tiles * TILE_IN, r0 = tile % row_tiles * TILE_ROWS;
        if constexpr (LN) { // the tile's input rows' statistics, a warp a row as add_layer_norm
            for (int i = tid / WARP; i < TILE_IN && t0 + i < n; i += WARPS) {
                float mean, inv;
                ln_row_stats(x + (size_t)(t0 + i) * cols, ln->y + (size_t)(t0 + i) * cols, cols, &mean, &inv);
                if (tid % WARP == 0) ln_mean[i] = mean, ln_inv[i] = inv;
            }
            __syncthreads();
        }
        // this thread's staging: TILE_IN / PER input values and TILE_ROWS /
        // PER weight values per step, a warp reading 32 consecutive columns
        // of one row (128 bytes)
        float xv[TILE_IN / PER], wv[TILE_ROWS / PER];
        int kc = tid % TK, xi = tid / TK;
        auto fetch = [&](int k0) {
            int c = k0 + kc;
#pragma unroll
            for (int i = 0; i < TILE_IN / PER; i++) {
                int t = t0 + xi + PER * i;
                if constexpr (!LN) {
                    xv[i] = t < n && c < cols ? x[(size_t)t * cols + c] : 0.0f;
                } else if (t < n && c < cols) { // normed; the first row tile also keeps the rows for the residual
                    size_t at = (size_t)t * cols + c;
                    xv[i] = ln_value(x[at], ln->y[at], ln_mean[xi + PER * i], ln_inv[xi + PER * i], ln->w[c], ln->b[c]);
                    if (ln->out && r0 == 0) ln->out[at] = xv[i];
                } else {
                    xv[i] = 0.0f;
                }
            }
#pragma unroll
            for (int i = 0; i < TILE_ROWS / PER; i++) {
                int r = r0 + xi + PER * i;
                wv[i] = r < rows && c < cols ? w[(size_t)r * cols + c] : 0.0f;
            }
        };
        fetch(0);
        float acc0 = 0.0f, acc1 = 0.0f;
        for (int k0 = 0; k0 < cols; k0 += TK) {
#pragma unroll
            for (int i = 0; i < TILE_IN / PER; i++) xs[xi + PER * i][kc] = xv[i];
#pragma unroll
            for (int i = 0; i < TILE_ROWS / PER; i++) ws[xi + PER * i][kc] = wv[i];
            __syncthreads();
            if (k0 + TK < cols) fetch(k0 + TK);
            chunk_dots<TK>(xs[ty], ws[tx], ws[tx + 16], &acc0, &acc1);
            __syncthreads();
        }
        store_pair(y, b, n, rows, relu, t0 + ty, r0 + tx, acc0, acc1);
    }
}

// A chunk of stage: 16 bytes of src from element c of row `row` (zeros
// past nrows or cols) into dst, by cp.async where a whole aligned piece
// exists, else a float at a time (cp.async each, or a zero stored).
static __device__ __forceinline__ void stage_piece(float *dst, const float *src, int row, int nrows, int c, int cols,
                                                   int vec) {
    if (row < nrows && vec && c + 4 <= cols) {
        __pipeline_memcpy_async(dst, src + (size_t)row * cols + c, 16);
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (row < nrows && c + j < cols) __pipeline_memcpy_async(dst + j, src + (size_t)row * cols + c + j, 4);
        else dst[j] = 0.0f;
    }
}

// linear<32> with the chunks in a ring of PRED_STAGES shared-memory stages
// filled by cp.async: chunk k + PRED_STAGES - 1 is requested as chunk k is
// multiplied (POLAR_CUDA_PRED_ASYNC=1). The same sums in the same order.
static __device__ void linear_async(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols,
                                    int relu, int skew) {
    constexpr int TK = 32, PIECES = TK / 4; // 16-byte pieces a chunk row
    __shared__ __align__(16) float xs[PRED_STAGES][TILE_IN][TK];
    __shared__ __align__(16) float ws[PRED_STAGES][TILE_ROWS][TK + 4];
    static_assert(TILE_ROWS * PIECES == PRED_CUDA_THREADS, "a weight piece a thread, an input piece every other");
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int row_tiles = (rows + TILE_ROWS - 1) / TILE_ROWS, tiles = (n + TILE_IN - 1) / TILE_IN * row_tiles;
    int first = (int)((blockIdx.x + gridDim.x - (unsigned)skew % gridDim.x) % gridDim.x);
    // 16-byte pieces need 16-byte aligned rows
    int vec_w = cols % 4 == 0 && (uintptr_t)w % 16 == 0, vec_x = cols % 4 == 0 && (uintptr_t)x % 16 == 0;
    int steps = (cols + TK - 1) / TK, pr = tid / PIECES, pc = tid % PIECES * 4;
    for (int tile = first; tile < tiles; tile += gridDim.x) {
        int t0 = tile / row_tiles * TILE_IN, r0 = tile % row_tiles * TILE_ROWS;
        auto request = [&](int step) { // chunk step into stage step % PRED_STAGES, as one group
            if (step < steps) {
                int st = step % PRED_STAGES, c = step * TK + pc;
                stage_piece(&ws[st][pr][pc], w, r0 + pr, rows, c, cols, vec_w);
                if (pr < TILE_IN) stage_piece(&xs[st][pr][pc], x, t0 + pr, n, c, cols, vec_x);
            }
            __pipeline_commit();
        };
        for (int s = 0; s < PRED_STAGES - 1; s++) request(s);
        float acc0 = 0.0f, acc1 = 0.0f;
        for (int step = 0; step < steps; step++) {
            __pipeline_wait_prior(PRED_STAGES - 2); // this thread's pieces of chunk step have landed
            __syncthreads();                        // everyone's; and chunk step - 1's stage is free
            request(step + PRED_STAGES - 1);
            int st = step % PRED_STAGES;
            chunk_dots<TK>(xs[st][ty], ws[st][tx], ws[st][tx + 16], &acc0, &acc1);
        }
        __pipeline_wait_prior(0);
        __syncthreads(); // the next tile's first requests overwrite stages still being read
        store_pair(y, b, n, rows, relu, t0 + ty, r0 + tx, acc0, acc1);
    }
}

// ctx[nq, d]: per (query, head), softmax(q k^T / sqrt(dh)) v over nk <=
// PRED_CUDA_MAX_KEYS keys. Query row i starts at q + i * ldq, key and value
// row j at k + j * ldkv, v + j * ldkv (slices of one fused projection);
// head h at h * dh within a row.
static __device__ void attention(float *ctx, const float *q, int ldq, const float *k, const float *v, int ldkv,
                                 int nq, int nk, int d, int heads) {
    __shared__ float probs[WARPS][PRED_CUDA_MAX_KEYS];
    int lane = threadIdx.x % WARP, wib = threadIdx.x / WARP;
    long warp = (long)blockIdx.x * WARPS + wib, warps = (long)gridDim.x * WARPS;
    float *p = probs[wib];
    int dh = d / heads;
    int vec = dh % 4 == 0 && ldq % 4 == 0 && ldkv % 4 == 0; // every head slice 16-byte aligned
    // Weighted sums of values: a head's dh / 4 channel quads across the lanes
    // and the keys split into the groups the spare lanes make (dh 64: 16
    // quads, 2 groups), when the quads divide the warp; else a lane a channel.
    int quads = dh / 4, groups = vec && quads <= WARP && WARP % quads == 0 ? WARP / quads : 0;
    float scale = 1.0f / sqrtf((float)dh);
    for (long task = warp; task < (long)nq * heads; task += warps) {
        int i = (int)(task / heads), h = (int)(task % heads);
        const float *qh = q + (size_t)i * ldq + (size_t)h * dh;
        float mx = -INFINITY;
        for (int j = lane; j < nk; j += WARP) {
            const float *kj = k + (size_t)j * ldkv + (size_t)h * dh;
            float s = 0.0f;
            if (vec)
                for (int c = 0; c < dh; c += 4) {
                    float4 a = *(const float4 *)(qh + c), b = *(const float4 *)(kj + c);
                    s += a.x * b.x, s += a.y * b.y, s += a.z * b.z, s += a.w * b.w;
                }
            else
                for (int c = 0; c < dh; c++) s += qh[c] * kj[c];
            p[j] = s * scale;
            mx = fmaxf(mx, p[j]);
        }
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < nk; j += WARP) sum += (p[j] = expf(p[j] - mx));
        sum = warp_sum(sum);
        __syncwarp(); // every lane's probabilities visible to the others
        float inv = 1.0f / sum, *out = ctx + (size_t)i * d + (size_t)h * dh;
        if (groups) {
            // a lane: channels 4 cq..4 cq + 3 over keys g, g + groups, ...;
            // four keys' loads issued before their multiply-adds
            int cq = lane % quads, g = lane / quads;
            const float *vq = v + (size_t)h * dh + 4 * cq;
            float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            int j = g;
            for (; j + 3 * groups < nk; j += 4 * groups) {
                float4 r[4];
#pragma unroll
                for (int u = 0; u < 4; u++) r[u] = *(const float4 *)(vq + (size_t)(j + u * groups) * ldkv);
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float pj = p[j + u * groups];
                    o.x += pj * r[u].x, o.y += pj * r[u].y, o.z += pj * r[u].z, o.w += pj * r[u].w;
                }
            }
            for (; j < nk; j += groups) {
                float4 r = *(const float4 *)(vq + (size_t)j * ldkv);
                float pj = p[j];
                o.x += pj * r.x, o.y += pj * r.y, o.z += pj * r.z, o.w += pj * r.w;
            }
            for (int off = quads; off < WARP; off *= 2) { // lanes of one quad: the key groups' sums
                o.x += __shfl_xor_sync(0xffffffffu, o.x, off), o.y += __shfl_xor_sync(0xffffffffu, o.y, off);
                o.z += __shfl_xor_sync(0xffffffffu, o.z, off), o.w += __shfl_xor_sync(0xffffffffu, o.w, off);
            }
            if (g == 0) *(float4 *)(out + 4 * cq) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
        } else {
            for (int c = lane; c < dh; c += WARP) {
                const float *vc = v + (size_t)h * dh + c;
                float o = 0.0f;
                for (int j = 0; j < nk; j++) o += p[j] * vc[(size_t)j * ldkv];
                out[c] = o * inv;
            }
        }
        __syncwarp(); // the next task's scores overwrite p
    }
}

// x[rows, d] = LayerNorm(x + y), a warp per row.
static __device__ void add_layer_norm(float *x, const float *y, const float *w, const float *b, int rows, int d) {
    int lane = threadIdx.x % WARP;
    long warp = (long)blockIdx.x * WARPS + threadIdx.x / WARP, warps = (long)gridDim.x * WARPS;
    for (long r = warp; r < rows; r += warps) {
        float *xr = x + (size_t)r * d;
        const float *yr = y + (size_t)r * d;
        float mean, inv;
        ln_row_stats(xr, yr, d, &mean, &inv);
        __syncwarp();
        for (int c = lane; c < d; c += WARP) xr[c] = ln_value(xr[c], yr[c], mean, inv, w[c], b[c]);
    }
}

// Tiles of a linear, for skewing the next one of the same stage.
static __device__ int tiles_of(int n, int rows) {
    return (n + TILE_IN - 1) / TILE_IN * ((rows + TILE_ROWS - 1) / TILE_ROWS);
}

// The linear of the variant the kernel was built for.
template <int TK, int ASYNC>
static __device__ __forceinline__ void lin(float *y, const float *x, const float *w, const float *b, int n, int rows,
                                           int cols, int relu, int skew) {
    if constexpr (ASYNC) linear_async(y, x, w, b, n, rows, cols, relu, skew);
    else linear<TK>(y, x, w, b, n, rows, cols, relu, skew);
}

// The two encoder layers and the heads with POLAR_CUDA_PRED_FUSE_NORM=1:
// each LayerNorm is left pending (x + y, its weights) for the linears that
// read it next, which norm their inputs as they stage them and write the
// normed rows into the other residual buffer (the rows they read stay as
// they are while the stage runs). Two grid syncs a layer fewer; the same
// operations on every value, so the same bits.
template <int TK>
static __device__ void encoder_fused_norms(const pred_cuda_args &a, cg::grid_group &grid) {
    int D = a.D, d = a.d;
    float *x = a.x, *spare = a.x2;
    // out = linear(LayerNorm(x + y)); the normed rows become x
    auto normed_linear = [&](float *out, const float *w, const float *bias, int rows, int relu, const float *nw,
                             const float *nb) {
        normed_input<TK>(a.y, nw, nb, spare);
        linear<TK, 1>(out, x, w, bias, D, rows, d, relu, 0);
        float *t = x;
        x = spare, spare = t;
    };
    const float *norm_w = nullptr, *norm_b = nullptr; // the pending norm's weights (none before the first layer)
    for (int blk = 0; blk < PRED_CUDA_BLOCKS; blk++) {
        const pred_cuda_block *b = &a.blocks[blk];
        if (norm_w) normed_linear(a.qkv, b->attn.in_w, b->attn.in_b, 3 * d, 0, norm_w, norm_b);
        else linear<TK>(a.qkv, x, b->attn.in_w, b->attn.in_b, D, 3 * d, d, 0, 0);
        grid.sync();
        attention(a.att, a.qkv, 3 * d, a.qkv + d, a.qkv + 2 * d, 3 * d, D, D, d, a.heads);
        grid.sync();
        linear<TK>(a.y, a.att, b->attn.out_w, b->attn.out_b, D, d, d, 0, 0);
        grid.sync();
        normed_linear(a.hid, b->lin1_w, b->lin1_b, a.ff, 1, b->norm1_w, b->norm1_b);
        grid.sync();
        linear<TK>(a.y, a.hid, b->lin2_w, b->lin2_b, D, d, a.ff, 0, 0);
        grid.sync();
        norm_w = b->norm2_w, norm_b = b->norm2_b;
    }
    normed_input<TK>(a.y, norm_w, norm_b, nullptr); // both heads norm the last rows themselves
    linear<TK, 1>(a.seg, x, a.seg_w, a.seg_b, D, 1, d, 0, 0);
    linear<TK, 1>(a.op, x, a.op_w, a.op_b, D, 3, d, 0, tiles_of(D, 1));
}

template <int TK, int ASYNC, int NORM>
__global__ void __launch_bounds__(PRED_CUDA_THREADS, 2) predictor_kernel(pred_cuda_args a) {
    static_assert(!(ASYNC && NORM), "the normed inputs are staged through registers");
    cg::grid_group grid = cg::this_grid();
    int D = a.D, d = a.d, T = a.T;
    // the token projection; the layer queries (independent of it and of
    // the input: kept from the first call)
    lin<TK, ASYNC>(a.tok, a.h, a.q_proj_w, a.q_proj_b, T, d, a.dq, 0, 0);
    if (!a.q_ready) lin<TK, ASYNC>(a.q, a.layer_emb, a.cross.in_w, a.cross.in_b, D, d, d, 0, tiles_of(T, d));
    grid.sync();
    // the tokens' keys and values: rows d..3d of in_w, one [T, 2d] product
    lin<TK, ASYNC>(a.kv, a.tok, a.cross.in_w + (size_t)d * d, a.cross.in_b + d, T, 2 * d, d, 0, 0);
    grid.sync();
    attention(a.att, a.q, d, a.kv, a.kv + d, 2 * d, D, T, d, a.heads);
    grid.sync();
    lin<TK, ASYNC>(a.x, a.att, a.cross.out_w, a.cross.out_b, D, d, d, 0, 0);
    grid.sync();
    if constexpr (NORM) {
        encoder_fused_norms<TK>(a, grid);
    } else {
        for (int blk = 0; blk < PRED_CUDA_BLOCKS; blk++) {
            const pred_cuda_block *b = &a.blocks[blk];
            lin<TK, ASYNC>(a.qkv, a.x, b->attn.in_w, b->attn.in_b, D, 3 * d, d, 0, 0);
            grid.sync();
            attention(a.att, a.qkv, 3 * d, a.qkv + d, a.qkv + 2 * d, 3 * d, D, D, d, a.heads);
            grid.sync();
            lin<TK, ASYNC>(a.y, a.att, b->attn.out_w, b->attn.out_b, D, d, d, 0, 0);
            grid.sync();
            add_layer_norm(a.x, a.y, b->norm1_w, b->norm1_b, D, d);
            grid.sync();
            lin<TK, ASYNC>(a.hid, a.x, b->lin1_w, b->lin1_b, D, a.ff, d, 1, 0);
            grid.sync();
            lin<TK, ASYNC>(a.y, a.hid, b->lin2_w, b->lin2_b, D, d, a.ff, 0, 0);
            grid.sync();
            add_layer_norm(a.x, a.y, b->norm2_w, b->norm2_b, D, d);
            grid.sync();
        }
        lin<TK, ASYNC>(a.seg, a.x, a.seg_w, a.seg_b, D, 1, d, 0, 0);
        lin<TK, ASYNC>(a.op, a.x, a.op_w, a.op_b, D, 3, d, 0, tiles_of(D, 1));
    }
}

// The kernel of a variant: tile_k 32 or 128, or the cp.async ring (async), the norms fused or not.
static const void *predictor_variant(int tile_k, int async, int fuse_norm) {
    if (async) return (const void *)predictor_kernel<32, 1, 0>;
    if (fuse_norm)
        return tile_k == 128 ? (const void *)predictor_kernel<128, 0, 1> : (const void *)predictor_kernel<32, 0, 1>;
    return tile_k == 128 ? (const void *)predictor_kernel<128, 0, 0> : (const void *)predictor_kernel<32, 0, 0>;
}

extern "C" int cuda_predictor_grid(int tk, int async, int fuse_norm, int *blocks, char *why, size_t why_size) {
    int device, sms, coop = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, predictor_variant(tk, async, fuse_norm),
                                                          PRED_CUDA_THREADS, 0);
    if (e != cudaSuccess) {
        snprintf(why, why_size, "%s", cudaGetErrorString(e));
        return 0;
    }
    if (!coop || per_sm < 1) {
        snprintf(why, why_size, "%s", !coop ? "the GPU does not support cooperative launches"
                                            : "the fused kernel does not fit on a multiprocessor");
        return 0;
    }
    // every block resident at once, as the grid syncs need; two a
    // multiprocessor cover every stage's tiles up to T 256 in one round
    *blocks = sms * (per_sm < 2 ? per_sm : 2);
    return 1;
}

extern "C" int cuda_predictor_launch(const pred_cuda_args *args, int blocks, void *stream) {
    pred_cuda_args copy = *args;
    void *params[] = {&copy};
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid(blocks), block(PRED_CUDA_THREADS);
    // each variant named (the emulation unpacks params with the kernel's own types)
    if (args->async)
        return (int)cudaLaunchCooperativeKernel((void *)predictor_kernel<32, 1, 0>, grid, block, params, 0, s);
    if (args->fuse_norm && args->tile_k == 128)
        return (int)cudaLaunchCooperativeKernel((void *)predictor_kernel<128, 0, 1>, grid, block, params, 0, s);
    if (args->fuse_norm)
        return (int)cudaLaunchCooperativeKernel((void *)predictor_kernel<32, 0, 1>, grid, block, params, 0, s);
    if (args->tile_k == 128)
        return (int)cudaLaunchCooperativeKernel((void *)predictor_kernel<128, 0, 0>, grid, block, params, 0, s);
    return (int)cudaLaunchCooperativeKernel((void *)predictor_kernel<32, 0, 0>, grid, block, params, 0, s);
}
