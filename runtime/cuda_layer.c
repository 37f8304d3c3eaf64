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

/* A matrix of the model on the device as the block kernels take it. */
static cuda_wmat wmat(const cuda_state *c, const bf16 *w, cpu_wtype t, int cols) {
    return (cuda_wmat){w, (int)t, cpu_wtype_row_bytes(t, (size_t)cols), c->blocks_f32_gemv};
}

/* y (=|+=) x . W^T (+ bias) for W of GGUF blocks on tensor cores: chunks of
 * W's rows dequantized to bf16 into c->wb, each chunk's GEMM writing its
 * slice of y (with a bias: of c->acc, added after). 0 (nothing launched)
 * without a workspace or when cuBLASLt declines the first chunk; a later
 * chunk declined runs the remaining rows on the block GEMV. */
static int blocks_gemm(cuda_state *c, float *y, const float *x, cuda_wmat w, const bf16 *bias, int T, int rows, int cols,
                       int accumulate) {
    int chunk = c->wb ? (int)(c->wb_elems / (size_t)cols) / 16 * 16 : 0;
    if (chunk < 16) return 0;
    if (chunk > rows) chunk = rows;
    float *dst = bias ? c->acc : y;
    int add = bias ? 0 : accumulate;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        int n = rows - r0 < chunk ? rows - r0 : chunk;
        cuda_dequantize_rows(c->wb, w, r0, n, cols, &c->queue);
        if (!cuda_gemm_run(c->gemm, dst + r0, rows, c->xb, c->wb, T, n, cols, add, c->queue.stream)) {
            if (r0 == 0) return 0;
            cuda_wmat rest = w;
            rest.p = (const uint8_t *)w.p + (size_t)r0 * w.row_bytes;
            cuda_matmul_blocks(dst + r0, rows, x, rest, NULL, T, rows - r0, cols, add, &c->queue);
            break;
        }
    }
    if (bias) cuda_bias_residual(y, c->acc, bias, T, rows, accumulate, &c->queue);
    return 1;
}

/* c->xb = x rounded to bf16 (the tensor-core GEMMs' input), once for the
 * products of one x: *rounded says whether c->xb holds it already. The MMA
 * GEMV rounds its inputs itself, so in that mode no product converts. */
static void round_once(cuda_state *c, const float *x, int T, int cols, int *rounded) {
    if (!*rounded) cuda_to_bf16(c->xb, x, (long)T * cols, &c->queue);
    *rounded = 1;
}

/* cuda_mm for one of several products of the same x (q, k and v, or gate
 * and up), *rounded shared by them (0 before the first). */
static void cuda_mm_of(cuda_state *c, float *y, const float *x, const bf16 *w, cpu_wtype t, const bf16 *bias, int T,
                       int rows, int cols, int accumulate, int *rounded) {
    if (t != CPU_W_BF16) {
        cuda_wmat m = wmat(c, w, t, cols), none = {0};
        if (T > c->gemv_tokens) round_once(c, x, T, cols, rounded);
        if (T > c->gemv_tokens && !c->blocks_chunked_gemm)
            cuda_gemm_blocks(y, rows, c->xb, m, none, bias, T, rows, cols, accumulate, &c->queue);
        else if (T <= c->gemv_tokens || !blocks_gemm(c, y, x, m, bias, T, rows, cols, accumulate))
            cuda_matmul_blocks(y, rows, x, m, bias, T, rows, cols, accumulate, &c->queue);
        return;
    }
    if (T > c->gemv_tokens) {
        if (c->mma_gemv && T <= CUDA_DECODE_TOKENS &&
            cuda_matmul_mma(y, rows, x, w, bias, T, rows, cols, accumulate, &c->queue))
            return;
        round_once(c, x, T, cols, rounded);
        if (!bias && cuda_gemm_run(c->gemm, y, rows, c->xb, w, T, rows, cols, accumulate, c->queue.stream)) return;
        if (bias && cuda_gemm_run(c->gemm, c->acc, rows, c->xb, w, T, rows, cols, 0, c->queue.stream)) {
            cuda_bias_residual(y, c->acc, bias, T, rows, accumulate, &c->queue);
            return;
        }
    }
    cuda_matmul(y, x, w, bias, T, rows, cols, accumulate, &c->queue);
}

void cuda_mm(cuda_state *c, float *y, const float *x, const bf16 *w, cpu_wtype t, const bf16 *bias, int T, int rows,
             int cols, int accumulate) {
    int rounded = 0;
    cuda_mm_of(c, y, x, w, t, bias, T, rows, cols, accumulate, &rounded);
}

/* act[T, F] = silu(xn . gate^T) * (xn . up^T), xn = x or, with norm, x's
 * RMSNorm: one fused GEMV (the norm applied on the fly) for up to
 * c->gemv_tokens tokens; the norm into c->xn, two GEMMs and the activation
 * for more. */
