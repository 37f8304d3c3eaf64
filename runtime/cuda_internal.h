/* The CUDA backend's state, shared by its two users: a session
 * (cuda_backend.c: one sequence) and a batch (cuda_batch.c: many
 * sequences), both over a paged bf16 KV pool. Built only
 * with POLAR_CUDA. */
#ifndef POLAR_CUDA_INTERNAL_H
#define POLAR_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "../kernels/cuda/ops.h"
#include "backend.h"
#include "cuda_gemm.h"

/* A pass of up to CUDA_DECODE_TOKENS tokens goes through the hand-written
 * GEMVs (a weight row read once for all of them), more through cuBLASLt
 * (POLAR_CUDA_GEMV_TOKENS=N moves that limit down to N, to measure where
 * cuBLASLt overtakes the GEMVs: on an H200 a batch of 8 took 3.97 ms a step
 * through them and one of 32 2.11 through cuBLASLt; the CPU's
 * round_like_cuda mirrors only the default). Attention is chosen apart
 * (cuda_layer_forward): the tiled prefill kernel for a run of more than
 * CUDA_DECODE_TOKENS consecutive positions, split-K for every other token,
 * however many the pass has. */
#define DECODE_TOKENS CUDA_DECODE_TOKENS
#define LOGIT_ROWS CUDA_LOGIT_ROWS

/* Decode graphs kept per session. */
#define GRAPH_CACHE 8

typedef struct {
    cudaGraphExec_t exec;        /* NULL: unused */
    int *program;                /* [cap_program] the program it was captured for */
    int n_program;
    long last_used;
} graph_entry;

/* Device buffers freed together. */
typedef struct {
    void **p;
    int n, cap;
} dev_allocs;

/* A model's weights on the device (model_device.weights), shared by its
 * sessions. */
typedef struct {
    layer_weights *layers;       /* [n_layers] device pointers */
    const bf16 *embed, *final_norm, *lm_head;
    float *inv_freq;             /* [head_dim/2] */
    dev_allocs allocs;
} cuda_weights;

struct cuda_state {
    const polar_model *m;
    const cuda_weights *w;       /* the model's, not owned */
    const layer_weights *layers; /* == w->layers */
    const bf16 *embed, *final_norm, *lm_head;
    const float *inv_freq;
    dev_allocs allocs;           /* KV cache and workspaces */
    int cap_program, chunk, max_blocks; /* cuda_state_shape */
    int sms;                     /* the GPU's multiprocessors (sizes the attention split) */
    bf16 *k_pool, *v_pool;       /* [n_blocks * CUDA_KV_BLOCK, n_kv*head_dim] */
    int *tables;                 /* [n_tables] the host's block tables, mirrored */
    float *x, *xn, *q, *k, *v, *att; /* [chunk, *] as on the CPU */
    float *gate, *up;            /* [chunk, max(ffn, shared_ffn)] */
    float *scores;               /* split-K attention partials: cuda_attention_scratch_upto of DECODE_TOKENS
                                  * (a batch's state: of chunk) floats */
    float *logits;               /* [LOGIT_ROWS, vocab] */
    float *router_logits;        /* [chunk, n_experts]                          MoE models only */
    int *expert_idx;             /* [chunk, top_k] chosen experts, ascending */
    float *expert_w;             /* [chunk, top_k] their weights */
    int *groups;                 /* the chunk's slots grouped by expert (cuda_moe_group) */
    float *expert_act;           /* [chunk * top_k, moe_ffn] */
    float *expert_out;           /* [chunk * top_k, hidden] */
    float *shared_out;           /* [chunk, hidden] */
    int *tokens;                 /* [chunk] */
    int *pos;                    /* [1] position of the chunk's first token, read by the kernels */
    int *step;                   /* [1] greedy steps taken, picks the ring slot */
    int *staging;                /* pinned host [2]: the step's token and position */
    volatile int *ring;          /* mapped host [2]: the ids greedy steps chose */
    cudaEvent_t step_done[2];    /* recorded after each greedy step, by parity */
    cuda_queue queue;            /* its non-blocking stream (a cudaStream_t); overlap on sm_90 and later
                                  * unless POLAR_CUDA_PDL=0 (cuda_state_create) */
    const char *launches;        /* queue.overlap in words, and why not (cuda_state_launches) */
    int overlap_dropped;         /* a failed capture turned overlap off (cuda_state_capture_failed) */
    cuda_gemm *gemm;             /* cuBLASLt, for passes of more than gemv_tokens tokens */
    int gemv_tokens;             /* passes of up to this many tokens through the GEMVs (DECODE_TOKENS, or
                                  * POLAR_CUDA_GEMV_TOKENS) */
    bf16 *xb;                    /* [chunk, widest input] activations rounded to bf16 for the GEMM */
    float *acc;                  /* [chunk, q or kv width] a biased projection's GEMM result before its bias
                                  * (qkv_bias models only; other GEMMs write their output, residual included) */
    /* The decode step (one token, its argmax fed back) as captured graphs,
     * one per recently used program, so switching between a few programs
     * (a benchmark, the top-k programs of a prediction) captures each once. */
    graph_entry graphs[GRAPH_CACHE];
    long graph_clock;            /* use counter for least-recently-used eviction */
};

polar_status cuda_error(polar_error *err, cudaError_t e, const char *what);

/* A graph capture on c's stream failed (its error cleared here): 1 when a
 * capture is worth trying again, overlapping launches now off (a driver may
 * not capture them; cuda_state_launches says so); 0 when not, and overlap on
 * again if an earlier failure turned it off (it was not the reason). */
int cuda_state_capture_failed(cuda_state *c);

/* Device memory freed with the state; NULL when out of memory. */
void *cuda_dev_alloc(cuda_state *c, size_t bytes);

/* y[T, rows] (=|+=) x . w^T (+ bias): tensor cores through cuBLASLt for more
 * than c->gemv_tokens tokens (x rounded to bf16 into c->xb first), the
 * hand-written GEMV for up to that many (and if cuBLASLt declines a shape). */
void cuda_mm(cuda_state *c, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
             int accumulate);
/* The same for the next product of the same x: c->xb holds it rounded
 * already (one conversion for q, k and v, or gate and up). */
void cuda_mm_rounded(cuda_state *c, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows,
                     int cols, int accumulate);

/* Tokens t0..t0+n-1 of a batch's pass that are consecutive positions of
 * one sequence (its block table at offset `table`): a prompt chunk, whose
 * attention the tiled prefill kernel runs. */
typedef struct {
    int t0, n, table;
} cuda_run;

/* One decoder layer over the T tokens of c->x, in place, their K/V rows in
 * the pool where map says. Attention: a session's run (map->run) through
 * the tiled prefill kernel beyond DECODE_TOKENS tokens, split-K (on scratch
 * c->scores) below; a batch's tokens through the tiled kernel for its
 * n_runs runs (ascending t0), split-K for the tokens between them. */
void cuda_layer_forward(cuda_state *c, const layer_weights *w, int T, const cuda_kv_map *map, const cuda_run *runs,
                        int n_runs);

#endif
