/* polar eval: every question of a data set slice through one or more
 * programs (given, read from a file, or the predictor's top k) and through
 * base sampling; each answer extracted and checked as the math-eval
 * harnesses do; one JSON line per question, appended, so a stopped run
 * resumes; the summary and plot computed from that file alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auto.h"
#include "loop.h"

enum { MAX_PROGRAMS = 64 };

typedef struct {
    const char *model, *data, *format, *qfield, *afield, *style_text, *shots_from, *program, *programs_file;
    const char *predictor, *encoder, *out, *summary, *plot, *fallback, *device_text, *kv_text, *summary_of;
    const char *compare_a, *compare_b, *lists; /* --compare A --with B --lists LA,LB */
    polar_decode_opts decode; /* --decode: the predictor's decoder */
    int start, limit, shots, k, samples, max_new, threads, quiet, cache_mb;
    polar_gen_opts sampling; /* the base samples': temperature, top_k, top_p, min_p, seed */
} eval_args;

/* The fixed programs: --program SPEC or the lines of --programs FILE. */
static int fixed_programs(const char *cmd, const eval_args *a, int D, polar_candidate *out, int *n) {
    polar_error err;
    *n = 0;
    if (!a->programs_file) {
        if (polar_program_parse(a->program, D, 0, &out[0].program, &err) != POLAR_OK) return fail_status(cmd, &err);
        *n = 1;
        return 0;
    }
    polar_program progs[MAX_PROGRAMS];
    int rc = read_programs(cmd, a->programs_file, D, progs, MAX_PROGRAMS, n);
    for (int i = 0; i < *n; i++) out[i].program = progs[i];
    return rc;
}

/* Texts and answers of a question's runs, owned until its line is written. */
typedef struct {
    char *text, *answer, *fallback, *program;
} run_strings;

static int keep_strings(polar_eval_run *r, run_strings *k, const polar_program *p) {
    k->text = strdup(r->text);
    k->answer = r->answer ? strdup(r->answer) : NULL;
    k->fallback = r->fallback_answer ? strdup(r->fallback_answer) : NULL;
    int n = polar_program_format(p, NULL, 0);
    if (n >= 0 && (k->program = malloc((size_t)n + 1))) polar_program_format(p, k->program, (size_t)n + 1);
    if (!k->text || (r->answer && !k->answer) || (r->fallback_answer && !k->fallback) || !k->program) return 0;
    r->text = k->text, r->answer = k->answer, r->fallback_answer = k->fallback, r->program = k->program;
    return 1;
}

static void free_strings(run_strings *k, int n) {
    for (int i = 0; i < n; i++) free(k[i].text), free(k[i].answer), free(k[i].fallback), free(k[i].program);
}

typedef struct {
    polar_batch *b;     /* runs all of a question's runs at once */
    const polar_tokenizer *tok;
    const polar_question *q;
    prompt_style style;
    int fallback, max_new, stop_id;
    text_acc acc;
    text_acc *accs;     /* [runs] the batch's texts */
    int *ids, *fed;     /* [runs] their sequence ids, tokens fed to accs */
    double *ended;      /* [runs] ms from the question's start to the run's end; < 0 while it runs */
    char answer[256], fallback_answer[256];
} eval_ctx;

/* One run of a question: a program, greedy (sampling NULL) or sampled. */
typedef struct {
    const polar_program *p;
    const polar_gen_opts *sampling;
    uint64_t seed;
    int sample; /* -1: a program run; k: base sample k */
} planned_run;

static polar_gen_opts gen_opts(const eval_ctx *c, const planned_run *pr) {
    polar_gen_opts g = pr->sampling ? *pr->sampling : (polar_gen_opts){0};
    g.max_new = c->max_new, g.stop = &c->stop_id, g.n_stop = c->stop_id >= 0, g.seed = pr->seed;
    return g;
}

