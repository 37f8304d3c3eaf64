// Kernels over GGUF blocks kept quantized in device memory (ops.h,
// cuda_wmat): the decode GEMVs (alone, q/k/v in one launch, gate/up with
// the SwiGLU epilogue, each with the RMSNorm on the fly as the bf16 ones
// have it; the routed experts' per chosen expert), rows dequantized to bf16
// for the chunked prefill GEMMs (POLAR_CUDA_BLOCKS_GEMM=chunked; the fused
// prefill tiles are moe.cu's), and embedding rows. Each GEMV reads a
// matrix's bytes once per pass of up to 8 tokens: by dp4a on the pass's
// inputs quantized into shared memory (q8.cuh), or unpacking 32 weights at
// a time into registers for f32 products (blocks.cuh).
// tests/cuda_block_checks.h checks them against the CPU's dequantized rows.
#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "blocks.cuh"
#include "common.cuh"
#include "ops.h"
#include "q8.cuh"

// Up to three matrices sharing one input (q, k and v), as gemv_parts in
// ops.cu, each of its own type; y rows ld floats apart.
struct qgemv_part {
    float *y;
    cuda_wmat w;
    const bf16_bits *bias;
    int rows, ld;
};
struct qgemv_parts {
    qgemv_part p[3];
    int n, rows;
};

// acc[r][t] += this lane's share of w_r . xs[t] for R rows (types uniform
// across the warp) and n <= MAX_TOKENS_PER_PASS inputs: the lane takes the
// 32-weight units lane, lane + 32, ... of the rows (cols a multiple of 32,
// rows of whole blocks). NORM: the inputs are residual rows, scaled by the
// norm weights as loaded, ss[t] gathering x^2 (rms_scale finishes it), as
// dot8 does for bf16 rows.
template <int R, bool NORM>
static __device__ __forceinline__ void units_dots(float (*acc)[MAX_TOKENS_PER_PASS], float *ss, const cuda_wmat *w,
                                                  const uint8_t *const *rows, const uint16_t *norm,
                                                  const float *const xs[MAX_TOKENS_PER_PASS], int n, int cols,
                                                  int lane) {
    for (int k = lane; k < cols / 32; k += WARP) {
        float wv[R][32];
#pragma unroll
        for (int r = 0; r < R; r++) unit_weights(w[r].type, rows[r], k, wv[r]);
#pragma unroll
        for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
            if (t >= n) break;
            const float *x = xs[t] + 32 * k;
#pragma unroll
            for (int c = 0; c < 32; c += 4) {
                float4 a = *(const float4 *)(x + c);
                if (NORM) {
                    ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                    const uint16_t *nw = norm + 32 * k + c;
                    a.x *= bf(nw[0]), a.y *= bf(nw[1]), a.z *= bf(nw[2]), a.w *= bf(nw[3]);
                }
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][t] += wv[r][c] * a.x + wv[r][c + 1] * a.y + wv[r][c + 2] * a.z + wv[r][c + 3] * a.w;
            }
        }
    }
}

// R rows' dots for the warp: by dp4a on the pass's quantized inputs x
// when Q8 (the launch quantized them) and every row is of a q8_gemv_type (ss
// then the block's sums, taken once in lane 0 for store_row's warp_sum),
// else from the f32 inputs (units_dots).
template <int R, bool NORM, bool Q8>
static __device__ __forceinline__ void block_rows_dots(float (*acc)[MAX_TOKENS_PER_PASS], float *ss,
                                                       const cuda_wmat *w, const uint8_t *const *rows,
                                                       const uint16_t *norm, const float *const xs[MAX_TOKENS_PER_PASS],
                                                       q8_rows xq, const float *block_ss, int n, int cols, int lane) {
    bool q8 = Q8;
#pragma unroll
    for (int r = 0; r < R; r++) q8 = q8 && q8_gemv_type(w[r].type) && !w[r].f32_gemv;
    if (!q8) {
        units_dots<R, NORM>(acc, ss, w, rows, norm, xs, n, cols, lane);
        return;
    }
    q8_dots<R>(acc, w, rows, xq, n, cols, lane);
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) ss[t] = NORM && lane == 0 && t < n ? block_ss[t] : 0.0f;
}

