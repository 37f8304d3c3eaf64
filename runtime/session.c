/* A session runs one program over a growing token sequence on the CPU.
 *
 * The KV cache is keyed by execution position: entry k of the program owns
 * slot k, whatever layer it runs. A layer repeated in the program therefore
 * gets one slot per occurrence, a skipped layer none: exactly an unrolled
 * model with tied weights, so decoding with the cache equals a full
 * recompute. Everything is allocated in polar_session_create. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/kernels.h"
#include "../kernels/cpu/ops.h"
#include "../loader/config.h"
#include "backend.h"
#include "error.h"
#include "model.h"

/* Tokens pushed through the layers together during prefill; bounds the
 * workspaces while letting each weight row serve several tokens. */
#define PREFILL_CHUNK 32

struct polar_session {
    const polar_model *m;
    int *program;       /* [cap_program] layer index per execution position */
    int n_program, cap_program;
    int max_ctx, pos, n_threads;
    int chunk;          /* tokens per forward: PREFILL_CHUNK, or the device's */
    int round_like_cuda;/* round where a CUDA session would (polar_session_opts) */
    int cuda_chunk;     /* ... whose forward takes this many tokens at once */
    float *k_cache;     /* [cap_program, max_ctx, n_kv*head_dim] */
    float *v_cache;     /* same */
    float *x;           /* [CHUNK, hidden] residual stream */
    float *xn;          /* [CHUNK, hidden] normed input of a sublayer */
    float *q;           /* [CHUNK, n_heads*head_dim] */
    float *k, *v;       /* [CHUNK, n_kv*head_dim] */
    float *att;         /* [CHUNK, n_heads*head_dim] attention output */
    float *gate, *up;   /* [CHUNK, max(ffn, shared_ffn, 2*moe_ffn)] */
    float *router;      /* [CHUNK, n_experts] router logits */
    float *mlp_out;     /* [CHUNK, hidden] MoE layer output before the residual */
    float *expert_in;   /* [CHUNK, hidden] the normed inputs of one expert's tokens */
    float *expert_out;  /* [CHUNK, hidden] their outputs (or the shared expert's) */
    float *cos, *sin;   /* [CHUNK, head_dim/2] rope tables of the chunk's positions */
    float *scores;      /* [n_threads, max_ctx] softmax scratch */
    float *logits;      /* [vocab] of the last token */
    cpu_q8_block *xq;   /* [CHUNK, max matmul cols / 32] quantized activations, or NULL (a bf16 model) */
    int has_logits;
    cuda_state *cuda;   /* the device backend, or NULL on the CPU */
    /* share_prompt: the last prompt prefilled from position 0, its program
     * and its residual stream before each entry, so a program sharing the
     * first L entries resumes that prompt at entry L (its KV slots 0..L-1
     * for the prompt's positions are still the ones it would write) */
    float *prompt_x;      /* [cap_program + 1, max_ctx, hidden], or NULL */
    int *prompt_tokens;   /* [max_ctx] */
    int *prompt_program;  /* [cap_program] */
    int prompt_len;       /* 0: nothing to resume */
    int prompt_program_len;
    int prompt_reused;    /* entries the last prompt resumed instead of running */
    int recording;        /* this prefill writes prompt_x */
};

static polar_status check_program(const polar_model *m, const polar_program *p, polar_error *err) {
    if (!p || p->n < 1 || !p->layers) return polar_fail(err, POLAR_ERR_PROGRAM, "program: empty program");
    for (int i = 0; i < p->n; i++)
        if (p->layers[i] < 0 || p->layers[i] >= m->arch.n_layers)
            return polar_fail(err, POLAR_ERR_PROGRAM, "program: entry %d is layer %d, outside 0..%d", i,
                              p->layers[i], m->arch.n_layers - 1);
    return POLAR_OK;
}

