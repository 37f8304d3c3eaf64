/* NEON kernels (aarch64, where NEON is baseline), 4 f32 lanes. Built only
 * for aarch64 targets; the same algorithms as ops_avx2.c. */
#include <arm_neon.h>
#include <math.h>

#include "attention_rows.h"
#include "kernels.h"

#define INLINE static inline __attribute__((always_inline))

/* bf16 is the top half of an f32: widen 4 of them with a 16-bit shift. */
INLINE float32x4_t load4_bf16(const bf16 *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

/* The lanes summed in a fixed order: (0 + 1) + (2 + 3). */
INLINE float hsum4(float32x4_t v) { return vaddvq_f32(v); }

/* e^x as exp8 in ops_avx2.c: n ln2 + r, Taylor to r^7, 2^n in the exponent
 * field, x clamped to [-87.33, 88.37] so n is a normal exponent (FMAX and
 * FMIN return NaN when an input is NaN). */
INLINE float32x4_t exp4(float32x4_t x) {
    x = vminq_f32(vdupq_n_f32(88.37f), vmaxq_f32(vdupq_n_f32(-87.33f), x));
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f)); /* ln2 in two parts: n * hi is exact */
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* An R-row x NT-token tile of y: one accumulator per output element, fed 4
 * columns at a time, then hsum4 and the scalar tail, in every tile shape
 * (decode and prefill agree bit for bit). next: the R rows to prefetch
 * while these stream (decode), or NULL. R * NT <= 16 of the 32 registers. */
INLINE void tile(float *y, const float *x, const bf16 *w, const bf16 *bias, int rows, int cols, int accumulate, int r,
                 int t0, const int R, const int NT, const bf16 *next) {
    float32x4_t acc[8][4];
    for (int i = 0; i < R; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = vdupq_n_f32(0.0f);
    const float *xt = x + (size_t)t0 * cols;
    const bf16 *wr = w + (size_t)r * cols;
    int j = 0;
    for (; j + 4 <= cols; j += 4) {
        float32x4_t xv[4];
        for (int t = 0; t < NT; t++) xv[t] = vld1q_f32(xt + (size_t)t * cols + j);
        if (next && (j & 31) == 0) /* a line of each of the next R rows */
            for (int i = 0; i < R; i++) __builtin_prefetch(next + (size_t)i * cols + j);
        for (int i = 0; i < R; i++) {
            float32x4_t wv = load4_bf16(wr + (size_t)i * cols + j);
            for (int t = 0; t < NT; t++) acc[i][t] = vfmaq_f32(acc[i][t], wv, xv[t]);
        }
    }
    for (int i = 0; i < R; i++) {
        float b = bias ? bf16_to_f32(bias[r + i]) : 0.0f;
        for (int t = 0; t < NT; t++) {
            float s = hsum4(acc[i][t]);
            for (int jj = j; jj < cols; jj++) s += bf16_to_f32(wr[(size_t)i * cols + jj]) * xt[(size_t)t * cols + jj];
            float *dst = &y[(size_t)(t0 + t) * rows + r + i];
            *dst = accumulate ? *dst + (s + b) : s + b;
        }
    }
}

/* Decode: 8 rows per pass, the next 8 prefetched (as in ops_avx2.c, where
 * it was measured). Prefill: 4 rows x 4 tokens. */
static void neon_matmul_bf16(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
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

static void neon_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        acc = vfmaq_f32(acc, v, v);
    }
    float ss = hsum4(acc);
    for (; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    float32x4_t iv = vdupq_n_f32(inv);
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(out + i, vmulq_f32(load4_bf16(w + i), vmulq_f32(vld1q_f32(x + i), iv)));
    for (; i < n; i++) out[i] = bf16_to_f32(w[i]) * (x[i] * inv);
}

/* Multiplies and subtracts as ops.c writes them (no FMA): the same bits. */
static void neon_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 4 <= half; i += 4) {
            float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + i + half);
            float32x4_t c = vld1q_f32(cs + i), s = vld1q_f32(sn + i);
            vst1q_f32(v + i, vsubq_f32(vmulq_f32(a, c), vmulq_f32(b, s)));
            vst1q_f32(v + i + half, vaddq_f32(vmulq_f32(b, c), vmulq_f32(a, s)));
        }
        for (; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

/* 4 K/V values from element i of rows (kv16: bf16 rows). */
INLINE float32x4_t kv_load4(const void *rows, size_t i, int kv16) {
    return kv16 ? load4_bf16((const bf16 *)rows + i) : vld1q_f32((const float *)rows + i);
}

INLINE float dot(const float *a, const void *b, int n, int kv16) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), kv_load4(b, i, kv16));
    float s = hsum4(acc);
    for (; i < n; i++) s += a[i] * kv_scalar(b, i, kv16);
    return s;
}

/* Scores of one query against the 4 keys from row k0 (rows kv_dim
 * apart): four independent FMA chains. */
INLINE void four_scores(float *scores, const float *qh, const void *k0, int hd, int kv_dim, float scale, int kv16) {
    size_t r1 = (size_t)kv_dim, r2 = 2 * r1, r3 = 3 * r1;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 4 <= hd; i += 4) {
        float32x4_t qv = vld1q_f32(qh + i);
        a0 = vfmaq_f32(a0, qv, kv_load4(k0, i, kv16));
        a1 = vfmaq_f32(a1, qv, kv_load4(k0, r1 + i, kv16));
        a2 = vfmaq_f32(a2, qv, kv_load4(k0, r2 + i, kv16));
        a3 = vfmaq_f32(a3, qv, kv_load4(k0, r3 + i, kv16));
    }
    float s[4] = {hsum4(a0), hsum4(a1), hsum4(a2), hsum4(a3)};
    for (int u = 0; u < 4; u++) {
        for (int ii = i; ii < hd; ii++) s[u] += qh[ii] * kv_scalar(k0, (size_t)u * kv_dim + ii, kv16);
        scores[u] = s[u] * scale;
    }
}

