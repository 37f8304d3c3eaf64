/* polar search: PoLar's Monte Carlo tree search for layer programs that
 * answer each question of a data set (polar_search_programs), rewarded as
 * the reference rewards them: greedy generation of at most 50 tokens with
 * its \boxed{} prompt, 1 when the boxed answer equals the gold one. One JSONL
 * line per question with the reference's field names (its tooling and
 * `polar train` read them), appended, so a stopped run resumes. --batch
 * questions are searched at once in one batch (CPU or CUDA) whose prefix
 * cache shares prompts (a few-shot prefix across questions, a question's
 * prompt across programs with the same first entries). --actions skip or
 * loop searches one of the paper's smaller spaces (search/search.c), and
 * each line says which. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"

/* One question's search in flight: its prompt, the text of the program being
 * rewarded, and the figures of its line. */
typedef struct {
    int index;                /* in the data set; -1: a free slot */
    const polar_question *q;
    polar_search *search;
    char *text;
    int *ids, n_ids;
    text_acc acc;
    int seq, fed;             /* batch: the program's sequence, its tokens given to acc */
    int n_program;            /* the program being rewarded */
    long tokens, entries_run, entries_needed;
    double t0;
} job;

/* How programs are run: as sequences of one batch, many questions at once,
 * prompts shared through its prefix cache. */
typedef struct {
    polar_batch *b;
    int max_new;
} runner;

/* 1 when the text gives the gold answer in a \boxed{}. */
static double reward_of(const job *j) {
    char answer[256];
    return j->acc.text && polar_answer_boxed(j->acc.text, answer, sizeof answer) &&
           polar_answer_equal(answer, j->q->answer);
}

static polar_gen_opts gen_opts(const runner *r, const job *j) {
    return (polar_gen_opts){.max_new = r->max_new, .stop = &j->acc.stop_id, .n_stop = j->acc.stop_id >= 0};
}

/* Hand j's search its next program, run in the batch (*finished 0), or
 * see that the search is done (*finished 1). */
static polar_status advance(runner *r, job *j, int *finished, polar_error *err) {
    polar_program p;
    polar_status st = polar_search_next(j->search, &p, err);
    *finished = 0;
    if (st != POLAR_OK) return st;
    if (!p.n) {
        *finished = 1;
        return POLAR_OK;
    }
    text_acc_reset(&j->acc);
    j->entries_needed += (long)p.n * j->n_ids;
    j->n_program = p.n;
    j->fed = 0;
    polar_gen_opts go = gen_opts(r, j);
    return polar_batch_add(r->b, &p, j->ids, j->n_ids, &go, &j->seq, err);
}

/* After a batch step: the new tokens of j's program; once its text stops
 * (a \boxed{} closed, the end of turn) or the sequence ends, its reward. */
static polar_status poll(runner *r, job *j, int *rewarded, polar_error *err) {
    polar_seq_info info;
    polar_status st = polar_batch_seq(r->b, j->seq, &info, err);
    *rewarded = 0;
    if (st != POLAR_OK) return st;
    int stop = text_acc_feed(&j->acc, &info, &j->fed);
    if (!stop && info.state != POLAR_SEQ_ENDED) return POLAR_OK;
    if (j->acc.out_of_memory) return cli_error(err, POLAR_ERR_NOMEM, "search: no memory for the generated text");
    j->tokens += j->fed;
    j->entries_run += (long)j->n_program * j->n_ids - info.prompt_skipped;
    if ((st = polar_batch_remove(r->b, j->seq, err)) != POLAR_OK) return st;
    j->seq = 0;
    *rewarded = 1;
    return polar_search_reward(j->search, reward_of(j), err);
}

static int add_layers(FILE *f, const polar_program *p) {
    fputc('[', f);
    for (int i = 0; i < p->n; i++) fprintf(f, "%s%d", i ? "," : "", p->layers[i]);
    return fputc(']', f) != EOF;
}

