#include "ops.h"

#include <math.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

void cpu_embed(float *out, const bf16 *table, int token, int hidden) {
    const bf16 *row = table + (size_t)token * hidden;
    for (int i = 0; i < hidden; i++) out[i] = bf16_to_f32(row[i]);
}

void cpu_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = bf16_to_f32(w[i]) * (x[i] * inv);
}

/* Up to TB tokens share each pass over a weight row, so a row is read from
 * memory once per TB tokens; decode (T = 1) is a pure streaming GEMV. */
#define TB 8

#if defined(__AVX512F__)
static inline __m512 load16_bf16(const bf16 *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

static void dot_rows(float *acc, const float *x, const bf16 *wr, int nt, int cols) {
    int j = 0;
#if defined(__AVX512F__)
    __m512 v[TB];
    for (int t = 0; t < nt; t++) v[t] = _mm512_setzero_ps();
    for (; j + 16 <= cols; j += 16) {
        __m512 wv = load16_bf16(wr + j);
        for (int t = 0; t < nt; t++) v[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)t * cols + j), v[t]);
    }
    for (int t = 0; t < nt; t++) acc[t] = _mm512_reduce_add_ps(v[t]);
#else
    for (int t = 0; t < nt; t++) acc[t] = 0.0f;
#endif
    for (; j < cols; j++) {
        float wj = bf16_to_f32(wr[j]);
        for (int t = 0; t < nt; t++) acc[t] += wj * x[(size_t)t * cols + j];
    }
}

/* Row r of y for tokens t_begin..t_end-1, TB tokens per pass over the row. */
static void matmul_row_tokens(float *y, const float *x, const bf16 *w, const bf16 *bias, int t_begin, int t_end,
                              int rows, int cols, int r, int accumulate) {
    const bf16 *wr = w + (size_t)r * cols;
    float b = bias ? bf16_to_f32(bias[r]) : 0.0f;
    for (int t0 = t_begin; t0 < t_end; t0 += TB) {
        int nt = t_end - t0 < TB ? t_end - t0 : TB;
        float acc[TB];
        dot_rows(acc, x + (size_t)t0 * cols, wr, nt, cols);
        for (int t = 0; t < nt; t++) {
            float *dst = &y[(size_t)(t0 + t) * rows + r];
            *dst = accumulate ? *dst + (acc[t] + b) : acc[t] + b;
        }
    }
}

#if defined(__AVX512F__)
/* Decode (one token): four rows at a time, four independent streams from
 * memory with their own accumulators; one core keeps more loads in flight. */
static void gemv4(float *y, const float *x, const bf16 *w, const bf16 *bias, int r, int cols, int accumulate) {
    const bf16 *w0 = w + (size_t)r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= cols; j += 16) {
        __m512 xv = _mm512_loadu_ps(x + j);
        a0 = _mm512_fmadd_ps(load16_bf16(w0 + j), xv, a0);
        a1 = _mm512_fmadd_ps(load16_bf16(w1 + j), xv, a1);
        a2 = _mm512_fmadd_ps(load16_bf16(w2 + j), xv, a2);
        a3 = _mm512_fmadd_ps(load16_bf16(w3 + j), xv, a3);
    }
    float acc[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                    _mm512_reduce_add_ps(a3)};
    const bf16 *rows4[4] = {w0, w1, w2, w3};
    for (int k = 0; k < 4; k++) {
        for (int jj = j; jj < cols; jj++) acc[k] += bf16_to_f32(rows4[k][jj]) * x[jj];
        float b = bias ? bf16_to_f32(bias[r + k]) : 0.0f;
        y[r + k] = accumulate ? y[r + k] + (acc[k] + b) : acc[k] + b;
    }
}
#endif

#if defined(__AVX512F__)
/* Prefill: a 4-row x 4-token tile of y in 16 accumulators, so each weight
 * load serves four tokens and each activation load four rows. */
