/* The program search's tree rules through a stub reward (the search cannot
 * tell it from a model): which children the root and deeper nodes get, the
 * twice-only repeat rule, length limits, one evaluation per program, UCB
 * exploitation, determinism for a seed, and the result's order. */
#include "../runtime/error.h"
#include "harness.h"

#define MAX_SEEN 4096
#define MAX_LEN 64

/* Records every program the search asks about, in order. */
typedef struct {
    int n;
    int len[MAX_SEEN];
    int layers[MAX_SEEN][MAX_LEN];
    int (*score)(const int *p, int n); /* the reward table, as a rule */
} recorder;

static int zero(const int *p, int n) { return (void)p, (void)n, 0; }

/* 1 for programs that skip layer 2 entirely */
static int without_layer2(const int *p, int n) {
    for (int i = 0; i < n; i++)
        if (p[i] == 2) return 0;
    return 1;
}

static polar_status record(void *ctx, const polar_program *p, double *reward, polar_error *err) {
    recorder *r = ctx;
    if (r->n == MAX_SEEN || p->n > MAX_LEN) return polar_fail(err, POLAR_ERR_IO, "stub reward failed");
    r->len[r->n] = p->n;
    memcpy(r->layers[r->n], p->layers, (size_t)p->n * sizeof(int));
    r->n++;
    *reward = r->score(p->layers, p->n);
    return POLAR_OK;
}

static int same(const int *a, int na, const int *b, int nb) { return na == nb && !memcmp(a, b, (size_t)na * sizeof(int)); }

/* q is p with k consecutive layers removed, or written twice in place. */
static int is_edit(const int *p, int np, const int *q, int nq, int k) {
    int c[MAX_LEN + 8];
    for (int i = 0; i + k <= np; i++) {
        for (int repeat = 0; repeat < 2; repeat++) {
            int m = 0;
            for (int j = 0; j < i; j++) c[m++] = p[j];
            if (repeat)
                for (int j = i; j < i + k; j++) c[m++] = p[j];
            for (int j = repeat ? i : i + k; j < np; j++) c[m++] = p[j];
            if (same(c, m, q, nq)) return 1;
        }
    }
    return 0;
}

static int max_count(const int *p, int n) {
    int counts[MAX_LEN] = {0}, most = 0;
    for (int i = 0; i < n; i++)
        if (++counts[p[i]] > most) most = counts[p[i]];
    return most;
}

static polar_search_opts opts(int D, int min_len, int max_len, int sims, uint64_t seed) {
    polar_search_opts o = polar_search_defaults(D);
    o.min_len = min_len, o.max_len = max_len, o.simulations = sims, o.seed = seed;
    return o;
}

/* One simulation: the root is evaluated, then one of its children chosen
 * at random. Over many seeds the children seen are exactly the root's
 * candidates: skips and in-place repeats of 1-4 consecutive layers within
 * the length limits. */
static void root_children(void) {
    static const int limits[][4] = {{6, 1, 12, 36}, {6, 5, 7, 12}}; /* D, min, max, candidates expected */
    for (int c = 0; c < 2; c++) {
        int D = limits[c][0], base[MAX_LEN], seen[64][MAX_LEN], seen_len[64], n_seen = 0;
        for (int i = 0; i < D; i++) base[i] = i;
        for (uint64_t seed = 1; seed <= 600; seed++) {
            recorder r = {.score = zero};
            polar_search_opts o = opts(D, limits[c][1], limits[c][2], 1, seed);
            polar_search_result res;
            polar_error err;
            CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
            CHECK(r.n == 2 && same(r.layers[0], r.len[0], base, D), "seed %llu: %d evaluations, root first",
                  (unsigned long long)seed, r.n);
            int *q = r.layers[1], nq = r.len[1], known = 0;
            int ok = 0;
            for (int k = 1; k <= 4; k++) ok |= is_edit(base, D, q, nq, k);
            CHECK(ok && nq >= limits[c][1] && nq <= limits[c][2], "seed %llu: child of length %d is no root edit",
                  (unsigned long long)seed, nq);
            for (int i = 0; i < n_seen; i++) known |= same(seen[i], seen_len[i], q, nq);
            if (!known && n_seen < 64) memcpy(seen[n_seen], q, (size_t)nq * sizeof(int)), seen_len[n_seen++] = nq;
            polar_search_result_free(&res);
        }
        CHECK(n_seen == limits[c][3], "D %d limits %d..%d: %d distinct root children, want %d", D, limits[c][1],
              limits[c][2], n_seen, limits[c][3]);
    }
}

