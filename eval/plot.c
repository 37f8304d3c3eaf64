/* An evaluation's plot as a self-contained SVG (no plotting dependency):
 * left, pass@k and consensus@k of the programs against base sampling; right,
 * how many runs executed each number of layers. */
#include <stdio.h>
#include <stdlib.h>

#include "../runtime/error.h"
#include "eval.h"

enum { W = 900, H = 380, PANEL_W = 380, PANEL_H = 280, LEFT_X = 60, RIGHT_X = 510, TOP_Y = 50 };

int svg_axes(sbuf *b, int x0, const char *title, const char *xlabel, const char *ylabel) {
    return sbuf_add(b,
                    "<text x=\"%d\" y=\"%d\" font-size=\"15\" text-anchor=\"middle\">%s</text>\n"
                    "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
                    "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
                    "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n"
                    "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\" "
                    "transform=\"rotate(-90 %d %d)\">%s</text>\n",
                    x0 + PANEL_W / 2, TOP_Y - 20, title, x0, TOP_Y + PANEL_H, x0 + PANEL_W, TOP_Y + PANEL_H, x0,
                    TOP_Y, x0, TOP_Y + PANEL_H, x0 + PANEL_W / 2, TOP_Y + PANEL_H + 35, xlabel, x0 - 40,
                    TOP_Y + PANEL_H / 2, x0 - 40, TOP_Y + PANEL_H / 2, ylabel);
}

/* One curve v[1..n] on [0,1] over k = 1..k_max, with a legend line. */
static int curve(sbuf *b, const double *v, int n, int k_max, const char *color, const char *dash, const char *name,
                 int legend_row) {
    if (n < 1) return 1;
    int ok = sbuf_add(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"%s\" points=\"",
                      color, dash);
    for (int k = 1; ok && k <= n; k++) {
        double x = LEFT_X + (k_max > 1 ? (double)(k - 1) / (k_max - 1) : 0.5) * PANEL_W;
        double y = TOP_Y + (1 - v[k]) * PANEL_H;
        ok = sbuf_add(b, "%.1f,%.1f ", x, y);
    }
    int ly = TOP_Y + 10 + 16 * legend_row;
    return ok && sbuf_add(b,
                          "\"/>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\" "
                          "stroke-dasharray=\"%s\"/><text x=\"%d\" y=\"%d\" font-size=\"11\">%s</text>\n",
                          LEFT_X + 10, ly, LEFT_X + 34, ly, color, dash, LEFT_X + 40, ly + 4, name);
}

int svg_histogram(sbuf *b, int x0, const int *count, int max_value) {
    int lo = -1, hi = 0, peak = 0, ok = 1;
    for (int d = 0; d <= max_value; d++)
        if (count[d]) {
            lo = lo < 0 ? d : lo, hi = d;
            peak = count[d] > peak ? count[d] : peak;
        }
    if (lo < 0) return 1;
    int bins = hi - lo + 1;
    double bw = (double)PANEL_W / bins;
    for (int d = lo; ok && d <= hi; d++) {
        double h = (double)count[d] / peak * PANEL_H;
        ok = sbuf_add(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#1f77b4\"/>\n",
                      x0 + (d - lo) * bw + 1, TOP_Y + PANEL_H - h, bw > 2 ? bw - 2 : bw, h);
        if (ok && (bins <= 20 || (d - lo) % (bins / 10 + 1) == 0))
            ok = sbuf_add(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n",
                          x0 + (d - lo + 0.5) * bw, TOP_Y + PANEL_H + 14, d);
    }
    return ok && sbuf_add(b, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%d</text>\n", x0 - 4,
                          TOP_Y + 4, peak);
}

static int plot(const eval_metrics *m, sbuf *b) {
    int k_max = m->k_max > m->samples_max ? m->k_max : m->samples_max;
    int ok = svg_begin(b) &&
             svg_axes(b, LEFT_X, "Correct within k", "k", "share of questions") &&
             svg_axes(b, RIGHT_X, "Executed layers", "layers run", "runs");
    for (int t = 0; ok && t <= 4; t++)
        ok = sbuf_add(b, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%.2f</text>\n", LEFT_X - 4,
                      TOP_Y + PANEL_H - t * PANEL_H / 4 + 4, t / 4.0);
    for (int k = 1; ok && k <= k_max; k++)
        ok = sbuf_add(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n",
                      LEFT_X + (k_max > 1 ? (double)(k - 1) / (k_max - 1) : 0.5) * PANEL_W, TOP_Y + PANEL_H + 14, k);
    ok = ok && curve(b, m->pass_at, m->k_max, k_max, "#1f77b4", "none", "programs: pass@k (oracle)", 0) &&
         curve(b, m->consensus_at, m->k_max, k_max, "#2ca02c", "none", "programs: consensus@k (no gold)", 1) &&
         curve(b, m->sample_pass_at, m->samples_max, k_max, "#d62728", "6 4", "base sampling: pass@k", 2) &&
         curve(b, m->sample_consensus_at, m->samples_max, k_max, "#ff7f0e", "6 4", "base sampling: consensus@k", 3);
    ok = ok && svg_histogram(b, RIGHT_X, m->depth_count, m->max_depth);
    return ok && sbuf_add(b, "</svg>\n");
}

polar_status polar_eval_plot(const char *results_path, const char *svg_path, polar_error *err) {
    eval_records rs;
    polar_status st = eval_read_records(results_path, &rs, err);
    if (st != POLAR_OK) return st;
    eval_metrics *m = malloc(sizeof *m);
    sbuf b = {0};
    int ok = m != NULL;
    if (ok) eval_compute(&rs, m), ok = plot(m, &b);
    eval_records_free(&rs);
    free(m);
    if (!ok) {
        free(b.s);
        return polar_fail(err, POLAR_ERR_NOMEM, "eval: no memory for the plot of %s", results_path);
    }
    st = svg_write(&b, svg_path, err);
    free(b.s);
    return st;
}

int svg_begin(sbuf *b) {
    return sbuf_add(b,
                    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                    "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                    W, H);
}

polar_status svg_write(const sbuf *b, const char *svg_path, polar_error *err) {
    polar_status st = POLAR_OK;
    FILE *f = fopen(svg_path, "wb");
    if (!f) st = polar_fail(err, POLAR_ERR_IO, "%s: cannot write the plot", svg_path);
    else {
        if (fwrite(b->s, 1, b->len, f) != b->len) st = polar_fail(err, POLAR_ERR_IO, "%s: write failed", svg_path);
        if (fclose(f) && st == POLAR_OK) st = polar_fail(err, POLAR_ERR_IO, "%s: write failed", svg_path);
    }
    return st;
}
