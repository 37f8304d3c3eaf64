/* The plain C kernels: the oracle every SIMD level is tested against, and
 * the level that runs where no SIMD one applies. */
#include "ops.h"

#include <math.h>

#include "kernels.h"

void cpu_embed(float *out, const bf16 *table, int token, int hidden) {
    const bf16 *row = table + (size_t)token * hidden;
    for (int i = 0; i < hidden; i++) out[i] = bf16_to_f32(row[i]);
}

static void generic_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = bf16_to_f32(w[i]) * (x[i] * inv);
}

static inline void put(float *dst, float s, float b, int accumulate) { *dst = accumulate ? *dst + (s + b) : s + b; }

/* Each output is one sum run front to back over the columns. Four sums per
 * pass (four tokens of a row, or for decode four rows) so the adds do not
 * wait on one another; the row is read from memory once for all tokens. */
static void generic_matmul_bf16(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
                                int accumulate, int r0, int r1) {
    int r = r0;
    for (; T == 1 && r + 4 <= r1; r += 4) {
        const bf16 *w0 = w + (size_t)r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int j = 0; j < cols; j++) {
            s0 += bf16_to_f32(w0[j]) * x[j];
            s1 += bf16_to_f32(w1[j]) * x[j];
            s2 += bf16_to_f32(w2[j]) * x[j];
            s3 += bf16_to_f32(w3[j]) * x[j];
        }
        const float s[4] = {s0, s1, s2, s3};
        for (int i = 0; i < 4; i++) put(&y[r + i], s[i], bias ? bf16_to_f32(bias[r + i]) : 0.0f, accumulate);
    }
    for (; r < r1; r++) {
        const bf16 *wr = w + (size_t)r * cols;
        float b = bias ? bf16_to_f32(bias[r]) : 0.0f;
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *x0 = x + (size_t)t * cols, *x1 = x0 + cols, *x2 = x1 + cols, *x3 = x2 + cols;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (int j = 0; j < cols; j++) {
                float wj = bf16_to_f32(wr[j]);
                s0 += wj * x0[j];
                s1 += wj * x1[j];
                s2 += wj * x2[j];
                s3 += wj * x3[j];
            }
            put(&y[(size_t)t * rows + r], s0, b, accumulate);
            put(&y[(size_t)(t + 1) * rows + r], s1, b, accumulate);
            put(&y[(size_t)(t + 2) * rows + r], s2, b, accumulate);
            put(&y[(size_t)(t + 3) * rows + r], s3, b, accumulate);
        }
        for (; t < T; t++) {
            const float *xt = x + (size_t)t * cols;
            float s = 0.0f;
            for (int j = 0; j < cols; j++) s += bf16_to_f32(wr[j]) * xt[j];
            put(&y[(size_t)t * rows + r], s, b, accumulate);
        }
    }
}

void cpu_rope_angles(float *cs, float *sn, const float *inv_freq, float scale, int half, int pos) {
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        cs[i] = (float)cos((double)angle) * scale;
        sn[i] = (float)sin((double)angle) * scale;
    }
}

static void generic_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim) {
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

/* The oracle's attention of one query, over f32 rows or (kv16) bf16 ones. */
static inline void attention_one(float *out, const float *q, const void *k_cache, const void *v_cache,
                                 const int *blocks, int pos, int h, int n_heads, int n_kv, int hd, float *scores,
                                 int kv16) {
    int kvh = h / (n_heads / n_kv), kv_dim = n_kv * hd;
    const float *qh = q + (size_t)h * hd;
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        size_t kj = cpu_kv_row(blocks, j) * kv_dim + (size_t)kvh * hd;
        float s = 0.0f;
        for (int i = 0; i < hd; i++) s += qh[i] * kv_scalar(k_cache, kj + i, kv16);
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
        size_t vj = cpu_kv_row(blocks, j) * kv_dim + (size_t)kvh * hd;
        float p = scores[j] / sum;
        for (int i = 0; i < hd; i++) oh[i] += p * kv_scalar(v_cache, vj + i, kv16);
    }
}

static void generic_attention_head(float *out, const float *q, const float *k_cache, const float *v_cache,
                                   const int *blocks, int pos, int h, int n_heads, int n_kv, int hd, float *scores) {
    attention_one(out, q, k_cache, v_cache, blocks, pos, h, n_heads, n_kv, hd, scores, 0);
}

/* The oracle's attention_rows: query by query, head by head. */
static inline void attention_queries(float *out, const float *q, size_t q_stride, int n_q, const void *k_cache,
                                     const void *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads,
                                     int n_kv, int hd, float *scores, int kv16) {
    for (int h = h0; h < h0 + n_h; h++)
        for (int t = 0; t < n_q; t++)
            attention_one(out + t * q_stride, q + t * q_stride, k_cache, v_cache, blocks, pos + t, h, n_heads, n_kv, hd,
                          scores, kv16);
}

static void generic_attention_rows(float *out, const float *q, size_t q_stride, int n_q, const float *k_cache,
                                   const float *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads,
                                   int n_kv, int hd, float *scores, size_t scores_stride) {
    attention_queries(out, q, q_stride, n_q, k_cache, v_cache, blocks, pos, h0, n_h, n_heads, n_kv, hd, scores, 0);
}

static void generic_attention_rows_bf16(float *out, const float *q, size_t q_stride, int n_q, const bf16 *k_cache,
                                        const bf16 *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads,
                                        int n_kv, int hd, float *scores, size_t scores_stride) {
    attention_queries(out, q, q_stride, n_q, k_cache, v_cache, blocks, pos, h0, n_h, n_heads, n_kv, hd, scores, 1);
}

void cpu_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

static void generic_swiglu(float *g, const float *u, int n) {
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

/* The plain C table; the reference level is the same kernels with quantized
 * weights met by f32 activations (quant.c's rows_f32). */
#define GENERIC_KERNELS                                                                                              \
    .matmul_bf16 = generic_matmul_bf16, .row_block = 4, .rmsnorm = generic_rmsnorm, .rope = generic_rope,            \
    .attention_head = generic_attention_head, .attention_rows = generic_attention_rows,                              \
    .attention_rows_bf16 = generic_attention_rows_bf16, .swiglu = generic_swiglu, .dot_q = cpu_dot_q_generic,        \
    .rows_q = cpu_rows_q_generic, .quantize_q8 = cpu_quantize_q8

const cpu_kernels cpu_kernels_generic = {.name = "generic", GENERIC_KERNELS};
const cpu_kernels cpu_kernels_reference = {.name = "reference", GENERIC_KERNELS, .f32_activations = 1};
