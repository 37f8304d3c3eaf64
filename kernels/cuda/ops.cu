// CUDA kernels mirroring kernels/cpu/ops.c. Correct first: each kernel is the
// CPU reference's math on the GPU (f32 accumulation and statistics over bf16
// weights); tests/test_cuda.c checks them against it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "ops.h"
#include "warp.cuh"

#define MAX_TOKENS_PER_PASS 8

static __device__ __forceinline__ float bf(bf16_bits b) { return __uint_as_float((unsigned)b << 16); }

static __device__ __forceinline__ bf16_bits to_bf(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Sum over a block of up to 1024 threads; every thread gets the result.
static __device__ float block_sum(float v) {
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

static cudaStream_t st(void *s) { return (cudaStream_t)s; }

// ------------------------------------------------------------------ embedding

__global__ void embed_kernel(float *x, const bf16_bits *table, const int *tokens, int hidden) {
    const bf16_bits *row = table + (size_t)tokens[blockIdx.x] * hidden;
    float *out = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf(row[i]);
}

extern "C" void cuda_embed(float *x, const bf16_bits *table, const int *tokens, int T, int hidden, void *stream) {
    embed_kernel<<<T, 256, 0, st(stream)>>>(x, table, tokens, hidden);
}

// -------------------------------------------------------------------- rmsnorm

__global__ void rmsnorm_kernel(float *out, const float *x, const bf16_bits *w, int n, float eps) {
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = bf(w[i]) * (xr[i] * inv);
}

extern "C" void cuda_rmsnorm(float *out, const float *x, const bf16_bits *w, int T, int n, float eps, void *stream) {
    rmsnorm_kernel<<<T, 256, 0, st(stream)>>>(out, x, w, n, eps);
}

// --------------------------------------------------------------------- matmul

// One warp per output row. With cols % 8 == 0 each lane loads 8 bf16 (16
// bytes) of the row per step; the row is read once for up to 8 tokens.
__global__ void matmul_kernel(float *y, const float *x, const bf16_bits *w, const bf16_bits *bias, int T, int rows,
                              int cols, int accumulate) {
    int warps = blockDim.x / WARP;
    int r = blockIdx.x * warps + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= rows) return;
    const bf16_bits *wr = w + (size_t)r * cols;
    float acc[MAX_TOKENS_PER_PASS];
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) acc[t] = 0.0f;
    if ((cols & 7) == 0) {
        for (int j = lane * 8; j < cols; j += WARP * 8) {
            uint4 packed = *(const uint4 *)(wr + j);
            float wf[8];
            wf[0] = __uint_as_float(packed.x << 16), wf[1] = __uint_as_float(packed.x & 0xffff0000u);
            wf[2] = __uint_as_float(packed.y << 16), wf[3] = __uint_as_float(packed.y & 0xffff0000u);
            wf[4] = __uint_as_float(packed.z << 16), wf[5] = __uint_as_float(packed.z & 0xffff0000u);
            wf[6] = __uint_as_float(packed.w << 16), wf[7] = __uint_as_float(packed.w & 0xffff0000u);
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * cols + j;
                float4 a = *(const float4 *)xt, b = *(const float4 *)(xt + 4);
                acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                          wf[6] * b.z + wf[7] * b.w;
            }
        }
    } else {
        for (int j = lane; j < cols; j += WARP) {
            float wj = bf(wr[j]);
            for (int t = 0; t < T; t++) acc[t] += wj * x[(size_t)t * cols + j];
        }
    }
    float b = bias ? bf(bias[r]) : 0.0f;
    for (int t = 0; t < T; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0) {
            float *dst = &y[(size_t)t * rows + r];
            *dst = accumulate ? *dst + (s + b) : s + b;
        }
    }
}

extern "C" void cuda_matmul(float *y, const float *x, const bf16_bits *w, const bf16_bits *bias, int T, int rows,
                            int cols, int accumulate, void *stream) {
    const int threads = 256, warps = threads / WARP;
    for (int t0 = 0; t0 < T; t0 += MAX_TOKENS_PER_PASS) {
        int nt = T - t0 < MAX_TOKENS_PER_PASS ? T - t0 : MAX_TOKENS_PER_PASS;
        matmul_kernel<<<(rows + warps - 1) / warps, threads, 0, st(stream)>>>(
            y + (size_t)t0 * rows, x + (size_t)t0 * cols, w, bias, nt, rows, cols, accumulate);
    }
}

// ------------------------------------------------- q/k norm, RoPE, KV store

