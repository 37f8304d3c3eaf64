/* CUDA kernels, entered from C. Each launcher mirrors a CPU reference in
 * kernels/cpu/ops.h (same inputs, same math: bf16 weights, f32 activations
 * and statistics) and runs on the given queue (NULL: the default stream).
 * Pointers are device pointers; nothing here synchronises. */
#ifndef POLAR_CUDA_OPS_H
#define POLAR_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t bf16_bits;

/* Where a launcher's kernels go: a stream (a cudaStream_t), and whether
 * each may be scheduled while the previous kernel of the stream finishes
 * (overlap: programmatic dependent launch, sm_90 and later; the kernels wait
 * for it before touching memory, so results do not change); prefetch: the
 * bf16 GEMVs ask L2 for their weight rows before that wait (weights no
 * kernel writes), so blocks resident early stream them while the previous
 * kernel ends (POLAR_CUDA_PREFETCH=1; off until measured on a GPU);
 * stage_rows: the block GEMVs copy each warp's weight rows into shared
 * memory (cp.async) right after that wait, so the rows' memory latency
 * passes while the block quantizes its inputs instead of after
 * (POLAR_CUDA_BLOCKS_STAGE=1; off until measured on a GPU); ring: the bf16
 * GEMVs (alone, q/k/v, gate/up) keep their U loads a lane in flight to a
 * row's end (POLAR_CUDA_GEMV_RING=1; the same bits; off until measured). */
typedef struct {
    void *stream;
    int overlap;
    int prefetch;
    int stage_rows;
    int ring;
} cuda_queue;

/* Token rows of a batch's paged KV pool: CPU_KV_BLOCK of kernels/cpu/ops.h. */
#define CUDA_KV_BLOCK 16

/* K/V rows live in a paged pool of CUDA_KV_BLOCK-row blocks: position j of
 * a sequence at row tab[j / CUDA_KV_BLOCK] * CUDA_KV_BLOCK + j %
 * CUDA_KV_BLOCK under its block table tab.
 *
 * One sequence's run of T consecutive positions: token t at position
 * *pos0 + t under block table `table` (a session's tokens, whose position
 * lives on the device so a captured graph serves every step; a batch's
 * prompt chunk). The only shape the tiled prefill kernel takes. Device
 * pointers. */
typedef struct {
    const int *pos0, *table;
} cuda_kv_run;

/* Where the T tokens of a launch are: a run (run.pos0 set), or a batch's
 * tokens of any sequences (run.pos0 NULL: token t at pos[t] under the table
 * at tables + table[t]). Device pointers. */
typedef struct {
    cuda_kv_run run;
    const int *pos, *table;
    const int *tables;
} cuda_kv_map;

/* x[T, hidden] = table[tokens[t], :]; with from, the rows whose from[t] >=
 * 0 take ids[from[t]] as their token instead (a greedy step's argmax fed to
 * the next step on the device). */
void cuda_embed(float *x, const bf16_bits *table, const int *tokens, const int *ids, const int *from, int T, int hidden,
                const cuda_queue *queue);

/* out[T, n] = x / sqrt(mean(x^2) + eps) * w, row by row */
void cuda_rmsnorm(float *out, const float *x, const bf16_bits *w, int T, int n, float eps, const cuda_queue *queue);

/* y[T, rows] (=|+=) x[T, cols] . W[rows, cols]^T (+ bias): a warp per row,
 * 16-byte loads of W, up to 8 tokens per pass over a row. */
void cuda_matmul(float *y, const float *x, const bf16_bits *w, const bf16_bits *bias, int T, int rows, int cols,
                 int accumulate, const cuda_queue *queue);

/* cuda_matmul_qkv (norm on the fly when given) with cuda_qk_rope_store's
 * RoPE and K/V store (no q/k norms) in the epilogue, one launch: q rotated
 * into q[T, n_heads * head_dim], k rotated and v into the pools at the
 * tokens' rows of map; the same bits as the two launches. */
