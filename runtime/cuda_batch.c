/* The device side of a batch (backend.h): runtime/batch.c plans each step
 * on the host and calls these to run it on the GPU. A layer pass gathers
 * its rows of the step's residual into the workspace of its cuda_state
 * (which holds the KV pool and the tables' mirror), runs cuda_layer_forward
 * with each token's position and block table, and scatters them back. The ints a step needs on the device
 * (tokens, each pass's rows, positions and tables, the head rows) go
 * through one pinned staging area, each at its own offset, so nothing is
 * overwritten before its copy has run; the offsets start again after the
 * step's sync (block tables through an area of their own, copied at once).
 *
 * A step's calls are recorded and issued at its end. A step whose calls
 * equal the previous step's (a decode step of the same sequences and
 * programs: only tokens, positions and tables change, and those are read
 * from the staging area) is captured as a graph, and later steps of that
 * shape replay it: one launch for the whole step instead of a dozen per
 * pass. A step with a prompt chunk through the tiled prefill kernel (a run,
 * whose count and lengths change from step to step) is never captured.
 * POLAR_CUDA_GRAPHS=0 turns this off. Built with POLAR_CUDA; without
 * it there is no device batch to create. */
#include "batch_device.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifndef POLAR_CUDA

polar_status cuda_batch_create(const polar_model *m, const cuda_batch_shape *shape, cuda_batch **out,
                               polar_error *err) {
    (void)m, (void)shape;
    *out = NULL;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build it with make cuda)");
}

void cuda_batch_free(cuda_batch *d) { (void)d; }
void cuda_batch_begin(cuda_batch *d) { (void)d; }
void cuda_batch_embed(cuda_batch *d, const int *tokens, int R) { (void)d, (void)tokens, (void)R; }
void cuda_batch_put_tables(cuda_batch *d, const int *tables, int offset, int n) {
    (void)d, (void)tables, (void)offset, (void)n;
}
void cuda_batch_pass(cuda_batch *d, int layer, const int *rows, const int *pos, const int *table, int T) {
    (void)d, (void)layer, (void)rows, (void)pos, (void)table, (void)T;
}
void cuda_batch_copy_rows(cuda_batch *d, int dst, int src, int n) { (void)d, (void)dst, (void)src, (void)n; }
void cuda_batch_copy_kv(cuda_batch *d, size_t from, size_t to, int n) { (void)d, (void)from, (void)to, (void)n; }
void cuda_batch_cache_keep(cuda_batch *d, int item, int row, int n) { (void)d, (void)item, (void)row, (void)n; }
void cuda_batch_cache_take(cuda_batch *d, int item, int start, int n) { (void)d, (void)item, (void)start, (void)n; }
void cuda_batch_rows_from_start(cuda_batch *d, const int *rows, const int *starts, int n) {
    (void)d, (void)rows, (void)starts, (void)n;
}
polar_status cuda_batch_head(cuda_batch *d, const int *rows, int n, const unsigned char *want, int *ids,
                             polar_error *err) {
    (void)d, (void)rows, (void)n, (void)want, (void)ids;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}
float *cuda_batch_host_logits(cuda_batch *d) {
    (void)d;
    return NULL;
}
polar_status cuda_batch_copy_logits(cuda_batch *d, int i, polar_error *err) {
    (void)d, (void)i;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}
polar_status cuda_batch_finish(cuda_batch *d, polar_error *err) {
    (void)d;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend");
}
int cuda_batch_step_graph(const cuda_batch *d) {
    (void)d;
    return 0;
}
const char *cuda_batch_launches(const cuda_batch *d) {
    (void)d;
    return NULL;
}

#else

#include "../kernels/cpu/ops.h"
#include "cuda_internal.h"

/* The host's block ids index the device's pool */
_Static_assert(CUDA_KV_BLOCK == CPU_KV_BLOCK, "one block size on the host and the device");

#define STEP_GRAPHS 4 /* captured step shapes kept (least recently used replaced) */

