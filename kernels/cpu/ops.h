/* CPU reference kernels: f32 math over bf16 weights, following Hugging Face
 * transformers' modeling code. These are the oracle for every GPU kernel.
 * Shapes are given next to every argument; matrices are row-major.
 * cpu_matmul, cpu_rmsnorm, cpu_rope, cpu_attention_head and cpu_swiglu run
 * the SIMD level picked at start-up (kernels.h, dispatch.c; POLAR_CPU
 * overrides it); the plain C of ops.c is what every level is tested against. */
#ifndef POLAR_CPU_OPS_H
#define POLAR_CPU_OPS_H

#include <stddef.h>

#include "bf16.h"

/* out[hidden] = table[token, :] */
void cpu_embed(float *out, const bf16 *table, int token, int hidden);

/* out[n] = x / sqrt(mean(x^2) + eps) * w   (out may alias x) */
void cpu_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps);

/* y[T, rows] (=|+=) x[T, cols] . w[rows, cols]^T (+ bias[rows]).
 * accumulate != 0 adds into y (a fused residual). Threads split the rows. */
void cpu_matmul(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
                int accumulate, int n_threads);

/* cos/sin tables for one position: cs[half], sn[half] where half = head_dim/2:
 * angle_i = pos * inv_freq_i (f32, as transformers computes it), both times
 * scale (YaRN's attention factor; 1 otherwise). */
void cpu_rope_angles(float *cs, float *sn, const float *inv_freq, float scale, int half, int pos);

/* Rotate-half RoPE in place on x[n_heads, head_dim]: pair (i, i + d/2). */
void cpu_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim);

/* The KV cache is paged: a pool of blocks of CPU_KV_BLOCK token rows, and per
 * sequence and execution position a block table, blocks[b] = the pool block
 * holding positions b*CPU_KV_BLOCK.. (a multiple of 4, so the kernels' groups
 * of four keys never straddle a block). Position j lives in pool row
 * cpu_kv_row(blocks, j). */
#define CPU_KV_BLOCK 16
static inline size_t cpu_kv_row(const int *blocks, int j) {
    return (size_t)blocks[j / CPU_KV_BLOCK] * CPU_KV_BLOCK + (size_t)(j % CPU_KV_BLOCK);
}

/* Causal GQA attention of one token at position `pos` over positions
 * 0..pos. q[n_heads, hd]; k_cache, v_cache: the pool [rows, n_kv*hd] and
 * blocks the sequence's table (above); out[n_heads, hd]; scores[pos + 1]
 * scratch. Query head h reads kv head h / (n_heads/n_kv). */
void cpu_attention_head(float *out, const float *q, const float *k_cache, const float *v_cache, const int *blocks,
                        int pos, int h, int n_heads, int n_kv, int hd, float *scores);

/* The same for n_q tokens of one sequence at positions pos..pos+n_q-1
 * (their rows q_stride floats apart in q and out) and query heads
 * h0..h0+n_h-1, scores[ATTENTION_QUERIES rows scores_stride apart]: each
 * (token, head) gets cpu_attention_head's bits. The SIMD levels take
 * ATTENTION_QUERIES queries at a time, reading the K/V rows once for them:
 * a token's heads that share a KV head when it is alone (decode), else
 * consecutive tokens of one head. */
#define ATTENTION_QUERIES 4
void cpu_attention_rows(float *out, const float *q, size_t q_stride, int n_q, const float *k_cache,
                        const float *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads, int n_kv,
                        int hd, float *scores, size_t scores_stride);

/* cpu_attention_rows over a pool of bf16 rows (a bf16 KV cache): the
 * bits cpu_attention_rows gives over f32 rows holding the same values. */
void cpu_attention_rows_bf16(float *out, const float *q, size_t q_stride, int n_q, const bf16 *k_cache,
                             const bf16 *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads, int n_kv,
                             int hd, float *scores, size_t scores_stride);

/* g[n] = silu(g) * u */
void cpu_swiglu(float *g, const float *u, int n);

/* x[n] = bf16(x) widened back (round to nearest even): where a GPU stores
 * or feeds a tensor core bf16, for a CPU run that mirrors it. */
void cpu_round_bf16(float *x, size_t n);

/* MoE routing of one token: softmax (f32) over logits[n], the k most likely
 * experts (the lower index on ties), their probabilities renormalised to sum
 * 1 when norm. Returns them in ascending expert order: idx[k], weight[k]. */
void cpu_route(const float *logits, int n, int k, int norm, int *idx, float *weight);

#endif
