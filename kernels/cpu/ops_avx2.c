/* AVX2 + FMA kernels, 8 f32 lanes. This file alone is compiled with
 * -mavx2 -mfma -mf16c; dispatch.c calls it only on a CPU that reports avx2
 * and fma. Math as in ops.c (f32 throughout); sums are reordered. */
#include <immintrin.h>
#include <math.h>

#include "attention_rows.h"
#include "kernels.h"

#define INLINE static inline __attribute__((always_inline))

/* bf16 is the top half of an f32: widen 8 of them with a 16-bit shift. */
INLINE __m256 load8_bf16(const bf16 *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x to about 2 ulp: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor
 * series to r^7 (truncation below 1e-8 relative), times 2^n built in the
 * exponent field. x is clamped so n stays a normal exponent (-126..127):
 * below e^-87.33 this returns 2^-126 where expf gives a subnormal or 0, above
 * e^88.37 it returns 2.4e38 where expf reaches inf. NaN stays NaN (maxps
 * returns its second operand when one is NaN). */
INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.37f), _mm256_max_ps(_mm256_set1_ps(-87.33f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln2 in two parts: n * hi is exact */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* An R-row x NT-token tile of y. Each output element has one accumulator
 * fed 8 columns at a time, reduced by hsum8, then the scalar tail: the same
 * order in every tile shape, so decode (T = 1) and prefill agree bit for
 * bit. R and NT are constants after inlining: the accumulators live in
 * registers (R * NT <= 12 of the 16). next: the R rows to prefetch while
 * these stream (decode), or NULL. */
INLINE void tile(float *y, const float *x, const bf16 *w, const bf16 *bias, int rows, int cols, int accumulate, int r,
                 int t0, const int R, const int NT, const bf16 *next) {
    __m256 acc[8][3];
    for (int i = 0; i < R; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
    const float *xt = x + (size_t)t0 * cols;
    const bf16 *wr = w + (size_t)r * cols;
    int j = 0;
    for (; j + 8 <= cols; j += 8) {
        __m256 xv[3];
        for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(xt + (size_t)t * cols + j);
        if (next && (j & 31) == 0) /* a line of each of the next R rows */
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)(next + (size_t)i * cols + j), _MM_HINT_T0);
        for (int i = 0; i < R; i++) {
            __m256 wv = load8_bf16(wr + (size_t)i * cols + j);
            for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    for (int i = 0; i < R; i++) {
        float b = bias ? bf16_to_f32(bias[r + i]) : 0.0f;
        for (int t = 0; t < NT; t++) {
            float s = hsum8(acc[i][t]);
            for (int jj = j; jj < cols; jj++) s += bf16_to_f32(wr[(size_t)i * cols + jj]) * xt[(size_t)t * cols + jj];
            float *dst = &y[(size_t)(t0 + t) * rows + r + i];
            *dst = accumulate ? *dst + (s + b) : s + b;
        }
    }
}

/* Decode: 8 rows per pass, eight independent FMA chains, the next 8 rows
 * prefetched (one weight stream per row is short: 18 cache lines at 576
 * columns; measured 10-20% faster with it). Prefill: 4 rows x 3 tokens, so
 * each weight load serves three tokens and each activation load four rows;
 * the four rows stay in L1 across T. */
static void avx2_matmul_bf16(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
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
        for (; t + 3 <= T; t += 3) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 3, NULL);
        if (T - t == 2) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 2, NULL);
        if (T - t == 1) tile(y, x, w, bias, rows, cols, accumulate, r, t, 4, 1, NULL);
    }
    for (; r < r1; r++)
        for (int t = 0; t < T; t++) tile(y, x, w, bias, rows, cols, accumulate, r, t, 1, 1, NULL);
}

static void avx2_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float ss = hsum8(acc);
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(load8_bf16(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), iv)));
    for (; i < n; i++) out[i] = bf16_to_f32(w[i]) * (x[i] * inv);
}

