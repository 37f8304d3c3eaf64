// The block GEMVs' integer path (quant.cu): a pass's inputs quantized once
// per thread block into shared memory as int8 blocks of 32, as the CPU's
// cpu_quantize_q8 quantizes them (d = max |x| / 127, q = x 127 / max
// rounded to nearest even, s = d sum q), then rows of every kept type
// multiplied by dp4a: each 32-weight (Q6_K: 16-weight) block's sum of
// products an exact int32, scaled by the block's scale and the input's d,
// a min times s, in f32 (IQ4_NL's and IQ4_XS's codes turned into their
// int8 levels four at a time by byte permutes of the level table) — the
// operations of the CPU's quantized kernels, where unpacking every weight
// to f32 (blocks.cuh) costs some four instructions a weight and left the
// GEMV bound by arithmetic, not by memory.
#ifndef POLAR_CUDA_Q8_CUH
#define POLAR_CUDA_Q8_CUH

#include "blocks.cuh"

// n tokens' quantized rows of cols inputs in shared memory: q[n][cols],
// then d[n][cols / 32] and s[n][cols / 32].
struct q8_rows {
    const int8_t *q;
    const float *d, *s;
};

// Shared memory for n rows of cols (a multiple of 32).
static __host__ __device__ __forceinline__ size_t q8_rows_bytes(int n, int cols) {
    return (size_t)n * ((size_t)cols + 2 * sizeof(float) * (size_t)(cols / 32));
}

