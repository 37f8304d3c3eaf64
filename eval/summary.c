/* The numbers of an evaluation, computed from its results file alone (so a
 * resumed run summarises exactly like an uninterrupted one): accuracy per
 * rank, pass@k (any of the first k programs correct: the paper's oracle),
 * consensus@k (the majority answer of the first k programs, ties to the
 * better-ranked one: no gold needed), the same over base samples, and the
 * executed depths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "eval.h"

int eval_consensus(const eval_run_view *runs, int k) {
    int best = -1, best_votes = 0;
    for (int i = 0; i < k; i++) {
        if (!runs[i].answer) continue;
        int first = 1, votes = 0;
        for (int j = 0; j < k; j++) {
            if (!runs[j].answer || !polar_answer_equal(runs[i].answer, runs[j].answer)) continue;
            if (j < i) first = 0;
            votes++;
        }
        if (first && votes > best_votes) best = i, best_votes = votes;
    }
    return best;
}

/* Whether questions a and b ran the same programs: the first `depth` of
 * them in rank order (fewer where a question ran fewer), or (depth -1) the
 * whole list. */
static int same_programs(const eval_question *a, const eval_question *b, int depth) {
    int na = depth < 0 || depth > a->n_runs ? a->n_runs : depth, nb = depth < 0 || depth > b->n_runs ? b->n_runs : depth;
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (strcmp(a->runs[i].program, b->runs[i].program)) return 0;
    return 1;
}

/* How many questions have a top program (depth 1) or a ranked list (-1)
 * that no earlier question had: quadratic, but over a few thousand lines. */
static int count_distinct(const eval_records *rs, int depth) {
    int n = 0;
    for (int q = 0; q < rs->n; q++) {
        int seen = 0;
        for (int p = 0; !seen && p < q; p++) seen = same_programs(&rs->q[p], &rs->q[q], depth);
        n += !seen;
    }
    return n;
}

void eval_compute(const eval_records *rs, eval_metrics *m) {
    memset(m, 0, sizeof *m);
    m->questions = rs->n;
    long layers_top1 = 0, layers_all = 0, n_all = 0;
    for (int q = 0; q < rs->n; q++) {
        const eval_question *e = &rs->q[q];
        int k_max = e->n_runs < EVAL_MAX_K ? e->n_runs : EVAL_MAX_K;
        int s_max = e->n_samples < EVAL_MAX_K ? e->n_samples : EVAL_MAX_K;
        m->k_max = k_max > m->k_max ? k_max : m->k_max;
        m->samples_max = s_max > m->samples_max ? s_max : m->samples_max;
        int any = 0, any_fb = 0;
        for (int k = 1; k <= EVAL_MAX_K; k++) {
            /* a question with fewer runs counts its last state for larger k */
            if (k <= k_max) {
                any |= e->runs[k - 1].correct;
                any_fb |= e->runs[k - 1].correct || e->runs[k - 1].fallback_correct;
                m->rank_accuracy[k] += e->runs[k - 1].correct;
            }
            m->pass_at[k] += any, m->fallback_pass_at[k] += any_fb;
            int c = eval_consensus(e->runs, k < k_max ? k : k_max);
            m->consensus_at[k] += c >= 0 && e->runs[c].correct;
        }
        int any_s = 0;
        for (int k = 1; k <= EVAL_MAX_K; k++) {
            if (k <= s_max) any_s |= e->samples[k - 1].correct;
            m->sample_pass_at[k] += any_s;
            int c = eval_consensus(e->samples, k < s_max ? k : s_max);
            m->sample_consensus_at[k] += c >= 0 && e->samples[c].correct;
        }
        if (e->n_runs) layers_top1 += e->runs[0].executed_layers;
        for (int i = 0; i < e->n_runs; i++) {
            int d = e->runs[i].executed_layers;
            d = d < 0 ? 0 : d > 4 * 256 ? 4 * 256 : d;
            layers_all += d, n_all++;
            if (!m->depth_count[d]++) m->unique_depths++;
            m->max_depth = d > m->max_depth ? d : m->max_depth;
        }
    }
    if (rs->n) {
        for (int k = 1; k <= EVAL_MAX_K; k++) {
            m->pass_at[k] /= rs->n, m->consensus_at[k] /= rs->n, m->fallback_pass_at[k] /= rs->n;
            m->sample_pass_at[k] /= rs->n, m->sample_consensus_at[k] /= rs->n, m->rank_accuracy[k] /= rs->n;
        }
        m->mean_layers_top1 = (double)layers_top1 / rs->n;
    }
    m->mean_layers_all = n_all ? (double)layers_all / n_all : 0;
    m->distinct_top = count_distinct(rs, 1), m->distinct_lists = count_distinct(rs, -1);
}

