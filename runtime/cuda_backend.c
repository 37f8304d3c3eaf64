/* The CUDA backend of a session: the CPU forward of session.c, op for op, on
 * the GPU (kernels/cuda), dense and mixture-of-experts layers. The weights
 * are uploaded once per model, by its first CUDA session, and shared; each
 * session's KV cache is a paged bf16 pool under the block tables of its
 * host kv_seq, as a batch's. Built by `make cuda`
 * (POLAR_CUDA); without it every entry point says so. */
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

polar_status cuda_state_create(const polar_model *m, const cuda_state_shape *shape, cuda_state **out,
                               polar_error *err) {
    (void)m, (void)shape;
    *out = NULL;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build it with make cuda)");
}

void cuda_state_free(cuda_state *c) { (void)c; }

const char *cuda_state_launches(const cuda_state *c) {
    (void)c;
    return NULL;
}

void cuda_weights_free(void *weights) { (void)weights; }

polar_status cuda_forward(cuda_state *c, const int *program, int n_program, const int *tokens, int T, int pos,
                          float *last_logits, float *all_logits, float *hidden, polar_error *err) {
    (void)c, (void)program, (void)n_program, (void)tokens, (void)T, (void)pos, (void)last_logits, (void)all_logits,
        (void)hidden;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

polar_status cuda_greedy(cuda_state *c, const int *program, int n_program, int token, int pos, int max_steps,
                         int (*accept)(int id, void *user), void *user, int *n_steps, float *last_logits,
                         polar_error *err) {
    (void)c, (void)program, (void)n_program, (void)token, (void)pos, (void)max_steps, (void)accept, (void)user,
        (void)last_logits;
    *n_steps = 0;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err) {
    (void)bytes, (void)gbps;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

#else

#include <cuda_runtime_api.h>
#include <pthread.h>

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

static void *dev_alloc_in(dev_allocs *l, size_t bytes) {
    void *p = NULL;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        void **a = realloc(l->p, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        l->p = a;
        l->cap = cap;
    }
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) return NULL;
    l->p[l->n++] = p;
    return p;
}

static void dev_free_all(dev_allocs *l) {
    for (int i = 0; i < l->n; i++) cudaFree(l->p[i]);
    free(l->p);
    memset(l, 0, sizeof *l);
}

void *cuda_dev_alloc(cuda_state *c, size_t bytes) { return dev_alloc_in(&c->allocs, bytes); }

/* Upload n elements of a host tensor (NULL stays NULL). */
static int upload(cuda_weights *w, const bf16 **dst, const bf16 *src, size_t n) {
    if (!src) {
        *dst = NULL;
        return 1;
    }
    void *d = dev_alloc_in(&w->allocs, n * sizeof(bf16));
    if (!d || cudaMemcpy(d, src, n * sizeof(bf16), cudaMemcpyHostToDevice) != cudaSuccess) return 0;
    *dst = d;
    return 1;
}

/* A matrix of the model as bf16 on the device: GGUF blocks the CPU keeps
 * quantized (row-major or interleaved) are dequantized row by row here (the
 * CUDA kernels read bf16). */
static int upload_w(cuda_weights *w, const bf16 **dst, const bf16 *src, cpu_wtype t, size_t rows, size_t cols) {
    if (t == CPU_W_BF16 || !src) return upload(w, dst, src, rows * cols);
    bf16 *buf = malloc(rows * cols * sizeof *buf);
    float *f = malloc(cols * sizeof *f);
    int ok = buf && f;
    for (size_t r = 0; ok && r < rows; r++) {
        cpu_dequantize_matrix_row(t, src, cols, (int)r, f);
        for (size_t j = 0; j < cols; j++) buf[r * cols + j] = f32_to_bf16(f[j]);
    }
    ok = ok && upload(w, dst, buf, rows * cols);
    free(buf);
    free(f);
    return ok;
}

void cuda_weights_free(void *weights) {
    cuda_weights *w = weights;
    if (!w) return;
    dev_free_all(&w->allocs);
    free(w->layers);
    free(w);
}

/* The experts' gate and up rows as the CUDA kernels read them, [E, 2F, H]
 * bf16 (gate rows, then up rows, per expert): a Hugging Face checkpoint's
 * block as it is, or a GGUF's two stacks (possibly kept in blocks)
 * interleaved expert by expert. */
static int upload_gate_up(cuda_weights *w, const bf16 **dst, const layer_weights *l, size_t E, size_t F, size_t H) {
    if (l->exp_gate_up) return upload(w, dst, l->exp_gate_up, E * 2 * F * H);
    bf16 *buf = malloc(E * 2 * F * H * sizeof *buf);
    float *f = malloc(H * sizeof *f);
    int ok = buf && f;
    for (size_t r = 0; ok && r < E * 2 * F; r++) { /* row r: expert r / 2F, gate when r % 2F < F */
        size_t e = r / (2 * F), i = r % (2 * F);
        int gate = i < F;
        cpu_dequantize_matrix_row(gate ? l->t_exp_gate : l->t_exp_up, gate ? l->exp_gate : l->exp_up, H,
                                  (int)(e * F + (gate ? i : i - F)), f);
        for (size_t j = 0; j < H; j++) buf[r * H + j] = f32_to_bf16(f[j]);
    }
    ok = ok && upload(w, dst, buf, E * 2 * F * H);
    free(buf);
    free(f);
    return ok;
}

/* Every weight of the model on the device; NULL when out of memory. */
static cuda_weights *weights_upload(const polar_model *m) {
    const polar_arch *a = &m->arch;
    cuda_weights *c = calloc(1, sizeof *c);
    if (!c || !(c->layers = calloc((size_t)a->n_layers, sizeof *c->layers))) {
        free(c);
        return NULL;
    }
    size_t H = (size_t)a->hidden, q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim;
    size_t F = (size_t)a->ffn, V = (size_t)a->vocab, hd = (size_t)a->head_dim;
    int ok = upload_w(c, &c->embed, m->embed, m->t_embed, V, H) && upload(c, &c->final_norm, m->final_norm, H);
    c->lm_head = c->embed;
    if (ok && !a->tied_embeddings) ok = upload_w(c, &c->lm_head, m->lm_head, m->t_lm_head, V, H);
    for (int l = 0; ok && l < a->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        layer_weights *d = &c->layers[l];
        ok = upload(c, &d->attn_norm, w->attn_norm, H) && upload_w(c, &d->wq, w->wq, w->t_wq, q, H) &&
             upload_w(c, &d->wk, w->wk, w->t_wk, kv, H) && upload_w(c, &d->wv, w->wv, w->t_wv, kv, H) &&
             upload(c, &d->bq, w->bq, q) &&
             upload(c, &d->bk, w->bk, kv) && upload(c, &d->bv, w->bv, kv) && upload(c, &d->q_norm, w->q_norm, hd) &&
             upload(c, &d->k_norm, w->k_norm, hd) && upload_w(c, &d->wo, w->wo, w->t_wo, H, q) &&
             upload(c, &d->mlp_norm, w->mlp_norm, H) && upload_w(c, &d->w_gate, w->w_gate, w->t_gate, F, H) &&
             upload_w(c, &d->w_up, w->w_up, w->t_up, F, H) && upload_w(c, &d->w_down, w->w_down, w->t_down, H, F);
        if (ok && w->router) {
            size_t E = (size_t)a->n_experts, MF = (size_t)a->moe_ffn, S = (size_t)a->shared_ffn;
            ok = upload(c, &d->router, w->router, E * H) && upload_gate_up(c, &d->exp_gate_up, w, E, MF, H) &&
                 upload_w(c, &d->exp_down, w->exp_down, w->t_exp_down, E * H, MF) &&
                 upload_w(c, &d->sh_gate, w->sh_gate, w->t_sh_gate, S, H) && upload_w(c, &d->sh_up, w->sh_up, w->t_sh_up, S, H) &&
                 upload_w(c, &d->sh_down, w->sh_down, w->t_sh_down, H, S) && upload(c, &d->sh_router, w->sh_router, H);
        }
    }
    ok = ok && (c->inv_freq = dev_alloc_in(&c->allocs, hd / 2 * sizeof(float))) &&
         cudaMemcpy(c->inv_freq, m->rope_inv_freq, hd / 2 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
    if (!ok) {
        cuda_weights_free(c);
        return NULL;
    }
    return c;
}

/* The model's device weights, uploaded on first use under its lock. */
static const cuda_weights *model_weights(const polar_model *m) {
    pthread_mutex_lock(&m->device->lock);
    if (!m->device->weights) m->device->weights = weights_upload(m);
    const cuda_weights *w = m->device->weights;
    pthread_mutex_unlock(&m->device->lock);
    return w;
}

void cuda_state_free(cuda_state *c) {
    if (!c) return;
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
        free(c->graphs[i].program);
    }
    if (c->staging) cudaFreeHost(c->staging);
    if (c->ring) cudaFreeHost((void *)c->ring);
    for (int i = 0; i < 2; i++)
        if (c->step_done[i]) cudaEventDestroy(c->step_done[i]);
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
    int cap_program = shape->cap_program, chunk = shape->chunk;
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: %s", why);
    const polar_arch *a = &m->arch;
    cuda_state *c = calloc(1, sizeof *c);
    if (!c) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    c->m = m;
    c->cap_program = cap_program;
    c->chunk = chunk;
    c->max_blocks = shape->max_blocks;
    if (a->head_dim > 256) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: head_dim %d (at most 256)", a->head_dim);
    }
    c->gemv_tokens = DECODE_TOKENS;
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
    if (!(c->w = model_weights(m))) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_NOMEM, "device cuda: out of GPU memory for the model's weights");
    }
    c->layers = c->w->layers;
    c->embed = c->w->embed, c->final_norm = c->w->final_norm, c->lm_head = c->w->lm_head, c->inv_freq = c->w->inv_freq;
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
    c->launches = c->queue.overlap ? "overlapped"
                  : major < 9     ? "serial: the GPU is older than compute capability 9.0"
                                  : "serial: POLAR_CUDA_PDL=0";
    size_t H = (size_t)a->hidden, q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim;
    size_t F = (size_t)a->ffn, V = (size_t)a->vocab;
    if ((size_t)a->shared_ffn > F) F = (size_t)a->shared_ffn; /* gate/up buffers serve the shared expert too */
    size_t C = (size_t)chunk, pool = (size_t)shape->n_blocks * CUDA_KV_BLOCK * kv, n_tables = (size_t)shape->n_tables;
    /* a batch's state may run all of a pass's rows through split-K attention */
    int split_rows = cap_program ? DECODE_TOKENS : chunk;
    int ok = (c->k_pool = cuda_dev_alloc(c, pool * sizeof(bf16))) && (c->v_pool = cuda_dev_alloc(c, pool * sizeof(bf16))) &&
         (c->tables = cuda_dev_alloc(c, n_tables * sizeof(int))) &&
         (c->x = cuda_dev_alloc(c, C * H * 4)) && (c->xn = cuda_dev_alloc(c, C * H * 4)) && (c->q = cuda_dev_alloc(c, C * q * 4)) &&
         (c->k = cuda_dev_alloc(c, C * kv * 4)) && (c->v = cuda_dev_alloc(c, C * kv * 4)) && (c->att = cuda_dev_alloc(c, C * q * 4)) &&
         (c->gate = cuda_dev_alloc(c, C * F * 4)) && (c->up = cuda_dev_alloc(c, C * F * 4)) &&
         (c->scores = cuda_dev_alloc(c, cuda_attention_scratch_upto(split_rows, a->n_heads, a->n_kv_heads, a->head_dim, c->sms) * 4)) &&
         /* a batch's head writes its own logits (cuda_batch.c) */
         (c->logits = cuda_dev_alloc(c, cap_program ? LOGIT_ROWS * V * 4 : 0)) && (c->tokens = cuda_dev_alloc(c, C * sizeof(int))) &&
         (c->pos = cuda_dev_alloc(c, sizeof(int))) && (c->step = cuda_dev_alloc(c, sizeof(int))) &&
         cudaMallocHost((void **)&c->staging, 2 * sizeof(int)) == cudaSuccess &&
         cudaHostAlloc((void **)&c->ring, 2 * sizeof(int), cudaHostAllocMapped) == cudaSuccess &&
         cudaEventCreateWithFlags(&c->step_done[0], cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&c->step_done[1], cudaEventDisableTiming) == cudaSuccess;
    for (int i = 0; ok && i < GRAPH_CACHE; i++)
        ok = (c->graphs[i].program = malloc((size_t)cap_program * sizeof(int))) != NULL;
    /* GEMM inputs: any projection's of a chunk, or a slice of the head's */
    size_t widest_in = H > q ? H : q;
    if (F > widest_in) widest_in = F;
    if ((size_t)a->top_k * a->moe_ffn > widest_in) widest_in = (size_t)a->top_k * a->moe_ffn; /* expert inputs */
    ok = ok && (c->gemm = cuda_gemm_create()) && (c->xb = cuda_dev_alloc(c, C * widest_in * sizeof(bf16))) &&
         (!a->qkv_bias || (c->acc = cuda_dev_alloc(c, C * (q > kv ? q : kv) * 4)));
    if (ok && a->n_experts) {
        size_t slots = C * (size_t)a->top_k, MF = (size_t)a->moe_ffn;
        size_t groups = cuda_moe_group_ints(chunk, a->top_k, a->n_experts);
        ok = (c->router_logits = cuda_dev_alloc(c, C * (size_t)a->n_experts * 4)) &&
             (c->expert_idx = cuda_dev_alloc(c, slots * sizeof(int))) && (c->expert_w = cuda_dev_alloc(c, slots * 4)) &&
             (c->groups = cuda_dev_alloc(c, groups * sizeof(int))) && (c->expert_act = cuda_dev_alloc(c, slots * MF * 4)) &&
             (c->expert_out = cuda_dev_alloc(c, slots * H * 4)) && (c->shared_out = cuda_dev_alloc(c, C * H * 4));
    }
    if (!ok) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_NOMEM, "device cuda: out of GPU memory for the KV cache and workspaces");
    }
    if (shape->tables) {
        e = cudaMemcpyAsync(c->tables, shape->tables, n_tables * sizeof(int), cudaMemcpyHostToDevice, c->queue.stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->queue.stream);
        if (e != cudaSuccess) {
            cuda_state_free(c);
            return cuda_error(err, e, "copying the block tables");
        }
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

void cuda_mm_rounded(cuda_state *c, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows,
                     int cols, int accumulate) {
    if (T > c->gemv_tokens) {
        if (!bias && cuda_gemm_run(c->gemm, y, c->xb, w, T, rows, cols, accumulate, c->queue.stream)) return;
        if (bias && cuda_gemm_run(c->gemm, c->acc, c->xb, w, T, rows, cols, 0, c->queue.stream)) {
            cuda_bias_residual(y, c->acc, bias, T, rows, accumulate, &c->queue);
            return;
        }
    }
    cuda_matmul(y, x, w, bias, T, rows, cols, accumulate, &c->queue);
}

void cuda_mm(cuda_state *c, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
             int accumulate) {
    if (T > c->gemv_tokens) cuda_to_bf16(c->xb, x, (long)T * cols, &c->queue);
    cuda_mm_rounded(c, y, x, w, bias, T, rows, cols, accumulate);
}

/* act[T, F] = silu(xn . gate^T) * (xn . up^T), xn = x or, with norm, x's
 * RMSNorm: one fused GEMV (the norm applied on the fly) for up to
 * c->gemv_tokens tokens; the norm into c->xn, two GEMMs and the activation
 * for more. */
static void mlp_in(cuda_state *c, float *act, float *up, const float *x, const bf16 *norm, const bf16 *w_gate,
                   const bf16 *w_up, int T, int F, int cols) {
    float eps = (float)c->m->arch.rms_eps;
    if (T <= c->gemv_tokens) {
        cuda_matmul_swiglu(act, x, norm, eps, w_gate, w_up, T, F, cols, &c->queue);
        return;
    }
    if (norm) {
        cuda_rmsnorm(c->xn, x, norm, T, cols, eps, &c->queue);
        x = c->xn;
    }
    cuda_mm(c, act, x, w_gate, NULL, T, F, cols, 0);
    cuda_mm_rounded(c, up, x, w_up, NULL, T, F, cols, 0); /* the same x, already rounded */
    cuda_swiglu(act, up, T * F, &c->queue);
}

/* The MoE sublayer on c->xn, added to c->x: routing, the slots grouped by
 * expert on the device, each chosen expert's rows read once for its tokens,
 * the shared expert, a deterministic combine in expert order. */
static void moe_forward(cuda_state *c, const layer_weights *w, int T) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, F = a->moe_ffn, k = a->top_k, E = a->n_experts, S = a->shared_ffn;
    const cuda_queue *s = &c->queue;
    cuda_route(c->expert_idx, c->expert_w, c->router_logits, c->xn, w->router, T, E, H, k, a->norm_topk, s);
    cuda_moe_group(c->groups, c->expert_idx, T, k, E, s);
    /* more than c->gemv_tokens tokens on tensor cores (bf16 inputs), fewer on the GEMV */
    if (T > c->gemv_tokens && cuda_expert_gemm_fits(H, F)) {
        cuda_to_bf16(c->xb, c->xn, (long)T * H, s);
        cuda_expert_gemm(c->expert_act, c->xb, w->exp_gate_up, c->groups, T, k, E, 2 * F, H, 0, 1, s);
        cuda_to_bf16(c->xb, c->expert_act, (long)T * k * F, s);
        cuda_expert_gemm(c->expert_out, c->xb, w->exp_down, c->groups, T, k, E, H, F, 1, 0, s);
    } else {
        cuda_expert_matmul(c->expert_act, c->xn, w->exp_gate_up, c->groups, T, k, E, 2 * F, H, 0, 1, s);
        cuda_expert_matmul(c->expert_out, c->expert_act, w->exp_down, c->groups, T, k, E, H, F, 1, 0, s);
    }
    if (w->sh_gate) {
        mlp_in(c, c->gate, c->up, c->xn, NULL, w->sh_gate, w->sh_up, T, S, H);
        cuda_mm(c, c->shared_out, c->gate, w->sh_down, NULL, T, H, S, 0);
    }
    cuda_moe_combine(c->x, c->expert_out, c->expert_w, w->sh_gate ? c->shared_out : NULL, c->xn, w->sh_router, T, k,
                     H, s);
}