// A GEMV launch's dynamic shared memory: the pass's quantized inputs (Q8),
// then the staged rows (row_stage).
static __device__ __forceinline__ unsigned char *gemv_smem() {
    extern __shared__ __align__(16) unsigned char gemv_smem_bytes[];
    return gemv_smem_bytes;
}

// The pass's inputs quantized into the launch's shared memory (Q8), by
// every thread of the block before any returns.
template <bool NORM, bool Q8>
static __device__ __forceinline__ q8_rows pass_q8(const float *const xs[MAX_TOKENS_PER_PASS], const uint16_t *norm,
                                                  int n, int cols, float *block_ss) {
    q8_rows none = {NULL, NULL, NULL};
    return Q8 ? quantize_q8_rows<NORM>(gemv_smem(), xs, norm, n, cols, block_ss) : none;
}

// Row staging (cuda_queue.stage_rows): each warp's R weight rows copied
// into its slots of shared memory by cp.async as the kernel starts, so the
// rows' memory latency passes while the block quantizes its inputs; the
// dots then read the slots, which hold the rows' bytes as they are in
// global memory (16-byte aligned slots keep every type's loads aligned).
struct row_stage {
    int at;    // the first warp's first slot, in bytes of dynamic shared memory (past the quantized inputs)
    int slot;  // bytes of a slot, a multiple of 16; 0: the rows are read from global memory
    int piece; // bytes one copy moves (16, 8 or 4): divides every row's bytes and start
};

// Issues the copies of rows[0..R) (bytes row_bytes of w[r]) into the
// warp's slots, lanes taking pieces lane, lane + 32, ..., as one group,
// and points rows at the slots. staged_rows_ready() before reading them.
template <int R>
static __device__ __forceinline__ void stage_rows(const uint8_t **rows, const cuda_wmat *w, row_stage s, int lane) {
    uint8_t *slots = gemv_smem() + s.at + (size_t)(threadIdx.x / WARP) * R * s.slot;
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint8_t *dst = slots + (size_t)r * s.slot;
        for (size_t off = (size_t)lane * s.piece; off < w[r].row_bytes; off += (size_t)WARP * s.piece)
            __pipeline_memcpy_async(dst + off, rows[r] + off, (size_t)s.piece);
        rows[r] = dst;
    }
    __pipeline_commit();
}

// The warp's staged rows landed and seen by all its lanes.
static __device__ __forceinline__ void staged_rows_ready() {
    __pipeline_wait_prior(0);
    __syncwarp();
}

// The part holding launch row *r, and *r made its row within the part.
static __device__ __forceinline__ qgemv_part part_of(const qgemv_parts &parts, int *r) {
    qgemv_part part = parts.p[0]; // constant indices keep the parts out of local memory
    if (parts.n > 1 && *r >= part.rows) *r -= part.rows, part = parts.p[1];
    if (parts.n > 2 && *r >= part.rows) *r -= part.rows, part = parts.p[2];
    return part;
}

