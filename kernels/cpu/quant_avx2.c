/* AVX2 block dot products for the kept block types (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) against int8 activation blocks (quant.h). Compiled with -mavx2 -mfma -mf16c; called
 * only on CPUs that report avx2 and fma. Each block's integer sum is exact
 * (as in quant.c); only the order of the f32 sum over blocks differs.
 *
 * One tile routine computes R rows x C tokens at once: a weight block is
 * unpacked once for C tokens and an activation block loaded once for R
 * rows, and the R*C independent accumulators keep the FMA pipes busy (a
 * single row's dot is one dependent chain). Every tile shape does the same
 * operations per (row, token) in the same order, so the 1x1 dot product
 * and the matmul (quant_tiles.h) agree bit for bit.
 *
 * quant_avx2vnni.c compiles this file again with -mavxvnni and
 * QUANT_AVX_VNNI: the integer sums by vpdpbusd (exact, as here), the
 * tables named for the avx2vnni level, the quantizer left to this one. */
#include "quant_x86.h"

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Signed weights (no offset): their signs move onto x for maddubs. */
INLINE int is_signed(cpu_wtype t) { return !cpu_kept_has_offset(t); }

/* A 32-weight block unpacked for maddubs (w = d[i / 16] * q + m): u holds
 * unsigned bytes (|q| for the signed types, whose signs s are moved onto
 * x), d the scales of the two halves (equal but for Q6_K), m the offset
 * (0 for the signed types). */
typedef struct {
    __m256i u, s;
    float d[2], m;
} wblock;

/* Block k (32 weights) of a row: the raw bytes less their zero point. */
INLINE wblock unpack(cpu_wtype t, const uint8_t *row, int k) {
    rawblock r = unpack_raw(t, row, k);
    wblock o = {.d = {r.d[0], r.d[1]}, .m = r.m};
    __m256i q = zero_point(t) ? _mm256_sub_epi8(r.raw, _mm256_set1_epi8((char)zero_point(t))) : r.raw;
    if (is_signed(t)) {
        o.u = _mm256_sign_epi8(q, q);
        o.s = q;
    } else {
        o.u = o.s = q;
    }
    return o;
}

/* acc + each int32 lane's sum of four products u x (u unsigned, x signed
 * bytes): AVX-VNNI's vpdpbusd, else maddubs + madd, whose pair sums stay
 * within int16 when |u| <= 128 and |x| <= 127. */
INLINE __m256i dot4_add(__m256i acc, __m256i u, __m256i x) {
#ifdef QUANT_AVX_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

/* 8 int32 partial sums of the block's 32 products, as floats: lanes 0-3
 * cover weights 0-15, lanes 4-7 weights 16-31. */
INLINE __m256 block_sum(cpu_wtype t, const wblock *w, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    if (is_signed(t)) x = _mm256_sign_epi8(x, w->s);
    return _mm256_cvtepi32_ps(dot4_add(_mm256_setzero_si256(), w->u, x));
}

#define PREFETCH_TILES 2

/* out[r][c] = dot of weight row r (rows row_bytes apart) with token c's nb
 * blocks (tokens xs blocks apart). R, C and t are constants at each call. */
INLINE void tile(cpu_wtype t, int R, int C, const uint8_t *w, size_t row_bytes, const cpu_q8_block *x, size_t xs,
                 int nb, float out[4][4]) {
    __m256 acc[4][4];
    __m128 off[4]; /* lane c: the sum of m * x over token c's blocks (offset types) */
    for (int r = 0; r < R; r++) {
        off[r] = _mm_setzero_ps();
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    }
    const size_t ahead = PREFETCH_TILES * (size_t)R * row_bytes, step = nb ? row_bytes / (size_t)nb : 0;
    for (int k = 0; k < nb; k++) {
        wblock wb[4];
        for (int r = 0; r < R; r++) {
            const uint8_t *wr = w + (size_t)r * row_bytes;
            /* R interleaved rows defeat the hardware's stream prefetch:
             * ask for the same bytes PREFETCH_TILES tiles ahead */
            _mm_prefetch((const char *)wr + (size_t)k * step + ahead, _MM_HINT_T0);
            wb[r] = unpack(t, wr, k);
        }
        for (int c = 0; c < C; c++) {
            const cpu_q8_block *xb = &x[(size_t)c * xs + k];
            for (int r = 0; r < R; r++) {
                __m256 d = t == CPU_W_Q6_K ? _mm256_set_m128(_mm_set1_ps(wb[r].d[1] * xb->d), _mm_set1_ps(wb[r].d[0] * xb->d))
                                           : _mm256_set1_ps(wb[r].d[0] * xb->d);
                acc[r][c] = _mm256_fmadd_ps(d, block_sum(t, &wb[r], xb->q), acc[r][c]);
            }
        }
        if (!is_signed(t)) { /* m * x for all the tile's tokens at once: one multiply and add per lane, as in C */
            __m128 s = _mm_setr_ps(x[k].s, C > 1 ? x[xs + k].s : 0.0f, C > 2 ? x[2 * xs + k].s : 0.0f,
                                   C > 3 ? x[3 * xs + k].s : 0.0f);
            for (int r = 0; r < R; r++) off[r] = _mm_add_ps(off[r], _mm_mul_ps(_mm_set1_ps(wb[r].m), s));
        }
    }
    for (int r = 0; r < R; r++) {
        float o[4];
        _mm_storeu_ps(o, off[r]);
        for (int c = 0; c < C; c++) out[r][c] = hsum8(acc[r][c]) + o[c];
    }
}

INLINE int hsum_epi32(__m256i v) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    return _mm_cvtsi128_si32(s4);
}

