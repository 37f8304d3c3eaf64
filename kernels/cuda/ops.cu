// CUDA kernels mirroring kernels/cpu/ops.c. Correct first: each kernel is the
// CPU reference's math on the GPU (f32 accumulation and statistics over bf16
// weights); tests/test_cuda.c checks them against it.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "ops.h"
#include "common.cuh"

// ------------------------------------------------------------------ embedding

__global__ void embed_kernel(float *x, const bf16_bits *table, const int *tokens, const int *ids, const int *from,
                             int hidden) {
    await_previous_kernel();
    int token = from && from[blockIdx.x] >= 0 ? ids[from[blockIdx.x]] : tokens[blockIdx.x];
    const bf16_bits *row = table + (size_t)token * hidden;
    float *out = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf(row[i]);
}

extern "C" void cuda_embed(float *x, const bf16_bits *table, const int *tokens, const int *ids, const int *from, int T,
                           int hidden, const cuda_queue *queue) {
    launch(queue, T, 256, 0, embed_kernel, x, table, tokens, ids, from, hidden);
}

// -------------------------------------------------------------------- rmsnorm

__global__ void rmsnorm_kernel(float *out, const float *x, const bf16_bits *w, int n, float eps) {
    await_previous_kernel();
    rmsnorm_row(out + (size_t)blockIdx.x * n, x + (size_t)blockIdx.x * n, w, n, eps);
}

extern "C" void cuda_rmsnorm(float *out, const float *x, const bf16_bits *w, int T, int n, float eps,
                             const cuda_queue *queue) {
    launch(queue, T, 256, 0, rmsnorm_kernel, out, x, w, n, eps);
}

// --------------------------------------------------------------------- matmul

// Up to three matrices sharing one input, as one launch (q, k and v): row g
// of the launch is row g - (rows of the earlier parts) of its part.
struct gemv_part {
    float *y;
    const bf16_bits *w, *bias;
    int rows;
};
struct gemv_parts {
    gemv_part p[3];
    int n, rows;
};

// One warp per output row, the row read once per pass of up to 8 tokens;
// blockIdx.y is the pass (tokens 8y..8y+7), so any T is one launch. ONE: a
// decode step's single token, compiled apart so the unused token slots cost
// no registers (more warps resident, more loads in flight). NORM: x holds
// the residual rows and norm the RMSNorm weights, applied on the fly (each
// warp sums x^2 over the row it reads anyway), so a decode step needs no
// launch, and no pass over x, for the norm. Its sums take registers, so its
// several-token variant keeps 2 steps in flight, not 4 (80 registers on
// sm_90: three blocks a multiprocessor, as without the norm). RING: the
// row's loads as a ring (rows_dots).
template <bool ONE, bool NORM, bool RING>
__global__ void __launch_bounds__(256) gemv_kernel(gemv_parts parts, const float *x, const bf16_bits *norm, float eps,
                                                   int T, int cols, int accumulate, int prefetch) {
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, t0 = blockIdx.y * MAX_TOKENS_PER_PASS;
    gemv_part part = parts.p[0]; // constant indices keep the parts out of local memory
    if (parts.n > 1 && r >= part.rows) r -= part.rows, part = parts.p[1];
    if (parts.n > 2 && r >= part.rows) r -= part.rows, part = parts.p[2];
    if (prefetch && r < part.rows && blockIdx.y == 0) prefetch_l2(part.w + (size_t)r * cols, (size_t)cols * 2, lane);
    await_previous_kernel();
    if (r >= part.rows) return;
    const float *xs[MAX_TOKENS_PER_PASS];
    float acc[MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS];
    int n = pass_inputs<ONE>(xs, acc, ss, x, t0, T, cols);
    const uint16_t *wr = part.w + (size_t)r * cols;
    rows_dots<1, ONE ? 8 : NORM ? 2 : 4, NORM, RING>((float (*)[MAX_TOKENS_PER_PASS])acc, ss, &wr, norm, xs, n, cols,
                                                    lane);
    store_row<NORM>(part.y, part.rows, r, t0, n, acc, ss, part.bias ? bf(part.bias[r]) : 0.0f, cols, eps, accumulate,
                    lane);
}

