/* The batch engine's sequences (polar.h says what a batch promises): the
 * batch and its device made, sequences added (a prompt to run and tokens
 * to generate, ended when done) or opened (held: tokens appended to them
 * as the caller goes, idle between appends), read, cancelled and removed.
 * batch_step.c plans and runs the steps. */
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "error.h"

/* Whether a batch of these options runs on the GPU (AUTO: when there is
 * one, or tensor parallel asks for GPUs). */
static int on_gpu(const polar_batch_opts *o) {
    return o->device == POLAR_DEVICE_CUDA ||
           (o->device == POLAR_DEVICE_AUTO && (o->tp > 0 || polar_cuda_available(NULL, 0)));
}

/* Bytes of one pool block: K and V rows, f32 on the CPU unless kv_bf16,
 * bf16 on CUDA. */
static size_t kv_block_bytes(const polar_model *m, const polar_batch_opts *o) {
    return kv_pool_block_bytes(m->arch.n_kv_heads * m->arch.head_dim, on_gpu(o) || o->kv_bf16);
}

size_t polar_batch_kv_bytes(const polar_model *m, const polar_batch_opts *opts, int n_seqs, int program_len,
                            int n_tokens) {
    polar_batch_opts o = opts ? *opts : (polar_batch_opts){0};
    return (size_t)n_seqs * kv_blocks_for(program_len, n_tokens) * kv_block_bytes(m, &o);
}

/* The host side of a batch: its sequences' slots and the step's scratch. */
static int alloc_host(polar_batch *b, const polar_batch_opts *o, int cached) {
    const polar_arch *a = &b->m->arch;
    size_t R = (size_t)o->step_tokens, S = (size_t)o->max_seqs;
    b->seqs = calloc(S, sizeof *b->seqs);
    b->pass_rows = malloc(R * sizeof *b->pass_rows);
    b->pass_pos = malloc(R * sizeof *b->pass_pos);
    b->pass_table = malloc(R * sizeof *b->pass_table);
    b->row_tokens = malloc(R * sizeof *b->row_tokens);
    b->row_pos = malloc(R * sizeof *b->row_pos);
    b->row_from = malloc(R * sizeof *b->row_from);
    b->row_start = calloc(R, sizeof *b->row_start);
    b->found = malloc((size_t)o->max_program_len * sizeof *b->found);
    b->order = malloc(S * sizeof *b->order);
    b->layer_uses = malloc((size_t)a->n_layers * sizeof(int));
    b->layer_most = malloc((size_t)a->n_layers * sizeof(int));
    b->sample_work = malloc(polar_sample_work_bytes(a->vocab));
    int ok = b->seqs && b->pass_rows && b->pass_pos && b->pass_table && b->row_tokens && b->row_pos && b->row_from &&
             b->row_start && b->found && b->order && b->layer_uses && b->layer_most && b->sample_work;
    for (int h = 0; ok && h < 2; h++)
        ok = (b->headed[h] = malloc(S * sizeof *b->headed[h])) && (b->want[h] = calloc(S, 1));
    for (int i = 0; ok && i < o->max_seqs; i++) {
        batch_seq *q = &b->seqs[i];
        q->program = malloc((size_t)o->max_program_len * sizeof *q->program);
        q->tokens = malloc(((size_t)o->max_ctx + 1) * sizeof *q->tokens);
        ok = q->program && q->tokens && kv_seq_init(&q->kv, o->max_program_len, o->max_ctx);
        if (!ok) break;
        size_t mb = (size_t)q->kv.max_blocks;
        q->share = malloc((size_t)o->max_program_len * mb * sizeof *q->share);
        q->block_start = calloc(mb, sizeof *q->block_start);
        ok = q->share && q->block_start;
        if (ok && cached) {
            q->block_hash = malloc(mb * sizeof *q->block_hash);
            q->entry_hash = malloc((size_t)o->max_program_len * sizeof *q->entry_hash);
            ok = q->block_hash && q->entry_hash;
        }
    }
    return ok;
}

