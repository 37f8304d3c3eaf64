/* The findings of a polar search run, from its labels file alone: how many
 * questions have a valid program, how many base-wrong questions a program
 * fixes, how short the shortest valid programs are against D (and the
 * paper's Finding 2: of the base-correct and of the fixed questions, those
 * with a valid program shorter than D, and the fixed questions counted by
 * the length of their shortest valid program), and what
 * valid programs are made of in PoLar's segment form (single-layer
 * segments, skips, repeats; the paper's single-layer ratio: of the skip and
 * repeat segments, those of one layer; programs by the edits they make),
 * with the depth distribution as SVG, and the
 * action space the file was searched in ("actions" of each line; lines
 * written before `polar search --actions` have none, and their searches all
 * took both kinds of edit). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "labels.h"
#include "../runtime/error.h"
#include "../eval/eval.h"

enum { MAX_LEN = 1024 };

typedef struct {
    int questions, with_valid, base_correct, fixed, n_valid_programs, codec_rejected;
    int shorter_correct, shorter_fixed; /* base-correct / fixed questions with a valid program under D layers */
    long shortest_sum, segments, single, skips, repeats, keeps;
    long edits, single_edits;        /* skip and repeat segments, and those of one layer (the paper's ratio) */
    int skip_only, repeat_only, both_kinds, no_edit; /* valid programs by the edits they make */
    long evaluated;                  /* programs the searches evaluated ("programs_evaluated" of each line) */
    int shortest_count[MAX_LEN + 1], valid_count[MAX_LEN + 1], max_len;
    int fixed_shortest_count[MAX_LEN + 1]; /* base-wrong questions fixed, by their shortest valid program */
    int actions;          /* POLAR_ACTIONS_* of the lines, -1 before the first, -2 when they differ */
    int without_actions;  /* lines with no "actions" (read as both) */
} labels_stats;

/* The depth: the longest path 0..n-1 (the search's root) in the line. */
static int base_depth(const json_value *root) {
    const json_value *best = json_get(root, "best_transitions");
    int layers[MAX_LEN], D = 0;
    for (size_t i = 0; best && best->type == JSON_ARRAY && i < best->len; i++) {
        int n = pred_label_path(best->items[i], MAX_LEN, MAX_LEN, layers), base = n > 0;
        for (int k = 0; base && k < n; k++) base = layers[k] == k;
        if (base && n > D) D = n;
    }
    return D;
}

static void add_valid(labels_stats *s, const int *layers, int n, int D) {
    polar_program p = {n, (int *)layers};
    unsigned char seg[MAX_LEN];
    int ops[MAX_LEN];
    polar_error err;
    s->n_valid_programs++;
    s->valid_count[n]++;
    s->max_len = n > s->max_len ? n : s->max_len;
    if (D > MAX_LEN || polar_program_to_segments(&p, D, 4, seg, ops, &err) != POLAR_OK) {
        s->codec_rejected++;
        return;
    }
    int skips = 0, repeats = 0;
    for (int i = 0; i < D; i++) {
        if (!seg[i]) continue;
        int len = 1;
        while (i + len < D && !seg[i + len]) len++;
        s->segments++, s->single += len == 1;
        s->skips += ops[i] == 0, s->keeps += ops[i] == 1, s->repeats += ops[i] == 2;
        skips += ops[i] == 0, repeats += ops[i] == 2;
        if (ops[i] != 1) s->edits++, s->single_edits += len == 1;
    }
    s->skip_only += skips && !repeats, s->repeat_only += repeats && !skips;
    s->both_kinds += skips && repeats, s->no_edit += !skips && !repeats;
}

typedef struct {
    int *n_layers;
    labels_stats *s;
} summary_ctx;

