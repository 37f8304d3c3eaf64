/* The CUDA backend's state: the model's device weights (shared by every
 * batch of the model, cuda_weights.c), and per batch (per rank of a
 * tensor-parallel batch) the workspaces of one pass, the paged bf16 KV pool,
 * the mirror of the block tables, the stream and cuBLASLt (cuda_backend.c);
 * one decoder layer over them (cuda_layer.c). A batch's steps drive it
 * (cuda_batch.c). Built only with POLAR_CUDA. */
#ifndef POLAR_CUDA_INTERNAL_H
#define POLAR_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "../kernels/cuda/ops.h"
#include "backend.h"
#include "cuda_gemm.h"
#include "cuda_tp.h"
#include "tp_shard.h"

/* A pass of up to CUDA_GEMV_TOKENS tokens goes through the hand-written
 * GEMVs (a weight row read once for all of them), more through cuBLASLt
 * (backend.h says why 2; POLAR_CUDA_GEMV_TOKENS=N moves that limit to N,
 * 0 to CUDA_DECODE_TOKENS; the CPU's round_like_cuda mirrors only the
 * default). Attention is chosen apart
 * (cuda_layer_forward): the tiled prefill kernel for a run of more than
 * CUDA_DECODE_TOKENS consecutive positions, split-K for every other token,
 * however many the pass has. */
#define DECODE_TOKENS CUDA_DECODE_TOKENS
#define LOGIT_ROWS CUDA_LOGIT_ROWS

/* Device buffers freed together. */
typedef struct {
    void **p;
    int n, cap;
    size_t bytes; /* asked for, all allocations together */
} dev_allocs;

void *dev_alloc_in(dev_allocs *l, size_t bytes); /* NULL when out of memory */
void dev_free_all(dev_allocs *l);

/* A model's weights on one device, or a tensor-parallel rank's share of
 * them (model_device.weights: a list, one per device and rank), shared by
 * its batches. */
typedef struct cuda_weights {
    int device, rank, world;
    layer_weights *layers;       /* [n_layers] device pointers; t_* the device's storage: CPU_W_BF16, or a
                                  * GGUF's row-major blocks kept quantized (cuda_wmat) */
    const bf16 *embed, *final_norm;
    const bf16 *lm_head;         /* the rank's vocabulary rows */
    cpu_wtype t_embed, t_lm_head;
    int has_blocks;              /* some matrix went up as GGUF blocks (POLAR_CUDA_BLOCKS=1) */
    float *inv_freq;             /* [head_dim/2] */
    dev_allocs allocs;
    struct cuda_weights *next;
} cuda_weights;

/* The rank's share of m's weights on the current device, uploaded on first
 * use; NULL when out of GPU memory. */
const cuda_weights *cuda_model_weights(const polar_model *m, const tp_shard *s);

typedef struct cuda_state cuda_state;

/* What a cuda_state holds besides the model's device weights: workspaces
 * for chunk tokens, a paged bf16 KV pool of n_blocks blocks (ids of the
 * host's kv_pool) and a mirror of n_tables ints of block tables; the share
 * of a tensor-parallel rank (the whole model for one GPU) and its
 * communicator (NULL: no tensor parallel). */
typedef struct {
    int chunk, n_blocks, n_tables;
    tp_shard shard;
    ncclComm_t comm;
} cuda_state_shape;