/* cpu_quantize_q8 (quant.c) eight lanes at a time: the same largest
 * magnitude (max is exact in any order), scale, products, rounding to
 * nearest even (cvtps under the default rounding, as lrintf) and integer
 * sum, so the same blocks. */
#ifndef QUANT_AVX_VNNI
void cpu_quantize_q8_avx2(cpu_q8_block *out, const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    const __m256i lim = _mm256_set1_epi32(127), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / CPU_QK; b++, x += CPU_QK) {
        __m256 v[4], amax = zero, bad = zero;
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
            /* x - x is 0 but for inf and NaN */
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v[i], v[i]), zero, _CMP_NEQ_UQ));
        }
        cpu_q8_block *o = &out[b];
        if (_mm256_movemask_ps(bad)) {
            o->d = o->s = __builtin_nanf("");
            o->half_sum[0] = o->half_sum[1] = 0;
            _mm256_storeu_si256((__m256i *)o->q, _mm256_setzero_si256());
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        float d = m / 127.0f, id = m > 0.0f ? 127.0f / m : 0.0f;
        if (id == __builtin_inff()) id = 0.0f;
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
            q[i] = _mm256_max_epi32(_mm256_min_epi32(q[i], lim), _mm256_sub_epi32(_mm256_setzero_si256(), lim));
        }
        /* packs interleave the 128-bit lanes; the permute puts 0..31 back in order */
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)o->q, _mm256_permutevar8x32_epi32(bytes, order));
        o->d = d;
        o->half_sum[0] = (int16_t)hsum_epi32(_mm256_add_epi32(q[0], q[1])); /* elements 0..15 */
        o->half_sum[1] = (int16_t)hsum_epi32(_mm256_add_epi32(q[2], q[3]));
        o->s = d * (float)(o->half_sum[0] + o->half_sum[1]);
    }
}
#endif

/* ------------------------------------------ the x16 layouts (quant.h) */

/* One 32-block of half of a group of 16 interleaved rows (rows 8h..8h+7:
 * bytes 32h.. of each 64-byte vector), as the AVX2 tile multiplies it: u[j]
 * the bytes maddubs takes unsigned (|q| for Q8_0 and IQ4, whose signs s[j]
 * move onto x), a[h] each row's scale of half h of the block (equal but for
 * Q6_K), m each row's offset (x16_has_offset), z the zero point. maddubs' pair
 * sums stay within int16: |q| <= 128 for Q8_0 (127 for IQ4), q <= 63 otherwise. */
typedef struct {
    __m256i u[8], s[8];
    __m256 a[2], m;
    int z;
} x16_half;

INLINE __m256 load_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Bits k..k+n-1 of each 32-bit lane of w, moved to bits o..o+n-1 (k >= o). */
INLINE __m256i lane_bits(__m256i w, int k, int n, int o) {
    return _mm256_and_si256(_mm256_srli_epi32(w, k - o), _mm256_set1_epi32(((1 << n) - 1) << o));
}

/* Q4_K / Q5_K units: 32-block j's 6-bit scale and min (cpu_k4_scale_min)
 * of rows 8h..8h+7, a lane (row) at a time, from the rows' 12 scale bytes
 * (lane r of the three vectors at 2112, bytes 0-3, 4-7, 8-11): each 4- or
 * 6-bit piece by one shift and one mask, already in its final place. */