static polar_status add_line(const pred_label_line *line, void *ctx, polar_error *err) {
    summary_ctx *c = ctx;
    labels_stats *s = c->s;
    const json_value *init = json_get(line->root, "initial_score");
    if (!init || init->type != JSON_NUMBER)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: no initial_score: not a polar search line", line->where);
    const json_value *act = json_get(line->root, "actions");
    int actions = POLAR_ACTIONS_BOTH;
    if (!act) s->without_actions++;
    else if (act->type != JSON_STRING || (actions = polar_search_actions_parse(act->str)) < 0)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: actions is not \"both\", \"skip\" or \"loop\"", line->where);
    s->actions = s->actions == -1 || s->actions == actions ? actions : -2;
    const json_value *ev = json_get(line->root, "programs_evaluated");
    if (ev && ev->type == JSON_NUMBER && ev->number > 0) s->evaluated += (long)ev->number;
    if (!*c->n_layers) *c->n_layers = base_depth(line->root);
    int D = *c->n_layers, shortest = 0, layers[MAX_LEN];
    s->questions++;
    s->base_correct += init->number == 1.0;
    for (size_t i = 0; i < line->valid->len; i++) {
        int n = pred_label_path(line->valid->items[i], MAX_LEN, MAX_LEN, layers);
        if (n <= 0) continue;
        add_valid(s, layers, n, D);
        shortest = !shortest || n < shortest ? n : shortest;
    }
    if (shortest) {
        s->with_valid++, s->fixed += init->number != 1.0;
        s->shortest_sum += shortest, s->shortest_count[shortest]++;
        s->fixed_shortest_count[shortest] += init->number != 1.0;
        if (shortest < D) s->shorter_correct += init->number == 1.0, s->shorter_fixed += init->number != 1.0;
    }
    return POLAR_OK;
}

static polar_status read_labels(const char *path, int *n_layers, labels_stats *s, polar_error *err) {
    summary_ctx c = {n_layers, s};
    polar_status st = pred_labels_each(path, add_line, &c, err);
    if (st == POLAR_OK && !s->questions) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: no search lines", path);
    return st;
}

static double share(long a, long b) { return b ? (double)a / b : 0; }

/* count[] as a JSON object {"len":n,...} of its non-zero entries. */
static int add_counts_json(sbuf *b, const int *count, int max_len) {
    int ok = sbuf_add(b, "{"), first = 1;
    for (int n = 0; ok && n <= max_len; n++)
        if (count[n]) ok = sbuf_add(b, "%s\"%d\":%d", first ? "" : ",", n, count[n]), first = 0;
    return ok && sbuf_add(b, "}");
}

/* count[] as "24, 25 x2, 27" (each length, "xN" when N > 1), "none" when empty. */
static int add_counts_text(sbuf *b, const int *count, int max_len) {
    int ok = 1, first = 1;
    for (int n = 0; ok && n <= max_len; n++) {
        if (!count[n]) continue;
        ok = count[n] > 1 ? sbuf_add(b, "%s%d x%d", first ? "" : ", ", n, count[n])
                          : sbuf_add(b, "%s%d", first ? "" : ", ", n);
        first = 0;
    }
    return ok && (!first || sbuf_add(b, "none"));
}

