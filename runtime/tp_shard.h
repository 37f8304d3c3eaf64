/* What one rank of a tensor-parallel group holds of a model (Megatron-style,
 * docs/cuda.md): its query heads and the key/value heads they
 * read, its columns of every dense MLP and of the shared expert, its
 * experts, its rows of the head. Host arithmetic only: the CUDA backend
 * uploads and computes these shares (cuda_backend.c, cuda_layer.c), and the
 * tests check the splits on the CPU. */
#ifndef POLAR_TP_SHARD_H
#define POLAR_TP_SHARD_H

#include "polar.h"

/* Dense MLP and shared-expert splits fall on multiples of this many columns:
 * the GEMVs read a row 8 bf16 at a time when its length allows. */
#define TP_COLUMN_ALIGN 8

typedef struct {
    int rank, world;
    int q0, n_heads;      /* query heads q0 .. q0 + n_heads - 1 */
    int kv0, n_kv;        /* the key/value heads they read (on several ranks when fewer than ranks) */
    int f0, ffn;          /* dense MLP columns (gate/up rows, down columns) */
    int s0, shared_ffn;   /* the shared expert's */
    int e0, n_experts;    /* experts (expert parallel); every rank routes over all of them */
    int v0, vocab;        /* rows of the head (the vocabulary split) */
    int vocab_part;       /* ceil(vocab / world): each rank's part of an all-gather of logits */
} tp_shard;

/* Rank `rank` of `world` on model shape a; POLAR_ERR_UNSUPPORTED with the
 * shape that does not split (more ranks than heads, experts or columns, or
 * query heads that cannot be given out with whole groups of the heads that
 * share a key/value head). world 1 is the whole model. */
polar_status tp_shard_of(const polar_arch *a, int rank, int world, tp_shard *out, polar_error *err);

#endif
