/* The predictor on the GPU: the weights (one contiguous f32 block) uploaded
 * once, workspaces for up to 512 tokens, and one fused kernel per call
 * (kernels/cuda/predictor.cu). Without POLAR_CUDA it says so. */
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "predictor.h"

#ifndef POLAR_CUDA

polar_status polar_predictor_use_device(polar_predictor *p, polar_device device, polar_error *err) {
    if (!p) return polar_fail(err, POLAR_ERR_ARG, "no predictor");
    if (device == POLAR_DEVICE_CUDA)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "predictor: this build has no CUDA backend (build it with make cuda)");
    return POLAR_OK;
}

polar_status pred_cuda_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op, polar_error *err) {
    (void)p, (void)h, (void)T, (void)seg, (void)op;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "predictor: this build has no CUDA backend");
}

void pred_cuda_free(void *state) { (void)state; }

float *pred_cuda_input(const polar_predictor *p) {
    (void)p;
    return NULL;
}

#else

#include <cuda_runtime_api.h>

#include "../kernels/cuda/predictor_cuda.h"

/* the cross-attention's keys are the question's tokens */
_Static_assert(PRED_MAX_TOKENS <= PRED_CUDA_MAX_KEYS, "the kernel's probabilities hold PRED_CUDA_MAX_KEYS keys");

typedef struct {
    pred_cuda_args args;
    int grid;                /* cooperative blocks, all resident at once */
    float *weights, *work;
    float *host_out;         /* pinned [4 D]: seg, then op, on their way to the caller */
    cudaStream_t stream;
} pred_cuda;

