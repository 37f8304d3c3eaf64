/* Evaluation data sets: JSON lines, one question an object, read into
 * polar_question records (question, gold answer, solution, choices). The
 * field names of each set are those of ../shared/data/README.md; AUTO picks
 * the set from the fields of the first line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "../loader/json.h"

#define DATASET_MAX_BYTES ((size_t)1 << 30)

struct polar_dataset {
    polar_data_format format;
    polar_question *q;
    int n, cap;
};

const char *polar_data_format_name(polar_data_format f) {
    switch (f) {
    case POLAR_DATA_AUTO: return "auto";
    case POLAR_DATA_GSM8K: return "gsm8k";
    case POLAR_DATA_ASDIV: return "asdiv";
    case POLAR_DATA_MAWPS: return "mawps";
    case POLAR_DATA_MMLU: return "mmlu";
    case POLAR_DATA_JSONL: return "jsonl";
    }
    return "unknown";
}

int polar_dataset_size(const polar_dataset *d) { return d ? d->n : 0; }

const polar_question *polar_dataset_get(const polar_dataset *d, int i) {
    return d && i >= 0 && i < d->n ? &d->q[i] : NULL;
}

polar_data_format polar_dataset_format(const polar_dataset *d) { return d ? d->format : POLAR_DATA_AUTO; }

static void question_free(polar_question *q) {
    free((char *)q->question);
    free((char *)q->answer);
    free((char *)q->solution);
    for (int i = 0; i < q->n_choices; i++) free((char *)q->choices[i]);
    free((void *)q->choices);
}

void polar_dataset_free(polar_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) question_free(&d->q[i]);
    free(d->q);
    free(d);
}

/* ------------------------------------------------------------------ text */

/* A copy of s[0..n) with leading and trailing white space removed. */
static char *dup_trim(const char *s, size_t n) {
    while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    char *c = malloc(n + 1);
    if (!c) return NULL;
    memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

/* A JSON number as the shortest decimal that reads back the same, without an
 * exponent (43.0 -> "43", 150.0 -> "150", 0.6666666667 as written), so the
 * answer checker reads it as a number. */
static char *number_text(double v) {
    char buf[400];
    if (v == floor(v) && fabs(v) < 1e17) {
        snprintf(buf, sizeof buf, "%.0f", v);
    } else {
        int d;
        for (d = 1; d <= 20; d++) {
            snprintf(buf, sizeof buf, "%.*f", d, v);
            if (strtod(buf, NULL) == v) break;
        }
        if (d > 20) snprintf(buf, sizeof buf, "%.17g", v); /* tiny or huge: exponent form */
    }
    return dup_trim(buf, strlen(buf));
}

/* GSM8K: the solution before the last "####" with its <<a*b=c>> calculator
 * annotations removed, and the number after it without commas. */
static int split_gsm8k(const char *s, char **solution, char **answer) {
    const char *h = NULL;
    for (const char *p = strstr(s, "####"); p; p = strstr(p + 1, "####")) h = p;
    if (!h) return 0;
    char *sol = malloc((size_t)(h - s) + 1), *ans = dup_trim(h + 4, strlen(h + 4));
    if (!sol || !ans) {
        free(sol);
        free(ans);
        *solution = *answer = NULL;
        return 1;
    }
    size_t k = 0;
    const char *close = s; /* the next ">>" at or after p + 2, or h; linear over the text */
    for (const char *p = s; p < h; p++) {
        if (p[0] == '<' && p + 1 < h && p[1] == '<') {
            if (close < p + 2) {
                close = p + 2;
                while (close + 1 < h && !(close[0] == '>' && close[1] == '>')) close++;
                if (close + 1 >= h) close = h;
            }
            if (close < h) {
                p = close + 1;
                continue;
            }
        }
        sol[k++] = *p;
    }
    sol[k] = '\0';
    char *t = dup_trim(sol, k);
    free(sol);
    k = 0;
    for (char *p = ans; *p; p++)
        if (*p != ',') ans[k++] = *p;
    ans[k] = '\0';
    *solution = t;
    *answer = ans;
    if (!t) free(ans), *answer = NULL;
    return 1;
}

/* ASDiv: "9 (apples)" -> "9"; answers without a unit are kept. */
static char *asdiv_answer(const char *s) {
    size_t n = strlen(s);
    while (n && s[n - 1] == ' ') n--;
    if (n && s[n - 1] == ')') {
        const char *open = NULL;
        for (const char *p = s; p < s + n; p++)
            if (*p == '(') open = p;
        if (open && open > s && open[-1] == ' ') n = (size_t)(open - s);
    }
    return dup_trim(s, n);
}

/* -------------------------------------------------------------- one line */

typedef struct {
    const char *what;
    long line;
    polar_error *err;
} where;

static const json_value *field(const json_value *o, const char *name) { return name ? json_get(o, name) : NULL; }

static polar_status need_string(const where *w, const json_value *v, const char *name) {
    if (!v) return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: no \"%s\" field", w->what, w->line, name);
    if (v->type != JSON_STRING)
        return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: field \"%s\" is not a string", w->what, w->line, name);
    return POLAR_OK;
}