/* Two simulations with no random selection: the second goes down to the
 * evaluated child (the only one with a finite UCB) and evaluates one of its
 * children, which below the root are one-layer skips and repeats only, and
 * never run a layer three times. */
static void deeper_children(void) {
    int D = 4, blocks = 0;
    for (uint64_t seed = 1; seed <= 400; seed++) {
        recorder r = {.score = zero};
        polar_search_opts o = opts(D, 1, 8, 2, seed);
        o.explore = 0;
        polar_search_result res;
        polar_error err;
        CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
        if (r.n != 3) {
            CHECK(r.n == 3, "seed %llu: %d evaluations", (unsigned long long)seed, r.n);
            continue;
        }
        CHECK(is_edit(r.layers[1], r.len[1], r.layers[2], r.len[2], 1),
              "seed %llu: the grandchild is not a one-layer skip or repeat of the child", (unsigned long long)seed);
        CHECK(max_count(r.layers[2], r.len[2]) <= 2, "seed %llu: a layer runs three times", (unsigned long long)seed);
        blocks += r.len[1] <= D - 2 || r.len[1] >= D + 2; /* the child came from a block edit */
        polar_search_result_free(&res);
    }
    CHECK(blocks > 0, "no block skip or repeat at the root in 400 seeds");
}

/* A long search: every program asked once, within the limits, no layer
 * three times; the result lists every evaluated program, best first. */
static void long_search(void) {
    recorder r = {.score = without_layer2};
    polar_search_opts o = opts(8, 5, 10, 100, 42);
    polar_search_result res;
    polar_error err;
    CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
    CHECK(res.simulations == 100 && res.evaluations == r.n && r.n <= 101 && r.n > 50, "%d sims, %d evaluations",
          res.simulations, r.n);
    for (int i = 1; i < r.n; i++) {
        CHECK(r.len[i] >= 5 && r.len[i] <= 10 && max_count(r.layers[i], r.len[i]) <= 2, "program %d breaks a rule", i);
        for (int j = 0; j < i; j++) CHECK(!same(r.layers[i], r.len[i], r.layers[j], r.len[j]), "asked twice: %d %d", j, i);
    }
    CHECK(res.n == r.n && res.initial_score == 0, "%d listed of %d", res.n, r.n);
    for (int i = 1; i < res.n; i++)
        CHECK(res.programs[i - 1].score > res.programs[i].score ||
                  (res.programs[i - 1].score == res.programs[i].score &&
                   res.programs[i - 1].program.n <= res.programs[i].program.n),
              "result order at %d", i);
    polar_search_result_free(&res);
}

/* 1 for programs that skip layer 0 */
static int without_layer0(const int *p, int n) {
    for (int i = 0; i < n; i++)
        if (p[i] == 0) return 0;
    return 1;
}

/* Share of asked programs that skip layer 0, over 20 seeds, when the reward
 * pays for it and when it pays nothing. */
static double share_without_layer0(int (*score)(const int *, int)) {
    int hits = 0, total = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        recorder r = {.score = score};
        polar_search_opts o = opts(8, 4, 12, 100, seed);
        polar_search_result res;
        polar_error err;
        CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
        for (int i = 1; i < r.n; i++) hits += without_layer0(r.layers[i], r.len[i]);
        total += r.n - 1;
        polar_search_result_free(&res);
    }
    return (double)hits / total;
}

