/* A recorded batch step issued on the GPU (cuda_step.h): each call on each
 * rank's stream, and the step graphs. A step whose calls equal the previous
 * step's (a decode step of the same sequences and programs: only tokens,
 * positions and tables change, and those are read from the uploaded ints)
 * is captured as a graph, one per half and rank, and later steps of that
 * shape replay it: one launch for the whole step instead of a dozen per
 * pass, the tensor-parallel all-reduces inside it. A step with a prompt
 * chunk through the tiled prefill kernel (a run, whose count and lengths
 * change from step to step) or with outputs to the caller's memory is
 * never captured.
 *
 * Under tensor parallel the head is split by vocabulary: each rank's
 * argmax over its rows, the (value, id) pairs all-gathered and merged on
 * every rank (each feeds the next step's embedding); logits go to the host
 * only when asked for, all-gathered and copied by the first rank of each
 * process. Built with
 * POLAR_CUDA. */
#ifdef POLAR_CUDA

#include "cuda_step.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void ranks_run(cuda_batch *d, void (*fn)(void *arg, int r), void *arg) {
    if (d->tp) tp_run(d->tp, fn, arg);
    else fn(arg, 0);
}

/* The staged ints at..at+n on rank r's device: uploaded with the step, or
 * (a step going out call by call) now. */
static const int *ints_at(cuda_batch *d, int r, int half, size_t at, size_t n) {
    rank_half *h = &d->rank[r].half[half];
    if (d->direct && cudaMemcpyAsync(h->ints + at, d->half[half].staging + at, n * sizeof(int), cudaMemcpyHostToDevice,
                                     d->rank[r].c->queue.stream) != cudaSuccess)
        h->failed = 1;
    return h->ints + at;
}

/* n f32 rows of the residual width, device to device. */
static void copy_f32_rows(cuda_batch *d, int r, int half, float *dst, const float *src, int n) {
    size_t bytes = (size_t)n * d->rank[r].c->m->arch.hidden * sizeof(float);
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->rank[r].c->queue.stream) != cudaSuccess)
        d->rank[r].half[half].failed = 1;
}

/* Device to the caller's memory, on the stream; a failure fails the step.
 * Host memory, or device memory (unified addressing tells which): hidden
 * states go straight into a predictor's input on the GPU that way. */
static void copy_out(cuda_batch *d, int r, int half, void *dst, const void *src, size_t bytes) {
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->rank[r].c->queue.stream) != cudaSuccess)
        d->rank[r].half[half].failed = 1;
}

