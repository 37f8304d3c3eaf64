/* Sampling: the seeded generator, temperature, top-k, top-p and min-p
 * against the exact distributions they define, and polar_generate with a
 * temperature. */
#include "harness.h"

/* Frequencies of n_draws samples over n logits. */
static void sampled(const float *logits, int n, const polar_gen_opts *o, uint64_t seed, int n_draws, double *freq) {
    polar_rng rng;
    polar_rng_seed(&rng, seed);
    void *work = malloc(polar_sample_work_bytes(n));
    for (int i = 0; i < n; i++) freq[i] = 0;
    for (int d = 0; d < n_draws; d++) freq[polar_sample(logits, n, o, &rng, work)] += 1.0 / n_draws;
    free(work);
}

static void frequencies(const float *logits, int n, float temperature, float top_p, uint64_t seed, int n_draws,
                        double *freq) {
    sampled(logits, n, &(polar_gen_opts){.temperature = temperature, .top_p = top_p}, seed, n_draws, freq);
}

static void rng_streams(void) {
    polar_rng a, b, c;
    polar_rng_seed(&a, 42), polar_rng_seed(&b, 42), polar_rng_seed(&c, 43);
    int same = 1, differ = 0;
    double lo = 1, hi = 0, mean = 0;
    for (int i = 0; i < 100000; i++) {
        double x = polar_rng_uniform(&a), y = polar_rng_uniform(&b), z = polar_rng_uniform(&c);
        same &= x == y, differ += x != z;
        lo = x < lo ? x : lo, hi = x > hi ? x : hi, mean += x / 100000;
    }
    CHECK(same, "one seed, one stream");
    CHECK(differ > 99990, "seeds 42 and 43 agree on %d of 100000 draws", 100000 - differ);
    CHECK(lo >= 0 && hi < 1 && fabs(mean - 0.5) < 0.005, "uniform in [0,1): min %g max %g mean %g", lo, hi, mean);
}

