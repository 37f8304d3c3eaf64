/* A session's compute backend beyond the CPU reference. The CPU path lives
 * in session.c; a backend runs the same forward on a device and hands the
 * requested outputs back in host memory. */
#ifndef POLAR_BACKEND_H
#define POLAR_BACKEND_H

#include "model.h"
#include "polar.h"

typedef struct cuda_state cuda_state;

/* Tokens a device forward takes at once: a prefill of up to this many
 * tokens reads the weights once, through tensor-core GEMMs. */
#define CUDA_PREFILL_CHUNK 512

/* Up to this many tokens a device forward runs the GEMVs on f32
 * activations; more go through tensor-core GEMMs on activations rounded to
 * bf16 (a CPU session with round_like_cuda mirrors this). */
#define CUDA_DECODE_TOKENS 8

/* Rows of logits computed at once (the head of a long prefill, or of a
 * batch step, runs in slices). */
#define CUDA_LOGIT_ROWS 32

/* Whether MoE experts of this shape go through the tensor-core expert GEMM
 * (whole 16 x 16 tiles) in a prefill chunk. */
static inline int cuda_expert_gemm_fits(int hidden, int moe_ffn) { return hidden % 16 == 0 && moe_ffn % 16 == 0; }

/* What a cuda_state holds besides the model's device weights (uploaded by
 * the first state, shared after): workspaces for chunk tokens, a paged bf16
 * KV pool of n_blocks blocks (ids of the host's kv_pool) and a mirror of
 * n_tables ints of block tables. A session's tables are fixed at creation
 * (its kv_seq, every block mapped): execution position k's at k x
 * max_blocks; a batch's (cap_program 0, tables NULL) arrive by
 * cuda_batch_put_tables. */
typedef struct {
    int chunk;
    int cap_program;   /* a session: entries of its longest program (its decode graphs); 0: a batch's state */
    int n_blocks, n_tables;
    const int *tables; /* [n_tables] host ints, or NULL */
    int max_blocks;
} cuda_state_shape;

polar_status cuda_state_create(const polar_model *m, const cuda_state_shape *shape, cuda_state **out,
                               polar_error *err);
void cuda_state_free(cuda_state *c);

/* How c's kernels are launched (polar_session_cuda_launches); NULL without
 * a state. */
const char *cuda_state_launches(const cuda_state *c);

/* Release a model's device weights (model_device.weights); polar_model_free
 * calls it once no session is left. */
void cuda_weights_free(void *weights);

/* T tokens at positions pos.. through the program. Outputs (host, each
 * optional): logits of the last token (vocab), of every token (T x vocab),
 * final-normed hidden states (T x hidden). */
polar_status cuda_forward(cuda_state *c, const int *program, int n_program, const int *tokens, int T, int pos,
                          float *last_logits, float *all_logits, float *hidden, polar_error *err);

/* Greedy decoding on the device: appends token at pos, then keeps feeding
 * each step's argmax to the next step without the host, for at most
 * max_steps steps. Each step's chosen id goes to accept(id, user), which
 * returns 0 to stop there; the host reads a step's id while the next step
 * already runs. *n_steps: the steps whose ids were accepted or stopped on
 * (each appended one token); last_logits (vocab floats, optional): the
 * logits of the last of them. */
polar_status cuda_greedy(cuda_state *c, const int *program, int n_program, int token, int pos, int max_steps,
                         int (*accept)(int id, void *user), void *user, int *n_steps, float *last_logits,
                         polar_error *err);

/* ------------------------------------------------------------ batches
 * The GPU side of a polar_batch (runtime/batch.c plans the step on the
 * host and calls these through batch_device.h's cuda_batch_ops;
 * runtime/cuda_batch.c runs it): the step's residual rows, a paged
 * bf16 KV pool whose block ids are those of the host's kv_pool, a mirror of
 * the sequences' block tables, and the prefix cache's residual rows (the
 * host keeps its keys). Calls queue work on the batch's stream;
 * cuda_batch_head (or _finish) waits for the step and reports any device
 * error of it. */
