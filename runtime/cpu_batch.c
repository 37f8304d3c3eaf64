/* A batch's steps on the CPU (batch_device.h), each call run as it comes:
 * a layer pass runs cpu_layer_forward on the step's rows in place when they
 * are rows 0..T-1, else gathers them into the workspace and scatters them
 * back; the K/V rows are the host pool's. With round_like_cuda it rounds to
 * bf16 where the GPU's step does: the K/V rows, the GEMM inputs of passes
 * of more than CUDA_GEMV_TOKENS rows, and the head's rows in slices of
 * CUDA_LOGIT_ROWS of more than that many. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops.h"
#include "batch_device.h"
#include "cpu_layer.h"
#include "error.h"

typedef struct {
    const polar_model *m;
    kv_pool *pool;       /* its rows (k, v or k16, v16): [n_blocks * CPU_KV_BLOCK, kv_dim] */
    int round_like_cuda;
    cpu_work work;       /* [rows] one pass's rows */
    float *x;            /* [rows, hidden] the step's residual streams */
    float *cos, *sin;    /* [rows, head_dim/2] rope tables of the rows' positions */
    cpu_token_at *at;    /* [rows] one pass's rows */
    int *tables;         /* [tables] the mirror of the block tables */
    float *start;        /* [start_rows, hidden] rows cached prompt blocks start from, or NULL */
    float *cached;       /* [cache_items, CPU_KV_BLOCK, hidden] the prefix cache's residual rows, or NULL */
    float *logits[2];    /* [head_rows, vocab] each half's head */
    int *ids[2];         /* [head_rows] their argmax */
    int h;               /* the step's half */
} cpu_batch;

static void cpu_batch_free(void *state) {
    cpu_batch *c = state;
    if (!c) return;
    cpu_work_free(&c->work);
    free(c->x);
    free(c->cos);
    free(c->sin);
    free(c->at);
    free(c->tables);
    free(c->start);
    free(c->cached);
    for (int i = 0; i < 2; i++) free(c->logits[i]), free(c->ids[i]);
    free(c);
}

static size_t hidden(const cpu_batch *c) { return (size_t)c->m->arch.hidden; }

static int cpu_batch_begin(void *state) {
    cpu_batch *c = state;
    return c->h = !c->h;
}

static void cpu_batch_put_tables(void *state, const int *tables, int offset, int n) {
    cpu_batch *c = state;
    memcpy(c->tables + offset, tables, (size_t)n * sizeof *tables);
}

/* The CPU runs each step before the next is planned: every token is known (from is never given). */
static void cpu_batch_embed(void *state, const int *tokens, const int *from, const int *pos, int R) {
    (void)from;
    cpu_batch *c = state;
    const polar_model *m = c->m;
    int half = m->arch.head_dim / 2;
    for (int r = 0; r < R; r++) {
        cpu_embed_q(c->x + (size_t)r * hidden(c), m->embed, m->t_embed, tokens[r], m->arch.hidden);
        cpu_rope_angles(c->cos + (size_t)r * half, c->sin + (size_t)r * half, m->rope_inv_freq, m->rope_scale, half,
                        pos[r]);
    }
}

static void cpu_batch_pass(void *state, int layer, const int *rows, const int *pos, const int *table, int T) {
    cpu_batch *c = state;
    const polar_model *m = c->m;
    size_t H = hidden(c);
    int half = m->arch.head_dim / 2, in_order = 1;
    for (int t = 0; t < T; t++) {
        c->at[t] = (cpu_token_at){.pos = pos[t], .blocks = c->tables + table[t], .cos = c->cos + (size_t)rows[t] * half,
                                  .sin = c->sin + (size_t)rows[t] * half};
        in_order &= rows[t] == t;
    }
    float *x = in_order ? c->x : c->work.x;
    for (int t = 0; t < T && !in_order; t++) memcpy(x + (size_t)t * H, c->x + (size_t)rows[t] * H, H * sizeof(float));
    int round_in = c->round_like_cuda && T > CUDA_GEMV_TOKENS; /* as the GPU's GEMMs */
    cpu_layer_forward(m, &c->work, &m->layers[layer], x, c->pool, c->at, T, round_in, c->round_like_cuda);
    for (int t = 0; t < T && !in_order; t++) memcpy(c->x + (size_t)rows[t] * H, x + (size_t)t * H, H * sizeof(float));
}