/* UCB exploits: where a reward pays for skipping layer 0 the search asks
 * more such programs than where nothing is paid. The margin is modest, as in
 * the reference: a child visited once has an exploration bonus of ~2.8 at
 * N = 50 against ~0.4 for one visited 50 times, far more than a reward of 1,
 * so new branches win most comparisons. (Deterministic: fixed seeds.) */
static void ucb_exploits(void) {
    double paid = share_without_layer0(without_layer0), unpaid = share_without_layer0(zero);
    printf("  programs without layer 0: %.2f rewarded, %.2f unrewarded\n", paid, unpaid);
    CHECK(paid > 1.2 * unpaid, "rewarded share %.2f vs %.2f", paid, unpaid);
}

/* Without random selection the search dives: unvisited children have UCB
 * -inf, so each simulation goes down the path it evaluated last and asks
 * a child of the program it asked before. */
static void dive_without_exploration(void) {
    recorder r = {.score = without_layer0};
    polar_search_opts o = opts(6, 1, 12, 12, 3);
    o.explore = 0;
    polar_search_result res;
    polar_error err;
    CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
    CHECK(r.n == 13, "%d evaluations", r.n);
    for (int i = 2; i < r.n; i++)
        CHECK(is_edit(r.layers[i - 1], r.len[i - 1], r.layers[i], r.len[i], 1), "program %d is no child of %d", i,
              i - 1);
    polar_search_result_free(&res);
}

static void deterministic(void) {
    recorder a = {.score = without_layer2}, b = {.score = without_layer2}, c = {.score = without_layer2};
    polar_search_opts o = opts(10, 6, 12, 60, 7);
    polar_search_result ra, rb, rc;
    polar_error err;
    CHECK_OK(polar_search_programs(&o, record, &a, &ra, &err));
    CHECK_OK(polar_search_programs(&o, record, &b, &rb, &err));
    o.seed = 8;
    CHECK_OK(polar_search_programs(&o, record, &c, &rc, &err));
    int equal = a.n == b.n, differ = a.n != c.n;
    for (int i = 0; i < a.n && i < b.n; i++) equal &= same(a.layers[i], a.len[i], b.layers[i], b.len[i]);
    for (int i = 0; i < a.n && i < c.n; i++) differ |= !same(a.layers[i], a.len[i], c.layers[i], c.len[i]);
    CHECK(equal, "the same seed asked other programs");
    CHECK(differ, "seeds 7 and 8 asked the same programs");
    polar_search_result_free(&ra), polar_search_result_free(&rb), polar_search_result_free(&rc);
}

static polar_status failing(void *ctx, const polar_program *p, double *reward, polar_error *err) {
    (void)ctx, (void)p, (void)reward;
    return polar_fail(err, POLAR_ERR_IO, "stub reward failed");
}

static void errors(void) {
    polar_search_result res;
    polar_error err;
    polar_search_opts o = opts(6, 1, 12, 10, 1);
    CHECK(polar_search_programs(&o, failing, NULL, &res, &err) == POLAR_ERR_IO && res.n == 0,
          "a failing reward stops the search");
    o.min_len = 13;
    CHECK(polar_search_programs(&o, record, NULL, &res, &err) == POLAR_ERR_ARG && strstr(err.msg, "length limits"),
          "min > max: %s", err.msg);
    o = opts(0, 1, 2, 10, 1);
    CHECK(polar_search_programs(&o, record, NULL, &res, &err) == POLAR_ERR_ARG, "D 0");
    int lo, hi;
    polar_search_limits(28, &lo, &hi);
    CHECK(lo == 16 && hi == 32, "D 28: %d..%d", lo, hi);
    polar_search_limits(36, &lo, &hi);
    CHECK(lo == 24 && hi == 44, "D 36: %d..%d", lo, hi);
    polar_search_limits(30, &lo, &hi);
    CHECK(lo == 20 && hi == 35, "D 30: %d..%d", lo, hi);
}

int main(void) {
    RUN(root_children);
    RUN(deeper_children);
    RUN(long_search);
    RUN(ucb_exploits);
    RUN(dive_without_exploration);
    RUN(deterministic);
    RUN(errors);
    TEST_EXIT();
}
