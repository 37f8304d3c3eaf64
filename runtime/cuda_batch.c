/* The device side of a batch (backend.h): runtime/batch.c plans each step
 * on the host and calls these to run it on the GPU. A layer pass gathers
 * its rows of the step's residual into the workspace of a slotless
 * cuda_state, runs cuda_layer_forward with each token's position and block
 * table, and scatters them back. The ints a step needs on the device
 * (tokens, table updates, each pass's rows, positions and tables, the head
 * rows) go through one pinned staging area, each at its own offset, so
 * nothing is overwritten before its copy has run; the offsets start again
 * after the step's sync. Built with POLAR_CUDA; without it there is no
 * device batch to create. */
#include "backend.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifndef POLAR_CUDA

polar_status cuda_batch_create(const polar_model *m, const cuda_batch_shape *shape, cuda_batch **out,
                               polar_error *err) {
    (void)m, (void)shape;
    *out = NULL;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build it with make cuda)");
}

void cuda_batch_free(cuda_batch *d) { (void)d; }
void cuda_batch_begin(cuda_batch *d) { (void)d; }
void cuda_batch_embed(cuda_batch *d, const int *tokens, int R) { (void)d, (void)tokens, (void)R; }
void cuda_batch_put_tables(cuda_batch *d, const int *tables, int offset, int n) {
    (void)d, (void)tables, (void)offset, (void)n;
}
void cuda_batch_pass(cuda_batch *d, int layer, const int *rows, const int *pos, const int *table, int T) {
    (void)d, (void)layer, (void)rows, (void)pos, (void)table, (void)T;
}
void cuda_batch_copy_rows(cuda_batch *d, int dst, int src, int n) { (void)d, (void)dst, (void)src, (void)n; }
void cuda_batch_copy_kv(cuda_batch *d, size_t from, size_t to, int n) { (void)d, (void)from, (void)to, (void)n; }
void cuda_batch_cache_keep(cuda_batch *d, int item, int row, int n) { (void)d, (void)item, (void)row, (void)n; }
void cuda_batch_cache_take(cuda_batch *d, int item, int start, int n) { (void)d, (void)item, (void)start, (void)n; }
void cuda_batch_rows_from_start(cuda_batch *d, const int *rows, const int *starts, int n) {
    (void)d, (void)rows, (void)starts, (void)n;
}
polar_status cuda_batch_head(cuda_batch *d, const int *rows, int n, const unsigned char *want, int *ids,
                             polar_error *err) {
    (void)d, (void)rows, (void)n, (void)want, (void)ids;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}
float *cuda_batch_host_logits(cuda_batch *d) {
    (void)d;
    return NULL;
}
polar_status cuda_batch_copy_logits(cuda_batch *d, int i, polar_error *err) {
    (void)d, (void)i;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}
