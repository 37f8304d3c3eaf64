/* The CUDA backend of a session: the CPU forward of session.c, op for op, on
 * the GPU (kernels/cuda), dense and mixture-of-experts layers. Weights are uploaded once per session; the KV
 * cache holds one bf16 slot per execution position. Built by `make cuda`
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

polar_status cuda_state_create(const polar_model *m, int cap_program, int max_ctx, int chunk, cuda_state **out,
                               polar_error *err) {
    (void)m, (void)cap_program, (void)max_ctx, (void)chunk;
    *out = NULL;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build it with make cuda)");
}

void cuda_state_free(cuda_state *c) { (void)c; }

polar_status cuda_forward(cuda_state *c, const int *program, int n_program, const int *tokens, int T, int pos,
                          float *last_logits, float *all_logits, float *hidden, polar_error *err) {
    (void)c, (void)program, (void)n_program, (void)tokens, (void)T, (void)pos, (void)last_logits, (void)all_logits,
        (void)hidden;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

polar_status cuda_copy_bandwidth(size_t bytes, double *gbps, polar_error *err) {
    (void)bytes, (void)gbps;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}

#else

#include <cuda_runtime_api.h>

#include "../kernels/cuda/ops.h"
#include "cuda_gemm.h"

struct cuda_state {
    const polar_model *m;
    layer_weights *layers;       /* device copies of the model's layer weights */
    const bf16 *embed, *final_norm, *lm_head;
    float *inv_freq;             /* [head_dim/2] */
    void **allocs;
    int n_allocs, cap_allocs;
    int cap_program, max_ctx, chunk;
    bf16 *k_cache, *v_cache;     /* [cap_program, max_ctx, n_kv*head_dim] */
    float *x, *xn, *q, *k, *v, *att, *gate, *up; /* [chunk, *] as on the CPU */
    float *scores;               /* attention partials, cuda_attention_scratch floats */
    float *logits;               /* [chunk, vocab] */
    float *router;               /* [chunk, n_experts]              MoE models only */
    int *expert_idx;             /* [chunk, top_k] chosen experts, ascending */
    float *expert_w;             /* [chunk, top_k] their weights */
    float *expert_gu;            /* [chunk * top_k, 2 * moe_ffn] */
    float *expert_act;           /* [chunk * top_k, moe_ffn] */
    float *expert_out;           /* [chunk * top_k, hidden] */
    float *shared_out;           /* [chunk, hidden] */
    float *shared_gate;          /* [chunk] */
    int *tokens;                 /* [chunk] */
    int *pos;                    /* [1] position of the chunk's first token, read by the kernels */
    int *staging;                /* pinned host [2]: the step's token and position */
    cudaStream_t stream;
    cuda_gemm *gemm;             /* cuBLASLt for prefill chunks */
    bf16 *xb;                    /* [chunk, widest input] activations rounded to bf16 for the GEMM */
    float *acc;                  /* [chunk, widest output] the GEMM's result before bias/residual */
    /* The decode step (one token) as a captured graph, for one program. */
    cudaGraphExec_t decode_graph;
    int *graph_program;          /* [cap_program] the program it was captured for */
    int graph_n;
};

static polar_status cuda_error(polar_error *err, cudaError_t e, const char *what) {
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

static void *dev_alloc(cuda_state *c, size_t bytes) {
    void *p = NULL;
    if (c->n_allocs == c->cap_allocs) {
        int cap = c->cap_allocs ? c->cap_allocs * 2 : 256;
        void **a = realloc(c->allocs, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        c->allocs = a;
        c->cap_allocs = cap;
    }
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) return NULL;
    c->allocs[c->n_allocs++] = p;
    return p;
}

/* Upload n elements of a host tensor (NULL stays NULL). */
static int upload(cuda_state *c, const bf16 **dst, const bf16 *src, size_t n) {
    if (!src) {
        *dst = NULL;
        return 1;
    }
    void *d = dev_alloc(c, n * sizeof(bf16));
    if (!d || cudaMemcpy(d, src, n * sizeof(bf16), cudaMemcpyHostToDevice) != cudaSuccess) return 0;
    *dst = d;
    return 1;
}

void cuda_state_free(cuda_state *c) {
    if (!c) return;
    if (c->decode_graph) cudaGraphExecDestroy(c->decode_graph);
    if (c->staging) cudaFreeHost(c->staging);
    cuda_gemm_free(c->gemm);
    free(c->graph_program);
    for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->allocs);
    free(c->layers);
    free(c);
}

