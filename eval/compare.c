/* Two results files compared question by question: for each k, how many of
 * the questions both files hold only A's first k answers get right, only
 * B's, both and neither (pass@k, and likewise consensus@k), with the exact
 * two-sided McNemar p on the discordant pair. Two pass@k figures a point
 * apart on 300 questions can be chance or not; the pairing says which. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "eval.h"

/* One side of the comparison: a file's records and which list of them. */
typedef struct {
    const char *path;
    eval_records rs;
    int samples; /* 1: the base samples; 0: the programs */
    int longest; /* the longest such list of any line */
} compare_side;

static const char *list_name(int samples) { return samples ? "samples" : "runs"; }

static void side_list(const compare_side *s, const eval_question *q, const eval_run_view **runs, int *n) {
    *runs = s->samples ? q->samples : q->runs;
    *n = s->samples ? q->n_samples : q->n_runs;
}

/* Whether any of the first k runs is right / the consensus of the first k is
 * right; a list shorter than k counts whole, as the summary does. */
static int pass_within(const eval_run_view *runs, int n, int k) {
    for (int i = 0; i < n && i < k; i++)
        if (runs[i].correct) return 1;
    return 0;
}

static int consensus_within(const eval_run_view *runs, int n, int k) {
    int c = eval_consensus(runs, k < n ? k : n);
    return c >= 0 && runs[c].correct;
}

/* The record of rs with this index, NULL when none. Files hold a few
 * thousand lines: a linear scan per question is cheap. */
static const eval_question *find_index(const eval_records *rs, long index) {
    for (int i = 0; i < rs->n; i++)
        if (rs->q[i].index == index) return &rs->q[i];
    return NULL;
}

static polar_status check_side(compare_side *s, polar_error *err) {
    int longest = 0;
    for (int i = 0; i < s->rs.n; i++) {
        const eval_run_view *runs;
        int n;
        side_list(s, &s->rs.q[i], &runs, &n);
        longest = n > longest ? n : longest;
        for (int j = 0; j < i; j++)
            if (s->rs.q[j].index == s->rs.q[i].index)
                return polar_fail(err, POLAR_ERR_FORMAT, "%s: question %ld appears twice", s->path, s->rs.q[i].index);
    }
    s->longest = longest;
    if (!s->rs.n) return polar_fail(err, POLAR_ERR_FORMAT, "%s: no complete results lines", s->path);
    if (!longest)
        return polar_fail(err, POLAR_ERR_ARG, "%s: no question has %s (the other list is %s)", s->path, list_name(s->samples),
                          list_name(!s->samples));
    return POLAR_OK;
}

typedef struct {
    int paired, a_unpaired, b_unpaired, k_max;
    eval_paired pass[EVAL_MAX_K + 1], consensus[EVAL_MAX_K + 1];
} comparison;

/* k_max 0: the longer of the two lists (k past a list's end counts it whole). */
static void compare(const compare_side *A, const compare_side *B, int k_max, comparison *c) {
    memset(c, 0, sizeof *c);
    int longest = A->longest > B->longest ? A->longest : B->longest;
    c->k_max = k_max ? k_max : longest < EVAL_MAX_K ? longest : EVAL_MAX_K;
    for (int i = 0; i < A->rs.n; i++) {
        const eval_question *qa = &A->rs.q[i], *qb = find_index(&B->rs, qa->index);
        if (!qb) {
            c->a_unpaired++;
            continue;
        }
        c->paired++;
        const eval_run_view *ra, *rb;
        int na, nb;
        side_list(A, qa, &ra, &na), side_list(B, qb, &rb, &nb);
        for (int k = 1; k <= c->k_max; k++) {
            eval_paired_add(&c->pass[k], pass_within(ra, na, k), pass_within(rb, nb, k));
            eval_paired_add(&c->consensus[k], consensus_within(ra, na, k), consensus_within(rb, nb, k));
        }
    }
    c->b_unpaired = B->rs.n - c->paired;
}

