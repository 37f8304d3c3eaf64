/* A batch's steps: planned here, run on the batch's device (the CPU or a
 * GPU) through batch_device.h, so the plan is written once.
 *
 * A step lays its tokens out as rows: one per decoding sequence, then
 * chunks of appended tokens (prompts) within the step's token budget. Each
 * sequence walks its own program with a cursor; while some cursor is not at
 * its end, the lowest layer among the sequences' next entries runs once
 * over the rows of every sequence whose next entry it is, each row
 * attending over its own sequence's KV table of that execution position.
 * Then the final norm and the head run once over the last row of every
 * sequence that completes a token (and the outputs a sequence asked for
 * over its rows). On the CPU a matmul output is summed in the same order
 * whatever the rows beside it (kernels.h), so each sequence gets the
 * logits it gets alone.
 *
 * polar_batch_run queues a greedy decode step on an asynchronous device
 * before the host reads the step before it: its tokens are that step's
 * argmax, fed on the device; a sequence that stops there wastes its row of
 * the step ahead, which the host then disregards. */
#include <limits.h>
#include <string.h>

#include "../kernels/cpu/ops.h"
#include "batch.h"
#include "error.h"

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
 * on filling it). A cache that keeps only the last prompt then drops every
 * item this one did not find. */
static void look_up_prefix(polar_batch *b, batch_seq *q, polar_batch_stats *st) {
    size_t mb = (size_t)q->kv.max_blocks;
    int full = q->n_prompt / CPU_KV_BLOCK, last = (q->n_prompt - 1) / CPU_KV_BLOCK, lead = 0, *found = b->found;
    int n_found = 0;
    q->looked_up = 1, q->resumed = INT_MAX;
    for (int j = 0; j < prompt_blocks(q); j++) {
        int s = find_block(b, q, j, found);
        q->block_start[j] = s;
        q->skipped += (long)s * block_rows(q, j);
        st->cached_entries += s * block_rows(q, j);
        n_found += s;
        if (s < q->resumed) q->resumed = s;
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
    if (b->cache_last_prompt) prefix_cache_keep_newest(&b->cache, &b->pool, n_found);
}

/* Whether another prompt being run now starts like q's (its first block,
 * under the same first entry) and will leave in the cache blocks q lacks
 * (the last block they have in common, at the last entry their programs
 * have in common, is not there yet): then q waits for it to finish and
 * finds them, rather than compute the same blocks beside it. */
static int runs_same_start(polar_batch *b, const batch_seq *q, int n) {
    for (int i = 0; i < n; i++) {
        const batch_seq *o = b->order[i];
        if (o == q || o->state != POLAR_SEQ_PREFILL || !o->looked_up || o->n_run >= o->n_prompt) continue;
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

/* Whether q takes a row of a step planned while the step of half `ahead`
 * runs: it decodes greedily, is in that step, and will not have made its
 * last token with it. */
static int runs_ahead(const batch_seq *q, int ahead) {
    return q->state == POLAR_SEQ_DECODE && q->gen.temperature <= 0 && q->step_row[ahead] >= 0 &&
           q->n_generated + 2 <= q->gen.max_new;
}

/* Lay out the step's rows: decode tokens first (one per generating
 * sequence, oldest first), then chunks of appended tokens while the budget
 * lasts, each row with the program entry it starts at. ahead >= 0: a step
 * planned while the step of that half runs (greedy decode rows only, their
 * tokens that step's). Returns the number of rows; b->order[0..*n_seqs)
 * the sequences in it. */
static int plan_rows(polar_batch *b, int ahead, int *n_seqs, polar_batch_stats *st) {
    int n = 0;
    for (int i = 0; i < b->max_seqs; i++) {
        batch_seq *q = &b->seqs[i];
        if (!q->id || (q->state != POLAR_SEQ_PREFILL && q->state != POLAR_SEQ_DECODE)) continue;
        if (ahead >= 0 && !runs_ahead(q, ahead)) continue;
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
        const batch_seq *l = q->leader ? batch_find(b, q->leader) : NULL;
        if (q->leader && (!l || l->state != POLAR_SEQ_PREFILL || l->n_run != q->n_run)) q->leader = 0; /* out of step */
        q->n_rows = 0, q->following = 0, q->from_row = -1;
    }
    for (int i = 0; i < n; i++)
        if (b->order[i]->state == POLAR_SEQ_DECODE) {
            batch_seq *q = b->order[i];
            q->n_rows = 1, rows++;
            if (ahead >= 0) q->from_row = q->step_row[ahead];
        }
    /* appended chunks, a leader's followers taking the same chunk beside it */
    for (int i = 0; i < n && rows < b->step_tokens; i++) {
        batch_seq *q = b->order[i];
        if (q->state != POLAR_SEQ_PREFILL || q->leader || q->waiting) continue;
        int followers = 0;
        for (int j = i + 1; j < n; j++) followers += b->order[j]->leader == q->id;
        int left = q->n_tokens - q->n_run, room = b->step_tokens - rows, each = room / (1 + followers);
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
    const batch_seq *l = q->following ? batch_find(b, q->leader) : NULL;
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
    int from_cache = 0, fed = 0;
    for (int i = 0; i < n_seqs; i++) {
        batch_seq *q = b->order[i];
        grow_rows(b, q, q->n_run + q->n_rows);
        if (q->kv.n_mapped > q->dev_mapped) {
            b->dev.ops->put_tables(b->dev.state, q->kv.blocks, table_offset(b, q, 0), q->n_program * q->kv.max_blocks);
            q->dev_mapped = q->kv.n_mapped;
        }
        for (int r = 0; r < q->n_rows; r++) {
            int row = q->row0 + r, pos = q->n_run + r;
            b->row_from[row] = q->from_row; /* a decode row (r 0) whose token the step in flight chooses */
            b->row_tokens[row] = q->from_row >= 0 ? 0 : q->tokens[pos], b->row_pos[row] = pos;
            fed |= q->from_row >= 0;
            if (b->row_start[row]) b->pass_rows[from_cache] = row, b->pass_pos[from_cache++] = start_row(b, q, pos);
        }
    }
    b->dev.ops->embed(b->dev.state, b->row_tokens, fed ? b->row_from : NULL, b->row_pos, rows);
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
            const batch_seq *l = batch_find(b, q->leader);
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
        const batch_seq *l = batch_find(b, q->leader);
        for (int k = 0; k < q->shared; k++)
            for (int j = q->n_run; j < q->n_run + q->n_rows; j++) {
                size_t from = cpu_kv_row(kv_seq_table(&l->kv, k), j), to = cpu_kv_row(kv_seq_table(&q->kv, k), j);
                if (from != to) b->dev.ops->copy_kv(b->dev.state, from, to, 1);
            }
    }
}

/* After the walk: the rows' outputs the sequences asked for, then the head
 * over the last row of every sequence whose known tokens have all run (it
 * chooses a token, or its logits are the append's last). An append done
 * without a head (its states only) is done now. */
static void queue_outputs_and_head(polar_batch *b, int h, int n_seqs) {
    size_t V = (size_t)b->m->arch.vocab, H = (size_t)b->m->arch.hidden;
    int n = 0;
    for (int i = 0; i < n_seqs; i++) {
        batch_seq *q = b->order[i];
        size_t at = (size_t)(q->n_run - q->out_from);
        if (q->state == POLAR_SEQ_PREFILL && (q->out_logits || q->out_hidden))
            b->dev.ops->outputs(b->dev.state, q->row0, q->n_rows, q->out_logits ? q->out_logits + at * V : NULL,
                                q->out_hidden ? q->out_hidden + at * H : NULL);
        q->n_run += q->n_rows;
    }
    for (int i = 0; i < n_seqs; i++) {
        batch_seq *q = b->order[i];
        if (q->n_run < q->n_tokens) continue; /* mid-append: no logits yet */
        if (!q->generating && !q->want_last) {
            batch_seq_done(b, q);
            continue;
        }
        b->pass_rows[n] = q->row0 + q->n_rows - 1;
        b->want[h][n] = q->generating && q->gen.temperature > 0;
        q->step_row[h] = n;
        b->headed[h][n++] = q;
    }
    b->n_headed[h] = n;
    if (n) b->dev.ops->head(b->dev.state, b->pass_rows, n, b->want[h]);
}

/* Plan a step and launch it on the device: *half its half, or -1 when it
 * had no rows (whatever it queued has run). ahead >= 0: planned while the
 * step of that half runs (plan_rows). */
static polar_status launch_step(polar_batch *b, int ahead, int *half, polar_batch_stats *stats, polar_error *err) {
    memset(stats, 0, sizeof *stats);
    int h = b->dev.ops->begin(b->dev.state);
    *half = -1;
    for (int i = 0; i < b->max_seqs; i++) /* the last step's logits are gone, this half's rows too */
        b->seqs[i].head_row = -1, b->seqs[i].step_row[h] = -1;
    b->n_headed[h] = 0;
    int n_seqs, rows = plan_rows(b, ahead, &n_seqs, stats);
    if (!rows) { /* the plan may still have queued device copies (prefix-cache look-ups) */
        polar_status st = b->dev.ops->launch(b->dev.state, err);
        return st == POLAR_OK ? b->dev.ops->wait(b->dev.state, h, NULL, err) : st;
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
    queue_outputs_and_head(b, h, n_seqs);
    polar_status st = b->dev.ops->launch(b->dev.state, err);
    stats->graph = b->dev.ops->step_graph(b->dev.state);
    *half = h;
    return st;
}

/* Wait for the step of half h and take its tokens: each headed sequence
 * still running gets the argmax or a sample (on_token told, and may end
 * it), its logits the head's row; those that stop are done. run (may be
 * NULL): counts tokens and rows wasted. */
static polar_status finish_step(polar_batch *b, int h, polar_batch_token_cb on_token, void *user,
                                polar_batch_stats *stats, polar_batch_run_stats *run, polar_error *err) {
    const polar_arch *a = &b->m->arch;
    const int *ids = NULL;
    polar_status st = b->dev.ops->wait(b->dev.state, h, &ids, err);
    if (st != POLAR_OK) return st;
    const float *host = b->dev.ops->host_logits(b->dev.state, h);
    for (int i = 0; i < b->n_headed[h]; i++) {
        batch_seq *q = b->headed[h][i];
        if (q->step_row[h] != i || (q->state != POLAR_SEQ_PREFILL && q->state != POLAR_SEQ_DECODE)) {
            if (run) run->wasted_rows++; /* it stopped at the step before (this row was run ahead) */
            continue;
        }
        q->head_row = i, q->head_half = h, q->logits_here = b->want[h][i] || !b->dev.ops->async;
        if (!q->generating) { /* its append is done: the logits are its last token's */
            batch_seq_done(b, q);
            stats->finished++;
            continue;
        }
        int token = b->want[h][i] ? polar_sample(host + (size_t)i * a->vocab, a->vocab, &q->gen, &q->rng, b->sample_work)
                                  : ids[i];
        q->tokens[q->n_tokens++] = token;
        q->n_generated++;
        if (run) run->tokens++;
        q->state = POLAR_SEQ_DECODE;
        int stop = on_token && on_token(q->id, token, user);
        int eos = !stop && !q->gen.ignore_eos && gen_stops_at(a, &q->gen, token);
        if (stop || eos || q->n_generated >= q->gen.max_new) {
            q->stopped_at_eos = eos;
            batch_seq_done(b, q);
            stats->finished++;
        }
    }
    return POLAR_OK;
}

polar_status polar_batch_step(polar_batch *b, polar_batch_stats *stats, polar_error *err) {
    polar_batch_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!b) return polar_fail(err, POLAR_ERR_ARG, "batch step: no batch");
    if (b->broken) return batch_refuse_broken(err);
    int h;
    polar_status st = launch_step(b, -1, &h, stats, err);
    if (st == POLAR_OK && h >= 0) st = finish_step(b, h, NULL, NULL, stats, NULL, err);
    b->broken = st != POLAR_OK; /* only the device fails here, with the step half done */
    return st;
}

/* Whether a step may be planned while the step of half h runs: on an
 * asynchronous device, when every sequence with work decodes greedily and
 * some will still need a token after that step. */
static int can_run_ahead(const polar_batch *b, int h) {
    int some = 0;
    for (int i = 0; b->dev.ops->async && i < b->max_seqs; i++) {
        const batch_seq *q = &b->seqs[i];
        if (!q->id || (q->state != POLAR_SEQ_PREFILL && q->state != POLAR_SEQ_DECODE)) continue;
        if (q->state != POLAR_SEQ_DECODE || q->gen.temperature > 0) return 0;
        some |= runs_ahead(q, h);
    }
    return some;
}

polar_status polar_batch_run(polar_batch *b, int max_steps, polar_batch_token_cb on_token, void *user,
                             polar_batch_run_stats *run, polar_error *err) {
    polar_batch_run_stats local;
    if (!run) run = &local;
    memset(run, 0, sizeof *run);
    if (!b) return polar_fail(err, POLAR_ERR_ARG, "batch run: no batch");
    if (b->broken) return batch_refuse_broken(err);
    polar_batch_stats stats;
    polar_status st = POLAR_OK;
    int running = -1; /* the half of a launched step not yet finished */
    for (;;) {
        int next = -1;
        if (run->steps < max_steps && polar_batch_running(b) && (running < 0 || can_run_ahead(b, running))) {
            st = launch_step(b, running, &next, &stats, err);
            if (next >= 0) run->steps++, run->steps_ahead += running >= 0, run->graph_replays += stats.graph == 1;
        }
        if (running >= 0) {
            polar_error ignored;
            polar_status s2 = finish_step(b, running, on_token, user, &stats, run, st == POLAR_OK ? err : &ignored);
            if (st == POLAR_OK) st = s2;
        }
        if (st != POLAR_OK) { /* nothing of ours runs on after an error */
            if (next >= 0) (void)b->dev.ops->wait(b->dev.state, next, NULL, NULL);
            break;
        }
        if (next < 0 && running < 0) break;
        running = next;
    }
    b->broken = st != POLAR_OK;
    return st;
}
