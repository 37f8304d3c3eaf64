/* A session runs one program over a growing token sequence: a batch of one
 * opened sequence (batch.c), appended to by prefill and decode steps, its
 * generation run by polar_batch_run (on a GPU the argmax stays on the
 * device between steps). The KV cache is the batch's, keyed by execution
 * position; share_prompt is its prefix cache, keeping only the last
 * prompt. Everything is allocated in polar_session_create. */
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/kernels.h"
#include "batch.h"
#include "error.h"

/* Tokens a CPU session's step takes: bounds the workspaces while letting
 * each weight row serve several tokens. */
#define CPU_CHUNK 32

struct polar_session {
    const polar_model *m;
    polar_batch *b;     /* max_seqs 1 */
    int id;             /* its sequence, opened for max_ctx tokens */
    int *program;       /* [cap_program] */
    int n_program, cap_program, max_ctx;
    float *logits;      /* [vocab] the last row of a prefill's all_logits (polar_logits then) */
    int logits_copied;  /* polar_logits is that copy, not the batch's head row */
};

static polar_status check_program(const polar_model *m, const polar_program *p, polar_error *err) {
    if (!p || p->n < 1 || !p->layers) return polar_fail(err, POLAR_ERR_PROGRAM, "program: empty program");
    for (int i = 0; i < p->n; i++)
        if (p->layers[i] < 0 || p->layers[i] >= m->arch.n_layers)
            return polar_fail(err, POLAR_ERR_PROGRAM, "program: entry %d is layer %d, outside 0..%d", i,
                              p->layers[i], m->arch.n_layers - 1);
    return POLAR_OK;
}

/* The session's batch on one device: a step as long as a GPU's prefill
 * chunk on the GPU (and on a CPU rounding like it, whose passes must be
 * the GPU's), CPU_CHUNK on the CPU; a KV pool for the longest program over
 * max_ctx tokens; with share_prompt, a prefix cache for one prompt at
 * every entry. */
static polar_status make_batch(polar_session *s, const polar_session_opts *o, polar_device device, polar_error *err) {
    const polar_arch *a = &s->m->arch;
    int gpu = device == POLAR_DEVICE_CUDA, kvd = a->n_kv_heads * a->head_dim;
    int chunk = gpu || o->round_like_cuda ? CUDA_PREFILL_CHUNK : CPU_CHUNK;
    size_t block = kv_pool_block_bytes(kvd, gpu || o->kv_bf16);
    int blocks = kv_blocks_for(s->cap_program, s->max_ctx);
    polar_batch_opts bo = {.max_seqs = 1,
                           .max_ctx = s->max_ctx,
                           .max_program_len = s->cap_program,
                           .kv_bytes = (size_t)blocks * block,
                           .step_tokens = s->max_ctx < chunk ? s->max_ctx : chunk,
                           .n_threads = o->n_threads,
                           .device = device,
                           .round_like_cuda = !gpu && o->round_like_cuda,
                           .kv_bf16 = o->kv_bf16,
                           .prefix_cache_bytes = o->share_prompt ? blocks * prefix_cache_item_bytes(block, a->hidden) : 0,
                           .tp = o->tp,
                           .tp_devices = o->tp_devices,
                           .tp_world = o->tp_world,
                           .tp_rank = o->tp_rank,
                           .tp_nccl_id = o->tp_nccl_id};
    return batch_create(s->m, &bo, 1, &s->b, err);
}

polar_status polar_session_create(const polar_model *m, const polar_program *program,
                                  const polar_session_opts *opts, polar_session **out, polar_error *err) {
    *out = NULL;
    if (!m) return polar_fail(err, POLAR_ERR_ARG, "no model given");
    polar_status st = check_program(m, program, err);
    if (st != POLAR_OK) return st;
    const polar_arch *a = &m->arch;
    polar_session_opts o = opts ? *opts : (polar_session_opts){0};
    if (o.max_ctx < 0 || o.max_program_len < 0 || o.n_threads < 0 || o.tp < 0)
        return polar_fail(err, POLAR_ERR_ARG, "session options must not be negative");
    if (o.max_ctx == 0) o.max_ctx = a->max_pos < 4096 ? a->max_pos : 4096;
    if (o.max_program_len < program->n) o.max_program_len = program->n;
    if (o.n_threads == 0) o.n_threads = omp_get_max_threads();
    polar_session *s = calloc(1, sizeof *s);
    if (!s) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the session");
    s->m = m, s->max_ctx = o.max_ctx, s->cap_program = o.max_program_len;
    s->program = malloc((size_t)s->cap_program * sizeof *s->program);
    s->logits = malloc((size_t)a->vocab * sizeof *s->logits);
    if (!s->program || !s->logits) {
        polar_session_free(s);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the session");
    }
    int cuda = o.device == POLAR_DEVICE_CUDA ||
               (o.device == POLAR_DEVICE_AUTO && (o.tp > 0 || polar_cuda_available(NULL, 0)));
    st = make_batch(s, &o, cuda ? POLAR_DEVICE_CUDA : POLAR_DEVICE_CPU, err);
    /* auto: the GPU cannot take this session (head_dim, memory); the CPU can,
     * and polar_session_device says which was chosen. A setting that is
     * wrong (POLAR_ERR_ARG) is said whatever the device, and tensor
     * parallel, which asks for GPUs, never falls back. */
    if (st != POLAR_OK && cuda && o.device == POLAR_DEVICE_AUTO && st != POLAR_ERR_ARG && !o.tp)
        st = make_batch(s, &o, POLAR_DEVICE_CPU, err);
    memcpy(s->program, program->layers, (size_t)program->n * sizeof(int));
    s->n_program = program->n;
    if (st == POLAR_OK) st = polar_batch_open(s->b, program, s->max_ctx, &s->id, err);
    if (st != POLAR_OK) {
        polar_session_free(s);
        return st;
    }
    *out = s;
    return POLAR_OK;
}