polar_status cuda_batch_finish(cuda_batch *d, polar_error *err) {
    (void)d;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

#else

#include "../kernels/cpu/ops.h"
#include "cuda_internal.h"

/* The host's block ids index the device's pool */
_Static_assert(CUDA_KV_BLOCK == CPU_KV_BLOCK, "one block size on the host and the device");

struct cuda_batch {
    cuda_state *c;         /* weights, workspaces for `rows` tokens, stream, cuBLASLt; no KV slots */
    int rows;
    size_t kv_dim;
    bf16 *k_pool, *v_pool; /* [n_blocks * CUDA_KV_BLOCK, kv_dim] */
    int *tables;           /* [tables] the host's block tables, mirrored */
    float *x;              /* [rows, hidden] the step's residual streams */
    float *cache_rows;     /* [cache_items * CUDA_KV_BLOCK, hidden] the prefix cache's residual rows */
    float *start;          /* [start_rows, hidden] rows cached prompt blocks start from, per sequence */
    int *ints;             /* [cap_ints] the step's uploaded ints */
    int *staging;          /* pinned host [cap_ints], at the same offsets */
    int head_rows;
    float *logits;         /* [head_rows, vocab] the last head's logits */
    int *ids;              /* [head_rows] their argmax */
    float *host_logits;    /* pinned host [head_rows, vocab]: the rows the host asked for */
    int *host_ids;         /* pinned host [head_rows] */
    size_t used, cap_ints;
    int failed;            /* a copy failed or the step wanted more than cap_ints: finish reports it */
};

polar_status cuda_batch_create(const polar_model *m, const cuda_batch_shape *shape, cuda_batch **out,
                               polar_error *err) {
    *out = NULL;
    const polar_arch *a = &m->arch;
    const cuda_batch_shape *sh = shape;
    cuda_batch *d = calloc(1, sizeof *d);
    if (!d) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    polar_status st = cuda_state_create(m, 0, 1, sh->rows, &d->c, err);
    if (st != POLAR_OK) {
        free(d);
        return st;
    }
    size_t H = (size_t)a->hidden, R = (size_t)sh->rows, V = (size_t)a->vocab, HR = (size_t)sh->head_rows;
    d->rows = sh->rows, d->head_rows = sh->head_rows;
    d->kv_dim = (size_t)a->n_kv_heads * a->head_dim;
    /* tokens, every table, a (row, pos, table) per row and pass, a (row,
     * start) per row from the cache, head rows */
    d->cap_ints = R + (size_t)sh->tables + 3 * R * sh->cap_program + 2 * R + R;
    size_t pool = (size_t)sh->n_blocks * CUDA_KV_BLOCK * d->kv_dim;
    int ok = (d->k_pool = cuda_dev_alloc(d->c, pool * sizeof(bf16))) &&
             (d->v_pool = cuda_dev_alloc(d->c, pool * sizeof(bf16))) &&
             (d->tables = cuda_dev_alloc(d->c, (size_t)sh->tables * sizeof(int))) &&
             (d->x = cuda_dev_alloc(d->c, R * H * sizeof(float))) &&
             (d->ints = cuda_dev_alloc(d->c, d->cap_ints * sizeof(int))) &&
             (d->logits = cuda_dev_alloc(d->c, HR * V * sizeof(float))) &&
             (d->ids = cuda_dev_alloc(d->c, HR * sizeof(int))) &&
             cudaMallocHost((void **)&d->staging, d->cap_ints * sizeof(int)) == cudaSuccess &&
             cudaMallocHost((void **)&d->host_logits, HR * V * sizeof(float)) == cudaSuccess &&
             cudaMallocHost((void **)&d->host_ids, HR * sizeof(int)) == cudaSuccess;
    if (ok && sh->cache_items)
        ok = (d->cache_rows = cuda_dev_alloc(d->c, (size_t)sh->cache_items * CUDA_KV_BLOCK * H * sizeof(float))) &&
             (d->start = cuda_dev_alloc(d->c, (size_t)sh->start_rows * H * sizeof(float)));
    if (!ok) {
        cuda_batch_free(d);
        return polar_fail(err, POLAR_ERR_NOMEM,
                          "device cuda: out of GPU memory for the batch (a KV pool of %d blocks, %d rows per step, a "
                          "prefix cache of %d items)",
                          sh->n_blocks, sh->rows, sh->cache_items);
    }
    *out = d;
    return POLAR_OK;
}

void cuda_batch_free(cuda_batch *d) {
    if (!d) return;
    if (d->staging) cudaFreeHost(d->staging);
    if (d->host_logits) cudaFreeHost(d->host_logits);
    if (d->host_ids) cudaFreeHost(d->host_ids);
    cuda_state_free(d->c); /* the pool, tables and rows go with the state's own buffers */
    free(d);
}

/* n_parts arrays of n ints each onto the device for this step in one copy,
 * one after the other, at `to` or else in the step's array; the device
 * address of the first (NULL when the step's area is spent). */
static const int *upload_ints(cuda_batch *d, const int *const *parts, int n_parts, size_t n, int *to) {
    size_t total = (size_t)n_parts * n;
    if (d->used + total > d->cap_ints) {
        d->failed = 1;
        return NULL;
    }
    int *stage = d->staging + d->used, *dev = to ? to : d->ints + d->used;
    for (int i = 0; i < n_parts; i++) memcpy(stage + i * n, parts[i], n * sizeof(int));
    if (cudaMemcpyAsync(dev, stage, total * sizeof(int), cudaMemcpyHostToDevice, d->c->stream) != cudaSuccess)
        d->failed = 1;
    d->used += total;
    return dev;
}

void cuda_batch_begin(cuda_batch *d) {
    (void)d;
    (void)cudaGetLastError();
}

void cuda_batch_embed(cuda_batch *d, const int *tokens, int R) {
    const int *dev = upload_ints(d, &tokens, 1, (size_t)R, NULL);
    if (dev) cuda_embed(d->x, d->c->embed, dev, R, d->c->m->arch.hidden, d->c->stream);
}

void cuda_batch_put_tables(cuda_batch *d, const int *tables, int offset, int n) {
    upload_ints(d, &tables, 1, (size_t)n, d->tables + offset);
}

void cuda_batch_pass(cuda_batch *d, int layer, const int *rows, const int *pos, const int *table, int T) {
    cuda_state *c = d->c;
    int H = c->m->arch.hidden;
    const int *parts[3] = {rows, pos, table}, *r = upload_ints(d, parts, 3, (size_t)T, NULL);
    if (!r) return;
    cuda_kv_map map = {NULL, r + T, r + 2 * T, d->tables};
    cuda_copy_rows(c->x, d->x, NULL, r, T, H, c->stream);
    cuda_layer_forward(c, &c->layers[layer], 0, T, &map, d->k_pool, d->v_pool);
    cuda_copy_rows(d->x, c->x, r, NULL, T, H, c->stream);
}

/* n f32 rows of the residual width, device to device. */
static void copy_f32_rows(cuda_batch *d, float *dst, const float *src, int n) {
    size_t bytes = (size_t)n * d->c->m->arch.hidden * sizeof(float);
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->c->stream) != cudaSuccess) d->failed = 1;
}

