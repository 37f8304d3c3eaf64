/* polar eval's results lines and summary, and polar search's labels summary,
 * on hand-made records whose metrics are known. */
#include <unistd.h>

#include "harness.h"

static char tmp_dir[] = "/tmp/polar-test-eval-XXXXXX";

/* A run of a question: program text, answer (NULL: none), correct. */
static polar_eval_run run(const char *program, int layers, const char *answer, int correct) {
    polar_eval_run r = {.program = program, .executed_layers = layers, .sample = -1, .text = "...", .answer = answer,
                        .correct = correct, .tokens = 3, .ms = 1.5};
    return r;
}

static void write_line(FILE *f, long index, const polar_eval_run *runs, int n, const polar_eval_run *samples, int ns) {
    polar_error err;
    polar_eval_record r = {.index = index, .line = index + 1, .question = "q", .gold = "5", .prompt = "p",
                           .prompt_tokens = 4, .runs = runs, .n_runs = n, .samples = samples, .n_samples = ns};
    char *line = NULL;
    CHECK_OK(polar_eval_record_json(&r, &line, &err));
    if (line) fprintf(f, "%s\n", line);
    polar_free(line);
}

/* The numbers after "key":[ in json. */
static int curve(const char *json, const char *key, double *v, int max) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *p = strstr(json, pat);
    int n = 0;
    if (!p) return -1;
    for (p += strlen(pat); *p && *p != ']' && n < max; n++) {
        v[n] = strtod(p, (char **)&p);
        if (*p == ',') p++;
    }
    return n;
}