static void distributions(void) {
    const float logits[4] = {logf(0.5f), logf(0.3f), logf(0.2f), -INFINITY};
    double f[6];
    /* temperature 1: the softmax itself */
    frequencies(logits, 4, 1.0f, 1.0f, 7, 200000, f);
    CHECK(fabs(f[0] - 0.5) < 0.006 && fabs(f[1] - 0.3) < 0.006 && fabs(f[2] - 0.2) < 0.006 && f[3] == 0,
          "T 1: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    /* temperature 0.5 squares the probabilities: 25:9:4 */
    frequencies(logits, 4, 0.5f, 1.0f, 8, 200000, f);
    CHECK(fabs(f[0] - 25.0 / 38) < 0.006 && fabs(f[1] - 9.0 / 38) < 0.006 && fabs(f[2] - 4.0 / 38) < 0.006,
          "T 0.5: %.4f %.4f %.4f", f[0], f[1], f[2]);
    /* top-p 0.6: 0.5 is short of it, so {0, 1} renormalised: 0.625 / 0.375 */
    frequencies(logits, 4, 1.0f, 0.6f, 9, 200000, f);
    CHECK(fabs(f[0] - 0.625) < 0.006 && fabs(f[1] - 0.375) < 0.006 && f[2] == 0 && f[3] == 0,
          "top-p 0.6: %.4f %.4f %.4f", f[0], f[1], f[2]);
    /* top-p 0.5 is reached by the first token alone */
    frequencies(logits, 4, 1.0f, 0.5f, 10, 1000, f);
    CHECK(f[0] > 0.9999 && f[1] == 0, "top-p 0.5: %.4f", f[0]);
    /* equal logits: the nucleus takes the lower ids first */
    const float flat[6] = {1, 1, 1, 1, 1, 1};
    frequencies(flat, 6, 1.0f, 0.3f, 11, 60000, f);
    CHECK(f[0] > 0.45 && f[1] > 0.45 && f[2] == 0 && f[5] == 0, "ties: %.3f %.3f %.3f", f[0], f[1], f[2]);
    /* a nucleus below one token's share of flat logits: the first token
     * alone (the pre-filter once dropped every token here) */
    float flat1000[1000];
    double f1000[1000];
    for (int i = 0; i < 1000; i++) flat1000[i] = 0.5f;
    frequencies(flat1000, 1000, 1.0f, 1e-4f, 12, 100, f1000);
    CHECK(f1000[0] > 0.9999, "top-p 1e-4 over 1000 equal logits: token 0 drawn %.4f of the time", f1000[0]);
    /* temperature 0 is the argmax, with no generator needed */
    CHECK(polar_sample(logits, 4, &(polar_gen_opts){.top_p = 0.9f}, NULL, NULL) == 0, "T 0: the argmax");
}

/* top-k keeps the k most likely and any as likely as the k-th (as
 * transformers does), min-p those at least min_p times as likely as the
 * most likely, both renormalised; with top-p, in transformers' order. */
static void top_k_min_p(void) {
    const float logits[5] = {logf(0.4f), logf(0.2f), logf(0.2f), logf(0.15f), logf(0.05f)};
    double f[5];
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .top_k = 1}, 20, 1000, f);
    CHECK(f[0] > 0.9999, "top-k 1: the argmax %.4f", f[0]);
    /* top-k 2 meets a tie at the 2nd place: all three kept, 0.5 / 0.25 / 0.25 */
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .top_k = 2}, 21, 200000, f);
    CHECK(fabs(f[0] - 0.5) < 0.006 && fabs(f[1] - 0.25) < 0.006 && fabs(f[2] - 0.25) < 0.006 && f[3] == 0 && f[4] == 0,
          "top-k 2 with a tie: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    /* top-k 4 then top-p 0.7 of the remaining 0.95: {0.4, 0.2, 0.2} reach 0.8 / 0.95 */
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .top_k = 4, .top_p = 0.7f}, 22, 200000, f);
    CHECK(fabs(f[0] - 0.5) < 0.006 && fabs(f[1] - 0.25) < 0.006 && fabs(f[2] - 0.25) < 0.006 && f[3] == 0,
          "top-k 4, top-p 0.7: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    /* min-p 0.4: at least 0.16, so 0.4 / 0.2 / 0.2 of 0.8 */
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .min_p = 0.4f}, 23, 200000, f);
    CHECK(fabs(f[0] - 0.5) < 0.006 && fabs(f[1] - 0.25) < 0.006 && fabs(f[2] - 0.25) < 0.006 && f[3] == 0,
          "min-p 0.4: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    /* min-p 0.3 keeps 0.15 too; after top-p 0.5 ({0.4, 0.2}) it changes nothing */
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .min_p = 0.3f}, 24, 200000, f);
    CHECK(fabs(f[3] - 0.15 / 0.95) < 0.006 && f[4] == 0, "min-p 0.3: %.4f %.4f", f[3], f[4]);
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .top_p = 0.5f, .min_p = 0.3f}, 25, 200000, f);
    CHECK(fabs(f[0] - 2.0 / 3) < 0.006 && fabs(f[1] - 1.0 / 3) < 0.006 && f[2] == 0, "top-p 0.5, min-p 0.3: %.4f %.4f",
          f[0], f[1]);
    /* min-p after temperature 0.5 (probabilities squared: 16:4:4:2.25:0.25): 0.2 keeps 3.2 and up */
    sampled(logits, 5, &(polar_gen_opts){.temperature = 0.5f, .min_p = 0.2f}, 26, 200000, f);
    CHECK(fabs(f[0] - 16.0 / 24) < 0.006 && fabs(f[1] - 4.0 / 24) < 0.006 && f[3] == 0,
          "T 0.5, min-p 0.2: %.4f %.4f %.4f", f[0], f[1], f[3]);
    /* min-p 1 (or above): the most likely token alone; top-k past n: every token */
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .min_p = 2}, 27, 1000, f);
    CHECK(f[0] > 0.9999, "min-p 2: the argmax %.4f", f[0]);
    sampled(logits, 5, &(polar_gen_opts){.temperature = 1, .top_k = 9}, 28, 200000, f);
    CHECK(fabs(f[4] - 0.05) < 0.004, "top-k 9 of 5: %.4f", f[4]);
    /* no distribution (an infinite or NaN logit): the argmax, never a read
     * outside the work space (min-p once kept nothing and read c[-1]) */
    const float inf[4] = {1, INFINITY, 2, 3}, nan[4] = {NAN, 1, 2, 3};
    polar_rng rng;
    polar_rng_seed(&rng, 1);
    void *work = malloc(polar_sample_work_bytes(4));
    polar_gen_opts all = {.temperature = 1, .top_k = 2, .top_p = 0.9f, .min_p = 0.1f};
    CHECK(polar_sample(inf, 4, &all, &rng, work) == 1, "an infinite logit: its token");
    int got = polar_sample(nan, 4, &(polar_gen_opts){.temperature = 1, .min_p = 0.1f}, &rng, work);
    CHECK(got >= 0 && got < 4, "a NaN logit: %d", got);
    free(work);
    /* top-k 40 at a temperature that underflows all but the 143 best (a
     * tie) to weight 0: those, and none of the zeros */
    float wide[1000];
    double fw[1000], best = 0;
    for (int i = 0; i < 1000; i++) wide[i] = (float)(i % 7);
    sampled(wide, 1000, &(polar_gen_opts){.temperature = 0.001f, .top_k = 40}, 29, 20000, fw);
    for (int i = 6; i < 1000; i += 7) best += fw[i];
    CHECK(best > 0.9999 && fw[6] > 0 && fw[993] > 0, "low temperature top-k: %.4f on the tied best", best);
}

