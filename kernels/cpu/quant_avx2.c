/* AVX2 block dot products for Q8_0, Q4_0, Q4_1 weights against int8
 * activation blocks (quant.h). Compiled with -mavx2 -mfma -mf16c; called
 * only on CPUs that report avx2 and fma. Each block's integer sum is exact
 * (as in quant.c); only the order of the f32 sum over blocks differs.
 *
 * One tile routine computes R rows x C tokens at once: a weight block is
 * unpacked once for C tokens and an activation block loaded once for R
 * rows, and the R*C independent accumulators keep the FMA pipes busy (a
 * single row's dot is one dependent chain). Every tile shape does the same
 * operations per (row, token) in the same order, so the 1x1 dot product
 * and the matmul agree bit for bit. */
#include <immintrin.h>

#include "quant.h"

#define INLINE static inline __attribute__((always_inline))

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float load_f16(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* 16 bytes of nibbles -> 32 bytes 0..15 in element order (low nibbles are
 * elements 0..15, high nibbles 16..31). */
INLINE __m256i nibbles(const uint8_t *p) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* A weight block unpacked for maddubs: u holds unsigned bytes (|w| for the
 * signed types, whose signs s are moved onto x), d the scale, m Q4_1's
 * offset. */
typedef struct {
    __m256i u, s;
    float d, m;
} wblock;

INLINE wblock unpack(cpu_wtype t, const uint8_t *b) {
    wblock o;
    o.d = load_f16(b);
    o.m = 0.0f;
    if (t == CPU_W_Q4_1) {
        o.m = load_f16(b + 2);
        o.u = o.s = nibbles(b + 4);
        return o;
    }
    __m256i w = t == CPU_W_Q8_0 ? _mm256_loadu_si256((const __m256i *)(b + 2))
                                : _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
    o.u = _mm256_sign_epi8(w, w);
    o.s = w;
    return o;
}

/* 8 int32 partial sums of the block's 32 products, as floats. |w| <= 128
 * and |x| <= 127, so maddubs' pair sums stay within int16. */
INLINE __m256 block_sum(cpu_wtype t, const wblock *w, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    if (t != CPU_W_Q4_1) x = _mm256_sign_epi8(x, w->s);
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w->u, x), _mm256_set1_epi16(1));
    return _mm256_cvtepi32_ps(p);
}

#define PREFETCH_TILES 2

/* out[r][c] = dot of weight row r (rows row_bytes apart) with token c's nb
 * blocks (tokens xs blocks apart). R, C and t are constants at each call. */
INLINE void tile(cpu_wtype t, int R, int C, const uint8_t *w, size_t row_bytes, const cpu_q8_block *x, size_t xs,
                 int nb, float out[4][4]) {
    const size_t bb = t == CPU_W_Q8_0 ? 34 : t == CPU_W_Q4_0 ? 18 : 20;
    __m256 acc[4][4];
    float off[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps(), off[r][c] = 0.0f;
    for (int k = 0; k < nb; k++) {
        wblock wb[4];
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + (size_t)r * row_bytes + (size_t)k * bb;
            /* R interleaved rows defeat the hardware's stream prefetch:
             * ask for the same block PREFETCH_TILES tiles ahead */
            _mm_prefetch((const char *)b + PREFETCH_TILES * R * row_bytes, _MM_HINT_T0);
            wb[r] = unpack(t, b);
        }
        for (int c = 0; c < C; c++) {
            const cpu_q8_block *xb = &x[(size_t)c * xs + k];
            for (int r = 0; r < R; r++) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(wb[r].d * xb->d), block_sum(t, &wb[r], xb->q), acc[r][c]);
                if (t == CPU_W_Q4_1) off[r][c] += wb[r].m * xb->s; /* sum of m * x */
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[r][c] = hsum8(acc[r][c]) + off[r][c];
}

/* Rows r..r+R-1 of y[T, rows] for every token, 4 tokens a tile while
 * 4 remain. */
INLINE void row_group(cpu_wtype t, int R, float *y, const cpu_q8_block *xq, const uint8_t *w, size_t row_bytes,
                      const bf16 *bias, int T, int rows, int nb, int accumulate, int r) {
    const uint8_t *wr = w + (size_t)r * row_bytes;
    for (int c = 0; c < T;) {
        float out[4][4];
        int nc = T - c >= 4 && R <= 2 ? 4 : 1;
        const cpu_q8_block *xc = xq + (size_t)c * nb;
        if (nc == 4) tile(t, R, 4, wr, row_bytes, xc, nb, nb, out);
        else tile(t, R, 1, wr, row_bytes, xc, nb, nb, out);
        for (int i = 0; i < R; i++) {
            float b = bias ? bf16_to_f32(bias[r + i]) : 0.0f;
            for (int j = 0; j < nc; j++) {
                float *dst = &y[(size_t)(c + j) * rows + r + i];
                *dst = accumulate ? *dst + (out[i][j] + b) : out[i][j] + b;
            }
        }
        c += nc;
    }
}

/* Rows r0..r1-1 for every token: 4-row tiles for one token (decode), 2 rows
 * x 4 tokens otherwise (prefill), single rows at the tail. */
INLINE void rows_q(cpu_wtype t, float *y, const cpu_q8_block *xq, const uint8_t *w, size_t row_bytes, const bf16 *bias,
                   int T, int rows, int nb, int accumulate, int r0, int r1) {
    int r = r0;
    if (T == 1)
        for (; r + 4 <= r1; r += 4) row_group(t, 4, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r);
    else
        for (; r + 2 <= r1; r += 2) row_group(t, 2, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r);
    for (; r < r1; r++) row_group(t, 1, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r);
}

#define LEVEL_FUNCTIONS(name, type)                                                                                 \
    static float dot_##name(const void *w, const cpu_q8_block *x, int nb) {                                        \
        float out[4][4];                                                                                           \
        tile(type, 1, 1, w, 0, x, 0, nb, out);                                                                     \
        return out[0][0];                                                                                          \
    }                                                                                                              \
    static void rows_##name(float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,  \
                            int T, int rows, int nb, int accumulate, int r0, int r1) {                             \
        rows_q(type, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r0, r1);                                  \
    }
LEVEL_FUNCTIONS(q8_0, CPU_W_Q8_0)
LEVEL_FUNCTIONS(q4_0, CPU_W_Q4_0)
LEVEL_FUNCTIONS(q4_1, CPU_W_Q4_1)

const cpu_dot_q_fn cpu_dot_q_avx2[CPU_W_N] = {NULL, dot_q8_0, dot_q4_0, dot_q4_1};
const cpu_rows_q_fn cpu_rows_q_avx2[CPU_W_N] = {NULL, rows_q8_0, rows_q4_0, rows_q4_1};
