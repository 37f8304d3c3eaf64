/* Eval prompts: the reference's direct "\boxed{ANSWER}" prompt (PoLar paper,
 * appendix "Direct Prompting"), its multiple-choice variant, and few-shot
 * examples in the same frame. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "polar.h"

static const char *const boxed_head =
    "Solve the following math problem and output ONLY the final answer directly, formatted strictly as "
    "\\boxed{ANSWER}.\n### Problem Start\n";
static const char *const mc_head =
    "Solve the following math problem and output ONLY the final answer directly, formatted strictly as "
    "\\boxed{the letter of the correct choice}.\n### Problem Start\n";
static const char *const tail = "\n### Problem End\nAnswer:";

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} text;

static void put(text *t, const char *s) {
    size_t n = strlen(s);
    if (t->oom) return;
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (cap < t->n + n + 1) cap *= 2;
        char *p = realloc(t->s, cap);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->n, s, n + 1);
    t->n += n;
}

/* One question in the frame, ending with "Answer:". */
static polar_status frame(text *t, polar_prompt_style style, const polar_question *q, const char *what,
                          polar_error *err) {
    if (!q || !q->question) return polar_fail(err, POLAR_ERR_ARG, "polar_prompt_format: %s has no question", what);
    put(t, style == POLAR_PROMPT_MC ? mc_head : boxed_head);
    put(t, q->question);
    if (style == POLAR_PROMPT_MC) {
        if (!q->choices || q->n_choices < 1 || q->n_choices > 26)
            return polar_fail(err, POLAR_ERR_ARG, "polar_prompt_format: %s has no choices for the MC prompt", what);
        for (int i = 0; i < q->n_choices; i++) {
            char label[5] = {'\n', (char)('A' + i), '.', ' ', '\0'};
            put(t, label);
            put(t, q->choices[i] ? q->choices[i] : "");
        }
    }
    put(t, tail);
    return POLAR_OK;
}

polar_status polar_prompt_format(polar_prompt_style style, const polar_question *q, const polar_question *const *shots,
                                 int n_shots, char **out, polar_error *err) {
    if (!out) return polar_fail(err, POLAR_ERR_ARG, "polar_prompt_format: out is NULL");
    *out = NULL;
    if (style != POLAR_PROMPT_BOXED && style != POLAR_PROMPT_MC)
        return polar_fail(err, POLAR_ERR_ARG, "polar_prompt_format: unknown prompt style %d", (int)style);
    if (n_shots < 0 || (n_shots > 0 && !shots))
        return polar_fail(err, POLAR_ERR_ARG, "polar_prompt_format: %d shots but no shot array", n_shots);
    text t = {0};
    polar_status st = POLAR_OK;
    for (int i = 0; i < n_shots && st == POLAR_OK; i++) {
        char what[32];
        snprintf(what, sizeof what, "shot %d", i);
        const polar_question *s = shots[i];
        st = frame(&t, style, s, what, err);
        if (st != POLAR_OK) break;
        if (!s->answer) {
            st = polar_fail(err, POLAR_ERR_ARG, "polar_prompt_format: shot %d has no answer", i);
            break;
        }
        /* The worked solution when there is one, then the boxed answer. */
        if (s->solution && *s->solution) {
            put(&t, " ");
            put(&t, s->solution);
            put(&t, "\n\\boxed{");
        } else {
            put(&t, " \\boxed{");
        }
        put(&t, s->answer);
        put(&t, "}\n\n");
    }
    if (st == POLAR_OK) st = frame(&t, style, q, "the question", err);
    if (st == POLAR_OK && t.oom) st = polar_fail(err, POLAR_ERR_NOMEM, "polar_prompt_format: out of memory");
    if (st != POLAR_OK) {
        free(t.s);
        return st;
    }
    *out = t.s;
    return POLAR_OK;
}
