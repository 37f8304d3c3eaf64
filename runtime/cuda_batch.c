/* A batch's steps on the GPU (batch_device.h). A layer pass gathers its
 * rows of the step's residual into the cuda_state's workspace (or, when
 * they are simply rows 0..T-1, runs on the step's rows in place), runs
 * cuda_layer_forward with each token's position and block table, and
 * scatters them back. The ints a step needs on the device (tokens, each
 * pass's rows, positions and tables, the head rows) are staged in its
 * half's pinned area, each at its own offset, and go up in one copy when
 * the step is launched (block tables through an area of their own, copied
 * at once).
 *
 * A step's calls are recorded and issued at its launch. A step whose calls
 * equal the previous step's (a decode step of the same sequences and
 * programs: only tokens, positions and tables change, and those are read
 * from the uploaded ints) is captured as a graph, one per half, and later
 * steps of that shape replay it: one launch for the whole step instead of a
 * dozen per pass. A step with a prompt chunk through the tiled prefill
 * kernel (a run, whose count and lengths change from step to step) or with
 * outputs to the caller's memory is never captured. POLAR_CUDA_GRAPHS=0
 * turns graphs off. Built with POLAR_CUDA; without it there is no GPU to
 * run a batch on. */
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

#include "cuda_internal.h"

/* The host's block ids index the device's pool */
_Static_assert(CUDA_KV_BLOCK == CPU_KV_BLOCK, "one block size on the host and the device");

#define STEP_GRAPHS 16 /* captured step shapes kept, both halves (least recently used replaced) */

/* One device call of a step, as recorded. Its ints (if any) are in the
 * half's staging area at `at`. */
typedef enum {
    OP_EMBED,       /* n rows; b: with `from` (n more ints) */
    OP_PASS,        /* n rows; a: layer, b: PASS_RUNS | PASS_IN_PLACE */
    OP_COPY_ROWS,   /* n rows: a dst, b src */
    OP_COPY_KV,     /* n pool rows: a from, b to */
    OP_CACHE_KEEP,  /* n rows: a item, b row */
    OP_CACHE_TAKE,  /* n rows: a item, b start row */
    OP_FROM_START,  /* n rows: rows and their start rows at `at` */
    OP_OUTPUTS,     /* n rows from row `at`: a the host logits, b the host hidden states (0: none) */
    OP_HEAD,        /* n rows at `at` */
} op_kind;
enum {
    PASS_RUNS = 1,     /* with prompt runs: through the tiled prefill attention */
    PASS_IN_PLACE = 2, /* its rows are 0..n-1: run on the step's rows without a gather */
};
typedef struct {
    int kind, n;
    long long a, b;
    size_t at;
} step_op;
_Static_assert(sizeof(step_op) == 32, "no padding: recorded calls are compared with memcmp");

typedef struct {
    cudaGraphExec_t exec; /* NULL: free */
    int half;             /* the half whose buffers it was captured on */
    step_op *ops;         /* [graph_ops] the calls it runs */
    int n_ops;
    unsigned char *want;  /* [head_rows] the head rows it copies to the host */
    unsigned long last_used;
} step_graph;

/* What one step uses of its own, so that the next may be planned and
 * queued while it runs. */
typedef struct {
    int *ints;            /* [cap_ints] the step's uploaded ints */
    int *staging;         /* pinned host [cap_ints], at the same offsets */
    size_t used;
    int *table_staging;   /* pinned host [n_tables]: block tables on their way to the mirror */
    size_t tables_used;
    float *logits;        /* [head_rows, vocab] its head's logits (in the batch's logits buffer) */
    int *ids;             /* [head_rows] their argmax */
    int *host_ids;        /* mapped host [head_rows]: the argmax, written there by the kernel */
    int *host_ids_dev;    /* the same memory, as the device addresses it */
    float *host_logits;   /* pinned host [head_rows, vocab]: the rows the host asked for */
    cudaEvent_t done;     /* recorded after the step */
    int failed;           /* a copy failed, the ints ran out, or a launch failed: wait reports it */
    cudaError_t error;    /* the CUDA error of issuing it, if any */
} step_half;

