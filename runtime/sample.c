/* Temperature, top-k, top-p (nucleus) and min-p sampling with a seeded generator the caller
 * owns, so runs repeat exactly and threads never share state; and what ends
 * a generation. */
#include <limits.h>
#include <math.h>

#include "model.h"
#include "polar.h"

/* splitmix64: one 64-bit state, every seed (0 included) gives a full-period stream. */
static uint64_t next_u64(polar_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void polar_rng_seed(polar_rng *r, uint64_t seed) { r->state = seed; }

double polar_rng_uniform(polar_rng *r) { return (double)(next_u64(r) >> 11) * 0x1.0p-53; }

int polar_argmax(const float *logits, int n) {
    /* A chunk is scanned for its index only when its largest value, taken
     * lane-wise in a loop the compiler vectorizes, beats the best so far:
     * a greedy step over a large vocabulary costs a few us, not ~20. */
    enum { LANES = 16, CHUNK = 256 };
    int best = 0, i = 0;
    float best_v = -INFINITY;
    for (; i + CHUNK <= n; i += CHUNK) {
        float lane_max[LANES], chunk_max = -INFINITY;
        for (int l = 0; l < LANES; l++) lane_max[l] = -INFINITY;
        for (int j = i; j < i + CHUNK; j += LANES)
            for (int l = 0; l < LANES; l++) lane_max[l] = logits[j + l] > lane_max[l] ? logits[j + l] : lane_max[l];
        for (int l = 0; l < LANES; l++) chunk_max = lane_max[l] > chunk_max ? lane_max[l] : chunk_max;
        if (!(chunk_max > best_v)) continue;
        for (int j = i; j < i + CHUNK; j++)
            if (logits[j] > best_v) best_v = logits[j], best = j;
    }
    for (; i < n; i++)
        if (logits[i] > best_v) best_v = logits[i], best = i;
    return best;
}

typedef struct {
    float p;
    int i;
} cand;

/* a goes before b: more likely, or as likely with a lower id (a total order,
 * so the nucleus is the same whichever way it is found) */
static int goes_before(const cand *a, const cand *b) { return a->p > b->p || (a->p == b->p && a->i < b->i); }

static void sift_down(cand *c, int n, int at) {
    for (;;) {
        int top = at, l = 2 * at + 1, r = l + 1;
        if (l < n && goes_before(&c[l], &c[top])) top = l;
        if (r < n && goes_before(&c[r], &c[top])) top = r;
        if (top == at) return;
        cand t = c[at];
        c[at] = c[top], c[top] = t;
        at = top;
    }
}

/* The most likely of c[0..k), in order, most likely first: *count of them
 * at the returned place, their mass (summed in that order) in *sum. Taken
 * until their mass reaches `mass` and, once `limit` are taken, only while
 * the next is as likely as the last (top-k keeps ties, as transformers
 * does) and not of weight 0 (at a low temperature a whole vocabulary
 * underflows into one such tie; none of it can be drawn). A heap, not a
 * sort: only what is taken gets ordered, and nothing is allocated (qsort
 * may allocate). */
static cand *most_likely(cand *c, int k, double mass, int limit, int *count, double *sum) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    int heap = k;
    double cum = 0;
    while (heap > 0 && cum < mass) { /* the heap's top goes just past its end */
        if (k - heap >= limit && (c[0].p != c[heap].p || c[0].p == 0)) break; /* c[heap]: the last taken */
        cand t = c[0];
        c[0] = c[heap - 1], c[heap - 1] = t;
        sift_down(c, --heap, 0);
        cum += c[heap].p;
    }
    for (int a = heap, b = k - 1; a < b; a++, b--) { /* c[heap..k) holds them least likely first */
        cand t = c[a];
        c[a] = c[b], c[b] = t;
    }
    *count = k - heap, *sum = cum;
    return c + heap;
}

int polar_sample(const float *logits, int n, const polar_gen_opts *o, polar_rng *rng, void *work) {
    if (!o || o->temperature <= 0 || !rng) return polar_argmax(logits, n);
    float m = logits[0];
    for (int i = 1; i < n; i++) m = logits[i] > m ? logits[i] : m;
    cand *c = work;
    double z = 0;
    for (int i = 0; i < n; i++) { /* the most likely token's weight is exactly 1 */
        c[i].p = expf((logits[i] - m) / o->temperature), c[i].i = i;
        z += c[i].p;
    }
    /* transformers' order: top-k, then top-p over what is left, then min-p */
    int k = n, ordered = 0;
    if (o->top_k > 0 && o->top_k < n) {
        c = most_likely(c, k, HUGE_VAL, o->top_k, &k, &z);
        ordered = 1;
    }
    if (o->top_p > 0 && o->top_p < 1) {
        /* A token in the nucleus has at least (1 - top_p) of the mass
         * among itself and the tokens after it (at most k of them, each no
         * more likely): below (1 - top_p) / k of the mass it never is. */
        double floor_p = (1.0 - o->top_p) / k * z;
        int kept = 0;
        for (int i = 0; i < k; i++)
            if (c[i].p >= floor_p) c[kept++] = c[i];
        c = most_likely(c, kept, o->top_p * z, INT_MAX, &k, &z);
        ordered = 1;
    }
    if (o->min_p > 0) { /* below min_p of the most likely token's probability */
        float floor_p = o->min_p < 1 ? o->min_p : 1.0f;
        int kept = 0;
        z = 0;
        for (int i = 0; i < k; i++)
            if (c[i].p >= floor_p) c[kept++] = c[i], z += c[i].p;
        k = kept;
        if (!ordered) c = most_likely(c, k, HUGE_VAL, INT_MAX, &k, &z);
    }
    if (k == 0 || !(z > 0)) return polar_argmax(logits, n); /* NaN or +inf logits: no distribution */
    double r = polar_rng_uniform(rng) * z, cum = 0;
    for (int j = 0; j < k; j++) {
        cum += c[j].p;
        if (r < cum) return c[j].i;
    }
    return c[k - 1].i; /* r landed on the rounding error of the sum */
}

size_t polar_sample_work_bytes(int n) { return (size_t)n * sizeof(cand); }

int gen_stops_at(const polar_arch *a, const polar_gen_opts *o, int token) {
    for (int i = 0; i < a->n_eos; i++)
        if (a->eos[i] == token) return 1;
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop[i] == token) return 1;
    return 0;
}