/* scores[0..n) of one query -> their softmax. */
INLINE void softmax_scores(float *scores, int n) {
    float mx = -INFINITY;
    int j;
    for (j = 0; j < n; j++) mx = scores[j] > mx ? scores[j] : mx;
    float32x4_t mv = vdupq_n_f32(mx), sv = vdupq_n_f32(0.0f);
    for (j = 0; j + 4 <= n; j += 4) {
        float32x4_t e = exp4(vsubq_f32(vld1q_f32(scores + j), mv));
        vst1q_f32(scores + j, e);
        sv = vaddq_f32(sv, e);
    }
    float sum = hsum4(sv);
    for (; j < n; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    for (j = 0; j < n; j++) scores[j] /= sum;
}

TILE_SCORES_BY_FOURS_FUNCTION

/* out_q[i..i+16) = sum_j p_qj v_j for Q queries, query q over keys
 * 0..n0+q*step-1 (probabilities at scores + q * ss): each V row loaded once for
 * the tile, the sums in registers, j ascending for every output lane as
 * for one query alone. */
INLINE void values16(int Q, float *out, size_t os, const void *vb, const int *blocks, int n0, int kv_dim, int i,
                     const float *scores, size_t ss, int kv16, int step) {
    float32x4_t o[ATTENTION_QUERIES][4];
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < 4; c++) o[q][c] = vdupq_n_f32(0.0f);
    for (int j = 0; j < n0 + (Q - 1) * step; j++) { /* keys past n0: only the later queries */
        const void *vj = kv_elems(vb, cpu_kv_row(blocks, j) * kv_dim + i, kv16);
        float32x4_t v[4] = {kv_load4(vj, 0, kv16), kv_load4(vj, 4, kv16), kv_load4(vj, 8, kv16), kv_load4(vj, 12, kv16)};
        for (int q = j < n0 ? 0 : j - n0 + 1; q < Q; q++) {
            float32x4_t p = vdupq_n_f32(scores[q * ss + j]);
            for (int c = 0; c < 4; c++) o[q][c] = vfmaq_f32(o[q][c], p, v[c]);
        }
    }
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < 4; c++) vst1q_f32(out + q * os + i + 4 * c, o[q][c]);
}

/* Up to 4 queries of one sequence, rows q_stride apart in q and out from
 * head h: (step 1) positions pos..pos+Q-1 of head h, or (step 0, q_stride
 * hd) heads h..h+Q-1 of one KV head at pos. Each the same bits as alone: the
 * keys scored four at a time for every query while they are in L1, the
 * values read once for the tile. */
INLINE void attention_tile(int Q, float *out, const float *q, size_t q_stride, const void *k_cache,
                           const void *v_cache, const int *blocks, int pos, int h, int n_heads, int n_kv, int hd,
                           float *scores, size_t ss, int kv16, int step) {
    int kvh = h / (n_heads / n_kv), kv_dim = n_kv * hd, n0 = pos + 1;
    const void *kb = kv_elems(k_cache, (size_t)kvh * hd, kv16), *vb = kv_elems(v_cache, (size_t)kvh * hd, kv16);
    float scale = 1.0f / sqrtf((float)hd);
    tile_scores(Q, q, q_stride, kb, blocks, n0, h, hd, kv_dim, scale, scores, ss, kv16, step);
    float *oh = out + (size_t)h * hd;
    int i = 0;
    for (; i + 16 <= hd; i += 16) values16(Q, oh, q_stride, vb, blocks, n0, kv_dim, i, scores, ss, kv16, step);
    for (int t = 0; t < Q; t++) { /* the last 4-lane groups and the scalar outputs, one query at a time */
        const float *p = scores + t * ss;
        float *ot = oh + t * q_stride;
        int n = n0 + t * step, r = i;
        for (; r + 4 <= hd; r += 4) {
            float32x4_t o = vdupq_n_f32(0.0f);
            for (int j = 0; j < n; j++)
                o = vfmaq_f32(o, vdupq_n_f32(p[j]), kv_load4(vb, cpu_kv_row(blocks, j) * kv_dim + r, kv16));
            vst1q_f32(ot + r, o);
        }
        values_scalar(ot, p, n, vb, blocks, kv_dim, r, hd, kv16);
    }
}

ATTENTION_ROWS_FUNCTION(neon_attention_rows, float, 0)
ATTENTION_ROWS_FUNCTION(neon_attention_rows_bf16, bf16, 1)

ATTENTION_HEAD_FUNCTION(neon_attention_head)

static void neon_swiglu(float *g, const float *u, int n) {
    int i = 0;
    float32x4_t one = vdupq_n_f32(1.0f);
    for (; i + 4 <= n; i += 4) {
        float32x4_t gv = vld1q_f32(g + i);
        float32x4_t e = exp4(vnegq_f32(gv));
        vst1q_f32(g + i, vmulq_f32(vdivq_f32(gv, vaddq_f32(one, e)), vld1q_f32(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

const cpu_kernels cpu_kernels_neon = {
    .name = "neon",
    .matmul_bf16 = neon_matmul_bf16,
    .row_block = 8,
    .rmsnorm = neon_rmsnorm,
    .rope = neon_rope,
    .attention_head = neon_attention_head,
    .attention_rows = neon_attention_rows,
    .attention_rows_bf16 = neon_attention_rows_bf16,
    .swiglu = neon_swiglu,
    .dot_q = cpu_dot_q_neon,
    .rows_q = cpu_rows_q_neon,
    .quantize_q8 = cpu_quantize_q8,
};