/* Split-K attention of the batch tokens t0..t1-1 (map per token). */
static void attend_split(cuda_state *c, const cuda_kv_map *map, int t0, int t1) {
    const polar_arch *a = &c->m->arch;
    size_t qd = (size_t)a->n_heads * a->head_dim;
    cuda_kv_map sub = {.pos = map->pos + t0, .table = map->table + t0, .tables = map->tables};
    cuda_attention_decode(c->att + t0 * qd, c->q + t0 * qd, c->k_pool, c->v_pool, c->scores, sub, t1 - t0,
                          a->n_heads, a->n_kv_heads, a->head_dim, cuda_attention_splits(t1 - t0, a->n_kv_heads, c->sms),
                          &c->queue);
}

/* c->q, c->k, c->v of the T tokens -> c->att: per-head norms and RoPE,
 * K/V stored, attention (cuda_layer_forward says which kernel). */
static void attend(cuda_state *c, const layer_weights *w, int T, const cuda_kv_map *map, const cuda_run *runs,
                   int n_runs) {
    const polar_arch *a = &c->m->arch;
    int hd = a->head_dim;
    size_t qd = (size_t)a->n_heads * hd;
    const cuda_queue *s = &c->queue;
    cuda_qk_rope_store(c->q, c->k, c->v, w->q_norm, w->k_norm, c->inv_freq, c->m->rope_scale, c->k_pool, c->v_pool,
                       *map, T, a->n_heads, a->n_kv_heads, hd, (float)a->rms_eps, s);
    if (map->run.pos0) {
        if (T > DECODE_TOKENS)
            cuda_attention_prefill(c->att, c->q, c->k_pool, c->v_pool, map->run, T, a->n_heads, a->n_kv_heads, hd, 0,
                                   s);
        else
            cuda_attention_decode(c->att, c->q, c->k_pool, c->v_pool, c->scores, *map, T, a->n_heads, a->n_kv_heads,
                                  hd, cuda_attention_splits(T, a->n_kv_heads, c->sms), s);
        return;
    }
    int t = 0;
    for (int i = 0; i < n_runs; i++) {
        const cuda_run *r = &runs[i];
        if (r->t0 > t) attend_split(c, map, t, r->t0);
        cuda_kv_run run = {map->pos + r->t0, map->tables + r->table};
        cuda_attention_prefill(c->att + r->t0 * qd, c->q + r->t0 * qd, c->k_pool, c->v_pool, run, r->n, a->n_heads,
                               a->n_kv_heads, hd, 0, s);
        t = r->t0 + r->n;
    }
    if (t < T) attend_split(c, map, t, T);
}