polar_status polar_session_create(const polar_model *m, const polar_program *program,
                                  const polar_session_opts *opts, polar_session **out, polar_error *err) {
    *out = NULL;
    if (!m) return polar_fail(err, POLAR_ERR_ARG, "no model given");
    polar_status st = check_program(m, program, err);
    if (st != POLAR_OK) return st;
    const polar_arch *a = &m->arch;
    polar_session_opts o = opts ? *opts : (polar_session_opts){0};
    if (o.max_ctx < 0 || o.max_program_len < 0 || o.n_threads < 0)
        return polar_fail(err, POLAR_ERR_ARG, "session options must not be negative");
    if (o.max_ctx == 0) o.max_ctx = a->max_pos < 4096 ? a->max_pos : 4096;
    if (o.max_program_len < program->n) o.max_program_len = program->n;
    if (o.n_threads == 0) o.n_threads = omp_get_max_threads();
    polar_session *s = calloc(1, sizeof *s);
    if (!s) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the session");
    s->m = m;
    s->max_ctx = o.max_ctx;
    s->cap_program = o.max_program_len;
    s->n_threads = o.n_threads;
    size_t q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim, C = PREFILL_CHUNK;
    size_t cache = (size_t)s->cap_program * (size_t)s->max_ctx * kv;
    char why[256];
    int use_cuda = o.device == POLAR_DEVICE_CUDA || (o.device == POLAR_DEVICE_AUTO && polar_cuda_available(why, sizeof why));
    s->cuda_chunk = s->max_ctx < CUDA_PREFILL_CHUNK ? s->max_ctx : CUDA_PREFILL_CHUNK;
    s->chunk = use_cuda ? s->cuda_chunk : PREFILL_CHUNK;
    if (use_cuda && (st = cuda_state_create(m, s->cap_program, s->max_ctx, s->chunk, &s->cuda, err)) != POLAR_OK) {
        if (o.device == POLAR_DEVICE_CUDA) {
            free(s);
            return st;
        }
        /* auto: the GPU cannot take this session (head_dim, memory); the CPU
         * can, and polar_session_device says which was chosen */
        s->chunk = PREFILL_CHUNK;
    }
    s->round_like_cuda = !s->cuda && o.round_like_cuda;
    if (s->cuda) cache = 1; /* the KV cache lives on the device */
    s->program = malloc((size_t)s->cap_program * sizeof *s->program);
    s->k_cache = malloc(cache * sizeof(float));
    s->v_cache = malloc(cache * sizeof(float));
    s->x = malloc(C * a->hidden * sizeof(float));
    s->xn = malloc(C * a->hidden * sizeof(float));
    s->q = malloc(C * q * sizeof(float));
    s->k = malloc(C * kv * sizeof(float));
    s->v = malloc(C * kv * sizeof(float));
    s->att = malloc(C * q * sizeof(float));
    size_t ffn = (size_t)a->ffn;
    if ((size_t)a->shared_ffn > ffn) ffn = (size_t)a->shared_ffn;
    if ((size_t)2 * a->moe_ffn > ffn) ffn = (size_t)2 * a->moe_ffn;
    s->gate = malloc(C * ffn * sizeof(float));
    s->up = malloc(C * ffn * sizeof(float));
    s->router = malloc(C * (size_t)(a->n_experts ? a->n_experts : 1) * sizeof(float));
    s->mlp_out = malloc(C * a->hidden * sizeof(float));
    s->expert_in = malloc(C * a->hidden * sizeof(float));
    s->expert_out = malloc(C * a->hidden * sizeof(float));
    s->cos = malloc(C * (size_t)(a->head_dim / 2) * sizeof(float));
    s->sin = malloc(C * (size_t)(a->head_dim / 2) * sizeof(float));
    s->scores = malloc((size_t)s->n_threads * s->max_ctx * sizeof(float));
    s->logits = malloc((size_t)a->vocab * sizeof(float));
    size_t max_cols = (size_t)a->hidden > q ? (size_t)a->hidden : q;
    if ((size_t)a->ffn > max_cols) max_cols = (size_t)a->ffn;
    if (m->quantized) s->xq = malloc(C * (max_cols / CPU_QK + 1) * sizeof *s->xq);
    int share = o.share_prompt && !s->cuda;
    if (share) {
        s->prompt_x = malloc((size_t)(s->cap_program + 1) * s->max_ctx * a->hidden * sizeof(float));
        s->prompt_tokens = malloc((size_t)s->max_ctx * sizeof(int));
        s->prompt_program = malloc((size_t)s->cap_program * sizeof(int));
    }
    if ((share && (!s->prompt_x || !s->prompt_tokens || !s->prompt_program)) || !s->program || !s->k_cache || !s->v_cache || !s->x || !s->xn || !s->q || !s->k || !s->v || !s->att ||
        !s->gate || !s->up || !s->router || !s->mlp_out || !s->expert_in || !s->expert_out || !s->cos || !s->sin || !s->scores ||
        !s->logits || (m->quantized && !s->xq)) {
        polar_session_free(s);
        return polar_fail(err, POLAR_ERR_NOMEM,
                          "out of memory creating the session (KV cache of %zu MiB for %d positions x %d tokens)",
                          2 * cache * sizeof(float) >> 20, o.max_program_len, o.max_ctx);
    }
    memcpy(s->program, program->layers, (size_t)program->n * sizeof(int));
    s->n_program = program->n;
    *out = s;
    return POLAR_OK;
}

