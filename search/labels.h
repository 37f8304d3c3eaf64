/* Reading `polar search` labels files (JSONL, the reference's field names):
 * one reader for the trainer's examples (labels.c) and the search's
 * findings (findings.c). */
#ifndef POLAR_SEARCH_LABELS_H
#define POLAR_SEARCH_LABELS_H

#include "../loader/json.h"
#include "polar.h"

/* One complete line, parsed: valid is its final_valid_transitions (an array). */
typedef struct {
    const char *where; /* "file:line", for messages */
    const json_value *root;
    const json_value *valid;
} pred_label_line;

typedef polar_status (*pred_label_fn)(const pred_label_line *line, void *ctx, polar_error *err);

/* fn for every line of path. A torn line (no closing brace: the search was
 * stopped mid-write and appends it again when it resumes) and blank lines
 * are skipped; a line without final_valid_transitions is an error ("not a
 * polar search line"), as is bad JSON; fn's error stops the reading. */
polar_status pred_labels_each(const char *path, pred_label_fn fn, void *ctx, polar_error *err);

/* A program as the labels write it: a JSON array of layer indices, or
 * {"path": [...]}, at most max_len long, into layers. Returns its length, 0
 * when v is not such a path (empty, too long, a non-integer), -1 when a layer
 * is outside 0..n_layers-1. */
int pred_label_path(const json_value *v, int n_layers, int max_len, int *layers);

#endif
