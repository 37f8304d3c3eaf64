/* How well a predictor ranks its labelled questions' programs, beside what
 * a predictor that ignores the question gets: the validation loss says
 * whether the predictor matches the labels' mix, not whether it tells one
 * question from another. */
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "predictor.h"

/* Question q's valid programs (its examples back in program form). */
static polar_status valid_programs(const polar_train_labels *l, int q, polar_program *out, polar_error *err) {
    const polar_label_question *lq = &l->q[q];
    int D = l->n_layers;
    for (int k = 0; k < lq->n; k++) {
        polar_status st = polar_segments_to_program(lq->seg_start + (size_t)k * D, lq->ops + (size_t)k * D, D,
                                                    &out[k], err);
        if (st != POLAR_OK) {
            while (k--) polar_program_free(&out[k]);
            return st;
        }
    }
    return POLAR_OK;
}

static int holds(const polar_program *set, int n, const polar_program *p) {
    for (int i = 0; i < n; i++)
        if (pred_same_program(&set[i], p)) return 1;
    return 0;
}

/* Every valid program of questions [q0, q1), in one array. */
static polar_status all_valid_programs(const polar_train_labels *l, int q0, int q1, polar_program **out, int *n,
                                       polar_error *err) {
    int total = 0;
    for (int i = q0; i < q1; i++) total += l->q[i].n;
    *n = 0;
    *out = malloc((size_t)(total ? total : 1) * sizeof **out);
    if (!*out) return polar_fail(err, POLAR_ERR_NOMEM, "%d programs", total);
    polar_status st = POLAR_OK;
    for (int i = q0; st == POLAR_OK && i < q1; i++)
        if ((st = valid_programs(l, i, *out + *n, err)) == POLAR_OK) *n += l->q[i].n;
    return st;
}

polar_status polar_train_catalogue(const polar_train_labels *l, int q0, int q1, polar_catalogue **out,
                                   polar_error *err) {
    *out = NULL;
    if (!l || q0 < 0 || q1 > l->n || q0 > q1)
        return polar_fail(err, POLAR_ERR_ARG, "questions [%d, %d) of %d", q0, q1, l ? l->n : 0);
    polar_program *all;
    int n;
    polar_status st = all_valid_programs(l, q0, q1, &all, &n, err);
    if (st == POLAR_OK) st = polar_catalogue_create(all, n, l->n_layers, polar_decode_defaults().kmax, out, err);
    for (int i = 0; all && i < n; i++) polar_program_free(&all[i]);
    free(all);
    return st;
}

/* Programs in a total order (length, then layers), file order among equals. */
typedef struct {
    polar_program program;
    int order;
} ordered_program;

static int by_program_then_order(const void *pa, const void *pb) {
    const ordered_program *a = pa, *b = pb;
    if (a->program.n != b->program.n) return a->program.n < b->program.n ? -1 : 1;
    for (int i = 0; i < a->program.n; i++)
        if (a->program.layers[i] != b->program.layers[i]) return a->program.layers[i] < b->program.layers[i] ? -1 : 1;
    return (a->order > b->order) - (a->order < b->order);
}

polar_status polar_train_commonest_program(const polar_train_labels *l, int q0, int q1, polar_program *out,
                                           int *questions, polar_error *err) {
    memset(out, 0, sizeof *out);
    *questions = 0;
    if (!l || q0 < 0 || q1 > l->n || q0 >= q1)
        return polar_fail(err, POLAR_ERR_ARG, "questions [%d, %d) of %d", q0, q1, l ? l->n : 0);
    polar_program *all;
    int n;
    polar_status st = all_valid_programs(l, q0, q1, &all, &n, err);
    ordered_program *sorted = st == POLAR_OK ? malloc((size_t)(n ? n : 1) * sizeof *sorted) : NULL;
    if (st == POLAR_OK && !sorted) st = polar_fail(err, POLAR_ERR_NOMEM, "%d programs", n);
    int best = -1; /* the file-order index of the commonest program's first copy */
    if (st == POLAR_OK) {
        for (int i = 0; i < n; i++) sorted[i] = (ordered_program){all[i], i};
        qsort(sorted, (size_t)n, sizeof *sorted, by_program_then_order);
        /* a question holds each of its programs once, so a run of equal programs counts its questions */
        for (int i = 0, run; i < n; i += run) {
            for (run = 1; i + run < n && pred_same_program(&sorted[i].program, &sorted[i + run].program); run++) {}
            if (run > *questions || (run == *questions && sorted[i].order < best))
                best = sorted[i].order, *questions = run;
        }
    }
    if (best >= 0) {
        *out = all[best];
        all[best] = (polar_program){0};
    }
    for (int i = 0; all && i < n; i++) polar_program_free(&all[i]);
    free(all);
    free(sorted);
    return st;
}

/* One question's part of the fit under one decoder: the rank of its first
 * valid program in the top k (-1: none), whether `constant` is valid for it,
 * its top program (n 0 when the decoder gave none). */