// The block's threads quantize rows xs[0..n) into smem (q8_rows_bytes of
// it, 16-byte aligned), a warp per 32-block, each lane one input, as
// cpu_quantize_q8 does it (a block with a NaN or an infinity: d and s NaN,
// q 0). NORM: each x times its norm weight first, and ss[t] the row's sum of
// x^2, the same in every thread. Ends with the block synchronized; every
// thread of the block must call it.
template <bool NORM>
static __device__ q8_rows quantize_q8_rows(unsigned char *smem, const float *const xs[MAX_TOKENS_PER_PASS],
                                           const uint16_t *norm, int n, int cols, float *ss) {
    int8_t *q = (int8_t *)smem;
    float *d = (float *)(smem + (size_t)n * cols), *s = d + (size_t)n * (cols / 32);
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP, nb = cols / 32;
    for (int t = 0; t < n; t++) {
        float sq = 0.0f;
        for (int b = warp; b < nb; b += warps) {
            float x = xs[t][32 * b + lane];
            if (NORM) sq += x * x, x *= bf(norm[32 * b + lane]);
            int finite = __all_sync(0xffffffffu, isfinite(x));
            float amax = warp_max(fabsf(x)), dq = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
            if (isinf(id)) id = 0.0f; // amax under 127 / FLT_MAX: the block is 0, as on the CPU
            int v = finite ? (int)rintf(x * id) : 0;
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            int sum = v;
            for (int o = WARP / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            q[(size_t)t * cols + 32 * b + lane] = (int8_t)v;
            if (lane == 0) {
                d[(size_t)t * nb + b] = finite ? dq : __int_as_float(0x7fc00000);
                s[(size_t)t * nb + b] = finite ? dq * (float)sum : __int_as_float(0x7fc00000);
            }
        }
        if (NORM) ss[t] = block_sum(sq);
    }
    __syncthreads();
    q8_rows rows = {q, d, s};
    return rows;
}

// Word i (0..3, a constant once unrolled) of a 16-byte vector.
static __device__ __forceinline__ unsigned word_of(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Whether the GEMVs multiply type t by dp4a on quantized inputs (rows of
// a multiple of 64 weights: the k-quants' always are).
static __host__ __device__ __forceinline__ bool q8_gemv_type(int t) {
    return t == CPU_W_Q4_K || t == CPU_W_Q5_K || t == CPU_W_Q6_K || t == CPU_W_Q8_0 || t == CPU_W_Q4_0 ||
           t == CPU_W_Q4_1 || t == CPU_W_Q5_0 || t == CPU_W_Q5_1 || t == CPU_W_IQ4_NL || t == CPU_W_IQ4_XS;
}

// 16 bytes at a 2-byte aligned p (Q6_K's 210-byte blocks allow no more).
static __device__ __forceinline__ uint4 load16_at2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return make_uint4((unsigned)h[0] | (unsigned)h[1] << 16, (unsigned)h[2] | (unsigned)h[3] << 16,
                      (unsigned)h[4] | (unsigned)h[5] << 16, (unsigned)h[6] | (unsigned)h[7] << 16);
}

// Four bits as four bytes, bit i in bit 0 of byte i: the shifted copies
// x, x << 7, x << 14, x << 21 of a 4-bit x do not overlap.
static __device__ __forceinline__ unsigned bits_to_bytes(unsigned four) { return (four * 0x00204081u) & 0x01010101u; }

// acc[t] += 32-block k of a row of a 32-weight type (Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1) . token t: the block's products less its zero point times
// sum x (8 for Q4_0, 16 for Q5_0, the sums by dp4a), times d d_x, plus the
// offset m times s for Q4_1 and Q5_1, as the CPU's kernels take them.
static __device__ __forceinline__ void q32_q8_block(float *acc, int type, const uint8_t *row, int k, q8_rows x, int n,
                                                    int cols) {
    const bool offset = type == CPU_W_Q4_1 || type == CPU_W_Q5_1, five = type == CPU_W_Q5_0 || type == CPU_W_Q5_1;
    const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)type) * k;
    const uint16_t *h = (const uint16_t *)b; // every field 2-byte aligned
    float d = f16_bits(h[0]), m = offset ? f16_bits(h[1]) : 0.0f;
    int z = type == CPU_W_Q4_0 ? 8 : type == CPU_W_Q5_0 ? 16 : 0, wq[8]; // weights 4i..4i+3, unsigned but Q8_0's
    if (type == CPU_W_Q8_0) {
        uint4 q0 = load16_at2(b + 2), q1 = load16_at2(b + 18);
#pragma unroll
        for (int i = 0; i < 4; i++) wq[i] = (int)word_of(q0, i), wq[i + 4] = (int)word_of(q1, i);
    } else {
        const int qs = type == CPU_W_Q4_0 ? 2 : type == CPU_W_Q4_1 ? 4 : type == CPU_W_Q5_0 ? 6 : 8;
        uint4 q = load16_at2(b + qs); // low nibbles weights 0..15, high 16..31
        unsigned qh = five ? (unsigned)h[qs / 2 - 2] | (unsigned)h[qs / 2 - 1] << 16 : 0; // bit i: weight i's fifth
#pragma unroll
        for (int i = 0; i < 4; i++) {
            unsigned w = word_of(q, i);
            wq[i] = (int)((w & 0x0F0F0F0Fu) | bits_to_bytes((qh >> (4 * i)) & 0xF) << 4);
            wq[i + 4] = (int)(((w >> 4) & 0x0F0F0F0Fu) | bits_to_bytes((qh >> (16 + 4 * i)) & 0xF) << 4);
        }
    }
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        const uint8_t *xq = (const uint8_t *)x.q + (size_t)t * cols + 32 * (size_t)k;
        uint4 x0 = *(const uint4 *)xq, x1 = *(const uint4 *)(xq + 16);
        int sq = 0, sx = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int xw = (int)word_of(i < 4 ? x0 : x1, i % 4);
            sq = __dp4a(wq[i], xw, sq);
            if (z) sx = __dp4a(0x01010101, xw, sx);
        }
        size_t j = (size_t)t * (cols / 32) + k;
        float v = fmaf((float)(sq - z * sx), d * x.d[j], acc[t]);
        acc[t] = offset ? fmaf(m, x.s[j], v) : v;
    }
}

// The IQ4 levels of four codes, one in the low nibble of each byte of
// codes (high nibbles 0), as four int8: levels 0..7 picked from the first
// two words of the table (iq4_levels_dev's bytes, little-endian, held in
// registers), 8..15 from the last two, each code's bit 3 choosing.
static __device__ __forceinline__ int iq4_levels4(unsigned codes) {
    unsigned t = codes | codes >> 4, sel = ((t & 0xFFu) | (t >> 8 & 0xFF00u)) & 0x7777u;
    unsigned low = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel), high = __byte_perm(0x26190D01u, 0x71594535u, sel);
    unsigned upper = (codes >> 3 & 0x01010101u) * 0xFFu; // 0xFF in the bytes whose code is 8..15
    return (int)((low & ~upper) | (high & upper));
}