void cuda_batch_copy_rows(cuda_batch *d, int dst, int src, int n) {
    size_t H = (size_t)d->c->m->arch.hidden;
    copy_f32_rows(d, d->x + dst * H, d->x + src * H, n);
}

void cuda_batch_copy_kv(cuda_batch *d, size_t from, size_t to, int n) {
    size_t w = d->kv_dim, bytes = (size_t)n * w * sizeof(bf16);
    cudaStream_t s = d->c->stream;
    if (cudaMemcpyAsync(d->k_pool + to * w, d->k_pool + from * w, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess ||
        cudaMemcpyAsync(d->v_pool + to * w, d->v_pool + from * w, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        d->failed = 1;
}

void cuda_batch_cache_keep(cuda_batch *d, int item, int row, int n) {
    size_t H = (size_t)d->c->m->arch.hidden;
    copy_f32_rows(d, d->cache_rows + (size_t)item * CUDA_KV_BLOCK * H, d->x + (size_t)row * H, n);
}

void cuda_batch_cache_take(cuda_batch *d, int item, int start, int n) {
    size_t H = (size_t)d->c->m->arch.hidden;
    copy_f32_rows(d, d->start + (size_t)start * H, d->cache_rows + (size_t)item * CUDA_KV_BLOCK * H, n);
}

void cuda_batch_rows_from_start(cuda_batch *d, const int *rows, const int *starts, int n) {
    const int *parts[2] = {rows, starts}, *r = upload_ints(d, parts, 2, (size_t)n, NULL);
    if (r) cuda_copy_rows(d->x, d->start, r, r + n, n, d->c->m->arch.hidden, d->c->stream);
}

polar_status cuda_batch_head(cuda_batch *d, const int *rows, int n, const unsigned char *want, int *ids,
                             polar_error *err) {
    cuda_state *c = d->c;
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab;
    const int *r = n <= d->head_rows ? upload_ints(d, &rows, 1, (size_t)n, NULL) : NULL;
    if (!r) d->failed = 1;
    if (r) {
        cuda_copy_rows(c->x, d->x, NULL, r, n, H, c->stream);
        cuda_rmsnorm(c->xn, c->x, c->final_norm, n, H, (float)a->rms_eps, c->stream);
        /* in slices of LOGIT_ROWS rows, as a session's head (a CPU batch
         * rounding like the GPU mirrors the slices) */
        for (int r0 = 0; r0 < n; r0 += LOGIT_ROWS) {
            int k = n - r0 < LOGIT_ROWS ? n - r0 : LOGIT_ROWS;
            cuda_mm(c, d->logits + (size_t)r0 * V, c->xn + (size_t)r0 * H, c->lm_head, NULL, k, V, H, 0);
        }
        cuda_argmax_rows(d->ids, d->logits, n, V, c->stream);
        if (cudaMemcpyAsync(d->host_ids, d->ids, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, c->stream) !=
            cudaSuccess)
            d->failed = 1;
        for (int i = 0; i < n; i++)
            if (want[i] && cudaMemcpyAsync(d->host_logits + (size_t)i * V, d->logits + (size_t)i * V,
                                           (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, c->stream) != cudaSuccess)
                d->failed = 1;
    }
    polar_status st = cuda_batch_finish(d, err);
    if (st == POLAR_OK) memcpy(ids, d->host_ids, (size_t)n * sizeof(int));
    return st;
}

float *cuda_batch_host_logits(cuda_batch *d) { return d->host_logits; }

polar_status cuda_batch_copy_logits(cuda_batch *d, int i, polar_error *err) {
    size_t V = (size_t)d->c->m->arch.vocab;
    if (cudaMemcpyAsync(d->host_logits + (size_t)i * V, d->logits + (size_t)i * V, V * sizeof(float),
                        cudaMemcpyDeviceToHost, d->c->stream) != cudaSuccess)
        d->failed = 1;
    return cuda_batch_finish(d, err);
}

polar_status cuda_batch_finish(cuda_batch *d, polar_error *err) {
    cudaError_t e = cudaStreamSynchronize(d->c->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    int failed = d->failed;
    d->used = 0, d->failed = 0;
    if (e != cudaSuccess) return cuda_error(err, e, "batch step");
    if (failed)
        return polar_fail(err, POLAR_ERR_IO, "cuda: batch step: a copy to the device failed or the step's %zu ints ran out",
                          d->cap_ints);
    return POLAR_OK;
}

#endif
