/* A batch's steps on the GPU (batch_device.h): the device's calls. A layer
 * pass gathers its rows of the step's residual into the cuda_state's
 * workspace (or, when they are simply rows 0..T-1, runs on the step's rows
 * in place), runs cuda_layer_forward with each token's position and block
 * table, and scatters them back. The ints a step needs on the device
 * (tokens, each pass's rows, positions and tables, the head rows) are
 * staged in its half's pinned area, each at its own offset, and go up in
 * one copy when the step is launched (block tables through an area of their
 * own, copied at once).
 *
 * A step's calls are recorded here (the plan, made once) and issued at its
 * launch by every rank (cuda_step.c: one rank on one GPU; under tensor
 * parallel each rank of the group on its own GPU and thread), as calls or
 * as a replayed graph. POLAR_CUDA_GRAPHS=0 turns graphs off. Built with
 * POLAR_CUDA; without it there is no GPU to run a batch on. */
#include "batch_device.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifndef POLAR_CUDA

polar_status cuda_batch_device(const polar_model *m, const batch_device_shape *shape, batch_device *out,
                               polar_error *err) {
    (void)m, (void)shape, (void)out;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build it with make cuda)");
}

#else

#include "cuda_step.h"

/* The host's block ids index the device's pool */
_Static_assert(CUDA_KV_BLOCK == CPU_KV_BLOCK, "one block size on the host and the device");

static void half_free(step_half *h) {
    if (h->staging) cudaFreeHost(h->staging);
    if (h->table_staging) cudaFreeHost(h->table_staging);
    if (h->host_ids) cudaFreeHost(h->host_ids);
    if (h->host_logits) cudaFreeHost(h->host_logits);
}

/* Rank r's own: its events, graphs and state (the pool, tables and rows go
 * with the state's buffers). */
static void rank_free(void *arg, int r) {
    rank_state *k = &((cuda_batch *)arg)->rank[r];
    for (int i = 0; i < 2; i++)
        if (k->half[i].done) cudaEventDestroy(k->half[i].done);
    for (int i = 0; i < STEP_GRAPHS; i++)
        if (k->exec[i]) cudaGraphExecDestroy(k->exec[i]);
    free(k->runs);
    cuda_state_free(k->c);
}

static void cuda_batch_free(void *state) {
    cuda_batch *d = state;
    if (!d) return;
    if (d->rank) ranks_run(d, rank_free, d);
    tp_group_free(d->tp);
    for (int i = 0; i < 2; i++) half_free(&d->half[i]);
    for (int i = 0; i <= STEP_GRAPHS; i++) {
        step_graph *g = i < STEP_GRAPHS ? &d->graph[i] : &d->last;
        free(g->ops);
        free(g->want);
    }
    free(d->rank);
    free(d->v0);
    free(d->vocab);
    free(d->ops);
    free(d->want);
    free(d);
}

/* The host's side of a half: pinned (portable to every device of the
 * group) and, for the argmax, mapped memory. */
static int half_init(cuda_batch *d, step_half *h, size_t V, size_t HR) {
    return cudaMallocHost((void **)&h->staging, d->cap_ints * sizeof(int)) == cudaSuccess &&
           cudaMallocHost((void **)&h->table_staging, d->n_tables * sizeof(int)) == cudaSuccess &&
           cudaMallocHost((void **)&h->host_logits, HR * V * sizeof(float)) == cudaSuccess &&
           cudaHostAlloc((void **)&h->host_ids, HR * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) ==
               cudaSuccess &&
           cudaHostGetDevicePointer((void **)&h->host_ids_dev, h->host_ids, 0) == cudaSuccess;
}

/* What a rank is made with. */
typedef struct {
    cuda_batch *d;
    const polar_model *m;
    const batch_device_shape *sh;
} rank_job;

/* Rank r's state on its device: its share of the model and its workspaces,
 * KV pool and tables; the step's rows, logits and per-step buffers. */
