/* One decoder layer over a group of tokens on the CPU: see cpu_layer.h. */
#include "cpu_layer.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

int cpu_work_init(cpu_work *w, const polar_model *m, int rows, int max_ctx, int n_threads) {
    const polar_arch *a = &m->arch;
    size_t R = (size_t)rows, q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim;
    size_t ffn = (size_t)a->ffn, top_k = a->top_k > 0 ? (size_t)a->top_k : 1;
    if ((size_t)a->shared_ffn > ffn) ffn = (size_t)a->shared_ffn;
    if ((size_t)2 * a->moe_ffn > ffn) ffn = (size_t)2 * a->moe_ffn;
    size_t max_cols = (size_t)a->hidden > q ? (size_t)a->hidden : q; /* the widest matmul input */
    if ((size_t)a->ffn > max_cols) max_cols = (size_t)a->ffn;
    if ((size_t)a->moe_ffn > max_cols) max_cols = (size_t)a->moe_ffn;
    if ((size_t)a->shared_ffn > max_cols) max_cols = (size_t)a->shared_ffn;
    *w = (cpu_work){.rows = rows, .n_threads = n_threads, .max_ctx = max_ctx};
    w->x = malloc(R * a->hidden * sizeof(float));
    w->xn = malloc(R * a->hidden * sizeof(float));
    w->q = malloc(R * q * sizeof(float));
    w->k = malloc(R * kv * sizeof(float));
    w->v = malloc(R * kv * sizeof(float));
    w->att = malloc(R * q * sizeof(float));
    w->gate = malloc(R * ffn * sizeof(float));
    w->up = malloc(R * ffn * sizeof(float));
    w->router = malloc(R * (size_t)(a->n_experts ? a->n_experts : 1) * sizeof(float));
    w->mlp_out = malloc(R * a->hidden * sizeof(float));
    w->expert_in = malloc(R * a->hidden * sizeof(float));
    w->expert_out = malloc(R * a->hidden * sizeof(float));
    w->scores = malloc((size_t)n_threads * ATTENTION_QUERIES * max_ctx * sizeof(float));
    w->items = malloc(R * a->n_heads * sizeof *w->items);
    w->route_idx = malloc(R * top_k * sizeof(int));
    w->route_w = malloc(R * top_k * sizeof(float));
    w->members = malloc(R * sizeof(int));
    w->member_w = malloc(R * sizeof(float));
    if (m->quantized) w->xq = malloc(R * (max_cols / CPU_QK + 1) * sizeof *w->xq);
    return w->x && w->xn && w->q && w->k && w->v && w->att && w->gate && w->up && w->router && w->mlp_out &&
           w->expert_in && w->expert_out && w->scores && w->items && w->route_idx && w->route_w && w->members && w->member_w &&
           (!m->quantized || w->xq);
}

void cpu_work_free(cpu_work *w) {
    free(w->x);
    free(w->xn);
    free(w->q);
    free(w->k);
    free(w->v);
    free(w->att);
    free(w->gate);
    free(w->up);
    free(w->router);
    free(w->mlp_out);
    free(w->expert_in);
    free(w->expert_out);
    free(w->scores);
    free(w->items);
    free(w->route_idx);
    free(w->route_w);
    free(w->members);
    free(w->member_w);
    free(w->xq);
    *w = (cpu_work){0};
}

/* Rows e * rows .. of a matrix of type t with cols columns: one expert of
 * a stack (row-major blocks, bf16, or x16 with rows a multiple of 16). */
static const void *expert_rows(const bf16 *stack, cpu_wtype t, int e, int rows, int cols) {
    return (const uint8_t *)stack + (size_t)e * rows * cpu_wtype_row_bytes(t, (size_t)cols);
}

/* Expert e's MLP over the n rows of w->expert_in, into w->expert_out. A
 * Hugging Face checkpoint's gate and up rows are one [2F, H] block; a
 * GGUF's are two stacks, multiplied in one pass over the input. */
