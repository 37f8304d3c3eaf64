/* One decoder layer on the CPU over a group of tokens that may belong to
 * different sequences, each at its own position with its own KV table: the
 * one layer implementation of a batch's passes (runtime/cpu_batch.c). The
 * layer's weights are read once for the whole group. */
#ifndef POLAR_CPU_LAYER_H
#define POLAR_CPU_LAYER_H

#include "kv_pool.h"
#include "model.h"

/* Tokens of one sequence (a prompt chunk's) whose attention one work item
 * computes, ATTENTION_QUERIES at a time. */
#define ATTENTION_ITEM_TOKENS 8

/* Heads h0.. of tokens t0.. of a layer pass: one attention work item. */
typedef struct {
    int t0, n_tokens, h0, n_heads;
} attention_item;

/* Workspaces for a forward over up to `rows` tokens at once. */
typedef struct {
    int rows, n_threads, max_ctx;
    float *x;           /* [rows, hidden] a pass's rows gathered from the step's */
    float *xn;          /* [rows, hidden] normed input of a sublayer */
    float *q;           /* [rows, n_heads*head_dim] */
    float *k, *v;       /* [rows, n_kv*head_dim] */
    float *att;         /* [rows, n_heads*head_dim] attention output */
    float *gate, *up;   /* [rows, max(ffn, shared_ffn, 2*moe_ffn)] */
    float *router;      /* [rows, n_experts] router logits */
    float *mlp_out;     /* [rows, hidden] MoE layer output before the residual */
    float *expert_in;   /* [rows, hidden] the normed inputs of one expert's tokens */
    float *expert_out;  /* [rows, hidden] their outputs (or the shared expert's) */
    float *scores;      /* [n_threads, ATTENTION_QUERIES, max_ctx] softmax scratch */
    attention_item *items; /* [rows * n_heads] the attention's work items */
    int *route_idx;     /* [rows, top_k] experts chosen per token */
    float *route_w;     /* [rows, top_k] their weights */
    int *members;       /* [rows] the tokens routed to one expert, ascending */
    float *member_w;    /* [rows] */
    cpu_q8_block *xq;   /* [rows, max matmul cols / 32] quantized activations, or NULL (a bf16 model) */
} cpu_work;

/* Where one token of a layer pass is: its position, its sequence's KV table
 * at this execution position, and the RoPE tables of its position. */
typedef struct {
    int pos;
    const int *blocks;
    const float *cos, *sin; /* [head_dim/2] */
} cpu_token_at;

/* 0 when out of memory (cpu_work_free undoes a partial init). */
int cpu_work_init(cpu_work *w, const polar_model *m, int rows, int max_ctx, int n_threads);
void cpu_work_free(cpu_work *w);

/* Layer lw over the T tokens of x ([T, hidden], T <= w->rows), in place: each token's
 * K/V are stored at its position in its table, then it attends over its own
 * positions 0..pos. round_in: the GEMM inputs are rounded to bf16 (a CUDA
 * prefill chunk's); round_cache: K/V are stored rounded to bf16 (a CUDA
 * cache's) in an f32 pool. A bf16 pool rounds them the same way, so its
 * attention gives the bits of round_cache's. */
void cpu_layer_forward(const polar_model *m, cpu_work *w, const layer_weights *lw, float *x, kv_pool *pool,
                       const cpu_token_at *at, int T, int round_in, int round_cache);

/* The final norm of one row x into out ([hidden] each). */
void cpu_final_norm(const polar_model *m, float *out, const float *x);

#endif
