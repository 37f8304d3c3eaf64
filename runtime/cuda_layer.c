/* One decoder layer on the GPU over a pass's rows, which may belong to
 * different sequences, each at its own position with its own KV table: the
 * CPU's cpu_layer.c, op for op, on the kernels of kernels/cuda (dense and
 * mixture-of-experts layers). A tensor-parallel rank runs its share
 * (c->shard: its heads, MLP columns, experts) and sums the ranks' o_proj
 * and MLP outputs with one all-reduce each: rank 0 adds them to the
 * residual, the others write their part alone, so the sum is the next
 * residual on every rank. Built with POLAR_CUDA. */
#ifdef POLAR_CUDA

#include "cuda_internal.h"

/* cuda_mm for the next product of the same x: c->xb holds it rounded
 * already (one conversion for q, k and v, or gate and up). */
static void cuda_mm_rounded(cuda_state *c, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows,
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

/* The MoE sublayer on c->xn, added to x (residual) or written alone: routing
 * over every expert, the slots of the rank's experts grouped by expert on
 * the device, each chosen expert's rows read once for its tokens, the
 * shared expert (the rank's columns), a deterministic combine in expert
 * order. */
static void moe_forward(cuda_state *c, const layer_weights *w, float *x, int T, int residual) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, F = a->moe_ffn, k = a->top_k, S = c->shard.shared_ffn;
    int e0 = c->shard.e0, E = c->shard.n_experts;
    const cuda_queue *s = &c->queue;
    cuda_route(c->expert_idx, c->expert_w, c->router_logits, c->xn, w->router, T, a->n_experts, H, k, a->norm_topk, s);
    cuda_moe_group(c->groups, c->expert_idx, T, k, e0, E, s);
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
    cuda_moe_combine(x, c->expert_out, c->expert_w, c->expert_idx, e0, E, w->sh_gate ? c->shared_out : NULL, c->xn,
                     w->sh_router, T, k, H, residual, s);
}

/* Split-K attention of the pass's tokens t0..t1-1. */
static void attend_split(cuda_state *c, const cuda_kv_map *map, int t0, int t1) {
    int nq = c->shard.n_heads, nk = c->shard.n_kv, hd = c->m->arch.head_dim;
    size_t qd = (size_t)nq * hd;
    cuda_kv_map sub = {.pos = map->pos + t0, .table = map->table + t0, .tables = map->tables};
    cuda_attention_decode(c->att + t0 * qd, c->q + t0 * qd, c->k_pool, c->v_pool, c->scores, sub, t1 - t0, nq, nk, hd,
                          cuda_attention_splits(t1 - t0, nk, c->sms), &c->queue);
}

/* c->q, c->k, c->v of the T tokens -> c->att: per-head norms and RoPE,
 * K/V stored, attention (cuda_layer_forward says which kernel). */
static void attend(cuda_state *c, const layer_weights *w, int T, const cuda_kv_map *map, const cuda_run *runs,
                   int n_runs) {
    const polar_arch *a = &c->m->arch;
    int hd = a->head_dim, nq = c->shard.n_heads, nk = c->shard.n_kv;
    size_t qd = (size_t)nq * hd;
    const cuda_queue *s = &c->queue;
    cuda_qk_rope_store(c->q, c->k, c->v, w->q_norm, w->k_norm, c->inv_freq, c->m->rope_scale, c->k_pool, c->v_pool,
                       *map, T, nq, nk, hd, (float)a->rms_eps, s);
    int t = 0;
    for (int i = 0; i < n_runs; i++) {
        const cuda_run *r = &runs[i];
        if (r->t0 > t) attend_split(c, map, t, r->t0);
        cuda_kv_run run = {map->pos + r->t0, map->tables + r->table};
        cuda_attention_prefill(c->att + r->t0 * qd, c->q + r->t0 * qd, c->k_pool, c->v_pool, run, r->n, nq, nk, hd, 0, s);
        t = r->t0 + r->n;
    }
    if (t < T) attend_split(c, map, t, T);
}

void cuda_layer_forward(cuda_state *c, const layer_weights *w, float *x, int T, const cuda_kv_map *map,
                        const cuda_run *runs, int n_runs) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, qd = c->shard.n_heads * a->head_dim, kvd = c->shard.n_kv * a->head_dim;
    int residual = c->shard.rank == 0; /* the other ranks' outputs are parts of a sum */
    float eps = (float)a->rms_eps;
    const cuda_queue *s = &c->queue;
    if (T <= c->gemv_tokens) { /* the attention norm on the fly */
        cuda_matmul_qkv(c->q, c->k, c->v, x, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv, w->attn_norm, eps, T, qd,
                        kvd, H, s);
    } else {
        cuda_rmsnorm(c->xn, x, w->attn_norm, T, H, eps, s);
        cuda_mm(c, c->q, c->xn, w->wq, w->bq, T, qd, H, 0);
        cuda_mm_rounded(c, c->k, c->xn, w->wk, w->bk, T, kvd, H, 0); /* the same xn, already rounded */
        cuda_mm_rounded(c, c->v, c->xn, w->wv, w->bv, T, kvd, H, 0);
    }
    attend(c, w, T, map, runs, n_runs);
    cuda_mm(c, x, c->att, w->wo, NULL, T, H, qd, residual);
    cuda_all_reduce(c, x, (size_t)T * H);
    if (w->router) { /* the normed rows feed the router, the experts and the shared expert */
        cuda_rmsnorm(c->xn, x, w->mlp_norm, T, H, eps, s);
        moe_forward(c, w, x, T, residual);
    } else {
        mlp_in(c, c->gate, c->up, x, w->mlp_norm, w->w_gate, w->w_up, T, c->shard.ffn, H);
        cuda_mm(c, x, c->gate, w->w_down, NULL, T, H, c->shard.ffn, residual);
    }
    cuda_all_reduce(c, x, (size_t)T * H);
}

#endif