polar_status batch_create(const polar_model *m, const polar_batch_opts *opts, int cache_last_prompt,
                          polar_batch **out, polar_error *err) {
    *out = NULL;
    if (!m) return polar_fail(err, POLAR_ERR_ARG, "batch: no model given");
    const polar_arch *a = &m->arch;
    polar_batch_opts o = opts ? *opts : (polar_batch_opts){0};
    if (o.max_seqs < 0 || o.max_ctx < 0 || o.max_program_len < 0 || o.step_tokens < 0 || o.n_threads < 0 || o.tp < 0 ||
        o.tp_world < 0 || o.tp_rank < 0)
        return polar_fail(err, POLAR_ERR_ARG, "batch options must not be negative");
    if (!o.tp && (o.tp_world || o.tp_rank || o.tp_nccl_id))
        return polar_fail(err, POLAR_ERR_ARG, "batch: tp_world, tp_rank and tp_nccl_id go with tp (this process's GPUs)");
    if (o.tp && o.device == POLAR_DEVICE_CPU)
        return polar_fail(err, POLAR_ERR_ARG, "batch: tensor parallel (tp %d) runs on GPUs, not the CPU", o.tp);
    int cuda = on_gpu(&o);
    if (o.max_seqs == 0) o.max_seqs = 16;
    if (o.max_ctx == 0) o.max_ctx = a->max_pos < 2048 ? a->max_pos : 2048;
    if (o.max_program_len == 0) o.max_program_len = 2 * a->n_layers;
    if (o.step_tokens == 0) o.step_tokens = 64;
    if (o.step_tokens < o.max_seqs) o.step_tokens = o.max_seqs;
    if (o.n_threads == 0) o.n_threads = omp_get_max_threads();
    size_t kvd = (size_t)a->n_kv_heads * a->head_dim, block_bytes = kv_block_bytes(m, &o);
    size_t n_blocks = o.kv_bytes ? o.kv_bytes / block_bytes
                                 : (size_t)o.max_seqs * kv_blocks_for(a->n_layers, o.max_ctx);
    if (n_blocks < 1 || n_blocks > (size_t)1 << 30)
        return polar_fail(err, POLAR_ERR_ARG, "batch: a KV pool of %zu bytes holds %zu blocks of %zu bytes",
                          o.kv_bytes, n_blocks, block_bytes);
    size_t cached = o.prefix_cache_bytes / prefix_cache_item_bytes(block_bytes, a->hidden);
    if (cached > (size_t)1 << 28)
        return polar_fail(err, POLAR_ERR_ARG, "batch: a prefix cache of %zu bytes is too large", o.prefix_cache_bytes);
    polar_batch *b = calloc(1, sizeof *b);
    if (!b) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the batch");
    b->m = m;
    b->max_seqs = o.max_seqs, b->max_ctx = o.max_ctx, b->cap_program = o.max_program_len;
    b->step_tokens = o.step_tokens, b->n_threads = o.n_threads;
    b->next_id = 1, b->on_gpu = cuda, b->cache_last_prompt = cache_last_prompt;
    /* the cache's blocks come on top of the sequences' */
    int ok = kv_pool_init(&b->pool, (int)(n_blocks + cached), (int)kvd) &&
             (cuda || kv_pool_add_rows(&b->pool, o.kv_bf16)) && prefix_cache_init(&b->cache, (int)cached) &&
             alloc_host(b, &o, (int)cached);
    if (!ok) {
        polar_batch_free(b);
        return polar_fail(err, POLAR_ERR_NOMEM,
                          "out of memory creating the batch (%d sequences, KV pool of %zu MiB, prefix cache of %zu "
                          "MiB, %d tokens per step)",
                          o.max_seqs, n_blocks * block_bytes >> 20, o.prefix_cache_bytes >> 20, o.step_tokens);
    }
    size_t tables = (size_t)o.max_seqs * o.max_program_len * b->seqs[0].kv.max_blocks;
    size_t start_rows = cached ? (size_t)o.max_seqs * o.max_ctx : 0;
    polar_status st = tables > INT_MAX || start_rows > INT_MAX
                          ? polar_fail(err, POLAR_ERR_ARG, "batch: block tables of %zu ints, %zu start rows", tables,
                                       start_rows)
                          : POLAR_OK;
    batch_device_shape sh = {.rows = o.step_tokens, .n_blocks = (int)(n_blocks + cached), .tables = (int)tables,
                             .cap_program = o.max_program_len, .cache_items = (int)cached,
                             .start_rows = (int)start_rows, .head_rows = o.max_seqs, .n_threads = o.n_threads,
                             .max_ctx = o.max_ctx, .round_like_cuda = o.round_like_cuda, .tp = o.tp,
                             .devices = o.tp_devices, .tp_world = o.tp_world, .tp_rank = o.tp_rank,
                             .nccl_id = o.tp_nccl_id};
    if (st == POLAR_OK)
        st = cuda ? cuda_batch_device(m, &sh, &b->dev, err) : cpu_batch_device(m, &sh, &b->pool, &b->dev, err);
    if (st != POLAR_OK) {
        polar_batch_free(b);
        return st;
    }
    *out = b;
    return POLAR_OK;
}