static int rows_json(sbuf *b, const char *key, const eval_paired *pc, int k_max, int n) {
    int ok = sbuf_add(b, ",\"%s\":[", key);
    for (int k = 1; ok && k <= k_max; k++)
        ok = sbuf_add(b, "%s{\"k\":%d,", k > 1 ? "," : "", k) && eval_paired_json(b, &pc[k], n) && sbuf_add(b, "}");
    return ok && sbuf_add(b, "]");
}

static int comparison_json(const compare_side *A, const compare_side *B, const comparison *c, sbuf *b) {
    return sbuf_add(b, "{\"a\":{\"path\":") && sbuf_json_string(b, A->path) &&
           sbuf_add(b, ",\"list\":\"%s\",\"unpaired\":%d},\"b\":{\"path\":", list_name(A->samples), c->a_unpaired) &&
           sbuf_json_string(b, B->path) &&
           sbuf_add(b, ",\"list\":\"%s\",\"unpaired\":%d},\"questions\":%d", list_name(B->samples), c->b_unpaired, c->paired) &&
           rows_json(b, "pass_at_k", c->pass, c->k_max, c->paired) &&
           rows_json(b, "consensus_at_k", c->consensus, c->k_max, c->paired) && sbuf_add(b, "}");
}

static int rows_table(sbuf *b, const char *metric, const eval_paired *pc, int k_max, int n) {
    int ok = eval_paired_header(b, metric);
    for (int k = 1; ok && k <= k_max; k++) {
        char label[16];
        snprintf(label, sizeof label, "%d", k);
        ok = eval_paired_row(b, label, &pc[k], n);
    }
    return ok;
}

static int comparison_table(const compare_side *A, const compare_side *B, const comparison *c, sbuf *b) {
    return sbuf_add(b, "A: the %s of %s\nB: the %s of %s\n", list_name(A->samples), A->path, list_name(B->samples), B->path) &&
           sbuf_add(b, "%d paired questions (%d only in A, %d only in B)\n", c->paired, c->a_unpaired, c->b_unpaired) &&
           rows_table(b, "pass@k", c->pass, c->k_max, c->paired) &&
           rows_table(b, "consensus@k", c->consensus, c->k_max, c->paired);
}

polar_status polar_eval_compare(const char *path_a, polar_eval_list list_a, const char *path_b, polar_eval_list list_b,
                                int k_max, char **json, char **table, polar_error *err) {
    if (k_max < 0 || k_max > EVAL_MAX_K) return polar_fail(err, POLAR_ERR_ARG, "eval compare: k must be 1 to %d", EVAL_MAX_K);
    compare_side sides[2] = {{path_a, {0}, list_a == POLAR_EVAL_SAMPLES, 0}, {path_b, {0}, list_b == POLAR_EVAL_SAMPLES, 0}};
    polar_status st = POLAR_OK;
    for (int s = 0; s < 2 && st == POLAR_OK; s++)
        if ((st = eval_read_records(sides[s].path, &sides[s].rs, err)) == POLAR_OK) st = check_side(&sides[s], err);
    comparison *c = st == POLAR_OK ? malloc(sizeof *c) : NULL;
    sbuf j = {0}, t = {0};
    if (st == POLAR_OK) {
        if (c) compare(&sides[0], &sides[1], k_max, c);
        if (c && !c->paired)
            st = polar_fail(err, POLAR_ERR_ARG, "eval compare: %s and %s share no question index", path_a, path_b);
        else if (!c || (json && !comparison_json(&sides[0], &sides[1], c, &j)) ||
                 (table && !comparison_table(&sides[0], &sides[1], c, &t)))
            st = polar_fail(err, POLAR_ERR_NOMEM, "eval compare: no memory for the comparison");
    }
    free(c);
    eval_records_free(&sides[0].rs), eval_records_free(&sides[1].rs);
    return sbuf_hand_out(st, &j, &t, json, table);
}