polar_status polar_session_set_program(polar_session *s, const polar_program *program, polar_error *err) {
    polar_status st = check_program(s->m, program, err);
    if (st != POLAR_OK) return st;
    if (program->n > s->cap_program)
        return polar_fail(err, POLAR_ERR_PROGRAM,
                          "program: %d entries but the session's cache holds %d execution positions", program->n,
                          s->cap_program);
    memcpy(s->program, program->layers, (size_t)program->n * sizeof(int));
    s->n_program = program->n;
    polar_session_reset(s);
    return POLAR_OK;
}

void polar_session_reset(polar_session *s) {
    s->pos = 0;
    s->has_logits = 0;
}

int polar_session_pos(const polar_session *s) { return s->pos; }

int polar_session_threads(const polar_session *s) { return s->n_threads; }

const char *polar_session_device(const polar_session *s) { return s && s->cuda ? "cuda" : "cpu"; }

const char *polar_cpu_kernels(void) { return cpu_kernels_active()->name; }

const float *polar_logits(const polar_session *s) { return s->has_logits ? s->logits : NULL; }

void polar_session_free(polar_session *s) {
    if (!s) return;
    cuda_state_free(s->cuda);
    free(s->program);
    free(s->k_cache);
    free(s->v_cache);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->gate);
    free(s->up);
    free(s->router);
    free(s->mlp_out);
    free(s->expert_in);
    free(s->expert_out);
    free(s->cos);
    free(s->sin);
    free(s->scores);
    free(s->logits);
    free(s->xq);
    free(s->prompt_x);
    free(s->prompt_tokens);
    free(s->prompt_program);
    free(s);
}

/* The MoE sublayer on the normed input s->xn: each token through its top-k
 * experts (weighted, summed in ascending expert order) plus the
 * sigmoid-gated shared expert, then added to the residual stream. Tokens are
 * grouped by expert, so each chosen expert's weights are read once per chunk
 * for all the tokens routed to it. */
