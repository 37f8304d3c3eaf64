/* The predictor in training mode: a forward pass that keeps its activations,
 * the backward pass through every op, and the batch loss and gradient with
 * OpenMP over examples (each thread its own activations and gradient sums).
 * The network is forward.c's:
 *   tok = q_proj(H) [T, d]; x0 = CrossMHA(layer_emb, tok) [D, d]
 *   2 x post-LN encoder layer: r1 = x + drop(SA(x)); x1 = LN1(r1);
 *                              r2 = x1 + drop(W2 drop(relu(W1 x1))); x2 = LN2(r2)
 *   seg = seg_head(x) [D], op = op_head(x) [D, 3]
 * with PyTorch's dropout sites: attention weights (cross and self), after
 * self-attention, inside and after the feed-forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../runtime/error.h"
#include "train.h"

typedef struct {
    float *q, *k, *v, *P, *Pd, *ctx; /* [D, d] x3, [heads, D, D] x2, [D, d] */
    float *r1, *mean1, *rstd1, *x1;   /* [D, d], [D], [D], [D, d] */
    float *h, *hd;                    /* [D, ff] after ReLU, after dropout */
    float *r2, *mean2, *rstd2, *x2;
    unsigned char *m1, *mh, *m2;      /* dropout masks [D, d], [D, ff], [D, d] */
} blk_acts;

typedef struct {
    int T;
    float *tok, *cq, *ck, *cv, *cP, *cPd, *cctx, *x0; /* [T,d], [D,d], [T,d] x2, [heads,D,T] x2, [D,d] x2 */
    blk_acts b[PRED_BLOCKS];
    float *seg, *op;                                  /* [D], [D, 3] */
} acts;

/* Carve the activations of one example out of fb / bb; with NULL buffers
 * only count. Returns the floats used; *bytes the mask bytes. */
static size_t acts_layout(acts *a, const polar_predictor *p, int T, float *fb, unsigned char *bb, size_t *bytes) {
    size_t nf = 0, nb = 0, D = (size_t)p->D, d = (size_t)p->d, H = (size_t)p->heads, ff = (size_t)p->ff;
#define F(ptr, cnt) (ptr = fb ? fb + nf : NULL, nf += (cnt))
#define B(ptr, cnt) (ptr = bb ? bb + nb : NULL, nb += (cnt))
    a->T = T;
    F(a->tok, T * d), F(a->cq, D * d), F(a->ck, T * d), F(a->cv, T * d);
    F(a->cP, H * D * T), F(a->cPd, H * D * T), F(a->cctx, D * d), F(a->x0, D * d);
    for (int i = 0; i < PRED_BLOCKS; i++) {
        blk_acts *k = &a->b[i];
        F(k->q, D * d), F(k->k, D * d), F(k->v, D * d), F(k->P, H * D * D), F(k->Pd, H * D * D), F(k->ctx, D * d);
        F(k->r1, D * d), F(k->mean1, D), F(k->rstd1, D), F(k->x1, D * d), F(k->h, D * ff), F(k->hd, D * ff);
        F(k->r2, D * d), F(k->mean2, D), F(k->rstd2, D), F(k->x2, D * d);
        B(k->m1, D * d), B(k->mh, D * ff), B(k->m2, D * d);
    }
    F(a->seg, D), F(a->op, 3 * D);
#undef F
#undef B
    *bytes = nb;
    return nf;
}

/* Floats of backward scratch for T tokens: the running gradient and the
 * per-op gradient buffers (see example_backward). */
static size_t bwd_floats(const polar_predictor *p, int T) {
    size_t n = (size_t)(T > p->D ? T : p->D), d = (size_t)p->d;
    return 12 * n * d + 2 * (size_t)p->D * p->ff + n + 4 * (size_t)p->D;
}

