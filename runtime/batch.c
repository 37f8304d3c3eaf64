/* Many sequences, each with its own program, advanced one token per step
 * (polar.h says what a batch promises). This file plans the steps; they
 * run on the batch's device, the CPU or a GPU, through the calls of
 * batch_device.h (cpu_batch.c, cuda_batch.c), so the plan is written once.
 *
 * A step lays its tokens out as rows: one per decoding sequence, then
 * chunks of prompts within the step's token budget. Each sequence walks its
 * own program with a cursor; while some cursor is not at its end, the
 * lowest layer among the sequences' next entries runs once over the rows of
 * every sequence whose next entry it is, each row attending over its own
 * sequence's KV table of that execution position. Then the final norm and
 * the head run once over the last row of every sequence that needs logits.
 * On the CPU a matmul output is summed in the same order whatever the rows
 * beside it (kernels.h), so each sequence gets the logits of a session
 * running it alone. */
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops.h"
#include "batch_device.h"
#include "error.h"
#include "model.h"
#include "prefix_cache.h"

typedef struct {
    int id;                /* 0: a free slot */
    polar_seq_state state;
    int *program;          /* [cap_program] */
    int n_program;
    int *tokens;           /* [max_ctx + 1] the prompt, then the generated ids (the last is never run) */
    int n_prompt, n_run;   /* n_run: tokens whose K/V are in the cache */
    int n_generated;
    int stopped_at_eos;
    int head_row;          /* its row of the last step's head (-1: it chose no token there): its logits */
    int logits_here;       /* that row is in head_out (sampled rows come with the step, others when asked for) */
    polar_gen_opts gen;
    int stop[POLAR_BATCH_MAX_STOP];
    polar_rng rng;
    kv_seq kv;
    int dev_mapped;        /* blocks per entry of its tables mirrored on the device */
    /* prompt sharing: added while an older sequence with the same prompt
     * had not started it, this one follows that leader through its first
     * `shared` program entries (the same in both) for the prompt: it
     * computes nothing there and its K/V are the leader's */
    int leader;            /* the leader's id, 0: none (or no longer aligned with it) */
    int shared;            /* program entries in common with the leader */
    int *share;            /* [cap_program, max_blocks] blocks to map rather than take fresh (-1: fresh) */
    /* the prefix cache (batches that have one): at its first step a prompt
     * looks up each of its full blocks (all but the one holding its last
     * token) at entries 0, 1, ...; a block found at entries 0..s-1 maps
     * those K/V blocks and starts at entry s from the cached residual */
    uint64_t *block_hash;  /* [max_blocks] the prompt's tokens up to each block's end */
    uint64_t *entry_hash;  /* [cap_program] the program's entries 0..k */
    int *block_start;      /* [max_blocks] the first entry each prompt block computes (its rows start from
                            * the device's start rows) */
    int looked_up;
    long skipped;          /* (prompt token, entry) pairs it did not compute: followed or cached */
    /* this step */
    int row0, n_rows;      /* its rows of the step */
    int cursor;            /* its next program entry (rows join the walk at their block's start) */
    int following;         /* its rows are the leader's until its cursor reaches `shared` */
    int in_pass;           /* it took part in the walk's current pass */
    int waiting;           /* its prompt waits for another's with the same start to be cached */
} batch_seq;

struct polar_batch {
    const polar_model *m;
    int max_seqs, max_ctx, cap_program, step_tokens, n_threads;
    int next_id;
    batch_seq *seqs;       /* [max_seqs] */
    kv_pool pool;          /* the blocks; their rows on the CPU, or on the device */
    batch_device dev;      /* where the steps run: the CPU or the GPU (batch_device.h) */
    int broken;            /* a device step failed half-way: every later call refuses */
    prefix_cache cache;    /* cap 0: none */
    int *pass_rows;        /* [step_tokens] one layer pass's rows (then the head's rows) */
    int *pass_pos, *pass_table; /* [step_tokens] their positions and table offsets (table_offset) */
    int *row_tokens, *row_pos; /* [step_tokens] the rows' tokens and positions */
    int *found;            /* [max_program_len] a prompt block's pool blocks found in the prefix cache */
    int *row_start;        /* [step_tokens] the program entry each row starts at */
    batch_seq **order;     /* [max_seqs] the step's sequences, oldest first */
    float *head_out;       /* [max_seqs, vocab] the step's logits, in the order of its head rows (the device's) */
    unsigned char *want;   /* [max_seqs] head rows whose logits the host needs now (sampled) */
    int *ids;              /* [max_seqs] the other head rows' argmax, chosen by the device */
    int *layer_uses;       /* [n_layers] one program's uses of each layer */
    int *layer_most;       /* [n_layers] the most uses of each layer by one program this step */
    void *sample_work;     /* polar_sample_work_bytes(vocab) */
};

