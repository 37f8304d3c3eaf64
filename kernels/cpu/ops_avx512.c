/* AVX-512 kernels, 16 f32 lanes. This file alone is compiled with
 * -mavx512f -mavx512bw -mavx512vl; dispatch.c calls it only on a CPU that
 * reports all three. The same algorithms as ops_avx2.c at twice the width
 * (no bf16 dot-product instructions: they would round the activations to
 * bf16, and these kernels keep f32 inputs and f32 sums). */
#include <immintrin.h>
#include <math.h>

#include "attention_rows.h"
#include "kernels.h"

#define INLINE static inline __attribute__((always_inline))

/* bf16 is the top half of an f32: widen 16 of them with a 16-bit shift. */
INLINE __m512 load16_bf16(const bf16 *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The lanes summed in a fixed order (halves, then quarters, ...). */
INLINE float hsum16(__m512 v) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane u = the sum of a[u]'s lanes, for 16 vectors at once: pairs of
 * vectors halve to 8 lanes each, then 4, 2 and 1 (46 operations, where 16
 * hsum16 take about 130); one permute puts the keys back in order. */
INLINE __m512 hsum16x16(const __m512 a[16]) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) /* quarters of a[2i], then of a[2i+1]: (q0 + q2, q1 + q3) each */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* quarter L: the 4 lanes left of vector 4i + L */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* quarter L: 2 lanes each of vectors 8i + L and 8i + 4 + L, interleaved */
        d[i] = _mm512_add_ps(_mm512_unpacklo_ps(c[2 * i], c[2 * i + 1]), _mm512_unpackhi_ps(c[2 * i], c[2 * i + 1]));
    /* quarter L: the sums of vectors L, 8 + L, 4 + L, 12 + L */
    __m512 e = _mm512_add_ps(_mm512_unpacklo_ps(d[0], d[1]), _mm512_unpackhi_ps(d[0], d[1]));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, e);
}

/* e^x as exp8 in ops_avx2.c: n ln2 + r, Taylor to r^7, 2^n in the exponent
 * field, x clamped to [-87.33, 88.37] so n is a normal exponent. */
INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.37f), _mm512_max_ps(_mm512_set1_ps(-87.33f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* An R-row x NT-token tile of y: one accumulator per output element, fed 16
 * columns at a time, then hsum16 and the scalar tail, in every tile shape
 * (decode and prefill agree bit for bit). next: the R rows to prefetch
 * while these stream (decode), or NULL. R * NT <= 16 of the 32 registers. */
INLINE void tile(float *y, const float *x, const bf16 *w, const bf16 *bias, int rows, int cols, int accumulate, int r,
                 int t0, const int R, const int NT, const bf16 *next) {
    __m512 acc[8][4];
    for (int i = 0; i < R; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = _mm512_setzero_ps();
    const float *xt = x + (size_t)t0 * cols;
    const bf16 *wr = w + (size_t)r * cols;
    int j = 0;
    for (; j + 16 <= cols; j += 16) {
        __m512 xv[4];
        for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_ps(xt + (size_t)t * cols + j);
        if (next && (j & 31) == 0) /* a line of each of the next R rows */
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)(next + (size_t)i * cols + j), _MM_HINT_T0);
        for (int i = 0; i < R; i++) {
            __m512 wv = load16_bf16(wr + (size_t)i * cols + j);
            for (int t = 0; t < NT; t++) acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    for (int i = 0; i < R; i++) {
        float b = bias ? bf16_to_f32(bias[r + i]) : 0.0f;
        for (int t = 0; t < NT; t++) {
            float s = hsum16(acc[i][t]);
            for (int jj = j; jj < cols; jj++) s += bf16_to_f32(wr[(size_t)i * cols + jj]) * xt[(size_t)t * cols + jj];
            float *dst = &y[(size_t)(t0 + t) * rows + r + i];
            *dst = accumulate ? *dst + (s + b) : s + b;
        }
    }
}

/* Decode: 8 rows per pass, the next 8 prefetched (as in ops_avx2.c, where
 * it was measured). Prefill: 4 rows x 4 tokens. */
static void avx512_matmul_bf16(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
                               int accumulate, int r0, int r1) {
    int r = r0;
    if (T == 1) {
        for (; r + 8 <= r1; r += 8) {
            const bf16 *next = r + 16 <= rows ? w + (size_t)(r + 8) * cols : NULL;
            tile(y, x, w, bias, rows, cols, accumulate, r, 0, 8, 1, next);
        }
        for (; r < r1; r++) tile(y, x, w, bias, rows, cols, accumulate, r, 0, 1, 1, NULL);
        return;
    }
    for (; r + 4 <= r1; r += 4) {
        int t = 0;
        for (; t + 4 <= T; t += 4) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 4, NULL);
        if (T - t == 3) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 3, NULL);
        if (T - t == 2) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 2, NULL);
        if (T - t == 1) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 1, NULL);
    }
    for (; r < r1; r++)
        for (int t = 0; t < T; t++) tile(y, x, w, bias, rows, cols, accumulate, r, t, 1, 1, NULL);
}

