/* Predictor training internals: the ops with their backward passes
 * (train_ops.c), the loss (loss.c) and the whole network's batch gradient
 * (train.c). */
#ifndef POLAR_PREDICTOR_TRAIN_H
#define POLAR_PREDICTOR_TRAIN_H

#include <stddef.h>

#include "polar.h"
#include "predictor.h"

#define TR_LN_EPS 1e-5f /* PyTorch's LayerNorm default */

/* The matrix products of the linear ops (train_gemm.c):
 *   nt: y[n, rows] = x[n, cols] . W[rows, cols]^T (+ b when not NULL)
 *   nn: C[m, c] += sum_k A[m sam + k sak] B[k, c], m < M, k < K, c < N,
 *       C's rows ldc floats apart, B's ldb (dx = dy W and dW = dy^T x). */
typedef struct {
    const char *name;
    void (*nt)(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols);
    void (*nn)(float *C, int ldc, const float *A, int sam, int sak, const float *B, int ldb, int M, int K, int N);
} tr_gemm;

extern const tr_gemm tr_gemm_generic; /* plain C: the oracle */
#if defined(__x86_64__)
extern const tr_gemm tr_gemm_avx2;    /* needs AVX2 and FMA */
#endif
/* avx2 when the CPU kernels in use (polar_cpu_kernels) are an x86 level (avx2, avx2vnni, avx512,
 * avx512vnni), else generic. */
const tr_gemm *tr_gemm_active(void);

void tr_linear_fwd(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols);
void tr_linear_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int n, int rows,
                   int cols);
void tr_dropout_fwd(float *y, unsigned char *keep, const float *x, size_t n, float p, polar_rng *rng);
void tr_dropout_bwd(float *dx, const float *dy, const unsigned char *keep, size_t n, float p);
void tr_relu_fwd(float *x, size_t n);
void tr_relu_bwd(float *dh, const float *y, size_t n);
void tr_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b, int n, int d);
void tr_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *mean,
                      const float *rstd, const float *w, int n, int d);
void tr_attn_fwd(float *ctx, float *P, float *Pd, const float *Q, const float *K, const float *V, int nq, int nk, int d,
                 int heads, float p, polar_rng *rng);
void tr_attn_bwd(float *dQ, float *dK, float *dV, const float *dctx, const float *P, const float *Pd, const float *Q,
                 const float *K, const float *V, int nq, int nk, int d, int heads, float p, float *scratch);
double tr_example_loss(const float *seg, const float *op, const unsigned char *seg_start, const int *ops, int D,
                       float *dseg, float *dop, float gscale);

/* A batch's gradient is summed in this many fixed chunks of its examples,
 * each in example order, then the chunks in order: the same bits on any
 * number of threads (at most this many work on a batch). */
#define PRED_GRAD_CHUNKS 16

/* Per-thread activation buffers, per-chunk gradient sums and per-example
 * losses of a batch, kept across steps (grown when a batch needs more); zero it to
 * start, pred_batch_ws_free to release. */
typedef struct {
    int threads, examples, tokens; /* capacity */
    float **fb;                    /* [threads] activations + backward scratch */
    unsigned char **bb;            /* [threads] dropout masks */
    float *tgrad[PRED_GRAD_CHUNKS]; /* a chunk's gradient sum (chunk 0's is the caller's), made when first needed */
    double *losses;                /* [examples] */
} pred_batch_ws;

void pred_batch_ws_free(pred_batch_ws *w);

/* The network's forward pass with dropout off, on the CPU (the training
 * forward, its activations in buffers made per call): seg[D], op[D, 3]. */
polar_status pred_forward_cpu(const polar_predictor *p, const float *H, int T, float *seg, float *op,
                              polar_error *err);

/* The batch loss (polar.h) and, when grad is not NULL, its gradient
 * (p->storage_floats floats laid out as p->storage, overwritten). Dropout
 * masks come from (seed, step, example index) and the sums are made in
 * fixed chunks, so any thread count gives the same loss and gradient bits. */
polar_status pred_batch_grad(const polar_predictor *p, const polar_train_example *ex, int n, float dropout,
                             uint64_t seed, uint64_t step, float *grad, double *loss, pred_batch_ws *ws,
                             polar_error *err);

#endif