static void mlp_in(cuda_state *c, float *act, float *up, const float *x, const bf16 *norm, const bf16 *w_gate,
                   cpu_wtype t_gate, const bf16 *w_up, cpu_wtype t_up, int T, int F, int cols) {
    float eps = (float)c->m->arch.rms_eps;
    if (T <= c->gemv_tokens) {
        if (t_gate == CPU_W_BF16 && t_up == CPU_W_BF16)
            cuda_matmul_swiglu(act, x, norm, eps, w_gate, w_up, T, F, cols, &c->queue);
        else
            cuda_matmul_swiglu_blocks(act, x, norm, eps, wmat(c, w_gate, t_gate, cols), wmat(c, w_up, t_up, cols), T, F,
                                      cols, &c->queue);
        return;
    }
    if (norm) {
        cuda_rmsnorm(c->xn, x, norm, T, cols, eps, &c->queue);
        x = c->xn;
    }
    if ((t_gate != CPU_W_BF16 || t_up != CPU_W_BF16) && !c->blocks_chunked_gemm) { /* SwiGLU in the GEMM's epilogue */
        cuda_to_bf16(c->xb, x, (long)T * cols, &c->queue);
        cuda_gemm_blocks(act, F, c->xb, wmat(c, w_gate, t_gate, cols), wmat(c, w_up, t_up, cols), NULL, T, F, cols, 0,
                         &c->queue);
        return;
    }
    int rounded = 0;
    cuda_mm_of(c, act, x, w_gate, t_gate, NULL, T, F, cols, 0, &rounded);
    cuda_mm_of(c, up, x, w_up, t_up, NULL, T, F, cols, 0, &rounded);
    cuda_swiglu(act, up, T * F, &c->queue);
}

/* The MoE sublayer of the residual rows x, added to them (residual) or
 * written alone: the rows normed into c->xn (which feeds the router, the
 * experts and the shared expert), routing over every expert, the slots of
 * the rank's experts grouped by expert on the device, each chosen expert's
 * rows read once for its tokens, the shared expert (the rank's columns), a
 * deterministic combine in expert order. */
static void moe_forward(cuda_state *c, const layer_weights *w, float *x, int T, int residual) {
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, F = a->moe_ffn, k = a->top_k, S = c->shard.shared_ffn;
    int e0 = c->shard.e0, E = c->shard.n_experts;
    float eps = (float)a->rms_eps;
    const cuda_queue *s = &c->queue;
    if (!c->fused_route || !cuda_route_group(c->groups, c->expert_idx, c->expert_w, c->router_logits, c->xn, x,
                                             w->mlp_norm, eps, w->router, T, a->n_experts, H, k, a->norm_topk, e0, E,
                                             s)) {
        cuda_rmsnorm(c->xn, x, w->mlp_norm, T, H, eps, s);
        cuda_route(c->expert_idx, c->expert_w, c->router_logits, c->xn, w->router, T, a->n_experts, H, k, a->norm_topk,
                   s);
        cuda_moe_group(c->groups, c->expert_idx, T, k, e0, E, s);
    }
    /* more than c->gemv_tokens tokens on tensor cores (bf16 inputs), fewer on the GEMV; experts kept as blocks
     * unpacked into the tensor cores' tiles */
    cuda_wmat none = {0};
    int shared_done = 0;
    if (!w->exp_gate_up && T > c->gemv_tokens) {
        cuda_to_bf16(c->xb, c->xn, (long)T * H, s);
        cuda_expert_gemm_blocks(c->expert_act, c->xb, wmat(c, w->exp_gate, w->t_exp_gate, H),
                                wmat(c, w->exp_up, w->t_exp_up, H), c->groups, T, k, E, F, H, 0, s);
        cuda_to_bf16(c->xb, c->expert_act, (long)T * k * F, s);
        cuda_expert_gemm_blocks(c->expert_out, c->xb, wmat(c, w->exp_down, w->t_exp_down, F), none, c->groups, T, k,
                                E, H, F, 1, s);
    } else if (!w->exp_gate_up) {
        cuda_expert_matmul_blocks(c->expert_act, c->xn, wmat(c, w->exp_gate, w->t_exp_gate, H),
                                  wmat(c, w->exp_up, w->t_exp_up, H), c->groups, T, k, E, F, H, 0, s);
        cuda_expert_matmul_blocks(c->expert_out, c->expert_act, wmat(c, w->exp_down, w->t_exp_down, F), none,
                                  c->groups, T, k, E, H, F, 1, s);
    } else if (T > c->gemv_tokens && cuda_expert_gemm_fits(H, F)) {
        cuda_to_bf16(c->xb, c->xn, (long)T * H, s);
        cuda_expert_gemm(c->expert_act, c->xb, w->exp_gate_up, c->groups, T, k, E, 2 * F, H, 0, 1, s);
        cuda_to_bf16(c->xb, c->expert_act, (long)T * k * F, s);
        cuda_expert_gemm(c->expert_out, c->xb, w->exp_down, c->groups, T, k, E, H, F, 1, 0, s);
    } else {
        /* with the fused route, a bf16 shared expert rides in the same two launches (its own last blockIdx.y) */
        int ride = c->fused_route && w->sh_gate && T <= c->gemv_tokens && w->t_sh_gate == CPU_W_BF16 &&
                   w->t_sh_up == CPU_W_BF16 && w->t_sh_down == CPU_W_BF16;
        cuda_shared_gemv sh_in = {w->sh_gate, w->sh_up, c->xn, c->gate, S, H};
        cuda_shared_gemv sh_down = {w->sh_down, NULL, c->gate, c->shared_out, H, S};
        cuda_expert_matmul(c->expert_act, c->xn, w->exp_gate_up, c->groups, T, k, E, 2 * F, H, 0, 1,
                           ride ? &sh_in : NULL, s);
        cuda_expert_matmul(c->expert_out, c->expert_act, w->exp_down, c->groups, T, k, E, H, F, 1, 0,
                           ride ? &sh_down : NULL, s);
        shared_done = ride;
    }
    if (w->sh_gate && !shared_done) {
        mlp_in(c, c->gate, c->up, c->xn, NULL, w->sh_gate, w->t_sh_gate, w->sh_up, w->t_sh_up, T, S, H);
        cuda_mm(c, c->shared_out, c->gate, w->sh_down, w->t_sh_down, NULL, T, H, S, 0);
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
                          cuda_attention_splits(t1 - t0, nk, c->sms), c->att_tickets, &c->queue);
}

