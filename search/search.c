/* PoLar's program search: Monte Carlo tree search over layer programs, with
 * the reference's rules (PoLar's mcts_discovery). The root is the base
 * program; a node's children are its one-layer skips and in-place repeats
 * (no layer more than twice), and at the root also skips and repeats of
 * blocks of 2-4 layers; each program appears once in the tree. Selection
 * walks down by UCB = mean reward - lambda * len / D + sqrt(2 ln(N + 1) / n)
 * (a random child with probability `explore`), expands the node it stops
 * at, picks one of its children at random and asks the caller for its
 * reward, once per program. The search knows nothing of models: it hands
 * out programs (polar_search_next) and takes their rewards, so a caller may
 * run many questions' searches at once; polar_search_programs is the loop
 * with a reward callback.
 *
 * Action spaces (opts.actions, `polar search --actions`), for the paper's
 * Table 1, which searches Skip, Loop and Skip&Loop apart: the reference's
 * release (tianyi-lab/PoLar, mcts_discovery/run_mcts.py,
 * generate_mcts_candidates) has no such switch; it always offers both kinds
 * of candidate, and that is POLAR_ACTIONS_BOTH, unchanged. Its candidates are
 * typed ("type": "skip" or "repeat"), and the paper names the spaces by those
 * two action classes (Table 1: Skip = layer skipping, Loop = recurrence; its
 * appendix's Skip and Repeat actions), so SKIP and LOOP keep the reference's
 * candidates of one type and drop the other's: SKIP offers only the skips
 * (one layer anywhere, blocks of 2-4 at the root), LOOP only the in-place
 * repeats (with the twice-only rule for one layer, blocks of 2-4 at the
 * root). Selection, UCB, length limits, the random child, the seed and the
 * number of simulations (the budget) are the same in every space. Skipping
 * in a subsequence of 0..D-1 gives another, and a repeat leaves every layer
 * in, so SKIP's programs never run a layer twice and LOOP's never leave one
 * out.
 * With BOTH the candidates, their order and the random stream are those of
 * the search before the switch existed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "polar.h"

typedef struct {
    int parent;                 /* -1 at the root */
    int first_child, last_child, next_sibling, n_children;
    int off, len;               /* the program: pool[off .. off+len) */
    int visits;
    double total, ucb;
    double score;               /* reward, NAN until evaluated */
    int fully_explored;
} node;

typedef struct {
    const polar_search_opts *o;   /* the search's own copy */
    node *nodes;
    int n_nodes, cap_nodes;
    int *pool;                  /* every node's program, concatenated */
    size_t n_pool, cap_pool;
    int *table;                 /* open-addressing set of node ids by program, -1 empty */
    size_t cap_table;
    int *candidate;             /* one candidate program [longest + 4] */
    int *expanding;             /* a copy of the program being expanded [longest] */
    uint64_t rng;
} tree;