typedef struct {
    cuda_state *c;         /* weights, workspaces for `rows` tokens, stream, cuBLASLt, the KV pool and tables */
    int rows;
    size_t kv_dim;
    float *x;              /* [rows, hidden] the step's residual streams */
    float *cache_rows;     /* [cache_items * CUDA_KV_BLOCK, hidden] the prefix cache's residual rows */
    float *start;          /* [start_rows, hidden] rows cached prompt blocks start from, per sequence */
    float *logits;         /* [max(2 x head_rows, LOGIT_ROWS), vocab]: each half's head, or an outputs slice */
    size_t cap_ints, n_tables;
    step_half half[2];
    int h;                 /* the half of the step being recorded */
    cuda_run *runs;        /* [rows / (DECODE_TOKENS + 1) + 1] a pass's prompt runs */
    int head_rows;
    /* the step's calls, and the graphs of earlier steps */
    step_op *ops;          /* [cap_ops] */
    int n_ops, cap_ops, graph_ops;
    unsigned char *want;   /* [head_rows] this step's head rows wanted on the host */
    int direct;            /* the step outgrew cap_ops: its calls go out as they come */
    int graphs;            /* 0: POLAR_CUDA_GRAPHS=0, or a capture or graph launch failed once */
    step_graph last;       /* the previous step's calls (never a graph) */
    step_graph graph[STEP_GRAPHS];
    unsigned long clock;
    int ran_as;            /* the last step: 0 issued call by call, 1 replayed, 2 captured and run */
} cuda_batch;

static void cuda_batch_free(void *state) {
    cuda_batch *d = state;
    if (!d) return;
    for (int i = 0; i < 2; i++) {
        step_half *h = &d->half[i];
        if (h->staging) cudaFreeHost(h->staging);
        if (h->table_staging) cudaFreeHost(h->table_staging);
        if (h->host_ids) cudaFreeHost(h->host_ids);
        if (h->host_logits) cudaFreeHost(h->host_logits);
        if (h->done) cudaEventDestroy(h->done);
    }
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

static int half_init(cuda_batch *d, step_half *h, size_t V, size_t HR) {
    return (h->ints = cuda_dev_alloc(d->c, d->cap_ints * sizeof(int))) && (h->ids = cuda_dev_alloc(d->c, HR * sizeof(int))) &&
           cudaMallocHost((void **)&h->staging, d->cap_ints * sizeof(int)) == cudaSuccess &&
           cudaMallocHost((void **)&h->table_staging, d->n_tables * sizeof(int)) == cudaSuccess &&
           cudaMallocHost((void **)&h->host_logits, HR * V * sizeof(float)) == cudaSuccess &&
           cudaHostAlloc((void **)&h->host_ids, HR * sizeof(int), cudaHostAllocMapped) == cudaSuccess &&
           cudaHostGetDevicePointer((void **)&h->host_ids_dev, h->host_ids, 0) == cudaSuccess &&
           cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming) == cudaSuccess;
}

static polar_status cuda_batch_create(const polar_model *m, const batch_device_shape *sh, cuda_batch **out,
                                      polar_error *err) {
    *out = NULL;
    const polar_arch *a = &m->arch;
    cuda_batch *d = calloc(1, sizeof *d);
    if (!d) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    cuda_state_shape cs = {.chunk = sh->rows, .n_blocks = sh->n_blocks, .n_tables = sh->tables};
    polar_status st = cuda_state_create(m, &cs, &d->c, err);
    if (st != POLAR_OK) {
        free(d);
        return st;
    }
    size_t H = (size_t)a->hidden, R = (size_t)sh->rows, V = (size_t)a->vocab, HR = (size_t)sh->head_rows;
    size_t logit_rows = 2 * HR > LOGIT_ROWS ? 2 * HR : LOGIT_ROWS;
    d->rows = sh->rows, d->head_rows = sh->head_rows;
    d->kv_dim = (size_t)a->n_kv_heads * a->head_dim;
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
    int ok = (d->x = cuda_dev_alloc(d->c, R * H * sizeof(float))) &&
             (d->logits = cuda_dev_alloc(d->c, logit_rows * V * sizeof(float))) && half_init(d, &d->half[0], V, HR) &&
             half_init(d, &d->half[1], V, HR) && (d->ops = malloc((size_t)d->cap_ops * sizeof *d->ops)) &&
             (d->want = calloc(HR, 1)) && (d->runs = malloc((R / (DECODE_TOKENS + 1) + 1) * sizeof *d->runs));
    for (int i = 0; ok && i <= STEP_GRAPHS; i++) {
        step_graph *g = i < STEP_GRAPHS ? &d->graph[i] : &d->last;
        ok = (g->ops = malloc((size_t)d->graph_ops * sizeof *d->ops)) && (g->want = calloc(HR, 1));
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
    d->half[0].logits = d->logits, d->half[1].logits = d->logits + HR * V;
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

/* The staged ints at..at+n on the device: uploaded with the step, or (a
 * step going out call by call) now. */
static const int *ints_at(cuda_batch *d, size_t at, size_t n) {
    step_half *h = &d->half[d->h];
    if (d->direct && cudaMemcpyAsync(h->ints + at, h->staging + at, n * sizeof(int), cudaMemcpyHostToDevice,
                                     d->c->queue.stream) != cudaSuccess)
        h->failed = 1;
    return h->ints + at;
}

/* n f32 rows of the residual width, device to device. */
static void copy_f32_rows(cuda_batch *d, float *dst, const float *src, int n) {
    size_t bytes = (size_t)n * d->c->m->arch.hidden * sizeof(float);
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->c->queue.stream) != cudaSuccess)
        d->half[d->h].failed = 1;
}