static void gemv(gemv_parts parts, const float *x, const bf16_bits *norm, float eps, int T, int cols, int accumulate,
                 const cuda_queue *queue) {
    const int threads = 256, warps = threads / WARP;
    dim3 grid((parts.rows + warps - 1) / warps, passes(T));
    auto kernel = queue && queue->ring
                      ? norm ? (T == 1 ? gemv_kernel<true, true, true> : gemv_kernel<false, true, true>)
                             : (T == 1 ? gemv_kernel<true, false, true> : gemv_kernel<false, false, true>)
                  : norm ? (T == 1 ? gemv_kernel<true, true, false> : gemv_kernel<false, true, false>)
                         : (T == 1 ? gemv_kernel<true, false, false> : gemv_kernel<false, false, false>);
    launch(queue, grid, threads, 0, kernel, parts, x, norm, eps, T, cols, accumulate, queue ? queue->prefetch : 0);
}

extern "C" void cuda_matmul(float *y, const float *x, const bf16_bits *w, const bf16_bits *bias, int T, int rows,
                            int cols, int accumulate, const cuda_queue *queue) {
    gemv_parts parts = {{{y, w, bias, rows}}, 1, rows};
    gemv(parts, x, NULL, 0.0f, T, cols, accumulate, queue);
}

extern "C" void cuda_matmul_qkv(float *q, float *k, float *v, const float *x, const bf16_bits *wq,
                                const bf16_bits *wk, const bf16_bits *wv, const bf16_bits *bq, const bf16_bits *bk,
                                const bf16_bits *bv, const bf16_bits *norm, float eps, int T, int q_rows,
                                int kv_rows, int cols, const cuda_queue *queue) {
    gemv_parts parts = {{{q, wq, bq, q_rows}, {k, wk, bk, kv_rows}, {v, wv, bv, kv_rows}}, 3, q_rows + 2 * kv_rows};
    gemv(parts, x, norm, eps, T, cols, 0, queue);
}

// act[t, r] = silu(x_t . gate_r) * (x_t . up_r): a warp streams row r of
// both, their loads interleaved; blockIdx.y is the pass of 8 tokens. ONE and
// NORM, RING: as in gemv_kernel.
template <bool ONE, bool NORM, bool RING>
__global__ void __launch_bounds__(256) gemv_swiglu_kernel(float *act, const float *x, const bf16_bits *norm, float eps,
                                                          const bf16_bits *w_gate, const bf16_bits *w_up, int T,
                                                          int F, int cols, int prefetch) {
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, t0 = blockIdx.y * MAX_TOKENS_PER_PASS;
    if (prefetch && r < F && blockIdx.y == 0) {
        prefetch_l2(w_gate + (size_t)r * cols, (size_t)cols * 2, lane);
        prefetch_l2(w_up + (size_t)r * cols, (size_t)cols * 2, lane);
    }
    await_previous_kernel();
    if (r >= F) return;
    const float *xs[MAX_TOKENS_PER_PASS];
    float gu[2][MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS];
    int n = pass_inputs<ONE>(xs, gu[0], ss, x, t0, T, cols);
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) gu[1][t] = 0.0f;
    const uint16_t *rows[2] = {w_gate + (size_t)r * cols, w_up + (size_t)r * cols};
    rows_dots<2, ONE ? 4 : 2, NORM, RING>(gu, ss, rows, norm, xs, n, cols, lane);
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

extern "C" void cuda_matmul_swiglu(float *act, const float *x, const bf16_bits *norm, float eps,
                                   const bf16_bits *w_gate, const bf16_bits *w_up, int T, int F, int cols,
                                   const cuda_queue *queue) {
    const int threads = 256, warps = threads / WARP;
    dim3 grid((F + warps - 1) / warps, passes(T));
    auto kernel = queue && queue->ring
                      ? norm ? (T == 1 ? gemv_swiglu_kernel<true, true, true> : gemv_swiglu_kernel<false, true, true>)
                             : (T == 1 ? gemv_swiglu_kernel<true, false, true> : gemv_swiglu_kernel<false, false, true>)
                  : norm ? (T == 1 ? gemv_swiglu_kernel<true, true, false> : gemv_swiglu_kernel<false, true, false>)
                         : (T == 1 ? gemv_swiglu_kernel<true, false, false> : gemv_swiglu_kernel<false, false, false>);
    launch(queue, grid, threads, 0, kernel, act, x, norm, eps, w_gate, w_up, T, F, cols, queue ? queue->prefetch : 0);
}

// ------------------------------------------------- q/k norm, RoPE, KV store

// (a, b) = (x_i, x_{i + head_dim / 2}) rotated by pos * inv_freq_i, cos and
// sin scaled (YaRN's attention factor): one function for the RoPE kernel and
// the GEMV's epilogue, so both give the same bits.
static __device__ __forceinline__ void rope_pair(float a, float b, int pos, float inv_freq, float scale, float *ra,
                                                 float *rb) {
    float angle = (float)pos * inv_freq, c, s;
    sincosf(angle, &s, &c);
    c *= scale, s *= scale;
    *ra = a * c - b * s, *rb = b * c + a * s;
}

