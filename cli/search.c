/* polar search: PoLar's Monte Carlo tree search for layer programs that
 * answer each question of a data set (polar_search_programs), rewarded as
 * the reference rewards them: greedy generation of at most 50 tokens with
 * its \boxed{} prompt, 1 when the boxed answer equals the gold one. One JSONL
 * line per question with the reference's field names (its tooling and
 * `polar train` read them), appended, so a stopped run resumes. The prompt's
 * KV of the last program is reused up to the first entry where the next
 * program differs (share_prompt). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"

typedef struct {
    polar_session *s;
    const polar_question *q;
    const int *prompt;
    int n_prompt, max_new, *out;
    text_acc acc;
    long tokens, entries_run, entries_needed; /* for the question's line */
} reward_ctx;

static polar_status reward(void *ctx, const polar_program *program, double *score, polar_error *err) {
    reward_ctx *r = ctx;
    polar_status st = polar_session_set_program(r->s, program, err);
    polar_gen_opts go = {.max_new = r->max_new, .stop = &r->acc.stop_id, .n_stop = r->acc.stop_id >= 0};
    polar_gen_stats gs;
    text_acc_reset(&r->acc);
    if (st == POLAR_OK) st = polar_generate(r->s, r->prompt, r->n_prompt, &go, r->out, &gs, text_acc_token, &r->acc, err);
    if (st != POLAR_OK) return st;
    if (r->acc.out_of_memory) return cli_error(err, POLAR_ERR_NOMEM, "search: no memory for the generated text");
    r->tokens += gs.n_generated;
    r->entries_needed += (long)program->n * r->n_prompt;
    r->entries_run += (long)(program->n - polar_session_prompt_reused(r->s)) * r->n_prompt;
    char answer[256];
    *score = r->acc.text && polar_answer_boxed(r->acc.text, answer, sizeof answer) &&
             polar_answer_equal(answer, r->q->answer);
    return POLAR_OK;
}

static int add_layers(FILE *f, const polar_program *p) {
    fputc('[', f);
    for (int i = 0; i < p->n; i++) fprintf(f, "%s%d", i ? "," : "", p->layers[i]);
    return fputc(']', f) != EOF;
}

/* The question's line: the reference's fields, then ours. */
static int write_line(FILE *f, int index, const polar_question *q, const polar_search_result *res,
                      const reward_ctx *r, double seconds) {
    char *question = polar_json_quote(q->question), *gold = polar_json_quote(q->answer);
    if (!question || !gold) {
        polar_free(question), polar_free(gold);
        return 0;
    }
    fprintf(f, "{\"index\":%d,\"line\":%ld,\"question\":%s,\"gt_ans\":%s,\"initial_score\":%g", index, q->line,
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
            "],\"simulations\":%d,\"programs_evaluated\":%d,\"tokens_generated\":%ld,\"prompt_tokens\":%d,"
            "\"prompt_layer_tokens_run\":%ld,\"prompt_layer_tokens_needed\":%ld,\"seconds\":%.3f}\n",
            res->simulations, res->evaluations, r->tokens, r->n_prompt, r->entries_run, r->entries_needed, seconds);
    return fflush(f) == 0;
}

typedef struct {
    const char *model, *data, *format, *qfield, *afield, *out, *style_text, *device_text, *summary, *plot, *shots_from;
    float lambda;
    int start, limit, sims, max_new, min_layers, max_layers, threads, quiet, layers, json, n_shots;
    uint64_t seed;
    const polar_question *shots[MAX_SHOTS];
} search_args;