void cuda_matmul_qkv_rope(float *q, const float *x, const bf16_bits *wq, const bf16_bits *wk, const bf16_bits *wv,
                          const bf16_bits *bq, const bf16_bits *bk, const bf16_bits *bv, const bf16_bits *norm,
                          float eps, const float *inv_freq, float rope_scale, bf16_bits *k_pool, bf16_bits *v_pool,
                          cuda_kv_map map, int T, int n_heads, int n_kv, int head_dim, int cols,
                          const cuda_queue *queue);

/* cuda_matmul for 1..16 tokens on tensor cores (kernels/cuda/mma_gemv.cu):
 * x rounded to bf16 as for cuBLASLt, f32 sums, y rows ldy floats apart; 0
 * (nothing launched) unless rows is a multiple of 16, cols of 64, w 32-byte
 * and x 16-byte aligned. */
int cuda_matmul_mma(float *y, int ldy, const float *x, const bf16_bits *w, const bf16_bits *bias, int T, int rows,
                    int cols, int accumulate, const cuda_queue *queue);

/* q, k, v = xn . Wq^T + bq, xn . Wk^T + bk, xn . Wv^T + bv in one launch
 * (biases may be NULL), where xn = x, or with norm (RMSNorm weights[cols],
 * 16-byte aligned) xn = cuda_rmsnorm(x, norm, eps) computed on the fly (the
 * same math, the sums in another order). */
void cuda_matmul_qkv(float *q, float *k, float *v, const float *x, const bf16_bits *wq, const bf16_bits *wk,
                     const bf16_bits *wv, const bf16_bits *bq, const bf16_bits *bk, const bf16_bits *bv,
                     const bf16_bits *norm, float eps, int T, int q_rows, int kv_rows, int cols,
                     const cuda_queue *queue);

/* act[T, F] = silu(xn . Wgate^T) * (xn . Up^T): the MLP's first half, the
 * gate and up rows read by one warp, no intermediate written; xn as in
 * cuda_matmul_qkv. */
void cuda_matmul_swiglu(float *act, const float *x, const bf16_bits *norm, float eps, const bf16_bits *w_gate,
                        const bf16_bits *w_up, int T, int F, int cols, const cuda_queue *queue);

/* Per token (map as cuda_kv_map): optional per-head RMSNorm of q and k
 * (Qwen3), rotate-half RoPE at the token's position (cos and sin times
 * rope_scale), then k and v written as bf16 into the pool rows of that
 * position. */
void cuda_qk_rope_store(float *q, const float *k, const float *v, const bf16_bits *q_norm, const bf16_bits *k_norm,
                        const float *inv_freq, float rope_scale, bf16_bits *k_pool, bf16_bits *v_pool,
                        cuda_kv_map map, int T, int n_heads, int n_kv, int head_dim, float eps,
                        const cuda_queue *queue);

/* Causal GQA attention of T tokens, each over its sequence's positions
 * 0..its own in the pool (head_dim <= 256). Decode (a few tokens, or a
 * batch's tokens of any sequences): split-K over the keys with a
 * log-sum-exp merge, scratch of cuda_attention_scratch(T, ...) floats.
 * Prefill (one sequence's run): a tiled flash-attention kernel, no
 * scratch. */
size_t cuda_attention_scratch(int T, int n_heads, int head_dim);
/* Enough scratch for any T <= max_T at the splits cuda_attention_splits
 * picks on a GPU of sms multiprocessors. */
size_t cuda_attention_scratch_upto(int max_T, int n_heads, int n_kv, int head_dim, int sms);
int cuda_attention_splits(int T, int n_kv, int sms); /* splits for a GPU of sms multiprocessors */
/* tickets: NULL, a second kernel merges the splits; else T * n_kv ints,
 * all 0 (and left 0), with which the last split block of each (token, KV
 * head) merges its heads itself: one launch, the same bits. */
