/* The part of a SIMD level's multi-query attention that is the same on
 * every level, included by ops_avx2.c, ops_avx512.c and ops_neon.c and compiled with
 * that level's flags: ATTENTION_ROWS_FUNCTION expands, where the level
 * writes it, to a function over the level's INLINE attention_tile(Q, ...)
 * (up to ATTENTION_QUERIES queries of one sequence, each giving
 * attention_head's bits; Q a constant in each call). */
#ifndef POLAR_CPU_ATTENTION_ROWS_H
#define POLAR_CPU_ATTENTION_ROWS_H

#include "kernels.h"

_Static_assert(ATTENTION_QUERIES == 4, "ATTENTION_ROWS_FUNCTION and the levels' register tiles take 4 queries");

/* out[r] for r0 <= r < hd, one query over keys 0..n-1 with probabilities
 * p: the outputs past a level's vector lanes, as plain multiplies and adds. */
static inline void values_scalar(float *out, const float *p, int n, const void *vb, const int *blocks, int kv_dim, int r0,
                             int hd, int kv16) {
    for (int r = r0; r < hd; r++) {
        float o = 0.0f;
        for (int j = 0; j < n; j++) o += p[j] * kv_scalar(vb, cpu_kv_row(blocks, j) * kv_dim + r, kv16);
        out[r] = o;
    }
}

/* A level whose keys are scored four at a time (four_scores, dot and
 * softmax_scores defined before it) gets from this the softmaxed scores of
 * a tile of Q queries (rows q_stride apart), query t over keys
 * 0..n0+t*step-1 at scores + t * ss: the four-key groups every query
 * scores, for each query while the keys are in L1, then each query's own
 * rest. */
#define TILE_SCORES_BY_FOURS_FUNCTION                                                                             \
    INLINE void tile_scores(int Q, const float *q, size_t q_stride, const void *kb, const int *blocks, int n0,       \
                            int h, int hd, int kv_dim, float scale, float *scores, size_t ss, int kv16, int step) { \
        int shared = n0 / 4 * 4;                                                                                    \
        for (int j = 0; j < shared; j += 4) {                                                                       \
            const void *k0 = kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16);                                    \
            for (int t = 0; t < Q; t++)                                                                             \
                four_scores(scores + t * ss + j, q + t * q_stride + (size_t)h * hd, k0, hd, kv_dim, scale, kv16);   \
        }                                                                                                           \
        for (int t = 0; t < Q; t++) {                                                                               \
            float *st = scores + t * ss;                                                                            \
            const float *qh = q + t * q_stride + (size_t)h * hd;                                                    \
            int j = shared, n = n0 + t * step;                                                                      \
            for (; j + 4 <= n; j += 4)                                                                              \
                four_scores(st + j, qh, kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16), hd, kv_dim, scale, kv16); \
            for (; j < n; j++) st[j] = dot(qh, kv_elems(kb, cpu_kv_row(blocks, j) * kv_dim, kv16), hd, kv16) * scale; \
            softmax_scores(st, n);                                                                                  \
        }                                                                                                           \
    }

/* cpu_kernels.attention_head: one query, a tile of one, f32 rows. */
#define ATTENTION_HEAD_FUNCTION(name)                                                                                \
    static void name(float *out, const float *q, const float *k_cache, const float *v_cache, const int *blocks,      \
                     int pos, int h, int n_heads, int n_kv, int hd, float *scores) {                                 \
        attention_tile(1, out, q, 0, k_cache, v_cache, blocks, pos, h, n_heads, n_kv, hd, scores, 0, 0, 1);         \
    }

/* attention_tile(Q, ...) for a Q of 1..ATTENTION_QUERIES known only at
 * run time: each height its own unrolled copy. */
#define ATTENTION_TILE_OF_HEIGHT(Q, ...)                                                                             \
    switch (Q) {                                                                                                     \
    case 4: attention_tile(4, __VA_ARGS__); break;                                                                   \
    case 3: attention_tile(3, __VA_ARGS__); break;                                                                   \
    case 2: attention_tile(2, __VA_ARGS__); break;                                                                   \
    default: attention_tile(1, __VA_ARGS__); break;                                                                  \
    }

/* cpu_kernels.attention_rows (kv_type float, KV16 0) or attention_rows_bf16
 * (bf16, 1). One query (decode) tiles its heads that share a KV head (step
 * 0: every query at pos), so each K/V row is loaded once for the group;
 * more queries tile their positions (step 1), head by head. */
#define ATTENTION_ROWS_FUNCTION(name, kv_type, KV16)                                                                  \
    static void name(float *out, const float *q, size_t q_stride, int n_q, const kv_type *k_cache,                   \
                     const kv_type *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads, int n_kv,     \
                     int hd, float *scores, size_t scores_stride) {                                                   \
        int group = n_heads / n_kv;                                                                                  \
        if (n_q == 1) {                                                                                              \
            for (int h = h0, g; h < h0 + n_h; h += g) {                                                              \
                int left = h0 + n_h - h; /* the rest of h's group among the heads asked for, up to a tile */         \
                g = group - h % group < left ? group - h % group : left;                                             \
                g = g < ATTENTION_QUERIES ? g : ATTENTION_QUERIES;                                                   \
                ATTENTION_TILE_OF_HEIGHT(g, out, q, (size_t)hd, k_cache, v_cache, blocks, pos, h, n_heads, n_kv, hd, \
                                         scores, scores_stride, KV16, 0)                                             \
            }                                                                                                        \
            return;                                                                                                  \
        }                                                                                                            \
        for (int h = h0; h < h0 + n_h; h++)                                                                          \
            for (int t = 0; t < n_q; t += ATTENTION_QUERIES) {                                                       \
                int Q = n_q - t < ATTENTION_QUERIES ? n_q - t : ATTENTION_QUERIES;                                   \
                ATTENTION_TILE_OF_HEIGHT(Q, out + t * q_stride, q + t * q_stride, q_stride, k_cache, v_cache,        \
                                         blocks, pos + t, h, n_heads, n_kv, hd, scores, scores_stride, KV16, 1)      \
            }                                                                                                        \
    }

#endif