polar_status cuda_state_create(const polar_model *m, int cap_program, int max_ctx, int chunk, cuda_state **out,
                               polar_error *err) {
    *out = NULL;
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: %s", why);
    const polar_arch *a = &m->arch;
    cuda_state *c = calloc(1, sizeof *c);
    if (!c) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    c->m = m;
    c->cap_program = cap_program;
    c->max_ctx = max_ctx;
    c->chunk = chunk;
    c->layers = calloc((size_t)a->n_layers, sizeof *c->layers);
    if (a->head_dim > 256) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: head_dim %d (at most 256)", a->head_dim);
    }
    cudaError_t e = cudaStreamCreate(&c->stream);
    if (!c->layers || e != cudaSuccess) {
        cuda_state_free(c);
        return e != cudaSuccess ? cuda_error(err, e, "stream") : polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    }
    size_t H = (size_t)a->hidden, q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim;
    size_t F = (size_t)a->ffn, V = (size_t)a->vocab, hd = (size_t)a->head_dim;
    int ok = upload(c, &c->embed, m->embed, V * H) && upload(c, &c->final_norm, m->final_norm, H);
    c->lm_head = c->embed;
    if (ok && !a->tied_embeddings) ok = upload(c, &c->lm_head, m->lm_head, V * H);
    for (int l = 0; ok && l < a->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        layer_weights *d = &c->layers[l];
        ok = upload(c, &d->attn_norm, w->attn_norm, H) && upload(c, &d->wq, w->wq, q * H) &&
             upload(c, &d->wk, w->wk, kv * H) && upload(c, &d->wv, w->wv, kv * H) && upload(c, &d->bq, w->bq, q) &&
             upload(c, &d->bk, w->bk, kv) && upload(c, &d->bv, w->bv, kv) && upload(c, &d->q_norm, w->q_norm, hd) &&
             upload(c, &d->k_norm, w->k_norm, hd) && upload(c, &d->wo, w->wo, H * q) &&
             upload(c, &d->mlp_norm, w->mlp_norm, H) && upload(c, &d->w_gate, w->w_gate, F * H) &&
             upload(c, &d->w_up, w->w_up, F * H) && upload(c, &d->w_down, w->w_down, H * F);
        if (ok && w->router) {
            size_t E = (size_t)a->n_experts, MF = (size_t)a->moe_ffn, S = (size_t)a->shared_ffn;
            ok = upload(c, &d->router, w->router, E * H) && upload(c, &d->exp_gate_up, w->exp_gate_up, E * 2 * MF * H) &&
                 upload(c, &d->exp_down, w->exp_down, E * H * MF) && upload(c, &d->sh_gate, w->sh_gate, S * H) &&
                 upload(c, &d->sh_up, w->sh_up, S * H) && upload(c, &d->sh_down, w->sh_down, H * S) &&
                 upload(c, &d->sh_router, w->sh_router, H);
        }
    }
    if ((size_t)a->shared_ffn > F) F = (size_t)a->shared_ffn; /* gate/up buffers serve the shared expert too */
    size_t C = (size_t)chunk, cache = (size_t)cap_program * (size_t)max_ctx * kv;
    ok = ok && (c->inv_freq = dev_alloc(c, hd / 2 * sizeof(float))) &&
         cudaMemcpy(c->inv_freq, m->rope_inv_freq, hd / 2 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess &&
         (c->k_cache = dev_alloc(c, cache * sizeof(bf16))) && (c->v_cache = dev_alloc(c, cache * sizeof(bf16))) &&
         (c->x = dev_alloc(c, C * H * 4)) && (c->xn = dev_alloc(c, C * H * 4)) && (c->q = dev_alloc(c, C * q * 4)) &&
         (c->k = dev_alloc(c, C * kv * 4)) && (c->v = dev_alloc(c, C * kv * 4)) && (c->att = dev_alloc(c, C * q * 4)) &&
         (c->gate = dev_alloc(c, C * F * 4)) && (c->up = dev_alloc(c, C * F * 4)) &&
         (c->scores = dev_alloc(c, cuda_attention_scratch(chunk, a->n_heads, a->head_dim, max_ctx) * 4)) &&
         (c->logits = dev_alloc(c, C * V * 4)) && (c->tokens = dev_alloc(c, C * sizeof(int))) &&
         (c->pos = dev_alloc(c, sizeof(int))) && cudaMallocHost((void **)&c->staging, 2 * sizeof(int)) == cudaSuccess &&
         (c->graph_program = malloc((size_t)cap_program * sizeof(int)));
    size_t widest_in = H > q ? H : q, widest_out = V;
    if (F > widest_in) widest_in = F;
    if (F > widest_out) widest_out = F;
    ok = ok && (c->gemm = cuda_gemm_create()) && (c->xb = dev_alloc(c, C * widest_in * sizeof(bf16))) &&
         (c->acc = dev_alloc(c, C * widest_out * 4));
    if (ok && a->n_experts) {
        size_t slots = C * (size_t)a->top_k, MF = (size_t)a->moe_ffn;
        ok = (c->router = dev_alloc(c, C * (size_t)a->n_experts * 4)) &&
             (c->expert_idx = dev_alloc(c, slots * sizeof(int))) && (c->expert_w = dev_alloc(c, slots * 4)) &&
             (c->expert_gu = dev_alloc(c, slots * 2 * MF * 4)) && (c->expert_act = dev_alloc(c, slots * MF * 4)) &&
             (c->expert_out = dev_alloc(c, slots * H * 4)) && (c->shared_out = dev_alloc(c, C * H * 4)) &&
             (c->shared_gate = dev_alloc(c, C * 4));
    }
    if (!ok) {
        cuda_state_free(c);
        return polar_fail(err, POLAR_ERR_NOMEM, "device cuda: out of GPU memory for the weights, KV cache and workspaces");
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

/* y[T, rows] (=|+=) x . w^T (+ bias): tensor cores through cuBLASLt for a
 * prefill chunk, the hand-written GEMV for decode (and if cuBLASLt declines
 * a shape). */
static void mm(cuda_state *c, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
               int accumulate) {
    if (T > 8) {
        cuda_to_bf16(c->xb, x, (long)T * cols, c->stream);
        if (cuda_gemm_run(c->gemm, c->acc, c->xb, w, T, rows, cols, c->stream)) {
            cuda_bias_residual(y, c->acc, bias, T, rows, accumulate, c->stream);
            return;
        }
    }
    cuda_matmul(y, x, w, bias, T, rows, cols, accumulate, c->stream);
}

/* The MoE sublayer on c->xn, added to c->x: routing, the chosen experts
 * (read by expert id on the device), the shared expert, a deterministic
 * combine in expert order. */
static void moe_forward(cuda_state *c, const layer_weights *w, int T) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, F = a->moe_ffn, k = a->top_k, S = a->shared_ffn;
    void *s = c->stream;
    mm(c, c->router, c->xn, w->router, NULL, T, a->n_experts, H, 0);
    cuda_route(c->expert_idx, c->expert_w, c->router, T, a->n_experts, k, a->norm_topk, s);
    cuda_expert_matmul(c->expert_gu, c->xn, w->exp_gate_up, c->expert_idx, T, k, 2 * F, H, 0, s);
    cuda_expert_swiglu(c->expert_act, c->expert_gu, T * k, F, s);
    cuda_expert_matmul(c->expert_out, c->expert_act, w->exp_down, c->expert_idx, T, k, H, F, 1, s);
    if (w->sh_gate) {
        mm(c, c->gate, c->xn, w->sh_gate, NULL, T, S, H, 0);
        mm(c, c->up, c->xn, w->sh_up, NULL, T, S, H, 0);
        cuda_swiglu(c->gate, c->up, T * S, s);
        mm(c, c->shared_out, c->gate, w->sh_down, NULL, T, H, S, 0);
        mm(c, c->shared_gate, c->xn, w->sh_router, NULL, T, 1, H, 0);
    }
    cuda_moe_combine(c->x, c->expert_out, c->expert_w, w->sh_gate ? c->shared_out : NULL, c->shared_gate, T, k, H, s);
}

/* One decoder layer at execution position slot for T tokens at pos.. */
static void layer_forward(cuda_state *c, const layer_weights *w, int slot, int T) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, hd = a->head_dim, qd = a->n_heads * hd, kvd = a->n_kv_heads * hd, F = a->ffn;
    float eps = (float)a->rms_eps;
    void *s = c->stream;
    bf16 *kc = c->k_cache + (size_t)slot * c->max_ctx * kvd, *vc = c->v_cache + (size_t)slot * c->max_ctx * kvd;
    cuda_rmsnorm(c->xn, c->x, w->attn_norm, T, H, eps, s);
    mm(c, c->q, c->xn, w->wq, w->bq, T, qd, H, 0);
    mm(c, c->k, c->xn, w->wk, w->bk, T, kvd, H, 0);
    mm(c, c->v, c->xn, w->wv, w->bv, T, kvd, H, 0);
    cuda_qk_rope_store(c->q, c->k, c->v, w->q_norm, w->k_norm, c->inv_freq, kc, vc, c->pos, T, a->n_heads,
                       a->n_kv_heads, hd, eps, s);
    cuda_attention(c->att, c->q, kc, vc, c->scores, c->pos, T, a->n_heads, a->n_kv_heads, hd, c->max_ctx, s);
    mm(c, c->x, c->att, w->wo, NULL, T, H, qd, 1);
    cuda_rmsnorm(c->xn, c->x, w->mlp_norm, T, H, eps, s);
    if (w->router) {
        moe_forward(c, w, T);
        return;
    }
    mm(c, c->gate, c->xn, w->w_gate, NULL, T, F, H, 0);
    mm(c, c->up, c->xn, w->w_up, NULL, T, F, H, 0);
    cuda_swiglu(c->gate, c->up, T * F, s);
    mm(c, c->x, c->gate, w->w_down, NULL, T, H, F, 1);
}

