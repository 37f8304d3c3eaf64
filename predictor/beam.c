/* Decoding predictor logits into ranked programs, as the reference decoder
 * does: segment starts where sigmoid(seg) >= threshold (layer 0 always),
 * extra starts so no segment exceeds kmax, then a beam over the ops of the
 * segments (the top_ops ops of each by log-probability at its start, score =
 * sum of log-probs, stable sorts so ties keep their order). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"

polar_decode_opts polar_decode_defaults(void) { return (polar_decode_opts){0.5, 4, 5, 2, 0, 0, 0}; }

typedef struct {
    unsigned char *ops; /* [n_segments] */
    double score;
} beam_entry;

/* Segments [start, end) of the decoded boundaries; returns their count. */
static int segments(const float *seg, int D, double threshold, int kmax, int *start, int *end) {
    int n = 0, last = 0;
    start[0] = 0;
    int n_starts = 1;
    int *starts = malloc((size_t)(2 * D + 1) * sizeof *starts);
    if (!starts) return -1;
    starts[0] = 0;
    for (int i = 1; i < D; i++) {
        if (!(1.0 / (1.0 + exp(-(double)seg[i])) >= threshold)) continue;
        while (i - starts[n_starts - 1] > kmax) starts[n_starts] = starts[n_starts - 1] + kmax, n_starts++;
        if (i != starts[n_starts - 1]) starts[n_starts++] = i;
    }
    for (int k = 0; k < n_starts; k++) {
        int ed = k + 1 < n_starts ? starts[k + 1] : D;
        for (int cur = starts[k]; cur < ed; cur = last) {
            last = cur + kmax < ed ? cur + kmax : ed;
            start[n] = cur;
            end[n++] = last;
        }
    }
    free(starts);
    return n;
}

/* log_softmax over 3 op logits, in f32 as torch computes it. */
static void log_softmax3(const float *x, float *out) {
    float mx = fmaxf(x[0], fmaxf(x[1], x[2]));
    float sum = expf(x[0] - mx) + expf(x[1] - mx) + expf(x[2] - mx);
    float lse = mx + logf(sum);
    for (int i = 0; i < 3; i++) out[i] = x[i] - lse;
}

/* Stable: move each entry up past those with a strictly lower score. */
static void sort_desc(beam_entry *b, int n) {
    for (int i = 1; i < n; i++) {
        beam_entry e = b[i];
        int j = i;
        while (j > 0 && b[j - 1].score < e.score) {
            b[j] = b[j - 1];
            j--;
        }
        b[j] = e;
    }
}

polar_status polar_decode_programs(const float *seg, const float *op, int D, const polar_decode_opts *opts,
                                   polar_candidate *out, int max_out, int *n_out, polar_error *err) {
    *n_out = 0;
    polar_decode_opts o = opts ? *opts : polar_decode_defaults();
    if (!seg || !op || !out || D < 1 || o.kmax < 1 || o.beam < 1 || o.top_ops < 1 || o.top_ops > 3 || max_out < 1)
        return polar_fail(err, POLAR_ERR_ARG, "decode: bad arguments");
    int *start = malloc((size_t)D * sizeof *start), *end = malloc((size_t)D * sizeof *end);
    int width = o.beam * o.top_ops;
    beam_entry *cur = calloc((size_t)width, sizeof *cur), *next = calloc((size_t)width, sizeof *next);
    unsigned char *pool = malloc((size_t)2 * width * D);
    polar_status st = POLAR_OK;
    int n_seg = start && end ? segments(seg, D, o.threshold, o.kmax, start, end) : -1;
    if (n_seg < 0 || !cur || !next || !pool) {
        st = polar_fail(err, POLAR_ERR_NOMEM, "decode: out of memory");
        goto done;
    }
    for (int i = 0; i < width; i++) {
        cur[i].ops = pool + (size_t)i * D;
        next[i].ops = pool + (size_t)(width + i) * D;
    }
    int n_cur = 1;
    for (int s = 0; s < n_seg; s++) {
        float lp[3];
        log_softmax3(op + (size_t)start[s] * 3, lp);
        int order[3] = {0, 1, 2};
        for (int i = 1; i < 3; i++) /* stable, descending: ties keep the lower op first */
            for (int j = i; j > 0 && lp[order[j]] > lp[order[j - 1]]; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        int n_next = 0;
        for (int b = 0; b < n_cur; b++)
            for (int k = 0; k < o.top_ops; k++) {
                memcpy(next[n_next].ops, cur[b].ops, (size_t)s);
                next[n_next].ops[s] = (unsigned char)order[k];
                next[n_next].score = cur[b].score + (double)lp[order[k]];
                n_next++;
            }
        sort_desc(next, n_next);
        beam_entry *t = cur;
        cur = next;
        next = t;
        n_cur = n_next < o.beam ? n_next : o.beam;
    }
    /* Expand, dropping the empty program and those outside the bounds. */
    for (int b = 0; b < n_cur && *n_out < max_out; b++) {
        int *layers = malloc((size_t)2 * D * sizeof *layers), n = 0;
        if (!layers) {
            st = polar_fail(err, POLAR_ERR_NOMEM, "decode: out of memory");
            break;
        }
        for (int s = 0; s < n_seg; s++)
            for (int r = 0; r < cur[b].ops[s]; r++)
                for (int l = start[s]; l < end[s]; l++) layers[n++] = l;
        if (n == 0 || (o.min_layers && n < o.min_layers) || (o.max_layers && n > o.max_layers)) {
            free(layers);
            continue;
        }
        out[*n_out].program = (polar_program){n, layers};
        out[*n_out].score = cur[b].score;
        (*n_out)++;
    }
done:
    free(start);
    free(end);
    free(cur);
    free(next);
    free(pool);
    return st;
}