void cuda_layer_forward(cuda_state *c, const layer_weights *w, int T, const cuda_kv_map *map, const cuda_run *runs,
                        int n_runs) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, qd = a->n_heads * a->head_dim, kvd = a->n_kv_heads * a->head_dim;
    float eps = (float)a->rms_eps;
    const cuda_queue *s = &c->queue;
    if (T <= c->gemv_tokens) { /* the attention norm on the fly */
        cuda_matmul_qkv(c->q, c->k, c->v, c->x, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv, w->attn_norm, eps, T, qd,
                        kvd, H, s);
    } else {
        cuda_rmsnorm(c->xn, c->x, w->attn_norm, T, H, eps, s);
        cuda_mm(c, c->q, c->xn, w->wq, w->bq, T, qd, H, 0);
        cuda_mm_rounded(c, c->k, c->xn, w->wk, w->bk, T, kvd, H, 0); /* the same xn, already rounded */
        cuda_mm_rounded(c, c->v, c->xn, w->wv, w->bv, T, kvd, H, 0);
    }
    attend(c, w, T, map, runs, n_runs);
    cuda_mm(c, c->x, c->att, w->wo, NULL, T, H, qd, 1);
    if (w->router) { /* the normed rows feed the router, the experts and the shared expert */
        cuda_rmsnorm(c->xn, c->x, w->mlp_norm, T, H, eps, s);
        moe_forward(c, w, T);
        return;
    }
    mlp_in(c, c->gate, c->up, c->x, w->mlp_norm, w->w_gate, w->w_up, T, a->ffn, H);
    cuda_mm(c, c->x, c->gate, w->w_down, NULL, T, H, a->ffn, 1);
}