/* One encoder layer in training mode: x [D, d] -> k->x2. */
static void block_forward(const polar_predictor *p, const pred_block *w, blk_acts *k, const float *x, float drop,
                          polar_rng *rng) {
    int D = p->D, d = p->d, ff = p->ff;
    size_t Dd = (size_t)D * d, Dff = (size_t)D * ff;
    tr_linear_fwd(k->q, x, w->attn.in_w, w->attn.in_b, D, d, d);
    tr_linear_fwd(k->k, x, w->attn.in_w + (size_t)d * d, w->attn.in_b + d, D, d, d);
    tr_linear_fwd(k->v, x, w->attn.in_w + 2 * (size_t)d * d, w->attn.in_b + 2 * d, D, d, d);
    tr_attn_fwd(k->ctx, k->P, k->Pd, k->q, k->k, k->v, D, D, d, p->heads, drop, rng);
    tr_linear_fwd(k->r1, k->ctx, w->attn.out_w, w->attn.out_b, D, d, d);
    tr_dropout_fwd(k->r1, k->m1, k->r1, Dd, drop, rng);
    for (size_t i = 0; i < Dd; i++) k->r1[i] += x[i];
    tr_layernorm_fwd(k->x1, k->mean1, k->rstd1, k->r1, w->norm1_w, w->norm1_b, D, d);
    tr_linear_fwd(k->h, k->x1, w->lin1_w, w->lin1_b, D, ff, d);
    tr_relu_fwd(k->h, Dff);
    tr_dropout_fwd(k->hd, k->mh, k->h, Dff, drop, rng);
    tr_linear_fwd(k->r2, k->hd, w->lin2_w, w->lin2_b, D, d, ff);
    tr_dropout_fwd(k->r2, k->m2, k->r2, Dd, drop, rng);
    for (size_t i = 0; i < Dd; i++) k->r2[i] += k->x1[i];
    tr_layernorm_fwd(k->x2, k->mean2, k->rstd2, k->r2, w->norm2_w, w->norm2_b, D, d);
}

static void example_forward(const polar_predictor *p, acts *a, const float *H, float drop, polar_rng *rng) {
    int D = p->D, d = p->d, T = a->T;
    const pred_mha *c = &p->cross;
    tr_linear_fwd(a->tok, H, p->q_proj_w, p->q_proj_b, T, d, p->dq);
    tr_linear_fwd(a->cq, p->layer_emb, c->in_w, c->in_b, D, d, d);
    tr_linear_fwd(a->ck, a->tok, c->in_w + (size_t)d * d, c->in_b + d, T, d, d);
    tr_linear_fwd(a->cv, a->tok, c->in_w + 2 * (size_t)d * d, c->in_b + 2 * d, T, d, d);
    tr_attn_fwd(a->cctx, a->cP, a->cPd, a->cq, a->ck, a->cv, D, T, d, p->heads, drop, rng);
    tr_linear_fwd(a->x0, a->cctx, c->out_w, c->out_b, D, d, d);
    const float *x = a->x0;
    for (int i = 0; i < PRED_BLOCKS; i++) {
        block_forward(p, &p->blocks[i], &a->b[i], x, drop, rng);
        x = a->b[i].x2;
    }
    tr_linear_fwd(a->seg, x, p->seg_w, p->seg_b, D, 1, d);
    tr_linear_fwd(a->op, x, p->op_w, p->op_b, D, 3, d);
}

polar_status pred_forward_cpu(const polar_predictor *p, const float *H, int T, float *seg, float *op,
                              polar_error *err) {
    acts a;
    size_t bytes, floats = acts_layout(&a, p, T, NULL, NULL, &bytes);
    float *fb = malloc(floats * sizeof *fb);
    unsigned char *bb = malloc(bytes);
    if (!fb || !bb) {
        free(fb), free(bb);
        return polar_fail(err, POLAR_ERR_NOMEM, "predict: out of memory");
    }
    acts_layout(&a, p, T, fb, bb, &bytes);
    example_forward(p, &a, H, 0.0f, NULL);
    memcpy(seg, a.seg, (size_t)p->D * sizeof *seg);
    memcpy(op, a.op, (size_t)p->D * 3 * sizeof *op);
    free(fb), free(bb);
    return POLAR_OK;
}

/* The gradient of a weight: same offset in g as the weight in p->storage. */
#define GR(ptr) (g + ((ptr) - p->storage))

/* dx2 [D, d] -> dx [D, d] (+=), the layer's weight gradients into g.
 * s: scratch of 8 [D, d] and 2 [D, ff] buffers and D floats. */