typedef struct cuda_batch cuda_batch;

typedef struct {
    int rows;        /* tokens per step */
    int n_blocks;    /* pool blocks */
    int tables;      /* ints of the host's block tables, all sequences (max_seqs x cap_program x max_blocks) */
    int cap_program; /* entries of the longest program (a row takes part in at most that many passes) */
    int cache_items; /* prefix cache items (CPU_KV_BLOCK residual rows each); 0: no cache */
    int start_rows;  /* rows the sequences' cached prompt blocks start from (max_seqs x max_ctx), with a cache */
    int head_rows;   /* rows of a step's head at most (max_seqs) */
} cuda_batch_shape;

polar_status cuda_batch_create(const polar_model *m, const cuda_batch_shape *shape, cuda_batch **out,
                               polar_error *err);
void cuda_batch_free(cuda_batch *d);

/* The start of a step: clears the CUDA errors earlier calls left pending on
 * this thread (a failed allocation, say), so cuda_batch_finish reports only
 * the step's own. */
void cuda_batch_begin(cuda_batch *d);

/* The step's rows embed tokens[0..R). */
void cuda_batch_embed(cuda_batch *d, const int *tokens, int R);

/* Copy n ints of block tables (host) to the mirror at offset. */
void cuda_batch_put_tables(cuda_batch *d, const int *tables, int offset, int n);

/* Layer `layer` over T rows: row rows[t] at position pos[t] with the block
 * table at offset table[t] of the mirror. */
void cuda_batch_pass(cuda_batch *d, int layer, const int *rows, const int *pos, const int *table, int T);

/* Residual rows src.. -> dst.. (n rows); K/V pool rows from.. -> to.. (n). */
void cuda_batch_copy_rows(cuda_batch *d, int dst, int src, int n);
void cuda_batch_copy_kv(cuda_batch *d, size_t from, size_t to, int n);

/* The prefix cache's residual rows: residual rows row.. (n) into item; item's
 * rows into start rows start.. (n); then the step's rows[i] from start rows
 * starts[i] (i < n), after cuda_batch_embed. */
void cuda_batch_cache_keep(cuda_batch *d, int item, int row, int n);
void cuda_batch_cache_take(cuda_batch *d, int item, int start, int n);
void cuda_batch_rows_from_start(cuda_batch *d, const int *rows, const int *starts, int n);

/* Final norm and head over rows[0..n), their logits kept on the device
 * until the next step; ids[i] (host) = the argmax of row i, chosen there;
 * the rows with want[i] copied to the host (cuda_batch_host_logits, row i
 * at i x vocab): a step brings n ids back, not n x vocab floats. Waits for
 * the step. */
polar_status cuda_batch_head(cuda_batch *d, const int *rows, int n, const unsigned char *want, int *ids,
                             polar_error *err);

/* Pinned host memory [head_rows, vocab] the head's rows are copied to. */
float *cuda_batch_host_logits(cuda_batch *d);

/* Row i of the last head to the host now (the rows cuda_batch_head did not
 * copy), waiting for it. */
polar_status cuda_batch_copy_logits(cuda_batch *d, int i, polar_error *err);

/* Runs the step's calls (recorded until now: see cuda_batch.c) and waits
 * for them; the step's device error, if any. */
polar_status cuda_batch_finish(cuda_batch *d, polar_error *err);

/* How the last step ran: 0 call by call, 1 a captured graph replayed, 2 a
 * graph captured from it and run. */
int cuda_batch_step_graph(const cuda_batch *d);

/* How the batch's kernels are launched (cuda_state_launches). */
const char *cuda_batch_launches(const cuda_batch *d);

/* GB/s of a device-to-device copy of bytes (read + written), best of 5. */
polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err);

#endif
