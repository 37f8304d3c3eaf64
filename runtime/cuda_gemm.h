/* cuBLASLt GEMM for prefill (see cuda_gemm.c). */
#ifndef POLAR_CUDA_GEMM_H
#define POLAR_CUDA_GEMM_H

#include "../kernels/cuda/ops.h"

typedef struct cuda_gemm cuda_gemm;

/* Device bytes of a cuda_gemm's cuBLASLt workspace. */
#define CUDA_GEMM_WORKSPACE ((size_t)32 << 20)

cuda_gemm *cuda_gemm_create(void);
void cuda_gemm_free(cuda_gemm *g);

/* y[T, rows] (=, or += with accumulate) xb[T, cols] . w[rows, cols]^T (bf16
 * in, f32 sums and out; the residual added in cuBLASLt's epilogue), y's
 * rows ldy >= rows floats apart (a slice of a wider output); 0 on failure,
 * y untouched. */
int cuda_gemm_run(cuda_gemm *g, float *y, int ldy, const bf16_bits *xb, const bf16_bits *w, int T, int rows, int cols,
                  int accumulate, void *stream);

#endif
