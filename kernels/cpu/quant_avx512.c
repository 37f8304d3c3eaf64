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
    return t == CPU_W_Q8_0 ? _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80)) : raw;
}
INLINE int vnni_zero(cpu_wtype t) { return t == CPU_W_Q8_0 ? 128 : zero_point(t); }

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

#define BATCH_ROWS 4
#define QUANT_LEVEL avx512vnni
#include "quant_tiles.h"