static void rank_create(void *arg, int r) {
    rank_job *j = arg;
    cuda_batch *d = j->d;
    const batch_device_shape *sh = j->sh;
    const polar_arch *a = &j->m->arch;
    rank_state *k = &d->rank[r];
    int rank = d->tp ? tp_rank(d->tp, r) : 0;
    cuda_state_shape cs = {.chunk = sh->rows, .n_blocks = sh->n_blocks, .n_tables = sh->tables,
                           .comm = d->tp ? tp_comm(d->tp, r) : NULL};
    if (tp_shard_of(a, rank, d->world, &cs.shard, &k->err) != POLAR_OK ||
        cuda_state_create(j->m, &cs, &k->c, &k->err) != POLAR_OK)
        return;
    size_t H = (size_t)a->hidden, R = (size_t)sh->rows, HR = (size_t)sh->head_rows, Vp = (size_t)d->vocab_part;
    size_t logit_rows = 2 * HR > LOGIT_ROWS ? 2 * HR : LOGIT_ROWS, gather_rows = HR > LOGIT_ROWS ? HR : LOGIT_ROWS;
    cuda_state *c = k->c;
    int ok = (k->x = cuda_dev_alloc(c, R * H * sizeof(float))) &&
             (k->logits = cuda_dev_alloc(c, logit_rows * Vp * sizeof(float))) &&
             (k->runs = malloc((R / (DECODE_TOKENS + 1) + 1) * sizeof *k->runs));
    for (int i = 0; ok && i < 2; i++) {
        rank_half *h = &k->half[i];
        h->logits = k->logits + i * HR * Vp;
        ok = (h->ints = cuda_dev_alloc(c, d->cap_ints * sizeof(int))) && (h->ids = cuda_dev_alloc(c, HR * sizeof(int))) &&
             cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming) == cudaSuccess;
    }
    if (ok && d->tp)
        ok = (k->gathered = cuda_dev_alloc(c, (size_t)d->world * gather_rows * Vp * sizeof(float))) &&
             (k->part = cuda_dev_alloc(c, 2 * HR * sizeof(float))) &&
             (k->parts = cuda_dev_alloc(c, (size_t)d->world * 2 * HR * sizeof(float)));
    if (ok && sh->cache_items)
        ok = (k->cache_rows = cuda_dev_alloc(c, (size_t)sh->cache_items * CUDA_KV_BLOCK * H * sizeof(float))) &&
             (k->start = cuda_dev_alloc(c, (size_t)sh->start_rows * H * sizeof(float)));
    if (!ok)
        polar_fail(&k->err, POLAR_ERR_NOMEM,
                   "device cuda: out of GPU memory for the batch (a KV pool of %d blocks, %d rows per step, a prefix "
                   "cache of %d items, %d rows of logits)", sh->n_blocks, sh->rows, sh->cache_items, sh->head_rows);
}

/* The vocabulary split of the head: every rank's rows (tp_shard.h). */
static polar_status split_vocab(cuda_batch *d, const polar_arch *a, polar_error *err) {
    if (!(d->v0 = malloc((size_t)d->world * sizeof(int))) || !(d->vocab = malloc((size_t)d->world * sizeof(int))))
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    for (int r = 0; r < d->world; r++) {
        tp_shard s;
        polar_status st = tp_shard_of(a, r, d->world, &s, err);
        if (st != POLAR_OK) return st;
        d->v0[r] = s.v0, d->vocab[r] = s.vocab, d->vocab_part = s.vocab_part;
    }
    return POLAR_OK;
}