/* One device call of a step, as recorded. Its ints (if any) are in the
 * staging area at `at`: a replayed graph copies them from there again. */
typedef enum { OP_EMBED, OP_PASS, OP_COPY_ROWS, OP_COPY_KV, OP_CACHE_KEEP, OP_CACHE_TAKE, OP_FROM_START, OP_HEAD } op_kind;
typedef struct {
    int kind, n;  /* n: rows (tokens) */
    long long a, b; /* layer, prompt runs (0/1); dst, src rows; from, to pool rows; item, row; item, start row */
    size_t at;
} step_op;
_Static_assert(sizeof(step_op) == 32, "no padding: recorded calls are compared with memcmp");

typedef struct {
    cudaGraphExec_t exec; /* NULL: free */
    step_op *ops;         /* [cap_ops] the calls it runs */
    int n_ops;
    unsigned char *want;  /* [head_rows] the head rows it copies to the host */
    unsigned long last_used;
} step_graph;

struct cuda_batch {
    cuda_state *c;         /* weights, workspaces for `rows` tokens, stream, cuBLASLt, the KV pool and tables */
    int rows;
    size_t kv_dim;
    float *x;              /* [rows, hidden] the step's residual streams */
    float *cache_rows;     /* [cache_items * CUDA_KV_BLOCK, hidden] the prefix cache's residual rows */
    float *start;          /* [start_rows, hidden] rows cached prompt blocks start from, per sequence */
    int *ints;             /* [cap_ints] the step's uploaded ints */
    int *staging;          /* pinned host [cap_ints], at the same offsets */
    size_t used, cap_ints;
    int *table_staging;    /* pinned host [n_tables]: block tables on their way to the mirror */
    size_t tables_used, n_tables;
    cuda_run *runs;        /* [rows / (DECODE_TOKENS + 1) + 1] a pass's prompt runs */
    int head_rows;
    float *logits;         /* [head_rows, vocab] the last head's logits */
    int *ids;              /* [head_rows] their argmax */
    float *host_logits;    /* pinned host [head_rows, vocab]: the rows the host asked for */
    int *host_ids;         /* pinned host [head_rows] */
    /* the step's calls, and the graphs of earlier steps */
    step_op *ops;          /* [cap_ops] */
    int n_ops, cap_ops;
    unsigned char *want;   /* [head_rows] this step's head rows wanted on the host */
    int direct;            /* calls go out as they come: graphs off, or the step outgrew cap_ops */
    int graphs;            /* 0: POLAR_CUDA_GRAPHS=0, or a capture or graph launch failed once */
    step_graph last;       /* the previous step's calls (never a graph) */
    step_graph graph[STEP_GRAPHS];
    unsigned long clock;
    int ran_as;            /* the last step: 0 issued call by call, 1 replayed, 2 captured and run */
    int failed;            /* a copy failed or the step wanted more than cap_ints: finish reports it */
};