/* Whether a batch for this device runs on the GPU (AUTO: when there is one). */
static int on_gpu(polar_device device) {
    return device == POLAR_DEVICE_CUDA || (device == POLAR_DEVICE_AUTO && polar_cuda_available(NULL, 0));
}

/* Bytes of one pool block: K and V rows, f32 on the CPU unless kv_bf16,
 * bf16 on CUDA. */
static size_t kv_block_bytes(const polar_model *m, const polar_batch_opts *o) {
    return kv_pool_block_bytes(m->arch.n_kv_heads * m->arch.head_dim, on_gpu(o->device) || o->kv_bf16);
}

size_t polar_batch_kv_bytes(const polar_model *m, const polar_batch_opts *opts, int n_seqs, int program_len,
                            int n_tokens) {
    polar_batch_opts o = opts ? *opts : (polar_batch_opts){0};
    return (size_t)n_seqs * kv_blocks_for(program_len, n_tokens) * kv_block_bytes(m, &o);
}

polar_status polar_batch_create(const polar_model *m, const polar_batch_opts *opts, polar_batch **out,
                                polar_error *err) {
    *out = NULL;
    if (!m) return polar_fail(err, POLAR_ERR_ARG, "batch: no model given");
    const polar_arch *a = &m->arch;
    polar_batch_opts o = opts ? *opts : (polar_batch_opts){0};
    if (o.max_seqs < 0 || o.max_ctx < 0 || o.max_program_len < 0 || o.step_tokens < 0 || o.n_threads < 0)
        return polar_fail(err, POLAR_ERR_ARG, "batch options must not be negative");
    int cuda = on_gpu(o.device);
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
    b->next_id = 1;
    size_t R = (size_t)o.step_tokens;
    /* the cache's blocks come on top of the sequences' */
    int ok = kv_pool_init(&b->pool, (int)(n_blocks + cached), (int)kvd) &&
             (cuda || kv_pool_add_rows(&b->pool, o.kv_bf16)) && prefix_cache_init(&b->cache, (int)cached);
    b->seqs = calloc((size_t)o.max_seqs, sizeof *b->seqs);
    b->pass_rows = malloc(R * sizeof *b->pass_rows);
    b->pass_pos = malloc(R * sizeof *b->pass_pos);
    b->pass_table = malloc(R * sizeof *b->pass_table);
    b->row_tokens = malloc(R * sizeof *b->row_tokens);
    b->row_pos = malloc(R * sizeof *b->row_pos);
    b->row_start = calloc(R, sizeof *b->row_start);
    b->found = malloc((size_t)o.max_program_len * sizeof *b->found);
    b->order = malloc((size_t)o.max_seqs * sizeof *b->order);
    b->want = malloc((size_t)o.max_seqs);
    b->ids = malloc((size_t)o.max_seqs * sizeof *b->ids);
    b->layer_uses = malloc((size_t)a->n_layers * sizeof(int));
    b->layer_most = malloc((size_t)a->n_layers * sizeof(int));
    b->sample_work = malloc(polar_sample_work_bytes(a->vocab));
    ok = ok && b->seqs && b->pass_rows && b->pass_pos && b->pass_table && b->row_tokens && b->row_pos &&
         b->row_start && b->found && b->order && b->want && b->ids && b->layer_uses && b->layer_most && b->sample_work;
    for (int i = 0; ok && i < o.max_seqs; i++) {
        batch_seq *q = &b->seqs[i];
        q->program = malloc((size_t)o.max_program_len * sizeof *q->program);
        q->tokens = malloc(((size_t)o.max_ctx + 1) * sizeof *q->tokens);
        ok = q->program && q->tokens && kv_seq_init(&q->kv, o.max_program_len, o.max_ctx);
        if (!ok) break;
        size_t mb = (size_t)q->kv.max_blocks;
        q->share = malloc((size_t)o.max_program_len * mb * sizeof *q->share);
        q->block_start = calloc(mb, sizeof *q->block_start);
        ok = q->share && q->block_start;
        if (ok && cached) {
            q->block_hash = malloc(mb * sizeof *q->block_hash);
            q->entry_hash = malloc((size_t)o.max_program_len * sizeof *q->entry_hash);
            ok = q->block_hash && q->entry_hash;
        }
    }
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
    if (st == POLAR_OK && cuda) {
        cuda_batch_shape sh = {.rows = o.step_tokens, .n_blocks = (int)(n_blocks + cached), .tables = (int)tables,
                               .cap_program = o.max_program_len, .cache_items = (int)cached, .start_rows = (int)start_rows,
                               .head_rows = o.max_seqs};
        cuda_batch *d = NULL;
        if ((st = cuda_batch_create(m, &sh, &d, err)) == POLAR_OK) b->dev = (batch_device){&cuda_batch_ops, d};
    } else if (st == POLAR_OK) {
        cpu_batch_shape sh = {.rows = o.step_tokens, .tables = (int)tables, .cache_items = (int)cached,
                              .start_rows = (int)start_rows, .head_rows = o.max_seqs, .n_threads = o.n_threads,
                              .max_ctx = o.max_ctx, .round_like_cuda = o.round_like_cuda};
        void *d = cpu_batch_create(m, &sh, &b->pool);
        st = d ? POLAR_OK
               : polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the batch's CPU workspaces (%d tokens per step)",
                            o.step_tokens);
        if (d) b->dev = (batch_device){&cpu_batch_ops, d};
    }
    if (st != POLAR_OK) {
        polar_batch_free(b);
        return st;
    }
    b->head_out = b->dev.ops->host_logits(b->dev.state);
    *out = b;
    return POLAR_OK;
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
    free(b->row_start);
    free(b->found);
    free(b->order);
    free(b->want);
    free(b->ids);
    free(b->layer_uses);
    free(b->layer_most);
    free(b->sample_work);
    free(b);
}