// The exact sum of a 32-block's IQ4 levels (16 bytes of codes: low nibbles
// weights 0..15, high 16..31) times token t's 32 quantized inputs at xq.
static __device__ __forceinline__ int iq4_block_dot(const unsigned code_words[4], const int8_t *xq) {
    uint4 x0 = *(const uint4 *)xq, x1 = *(const uint4 *)(xq + 16);
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sum = __dp4a(iq4_levels4(code_words[i] & 0x0F0F0F0Fu), (int)word_of(x0, i), sum);
        sum = __dp4a(iq4_levels4(code_words[i] >> 4 & 0x0F0F0F0Fu), (int)word_of(x1, i), sum);
    }
    return sum;
}

// acc[t] += 32-block k of an IQ4_NL row, or 32-block k % 8 of IQ4_XS
// 256-block k / 8 (its 6-bit scale less 32 times d), . token t.
static __device__ __forceinline__ void iq4_q8_block(float *acc, int type, const uint8_t *row, int k, q8_rows x, int n,
                                                    int cols) {
    unsigned words[4];
    float a;
    if (type == CPU_W_IQ4_NL) {
        const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)type) * k;
        uint4 q = load16_at2(b + 2);
#pragma unroll
        for (int i = 0; i < 4; i++) words[i] = word_of(q, i);
        a = f16_bits(*(const uint16_t *)b);
    } else { // d, the scales' high bits (2 bytes), their low nibbles (4), 8 x 16 bytes of codes: 8-byte aligned
        const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)type) * (k / 8);
        const int j = k % 8;
        uint2 q0 = *(const uint2 *)(b + 8 + 16 * j), q1 = *(const uint2 *)(b + 16 + 16 * j);
        words[0] = q0.x, words[1] = q0.y, words[2] = q1.x, words[3] = q1.y;
        unsigned head = *(const unsigned *)b, low = (b[4 + j / 2] >> (4 * (j % 2))) & 0xF, high = (head >> (16 + 2 * j)) & 3;
        a = f16_bits(head & 0xffffu) * (float)((int)(low | high << 4) - 32);
    }
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        int sq = iq4_block_dot(words, x.q + (size_t)t * cols + 32 * (size_t)k);
        acc[t] = fmaf((float)sq, a * x.d[(size_t)t * (cols / 32) + k], acc[t]);
    }
}

// acc[t] += unit P of a Q6_K row . token t: unit P is half g = P % 2 (16
// weights) of each of the four 32-blocks of half h = P / 2 % 2 of 256-block
// P / 4, each with its own int8 scale: nibbles from ql, two high bits from
// qh, less 32 (the CPU's -32 sum x, here dp4a of ones).
static __device__ __forceinline__ void q6k_q8_unit(float *acc, const uint8_t *row, int P, q8_rows x, int n,
                                                   int cols) {
    const int nb = cols / 32, h = P / 2 % 2, g = P % 2;
    const uint8_t *b = row + cpu_kept_block_bytes(CPU_W_Q6_K) * (P / 4);
    uint4 ql0 = load16_at2(b + 64 * h + 16 * g), ql1 = load16_at2(b + 64 * h + 32 + 16 * g);
    uint4 qh = load16_at2(b + 128 + 32 * h + 16 * g);
    float d = f16_bits(*(const uint16_t *)(b + 208)), a[4];
#pragma unroll
    for (int k = 0; k < 4; k++) a[k] = d * (float)(int8_t)b[192 + 8 * h + 2 * k + g];
    int wq[4][4]; // [32-block 4h + k][word]: 6-bit weights, unsigned
#pragma unroll
    for (int m = 0; m < 4; m++) {
        unsigned A = word_of(ql0, m), B = word_of(ql1, m), H = word_of(qh, m);
        wq[0][m] = (int)((A & 0x0F0F0F0Fu) | ((H << 4) & 0x30303030u));
        wq[1][m] = (int)((B & 0x0F0F0F0Fu) | ((H << 2) & 0x30303030u));
        wq[2][m] = (int)(((A >> 4) & 0x0F0F0F0Fu) | (H & 0x30303030u));
        wq[3][m] = (int)(((B >> 4) & 0x0F0F0F0Fu) | ((H >> 2) & 0x30303030u));
    }
#pragma unroll
    for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
        if (t >= n) break;
        float v = acc[t];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            size_t blk = (size_t)8 * (P / 4) + 4 * h + k; // the input's 32-block
            uint4 xv = *(const uint4 *)(x.q + (size_t)t * cols + 32 * blk + 16 * g);
            int sq = 0, sx = 0;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                int xw = (int)word_of(xv, m);
                sq = __dp4a(wq[k][m], xw, sq), sx = __dp4a(0x01010101, xw, sx);
            }
            v = fmaf((float)(sq - 32 * sx), a[k] * x.d[(size_t)t * nb + blk], v);
        }
        acc[t] = v;
    }
}

