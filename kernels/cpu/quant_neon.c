/* NEON block dot products for the kept block types (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) against int8 activation blocks (quant.h),
 * for baseline armv8.0-a: no sdot / i8mm, so products are widened with
 * vmull_s8 / vmlal_s8 to int16 and pairs summed into int32 with vpaddl.
 * Each int16 lane adds two products, |q x| <= 128 * 127, so it stays
 * within 32512; each block's integer sum is exact (as in quant.c) and only
 * the order of the f32 sum over blocks differs from the plain C one.
 *
 * As in quant_avx2.c one tile routine computes R rows x C tokens (a weight
 * block unpacked once for C tokens, an activation block loaded once for R
 * rows) with the same operations per (row, token) in every shape, so the
 * dot product and the matmul (quant_tiles.h) agree bit for bit. */
#include <arm_neon.h>
#include <string.h>

#include "quant.h"

#define INLINE static inline __attribute__((always_inline))

/* A little-endian f16 scale at any byte offset (fcvt: exact). */
INLINE float load_f16(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

/* 16 bytes of nibbles -> weights 0..15 (low nibbles) and 16..31 (high). */
INLINE void nibbles(const uint8_t *p, uint8x16_t q[2]) {
    uint8x16_t raw = vld1q_u8(p);
    q[0] = vandq_u8(raw, vdupq_n_u8(0x0F));
    q[1] = vshrq_n_u8(raw, 4);
}

/* Q5_0 / Q5_1: 32 bits (bit i is weight i's fifth) -> 0x10 in the bytes
 * whose bit is set: each byte of the word spread over 8 lanes, one bit
 * tested per lane. */
INLINE void add_fifth_bits(const uint8_t *p, uint8x16_t q[2]) {
    uint32_t bits;
    memcpy(&bits, p, sizeof bits);
    const uint8x16_t word = vreinterpretq_u8_u32(vdupq_n_u32(bits));
    const uint8x16_t bytes01 = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    const uint8x16_t bytes23 = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t five = vdupq_n_u8(0x10);
    q[0] = vorrq_u8(q[0], vandq_u8(vtstq_u8(vqtbl1q_u8(word, bytes01), bit), five));
    q[1] = vorrq_u8(q[1], vandq_u8(vtstq_u8(vqtbl1q_u8(word, bytes23), bit), five));
}

/* A 32-weight block unpacked: w = d[half] * q + m, q as int8 (weights
 * 0-15, 16-31), d the two halves' scales in the lanes block_sum gives them
 * ({d0, d0, d1, d1}; equal but for Q6_K), m the offset (0 for the types
 * without one). */
typedef struct {
    int8x16_t q[2];
    float32x4_t d;
    float m;
} wblock;

/* Block k (32 weights) of a row, as quant_formats.c defines it. */
INLINE wblock unpack(cpu_wtype t, const uint8_t *row, int k) {
    wblock o;
    o.m = 0.0f;
    uint8x16_t u[2];
    if (!cpu_kept_is_k(t)) {
        const uint8_t *b = row + (size_t)k * cpu_kept_block_bytes(t);
        o.d = vdupq_n_f32(load_f16(b));
        switch (t) {
        case CPU_W_Q8_0:
            o.q[0] = vld1q_s8((const int8_t *)b + 2);
            o.q[1] = vld1q_s8((const int8_t *)b + 18);
            return o;
        case CPU_W_IQ4_NL: {
            const int8x16_t levels = vld1q_s8(cpu_iq4_levels);
            nibbles(b + 2, u);
            for (int h = 0; h < 2; h++) o.q[h] = vqtbl1q_s8(levels, u[h]);
            return o;
        }
        case CPU_W_Q4_0: nibbles(b + 2, u); break;
        case CPU_W_Q4_1: nibbles(b + 4, u), o.m = load_f16(b + 2); break;
        case CPU_W_Q5_0: nibbles(b + 6, u), add_fifth_bits(b + 2, u); break;
        default: nibbles(b + 8, u), add_fifth_bits(b + 4, u), o.m = load_f16(b + 2); break; /* Q5_1 */
        }
        int8x16_t zero = vdupq_n_s8(t == CPU_W_Q4_0 ? 8 : t == CPU_W_Q5_0 ? 16 : 0);
        for (int h = 0; h < 2; h++) o.q[h] = vsubq_s8(vreinterpretq_s8_u8(u[h]), zero);
        return o;
    }
    const uint8_t *b = row + (size_t)(k / 8) * cpu_kept_block_bytes(t);
    int j = k % 8;
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    if (t == CPU_W_Q6_K) { /* ql 128, qh 64, 16 int8 scales, d */
        int h = j / 4, part = j % 4;
        const uint8_t *ql = b + 64 * h + (part & 1) * 32, *qh = b + 128 + 32 * h;
        const int8x16_t qh_shift = vdupq_n_s8((int8_t)(-2 * part)); /* a negative shift shifts right */
        for (int i = 0; i < 2; i++) {
            uint8x16_t l = vld1q_u8(ql + 16 * i);
            uint8x16_t lo = part < 2 ? vandq_u8(l, low4) : vshrq_n_u8(l, 4);
            uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * i), qh_shift), vdupq_n_u8(3)), 4);
            o.q[i] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), vdupq_n_s8(32));
        }
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * part;
        float d = load_f16(b + 208);
        o.d = vcombine_f32(vdup_n_f32(d * (float)sc[0]), vdup_n_f32(d * (float)sc[1]));
        return o;
    }
    if (t == CPU_W_IQ4_XS) { /* d, scales' high bits, their low nibbles, 8 x 16 bytes of codes */
        const int8x16_t levels = vld1q_s8(cpu_iq4_levels);
        o.d = vdupq_n_f32(load_f16(b) * (float)cpu_iq4xs_scale(b, j));
        nibbles(b + 8 + 16 * j, u);
        for (int h = 0; h < 2; h++) o.q[h] = vqtbl1q_s8(levels, u[h]);
        return o;
    }
    /* Q4_K / Q5_K: d, dmin, 12 scale bytes, [qh 32,] qs 128 */
    int sc, mn;
    cpu_k4_scale_min(b + 4, j, &sc, &mn);
    o.d = vdupq_n_f32(load_f16(b) * (float)sc);
    o.m = -load_f16(b + 2) * (float)mn;
    const uint8_t *qs = b + (t == CPU_W_Q4_K ? 16 : 48) + 32 * (j / 2);
    for (int i = 0; i < 2; i++) {
        uint8x16_t v = vld1q_u8(qs + 16 * i);
        u[i] = j % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, low4);
        if (t == CPU_W_Q5_K) {
            uint8x16_t set = vtstq_u8(vld1q_u8(b + 16 + 16 * i), vdupq_n_u8((uint8_t)(1 << j)));
            u[i] = vorrq_u8(u[i], vandq_u8(set, vdupq_n_u8(0x10)));
        }
        o.q[i] = vreinterpretq_s8_u8(u[i]);
    }
    return o;
}