/* Choices from an array of strings, and the gold from an index or a letter. */
static polar_status read_choices(const where *w, const json_value *arr, const json_value *ans, const char *ans_name,
                                 polar_question *q) {
    if (arr->type != JSON_ARRAY || arr->len == 0 || arr->len > 26)
        return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: \"choices\" must be an array of 1 to 26 strings",
                          w->what, w->line);
    const char **c = calloc(arr->len, sizeof *c);
    if (!c) return polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what, w->line);
    q->choices = c;
    for (size_t i = 0; i < arr->len; i++) {
        if (arr->items[i]->type != JSON_STRING)
            return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: choice %zu is not a string", w->what, w->line, i);
        if (!(c[i] = dup_trim(arr->items[i]->str, strlen(arr->items[i]->str))))
            return polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what, w->line);
        q->n_choices = (int)i + 1;
    }
    int k = -1;
    if (ans->type == JSON_NUMBER && ans->is_integer && ans->number >= 0 && ans->number < (double)arr->len)
        k = (int)ans->number;
    else if (ans->type == JSON_STRING && ans->len == 1 && ans->str[0] >= 'A' && ans->str[0] < 'A' + (int)arr->len)
        k = ans->str[0] - 'A';
    if (k < 0)
        return polar_fail(w->err, POLAR_ERR_FORMAT,
                          "%s:%ld: field \"%s\" must be a choice index 0..%zu or a letter A..%c", w->what, w->line,
                          ans_name, arr->len - 1, (char)('A' + arr->len - 1));
    q->answer_index = k;
    char letter[2] = {(char)('A' + k), '\0'};
    if (!(q->answer = dup_trim(letter, 1)))
        return polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what, w->line);
    return POLAR_OK;
}

/* The format a first line's fields suggest. */
static polar_data_format detect(const json_value *o) {
    const json_value *ans = json_get(o, "answer");
    if (json_get(o, "input") && json_get(o, "target")) return POLAR_DATA_MAWPS;
    if (json_get(o, "question") && json_get(o, "choices") && ans) return POLAR_DATA_MMLU;
    if (json_get(o, "body") && json_get(o, "question") && ans) return POLAR_DATA_ASDIV;
    if (json_get(o, "question") && ans && ans->type == JSON_STRING && strstr(ans->str, "####")) return POLAR_DATA_GSM8K;
    return POLAR_DATA_JSONL;
}

/* The first of the named field, or of the two defaults, that is present. */
static const char *pick(const json_value *o, const char *named, const char *def1, const char *def2) {
    if (named) return named;
    return json_get(o, def1) || !json_get(o, def2) ? def1 : def2;
}

static polar_status read_question(const where *w, polar_data_format f, const polar_dataset_opts *opts,
                                  const json_value *o, polar_question *q) {
    polar_status st;
    const json_value *v, *a;
    q->answer_index = -1;
    q->line = w->line;
    const char *qf = "question", *af = "answer";
    if (f == POLAR_DATA_MAWPS) qf = "input", af = "target";
    if (f == POLAR_DATA_JSONL) {
        qf = pick(o, opts ? opts->question_field : NULL, "question", "query");
        af = pick(o, opts ? opts->answer_field : NULL, "answer", "gt_ans");
    }
    v = field(o, qf);
    if ((st = need_string(w, v, qf)) != POLAR_OK) return st;
    a = field(o, af);
    if (!a) return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: no \"%s\" field", w->what, w->line, af);
    if (f == POLAR_DATA_ASDIV) {
        const json_value *body = json_get(o, "body");
        if ((st = need_string(w, body, "body")) != POLAR_OK) return st;
        size_t nb = strlen(body->str), nq = strlen(v->str);
        char *t = malloc(nb + nq + 2);
        if (t) {
            memcpy(t, body->str, nb);
            t[nb] = ' ';
            memcpy(t + nb + 1, v->str, nq + 1);
            q->question = dup_trim(t, nb + nq + 1);
            free(t);
        }
    } else {
        q->question = dup_trim(v->str, strlen(v->str));
    }
    if (!q->question) return polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what, w->line);

    const json_value *ch = json_get(o, "choices");
    if (f == POLAR_DATA_MMLU || (f == POLAR_DATA_JSONL && ch)) {
        if (!ch) return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: no \"choices\" field", w->what, w->line);
        return read_choices(w, ch, a, af, q);
    }
    if (a->type == JSON_NUMBER && f != POLAR_DATA_GSM8K && f != POLAR_DATA_ASDIV) {
        q->answer = number_text(a->number);
    } else {
        if ((st = need_string(w, a, af)) != POLAR_OK) return st;
        if (f == POLAR_DATA_GSM8K) {
            char *sol, *ans;
            if (!split_gsm8k(a->str, &sol, &ans))
                return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: GSM8K field \"answer\" has no \"####\"",
                                  w->what, w->line);
            q->solution = sol;
            q->answer = ans;
        } else if (f == POLAR_DATA_ASDIV) {
            q->answer = asdiv_answer(a->str);
        } else {
            q->answer = dup_trim(a->str, strlen(a->str));
        }
    }
    if (!q->answer) return polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what, w->line);
    if (!*q->answer)
        return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: field \"%s\" is empty", w->what, w->line, af);
    return POLAR_OK;
}