polar_status polar_batch_create(const polar_model *m, const polar_batch_opts *opts, polar_batch **out,
                                polar_error *err) {
    return batch_create(m, opts, 0, out, err);
}

void polar_batch_free(polar_batch *b) {
    if (!b) return;
    for (int i = 0; b->seqs && i < b->max_seqs; i++) {
        free(b->seqs[i].program);
        free(b->seqs[i].tokens);
        free(b->seqs[i].share);
        free(b->seqs[i].block_hash);
        free(b->seqs[i].entry_hash);
        free(b->seqs[i].block_start);
        kv_seq_free(&b->seqs[i].kv);
    }
    free(b->seqs);
    if (b->dev.ops) b->dev.ops->free(b->dev.state);
    prefix_cache_free(&b->cache, &b->pool);
    kv_pool_free(&b->pool);
    free(b->pass_rows);
    free(b->pass_pos);
    free(b->pass_table);
    free(b->row_tokens);
    free(b->row_pos);
    free(b->row_from);
    free(b->row_start);
    free(b->found);
    free(b->order);
    for (int h = 0; h < 2; h++) free(b->headed[h]), free(b->want[h]);
    free(b->layer_uses);
    free(b->layer_most);
    free(b->sample_work);
    free(b);
}

batch_seq *batch_find(const polar_batch *b, int id) {
    for (int i = 0; id > 0 && i < b->max_seqs; i++)
        if (b->seqs[i].id == id) return &b->seqs[i];
    return NULL;
}