polar_status cuda_batch_create(const polar_model *m, const cuda_batch_shape *shape, cuda_batch **out,
                               polar_error *err) {
    *out = NULL;
    const polar_arch *a = &m->arch;
    const cuda_batch_shape *sh = shape;
    cuda_batch *d = calloc(1, sizeof *d);
    if (!d) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    cuda_state_shape cs = {.chunk = sh->rows, .n_blocks = sh->n_blocks, .n_tables = sh->tables};
    polar_status st = cuda_state_create(m, &cs, &d->c, err);
    if (st != POLAR_OK) {
        free(d);
        return st;
    }
    size_t H = (size_t)a->hidden, R = (size_t)sh->rows, V = (size_t)a->vocab, HR = (size_t)sh->head_rows;
    d->rows = sh->rows, d->head_rows = sh->head_rows;
    d->kv_dim = (size_t)a->n_kv_heads * a->head_dim;
    /* tokens, a (row, pos, table) per row and pass, a (row, start) per row
     * from the cache, head rows */
    d->cap_ints = R + 3 * R * sh->cap_program + 2 * R + R;
    d->n_tables = (size_t)sh->tables;
    /* embed, a pass per row and entry, a few copies per row and block */
    d->cap_ops = (int)(2 * R * sh->cap_program + 4 * R + 8);
    const char *env = getenv("POLAR_CUDA_GRAPHS");
    d->graphs = !(env && !strcmp(env, "0"));
    int ok = (d->x = cuda_dev_alloc(d->c, R * H * sizeof(float))) &&
             (d->ints = cuda_dev_alloc(d->c, d->cap_ints * sizeof(int))) &&
             (d->logits = cuda_dev_alloc(d->c, HR * V * sizeof(float))) &&
             (d->ids = cuda_dev_alloc(d->c, HR * sizeof(int))) &&
             cudaMallocHost((void **)&d->staging, d->cap_ints * sizeof(int)) == cudaSuccess &&
             cudaMallocHost((void **)&d->table_staging, d->n_tables * sizeof(int)) == cudaSuccess &&
             cudaMallocHost((void **)&d->host_logits, HR * V * sizeof(float)) == cudaSuccess &&
             cudaMallocHost((void **)&d->host_ids, HR * sizeof(int)) == cudaSuccess &&
             (d->ops = malloc((size_t)d->cap_ops * sizeof *d->ops)) && (d->want = calloc(HR, 1)) &&
             (d->runs = malloc((R / (DECODE_TOKENS + 1) + 1) * sizeof *d->runs));
    for (int i = 0; ok && d->graphs && i <= STEP_GRAPHS; i++) {
        step_graph *g = i < STEP_GRAPHS ? &d->graph[i] : &d->last;
        ok = (g->ops = malloc((size_t)d->cap_ops * sizeof *d->ops)) && (g->want = calloc(HR, 1));
    }
    if (ok && sh->cache_items)
        ok = (d->cache_rows = cuda_dev_alloc(d->c, (size_t)sh->cache_items * CUDA_KV_BLOCK * H * sizeof(float))) &&
             (d->start = cuda_dev_alloc(d->c, (size_t)sh->start_rows * H * sizeof(float)));
    if (!ok) {
        cuda_batch_free(d);
        return polar_fail(err, POLAR_ERR_NOMEM,
                          "device cuda: out of GPU or pinned host memory for the batch (a KV pool of %d blocks, %d rows "
                          "per step, a prefix cache of %d items, %d rows of logits on both sides)",
                          sh->n_blocks, sh->rows, sh->cache_items, sh->head_rows);
    }
    d->direct = !d->graphs;
    *out = d;
    return POLAR_OK;
}

void cuda_batch_free(cuda_batch *d) {
    if (!d) return;
    if (d->staging) cudaFreeHost(d->staging);
    if (d->table_staging) cudaFreeHost(d->table_staging);
    if (d->host_logits) cudaFreeHost(d->host_logits);
    if (d->host_ids) cudaFreeHost(d->host_ids);
    for (int i = 0; i <= STEP_GRAPHS; i++) {
        step_graph *g = i < STEP_GRAPHS ? &d->graph[i] : &d->last;
        if (g->exec) cudaGraphExecDestroy(g->exec);
        free(g->ops);
        free(g->want);
    }
    free(d->ops);
    free(d->want);
    free(d->runs);
    cuda_state_free(d->c); /* the pool, tables and rows go with the state's own buffers */
    free(d);
}

/* n_parts arrays of n ints each into the step's staging area, one after
 * the other; their offset (SIZE_MAX when the area is spent). */
static size_t stage_ints(cuda_batch *d, const int *const *parts, int n_parts, size_t n) {
    size_t total = (size_t)n_parts * n, at = d->used;
    if (at + total > d->cap_ints) {
        d->failed = 1;
        return SIZE_MAX;
    }
    for (int i = 0; i < n_parts; i++) memcpy(d->staging + at + i * n, parts[i], n * sizeof(int));
    d->used += total;
    return at;
}

