// GGUF weight blocks read on the device: any 32 weights of a row of a kept
// block type (or of bf16) unpacked into registers as floats, by the
// formats' definition (kernels/cpu/quant_formats.c: w[i] = a[i / 16] q[i]
// - m[i / 16], the same f32 products), so the block GEMVs need no copy of
// the weights in another type. Rows are the file's row-major blocks
// (cuda_wmat, ops.h); block scales are little-endian f16 at any byte
// offset, so they are read a byte at a time, as are the quants of the
// types whose blocks are not 16-byte multiples (Q4_K and Q5_K's are).
#ifndef POLAR_CUDA_BLOCKS_CUH
#define POLAR_CUDA_BLOCKS_CUH

#include "../cpu/quant.h"
#include "common.cuh"

// IQ4_NL's and IQ4_XS's 16 levels (cpu_iq4_levels), where device code can read them.
static __device__ const int8_t iq4_levels_dev[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                     1,    13,   25,  38,  53,  69,  89,  113};

// An IEEE half's 16 bits as f32, exactly.
static __device__ __forceinline__ float f16_bits(unsigned h) {
    unsigned e = (h >> 10) & 31u, m = h & 1023u;
    float v = e == 0 ? (float)m * 5.9604644775390625e-8f // subnormal: m * 2^-24
              : e == 31 ? __uint_as_float(0x7f800000u | m << 13)
                        : __uint_as_float((e + 112u) << 23 | m << 13);
    return h & 0x8000u ? -v : v;
}

// An IEEE half at p (little-endian, any alignment) as f32, exactly.
static __device__ __forceinline__ float f16_at(const uint8_t *p) { return f16_bits((unsigned)p[0] | (unsigned)p[1] << 8); }