/* Judge a generated text into r (its strings point into c until kept). */
static void judge(eval_ctx *c, const char *text, int tokens, double ms, const polar_program *p, polar_eval_run *r) {
    memset(r, 0, sizeof *r);
    r->text = text, r->tokens = tokens, r->ms = ms, r->executed_layers = p->n;
    if (c->q->n_choices > 0) {
        int choice = polar_answer_choice(text, c->q->n_choices);
        if (choice >= 0) {
            snprintf(c->answer, sizeof c->answer, "%c", 'A' + choice);
            r->answer = c->answer, r->correct = choice == c->q->answer_index;
        }
        return;
    }
    if (polar_answer_boxed(text, c->answer, sizeof c->answer))
        r->answer = c->answer, r->correct = polar_answer_equal(c->answer, c->q->answer);
    if (c->fallback && polar_answer_last_number(text, c->fallback_answer, sizeof c->fallback_answer))
        r->fallback_answer = c->fallback_answer, r->fallback_correct = polar_answer_equal(c->fallback_answer, c->q->answer);
}

/* All n planned runs of a question as sequences of one batch, each ended
 * once its text stops (a \boxed{} closed) as a session run would be: the
 * same tokens. A run's ms: from the question's start until it ended. Each
 * judged run is kept before the next reuses c's answer buffers. */
static polar_status run_batched(eval_ctx *c, const planned_run *plan, int n, const int *ids, int n_ids,
                                polar_eval_run *runs, run_strings *kept, polar_error *err) {
    double t0 = polar_time_ms(), *ended = c->ended;
    polar_status st = POLAR_OK;
    for (int i = 0; i < n && st == POLAR_OK; i++) {
        polar_gen_opts go = gen_opts(c, &plan[i]);
        text_acc_reset(&c->accs[i]);
        c->fed[i] = 0, ended[i] = -1;
        st = polar_batch_add(c->b, plan[i].p, ids, n_ids, &go, &c->ids[i], err);
    }
    for (int left = n; st == POLAR_OK && left > 0;) {
        if ((st = polar_batch_step(c->b, NULL, err)) != POLAR_OK) break;
        for (int i = 0; i < n && st == POLAR_OK; i++) {
            polar_seq_info info;
            if (ended[i] >= 0 || (st = polar_batch_seq(c->b, c->ids[i], &info, err)) != POLAR_OK) continue;
            int stop = text_acc_feed(&c->accs[i], &info, &c->fed[i]);
            if (stop) st = polar_batch_cancel(c->b, c->ids[i], err);
            if (stop || info.state == POLAR_SEQ_ENDED) ended[i] = polar_time_ms() - t0, left--;
        }
    }
    for (int i = 0; i < n && st == POLAR_OK; i++) {
        if (c->accs[i].out_of_memory) st = cli_error(err, POLAR_ERR_NOMEM, "eval: no memory for the generated text");
        else {
            judge(c, c->accs[i].text ? c->accs[i].text : "", c->fed[i], ended[i], plan[i].p, &runs[i]);
            if (!keep_strings(&runs[i], &kept[i], plan[i].p)) st = cli_error(err, POLAR_ERR_NOMEM, "out of memory");
        }
    }
    for (int i = 0; i < n; i++) polar_batch_remove(c->b, c->ids[i], NULL);
    return st;
}