// acc[r][t] += this lane's share of row r . token t for R rows of
// q8_gemv_type types (in w) and n quantized tokens, the lane taking units
// lane, lane + 32, ... of 64 weights (cols a multiple of 64): for Q4_K /
// Q5_K a pair of 32-blocks (32 bytes of nibbles, low the even block's
// weights, high the odd one's), for Q6_K q6k_q8_unit's, for the 32-weight
// types two blocks.
template <int R>
static __device__ __forceinline__ void q8_dots(float (*acc)[MAX_TOKENS_PER_PASS], const cuda_wmat *w,
                                               const uint8_t *const *rows, q8_rows x, int n, int cols, int lane) {
    const int nb = cols / 32;
    for (int P = lane; P < cols / 64; P += WARP) {
        int p = P % 4; // the pair within its 256-block: blocks 2p, 2p + 1
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (w[r].type == CPU_W_Q6_K) {
                q6k_q8_unit(acc[r], rows[r], P, x, n, cols);
                continue;
            }
            if (w[r].type == CPU_W_IQ4_NL || w[r].type == CPU_W_IQ4_XS) {
                iq4_q8_block(acc[r], w[r].type, rows[r], 2 * P, x, n, cols);
                iq4_q8_block(acc[r], w[r].type, rows[r], 2 * P + 1, x, n, cols);
                continue;
            }
            if (!is_k4(w[r].type)) { // two 32-blocks
                q32_q8_block(acc[r], w[r].type, rows[r], 2 * P, x, n, cols);
                q32_q8_block(acc[r], w[r].type, rows[r], 2 * P + 1, x, n, cols);
                continue;
            }
            const bool five = w[r].type == CPU_W_Q5_K;
            const uint8_t *b = k4_block(w[r].type, rows[r], P / 4);
            uint4 head = *(const uint4 *)b;
            float d = f16_bits(head.x & 0xffffu), neg_dmin = -f16_bits(head.x >> 16), a[2], m[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int sc, mn;
                k4_scale_min(head, 2 * p + e, &sc, &mn);
                a[e] = d * (float)sc, m[e] = neg_dmin * (float)mn;
            }
            const uint4 *qs = (const uint4 *)(b + (five ? 48 : 16) + 32 * p), *qh = (const uint4 *)(b + 16);
            uint4 qv[2] = {qs[0], qs[1]}, hv[2] = {};
            if (five) hv[0] = qh[0], hv[1] = qh[1];
            int lo[8], hi[8]; // weights 4i..4i+3 of blocks 2p and 2p + 1
#pragma unroll
            for (int i = 0; i < 8; i++) {
                unsigned wq = word_of(qv[i / 4], i % 4);
                lo[i] = (int)(wq & 0x0F0F0F0Fu), hi[i] = (int)((wq >> 4) & 0x0F0F0F0Fu);
                if (five) { // bit j of each qh byte: block j's fifth bits
                    unsigned wh = word_of(hv[i / 4], i % 4);
                    lo[i] |= (int)(((wh >> (2 * p)) & 0x01010101u) << 4);
                    hi[i] |= (int)(((wh >> (2 * p + 1)) & 0x01010101u) << 4);
                }
            }
#pragma unroll
            for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
                if (t >= n) break;
                const int8_t *xq = x.q + (size_t)t * cols + 64 * P;
                uint4 x0[2] = {((const uint4 *)xq)[0], ((const uint4 *)xq)[1]};
                uint4 x1[2] = {((const uint4 *)(xq + 32))[0], ((const uint4 *)(xq + 32))[1]};
                int s0 = 0, s1 = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    s0 = __dp4a(lo[i], (int)word_of(x0[i / 4], i % 4), s0);
                    s1 = __dp4a(hi[i], (int)word_of(x1[i / 4], i % 4), s1);
                }
                size_t k = (size_t)t * nb + 2 * P;
                float v = acc[r][t];
                v = fmaf((float)s0, a[0] * x.d[k], v), v = fmaf(m[0], x.s[k], v);
                v = fmaf((float)s1, a[1] * x.d[k + 1], v), v = fmaf(m[1], x.s[k + 1], v);
                acc[r][t] = v;
            }
        }
    }
}

#endif
