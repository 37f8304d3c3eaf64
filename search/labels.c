/* Reading polar search labels (labels.h), and training examples from them,
 * built as the reference's PolarDataset builds them: per question
 * its final_valid_transitions, at most max_paths of them chosen with a
 * seeded stream, each in segment form (the codec's rejects counted and
 * skipped); the base program 0..D-1 is an example when it is among the
 * valid ones, weighted orig_weight when the question also has a shorter
 * valid program (else 1). Questions without a valid program give none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "labels.h"

#define KMAX 4 /* the reference's max_pack */

static char *dup_str(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

static int is_base(const int *layers, int n, int D) {
    if (n != D) return 0;
    for (int i = 0; i < n; i++)
        if (layers[i] != i) return 0;
    return 1;
}

/* One question's examples into q (q->question already set). */
static polar_status add_question(polar_train_labels *l, polar_label_question *q, const json_value *valid, int max_paths,
                                 float orig_weight, polar_rng *rng, const char *where, polar_error *err) {
    int D = l->n_layers, nv = (int)valid->len;
    int *layers = malloc((size_t)4 * D * sizeof *layers), *pick = malloc((size_t)(nv ? nv : 1) * sizeof *pick);
    q->seg_start = malloc((size_t)(nv ? nv : 1) * D);
    q->ops = malloc((size_t)(nv ? nv : 1) * D * sizeof *q->ops);
    q->weight = malloc((size_t)(nv ? nv : 1) * sizeof *q->weight);
    polar_status st = POLAR_OK;
    if (!layers || !pick || !q->seg_start || !q->ops || !q->weight) st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    /* the base program's weight drops when a shorter valid program exists */
    int has_base = 0, has_shorter = 0;
    for (int i = 0; st == POLAR_OK && i < nv; i++) {
        int n = pred_label_path(valid->items[i], D, 4 * D, layers), r = n;
        if (r < 0) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: a valid program runs a layer outside 0..%d", where, D - 1);
        if (r <= 0) continue;
        if (is_base(layers, n, D)) has_base = 1;
        else if (n < D) has_shorter = 1;
    }
    /* at most max_paths, chosen by a partial Fisher-Yates shuffle */
    for (int i = 0; i < nv && pick; i++) pick[i] = i;
    int take = nv < max_paths ? nv : max_paths;
    if (nv > max_paths) {
        l->capped += nv - max_paths;
        for (int i = 0; i < take; i++) {
            int j = i + (int)(polar_rng_uniform(rng) * (nv - i));
            int t = pick[i];
            pick[i] = pick[j], pick[j] = t;
        }
    }
    for (int i = 0; st == POLAR_OK && i < take; i++) {
        int n = pred_label_path(valid->items[pick[i]], D, 4 * D, layers);
        if (n <= 0) continue;
        l->programs++;
        polar_program p = {n, layers};
        polar_error e2;
        if (polar_program_to_segments(&p, D, KMAX, q->seg_start + (size_t)q->n * D, q->ops + (size_t)q->n * D, &e2) !=
            POLAR_OK) {
            l->rejected++;
            continue;
        }
        q->weight[q->n++] = is_base(layers, n, D) && has_base && has_shorter ? orig_weight : 1.0f;
    }
    free(layers);
    free(pick);
    return st;
}

static void free_question(polar_label_question *q) {
    free(q->question);
    free(q->seg_start);
    free(q->ops);
    free(q->weight);
}

int pred_label_path(const json_value *v, int n_layers, int max_len, int *layers) {
    if (v && v->type == JSON_OBJECT) v = json_get(v, "path");
    if (!v || v->type != JSON_ARRAY || v->len == 0 || v->len > (size_t)max_len) return 0;
    for (size_t i = 0; i < v->len; i++) {
        const json_value *x = v->items[i];
        if (x->type != JSON_NUMBER || !x->is_integer) return 0;
        if (x->number < 0 || x->number >= n_layers) return -1;
        layers[i] = (int)x->number;
    }
    return (int)v->len;
}

/* Without trailing blanks the line must end in '}': otherwise it was torn. */
static int line_complete(const char *line, size_t n) {
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
    return n > 0 && line[n - 1] == '}';
}

polar_status pred_labels_each(const char *path, pred_label_fn fn, void *ctx, polar_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return polar_fail(err, POLAR_ERR_IO, "%s: cannot open the labels file", path);
    char *line = NULL, where[600];
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    polar_status st = POLAR_OK;
    while (st == POLAR_OK && (got = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (!line_complete(line, (size_t)got)) continue;
        snprintf(where, sizeof where, "%.500s:%ld", path, lineno);
        json_doc *doc;
        if ((st = json_parse(line, (size_t)got, where, &doc, err)) != POLAR_OK) break;
        pred_label_line l = {where, json_root(doc), json_get(json_root(doc), "final_valid_transitions")};
        if (!l.valid || l.valid->type != JSON_ARRAY)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: no final_valid_transitions: not a polar search line", where);
        else
            st = fn(&l, ctx, err);
        json_free(doc);
    }
    free(line);
    fclose(f);
    return st;
}

typedef struct {
    polar_train_labels *l;
    int max_paths;
    float orig_weight;
    polar_rng *rng;
} load_ctx;

static polar_status add_line(const pred_label_line *line, void *ctx, polar_error *err) {
    load_ctx *c = ctx;
    polar_train_labels *l = c->l;
    const json_value *qv = json_get(line->root, "question");
    if (!qv || qv->type != JSON_STRING)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: no question: not a polar search line", line->where);
    l->lines++;
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 64;
        polar_label_question *nq = realloc(l->q, (size_t)nc * sizeof *nq);
        if (!nq) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
        l->q = nq, l->cap = nc;
    }
    polar_label_question q = {0};
    polar_status st = POLAR_OK;
    if (!(q.question = dup_str(qv->str, qv->len))) st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    if (st == POLAR_OK) st = add_question(l, &q, line->valid, c->max_paths, c->orig_weight, c->rng, line->where, err);
    if (st == POLAR_OK && q.n > 0) {
        l->q[l->n++] = q;
        return POLAR_OK;
    }
    free_question(&q);
    if (st == POLAR_OK) l->no_examples++;
    return st;
}

polar_status polar_train_labels_load(const char *const *paths, int n_paths, int n_layers, int max_paths,
                                     float orig_weight, uint64_t seed, polar_train_labels *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    if (!paths || n_paths < 1 || n_layers < 1 || n_layers > 4096 || max_paths < 1 ||
        !(orig_weight >= 0.0f && orig_weight < 1e30f))
        return polar_fail(err, POLAR_ERR_ARG, "labels: bad arguments (%d files, D %d, max paths %d, weight %g)",
                          n_paths, n_layers, max_paths, orig_weight);
    out->n_layers = n_layers;
    polar_rng rng;
    polar_rng_seed(&rng, seed);
    polar_status st = POLAR_OK;
    load_ctx c = {out, max_paths, orig_weight, &rng};
    for (int i = 0; i < n_paths && st == POLAR_OK; i++) st = pred_labels_each(paths[i], add_line, &c, err);
    if (st == POLAR_OK && out->n == 0)
        st = polar_fail(err, POLAR_ERR_FORMAT, "%s: no training examples (%d questions, none with a valid program the "
                        "segment form expresses)", paths[0], out->lines);
    if (st != POLAR_OK) polar_train_labels_free(out);
    return st;
}

void polar_train_labels_free(polar_train_labels *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) free_question(&l->q[i]);
    free(l->q);
    memset(l, 0, sizeof *l);
}