// One warp per output row, as gemv_kernel (ops.cu): blockIdx.y the pass of
// 8 tokens; ONE compiled apart for a decode step's single token; Q8 when
// some part is of a q8_gemv_type (block_rows_dots).
template <bool ONE, bool NORM, bool Q8>
__global__ void __launch_bounds__(256) qgemv_kernel(qgemv_parts parts, const float *x, const bf16_bits *norm,
                                                    float eps, int T, int cols, int accumulate, row_stage stage) {
    await_previous_kernel();
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, t0 = blockIdx.y * MAX_TOKENS_PER_PASS;
    bool mine = r < parts.rows; // the warp has a row (uniform across it)
    const uint8_t *row = NULL;
    if (stage.slot && mine) { // the part is looked up again below: kept live across the quantizing, it spills
        int pr = r;
        qgemv_part part = part_of(parts, &pr);
        row = (const uint8_t *)part.w.p + (size_t)pr * part.w.row_bytes;
        stage_rows<1>(&row, &part.w, stage, lane);
    }
    const float *xs[MAX_TOKENS_PER_PASS];
    float acc[MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS], block_ss[MAX_TOKENS_PER_PASS];
    int n = pass_inputs<ONE>(xs, acc, ss, x, t0, T, cols);
    q8_rows xq = pass_q8<NORM, Q8>(xs, norm, n, cols, block_ss);
    if (!mine) return;
    qgemv_part part = part_of(parts, &r);
    if (stage.slot) staged_rows_ready();
    else row = (const uint8_t *)part.w.p + (size_t)r * part.w.row_bytes;
    block_rows_dots<1, NORM, Q8>((float (*)[MAX_TOKENS_PER_PASS])acc, ss, &part.w, &row, norm, xs, xq, block_ss, n,
                                 cols, lane);
    store_row<NORM>(part.y, part.ld, r, t0, n, acc, ss, part.bias ? bf(part.bias[r]) : 0.0f, cols, eps, accumulate,
                    lane);
}

// Shared memory for a launch's quantized inputs when one of its matrices
// is of a q8_gemv_type and a pass's rows fit the 48 KB every GPU gives a
// block (cols up to 39k for one token, 4.9k for 8), else 0: the f32 path.
static size_t q8_smem_for(const cuda_wmat *w, int nw, int T, int cols) {
    int any = 0;
    for (int i = 0; i < nw; i++) any |= q8_gemv_type(w[i].type) && !w[i].f32_gemv;
    size_t bytes = q8_rows_bytes(T < MAX_TOKENS_PER_PASS ? T : MAX_TOKENS_PER_PASS, cols);
    return any && cols % 64 == 0 && bytes <= 48 * 1024 ? bytes : 0;
}

// The row staging of a launch whose warps take R rows each of matrices
// w[0..nw) (any of them) after q8 bytes of quantized inputs, within the
// 48 KB every GPU gives a block: *warps the warps a block then has (8, or
// fewer where rows are long). None (slot 0, 8 warps) when the queue does
// not stage, fewer than 2 warps' rows fit, or no 4-byte piece divides
// every row's bytes and start.
static row_stage plan_stage(const cuda_queue *q, const cuda_wmat *w, int nw, int R, size_t q8, int *warps) {
    row_stage none = {0, 0, 0}, s = {(int)((q8 + 15) / 16 * 16), 0, 16};
    *warps = 8;
    if (!q || !q->stage_rows) return none;
    for (int i = 0; i < nw; i++) {
        size_t slot = (w[i].row_bytes + 15) / 16 * 16;
        if (slot > (size_t)s.slot) s.slot = (int)slot;
        while (s.piece >= 4 && (w[i].row_bytes % s.piece || (uintptr_t)w[i].p % s.piece)) s.piece /= 2;
    }
    size_t fit = s.slot && (size_t)s.at < 48 * 1024 ? (48 * 1024 - (size_t)s.at) / ((size_t)R * s.slot) : 0;
    if (s.piece < 4 || fit < 2) return none;
    *warps = fit < 8 ? (int)fit : 8;
    return s;
}

// Dynamic shared memory of a launch of `warps` warps: its quantized inputs
// and its staged rows.
static size_t gemv_launch_smem(size_t q8, row_stage s, int warps, int R) {
    return s.slot ? (size_t)s.at + (size_t)warps * R * s.slot : q8;
}