INLINE void k4_scale_min(const uint8_t *b, int j, int h, __m256i *sc, __m256i *mn) {
    __m256i s[3];
    for (int i = 0; i < 3; i++) s[i] = _mm256_loadu_si256((const __m256i *)(b + 2112 + 64 * i + 32 * h));
    if (j < 4) { /* bytes j and j + 4, low six bits */
        *sc = lane_bits(s[0], 8 * j, 6, 0);
        *mn = lane_bits(s[1], 8 * j, 6, 0);
    } else { /* byte j + 4's nibbles, the top two bits of bytes j - 4 (scale) and j (min) above them */
        int k = 8 * (j - 4);
        *sc = _mm256_or_si256(lane_bits(s[2], k, 4, 0), lane_bits(s[0], k + 6, 2, 4));
        *mn = _mm256_or_si256(lane_bits(s[2], k + 4, 4, 0), lane_bits(s[1], k + 6, 2, 4));
    }
}

/* -dmin of rows 8h..8h+7 of a Q4_K / Q5_K unit. */
INLINE __m256 k4_neg_dmin(const uint8_t *b, int h) {
    return _mm256_xor_ps(load_f16x8(b + 2080 + 16 * h), _mm256_set1_ps(-0.0f));
}

/* Q6_K units: d times the int8 scale of half e (weights 16e..16e+15) of
 * 32-block j, rows 8h..8h+7 (lane r of the four vectors at 3072 holds row
 * r's 16 scales). */
INLINE __m256 q6k_scale(const uint8_t *b, int j, int e, int h) {
    int byte = 2 * j + e; /* moved to the top of the lane, then shifted back down with its sign */
    __m256i s = _mm256_loadu_si256((const __m256i *)(b + 3072 + 64 * (byte / 4) + 32 * h));
    __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(s, 24 - 8 * (byte % 4)), 24);
    return _mm256_mul_ps(load_f16x8(b + 3328 + 16 * h), _mm256_cvtepi32_ps(sc));
}

/* Q6_K: bits 2q, 2q + 1 of each byte of h as bits 4, 5 (a weight's top
 * two bits above its nibble): one 16-bit shift that moves them there (q a
 * constant; the bits it carries across bytes are masked off) and a mask. */
INLINE __m256i q6k_high(__m256i h, int q) {
    __m256i s = q == 2 ? h : q < 2 ? _mm256_slli_epi16(h, 4 - 2 * q) : _mm256_srli_epi16(h, 2);
    return _mm256_and_si256(s, _mm256_set1_epi8(0x30));
}

/* Q5_K: bit j of each byte of qh (32-block j's fifth bits) as bit 4: one
 * 16-bit shift (j a constant; what it carries across bytes is masked off)
 * and a mask. */
