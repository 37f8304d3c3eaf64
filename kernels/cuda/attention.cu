// Causal GQA attention over a paged bf16 KV pool, the CPU's
// cpu_attention_head math (f32 scores, f32 softmax, scale
// 1/sqrt(head_dim)). Two kernels for two regimes:
//  - decode (a few tokens, or a batch's tokens of any sequences; a
//    cuda_kv_map): split-K flash decoding. The grid is fixed by the launch
//    (not the position), so a captured graph serves every step.
//  - prefill (one sequence's run of many tokens; a cuda_kv_run): a tiled
//    flash-attention kernel, online softmax, no scratch; for long runs a
//    tensor-core kernel (bf16 queries and probabilities, see below).
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "common.cuh"
#include "ops.h"

#define ATT_CHUNK 32     // keys per shared-memory tile
#define ATT_MAX_GROUP 8  // query heads of a GQA group held at once
#define ATT_GROUP_DIMS 1024 // ... and at most this many of their dimensions
#define ATT_MAX_HD 256
#define ATT_MAX_SPLITS 64
#define KV_STRIDE(hd) ((hd) + 2) // padded tile rows: lanes reading different keys hit different banks

// Load keys (and values, when vs) j0..j0+n-1 of one KV head, under the
// block table, into shared tiles of `stride` bf16 a row (even, 4-byte
// aligned), rows n..rows-1 zeroed: 16-byte loads from the pool when
// head_dim % 8 == 0, stored as 4-byte pairs. The split-K and CUDA-core
// prefill kernels pad rows to KV_STRIDE (the lanes of the prefill kernel,
// one key each, on different banks) and fill only n; the tensor-core kernel
// pads to 16-byte multiples and multiplies whole zeroed tiles.
static __device__ __forceinline__ void load_kv_tile(uint16_t *ks, uint16_t *vs, const bf16_bits *kc,
                                                    const bf16_bits *vc, const int *table, int j0, int n, int rows,
                                                    int kvh, int kvd, int hd, int stride) {
    if ((hd & 7) == 0) {
        int per_row = hd / 8;
        for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
            int j = i / per_row, c = (i % per_row) * 8;
            uint4 kk = make_uint4(0, 0, 0, 0), vv = kk;
            if (j < n) {
                size_t src = kv_row(table, j0 + j) * kvd + (size_t)kvh * hd + c;
                kk = *(const uint4 *)(kc + src);
                if (vs) vv = *(const uint4 *)(vc + src);
            }
            uint32_t *kd = (uint32_t *)(ks + j * stride + c);
            kd[0] = kk.x, kd[1] = kk.y, kd[2] = kk.z, kd[3] = kk.w;
            if (!vs) continue;
            uint32_t *vd = (uint32_t *)(vs + j * stride + c);
            vd[0] = vv.x, vd[1] = vv.y, vd[2] = vv.z, vd[3] = vv.w;
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) {
        int j = i / hd, c = i % hd;
        size_t src = j < n ? kv_row(table, j0 + j) * kvd + (size_t)kvh * hd + c : 0;
        ks[j * stride + c] = j < n ? kc[src] : 0;
        if (vs) vs[j * stride + c] = j < n ? vc[src] : 0;
    }
}

// ------------------------------------------------------------------- decode
//
// A block per (token, KV head, split) walks the key chunks split, split+S,
// ... up to the token's position with an online softmax for every query head
// of the group, loading each K/V tile once for the group, and writes its
// partial (max, sum of exponentials, unnormalised output). A second kernel
// merges the S partials with their log-sum-exp weights, or (with tickets)
// the last split block of each (token, KV head) does.