/* The draw polar_sample must make, the obvious way: every token sorted
 * (more likely first, ties to the lower id), the nucleus summed in that
 * order, the same uniform draw. */
typedef struct {
    float p;
    int i;
} ref_cand;

static int ref_desc(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->i - y->i;
}

static int ref_sample(const float *logits, int n, const polar_gen_opts *o, polar_rng *rng, ref_cand *c) {
    float m = logits[0];
    for (int i = 1; i < n; i++) m = logits[i] > m ? logits[i] : m;
    double z = 0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf((logits[i] - m) / o->temperature), c[i].i = i;
        z += c[i].p;
    }
    qsort(c, (size_t)n, sizeof *c, ref_desc);
    int k = n;
    if (o->top_k > 0 && o->top_k < n) {
        k = o->top_k;
        while (k < n && c[k].p == c[k - 1].p) k++;
        z = 0;
        for (int j = 0; j < k; j++) z += c[j].p;
    }
    double cum = 0;
    if (o->top_p > 0 && o->top_p < 1) {
        int kept = 0;
        while (kept < k && cum < o->top_p * z) cum += c[kept++].p;
        k = kept, z = cum;
    }
    if (o->min_p > 0) {
        int kept = 0;
        z = 0;
        while (kept < k && c[kept].p >= o->min_p) z += c[kept++].p;
        k = kept;
    }
    double r = polar_rng_uniform(rng) * z, acc = 0;
    for (int j = 0; j < k; j++) {
        acc += c[j].p;
        if (r < acc) return c[j].i;
    }
    return c[k - 1].i;
}

/* The sets polar_sample finds without sorting give the reference's draws
 * exactly: random logits (with repeated values, so ties matter) of a
 * vocabulary's size, several temperatures and top-p, with and without
 * top-k and min-p. */
static void nucleus_matches_sort(void) {
    enum { n = 50000 };
    float *logits = malloc(n * sizeof *logits);
    ref_cand *ref = malloc(n * sizeof *ref);
    void *work = malloc(polar_sample_work_bytes(n));
    uint64_t x = 99;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((x >> 40) % 2000) / 100.0f; /* 2000 distinct values: ties */
    }
    static const float temps[] = {0.3f, 0.7f, 1.0f, 1.5f}, tops[] = {0.05f, 0.5f, 0.9f, 0.99f, 1.0f};
    static const int top_ks[] = {0, 1, 40, 1000};
    static const float min_ps[] = {0, 0.05f, 0.5f};
    int differ = 0, draws = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++)
            for (int t = 0; t < 4; t++)
                for (int mp = 0; mp < 3; mp++) {
                    polar_gen_opts o = {.temperature = temps[a], .top_p = tops[b], .top_k = top_ks[t], .min_p = min_ps[mp]};
                    if (tops[b] == 1.0f && !o.top_k && !o.min_p) continue; /* unfiltered: drawn in index order */
                    polar_rng r1, r2;
                    uint64_t seed = (uint64_t)(((a * 5 + b) * 4 + t) * 3 + mp);
                    polar_rng_seed(&r1, seed), polar_rng_seed(&r2, seed);
                    for (int d = 0; d < 2; d++, draws++)
                        differ += polar_sample(logits, n, &o, &r1, work) != ref_sample(logits, n, &o, &r2, ref);
                }
    CHECK(differ == 0, "%d of %d draws differ from the sorted reference", differ, draws);
    free(logits), free(ref), free(work);
}