static void avx512_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    float ss = hsum16(acc);
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    __m512 iv = _mm512_set1_ps(inv);
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(load16_bf16(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), iv)));
    for (; i < n; i++) out[i] = bf16_to_f32(w[i]) * (x[i] * inv);
}

/* Multiplies and subtracts as ops.c writes them (no FMA): the same bits. */
static void avx512_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 16 <= half; i += 16) {
            __m512 a = _mm512_loadu_ps(v + i), b = _mm512_loadu_ps(v + i + half);
            __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(sn + i);
            _mm512_storeu_ps(v + i, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
            _mm512_storeu_ps(v + i + half, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
        }
        for (; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

/* 16 K/V values from element i of rows (kv16: bf16 rows). */
INLINE __m512 kv_load16(const void *rows, size_t i, int kv16) {
    return kv16 ? load16_bf16((const bf16 *)rows + i) : _mm512_loadu_ps((const float *)rows + i);
}

INLINE float dot(const float *a, const void *b, int n, int kv16) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), kv_load16(b, i, kv16), acc);
    float s = hsum16(acc);
    for (; i < n; i++) s += a[i] * kv_scalar(b, i, kv16);
    return s;
}

/* Scores of one query against the 16 keys of the KV block at k0 (one
 * row per key, kv_dim apart): the 16 sums reduced together. */
INLINE __m512 block16_scores(const float *qh, const void *k0, int hd, int kv_dim, __m512 scale, int kv16) {
    __m512 acc[16];
    for (int u = 0; u < 16; u++) acc[u] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 16) {
        __m512 qv = _mm512_loadu_ps(qh + i);
        for (int u = 0; u < 16; u++) acc[u] = _mm512_fmadd_ps(qv, kv_load16(k0, (size_t)u * kv_dim + i, kv16), acc[u]);
    }
    return _mm512_mul_ps(hsum16x16(acc), scale);
}

/* scores[j] for keys j0..n-1 (j0 a multiple of 16, 0 unless hd is):
 * whole KV blocks, then four keys at once, then one. A key's score is the
 * same bits whichever query tile asked for it: the path it takes depends
 * on j and n only. */
