/* The CUDA backend's state: per batch (per rank of a tensor-parallel
 * batch) a cuda_state (cuda_internal.h) over the model's device weights
 * (cuda_weights.c); the device's bandwidth. The layer is cuda_layer.c's; a
 * batch's steps are cuda_batch.c's. Built by `make cuda` (POLAR_CUDA);
 * without it there is no GPU to find. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifndef POLAR_CUDA

int polar_cuda_available(char *why, size_t why_size) {
    if (why && why_size) snprintf(why, why_size, "this build has no CUDA backend (build it with make cuda)");
    return 0;
}

polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err) {
    (void)bytes, (void)gbps;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

polar_status cuda_read_bandwidth(size_t bytes, double *gbps, polar_error *err) {
    (void)bytes, (void)gbps;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

#else

#include <cuda_runtime_api.h>

#include "cuda_internal.h"

polar_status cuda_error(polar_error *err, cudaError_t e, const char *what) {
    return polar_fail(err, POLAR_ERR_IO, "cuda: %s: %s", what, cudaGetErrorString(e));
}

int polar_cuda_available(char *why, size_t why_size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why && why_size)
            snprintf(why, why_size, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 0;
    }
    return 1;
}

void *cuda_dev_alloc(cuda_state *c, size_t bytes) { return dev_alloc_in(&c->allocs, bytes); }

void cuda_all_reduce(cuda_state *c, float *x, size_t n) {
    if (!c->comm) return;
    ncclResult_t r = ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c->comm, c->queue.stream);
    if (r != ncclSuccess && c->nccl_error == ncclSuccess) c->nccl_error = r;
}

void cuda_state_free(cuda_state *c) {
    if (!c) return;
    cuda_gemm_free(c->gemm);
    dev_free_all(&c->allocs);
    if (c->queue.stream) cudaStreamDestroy(c->queue.stream);
    free(c);
}

const char *cuda_state_launches(const cuda_state *c) { return c ? c->launches : NULL; }

int cuda_state_capture_failed(cuda_state *c) {
    (void)cudaGetLastError();
    if (c->queue.overlap) { /* a driver may not capture overlapping launches: try without */
        c->queue.overlap = 0, c->overlap_dropped = 1;
        c->launches = "serial: the driver would not capture overlapping launches in a graph";
        return 1;
    }
    if (c->overlap_dropped) { /* it fails without them too: they were not the reason */
        c->queue.overlap = 1, c->overlap_dropped = 0;
        c->launches = "overlapped";
    }
    return 0;
}