void cuda_attention_decode(float *out, const float *q, const bf16_bits *k_pool, const bf16_bits *v_pool,
                           float *scratch, cuda_kv_map map, int T, int n_heads, int n_kv, int head_dim, int splits,
                           int *tickets, const cuda_queue *queue);
/* Once per process and head_dim before the first prefill: the prefill
 * kernel's shared-memory limit. Returns a cudaError_t (0: success).
 * rows_per_warp: query rows each warp of the CUDA-core prefill kernel owns
 * (1, 2 or 4), or CUDA_ATTENTION_TENSOR_CORES: the tensor-core kernel
 * (bf16 queries and probabilities; head_dim a multiple of 16 up to 128, else
 * the CUDA-core one); 0 chooses by T, n_heads and head_dim (tensor cores
 * from 256 tokens); the tests force each. */
#define CUDA_ATTENTION_TENSOR_CORES 16
int cuda_attention_prepare(int head_dim);
void cuda_attention_prefill(float *out, const float *q, const bf16_bits *k_pool, const bf16_bits *v_pool,
                            cuda_kv_run run, int T, int n_heads, int n_kv, int head_dim, int rows_per_warp,
                            const cuda_queue *queue);

/* xb[n] = bf16(x[n]) (round to nearest even), for tensor-core GEMMs. */
void cuda_to_bf16(bf16_bits *xb, const float *x, long n, const cuda_queue *queue);

/* y[T, rows] = acc[T, rows] + bias (+ y when accumulate): the epilogue of a
 * GEMM that wrote acc. */
void cuda_bias_residual(float *y, const float *acc, const bf16_bits *bias, int T, int rows, int accumulate,
                        const cuda_queue *queue);

/* dst[dst_idx[i]] = src[src_idx[i]] for the n rows of width floats (a NULL
 * index is the identity): a batch's rows gathered for a layer pass and
 * scattered back. */
void cuda_copy_rows(float *dst, const float *src, const int *dst_idx, const int *src_idx, int n, int width,
                    const cuda_queue *queue);

/* g[T, n] = silu(g) * u */
void cuda_swiglu(float *g, const float *u, int count, const cuda_queue *queue);

/* out[r] = argmax(logits[r, n]), the lowest index on ties, NaNs passed over
 * and 0 when no logit is above -infinity (as polar_argmax), for each of
 * rows rows; host (may be NULL) gets the ids too: host memory mapped for
 * the device (cudaHostAllocMapped, its device pointer). */
void cuda_argmax_rows(int *out, int *host, const float *logits, int rows, int n, const cuda_queue *queue);

/* The argmax of a vocabulary split over ranks (tensor parallel): each rank's
 * rows of n logits, its vocabulary from token `base`, give per row the
 * largest value and its token (as cuda_argmax_rows, base + the local id)
 * into part = [values[rows] as floats, ids[rows] as ints]; the parts of
 * n_parts ranks gathered one after another (in rank order) merge into
 * out[rows] (and host, as above): the first rank's on ties, so the lowest
 * id, as one argmax over the whole vocabulary. */
void cuda_argmax_part(float *part, const float *logits, int rows, int n, int base, const cuda_queue *queue);
void cuda_argmax_merge(int *out, int *host, const float *parts, int rows, int n_parts, const cuda_queue *queue);

/* MoE routing of T tokens from their normed states x[T, H] and the router
 * W[E, H], as cpu_route: the logits[T, E] (a scratch the caller provides)
 * by the row-parallel GEMV, softmax over them in f32, the top k (lower
 * index on ties), renormalised when norm, written in ascending expert order:
 * idx[T, k], weight[T, k]. */
void cuda_route(int *idx, float *weight, float *logits, const float *x, const bf16_bits *w_router, int T, int E, int H,
                int k, int norm, const cuda_queue *queue);

/* The T*k routed slots grouped by expert on the device (layout in moe.cu),
 * into groups of cuda_moe_group_ints(T, k, E) ints: the slots routed to
 * experts e0..e0+E-1, as experts 0..E-1 of the grouping (a rank's experts
 * under expert parallel; e0 = 0 and every expert otherwise), the others
 * left out. */