// Byte i (0..15, a constant once unrolled) of a 16-byte vector.
static __device__ __forceinline__ unsigned byte_of(uint4 v, int i) {
    unsigned word = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
    return (word >> (8 * (i % 4))) & 0xFFu;
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min from a block's first 16
// bytes (d, dmin, then the 12 packed scale bytes).
static __device__ __forceinline__ void k4_scale_min(uint4 head, int j, int *sc, int *mn) {
#define S(i) (int)byte_of(head, 4 + (i))
    if (j < 4) {
        *sc = S(j) & 63, *mn = S(j + 4) & 63;
    } else {
        *sc = (S(j + 4) & 0xF) | (S(j - 4) >> 6) << 4;
        *mn = (S(j + 4) >> 4) | (S(j) >> 6) << 4;
    }
#undef S
}

// A Q4_K / Q5_K block's first 16 bytes: d, dmin and the scales in one
// load (blocks of 144 or 176 bytes in rows of whole blocks from a
// cudaMalloc'd base stay 16-byte aligned).
static __device__ __forceinline__ bool is_k4(int t) { return t == CPU_W_Q4_K || t == CPU_W_Q5_K; }
static __device__ __forceinline__ const uint8_t *k4_block(int t, const uint8_t *row, int i) {
    return row + cpu_kept_block_bytes((cpu_wtype)t) * i;
}

// w[0..31] = weights 32k..32k+31 of a row of type t (CPU_W_BF16 or a
// row-major kept type; the caller's launch is uniform in t per warp).
static __device__ __forceinline__ void unit_weights(int t, const uint8_t *row, int k, float w[32]) {
    if (t == CPU_W_BF16) {
        const uint16_t *r = (const uint16_t *)row + 32 * k;
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = bf(r[i]);
        return;
    }
    if (t == CPU_W_Q8_0) {
        const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)t) * k;
        float d = f16_at(b);
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = d * (float)(int8_t)b[2 + i];
        return;
    }
    if (t == CPU_W_Q4_0 || t == CPU_W_Q4_1 || t == CPU_W_Q5_0 || t == CPU_W_Q5_1 || t == CPU_W_IQ4_NL) {
        const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)t) * k;
        float d = f16_at(b), m = t == CPU_W_Q4_1 || t == CPU_W_Q5_1 ? -f16_at(b + 2) : 0.0f;
        if (t == CPU_W_IQ4_NL) {
#pragma unroll
            for (int i = 0; i < 16; i++)
                w[i] = d * (float)iq4_levels_dev[b[2 + i] & 0xF], w[i + 16] = d * (float)iq4_levels_dev[b[2 + i] >> 4];
            return;
        }
        int five = t == CPU_W_Q5_0 || t == CPU_W_Q5_1, off = t == CPU_W_Q4_0 ? 8 : t == CPU_W_Q5_0 ? 16 : 0;
        const uint8_t *h = b + (t == CPU_W_Q5_0 ? 2 : 4), *qs = b + (t == CPU_W_Q4_0 ? 2 : t == CPU_W_Q4_1 ? 4 : t == CPU_W_Q5_0 ? 6 : 8);
        uint32_t qh = five ? (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24 : 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int lo = (int)((qs[i] & 0xF) | ((qh >> i) & 1) << 4) - off;
            int hi = (int)((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - off;
            w[i] = d * (float)lo - m, w[i + 16] = d * (float)hi - m;
        }
        return;
    }
    int j = k % 8; // the 256-block, then its sub-block j
    if (is_k4(t)) {
        const uint8_t *b = k4_block(t, row, k / 8);
        uint4 head = *(const uint4 *)b;
        int sc, mn;
        k4_scale_min(head, j, &sc, &mn);
        float a = f16_bits(head.x & 0xffffu) * (float)sc, m = f16_bits(head.x >> 16) * (float)mn;
        // the 32 bytes of nibbles (and Q5_K's 32 of fifth bits) in 16-byte loads, not 32 byte loads
        const uint4 *qs = (const uint4 *)(b + (t == CPU_W_Q4_K ? 16 : 48) + 32 * (j / 2)), *qh = (const uint4 *)(b + 16);
        uint4 q[2] = {qs[0], qs[1]}, h[2] = {};
        if (t == CPU_W_Q5_K) h[0] = qh[0], h[1] = qh[1];
#pragma unroll
        for (int i = 0; i < 32; i++) {
            int v = (byte_of(q[i / 16], i % 16) >> (4 * (j % 2))) & 0xF;
            if (t == CPU_W_Q5_K) v |= ((byte_of(h[i / 16], i % 16) >> j) & 1) << 4;
            w[i] = a * (float)v - m;
        }
        return;
    }
    if (t == CPU_W_Q6_K) {
        const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)t) * (k / 8);
        int h = j / 4, part = j % 4;
        const uint8_t *ql = b + 64 * h + (part & 1) * 32, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * part;
        float d = f16_at(b + 208), a0 = d * (float)sc[0], a1 = d * (float)sc[1];
#pragma unroll
        for (int i = 0; i < 32; i++) {
            int low = part < 2 ? ql[i] & 0xF : ql[i] >> 4;
            w[i] = (i < 16 ? a0 : a1) * (float)((low | ((qh[i] >> (2 * part)) & 3) << 4) - 32);
        }
        return;
    }
    // IQ4_XS: d, the scales' high bits (2 bytes), their low nibbles (4), 8 x 16 bytes of codes
    const uint8_t *b = row + cpu_kept_block_bytes((cpu_wtype)t) * (k / 8);
    int low = (b[4 + j / 2] >> (4 * (j % 2))) & 0xF, high = (((unsigned)b[2] | (unsigned)b[3] << 8) >> (2 * j)) & 3;
    float a = f16_at(b) * (float)((low | high << 4) - 32);
    const uint8_t *qs = b + 8 + 16 * j;
#pragma unroll
    for (int i = 0; i < 16; i++)
        w[i] = a * (float)iq4_levels_dev[qs[i] & 0xF], w[i + 16] = a * (float)iq4_levels_dev[qs[i] >> 4];
}

#endif