static void moe_forward(polar_session *s, const layer_weights *w, int T, int round_in) {
    const polar_arch *a = &s->m->arch;
    int H = a->hidden, F = a->moe_ffn, E = a->n_experts, k = a->top_k, nt = s->n_threads;
    int idx[PREFILL_CHUNK * MAX_TOP_K];
    float weight[PREFILL_CHUNK * MAX_TOP_K];
    int members[PREFILL_CHUNK]; /* the tokens routed to one expert, ascending */
    float member_w[PREFILL_CHUNK];
    cpu_matmul(s->router, s->xn, w->router, NULL, T, E, H, 0, nt);
    for (int t = 0; t < T; t++) cpu_route(s->router + (size_t)t * E, E, k, a->norm_topk, idx + t * k, weight + t * k);
    memset(s->mlp_out, 0, (size_t)T * H * sizeof *s->mlp_out);
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
            memcpy(s->expert_in + (size_t)i * H, s->xn + (size_t)members[i] * H, (size_t)H * sizeof(float));
        if (round_experts) cpu_round_bf16(s->expert_in, (size_t)n * H);
        /* gate and up rows of expert e are one [2F, H] block */
        cpu_matmul(s->gate, s->expert_in, w->exp_gate_up + (size_t)e * 2 * F * H, NULL, n, 2 * F, H, 0, nt);
        for (int i = 0; i < n; i++) {
            float *gu = s->gate + (size_t)i * 2 * F;
            cpu_swiglu(gu, gu + F, F);
            memcpy(s->up + (size_t)i * F, gu, (size_t)F * sizeof(float));
        }
        if (round_experts) cpu_round_bf16(s->up, (size_t)n * F);
        cpu_matmul(s->expert_out, s->up, w->exp_down + (size_t)e * H * F, NULL, n, H, F, 0, nt);
        for (int i = 0; i < n; i++) {
            float *out = s->mlp_out + (size_t)members[i] * H, *y = s->expert_out + (size_t)i * H;
            for (int c = 0; c < H; c++) out[c] += y[c] * member_w[i];
        }
    }
    if (w->sh_gate) {
        int S = a->shared_ffn;
        float g[PREFILL_CHUNK];
        const float *in = s->xn; /* the shared gate reads xn in f32, the shared expert a bf16 copy when rounding */
        if (round_in) {
            memcpy(s->expert_in, s->xn, (size_t)T * H * sizeof(float));
            cpu_round_bf16(s->expert_in, (size_t)T * H);
            in = s->expert_in;
        }
        cpu_matmul(s->gate, in, w->sh_gate, NULL, T, S, H, 0, nt);
        cpu_matmul(s->up, in, w->sh_up, NULL, T, S, H, 0, nt);
        for (int t = 0; t < T; t++) cpu_swiglu(s->gate + (size_t)t * S, s->up + (size_t)t * S, S);
        if (round_in) cpu_round_bf16(s->gate, (size_t)T * S);
        cpu_matmul(g, s->xn, w->sh_router, NULL, T, 1, H, 0, 1);
        cpu_matmul(s->expert_out, s->gate, w->sh_down, NULL, T, H, S, 0, nt);
        for (int t = 0; t < T; t++) {
            float sig = 1.0f / (1.0f + expf(-g[t]));
            for (int i = 0; i < H; i++) s->mlp_out[(size_t)t * H + i] += sig * s->expert_out[(size_t)t * H + i];
        }
    }
    for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->mlp_out[i];
}

/* One decoder layer (weights w) at execution position slot, for T tokens at
 * positions s->pos .. s->pos+T-1. round_in: the GEMM inputs are rounded to
 * bf16 (a CUDA prefill chunk's), and with round_like_cuda the cache is bf16. */