/* The staged ints at..at+n to the same offset on the device; their address there. */
static const int *upload(cuda_batch *d, size_t at, size_t n) {
    if (cudaMemcpyAsync(d->ints + at, d->staging + at, n * sizeof(int), cudaMemcpyHostToDevice, d->c->queue.stream) !=
        cudaSuccess)
        d->failed = 1;
    return d->ints + at;
}

/* n f32 rows of the residual width, device to device. */
static void copy_f32_rows(cuda_batch *d, float *dst, const float *src, int n) {
    size_t bytes = (size_t)n * d->c->m->arch.hidden * sizeof(float);
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->c->queue.stream) != cudaSuccess) d->failed = 1;
}

/* Head row i's logits to the pinned host rows. */
static cudaError_t row_to_host(cuda_batch *d, int i) {
    size_t V = (size_t)d->c->m->arch.vocab;
    return cudaMemcpyAsync(d->host_logits + (size_t)i * V, d->logits + (size_t)i * V, V * sizeof(float),
                           cudaMemcpyDeviceToHost, d->c->queue.stream);
}

/* The runs of more than DECODE_TOKENS tokens among T that are consecutive
 * positions of one sequence (the same table) into runs (when not NULL);
 * their count. */
static int find_runs(const int *pos, const int *table, int T, cuda_run *runs) {
    int n = 0;
    for (int t0 = 0, len; t0 < T; t0 += len) {
        for (len = 1; t0 + len < T && table[t0 + len] == table[t0] && pos[t0 + len] == pos[t0] + len; len++) {
        }
        if (len <= DECODE_TOKENS) continue;
        if (runs) runs[n] = (cuda_run){t0, len, table[t0]};
        n++;
    }
    return n;
}

