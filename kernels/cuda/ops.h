/* CUDA kernels, entered from C. Each launcher mirrors a CPU reference in
 * kernels/cpu/ops.h (same inputs, same math: bf16 weights, f32 activations
 * and statistics) and runs on the given stream (a cudaStream_t). Pointers
 * are device pointers; nothing here synchronises. */
#ifndef POLAR_CUDA_OPS_H
#define POLAR_CUDA_OPS_H

#include <stddef.h>
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

/* Per token t at position *pos0 + t (pos0 lives on the device, so a
 * captured graph serves every step): optional per-head RMSNorm of q and k
 * (Qwen3), rotate-half RoPE, then k and v written as bf16 into the cache rows
 * of this execution position's slot. */
void cuda_qk_rope_store(float *q, const float *k, const float *v, const bf16_bits *q_norm, const bf16_bits *k_norm,
                        const float *inv_freq, bf16_bits *k_cache, bf16_bits *v_cache, const int *pos0, int T,
                        int n_heads, int n_kv, int head_dim, float eps, void *stream);

/* Causal GQA attention of T tokens (positions *pos0..) over the slot's
 * cache, split-K over chunks of positions with a log-sum-exp merge;
 * scratch holds cuda_attention_scratch(...) floats. head_dim <= 256. */
size_t cuda_attention_scratch(int T, int n_heads, int head_dim, int max_ctx);
void cuda_attention(float *out, const float *q, const bf16_bits *k_cache, const bf16_bits *v_cache, float *scratch,
                    const int *pos0, int T, int n_heads, int n_kv, int head_dim, int max_ctx, void *stream);

/* xb[n] = bf16(x[n]) (round to nearest even), for tensor-core GEMMs. */
void cuda_to_bf16(bf16_bits *xb, const float *x, long n, void *stream);

/* y[T, rows] = acc[T, rows] + bias (+ y when accumulate): the epilogue of a
 * GEMM that wrote acc. */
void cuda_bias_residual(float *y, const float *acc, const bf16_bits *bias, int T, int rows, int accumulate,
                        void *stream);

/* g[T, n] = silu(g) * u */
void cuda_swiglu(float *g, const float *u, int count, void *stream);

/* out[0] = argmax(logits[n]), the lowest index on ties */
void cuda_argmax(int *out, const float *logits, int n, void *stream);

/* MoE routing of T tokens, as cpu_route: softmax over logits[T, E] in f32,
 * the top k (lower index on ties), renormalised when norm, written in
 * ascending expert order: idx[T, k], weight[T, k]. */
void cuda_route(int *idx, float *weight, const float *logits, int T, int E, int k, int norm, void *stream);

/* Expert GEMV reading only the selected experts' rows: for slot s = t*k + j,
 * y[s, rows] = x[row of s] . W[idx[s]]^T where W is [E, rows, cols] and the
 * input row is x[t] (x_per_slot = 0) or x[s] (x_per_slot = 1). */
void cuda_expert_matmul(float *y, const float *x, const bf16_bits *w, const int *idx, int T, int k, int rows,
                        int cols, int x_per_slot, void *stream);

/* act[s, F] = silu(gu[s, 0:F]) * gu[s, F:2F] for the n_slots slots. */
void cuda_expert_swiglu(float *act, const float *gu, int n_slots, int F, void *stream);

/* x[t] += sum_j weight[t, j] * y[t*k + j] (in j order), plus, when shared is
 * not NULL, sigmoid(gate[t]) * shared[t]: the MoE residual, deterministic. */
void cuda_moe_combine(float *x, const float *y, const float *weight, const float *shared, const float *gate, int T,
                      int k, int H, void *stream);

#ifdef __cplusplus
}
#endif
#endif