/* Device to host, on the stream; a failure fails the step. */
static void to_host(cuda_batch *d, void *dst, const void *src, size_t bytes) {
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->c->queue.stream) != cudaSuccess)
        d->half[d->h].failed = 1;
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

/* Whether rows[0..n) are 0..n-1: the pass runs on the step's rows in place. */
static int rows_in_order(const int *rows, int n) {
    for (int i = 0; i < n; i++)
        if (rows[i] != i) return 0;
    return 1;
}

/* The final norm of n rows (rows at idx, or row0.. when idx is NULL) into
 * c->xn, and their logits into logits (device), in slices of LOGIT_ROWS
 * (a CPU rounding like the GPU mirrors the slices). */
static void norm_and_head(cuda_batch *d, const int *idx, int row0, int n, float *logits, float *host_logits,
                          float *host_hidden) {
    cuda_state *c = d->c;
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab;
    const float *x = d->x + (size_t)row0 * H;
    if (idx) {
        cuda_copy_rows(c->x, d->x, NULL, idx, n, H, &c->queue);
        x = c->x;
    }
    cuda_rmsnorm(c->xn, x, c->final_norm, n, H, (float)a->rms_eps, &c->queue);
    if (host_hidden) to_host(d, host_hidden, c->xn, (size_t)n * H * sizeof(float));
    for (int r0 = 0; r0 < n && (logits || host_logits); r0 += LOGIT_ROWS) {
        int k = n - r0 < LOGIT_ROWS ? n - r0 : LOGIT_ROWS;
        float *y = logits ? logits + (size_t)r0 * V : d->logits;
        cuda_mm(c, y, c->xn + (size_t)r0 * H, c->lm_head, NULL, k, V, H, 0);
        if (host_logits) to_host(d, host_logits + (size_t)r0 * V, y, (size_t)k * V * sizeof(float));
    }
}