polar_status cuda_state_create(const polar_model *m, const cuda_state_shape *shape, cuda_state **out,
                               polar_error *err) {
    *out = NULL;
    int chunk = shape->chunk;
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: %s", why);
    const polar_arch *a = &m->arch;
    cuda_state *c = calloc(1, sizeof *c);
    if (!c) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    c->m = m;
    c->chunk = chunk;
    c->shard = shape->shard, c->comm = shape->comm;
    if (a->head_dim > 256) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: head_dim %d (at most 256)", a->head_dim);
    }
    c->gemv_tokens = CUDA_GEMV_TOKENS;
    const char *gemv = getenv("POLAR_CUDA_GEMV_TOKENS");
    if (gemv) {
        char *end;
        long n = strtol(gemv, &end, 10);
        if (end == gemv || *end || n < 0 || n > DECODE_TOKENS) {
            cuda_state_free(c);
            return polar_fail(err, POLAR_ERR_ARG, "device cuda: POLAR_CUDA_GEMV_TOKENS=%s: not a whole number from 0 to %d",
                              gemv, DECODE_TOKENS);
        }
        c->gemv_tokens = (int)n;
    }
    const char *q8 = getenv("POLAR_CUDA_BLOCKS_Q8");
    if (q8 && strcmp(q8, "0") && strcmp(q8, "1")) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_ARG, "device cuda: POLAR_CUDA_BLOCKS_Q8=%s: 0 or 1", q8);
    }
    c->blocks_f32_gemv = q8 && !strcmp(q8, "0");
    const char *gemm = getenv("POLAR_CUDA_BLOCKS_GEMM");
    if (gemm && strcmp(gemm, "fused") && strcmp(gemm, "chunked")) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_ARG, "device cuda: POLAR_CUDA_BLOCKS_GEMM=%s: fused or chunked", gemm);
    }
    c->blocks_chunked_gemm = gemm && !strcmp(gemm, "chunked");
    /* the switches of decode variants off until a GPU times them: 0 or 1 */
    static const char *const switches[] = {"POLAR_CUDA_FUSED_ROPE", "POLAR_CUDA_FUSED_ROUTE", "POLAR_CUDA_MMA_GEMV",
                                           "POLAR_CUDA_BLOCKS_STAGE", "POLAR_CUDA_GEMV_RING"};
    int *flags[] = {&c->fused_rope, &c->fused_route, &c->mma_gemv, &c->queue.stage_rows, &c->queue.ring};
    for (int i = 0; i < (int)(sizeof switches / sizeof switches[0]); i++) {
        const char *v = getenv(switches[i]);
        if (v && strcmp(v, "0") && strcmp(v, "1")) {
            cuda_state_free(c);
            return polar_fail(err, POLAR_ERR_ARG, "device cuda: %s=%s: 0 or 1", switches[i], v);
        }
        *flags[i] = v && !strcmp(v, "1");
    }
    if (!(c->w = cuda_model_weights(m, &c->shard))) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_NOMEM, "device cuda: out of GPU memory for the model's weights");
    }
    c->layers = c->w->layers;
    c->embed = c->w->embed, c->final_norm = c->w->final_norm, c->lm_head = c->w->lm_head, c->inv_freq = c->w->inv_freq;
    c->t_embed = c->w->t_embed, c->t_lm_head = c->w->t_lm_head;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, dev);
    /* non-blocking: another thread's legacy-stream copy must not join (and
     * break) this stream's graph capture */
    cudaStream_t stream = NULL;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    c->queue.stream = stream;
    int major = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = (cudaError_t)cuda_attention_prepare(a->head_dim);
    if (e != cudaSuccess) {
        cuda_state_free(c);
        return cuda_error(err, e, "device attributes and stream");
    }
    const char *pdl = getenv("POLAR_CUDA_PDL");
    c->queue.overlap = major >= 9 && !(pdl && !strcmp(pdl, "0"));
    const char *prefetch = getenv("POLAR_CUDA_PREFETCH");
    c->queue.prefetch = prefetch && !strcmp(prefetch, "1");
    c->launches = c->queue.overlap ? "overlapped"
                  : major < 9     ? "serial: the GPU is older than compute capability 9.0"
                                  : "serial: POLAR_CUDA_PDL=0";
    const tp_shard *sh = &c->shard;
    size_t H = (size_t)a->hidden, q = (size_t)sh->n_heads * a->head_dim, kv = (size_t)sh->n_kv * a->head_dim;
    size_t F = (size_t)sh->ffn;
    if ((size_t)sh->shared_ffn > F) F = (size_t)sh->shared_ffn; /* gate/up buffers serve the shared expert too */
    size_t C = (size_t)chunk, pool = (size_t)shape->n_blocks * CUDA_KV_BLOCK * kv, n_tables = (size_t)shape->n_tables;
    c->kv_bytes = 2 * pool * sizeof(bf16);
    int ok = (c->k_pool = cuda_dev_alloc(c, pool * sizeof(bf16))) && (c->v_pool = cuda_dev_alloc(c, pool * sizeof(bf16))) &&
         (c->tables = cuda_dev_alloc(c, n_tables * sizeof(int))) &&
         (c->x = cuda_dev_alloc(c, C * H * 4)) && (c->xn = cuda_dev_alloc(c, C * H * 4)) && (c->q = cuda_dev_alloc(c, C * q * 4)) &&
         (c->k = cuda_dev_alloc(c, C * kv * 4)) && (c->v = cuda_dev_alloc(c, C * kv * 4)) && (c->att = cuda_dev_alloc(c, C * q * 4)) &&
         (c->gate = cuda_dev_alloc(c, C * F * 4)) && (c->up = cuda_dev_alloc(c, C * F * 4)) &&
         /* a pass may run all its rows through split-K attention */
         (c->scores = cuda_dev_alloc(c, cuda_attention_scratch_upto(chunk, sh->n_heads, sh->n_kv, a->head_dim, c->sms) * 4));
    /* GEMM inputs: any projection's of a chunk, or a slice of a head's */
    size_t widest_in = H > q ? H : q;
    if (F > widest_in) widest_in = F;
    if ((size_t)a->top_k * a->moe_ffn > widest_in) widest_in = (size_t)a->top_k * a->moe_ffn; /* expert inputs */
    ok = ok && (c->gemm = cuda_gemm_create()) && (c->xb = cuda_dev_alloc(c, C * widest_in * sizeof(bf16))) &&
         (!a->qkv_bias || (c->acc = cuda_dev_alloc(c, C * (q > kv ? q : kv) * 4)));
    const char *fused = getenv("POLAR_CUDA_FUSED_MERGE");
    if (ok && fused && !strcmp(fused, "1"))
        ok = (c->att_tickets = cuda_dev_alloc(c, C * (size_t)sh->n_kv * sizeof(int))) &&
             cudaMemset(c->att_tickets, 0, C * (size_t)sh->n_kv * sizeof(int)) == cudaSuccess;
    if (ok && c->w->has_blocks && c->blocks_chunked_gemm) { /* prefill GEMMs over blocks: a chunk of rows as bf16,
                                                             * up to 32 MB */
        size_t rows = (size_t)sh->vocab > widest_in ? (size_t)sh->vocab : widest_in;
        c->wb_elems = rows * widest_in < ((size_t)16 << 20) ? rows * widest_in : (size_t)16 << 20;
        ok = (c->wb = cuda_dev_alloc(c, c->wb_elems * sizeof(bf16))) != NULL;
    }
    if (ok && a->n_experts) {
        size_t slots = C * (size_t)a->top_k, MF = (size_t)a->moe_ffn;
        size_t groups = cuda_moe_group_ints(chunk, a->top_k, sh->n_experts);
        ok = (c->router_logits = cuda_dev_alloc(c, C * (size_t)a->n_experts * 4)) &&
             (c->expert_idx = cuda_dev_alloc(c, slots * sizeof(int))) && (c->expert_w = cuda_dev_alloc(c, slots * 4)) &&
             (c->groups = cuda_dev_alloc(c, groups * sizeof(int))) && (c->expert_act = cuda_dev_alloc(c, slots * MF * 4)) &&
             (c->expert_out = cuda_dev_alloc(c, slots * H * 4)) && (c->shared_out = cuda_dev_alloc(c, C * H * 4));
    }
    if (!ok) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_NOMEM, "device cuda: out of GPU memory for the KV cache and workspaces");
    }
    *out = c;
    return POLAR_OK;
}

polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err) {
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: %s", why);
    void *a = NULL, *b = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&t0);
    if (e == cudaSuccess) e = cudaEventCreate(&t1);
    double best = 0;
    for (int rep = 0; rep < 6 && e == cudaSuccess; rep++) { /* the first is a warm-up */
        float ms = 0;
        e = cudaEventRecord(t0, 0);
        if (e == cudaSuccess) e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
        if (e == cudaSuccess) e = cudaEventRecord(t1, 0);
        if (e == cudaSuccess) e = cudaEventSynchronize(t1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t0, t1);
        if (e == cudaSuccess && rep > 0 && ms > 0 && 2.0 * (double)bytes / (ms * 1e6) > best)
            best = 2.0 * (double)bytes / (ms * 1e6);
    }
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    if (e != cudaSuccess) return cuda_error(err, e, "copy bandwidth");
    *gbps = best;
    return POLAR_OK;
}

polar_status cuda_read_bandwidth(size_t bytes, double *gbps, polar_error *err) {
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: %s", why);
    bytes &= ~(size_t)15;
    int sms = 0;
    void *buf = NULL;
    unsigned *sums = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int blocks = 4 * (sms > 0 ? sms : 1); /* 2048 threads an SM: every SM's loads in flight */
    if (e == cudaSuccess) e = cudaMalloc(&buf, bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&sums, (size_t)blocks * sizeof *sums);
    if (e == cudaSuccess) e = cudaMemset(buf, 1, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&t0);
    if (e == cudaSuccess) e = cudaEventCreate(&t1);
    double best = 0;
    for (int rep = 0; rep < 6 && e == cudaSuccess; rep++) { /* the first is a warm-up */
        float ms = 0;
        e = cudaEventRecord(t0, 0);
        if (e == cudaSuccess) cuda_read_sum(sums, blocks, buf, bytes, NULL), e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaEventRecord(t1, 0);
        if (e == cudaSuccess) e = cudaEventSynchronize(t1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t0, t1);
        if (e == cudaSuccess && rep > 0 && ms > 0 && (double)bytes / (ms * 1e6) > best) best = (double)bytes / (ms * 1e6);
    }
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(buf);
    cudaFree(sums);
    if (e != cudaSuccess) return cuda_error(err, e, "read bandwidth");
    *gbps = best;
    return POLAR_OK;
}

#endif