// One block per (token, head) over n_heads query heads then n_kv key heads;
// a thread per pair (i, i + head_dim/2).
__global__ void qk_rope_store_kernel(float *q, const float *k, const float *v, const bf16_bits *q_norm,
                                     const bf16_bits *k_norm, const float *inv_freq, float rope_scale,
                                     bf16_bits *k_pool, bf16_bits *v_pool, cuda_kv_map map, int n_heads, int n_kv,
                                     int hd, float eps) {
    await_previous_kernel();
    int t = blockIdx.x, h = blockIdx.y, half = hd / 2, i = threadIdx.x, pos = kv_pos(map, t);
    int is_q = h < n_heads, kvh = h - n_heads, kvd = n_kv * hd;
    const float *src = is_q ? q + ((size_t)t * n_heads + h) * hd : k + (size_t)t * kvd + (size_t)kvh * hd;
    const bf16_bits *norm = is_q ? q_norm : k_norm;
    float a = i < half ? src[i] : 0.0f, b = i < half ? src[i + half] : 0.0f;
    if (norm) {
        float inv = 1.0f / sqrtf(block_sum(a * a + b * b) / (float)hd + eps);
        if (i < half) {
            a = bf(norm[i]) * (a * inv);
            b = bf(norm[i + half]) * (b * inv);
        }
    }
    if (i >= half) return;
    float ra, rb;
    rope_pair(a, b, pos, inv_freq[i], rope_scale, &ra, &rb);
    if (is_q) {
        float *dst = q + ((size_t)t * n_heads + h) * hd;
        dst[i] = ra;
        dst[i + half] = rb;
    } else {
        size_t row = kv_row(kv_table(map, t), pos) * kvd + (size_t)kvh * hd;
        k_pool[row + i] = to_bf(ra);
        k_pool[row + i + half] = to_bf(rb);
        const float *vs = v + (size_t)t * kvd + (size_t)kvh * hd;
        v_pool[row + i] = to_bf(vs[i]);
        v_pool[row + i + half] = to_bf(vs[i + half]);
    }
}

extern "C" void cuda_qk_rope_store(float *q, const float *k, const float *v, const bf16_bits *q_norm,
                                   const bf16_bits *k_norm, const float *inv_freq, float rope_scale,
                                   bf16_bits *k_pool, bf16_bits *v_pool, cuda_kv_map map, int T, int n_heads,
                                   int n_kv, int head_dim, float eps, const cuda_queue *queue) {
    int threads = ((head_dim / 2 + WARP - 1) / WARP) * WARP;
    dim3 grid(T, n_heads + n_kv);
    launch(queue, grid, threads, 0, qk_rope_store_kernel, q, k, v, q_norm, k_norm, inv_freq, rope_scale, k_pool,
           v_pool, map,
           n_heads, n_kv, head_dim, eps);
}

// q/k/v by the GEMV with RoPE and the bf16 K/V store in its epilogue
// (models without q/k norms; POLAR_CUDA_FUSED_ROPE=1, off until a GPU
// times it): a warp per pair (i, i + head_dim / 2) of a head's rows, so both
// halves of a rotation come out of one warp; q rotated into q, k rotated and
// v as they are into the pool. gemv_kernel's sums then qk_rope_store_kernel's
// operations, so the bits of those two launches in one (issue 42 item 3).
template <bool ONE, bool NORM>
__global__ void __launch_bounds__(256) gemv_qkv_rope_kernel(gemv_parts parts, const float *x, const bf16_bits *norm,
                                                            float eps, int T, int cols, const float *inv_freq,
                                                            float rope_scale, bf16_bits *k_pool, bf16_bits *v_pool,
                                                            cuda_kv_map map, int hd) {
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP, half = hd / 2;
    int pair = blockIdx.x * warps + threadIdx.x / WARP, t0 = blockIdx.y * MAX_TOKENS_PER_PASS, which = 0;
    gemv_part part = parts.p[0]; // q, k, v: constant indices keep the parts out of local memory
    if (pair >= part.rows / 2) pair -= part.rows / 2, part = parts.p[1], which = 1;
    if (which == 1 && pair >= part.rows / 2) pair -= part.rows / 2, part = parts.p[2], which = 2;
    await_previous_kernel();
    if (pair >= part.rows / 2) return;
    int ra = pair / half * hd + pair % half, rb = ra + half; // the pair's rows within its part
    const float *xs[MAX_TOKENS_PER_PASS];
    float acc[2][MAX_TOKENS_PER_PASS], ss[MAX_TOKENS_PER_PASS];
    int n = pass_inputs<ONE>(xs, acc[0], ss, x, t0, T, cols);
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) acc[1][t] = 0.0f;
    const uint16_t *rows[2] = {part.w + (size_t)ra * cols, part.w + (size_t)rb * cols};
    rows_dots<2, ONE ? 4 : 2, NORM>(acc, ss, rows, norm, xs, n, cols, lane);
    float ba = part.bias ? bf(part.bias[ra]) : 0.0f, bb = part.bias ? bf(part.bias[rb]) : 0.0f;
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        float a = warp_sum(acc[0][t]), b = warp_sum(acc[1][t]);
        if (NORM) {
            float inv = rms_scale(ss[t], cols, eps);
            a *= inv, b *= inv;
        }
        a = a + ba, b = b + bb; // as store_row writes them
        if (lane) continue;
        int tok = t0 + t, pos = kv_pos(map, tok);
        if (which == 2) {
            size_t row = kv_row(kv_table(map, tok), pos) * part.rows;
            v_pool[row + ra] = to_bf(a), v_pool[row + rb] = to_bf(b);
            continue;
        }
        float qa, qb;
        rope_pair(a, b, pos, inv_freq[pair % half], rope_scale, &qa, &qb);
        if (which == 0) {
            part.y[(size_t)tok * part.rows + ra] = qa, part.y[(size_t)tok * part.rows + rb] = qb;
        } else {
            size_t row = kv_row(kv_table(map, tok), pos) * part.rows;
            k_pool[row + ra] = to_bf(qa), k_pool[row + rb] = to_bf(qb);
        }
    }
}