// One block per (token, head) over n_heads query heads then n_kv key heads;
// a thread per pair (i, i + head_dim/2).
__global__ void qk_rope_store_kernel(float *q, const float *k, const float *v, const bf16_bits *q_norm,
                                     const bf16_bits *k_norm, const float *inv_freq, bf16_bits *k_cache,
                                     bf16_bits *v_cache, const int *pos_dev, int n_heads, int n_kv, int hd, float eps) {
    int t = blockIdx.x, h = blockIdx.y, half = hd / 2, i = threadIdx.x, pos0 = *pos_dev;
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
    float angle = (float)(pos0 + t) * inv_freq[i], c, s;
    sincosf(angle, &s, &c);
    float ra = a * c - b * s, rb = b * c + a * s;
    if (is_q) {
        float *dst = q + ((size_t)t * n_heads + h) * hd;
        dst[i] = ra;
        dst[i + half] = rb;
    } else {
        size_t row = (size_t)(pos0 + t) * kvd + (size_t)kvh * hd;
        k_cache[row + i] = to_bf(ra);
        k_cache[row + i + half] = to_bf(rb);
        const float *vs = v + (size_t)t * kvd + (size_t)kvh * hd;
        v_cache[row + i] = to_bf(vs[i]);
        v_cache[row + i + half] = to_bf(vs[i + half]);
    }
}

extern "C" void cuda_qk_rope_store(float *q, const float *k, const float *v, const bf16_bits *q_norm,
                                   const bf16_bits *k_norm, const float *inv_freq, bf16_bits *k_cache,
                                   bf16_bits *v_cache, const int *pos0, int T, int n_heads, int n_kv, int head_dim,
                                   float eps, void *stream) {
    int threads = ((head_dim / 2 + WARP - 1) / WARP) * WARP;
    dim3 grid(T, n_heads + n_kv);
    qk_rope_store_kernel<<<grid, threads, 0, st(stream)>>>(q, k, v, q_norm, k_norm, inv_freq, k_cache, v_cache, pos0,
                                                          n_heads, n_kv, head_dim, eps);
}

// ------------------------------------------------------------------ attention
//
// Split-K flash decoding: a block per (token, KV head, chunk of ATT_CHUNK
// positions) loads the chunk's K and V tiles once into shared memory for
// all query heads of the GQA group, and writes each head's partial result
// (max, sum of exponentials, unnormalised output) for the chunk. A second
// kernel merges the chunks with their log-sum-exp weights. The grid covers
// the whole context, chunks past a token's position exit at once, so the
// launch does not depend on the position (a captured graph serves every step).

#define ATT_CHUNK 32     // 2 tiles of 32 x 256 bf16 + scores: 33 KiB of shared memory
#define ATT_MAX_GROUP 8   // query heads per KV head held in shared memory at once
#define ATT_MAX_HD 256

__global__ void attention_partial_kernel(float *part, const float *q, const bf16_bits *kc, const bf16_bits *vc,
                                         const int *pos_dev, int n_heads, int n_kv, int hd, int n_chunks) {
    int t = blockIdx.x, kvh = blockIdx.y, chunk = blockIdx.z, pos = *pos_dev + t;
    int group = n_heads / n_kv, kvd = n_kv * hd, j0 = chunk * ATT_CHUNK;
    int n = pos + 1 - j0 < ATT_CHUNK ? pos + 1 - j0 : ATT_CHUNK;
    size_t stride = (size_t)hd + 2; // per (head, chunk): max, sum, output[hd]
    if (n <= 0) {                   // beyond this token's position: an empty partial
        for (int h = threadIdx.x; h < group; h += blockDim.x) {
            float *p = part + (((size_t)t * n_heads + kvh * group + h) * n_chunks + chunk) * stride;
            p[0] = -INFINITY;
            p[1] = 0.0f;
        }
        return;
    }
    __shared__ bf16_bits ks[ATT_CHUNK * ATT_MAX_HD], vs[ATT_CHUNK * ATT_MAX_HD];
    __shared__ float sc[ATT_MAX_GROUP * ATT_CHUNK];
    for (int i = threadIdx.x; i < n * hd; i += blockDim.x) {
        int j = i / hd, c = i % hd;
        size_t row = (size_t)(j0 + j) * kvd + (size_t)kvh * hd + c;
        ks[i] = kc[row];
        vs[i] = vc[row];
    }
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd);
    for (int g0 = 0; g0 < group; g0 += ATT_MAX_GROUP) {
        int ng = group - g0 < ATT_MAX_GROUP ? group - g0 : ATT_MAX_GROUP;
        for (int i = threadIdx.x; i < ng * n; i += blockDim.x) {
            int h = i / n, j = i % n;
            const float *qh = q + ((size_t)t * n_heads + kvh * group + g0 + h) * hd;
            float s = 0.0f;
            for (int c = 0; c < hd; c++) s += qh[c] * bf(ks[j * hd + c]);
            sc[h * ATT_CHUNK + j] = s * scale;
        }
        __syncthreads();
        // a warp per head: the chunk's max and sum of exponentials
        int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
        for (int h = warp; h < ng; h += warps) {
            float m = -INFINITY, l = 0.0f;
            for (int j = lane; j < n; j += WARP) m = fmaxf(m, sc[h * ATT_CHUNK + j]);
            m = warp_max(m);
            for (int j = lane; j < n; j += WARP) l += (sc[h * ATT_CHUNK + j] = expf(sc[h * ATT_CHUNK + j] - m));
            l = warp_sum(l);
            if (lane == 0) {
                float *p = part + (((size_t)t * n_heads + kvh * group + g0 + h) * n_chunks + chunk) * stride;
                p[0] = m;
                p[1] = l;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < ng * hd; i += blockDim.x) {
            int h = i / hd, c = i % hd;
            float o = 0.0f;
            for (int j = 0; j < n; j++) o += sc[h * ATT_CHUNK + j] * bf(vs[j * hd + c]);
            part[(((size_t)t * n_heads + kvh * group + g0 + h) * n_chunks + chunk) * stride + 2 + c] = o;
        }
        __syncthreads();
    }
}