static void block_backward(const polar_predictor *p, const pred_block *w, const blk_acts *k, const float *x,
                           const float *dx2, float *dx, float drop, float *g, float *s) {
    int D = p->D, d = p->d, ff = p->ff;
    size_t Dd = (size_t)D * d, Dff = (size_t)D * ff;
    float *dr2 = s, *dx1 = dr2 + Dd, *df = dx1 + Dd, *dr1 = df + Dd, *dsa = dr1 + Dd, *dctx = dsa + Dd;
    float *dq = dctx + Dd, *dk = dq + Dd, *dv = dk + Dd, *dhd = dv + Dd, *dh = dhd + Dff, *scratch = dh + Dff;
    memset(s, 0, (9 * Dd + 2 * Dff) * sizeof *s);
    tr_layernorm_bwd(dr2, GR(w->norm2_w), GR(w->norm2_b), dx2, k->r2, k->mean2, k->rstd2, w->norm2_w, D, d);
    memcpy(dx1, dr2, Dd * sizeof *dx1); /* the residual */
    tr_dropout_bwd(df, dr2, k->m2, Dd, drop);
    tr_linear_bwd(dhd, GR(w->lin2_w), GR(w->lin2_b), df, k->hd, w->lin2_w, D, d, ff);
    tr_dropout_bwd(dh, dhd, k->mh, Dff, drop);
    tr_relu_bwd(dh, k->h, Dff);
    tr_linear_bwd(dx1, GR(w->lin1_w), GR(w->lin1_b), dh, k->x1, w->lin1_w, D, ff, d);
    tr_layernorm_bwd(dr1, GR(w->norm1_w), GR(w->norm1_b), dx1, k->r1, k->mean1, k->rstd1, w->norm1_w, D, d);
    for (size_t i = 0; i < Dd; i++) dx[i] += dr1[i]; /* the residual */
    tr_dropout_bwd(dsa, dr1, k->m1, Dd, drop);
    tr_linear_bwd(dctx, GR(w->attn.out_w), GR(w->attn.out_b), dsa, k->ctx, w->attn.out_w, D, d, d);
    tr_attn_bwd(dq, dk, dv, dctx, k->P, k->Pd, k->q, k->k, k->v, D, D, d, p->heads, drop, scratch);
    const float *iw = w->attn.in_w, *ib = w->attn.in_b;
    size_t dd = (size_t)d * d;
    tr_linear_bwd(dx, GR(iw), GR(ib), dq, x, iw, D, d, d);
    tr_linear_bwd(dx, GR(iw) + dd, GR(ib) + d, dk, x, iw + dd, D, d, d);
    tr_linear_bwd(dx, GR(iw) + 2 * dd, GR(ib) + 2 * d, dv, x, iw + 2 * dd, D, d, d);
}

/* dseg [D], dop [D, 3] -> every weight's gradient (+=) into g. */
static void example_backward(const polar_predictor *p, const acts *a, const float *H, const float *dseg,
                             const float *dop, float drop, float *g, float *s) {
    int D = p->D, d = p->d, T = a->T, n = T > D ? T : D;
    size_t Dd = (size_t)D * d, nd = (size_t)n * d, dd = (size_t)d * d;
    float *dx = s, *dprev = dx + nd, *work = dprev + nd; /* work: 8 nd + 2 D ff + n floats */
    memset(dx, 0, Dd * sizeof *dx);
    const float *xl = a->b[PRED_BLOCKS - 1].x2;
    tr_linear_bwd(dx, GR(p->seg_w), GR(p->seg_b), dseg, xl, p->seg_w, D, 1, d);
    tr_linear_bwd(dx, GR(p->op_w), GR(p->op_b), dop, xl, p->op_w, D, 3, d);
    for (int i = PRED_BLOCKS - 1; i >= 0; i--) {
        const float *x = i ? a->b[i - 1].x2 : a->x0;
        memset(dprev, 0, Dd * sizeof *dprev);
        block_backward(p, &p->blocks[i], &a->b[i], x, dx, dprev, drop, g, work);
        float *t = dx;
        dx = dprev, dprev = t;
    }
    /* cross attention: dx is d(x0) now */
    const pred_mha *c = &p->cross;
    float *dcctx = dprev, *dcq = work, *dck = dcq + nd, *dcv = dck + nd, *dtok = dcv + nd, *scratch = dtok + nd;
    memset(dcctx, 0, Dd * sizeof *dcctx);
    memset(dcq, 0, 4 * nd * sizeof *dcq);
    tr_linear_bwd(dcctx, GR(c->out_w), GR(c->out_b), dx, a->cctx, c->out_w, D, d, d);
    tr_attn_bwd(dcq, dck, dcv, dcctx, a->cP, a->cPd, a->cq, a->ck, a->cv, D, T, d, p->heads, drop, scratch);
    tr_linear_bwd(GR(p->layer_emb), GR(c->in_w), GR(c->in_b), dcq, p->layer_emb, c->in_w, D, d, d);
    tr_linear_bwd(dtok, GR(c->in_w) + dd, GR(c->in_b) + d, dck, a->tok, c->in_w + dd, T, d, d);
    tr_linear_bwd(dtok, GR(c->in_w) + 2 * dd, GR(c->in_b) + 2 * d, dcv, a->tok, c->in_w + 2 * dd, T, d, d);
    tr_linear_bwd(NULL, GR(p->q_proj_w), GR(p->q_proj_b), dtok, H, p->q_proj_w, T, d, p->dq);
}
#undef GR