INLINE __m256i k5_fifth(__m256i qh, int j) {
    __m256i s = j == 4 ? qh : j < 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

/* Rows 8h..8h+7 of 32-block j (0 but for the 256-block units) of the unit
 * at b. The tile calls it with j and h constants (unrolled loops), so the
 * offsets and shifts below fold into the instructions. */
INLINE void x16_load(cpu_wtype t, const uint8_t *b, int j, int h, x16_half *o) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
#define V(off) _mm256_loadu_si256((const __m256i *)(b + (off) + 32 * h)) /* rows 8h.. of the 64-byte vector at off */
    o->m = _mm256_setzero_ps();
    o->z = 0;
    switch (t) {
    case CPU_W_Q8_0_X16:
        for (int v = 0; v < 8; v++) o->s[v] = V(64 * v), o->u[v] = _mm256_sign_epi8(o->s[v], o->s[v]);
        o->a[0] = o->a[1] = load_f16x8(b + 512 + 16 * h);
        return;
    case CPU_W_Q4_0_X16:
    case CPU_W_Q4_1_X16:
        for (int v = 0; v < 4; v++) { /* low nibbles: weights 4v.., high: 16+4v.. */
            __m256i p = V(64 * v);
            o->u[v] = _mm256_and_si256(p, low4);
            o->u[v + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
        }
        o->a[0] = o->a[1] = load_f16x8(b + 256 + 16 * h);
        if (t == CPU_W_Q4_1_X16) o->m = load_f16x8(b + 288 + 16 * h);
        else o->z = 8;
        return;
    case CPU_W_Q5_0_X16:
    case CPU_W_Q5_1_X16: { /* Q4_0's nibbles, each lane's fifth bits from its qh word (x16_q5_byte) */
        const __m256i qh = V(256), fifth = _mm256_set1_epi8(0x10);
        const __m256i lane_bytes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808,
                                                     0x0C0C0C0C); /* each lane's first byte in its 128 bits */
        for (int v = 0; v < 8; v++) {
            __m256i p = V(64 * (v % 4));
            __m256i q = _mm256_and_si256(v < 4 ? p : _mm256_srli_epi16(p, 4), low4);
            __m256i idx = _mm256_add_epi32(lane_bytes, _mm256_set1_epi32(x16_q5_byte(v) * 0x01010101));
            __m256i mask = _mm256_set1_epi32((int)x16_q5_mask(v));
            __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, idx), mask), mask);
            o->u[v] = _mm256_or_si256(q, _mm256_and_si256(set, fifth));
        }
        o->a[0] = o->a[1] = load_f16x8(b + 320 + 16 * h);
        if (t == CPU_W_Q5_1_X16) o->m = load_f16x8(b + 352 + 16 * h);
        else o->z = 16;
        return;
    }
    case CPU_W_IQ4_NL_X16:
    case CPU_W_IQ4_XS_X16: { /* each code's level, signed as Q8_0's bytes (s the level, u |level|) */
        size_t codes = t == CPU_W_IQ4_XS_X16 ? 256 * (size_t)j : 0;
        for (int q = 0; q < 4; q++) { /* as Q4_0's nibbles */
            __m256i p = V(codes + 64 * q);
            o->s[q] = iq4_level_of(_mm256_and_si256(p, low4));
            o->s[q + 4] = iq4_level_of(_mm256_and_si256(_mm256_srli_epi16(p, 4), low4));
        }
        for (int q = 0; q < 8; q++) o->u[q] = _mm256_sign_epi8(o->s[q], o->s[q]);
        if (t == CPU_W_IQ4_NL_X16) {
            o->a[0] = o->a[1] = load_f16x8(b + 256 + 16 * h);
            return;
        }
        /* cpu_iq4xs_scale, a lane at a time */
        __m256i high = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 2080 + 16 * h)));
        __m256i low = _mm256_and_si256(_mm256_srl_epi32(V(2112), _mm_cvtsi32_si128(4 * j)), _mm256_set1_epi32(0xF));
        high = _mm256_and_si256(_mm256_srl_epi32(high, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi32(3));
        __m256i sc = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
        o->a[0] = o->a[1] = _mm256_mul_ps(load_f16x8(b + 2048 + 16 * h), _mm256_cvtepi32_ps(sc));
        return;
    }
    case CPU_W_Q4_K_X16:
    case CPU_W_Q5_K_X16: {
        int shift = 4 * (j % 2);
        for (int v = 0; v < 8; v++) /* the block pair's qs: low nibbles the even block, high the odd */
            o->u[v] = _mm256_and_si256(_mm256_srli_epi16(V(512 * (j / 2) + 64 * v), shift), low4);
        for (int v = 0; v < 8 && t == CPU_W_Q5_K_X16; v++) o->u[v] = _mm256_or_si256(o->u[v], k5_fifth(V(2304 + 64 * v), j));
        __m256i sc, mn;
        k4_scale_min(b, j, h, &sc, &mn);
        o->a[0] = o->a[1] = _mm256_mul_ps(load_f16x8(b + 2048 + 16 * h), _mm256_cvtepi32_ps(sc));
        o->m = _mm256_mul_ps(k4_neg_dmin(b, h), _mm256_cvtepi32_ps(mn));
        return;
    }
    default: { /* Q6_K */
        const size_t n = 384 * (size_t)j;
        __m256i h0 = V(n + 256), h1 = V(n + 320);
        for (int q = 0; q < 4; q++) {
            __m256i p = V(n + 64 * q);
            o->u[q] = _mm256_or_si256(_mm256_and_si256(p, low4), q6k_high(h0, q));
            o->u[q + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), low4), q6k_high(h1, q));
        }
        for (int e = 0; e < 2; e++) o->a[e] = q6k_scale(b, j, e, h);
        o->z = 32;
        return;
    }
    }
#undef V
}

/* How many maddubs results of one half block an int16 lane can add
 * before the madd to int32: each is two products u x, |x| <= 127, so at
 * most 2 * 127 * max u (Q8_0 |q| 128: 32512; IQ4 |level| 127: 32258; Q6_K
 * 63: 16002; Q5_K, Q5_0 and Q5_1 31: 7874; Q4 types 15: 3810, eight of
 * them 30480), and the sum must stay within 32767. With vpdpbusd, one: it adds into int32 directly. */