/* c->q, c->k, c->v of the T tokens -> c->att: per-head norms and RoPE,
 * K/V stored (unless roped: the q/k/v GEMV did it), attention
 * (cuda_layer_forward says which kernel). */
static void attend(cuda_state *c, const layer_weights *w, int T, const cuda_kv_map *map, const cuda_run *runs,
                   int n_runs, int roped) {
    const polar_arch *a = &c->m->arch;
    int hd = a->head_dim, nq = c->shard.n_heads, nk = c->shard.n_kv;
    size_t qd = (size_t)nq * hd;
    const cuda_queue *s = &c->queue;
    if (!roped)
        cuda_qk_rope_store(c->q, c->k, c->v, w->q_norm, w->k_norm, c->inv_freq, c->m->rope_scale, c->k_pool,
                           c->v_pool, *map, T, nq, nk, hd, (float)a->rms_eps, s);
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
    int blocks = w->t_wq != CPU_W_BF16 || w->t_wk != CPU_W_BF16 || w->t_wv != CPU_W_BF16;
    int roped = c->fused_rope && T <= c->gemv_tokens && !blocks && !w->q_norm && !w->k_norm;
    if (roped) { /* the attention norm on the fly, RoPE and the K/V store in the epilogue */
        cuda_matmul_qkv_rope(c->q, x, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv, w->attn_norm, eps, c->inv_freq,
                             c->m->rope_scale, c->k_pool, c->v_pool, *map, T, c->shard.n_heads, c->shard.n_kv,
                             a->head_dim, H, s);
    } else if (T <= c->gemv_tokens && !blocks) { /* the attention norm on the fly */
        cuda_matmul_qkv(c->q, c->k, c->v, x, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv, w->attn_norm, eps, T, qd,
                        kvd, H, s);
    } else if (T <= c->gemv_tokens) {
        cuda_matmul_qkv_blocks(c->q, c->k, c->v, x, wmat(c, w->wq, w->t_wq, H), wmat(c, w->wk, w->t_wk, H),
                               wmat(c, w->wv, w->t_wv, H), w->bq, w->bk, w->bv, w->attn_norm, eps, T, qd, kvd, H, s);
    } else {
        cuda_rmsnorm(c->xn, x, w->attn_norm, T, H, eps, s);
        int rounded = 0;
        cuda_mm_of(c, c->q, c->xn, w->wq, w->t_wq, w->bq, T, qd, H, 0, &rounded);
        cuda_mm_of(c, c->k, c->xn, w->wk, w->t_wk, w->bk, T, kvd, H, 0, &rounded);
        cuda_mm_of(c, c->v, c->xn, w->wv, w->t_wv, w->bv, T, kvd, H, 0, &rounded);
    }
    attend(c, w, T, map, runs, n_runs, roped);
    cuda_mm(c, x, c->att, w->wo, w->t_wo, NULL, T, H, qd, residual);
    cuda_all_reduce(c, x, (size_t)T * H);
    if (w->router) {
        moe_forward(c, w, x, T, residual);
    } else {
        mlp_in(c, c->gate, c->up, x, w->mlp_norm, w->w_gate, w->t_gate, w->w_up, w->t_up, T, c->shard.ffn, H);
        cuda_mm(c, x, c->gate, w->w_down, w->t_down, NULL, T, H, c->shard.ffn, residual);
    }
    cuda_all_reduce(c, x, (size_t)T * H);
}

#endif