/* Everything of a forward after the token and position are on the device:
 * embedding, the program's layers, final norm and head from row `first`. */
static void forward_kernels(cuda_state *c, const int *program, int n_program, int T, int first) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab;
    cuda_embed(c->x, c->embed, c->tokens, T, H, c->stream);
    for (int k = 0; k < n_program; k++) layer_forward(c, &c->layers[program[k]], k, T);
    cuda_rmsnorm(c->xn + (size_t)first * H, c->x + (size_t)first * H, c->final_norm, T - first, H, (float)a->rms_eps,
                 c->stream);
    mm(c, c->logits + (size_t)first * V, c->xn + (size_t)first * H, c->lm_head, NULL, T - first, V, H, 0);
}

/* The one-token step as a graph for this program: captured on first use and
 * again when the program changes (the old one destroyed, so nothing leaks).
 * Kernels read the token and position from device memory, so one graph
 * serves every step. */
static cudaError_t decode_graph(cuda_state *c, const int *program, int n_program) {
    if (c->decode_graph && c->graph_n == n_program &&
        !memcmp(c->graph_program, program, (size_t)n_program * sizeof(int)))
        return cudaSuccess;
    if (c->decode_graph) cudaGraphExecDestroy(c->decode_graph);
    c->decode_graph = NULL;
    cudaGraph_t graph;
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return e;
    forward_kernels(c, program, n_program, 1, 0);
    e = cudaStreamEndCapture(c->stream, &graph);
    if (e != cudaSuccess) return e;
    e = cudaGraphInstantiate(&c->decode_graph, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        c->decode_graph = NULL;
        return e;
    }
    memcpy(c->graph_program, program, (size_t)n_program * sizeof(int));
    c->graph_n = n_program;
    return cudaSuccess;
}