static void tile4x4(float *y, const float *x, const bf16 *w, const bf16 *bias, int t0, int r0, int rows, int cols,
                    int accumulate) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 4; t++) acc[i][t] = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= cols; j += 16) {
        __m512 wv[4], xv[4];
        for (int i = 0; i < 4; i++) wv[i] = load16_bf16(w + (size_t)(r0 + i) * cols + j);
        for (int t = 0; t < 4; t++) xv[t] = _mm512_loadu_ps(x + (size_t)(t0 + t) * cols + j);
        for (int i = 0; i < 4; i++)
            for (int t = 0; t < 4; t++) acc[i][t] = _mm512_fmadd_ps(wv[i], xv[t], acc[i][t]);
    }
    for (int i = 0; i < 4; i++) {
        const bf16 *wr = w + (size_t)(r0 + i) * cols;
        float b = bias ? bf16_to_f32(bias[r0 + i]) : 0.0f;
        for (int t = 0; t < 4; t++) {
            float sum = _mm512_reduce_add_ps(acc[i][t]);
            for (int jj = j; jj < cols; jj++) sum += bf16_to_f32(wr[jj]) * x[(size_t)(t0 + t) * cols + jj];
            float *dst = &y[(size_t)(t0 + t) * rows + r0 + i];
            *dst = accumulate ? *dst + (sum + b) : sum + b;
        }
    }
}
#endif

void cpu_matmul(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
                int accumulate, int n_threads) {
#if defined(__AVX512F__)
    if (T >= 4) {
        int T4 = T / 4 * 4, R4 = rows / 4 * 4;
#pragma omp parallel for num_threads(n_threads) schedule(static)
        for (int g = 0; g < R4 / 4; g++) {
            for (int t0 = 0; t0 < T4; t0 += 4) tile4x4(y, x, w, bias, t0, 4 * g, rows, cols, accumulate);
            for (int r = 4 * g; r < 4 * g + 4 && T4 < T; r++) /* tokens past the last full tile */
                matmul_row_tokens(y, x, w, bias, T4, T, rows, cols, r, accumulate);
        }
        for (int r = R4; r < rows; r++) matmul_row_tokens(y, x, w, bias, 0, T, rows, cols, r, accumulate);
        return;
    }
    if (T == 1) {
#pragma omp parallel for num_threads(n_threads) schedule(static)
        for (int g = 0; g < rows / 4; g++) gemv4(y, x, w, bias, 4 * g, cols, accumulate);
        for (int r = rows / 4 * 4; r < rows; r++) matmul_row_tokens(y, x, w, bias, 0, 1, rows, cols, r, accumulate);
        return;
    }
#endif
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int r = 0; r < rows; r++) matmul_row_tokens(y, x, w, bias, 0, T, rows, cols, r, accumulate);
}

void cpu_rope_angles(float *cs, float *sn, const float *inv_freq, int half, int pos) {
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        cs[i] = (float)cos((double)angle);
        sn[i] = (float)sin((double)angle);
    }
}

void cpu_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

void cpu_attention_head(float *out, const float *q, const float *k_cache, const float *v_cache, int pos, int h,
                        int n_heads, int n_kv, int hd, float *scores) {
    int kvh = h / (n_heads / n_kv), kv_dim = n_kv * hd;
    const float *qh = q + (size_t)h * hd;
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        const float *kj = k_cache + (size_t)j * kv_dim + (size_t)kvh * hd;
        float s = 0.0f;
        for (int i = 0; i < hd; i++) s += qh[i] * kj[i];
        scores[j] = s * scale;
        if (scores[j] > mx) mx = scores[j];
    }
    float sum = 0.0f;
    for (int j = 0; j <= pos; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    float *oh = out + (size_t)h * hd;
    for (int i = 0; i < hd; i++) oh[i] = 0.0f;
    for (int j = 0; j <= pos; j++) {
        const float *vj = v_cache + (size_t)j * kv_dim + (size_t)kvh * hd;
        float p = scores[j] / sum;
        for (int i = 0; i < hd; i++) oh[i] += p * vj[i];
    }
}

void cpu_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

void cpu_swiglu(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_route(const float *logits, int n, int k, int norm, int *idx, float *weight) {
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < n; e++) mx = logits[e] > mx ? logits[e] : mx;
    /* Probabilities are only compared and summed over the top k: keep them
     * in the selection loop rather than a buffer. */
    for (int e = 0; e < n; e++) sum += expf(logits[e] - mx);
    int picked = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < picked; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        idx[picked] = best;
        weight[picked++] = expf(logits[best] - mx) / sum;
    }
    if (norm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += weight[j];
        for (int j = 0; j < k; j++) weight[j] /= s;
    }
    for (int j = 1; j < k; j++) /* ascending expert index: the order transformers sums them in */
        for (int i = j; i > 0 && idx[i] < idx[i - 1]; i--) {
            int ti = idx[i];
            idx[i] = idx[i - 1];
            idx[i - 1] = ti;
            float tw = weight[i];
            weight[i] = weight[i - 1];
            weight[i - 1] = tw;
        }
}