static void summary_metrics(void) {
    polar_error err;
    char path[256];
    snprintf(path, sizeof path, "%s/results.jsonl", tmp_dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    /* q0: rank 1 right, ranks 2 and 3 agree on a wrong answer; q1: rank 2
     * right, ranks 1 and 3 agree on a wrong one; q2: no answers; q3: ranks 2
     * and 3 right as 10/2 and 5.0, which pool their votes against rank 1. */
    polar_eval_run q0[3] = {run("base", 30, "5", 1), run("0-28", 29, "6", 0), run("0-27", 28, "6", 0)};
    polar_eval_run q1[3] = {run("base", 30, "7", 0), run("0-28", 29, "5", 1), run("0-27", 28, "7", 0)};
    polar_eval_run q2[3] = {run("base", 30, NULL, 0), run("0-28", 29, NULL, 0), run("0-27", 28, NULL, 0)};
    polar_eval_run q3[3] = {run("base", 30, "4", 0), run("0-28", 29, "10/2", 1), run("0-27", 28, "5.0", 1)};
    polar_eval_run s0[2] = {run("base", 30, "5", 1), run("base", 30, "5", 1)};
    polar_eval_run s1[2] = {run("base", 30, "1", 0), run("base", 30, "5", 1)};
    s0[0].sample = 0, s0[1].sample = 1, s1[0].sample = 0, s1[1].sample = 1;
    write_line(f, 0, q0, 3, s0, 2);
    write_line(f, 1, q1, 3, s1, 2);
    write_line(f, 2, q2, 3, s1, 2);
    write_line(f, 3, q3, 3, s0, 2);
    fputs("{\"index\":4,\"line\":5,\"question\":\"torn", f); /* a run killed mid-line */
    fclose(f);
    char *json = NULL, *table = NULL;
    CHECK_OK(polar_eval_summary(path, &json, &table, &err));
    if (!json || !table) return;
    double v[8];
    CHECK(strstr(json, "\"questions\":4,"), "torn line skipped: %s", json);
    CHECK(curve(json, "accuracy_by_rank", v, 8) == 3 && v[0] == 0.25 && v[1] == 0.5 && v[2] == 0.25,
          "accuracy by rank %g %g %g", v[0], v[1], v[2]);
    CHECK(curve(json, "pass_at_k", v, 8) == 3 && v[0] == 0.25 && v[1] == 0.75 && v[2] == 0.75, "pass@k %g %g %g",
          v[0], v[1], v[2]);
    /* k 1 and 2: q0 alone (ties go to rank 1); k 3: q3 alone (q0's two 6s outvote its right 5) */
    CHECK(curve(json, "consensus_at_k", v, 8) == 3 && v[0] == 0.25 && v[1] == 0.25 && v[2] == 0.25,
          "consensus@k %g %g %g", v[0], v[1], v[2]);
    CHECK(curve(json, "base_sampling_pass_at_k", v, 8) == 2 && v[0] == 0.5 && v[1] == 1.0, "sampling pass@k %g %g",
          v[0], v[1]);
    CHECK(strstr(json, "\"accuracy_by_program\":{\"base\":0.250000,\"0-28\":0.500000,\"0-27\":0.250000}"),
          "per program: %s", json);
    CHECK(strstr(json, "\"depth_histogram\":{\"28\":4,\"29\":4,\"30\":4}") && strstr(json, "\"unique_depths\":3"),
          "depths: %s", json);
    CHECK(strstr(table, "4 questions, 3 program(s) each, 2 base sample(s)"), "table: %s", table);
    CHECK(strstr(json, "\"distinct_top_programs\":1,\"distinct_program_lists\":1"), "one list for all: %s", json);
    polar_free(json), polar_free(table);
    char svg[256];
    snprintf(svg, sizeof svg, "%s/plot.svg", tmp_dir);
    CHECK_OK(polar_eval_plot(path, svg, &err));
    FILE *g = fopen(svg, "r");
    char buf[64] = "";
    CHECK(g && fgets(buf, sizeof buf, g) && !strncmp(buf, "<svg ", 5), "plot: %s", buf);
    if (g) fclose(g);
}

/* A predictor's lists told apart: q0 and q3 alike, q1 the same top program
 * in another list, q2 another top program, q4 q0's list cut short. */
static void distinct_program_lists(void) {
    polar_error err;
    char path[256];
    snprintf(path, sizeof path, "%s/distinct.jsonl", tmp_dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    polar_eval_run q0[2] = {run("base", 30, "5", 1), run("0-28", 29, "6", 0)};
    polar_eval_run q1[2] = {run("base", 30, "5", 1), run("0-27", 28, "6", 0)};
    polar_eval_run q2[2] = {run("0-28", 29, "5", 1), run("base", 30, "6", 0)};
    write_line(f, 0, q0, 2, NULL, 0);
    write_line(f, 1, q1, 2, NULL, 0);
    write_line(f, 2, q2, 2, NULL, 0);
    write_line(f, 3, q0, 2, NULL, 0);
    write_line(f, 4, q0, 1, NULL, 0);
    fclose(f);
    char *json = NULL, *table = NULL;
    CHECK_OK(polar_eval_summary(path, &json, &table, &err));
    if (!json || !table) return;
    CHECK(strstr(json, "\"distinct_top_programs\":2,\"distinct_program_lists\":4"), "distinct: %s", json);
    CHECK(!strstr(json, "accuracy_by_program"), "per program only when every question ran one list: %s", json);
    CHECK(strstr(table, "programs: 2 distinct top program(s), 4 distinct ranked list(s) over 5 questions"), "table: %s",
          table);
    polar_free(json), polar_free(table);
}

/* q3 at k = 3: 10/2 and 5.0 pool two votes against 4's one. */
static void consensus_pools_equal_answers(void) {
    polar_error err;
    char path[256];
    snprintf(path, sizeof path, "%s/pool.jsonl", tmp_dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    polar_eval_run q[3] = {run("base", 30, "4", 0), run("0-28", 29, "10/2", 1), run("0-27", 28, "5.0", 1)};
    write_line(f, 0, q, 3, NULL, 0);
    fclose(f);
    char *json = NULL;
    double v[8];
    CHECK_OK(polar_eval_summary(path, &json, NULL, &err));
    CHECK(json && curve(json, "consensus_at_k", v, 8) == 3 && v[0] == 0 && v[1] == 0 && v[2] == 1,
          "consensus %s", json ? json : "");
    polar_free(json);
}

/* A results file of n questions from `first`, run i of question q right
 * when right[q][i]; answers differ per run so that consensus ties go to
 * rank 1. n_runs[q] runs each, as programs (samples 0) or base samples. */
static void write_file(const char *path, const long *index, int n, const int (*right)[2], const int *n_runs,
                       int samples) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (int q = 0; q < n; q++) {
        polar_eval_run r[2] = {run("base", 30, right[q][0] ? "5" : "6", right[q][0]),
                               run("base", 30, right[q][1] ? "5" : "7", right[q][1])};
        r[0].sample = samples ? 0 : -1, r[1].sample = samples ? 1 : -1;
        polar_eval_run other = run("0-28", 29, "8", 0);
        if (samples) write_line(f, index[q], &other, 1, r, n_runs[q]);
        else write_line(f, index[q], r, n_runs[q], NULL, 0);
    }
    fclose(f);
}

/* The paired table counts what the two summaries alone cannot: which
 * questions each side gets right. */
static void compare_pairs_questions(void) {
    polar_error err;
    char a[256], b[256], dup[256];
    snprintf(a, sizeof a, "%s/cmp-a.jsonl", tmp_dir), snprintf(b, sizeof b, "%s/cmp-b.jsonl", tmp_dir);
    snprintf(dup, sizeof dup, "%s/cmp-dup.jsonl", tmp_dir);
    /* A's programs: q0 right at 1 (one run), q1 at 2, q2 never, q3 at 1;
     * q9 in A only. B's samples: q1 at 1, q2 at 2, q3 both; q7 in B only. */
    long ia[5] = {0, 1, 2, 3, 9}, ib[5] = {7, 3, 2, 1, 0};
    int ra[5][2] = {{1, 0}, {0, 1}, {0, 0}, {1, 0}, {1, 1}}, na[5] = {1, 2, 2, 1, 2};
    int rb[5][2] = {{1, 1}, {1, 1}, {0, 1}, {1, 0}, {0, 0}}, nb[5] = {2, 2, 2, 2, 2};
    write_file(a, ia, 5, ra, na, 0);
    write_file(b, ib, 5, rb, nb, 1);
    char *json = NULL, *table = NULL;
    CHECK_OK(polar_eval_compare(a, POLAR_EVAL_RUNS, b, POLAR_EVAL_SAMPLES, 0, &json, &table, &err));
    if (!json || !table) return;
    CHECK(strstr(json, "\"unpaired\":1},\"questions\":4,"), "pairing: %s", json);
    /* pass@2: q0 counts its one run whole; consensus@2: q1's tie goes to its wrong rank 1 */
    CHECK(strstr(json, "\"pass_at_k\":[{\"k\":1,\"a\":0.500000,\"b\":0.500000,\"a_only\":1,\"b_only\":1,\"both\":1,"
                       "\"neither\":1,\"p\":1},{\"k\":2,\"a\":0.750000,\"b\":0.750000,\"a_only\":1,\"b_only\":1,"
                       "\"both\":2,\"neither\":0,\"p\":1}]"),
          "pass@k: %s", json);
    CHECK(strstr(json, "\"consensus_at_k\":[{\"k\":1,") &&
              strstr(json, "{\"k\":2,\"a\":0.500000,\"b\":0.500000,\"a_only\":1,\"b_only\":1,\"both\":1,\"neither\":1,"),
          "consensus@k: %s", json);
    CHECK(strstr(table, "4 paired questions (1 only in A, 1 only in B)"), "table: %s", table);
    polar_free(json), polar_free(table);
    /* exact p: 12 questions only A answers, 1 only B: 2 * (1 + 13) / 2^13 */
    long idx[13];
    int r1[13][2], r0[13][2], n1[13];
    for (int q = 0; q < 13; q++) idx[q] = q, n1[q] = 1, r1[q][0] = q < 12, r0[q][0] = q == 12, r1[q][1] = r0[q][1] = 0;
    write_file(a, idx, 13, r1, n1, 0);
    write_file(b, idx, 13, r0, n1, 0);
    CHECK_OK(polar_eval_compare(a, POLAR_EVAL_RUNS, b, POLAR_EVAL_RUNS, 1, &json, NULL, &err));
    CHECK(json && strstr(json, "\"a_only\":12,\"b_only\":1,\"both\":0,\"neither\":0,\"p\":0.00341797}"), "p: %s",
          json ? json : "");
    polar_free(json);
    /* refusals: a list no line has, a repeated index, k out of range, no file */
    CHECK(polar_eval_compare(a, POLAR_EVAL_SAMPLES, b, POLAR_EVAL_RUNS, 0, &json, NULL, &err) == POLAR_ERR_ARG &&
              strstr(err.msg, "no question has samples"),
          "empty list: %s", err.msg);
    idx[1] = 0;
    write_file(dup, idx, 13, r1, n1, 0);
    CHECK(polar_eval_compare(a, POLAR_EVAL_RUNS, dup, POLAR_EVAL_RUNS, 0, &json, NULL, &err) == POLAR_ERR_FORMAT &&
              strstr(err.msg, "question 0 appears twice"),
          "repeated index: %s", err.msg);
    CHECK(polar_eval_compare(a, POLAR_EVAL_RUNS, b, POLAR_EVAL_RUNS, 65, &json, NULL, &err) == POLAR_ERR_ARG,
          "k 65: %s", err.msg);
    CHECK(polar_eval_compare(a, POLAR_EVAL_RUNS, "/nonexistent.jsonl", POLAR_EVAL_RUNS, 0, &json, NULL, &err) ==
              POLAR_ERR_IO,
          "missing: %s", err.msg);
}

/* A device as a results or labels file reads one endless line: refused at
 * the line cap (64 MiB), not read until memory runs out. */
static void endless_line_refused(void) {
    polar_error err;
    char *json = NULL;
    CHECK(polar_eval_summary("/dev/zero", &json, NULL, &err) == POLAR_ERR_FORMAT &&
              strstr(err.msg, "/dev/zero:1: a line over 64 MiB: not a results file"),
          "results: %s", err.msg);
    CHECK(polar_labels_summary("/dev/zero", 30, &json, NULL, NULL, &err) == POLAR_ERR_FORMAT &&
              strstr(err.msg, "/dev/zero:1: a line over 64 MiB: not a labels file"),
          "labels: %s", err.msg);
}

static void record_lines(void) {
    polar_error err;
    polar_eval_run r = run("0-5,6-7x2", 10, "\\frac{1}{2}", 1);
    r.text = "bad \xff byte, \"quoted\"\nnew line \xe2\x82"; /* cut mid-character */
    polar_eval_record rec = {.index = 12, .line = 13, .question = "Q?", .gold = "1/2", .prompt = "P", .runs = &r,
                             .n_runs = 1};
    char *line = NULL;
    CHECK_OK(polar_eval_record_json(&rec, &line, &err));
    if (!line) return;
    CHECK(!strncmp(line, "{\"index\":12,\"line\":13,", 22), "%s", line);
    CHECK(strstr(line, "\"text\":\"bad \\ufffd byte, \\\"quoted\\\"\\nnew line \\ufffd\\ufffd\""), "escapes: %s", line);
    CHECK(polar_eval_record_index(line) == 12, "index of a whole line");
    line[strlen(line) - 1] = 0;
    CHECK(polar_eval_record_index(line) == -1, "a torn line has no index");
    CHECK(polar_eval_record_index("{\"other\":1}") == -1, "a foreign line has no index");
    polar_free(line);
    char *q = polar_json_quote("a\"b\\c\x01");
    CHECK(q && !strcmp(q, "\"a\\\"b\\\\c\\u0001\""), "quote: %s", q ? q : "");
    polar_free(q);
}

static void labels_summary(void) {
    polar_error err;
    char path[256], svg[256];
    snprintf(path, sizeof path, "%s/labels.jsonl", tmp_dir);
    snprintf(svg, sizeof svg, "%s/labels.svg", tmp_dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    /* D = 6. q0: base right, one valid shorter program (skip of layer 5);
     * q1: base wrong, fixed by a repeat of layer 2; q2: nothing valid. */
    fputs("{\"index\":0,\"question\":\"a\",\"gt_ans\":\"1\",\"initial_score\":1,"
          "\"final_valid_transitions\":[[0,1,2,3,4,5],[0,1,2,3,4]],\"final_invalid_transitions\":[],"
          "\"best_transitions\":[{\"path\":[0,1,2,3,4,5],\"score\":1,\"length\":6}]}\n", f);
    fputs("{\"index\":1,\"question\":\"b\",\"gt_ans\":\"2\",\"initial_score\":0,"
          "\"final_valid_transitions\":[[0,1,2,2,3,4,5]],\"final_invalid_transitions\":[[0,1,2,3,4,5]],"
          "\"best_transitions\":[{\"path\":[0,1,2,3,4,5],\"score\":0,\"length\":6}]}\n", f);
    fputs("{\"index\":2,\"question\":\"c\",\"gt_ans\":\"3\",\"initial_score\":0,"
          "\"final_valid_transitions\":[],\"final_invalid_transitions\":[[0,1,2,3,4,5]],"
          "\"best_transitions\":[{\"path\":[0,1,2,3,4,5],\"score\":0,\"length\":6}]}\n", f);
    fclose(f);
    char *json = NULL, *table = NULL;
    CHECK_OK(polar_labels_summary(path, 0, &json, &table, svg, &err));
    if (!json || !table) return;
    CHECK(strstr(json, "\"questions\":3,\"n_layers\":6,\"with_valid_program\":0.666667,\"base_correct\":0.333333,"
                       "\"base_wrong_fixed\":0.500000,\"mean_shortest_valid_length\":6.000"),
          "%s", json);
    CHECK(strstr(json, "\"valid_programs\":3,\"codec_rejected\":0"), "%s", json);
    /* Finding 2: q0's shortest valid program has 5 layers (under D), q1's fix 7 */
    CHECK(strstr(json, "\"shorter_base_correct\":1.000000,\"shorter_fixed\":0.000000,"), "%s", json);
    CHECK(strstr(table, "a valid program shorter than D:  100.0% of base-correct (1 of 1), 0.0% of fixed (0 of 1)"), "%s",
          table);
    /* the paper's single-layer ratio over the edits: a one-layer skip and a one-layer repeat */
    CHECK(strstr(json, "\"edits\":2,\"single_layer_edits\":1.000000,\"valid_skip_only\":1,\"valid_repeat_only\":1,"
                       "\"valid_skip_and_repeat\":0,\"valid_no_edit\":1,\"programs_evaluated\":0"),
          "%s", json);
    CHECK(strstr(table, "base-wrong questions fixed:       50.0% (1 of 2)"), "%s", table);
    /* the fixed question's shortest valid program: q1's 7 layers (q0 was base-correct) */
    CHECK(strstr(json, ",\"fixed_shortest_lengths\":{\"7\":1}}"), "%s", json);
    CHECK(strstr(table, "fixed questions by their shortest valid program, layers: 7\n"), "%s", table);
    /* written before --actions: no "actions" in the lines, every search both */
    CHECK(strstr(json, "\"actions\":\"both\",\"lines_without_actions\":3,"), "%s", json);
    CHECK(strstr(table, "3 questions, D = 6, actions both (not recorded"), "%s", table);
    polar_free(json), polar_free(table);
    CHECK(access(svg, R_OK) == 0, "no plot written");
    /* the action space each line names: one for the file, "mixed" when they
     * differ, an unknown name an error */
    static const struct {
        const char *a, *b, *json, *table;
    } spaces[] = {
        {"skip", "skip", "\"actions\":\"skip\",\"lines_without_actions\":0,", "2 questions, D = 6, actions skip\n"},
        {"loop", "loop", "\"actions\":\"loop\",\"lines_without_actions\":0,", "2 questions, D = 6, actions loop\n"},
        {"both", NULL, "\"actions\":\"both\",\"lines_without_actions\":1,",
         "2 questions, D = 6, actions both (1 line without \"actions\", read as both)\n"},
        {"skip", "loop", "\"actions\":\"mixed\",\"lines_without_actions\":0,", "actions mixed\n"},
        {"skip", NULL, "\"actions\":\"mixed\",\"lines_without_actions\":1,", "actions mixed (1 line without"},
    };
    for (size_t i = 0; i < sizeof spaces / sizeof spaces[0]; i++) {
        f = fopen(path, "w");
        if (!f) return;
        for (int k = 0; k < 2; k++) {
            const char *a = k ? spaces[i].b : spaces[i].a;
            fprintf(f, "{\"index\":%d,\"question\":\"a\",\"gt_ans\":\"1\",\"initial_score\":0,"
                    "\"final_valid_transitions\":[],\"final_invalid_transitions\":[[0,1,2,3,4,5]],"
                    "\"best_transitions\":[{\"path\":[0,1,2,3,4,5],\"score\":0,\"length\":6}]%s%s%s}\n", k,
                    a ? ",\"actions\":\"" : "", a ? a : "", a ? "\"" : "");
        }
        fclose(f);
        CHECK_OK(polar_labels_summary(path, 0, &json, &table, NULL, &err));
        if (!json || !table) return;
        CHECK(strstr(json, spaces[i].json), "%s/%s: %s", spaces[i].a, spaces[i].b, json);
        CHECK(strstr(table, spaces[i].table), "%s/%s: %s", spaces[i].a, spaces[i].b, table);
        /* nothing fixed: an empty object, "none" */
        CHECK(strstr(json, "\"fixed_shortest_lengths\":{}}"), "%s", json);
        CHECK(strstr(table, "shortest valid program, layers: none\n"), "%s", table);
        polar_free(json), polar_free(table);
    }
    /* the fixed questions' shortest programs counted by length: 5, 7 and 7
     * (the first also has a valid 7-layer program, the shortest counts) */
    static const char *fixes[] = {"[0,1,2,3,4,5,5],[0,1,2,3,4]", "[0,1,1,2,3,4,5]", "[0,1,2,3,3,4,5]"};
    f = fopen(path, "w");
    if (!f) return;
    for (int k = 0; k < 3; k++)
        fprintf(f, "{\"index\":%d,\"question\":\"a\",\"gt_ans\":\"1\",\"initial_score\":0,"
                "\"final_valid_transitions\":[%s],\"final_invalid_transitions\":[[0,1,2,3,4,5]],"
                "\"best_transitions\":[{\"path\":[0,1,2,3,4,5],\"score\":0,\"length\":6}]}\n", k, fixes[k]);
    fclose(f);
    CHECK_OK(polar_labels_summary(path, 0, &json, &table, NULL, &err));
    if (!json || !table) return;
    CHECK(strstr(json, "\"fixed_shortest_lengths\":{\"5\":1,\"7\":2}}"), "%s", json);
    CHECK(strstr(table, "shortest valid program, layers: 5, 7 x2\n"), "%s", table);
    polar_free(json), polar_free(table);
    f = fopen(path, "w");
    if (!f) return;
    fputs("{\"index\":0,\"question\":\"a\",\"gt_ans\":\"1\",\"initial_score\":0,\"final_valid_transitions\":[],"
          "\"best_transitions\":[],\"actions\":\"skips\"}\n", f);
    fclose(f);
    CHECK(polar_labels_summary(path, 0, &json, NULL, NULL, &err) == POLAR_ERR_FORMAT && strstr(err.msg, ":1:") &&
              strstr(err.msg, "actions"),
          "unknown action space: %s", err.msg);
    /* a file that is not labels */
    snprintf(path, sizeof path, "%s/notlabels.jsonl", tmp_dir);
    f = fopen(path, "w");
    fputs("{\"index\":0,\"other\":1}\n", f);
    fclose(f);
    CHECK(polar_labels_summary(path, 0, &json, NULL, NULL, &err) == POLAR_ERR_FORMAT && strstr(err.msg, ":1:"),
          "not labels: %s", err.msg);
}

/* A labels line: base right or not, one valid program or none. */
static void label_line(FILE *f, int index, int base_right, int valid, const char *actions) {
    fprintf(f, "{\"index\":%d,\"question\":\"q\",\"gt_ans\":\"1\",\"initial_score\":%d,"
            "\"final_valid_transitions\":[%s],\"final_invalid_transitions\":[],"
            "\"best_transitions\":[{\"path\":[0,1,2,3,4,5],\"score\":%d,\"length\":6}],\"actions\":\"%s\"}\n",
            index, base_right, valid ? "[0,1,2,2,3,4,5]" : "", base_right, actions);
}

/* Two action spaces' labels paired by question: q0 valid in both, q1 in A
 * only, q2 in B only, q3 both, q6 neither (and its base answer judged
 * differently); q5 only in A, q4 only in B. */
static void labels_compare_pairs(void) {
    polar_error err;
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/la.jsonl", tmp_dir), snprintf(b, sizeof b, "%s/lb.jsonl", tmp_dir);
    FILE *f = fopen(a, "w");
    if (!f) return;
    int qa[6][3] = {{0, 1, 1}, {1, 0, 1}, {2, 0, 0}, {3, 0, 1}, {5, 0, 1}, {6, 1, 0}};
    int qb[6][3] = {{6, 0, 0}, {4, 0, 1}, {3, 0, 1}, {2, 0, 1}, {1, 0, 0}, {0, 1, 1}};
    for (int i = 0; i < 6; i++) label_line(f, qa[i][0], qa[i][1], qa[i][2], "loop");
    fclose(f);
    if (!(f = fopen(b, "w"))) return;
    for (int i = 0; i < 6; i++) label_line(f, qb[i][0], qb[i][1], qb[i][2], "skip");
    fclose(f);
    char *json = NULL, *table = NULL;
    CHECK_OK(polar_labels_compare(a, b, &json, &table, &err));
    if (!json || !table) return;
    CHECK(strstr(json, "\"actions\":\"loop\",\"unpaired\":1}") && strstr(json, "\"actions\":\"skip\",\"unpaired\":1}"),
          "sides: %s", json);
    CHECK(strstr(json, "\"questions\":5,\"base_answer_differs\":1,\"with_valid\":{\"a\":0.600000,\"b\":0.600000,"
                       "\"a_only\":1,\"b_only\":1,\"both\":2,\"neither\":1,\"p\":1}"),
          "with valid: %s", json);
    /* fixed: over q1, q2, q3, the questions both judge base-wrong */
    CHECK(strstr(json, "\"base_wrong\":3,\"base_wrong_fixed\":{\"a\":0.666667,\"b\":0.666667,\"a_only\":1,"
                       "\"b_only\":1,\"both\":1,\"neither\":0,"),
          "fixed: %s", json);
    CHECK(strstr(table, "5 paired questions (1 only in A, 1 only in B), 3 base-wrong in both") &&
              strstr(table, "judged differently on 1 question(s)"),
          "table: %s", table);
    polar_free(json), polar_free(table);
    if (!(f = fopen(b, "w"))) return;
    label_line(f, 0, 1, 1, "skip"), label_line(f, 0, 1, 1, "skip");
    fclose(f);
    CHECK(polar_labels_compare(a, b, &json, NULL, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "question 0 appears twice"),
          "repeated: %s", err.msg);
    if (!(f = fopen(b, "w"))) return;
    label_line(f, 40, 1, 1, "skip");
    fclose(f);
    CHECK(polar_labels_compare(a, b, &json, NULL, &err) == POLAR_ERR_ARG && strstr(err.msg, "share no question"),
          "disjoint: %s", err.msg);
}

int main(void) {
    if (!mkdtemp(tmp_dir)) return 1;
    RUN(record_lines);
    RUN(summary_metrics);
    RUN(consensus_pools_equal_answers);
    RUN(distinct_program_lists);
    RUN(compare_pairs_questions);
    RUN(labels_summary);
    RUN(labels_compare_pairs);
    RUN(endless_line_refused);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd)) return 1;
    TEST_EXIT();
}