static void expert_mlp(const polar_arch *a, cpu_work *w, const layer_weights *lw, int e, int n, int round) {
    int H = a->hidden, F = a->moe_ffn, nt = w->n_threads;
    float *act = w->up; /* [n, F] the SwiGLU output */
    if (lw->exp_gate_up) {
        cpu_matmul(w->gate, w->expert_in, lw->exp_gate_up + (size_t)e * 2 * F * H, NULL, n, 2 * F, H, 0, nt);
        for (int i = 0; i < n; i++) {
            float *gu = w->gate + (size_t)i * 2 * F;
            cpu_swiglu(gu, gu + F, F);
            memcpy(act + (size_t)i * F, gu, (size_t)F * sizeof(float));
        }
    } else {
        const cpu_q_out gate_up[2] = {{w->gate, expert_rows(lw->exp_gate, lw->t_exp_gate, e, F, H), lw->t_exp_gate, NULL, F},
                                      {w->up, expert_rows(lw->exp_up, lw->t_exp_up, e, F, H), lw->t_exp_up, NULL, F}};
        cpu_matmul_q_multi(gate_up, 2, w->expert_in, n, H, 0, nt, w->xq);
        for (int i = 0; i < n; i++) cpu_swiglu(w->gate + (size_t)i * F, w->up + (size_t)i * F, F);
        act = w->gate;
    }
    if (round) cpu_round_bf16(act, (size_t)n * F);
    cpu_matmul_q(w->expert_out, act, expert_rows(lw->exp_down, lw->t_exp_down, e, H, F), lw->t_exp_down, NULL, n, H, F,
                 0, nt, w->xq);
}

/* The MoE sublayer on the normed input w->xn: each token through its top-k
 * experts (weighted, summed in ascending expert order) plus the
 * sigmoid-gated shared expert, then added to the residual stream. Tokens are
 * grouped by expert, so each chosen expert's weights are read once per pass
 * for all the tokens routed to it. */
static void moe_forward(const polar_arch *a, cpu_work *w, const layer_weights *lw, float *x, int T, int round_in) {
    int H = a->hidden, F = a->moe_ffn, E = a->n_experts, k = a->top_k, nt = w->n_threads;
    int *idx = w->route_idx, *members = w->members;
    float *weight = w->route_w, *member_w = w->member_w;
    cpu_matmul(w->router, w->xn, lw->router, NULL, T, E, H, 0, nt);
    for (int t = 0; t < T; t++) cpu_route(w->router + (size_t)t * E, E, k, a->norm_topk, idx + t * k, weight + t * k);
    memset(w->mlp_out, 0, (size_t)T * H * sizeof *w->mlp_out);
    int round_experts = round_in && cuda_expert_gemm_fits(H, F);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (idx[t * k + j] == e) {
                    members[n] = t;
                    member_w[n++] = weight[t * k + j];
                }
        if (!n) continue;
        for (int i = 0; i < n; i++)
            memcpy(w->expert_in + (size_t)i * H, w->xn + (size_t)members[i] * H, (size_t)H * sizeof(float));
        if (round_experts) cpu_round_bf16(w->expert_in, (size_t)n * H);
        expert_mlp(a, w, lw, e, n, round_experts);
        for (int i = 0; i < n; i++) {
            float *out = w->mlp_out + (size_t)members[i] * H, *y = w->expert_out + (size_t)i * H;
            for (int c = 0; c < H; c++) out[c] += y[c] * member_w[i];
        }
    }
    if (lw->sh_gate) {
        int S = a->shared_ffn;
        float *g = w->member_w; /* the shared expert's gate per token; the routed experts are done with it */
        const float *in = w->xn; /* the shared gate reads xn in f32, the shared expert a bf16 copy when rounding */
        if (round_in) {
            memcpy(w->expert_in, w->xn, (size_t)T * H * sizeof(float));
            cpu_round_bf16(w->expert_in, (size_t)T * H);
            in = w->expert_in;
        }
        const cpu_q_out sh[2] = {{w->gate, lw->sh_gate, lw->t_sh_gate, NULL, S}, {w->up, lw->sh_up, lw->t_sh_up, NULL, S}};
        cpu_matmul_q_multi(sh, 2, in, T, H, 0, nt, w->xq);
        for (int t = 0; t < T; t++) cpu_swiglu(w->gate + (size_t)t * S, w->up + (size_t)t * S, S);
        if (round_in) cpu_round_bf16(w->gate, (size_t)T * S);
        cpu_matmul(g, w->xn, lw->sh_router, NULL, T, 1, H, 0, 1);
        cpu_matmul_q(w->expert_out, w->gate, lw->sh_down, lw->t_sh_down, NULL, T, H, S, 0, nt, w->xq);
        for (int t = 0; t < T; t++) {
            float sig = 1.0f / (1.0f + expf(-g[t]));
            for (int i = 0; i < H; i++) w->mlp_out[(size_t)t * H + i] += sig * w->expert_out[(size_t)t * H + i];
        }
    }
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += w->mlp_out[i];
}