/* A seed per (run, step, example): splitmix64's finaliser over the mix, so
 * neighbouring examples get unrelated streams. */
static uint64_t example_seed(uint64_t seed, uint64_t step, uint64_t i) {
    uint64_t z = seed ^ (step * 0x9e3779b97f4a7c15ull) ^ (i * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static polar_status check_batch(const polar_predictor *p, const polar_train_example *ex, int n, float dropout,
                                polar_error *err) {
    if (!p || !ex || n < 1) return polar_fail(err, POLAR_ERR_ARG, "train: no examples");
    if (p->cuda) return polar_fail(err, POLAR_ERR_ARG, "train: the predictor runs on a GPU; train it on the CPU");
    if (!(dropout >= 0.0f && dropout < 1.0f)) return polar_fail(err, POLAR_ERR_ARG, "train: dropout %g", dropout);
    if (p->d % p->heads) return polar_fail(err, POLAR_ERR_ARG, "train: d %d not divisible by %d heads", p->d, p->heads);
    for (int i = 0; i < n; i++) {
        const polar_train_example *e = &ex[i];
        if (!e->h || !e->seg_start || !e->ops) return polar_fail(err, POLAR_ERR_ARG, "train: example %d is empty", i);
        if (e->T < 1 || e->T > PRED_MAX_TOKENS)
            return polar_fail(err, POLAR_ERR_ARG, "train: example %d has %d token states (1 to %d)", i, e->T,
                              PRED_MAX_TOKENS);
        if (!(e->weight >= 0.0f && e->weight < INFINITY))
            return polar_fail(err, POLAR_ERR_ARG, "train: example %d has weight %g", i, e->weight);
        for (int l = 0; l < p->D; l++)
            if (e->ops[l] < -1 || e->ops[l] > 2)
                return polar_fail(err, POLAR_ERR_ARG, "train: example %d has op %d at layer %d", i, e->ops[l], l);
    }
    return POLAR_OK;
}

/* The buffers sized by threads, examples and tokens (not the chunk sums). */
static void free_batch_buffers(pred_batch_ws *w) {
    for (int t = 0; t < w->threads; t++) {
        if (w->fb) free(w->fb[t]);
        if (w->bb) free(w->bb[t]);
    }
    free(w->fb), free(w->bb), free(w->losses);
    w->fb = NULL, w->bb = NULL, w->losses = NULL;
    w->threads = w->examples = w->tokens = 0;
}

void pred_batch_ws_free(pred_batch_ws *w) {
    free_batch_buffers(w);
    for (int c = 0; c < PRED_GRAD_CHUNKS; c++) free(w->tgrad[c]);
    memset(w, 0, sizeof *w);
}

/* Room for n examples of at most T_max token states on nt threads: kept
 * from step to step, grown (all at once) only when a batch needs more. */
static int ws_reserve(pred_batch_ws *w, const polar_predictor *p, int n, int T_max, int nt) {
    if (w->threads >= nt && w->examples >= n && w->tokens >= T_max) return 1;
    int keep_n = w->examples > n ? w->examples : n, keep_T = w->tokens > T_max ? w->tokens : T_max;
    int keep_nt = w->threads > nt ? w->threads : nt;
    free_batch_buffers(w);
    acts tmpl;
    size_t nbytes, nact = acts_layout(&tmpl, p, keep_T, NULL, NULL, &nbytes), nbwd = bwd_floats(p, keep_T);
    w->threads = keep_nt, w->examples = keep_n, w->tokens = keep_T;
    w->fb = calloc((size_t)keep_nt, sizeof *w->fb);
    w->bb = calloc((size_t)keep_nt, sizeof *w->bb);
    w->losses = malloc((size_t)keep_n * sizeof *w->losses);
    int ok = w->fb && w->bb && w->losses;
    for (int t = 0; ok && t < keep_nt; t++) {
        w->fb[t] = malloc((nact + nbwd + 4 * (size_t)p->D) * sizeof(float));
        w->bb[t] = malloc(nbytes);
        ok = w->fb[t] && w->bb[t];
    }
    if (!ok) free_batch_buffers(w);
    return ok;
}

polar_status pred_batch_grad(const polar_predictor *p, const polar_train_example *ex, int n, float dropout,
                             uint64_t seed, uint64_t step, float *grad, double *loss, pred_batch_ws *ws,
                             polar_error *err) {
    polar_status st = check_batch(p, ex, n, dropout, err);
    if (st != POLAR_OK) return st;
    int T_max = 1, nt = 1, chunks = n < PRED_GRAD_CHUNKS ? n : PRED_GRAD_CHUNKS;
    for (int i = 0; i < n; i++) T_max = ex[i].T > T_max ? ex[i].T : T_max;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    nt = nt < chunks ? nt : chunks;
    int ok = ws_reserve(ws, p, n, T_max, nt);
    for (int c = 1; ok && grad && c < chunks; c++) /* chunk 0 sums into grad */
        if (!ws->tgrad[c]) ok = (ws->tgrad[c] = malloc(p->storage_floats * sizeof(float))) != NULL;
    if (!ok) return polar_fail(err, POLAR_ERR_NOMEM, "train: out of memory for a batch of %d", n);
    double wsum = 0.0;
    for (int i = 0; i < n; i++) wsum += ex[i].weight;
    double wnorm = 1.0 / (wsum / n + 1e-8); /* the reference's w / (mean(w) + 1e-8) */
    size_t G = p->storage_floats, nbytes;
    acts tmpl;
    size_t nact = acts_layout(&tmpl, p, ws->tokens, NULL, NULL, &nbytes), nbwd = bwd_floats(p, ws->tokens);
    double *losses = ws->losses;
#pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *fb = ws->fb[tid];
        unsigned char *bb = ws->bb[tid];
#pragma omp for schedule(static)
        for (int c = 0; c < chunks; c++) {
            float *g = !grad ? NULL : c == 0 ? grad : ws->tgrad[c];
            if (g) memset(g, 0, G * sizeof *g);
            for (int i = (int)((long)n * c / chunks); i < (int)((long)n * (c + 1) / chunks); i++) {
                acts a;
                acts_layout(&a, p, ex[i].T, fb, bb, &nbytes);
                float *dseg = fb + nact + nbwd, *dop = dseg + p->D;
                polar_rng rng;
                polar_rng_seed(&rng, example_seed(seed, step, (uint64_t)i));
                example_forward(p, &a, ex[i].h, dropout, &rng);
                double wi = ex[i].weight * wnorm;
                losses[i] = wi * tr_example_loss(a.seg, a.op, ex[i].seg_start, ex[i].ops, p->D, g ? dseg : NULL,
                                                 g ? dop : NULL, (float)(wi / n));
                if (g) example_backward(p, &a, ex[i].h, dseg, dop, dropout, g, fb + nact);
            }
        }
    }
    if (grad) {
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < G; j++)
            for (int c = 1; c < chunks; c++) grad[j] += ws->tgrad[c][j];
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) total += losses[i];
    *loss = total / n;
    return POLAR_OK;
}

polar_status polar_train_loss(const polar_predictor *p, const polar_train_example *ex, int n, double *loss,
                              polar_error *err) {
    if (!loss) return polar_fail(err, POLAR_ERR_ARG, "train loss: missing argument");
    pred_batch_ws ws = {0}; /* once per validation pass, not per training step */
    polar_status st = pred_batch_grad(p, ex, n, 0.0f, 0, 0, NULL, loss, &ws, err);
    pred_batch_ws_free(&ws);
    return st;
}