/* Queue one recorded call on the stream. */
static void issue(cuda_batch *d, const step_op *o) {
    cuda_state *c = d->c;
    step_half *h = &d->half[d->h];
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = a->vocab, n = o->n;
    size_t Hs = (size_t)H;
    cudaStream_t s = c->queue.stream;
    const cuda_queue *q = &c->queue;
    switch ((op_kind)o->kind) {
    case OP_EMBED: {
        const int *t = ints_at(d, o->at, (size_t)(o->b ? 2 * n : n));
        cuda_embed(d->x, c->embed, t, d->half[!d->h].ids, o->b ? t + n : NULL, n, H, q);
        break;
    }
    case OP_PASS: {
        const int *r = ints_at(d, o->at, 3 * (size_t)n), *host = h->staging + o->at;
        cuda_kv_map map = {.pos = r + n, .table = r + 2 * n, .tables = c->tables};
        int n_runs = o->b & PASS_RUNS ? find_runs(host + n, host + 2 * n, n, d->runs) : 0;
        if (o->b & PASS_IN_PLACE) {
            cuda_layer_forward(c, &c->layers[o->a], d->x, n, &map, d->runs, n_runs);
            break;
        }
        cuda_copy_rows(c->x, d->x, NULL, r, n, H, q);
        cuda_layer_forward(c, &c->layers[o->a], c->x, n, &map, d->runs, n_runs);
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
            h->failed = 1;
        break;
    }
    case OP_CACHE_KEEP:
        copy_f32_rows(d, d->cache_rows + o->a * CUDA_KV_BLOCK * Hs, d->x + o->b * Hs, n);
        break;
    case OP_CACHE_TAKE:
        copy_f32_rows(d, d->start + o->b * Hs, d->cache_rows + o->a * CUDA_KV_BLOCK * Hs, n);
        break;
    case OP_FROM_START: {
        const int *r = ints_at(d, o->at, 2 * (size_t)n);
        cuda_copy_rows(d->x, d->start, r, r + n, n, H, q);
        break;
    }
    case OP_OUTPUTS:
        norm_and_head(d, NULL, (int)o->at, n, NULL, (float *)(intptr_t)o->a, (float *)(intptr_t)o->b);
        break;
    case OP_HEAD: {
        const int *r = ints_at(d, o->at, (size_t)n);
        norm_and_head(d, r, 0, n, h->logits, NULL, NULL);
        cuda_argmax_rows(h->ids, h->host_ids_dev, h->logits, n, V, q);
        for (int i = 0; i < n; i++)
            if (d->want[i]) to_host(d, h->host_logits + (size_t)i * V, h->logits + (size_t)i * V, (size_t)V * sizeof(float));
        break;
    }
    }
}

/* Upload the ints staged so far. */
static void upload_staged(cuda_batch *d) {
    step_half *h = &d->half[d->h];
    if (h->used && cudaMemcpyAsync(h->ints, h->staging, h->used * sizeof(int), cudaMemcpyHostToDevice,
                                   d->c->queue.stream) != cudaSuccess)
        h->failed = 1;
}

/* A call of the step: recorded, or issued now when the step goes call by
 * call (when it outgrows the record, what was recorded goes out first). */
