/* Paired counts of one yes/no outcome over questions two runs share, and
 * the exact two-sided McNemar test on them: the questions where the two
 * disagree are a fair coin's flips if neither is better. Shared by polar
 * eval --compare and polar search --compare. */
#include <math.h>
#include <stdio.h>

#include "eval.h"

void eval_paired_add(eval_paired *c, int a, int b) {
    if (a && b) c->both++;
    else if (a) c->a_only++;
    else if (b) c->b_only++;
    else c->neither++;
}

/* log C(n, i) */
static double log_choose(int n, int i) { return lgamma(n + 1.0) - lgamma(i + 1.0) - lgamma(n - i + 1.0); }

double eval_mcnemar_p(int a_only, int b_only) {
    int n = a_only + b_only, k = a_only < b_only ? a_only : b_only;
    if (!n) return 1;
    double tail = 0;
    for (int i = 0; i <= k; i++) tail += exp(log_choose(n, i) - n * log(2.0));
    return 2 * tail < 1 ? 2 * tail : 1;
}

static double rate(int count, int n) { return n ? (double)count / n : 0; }

int eval_paired_json(sbuf *b, const eval_paired *c, int n) {
    return sbuf_add(b, "\"a\":%.6f,\"b\":%.6f,\"a_only\":%d,\"b_only\":%d,\"both\":%d,\"neither\":%d,\"p\":%.6g",
                    rate(c->a_only + c->both, n), rate(c->b_only + c->both, n), c->a_only, c->b_only, c->both,
                    c->neither, eval_mcnemar_p(c->a_only, c->b_only));
}

int eval_paired_header(sbuf *b, const char *metric) {
    return sbuf_add(b, "%-20s %7s %7s %7s %7s %7s %8s %10s\n", metric, "A", "B", "A only", "B only", "both", "neither",
                    "McNemar p");
}

int eval_paired_row(sbuf *b, const char *label, const eval_paired *c, int n) {
    char p[16];
    double pv = eval_mcnemar_p(c->a_only, c->b_only);
    if (pv < 0.001) snprintf(p, sizeof p, "<0.001");
    else snprintf(p, sizeof p, "%.3f", pv);
    return sbuf_add(b, "%-20s %7.3f %7.3f %7d %7d %7d %8d %10s\n", label, rate(c->a_only + c->both, n),
                    rate(c->b_only + c->both, n), c->a_only, c->b_only, c->both, c->neither, p);
}
