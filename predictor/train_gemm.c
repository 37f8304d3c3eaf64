/* The trainer's matrix products (more than 90% of a training step): plain C,
 * the oracle, and AVX2 + FMA register-blocked versions in functions compiled
 * for that level only, used when the CPU kernels in use are any x86 level
 * but generic (polar_cpu_kernels: the CPU's best, or POLAR_CPU). The fused
 * multiply-adds are written out, not contracted by the compiler. */
#include <string.h>

#include "train.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* y[n, rows] = x[n, cols] . W[rows, cols]^T (+ b) */
static void nt_generic(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        for (int r = 0; r < rows; r++) {
            const float *wr = w + (size_t)r * cols;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int c = 0; c < cols; c++) acc += wr[c] * xt[c];
            y[(size_t)t * rows + r] = acc + (b ? b[r] : 0.0f);
        }
    }
}

/* C[m, c] += sum_k A[m sam + k sak] B[k, c] over m < M, k < K, c < N;
 * C's rows ldc apart, B's ldb. Zeros of A (ReLU, dropout) are skipped. */
static void nn_generic(float *C, int ldc, const float *A, int sam, int sak, const float *B, int ldb, int M, int K,
                       int N) {
    for (int m = 0; m < M; m++) {
        float *cm = C + (size_t)m * ldc;
        for (int k = 0; k < K; k++) {
            float a = A[(size_t)m * sam + (size_t)k * sak];
            if (a == 0.0f) continue;
            const float *bk = B + (size_t)k * ldb;
#pragma omp simd
            for (int c = 0; c < N; c++) cm[c] += a * bk[c];
        }
    }
}

const tr_gemm tr_gemm_generic = {"generic", nt_generic, nn_generic};

#if defined(__x86_64__)
#define AVX2_FN __attribute__((target("avx2,fma")))
#define NT_TOKENS 48 /* tokens of x kept hot in L2 while 4 rows of W pass over them */

AVX2_FN static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Blocks of 3 tokens x 4 rows, 12 accumulators over cols in steps of 8;
 * a partial block repeats its last token or row and keeps only the real ones. */
AVX2_FN static void nt_avx2(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols) {
    int c8 = cols & ~7;
    for (int t0 = 0; t0 < n; t0 += NT_TOKENS) {
        int t1 = t0 + NT_TOKENS < n ? t0 + NT_TOKENS : n;
        for (int r = 0; r < rows; r += 4) {
            const float *wr[4];
            for (int j = 0; j < 4; j++) wr[j] = w + (size_t)(r + j < rows ? r + j : rows - 1) * cols;
            for (int t = t0; t < t1; t += 3) {
                const float *xt[3];
                for (int i = 0; i < 3; i++) xt[i] = x + (size_t)(t + i < t1 ? t + i : t1 - 1) * cols;
                __m256 acc[3][4];
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
                for (int c = 0; c < c8; c += 8) {
                    __m256 xv[3];
                    for (int i = 0; i < 3; i++) xv[i] = _mm256_loadu_ps(xt[i] + c);
                    for (int j = 0; j < 4; j++) {
                        __m256 wv = _mm256_loadu_ps(wr[j] + c);
                        for (int i = 0; i < 3; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
                /* constant bounds only, so the accumulators stay in registers */
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 4; j++) {
                        if (t + i >= t1 || r + j >= rows) continue;
                        float s = hsum8(acc[i][j]);
                        for (int c = c8; c < cols; c++) s += xt[i][c] * wr[j][c];
                        y[(size_t)(t + i) * rows + r + j] = s + (b ? b[r + j] : 0.0f);
                    }
            }
        }
    }
}

/* C[m..m+6, c..c+16] += A B over all k: 12 accumulators; a partial block
 * (valid < 6 rows) repeats its last row and stores only the real ones. */
AVX2_FN static inline void nn_block(float *C, int ldc, const float *A, int sam, int sak, const float *B, int ldb, int m,
                                    int valid, int K, int c) {
    const float *am[6];
    __m256 acc[6][2];
    for (int i = 0; i < 6; i++) {
        int row = m + (i < valid ? i : valid - 1);
        am[i] = A + (size_t)row * sam;
        acc[i][0] = _mm256_loadu_ps(C + (size_t)row * ldc + c);
        acc[i][1] = _mm256_loadu_ps(C + (size_t)row * ldc + c + 8);
    }
    for (int k = 0; k < K; k++) {
        const float *bk = B + (size_t)k * ldb + c;
        __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + 8);
        for (int i = 0; i < 6; i++) {
            __m256 a = _mm256_broadcast_ss(am[i] + (size_t)k * sak);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
    for (int i = 0; i < 6; i++) { /* constant bounds only, so the accumulators stay in registers */
        if (i >= valid) continue;
        _mm256_storeu_ps(C + (size_t)(m + i) * ldc + c, acc[i][0]);
        _mm256_storeu_ps(C + (size_t)(m + i) * ldc + c + 8, acc[i][1]);
    }
}

/* Blocks of 6 rows of C x 16 columns. When B is the larger operand (dx = dy W)
 * a 16-column stripe of it stays in cache while the blocks of C pass down;
 * else (dW = dy^T x) C is walked row by row, in address order. The columns
 * past the last multiple of 16 go the plain way. */
AVX2_FN static void nn_avx2(float *C, int ldc, const float *A, int sam, int sak, const float *B, int ldb, int M, int K,
                            int N) {
    int n16 = N & ~15;
    if (K >= M) {
        for (int c = 0; c < n16; c += 16)
            for (int m = 0; m < M; m += 6) nn_block(C, ldc, A, sam, sak, B, ldb, m, M - m < 6 ? M - m : 6, K, c);
    } else {
        for (int m = 0; m < M; m += 6)
            for (int c = 0; c < n16; c += 16) nn_block(C, ldc, A, sam, sak, B, ldb, m, M - m < 6 ? M - m : 6, K, c);
    }
    if (n16 < N) nn_generic(C + n16, ldc, A, sam, sak, B + n16, ldb, M, K, N - n16);
}

const tr_gemm tr_gemm_avx2 = {"avx2", nt_avx2, nn_avx2};
#endif

const tr_gemm *tr_gemm_active(void) {
#if defined(__x86_64__)
    /* every x86 level above generic (avx2, avx2vnni, avx512, avx512vnni) has AVX2 + FMA */
    if (!strncmp(polar_cpu_kernels(), "avx", 3)) return &tr_gemm_avx2;
#endif
    return &tr_gemm_generic;
}