/* The question's line: the reference's fields, then ours. */
static int write_line(FILE *f, const job *j, const polar_search_result *res, int actions, double seconds) {
    const polar_question *q = j->q;
    char *question = polar_json_quote(q->question), *gold = polar_json_quote(q->answer);
    if (!question || !gold) {
        polar_free(question), polar_free(gold);
        return 0;
    }
    fprintf(f, "{\"index\":%d,\"line\":%ld,\"question\":%s,\"gt_ans\":%s,\"initial_score\":%g", j->index, q->line,
            question, gold, res->initial_score);
    polar_free(question), polar_free(gold);
    for (int valid = 1; valid >= 0; valid--) {
        fprintf(f, ",\"final_%svalid_transitions\":[", valid ? "" : "in");
        int first = 1;
        for (int i = 0; i < res->n; i++)
            if ((res->programs[i].score == 1.0) == valid) {
                if (!first) fputc(',', f);
                add_layers(f, &res->programs[i].program);
                first = 0;
            }
        fputc(']', f);
    }
    fprintf(f, ",\"best_transitions\":[");
    for (int i = 0; i < res->n; i++) {
        fprintf(f, "%s{\"path\":", i ? "," : "");
        add_layers(f, &res->programs[i].program);
        fprintf(f, ",\"score\":%g,\"length\":%d}", res->programs[i].score, res->programs[i].program.n);
    }
    fprintf(f,
            "],\"actions\":\"%s\",\"simulations\":%d,\"programs_evaluated\":%d,\"tokens_generated\":%ld,"
            "\"prompt_tokens\":%d,\"prompt_layer_tokens_run\":%ld,\"prompt_layer_tokens_needed\":%ld,\"seconds\":%.3f}\n",
            polar_search_actions_name(actions), res->simulations, res->evaluations, j->tokens, j->n_ids, j->entries_run,
            j->entries_needed, seconds);
    return fflush(f) == 0;
}

typedef struct {
    const char *model, *data, *format, *qfield, *afield, *out, *style_text, *device_text, *kv_text, *summary, *plot,
        *shots_from, *actions_text, *compare_a, *compare_b;
    int actions; /* POLAR_ACTIONS_* of --actions */
    float lambda;
    int start, limit, sims, max_new, min_layers, max_layers, threads, quiet, layers, json, n_shots, batch, cache_mb;
    uint64_t seed;
    const polar_question *shots[MAX_SHOTS];
} search_args;

/* A labels file being resumed must come from the same action space: each
 * complete line's "actions" (absent in lines written before --actions, whose
 * searches all took both) against --actions. 0 after printing the error. */
static int same_actions(const char *cmd, const char *path, int actions) {
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    ssize_t len;
    int ok = 1;
    while (ok && (len = getline(&line, &cap, f)) > 0) {
        lineno++;
        /* torn (cut off) or not ours (refused): resume_results says which */
        if (line[len - 1] != '\n' || polar_eval_record_index(line) < 0) break;
        /* a JSON string escapes its quotes, so the key cannot be text of the question */
        const char *k = strstr(line, "\"actions\":\""), *name = "both";
        size_t n = 4;
        if (k) name = k + 11, n = strcspn(name, "\"");
        if (n != strlen(polar_search_actions_name(actions)) || strncmp(name, polar_search_actions_name(actions), n)) {
            fprintf(stderr, "polar %s: error: %s:%ld: searched with --actions %.*s%s, not %s; give another -o\n", cmd,
                    path, lineno, (int)n, name, k ? "" : " (a line without \"actions\")",
                    polar_search_actions_name(actions));
            ok = 0;
        }
    }
    free(line);
    fclose(f);
    return ok;
}

/* The run's summary line. */
typedef struct {
    int done, valid, fixed;
    long evaluated, run, needed;
} totals;

static void job_clear(job *j) {
    polar_search_free(j->search);
    polar_free(j->ids), polar_free(j->text);
    j->search = NULL, j->ids = NULL, j->text = NULL;
    j->index = -1;
}