typedef struct {
    int first, constant;
    polar_program top;
} question_fit;

/* Question i under each of n_dec decoders (out[n_dec]): the logits once,
 * then each decoder. Buffers of its own: questions run in parallel. */
static polar_status fit_question(const polar_predictor *p, const polar_train_labels *l, const polar_train_features *f,
                                 int i, int k, const polar_decode_opts *opts, int n_dec, const polar_program *constant,
                                 question_fit *out, polar_error *err) {
    int D = p->D, nv = l->q[i].n;
    for (int d = 0; d < n_dec; d++) out[d] = (question_fit){.first = -1};
    float *seg = malloc((size_t)D * 4 * sizeof *seg); /* seg [D], op [D, 3] */
    polar_program *valid = malloc((size_t)(nv ? nv : 1) * sizeof *valid);
    polar_candidate *cand = malloc((size_t)k * sizeof *cand);
    polar_status st = seg && valid && cand ? POLAR_OK : polar_fail(err, POLAR_ERR_NOMEM, "question %d's fit", i);
    if (st == POLAR_OK) st = polar_predict_logits(p, f->h[i], f->T[i], seg, seg + D, err);
    int have_valid = st == POLAR_OK && (st = valid_programs(l, i, valid, err)) == POLAR_OK;
    for (int d = 0; st == POLAR_OK && d < n_dec; d++) {
        polar_decode_opts o = opts ? opts[d] : polar_decode_defaults();
        int n = 0;
        if ((st = pred_decode(p, seg, seg + D, &o, cand, k, &n, err)) != POLAR_OK) break;
        for (int c = 0; c < n && out[d].first < 0; c++)
            if (holds(valid, nv, &cand[c].program)) out[d].first = c;
        out[d].constant = constant && holds(valid, nv, constant);
        if (n > 0) out[d].top = cand[0].program, cand[0].program = (polar_program){0};
        for (int c = 0; c < n; c++) polar_program_free(&cand[c].program);
    }
    for (int m = 0; have_valid && m < nv; m++) polar_program_free(&valid[m]);
    free(seg);
    free(valid);
    free(cand);
    return st;
}

polar_status polar_train_fit_measure(const polar_predictor *p, const polar_train_labels *l,
                                     const polar_train_features *f, int q0, int q1, int k,
                                     const polar_decode_opts *opts, int n_decoders, const polar_program *constant,
                                     polar_train_fit *out, polar_error *err) {
    if (!p || !l || !f || !out || n_decoders < 1 || (!opts && n_decoders > 1))
        return polar_fail(err, POLAR_ERR_ARG, "the fit needs a predictor, labels, features and its decoders");
    memset(out, 0, (size_t)n_decoders * sizeof *out);
    if (q0 < 0 || q1 > l->n || q0 > q1 || k < 1 || f->n != l->n || p->D != l->n_layers || f->dq != p->dq)
        return polar_fail(err, POLAR_ERR_ARG,
                          "fit of questions [%d, %d) of %d, k %d: predictor D %d d_q %d, labels D %d, features d_q %d",
                          q0, q1, l->n, k, p->D, p->dq, l->n_layers, f->dq);
    int nq = q1 - q0, nd = n_decoders;
    question_fit *qf = calloc((size_t)(nq ? nq : 1) * nd, sizeof *qf); /* [nq, nd] */
    if (!qf) return polar_fail(err, POLAR_ERR_NOMEM, "the fit of %d questions", nq);
    polar_status st = POLAR_OK;
    int failed = nq; /* the first question that failed: its error is the one reported, whatever the threads */
    /* a predictor on the GPU serves one thread at a time */
#pragma omp parallel for schedule(dynamic) if (!p->cuda)
    for (int i = 0; i < nq; i++) {
        polar_error mine;
        if (fit_question(p, l, f, q0 + i, k, opts, nd, constant, &qf[(size_t)i * nd], &mine) != POLAR_OK) {
#pragma omp critical(polar_train_fit_error)
            if (i < failed) failed = i, st = mine.code, *err = mine;
        }
    }
    for (int d = 0; d < nd; d++)
        for (int i = 0; st == POLAR_OK && i < nq; i++) {
            const question_fit *q = &qf[(size_t)i * nd + d];
            out[d].questions++;
            out[d].top1 += q->first == 0;
            out[d].topk += q->first >= 0;
            out[d].constant += q->constant;
            int new_top = q->top.n > 0;
            for (int j = 0; new_top && j < i; j++) new_top = !pred_same_program(&qf[(size_t)j * nd + d].top, &q->top);
            out[d].distinct_top += new_top;
        }
    for (size_t i = 0; i < (size_t)nq * nd; i++) polar_program_free(&qf[i].top);
    free(qf);
    if (st != POLAR_OK) memset(out, 0, (size_t)nd * sizeof *out);
    return st;
}