static void qgemv(qgemv_parts parts, const float *x, const bf16_bits *norm, float eps, int T, int cols, int accumulate,
                  const cuda_queue *queue) {
    cuda_wmat w[3] = {parts.p[0].w, parts.p[1].w, parts.p[2].w};
    size_t q8 = q8_smem_for(w, parts.n, T, cols);
    int warps;
    row_stage stage = plan_stage(queue, w, parts.n, 1, q8, &warps);
    dim3 grid((parts.rows + warps - 1) / warps, passes(T));
#define PICK(Q8)                                                                                                     \
    (norm ? (T == 1 ? qgemv_kernel<true, true, Q8> : qgemv_kernel<false, true, Q8>)                                   \
          : (T == 1 ? qgemv_kernel<true, false, Q8> : qgemv_kernel<false, false, Q8>))
    auto kernel = q8 ? PICK(true) : PICK(false);
#undef PICK
    launch(queue, grid, warps * WARP, gemv_launch_smem(q8, stage, warps, 1), kernel, parts, x, norm, eps, T, cols,
           accumulate, stage);
}

extern "C" void cuda_matmul_blocks(float *y, int ldy, const float *x, cuda_wmat w, const bf16_bits *bias, int T,
                                   int rows, int cols, int accumulate, const cuda_queue *queue) {
    qgemv_parts parts = {{{y, w, bias, rows, ldy}}, 1, rows};
    qgemv(parts, x, NULL, 0.0f, T, cols, accumulate, queue);
}

extern "C" void cuda_matmul_qkv_blocks(float *q, float *k, float *v, const float *x, cuda_wmat wq, cuda_wmat wk,
                                       cuda_wmat wv, const bf16_bits *bq, const bf16_bits *bk, const bf16_bits *bv,
                                       const bf16_bits *norm, float eps, int T, int q_rows, int kv_rows, int cols,
                                       const cuda_queue *queue) {
    qgemv_parts parts = {{{q, wq, bq, q_rows, q_rows}, {k, wk, bk, kv_rows, kv_rows}, {v, wv, bv, kv_rows, kv_rows}},
                         3, q_rows + 2 * kv_rows};
    qgemv(parts, x, norm, eps, T, cols, 0, queue);
}

extern "C" int cuda_blocks_staged_warps(const cuda_wmat *w, int nw, int R, int T, int cols, const cuda_queue *queue) {
    int warps;
    row_stage s = plan_stage(queue, w, nw, R, q8_smem_for(w, nw, T, cols), &warps);
    return s.slot ? warps : 0;
}

// act[t, r] = silu(x_t . gate_r) * (x_t . up_r), a warp per r, as
// gemv_swiglu_kernel (ops.cu).
template <bool ONE, bool NORM, bool Q8>
__global__ void __launch_bounds__(256) qgemv_swiglu_kernel(float *act, const float *x, const bf16_bits *norm,
                                                           float eps, cuda_wmat gate, cuda_wmat up, int T, int F,
                                                           int cols, row_stage stage) {
    await_previous_kernel();
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, t0 = blockIdx.y * MAX_TOKENS_PER_PASS;
    cuda_wmat w[2] = {gate, up};
    size_t row = r < F ? (size_t)r : 0;
    const uint8_t *rows[2] = {(const uint8_t *)gate.p + row * gate.row_bytes, (const uint8_t *)up.p + row * up.row_bytes};
    if (stage.slot && r < F) stage_rows<2>(rows, w, stage, lane);
    const float *xs[MAX_TOKENS_PER_PASS];
    float gu[2][MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS], block_ss[MAX_TOKENS_PER_PASS];
    int n = pass_inputs<ONE>(xs, gu[0], ss, x, t0, T, cols);
    q8_rows xq = pass_q8<NORM, Q8>(xs, norm, n, cols, block_ss);
    if (r >= F) return;
    if (stage.slot) staged_rows_ready();
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) gu[1][t] = 0.0f;
    block_rows_dots<2, NORM, Q8>(gu, ss, w, rows, norm, xs, xq, block_ss, n, cols, lane);
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        float gv = warp_sum(gu[0][t]), uv = warp_sum(gu[1][t]);
        if (NORM) {
            float inv = rms_scale(ss[t], cols, eps);
            gv *= inv, uv *= inv;
        }
        if (lane == 0) act[(size_t)(t0 + t) * F + r] = silu_mul(gv, uv);
    }
}

