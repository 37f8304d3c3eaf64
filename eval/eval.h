/* Internal pieces of the evaluation harness shared by its files: a growing
 * string, and the results file read back. */
#ifndef POLAR_EVAL_H
#define POLAR_EVAL_H

#include <stddef.h>

#include "polar.h"

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

/* Append printf-style / a JSON string literal (NULL -> null) / the bytes
 * s[0..len) as one (NULs and bytes that are not UTF-8 escaped); 0 when out
 * of memory. */
int sbuf_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int sbuf_json_string(sbuf *b, const char *s);
int sbuf_json_bytes(sbuf *b, const char *s, size_t len);
/* A report's two texts to the caller (json / table: NULL when not asked)
 * when st is POLAR_OK, else freed; returns st. */
polar_status sbuf_hand_out(polar_status st, sbuf *j, sbuf *t, char **json, char **table);

typedef struct json_doc json_doc;

/* One run of a results line, pointing into its parsed document. */
typedef struct {
    const char *program;
    int executed_layers;
    const char *answer, *fallback_answer; /* NULL: none extracted */
    int correct, fallback_correct;
} eval_run_view;

typedef struct {
    long index;
    eval_run_view *runs, *samples;
    int n_runs, n_samples;
    json_doc *doc;
} eval_question;

typedef struct {
    eval_question *q;
    int n;
} eval_records;

/* Index of the run whose answer wins the vote among runs[0..k), -1 when none
 * of them extracted an answer. Equal answers (polar_answer_equal) pool
 * their votes; a tie goes to the group whose first member ranks higher. */
int eval_consensus(const eval_run_view *runs, int k);

/* Every complete line of a results file (torn lines skipped). */
polar_status eval_read_records(const char *path, eval_records *rs, polar_error *err);
void eval_records_free(eval_records *rs);

/* Metrics over the records, for k = 1..k_max (k_max <= EVAL_MAX_K). */
#define EVAL_MAX_K 64
typedef struct {
    int questions, k_max, samples_max;
    double pass_at[EVAL_MAX_K + 1], consensus_at[EVAL_MAX_K + 1];           /* over the programs */
    double fallback_pass_at[EVAL_MAX_K + 1];                                /* last-number fallback */
    double sample_pass_at[EVAL_MAX_K + 1], sample_consensus_at[EVAL_MAX_K + 1]; /* base sampling */
    double rank_accuracy[EVAL_MAX_K + 1];                                   /* program at rank r alone */
    double mean_layers_top1, mean_layers_all;
    int depth_count[4 * 256 + 1]; /* runs per executed-layer count */
    int unique_depths, max_depth;
    /* questions whose top program / whole ranked list no earlier question
     * had: 1 each when a predictor ranks every question alike */
    int distinct_top, distinct_lists;
} eval_metrics;

void eval_compute(const eval_records *rs, eval_metrics *m);

/* One yes/no outcome over the questions two runs share (eval/paired.c). */
typedef struct {
    int a_only, b_only, both, neither;
} eval_paired;

void eval_paired_add(eval_paired *c, int a, int b);
/* The exact two-sided McNemar (sign test) p of the discordant counts. */
double eval_mcnemar_p(int a_only, int b_only);
/* "a":rate,"b":rate,"a_only":..,"b_only":..,"both":..,"neither":..,"p":.. (no braces) */
int eval_paired_json(sbuf *b, const eval_paired *c, int n);
/* A table's header naming the metric, and one row of it. */
int eval_paired_header(sbuf *b, const char *metric);
int eval_paired_row(sbuf *b, const char *label, const eval_paired *c, int n);

/* SVG pieces (eval/plot.c): a 900x380 page with two 380x280 panels whose
 * left edges are at x 60 and 510. */
int svg_begin(sbuf *b);
int svg_axes(sbuf *b, int x0, const char *title, const char *xlabel, const char *ylabel);
/* Bars of count[lo..hi] (the non-zero range of count[0..max_value]) in the panel at x0. */
int svg_histogram(sbuf *b, int x0, const int *count, int max_value);
/* b (ending "</svg>\n") into the file. */
polar_status svg_write(const sbuf *b, const char *svg_path, polar_error *err);

#endif