/* Multiplies and subtracts as ops.c writes them (no FMA): the same bits. */
static void avx2_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
            __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
            _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
            _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
        }
        for (; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

/* 8 K/V values from element i of rows (kv16: bf16 rows). */
INLINE __m256 kv_load8(const void *rows, size_t i, int kv16) {
    return kv16 ? load8_bf16((const bf16 *)rows + i) : _mm256_loadu_ps((const float *)rows + i);
}

INLINE float dot(const float *a, const void *b, int n, int kv16) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), kv_load8(b, i, kv16), acc);
    float s = hsum8(acc);
    for (; i < n; i++) s += a[i] * kv_scalar(b, i, kv16);
    return s;
}

/* Scores of one query against the 4 keys from row k0 (rows kv_dim
 * apart): four independent FMA chains. */
INLINE void four_scores(float *scores, const float *qh, const void *k0, int hd, int kv_dim, float scale, int kv16) {
    size_t r1 = (size_t)kv_dim, r2 = 2 * r1, r3 = 3 * r1;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 8 <= hd; i += 8) {
        __m256 qv = _mm256_loadu_ps(qh + i);
        a0 = _mm256_fmadd_ps(qv, kv_load8(k0, i, kv16), a0);
        a1 = _mm256_fmadd_ps(qv, kv_load8(k0, r1 + i, kv16), a1);
        a2 = _mm256_fmadd_ps(qv, kv_load8(k0, r2 + i, kv16), a2);
        a3 = _mm256_fmadd_ps(qv, kv_load8(k0, r3 + i, kv16), a3);
    }
    float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
    for (int u = 0; u < 4; u++) {
        for (int ii = i; ii < hd; ii++) s[u] += qh[ii] * kv_scalar(k0, (size_t)u * kv_dim + ii, kv16);
        scores[u] = s[u] * scale;
    }
}

/* scores[0..n) of one query -> their softmax. The max and the divisions
 * 8 lanes at a time: both exact in any order, so the same bits as one at
 * a time. */
INLINE void softmax_scores(float *scores, int n) {
    int j;
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (j = 0; j + 8 <= n; j += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(scores + j), m8); /* a NaN score is passed over, as below */
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; j < n; j++) mx = scores[j] > mx ? scores[j] : mx;

    __m256 mv = _mm256_set1_ps(mx), sv = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), mv));
        _mm256_storeu_ps(scores + j, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum8(sv);
    for (; j < n; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    __m256 sum8 = _mm256_set1_ps(sum);
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(scores + j, _mm256_div_ps(_mm256_loadu_ps(scores + j), sum8));
    for (; j < n; j++) scores[j] /= sum;
}

TILE_SCORES_BY_FOURS_FUNCTION

/* out_q[i..i+8W) = sum_j p_qj v_j for Q queries, query q over keys
 * 0..n0+q*step-1 (probabilities at scores + q * ss): each V row loaded once for
 * the tile, the sums in registers, j ascending for every output lane as
 * for one query alone (so the lanes' grouping into passes does not matter). */
INLINE void values_tile(int Q, int W, float *out, size_t os, const void *vb, const int *blocks, int n0, int kv_dim,
                        int i, const float *scores, size_t ss, int kv16, int step) {
    __m256 o[ATTENTION_QUERIES][4];
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < W; c++) o[q][c] = _mm256_setzero_ps();
    for (int j = 0; j < n0 + (Q - 1) * step; j++) { /* keys past n0: only the later queries */
        const void *vj = kv_elems(vb, cpu_kv_row(blocks, j) * kv_dim + i, kv16);
        __m256 v[4];
        for (int c = 0; c < W; c++) v[c] = kv_load8(vj, 8 * (size_t)c, kv16);
        if (j < n0)
            for (int q = 0; q < Q; q++) {
                __m256 p = _mm256_set1_ps(scores[q * ss + j]);
                for (int c = 0; c < W; c++) o[q][c] = _mm256_fmadd_ps(p, v[c], o[q][c]);
            }
        else
            for (int q = j - n0 + 1; q < Q; q++) {
                __m256 p = _mm256_set1_ps(scores[q * ss + j]);
                for (int c = 0; c < W; c++) o[q][c] = _mm256_fmadd_ps(p, v[c], o[q][c]);
            }
    }
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < W; c++) _mm256_storeu_ps(out + q * os + i + 8 * c, o[q][c]);
}

