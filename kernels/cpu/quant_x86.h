/* The kept block types (quant.h) unpacked 32 weights at a time into
 * 256-bit vectors: shared by the AVX2 and AVX-512 VNNI levels (each
 * includes it once, compiled with its own flags; both have avx2 and f16c).
 *
 * A block comes out as raw bytes and a zero point z, the weights being
 * w[i] = d[i / 16] * (raw[i] - z) + m: raw is unsigned (0..15, 0..31 or
 * 0..63) for every type but Q8_0 and IQ4, whose raw bytes are the signed
 * weights themselves (z 0; IQ4's looked up from their codes). The AVX2
 * level subtracts z to get signed weights; the VNNI level keeps raw
 * unsigned and subtracts z * sum(x) instead. */
#ifndef POLAR_CPU_QUANT_X86_H
#define POLAR_CPU_QUANT_X86_H

#include <immintrin.h>

#include "quant.h"

#define INLINE static inline __attribute__((always_inline))

INLINE float load_f16(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* 16 bytes of nibbles -> 32 bytes 0..15 in element order (low nibbles are
 * elements 0..15, high nibbles 16..31). */
INLINE __m256i nibbles(const uint8_t *p) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* IQ4: 32 codes (bytes 0..15) -> the signed levels they pick. */
INLINE __m256i iq4_level_of(__m256i codes) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cpu_iq4_levels));
    return _mm256_shuffle_epi8(table, codes);
}

/* IQ4: 16 bytes of codes -> the 32 signed levels they pick, in element order. */
INLINE __m256i iq4_levels(const uint8_t *p) { return iq4_level_of(nibbles(p)); }

/* 32 bits -> 32 bytes, 0x10 where the bit is set (the fifth bit of
 * Q5_0 / Q5_1 weights; bit i is element i). */
INLINE __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick), mask);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, mask), _mm256_set1_epi8(0x10));
}

/* Activation bytes 4j..4j+3 of block xb as one word, read where they lie:
 * inside a set1 the compiler makes it one broadcast load, where a copy of
 * the block into an int array became a scalar load, shift and move to the
 * vector unit per word (the batch tiles ran 20-30% slower). */
INLINE int32_t x_word(const cpu_q8_block *xb, int j) {
    typedef int32_t __attribute__((may_alias, aligned(1))) word;
    return ((const word *)xb->q)[j];
}

/* How many units ahead the x16 tiles prefetch. The 32-block units of Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL (5-9 KB) go 16 ahead: a batch tile
 * spends long enough on each unit that 4 ahead arrived late (batch 8 decode
 * 10-13% slower), while a decode tile does not care. The 256-block units
 * (k-quants, IQ4_XS) go 2 ahead, fetched at the first 32-block of each. */
INLINE size_t x16_prefetch_units(int is_k) { return is_k ? 2 : 16; }

/* Bytes of one x16 unit of 16 rows (a 32-block, or a 256-block of the
 * k-quants and IQ4_XS), and whether its units are 256-blocks. */
INLINE size_t x16_unit_bytes(cpu_wtype t) { /* a switch, so that it folds at each call (as cpu_kept_block_bytes) */
    switch (t) {
    case CPU_W_Q8_0_X16: return 16 * 34;
    case CPU_W_Q4_0_X16:
    case CPU_W_IQ4_NL_X16: return 16 * 18;
    case CPU_W_Q4_1_X16: return 16 * 20;
    case CPU_W_Q5_0_X16: return 16 * 22;
    case CPU_W_Q5_1_X16: return 16 * 24;
    case CPU_W_Q4_K_X16: return 16 * 144;
    case CPU_W_Q5_K_X16: return 16 * 176;
    case CPU_W_IQ4_XS_X16: return 16 * 136;
    default: return 16 * 210; /* Q6_K */
    }
}
INLINE int x16_is_k(cpu_wtype t) {
    return t == CPU_W_Q4_K_X16 || t == CPU_W_Q5_K_X16 || t == CPU_W_Q6_K_X16 || t == CPU_W_IQ4_XS_X16;
}

/* The x16 types whose weights carry an offset m (w = a q + m). */
INLINE int x16_has_offset(cpu_wtype t) {
    return t == CPU_W_Q4_1_X16 || t == CPU_W_Q5_1_X16 || t == CPU_W_Q4_K_X16 || t == CPU_W_Q5_K_X16;
}

/* The fifth bits of a Q5_0 / Q5_1 x16 block as 0x10 bytes, for the weights
 * of nibble vector v (< 4: weights 4v..4v+3 of each lane's row, else
 * 16+4(v-4)..): bit k of a lane's qh word is weight k's. The lane's qh byte
 * holding the four bits, x16_q5_byte(v), is copied into each of its bytes
 * (a byte shuffle), and byte b keeps bit b of the nibble (x16_q5_mask). */
INLINE int x16_q5_byte(int v) { return v < 4 ? v / 2 : 2 + (v - 4) / 2; }
INLINE uint32_t x16_q5_mask(int v) { return 0x08040201u << (4 * (v % 2)); }

/* The x16 types whose unpacked weights are signed bytes (Q8_0's, IQ4's
 * levels): the AVX2 tile (avx2vnni's too) moves their signs onto x, the
 * AVX-512 VNNI one offsets them by 128. */
INLINE int x16_signed(cpu_wtype t) {
    return t == CPU_W_Q8_0_X16 || t == CPU_W_IQ4_NL_X16 || t == CPU_W_IQ4_XS_X16;
}

/* The zero point of the types without an offset (Q8_0's raw bytes are
 * already signed); 0 for the offset types. */