static void layer_forward(polar_session *s, const layer_weights *w, int slot, int T, int round_in) {
    const polar_arch *a = &s->m->arch;
    int hd = a->head_dim, half = hd / 2, nt = s->n_threads;
    int qd = a->n_heads * hd, kvd = a->n_kv_heads * hd;
    float eps = (float)a->rms_eps;
    float *kc = s->k_cache + (size_t)slot * s->max_ctx * kvd;
    float *vc = s->v_cache + (size_t)slot * s->max_ctx * kvd;

    for (int t = 0; t < T; t++) cpu_rmsnorm(s->xn + (size_t)t * a->hidden, s->x + (size_t)t * a->hidden, w->attn_norm, a->hidden, eps);
    if (round_in) cpu_round_bf16(s->xn, (size_t)T * a->hidden);
    const cpu_q_out qkv[3] = {{s->q, w->wq, w->t_wq, w->bq, qd}, {s->k, w->wk, w->t_wk, w->bk, kvd},
                              {s->v, w->wv, w->t_wv, w->bv, kvd}};
    cpu_matmul_q_multi(qkv, 3, s->xn, T, a->hidden, 0, nt, s->xq);
    for (int t = 0; t < T; t++) {
        float *qt = s->q + (size_t)t * qd, *kt = s->k + (size_t)t * kvd;
        if (w->q_norm) {
            for (int h = 0; h < a->n_heads; h++) cpu_rmsnorm(qt + (size_t)h * hd, qt + (size_t)h * hd, w->q_norm, hd, eps);
            for (int h = 0; h < a->n_kv_heads; h++) cpu_rmsnorm(kt + (size_t)h * hd, kt + (size_t)h * hd, w->k_norm, hd, eps);
        }
        cpu_rope(qt, s->cos + (size_t)t * half, s->sin + (size_t)t * half, a->n_heads, hd);
        cpu_rope(kt, s->cos + (size_t)t * half, s->sin + (size_t)t * half, a->n_kv_heads, hd);
        memcpy(kc + (size_t)(s->pos + t) * kvd, kt, (size_t)kvd * sizeof(float));
        memcpy(vc + (size_t)(s->pos + t) * kvd, s->v + (size_t)t * kvd, (size_t)kvd * sizeof(float));
        if (s->round_like_cuda) {
            cpu_round_bf16(kc + (size_t)(s->pos + t) * kvd, (size_t)kvd);
            cpu_round_bf16(vc + (size_t)(s->pos + t) * kvd, (size_t)kvd);
        }
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int th = 0; th < T * a->n_heads; th++) {
        int t = th / a->n_heads, h = th % a->n_heads;
        float *scores = s->scores + (size_t)omp_get_thread_num() * s->max_ctx;
        cpu_attention_head(s->att + (size_t)t * qd, s->q + (size_t)t * qd, kc, vc, s->pos + t, h, a->n_heads,
                           a->n_kv_heads, hd, scores);
    }
    if (round_in) cpu_round_bf16(s->att, (size_t)T * qd);
    cpu_matmul_q(s->x, s->att, w->wo, w->t_wo, NULL, T, a->hidden, qd, 1, nt, s->xq);

    for (int t = 0; t < T; t++) cpu_rmsnorm(s->xn + (size_t)t * a->hidden, s->x + (size_t)t * a->hidden, w->mlp_norm, a->hidden, eps);
    if (w->router) {
        moe_forward(s, w, T, round_in);
        return;
    }
    if (round_in) cpu_round_bf16(s->xn, (size_t)T * a->hidden);
    const cpu_q_out gate_up[2] = {{s->gate, w->w_gate, w->t_gate, NULL, a->ffn}, {s->up, w->w_up, w->t_up, NULL, a->ffn}};
    cpu_matmul_q_multi(gate_up, 2, s->xn, T, a->hidden, 0, nt, s->xq);
    for (int t = 0; t < T; t++) cpu_swiglu(s->gate + (size_t)t * a->ffn, s->up + (size_t)t * a->ffn, a->ffn);
    if (round_in) cpu_round_bf16(s->gate, (size_t)T * a->ffn);
    cpu_matmul_q(s->x, s->gate, w->w_down, w->t_down, NULL, T, a->hidden, a->ffn, 1, nt, s->xq);
}

/* T <= PREFILL_CHUNK tokens through the whole program; logits of all of them
 * into all_logits (T x vocab) when given, of the last into s->logits; their
 * final-normed hidden states into hidden (T x hidden) when given. round_in:
 * see layer_forward. */
static void forward_chunk(polar_session *s, const int *tokens, int T, float *all_logits, float *hidden, int round_in,
                          int start) {
    const polar_model *m = s->m;
    const polar_arch *a = &m->arch;
    int half = a->head_dim / 2;
    size_t rows = (size_t)T * a->hidden;
    for (int t = 0; t < T; t++) {
        if (!start) cpu_embed_q(s->x + (size_t)t * a->hidden, m->embed, m->t_embed, tokens[t], a->hidden);
        cpu_rope_angles(s->cos + (size_t)t * half, s->sin + (size_t)t * half, m->rope_inv_freq, half, s->pos + t);
    }
    /* the residual stream before entry k of this chunk's tokens */
#define PROMPT_X(k) (s->prompt_x + ((size_t)(k) * s->max_ctx + (size_t)s->pos) * a->hidden)
    if (start) memcpy(s->x, PROMPT_X(start), rows * sizeof(float));
    for (int k = start; k < s->n_program; k++) {
        if (s->recording) memcpy(PROMPT_X(k), s->x, rows * sizeof(float));
        layer_forward(s, &m->layers[s->program[k]], k, T, round_in);
    }
    if (s->recording) memcpy(PROMPT_X(s->n_program), s->x, rows * sizeof(float));
#undef PROMPT_X
    int first = all_logits || hidden ? 0 : T - 1;
    for (int t = first; t < T; t++)
        cpu_rmsnorm(s->xn + (size_t)t * a->hidden, s->x + (size_t)t * a->hidden, m->final_norm, a->hidden,
                    (float)a->rms_eps);
    if (hidden) memcpy(hidden, s->xn, (size_t)T * a->hidden * sizeof *hidden);
    /* A CUDA forward computes the head of all rows in slices of 32 (this
     * chunk, when rounding), through a GEMM on bf16 inputs beyond 8 rows. */
    if (s->round_like_cuda && first == 0 && T > CUDA_DECODE_TOKENS) cpu_round_bf16(s->xn, (size_t)T * a->hidden);
    if (all_logits)
        cpu_matmul_q(all_logits, s->xn, m->lm_head, m->t_lm_head, NULL, T, a->vocab, a->hidden, 0, s->n_threads, s->xq);
    cpu_matmul_q(s->logits, s->xn + (size_t)(T - 1) * a->hidden, m->lm_head, m->t_lm_head, NULL, 1, a->vocab,
                 a->hidden, 0, s->n_threads, s->xq);
    s->pos += T;
    s->has_logits = 1;
}