void polar_session_free(polar_session *s) {
    if (!s) return;
    polar_batch_free(s->b);
    free(s->program);
    free(s->logits);
    free(s);
}

/* Forget every token: the sequence is opened again (its blocks back in the
 * pool, what the prefix cache holds kept). */
static polar_status reopen(polar_session *s, polar_error *err) {
    polar_program p = {s->n_program, s->program};
    s->logits_copied = 0;
    polar_status st = polar_batch_remove(s->b, s->id, err);
    return st == POLAR_OK ? polar_batch_open(s->b, &p, s->max_ctx, &s->id, err) : st;
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
    return reopen(s, err);
}

void polar_session_reset(polar_session *s) {
    polar_error err;
    (void)reopen(s, &err); /* cannot fail: the same promise as the one just given back */
}

static polar_seq_info info_of(const polar_session *s) {
    polar_seq_info i = {0};
    polar_error err;
    (void)polar_batch_seq(s->b, s->id, &i, &err);
    return i;
}

int polar_session_pos(const polar_session *s) { return info_of(s).n_past; }

int polar_session_prompt_reused(const polar_session *s) { return info_of(s).prompt_resumed; }

int polar_session_threads(const polar_session *s) { return polar_batch_threads(s->b); }

const char *polar_session_device(const polar_session *s) { return polar_batch_device(s->b); }

const char *polar_session_kv_type(const polar_session *s) { return polar_batch_kv_type(s->b); }

const char *polar_session_cuda_launches(const polar_session *s) { return polar_batch_cuda_launches(s->b); }

int polar_session_graph_kernels(const polar_session *s, int *copies) { return polar_batch_graph_kernels(s->b, copies); }

const char *polar_cpu_kernels(void) { return cpu_kernels_active()->name; }

const float *polar_logits(const polar_session *s) { return s->logits_copied ? s->logits : polar_batch_logits(s->b, s->id); }

/* Append tokens (out: per-token outputs), with gen a generation after
 * them, and run them: steps until the sequence is idle again. */
static polar_status append(polar_session *s, const int *tokens, int n, const polar_gen_opts *gen,
                           const polar_batch_outputs *out, polar_batch_token_cb cb, void *user, polar_error *err) {
    if (!s || (!tokens && n)) return polar_fail(err, POLAR_ERR_ARG, "prefill: no session or tokens");
    s->logits_copied = 0;
    polar_status st = polar_batch_append(s->b, s->id, tokens, n, gen, out, err);
    return st == POLAR_OK ? polar_batch_run(s->b, INT_MAX, cb, user, NULL, err) : st;
}

polar_status polar_prefill(polar_session *s, const int *tokens, int n, float *all_logits, polar_error *err) {
    polar_batch_outputs out = {.logits = all_logits};
    polar_status st = append(s, tokens, n, NULL, all_logits ? &out : NULL, NULL, NULL, err);
    if (st == POLAR_OK && all_logits) { /* the logits of the last row, as the rows' slice computed them */
        size_t V = (size_t)s->m->arch.vocab;
        memcpy(s->logits, all_logits + (size_t)(n - 1) * V, V * sizeof *s->logits);
        s->logits_copied = 1;
    }
    return st;
}

polar_status polar_decode_step(polar_session *s, int token, polar_error *err) {
    return polar_prefill(s, &token, 1, NULL, err);
}

polar_status polar_session_device_memory(const polar_session *s, polar_device_memory *out, polar_error *err) {
    if (!s) return polar_fail(err, POLAR_ERR_ARG, "device memory: no session");
    return polar_batch_device_memory(s->b, out, err);
}

polar_status polar_encode(polar_session *s, const int *tokens, int n, float *hidden, polar_error *err) {
    if (!s || !hidden) return polar_fail(err, POLAR_ERR_ARG, "encode: no session or output");
    polar_session_reset(s);
    polar_batch_outputs out = {.hidden = hidden};
    return append(s, tokens, n, NULL, &out, NULL, NULL, err);
}

/* What a generation has produced so far, for the batch's token callback. */
typedef struct {
    int *out;
    int n;
    double t0, prefill_ms;
    polar_token_cb cb;
    void *user;
} gen_state;

static int gen_token(int id, int token, void *arg) {
    (void)id;
    gen_state *g = arg;
    if (g->n == 0) g->prefill_ms = polar_time_ms() - g->t0; /* the first token comes with the prompt */
    g->out[g->n++] = token;
    return g->cb && g->cb(token, g->user);
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
    gen_state g = {.out = out, .t0 = polar_time_ms(), .cb = cb, .user = user};
    polar_status st = append(s, prompt, n_prompt, opts, NULL, gen_token, &g, err);
    double total = polar_time_ms() - g.t0;
    polar_seq_info info = info_of(s);
    stats->n_generated = g.n;
    stats->stopped_at_eos = info.stopped_at_eos;
    stats->prefill_ms = g.n ? g.prefill_ms : total;
    stats->decode_ms = g.n ? total - g.prefill_ms : 0;
    return st;
}
