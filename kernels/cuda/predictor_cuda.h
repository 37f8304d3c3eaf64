/* The fused predictor kernel's arguments: device pointers to the f32
 * weights (PyTorch layout [out, in]) and workspaces. Shared by the kernel
 * (C++) and the host side (C). */
#ifndef POLAR_PREDICTOR_CUDA_H
#define POLAR_PREDICTOR_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PRED_CUDA_BLOCKS 2

typedef struct {
    const float *in_w, *in_b, *out_w, *out_b;
} pred_cuda_mha;

typedef struct {
    pred_cuda_mha attn;
    const float *lin1_w, *lin1_b, *lin2_w, *lin2_b, *norm1_w, *norm1_b, *norm2_w, *norm2_b;
} pred_cuda_block;

typedef struct {
    int D, d, dq, heads, ff, T;
    int tile_k;              /* columns a linear stages a step: 32, or 128 (POLAR_CUDA_PRED_WIDE=1) */
    int async;               /* tile_k 32 through a ring of cp.async stages (POLAR_CUDA_PRED_ASYNC=1) */
    int fuse_norm;           /* LayerNorms inside the linears that read them (POLAR_CUDA_PRED_FUSE_NORM=1) */
    const float *q_proj_w, *q_proj_b, *layer_emb;
    pred_cuda_mha cross;
    pred_cuda_block blocks[PRED_CUDA_BLOCKS];
    const float *seg_w, *seg_b, *op_w, *op_b;
    const float *h;          /* [T, dq] token states */
    float *tok;              /* [T, d] */
    float *q;                /* [D, d] the cross-attention's queries (the same every call) */
    int q_ready;             /* q holds them: a call has completed */
    float *kv;               /* [T, 2d] its keys | values */
    float *qkv;              /* [D, 3d] an encoder layer's queries | keys | values */
    float *att, *x, *y;      /* [D, d] */
    float *x2;               /* [D, d] the residual's other buffer (fuse_norm) */
    float *hid;              /* [D, ff] */
    float *seg, *op;         /* [D], [D, 3] outputs */
} pred_cuda_args;

#define PRED_CUDA_THREADS 256
#define PRED_CUDA_MAX_KEYS 512 /* keys of one attention (T, or D): probabilities in shared memory */

/* The cooperative grid for the current device and the kernel of tile_k (and async, fuse_norm):
 * *blocks = every block that can be resident at once. 0 with the reason in
 * why when the device cannot run the fused kernel (no cooperative launch, no
 * room on a multiprocessor). */
int cuda_predictor_grid(int tile_k, int async, int fuse_norm, int *blocks, char *why, size_t why_size);
/* One cooperative launch of the whole network over that grid; the cudaError_t. */
int cuda_predictor_launch(const pred_cuda_args *args, int blocks, void *stream);

#ifdef __cplusplus
}
#endif
#endif
