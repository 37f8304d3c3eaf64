/* AVX-512 VNNI block dot products for the kept block types against int8
 * activation blocks (quant.h). Compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx512vnni (and avx2, fma, f16c); called only on CPUs that
 * report all of them.
 *
 * Two 32-blocks fill one 512-bit register, and vpdpbusd multiplies
 * unsigned weight bytes by signed activations and adds each group of four
 * products into an int32 lane in one instruction (AVX2 needs maddubs and
 * madd for half the bytes). Weights therefore stay unsigned: the types
 * without an offset (raw bytes less a zero point z, quant_x86.h) start
 * each lane at -z * sum(x), itself one vpdpbusd per token, and Q8_0's
 * signed bytes become unsigned by adding 128 (z = 128). Every integer sum
 * is exact; lane i of a pair holds bytes 4i..4i+3, so lanes 0-3, 4-7, 8-11
 * and 12-15 are the halves of the two blocks, each scaled by its own pair
 * of block scales.
 *
 * As in quant_avx2.c one tile routine computes R rows x C tokens with the
 * same operations per (row, token) whatever the shape, so the dot product
 * and the matmul (quant_tiles.h, 4 rows x 4 tokens here) agree bit for
 * bit. */
#include "quant_x86.h"

/* The bytes vpdpbusd multiplies (unsigned) and the zero point it removes. */
INLINE __m256i vnni_bytes(cpu_wtype t, __m256i raw) {
    return cpu_kept_signed_bytes(t) ? _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80)) : raw;
}
INLINE int vnni_zero(cpu_wtype t) { return cpu_kept_signed_bytes(t) ? 128 : zero_point(t); }

/* {a, b, c, e} -> each repeated over 4 lanes: the four half-block scales
 * of a pair of blocks, in the lanes of their products. */
INLINE __m512 quarters(float a, float b, float c, float e) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_setr_ps(a, b, c, e)));
}

/* {a, a, b, b} as quarters gives them: the scales of the types whose
 * halves share one. */
INLINE __m512 halves(float a, float b) { return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b)); }

INLINE __m512i pair_bytes(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

#define PREFETCH_TILES 2

typedef struct {
    __m512 acc[4][4]; /* [row][token]: 16 lanes of scaled block sums */
    __m256 off[4];    /* [row], lane c + 4h: m * s of token c's block h of each pair (offset types) */
} tile_acc;

/* Blocks k and k + 1 of R rows as vpdpbusd takes them (k alone when the
 * row has no k + 1: zero bytes, scale 0). */
typedef struct {
    __m512i u[4]; /* unsigned bytes of the two blocks */
    __m512 ws[4]; /* their half-block scales in the lanes of the products */
    float m[4][2];
} pair_rows;

/* The quarter scales {k half 0, k half 1, k+1 half 0, k+1 half 1}. */
INLINE __m512 pair_scales(cpu_wtype t, const float d[4]) {
    return t == CPU_W_Q6_K ? quarters(d[0], d[1], d[2], d[3]) : halves(d[0], d[2]);
}

/* Blocks k and k + 1 (when two) of R rows, straight from the weights. */
INLINE void unpack_pair(cpu_wtype t, int R, const uint8_t *w, size_t row_bytes, int k, int two, size_t ahead,
                        size_t step, pair_rows *p) {
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + (size_t)r * row_bytes;
        /* R interleaved rows defeat the hardware's stream prefetch: ask
         * for the same bytes PREFETCH_TILES tiles ahead */
        _mm_prefetch((const char *)wr + (size_t)k * step + ahead, _MM_HINT_T0);
        rawblock b0 = unpack_raw(t, wr, k), b1 = {_mm256_setzero_si256(), {0.0f, 0.0f}, 0.0f};
        if (two) b1 = unpack_raw(t, wr, k + 1);
        p->u[r] = pair_bytes(vnni_bytes(t, b0.raw), two ? vnni_bytes(t, b1.raw) : _mm256_setzero_si256());
        const float d[4] = {b0.d[0], b0.d[1], b1.d[0], b1.d[1]};
        p->ws[r] = pair_scales(t, d);
        p->m[r][0] = b0.m, p->m[r][1] = b1.m;
    }
}

