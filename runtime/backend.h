/* What the host side knows of the CUDA backend (runtime/cuda_backend.c,
 * runtime/cuda_layer.c, runtime/cuda_batch.c): the shapes its kernels take
 * and that a CPU rounding like it mirrors, and the calls the rest of the
 * library makes. A batch reaches the GPU through batch_device.h. */
#ifndef POLAR_BACKEND_H
#define POLAR_BACKEND_H

#include <stdlib.h>

#include "model.h"
#include "polar.h"

/* Up to this many tokens a device pass runs the GEMVs on f32 activations;
 * more go through tensor-core GEMMs on activations rounded to bf16 (a CPU
 * batch with round_like_cuda mirrors this). On an H200 (2026-11-27,
 * bench/results/2026-11-27-h200/) cuBLASLt took a 1B-preset step of 4
 * sequences in 1.68 ms and of 8 in 1.70 where the 8-token GEMV took 2.25
 * and 3.84 (2 sequences: 1.41 either way), so the GEMVs keep 1-2 tokens;
 * POLAR_CUDA_GEMV_TOKENS=N (0 to CUDA_DECODE_TOKENS) moves the limit. */
#define CUDA_GEMV_TOKENS 2
/* The most tokens a GEMV pass takes, and the longest run of consecutive
 * positions that split-K attention serves (longer ones: the tiled prefill
 * kernel). */
#define CUDA_DECODE_TOKENS 8

/* Rows of logits computed at once (the outputs of a long append, or a
 * wide head, run in slices). */
#define CUDA_LOGIT_ROWS 32

/* Tokens a session's step takes at most on the GPU: a prefill of up to
 * this many tokens reads the weights once, through tensor-core GEMMs. */
#define CUDA_PREFILL_CHUNK 512

/* Whether MoE experts of this shape go through the tensor-core expert GEMM
 * (whole 16 x 16 tiles) in a pass of more than CUDA_DECODE_TOKENS rows. */
static inline int cuda_expert_gemm_fits(int hidden, int moe_ffn) { return hidden % 16 == 0 && moe_ffn % 16 == 0; }

/* Release a model's device weights (model_device.weights); polar_model_free
 * calls it once no batch is left. */
void cuda_weights_free(void *weights);

/* Whether the CUDA upload keeps a GGUF's blocks as blocks: only with
 * POLAR_CUDA_BLOCKS=1, until the block kernels are fast. On an H200
 * (2026-11-27) an 8-layer 1B-shaped Q4_K_M decoded in 1.83 ms a token from
 * its blocks and 0.63 ms from the bf16 upload, prefill 512 in 9.6 ms
 * against 3.0 (the block GEMVs then unpacked every weight to f32; since,
 * every kept type goes by dp4a, not yet timed on a GPU). */
static inline int cuda_keeps_blocks(void) {
    const char *v = getenv("POLAR_CUDA_BLOCKS");
    return v && v[0] == '1' && !v[1];
}

/* Whether the CUDA upload keeps layer w's routed experts as the GGUF's
 * three stacks (cuda_keeps_blocks, one of them of a block type, rows of a
 * multiple of 32 weights as the block kernels take them); else they go up
 * as bf16 for the bf16 expert kernels. */
static inline int cuda_keeps_expert_blocks(const polar_arch *a, const layer_weights *w) {
    int blocks = w->t_exp_gate != CPU_W_BF16 || w->t_exp_up != CPU_W_BF16 || w->t_exp_down != CPU_W_BF16;
    return w->exp_gate && blocks && a->hidden % 32 == 0 && a->moe_ffn % 32 == 0 && cuda_keeps_blocks();
}

/* GB/s of a device-to-device copy of bytes (read + written), best of 5. */
polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err);

/* GB/s of a kernel that reads bytes and sums them, best of 5. */
polar_status cuda_read_bandwidth(size_t bytes, double *gbps, polar_error *err);

#endif