INLINE int x16_int16_terms(cpu_wtype t) {
#ifdef QUANT_AVX_VNNI
    return 1;
#else
    if (x16_signed(t)) return 1;
    if (t == CPU_W_Q6_K_X16) return 2;
    return t == CPU_W_Q4_0_X16 || t == CPU_W_Q4_1_X16 || t == CPU_W_Q4_K_X16 ? 8 : 4;
#endif
}

/* Term v (0..7: weights 4v..4v+3 of each row) of a block's integer sum,
 * u x: maddubs results collected in s16 in groups of x16_int16_terms, each
 * group added into s32 by madd (with vpdpbusd, every term into s32). */
INLINE void sum_term(cpu_wtype t, int v, __m256i *s32, __m256i *s16, __m256i u, __m256i x) {
#ifdef QUANT_AVX_VNNI
    (void)v, (void)s16;
    *s32 = _mm256_dpbusd_avx_epi32(*s32, u, x);
#else
    const int g = x16_int16_terms(t);
    __m256i p = _mm256_maddubs_epi16(u, x);
    *s16 = v % g ? _mm256_add_epi16(*s16, p) : p;
    if (v % g == g - 1) *s32 = _mm256_add_epi32(*s32, _mm256_madd_epi16(*s16, _mm256_set1_epi16(1)));
#endif
}

/* Activation bytes 4j..4j+3 in every lane, for weights 4j..4j+3 of each
 * row (the signed types: the weights' signs moved onto them). */
INLINE __m256i x16_x_bytes(cpu_wtype t, const x16_half *w, const cpu_q8_block *xb, int j) {
    __m256i xv = _mm256_set1_epi32(x_word(xb, j));
    return x16_signed(t) ? _mm256_sign_epi8(xv, w->s[j]) : xv;
}

/* The unit x16_prefetch_units ahead of the one at b, its part jb of
 * per-unit 32-blocks: a 256-block unit's lines spread over its eight
 * 32-blocks rather than 36-53 at once. */
INLINE void x16_prefetch_part(cpu_wtype t, const uint8_t *b, int jb) {
    const size_t ub = x16_unit_bytes(t), parts = x16_is_k(t) ? 8 : 1;
    const char *ahead = (const char *)b + x16_prefetch_units(x16_is_k(t)) * ub;
    for (size_t line = ub * (size_t)jb / parts / 64 * 64; line < ub * (size_t)(jb + 1) / parts; line += 64)
        _mm_prefetch(ahead + line, _MM_HINT_T0);
}

/* C tokens (x: their blocks, xs apart) against a half-block unpacked in
 * w: added into acc[c]. */
INLINE void x16_half_tokens(cpu_wtype t, int C, const x16_half *w, const cpu_q8_block *x, size_t xs, __m256 *acc) {
    for (int c = 0; c < C; c++) {
        const cpu_q8_block *xb = &x[(size_t)c * xs];
        __m256i a[2] = {_mm256_set1_epi32(-w->z * xb->half_sum[0]), _mm256_set1_epi32(-w->z * xb->half_sum[1])}, s16;
        for (int j = 0; j < 8; j++) sum_term(t, j, &a[j / 4], &s16, w->u[j], x16_x_bytes(t, w, xb, j));
        __m256 xd = _mm256_set1_ps(xb->d), *fc = &acc[c];
        if (t == CPU_W_Q6_K_X16) {
            *fc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[0]), _mm256_mul_ps(w->a[0], xd), *fc);
            *fc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[1]), _mm256_mul_ps(w->a[1], xd), *fc);
        } else {
            *fc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(a[0], a[1])), _mm256_mul_ps(w->a[0], xd), *fc);
        }
        if (x16_has_offset(t)) *fc = _mm256_fmadd_ps(w->m, _mm256_set1_ps(xb->s), *fc);
    }
}

/* 32-block jb of the unit at b, halves h0..h0+nh-1, for C tokens (x:
 * their blocks of it, xs apart): added into acc[h][c] (x16_tile). */
INLINE void x16_block(cpu_wtype t, int C, const uint8_t *b, int jb, int h0, int nh, const cpu_q8_block *x, size_t xs,
                      __m256 acc[2][4]) {
#pragma GCC unroll 2
    for (int hi = 0; hi < nh; hi++) {
        x16_half w;
        x16_load(t, b, jb, h0 + hi, &w);
        x16_half_tokens(t, C, &w, x, xs, acc[hi]);
    }
}