/* Tokens from t0 on that are consecutive positions of one sequence, up to
 * ATTENTION_ITEM_TOKENS. */
static int run_length(const cpu_token_at *at, int T, int t0) {
    int len = 1;
    while (len < ATTENTION_ITEM_TOKENS && t0 + len < T && at[t0 + len].blocks == at[t0].blocks &&
           at[t0 + len].pos == at[t0].pos + len)
        len++;
    return len;
}

/* The attention's work items for T tokens. Consecutive tokens of one
 * sequence (a prompt chunk) go together, with one KV head's query heads:
 * that head's K/V rows, read from memory once, serve the item's queries
 * from the thread's cache (with few such items, one head each, so that
 * every thread has work). A token alone (decode) takes its heads in one
 * item when there are enough tokens to share, else a GQA group (the
 * kernel tiles a group's heads, loading each K/V row once for them), in
 * parts when there are fewer groups than threads. Each head's sums are the
 * same whichever way. */
static int attention_items(const polar_arch *a, const cpu_token_at *at, int T, int nt, attention_item *items) {
    int group = a->n_heads / a->n_kv_heads, runs = 0, n = 0;
    for (int t0 = 0, len; t0 < T; t0 += len) runs += (len = run_length(at, T, t0)) > 1;
    int in_run = runs * a->n_kv_heads >= 2 * nt ? group : 1; /* heads per item */
    int parts = (nt + T * a->n_kv_heads - 1) / (T * a->n_kv_heads); /* of a group, so that each thread has one */
    parts = parts < group ? parts : group;
    int alone = T >= 4 * nt ? a->n_heads : (group + parts - 1) / parts;
    for (int t0 = 0, len; t0 < T; t0 += len) {
        len = run_length(at, T, t0);
        int per_item = len > 1 ? in_run : alone;
        for (int h0 = 0, n_h; h0 < a->n_heads; h0 += n_h) {
            int end = per_item >= group ? h0 + per_item : (h0 / group + 1) * group; /* a part stays in its group */
            n_h = end - h0 < per_item ? end - h0 : per_item;
            items[n++] = (attention_item){t0, len, h0, n_h};
        }
    }
    return n;
}

/* One token's K and V rows into the pool at row: bf16 rows rounded to
 * nearest even; f32 rows as they are, or so rounded (round_cache). */
static void store_kv(kv_pool *pool, size_t row, const float *k, const float *v, int round_cache) {
    int kvd = pool->kv_dim;
    if (pool->k16) {
        for (int i = 0; i < kvd; i++) {
            pool->k16[row + i] = f32_to_bf16(k[i]);
            pool->v16[row + i] = f32_to_bf16(v[i]);
        }
        return;
    }
    memcpy(pool->k + row, k, (size_t)kvd * sizeof(float));
    memcpy(pool->v + row, v, (size_t)kvd * sizeof(float));
    if (round_cache) {
        cpu_round_bf16(pool->k + row, (size_t)kvd);
        cpu_round_bf16(pool->v + row, (size_t)kvd);
    }
}

/* An item's tokens and heads (a decode token's heads of one KV head in
 * tiles, a prompt run's tokens tiled head by head). */
static void item_attention(const polar_arch *a, cpu_work *w, const kv_pool *pool, const cpu_token_at *at,
                           const attention_item *item, float *scores) {
    int t = item->t0, hd = a->head_dim;
    size_t qd = (size_t)a->n_heads * hd;
    float *out = w->att + t * qd;
    const float *q = w->q + t * qd;
    if (pool->k16)
        cpu_attention_rows_bf16(out, q, qd, item->n_tokens, pool->k16, pool->v16, at[t].blocks, at[t].pos, item->h0,
                                item->n_heads, a->n_heads, a->n_kv_heads, hd, scores, (size_t)w->max_ctx);
    else
        cpu_attention_rows(out, q, qd, item->n_tokens, pool->k, pool->v, at[t].blocks, at[t].pos, item->h0,
                           item->n_heads, a->n_heads, a->n_kv_heads, hd, scores, (size_t)w->max_ctx);
}