polar_status polar_labels_summary(const char *labels_path, int n_layers, char **json, char **table,
                                  const char *svg_path, polar_error *err) {
    labels_stats *s = calloc(1, sizeof *s);
    if (!s) return polar_fail(err, POLAR_ERR_NOMEM, "labels: out of memory");
    s->actions = -1;
    int D = n_layers;
    polar_status st = read_labels(labels_path, &D, s, err);
    sbuf j = {0}, t = {0}, g = {0};
    int base_wrong = s->questions - s->base_correct, ok = 1;
    double mean_short = share(s->shortest_sum, s->with_valid);
    const char *actions = s->actions == -2 ? "mixed" : polar_search_actions_name(s->actions);
    char note[160] = "";
    if (s->without_actions == s->questions)
        snprintf(note, sizeof note, " (not recorded: written before --actions, when every search took both)");
    else if (s->without_actions)
        snprintf(note, sizeof note, " (%d line%s without \"actions\", read as both)", s->without_actions,
                 s->without_actions == 1 ? "" : "s");
    if (st == POLAR_OK && json)
        ok = sbuf_add(&j,
                      "{\"questions\":%d,\"n_layers\":%d,\"with_valid_program\":%.6f,\"base_correct\":%.6f,"
                      "\"base_wrong_fixed\":%.6f,\"mean_shortest_valid_length\":%.3f,"
                      "\"mean_shortest_valid_length_over_D\":%.6f,\"shorter_base_correct\":%.6f,"
                      "\"shorter_fixed\":%.6f,\"valid_programs\":%d,\"codec_rejected\":%d,"
                      "\"segments\":%ld,\"single_layer_segments\":%.6f,\"skip_segments\":%.6f,"
                      "\"repeat_segments\":%.6f,\"keep_segments\":%.6f,\"edits\":%ld,\"single_layer_edits\":%.6f,"
                      "\"valid_skip_only\":%d,\"valid_repeat_only\":%d,\"valid_skip_and_repeat\":%d,"
                      "\"valid_no_edit\":%d,\"programs_evaluated\":%ld,\"actions\":\"%s\",\"lines_without_actions\":%d,"
                      "\"fixed_shortest_lengths\":",
                      s->questions, D, share(s->with_valid, s->questions), share(s->base_correct, s->questions),
                      share(s->fixed, base_wrong), mean_short, D ? mean_short / D : 0,
                      share(s->shorter_correct, s->base_correct), share(s->shorter_fixed, s->fixed), s->n_valid_programs,
                      s->codec_rejected, s->segments, share(s->single, s->segments), share(s->skips, s->segments),
                      share(s->repeats, s->segments), share(s->keeps, s->segments), s->edits,
                      share(s->single_edits, s->edits), s->skip_only, s->repeat_only, s->both_kinds, s->no_edit,
                      s->evaluated, actions ? actions : "", s->without_actions) &&
             add_counts_json(&j, s->fixed_shortest_count, s->max_len) && sbuf_add(&j, "}");
    if (st == POLAR_OK && table && ok)
        ok = sbuf_add(&t,
                      "%d questions, D = %d, actions %s%s\n"
                      "with a valid program:            %5.1f%%\n"
                      "base program correct:            %5.1f%%\n"
                      "base-wrong questions fixed:      %5.1f%% (%d of %d)\n"
                      "shortest valid program:          %.2f layers on average (%.1f%% of D)\n"
                      "a valid program shorter than D:  %.1f%% of base-correct (%d of %d), %.1f%% of fixed (%d of %d)\n"
                      "programs evaluated:              %ld\n"
                      "valid programs:                  %d (%d not expressible as segments)\n"
                      "their segments: %ld, single-layer %.1f%%, skip %.1f%%, repeat %.1f%%, keep %.1f%%\n"
                      "their edits (skip and repeat segments): %ld, single-layer %.1f%% (the paper's ratio)\n"
                      "valid programs by edit: skip only %d, repeat only %d, both %d, none (the base) %d\n"
                      "fixed questions by their shortest valid program, layers: ",
                      s->questions, D, actions ? actions : "", note, 100 * share(s->with_valid, s->questions),
                      100 * share(s->base_correct, s->questions), 100 * share(s->fixed, base_wrong), s->fixed,
                      base_wrong, mean_short, D ? 100 * mean_short / D : 0, 100 * share(s->shorter_correct, s->base_correct),
                      s->shorter_correct, s->base_correct, 100 * share(s->shorter_fixed, s->fixed), s->shorter_fixed,
                      s->fixed, s->evaluated, s->n_valid_programs, s->codec_rejected,
                      s->segments, 100 * share(s->single, s->segments), 100 * share(s->skips, s->segments),
                      100 * share(s->repeats, s->segments), 100 * share(s->keeps, s->segments), s->edits,
                      100 * share(s->single_edits, s->edits), s->skip_only, s->repeat_only, s->both_kinds, s->no_edit) &&
             add_counts_text(&t, s->fixed_shortest_count, s->max_len) && sbuf_add(&t, "\n");
    if (st == POLAR_OK && svg_path && ok) {
        ok = svg_begin(&g) && svg_axes(&g, 60, "Shortest valid program per question", "layers run", "questions") &&
             svg_axes(&g, 510, "Every valid program", "layers run", "programs") &&
             svg_histogram(&g, 60, s->shortest_count, s->max_len) &&
             svg_histogram(&g, 510, s->valid_count, s->max_len) && sbuf_add(&g, "</svg>\n");
        if (ok) st = svg_write(&g, svg_path, err);
    }
    if (st == POLAR_OK && !ok) st = polar_fail(err, POLAR_ERR_NOMEM, "labels: out of memory");
    free(s), free(g.s);
    return sbuf_hand_out(st, &j, &t, json, table);
}