/* One token against the k-quant units: x16_block's integer sums and float
 * operations per (row, 32-block) in the same order, so the same bits as the
 * tiles of several tokens, but streamed rather than unpacked a block at a
 * time into an x16_half (its 16 vectors did not fit the 16 registers and
 * went through the stack): each 32-byte piece of weights is loaded once and
 * multiplied at once, a Q4_K/Q5_K vector's two nibbles against the two
 * blocks they hold, and both halves of a group share the activations'
 * broadcasts. f[h][0] lane r: the dot of row 8h + r with the token, halves
 * 0..nh-1. */
INLINE void x16_k4_decode(cpu_wtype t, int nh, const uint8_t *g, int nb, const cpu_q8_block *x, __m256 f[2][4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int unit = 0; unit < nb / 8; unit++) {
        const uint8_t *b = g + (size_t)unit * x16_unit_bytes(t);
        const cpu_q8_block *xu = x + (size_t)unit * 8;
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) { /* 32-blocks 2p (low nibbles) and 2p + 1 (high) */
            x16_prefetch_part(t, b, 2 * p);
            x16_prefetch_part(t, b, 2 * p + 1);
            __m256i s32[2][2], s16[2][2]; /* [half][block 2p + e] */
            for (int h = 0; h < 2; h++) s32[h][0] = s32[h][1] = _mm256_setzero_si256();
            for (int v = 0; v < 8; v++) {
                __m256i xe = _mm256_set1_epi32(x_word(&xu[2 * p], v)), xo = _mm256_set1_epi32(x_word(&xu[2 * p + 1], v));
                for (int h = 0; h < nh; h++) {
                    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 512 * p + 64 * v + 32 * h));
                    __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                    if (t == CPU_W_Q5_K_X16) {
                        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 2304 + 64 * v + 32 * h));
                        lo = _mm256_or_si256(lo, k5_fifth(qh, 2 * p)), hi = _mm256_or_si256(hi, k5_fifth(qh, 2 * p + 1));
                    }
                    sum_term(t, v, &s32[h][0], &s16[h][0], lo, xe);
                    sum_term(t, v, &s32[h][1], &s16[h][1], hi, xo);
                }
            }
            for (int h = 0; h < nh; h++)
                for (int e = 0; e < 2; e++) {
                    const cpu_q8_block *xb = &xu[2 * p + e];
                    __m256i sc, mn;
                    k4_scale_min(b, 2 * p + e, h, &sc, &mn);
                    __m256 a = _mm256_mul_ps(load_f16x8(b + 2048 + 16 * h), _mm256_cvtepi32_ps(sc));
                    __m256 m = _mm256_mul_ps(k4_neg_dmin(b, h), _mm256_cvtepi32_ps(mn));
                    acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[h][e]), _mm256_mul_ps(a, _mm256_set1_ps(xb->d)), acc[h]);
                    acc[h] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb->s), acc[h]);
                }
        }
    }
    for (int h = 0; h < nh; h++) f[h][0] = acc[h];
}

/* x16_k4_decode for Q6_K: a 32-block's eight 4-weight pieces are its
 * nibbles with two high bits each from the vectors at 256 and 320, its two
 * halves (weights 0..15, 16..31) summed apart for their own scales. */
INLINE void x16_q6k_decode(int nh, const uint8_t *g, int nb, const cpu_q8_block *x, __m256 f[2][4]) {
    const cpu_wtype t = CPU_W_Q6_K_X16;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int unit = 0; unit < nb / 8; unit++) {
        const uint8_t *b = g + (size_t)unit * x16_unit_bytes(t);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const cpu_q8_block *xb = x + (size_t)unit * 8 + j;
            const uint8_t *n = b + 384 * j;
            x16_prefetch_part(t, b, j);
            for (int h = 0; h < nh; h++) { /* a half at a time: both at once spilled the sums */
                __m256i s32[2], s16[2]; /* weights 16e..16e+15; zero point 32 */
                const __m256i h0 = _mm256_loadu_si256((const __m256i *)(n + 256 + 32 * h)),
                              h1 = _mm256_loadu_si256((const __m256i *)(n + 320 + 32 * h));
                for (int e = 0; e < 2; e++) s32[e] = _mm256_set1_epi32(-32 * xb->half_sum[e]);
                for (int q = 0; q < 4; q++) {
                    __m256i p = _mm256_loadu_si256((const __m256i *)(n + 64 * q + 32 * h));
                    __m256i lo = _mm256_or_si256(_mm256_and_si256(p, low4), q6k_high(h0, q));
                    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), low4), q6k_high(h1, q));
                    sum_term(t, q, &s32[0], &s16[0], lo, _mm256_set1_epi32(x_word(xb, q)));
                    sum_term(t, q + 4, &s32[1], &s16[1], hi, _mm256_set1_epi32(x_word(xb, q + 4)));
                }
                for (int e = 0; e < 2; e++)
                    acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[e]),
                                             _mm256_mul_ps(q6k_scale(b, j, e, h), _mm256_set1_ps(xb->d)), acc[h]);
            }
        }
    }
    for (int h = 0; h < nh; h++) f[h][0] = acc[h];
}