int prompt_blocks(const batch_seq *q) { return (q->n_prompt + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK; }

int block_rows(const batch_seq *q, int j) {
    int left = q->n_prompt - j * CPU_KV_BLOCK;
    return left < CPU_KV_BLOCK ? left : CPU_KV_BLOCK;
}

polar_status batch_refuse_broken(polar_error *err) {
    return polar_fail(err, POLAR_ERR_IO, "batch: a device error in an earlier step left it unusable (free it)");
}

static polar_status check_program(const polar_batch *b, const polar_program *program, const char *what,
                                  polar_error *err) {
    int D = b->m->arch.n_layers;
    if (program->n < 1 || program->n > b->cap_program)
        return polar_fail(err, POLAR_ERR_PROGRAM, "%s: a program of %d entries (the batch holds 1..%d)", what,
                          program->n, b->cap_program);
    for (int i = 0; i < program->n; i++)
        if (program->layers[i] < 0 || program->layers[i] >= D)
            return polar_fail(err, POLAR_ERR_PROGRAM, "%s: program entry %d is layer %d, outside 0..%d", what, i,
                              program->layers[i], D - 1);
    return POLAR_OK;
}

static polar_status check_tokens(const polar_batch *b, const int *tokens, int n, const char *what, polar_error *err) {
    int V = b->m->arch.vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return polar_fail(err, POLAR_ERR_RANGE, "%s: token %d (at index %d) is outside the vocabulary 0..%d", what,
                              tokens[i], i, V - 1);
    return POLAR_OK;
}

static polar_status check_gen(const polar_gen_opts *gen, const char *what, polar_error *err) {
    if (gen->max_new < 0 || gen->n_stop < 0 || gen->n_stop > POLAR_BATCH_MAX_STOP || (gen->n_stop && !gen->stop))
        return polar_fail(err, POLAR_ERR_ARG, "%s: max_new %d, %d stop ids (at most %d)", what, gen->max_new,
                          gen->n_stop, POLAR_BATCH_MAX_STOP);
    return POLAR_OK;
}

/* A free slot, its KV promise made for the program x n_tokens tokens and
 * the program copied in; POLAR_ERR_FULL when there is none or the pool
 * cannot promise it. */
static polar_status admit(polar_batch *b, const polar_program *program, int n_tokens, const char *what, batch_seq **out,
                          polar_error *err) {
    int need = kv_blocks_for(program->n, n_tokens);
    if (need > b->pool.n_blocks)
        return polar_fail(err, POLAR_ERR_RANGE, "%s: %d entries x %d tokens need %d KV blocks, the pool has %d", what,
                          program->n, n_tokens, need, b->pool.n_blocks);
    batch_seq *q = NULL;
    for (int i = 0; !q && i < b->max_seqs; i++)
        if (!b->seqs[i].id) q = &b->seqs[i];
    if (!q) return polar_fail(err, POLAR_ERR_FULL, "%s: all %d sequence slots are held", what, b->max_seqs);
    /* the cache gives back blocks no sequence maps, but only when that admits this one */
    int admitted = kv_seq_admit(&b->pool, &q->kv, program->n, n_tokens);
    if (!admitted && b->pool.n_free - b->pool.promised + prefix_cache_unmapped(&b->cache, &b->pool) >= need)
        while (!(admitted = kv_seq_admit(&b->pool, &q->kv, program->n, n_tokens)) &&
               prefix_cache_evict_unmapped(&b->cache, &b->pool)) {
        }
    if (!admitted)
        return polar_fail(err, POLAR_ERR_FULL,
                          "%s: the KV pool cannot promise %d blocks (%d of %d free, %d promised to others)", what, need,
                          b->pool.n_free - b->pool.promised, b->pool.n_blocks, b->pool.promised);
    memcpy(q->program, program->layers, (size_t)program->n * sizeof *q->program);
    q->n_program = program->n, q->cap_tokens = n_tokens;
    q->n_tokens = q->n_run = q->n_prompt = 0;
    q->gen_start = 0, q->n_generated = 0, q->stopped_at_eos = 0, q->generating = 0;
    q->out_logits = q->out_hidden = NULL;
    q->head_row = q->step_row[0] = q->step_row[1] = -1;
    q->leader = 0, q->shared = 0, q->looked_up = 0, q->resumed = 0, q->skipped = 0, q->dev_mapped = 0;
    memset(q->share, 0xff, (size_t)q->kv.cap_program * q->kv.max_blocks * sizeof *q->share);
    memset(q->block_start, 0, (size_t)q->kv.max_blocks * sizeof *q->block_start);
    if (b->cache.cap) {
        uint64_t h = 0;
        for (int k = 0; k < q->n_program; k++) q->entry_hash[k] = h = prefix_hash_entry(h, q->program[k]);
    }
    *out = q;
    return POLAR_OK;
}

/* Tokens after q's own, to run from the next step, then (gen, max_new >
 * 0) tokens to generate; out: rows of outputs wanted for them. The first
 * append from position 0 is q's prompt. */
static void start_append(polar_batch *b, batch_seq *q, const int *tokens, int n, const polar_gen_opts *gen,
                         const polar_batch_outputs *out) {
    memcpy(q->tokens + q->n_tokens, tokens, (size_t)n * sizeof *tokens);
    if (q->n_tokens == 0) {
        q->n_prompt = n;
        /* rows whose outputs are wanted are computed, not found in the cache */
        q->looked_up = out && (out->logits || out->hidden);
        if (b->cache.cap) {
            uint64_t h = 0;
            for (int j = 0; j * CPU_KV_BLOCK < n; j++) /* the last may be partial: its length is hashed too */
                q->block_hash[j] = h = prefix_hash_tokens(h, tokens + j * CPU_KV_BLOCK, block_rows(q, j));
        }
    }
    q->out_from = q->n_tokens;
    q->n_tokens += n;
    q->out_logits = out ? out->logits : NULL, q->out_hidden = out ? out->hidden : NULL;
    q->want_last = !(out && out->hidden && !out->logits);
    q->generating = gen && gen->max_new > 0;
    q->gen_start = q->n_tokens, q->n_generated = 0, q->stopped_at_eos = 0;
    if (gen) {
        q->gen = *gen;
        if (gen->n_stop) memcpy(q->stop, gen->stop, (size_t)gen->n_stop * sizeof *q->stop);
        q->gen.stop = q->stop;
        polar_rng_seed(&q->rng, gen->seed);
    }
    q->state = POLAR_SEQ_PREFILL;
}

polar_status polar_batch_add(polar_batch *b, const polar_program *program, const int *prompt, int n_prompt,
                             const polar_gen_opts *gen, int *id, polar_error *err) {
    if (!b || !program || !program->layers || !prompt || !gen || !id)
        return polar_fail(err, POLAR_ERR_ARG, "batch add: missing argument");
    if (b->broken) return batch_refuse_broken(err);
    polar_status st = check_program(b, program, "batch add", err);
    if (st != POLAR_OK) return st;
    if (n_prompt < 1) return polar_fail(err, POLAR_ERR_ARG, "batch add: no prompt tokens");
    if ((st = check_tokens(b, prompt, n_prompt, "batch add", err)) != POLAR_OK ||
        (st = check_gen(gen, "batch add", err)) != POLAR_OK)
        return st;
    /* the last generated token is never run, so it needs no cache row */
    int n_tokens = n_prompt + (gen->max_new > 1 ? gen->max_new - 1 : 0);
    if (n_tokens > b->max_ctx)
        return polar_fail(err, POLAR_ERR_RANGE, "batch add: prompt (%d) + generated tokens (%d) exceed the context (%d)",
                          n_prompt, gen->max_new, b->max_ctx);
    batch_seq *q;
    if ((st = admit(b, program, n_tokens, "batch add", &q, err)) != POLAR_OK) return st;
    q->held = 0;
    start_append(b, q, prompt, n_prompt, gen, NULL);
    for (int i = 0; !b->cache.cap && i < b->max_seqs; i++) { /* with a cache: see runs_same_start */
        const batch_seq *o = &b->seqs[i];
        if (o == q || !o->id || o->state != POLAR_SEQ_PREFILL || o->n_run || o->leader || o->n_prompt != n_prompt ||
            o->n_tokens != n_prompt || memcmp(o->tokens, prompt, (size_t)n_prompt * sizeof *prompt))
            continue;
        int k = 0;
        while (k < o->n_program && k < q->n_program && o->program[k] == q->program[k]) k++;
        if (k > q->shared) q->leader = o->id, q->shared = k;
    }
    q->id = *id = b->next_id++;
    if (gen->max_new == 0) { /* nothing to generate: ends at once */
        q->state = POLAR_SEQ_ENDED;
        kv_seq_release(&b->pool, &q->kv);
    }
    return POLAR_OK;
}

polar_status polar_batch_open(polar_batch *b, const polar_program *program, int n_tokens, int *id, polar_error *err) {
    if (!b || !program || !program->layers || !id) return polar_fail(err, POLAR_ERR_ARG, "batch open: missing argument");
    if (b->broken) return batch_refuse_broken(err);
    polar_status st = check_program(b, program, "batch open", err);
    if (st != POLAR_OK) return st;
    if (n_tokens < 1 || n_tokens > b->max_ctx)
        return polar_fail(err, POLAR_ERR_RANGE, "batch open: %d tokens (the context holds 1..%d)", n_tokens, b->max_ctx);
    batch_seq *q;
    if ((st = admit(b, program, n_tokens, "batch open", &q, err)) != POLAR_OK) return st;
    q->held = 1, q->state = POLAR_SEQ_IDLE;
    q->id = *id = b->next_id++;
    return POLAR_OK;
}

polar_status polar_batch_append(polar_batch *b, int id, const int *tokens, int n, const polar_gen_opts *gen,
                                const polar_batch_outputs *out, polar_error *err) {
    batch_seq *q = b ? batch_find(b, id) : NULL;
    if (!q || (!tokens && n)) return polar_fail(err, POLAR_ERR_ARG, "batch append: no sequence %d or no tokens", id);
    if (b->broken) return batch_refuse_broken(err);
    if (!q->held || q->state != POLAR_SEQ_IDLE)
        return polar_fail(err, POLAR_ERR_ARG, "batch append: sequence %d is %s", id,
                          !q->held ? "not one opened for appends" : q->state == POLAR_SEQ_ENDED ? "ended" : "still running");
    if (n < 1) return polar_fail(err, POLAR_ERR_ARG, "batch append: no tokens given");
    polar_status st = check_tokens(b, tokens, n, "batch append", err);
    if (st == POLAR_OK && gen) st = check_gen(gen, "batch append", err);
    if (st != POLAR_OK) return st;
    int extra = gen && gen->max_new > 1 ? gen->max_new - 1 : 0;
    if (n + extra > q->cap_tokens - q->n_run)
        return polar_fail(err, POLAR_ERR_RANGE, "%d tokens%s do not fit: the context holds %d and %d are used", n + extra,
                          extra ? " (with those generated)" : "", q->cap_tokens, q->n_run);
    start_append(b, q, tokens, n, gen, out);
    return POLAR_OK;
}

void batch_seq_end(polar_batch *b, batch_seq *q) {
    q->state = POLAR_SEQ_ENDED;
    q->generating = 0;
    kv_seq_release(&b->pool, &q->kv);
}

void batch_seq_done(polar_batch *b, batch_seq *q) {
    if (!q->held) {
        batch_seq_end(b, q);
        return;
    }
    if (q->n_generated) /* the last generated token is not in the cache (a step ahead may have run it) */
        q->n_run = q->n_tokens - 1, q->n_tokens = q->n_run;
    q->state = POLAR_SEQ_IDLE;
    q->generating = 0;
    q->out_logits = q->out_hidden = NULL;
}

polar_status polar_batch_cancel(polar_batch *b, int id, polar_error *err) {
    batch_seq *q = b ? batch_find(b, id) : NULL;
    if (!q) return polar_fail(err, POLAR_ERR_ARG, "batch: no sequence %d", id);
    if (q->state != POLAR_SEQ_ENDED) batch_seq_end(b, q);
    return POLAR_OK;
}

polar_status polar_batch_remove(polar_batch *b, int id, polar_error *err) {
    polar_status st = polar_batch_cancel(b, id, err);
    if (st == POLAR_OK) batch_find(b, id)->id = 0;
    return st;
}

polar_status polar_batch_seq(const polar_batch *b, int id, polar_seq_info *info, polar_error *err) {
    const batch_seq *q = b ? batch_find(b, id) : NULL;
    if (!q || !info) return polar_fail(err, POLAR_ERR_ARG, "batch: no sequence %d", id);
    *info = (polar_seq_info){.state = q->state, .n_prompt = q->n_prompt, .n_generated = q->n_generated,
                             .stopped_at_eos = q->stopped_at_eos, .prompt_skipped = q->skipped,
                             .tokens = q->tokens + q->gen_start, .n_past = q->n_run, .prompt_resumed = q->resumed};
    return POLAR_OK;
}

const float *polar_batch_logits(const polar_batch *b, int id) {
    batch_seq *q = b ? batch_find(b, id) : NULL;
    if (!q || q->head_row < 0) return NULL;
    if (!q->logits_here) { /* the row is still on the device */
        polar_error err;
        if (b->dev.ops->copy_logits(b->dev.state, q->head_half, q->head_row, &err) != POLAR_OK) return NULL;
        q->logits_here = 1;
    }
    return b->dev.ops->host_logits(b->dev.state, q->head_half) + (size_t)q->head_row * b->m->arch.vocab;
}

int polar_batch_running(const polar_batch *b) {
    int n = 0;
    for (int i = 0; i < b->max_seqs; i++)
        n += b->seqs[i].id && (b->seqs[i].state == POLAR_SEQ_PREFILL || b->seqs[i].state == POLAR_SEQ_DECODE);
    return n;
}

void polar_batch_kv(const polar_batch *b, polar_batch_kv_info *out) {
    *out = (polar_batch_kv_info){.blocks = b->pool.n_blocks, .used = b->pool.n_blocks - b->pool.n_free,
                                 .promised = b->pool.promised, .cached = b->cache.n_items};
}

int polar_batch_threads(const polar_batch *b) { return b->n_threads; }

const char *polar_batch_kv_type(const polar_batch *b) { return kv_pool_row_type(&b->pool); }

const char *polar_batch_device(const polar_batch *b) { return b->on_gpu ? "cuda" : "cpu"; }

const char *polar_batch_cuda_launches(const polar_batch *b) { return b->dev.ops->launches(b->dev.state); }

polar_status polar_batch_device_memory(const polar_batch *b, polar_device_memory *out, polar_error *err) {
    if (!b || !out) return polar_fail(err, POLAR_ERR_ARG, "device memory: no batch or output");
    if (!b->dev.ops->memory(b->dev.state, out))
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device memory: the batch runs on the CPU");
    return POLAR_OK;
}

int polar_batch_graph_kernels(const polar_batch *b, int *copies) {
    return b->dev.ops->graph_kernels(b->dev.state, copies);
}