static int run_searches(const char *cmd, const search_args *a, prompt_style style, polar_model *m,
                        const polar_tokenizer *tok, const polar_dataset *data, int first, int count) {
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int D = info.arch.n_layers, n_done = 0, rc = 1;
    polar_search_opts so = polar_search_defaults(D);
    so.simulations = a->sims, so.seed = a->seed, so.lambda = a->lambda;
    if (a->min_layers) so.min_len = a->min_layers;
    if (a->max_layers) so.max_len = a->max_layers;
    if (so.min_len > so.max_len) return fail_usage(cmd, "--min-layers %d is above --max-layers %d", so.min_len, so.max_len);
    unsigned char *done = calloc((size_t)count, 1);
    reward_ctx r = {.max_new = a->max_new};
    r.acc = (text_acc){.tok = tok,
                       .stop_at_box = 1,
                       .stop_id = style == STYLE_CHAT ? polar_tokenizer_end_of_turn(tok) : -1,
                       .arch = &info.arch};
    r.out = malloc((size_t)a->max_new * sizeof *r.out);
    FILE *f = NULL;
    if (!done || !r.out) {
        fprintf(stderr, "polar %s: error: out of memory\n", cmd);
        goto out;
    }
    if (!(f = resume_results(cmd, a->out, first, count, done, &n_done))) goto out;
    polar_device device;
    if (!parse_device(cmd, a->device_text, &device)) {
        rc = EXIT_USAGE;
        goto out;
    }
    double t_start = polar_time_ms();
    int done_before = n_done, n_valid = 0, n_fixed = 0;
    long evaluated = 0, run_total = 0, needed_total = 0;
    for (int i = 0; i < count; i++) {
        if (done[i]) continue;
        const polar_question *q = polar_dataset_get(data, first + i);
        char *text = NULL;
        int *ids = NULL, n_ids = 0;
        polar_session *s = NULL;
        polar_program base = {0};
        polar_search_result res = {0};
        double t0 = polar_time_ms();
        polar_status st = question_prompt(tok, style, q, a->shots, a->n_shots, &text, &ids, &n_ids, &err);
        polar_session_opts o = {.max_ctx = n_ids + a->max_new,
                                .max_program_len = so.max_len > D ? so.max_len : D,
                                .n_threads = a->threads,
                                .device = device,
                                .share_prompt = 1};
        if (st == POLAR_OK) st = polar_program_base(D, &base, &err);
        if (st == POLAR_OK) st = polar_session_create(m, &base, &o, &s, &err);
        r.s = s, r.q = q, r.prompt = ids, r.n_prompt = n_ids, r.tokens = r.entries_run = r.entries_needed = 0;
        if (st == POLAR_OK) st = polar_search_programs(&so, reward, &r, &res, &err);
        if (st == POLAR_OK && !write_line(f, first + i, q, &res, &r, (polar_time_ms() - t0) / 1000))
            st = cli_error(&err, POLAR_ERR_IO, "%s: write failed", a->out);
        if (st == POLAR_OK) {
            int valid = res.n > 0 && res.programs[0].score == 1.0;
            n_valid += valid, n_fixed += valid && res.initial_score < 1.0;
            evaluated += res.evaluations, run_total += r.entries_run, needed_total += r.entries_needed;
        }
        polar_search_result_free(&res);
        polar_session_free(s);
        polar_program_free(&base);
        polar_free(ids), polar_free(text);
        if (st != POLAR_OK) {
            fprintf(stderr, "\npolar %s: error: question %d: %s\n", cmd, first + i, err.msg);
            goto out;
        }
        n_done++;
        if (!a->quiet) progress_line(cmd, n_done, count, done_before, t_start);
    }
    printf("searched %d questions (%d done before): %d with a valid program, %d of them fixing a wrong base answer; "
           "%ld programs evaluated; prompt layer-tokens run: %.1f%% of those needed\n",
           n_done - done_before, done_before, n_valid, n_fixed, evaluated,
           needed_total ? 100.0 * run_total / needed_total : 0.0);
    rc = 0;
out:
    if (f && fclose(f) && !rc) rc = 1, fprintf(stderr, "polar %s: error: %s: write failed\n", cmd, a->out);
    free(done), free(r.out);
    text_acc_free(&r.acc);
    return rc;
}

int cmd_search(int argc, char **argv) {
    const char *cmd = "search";
    search_args a = {.style_text = "boxed", .sims = 100, .max_new = 50, .seed = 42, .lambda = 5};
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
        {"--shots-from", OPT_STR, &a.shots_from, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (a.summary) {
        if (a.data || a.out) return fail_usage(cmd, "--summary takes only --layers, --json and --plot");
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
    prompt_style style;
    if (!parse_style(cmd, a.style_text, &style)) return EXIT_USAGE;
    if (style == STYLE_MC) return fail_usage(cmd, "--style is boxed or chat (the reward checks a \\boxed{} answer)");
    if (a.sims < 1) return fail_usage(cmd, "--sims must be at least 1");
    if (a.max_new < 1) return fail_usage(cmd, "--max-new must be at least 1");
    polar_dataset *data = NULL, *shot_data = NULL;
    int first, count, rc;
    if ((rc = load_shots(cmd, a.n_shots, a.shots_from, &shot_data, a.shots))) return rc;
    if ((rc = open_dataset(cmd, a.data, a.format, a.qfield, a.afield, a.start, a.limit, &data, &first, &count))) {
        polar_dataset_free(shot_data);
        return rc;
    }
    char *default_model = NULL;
    const char *path = a.model;
    polar_error err;
    polar_model *m = NULL;
    polar_tokenizer *tok = NULL;
    if (!path && !(path = default_model = find_default_model(cmd))) rc = 1;
    else if (polar_model_load(path, &m, &err) != POLAR_OK || polar_tokenizer_load(path, &tok, &err) != POLAR_OK)
        rc = fail_status(cmd, &err);
    else
        rc = run_searches(cmd, &a, style, m, tok, data, first, count);
    polar_tokenizer_free(tok);
    polar_model_free(m);
    polar_dataset_free(data);
    polar_dataset_free(shot_data);
    polar_free(default_model);
    return rc;
}