/* R rows of up to PREPARED_PAIRS pairs of blocks (8192 weights), unpacked
 * once for every token tile of their row group (quant_tiles.h): about 44 KB
 * on the stack of the matmul's thread. */
#define PREPARED_PAIRS 128
typedef struct {
    uint8_t u[4][PREPARED_PAIRS][64];
    float d[4][PREPARED_PAIRS][4], m[4][PREPARED_PAIRS][2];
} prepared_rows;
#define PREPARED_ROWS prepared_rows

/* Blocks k and k + 1 of the prepared rows: the same values unpack_pair
 * gives, so the same bits downstream. */
INLINE void load_pair(cpu_wtype t, int R, const prepared_rows *pr, int k, pair_rows *p) {
    for (int r = 0; r < R; r++) {
        p->u[r] = _mm512_loadu_si512(pr->u[r][k / 2]);
        p->ws[r] = pair_scales(t, pr->d[r][k / 2]);
        p->m[r][0] = pr->m[r][k / 2][0], p->m[r][1] = pr->m[r][k / 2][1];
    }
}

INLINE int prepare_rows(cpu_wtype t, int R, const uint8_t *w, size_t row_bytes, int nb, prepared_rows *pr) {
    if ((nb + 1) / 2 > PREPARED_PAIRS) return 0;
    const size_t ahead = PREFETCH_TILES * (size_t)R * row_bytes, step = row_bytes / (size_t)nb;
    for (int k = 0; k < nb; k += 2) {
        int two = k + 1 < nb;
        for (int r = 0; r < R; r++) {
            const uint8_t *wr = w + (size_t)r * row_bytes;
            _mm_prefetch((const char *)wr + (size_t)k * step + ahead, _MM_HINT_T0); /* as in unpack_pair */
            rawblock b0 = unpack_raw(t, wr, k), b1 = {_mm256_setzero_si256(), {0.0f, 0.0f}, 0.0f};
            if (two) b1 = unpack_raw(t, wr, k + 1);
            _mm512_storeu_si512(pr->u[r][k / 2],
                                pair_bytes(vnni_bytes(t, b0.raw), two ? vnni_bytes(t, b1.raw) : _mm256_setzero_si256()));
            float *d = pr->d[r][k / 2];
            d[0] = b0.d[0], d[1] = b0.d[1], d[2] = b1.d[0], d[3] = b1.d[1];
            pr->m[r][k / 2][0] = b0.m, pr->m[r][k / 2][1] = b1.m;
        }
    }
    return 1;
}

/* A pair of blocks of R rows against C tokens. */
INLINE void pair_step(cpu_wtype t, int R, int C, const pair_rows *p, const cpu_q8_block *x, size_t xs, int k, int two,
                      tile_acc *a) {
    const int z = vnni_zero(t);
    for (int c = 0; c < C; c++) {
        const cpu_q8_block *x0 = &x[(size_t)c * xs + k], *x1 = x0 + 1;
        __m256i lo = _mm256_loadu_si256((const __m256i *)x0->q);
        __m512i xv = two ? pair_bytes(lo, _mm256_loadu_si256((const __m256i *)x1->q)) : _mm512_zextsi256_si512(lo);
        float d1 = two ? x1->d : 0.0f;
        __m512 xd = halves(x0->d, d1);
        __m512i start = _mm512_setzero_si512();
        if (z) start = _mm512_sub_epi32(start, _mm512_dpbusd_epi32(start, _mm512_set1_epi8((char)z), xv));
        for (int r = 0; r < R; r++) {
            __m512 sum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, p->u[r], xv));
            a->acc[r][c] = _mm512_fmadd_ps(sum, _mm512_mul_ps(p->ws[r], xd), a->acc[r][c]);
        }
    }
    if (cpu_kept_has_offset(t)) { /* m * s for all the tile's tokens at once, one multiply and add per lane */
        __m128 s0 = _mm_setr_ps(x[k].s, C > 1 ? x[xs + k].s : 0.0f, C > 2 ? x[2 * xs + k].s : 0.0f,
                                C > 3 ? x[3 * xs + k].s : 0.0f);
        __m128 s1 = two ? _mm_setr_ps(x[k + 1].s, C > 1 ? x[xs + k + 1].s : 0.0f, C > 2 ? x[2 * xs + k + 1].s : 0.0f,
                                      C > 3 ? x[3 * xs + k + 1].s : 0.0f)
                        : _mm_setzero_ps();
        __m256 sv = _mm256_set_m128(s1, s0);
        for (int r = 0; r < R; r++) {
            __m256 mv = _mm256_set_m128(_mm_set1_ps(p->m[r][1]), _mm_set1_ps(p->m[r][0]));
            a->off[r] = _mm256_add_ps(a->off[r], _mm256_mul_ps(mv, sv));
        }
    }
}

