/* The program search's tree rules through a stub reward (the search cannot
 * tell it from a model): which children the root and deeper nodes get, the
 * twice-only repeat rule, length limits, one evaluation per program, UCB
 * exploitation, determinism for a seed, and the result's order; the action
 * spaces (skip only, loop only, both as before). */
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

/* No layer twice and in base order: a subsequence of 0..D-1. */
static int skip_only(const int *p, int n, int D) {
    for (int i = 0; i < n; i++)
        if (p[i] < 0 || p[i] >= D || (i && p[i] <= p[i - 1])) return 0;
    return 1;
}

/* Every layer of 0..D-1 at least once, none more than twice, and the
 * program is the base with blocks written twice in place: reading it, each
 * layer is the next one of the base or goes back to one already run. */
static int loop_only(const int *p, int n, int D) {
    int counts[MAX_LEN] = {0}, next = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] >= D || ++counts[p[i]] > 2) return 0;
        if (p[i] == next) next++;
        else if (p[i] > next) return 0; /* a layer left out */
    }
    return next == D;
}

/* One simulation per seed, over many seeds: the root children of each
 * space are exactly the reference's candidates of its kind (D 6, limits
 * 1..12: 6 + 5 + 4 + 3 block skips, as many block repeats, 36 in all). */
static void action_root_children(void) {
    static const int want[3] = {36, 18, 18}; /* both, skip, loop */
    int D = 6, base[MAX_LEN];
    for (int i = 0; i < D; i++) base[i] = i;
    for (int actions = 0; actions < 3; actions++) {
        int seen[64][MAX_LEN], seen_len[64], n_seen = 0, shorter = 0, longer = 0;
        for (uint64_t seed = 1; seed <= 600; seed++) {
            recorder r = {.score = zero};
            polar_search_opts o = opts(D, 1, 12, 1, seed);
            o.actions = actions;
            polar_search_result res;
            polar_error err;
            CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
            if (r.n != 2) {
                CHECK(r.n == 2, "%s seed %llu: %d evaluations", polar_search_actions_name(actions),
                      (unsigned long long)seed, r.n);
                polar_search_result_free(&res);
                continue;
            }
            int *q = r.layers[1], nq = r.len[1], edit = 0, known = 0;
            for (int k = 1; k <= 4; k++) edit |= is_edit(base, D, q, nq, k);
            CHECK(edit, "%s seed %llu: the child is no root edit", polar_search_actions_name(actions),
                  (unsigned long long)seed);
            if (actions == POLAR_ACTIONS_SKIP)
                CHECK(nq < D && skip_only(q, nq, D), "skip seed %llu: a child that is no skip",
                      (unsigned long long)seed);
            if (actions == POLAR_ACTIONS_LOOP)
                CHECK(nq > D && loop_only(q, nq, D), "loop seed %llu: a child that is no repeat",
                      (unsigned long long)seed);
            shorter += nq < D, longer += nq > D;
            for (int i = 0; i < n_seen; i++) known |= same(seen[i], seen_len[i], q, nq);
            if (!known && n_seen < 64) memcpy(seen[n_seen], q, (size_t)nq * sizeof(int)), seen_len[n_seen++] = nq;
            polar_search_result_free(&res);
        }
        CHECK(n_seen == want[actions], "%s: %d distinct root children, want %d", polar_search_actions_name(actions),
              n_seen, want[actions]);
        if (actions == POLAR_ACTIONS_BOTH) CHECK(shorter && longer, "both: %d skips, %d repeats", shorter, longer);
    }
}

/* Long searches in the smaller spaces, several seeds and depths: every
 * program asked and every program returned keeps to its space (skip: no
 * layer twice, the rest of the base in order; loop: no layer left out), the
 * budget is the same number of simulations, and the search goes beyond the
 * root's children (below the root, a program of two or more edits). */