static void cpu_batch_copy_rows(void *state, int dst, int src, int n) {
    cpu_batch *c = state;
    memcpy(c->x + (size_t)dst * hidden(c), c->x + (size_t)src * hidden(c), (size_t)n * hidden(c) * sizeof(float));
}

static void cpu_batch_copy_kv(void *state, size_t from, size_t to, int n) {
    cpu_batch *c = state;
    kv_pool_copy_rows(c->pool, from, to, n);
}

static float *cached_rows(cpu_batch *c, int item) { return c->cached + (size_t)item * CPU_KV_BLOCK * hidden(c); }

static void cpu_batch_cache_keep(void *state, int item, int row, int n) {
    cpu_batch *c = state;
    memcpy(cached_rows(c, item), c->x + (size_t)row * hidden(c), (size_t)n * hidden(c) * sizeof(float));
}

static void cpu_batch_cache_take(void *state, int item, int start, int n) {
    cpu_batch *c = state;
    memcpy(c->start + (size_t)start * hidden(c), cached_rows(c, item), (size_t)n * hidden(c) * sizeof(float));
}

static void cpu_batch_rows_from_start(void *state, const int *rows, const int *starts, int n) {
    cpu_batch *c = state;
    for (int i = 0; i < n; i++)
        memcpy(c->x + (size_t)rows[i] * hidden(c), c->start + (size_t)starts[i] * hidden(c), hidden(c) * sizeof(float));
}

/* The final norm of n rows (rows[i], or row0 + i when rows is NULL) into
 * the workspace's xn (and to hidden), then their logits (when logits is
 * given), as the GPU computes them: in slices of CUDA_LOGIT_ROWS, those of
 * more than CUDA_GEMV_TOKENS rows on bf16 inputs when rounding like it. */
static void norm_and_head(cpu_batch *c, const int *rows, int row0, int n, float *logits, float *out_hidden) {
    const polar_model *m = c->m;
    size_t H = hidden(c);
    float *xn = c->work.xn;
    for (int i = 0; i < n; i++)
        cpu_final_norm(m, xn + i * H, c->x + (size_t)(rows ? rows[i] : row0 + i) * H);
    if (out_hidden) memcpy(out_hidden, xn, (size_t)n * H * sizeof(float));
    if (!logits) return;
    for (int r0 = 0; c->round_like_cuda && r0 < n; r0 += CUDA_LOGIT_ROWS)
        if (n - r0 > CUDA_GEMV_TOKENS)
            cpu_round_bf16(xn + (size_t)r0 * H, (size_t)(n - r0 < CUDA_LOGIT_ROWS ? n - r0 : CUDA_LOGIT_ROWS) * H);
    cpu_matmul_q(logits, xn, m->lm_head, m->t_lm_head, NULL, n, m->arch.vocab, m->arch.hidden, 0, c->work.n_threads,
                 c->work.xq);
}

static void cpu_batch_outputs(void *state, int row0, int n, float *logits, float *out_hidden) {
    norm_and_head(state, NULL, row0, n, logits, out_hidden);
}

static void cpu_batch_head(void *state, const int *rows, int n, const unsigned char *want) {
    (void)want; /* every row is on the host */
    cpu_batch *c = state;
    int V = c->m->arch.vocab;
    norm_and_head(c, rows, 0, n, c->logits[c->h], NULL);
    for (int i = 0; i < n; i++) c->ids[c->h][i] = polar_argmax(c->logits[c->h] + (size_t)i * V, V);
}

static polar_status cpu_batch_launch(void *state, polar_error *err) {
    (void)state, (void)err;
    return POLAR_OK;
}