/* Up to 4 queries of one sequence, rows q_stride apart in q and out from
 * head h: (step 1) positions pos..pos+Q-1 of head h, or (step 0, q_stride
 * hd) heads h..h+Q-1 of one KV head at pos. Each the same bits as alone: the
 * keys scored four at a time for every query while they are in L1, the
 * values read once for the tile (one query: 32 outputs a pass, a tile:
 * 16, within 16 registers). */
INLINE void attention_tile(int Q, float *out, const float *q, size_t q_stride, const void *k_cache,
                           const void *v_cache, const int *blocks, int pos, int h, int n_heads, int n_kv, int hd,
                           float *scores, size_t ss, int kv16, int step) {
    int kvh = h / (n_heads / n_kv), kv_dim = n_kv * hd, n0 = pos + 1;
    const void *kb = kv_elems(k_cache, (size_t)kvh * hd, kv16), *vb = kv_elems(v_cache, (size_t)kvh * hd, kv16);
    float scale = 1.0f / sqrtf((float)hd);
    tile_scores(Q, q, q_stride, kb, blocks, n0, h, hd, kv_dim, scale, scores, ss, kv16, step);
    float *oh = out + (size_t)h * hd;
    int i = 0, lanes = hd / 8 * 8; /* outputs past `lanes` are summed as scalars, as one query's are */
    if (Q == 1)
        for (; i + 32 <= lanes; i += 32) values_tile(1, 4, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step);
    for (; i + 16 <= lanes; i += 16) switch (Q) { /* constant tile heights, unrolled */
        case 4: values_tile(4, 2, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        case 3: values_tile(3, 2, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        case 2: values_tile(2, 2, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        default: values_tile(1, 2, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step); break;
        }
    for (int t = 0; t < Q; t++) { /* the last 8 lanes and the scalar outputs, one query at a time */
        const float *p = scores + t * ss;
        float *ot = oh + t * q_stride;
        int n = n0 + t * step;
        for (int r = i; r + 8 <= lanes; r += 8) {
            __m256 o = _mm256_setzero_ps();
            for (int j = 0; j < n; j++)
                o = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), kv_load8(vb, cpu_kv_row(blocks, j) * kv_dim + r, kv16), o);
            _mm256_storeu_ps(ot + r, o);
        }
        values_scalar(ot, p, n, vb, blocks, kv_dim, lanes, hd, kv16);
    }
}

ATTENTION_ROWS_FUNCTION(avx2_attention_rows, float, 0)
ATTENTION_ROWS_FUNCTION(avx2_attention_rows_bf16, bf16, 1)

ATTENTION_HEAD_FUNCTION(avx2_attention_head)

static void avx2_swiglu(float *g, const float *u, int n) {
    int i = 0;
    __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* The f32 kernels of both AVX2 levels. */
#define AVX2_OPS                                                                                                      \
    .matmul_bf16 = avx2_matmul_bf16, .row_block = 8, .rmsnorm = avx2_rmsnorm, .rope = avx2_rope,                   \
    .attention_head = avx2_attention_head, .attention_rows = avx2_attention_rows,                                  \
    .attention_rows_bf16 = avx2_attention_rows_bf16, .swiglu = avx2_swiglu, .quantize_q8 = cpu_quantize_q8_avx2

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    AVX2_OPS,
    .dot_q = cpu_dot_q_avx2,
    .rows_q = cpu_rows_q_avx2,
};

const cpu_kernels cpu_kernels_avx2vnni = {
    .name = "avx2vnni",
    AVX2_OPS,
    .dot_q = cpu_dot_q_avx2vnni, /* quant_avx2.c compiled with AVX-VNNI (quant_avx2vnni.c) */
    .rows_q = cpu_rows_q_avx2vnni,
};