static polar_status append(polar_session *s, const int *tokens, int n, float *all_logits, float *hidden,
                           polar_error *err);

polar_status polar_prefill(polar_session *s, const int *tokens, int n, float *all_logits, polar_error *err) {
    return append(s, tokens, n, all_logits, NULL, err);
}

polar_status polar_encode(polar_session *s, const int *tokens, int n, float *hidden, polar_error *err) {
    if (!s || !hidden) return polar_fail(err, POLAR_ERR_ARG, "encode: no session or output");
    polar_session_reset(s);
    return append(s, tokens, n, NULL, hidden, err);
}

static polar_status append(polar_session *s, const int *tokens, int n, float *all_logits, float *hidden,
                           polar_error *err) {
    if (!s || (!tokens && n)) return polar_fail(err, POLAR_ERR_ARG, "prefill: no session or tokens");
    if (n < 1) return polar_fail(err, POLAR_ERR_ARG, "prefill: no tokens given");
    int vocab = s->m->arch.vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return polar_fail(err, POLAR_ERR_RANGE, "token %d (at index %d) is outside the vocabulary 0..%d",
                              tokens[i], i, vocab - 1);
    if (n > s->max_ctx - s->pos)
        return polar_fail(err, POLAR_ERR_RANGE, "%d tokens do not fit: the context holds %d and %d are used", n,
                          s->max_ctx, s->pos);
    /* A prompt from position 0 resumes the last one at the first entry
     * where the programs differ, and is recorded for the next. */
    int start = 0;
    s->recording = s->prompt_x && s->pos == 0;
    if (s->recording) {
        if (n == s->prompt_len && !memcmp(tokens, s->prompt_tokens, (size_t)n * sizeof *tokens))
            while (start < s->n_program && start < s->prompt_program_len &&
                   s->program[start] == s->prompt_program[start])
                start++;
        s->prompt_reused = start;
        s->prompt_len = 0; /* until this prompt is complete */
    }
    /* Rounding like CUDA, the CPU's chunks nest in the ones a CUDA forward
     * would take, whose size decides where it rounds. */
    int outer = s->round_like_cuda ? s->cuda_chunk : n;
    for (int g = 0; g < n; g += outer) {
        int end = n - g < outer ? n : g + outer, round_in = s->round_like_cuda && end - g > CUDA_DECODE_TOKENS;
        for (int i = g; i < end; i += s->chunk) {
            int T = end - i < s->chunk ? end - i : s->chunk;
            /* When all logits are wanted, the last-token copy is redundant but cheap
             * next to the chunk's own head matmul. */
            float *al = all_logits ? all_logits + (size_t)i * vocab : NULL;
            float *hid = hidden ? hidden + (size_t)i * s->m->arch.hidden : NULL;
            if (s->cuda) {
                polar_status st = cuda_forward(s->cuda, s->program, s->n_program, tokens + i, T, s->pos, s->logits,
                                               al, hid, err);
                if (st != POLAR_OK) return st;
                s->pos += T;
                s->has_logits = 1;
            } else {
                forward_chunk(s, tokens + i, T, al, hid, round_in, start);
            }
        }
    }
    if (s->recording) {
        memcpy(s->prompt_tokens, tokens, (size_t)n * sizeof *tokens);
        memcpy(s->prompt_program, s->program, (size_t)s->n_program * sizeof *s->program);
        s->prompt_len = n, s->prompt_program_len = s->n_program;
        s->recording = 0;
    }
    return POLAR_OK;
}

int polar_session_prompt_reused(const polar_session *s) { return s->prompt_reused; }

