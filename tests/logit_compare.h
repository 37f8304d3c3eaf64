/* How the CUDA tests compare two runs' logits. */
#ifndef POLAR_TEST_LOGIT_COMPARE_H
#define POLAR_TEST_LOGIT_COMPARE_H

#include <math.h>
#include <stddef.h>

/* GPU against a CPU rounding where it rounds (test_cuda.c's model
 * comparison says where the figures come from): logits of the GEMV path
 * (up to GEMV_PROMPT_TOKENS tokens) within TOL_ROUNDED; through the GEMMs, a relative L2
 * error within TOL_REL_GEMM and TOL_GEMM_MAX at most. An MoE model whose
 * rounded reference flipped an expert is held to the f32 reference instead,
 * whose distance to the GPU is the bf16 rounding of every GEMM input: up to
 * 0.101 max and 1.2e-2 relative on the golden models' 40-token prompts where
 * no expert flipped (H100 2026-11-23, H200 2026-11-26; an expert flip moves
 * the f32 reference by 0.17 to 0.56), hence TOL_F32_GEMM_MAX. */
/* Tensor parallel against one GPU (test_cuda_batch batch_tp) is held to the
 * same TOL_REL_GEMM and TOL_GEMM_MAX, for the same reason: both runs round
 * to bf16 at the same points (GEMM inputs, K/V rows) and differ only in the
 * order of f32 sums (each rank's dot over its columns, then the all-reduce
 * in rank order), u = 2^-24 per addition, a few ulps of an element. Where
 * such a difference crosses a bf16 rounding boundary the rounded value moves
 * by one bf16 ulp (2^-8 relative), and that spreads through the later layers
 * as the GPU's differences from the rounding CPU do; with no boundary crossed
 * the logits agree to ~1e-6. Measured under the emulation: llama TP 2-4 at
 * most 5.8e-4 relative L2 and 1.7e-3 max (every pass through the GEMVs: 1e-6
 * at TP 2 and 3, 2.3e-4 at TP 4, where a K/V rounding flipped), qwen2_moe
 * TP 2-4 at most 3.4e-5 and 9.5e-5; one rank through NCCL 0. */
#define TOL_ROUNDED 2e-3f
#define TOL_REL_GEMM 1.5e-2
#define TOL_GEMM_MAX 0.1f
#define TOL_F32_GEMM_MAX 0.15f
#define GEMV_PROMPT_TOKENS 2 /* CUDA_GEMV_TOKENS of runtime/backend.h */

/* max |a - b|; *cosine and *rel_l2 = ||a - b|| / ||b|| of the same pair. */
static float max_abs_diff(const float *a, const float *b, size_t n, double *cosine, double *rel_l2) {
    double dot = 0, na = 0, nb = 0, nd = 0;
    float d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        d = fmaxf(d, fabsf(a[i] - b[i]));
        dot += (double)a[i] * b[i], na += (double)a[i] * a[i], nb += (double)b[i] * b[i], nd += e * e;
    }
    *cosine = dot / sqrt(na * nb);
    *rel_l2 = sqrt(nd / nb);
    return d;
}

#endif