extern "C" void cuda_matmul_qkv_rope(float *q, const float *x, const bf16_bits *wq, const bf16_bits *wk,
                                     const bf16_bits *wv, const bf16_bits *bq, const bf16_bits *bk,
                                     const bf16_bits *bv, const bf16_bits *norm, float eps, const float *inv_freq,
                                     float rope_scale, bf16_bits *k_pool, bf16_bits *v_pool, cuda_kv_map map, int T,
                                     int n_heads, int n_kv, int head_dim, int cols, const cuda_queue *queue) {
    int q_rows = n_heads * head_dim, kv_rows = n_kv * head_dim;
    gemv_parts parts = {{{q, wq, bq, q_rows}, {NULL, wk, bk, kv_rows}, {NULL, wv, bv, kv_rows}}, 3,
                        (q_rows + 2 * kv_rows) / 2};
    const int threads = 256, warps = threads / WARP;
    dim3 grid((parts.rows + warps - 1) / warps, passes(T));
    auto kernel = norm ? (T == 1 ? gemv_qkv_rope_kernel<true, true> : gemv_qkv_rope_kernel<false, true>)
                       : (T == 1 ? gemv_qkv_rope_kernel<true, false> : gemv_qkv_rope_kernel<false, false>);
    launch(queue, grid, threads, 0, kernel, parts, x, norm, eps, T, cols, inv_freq, rope_scale, k_pool, v_pool, map,
           head_dim);
}

__global__ void copy_rows_kernel(float *dst, const float *src, const int *dst_idx, const int *src_idx, int width) {
    await_previous_kernel();
    int i = blockIdx.x;
    float *d = dst + (size_t)(dst_idx ? dst_idx[i] : i) * width;
    const float *s = src + (size_t)(src_idx ? src_idx[i] : i) * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

extern "C" void cuda_copy_rows(float *dst, const float *src, const int *dst_idx, const int *src_idx, int n, int width,
                               const cuda_queue *queue) {
    if (n > 0) launch(queue, n, 256, 0, copy_rows_kernel, dst, src, dst_idx, src_idx, width);
}

// ------------------------------------------------------- GEMM helpers

__global__ void to_bf16_kernel(bf16_bits *xb, const float *x, long n) {
    await_previous_kernel();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) xb[i] = to_bf(x[i]);
}

extern "C" void cuda_to_bf16(bf16_bits *xb, const float *x, long n, const cuda_queue *queue) {
    launch(queue, (unsigned)((n + 255) / 256), 256, 0, to_bf16_kernel, xb, x, n);
}

__global__ void bias_residual_kernel(float *y, const float *acc, const bf16_bits *bias, int rows, long n,
                                     int accumulate) {
    await_previous_kernel();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = acc[i] + (bias ? bf(bias[i % rows]) : 0.0f);
    y[i] = accumulate ? y[i] + v : v;
}

