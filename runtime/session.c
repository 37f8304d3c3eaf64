/* A session runs one program over a growing token sequence, on the CPU or
 * (cuda_backend.c) a GPU.
 *
 * The KV cache is keyed by execution position: entry k of the program owns
 * slot k, whatever layer it runs. A layer repeated in the program therefore
 * gets one slot per occurrence, a skipped layer none: exactly an unrolled
 * model with tied weights, so decoding with the cache equals a full
 * recompute. The cache is kv_pool.h's, as a batch's, its blocks all mapped
 * at creation (their rows on the GPU when the session runs there).
 * Everything is allocated in polar_session_create. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/kernels.h"
#include "../kernels/cpu/ops.h"
#include "../loader/config.h"
#include "backend.h"
#include "cpu_layer.h"
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
    kv_pool pool;       /* the KV cache: cap_program x max_ctx tokens, all mapped at creation */
    kv_seq kv;          /* its tables */
    cpu_work work;      /* [PREFILL_CHUNK] token workspaces */
    float *cos, *sin;   /* [CHUNK, head_dim/2] rope tables of the chunk's positions */
    cpu_token_at *at;   /* [CHUNK] where the chunk's tokens are */
    float *logits;      /* [vocab] of the last token */
    int has_logits;
    void *sample_work;  /* polar_sample_work_bytes(vocab): polar_generate's sampler */
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
    size_t kv = (size_t)a->n_kv_heads * a->head_dim, C = PREFILL_CHUNK;
    char why[256];
    int use_cuda = o.device == POLAR_DEVICE_CUDA || (o.device == POLAR_DEVICE_AUTO && polar_cuda_available(why, sizeof why));
    s->cuda_chunk = s->max_ctx < CUDA_PREFILL_CHUNK ? s->max_ctx : CUDA_PREFILL_CHUNK;
    /* The KV cache: every block mapped now, in the pool's rows on the CPU,
     * on a GPU in its device pool under the same tables. */
    int n_blocks = kv_blocks_for(s->cap_program, s->max_ctx);
    int kv_ok = kv_pool_init(&s->pool, n_blocks, (int)kv) && kv_seq_init(&s->kv, s->cap_program, s->max_ctx) &&
                kv_seq_admit(&s->pool, &s->kv, s->cap_program, s->max_ctx);
    if (kv_ok) kv_seq_grow(&s->pool, &s->kv, s->max_ctx, NULL);
    if (kv_ok && use_cuda) {
        cuda_state_shape shape = {.chunk = s->cuda_chunk,
                                  .cap_program = s->cap_program,
                                  .n_blocks = n_blocks,
                                  .n_tables = s->cap_program * s->kv.max_blocks,
                                  .tables = s->kv.blocks,
                                  .max_blocks = s->kv.max_blocks};
        st = cuda_state_create(m, &shape, &s->cuda, err);
        if (st != POLAR_OK && (o.device == POLAR_DEVICE_CUDA || st == POLAR_ERR_ARG)) {
            polar_session_free(s);
            return st;
        }
        /* auto: the GPU cannot take this session (head_dim, memory); the CPU
         * can, and polar_session_device says which was chosen. A setting
         * that is wrong (POLAR_ERR_ARG) is said whatever the device. */
    }
    s->chunk = s->cuda ? s->cuda_chunk : PREFILL_CHUNK;
    s->round_like_cuda = !s->cuda && o.round_like_cuda;
    if (kv_ok && !s->cuda) kv_ok = kv_pool_add_rows(&s->pool, o.kv_bf16);
    s->program = malloc((size_t)s->cap_program * sizeof *s->program);
    int work_ok = cpu_work_init(&s->work, m, PREFILL_CHUNK, s->max_ctx, s->n_threads);
    s->cos = malloc(C * (size_t)(a->head_dim / 2) * sizeof(float));
    s->sin = malloc(C * (size_t)(a->head_dim / 2) * sizeof(float));
    s->at = malloc(C * sizeof *s->at);
    s->logits = malloc((size_t)a->vocab * sizeof(float));
    s->sample_work = malloc(polar_sample_work_bytes(a->vocab));
    int share = o.share_prompt && !s->cuda;
    if (share) {
        s->prompt_x = malloc((size_t)(s->cap_program + 1) * s->max_ctx * a->hidden * sizeof(float));
        s->prompt_tokens = malloc((size_t)s->max_ctx * sizeof(int));
        s->prompt_program = malloc((size_t)s->cap_program * sizeof(int));
    }
    if ((share && (!s->prompt_x || !s->prompt_tokens || !s->prompt_program)) || !kv_ok || !work_ok || !s->program ||
        !s->cos || !s->sin || !s->at || !s->logits || !s->sample_work) {
        int on_gpu = s->cuda != NULL;
        polar_session_free(s);
        if (on_gpu) /* the pool is on the device (cuda_state_create checked it): a host buffer failed */
            return polar_fail(err, POLAR_ERR_NOMEM, "out of host memory creating the session (%d positions x %d tokens)",
                              o.max_program_len, o.max_ctx);
        return polar_fail(err, POLAR_ERR_NOMEM,
                          "out of memory creating the session (KV cache of %zu MiB for %d positions x %d tokens)",
                          (size_t)n_blocks * kv_pool_block_bytes((int)kv, o.kv_bf16) >> 20,
                          o.max_program_len, o.max_ctx);
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

const char *polar_session_kv_type(const polar_session *s) { return kv_pool_row_type(&s->pool); }

const char *polar_session_cuda_launches(const polar_session *s) { return cuda_state_launches(s->cuda); }

const char *polar_cpu_kernels(void) { return cpu_kernels_active()->name; }

const float *polar_logits(const polar_session *s) { return s->has_logits ? s->logits : NULL; }

void polar_session_free(polar_session *s) {
    if (!s) return;
    cuda_state_free(s->cuda);
    free(s->program);
    kv_seq_free(&s->kv);
    kv_pool_free(&s->pool);
    cpu_work_free(&s->work);
    free(s->cos);
    free(s->sin);
    free(s->at);
    free(s->logits);
    free(s->sample_work);
    free(s->prompt_x);
    free(s->prompt_tokens);
    free(s->prompt_program);
    free(s);
}

/* T <= PREFILL_CHUNK tokens through the whole program; logits of all of them
 * into all_logits (T x vocab) when given, of the last into s->logits; their
 * final-normed hidden states into hidden (T x hidden) when given. round_in:
 * see layer_forward. */
static void forward_chunk(polar_session *s, const int *tokens, int T, float *all_logits, float *hidden, int round_in,
                          int start) {
    const polar_model *m = s->m;
    const polar_arch *a = &m->arch;
    cpu_work *w = &s->work;
    int half = a->head_dim / 2;
    size_t rows = (size_t)T * a->hidden;
    for (int t = 0; t < T; t++) {
        if (!start) cpu_embed_q(w->x + (size_t)t * a->hidden, m->embed, m->t_embed, tokens[t], a->hidden);
        float *cs = s->cos + (size_t)t * half, *sn = s->sin + (size_t)t * half;
        cpu_rope_angles(cs, sn, m->rope_inv_freq, m->rope_scale, half, s->pos + t);
        s->at[t] = (cpu_token_at){.pos = s->pos + t, .cos = cs, .sin = sn};
    }
    /* the residual stream before entry k of this chunk's tokens */
#define PROMPT_X(k) (s->prompt_x + ((size_t)(k) * s->max_ctx + (size_t)s->pos) * a->hidden)
    if (start) memcpy(w->x, PROMPT_X(start), rows * sizeof(float));
    for (int k = start; k < s->n_program; k++) {
        if (s->recording) memcpy(PROMPT_X(k), w->x, rows * sizeof(float));
        for (int t = 0; t < T; t++) s->at[t].blocks = kv_seq_table(&s->kv, k);
        cpu_layer_forward(m, w, &m->layers[s->program[k]], &s->pool, s->at, T, round_in, s->round_like_cuda);
    }
    if (s->recording) memcpy(PROMPT_X(s->n_program), w->x, rows * sizeof(float));
#undef PROMPT_X
    int first = all_logits || hidden ? 0 : T - 1;
    for (int t = first; t < T; t++) cpu_final_norm(m, w, t);
    if (hidden) memcpy(hidden, w->xn, (size_t)T * a->hidden * sizeof *hidden);
    /* A CUDA forward computes the head of all rows in slices of 32 (this
     * chunk, when rounding), through a GEMM on bf16 inputs beyond 8 rows. */
    if (s->round_like_cuda && first == 0 && T > CUDA_DECODE_TOKENS) cpu_round_bf16(w->xn, (size_t)T * a->hidden);
    if (all_logits)
        cpu_matmul_q(all_logits, w->xn, m->lm_head, m->t_lm_head, NULL, T, a->vocab, a->hidden, 0, s->n_threads, w->xq);
    cpu_matmul_q(s->logits, w->xn + (size_t)(T - 1) * a->hidden, m->lm_head, m->t_lm_head, NULL, 1, a->vocab,
                 a->hidden, 0, s->n_threads, w->xq);
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
    /* A chunk is scanned for its index only when its largest value, taken
     * lane-wise in a loop the compiler vectorizes, beats the best so far:
     * a greedy step over a large vocabulary costs a few us, not ~20. */
    enum { LANES = 16, CHUNK = 256 };
    int best = 0, i = 0;
    float best_v = -INFINITY;
    for (; i + CHUNK <= n; i += CHUNK) {
        float lane_max[LANES], chunk_max = -INFINITY;
        for (int l = 0; l < LANES; l++) lane_max[l] = -INFINITY;
        for (int j = i; j < i + CHUNK; j += LANES)
            for (int l = 0; l < LANES; l++) lane_max[l] = logits[j + l] > lane_max[l] ? logits[j + l] : lane_max[l];
        for (int l = 0; l < LANES; l++) chunk_max = lane_max[l] > chunk_max ? lane_max[l] : chunk_max;
        if (!(chunk_max > best_v)) continue;
        for (int j = i; j < i + CHUNK; j++)
            if (logits[j] > best_v) best_v = logits[j], best = j;
    }
    for (; i < n; i++)
        if (logits[i] > best_v) best_v = logits[i], best = i;
    return best;
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
    if (!g->opts->ignore_eos && gen_stops_at(&g->s->m->arch, g->opts, token)) {
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
        /* Sampling: the host reads every step's logits. */
        void *work = s->sample_work;
        polar_rng rng;
        polar_rng_seed(&rng, opts->seed);
        if (opts->max_new > 0 && gen_accept(polar_sample(s->logits, V, opts, &rng, work), &g))
            while ((st = polar_decode_step(s, out[stats->n_generated - 1], err)) == POLAR_OK &&
                   gen_accept(polar_sample(s->logits, V, opts, &rng, work), &g)) {
            }
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