// The S partials of (token t, head h): each split's log-sum-exp weight
// computed once, in shared memory, then a thread per output dimension sums
// the splits in order with every split's load issued up front. Only the
// splits that hold keys are read: split s covers chunks s, s + S, ..., so
// the first min(S, chunks up to the token's position) of them (at a
// 128-token context and 64 splits, 4 of 64). The others, with no keys, write
// nothing; they used to write a sum of 0 that this loop skipped, so the
// same operations give the same bits. Every thread of the block calls it.
static __device__ void merge_head(float *out, const float *part, int t, int h, int n_heads, int hd, int splits,
                                  int used) {
    __shared__ float ms[ATT_MAX_SPLITS], ls[ATT_MAX_SPLITS], wgt[ATT_MAX_SPLITS], total;
    size_t stride = (size_t)hd + 2;
    const float *p = part + ((size_t)t * n_heads + h) * splits * stride;
    for (int k = threadIdx.x; k < used; k += blockDim.x) ms[k] = p[k * stride], ls[k] = p[k * stride + 1];
    __syncthreads();
    if (threadIdx.x < WARP) {
        float m = -INFINITY;
        for (int k = threadIdx.x; k < used; k += WARP) m = fmaxf(m, ms[k]);
        m = warp_max(m);
        for (int k = threadIdx.x; k < used; k += WARP) wgt[k] = ls[k] > 0.0f ? expf(ms[k] - m) : 0.0f;
        __syncwarp();
        if (threadIdx.x == 0) {
            float l = 0.0f;
            for (int k = 0; k < used; k++)
                if (ls[k] > 0.0f) l += ls[k] * wgt[k];
            total = l;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (int k = 0; k < used; k++) {
            float v = p[k * stride + 2 + c];
            if (ls[k] > 0.0f) o += v * wgt[k];
        }
        out[((size_t)t * n_heads + h) * hd + c] = o / total;
    }
    __syncthreads(); // the shared arrays are the next head's
}

// Splits holding keys for a token at position pos.
static __device__ __forceinline__ int used_splits(int pos, int splits) {
    int chunks = pos / ATT_CHUNK + 1;
    return chunks < splits ? chunks : splits;
}

__global__ void attention_split_kernel(float *part, const float *q, const bf16_bits *kc, const bf16_bits *vc,
                                       cuda_kv_map map, int n_heads, int n_kv, int hd, int splits, float *out,
                                       int *tickets) {
    await_previous_kernel();
    int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, pos = kv_pos(map, t);
    if (split * ATT_CHUNK > pos) return; // no keys: the merge reads only the splits that have some
    const int *table = kv_table(map, t);
    int group = n_heads / n_kv, kvd = n_kv * hd, stride = KV_STRIDE(hd);
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
    size_t pstride = (size_t)hd + 2; // per (head, split): max, sum, output[hd]
    __shared__ __align__(4) uint16_t ks[ATT_CHUNK * KV_STRIDE(ATT_MAX_HD)], vs[ATT_CHUNK * KV_STRIDE(ATT_MAX_HD)];
    __shared__ float qs[ATT_GROUP_DIMS], os[ATT_GROUP_DIMS];
    __shared__ float sc[ATT_MAX_GROUP * ATT_CHUNK], run_max[ATT_MAX_GROUP], run_sum[ATT_MAX_GROUP],
        rescale[ATT_MAX_GROUP];
    float scale = 1.0f / sqrtf((float)hd);
    int at_once = ATT_GROUP_DIMS / hd < ATT_MAX_GROUP ? ATT_GROUP_DIMS / hd : ATT_MAX_GROUP;
    for (int g0 = 0; g0 < group; g0 += at_once) {
        int ng = group - g0 < at_once ? group - g0 : at_once;
        const float *qg = q + ((size_t)t * n_heads + kvh * group + g0) * hd;
        for (int i = threadIdx.x; i < ng * hd; i += blockDim.x) qs[i] = qg[i] * scale, os[i] = 0.0f;
        if (threadIdx.x < ATT_MAX_GROUP) run_max[threadIdx.x] = -INFINITY, run_sum[threadIdx.x] = 0.0f;
        __syncthreads();
        for (int j0 = split * ATT_CHUNK; j0 <= pos; j0 += splits * ATT_CHUNK) {
            int n = pos + 1 - j0 < ATT_CHUNK ? pos + 1 - j0 : ATT_CHUNK;
            load_kv_tile(ks, vs, kc, vc, table, j0, n, n, kvh, kvd, hd, stride);
            __syncthreads();
            // a warp per (head, key): lanes split the head dimension
            for (int p = warp; p < ng * n; p += warps) {
                int h = p / n, j = p % n;
                float s = 0.0f;
                for (int c = lane; c < hd; c += WARP) s += qs[h * hd + c] * bf(ks[j * stride + c]);
                s = warp_sum(s);
                if (lane == 0) sc[h * ATT_CHUNK + j] = s;
            }
            __syncthreads();
            // a warp per head: the running max and sum absorb the chunk
            for (int h = warp; h < ng; h += warps) {
                float m = -INFINITY, l = 0.0f;
                for (int j = lane; j < n; j += WARP) m = fmaxf(m, sc[h * ATT_CHUNK + j]);
                m = fmaxf(warp_max(m), run_max[h]);
                for (int j = lane; j < n; j += WARP) l += (sc[h * ATT_CHUNK + j] = expf(sc[h * ATT_CHUNK + j] - m));
                l = warp_sum(l);
                if (lane == 0) {
                    float f = expf(run_max[h] - m); // 0 on the first chunk (run_max = -inf)
                    rescale[h] = f;
                    run_sum[h] = run_sum[h] * f + l;
                    run_max[h] = m;
                }
            }
            __syncthreads();
            for (int i = threadIdx.x; i < ng * hd; i += blockDim.x) {
                int h = i / hd, c = i % hd;
                float o = os[i] * rescale[h];
                for (int j = 0; j < n; j++) o += sc[h * ATT_CHUNK + j] * bf(vs[j * stride + c]);
                os[i] = o;
            }
            __syncthreads();
        }
        for (int i = threadIdx.x; i < ng * (hd + 2); i += blockDim.x) {
            int h = i / (hd + 2), c = i % (hd + 2);
            float *p = part + (((size_t)t * n_heads + kvh * group + g0 + h) * splits + split) * pstride;
            p[c] = c == 0 ? run_max[h] : c == 1 ? run_sum[h] : os[h * hd + c - 2];
        }
        __syncthreads();
    }
    if (!tickets) return;
    // With tickets, the last block of (t, kvh) to finish merges the group's
    // heads and sets the ticket back to 0 for the next launch (a replayed
    // graph): one launch instead of two, the merge's bits unchanged.
    __shared__ int last;
    int used = used_splits(pos, splits), *ticket = &tickets[t * n_kv + kvh];
    __threadfence(); // this block's partials before its ticket
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == used - 1;
    __syncthreads();
    if (!last) return;
    __threadfence(); // the other blocks' partials after their tickets
    for (int h = kvh * group; h < (kvh + 1) * group; h++) merge_head(out, part, t, h, n_heads, hd, splits, used);
    if (threadIdx.x == 0) *ticket = 0;
}

__global__ void attention_merge_kernel(float *out, const float *part, cuda_kv_map map, int n_heads, int hd,
                                       int splits) {
    await_previous_kernel();
    int t = blockIdx.x, h = blockIdx.y;
    merge_head(out, part, t, h, n_heads, hd, splits, used_splits(kv_pos(map, t), splits));
}

// Splits so that the grid covers the GPU (sms multiprocessors) about four
// times over: a decode step's few (token, KV head) pairs must still keep
// every multiprocessor streaming keys (at 2x, a 2048-token context ran at 54%
// of copy bandwidth on an H100).
extern "C" int cuda_attention_splits(int T, int n_kv, int sms) {
    int s = (4 * sms + T * n_kv - 1) / (T * n_kv);
    return s < 1 ? 1 : s > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : s;
}

extern "C" size_t cuda_attention_scratch(int T, int n_heads, int head_dim) {
    return (size_t)T * n_heads * ATT_MAX_SPLITS * ((size_t)head_dim + 2);
}

// t * cuda_attention_splits(t) is at most 64 t, and at most
// t + ceil(4 sms / n_kv) (the split rounds up by less than one per token).
extern "C" size_t cuda_attention_scratch_upto(int max_T, int n_heads, int n_kv, int head_dim, int sms) {
    size_t by_max = (size_t)max_T * ATT_MAX_SPLITS, by_grid = (size_t)max_T + (4 * (size_t)sms + n_kv - 1) / n_kv;
    return (by_max < by_grid ? by_max : by_grid) * n_heads * ((size_t)head_dim + 2);
}

extern "C" void cuda_attention_decode(float *out, const float *q, const bf16_bits *k_pool, const bf16_bits *v_pool,
                                      float *scratch, cuda_kv_map map, int T, int n_heads, int n_kv, int head_dim,
                                      int splits, int *tickets, const cuda_queue *queue) {
    if (splits < 1 || splits > ATT_MAX_SPLITS) splits = splits < 1 ? 1 : ATT_MAX_SPLITS;
    launch(queue, dim3(T, n_kv, splits), 256, 0, attention_split_kernel, scratch, q, k_pool, v_pool, map, n_heads,
           n_kv, head_dim, splits, out, tickets);
    if (!tickets)
        launch(queue, dim3(T, n_heads), 128, 0, attention_merge_kernel, out, scratch, map, n_heads, head_dim, splits);
}

// ------------------------------------------------------------------ prefill
//
// A block per (tile of PF_WARPS * RPW tokens of one sequence's run, query
// head): its queries in shared memory, then the keys up to its last token in
// tiles of ATT_CHUNK. Each warp owns RPW query rows; lane j scores key j of
// the tile for all of them at once (each pair of key dimensions read once
// from shared memory for the RPW rows, the queries' pairs as broadcasts),
// the warp keeps each row's running max and sum, and the output rows live in
// registers (lane l holds dimension pairs 2l, 2l + 64, ...; each pair of a
// value row read once for the RPW rows). The kernel is bound by shared-memory
// reads: before 2026-11-25 each row read its key and value dimensions one
// at a time, ~3x the instructions. Every sum runs in the order it did then.
// RPW trades parallelism for K/V tile reuse: short prompts take 1 row per
// warp so that the grid fills the GPU (at 4, a 128-token prompt had 1.5
// blocks per H100 multiprocessor). head_dim is even (RoPE's pairs).

#define PF_WARPS 4
#define PF_MAX_RPW 4
#define PF_PAIRS_PER_LANE (ATT_MAX_HD / (2 * WARP))

// The two bf16 of a 32-bit word: the lower address first.
static __device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <int RPW>
__global__ void __launch_bounds__(PF_WARPS *WARP)
    attention_prefill_kernel(float *out, const float *q, const bf16_bits *kc, const bf16_bits *vc, cuda_kv_run run,
                             int T, int n_heads, int n_kv, int hd) {
    await_previous_kernel();
    extern __shared__ float smem[];
    const int PF_ROWS = PF_WARPS * RPW;
    int t0 = blockIdx.x * PF_ROWS, h = blockIdx.y, kvh = h / (n_heads / n_kv), kvd = n_kv * hd;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, stride = KV_STRIDE(hd), pos0 = *run.pos0;
    const int *table = run.table;
    int rows = T - t0 < PF_ROWS ? T - t0 : PF_ROWS;
    float *qs = smem;                               // [PF_ROWS, hd], pre-scaled
    uint16_t *ks = (uint16_t *)(qs + PF_ROWS * hd); // [ATT_CHUNK, stride]
    uint16_t *vs = ks + ATT_CHUNK * stride;         // [ATT_CHUNK, stride]
    float scale = 1.0f / sqrtf((float)hd);
    for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) {
        int r = i / hd, c = i % hd;
        qs[i] = q[((size_t)(t0 + r) * n_heads + h) * hd + c] * scale;
    }
    float o[RPW][2 * PF_PAIRS_PER_LANE], m[RPW], l[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int d = 0; d < 2 * PF_PAIRS_PER_LANE; d++) o[r][d] = 0.0f;
    }
    int last = pos0 + t0 + rows - 1; // the block's last query position: keys beyond it are never needed
    for (int j0 = 0; j0 <= last; j0 += ATT_CHUNK) {
        int n = last + 1 - j0 < ATT_CHUNK ? last + 1 - j0 : ATT_CHUNK;
        __syncthreads(); // the previous tile is consumed (and qs written, on the first pass)
        load_kv_tile(ks, vs, kc, vc, table, j0, n, n, kvh, kvd, hd, stride);
        __syncthreads();
        // the warp's rows with a key in this tile (a row past the block's, or
        // whose tile is all in its future, skips it: the same for every lane)
        bool active[RPW];
        float s[RPW], p[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            int row = warp * RPW + r;
            active[r] = row < rows && j0 <= pos0 + t0 + row;
            s[r] = 0.0f, p[r] = 0.0f;
        }
        if (lane < n) {
            const uint32_t *kr = (const uint32_t *)(ks + lane * stride);
            for (int c = 0; c < hd; c += 2) {
                uint32_t kk = kr[c / 2];
                float k0 = bf_lo(kk), k1 = bf_hi(kk);
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    if (!active[r]) continue;
                    float2 qq = *(const float2 *)(qs + (warp * RPW + r) * hd + c);
                    s[r] += qq.x * k0;
                    s[r] += qq.y * k1;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            if (!active[r]) continue;
            float sr = lane < n && j0 + lane <= pos0 + t0 + warp * RPW + r ? s[r] : -INFINITY;
            float mn = fmaxf(m[r], warp_max(sr));
            p[r] = sr == -INFINITY ? 0.0f : expf(sr - mn);
            float f = expf(m[r] - mn);
            l[r] = l[r] * f + warp_sum(p[r]);
            m[r] = mn;
#pragma unroll
            for (int d = 0; d < 2 * PF_PAIRS_PER_LANE; d++) o[r][d] *= f;
        }
        for (int j = 0; j < n; j++) {
            float pj[RPW];
#pragma unroll
            for (int r = 0; r < RPW; r++) pj[r] = active[r] ? __shfl_sync(0xffffffffu, p[r], j) : 0.0f;
            const uint32_t *vr = (const uint32_t *)(vs + j * stride);
#pragma unroll
            for (int d = 0; d < PF_PAIRS_PER_LANE; d++) {
                int c = 2 * lane + 2 * WARP * d;
                if (c >= hd) continue;
                uint32_t vv = vr[c / 2];
                float v0 = bf_lo(vv), v1 = bf_hi(vv);
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    if (!active[r]) continue;
                    o[r][2 * d] += pj[r] * v0;
                    o[r][2 * d + 1] += pj[r] * v1;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        int row = warp * RPW + r;
        if (row >= rows) continue;
        float *dst = out + ((size_t)(t0 + row) * n_heads + h) * hd;
#pragma unroll
        for (int d = 0; d < PF_PAIRS_PER_LANE; d++) {
            int c = 2 * lane + 2 * WARP * d;
            if (c < hd) *(float2 *)(dst + c) = make_float2(o[r][2 * d] / l[r], o[r][2 * d + 1] / l[r]);
        }
    }
}

// ----------------------------------------------------- prefill, tensor cores
//
// Long runs: a block per (TC_WARPS * 16 tokens, query head), each warp 16
// query rows through WMMA. The queries (scaled) are rounded to bf16 for
// Q K^T, and the probabilities to bf16 for P V, f32 accumulation: the only
// roundings beside the order of f32 sums. Two passes over the keys: the
// first finds each row's maximum score, the second sums exp(s - max) in f32
// and accumulates P V, so the output fragments are never rescaled (WMMA
// hides which lane holds which row) and every probability is the CPU's
// exp(s - max) before its rounding. Q K^T is computed twice; on tensor
// cores that costs less than the CUDA-core kernel's one pass.

#define TC_WARPS 2
#define TC_KEYS 32
#define TC_MAX_HD 128
#define TC_MIN_TOKENS 256 // shorter runs: too few blocks to fill the GPU

static __device__ __forceinline__ int tc_ld(int hd) { return hd + 8; } // bf16 rows: 16-byte multiples, banks spread

static size_t prefill_tc_smem(int head_dim) {
    return (size_t)(TC_WARPS * 16 + 2 * TC_KEYS) * (head_dim + 8) * 2 + (size_t)TC_WARPS * 16 * TC_KEYS * 4 +
           (size_t)TC_WARPS * 16 * (TC_KEYS + 8) * 2;
}

__global__ void __launch_bounds__(TC_WARPS *WARP)
    attention_prefill_tc_kernel(float *out, const float *q, const bf16_bits *kc, const bf16_bits *vc, cuda_kv_run run,
                                int T, int n_heads, int n_kv, int hd) {
    await_previous_kernel();
    using namespace nvcuda;
    extern __shared__ __align__(32) unsigned char tc_smem[];
    const int ROWS = TC_WARPS * 16, ld = tc_ld(hd), pld = TC_KEYS + 8;
    int t0 = blockIdx.x * ROWS, h = blockIdx.y, kvh = h / (n_heads / n_kv), kvd = n_kv * hd;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, pos0 = *run.pos0;
    int rows = T - t0 < ROWS ? T - t0 : ROWS;
    __nv_bfloat16 *qs = (__nv_bfloat16 *)tc_smem;                  // [ROWS, ld] q * scale
    __nv_bfloat16 *ks = qs + ROWS * ld, *vs = ks + TC_KEYS * ld;   // [TC_KEYS, ld] each
    float *ss = (float *)(vs + TC_KEYS * ld) + warp * 16 * TC_KEYS; // the warp's scores [16, TC_KEYS]
    __nv_bfloat16 *ps = (__nv_bfloat16 *)((float *)(vs + TC_KEYS * ld) + TC_WARPS * 16 * TC_KEYS) + warp * 16 * pld;
    float scale = 1.0f / sqrtf((float)hd);
    for (int i = threadIdx.x; i < ROWS * hd; i += blockDim.x) {
        int r = i / hd, c = i % hd;
        float v = r < rows ? q[((size_t)(t0 + r) * n_heads + h) * hd + c] * scale : 0.0f;
        qs[r * ld + c] = __float2bfloat16_rn(v);
    }
    // lane pair (2 lr, 2 lr + 1): row lr of the warp's 16, keys half * 16 .. of a tile
    int lr = lane / 2, half = lane % 2, row = warp * 16 + lr, qpos = pos0 + t0 + row, valid = row < rows;
    int last = pos0 + t0 + rows - 1, warp_last = pos0 + t0 + (warp * 16 + 15 < rows ? warp * 16 + 15 : rows - 1);
    int frags = hd / 16;
    float m = -INFINITY, l = 0.0f;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[TC_MAX_HD / 16];
#pragma unroll
    for (int d = 0; d < TC_MAX_HD / 16; d++) wmma::fill_fragment(o[d], 0.0f);
    for (int pass = 0; pass < 2; pass++) {
        for (int j0 = 0; j0 <= last; j0 += TC_KEYS) {
            int n = last + 1 - j0 < TC_KEYS ? last + 1 - j0 : TC_KEYS;
            __syncthreads(); // the previous tile is consumed (and qs written, on the first)
            load_kv_tile((uint16_t *)ks, pass ? (uint16_t *)vs : NULL, kc, vc, run.table, j0, n, TC_KEYS, kvh, kvd,
                         hd, ld); // pass 0 needs no values
            __syncthreads();
            if (warp * 16 >= rows || j0 > warp_last) continue; // nothing of this warp's (the same for its lanes)
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sc[TC_KEYS / 16];
#pragma unroll
            for (int g = 0; g < TC_KEYS / 16; g++) wmma::fill_fragment(sc[g], 0.0f);
            for (int kk = 0; kk < hd; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::load_matrix_sync(a, qs + warp * 16 * ld + kk, ld);
#pragma unroll
                for (int g = 0; g < TC_KEYS / 16; g++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b; // K^T
                    wmma::load_matrix_sync(b, ks + g * 16 * ld + kk, ld);
                    wmma::mma_sync(sc[g], a, b, sc[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < TC_KEYS / 16; g++)
                wmma::store_matrix_sync(ss + g * 16, sc[g], TC_KEYS, wmma::mem_row_major);
            __syncwarp();
            const float *sr = ss + lr * TC_KEYS + half * 16;
            int jb = j0 + half * 16;
            if (pass == 0) {
                float mx = -INFINITY;
                for (int u = 0; u < 16; u++)
                    if (valid && jb + u <= qpos) mx = fmaxf(mx, sr[u]);
                m = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
            } else {
                __nv_bfloat16 *pr = ps + lr * pld + half * 16;
                for (int u = 0; u < 16; u++) {
                    float p = valid && jb + u <= qpos ? expf(sr[u] - m) : 0.0f;
                    l += p;
                    pr[u] = __float2bfloat16_rn(p);
                }
                __syncwarp();
                for (int kk = 0; kk < TC_KEYS; kk += 16) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                    wmma::load_matrix_sync(a, ps + kk, pld);
#pragma unroll
                    for (int d = 0; d < TC_MAX_HD / 16; d++) {
                        if (d >= frags) break;
                        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
                        wmma::load_matrix_sync(b, vs + kk * ld + d * 16, ld);
                        wmma::mma_sync(o[d], a, b, o[d]);
                    }
                }
            }
            __syncwarp(); // the scores and probabilities are read before the next tile's
        }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    __syncthreads(); // the K/V tiles are free: each warp's outputs [16, hd] go there
    float *os = (float *)ks + warp * 16 * hd;
#pragma unroll
    for (int d = 0; d < TC_MAX_HD / 16; d++)
        if (d < frags) wmma::store_matrix_sync(os + d * 16, o[d], hd, wmma::mem_row_major);
    __syncwarp();
    if (!valid) return;
    float *dst = out + ((size_t)(t0 + row) * n_heads + h) * hd;
    for (int c = half; c < hd; c += 2) dst[c] = os[lr * hd + c] / l;
}

static size_t prefill_smem(int rpw, int head_dim) {
    return (size_t)PF_WARPS * rpw * head_dim * sizeof(float) + 2 * (size_t)ATT_CHUNK * KV_STRIDE(head_dim) * 2;
}

extern "C" int cuda_attention_prepare(int head_dim) {
    size_t smem = prefill_smem(PF_MAX_RPW, head_dim);
    if (smem <= 48 * 1024) return cudaSuccess;
    // head_dim 256 needs the opt-in beyond the default 48 KiB
    cudaError_t e = cudaFuncSetAttribute(attention_prefill_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)prefill_smem(1, head_dim));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attention_prefill_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)prefill_smem(2, head_dim));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attention_prefill_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return e;
}

// The most rows per warp that still gives 1024 blocks (about 8 per H100
// multiprocessor), at least 1.
static int prefill_rows_per_warp(int T, int n_heads) {
    for (int rpw = PF_MAX_RPW; rpw > 1; rpw /= 2)
        if ((long)((T + PF_WARPS * rpw - 1) / (PF_WARPS * rpw)) * n_heads >= 1024) return rpw;
    return 1;
}

extern "C" void cuda_attention_prefill(float *out, const float *q, const bf16_bits *k_pool, const bf16_bits *v_pool,
                                       cuda_kv_run run, int T, int n_heads, int n_kv, int head_dim, int rows_per_warp,
                                       const cuda_queue *queue) {
    int tc_fits = head_dim % 16 == 0 && head_dim <= TC_MAX_HD;
    if (tc_fits && (rows_per_warp == CUDA_ATTENTION_TENSOR_CORES || (!rows_per_warp && T >= TC_MIN_TOKENS))) {
        dim3 grid((T + TC_WARPS * 16 - 1) / (TC_WARPS * 16), n_heads);
        launch(queue, grid, TC_WARPS * WARP, prefill_tc_smem(head_dim), attention_prefill_tc_kernel, out, q, k_pool,
               v_pool, run, T, n_heads, n_kv, head_dim);
        return;
    }
    int rpw = rows_per_warp == 1 || rows_per_warp == 2 || rows_per_warp == 4 ? rows_per_warp
                                                                             : prefill_rows_per_warp(T, n_heads);
    int rows = PF_WARPS * rpw;
    dim3 grid((T + rows - 1) / rows, n_heads);
    size_t smem = prefill_smem(rpw, head_dim);
    auto kernel = rpw == 4   ? attention_prefill_kernel<4>
                  : rpw == 2 ? attention_prefill_kernel<2>
                             : attention_prefill_kernel<1>;
    launch(queue, grid, PF_WARPS * WARP, smem, kernel, out, q, k_pool, v_pool, run, T, n_heads, n_kv, head_dim);
}