/* Queue one recorded call on the stream. */
static void issue(cuda_batch *d, const step_op *o) {
    cuda_state *c = d->c;
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab, n = o->n;
    size_t Hs = (size_t)H;
    cudaStream_t s = c->queue.stream;
    const cuda_queue *q = &c->queue;
    switch ((op_kind)o->kind) {
    case OP_EMBED:
        cuda_embed(d->x, c->embed, upload(d, o->at, (size_t)n), n, H, q);
        break;
    case OP_PASS: {
        const int *r = upload(d, o->at, 3 * (size_t)n), *host = d->staging + o->at;
        cuda_kv_map map = {.pos = r + n, .table = r + 2 * n, .tables = c->tables};
        int n_runs = o->b ? find_runs(host + n, host + 2 * n, n, d->runs) : 0;
        cuda_copy_rows(c->x, d->x, NULL, r, n, H, q);
        cuda_layer_forward(c, &c->layers[o->a], n, &map, d->runs, n_runs);
        cuda_copy_rows(d->x, c->x, r, NULL, n, H, q);
        break;
    }
    case OP_COPY_ROWS:
        copy_f32_rows(d, d->x + o->a * Hs, d->x + o->b * Hs, n);
        break;
    case OP_COPY_KV: {
        size_t w = d->kv_dim, bytes = (size_t)n * w * sizeof(bf16);
        if (cudaMemcpyAsync(c->k_pool + o->b * w, c->k_pool + o->a * w, bytes, cudaMemcpyDeviceToDevice, s) !=
                cudaSuccess ||
            cudaMemcpyAsync(c->v_pool + o->b * w, c->v_pool + o->a * w, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
            d->failed = 1;
        break;
    }
    case OP_CACHE_KEEP:
        copy_f32_rows(d, d->cache_rows + o->a * CUDA_KV_BLOCK * Hs, d->x + o->b * Hs, n);
        break;
    case OP_CACHE_TAKE:
        copy_f32_rows(d, d->start + o->b * Hs, d->cache_rows + o->a * CUDA_KV_BLOCK * Hs, n);
        break;
    case OP_FROM_START: {
        const int *r = upload(d, o->at, 2 * (size_t)n);
        cuda_copy_rows(d->x, d->start, r, r + n, n, H, q);
        break;
    }
    case OP_HEAD: {
        const int *r = upload(d, o->at, (size_t)n);
        cuda_copy_rows(c->x, d->x, NULL, r, n, H, q);
        cuda_rmsnorm(c->xn, c->x, c->final_norm, n, H, (float)a->rms_eps, q);
        /* in slices of LOGIT_ROWS rows, as a session's head (a CPU batch
         * rounding like the GPU mirrors the slices) */
        for (int r0 = 0; r0 < n; r0 += LOGIT_ROWS) {
            int k = n - r0 < LOGIT_ROWS ? n - r0 : LOGIT_ROWS;
            cuda_mm(c, d->logits + (size_t)r0 * V, c->xn + (size_t)r0 * H, c->lm_head, NULL, k, V, H, 0);
        }
        cuda_argmax_rows(d->ids, d->logits, n, V, q);
        if (cudaMemcpyAsync(d->host_ids, d->ids, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, s) != cudaSuccess)
            d->failed = 1;
        for (int i = 0; i < n; i++)
            if (d->want[i] && row_to_host(d, i) != cudaSuccess) d->failed = 1;
        break;
    }
    }
}

/* A call of the step: recorded, or issued now when the step goes call by
 * call (when it outgrows the record, what was recorded goes out first). */
static void record(cuda_batch *d, step_op o) {
    if (!d->direct && d->n_ops == d->cap_ops) {
        for (int i = 0; i < d->n_ops; i++) issue(d, &d->ops[i]);
        d->n_ops = 0, d->direct = 1;
    }
    if (d->direct) issue(d, &o);
    else d->ops[d->n_ops++] = o;
}

/* Whether the step's recorded calls (and head rows wanted on the host) are g's. */
static int same_calls(const cuda_batch *d, const step_graph *g) {
    if (g->n_ops != d->n_ops || memcmp(g->ops, d->ops, (size_t)d->n_ops * sizeof *d->ops)) return 0;
    const step_op *last = &d->ops[d->n_ops - 1];
    return last->kind != OP_HEAD || !memcmp(g->want, d->want, (size_t)last->n);
}

/* The step's recorded calls into g. */
static void keep_calls(const cuda_batch *d, step_graph *g) {
    memcpy(g->ops, d->ops, (size_t)d->n_ops * sizeof *d->ops);
    g->n_ops = d->n_ops;
    memcpy(g->want, d->want, (size_t)d->head_rows);
}

/* Capture the recorded calls into g and instantiate it. */
static cudaError_t capture(cuda_batch *d, step_graph *g) {
    cudaStream_t s = d->c->queue.stream;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return e;
    for (int i = 0; i < d->n_ops; i++) issue(d, &d->ops[i]);
    e = cudaStreamEndCapture(s, &graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        g->exec = NULL;
        return e;
    }
    keep_calls(d, g);
    return cudaSuccess;
}

/* The recorded calls go out: a graph of this shape replayed, or captured
 * when the previous step had the same calls, or else one by one. */
static void run_recorded(cuda_batch *d) {
    d->ran_as = 0;
    if (d->direct || !d->n_ops) return;
    for (int i = 0; i < d->n_ops; i++)
        if (d->ops[i].kind == OP_PASS && d->ops[i].b) { /* prompt runs: call by call, and no model for the next step */
            d->last.n_ops = 0;
            for (int j = 0; j < d->n_ops; j++) issue(d, &d->ops[j]);
            return;
        }
    step_graph *g = NULL, *lru = &d->graph[0];
    for (int i = 0; i < STEP_GRAPHS && !g; i++) {
        step_graph *t = &d->graph[i];
        if (t->exec && same_calls(d, t)) g = t;
        if (!t->exec ? lru->exec != NULL : lru->exec && t->last_used < lru->last_used) lru = t;
    }
    if (!g && same_calls(d, &d->last)) {
        if (lru->exec) cudaGraphExecDestroy(lru->exec);
        lru->exec = NULL;
        int failed = d->failed; /* calls refused by a dead capture are no failure of the step */
        if (capture(d, lru) == cudaSuccess) {
            g = lru, d->ran_as = 1;
        } else { /* again at the next step, without overlap if it was on; else never again */
            d->failed = failed;
            if (!cuda_state_capture_failed(d->c)) d->graphs = 0;
        }
    }
    keep_calls(d, &d->last);
    if (g) {
        if (cudaGraphLaunch(g->exec, d->c->queue.stream) == cudaSuccess) {
            g->last_used = ++d->clock;
            d->ran_as++;
            return;
        }
        (void)cudaGetLastError(); /* the calls go out one by one instead, from now on */
        d->graphs = 0;
    }
    d->ran_as = 0;
    for (int i = 0; i < d->n_ops; i++) issue(d, &d->ops[i]);
}

void cuda_batch_begin(cuda_batch *d) {
    (void)cudaGetLastError();
    d->n_ops = 0, d->direct = !d->graphs, d->ran_as = 0;
}

void cuda_batch_embed(cuda_batch *d, const int *tokens, int R) {
    size_t at = stage_ints(d, &tokens, 1, (size_t)R);
    if (at != SIZE_MAX) record(d, (step_op){OP_EMBED, R, 0, 0, at});
}

/* Straight to the mirror (not part of a recorded step: tables grow at block
 * boundaries, which would change a step's calls every few steps). */
void cuda_batch_put_tables(cuda_batch *d, const int *tables, int offset, int n) {
    if (d->tables_used + (size_t)n > d->n_tables) {
        d->failed = 1;
        return;
    }
    int *stage = d->table_staging + d->tables_used;
    memcpy(stage, tables, (size_t)n * sizeof(int));
    d->tables_used += (size_t)n;
    if (cudaMemcpyAsync(d->c->tables + offset, stage, (size_t)n * sizeof(int), cudaMemcpyHostToDevice,
                        d->c->queue.stream) != cudaSuccess)
        d->failed = 1;
}

/* A pass with prompt runs (b = 1) keeps its step off graphs: which tokens
 * the tiled prefill kernel takes is decided when the pass is issued. */
void cuda_batch_pass(cuda_batch *d, int layer, const int *rows, const int *pos, const int *table, int T) {
    const int *parts[3] = {rows, pos, table};
    size_t at = stage_ints(d, parts, 3, (size_t)T);
    if (at != SIZE_MAX) record(d, (step_op){OP_PASS, T, layer, find_runs(pos, table, T, NULL) > 0, at});
}

void cuda_batch_copy_rows(cuda_batch *d, int dst, int src, int n) { record(d, (step_op){OP_COPY_ROWS, n, dst, src, 0}); }

void cuda_batch_copy_kv(cuda_batch *d, size_t from, size_t to, int n) {
    record(d, (step_op){OP_COPY_KV, n, (long long)from, (long long)to, 0});
}

void cuda_batch_cache_keep(cuda_batch *d, int item, int row, int n) {
    record(d, (step_op){OP_CACHE_KEEP, n, item, row, 0});
}

void cuda_batch_cache_take(cuda_batch *d, int item, int start, int n) {
    record(d, (step_op){OP_CACHE_TAKE, n, item, start, 0});
}

void cuda_batch_rows_from_start(cuda_batch *d, const int *rows, const int *starts, int n) {
    const int *parts[2] = {rows, starts};
    size_t at = stage_ints(d, parts, 2, (size_t)n);
    if (at != SIZE_MAX) record(d, (step_op){OP_FROM_START, n, 0, 0, at});
}

polar_status cuda_batch_head(cuda_batch *d, const int *rows, int n, const unsigned char *want, int *ids,
                             polar_error *err) {
    size_t at = n <= d->head_rows ? stage_ints(d, &rows, 1, (size_t)n) : SIZE_MAX;
    if (at == SIZE_MAX) {
        d->failed = 1;
    } else {
        memcpy(d->want, want, (size_t)n);
        record(d, (step_op){OP_HEAD, n, 0, 0, at});
    }
    polar_status st = cuda_batch_finish(d, err);
    if (st == POLAR_OK) memcpy(ids, d->host_ids, (size_t)n * sizeof(int));
    return st;
}

float *cuda_batch_host_logits(cuda_batch *d) { return d->host_logits; }

int cuda_batch_step_graph(const cuda_batch *d) { return d->ran_as; }

const char *cuda_batch_launches(const cuda_batch *d) { return cuda_state_launches(d->c); }

polar_status cuda_batch_copy_logits(cuda_batch *d, int i, polar_error *err) {
    cudaError_t e = row_to_host(d, i);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->c->queue.stream);
    return e == cudaSuccess ? POLAR_OK : cuda_error(err, e, "copying a batch row's logits");
}

polar_status cuda_batch_finish(cuda_batch *d, polar_error *err) {
    if (!d->failed) run_recorded(d);
    cudaError_t e = cudaStreamSynchronize(d->c->queue.stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    int failed = d->failed;
    d->used = 0, d->tables_used = 0, d->failed = 0, d->n_ops = 0;
    if (e != cudaSuccess) return cuda_error(err, e, "batch step");
    if (failed)
        return polar_fail(err, POLAR_ERR_IO, "cuda: batch step: a copy to the device failed or the step's %zu ints ran out",
                          d->cap_ints);
    return POLAR_OK;
}

#endif

/* The calls of batch_device.h on the GPU (or, without CUDA, the stubs above). */
static void op_begin(void *d) { cuda_batch_begin(d); }
static void op_put_tables(void *d, const int *tables, int offset, int n) { cuda_batch_put_tables(d, tables, offset, n); }
static void op_embed(void *d, const int *tokens, const int *pos, int R) {
    (void)pos; /* the GPU's passes take the positions */
    cuda_batch_embed(d, tokens, R);
}
static void op_pass(void *d, int layer, const int *rows, const int *pos, const int *table, int T) {
    cuda_batch_pass(d, layer, rows, pos, table, T);
}
static void op_copy_rows(void *d, int dst, int src, int n) { cuda_batch_copy_rows(d, dst, src, n); }
static void op_copy_kv(void *d, size_t from, size_t to, int n) { cuda_batch_copy_kv(d, from, to, n); }
static void op_cache_keep(void *d, int item, int row, int n) { cuda_batch_cache_keep(d, item, row, n); }
static void op_cache_take(void *d, int item, int start, int n) { cuda_batch_cache_take(d, item, start, n); }
static void op_rows_from_start(void *d, const int *rows, const int *starts, int n) {
    cuda_batch_rows_from_start(d, rows, starts, n);
}
static polar_status op_head(void *d, const int *rows, int n, const unsigned char *want, int *ids, polar_error *err) {
    return cuda_batch_head(d, rows, n, want, ids, err);
}
static float *op_host_logits(void *d) { return cuda_batch_host_logits(d); }
static polar_status op_copy_logits(void *d, int i, polar_error *err) { return cuda_batch_copy_logits(d, i, err); }
static polar_status op_finish(void *d, polar_error *err) { return cuda_batch_finish(d, err); }
static int op_step_graph(const void *d) { return cuda_batch_step_graph(d); }
static const char *op_launches(const void *d) { return cuda_batch_launches(d); }
static void op_free(void *d) { cuda_batch_free(d); }

const batch_device_ops cuda_batch_ops = {
    .begin = op_begin, .put_tables = op_put_tables, .embed = op_embed, .pass = op_pass, .copy_rows = op_copy_rows,
    .copy_kv = op_copy_kv, .cache_keep = op_cache_keep, .cache_take = op_cache_take,
    .rows_from_start = op_rows_from_start, .head = op_head, .host_logits = op_host_logits,
    .copy_logits = op_copy_logits, .finish = op_finish, .step_graph = op_step_graph,
    .launches = op_launches, .free = op_free,
};