__global__ void attention_merge_kernel(float *out, const float *part, int n_heads, int hd, int n_chunks) {
    int t = blockIdx.x, h = blockIdx.y;
    size_t stride = (size_t)hd + 2;
    const float *p = part + ((size_t)t * n_heads + h) * n_chunks * stride;
    float m = -INFINITY;
    for (int k = 0; k < n_chunks; k++) m = fmaxf(m, p[k * stride]);
    float l = 0.0f;
    for (int k = 0; k < n_chunks; k++)
        if (p[k * stride + 1] > 0.0f) l += p[k * stride + 1] * expf(p[k * stride] - m);
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < n_chunks; k++)
            if (p[k * stride + 1] > 0.0f) o += p[k * stride + 2 + c] * expf(p[k * stride] - m);
        out[((size_t)t * n_heads + h) * hd + c] = o / l;
    }
}

extern "C" size_t cuda_attention_scratch(int T, int n_heads, int head_dim, int max_ctx) {
    size_t chunks = (size_t)(max_ctx + ATT_CHUNK - 1) / ATT_CHUNK;
    return (size_t)T * n_heads * chunks * ((size_t)head_dim + 2);
}

extern "C" void cuda_attention(float *out, const float *q, const bf16_bits *k_cache, const bf16_bits *v_cache,
                               float *scratch, const int *pos0, int T, int n_heads, int n_kv, int head_dim, int max_ctx,
                               void *stream) {
    int chunks = (max_ctx + ATT_CHUNK - 1) / ATT_CHUNK;
    attention_partial_kernel<<<dim3(T, n_kv, chunks), 128, 0, st(stream)>>>(scratch, q, k_cache, v_cache, pos0,
                                                                             n_heads, n_kv, head_dim, chunks);
    attention_merge_kernel<<<dim3(T, n_heads), 128, 0, st(stream)>>>(out, scratch, n_heads, head_dim, chunks);
}

// ------------------------------------------------------- GEMM helpers

__global__ void to_bf16_kernel(bf16_bits *xb, const float *x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) xb[i] = to_bf(x[i]);
}

extern "C" void cuda_to_bf16(bf16_bits *xb, const float *x, long n, void *stream) {
    to_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st(stream)>>>(xb, x, n);
}

__global__ void bias_residual_kernel(float *y, const float *acc, const bf16_bits *bias, int rows, long n,
                                     int accumulate) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = acc[i] + (bias ? bf(bias[i % rows]) : 0.0f);
    y[i] = accumulate ? y[i] + v : v;
}

extern "C" void cuda_bias_residual(float *y, const float *acc, const bf16_bits *bias, int T, int rows, int accumulate,
                                   void *stream) {
    long n = (long)T * rows;
    bias_residual_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st(stream)>>>(y, acc, bias, rows, n, accumulate);
}

// ----------------------------------------------------------- swiglu, argmax