extern "C" void cuda_matmul_swiglu_blocks(float *act, const float *x, const bf16_bits *norm, float eps,
                                          cuda_wmat gate, cuda_wmat up, int T, int F, int cols,
                                          const cuda_queue *queue) {
    cuda_wmat w[2] = {gate, up};
    size_t q8 = q8_smem_for(w, 2, T, cols);
    int warps;
    row_stage stage = plan_stage(queue, w, 2, 2, q8, &warps);
    dim3 grid((F + warps - 1) / warps, passes(T));
#define PICK(Q8)                                                                                                     \
    (norm ? (T == 1 ? qgemv_swiglu_kernel<true, true, Q8> : qgemv_swiglu_kernel<false, true, Q8>)                     \
          : (T == 1 ? qgemv_swiglu_kernel<true, false, Q8> : qgemv_swiglu_kernel<false, false, Q8>))
    auto kernel = q8 ? PICK(true) : PICK(false);
#undef PICK
    launch(queue, grid, warps * WARP, gemv_launch_smem(q8, stage, warps, 2), kernel, act, x, norm, eps, gate, up, T, F,
           cols, stage);
}

// moe.cu's expert GEMV over routed experts kept as blocks: expert e's
// rows are rows e * rows .. of w[0] (and, with SwiGLU, of w[1]: gate and
// up, each of its own type), each pass of up to 8 of the expert's slots
// quantized into shared memory as for the other block GEMVs (a slot's
// dots depend on its own input only, so on no grouping). blockIdx.y is a
// chosen expert, a warp an output row.
template <bool SWIGLU, bool Q8>
__global__ void __launch_bounds__(256) expert_qgemv_kernel(float *y, const float *x, cuda_wmat gate, cuda_wmat up,
                                                           const int *groups, int E, int k, int rows, int cols,
                                                           int x_per_slot) {
    await_previous_kernel();
    if ((int)blockIdx.y >= groups[0]) return; // the whole block: before any shared memory use
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP, r = blockIdx.x * warps + threadIdx.x / WARP;
    int e = groups[1 + blockIdx.y], begin = groups[1 + E + blockIdx.y], end = groups[2 + E + blockIdx.y];
    const int *slots = groups + 2 + 2 * E;
    cuda_wmat w[2] = {gate, up};
    size_t row = (size_t)e * rows + (r < rows ? r : 0);
    const uint8_t *wrow[2] = {(const uint8_t *)gate.p + row * gate.row_bytes,
                              SWIGLU ? (const uint8_t *)up.p + row * up.row_bytes : NULL};
    for (int b = begin; b < end; b += MAX_TOKENS_PER_PASS) {
        int n = end - b < MAX_TOKENS_PER_PASS ? end - b : MAX_TOKENS_PER_PASS;
        const float *xs[MAX_TOKENS_PER_PASS];
        float acc[2][MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS], block_ss[MAX_TOKENS_PER_PASS];
#pragma unroll
        for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
            int s = slots[b + (i < n ? i : 0)];
            xs[i] = x + (size_t)(x_per_slot ? s : s / k) * cols;
            acc[0][i] = acc[1][i] = ss[i] = 0.0f;
        }
        q8_rows xq = pass_q8<false, Q8>(xs, NULL, n, cols, block_ss);
        if (r < rows) {
            block_rows_dots<SWIGLU ? 2 : 1, false, Q8>(acc, ss, w, wrow, NULL, xs, xq, block_ss, n, cols, lane);
#pragma unroll
            for (int i = 0; i < MAX_TOKENS_PER_PASS; i++) {
                if (i >= n) break;
                float g = warp_sum(acc[0][i]), u = SWIGLU ? warp_sum(acc[1][i]) : 0.0f;
                if (lane == 0) y[(size_t)slots[b + i] * rows + r] = SWIGLU ? silu_mul(g, u) : g;
            }
        }
        if (Q8) __syncthreads(); // every warp done with this pass's inputs before the next are quantized
    }
}