void pred_cuda_free(void *state) {
    pred_cuda *c = state;
    if (!c) return;
    cudaFree(c->weights);
    cudaFree(c->work);
    cudaFreeHost(c->host_out);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

/* The device twin of a host weight pointer inside p->storage. */
static const float *dev(const polar_predictor *p, const pred_cuda *c, const float *host) {
    return c->weights + (host - p->storage);
}

polar_status polar_predictor_use_device(polar_predictor *p, polar_device device, polar_error *err) {
    if (!p) return polar_fail(err, POLAR_ERR_ARG, "no predictor");
    if (device != POLAR_DEVICE_CUDA) {
        pred_cuda_free(p->cuda);
        p->cuda = NULL;
        return POLAR_OK;
    }
    if (p->cuda) return POLAR_OK;
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "predictor: %s", why);
    if (p->D > PRED_CUDA_MAX_KEYS)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "predictor: cuda: %d layer positions (the kernel takes up to %d)",
                          p->D, PRED_CUDA_MAX_KEYS);
    const char *wide = getenv("POLAR_CUDA_PRED_WIDE"); /* off until a GPU times it */
    if (wide && strcmp(wide, "0") && strcmp(wide, "1"))
        return polar_fail(err, POLAR_ERR_ARG, "predictor: cuda: POLAR_CUDA_PRED_WIDE=%s: 0 or 1", wide);
    const char *ring = getenv("POLAR_CUDA_PRED_ASYNC"); /* off until a GPU times it */
    if (ring && strcmp(ring, "0") && strcmp(ring, "1"))
        return polar_fail(err, POLAR_ERR_ARG, "predictor: cuda: POLAR_CUDA_PRED_ASYNC=%s: 0 or 1", ring);
    const char *fuse = getenv("POLAR_CUDA_PRED_FUSE_NORM"); /* off until a GPU times it */
    if (fuse && strcmp(fuse, "0") && strcmp(fuse, "1"))
        return polar_fail(err, POLAR_ERR_ARG, "predictor: cuda: POLAR_CUDA_PRED_FUSE_NORM=%s: 0 or 1", fuse);
    int grid, tile_k = wide && !strcmp(wide, "1") ? 128 : 32, async = ring && !strcmp(ring, "1");
    int fuse_norm = fuse && !strcmp(fuse, "1");
    if (async && tile_k != 32)
        return polar_fail(err, POLAR_ERR_ARG,
                          "predictor: cuda: POLAR_CUDA_PRED_WIDE=1 and POLAR_CUDA_PRED_ASYNC=1: one or the other");
    if (async && fuse_norm) /* the normed inputs are staged through registers, not copied by cp.async */
        return polar_fail(err, POLAR_ERR_ARG,
                          "predictor: cuda: POLAR_CUDA_PRED_ASYNC=1 and POLAR_CUDA_PRED_FUSE_NORM=1: one or the other");
    if (!cuda_predictor_grid(tile_k, async, fuse_norm, &grid, why, sizeof why))
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "predictor: cuda: %s", why);
    pred_cuda *c = calloc(1, sizeof *c);
    if (!c) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    c->grid = grid;
    /* the workspaces, each rounded to 4 floats: the kernel reads rows as float4 */
    size_t D = (size_t)p->D, d = (size_t)p->d, T = PRED_MAX_TOKENS;
    size_t sizes[] = {T * p->dq, T * d, D * d, T * 2 * d, D * 3 * d, D * d, D * d, D * d, D * d, D * p->ff, D, D * 3};
    enum { N_WORK = sizeof sizes / sizeof sizes[0] };
    size_t work = 0;
    for (int i = 0; i < N_WORK; i++) work += sizes[i] = (sizes[i] + 3) / 4 * 4;
    /* A non-blocking stream and an async upload: a legacy-stream copy would
     * fail while another thread captures a decode graph. */
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->weights, p->storage_floats * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->work, work * sizeof(float));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&c->host_out, 4 * D * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(c->weights, p->storage, p->storage_floats * sizeof(float), cudaMemcpyHostToDevice,
                            c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        pred_cuda_free(c);
        return polar_fail(err, POLAR_ERR_IO, "predictor: cuda: %s", cudaGetErrorString(e));
    }
    pred_cuda_args *a = &c->args;
    a->D = p->D, a->d = p->d, a->dq = p->dq, a->heads = p->heads, a->ff = p->ff, a->tile_k = tile_k, a->async = async;
    a->fuse_norm = fuse_norm;
    a->q_proj_w = dev(p, c, p->q_proj_w), a->q_proj_b = dev(p, c, p->q_proj_b), a->layer_emb = dev(p, c, p->layer_emb);
    a->cross = (pred_cuda_mha){dev(p, c, p->cross.in_w), dev(p, c, p->cross.in_b), dev(p, c, p->cross.out_w),
                               dev(p, c, p->cross.out_b)};
    for (int b = 0; b < PRED_CUDA_BLOCKS; b++) {
        const pred_block *k = &p->blocks[b];
        a->blocks[b] = (pred_cuda_block){
            {dev(p, c, k->attn.in_w), dev(p, c, k->attn.in_b), dev(p, c, k->attn.out_w), dev(p, c, k->attn.out_b)},
            dev(p, c, k->lin1_w), dev(p, c, k->lin1_b), dev(p, c, k->lin2_w), dev(p, c, k->lin2_b),
            dev(p, c, k->norm1_w), dev(p, c, k->norm1_b), dev(p, c, k->norm2_w), dev(p, c, k->norm2_b)};
    }
    a->seg_w = dev(p, c, p->seg_w), a->seg_b = dev(p, c, p->seg_b), a->op_w = dev(p, c, p->op_w);
    a->op_b = dev(p, c, p->op_b);
    float *h, **bufs[N_WORK] = {&h,      &a->tok, &a->q,   &a->kv,  &a->qkv, &a->att,
                               &a->x,   &a->x2,  &a->y,   &a->hid, &a->seg, &a->op};
    float *w = c->work;
    for (int i = 0; i < N_WORK; i++) *bufs[i] = w, w += sizes[i];
    a->h = h;
    p->cuda = c;
    return POLAR_OK;
}

float *pred_cuda_input(const polar_predictor *p) { return p->cuda ? (float *)((pred_cuda *)p->cuda)->args.h : NULL; }

/* The states uploaded unless they are already the device input (an encoder
 * on the GPU wrote them there); the logits back through pinned memory (a
 * pageable copy is staged by the driver and waits for it). */
polar_status pred_cuda_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op, polar_error *err) {
    pred_cuda *c = p->cuda;
    size_t D = (size_t)p->D;
    c->args.T = T;
    cudaError_t e = cudaSuccess;
    if (h != c->args.h)
        e = cudaMemcpyAsync((float *)c->args.h, h, (size_t)T * p->dq * sizeof(float), cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = (cudaError_t)cuda_predictor_launch(&c->args, c->grid, c->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(c->host_out, c->args.seg, D * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(c->host_out + D, c->args.op, D * 3 * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return polar_fail(err, POLAR_ERR_IO, "predictor: cuda: %s", cudaGetErrorString(e));
    c->args.q_ready = 1; /* the layer queries stay in the workspace for the next calls */
    memcpy(seg, c->host_out, D * sizeof(float));
    memcpy(op, c->host_out + D, D * 3 * sizeof(float));
    return POLAR_OK;
}

#endif