static batch_seq *find(const polar_batch *b, int id) {
    for (int i = 0; id > 0 && i < b->max_seqs; i++)
        if (b->seqs[i].id == id) return &b->seqs[i];
    return NULL;
}

/* Blocks of q's prompt (the last may be partial) and the rows of block j. */
static int prompt_blocks(const batch_seq *q) { return (q->n_prompt + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK; }
static int block_rows(const batch_seq *q, int j) {
    int left = q->n_prompt - j * CPU_KV_BLOCK;
    return left < CPU_KV_BLOCK ? left : CPU_KV_BLOCK;
}

static polar_status refuse_broken(polar_error *err) {
    return polar_fail(err, POLAR_ERR_IO, "batch: a device error in an earlier step left it unusable (free it)");
}

polar_status polar_batch_add(polar_batch *b, const polar_program *program, const int *prompt, int n_prompt,
                             const polar_gen_opts *gen, int *id, polar_error *err) {
    if (!b || !program || !program->layers || !prompt || !gen || !id)
        return polar_fail(err, POLAR_ERR_ARG, "batch add: missing argument");
    if (b->broken) return refuse_broken(err);
    const polar_arch *a = &b->m->arch;
    if (program->n < 1 || program->n > b->cap_program)
        return polar_fail(err, POLAR_ERR_PROGRAM, "batch add: a program of %d entries (the batch holds 1..%d)",
                          program->n, b->cap_program);
    for (int i = 0; i < program->n; i++)
        if (program->layers[i] < 0 || program->layers[i] >= a->n_layers)
            return polar_fail(err, POLAR_ERR_PROGRAM, "batch add: program entry %d is layer %d, outside 0..%d", i,
                              program->layers[i], a->n_layers - 1);
    if (n_prompt < 1) return polar_fail(err, POLAR_ERR_ARG, "batch add: no prompt tokens");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= a->vocab)
            return polar_fail(err, POLAR_ERR_RANGE, "batch add: token %d (at index %d) is outside the vocabulary 0..%d",
                              prompt[i], i, a->vocab - 1);
    if (gen->max_new < 0 || gen->n_stop < 0 || gen->n_stop > POLAR_BATCH_MAX_STOP || (gen->n_stop && !gen->stop))
        return polar_fail(err, POLAR_ERR_ARG, "batch add: max_new %d, %d stop ids (at most %d)", gen->max_new,
                          gen->n_stop, POLAR_BATCH_MAX_STOP);
    /* the last generated token is never run, so it needs no cache row */
    int n_tokens = n_prompt + (gen->max_new > 1 ? gen->max_new - 1 : 0);
    if (n_tokens > b->max_ctx)
        return polar_fail(err, POLAR_ERR_RANGE, "batch add: prompt (%d) + generated tokens (%d) exceed the context (%d)",
                          n_prompt, gen->max_new, b->max_ctx);
    if (kv_blocks_for(program->n, n_tokens) > b->pool.n_blocks)
        return polar_fail(err, POLAR_ERR_RANGE, "batch add: %d entries x %d tokens need %d KV blocks, the pool has %d",
                          program->n, n_tokens, kv_blocks_for(program->n, n_tokens), b->pool.n_blocks);
    batch_seq *q = NULL;
    for (int i = 0; !q && i < b->max_seqs; i++)
        if (!b->seqs[i].id) q = &b->seqs[i];
    if (!q) return polar_fail(err, POLAR_ERR_FULL, "batch add: all %d sequence slots are held", b->max_seqs);
    /* the cache gives back blocks no sequence maps, but only when that admits this one */
    int need = kv_blocks_for(program->n, n_tokens), admitted = kv_seq_admit(&b->pool, &q->kv, program->n, n_tokens);
    if (!admitted && b->pool.n_free - b->pool.promised + prefix_cache_unmapped(&b->cache, &b->pool) >= need)
        while (!(admitted = kv_seq_admit(&b->pool, &q->kv, program->n, n_tokens)) &&
               prefix_cache_evict_unmapped(&b->cache, &b->pool)) {
        }
    if (!admitted)
        return polar_fail(err, POLAR_ERR_FULL,
                          "batch add: the KV pool cannot promise %d blocks (%d of %d free, %d promised to others)",
                          kv_blocks_for(program->n, n_tokens), b->pool.n_free - b->pool.promised, b->pool.n_blocks,
                          b->pool.promised);
    memcpy(q->program, program->layers, (size_t)program->n * sizeof *q->program);
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof *q->tokens);
    q->n_program = program->n;
    q->n_prompt = n_prompt, q->n_run = 0, q->n_generated = 0;
    q->stopped_at_eos = 0, q->head_row = -1;
    q->gen = *gen;
    if (gen->n_stop) memcpy(q->stop, gen->stop, (size_t)gen->n_stop * sizeof *q->stop);
    q->gen.stop = q->stop;
    polar_rng_seed(&q->rng, gen->seed);
    q->state = POLAR_SEQ_PREFILL;
    q->leader = 0, q->shared = 0;
    q->looked_up = 0, q->skipped = 0, q->dev_mapped = 0;
    memset(q->share, 0xff, (size_t)q->kv.cap_program * q->kv.max_blocks * sizeof *q->share);
    memset(q->block_start, 0, (size_t)q->kv.max_blocks * sizeof *q->block_start);
    if (b->cache.cap) {
        uint64_t h = 0;
        for (int k = 0; k < q->n_program; k++) q->entry_hash[k] = h = prefix_hash_entry(h, q->program[k]);
        h = 0;
        for (int j = 0; j * CPU_KV_BLOCK < n_prompt; j++) /* the last may be partial: its length is hashed too */
            q->block_hash[j] = h = prefix_hash_tokens(h, prompt + j * CPU_KV_BLOCK, block_rows(q, j));
    }
    for (int i = 0; !b->cache.cap && i < b->max_seqs; i++) { /* with a cache: see runs_same_start */
        const batch_seq *o = &b->seqs[i];
        if (o == q || !o->id || o->state != POLAR_SEQ_PREFILL || o->n_run || o->leader || o->n_prompt != n_prompt ||
            memcmp(o->tokens, prompt, (size_t)n_prompt * sizeof *prompt))
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

static void end_seq(polar_batch *b, batch_seq *q) {
    q->state = POLAR_SEQ_ENDED;
    kv_seq_release(&b->pool, &q->kv);
}

polar_status polar_batch_cancel(polar_batch *b, int id, polar_error *err) {
    batch_seq *q = b ? find(b, id) : NULL;
    if (!q) return polar_fail(err, POLAR_ERR_ARG, "batch: no sequence %d", id);
    if (q->state != POLAR_SEQ_ENDED) end_seq(b, q);
    return POLAR_OK;
}

polar_status polar_batch_remove(polar_batch *b, int id, polar_error *err) {
    polar_status st = polar_batch_cancel(b, id, err);
    if (st == POLAR_OK) find(b, id)->id = 0;
    return st;
}

polar_status polar_batch_seq(const polar_batch *b, int id, polar_seq_info *info, polar_error *err) {
    const batch_seq *q = b ? find(b, id) : NULL;
    if (!q || !info) return polar_fail(err, POLAR_ERR_ARG, "batch: no sequence %d", id);
    *info = (polar_seq_info){.state = q->state, .n_prompt = q->n_prompt, .n_generated = q->n_generated,
                             .stopped_at_eos = q->stopped_at_eos, .prompt_skipped = q->skipped,
                             .tokens = q->tokens + q->n_prompt};
    return POLAR_OK;
}

const float *polar_batch_logits(const polar_batch *b, int id) {
    batch_seq *q = b ? find(b, id) : NULL;
    if (!q || q->head_row < 0) return NULL;
    if (!q->logits_here) { /* the row is still on the device */
        polar_error err;
        if (b->dev.ops->copy_logits(b->dev.state, q->head_row, &err) != POLAR_OK) return NULL;
        q->logits_here = 1;
    }
    return b->head_out + (size_t)q->head_row * b->m->arch.vocab;
}

int polar_batch_running(const polar_batch *b) {
    int n = 0;
    for (int i = 0; i < b->max_seqs; i++) n += b->seqs[i].id && b->seqs[i].state != POLAR_SEQ_ENDED;
    return n;
}

int polar_batch_threads(const polar_batch *b) { return b->n_threads; }

const char *polar_batch_kv_type(const polar_batch *b) { return kv_pool_row_type(&b->pool); }

const char *polar_batch_cuda_launches(const polar_batch *b) { return b->dev.ops->launches(b->dev.state); }

/* Where q's start row of position pos is on the device (batch_device.h). */
static int start_row(const polar_batch *b, const batch_seq *q, int pos) { return (int)(q - b->seqs) * b->max_ctx + pos; }

/* Block j of q's prompt: the entries 0..s-1 at which the cache holds it
 * (their pool blocks into found[]), and the residual rows after entry s-1
 * into the device's start rows. */
static int find_block(polar_batch *b, batch_seq *q, int j, int *found) {
    int s = 0, item = -1;
    for (int it; s < q->n_program && (it = prefix_cache_find(&b->cache, q->block_hash[j], q->entry_hash[s])) >= 0; s++)
        found[s] = b->cache.items[it].block, item = it;
    if (item >= 0) b->dev.ops->cache_take(b->dev.state, item, start_row(b, q, j * CPU_KV_BLOCK), block_rows(q, j));
    return s;
}

/* A prompt's first step with a prefix cache: map what the cache holds of its
 * blocks (now: the cache may drop an item before the block's turn) and skip
 * the leading blocks it holds at every entry, but not the block with the
 * last token, whose row gives the logits. Full blocks are mapped as they
 * are; a last partial block is copied (this sequence's generated tokens go
 * on filling it). */
static void look_up_prefix(polar_batch *b, batch_seq *q, polar_batch_stats *st) {
    size_t mb = (size_t)q->kv.max_blocks;
    int full = q->n_prompt / CPU_KV_BLOCK, last = (q->n_prompt - 1) / CPU_KV_BLOCK, lead = 0, *found = b->found;
    q->looked_up = 1;
    for (int j = 0; j < prompt_blocks(q); j++) {
        int s = find_block(b, q, j, found);
        q->block_start[j] = s;
        q->skipped += (long)s * block_rows(q, j);
        st->cached_entries += s * block_rows(q, j);
        if (s == q->n_program && lead == j && j < last) lead = j + 1;
        if (j < full) {
            for (int k = 0; k < s; k++) q->share[k * mb + j] = found[k];
            continue;
        }
        kv_seq_grow(&b->pool, &q->kv, q->n_prompt, q->share); /* the partial block (the last): fresh, its rows copied */
        for (int k = 0; k < s; k++)
            b->dev.ops->copy_kv(b->dev.state, (size_t)found[k] * CPU_KV_BLOCK,
                                (size_t)kv_seq_table(&q->kv, k)[j] * CPU_KV_BLOCK, block_rows(q, j));
    }
    kv_seq_grow(&b->pool, &q->kv, q->n_prompt, q->share); /* no partial block: map them all now */
    q->n_run = lead * CPU_KV_BLOCK;
}

/* Whether another prompt being run now starts like q's (its first block,
 * under the same first entry) and will leave in the cache blocks q lacks
 * (the last block they have in common, at the last entry their programs
 * have in common, is not there yet): then q waits for it to finish and
 * finds them, rather than compute the same blocks beside it. */
static int runs_same_start(polar_batch *b, const batch_seq *q, int n) {
    for (int i = 0; i < n; i++) {
        const batch_seq *o = b->order[i];
        if (o == q || o->state != POLAR_SEQ_PREFILL || !o->looked_up) continue;
        int blocks = 0, entries = 0;
        while (blocks < prompt_blocks(q) && blocks < prompt_blocks(o) &&
               o->block_hash[blocks] == q->block_hash[blocks])
            blocks++;
        while (entries < q->n_program && entries < o->n_program && o->entry_hash[entries] == q->entry_hash[entries])
            entries++;
        if (blocks && entries &&
            prefix_cache_find(&b->cache, q->block_hash[blocks - 1], q->entry_hash[entries - 1]) < 0)
            return 1;
    }
    return 0;
}

/* Lay out the step's rows: decode tokens first (one per generating
 * sequence, oldest first), then prompt chunks while the budget lasts, each
 * row with the program entry it starts at. Returns the number of rows;
 * b->order[0..*n_seqs) the sequences in it. */
static int plan_rows(polar_batch *b, int *n_seqs, polar_batch_stats *st) {
    int n = 0;
    for (int i = 0; i < b->max_seqs; i++) {
        batch_seq *q = &b->seqs[i];
        if (!q->id || q->state == POLAR_SEQ_ENDED) continue;
        int j = n++; /* insertion by id: the oldest first */
        while (j > 0 && b->order[j - 1]->id > q->id) b->order[j] = b->order[j - 1], j--;
        b->order[j] = q;
    }
    int rows = 0, kept = 0;
    for (int i = 0; i < n; i++) {
        batch_seq *q = b->order[i];
        q->waiting = 0;
        if (!b->cache.cap || q->state != POLAR_SEQ_PREFILL || q->n_run || q->looked_up) continue;
        if (!(q->waiting = runs_same_start(b, q, n))) look_up_prefix(b, q, st);
    }
    for (int i = 0; i < n; i++) {
        batch_seq *q = b->order[i];
        const batch_seq *l = q->leader ? find(b, q->leader) : NULL;
        if (q->leader && (!l || l->state != POLAR_SEQ_PREFILL || l->n_run != q->n_run)) q->leader = 0; /* out of step */
        q->n_rows = 0, q->following = 0;
    }
    for (int i = 0; i < n; i++)
        if (b->order[i]->state == POLAR_SEQ_DECODE) b->order[i]->n_rows = 1, rows++;
    /* prompt chunks, a leader's followers taking the same chunk beside it */
    for (int i = 0; i < n && rows < b->step_tokens; i++) {
        batch_seq *q = b->order[i];
        if (q->state != POLAR_SEQ_PREFILL || q->leader || q->waiting) continue;
        int followers = 0;
        for (int j = i + 1; j < n; j++) followers += b->order[j]->leader == q->id;
        int left = q->n_prompt - q->n_run, room = b->step_tokens - rows, each = room / (1 + followers);
        if (!each) { /* no room for them all: the followers go their own way */
            for (int j = i + 1; j < n; j++)
                if (b->order[j]->leader == q->id) b->order[j]->leader = 0;
            each = room;
        }
        q->n_rows = left < each ? left : each;
        int end = q->n_run + q->n_rows;
        if (b->cache.cap && q->n_rows < left && end % CPU_KV_BLOCK < q->n_rows) /* whole blocks, to be cached */
            q->n_rows -= end % CPU_KV_BLOCK;
        rows += q->n_rows;
        for (int j = i + 1; j < n; j++)
            if (b->order[j]->leader == q->id) b->order[j]->n_rows = q->n_rows, b->order[j]->following = 1, rows += q->n_rows;
    }
    rows = 0;
    for (int i = 0; i < n; i++)
        if (b->order[i]->n_rows) {
            batch_seq *q = b->order[kept++] = b->order[i];
            q->row0 = rows;
            q->cursor = q->n_program;
            for (int r = 0; r < q->n_rows; r++) {
                int block = (q->n_run + r) / CPU_KV_BLOCK, start = 0;
                if (q->state == POLAR_SEQ_PREFILL && block < prompt_blocks(q)) start = q->block_start[block];
                b->row_start[rows + r] = start;
                if (start < q->cursor) q->cursor = start;
            }
            rows += q->n_rows;
        }
    *n_seqs = kept;
    return rows;
}

/* Map q's cache rows up to n_tokens: a follower's prompt blocks at the
 * shared entries are its leader's (mapped already: it is older). */
static void grow_rows(polar_batch *b, batch_seq *q, int n_tokens) {
    const batch_seq *l = q->following ? find(b, q->leader) : NULL;
    size_t mb = (size_t)q->kv.max_blocks, lmb = l ? (size_t)l->kv.max_blocks : 0;
    for (int j = q->kv.n_mapped; l && j * CPU_KV_BLOCK < n_tokens && (j + 1) * CPU_KV_BLOCK <= q->n_prompt; j++)
        for (int k = 0; k < q->shared; k++) q->share[k * mb + j] = l->kv.blocks[k * lmb + j];
    kv_seq_grow(&b->pool, &q->kv, n_tokens, q->share);
}

/* Where q's block table of entry k is in the device's mirror. */
static int table_offset(const polar_batch *b, const batch_seq *q, int k) {
    return ((int)(q - b->seqs) * b->cap_program + k) * q->kv.max_blocks;
}

/* Map the rows' cache rows (and mirror the tables that grew on the
 * device), embed their tokens, then replace the rows the prefix cache
 * gives by the residual they start from. */
static void embed_rows(polar_batch *b, int n_seqs, int rows) {
    int from_cache = 0;
    for (int i = 0; i < n_seqs; i++) {
        batch_seq *q = b->order[i];
        grow_rows(b, q, q->n_run + q->n_rows);
        if (q->kv.n_mapped > q->dev_mapped) {
            b->dev.ops->put_tables(b->dev.state, q->kv.blocks, table_offset(b, q, 0), q->n_program * q->kv.max_blocks);
            q->dev_mapped = q->kv.n_mapped;
        }
        for (int r = 0; r < q->n_rows; r++) {
            int row = q->row0 + r, pos = q->n_run + r;
            b->row_tokens[row] = q->tokens[pos], b->row_pos[row] = pos;
            if (b->row_start[row]) b->pass_rows[from_cache] = row, b->pass_pos[from_cache++] = start_row(b, q, pos);
        }
    }
    b->dev.ops->embed(b->dev.state, b->row_tokens, b->row_pos, rows);
    if (from_cache) b->dev.ops->rows_from_start(b->dev.state, b->pass_rows, b->pass_pos, from_cache);
}

/* The lower bound of polar_batch_stats for the step's programs. */
static int min_passes(polar_batch *b, int n_seqs) {
    int D = b->m->arch.n_layers, longest = 0, sum = 0;
    memset(b->layer_most, 0, (size_t)D * sizeof(int));
    for (int i = 0; i < n_seqs; i++) {
        const batch_seq *q = b->order[i];
        memset(b->layer_uses, 0, (size_t)D * sizeof(int));
        for (int k = q->cursor; k < q->n_program; k++) /* from its first entry to run (later with cached blocks) */
            if (++b->layer_uses[q->program[k]] > b->layer_most[q->program[k]]) b->layer_most[q->program[k]]++;
        if (q->n_program - q->cursor > longest) longest = q->n_program - q->cursor;
    }
    for (int l = 0; l < D; l++) sum += b->layer_most[l];
    return sum > longest ? sum : longest;
}

/* Into the prefix cache: the prompt blocks a pass just ran whole, their
 * K/V at the entry it ran and their residual rows after it. */
static void cache_pass(polar_batch *b, int n_seqs) {
    for (int i = 0; i < n_seqs; i++) {
        const batch_seq *q = b->order[i];
        if (!q->in_pass || q->state != POLAR_SEQ_PREFILL || q->following == 1) continue;
        int k = q->cursor - 1, end = q->n_run + q->n_rows;
        for (int j = (q->n_run + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK; j < prompt_blocks(q) && j * CPU_KV_BLOCK + block_rows(q, j) <= end; j++)
            if (q->block_start[j] <= k) {
                int row = q->row0 + j * CPU_KV_BLOCK - q->n_run; /* the block's first row this step */
                int item = prefix_cache_insert(&b->cache, &b->pool, q->block_hash[j], q->entry_hash[k],
                                               kv_seq_table(&q->kv, k)[j]);
                if (item >= 0) b->dev.ops->cache_keep(b->dev.state, item, row, block_rows(q, j));
            }
    }
}

/* Run every sequence's program over its rows, one pass per (layer, point
 * of the walk); returns the passes made. */
static int walk_programs(polar_batch *b, int n_seqs) {
    int passes = 0;
    for (;;) {
        int layer = -1;
        for (int i = 0; i < n_seqs; i++) {
            const batch_seq *q = b->order[i];
            if (q->cursor < q->n_program && (layer < 0 || q->program[q->cursor] < layer)) layer = q->program[q->cursor];
        }
        if (layer < 0) return passes;
        int T = 0;
        for (int i = 0; i < n_seqs; i++) {
            batch_seq *q = b->order[i];
            q->in_pass = q->cursor < q->n_program && q->program[q->cursor] == layer;
            if (!q->in_pass) continue;
            for (int r = 0; r < q->n_rows && q->following != 1; r++) {
                int row = q->row0 + r;
                if (b->row_start[row] > q->cursor) continue; /* its block is cached here */
                b->pass_rows[T] = row, b->pass_pos[T] = q->n_run + r, b->pass_table[T++] = table_offset(b, q, q->cursor);
            }
            q->cursor++;
        }
        if (T) b->dev.ops->pass(b->dev.state, layer, b->pass_rows, b->pass_pos, b->pass_table, T);
        passes++;
        if (b->cache.cap) cache_pass(b, n_seqs);
        for (int i = 0; i < n_seqs; i++) { /* followers parting from their leader take its rows as they are now */
            batch_seq *q = b->order[i];
            if (q->following != 1 || q->cursor < q->shared) continue;
            const batch_seq *l = find(b, q->leader);
            b->dev.ops->copy_rows(b->dev.state, q->row0, l->row0, q->n_rows);
            q->following = 2;
        }
    }
}

/* A follower's K/V of this step's prompt rows at the shared entries, where
 * its block is not the leader's (the block the prompt ends in, which their
 * generated tokens will fill differently): copied from the leader. */
static void copy_followed_kv(polar_batch *b, int n_seqs) {
    for (int i = 0; i < n_seqs; i++) {
        const batch_seq *q = b->order[i];
        if (!q->following) continue;
        const batch_seq *l = find(b, q->leader);
        for (int k = 0; k < q->shared; k++)
            for (int j = q->n_run; j < q->n_run + q->n_rows; j++) {
                size_t from = cpu_kv_row(kv_seq_table(&l->kv, k), j), to = cpu_kv_row(kv_seq_table(&q->kv, k), j);
                if (from != to) b->dev.ops->copy_kv(b->dev.state, from, to, 1);
            }
    }
}


/* Final norm and head over the last row of every sequence that completes a
 * token this step, then each one's next token. */
static polar_status next_tokens(polar_batch *b, int n_seqs, polar_batch_stats *st, polar_error *err) {
    const polar_arch *a = &b->m->arch;
    int n = 0;
    for (int i = 0; i < n_seqs; i++) {
        batch_seq *q = b->order[i];
        q->n_run += q->n_rows;
        if (q->n_run < q->n_prompt) continue; /* mid-prompt: no logits yet */
        b->pass_rows[n] = q->row0 + q->n_rows - 1;
        b->want[n] = q->gen.temperature > 0;
        b->order[n++] = q; /* the step's walk is done: order now lists the sequences with logits */
    }
    /* the head, and the end of the step */
    polar_status s = n ? b->dev.ops->head(b->dev.state, b->pass_rows, n, b->want, b->ids, err)
                       : b->dev.ops->finish(b->dev.state, err);
    if (s != POLAR_OK) return s;
    for (int i = 0; i < n; i++) {
        batch_seq *q = b->order[i];
        const float *lg = b->head_out + (size_t)i * a->vocab;
        q->head_row = i, q->logits_here = b->want[i];
        int token = b->want[i] ? polar_sample(lg, a->vocab, &q->gen, &q->rng, b->sample_work)
                               : b->ids[i];
        q->tokens[q->n_prompt + q->n_generated++] = token;
        q->state = POLAR_SEQ_DECODE;
        int eos = !q->gen.ignore_eos && gen_stops_at(a, &q->gen, token);
        if (eos || q->n_generated >= q->gen.max_new) {
            q->stopped_at_eos = eos;
            end_seq(b, q);
            st->finished++;
        }
    }
    return POLAR_OK;
}

polar_status polar_batch_step(polar_batch *b, polar_batch_stats *stats, polar_error *err) {
    polar_batch_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!b) return polar_fail(err, POLAR_ERR_ARG, "batch step: no batch");
    if (b->broken) return refuse_broken(err);
    b->dev.ops->begin(b->dev.state);
    for (int i = 0; i < b->max_seqs; i++) b->seqs[i].head_row = -1; /* last step's logits: gone */
    int n_seqs, rows = plan_rows(b, &n_seqs, stats);
    if (!rows) { /* the plan may still have queued device copies (prefix-cache look-ups) */
        polar_status st = b->dev.ops->finish(b->dev.state, err);
        b->broken = st != POLAR_OK;
        return st;
    }
    stats->sequences = n_seqs;
    for (int i = 0; i < n_seqs; i++) {
        batch_seq *q = b->order[i];
        if (q->state == POLAR_SEQ_DECODE) stats->decode_tokens++;
        else stats->prompt_tokens += q->n_rows;
        if (q->following) { /* cached pairs are counted at the look-up */
            stats->shared_prompt_tokens += q->n_rows, stats->shared_entries += q->n_rows * q->shared;
            q->skipped += (long)q->n_rows * q->shared;
        }
    }
    embed_rows(b, n_seqs, rows);
    stats->min_layer_passes = min_passes(b, n_seqs);
    stats->layer_passes = walk_programs(b, n_seqs);
    copy_followed_kv(b, n_seqs);
    polar_status st = next_tokens(b, n_seqs, stats, err);
    stats->graph = b->dev.ops->step_graph(b->dev.state);
    b->broken = st != POLAR_OK; /* only the device fails here, with the step half done */
    return st;
}