static polar_status job_start(job *j, int index, const polar_question *q, const search_args *a, prompt_style style,
                              const polar_tokenizer *tok, const polar_search_opts *so, polar_error *err) {
    j->index = index, j->q = q, j->seq = 0;
    j->tokens = j->entries_run = j->entries_needed = 0;
    j->t0 = polar_time_ms();
    polar_status st = question_prompt(tok, style, q, a->shots, a->n_shots, &j->text, &j->ids, &j->n_ids, err);
    return st == POLAR_OK ? polar_search_begin(so, &j->search, err) : st;
}

/* The question's line, then the totals; the slot is free again. */
static polar_status job_finish(job *j, FILE *f, const char *path, int actions, totals *t, polar_error *err) {
    polar_search_result res;
    polar_status st = polar_search_result_get(j->search, &res, err);
    if (st == POLAR_OK && !write_line(f, j, &res, actions, (polar_time_ms() - j->t0) / 1000))
        st = cli_error(err, POLAR_ERR_IO, "%s: write failed", path);
    if (st == POLAR_OK) {
        int valid = res.n > 0 && res.programs[0].score == 1.0;
        t->done++, t->valid += valid, t->fixed += valid && res.initial_score < 1.0;
        t->evaluated += res.evaluations, t->run += j->entries_run, t->needed += j->entries_needed;
    }
    polar_search_result_free(&res);
    job_clear(j);
    return st;
}

/* Questions run as jobs, a.batch of them at once, their programs sequences
 * of one batch (one step serves them all, and its prefix cache runs a
 * few-shot prefix once per program prefix for all of them). Lines are
 * written as questions finish (so not always in data set order; each names
 * its index). */
static int run_searches(const char *cmd, const search_args *a, prompt_style style, polar_model *m,
                        const polar_tokenizer *tok, const polar_dataset *data, int first, int count) {
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int D = info.arch.n_layers, n_done = 0, rc = 1, longest = 0;
    polar_search_opts so = polar_search_defaults(D);
    so.simulations = a->sims, so.seed = a->seed, so.lambda = a->lambda, so.actions = a->actions;
    if (a->min_layers) so.min_len = a->min_layers;
    if (a->max_layers) so.max_len = a->max_layers;
    if (so.min_len > so.max_len) return fail_usage(cmd, "--min-layers %d is above --max-layers %d", so.min_len, so.max_len);
    polar_device device;
    int kv_bf16;
    if (!parse_device(cmd, a->device_text, &device) || !parse_kv(cmd, a->kv_text, &kv_bf16)) return EXIT_USAGE;
    int n_jobs = a->batch, cap_len = so.max_len > D ? so.max_len : D;
    unsigned char *done = calloc((size_t)count, 1);
    job *jobs = calloc((size_t)n_jobs, sizeof *jobs);
    runner r = {.max_new = a->max_new};
    FILE *f = NULL;
    if (!done || !jobs) {
        fprintf(stderr, "polar %s: error: out of memory\n", cmd);
        goto out;
    }
    for (int i = 0; i < n_jobs; i++)
        jobs[i] = (job){.index = -1,
                        .acc = {.tok = tok,
                                .stop_at_box = 1,
                                .stop_id = style == STYLE_CHAT ? polar_tokenizer_end_of_turn(tok) : -1,
                                .arch = &info.arch}};
    if (!same_actions(cmd, a->out, a->actions) || !(f = resume_results(cmd, a->out, first, count, done, &n_done)))
        goto out;
    polar_status st = longest_prompt(tok, style, data, first, count, done, a->shots, a->n_shots, &longest, &err);
    int max_ctx = longest + a->max_new;
    if (st == POLAR_OK && n_done < count) {
        polar_batch_opts bo = {.max_seqs = n_jobs, .max_ctx = max_ctx, .max_program_len = cap_len,
                               .step_tokens = n_jobs + 64, .n_threads = a->threads, .device = device,
                               .kv_bf16 = kv_bf16, .prefix_cache_bytes = (size_t)a->cache_mb << 20};
        bo.kv_bytes = polar_batch_kv_bytes(m, &bo, n_jobs, cap_len, max_ctx);
        st = polar_batch_create(m, &bo, &r.b, &err);
    }
    if (st != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto out;
    }
    cli_progress progress;
    progress_start(&progress, cmd, count, n_done);
    int next = 0, failed = -1;
    totals t = {0};
    while (st == POLAR_OK) {
        int active = 0, slot = -1;
        for (int i = 0; i < n_jobs; i++)
            if (jobs[i].index >= 0) active++;
            else if (slot < 0) slot = i;
        while (next < count && done[next]) next++;
        if (next < count && slot >= 0) {
            job *j = &jobs[slot];
            int finished;
            failed = first + next;
            st = job_start(j, first + next, polar_dataset_get(data, first + next), a, style, tok, &so, &err);
            next++, active++;
            if (st == POLAR_OK) st = advance(&r, j, &finished, &err);
            if (st == POLAR_OK && finished) {
                st = job_finish(j, f, a->out, a->actions, &t, &err);
                if (!a->quiet) progress_update(&progress, ++n_done);
            }
            continue;
        }
        if (!active) break;
        if ((st = polar_batch_step(r.b, NULL, &err)) != POLAR_OK) break;
        for (int i = 0; i < n_jobs && st == POLAR_OK; i++) {
            job *j = &jobs[i];
            int rewarded, finished = 0;
            if (j->index < 0) continue;
            failed = j->index;
            st = poll(&r, j, &rewarded, &err);
            if (st == POLAR_OK && rewarded) st = advance(&r, j, &finished, &err);
            if (st == POLAR_OK && finished) {
                st = job_finish(j, f, a->out, a->actions, &t, &err);
                if (!a->quiet) progress_update(&progress, ++n_done);
            }
        }
    }
    if (st != POLAR_OK) {
        /* a terminal's progress line is open: end it first; a log gets the error line alone */
        fprintf(stderr, "%spolar %s: error: question %d: %s\n", !a->quiet && progress.tty ? "\n" : "", cmd, failed,
                err.msg);
        goto out;
    }
    printf("searched %d questions (%d done before): %d with a valid program, %d of them fixing a wrong base answer; "
           "%ld programs evaluated; prompt layer-tokens run: %.1f%% of those needed\n",
           t.done, progress.done_before, t.valid, t.fixed, t.evaluated, t.needed ? 100.0 * t.run / t.needed : 0.0);
    rc = 0;
out:
    if (f && fclose(f) && !rc) rc = 1, fprintf(stderr, "polar %s: error: %s: write failed\n", cmd, a->out);
    for (int i = 0; jobs && i < n_jobs; i++) {
        job_clear(&jobs[i]);
        text_acc_free(&jobs[i].acc);
    }
    polar_batch_free(r.b);
    free(done), free(jobs);
    return rc;
}