/* out[r][c] = dot of R weight rows with token c's nb blocks (tokens xs
 * blocks apart), the rows from w (rows row_bytes apart) or, when
 * prepared, from pr. R, C, t and prepared are constants at each call. */
INLINE void tile_rows(cpu_wtype t, int R, int C, const uint8_t *w, size_t row_bytes, int prepared,
                      const prepared_rows *pr, const cpu_q8_block *x, size_t xs, int nb, float out[4][4]) {
    tile_acc a;
    for (int r = 0; r < R; r++) {
        a.off[r] = _mm256_setzero_ps();
        for (int c = 0; c < C; c++) a.acc[r][c] = _mm512_setzero_ps();
    }
    const size_t ahead = PREFETCH_TILES * (size_t)R * row_bytes, step = nb ? row_bytes / (size_t)nb : 0;
    pair_rows p;
    for (int k = 0; k < nb; k += 2) {
        int two = k + 1 < nb;
        if (prepared) load_pair(t, R, pr, k, &p);
        else if (two) unpack_pair(t, R, w, row_bytes, k, 1, ahead, step, &p);
        else unpack_pair(t, R, w, row_bytes, k, 0, ahead, step, &p);
        if (two) pair_step(t, R, C, &p, x, xs, k, 1, &a);
        else pair_step(t, R, C, &p, x, xs, k, 0, &a);
    }
    for (int r = 0; r < R; r++) {
        float o[8];
        _mm256_storeu_ps(o, a.off[r]);
        for (int c = 0; c < C; c++) out[r][c] = _mm512_reduce_add_ps(a.acc[r][c]) + (o[c] + o[4 + c]);
    }
}

INLINE void tile(cpu_wtype t, int R, int C, const uint8_t *w, size_t row_bytes, const cpu_q8_block *x, size_t xs,
                 int nb, float out[4][4]) {
    tile_rows(t, R, C, w, row_bytes, 0, NULL, x, xs, nb, out);
}

INLINE void tile_prepared(cpu_wtype t, int R, int C, const prepared_rows *pr, const cpu_q8_block *x, size_t xs, int nb,
                          float out[4][4]) {
    tile_rows(t, R, C, NULL, 0, 1, pr, x, xs, nb, out);
}

/* ------------------------------------------ the x16 layouts (quant.h) */

/* One 32-block of a group of 16 interleaved rows, as the tile multiplies
 * it: u[j] the unsigned weight bytes of weights 4j..4j+3 in each row's lane
 * (j < 4: the first half of the block, j >= 4 the second), a[h] each row's
 * scale of half h (equal but for Q6_K), m each row's offset (x16_has_offset),
 * z the zero point vpdpbusd's unsigned bytes carry. */
typedef struct {
    __m512i u[8];
    __m512 a[2], m;
    int z;
} x16_block;

INLINE int x16_two_scales(cpu_wtype t) { return t == CPU_W_Q6_K_X16; }
INLINE int x16_wide_tile(cpu_wtype t) { return t == CPU_W_Q5_K_X16; }

INLINE __m512 load_f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* Bits k..k+n-1 of each 32-bit lane of w, moved to bits o..o+n-1 (k >= o). */
INLINE __m512i lane_bits(__m512i w, int k, int n, int o) {
    return _mm512_and_si512(_mm512_srli_epi32(w, k - o), _mm512_set1_epi32(((1 << n) - 1) << o));
}

/* Byte b (0..15) of each lane's bytes (the lanes' 4-byte words w[b / 4]) as a signed int32. */
INLINE __m512i lane_int8(const __m512i *w, int b) {
    return _mm512_srai_epi32(_mm512_slli_epi32(w[b / 4], 24 - 8 * (b % 4)), 24);
}