size_t cuda_moe_group_ints(int T, int k, int E);
void cuda_moe_group(int *groups, const int *idx, int T, int k, int e0, int E, const cuda_queue *queue);
/* cuda_route then cuda_moe_group for a pass of up to 8 tokens as one launch
 * of one block (the same logits, picks and groups); 0 (nothing launched)
 * for more tokens. With mlp_norm (else NULL, resid unused), it first writes
 * x = cuda_rmsnorm(resid, mlp_norm) itself, the same bits. */
int cuda_route_group(int *groups, int *idx, float *weight, float *logits, float *x, const float *resid,
                     const bf16_bits *mlp_norm, float eps, const bf16_bits *w_router, int T, int E, int H, int k,
                     int norm, int e0, int E_local, const cuda_queue *queue);

/* A shared expert's product run inside cuda_expert_matmul's launch: with
 * up, y[t, rows] = silu(x_t . gate_r) * (x_t . up_r) (gate and up each
 * [rows, cols]); without, y[t, rows] = x_t . gate_r; over all T tokens. */
typedef struct {
    const bf16_bits *gate, *up; /* NULL gate: none */
    const float *x;             /* [T, cols] */
    float *y;                   /* [T, rows] */
    int rows, cols;
} cuda_shared_gemv;

/* Expert GEMV over the grouped slots, each chosen expert's rows read once
 * per 8 of its slots: for slot s = t*k + j routed to expert e,
 * y[s, rows] = x_s . W[e]^T where W is [E, rows, cols] and x_s is x[t]
 * (x_per_slot = 0) or x[s] (1). With swiglu, W[e] is the gate-then-up block
 * and y[s, rows/2] = silu(gate) * up. sh (or NULL): a shared expert's
 * product in the same launch (the same bits as cuda_matmul_swiglu /
 * cuda_matmul of it). */
void cuda_expert_matmul(float *y, const float *x, const bf16_bits *w, const int *groups, int T, int k, int E,
                        int rows, int cols, int x_per_slot, int swiglu, const cuda_shared_gemv *sh,
                        const cuda_queue *queue);

/* The same on tensor cores for a prefill chunk: inputs xb in bf16 (rows as
 * x above), f32 accumulation. Returns 0 (launching nothing) unless cols and
 * the output rows are multiples of 16. */
int cuda_expert_gemm(float *y, const bf16_bits *xb, const bf16_bits *w, const int *groups, int T, int k, int E,
                     int rows, int cols, int x_per_slot, int swiglu, const cuda_queue *queue);

/* x[t] += sum_j weight[t, j] * y[t*k + j] (in j order) over the slots routed
 * (idx[T, k]) to experts e0..e0+E-1 (the grouped ones: other slots' y are
 * not read), plus, when shared is not NULL, sigmoid(xn[t] . gate_w) *
 * shared[t]: the MoE residual, deterministic. Without residual, x[t] = that
 * sum alone (a tensor-parallel rank's part, all-reduced after). */
void cuda_moe_combine(float *x, const float *y, const float *weight, const int *idx, int e0, int E,
                      const float *shared, const float *xn, const bf16_bits *gate_w, int T, int k, int H, int residual,
                      const cuda_queue *queue);

/* A weight matrix for the block kernels (quant.cu): rows of bf16 (type
 * CPU_W_BF16) or of a GGUF block type kept quantized (type: a row-major
 * kept cpu_wtype of kernels/cpu/quant.h, not an x16 layout), each row
 * the file's blocks, row_bytes apart. f32_gemv: the GEMVs unpack even
 * Q4_K, Q5_K and Q6_K to f32 instead of multiplying them by dp4a on
 * quantized inputs (kernels/cuda/q8.cuh; POLAR_CUDA_BLOCKS_Q8=0). */