int cmd_search(int argc, char **argv) {
    const char *cmd = "search";
    search_args a = {.style_text = "boxed", .sims = 100, .max_new = 50, .seed = 42, .lambda = 5, .batch = 8,
                     .cache_mb = 1024};
    cli_opt opts[] = {
        {"--model", OPT_STR, &a.model, 0},           {"--data", OPT_STR, &a.data, 0},
        {"--format", OPT_STR, &a.format, 0},         {"--question-field", OPT_STR, &a.qfield, 0},
        {"--answer-field", OPT_STR, &a.afield, 0},   {"-o", OPT_STR, &a.out, 0},
        {"--start", OPT_INT, &a.start, 0},           {"--limit", OPT_INT, &a.limit, 0},
        {"--sims", OPT_INT, &a.sims, 0},             {"--lambda", OPT_FLOAT, &a.lambda, 0},
        {"--max-new", OPT_INT, &a.max_new, 0},       {"--min-layers", OPT_INT, &a.min_layers, 0},
        {"--max-layers", OPT_INT, &a.max_layers, 0}, {"--style", OPT_STR, &a.style_text, 0},
        {"--prompt-style", OPT_STR, &a.style_text, 0}, {"--threads", OPT_INT, &a.threads, 0},
        {"--seed", OPT_U64, &a.seed, 0},             {"--quiet", OPT_FLAG, &a.quiet, 0},
        {"--device", OPT_STR, &a.device_text, 0},    {"--summary", OPT_STR, &a.summary, 0},
        {"--layers", OPT_INT, &a.layers, 0},         {"--json", OPT_FLAG, &a.json, 0},
        {"--plot", OPT_STR, &a.plot, 0},             {"--shots", OPT_INT, &a.n_shots, 0},
        {"--shots-from", OPT_STR, &a.shots_from, 0}, {"--batch", OPT_INT, &a.batch, 0},
        {"--cache-mb", OPT_INT, &a.cache_mb, 0},     {"--kv", OPT_STR, &a.kv_text, 0},
        {"--actions", OPT_STR, &a.actions_text, 0},  {"--compare", OPT_STR, &a.compare_a, 0},
        {"--with", OPT_STR, &a.compare_b, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (a.compare_a || a.compare_b) {
        if (!a.compare_a || !a.compare_b) return fail_usage(cmd, "give --compare A.jsonl --with B.jsonl");
        if (a.data || a.out || a.summary || a.actions_text || a.plot || a.layers)
            return fail_usage(cmd, "--compare takes only --with and --json");
        polar_error err;
        char *text = NULL;
        if (polar_labels_compare(a.compare_a, a.compare_b, a.json ? &text : NULL, a.json ? NULL : &text, &err) !=
            POLAR_OK)
            return fail_status(cmd, &err);
        printf("%s%s", text, a.json ? "\n" : "");
        polar_free(text);
        return 0;
    }
    if (a.summary) {
        if (a.data || a.out || a.actions_text)
            return fail_usage(cmd, "--summary takes only --layers, --json and --plot (the file says its --actions)");
        polar_error err;
        char *text = NULL;
        if (polar_labels_summary(a.summary, a.layers, a.json ? &text : NULL, a.json ? NULL : &text, a.plot, &err) !=
            POLAR_OK)
            return fail_status(cmd, &err);
        printf("%s%s", text, a.json ? "\n" : "");
        polar_free(text);
        return 0;
    }
    if (!a.data || !a.out) return fail_usage(cmd, "give --data FILE and -o LABELS.jsonl");
    int bad_out = check_results_path(cmd, a.out);
    if (bad_out) return bad_out;
    prompt_style style;
    if (!parse_style(cmd, a.style_text, &style)) return EXIT_USAGE;
    if (style == STYLE_MC) return fail_usage(cmd, "--style is boxed or chat (the reward checks a \\boxed{} answer)");
    if ((a.actions = polar_search_actions_parse(a.actions_text ? a.actions_text : "both")) < 0)
        return fail_usage(cmd, "--actions is both, skip or loop, not '%s'", a.actions_text);
    if (a.sims < 1) return fail_usage(cmd, "--sims must be at least 1");
    if (a.max_new < 1) return fail_usage(cmd, "--max-new must be at least 1");
    if (a.batch < 1 || a.batch > 256) return fail_usage(cmd, "--batch must be 1 to 256 questions");
    if (a.cache_mb < 0) return fail_usage(cmd, "--cache-mb must not be negative");
    polar_dataset *data = NULL, *shot_data = NULL;
    int first, count, rc;
    if ((rc = load_shots(cmd, a.n_shots, a.shots_from, &shot_data, a.shots))) return rc;
    if ((rc = open_dataset(cmd, a.data, a.format, a.qfield, a.afield, a.start, a.limit, &data, &first, &count))) {
        polar_dataset_free(shot_data);
        return rc;
    }
    char *model_file = find_model(cmd, a.model);
    const char *path = model_file;
    polar_error err;
    polar_model *m = NULL;
    polar_tokenizer *tok = NULL;
    if (!path) rc = 1;
    else if (polar_model_load(path, &m, &err) != POLAR_OK || polar_tokenizer_load(path, &tok, &err) != POLAR_OK)
        rc = fail_status(cmd, &err);
    else
        rc = run_searches(cmd, &a, style, m, tok, data, first, count);
    polar_tokenizer_free(tok);
    polar_model_free(m);
    polar_dataset_free(data);
    polar_dataset_free(shot_data);
    polar_free(model_file);
    return rc;
}
