/* Reading polar search labels (labels.h), and training examples from them,
 * built as the reference's PolarDataset builds them: per question
 * its final_valid_transitions (pooled over every line that asks the same
 * question, each program once: several searches of the same questions
 * add up rather than repeat a question), at most max_paths of them chosen with a
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

/* The valid programs of one question, pooled over every line that asks it:
 * n programs, program i layers[off[i] .. off[i] + len[i]), each once. */
typedef struct {
    char *question;
    int n, cap;
    int *off, *len;
    int *layers;
    size_t used, room;
} label_pool;

/* q's examples from its pooled programs (q->question already set). */
static polar_status add_question(polar_train_labels *l, polar_label_question *q, const label_pool *pq, int max_paths,
                                 float orig_weight, polar_rng *rng, polar_error *err) {
    int D = l->n_layers, nv = pq->n;
    int *pick = malloc((size_t)(nv ? nv : 1) * sizeof *pick);
    q->seg_start = malloc((size_t)(nv ? nv : 1) * D);
    q->ops = malloc((size_t)(nv ? nv : 1) * D * sizeof *q->ops);
    q->weight = malloc((size_t)(nv ? nv : 1) * sizeof *q->weight);
    if (!pick || !q->seg_start || !q->ops || !q->weight) {
        free(pick);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    }
    /* the base program's weight drops when a shorter valid program exists */
    int has_base = 0, has_shorter = 0;
    for (int i = 0; i < nv; i++) {
        if (is_base(pq->layers + pq->off[i], pq->len[i], D)) has_base = 1;
        else if (pq->len[i] < D) has_shorter = 1;
    }
    /* at most max_paths, chosen by a partial Fisher-Yates shuffle */
    for (int i = 0; i < nv; i++) pick[i] = i;
    int take = nv < max_paths ? nv : max_paths;
    if (nv > max_paths) {
        l->capped += nv - max_paths;
        for (int i = 0; i < take; i++) {
            int j = i + (int)(polar_rng_uniform(rng) * (nv - i));
            int t = pick[i];
            pick[i] = pick[j], pick[j] = t;
        }
    }
    for (int i = 0; i < take; i++) {
        int n = pq->len[pick[i]], *layers = pq->layers + pq->off[pick[i]];
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
    free(pick);
    return POLAR_OK;
}

/* A new program for pq unless it holds it already (1 added, 0 a duplicate, -1 out of memory). */
static int pool_add(label_pool *pq, const int *layers, int n) {
    for (int i = 0; i < pq->n; i++)
        if (pq->len[i] == n && !memcmp(pq->layers + pq->off[i], layers, (size_t)n * sizeof *layers)) return 0;
    if (pq->n == pq->cap) {
        int nc = pq->cap ? 2 * pq->cap : 8;
        int *no = realloc(pq->off, (size_t)nc * sizeof *no);
        if (!no) return -1;
        pq->off = no;
        int *nl = realloc(pq->len, (size_t)nc * sizeof *nl);
        if (!nl) return -1;
        pq->len = nl, pq->cap = nc;
    }
    if (pq->used + (size_t)n > pq->room) {
        size_t nr = 2 * (pq->used + (size_t)n);
        int *nl = realloc(pq->layers, nr * sizeof *nl);
        if (!nl) return -1;
        pq->layers = nl, pq->room = nr;
    }
    memcpy(pq->layers + pq->used, layers, (size_t)n * sizeof *layers);
    pq->off[pq->n] = (int)pq->used, pq->len[pq->n++] = n;
    pq->used += (size_t)n;
    return 1;
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
    while (st == POLAR_OK && (got = jsonl_read_line(f, &line, &cap, JSONL_MAX_LINE)) > 0) {
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
    if (st == POLAR_OK && got < 0) st = jsonl_line_fail(got, path, lineno + 1, "labels", err);
    free(line);
    fclose(f);
    return st;
}

/* The lines read so far, pooled by question (first-seen order), and a
 * hash table of the questions (FNV-1a; open addressing, slots 2^k, at
 * most half full; -1 empty). */
typedef struct {
    polar_train_labels *l;
    label_pool *pool;
    int n, cap;
    int *slots, n_slots;
    int *layers; /* [4 D] a line's program */
} load_ctx;

static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The slot of question s (n bytes): where it is, or the empty slot where it would go. */
static int find_slot(const load_ctx *c, const char *s, size_t n) {
    int mask = c->n_slots - 1, i = (int)(hash_str(s, n) & (uint64_t)mask);
    while (c->slots[i] >= 0) {
        const char *q = c->pool[c->slots[i]].question;
        if (strlen(q) == n && !memcmp(q, s, n)) break;
        i = (i + 1) & mask;
    }
    return i;
}

/* Room for one more question: the pool and (kept at most half full) the table. */
static int grow(load_ctx *c) {
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 64;
        label_pool *np = realloc(c->pool, (size_t)nc * sizeof *np);
        if (!np) return 0;
        c->pool = np, c->cap = nc;
    }
    if (2 * (c->n + 1) <= c->n_slots) return 1;
    int ns = c->n_slots ? 2 * c->n_slots : 128, *old = c->slots, old_n = c->n_slots;
    if (!(c->slots = malloc((size_t)ns * sizeof *c->slots))) {
        c->slots = old;
        return 0;
    }
    c->n_slots = ns;
    for (int i = 0; i < ns; i++) c->slots[i] = -1;
    for (int i = 0; i < old_n; i++)
        if (old[i] >= 0) {
            const char *q = c->pool[old[i]].question;
            c->slots[find_slot(c, q, strlen(q))] = old[i];
        }
    free(old);
    return 1;
}

static polar_status add_line(const pred_label_line *line, void *ctx, polar_error *err) {
    load_ctx *c = ctx;
    polar_train_labels *l = c->l;
    const json_value *qv = json_get(line->root, "question");
    if (!qv || qv->type != JSON_STRING)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: no question: not a polar search line", line->where);
    l->lines++;
    if (!grow(c)) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    int slot = find_slot(c, qv->str, qv->len);
    if (c->slots[slot] >= 0) {
        l->merged++;
    } else {
        label_pool *pq = &c->pool[c->n];
        memset(pq, 0, sizeof *pq);
        if (!(pq->question = dup_str(qv->str, qv->len))) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
        c->slots[slot] = c->n++;
    }
    label_pool *pq = &c->pool[c->slots[slot]];
    int D = l->n_layers;
    for (size_t i = 0; i < line->valid->len; i++) {
        int n = pred_label_path(line->valid->items[i], D, 4 * D, c->layers);
        if (n < 0)
            return polar_fail(err, POLAR_ERR_FORMAT, "%s: a valid program runs a layer outside 0..%d", line->where, D - 1);
        int added = n > 0 ? pool_add(pq, c->layers, n) : 1;
        if (added < 0) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
        if (!added) l->duplicates++;
    }
    return POLAR_OK;
}

/* Each pooled question's examples, in first-seen order. */
static polar_status build_examples(load_ctx *c, int max_paths, float orig_weight, polar_rng *rng, polar_error *err) {
    polar_train_labels *l = c->l;
    if (c->n && !(l->q = calloc((size_t)c->n, sizeof *l->q))) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    l->cap = c->n;
    for (int i = 0; i < c->n; i++) {
        polar_label_question q = {.question = c->pool[i].question};
        c->pool[i].question = NULL; /* q owns it now */
        polar_status st = add_question(l, &q, &c->pool[i], max_paths, orig_weight, rng, err);
        if (st == POLAR_OK && q.n > 0) {
            l->q[l->n++] = q;
            continue;
        }
        free_question(&q);
        if (st != POLAR_OK) return st;
        l->no_examples++;
    }
    return POLAR_OK;
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
    load_ctx c = {.l = out, .layers = malloc((size_t)4 * n_layers * sizeof(int))};
    polar_status st = c.layers ? POLAR_OK : polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_paths && st == POLAR_OK; i++) st = pred_labels_each(paths[i], add_line, &c, err);
    if (st == POLAR_OK) st = build_examples(&c, max_paths, orig_weight, &rng, err);
    for (int i = 0; i < c.n; i++) {
        free(c.pool[i].question);
        free(c.pool[i].off);
        free(c.pool[i].len);
        free(c.pool[i].layers);
    }
    free(c.pool);
    free(c.slots);
    free(c.layers);
    if (st == POLAR_OK && out->n == 0)
        st = polar_fail(err, POLAR_ERR_FORMAT, "%s: no training examples (%d questions, none with a valid program the "
                        "segment form expresses)", paths[0], out->lines - out->merged);
    if (st != POLAR_OK) polar_train_labels_free(out);
    return st;
}

void polar_train_labels_free(polar_train_labels *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) free_question(&l->q[i]);
    free(l->q);
    memset(l, 0, sizeof *l);
}