/* C tokens against halves h0..h0+nh-1 of one group (its units from g):
 * f[h][c] lane r = the dot of row 8h + r with token c, by the operations
 * of the AVX-512 x16 tile (quant_avx512.c) with maddubs + madd in place of
 * vpdpbusd (the integer sums exact either way): the same for every C and
 * either order of the halves, so decode and batches agree bit for bit.
 * nh 2 broadcasts the activations once for 16 rows; rows_x16 says when.
 * One token unrolls a 256-block unit's eight 32-blocks, so that their
 * offsets and shifts are constants (k-quants 1.4-1.6x faster, measured);
 * tiles of several tokens have registers enough to spare for no unrolling. */
INLINE void x16_tile(cpu_wtype t, int C, const uint8_t *g, int h0, int nh, int nb, const cpu_q8_block *x, size_t xs,
                     __m256 f[2][4]) {
    const size_t ub = x16_unit_bytes(t);
    const int per_unit = x16_is_k(t) ? 8 : 1; /* 32-blocks a unit */
    __m256 acc[2][4];
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < C; c++) acc[h][c] = _mm256_setzero_ps();
    for (int unit = 0; unit < nb / per_unit; unit++) {
        const uint8_t *b = g + (size_t)unit * ub;
        const cpu_q8_block *xu = x + (size_t)unit * per_unit;
        if (C == 1) {
#pragma GCC unroll 8
            for (int jb = 0; jb < per_unit; jb++) {
                if (h0 == 0) x16_prefetch_part(t, b, jb);
                x16_block(t, C, b, jb, h0, nh, xu + jb, xs, acc);
            }
        } else {
            for (int jb = 0; jb < per_unit; jb++) {
                if (h0 == 0) x16_prefetch_part(t, b, jb);
                x16_block(t, C, b, jb, h0, nh, xu + jb, xs, acc);
            }
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < C; c++) f[h0 + h][c] = acc[h][c];
}

enum { X16_PREP_TOKENS = 64 };

/* C tokens of a prepared unit (x16_prefill_k): its eight half-blocks h
 * against the tokens' blocks xc (xs apart), added into fc[0..C). */
INLINE void x16_prepared_tile(cpu_wtype t, int C, const x16_half w[8][2], int h, const cpu_q8_block *xc, size_t xs,
                              __m256 *fc) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) acc[c] = fc[c];
    for (int jb = 0; jb < 8; jb++) x16_half_tokens(t, C, &w[jb][h], xc + jb, xs, acc);
    for (int c = 0; c < C; c++) fc[c] = acc[c];
}

/* n (up to X16_PREP_TOKENS) tokens against halves 0..halves-1 of a group
 * of 256-block units: each unit unpacked once (x16_load of its eight
 * 32-blocks) for all n tokens, where the 4-token tiles unpacked it once
 * per tile; tiles of 4, 2 and 1 tokens over it, each token's sums kept in f
 * between units. Per token the operations of x16_tile in its order, so
 * the same bits. f[h][c]: token c's rows 8h.. */
INLINE void x16_prefill_k(cpu_wtype t, int halves, const uint8_t *g, int nb, const cpu_q8_block *x, int n,
                          __m256 f[2][X16_PREP_TOKENS]) {
    x16_half w[8][2];
    for (int h = 0; h < halves; h++)
        for (int c = 0; c < n; c++) f[h][c] = _mm256_setzero_ps();
    for (int unit = 0; unit < nb / 8; unit++) {
        const uint8_t *b = g + (size_t)unit * x16_unit_bytes(t);
#pragma GCC unroll 8
        for (int jb = 0; jb < 8; jb++) {
            x16_prefetch_part(t, b, jb);
            for (int h = 0; h < halves; h++) x16_load(t, b, jb, h, &w[jb][h]);
        }
        for (int c = 0; c < n;) {
            int C = n - c >= 4 ? 4 : n - c >= 2 ? 2 : 1;
            const cpu_q8_block *xc = x + (size_t)c * nb + (size_t)unit * 8;
            for (int h = 0; h < halves; h++) switch (C) { /* constant tile widths, unrolled */
                case 4: x16_prepared_tile(t, 4, w, h, xc, nb, &f[h][c]); break;
                case 2: x16_prepared_tile(t, 2, w, h, xc, nb, &f[h][c]); break;
                default: x16_prepared_tile(t, 1, w, h, xc, nb, &f[h][c]); break;
                }
            c += C;
        }
    }
}