static void action_spaces(void) {
    static const int cfg[][3] = {{8, 4, 12}, {12, 6, 16}, {28, 16, 32}}; /* D, min, max */
    for (int c = 0; c < 3; c++)
        for (int actions = POLAR_ACTIONS_SKIP; actions <= POLAR_ACTIONS_LOOP; actions++)
            for (uint64_t seed = 1; seed <= 4; seed++) {
                int D = cfg[c][0], deep = 0, bad = -1;
                const char *name = polar_search_actions_name(actions);
                recorder r = {.score = without_layer2};
                polar_search_opts o = opts(D, cfg[c][1], cfg[c][2], 100, seed);
                o.actions = actions;
                polar_search_result res;
                polar_error err;
                CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
                for (int i = 0; i < r.n && bad < 0; i++) {
                    int ok = actions == POLAR_ACTIONS_SKIP ? skip_only(r.layers[i], r.len[i], D)
                                                           : loop_only(r.layers[i], r.len[i], D);
                    if (!ok || r.len[i] < cfg[c][1] || (i && r.len[i] > cfg[c][2])) bad = i;
                    /* farther from the base than one root edit (1-4 layers) */
                    int one_edit = i == 0;
                    for (int k = 1; k <= 4; k++) one_edit |= is_edit(r.layers[0], D, r.layers[i], r.len[i], k);
                    deep |= !one_edit;
                }
                CHECK(bad < 0, "%s D %d seed %llu: asked program %d is outside the space", name, D,
                      (unsigned long long)seed, bad);
                CHECK(res.simulations == 100 && res.n == r.n && r.n > 10, "%s D %d seed %llu: %d sims, %d of %d listed",
                      name, D, (unsigned long long)seed, res.simulations, res.n, r.n);
                for (int i = 0; i < res.n; i++) {
                    const polar_program *p = &res.programs[i].program;
                    int ok = actions == POLAR_ACTIONS_SKIP ? skip_only(p->layers, p->n, D)
                                                           : loop_only(p->layers, p->n, D);
                    CHECK(ok, "%s D %d seed %llu: returned program %d is outside the space", name, D,
                          (unsigned long long)seed, i);
                }
                CHECK(deep, "%s D %d seed %llu: never below the root's children", name, D, (unsigned long long)seed);
                polar_search_result_free(&res);
            }
}

/* FNV-1a over what the search asked and returned. */
static uint64_t fingerprint_mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001B3ull; }

/* The default space (both) is the search as it was before the action
 * spaces: the programs asked, their order, and the result of 5 seeds at
 * three depths hash to the values the search gave before the switch was
 * added (computed with the commit before it), and naming BOTH is the
 * default. */
static void both_unchanged(void) {
    static const int cfg[][4] = {{8, 4, 12, 100}, {28, 16, 32, 100}, {12, 1, 16, 60}};
    static const uint64_t before[3] = {0x699292fabc91346eull, 0xa98292e6b8e7e343ull, 0x579ef48d6a5ddfb9ull};
    CHECK(polar_search_defaults(28).actions == POLAR_ACTIONS_BOTH, "the default space is not both");
    for (int c = 0; c < 3; c++)
        for (int named = 0; named < 2; named++) {
            uint64_t h = 0xcbf29ce484222325ull;
            for (uint64_t seed = 1; seed <= 5; seed++) {
                recorder r = {.score = without_layer2};
                polar_search_opts o = polar_search_defaults(cfg[c][0]);
                o.min_len = cfg[c][1], o.max_len = cfg[c][2], o.simulations = cfg[c][3], o.seed = seed;
                if (named) o.actions = POLAR_ACTIONS_BOTH;
                polar_search_result res;
                polar_error err;
                CHECK_OK(polar_search_programs(&o, record, &r, &res, &err));
                for (int i = 0; i < r.n; i++) {
                    h = fingerprint_mix(h, (uint64_t)r.len[i]);
                    for (int k = 0; k < r.len[i]; k++) h = fingerprint_mix(h, (uint64_t)r.layers[i][k]);
                }
                for (int i = 0; i < res.n; i++) {
                    const polar_program *p = &res.programs[i].program;
                    h = fingerprint_mix(h, (uint64_t)p->n);
                    for (int k = 0; k < p->n; k++) h = fingerprint_mix(h, (uint64_t)p->layers[k]);
                    h = fingerprint_mix(h, (uint64_t)(res.programs[i].score * 2));
                }
                h = fingerprint_mix(h, (uint64_t)res.simulations);
                h = fingerprint_mix(h, (uint64_t)res.evaluations);
                h = fingerprint_mix(h, (uint64_t)res.nodes);
                polar_search_result_free(&res);
            }
            CHECK(h == before[c], "D %d%s: fingerprint 0x%016llx, before 0x%016llx", cfg[c][0],
                  named ? " (BOTH named)" : "", (unsigned long long)h, (unsigned long long)before[c]);
        }
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
    o = opts(6, 1, 12, 10, 1);
    o.actions = 3;
    CHECK(polar_search_programs(&o, record, NULL, &res, &err) == POLAR_ERR_ARG && strstr(err.msg, "action space"),
          "actions 3: %s", err.msg);
    for (int a = 0; a < 3; a++)
        CHECK(polar_search_actions_parse(polar_search_actions_name(a)) == a, "action space %d's name", a);
    CHECK(polar_search_actions_parse("skip") == POLAR_ACTIONS_SKIP && polar_search_actions_parse("loop") ==
              POLAR_ACTIONS_LOOP && polar_search_actions_parse("Skip") < 0 && polar_search_actions_parse(NULL) < 0 &&
              !polar_search_actions_name(-1) && !polar_search_actions_name(3),
          "action space names");
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
    RUN(action_root_children);
    RUN(action_spaces);
    RUN(both_unchanged);
    RUN(errors);
    TEST_EXIT();
}
