/* Training ops of the predictor: each forward keeps what its backward needs,
 * each backward accumulates (+=) into the gradients it is given, so an input
 * used twice (self-attention's q, k and v, a residual) just receives twice.
 * Single-threaded, but for the linear forward and attention without dropout
 * (below): the trainer runs one example per thread. f32 storage; the linear
 * ops' products in train_gemm.c, the rest vectorised with `omp simd`. */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "train.h"

#define PARALLEL_MIN_MACS (1 << 18) /* smaller products cost less than waking the threads */

/* Inside an active parallel region (the trainer's, over examples) the ops
 * below stay on the calling thread, nesting allowed or not. */
static int in_parallel(void) {
#ifdef _OPENMP
    return omp_in_parallel();
#else
    return 0;
#endif
}

/* y[n, rows] = x[n, cols] . W[rows, cols]^T + b, the inputs split across the
 * OpenMP threads: the predictor's inference (one example) uses them all. An
 * output's sum is the same whichever thread makes it. */
void tr_linear_fwd(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols) {
    const tr_gemm *g = tr_gemm_active();
#pragma omp parallel if ((double)n * rows * cols >= PARALLEL_MIN_MACS && n > 1 && !in_parallel())
    {
        int threads = 1, id = 0;
#ifdef _OPENMP
        threads = omp_get_num_threads(), id = omp_get_thread_num();
#endif
        int t0 = (int)((long)n * id / threads), t1 = (int)((long)n * (id + 1) / threads);
        if (t1 > t0) g->nt(y + (size_t)t0 * rows, x + (size_t)t0 * cols, w, b, t1 - t0, rows, cols);
    }
}

/* dx[n, cols] += dy[n, rows] . W; dW[rows, cols] += dy^T . x; db[rows] += sum_t dy.
 * dx may be NULL (the input is data, not a result). */
void tr_linear_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int n, int rows,
                   int cols) {
    const tr_gemm *g = tr_gemm_active();
    if (dx) g->nn(dx, cols, dy, rows, 1, w, cols, n, rows, cols);
    g->nn(dw, cols, dy, 1, rows, x, cols, rows, n, cols);
    if (db)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) db[r] += dy[(size_t)t * rows + r];
}

/* Dropout with probability p (PyTorch's: kept values scaled by 1/(1-p)).
 * keep[n] records the mask; p == 0 keeps everything and draws nothing. */
void tr_dropout_fwd(float *y, unsigned char *keep, const float *x, size_t n, float p, polar_rng *rng) {
    float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    for (size_t i = 0; i < n; i++) {
        keep[i] = p > 0.0f ? polar_rng_uniform(rng) >= p : 1;
        y[i] = keep[i] ? x[i] * scale : 0.0f;
    }
}

/* dx[n] += dy * keep / (1 - p) */
void tr_dropout_bwd(float *dx, const float *dy, const unsigned char *keep, size_t n, float p) {
    float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    for (size_t i = 0; i < n; i++)
        if (keep[i]) dx[i] += dy[i] * scale;
}

/* In place; the output alone tells where the input was positive. */
void tr_relu_fwd(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* dh[n] *= (y > 0), y the ReLU's output */
void tr_relu_bwd(float *dh, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(y[i] > 0.0f)) dh[i] = 0.0f;
}

/* y[n, d] = (x - mean) / sqrt(var + eps) * w + b per row (biased variance,
 * PyTorch's LayerNorm); mean[n], rstd[n] kept. */
void tr_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b, int n, int d) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * d;
        float *yt = y + (size_t)t * d;
        float m = 0.0f, v = 0.0f;
        for (int i = 0; i < d; i++) m += xt[i];
        m /= (float)d;
        for (int i = 0; i < d; i++) v += (xt[i] - m) * (xt[i] - m);
        v /= (float)d;
        float r = 1.0f / sqrtf(v + TR_LN_EPS);
        for (int i = 0; i < d; i++) yt[i] = (xt[i] - m) * r * w[i] + b[i];
        mean[t] = m;
        rstd[t] = r;
    }
}

/* With xh = (x - mean) rstd and g = dy * w:
 * dx += rstd (g - mean(g) - xh mean(g xh)); dw += dy xh; db += dy. */
void tr_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *mean,
                      const float *rstd, const float *w, int n, int d) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * d, *dyt = dy + (size_t)t * d;
        float *dxt = dx + (size_t)t * d, m = mean[t], r = rstd[t];
        float sg = 0.0f, sgx = 0.0f;
        for (int i = 0; i < d; i++) {
            float xh = (xt[i] - m) * r, g = dyt[i] * w[i];
            sg += g;
            sgx += g * xh;
            dw[i] += dyt[i] * xh;
            db[i] += dyt[i];
        }
        sg /= (float)d;
        sgx /= (float)d;
        for (int i = 0; i < d; i++) {
            float xh = (xt[i] - m) * r;
            dxt[i] += r * (dyt[i] * w[i] - sg - xh * sgx);
        }
    }
}