__global__ void swiglu_kernel(float *g, const float *u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

extern "C" void cuda_swiglu(float *g, const float *u, int count, void *stream) {
    swiglu_kernel<<<(count + 255) / 256, 256, 0, st(stream)>>>(g, u, count);
}

__global__ void argmax_kernel(int *out, const float *logits, int n) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = -INFINITY;
    int bi = n; // beyond any index: loses every tie
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (logits[i] > bv) bv = logits[i], bi = i; // strided ascending: keeps the first maximum
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
    if (threadIdx.x == 0) out[0] = best_i[0] < n ? best_i[0] : 0;
}

extern "C" void cuda_argmax(int *out, const float *logits, int n, void *stream) {
    argmax_kernel<<<1, 1024, 0, st(stream)>>>(out, logits, n);
}

// ------------------------------------------------------------------------ MoE

// One block per token; thread 0 routes sequentially, as the CPU does, so the
// choice and its weights are the reference's (E and k are small).
__global__ void route_kernel(int *idx, float *weight, const float *logits, int E, int k, int norm) {
    if (threadIdx.x != 0) return;
    const float *l = logits + (size_t)blockIdx.x * E;
    int *id = idx + (size_t)blockIdx.x * k;
    float *w = weight + (size_t)blockIdx.x * k;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
    for (int e = 0; e < E; e++) sum += expf(l[e] - mx);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= id[i] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        id[j] = best;
        w[j] = expf(l[best] - mx) / sum;
    }
    if (norm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] /= s;
    }
    for (int j = 1; j < k; j++)
        for (int i = j; i > 0 && id[i] < id[i - 1]; i--) {
            int ti = id[i];
            id[i] = id[i - 1], id[i - 1] = ti;
            float tw = w[i];
            w[i] = w[i - 1], w[i - 1] = tw;
        }
}

extern "C" void cuda_route(int *idx, float *weight, const float *logits, int T, int E, int k, int norm, void *stream) {
    route_kernel<<<T, WARP, 0, st(stream)>>>(idx, weight, logits, E, k, norm);
}

// A warp per (slot, row); the expert comes from idx on the device, so no
// host round trip decides which weights are read.
__global__ void expert_matmul_kernel(float *y, const float *x, const bf16_bits *w, const int *idx, int n_slots, int k,
                                     int rows, int cols, int x_per_slot) {
    int warps = blockDim.x / WARP;
    long g = (long)blockIdx.x * warps + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (g >= (long)n_slots * rows) return;
    int slot = (int)(g / rows), r = (int)(g % rows);
    const bf16_bits *wr = w + ((size_t)idx[slot] * rows + r) * cols;
    const float *xr = x + (size_t)(x_per_slot ? slot : slot / k) * cols;
    float acc = 0.0f;
    for (int j = lane; j < cols; j += WARP) acc += bf(wr[j]) * xr[j];
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)slot * rows + r] = acc;
}

extern "C" void cuda_expert_matmul(float *y, const float *x, const bf16_bits *w, const int *idx, int T, int k,
                                   int rows, int cols, int x_per_slot, void *stream) {
    const int threads = 256, warps = threads / WARP;
    long total = (long)T * k * rows;
    expert_matmul_kernel<<<(unsigned)((total + warps - 1) / warps), threads, 0, st(stream)>>>(y, x, w, idx, T * k, k,
                                                                                             rows, cols, x_per_slot);
}

__global__ void expert_swiglu_kernel(float *act, const float *gu, int n_slots, int F) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_slots * F) return;
    long s = i / F, c = i % F;
    float g = gu[s * 2 * F + c], u = gu[s * 2 * F + F + c];
    act[i] = g / (1.0f + expf(-g)) * u;
}

extern "C" void cuda_expert_swiglu(float *act, const float *gu, int n_slots, int F, void *stream) {
    long n = (long)n_slots * F;
    expert_swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st(stream)>>>(act, gu, n_slots, F);
}

__global__ void moe_combine_kernel(float *x, const float *y, const float *weight, const float *shared,
                                   const float *gate, int k, int H) {
    int t = blockIdx.x;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float out = 0.0f;
        for (int j = 0; j < k; j++) out += y[((size_t)t * k + j) * H + i] * weight[(size_t)t * k + j];
        if (shared) out += 1.0f / (1.0f + expf(-gate[t])) * shared[(size_t)t * H + i];
        x[(size_t)t * H + i] += out;
    }
}

extern "C" void cuda_moe_combine(float *x, const float *y, const float *weight, const float *shared, const float *gate,
                                 int T, int k, int H, void *stream) {
    moe_combine_kernel<<<T, 256, 0, st(stream)>>>(x, y, weight, shared, gate, k, H);
}