extern "C" void cuda_expert_matmul_blocks(float *y, const float *x, cuda_wmat gate, cuda_wmat up, const int *groups,
                                          int T, int k, int E, int rows, int cols, int x_per_slot,
                                          const cuda_queue *queue) {
    const int threads = 256, warps = threads / WARP;
    int chosen = T * k < E ? T * k : E;
    dim3 grid((rows + warps - 1) / warps, chosen);
    cuda_wmat w[2] = {gate, up};
    size_t smem = q8_smem_for(w, up.p ? 2 : 1, MAX_TOKENS_PER_PASS, cols);
    auto kernel = up.p ? (smem ? expert_qgemv_kernel<true, true> : expert_qgemv_kernel<true, false>)
                       : (smem ? expert_qgemv_kernel<false, true> : expert_qgemv_kernel<false, false>);
    launch(queue, grid, threads, smem, kernel, y, x, gate, up, groups, E, k, rows, cols, x_per_slot);
}

// A block per row: row r0 + blockIdx.x of w, its units over the threads,
// each unit's 64 bytes of bf16 stored as four 16-byte vectors (a unit starts
// 64 bytes into the 16-byte aligned workspace's rows of cols, a multiple
// of 32), not 32 two-byte stores 64 bytes apart across the warp.
__global__ void dequantize_rows_kernel(bf16_bits *out, cuda_wmat w, int r0, int cols) {
    await_previous_kernel();
    const uint8_t *row = (const uint8_t *)w.p + (size_t)(r0 + blockIdx.x) * w.row_bytes;
    uint4 *o = (uint4 *)(out + (size_t)blockIdx.x * cols);
    for (int k = threadIdx.x; k < cols / 32; k += blockDim.x) {
        float v[32];
        unit_weights(w.type, row, k, v);
        unsigned pair[16];
#pragma unroll
        for (int i = 0; i < 16; i++) pair[i] = (unsigned)to_bf(v[2 * i]) | (unsigned)to_bf(v[2 * i + 1]) << 16;
#pragma unroll
        for (int q = 0; q < 4; q++)
            o[4 * k + q] = make_uint4(pair[4 * q], pair[4 * q + 1], pair[4 * q + 2], pair[4 * q + 3]);
    }
}

extern "C" void cuda_dequantize_rows(bf16_bits *out, cuda_wmat w, int r0, int n, int cols, const cuda_queue *queue) {
    if (n > 0) launch(queue, n, 128, 0, dequantize_rows_kernel, out, w, r0, cols);
}

// As embed_kernel (ops.cu), the table's rows unpacked from their blocks.
__global__ void embed_blocks_kernel(float *x, cuda_wmat table, const int *tokens, const int *ids, const int *from,
                                    int hidden) {
    await_previous_kernel();
    int token = from && from[blockIdx.x] >= 0 ? ids[from[blockIdx.x]] : tokens[blockIdx.x];
    const uint8_t *row = (const uint8_t *)table.p + (size_t)token * table.row_bytes;
    float *out = x + (size_t)blockIdx.x * hidden;
    for (int k = threadIdx.x; k < hidden / 32; k += blockDim.x) {
        float v[32];
        unit_weights(table.type, row, k, v);
#pragma unroll
        for (int i = 0; i < 32; i++) out[32 * k + i] = v[i];
    }
}

extern "C" void cuda_embed_blocks(float *x, cuda_wmat table, const int *tokens, const int *ids, const int *from, int T,
                                  int hidden, const cuda_queue *queue) {
    launch(queue, T, 64, 0, embed_blocks_kernel, x, table, tokens, ids, from, hidden);
}
