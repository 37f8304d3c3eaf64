/* A fresh predictor (PyTorch's default initialisation), saving it, and the
 * trainer: AdamW with the reference's warm-up + cosine learning rate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loader/safetensors.h"
#include "../runtime/error.h"
#include "train.h"

polar_predictor_shape polar_predictor_default_shape(int n_layers, int input_dim) {
    return (polar_predictor_shape){n_layers, 256, 4, 1024, input_dim};
}

static void fill_uniform(float *x, size_t n, double bound, polar_rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((2.0 * polar_rng_uniform(r) - 1.0) * bound);
}

/* N(0, 1) by Box-Muller. */
static void fill_normal(float *x, size_t n, polar_rng *r) {
    for (size_t i = 0; i < n; i++) {
        double u = 1.0 - polar_rng_uniform(r), v = polar_rng_uniform(r);
        x[i] = (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
    }
}

/* PyTorch's defaults for each tensor of the reference module. */
static void init_tensor(const pred_ref *r, float *x, polar_rng *rng) {
    size_t n = pred_ref_count(r);
    const char *nm = r->name;
    if (strstr(nm, "norm") && strstr(nm, "weight")) {
        for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    } else if (strstr(nm, "in_proj_bias") || strstr(nm, "out_proj.bias") || strstr(nm, "norm")) {
        memset(x, 0, n * sizeof *x); /* MultiheadAttention zeroes its biases; LayerNorm bias */
    } else if (!strcmp(nm, "layer_embedding.weight")) {
        fill_normal(x, n, rng);
    } else if (strstr(nm, "in_proj_weight")) {
        fill_uniform(x, n, sqrt(6.0 / (r->rows + r->cols)), rng); /* Xavier over [3d, d] */
    } else {
        /* nn.Linear: kaiming_uniform(a = sqrt(5)) and its bias, both +-1/sqrt(fan_in) */
        int fan_in = r->cols ? r->cols : r[-1].cols;
        fill_uniform(x, n, 1.0 / sqrt((double)fan_in), rng);
    }
}

static polar_status alloc_predictor(const polar_predictor_shape *s, polar_predictor **out, pred_ref *refs,
                                    polar_error *err) {
    *out = NULL;
    if (!s || s->n_layers < 1 || s->n_layers > 4096 || s->d_model < 1 || s->d_model > 65536 || s->heads < 1 ||
        s->d_model % s->heads || s->ff < 1 || s->ff > 1 << 20 || s->input_dim < 1 || s->input_dim > 65536)
        return polar_fail(err, POLAR_ERR_ARG, "predictor shape: D %d, d %d, %d heads, ff %d, d_q %d", s ? s->n_layers : 0,
                          s ? s->d_model : 0, s ? s->heads : 0, s ? s->ff : 0, s ? s->input_dim : 0);
    polar_predictor *p = calloc(1, sizeof *p);
    if (!p) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    p->D = s->n_layers, p->d = s->d_model, p->dq = s->input_dim, p->heads = s->heads, p->ff = s->ff;
    int n = pred_tensor_refs(p, refs);
    for (int i = 0; i < n; i++) p->storage_floats += pred_ref_count(&refs[i]);
    if (!(p->storage = calloc(p->storage_floats, sizeof(float)))) {
        size_t want = p->storage_floats;
        free(p);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for %zu predictor weights", want);
    }
    float *next = p->storage;
    for (int i = 0; i < n; i++) {
        *refs[i].dst = next;
        next += pred_ref_count(&refs[i]);
    }
    *out = p;
    return POLAR_OK;
}

polar_status polar_predictor_create(const polar_predictor_shape *s, uint64_t seed, polar_predictor **out,
                                    polar_error *err) {
    pred_ref refs[PRED_TENSORS];
    polar_status st = alloc_predictor(s, out, refs, err);
    if (st != POLAR_OK) return st;
    polar_predictor *p = *out;
    polar_rng rng;
    polar_rng_seed(&rng, seed);
    for (int i = 0; i < PRED_TENSORS; i++) init_tensor(&refs[i], p->storage + (*refs[i].dst - p->storage), &rng);
    /* nn.TransformerEncoder deep-copies its layer: every block starts as block 0 */
    size_t blk = (size_t)(p->blocks[1].attn.in_w - p->blocks[0].attn.in_w);
    for (int b = 1; b < PRED_BLOCKS; b++)
        memcpy(p->storage + (p->blocks[b].attn.in_w - p->storage), p->blocks[0].attn.in_w, blk * sizeof(float));
    return POLAR_OK;
}

polar_status polar_predictor_save(const polar_predictor *p, const char *path, polar_error *err) {
    if (!p || !path) return polar_fail(err, POLAR_ERR_ARG, "predictor save: missing argument");
    pred_ref refs[PRED_TENSORS];
    polar_predictor q = *p; /* pred_tensor_refs points its entries at q's fields, which are not used */
    int n = pred_tensor_refs(&q, refs);
    st_write_tensor t[PRED_TENSORS];
    for (int i = 0; i < n; i++)
        t[i] = (st_write_tensor){refs[i].name, ST_F32, refs[i].cols ? 2 : 1, {refs[i].rows, refs[i].cols}, *refs[i].dst};
    /* program texts hold only digits, ',', '-', 'x' and ';': nothing JSON must escape */
    int listed = polar_catalogue_size(p->catalogue) > 0; /* an empty list is not written: it would not parse */
    char *programs = listed ? pred_catalogue_format(p->catalogue) : NULL;
    char *meta = malloc(64 + (programs ? strlen(programs) + sizeof PRED_META_PROGRAMS + 8 : 0));
    if (!meta || (listed && !programs)) {
        free(programs), free(meta);
        return polar_fail(err, POLAR_ERR_NOMEM, "predictor save: out of memory");
    }
    int at = sprintf(meta, "{\"nheads\":\"%d\"", p->heads);
    if (programs) at += sprintf(meta + at, ",\"%s\":\"%s\"", PRED_META_PROGRAMS, programs);
    strcpy(meta + at, "}");
    polar_status st = st_write_meta(path, t, (size_t)n, meta, err);
    free(programs);
    free(meta);
    return st;
}

polar_train_opts polar_train_defaults(int total_steps) {
    return (polar_train_opts){5e-4, 10, total_steps, 0.9, 0.999, 1e-8, 0.0, 0.1f, 42};
}

struct polar_trainer {
    polar_predictor *p;
    polar_train_opts o;
    float *grad, *m, *v; /* laid out as p->storage */
    pred_batch_ws ws;    /* allocated by the first step, reused by the rest */
    int step;
};

polar_status polar_trainer_create(polar_predictor *p, const polar_train_opts *o, polar_trainer **out,
                                  polar_error *err) {
    *out = NULL;
    if (!p || !o) return polar_fail(err, POLAR_ERR_ARG, "trainer: missing argument");
    if (p->cuda) return polar_fail(err, POLAR_ERR_ARG, "trainer: the predictor runs on a GPU; train it on the CPU");
    if (!(o->lr >= 0) || o->warmup < 0 || o->total_steps < 1 || !(o->beta1 >= 0 && o->beta1 < 1) ||
        !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps > 0) || !(o->weight_decay >= 0) ||
        !(o->dropout >= 0 && o->dropout < 1))
        return polar_fail(err, POLAR_ERR_ARG, "trainer: bad options (lr %g, warm-up %d, %d steps, dropout %g)", o->lr,
                          o->warmup, o->total_steps, o->dropout);
    polar_trainer *t = calloc(1, sizeof *t);
    size_t G = p->storage_floats;
    if (t) {
        t->grad = malloc(G * sizeof(float));
        t->m = calloc(G, sizeof(float));
        t->v = calloc(G, sizeof(float));
    }
    if (!t || !t->grad || !t->m || !t->v) {
        polar_trainer_free(t);
        return polar_fail(err, POLAR_ERR_NOMEM, "trainer: out of memory");
    }
    t->p = p;
    t->o = *o;
    *out = t;
    return POLAR_OK;
}