struct cuda_state {
    const polar_model *m;
    tp_shard shard;              /* its heads, columns, experts and vocabulary rows (tp_shard.h) */
    ncclComm_t comm;             /* the tensor-parallel group's, or NULL */
    ncclResult_t nccl_error;     /* the first collective that failed to be issued */
    const cuda_weights *w;       /* the model's, not owned */
    const layer_weights *layers; /* == w->layers */
    const bf16 *embed, *final_norm, *lm_head;
    cpu_wtype t_embed, t_lm_head;
    const float *inv_freq;
    dev_allocs allocs;           /* KV cache and workspaces */
    int chunk;                   /* tokens of one pass at most */
    int sms;                     /* the GPU's multiprocessors (sizes the attention split) */
    bf16 *k_pool, *v_pool;       /* [n_blocks * CUDA_KV_BLOCK, shard.n_kv*head_dim] */
    size_t kv_bytes;             /* of k_pool and v_pool together */
    int *tables;                 /* [n_tables] the host's block tables, mirrored */
    float *x;                    /* [chunk, hidden] a pass's rows, gathered from the step's */
    float *xn, *q, *k, *v, *att; /* [chunk, *] as on the CPU */
    float *gate, *up;            /* [chunk, max(ffn, shared_ffn)] */
    float *scores;               /* split-K attention partials: cuda_attention_scratch_upto of chunk floats */
    int *att_tickets;            /* [chunk * n_kv] zeros: split-K attention merged by its last block (one launch;
                                  * POLAR_CUDA_FUSED_MERGE=1, off until measured), else NULL: a merge kernel */
    float *router_logits;        /* [chunk, n_experts]                          MoE models only */
    int *expert_idx;             /* [chunk, top_k] chosen experts, ascending */
    float *expert_w;             /* [chunk, top_k] their weights */
    int *groups;                 /* the chunk's slots grouped by expert (cuda_moe_group) */
    float *expert_act;           /* [chunk * top_k, moe_ffn] */
    float *expert_out;           /* [chunk * top_k, hidden] */
    float *shared_out;           /* [chunk, hidden] */
    cuda_queue queue;            /* its non-blocking stream (a cudaStream_t); overlap on sm_90 and later
                                  * unless POLAR_CUDA_PDL=0 (cuda_state_create) */
    const char *launches;        /* queue.overlap in words, and why not (cuda_state_launches) */
    int overlap_dropped;         /* a failed capture turned overlap off (cuda_state_capture_failed) */
    cuda_gemm *gemm;             /* cuBLASLt, for passes of more than gemv_tokens tokens */
    int gemv_tokens;             /* passes of up to this many tokens through the GEMVs (CUDA_GEMV_TOKENS, or
                                  * POLAR_CUDA_GEMV_TOKENS) */
    int fused_rope;              /* POLAR_CUDA_FUSED_ROPE=1: decode's q/k/v GEMV (bf16, no q/k norms) applies
                                  * RoPE and stores K/V itself (cuda_matmul_qkv_rope): one launch a layer fewer */
    int fused_route;             /* POLAR_CUDA_FUSED_ROUTE=1: a pass of up to 8 tokens routed and grouped by one
                                  * block (cuda_route_group): two launches an MoE layer fewer */
    int mma_gemv;                /* POLAR_CUDA_MMA_GEMV=1: passes of more than gemv_tokens and up to
                                  * CUDA_DECODE_TOKENS tokens over bf16 weights on the tensor-core GEMV
                                  * (cuda_matmul_mma), not cuBLASLt */
    int blocks_f32_gemv;         /* POLAR_CUDA_BLOCKS_Q8=0: every block GEMV unpacks to f32 (cuda_wmat) */
    int blocks_chunked_gemm;     /* POLAR_CUDA_BLOCKS_GEMM=chunked: a prefill over blocks dequantizes chunks of rows
                                  * into wb for cuBLASLt (the 2026-11-27 H200 run's path), not the fused
                                  * unpacking into the tensor-core tiles (cuda_gemm_blocks) */
    bf16 *xb;                    /* [chunk, widest input] activations rounded to bf16 for the GEMM */
    float *acc;                  /* [chunk, q or kv width] a biased projection's GEMM result before its bias
                                  * (qkv_bias models only; other GEMMs write their output, residual included) */
    bf16 *wb;                    /* [wb_elems] rows of a matrix of blocks dequantized for a prefill GEMM
                                  * (blocks on the device and blocks_chunked_gemm only, else NULL) */
    size_t wb_elems;
};

polar_status cuda_state_create(const polar_model *m, const cuda_state_shape *shape, cuda_state **out,
                               polar_error *err);
void cuda_state_free(cuda_state *c);

/* How c's kernels are launched ("overlapped", or "serial: " and why). */
const char *cuda_state_launches(const cuda_state *c);

polar_status cuda_error(polar_error *err, cudaError_t e, const char *what);

/* A graph capture on c's stream failed (its error cleared here): 1 when a
 * capture is worth trying again, overlapping launches now off (a driver may
 * not capture them; cuda_state_launches says so); 0 when not, and overlap on
 * again if an earlier failure turned it off (it was not the reason). */
int cuda_state_capture_failed(cuda_state *c);

/* Device memory freed with the state; NULL when out of memory. */
void *cuda_dev_alloc(cuda_state *c, size_t bytes);

/* Tensor parallel: the n floats at x summed over the ranks, in place, on
 * c's stream (a failure to issue it kept in c->nccl_error). Nothing without
 * a communicator. */
void cuda_all_reduce(cuda_state *c, float *x, size_t n);

/* y[T, rows] (=|+=) x . w^T (+ bias), w of storage t (bf16, or GGUF blocks
 * on the device): tensor cores through cuBLASLt for more than
 * c->gemv_tokens tokens (x rounded to bf16 into c->xb first; blocks
 * dequantized to bf16 a chunk of rows at a time; with c->mma_gemv, bf16
 * weights and up to CUDA_DECODE_TOKENS tokens, the tensor-core GEMV), the
 * hand-written GEMV for up to that many (and if cuBLASLt declines a shape). */
void cuda_mm(cuda_state *c, float *y, const float *x, const bf16 *w, cpu_wtype t, const bf16 *bias, int T, int rows,
             int cols, int accumulate);

/* Tokens t0..t0+n-1 of a pass that are consecutive positions of one
 * sequence (its block table at offset `table`): a prompt chunk, whose
 * attention the tiled prefill kernel runs. */
typedef struct {
    int t0, n, table;
} cuda_run;

/* One decoder layer over the T rows of x ([T, hidden], device), in place,
 * their K/V rows in the pool where map says (map.pos and map.table per
 * token): the tiled prefill kernel for the n_runs runs (ascending t0),
 * split-K (on scratch c->scores) for the tokens between them. */
void cuda_layer_forward(cuda_state *c, const layer_weights *w, float *x, int T, const cuda_kv_map *map,
                        const cuda_run *runs, int n_runs);

#endif