/* Embedding and the program's layers for the T tokens on the device, then
 * the final norm of rows first.. */
static void forward_layers(cuda_state *c, const int *program, int n_program, int T, int first) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden;
    cuda_embed(c->x, c->embed, c->tokens, T, H, &c->queue);
    for (int k = 0; k < n_program; k++) {
        cuda_kv_map map = {.run = {c->pos, c->tables + (size_t)k * c->max_blocks}};
        cuda_layer_forward(c, &c->layers[program[k]], T, &map, NULL, 0);
    }
    cuda_rmsnorm(c->xn + (size_t)first * H, c->x + (size_t)first * H, c->final_norm, T - first, H, (float)a->rms_eps,
                 &c->queue);
}

/* Captures the one-token step of this program: the forward, the head and
 * the argmax fed back. */
static cudaError_t capture_step(cuda_state *c, const int *program, int n_program, cudaGraphExec_t *exec) {
    const polar_arch *a = &c->m->arch;
    cudaGraph_t graph;
    cudaError_t e = cudaStreamBeginCapture(c->queue.stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return e;
    forward_layers(c, program, n_program, 1, 0);
    cuda_matmul(c->logits, c->xn, c->lm_head, NULL, 1, a->vocab, a->hidden, 0, &c->queue);
    cuda_argmax_feed(c->tokens, (int *)c->ring, c->pos, c->step, c->logits, a->vocab, &c->queue);
    e = cudaStreamEndCapture(c->queue.stream, &graph);
    if (e != cudaSuccess) return e;
    e = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) *exec = NULL;
    return e;
}

