/* CUDA kernels, entered from C. Each launcher mirrors a CPU reference in
 * kernels/cpu/ops.h (same inputs, same math: bf16 weights, f32 activations
 * and statistics) and runs on the given stream (a cudaStream_t). Pointers
 * are device pointers; nothing here synchronises. */
#ifndef POLAR_CUDA_OPS_H
#define POLAR_CUDA_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t bf16_bits;

/* x[T, hidden] = table[tokens[t], :] */
void cuda_embed(float *x, const bf16_bits *table, const int *tokens, int T, int hidden, void *stream);

/* out[T, n] = x / sqrt(mean(x^2) + eps) * w, row by row */
void cuda_rmsnorm(float *out, const float *x, const bf16_bits *w, int T, int n, float eps, void *stream);

/* y[T, rows] (=|+=) x[T, cols] . W[rows, cols]^T (+ bias): a warp per row,
 * 16-byte loads of W, up to 8 tokens per pass over a row. */
void cuda_matmul(float *y, const float *x, const bf16_bits *w, const bf16_bits *bias, int T, int rows, int cols,
                 int accumulate, void *stream);

/* Per token t at position pos0 + t: optional per-head RMSNorm of q and k
 * (Qwen3), rotate-half RoPE, then k and v written as bf16 into the cache
 * rows pos0 .. pos0+T-1 of this execution position's slot. */
void cuda_qk_rope_store(float *q, const float *k, const float *v, const bf16_bits *q_norm, const bf16_bits *k_norm,
                        const float *inv_freq, bf16_bits *k_cache, bf16_bits *v_cache, int pos0, int T, int n_heads,
                        int n_kv, int head_dim, float eps, void *stream);

/* Causal GQA attention of T tokens (positions pos0..) over the slot's cache;
 * scratch holds T * n_heads * (pos0 + T) floats. */
void cuda_attention(float *out, const float *q, const bf16_bits *k_cache, const bf16_bits *v_cache, float *scratch,
                    int pos0, int T, int n_heads, int n_kv, int head_dim, void *stream);

/* g[T, n] = silu(g) * u */
void cuda_swiglu(float *g, const float *u, int count, void *stream);

/* out[0] = argmax(logits[n]), the lowest index on ties */
void cuda_argmax(int *out, const float *logits, int n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
