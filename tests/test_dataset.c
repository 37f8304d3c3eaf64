/* Eval data sets and prompts: a few lines of each real set (committed in
 * tests/data, copied from ../shared/data), broken files with their messages,
 * the reference's boxed prompt byte for byte; and, when ../shared/data is
 * there, every line of every real set. */
#include "harness.h"

#define DATA_DIR "tests/data"
#define SHARED_DATA "../shared/data"

static polar_dataset *load(const char *file, const polar_dataset_opts *o, polar_data_format want, int n) {
    polar_error err;
    polar_dataset *d = NULL;
    char path[256];
    snprintf(path, sizeof path, "%s/%s", DATA_DIR, file);
    CHECK_OK(polar_dataset_load(path, o, &d, &err));
    if (!d) return NULL;
    CHECK(polar_dataset_format(d) == want, "%s: format %s, want %s", file,
          polar_data_format_name(polar_dataset_format(d)), polar_data_format_name(want));
    CHECK(polar_dataset_size(d) == n, "%s: %d questions, want %d", file, polar_dataset_size(d), n);
    return d;
}

static int same(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

static void dataset_gsm8k(void) {
    polar_dataset *d = load("gsm8k4.jsonl", NULL, POLAR_DATA_GSM8K, 4);
    if (!d || polar_dataset_size(d) != 4) {
        polar_dataset_free(d);
        return;
    }
    const polar_question *q = polar_dataset_get(d, 0);
    CHECK(strncmp(q->question, "Janet\xe2\x80\x99s ducks lay 16 eggs per day.", 30) == 0, "'%s'", q->question);
    CHECK(same(q->answer, "18"), "answer '%s'", q->answer);
    /* The calculator annotations <<16-3-4=9>> go; the text before "####" stays. */
    CHECK(same(q->solution, "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\n"
                            "She makes 9 * 2 = $18 every day at the farmer\xe2\x80\x99s market."),
          "solution '%s'", q->solution);
    CHECK(q->choices == NULL && q->n_choices == 0 && q->answer_index == -1 && q->line == 1, "MC fields, line");
    CHECK(same(polar_dataset_get(d, 2)->answer, "70000"), "'%s'", polar_dataset_get(d, 2)->answer);
    CHECK(same(polar_dataset_get(d, 3)->answer, "2125"), "commas removed: '%s'", polar_dataset_get(d, 3)->answer);
    CHECK(polar_dataset_get(d, 3)->line == 4, "line %ld", polar_dataset_get(d, 3)->line);
    CHECK(polar_dataset_get(d, 4) == NULL && polar_dataset_get(d, -1) == NULL, "out of range");
    polar_dataset_free(d);

    d = load("gsm8k_train2.jsonl", NULL, POLAR_DATA_GSM8K, 2);
    if (d && polar_dataset_size(d) == 2) {
        CHECK(same(polar_dataset_get(d, 0)->answer, "72"), "'%s'", polar_dataset_get(d, 0)->answer);
        CHECK(same(polar_dataset_get(d, 1)->solution, "Weng earns 12/60 = $0.2 per minute.\n"
                                                      "Working 50 minutes, she earned 0.2 x 50 = $10."),
              "'%s'", polar_dataset_get(d, 1)->solution);
    }
    polar_dataset_free(d);
}

static void dataset_asdiv(void) {
    polar_dataset *d = load("asdiv5.jsonl", NULL, POLAR_DATA_ASDIV, 5);
    if (!d || polar_dataset_size(d) != 5) {
        polar_dataset_free(d);
        return;
    }
    const polar_question *q = polar_dataset_get(d, 0);
    CHECK(same(q->question, "Seven red apples and two green apples are in the basket. How many apples are in the basket?"),
          "body + question: '%s'", q->question);
    CHECK(q->solution == NULL, "no solution");
    static const char *const want[] = {"9", "15", "Yes", "3:30 p.m.", "14"};
    for (int i = 0; i < 5; i++)
        CHECK(same(polar_dataset_get(d, i)->answer, want[i]), "%d: '%s', want '%s'", i, polar_dataset_get(d, i)->answer,
              want[i]);
    polar_dataset_free(d);

    /* The generic reader takes any fields, as written. */
    polar_dataset_opts o = {POLAR_DATA_JSONL, "body", "answer"};
    d = load("asdiv5.jsonl", &o, POLAR_DATA_JSONL, 5);
    if (d && polar_dataset_size(d) == 5) {
        CHECK(same(polar_dataset_get(d, 0)->question, "Seven red apples and two green apples are in the basket."),
              "'%s'", polar_dataset_get(d, 0)->question);
        CHECK(same(polar_dataset_get(d, 0)->answer, "9 (apples)"), "'%s'", polar_dataset_get(d, 0)->answer);
    }
    polar_dataset_free(d);
}

static void dataset_mawps(void) {
    polar_dataset *d = load("mawps5.jsonl", NULL, POLAR_DATA_MAWPS, 5);
    if (!d || polar_dataset_size(d) != 5) {
        polar_dataset_free(d);
        return;
    }
    static const char *const want[] = {"13", "56", "15", "5", "24"};
    for (int i = 0; i < 5; i++)
        CHECK(same(polar_dataset_get(d, i)->answer, want[i]), "%d: '%s', want '%s'", i, polar_dataset_get(d, i)->answer,
              want[i]);
    CHECK(strncmp(polar_dataset_get(d, 1)->question, "There were 30 girls and 36 boys", 31) == 0, "'%s'",
          polar_dataset_get(d, 1)->question);
    polar_dataset_free(d);
    /* Number targets as plain decimals, never with an exponent. */
    polar_error err;
    const char *t = "{\"input\":\"a\",\"target\":150.0}\n{\"input\":\"b\",\"target\":2.5}\n"
                    "{\"input\":\"c\",\"target\":-1e6}\n{\"input\":\"d\",\"target\":\"7\"}\n";
    CHECK_OK(polar_dataset_parse(t, strlen(t), "mem", NULL, &d, &err));
    static const char *const num[] = {"150", "2.5", "-1000000", "7"};
    for (int i = 0; d && i < 4; i++)
        CHECK(same(polar_dataset_get(d, i)->answer, num[i]), "target %d: '%s'", i, polar_dataset_get(d, i)->answer);
    polar_dataset_free(d);
    d = load("mawps_fraction.jsonl", NULL, POLAR_DATA_MAWPS, 1);
    if (d && polar_dataset_size(d) == 1) {
        const char *a = polar_dataset_get(d, 0)->answer;
        CHECK(same(a, "0.6666666667"), "'%s'", a);
        CHECK(polar_answer_equal("\\frac{2}{3}", a) && !polar_answer_equal("0.67", a), "checker on '%s'", a);
    }
    polar_dataset_free(d);
}

static void dataset_mmlu(void) {
    polar_dataset *d = load("mmlu3.jsonl", NULL, POLAR_DATA_MMLU, 3);
    if (!d || polar_dataset_size(d) != 3) {
        polar_dataset_free(d);
        return;
    }
    const polar_question *q = polar_dataset_get(d, 0);
    CHECK(q->n_choices == 4 && q->choices && q->answer_index == 2 && same(q->answer, "C"), "n %d, index %d, '%s'",
          q->n_choices, q->answer_index, q->answer);
    if (q->choices) CHECK(same(q->choices[3], "increase the mortality rate"), "'%s'", q->choices[3]);
    CHECK(polar_dataset_get(d, 2)->answer_index == 0 && same(polar_dataset_get(d, 2)->answer, "A"), "third");
    polar_dataset_free(d);
}

static void dataset_generic(void) {
    polar_dataset *d = load("generic.jsonl", NULL, POLAR_DATA_JSONL, 2);
    if (d && polar_dataset_size(d) == 2) {
        CHECK(same(polar_dataset_get(d, 0)->question, "What is 2+3?") && same(polar_dataset_get(d, 0)->answer, "5"),
              "query/gt_ans");
        CHECK(same(polar_dataset_get(d, 1)->answer, "6"), "a number answer: '%s'", polar_dataset_get(d, 1)->answer);
    }
    polar_dataset_free(d);
    /* From memory: MC in the generic reader, a letter for the gold. */
    polar_error err;
    const char *t = "{\"q\":\"Pick\",\"choices\":[\"x\",\"y\"],\"gold\":\"B\"}\r\n   \n";
    polar_dataset_opts o = {POLAR_DATA_JSONL, "q", "gold"};
    CHECK_OK(polar_dataset_parse(t, strlen(t), "mem", &o, &d, &err));
    if (d) {
        const polar_question *q = polar_dataset_get(d, 0);
        CHECK(polar_dataset_size(d) == 1 && q->n_choices == 2 && q->answer_index == 1 && same(q->answer, "B"),
              "generic MC");
    }
    polar_dataset_free(d);
}

/* A file or text that must fail with this status and these words. */
static void expect_fail(const char *path, const char *text, const polar_dataset_opts *o, polar_status code,
                        const char *w1, const char *w2) {
    polar_error err = {0};
    polar_dataset *d = (polar_dataset *)&err; /* must be reset to NULL */
    polar_status st = path ? polar_dataset_load(path, o, &d, &err)
                           : polar_dataset_parse(text, strlen(text), "mem.jsonl", o, &d, &err);
    CHECK(st == code, "%s: status %s, want %s (%s)", path ? path : text, polar_status_name(st), polar_status_name(code),
          err.msg);
    CHECK(d == NULL, "no data set on error");
    CHECK(strstr(err.msg, w1) && (!w2 || strstr(err.msg, w2)), "message '%s' lacks '%s' / '%s'", err.msg, w1,
          w2 ? w2 : "");
}

static void dataset_errors(void) {
    expect_fail(DATA_DIR "/bad_not_json.jsonl", NULL, NULL, POLAR_ERR_FORMAT, "bad_not_json.jsonl:2:", "not JSON");
    expect_fail(DATA_DIR "/bad_missing_field.jsonl", NULL, NULL, POLAR_ERR_FORMAT, "bad_missing_field.jsonl:3:",
                "no \"answer\" field");
    expect_fail(DATA_DIR "/empty.jsonl", NULL, NULL, POLAR_ERR_FORMAT, "empty.jsonl", "no questions");
    expect_fail(DATA_DIR "/no_such_file.jsonl", NULL, NULL, POLAR_ERR_IO, "no_such_file.jsonl", "cannot open");
    expect_fail(DATA_DIR, NULL, NULL, POLAR_ERR_IO, "tests/data", NULL); /* a directory */
    polar_dataset_opts mawps = {POLAR_DATA_MAWPS, NULL, NULL};
    expect_fail(DATA_DIR "/gsm8k4.jsonl", NULL, &mawps, POLAR_ERR_FORMAT, "gsm8k4.jsonl:1:", "no \"input\" field");
    polar_dataset_opts gsm = {POLAR_DATA_GSM8K, NULL, NULL};
    expect_fail(NULL, "{\"question\":\"q\",\"answer\":\"42\"}", &gsm, POLAR_ERR_FORMAT, "mem.jsonl:1:", "####");
    expect_fail(NULL, "\n \n\r\n", NULL, POLAR_ERR_FORMAT, "mem.jsonl", "no questions");
    expect_fail(NULL, "[1,2]\n", NULL, POLAR_ERR_FORMAT, "mem.jsonl:1:", "not a JSON object");
    expect_fail(NULL, "{\"question\":\"q\",\"answer\":\"1\"}\n{\"question\":\"q\" \"answer\":\"1\"}", NULL,
                POLAR_ERR_FORMAT, "mem.jsonl:2:", "column 17");
    expect_fail(NULL, "{\"question\":7,\"answer\":\"1\"}", NULL, POLAR_ERR_FORMAT, "mem.jsonl:1:",
                "\"question\" is not a string");
    expect_fail(NULL, "{\"answer\":\"1\"}", NULL, POLAR_ERR_FORMAT, "mem.jsonl:1:", "no \"question\" field");
    expect_fail(NULL, "{\"question\":\"q\",\"answer\":\"  \"}", NULL, POLAR_ERR_FORMAT, "mem.jsonl:1:", "empty");
    expect_fail(NULL, "{\"question\":\"q\",\"answer\":[1]}", NULL, POLAR_ERR_FORMAT, "mem.jsonl:1:",
                "\"answer\" is not a string");
    expect_fail(NULL, "{\"question\":\"q\",\"choices\":[\"a\",\"b\"],\"answer\":2}", NULL, POLAR_ERR_FORMAT,
                "mem.jsonl:1:", "choice index 0..1");
    expect_fail(NULL, "{\"question\":\"q\",\"choices\":\"ab\",\"answer\":0}", NULL, POLAR_ERR_FORMAT, "mem.jsonl:1:",
                "\"choices\"");
    expect_fail(NULL, "{\"question\":\"q\",\"choices\":[\"a\",1],\"answer\":0}", NULL, POLAR_ERR_FORMAT,
                "mem.jsonl:1:", "choice 1 is not a string");
    expect_fail(NULL, "{\"body\":\"b\",\"question\":\"q\",\"answer\":\"1\"}\n{\"question\":\"q\",\"answer\":\"1\"}",
                NULL, POLAR_ERR_FORMAT, "mem.jsonl:2:", "no \"body\" field");
    polar_dataset_opts bad = {(polar_data_format)99, NULL, NULL};
    expect_fail(NULL, "{}", &bad, POLAR_ERR_ARG, "format", NULL);
    polar_error err;
    CHECK(polar_dataset_load(NULL, NULL, NULL, &err) == POLAR_ERR_ARG, "NULL arguments");
    CHECK(polar_dataset_parse(NULL, 0, NULL, NULL, NULL, &err) == POLAR_ERR_ARG, "NULL out");
    CHECK(polar_dataset_size(NULL) == 0 && polar_dataset_get(NULL, 0) == NULL, "NULL data set");
    polar_dataset_free(NULL);
    CHECK(strcmp(polar_data_format_name(POLAR_DATA_MMLU), "mmlu") == 0 &&
              strcmp(polar_data_format_name((polar_data_format)42), "unknown") == 0,
          "format names");
}

#define HEAD "Solve the following math problem and output ONLY the final answer directly, formatted strictly as "

static void prompt_text(void) {
    polar_error err;
    char *p = NULL;
    polar_question q = {.question = "What is 2+3?", .answer = "5", .answer_index = -1};
    CHECK_OK(polar_prompt_format(POLAR_PROMPT_BOXED, &q, NULL, 0, &p, &err));
    const char *want = "Solve the following math problem and output ONLY the final answer directly, formatted strictly "
                       "as \\boxed{ANSWER}.\n### Problem Start\nWhat is 2+3?\n### Problem End\nAnswer:";
    CHECK(same(p, want), "boxed prompt:\n[%s]", p);
    free(p);

    /* Shots: a solution then the boxed answer, or the boxed answer alone. */
    polar_question s1 = {.question = "1+1?", .answer = "2", .solution = "One and one make 2.", .answer_index = -1};
    polar_question s2 = {.question = "2*3?", .answer = "6", .answer_index = -1};
    const polar_question *shots[] = {&s1, &s2};
    CHECK_OK(polar_prompt_format(POLAR_PROMPT_BOXED, &q, shots, 2, &p, &err));
    want = HEAD "\\boxed{ANSWER}.\n### Problem Start\n1+1?\n### Problem End\nAnswer: One and one make 2.\n\\boxed{2}\n\n" HEAD
                "\\boxed{ANSWER}.\n### Problem Start\n2*3?\n### Problem End\nAnswer: \\boxed{6}\n\n" HEAD
                "\\boxed{ANSWER}.\n### Problem Start\nWhat is 2+3?\n### Problem End\nAnswer:";
    CHECK(same(p, want), "few-shot prompt:\n[%s]", p);
    free(p);

    const char *const ch[] = {"red", "green", "blue"};
    polar_question mc = {.question = "Which is green?", .answer = "B", .choices = ch, .n_choices = 3, .answer_index = 1};
    const polar_question *mshot[] = {&mc};
    CHECK_OK(polar_prompt_format(POLAR_PROMPT_MC, &mc, mshot, 1, &p, &err));
    want = HEAD "\\boxed{the letter of the correct choice}.\n### Problem Start\nWhich is green?\nA. red\nB. green\nC. "
                "blue\n### Problem End\nAnswer: \\boxed{B}\n\n" HEAD
                "\\boxed{the letter of the correct choice}.\n### Problem Start\nWhich is green?\nA. red\nB. green\nC. "
                "blue\n### Problem End\nAnswer:";
    CHECK(same(p, want), "MC prompt:\n[%s]", p);
    free(p);

    p = (char *)"x";
    CHECK(polar_prompt_format(POLAR_PROMPT_MC, &q, NULL, 0, &p, &err) == POLAR_ERR_ARG && p == NULL &&
              strstr(err.msg, "no choices"),
          "MC without choices: %s", err.msg);
    CHECK(polar_prompt_format(POLAR_PROMPT_BOXED, NULL, NULL, 0, &p, &err) == POLAR_ERR_ARG, "no question");
    CHECK(polar_prompt_format(POLAR_PROMPT_BOXED, &q, NULL, 1, &p, &err) == POLAR_ERR_ARG, "shots NULL");
    const polar_question *nullshot[] = {NULL};
    CHECK(polar_prompt_format(POLAR_PROMPT_BOXED, &q, nullshot, 1, &p, &err) == POLAR_ERR_ARG, "a NULL shot");
    polar_question noans = {.question = "q"};
    const polar_question *noshot[] = {&noans};
    CHECK(polar_prompt_format(POLAR_PROMPT_BOXED, &q, noshot, 1, &p, &err) == POLAR_ERR_ARG &&
              strstr(err.msg, "no answer"),
          "a shot without an answer: %s", err.msg);
    CHECK(polar_prompt_format((polar_prompt_style)7, &q, NULL, 0, &p, &err) == POLAR_ERR_ARG, "bad style");
    CHECK(polar_prompt_format(POLAR_PROMPT_BOXED, &q, NULL, 0, NULL, &err) == POLAR_ERR_ARG, "NULL out");
}

/* Every line of every real set, when ../shared/data is present. */
static void dataset_real_sets(void) {
    static const struct {
        const char *file;
        polar_data_format f;
        int n;
    } sets[] = {{"gsm8k.test.jsonl", POLAR_DATA_GSM8K, 1319}, {"gsm8k.train.jsonl", POLAR_DATA_GSM8K, 7473},
                {"asdiv.test.jsonl", POLAR_DATA_ASDIV, 2215}, {"mawps.test.jsonl", POLAR_DATA_MAWPS, 2065},
                {"mmlu_stem.test.jsonl", POLAR_DATA_MMLU, 3018}};
    char path[256];
    snprintf(path, sizeof path, "%s/README.md", SHARED_DATA);
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("  (no %s: skipped)\n", SHARED_DATA);
        return;
    }
    fclose(f);
    double t0 = polar_time_ms();
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        polar_error err;
        polar_dataset *d = NULL;
        snprintf(path, sizeof path, "%s/%s", SHARED_DATA, sets[s].file);
        CHECK_OK(polar_dataset_load(path, NULL, &d, &err));
        if (!d) continue;
        CHECK(polar_dataset_format(d) == sets[s].f && polar_dataset_size(d) == sets[s].n, "%s: %s, %d questions",
              sets[s].file, polar_data_format_name(polar_dataset_format(d)), polar_dataset_size(d));
        int bad = 0, numeric = 0;
        for (int i = 0; i < polar_dataset_size(d); i++) {
            const polar_question *q = polar_dataset_get(d, i);
            if (!q->question[0] || !q->answer[0] || !polar_answer_equal(q->answer, q->answer) || q->line != i + 1) bad++;
            /* Numeric golds stay numeric through the checker: x and x+1 differ. */
            char n[64];
            if (polar_answer_last_number(q->answer, n, sizeof n) && strcmp(n, q->answer) == 0) {
                numeric++;
                char other[80];
                snprintf(other, sizeof other, "%.10g", atof(q->answer) * 1.01 + 1);
                if (polar_answer_equal(other, q->answer)) bad++;
            }
            if (sets[s].f == POLAR_DATA_GSM8K && (!q->solution || strcmp(n, q->answer) != 0)) bad++;
            if (sets[s].f == POLAR_DATA_MMLU && (q->n_choices < 2 || q->answer_index < 0 ||
                                                  polar_answer_choice(q->answer, q->n_choices) != q->answer_index))
                bad++;
        }
        CHECK(bad == 0, "%s: %d questions read wrong", sets[s].file, bad);
        if (sets[s].f == POLAR_DATA_MAWPS) CHECK(numeric == sets[s].n, "mawps: %d numeric", numeric);
        polar_dataset_free(d);
    }
    printf("  real sets read and checked in %.0f ms\n", polar_time_ms() - t0);
}

int main(void) {
    RUN(dataset_gsm8k);
    RUN(dataset_asdiv);
    RUN(dataset_mawps);
    RUN(dataset_mmlu);
    RUN(dataset_generic);
    RUN(dataset_errors);
    RUN(prompt_text);
    RUN(dataset_real_sets);
    TEST_EXIT();
}