static polar_status cuda_batch_create(const polar_model *m, const batch_device_shape *sh, cuda_batch **out,
                                      polar_error *err) {
    *out = NULL;
    const polar_arch *a = &m->arch;
    cuda_batch *d = calloc(1, sizeof *d);
    if (!d) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    d->n_ranks = sh->tp ? sh->tp : 1, d->world = sh->tp ? (sh->tp_world ? sh->tp_world : sh->tp) : 1;
    char why[256];
    polar_status st = polar_cuda_available(why, sizeof why)
                          ? split_vocab(d, a, err)
                          : polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: %s", why);
    if (st == POLAR_OK && sh->tp) {
        tp_config cfg = {.n = sh->tp, .world = d->world, .rank0 = sh->tp_rank, .devices = sh->devices,
                         .unique_id = sh->nccl_id};
        st = tp_group_create(&cfg, &d->tp, err);
    }
    if (st != POLAR_OK) {
        cuda_batch_free(d);
        return st;
    }
    size_t R = (size_t)sh->rows, V = (size_t)a->vocab, HR = (size_t)sh->head_rows;
    d->rows = sh->rows, d->head_rows = sh->head_rows;
    /* tokens and where they come from, a (row, pos, table) per row and
     * pass, a (row, start) per row from the cache, head rows */
    d->cap_ints = 2 * R + 3 * R * sh->cap_program + 2 * R + R;
    d->n_tables = (size_t)sh->tables;
    /* embed, a pass per sequence and entry, a few copies per row and block */
    size_t seqs = HR < R ? HR : R;
    d->cap_ops = (int)(2 * seqs * sh->cap_program + 4 * R + 8);
    /* a decode step: one pass per entry of a program, twice over, a copy per sequence */
    d->graph_ops = 2 * sh->cap_program + 2 * sh->head_rows + 8;
    const char *env = getenv("POLAR_CUDA_GRAPHS");
    d->graphs = !(env && !strcmp(env, "0"));
    d->ran_kernels = d->ran_copies = -1;
    int ok = half_init(d, &d->half[0], V, HR) && half_init(d, &d->half[1], V, HR) &&
             (d->ops = malloc((size_t)d->cap_ops * sizeof *d->ops)) && (d->want = calloc(HR, 1)) &&
             (d->rank = calloc((size_t)d->n_ranks, sizeof *d->rank));
    for (int i = 0; ok && i <= STEP_GRAPHS; i++) {
        step_graph *g = i < STEP_GRAPHS ? &d->graph[i] : &d->last;
        ok = (g->ops = malloc((size_t)d->graph_ops * sizeof *d->ops)) && (g->want = calloc(HR, 1));
    }
    if (!ok) {
        cuda_batch_free(d);
        return polar_fail(err, POLAR_ERR_NOMEM, "device cuda: out of pinned host memory for the batch (%d rows of "
                          "logits on both sides)", sh->head_rows);
    }
    rank_job job = {d, m, sh};
    ranks_run(d, rank_create, &job);
    for (int r = 0; r < d->n_ranks; r++)
        if (!d->rank[r].c || d->rank[r].err.code != POLAR_OK) {
            if (err) *err = d->rank[r].err;
            st = d->rank[r].err.code != POLAR_OK ? d->rank[r].err.code : POLAR_ERR_NOMEM;
            cuda_batch_free(d);
            return st;
        }
    *out = d;
    return POLAR_OK;
}

/* n_parts arrays of n ints each into the step's staging area, one after
 * the other; their offset (SIZE_MAX when the area is spent). */
static size_t stage_ints(cuda_batch *d, const int *const *parts, int n_parts, size_t n) {
    step_half *h = &d->half[d->h];
    size_t total = (size_t)n_parts * n, at = h->used;
    if (at + total > d->cap_ints) {
        h->failed = 1;
        return SIZE_MAX;
    }
    for (int i = 0; i < n_parts; i++) memcpy(h->staging + at + i * n, parts[i], n * sizeof(int));
    h->used += total;
    return at;
}

/* Whether rows[0..n) are 0..n-1: the pass runs on the step's rows in place. */
static int rows_in_order(const int *rows, int n) {
    for (int i = 0; i < n; i++)
        if (rows[i] != i) return 0;
    return 1;
}

/* Calls going out as they come, on every rank. */
typedef struct {
    cuda_batch *d;
    const step_op *ops;
    int n;
} direct_job;

static void issue_direct(void *arg, int r) {
    direct_job *j = arg;
    for (int i = 0; i < j->n; i++) step_issue(j->d, r, j->d->h, &j->ops[i]);
}

/* A call of the step: recorded, or issued now when the step goes call by
 * call (when it outgrows the record, what was recorded goes out first). */
static void record(cuda_batch *d, step_op o) {
    if (!d->direct && d->n_ops == d->cap_ops) {
        direct_job j = {d, d->ops, d->n_ops};
        d->direct = 1; /* each call uploads its own ints from now on (ints_at) */
        ranks_run(d, issue_direct, &j);
        d->n_ops = 0;
    }
    if (d->direct) {
        direct_job j = {d, &o, 1};
        ranks_run(d, issue_direct, &j);
    } else {
        d->ops[d->n_ops++] = o;
    }
}