static polar_status cpu_batch_wait(void *state, int half, const int **ids, polar_error *err) {
    (void)err;
    if (ids) *ids = ((cpu_batch *)state)->ids[half];
    return POLAR_OK;
}

static float *cpu_batch_host_logits(void *state, int half) { return ((cpu_batch *)state)->logits[half]; }

/* Every row of the head is on the host already. */
static polar_status cpu_batch_copy_logits(void *state, int half, int i, polar_error *err) {
    (void)state, (void)half, (void)i, (void)err;
    return POLAR_OK;
}

static int cpu_batch_graph(const void *state) {
    (void)state;
    return 0;
}

static int cpu_batch_graph_kernels(const void *state, int *copies) {
    (void)state;
    if (copies) *copies = -1;
    return -1;
}

static const char *cpu_batch_launches(const void *state) {
    (void)state;
    return NULL;
}

static int cpu_batch_memory(const void *state, polar_device_memory *out) {
    (void)state;
    (void)out;
    return 0;
}

static const batch_device_ops cpu_batch_ops = {
    .async = 0, .begin = cpu_batch_begin, .put_tables = cpu_batch_put_tables, .embed = cpu_batch_embed,
    .pass = cpu_batch_pass, .copy_rows = cpu_batch_copy_rows, .copy_kv = cpu_batch_copy_kv,
    .cache_keep = cpu_batch_cache_keep, .cache_take = cpu_batch_cache_take,
    .rows_from_start = cpu_batch_rows_from_start, .outputs = cpu_batch_outputs, .head = cpu_batch_head,
    .launch = cpu_batch_launch, .wait = cpu_batch_wait, .host_logits = cpu_batch_host_logits,
    .copy_logits = cpu_batch_copy_logits, .step_graph = cpu_batch_graph,
    .graph_kernels = cpu_batch_graph_kernels, .launches = cpu_batch_launches,
    .memory = cpu_batch_memory,    .free = cpu_batch_free,
};

polar_status cpu_batch_device(const polar_model *m, const batch_device_shape *sh, kv_pool *pool, batch_device *out,
                              polar_error *err) {
    const polar_arch *a = &m->arch;
    cpu_batch *c = calloc(1, sizeof *c);
    if (!c) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the batch's CPU workspaces");
    size_t R = (size_t)sh->rows, H = (size_t)a->hidden, half = (size_t)a->head_dim / 2;
    size_t head = (size_t)sh->head_rows * a->vocab;
    *c = (cpu_batch){.m = m, .pool = pool, .round_like_cuda = sh->round_like_cuda};
    int ok = cpu_work_init(&c->work, m, sh->rows, sh->max_ctx, sh->n_threads);
    c->x = malloc(R * H * sizeof *c->x);
    c->cos = malloc(R * half * sizeof *c->cos);
    c->sin = malloc(R * half * sizeof *c->sin);
    c->at = malloc(R * sizeof *c->at);
    c->tables = malloc((size_t)sh->tables * sizeof *c->tables);
    if (sh->start_rows) c->start = malloc((size_t)sh->start_rows * H * sizeof *c->start);
    if (sh->cache_items) c->cached = malloc((size_t)sh->cache_items * CPU_KV_BLOCK * H * sizeof *c->cached);
    for (int i = 0; i < 2; i++) {
        c->logits[i] = malloc(head * sizeof *c->logits[i]);
        c->ids[i] = malloc((size_t)sh->head_rows * sizeof *c->ids[i]);
        ok = ok && c->logits[i] && c->ids[i];
    }
    if (c->tables) /* -1, as the host's tables start: a table never put is no block */
        memset(c->tables, 0xff, (size_t)sh->tables * sizeof *c->tables);
    if (!ok || !c->x || !c->cos || !c->sin || !c->at || !c->tables || (sh->start_rows && !c->start) ||
        (sh->cache_items && !c->cached)) {
        cpu_batch_free(c);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory creating the batch's CPU workspaces (%d tokens per step)",
                          sh->rows);
    }
    *out = (batch_device){&cpu_batch_ops, c};
    return POLAR_OK;
}
