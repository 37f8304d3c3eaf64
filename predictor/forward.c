/* CPU reference of the predictor network, following PyTorch's modules:
 *   tok = q_proj(H)                                  [T, d]
 *   x   = MultiheadAttention(layer_emb, tok, tok)    [D, d]   (no residual, no norm)
 *   x   = 2 x TransformerEncoderLayer(x)  post-norm: x = LN1(x + SA(x)); x = LN2(x + W2 relu(W1 x))
 *   seg = seg_head(x) [D], op = op_head(x) [D, 3]
 * f32 throughout; LayerNorm eps 1e-5 as PyTorch's default. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "predictor.h"

#define LN_EPS 1e-5f

/* y[n, rows] = x[n, cols] . W[rows, cols]^T + b */
static void linear(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols;
            float acc = 0.0f;
            for (int c = 0; c < cols; c++) acc += wr[c] * xt[c];
            y[(size_t)t * rows + r] = acc + (b ? b[r] : 0.0f);
        }
    }
}

/* Multi-head attention of nq queries over nk keys (inputs already in d
 * space): q/k/v projections, per-head softmax(q k^T / sqrt(dh)) v, output
 * projection. scratch holds (nq + 2 nk) * d + nq * heads * nk floats. */
static void mha(float *out, const float *query, int nq, const float *key, int nk, const pred_mha *w, int d, int heads,
                float *scratch) {
    float *q = scratch, *k = q + (size_t)nq * d, *v = k + (size_t)nk * d, *att = v + (size_t)nk * d;
    linear(q, query, w->in_w, w->in_b, nq, d, d);
    linear(k, key, w->in_w + (size_t)d * d, w->in_b + d, nk, d, d);
    linear(v, key, w->in_w + (size_t)2 * d * d, w->in_b + 2 * d, nk, d, d);
    int dh = d / heads;
    float scale = 1.0f / sqrtf((float)dh);
    float *ctx = q; /* each query row is read before its context overwrites it */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < nq * heads; i++) {
        int qi = i / heads, h = i % heads;
        float *p = att + (size_t)i * nk;
        const float *qv = q + (size_t)qi * d + (size_t)h * dh;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < nk; j++) {
            float s = 0.0f;
            for (int c = 0; c < dh; c++) s += qv[c] * k[(size_t)j * d + (size_t)h * dh + c];
            p[j] = s * scale;
            mx = fmaxf(mx, p[j]);
        }
        for (int j = 0; j < nk; j++) sum += (p[j] = expf(p[j] - mx));
        float o[1024];
        for (int c = 0; c < dh; c++) o[c] = 0.0f;
        for (int j = 0; j < nk; j++)
            for (int c = 0; c < dh; c++) o[c] += p[j] / sum * v[(size_t)j * d + (size_t)h * dh + c];
        /* each head reads and writes only its own slice of the query's row */
        memcpy(ctx + (size_t)qi * d + (size_t)h * dh, o, (size_t)dh * sizeof *o);
    }
    linear(out, ctx, w->out_w, w->out_b, nq, d, d);
}

static void layer_norm(float *x, const float *w, const float *b, int d) {
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < d; i++) mean += x[i];
    mean /= (float)d;
    for (int i = 0; i < d; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)d;
    float inv = 1.0f / sqrtf(var + LN_EPS);
    for (int i = 0; i < d; i++) x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

polar_status polar_predict_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op,
                                  polar_error *err) {
    if (!p || !h || !seg || !op) return polar_fail(err, POLAR_ERR_ARG, "predict: missing argument");
    if (T < 1 || T > PRED_MAX_TOKENS)
        return polar_fail(err, POLAR_ERR_ARG, "predict: %d token states (1 to %d)", T, PRED_MAX_TOKENS);
    if (p->d / p->heads > 1024) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "predict: head width above 1024");
    if (p->cuda) return pred_cuda_logits(p, h, T, seg, op, err);
    int D = p->D, d = p->d, ff = p->ff;
    int n = T > D ? T : D;
    size_t need = (size_t)T * d + 2 * (size_t)D * d + (size_t)D * ff + (size_t)(D + 2 * n) * d +
                  (size_t)D * p->heads * n;
    float *mem = malloc(need * sizeof *mem);
    if (!mem) return polar_fail(err, POLAR_ERR_NOMEM, "predict: out of memory");
    float *tok = mem, *x = tok + (size_t)T * d, *y = x + (size_t)D * d, *hid = y + (size_t)D * d,
          *scratch = hid + (size_t)D * ff;
    linear(tok, h, p->q_proj_w, p->q_proj_b, T, d, p->dq);
    mha(x, p->layer_emb, D, tok, T, &p->cross, d, p->heads, scratch);
    for (int b = 0; b < PRED_BLOCKS; b++) {
        const pred_block *k = &p->blocks[b];
        mha(y, x, D, x, D, &k->attn, d, p->heads, scratch);
        for (int i = 0; i < D; i++) {
            for (int c = 0; c < d; c++) x[(size_t)i * d + c] += y[(size_t)i * d + c];
            layer_norm(x + (size_t)i * d, k->norm1_w, k->norm1_b, d);
        }
        linear(hid, x, k->lin1_w, k->lin1_b, D, ff, d);
        for (size_t i = 0; i < (size_t)D * ff; i++) hid[i] = hid[i] > 0.0f ? hid[i] : 0.0f;
        linear(y, hid, k->lin2_w, k->lin2_b, D, d, ff);
        for (int i = 0; i < D; i++) {
            for (int c = 0; c < d; c++) x[(size_t)i * d + c] += y[(size_t)i * d + c];
            layer_norm(x + (size_t)i * d, k->norm2_w, k->norm2_b, d);
        }
    }
    linear(seg, x, p->seg_w, p->seg_b, D, 1, d);
    linear(op, x, p->op_w, p->op_b, D, 3, d);
    free(mem);
    return POLAR_OK;
}