typedef struct {
    const void *p;
    int type;
    size_t row_bytes;
    int f32_gemv;
} cuda_wmat;

/* cuda_matmul over any cuda_wmat (cols a multiple of 32): y rows ldy
 * floats apart, a warp per row. */
void cuda_matmul_blocks(float *y, int ldy, const float *x, cuda_wmat w, const bf16_bits *bias, int T, int rows,
                        int cols, int accumulate, const cuda_queue *queue);
/* The warps a block has when the block GEMVs stage rows (queue->stage_rows)
 * of matrices w[0..nw), R rows a warp (2: gate/up), for T tokens of cols
 * inputs; 0: they read rows from global memory (not staging, or rows too
 * long or of no 4-byte multiple). */
int cuda_blocks_staged_warps(const cuda_wmat *w, int nw, int R, int T, int cols, const cuda_queue *queue);
/* cuda_matmul_qkv and cuda_matmul_swiglu over cuda_wmats, each its own type. */
void cuda_matmul_qkv_blocks(float *q, float *k, float *v, const float *x, cuda_wmat wq, cuda_wmat wk, cuda_wmat wv,
                            const bf16_bits *bq, const bf16_bits *bk, const bf16_bits *bv, const bf16_bits *norm,
                            float eps, int T, int q_rows, int kv_rows, int cols, const cuda_queue *queue);
void cuda_matmul_swiglu_blocks(float *act, const float *x, const bf16_bits *norm, float eps, cuda_wmat gate,
                               cuda_wmat up, int T, int F, int cols, const cuda_queue *queue);
/* cuda_expert_matmul over routed experts kept as blocks, at any number of
 * tokens: expert e's rows are rows e*rows.. of gate, W[e] above; with
 * up.p not NULL (swiglu) of gate and of up, y[s, rows] = silu(gate) * up.
 * cols a multiple of 32. */
void cuda_expert_matmul_blocks(float *y, const float *x, cuda_wmat gate, cuda_wmat up, const int *groups, int T, int k,
                               int E, int rows, int cols, int x_per_slot, const cuda_queue *queue);
/* cuda_expert_gemm over routed experts kept as blocks (rows and up as for
 * cuda_expert_matmul_blocks; cols a multiple of 32): the blocks unpacked
 * to bf16 in shared memory, the tensor cores on them. */
void cuda_expert_gemm_blocks(float *y, const bf16_bits *xb, cuda_wmat gate, cuda_wmat up, const int *groups, int T,
                             int k, int E, int rows, int cols, int x_per_slot, const cuda_queue *queue);
/* The same over T tokens for one matrix of blocks (cols a multiple of 32):
 * y[t, r] (+= when accumulate) = xb_t . gate_r (+ bias[r]), y's rows ldy
 * floats apart; with up.p not NULL y[t, r] = silu(xb_t . gate_r) *
 * (xb_t . up_r), no bias. */
void cuda_gemm_blocks(float *y, int ldy, const bf16_bits *xb, cuda_wmat gate, cuda_wmat up, const bf16_bits *bias,
                      int T, int rows, int cols, int accumulate, const cuda_queue *queue);
/* out[n, cols] = rows r0..r0+n-1 of w, dequantized and rounded to bf16 (a
 * prefill GEMM's weights, a chunk at a time). */
void cuda_dequantize_rows(bf16_bits *out, cuda_wmat w, int r0, int n, int cols, const cuda_queue *queue);
/* cuda_embed from a table of any cuda_wmat. */
void cuda_embed_blocks(float *x, cuda_wmat table, const int *tokens, const int *ids, const int *from, int T,
                       int hidden, const cuda_queue *queue);

/* A read of bytes (a multiple of 16) of buf by `blocks` blocks of 512
 * threads, each block's sum of its words into out[blocks]: what the
 * device's read bandwidth is measured with. */
void cuda_read_sum(unsigned *out, int blocks, const void *buf, size_t bytes, const cuda_queue *queue);

#ifdef __cplusplus
}
#endif
#endif