/* "file:12: not JSON: column 5: ..." from the parser's own message. */
static polar_status not_json(const where *w, const polar_error *jerr) {
    const char *why = strstr(jerr->msg, "column ");
    return polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: not JSON: %s", w->what, w->line, why ? why : jerr->msg);
}

static polar_status add_line(polar_dataset *d, const where *w, const polar_dataset_opts *opts, const char *text,
                             size_t len) {
    json_doc *doc;
    polar_error jerr = {0};
    if (json_parse(text, len, "line", &doc, &jerr) != POLAR_OK)
        return jerr.code == POLAR_ERR_NOMEM ? polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what,
                                                         w->line)
                                            : not_json(w, &jerr);
    const json_value *o = json_root(doc);
    polar_status st = POLAR_OK;
    if (o->type != JSON_OBJECT) {
        st = polar_fail(w->err, POLAR_ERR_FORMAT, "%s:%ld: not a JSON object", w->what, w->line);
    } else {
        if (d->format == POLAR_DATA_AUTO) d->format = detect(o);
        if (d->n == d->cap) {
            int cap = d->cap ? d->cap * 2 : 64;
            polar_question *q = cap > 0 ? realloc(d->q, (size_t)cap * sizeof *q) : NULL;
            if (!q) st = polar_fail(w->err, POLAR_ERR_NOMEM, "%s:%ld: out of memory", w->what, w->line);
            else d->q = q, d->cap = cap;
        }
        if (st == POLAR_OK) {
            polar_question *q = &d->q[d->n];
            memset(q, 0, sizeof *q);
            d->n++; /* counted first so a half-read question is freed with the set */
            st = read_question(w, d->format, opts, o, q);
        }
    }
    json_free(doc);
    return st;
}

polar_status polar_dataset_parse(const char *text, size_t len, const char *what, const polar_dataset_opts *opts,
                                 polar_dataset **out, polar_error *err) {
    if (!out) return polar_fail(err, POLAR_ERR_ARG, "polar_dataset_parse: out is NULL");
    *out = NULL;
    if (!text && len) return polar_fail(err, POLAR_ERR_ARG, "polar_dataset_parse: text is NULL");
    if (!what) what = "data set";
    polar_data_format f = opts ? opts->format : POLAR_DATA_AUTO;
    if ((int)f < POLAR_DATA_AUTO || f > POLAR_DATA_JSONL)
        return polar_fail(err, POLAR_ERR_ARG, "%s: unknown data-set format %d", what, (int)f);
    polar_dataset *d = calloc(1, sizeof *d);
    if (!d) return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", what);
    d->format = f;
    where w = {what, 0, err};
    size_t i = 0;
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) i = 3; /* a UTF-8 byte-order mark */
    polar_status st = POLAR_OK;
    while (i < len && st == POLAR_OK) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        w.line++;
        size_t k = i;
        while (k < e && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r')) k++;
        if (k < e) {
            if (d->n == 0x7fffffff) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: too many questions", what);
            else st = add_line(d, &w, opts, text + i, e - i);
        }
        i = e + 1;
    }
    if (st == POLAR_OK && d->n == 0) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: no questions (empty file)", what);
    if (st != POLAR_OK) {
        polar_dataset_free(d);
        return st;
    }
    *out = d;
    return POLAR_OK;
}

polar_status polar_dataset_load(const char *path, const polar_dataset_opts *opts, polar_dataset **out,
                                polar_error *err) {
    if (out) *out = NULL;
    if (!path || !out) return polar_fail(err, POLAR_ERR_ARG, "polar_dataset_load: path or out is NULL");
    char *text;
    size_t len;
    polar_status st = json_read_file(path, DATASET_MAX_BYTES, &text, &len, err);
    if (st != POLAR_OK) return st;
    st = polar_dataset_parse(text, len, path, opts, out, err);
    free(text);
    return st;
}