/* xorshift64*: the search's own seeded generator */
static double next_uniform(tree *t) {
    t->rng ^= t->rng >> 12;
    t->rng ^= t->rng << 25;
    t->rng ^= t->rng >> 27;
    return (double)((t->rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

static int pick(tree *t, int n) {
    int i = (int)(next_uniform(t) * n);
    return i < n ? i : n - 1;
}

static uint64_t hash_program(const int *p, int n) {
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(unsigned)p[i]) * 0x100000001B3ull;
    return h;
}

static const int *program_of(const tree *t, int id) { return t->pool + t->nodes[id].off; }

/* Slot of p in the set: its node's, or the empty one where it would go. */
static size_t find_slot(const tree *t, const int *p, int n) {
    size_t mask = t->cap_table - 1, i = hash_program(p, n) & mask;
    for (;; i = (i + 1) & mask) {
        int id = t->table[i];
        if (id < 0) return i;
        if (t->nodes[id].len == n && !memcmp(program_of(t, id), p, (size_t)n * sizeof *p)) return i;
    }
}

static polar_status grow_table(tree *t, polar_error *err) {
    size_t old_cap = t->cap_table;
    int *old = t->table;
    t->cap_table = old_cap ? old_cap * 2 : 1024;
    t->table = malloc(t->cap_table * sizeof *t->table);
    if (!t->table) return polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
    memset(t->table, 0xff, t->cap_table * sizeof *t->table);
    for (size_t i = 0; i < old_cap; i++)
        if (old[i] >= 0) t->table[find_slot(t, program_of(t, old[i]), t->nodes[old[i]].len)] = old[i];
    free(old);
    return POLAR_OK;
}

/* A new node for program p under parent, registered as visited. */
static polar_status add_node(tree *t, int parent, const int *p, int n, int *id, polar_error *err) {
    if ((size_t)(t->n_nodes + 1) * 2 > t->cap_table && grow_table(t, err) != POLAR_OK) return POLAR_ERR_NOMEM;
    if (t->n_nodes == t->cap_nodes) {
        int cap = t->cap_nodes ? 2 * t->cap_nodes : 256;
        node *nn = realloc(t->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
        t->nodes = nn, t->cap_nodes = cap;
    }
    if (t->n_pool + (size_t)n > t->cap_pool) {
        size_t cap = t->cap_pool ? 2 * t->cap_pool : 4096;
        while (cap < t->n_pool + (size_t)n) cap *= 2;
        int *np = realloc(t->pool, cap * sizeof *np);
        if (!np) return polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
        t->pool = np, t->cap_pool = cap;
    }
    memcpy(t->pool + t->n_pool, p, (size_t)n * sizeof *p);
    *id = t->n_nodes++;
    t->nodes[*id] = (node){.parent = parent, .first_child = -1, .last_child = -1, .next_sibling = -1,
                           .off = (int)t->n_pool, .len = n, .ucb = -INFINITY, .score = NAN};
    t->n_pool += (size_t)n;
    t->table[find_slot(t, p, n)] = *id;
    if (parent >= 0) {
        node *par = &t->nodes[parent];
        if (par->last_child >= 0) t->nodes[par->last_child].next_sibling = *id;
        else par->first_child = *id;
        par->last_child = *id;
        par->n_children++;
    }
    return POLAR_OK;
}

/* Candidate c[n] of parent: a child unless outside the length limits or
 * already in the tree. */
static polar_status offer(tree *t, int parent, const int *c, int n, polar_error *err) {
    if (n < 1 || n < t->o->min_len || n > t->o->max_len) return POLAR_OK;
    if (t->table[find_slot(t, c, n)] >= 0) return POLAR_OK;
    int id;
    return add_node(t, parent, c, n, &id, err);
}

/* p with p[i .. i+k) removed (skip) or written twice (repeat) into
 * t->candidate; returns the new length. */
static int edit(tree *t, const int *p, int n, int i, int k, int repeat) {
    int *c = t->candidate, m = 0;
    for (int j = 0; j < i; j++) c[m++] = p[j];
    if (repeat)
        for (int j = i; j < i + k; j++) c[m++] = p[j];
    for (int j = repeat ? i : i + k; j < n; j++) c[m++] = p[j];
    return m;
}

/* No layer more than twice (the one-layer repeat's rule). */
static int at_most_twice(const int *c, int n, int D) {
    int counts[POLAR_SEARCH_MAX_DEPTH] = {0};
    for (int i = 0; i < n; i++)
        if (c[i] < D && ++counts[c[i]] > 2) return 0;
    return 1;
}

/* Children of node id, in the reference's order: for each position i, the
 * skips of 1 (and at the root 2, 3, 4) layers from i, then the repeats;
 * only the kind the action space allows. */
static polar_status expand(tree *t, int id, polar_error *err) {
    int n = t->nodes[id].len, root = id == 0, actions = t->o->actions;
    int *p = t->expanding; /* the pool may move while children are added */
    memcpy(p, program_of(t, id), (size_t)n * sizeof *p);
    for (int i = 0; i < n; i++) {
        for (int repeat = 0; repeat < 2; repeat++) {
            if ((repeat && actions == POLAR_ACTIONS_SKIP) || (!repeat && actions == POLAR_ACTIONS_LOOP)) continue;
            for (int k = 1; k <= (root ? 4 : 1) && i + k <= n; k++) {
                int m = edit(t, p, n, i, k, repeat);
                if (repeat && k == 1 && !at_most_twice(t->candidate, m, t->o->n_layers)) continue;
                if (offer(t, id, t->candidate, m, err) != POLAR_OK) return POLAR_ERR_NOMEM;
            }
        }
    }
    return POLAR_OK;
}

static int compare_programs(const int *a, int na, const int *b, int nb) {
    for (int i = 0; i < na && i < nb; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return na < nb ? -1 : na > nb;
}

/* A child chosen uniformly among the children sorted by program (the
 * reference sorts them before its random choice). */
static int random_child(tree *t, int id) {
    int k = pick(t, t->nodes[id].n_children);
    /* the k-th smallest program among the children, by selection */
    int chosen = -1;
    for (int c = t->nodes[id].first_child; c >= 0; c = t->nodes[c].next_sibling) {
        int rank = 0;
        for (int d = t->nodes[id].first_child; d >= 0; d = t->nodes[d].next_sibling)
            rank += compare_programs(program_of(t, d), t->nodes[d].len, program_of(t, c), t->nodes[c].len) < 0;
        if (rank == k) chosen = c;
    }
    return chosen;
}

/* Down from the root while some child is not fully explored: a random one
 * of those with probability explore, else the first with the highest UCB. */
static int select_node(tree *t) {
    int id = 0;
    while (t->nodes[id].n_children) {
        int open = 0, best = -1;
        for (int c = t->nodes[id].first_child; c >= 0; c = t->nodes[c].next_sibling)
            if (!t->nodes[c].fully_explored) {
                open++;
                if (best < 0 || t->nodes[c].ucb > t->nodes[best].ucb) best = c;
            }
        if (!open) break;
        if (next_uniform(t) < t->o->explore) {
            int k = pick(t, open);
            for (int c = t->nodes[id].first_child; c >= 0; c = t->nodes[c].next_sibling)
                if (!t->nodes[c].fully_explored && k-- == 0) best = c;
        }
        id = best;
    }
    return id;
}

static void backpropagate(tree *t, int id, double reward) {
    double D = t->o->n_layers;
    for (; id >= 0; id = t->nodes[id].parent) {
        node *n = &t->nodes[id];
        n->visits++;
        n->total += reward;
        n->ucb = n->total / n->visits - t->o->lambda * n->len / D + sqrt(2.0 * log(t->nodes[0].visits + 1.0) / n->visits);
        if (n->n_children) {
            int all = 1;
            for (int c = n->first_child; c >= 0 && all; c = t->nodes[c].next_sibling) all = t->nodes[c].fully_explored;
            if (all) n->fully_explored = 1;
        }
    }
}

/* Every evaluated node in breadth-first order (the reference's listing),
 * then stably by score descending, length ascending. */
static polar_status collect(tree *t, polar_search_result *out, polar_error *err) {
    int *order = malloc((size_t)t->n_nodes * sizeof *order), head = 0, tail = 0, n = 0;
    out->programs = calloc((size_t)t->n_nodes, sizeof *out->programs);
    if (!order || !out->programs) {
        free(order);
        return polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
    }
    order[tail++] = 0;
    while (head < tail) {
        int id = order[head++];
        for (int c = t->nodes[id].first_child; c >= 0; c = t->nodes[c].next_sibling) order[tail++] = c;
    }
    for (int i = 0; i < tail; i++) {
        node *nd = &t->nodes[order[i]];
        if (isnan(nd->score)) continue;
        /* insertion keeps equal keys in breadth-first order */
        int j = n;
        while (j > 0 && (out->programs[j - 1].score < nd->score ||
                         (out->programs[j - 1].score == nd->score && out->programs[j - 1].program.n > nd->len))) {
            out->programs[j] = out->programs[j - 1];
            j--;
        }
        int *layers = malloc((size_t)nd->len * sizeof *layers);
        if (!layers) {
            free(order);
            return polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
        }
        memcpy(layers, t->pool + nd->off, (size_t)nd->len * sizeof *layers);
        out->programs[j] = (polar_scored_program){{nd->len, layers}, nd->score};
        out->n = ++n;
    }
    free(order);
    return POLAR_OK;
}

static const char *const action_names[] = {"both", "skip", "loop"};

const char *polar_search_actions_name(int actions) {
    return actions >= 0 && actions < 3 ? action_names[actions] : NULL;
}

int polar_search_actions_parse(const char *name) {
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, action_names[i])) return i;
    return -1;
}

void polar_search_limits(int n_layers, int *min_len, int *max_len) {
    /* the reference's presets (Llama-3.2-3B and Qwen2.5-1.5B, Qwen2.5-3B and
     * Qwen3-8B, Qwen1.5-MoE, Qwen3-30B-A3B), else about their ratios */
    static const int presets[][3] = {{28, 16, 32}, {36, 24, 44}, {24, 16, 28}, {48, 36, 54}};
    for (int i = 0; i < 4; i++)
        if (presets[i][0] == n_layers) {
            *min_len = presets[i][1], *max_len = presets[i][2];
            return;
        }
    *min_len = (2 * n_layers + 1) / 3;
    *max_len = n_layers + (n_layers + 3) / 6;
}

polar_search_opts polar_search_defaults(int n_layers) {
    polar_search_opts o = {.n_layers = n_layers, .simulations = 100, .lambda = 5.0, .explore = 0.1, .seed = 42};
    polar_search_limits(n_layers, &o.min_len, &o.max_len);
    return o;
}

void polar_search_result_free(polar_search_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) polar_program_free(&r->programs[i].program);
    free(r->programs);
    memset(r, 0, sizeof *r);
}

static void tree_free(tree *t) {
    free(t->nodes);
    free(t->pool);
    free(t->table);
    free(t->candidate);
    free(t->expanding);
}

struct polar_search {
    polar_search_opts o;
    tree t;
    int pending;      /* the node whose reward is awaited, -1: none */
    int sims, evaluations;
    double initial_score;
};

polar_status polar_search_begin(const polar_search_opts *o, polar_search **out, polar_error *err) {
    if (out) *out = NULL;
    if (!o || !out) return polar_fail(err, POLAR_ERR_ARG, "search: missing argument");
    int D = o->n_layers;
    if (D < 1 || D > POLAR_SEARCH_MAX_DEPTH)
        return polar_fail(err, POLAR_ERR_ARG, "search: %d layers (1 to %d)", D, POLAR_SEARCH_MAX_DEPTH);
    if (o->min_len < 1 || o->max_len < o->min_len || o->max_len > 4 * D)
        return polar_fail(err, POLAR_ERR_ARG, "search: length limits %d..%d (1 <= min <= max <= %d)", o->min_len,
                          o->max_len, 4 * D);
    if (o->simulations < 0 || !(o->lambda >= 0) || !(o->explore >= 0 && o->explore <= 1))
        return polar_fail(err, POLAR_ERR_ARG, "search: simulations %d, lambda %g, explore %g out of range",
                          o->simulations, o->lambda, o->explore);
    if (!polar_search_actions_name(o->actions))
        return polar_fail(err, POLAR_ERR_ARG, "search: action space %d (both 0, skip 1, loop 2)", o->actions);
    polar_search *s = calloc(1, sizeof *s);
    if (!s) return polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
    s->o = *o;
    s->t = (tree){.o = &s->o, .rng = o->seed * 0x9E3779B97F4A7C15ull + 1};
    tree *t = &s->t;
    int longest = D > o->max_len ? D : o->max_len; /* the root may exceed max_len */
    t->candidate = malloc((size_t)(longest + 4) * sizeof *t->candidate);
    t->expanding = malloc((size_t)longest * sizeof *t->expanding);
    polar_status st = t->candidate && t->expanding ? grow_table(t, err)
                                                   : polar_fail(err, POLAR_ERR_NOMEM, "search: out of memory");
    int root;
    if (st == POLAR_OK) {
        for (int i = 0; i < D; i++) t->candidate[i] = i;
        st = add_node(t, -1, t->candidate, D, &root, err);
    }
    if (st != POLAR_OK) {
        polar_search_free(s);
        return st;
    }
    s->pending = -1;
    *out = s;
    return POLAR_OK;
}

polar_status polar_search_next(polar_search *s, polar_program *next, polar_error *err) {
    if (!s || !next) return polar_fail(err, POLAR_ERR_ARG, "search next: missing argument");
    if (s->pending >= 0) return polar_fail(err, POLAR_ERR_ARG, "search next: the last program has no reward yet");
    tree *t = &s->t;
    *next = (polar_program){0};
    int id = 0; /* the root first */
    while (!isnan(t->nodes[0].score) && s->sims < s->o.simulations) {
        id = select_node(t);
        if (!t->nodes[id].fully_explored) {
            if (expand(t, id, err) != POLAR_OK) return POLAR_ERR_NOMEM;
            if (t->nodes[id].n_children) id = random_child(t, id);
            else t->nodes[id].fully_explored = 1;
        }
        if (isnan(t->nodes[id].score)) break;
        /* The reference backs up the last evaluated score when this node was
         * evaluated before (a stale variable); we back up the node's own. */
        backpropagate(t, id, t->nodes[id].score);
        s->sims++;
    }
    if (isnan(t->nodes[0].score) || s->sims < s->o.simulations) {
        s->pending = id;
        *next = (polar_program){t->nodes[id].len, (int *)program_of(t, id)};
    }
    return POLAR_OK;
}

polar_status polar_search_reward(polar_search *s, double reward, polar_error *err) {
    if (!s || s->pending < 0) return polar_fail(err, POLAR_ERR_ARG, "search reward: no program was handed out");
    if (!isfinite(reward)) return polar_fail(err, POLAR_ERR_ARG, "search reward: %g is not a number of [0, 1]", reward);
    tree *t = &s->t;
    int id = s->pending;
    s->pending = -1;
    t->nodes[id].score = reward;
    s->evaluations++;
    if (id == 0 && s->evaluations == 1) s->initial_score = reward; /* the root is not a simulation */
    else {
        backpropagate(t, id, reward);
        s->sims++;
    }
    return POLAR_OK;
}

polar_status polar_search_result_get(polar_search *s, polar_search_result *out, polar_error *err) {
    if (!s || !out) return polar_fail(err, POLAR_ERR_ARG, "search result: missing argument");
    memset(out, 0, sizeof *out);
    polar_status st = collect(&s->t, out, err);
    out->initial_score = s->initial_score;
    out->simulations = s->sims;
    out->evaluations = s->evaluations;
    out->nodes = s->t.n_nodes;
    if (st != POLAR_OK) polar_search_result_free(out);
    return st;
}

void polar_search_free(polar_search *s) {
    if (!s) return;
    tree_free(&s->t);
    free(s);
}

polar_status polar_search_programs(const polar_search_opts *o, polar_reward_fn reward, void *ctx,
                                   polar_search_result *out, polar_error *err) {
    if (!reward || !out) return polar_fail(err, POLAR_ERR_ARG, "search: missing argument");
    memset(out, 0, sizeof *out);
    polar_search *s = NULL;
    polar_status st = polar_search_begin(o, &s, err);
    for (polar_program p; st == POLAR_OK && (st = polar_search_next(s, &p, err)) == POLAR_OK && p.n;) {
        double r = 0;
        if ((st = reward(ctx, &p, &r, err)) == POLAR_OK) st = polar_search_reward(s, r, err);
    }
    if (st == POLAR_OK) st = polar_search_result_get(s, out, err);
    polar_search_free(s);
    return st;
}