extern "C" void cuda_bias_residual(float *y, const float *acc, const bf16_bits *bias, int T, int rows, int accumulate,
                                   const cuda_queue *queue) {
    long n = (long)T * rows;
    launch(queue, (unsigned)((n + 255) / 256), 256, 0, bias_residual_kernel, y, acc, bias, rows, n, accumulate);
}

// ----------------------------------------------------------- swiglu, argmax

__global__ void swiglu_kernel(float *g, const float *u, int n) {
    await_previous_kernel();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_mul(g[i], u[i]);
}

extern "C" void cuda_swiglu(float *g, const float *u, int count, const cuda_queue *queue) {
    launch(queue, (count + 255) / 256, 256, 0, swiglu_kernel, g, u, count);
}

// One block per row of n logits; each thread scans its share in ascending
// order keeping the first maximum, then a tree keeps the lower index on
// ties. The chosen id (plus base) goes to out[row] and, when given,
// host[row] (host memory mapped into the device's address space: the host
// reads it after the step's event, without a copy), and its value to
// value[row] when given.
__global__ void argmax_kernel(int *out, int *host, float *value, const float *logits, int n, int base) {
    await_previous_kernel();
    logits += (size_t)blockIdx.x * n;
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = -INFINITY;
    int bi = n; // beyond any index: loses every tie
    if ((n & 3) == 0 && ((uintptr_t)logits & 15) == 0) {
        for (int i = threadIdx.x * 4; i < n; i += blockDim.x * 4) {
            float4 v = *(const float4 *)(logits + i);
            if (v.x > bv) bv = v.x, bi = i;
            if (v.y > bv) bv = v.y, bi = i + 1;
            if (v.z > bv) bv = v.z, bi = i + 2;
            if (v.w > bv) bv = v.w, bi = i + 3;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (logits[i] > bv) bv = logits[i], bi = i;
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = best_v[threadIdx.x + s];
            int oi = best_i[threadIdx.x + s];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int id = (best_i[0] < n ? best_i[0] : 0) + base;
        out[blockIdx.x] = id;
        if (host) host[blockIdx.x] = id;
        if (value) value[blockIdx.x] = best_v[0];
    }
}

extern "C" void cuda_argmax_rows(int *out, int *host, const float *logits, int rows, int n, const cuda_queue *queue) {
    launch(queue, rows, 1024, 0, argmax_kernel, out, host, (float *)NULL, logits, n, 0);
}

extern "C" void cuda_argmax_part(float *part, const float *logits, int rows, int n, int base, const cuda_queue *queue) {
    launch(queue, rows, 1024, 0, argmax_kernel, (int *)(part + rows), (int *)NULL, part, logits, n, base);
}

// A thread per row: the ranks' maxima in rank order, a later one taken only
// when strictly larger (NaNs never are), so ties go to the lower ids and a
// row with nothing above -infinity gets 0, as argmax_kernel gives.
__global__ void argmax_merge_kernel(int *out, int *host, const float *parts, int rows, int n_parts) {
    await_previous_kernel();
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float best = -INFINITY;
    int id = 0;
    for (int p = 0; p < n_parts; p++) {
        const float *part = parts + (size_t)p * 2 * rows;
        if (part[r] > best) best = part[r], id = ((const int *)(part + rows))[r];
    }
    out[r] = id;
    if (host) host[r] = id;
}

extern "C" void cuda_argmax_merge(int *out, int *host, const float *parts, int rows, int n_parts,
                                  const cuda_queue *queue) {
    launch(queue, (rows + 127) / 128, 128, 0, argmax_merge_kernel, out, host, parts, rows, n_parts);
}


// Read bandwidth: each thread sums 16-byte words a grid's stride apart (so
// a warp's loads are whole lines), a block's sum goes to out[blockIdx.x]
// so the loads cannot be dropped. words: 16-byte words of buf.
__global__ void read_sum_kernel(unsigned *out, const uint4 *buf, size_t words) {
    await_previous_kernel();
    unsigned sum = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = buf[i];
        sum += v.x ^ v.y ^ v.z ^ v.w;
    }
    for (int o = WARP / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __shared__ unsigned warp_sums[32];
    if (threadIdx.x % WARP == 0) warp_sums[threadIdx.x / WARP] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned block_sum = 0;
        for (int w = 0; w < (int)blockDim.x / WARP; w++) block_sum += warp_sums[w];
        out[blockIdx.x] = block_sum;
    }
}

extern "C" void cuda_read_sum(unsigned *out, int blocks, const void *buf, size_t bytes, const cuda_queue *queue) {
    launch(queue, blocks, 512, 0, read_sum_kernel, out, (const uint4 *)buf, bytes / 16);
}