/* 32-block k of the group starting at g (units of ub bytes). */
INLINE void x16_load(cpu_wtype t, const uint8_t *g, int k, x16_block *o) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const size_t ub = x16_unit_bytes(t);
    const uint8_t *b = g + (size_t)(x16_is_k(t) ? k / 8 : k) * ub;
    if (!x16_is_k(t) || k % 8 == 0)
        for (size_t line = 0; line < ub; line += 64)
            _mm_prefetch((const char *)b + x16_prefetch_units(x16_is_k(t)) * ub + line, _MM_HINT_T0);
    o->m = _mm512_setzero_ps();
    o->z = 0;
    switch (t) {
    case CPU_W_Q8_0_X16:
        for (int j = 0; j < 8; j++) o->u[j] = _mm512_xor_si512(_mm512_loadu_si512(b + 64 * j), _mm512_set1_epi8((char)0x80));
        o->a[0] = o->a[1] = load_f16x16(b + 512);
        o->z = 128;
        return;
    case CPU_W_Q4_0_X16:
    case CPU_W_Q4_1_X16:
        for (int j = 0; j < 4; j++) { /* low nibbles: weights 4j.., high: 16+4j.. */
            __m512i p = _mm512_loadu_si512(b + 64 * j);
            o->u[j] = _mm512_and_si512(p, low4);
            o->u[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
        }
        o->a[0] = o->a[1] = load_f16x16(b + 256);
        if (t == CPU_W_Q4_1_X16) o->m = load_f16x16(b + 288);
        else o->z = 8;
        return;
    case CPU_W_Q5_0_X16:
    case CPU_W_Q5_1_X16: { /* Q4_0's nibbles, each lane's fifth bits from its qh word (x16_q5_byte) */
        const __m512i qh = _mm512_loadu_si512(b + 256), fifth = _mm512_set1_epi8(0x10);
        const __m512i lane_bytes = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0); /* the lane's first byte */
        for (int v = 0; v < 8; v++) {
            __m512i p = _mm512_loadu_si512(b + 64 * (v % 4));
            __m512i q = _mm512_and_si512(v < 4 ? p : _mm512_srli_epi16(p, 4), low4);
            __m512i idx = _mm512_add_epi32(lane_bytes, _mm512_set1_epi32(x16_q5_byte(v) * 0x01010101));
            __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, idx), _mm512_set1_epi32((int)x16_q5_mask(v)));
            o->u[v] = _mm512_or_si512(q, _mm512_maskz_mov_epi8(set, fifth));
        }
        o->a[0] = o->a[1] = load_f16x16(b + 320);
        if (t == CPU_W_Q5_1_X16) o->m = load_f16x16(b + 352);
        else o->z = 16;
        return;
    }
    case CPU_W_IQ4_NL_X16:
    case CPU_W_IQ4_XS_X16: { /* each code's level, offset by 128 as Q8_0's bytes */
        const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cpu_iq4_levels));
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        int j = k % 8;
        const uint8_t *codes = b + (t == CPU_W_IQ4_XS_X16 ? 256 * j : 0);
        for (int q = 0; q < 4; q++) { /* as Q4_0's nibbles */
            __m512i p = _mm512_loadu_si512(codes + 64 * q);
            o->u[q] = _mm512_xor_si512(_mm512_shuffle_epi8(table, _mm512_and_si512(p, low4)), bias);
            o->u[q + 4] = _mm512_xor_si512(_mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(p, 4), low4)), bias);
        }
        o->z = 128;
        if (t == CPU_W_IQ4_NL_X16) {
            o->a[0] = o->a[1] = load_f16x16(b + 256);
            return;
        }
        /* cpu_iq4xs_scale, a lane at a time; d * scale as quant_x86.h */
        __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + 2080)));
        __m512i low = _mm512_and_si512(_mm512_srl_epi32(_mm512_loadu_si512(b + 2112), _mm_cvtsi32_si128(4 * j)),
                                       _mm512_set1_epi32(0xF));
        high = _mm512_and_si512(_mm512_srl_epi32(high, _mm_cvtsi32_si128(2 * j)), _mm512_set1_epi32(3));
        __m512i sc = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), _mm512_set1_epi32(32));
        o->a[0] = o->a[1] = _mm512_mul_ps(load_f16x16(b + 2048), _mm512_cvtepi32_ps(sc));
        return;
    }
    case CPU_W_Q4_K_X16:
    case CPU_W_Q5_K_X16: {
        int j = k % 8, shift = 4 * (j % 2);
        for (int v = 0; v < 8; v++) /* the block pair's qs: low nibbles the even block, high the odd */
            o->u[v] = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(b + 512 * (j / 2) + 64 * v), shift), low4);
        for (int v = 0; v < 8 && t == CPU_W_Q5_K_X16; v++) { /* Q5_K: bit j of each qh byte is the fifth: to bit 4 */
            __m512i qh = _mm512_loadu_si512(b + 2304 + 64 * v);
            qh = j == 4 ? qh : j < 4 ? _mm512_slli_epi16(qh, 4 - j) : _mm512_srli_epi16(qh, j - 4);
            o->u[v] = _mm512_or_si512(o->u[v], _mm512_and_si512(qh, _mm512_set1_epi8(0x10)));
        }
        __m512i s[3];
        for (int i = 0; i < 3; i++) s[i] = _mm512_loadu_si512(b + 2112 + 64 * i);
        /* cpu_k4_scale_min, a lane at a time: each 4- or 6-bit piece by one shift and one mask */
        __m512i sc, mn;
        if (j < 4) { /* bytes j and j + 4, low six bits */
            sc = lane_bits(s[0], 8 * j, 6, 0);
            mn = lane_bits(s[1], 8 * j, 6, 0);
        } else { /* byte j + 4's nibbles, the top two bits of bytes j - 4 (scale) and j (min) above them */
            int sh = 8 * (j - 4);
            sc = _mm512_or_si512(lane_bits(s[2], sh, 4, 0), lane_bits(s[0], sh + 6, 2, 4));
            mn = _mm512_or_si512(lane_bits(s[2], sh + 4, 4, 0), lane_bits(s[1], sh + 6, 2, 4));
        }
        /* as quant_x86.h: d * sc, and the offset -dmin * mn */
        o->a[0] = o->a[1] = _mm512_mul_ps(load_f16x16(b + 2048), _mm512_cvtepi32_ps(sc));
        __m512 neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(load_f16x16(b + 2080)),
                                                               _mm512_set1_epi32((int)0x80000000u)));
        o->m = _mm512_mul_ps(neg_dmin, _mm512_cvtepi32_ps(mn));
        return;
    }
    default: { /* Q6_K */
        int j = k % 8;
        const uint8_t *n = b + 384 * j;
        __m512i h0 = _mm512_loadu_si512(n + 256), h1 = _mm512_loadu_si512(n + 320), high = _mm512_set1_epi8(0x30);
        for (int q = 0; q < 4; q++) { /* bits 2q, 2q + 1 of h0/h1's bytes to bits 4, 5: one shift, one mask */
            __m512i p = _mm512_loadu_si512(n + 64 * q);
            __m512i hi0 = q == 2 ? h0 : q < 2 ? _mm512_slli_epi16(h0, 4 - 2 * q) : _mm512_srli_epi16(h0, 2);
            __m512i hi1 = q == 2 ? h1 : q < 2 ? _mm512_slli_epi16(h1, 4 - 2 * q) : _mm512_srli_epi16(h1, 2);
            o->u[q] = _mm512_or_si512(_mm512_and_si512(p, low4), _mm512_and_si512(hi0, high));
            o->u[q + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p, 4), low4), _mm512_and_si512(hi1, high));
        }
        __m512i s[4];
        for (int i = 0; i < 4; i++) s[i] = _mm512_loadu_si512(b + 3072 + 64 * i);
        __m512 d = load_f16x16(b + 3328);
        for (int h = 0; h < 2; h++) { /* int8 scales 2j and 2j + 1, sign-extended; d * sc as quant_x86.h */
            __m512i sc = lane_int8(s, 2 * j + h);
            o->a[h] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
        }
        o->z = 32;
        return;
    }
    }
}