static void record(cuda_batch *d, step_op o) {
    if (!d->direct && d->n_ops == d->cap_ops) {
        upload_staged(d);
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
    g->half = d->h;
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

/* Whether the recorded calls may be captured: no prompt runs, no outputs
 * to the caller's memory, few enough to keep. */
static int capturable(const cuda_batch *d) {
    if (!d->graphs || d->n_ops > d->graph_ops) return 0;
    for (int i = 0; i < d->n_ops; i++)
        if ((d->ops[i].kind == OP_PASS && d->ops[i].b & PASS_RUNS) || d->ops[i].kind == OP_OUTPUTS) return 0;
    return 1;
}

/* Capture the recorded calls on the buffers of half `half` into the least
 * recently used slot; NULL when the capture failed (its error handled:
 * again at the next step, without overlap if it was on; else never again). */
static step_graph *capture_half(cuda_batch *d, int half) {
    step_graph *g = &d->graph[0];
    for (int i = 1; i < STEP_GRAPHS; i++) {
        step_graph *t = &d->graph[i];
        if (!t->exec ? g->exec != NULL : g->exec && t->last_used < g->last_used) g = t;
    }
    if (g->exec) cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
    int h = d->h, failed = d->half[half].failed; /* calls refused by a dead capture are no failure of a step */
    d->h = half;
    cudaError_t e = capture(d, g);
    d->h = h, d->half[half].failed = failed;
    if (e != cudaSuccess) {
        if (!cuda_state_capture_failed(d->c)) d->graphs = 0;
        return NULL;
    }
    g->last_used = ++d->clock;
    return g;
}

/* The recorded calls go out: a graph of this shape and half replayed, or
 * captured when the previous step had the same calls (on both halves: the
 * next such step runs on the other), or else one by one. */
static void run_recorded(cuda_batch *d) {
    d->ran_as = 0;
    if (d->direct || !d->n_ops) return;
    upload_staged(d);
    if (!capturable(d)) {
        d->last.n_ops = 0; /* no model for the next step */
        for (int i = 0; i < d->n_ops; i++) issue(d, &d->ops[i]);
        return;
    }
    step_graph *g = NULL;
    for (int i = 0; i < STEP_GRAPHS && !g; i++)
        if (d->graph[i].exec && d->graph[i].half == d->h && same_calls(d, &d->graph[i])) g = &d->graph[i];
    if (!g && same_calls(d, &d->last) && (g = capture_half(d, d->h))) {
        d->ran_as = 1;
        int other = 0;
        for (int i = 0; i < STEP_GRAPHS && !other; i++)
            other = d->graph[i].exec && d->graph[i].half != d->h && same_calls(d, &d->graph[i]);
        if (!other) (void)capture_half(d, !d->h);
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

/* A step begins on the other half than the last (whose step, if still
 * running, the host waits for before it plans another). */
static int op_begin(void *state) {
    cuda_batch *d = state;
    d->h = !d->h;
    step_half *h = &d->half[d->h];
    h->used = 0, h->tables_used = 0, h->failed = 0, h->error = cudaSuccess;
    d->n_ops = 0, d->direct = 0, d->ran_as = 0;
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

/* Straight to the mirror (not part of a recorded step: tables grow at block
 * boundaries, which would change a step's calls every few steps). */
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
    if (cudaMemcpyAsync(d->c->tables + offset, stage, (size_t)n * sizeof(int), cudaMemcpyHostToDevice,
                        d->c->queue.stream) != cudaSuccess)
        h->failed = 1;
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
    step_half *h = &d->half[d->h];
    if (!h->failed) run_recorded(d);
    cudaError_t e = cudaGetLastError(); /* a launch refused now is this step's, not the next's */
    if (e == cudaSuccess) e = cudaEventRecord(h->done, d->c->queue.stream);
    h->error = e;
    if (e != cudaSuccess) return cuda_error(err, e, "batch step");
    return POLAR_OK;
}

static polar_status op_wait(void *state, int half, const int **ids, polar_error *err) {
    cuda_batch *d = state;
    step_half *h = &d->half[half];
    cudaError_t e = h->error;
    if (e == cudaSuccess) e = cudaEventSynchronize(h->done);
    if (e != cudaSuccess) return cuda_error(err, e, "batch step");
    if (h->failed)
        return polar_fail(err, POLAR_ERR_IO, "cuda: batch step: a copy failed or the step's %zu ints ran out",
                          d->cap_ints);
    if (ids) *ids = h->host_ids;
    return POLAR_OK;
}

static float *op_host_logits(void *d, int half) { return ((cuda_batch *)d)->half[half].host_logits; }

/* Row i of a half's head to the host now (the rows not wanted with the step). */
static polar_status op_copy_logits(void *state, int half, int i, polar_error *err) {
    cuda_batch *d = state;
    step_half *h = &d->half[half];
    size_t V = (size_t)d->c->m->arch.vocab;
    cudaError_t e = cudaMemcpyAsync(h->host_logits + (size_t)i * V, h->logits + (size_t)i * V, V * sizeof(float),
                                    cudaMemcpyDeviceToHost, d->c->queue.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->c->queue.stream);
    return e == cudaSuccess ? POLAR_OK : cuda_error(err, e, "copying a batch row's logits");
}

static int op_step_graph(const void *d) { return ((const cuda_batch *)d)->ran_as; }

static const char *op_launches(const void *d) { return cuda_state_launches(((const cuda_batch *)d)->c); }

static const batch_device_ops cuda_batch_ops = {
    .async = 1, .begin = op_begin, .put_tables = op_put_tables, .embed = op_embed, .pass = op_pass,
    .copy_rows = op_copy_rows, .copy_kv = op_copy_kv, .cache_keep = op_cache_keep, .cache_take = op_cache_take,
    .rows_from_start = op_rows_from_start, .outputs = op_outputs, .head = op_head, .launch = op_launch,
    .wait = op_wait, .host_logits = op_host_logits, .copy_logits = op_copy_logits, .step_graph = op_step_graph,
    .launches = op_launches, .free = cuda_batch_free,
};

polar_status cuda_batch_device(const polar_model *m, const batch_device_shape *shape, batch_device *out,
                               polar_error *err) {
    cuda_batch *d = NULL;
    polar_status st = cuda_batch_create(m, shape, &d, err);
    if (st == POLAR_OK) *out = (batch_device){&cuda_batch_ops, d};
    return st;
}

#endif