/* The attention core after the projections, per head h of width dh = d / heads:
 *   P_h[nq, nk] = softmax(Q_h K_h^T / sqrt(dh)), Pd_h = dropout(P_h), ctx_h[nq, dh] = Pd_h V_h
 * Q[nq, d], K and V [nk, d], P and Pd [heads, nq, nk]; Pd may be P when p == 0. */
void tr_attn_fwd(float *ctx, float *P, float *Pd, const float *Q, const float *K, const float *V, int nq, int nk, int d,
                 int heads, float p, polar_rng *rng) {
    int dh = d / heads;
    float scale = 1.0f / sqrtf((float)dh), keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    /* Without dropout the (head, query) rows are independent and the threads
     * share them (inference: one example, as tr_linear_fwd); dropout draws
     * its masks in row order, so training stays serial. */
#pragma omp parallel for collapse(2) schedule(static) \
    if (p == 0.0f && !in_parallel() && (double)nq * nk * d >= PARALLEL_MIN_MACS)
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < nq; i++) {
            const float *q = Q + (size_t)i * d + (size_t)h * dh;
            float *pr = P + ((size_t)h * nq + i) * nk, *pd = Pd + ((size_t)h * nq + i) * nk;
            float mx = -INFINITY, sum = 0.0f;
            for (int j = 0; j < nk; j++) {
                const float *k = K + (size_t)j * d + (size_t)h * dh;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int c = 0; c < dh; c++) s += q[c] * k[c];
                pr[j] = s * scale;
                mx = fmaxf(mx, pr[j]);
            }
            for (int j = 0; j < nk; j++) sum += (pr[j] = expf(pr[j] - mx));
            for (int j = 0; j < nk; j++) pr[j] /= sum;
            if (p > 0.0f)
                for (int j = 0; j < nk; j++) pd[j] = polar_rng_uniform(rng) >= p ? pr[j] * keep_scale : 0.0f;
            else if (pd != pr)
                memcpy(pd, pr, (size_t)nk * sizeof *pd);
            float *o = ctx + (size_t)i * d + (size_t)h * dh;
            memset(o, 0, (size_t)dh * sizeof *o);
            for (int j = 0; j < nk; j++) {
                const float *v = V + (size_t)j * d + (size_t)h * dh;
                float a = pd[j];
#pragma omp simd
                for (int c = 0; c < dh; c++) o[c] += a * v[c];
            }
        }
}

/* Backward of tr_attn_fwd (all three += ):
 *   dPd = dctx_h V_h^T, dV_h += Pd_h^T dctx_h, dP = dPd * (kept) / (1 - p),
 *   dS = P (dP - sum_j P dP), dQ_h += dS K_h / sqrt(dh), dK_h += dS^T Q_h / sqrt(dh).
 * A dropped weight is exactly 0 in Pd; a kept one that is 0 has P = 0 and so dS = 0
 * whatever dP says. scratch: nk floats. */
void tr_attn_bwd(float *dQ, float *dK, float *dV, const float *dctx, const float *P, const float *Pd, const float *Q,
                 const float *K, const float *V, int nq, int nk, int d, int heads, float p, float *scratch) {
    int dh = d / heads;
    float scale = 1.0f / sqrtf((float)dh), keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    float *dp = scratch;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < nq; i++) {
            const float *pr = P + ((size_t)h * nq + i) * nk, *pd = Pd + ((size_t)h * nq + i) * nk;
            const float *go = dctx + (size_t)i * d + (size_t)h * dh, *q = Q + (size_t)i * d + (size_t)h * dh;
            float dot = 0.0f;
            for (int j = 0; j < nk; j++) {
                const float *v = V + (size_t)j * d + (size_t)h * dh;
                float *dv = dV + (size_t)j * d + (size_t)h * dh;
                float s = 0.0f, a = pd[j];
#pragma omp simd reduction(+ : s)
                for (int c = 0; c < dh; c++) s += go[c] * v[c];
#pragma omp simd
                for (int c = 0; c < dh; c++) dv[c] += a * go[c];
                dp[j] = p > 0.0f ? (pd[j] != 0.0f ? s * keep_scale : 0.0f) : s;
                dot += pr[j] * dp[j];
            }
            float *dq = dQ + (size_t)i * d + (size_t)h * dh;
            for (int j = 0; j < nk; j++) {
                float ds = pr[j] * (dp[j] - dot) * scale;
                if (ds == 0.0f) continue;
                const float *k = K + (size_t)j * d + (size_t)h * dh;
                float *dk = dK + (size_t)j * d + (size_t)h * dh;
#pragma omp simd
                for (int c = 0; c < dh; c++) {
                    dq[c] += ds * k[c];
                    dk[c] += ds * q[c];
                }
            }
        }
}
