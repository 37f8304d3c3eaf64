/* Program <-> PoLar segment form (boundary mask + one op per segment).
 *
 * The parse is a DP over (cursor: next layer to place, pos: next path entry)
 * trying, at each cursor, segments of 1..kmax layers as skip, keep, or repeat
 * (the segment twice). Among complete parses it prefers fewer segments, then
 * fewer skips, then more repeats, then larger segments earlier; on a full
 * tie the first found (smaller segment, skip < keep < repeat) stays, as in
 * the reference parser. */
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"

enum { OP_SKIP = 0, OP_KEEP = 1, OP_REPEAT = 2 };

typedef struct {
    signed char done, ok;
    unsigned char size, op;
    int segs, skips, reps;
} dp_state;

typedef struct {
    const int *path;
    int n, D, kmax;
    dp_state *memo; /* [(D + 1) * (n + 1)] */
} parser;

static dp_state *at(parser *p, int cursor, int pos) { return &p->memo[(size_t)cursor * (p->n + 1) + pos]; }

/* Next state after taking (size, op) at (cursor, pos). */
static int next_pos(int pos, int size, int op) { return pos + (op == OP_SKIP ? 0 : op == OP_KEEP ? size : 2 * size); }

/* Sizes of the parses from two states, lexicographically: > 0 when a's are larger. */
static int compare_sizes(parser *p, int cursor, int pos_a, int pos_b) {
    int ca = cursor, cb = cursor;
    while (ca < p->D && cb < p->D) {
        dp_state *a = at(p, ca, pos_a), *b = at(p, cb, pos_b);
        if (a->size != b->size) return a->size > b->size ? 1 : -1;
        pos_a = next_pos(pos_a, a->size, a->op);
        pos_b = next_pos(pos_b, b->size, b->op);
        ca += a->size;
        cb += b->size;
    }
    return 0;
}

static int matches(const parser *p, int pos, int cursor, int size, int times) {
    if (pos + times * size > p->n) return 0;
    for (int r = 0; r < times; r++)
        for (int i = 0; i < size; i++)
            if (p->path[pos + r * size + i] != cursor + i) return 0;
    return 1;
}

static int solve(parser *p, int cursor, int pos) {
    dp_state *s = at(p, cursor, pos);
    if (s->done) return s->ok;
    s->done = 1;
    if (cursor == p->D) return s->ok = pos == p->n;
    for (int size = 1; size <= p->kmax && cursor + size <= p->D; size++)
        for (int op = OP_SKIP; op <= OP_REPEAT; op++) {
            if (op != OP_SKIP && !matches(p, pos, cursor, size, op == OP_KEEP ? 1 : 2)) continue;
            int np = next_pos(pos, size, op);
            if (!solve(p, cursor + size, np)) continue;
            dp_state *t = at(p, cursor + size, np);
            int segs = 1 + t->segs, skips = (op == OP_SKIP) + t->skips, reps = (op == OP_REPEAT) + t->reps;
            int better = !s->ok || segs < s->segs ||
                         (segs == s->segs && (skips < s->skips || (skips == s->skips && reps > s->reps)));
            if (s->ok && segs == s->segs && skips == s->skips && reps == s->reps) {
                /* larger sizes earlier: compare this size, then the tails */
                better = size > s->size ||
                         (size == s->size && compare_sizes(p, cursor + size, np, next_pos(pos, s->size, s->op)) > 0);
            }
            if (better) {
                s->ok = 1;
                s->size = (unsigned char)size;
                s->op = (unsigned char)op;
                s->segs = segs;
                s->skips = skips;
                s->reps = reps;
            }
        }
    return s->ok;
}

/* Why a path has no segment form, for the error message. */
static polar_status reject(const polar_program *pr, int D, int kmax, polar_error *err) {
    int *count = calloc((size_t)D, sizeof *count);
    if (!count) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < pr->n; i++)
        if (++count[pr->layers[i]] > 2) {
            int l = pr->layers[i];
            free(count);
            return polar_fail(err, POLAR_ERR_PROGRAM,
                              "program: layer %d runs three times; the segment form repeats a segment at most once", l);
        }
    for (int i = 0; i < pr->n; i++)
        for (int j = i + 1; j < pr->n; j++)
            if (pr->layers[j] < pr->layers[i] && count[pr->layers[j]] == 1) {
                int a = pr->layers[i], b = pr->layers[j];
                free(count);
                return polar_fail(err, POLAR_ERR_PROGRAM,
                                  "program: layer %d runs after layer %d; the segment form runs layers in order", b, a);
            }
    free(count);
    return polar_fail(err, POLAR_ERR_PROGRAM,
                      "program: a repeated block is not one segment of at most %d consecutive layers run twice in a row "
                      "(a non-contiguous repeat, or an edit inside a repeated block)", kmax);
}

polar_status polar_program_to_segments(const polar_program *pr, int D, int kmax, unsigned char *seg_start, int *ops,
                                       polar_error *err) {
    if (!pr || !seg_start || !ops || D < 1 || kmax < 1 || kmax > 255)
        return polar_fail(err, POLAR_ERR_ARG, "program to segments: bad arguments");
    for (int i = 0; i < pr->n; i++)
        if (pr->layers[i] < 0 || pr->layers[i] >= D)
            return polar_fail(err, POLAR_ERR_PROGRAM, "program: entry %d is layer %d, outside 0..%d", i, pr->layers[i],
                              D - 1);
    if (pr->n > 2 * D) return reject(pr, D, kmax, err);
    parser p = {pr->layers, pr->n, D, kmax, calloc((size_t)(D + 1) * (size_t)(pr->n + 1), sizeof(dp_state))};
    if (!p.memo) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    if (!solve(&p, 0, 0)) {
        free(p.memo);
        return reject(pr, D, kmax, err);
    }
    memset(seg_start, 0, (size_t)D);
    for (int i = 0; i < D; i++) ops[i] = -1;
    for (int cursor = 0, pos = 0; cursor < D;) {
        dp_state *s = at(&p, cursor, pos);
        seg_start[cursor] = 1;
        ops[cursor] = s->op;
        pos = next_pos(pos, s->size, s->op);
        cursor += s->size;
    }
    free(p.memo);
    return POLAR_OK;
}

polar_status polar_segments_to_program(const unsigned char *seg_start, const int *ops, int D, polar_program *out,
                                       polar_error *err) {
    out->n = 0;
    out->layers = NULL;
    if (!seg_start || !ops || D < 1) return polar_fail(err, POLAR_ERR_ARG, "segments to program: bad arguments");
    if (!seg_start[0]) return polar_fail(err, POLAR_ERR_PROGRAM, "segments: layer 0 must start a segment");
    int *layers = malloc((size_t)2 * D * sizeof *layers), n = 0;
    if (!layers) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    for (int st = 0; st < D;) {
        int ed = st + 1;
        while (ed < D && !seg_start[ed]) ed++;
        if (ops[st] < OP_SKIP || ops[st] > OP_REPEAT) {
            free(layers);
            return polar_fail(err, POLAR_ERR_PROGRAM, "segments: op %d at layer %d (0 skip, 1 keep, 2 repeat)", ops[st], st);
        }
        for (int r = 0; r < ops[st]; r++)
            for (int l = st; l < ed; l++) layers[n++] = l;
        st = ed;
    }
    if (n == 0) {
        free(layers);
        return polar_fail(err, POLAR_ERR_PROGRAM, "segments: every segment is skipped, the program is empty");
    }
    out->n = n;
    out->layers = layers;
    return POLAR_OK;
}