static void generate_sampled(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    CHECK_OK(polar_model_random(&a, 5, &m, &err));
    if (!m) return;
    int prompt[8], out[4][24];
    for (int i = 0; i < 8; i++) prompt[i] = (i * 31 + 3) % a.vocab;
    polar_session *s = NULL;
    polar_session_opts so = {.max_ctx = 40, .n_threads = 2};
    polar_program base;
    CHECK_OK(polar_program_parse("base", a.n_layers, 0, &base, &err));
    CHECK_OK(polar_session_create(m, &base, &so, &s, &err));
    polar_program_free(&base);
    if (s) {
        polar_gen_opts greedy = {.max_new = 24, .ignore_eos = 1};
        polar_gen_opts hot = {.max_new = 24, .ignore_eos = 1, .temperature = 1.5f, .top_p = 0.95f, .seed = 1};
        polar_gen_opts cold = {.max_new = 24, .ignore_eos = 1, .temperature = 1e-4f, .seed = 1};
        polar_gen_stats st;
        CHECK_OK(polar_generate(s, prompt, 8, &greedy, out[0], NULL, NULL, NULL, &err));
        CHECK_OK(polar_generate(s, prompt, 8, &hot, out[1], &st, NULL, NULL, &err));
        CHECK(st.n_generated == 24, "sampled %d tokens", st.n_generated);
        CHECK_OK(polar_generate(s, prompt, 8, &hot, out[2], NULL, NULL, NULL, &err));
        CHECK(!memcmp(out[1], out[2], sizeof out[1]), "one seed, the same tokens");
        hot.seed = 2;
        CHECK_OK(polar_generate(s, prompt, 8, &hot, out[3], NULL, NULL, NULL, &err));
        CHECK(memcmp(out[1], out[3], sizeof out[1]), "seeds 1 and 2 gave the same 24 tokens");
        CHECK_OK(polar_generate(s, prompt, 8, &cold, out[2], NULL, NULL, NULL, &err));
        CHECK(!memcmp(out[0], out[2], sizeof out[0]), "a near-zero temperature is greedy");
    }
    polar_session_free(s);
    polar_model_free(m);
}

/* The first index of the largest value by its definition: NaNs passed
 * over, 0 when nothing is above -inf. */
static int argmax_by_definition(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

/* polar_argmax skips whole chunks: lengths around its chunk size, ties,
 * NaNs (also at index 0), infinities, all -inf. */
static void argmax_cases(void) {
    float *x = malloc(3000 * sizeof *x);
    uint64_t r = 12345;
    static const int lengths[] = {0, 1, 2, 15, 16, 17, 255, 256, 257, 258, 511, 512, 513, 1000, 2999};
    int wrong = 0, cases = 0;
    for (size_t c = 0; c < sizeof lengths / sizeof *lengths; c++) {
        int n = lengths[c];
        for (int kind = 0; kind < 5; kind++, cases++) {
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                int u = (int)(r >> 33) % 100;
                x[i] = kind == 4 ? -INFINITY
                       : u < 4   ? NAN
                       : u < 6   ? (kind == 1 ? INFINITY : -INFINITY)
                                 : (float)((r >> 40) % (kind == 2 ? 3 : 1000)); /* kind 2: many ties */
            }
            if (kind == 3 && n) x[0] = NAN;
            int got = polar_argmax(x, n), want = argmax_by_definition(x, n);
            if (got != want && wrong++ < 5) CHECK(0, "argmax n %d kind %d: %d, by definition %d", n, kind, got, want);
        }
    }
    CHECK(wrong == 0, "argmax: %d of %d cases differ", wrong, cases);
    free(x);
}

int main(void) {
    RUN(argmax_cases);
    RUN(rng_streams);
    RUN(distributions);
    RUN(top_k_min_p);
    RUN(nucleus_matches_sort);
    RUN(generate_sampled);
    TEST_EXIT();
}
