/* Decoding by choice from a fixed set of programs: those the predictor was
 * trained on (polar train stores its training questions' valid programs in
 * the predictor file), each scored for a question by the training loss of
 * its segment form under the logits, lowest loss first.
 *
 * Why beside the beam: the reference decoder takes each segment's likeliest
 * op on its own, and a network trained on a few hundred labels learns each
 * factor's marginal, so the product of the likeliest factors is mostly a
 * program no label holds. This decoder answers with labelled programs only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "predictor.h"
#include "train.h"

struct polar_catalogue {
    int n, D;
    polar_program *programs;  /* [n], distinct */
    unsigned char *seg_start; /* [n, D] their segment forms */
    int *ops;                 /* [n, D] */
};

int pred_same_program(const polar_program *a, const polar_program *b) {
    return a->n == b->n && !memcmp(a->layers, b->layers, (size_t)a->n * sizeof *a->layers);
}

void polar_catalogue_free(polar_catalogue *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) polar_program_free(&c->programs[i]);
    free(c->programs);
    free(c->seg_start);
    free(c->ops);
    free(c);
}

int polar_catalogue_size(const polar_catalogue *c) { return c ? c->n : 0; }
const polar_program *polar_catalogue_program(const polar_catalogue *c, int i) {
    return c && i >= 0 && i < c->n ? &c->programs[i] : NULL;
}

static polar_status copy_program(const polar_program *src, polar_program *dst, polar_error *err) {
    dst->layers = malloc((size_t)(src->n ? src->n : 1) * sizeof *dst->layers);
    if (!dst->layers) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory copying a program");
    memcpy(dst->layers, src->layers, (size_t)src->n * sizeof *dst->layers);
    dst->n = src->n;
    return POLAR_OK;
}

polar_status polar_catalogue_create(const polar_program *programs, int n, int D, int kmax, polar_catalogue **out,
                                    polar_error *err) {
    *out = NULL;
    if ((!programs && n) || n < 0 || D < 1 || kmax < 1)
        return polar_fail(err, POLAR_ERR_ARG, "catalogue: bad arguments (%d programs, D %d, kmax %d)", n, D, kmax);
    polar_catalogue *c = calloc(1, sizeof *c);
    size_t cap = (size_t)(n ? n : 1);
    if (c) {
        c->D = D;
        c->programs = calloc(cap, sizeof *c->programs);
        c->seg_start = malloc(cap * D);
        c->ops = malloc(cap * D * sizeof *c->ops);
    }
    polar_status st = c && c->programs && c->seg_start && c->ops
                          ? POLAR_OK
                          : polar_fail(err, POLAR_ERR_NOMEM, "out of memory for a catalogue of %d programs", n);
    for (int i = 0; i < n && st == POLAR_OK; i++) {
        int seen = 0;
        for (int j = 0; j < c->n && !seen; j++) seen = pred_same_program(&c->programs[j], &programs[i]);
        if (seen) continue;
        st = polar_program_to_segments(&programs[i], D, kmax, c->seg_start + (size_t)c->n * D,
                                       c->ops + (size_t)c->n * D, err);
        if (st == POLAR_OK && (st = copy_program(&programs[i], &c->programs[c->n], err)) == POLAR_OK) c->n++;
    }
    if (st != POLAR_OK) {
        polar_catalogue_free(c);
        return st;
    }
    *out = c;
    return POLAR_OK;
}

/* Programs are written "A;B;..." in their text form: the metadata's form. */
char *pred_catalogue_format(const polar_catalogue *c) {
    size_t len = 0;
    for (int i = 0; i < c->n; i++) {
        int need = polar_program_format(&c->programs[i], NULL, 0);
        if (need < 0) return NULL;
        len += (size_t)need + 1;
    }
    char *text = malloc(len + 1), *at = text;
    if (!text) return NULL;
    *at = 0;
    for (int i = 0; i < c->n; i++) {
        if (i) *at++ = ';';
        at += polar_program_format(&c->programs[i], at, len + 1 - (size_t)(at - text));
    }
    return text;
}