/* A step begins on the other half than the last (whose step, if still
 * running, the host waits for before it plans another). */
static int op_begin(void *state) {
    cuda_batch *d = state;
    d->h = !d->h;
    step_half *h = &d->half[d->h];
    h->used = 0, h->tables_used = 0, h->failed = 0;
    for (int r = 0; r < d->n_ranks; r++) d->rank[r].half[d->h].failed = 0, d->rank[r].half[d->h].error = cudaSuccess;
    d->n_ops = 0, d->direct = 0, d->ran_as = 0, d->ran_kernels = d->ran_copies = -1;
    memset(d->want, 0, (size_t)d->head_rows);
    return d->h;
}

static void op_embed(void *state, const int *tokens, const int *from, const int *pos, int R) {
    (void)pos; /* the GPU's passes take the positions */
    cuda_batch *d = state;
    const int *parts[2] = {tokens, from};
    size_t at = stage_ints(d, parts, from ? 2 : 1, (size_t)R);
    if (at != SIZE_MAX) record(d, (step_op){OP_EMBED, R, 0, from != NULL, at});
}

typedef struct {
    cuda_batch *d;
    const int *stage;
    int offset, n;
} tables_job;

static void put_tables_on(void *arg, int r) {
    tables_job *j = arg;
    cuda_state *c = j->d->rank[r].c;
    if (cudaMemcpyAsync(c->tables + j->offset, j->stage, (size_t)j->n * sizeof(int), cudaMemcpyHostToDevice,
                        c->queue.stream) != cudaSuccess)
        j->d->rank[r].half[j->d->h].failed = 1;
}

/* Straight to every rank's mirror (not part of a recorded step: tables grow
 * at block boundaries, which would change a step's calls every few steps). */
static void op_put_tables(void *state, const int *tables, int offset, int n) {
    cuda_batch *d = state;
    step_half *h = &d->half[d->h];
    if (h->tables_used + (size_t)n > d->n_tables) {
        h->failed = 1;
        return;
    }
    int *stage = h->table_staging + h->tables_used;
    memcpy(stage, tables, (size_t)n * sizeof(int));
    h->tables_used += (size_t)n;
    tables_job j = {d, stage, offset, n};
    ranks_run(d, put_tables_on, &j);
}

/* A pass with prompt runs keeps its step off graphs: which tokens the tiled
 * prefill kernel takes is decided when the pass is issued. Whether it runs
 * in place is part of the call (and so of a graph's key). */
static void op_pass(void *state, int layer, const int *rows, const int *pos, const int *table, int T) {
    cuda_batch *d = state;
    const int *parts[3] = {rows, pos, table};
    size_t at = stage_ints(d, parts, 3, (size_t)T);
    long long flags = (find_runs(pos, table, T, NULL) > 0 ? PASS_RUNS : 0) | (rows_in_order(rows, T) ? PASS_IN_PLACE : 0);
    if (at != SIZE_MAX) record(d, (step_op){OP_PASS, T, layer, flags, at});
}

static void op_copy_rows(void *d, int dst, int src, int n) { record(d, (step_op){OP_COPY_ROWS, n, dst, src, 0}); }

static void op_copy_kv(void *d, size_t from, size_t to, int n) {
    record(d, (step_op){OP_COPY_KV, n, (long long)from, (long long)to, 0});
}

static void op_cache_keep(void *d, int item, int row, int n) { record(d, (step_op){OP_CACHE_KEEP, n, item, row, 0}); }

static void op_cache_take(void *d, int item, int start, int n) { record(d, (step_op){OP_CACHE_TAKE, n, item, start, 0}); }

static void op_rows_from_start(void *state, const int *rows, const int *starts, int n) {
    cuda_batch *d = state;
    const int *parts[2] = {rows, starts};
    size_t at = stage_ints(d, parts, 2, (size_t)n);
    if (at != SIZE_MAX) record(d, (step_op){OP_FROM_START, n, 0, 0, at});
}