void cpu_layer_forward(const polar_model *m, cpu_work *w, const layer_weights *lw, float *x, kv_pool *pool,
                       const cpu_token_at *at, int T, int round_in, int round_cache) {
    const polar_arch *a = &m->arch;
    int hd = a->head_dim, nt = w->n_threads;
    int qd = a->n_heads * hd, kvd = a->n_kv_heads * hd;
    float eps = (float)a->rms_eps;

    for (int t = 0; t < T; t++) cpu_rmsnorm(w->xn + (size_t)t * a->hidden, x + (size_t)t * a->hidden, lw->attn_norm, a->hidden, eps);
    if (round_in) cpu_round_bf16(w->xn, (size_t)T * a->hidden);
    const cpu_q_out qkv[3] = {{w->q, lw->wq, lw->t_wq, lw->bq, qd}, {w->k, lw->wk, lw->t_wk, lw->bk, kvd},
                              {w->v, lw->wv, lw->t_wv, lw->bv, kvd}};
    cpu_matmul_q_multi(qkv, 3, w->xn, T, a->hidden, 0, nt, w->xq);
    for (int t = 0; t < T; t++) {
        float *qt = w->q + (size_t)t * qd, *kt = w->k + (size_t)t * kvd;
        if (lw->q_norm) {
            for (int h = 0; h < a->n_heads; h++) cpu_rmsnorm(qt + (size_t)h * hd, qt + (size_t)h * hd, lw->q_norm, hd, eps);
            for (int h = 0; h < a->n_kv_heads; h++) cpu_rmsnorm(kt + (size_t)h * hd, kt + (size_t)h * hd, lw->k_norm, hd, eps);
        }
        cpu_rope(qt, at[t].cos, at[t].sin, a->n_heads, hd);
        cpu_rope(kt, at[t].cos, at[t].sin, a->n_kv_heads, hd);
        store_kv(pool, cpu_kv_row(at[t].blocks, at[t].pos) * kvd, kt, w->v + (size_t)t * kvd, round_cache);
    }
    int items = attention_items(a, at, T, nt, w->items);
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int it = 0; it < items; it++) {
        float *scores = w->scores + (size_t)omp_get_thread_num() * ATTENTION_QUERIES * w->max_ctx;
        item_attention(a, w, pool, at, &w->items[it], scores);
    }
    if (round_in) cpu_round_bf16(w->att, (size_t)T * qd);
    cpu_matmul_q(x, w->att, lw->wo, lw->t_wo, NULL, T, a->hidden, qd, 1, nt, w->xq);

    for (int t = 0; t < T; t++) cpu_rmsnorm(w->xn + (size_t)t * a->hidden, x + (size_t)t * a->hidden, lw->mlp_norm, a->hidden, eps);
    if (lw->router) {
        moe_forward(a, w, lw, x, T, round_in);
        return;
    }
    if (round_in) cpu_round_bf16(w->xn, (size_t)T * a->hidden);
    const cpu_q_out gate_up[2] = {{w->gate, lw->w_gate, lw->t_gate, NULL, a->ffn}, {w->up, lw->w_up, lw->t_up, NULL, a->ffn}};
    cpu_matmul_q_multi(gate_up, 2, w->xn, T, a->hidden, 0, nt, w->xq);
    for (int t = 0; t < T; t++) cpu_swiglu(w->gate + (size_t)t * a->ffn, w->up + (size_t)t * a->ffn, a->ffn);
    if (round_in) cpu_round_bf16(w->gate, (size_t)T * a->ffn);
    cpu_matmul_q(x, w->gate, lw->w_down, lw->t_down, NULL, T, a->hidden, a->ffn, 1, nt, w->xq);
}

void cpu_final_norm(const polar_model *m, float *out, const float *x) {
    cpu_rmsnorm(out, x, m->final_norm, m->arch.hidden, (float)m->arch.rms_eps);
}