/* Tokens c..c+n-1's rows rb..rb+n_valid-1 (f[j]: token c + j) into y, as
 * row_group stores: accumulate ? dst + (out + b) : out + b. */
INLINE void x16_store(float *y, const __m256 *f, int c, int n, int rows, int rb, int n_valid, const bf16 *bias,
                      int accumulate) {
    __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    float bv[8] = {0};
    for (int i = 0; i < n_valid && bias; i++) bv[i] = bf16_to_f32(bias[rb + i]);
    __m256 bvec = _mm256_loadu_ps(bv);
    for (int j = 0; j < n; j++) {
        float *dst = y + (size_t)(c + j) * rows + rb;
        __m256 v = _mm256_add_ps(f[j], bvec);
        if (accumulate) v = _mm256_add_ps(_mm256_maskload_ps(dst, valid), v);
        _mm256_maskstore_ps(dst, valid, v);
    }
}

/* Rows r0..r1-1 (r0 a multiple of 16) of an x16 matrix for every token:
 * one token both halves of a group at once, more 4 or 2 tokens a tile per
 * half. Groups are padded to 16 rows, so a half past r1 reads zero blocks
 * and is not stored. */
INLINE void rows_x16(cpu_wtype t, float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,
                     int T, int rows, int nb, int accumulate, int r0, int r1) {
    for (int r = r0; r < r1; r += 16) {
        const uint8_t *g = (const uint8_t *)w + (size_t)r * row_bytes;
        int halves = r1 - r > 8 ? 2 : 1;
        if (T > 4 && x16_is_k(t)) { /* a prefill: each unit unpacked once for up to X16_PREP_TOKENS tokens */
            for (int c = 0; c < T; c += X16_PREP_TOKENS) {
                __m256 f[2][X16_PREP_TOKENS];
                int n = T - c < X16_PREP_TOKENS ? T - c : X16_PREP_TOKENS;
                x16_prefill_k(t, halves, g, nb, xq + (size_t)c * nb, n, f);
                for (int h = 0; h < halves; h++)
                    x16_store(y, f[h], c, n, rows, r + 8 * h, r1 - r - 8 * h < 8 ? r1 - r - 8 * h : 8, bias, accumulate);
            }
            continue;
        }
        for (int c = 0; c < T;) {
            __m256 f[2][4];
            int n = T - c >= 4 ? 4 : T - c >= 2 ? 2 : 1;
            const cpu_q8_block *xc = xq + (size_t)c * nb;
            switch (n) { /* constant tile widths, unrolled */
            case 4: for (int h = 0; h < halves; h++) x16_tile(t, 4, g, h, 1, nb, xc, nb, f); break;
            case 2: for (int h = 0; h < halves; h++) x16_tile(t, 2, g, h, 1, nb, xc, nb, f); break;
            default: /* one token: both halves a pass for the 32-block types (measured 12-15% faster), a half a pass
                        for the 256-block ones (both at once spilled registers: 5-15% slower) */
                if (t == CPU_W_Q4_K_X16 || t == CPU_W_Q5_K_X16) x16_k4_decode(t, halves, g, nb, xc, f);
                else if (t == CPU_W_Q6_K_X16) x16_q6k_decode(halves, g, nb, xc, f);
                else if (x16_is_k(t)) for (int h = 0; h < halves; h++) x16_tile(t, 1, g, h, 1, nb, xc, nb, f);
                else x16_tile(t, 1, g, 0, 2, nb, xc, nb, f);
                break;
            }
            for (int h = 0; h < halves; h++)
                x16_store(y, f[h], c, n, rows, r + 8 * h, r1 - r - 8 * h < 8 ? r1 - r - 8 * h : 8, bias, accumulate);
            c += n;
        }
    }
}

X16_ROWS_FUNCTIONS /* quant_x86.h: rows_q8_0_x16 .. rows_q5_1_x16 and LEVEL_EXTRA_ROWS */

#ifndef QUANT_AVX_VNNI
#define QUANT_LEVEL avx2
#else
#define QUANT_LEVEL avx2vnni
#endif
#include "quant_tiles.h"