polar_status cuda_forward(cuda_state *c, const int *program, int n_program, const int *tokens, int T, int pos,
                          float *last_logits, float *all_logits, float *hidden, polar_error *err) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab;
    if (T > c->chunk) return polar_fail(err, POLAR_ERR_ARG, "cuda: %d tokens exceed the chunk of %d", T, c->chunk);
    /* token (the first; the rest below) and position through pinned memory */
    c->staging[0] = tokens[0];
    c->staging[1] = pos;
    cudaError_t e = cudaMemcpyAsync(c->tokens, &c->staging[0], sizeof(int), cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(c->pos, &c->staging[1], sizeof(int), cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess && T > 1)
        e = cudaMemcpyAsync(c->tokens + 1, tokens + 1, (size_t)(T - 1) * sizeof(int), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return cuda_error(err, e, "copying tokens");
    int first = all_logits || hidden ? 0 : T - 1;
    if (T == 1 && first == 0 && !all_logits && !hidden) {
        e = decode_graph(c, program, n_program);
        if (e == cudaSuccess) e = cudaGraphLaunch(c->decode_graph, c->stream);
        if (e != cudaSuccess) return cuda_error(err, e, "decode graph");
    } else {
        forward_kernels(c, program, n_program, T, first);
    }
    if (hidden)
        e = cudaMemcpyAsync(hidden, c->xn, (size_t)T * H * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess && all_logits)
        e = cudaMemcpyAsync(all_logits, c->logits, (size_t)T * V * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess && last_logits)
        e = cudaMemcpyAsync(last_logits, c->logits + (size_t)(T - 1) * V, (size_t)V * sizeof(float),
                            cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? POLAR_OK : cuda_error(err, e, "forward");
}

#endif