static int evaluate(const char *cmd, const eval_args *a, const char *model_path, prompt_style style, polar_model *m,
                    polar_tokenizer *tok,
                    const polar_dataset *data, int first, int count, const polar_question *const *shots,
                    int n_shots) {
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int D = info.arch.n_layers, n_fixed = 0, auto_mode = !strcmp(a->program, "auto"), rc = 1;
    polar_candidate programs[MAX_PROGRAMS];
    polar_program base = {0};
    if (!auto_mode && (rc = fixed_programs(cmd, a, D, programs, &n_fixed))) return rc;
    rc = 1;
    unsigned char *done = calloc((size_t)count, 1);
    int n_runs_max = (auto_mode ? a->k : n_fixed) + a->samples;
    polar_eval_run *runs = calloc((size_t)n_runs_max + 1, sizeof *runs);
    run_strings *kept = calloc((size_t)n_runs_max + 1, sizeof *kept);
    int n_done = 0, max_prompt = 0, cap_len = 4 * D;
    FILE *f = NULL;
    planned_run *plan = NULL;
    polar_planner *predictor = NULL;
    eval_ctx c = {.tok = tok, .style = style, .fallback = a->fallback != NULL, .max_new = a->max_new};
    c.acc = (text_acc){.tok = tok, .stop_at_box = style != STYLE_MC, .stop_id = -1, .arch = &info.arch};
    if (!done || !runs || !kept || polar_program_parse("base", D, 0, &base, &err) != POLAR_OK) {
        fprintf(stderr, "polar %s: error: out of memory\n", cmd);
        goto done;
    }
    if (!(f = resume_results(cmd, a->out, first, count, done, &n_done))) goto done;
    /* The context fits the longest prompt. */
    if (longest_prompt(tok, style, data, first, count, done, shots, n_shots, &max_prompt, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    for (int i = 0; i < n_fixed; i++) cap_len = programs[i].program.n > cap_len ? programs[i].program.n : cap_len;
    polar_device device;
    int kv_bf16;
    if (!parse_device(cmd, a->device_text, &device) || !parse_kv(cmd, a->kv_text, &kv_bf16)) {
        rc = EXIT_USAGE;
        goto done;
    }
    /* one batch running a question's runs together, its context fitting the
     * longest prompt */
    int max_ctx = max_prompt + a->max_new + 1;
    polar_batch_opts bo = {.max_seqs = n_runs_max, .max_ctx = max_ctx, .max_program_len = cap_len,
                           .n_threads = a->threads, .device = device, .kv_bf16 = kv_bf16,
                           .prefix_cache_bytes = (size_t)a->cache_mb << 20};
    bo.kv_bytes = polar_batch_kv_bytes(m, &bo, n_runs_max, cap_len, max_ctx);
    if (n_done < count && polar_batch_create(m, &bo, &c.b, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    /* the predictor and its encoder loaded once for every question */
    if (auto_mode && n_done < count && (rc = auto_open(cmd, model_path, D, a->predictor, a->encoder, &predictor)))
        goto done;
    rc = 1;
    c.accs = calloc((size_t)n_runs_max, sizeof *c.accs);
    c.ids = malloc((size_t)n_runs_max * sizeof *c.ids);
    c.fed = malloc((size_t)n_runs_max * sizeof *c.fed);
    c.ended = malloc((size_t)n_runs_max * sizeof *c.ended);
    plan = malloc((size_t)n_runs_max * sizeof *plan);
    if (style == STYLE_CHAT) c.stop_id = c.acc.stop_id = polar_tokenizer_end_of_turn(tok);
    if (!c.accs || !c.ids || !c.fed || !c.ended || !plan) {
        fprintf(stderr, "polar %s: error: out of memory\n", cmd);
        goto done;
    }
    for (int i = 0; i < n_runs_max; i++) c.accs[i] = c.acc;
    cli_progress progress;
    progress_start(&progress, cmd, count, n_done);
    for (int i = 0; i < count; i++) {
        if (done[i]) continue;
        const polar_question *q = polar_dataset_get(data, first + i);
        char *text = NULL;
        int *ids = NULL, n_ids = 0, n_prog = n_fixed, n_runs = 0;
        polar_candidate predicted[MAX_PROGRAMS];
        polar_candidate *list = programs;
        polar_status st = question_prompt(tok, style, q, shots, n_shots, &text, &ids, &n_ids, &err);
        if (st == POLAR_OK && auto_mode) {
            if (auto_predict(cmd, predictor, q->question, &a->decode, predicted, a->k, &n_prog, NULL)) {
                polar_free(text), polar_free(ids);
                goto done;
            }
            list = predicted;
        }
        c.q = q;
        for (int p = 0; p < n_prog; p++) plan[n_runs++] = (planned_run){&list[p].program, NULL, 0, -1};
        for (int k = 0; k < a->samples; k++) {
            /* each (question, sample) its own stream: a resumed run draws the same */
            uint64_t seed = a->sampling.seed * 1000003u + (uint64_t)(first + i) * 1009u + (uint64_t)k;
            plan[n_runs++] = (planned_run){&base, &a->sampling, seed, k};
        }
        if (st == POLAR_OK) st = run_batched(&c, plan, n_runs, ids, n_ids, runs, kept, &err);
        for (int r = 0; r < n_runs; r++) runs[r].sample = plan[r].sample;
        char *line = NULL;
        if (st == POLAR_OK) {
            polar_eval_record r = {.index = first + i,
                                   .line = q->line,
                                   .question = q->question,
                                   .gold = q->answer,
                                   .prompt = text,
                                   .prompt_tokens = n_ids,
                                   .runs = runs,
                                   .n_runs = n_runs - a->samples,
                                   .samples = runs + n_runs - a->samples,
                                   .n_samples = a->samples};
            st = polar_eval_record_json(&r, &line, &err);
        }
        free_strings(kept, n_runs);
        memset(kept, 0, (size_t)n_runs * sizeof *kept);
        if (auto_mode)
            for (int p = 0; p < n_prog; p++) polar_program_free(&predicted[p].program);
        polar_free(text), polar_free(ids);
        if (st != POLAR_OK) {
            fprintf(stderr, "polar %s: error: question %d: %s\n", cmd, first + i, err.msg);
            goto done;
        }
        fprintf(f, "%s\n", line);
        fflush(f);
        polar_free(line);
        n_done++;
        if (!a->quiet) progress_update(&progress, n_done);
    }
    rc = 0;
done:
    if (f && fclose(f) && !rc) {
        fprintf(stderr, "polar %s: error: %s: write failed\n", cmd, a->out);
        rc = 1;
    }
    for (int i = 0; i < n_fixed; i++) polar_program_free(&programs[i].program);
    polar_program_free(&base);
    polar_batch_free(c.b);
    polar_planner_free(predictor);
    for (int i = 0; c.accs && i < n_runs_max; i++) text_acc_free(&c.accs[i]);
    text_acc_free(&c.acc);
    free(done), free(runs), free(kept), free(c.accs), free(c.ids), free(c.fed), free(c.ended), free(plan);
    return rc;
}

/* json and a newline into path (--summary); 1 after printing the error. */
static int write_json(const char *cmd, const char *path, const char *json) {
    FILE *f = fopen(path, "w");
    int ok = f && fprintf(f, "%s\n", json) >= 0;
    if (f && fclose(f)) ok = 0;
    if (!ok) fprintf(stderr, "polar %s: error: %s: cannot write the summary\n", cmd, path);
    return !ok;
}

/* The summary of a results file: table on stdout, JSON and SVG when asked. */
static int summarise(const char *cmd, const char *results, const char *summary, const char *plot) {
    polar_error err;
    char *json = NULL, *table = NULL;
    if (polar_eval_summary(results, summary ? &json : NULL, &table, &err) != POLAR_OK) return fail_status(cmd, &err);
    fputs(table, stdout);
    int rc = summary ? write_json(cmd, summary, json) : 0;
    polar_free(json), polar_free(table);
    if (!rc && plot && polar_eval_plot(results, plot, &err) != POLAR_OK) rc = fail_status(cmd, &err);
    return rc;
}

/* --lists: "L" for both files or "LA,LB", each runs or samples. */
static int parse_lists(const char *cmd, const char *text, polar_eval_list *la, polar_eval_list *lb) {
    *la = *lb = POLAR_EVAL_RUNS;
    if (!text) return 1;
    const char *comma = strchr(text, ',');
    size_t n = comma ? (size_t)(comma - text) : strlen(text);
    polar_eval_list *out[2] = {la, lb};
    const char *parts[2] = {text, comma ? comma + 1 : text};
    size_t lens[2] = {n, comma ? strlen(comma + 1) : n};
    for (int i = 0; i < 2; i++) {
        if (lens[i] == 4 && !strncmp(parts[i], "runs", 4)) *out[i] = POLAR_EVAL_RUNS;
        else if (lens[i] == 7 && !strncmp(parts[i], "samples", 7)) *out[i] = POLAR_EVAL_SAMPLES;
        else {
            fail_usage(cmd, "--lists takes runs or samples, or two of them as A,B (got %s)", text);
            return 0;
        }
    }
    return 1;
}

/* --compare A --with B: the paired table on stdout, JSON when asked. */
static int compare_files(const char *cmd, const eval_args *a, int k) {
    polar_eval_list la, lb;
    if (!parse_lists(cmd, a->lists, &la, &lb)) return EXIT_USAGE;
    polar_error err;
    char *json = NULL, *table = NULL;
    if (polar_eval_compare(a->compare_a, la, a->compare_b, lb, k, a->summary ? &json : NULL, &table, &err) != POLAR_OK)
        return fail_status(cmd, &err);
    fputs(table, stdout);
    int rc = a->summary ? write_json(cmd, a->summary, json) : 0;
    polar_free(json), polar_free(table);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    const char *cmd = "eval", *decode = NULL;
    eval_args a = {.decode = polar_decode_defaults(), .program = "base", .style_text = "boxed", .k = 1, .max_new = 64,
                   .sampling = {.temperature = 0.7f, .top_p = 1},
                   .cache_mb = 1024};
    cli_opt opts[] = {
        {"--model", OPT_STR, &a.model, 0},           {"--data", OPT_STR, &a.data, 0},
        {"--format", OPT_STR, &a.format, 0},         {"--question-field", OPT_STR, &a.qfield, 0},
        {"--answer-field", OPT_STR, &a.afield, 0},   {"--start", OPT_INT, &a.start, 0},
        {"--limit", OPT_INT, &a.limit, 0},           {"--style", OPT_STR, &a.style_text, 0},
        {"--shots", OPT_INT, &a.shots, 0},           {"--shots-from", OPT_STR, &a.shots_from, 0},
        {"--program", OPT_STR, &a.program, 0},       {"--programs", OPT_STR, &a.programs_file, 0},
        {"--predictor", OPT_STR, &a.predictor, 0},   {"--encoder", OPT_STR, &a.encoder, 0},
        {"-k", OPT_INT, &a.k, 0},                    {"--samples", OPT_INT, &a.samples, 0},
        {"--temperature", OPT_FLOAT, &a.sampling.temperature, 0}, {"--top-p", OPT_FLOAT, &a.sampling.top_p, 0},
        {"--top-k", OPT_INT, &a.sampling.top_k, 0}, {"--min-p", OPT_FLOAT, &a.sampling.min_p, 0},
        {"--seed", OPT_U64, &a.sampling.seed, 0},    {"--max-new", OPT_INT, &a.max_new, 0},
        {"--fallback", OPT_STR, &a.fallback, 0},     {"--threads", OPT_INT, &a.threads, 0},
        {"--cache-mb", OPT_INT, &a.cache_mb, 0},     {"--kv", OPT_STR, &a.kv_text, 0},
        {"--device", OPT_STR, &a.device_text, 0},    {"-o", OPT_STR, &a.out, 0},
        {"--summary", OPT_STR, &a.summary, 0},       {"--plot", OPT_STR, &a.plot, 0},
        {"--quiet", OPT_FLAG, &a.quiet, 0},          {"--summary-of", OPT_STR, &a.summary_of, 0},
        {"--decode", OPT_STR, &decode, 0},           {"--compare", OPT_STR, &a.compare_a, 0},
        {"--with", OPT_STR, &a.compare_b, 0},        {"--lists", OPT_STR, &a.lists, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (a.compare_a || a.compare_b || a.lists) {
        if (!a.compare_a || !a.compare_b) return fail_usage(cmd, "give --compare A.jsonl --with B.jsonl");
        if (a.data || a.out || a.summary_of || a.plot)
            return fail_usage(cmd, "--compare takes only --with, --lists, -k and --summary");
        if (opts[14].seen && (a.k < 1 || a.k > MAX_PROGRAMS)) return fail_usage(cmd, "-k must be 1 to %d", MAX_PROGRAMS);
        return compare_files(cmd, &a, opts[14].seen ? a.k : 0);
    }
    if (a.summary_of) {
        if (a.data || a.out) return fail_usage(cmd, "--summary-of takes only --summary and --plot");
        return summarise(cmd, a.summary_of, a.summary, a.plot);
    }
    if (!a.data || !a.out) return fail_usage(cmd, "give --data FILE and -o RESULTS.jsonl");
    int bad_out = check_results_path(cmd, a.out);
    if (bad_out) return bad_out;
    prompt_style style;
    if (!parse_style(cmd, a.style_text, &style)) return EXIT_USAGE;
    int auto_mode = !strcmp(a.program, "auto");
    if (a.programs_file && opts[10].seen) return fail_usage(cmd, "give --program or --programs, not both");
    if (auto_mode != (a.predictor != NULL)) return fail_usage(cmd, "--program auto and --predictor go together");
    if (decode && !auto_mode) return fail_usage(cmd, "--decode goes with --program auto");
    if (decode_mode(cmd, decode, &a.decode)) return EXIT_USAGE;
    if (a.k < 1 || a.k > MAX_PROGRAMS || (opts[14].seen && !auto_mode))
        return fail_usage(cmd, "-k (1 to %d) goes with --program auto", MAX_PROGRAMS);
    if (a.samples > 64) return fail_usage(cmd, "--samples must be at most 64");
    if (a.samples && a.sampling.temperature <= 0) return fail_usage(cmd, "--samples needs --temperature > 0");
    if (!check_sampling(cmd, &a.sampling)) return EXIT_USAGE;
    if (a.max_new < 1) return fail_usage(cmd, "--max-new must be >= 1");
    if (a.cache_mb < 0) return fail_usage(cmd, "--cache-mb must not be negative");
    if (a.fallback && strcmp(a.fallback, "last-number")) return fail_usage(cmd, "--fallback takes last-number");

    polar_dataset *data = NULL, *shot_data = NULL;
    int first, count, rc;
    const polar_question *shots[MAX_SHOTS];
    if ((rc = load_shots(cmd, a.shots, a.shots_from, &shot_data, shots))) return rc;
    int n_shots = a.shots;
    if ((rc = open_dataset(cmd, a.data, a.format, a.qfield, a.afield, a.start, a.limit, &data, &first, &count))) {
        polar_dataset_free(shot_data);
        return rc;
    }
    if (!rc && style == STYLE_MC && polar_dataset_get(data, first)->n_choices == 0)
        rc = fail_usage(cmd, "--style mc needs a multiple-choice data set");
    char *model_file = rc ? NULL : find_model(cmd, a.model);
    const char *model_path = model_file;
    if (!rc && !model_path) rc = 1;
    polar_error err;
    polar_model *m = NULL;
    polar_tokenizer *tok = NULL;
    if (!rc && (polar_model_load(model_path, &m, &err) != POLAR_OK ||
                polar_tokenizer_load(model_path, &tok, &err) != POLAR_OK))
        rc = fail_status(cmd, &err);
    if (!rc) rc = evaluate(cmd, &a, model_path, style, m, tok, data, first, count, shots, n_shots);
    if (!rc && (a.summary || a.plot || !a.quiet)) rc = summarise(cmd, a.out, a.summary, a.plot);
    polar_tokenizer_free(tok);
    polar_model_free(m);
    polar_dataset_free(data);
    polar_dataset_free(shot_data);
    polar_free(model_file);
    return rc;
}