INLINE void scores_from(float *scores, const float *qh, const void *kb, const int *blocks, int j0, int n, int hd,
                        int kv_dim, float scale, int kv16) {
    int j = j0;
    _Static_assert(CPU_KV_BLOCK % 16 == 0, "16 keys from j (a multiple of 16) lie in one KV block");
    if (hd % 16 == 0)
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(scores + j, block16_scores(qh, kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16), hd,
                                                        kv_dim, _mm512_set1_ps(scale), kv16));
    for (; j + 4 <= n; j += 4) { /* four keys at once: four independent FMA chains */
        const void *k0 = kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16);
        size_t r1 = (size_t)kv_dim, r2 = 2 * r1, r3 = 3 * r1;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int i = 0;
        for (; i + 16 <= hd; i += 16) {
            __m512 qv = _mm512_loadu_ps(qh + i);
            a0 = _mm512_fmadd_ps(qv, kv_load16(k0, i, kv16), a0);
            a1 = _mm512_fmadd_ps(qv, kv_load16(k0, r1 + i, kv16), a1);
            a2 = _mm512_fmadd_ps(qv, kv_load16(k0, r2 + i, kv16), a2);
            a3 = _mm512_fmadd_ps(qv, kv_load16(k0, r3 + i, kv16), a3);
        }
        float s[4] = {hsum16(a0), hsum16(a1), hsum16(a2), hsum16(a3)};
        for (int u = 0; u < 4; u++) {
            for (int ii = i; ii < hd; ii++) s[u] += qh[ii] * kv_scalar(k0, (size_t)u * kv_dim + ii, kv16);
            scores[j + u] = s[u] * scale;
        }
    }
    for (; j < n; j++) scores[j] = dot(qh, kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16), hd, kv16) * scale;
}

/* scores[0..n) -> their softmax. The max and the divisions 16 lanes at a
 * time: both exact in any order, so the same bits as one at a time. */
INLINE void softmax_scores(float *scores, int n) {
    int j;
    __m512 m16 = _mm512_set1_ps(-INFINITY);
    for (j = 0; j + 16 <= n; j += 16) m16 = _mm512_max_ps(_mm512_loadu_ps(scores + j), m16); /* a NaN score is passed over, as below */
    float mx = _mm512_reduce_max_ps(m16);
    for (; j < n; j++) mx = scores[j] > mx ? scores[j] : mx;

    __m512 mv = _mm512_set1_ps(mx), sv = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), mv));
        _mm512_storeu_ps(scores + j, e);
        sv = _mm512_add_ps(sv, e);
    }
    float sum = hsum16(sv);
    for (; j < n; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    __m512 sum16 = _mm512_set1_ps(sum);
    for (j = 0; j + 16 <= n; j += 16) _mm512_storeu_ps(scores + j, _mm512_div_ps(_mm512_loadu_ps(scores + j), sum16));
    for (; j < n; j++) scores[j] /= sum;
}

/* out_q[i..i+64) = sum_j p_qj v_j for Q queries, query q over keys
 * 0..n0+q*step-1 (probabilities p at scores + q * ss): each V row loaded once
 * for the whole tile, every query's sums in registers, j ascending as for
 * one query alone. */
INLINE void values64(int Q, float *out, size_t os, const void *vb, const int *blocks, int n0, int kv_dim, int i,
                     const float *scores, size_t ss, int kv16, int step) {
    __m512 o[ATTENTION_QUERIES][4];
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < 4; c++) o[q][c] = _mm512_setzero_ps();
    for (int j = 0; j < n0 + (Q - 1) * step; j++) { /* keys past n0: only the later queries */
        const void *vj = kv_elems(vb, cpu_kv_row(blocks, j) * kv_dim + i, kv16);
        __m512 v[4] = {kv_load16(vj, 0, kv16), kv_load16(vj, 16, kv16), kv_load16(vj, 32, kv16), kv_load16(vj, 48, kv16)};
        if (j < n0)
            for (int q = 0; q < Q; q++) {
                __m512 p = _mm512_set1_ps(scores[q * ss + j]);
                for (int c = 0; c < 4; c++) o[q][c] = _mm512_fmadd_ps(p, v[c], o[q][c]);
            }
        else
            for (int q = j - n0 + 1; q < Q; q++) {
                __m512 p = _mm512_set1_ps(scores[q * ss + j]);
                for (int c = 0; c < 4; c++) o[q][c] = _mm512_fmadd_ps(p, v[c], o[q][c]);
            }
    }
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(out + q * os + i + 16 * c, o[q][c]);
}