polar_status pred_catalogue_parse(const char *text, int D, int kmax, polar_catalogue **out, polar_error *err) {
    *out = NULL;
    int n = 1;
    for (const char *s = text; *s; s++) n += *s == ';';
    polar_program *progs = calloc((size_t)n, sizeof *progs);
    char *copy = malloc(strlen(text) + 1);
    polar_status st = progs && copy ? POLAR_OK : polar_fail(err, POLAR_ERR_NOMEM, "out of memory reading a catalogue");
    int got = 0;
    if (st == POLAR_OK) {
        strcpy(copy, text);
        for (char *part = copy, *next; part && st == POLAR_OK; part = next) {
            next = strchr(part, ';');
            if (next) *next++ = 0;
            polar_error why;
            if (polar_program_parse(part, D, 0, &progs[got], &why) != POLAR_OK)
                st = polar_fail(err, POLAR_ERR_FORMAT, "catalogue program %d (\"%.40s\"): %s", got + 1, part, why.msg);
            else got++;
        }
    }
    if (st == POLAR_OK) st = polar_catalogue_create(progs, got, D, kmax, out, err);
    for (int i = 0; progs && i < got; i++) polar_program_free(&progs[i]);
    free(progs);
    free(copy);
    return st;
}

polar_status polar_catalogue_rank(const polar_catalogue *c, const float *seg, const float *op,
                                  const polar_decode_opts *opts, polar_candidate *out, int max_out, int *n_out,
                                  polar_error *err) {
    *n_out = 0;
    polar_decode_opts o = opts ? *opts : polar_decode_defaults();
    if (!c || !seg || !op || !out || max_out < 1) return polar_fail(err, POLAR_ERR_ARG, "catalogue rank: bad arguments");
    double *score = malloc((size_t)(c->n ? c->n : 1) * sizeof *score);
    unsigned char *taken = calloc((size_t)(c->n ? c->n : 1), 1);
    polar_status st = score && taken ? POLAR_OK : polar_fail(err, POLAR_ERR_NOMEM, "catalogue rank: out of memory");
    for (int i = 0; st == POLAR_OK && i < c->n; i++) {
        int len = c->programs[i].n;
        taken[i] = (o.min_layers && len < o.min_layers) || (o.max_layers && len > o.max_layers);
        score[i] = -tr_example_loss(seg, op, c->seg_start + (size_t)i * c->D, c->ops + (size_t)i * c->D, c->D, NULL,
                                    NULL, 0.0f);
    }
    /* selection of the best max_out; a tie keeps the catalogue's order */
    while (st == POLAR_OK && *n_out < max_out) {
        int best = -1;
        for (int i = 0; i < c->n; i++)
            if (!taken[i] && (best < 0 || score[i] > score[best])) best = i;
        if (best < 0) break;
        taken[best] = 1;
        if ((st = copy_program(&c->programs[best], &out[*n_out].program, err)) == POLAR_OK)
            out[(*n_out)++].score = score[best];
    }
    if (st != POLAR_OK) {
        while (*n_out) polar_program_free(&out[--*n_out].program);
    }
    free(score);
    free(taken);
    return st;
}

polar_status pred_decode(const polar_predictor *p, const float *seg, const float *op, const polar_decode_opts *opts,
                         polar_candidate *out, int max_out, int *n_out, polar_error *err) {
    if (!opts || !opts->catalogue) return polar_decode_programs(seg, op, p->D, opts, out, max_out, n_out, err);
    *n_out = 0;
    if (!p->catalogue)
        return polar_fail(err, POLAR_ERR_CONFIG,
                          "the predictor file holds no catalogue of programs (polar train writes one; the "
                          "reference's files and older ones have none): decode with the beam");
    return polar_catalogue_rank(p->catalogue, seg, op, opts, out, max_out, n_out, err);
}

const polar_catalogue *polar_predictor_catalogue(const polar_predictor *p) { return p ? p->catalogue : NULL; }

polar_status polar_predictor_set_catalogue(polar_predictor *p, polar_catalogue *c, polar_error *err) {
    if (!p || (c && c->D != p->D))
        return polar_fail(err, POLAR_ERR_ARG, "a catalogue for %d layers given to a predictor of %d", c ? c->D : 0,
                          p ? p->D : 0);
    polar_catalogue_free(p->catalogue);
    p->catalogue = c;
    return POLAR_OK;
}
