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

/* Whether MoE experts of this shape go through the tensor-core expert GEMM
 * (whole 16 x 16 tiles) in a prefill chunk. */
static inline int cuda_expert_gemm_fits(int hidden, int moe_ffn) { return hidden % 16 == 0 && moe_ffn % 16 == 0; }

/* Device state for a session: the model's device weights (uploaded by the
 * first session, shared after), KV slots for cap_program
 * execution positions x max_ctx tokens, workspaces for chunk tokens. */
polar_status cuda_state_create(const polar_model *m, int cap_program, int max_ctx, int chunk, cuda_state **out,
                               polar_error *err);
void cuda_state_free(cuda_state *c);

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

/* GB/s of a device-to-device copy of bytes (read + written), best of 5. */
polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err);

#endif
