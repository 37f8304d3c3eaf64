/* A batch's steps on the CPU (batch_device.h): each layer pass gathers
 * its rows into the workspace, runs cpu_layer_forward and scatters them
 * back; the K/V rows are the host pool's. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops.h"
#include "batch_device.h"
#include "cpu_layer.h"

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
    float *logits;       /* [head_rows, vocab] the last head's */
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
    free(c->logits);
    free(c);
}

void *cpu_batch_create(const polar_model *m, const cpu_batch_shape *sh, kv_pool *pool) {
    const polar_arch *a = &m->arch;
    cpu_batch *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    size_t R = (size_t)sh->rows, H = (size_t)a->hidden, half = (size_t)a->head_dim / 2;
    *c = (cpu_batch){.m = m, .pool = pool, .round_like_cuda = sh->round_like_cuda};
    int ok = cpu_work_init(&c->work, m, sh->rows, sh->max_ctx, sh->n_threads);
    c->x = malloc(R * H * sizeof *c->x);
    c->cos = malloc(R * half * sizeof *c->cos);
    c->sin = malloc(R * half * sizeof *c->sin);
    c->at = malloc(R * sizeof *c->at);
    c->tables = malloc((size_t)sh->tables * sizeof *c->tables);
    if (sh->start_rows) c->start = malloc((size_t)sh->start_rows * H * sizeof *c->start);
    if (sh->cache_items) c->cached = malloc((size_t)sh->cache_items * CPU_KV_BLOCK * H * sizeof *c->cached);
    c->logits = malloc((size_t)sh->head_rows * a->vocab * sizeof *c->logits);
    if (c->tables) /* -1, as the host's tables start: a table never put is no block */
        memset(c->tables, 0xff, (size_t)sh->tables * sizeof *c->tables);
    if (!ok || !c->x || !c->cos || !c->sin || !c->at || !c->tables || (sh->start_rows && !c->start) ||
        (sh->cache_items && !c->cached) || !c->logits) {
        cpu_batch_free(c);
        return NULL;
    }
    return c;
}

static size_t hidden(const cpu_batch *c) { return (size_t)c->m->arch.hidden; }

static void cpu_batch_begin(void *state) { (void)state; }

static void cpu_batch_put_tables(void *state, const int *tables, int offset, int n) {
    cpu_batch *c = state;
    memcpy(c->tables + offset, tables, (size_t)n * sizeof *tables);
}

static void cpu_batch_embed(void *state, const int *tokens, const int *pos, int R) {
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
    int half = m->arch.head_dim / 2;
    for (int t = 0; t < T; t++) {
        c->at[t] = (cpu_token_at){.pos = pos[t], .blocks = c->tables + table[t], .cos = c->cos + (size_t)rows[t] * half,
                                  .sin = c->sin + (size_t)rows[t] * half};
        memcpy(c->work.x + (size_t)t * H, c->x + (size_t)rows[t] * H, H * sizeof(float));
    }
    int round_in = c->round_like_cuda && T > CUDA_DECODE_TOKENS; /* as the GPU's GEMMs */
    cpu_layer_forward(m, &c->work, &m->layers[layer], c->pool, c->at, T, round_in, c->round_like_cuda);
    for (int t = 0; t < T; t++) memcpy(c->x + (size_t)rows[t] * H, c->work.x + (size_t)t * H, H * sizeof(float));
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

static polar_status cpu_batch_head(void *state, const int *rows, int n, const unsigned char *want, int *ids,
                             polar_error *err) {
    (void)err;
    cpu_batch *c = state;
    const polar_model *m = c->m;
    size_t H = hidden(c);
    int V = m->arch.vocab;
    for (int i = 0; i < n; i++) {
        memcpy(c->work.x + (size_t)i * H, c->x + (size_t)rows[i] * H, H * sizeof(float));
        cpu_final_norm(m, &c->work, i);
    }
    /* the GPU's head runs in slices of CUDA_LOGIT_ROWS, through a GEMM beyond CUDA_DECODE_TOKENS rows */
    for (int r0 = 0; c->round_like_cuda && r0 < n; r0 += CUDA_LOGIT_ROWS)
        if (n - r0 > CUDA_DECODE_TOKENS)
            cpu_round_bf16(c->work.xn + (size_t)r0 * H, (size_t)(n - r0 < CUDA_LOGIT_ROWS ? n - r0 : CUDA_LOGIT_ROWS) * H);
    cpu_matmul_q(c->logits, c->work.xn, m->lm_head, m->t_lm_head, NULL, n, V, m->arch.hidden, 0, c->work.n_threads,
                 c->work.xq);
    for (int i = 0; i < n; i++)
        if (!want[i]) ids[i] = polar_argmax(c->logits + (size_t)i * V, V);
    return POLAR_OK;
}

static float *cpu_batch_host_logits(void *state) { return ((cpu_batch *)state)->logits; }

/* Every row of the head is on the host already. */
static polar_status cpu_batch_copy_logits(void *state, int i, polar_error *err) {
    (void)state, (void)i, (void)err;
    return POLAR_OK;
}

static polar_status cpu_batch_finish(void *state, polar_error *err) {
    (void)state, (void)err;
    return POLAR_OK;
}

static int cpu_batch_graph(const void *state) {
    (void)state;
    return 0;
}

static const char *cpu_batch_launches(const void *state) {
    (void)state;
    return NULL;
}

const batch_device_ops cpu_batch_ops = {
    .begin = cpu_batch_begin, .put_tables = cpu_batch_put_tables, .embed = cpu_batch_embed, .pass = cpu_batch_pass,
    .copy_rows = cpu_batch_copy_rows, .copy_kv = cpu_batch_copy_kv, .cache_keep = cpu_batch_cache_keep,
    .cache_take = cpu_batch_cache_take, .rows_from_start = cpu_batch_rows_from_start, .head = cpu_batch_head,
    .host_logits = cpu_batch_host_logits, .copy_logits = cpu_batch_copy_logits, .finish = cpu_batch_finish,
    .step_graph = cpu_batch_graph, .launches = cpu_batch_launches, .free = cpu_batch_free,
};