int find_runs(const int *pos, const int *table, int T, cuda_run *runs) {
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

/* Tensor parallel: rows row..row+n-1 of every rank's logits (src: this
 * rank's, rows of its vocabulary) gathered, then copied by the process's
 * first rank into the host rows at dst (n x vocab): each rank's columns where its vocabulary
 * starts. src must have n x vocab_part floats after it (the gather's equal
 * parts; what lies past its own rows is sent and never read). */
static void gathered_to_host(cuda_batch *d, int r, int half, const float *src, int n, float *dst) {
    rank_state *k = &d->rank[r];
    cuda_state *c = k->c;
    size_t part = (size_t)n * d->vocab_part, V = (size_t)c->m->arch.vocab;
    ncclResult_t e = ncclAllGather(src, k->gathered, part, ncclFloat32, c->comm, c->queue.stream);
    if (e != ncclSuccess && c->nccl_error == ncclSuccess) c->nccl_error = e;
    if (r != 0) return; /* each process's first rank */
    for (int j = 0; j < d->world; j++) {
        size_t w = (size_t)d->vocab[j] * sizeof(float);
        if (cudaMemcpy2DAsync(dst + d->v0[j], V * sizeof(float), k->gathered + j * part, w, w, (size_t)n,
                              cudaMemcpyDeviceToHost, c->queue.stream) != cudaSuccess)
            k->half[half].failed = 1;
    }
}

/* The final norm of n rows (rows at idx, or row0.. when idx is NULL) into
 * c->xn, and their logits over the rank's vocabulary into logits (device),
 * in slices of LOGIT_ROWS (a CPU rounding like the GPU mirrors the slices);
 * to the host's (whole rows) and its hidden states when given (by the
 * process's first rank: every process of a multi-node group plans alike). */
static void norm_and_head(cuda_batch *d, int r, int half, const int *idx, int row0, int n, float *logits,
                          float *host_logits, float *out_hidden) {
    rank_state *k = &d->rank[r];
    cuda_state *c = k->c;
    const polar_arch *a = &c->m->arch;
    int H = a->hidden, V = c->shard.vocab;
    const float *x = k->x + (size_t)row0 * H;
    if (idx) {
        cuda_copy_rows(c->x, k->x, NULL, idx, n, H, &c->queue);
        x = c->x;
    }
    cuda_rmsnorm(c->xn, x, c->final_norm, n, H, (float)a->rms_eps, &c->queue);
    if (out_hidden && r == 0) copy_out(d, r, half, out_hidden, c->xn, (size_t)n * H * sizeof(float));
    for (int r0 = 0; r0 < n && (logits || host_logits); r0 += LOGIT_ROWS) {
        int m = n - r0 < LOGIT_ROWS ? n - r0 : LOGIT_ROWS;
        float *y = logits ? logits + (size_t)r0 * V : k->logits;
        cuda_mm(c, y, c->xn + (size_t)r0 * H, c->lm_head, c->t_lm_head, NULL, m, V, H, 0);
        if (!host_logits) continue;
        if (c->comm) gathered_to_host(d, r, half, y, m, host_logits + (size_t)r0 * a->vocab);
        else copy_out(d, r, half, host_logits + (size_t)r0 * V, y, (size_t)m * V * sizeof(float));
    }
}

/* The head's argmax into the half's ids (and the process's first rank's
 * into the host's mapped ids): one kernel over the whole vocabulary, or under tensor
 * parallel each rank's part, gathered and merged on every rank; then the
 * rows wanted on the host. */
static void head_outputs(cuda_batch *d, int r, int half, int n) {
    rank_state *k = &d->rank[r];
    cuda_state *c = k->c;
    rank_half *h = &k->half[half];
    step_half *host = &d->half[half];
    int *host_ids = r == 0 ? host->host_ids_dev : NULL;
    size_t V = (size_t)c->m->arch.vocab, Vr = (size_t)c->shard.vocab;
    if (!c->comm) {
        cuda_argmax_rows(h->ids, host_ids, h->logits, n, (int)V, &c->queue);
        for (int i = 0; i < n; i++)
            if (d->want[i]) copy_out(d, r, half, host->host_logits + i * V, h->logits + i * V, V * sizeof(float));
        return;
    }
    cuda_argmax_part(k->part, h->logits, n, (int)Vr, c->shard.v0, &c->queue);
    ncclResult_t e = ncclAllGather(k->part, k->parts, 2 * (size_t)n, ncclFloat32, c->comm, c->queue.stream);
    if (e != ncclSuccess && c->nccl_error == ncclSuccess) c->nccl_error = e;
    cuda_argmax_merge(h->ids, host_ids, k->parts, n, d->world, &c->queue);
    for (int i = 0; i < n; i++)
        if (d->want[i]) gathered_to_host(d, r, half, h->logits + i * Vr, 1, host->host_logits + i * V);
}

void step_issue(cuda_batch *d, int r, int half, const step_op *o) {
    rank_state *k = &d->rank[r];
    cuda_state *c = k->c;
    rank_half *h = &k->half[half];
    int H = c->m->arch.hidden, n = o->n;
    size_t Hs = (size_t)H;
    cudaStream_t s = c->queue.stream;
    const cuda_queue *q = &c->queue;
    switch ((op_kind)o->kind) {
    case OP_EMBED: {
        const int *t = ints_at(d, r, half, o->at, (size_t)(o->b ? 2 * n : n));
        if (c->t_embed == CPU_W_BF16)
            cuda_embed(k->x, c->embed, t, k->half[!half].ids, o->b ? t + n : NULL, n, H, q);
        else
            cuda_embed_blocks(k->x, (cuda_wmat){c->embed, (int)c->t_embed, cpu_wtype_row_bytes(c->t_embed, Hs), 0}, t,
                              k->half[!half].ids, o->b ? t + n : NULL, n, H, q);
        break;
    }
    case OP_PASS: {
        const int *ints = ints_at(d, r, half, o->at, 3 * (size_t)n), *host = d->half[half].staging + o->at;
        cuda_kv_map map = {.pos = ints + n, .table = ints + 2 * n, .tables = c->tables};
        int n_runs = o->b & PASS_RUNS ? find_runs(host + n, host + 2 * n, n, k->runs) : 0;
        if (o->b & PASS_IN_PLACE) {
            cuda_layer_forward(c, &c->layers[o->a], k->x, n, &map, k->runs, n_runs);
            break;
        }
        cuda_copy_rows(c->x, k->x, NULL, ints, n, H, q);
        cuda_layer_forward(c, &c->layers[o->a], c->x, n, &map, k->runs, n_runs);
        cuda_copy_rows(k->x, c->x, ints, NULL, n, H, q);
        break;
    }
    case OP_COPY_ROWS:
        copy_f32_rows(d, r, half, k->x + o->a * Hs, k->x + o->b * Hs, n);
        break;
    case OP_COPY_KV: {
        size_t w = (size_t)c->shard.n_kv * c->m->arch.head_dim, bytes = (size_t)n * w * sizeof(bf16);
        if (cudaMemcpyAsync(c->k_pool + o->b * w, c->k_pool + o->a * w, bytes, cudaMemcpyDeviceToDevice, s) !=
                cudaSuccess ||
            cudaMemcpyAsync(c->v_pool + o->b * w, c->v_pool + o->a * w, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
            h->failed = 1;
        break;
    }
    case OP_CACHE_KEEP:
        copy_f32_rows(d, r, half, k->cache_rows + o->a * CUDA_KV_BLOCK * Hs, k->x + o->b * Hs, n);
        break;
    case OP_CACHE_TAKE:
        copy_f32_rows(d, r, half, k->start + o->b * Hs, k->cache_rows + o->a * CUDA_KV_BLOCK * Hs, n);
        break;
    case OP_FROM_START: {
        const int *rows = ints_at(d, r, half, o->at, 2 * (size_t)n);
        cuda_copy_rows(k->x, k->start, rows, rows + n, n, H, q);
        break;
    }
    case OP_OUTPUTS:
        norm_and_head(d, r, half, NULL, (int)o->at, n, NULL, (float *)(intptr_t)o->a, (float *)(intptr_t)o->b);
        break;
    case OP_HEAD:
        norm_and_head(d, r, half, ints_at(d, r, half, o->at, (size_t)n), 0, n, h->logits, NULL, NULL);
        head_outputs(d, r, half, n);
        break;
    }
}

/* Whether the step's recorded calls (and head rows wanted on the host) are g's. */
static int same_calls(const cuda_batch *d, const step_graph *g) {
    if (g->n_ops != d->n_ops || memcmp(g->ops, d->ops, (size_t)d->n_ops * sizeof *d->ops)) return 0;
    const step_op *last = &d->ops[d->n_ops - 1];
    return last->kind != OP_HEAD || !memcmp(g->want, d->want, (size_t)last->n);
}

/* The step's recorded calls into g. */
static void keep_calls(const cuda_batch *d, step_graph *g, int half) {
    memcpy(g->ops, d->ops, (size_t)d->n_ops * sizeof *d->ops);
    g->n_ops = d->n_ops;
    g->half = half;
    memcpy(g->want, d->want, (size_t)d->head_rows);
}

/* Whether the recorded calls may be captured: no prompt runs, no outputs
 * to the caller's memory, few enough to keep. */
static int capturable(const cuda_batch *d) {
    if (!d->graphs || d->n_ops > d->graph_ops) return 0;
    for (int i = 0; i < d->n_ops; i++)
        if ((d->ops[i].kind == OP_PASS && d->ops[i].b & PASS_RUNS) || d->ops[i].kind == OP_OUTPUTS) return 0;
    return 1;
}

/* The least recently used graph slot, emptied, and marked as the most
 * recently used (its next capture's). */
static step_graph *free_slot(cuda_batch *d) {
    step_graph *g = &d->graph[0];
    for (int i = 1; i < STEP_GRAPHS; i++) {
        step_graph *t = &d->graph[i];
        if (!t->live ? g->live : g->live && t->last_used < g->last_used) g = t;
    }
    for (int r = 0; r < d->n_ranks; r++)
        if (d->rank[r].exec[g - d->graph]) {
            cudaGraphExecDestroy(d->rank[r].exec[g - d->graph]);
            d->rank[r].exec[g - d->graph] = NULL;
        }
    g->live = 0;
    g->last_used = ++d->clock;
    return g;
}

/* The kernel nodes of graph into g->kernels, its memcpy and memset nodes
 * into g->copies (-1 each when the runtime cannot say). */
static void count_nodes(cudaGraph_t graph, step_graph *g) {
    size_t n = 0;
    cudaGraphNode_t *nodes = NULL;
    int kernels = 0, copies = 0, ok = cudaGraphGetNodes(graph, NULL, &n) == cudaSuccess;
    if (ok && n) ok = (nodes = malloc(n * sizeof *nodes)) && cudaGraphGetNodes(graph, nodes, &n) == cudaSuccess;
    for (size_t i = 0; ok && i < n; i++) {
        enum cudaGraphNodeType t = cudaGraphNodeTypeEmpty;
        ok = cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess;
        kernels += t == cudaGraphNodeTypeKernel, copies += t == cudaGraphNodeTypeMemcpy || t == cudaGraphNodeTypeMemset;
    }
    free(nodes);
    if (!ok) (void)cudaGetLastError(); /* a count missing is no failure of the step */
    g->kernels = ok ? kernels : -1, g->copies = ok ? copies : -1;
}

/* Rank r captures the recorded calls on the buffers of half `half` into its
 * graph of slot `slot` (the first rank counts its nodes). Calls refused by a
 * dead capture are no failure of a step. */
static cudaError_t capture(cuda_batch *d, int r, int half, int slot) {
    rank_state *k = &d->rank[r];
    cudaStream_t s = k->c->queue.stream;
    cudaGraph_t graph = NULL;
    int failed = k->half[half].failed;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return e;
    for (int i = 0; i < d->n_ops; i++) step_issue(d, r, half, &d->ops[i]);
    e = cudaStreamEndCapture(s, &graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&k->exec[slot], graph, 0);
    if (e == cudaSuccess && r == 0) count_nodes(graph, &d->graph[slot]);
    if (graph) cudaGraphDestroy(graph);
    k->half[half].failed = failed;
    if (e != cudaSuccess) k->exec[slot] = NULL;
    return e;
}

/* What the ranks do with a step, decided once for all of them. */
typedef struct {
    cuda_batch *d;
    int go;            /* the recorded calls go out now */
    int plan;          /* RUN_CALLS, RUN_GRAPH (slot), RUN_CAPTURE (slot; other: the other half's too, or -1) */
    int slot, other;
} step_job;
enum { RUN_CALLS, RUN_GRAPH, RUN_CAPTURE };

/* Upload the ints staged so far to rank r. */
static void upload_staged(cuda_batch *d, int r, int half) {
    rank_state *k = &d->rank[r];
    size_t used = d->half[half].used;
    if (used && cudaMemcpyAsync(k->half[half].ints, d->half[half].staging, used * sizeof(int), cudaMemcpyHostToDevice,
                                k->c->queue.stream) != cudaSuccess)
        k->half[half].failed = 1;
}

static void issue_all(cuda_batch *d, int r, int half) {
    for (int i = 0; i < d->n_ops; i++) step_issue(d, r, half, &d->ops[i]);
}

/* Rank r's part of a step: its calls, as planned, then its event. */
static void run_step(void *arg, int r) {
    step_job *j = arg;
    cuda_batch *d = j->d;
    rank_state *k = &d->rank[r];
    int half = d->h, run = 0;
    rank_half *h = &k->half[half];
    k->capture_failed = k->launch_failed = 0;
    if (j->go) { /* else its calls went out as they came, or there are none, or the ints ran out */
        upload_staged(d, r, half);
        if (j->plan == RUN_CAPTURE) {
            cudaError_t e = capture(d, r, half, j->slot);
            if (e == cudaSuccess && j->other >= 0) e = capture(d, r, !half, j->other);
            if (e != cudaSuccess) k->capture_failed = 1, k->retry = cuda_state_capture_failed(k->c);
        }
        if (j->plan != RUN_CALLS && !k->capture_failed) {
            run = cudaGraphLaunch(k->exec[j->slot], k->c->queue.stream) == cudaSuccess;
            if (!run) (void)cudaGetLastError(), k->launch_failed = 1; /* the calls go out one by one instead */
        }
        if (!run) issue_all(d, r, half);
    }
    cudaError_t e = cudaGetLastError(); /* a launch refused now is this step's, not the next's */
    if (e == cudaSuccess) e = cudaEventRecord(h->done, k->c->queue.stream);
    h->error = e;
}

/* After a capture or replay on every rank: a slot is live only where every
 * rank has its graph (the graphs of a slot some rank failed to capture stay
 * until the slot is reused: one may be running); a failure on any rank turns
 * graphs off for good unless each says a retry is worth it. */
static void settle(cuda_batch *d, const step_job *j) {
    int captured = 1, retry = 1, launched = 1;
    for (int r = 0; r < d->n_ranks; r++) {
        const rank_state *k = &d->rank[r];
        captured &= !k->capture_failed, retry &= !k->capture_failed || k->retry, launched &= !k->launch_failed;
    }
    d->ran_as = 0, d->ran_kernels = d->ran_copies = -1;
    if (j->plan == RUN_CAPTURE) {
        if (!captured) {
            if (!retry) d->graphs = 0;
            return;
        }
        keep_calls(d, &d->graph[j->slot], d->h);
        d->graph[j->slot].live = 1, d->graph[j->slot].last_used = ++d->clock;
        if (j->other >= 0) keep_calls(d, &d->graph[j->other], !d->h), d->graph[j->other].live = 1;
    }
    if (j->plan != RUN_CALLS) {
        if (!launched) {
            d->graphs = 0;
            return;
        }
        d->graph[j->slot].last_used = ++d->clock;
        d->ran_as = j->plan == RUN_CAPTURE ? 2 : 1;
        d->ran_kernels = d->graph[j->slot].kernels, d->ran_copies = d->graph[j->slot].copies;
    }
}

void step_launch(cuda_batch *d) {
    step_job j = {d, !d->direct && d->n_ops && !d->half[d->h].failed, RUN_CALLS, -1, -1};
    d->ran_as = 0;
    if (j.go && capturable(d)) {
        for (int i = 0; i < STEP_GRAPHS && j.plan == RUN_CALLS; i++)
            if (d->graph[i].live && d->graph[i].half == d->h && same_calls(d, &d->graph[i])) j.plan = RUN_GRAPH, j.slot = i;
        if (j.plan == RUN_CALLS && same_calls(d, &d->last)) {
            j.plan = RUN_CAPTURE, j.slot = (int)(free_slot(d) - d->graph);
            int other = 0;
            for (int i = 0; i < STEP_GRAPHS && !other; i++)
                other = d->graph[i].live && d->graph[i].half != d->h && same_calls(d, &d->graph[i]);
            if (!other) {
                d->graph[j.slot].live = 1; /* held while the other slot is chosen */
                j.other = (int)(free_slot(d) - d->graph);
                d->graph[j.slot].live = 0;
            }
        }
        keep_calls(d, &d->last, d->h);
    } else if (j.go) {
        d->last.n_ops = 0; /* no model for the next step */
    }
    ranks_run(d, run_step, &j);
    settle(d, &j);
}

typedef struct {
    cuda_batch *d;
    int half, i;
} logits_job;

static void copy_row(void *arg, int r) {
    logits_job *j = arg;
    cuda_batch *d = j->d;
    rank_state *k = &d->rank[r];
    cuda_state *c = k->c;
    rank_half *h = &k->half[j->half];
    size_t V = (size_t)c->m->arch.vocab, Vr = (size_t)c->shard.vocab;
    float *dst = d->half[j->half].host_logits + (size_t)j->i * V;
    int failed = h->failed; /* the step's, reported by its wait already */
    h->failed = 0;
    if (c->comm) gathered_to_host(d, r, j->half, h->logits + (size_t)j->i * Vr, 1, dst);
    else copy_out(d, r, j->half, dst, h->logits + (size_t)j->i * V, V * sizeof(float));
    cudaError_t e = cudaStreamSynchronize(c->queue.stream);
    k->job_error = e == cudaSuccess && h->failed ? cudaErrorUnknown : e;
    h->failed = failed;
}

polar_status step_copy_logits(cuda_batch *d, int half, int i, polar_error *err) {
    logits_job j = {d, half, i};
    ranks_run(d, copy_row, &j);
    for (int r = 0; r < d->n_ranks; r++) {
        if (d->rank[r].c->nccl_error != ncclSuccess)
            return tp_nccl_error(err, d->rank[r].c->nccl_error, "gathering a batch row's logits");
        if (d->rank[r].job_error != cudaSuccess) return cuda_error(err, d->rank[r].job_error, "copying a batch row's logits");
    }
    return POLAR_OK;
}

#endif
