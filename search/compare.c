/* Two polar search labels files compared question by question: of the
 * questions both searched, those with a valid program in only A, only B,
 * both and neither, and likewise the base-wrong questions a program fixes,
 * with the exact McNemar p. The action spaces of Finding 1 and the depth
 * budgets of Finding 2 searched the same questions, so a rate that differs
 * by a few questions can be told from chance. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "labels.h"
#include "../runtime/error.h"
#include "../eval/eval.h"

enum { MAX_LEN = 1024 };

/* What a comparison needs of one line. */
typedef struct {
    long index;
    int base_correct, has_valid;
} searched_question;

typedef struct {
    const char *path;
    searched_question *q;
    int n, cap;
    char actions[8]; /* of the first line ("both" when it names none) */
} labels_side;

static polar_status add_question(const pred_label_line *line, void *ctx, polar_error *err) {
    labels_side *s = ctx;
    const json_value *idx = json_get(line->root, "index"), *init = json_get(line->root, "initial_score");
    if (!idx || idx->type != JSON_NUMBER || !init || init->type != JSON_NUMBER)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: no index or initial_score: not a polar search line", line->where);
    for (int i = 0; i < s->n; i++)
        if (s->q[i].index == (long)idx->number)
            return polar_fail(err, POLAR_ERR_FORMAT, "%s: question %ld appears twice", line->where, s->q[i].index);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        searched_question *q = realloc(s->q, (size_t)cap * sizeof *q);
        if (!q) return polar_fail(err, POLAR_ERR_NOMEM, "%s: no memory for the questions", s->path);
        s->q = q, s->cap = cap;
    }
    if (!s->n) {
        const json_value *act = json_get(line->root, "actions");
        snprintf(s->actions, sizeof s->actions, "%s", act && act->type == JSON_STRING ? act->str : "both");
    }
    int layers[MAX_LEN], valid = 0;
    for (size_t i = 0; !valid && i < line->valid->len; i++) valid = pred_label_path(line->valid->items[i], MAX_LEN, MAX_LEN, layers) > 0;
    s->q[s->n++] = (searched_question){(long)idx->number, init->number == 1.0, valid};
    return POLAR_OK;
}

static polar_status read_side(labels_side *s, polar_error *err) {
    polar_status st = pred_labels_each(s->path, add_question, s, err);
    if (st == POLAR_OK && !s->n) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: no search lines", s->path);
    return st;
}

typedef struct {
    int paired, a_unpaired, b_unpaired, base_differs, base_wrong;
    eval_paired valid, fixed;
} labels_comparison;

/* fixed: over the questions both files judge base-wrong. */
static void compare(const labels_side *A, const labels_side *B, labels_comparison *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < A->n; i++) {
        const searched_question *a = &A->q[i], *b = NULL;
        for (int j = 0; !b && j < B->n; j++)
            if (B->q[j].index == a->index) b = &B->q[j];
        if (!b) {
            c->a_unpaired++;
            continue;
        }
        c->paired++;
        c->base_differs += a->base_correct != b->base_correct;
        eval_paired_add(&c->valid, a->has_valid, b->has_valid);
        if (!a->base_correct && !b->base_correct)
            c->base_wrong++, eval_paired_add(&c->fixed, a->has_valid, b->has_valid);
    }
    c->b_unpaired = B->n - c->paired;
}

static int comparison_json(const labels_side *A, const labels_side *B, const labels_comparison *c, sbuf *b) {
    return sbuf_add(b, "{\"a\":{\"path\":") && sbuf_json_string(b, A->path) &&
           sbuf_add(b, ",\"actions\":") && sbuf_json_string(b, A->actions) &&
           sbuf_add(b, ",\"unpaired\":%d},\"b\":{\"path\":", c->a_unpaired) && sbuf_json_string(b, B->path) &&
           sbuf_add(b, ",\"actions\":") && sbuf_json_string(b, B->actions) &&
           sbuf_add(b, ",\"unpaired\":%d},\"questions\":%d,\"base_answer_differs\":%d,\"with_valid\":{", c->b_unpaired,
                    c->paired, c->base_differs) &&
           eval_paired_json(b, &c->valid, c->paired) &&
           sbuf_add(b, "},\"base_wrong\":%d,\"base_wrong_fixed\":{", c->base_wrong) &&
           eval_paired_json(b, &c->fixed, c->base_wrong) && sbuf_add(b, "}}");
}

static int comparison_table(const labels_side *A, const labels_side *B, const labels_comparison *c, sbuf *b) {
    int ok = sbuf_add(b, "A: %s (actions %s)\nB: %s (actions %s)\n", A->path, A->actions, B->path, B->actions) &&
             sbuf_add(b, "%d paired questions (%d only in A, %d only in B), %d base-wrong in both\n", c->paired,
                      c->a_unpaired, c->b_unpaired, c->base_wrong);
    if (ok && c->base_differs)
        ok = sbuf_add(b, "warning: the base answer is judged differently on %d question(s): not the same prompts or model\n",
                      c->base_differs);
    return ok && eval_paired_header(b, "questions") && eval_paired_row(b, "with a valid program", &c->valid, c->paired) &&
           eval_paired_row(b, "base-wrong fixed", &c->fixed, c->base_wrong);
}

polar_status polar_labels_compare(const char *path_a, const char *path_b, char **json, char **table, polar_error *err) {
    labels_side sides[2] = {{.path = path_a}, {.path = path_b}};
    polar_status st = read_side(&sides[0], err);
    if (st == POLAR_OK) st = read_side(&sides[1], err);
    labels_comparison c;
    sbuf j = {0}, t = {0};
    if (st == POLAR_OK) {
        compare(&sides[0], &sides[1], &c);
        if (!c.paired) st = polar_fail(err, POLAR_ERR_ARG, "search compare: %s and %s share no question index", path_a, path_b);
        else if ((json && !comparison_json(&sides[0], &sides[1], &c, &j)) ||
                 (table && !comparison_table(&sides[0], &sides[1], &c, &t)))
            st = polar_fail(err, POLAR_ERR_NOMEM, "search compare: no memory for the comparison");
    }
    free(sides[0].q), free(sides[1].q);
    return sbuf_hand_out(st, &j, &t, json, table);
}
