/* Temperature / top-p (nucleus) sampling with a seeded generator the caller
 * owns, so runs repeat exactly and threads never share state; and what ends
 * a generation. */
#include <math.h>
#include <stdlib.h>

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


typedef struct {
    float p;
    int i;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->i - y->i;
}

int polar_sample(const float *logits, int n, float temperature, float top_p, polar_rng *rng, void *work) {
    if (temperature <= 0 || !rng) return polar_argmax(logits, n);
    float m = logits[0];
    for (int i = 1; i < n; i++) m = logits[i] > m ? logits[i] : m;
    cand *c = work;
    double z = 0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf((logits[i] - m) / temperature), c[i].i = i;
        z += c[i].p;
    }
    int k = n;
    if (top_p > 0 && top_p < 1) {
        /* A token below (1 - top_p) / (n - 1) of the mass can never be in
         * the nucleus: drop those before sorting. */
        double floor_p = n > 1 ? (1.0 - top_p) / (n - 1) * z : 0;
        k = 0;
        for (int i = 0; i < n; i++)
            if (c[i].p >= floor_p) c[k++] = c[i];
        qsort(c, (size_t)k, sizeof *c, cand_desc);
        double cum = 0;
        int keep = 0;
        while (keep < k && cum < top_p * z) cum += c[keep++].p;
        k = keep, z = cum;
    }
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