static int add_curve(sbuf *b, const char *key, const double *v, int k_max) {
    int ok = sbuf_add(b, ",\"%s\":[", key);
    for (int k = 1; ok && k <= k_max; k++) ok = sbuf_add(b, "%s%.6f", k > 1 ? "," : "", v[k]);
    return ok && sbuf_add(b, "]");
}

/* The summary as JSON, and the table a terminal shows. */
static int summary_json(const eval_records *rs, const eval_metrics *m, sbuf *b) {
    int ok = sbuf_add(b, "{\"questions\":%d,\"programs_per_question\":%d,\"samples_per_question\":%d", m->questions,
                      m->k_max, m->samples_max) &&
             add_curve(b, "accuracy_by_rank", m->rank_accuracy, m->k_max) &&
             add_curve(b, "pass_at_k", m->pass_at, m->k_max) &&
             add_curve(b, "consensus_at_k", m->consensus_at, m->k_max) &&
             add_curve(b, "pass_at_k_with_last_number_fallback", m->fallback_pass_at, m->k_max) &&
             add_curve(b, "base_sampling_pass_at_k", m->sample_pass_at, m->samples_max) &&
             add_curve(b, "base_sampling_consensus_at_k", m->sample_consensus_at, m->samples_max) &&
             sbuf_add(b, ",\"mean_executed_layers_top1\":%.3f,\"mean_executed_layers\":%.3f,\"unique_depths\":%d",
                      m->mean_layers_top1, m->mean_layers_all, m->unique_depths) &&
             sbuf_add(b, ",\"distinct_top_programs\":%d,\"distinct_program_lists\":%d", m->distinct_top,
                      m->distinct_lists) &&
             sbuf_add(b, ",\"depth_histogram\":{");
    int first = 1;
    for (int d = 0; ok && d <= m->max_depth; d++)
        if (m->depth_count[d]) ok = sbuf_add(b, "%s\"%d\":%d", first ? "" : ",", d, m->depth_count[d]), first = 0;
    ok = ok && sbuf_add(b, "}");
    /* Accuracy per program text when every question ran the same list. */
    if (m->distinct_lists == 1 && ok) {
        ok = sbuf_add(b, ",\"accuracy_by_program\":{");
        for (int i = 0; ok && i < rs->q[0].n_runs; i++)
            ok = sbuf_add(b, "%s", i ? "," : "") && sbuf_json_string(b, rs->q[0].runs[i].program) &&
                 sbuf_add(b, ":%.6f", m->rank_accuracy[i + 1]);
        ok = ok && sbuf_add(b, "}");
    }
    return ok && sbuf_add(b, "}");
}

static int summary_table(const eval_metrics *m, sbuf *b) {
    int ok = sbuf_add(b, "%d questions, %d program(s) each, %d base sample(s)\n", m->questions, m->k_max,
                      m->samples_max) &&
             sbuf_add(b, "%4s %10s %10s %12s %14s %16s\n", "k", "accuracy", "pass@k", "consensus@k",
                      "sampling pass", "sampling consens");
    int rows = m->k_max > m->samples_max ? m->k_max : m->samples_max;
    for (int k = 1; ok && k <= rows; k++) {
        char a[16] = "", p[16] = "", c[16] = "", sp[16] = "", sc[16] = "";
        if (k <= m->k_max) {
            snprintf(a, sizeof a, "%.3f", m->rank_accuracy[k]);
            snprintf(p, sizeof p, "%.3f", m->pass_at[k]);
            snprintf(c, sizeof c, "%.3f", m->consensus_at[k]);
        }
        if (k <= m->samples_max) {
            snprintf(sp, sizeof sp, "%.3f", m->sample_pass_at[k]);
            snprintf(sc, sizeof sc, "%.3f", m->sample_consensus_at[k]);
        }
        ok = sbuf_add(b, "%4d %10s %10s %12s %14s %16s\n", k, a, p, c, sp, sc);
    }
    return ok &&
           sbuf_add(b, "mean executed layers: %.2f (top program), %.2f (all); %d distinct depths\n",
                    m->mean_layers_top1, m->mean_layers_all, m->unique_depths) &&
           sbuf_add(b, "programs: %d distinct top program(s), %d distinct ranked list(s) over %d questions\n",
                    m->distinct_top, m->distinct_lists, m->questions);
}

polar_status polar_eval_summary(const char *results_path, char **json, char **table, polar_error *err) {
    eval_records rs;
    polar_status st = eval_read_records(results_path, &rs, err);
    if (st != POLAR_OK) return st;
    eval_metrics *m = malloc(sizeof *m);
    sbuf j = {0}, t = {0};
    int ok = m != NULL;
    if (ok) {
        eval_compute(&rs, m);
        ok = (!json || summary_json(&rs, m, &j)) && (!table || summary_table(m, &t));
    }
    eval_records_free(&rs);
    free(m);
    st = ok ? POLAR_OK : polar_fail(err, POLAR_ERR_NOMEM, "eval: no memory for the summary of %s", results_path);
    return sbuf_hand_out(st, &j, &t, json, table);
}