INLINE int zero_point(cpu_wtype t) {
    switch (t) {
    case CPU_W_Q4_0: return 8;
    case CPU_W_Q5_0: return 16;
    case CPU_W_Q6_K: return 32;
    default: return 0;
    }
}

/* A 32-weight block: raw bytes, the scales of its two halves (equal but
 * for Q6_K) and the offset m (0 for the types without one). */
typedef struct {
    __m256i raw;
    float d[2], m;
} rawblock;

/* Block k (32 weights) of a row, as quant_formats.c defines it. */
INLINE rawblock unpack_raw(cpu_wtype t, const uint8_t *row, int k) {
    rawblock o;
    o.m = 0.0f;
    if (!cpu_kept_is_k(t)) {
        const uint8_t *b = row + (size_t)k * cpu_kept_block_bytes(t);
        o.d[0] = o.d[1] = load_f16(b);
        switch (t) {
        case CPU_W_Q8_0: o.raw = _mm256_loadu_si256((const __m256i *)(b + 2)); break;
        case CPU_W_Q4_0: o.raw = nibbles(b + 2); break;
        case CPU_W_Q5_0: o.raw = _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)); break;
        case CPU_W_Q4_1: o.raw = nibbles(b + 4), o.m = load_f16(b + 2); break;
        case CPU_W_IQ4_NL: o.raw = iq4_levels(b + 2); break;
        default: o.raw = _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)), o.m = load_f16(b + 2); break; /* Q5_1 */
        }
        return o;
    }
    const uint8_t *b = row + (size_t)(k / 8) * cpu_kept_block_bytes(t);
    int j = k % 8;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    if (t == CPU_W_Q6_K) { /* ql 128, qh 64, 16 int8 scales, d */
        int h = j / 4, part = j % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + (part & 1) * 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i lo = _mm256_and_si256(part < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
        __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * part), _mm256_set1_epi8(3)), 4);
        o.raw = _mm256_or_si256(lo, hi);
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * part;
        float d = load_f16(b + 208);
        o.d[0] = d * (float)sc[0], o.d[1] = d * (float)sc[1];
        return o;
    }
    if (t == CPU_W_IQ4_XS) { /* d, scales' high bits, their low nibbles, 8 x 16 bytes of codes */
        o.d[0] = o.d[1] = load_f16(b) * (float)cpu_iq4xs_scale(b, j);
        o.raw = iq4_levels(b + 8 + 16 * j);
        return o;
    }
    /* Q4_K / Q5_K: d, dmin, 12 scale bytes, [qh 32,] qs 128 */
    int sc, mn;
    cpu_k4_scale_min(b + 4, j, &sc, &mn);
    o.d[0] = o.d[1] = load_f16(b) * (float)sc;
    o.m = -load_f16(b + 2) * (float)mn;
    __m256i qs = _mm256_loadu_si256((const __m256i *)(b + (t == CPU_W_Q4_K ? 16 : 48) + 32 * (j / 2)));
    o.raw = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(qs, 4) : qs, low4);
    if (t == CPU_W_Q5_K) {
        const __m256i bit = _mm256_set1_epi8((char)(1 << j));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        o.raw = _mm256_or_si256(o.raw, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    return o;
}

/* A level's row functions of the x16 types over its rows_x16 (the same
 * signature on every x86 level), and their entries of the level's rows
 * table (quant_tiles.h's LEVEL_EXTRA_ROWS): written once, after rows_x16. */
#define X16_FUNCTION(name, type)                                                                                     \
    static void rows_##name(float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,   \
                            int T, int rows, int nb, int accumulate, int r0, int r1) {                              \
        rows_x16(type, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r0, r1);                                 \
    }
#define X16_ROWS_FUNCTIONS                                                                                           \
    X16_FUNCTION(q8_0_x16, CPU_W_Q8_0_X16)                                                                           \
    X16_FUNCTION(q4_0_x16, CPU_W_Q4_0_X16)                                                                           \
    X16_FUNCTION(q4_1_x16, CPU_W_Q4_1_X16)                                                                           \
    X16_FUNCTION(q4_k_x16, CPU_W_Q4_K_X16)                                                                           \
    X16_FUNCTION(q5_k_x16, CPU_W_Q5_K_X16)                                                                           \
    X16_FUNCTION(q6_k_x16, CPU_W_Q6_K_X16)                                                                           \
    X16_FUNCTION(iq4_nl_x16, CPU_W_IQ4_NL_X16)                                                                       \
    X16_FUNCTION(iq4_xs_x16, CPU_W_IQ4_XS_X16)                                                                       \
    X16_FUNCTION(q5_0_x16, CPU_W_Q5_0_X16)                                                                           \
    X16_FUNCTION(q5_1_x16, CPU_W_Q5_1_X16)
#define LEVEL_EXTRA_ROWS                                                                                             \
    [CPU_W_Q8_0_X16] = rows_q8_0_x16, [CPU_W_Q4_0_X16] = rows_q4_0_x16, [CPU_W_Q4_1_X16] = rows_q4_1_x16,            \
    [CPU_W_Q4_K_X16] = rows_q4_k_x16, [CPU_W_Q5_K_X16] = rows_q5_k_x16, [CPU_W_Q6_K_X16] = rows_q6_k_x16,            \
    [CPU_W_IQ4_NL_X16] = rows_iq4_nl_x16, [CPU_W_IQ4_XS_X16] = rows_iq4_xs_x16,                                      \
    [CPU_W_Q5_0_X16] = rows_q5_0_x16, [CPU_W_Q5_1_X16] = rows_q5_1_x16,

#endif