/* C tokens against one group of 16 interleaved rows (its blocks from g):
 * f[c] lane r = the dot of row r with token c. Per (row, token) and block:
 * the exact integer sum of each half (lanes are rows, so vpdpbusd needs no
 * horizontal sum; each half starts at -z * its sum of x), times the half's
 * scale times d_x by one FMA (the halves added first when their scales are
 * one), then m * s by another for the offset types, block after block: the
 * same operations whatever C, so decode and batches agree bit for bit. */
INLINE void x16_tile(cpu_wtype t, int C, const uint8_t *g, int nb, const cpu_q8_block *x, size_t xs, __m512 f[16]) {
    for (int c = 0; c < C; c++) f[c] = _mm512_setzero_ps();
    for (int k = 0; k < nb; k++) {
        x16_block w;
        x16_load(t, g, k, &w);
        for (int c = 0; c < C; c++) {
            const cpu_q8_block *xb = &x[(size_t)c * xs + k];
            /* a chain per half: x bytes 4j..4j+3 go with u[j] */
            __m512i a0 = _mm512_set1_epi32(-w.z * xb->half_sum[0]), a1 = _mm512_set1_epi32(-w.z * xb->half_sum[1]);
            for (int j = 0; j < 4; j++) {
                a0 = _mm512_dpbusd_epi32(a0, w.u[j], _mm512_set1_epi32(x_word(xb, j)));
                a1 = _mm512_dpbusd_epi32(a1, w.u[j + 4], _mm512_set1_epi32(x_word(xb, j + 4)));
            }
            __m512 xd = _mm512_set1_ps(xb->d);
            if (x16_two_scales(t)) {
                f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(w.a[0], xd), f[c]);
                f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(w.a[1], xd), f[c]);
            } else {
                f[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), _mm512_mul_ps(w.a[0], xd), f[c]);
            }
            if (x16_has_offset(t)) f[c] = _mm512_fmadd_ps(w.m, _mm512_set1_ps(xb->s), f[c]);
        }
    }
}

