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
 * and the matmul (quant_tiles.h) agree bit for bit. */
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

/* 8 int32 partial sums of the block's 32 products, as floats: lanes 0-3
 * cover weights 0-15, lanes 4-7 weights 16-31. |q| <= 128 and |x| <= 127,
 * so maddubs' pair sums stay within int16. */
INLINE __m256 block_sum(cpu_wtype t, const wblock *w, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    if (is_signed(t)) x = _mm256_sign_epi8(x, w->s);
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w->u, x), _mm256_set1_epi16(1));
    return _mm256_cvtepi32_ps(p);
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

#define QUANT_LEVEL avx2
#include "quant_tiles.h"