polar_status polar_decode_step(polar_session *s, int token, polar_error *err) {
    return polar_prefill(s, &token, 1, NULL, err);
}

int polar_argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int is_stop(const polar_arch *a, const polar_gen_opts *o, int token) {
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos[i] == token) return 1;
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop[i] == token) return 1;
    return 0;
}

/* What a generation has produced so far, for the device's accept callback. */
typedef struct {
    polar_session *s;
    const polar_gen_opts *opts;
    int *out;
    polar_gen_stats *stats;
    polar_token_cb cb;
    void *user;
} gen_state;

/* Record token i; 0 when generation ends with it. */
static int gen_accept(int token, void *arg) {
    gen_state *g = arg;
    g->out[g->stats->n_generated++] = token;
    if (g->cb && g->cb(token, g->user)) return 0;
    if (!g->opts->ignore_eos && is_stop(&g->s->m->arch, g->opts, token)) {
        g->stats->stopped_at_eos = 1;
        return 0;
    }
    return g->stats->n_generated < g->opts->max_new;
}

polar_status polar_generate(polar_session *s, const int *prompt, int n_prompt, const polar_gen_opts *opts, int *out,
                            polar_gen_stats *stats, polar_token_cb cb, void *user, polar_error *err) {
    polar_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!s || !opts || (!out && opts->max_new > 0)) return polar_fail(err, POLAR_ERR_ARG, "generate: missing argument");
    if (opts->max_new < 0) return polar_fail(err, POLAR_ERR_ARG, "generate: max_new must not be negative");
    if (n_prompt > s->max_ctx)
        return polar_fail(err, POLAR_ERR_RANGE, "prompt of %d tokens is longer than the context (%d)", n_prompt,
                          s->max_ctx);
    if (opts->max_new > 1 && n_prompt + opts->max_new - 1 > s->max_ctx)
        return polar_fail(err, POLAR_ERR_RANGE, "prompt (%d) + generated tokens (%d) exceed the context (%d)", n_prompt,
                          opts->max_new, s->max_ctx);
    polar_session_reset(s);
    stats->n_prompt = n_prompt;
    double t0 = polar_time_ms();
    polar_status st = polar_prefill(s, prompt, n_prompt, NULL, err);
    if (st != POLAR_OK) return st;
    stats->prefill_ms = polar_time_ms() - t0;
    double td = polar_time_ms();
    gen_state g = {s, opts, out, stats, cb, user};
    int V = s->m->arch.vocab;
    if (opts->temperature > 0) {
        /* Sampling: the host reads every step's logits (one work buffer per call). */
        void *work = malloc(polar_sample_work_bytes(V));
        if (!work) return polar_fail(err, POLAR_ERR_NOMEM, "generate: no memory for the sampler (%d logits)", V);
        polar_rng rng;
        polar_rng_seed(&rng, opts->seed);
        if (opts->max_new > 0 && gen_accept(polar_sample(s->logits, V, opts->temperature, opts->top_p, &rng, work), &g))
            while ((st = polar_decode_step(s, out[stats->n_generated - 1], err)) == POLAR_OK &&
                   gen_accept(polar_sample(s->logits, V, opts->temperature, opts->top_p, &rng, work), &g)) {
            }
        free(work);
        if (st != POLAR_OK) return st;
        stats->decode_ms = polar_time_ms() - td;
        return POLAR_OK;
    }
    /* The first token comes from the prompt's logits; each later one from a
     * decode step fed the one before. */
    if (opts->max_new > 0 && gen_accept(polar_argmax(s->logits, V), &g)) {
        if (s->cuda) { /* the argmax stays on the device between steps */
            int steps = 0;
            st = cuda_greedy(s->cuda, s->program, s->n_program, out[0], s->pos, opts->max_new - 1, gen_accept, &g,
                             &steps, s->logits, err);
            s->pos += steps;
            if (st != POLAR_OK) return st;
        } else {
            while ((st = polar_decode_step(s, out[stats->n_generated - 1], err)) == POLAR_OK &&
                   gen_accept(polar_argmax(s->logits, V), &g)) {
            }
            if (st != POLAR_OK) return st;
        }
    }
    stats->decode_ms = polar_time_ms() - td;
    return POLAR_OK;
}