/* The block's 32 products summed to 4 int32 lanes. Q6_K's halves have
 * their own scales: lanes 0-1 sum weights 0-15 and lanes 2-3 weights
 * 16-31, the lanes of wblock.d; the other types mix them (d is one). */
INLINE int32x4_t block_sum(cpu_wtype t, const wblock *w, const int8x16_t x[2]) {
    int16x8_t p[2];
    for (int h = 0; h < 2; h++) p[h] = vmlal_high_s8(vmull_s8(vget_low_s8(w->q[h]), vget_low_s8(x[h])), w->q[h], x[h]);
    if (t == CPU_W_Q6_K) return vpaddq_s32(vpaddlq_s16(p[0]), vpaddlq_s16(p[1]));
    return vpadalq_s16(vpaddlq_s16(p[0]), p[1]);
}

#define PREFETCH_TILES 2

/* out[r][c] = dot of weight row r (rows row_bytes apart) with token c's nb
 * blocks (tokens xs blocks apart). R, C and t are constants at each call. */
INLINE void tile(cpu_wtype t, int R, int C, const uint8_t *w, size_t row_bytes, const cpu_q8_block *x, size_t xs,
                 int nb, float out[4][4]) {
    float32x4_t acc[4][4];
    float off[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = vdupq_n_f32(0.0f), off[r][c] = 0.0f;
    const size_t ahead = PREFETCH_TILES * (size_t)R * row_bytes, step = nb ? row_bytes / (size_t)nb : 0;
    for (int k = 0; k < nb; k++) {
        wblock wb[4];
        for (int r = 0; r < R; r++) {
            const uint8_t *wr = w + (size_t)r * row_bytes;
            /* R interleaved rows look like R streams to the hardware
             * prefetcher: ask for the same bytes PREFETCH_TILES tiles ahead */
            __builtin_prefetch(wr + (size_t)k * step + ahead);
            wb[r] = unpack(t, wr, k);
        }
        for (int c = 0; c < C; c++) {
            const cpu_q8_block *xb = &x[(size_t)c * xs + k];
            const int8x16_t xv[2] = {vld1q_s8(xb->q), vld1q_s8(xb->q + 16)};
            for (int r = 0; r < R; r++) {
                float32x4_t d = vmulq_n_f32(wb[r].d, xb->d);
                acc[r][c] = vfmaq_f32(acc[r][c], vcvtq_f32_s32(block_sum(t, &wb[r], xv)), d);
                if (cpu_kept_has_offset(t)) off[r][c] += wb[r].m * xb->s; /* sum of m * x */
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[r][c] = vaddvq_f32(acc[r][c]) + off[r][c];
}

#define QUANT_LEVEL neon
#include "quant_tiles.h"
