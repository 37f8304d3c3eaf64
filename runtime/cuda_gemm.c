/* Prefill matmuls on tensor cores through cuBLASLt: y[T, rows] = x[T, cols]
 * . W[rows, cols]^T with W bf16 as stored, x rounded to bf16, f32
 * accumulation and output. In cuBLAS's column-major terms that is
 * C[rows, T] = op(A) B with A = W seen as [cols, rows] (transposed) and
 * B = x seen as [cols, T]. Descriptors and the chosen algorithm are cached
 * per shape; the workspace is fixed. Built with POLAR_CUDA only. */
#ifdef POLAR_CUDA

#include "cuda_gemm.h"

#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/ops.h"

#define GEMM_CACHE 64

typedef struct {
    int rows, cols, T, ldy;
    int failed;                  /* cuBLASLt declined this shape: remembered, not asked again */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

struct cuda_gemm {
    cublasLtHandle_t handle;
    void *workspace;
    gemm_plan plans[GEMM_CACHE];
    int n_plans;
    int warned;                  /* a declined shape was reported (once per handle) */
};

cuda_gemm *cuda_gemm_create(void) {
    cuda_gemm *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    if (cublasLtCreate(&g->handle) != CUBLAS_STATUS_SUCCESS || cudaMalloc(&g->workspace, CUDA_GEMM_WORKSPACE) != cudaSuccess) {
        cuda_gemm_free(g);
        return NULL;
    }
    return g;
}

static void plan_free(gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
}

void cuda_gemm_free(cuda_gemm *g) {
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++) plan_free(&g->plans[i]);
    if (g->workspace) cudaFree(g->workspace);
    if (g->handle) cublasLtDestroy(g->handle);
    free(g);
}

static gemm_plan *plan_for(cuda_gemm *g, int rows, int cols, int T, int ldy) {
    for (int i = 0; i < g->n_plans; i++)
        if (g->plans[i].rows == rows && g->plans[i].cols == cols && g->plans[i].T == T && g->plans[i].ldy == ldy)
            return &g->plans[i];
    if (g->n_plans == GEMM_CACHE) { /* full: recycle the oldest */
        plan_free(&g->plans[0]);
        memmove(g->plans, g->plans + 1, (GEMM_CACHE - 1) * sizeof *g->plans);
        g->n_plans--;
    }
    gemm_plan *p = &g->plans[g->n_plans];
    memset(p, 0, sizeof *p);
    p->rows = rows, p->cols = cols, p->T = T, p->ldy = ldy;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    size_t ws = CUDA_GEMM_WORKSPACE;
    int ok = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, cols, rows, cols) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, cols, T, cols) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, rows, T, ldy) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                 CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulAlgoGetHeuristic(g->handle, p->desc, p->a, p->b, p->c, p->c, pref, 1, &heur, &found) ==
                 CUBLAS_STATUS_SUCCESS &&
             found > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ok) {
        p->algo = heur.algo;
    } else { /* keep the shape, marked failed, so it is not asked again */
        plan_free(p);
        memset(p, 0, sizeof *p);
        p->rows = rows, p->cols = cols, p->T = T, p->ldy = ldy;
        p->failed = 1;
    }
    g->n_plans++;
    return p;
}

/* A shape cuBLASLt declined runs on the GEMV (correct, slower): say so once. */
static int declined(cuda_gemm *g, gemm_plan *p) {
    p->failed = 1;
    if (!g->warned++)
        fprintf(stderr, "polar: cuBLASLt declined a %d x %d x %d GEMM; such shapes run on the GEMV kernel\n", p->T,
                p->rows, p->cols);
    return 0;
}

int cuda_gemm_run(cuda_gemm *g, float *y, int ldy, const bf16_bits *xb, const bf16_bits *w, int T, int rows, int cols,
                  int accumulate, void *stream) {
    gemm_plan *p = plan_for(g, rows, cols, T, ldy);
    if (p->failed) return g->warned ? 0 : declined(g, p);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f; /* D = C = y, in place */
    if (cublasLtMatmul(g->handle, p->desc, &alpha, w, p->a, xb, p->b, &beta, y, p->c, y, p->c, &p->algo,
                       g->workspace, CUDA_GEMM_WORKSPACE, (cudaStream_t)stream) != CUBLAS_STATUS_SUCCESS) {
        /* inside a capture that already failed every call fails: not the shape's fault */
        enum cudaStreamCaptureStatus capture;
        if (cudaStreamIsCapturing((cudaStream_t)stream, &capture) == cudaSuccess &&
            capture == cudaStreamCaptureStatusInvalidated)
            return 0;
        return declined(g, p);
    }
    return 1;
}

#endif