static void op_outputs(void *d, int row0, int n, float *logits, float *hidden) {
    record(d, (step_op){OP_OUTPUTS, n, (long long)(intptr_t)logits, (long long)(intptr_t)hidden, (size_t)row0});
}

static void op_head(void *state, const int *rows, int n, const unsigned char *want) {
    cuda_batch *d = state;
    size_t at = n <= d->head_rows ? stage_ints(d, &rows, 1, (size_t)n) : SIZE_MAX;
    if (at == SIZE_MAX) {
        d->half[d->h].failed = 1;
        return;
    }
    memcpy(d->want, want, (size_t)n);
    record(d, (step_op){OP_HEAD, n, 0, 0, at});
}

static polar_status op_launch(void *state, polar_error *err) {
    cuda_batch *d = state;
    step_launch(d);
    for (int r = 0; r < d->n_ranks; r++)
        if (d->rank[r].half[d->h].error != cudaSuccess) return cuda_error(err, d->rank[r].half[d->h].error, "batch step");
    return POLAR_OK;
}

/* Every rank's part of the step done (each host copy of the first rank's, each
 * all-gather of all of them). */
static polar_status op_wait(void *state, int half, const int **ids, polar_error *err) {
    cuda_batch *d = state;
    for (int r = 0; r < d->n_ranks; r++) {
        rank_half *h = &d->rank[r].half[half];
        cudaError_t e = h->error;
        if (e == cudaSuccess) e = cudaEventSynchronize(h->done);
        if (e != cudaSuccess) return cuda_error(err, e, "batch step");
        if (d->rank[r].c->nccl_error != ncclSuccess) return tp_nccl_error(err, d->rank[r].c->nccl_error, "batch step");
        if (h->failed) return polar_fail(err, POLAR_ERR_IO, "cuda: batch step: a copy failed");
    }
    if (d->half[half].failed)
        return polar_fail(err, POLAR_ERR_IO, "cuda: batch step: the step's %zu ints ran out", d->cap_ints);
    if (ids) *ids = d->half[half].host_ids;
    return POLAR_OK;
}

static float *op_host_logits(void *d, int half) { return ((cuda_batch *)d)->half[half].host_logits; }

static polar_status op_copy_logits(void *d, int half, int i, polar_error *err) {
    return step_copy_logits(d, half, i, err);
}

static int op_step_graph(const void *d) { return ((const cuda_batch *)d)->ran_as; }

static int op_graph_kernels(const void *state, int *copies) {
    const cuda_batch *d = state;
    if (copies) *copies = d->ran_copies;
    return d->ran_kernels;
}

/* Rank 0's (every rank launches alike). */
static const char *op_launches(const void *d) { return cuda_state_launches(((const cuda_batch *)d)->rank[0].c); }

/* Rank 0's: the model's weights on its GPU, and what its state asked for. */
static int op_memory(const void *state, polar_device_memory *out) {
    const cuda_state *c = ((const cuda_batch *)state)->rank[0].c;
    *out = (polar_device_memory){.weights = c->w->allocs.bytes, .kv = c->kv_bytes,
                                 .workspaces = c->allocs.bytes - c->kv_bytes + CUDA_GEMM_WORKSPACE};
    return 1;
}

static const batch_device_ops cuda_batch_ops = {
    .async = 1, .begin = op_begin, .put_tables = op_put_tables, .embed = op_embed, .pass = op_pass,
    .copy_rows = op_copy_rows, .copy_kv = op_copy_kv, .cache_keep = op_cache_keep, .cache_take = op_cache_take,
    .rows_from_start = op_rows_from_start, .outputs = op_outputs, .head = op_head, .launch = op_launch,
    .wait = op_wait, .host_logits = op_host_logits, .copy_logits = op_copy_logits, .step_graph = op_step_graph,
    .graph_kernels = op_graph_kernels, .launches = op_launches, .memory = op_memory, .free = cuda_batch_free,
};

polar_status cuda_batch_device(const polar_model *m, const batch_device_shape *shape, batch_device *out,
                               polar_error *err) {
    cuda_batch *d = NULL;
    polar_status st = cuda_batch_create(m, shape, &d, err);
    if (st == POLAR_OK) *out = (batch_device){&cuda_batch_ops, d};
    return st;
}

#endif