/* The one-token step as a graph for this program: the forward, the head,
 * and the argmax fed back as the next step's token and position. Kernels
 * read the token and position from device memory, so one graph serves every
 * step. Captured on a program's first use; the least recently used graph
 * makes room (destroyed, so nothing leaks). */
static cudaError_t decode_graph(cuda_state *c, const int *program, int n_program, cudaGraphExec_t *out) {
    graph_entry *slot = &c->graphs[0];
    for (int i = 0; i < GRAPH_CACHE; i++) {
        graph_entry *g = &c->graphs[i];
        if (g->exec && g->n_program == n_program && !memcmp(g->program, program, (size_t)n_program * sizeof(int))) {
            g->last_used = ++c->graph_clock;
            *out = g->exec;
            return cudaSuccess;
        }
        if (!g->exec ? slot->exec != NULL : slot->exec && g->last_used < slot->last_used) slot = g;
    }
    if (slot->exec) cudaGraphExecDestroy(slot->exec);
    slot->exec = NULL;
    cudaError_t e = capture_step(c, program, n_program, &slot->exec);
    if (e != cudaSuccess && cuda_state_capture_failed(c)) {
        e = capture_step(c, program, n_program, &slot->exec);
        if (e != cudaSuccess) cuda_state_capture_failed(c);
    }
    if (e != cudaSuccess) return e;
    memcpy(slot->program, program, (size_t)n_program * sizeof(int));
    slot->n_program = n_program;
    slot->last_used = ++c->graph_clock;
    *out = slot->exec;
    return cudaSuccess;
}