/* Rows r0..r1-1 (r0 a multiple of 16, as the threads' row blocks are) of
 * an x16 matrix for every token, 8, 4, 2 or 1 tokens a tile. */
INLINE void rows_x16(cpu_wtype t, float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,
                     int T, int rows, int nb, int accumulate, int r0, int r1) {
    for (int r = r0; r < r1; r += 16) {
        const uint8_t *g = (const uint8_t *)w + (size_t)r * row_bytes;
        __mmask16 valid = (__mmask16)(r1 - r >= 16 ? 0xFFFF : (1u << (r1 - r)) - 1);
        __m512 b = bias ? _mm512_castsi512_ps(_mm512_slli_epi32(
                              _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, bias + r)), 16))
                        : _mm512_setzero_ps();
        for (int c = 0; c < T;) {
            __m512 f[16];
            int n = T - c >= 16 && x16_wide_tile(t) ? 16 : T - c >= 8 ? 8 : T - c >= 4 ? 4 : T - c >= 2 ? 2 : 1;
            const cpu_q8_block *xc = xq + (size_t)c * nb;
            switch (n) { /* constant tile widths, unrolled */
            case 16: x16_tile(t, 16, g, nb, xc, nb, f); break;
            case 8: x16_tile(t, 8, g, nb, xc, nb, f); break;
            case 4: x16_tile(t, 4, g, nb, xc, nb, f); break;
            case 2: x16_tile(t, 2, g, nb, xc, nb, f); break;
            default: x16_tile(t, 1, g, nb, xc, nb, f); break;
            }
            for (int j = 0; j < n; j++) { /* as row_group stores: acc ? dst + (out + b) : out + b */
                float *dst = y + (size_t)(c + j) * rows + r;
                __m512 v = _mm512_add_ps(f[j], b);
                if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(valid, dst), v);
                _mm512_mask_storeu_ps(dst, valid, v);
            }
            c += n;
        }
    }
}

X16_ROWS_FUNCTIONS /* quant_x86.h: rows_q8_0_x16 .. rows_q5_1_x16 and LEVEL_EXTRA_ROWS */

#define BATCH_ROWS 4
#define QUANT_LEVEL avx512vnni
#include "quant_tiles.h"