/* Up to 4 queries of one sequence, rows q_stride apart in q and out from
 * head h: (step 1) positions pos..pos+Q-1 of head h, or (step 0, q_stride
 * hd) heads h..h+Q-1 of one KV head at pos. Each the same bits as alone. The
 * tile's keys are scored block by block for every query while the block
 * is in L1; the values are read once for the tile. */
INLINE void attention_tile(int Q, float *out, const float *q, size_t q_stride, const void *k_cache,
                           const void *v_cache, const int *blocks, int pos, int h, int n_heads, int n_kv, int hd,
                           float *scores, size_t ss, int kv16, int step) {
    int kvh = h / (n_heads / n_kv), kv_dim = n_kv * hd, n0 = pos + 1;
    const void *kb = kv_elems(k_cache, (size_t)kvh * hd, kv16), *vb = kv_elems(v_cache, (size_t)kvh * hd, kv16);
    float scale = 1.0f / sqrtf((float)hd);
    int shared = hd % 16 == 0 ? n0 / 16 * 16 : 0; /* whole blocks every query of the tile scores */
    for (int j = 0; j < shared; j += 16) {
        const void *k0 = kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16);
        for (int t = 0; t < Q; t++)
            _mm512_storeu_ps(scores + t * ss + j, block16_scores(q + t * q_stride + (size_t)h * hd, k0, hd, kv_dim,
                                                                 _mm512_set1_ps(scale), kv16));
    }
    for (int t = 0; t < Q; t++) {
        scores_from(scores + t * ss, q + t * q_stride + (size_t)h * hd, kb, blocks, shared, n0 + t * step, hd, kv_dim,
                    scale, kv16);
        softmax_scores(scores + t * ss, n0 + t * step);
    }
    float *oh = out + (size_t)h * hd;
    int i = 0;
    for (; i + 64 <= hd; i += 64) switch (Q) { /* constant tile heights, unrolled */
        case 4: values64(4, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        case 3: values64(3, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        case 2: values64(2, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        default: values64(1, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        }
    for (int t = 0; t < Q; t++) { /* the outputs past the last 64, one query at a time */
        const float *p = scores + t * ss;
        float *ot = oh + t * q_stride;
        int n = n0 + t * step;
        for (int r = i; r + 16 <= hd; r += 16) {
            __m512 o = _mm512_setzero_ps();
            for (int j = 0; j < n; j++)
                o = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), kv_load16(vb, cpu_kv_row(blocks, j) * kv_dim + r, kv16), o);
            _mm512_storeu_ps(ot + r, o);
        }
        values_scalar(ot, p, n, vb, blocks, kv_dim, i + (hd - i) / 16 * 16, hd, kv16);
    }
}

ATTENTION_ROWS_FUNCTION(avx512_attention_rows, float, 0)
ATTENTION_ROWS_FUNCTION(avx512_attention_rows_bf16, bf16, 1)

ATTENTION_HEAD_FUNCTION(avx512_attention_head)

static void avx512_swiglu(float *g, const float *u, int n) {
    int i = 0;
    __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* The f32 kernels of both AVX-512 levels. */
#define AVX512_OPS                                                                                                    \
    .matmul_bf16 = avx512_matmul_bf16, .row_block = 8, .rmsnorm = avx512_rmsnorm, .rope = avx512_rope,             \
    .attention_head = avx512_attention_head, .attention_rows = avx512_attention_rows,                              \
    .attention_rows_bf16 = avx512_attention_rows_bf16, .swiglu = avx512_swiglu, .quantize_q8 = cpu_quantize_q8_avx2

const cpu_kernels cpu_kernels_avx512 = {
    .name = "avx512",
    AVX512_OPS,
    .dot_q = cpu_dot_q_avx2, /* no AVX-512 CPU lacks avx2 and fma; without VNNI the AVX2 block dots */
    .rows_q = cpu_rows_q_avx2,
};

const cpu_kernels cpu_kernels_avx512vnni = {
    .name = "avx512vnni",
    AVX512_OPS,
    .dot_q = cpu_dot_q_avx512vnni, /* quant_avx512.c */
    .rows_q = cpu_rows_q_avx512vnni,
};