/* The first token and the position through pinned memory, the other
 * tokens straight from the caller's array. */
static cudaError_t put_tokens(cuda_state *c, const int *tokens, int T, int pos) {
    cudaStream_t s = c->queue.stream;
    c->staging[0] = tokens[0];
    c->staging[1] = pos;
    cudaError_t e = cudaMemcpyAsync(c->tokens, &c->staging[0], sizeof(int), cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(c->pos, &c->staging[1], sizeof(int), cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess && T > 1)
        e = cudaMemcpyAsync(c->tokens + 1, tokens + 1, (size_t)(T - 1) * sizeof(int), cudaMemcpyHostToDevice, s);
    return e;
}

polar_status cuda_forward(cuda_state *c, const int *program, int n_program, const int *tokens, int T, int pos,
                          float *last_logits, float *all_logits, float *hidden, polar_error *err) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab;
    if (T > c->chunk) return polar_fail(err, POLAR_ERR_ARG, "cuda: %d tokens exceed the chunk of %d", T, c->chunk);
    cudaError_t e = put_tokens(c, tokens, T, pos);
    if (e != cudaSuccess) return cuda_error(err, e, "copying tokens");
    int first = all_logits || hidden ? 0 : T - 1;
    if (T == 1 && !all_logits && !hidden) {
        cudaGraphExec_t graph = NULL;
        e = decode_graph(c, program, n_program, &graph);
        if (e == cudaSuccess) e = cudaGraphLaunch(graph, c->queue.stream);
        if (e != cudaSuccess) return cuda_error(err, e, "decode graph");
        if (last_logits)
            e = cudaMemcpyAsync(last_logits, c->logits, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost,
                                c->queue.stream);
    } else {
        forward_layers(c, program, n_program, T, first);
        if (hidden)
            e = cudaMemcpyAsync(hidden, c->xn, (size_t)T * H * sizeof(float), cudaMemcpyDeviceToHost, c->queue.stream);
        /* the head in slices of LOGIT_ROWS rows, each copied out before the next */
        for (int r0 = first; e == cudaSuccess && r0 < T && (all_logits || last_logits); r0 += LOGIT_ROWS) {
            int n = T - r0 < LOGIT_ROWS ? T - r0 : LOGIT_ROWS;
            cuda_mm(c, c->logits, c->xn + (size_t)r0 * H, c->lm_head, NULL, n, V, H, 0);
            if (all_logits)
                e = cudaMemcpyAsync(all_logits + (size_t)r0 * V, c->logits, (size_t)n * V * sizeof(float),
                                    cudaMemcpyDeviceToHost, c->queue.stream);
            if (e == cudaSuccess && last_logits && r0 + n == T)
                e = cudaMemcpyAsync(last_logits, c->logits + (size_t)(n - 1) * V, (size_t)V * sizeof(float),
                                    cudaMemcpyDeviceToHost, c->queue.stream);
        }
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->queue.stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? POLAR_OK : cuda_error(err, e, "forward");
}

/* Launch greedy step i: the graph, then the event the host waits on. */
static cudaError_t launch_step(cuda_state *c, cudaGraphExec_t graph, int i) {
    cudaError_t e = cudaGraphLaunch(graph, c->queue.stream);
    return e == cudaSuccess ? cudaEventRecord(c->step_done[i & 1], c->queue.stream) : e;
}

polar_status cuda_greedy(cuda_state *c, const int *program, int n_program, int token, int pos, int max_steps,
                         int (*accept)(int id, void *user), void *user, int *n_steps, float *last_logits,
                         polar_error *err) {
    *n_steps = 0;
    if (max_steps < 1) return POLAR_OK;
    cudaError_t e = put_tokens(c, &token, 1, pos);
    if (e == cudaSuccess) e = cudaMemsetAsync(c->step, 0, sizeof(int), c->queue.stream);
    cudaGraphExec_t graph = NULL;
    if (e == cudaSuccess) e = decode_graph(c, program, n_program, &graph);
    if (e == cudaSuccess) e = launch_step(c, graph, 0);
    if (e != cudaSuccess) return cuda_error(err, e, "greedy decode");
    /* Step i + 1 is queued before the host looks at step i's id, so the GPU
     * never waits for the host; stopping at step i wastes step i + 1. */
    int i = 0, fed = token, stopped = 0, queued = 1;
    for (; i < max_steps; i++) {
        if (i + 1 < max_steps && (e = launch_step(c, graph, i + 1)) != cudaSuccess) break;
        queued = i + 2 <= max_steps ? i + 2 : max_steps;
        if ((e = cudaEventSynchronize(c->step_done[i & 1])) != cudaSuccess) break;
        int id = c->ring[i & 1];
        if (!accept(id, user)) {
            stopped = 1;
            break;
        }
        if (i + 1 < max_steps) fed = id;
    }
    cudaError_t e_sync = cudaStreamSynchronize(c->queue.stream); /* nothing of ours still runs, even after an error */
    if (e == cudaSuccess) e = e_sync;
    if (e != cudaSuccess) { /* steps 0..i-1 were accepted (their ids recorded) and appended */
        *n_steps = i;
        return cuda_error(err, e, "greedy decode");
    }
    *n_steps = stopped ? i + 1 : max_steps;
    if (!last_logits) return POLAR_OK;
    if (queued == *n_steps) { /* the last step run is the last one counted: its logits are on the device */
        e = cudaMemcpyAsync(last_logits, c->logits, (size_t)c->m->arch.vocab * sizeof(float), cudaMemcpyDeviceToHost,
                            c->queue.stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->queue.stream);
        return e == cudaSuccess ? POLAR_OK : cuda_error(err, e, "copying logits");
    }
    /* A wasted step overwrote them: run the last counted step again (the
     * kernels are deterministic, its cache row is rewritten unchanged). */
    return cuda_forward(c, program, n_program, &fed, 1, pos + *n_steps - 1, last_logits, NULL, NULL, err);
}

#endif