void polar_trainer_free(polar_trainer *t) {
    if (!t) return;
    free(t->grad);
    free(t->m);
    free(t->v);
    pred_batch_ws_free(&t->ws);
    free(t);
}

/* The reference's LambdaLR: step/warmup during the warm-up (0 at the first
 * step), then 0.5 (1 + cos(pi progress)) over the remaining steps. */
double polar_trainer_lr(const polar_trainer *t) {
    if (!t) return 0.0;
    int total = t->o.total_steps, warm = t->o.warmup < total - 1 ? t->o.warmup : total - 1, k = t->step;
    if (warm > 0 && k < warm) return t->o.lr * k / warm;
    if (total <= warm) return t->o.lr;
    double prog = (double)(k - warm) / (total - warm);
    prog = prog < 0 ? 0 : prog > 1 ? 1 : prog;
    return t->o.lr * 0.5 * (1.0 + cos(M_PI * prog));
}

int polar_trainer_steps(const polar_trainer *t) { return t ? t->step : 0; }

polar_status polar_train_step(polar_trainer *t, const polar_train_example *ex, int n, double *loss, polar_error *err) {
    if (!t || !loss) return polar_fail(err, POLAR_ERR_ARG, "train step: missing argument");
    double l;
    polar_status st = pred_batch_grad(t->p, ex, n, t->o.dropout, t->o.seed, (uint64_t)t->step, t->grad, &l, &t->ws, err);
    if (st != POLAR_OK) return st;
    if (!isfinite(l)) return polar_fail(err, POLAR_ERR_RANGE, "train step %d: the loss is %g", t->step, l);
    /* PyTorch's AdamW: decoupled decay, then m / (sqrt(v / bc2) + eps) * lr / bc1 */
    double lr = polar_trainer_lr(t), b1 = t->o.beta1, b2 = t->o.beta2;
    int k = t->step + 1;
    double bc1 = 1.0 - pow(b1, k), bc2 = sqrt(1.0 - pow(b2, k)), decay = 1.0 - lr * t->o.weight_decay;
    float *w = t->p->storage, *g = t->grad, *m = t->m, *v = t->v;
    size_t G = t->p->storage_floats;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < G; i++) {
        m[i] = (float)(b1 * m[i] + (1.0 - b1) * g[i]);
        v[i] = (float)(b2 * v[i] + (1.0 - b2) * (double)g[i] * g[i]);
        w[i] = (float)(w[i] * decay - lr / bc1 * m[i] / (sqrt(v[i]) / bc2 + t->o.eps));
    }
    t->step++;
    *loss = l;
    return POLAR_OK;
}
